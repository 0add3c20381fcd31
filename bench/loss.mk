# Loss detection (issue 18, item 3): `make bench-loss` runs bench/dm_loss.c -- kill -9 of one of
# 4 local ranks blocked in an 8 B all-reduce, 20 trials, the time from the kill to each
# survivor's DM_ERR_PEER_LOST (median and worst), over shared memory and then over loopback
# TCP. A benchmark, not a test: not part of `make test` (LOSS_ARGS adds options, e.g.
# LOSS_ARGS="--np 8 --trials 50").
LOSS_BENCH := $(BUILD)/bench/dm_loss
LOSS_ARGS  ?=
EXTRA_BINS += $(LOSS_BENCH)

.PHONY: bench-loss

$(LOSS_BENCH): bench/dm_loss.c tests/test_world.h tests/test_tmpdir.h $(DM_CORE_HDRS) distmesh_shm.h distmesh_store.h distmesh_socket.h distmesh_tcp.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP $(UV_CFLAGS) $< -o $@ $(UV_LIBS) $(LDLIBS_ALL)

bench-loss: deps
	@$(MAKE) --no-print-directory $(LOSS_BENCH)
	@set -e; for tr in shm tcp; do \
	    echo "== $(LOSS_BENCH) --transport $$tr $(LOSS_ARGS)"; \
	    $(LOSS_BENCH) --transport $$tr $(LOSS_ARGS); \
	done
# Shrink after a failure (issue 18): `make bench-shrink` runs bench/dm_shrink.c -- kill -9 of one
# rank, dm_shrink(DM_SHRINK_ABORT) and the new collective's first all-reduce, against destroy +
# re-create of the same survivors; 8 local ranks, then 2 simulated hosts x 2 ranks. A benchmark,
# not a test (SHRINK_ARGS adds options, e.g. SHRINK_ARGS="--trials 50").
SHRINK_BENCH := $(BUILD)/bench/dm_shrink
SHRINK_ARGS  ?=
EXTRA_BINS += $(SHRINK_BENCH)

.PHONY: bench-shrink

$(SHRINK_BENCH): bench/dm_shrink.c tests/test_world.h tests/test_tmpdir.h $(DM_CORE_HDRS) distmesh_shm.h distmesh_store.h distmesh_socket.h distmesh_tcp.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP $(UV_CFLAGS) $< -o $@ $(UV_LIBS) $(LDLIBS_ALL)

bench-shrink: deps
	@$(MAKE) --no-print-directory $(SHRINK_BENCH)
	@set -e; for cfg in "--np 8" "--np 4 --hosts 2"; do \
	    echo "== $(SHRINK_BENCH) $$cfg $(SHRINK_ARGS)"; \
	    $(SHRINK_BENCH) $$cfg $(SHRINK_ARGS); \
	done
