"""One rank of a process world of the Python tests (conftest.World starts it with RANK and
WORLD_SIZE). Scenarios:
    cases REF         every collective against the C library's bytes, bad buffers, async,
                      objects, groups; one RESULT line
    failures          Ctrl-C of rank 1 in a blocking collective, then kill -9 of rank 2 in a
                      second world, driven by the test over stdin / stdout
    torch INIT        every dist.* call of the "distmesh" backend against Gloo, blocking and
                      async, and DDP for 20 steps under both; one RESULT line
    torch_inline INIT the backend's inline path for small calls: values, which path a call
                      takes, issue order, failures raised at wait(); one RESULT line
    compress H        the compressed all-reduce (compress=, state=, CompressState) with the
                      ranks on H simulated hosts (DISTMESH_TEST_HOST_ID h<rank % H>); one
                      RESULT line of measurements (test_compress.py judges them)
    compress_ddp INIT H   DDP with distmesh.torch.compress_hook("int8") for 30 steps on H
                      simulated hosts, and exact DDP from the same start; one RESULT line
Lines: "<WORD> <payload>"; the test reads the ones it waits for."""
import datetime
import json
import os
import sys
import time
import traceback

import numpy as np

if os.environ.get("DM_PY_NO_TORCH") == "1":    # ASan builds: no torch (conftest.py)
    sys.modules["torch"] = None

import distmesh  # noqa: E402

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])


def say(word, payload=""):
    sys.stdout.write("%s %s\n" % (word, payload if isinstance(payload, str) else json.dumps(payload)))
    sys.stdout.flush()


def wait_line(word):
    while True:
        line = sys.stdin.readline()
        if not line:
            raise SystemExit("stdin closed waiting for %r" % word)
        if line.strip() == word:
            return


# ---- cases ---------------------------------------------------------------------------------
def bad_buffers(c):
    """Rank 0 passes buffers that must be refused before anything is sent; returns what went
    wrong (empty: every call raised the right error and nothing moved)."""
    bad = []
    seq = c.sequence
    ro = np.ones(4, np.float32)
    ro.flags.writeable = False
    trials = [
        ("read-only all_reduce", TypeError, lambda: c.all_reduce(ro, "sum")),
        ("bytes all_reduce", TypeError, lambda: c.all_reduce(b"abcdefgh", "sum")),
        ("non-contiguous all_reduce", ValueError, lambda: c.all_reduce(np.ones((4, 4), np.float32)[:, 0], "sum")),
        ("all_gather wrong size", ValueError, lambda: c.all_gather(np.zeros(4 * WORLD + 1, np.float32),
                                                                   np.zeros(4, np.float32))),
        ("all_gather dtype mismatch", TypeError, lambda: c.all_gather(np.zeros(4 * WORLD, np.float64),
                                                                      np.zeros(4, np.float32))),
        ("to_list wrong count", ValueError, lambda: c.all_gather_to_list([np.zeros(4, np.float32)],
                                                                         np.zeros(4, np.float32))),
        ("reduce_scatter wrong size", ValueError, lambda: c.reduce_scatter(np.zeros(3, np.float32),
                                                                           np.zeros(3 * WORLD + 1, np.float32), "sum")),
        ("bool reduce", TypeError, lambda: c.all_reduce(np.zeros(4, bool), "sum")),
        ("not a buffer", TypeError, lambda: c.all_reduce([1.0, 2.0], "sum")),
        ("bad op", ValueError, lambda: c.all_reduce(np.zeros(4, np.float32), "xor")),
        ("send read-only recv", TypeError, lambda: c.recv(ro, 1)),
        ("a2a_v counts", ValueError, lambda: c.all_to_all_v(np.zeros(2, np.float32), [5] * WORLD,
                                                            np.zeros(2, np.float32), [0] * WORLD)),
    ]
    try:
        import torch
        trials.append(("non-contiguous torch", ValueError, lambda: c.all_reduce(torch.ones(4, 4)[:, 1], "sum")))
    except ImportError:
        pass
    for name, exc, call in trials:
        expect_raise(bad, name, exc, call)
    if c.sequence != seq:
        bad.append("the refused calls counted as collectives (sequence %d -> %d)" % (seq, c.sequence))
    return bad


def p2p_any_order(c):
    """Requests posted recv first (a ring: recv from prev, send to next, then wait), and recv
    from any source: rank 0 takes one message from each other rank with recv(buf, None) (the
    sender returned), one as a Request, one through mpi4py's Recv. [received, senders,
    the request's sender and value, Recv's sender]."""
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    got = np.zeros(6, np.int32)
    rr = c.recv(got, prv, 4, async_op=True)
    rs = c.send(np.full(6, RANK, np.int32), nxt, 4, async_op=True)
    rs.wait()
    out = [rr.wait() == prv and got.tolist() == [prv] * 6]
    if RANK == 0:
        senders = []
        for _ in range(WORLD - 1):
            src = c.recv(got, None, 5)
            senders.append([src, int(got[0])])
        req = c.recv(got, None, 6, async_op=True)
        out += [sorted(senders), [req.wait(), int(got[0])], c.Recv(got, None, 7)]
    else:
        c.send(np.full(6, RANK * 10, np.int32), 0, 5)
        if RANK == WORLD - 1:
            c.Send(np.full(6, 7, np.int32), 0, 6)
            c.Send(np.full(6, 8, np.int32), 0, 7)
        out += [None, None, None]
    c.barrier()
    return out


def scenario_cases(ref):
    import cases
    out = {"rank": RANK}
    c = distmesh.init(timeout=30)
    out["backend"], out["transport"] = c.backend, c.transport
    out["bad_buffers"] = bad_buffers(c) if RANK == 0 else []
    one = np.ones(3, np.int32)                          # the world is whole after rank 0's refusals
    c.all_reduce(one, distmesh.ReduceOp.SUM)
    out["after_bad"] = one.tolist()
    t0 = time.monotonic()
    out["cases"] = cases.run(c, cases.load(ref))
    out["cases_s"] = time.monotonic() - t0
    # objects (pickled), the seeds' and mpi4py's spellings
    out["objects"] = c.all_gather_objects({"rank": RANK, "x": [RANK] * RANK})
    box = [None, None]
    if RANK == 1:
        box = ["from 1", {"k": (1, 2)}]
    c.broadcast_objects(box, source_rank=1)
    out["broadcast_objects"] = box
    out["bcast"] = c.bcast({"r": RANK} if RANK == 2 else None, root=2)
    buf = np.full(5, RANK + 1.0, np.float64)
    c.Allreduce(distmesh.IN_PLACE, buf, distmesh.ReduceOp.SUM)
    out["Allreduce"] = buf.tolist()
    # several requests in flight, completed in order
    a = np.full(1000, float(RANK), np.float32)
    b = np.arange(10, dtype=np.int64) * (RANK == 0)
    r1 = c.all_reduce(a, distmesh.ReduceOp.MAX, async_op=True)
    r2 = c.broadcast(b, 0, async_op=True)
    r3 = c.barrier(async_op=True)
    r3.wait()
    out["async"] = [r1.is_completed(), r2.is_completed(), float(a[0]), b.tolist()]
    r1.wait()
    out["p2p"] = p2p_any_order(c)
    # groups: the host's ranks, a split, a dp x tp mesh, LLaMA-Factory's dims
    out["local"] = [c.local.world_size, c.local.rank]
    half = c.split(RANK % 2)
    out["split"] = [half.world_size, half.rank]
    half.close()
    m = distmesh.Mesh(c, {"dp": 0, "tp": 2})
    tpv = np.array([RANK], np.int32)
    m.group("tp").all_reduce(tpv, "sum")
    out["mesh"] = [m.shape, m.rank("dp"), m.rank("tp"), int(tpv[0])]
    di = distmesh.DistributedInterface({"dp_size": 2, "cp_size": 2, "mp_replicate_size": 2}, world=c)
    g = di.all_gather(np.array([RANK], np.int16), distmesh.Dim.DP)
    x = np.array([float(RANK)], np.float32)
    di.all_reduce(x, distmesh.ReduceOp.MEAN, distmesh.Dim.CP)
    out["interface"] = [di.get_rank(distmesh.Dim.DP), di.get_world_size(distmesh.Dim.CP), g.ravel().tolist(),
                        float(x[0]), di.get_rank(distmesh.Dim.MP_SHARD)]
    try:
        di.get_device_mesh(None)
        out["interface"].append("no error")
    except ValueError as e:
        out["interface"].append(str(e))
    out["interface"].append([di.get_rank(), di.get_world_size()])     # no dim: the world's
    di.destroy()
    c.barrier()
    c.close()
    out["open_handles"] = distmesh._C._open_handles()
    say("RESULT", out)


# ---- failures ----------------------------------------------------------------------------------
def scenario_failures():
    store = os.environ["DISTMESH_STORE"]
    # A: Ctrl-C of rank 1 while it waits in an all_reduce the others have not entered
    c = distmesh.connect(RANK, WORLD, store=store, prefix="a/", timeout=30)
    c.barrier()
    x = np.zeros(256, np.float32)
    if RANK == 1:
        say("BLOCKING", str(os.getpid()))
        try:
            c.all_reduce(x, "sum")
            say("A", {"error": "the all_reduce returned"})
        except KeyboardInterrupt as e:
            t = time.monotonic()
            ctx = e.__context__
            say("A", {"ki_at": t, "context": type(ctx).__name__ if ctx else None,
                      "context_msg": str(ctx) if ctx else ""})
        try:
            c.barrier()
            say("A2", {"error": "barrier after the abort returned"})
        except distmesh.Aborted as e:
            say("A2", {"later": "Aborted", "msg": str(e)})
    else:
        wait_line("go")
        t0 = time.monotonic()
        got = None
        try:
            for _ in range(2):          # over sockets the first call may complete (see test_abort.c)
                c.all_reduce(x, "sum")
        except distmesh.Error as e:
            got = {"type": type(e).__name__, "msg": str(e), "s": time.monotonic() - t0}
        say("A", got or {"error": "no error"})
    c.close()
    # B: kill -9 of rank 2 while the ranks run all_reduces in a second world
    c = distmesh.connect(RANK, WORLD, store=store, prefix="b/", timeout=30)
    y = np.ones(1024, np.float32)
    c.all_reduce(y, "sum")
    say("READY")
    try:
        while True:
            c.all_reduce(y, "sum")
            y[:] = 1
    except distmesh.Error as e:
        say("B", {"type": type(e).__name__, "at": time.monotonic(), "msg": str(e)})
    c.close()


# ---- torch -------------------------------------------------------------------------------------
def scenario_torch(init):
    import torch
    import torch.distributed as dist
    import distmesh.torch  # noqa: F401  (registers the backend)
    limit = datetime.timedelta(seconds=60)
    dist.init_process_group("distmesh", init_method=init, rank=RANK, world_size=WORLD, timeout=limit)
    gloo = dist.new_group(backend="gloo", timeout=limit)
    out = {"rank": RANK, "backend": dist.get_backend(), "transport": distmesh.torch.collective().transport}
    bad = []
    out["bad"] = bad

    def same(name, a, b, scale=None):
        """Integers bitwise; floats within one ulp per rank of the magnitude the sums went
        through (scale: the sum of |x| over ranks; None: |result|, exact for MAX / MIN)."""
        a, b = [a] if torch.is_tensor(a) else list(a), [b] if torch.is_tensor(b) else list(b)
        scales = [None] * len(b) if scale is None else ([scale] if torch.is_tensor(scale) else list(scale))
        for x, y, sc in zip(a, b, scales):
            if x.dtype.is_floating_point:
                mag = (torch.abs(y) if sc is None else sc).double().numpy()
                eps = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -24,
                       torch.float64: 2.0 ** -53}[x.dtype]
                tol = 2 * WORLD * eps * np.maximum(mag, 1e-30)
                diff = np.abs(x.double().numpy() - y.double().numpy())
                if not np.all(diff <= tol):
                    k = int(np.argmax(diff - tol))
                    bad.append("%s: element %d: %r vs gloo %r (tolerance %g)" % (name, k, float(x.reshape(-1)[k]),
                                                                                 float(y.reshape(-1)[k]), tol.reshape(-1)[k]))
                    return
            elif not torch.equal(x, y):
                bad.append("%s: %s vs gloo %s" % (name, x[:4].tolist(), y[:4].tolist()))
                return

    def data(seed, n=1000, dtype=torch.float32):
        g = torch.Generator().manual_seed(seed * 100 + RANK)
        if dtype.is_floating_point:
            return (torch.randn(n, generator=g) * 10).to(dtype)
        return torch.randint(-1000, 1000, (n,), generator=g).to(dtype)

    def both(name, fn, scale=None):
        """fn(group, async_op) -> output tensors; distmesh (default group) against gloo."""
        for aop in (False, True):
            got = fn(None, aop)
            want = fn(gloo, False)
            same("%s%s" % (name, " async" if aop else ""), got, want, scale() if scale else None)

    def run(work, aop):
        if aop:
            assert work is not None, "async_op=True returned no work"
            work.wait()
            done = work.is_completed if hasattr(work, "is_completed") else work.done   # a Future (coalesced)
            assert done()

    ops = [(dist.ReduceOp.SUM, "sum"), (dist.ReduceOp.PRODUCT, "prod"), (dist.ReduceOp.MAX, "max"),
           (dist.ReduceOp.MIN, "min")]
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16, torch.float16, torch.uint8):
        for op, opn in ops:
            if opn == "prod" and dtype in (torch.bfloat16, torch.float16, torch.uint8):
                continue
            for n in (7, 70000):
                def inputs(dtype=dtype, n=n):
                    return data(n + 3, n, dtype) if opn != "prod" else (1 + data(n, n, torch.float64) / 1000).to(dtype)

                def magnitude(inputs=inputs):       # what the sums went through: sum over ranks of |x|
                    m = inputs().double().abs()
                    dist.all_reduce(m, group=gloo)
                    return m

                def f(g, aop, dtype=dtype, op=op, n=n, inputs=inputs):
                    t = inputs()
                    if g is gloo and dtype == torch.bfloat16:   # Gloo 1.13 has no bfloat16: in float32
                        t32 = t.float()
                        dist.all_reduce(t32, op=op, group=g)
                        return t32.to(dtype)
                    run(dist.all_reduce(t, op=op, group=g, async_op=aop), aop)
                    return t
                both("all_reduce %s %s %d" % (dtype, opn, n), f,
                     magnitude if opn == "sum" and dtype.is_floating_point else None)

    def bcast(g, aop):
        t = data(5, 3000)
        run(dist.broadcast(t, WORLD - 1, group=g, async_op=aop), aop)
        return t
    both("broadcast", bcast)

    def allgather(g, aop):
        outs = [torch.empty(600) for _ in range(WORLD)]
        run(dist.all_gather(outs, data(6, 600), group=g, async_op=aop), aop)
        return outs
    both("all_gather", allgather)

    def allgather_t(g, aop):
        out = torch.empty(WORLD * 300, dtype=torch.int64)
        run(dist.all_gather_into_tensor(out, data(7, 300, torch.int64), group=g, async_op=aop), aop)
        return out
    if hasattr(dist, "all_gather_into_tensor"):
        for aop in (False, True):       # gloo 1.13 lacks _allgather_base: against all_gather's list
            got = allgather_t(None, aop)
            outs = [torch.empty(300, dtype=torch.int64) for _ in range(WORLD)]
            dist.all_gather(outs, data(7, 300, torch.int64), group=gloo)
            same("all_gather_into_tensor%s" % (" async" if aop else ""), got, torch.cat(outs))

    def reduce(g, aop):
        t = data(8, 2000)
        run(dist.reduce(t, 1, group=g, async_op=aop), aop)
        return t if RANK == 1 else torch.zeros(1)
    def reduce_mag():
        m = data(8, 2000).double().abs()
        dist.all_reduce(m, group=gloo)
        return m if RANK == 1 else torch.zeros(1, dtype=torch.float64)
    both("reduce", reduce, reduce_mag)

    def gather(g, aop):
        outs = [torch.empty(40) for _ in range(WORLD)] if RANK == 0 else None
        run(dist.gather(data(9, 40), outs, 0, group=g, async_op=aop), aop)
        return outs if RANK == 0 else [torch.zeros(1)]
    both("gather", gather)

    def scatter(g, aop):
        out = torch.empty(50)
        ins = [data(10 + k, 50) for k in range(WORLD)] if RANK == 1 else None
        run(dist.scatter(out, ins, 1, group=g, async_op=aop), aop)
        return out
    both("scatter", scatter)

    def a2a_single(g, aop):
        out = torch.empty(WORLD * 30)
        run(dist.all_to_all_single(out, data(11, WORLD * 30), group=g, async_op=aop), aop)
        return out
    both("all_to_all_single", a2a_single)

    def a2a_split(g, aop):
        ins = [1 + (RANK + j) % 3 for j in range(WORLD)]           # rows to rank j
        outs = [1 + (j + RANK) % 3 for j in range(WORLD)]          # rows from rank j
        inp = data(12, sum(ins) * 4).view(-1, 4)
        out = torch.empty(sum(outs), 4)
        run(dist.all_to_all_single(out, inp, outs, ins, group=g, async_op=aop), aop)
        return out
    both("all_to_all_single split", a2a_split)

    # ops Gloo 1.13 does not provide: against what they must give
    for aop in (False, True):
        blocks = [data(20 + k, 64) for k in range(WORLD)]
        rs = torch.empty(64)
        run(dist.reduce_scatter(rs, [b.clone() for b in blocks], group=None, async_op=aop), aop)
        whole = torch.cat(blocks)
        dist.all_reduce(whole, group=gloo)
        mag = torch.cat(blocks).double().abs()
        dist.all_reduce(mag, group=gloo)
        mag = mag[RANK * 64:(RANK + 1) * 64]
        same("reduce_scatter list%s" % (" async" if aop else ""), rs, whole[RANK * 64:(RANK + 1) * 64], mag)
        if hasattr(dist, "reduce_scatter_tensor"):
            out2 = torch.empty(64)
            run(dist.reduce_scatter_tensor(out2, torch.cat(blocks).clone(), async_op=aop), aop)
            same("reduce_scatter_tensor%s" % (" async" if aop else ""), out2, whole[RANK * 64:(RANK + 1) * 64], mag)
        ins = [torch.full((2 + j,), float(RANK * 10 + j)) for j in range(WORLD)]
        outs = [torch.empty(2 + RANK) for _ in range(WORLD)]
        run(dist.all_to_all(outs, ins, async_op=aop), aop)
        same("all_to_all list%s" % (" async" if aop else ""), outs,
             [torch.full((2 + RANK,), float(j * 10 + RANK)) for j in range(WORLD)])
        coal = [data(30, 10), data(31, 20)]
        ref = [t.clone() for t in coal]
        run(dist.all_reduce_coalesced(coal, async_op=aop), aop)
        mags = [t.double().abs() for t in ref]
        for t in ref + mags:
            dist.all_reduce(t, group=gloo)
        same("all_reduce_coalesced%s" % (" async" if aop else ""), coal, ref, mags)
        # send / recv around the ring
        s = data(40, 33)
        r = torch.empty(33)
        if aop:
            ws = dist.isend(s, (RANK + 1) % WORLD)
            wr = dist.irecv(r, (RANK - 1) % WORLD)
            ws.wait()
            wr.wait()
        else:
            if RANK % 2 == 0:
                dist.send(s, (RANK + 1) % WORLD)
                dist.recv(r, (RANK - 1) % WORLD)
            else:
                dist.recv(r, (RANK - 1) % WORLD)
                dist.send(s, (RANK + 1) % WORLD)
        want = torch.empty(33)
        src = (RANK - 1) % WORLD
        want.copy_((torch.randn(33, generator=torch.Generator().manual_seed(40 * 100 + src)) * 10))
        same("send/recv%s" % (" async" if aop else ""), r, want)
        run(dist.barrier(async_op=aop), aop)

    # torch's object collectives, on top of the above
    ol = [None] * WORLD
    dist.all_gather_object(ol, {"rank": RANK, "pad": "x" * RANK * 100})
    if [o["rank"] for o in ol] != list(range(WORLD)):
        bad.append("all_gather_object: %s" % ol)
    bl = [RANK, "b"] if RANK == 0 else [None, None]
    dist.broadcast_object_list(bl, 0)
    if bl != [0, "b"]:
        bad.append("broadcast_object_list: %s" % bl)
    go = [None] * WORLD if RANK == 0 else None
    dist.gather_object(("g", RANK), go, dst=0)
    if RANK == 0 and go != [("g", k) for k in range(WORLD)]:
        bad.append("gather_object: %s" % go)
    so = [None]
    dist.scatter_object_list(so, [("s", k) for k in range(WORLD)] if RANK == 0 else None, src=0)
    if so != [("s", RANK)]:
        bad.append("scatter_object_list: %s" % so)
    # a failure reaches work.wait() as an exception
    try:
        dist.send(torch.zeros(2), RANK)                 # to itself: refused by distmesh
        bad.append("send to self: no error")
    except (RuntimeError, ValueError):
        pass

    # DDP: 20 steps, the same parameters under distmesh and under gloo
    def train(group):
        torch.manual_seed(1234)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
        ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group, bucket_cap_mb=0.01)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(99 + RANK)
        for _ in range(20):
            x = torch.randn(16, 32, generator=g)
            loss = ddp(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        return [p.detach().clone() for p in model.parameters()]
    t0 = time.monotonic()
    mine = train(None)
    theirs = train(gloo)
    out["ddp_s"] = time.monotonic() - t0
    out["ddp_max_diff"] = max(float((a - b).abs().max()) for a, b in zip(mine, theirs))
    moved = max(float((a - b).abs().max()) for a, b in zip(mine, train_init()))
    out["ddp_moved"] = moved
    dist.barrier()
    dist.destroy_process_group()
    say("RESULT", out)


def scenario_torch_inline(init):
    """The torch backend's inline path (docs/python.md, "Async"): a call of at most
    distmesh.torch.INLINE_MAX_BYTES made while nothing of its group is in flight runs on the
    calling thread and returns complete; a larger one, or one made while a request is in
    flight, is a request and returns at once; the calls keep issue order (the ranks in
    different states too); a failure of an inline call (a timeout, an abort) is raised by
    wait() and the future on torch 2.x, at the call on 1.13. One RESULT line; rank 0's timings
    with the other ranks `delay` s late."""
    import threading
    import torch
    import torch.distributed as dist
    import distmesh.torch as dmt
    V2 = dmt.Work is not None                  # torch 2.x: distmesh's own Work
    delay = 1.0
    limit = datetime.timedelta(seconds=60)
    dist.init_process_group("distmesh", init_method=init, rank=RANK, world_size=WORLD, timeout=limit)
    out = {"rank": RANK, "inline_max": dmt.INLINE_MAX_BYTES, "v2": V2}
    bad = []
    out["bad"] = bad
    total = WORLD * (WORLD + 1) / 2            # sum over ranks of RANK + 1
    at_limit = dmt.INLINE_MAX_BYTES // 4       # float32 elements: exactly at the limit (inline)
    over = at_limit + 1                        # one element over (a request)

    def mine(n):
        return torch.full((n,), float(RANK + 1))

    def check(name, t, want):
        if not torch.equal(t, torch.full_like(t, want)):
            bad.append("%s: %s, want %s" % (name, t.reshape(-1)[:4].tolist(), want))

    # values: small and large, blocking and async, with each call's future
    for n in (1, 2, at_limit, over, 70000):
        for aop in (False, True):
            t = mine(n)
            w = dist.all_reduce(t, async_op=aop)
            if aop:
                fut = w.get_future()
                w.wait()
                check("future of all_reduce %d" % n, fut.wait()[0], total)
            check("all_reduce %d%s" % (n, " async" if aop else ""), t, total)

    # the paths, with the other ranks late: a small call returns complete (inline), after the
    # late ranks joined, even with async_op=True
    dist.barrier()
    if RANK != 0:
        time.sleep(delay)
    t, t0 = mine(2), time.monotonic()
    w = dist.all_reduce(t, async_op=True)
    out["small_s"], out["small_done"] = time.monotonic() - t0, w.is_completed()
    w.wait()
    check("small, others late", t, total)
    # a large call is a request: it returns at once, not complete; a small call made while it is
    # in flight is a request too (behind it: returns at once); a blocking call after them is
    # queued behind both, so they are complete when it returns
    dist.barrier()
    if RANK != 0:
        time.sleep(delay)
    big, t0 = mine(over), time.monotonic()
    wa = dist.all_reduce(big, async_op=True)
    out["big_s"], out["big_done"] = time.monotonic() - t0, wa.is_completed()
    x, t0 = mine(2), time.monotonic()
    wb = dist.all_reduce(x, async_op=True)
    out["behind_s"], out["behind_done"] = time.monotonic() - t0, wb.is_completed()
    y = mine(3)
    dist.all_reduce(y, op=dist.ReduceOp.MAX)
    out["order"] = [wa.is_completed(), wb.is_completed()]
    wa.wait()
    wb.wait()
    check("large behind late ranks", big, total)
    check("small behind the large", x, total)
    check("blocking behind both", y, WORLD)
    # the ranks in different states: rank 0 leaves a large call in flight (its small calls are
    # requests), the others wait for it first (theirs run inline): the same calls, in order
    for rep in range(20):
        big = mine(over)
        wa = dist.all_reduce(big, async_op=True)
        if RANK != 0:
            wa.wait()
        z = torch.full((5,), float(RANK))
        wz = dist.broadcast(z, WORLD - 1, async_op=True)
        u = torch.tensor([float(RANK)])
        dist.all_reduce(u, op=dist.ReduceOp.MAX)
        g = [torch.empty(2) for _ in range(WORLD)]
        dist.all_gather(g, mine(2))
        wa.wait()
        wz.wait()
        check("mixed %d: large" % rep, big, total)
        check("mixed %d: broadcast" % rep, z, WORLD - 1)
        check("mixed %d: max" % rep, u, WORLD - 1)
        for k in range(WORLD):
            check("mixed %d: all_gather %d" % (rep, k), g[k], k + 1)

    # failures of an inline call: kept for wait() (and the future), not raised at the call
    def failing(name, group, during=None):
        coll = dmt.collective(group)
        coll.set_timeout(1500)
        if RANK != 0:                           # rank 0 calls alone and fails
            return
        if during is not None:
            threading.Timer(0.5, during, (coll,)).start()
        t, t0 = mine(2), time.monotonic()
        try:
            w = dist.all_reduce(t, group=group, async_op=True)
        except RuntimeError as e:               # torch 1.13: raised at the call
            out[name] = {"call_s": time.monotonic() - t0, "at_call": True,
                         "wait": "%s %s: %s" % (type(e).__name__, getattr(e, "status_name", ""), e)}
            if V2:
                bad.append("%s: raised at the call under torch 2.x: %r" % (name, e))
            return
        res = {"call_s": time.monotonic() - t0, "done": w.is_completed(), "at_call": False}
        if not V2:
            bad.append("%s: not raised at the call under torch 1.13" % name)
        try:
            w.wait()
            bad.append("%s: wait() raised nothing" % name)
        except RuntimeError as e:
            res["wait"] = "%s %s: %s" % (type(e).__name__, getattr(e, "status_name", ""), e)
            res["distmesh_error"] = isinstance(e, distmesh.Error)
        try:
            w.get_future().wait()
            bad.append("%s: the future raised nothing" % name)
        except RuntimeError:
            pass
        try:                                    # a blocking call on the failed group raises at once
            dist.all_reduce(mine(2), group=group)
            bad.append("%s: the blocking call after it raised nothing" % name)
        except RuntimeError as e:
            res["blocking"] = "%s: %s" % (type(e).__name__, e)
        out[name] = res

    failing("timeout", dist.new_group(backend="distmesh", timeout=limit))
    failing("abort", dist.new_group(backend="distmesh", timeout=limit), lambda c: c.abort("the test aborts it"))
    dist.barrier()
    dist.destroy_process_group()
    say("RESULT", out)


# ---- compress -------------------------------------------------------------------------------
CN = 5000                  # 19 blocks of 256 and a tail of 136


def compress_input(r):
    """Rank r's input: normal values whose magnitude changes by 10x from one block of 256 to
    the next (1e-3 .. 1e3), so a bound per block means something."""
    g = np.random.default_rng(1000 + r)
    scale = 10.0 ** ((np.arange(CN // 256 + 1) % 7) - 3)
    return (g.standard_normal(CN) * np.repeat(scale, 256)[:CN]).astype(np.float32)


def compress_bounds(hosts):
    """(exact sum in float64, int8 bound, bf16 bound) per element for SUM over the world's
    inputs, the ranks on `hosts` hosts (rank r on host r % hosts). int8: H x scale / 2 with
    scale = the largest |host partial sum| of the element's block / 127 (distmesh.h
    >>functions compression); the block's position is not assumed: the largest over the 511
    elements around the element. bf16: each host's partial rounded once to nearest (at most
    2^-8 of it: half a unit in the last of bfloat16's 8 significant bits). Both plus float32
    rounding of the exact sums (8 ulps of the sum of |x|). The results come to 0.97 (int8)
    and 0.95 (bf16) of these bounds: they are tight."""
    xs = [compress_input(r).astype(np.float64) for r in range(WORLD)]
    exact = np.sum(xs, axis=0)
    partials = [np.sum(xs[h::hosts], axis=0) for h in range(hosts)]
    pmax = np.max(np.abs(partials), axis=0)
    padded = np.concatenate([np.zeros(255), pmax, np.zeros(255)])
    window = np.lib.stride_tricks.sliding_window_view(padded, 511).max(axis=1)
    slack = 8 * 2.0 ** -24 * np.sum(np.abs(xs), axis=0)
    int8 = hosts * window / 254 * (1 + 1e-3) + slack
    bf16 = 2.0 ** -8 * np.sum(np.abs(partials), axis=0) + slack
    return exact, int8, bf16


def same_everywhere(c, y):
    """Whether every rank holds y's bytes (all_gather'd, compared here)."""
    out = np.empty(WORLD * y.size, y.dtype)
    c.all_gather(out, y)
    rows = out.reshape(WORLD, -1)
    return all(rows[k].tobytes() == rows[0].tobytes() for k in range(WORLD))


def expect_raise(bad, name, exc, call):
    try:
        call()
        bad.append("%s: no error" % name)
    except exc:
        pass
    except Exception as e:      # noqa: BLE001
        bad.append("%s: %s instead of %s (%s)" % (name, type(e).__name__, exc.__name__, e))


def scenario_compress(hosts):
    H = int(hosts)
    os.environ["DISTMESH_TEST_HOST_ID"] = "h%d" % (RANK % H)
    os.environ.pop("DISTMESH_COMPRESS", None)           # compress=None: no compression
    c = distmesh.init(timeout=30)
    S = distmesh.ReduceOp.SUM
    out = {"rank": RANK, "transport": c.transport, "bad": []}
    bad = out["bad"]
    x = compress_input(RANK)
    exact, b_int8, b_bf16 = compress_bounds(H)
    plain = {}
    out["plain_algorithm"] = {}
    for opn, op in (("sum", S), ("mean", distmesh.ReduceOp.MEAN)):
        plain[opn] = x.copy()
        c.all_reduce(plain[opn], op)
        out["plain_algorithm"][opn] = c.last_algorithm
    # each mode and op: the same bytes everywhere, the algorithm, the error against the bound
    out["modes"] = {}
    for mode, bound in (("int8", b_int8), ("bf16", b_bf16)):
        for opn, op, div in (("sum", S, 1), ("mean", distmesh.ReduceOp.MEAN, WORLD)):
            y = x.copy()
            c.all_reduce(y, op, compress=mode)
            algo = c.last_algorithm
            err = np.abs(y.astype(np.float64) - exact / div)
            out["modes"]["%s %s" % (mode, opn)] = {
                "algorithm": algo, "same_bytes": same_everywhere(c, y),
                "worst": float(np.max(err / (bound / div))), "errors": int(np.count_nonzero(err)),
                "equals_plain": y.tobytes() == plain[opn].tobytes()}
    # send= and async_op=True take the mode too
    y = np.zeros_like(x)
    c.all_reduce(y, S, send=x, compress="int8")
    z = x.copy()
    c.all_reduce(z, S, compress="int8", async_op=True).wait()
    w = x.copy()
    c.all_reduce(w, S, compress="int8")
    out["send_async_same"] = [y.tobytes() == w.tobytes(), z.tobytes() == w.tobytes()]
    # error feedback: the residual after one call; the running mean of K calls on the same input
    st = distmesh.CompressState(CN)
    res = np.frombuffer(st.residual, np.float32)
    out["state_fresh_zero"] = bool(np.all(res == 0)) and st.count == CN
    single = x.copy()
    c.all_reduce(single, S, compress="int8")
    K = 40
    acc = np.zeros(CN, np.float64)
    for k in range(K):
        y = x.copy()
        c.all_reduce(y, S, compress="int8", state=st)
        acc += y
        if k == 0:
            out["residual_nonzero"] = int(np.count_nonzero(res))
            out["first_with_state_equals_without"] = y.tobytes() == single.tobytes()
    out["state_mean_worst"] = float(np.max(np.abs(acc / K - exact) / b_int8))
    out["single_worst"] = float(np.max(np.abs(single.astype(np.float64) - exact) / b_int8))
    out["state_same_bytes"] = same_everywhere(c, y)
    st.reset()
    out["reset_zero"] = bool(np.all(res == 0))
    # an async call holds its state: a reference while in flight, Busy for a second user
    st2 = distmesh.CompressState(CN)
    refs = sys.getrefcount(st2)
    y = x.copy()
    req = c.all_reduce(y, S, compress="int8", state=st2, async_op=True)
    held = sys.getrefcount(st2) - refs
    expect_raise(bad, "second call on a held state", distmesh.Busy,
                 lambda: c.all_reduce(x.copy(), S, compress="int8", state=st2))
    expect_raise(bad, "reset of a held state", distmesh.Busy, st2.reset)
    req.wait()
    out["async_state_refs"] = [held, sys.getrefcount(st2) - refs]
    out["async_state_result"] = y.tobytes() == single.tobytes()
    # refusals before anything is sent, on every rank alike
    seq = c.sequence
    expect_raise(bad, "int32 with int8", distmesh.InvalidArgument,
                 lambda: c.all_reduce(np.ones(300, np.int32), S, compress="int8"))
    expect_raise(bad, "MAX with int8", distmesh.InvalidArgument,
                 lambda: c.all_reduce(x.copy(), distmesh.ReduceOp.MAX, compress="int8"))
    expect_raise(bad, "PROD with bf16", distmesh.InvalidArgument,
                 lambda: c.all_reduce(x.copy(), distmesh.ReduceOp.PROD, compress="bf16"))
    expect_raise(bad, "state of another count", distmesh.InvalidArgument,
                 lambda: c.all_reduce(x.copy(), S, compress="int8", state=distmesh.CompressState(CN - 1)))
    expect_raise(bad, "bad mode name", ValueError, lambda: c.all_reduce(x.copy(), S, compress="int4"))
    expect_raise(bad, "mode not a str", TypeError, lambda: c.all_reduce(x.copy(), S, compress=8))
    expect_raise(bad, "state not a CompressState", TypeError, lambda: c.all_reduce(x.copy(), S, state=res))
    if c.sequence != seq:
        bad.append("refused calls counted as collectives (sequence %d -> %d)" % (seq, c.sequence))
    ok = np.ones(3, np.float32)
    c.all_reduce(ok, S)
    out["after_refusals"] = ok.tolist()
    # modes that differ between ranks: every rank fails with Mismatch
    try:
        c.all_reduce(x.copy(), S, compress="int8" if RANK == 0 else "bf16")
        out["mismatch"] = "no error"
    except distmesh.Error as e:
        out["mismatch"] = type(e).__name__
    c.close()
    say("RESULT", out)


def scenario_compress_ddp(init, hosts):
    import torch
    import torch.distributed as dist
    import distmesh.torch as dmt
    H = int(hosts)
    os.environ["DISTMESH_TEST_HOST_ID"] = "h%d" % (RANK % H)
    os.environ.pop("DISTMESH_COMPRESS", None)           # the exact run compresses nothing
    torch.set_num_threads(1)
    limit = datetime.timedelta(seconds=60)
    dist.init_process_group("distmesh", init_method=init, rank=RANK, world_size=WORLD, timeout=limit)
    gloo = dist.new_group(backend="gloo", timeout=limit)
    out = {"rank": RANK, "torch": torch.__version__, "bad": []}
    expect_raise(out["bad"], "compress_hook('int4')", ValueError, lambda: dmt.compress_hook("int4"))
    expect_raise(out["bad"], "hook on a gloo group", TypeError, lambda: dmt.compress_hook("int8")(gloo, None))

    def train(mode, steps=30):
        # 1.1 MB of parameters: DDP's first bucket takes 1 MB, the rest goes in 64 KB buckets
        torch.manual_seed(1234)
        model = torch.nn.Sequential(torch.nn.Linear(32, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                    torch.nn.ReLU(), torch.nn.Linear(512, 8))
        start = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.0625)
        hook = None
        if mode:
            hook = dmt.compress_hook(mode)
            ddp.register_comm_hook(None, hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.2)
        g = torch.Generator().manual_seed(99 + RANK)
        losses = []
        for _ in range(steps):
            x = torch.randn(16, 32, generator=g)
            loss = (ddp(x) - x[:, :8]).pow(2).mean()        # learn to pass 8 inputs through
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss))
        algo = dmt.collective().last_algorithm
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), losses, algo, hook, start
    t0 = time.monotonic()
    mine, losses, algo, hook, start = train("int8")
    exact, exact_losses, exact_algo, _, _ = train(None)
    out["ddp_s"] = time.monotonic() - t0
    out["algorithm"], out["exact_algorithm"] = algo, exact_algo
    out["losses"] = [sum(losses[:5]) / 5, sum(losses[-5:]) / 5]
    out["exact_losses"] = [sum(exact_losses[:5]) / 5, sum(exact_losses[-5:]) / 5]
    outs = [torch.empty_like(mine) for _ in range(WORLD)]
    dist.all_gather(outs, mine)
    out["same_params"] = all(torch.equal(o, outs[0]) for o in outs)
    out["moved"] = float((exact - start).abs().max())
    out["diff_from_exact"] = float((mine - exact).abs().max())
    states = hook.states
    out["states"] = sorted((k, s.count) for k, s in states.items())
    out["residual_nonzero"] = sum(int(torch.count_nonzero(torch.frombuffer(s.residual, dtype=torch.float32)))
                                  for s in states.values() if s.count)
    dist.barrier()
    dist.destroy_process_group()
    say("RESULT", out)


def train_init():
    import torch
    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    return [p.detach().clone() for p in model.parameters()]


def main():
    try:
        scenario = sys.argv[1]
        if scenario == "cases":
            scenario_cases(sys.argv[2])
        elif scenario == "failures":
            scenario_failures()
        elif scenario == "torch":
            scenario_torch(sys.argv[2])
        elif scenario == "torch_inline":
            scenario_torch_inline(sys.argv[2])
        elif scenario == "compress":
            scenario_compress(sys.argv[2])
        elif scenario == "compress_ddp":
            scenario_compress_ddp(sys.argv[2], sys.argv[3])
        else:
            raise SystemExit("unknown scenario %s" % scenario)
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        say("ERROR", traceback.format_exc().replace("\n", " | "))
        sys.exit(1)


if __name__ == "__main__":
    main()
