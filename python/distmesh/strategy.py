"""LLaMA-Factory v1's DistributedInterface on distmesh: the dims mp_replicate, mp_shard, dp,
cp; DistributedStrategy with the seed's validation messages; per-dim rank, size, group and
collectives (C: dm_strategy). DistributedInterface behaves as LLaMA-Factory 0.9.5's
(llamafactory/v1/accelerator/interface.py and helper.py) for every call that project makes: one
instance per process, no dim meaning the world, its defaults (op MEAN, dim DP, src 0), Python
scalars, lists and numpy arrays in and out as the same type, torch DeviceMeshes and groups
(docs/seeds.md, "DistributedInterface in Python")."""
import dataclasses
import datetime
import enum
import os

from . import _C
from .collective import ReduceOp, _op_code, init

__all__ = ["Dim", "DistributedStrategy", "DistributedInterface"]


class Dim(str, enum.Enum):
    """The seed's dims; the values are the mesh dims' names."""
    MP_REPLICATE = "mp_replicate"
    MP_SHARD = "mp_shard"
    DP = "dp"
    CP = "cp"


_DIM_INDEX = {Dim.MP_REPLICATE: 0, Dim.MP_SHARD: 1, Dim.DP: 2, Dim.CP: 3}


def _dim_index(dim):
    if dim is None:
        raise ValueError("dim must be specified.")
    return _DIM_INDEX[Dim(dim)]


@dataclasses.dataclass
class DistributedStrategy:
    """The seed's sizes; None (or 0) means the seed's default. resolve(world_size) checks them
    with the seed's messages (C: dm_strategy_validate) and returns the resolved strategy."""
    mp_replicate_size: int = 1
    mp_shard_size: "int | None" = None
    dp_size: "int | None" = None
    cp_size: int = 1

    def resolve(self, world_size):
        """The strategy for world_size: the sizes checked (the seed's messages) and the defaults
        filled in (C: dm_strategy_validate)."""
        sizes = _C.strategy_validate(world_size, self.mp_replicate_size or 0, self.mp_shard_size or 0,
                                     self.dp_size or 0, self.cp_size or 0)
        return DistributedStrategy(*sizes)

    @property
    def model_mesh_shape(self):
        """(mp_replicate_size, mp_shard_size)."""
        return (self.mp_replicate_size, self.mp_shard_size)

    @property
    def model_mesh_dim_names(self):
        """("mp_replicate", "mp_shard")."""
        return (Dim.MP_REPLICATE.value, Dim.MP_SHARD.value)

    @property
    def data_mesh_shape(self):
        """(dp_size, cp_size)."""
        return (self.dp_size, self.cp_size)

    @property
    def data_mesh_dim_names(self):
        """("dp", "cp")."""
        return (Dim.DP.value, Dim.CP.value)


class _MeshView:
    """The model or data mesh of a strategy (owned by it)."""

    def __init__(self, m):
        self._m = m

    @property
    def dim_names(self):
        return self._m.dim_names()

    def rank(self, dim=None):
        return self._m.rank(dim)

    def size(self, dim=None):
        return self._m.size(dim)

    def group(self, dim):
        return self._m.group(dim)

    def __getitem__(self, dim):
        return self._m.group(Dim(dim).value if isinstance(dim, Dim) else dim)


_DEFAULT_TIMEOUT_S = 18000      # LLaMA-Factory's init_process_group(timeout=...) default


def _torch2():
    """torch.distributed with DeviceMesh (torch 2.x), or None."""
    try:
        import torch.distributed as dist
        import torch.distributed.device_mesh  # noqa: F401
    except ImportError:
        return None
    return dist


class DistributedInterface:
    """LLaMA-Factory's interface (v1 accelerator/interface.py) over distmesh.

    ``DistributedInterface(config=None)`` is the process's one instance (LLaMA-Factory's
    singleton: every later ``DistributedInterface()`` returns it, its config ignored, until
    destroy()). Distributed means ``RANK`` is set (LLaMA-Factory's helper.is_distributed).
    Then, with torch 2.x, torch.distributed is initialized with the "distmesh" backend
    (env://, config["timeout"] seconds, default 18000) unless it already is, and
    ``model_device_mesh`` (mp_replicate x mp_shard) and ``data_device_mesh`` (dp x cp) are
    torch DeviceMeshes whose groups are "distmesh" groups; the collectives run on them as
    LLaMA-Factory's helper runs them. Without torch 2.x the world is distmesh.init()'s and the
    meshes distmesh's. Not distributed: rank 0 of 1, no meshes (None), the collectives return
    their data unchanged.

    ``world=`` (a Collective you made, a thread_world rank, say) gives an interface of its own
    over that world instead of the singleton: distributed when its size is above 1, destroy()
    leaves the world open; its meshes are torch DeviceMeshes when torch.distributed is
    initialized over the same ranks, else distmesh's (every rank makes it: a collective call)."""

    _instance = None
    _initialized = False

    def __new__(cls, config=None, *, world=None):
        if world is not None:
            return super().__new__(cls)
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __init__(self, config=None, *, world=None):
        if self._initialized:
            return
        self.dist_config = config
        cfg = dict(config or {})
        self._own_world = world is None
        self._world = world
        self._s = None              # distmesh's strategy (its groups), made when needed
        self._meshes = None         # (model, data) torch DeviceMeshes, False: distmesh's
        self._own_torch = False     # whether this interface initialized torch.distributed
        self._is_distributed = world.world_size > 1 if world is not None else os.getenv("RANK") is not None
        timeout = cfg.get("timeout")
        if timeout is None:
            timeout = float(os.environ.get("DISTMESH_TIMEOUT") or _DEFAULT_TIMEOUT_S)
        self._timeout = timeout
        dist = _torch2() if self._is_distributed else None
        if world is None and self._is_distributed and dist is None:
            self._world = init(timeout=timeout)         # no torch 2.x: distmesh's own world
        size = self._world.world_size if self._world is not None else _env_int("WORLD_SIZE", 1)
        want = DistributedStrategy(cfg.get("mp_replicate_size", 1), cfg.get("mp_shard_size"),
                                   cfg.get("dp_size"), cfg.get("cp_size", 1))
        try:
            self.strategy = want.resolve(size if self._is_distributed else 1)
            if world is None and dist is not None:
                self._init_torch(dist)
            self._rank = self._world.rank if self._world is not None else (
                dist.get_rank() if dist is not None and dist.is_initialized() else _env_int("RANK", 0))
            self._world_size = size if self._is_distributed else 1
        except BaseException:
            self._close()
            raise
        self._local_rank = self._world.local_rank if self._world is not None else _env_int("LOCAL_RANK", 0)
        self._local_world_size = (self._world.local_world_size if self._world is not None
                                  else _env_int("LOCAL_WORLD_SIZE", 1))
        self.current_device = self._device()
        self.device_count = _device_count()
        self._initialized = True

    # ---- making the meshes --------------------------------------------------------------------
    def _init_torch(self, dist):
        """LLaMA-Factory's __init__: init_process_group, then both meshes (collective calls)."""
        from .torch import BACKEND, device_mesh
        if not dist.is_initialized():
            dist.init_process_group(backend=BACKEND, timeout=datetime.timedelta(seconds=self._timeout))
            self._own_torch = True
        s = self.strategy
        self._meshes = (device_mesh(s.model_mesh_shape, s.model_mesh_dim_names, dist.get_world_size()),
                        device_mesh(s.data_mesh_shape, s.data_mesh_dim_names, dist.get_world_size()))

    def _torch_meshes(self):
        """(model, data) torch DeviceMeshes, or False (a world= interface without them)."""
        if self._meshes is None:
            self._meshes = _torch_meshes(self.strategy, self._world.world_size)
        return self._meshes

    def _strategy(self):
        if self._s is None:
            s = self.strategy
            self._s = _C.strategy(self.world, s.mp_replicate_size, s.mp_shard_size, s.dp_size, s.cp_size)
        return self._s

    @property
    def world(self):
        """The world Collective: the one given, distmesh.init()'s, or under torch the default
        group's (a "distmesh" default group's own; another backend's: distmesh.init(), made at
        the first use, a collective call). A world-1 FakeCollective when not distributed."""
        if self._world is None:
            if not self._is_distributed:
                from .collective import FakeCollective
                self._world = FakeCollective()
            else:
                self._world = _default_collective()
                if self._world is None:
                    self._world = init(timeout=self._timeout)
                else:
                    self._own_world = False
        return self._world

    @property
    def model_device_mesh(self):
        """The model mesh, mp_replicate x mp_shard: a torch DeviceMesh (torch 2.x), else a
        distmesh mesh view; None when not distributed (LLaMA-Factory's)."""
        return self._mesh(0)

    @property
    def data_device_mesh(self):
        """The data mesh, dp x cp: a torch DeviceMesh (torch 2.x), else a distmesh mesh view;
        None when not distributed."""
        return self._mesh(1)

    def _mesh(self, i):
        if not self._is_distributed:
            return None
        meshes = self._meshes if self._meshes is not None else (
            self._torch_meshes() if self._world is not None else False)
        if meshes:
            return meshes[i]
        return _MeshView(self._strategy().model_mesh() if i == 0 else self._strategy().data_mesh())

    @property
    def model_mesh(self):
        """distmesh's model mesh, mp_replicate x mp_shard (its groups are Collectives)."""
        return _MeshView(self._strategy().model_mesh())

    @property
    def data_mesh(self):
        """distmesh's data mesh, dp x cp (its groups are Collectives)."""
        return _MeshView(self._strategy().data_mesh())

    # ---- per dim --------------------------------------------------------------------------------
    def get_device_mesh(self, dim=None):
        """The dim's one-dimensional mesh (a torch DeviceMesh with torch 2.x); None when not
        distributed; no dim raises ValueError("dim must be specified.")."""
        if dim is None:
            raise ValueError("dim must be specified.")
        dim = Dim(dim)
        if not self._is_distributed:
            return None
        mesh = self.data_device_mesh if dim.value in self.strategy.data_mesh_dim_names else self.model_device_mesh
        return mesh[dim.value]

    def get_group(self, dim=None):
        """The dim's process group: get_device_mesh(dim).get_group(), a torch ProcessGroup
        ("distmesh" backend); without torch 2.x meshes the dim's Collective. None when not
        distributed or for no dim (the default group, LLaMA-Factory's)."""
        if not self._is_distributed or dim is None:
            return None
        mesh = self.get_device_mesh(dim)
        return mesh.get_group() if hasattr(mesh, "get_group") else mesh

    def _group(self, dim):
        """What the collectives run on: a torch group, or the dim's Collective."""
        if dim is None:
            return None if self._torch_meshes_ready() else self.world
        if self._torch_meshes_ready():
            return self.get_device_mesh(dim).get_group()
        return self._strategy().group(_dim_index(dim))

    def _torch_meshes_ready(self):
        return bool(self._meshes if self._meshes is not None or self._world is None else self._torch_meshes())

    def get_rank(self, dim=None):
        """This rank's index in the dim's group; no dim: its rank in the world; 0 when not
        distributed."""
        if not self._is_distributed:
            return 0
        if dim is None:
            return self._rank
        if self._torch_meshes_ready():
            return self.get_device_mesh(dim).get_local_rank()
        return self._strategy().rank(_dim_index(dim))

    def get_world_size(self, dim=None):
        """The size of the dim's group; no dim: the world's size; 1 when not distributed."""
        if not self._is_distributed:
            return 1
        if dim is None:
            return self._world_size
        if self._torch_meshes_ready():
            return self.get_device_mesh(dim).size()
        return self._strategy().size(_dim_index(dim))

    def get_local_rank(self):
        """This rank among its host's ranks (LOCAL_RANK; the world's local_rank)."""
        return self._local_rank

    def get_local_world_size(self):
        """The ranks on this host (LOCAL_WORLD_SIZE; the world's local_world_size)."""
        return self._local_world_size

    # ---- collectives (LLaMA-Factory's helper.operate_tensorlike) ----------------------------
    def all_gather(self, data, dim=Dim.DP):
        """data from every member of the dim's group (no dim: the world), stacked on a new
        first dim; returned as data's kind (see _tensorlike). data itself when not distributed."""
        if not self._is_distributed:
            return data
        g = self._group(dim)
        return _tensorlike(lambda t: _gather(t, g), data, self._torch_meshes_ready())

    def all_reduce(self, data, op=ReduceOp.MEAN, dim=Dim.DP):
        """data reduced over the dim's group (op "sum", "mean", "max", "min", as
        LLaMA-Factory's ReduceOp, or distmesh.ReduceOp; MEAN is a SUM divided by the group's
        size, so an integer tensor raises as torch does). A tensor is reduced in place."""
        if not self._is_distributed:
            return data
        g, name = self._group(dim), _op_name(op)
        return _tensorlike(lambda t: _reduce(t, name, g), data, self._torch_meshes_ready())

    def broadcast(self, data, src=0, dim=Dim.DP):
        """data from the global rank src (as torch.distributed.broadcast's src) to the dim's
        group. A tensor is written in place."""
        if not self._is_distributed:
            return data
        g = self._group(dim)
        if not self._torch_meshes_ready() and dim is not None:
            src = self._group_rank_of(dim, src)
        return _tensorlike(lambda t: _bcast(t, src, g), data, self._torch_meshes_ready())

    def _group_rank_of(self, dim, src):
        """src, a world rank, as a rank of this rank's dim group (the meshes are row-major
        over the world's ranks, the second dim innermost)."""
        s = self.strategy
        dim = Dim(dim)
        shape = s.data_mesh_shape if dim.value in s.data_mesh_dim_names else s.model_mesh_shape
        inner = shape[1]
        me = self._rank
        if dim in (Dim.MP_REPLICATE, Dim.DP):           # the outer dim: same column
            ok, r = src % inner == me % inner, src // inner
        else:                                           # the inner dim: same row
            ok, r = src // inner == me // inner, src % inner
        if not ok or not 0 <= src < self._world_size:
            raise ValueError("broadcast: src %d is not a rank of this rank's %s group" % (src, dim.value))
        return r

    def sync(self):
        """Waits for this rank's device work (the world's synchronize(); CPU: nothing)."""
        if self._is_distributed and self._world is not None:
            self._world.synchronize()

    def barrier(self):
        """A barrier over the world (torch.distributed's default group under torch)."""
        if not self._is_distributed:
            return
        if self._world is None:
            _torch2().barrier()
        else:
            self._world.barrier()

    def destroy(self):
        """Closes what the interface made (torch.distributed's default group when it
        initialized it, distmesh's strategy and world) and forgets the process's instance,
        so a later DistributedInterface(config) makes a new one."""
        self._close()
        self._initialized = False
        if type(self)._instance is self:
            type(self)._instance = None

    def _close(self):
        if self._s is not None:
            self._s.close()
            self._s = None
        if self._own_torch:
            dist = _torch2()
            if dist.is_initialized():
                dist.destroy_process_group()
            self._own_torch = False
        if self._own_world and self._world is not None:
            self._world.close()
        self._world = None
        self._meshes = None

    def _device(self):
        if self._world is not None and self._world.device[0] != "cpu":
            return self._world.default_device
        try:
            import torch
        except ImportError:
            return "cpu"
        return torch.device("cpu")

    def __str__(self):
        meshes = self._meshes or (None, None)           # as made so far (asking may be a collective call)
        return ("DistributedInterface(strategy=%s), is_distributed=%s, current_device=%s, rank=%d, "
                "world_size=%d, model_device_mesh=%s, data_device_mesh=%s" % (
                    self.strategy, self._is_distributed, self.current_device, self.get_rank(),
                    self.get_world_size(), meshes[0], meshes[1]))


def _env_int(name, default):
    return int(os.environ.get(name) or default)


def _device_count():
    try:
        import torch
        return torch.accelerator.device_count()
    except (ImportError, AttributeError):
        return 0


def _default_collective():
    """The Collective under torch.distributed's default group when it is a "distmesh" one."""
    dist = _torch2()
    if dist is None or not dist.is_initialized() or dist.get_backend() != "distmesh":
        return None
    from .torch import collective
    return collective()


def _torch_meshes(s, world_size):
    """(model mesh, data mesh) as torch 2.x DeviceMeshes over "distmesh" groups, or False where
    torch or its device_mesh is missing (torch 1.13) or torch.distributed is not initialized
    over a world of this size."""
    dist = _torch2()
    if dist is None or not dist.is_initialized() or dist.get_world_size() != world_size:
        return False
    from .torch import device_mesh
    return (device_mesh(s.model_mesh_shape, s.model_mesh_dim_names, world_size),
            device_mesh(s.data_mesh_shape, s.data_mesh_dim_names, world_size))


# ---- LLaMA-Factory's helper.py, on a torch group or a distmesh Collective -----------------------
_OP_NAMES = {0: "sum", 1: "prod", 2: "max", 3: "min", 4: "mean"}


def _op_name(op):
    """"sum", "mean", "max", "min" or "prod" for LLaMA-Factory's ReduceOp (a str enum),
    distmesh's ReduceOp, a torch ReduceOp or a name."""
    if isinstance(op, int) and not isinstance(op, bool):
        return _OP_NAMES[int(ReduceOp(op))]
    return _OP_NAMES[_op_code(op)]


def _tensorlike(fn, data, torch_group):
    """LLaMA-Factory's operate_tensorlike: a tensor is used as is (fn may change it in place)
    and the result returned as a tensor; a numpy array becomes float32 (a float32 array is used
    in place) and the result a numpy array; a Python scalar or list becomes float32 and the
    result a float when it has one element, else a list. On a torch group the work is a torch
    tensor (as LLaMA-Factory's), on a Collective a numpy array."""
    mod = type(data).__module__.split(".")[0]
    if mod == "torch":
        return fn(data)
    import numpy as np
    if torch_group:
        import torch
        t = torch.from_numpy(data).to(dtype=torch.float) if isinstance(data, np.ndarray) \
            else torch.tensor(data, dtype=torch.float)
        out = fn(t)
        if isinstance(data, np.ndarray):
            return out.cpu().numpy()
        return out.item() if out.numel() == 1 else out.tolist()
    if isinstance(data, np.ndarray):
        buf = np.asarray(data, dtype=np.float32)        # float32 already: the caller's array
        if not (buf.flags.c_contiguous and buf.flags.writeable):
            buf = np.array(buf, order="C")
        return fn(buf)
    out = fn(np.array(data, dtype=np.float32))
    return out.item() if out.size == 1 else out.tolist()


def _is_collective(g):
    return isinstance(g, _C.Comm)


def _gather(t, g):
    """helper.all_gather: (group size, *t.shape), every member's t in rank order."""
    if _is_collective(g):
        out = _empty_like_stacked(t, g.world_size)
        g.all_gather(out, t)
        return out
    import torch
    import torch.distributed as dist
    out = torch.empty(dist.get_world_size(group=g) * t.numel(), dtype=t.dtype, device=t.device)
    dist.all_gather_into_tensor(out, t, group=g)
    return out.view(-1, *t.size())


def _reduce(t, name, g):
    """helper.all_reduce: SUM (for MEAN too, then divided by the group's size in place), MAX,
    MIN (and distmesh's PROD)."""
    op = "sum" if name == "mean" else name
    if _is_collective(g):
        g.all_reduce(t, op)
        n = g.world_size
    else:
        import torch.distributed as dist
        dist.all_reduce(t, op=getattr(dist.ReduceOp, "PRODUCT" if op == "prod" else op.upper()), group=g)
        n = dist.get_world_size(group=g)
    if name == "mean":
        t /= n
    return t


def _bcast(t, src, g):
    """helper.broadcast: src a global rank on a torch group, a group rank on a Collective."""
    if _is_collective(g):
        g.broadcast(t, src)
    else:
        import torch.distributed as dist
        dist.broadcast(t, src=src, group=g)
    return t


def _empty_like_stacked(data, n):
    shape = tuple(getattr(data, "shape", ()))
    mod = type(data).__module__.split(".")[0]
    if mod == "torch":
        import torch
        return torch.empty((n,) + shape, dtype=data.dtype, device=data.device)
    import numpy
    return numpy.empty((n,) + shape, dtype=data.dtype)
