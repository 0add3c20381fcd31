# install fragment: `make install` into a private DESTDIR and out-of-tree consumers built through
# pkg-config and CMake (tests/test_install.c, tests/consumer/).
INSTALL_TEST := $(BUILD)/install/test_install
TEST_BINS += $(INSTALL_TEST)

# Under a sanitizer it is one SKIPPED line: the install and the consumers it builds and runs are
# plain builds whatever SAN says, the same work as make test's run (32 s of make asan here).
ifeq ($(SAN),)
$(INSTALL_TEST): tests/test_install.c tests/test_filter.h tests/prelude.h tests/test_world.h tests/test_tmpdir.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDM_SRCDIR='"$(CURDIR)"' $< -o $@ $(CMOCKA_LIBS) $(LDLIBS_ALL)
else
$(INSTALL_TEST): SKIP_REASON := install test skipped under a sanitizer: it builds and runs plain consumers, as make test does
$(INSTALL_TEST): tests/install.mk
	$(skip_program)
endif
