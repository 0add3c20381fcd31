"""The "distmesh" torch.distributed backend against Gloo in the same processes: every dist.*
call (blocking and async_op=True) gives Gloo's results (integers bitwise, floats within one
ulp per rank), torch's object collectives run on it, and DDP trains 20 steps to Gloo's
parameters. 2 ranks meet through a TCPStore (tcp://, torch 1.13's server), 4 ranks through
a FileStore (distmesh's own store, served by rank 0). DDP with distmesh.torch.compress_hook("int8")
on 2 simulated hosts x 2 ranks (DISTMESH_TEST_HOST_ID) trains as exact DDP does. The inline
path of small calls (worker.py's torch_inline, 2 ranks): values, which path a call takes, issue
order with the ranks in different states, failures."""
import pytest

from conftest import World, free_port

pytest.importorskip("torch")
_runs = {}


def run(world, tmp_path_factory):
    if world not in _runs:
        tmp = tmp_path_factory.mktemp("torch%d" % world)
        init = "tcp://127.0.0.1:%d" % free_port() if world == 2 else "file://%s/store" % tmp
        w = World(world, "torch", [init], limit=150, tmp=tmp)
        try:
            _runs[world] = (w.results(), w.wait())
        finally:
            w.close()
    return _runs[world]


@pytest.fixture(params=[2, 4])
def torch_world(request, tmp_path_factory):
    return request.param, run(request.param, tmp_path_factory)


def test_backend_registered_and_used(torch_world):
    n, (res, codes) = torch_world
    assert codes == [0] * n
    assert {r["backend"] for r in res} == {"distmesh"} and {r["transport"] for r in res} == {"shm"}


def test_every_call_gives_gloo_results(torch_world):
    _, (res, _) = torch_world
    assert [r["bad"] for r in res] == [[]] * len(res), [r["bad"] for r in res]


def test_ddp_20_steps_same_parameters_as_gloo(torch_world):
    _, (res, _) = torch_world
    for r in res:
        assert r["ddp_moved"] > 1e-3                    # training changed the parameters
        assert r["ddp_max_diff"] < 1e-5, r["ddp_max_diff"]


_ddp = {}


def compress_ddp(tmp_path_factory):
    if not _ddp:
        tmp = tmp_path_factory.mktemp("compress_ddp")
        w = World(4, "compress_ddp", ["tcp://127.0.0.1:%d" % free_port(), 2], limit=150, tmp=tmp)
        try:
            _ddp["run"] = (w.results(), w.wait())
        finally:
            w.close()
    return _ddp["run"]


def test_ddp_compress_hook_int8_two_hosts(tmp_path_factory):
    """30 steps of DDP with compress_hook("int8"), 2 simulated hosts x 2 ranks: the buckets go
    through the int8 two-level all-reduce, the loss falls, the replicas stay bitwise equal, and
    the parameters end close to exact DDP's from the same start; one CompressState per bucket,
    with residuals. compress_hook refuses a bad mode and a group that is not distmesh's."""
    res, codes = compress_ddp(tmp_path_factory)
    assert codes == [0] * 4
    for r in res:
        assert r["bad"] == [], r["bad"]
        assert r["algorithm"] == "two_level_int8" and r["exact_algorithm"] != "two_level_int8"
        assert r["losses"][1] < 0.5 * r["losses"][0], r["losses"]          # mean of the first / last 5
        assert abs(r["losses"][1] - r["exact_losses"][1]) < 0.1 * r["exact_losses"][1], (r["losses"], r["exact_losses"])
        assert r["same_params"]
        assert r["moved"] > 0.05
        assert 0 < r["diff_from_exact"] < 0.02 * r["moved"], (r["diff_from_exact"], r["moved"])
        assert len(r["states"]) >= 2 and r["residual_nonzero"] > 0, r["states"]


_inline = {}


def inline_run(tmp_path_factory):
    if not _inline:
        tmp = tmp_path_factory.mktemp("torch_inline")
        w = World(2, "torch_inline", ["tcp://127.0.0.1:%d" % free_port()], limit=120, tmp=tmp)
        try:
            _inline["run"] = (w.results(), w.wait())
        finally:
            w.close()
    return _inline["run"]


def test_inline_small_calls_values_and_order(tmp_path_factory):
    """dist.all_reduce at 4 B .. INLINE_MAX_BYTES + 4 and 70000 floats, blocking and async, with
    futures; large and small calls mixed, rank 0 leaving the large one in flight while rank 1
    waits for it (so their small calls take different paths): the right values, no mismatch."""
    res, codes = inline_run(tmp_path_factory)
    assert codes == [0, 0]
    for r in res:
        assert r["inline_max"] == 64 << 10
        assert r["bad"] == [], r["bad"]


def test_inline_path_taken_only_when_idle_and_small(tmp_path_factory):
    """With rank 1 a second late: a small call on rank 0 returns complete, after rank 1 joined
    (inline, even with async_op=True); a call one element over the limit returns at once,
    not complete (a request), and so does a small call made while it is in flight; a blocking
    call after them returns with both complete (issue order)."""
    res, _ = inline_run(tmp_path_factory)
    r = res[0]
    assert r["small_done"] and r["small_s"] > 0.5, r
    assert not r["big_done"] and r["big_s"] < 0.5, r
    assert not r["behind_done"] and r["behind_s"] < 0.5, r
    assert r["order"] == [True, True], r


def test_inline_failure_raised_at_wait(tmp_path_factory):
    """A timeout (rank 0 alone, deadline 1.5 s) and an abort (from another thread after 0.5 s)
    in an inline call. torch 2.x: the call returns a completed Work; wait() and its future
    raise the failure. torch 1.13 (whose Work made from a Future never raises at wait()): the
    call raises it. Either way a blocking call on the failed group then raises."""
    res, _ = inline_run(tmp_path_factory)
    r = res[0]
    for name, word in (("timeout", "DM_ERR_TIMEOUT"), ("abort", "DM_ERR_ABORTED")):
        f = r[name]
        assert f["at_call"] == (not r["v2"]), f
        assert f["at_call"] or f["done"], f
        assert word in f["wait"], f
        assert f["at_call"] or "blocking" in f, f
    assert r["timeout"]["call_s"] > 1.0 and 0.3 < r["abort"]["call_s"] < 1.4, r
