#!/usr/bin/env bash
# A private single-node Slurm for one command: its own munge key and socket, slurm.conf, spool
# and ports under DIR; slurmctld and slurmd on 127.0.0.1, this host as the one node. Runs
# COMMAND with SLURM_CONF pointing there, then stops the three daemons it started (by their pid
# files) and returns COMMAND's status. Exit 77: cannot run here (not root, or slurm-wlm / munge
# missing). Needs root: slurmd starts the tasks.
#   tests/slurm_single_node.sh DIR CTLD_PORT SLURMD_PORT COMMAND [ARGS...]
set -u
dir=$1; ctld_port=$2; d_port=$3; shift 3
if [ "$(id -u)" -ne 0 ]; then echo "slurm: needs root (slurmd)"; exit 77; fi
for b in munged slurmctld slurmd srun sinfo; do
    command -v "$b" >/dev/null 2>&1 || [ -x "/usr/sbin/$b" ] || { echo "slurm: $b missing (slurm-wlm, munge)"; exit 77; }
done
PATH=$PATH:/usr/sbin
host=$(hostname -s)
mkdir -p "$dir/munge" "$dir/ctld" "$dir/d" || exit 1
chmod 700 "$dir/munge"

stop() {
    local f p i
    for f in "$dir/d.pid" "$dir/ctld.pid" "$dir/munge/pid"; do
        p=$(cat "$f" 2>/dev/null) || continue
        kill "$p" 2>/dev/null || continue
        for i in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$p" 2>/dev/null
    done
}
trap stop EXIT

head -c 128 /dev/urandom > "$dir/munge/key" && chmod 600 "$dir/munge/key" || exit 1
munged --key-file="$dir/munge/key" --socket="$dir/munge/sock" --pid-file="$dir/munge/pid" \
    --log-file="$dir/munge/log" --seed-file="$dir/munge/seed" --force || { echo "slurm: munged failed"; exit 1; }
cat > "$dir/slurm.conf" <<EOF
ClusterName=distmesh
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/sock
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/d
SlurmctldPidFile=$dir/ctld.pid
SlurmdPidFile=$dir/d.pid
SlurmctldLogFile=$dir/ctld.log
SlurmdLogFile=$dir/d.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
NodeName=$host NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=10 State=UP OverSubscribe=YES
EOF
export SLURM_CONF=$dir/slurm.conf
slurmctld -f "$SLURM_CONF" -i || { echo "slurm: slurmctld failed"; cat "$dir/ctld.log"; exit 1; }
slurmd -f "$SLURM_CONF" || { echo "slurm: slurmd failed"; cat "$dir/d.log"; exit 1; }
for i in $(seq 100); do
    [ "$(sinfo -h -o %t 2>/dev/null)" = idle ] && break
    [ "$i" -eq 100 ] && { echo "slurm: node not idle after 20 s"; sinfo; tail -20 "$dir/ctld.log" "$dir/d.log"; exit 1; }
    sleep 0.2
done
"$@"
rc=$?
stop
trap - EXIT
exit $rc
