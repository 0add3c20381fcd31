#!/usr/bin/env bash
# make test-loaded: the failure cases (shrink, grow, the tcp fault matrix) run again and again on
# a busy machine, where a survivor can be late for a step its peers have passed. Three loads,
# in turn, each for every trial: quiet; beside a CPU hog on every core (a spinning process per
# core, at the ranks' priority); all on one core (taskset -c 0, the hog beside them there too).
# Usage: scripts/test_loaded.sh BUILD TRIALS [LOADS [ONLY]]   (LOADS: "quiet hog onecore", the
# default; ONLY: an extended regex, the cases whose "program|pattern" matches it)
# Prints each failing run's last lines, then "N passed, N failed" (one count per program run).
set -u
build=$1
trials=${2:-20}
loads=${3:-quiet hog onecore}
only=${4:-}
# program, its cmocka pattern: the cases whose outcome must be one status on every survivor
cases=(
    "$build/shrink/test_shrink|test_second_death"
    "$build/shrink/test_shrink|test_back_to_back_shrink"
    "$build/shrink/test_shrink|test_kill_*"
    "$build/grow/test_grow|test_grow_after_shrink"
    "$build/grow/test_grow|test_grow_newcomer_never_comes"
    "$build/tcp/test_tcp_failures|test_fault_*"
    "$build/tcp/test_tcp_failures|test_split_kill"
)
kept=()
for c in "${cases[@]}"; do
    [ -n "$only" ] && ! [[ $c =~ $only ]] && continue
    [ -x "${c%%|*}" ] || { echo "test-loaded: ${c%%|*} is not built"; exit 2; }
    kept+=("$c")
done
[ ${#kept[@]} -gt 0 ] || { echo "test-loaded: no case matches '$only'"; exit 2; }
cases=("${kept[@]}")
hogs=()
hog_start() {    # $1: cores to spin on
    local i
    for ((i = 0; i < $1; i++)); do
        timeout 3600 bash -c 'while :; do :; done' &
        hogs+=($!)
    done
}
hog_stop() {
    local p
    for p in "${hogs[@]+"${hogs[@]}"}"; do kill "$p" 2>/dev/null; done
    wait "${hogs[@]+"${hogs[@]}"}" 2>/dev/null
    hogs=()
}
trap hog_stop EXIT
passed=0; failed=0
ncpu=$(nproc)
for load in $loads; do
    pin=()
    case "$load" in
        quiet) ;;
        hog) hog_start "$ncpu" ;;
        onecore) pin=(taskset -c 0); hog_start 1 ;;
        *) echo "test-loaded: unknown load '$load' (quiet, hog, onecore)"; exit 2 ;;
    esac
    for ((t = 1; t <= trials; t++)); do
        for c in "${cases[@]}"; do
            prog=${c%%|*}; pat=${c#*|}
            log=$(mktemp)
            # one kill case per trial and program run (DM_SHRINK_TRIALS=1); a hang is a failure
            DM_SHRINK_TRIALS=1 timeout -k 10 300 "${pin[@]+"${pin[@]}"}" "$prog" "$pat" >"$log" 2>&1
            rc=$?
            if [ "$rc" -eq 0 ] && grep -q '^\[  PASSED  \]' "$log" && ! grep -q '^\[  FAILED  \]' "$log"; then
                passed=$((passed + 1))
            else
                failed=$((failed + 1))
                echo "FAILED ($load, trial $t, exit $rc): $(basename "$prog") $pat"
                grep -v '^distmesh rank' "$log" | grep -E 'ERROR|rank [0-9]+:|FAILED' | head -8 | sed 's/^/    /'
            fi
            rm -f "$log"
        done
    done
    hog_stop
    echo "test-loaded: after load '$load': $passed passed, $failed failed"
done
echo "loaded: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
