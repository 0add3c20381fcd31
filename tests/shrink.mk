# dm_shrink (issue 18): the threaded world and forked ranks over shm, tcp and two simulated
# hosts, kill -9 of a rank and a second death during the shrink. `make test-shrink-trials`
# runs every kill case 20 times (by hand: about 3 minutes).
ifneq ($(wildcard distmesh_tcp.h),)
SHRINK_TEST_BINS := $(BUILD)/shrink/test_shrink
TEST_BINS += $(SHRINK_TEST_BINS)
endif

$(BUILD)/shrink/test_shrink: tests/test_shrink.c tests/test_world.h tests/test_tmpdir.h tests/test_filter.h $(BUILD)/tcp/impl.o
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP $(UV_CFLAGS) $< $(BUILD)/tcp/impl.o -o $@ $(LDLIBS_ALL) $(UV_LIBS) $(CMOCKA_LIBS)

.PHONY: test-shrink-trials
test-shrink-trials: deps $(BUILD)/shrink/test_shrink
	DM_SHRINK_TRIALS=20 timeout -k 10 1800 $(BUILD)/shrink/test_shrink

# The failure cases on a busy machine (scripts/test_loaded.sh): shrink (second death, back-to-back
# shrinks, every kill case), grow after a shrink or with a newcomer that never comes, and the tcp
# fault matrix, LOADED_TRIALS times each, quiet, beside a CPU hog, and on one core.
# LOADED_ONLY=REGEX keeps the cases whose "program|pattern" matches (e.g. LOADED_ONLY=shrink).
LOADED_TRIALS ?= 10
LOADED_LOADS ?= quiet hog onecore
LOADED_ONLY ?=
.PHONY: test-loaded
test-loaded: deps $(BUILD)/shrink/test_shrink $(BUILD)/grow/test_grow $(BUILD)/tcp/test_tcp_failures
	bash scripts/test_loaded.sh $(BUILD) $(LOADED_TRIALS) "$(LOADED_LOADS)" "$(LOADED_ONLY)"
