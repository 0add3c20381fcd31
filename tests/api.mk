# Acceptance tests of the issue-11 API (point-to-point, all-to-all(v), reduce / gather / scatter,
# the _async twins and dm_request): one cmocka program (linked with tests/tcp.mk's impl.o) that
# runs every new call on the threaded world, shared memory and TCP (forked ranks on loopback).
ifneq ($(wildcard distmesh_tcp.h),)
API_TEST_BINS := $(BUILD)/api/test_api
TEST_BINS += $(API_TEST_BINS)
endif

$(BUILD)/api/test_api: tests/test_api.c tests/test_util.h tests/test_filter.h tests/prelude.h tests/test_world.h tests/test_tmpdir.h $(BUILD)/tcp/impl.o
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP $(UV_CFLAGS) $< $(BUILD)/tcp/impl.o -o $@ $(LDLIBS_ALL) $(UV_LIBS) $(CMOCKA_LIBS)
