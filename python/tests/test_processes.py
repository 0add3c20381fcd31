"""Four processes on this host, over shared memory (auto) and over loopback sockets
(DISTMESH_TRANSPORT=tcp): one world per transport runs every collective case against the C
library's bytes, the bad-buffer refusals, several requests in flight, objects and groups;
each test below checks one part of that run."""
import pytest

from conftest import World

W = 4
_runs = {}


def run_world(transport, ref_file, tmp_path_factory):
    if transport not in _runs:
        tmp = tmp_path_factory.mktemp("cases_" + transport)
        env = {"DISTMESH_STORE": "file://%s" % tmp, "DISTMESH_TRANSPORT": transport}
        w = World(W, "cases", [ref_file(W)], env=env, limit=120, tmp=tmp)
        try:
            res = w.results()
            codes = w.wait()
        finally:
            w.close()
        _runs[transport] = (res, codes)
    return _runs[transport]


@pytest.fixture(params=["auto", "tcp"])
def world(request, ref_file, tmp_path_factory):
    return request.param, run_world(request.param, ref_file, tmp_path_factory)


def test_transport_is_the_one_asked_for(world):
    transport, (res, codes) = world
    assert codes == [0] * W
    assert {r["transport"] for r in res} == {"shm" if transport == "auto" else "tcp"}
    assert {r["backend"] for r in res} == {"tcp"}


def test_every_collective_gives_the_c_library_bytes(world):
    _, (res, _) = world
    assert [r["cases"] for r in res] == [[]] * W, [r["cases"] for r in res]


def test_bad_buffers_raise_before_anything_is_sent(world):
    _, (res, _) = world
    assert res[0]["bad_buffers"] == []
    assert [r["after_bad"] for r in res] == [[W] * 3] * W     # then the world works


def test_objects_and_mpi4py_spellings(world):
    _, (res, _) = world
    for r in res:
        assert r["objects"] == [{"rank": k, "x": [k] * k} for k in range(W)]
        assert r["broadcast_objects"] == ["from 1", {"k": [1, 2]}]
        assert r["bcast"] == {"r": 2}
        assert r["Allreduce"] == [float(sum(range(1, W + 1)))] * 5


def test_requests_in_flight(world):
    _, (res, _) = world
    for r in res:
        assert r["async"] == [True, True, float(W - 1), list(range(10))]


def test_p2p_recv_first_and_from_any_source(world):
    """irecv before isend on every rank completes; recv(buf, None) returns the sender."""
    _, (res, _) = world
    assert [r["p2p"][0] for r in res] == [True] * W
    assert res[0]["p2p"][1] == [[k, 10 * k] for k in range(1, W)]
    assert res[0]["p2p"][2] == [W - 1, 7]
    assert res[0]["p2p"][3] == W - 1


def test_groups_mesh_and_dims(world):
    _, (res, _) = world
    for k, r in enumerate(res):
        assert r["local"] == [W, k]
        assert r["split"] == [W // 2, k // 2]
        tp_sum = 1 if k < 2 else 5
        assert r["mesh"] == [[2, 2], k // 2, k % 2, tp_sum]
        dp_members = [k % 2, k % 2 + 2]
        assert r["interface"][:5] == [k // 2, 2, dp_members, 0.5 if k < 2 else 2.5, k % 2]
        assert r["interface"][5] == "dim must be specified."
        assert r["interface"][6] == [k, 4]
        assert r["open_handles"] == 0
