# Dropping distmesh into an existing C program (issue 29): tests/test_dropin.c (what a failed
# create, a successful start and a later error print, DISTMESH_LOG, DM_CHECK; forked children
# on the TCP build, linked with tests/tcp.mk's impl.o).
DROPIN_DIR := $(BUILD)/dropin
ifneq ($(wildcard distmesh_tcp.h),)
TEST_BINS += $(DROPIN_DIR)/test_dropin
endif

$(DROPIN_DIR)/test_dropin: tests/test_dropin.c tests/test_world.h tests/test_tmpdir.h tests/test_filter.h \
                           $(BUILD)/tcp/impl.o
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP $(UV_CFLAGS) $< $(BUILD)/tcp/impl.o -o $@ $(LDLIBS_ALL) $(UV_LIBS) $(CMOCKA_LIBS)
