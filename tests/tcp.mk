# TCP backend tests (the tcp-ring area): tests/impl.c again with DISTMESH_TCP, compiled once into
# $(BUILD)/tcp/impl.o and linked by each test_tcp_* program (tests/test_tcp.h lists what each
# holds; each runs under tests/run.sh's per-program timeout). The netns test in
# test_tcp_rendezvous runs tests/netns_test.sh as root.
ifneq ($(wildcard distmesh_tcp.h),)
TCP_TESTS := test_tcp_collectives test_tcp_hosts test_tcp_failures test_tcp_sparse test_tcp_rendezvous \
             test_tcp_relay test_sites
TCP_TEST_BINS := $(addprefix $(BUILD)/tcp/,$(TCP_TESTS))
TEST_BINS += $(TCP_TEST_BINS)
endif

# (the same compile as distmesh.c's object for the examples, tests/core.mk: tests/impl.c and
# distmesh.c hold the same two lines, so it is copied, not compiled twice)
$(BUILD)/tcp/impl.o: $(DISTMESH_C_TCP_O)
	@mkdir -p $(dir $@)
	cp $< $@

$(TCP_TEST_BINS): $(BUILD)/tcp/%: tests/%.c tests/test_tcp.h tests/test_world.h tests/test_tmpdir.h \
                  tests/test_util.h tests/test_filter.h tests/prelude.h $(BUILD)/tcp/impl.o
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP -DDM_SRCDIR='"$(CURDIR)"' $(UV_CFLAGS) $< $(BUILD)/tcp/impl.o -o $@ $(LDLIBS_ALL) $(UV_LIBS) $(CMOCKA_LIBS)
