"""The collective cases of ref_collectives.c, run through the Python package: each rank takes
its input from the C program's file, runs the call on its own buffers, and compares what it
gets with the C library's bytes. Used by the threaded-world tests (in this process) and by
the process workers (worker.py)."""
import array

import numpy as np

try:
    import torch
except ImportError:         # the bfloat16 cases need torch tensors (numpy has no bfloat16)
    torch = None

NP = {"int8": np.int8, "uint8": np.uint8, "int32": np.int32, "uint32": np.uint32, "int64": np.int64,
      "uint64": np.uint64, "float16": np.float16, "float32": np.float32, "float64": np.float64}
OPS = {"sum": "sum", "prod": "prod", "max": "max", "min": "min", "mean": "mean"}


def load(path):
    """[(name, kind, dtype, op, count, root, [(in bytes, out bytes) per rank])]"""
    cases = []
    with open(path, "rb") as f:
        magic, world = f.readline().split()
        assert magic == b"DMREF1"
        while True:
            line = f.readline()
            if not line:
                break
            name, _kind, _dt, _op, count, root = line.decode().split()
            kind, dtype, opname = name.split("/")[:3]
            ranks = []
            for _ in range(int(world)):
                nin, nout = (int(x) for x in f.readline().split())
                ranks.append((f.read(nin), f.read(nout)))
            cases.append((name, kind, dtype, opname, int(count), int(root), ranks))
    return cases


def _buf(raw, dtype, kind):
    """A writable buffer holding raw, of one of the kinds the package takes (rotated by kind)."""
    if dtype == "bfloat16":
        t = torch.frombuffer(bytearray(raw), dtype=torch.bfloat16) if raw else torch.empty(0, dtype=torch.bfloat16)
        return t
    a = np.frombuffer(bytearray(raw), dtype=NP[dtype]).copy()
    if kind == "array" and dtype in ("int8", "int32", "float64", "uint8"):
        code = {"int8": "b", "int32": "i", "float64": "d", "uint8": "B"}[dtype]
        return array.array(code, a.tobytes())
    if kind == "memoryview":
        return memoryview(a)
    if kind == "torch" and torch is not None and dtype in ("float32", "float64", "int32", "int64", "int8", "uint8"):
        return torch.from_numpy(a)
    if kind == "bytearray" and dtype == "uint8":
        return bytearray(a.tobytes())
    return a


def _bytes(b):
    if torch is not None and isinstance(b, torch.Tensor):
        return b.view(torch.uint8).numpy().tobytes() if b.numel() else b""
    return bytes(memoryview(b).cast("B")) if not isinstance(b, np.ndarray) else b.tobytes()


KINDS = ["numpy", "array", "memoryview", "torch", "bytearray"]


def v_count(i, j):
    return (i + 2 * j) % 3


def run(coll, cases, async_every=3):
    """Runs every case on coll (this rank), every async_every-th one through async_op=True.
    Returns a list of failure descriptions (empty: every byte as the C library's)."""
    r, W = coll.rank, coll.world_size
    bad = []
    for n, (name, kind, dtype, opname, count, root, ranks) in enumerate(cases):
        if dtype == "bfloat16" and torch is None:
            continue
        raw_in, want = ranks[r]
        bk = KINDS[n % len(KINDS)]
        inp = _buf(raw_in, dtype, bk)
        out = _buf(bytes(len(want)), dtype, bk)
        aop = n % async_every == 0
        req = None
        if kind == "all_reduce":
            out = _buf(raw_in, dtype, bk)
            req = coll.all_reduce(out, OPS[opname], async_op=aop)
        elif kind == "all_gather":
            req = coll.all_gather(out, inp, async_op=aop)
        elif kind == "all_gather_to_list":
            full = np.zeros(len(want), np.uint8)
            outs = [full[k * len(raw_in):(k + 1) * len(raw_in)].view(NP[dtype]) for k in range(W)]
            req = coll.all_gather_to_list(outs, inp, async_op=aop)
            out = full
        elif kind == "reduce_scatter":
            req = coll.reduce_scatter(out, inp, OPS[opname], async_op=aop)
        elif kind == "broadcast":
            out = _buf(raw_in, dtype, bk)
            req = coll.broadcast(out, root, async_op=aop)
        elif kind == "reduce":
            out = _buf(raw_in, dtype, bk)
            req = coll.reduce(out, root, OPS[opname], async_op=aop)
        elif kind == "gather":
            req = coll.gather(inp, out if r == root else None, root, async_op=aop)
        elif kind == "scatter":
            req = coll.scatter(out, inp if r == root else None, root, async_op=aop)
        elif kind == "all_to_all":
            req = coll.all_to_all(out, inp, async_op=aop)
        elif kind == "all_to_all_v":
            req = coll.all_to_all_v(out, [v_count(j, r) for j in range(W)], inp, [v_count(r, j) for j in range(W)],
                                    async_op=aop)
        elif kind == "sendrecv":
            s = coll.send(inp, (r + 1) % W, 5, async_op=aop)
            req = coll.recv(out, (r - 1) % W, 5, async_op=aop)
            if aop:
                s.wait()
        else:
            bad.append("%s: unknown kind" % name)
            continue
        if aop:
            if req is None:
                bad.append("%s: async_op=True returned None" % name)
                continue
            req.wait()
            if not req.is_completed():
                bad.append("%s: is_completed() False after wait()" % name)
        got = _bytes(out)
        if kind in ("reduce", "gather") and r != root:
            continue                    # defined at the root only
        if got != want:
            first = next((i for i in range(min(len(got), len(want))) if got[i] != want[i]), None)
            bad.append("%s (rank %d, %s buffers%s): %d bytes differ from the C library's, first at byte %s" % (
                name, r, bk, ", async" if aop else "", sum(a != b for a, b in zip(got, want)), first))
    return bad
