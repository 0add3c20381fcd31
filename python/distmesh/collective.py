"""The seeds' collectives on distmesh: Optimus-DL's ``Collective`` and ``FakeCollective``,
a threaded world for tests, named meshes, and mpi4py's upper-case (buffer) / lower-case
(object) spellings beside the seeds' names.

Buffers are used in place, without copies: numpy arrays, bytearray, memoryview, array.array,
CPU torch tensors (bfloat16 and float16 included); in an NCCL build (``nccl_built``) CUDA
tensors too, on collectives from ``connect_nccl`` (and ``connect``'s TCP backend, staged).
Every collective call releases the GIL; every failure is a ``distmesh.Error`` subclass. See
docs/python.md.
"""
import contextlib
import enum
import importlib
import pickle
import threading

from . import _C
from ._imports import after_import as _after_import

__all__ = ["ReduceOp", "IN_PLACE", "Collective", "FakeCollective", "Mesh", "init", "connect", "connect_nccl",
           "thread_world", "env", "nccl_built", "openssl_built"]

# Collective.process_group's maker, set by distmesh.torch when it is imported (it imports this
# module; this module never imports it, only loads it by name the first time a group is asked for)
_process_group_factory = None


def _register_process_group_factory(factory):
    """distmesh.torch's hook: factory(collective) -> its torch ProcessGroup."""
    global _process_group_factory
    _process_group_factory = factory


nccl_built = _C.NCCL_BUILT
"""Whether this build has the NCCL backend (connect_nccl, CUDA tensors): DISTMESH_NCCL=1 at
pip install, or make install PY_NCCL=1 (docs/python.md)."""

openssl_built = _C.OPENSSL_BUILT
"""Whether this build has OpenSSL's libcrypto (DISTMESH_OPENSSL; setup.py takes it when its
headers are there): with a token, links between hosts and the store's connections are then
encrypted (DISTMESH_ENCRYPT, SECURITY.md)."""


class ReduceOp(enum.IntEnum):
    """distmesh's reductions (C: DM_SUM ... DM_MEAN). MEAN on integers truncates toward zero.
    Calls also take torch.distributed.ReduceOp (SUM, PRODUCT, MAX, MIN, AVG) and the names
    "sum", "prod", "max", "min", "mean" / "avg"."""
    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3
    MEAN = 4
    AVG = 4          # torch's name for MEAN
    PRODUCT = 1      # torch's name for PROD


_OP_NAMES = {"sum": 0, "prod": 1, "product": 1, "max": 2, "min": 3, "mean": 4, "avg": 4}


def _op_code(op):
    """op -> distmesh's number, for anything that is not an int (the C side takes ints)."""
    if isinstance(op, str):
        name = op.lower()
    else:   # torch.distributed.ReduceOp: 1.13 wraps a RedOpType (.op), 2.x passes RedOpType itself
        name = getattr(getattr(op, "op", op), "name", None)
        name = name.lower() if isinstance(name, str) else None
    if name in _OP_NAMES:
        return _OP_NAMES[name]
    raise ValueError("unsupported reduce op %r (distmesh reduces with SUM, PROD, MAX, MIN, MEAN/AVG)" % (op,))


_C._set_op_converter(_op_code)


class _InPlace:
    def __repr__(self):
        return "distmesh.IN_PLACE"


IN_PLACE = _InPlace()
"""mpi4py's MPI.IN_PLACE for the upper-case methods: Allreduce(IN_PLACE, buf)."""


def _ms(timeout):
    """seconds (None: the default, from DISTMESH_TIMEOUT or 300 s; negative: forever) -> ms."""
    if timeout is None:
        return 0
    if hasattr(timeout, "total_seconds"):
        timeout = timeout.total_seconds()
    if timeout < 0:
        return -1
    return max(1, int(round(timeout * 1000)))


class Collective(_C.Comm):
    """A group of ranks (Optimus-DL's ``Collective``; C: ``dm_collective``).

    Made by ``distmesh.init()`` (the environment's world: torchrun, mpirun, srun, by hand),
    ``FakeCollective(rank, world_size)``, ``thread_world(n, fn)``, a ``Mesh``'s ``group(dim)``
    or a ``DistributedInterface``. Tensor methods work in place on the caller's buffers.

    From the C type: rank, world_size, local_rank, local_world_size, is_master,
    is_local_master, backend, transport, sequence, last_error; barrier, all_reduce(tensor, op,
    send=None, compress=None, state=None) (compress "bf16" / "int8": the stage between hosts
    compressed, a CompressState for error feedback),
    all_gather(output, input), all_gather_to_list(outputs, input), reduce_scatter,
    broadcast(tensor, source_rank=0), reduce, gather, scatter, all_to_all, all_to_all_v, send,
    recv(tensor, peer, tag=0) (peer None: from any rank; returns the sender's rank) (each with
    async_op=False; True returns a Request, whose wait() returns what the call returns),
    split, abort, close."""

    ReduceOp = ReduceOp
    """Optimus-DL's Collective.ReduceOp (its collective.all_reduce(t, op=Collective.ReduceOp.MAX))."""

    _tp_size = 1
    _tp_mesh = None
    _tp_one = None
    _pg = None
    _torch_mesh = None

    # ---- Optimus-DL's keyword names --------------------------------------------------------
    def all_gather(self, *args, **kw):
        """all_gather(output, input, async_op=False): output holds world_size x input, rank r's
        at r. Optimus-DL's names output_tensor= / input_tensor= are taken too."""
        if kw:
            _rename(kw, "output_tensor", "output")
            _rename(kw, "input_tensor", "input")
        return _C.Comm.all_gather(self, *args, **kw)

    def all_gather_to_list(self, *args, **kw):
        """all_gather_to_list(outputs, input, async_op=False): outputs[r] gets rank r's input.
        Optimus-DL's names output_tensors= / input_tensor= are taken too."""
        if kw:
            _rename(kw, "output_tensors", "outputs")
            _rename(kw, "input_tensor", "input")
        return _C.Comm.all_gather_to_list(self, *args, **kw)

    # ---- the seeds' topology (Optimus-DL) ---------------------------------------------------
    @property
    def local(self):
        """The ranks on this host (dm_local). Its first use is a collective call: make it on
        every rank at the same point. Optimus-DL's FakeCollective returns itself."""
        if self.world_size == 1:
            return self
        return self._local()

    @property
    def tp_size(self):
        """The tensor-parallel size init(tp_size=...) set (1: no TP)."""
        return self._tp_size

    @property
    def dp_rank(self):
        """rank // tp_size (TP innermost, as Optimus-DL's MeshCollective)."""
        return self.rank // self._tp_size

    @property
    def dp_world_size(self):
        """world_size // tp_size: the data-parallel ranks."""
        return self.world_size // self._tp_size

    @property
    def tp_rank(self):
        """rank % tp_size: this rank within its tensor-parallel group."""
        return self.rank % self._tp_size

    @property
    def tp_world_size(self):
        """tp_size: the ranks of this rank's tensor-parallel group."""
        return self._tp_size

    @property
    def tp_world(self):
        """This rank's tensor-parallel group: the mesh's "tp" group (init(tp_size=...)); with
        tp_size 1 a one-rank collective (itself at world size 1, as Optimus-DL's Fake)."""
        if self._tp_mesh is not None:
            return self._tp_mesh.group("tp")
        if self.world_size == 1:
            return self
        if self._tp_one is None:
            self._tp_one = _C.fake(0, 1, cls=Collective)
        return self._tp_one

    @property
    def tp_mesh(self):
        """Optimus-DL's tp_mesh: this rank's tensor-parallel group as a one-dimensional torch
        DeviceMesh named "tp" (of the parallel mesh dp_replicate x dp_shard x tp, dp_shard 1).
        torch 2.x; the first use of tp_mesh or dp_mesh is a collective call (see dp_mesh)."""
        return self._parallel_mesh()["tp"]

    @property
    def dp_mesh(self):
        """Optimus-DL's dp_mesh: the data-parallel ranks as a two-dimensional torch DeviceMesh,
        ("dp_replicate", "dp_shard") of shape (dp_world_size, 1) (Optimus-DL's sharding_world_size
        1; its FSDP transform flattens it). Made at the first use (a collective call) with
        init_device_mesh over torch.distributed's default group, which must cover this
        collective's ranks; when torch.distributed is not initialized this collective becomes
        its default group first (distmesh.torch.set_default_group)."""
        return self._parallel_mesh()["dp_replicate", "dp_shard"]

    def _parallel_mesh(self):
        if self._torch_mesh is None:
            dmtorch = importlib.import_module(__package__ + ".torch")     # loaded by name, as process_group does
            import torch.distributed as dist
            if not dist.is_initialized():
                dmtorch.set_default_group(self)
            self._torch_mesh = dmtorch.device_mesh((self.world_size // self._tp_size, 1, self._tp_size),
                                                   ("dp_replicate", "dp_shard", "tp"), self.world_size)
        return self._torch_mesh

    def _set_tp(self, tp_size):
        """dp x tp over this world (a collective call): dm_mesh_create_dp_tp."""
        if tp_size < 1 or self.world_size % tp_size != 0:
            raise ValueError("World size (%d) must be divisible by tp_size (%d)" % (self.world_size, tp_size))
        if tp_size > 1:
            self._tp_mesh = _C.mesh_dp_tp(self, tp_size)
        self._tp_size = tp_size
        return self

    @property
    def default_device(self):
        """Where this collective's calls run: torch.device("cpu"), or torch.device("cuda", i)
        for an NCCL collective; the string ("cpu", "cuda:1") when torch does not import."""
        kind, index = self.device
        name = "cpu" if kind == "cpu" else "%s:%d" % (kind, index)
        try:
            import torch
        except ImportError:
            return name
        return torch.device(name)

    @property
    def process_group(self):
        """A torch.distributed ProcessGroup over this collective (distmesh.torch; imports
        torch): usable as DDP(model, process_group=...) and with the group's own methods."""
        if self._pg is None:
            if _process_group_factory is None:              # distmesh.torch registers it
                importlib.import_module(__package__ + ".torch")
            self._pg = _process_group_factory(self)
        return self._pg

    # ---- objects (pickled) --------------------------------------------------------------------
    def all_gather_objects(self, object):
        """Every rank's object, in rank order (pickled; unpickle only data you trust)."""
        data = pickle.dumps(object, protocol=pickle.HIGHEST_PROTOCOL)
        return [pickle.loads(b) for b in self._all_gather_bytes(data)]

    def broadcast_objects(self, objects, source_rank=0):
        """The source rank's list of objects replaces the contents of ``objects`` everywhere."""
        items = None
        if self.rank == source_rank:
            items = [pickle.dumps(o, protocol=pickle.HIGHEST_PROTOCOL) for o in objects]
        got = self._broadcast_bytes(items, source_rank)
        if self.rank != source_rank:
            objects[:] = [pickle.loads(b) for b in got]

    # ---- helpers --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def main_process_first(self, local_only):
        """The seed's main_process_first: the (local) master runs the block first, the others
        after it (C: dm_main_process_first_begin/_end; local_only is explicit, as in C)."""
        self.main_process_first_begin(local_only)
        try:
            yield
        finally:
            self.main_process_first_end(local_only)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        if self.closed:
            return "<%s closed>" % type(self).__name__
        return "<%s rank %d of %d, backend %s, transport %s>" % (
            type(self).__name__, self.rank, self.world_size, self.backend, self.transport)

    # ---- mpi4py's spellings: upper case takes buffers, lower case pickles objects ------------
    def Get_rank(self):
        """mpi4py's name for rank."""
        return self.rank

    def Get_size(self):
        """mpi4py's name for world_size."""
        return self.world_size

    def Barrier(self):
        """mpi4py's Barrier: barrier()."""
        self.barrier()

    def Allreduce(self, sendbuf, recvbuf, op=ReduceOp.SUM):
        """mpi4py's Allreduce: recvbuf = op over every rank's sendbuf (IN_PLACE: recvbuf's own)."""
        if sendbuf is IN_PLACE:
            self.all_reduce(recvbuf, op)
        else:
            self.all_reduce(recvbuf, op, send=sendbuf)

    def Bcast(self, buf, root=0):
        """mpi4py's Bcast: buf from rank root, in place."""
        self.broadcast(buf, root)

    def Allgather(self, sendbuf, recvbuf):
        """mpi4py's Allgather: every rank's sendbuf, in rank order, into recvbuf."""
        self.all_gather(recvbuf, sendbuf)

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=ReduceOp.SUM):
        """mpi4py's Reduce_scatter_block: this rank's block of op over every sendbuf."""
        self.reduce_scatter(recvbuf, sendbuf, op)

    def Alltoall(self, sendbuf, recvbuf):
        """mpi4py's Alltoall: block j of sendbuf (IN_PLACE: recvbuf's) to rank j."""
        self.all_to_all(recvbuf, None if sendbuf is IN_PLACE else sendbuf)

    def Send(self, buf, dest, tag=0):
        """mpi4py's Send: buf to rank dest."""
        self.send(buf, dest, tag)

    def Recv(self, buf, source=None, tag=0):
        """mpi4py's Recv: buf from rank source (None: any source, MPI.ANY_SOURCE); returns the
        sender's rank (mpi4py puts it in a Status)."""
        return self.recv(buf, source, tag)

    def allgather(self, obj):
        """mpi4py's allgather: every rank's obj, in rank order (pickled)."""
        return self.all_gather_objects(obj)

    def bcast(self, obj, root=0):
        """mpi4py's bcast: rank root's obj, returned on every rank (pickled)."""
        box = [obj]
        self.broadcast_objects(box, root)
        return box[0]


_C._set_comm_class(Collective)


def _rename(kw, theirs, ours):
    if theirs in kw:
        if ours in kw:
            raise TypeError("give %s or %s, not both" % (ours, theirs))
        kw[ours] = kw.pop(theirs)


class FakeCollective(Collective):
    """Optimus-DL's FakeCollective(rank, world_size, device_type="cpu"): one process, no
    network (C: dm_fake_create); device_type names default_device, as Optimus-DL's.

    World size 1 is exactly Optimus-DL's: barrier and all_reduce do nothing, all_gather copies
    the input into every slot, broadcast from a source other than this rank raises ValueError,
    process_group is None. world_size > 1 simulates one member of a world whose ranks all hold
    the same data (all_reduce SUM multiplies by world_size, ...: distmesh_core.h >>fake); a rank not
    below world_size raises InvalidArgument (a ValueError) instead of the seed's assert."""

    _device_type = "cpu"

    def __new__(cls, rank=0, world_size=1, device_type="cpu", local_world_size=0, timeout=None):
        if not isinstance(device_type, str):
            raise TypeError("FakeCollective(rank, world_size, device_type=\"cpu\", local_world_size=0, "
                            "timeout=None): device_type is a device name (Optimus-DL's), got %r" % (device_type,))
        c = _C.fake(rank, world_size, local_world_size, _ms(timeout), cls=cls)
        c._device_type = device_type
        return c

    def __init__(self, rank=0, world_size=1, device_type="cpu", local_world_size=0, timeout=None):
        pass

    @property
    def default_device(self):
        """Optimus-DL's: torch.device("cuda:0") for device_type "cuda", "mps" for "mps", else
        "cpu" (the string where torch does not import)."""
        name = {"cuda": "cuda:0", "mps": "mps"}.get(self._device_type, "cpu")
        try:
            import torch
        except ImportError:
            return name
        return torch.device(name)

    @property
    def process_group(self):
        """None: a FakeCollective has no torch process group (as Optimus-DL's)."""
        return None


def _with_tp(c, tp_size):
    """A new world c with its dp x tp mesh made (tp_size), or c closed and the failure raised."""
    try:
        return c._set_tp(tp_size)
    except BaseException:
        c.close()
        raise


def init(timeout=None, tp_size=1):
    """The world the environment asks for (C: dm_init): torchrun's, mpirun's or srun's
    variables, or RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT by hand; a world-1
    FakeCollective when nothing says otherwise. timeout: seconds for every blocking call
    (default DISTMESH_TIMEOUT, else 300). tp_size > 1 builds Optimus-DL's dp x tp mesh (TP
    innermost), for tp_world / dp_rank / tp_rank (a collective call)."""
    c = _C.init(_ms(timeout), cls=Collective)
    return _with_tp(c, tp_size)


def connect(rank, world_size, store=None, prefix=None, transport=None, timeout=None, ifname=None, tp_size=1):
    """A world of world_size processes met through a store (C: dm_tcp_create), for launches
    by hand and for several worlds in one job. store: "tcp://host:port" (rank 0 serves it
    unless TORCHELASTIC_USE_AGENT_STORE=True) or "file:///shared/dir"; None: DISTMESH_STORE,
    else MASTER_ADDR / MASTER_PORT. prefix: this world's keys in the store (default
    "distmesh/"; give each world of a job its own). transport: "auto" (shared memory on one
    host, sockets across), "shm" or "tcp"; None: DISTMESH_TRANSPORT, else auto."""
    c = _C.tcp(rank, world_size, None, store, prefix, transport, _ms(timeout), ifname, cls=Collective)
    return _with_tp(c, tp_size)


def connect_nccl(rank=None, world_size=None, local_rank=None, cuda_device=None, store=None, prefix=None,
                 timeout=None, tp_size=1):
    """A world of world_size processes, one GPU each, on NCCL (C: dm_nccl_create); needs a build
    with NCCL (``nccl_built``), else raises Unsupported saying how to make one.

    world_size None: rank, world size and local rank from the launcher (torchrun, mpirun, srun:
    as init()); else rank is required and local_rank (default 0) picks the GPU. cuda_device:
    the CUDA device to use (None: local_rank % the device count). NCCL's unique id travels
    through the store: "tcp://host:port" (rank 0 serves it) or "file:///shared/dir"; None:
    DISTMESH_STORE, else MASTER_ADDR / MASTER_PORT. prefix: this world's keys in the store
    (default "distmesh_nccl/"). timeout: seconds for every blocking call (default
    DISTMESH_TIMEOUT, else 300).

    Its calls take CUDA tensors (torch, or any DLPack exporter with __dlpack__(stream=)):
    blocking calls return with the data ready (they wait for the collective's stream,
    ``cuda_stream``, with the deadline); a request's wait() and is_completed() mean the same.
    all_gather and broadcast also take host buffers (staged, slowly); the other collectives
    refuse them with InvalidArgument. The returned object is a Collective like any other."""
    if world_size is None:
        if rank is not None or local_rank is not None:
            raise TypeError("connect_nccl: rank and local_rank come with world_size (None: from the launcher)")
        rank = world_size = local_rank = 0
    elif rank is None:
        raise TypeError("connect_nccl: rank is required with world_size")
    c = _C.nccl(rank, world_size, local_rank or 0, -1 if cuda_device is None else cuda_device, None, store, prefix,
                _ms(timeout), cls=Collective)
    return _with_tp(c, tp_size)


def thread_world(n, fn, *args, timeout=None, local_world_size=0, tp_size=1):
    """Runs fn(collective, *args) for n ranks on n threads of this process that really
    exchange data (C: dm_thread_world_create), and returns the results in rank order.

    If a rank raises, the others' collectives are aborted (they fail at once with Aborted
    instead of waiting for it) and the first rank's exception is raised once every thread has
    ended. Ctrl-C aborts every rank the same way. The collectives are closed at the end."""
    comms = _C.thread_world(n, local_world_size, _ms(timeout), cls=Collective)
    results = [None] * n
    errors = [None] * n
    first = []
    lock = threading.Lock()

    def run(r):
        try:
            if tp_size != 1:
                comms[r]._set_tp(tp_size)
            results[r] = fn(comms[r], *args)
        except BaseException as e:          # noqa: BLE001 -- reported to the caller below
            errors[r] = e
            with lock:
                if not first:
                    first.append(r)
                    for c in comms:
                        if c is not comms[r]:
                            c.abort("rank %d raised %s" % (r, type(e).__name__))

    threads = [threading.Thread(target=run, args=(r,), name="distmesh-rank-%d" % r, daemon=True) for r in range(n)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.05)
    except BaseException:                   # Ctrl-C in the main thread: stop every rank
        for c in comms:
            c.abort("KeyboardInterrupt in thread_world")
        for t in threads:
            t.join()
        for c in comms:
            c.close()
        raise
    for c in comms:
        c.close()
    if first:
        raise errors[first[0]]
    return results


class Mesh:
    """Named dims over a world collective, row-major, the last dim innermost (C: dm_mesh).

    ``Mesh(world, {"dp": 2, "tp": 0})`` (0: inferred from the world size) or a sequence of
    (name, size) pairs. Every rank makes it (a collective call). rank(dim) / size(dim) /
    group(dim); dim None means the whole world. The groups belong to the mesh: close() (or the
    world's) closes them."""

    def __init__(self, world, dims):
        items = list(dims.items()) if hasattr(dims, "items") else [tuple(d) for d in dims]
        self._world = world
        self._m = _C.mesh(world, [n for n, _ in items], [s for _, s in items])

    @property
    def world(self):
        """The world collective the mesh was made over."""
        return self._world

    @property
    def dim_names(self):
        """The dims' names, in the order the mesh was made with."""
        return self._m.dim_names()

    @property
    def shape(self):
        """The dims' sizes, in dim_names' order."""
        return tuple(self._m.size(n) for n in self._m.dim_names())

    def rank(self, dim=None):
        """This rank's index along dim (None: its rank in the world)."""
        return self._m.rank(dim)

    def size(self, dim=None):
        """The size of dim (None: the world's size)."""
        return self._m.size(dim)

    def group(self, dim):
        """The collective of the ranks that differ from this one only along dim."""
        return self._m.group(dim)

    def __getitem__(self, dim):
        return self._m.group(dim)

    def close(self):
        """Closes the mesh and its groups (the world stays open)."""
        self._m.close()

    def __repr__(self):
        return "<distmesh.Mesh %s>" % ", ".join("%s=%d" % (n, s) for n, s in zip(self.dim_names, self.shape))


def env():
    """Where this process sits, from the launcher's variables (C: dm_env_detect)."""
    return _C.env_detect()


# >>optimus: where Optimus-DL is importable, its transforms and criteria check
# isinstance(collective, MeshCollective) (DDP, FSDP2, tensor parallel). distmesh's Collective
# registers as a virtual subclass of MeshCollective (an ABC; so of its Collective too) when
# optimus_dl.modules.distributed.mesh is imported, before or after distmesh: a finder at the
# front of sys.meta_path that answers None at once for every other module name.
_OPTIMUS_MESH = "optimus_dl.modules.distributed.mesh"


def _register_with_optimus(module):
    mesh_cls = getattr(module, "MeshCollective", None)
    if mesh_cls is not None and hasattr(mesh_cls, "register"):
        mesh_cls.register(Collective)


_after_import(_OPTIMUS_MESH, _register_with_optimus)
