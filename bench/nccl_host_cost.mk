# `make bench-nccl-host-cost` (issue 52, item 8): bench/nccl_host_cost.c, what an NCCL call costs
# the host through distmesh (calls per second, CPU seconds per call from getrusage) on the
# CUDA/NCCL stand-in, no GPU: distmesh's non-blocking communicator (_async + dm_wait, and the
# blocking call) against a blocking communicator (NCCL_COMM_BLOCKING=1) on the same build.
# Built like tests/nccl_standin.mk's NCCL-only test (impl_only.o, the stand-in's object), so
# only where CUDA's and NCCL's headers are; NHC_ARGS: the program's arguments (rounds, then
# launch_us,kernel_us cases). Figures and what they mean: bench/README.md.
NHC_ARGS ?=
.PHONY: bench-nccl-host-cost
ifneq ($(SI_CFLAGS),)
NHC_BENCH := $(SI_DIR)/nccl_host_cost
EXTRA_BINS += $(NHC_BENCH)
$(NHC_BENCH): bench/nccl_host_cost.c tests/stand_in_cuda_nccl.h tests/test_world.h $(SI_DIR)/impl_only.o \
              $(SI_DIR)/stand_in_cuda_nccl.o
	$(CC) -Itests/no_libuv $(CFLAGS_ALL) $(SI_CFLAGS) $< $(SI_DIR)/impl_only.o $(SI_DIR)/stand_in_cuda_nccl.o -o $@ \
	    $(LDLIBS_ALL)
bench-nccl-host-cost: deps
	@$(MAKE) --no-print-directory $(NHC_BENCH)
	$(NHC_BENCH) $(NHC_ARGS)
else
bench-nccl-host-cost:
	@echo "bench-nccl-host-cost: skipped: CUDA's cuda_runtime.h or NCCL's nccl.h not found"
endif
