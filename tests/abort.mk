# dm_abort: a collective stopped from another thread (the Python package's Ctrl-C rests on it):
# the Fake backend, the threaded world and forked ranks over sockets and shared memory (on
# tests/test_world.h), linked with tests/tcp.mk's impl.o.
ifneq ($(wildcard distmesh_tcp.h),)
ABORT_TEST_BINS := $(BUILD)/abort/test_abort
TEST_BINS += $(ABORT_TEST_BINS)
endif

$(BUILD)/abort/test_abort: tests/test_abort.c tests/test_world.h tests/test_tmpdir.h tests/test_filter.h tests/prelude.h \
                           $(BUILD)/tcp/impl.o
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP $(UV_CFLAGS) $< $(BUILD)/tcp/impl.o -o $@ $(LDLIBS_ALL) $(UV_LIBS) $(CMOCKA_LIBS)
