# The configuration registry (distmesh.h >>config registry): tests/test_config.c (each type's
# parser, creates that fail on a bad variable, README's table of variables against the registry,
# the headers' getenv sites) and `make config-table`, which rewrites README's table between its
# markers from the registry (tests/config_table.c; also built by build-all so it never rots).
CONFIG_DIR := $(BUILD)/config
ifneq ($(wildcard distmesh_tcp.h),)
TEST_BINS += $(CONFIG_DIR)/test_config
endif
EXTRA_BINS += $(CONFIG_DIR)/config_table

$(CONFIG_DIR)/test_config: tests/test_config.c tests/test_util.h tests/config_table.h tests/test_filter.h tests/prelude.h tests/test_tmpdir.h \
                           $(DM_CORE_HDRS) distmesh_shm.h distmesh_socket.h distmesh_tcp.h $(wildcard distmesh_store.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP -DDM_SRCDIR='"$(CURDIR)"' $(UV_CFLAGS) $< -o $@ $(UV_LIBS) $(CMOCKA_LIBS) $(LDLIBS_ALL)

$(CONFIG_DIR)/config_table: tests/config_table.c tests/config_table.h $(DM_CORE_HDRS) distmesh_shm.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $< -o $@ $(LDLIBS_ALL)

.PHONY: config-table
config-table: $(CONFIG_DIR)/config_table
	$(CONFIG_DIR)/config_table --write README.md
