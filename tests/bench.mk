# bench fragment: dm_bench with nccl-tests' flags (tests/test_bench.c runs the built dm_bench on 2
# local ranks: forked processes over TCP / shared memory, and threads).
BENCH_TEST := $(BUILD)/benchtest/test_bench
TEST_BINS += $(BENCH_TEST)

$(BENCH_TEST): tests/test_bench.c tests/test_filter.h tests/prelude.h tests/test_world.h tests/test_tmpdir.h | $(BUILD)/bench/dm_bench
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDM_BENCH='"$(abspath $(BUILD))/bench/dm_bench"' $< -o $@ $(CMOCKA_LIBS) $(LDLIBS_ALL)
