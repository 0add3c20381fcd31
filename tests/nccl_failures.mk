# The NCCL backend's failure paths of issue 41 (tests/test_nccl_failures.c) against the CUDA/NCCL
# stand-in, like tests/nccl_standin.mk (whose impl.o and stand-in object it links), and a second
# build of it, test_nccl_failures_before_2_27, against a stand-in without ncclCommShrink (an NCCL
# 2.26 library), linked with -z now: it links and runs only while distmesh_nccl.h's reference to
# ncclCommShrink is weak. Without CUDA's or NCCL's headers tests/nccl_standin_skip.sh reports
# the skip (nccl_standin.mk).
NF_NCCL_HOME := $(or $(NCCL_HOME),$(CUDA_HOME))
NF_NCCL_INC  := $(firstword $(wildcard $(NF_NCCL_HOME)/include/nccl.h /usr/include/nccl.h $(DM_NCCL_HEADERS)/nccl.h))
NF_DIR       := $(BUILD)/nccl_standin
ifneq ($(and $(NF_NCCL_INC),$(wildcard $(CUDA_HOME)/include/cuda_runtime.h)),)
NF_CFLAGS := -DDISTMESH_NCCL -I$(CUDA_HOME)/include -I$(dir $(NF_NCCL_INC))
TEST_BINS += $(NF_DIR)/test_nccl_failures $(NF_DIR)/test_nccl_failures_before_2_27

$(NF_DIR)/test_nccl_failures: tests/test_nccl_failures.c tests/test_nccl_util.h tests/stand_in_cuda_nccl.h tests/test_filter.h \
                              tests/test_world.h $(NF_DIR)/impl.o $(NF_DIR)/stand_in_cuda_nccl.o
	$(CC) $(CFLAGS_ALL) $(NF_CFLAGS) -DDISTMESH_TCP $(UV_CFLAGS) $< $(NF_DIR)/impl.o $(NF_DIR)/stand_in_cuda_nccl.o \
	    -o $@ $(CMOCKA_LIBS) $(UV_LIBS) $(LDLIBS_ALL)
$(NF_DIR)/stand_in_before_2_27.o: tests/stand_in_cuda_nccl.c tests/stand_in_cuda_nccl.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(NF_CFLAGS) -DSI_WITHOUT_SHRINK -c $< -o $@
$(NF_DIR)/test_nccl_failures_before_2_27: tests/test_nccl_failures.c tests/test_nccl_util.h tests/stand_in_cuda_nccl.h tests/test_filter.h \
                                          tests/test_world.h $(NF_DIR)/impl.o $(NF_DIR)/stand_in_before_2_27.o
	$(CC) $(CFLAGS_ALL) $(NF_CFLAGS) -DDISTMESH_TCP -DSI_WITHOUT_SHRINK $(UV_CFLAGS) $< $(NF_DIR)/impl.o \
	    $(NF_DIR)/stand_in_before_2_27.o -o $@ -Wl,-z,now $(CMOCKA_LIBS) $(UV_LIBS) $(LDLIBS_ALL)
endif
