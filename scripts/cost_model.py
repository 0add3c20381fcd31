#!/usr/bin/env python3
"""The all_reduce cost model distmesh chooses algorithms by (distmesh.h, >>choice), run on paper.

Hockney: a message of b bytes over a link of class c costs alpha_c + b * beta_c; a phase's steps
run on every link at once and cost the slowest; flows that leave one host share its link.
Ranks contiguous by host, counts powers of two (the code's model also handles the rest). Classes as written in distmesh.h (shared memory
1 us / 8 GB/s); the cross-host class is given on the command line (alpha, Gbit/s per host).

  scripts/cost_model.py                       the README's table: 1k, 4k, 16k ranks, 8 per host,
                                              25 and 100 Gbit/s, alpha 10 us
  scripts/cost_model.py N L GBIT ALPHA_US S   one layout (N ranks, L per host), one size (bytes)
"""
import math
import sys

SHM = (1.0, 0.125)          # alpha us, beta ns/B (distmesh.h: _dm_cost_shm)


def cost(link, steps, b):
    return steps * (link[0] + b * link[1] * 1e-3)


def algorithms(n, l, net, s):
    """Microseconds per all_reduce of s bytes on n ranks, l per host (contiguous, powers of 2)."""
    h = n // l
    host = cost(SHM, 2 * (l - 1), s / l)                  # the host's reduce-scatter + all-gather
    return {
        "flat ring": cost(net, 2 * (n - 1), s / n),
        # rounds inside the host, then rounds where all l ranks of a host send across at once
        "flat rd": cost(SHM, math.log2(l), s) + cost(net, math.log2(h), s * l),
        # l rails of s/l bytes: a rail step moves s/(l h), l of them share the host's link
        "two-level ring": host + min(cost(net, 2 * (h - 1), s / h), cost(net, math.log2(h), s)),
        "two-level rd": cost(SHM, 2 * (l - 1), s) + cost(net, math.log2(h), s),
    }


def net_class(gbit, alpha_us):
    return (alpha_us, 8.0 / gbit)      # ns per byte at gbit Gbit/s


def human(us):
    return f"{us / 1e3:.1f} ms" if us >= 1000 else f"{us:.0f} us"


def table():
    sizes = [("8 B", 8), ("1 MiB", 1 << 20), ("64 MiB", 64 << 20)]
    print("| ranks | link | size | flat ring | flat rd | two-level ring | two-level rd | chosen |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for n in (1024, 4096, 16384):
        for gbit in (25, 100):
            for name, s in sizes:
                a = algorithms(n, 8, net_class(gbit, 10.0), s)
                best = min(a, key=a.get)
                cells = " | ".join(human(a[k]) for k in ("flat ring", "flat rd", "two-level ring", "two-level rd"))
                print(f"| {n} | {gbit} Gbit/s | {name} | {cells} | {best} |")


if __name__ == "__main__":
    if len(sys.argv) == 6:
        n, l, gbit, alpha, s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
        for k, v in algorithms(n, l, net_class(gbit, alpha), s).items():
            print(f"{k:15s} {human(v)}")
    else:
        table()
