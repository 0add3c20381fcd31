#!/usr/bin/env bash
# The Python tests as one program of `make test` (tests/python.mk builds the package and the
# reference program, then runs this): pytest on python/tests under a hard timeout, its counts
# printed as cmocka's "[  PASSED  ] N" / "[  FAILED  ] N" / "[  SKIPPED ] N" lines for
# tests/run.sh. An argument (run.sh's pattern, a glob) picks tests by name (pytest -k).
# Environment: DM_PY (the interpreter, /usr/bin/python3), DM_PY_LIB (the built package),
# DM_PY_REF (the reference program), DM_PY_TESTS (the files to run, default all of python/tests;
# tests/python_nccl_standin.mk runs test_nccl_standin.py, with DM_PY_NCCL_STANDIN=1, on its own
# build), DM_PY_TIMEOUT (seconds, 480), DM_PY_SAN (the build's
# sanitizer flags: ASan preloads its runtime and leaves torch out; TSan skips, Python is not
# built for it).
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
py=${DM_PY:-/usr/bin/python3}
limit=${DM_PY_TIMEOUT:-480}
args=()
if [ $# -gt 0 ] && [ -n "$1" ]; then
    pat=${1//\*/}
    pat=${pat//\?/}
    [ -n "$pat" ] && args=(-k "$pat")
fi
envs=(PYTHONPATH="${DM_PY_LIB:-}" PYTHONDONTWRITEBYTECODE=1)
case "${DM_PY_SAN:-}" in
    *thread*)
        echo "SKIP: the Python tests do not run under ThreadSanitizer (CPython is not built for it)"
        echo "[  SKIPPED ] 1 test(s)"; exit 0 ;;
    *address*)
        envs+=(LD_PRELOAD="$(${CC:-cc} -print-file-name=libasan.so)" ASAN_OPTIONS=detect_leaks=0
               DM_PY_NO_TORCH=1) ;;
esac
if ! "$py" -c 'import pytest, numpy' 2>/dev/null; then
    echo "SKIP: $py lacks pytest or numpy (python3-pytest, python3-numpy)"
    echo "[  SKIPPED ] 1 test(s)"; exit 0
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cd "$here" || exit 1
read -r -a tests <<< "${DM_PY_TESTS:-.}"
timeout -k 10 "$limit" env "${envs[@]}" "$py" -m pytest -p no:cacheprovider -q -rs "${args[@]+"${args[@]}"}" "${tests[@]}" 2>&1 \
    | tee "$log"
rc=${PIPESTATUS[0]}
count() { grep -Eo "[0-9]+ $1" "$log" | tail -1 | awk '{print $1+0}'; }
p=$(count passed); f=$(count failed); e=$(count 'errors?'); s=$(count skipped)
p=${p:-0}; f=${f:-0}; e=${e:-0}; s=${s:-0}
if [ "$rc" -eq 5 ] && [ ${#args[@]} -gt 0 ]; then exit 0; fi     # the pattern matched no test
[ "$rc" -eq 124 ] && echo "pytest ran past ${limit} s"
echo "[  PASSED  ] $p test(s)."
[ "$s" -gt 0 ] && echo "[  SKIPPED ] $s test(s)."
[ $((f + e)) -gt 0 ] && echo "[  FAILED  ] $((f + e)) test(s)."
exit "$rc"
