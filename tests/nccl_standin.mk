# The NCCL backend's failure paths without a GPU: tests/test_nccl_standin.c, distmesh_nccl.h
# built with CUDA's and NCCL's real headers but linked against tests/stand_in_cuda_nccl.c (a
# scripted stand-in for libcudart and libnccl) instead of the libraries, so it runs in `make test`
# and `make asan` on any machine with the headers. Without them, tests/nccl_standin_skip.sh takes
# its place and reports one skip with the reason. Also: the NCCL builds under clang (C11 and
# C++11, warnings as errors), where clang is installed. The test runs in two builds: with the
# TCP backend (its store hosted in-process), and NCCL alone (test_nccl_standin_only: no libuv
# flags nor library, tests/no_libuv/uv.h first on the include path; the store a file store).
SI_NCCL_HOME := $(or $(NCCL_HOME),$(CUDA_HOME))
SI_NCCL_INC  := $(firstword $(wildcard $(SI_NCCL_HOME)/include/nccl.h /usr/include/nccl.h $(DM_NCCL_HEADERS)/nccl.h))
SI_DIR       := $(BUILD)/nccl_standin
ifneq ($(and $(SI_NCCL_INC),$(wildcard $(CUDA_HOME)/include/cuda_runtime.h)),)
SI_CFLAGS := -DDISTMESH_NCCL -I$(CUDA_HOME)/include -I$(dir $(SI_NCCL_INC))
# The test binary has the TCP backend too: dm_shrink's fallback re-initialises through a store.
SI_TEST_CFLAGS := $(SI_CFLAGS) -DDISTMESH_TCP $(UV_CFLAGS)
TEST_BINS += $(SI_DIR)/test_nccl_standin $(SI_DIR)/test_nccl_standin_only

$(SI_DIR)/impl.o: tests/impl.c $(DM_CORE_HDRS) distmesh_shm.h distmesh_store.h distmesh_socket.h distmesh_tcp.h distmesh_nccl.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(SI_TEST_CFLAGS) -c $< -o $@
$(SI_DIR)/stand_in_cuda_nccl.o: tests/stand_in_cuda_nccl.c tests/stand_in_cuda_nccl.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(SI_CFLAGS) -c $< -o $@
# No -lcudart, no -lnccl: the stand-in defines every CUDA and NCCL symbol impl.o uses.
$(SI_DIR)/test_nccl_standin: tests/test_nccl_standin.c tests/test_util.h tests/test_nccl_util.h tests/stand_in_cuda_nccl.h tests/test_filter.h tests/prelude.h tests/test_world.h \
                             $(SI_DIR)/impl.o $(SI_DIR)/stand_in_cuda_nccl.o
	$(CC) $(CFLAGS_ALL) $(SI_TEST_CFLAGS) $< $(SI_DIR)/impl.o $(SI_DIR)/stand_in_cuda_nccl.o -o $@ \
	    $(CMOCKA_LIBS) $(UV_LIBS) $(LDLIBS_ALL)
# NCCL alone: neither libuv's flags nor its library.
$(SI_DIR)/impl_only.o: tests/impl.c $(DM_CORE_HDRS) distmesh_shm.h distmesh_store.h distmesh_nccl.h tests/no_libuv/uv.h
	@mkdir -p $(dir $@)
	$(CC) -Itests/no_libuv $(CFLAGS_ALL) $(SI_CFLAGS) -c $< -o $@
$(SI_DIR)/test_nccl_standin_only: tests/test_nccl_standin.c tests/test_util.h tests/test_nccl_util.h tests/stand_in_cuda_nccl.h tests/test_filter.h tests/prelude.h \
                                  tests/test_tmpdir.h tests/test_world.h $(SI_DIR)/impl_only.o $(SI_DIR)/stand_in_cuda_nccl.o
	$(CC) -Itests/no_libuv $(CFLAGS_ALL) $(SI_CFLAGS) $< $(SI_DIR)/impl_only.o $(SI_DIR)/stand_in_cuda_nccl.o -o $@ \
	    $(CMOCKA_LIBS) $(LDLIBS_ALL)

ifneq ($(shell command -v clang 2>/dev/null),)
EXTRA_BINS += $(SI_DIR)/compile_nccl_clang
$(SI_DIR)/compile_nccl_clang: tests/impl.c $(DM_CORE_HDRS) distmesh_shm.h distmesh_store.h distmesh_socket.h distmesh_tcp.h distmesh_nccl.h
	@mkdir -p $(dir $@)
	clang -std=c11 $(WARN) $(OPT) -Itests/no_libuv -I. -pthread $(SI_CFLAGS) -c $< -o $@.c.o
	clang -std=c11 $(WARN) $(OPT) -I. -pthread $(SI_CFLAGS) -DDISTMESH_TCP $(UV_CFLAGS) -c $< -o $@.tcp.o
	clang++ -x c++ -std=c++11 -Wall -Wextra -Werror $(OPT) -I. -pthread $(SI_CFLAGS) -DDISTMESH_TCP \
	    $(UV_CFLAGS) -c $< -o $@.cc.o
	@touch $@
endif
else
TEST_BINS += tests/nccl_standin_skip.sh
endif
