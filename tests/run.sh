#!/usr/bin/env bash
# Runs each test program under a hard timeout (seconds, first argument), adds up cmocka's
# per-program counts and prints the closing "N passed, N failed" line. A program that dies,
# times out or prints no count is one failure.
set -u
limit=$1; shift
passed=0; failed=0; skipped=0; bad=()
for bin in "$@"; do
    log=$(mktemp)
    echo "== $bin"
    timeout -k 10 "$limit" "$bin" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    p=$(grep -Eo '^\[  PASSED  \] [0-9]+' "$log" | awk '{s+=$4} END{print s+0}')
    f=$(grep -Eo '^\[  FAILED  \] [0-9]+' "$log" | awk '{s+=$4} END{print s+0}')
    s=$(grep -Eo '^\[  SKIPPED \] [0-9]+' "$log" | awk '{s+=$4} END{print s+0}')
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    if [ "$rc" -ne 0 ] || [ $((p + f + s)) -eq 0 ]; then
        [ "$f" -eq 0 ] && failed=$((failed + 1))
        bad+=("$bin (exit $rc$( [ "$rc" -eq 124 ] && echo ', timed out'))")
    fi
    rm -f "$log"
done
for b in "${bad[@]+"${bad[@]}"}"; do echo "FAILED: $b"; done
echo "tests: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
