# `make bench-hosts` (issue 17): all-reduce across simulated hosts. scripts/bench_hosts.sh builds
# HOSTS network namespaces on a bridge, shapes each host's link to RATE with tc htb (FLOW_RATE:
# each TCP flow capped too), puts RANKS_PER_HOST ranks in each and runs distmesh (DISTMESH_ALGO
# unset, and =flat_ring) and Gloo; median of REPS launches per size. Needs root (skips with a
# reason otherwise). Writes build/bench-hosts/ (table.txt, results.csv, results.json, raw/).
#   make bench-hosts HOSTS=2 RANKS_PER_HOST=2 RATE=2gbit FLOW_RATE=500mbit SIZES="1M 16M 64M" REPS=3
# make passes variables given on its command line (or in the environment) to the script's
# environment; unset ones take the script's defaults (ITERS, WARMUP, IPERF=0 too).
GLOO_BENCH := $(BENCH_DIR)/gloo_bench

.PHONY: bench-hosts

# Not in EXTRA_BINS: libgloo-dev is installed only when a benchmark wants it.
$(GLOO_BENCH): bench/gloo_bench.cc
	@mkdir -p $(dir $@)
	$(CXX) -std=c++17 -O2 -Wall -Wextra -Werror $< -o $@ -lgloo -pthread

bench-hosts: deps
	@$(MAKE) --no-print-directory $(DM_BENCH)
	@bash scripts/deps.sh libgloo-dev iperf3 || echo "bench-hosts: could not install libgloo-dev / iperf3"
	@$(MAKE) --no-print-directory $(GLOO_BENCH) || echo "bench-hosts: gloo_bench not built: Gloo is left out"
	@bash scripts/bench_hosts.sh $(DM_BENCH) $(GLOO_BENCH); rc=$$?; [ $$rc -eq 77 ] && rc=0; exit $$rc
