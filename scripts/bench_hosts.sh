#!/usr/bin/env bash
# All-reduce across simulated hosts (issue 17, `make bench-hosts`). HOSTS network namespaces, each a
# host with RANKS_PER_HOST ranks, joined by veth pairs to a bridge in a namespace of its own;
# addresses 10.78.0.1..HOSTS/24 exist only inside the namespaces. Each host's link is shaped to
# RATE with tc htb on both directions (egress of the host's veth: what it sends; egress of the
# bridge's port to it: what it receives). FLOW_RATE, when set, also caps every TCP flow: u32
# filters hash bits 1-8 of the source and of the destination port into 256 htb classes whose
# ceil is FLOW_RATE, under the host's class at RATE.
# Systems, interleaved in each repetition (so load from elsewhere hits them alike):
#   distmesh_auto   dm_bench with DISTMESH_ALGO unset (the library chooses)
#   distmesh_flat   dm_bench with DISTMESH_ALGO=flat_ring
#   distmesh_int8, distmesh_bf16   dm_bench --compress int8 / bf16 (dm_all_reduce_compressed, no
#                   error-feedback state), DISTMESH_ALGO unset; COMPRESS="int8 bf16" (the default)
#                   picks which, COMPRESS= none
#   gloo            bench/gloo_bench ring_chunked (Debian's libgloo), one process per rank
# float32 sum in place; every rank runs in its host's namespace with DISTMESH_TEST_HOST_ID=hostN,
# DISTMESH_SOCKET_IFNAME=dmeth0 and a file store in a temporary directory (Gloo: its FileStore
# there). Each point is the median over REPS launches of the slowest rank's mean time. The bytes
# each host sent in each launch (its dmeth0's tx_bytes counter before and after: every frame,
# headers included) go to raw/bytes.txt and the report.
#   scripts/bench_hosts.sh path/to/dm_bench [path/to/gloo_bench]
#   HOSTS=2 RANKS_PER_HOST=2 RATE=2gbit FLOW_RATE= SIZES="1M 16M 64M" REPS=3 ITERS=5 WARMUP=1
#   IPERF=1 (a 2 s iperf3 check of the shaping, when iperf3 is there) BURST=64k (htb burst and
#   cburst of every class: tc's default, about 1.2 KB at these rates, holds one TCP flow ~6%
#   below the rate) OUT=build/bench-hosts (under build/, relative to the repository's root)
# Writes $OUT/table.txt, $OUT/results.csv, $OUT/results.json and raw logs under $OUT/raw.
# Exit 0 ok, 77 skipped (reason printed), else failed. Everything it creates is removed on every
# exit path; every process runs under timeout.
set -u
DM_BENCH=$(realpath -e "${1:?usage: bench_hosts.sh path/to/dm_bench [path/to/gloo_bench]}") || exit 1
GLOO_BENCH=${2:+$(realpath -m "$2")}
cd "$(dirname "$0")/.." || exit 1
HOSTS=${HOSTS:-2}; RANKS_PER_HOST=${RANKS_PER_HOST:-2}; RATE=${RATE:-2gbit}; FLOW_RATE=${FLOW_RATE:-}
SIZES=${SIZES:-"1M 16M 64M"}; REPS=${REPS:-3}; ITERS=${ITERS:-5}; WARMUP=${WARMUP:-1}
IPERF=${IPERF:-1}; OUT=${OUT:-build/bench-hosts}; BURST=${BURST:-64k}; COMPRESS=${COMPRESS-int8 bf16}
LAUNCH_TIMEOUT=${LAUNCH_TIMEOUT:-300}

skip() { echo "bench-hosts: skipped: $*"; exit 77; }
die() { echo "bench-hosts: $*" >&2; exit 1; }
is_count() { [[ $1 =~ ^[1-9][0-9]*$ ]]; }
is_count "$HOSTS" && [ "$HOSTS" -ge 2 ] && [ "$HOSTS" -le 64 ] || die "HOSTS=$HOSTS: need 2..64"
is_count "$RANKS_PER_HOST" && [ "$RANKS_PER_HOST" -le 64 ] || die "RANKS_PER_HOST=$RANKS_PER_HOST: need 1..64"
is_count "$REPS" || die "REPS=$REPS: need a count >= 1"
is_count "$ITERS" || die "ITERS=$ITERS: need a count >= 1"
[[ $WARMUP =~ ^[0-9]+$ ]] || die "WARMUP=$WARMUP: need a count >= 0"
[[ $OUT =~ ^build/[A-Za-z0-9._/-]+$ && ! $OUT =~ \.\. ]] || die "OUT=$OUT: must be a folder under build/"
[[ $BURST =~ ^[0-9]+[kKmM]?b?$ ]] || die "BURST=$BURST: not a tc size (e.g. 64k)"
for m in $COMPRESS; do [[ $m == int8 || $m == bf16 ]] || die "COMPRESS=$COMPRESS: int8 and/or bf16"; done
[ -x "$DM_BENCH" ] || die "$DM_BENCH: not an executable"
command -v python3 >/dev/null 2>&1 || skip "no python3 (the report needs it)"
# tc rates: a number and bit, kbit, mbit or gbit (tc's own units; bits per second)
rate_bps() {
    local v=${1,,}
    [[ $v =~ ^([0-9]+(\.[0-9]+)?)(bit|kbit|mbit|gbit)$ ]] || return 1
    python3 -c "import sys; m={'bit':1,'kbit':1e3,'mbit':1e6,'gbit':1e9}; print(int(float(sys.argv[1])*m[sys.argv[2]]))" \
        "${BASH_REMATCH[1]}" "${BASH_REMATCH[3]}"
}
RATE_BPS=$(rate_bps "$RATE") || die "RATE=$RATE: not a tc rate (e.g. 2gbit, 500mbit)"
FLOW_BPS=0
if [ -n "$FLOW_RATE" ]; then FLOW_BPS=$(rate_bps "$FLOW_RATE") || die "FLOW_RATE=$FLOW_RATE: not a tc rate (e.g. 500mbit)"; fi
size_bytes() {  # 1M, 16M, 64K, 1G or bytes
    local v=$1
    [[ $v =~ ^([0-9]+)([KMG]?)i?B?$ ]] || return 1
    case ${BASH_REMATCH[2]} in K) echo $((BASH_REMATCH[1] << 10));; M) echo $((BASH_REMATCH[1] << 20));;
        G) echo $((BASH_REMATCH[1] << 30));; *) echo "${BASH_REMATCH[1]}";; esac
}
BYTES=()
for s in $SIZES; do b=$(size_bytes "$s") || die "SIZES: $s is not a size (bytes or K/M/G)"; BYTES+=("$b"); done
[ ${#BYTES[@]} -gt 0 ] || die "SIZES is empty"

[ "$(id -u)" = 0 ] || skip "not root (network namespaces and tc need root)"
command -v ip >/dev/null 2>&1 || skip "no ip command"
command -v tc >/dev/null 2>&1 || skip "no tc command"
ip netns list >/dev/null 2>&1 || skip "ip netns unavailable"

N=$((HOSTS * RANKS_PER_HOST))
tag=dmh$$
brns=${tag}br
hostns=(); for h in $(seq 0 $((HOSTS - 1))); do hostns+=("${tag}h$h"); done
tmp=$(mktemp -d /tmp/dm_bench_hosts_XXXXXX)
pids=()
# pids are timeout's (ip netns exec execs env, which execs timeout): SIGTERM, which timeout passes
# on to its command, then SIGKILL for whatever is left after 3 s.
running() { local st; st=$(ps -o stat= -p "$1" 2>/dev/null) && [[ $st != Z* ]]; }  # not a zombie
stop_all() {
    local p i left
    for p in "${pids[@]+"${pids[@]}"}"; do kill -TERM "$p" 2>/dev/null; done
    for i in $(seq 30); do
        left=0
        for p in "${pids[@]+"${pids[@]}"}"; do running "$p" && left=1; done
        [ $left -eq 0 ] && break
        sleep 0.1
    done
    for p in "${pids[@]+"${pids[@]}"}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    pids=()
}
cleanup() {
    stop_all
    for n in "${hostns[@]}" "$brns"; do ip netns del "$n" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

# >>network
addr_of() { echo "10.78.0.$(($1 + 1))"; }
ip netns add "$brns" 2>/dev/null || skip "cannot create a network namespace"
ip -n "$brns" link add br0 type bridge 2>/dev/null || skip "no bridge support"
ip -n "$brns" link set br0 up
for h in $(seq 0 $((HOSTS - 1))); do
    n=${hostns[$h]}
    ip netns add "$n" || die "cannot create namespace $n"
    ip -n "$brns" link add "p$h" type veth peer name dmeth0 netns "$n" 2>/dev/null || skip "no veth support"
    ip -n "$brns" link set "p$h" master br0 up
    ip -n "$n" link set lo up
    ip -n "$n" addr add "$(addr_of "$h")/24" dev dmeth0
    ip -n "$n" link set dmeth0 up
done
if ip -o addr show | grep -q '10\.78\.0\.'; then die "10.78.0.x leaked into the root namespace"; fi

# >>shaping  One device: root htb, class 1:1 at RATE (the host's link in that direction). Without
# FLOW_RATE everything goes to leaf 1:2 at RATE. With it, TCP over IPv4 without options (the TCP
# header at byte 20) goes to one of 256 leaves 1:100..1:1ff, ceil FLOW_RATE each, by bits 1-8
# of its ports: u32 hashes one masked field per table (the kernel shifts it down), so table 1:
# hashes the source port's bits and links to one of 256 tables (0x100..0x1ff:) that hash the
# destination port's, whose buckets name the leaf 0x100 + (src bits XOR dst bits). Eight bits
# of each port, so flows that share one port (K sockets to one listener) still spread over 256
# leaves; bit 0 is left out because Linux gives connect() even ports and bind(0) odd ones. Two
# flows share a leaf (and its cap) with probability 1/256. Anything else (ARP, ...) goes to
# 1:2. quantum is set because htb's default (rate / r2q) is out of range at Gbit rates.
flow_filters() {  # device: the 65536 + 257 u32 filters (tc -batch lines)
    python3 - "$1" <<'PY'
import sys
dev = sys.argv[1]
out = [f"filter add dev {dev} parent 1: prio 1 handle 1: protocol ip u32 divisor 256"]
out += [f"filter add dev {dev} parent 1: prio 1 handle {0x100 + s:x}: protocol ip u32 divisor 256" for s in range(256)]
out += [f"filter add dev {dev} parent 1: prio 1 protocol ip u32 ht {0x100 + s:x}:{d:x}: match u32 0 0 flowid 1:{0x100 + (s ^ d):x}"
        for s in range(256) for d in range(256)]
out += [f"filter add dev {dev} parent 1: prio 1 protocol ip u32 ht 1:{s:x}: match u32 0 0 link {0x100 + s:x}: "
        "hashkey mask 0x000001fe at 20" for s in range(256)]
out.append(f"filter add dev {dev} parent 1: prio 1 protocol ip u32 ht 800:: match ip protocol 6 0xff "
           "match u8 0x05 0x0f at 0 link 1: hashkey mask 0x01fe0000 at 20")
print("\n".join(out))
PY
}
shape_dev() {  # namespace device
    local ns=$1 dev=$2 f=$tmp/tc-$1-$2 s burst=" burst $BURST cburst $BURST"
    {
        echo "qdisc add dev $dev root handle 1: htb default 2"
        echo "class add dev $dev parent 1: classid 1:1 htb rate $RATE ceil $RATE quantum 60000$burst"
        if [ -z "$FLOW_RATE" ]; then
            echo "class add dev $dev parent 1:1 classid 1:2 htb rate $RATE ceil $RATE quantum 60000$burst"
        else
            echo "class add dev $dev parent 1:1 classid 1:2 htb rate 1mbit ceil $RATE quantum 60000"
            for s in $(seq 0 255); do
                printf 'class add dev %s parent 1:1 classid 1:%x htb rate %dbit ceil %s quantum 60000%s\n' \
                    "$dev" $((0x100 + s)) $((RATE_BPS / 512)) "$FLOW_RATE" "$burst"
            done
            flow_filters "$dev"
        fi
    } > "$f"
    ip netns exec "$ns" tc -batch "$f" > "$tmp/tc.log" 2>&1
}
for h in $(seq 0 $((HOSTS - 1))); do
    shape_dev "${hostns[$h]}" dmeth0 || { cat "$tmp/tc.log"; skip "tc htb${FLOW_RATE:+ with u32 filters} unavailable"; }
    shape_dev "$brns" "p$h" || { cat "$tmp/tc.log"; skip "tc htb${FLOW_RATE:+ with u32 filters} unavailable"; }
done
# Every host reaches host 0 over TCP (a listener there, one connection from each; no ping here).
reach_host0() {
    local srv ok=0 h
    ip netns exec "${hostns[0]}" timeout -k 2 10 python3 -c '
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 29399)); s.listen(64); print("up", flush=True)
for _ in range(int(sys.argv[2])): s.accept()[0].close()' "$(addr_of 0)" $((HOSTS - 1)) > "$tmp/reach" 2>&1 &
    srv=$!; pids+=("$srv")
    for _ in $(seq 50); do grep -qs up "$tmp/reach" && break; sleep 0.1; done
    for h in $(seq 1 $((HOSTS - 1))); do
        ip netns exec "${hostns[$h]}" timeout -k 2 5 python3 -c '
import socket, sys
socket.create_connection((sys.argv[1], 29399), timeout=4).close()' "$(addr_of 0)" || ok=1
        [ $ok -eq 0 ] || { echo "bench-hosts: host $h cannot reach $(addr_of 0)" >&2; break; }
    done
    [ $ok -eq 0 ] && wait "$srv" || ok=1
    pids=()
    return $ok
}
reach_host0 || die "the namespaces do not reach each other"

mkdir -p "$OUT/raw" || die "cannot create $OUT/raw"
rm -f "$OUT"/raw/*
RAW=$OUT/raw/results.txt; : > "$RAW"
{
    echo "hosts=$HOSTS ranks_per_host=$RANKS_PER_HOST rate=$RATE rate_bps=$RATE_BPS flow_rate=${FLOW_RATE:-none}" \
         "flow_bps=$FLOW_BPS sizes=${BYTES[*]} reps=$REPS iters=$ITERS warmup=$WARMUP"
    uname -r; nproc; date -u
} > "$OUT/raw/setup.txt"

# >>iperf  The shaped rate as TCP sees it: one flow (and, with FLOW_RATE, 4 flows) host 1 -> host 0.
IPERF_LINES=()
iperf_run() {  # flows
    local port=52100 srv
    ip netns exec "${hostns[0]}" timeout -k 2 15 iperf3 -s -1 -p $port >/dev/null 2>&1 &
    srv=$!; pids+=("$srv")
    sleep 0.5
    ip netns exec "${hostns[1]}" timeout -k 2 12 iperf3 -c "$(addr_of 0)" -p $port -t 2 -P "$1" -J 2>/dev/null |
        python3 -c 'import json,sys; print("%.3f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e9))'
    wait "$srv" 2>/dev/null
}
if [ "$IPERF" = 1 ] && command -v iperf3 >/dev/null 2>&1; then
    for flows in 1 ${FLOW_RATE:+4}; do
        g=$(iperf_run "$flows") && [ -n "$g" ] && IPERF_LINES+=("iperf3 host1->host0, $flows flow(s): $g Gbit/s")
    done
    pids=()
fi
printf '%s\n' "${IPERF_LINES[@]+"${IPERF_LINES[@]}"}" > "$OUT/raw/iperf.txt"

# >>launch  One launch: every rank in its host's namespace, each under timeout; waits for all.
csv=$(IFS=,; echo "${BYTES[*]}")
wait_ranks() {
    local fail=0 p
    for p in "${pids[@]}"; do wait "$p" || fail=1; done
    pids=()
    return $fail
}
tx_bytes() {  # host: what its dmeth0 has sent
    ip netns exec "${hostns[$1]}" cat /sys/class/net/dmeth0/statistics/tx_bytes 2>/dev/null || echo 0
}
run_dm() {  # system algo(empty: unset) rep [compress mode]
    local sys=$1 algo=$2 rep=$3 mode=${4:-} r h store json=$OUT/raw/$1-rep$3.json log=$OUT/raw/$1-rep$3.log
    local before=()
    store=$(mktemp -d "$tmp/store_XXXXXX")
    for h in $(seq 0 $((HOSTS - 1))); do before+=("$(tx_bytes "$h")"); done
    for r in $(seq 0 $((N - 1))); do
        h=$((r / RANKS_PER_HOST))
        ip netns exec "${hostns[$h]}" env ${algo:+DISTMESH_ALGO=$algo} RANK=$r WORLD_SIZE=$N \
            LOCAL_RANK=$((r % RANKS_PER_HOST)) LOCAL_WORLD_SIZE=$RANKS_PER_HOST DISTMESH_TEST_HOST_ID=host$h \
            DISTMESH_SOCKET_IFNAME=dmeth0 DISTMESH_STORE="file://$store" DISTMESH_TIMEOUT=60 \
            MASTER_ADDR="$(addr_of 0)" MASTER_PORT=29500 \
            timeout -k 5 "$LAUNCH_TIMEOUT" "$DM_BENCH" --sizes "$csv" -n "$ITERS" -w "$WARMUP" -c 1 -a 3 \
            --inplace-only --timeout $((LAUNCH_TIMEOUT - 10)) ${mode:+--compress $mode} --json "$json" > "$log.$r" 2>&1 &
        pids+=($!)
    done
    if ! wait_ranks; then
        echo "bench-hosts: $sys repetition $rep failed; its logs:" >&2
        tail -n 20 "$log".* >&2
        return 1
    fi
    cat "$log".* > "$log"; rm -f "$log".*
    for h in $(seq 0 $((HOSTS - 1))); do
        echo "$sys rep=$rep host=$h tx_bytes=$(( $(tx_bytes "$h") - before[h] ))" >> "$OUT/raw/bytes.txt"
    done
    # the algorithm, where dm_bench's rows name it ("algo"), and the transport from its JSON
    python3 - "$sys" "$rep" "$json" >> "$RAW" <<'PY' || return 1
import json, sys
d = json.load(open(sys.argv[3]))
for row in d["rows"]:
    algo = row.get("algo", row.get("algorithm", "-")) or "-"
    print(f"{sys.argv[1]} rep={sys.argv[2]} bytes={row['bytes']} us={row['ip_us']} wrong={row['ip_wrong']} "
          f"transport={d.get('transport', '-')} algo={algo}")
PY
}
run_gloo() {  # rep
    local rep=$1 r h store log=$OUT/raw/gloo-rep$1.log
    store=$(mktemp -d "$tmp/gloo_XXXXXX")
    for r in $(seq 0 $((N - 1))); do
        h=$((r / RANKS_PER_HOST))
        ip netns exec "${hostns[$h]}" env GLOO_BENCH_HOSTNAME="$(addr_of "$h")" \
            timeout -k 5 "$LAUNCH_TIMEOUT" "$GLOO_BENCH" ring_chunked "$r" "$N" "$store" "$ITERS" "$WARMUP" \
            "${BYTES[@]}" > "$log.$r" 2>&1 &
        pids+=($!)
    done
    if ! wait_ranks; then
        echo "bench-hosts: gloo repetition $rep failed; its logs:" >&2
        tail -n 20 "$log".* >&2
        return 1
    fi
    cat "$log".* > "$log"; rm -f "$log".*
    sed -n "s/^gloo_ring_chunked ranks=$N \(bytes=[0-9]*\) \(us=[0-9.]*\)$/gloo rep=$rep \1 \2 wrong=-1 transport=tcp algo=ring_chunked/p" \
        "$log" >> "$RAW"
}

SYSTEMS="distmesh_auto distmesh_flat"
for m in $COMPRESS; do SYSTEMS="$SYSTEMS distmesh_$m"; done
if [ -n "$GLOO_BENCH" ] && [ -x "$GLOO_BENCH" ]; then SYSTEMS="$SYSTEMS gloo"
else echo "bench-hosts: Gloo not run (no gloo_bench built: needs libgloo-dev)"; fi
echo "bench-hosts: $HOSTS hosts x $RANKS_PER_HOST ranks, link $RATE${FLOW_RATE:+, $FLOW_RATE per flow}," \
     "sizes ${SIZES}, $REPS repetitions of $ITERS iterations (+$WARMUP warmup)"
[ ${#IPERF_LINES[@]} -eq 0 ] || printf '  %s\n' "${IPERF_LINES[@]}"
for rep in $(seq 1 "$REPS"); do
    for sys in $SYSTEMS; do
        echo "bench-hosts: repetition $rep/$REPS: $sys" >&2
        case $sys in
            distmesh_auto) run_dm "$sys" "" "$rep" ;;
            distmesh_flat) run_dm "$sys" flat_ring "$rep" ;;
            distmesh_int8|distmesh_bf16) run_dm "$sys" "" "$rep" "${sys#distmesh_}" ;;
            gloo) run_gloo "$rep" ;;
        esac || exit 1
    done
done
for h in $(seq 0 $((HOSTS - 1))); do
    { echo "== host $h: dmeth0 (egress: what host $h sends)"; ip netns exec "${hostns[$h]}" tc -s class show dev dmeth0
      echo "== bridge port p$h (egress: what host $h receives)"; ip netns exec "$brns" tc -s class show dev "p$h"
    } >> "$OUT/raw/tc-classes.txt" 2>&1
done

python3 "$(dirname "$0")/bench_hosts_report.py" "$RAW" "$OUT" "$HOSTS" "$RANKS_PER_HOST" "$RATE_BPS" "$FLOW_BPS" \
    "$OUT/raw/tc-classes.txt" $SYSTEMS || die "report failed"
