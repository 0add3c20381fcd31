"""The threaded world (ranks on threads of this process): every collective case against the C
library's bytes at 3 and 4 ranks, failures reaching every rank, the dims on real groups."""
import threading
import time

import numpy as np
import pytest

import distmesh
import cases


@pytest.mark.parametrize("world", [3, 4])
def test_every_collective_gives_the_c_library_bytes(world, ref_file):
    cs = cases.load(ref_file(world))
    failures = distmesh.thread_world(world, cases.run, cs, timeout=30)
    assert failures == [[]] * world, failures


def test_a_raising_rank_aborts_the_others():
    def body(c):
        if c.rank == 2:
            raise RuntimeError("rank 2 gives up")
        c.all_reduce(np.zeros(4, np.float32), "sum")     # waits for rank 2: aborted, not timed out
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 2 gives up"):
        distmesh.thread_world(3, body, timeout=30)
    assert time.monotonic() - t0 < 5


def test_abort_from_another_thread_names_the_rank():
    def body(c):
        if c.rank == 1:
            threading.Timer(0.2, c.abort, args=("watchdog",)).start()
        try:
            c.all_reduce(np.zeros(4, np.float32), "sum") if c.rank != 2 else time.sleep(0.6)
            c.barrier()
            return None
        except distmesh.Aborted as e:
            return e.message
    msgs = distmesh.thread_world(3, body, timeout=30)
    assert all(m and "rank 1" in m and "watchdog" in m for m in msgs), msgs


def test_dims_on_real_groups():
    def body(c):
        c._set_tp(2)
        tp = c.tp_world
        x = np.array([c.rank], np.int64)
        tp.all_reduce(x, "sum")
        di = distmesh.DistributedInterface({"dp_size": 2, "cp_size": 2}, world=c)
        y = np.array([float(c.rank)])
        y = di.all_reduce(y, distmesh.ReduceOp.SUM, distmesh.Dim.DP)      # float32, as LLaMA-Factory's
        z = np.array([c.rank * 10], np.int32)
        z = di.broadcast(z, 1 if c.rank < 2 else 3, distmesh.Dim.CP)     # src: a global rank
        got = (c.dp_rank, c.tp_rank, c.tp_world_size, int(x[0]), di.get_rank(distmesh.Dim.CP),
               di.get_world_size(distmesh.Dim.MP_SHARD), float(y[0]), int(z[0]))
        di.destroy()
        return got
    res = distmesh.thread_world(4, body, timeout=30)
    # TP innermost: {0,1} {2,3}; data mesh (dp, cp): dp groups {0,2} {1,3}, cp groups {0,1} {2,3}
    assert res == [(0, 0, 2, 1, 0, 4, 2.0, 10), (0, 1, 2, 1, 1, 4, 4.0, 10),
                   (1, 0, 2, 5, 0, 4, 2.0, 30), (1, 1, 2, 5, 1, 4, 4.0, 30)], res


def test_async_requests_complete_in_order():
    def body(c):
        a = np.full(100000, float(c.rank + 1), np.float32)
        b = np.zeros(3, np.int32)
        r1 = c.all_reduce(a, "sum", async_op=True)
        r2 = c.all_reduce(b, "max", async_op=True)
        r2.wait()
        done = r1.is_completed()                    # complete before r2: issue order
        r1.wait()
        return done, float(a[0]), r1.status
    assert distmesh.thread_world(3, body, timeout=30) == [(True, 6.0, 0)] * 3
