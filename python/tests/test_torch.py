"""The "distmesh" torch.distributed backend against Gloo in the same processes: every dist.*
call (blocking and async_op=True) gives Gloo's results (integers bitwise, floats within one
ulp per rank), torch's object collectives run on it, and DDP trains 20 steps to Gloo's
parameters. 2 ranks meet through a TCPStore (tcp://, torch 1.13's server), 4 ranks through
a FileStore (distmesh's own store, served by rank 0)."""
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
