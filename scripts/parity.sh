#!/usr/bin/env bash
# distmesh against OpenMPI, like for like (issue 17, item 4): one harness (bench/parity_bench.c)
# built twice, both launched by mpirun, float32 sum in place, 8 B .. 64 MiB:
#   dm_tcp    distmesh, DISTMESH_TRANSPORT=tcp (loopback sockets)
#   mpi_tcp   OpenMPI, --mca btl tcp,self
#   dm_shm    distmesh, DISTMESH_TRANSPORT=auto (shared memory)
#   mpi_shm   OpenMPI, --mca btl vader,self
# Two shapes per size (see parity_bench.c): med (a barrier, then one call; the slowest rank's
# median per call) and b2b (calls back to back; the slowest rank's mean). Interleaved: each
# repetition runs every system in turn; the table shows the median over REPS repetitions and
# distmesh / OpenMPI per shape. Extra distmesh builds for A/B runs: DM_EXTRA="name=path ..."
# (each runs over tcp as name_tcp and, with shm in KINDS, over shared memory as name_shm).
#   scripts/parity.sh path/to/parity_bench_dm path/to/parity_bench_mpi
#   (REPS=3 RANKS="2 4" KINDS="tcp shm" SIZES="8 ... 67108864" by default; writes under build/parity)
set -euo pipefail
DM=${1:?usage: parity.sh parity_bench_dm parity_bench_mpi}
MPI=${2:?usage: parity.sh parity_bench_dm parity_bench_mpi}
REPS=${REPS:-3}; RANKS=${RANKS:-"2 4"}; KINDS=${KINDS:-"tcp shm"}
SIZES=${SIZES:-"8 64 1024 4096 65536 262144 1048576 4194304 16777216 67108864"}
DM_EXTRA=${DM_EXTRA:-}
OUT=${OUT:-build/parity}
mkdir -p "$OUT"
RAW=$OUT/raw.txt; : > "$RAW"
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca pml ob1 --bind-to none)

run_dm() {  # name transport ranks binary
    DISTMESH_TRANSPORT=$2 timeout 600 "${MPIRUN[@]}" -np "$3" "$4" "$1" $SIZES 2>>"$OUT/stderr.txt" \
        | sed "s/^/rep=$rep /" >> "$RAW"
}
run_mpi() {  # name btl ranks
    timeout 600 "${MPIRUN[@]}" --mca btl "$2" -np "$3" "$MPI" "$1" $SIZES 2>>"$OUT/stderr.txt" \
        | sed "s/^/rep=$rep /" >> "$RAW"
}
for rep in $(seq 1 "$REPS"); do
    for n in $RANKS; do
        echo "parity: repetition $rep/$REPS, $n ranks" >&2
        for kind in $KINDS; do
            dmt=$([ "$kind" = tcp ] && echo tcp || echo auto)
            btl=$([ "$kind" = tcp ] && echo tcp,self || echo vader,self)
            run_dm "dm_$kind" "$dmt" "$n" "$DM"
            for e in $DM_EXTRA; do run_dm "${e%%=*}_$kind" "$dmt" "$n" "${e#*=}"; done
            run_mpi "mpi_$kind" "$btl" "$n"
        done
    done
done

python3 - "$RAW" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = dict(kv.split("=") for kv in line.split()[2:])
    rows[(line.split()[1], int(f["ranks"]), int(f["bytes"]))].append((float(f["med_us"]), float(f["b2b_us"])))
med = {k: (statistics.median(a for a, _ in v), statistics.median(b for _, b in v), len(v)) for k, v in rows.items()}
names = sorted({k[0] for k in med})
for kind in ("tcp", "shm"):
    ref = "mpi_" + kind
    mine = [n for n in names if n.endswith("_" + kind) and n != ref]
    for n in sorted({k[1] for k in med}):
        sizes = sorted({k[2] for k in med if k[1] == n and k[0] == ref})
        if not sizes: continue
        print(f"\n### {kind}, {n} ranks (us; median of runs; ratio = distmesh / OpenMPI)\n")
        head = "| bytes | " + " | ".join(f"{m} med | {m} b2b" for m in [ref] + mine)
        head += "".join(f" | {m}/mpi med | {m}/mpi b2b" for m in mine)
        print(head + " |")
        print("|" + "---|" * (1 + 2 * (1 + len(mine)) + 2 * len(mine)))
        for s in sizes:
            r = med[(ref, n, s)]
            cells = [f"{r[0]:.2f} | {r[1]:.2f}"]
            ratios = []
            for m in mine:
                v = med.get((m, n, s))
                cells.append(f"{v[0]:.2f} | {v[1]:.2f}" if v else "- | -")
                ratios.append(f"{v[0] / r[0]:.2f} | {v[1] / r[1]:.2f}" if v else "- | -")
            print(f"| {s} | " + " | ".join(cells + ratios) + " |")
PY
