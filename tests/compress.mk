# The compressed all-reduce (issue 38, distmesh.h >>functions compression): tests/test_compress.c
# on the threaded world's simulated layouts and forked TCP ranks, and the training example
# (examples/ddp_overlap.c --compress) on 2 simulated hosts x 2 ranks against exact training.
ifneq ($(wildcard distmesh_tcp.h),)
COMPRESS_TEST_BINS := $(BUILD)/compress/test_compress
TEST_BINS += $(COMPRESS_TEST_BINS)
endif

$(BUILD)/compress/test_compress: tests/test_compress.c tests/test_tcp.h tests/test_world.h tests/test_tmpdir.h \
                                 tests/test_util.h tests/test_filter.h tests/prelude.h $(BUILD)/tcp/impl.o \
                                 | $(BUILD)/examples/ddp_overlap
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP -DDM_DDP='"$(abspath $(BUILD))/examples/ddp_overlap"' $(UV_CFLAGS) $< \
	    $(BUILD)/tcp/impl.o -o $@ $(LDLIBS_ALL) $(UV_LIBS) $(CMOCKA_LIBS)
