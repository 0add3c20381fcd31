#!/usr/bin/env bash
# Scale on simulated hosts: for each rank count, dm_bench forks the ranks on this machine, in
# HOSTS contiguous blocks that each share a simulated host identity (DISTMESH_TEST_HOST_ID),
# and reports the setup (launch to last create, slowest create call, open fds per rank and at
# rank 0) and the 8 B and 64 KiB float32 sum all_reduce (per-call time of the slowest rank, -a 3)
# with the algorithm chosen. The ranks get a launcher's variables (RANK, WORLD_SIZE, LOCAL_RANK,
# LOCAL_WORLD_SIZE, as torchrun sets them) and meet, as dm_init's do, through a TCP store that
# rank 0 hosts (STORE=file: a file store instead). Writes $OUT/scale.md and one log per run. Not
# part of CI.
#   scripts/scale.sh path/to/dm_bench   (RANKS="16 32 64 128 256" HOSTS=8 ITERS=20 STORE=rank0
#                                        OUT=build/scale)
set -u
DM_BENCH=${1:?usage: scale.sh path/to/dm_bench}
RANKS=${RANKS:-16 32 64 128 256}
HOSTS=${HOSTS:-8}
ITERS=${ITERS:-20}
STORE=${STORE:-rank0}
OUT=${OUT:-build/scale}
mkdir -p "$OUT"
table="$OUT/scale.md"
{
    echo "| ranks | hosts | launch to last create (s) | slowest create call (s) | fds per rank (max) | fds at rank 0 | 8 B (us) | 64 KiB (us) | algorithm (8 B / 64 KiB) |"
    echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
} > "$table"
for n in $RANKS; do
    h=$HOSTS
    [ "$h" -gt "$n" ] && h=$n
    log="$OUT/np$n.log"
    timeout -k 10 600 "$DM_BENCH" --np "$n" --hosts "$h" --store "$STORE" --launcher-env --setup -S 8,64K \
        -n "$ITERS" -w 3 -a 3 -c 1 --timeout 540 > "$log" 2>&1
    rc=$?
    setup=$(grep '^# Setup:' "$log" | head -1)
    if [ $rc -ne 0 ] || [ -z "$setup" ]; then
        why=$(grep -v '^#' "$log" | grep -m1 -E 'rank [0-9]+:' | cut -c1-160)
        echo "| $n | $h | failed (exit $rc): ${why:-see $log} | | | | | | |" >> "$table"
        continue
    fi
    launch=$(sed -E 's/.*launch to last create ([0-9.]+) s.*/\1/' <<< "$setup")
    call=$(sed -E 's/.*slowest create call ([0-9.]+) s.*/\1/' <<< "$setup")
    fds=$(sed -E 's/.*fds per rank max ([0-9]+).*/\1/' <<< "$setup")
    fds0=$(sed -E 's/.*, rank 0 ([0-9]+).*/\1/' <<< "$setup")
    row8=$(awk '!/^#/ && $1 == 8 {print $10, $14}' "$log")
    row64=$(awk '!/^#/ && $1 == 65536 {print $10, $14}' "$log")
    echo "| $n | $h | $launch | $call | $fds | $fds0 | ${row8%% *} | ${row64%% *} | ${row8##* } / ${row64##* } |" >> "$table"
done
cat "$table"
