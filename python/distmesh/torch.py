"""The "distmesh" backend of torch.distributed, registered on import:

    import torch.distributed as dist
    import distmesh.torch                      # registers "distmesh"
    dist.init_process_group("distmesh")        # env:// (torchrun), tcp://, file://, or store=...
    dist.all_reduce(t)                         # distmesh's all-reduce on t's memory

Every collective torch 1.13 routes to a Python ProcessGroup is implemented (allreduce and its
coalesced form, broadcast, allgather (list, into a tensor, coalesced), reduce_scatter (list and
tensor), reduce, gather, scatter, alltoall (list and single, with split sizes), send, recv,
barrier); torch's object collectives (all_gather_object, broadcast_object_list,
gather_object, scatter_object_list) run on them. CPU tensors only.

Each call is one distmesh request (dm_*_async): the call returns at once with a torch Work
made from a torch Future, and the group's completer thread (one per group, not one per call)
waits for the requests in issue order and completes their futures, so async_op=True overlaps
communication with computation (DistributedDataParallel's buckets) and work.wait() raises the
request's failure (a distmesh.Error) as torch's RuntimeError.

Rendezvous: through the store torch hands the backend. The ranks agree on a fresh key prefix
through it; when that store is a TCPStore (env://, tcp://, torchrun) distmesh's own store
client meets on the same server (torch 1.13's protocol and 2.x's); any other store (FileStore,
HashStore) carries the address of a distmesh store that rank 0 starts on MASTER_ADDR (default
127.0.0.1) and an ephemeral port.
"""
import inspect
import os
import queue
import threading
import uuid
import weakref

import torch
import torch.distributed as dist

from . import _C
from .collective import Collective, _ms

try:                                            # torch 1.13 and 2.x
    from torch._C._distributed_c10d import ProcessGroup as _ProcessGroupBase
    from torch._C._distributed_c10d import _create_work_from_future
except ImportError as e:                        # pragma: no cover - a torch without c10d
    raise ImportError("distmesh.torch needs torch.distributed (c10d): %s" % e)

__all__ = ["ProcessGroup", "collective", "BACKEND"]

BACKEND = "distmesh"


class _Completer:
    """One thread per group: waits for the group's requests in issue order (the order
    distmesh completes them in), runs each one's follow-up (copies out of temporaries), and
    completes its torch future."""

    def __init__(self, name):
        self._q = queue.SimpleQueue()
        self._name = name
        self._thread = None
        self._lock = threading.Lock()

    def submit(self, req, fut, result, after):
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    t = threading.Thread(target=self._run, args=(self._q,), name=self._name, daemon=True)
                    t.start()
                    self._thread = t
        self._q.put((req, fut, result, after))

    @staticmethod
    def _run(q):
        while True:
            item = q.get()
            if item is None:
                return
            req, fut, result, after = item
            try:
                req.wait()
                if after is not None:
                    after()
            except BaseException as e:          # noqa: BLE001 -- handed to the future's waiter
                fut.set_exception(e)
            else:
                fut.set_result(result)
            del req, fut, result, after, item

    def stop(self):
        if self._thread is not None:
            self._q.put(None)


def _one(tensors, what):
    if len(tensors) != 1:
        raise ValueError("distmesh: %s takes one tensor per call (CPU), got %d" % (what, len(tensors)))
    t = tensors[0]
    if t.is_sparse or t.device.type != "cpu":
        raise ValueError("distmesh: %s takes dense CPU tensors, got a %s tensor on %s"
                         % (what, t.layout, t.device))
    return t


def _flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.empty(0)


def _copy_out(flat, outs):
    def after():
        off = 0
        for o in outs:
            n = o.numel()
            o.copy_(flat[off:off + n].view(o.shape))
            off += n
    return after


class ProcessGroup(_ProcessGroupBase):
    """A torch.distributed process group over a distmesh collective (made by the "distmesh"
    backend's creator, or from a Collective you have: ProcessGroup.from_collective(c), which
    Collective.process_group returns)."""

    def __init__(self, coll):
        super().__init__(coll.rank, coll.world_size)
        self._coll = coll
        self._completer = _Completer("distmesh-completer-r%d" % coll.rank)
        weakref.finalize(self, self._completer.stop)

    @classmethod
    def from_collective(cls, coll):
        return cls(coll)

    @property
    def collective(self):
        """The distmesh Collective carrying this group's calls."""
        return self._coll

    def getBackendName(self):
        return BACKEND

    def __repr__(self):
        return "<distmesh ProcessGroup rank %d of %d (%s)>" % (self._coll.rank, self._coll.world_size,
                                                                self._coll.transport)

    # ---- the work objects --------------------------------------------------------------------
    def _work(self, req, result, after=None):
        fut = torch.futures.Future()
        self._completer.submit(req, fut, result, after)
        return _create_work_from_future(fut)

    # ---- collectives (torch 1.13's Python ProcessGroup methods) ----------------------------
    def allreduce(self, tensors, opts=None):
        t = _one(tensors, "allreduce")
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        return self._work(self._coll.all_reduce(t, op, async_op=True), tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        req = None
        for t in tensors:
            req = self._coll.all_reduce(_one([t], "allreduce_coalesced"), op, async_op=True)
        if req is None:
            req = self._coll.barrier(async_op=True)
        return self._work(req, tensors)         # requests complete in order: the last one is all

    def broadcast(self, tensors, opts=None):
        t = _one(tensors, "broadcast")
        root = opts.rootRank if opts is not None else 0
        return self._work(self._coll.broadcast(t, root, async_op=True), tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        t = _one(input_tensors, "allgather")
        if len(output_tensors) != 1:
            raise ValueError("distmesh: allgather takes one output list per call")
        req = self._coll.all_gather_to_list(output_tensors[0], t, async_op=True)
        return self._work(req, output_tensors)

    def _allgather_base(self, output, input, opts=None):
        return self._work(self._coll.all_gather(output, input, async_op=True), [output])

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        req = None
        for outs, t in zip(output_lists, input_list):
            req = self._coll.all_gather_to_list(outs, t, async_op=True)
        if req is None:
            req = self._coll.barrier(async_op=True)
        return self._work(req, output_lists)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        out = _one(output_tensors, "reduce_scatter")
        if len(input_tensors) != 1:
            raise ValueError("distmesh: reduce_scatter takes one input list per call")
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        send = _flat(input_tensors[0])          # the blocks back to back (a copy)
        return self._work(self._coll.reduce_scatter(out, send, op, async_op=True), output_tensors)

    def _reduce_scatter_base(self, output, input, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        return self._work(self._coll.reduce_scatter(output, input, op, async_op=True), [output])

    def reduce(self, tensors, opts=None):
        t = _one(tensors, "reduce")
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        root = opts.rootRank if opts is not None else 0
        return self._work(self._coll.reduce(t, root, op, async_op=True), tensors)

    def gather(self, output_tensors, input_tensors, opts=None):
        t = _one(input_tensors, "gather")
        root = opts.rootRank if opts is not None else 0
        if self._coll.rank != root:
            return self._work(self._coll.gather(t, None, root, async_op=True), output_tensors)
        outs = output_tensors[0]
        flat = torch.empty(t.numel() * len(outs), dtype=t.dtype)
        req = self._coll.gather(t, flat, root, async_op=True)
        return self._work(req, output_tensors, _copy_out(flat, outs))

    def scatter(self, output_tensors, input_tensors, opts=None):
        out = _one(output_tensors, "scatter")
        root = opts.rootRank if opts is not None else 0
        send = _flat(input_tensors[0]) if self._coll.rank == root else None
        return self._work(self._coll.scatter(out, send, root, async_op=True), output_tensors)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        if not output_split_sizes and not input_split_sizes:
            return self._work(self._coll.all_to_all(output, input, async_op=True), [output])
        W = self._coll.world_size

        def counts(t, splits):
            if not splits:
                return [t.numel() // W] * W
            row = t.numel() // t.shape[0] if t.dim() and t.shape[0] else 0
            return [s * row for s in splits]
        req = self._coll.all_to_all_v(output, counts(output, output_split_sizes), input,
                                      counts(input, input_split_sizes), async_op=True)
        return self._work(req, [output])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        send = _flat(input_tensors)
        recv = torch.empty(sum(o.numel() for o in output_tensors), dtype=send.dtype)
        req = self._coll.all_to_all_v(recv, [o.numel() for o in output_tensors], send,
                                      [t.numel() for t in input_tensors], async_op=True)
        return self._work(req, output_tensors, _copy_out(recv, output_tensors))

    def send(self, tensors, dstRank, tag=0):
        t = _one(tensors, "send")
        return self._work(self._coll.send(t, dstRank, tag, async_op=True), tensors)

    def recv(self, tensors, srcRank, tag=0):
        t = _one(tensors, "recv")
        return self._work(self._coll.recv(t, srcRank, tag, async_op=True), tensors)

    def recv_anysource(self, tensors, tag=0):
        raise RuntimeError("distmesh: recv from any source is not supported (name the source rank)")

    def barrier(self, opts=None):
        return self._work(self._coll.barrier(async_op=True), None)


def _host_port(host, port):
    return "tcp://[%s]:%d" % (host, port) if ":" in host else "tcp://%s:%d" % (host, port)


def _rendezvous(store, rank, size, timeout):
    """The collective of a new group: a fresh key prefix agreed through torch's store, then
    distmesh's rendezvous on the TCPStore behind it, or on a store rank 0 serves."""
    timeout_ms = _ms(timeout) if timeout is not None else 0
    if rank == 0:
        store.set("distmesh/session", uuid.uuid4().hex)
    session = store.get("distmesh/session").decode()
    prefix = "distmesh/%s/" % session
    base = store
    while hasattr(base, "underlying_store"):    # PrefixStore's chain down to the real store
        base = base.underlying_store
    if isinstance(base, dist.TCPStore):
        url = _host_port(base.host, base.port)
        dm_store = _C.Store(url, False, None, timeout_ms)
    elif rank == 0:
        host = os.environ.get("MASTER_ADDR") or "127.0.0.1"
        dm_store = _C.Store(_host_port(host, 0), True, None, timeout_ms)
        store.set("distmesh/store", _host_port(host, dm_store.port))
    else:
        dm_store = _C.Store(store.get("distmesh/store").decode(), False, None, timeout_ms)
    return _C.tcp(rank, size, dm_store, None, prefix, None, timeout_ms, None, cls=Collective)


def _create(store, rank, size, timeout):
    return ProcessGroup(_rendezvous(store, rank, size, timeout))


def _register():
    if hasattr(dist.Backend, BACKEND.upper()):
        return
    params = inspect.signature(dist.Backend.register_backend).parameters
    if "devices" in params:                     # torch 2.x
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])
    else:
        dist.Backend.register_backend(BACKEND, _create)


_register()


def collective(group=None):
    """The distmesh Collective under a group of the "distmesh" backend (None: the default)."""
    if group is None:
        group = dist.distributed_c10d._get_default_group()
    if not isinstance(group, ProcessGroup):
        raise TypeError("not a distmesh process group: %r" % (group,))
    return group.collective

