"""distmesh for Python: collectives over the distmesh C library (a CPython extension over its
public API, no second implementation), with the seeds' classes and names.

    import distmesh, numpy as np
    c = distmesh.init()                       # the launcher's world (torchrun, mpirun, srun)
    x = np.ones(4, np.float32)
    c.all_reduce(x, distmesh.ReduceOp.SUM)    # in place, GIL released, Ctrl-C aborts it

    import distmesh.torch                     # registers the "distmesh" torch.distributed backend

Classes: Collective (Optimus-DL), FakeCollective, Mesh, Request, CompressState (the error
feedback of all_reduce(..., compress="int8", state=...)); DistributedInterface,
DistributedStrategy, Dim (LLaMA-Factory). Functions: init, connect, connect_nccl (a build with
NCCL: nccl_built), thread_world, env; openssl_built (encrypted links). Errors:
distmesh.Error and its subclasses (PeerLost, Timeout, Mismatch, Aborted, ...), each with
.status, .status_name, .message. See docs/python.md.
"""
from ._C import (VERSION as __version__, Request, CompressState, Error, InvalidArgument, OutOfMemory,
                 Unsupported, InternalError, Timeout, PeerLost, Mismatch, NetworkError, ProtocolError, NotFound,
                 Refused, EnvError, CudaError, NcclError, Aborted, FileSystemError, Busy)
from .collective import (ReduceOp, IN_PLACE, Collective, FakeCollective, Mesh, init, connect, connect_nccl, thread_world,
                         env, nccl_built, openssl_built)
from .strategy import Dim, DistributedStrategy, DistributedInterface

__all__ = [
    "ReduceOp", "IN_PLACE", "Collective", "FakeCollective", "Mesh", "Request", "CompressState", "init", "connect",
    "connect_nccl", "thread_world", "env", "nccl_built", "openssl_built",
    "Dim", "DistributedStrategy", "DistributedInterface",
    "Error", "InvalidArgument", "OutOfMemory", "Unsupported", "InternalError", "Timeout", "PeerLost",
    "Mismatch", "NetworkError", "ProtocolError", "NotFound", "Refused", "EnvError", "CudaError", "NcclError",
    "Aborted", "FileSystemError", "Busy",
]
