"""The "distmesh" backend of torch.distributed, registered on import:

    import torch.distributed as dist
    import distmesh.torch                      # registers "distmesh"
    dist.init_process_group("distmesh")        # env:// (torchrun), tcp://, file://, or store=...
    dist.all_reduce(t)                         # distmesh's all-reduce on t's memory

One module for torch 1.13 and 2.x (docs/python.md, "torch versions"). Every collective torch
routes to a Python ProcessGroup is implemented, under 1.13's names and 2.x's (allreduce and its
coalesced form, broadcast, allgather (list, into a tensor, coalesced, into tensors coalesced),
reduce_scatter (list, tensor, tensors coalesced), reduce, gather, scatter, alltoall (list and
single, with split sizes), send, recv, barrier); torch's object collectives, functional
collectives, _coalescing_manager, DDP, and on 2.x DeviceMesh, FSDP2, DTensor / tensor parallel
and Distributed Checkpoint run on them. CPU tensors only.

A small call (at most INLINE_MAX_BYTES, 64 KiB, in its largest buffer) made while nothing of
the group is in flight runs inline: blocking, on the calling thread, and its Work is returned
already complete. This takes the hop to distmesh's progress thread and back out of every small
blocking call (dist.all_reduce of a scalar, barrier, object collectives). A failure of the run
(a distmesh.Error such as Timeout, PeerLost or Aborted) is kept and raised by wait() and the
future on torch 2.x, as the async path raises it; on 1.13 it is raised at the call (a 1.13 Work
made from a Future returns from wait() without raising, so kept it would be lost). A wrong
argument is raised at the call, as on the async path. Any other call --
larger, made while a request of the group is in flight, or a send / recv -- is one distmesh
request (dm_*_async; a coalesced call one per tensor) and returns at once; distmesh runs the
calls of a group in issue order either way. On torch 2.x its Work is a Python Work (Work below)
whose wait() waits on the requests on the calling thread; on 1.13 a Work made from a torch
Future. Futures (get_future(), DDP's hooks; every 1.13 Work) are completed by the group's
completer thread (one per group, not one per call), which waits for the requests in issue
order, so async_op=True overlaps communication with computation (DistributedDataParallel's
buckets), and wait() raises the request's failure (a distmesh.Error, a RuntimeError).

Rendezvous: through the store torch hands the backend. The ranks agree on a fresh key prefix
through it; when that store is a TCPStore (env://, tcp://, torchrun) distmesh's own store
client meets on the same server (torch 1.13's protocol and 2.x's); any other store (FileStore,
HashStore) carries the address of a distmesh store that rank 0 starts on MASTER_ADDR (default
127.0.0.1) and an ephemeral port.

compress_hook(mode) is a DDP communication hook that averages gradients with distmesh's
compressed all-reduce (int8 or bf16 between hosts, exact inside a host, error feedback per
bucket): model.register_comm_hook(group, distmesh.torch.compress_hook("int8")).
"""
import inspect
import os
import queue
import threading
import time
import uuid
import weakref

import torch
import torch.distributed as dist

from . import _C
from .collective import Collective, ReduceOp, _ms, _op_code, _register_process_group_factory

try:                                            # torch 1.13 and 2.x
    from torch._C._distributed_c10d import ProcessGroup as _ProcessGroupBase
    from torch._C._distributed_c10d import _create_work_from_future
except ImportError as e:                        # pragma: no cover - a torch without c10d
    raise ImportError("distmesh.torch needs torch.distributed (c10d): %s" % e)

__all__ = ["ProcessGroup", "Work", "collective", "device_mesh", "compress_hook", "register_process_group",
           "set_default_group", "BACKEND", "INLINE_MAX_BYTES"]

BACKEND = "distmesh"

INLINE_MAX_BYTES = 64 << 10
"""The largest call, in bytes of its largest buffer on this rank, that runs inline (on the
calling thread, blocking, its Work returned complete) when nothing of its group is in flight;
0 runs every call as a request. Read at each call, so it may be set at run time (the same on
every rank is not needed: each rank's calls run in issue order either way)."""

# The failures of a call that ran (the async path raises them at wait()); an inline call keeps
# them for wait() too. Anything else (a wrong argument, Busy) is raised at the call, as there.
_RUN_FAILURES = (_C.Timeout, _C.PeerLost, _C.Mismatch, _C.NetworkError, _C.ProtocolError, _C.Aborted,
                 _C.InternalError, _C.NcclError, _C.CudaError)


_DistBackendError = getattr(dist, "DistBackendError", None)     # torch 2.x; 1.13 has none
_TORCH_ERRORS = {}                              # distmesh's class -> its torch-typed subclass


def _torch_error(e):
    """A failure of a call that ran (a distmesh.Error) as torch 2.x raises a backend's failure:
    an instance of both its distmesh class (distmesh.Timeout, PeerLost, ...: .status,
    .status_name and .message as before) and torch's DistBackendError, so code that catches
    either catches it; the original is its __cause__. A timeout's message starts "distmesh:
    Timed out (", the wording torch's own checks look for (` (Timed out|closed|timeout) `).
    Unchanged on torch 1.13 (no DistBackendError) and when already converted."""
    if _DistBackendError is None or isinstance(e, _DistBackendError) or not isinstance(e, _C.Error):
        return e
    cls = type(e)
    sub = _TORCH_ERRORS.get(cls)
    if sub is None:
        sub = _TORCH_ERRORS[cls] = type(cls.__name__, (cls, _DistBackendError), {
            "__module__": __name__,
            "__doc__": "%s raised through torch.distributed: also torch's DistBackendError." % cls.__name__})
    message = getattr(e, "message", None) or str(e)
    text = "distmesh: Timed out (%s)" % message if isinstance(e, _C.Timeout) else str(e)
    out = sub(text)
    for attr in ("status", "status_name", "message"):
        if hasattr(e, attr):
            setattr(out, attr, getattr(e, attr))
    out.__cause__ = e
    return out


class _Call:
    """One torch call's distmesh requests (one, or several for a coalesced call, completing in
    issue order), its result (what the Work and its future hand back) and its follow-up
    (copies out of temporaries). Waited for once, by whichever thread comes first: the
    caller's wait(), or the group's completer thread for a future."""

    __slots__ = ("reqs", "result", "after", "lock", "done", "error")

    def __init__(self, reqs, result, after):
        self.reqs = reqs
        self.result = result
        self.after = after
        self.lock = threading.Lock()
        self.done = False
        self.error = None

    @classmethod
    def completed(cls, result, error=None):
        """A call that has already run (inline): its result, or its failure for wait()."""
        call = cls.__new__(cls)
        call.reqs = call.after = call.lock = None   # never waited for: finish() and poll() see done
        call.result = result
        call.done = True
        call.error = error
        return call

    def _finish_locked(self):
        try:
            for r in self.reqs:
                r.wait()
            if self.after is not None:
                self.after()
        except BaseException as e:              # noqa: BLE001 -- raised to every waiter
            self.error = _torch_error(e)
        self.reqs = self.after = None           # the buffers go with the requests
        self.done = True

    def finish(self):
        """Waits for the requests (GIL released in each wait); returns the result or raises
        the call's failure (a distmesh.Error, a RuntimeError)."""
        if not self.done:
            with self.lock:
                if not self.done:
                    self._finish_locked()
        if self.error is not None:
            raise self.error
        return self.result

    def poll(self):
        """Whether the call is complete, never blocking (a waiter holding the lock: not yet)."""
        if not self.done and self.lock.acquire(blocking=False):
            try:
                if not self.done and all(r.is_completed() for r in self.reqs):
                    self._finish_locked()
            finally:
                self.lock.release()
        return self.done


class _Completer:
    """One thread per group, started at its first future: finishes the calls whose futures
    were asked for, in issue order (the order distmesh completes them in), and completes the
    futures (DDP's communication hooks chain on them)."""

    def __init__(self, name):
        self._q = queue.SimpleQueue()
        self._name = name
        self._thread = None
        self._lock = threading.Lock()

    def submit(self, call, fut):
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    t = threading.Thread(target=self._run, args=(self._q,), name=self._name, daemon=True)
                    t.start()
                    self._thread = t
        self._q.put((call, fut))

    @staticmethod
    def _run(q):
        while True:
            item = q.get()
            if item is None:
                return
            call, fut = item
            try:
                result = call.finish()
            except BaseException as e:          # noqa: BLE001 -- handed to the future's waiter
                fut.set_exception(e)
            else:
                fut.set_result(result)
                del result                      # the tensors go with the future, not the thread
            del call, fut, item

    def stop(self):
        """Ends the thread and waits for it (at most 5 s). At exit this runs from atexit,
        before the interpreter finalizes: a daemon thread that let go of the GIL in torch's
        C++ code (a tensor freed) and takes it back after that is ended by pthread_exit, which
        unwinds through a noexcept C++ frame and aborts the process ("terminate called
        without an active exception", seen on 2 of 12 4-rank runs under torch 2.13)."""
        t = self._thread
        if t is not None:
            self._q.put(None)
            if t is not threading.current_thread():
                t.join(5.0)


def _poll_until(call, seconds):
    """Polls call until it completes or seconds pass (then raises torch's timeout error)."""
    end = time.monotonic() + seconds
    nap = 0.0005
    while not call.poll():
        left = end - time.monotonic()
        if left <= 0:
            raise _torch_error(_C.Timeout("Work.wait: the call did not complete within the %g s timeout "
                                          "given to wait() (it is still in flight)" % seconds))
        time.sleep(min(nap, left))
        nap = min(nap * 2, 0.01)


def _future_of(call, completer):
    fut = torch.futures.Future()
    if call.done:
        if call.error is not None:
            fut.set_exception(call.error)
        else:
            fut.set_result(call.result)
    else:
        completer.submit(call, fut)
    return fut


# torch 2.x lets a Python subclass of Work stand for a call (c10d's PyProcessGroup::PyWork
# trampoline, torch/csrc/distributed/c10d/PyProcessGroup.hpp): C++ callers (DDP's reducer,
# functional collectives' wait_tensor) reach its wait() and get_future(). torch 1.13 has no
# such trampoline (a C++ wait() on a Python Work never reaches Python and blocks forever), so
# there every call's Work is _create_work_from_future's, completed by the completer thread.
_WORK_SUBCLASS = int(torch.__version__.split(".")[0]) >= 2 and hasattr(dist, "Work")

if _WORK_SUBCLASS:
    class Work(dist.Work):
        """A distmesh call as torch 2.x's Work: wait() waits for the distmesh request itself on
        the calling thread (no thread hop for a blocking call) and raises its failure;
        get_future() a torch Future completed by the group's completer thread."""

        def __init__(self, call, completer, source_rank=-1):
            super().__init__()
            self._call = call
            self._completer = completer
            self._fut = None
            self._source_rank = source_rank

        def wait(self, timeout=None):
            """Waits for the call; True, or its failure raised. timeout (a timedelta; None or
            0: none, the call's own deadline holds) bounds this wait: past it, torch's
            DistBackendError (a distmesh.Timeout too, "distmesh: Timed out (...)") is
            raised, as ProcessGroupGloo's Work raises, and the call stays in flight (a
            later wait() or the future still gets its result)."""
            seconds = timeout.total_seconds() if timeout is not None else 0.0
            if seconds > 0 and not self._call.poll():
                _poll_until(self._call, seconds)
            self._call.finish()
            return True

        def get_future(self):
            """A torch Future of the call's result, completed by the group's completer thread."""
            if self._fut is None:
                self._fut = _future_of(self._call, self._completer)
            return self._fut

        def is_completed(self):
            """Whether the call has completed (does not wait)."""
            return self._call.poll()

        def is_success(self):
            """Whether the call has completed without a failure."""
            return self._call.poll() and self._call.error is None

        def exception(self):
            """The call's failure once it has completed, else None."""
            return self._call.error if self._call.poll() else None

        def result(self):
            """Waits for the call; its result (the tensors torch gave it)."""
            return self._call.finish()

        def source_rank(self):
            """The rank a recv names (-1 for other calls)."""
            return self._source_rank

        def synchronize(self):                  # CPU tensors: nothing to order on a stream
            """Nothing: CPU tensors have no stream to order."""
            pass
else:
    Work = None


def _one(tensors, what):
    if len(tensors) != 1:
        raise ValueError("distmesh: %s takes one tensor per call (CPU), got %d" % (what, len(tensors)))
    return _cpu(tensors[0], what)


def _cpu(t, what):
    if t.is_sparse or t.device.type != "cpu":
        raise ValueError("distmesh: %s takes dense CPU tensors, got a %s tensor on %s"
                         % (what, t.layout, t.device))
    return t


def _nbytes(t):                                  # torch 1.13's Tensor has no nbytes
    return t.numel() * t.element_size()


def _total(tensors):
    return sum(_nbytes(t) for t in tensors)


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


_OP_CODES = {}                                  # torch's RedOpType -> distmesh's ReduceOp


def _op(opts):
    """opts.reduceOp as distmesh's ReduceOp, cached by torch's RedOpType (the converter the C
    side calls for a torch op costs more than the rest of a small call's Python)."""
    if opts is None:
        return ReduceOp.SUM
    op = opts.reduceOp
    kind = getattr(op, "op", op)                # 1.13 and 2.x: a ReduceOp wrapping a RedOpType
    code = _OP_CODES.get(kind)
    if code is None:                            # unsupported ops (PREMUL_SUM, ...) raise here
        code = _OP_CODES[kind] = ReduceOp(_op_code(op))
    return code


def _root(opts):
    return opts.rootRank if opts is not None else 0


class ProcessGroup(_ProcessGroupBase):
    """A torch.distributed process group over a distmesh collective (made by the "distmesh"
    backend's creator, or from a Collective you have: ProcessGroup.from_collective(c), which
    Collective.process_group returns). One class for torch 1.13 and 2.x: the methods carry
    both the old names and 2.x's (all_gather_single, reduce_scatter_single, all_to_all_single,
    ..._single_coalesced)."""

    def __init__(self, coll, group_name="", owns=False):
        super().__init__(coll.rank, coll.world_size)
        self._coll = coll
        self._owns = owns                       # made by the backend's creator: shutdown closes it
        self._group_name = group_name or ""
        self._group_desc = ""
        self._completer = _Completer("distmesh-completer-r%d" % coll.rank)
        weakref.finalize(self, self._completer.stop)

    @classmethod
    def from_collective(cls, coll):
        """A process group over coll, a distmesh Collective you have (shutdown leaves it open)."""
        return cls(coll)

    # ---- lifetime: what torch 2.x's destroy_process_group / _abort_process_group call -------
    def shutdown(self):
        """torch's destroy_process_group: waits for the group's calls, closes the distmesh
        collective the backend made for it (a group over your own Collective leaves it
        open), and ends the group's completer thread."""
        try:
            if self._owns and not self._coll.closed:
                self._coll.close()
        finally:                                # a close that raises (Busy) still ends the thread
            self._completer.stop()

    def abort(self):
        """torch's _abort_process_group: stops the collective's calls in flight at once (dm_abort:
        they fail with distmesh.Aborted), then shuts the group down."""
        if not self._coll.closed:
            self._coll.abort("torch.distributed aborted the process group")
        self.shutdown()

    # ---- split: ProcessGroup.split_group under torch 2.x's names ------------------------------
    @property
    def supports_splitting(self):
        """True: split_group makes a subgroup with distmesh's split (no new rendezvous)."""
        return True

    def split_group(self, new_ranks, timeout=None, opts=None, group_name=None, group_desc=None,
                    device_types=None):
        """torch 2.x's ProcessGroup.split_group: a collective call of every rank of this group,
        each naming the group it joins (ranks of this group); a new "distmesh" ProcessGroup of
        those ranks, ordered as sorted, or None where this rank is not in new_ranks. Made by
        distmesh's split (dm_split), so no store is needed; timeout (a timedelta) becomes the
        new group's deadline. Not registered with torch.distributed's world (torch's own
        dist.split_group does that, and on torch 2.13 asks for an accelerator first)."""
        ranks = sorted(int(r) for r in new_ranks)
        if not ranks or len(set(ranks)) != len(ranks) or ranks[0] < 0 or ranks[-1] >= self._coll.world_size:
            raise ValueError("distmesh: split_group needs distinct ranks of this group (0..%d), got %r"
                             % (self._coll.world_size - 1, list(new_ranks)))
        me = self._coll.rank
        color, key = (ranks[0], ranks.index(me)) if me in ranks else (-1, 0)
        sub = self._coll.split(color, key)
        if sub is None:
            return None
        if timeout is not None:
            sub.set_timeout(_ms(timeout))
        pg = ProcessGroup(sub, group_name or "", owns=True)
        if group_desc:
            pg.setGroupDesc(group_desc)
        return pg

    @property
    def collective(self):
        """The distmesh Collective carrying this group's calls."""
        return self._coll

    def getBackendName(self):
        """"distmesh"."""
        return BACKEND

    # torch 2.x keeps a group's name in its backends, which a Python group has none of: kept
    # here (functional collectives and DeviceMesh find the group by it)
    def getGroupName(self):
        """The name torch gave this group ("" until it names it)."""
        return self._group_name

    def setGroupName(self, name):
        """Keeps the name torch gives this group."""
        self._group_name = name

    def getGroupDesc(self):
        """The description torch gave this group."""
        return self._group_desc

    def setGroupDesc(self, desc):
        """Keeps the description torch gives this group."""
        self._group_desc = desc

    def _get_sequence_number_for_group(self):
        return self._coll.sequence

    def _set_sequence_number_for_group(self):   # distmesh numbers its calls itself (sequence)
        pass

    def __repr__(self):
        return "<distmesh ProcessGroup rank %d of %d (%s)>" % (self._coll.rank, self._coll.world_size,
                                                                self._coll.transport)

    # ---- the work objects --------------------------------------------------------------------
    def _work(self, reqs, result, after=None, source_rank=-1):
        call = _Call(reqs if isinstance(reqs, list) else [reqs], result, after)
        return self._wrap(call, source_rank)

    def _wrap(self, call, source_rank=-1):
        if Work is not None:
            return Work(call, self._completer, source_rank)
        return _create_work_from_future(_future_of(call, self._completer))

    def _run(self, nbytes, issue, result, after=None):
        """A collective: issue(async_op) makes the distmesh call(s). Inline (issue(False), then
        after(), a complete Work) when it is at most INLINE_MAX_BYTES and nothing of the group
        is in flight; else issue(True), its request(s) in a Work. See the module's docstring."""
        if nbytes <= INLINE_MAX_BYTES and self._coll._idle():
            try:
                issue(False)
                if after is not None:
                    after()
            except _RUN_FAILURES as e:
                if Work is None:                # 1.13: a Work made from a Future never raises at wait()
                    raise
                return self._wrap(_Call.completed(result, _torch_error(e)))
            return self._wrap(_Call.completed(result))
        return self._work(issue(True), result, after)

    # ---- collectives -------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        """torch's allreduce of one tensor, in place; a Work."""
        t = _one(tensors, "allreduce")
        op, c = _op(opts), self._coll
        return self._run(_nbytes(t), lambda a: c.all_reduce(t, op, async_op=a), tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        """torch's allreduce of each tensor, in issue order; one Work."""
        op, c = _op(opts), self._coll
        ts = [_cpu(t, "allreduce_coalesced") for t in tensors]
        return self._run(_total(ts), lambda a: [c.all_reduce(t, op, async_op=a) for t in ts] or [c.barrier(async_op=a)],
                         tensors)

    def broadcast(self, tensors, opts=None):
        """torch's broadcast of one tensor from opts.rootRank; a Work."""
        t = _one(tensors, "broadcast")
        root, c = _root(opts), self._coll
        return self._run(_nbytes(t), lambda a: c.broadcast(t, root, async_op=a), tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        """torch's allgather: every rank's tensor into output_tensors[0], a list; a Work."""
        t = _one(input_tensors, "allgather")
        if len(output_tensors) != 1:
            raise ValueError("distmesh: allgather takes one output list per call")
        outs, c = output_tensors[0], self._coll
        return self._run(_nbytes(t) * len(outs), lambda a: c.all_gather_to_list(outs, t, async_op=a), output_tensors)

    def _allgather_base(self, output, input, opts=None):
        """torch's allgather into one flat tensor: every rank's input, in rank order; a Work."""
        o, i, c = _cpu(output, "allgather"), _cpu(input, "allgather"), self._coll
        return self._run(max(_nbytes(o), _nbytes(i)), lambda a: c.all_gather(o, i, async_op=a), [output])

    all_gather_single = _allgather_base         # torch 2.x's name

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """torch's all_gather_coalesced: output_lists[r][i] gets rank r's input_list[i] (one
        list per rank, each as long as input_list, torch's layout); one Work."""
        c = self._coll
        ins = [_cpu(t, "allgather_coalesced") for t in input_list]
        if len(output_lists) != c.world_size or any(len(outs) != len(ins) for outs in output_lists):
            raise ValueError("distmesh: allgather_coalesced takes one output list per rank (%d), each with one "
                             "tensor per input (%d); got %s" % (c.world_size, len(ins),
                                                               [len(outs) for outs in output_lists]))
        pairs = [([outs[i] for outs in output_lists], t) for i, t in enumerate(ins)]
        return self._run(_total(ins) * c.world_size,
                         lambda a: [c.all_gather_to_list(outs, t, async_op=a) for outs, t in pairs]
                         or [c.barrier(async_op=a)], output_lists)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        """torch's allgather of each input into its flat output; one Work."""
        c = self._coll
        pairs = [(_cpu(o, "allgather_into_tensor_coalesced"), _cpu(i, "allgather")) for o, i in zip(outputs, inputs)]
        return self._run(_total(o for o, _ in pairs),
                         lambda a: [c.all_gather(o, i, async_op=a) for o, i in pairs] or [c.barrier(async_op=a)],
                         outputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        """torch's reduce_scatter: this rank's block of op over input_tensors[0], a list; a Work."""
        out = _one(output_tensors, "reduce_scatter")
        if len(input_tensors) != 1:
            raise ValueError("distmesh: reduce_scatter takes one input list per call")
        send = _flat(input_tensors[0])          # the blocks back to back (a copy)
        op, c = _op(opts), self._coll
        return self._run(_nbytes(send), lambda a: c.reduce_scatter(out, send, op, async_op=a), output_tensors)

    def _reduce_scatter_base(self, output, input, opts=None):
        """torch's reduce_scatter of one flat tensor: this rank's block of op over input; a Work."""
        o, i, op, c = _cpu(output, "reduce_scatter"), _cpu(input, "reduce_scatter"), _op(opts), self._coll
        return self._run(max(_nbytes(o), _nbytes(i)), lambda a: c.reduce_scatter(o, i, op, async_op=a), [output])

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        """torch's reduce_scatter of each flat input into its output; one Work."""
        op, c = _op(opts), self._coll
        pairs = [(_cpu(o, "reduce_scatter_tensor_coalesced"), _cpu(i, "reduce_scatter"))
                 for o, i in zip(outputs, inputs)]

        def issue(a):
            return [c.reduce_scatter(o, i, op, async_op=a) for o, i in pairs] or [c.barrier(async_op=a)]
        return self._run(_total(i for _, i in pairs), issue, outputs)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def reduce(self, tensors, opts=None):
        """torch's reduce of one tensor to opts.rootRank; a Work."""
        t = _one(tensors, "reduce")
        root, op, c = _root(opts), _op(opts), self._coll
        return self._run(_nbytes(t), lambda a: c.reduce(t, root, op, async_op=a), tensors)

    def gather(self, output_tensors, input_tensors, opts=None):
        """torch's gather of one tensor into the root's list output_tensors[0]; a Work."""
        t = _one(input_tensors, "gather")
        root, c = _root(opts), self._coll
        nbytes = _nbytes(t) * c.world_size      # the root's buffer
        if c.rank != root:
            return self._run(nbytes, lambda a: c.gather(t, None, root, async_op=a), output_tensors)
        outs = output_tensors[0]
        flat = torch.empty(t.numel() * len(outs), dtype=t.dtype)
        return self._run(nbytes, lambda a: c.gather(t, flat, root, async_op=a), output_tensors, _copy_out(flat, outs))

    def scatter(self, output_tensors, input_tensors, opts=None):
        """torch's scatter of the root's list input_tensors[0], one tensor each; a Work."""
        out = _one(output_tensors, "scatter")
        root, c = _root(opts), self._coll
        send = _flat(input_tensors[0]) if c.rank == root else None
        return self._run(_nbytes(out) * c.world_size, lambda a: c.scatter(out, send, root, async_op=a), output_tensors)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        """torch's all_to_all_single: blocks of equal size, or by split sizes in rows of dim 0; a Work."""
        _cpu(output, "alltoall_base")
        _cpu(input, "alltoall_base")
        c = self._coll
        nbytes = max(_nbytes(output), _nbytes(input))
        if not output_split_sizes and not input_split_sizes:
            return self._run(nbytes, lambda a: c.all_to_all(output, input, async_op=a), [output])
        W = c.world_size

        def counts(t, splits):
            if not splits:
                return [t.numel() // W] * W
            row = t.numel() // t.shape[0] if t.dim() and t.shape[0] else 0
            return [s * row for s in splits]
        oc, ic = counts(output, output_split_sizes), counts(input, input_split_sizes)
        return self._run(nbytes, lambda a: c.all_to_all_v(output, oc, input, ic, async_op=a), [output])

    all_to_all_single = alltoall_base

    def alltoall(self, output_tensors, input_tensors, opts=None):
        """torch's alltoall: input_tensors[j] to rank j, rank j's into output_tensors[j]; a Work."""
        send = _flat(input_tensors)
        recv = torch.empty(sum(o.numel() for o in output_tensors), dtype=send.dtype)
        oc, ic, c = [o.numel() for o in output_tensors], [t.numel() for t in input_tensors], self._coll
        return self._run(max(_nbytes(send), _nbytes(recv)), lambda a: c.all_to_all_v(recv, oc, send, ic, async_op=a),
                         output_tensors, _copy_out(recv, output_tensors))

    def send(self, tensors, dstRank, tag=0):
        """torch's send of one tensor to dstRank; a Work."""
        t = _one(tensors, "send")
        return self._work(self._coll.send(t, dstRank, tag, async_op=True), tensors)

    def recv(self, tensors, srcRank, tag=0):
        """torch's recv of one tensor from srcRank; a Work. Posted before the matching send
        (irecv then isend on both ranks, batch_isend_irecv) it still completes: distmesh runs
        a run of sends and receives sends first (docs/python.md "Async")."""
        t = _one(tensors, "recv")
        return self._work(self._coll.recv(t, srcRank, tag, async_op=True), tensors, source_rank=srcRank)

    def recv_anysource(self, tensors, tag=0):
        """torch's recv of one tensor from any rank (dist.recv(t) with src None); a Work whose
        source_rank() (and _source_rank(), which dist.recv returns) is the sender once it is
        complete. Which message: the first with the tag, as distmesh.h's dm_recv_any says.
        torch 1.13 cannot be told the sender (its Work is C++'s): RuntimeError there."""
        t = _one(tensors, "recv_anysource")
        if Work is None:
            raise RuntimeError("distmesh: recv from any source needs torch 2.x (torch %s's Work cannot report "
                               "the sender); name the source rank" % torch.__version__)
        req, sender = self._coll.recv(t, None, tag, async_op=True), [-1]

        def took():                             # the request is complete: wait() returns its sender
            sender[0] = req.wait()
        return self._AnySourceWork(_Call([req], tensors, took), self._completer, sender)

    if Work is not None:
        class _AnySourceWork(Work):
            """recv_anysource's Work: the sender, known once complete, for source_rank() and for
            the _source_rank() torch's dist.recv calls (Work keeps an int under that name)."""

            def __init__(self, call, completer, sender):
                super().__init__(call, completer)
                self._source_rank = lambda: sender[0]
                self._sender = sender

            def source_rank(self):
                """The rank the message came from (-1 until the recv is complete)."""
                return self._sender[0]

    def barrier(self, opts=None):
        """A barrier over the group; a Work."""
        c = self._coll
        return self._run(0, lambda a: c.barrier(async_op=a), None)


def _host_port(host, port):
    return "tcp://[%s]:%d" % (host, port) if ":" in host else "tcp://%s:%d" % (host, port)


def _rendezvous(store, rank, size, timeout):
    """The collective of a new group: a fresh key prefix agreed through torch's store, then
    distmesh's rendezvous on the TCPStore behind it, or on a store rank 0 serves."""
    timeout_ms = _ms(timeout) if timeout is not None else 0
    # torchrun's agent keeps one store across restarts (static rendezvous: its TCPStore, no
    # prefix per attempt): a key of the dead attempt would still be there, and a rank of the
    # next attempt could read it before rank 0 rewrites it. The attempt names the keys.
    attempt = "distmesh/attempt%s/" % os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if rank == 0:
        store.set(attempt + "session", uuid.uuid4().hex)
    session = store.get(attempt + "session").decode()
    prefix = "distmesh/%s/" % session
    base = store
    while hasattr(base, "underlying_store"):    # PrefixStore's chain down to the real store
        base = base.underlying_store
    if isinstance(base, dist.TCPStore):
        url = _host_port(base.host, base.port)
        dm_store = _C.Store(url, False, None, timeout_ms)
    elif isinstance(base, _UrlStore):           # a default group from set_default_group: its store's url
        dm_store = _C.Store(base.url, False, None, timeout_ms)
    elif rank == 0:
        host = os.environ.get("MASTER_ADDR") or "127.0.0.1"
        dm_store = _C.Store(_host_port(host, 0), True, None, timeout_ms)
        store.set(attempt + "store", _host_port(host, dm_store.port))
    else:
        dm_store = _C.Store(store.get(attempt + "store").decode(), False, None, timeout_ms)
    return _C.tcp(rank, size, dm_store, None, prefix, None, timeout_ms, None, cls=Collective)


def _create(store, rank, size, timeout):
    return ProcessGroup(_rendezvous(store, rank, size, timeout), owns=True)


def _create_extended(opts, pg_options=None):
    """torch 2.x's extended creator: c10d's DistributedBackendOptions (store, group_rank,
    group_size, timeout, group_id, global_ranks_in_group); the group takes its name."""
    coll = _rendezvous(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    return ProcessGroup(coll, str(opts.group_id), owns=True)


def _register():
    if hasattr(dist.Backend, BACKEND.upper()):
        return
    params = inspect.signature(dist.Backend.register_backend).parameters
    if "devices" in params:                     # torch 2.x: CPU tensors only, the extended creator
        dist.Backend.register_backend(BACKEND, _create_extended, extended_api=True, devices=["cpu"])
    else:                                       # torch 1.13
        dist.Backend.register_backend(BACKEND, _create)


_register()


def device_mesh(shape, names, world_size=None):
    """torch 2.x's init_device_mesh("cpu", shape, mesh_dim_names=names) with "distmesh" groups
    on every dim (backend_override where torch's default group has another backend); first
    initializes torch.distributed with the "distmesh" backend from the environment (env://:
    MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, as torchrun sets them) when it is not yet.
    A collective call."""
    from torch.distributed.device_mesh import init_device_mesh
    if not dist.is_initialized():
        dist.init_process_group(BACKEND)
    if world_size is not None and dist.get_world_size() != world_size:
        raise ValueError("torch.distributed's world has %d ranks, the mesh %d" % (dist.get_world_size(), world_size))
    override = None if dist.get_backend() == BACKEND else {n: BACKEND for n in names}
    return init_device_mesh("cpu", tuple(shape), mesh_dim_names=tuple(names), backend_override=override)


def collective(group=None):
    """The distmesh Collective under a group of the "distmesh" backend (None: the default)."""
    if group is None:
        group = dist.distributed_c10d._get_default_group()
    if not isinstance(group, ProcessGroup):
        raise TypeError("not a distmesh process group: %r" % (group,))
    return group.collective




# >>world: a Collective's group in torch.distributed's own tables (issue 51). torch's new_group
# and init_process_group record every group they make in distributed_c10d's world maps (the
# backend and store, the name, the global rank -> group rank map, the tag); dist.get_rank(pg),
# get_world_size(pg), get_process_group_ranks, DeviceMesh and Distributed Checkpoint look a
# group up there. A ProcessGroup made from a Collective is recorded the same way.
_names = iter(range(1 << 62))


class _NoStore(dist.Store):
    """The store of a group made from a Collective when none is known: every use says why."""

    def __init__(self, why):
        super().__init__()
        self._why = why

    def _refuse(self, *args):
        raise RuntimeError("distmesh: %s" % self._why)

    set = get = add = compare_set = wait = check = delete_key = num_keys = _refuse


class _UrlStore(dist.Store):
    """A torch Store over distmesh's store client (tcp://host:port: a TCPStore or distmesh's
    own server; file:///dir): what torch hands the creator of groups made later (new_group,
    init_device_mesh) on a default group made from a Collective."""

    def __init__(self, url, timeout_ms=0):
        super().__init__()
        self.url = url
        self._timeout_ms = timeout_ms
        self._client = None
        self._lock = threading.Lock()

    def _s(self):
        """The client, connected at the first use (most groups never use their store)."""
        with self._lock:
            if self._client is None:
                self._client = _C.Store(self.url, False, None, self._timeout_ms)
            return self._client

    def set(self, key, value):
        self._s().set(key, value if isinstance(value, bytes) else bytes(value, "utf-8") if isinstance(value, str)
                      else bytes(value))

    def get(self, key):
        return self._s().get(key)

    def add(self, key, delta):
        return self._s().add(key, int(delta))

    def wait(self, keys, timeout=None):
        for k in keys:
            self._s().get(k)

    def check(self, keys):
        raise RuntimeError("distmesh: a store over %s cannot check for keys without waiting" % self.url)


def _env_store():
    """The store the environment names (DISTMESH_STORE, else MASTER_ADDR / MASTER_PORT: the
    one distmesh.init() met through), or a _NoStore saying so."""
    url = os.environ.get("DISTMESH_STORE")
    if not url and os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        url = _host_port(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    if not url:
        return _NoStore("this group was made from a Collective and no store is known (pass store= to "
                        "set_default_group, or set DISTMESH_STORE or MASTER_ADDR / MASTER_PORT): groups made "
                        "later through torch (new_group, init_device_mesh) need one")
    return _UrlStore(url)


def register_process_group(pg, global_ranks=None, store=None):
    """Records pg, a ProcessGroup made from a Collective, in torch.distributed's world maps as
    new_group records its groups, so that dist.get_rank(pg), get_world_size(pg),
    get_process_group_ranks(pg), get_backend(pg), DeviceMesh.from_group and Distributed
    Checkpoint take it; returns pg. Collective.process_group calls it.

    global_ranks: the default group's rank of each member, in group order. None: the
    collective's own ranks when torch.distributed is not initialized (the collective stands for
    the world: see set_default_group), else each member's dist.get_rank() gathered over the
    collective (a collective call: every member registers at the same point)."""
    from torch.distributed import distributed_c10d as c10d
    pg_map, pg_names, pg_group_ranks = _maps()
    if pg in pg_map:
        return pg
    coll = pg.collective
    if global_ranks is None:
        if not dist.is_initialized():
            global_ranks = list(range(coll.world_size))
        else:
            mine = torch.tensor([dist.get_rank()], dtype=torch.int64)
            every = torch.empty(coll.world_size, dtype=torch.int64)
            coll.all_gather(every, mine)
            global_ranks = every.tolist()
    if len(global_ranks) != coll.world_size or len(set(global_ranks)) != coll.world_size:
        raise ValueError("register_process_group: global_ranks %r do not name the group's %d ranks once each"
                         % (global_ranks, coll.world_size))
    name = pg.getGroupName() or "distmesh_collective_%d" % next(_names)
    pg.setGroupName(name)
    mapping = {g: i for i, g in enumerate(global_ranks)}
    store = store if store is not None else _env_store()
    if hasattr(c10d, "_register_pg_in_world"):          # torch 2.9 and later
        c10d._register_pg_in_world(pg, backend_name=BACKEND, store=store, group_name=name,
                                   backend_config="cpu:" + BACKEND, rank_mapping=mapping)
    else:                                               # what it does, for older 2.x and 1.13
        pg_map[pg] = (BACKEND, store)
        pg_names[pg] = name
        pg_group_ranks[pg] = mapping
        w = getattr(c10d, "_world", None)               # 2.x: tags, backend config, the name registry
        if w is not None:
            w.pg_backend_config[pg] = "cpu:" + BACKEND
            tag = "ptd:" + name
            w.tags_to_pg.setdefault(tag, []).append(pg)
            w.tags_to_pg.setdefault("", []).append(pg)
            w.pg_to_tag[pg] = tag
        if hasattr(c10d, "_register_process_group"):
            c10d._register_process_group(name, pg)
    return pg


def _maps():
    """torch.distributed's (pg_map, pg_names, pg_group_ranks): 2.x's _world, 1.13's globals."""
    from torch.distributed import distributed_c10d as c10d
    w = getattr(c10d, "_world", None)
    if w is not None:
        return w.pg_map, w.pg_names, w.pg_group_ranks
    return c10d._pg_map, c10d._pg_names, c10d._pg_group_ranks


def _known_process_group(coll):
    """Collective.process_group's maker: its ProcessGroup, recorded in the world maps."""
    return register_process_group(ProcessGroup.from_collective(coll))


def set_default_group(coll, store=None):
    """Makes a Collective (a world: distmesh.init(), connect(), ...) torch.distributed's default
    group, as init_process_group("distmesh") would, without a second rendezvous: afterwards
    dist.is_initialized(), dist.get_rank() / get_world_size() are the collective's, calls
    without a group run on it, and new_group / init_device_mesh make "distmesh" groups, meeting
    through store (a torch Store; None: a client of the environment's store, DISTMESH_STORE or
    MASTER_ADDR / MASTER_PORT). Returns its ProcessGroup. dist.destroy_process_group() undoes
    it (the collective stays open: close it yourself). Raises RuntimeError when torch.distributed
    is already initialized."""
    from torch.distributed import distributed_c10d as c10d
    if dist.is_initialized():
        raise RuntimeError("distmesh: set_default_group: torch.distributed already has a default group")
    store = store if store is not None else _env_store()
    pg = coll.process_group
    if pg is None:
        raise TypeError("distmesh: set_default_group: %r has no process group" % (coll,))
    pg_map, _, pg_group_ranks = _maps()
    pg_map[pg] = (BACKEND, store)
    pg_group_ranks[pg] = {i: i for i in range(coll.world_size)}
    c10d._update_default_pg(pg)
    return pg


_register_process_group_factory(_known_process_group)     # Collective.process_group

_COMPRESS_MODES = ("none", "bf16", "int8")
_COMPRESSIBLE = (torch.float32, torch.bfloat16, torch.float16)


def compress_hook(mode="int8"):
    """A DDP communication hook averaging each gradient bucket with distmesh's compressed
    all-reduce: ``model.register_comm_hook(group, distmesh.torch.compress_hook("int8"))``, with
    group a "distmesh" process group (None: the default group, which must be one).

    mode: "int8" (8-bit codes, one scale per block of 256 elements), "bf16" or "none" (exact).
    Only the stage between hosts is compressed (inside a host the sum is exact; on one host the
    whole call is exact), and every rank gets the same bits. The hook keeps one
    distmesh.CompressState per bucket (by bucket.index(); a new one, zeros, when the bucket's
    size changes, as when DDP rebuilds its buckets after the first step), so what compression
    drops on a step is added to the next one (error feedback). Register one hook per model.
    float64 gradients are averaged exactly (distmesh compresses float32, bfloat16 and float16).
    Each call is one async distmesh request (MEAN over the group); its future is completed by
    the group's completer thread."""
    if mode not in _COMPRESS_MODES:
        raise ValueError("compress_hook: mode must be one of %s, got %r" % (", ".join(map(repr, _COMPRESS_MODES)),
                                                                            mode))
    states = {}
    lock = threading.Lock()

    def distmesh_compress_hook(state, bucket):
        group = state if state is not None else dist.distributed_c10d._get_default_group()
        if not isinstance(group, ProcessGroup):
            raise TypeError("distmesh.torch.compress_hook: the hook's state must be a distmesh process group "
                            "(or None for the default group, when it is one), got %r" % (group,))
        buf = _cpu(bucket.buffer(), "compress_hook")
        if buf.dtype in _COMPRESSIBLE:
            with lock:
                cs = states.get(bucket.index())
                if cs is None or cs.count != buf.numel():
                    cs = states[bucket.index()] = _C.CompressState(buf.numel())
            req = group.collective.all_reduce(buf, ReduceOp.MEAN, compress=mode, state=cs, async_op=True)
        else:
            req = group.collective.all_reduce(buf, ReduceOp.MEAN, async_op=True)
        return _future_of(_Call([req], buf, None), group._completer)

    distmesh_compress_hook.states = states          # bucket index -> its CompressState (tests, checkpoints)
    return distmesh_compress_hook
