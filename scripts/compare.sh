#!/usr/bin/env bash
# distmesh against its peers on one host: all-reduce of float32 sums in place on local ranks.
#   distmesh        DISTMESH_TRANSPORT=auto (shared memory between the ranks)
#   distmesh_tcp    DISTMESH_TRANSPORT=tcp (loopback sockets)
#   mpi_shm         OpenMPI, --mca btl vader,self (its shared-memory path)
#   mpi_tcp         OpenMPI, --mca btl tcp,self
#   gloo_ring_chunked, gloo_halving_doubling   Gloo over loopback TCP
# plus the single-core memcpy bandwidth and iperf3's loopback limit, measured in the same run.
# Interleaved: each repetition runs every system in turn, so load from elsewhere hits them
# alike; each point is the median over REPS repetitions of the per-launch mean time. Writes
# $OUT/compare.md, compare.png (busbw) and compare-latency.png (time, log-log), all under build/.
#   scripts/compare.sh path/to/dm_bench      (REPS=5 RANKS="2 4" ITERS=10 WARMUP=2 by default)
set -euo pipefail
DM_BENCH=${1:?usage: compare.sh path/to/dm_bench}
REPS=${REPS:-5}; RANKS=${RANKS:-"2 4"}; ITERS=${ITERS:-10}; WARMUP=${WARMUP:-2}
SIZES=${SIZES:-"8 4096 65536 1048576 16777216 67108864"}
OUT=${OUT:-build/compare/results}
cd "$(dirname "$0")/.."
bash scripts/deps.sh libgloo-dev openmpi-bin libopenmpi-dev iperf3 gnuplot-nox python3 g++
mkdir -p "$OUT" build/compare
g++ -std=c++17 -O2 -Wall -Wextra bench/gloo_bench.cc -o build/compare/gloo_bench -lgloo -pthread
mpicc -O2 -Wall -Wextra bench/mpi_bench.c -o build/compare/mpi_bench
cc -std=c11 -O2 -Wall -Wextra bench/memcpy_bw.c -o build/compare/memcpy_bw
RAW=build/compare/raw.txt; : > "$RAW"
csv=$(echo $SIZES | tr ' ' ',')
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca pml ob1 --bind-to none)

run_dm() {  # name transport ranks
    DISTMESH_TRANSPORT=$2 timeout 300 "$DM_BENCH" --np "$3" --sizes "$csv" -n "$ITERS" -w "$WARMUP" -c 0 -a 3 \
        --inplace-only --timeout 280 --json build/compare/dm.json >/dev/null
    python3 - "$1" "$3" <<'PY'
import json, sys
d = json.load(open("build/compare/dm.json"))
for row in d["rows"]:
    print(f"{sys.argv[1]} ranks={sys.argv[2]} bytes={row['bytes']} us={row['ip_us']}")
PY
}
run_gloo() {  # algo ranks
    local dir; dir=$(mktemp -d)
    for r in $(seq 0 $(($2 - 1))); do
        timeout 300 build/compare/gloo_bench "$1" "$r" "$2" "$dir" "$ITERS" "$WARMUP" $SIZES &
    done
    wait; rm -rf "$dir"
}
run_mpi() {  # name btl ranks
    MPI_BENCH_NAME=$1 timeout 600 "${MPIRUN[@]}" --mca btl "$2" -np "$3" build/compare/mpi_bench "$ITERS" "$WARMUP" \
        $SIZES 2>/dev/null | grep "^$1 "
}
MEMCPY=build/compare/memcpy.txt; : > "$MEMCPY"
for rep in $(seq 1 "$REPS"); do
    build/compare/memcpy_bw >> "$MEMCPY"
    for n in $RANKS; do
        echo "compare: repetition $rep/$REPS, $n ranks" >&2
        run_dm distmesh auto "$n" >> "$RAW"
        run_dm distmesh_tcp tcp "$n" >> "$RAW"
        run_mpi mpi_shm vader,self "$n" >> "$RAW"
        run_mpi mpi_tcp tcp,self "$n" >> "$RAW"
        run_gloo ring_chunked "$n" >> "$RAW"
        run_gloo halving_doubling "$n" >> "$RAW"
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

SYSTEMS="distmesh distmesh_tcp mpi_shm mpi_tcp gloo_ring_chunked gloo_halving_doubling"
python3 scripts/compare_report.py "$RAW" "$IPERF" "$OUT" "$REPS" $SYSTEMS --memcpy "$MEMCPY"
nblocks=$(( $(echo $RANKS | wc -w) * $(echo $SYSTEMS | wc -w) ))  # blocks in compare.dat
for plot in busbw latency; do
    if [ $plot = busbw ]; then col=2; ylab="bus bandwidth (GB/s)"; ylog=""; png=compare.png
    else col=3; ylab="time per all-reduce (us)"; ylog="set logscale y 10"; png=compare-latency.png; fi
    gnuplot <<GP
set terminal png noenhanced size 1000,600
set output "$OUT/$png"
set title "all-reduce float32 sum in place on local ranks (median of $REPS): $plot"
set logscale x 2
$ylog
set format x "%.0b %BB"
set xlabel "message size (bytes)"
set ylabel "$ylab"
set key left top
set grid
plot for [i=0:$((nblocks - 1))] "build/compare/compare.dat" index i using 1:$col with linespoints title columnheader(1)
GP
done
echo "compare: wrote $OUT/compare.md, $OUT/compare.png and $OUT/compare-latency.png"
