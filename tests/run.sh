#!/usr/bin/env bash
# Runs each test program under a hard timeout (seconds, first argument), adds up cmocka's
# per-program counts and prints the closing "N passed, N failed" line, after the time each
# program took (slowest first). A program that dies,
# times out or prints no count is one failure.
# DM_TEST_PATTERN (make test T=...) picks tests: programs whose name matches run whole, the
# others run only their cmocka tests whose names match (a program with none is left out). A
# pattern without * or ? matches anywhere in the name; with them it is a glob on the whole name.
set -u
limit=$1; shift
pat=${DM_TEST_PATTERN:-}
case "$pat" in *'*'*|*'?'*) glob=$pat ;; '') glob='' ;; *) glob="*$pat*" ;; esac
passed=0; failed=0; skipped=0; bad=(); ran=0; times=()
for bin in "$@"; do
    args=()
    if [ -n "$glob" ]; then
        # shellcheck disable=SC2254
        case "$(basename "$bin")" in $glob) ;; *) args=("$glob") ;; esac
    fi
    log=$(mktemp)
    t0=$SECONDS
    echo "== $bin${args[0]:+ (tests matching $glob)}"
    timeout -k 10 "$limit" "$bin" "${args[@]+"${args[@]}"}" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    times+=("$((SECONDS - t0)) s  $bin")
    p=$(grep -Eo '^\[  PASSED  \] [0-9]+' "$log" | awk '{s+=$4} END{print s+0}')
    f=$(grep -Eo '^\[  FAILED  \] [0-9]+' "$log" | awk '{s+=$4} END{print s+0}')
    s=$(grep -Eo '^\[  SKIPPED \] [0-9]+' "$log" | awk '{s+=$4} END{print s+0}')
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    if [ ${#args[@]} -gt 0 ] && [ "$rc" -eq 0 ] && [ $((p + f + s)) -eq 0 ]; then
        rm -f "$log"; continue                  # the pattern matched none of its tests
    fi
    ran=$((ran + 1))
    if [ "$rc" -ne 0 ] || [ $((p + f + s)) -eq 0 ]; then
        [ "$f" -eq 0 ] && failed=$((failed + 1))
        bad+=("$bin (exit $rc$( [ "$rc" -eq 124 ] && echo ', timed out'))")
    fi
    rm -f "$log"
done
if [ -n "$glob" ] && [ "$ran" -eq 0 ]; then
    echo "no test program or test name matches \"$glob\""; failed=$((failed + 1))
fi
# the slowest programs first: what a shorter CI run would start from
echo "time per program (s), slowest first:"
printf '%s\n' "${times[@]+"${times[@]}"}" | sort -rn | head -15 | sed 's/^/  /'
for b in "${bad[@]+"${bad[@]}"}"; do echo "FAILED: $b"; done
echo "tests: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
