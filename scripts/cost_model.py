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


def max_segments(s, l, h):
    """distmesh.h _dm_sch_2l_max_segments: a rail's block of a segment about 512 KiB or more, at
    most 64 segments."""
    k = max(1, min(64, int(s) // ((512 << 10) * l)))
    while k > 1 and s // k < l * h:
        k -= 1
    return k


def middle(l, h, net, s, ring, k):
    """distmesh.h _dm_cost_2l_middle: the host's ring and the l rails (ring or recursive
    doubling) over k segments: one after the other when k = 1, else pipelined, the larger of the
    two plus the host's share of one segment."""
    host = cost(SHM, 2 * (l - 1) * k, s / l / k)          # the host's reduce-scatter + all-gather
    # l rails of s/l bytes: a rail step moves s/(l h), l of them share the host's link
    rails = cost(net, 2 * (h - 1) * k, s / h / k) if ring else cost(net, math.log2(h) * k, s / k)
    return host + rails if k == 1 else max(host, rails) + host / k


def two_level_rails(l, h, net, s):
    """Rails as rings or by recursive doubling, the cheaper, each with the segment count the
    code picks (distmesh.h _dm_pick_2l_segments: of 1, 2, 4, ... and the most, the cheapest)."""
    best = None
    for ring in (True, False):
        # distmesh.h _dm_sch_2l_pipelined: R > 1 and each rail one transfer (a ring, or two hosts)
        most = max_segments(s, l, h) if l > 1 and (ring or h <= 2) and s // l >= h else 1
        ks = sorted({1, most} | {k for k in (2 ** i for i in range(1, 7)) if k < most})
        t = min(middle(l, h, net, s, ring, k) for k in ks)
        best = t if best is None else min(best, t)
    return best


def algorithms(n, l, net, s):
    """Microseconds per all_reduce of s bytes on n ranks, l per host (contiguous, powers of 2)."""
    h = n // l
    return {
        "flat ring": cost(net, 2 * (n - 1), s / n),
        # rounds inside the host, then rounds where all l ranks of a host send across at once
        "flat rd": cost(SHM, math.log2(l), s) + cost(net, math.log2(h), s * l),
        # l rails of s/l bytes: a rail step moves s/(l h), l of them share the host's link
        "two-level ring": two_level_rails(l, h, net, s),
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
