"""FakeCollective (Optimus-DL's, world 1, and a simulated member of a larger world), the
buffer kinds the package takes, and its refusals: no processes, no threads."""
import array
import gc
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import distmesh
from dlpack_util import AnnouncingExporter

try:
    import torch
except ImportError:         # ASan builds leave torch out (run_pytest.sh): its parts are skipped
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch does not import")


@needs_torch
def test_fake_world1_is_optimus_fake():
    """Optimus-DL's FakeCollective(0, 1): identities and no-ops, ValueError on a foreign root."""
    c = distmesh.FakeCollective(0, 1)
    assert (c.rank, c.world_size, c.local_rank, c.is_master, c.is_local_master) == (0, 1, 0, True, True)
    assert c.local is c and c.tp_world is c
    assert (c.dp_rank, c.dp_world_size, c.tp_rank, c.tp_world_size) == (0, 1, 0, 1)
    assert c.process_group is None
    assert c.default_device == torch.device("cpu")
    c.barrier()
    t = torch.arange(6, dtype=torch.float32)
    c.all_reduce(t, torch.distributed.ReduceOp.SUM)
    assert t.tolist() == list(range(6))
    out = torch.zeros(1, 6)
    c.all_gather(out, t)
    assert out[0].tolist() == t.tolist()
    outs = [torch.zeros(6)]
    c.all_gather_to_list(outs, t)
    assert outs[0].tolist() == t.tolist()
    with pytest.raises(ValueError):
        c.all_gather_to_list([torch.zeros(6), torch.zeros(6)], t)    # not world_size outputs
    with pytest.raises(ValueError):
        c.all_gather(torch.zeros(4, 6)[:, 1], t)                      # non-contiguous output
    assert c.all_gather_objects({"a": 1}) == [{"a": 1}]
    c.broadcast(t, 0)
    with pytest.raises(ValueError):
        c.broadcast(t, source_rank=1)
    objs = ["x"]
    c.broadcast_objects(objs, 0)
    assert objs == ["x"]
    with pytest.raises(ValueError):
        c.broadcast_objects(objs, source_rank=1)
    c.close()
    c.close()                                   # idempotent
    with pytest.raises(ValueError):
        c.barrier()


def test_fake_simulated_member_and_bad_rank():
    """world_size > 1: one member of a world whose ranks all hold the same data (C >>fake)."""
    c = distmesh.FakeCollective(rank=2, world_size=4)
    x = np.full(3, 1.5, np.float32)
    c.all_reduce(x, distmesh.ReduceOp.SUM)
    assert x.tolist() == [6.0] * 3
    c.all_reduce(x, "mean")
    assert x.tolist() == [6.0] * 3
    assert (c.dp_rank, c.dp_world_size, c.tp_world.world_size) == (2, 4, 1)
    assert c.all_gather_objects("o") == ["o"] * 4
    with pytest.raises(distmesh.InvalidArgument) as e:
        distmesh.FakeCollective(rank=4, world_size=4)
    assert isinstance(e.value, ValueError) and e.value.status == -1 and e.value.status_name == "DM_ERR_INVALID_ARG"


def test_recv_from_any_source_refusals():
    """recv(buf, None): a Fake rank has no peers (Unsupported, as for a named recv); world 1
    has no one to send (InvalidArgument); a negative tag or a peer other than None is refused."""
    buf = np.zeros(3, np.int32)
    c = distmesh.FakeCollective(rank=1, world_size=3)
    with pytest.raises(distmesh.Unsupported, match="any source"):
        c.recv(buf, None)
    with pytest.raises(distmesh.Unsupported):
        c.recv(buf, None, 2, async_op=True)
    with pytest.raises(ValueError):
        c.recv(buf, None, -1)
    with pytest.raises(distmesh.InvalidArgument):
        c.recv(buf, -1)
    with pytest.raises(distmesh.InvalidArgument, match="1-rank"):
        distmesh.FakeCollective(rank=0, world_size=1).Recv(buf, None)


def test_buffer_kinds_without_copies():
    """numpy, bytearray, memoryview, array.array and torch (bfloat16, float16, requires_grad)
    are used in place; their dtype is read from the buffer."""
    info = distmesh._C.buffer_info
    assert info(np.zeros(3, np.float32)) == ("float32", 3, 12, False)
    assert info(bytearray(5)) == ("uint8", 5, 5, False)
    assert info(b"ab")[3] is True
    assert info(array.array("d", [1.0, 2.0]))[:2] == ("float64", 2)
    assert info(memoryview(np.zeros(2, np.int64)))[0] == "int64"
    assert info(np.zeros(2, np.uint32))[0] == "uint32"
    assert info(np.zeros(4, np.float16))[0] == "float16"
    assert info(np.zeros(3, bool))[0] == "bool"
    c = distmesh.FakeCollective(0, 2)
    if torch is not None:
        assert info(torch.zeros(4, dtype=torch.bfloat16)) == ("bfloat16", 4, 8, False)
        assert info(torch.zeros(4, dtype=torch.float16))[0] == "float16"
        assert info(torch.zeros(2, 3, requires_grad=True))[:2] == ("float32", 6)
        t = torch.ones(4, dtype=torch.bfloat16)
        c.all_reduce(t, "sum")                  # written through the tensor's own memory
        assert t.tolist() == [2.0] * 4
    n = np.ones(4, np.float32)
    v = n[1:3]                                  # a contiguous view: in place in n
    c.all_reduce(v, "sum")
    assert n.tolist() == [1.0, 2.0, 2.0, 1.0]
    b = bytearray(b"\x01\x02")
    c.all_reduce(b, "sum")
    assert bytes(b) == b"\x02\x04"
    a = array.array("i", [3, 4])
    c.all_reduce(a, "max")
    assert list(a) == [3, 4]
    c.close()


def test_bad_buffers_raise_before_the_call():
    c = distmesh.FakeCollective(0, 1)
    seq = c.sequence
    ro = np.ones(4, np.float32)
    ro.flags.writeable = False
    with pytest.raises(TypeError, match="read-only"):
        c.all_reduce(ro, "sum")
    with pytest.raises(TypeError, match="read-only"):
        c.all_reduce(b"abcd", "sum")
    with pytest.raises(ValueError, match="not contiguous"):
        c.all_reduce(np.ones((3, 3))[:, 0], "sum")
    if torch is not None:
        with pytest.raises(ValueError, match="not contiguous"):
            c.all_reduce(torch.ones(3, 3).t(), "sum")
    with pytest.raises(ValueError, match="needs"):
        c.all_gather(np.zeros(5, np.float32), np.zeros(4, np.float32))
    with pytest.raises(TypeError, match="holds"):
        c.all_gather(np.zeros(4, np.float64), np.zeros(4, np.float32))
    with pytest.raises(TypeError, match="cannot reduce"):
        c.all_reduce(np.zeros(3, np.int16), "sum")
    with pytest.raises(TypeError, match="expected a buffer"):
        c.all_reduce([1, 2], "sum")
    with pytest.raises(ValueError, match="unsupported reduce op"):
        c.all_reduce(np.zeros(3, np.float32), "band")
    with pytest.raises(ValueError):
        c.all_reduce(np.zeros(3, np.float32), 9)
    assert c.sequence == seq                    # nothing reached the library's collectives
    x = np.ones(2, np.int16)
    c.broadcast(x, 0)                           # moving any dtype is fine: raw bytes
    c.close()


@pytest.mark.skipif(distmesh.nccl_built, reason="an NCCL build: test_nccl_standin.py covers CUDA memory")
def test_cuda_memory_needs_an_nccl_build():
    """A build without NCCL refuses CUDA memory (a DLPack exporter of device type 2) with a
    TypeError saying how to build one, before anything is sent, releasing the export;
    connect_nccl raises Unsupported saying the same."""
    host = np.ones(4, np.float32)           # never read: the exporter calls it device memory
    x = AnnouncingExporter(host.ctypes.data, host.nbytes, np.float32)
    c = distmesh.FakeCollective(0, 1)
    seq = c.sequence
    with pytest.raises(TypeError, match="DISTMESH_NCCL=1 pip install"):
        c.all_reduce(x, "sum")
    assert (x.exports, x.deleted, x.streams) == (1, 1, [None]) and c.sequence == seq
    assert (c.cuda_stream, c.device) == (None, ("cpu", 0))
    with pytest.raises(distmesh.Unsupported, match="DISTMESH_NCCL=1 pip install") as e:
        distmesh.connect_nccl(0, 1)
    assert e.value.status_name == "DM_ERR_UNSUPPORTED" and not distmesh.nccl_built
    c.close()


@needs_torch
def test_reduce_ops_by_every_name():
    c = distmesh.FakeCollective(0, 3)
    for op in (distmesh.ReduceOp.SUM, "sum", torch.distributed.ReduceOp.SUM, 0):
        x = np.array([2.0])
        c.all_reduce(x, op)
        assert x[0] == 6.0
    for op in (torch.distributed.ReduceOp.PRODUCT, "prod", distmesh.ReduceOp.PROD):
        x = np.array([2.0])
        c.all_reduce(x, op)
        assert x[0] == 8.0
    x = np.array([7], np.int32)
    c.all_reduce(x, torch.distributed.ReduceOp.AVG)     # MEAN: (7 * 3) / 3
    assert x[0] == 7
    c.close()


def test_errors_are_typed():
    names = ["InvalidArgument", "OutOfMemory", "Unsupported", "InternalError", "Timeout", "PeerLost", "Mismatch",
             "NetworkError", "ProtocolError", "NotFound", "Refused", "EnvError", "CudaError", "NcclError",
             "Aborted", "FileSystemError", "Busy"]
    for n in names:
        assert issubclass(getattr(distmesh, n), distmesh.Error)
    assert issubclass(distmesh.Error, RuntimeError) and issubclass(distmesh.InvalidArgument, ValueError)
    c = distmesh.FakeCollective(0, 1)
    c.abort("stop")
    with pytest.raises(distmesh.Aborted) as e:
        c.barrier()
    assert "rank 0 aborted: stop" in e.value.message and e.value.status_name == "DM_ERR_ABORTED"
    c.close()


_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))


def _c_status_list():
    """distmesh.h's DM_STATUS_LIST as (name, value, text), read from the header's source."""
    with open(os.path.join(_ROOT, "distmesh.h")) as f:
        src = f.read()
    block = src[src.index("#define DM_STATUS_LIST(X)"):]
    block = block[:block.index("\n\n")]
    return [(n, int(v), t) for n, v, t in re.findall(r'X\((\w+),\s*(-?\d+),\s*"([^"]*)"\)', block)]


def test_every_c_status_has_its_class():
    """Each failure status of distmesh.h's DM_STATUS_LIST has its class (made by the extension
    from the list): in distmesh and its __all__, in _C.STATUSES, in _C.pyi with the same bases,
    raised with .status, .status_name and .message, its docstring the C text."""
    statuses = _c_status_list()
    assert len(statuses) >= 18 and statuses[0] == ("OK", 0, "success")
    assert [(n, v, t) for v, n, t, _ in distmesh._C.STATUSES] == [("DM_" + n, v, t) for n, v, t in statuses]
    classes = {}
    for v, name, text, cls in distmesh._C.STATUSES:
        if v == 0:
            assert cls is None
            continue
        assert issubclass(cls, distmesh.Error) and getattr(distmesh, cls.__name__) is cls
        assert cls.__name__ in distmesh.__all__ and cls.__module__ == "distmesh"
        assert cls.__doc__.lower().startswith(text.lower()) and name in cls.__doc__
        e = distmesh._C._error(v, "what went wrong")
        assert type(e) is cls and (e.status, e.status_name, e.message) == (v, name, "what went wrong")
        assert isinstance(e, ValueError) == (name == "DM_ERR_INVALID_ARG")
        classes[cls.__name__] = "Error, ValueError" if issubclass(cls, ValueError) else "Error"
    assert len(classes) == len(statuses) - 1
    with open(os.path.join(_ROOT, "python", "distmesh", "_C.pyi")) as f:
        stub = dict(re.findall(r"^class (\w+)\((Error(?:, ValueError)?)\)", f.read(), re.M))
    assert stub == classes
    e = distmesh._C._error(-1000, "odd")        # a status the list lacks: the base class
    assert type(e) is distmesh.Error and e.status_name == "DM_UNKNOWN_STATUS"


def _public_without_docstring(module):
    """module's public functions and classes, and their classes' public methods and properties
    (those defined in distmesh), that have no docstring."""
    import inspect
    kinds = (staticmethod, classmethod, property, type(str.join), type(int.real), type(object.__dict__["__doc__"]),
             type(vars(type(gc.callbacks)).get("append")))
    missing = []
    for name in module.__all__:
        obj = getattr(module, name)
        if not (inspect.isclass(obj) or callable(obj)):
            continue                                    # constants (IN_PLACE, BACKEND, nccl_built)
        if not (obj.__doc__ or "").strip():
            missing.append("%s.%s" % (module.__name__, name))
        if not inspect.isclass(obj):
            continue
        for cls in obj.__mro__:
            if not cls.__module__.startswith("distmesh"):
                continue
            for k, v in vars(cls).items():
                if k.startswith("_") or not (inspect.isfunction(v) or isinstance(v, kinds)):
                    continue
                doc = v.__func__.__doc__ if isinstance(v, (staticmethod, classmethod)) else v.__doc__
                if not (doc or "").strip():
                    missing.append("%s.%s.%s" % (module.__name__, cls.__name__, k))
    return sorted(set(missing))


def test_every_public_name_has_a_docstring():
    """Every public function and class of distmesh and distmesh.torch (when torch imports), and
    every public method and property of their classes (the extension's too), has a docstring."""
    assert _public_without_docstring(distmesh) == []
    if torch is not None:
        import distmesh.torch as dmtorch
        assert _public_without_docstring(dmtorch) == []


def test_close_closes_dependents_first():
    gc.collect()                                # earlier tests' garbage closes now, not midway
    c = distmesh.FakeCollective(0, 1)
    before = distmesh._C._open_handles()
    m = distmesh.Mesh(c, {"dp": 1, "tp": 1})
    g = m.group("tp")
    assert g.world_size == 1 and not g.closed
    r = c.barrier(async_op=True)
    c.close()                                   # the mesh and its group first, the request waited
    assert g.closed and c.closed and r.is_completed()
    with pytest.raises(ValueError, match="closed"):
        g.barrier()
    assert distmesh._C._open_handles() == before - 1


def test_strategy_messages_are_the_seed_s():
    s = distmesh.DistributedStrategy(mp_replicate_size=3, mp_shard_size=3)
    with pytest.raises(ValueError, match=r"mp_replicate_size \* mp_shard_size must equal to world_size, got 3 \* 3 != 8"):
        s.resolve(8)
    assert distmesh.DistributedStrategy(mp_replicate_size=2).resolve(8) == distmesh.DistributedStrategy(2, 4, 8, 1)
    with pytest.raises(ValueError, match="not divisible"):
        distmesh.DistributedStrategy(mp_replicate_size=3).resolve(8)
    # world size 1: not distributed (LLaMA-Factory's): sizes 1, rank 0, the data back as is
    di = distmesh.DistributedInterface(world=distmesh.FakeCollective())
    assert [di.get_world_size(d) for d in distmesh.Dim] == [1, 1, 1, 1] and di.get_rank(None) == 0
    with pytest.raises(ValueError, match="dim must be specified"):
        di.get_device_mesh(None)
    x = np.array([3.0, 4.0])
    assert di.all_reduce(x, distmesh.ReduceOp.MEAN, distmesh.Dim.DP) is x and x.tolist() == [3.0, 4.0]
    g = np.array([1, 2])
    assert di.all_gather(g, distmesh.Dim.DP) is g
    di.destroy()


@needs_torch
def test_process_group_of_a_collective_trains_ddp():
    """Collective.process_group is a torch ProcessGroup over the same collective: DDP takes it
    without init_process_group (world 1 here; the process tests train at 2 and 4 ranks)."""
    c = distmesh.init()
    pg = c.process_group
    assert pg.collective is c and pg.size() == 1 and pg.rank() == 0
    model = torch.nn.Linear(4, 2)
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=pg)
    ddp(torch.randn(3, 4)).sum().backward()
    assert model.weight.grad is not None
    c.close()


def test_collective_module_does_not_import_torch_module():
    """collective.py imports nothing of distmesh.torch (which imports it and registers
    Collective.process_group's maker); in a fresh interpreter the property loads distmesh.torch
    the first time and returns its ProcessGroup."""
    import ast
    with open(os.path.join(_ROOT, "python", "distmesh", "collective.py")) as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            assert node.module != "torch" and "torch" not in [a.name for a in node.names], ast.dump(node)
    if torch is None:
        return
    code = ("import sys, distmesh\n"
            "c = distmesh.init()\n"
            "assert 'distmesh.torch' not in sys.modules\n"
            "pg = c.process_group\n"
            "import distmesh.torch\n"
            "assert type(pg) is distmesh.torch.ProcessGroup and pg.collective is c and c.process_group is pg\n"
            "c.close()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_sigint_between_calls_reaches_pythons_handler():
    """The extension's SIGINT handler stays installed between blocking calls (no sigaction per
    call): a SIGINT outside a call still raises KeyboardInterrupt, a handler set with
    signal.signal still gets it, and calls after that still work."""
    import os
    import signal
    import time
    c = distmesh.FakeCollective(0, 2)
    buf = np.ones(4, np.float32)
    c.all_reduce(buf, distmesh.ReduceOp.SUM)                 # the first blocking call installs it
    assert buf.tolist() == [2.0] * 4
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)
    got = []
    old = signal.signal(signal.SIGINT, lambda sig, frame: got.append(sig))
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        assert got == [signal.SIGINT]
        for _ in range(3):
            c.all_reduce(buf, distmesh.ReduceOp.SUM)
        time.sleep(0.15)                            # past the re-check: ours goes back in front
        c.all_reduce(buf, distmesh.ReduceOp.SUM)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        assert got == [signal.SIGINT, signal.SIGINT]
        assert buf.tolist() == [32.0] * 4
    finally:
        signal.signal(signal.SIGINT, old)
    c.close()


def test_typing_marker_and_stubs_installed_and_complete():
    """py.typed and _C.pyi lie beside the built package (setup.py's package_data), and the
    stubs name every public class, function and constant of the extension, and every method
    and attribute of its classes."""
    import ast
    import os
    from distmesh import _C
    d = os.path.dirname(distmesh.__file__)
    assert os.path.exists(os.path.join(d, "py.typed"))
    with open(os.path.join(d, "_C.pyi")) as f:
        tree = ast.parse(f.read())
    stubbed = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            stubbed[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
        elif isinstance(node, ast.FunctionDef):
            stubbed[node.name] = None
        elif isinstance(node, ast.AnnAssign):
            stubbed[node.target.id] = None
    for name in dir(_C):
        if name.startswith("__"):
            continue
        assert name in stubbed, "_C.%s has no stub in _C.pyi" % name
        obj = getattr(_C, name)
        if isinstance(obj, type) and not issubclass(obj, BaseException):
            own = {m for m in vars(obj) if not m.startswith("__")}
            assert own <= stubbed[name], "_C.%s: no stub for %s" % (name, sorted(own - stubbed[name]))
