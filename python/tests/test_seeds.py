"""The seeds' projects as they ship (issue 51): distmesh.DistributedInterface behaves as
LLaMA-Factory 0.9.5's v1 interface for every call that project makes, and distmesh's
Collective / FakeCollective carry Optimus-DL 0.2.6's names. Neither project is needed here:
each test states the project's behaviour (its code quoted in the docstring) and checks
distmesh's. The torch 2.x half (torch DeviceMeshes and groups, torch.distributed's world maps)
is in test_torch2.py ("seeds")."""
import numpy as np
import pytest

import distmesh
from distmesh import Dim


@pytest.fixture
def no_launcher(monkeypatch):
    """A plain run: none of the launcher's variables (LLaMA-Factory: not distributed)."""
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    yield
    inst = distmesh.DistributedInterface._instance
    if inst is not None:
        inst.destroy()


def test_interface_is_one_per_process(no_launcher):
    """LLaMA-Factory's DistributedInterface.__new__ hands out one instance and __init__ returns
    at once when it is initialized: its ~30 `DistributedInterface()` call sites all get the
    one the trainer made with its config (dist_config)."""
    cfg = {"timeout": 60}
    a = distmesh.DistributedInterface(cfg)
    b = distmesh.DistributedInterface()
    assert a is b and b.dist_config is cfg
    a.destroy()
    c = distmesh.DistributedInterface()
    assert c is not a and c.dist_config is None
    c.destroy()


def test_not_distributed_answers_as_llamafactory(no_launcher):
    """Not distributed (RANK unset): rank 0 of 1 whatever the dim, no meshes or groups (None),
    the collectives give their data back as is; get_device_mesh(None) raises; current_device
    and device_count exist."""
    di = distmesh.DistributedInterface()
    assert (di.get_rank(), di.get_world_size(), di.get_rank(Dim.CP), di.get_world_size(Dim.DP)) == (0, 1, 0, 1)
    assert di.model_device_mesh is None and di.data_device_mesh is None
    assert di.get_device_mesh(Dim.DP) is None and di.get_group(Dim.DP) is None and di.get_group() is None
    with pytest.raises(ValueError, match="dim must be specified"):
        di.get_device_mesh()
    x = [1.0, 2.0]
    assert di.all_reduce(x) is x and di.all_gather(x) is x and di.broadcast(x) is x
    assert str(di.current_device) == "cpu" and isinstance(di.device_count, int)
    assert di.get_local_rank() == 0 and di.get_local_world_size() == 1
    di.sync()
    di.barrier()
    assert "is_distributed=False" in str(di)


def test_world_interfaces_are_their_own():
    """world= (distmesh's addition, for several ranks in one process) makes an interface of its
    own, not the process's one."""
    def body(c):
        a = distmesh.DistributedInterface(world=c)
        b = distmesh.DistributedInterface(world=c)
        try:
            return a is not b and distmesh.DistributedInterface._instance is not a
        finally:
            a.destroy()
            b.destroy()
    assert distmesh.thread_world(2, body, timeout=30) == [True, True]


def test_defaults_and_tensorlikes_on_4_ranks():
    """LLaMA-Factory's calls on 4 ranks (dp 2 x cp 2; dp groups {0,2} {1,3}, cp {0,1} {2,3}):
    get_rank() / get_world_size() without a dim are the world's; all_reduce defaults to MEAN
    over DP, all_gather and broadcast to DP, broadcast's src to 0, a global rank
    (torch.distributed.broadcast's); a Python float comes back a float, a list a list (a
    one-element result a float: helper.operate_tensorlike's result.item()), a numpy array a
    float32 array (float32 in place); get_group(None) is None (the default group)."""
    def body(c):
        di = distmesh.DistributedInterface({"dp_size": 2, "cp_size": 2}, world=c)
        r = c.rank
        peer = r + 2 if r < 2 else r - 2
        try:
            mean = di.all_reduce(float(r))                          # MEAN over dp: {0,2} {1,3}
            total = di.all_reduce([float(r), 1.0], op="sum", dim=Dim.CP)
            one = di.all_reduce([float(r)], op=distmesh.ReduceOp.MAX)
            arr64 = np.array([r, r], np.float64)
            got64 = di.all_reduce(arr64, op="sum")
            arr32 = np.array([r], np.float32)
            got32 = di.all_reduce(arr32, op="sum")
            gathered = di.all_gather(float(r))
            world_gather = di.all_gather(np.array([r], np.float32), dim=None)
            # src is a global rank: 0 for dp group {0,2} (the default), 1 for {1,3}
            b = di.broadcast(float(r * 10)) if r % 2 == 0 else di.broadcast(float(r * 10), 1)
            b2 = di.broadcast(np.array([r * 10.0], np.float32), src=3 if r >= 2 else 0, dim=Dim.CP)
            try:
                di.broadcast(1.0, src=3, dim=Dim.DP)                # 3 is in {1,3} only
                bad_src = None
            except ValueError as e:
                bad_src = str(e)
            return dict(rank=di.get_rank(), size=di.get_world_size(), mean=mean, total=total, one=one,
                        got64=[type(got64).__name__, str(got64.dtype), got64.tolist(), arr64.tolist()],
                        same32=got32 is arr32 and arr32.tolist() == [float(r + peer)],
                        gathered=gathered, world_gather=world_gather.tolist(), b=b,
                        b2=b2.tolist() if r >= 2 else None, bad_src=bad_src if r in (0, 2) else "",
                        group_none=di.get_group(None), ranks=[di.get_rank(d) for d in Dim])
        finally:
            di.destroy()
    res = distmesh.thread_world(4, body, timeout=30)
    for r, out in enumerate(res):
        peer = r + 2 if r < 2 else r - 2                            # the other member of r's dp group
        assert out["rank"] == r and out["size"] == 4, out
        assert out["mean"] == (r + peer) / 2 and type(out["mean"]) is float, out
        cp_peer = r + 1 if r % 2 == 0 else r - 1
        assert out["total"] == [float(r + cp_peer), 2.0], out
        assert out["one"] == float(max(r, peer)) and type(out["one"]) is float, out
        assert out["got64"] == ["ndarray", "float32", [float(r + peer)] * 2, [float(r)] * 2], out
        assert out["same32"], out
        assert out["gathered"] == [float(min(r, peer)), float(max(r, peer))], out
        assert out["world_gather"] == [[0.0], [1.0], [2.0], [3.0]], out
        assert out["b"] == float((r % 2) * 10), out                 # dp group {0,2}: 0; {1,3}: 10
        if r >= 2:
            assert out["b2"] == [30.0], out
        if r in (0, 2):
            assert out["bad_src"] and "not a rank" in out["bad_src"], out
        assert out["group_none"] is None, out
        assert out["ranks"] == [0, r, r // 2, r % 2], out


# ---- Optimus-DL 0.2.6's names ------------------------------------------------------------------
def test_optimus_fake_collective_signature():
    """Optimus-DL: FakeCollective(rank, world_size, device_type="cpu"), default_device from the
    device type (cuda -> cuda:0, mps -> mps, else cpu); Collective.ReduceOp (its
    collective.all_reduce(t, op=Collective.ReduceOp.MAX)) with torch's PRODUCT spelling too."""
    c = distmesh.FakeCollective(rank=0, world_size=1, device_type="cuda")
    assert str(c.default_device) == "cuda:0"
    assert str(distmesh.FakeCollective(0, 1, "mps").default_device) == "mps"
    assert str(distmesh.FakeCollective(0, 1).default_device) == "cpu"
    with pytest.raises(TypeError, match="device_type"):
        distmesh.FakeCollective(0, 2, 2)
    assert distmesh.Collective.ReduceOp is distmesh.ReduceOp and distmesh.FakeCollective.ReduceOp.MAX == 2
    assert distmesh.ReduceOp.PRODUCT == distmesh.ReduceOp.PROD
    x = np.array([3.0])
    c.all_reduce(x, op=distmesh.Collective.ReduceOp.MAX)
    assert x.tolist() == [3.0]


def test_optimus_keyword_names_on_all_gather():
    """Optimus-DL's all_gather(output_tensor=, input_tensor=) and
    all_gather_to_list(output_tensors=, input_tensor=), beside distmesh's output= / input=."""
    def body(c):
        out = np.zeros(2, np.int32)
        c.all_gather(output_tensor=out, input_tensor=np.array([c.rank + 1], np.int32))
        outs = [np.zeros(1, np.int32), np.zeros(1, np.int32)]
        c.all_gather_to_list(output_tensors=outs, input_tensor=np.array([c.rank * 5], np.int32))
        out2 = np.zeros(2, np.int32)
        c.all_gather(out2, input=np.array([7], np.int32))
        try:
            c.all_gather(out2, output=out2, input=out2[:1])
            both = None
        except TypeError as e:
            both = str(e)
        return out.tolist(), [o.tolist() for o in outs], out2.tolist(), both
    for got in distmesh.thread_world(2, body, timeout=30):
        assert got[:3] == ([1, 2], [[0], [5]], [7, 7]), got
        assert got[3], got


OPTIMUS_STANDIN = '''
import abc
class Collective(abc.ABC):
    pass
class MeshCollective(Collective):
    pass
'''


@pytest.mark.parametrize("order", ["distmesh first", "optimus first"])
def test_collective_is_an_optimus_mesh_collective(tmp_path, order):
    """Optimus-DL's DDP / FSDP2 / tensor-parallel transforms assert isinstance(collective,
    MeshCollective): distmesh's Collective registers as its virtual subclass when
    optimus_dl.modules.distributed.mesh is imported, before or after distmesh (a stand-in
    module of that name here, an ABC as Optimus-DL's)."""
    import subprocess
    import sys
    pkg = tmp_path / "optimus_dl" / "modules" / "distributed"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "optimus_dl", tmp_path / "optimus_dl" / "modules", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "mesh.py").write_text(OPTIMUS_STANDIN)
    first, second = "import distmesh", "from optimus_dl.modules.distributed.mesh import MeshCollective, Collective"
    if order == "optimus first":
        first, second = second, first
    code = "\n".join([first, second,
                      "from optimus_dl.modules.distributed.mesh import MeshCollective, Collective",
                      "c = distmesh.FakeCollective()",
                      "assert isinstance(c, MeshCollective) and isinstance(c, Collective)",
                      "assert issubclass(distmesh.Collective, MeshCollective)",
                      "print('ok')"])
    import os
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=60)
    assert p.returncode == 0 and p.stdout.decode().strip().endswith("ok"), p.stdout.decode()


# ---- DISTMESH_REPLACE_GLOO: a Gloo program on distmesh, unchanged ------------------------------
def test_replace_gloo_names_and_startup_line():
    """The backend names the hook hands torch ("gloo" -> "distmesh", in device maps too; others
    untouched), and the startup line beside the built package: the shipped text, importing
    nothing with the variable unset or "0", installing the hook with it set (the torch half
    runs in test_torch2.py, test_gloo_program_runs_on_distmesh_by_environment)."""
    import os
    import subprocess
    import sys
    from distmesh._startup import PTH_LINE, PTH_NAME, replace_gloo
    assert replace_gloo("gloo") == "distmesh" and replace_gloo("GLOO") == "distmesh"
    assert replace_gloo("cpu:gloo,cuda:nccl") == "cpu:distmesh,cuda:nccl"
    assert replace_gloo("nccl") == "nccl" and replace_gloo("undefined") == "undefined" and replace_gloo(None) is None
    lib = os.path.dirname(os.path.dirname(os.path.abspath(distmesh.__file__)))
    with open(os.path.join(lib, PTH_NAME)) as f:
        assert f.read() == PTH_LINE
    code = ("import sys, site; site.addsitedir(%r); "
            "print('distmesh' in sys.modules, any(getattr(f, 'name', None) == 'torch.distributed.distributed_c10d' "
            "for f in sys.meta_path))" % lib)
    for value, want in (("", "False False"), ("0", "False False"), ("1", "True True")):
        env = dict(os.environ, DISTMESH_REPLACE_GLOO=value)
        env.pop("PYTHONPATH", None)
        p = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=60)
        assert p.stdout.decode().strip() == want, (value, p.stdout.decode())
