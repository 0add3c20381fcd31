# store fragment: the rendezvous stores of distmesh_store.h (TCP server + client, file store):
# tests/test_store.c (cmocka) and tests/test_store_quota.c (the server's memory quota, issue 18),
# both linked with tests/tcp.mk's impl.o (the server needs DISTMESH_TCP).
# tests/test_store_kinds.c: every operation through each kind's table, built twice: with
# DISTMESH_TCP, and with DISTMESH_STORE alone (no libuv flags nor library; tests/no_libuv/uv.h
# first on the include path stops any include of uv.h), its server then store_tool in a child.
ifneq ($(wildcard distmesh_tcp.h),)
STORE_TEST_BINS := $(BUILD)/store/test_store $(BUILD)/store/test_store_quota $(BUILD)/store/test_store_kinds \
                   $(BUILD)/store/test_store_kinds_nouv
TEST_BINS += $(STORE_TEST_BINS)
endif

$(BUILD)/store/test_store: tests/test_store.c tests/prelude.h tests/test_world.h tests/test_tmpdir.h $(BUILD)/tcp/impl.o
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP $(UV_CFLAGS) $< $(BUILD)/tcp/impl.o -o $@ $(LDLIBS_ALL) $(UV_LIBS) $(CMOCKA_LIBS)

$(BUILD)/store/test_store_quota: tests/test_store_quota.c tests/test_world.h tests/test_filter.h tests/prelude.h $(BUILD)/tcp/impl.o
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP $(UV_CFLAGS) $< $(BUILD)/tcp/impl.o -o $@ $(LDLIBS_ALL) $(UV_LIBS) $(CMOCKA_LIBS)

$(BUILD)/store/test_store_kinds: tests/test_store_kinds.c tests/test_util.h tests/test_filter.h tests/prelude.h tests/test_tmpdir.h $(DM_CORE_HDRS) distmesh_shm.h \
                                 distmesh_store.h distmesh_socket.h distmesh_tcp.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP $(UV_CFLAGS) $< -o $@ $(LDLIBS_ALL) $(UV_LIBS) $(CMOCKA_LIBS)

$(BUILD)/store/test_store_kinds_nouv: tests/test_store_kinds.c tests/test_util.h tests/test_filter.h tests/prelude.h tests/test_tmpdir.h $(DM_CORE_HDRS) distmesh_shm.h \
                                      distmesh_store.h tests/no_libuv/uv.h | $(BUILD)/fixtures/store_tool
	@mkdir -p $(dir $@)
	$(CC) -Itests/no_libuv $(CFLAGS_ALL) -DDISTMESH_STORE -DDM_STORE_TOOL='"$(abspath $(BUILD))/fixtures/store_tool"' \
	    $< -o $@ $(LDLIBS_ALL) $(CMOCKA_LIBS)

.PHONY: test-store
test-store: $(STORE_TEST_BINS)
	@bash tests/run.sh $(TEST_TIMEOUT) $(STORE_TEST_BINS)
