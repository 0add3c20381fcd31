# Issue 19 "See inside": the timeline, the flight recorder and scripts/dm_trace's report, on the
# threaded world, shared memory and TCP (forked ranks on loopback): one cmocka program linked with
# tests/tcp.mk's impl.o. DM_SRCDIR lets it run scripts/dm_trace from the source tree.
ifneq ($(wildcard distmesh_tcp.h),)
TRACE_TEST_BINS := $(BUILD)/trace/test_trace
TEST_BINS += $(TRACE_TEST_BINS)
endif

$(BUILD)/trace/test_trace: tests/test_trace.c tests/test_filter.h tests/prelude.h tests/test_world.h tests/test_tmpdir.h $(BUILD)/tcp/impl.o
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP -DDM_SRCDIR='"$(CURDIR)"' $(UV_CFLAGS) $< $(BUILD)/tcp/impl.o -o $@ $(LDLIBS_ALL) $(UV_LIBS) $(CMOCKA_LIBS)

# DISTMESH_NO_TRACE (distmesh_trace.h >>trace hooks): tests/test_notrace.c, the core's implementation in
# its own TU without distmesh_trace.h, runs collectives on the Fake and the threaded world. The
# compile checks of tests/coretests.mk build it with TCP too, as C and as C++.
TEST_BINS += $(BUILD)/trace/test_notrace
$(BUILD)/trace/test_notrace: tests/test_notrace.c tests/prelude.h tests/test_filter.h tests/test_world.h tests/test_tmpdir.h \
                              distmesh.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $< -o $@ $(CMOCKA_LIBS) $(LDLIBS_ALL)
