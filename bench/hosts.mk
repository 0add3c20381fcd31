# `make bench-hosts` (issue 17): all-reduce (or COLL=) across simulated hosts. scripts/bench_hosts.sh builds
# HOSTS network namespaces on a bridge, shapes each host's link to RATE with tc htb (FLOW_RATE:
# each TCP flow capped too), puts RANKS_PER_HOST ranks in each and runs distmesh (DISTMESH_ALGO
# unset, and =flat_ring) and Gloo; median of REPS launches per size. Needs root (skips with a
# reason otherwise). Writes build/bench-hosts/ (table.txt, results.csv, results.json, raw/).
#   make bench-hosts HOSTS=2 RANKS_PER_HOST=2 RATE=2gbit FLOW_RATE=500mbit SIZES="1M 16M 64M" REPS=3
# make passes variables given on its command line (or in the environment) to the script's
# environment; unset ones take the script's defaults (ITERS, WARMUP, IPERF=0 too).
# DELAY=<ms> (one way per host link) puts bench/delay_line (a TUN delay line in a router namespace)
# between the hosts, checked by a round trip and one TCP flow before the runs:
#   make bench-hosts HOSTS=2 RANKS_PER_HOST=2 RATE=1gbit DELAY=25 SIZES="8 64M" REPS=3 COMPRESS=
# DM_ENV="DISTMESH_SOCKETS_PER_PEER=2" passes variables to the distmesh ranks. ENCRYPT=1 adds
# distmesh_enc (DISTMESH_ENCRYPT=1) beside the plain systems, with enc/auto and the crypto bound in
# the report; RATE=none leaves the links unshaped:
#   make bench-hosts HOSTS=2 RANKS_PER_HOST=1 RATE=none ENCRYPT=1 SIZES="1M 64M" REPS=5 COMPRESS= IPERF=0
# SITES=<n> splits the hosts into n sites (a router namespace each, joined through a core router
# by one link per site shaped to SITE_RATE, default 200mbit; SITE_DELAY=<ms> delays it) and runs
# distmesh_auto with DISTMESH_SITE=site<s> against distmesh_2level (without it); DELAY then needs
# 2 or more hosts per site:
#   make bench-hosts HOSTS=4 SITES=2 RANKS_PER_HOST=2 RATE=2gbit SITE_RATE=200mbit SIZES=16M REPS=3 COMPRESS=
# COLL=all_gather | reduce_scatter | barrier times that collective instead of all_reduce (Gloo:
# AllgatherRing for all_gather, BarrierAllToAll for the barrier, left out for reduce_scatter):
#   make bench-hosts COLL=all_gather HOSTS=4 SITES=2 RANKS_PER_HOST=2 SIZES="1M 16M" REPS=3 COMPRESS=
GLOO_BENCH := $(BENCH_DIR)/gloo_bench
DELAY_LINE := $(BENCH_DIR)/delay_line

.PHONY: bench-hosts

# Not in EXTRA_BINS: libgloo-dev is installed only when a benchmark wants it.
$(GLOO_BENCH): bench/gloo_bench.cc
	@mkdir -p $(dir $@)
	$(CXX) -std=c++17 -O2 -Wall -Wextra -Werror $< -o $@ -lgloo -pthread

$(DELAY_LINE): bench/delay_line.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -Wall -Wextra -Wpedantic -Werror $< -o $@

bench-hosts: deps
	@$(MAKE) --no-print-directory $(DM_BENCH) $(DELAY_LINE)
	@bash scripts/deps.sh libgloo-dev iperf3 || echo "bench-hosts: could not install libgloo-dev / iperf3"
	@$(MAKE) --no-print-directory $(GLOO_BENCH) || echo "bench-hosts: gloo_bench not built: Gloo is left out"
	@bash scripts/bench_hosts.sh $(DM_BENCH) $(GLOO_BENCH); rc=$$?; [ $$rc -eq 77 ] && rc=0; exit $$rc
