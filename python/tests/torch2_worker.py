"""One rank of the torch 2.x tests (test_torch2.py starts it through conftest.World, RANK and
WORLD_SIZE set): the seeds' torch 2.x stack over the "distmesh" backend against Gloo in the
same processes. Scenarios (each prints one RESULT line of JSON, "bad" listing what differed):
    stack INIT CKPT   the calls 2.x adds (coalescing manager, functional collectives, the
                      coalesced tensor forms), DDP with and without bf16_compress_hook,
                      init_device_mesh and DistributedInterface.get_device_mesh, FSDP2
                      (fully_shard, bf16 params / fp32 reduce) and tensor parallel against
                      Gloo; CKPT given: the FSDP2 model saved there with Distributed Checkpoint
    load INIT CKPT    that checkpoint loaded into an FSDP2 model of this world (resharded),
                      under distmesh and under Gloo, against the full parameters saved beside
    torchrun          under torchrun, torch.distributed not initialized: DistributedInterface()
                      initializes it ("distmesh", env://), get_device_mesh returns
                      DeviceMeshes; FSDP2 steps on the mp_shard mesh
    p2p INIT          point-to-point posted in any order and from any source, under "distmesh"
                      with a 10 s deadline: irecv before isend on every rank (a ring),
                      batch_isend_irecv with its irecv first, dist.recv(t) from any source
                      (returns the sender), and the same through the group's Collective
    pgworld - CKPT    a Collective's process_group in torch.distributed's world maps, made the
                      default group; new groups, DeviceMeshes (Optimus-DL's dp_mesh / tp_mesh)
                      and Distributed Checkpoint on it (DISTMESH_STORE from the test)
    iface INIT        LLaMA-Factory 0.9.5's calls on DistributedInterface at 4 ranks (its
                      singleton, defaults, tensor-likes, DeviceMeshes and torch groups)
    restart           under torchrun --max-restarts 1: DDP for 20 steps; in the first attempt
                      rank 1 kills itself (SIGKILL) at step 5, the others fail with PeerLost,
                      the second attempt meets afresh and trains to the end
"""
import datetime
import json
import os
import sys
import time
import traceback

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import distmesh
import distmesh.torch  # noqa: F401  (registers the backend)

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
LIMIT = datetime.timedelta(seconds=60)
torch.set_num_threads(1)


def say(word, payload):
    sys.stdout.write("%s %s\n" % (word, json.dumps(payload)))
    sys.stdout.flush()


def close(a, b, tol):
    return float((a.double() - b.double()).abs().max()) <= tol if a.numel() else True


def check(bad, name, a, b, tol=0.0):
    a = a if isinstance(a, (list, tuple)) else [a]
    b = b if isinstance(b, (list, tuple)) else [b]
    for x, y in zip(a, b):
        if x.shape != y.shape or not close(x, y, tol):
            bad.append("%s: %s vs gloo %s" % (name, x.reshape(-1)[:4].tolist(), y.reshape(-1)[:4].tolist()))
            return


def data(seed, n, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed * 100 + RANK)
    if dtype.is_floating_point:
        return (torch.randn(n, generator=g) * 10).to(dtype)
    return torch.randint(-1000, 1000, (n,), generator=g).to(dtype)


# ---- the calls torch 2.x adds -------------------------------------------------------------
def calls_2x(gloo, bad):
    import torch.distributed._functional_collectives as fc
    # integers: every result bitwise equal to Gloo's
    for aop in (False, True):
        ins = [data(1, 12, torch.int64), data(2, 20, torch.int64)]
        outs = [torch.empty(12 * WORLD, dtype=torch.int64), torch.empty(20 * WORLD, dtype=torch.int64)]
        with dist._coalescing_manager(async_ops=aop) as cm:
            for o, i in zip(outs, ins):
                dist.all_gather_into_tensor(o, i)
        if aop:
            cm.wait()
        want = [torch.empty_like(o) for o in outs]
        for w, i in zip(want, ins):
            dist.all_gather_into_tensor(w, i, group=gloo)
        check(bad, "coalesced all_gather_into_tensor%s" % (" async" if aop else ""), outs, want)

        ins = [data(3, 8 * WORLD, torch.int64), data(4, 4 * WORLD, torch.int64)]
        outs = [torch.empty(8, dtype=torch.int64), torch.empty(4, dtype=torch.int64)]
        with dist._coalescing_manager(async_ops=aop) as cm:
            for o, i in zip(outs, ins):
                dist.reduce_scatter_tensor(o, i)
        if aop:
            cm.wait()
        want = [torch.empty_like(o) for o in outs]
        for w, i in zip(want, ins):
            dist.reduce_scatter_tensor(w, i, group=gloo)
        check(bad, "coalesced reduce_scatter_tensor%s" % (" async" if aop else ""), outs, want)

        ts = [data(5, 9, torch.int32), data(6, 3, torch.int32)]
        ref = [t.clone() for t in ts]
        with dist._coalescing_manager(async_ops=aop) as cm:
            for t in ts:
                dist.all_reduce(t)
        if aop:
            cm.wait()
        for t in ref:
            dist.all_reduce(t, group=gloo)
        check(bad, "coalesced all_reduce%s" % (" async" if aop else ""), ts, ref)

    world = dist.group.WORLD
    x = data(7, 6 * WORLD, torch.int64)
    pairs = [
        ("funcol all_gather_tensor", lambda g: fc.all_gather_tensor(x, 0, g)),
        ("funcol reduce_scatter_tensor", lambda g: fc.reduce_scatter_tensor(x, "sum", 0, g)),
        ("funcol all_reduce", lambda g: fc.all_reduce(x, "sum", g)),
        ("funcol all_to_all_single", lambda g: fc.all_to_all_single(x, None, None, g)),
        ("funcol broadcast", lambda g: fc.broadcast(x, WORLD - 1, g)),
        ("funcol all_gather_into_tensor_coalesced", lambda g: fc.all_gather_into_tensor_coalesced([x, x[:3]], g)),
        ("funcol reduce_scatter_tensor_coalesced",
         lambda g: fc.reduce_scatter_tensor_coalesced([x, x[:2 * WORLD]], "sum", [0, 0], g)),
    ]
    for name, fn in pairs:
        got, want = fn(world), fn(gloo)
        got = [fc.wait_tensor(t) for t in got] if isinstance(got, list) else fc.wait_tensor(got)
        want = [fc.wait_tensor(t) for t in want] if isinstance(want, list) else fc.wait_tensor(want)
        check(bad, name, got, want)
    # a float sum: within rounding of Gloo's
    f = data(8, 1000)
    got, want = f.clone(), f.clone()
    dist.all_reduce(got, op=dist.ReduceOp.AVG)
    dist.all_reduce(want, group=gloo)
    check(bad, "all_reduce AVG", got, want / WORLD, 1e-4)
    # the Work of 2.x: a Python Work over the distmesh request, with a future
    t = data(9, 100)
    w = dist.all_reduce(t, async_op=True)
    if not isinstance(w, distmesh.torch.Work):
        bad.append("async_op=True returned %r, not distmesh.torch.Work" % type(w))
    fut = w.get_future()
    w.wait()
    if not (w.is_completed() and w.is_success() and fut.wait()[0] is t):
        bad.append("Work after wait: completed %s success %s" % (w.is_completed(), w.is_success()))


# ---- DDP -------------------------------------------------------------------------------------
def ddp_train(group, hook):
    torch.manual_seed(1234)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
    ddp = nn.parallel.DistributedDataParallel(model, process_group=group, bucket_cap_mb=0.01)
    if hook:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        # DDP refuses bf16_compress_hook by its name without CUDA and NCCL (torch/nn/parallel/
        # distributed.py, _check_comm_hook); the same function under another name runs on CPU
        def bf16_hook(state, bucket):
            return default_hooks.bf16_compress_hook(state, bucket)
        ddp.register_comm_hook(group if group is not None else dist.group.WORLD, bf16_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(99 + RANK)
    for _ in range(10):
        loss = ddp(torch.randn(16, 32, generator=g)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


# ---- a small decoder-only transformer ------------------------------------------------------
# make test's size, small enough for CI; DM_FSDP_FULL=1 (make test-fsdp-full): the model,
# 4 layers of d_model 256 over a vocabulary of 1000, trained 20 steps.
FULL = os.environ.get("DM_FSDP_FULL") == "1"
VOCAB, D, LAYERS, HEADS, SEQ = (1000, 256, 4, 4, 64) if FULL else (1000, 64, 2, 4, 16)
FSDP_STEPS = 20 if FULL else 5


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.w1, self.w2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, HEADS, D // HEADS).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, D))
        return x + self.w2(F.gelu(self.w1(self.ln2(x))))


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList([Block() for _ in range(LAYERS)])
        self.norm, self.head = nn.LayerNorm(D), nn.Linear(D, VOCAB)

    def forward(self, tokens, ckpt=False):
        x = self.emb(tokens)
        for layer in self.layers:
            if ckpt:
                from torch.utils.checkpoint import checkpoint
                x = checkpoint(layer, x, use_reentrant=False)
            else:
                x = layer(x)
        return self.head(self.norm(x))


def batches(n, seed):
    """One batch per rank, n times: the loss has to go down."""
    g = torch.Generator().manual_seed(seed + RANK)
    return [torch.randint(0, VOCAB, (2, SEQ + 1), generator=g)] * n


def fsdp2_train(mesh, reshard, ckpt, steps=FSDP_STEPS):
    """The seed's engine: fully_shard per layer and at the top, bf16 params / fp32 reduce.
    Returns (losses, full parameters, the model)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    torch.manual_seed(7)
    model = Decoder()
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for b in batches(steps, 11):
        logits = model(b[:, :-1], ckpt=ckpt)
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), b[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses, full_params(model), model


def full_params(model):
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().float().clone()
            for n, p in model.named_parameters()}


def same_params(bad, name, a, b, tol):
    for k in a:
        if not close(a[k], b[k], tol):
            bad.append("%s: %s differs by %g" % (name, k, float((a[k] - b[k]).abs().max())))
            return


# ---- tensor parallel -----------------------------------------------------------------------
class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w2 = nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x):
        return self.w2(F.relu(self.w1(x)))


def tp_run(tp_mesh):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    torch.manual_seed(3)
    model = parallelize_module(MLP(), tp_mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(5)                # the same input on every tp rank
    outs = []
    for _ in range(3):
        y = model(torch.randn(4, 16, generator=g))
        y.pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        outs.append(y.detach().clone())
    return outs, full_params(model)


def group_backends(mesh):
    return sorted({dist.get_backend(mesh.get_group(d)) for d in range(mesh.ndim)})


def scenario_stack(init, ckpt):
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    dist.init_process_group("distmesh", init_method=init, rank=RANK, world_size=WORLD, timeout=LIMIT)
    gloo = dist.new_group(backend="gloo", timeout=LIMIT)
    bad, out, t0 = [], {"rank": RANK, "torch": torch.__version__, "s": {}}, time.monotonic()
    out["bad"] = bad

    def lap(name):
        nonlocal t0
        out["s"][name] = round(time.monotonic() - t0, 2)
        t0 = time.monotonic()

    lap("init")
    calls_2x(gloo, bad)
    lap("calls")
    for hook in (False, True):
        mine, theirs = ddp_train(None, hook), ddp_train(gloo, hook)
        diff = max(float((a - b).abs().max()) for a, b in zip(mine, theirs))
        out["ddp_hook_diff" if hook else "ddp_diff"] = diff
        if diff > (1e-6 if not hook else 1e-4):
            bad.append("DDP%s: parameters differ from Gloo's by %g" % (" bf16_compress_hook" if hook else "", diff))
    lap("ddp")

    # meshes: the distmesh ones from the default group, Gloo's through backend_override
    shape = (2, WORLD // 2) if WORLD >= 4 else (1, WORLD)
    names = ("dp", "tp")
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    gmesh = init_device_mesh("cpu", shape, mesh_dim_names=names, backend_override={n: "gloo" for n in names})
    out["mesh_backends"] = group_backends(mesh)
    out["gloo_mesh_backends"] = group_backends(gmesh)
    t = data(20, 10, torch.int64)
    want = t.clone()
    dist.all_reduce(t, group=mesh.get_group("tp"))
    dist.all_reduce(want, group=gmesh.get_group("tp"))
    check(bad, "all_reduce over the mesh's tp group", t, want)

    # LLaMA-Factory's interface over the same world: a DeviceMesh per dim
    iface = distmesh.DistributedInterface({"mp_replicate_size": shape[0]}, world=distmesh.torch.collective())
    dm = iface.get_device_mesh(distmesh.Dim.MP_SHARD)
    out["iface_mesh"] = [type(dm).__module__ + "." + type(dm).__name__, dm.size(), dm.mesh_dim_names,
                         dist.get_backend(dm.get_group()), dm.get_local_rank() == iface.get_rank("mp_shard")]
    if not isinstance(dm, DeviceMesh):
        bad.append("get_device_mesh returned %r" % type(dm))
    lap("mesh")

    # FSDP2 over the full world (1-D), both reshard settings, with checkpointing on one
    one = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("shard",))
    gone = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("shard",), backend_override={"shard": "gloo"})
    out["fsdp_backends"] = group_backends(one) + group_backends(gone)
    out["fsdp_losses"] = []
    model = None
    for reshard, ck in ((True, False), (False, True)):
        l1, p1, m1 = fsdp2_train(one, reshard, ck)
        l2, p2, _ = fsdp2_train(gone, reshard, ck)
        out["fsdp_losses"].append([l1, l2])
        if max(abs(a - b) for a, b in zip(l1, l2)) > 2e-3:
            bad.append("FSDP2 reshard=%s: losses %s vs gloo %s" % (reshard, l1, l2))
        same_params(bad, "FSDP2 reshard=%s" % reshard, p1, p2, 2e-3)
        if model is None:
            model, full = m1, p1
    if WORLD >= 4:                              # HSDP: replicate x shard
        l1, p1, _ = fsdp2_train(mesh, True, False)
        l2, p2, _ = fsdp2_train(gmesh, True, False)
        out["hsdp_losses"] = [l1, l2]
        if max(abs(a - b) for a, b in zip(l1, l2)) > 2e-3:
            bad.append("HSDP: losses %s vs gloo %s" % (l1, l2))
        same_params(bad, "HSDP", p1, p2, 2e-3)
    lap("fsdp2")

    # tensor parallel on the tp dim of the 2-D mesh
    y1, p1 = tp_run(mesh["tp"])
    y2, p2 = tp_run(gmesh["tp"])
    check(bad, "tensor parallel outputs", y1, y2, 1e-5)
    same_params(bad, "tensor parallel", p1, p2, 1e-5)
    lap("tp")

    if ckpt:                                    # Distributed Checkpoint of the FSDP2 model
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_model_state_dict
        dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=ckpt)
        if RANK == 0:
            torch.save(full, os.path.join(ckpt, "full.pt"))
        dist.barrier()
        lap("dcp_save")
    dist.destroy_process_group()
    say("RESULT", out)


def scenario_load(init, ckpt):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    dist.init_process_group("distmesh", init_method=init, rank=RANK, world_size=WORLD, timeout=LIMIT)
    bad, out = [], {"rank": RANK}
    out["bad"] = bad
    full = torch.load(os.path.join(ckpt, "full.pt"))
    for backend in ("distmesh", "gloo"):
        mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("shard",),
                                backend_override=None if backend == "distmesh" else {"shard": "gloo"})
        torch.manual_seed(99)                   # other weights than the saved ones
        model = Decoder()
        for layer in model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        sd = {"model": get_model_state_dict(model)}
        dcp.load(sd, checkpoint_id=ckpt, process_group=mesh.get_group())
        set_model_state_dict(model, sd["model"])
        got = full_params(model)
        out[backend] = dist.get_backend(mesh.get_group())
        same_params(bad, "loaded under %s" % backend, got, full, 0.0)
    dist.destroy_process_group()
    say("RESULT", out)


def scenario_torchrun(init, ckpt):
    from torch.distributed.device_mesh import DeviceMesh
    bad, out = [], {"rank": RANK}
    out["bad"] = bad
    iface = distmesh.DistributedInterface({"mp_replicate_size": 1})
    if not dist.is_initialized():           # LLaMA-Factory's __init__ initializes it
        bad.append("torch.distributed not initialized by DistributedInterface()")
    shard, dp = iface.get_device_mesh(distmesh.Dim.MP_SHARD), iface.get_device_mesh(distmesh.Dim.DP)
    out["meshes"] = [type(m).__name__ for m in (shard, dp)] + [dist.get_backend(), dist.get_backend(shard.get_group())]
    if not (isinstance(shard, DeviceMesh) and isinstance(dp, DeviceMesh)):
        bad.append("get_device_mesh: %r, %r" % (type(shard), type(dp)))
    t = torch.full((4,), float(RANK + 1))
    dist.all_reduce(t, group=dp.get_group())
    want = torch.full((4,), float(WORLD * (WORLD + 1) // 2))
    check(bad, "all_reduce over the dp mesh", t, want)
    losses = fsdp2_train(shard, True, False, steps=3)[0]
    out["losses"] = losses
    if not losses[-1] < losses[0]:
        bad.append("FSDP2 under torchrun: loss %s" % losses)
    dist.destroy_process_group()
    iface.destroy()
    say("RESULT", out)


def scenario_restart(init, ckpt):
    import signal
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    out = {"rank": RANK, "attempt": attempt}
    if attempt > 0 and RANK == 0:       # the others look for the new attempt's keys first:
        time.sleep(2)                   # what the dead attempt left must not be what they find
    dist.init_process_group("distmesh", timeout=LIMIT)
    torch.manual_seed(1234)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(99 + RANK)
    for step in range(20):
        if attempt == 0 and RANK == 1 and step == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        loss = ddp(torch.randn(16, 32, generator=g)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    out["steps"] = step + 1
    t = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ref = t.clone()
    dist.broadcast(ref, 0)
    out["same_params"] = bool(torch.equal(t, ref))     # DDP kept the replicas equal
    dist.destroy_process_group()
    say("RESULT", out)


# ---- defects torch's own distributed suite found (issue 51) ---------------------------------
def scenario_fixes(init, ckpt):
    """Each check fails on the code before its fix: init with RANK unset (torch's test runner
    exports WORLD_SIZE only), all_gather_coalesced's layout against Gloo, a barrier timeout
    raised as torch's DistBackendError, Work.wait(timeout), destroy_process_group closing the
    collective, split_group."""
    import re
    bad, out = [], {"rank": RANK}
    out["bad"] = bad
    del os.environ["RANK"]                      # explicit arguments must win over the environment
    dist.init_process_group("distmesh", init_method=init, rank=RANK, world_size=WORLD, timeout=LIMIT)
    gloo = dist.new_group(backend="gloo", timeout=LIMIT)
    out["init"] = dist.get_rank() == RANK and dist.get_world_size() == WORLD

    # all_gather_coalesced: output_tensor_lists[rank][i] is rank's tensor i, shapes of their own
    def ins():
        return [torch.full((2,), float(RANK + 1)), torch.empty(0), torch.arange(6.).view(2, 3) * (RANK + 1)]
    outs = [[torch.zeros_like(t) for t in ins()] for _ in range(WORLD)]
    want = [[torch.zeros_like(t) for t in ins()] for _ in range(WORLD)]
    dist.all_gather_coalesced(outs, ins())
    dist.all_gather_coalesced(want, ins(), group=gloo)
    check(bad, "all_gather_coalesced", [t for ts in outs for t in ts], [t for ts in want for t in ts])
    out["coalesced"] = [[t.tolist() for t in ts] for ts in outs]

    # a barrier that only rank 0 enters times out as torch's DistBackendError, and as distmesh's
    short = dist.new_group(timeout=datetime.timedelta(seconds=1))
    if RANK == 0:
        t0 = time.monotonic()
        try:
            dist.barrier(group=short)
            bad.append("barrier with one rank absent returned")
        except Exception as e:                  # noqa: BLE001 -- its type is what is checked
            out["timeout_types"] = [isinstance(e, dist.DistBackendError), isinstance(e, distmesh.Timeout)]
            out["timeout_text"] = bool(re.search(" (Timed out|closed|timeout) ", str(e)))
            out["timeout_s"] = time.monotonic() - t0
    dist.barrier(group=gloo)
    dist.destroy_process_group(short)

    # Work.wait(timeout): rank 1 joins 3 s late; rank 0's wait of 0.3 s raises, a plain wait completes
    distmesh.torch.INLINE_MAX_BYTES = 0         # every call a request, so async_op returns at once
    t = torch.ones(8)
    if RANK == 1:
        time.sleep(3)
    w = dist.all_reduce(t, async_op=True)
    if RANK == 0:
        t0 = time.monotonic()
        try:
            w.wait(timeout=datetime.timedelta(seconds=0.3))
            bad.append("Work.wait(timeout=0.3 s) returned before the other rank joined")
        except dist.DistBackendError as e:
            out["wait_timeout"] = [time.monotonic() - t0, "Timed out" in str(e), isinstance(e, distmesh.Timeout)]
    w.wait()
    out["wait_result"] = t.tolist()
    distmesh.torch.INLINE_MAX_BYTES = 64 << 10

    # split_group: every rank its own group, then all ranks together
    pg = dist.distributed_c10d._get_default_group()
    out["supports_splitting"] = pg.supports_splitting
    solo = pg.split_group([RANK])
    pair = pg.split_group(list(range(WORLD)))
    t = torch.full((3,), float(RANK + 1))
    solo.allreduce([t]).wait()
    u = torch.full((3,), float(RANK + 1))
    pair.allreduce([u]).wait()
    out["split"] = [solo.size(), pair.size(), pair.rank(), t.tolist(), u.tolist()]
    solo.shutdown()
    pair.shutdown()

    # destroy_process_group closes the collectives it made
    sub = dist.new_group(list(range(WORLD)))
    colls = [distmesh.torch.collective(), distmesh.torch.collective(sub)]
    dist.destroy_process_group()
    out["closed_after_destroy"] = [c.closed for c in colls]
    say("RESULT", out)


def scenario_p2p(init, ckpt):
    dist.init_process_group("distmesh", init_method=init, rank=RANK, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=10))
    bad, out = [], {"rank": RANK}
    out["bad"] = bad
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD

    def got(name, t, want):
        if t.tolist() != want:
            bad.append("%s: %s, want %s" % (name, t.tolist(), want))

    # irecv, then isend, then wait: every rank at once
    r, s = torch.zeros(4), torch.full((4,), float(RANK))
    rw = dist.irecv(r, prv)
    sw = dist.isend(s, nxt)
    sw.wait()
    rw.wait()
    got("irecv before isend", r, [float(prv)] * 4)
    # batch_isend_irecv, the irecv first (8 MiB: more than a link holds)
    big = 2 << 20
    r2, s2 = torch.zeros(big), torch.full((big,), float(RANK + 100))
    for w in dist.batch_isend_irecv([dist.P2POp(dist.irecv, r2, prv), dist.P2POp(dist.isend, s2, nxt)]):
        w.wait()
    got("batch_isend_irecv", r2[:2], [float(prv + 100)] * 2)
    if float(r2.min()) != float(prv + 100) or float(r2.max()) != float(prv + 100):
        bad.append("batch_isend_irecv: 8 MiB not all received")
    # recv from any source: rank 0 takes one message from each other rank
    t = torch.zeros(3)
    if RANK == 0:
        senders = []
        for _ in range(WORLD - 1):
            src = dist.recv(t)
            senders.append(src)
            got("recv from %s" % src, t, [10.0 * src] * 3)
        out["senders"] = sorted(senders)
        w = dist.irecv(t, tag=3)                # the Work: source_rank() once complete
        w.wait()
        out["irecv_any"] = [w.source_rank(), w._source_rank(), t.tolist()]     # torch's suite calls the second
    else:
        dist.send(torch.full((3,), 10.0 * RANK), 0)
        if RANK == WORLD - 1:
            dist.send(torch.full((3,), 5.0), 0, tag=3)
    # the group's Collective: recv first as requests, then recv(buf, None)
    c = distmesh.torch.collective()
    a = torch.zeros(2, dtype=torch.int64)
    q = c.recv(a, prv, 9, async_op=True)
    p = c.send(torch.full((2,), RANK, dtype=torch.int64), nxt, 9, async_op=True)
    p.wait()
    out["collective_recv_first"] = [q.wait(), a.tolist()]
    if RANK == 0:
        out["collective_any"] = [c.recv(a, None, 11), a.tolist()]
    elif RANK == WORLD - 1:
        c.send(torch.full((2,), 42, dtype=torch.int64), 0, 11)
    dist.barrier()
    dist.destroy_process_group()
    say("RESULT", out)


# ---- the seeds' projects as they ship (issue 51) -----------------------------------------------
def scenario_iface(init, ckpt):
    """LLaMA-Factory 0.9.5's calls on DistributedInterface (dp 2 x cp 2 at 4 ranks; dp groups
    {0,2} {1,3}, cp {0,1} {2,3}), as its interface.py / helper.py answer them under torch."""
    from torch.distributed.device_mesh import DeviceMesh
    from distmesh import Dim
    host, port = init[len("tcp://"):].rsplit(":", 1)
    os.environ.update(MASTER_ADDR=host, MASTER_PORT=port)
    bad, out = [], {"rank": RANK}
    out["bad"] = bad

    def want(name, got, expect):
        if got != expect or type(got) is not type(expect):
            bad.append("%s: %r, expected %r" % (name, got, expect))
    cfg = {"dp_size": 2, "cp_size": 2, "timeout": 60}
    di = distmesh.DistributedInterface(cfg)
    if distmesh.DistributedInterface() is not di or di.dist_config is not cfg:
        bad.append("not one instance per process")
    if not dist.is_initialized() or dist.get_backend() != "distmesh":
        bad.append("torch.distributed not initialized with distmesh by the interface")
    m, d = di.model_device_mesh, di.data_device_mesh
    if not (isinstance(m, DeviceMesh) and isinstance(d, DeviceMesh)):
        bad.append("meshes: %r, %r" % (type(m), type(d)))
    else:
        want("mesh names", (m.mesh_dim_names, d.mesh_dim_names), (("mp_replicate", "mp_shard"), ("dp", "cp")))
    g = di.get_group(Dim.DP)
    if not isinstance(g, dist.ProcessGroup) or dist.get_backend(g) != "distmesh":
        bad.append("get_group(DP): %r" % (g,))
    else:
        want("dp group ranks", dist.get_process_group_ranks(g), [RANK % 2, RANK % 2 + 2])
    want("get_group(None)", di.get_group(None), None)
    want("current_device", di.current_device, torch.device("cpu"))
    want("world", (di.get_rank(), di.get_world_size()), (RANK, WORLD))
    want("per dim", [di.get_rank(x) for x in Dim] + [di.get_world_size(x) for x in Dim],
         [0, RANK, RANK // 2, RANK % 2, 1, 4, 2, 2])
    peer = RANK + 2 if RANK < 2 else RANK - 2
    want("mean of a float over dp", di.all_reduce(float(RANK)), (RANK + peer) / 2)
    want("a list, sum over cp", di.all_reduce([float(RANK), 1.0], op="sum", dim=Dim.CP),
         [float(RANK + (RANK ^ 1)), 2.0])
    a64 = di.all_reduce(np.array([RANK, RANK], np.float64), op=distmesh.ReduceOp.SUM)
    want("numpy in, float32 numpy out", (type(a64).__name__, str(a64.dtype), a64.tolist()),
         ("ndarray", "float32", [float(RANK + peer)] * 2))
    t = torch.tensor([RANK, 1])
    if di.all_reduce(t, op="max") is not t or t.tolist() != [max(RANK, peer), 1]:
        bad.append("int tensor MAX in place: %s" % t.tolist())
    try:
        di.all_reduce(torch.tensor([RANK]))
        bad.append("MEAN of an int tensor did not raise (LLaMA-Factory's tensor /= n does)")
    except RuntimeError:
        pass
    gathered = di.all_gather(torch.tensor([float(RANK)]))
    want("all_gather of a tensor", (tuple(gathered.shape), gathered.view(-1).tolist()),
         ((2, 1), [float(min(RANK, peer)), float(max(RANK, peer))]))
    want("all_gather of the world", di.all_gather(float(RANK), dim=None), [0.0, 1.0, 2.0, 3.0][:WORLD])
    want("broadcast from global rank 1 (dp {1,3}) / 0 (dp {0,2})",
         di.broadcast(float(RANK * 10), src=RANK % 2), float(RANK % 2 * 10))
    di.barrier()
    di.sync()
    out["str"] = str(di)
    di.destroy()
    want("destroyed", (dist.is_initialized(), distmesh.DistributedInterface._instance), (False, None))
    say("RESULT", out)


def scenario_pgworld(init, ckpt):
    """A Collective's process_group as torch.distributed's own groups are (its world maps):
    rank, size and ranks of it, a Collective made the default group (set_default_group), then
    new groups and DeviceMeshes made through torch, Optimus-DL's dp_mesh / tp_mesh, Distributed
    Checkpoint saved and loaded on the group, a second Collective's group known with its ranks."""
    from torch.distributed import distributed_c10d as c10d
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    import torch.distributed.checkpoint as dcp
    bad, out = [], {"rank": RANK}
    out["bad"] = bad

    def want(name, got, expect):
        if got != expect:
            bad.append("%s: %r, expected %r" % (name, got, expect))
    c = distmesh.init()
    pg = c.process_group
    want("ranks recorded before init", c10d._world.pg_group_ranks.get(pg), {i: i for i in range(WORLD)})
    want("backend of the group", dist.get_backend(pg), "distmesh")
    if distmesh.torch.set_default_group(c) is not pg:
        bad.append("set_default_group did not return the collective's group")
    want("default group", (dist.is_initialized(), dist.get_rank(), dist.get_world_size(), dist.get_backend()),
         (True, RANK, WORLD, "distmesh"))
    want("rank and size of the group", (dist.get_rank(pg), dist.get_world_size(pg), dist.get_process_group_ranks(pg)),
         (RANK, WORLD, list(range(WORLD))))
    t = torch.tensor([float(RANK + 1)])
    dist.all_reduce(t)
    want("all_reduce on the default group", t.item(), WORLD * (WORLD + 1) / 2)
    m = DeviceMesh.from_group(pg, "cpu", mesh_dim_names=("w",))
    want("DeviceMesh.from_group", (m.size(), m.get_local_rank(), dist.get_backend(m.get_group())),
         (WORLD, RANK, "distmesh"))
    m2 = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("x",))     # a new group, through the store
    t = torch.tensor([RANK])
    dist.all_reduce(t, group=m2.get_group())
    want("a new group's all_reduce", (t.item(), dist.get_backend(m2.get_group())),
         (WORLD * (WORLD - 1) // 2, "distmesh"))
    dp, tp = c.dp_mesh, c.tp_mesh
    want("Optimus-DL's dp_mesh / tp_mesh", (type(dp).__name__, tuple(dp.shape), dp.mesh_dim_names,
                                            type(tp).__name__, tp.size()),
         ("DeviceMesh", (WORLD, 1), ("dp_replicate", "dp_shard"), "DeviceMesh", 1))
    want("dp_mesh flattened (its FSDP transform)", dp._flatten().size(), WORLD)
    state = {"w": torch.arange(6, dtype=torch.float32) * 3}
    dcp.save(state, checkpoint_id=ckpt, process_group=pg)
    back = {"w": torch.zeros(6)}
    dcp.load(back, checkpoint_id=ckpt, process_group=pg)
    want("DCP on the group", back["w"].tolist(), state["w"].tolist())
    c2 = distmesh.connect(RANK, WORLD, prefix="second/")              # another world of the same ranks
    pg2 = c2.process_group
    want("a second collective's group", (dist.get_rank(pg2), dist.get_process_group_ranks(pg2)),
         (RANK, list(range(WORLD))))
    dist.destroy_process_group()
    c2.close()
    c.close()
    say("RESULT", out)


def main():
    try:
        scenario = sys.argv[1]
        init = sys.argv[2] if len(sys.argv) > 2 else ""
        ckpt = sys.argv[3] if len(sys.argv) > 3 else ""
        {"stack": scenario_stack, "load": scenario_load, "torchrun": scenario_torchrun,
         "restart": scenario_restart, "fixes": scenario_fixes, "p2p": scenario_p2p, "iface": scenario_iface,
         "pgworld": scenario_pgworld}[scenario](init, ckpt)
    except BaseException:
        traceback.print_exc()
        say("ERROR", traceback.format_exc().replace("\n", " | "))
        sys.exit(1)


if __name__ == "__main__":
    main()
