#!/usr/bin/env bash
# The 8-rank comparison on a many-core machine (the GPU machine: 16 cores, no network, no Gloo
# package): distmesh TCP vs torch.distributed's Gloo process group vs OpenMPI over TCP, all-reduce
# of float32 sums on local ranks, interleaved, median of REPS. Writes bench/results/compare-h100.md.
#   scripts/compare_h100.sh path/to/dm_bench     (libuv found through LD_LIBRARY_PATH)
set -euo pipefail
DM_BENCH=${1:?usage: compare_h100.sh path/to/dm_bench}
REPS=${REPS:-3}; N=${N:-8}; ITERS=${ITERS:-10}; WARMUP=${WARMUP:-2}
SIZES=${SIZES:-"8 4096 65536 1048576 16777216 67108864"}
PY=${PY:-python3}
cd "$(dirname "$0")/.."
mkdir -p build/compare bench/results
mpicc -O2 -Wall -Wextra bench/mpi_bench.c -o build/compare/mpi_bench
RAW=build/compare/raw-h100.txt; : > "$RAW"
csv=$(echo $SIZES | tr ' ' ',')
for rep in $(seq 1 "$REPS"); do
    echo "compare_h100: repetition $rep/$REPS" >&2
    timeout 300 "$DM_BENCH" --np "$N" --sizes "$csv" -n "$ITERS" -w "$WARMUP" -c 0 -a 3 --inplace-only \
        --timeout 280 --json build/compare/dm.json >/dev/null
    $PY - "$N" >> "$RAW" <<'PY'
import json, sys
for row in json.load(open("build/compare/dm.json"))["rows"]:
    print(f"distmesh ranks={sys.argv[1]} bytes={row['bytes']} us={row['ip_us']}")
PY
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$((29600 + rep)) timeout 300 $PY -m torch.distributed.run --nproc-per-node "$N" \
        --master-addr 127.0.0.1 --master-port $((29600 + rep)) bench/torch_gloo_bench.py "$ITERS" "$WARMUP" $SIZES 2>/dev/null | grep '^torch_gloo' >> "$RAW"
    timeout 300 mpirun --allow-run-as-root --oversubscribe --mca pml ob1 --mca btl tcp,self --bind-to none -np "$N" \
        build/compare/mpi_bench "$ITERS" "$WARMUP" $SIZES 2>/dev/null | grep '^mpi ' >> "$RAW"
done
$PY scripts/compare_report.py "$RAW" /nonexistent bench/results "$REPS" distmesh torch_gloo mpi --name compare-h100 \
    --title "distmesh vs torch.distributed Gloo vs OpenMPI: all-reduce float32 sum, $N local ranks (loopback TCP)"
