#!/usr/bin/env bash
# dm_reduce_local before and after: bench/reduce_local.c built against BASE_DIR's headers (A) and
# this tree's (B), each with the implementation in its own TU compiled like a user's (cc -O2 and
# -O3), run interleaved ROUNDS times; prints each case's median time per call and B/A.
#   scripts/reduce_local_ab.sh BASE_DIR [ROUNDS]
set -eu
base=$1
rounds=${2:-5}
here=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for opt in -O2 -O3; do
    for side in a b; do
        dir=$([ $side = a ] && echo "$base" || echo "$here")
        cc -std=c11 "$opt" -I"$dir" -pthread "$here/bench/reduce_local.c" "$dir/distmesh.c" -o "$out/$side$opt" -lm
    done
    for _ in $(seq "$rounds"); do
        "$out/a$opt" --reps 7 >> "$out/a$opt.txt"
        "$out/b$opt" --reps 7 >> "$out/b$opt.txt"
    done
    awk -v opt="$opt" '
        { key = $2 " " $3 " " $4; split($5, u, "="); v[FILENAME, key, ++n[FILENAME, key]] = u[2]; keys[key] = 1 }
        function med(f, k,   m, i, j, t, a) { m = n[f, k]; for (i = 1; i <= m; i++) a[i] = v[f, k, i]
            for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
            return (m % 2) ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2 }
        END { for (k in keys) printf "%s %-44s A_us=%9.3f B_us=%9.3f B/A=%.3f\n", opt, k, med(ARGV[1], k), med(ARGV[2], k),
                  med(ARGV[2], k) / med(ARGV[1], k) }' "$out/a$opt.txt" "$out/b$opt.txt" | sort
done
