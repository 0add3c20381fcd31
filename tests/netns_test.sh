#!/usr/bin/env bash
# Multi-host test of the TCP backend: 3 network namespaces joined by veth pairs to a bridge that
# lives in a 4th namespace, addresses 10.77.0.1-3/24 existing only inside them,
# DISTMESH_SOCKET_IFNAME selecting the veth, DISTMESH_TOKEN set. Ranks meet through a file store
# in a temporary directory (namespaces share the file system) and run the whole collective suite:
#   1. one rank per namespace (3 ranks);
#   2. 2 namespaces x 2 ranks, the ranks of a namespace sharing DISTMESH_TEST_HOST_ID (a simulated
#      host: shared memory inside it, sockets between them; each rank checks it got "shm+tcp"
#      and a local size of 2), so the schedules that know hosts run across real sockets.
# Usage: netns_test.sh <path to test_tcp_rendezvous>. Exit 0 ok, 77 skipped (reason printed), else failed.
# Everything it creates is removed on every exit path.
set -u
bin=${1:?usage: netns_test.sh path/to/test_tcp_rendezvous}
skip() { echo "netns: skipped: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "not root"
command -v ip >/dev/null 2>&1 || skip "no ip command"
ip netns list >/dev/null 2>&1 || skip "ip netns unavailable"

tag=dm$$
br=${tag}br
ns=("${tag}a" "${tag}b" "${tag}c")
dir=$(mktemp -d /tmp/dm_netns_XXXXXX)
pids=()
cleanup() {  # pids are timeout's: SIGTERM reaches the rank through it; SIGKILL after 1 s
    for p in "${pids[@]+"${pids[@]}"}"; do kill -TERM "$p" 2>/dev/null; done
    [ ${#pids[@]} -eq 0 ] || sleep 1
    for p in "${pids[@]+"${pids[@]}"}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    for n in "${ns[@]}" "$br"; do ip netns del "$n" 2>/dev/null; done
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

ip netns add "$br" 2>/dev/null || skip "cannot create a network namespace"
ip -n "$br" link add br0 type bridge || skip "no bridge support"
ip -n "$br" link set br0 up
for i in 0 1 2; do
    n=${ns[$i]}
    ip netns add "$n" || exit 1
    ip -n "$br" link add "p$i" type veth peer name dmeth0 netns "$n" || skip "no veth support"
    ip -n "$br" link set "p$i" master br0 up
    ip -n "$n" link set lo up
    ip -n "$n" addr add "10.77.0.$((i + 1))/24" dev dmeth0
    ip -n "$n" link set dmeth0 up
done
# the addresses exist only inside the namespaces
if ip -o addr show | grep -q '10\.77\.0\.'; then echo "netns: 10.77.0.x leaked into the root namespace"; exit 1; fi
for i in 1 2 3; do ip netns exec "${ns[0]}" ping -c1 -W2 "10.77.0.$i" >/dev/null 2>&1 || true; done

# one rank: rank world local_rank local_world namespace store [extra env...]
start_rank() {
    local r=$1 w=$2 lr=$3 lw=$4 n=$5 store=$6
    shift 6
    ip netns exec "$n" env RANK=$r WORLD_SIZE=$w LOCAL_RANK=$lr LOCAL_WORLD_SIZE=$lw \
        MASTER_ADDR=10.77.0.1 MASTER_PORT=29500 DISTMESH_STORE="file://$store" \
        DISTMESH_SOCKET_IFNAME=dmeth DISTMESH_TIMEOUT=30 DISTMESH_TOKEN=netns-secret "$@" \
        timeout -k 5 90 "$bin" --rank &
    pids+=($!)
}
wait_ranks() {  # what ran, for the message
    local fail=0 p
    for p in "${pids[@]}"; do wait "$p" || fail=1; done
    pids=()
    if [ $fail -ne 0 ]; then echo "netns: $1: FAILED"; exit 1; fi
    echo "netns: $1: all collectives correct"
}

mkdir "$dir/one" "$dir/hosts" || exit 1
for i in 0 1 2; do start_rank $i 3 0 1 "${ns[$i]}" "$dir/one" DISTMESH_TRANSPORT=tcp; done
wait_ranks "3 ranks in 3 namespaces"

for r in 0 1 2 3; do
    h=$((r / 2))
    start_rank $r 4 $((r % 2)) 2 "${ns[$h]}" "$dir/hosts" DISTMESH_TEST_HOST_ID="netns-host$h" \
        DISTMESH_ALGO=two_level DM_TEST_EXPECT_TRANSPORT=shm+tcp DM_TEST_EXPECT_LOCAL_SIZE=2
done
wait_ranks "2 namespaces x 2 ranks (simulated hosts, shm+tcp, two-level schedules, token)"
