"""LLaMA-Factory v1's DistributedInterface on distmesh: the dims mp_replicate, mp_shard, dp,
cp; DistributedStrategy with the seed's validation messages; per-dim rank, size, group and
collectives (C: dm_strategy). The departures from the seeds (docs/seeds.md) hold here too: an
inferred size must divide the world, every size is 1 at world size 1, no singleton, no dim
means an error in per-dim calls, op and dim are explicit, a broadcast source is a rank of the
dim's group, results are written into the caller's buffers (all_gather returns a new one of
the input's kind: (world, *shape))."""
import dataclasses
import enum
import os

from . import _C
from .collective import init

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


class DistributedInterface:
    """LLaMA-Factory's interface over a distmesh world.

    ``DistributedInterface(config)``: the world from the environment (distmesh.init, with
    config["timeout"] in seconds), then the strategy from config's mp_replicate_size,
    mp_shard_size, dp_size, cp_size. ``world=`` uses a collective you made instead (a
    thread_world rank, say); destroy() then leaves it open. Every rank constructs it (a
    collective call). Not a singleton (docs/seeds.md, departure 9)."""

    _meshes = None          # torch 2.x's (model, data) DeviceMesh, or False without it

    def __init__(self, config=None, *, world=None):
        config = dict(config or {})
        self._own_world = world is None
        self._world = init(timeout=config.get("timeout")) if world is None else world
        want = DistributedStrategy(config.get("mp_replicate_size", 1), config.get("mp_shard_size"),
                                   config.get("dp_size"), config.get("cp_size", 1))
        try:
            self.strategy = want.resolve(self._world.world_size)
            s = self.strategy
            self._s = _C.strategy(self._world, s.mp_replicate_size, s.mp_shard_size, s.dp_size, s.cp_size)
        except BaseException:
            if self._own_world:
                self._world.close()
            raise

    @property
    def world(self):
        """The world Collective the meshes are made over."""
        return self._world

    @property
    def model_mesh(self):
        """The model mesh, mp_replicate x mp_shard."""
        return _MeshView(self._s.model_mesh())

    @property
    def data_mesh(self):
        """The data mesh, dp x cp."""
        return _MeshView(self._s.data_mesh())

    def get_device_mesh(self, dim):
        """The dim's one-dimensional mesh, as the seed returns it: on torch 2.x a
        ``torch.distributed.device_mesh.DeviceMesh`` whose groups are "distmesh" groups (the
        model mesh mp_replicate x mp_shard or the data mesh dp x cp, made by
        ``init_device_mesh`` over torch's default group at the first call, a collective call:
        every rank makes it at the same point). torch.distributed must be initialized, or the
        interface made its own world from a launcher that sets MASTER_ADDR and MASTER_PORT
        (torchrun): then it is initialized with the "distmesh" backend from the environment
        (env://). Otherwise (torch 1.x, no torch, a world you passed with torch.distributed not
        initialized, a launcher without MASTER_ADDR) the dim's group (a Collective)."""
        i = _dim_index(dim)
        if self._meshes is None:
            self._meshes = _torch_meshes(self.strategy, self._world.world_size, self._own_world)
        if not self._meshes:
            return self._s.group(i)
        return self._meshes[0 if i < 2 else 1][Dim(dim).value]

    def get_group(self, dim):
        """The dim's group (a Collective)."""
        return self._s.group(_dim_index(dim))

    def get_rank(self, dim):
        """This rank's index in the dim's group."""
        return self._s.rank(_dim_index(dim))

    def get_world_size(self, dim):
        """The size of the dim's group."""
        return self._s.size(_dim_index(dim))

    def get_local_rank(self):
        """The world's local_rank (rank among this host's ranks)."""
        return self._world.local_rank

    def get_local_world_size(self):
        """The world's local_world_size (ranks on this host)."""
        return self._world.local_world_size

    def all_gather(self, data, dim):
        """A new array or tensor of shape (dim's size, *data.shape) holding every member's data."""
        g = self.get_group(dim)
        out = _empty_like_stacked(data, g.world_size)
        g.all_gather(out, data)
        return out

    def all_reduce(self, data, op, dim):
        """data reduced over the dim's group, in place; returns data."""
        self.get_group(dim).all_reduce(data, op)
        return data

    def broadcast(self, data, src, dim):
        """data from the group's rank src, in place; returns data."""
        self.get_group(dim).broadcast(data, src)
        return data

    def sync(self):
        """The world's synchronize()."""
        self._world.synchronize()

    def barrier(self):
        """A barrier over the world."""
        self._world.barrier()

    def destroy(self):
        """Closes the meshes, and the world when the interface made it."""
        self._s.close()
        if self._own_world:
            self._world.close()

    def __str__(self):
        return "DistributedInterface(strategy=%s, rank=%d, world_size=%d, backend=%s)" % (
            self.strategy, self._world.rank, self._world.world_size, self._world.backend)


def _torch_meshes(s, world_size, may_init):
    """(model mesh, data mesh) as torch 2.x DeviceMesh over "distmesh" groups, or False where
    torch or its device_mesh is missing (torch 1.13), or torch.distributed is not initialized
    and may not be (may_init false, or no MASTER_ADDR / MASTER_PORT for env://)."""
    try:
        import torch.distributed as dist
        import torch.distributed.device_mesh  # noqa: F401
    except ImportError:
        return False
    if not dist.is_initialized() and not (may_init and "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ):
        return False
    from .torch import device_mesh
    return (device_mesh(s.model_mesh_shape, s.model_mesh_dim_names, world_size),
            device_mesh(s.data_mesh_shape, s.data_mesh_dim_names, world_size))


def _empty_like_stacked(data, n):
    shape = tuple(getattr(data, "shape", ()))
    mod = type(data).__module__.split(".")[0]
    if mod == "torch":
        import torch
        return torch.empty((n,) + shape, dtype=data.dtype, device=data.device)
    if mod == "numpy":
        import numpy
        return numpy.empty((n,) + shape, dtype=data.dtype)
    raise TypeError("all_gather takes a numpy array or a torch tensor (distmesh writes into buffers, "
                    "docs/seeds.md, departure 12), got %s" % type(data).__name__)
