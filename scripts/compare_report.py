"""Turns the raw lines of scripts/compare.sh ("<system> ranks=N bytes=B us=T", one per launch)
into a markdown table of medians, the distmesh/peer ratios of issue 4's targets, and plot data.
   compare_report.py RAW IPERF OUT_DIR REPS SYSTEMS... [--name compare] [--title TEXT]
SYSTEMS: distmesh first, then its peers; peers whose name starts with gloo or torch_gloo count
as "Gloo" in the ratio table, "mpi" as OpenMPI."""
import argparse, re, statistics, platform, os, subprocess
ap = argparse.ArgumentParser()
ap.add_argument("raw"); ap.add_argument("iperf"); ap.add_argument("out"); ap.add_argument("reps")
ap.add_argument("systems", nargs="+")
ap.add_argument("--name", default="compare")
ap.add_argument("--title", default="distmesh vs Gloo vs OpenMPI: all-reduce float32 sum on local ranks (loopback TCP)")
args = ap.parse_args()
raw, iperf, out, reps, systems = args.raw, args.iperf, args.out, args.reps, args.systems
os.makedirs(out, exist_ok=True)
os.makedirs("build/compare", exist_ok=True)
pts = {}
for line in open(raw):
    m = re.match(r"(\S+) ranks=(\d+) bytes=(\d+) us=([\d.]+)", line)
    if m: pts.setdefault((m[1], int(m[2]), int(m[3])), []).append(float(m[4]))
lo = [float(x) for x in open(iperf).read().split()] if os.path.exists(iperf) else []
iperf_gbs = statistics.median(lo) if lo else float("nan")
ranks = sorted({k[1] for k in pts}); sizes = sorted({k[2] for k in pts})
med = {k: statistics.median(v) for k, v in pts.items()}
def busbw(sysname, n, b):
    t = med.get((sysname, n, b))
    return None if not t else b / (t * 1e-6) / 1e9 * 2 * (n - 1) / n
def fmt(x, spec):
    return "-" if x is None else format(x, spec)
cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"], capture_output=True, text=True).stdout.strip()
gloos = [s for s in systems if s.startswith("gloo") or s.startswith("torch_gloo")]
L = [f"# {args.title}", "",
     f"Machine: {os.cpu_count()} cores ({cpu}), {platform.system()} {platform.release()}. Median of {reps} interleaved "
     f"repetitions; each repetition is one launch per system timing its mean over the iterations. "
     f"busbw = size / time x 2(n-1)/n, GB/s = 1e9 B/s. iperf3 single-stream loopback: {iperf_gbs:.2f} GB/s.", ""]
for n in ranks:
    L += [f"## {n} ranks", "", "| size (B) | " + " | ".join(f"{s} us" for s in systems) + " | " + " | ".join(f"{s} busbw" for s in systems) + " |",
          "|" + "---|" * (1 + 2 * len(systems))]
    for b in sizes:
        L.append(f"| {b} | " + " | ".join(fmt(med.get((s, n, b)), ".1f") for s in systems) + " | "
                 + " | ".join(fmt(busbw(s, n, b), ".3f") for s in systems) + " |")
    L.append("")
L += ["## Ratios (the issue's targets)", "", "| ranks | size (B) | metric | vs best Gloo | vs OpenMPI | target |", "|---|---|---|---|---|---|"]
for n in ranks:
    for b in sizes:
        dm = med.get(("distmesh", n, b)); g = [med.get((s, n, b)) for s in gloos]; g = [x for x in g if x]
        mp = med.get(("mpi", n, b))
        if not dm or not g: continue
        if b >= 16 << 20:
            L.append(f"| {n} | {b} | busbw distmesh / peer | {min(g) / dm:.2f}x | {fmt(mp / dm if mp else None, '.2f')}x | >= 1.3x |")
        elif b <= 4096:
            L.append(f"| {n} | {b} | latency distmesh / peer | {dm / min(g):.2f} | {fmt(dm / mp if mp else None, '.2f')} | <= 0.7 (Gloo) |")
    big = max(sizes)
    if n == 2 and busbw("distmesh", 2, big):
        L.append(f"| 2 | {big} | busbw distmesh / iperf3 | {busbw('distmesh', 2, big) / iperf_gbs:.2f} | | >= 0.8 |")
L.append("")
open(os.path.join(out, args.name + ".md"), "w").write("\n".join(L) + "\n")
with open(os.path.join("build/compare", args.name + ".dat"), "w") as f:
    for n in ranks:
        for s in systems:
            f.write(f'"{s} n={n}"\n')
            for b in sizes:
                v = busbw(s, n, b)
                if v: f.write(f"{b} {v}\n")
            f.write("\n\n")
print("\n".join(L))
