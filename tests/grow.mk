# dm_grow on the TCP backend (docs/failures.md "Grow back"): members and newcomer processes on
# loopback through a file store (one test: a TCP store hosted by member rank 0), and the elastic
# example (examples/ddp_overlap.c --elastic / --rejoin).
ifneq ($(wildcard distmesh_tcp.h),)
GROW_TEST_BINS := $(BUILD)/grow/test_grow
TEST_BINS += $(GROW_TEST_BINS)
endif

$(BUILD)/grow/test_grow: tests/test_grow.c tests/prelude.h tests/test_util.h tests/test_world.h tests/test_tmpdir.h $(BUILD)/tcp/impl.o | $(BUILD)/examples/ddp_overlap
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP -DDM_DDP='"$(abspath $(BUILD))/examples/ddp_overlap"' $(UV_CFLAGS) $< \
	    $(BUILD)/tcp/impl.o -o $@ $(LDLIBS_ALL) $(UV_LIBS) $(CMOCKA_LIBS)
