# tcp-store fragment: the rendezvous stores (TCP server + client, file store) of distmesh_tcp.h:
# tests/test_store.c (cmocka) and tests/test_store_quota.c (the server's memory quota, issue 18),
# both linked with tests/tcp.mk's impl.o.
# Registered once distmesh_tcp.h exists (it includes the store section).
ifneq ($(wildcard distmesh_tcp.h),)
STORE_TEST_BINS := $(BUILD)/store/test_store $(BUILD)/store/test_store_quota
TEST_BINS += $(STORE_TEST_BINS)
endif

$(BUILD)/store/test_store: tests/test_store.c tests/test_world.h tests/test_tmpdir.h $(BUILD)/tcp/impl.o
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP $(UV_CFLAGS) $< $(BUILD)/tcp/impl.o -o $@ $(LDLIBS_ALL) $(UV_LIBS) $(CMOCKA_LIBS)

$(BUILD)/store/test_store_quota: tests/test_store_quota.c tests/test_filter.h $(BUILD)/tcp/impl.o
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP $(UV_CFLAGS) $< $(BUILD)/tcp/impl.o -o $@ $(LDLIBS_ALL) $(UV_LIBS) $(CMOCKA_LIBS)

.PHONY: test-store
test-store: $(STORE_TEST_BINS)
	@bash tests/run.sh $(TEST_TIMEOUT) $(STORE_TEST_BINS)
