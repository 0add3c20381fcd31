#!/usr/bin/env bash
# Launch to launch (issue 28, item 2): is every launch as fast as the best one? The harness of
# `make parity` (bench/parity_bench.c, built for distmesh and for OpenMPI, both under mpirun),
# one size per launch, LAUNCHES launches per size and rank count, distmesh and OpenMPI's
# shared-memory path (--mca btl vader,self) alternated launch by launch, so a slow spell of the
# machine hits both alike. Each launch gives the slowest rank's median per call ("med": a
# barrier, then one call) and its mean back to back ("b2b"); the table shows, per size and
# system, the distribution over launches of each: min, median, max and max / median, and the
# ratio of distmesh's median launch to OpenMPI's.
#   scripts/launches.sh path/to/parity_bench_dm path/to/parity_bench_mpi
# Environment: LAUNCHES (20), RANKS ("2 4"), SIZES (8 B .. 64 MiB), BIND (none: mpirun
# --bind-to none for both, as make parity; core: both bound one rank per core, mpirun's own
# default for np <= 2), DM_EXTRA="name=path ..." (more distmesh builds, each alternated too),
# OUT (build/launches: raw.txt, table.md). Exit status 3 when a target of issue 28 is not met on
# 2 ranks (distmesh: the slowest launch within 1.3x of the median, the median at most OpenMPI's).
set -euo pipefail
DM=${1:?usage: launches.sh parity_bench_dm parity_bench_mpi}
MPI=${2:?usage: launches.sh parity_bench_dm parity_bench_mpi}
LAUNCHES=${LAUNCHES:-20}; RANKS=${RANKS:-"2 4"}; BIND=${BIND:-none}
SIZES=${SIZES:-"8 1024 4096 16384 65536 1048576 16777216 67108864"}
DM_EXTRA=${DM_EXTRA:-}
OUT=${OUT:-build/launches}
mkdir -p "$OUT"
RAW=$OUT/raw.txt; : > "$RAW"; : > "$OUT/stderr.txt"
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca pml ob1 --bind-to "$BIND")

launch() {  # name ranks bytes binary [btl]
    local env=(env DISTMESH_TRANSPORT=auto)
    local mca=()
    [ $# -ge 5 ] && mca=(--mca btl "$5")
    "${env[@]}" timeout 300 "${MPIRUN[@]}" "${mca[@]}" -np "$2" "$4" "$1" "$3" 2>>"$OUT/stderr.txt" \
        | sed "s/^/launch=$k /" >> "$RAW" || echo "launches: $1 np=$2 bytes=$3 launch $k failed" >&2
}
for k in $(seq 1 "$LAUNCHES"); do
    echo "launches: $k/$LAUNCHES" >&2
    for n in $RANKS; do
        for s in $SIZES; do
            launch dm "$n" "$s" "$DM"
            for e in $DM_EXTRA; do launch "${e%%=*}" "$n" "$s" "${e#*=}"; done
            launch mpi "$n" "$s" "$MPI" vader,self
        done
    done
done

set +e
python3 - "$RAW" "$BIND" > "$OUT/table.md" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(lambda: {"med": [], "b2b": []})
for line in open(sys.argv[1]):
    w = line.split()
    f = dict(kv.split("=") for kv in w[2:])
    key = (int(f["ranks"]), int(f["bytes"]), w[1])
    runs[key]["med"].append(float(f["med_us"]))
    runs[key]["b2b"].append(float(f["b2b_us"]))
def dist(v):
    m = statistics.median(v)
    return "%.2f | %.2f | %.2f | %.2f" % (min(v), m, max(v), max(v) / m)
names = sorted({k[2] for k in runs}, key=lambda n: (n == "mpi", n))
for n in sorted({k[0] for k in runs}):
    for shape in ("med", "b2b"):
        print(f"\n### {n} ranks, shared memory, {shape} (us per call; launches alternated, mpirun --bind-to {sys.argv[2]})\n")
        print("| bytes | system | launches | min | median | max | max/median | median / mpi's |")
        print("|---:|---|---:|---:|---:|---:|---:|---:|")
        for b in sorted({k[1] for k in runs if k[0] == n}):
            ref = runs.get((n, b, "mpi"), {}).get(shape)
            for name in names:
                v = runs.get((n, b, name), {}).get(shape)
                if not v: continue
                ratio = "%.2f" % (statistics.median(v) / statistics.median(ref)) if ref and name != "mpi" else "-"
                print(f"| {b} | {name} | {len(v)} | {dist(v)} | {ratio} |")
# issue 28's targets on 2 ranks, for distmesh's own build (dm): the slowest launch within 1.3x of
# the median launch, the median launch at most OpenMPI's
bad = []
for (n, b, name), v in sorted(runs.items()):
    if n != 2 or name != "dm": continue
    for shape in ("med", "b2b"):
        m = statistics.median(v[shape])
        ref = runs.get((n, b, "mpi"), {}).get(shape)
        if max(v[shape]) > 1.3 * m:
            bad.append(f"{b} B {shape}: slowest launch {max(v[shape]):.2f} us > 1.3 x median {m:.2f}")
        if ref and m > statistics.median(ref):
            bad.append(f"{b} B {shape}: median {m:.2f} us > OpenMPI's {statistics.median(ref):.2f}")
print()
print("targets (2 ranks: slowest <= 1.3 x median, median <= OpenMPI's): " + ("met" if not bad else "NOT met"))
for line in bad: print("  " + line)
sys.exit(3 if bad else 0)
PY
rc=$?
cat "$OUT/table.md"
exit $rc
