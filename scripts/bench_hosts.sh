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
# COLL=all_reduce (the default) | all_gather | reduce_scatter | barrier: the collective dm_bench
# times (-O; sizes as dm_bench counts them: all_gather's received, reduce_scatter's sent; a barrier
# one row of 0 bytes); Gloo runs all_gather as bench/gloo_bench allgather (its AllgatherRing), the
# barrier as gloo_bench barrier (BarrierAllToAll), and is left out for reduce_scatter; the
# compressed systems run only with all_reduce.
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
#   DM_ENV="DISTMESH_SOCKETS_PER_PEER=2 ..." (NAME=value words added to every distmesh rank's
#   environment, not Gloo's)
#   RATE=none: the links unshaped (no tc; not with DELAY, SITES or FLOW_RATE): the report has no bounds.
#   ENCRYPT=1 adds distmesh_enc, distmesh_auto with DISTMESH_ENCRYPT=1 (AES-256-GCM links between
#   hosts), interleaved with the others, which run with DISTMESH_ENCRYPT=0; all of distmesh's
#   systems get DISTMESH_TOKEN (DM_ENV's, else benchtok). The report adds enc/auto per size and the
#   crypto bound: `openssl speed -evp aes-256-gcm` at 64 KiB (bytes/s per core, raw/crypto.txt) and
#   what sealing and opening a rank's bytes at that speed takes (all-reduce: 2 x 2(N-1)/N x S).
#   DELAY=<ms> one-way delay (default 0: the bridge above, nothing else changes). With DELAY > 0 a
#   router namespace replaces the bridge: the hosts' veths end there (same addresses, static
#   neighbour entries, no ARP), every packet a host sends is routed into a TUN device whose
#   program, bench/delay_line.c, holds it DELAY ms and writes it back, and the kernel routes it on
#   to the destination host's port. Each packet crosses the delay line once: DELAY is the delay of
#   the sending host's link, so host to host is DELAY one way and a round trip 2 x DELAY (any
#   pair of hosts). TCP stays end to end. The htb shaping is the same (the router's port p<h>
#   shapes what host h receives). Before the runs: a UDP round trip between host 1 and host 0
#   (python, 20 probes; off by more than DELAY_TOL ms (default 3) from 2 x DELAY: exit 1) and one
#   TCP flow's throughput (iperf3 when there, else python; 6 s, the first 2 left out for slow
#   start; below 85% of the rate the link allows: a warning), both in the report. Socket buffers
#   in every host namespace: net.ipv4.tcp_rmem / tcp_wmem maxima raised to TCP_MEM_MAX (default
#   64M) so that autotuned flows can hold 2 x DELAY x RATE (50 ms x 1 Gbit/s = 6.25 MB);
#   net.core.rmem_max / wmem_max are set to CORE_MEM_MAX only when it is given (they decide
#   whether distmesh pins SO_SNDBUF/SO_RCVBUF to 4 MiB: it does when wmem_max >= 4 MiB).
#   DELAY_LINE=path (default: delay_line next to dm_bench, else built from bench/delay_line.c
#   with cc), DELAY_QUEUE=64M (its queue in bytes; tail drop beyond).
#   SITES=<n> (default 1: one site, all of the above unchanged). With n > 1 the hosts form n sites
#   of HOSTS/n consecutive hosts each (HOSTS a multiple of n; site s holds hosts s*HOSTS/n ..
#   (s+1)*HOSTS/n - 1), a third level of the network. Topology, a star: one router namespace per
#   site, where its hosts' veths end (same addresses, static neighbour entries, no ARP, as with
#   DELAY; host links shaped at RATE both ways, FLOW_RATE as above), and one core router namespace
#   joined to each site's router by one veth pair, the site's link: shaped to SITE_RATE (default
#   200mbit) with htb on both directions (egress of the site router's up0: what the site sends;
#   egress of the core's port s<s>: what it receives), no per-flow cap. Every packet between two
#   sites crosses the sender's site link and the receiver's, so each site has one shared link at
#   SITE_RATE each way to all other sites (with 2 sites: one link between them, the core only
#   joins the two halves). The site routers and the core route by /32 routes per host address.
#   SITE_DELAY=<ms> (default 0) puts a delay line in the core (the DELAY router's policy routing:
#   in from any site port, through its TUN device, out to the destination site's port), so site
#   to site is SITE_DELAY one way and a round trip 2 x SITE_DELAY. DELAY > 0 with sites (2 or
#   more hosts per site) runs a delay line in each site router too: what the site's hosts send
#   goes through it once (rule: in from up0, from the core, bypasses it), so host to host is DELAY
#   one way within a site and DELAY + SITE_DELAY across sites; the DELAY check (hosts 1 and 0)
#   stays inside site 0. Socket buffers in the hosts as with DELAY (TCP_MEM_MAX, CORE_MEM_MAX). Systems with SITES > 1: distmesh_auto runs with
#   DISTMESH_SITE=site<s> in the environment of every rank of site s, and so do distmesh_flat and
#   the compressed ones; distmesh_2level is distmesh_auto without DISTMESH_SITE (the library sees
#   hosts only: its two-level schedule on the same layout); Gloo as above; all interleaved.
#   Before the runs: one TCP flow from the first host of the last site to host 0 across the site
#   links (iperf3 when there, else python; as the DELAY check: 4 s after 2 s), below 85% of the
#   most it allows (min(RATE, FLOW_RATE, SITE_RATE) x 1448/1514): a warning; with SITE_DELAY the
#   round trip between them too (exit 1 if off by more than DELAY_TOL from 2 x (DELAY +
#   SITE_DELAY)); raw/delay_line.txt has each delay line's counters, led by its router. The
#   report adds the site link's rate, the three-level bound per size, 2(n-1)/n x size / SITE_RATE
#   (what a reduce-scatter and all-gather across n sites put on each site link each way; with a
#   delay also that + DELAY + SITE_DELAY), the ratios distmesh_auto over it, over distmesh_2level and
#   over Gloo, the checks above (also in results.json), and the bytes each site link sent per
#   launch (up0's tx counter, raw/bytes.txt; every system, Gloo too).
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
DELAY=${DELAY:-0}; DELAY_TOL=${DELAY_TOL:-3}; DELAY_QUEUE=${DELAY_QUEUE:-64M}; TCP_MEM_MAX=${TCP_MEM_MAX:-64M}
CORE_MEM_MAX=${CORE_MEM_MAX:-}; DM_ENV=${DM_ENV:-}
SITES=${SITES:-1}; SITE_RATE=${SITE_RATE:-200mbit}; SITE_DELAY=${SITE_DELAY:-0}; COLL=${COLL:-all_reduce}
ENCRYPT=${ENCRYPT:-0}

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
[[ $COLL =~ ^(all_reduce|all_gather|reduce_scatter|barrier)$ ]] || die "COLL=$COLL: all_reduce, all_gather, reduce_scatter or barrier"
[ "$COLL" = all_reduce ] || COMPRESS=          # compression is an all_reduce's
[ -x "$DM_BENCH" ] || die "$DM_BENCH: not an executable"
[[ $DELAY =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "DELAY=$DELAY: milliseconds (e.g. 25)"
[[ $DELAY_TOL =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "DELAY_TOL=$DELAY_TOL: milliseconds"
[[ $DELAY_QUEUE =~ ^[0-9]+[KMG]?$ ]] || die "DELAY_QUEUE=$DELAY_QUEUE: bytes, K, M or G (e.g. 64M)"
DM_ENV_ARGS=()
for kv in $DM_ENV; do
    [[ $kv =~ ^[A-Z_][A-Z0-9_]*=[^[:space:]]*$ ]] || die "DM_ENV: $kv is not NAME=value"; DM_ENV_ARGS+=("$kv")
done
[[ $ENCRYPT =~ ^[01]$ ]] || die "ENCRYPT=$ENCRYPT: 0 or 1"
if [ "$ENCRYPT" = 1 ]; then  # >>encrypt  distmesh_enc beside the plain systems, one token for all
    [[ " $DM_ENV " != *" DISTMESH_ENCRYPT="* ]] || die "DM_ENV: DISTMESH_ENCRYPT is set per system with ENCRYPT=1"
    [[ " $DM_ENV " == *" DISTMESH_TOKEN="* ]] || DM_ENV_ARGS+=("DISTMESH_TOKEN=benchtok")
fi
[[ $TCP_MEM_MAX =~ ^[0-9]+[KMG]?$ ]] || die "TCP_MEM_MAX=$TCP_MEM_MAX: bytes, K, M or G"
[[ -z $CORE_MEM_MAX || $CORE_MEM_MAX =~ ^[0-9]+[KMG]?$ ]] || die "CORE_MEM_MAX=$CORE_MEM_MAX: bytes, K, M or G"
# DM_WMEM_MAX_SEEN=<bytes> (an experiment): what distmesh's ranks read in /proc/sys/net/core/wmem_max
# (a file bind-mounted over it in each rank's mount namespace, which ip netns exec makes private;
# the kernel's limit is unchanged). distmesh pins SO_SNDBUF/SO_RCVBUF to 4 MiB only when it reads
# >= 4 MiB there, so 4194303 runs it on the kernel's autotuning (up to tcp_rmem/tcp_wmem's maxima).
DM_WMEM_MAX_SEEN=${DM_WMEM_MAX_SEEN:-}; DM_WRAP=()
[[ -z $DM_WMEM_MAX_SEEN || $DM_WMEM_MAX_SEEN =~ ^[0-9]+$ ]] || die "DM_WMEM_MAX_SEEN=$DM_WMEM_MAX_SEEN: bytes"
delayed() { [[ ! $DELAY =~ ^0*(\.0*)?$ ]]; }  # DELAY > 0
is_count "$SITES" && [ "$SITES" -le "$HOSTS" ] && [ $((HOSTS % SITES)) -eq 0 ] ||
    die "SITES=$SITES: need a count >= 1 that divides HOSTS=$HOSTS"
sited() { [ "$SITES" -gt 1 ]; }
[[ $SITE_DELAY =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "SITE_DELAY=$SITE_DELAY: milliseconds (e.g. 25)"
site_delayed() { sited && [[ ! $SITE_DELAY =~ ^0*(\.0*)?$ ]]; }  # SITES > 1 and SITE_DELAY > 0
! sited || ! delayed || [ $((HOSTS / SITES)) -ge 2 ] ||
    die "DELAY=$DELAY with SITES=$SITES: needs 2 or more hosts per site (the DELAY check runs between hosts 1 and 0, inside site 0)"
if sited; then
    for kv in "${DM_ENV_ARGS[@]+"${DM_ENV_ARGS[@]}"}"; do
        [[ $kv != DISTMESH_SITE=* ]] || die "DM_ENV: DISTMESH_SITE is set per site with SITES > 1 (and left out for distmesh_2level)"
    done
fi
HPS=$((HOSTS / SITES))  # hosts per site
site_of() { echo $(($1 / HPS)); }
command -v python3 >/dev/null 2>&1 || skip "no python3 (the report needs it)"
# tc rates: a number and bit, kbit, mbit or gbit (tc's own units; bits per second)
rate_bps() {
    local v=${1,,}
    [[ $v =~ ^([0-9]+(\.[0-9]+)?)(bit|kbit|mbit|gbit)$ ]] || return 1
    python3 -c "import sys; m={'bit':1,'kbit':1e3,'mbit':1e6,'gbit':1e9}; print(int(float(sys.argv[1])*m[sys.argv[2]]))" \
        "${BASH_REMATCH[1]}" "${BASH_REMATCH[3]}"
}
unshaped() { [ "$RATE" = none ]; }
if unshaped; then
    RATE_BPS=0
    ! delayed && ! sited && [ -z "$FLOW_RATE" ] || die "RATE=none: not with DELAY, SITES or FLOW_RATE"
else RATE_BPS=$(rate_bps "$RATE") || die "RATE=$RATE: not a tc rate (e.g. 2gbit, 500mbit), or none"; fi
SITE_BPS=$(rate_bps "$SITE_RATE") || die "SITE_RATE=$SITE_RATE: not a tc rate (e.g. 200mbit, 1gbit)"
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
corens=${tag}core sitens=() portns=()  # portns[h]: where host h's port is (the bridge's or its site router's)
if sited; then for s in $(seq 0 $((SITES - 1))); do sitens+=("${tag}s$s"); done; fi
for h in $(seq 0 $((HOSTS - 1))); do if sited; then portns+=("${sitens[$((h / HPS))]}"); else portns+=("$brns"); fi; done
tmp=$(mktemp -d /tmp/dm_bench_hosts_XXXXXX)
pids=()
# pids are timeout's (ip netns exec execs env, which execs timeout): SIGTERM, which timeout passes
# on to its command, then SIGKILL for whatever is left after 3 s.
running() { local st; st=$(ps -o stat= -p "$1" 2>/dev/null) && [[ $st != Z* ]]; }  # not a zombie
stop_all() {
    local p left
    for p in "${pids[@]+"${pids[@]}"}"; do kill -TERM "$p" 2>/dev/null; done
    for _ in $(seq 30); do
        left=0
        for p in "${pids[@]+"${pids[@]}"}"; do running "$p" && left=1; done
        [ $left -eq 0 ] && break
        sleep 0.1
    done
    for p in "${pids[@]+"${pids[@]}"}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    pids=()
}
cleanup() {
    trap '' INT TERM HUP  # a second signal (timeout sends one to its child and one to the group) must not cut this short
    stop_all
    stop_delay_lines
    # what still runs in the namespaces (a check's processes, started in a subshell, are not in pids)
    local n left
    for n in "${hostns[@]}" "$brns" "${sitens[@]+"${sitens[@]}"}" "$corens"; do
        ip netns pids "$n" 2>/dev/null | xargs -r kill -TERM 2>/dev/null
    done
    for _ in $(seq 20); do
        left=
        for n in "${hostns[@]}" "$brns" "${sitens[@]+"${sitens[@]}"}" "$corens"; do left+=$(ip netns pids "$n" 2>/dev/null); done
        [ -z "$left" ] && break
        sleep 0.1
    done
    for n in "${hostns[@]}" "$brns" "${sitens[@]+"${sitens[@]}"}" "$corens"; do
        ip netns pids "$n" 2>/dev/null | xargs -r kill -9 2>/dev/null
        ip netns del "$n" 2>/dev/null
    done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

# >>network
addr_of() { echo "10.78.0.$(($1 + 1))"; }
# >>router  DELAY > 0: namespace $brns routes instead of bridging. Host h's dmeth0 (MAC
# 02:78:00:00:00:hh) meets port p<h> (02:78:00:00:01:hh) there; hosts reach each other through
# static neighbour entries (every peer address -> the port's MAC), the router reaches host h by
# 10.78.0.(h+1)/32 dev p<h> and a static entry. Policy routing: what comes in on any port goes
# (table 100) into the TUN device dl0, what comes out of dl0 takes the main table to its port.
# The delay line runs in $brns for the whole script (stopped by cleanup, its counters kept).
DL_PIDS=() DL_NS=()
stop_delay_lines() {  # their counters to raw/delay_line.txt (each line led by its namespace's role with SITES > 1)
    local i lbl
    [ ${#DL_PIDS[@]} -gt 0 ] || return 0
    for i in "${!DL_PIDS[@]}"; do kill -TERM "${DL_PIDS[$i]}" 2>/dev/null; wait "${DL_PIDS[$i]}" 2>/dev/null; done
    if [ -d "$OUT/raw" ]; then
        for i in "${!DL_PIDS[@]}"; do
            if sited; then
                lbl=${DL_NS[$i]#"$tag"}; [[ $lbl == s* ]] && lbl="site${lbl#s} router (DELAY)" || lbl="core (SITE_DELAY)"
                grep -s '^delay_line' "$tmp/delay_line-${DL_NS[$i]}.out" | sed "s/^/$lbl: /"
            else grep -s '^delay_line' "$tmp/delay_line-${DL_NS[$i]}.out"; fi
        done > "$OUT/raw/delay_line.txt"
    fi
    DL_PIDS=() DL_NS=()
}
mac_of() { printf '02:78:00:00:%02x:%02x' "$1" "$2"; }  # 0 host side / 1 router side, host
delay_line_bin() {
    local b=${DELAY_LINE:-$(dirname "$DM_BENCH")/delay_line}
    if [ ! -x "$b" ]; then
        b=$tmp/delay_line
        ${CC:-cc} -std=c11 -O2 -Wall -Wextra -Wpedantic -Werror bench/delay_line.c -o "$b" >&2 || return 1
    fi
    echo "$b"
}
build_router() {
    local h k n
    router_ns "$brns"
    start_delay_line "$brns" "$DELAY"
    for h in $(seq 0 $((HOSTS - 1))); do
        n=${hostns[$h]}
        ip netns add "$n" || die "cannot create namespace $n"
        ip -n "$brns" link add "p$h" address "$(mac_of 1 "$h")" type veth peer name dmeth0 address "$(mac_of 0 "$h")" \
            netns "$n" 2>/dev/null || skip "no veth support"
        ip -n "$brns" link set "p$h" up
        ip netns exec "$brns" sysctl -qw "net.ipv4.conf.p$h.rp_filter=0"
        ip -n "$brns" route add "$(addr_of "$h")/32" dev "p$h"
        ip -n "$brns" neigh replace "$(addr_of "$h")" lladdr "$(mac_of 0 "$h")" dev "p$h" nud permanent
        host_side "$n" "$h"
    done
}
host_side() {  # namespace, host: its address and static neighbours on dmeth0 (no ARP: every peer's
    # address maps to the MAC of the port the host's veth ends at), its socket buffers
    local n=$1 h=$2 k
    ip -n "$n" link set lo up
    ip -n "$n" addr add "$(addr_of "$h")/24" dev dmeth0
    ip -n "$n" link set dmeth0 up
    for k in $(seq 0 $((HOSTS - 1))); do
        [ "$k" = "$h" ] || ip -n "$n" neigh replace "$(addr_of "$k")" lladdr "$(mac_of 1 "$h")" dev dmeth0 nud permanent
    done
    host_buffers "$n"
}
host_buffers() {  # namespace: autotuned TCP may grow to TCP_MEM_MAX (per namespace since Linux 4.15)
    ip netns exec "$1" sysctl -qw "net.ipv4.tcp_rmem=4096 131072 $(size_bytes "$TCP_MEM_MAX")" \
        "net.ipv4.tcp_wmem=4096 16384 $(size_bytes "$TCP_MEM_MAX")" || die "cannot set tcp_rmem/tcp_wmem in $1"
    if [ -n "$CORE_MEM_MAX" ]; then  # sysctl exits 0 on some failures: read it back
        ip netns exec "$1" sysctl -qw "net.core.rmem_max=$(size_bytes "$CORE_MEM_MAX")" \
            "net.core.wmem_max=$(size_bytes "$CORE_MEM_MAX")" 2>/dev/null
        [ "$(ip netns exec "$1" sysctl -n net.core.wmem_max)" = "$(size_bytes "$CORE_MEM_MAX")" ] ||
            die "CORE_MEM_MAX: net.core.rmem_max/wmem_max cannot be set in a namespace on this kernel (they are the machine's)"
    fi
}
start_delay_line() {  # namespace delay_ms [device that bypasses it]: the delay line as dl0 there, policy routing of 10.78.0.0/24 into it
    local dl out=$tmp/delay_line-$1.out
    dl=$(delay_line_bin) || die "cannot build bench/delay_line.c"
    ip netns exec "$1" "$dl" -i dl0 -d "$2" -q "$DELAY_QUEUE" > "$out" 2>&1 &
    DL_PIDS+=($!) DL_NS+=("$1")
    for _ in $(seq 50); do grep -qs '^ready' "$out" && break; sleep 0.1; done
    grep -qs '^ready' "$out" || { cat "$out"; skip "the delay line did not start (TUN?)"; }
    ip -n "$1" link set dl0 up
    ip netns exec "$1" sysctl -qw net.ipv4.conf.dl0.rp_filter=0
    ip -n "$1" rule add pref 100 iif dl0 lookup main
    [ -z "${3:-}" ] || ip -n "$1" rule add pref 101 iif "$3" lookup main
    ip -n "$1" rule add pref 102 lookup 100
    ip -n "$1" route add 10.78.0.0/24 dev dl0 table 100
}
router_ns() {  # namespace: created, forwarding, no reverse-path filter
    ip netns add "$1" 2>/dev/null || skip "cannot create a network namespace"
    ip netns exec "$1" sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 \
        net.ipv4.conf.default.rp_filter=0 || die "cannot enable forwarding in $1"
}
# >>sites  SITES > 1: site router $sitens[s] holds port p<h> of each of its hosts (MACs as in the
# DELAY router) and up0 (02:78:00:02:00:ss), the site's link to the core $corens, whose end there
# is s<s> (02:78:00:02:01:ss). A site router reaches its own hosts by /32 dev p<h>, every other
# host by /32 dev up0 (neighbour: the core's port); the core reaches host h by /32 dev s<site of h>
# (neighbour: that site's up0). With SITE_DELAY the core runs a delay line (start_delay_line), with
# DELAY each site router one, which what comes in on up0 bypasses (rule pref 101).
site_mac() { printf '02:78:00:02:%02x:%02x' "$1" "$2"; }  # 0 site router side / 1 core side, site
build_sites() {
    local h k s n r
    router_ns "$corens"
    site_delayed && start_delay_line "$corens" "$SITE_DELAY"
    for s in $(seq 0 $((SITES - 1))); do
        r=${sitens[$s]}
        router_ns "$r"
        ip -n "$r" link add up0 address "$(site_mac 0 "$s")" type veth peer name "s$s" address "$(site_mac 1 "$s")" \
            netns "$corens" 2>/dev/null || skip "no veth support"
        ip -n "$r" link set up0 up
        ip -n "$corens" link set "s$s" up
        ip netns exec "$r" sysctl -qw net.ipv4.conf.up0.rp_filter=0
        ip netns exec "$corens" sysctl -qw "net.ipv4.conf.s$s.rp_filter=0"
        delayed && start_delay_line "$r" "$DELAY" up0  # what the site's hosts send; not what comes in from the core
    done
    for h in $(seq 0 $((HOSTS - 1))); do
        n=${hostns[$h]} s=$(site_of "$h") r=${portns[$h]}
        ip netns add "$n" || die "cannot create namespace $n"
        ip -n "$r" link add "p$h" address "$(mac_of 1 "$h")" type veth peer name dmeth0 address "$(mac_of 0 "$h")" \
            netns "$n" 2>/dev/null || skip "no veth support"
        ip -n "$r" link set "p$h" up
        ip netns exec "$r" sysctl -qw "net.ipv4.conf.p$h.rp_filter=0"
        host_side "$n" "$h"
        ip -n "$corens" route add "$(addr_of "$h")/32" dev "s$s"
        ip -n "$corens" neigh replace "$(addr_of "$h")" lladdr "$(site_mac 0 "$s")" dev "s$s" nud permanent
        for k in $(seq 0 $((SITES - 1))); do
            r=${sitens[$k]}
            if [ "$k" = "$s" ]; then
                ip -n "$r" route add "$(addr_of "$h")/32" dev "p$h"
                ip -n "$r" neigh replace "$(addr_of "$h")" lladdr "$(mac_of 0 "$h")" dev "p$h" nud permanent
            else
                ip -n "$r" route add "$(addr_of "$h")/32" dev up0
                ip -n "$r" neigh replace "$(addr_of "$h")" lladdr "$(site_mac 1 "$k")" dev up0 nud permanent
            fi
        done
    done
}
if sited; then
    build_sites
elif delayed; then
    build_router
else
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
fi
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
shape_dev() {  # namespace device [rate: instead of RATE, and no per-flow cap (a site link)]
    local ns=$1 dev=$2 f=$tmp/tc-$1-$2 s burst=" burst $BURST cburst $BURST" rate=${3:-$RATE} flow=$FLOW_RATE
    [ -z "${3:-}" ] || flow=
    {
        echo "qdisc add dev $dev root handle 1: htb default 2"
        echo "class add dev $dev parent 1: classid 1:1 htb rate $rate ceil $rate quantum 60000$burst"
        if [ -z "$flow" ]; then
            echo "class add dev $dev parent 1:1 classid 1:2 htb rate $rate ceil $rate quantum 60000$burst"
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
    unshaped && break
    shape_dev "${hostns[$h]}" dmeth0 || { cat "$tmp/tc.log"; skip "tc htb${FLOW_RATE:+ with u32 filters} unavailable"; }
    shape_dev "${portns[$h]}" "p$h" || { cat "$tmp/tc.log"; skip "tc htb${FLOW_RATE:+ with u32 filters} unavailable"; }
done
for s in $(seq 0 $((SITES - 1))); do  # SITES > 1: each site's link, both ways
    sited || break
    shape_dev "${sitens[$s]}" up0 "$SITE_RATE" || { cat "$tmp/tc.log"; skip "tc htb unavailable"; }
    shape_dev "$corens" "s$s" "$SITE_RATE" || { cat "$tmp/tc.log"; skip "tc htb unavailable"; }
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
    sited && echo "sites=$SITES hosts_per_site=$HPS site_rate=$SITE_RATE site_bps=$SITE_BPS site_delay_ms=$SITE_DELAY"
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

# >>delay check  DELAY > 0: what the hosts see. A ping-like round trip host 1 -> host 0 (UDP echo in
# python, 20 probes 50 ms apart; ping itself may be missing) against 2 x DELAY, and one TCP flow
# host 1 -> host 0 (iperf3, else python) over 6 s, the first 2 s (slow start over 2 x DELAY) left
# out, against the most the link allows one flow: min(RATE, FLOW_RATE) x 1448/1514 (TCP payload
# in a full frame). The socket buffer settings of host 0 go to the report too.
DELAY_LINES=()
rtt_check() {  # [from host, default 1] prints "min median max" in ms
    local srv src=${1:-1}
    ip netns exec "${hostns[0]}" timeout -k 2 20 python3 -c '
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((sys.argv[1], 29397)); print("up", flush=True)
s.settimeout(15)
try:
    while True:
        d, a = s.recvfrom(64)
        if d == b"end": break
        s.sendto(d, a)
except socket.timeout:
    pass' "$(addr_of 0)" > "$tmp/echo" 2>&1 &
    srv=$!; pids+=("$srv")
    for _ in $(seq 50); do grep -qs up "$tmp/echo" && break; sleep 0.1; done
    ip netns exec "${hostns[$src]}" timeout -k 2 15 python3 -c '
import socket, statistics, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2); a = (sys.argv[1], 29397)
rtt = []
for i in range(21):
    t = time.perf_counter(); s.sendto(b"%d" % i, a)
    while s.recvfrom(64)[0] != b"%d" % i: pass
    rtt.append((time.perf_counter() - t) * 1e3); time.sleep(0.05)
rtt = rtt[1:]  # the first one may meet a cold path
s.sendto(b"end", a)
print("%.2f %.2f %.2f" % (min(rtt), statistics.median(rtt), max(rtt)))' "$(addr_of 0)"
    local rc=$?
    wait "$srv" 2>/dev/null; pids=()
    return $rc
}
flow_check() {  # [from host, default 1] prints Gbit/s and the tool
    local srv port=52101 src=${1:-1}
    if command -v iperf3 >/dev/null 2>&1; then
        ip netns exec "${hostns[0]}" timeout -k 2 20 iperf3 -s -1 -p $port >/dev/null 2>&1 &
        srv=$!; pids+=("$srv")
        sleep 0.5
        ip netns exec "${hostns[$src]}" timeout -k 2 15 iperf3 -c "$(addr_of 0)" -p $port -t 4 -O 2 -J 2>/dev/null |
            python3 -c 'import json,sys; print("%.3f iperf3" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e9))'
    else
        ip netns exec "${hostns[0]}" timeout -k 2 20 python3 -c '
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], 52101)); s.listen(1)
print("up", flush=True)
c = s.accept()[0]; buf = bytearray(1 << 20); n = 0; t0 = time.perf_counter(); t1 = None
while True:
    k = c.recv_into(buf)
    if not k: break
    now = time.perf_counter()
    if now - t0 >= 2:
        if t1 is None: t1 = now
        else: n += k; t2 = now
print("%.3f python" % (n * 8 / (t2 - t1) / 1e9))' "$(addr_of 0)" > "$tmp/flow" 2>&1 &
        srv=$!; pids+=("$srv")
        for _ in $(seq 50); do grep -qs up "$tmp/flow" && break; sleep 0.1; done
        ip netns exec "${hostns[$src]}" timeout -k 2 15 python3 -c '
import socket, sys, time
c = socket.create_connection((sys.argv[1], 52101)); b = bytes(1 << 20); t = time.perf_counter()
while time.perf_counter() - t < 6: c.sendall(b)
c.close()' "$(addr_of 0)"
        wait "$srv" 2>/dev/null
        tail -n 1 "$tmp/flow"
    fi
    wait "$srv" 2>/dev/null; pids=()
}
if delayed; then
    r=$(rtt_check) || die "the round-trip check failed"
    read -r rmin rmed rmax <<< "$r"
    ok=$(python3 -c 'import sys; m, d, t = map(float, sys.argv[1:]); print("ok" if abs(m - 2 * d) <= t else "OFF")' \
        "$rmed" "$DELAY" "$DELAY_TOL")
    DELAY_LINES+=("delay line: ${DELAY} ms one way per host link (each packet delayed once, by its sender's link): a round trip host1->host0->host1 should be $(python3 -c 'import sys; print("%g" % (2 * float(sys.argv[1])))' "$DELAY") ms")
    DELAY_LINES+=("round trip host1->host0 (UDP echo, 20 probes): min $rmin, median $rmed, max $rmax ms: $ok (tolerance ${DELAY_TOL} ms)")
    [ "$ok" = ok ] || { printf '%s\n' "${DELAY_LINES[@]}" >&2; die "the round trip does not match DELAY=$DELAY"; }
    one_bps=$RATE_BPS; [ "$FLOW_BPS" -gt 0 ] && [ "$FLOW_BPS" -lt "$one_bps" ] && one_bps=$FLOW_BPS
    f=$(flow_check); read -r fg tool <<< "$f"
    if [ -n "${fg:-}" ]; then
        DELAY_LINES+=("$(python3 -c 'import sys
g, bps, tool = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]; top = bps * 1448 / 1514 / 1e9
print("one TCP flow host1->host0 (%s, 4 s after 2 s): %.3f Gbit/s of %.3f the link allows (%.0f%%): %s"
      % (tool, g, top, 100 * g / top, "ok" if g >= 0.85 * top else "LOW"))' "$fg" "$one_bps" "$tool")")
    else
        DELAY_LINES+=("one TCP flow host1->host0: the measurement failed")
    fi
    sc() { ip netns exec "${hostns[0]}" sysctl -n "$1" | tr -s '\t ' ' '; }
    DELAY_LINES+=("host namespaces: net.core.rmem_max $(sc net.core.rmem_max), wmem_max $(sc net.core.wmem_max), tcp_rmem $(sc net.ipv4.tcp_rmem), tcp_wmem $(sc net.ipv4.tcp_wmem), congestion control $(sc net.ipv4.tcp_congestion_control)")
    printf '%s\n' "${DELAY_LINES[@]}" | grep -q LOW && echo "bench-hosts: warning: one flow is below 85% of the link" >&2
fi
# >>site check  SITES > 1: one TCP flow (and with SITE_DELAY the round trip) from the first host of
# the last site to host 0, across the site links, as the DELAY check above.
if sited; then
    far=$((HOSTS - HPS)); ssite=$((SITES - 1))
    if site_delayed || delayed; then  # one way: DELAY (the sender's host link) + SITE_DELAY (the core)
        oneway=$(python3 -c 'import sys; print("%g" % (float(sys.argv[1]) + float(sys.argv[2])))' "$DELAY" "$(site_delayed && echo "$SITE_DELAY" || echo 0)")
        r=$(rtt_check "$far") || die "the round-trip check across the site links failed"
        read -r rmin rmed rmax <<< "$r"
        ok=$(python3 -c 'import sys; m, d, t = map(float, sys.argv[1:]); print("ok" if abs(m - 2 * d) <= t else "OFF")' \
            "$rmed" "$oneway" "$DELAY_TOL")
        site_delayed && DELAY_LINES+=("site delay line: ${SITE_DELAY} ms one way site to site (in the core)")
        DELAY_LINES+=("round trip host${far} (site$ssite)->host0 (site0) (UDP echo, 20 probes): min $rmin, median $rmed, max $rmax ms, should be $(python3 -c 'import sys; print("%g" % (2 * float(sys.argv[1])))' "$oneway"): $ok (tolerance ${DELAY_TOL} ms)")
        [ "$ok" = ok ] || { printf '%s\n' "${DELAY_LINES[@]}" >&2; die "the round trip across the sites does not match DELAY + SITE_DELAY = $oneway ms one way"; }
    fi
    one_bps=$RATE_BPS; [ "$FLOW_BPS" -gt 0 ] && [ "$FLOW_BPS" -lt "$one_bps" ] && one_bps=$FLOW_BPS
    [ "$SITE_BPS" -lt "$one_bps" ] && one_bps=$SITE_BPS
    f=$(flow_check "$far"); read -r fg tool <<< "$f"
    if [ -n "${fg:-}" ]; then
        DELAY_LINES+=("$(python3 -c 'import sys
g, bps, tool, who = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]; top = bps * 1448 / 1514 / 1e6
print("site link check: one TCP flow %s (%s, 4 s after 2 s): %.1f Mbit/s of %.1f the links allow (%.0f%%): %s"
      % (who, tool, g * 1e3, top, 100 * g * 1e3 / top, "ok" if g * 1e3 >= 0.85 * top else "LOW"))' "$fg" "$one_bps" "$tool" "host${far} (site$ssite)->host0 (site0)")")
    else
        DELAY_LINES+=("site link check: one TCP flow host${far}->host0: the measurement failed")
    fi
    printf '%s\n' "${DELAY_LINES[@]}" | grep -q 'site link check.*LOW' &&
        echo "bench-hosts: warning: one flow across the site links is below 85% of what they allow" >&2
fi
[ ${#DELAY_LINES[@]} -eq 0 ] || printf '%s\n' "${DELAY_LINES[@]}" >> "$OUT/raw/iperf.txt"

if [ -n "$DM_WMEM_MAX_SEEN" ]; then
    echo "$DM_WMEM_MAX_SEEN" > "$tmp/wmem_max"
    # shellcheck disable=SC2016  # $0 and $@ are the inner shell's
    DM_WRAP=(sh -c 'mount --bind "$0" /proc/sys/net/core/wmem_max && exec "$@"' "$tmp/wmem_max")
    ip netns exec "${hostns[0]}" "${DM_WRAP[@]}" cat /proc/sys/net/core/wmem_max | grep -qx "$DM_WMEM_MAX_SEEN" ||
        die "DM_WMEM_MAX_SEEN: the bind mount over /proc/sys/net/core/wmem_max failed"
    grep -q "$tmp/wmem_max\|net/core/wmem_max" /proc/self/mountinfo && die "DM_WMEM_MAX_SEEN: the bind mount leaked"
    DELAY_LINES+=("distmesh ranks read net.core.wmem_max = $DM_WMEM_MAX_SEEN (a bind mount; the kernel's: $(cat /proc/sys/net/core/wmem_max))")
    echo "${DELAY_LINES[-1]}" >> "$OUT/raw/iperf.txt"
fi

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
SITE_BEFORE=()
site_tx() {  # site: what its up0 (its link to the core) has sent
    ip netns exec "${sitens[$1]}" cat /sys/class/net/up0/statistics/tx_bytes 2>/dev/null || echo 0
}
site_bytes_before() { local s; SITE_BEFORE=(); if sited; then for s in $(seq 0 $((SITES - 1))); do SITE_BEFORE+=("$(site_tx "$s")"); done; fi; }
site_bytes_after() {  # system rep
    local s
    if sited; then for s in $(seq 0 $((SITES - 1))); do
        echo "$1 rep=$2 site=$s tx_bytes=$(( $(site_tx "$s") - SITE_BEFORE[s] ))" >> "$OUT/raw/bytes.txt"
    done; fi
}
run_dm() {  # system algo(empty: unset) rep [compress mode]
    local sys=$1 algo=$2 rep=$3 mode=${4:-} r h site store json=$OUT/raw/$1-rep$3.json log=$OUT/raw/$1-rep$3.log
    local before=() enc=
    [ "$ENCRYPT" = 1 ] && enc=DISTMESH_ENCRYPT=$([ "$sys" = distmesh_enc ] && echo 1 || echo 0)
    store=$(mktemp -d "$tmp/store_XXXXXX")
    for h in $(seq 0 $((HOSTS - 1))); do before+=("$(tx_bytes "$h")"); done
    site_bytes_before
    for r in $(seq 0 $((N - 1))); do
        h=$((r / RANKS_PER_HOST)) site=
        sited && [ "$sys" != distmesh_2level ] && site=site$(site_of "$h")
        ip netns exec "${hostns[$h]}" "${DM_WRAP[@]+"${DM_WRAP[@]}"}" env "${DM_ENV_ARGS[@]+"${DM_ENV_ARGS[@]}"}" ${enc:+"$enc"} ${algo:+DISTMESH_ALGO=$algo} ${site:+DISTMESH_SITE=$site} RANK="$r" WORLD_SIZE=$N \
            LOCAL_RANK=$((r % RANKS_PER_HOST)) LOCAL_WORLD_SIZE="$RANKS_PER_HOST" DISTMESH_TEST_HOST_ID=host$h \
            DISTMESH_SOCKET_IFNAME=dmeth0 DISTMESH_STORE="file://$store" DISTMESH_TIMEOUT=60 \
            MASTER_ADDR="$(addr_of 0)" MASTER_PORT=29500 \
            timeout -k 5 "$LAUNCH_TIMEOUT" "$DM_BENCH" -O "$COLL" --sizes "$csv" -n "$ITERS" -w "$WARMUP" -c 1 -a 3 \
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
    site_bytes_after "$sys" "$rep"
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
case $COLL in all_gather) GLOO_ALGO=allgather ;; barrier) GLOO_ALGO=barrier ;; *) GLOO_ALGO=ring_chunked ;; esac
run_gloo() {  # rep
    local rep=$1 r h store log=$OUT/raw/gloo-rep$1.log
    store=$(mktemp -d "$tmp/gloo_XXXXXX")
    site_bytes_before
    for r in $(seq 0 $((N - 1))); do
        h=$((r / RANKS_PER_HOST))
        ip netns exec "${hostns[$h]}" env GLOO_BENCH_HOSTNAME="$(addr_of "$h")" \
            timeout -k 5 "$LAUNCH_TIMEOUT" "$GLOO_BENCH" "$GLOO_ALGO" "$r" "$N" "$store" "$ITERS" "$WARMUP" \
            "${BYTES[@]}" > "$log.$r" 2>&1 &
        pids+=($!)
    done
    if ! wait_ranks; then
        echo "bench-hosts: gloo repetition $rep failed; its logs:" >&2
        tail -n 20 "$log".* >&2
        return 1
    fi
    cat "$log".* > "$log"; rm -f "$log".*
    site_bytes_after gloo "$rep"
    sed -n "s/^gloo_$GLOO_ALGO ranks=$N \(bytes=[0-9]*\) \(us=[0-9.]*\)$/gloo rep=$rep \1 \2 wrong=-1 transport=tcp algo=$GLOO_ALGO/p" \
        "$log" >> "$RAW"
}

SYSTEMS="distmesh_auto distmesh_flat"
if sited; then SYSTEMS="distmesh_auto distmesh_2level distmesh_flat"; fi
[ "$ENCRYPT" = 1 ] && SYSTEMS="distmesh_auto distmesh_enc ${SYSTEMS#distmesh_auto }"
CRYPTO_BPS=0
if [ "$ENCRYPT" = 1 ]; then  # the crypto bound: AES-256-GCM on one core, 64 KiB per call (a record)
    if command -v openssl >/dev/null 2>&1; then
        timeout 60 openssl speed -seconds 2 -bytes 65536 -evp aes-256-gcm > "$OUT/raw/crypto.txt" 2>&1
        CRYPTO_BPS=$(awk '/^AES-256-GCM/ {v = $2; sub(/k$/, "", v); printf "%.0f", v * 1000}' "$OUT/raw/crypto.txt")
    fi
    [ -n "$CRYPTO_BPS" ] && [ "$CRYPTO_BPS" != 0 ] || { echo "bench-hosts: openssl speed gave no AES-256-GCM figure: no crypto bound"; CRYPTO_BPS=0; }
fi
for m in $COMPRESS; do SYSTEMS="$SYSTEMS distmesh_$m"; done
if [ "$COLL" = reduce_scatter ]; then echo "bench-hosts: Gloo not run (reduce_scatter)"
elif [ -n "$GLOO_BENCH" ] && [ -x "$GLOO_BENCH" ]; then SYSTEMS="$SYSTEMS gloo"
else echo "bench-hosts: Gloo not run (no gloo_bench built: needs libgloo-dev)"; fi
echo "bench-hosts: $COLL, $(sited && echo "$SITES sites x $HPS hosts, site link $SITE_RATE$(site_delayed && echo " and $SITE_DELAY ms one way"), ")$HOSTS hosts x $RANKS_PER_HOST ranks, link $RATE${FLOW_RATE:+, $FLOW_RATE per flow}$(delayed && echo ", $DELAY ms one way")${DM_ENV:+, distmesh with $DM_ENV}," \
     "sizes ${SIZES}, $REPS repetitions of $ITERS iterations (+$WARMUP warmup)"
[ ${#IPERF_LINES[@]} -eq 0 ] || printf '  %s\n' "${IPERF_LINES[@]}"
[ ${#DELAY_LINES[@]} -eq 0 ] || printf '  %s\n' "${DELAY_LINES[@]}"
for rep in $(seq 1 "$REPS"); do
    for sys in $SYSTEMS; do
        echo "bench-hosts: repetition $rep/$REPS: $sys" >&2
        case $sys in
            distmesh_auto|distmesh_2level|distmesh_enc) run_dm "$sys" "" "$rep" ;;
            distmesh_flat) run_dm "$sys" flat_ring "$rep" ;;
            distmesh_int8|distmesh_bf16) run_dm "$sys" "" "$rep" "${sys#distmesh_}" ;;
            gloo) run_gloo "$rep" ;;
        esac || exit 1
    done
done
for h in $(seq 0 $((HOSTS - 1))); do
    { echo "== host $h: dmeth0 (egress: what host $h sends)"; ip netns exec "${hostns[$h]}" tc -s class show dev dmeth0
      if sited; then echo "== site$(site_of "$h") router port p$h (egress: what host $h receives)"
      else echo "== bridge port p$h (egress: what host $h receives)"; fi
      ip netns exec "${portns[$h]}" tc -s class show dev "p$h"
    } >> "$OUT/raw/tc-classes.txt" 2>&1
done
for s in $(seq 0 $((SITES - 1))); do
    sited || break
    { echo "== site$s router up0 (egress: what site $s sends to the others)"; ip netns exec "${sitens[$s]}" tc -s class show dev up0
      echo "== core port s$s (egress: what site $s receives)"; ip netns exec "$corens" tc -s class show dev "s$s"
    } >> "$OUT/raw/tc-classes.txt" 2>&1
done

stop_delay_lines  # their counters (packets, drops, how late) into the report
# shellcheck disable=SC2086  # SYSTEMS: one word per system
COLL=$COLL DELAY=$DELAY DM_ENV=$DM_ENV CRYPTO_BPS=$CRYPTO_BPS SITES=$SITES SITE_BPS=$SITE_BPS SITE_DELAY=$(site_delayed && echo "$SITE_DELAY" || echo 0) \
    python3 "$(dirname "$0")/bench_hosts_report.py" "$RAW" "$OUT" "$HOSTS" "$RANKS_PER_HOST" \
    "$RATE_BPS" "$FLOW_BPS" "$OUT/raw/tc-classes.txt" $SYSTEMS || die "report failed"
