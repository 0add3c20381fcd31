# Overlap of communication and computation (issue 11).
# - examples/ddp_overlap.c needs the TCP backend to run as several processes, so it gets its own
#   rule here with -DDISTMESH_TCP: an explicit rule wins over tests/core.mk's plain pattern rule
#   for $(BUILD)/examples/%, and the example is already in EXAMPLE_BINS (built by `make`).
# - `make bench-overlap`: bench/dm_overlap.c on 2 local ranks, 16 MiB float32 sum against a
#   compute loop calibrated to the all-reduce's time, over shared memory and over loopback TCP,
#   with a busy CPU (compute=spin) and an idle one (compute=sleep, as while a GPU computes).
#   Prints the tables; the JSON lines go to $(BUILD)/bench/overlap.jsonl (never tracked files).
#   OVERLAP_ARGS adds options to every run (e.g. OVERLAP_ARGS="--reps 40").
OVERLAP_BENCH := $(BUILD)/bench/dm_overlap
OVERLAP_JSON  := $(BUILD)/bench/overlap.jsonl
OVERLAP_ARGS  ?=
EXTRA_BINS += $(OVERLAP_BENCH)

.PHONY: bench-overlap

$(OVERLAP_BENCH): bench/dm_overlap.c tests/test_world.h tests/test_tmpdir.h $(DISTMESH_C_TCP_O)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP -DDM_LINKS_DISTMESH_C $(UV_CFLAGS) $< $(DISTMESH_C_TCP_O) -o $@ $(UV_LIBS) $(LDLIBS_ALL)

$(BUILD)/examples/ddp_overlap: examples/ddp_overlap.c $(DISTMESH_C_TCP_O)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP $(UV_CFLAGS) $^ -o $@ $(UV_LIBS) $(LDLIBS_ALL)

bench-overlap: deps
	@$(MAKE) --no-print-directory $(OVERLAP_BENCH)
	@rm -f $(OVERLAP_JSON)
	@set -e; for tr in shm tcp; do for k in spin sleep; do \
	    echo "== DISTMESH_TRANSPORT=$$tr $(OVERLAP_BENCH) --compute $$k $(OVERLAP_ARGS)"; \
	    DISTMESH_TRANSPORT=$$tr $(OVERLAP_BENCH) --compute $$k --timeout 120 $(OVERLAP_ARGS) \
	        --json $(OVERLAP_JSON).part; \
	    cat $(OVERLAP_JSON).part >> $(OVERLAP_JSON); \
	done; done; rm -f $(OVERLAP_JSON).part
	@echo "JSON lines: $(OVERLAP_JSON)"
