# overlap fragment: tests/test_overlap.c runs the built examples/ddp_overlap (threads, and 2
# processes over TCP) and bench/dm_overlap (2 ranks, shm and tcp) at small sizes; both programs
# are built by bench/overlap.mk.
OVERLAP_TEST := $(BUILD)/overlap/test_overlap
TEST_BINS += $(OVERLAP_TEST)

$(OVERLAP_TEST): tests/test_overlap.c tests/test_filter.h tests/prelude.h tests/test_world.h tests/test_tmpdir.h | $(BUILD)/examples/ddp_overlap $(BUILD)/bench/dm_overlap
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDM_DDP='"$(abspath $(BUILD))/examples/ddp_overlap"' \
	    -DDM_OVERLAP_BENCH='"$(abspath $(BUILD))/bench/dm_overlap"' $< -o $@ $(CMOCKA_LIBS) $(LDLIBS_ALL)
