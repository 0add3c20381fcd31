# Loss detection (issue 18, item 3): `make bench-loss` runs bench/dm_loss.c -- kill -9 of one of
# 4 local ranks blocked in an 8 B all-reduce, 20 trials, the time from the kill to each
# survivor's DM_ERR_PEER_LOST (median and worst), over shared memory and then over loopback
# TCP. A benchmark, not a test: not part of `make test` (LOSS_ARGS adds options, e.g.
# LOSS_ARGS="--np 8 --trials 50").
LOSS_BENCH := $(BUILD)/bench/dm_loss
LOSS_ARGS  ?=
EXTRA_BINS += $(LOSS_BENCH)

.PHONY: bench-loss

$(LOSS_BENCH): bench/dm_loss.c distmesh.h distmesh_tcp.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP $(UV_CFLAGS) $< -o $@ $(UV_LIBS) $(LDLIBS_ALL)

bench-loss: deps
	@$(MAKE) --no-print-directory $(LOSS_BENCH)
	@set -e; for tr in shm tcp; do \
	    echo "== $(LOSS_BENCH) --transport $$tr $(LOSS_ARGS)"; \
	    $(LOSS_BENCH) --transport $$tr $(LOSS_ARGS); \
	done
