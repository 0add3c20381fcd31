# install fragment: `make install` into a private DESTDIR and out-of-tree consumers built through
# pkg-config and CMake (tests/test_install.c, tests/consumer/).
INSTALL_TEST := $(BUILD)/install/test_install
TEST_BINS += $(INSTALL_TEST)

$(INSTALL_TEST): tests/test_install.c tests/test_filter.h tests/prelude.h tests/test_world.h tests/test_tmpdir.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDM_SRCDIR='"$(CURDIR)"' $< -o $@ $(CMOCKA_LIBS) $(LDLIBS_ALL)
