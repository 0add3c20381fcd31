# Benchmarks. `make bench` is the README's main job: all_reduce float sum on 4 local ranks of the
# TCP backend (shared memory between them by default), 8 B .. 64 MiB, with nccl-tests' flags (dm_bench's own options are long ones: --np, --timeout).
# `make compare` runs distmesh, Gloo and OpenMPI side by side (scripts/compare.sh; -a 3: the
# slowest rank's time, as its peers report).
BENCH_DIR := $(BUILD)/bench
DM_BENCH  := $(BENCH_DIR)/dm_bench
EXTRA_BINS += $(DM_BENCH)

$(DM_BENCH): bench/dm_bench.c tests/test_world.h tests/test_tmpdir.h $(DISTMESH_C_TCP_O)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP -DDM_LINKS_DISTMESH_C $(UV_CFLAGS) $< $(DISTMESH_C_TCP_O) -o $@ $(UV_LIBS) $(LDLIBS_ALL)

bench: deps
	@$(MAKE) --no-print-directory $(DM_BENCH)
	$(DM_BENCH) --np 4 -b 8 -e 64M -f 2 -g 1 -d float -o sum -n 10 -w 2 -c 1 --timeout 115

compare: deps
	@$(MAKE) --no-print-directory $(DM_BENCH)
	@bash scripts/compare.sh $(DM_BENCH)

# Scale on simulated hosts (not CI): setup time, fds per rank, 8 B / 64 KiB all_reduce at
# 16..256 ranks on 8 simulated hosts, the store hosted by rank 0 as with dm_init (scripts/scale.sh;
# RANKS, HOSTS, ITERS, STORE=file|rank0, OUT override).
.PHONY: test-scale
test-scale: deps
	@$(MAKE) --no-print-directory $(DM_BENCH)
	@bash scripts/scale.sh $(DM_BENCH)

# `make parity`: distmesh against OpenMPI like for like (issue 17, item 4): bench/parity_bench.c
# built for both, both launched by mpirun, tcp (DISTMESH_TRANSPORT=tcp / --mca btl tcp,self) and
# shared memory (auto / vader), 2 and 4 ranks, 8 B .. 64 MiB; table on stdout, raw lines in
# $(BUILD)/parity/raw.txt. PARITY_ARGS: environment for scripts/parity.sh (e.g. REPS=5 RANKS=2).
PARITY_DIR := $(BUILD)/parity
PARITY_ARGS ?=
.PHONY: parity
$(PARITY_DIR)/parity_bench_dm: bench/parity_bench.c tests/test_world.h tests/test_tmpdir.h $(DM_CORE_HDRS) distmesh_shm.h distmesh_store.h distmesh_socket.h distmesh_tcp.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP $(UV_CFLAGS) $< -o $@ $(UV_LIBS) $(LDLIBS_ALL)
$(PARITY_DIR)/parity_bench_mpi: bench/parity_bench.c tests/test_world.h tests/test_tmpdir.h
	@mkdir -p $(dir $@)
	mpicc -std=c11 -O2 -Wall -Wextra -DPARITY_MPI $< -o $@
parity: deps
	@bash scripts/deps.sh openmpi-bin libopenmpi-dev
	@$(MAKE) --no-print-directory $(PARITY_DIR)/parity_bench_dm $(PARITY_DIR)/parity_bench_mpi
	@env OUT=$(PARITY_DIR) $(PARITY_ARGS) bash scripts/parity.sh $(PARITY_DIR)/parity_bench_dm $(PARITY_DIR)/parity_bench_mpi

# `make bench-launches` (issue 28 item 2): is every launch as fast as the best? The parity harness,
# one size per launch, LAUNCHES (20) launches per size and rank count, distmesh (shared memory)
# and OpenMPI (vader) alternated launch by launch; per size the distribution over launches (min,
# median, max, max / median) and distmesh's median / OpenMPI's (scripts/launches.sh; table in
# $(BUILD)/launches/table.md). Exit status 3 when, on 2 ranks, a distmesh launch is slower than
# 1.3x its median or its median slower than OpenMPI's. LAUNCHES_ARGS: environment for the script
# (e.g. LAUNCHES=10 RANKS=2 SIZES="8 4096" BIND=core).
LAUNCHES_ARGS ?=
.PHONY: bench-launches
bench-launches: deps
	@bash scripts/deps.sh openmpi-bin libopenmpi-dev
	@$(MAKE) --no-print-directory $(PARITY_DIR)/parity_bench_dm $(PARITY_DIR)/parity_bench_mpi
	@env OUT=$(BUILD)/launches $(LAUNCHES_ARGS) bash scripts/launches.sh $(PARITY_DIR)/parity_bench_dm $(PARITY_DIR)/parity_bench_mpi
