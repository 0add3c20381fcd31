# TCP backend tests (the tcp-ring area): tests/impl.c again with DISTMESH_TCP, plus the
# multi-process test program. The netns test inside it runs tests/netns_test.sh as root.
ifneq ($(wildcard distmesh_tcp.h),)
TCP_TEST_BINS := $(BUILD)/tcp/test_tcp
TEST_BINS += $(TCP_TEST_BINS)
endif

$(BUILD)/tcp/impl.o: tests/impl.c distmesh.h distmesh_store.h distmesh_tcp.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP $(UV_CFLAGS) -c $< -o $@

$(BUILD)/tcp/test_tcp: tests/test_tcp.c tests/test_tmpdir.h tests/test_util.h $(BUILD)/tcp/impl.o
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP -DDM_SRCDIR='"$(CURDIR)"' $(UV_CFLAGS) $< $(BUILD)/tcp/impl.o -o $@ $(LDLIBS_ALL) $(UV_LIBS) $(CMOCKA_LIBS)

