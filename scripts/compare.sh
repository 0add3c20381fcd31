#!/usr/bin/env bash
# distmesh TCP against Gloo (ring_chunked, halving_doubling) and OpenMPI over TCP, all-reduce of
# float32 sums on local ranks, plus iperf3's loopback limit. Interleaved: each repetition runs
# every system in turn, so load from elsewhere hits them alike; each point is the median over
# REPS repetitions of the per-launch mean time. Writes bench/results/compare.md and .png.
#   scripts/compare.sh path/to/dm_bench      (REPS=5 RANKS="2 4" ITERS=10 WARMUP=2 by default)
set -euo pipefail
DM_BENCH=${1:?usage: compare.sh path/to/dm_bench}
REPS=${REPS:-5}; RANKS=${RANKS:-"2 4"}; ITERS=${ITERS:-10}; WARMUP=${WARMUP:-2}
SIZES=${SIZES:-"8 4096 65536 1048576 16777216 67108864"}
OUT=${OUT:-bench/results}
cd "$(dirname "$0")/.."
bash scripts/deps.sh libgloo-dev openmpi-bin libopenmpi-dev iperf3 gnuplot-nox python3 g++
mkdir -p "$OUT" build/compare
g++ -std=c++17 -O2 -Wall -Wextra bench/gloo_bench.cc -o build/compare/gloo_bench -lgloo -pthread
mpicc -O2 -Wall -Wextra bench/mpi_bench.c -o build/compare/mpi_bench
RAW=build/compare/raw.txt; : > "$RAW"
csv=$(echo $SIZES | tr ' ' ',')
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca pml ob1 --mca btl tcp,self --bind-to none)

run_gloo() {  # algo ranks
    local dir; dir=$(mktemp -d)
    for r in $(seq 0 $(($2 - 1))); do
        timeout 300 build/compare/gloo_bench "$1" "$r" "$2" "$dir" "$ITERS" "$WARMUP" $SIZES &
    done
    wait; rm -rf "$dir"
}
for rep in $(seq 1 "$REPS"); do
    for n in $RANKS; do
        echo "compare: repetition $rep/$REPS, $n ranks" >&2
        timeout 300 "$DM_BENCH" -np "$n" -S "$csv" -n "$ITERS" -w "$WARMUP" -c 0 -I -t 280 -J build/compare/dm.json >/dev/null
        python3 - "$n" >> "$RAW" <<'PY'
import json, sys
d = json.load(open("build/compare/dm.json"))
for row in d["rows"]:
    print(f"distmesh ranks={sys.argv[1]} bytes={row['bytes']} us={row['ip_us']}")
PY
        run_gloo ring_chunked "$n" >> "$RAW"
        run_gloo halving_doubling "$n" >> "$RAW"
        timeout 600 "${MPIRUN[@]}" -np "$n" build/compare/mpi_bench "$ITERS" "$WARMUP" $SIZES 2>/dev/null | grep '^mpi ' >> "$RAW"
    done
done

# iperf3 single stream on loopback (median of 3 short runs, GB/s).
IPERF=build/compare/iperf.txt; : > "$IPERF"
for i in 1 2 3; do
    iperf3 -s -1 -p 52011 >/dev/null 2>&1 &
    sleep 0.5
    iperf3 -c 127.0.0.1 -p 52011 -t 3 -J 2>/dev/null | python3 -c \
        'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e9)' >> "$IPERF" || true
    wait
done

python3 scripts/compare_report.py "$RAW" "$IPERF" "$OUT" "$REPS" distmesh gloo_ring_chunked gloo_halving_doubling mpi
nblocks=$(( $(echo $RANKS | wc -w) * 4 ))  # systems x rank counts in plot.dat
gnuplot <<GP
set terminal png noenhanced size 1000,600
set output "$OUT/compare.png"
set title "all-reduce float32 sum on local ranks over loopback TCP (median of $REPS)"
set logscale x 2
set format x "%.0b %BB"
set xlabel "message size (bytes)"
set ylabel "bus bandwidth (GB/s)"
set key left top
set grid
plot for [i=0:$((nblocks - 1))] "build/compare/compare.dat" index i using 1:2 with linespoints title columnheader(1)
GP
echo "compare: wrote $OUT/compare.md and $OUT/compare.png"
