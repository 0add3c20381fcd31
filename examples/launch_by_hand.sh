#!/usr/bin/env bash
# By hand: start every rank yourself with torchrun's variables; rank 0 hosts the store at
# MASTER_ADDR:MASTER_PORT (over several hosts: rank 0's address, the same on every rank).
#   examples/launch_by_hand.sh [program]     NPROC=4 MASTER_PORT=29500
# Exits 0 when every rank did.
set -u
prog=${1:-build/plain/examples/tcp_all_reduce}
n=${NPROC:-4}
pids=()
for r in $(seq 0 $((n - 1))); do
    RANK=$r WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=${MASTER_PORT:-29500} "$prog" &
    pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
exit $rc
