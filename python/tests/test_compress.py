"""The compressed all-reduce from Python (distmesh.h >>functions compression): all_reduce's
compress= and state= arguments and distmesh.CompressState. Four processes (worker.py's
"compress" scenario) over the TCP backend's transports: 2 simulated hosts x 2 ranks
(DISTMESH_TEST_HOST_ID h0 / h1, ranks interleaved), where the stage between the hosts is
compressed, and 1 host x 4, where the call is exact. The DDP hook is in test_torch.py."""
import sys

import numpy as np
import pytest

import distmesh
from conftest import World

W = 4
_runs = {}


def run(hosts, tmp_path_factory, sealed=False):
    key = (hosts, sealed)
    if key not in _runs:
        tmp = tmp_path_factory.mktemp("compress%d" % hosts)
        env = {"DISTMESH_STORE": "file://%s" % tmp}
        if sealed:
            env.update(DISTMESH_TOKEN="py-sealed-token", DISTMESH_ENCRYPT="1")
        w = World(W, "compress", [hosts], env=env, limit=120, tmp=tmp)
        try:
            _runs[key] = (w.results(), w.wait())
        finally:
            w.close()
    return _runs[key]


@pytest.fixture(params=[2, 1], ids=["2hosts", "1host"])
def world(request, tmp_path_factory):
    return request.param, run(request.param, tmp_path_factory)


@pytest.mark.skipif(not distmesh.openssl_built, reason="built without OpenSSL's libcrypto")
def test_encrypted_links_between_hosts(tmp_path_factory):
    """DISTMESH_ENCRYPT=1 with a token: the links between the 2 simulated hosts are sealed (a
    package without libcrypto would refuse to create: Unsupported), and every result is as
    without (the same scenario's checks)."""
    res, codes = run(2, tmp_path_factory, sealed=True)
    assert codes == [0] * W
    assert [r["bad"] for r in res] == [[]] * W, [r["bad"] for r in res]
    assert {r["transport"] for r in res} == {"shm+tcp"}
    plain, _ = run(2, tmp_path_factory)
    assert [r["modes"] for r in res] == [r["modes"] for r in plain]    # the same bytes, sealed or not


def test_workers_ran_without_bad_results(world):
    hosts, (res, codes) = world
    assert codes == [0] * W
    assert [r["bad"] for r in res] == [[]] * W, [r["bad"] for r in res]
    assert {r["transport"] for r in res} == ({"shm+tcp"} if hosts == 2 else {"shm"})
    assert [r["after_refusals"] for r in res] == [[float(W)] * 3] * W


def test_every_rank_gets_the_same_bytes_within_the_bound(world):
    """int8 and bf16, SUM and MEAN: the same bytes on every rank, each element within the
    documented bound of the exact sum (int8: H x scale / 2)."""
    hosts, (res, _) = world
    for r in res:
        assert sorted(r["modes"]) == ["bf16 mean", "bf16 sum", "int8 mean", "int8 sum"]
        for name, m in r["modes"].items():
            assert m["same_bytes"], (r["rank"], name)
            assert m["worst"] <= 1.0, (r["rank"], name, m["worst"])
    # the results themselves agree between ranks too (same bytes, so the same errors)
    assert len({(r["modes"]["int8 sum"]["worst"], r["modes"]["bf16 mean"]["worst"]) for r in res}) == 1


def test_two_hosts_compress_one_host_is_exact(world):
    hosts, (res, _) = world
    for r in res:
        for name, m in r["modes"].items():
            mode, opn = name.split()
            if hosts == 2:
                assert m["algorithm"] == "two_level_" + mode, (name, m["algorithm"])
                assert not m["equals_plain"]                # compression changed the bits
            else:
                assert m["algorithm"] == r["plain_algorithm"][opn] and "int8" not in m["algorithm"]
                assert "bf16" not in m["algorithm"]
                assert m["equals_plain"], name                 # exact: the plain call's bytes
    if hosts == 2:      # int8 drops something: the bound is not met trivially
        assert all(r["modes"]["int8 sum"]["errors"] > 0 for r in res)


def test_send_and_async_take_the_mode(world):
    _, (res, _) = world
    assert [r["send_async_same"] for r in res] == [[True, True]] * W


def test_error_feedback_converges(world):
    """With a state: the residual is nonzero after a compressed call; over 40 calls of the same
    input the running mean comes within a fifth of a single call's worst error (against the
    bound); reset() zeros it. On one host nothing is dropped."""
    hosts, (res, _) = world
    for r in res:
        assert r["state_fresh_zero"] and r["reset_zero"] and r["state_same_bytes"]
        assert r["first_with_state_equals_without"]
        if hosts == 2:
            assert r["residual_nonzero"] > 0
            assert r["single_worst"] > 0.05, r["single_worst"]         # a single call does err
            assert r["state_mean_worst"] < r["single_worst"] / 5, (r["state_mean_worst"], r["single_worst"])
        else:
            assert r["residual_nonzero"] == 0


def test_async_call_holds_its_state(world):
    _, (res, _) = world
    for r in res:
        assert r["async_state_refs"] == [1, 0]
        assert r["async_state_result"]


def test_mismatched_modes_fail_every_rank(world):
    _, (res, _) = world
    assert [r["mismatch"] for r in res] == ["Mismatch"] * W


# ---- no processes ----------------------------------------------------------------------------
def test_compress_state_object():
    s = distmesh.CompressState(300)
    assert s.count == 300 and repr(s) == "distmesh.CompressState(300)"
    r = np.frombuffer(s.residual, np.float32)
    assert r.shape == (300,) and not r.any()
    mv = s.residual
    assert (mv.format, mv.itemsize, mv.shape, mv.readonly) == ("f", 4, (300,), False)
    r[:] = np.arange(300)                       # writable: a restore from a checkpoint
    assert np.frombuffer(s.residual, np.float32)[299] == 299.0
    refs = sys.getrefcount(s)
    view = s.residual                           # a view keeps the state alive
    assert sys.getrefcount(s) == refs + 1
    del view
    s.reset()
    assert not r.any()
    assert distmesh.CompressState(0).count == 0
    with pytest.raises(ValueError):
        distmesh.CompressState(-1)
    with pytest.raises(TypeError):
        distmesh.CompressState("8")
    with pytest.raises(TypeError):
        distmesh.CompressState(True)
    assert distmesh._C.COMPRESS_BLOCK == 256


def test_compress_state_torch_view():
    torch = pytest.importorskip("torch")
    s = distmesh.CompressState(8)
    t = torch.frombuffer(s.residual, dtype=torch.float32)
    t += 2.5
    assert np.frombuffer(s.residual, np.float32).tolist() == [2.5] * 8
    s.reset()
    assert t.tolist() == [0.0] * 8


def test_arguments_refused_on_a_fake_collective():
    c = distmesh.FakeCollective(0, 1)
    x = np.ones(8, np.float32)
    with pytest.raises(ValueError, match='"none", "bf16" or "int8"'):
        c.all_reduce(x, "sum", compress="fp8")
    with pytest.raises(TypeError, match="compress"):
        c.all_reduce(x, "sum", compress=b"int8")
    with pytest.raises(TypeError, match="CompressState"):
        c.all_reduce(x, "sum", state=np.zeros(8, np.float32))
    c.all_reduce(x, "sum", compress="int8", state=distmesh.CompressState(8))    # world 1: exact
    assert x.tolist() == [1.0] * 8
    c.close()
