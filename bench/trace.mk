# Issues 19 and 28 "See inside" (not CI):
# - `make bench-trace`: what the flight recorder, on by default, costs: 8 B float32 all_reduce on
#   2 local ranks over shared memory, launches with DISTMESH_FLIGHT_RECORDER=0 and with the
#   default alternated (bench/dm_trace_bench.c: medians of the slowest rank's time per op, the
#   ratio on / off; exit status 3 over the issue's bound of 1.03). TRACE_BENCH_ARGS adds options
#   (--launches, --np, --transport tcp, --configs off,fr,trace; --worlds: off / fr / trace in one
#   launch, the timeline's cost).
# - `make trace-demo`: a few data-parallel steps on 4 ranks (rank 3 slow) with DISTMESH_TRACE, then
#   scripts/dm_trace's report, one merged timeline (Perfetto) and the picture in docs/inside.md, all
#   under $(BUILD)/trace-demo/ (docs/trace-demo.png is a copy of its timeline.png).
TRACE_BENCH := $(BUILD)/bench/dm_trace_bench
TRACE_DEMO_DIR := $(BUILD)/trace-demo
TRACE_BENCH_ARGS ?=
EXTRA_BINS += $(TRACE_BENCH)

.PHONY: bench-trace trace-demo

$(TRACE_BENCH): bench/dm_trace_bench.c tests/test_world.h tests/test_tmpdir.h $(DM_CORE_HDRS) distmesh_shm.h distmesh_store.h distmesh_socket.h distmesh_tcp.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP $(UV_CFLAGS) $< -o $@ $(UV_LIBS) $(LDLIBS_ALL)

bench-trace: deps
	@$(MAKE) --no-print-directory $(TRACE_BENCH)
	$(TRACE_BENCH) --dir $(BUILD)/bench/trace $(TRACE_BENCH_ARGS)

trace-demo: deps
	@$(MAKE) --no-print-directory $(TRACE_BENCH)
	@rm -rf $(TRACE_DEMO_DIR)
	$(TRACE_BENCH) --demo $(TRACE_DEMO_DIR)/run --dir $(TRACE_DEMO_DIR)
	python3 scripts/dm_trace $(TRACE_DEMO_DIR)/run
	python3 scripts/dm_trace $(TRACE_DEMO_DIR)/run --merge $(TRACE_DEMO_DIR)/merged.json
	python3 scripts/dm_trace $(TRACE_DEMO_DIR)/run --png $(TRACE_DEMO_DIR)/timeline.png
