"""make bench-python: distmesh's Python package against mpi4py and torch.distributed's Gloo,
one harness for all, every system launched the same way (mpirun --oversubscribe on this host)
and timed the same way (bench/parity_bench.c's shapes):

    med   a barrier, then one timed call, `iters` times: each rank's median per call; the
          slowest rank's median is reported
    b2b   a barrier, then `iters` calls back to back: each rank's mean per call; the slowest
          rank's mean is reported
    iters = 64 MiB / size, clamped to [10, ITERS_MAX (2000)]

Systems (float32 sum in place, 8 B .. 64 MiB, 2 and 4 ranks):
    dm        distmesh: Collective.all_reduce(numpy array, SUM)
    mpi4py    comm.Allreduce(MPI.IN_PLACE, numpy array, op=MPI.SUM)
    gloo      torch.distributed's Gloo: dist.all_reduce(torch.from_numpy(array)) (the same memory;
              also the reference of tdm)
    tdm       torch.distributed through the "distmesh" backend: dist.all_reduce(tensor) (up to
              distmesh.torch.INLINE_MAX_BYTES, 64 KiB, run inline on the calling thread; larger
              sizes as a request: docs/python.md, "Async")
    dm_c      the C library's own harness (parity_bench_dm) at the same sizes: Python's cost
              over the C call is dm - dm_c
    gloo2, tdm2, ddp_dm2, ddp_gloo2
              the torch systems again under torch 2.x (--torch2-python, a Python whose torch is
              2.x, with --torch2-lib, the package built for it: make bench-python passes
              tests/python_torch2.mk's venv): their rows beside 1.13's, tdm2 - dm_c the torch
              backend's cost over the C call on 2.x
FSDP2 (torch 2.x only, systems fsdp_dm2 and fsdp_gloo2): the mean step (forward, backward,
AdamW step) of a decoder-only transformer (4 layers, d_model 256, 4 heads, vocab 1000, sequence
128) sharded as the seeds' engine does (fully_shard per layer and at the top over a 1-D CPU mesh,
MixedPrecisionPolicy bf16 parameters / fp32 reduction), `--fsdp-steps` steps after 3 warm-up
steps, for each batch of `--fsdp-batch` (default 1, 4), one intra-op thread per rank; beside it
the same model's step unsharded in one process with bf16 parameters (the same compute, no
communication), so 1 - unsharded / step is the share of the step that sharding costs
(communication, and FSDP's own copies and casts). bf16 matmuls on a CPU without bf16 units are
slow: here they, not the collectives, make most of the step.
DDP: the mean step (forward, backward, SGD step) of a model with DDP_MB MiB of gradients
(default 16), `--ddp-steps` steps after 3 warm-up steps, slowest rank, distmesh backend
against Gloo, for each batch of `--ddp-batch` (default 1, 4, 32 rows: how much of the step is
compute), with `--ddp-threads` (default 1, as torchrun sets) intra-op threads per rank.

Each repetition runs every system in turn; the tables show the median over REPS repetitions
and the ratios. Machines here are shared: compare ratios from one run, not lone numbers.

    python3 bench/py_bench.py [--ranks 2 4] [--sizes 8 ...] [--reps 3] [--iters-max 2000]
                              [--ddp-steps 20] [--ddp-mb 16] [--ddp-batch 1 4 32] [--ddp-threads 1]
                              [--quick] [--c-bench PATH]
    (make bench-python PYBENCH_ARGS="--quick" to check it runs)
"""
import argparse
import collections
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SIZES = [8, 64, 1024, 4096, 65536, 262144, 1048576, 4194304, 16777216, 67108864]


# ---- the worker: one rank of one system -----------------------------------------------------
def iters_for(nbytes, cap):
    return max(10, min(cap, (64 << 20) // max(nbytes, 1)))


def time_calls(call, barrier, iters):
    """(median per call, mean back to back) on this rank, in microseconds."""
    for _ in range(iters // 10 + 2):
        call()
    t = []
    for _ in range(iters):
        barrier()
        t0 = time.perf_counter()
        call()
        t.append(time.perf_counter() - t0)
    barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    b2b = (time.perf_counter() - t0) / iters
    return statistics.median(t) * 1e6, b2b * 1e6


class Env:
    """rank, world, barrier(), slowest(x) and the all-reduce under test, per system."""

    def __init__(self, system):
        import numpy as np
        self.np = np
        self.system = system
        if system == "dm":
            import distmesh
            self.c = distmesh.init(timeout=600)
            self.rank, self.world = self.c.rank, self.c.world_size
            self.barrier = self.c.barrier
            self._sum = distmesh.ReduceOp.SUM
        elif system == "mpi4py":
            from mpi4py import MPI
            self.MPI, self.comm = MPI, MPI.COMM_WORLD
            self.rank, self.world = self.comm.Get_rank(), self.comm.Get_size()
            self.barrier = self.comm.Barrier
        else:
            import datetime
            import torch
            import torch.distributed as dist
            self.torch, self.dist = torch, dist
            backend = "gloo"
            if system in ("tdm", "ddp_dm", "fsdp_dm"):
                import distmesh.torch  # noqa: F401  (registers the backend)
                backend = "distmesh"
            self.rank, self.world = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
            dist.init_process_group(backend, init_method=os.environ["PYBENCH_INIT"], rank=self.rank,
                                    world_size=self.world, timeout=datetime.timedelta(seconds=600))
            self.barrier = dist.barrier

    def slowest(self, x):
        np = self.np
        if self.system == "dm":
            v = np.array([x])
            self.c.all_reduce(v, "max")
            return float(v[0])
        if self.system == "mpi4py":
            return self.comm.allreduce(x, op=self.MPI.MAX)
        v = self.torch.tensor([x], dtype=self.torch.float64)
        self.dist.all_reduce(v, op=self.dist.ReduceOp.MAX)
        return float(v.item())

    def allreduce(self, nbytes):
        np = self.np
        buf = np.full(max(1, nbytes // 4), 1.0 / 1024, np.float32)
        if self.system == "dm":
            c, op = self.c, self._sum
            return lambda: c.all_reduce(buf, op)
        if self.system == "mpi4py":
            comm, MPI = self.comm, self.MPI
            return lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        t = self.torch.from_numpy(buf)
        dist = self.dist
        return lambda: dist.all_reduce(t)

    def close(self):
        if self.system == "dm":
            self.c.close()
        elif self.system not in ("mpi4py",):
            self.dist.destroy_process_group()


def _base(system):
    """What a system runs: the torch 2.x systems (a trailing 2) run their 1.13 namesake."""
    return system[:-1] if system.endswith("2") else system


def worker(args):
    env = Env(_base(args.system))
    if args.system.startswith("ddp_"):
        return ddp_worker(env, args)
    if args.system.startswith("fsdp_"):
        return fsdp_worker(env, args)
    for nbytes in args.sizes:
        med, b2b = time_calls(env.allreduce(nbytes), env.barrier, iters_for(nbytes, args.iters_max))
        med, b2b = env.slowest(med), env.slowest(b2b)
        if env.rank == 0:
            print("RESULT %s ranks=%d bytes=%d med_us=%.3f b2b_us=%.3f" % (args.system, env.world, nbytes, med, b2b),
                  flush=True)
    env.close()


def step_ms(step, steps, barrier=None):
    """The mean time of step() in ms over steps calls, after 3 warm-up calls (and barrier(), if
    given, so that the ranks start together)."""
    for _ in range(3):
        step()
    if barrier:
        barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps * 1e3


def ddp_worker(env, args):
    torch = env.torch
    # One intra-op thread per rank, as torchrun sets (OMP_NUM_THREADS=1 with several processes
    # per node): ranks x threads beyond the cores only measures the scheduler.
    torch.set_num_threads(args.ddp_threads)
    width = 1024
    layers = max(1, (args.ddp_mb << 20) // (4 * width * width))
    torch.manual_seed(0)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*mods)
    grad_mb = sum(p.numel() for p in model.parameters()) * 4 / (1 << 20)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    for batch in args.ddp_batch:
        x = torch.randn(batch, width)

        def step():
            opt.zero_grad()
            ddp(x).pow(2).mean().backward()
            opt.step()
        ms = env.slowest(step_ms(step, args.ddp_steps, env.barrier))
        if env.rank == 0:
            print("RESULT %s ranks=%d grad_mb=%.1f batch=%d step_ms=%.3f" % (args.system, env.world, grad_mb, batch, ms),
                  flush=True)
    env.close()


def fsdp_model(torch):
    """The decoder-only transformer of the FSDP2 rows (see the top)."""
    nn, F = torch.nn, torch.nn.functional
    vocab, d, layers, heads = 1000, 256, 4, 4

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.w1, self.w2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, heads, d // heads).unbind(2)
            a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
            return x + self.w2(F.gelu(self.w1(self.ln2(x))))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            self.layers = nn.ModuleList([Block() for _ in range(layers)])
            self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

        def forward(self, tokens):
            x = self.emb(tokens)
            for layer in self.layers:
                x = layer(x)
            return self.head(self.norm(x))

    return Decoder(), vocab


def fsdp_worker(env, args):
    torch = env.torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    F = torch.nn.functional
    torch.set_num_threads(args.ddp_threads)
    seq = 128

    def stepper(model, vocab, opt, tokens):
        def step():
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, vocab), tokens[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
        return step

    torch.manual_seed(0)
    model, vocab = fsdp_model(torch)
    mesh = init_device_mesh("cpu", (env.world,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for batch in args.fsdp_batch:
        tokens = torch.randint(0, vocab, (batch, seq + 1), generator=torch.Generator().manual_seed(env.rank))
        ms = env.slowest(step_ms(stepper(model, vocab, opt, tokens), args.fsdp_steps, env.barrier))
        ref = 0.0
        if env.rank == 0:                       # unsharded, one process: the step without communication
            torch.manual_seed(0)
            plain, _ = fsdp_model(torch)
            plain = plain.to(torch.bfloat16)    # FSDP's compute runs on bf16 parameters too
            popt = torch.optim.AdamW(plain.parameters(), lr=1e-4)
            ref = step_ms(stepper(plain, vocab, popt, tokens), args.fsdp_steps)
        env.barrier()
        if env.rank == 0:
            print("RESULT %s ranks=%d batch=%d step_ms=%.3f unsharded_ms=%.3f" % (args.system, env.world, batch, ms, ref),
                  flush=True)
    env.close()


# ---- the driver -------------------------------------------------------------------------------
def mpirun():
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "--mca", "pml", "ob1"]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    return cmd


def launch(system, ranks, args, tmp, raw):
    env = dict(os.environ)
    env["PYBENCH_INIT"] = "file://%s/%s-%d-%f" % (tmp, system, ranks, time.time())
    python = sys.executable
    if system.endswith("2"):                    # torch 2.x: its Python and the package built for it
        python = args.torch2_python
        env["PYTHONPATH"] = args.torch2_lib
    if system == "dm_c":
        cmd = mpirun() + ["-np", str(ranks), args.c_bench, "dm_c"] + [str(s) for s in args.sizes]
    else:
        cmd = mpirun() + ["-x", "PYTHONPATH", "-np", str(ranks), python, os.path.abspath(__file__), "worker",
                          system, "--sizes"] + [str(s) for s in args.sizes] + [
            "--iters-max", str(args.iters_max), "--ddp-steps", str(args.ddp_steps), "--ddp-mb", str(args.ddp_mb),
            "--ddp-threads", str(args.ddp_threads), "--ddp-batch"] + [str(b) for b in args.ddp_batch] + [
            "--fsdp-steps", str(args.fsdp_steps), "--fsdp-batch"] + [str(b) for b in args.fsdp_batch]
    env.setdefault("PYTHONPATH", "")
    try:
        out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        print("py_bench: %s on %d ranks ran past %d s" % (system, ranks, args.timeout), file=sys.stderr)
        return []
    lines = [l for l in out.stdout.decode().splitlines() if l.startswith("RESULT ") or l.startswith("dm_c ")]
    if out.returncode != 0 or not lines:
        print("py_bench: %s on %d ranks failed (%d):\n%s" % (system, ranks, out.returncode,
                                                               out.stderr.decode()[-2000:]), file=sys.stderr)
    for l in lines:
        raw.write(l + "\n")
    return lines


def parse(line):
    parts = line.split()
    name = parts[1] if parts[0] == "RESULT" else parts[0]
    f = dict(kv.split("=") for kv in parts[(2 if parts[0] == "RESULT" else 1):])
    return name, f


def table(rows, title, cols, ref_pairs, fmt):
    print("\n" + title)
    head = ["ranks", "bytes"] + cols + ["%s/%s" % p for p in ref_pairs]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for (n, b) in sorted(rows):
        v = rows[(n, b)]
        cells = [str(n), str(b)] + [fmt(v[c]) if c in v else "-" for c in cols]
        for a, r in ref_pairs:
            cells.append("%.2f" % (v[a] / v[r]) if a in v and r in v and v[r] > 0 else "-")
        print("| " + " | ".join(cells) + " |")


def report(raw_path):
    vals = collections.defaultdict(list)
    ddp = collections.defaultdict(list)
    fsdp = collections.defaultdict(list)
    for line in open(raw_path):
        name, f = parse(line.strip())
        if "unsharded_ms" in f:
            fsdp[(int(f["ranks"]), name, int(f["batch"]))].append((float(f["step_ms"]), float(f["unsharded_ms"])))
        elif "step_ms" in f:
            ddp[(int(f["ranks"]), name, int(f.get("batch", 32)))].append((float(f["step_ms"]), float(f["grad_mb"])))
        else:
            vals[(int(f["ranks"]), int(f["bytes"]), name)].append((float(f["med_us"]), float(f["b2b_us"])))
    for shape, k in (("med", 0), ("b2b", 1)):
        rows = collections.defaultdict(dict)
        for (n, b, name), v in vals.items():
            rows[(n, b)][name] = statistics.median(x[k] for x in v)
        table(rows, "numpy float32 in-place all-reduce, %s us (median over repetitions)" % shape,
              ["dm", "mpi4py", "gloo"], [("dm", "mpi4py"), ("dm", "gloo")], lambda x: "%.2f" % x)
        table(rows, "torch.distributed all_reduce on CPU tensors, distmesh backend against Gloo, %s us "
              "(tdm, gloo: torch 1.13; tdm2, gloo2: torch 2.x)" % shape,
              ["tdm", "gloo", "tdm2", "gloo2"], [("tdm", "gloo"), ("tdm2", "gloo2")], lambda x: "%.2f" % x)
        small = {key: r for key, r in rows.items() if key[1] <= 64 and ("dm_c" in r or "dm" in r)}
        for r in small.values():
            if "dm" in r and "dm_c" in r:
                r["python_cost"] = r["dm"] - r["dm_c"]
            if "tdm2" in r and "dm_c" in r:
                r["tdm2_cost"] = r["tdm2"] - r["dm_c"]
        table(small, "Python's cost over the C call (dm - dm_c; tdm2 - dm_c: the torch 2.x backend's), %s us" % shape,
              ["dm", "dm_c", "python_cost", "tdm2", "tdm2_cost"], [("dm", "dm_c")], lambda x: "%.3f" % x)
    if fsdp:
        print("\nFSDP2 step (forward, backward, AdamW step) of the transformer, torch 2.x, ms (median over repetitions);"
              " share = 1 - unsharded / step")
        print("| ranks | batch | distmesh | gloo | distmesh/gloo | unsharded | share distmesh | share gloo |")
        print("|---|---|---|---|---|---|---|---|")
        for n, batch in sorted({(k[0], k[2]) for k in fsdp}):
            dm, gl = fsdp.get((n, "fsdp_dm2", batch)), fsdp.get((n, "fsdp_gloo2", batch))
            a = statistics.median(x[0] for x in dm) if dm else None
            b = statistics.median(x[0] for x in gl) if gl else None
            u = statistics.median(x[1] for x in (dm or []) + (gl or []))
            print("| %d | %d | %s | %s | %s | %.2f | %s | %s |" % (
                n, batch, "%.2f" % a if a else "-", "%.2f" % b if b else "-", "%.2f" % (a / b) if a and b else "-", u,
                "%.0f%%" % (100 * (1 - u / a)) if a else "-", "%.0f%%" % (100 * (1 - u / b)) if b else "-"))
    if ddp:
        print("\nDDP step (forward, backward, SGD step), ms (median over repetitions)")
        print("| torch | ranks | grad MiB | batch | distmesh | gloo | distmesh/gloo |")
        print("|---|---|---|---|---|---|---|")
        for suffix, label in (("", "1.13"), ("2", "2.x")):
            for n, batch in sorted({(k[0], k[2]) for k in ddp}):
                dm = ddp.get((n, "ddp_dm" + suffix, batch))
                gl = ddp.get((n, "ddp_gloo" + suffix, batch))
                if not dm and not gl:
                    continue
                mb = (dm or gl)[0][1]
                a = statistics.median(x[0] for x in dm) if dm else None
                b = statistics.median(x[0] for x in gl) if gl else None
                print("| %s | %d | %.1f | %d | %s | %s | %s |" % (
                    label, n, mb, batch, "%.2f" % a if a else "-", "%.2f" % b if b else "-",
                    "%.2f" % (a / b) if a and b else "-"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", nargs="?", default="run", choices=["run", "worker", "report"])
    ap.add_argument("system", nargs="?")
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--sizes", type=int, nargs="+", default=DEFAULT_SIZES)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--iters-max", type=int, default=2000)
    ap.add_argument("--ddp-steps", type=int, default=20)
    ap.add_argument("--ddp-mb", type=int, default=16)
    ap.add_argument("--ddp-batch", type=int, nargs="+", default=[1, 4, 32],
                    help="rows per step, one table row each (1-4: a large model's per-device batch, where "
                    "the gradients' all-reduce is a large part of the step; 32: compute-bound here)")
    ap.add_argument("--ddp-threads", type=int, default=1, help="torch intra-op threads per rank (DDP and FSDP2)")
    ap.add_argument("--fsdp-steps", type=int, default=5)
    ap.add_argument("--fsdp-batch", type=int, nargs="+", default=[1, 4], help="sequences of 128 tokens per rank")
    ap.add_argument("--systems", nargs="+", default=["dm", "dm_c", "mpi4py", "gloo", "tdm", "ddp_dm", "ddp_gloo"])
    ap.add_argument("--c-bench", default=os.environ.get("PYBENCH_C", ""))
    ap.add_argument("--torch2-python", default="", help="a Python with torch 2.x: adds gloo2, tdm2, ddp_dm2, ddp_gloo2")
    ap.add_argument("--torch2-lib", default="", help="the distmesh package built for --torch2-python (its PYTHONPATH)")
    ap.add_argument("--out", default=os.environ.get("PYBENCH_OUT", "build/bench-python"))
    ap.add_argument("--timeout", type=int, default=900, help="seconds per launch (a stuck system is reported, not waited for)")
    ap.add_argument("--quick", action="store_true", help="sizes 8 64K 1M, 50 iterations, 1 repetition, 4 DDP steps, "
                    "300 s per launch")
    args = ap.parse_args()
    if args.mode == "worker":
        return worker(args)
    if args.quick:
        args.sizes, args.iters_max, args.reps, args.ddp_steps, args.fsdp_steps = [8, 65536, 1048576], 50, 1, 4, 2
        args.timeout = min(args.timeout, 300)
    os.makedirs(args.out, exist_ok=True)
    raw_path = os.path.join(args.out, "raw.txt")
    if args.mode == "report":
        return report(raw_path)
    if args.torch2_python and args.systems == ap.get_default("systems"):
        args.systems = args.systems + ["gloo2", "tdm2", "ddp_dm2", "ddp_gloo2", "fsdp_dm2", "fsdp_gloo2"]
    systems = [s for s in args.systems if (s != "dm_c" or args.c_bench) and (not s.endswith("2") or args.torch2_python)
               and (not s.startswith("fsdp_") or s.endswith("2"))]
    if "dm_c" in args.systems and not args.c_bench:
        print("py_bench: no --c-bench (parity_bench_dm): Python's cost over C is left out", file=sys.stderr)
    tmp = tempfile.mkdtemp(prefix="pybench")
    try:
        with open(raw_path, "w") as raw:
            for rep in range(args.reps):
                for n in args.ranks:
                    for system in systems:
                        print("py_bench: repetition %d/%d, %d ranks, %s" % (rep + 1, args.reps, n, system),
                              file=sys.stderr, flush=True)
                        launch(system, n, args, tmp, raw)
                        raw.flush()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("py_bench: raw lines in %s; %s" % (raw_path, time.strftime("%Y-%m-%d %H:%M")))
    report(raw_path)


if __name__ == "__main__":
    main()
