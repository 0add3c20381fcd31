# NCCL backend: built wherever CUDA's headers and NCCL are installed (they are on CI, without a
# GPU: every GPU test then reports a cmocka skip, "no GPU"). `make test-gpu` runs only these, on
# a machine with a GPU (`make -o deps test-gpu` where apt cannot reach the network and libuv and
# cmocka come from elsewhere). `make bench-gpu` measures distmesh's per-call overhead over raw
# ncclAllReduce. CUDA_HOME defaults to /usr/local/cuda; NCCL_HOME to it as well.
NCCL_HOME ?= $(CUDA_HOME)
NCCL_INC  := $(firstword $(wildcard $(NCCL_HOME)/include/nccl.h /usr/include/nccl.h))
NCCL_LIBDIR := $(firstword $(dir $(wildcard $(NCCL_HOME)/lib64/libnccl.so /usr/lib/x86_64-linux-gnu/libnccl.so)))
ifneq ($(and $(NCCL_INC),$(NCCL_LIBDIR),$(wildcard $(CUDA_HOME)/include/cuda_runtime.h)),)
NCCL_CFLAGS := -DDISTMESH_TCP -DDISTMESH_NCCL $(UV_CFLAGS) -I$(CUDA_HOME)/include -I$(dir $(NCCL_INC))
NCCL_LIBS   := -L$(CUDA_HOME)/lib64 -L$(NCCL_LIBDIR) -Wl,-rpath,$(CUDA_HOME)/lib64 -Wl,-rpath,$(NCCL_LIBDIR) \
               -lnccl -lcudart $(UV_LIBS)
NCCL_TEST := $(BUILD)/nccl/test_nccl
TEST_BINS += $(NCCL_TEST)
EXTRA_BINS += $(BUILD)/nccl/compile_cpp $(BUILD)/nccl/compile_nccl_only $(BUILD)/nccl/compile_tcp_cuda \
              $(BUILD)/nccl/nccl_overhead

$(BUILD)/nccl/impl.o: tests/impl.c $(DM_CORE_HDRS) distmesh_shm.h distmesh_store.h distmesh_socket.h distmesh_tcp.h distmesh_nccl.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(NCCL_CFLAGS) -c $< -o $@

$(BUILD)/nccl/test_nccl: tests/test_nccl.c tests/test_world.h tests/test_tmpdir.h $(BUILD)/nccl/impl.o
	$(CC) $(CFLAGS_ALL) $(NCCL_CFLAGS) $< $(BUILD)/nccl/impl.o -o $@ $(NCCL_LIBS) $(CMOCKA_LIBS) $(LDLIBS_ALL)

# Every header with every backend, as C++ (the C build is impl.o above).
$(BUILD)/nccl/compile_cpp: tests/impl.c $(DM_CORE_HDRS) distmesh_shm.h distmesh_store.h distmesh_socket.h distmesh_tcp.h distmesh_nccl.h
	@mkdir -p $(dir $@)
	$(CXX) -x c++ $(CXXFLAGS_ALL) $(NCCL_CFLAGS) -c $< -o $@.o && touch $@

# The other two CUDA configurations, C and C++: NCCL alone (the store's client and file store,
# or a unique id from the caller, e.g. an MPI bootstrap; no libuv: tests/no_libuv/uv.h stops any
# include of uv.h) and the TCP backend taking device buffers without NCCL.
$(BUILD)/nccl/compile_nccl_only: tests/impl.c $(DM_CORE_HDRS) distmesh_shm.h distmesh_store.h distmesh_nccl.h tests/no_libuv/uv.h
	@mkdir -p $(dir $@)
	$(CC) -Itests/no_libuv $(CFLAGS_ALL) -DDISTMESH_NCCL -I$(CUDA_HOME)/include -I$(dir $(NCCL_INC)) -c $< -o $@.c.o
	$(CXX) -x c++ -Itests/no_libuv $(CXXFLAGS_ALL) -DDISTMESH_NCCL -I$(CUDA_HOME)/include -I$(dir $(NCCL_INC)) -c $< -o $@.cc.o
	@touch $@
$(BUILD)/nccl/compile_tcp_cuda: tests/impl.c $(DM_CORE_HDRS) distmesh_shm.h distmesh_store.h distmesh_socket.h distmesh_tcp.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP -DDISTMESH_CUDA $(UV_CFLAGS) -I$(CUDA_HOME)/include -c $< -o $@.c.o
	$(CXX) -x c++ $(CXXFLAGS_ALL) -DDISTMESH_TCP -DDISTMESH_CUDA $(UV_CFLAGS) -I$(CUDA_HOME)/include -c $< -o $@.cc.o
	@touch $@

# distmesh's per-call overhead over raw ncclAllReduce (NCCL world 1, 8 B); `make bench-gpu` runs it.
$(BUILD)/nccl/nccl_overhead: bench/nccl_overhead.c tests/test_world.h tests/test_tmpdir.h $(DM_CORE_HDRS) distmesh_shm.h distmesh_store.h distmesh_nccl.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_NCCL -I$(CUDA_HOME)/include -I$(dir $(NCCL_INC)) $< -o $@ \
	    -L$(CUDA_HOME)/lib64 -L$(NCCL_LIBDIR) -Wl,-rpath,$(CUDA_HOME)/lib64 -Wl,-rpath,$(NCCL_LIBDIR) \
	    -lnccl -lcudart $(LDLIBS_ALL)

bench-gpu:
	@$(MAKE) --no-print-directory $(BUILD)/nccl/nccl_overhead
	$(BUILD)/nccl/nccl_overhead

test-gpu: deps
	@$(MAKE) --no-print-directory $(NCCL_TEST)
	@bash tests/run.sh $(TEST_TIMEOUT) $(NCCL_TEST)
else
test-gpu bench-gpu:
	@echo "$@: CUDA ($(CUDA_HOME)/include/cuda_runtime.h) and NCCL (nccl.h, libnccl.so) not found" && false
endif
.PHONY: bench-gpu
