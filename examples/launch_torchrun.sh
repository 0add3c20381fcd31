#!/usr/bin/env bash
# torchrun, static rendezvous on one host: torchrun's agent serves the store on --master_port and
# sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT for each rank.
#   examples/launch_torchrun.sh [program]     NPROC=4 MASTER_PORT=29500 TORCHRUN=torchrun
# The program defaults to build/plain/examples/tcp_all_reduce (`make`); --no_python runs it as is.
# TORCHRUN may be a command line, e.g. TORCHRUN="/usr/bin/python3 -m torch.distributed.run".
#
# --redirects 2 --tee 2: Debian 12's torchrun (torch 1.13 on Python 3.11) crashes before starting
# any rank with the defaults ("0"): torch 1.13 parses them by iterating its Std flag enum, which
# Python 3.11 no longer does for the zero member, so Std.from_str("0") is None and
# to_map(redirects) fails ("'NoneType' object has no attribute 'get'"). Any value other than 0
# and 3 works; 2 sends each rank's stderr to a log under --log_dir and tees it to the console
# (prefixed [defaultN]:), stdout is untouched. torch 2.x accepts the same flags.
set -u
prog=${1:-build/plain/examples/tcp_all_reduce}
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
# shellcheck disable=SC2086  # TORCHRUN may hold several words
${TORCHRUN:-torchrun} --nnodes 1 --nproc_per_node "${NPROC:-4}" \
    --master_addr 127.0.0.1 --master_port "${MASTER_PORT:-29500}" \
    --redirects 2 --tee 2 --log_dir "$logs" --no_python "$prog"
