# core-tests fragment: unit tests of distmesh.h (Fake, threaded world, kernels, mesh, env) and the
# compile checks (C and C++, gcc and clang, two plain TUs in one program). Everything lands under
# $(BUILD)/core/. The tests link tests/impl.c compiled WITHOUT backend flags: the core alone.
CORE_DIR := $(BUILD)/core
CORE_TESTS := $(patsubst tests/%.c,%,$(wildcard tests/test_fake.c tests/test_reduce.c tests/test_mesh.c tests/test_env.c))
CORE_TEST_BINS := $(addprefix $(CORE_DIR)/,$(CORE_TESTS)) $(CORE_DIR)/test_compile
TEST_BINS += $(CORE_TEST_BINS)

# (the same compile as distmesh.c's object for the examples, tests/core.mk: copied)
$(CORE_DIR)/impl.o: $(DISTMESH_C_O)
	@mkdir -p $(dir $@)
	cp $< $@

$(CORE_DIR)/%.o: tests/%.c $(DM_CORE_HDRS) distmesh_shm.h tests/test_util.h tests/prelude.h tests/test_filter.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -c $< -o $@

$(addprefix $(CORE_DIR)/,$(CORE_TESTS)): $(CORE_DIR)/%: $(CORE_DIR)/%.o $(CORE_DIR)/impl.o
	$(CC) $(CFLAGS_ALL) $^ -o $@ $(CMOCKA_LIBS) $(LDLIBS_ALL)

# Compile checks. Each is a whole program that includes distmesh.h with DISTMESH_IMPLEMENTATION
# and takes the address of every public function, so a declaration without a definition fails
# at link time. They are prerequisites of test_compile, so a failure here fails `make test`.
# clang may be missing on a fresh machine (scripts/deps.sh installs gcc/g++ only).
CORE_CLANG   := $(shell command -v clang 2>/dev/null)
CORE_CLANGXX := $(shell command -v clang++ 2>/dev/null)
# DISTMESH_OPTIMIZE_ALL: the checks see the cold regions (distmesh.h >>compile cost) at $(OPT) too,
# so its flow-based warnings cover them; every other build compiles them as shipped (-Og).
CORE_C_STRICT   := -std=c11 -Wall -Wextra -Wpedantic -Werror $(OPT) $(SAN) -I. -pthread -DDISTMESH_OPTIMIZE_ALL
CORE_CXX_STRICT := -std=c++11 -Wall -Wextra -Werror $(OPT) $(SAN) -I. -pthread -DDISTMESH_OPTIMIZE_ALL
# The compilers there are, by check name: <lang>_<compiler>.
CORE_COMPILERS := c_gcc cpp_gxx $(if $(CORE_CLANG),c_clang) $(if $(CORE_CLANGXX),cpp_clangxx)
CORE_COMPILE_CHECKS := $(addprefix $(CORE_DIR)/compile_,$(CORE_COMPILERS))

# One source, tests/compile_check.c, built as C by gcc and clang and as C++ (-x c++) by g++ and
# clang++; the check's name says which (compile_<lang>_<compiler>[_tcp|_store]).
CORE_CC_c_gcc       := gcc
CORE_CC_c_clang     := clang
CORE_CC_cpp_gxx     := g++ -x c++
CORE_CC_cpp_clangxx := clang++ -x c++
CORE_STRICT_c   := $(CORE_C_STRICT)
CORE_STRICT_cpp := $(CORE_CXX_STRICT)
core_compile = $(CORE_CC_$(1)) $(2) $(CORE_STRICT_$(firstword $(subst _, ,$(1))))
$(CORE_DIR)/compile_%: tests/compile_check.c $(DM_CORE_HDRS) distmesh_shm.h
	@mkdir -p $(dir $@)
	$(call core_compile,$*) $< -o $@ $(LDLIBS_ALL)

# The same with the TCP backend compiled in (libuv needed), part of test_compile's checks. The
# C++ one builds the cold regions as shipped (without DISTMESH_OPTIMIZE_ALL, so under their
# GCC optimize pragmas): g++ refuses a declaration that follows a definition across those
# pragmas ("optimization attribute ... follows definition"), which only this build shows.
CORE_COMPILE_TCP := $(CORE_DIR)/compile_c_gcc_tcp $(CORE_DIR)/compile_cpp_gxx_tcp
$(CORE_DIR)/compile_cpp_gxx_tcp: CORE_STRICT_cpp := $(filter-out -DDISTMESH_OPTIMIZE_ALL,$(CORE_CXX_STRICT))
CORE_COMPILE_CHECKS += $(CORE_COMPILE_TCP)
.PHONY: core-compile-tcp
core-compile-tcp: $(CORE_COMPILE_TCP)
$(CORE_DIR)/compile_%_tcp: tests/compile_check.c $(DM_CORE_HDRS) distmesh_shm.h distmesh_store.h distmesh_socket.h distmesh_tcp.h
	@mkdir -p $(dir $@)
	$(call core_compile,$*) -DDISTMESH_TCP $(OPENSSL_CFLAGS) $(UV_CFLAGS) $< -o $@ $(UV_LIBS) $(LDLIBS_ALL)

# The store alone (DISTMESH_STORE: its client and file store on libc), with neither libuv's
# flags nor its library; tests/no_libuv/uv.h first on the include path stops any include of uv.h.
CORE_COMPILE_STORE := $(patsubst %,$(CORE_DIR)/compile_%_store,$(CORE_COMPILERS))
CORE_COMPILE_CHECKS += $(CORE_COMPILE_STORE)
CORE_NO_UV := -Itests/no_libuv -DDISTMESH_STORE
$(CORE_DIR)/compile_%_store: tests/compile_check.c $(DM_CORE_HDRS) distmesh_shm.h distmesh_store.h tests/no_libuv/uv.h
	@mkdir -p $(dir $@)
	$(call core_compile,$*,$(CORE_NO_UV)) $< -o $@ $(LDLIBS_ALL)

# The store alone with its sealed connections (DISTMESH_OPENSSL: the core's records, libcrypto).
ifeq ($(OPENSSL),1)
CORE_COMPILE_CHECKS += $(patsubst %,$(CORE_DIR)/compile_%_store_ssl,$(CORE_COMPILERS))
endif
$(CORE_DIR)/compile_%_store_ssl: tests/compile_check.c $(DM_CORE_HDRS) distmesh_shm.h distmesh_store.h tests/no_libuv/uv.h
	@mkdir -p $(dir $@)
	$(call core_compile,$*,$(CORE_NO_UV) -DDISTMESH_OPENSSL) $< -o $@ $(LDLIBS_ALL) -lcrypto

# Without the flight recorder (DISTMESH_NO_TRACE: distmesh_trace.h left out), with the TCP backend.
CORE_COMPILE_CHECKS += $(patsubst %,$(CORE_DIR)/compile_%_notrace,$(CORE_COMPILERS))
$(CORE_DIR)/compile_%_notrace: tests/compile_check.c $(DM_CORE_HDRS) distmesh_shm.h distmesh_store.h distmesh_socket.h distmesh_tcp.h
	@mkdir -p $(dir $@)
	$(call core_compile,$*) -DDISTMESH_NO_TRACE -DDISTMESH_TCP $(UV_CFLAGS) $< -o $@ $(UV_LIBS) $(LDLIBS_ALL)

# The sanitizer stages leave the compile checks to the plain one (Makefile, CHECK_BUILDS).
ifeq ($(CHECK_BUILDS),0)
CORE_COMPILE_CHECKS :=
endif

# Two TUs that include distmesh.h plainly, linked with impl.o into one cmocka program.
$(CORE_DIR)/test_compile: $(CORE_DIR)/test_compile_a.o $(CORE_DIR)/test_compile_b.o \
                          $(CORE_DIR)/impl.o | $(CORE_COMPILE_CHECKS)
	$(CC) $(CFLAGS_ALL) $(filter %.o,$^) -o $@ $(CMOCKA_LIBS) $(LDLIBS_ALL)
