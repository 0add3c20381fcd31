#!/usr/bin/env bash
# srun (Slurm), inside an allocation or as its own job: nothing else to set. On one node the ranks
# meet in a private file store named after the job and step; over several nodes (srun -N 2 -n 8)
# the store runs on the first node of the step, port 15000 + a job-derived offset (MASTER_PORT
# overrides it).
#   examples/launch_srun.sh [program]        NPROC=4 (extra srun flags in SRUN_ARGS, e.g. "-N 2")
set -u
prog=${1:-build/plain/examples/tcp_all_reduce}
# shellcheck disable=SC2086  # SRUN_ARGS may hold several words
exec srun ${SRUN_ARGS:-} -n "${NPROC:-4}" "$prog"
