# security fragment (issue 9): hostile clients against the store and the data-connection hello.
# tests/test_security.c compiles the implementation itself (it drives the hello functions
# directly), with DISTMESH_TCP; loopback only.
ifneq ($(wildcard distmesh_tcp.h),)
SECURITY_TEST := $(BUILD)/security/test_security
TEST_BINS += $(SECURITY_TEST)
endif

$(BUILD)/security/test_security: tests/test_security.c tests/test_filter.h tests/prelude.h tests/test_world.h tests/test_tmpdir.h $(DM_CORE_HDRS) distmesh_shm.h distmesh_store.h distmesh_socket.h distmesh_tcp.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP $(UV_CFLAGS) $< -o $@ $(LDLIBS_ALL) $(UV_LIBS) $(CMOCKA_LIBS)
