#!/usr/bin/env python3
"""Report of scripts/bench_hosts.sh: per system an nccl-tests style table (medians over the
repetitions), the bounds of the shaped link, and the ratios between the systems.
   bench_hosts_report.py RAW OUT HOSTS RANKS_PER_HOST RATE_BPS FLOW_BPS TC_CLASSES SYSTEM...
DELAY (environment, ms, default 0): the one-way delay of every host link (make bench-hosts DELAY=):
the bounds then gain it, and raw/delay_line.txt (the delay line's counters) is printed.
DM_ENV (environment): what was added to the distmesh ranks' environment, for the headers.
SITES (environment, default 1), SITE_BPS, SITE_DELAY (ms): with SITES > 1 the hosts form SITES sites
joined by one link each at SITE_BPS per direction (make bench-hosts SITES=): the headers say so, and
a section adds the three-level bound per size, 2(n-1)/n x size / SITE_BPS (with a delay also
that + DELAY + SITE_DELAY), the ratios of distmesh_auto over it, over distmesh_2level and over Gloo, the
site link check (raw/iperf.txt) and the bytes each site link sent per launch ("<system> rep=<r> site=<s> tx_bytes=<B>" lines in raw/bytes.txt).
COLL (environment, default all_reduce; all_gather, reduce_scatter, barrier): the collective timed;
every bound and busbw then takes its factor, 2(N-1)/N for all_reduce and (N-1)/N for the gathers
(sizes as dm_bench counts them: all_gather's bytes received, reduce_scatter's sent); a barrier has
no bytes: its section gives the times, the ratios and the one-way-delay floor instead of bounds.
RAW lines: "<system> rep=<r> bytes=<B> us=<time> wrong=<n, -1: not checked> transport=<t> algo=<a or ->".
Writes OUT/table.txt (what it prints), OUT/results.csv (every launch) and OUT/results.json."""
import json
import math
import os
import re
import statistics
import sys

DESCRIPTION = {
    "distmesh_auto": "distmesh, DISTMESH_ALGO unset (auto)",
    "distmesh_flat": "distmesh, DISTMESH_ALGO=flat_ring",
    "distmesh_enc": "distmesh, DISTMESH_ALGO unset (auto), DISTMESH_ENCRYPT=1 (AES-256-GCM links between hosts)",
    "distmesh_int8": "distmesh, dm_all_reduce_compressed int8 (no error-feedback state)",
    "distmesh_bf16": "distmesh, dm_all_reduce_compressed bf16 (no error-feedback state)",
    "gloo": "Gloo allreduce_ring_chunked (Debian libgloo), one process per rank",
}
SITE_DESCRIPTION = {  # SITES > 1
    "distmesh_auto": "distmesh, DISTMESH_ALGO unset (auto), DISTMESH_SITE=site<s>",
    "distmesh_2level": "distmesh, DISTMESH_ALGO unset (auto), no DISTMESH_SITE (the library sees hosts only)",
    "distmesh_flat": "distmesh, DISTMESH_ALGO=flat_ring, DISTMESH_SITE=site<s>",
    "distmesh_int8": "distmesh, dm_all_reduce_compressed int8 (no error-feedback state), DISTMESH_SITE=site<s>",
    "distmesh_bf16": "distmesh, dm_all_reduce_compressed bf16 (no error-feedback state), DISTMESH_SITE=site<s>",
}


def load(path):
    """(system, bytes) -> [(rep, us, wrong)]; labels: (system, bytes) -> algorithms, system -> transports."""
    runs, labels = {}, {}
    for line in open(path):
        m = re.match(r"(\S+) rep=(\d+) bytes=(\d+) us=([0-9.]+) wrong=(-?\d+) transport=(\S+) algo=(\S+)$",
                     line.strip())
        if m:
            runs.setdefault((m[1], int(m[3])), []).append((int(m[2]), float(m[4]), int(m[5])))
            labels.setdefault((m[1], int(m[3])), set()).add(m[7])
            labels.setdefault(m[1], set()).add(m[6])
    return runs, labels


def fmt_us(us):
    return f"{us:9.0f}" if us >= 10000 else f"{us:9.1f}" if us >= 100 else f"{us:9.2f}"


def fmt_ms(us):
    return f"{us / 1000:.1f} ms" if us >= 1000 else f"{us:.0f} us"


def flow_classes(path):
    """Leaf flow classes (1:100..1:1ff) that carried more than 1 MB, per device section."""
    used, section = {}, None
    try:
        text = open(path).read().splitlines()
    except OSError:
        return used
    cls = None
    for line in text:
        if line.startswith("== "):
            section = line[3:].split(" (")[0]
            used[section] = 0
        m = re.match(r"class htb 1:([0-9a-f]+) ", line)
        if m:
            cls = int(m[1], 16)
        m = re.match(r"\s*Sent (\d+) bytes", line)
        if m and section and cls is not None and 0x100 <= cls <= 0x1FF and int(m[1]) > 1_000_000:
            used[section] += 1
    return used


def bytes_sent(path, what="host"):
    """system -> bytes a host (what="site": a site's link) sent per launch (median over the launches of
    the mean over the hosts or sites)."""
    per = {}
    try:
        for line in open(path):
            m = re.match(r"(\S+) rep=(\d+) " + what + r"=(\d+) tx_bytes=(\d+)$", line.strip())
            if m:
                per.setdefault(m[1], {}).setdefault(int(m[2]), []).append(int(m[4]))
    except OSError:
        return {}
    return {s: statistics.median(sum(v) / len(v) for v in reps.values()) for s, reps in per.items()}


def barrier_section(say, systems, med, labels, cross_us, sites):
    """COLL=barrier: no bytes, so no bandwidth bounds; each system's time (one row of 0 bytes),
    distmesh_auto's ratios to the others, and the floor: one one-way crossing of the slowest
    link (every rank must hear that the farthest one arrived). Returns the JSON's summary."""
    say(f"# Barrier: the floor is one one-way delay between the farthest hosts, {cross_us / 1000:g} ms here"
        + (" (DELAY + SITE_DELAY)" if sites > 1 else " (DELAY)"))
    names = [s for s in systems if (s, 0) in med]
    say("#  " + "".join(f"  {s:>16s}" for s in names) + "".join(f"  {'auto/' + s.replace('distmesh_', ''):>14s}"
                                                              for s in names if s != "distmesh_auto")
        + ("  auto/floor" if cross_us else ""))
    auto = med.get(("distmesh_auto", 0))
    row = "   " + "".join(f"  {med[(s, 0)] / 1000:13.3f} ms" for s in names)
    entry = {"bytes": 0, "algorithms": {s: sorted(labels.get((s, 0), [])) for s in names},
             "median_us": {s: med[(s, 0)] for s in names}, "ratios": {}}
    for s in names:
        if s != "distmesh_auto" and auto:
            entry["ratios"]["auto/" + s.replace("distmesh_", "")] = auto / med[(s, 0)]
            row += f"  {auto / med[(s, 0)]:14.2f}"
    if cross_us and auto:
        entry["floor_us"] = cross_us
        row += f"  {auto / cross_us:10.2f}"
    say(row)
    say("# algorithms: " + ", ".join(f"{s} {'/'.join(entry['algorithms'][s]) or '-'}" for s in names))
    return [entry]


def encryption_section(say, summary, med, crypto_bps, factor, n):
    """distmesh_enc against distmesh_auto per size, and the crypto bound: each rank seals what it
    sends and opens what it receives, factor x (N-1)/N x S each way, at openssl's AES-256-GCM
    speed on one core. Adds crypto_us to the summary's entries."""
    say(f"# Encrypted links (distmesh_enc: DISTMESH_ENCRYPT=1) against plain (distmesh_auto): crypto bound "
        + (f"{crypto_bps / 1e9:.2f} GB/s per core (openssl speed -evp aes-256-gcm, 64 KiB; raw/crypto.txt)"
           if crypto_bps else "unknown (no openssl speed figure)"))
    say("#   crypto/rank: sealing and opening one rank's bytes at that speed, 2 x "
        f"{factor:g}(N-1)/N x S; (auto+crypto)/auto: the ratio if none of it overlapped the transfer and"
        " each rank had its core to itself")
    say("#       size           auto            enc   enc/auto   crypto/rank  (auto+crypto)/auto")
    for entry in summary:
        b = entry["bytes"]
        auto, enc = med.get(("distmesh_auto", b)), med.get(("distmesh_enc", b))
        crypto = 2 * factor * (n - 1) / n * b / crypto_bps * 1e6 if crypto_bps else None
        entry["crypto_us"] = crypto
        say(f"{b:12d}  {fmt_ms(auto) if auto else '-':>13s}  {fmt_ms(enc) if enc else '-':>13s}"
            f"  {enc / auto if auto and enc else float('nan'):9.2f}  {fmt_ms(crypto) if crypto else '-':>12s}"
            f"  {(auto + crypto) / auto if auto and crypto else float('nan'):18.2f}")


def main():
    raw, out, hosts, per_host, rate, flow = sys.argv[1:7]
    tc_classes, systems = sys.argv[7], sys.argv[8:]
    hosts, per_host, rate, flow = int(hosts), int(per_host), float(rate), float(flow)
    delay_us = float(os.environ.get("DELAY") or 0) * 1000
    dm_env = os.environ.get("DM_ENV", "").strip()
    sites = int(os.environ.get("SITES") or 1)
    site_bps = float(os.environ.get("SITE_BPS") or 0)
    site_delay_ms = float(os.environ.get("SITE_DELAY") or 0)
    crypto_bps = float(os.environ.get("CRYPTO_BPS") or 0)
    describe = dict(DESCRIPTION, **(SITE_DESCRIPTION if sites > 1 else {}))
    coll = os.environ.get("COLL") or "all_reduce"
    factor = 2.0 if coll == "all_reduce" else 1.0       # bytes on a link per byte of size, times (N-1)/N
    kt = "2" if coll == "all_reduce" else ""
    if coll == "all_gather":
        describe["gloo"] = "Gloo AllgatherRing (Debian libgloo), one process per rank"
    if coll == "barrier":
        describe["gloo"] = "Gloo BarrierAllToAll (Debian libgloo), one process per rank"
    n = hosts * per_host
    runs, labels = load(raw)
    sizes = sorted({b for (_, b) in runs})
    med = {k: statistics.median(t for _, t, _ in v) for k, v in runs.items()}
    lines = []
    say = lines.append
    site_check = []
    try:
        for line in open(f"{out}/raw/iperf.txt"):
            if line.strip():
                say(f"# {line.strip()}")
                if line.startswith(("site link check", "round trip host", "site delay line")) and sites > 1:
                    site_check.append(line.strip())
    except OSError:
        pass
    for s in systems:
        say(f"# {describe.get(s, s)}: {n} ranks on {hosts} hosts x {per_host}, link "
            + (f"{rate / 1e9:g} Gbit/s" if rate else "unshaped")
            + (f", {flow / 1e6:g} Mbit/s per flow" if flow else "")
            + (f", {delay_us / 1000:g} ms one way" if delay_us else "")
            + (f"; {sites} sites x {hosts // sites} hosts, site link {site_bps / 1e6:g} Mbit/s"
               + (f" and {site_delay_ms:g} ms one way" if site_delay_ms else "") if sites > 1 else "")
            + (f", {dm_env}" if dm_env and s.startswith("distmesh") else "")
            + f"; transport {'/'.join(sorted(labels.get(s, {'-'})))}")
        what = "barrier" if coll == "barrier" else f"{coll}, float32{' sum' if coll != 'all_gather' else ''} in place"
        say(f"# {what}; time: median over the launches of the slowest rank's mean"
            + (f"; busbw = algbw x {kt}(n-1)/n" if coll != "barrier" else ""))
        say("#       size         count      type   redop    root      time   algbw   busbw #wrong  launches  min(us)  max(us)"
            "  algorithm")
        say("#        (B)    (elements)                                (us)  (GB/s)  (GB/s)")
        for b in sizes:
            v = runs.get((s, b))
            if not v:
                continue
            us = med[(s, b)]
            algbw = b / (us * 1e-6) / 1e9
            wrong = max(w for _, _, w in v)
            wtxt = "N/A" if wrong < 0 else str(sum(max(w, 0) for _, _, w in v))
            ts = [t for _, t, _ in v]
            say(f"{b:12d}  {b // 4:12d}  {'float':>8s}  {'sum' if coll in ('all_reduce', 'reduce_scatter') else '-':>6s}  {-1:6d} {fmt_us(us)}  {algbw:6.3f}  "
                f"{algbw * factor * (n - 1) / n:6.3f}  {wtxt:>5s}  {len(v):8d} {min(ts):8.0f} {max(ts):8.0f}"
                f"  {'/'.join(sorted(labels.get((s, b), {'-'})))}")
        say("#")
    summary, site_summary = [], []
    if coll == "barrier":
        summary = barrier_section(say, systems, med, labels, delay_us + site_delay_ms * 1000, sites)
    else:
        # bounds: bytes each host's link carries in one direction, over its rate
        say(f"# Bounds at R = {rate / 1e9:g} Gbit/s per host link and direction (S = size):" if rate else
            "# Links unshaped (RATE=none): no bounds (the columns say -):")
        say(f"#   flat ring (host by host) {kt}(N-1)/N x S / R, N = {n};  two-level {kt}(H-1)/H x S / R, H = {hosts}"
            + (f";  single flow {kt}(N-1)/N x S / F, F = {flow / 1e6:g} Mbit/s (flat ring, one socket per peer)" if flow else ""))
        if delay_us:
            say(f"#   with D = {delay_us / 1000:g} ms one way host to host: 2-level+D = the two-level bound + D (the last"
                " bytes still cross one link after the link is done), a lower bound for any H; log2(H) x D = the"
                " latency floor of recursive doubling between hosts (the floor of any all-reduce is D: every host"
                " sending to all the others at once)")
        head = "#       size   flat bound  2-level bound" + ("  1-flow bound" if flow else "")
        if delay_us:
            head += "     2-level+D  log2(H) x D"
        cols = list(systems)
        head += "".join(f"  {c:>14s}" for c in cols)
        ratio_names = []
        if "distmesh_auto" in systems and "distmesh_flat" in systems:
            ratio_names.append(("auto/flat", "distmesh_auto", "distmesh_flat"))
        if "distmesh_auto" in systems and "gloo" in systems:
            ratio_names.append(("auto/gloo", "distmesh_auto", "gloo"))
        if "distmesh_enc" in systems and "distmesh_auto" in systems:
            ratio_names.append(("enc/auto", "distmesh_enc", "distmesh_auto"))
        for m in ("int8", "bf16"):
            if f"distmesh_{m}" in systems and "distmesh_auto" in systems:
                ratio_names.append((f"{m}/auto", f"distmesh_{m}", "distmesh_auto"))
            if f"distmesh_{m}" in systems and "gloo" in systems:
                ratio_names.append((f"{m}/gloo", f"distmesh_{m}", "gloo"))
        head += "".join(f"  {r[0]:>9s}" for r in ratio_names) + "  auto/2-level  flat/bound"
        if delay_us:
            head += "  auto/(2-level+D)  auto/(log2(H) x D)"
        say(head)
        summary = []
        for b in sizes:
            bits = b * 8.0
            flat_b = factor * (n - 1) / n * bits / rate * 1e6 if rate else None
            two_b = factor * (hosts - 1) / hosts * bits / rate * 1e6 if rate else None
            one_b = factor * (n - 1) / n * bits / flow * 1e6 if flow else None
            row = (f"{b:12d}  {fmt_ms(flat_b) if rate else '-':>11s}  {fmt_ms(two_b) if rate else '-':>13s}"
                   + (f"  {fmt_ms(one_b):>12s}" if flow else ""))
            two_d = two_b + delay_us if rate else None
            floor_d = math.ceil(math.log2(hosts)) * delay_us
            if delay_us:
                row += f"  {fmt_ms(two_d):>12s}  {fmt_ms(floor_d):>11s}"
            entry = {"bytes": b, "algorithms": {c: sorted(labels.get((c, b), [])) for c in cols}, "flat_bound_us": flat_b, "two_level_bound_us": two_b, "single_flow_bound_us": one_b,
                     "median_us": {}, "ratios": {}}
            for c in cols:
                us = med.get((c, b))
                row += f"  {fmt_ms(us) if us else '-':>14s}"
                if us:
                    entry["median_us"][c] = us
            for name, a, z in ratio_names:
                if (a, b) in med and (z, b) in med:
                    r = med[(a, b)] / med[(z, b)]
                    entry["ratios"][name] = r
                    row += f"  {r:9.2f}"
                else:
                    row += f"  {'-':>9s}"
            auto, flat = med.get(("distmesh_auto", b)), med.get(("distmesh_flat", b))
            row += f"  {auto / two_b:11.2f}" if auto and rate else f"  {'-':>11s}"
            row += f"  {flat / max(flat_b, one_b or 0):10.2f}" if flat and rate else f"  {'-':>10s}"
            if delay_us:
                row += f"  {auto / two_d:16.2f}  {auto / floor_d:18.2f}" if auto else f"  {'-':>16s}  {'-':>18s}"
                entry["two_level_plus_delay_us"] = two_d
                entry["delay_floor_us"] = floor_d
            say(row)
            summary.append(entry)
        say("# ratios below 1: the first system is faster; auto/2-level: auto over the two-level bound; flat/bound: the"
            " flat ring over its bound" + (" (the single-flow one, the larger)" if flow else ""))
        say("# The bounds count wire bytes; TCP's payload is at most 1448 of each 1514-byte frame (MTU 1500, timestamps),"
            " so a perfect run sits at 1.05x its bound.")
        if "distmesh_enc" in systems:
            encryption_section(say, summary, med, crypto_bps, factor, n)
        sent = bytes_sent(f"{out}/raw/bytes.txt")
        if sent:
            say("# MB each host sent per launch (its link's tx counter, frames with headers; median over the launches,"
                " then the mean over the hosts), every size and call of the launch together:")
            say("#   " + ", ".join(f"{s}: {sent[s] / 1e6:.1f}" for s in systems if s in sent))
        site_summary = []
        if sites > 1:
            say(f"# Sites: {sites} x {hosts // sites} hosts, each site joined to the others by one link at Rs ="
                f" {site_bps / 1e6:g} Mbit/s per direction" + (f", {site_delay_ms:g} ms one way site to site" if site_delay_ms else "")
                + f"; three-level bound {kt}(n-1)/n x S / Rs, n = {sites} (what {coll}"
                + (" (a reduce-scatter and an all-gather)" if coll == "all_reduce" else "") + " across the"
                " sites put on each site link in each direction)")
            heads = [("auto/bound", "distmesh_auto", None), ("auto/2level", "distmesh_auto", "distmesh_2level"),
                     ("auto/gloo", "distmesh_auto", "gloo"), ("2level/bound", "distmesh_2level", None)]
            cross_us = delay_us + site_delay_ms * 1000  # one way, host to host across the sites
            if cross_us:
                say(f"#   3-level+D: the three-level bound + D = {cross_us / 1000:g} ms one way between hosts of two sites"
                    + (" (DELAY + SITE_DELAY)" if delay_us and site_delay_ms else "")
                    + " (the last bytes still cross after the link is done), a lower bound; auto/(3-level+D) uses it")
                heads.append(("auto/(3-level+D)", "distmesh_auto", "+D"))
            say("#       size  3-level bound" + ("      3-level+D" if cross_us else "")
                + "".join(f"  {h:>{max(12, len(h))}s}" for h, _, _ in heads))
            for b in sizes:
                bound = factor * (sites - 1) / sites * b * 8.0 / site_bps * 1e6
                bound_d = bound + cross_us
                row = f"{b:12d}  {fmt_ms(bound):>13s}" + (f"  {fmt_ms(bound_d):>13s}" if cross_us else "")
                entry = {"bytes": b, "three_level_bound_us": bound, "ratios": {}}
                if cross_us:
                    entry["three_level_plus_delay_us"] = bound_d
                for h, a, z in heads:
                    num, den = med.get((a, b)), (bound_d if z == "+D" else med.get((z, b)) if z else bound)
                    w = max(12, len(h))
                    if num and den:
                        entry["ratios"][h] = num / den
                        row += f"  {num / den:{w}.2f}"
                    else:
                        row += f"  {'-':>{w}s}"
                say(row)
                site_summary.append(entry)
                for e in summary:
                    if e["bytes"] == b:
                        e.update({k: v for k, v in entry.items() if k.startswith("three_level")})
                        e["ratios"].update({f"site {k}": v for k, v in entry["ratios"].items()})
            say("# auto/bound: distmesh_auto over the three-level bound (a perfect run: about 1.05, TCP's headers);"
                " auto/2level: over distmesh_2level (the same without DISTMESH_SITE); below 1: distmesh_auto is faster")
            site_sent = bytes_sent(f"{out}/raw/bytes.txt", "site")
            if site_sent:
                say("# MB each site link sent per launch (the site router's up0 tx counter, frames with headers; median over"
                    " the launches, then the mean over the sites), every size and call of the launch together:")
                say("#   " + ", ".join(f"{s}: {site_sent[s] / 1e6:.1f}" for s in systems if s in site_sent))
    try:
        for line in open(f"{out}/raw/delay_line.txt"):
            if line.strip():
                say(f"# {line.strip()}")
    except OSError:
        pass
    used = flow_classes(tc_classes)
    if flow and used:
        say("# flow classes that carried > 1 MB over the whole run (all launches and iperf3), per device: "
            + ", ".join(f"{k}: {v}" for k, v in used.items()))
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    with open(f"{out}/table.txt", "w") as f:
        f.write(text)
    with open(f"{out}/results.csv", "w") as f:
        f.write("system,bytes,rep,us,wrong\n")
        for (s, b), v in sorted(runs.items()):
            for rep, t, w in v:
                f.write(f"{s},{b},{rep},{t:.3f},{w}\n")
    with open(f"{out}/results.json", "w") as f:
        doc = {"hosts": hosts, "ranks_per_host": per_host, "ranks": n, "rate_bps": rate or None,
               "crypto_bps_per_core": crypto_bps or None,
               "flow_rate_bps": flow or None, "systems": systems, "sizes": summary}
        if delay_us or dm_env:
            doc.update(delay_ms=delay_us / 1000, dm_env=dm_env)
        if sites > 1:
            doc.update(sites=sites, hosts_per_site=hosts // sites, site_rate_bps=site_bps,
                       site_delay_ms=site_delay_ms,
                       site_tx_bytes_per_launch=bytes_sent(f"{out}/raw/bytes.txt", "site"),
                       site_link_check=site_check)
        json.dump(doc, f, indent=1)
    print(f"bench-hosts: wrote {out}/table.txt, {out}/results.csv, {out}/results.json and {out}/raw/")


if __name__ == "__main__":
    main()
