#!/usr/bin/env bash
# mpirun (OpenMPI), one host: nothing else to set. distmesh reads OpenMPI's rank and local-rank
# variables and meets in a private file store named after the job (dm_tcp_launch_detect).
#   examples/launch_mpirun.sh [program]      NPROC=4
# --oversubscribe: more ranks than cores is fine for this example. As root OpenMPI also wants
# --allow-run-as-root. Over several hosts name the store: -x MASTER_ADDR=<rank 0's host>
# -x MASTER_PORT=<free port>.
set -u
prog=${1:-build/plain/examples/tcp_all_reduce}
extra=()
[ "$(id -u)" -eq 0 ] && extra+=(--allow-run-as-root)
exec mpirun "${extra[@]}" --oversubscribe -np "${NPROC:-4}" "$prog"
