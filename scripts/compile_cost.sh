#!/usr/bin/env bash
# What the implementation's translation unit costs to compile (distmesh.c: the implementation
# and nothing else), in user CPU seconds, medians of REPS runs taken interleaved (A, B, A, B...)
# so that a loaded machine slows both alike; read the ratios, not the seconds.
#   scripts/compile_cost.sh [REPS] [BASE_DIR]
# A is BASE_DIR's distmesh.c (another checkout, e.g. `git archive <commit> | tar -x -C /tmp/base`),
# or, without BASE_DIR, this tree with -DDISTMESH_OPTIMIZE_ALL (everything at the command line's
# level: the cost before distmesh.h >>compile cost). B is this tree as it is.
# Rows: gcc and clang (when installed) x -O2 / -O3 x without / with DISTMESH_TCP.
set -eu
reps=${1:-3}
base=${2:-}
here=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
uv=$(pkg-config --cflags libuv 2>/dev/null || true)
cpu() {   # cpu DIR FLAGS...: user seconds of one compile (bash's time: the compiler's children too)
    local dir=$1; shift
    local TIMEFORMAT=%U
    { time ( cd "$dir" && "$@" -c distmesh.c -o "$out/x.o" 2> "$out/err" ) ; } 2>&1 || { cat "$out/err" >&2; exit 1; }
}
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
printf '%-6s %-4s %-4s %8s %8s %7s\n' cc opt tcp A_s B_s B/A
for cc in gcc clang; do
    command -v "$cc" >/dev/null || continue
    for opt in -O2 -O3; do
        for tcp in no yes; do
            flags=("$cc" -std=c11 "$opt" -I.)
            [ "$tcp" = yes ] && flags+=(-DDISTMESH_TCP $uv)
            : > "$out/a"; : > "$out/b"
            for _ in $(seq "$reps"); do
                if [ -n "$base" ]; then cpu "$base" "${flags[@]}" >> "$out/a"
                else cpu "$here" "${flags[@]}" -DDISTMESH_OPTIMIZE_ALL >> "$out/a"; fi
                cpu "$here" "${flags[@]}" >> "$out/b"
            done
            a=$(median < "$out/a"); b=$(median < "$out/b")
            printf '%-6s %-4s %-4s %8s %8s %7s\n' "$cc" "$opt" "$tcp" "$a" "$b" \
                "$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", b / a }')"
        done
    done
done
