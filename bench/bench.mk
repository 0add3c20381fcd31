# Benchmarks. `make bench` is the README's main job: all_reduce float sum on 4 local ranks of the
# TCP backend (shared memory between them by default), 8 B .. 64 MiB, with nccl-tests' flags (dm_bench's own options are long ones: --np, --timeout).
# `make compare` runs distmesh, Gloo and OpenMPI side by side (scripts/compare.sh; -a 3: the
# slowest rank's time, as its peers report).
BENCH_DIR := $(BUILD)/bench
DM_BENCH  := $(BENCH_DIR)/dm_bench
EXTRA_BINS += $(DM_BENCH)

$(DM_BENCH): bench/dm_bench.c distmesh.h distmesh_tcp.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DDISTMESH_TCP $(UV_CFLAGS) $< -o $@ $(UV_LIBS) $(LDLIBS_ALL)

bench: deps
	@$(MAKE) --no-print-directory $(DM_BENCH)
	$(DM_BENCH) --np 4 -b 8 -e 64M -f 2 -g 1 -d float -o sum -n 10 -w 2 -c 1 --timeout 115

compare: deps
	@$(MAKE) --no-print-directory $(DM_BENCH)
	@bash scripts/compare.sh $(DM_BENCH)

# Scale on simulated hosts (not CI): setup time, fds per rank, 8 B / 64 KiB all_reduce at
# 16..256 ranks on 8 simulated hosts (scripts/scale.sh; RANKS, HOSTS, ITERS override).
.PHONY: test-scale
test-scale: deps
	@$(MAKE) --no-print-directory $(DM_BENCH)
	@bash scripts/scale.sh $(DM_BENCH)
