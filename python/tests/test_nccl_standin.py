"""The NCCL build of distmesh._C through the public Python API, without a GPU (issue 27).

tests/python_nccl_standin.mk builds the extension with -DDISTMESH_NCCL -DDISTMESH_TCP against
CUDA's and NCCL's real headers, linked with tests/stand_in_cuda_nccl.c (a scripted STAND-IN for
libcudart and libnccl: not CUDA, not NCCL) instead of the libraries, and runs this file alone on
that build. The stand-in's symbols are in the extension's .so: the tests allocate its "device
memory" with cudaMalloc through ctypes (host memory the stand-in registers, so
cudaPointerGetAttributes calls it device memory), wrap it in a DLPack exporter of device type 2
(dlpack_util.py: a "CUDA tensor"), script failures (si_fail) and read its counters (si_count,
si_get). NCCL moves data only at world 1 here (each collective copies send into recv), so these
tests say what the Python layer does with CUDA memory, not what NCCL does with it: a GPU
machine runs the real thing (docs/python.md)."""
import ctypes
import os
import signal
import threading
import time

import numpy as np
import pytest

import distmesh
from dlpack_util import KDL_CUDA, KDL_CUDA_MANAGED, KDL_OPENCL, AnnouncingExporter, Exporter

NCCL_INTERNAL_ERROR = 3             # nccl.h ncclInternalError
CUDA_ERROR_NOT_READY = 600          # cuda_runtime_api.h cudaErrorNotReady
CUDA_ERROR_LAUNCH_FAILURE = 719     # cudaErrorLaunchFailure


class SiStats(ctypes.Structure):    # tests/stand_in_cuda_nccl.h si_stats
    _fields_ = [("aborts", ctypes.c_int), ("destroys", ctypes.c_int), ("stale_comm_calls", ctypes.c_int),
                ("use_after_free", ctypes.c_int), ("first_use_after_free", ctypes.c_char * 96),
                ("used_in_progress", ctypes.c_int), ("skipped_by_shared_abort", ctypes.c_int),
                ("hangs", ctypes.c_int), ("first_hang", ctypes.c_char * 96), ("illegal_addresses", ctypes.c_int),
                ("live_comms", ctypes.c_int), ("live_streams", ctypes.c_int), ("live_events", ctypes.c_int),
                ("live_allocs", ctypes.c_int), ("wrong_device_calls", ctypes.c_int),
                ("first_wrong_device_call", ctypes.c_char * 96), ("host_copies_on_busy_stream", ctypes.c_int),
                ("group_depth", ctypes.c_int), ("bad_frees", ctypes.c_int)]


def _stand_in():
    lib = ctypes.CDLL(distmesh._C.__file__)
    if not distmesh.nccl_built or not hasattr(lib, "si_count"):
        pytest.skip("distmesh._C is not the stand-in NCCL build (tests/python_nccl_standin.mk)",
                    allow_module_level=True)
    lib.si_get.restype = ctypes.POINTER(SiStats)
    lib.si_count.argtypes = [ctypes.c_char_p]
    lib.si_fail.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_bool]
    lib.si_set_busy_us.argtypes = [ctypes.c_int]
    lib.si_hold_streams.argtypes = [ctypes.c_bool]
    lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    lib.cudaFree.argtypes = [ctypes.c_void_p]
    lib.cudaStreamQuery.argtypes = [ctypes.c_void_p]
    lib.cudaSetDevice.argtypes = [ctypes.c_int]
    return lib


SI = _stand_in()


def count(fn):
    return SI.si_count(fn.encode())


class _DevMemory:
    """Stand-in device memory (host memory the stand-in registers) read and freed by the test."""

    def read(self):
        out = np.empty(self.shape, self.dtype)
        ctypes.memmove(out.ctypes.data, self.ptr, out.nbytes)
        return out.ravel()

    def free(self):
        assert self.deleted == self.exports, "a DLPack capsule was not released"
        SI.cudaFree(ctypes.c_void_p(self.ptr))


class DevQuiet(_DevMemory, Exporter):
    pass


class DevAnnounced(_DevMemory, AnnouncingExporter):
    pass


def dev(data, announce=True, device=(KDL_CUDA, 0), shape=None, strides=None):
    """A "CUDA tensor" holding data: stand-in device memory exported through DLPack."""
    host = np.ascontiguousarray(data)
    p = ctypes.c_void_p()
    assert SI.cudaSetDevice(0) == 0     # the device of every collective here (a create leaves its own current)
    assert SI.cudaMalloc(ctypes.byref(p), max(1, host.nbytes)) == 0
    ctypes.memmove(p.value, host.ctypes.data, host.nbytes)
    cls = DevAnnounced if announce else DevQuiet
    return cls(p.value, host.nbytes, host.dtype, shape=shape, strides=strides, device=device)


@pytest.fixture
def made():
    """dev(...) for a test; every one freed after it, each export released."""
    devs = []

    def make(*a, **k):
        d = dev(*a, **k)
        devs.append(d)
        return d
    yield make
    for d in devs:
        d.free()


def nothing_left():
    """What tests/test_nccl_standin.c checks after each test: nothing live, nothing misused."""
    s = SI.si_get().contents
    assert (s.use_after_free, s.hangs, s.used_in_progress, s.illegal_addresses, s.bad_frees) == (0, 0, 0, 0, 0), \
        (s.first_use_after_free, s.first_hang)
    assert (s.live_comms, s.live_streams, s.live_events, s.live_allocs) == (0, 0, 0, 0)
    assert (s.stale_comm_calls, s.group_depth, SI.si_pending_jobs()) == (0, 0, 0)


@pytest.fixture
def world1(tmp_path, made):
    """An NCCL collective of one rank; NCCL's unique id through a file store."""
    SI.si_reset()
    c = distmesh.connect_nccl(0, 1, store="file://%s/store" % tmp_path, timeout=20)
    yield c
    c.close()


@pytest.fixture(autouse=True)
def _clean():
    yield
    nothing_left()


def test_world1_collectives_on_cuda_memory(world1, made):
    """Blocking calls take the exporter's device pointers, go through NCCL, return with the data
    ready; the exporter was asked for the collective's stream."""
    c = world1
    assert (c.backend, c.world_size, c.device) == ("nccl", 1, ("cuda", 0))
    assert isinstance(c.cuda_stream, int) and c.cuda_stream > 2
    src = made(np.arange(8, dtype=np.float32))
    dst = made(np.zeros(8, np.float32))
    SI.si_set_busy_us(2000)                 # each operation keeps the stream busy 2 ms
    c.all_reduce(dst, "sum", send=src)
    assert count("ncclAllReduce") == 1
    assert SI.cudaStreamQuery(ctypes.c_void_p(c.cuda_stream)) == 0, "all_reduce returned before its stream was done"
    assert dst.read().tolist() == list(range(8))
    assert src.streams == [c.cuda_stream] and dst.streams == [c.cuda_stream]
    c.all_reduce(src, distmesh.ReduceOp.MAX)        # in place
    assert src.read().tolist() == list(range(8))
    out = made(np.zeros(8, np.int32))
    inp = made(np.array([5, -1, 7, 2, 0, 9, 3, 4], np.int32))
    c.all_gather(out, inp)
    assert count("ncclAllGather") == 1 and out.read().tolist() == [5, -1, 7, 2, 0, 9, 3, 4]
    red = made(np.zeros(8, np.int32))
    c.reduce_scatter(red, inp, "sum")
    assert count("ncclReduceScatter") == 1 and red.read().tolist() == [5, -1, 7, 2, 0, 9, 3, 4]
    b = made(np.full(3, 7, np.uint8))
    c.broadcast(b, 0)
    assert count("ncclBroadcast") == 1 and b.read().tolist() == [7, 7, 7]
    assert SI.cudaStreamQuery(ctypes.c_void_p(c.cuda_stream)) == 0
    assert c.sequence == 5


def test_async_requests_complete_with_the_data(world1, made):
    """An async call returns a Request at once; is_completed() follows the CUDA event after the
    work (False while the stream is busy), wait() returns with the data."""
    c = world1
    src = made(np.arange(4, dtype=np.float64))
    dst = made(np.zeros(4, np.float64))
    SI.si_set_busy_us(300000)               # 300 ms: still running when first asked
    r = c.all_reduce(dst, "sum", send=src, async_op=True)
    assert count("ncclAllReduce") == 1 and count("cudaEventRecord") >= 1
    assert r.is_completed() is False and r.status is None
    r.wait()
    assert r.is_completed() is True and r.status == 0
    assert dst.read().tolist() == [0.0, 1.0, 2.0, 3.0]
    out = made(np.zeros(4, np.float64))
    r = c.all_gather(out, src, async_op=True)
    r2 = c.broadcast(dst, 0, async_op=True)
    while not r2.is_completed():            # requests complete in issue order
        pass
    assert r.is_completed() and out.read().tolist() == [0.0, 1.0, 2.0, 3.0]
    r3 = c.all_reduce(dst, "sum", async_op=True)
    c.close()                               # waits for r3; its buffers are released with it
    assert r3.status == 0


def test_host_buffers_on_nccl(world1, made):
    """What the C side says about host memory: all_reduce refuses it (InvalidArgument, before
    anything is queued: the collective still works); all_gather stages it."""
    c = world1
    x = np.ones(4, np.float32)
    with pytest.raises(distmesh.InvalidArgument, match="nccl: all_reduce") as e:
        c.all_reduce(x, "sum")
    assert isinstance(e.value, ValueError) and e.value.status_name == "DM_ERR_INVALID_ARG"
    assert count("ncclAllReduce") == 0
    out = np.zeros(8, np.float32)
    c.all_gather(out, np.full(8, 3, np.float32))
    assert out.tolist() == [3.0] * 8 and count("ncclAllGather") == 1 and count("cudaMemcpyAsync") >= 2
    d = made(np.ones(4, np.float32))
    c.all_reduce(d, "sum")                  # still usable
    assert count("ncclAllReduce") == 1


def test_compress_is_unsupported_on_nccl(world1, made):
    """all_reduce(compress=...) and state=: the NCCL backend has no compression (Unsupported,
    distmesh.h >>functions compression), nothing queued."""
    c = world1
    d = made(np.ones(300, np.float32))
    for kw in ({"compress": "int8"}, {"compress": "none"}, {"state": distmesh.CompressState(300)}):
        with pytest.raises(distmesh.Unsupported, match="nccl backend has no compression"):
            c.all_reduce(d, "sum", **kw)
    assert count("ncclAllReduce") == 0


def test_failures_raise_their_error_class(world1, made):
    """An NCCL error while queueing: NcclError carrying the stand-in's text; the communicator
    is aborted once and later calls raise Aborted quoting the first failure."""
    c = world1
    d = made(np.ones(4, np.float32))
    SI.si_fail(b"ncclAllReduce", 1, NCCL_INTERNAL_ERROR, False)
    with pytest.raises(distmesh.NcclError, match="scripted for ncclAllReduce") as e:
        c.all_reduce(d, "sum")
    assert e.value.status_name == "DM_ERR_NCCL" and "all_reduce" in e.value.message
    assert SI.si_get().contents.aborts == 1
    with pytest.raises(distmesh.Aborted, match="scripted for ncclAllReduce"):
        c.broadcast(d, 0)
    assert SI.si_get().contents.aborts == 1


def test_stream_failure_reaches_wait(world1, made):
    """A CUDA failure seen while waiting for the stream: CudaError from the blocking call (it
    synchronizes), and from wait() of a request."""
    c = world1
    d = made(np.ones(4, np.float32))
    SI.si_set_busy_us(1000)
    SI.si_fail(b"cudaStreamQuery", 1, CUDA_ERROR_LAUNCH_FAILURE, False)
    with pytest.raises(distmesh.CudaError, match="cuda") as e:
        c.all_reduce(d, "sum")
    assert e.value.status_name == "DM_ERR_CUDA" and e.value.message


def test_event_failure_reaches_request_wait(world1, made):
    c = world1
    d = made(np.ones(4, np.float32))
    SI.si_set_busy_us(1000)
    r = c.all_reduce(d, "sum", async_op=True)
    SI.si_fail(b"cudaEventQuery", 1, CUDA_ERROR_LAUNCH_FAILURE, False)
    with pytest.raises(distmesh.CudaError):
        r.wait()
    assert r.status == -13          # DM_ERR_CUDA
    with pytest.raises(distmesh.Aborted):
        c.all_reduce(d, "sum")


def test_bad_inputs_raise_before_anything_is_sent(world1, made):
    c = world1
    seq = c.sequence
    f = made(np.ones(8, np.float32))
    with pytest.raises(ValueError, match="not contiguous"):
        c.all_reduce(made(np.ones(8, np.float32), shape=(4, 2), strides=(1, 4)), "sum")
    with pytest.raises(TypeError, match="cannot reduce"):
        c.all_reduce(made(np.ones(4, np.int16)), "sum")
    with pytest.raises(ValueError, match="needs"):
        c.all_gather(made(np.ones(4, np.float32)), f)
    with pytest.raises(TypeError, match="holds"):
        c.all_reduce(f, "sum", send=made(np.ones(8, np.int32)))
    with pytest.raises(TypeError, match="device type 4"):
        c.all_reduce(made(np.ones(4, np.float32), device=(KDL_OPENCL, 0)), "sum")
    with pytest.raises(ValueError, match="unsupported reduce op"):
        c.all_reduce(f, "band")
    assert c.sequence == seq and count("ncclAllReduce") == count("ncclAllGather") == 0
    c.all_reduce(f, "sum")
    assert c.sequence == seq + 1


def test_cuda_memory_on_a_host_backend_is_refused_before_export(made):
    """In an NCCL build a fake collective still takes host memory only: TypeError naming the
    backend, before the exporter is even asked (it announced its device)."""
    SI.si_reset()
    d = made(np.ones(4, np.float32))
    with distmesh.FakeCollective(0, 1) as c:
        assert c.cuda_stream is None and c.device == ("cpu", 0)
        with pytest.raises(TypeError, match="fake backend takes host memory only"):
            c.all_reduce(d, "sum")
        assert d.exports == 0
        quiet = made(np.ones(4, np.float32), announce=False)      # known only once exported
        with pytest.raises(TypeError, match="CUDA memory"):
            c.all_gather(quiet, quiet)
        assert quiet.exports == 1


def test_unannounced_and_managed_memory(world1, made):
    """An exporter without __dlpack_device__ is exported without a stream (DLPack: the legacy
    default stream, which the NCCL stream waits for); managed memory (device type 13) is
    taken like device memory."""
    c = world1
    q = made(np.arange(4, dtype=np.float32), announce=False)
    m = made(np.zeros(4, np.float32), device=(KDL_CUDA_MANAGED, 0))
    c.all_reduce(m, "sum", send=q)
    assert q.streams == [None] and m.streams == [c.cuda_stream]
    assert m.read().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_tcp_backend_stages_cuda_memory(tmp_path, made):
    """connect()'s TCP backend in an NCCL build takes CUDA memory too (staged through pinned
    host memory after the legacy default stream: the exporter gets stream 1)."""
    SI.si_reset()
    with distmesh.connect(0, 1, store="file://%s/tcp" % tmp_path, timeout=20) as c:
        assert c.backend == "tcp" and c.cuda_stream is None
        src = made(np.arange(6, dtype=np.int64))
        dst = made(np.zeros(6, np.int64))
        c.all_reduce(dst, "sum", send=src)
        assert dst.read().tolist() == list(range(6))
        assert src.streams == [1] and count("cudaMemcpyAsync") >= 2 and count("ncclAllReduce") == 0


def test_create_failures_and_arguments(tmp_path):
    SI.si_reset()
    SI.si_fail(b"ncclCommInitRankConfig", 1, NCCL_INTERNAL_ERROR, False)
    with pytest.raises(distmesh.NcclError, match="init"):
        distmesh.connect_nccl(0, 1, store="file://%s/a" % tmp_path, timeout=20)
    with pytest.raises(distmesh.InvalidArgument, match="device 7 of 4"):
        distmesh.connect_nccl(0, 1, cuda_device=7, store="file://%s/b" % tmp_path, timeout=20)
    with pytest.raises(TypeError, match="rank is required"):
        distmesh.connect_nccl(world_size=1)
    with distmesh.connect_nccl(0, 1, cuda_device=2, store="file://%s/c" % tmp_path, timeout=20) as c:
        assert c.device == ("cuda", 2) and str(c.default_device) == "cuda:2"


def test_a_stream_that_never_ends_times_out_or_ctrl_c_aborts(tmp_path, made):
    """The wait for the stream after a blocking call has the deadline (Timeout) and, with the
    GIL released, Ctrl-C ends it: KeyboardInterrupt within a second, the collective aborted."""
    SI.si_reset()
    d = made(np.ones(4, np.float32))
    SI.si_hold_streams(True)            # NCCL's kernel waits on a dead peer: the stream never ends
    try:
        with distmesh.connect_nccl(0, 1, store="file://%s/t" % tmp_path, timeout=0.3) as c:
            t0 = time.monotonic()
            with pytest.raises(distmesh.Timeout):
                c.all_reduce(d, "sum")
            assert time.monotonic() - t0 < 3
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return                      # Ctrl-C is armed only over Python's own handler
        with distmesh.connect_nccl(0, 1, store="file://%s/i" % tmp_path, timeout=60) as c:
            timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
            t0 = time.monotonic()
            timer.start()
            with pytest.raises(KeyboardInterrupt) as e:
                c.all_reduce(d, "sum")
            assert time.monotonic() - t0 < 1.3
            assert isinstance(e.value.__context__, distmesh.Aborted)
            with pytest.raises(distmesh.Aborted, match="KeyboardInterrupt"):
                c.all_reduce(d, "sum")
    finally:
        SI.si_hold_streams(False)


def test_ctrl_c_in_request_wait_raises_keyboard_interrupt(tmp_path, made):
    """Ctrl-C while wait() blocks on a request whose stream never ends: KeyboardInterrupt within
    a second, with the Aborted failure as its context. The buffer's exporter (dlpack_util) frees
    its capsule with a destructor written in Python, which would swallow a pending
    KeyboardInterrupt: the request raises before it releases its buffers."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("Ctrl-C is armed only over Python's own SIGINT handler")
    SI.si_reset()
    d = made(np.ones(4, np.float32))
    SI.si_hold_streams(True)
    try:
        with distmesh.connect_nccl(0, 1, store="file://%s/w" % tmp_path, timeout=60) as c:
            r = c.all_reduce(d, "sum", async_op=True)
            timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
            t0 = time.monotonic()
            timer.start()
            with pytest.raises(KeyboardInterrupt) as e:
                r.wait()
            assert time.monotonic() - t0 < 1.3
            assert isinstance(e.value.__context__, distmesh.Aborted), repr(e.value.__context__)
            assert r.is_completed() and r.status is not None and r.status < 0
            with pytest.raises(distmesh.Aborted):
                r.wait()                # the failure stays the request's
    finally:
        SI.si_hold_streams(False)
