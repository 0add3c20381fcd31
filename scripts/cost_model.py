#!/usr/bin/env python3
"""The all_reduce cost model distmesh chooses algorithms by (distmesh.h, >>choice), run on paper.

There is no second copy of the model here: every figure comes from the model's front end
(scripts/cost_model.c), which runs distmesh.h's own cost and choice functions on the layout it is
given. Its link classes are distmesh.h's (`scripts/cost_model.py classes` prints them); the
cross-host class may be given on the command line (alpha, Gbit/s per host) to predict another
network. A new all_reduce algorithm shows up here as a column by itself (the front end lists
every algorithm distmesh.h names).

  scripts/cost_model.py                       docs/performance.md's table: 1k, 4k, 16k ranks, 8 per host,
                                              25 and 100 Gbit/s, alpha 10 us, float32
  scripts/cost_model.py N L GBIT ALPHA_US S   one layout (N ranks, L per host), one size (bytes)
  scripts/cost_model.py sites                 2 sites x 2 hosts x 2 ranks (make bench-hosts SITES=2):
                                              hosts at 2 Gbit/s, one 200 Mbit/s link between the
                                              sites (alpha 100 us each), 1 to 64 MiB of float32
  scripts/cost_model.py classes               the model's link classes and bounds
  scripts/cost_model.py --query               queries on stdin (see scripts/cost_model.c), one
                                              parsed answer per line (tests/test_cost_model.c)

The front end is built with make (build/plain/tools/cost_model), or named by DM_COST_MODEL.
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = "build/plain/tools/cost_model"
FIELDS = ("all_gather", "reduce_scatter", "broadcast", "barrier")  # families, besides all_reduce


def tool():
    """The front end's path: DM_COST_MODEL, else built (or brought up to date) by make."""
    path = os.environ.get("DM_COST_MODEL")
    if path:
        return path
    r = subprocess.run(["make", "-s", "--no-print-directory", "-C", ROOT, TOOL],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit(f"cost_model.py: could not build {TOOL}:\n{r.stdout}")
    return os.path.join(ROOT, TOOL)


def ask(lines):
    """The front end's answers to query lines: one dict per line (strings as printed)."""
    r = subprocess.run([tool()], input="".join(line + "\n" for line in lines),
                       stdout=subprocess.PIPE, text=True)
    out = []
    for text in r.stdout.splitlines():
        fields = dict(tok.split("=", 1) for tok in text.split())
        if "error" in fields:
            sys.exit(f"cost_model.py: the model refused \"{text}\"")
        out.append(fields)
    if len(out) != len(lines):
        sys.exit(f"cost_model.py: {len(lines)} queries, {len(out)} answers (front end exit {r.returncode})")
    return out


def algorithms(answer):
    """The all_reduce algorithms in the answer (us.NAME), in distmesh.h's order, with their cost (us)."""
    return {k[3:]: float(v) for k, v in answer.items() if k.startswith("us.")}


def label(name):
    """flat_rd -> "flat rd", two_level_ring -> "two-level ring" (docs/performance.md's words)."""
    return name.replace("two_level", "two-level").replace("_", " ")


def net_query(n, l, gbit, alpha_us, s):
    """A query for s bytes of float32 on n ranks, l per host, cross-host class (alpha, Gbit/s)."""
    return f"ranks={n} per_host={l} count={max(1, int(s) // 4)} dtype=float32 cross={alpha_us},{8.0 / gbit}"


def human(us):
    return f"{us / 1e3:.1f} ms" if us >= 1000 else f"{us:.0f} us"


def table():
    sizes = [("8 B", 8), ("1 MiB", 1 << 20), ("64 MiB", 64 << 20)]
    rows = [(n, gbit, name, s) for n in (1024, 4096, 16384) for gbit in (25, 100) for name, s in sizes]
    answers = ask([net_query(n, 8, gbit, 10.0, s) for n, gbit, _, s in rows])
    names = list(algorithms(answers[0]))
    print("| ranks | link | size | " + " | ".join(label(k) for k in names) + " | chosen |")
    print("| ---: | ---: | ---: | " + " | ".join("---:" for _ in names) + " | --- |")
    for (n, gbit, name, _), a in zip(rows, answers):
        costs = algorithms(a)
        cells = " | ".join(human(costs[k]) for k in names)
        print(f"| {n} | {gbit} Gbit/s | {name} | {cells} | {label(a['all_reduce'])} |")


def sites_table():
    """The bench's sited layout: every algorithm's cost and the choice, by size; beside it the
    three-level bound (the bytes a reduce-scatter + all-gather across 2 sites put on the site
    link each way: the whole buffer, at 200 Mbit/s), and the family all_gather and
    reduce_scatter take for that size gathered (blocks of size / 8)."""
    sizes = [("1 MiB", 1 << 20), ("16 MiB", 16 << 20), ("64 MiB", 64 << 20)]
    layout = f"ranks=8 per_host=2 per_site=2 dtype=float32 cross=100,{8.0 / 2} site=100,{8.0 / 0.2}"
    answers = ask([f"{layout} count={s // 4}" for _, s in sizes])
    gathers = ask([f"{layout} count={s // 4 // 8}" for _, s in sizes])
    names = list(algorithms(answers[0]))
    print("| size | " + " | ".join(label(k) for k in names) + " | chosen | bound | all_gather, reduce_scatter |")
    print("| ---: | " + " | ".join("---:" for _ in names) + " | --- | ---: | --- |")
    for (name, s), a, g in zip(sizes, answers, gathers):
        costs = algorithms(a)
        cells = " | ".join(human(costs[k]) for k in names)
        print(f"| {name} | {cells} | {label(a['all_reduce'])} | {human(s * 8 / 0.2e3)} | {label(g['all_gather'])} |")


def query():
    """stdin queries -> one line per answer: all_reduce and the families, as the collectives
    record them (dm_last_algorithm: all_reduce's name; the others' family prefix)."""
    lines = [line.strip() for line in sys.stdin if line.strip()]
    for a in ask(lines):
        print(" ".join(f"{k}={a[k]}" for k in ("ranks", "count", "dtype")),
              f"host_of={a.get('host_of', a.get('per_host'))}",
              f"all_reduce={a['all_reduce']}", " ".join(f"{k}={a[k]}" for k in FIELDS))


def main(argv):
    if len(argv) == 6:
        n, l, gbit, alpha, s = int(argv[1]), int(argv[2]), float(argv[3]), float(argv[4]), float(argv[5])
        a = ask([net_query(n, l, gbit, alpha, s)])[0]
        for k, v in algorithms(a).items():
            print(f"{label(k):15s} {human(v)}")
        print(f"{'chosen':15s} {label(a['all_reduce'])}")
    elif argv[1:] == ["sites"]:
        sites_table()
    elif argv[1:] == ["classes"]:
        sys.stdout.write(subprocess.run([tool()], input="classes\n", stdout=subprocess.PIPE, text=True).stdout)
    elif argv[1:] == ["--query"]:
        query()
    elif len(argv) == 1:
        table()
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
