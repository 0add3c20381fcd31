"""The seeds' torch 2.x stack over the "distmesh" backend, against Gloo in the same processes
(torch2_worker.py): the calls 2.x adds (coalescing manager, functional collectives), DDP with
and without bf16_compress_hook, init_device_mesh and DistributedInterface.get_device_mesh,
FSDP2 (fully_shard per layer, bf16 params / fp32 reduce, reshard both ways, non-reentrant
checkpointing, HSDP at 4 ranks), tensor parallel (ColwiseParallel / RowwiseParallel on a 2-D
mesh's tp dim), and Distributed Checkpoint saved on 4 ranks, loaded on 2 (resharded) under
distmesh and Gloo. 2 ranks meet through a TCPStore (tcp://), 4 through a FileStore; under
torchrun, DistributedInterface makes its world and get_device_mesh torch's. Skipped
under torch 1.x (tests/python_torch2.mk runs it under torch 2.13)."""
import json
import os
import subprocess
import sys

import pytest

from conftest import HERE, World, free_port

torch = pytest.importorskip("torch")
if int(torch.__version__.split(".")[0]) < 2:
    pytest.skip("torch %s: the 2.x stack (DeviceMesh, FSDP2, DTensor) needs torch 2.x" % torch.__version__,
                allow_module_level=True)
_runs = {}
# seconds a world of the stack may take; make test-fsdp-full (the full-size model) gives more
WORLD_LIMIT_S = float(os.environ.get("DM_TORCH2_WORLD_LIMIT", "140"))


def _init(world, tmp):
    return "tcp://127.0.0.1:%d" % free_port() if world == 2 else "file://%s/store" % tmp


def run(key, tmp_path_factory):
    """key: ("stack", 2), ("stack", 4) or ("load", 2) (after ("stack", 4)'s checkpoint)."""
    if key not in _runs:
        scenario, world = key
        if scenario == "load":
            ckpt = run(("stack", 4), tmp_path_factory)[2]
        else:
            ckpt = str(tmp_path_factory.mktemp("ckpt")) if world == 4 else ""
        tmp = tmp_path_factory.mktemp("%s%d" % key)
        w = World(world, scenario, [_init(world, tmp), ckpt], limit=WORLD_LIMIT_S, tmp=tmp, script="torch2_worker.py")
        try:
            _runs[key] = (w.results(), w.wait(), ckpt)
        finally:
            w.close()
    return _runs[key]


@pytest.fixture(params=[2, 4])
def stack(request, tmp_path_factory):
    return request.param, run(("stack", request.param), tmp_path_factory)


def test_workers_ran(stack):
    n, (res, codes, _) = stack
    assert codes == [0] * n
    assert {r["torch"].split(".")[0] for r in res} == {"2"}


def test_2x_calls_ddp_fsdp2_tp_give_gloo_results(stack):
    _, (res, _, _) = stack
    assert [r["bad"] for r in res] == [[]] * len(res), [r["bad"] for r in res]


def test_meshes_are_distmesh_groups(stack):
    n, (res, _, _) = stack
    for r in res:
        assert r["mesh_backends"] == ["distmesh"] and r["gloo_mesh_backends"] == ["gloo"]
        assert r["fsdp_backends"] == ["distmesh", "gloo"]
        kind, size, names, backend, local_rank_ok = r["iface_mesh"]
        assert kind == "torch.distributed.device_mesh.DeviceMesh"
        assert size == (n // 2 if n >= 4 else n) and names == ["mp_shard"] and backend == "distmesh"
        assert local_rank_ok


def test_fsdp2_trained(stack):
    n, (res, _, _) = stack
    for r in res:
        for mine, gloo in r["fsdp_losses"]:
            assert mine[-1] < mine[0]                       # the loss went down
        assert ("hsdp_losses" in r) == (n >= 4)


def test_checkpoint_saved_on_4_loads_on_2(tmp_path_factory):
    res, codes, _ = run(("load", 2), tmp_path_factory)
    assert codes == [0, 0]
    for r in res:
        assert r["distmesh"] == "distmesh" and r["gloo"] == "gloo"
        assert r["bad"] == [], r["bad"]


def torchrun(scenario, n, *flags):
    """torchrun --nproc-per-node n [flags] torch2_worker.py scenario: (exit code, RESULT dicts, output)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", DISTMESH_TIMEOUT="30", OMP_NUM_THREADS="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n), "--master-addr", "127.0.0.1",
           "--master-port", str(free_port())] + list(flags) + [os.path.join(HERE, "torch2_worker.py"), scenario]
    p = subprocess.run(cmd, cwd=HERE, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=140)
    out = p.stdout.decode(errors="replace")
    res = [json.loads(line[len("RESULT "):]) for line in out.splitlines() if line.startswith("RESULT ")]
    return p.returncode, res, out + p.stderr.decode(errors="replace")[-3000:]


def test_torchrun_interface_meshes_and_fsdp2():
    """torchrun --nproc-per-node 2: DistributedInterface() from the environment initializes
    torch.distributed with "distmesh" (as LLaMA-Factory's does with its backend), and
    get_device_mesh gives DeviceMeshes."""
    rc, res, out = torchrun("torchrun", 2)
    assert rc == 0 and len(res) == 2, out
    for r in res:
        assert r["bad"] == [], r["bad"]
        assert r["meshes"] == ["DeviceMesh", "DeviceMesh", "distmesh", "distmesh"]


def test_torchrun_restart_after_a_killed_rank():
    """torchrun --max-restarts 1, 2 ranks, rank 1 killed (SIGKILL) at step 5 of the first
    attempt: the second attempt meets afresh and trains its 20 steps, replicas equal."""
    rc, res, out = torchrun("restart", 2, "--max-restarts", "1", "--monitor-interval", "0.1")
    assert rc == 0, out
    assert sorted((r["attempt"], r["rank"]) for r in res) == [(1, 0), (1, 1)], out
    assert all(r["steps"] == 20 and r["same_params"] for r in res), res


@pytest.mark.parametrize("world", [2, 3])
def test_p2p_any_order_and_any_source(world, tmp_path):
    """irecv before isend on every rank, batch_isend_irecv with its irecv first, dist.recv(t)
    from any source returning the sender, and the same through the group's Collective (issue
    51: these hung to the deadline, or were refused)."""
    w = World(world, "p2p", ["tcp://127.0.0.1:%d" % free_port(), ""], limit=90, tmp=tmp_path,
              script="torch2_worker.py")
    try:
        res, codes = w.results(), w.wait()
    finally:
        w.close()
    assert codes == [0] * world
    assert [r["bad"] for r in res] == [[]] * world, [r["bad"] for r in res]
    assert res[0]["senders"] == list(range(1, world))
    assert res[0]["irecv_any"] == [world - 1, world - 1, [5.0] * 3]
    for r in res:
        prv = (r["rank"] - 1) % world
        assert r["collective_recv_first"] == [prv, [prv] * 2]
    assert res[0]["collective_any"] == [world - 1, [42, 42]]


def test_suite_defects_fixed(tmp_path):
    """What PyTorch's distributed suite (make test-torch-suite) found, checked without it (issue
    51): init_process_group with explicit rank and world size while the environment has
    WORLD_SIZE but not RANK; all_gather_coalesced in torch's layout (output_tensor_lists[rank][i])
    as Gloo gives it; a barrier timeout (1 s group timeout, one rank absent) raised as torch's
    DistBackendError with torch's wording, still a distmesh.Timeout; Work.wait(timeout) raising
    past its timeout; split_group; destroy_process_group closing the distmesh collectives."""
    w = World(2, "fixes", ["tcp://127.0.0.1:%d" % free_port()], limit=WORLD_LIMIT_S, tmp=tmp_path,
              script="torch2_worker.py")
    try:
        res, codes = w.results(), w.wait()
    finally:
        w.close()
    assert codes == [0, 0]
    for r in res:
        assert r["bad"] == [], r["bad"]
        assert r["init"]
        assert r["coalesced"] == [[[1.0, 1.0], [], [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]],
                                  [[2.0, 2.0], [], [[0.0, 2.0, 4.0], [6.0, 8.0, 10.0]]]]
        assert r["wait_result"] == [2.0] * 8
        assert r["supports_splitting"] is True
        assert r["split"] == [1, 2, r["rank"], [float(r["rank"] + 1)] * 3, [3.0] * 3]
        assert r["closed_after_destroy"] == [True, True]
    r0 = res[0]
    assert r0["timeout_types"] == [True, True] and r0["timeout_text"], r0
    assert 0.9 <= r0["timeout_s"] < 20, r0["timeout_s"]
    elapsed, text_ok, is_dm = r0["wait_timeout"]
    assert text_ok and is_dm and elapsed >= 0.25, r0["wait_timeout"]      # raised: the call had not completed


def seeds_world(scenario, n, tmp_path, env=None, args=None):
    """n ranks of torch2_worker.py's scenario, their RESULT dicts (each "bad" empty)."""
    args = args if args is not None else ["tcp://127.0.0.1:%d" % free_port()]
    w = World(n, scenario, args, env=env, limit=WORLD_LIMIT_S, tmp=tmp_path, script="torch2_worker.py")
    try:
        res = w.results()
        assert w.wait() == [0] * n
    finally:
        w.close()
    for r in res:
        assert r["bad"] == [], r["bad"]
    return res


def test_llamafactory_interface_calls_under_torch(tmp_path):
    """LLaMA-Factory 0.9.5's DistributedInterface, as its code calls it, at 4 ranks (dp 2 x cp
    2): one instance per process, torch.distributed initialized with "distmesh", DeviceMeshes
    and torch groups, world rank and size without a dim, its defaults (MEAN, DP, src 0 a global
    rank), floats, lists and numpy arrays back as the same type, a tensor in place, MEAN of an
    integer tensor raising as LLaMA-Factory's tensor /= n does, destroy()."""
    res = seeds_world("iface", 4, tmp_path)
    assert all("is_distributed=True" in r["str"] for r in res)


@pytest.mark.parametrize("agent_store", [False, True])
def test_collective_groups_are_torch_groups(tmp_path, agent_store):
    """Collective.process_group is recorded in torch.distributed's world maps as new_group's
    groups are (its backend, ranks; before and after a default group exists, the second's
    global ranks gathered), distmesh.torch.set_default_group makes a Collective the default
    group; then init_device_mesh's new groups (meeting through the environment's store),
    DeviceMesh.from_group, Optimus-DL's dp_mesh / tp_mesh and Distributed Checkpoint work on
    it (2 ranks, distmesh.init() through DISTMESH_STORE). agent_store: the store is this
    test's, as torchrun's agent serves it (TORCHELASTIC_USE_AGENT_STORE=True: every rank is a
    client, none may serve a store of its own for the groups made later; Optimus-DL's recipe
    with a distmesh Collective under torchrun failed there)."""
    import distmesh
    (tmp_path / "ckpt").mkdir()
    server = None
    if agent_store:
        server = distmesh._C.Store("tcp://127.0.0.1:0", True, None, 60000)
        env = {"DISTMESH_STORE": "tcp://127.0.0.1:%d" % server.port, "TORCHELASTIC_USE_AGENT_STORE": "True"}
    else:
        env = {"DISTMESH_STORE": "tcp://127.0.0.1:%d" % free_port()}
    try:
        seeds_world("pgworld", 2, tmp_path, env=env, args=["-", str(tmp_path / "ckpt")])
    finally:
        del server


@pytest.mark.parametrize("replace", [False, True])
def test_gloo_program_runs_on_distmesh_by_environment(tmp_path, replace):
    """DISTMESH_REPLACE_GLOO=1 (read by the distmesh-startup.pth the package installs): a
    program that hard-codes "gloo" (init_process_group, new_group, init_device_mesh and its
    backend_override) gets distmesh groups with the same sums, with no change to its code.
    Unset, the hook imports nothing (distmesh stays out of the process) and the program runs
    on Gloo."""
    env = {"DISTMESH_REPLACE_GLOO": "1" if replace else "0"}
    w = World(2, "gloo", ["tcp://127.0.0.1:%d" % free_port()], env=env, limit=WORLD_LIMIT_S, tmp=tmp_path,
              script="gloo_program.py")
    try:
        res = w.results()
        assert w.wait() == [0, 0]
    finally:
        w.close()
    want = "distmesh" if replace else "gloo"
    for r in res:
        assert r["backends"] == [want] * 4, r
        assert r["sums"] == [3.0] * 4, r
        assert (r["distmesh_imported_at_start"], r["distmesh_imported"]) == (replace, replace), r
