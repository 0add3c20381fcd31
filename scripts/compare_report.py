"""Turns the raw lines of scripts/compare.sh ("<system> ranks=N bytes=B us=T", one per launch)
into a markdown table of medians, ratios against the strongest peer, and plot data.
   compare_report.py RAW IPERF OUT_DIR REPS SYSTEMS... [--memcpy FILE] [--name compare] [--title TEXT]
SYSTEMS: distmesh first, then its peers. Names starting with distmesh are distmesh's own
variants (not peers); gloo/torch_gloo count as "Gloo", mpi_shm as OpenMPI's shared-memory path,
mpi / mpi_tcp as OpenMPI over TCP."""
import argparse, re, statistics, platform, os, subprocess
ap = argparse.ArgumentParser()
ap.add_argument("raw"); ap.add_argument("iperf"); ap.add_argument("out"); ap.add_argument("reps")
ap.add_argument("systems", nargs="+")
ap.add_argument("--name", default="compare")
ap.add_argument("--memcpy", default="")
ap.add_argument("--title", default="distmesh vs OpenMPI vs Gloo: all-reduce float32 sum in place on local ranks")
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
mc = [float(m[1]) for m in re.finditer(r"memcpy GB/s=([\d.]+)", open(args.memcpy).read())] if args.memcpy else []
memcpy_gbs = statistics.median(mc) if mc else float("nan")
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
     f"busbw = size / time x 2(n-1)/n, GB/s = 1e9 B/s. Limits measured in the same run: single-core memcpy "
     f"{memcpy_gbs:.2f} GB/s, iperf3 single-stream loopback {iperf_gbs:.2f} GB/s.", ""]
for n in ranks:
    L += [f"## {n} ranks", "", "| size (B) | " + " | ".join(f"{s} us" for s in systems) + " | " + " | ".join(f"{s} busbw" for s in systems) + " |",
          "|" + "---|" * (1 + 2 * len(systems))]
    for b in sizes:
        L.append(f"| {b} | " + " | ".join(fmt(med.get((s, n, b)), ".1f") for s in systems) + " | "
                 + " | ".join(fmt(busbw(s, n, b), ".3f") for s in systems) + " |")
    L.append("")
peers = [s for s in systems if not s.startswith("distmesh")]
variants = [s for s in systems if s.startswith("distmesh")]
L += ["## Ratios: time of distmesh / time of the strongest peer at that point (< 1: distmesh faster)", "",
      "| ranks | size (B) | " + " | ".join(variants) + " | strongest peer | " + " | ".join(f"vs {p}" for p in peers) + " |",
      "|" + "---|" * (3 + len(variants) + len(peers))]
for n in ranks:
    for b in sizes:
        pt = {p: med.get((p, n, b)) for p in peers}
        pt = {p: t for p, t in pt.items() if t}
        if not pt or not med.get(("distmesh", n, b)): continue
        best = min(pt, key=pt.get)
        dm = med[("distmesh", n, b)]
        L.append(f"| {n} | {b} | " + " | ".join(fmt(med.get((v, n, b)) / pt[best] if med.get((v, n, b)) else None, ".2f")
                                               for v in variants)
                 + f" | {best} | " + " | ".join(fmt(dm / pt[p] if p in pt else None, ".2f") for p in peers) + " |")
L.append("")
open(os.path.join(out, args.name + ".md"), "w").write("\n".join(L) + "\n")
with open(os.path.join("build/compare", args.name + ".dat"), "w") as f:
    for n in ranks:
        for s in systems:
            f.write(f'"{s} n={n}"\n')
            for b in sizes:
                v = busbw(s, n, b)
                if v: f.write(f"{b} {v} {med[(s, n, b)]}\n")
            f.write("\n\n")
print("\n".join(L))
