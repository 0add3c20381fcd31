/* distmesh_nccl.h -- the NCCL backend of distmesh. MIT license at end of file.

   Do not include this file directly: define DISTMESH_NCCL (as a -D flag, in every TU) and include
   distmesh.h, which includes this header last. Compile with CUDA's include directory and link
   -lcudart -lnccl. Store rendezvous needs DISTMESH_TCP too (libuv); without it pass the unique id.

   WHAT IT IS
   dm_nccl_create makes a communicator on this process's GPU (device = local rank % device count
   unless the desc names one, set with cudaSetDevice before init). The ncclUniqueId travels
   through the distmesh store (rank 0 publishes "<prefix>nccl_unique_id", the others wait for it)
   or is handed in by the caller (desc.unique_id, e.g. after MPI_Bcast). Communicators are
   non-blocking (ncclConfig_t.blocking = 0): init, split and every wait poll
   ncclCommGetAsyncError against the deadline, and on expiry the communicator is aborted
   (ncclCommAbort) and DM_ERR_TIMEOUT returned -- nothing hangs.

   STREAM SEMANTICS
   Collectives enqueue on the object's CUDA stream (owned, or desc.stream) and return; the data
   is ready after dm_synchronize(c), which waits for the stream with the deadline. Barrier and
   the host-staged calls below synchronize before returning.

   BUFFERS
   all_reduce, reduce_scatter and the calls below take device (or managed) memory only: a host
   pointer is DM_ERR_INVALID_ARG with a message (checked with cudaPointerGetAttributes).
   all_gather, all_gather_to_list and broadcast also accept host buffers, staged through a
   temporary device buffer and synchronized (waiting for the stream with the deadline first),
   so the core's object collectives, dm_local and main_process_first work on NCCL (slowly: they
   are for small control data). MEAN is ncclAvg (NCCL >= 2.10); bfloat16 needs NCCL >= 2.10;
   older NCCL gives DM_ERR_UNSUPPORTED. MAX/MIN follow NCCL's NaN behaviour, not the core's.

   ROOTED, ALL-TO-ALL, POINT-TO-POINT
   reduce is ncclReduce (MEAN as ncclAvg, as for all_reduce; recv is passed to NCCL at the root
   only). gather, scatter and all_to_all(_v) are one ncclGroupStart / ncclSend + ncclRecv per
   peer / ncclGroupEnd, the own block copied device to device on the stream; in-place
   all_to_all(_v) first copies recv's outgoing blocks to stream-ordered scratch. send and recv
   are ncclSend / ncclRecv. All take device (or managed) memory only and are queued on the
   stream like the collectives (ready after dm_synchronize). Data moves as bytes, so every
   dtype works on every NCCL. What NCCL cannot check, distmesh does not either:
   - Counts and dtypes of a pair are not compared (only a rank's count to itself, in
     all_to_all_v): a pair that disagrees hangs until the deadline aborts the communicator, or
     delivers a short or corrupted message -- never DM_ERR_MISMATCH.
   - Tags are not sent: NCCL matches the messages between two ranks in issue order, whatever
     their tags.
   - ncclSend / ncclRecv block the GPU until the peer's matching call runs: two ranks that both
     dm_send first and dm_recv second (on their streams) deadlock on the GPU, and the next wait
     ends in DM_ERR_TIMEOUT. Order a pair's calls so one side receives first.

   NON-BLOCKING CALLS
   The _async twins run on the stream too (vtable start/finish): start queues the operation as
   the blocking call does and records a CUDA event (cudaEventDisableTiming) after it; dm_test
   asks the event, dm_wait polls it. Both also poll ncclCommGetAsyncError and the request's
   deadline -- the timeout in force at the _async call, counted from that call -- and on a
   failure or the deadline abort the communicator (DM_ERR_TIMEOUT, like dm_synchronize);
   requests whose event had completed before the abort still report DM_OK, later ones the
   failure. Host-staged all_gather / broadcast / all_gather_to_list complete before their _async
   call returns. Object collectives and split are left to the core (start answers
   DM_ERR_UNSUPPORTED for them).

   One create per store prefix: a second dm_nccl_create with the same store and prefix would read
   the first one's unique id; use dm_split for sub-groups (ncclCommSplit, no store needed).
*/
#ifndef DISTMESH_H
#error "include distmesh.h with DISTMESH_NCCL defined instead"
#endif

#ifndef DISTMESH_NCCL_H
#define DISTMESH_NCCL_H

#ifdef __cplusplus
extern "C" {
#endif

enum { DM_NCCL_UNIQUE_ID_BYTES = 128 };   /* sizeof(ncclUniqueId) */

/* >>nccl desc  Zero means default for every field. */
typedef struct dm_nccl_desc {
    int rank;                   /* with world_size 0: from dm_env_detect; else required */
    int world_size;             /* 0 -> rank, world and local rank from dm_env_detect */
    int local_rank;             /* with world_size given: this process's rank on its node */
    int cuda_device;            /* 0 -> local_rank % device count; d + 1 -> CUDA device d */
    struct dm_store* store;     /* borrowed: where the unique id travels; 0 -> store_url */
    const char* store_url;      /* 0 -> DISTMESH_STORE, else tcp://MASTER_ADDR:MASTER_PORT (rank 0
                                   hosts it); needs DISTMESH_TCP */
    const char* prefix;         /* 0 -> "distmesh_nccl/" */
    const void* unique_id;      /* DM_NCCL_UNIQUE_ID_BYTES from ncclGetUniqueId on rank 0, shared
                                   by the caller; 0 -> through the store */
    struct CUstream_st* stream; /* 0 -> an owned stream ordered after the legacy default stream;
                                   else borrowed */
    int timeout_ms;             /* 0 -> DISTMESH_TIMEOUT or DM_DEFAULT_TIMEOUT_MS; < 0 -> forever */
    dm_logger logger;           /* 0 -> silent */
    dm_allocator allocator;     /* 0 -> malloc/free (CUDA and NCCL allocate on their own) */
} dm_nccl_desc;

/* Collective call over all world_size ranks, one GPU each. Fails with *out == NULL. */
DM_API dm_status dm_nccl_create(const dm_nccl_desc* desc, dm_collective** out);
/* The object's stream (owned or borrowed). */
DM_API struct CUstream_st* dm_nccl_stream(dm_collective* c);
/* Seed 001's device helpers (dm_device_count is declared in distmesh.h). */
DM_API dm_status dm_cuda_set_device(int device);
DM_API dm_status dm_cuda_current_device(int* out);
DM_API dm_status dm_cuda_synchronize(void);         /* the whole device */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DISTMESH_NCCL_H */

#if defined(DISTMESH_IMPLEMENTATION) && !defined(DISTMESH_NCCL_IMPL_INCLUDED)
#define DISTMESH_NCCL_IMPL_INCLUDED
#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>

#define _DM_NCCL_HAS_AVG (NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0))
#define _DM_NCCL_HAS_BF16 (NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0))

typedef struct _dm_nccl_token _dm_nccl_token;
typedef struct _dm_nccl {
    dm_collective base;
    ncclComm_t comm;
    cudaStream_t stream;
    bool owns_stream;
    bool pools;                 /* stream-ordered allocation (cudaMallocAsync) works on the device */
    int device;
    void* scratch;              /* 16 device bytes for barrier */
    dm_status broken;           /* DM_OK, or why the communicator was aborted */
    _dm_nccl_token* live;       /* started requests not finished yet (>>nccl requests) */
    _dm_nccl_token* spare;      /* finished ones, kept with their events for the next start */
    int spare_count;
} _dm_nccl;

/* One started request: the event recorded on the stream right after its operation. */
struct _dm_nccl_token {
    _dm_nccl_token *prev, *next;  /* in live (doubly linked) or spare (next only) */
    cudaEvent_t event;
    int64_t deadline;           /* the collective's timeout, counted from start */
    int timeout_ms;             /* that timeout, for the message */
    uint64_t seq;               /* dm_sequence when started, for messages */
    const char* what;
    bool settled;               /* decided by an abort before finish saw it; status holds it */
    dm_status status;
};
enum { _DM_NCCL_SPARE_MAX = 64 };

/* >>nccl errors  Foreign codes are translated here only. */
static dm_status _dm_status_from_nccl(ncclResult_t r) {
    switch (r) {
        case ncclSuccess: return DM_OK;
        case ncclInvalidArgument: case ncclInvalidUsage: return DM_ERR_INVALID_ARG;
        case ncclSystemError: case ncclRemoteError: return DM_ERR_NETWORK;
        case ncclUnhandledCudaError: return DM_ERR_CUDA;
        default: return DM_ERR_NCCL;
    }
}
static dm_status _dm_nccl_fail_at(_dm_nccl* n, ncclResult_t r, const char* what, uint64_t seq) {
    const char* last = n->comm ? ncclGetLastError(n->comm) : ncclGetLastError(NULL);
    return _DM_FAIL(&n->base, _dm_status_from_nccl(r), "nccl: %s #%llu failed (%s: %s)", what,
                    (unsigned long long)seq, ncclGetErrorString(r), last ? last : "");
}
static dm_status _dm_nccl_fail(_dm_nccl* n, ncclResult_t r, const char* what) {
    return _dm_nccl_fail_at(n, r, what, n->base.seq);
}
static dm_status _dm_nccl_cuda_fail(dm_collective* c, cudaError_t e, const char* what) {
    return _DM_FAIL(c, DM_ERR_CUDA, "nccl: %s (cuda: %s)", what, cudaGetErrorString(e));
}

/* Aborts the communicator for st (a failure or a deadline). Started requests are decided
   first: those whose event has completed finished before the failure and stay DM_OK (NCCL's
   kernels end early only once ncclCommAbort runs), the others complete with st. */
static void _dm_nccl_abort(_dm_nccl* n, dm_status st) {
    _dm_nccl_token* t;
    for (t = n->live; t; t = t->next)
        if (!t->settled) {
            t->settled = true;
            t->status = cudaEventQuery(t->event) == cudaSuccess ? DM_OK : st;
        }
    if (n->comm) ncclCommAbort(n->comm);
    n->comm = NULL;
    n->broken = st;
}

/* Polls until the communicator's pending work is accepted (and, with stream_too, the stream has
   drained), an asynchronous error shows up, or the deadline passes (then abort). */
static dm_status _dm_nccl_wait(_dm_nccl* n, const char* what, bool stream_too) {
    int64_t deadline = _dm_deadline(n->base.timeout_ms);
    for (;;) {
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(n->comm, &async);
        if (async != ncclSuccess && async != ncclInProgress) {
            dm_status st = _dm_nccl_fail(n, async, what);
            _dm_nccl_abort(n, st);
            return st;
        }
        if (async == ncclSuccess) {
            cudaError_t e = stream_too ? cudaStreamQuery(n->stream) : cudaSuccess;
            if (e == cudaSuccess) return DM_OK;
            if (e != cudaErrorNotReady) return _dm_nccl_cuda_fail(&n->base, e, what);
        }
        if (_dm_now_ms() >= deadline) {
            _dm_nccl_abort(n, DM_ERR_TIMEOUT);
            return _DM_FAIL(&n->base, DM_ERR_TIMEOUT, "nccl: %s #%llu timed out after %d ms; the "
                            "communicator was aborted", what, (unsigned long long)n->base.seq,
                            n->base.timeout_ms);
        }
        sched_yield();
    }
}
/* After enqueueing: a non-blocking communicator may answer ncclInProgress. */
static dm_status _dm_nccl_enqueued(_dm_nccl* n, ncclResult_t r, const char* what) {
    if (r == ncclSuccess) return DM_OK;
    if (r == ncclInProgress) return _dm_nccl_wait(n, what, false);
    return _dm_nccl_fail(n, r, what);
}
static dm_status _dm_nccl_usable(_dm_nccl* n, const char* what) {
    if (n->broken == DM_OK && n->comm) return DM_OK;
    return _DM_FAIL(&n->base, DM_ERR_ABORTED, "nccl: %s #%llu: the communicator was aborted by an "
                    "earlier failure (%s)", what, (unsigned long long)n->base.seq, dm_status_name(n->broken));
}

/* >>nccl device  Slots may run on a thread whose current device is another one (the core's
   progress thread, a caller driving several GPUs): calls that allocate, copy or record events
   do so on the communicator's device and give the caller's back afterwards. */
static int _dm_nccl_enter(_dm_nccl* n) {
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess) { cudaGetLastError(); prev = -1; }
    if (prev != n->device) cudaSetDevice(n->device);
    return prev;
}
static void _dm_nccl_leave(_dm_nccl* n, int prev) {
    if (prev >= 0 && prev != n->device) cudaSetDevice(prev);
}

/* >>nccl types */
static bool _dm_nccl_dtype(dm_dtype t, ncclDataType_t* out) {
    switch (t) {
        case DM_INT8: *out = ncclInt8; return true;
        case DM_UINT8: *out = ncclUint8; return true;
        case DM_INT32: *out = ncclInt32; return true;
        case DM_UINT32: *out = ncclUint32; return true;
        case DM_INT64: *out = ncclInt64; return true;
        case DM_UINT64: *out = ncclUint64; return true;
        case DM_FLOAT16: *out = ncclFloat16; return true;
#if _DM_NCCL_HAS_BF16
        case DM_BFLOAT16: *out = ncclBfloat16; return true;
#endif
        case DM_FLOAT32: *out = ncclFloat32; return true;
        case DM_FLOAT64: *out = ncclFloat64; return true;
        default: return false;
    }
}
static bool _dm_nccl_op(dm_reduce_op op, ncclRedOp_t* out) {
    switch (op) {
        case DM_SUM: *out = ncclSum; return true;
        case DM_PROD: *out = ncclProd; return true;
        case DM_MAX: *out = ncclMax; return true;
        case DM_MIN: *out = ncclMin; return true;
#if _DM_NCCL_HAS_AVG
        case DM_MEAN: *out = ncclAvg; return true;
#endif
        default: return false;
    }
}
static dm_status _dm_nccl_types(_dm_nccl* n, const char* what, dm_dtype t, ncclDataType_t* nt,
                                int has_op, dm_reduce_op op, ncclRedOp_t* no) {
    if (!_dm_nccl_dtype(t, nt))
        return _DM_FAIL(&n->base, DM_ERR_UNSUPPORTED, "nccl: %s: dtype %s needs a newer NCCL than %d",
                        what, dm_dtype_name(t), NCCL_VERSION_CODE);
    if (has_op && !_dm_nccl_op(op, no))
        return _DM_FAIL(&n->base, DM_ERR_UNSUPPORTED, "nccl: %s: op %s needs a newer NCCL than %d",
                        what, dm_reduce_op_name(op), NCCL_VERSION_CODE);
    return DM_OK;
}

/* Memory NCCL can read: device or managed; NULL passes (it only comes with count 0). */
static bool _dm_nccl_is_device(const void* p) { return !p || _dm_cuda_is_device(p); }
static dm_status _dm_nccl_need_device(_dm_nccl* n, const char* what, const void* a, const void* b) {
    if (_dm_nccl_is_device(a) && _dm_nccl_is_device(b)) return DM_OK;
    return _DM_FAIL(&n->base, DM_ERR_INVALID_ARG,
                    "nccl: %s: buffer %p is host memory; NCCL needs device (or managed) memory",
                    what, _dm_nccl_is_device(a) ? b : a);
}

/* >>nccl collectives */
static dm_status _dm_nccl_all_reduce(dm_collective* c, const void* send, void* recv, size_t count,
                                     dm_dtype dtype, dm_reduce_op op) {
    _dm_nccl* n = (_dm_nccl*)c;
    ncclDataType_t nt;
    ncclRedOp_t no;
    _DM_TRY(_dm_nccl_usable(n, "all_reduce"));
    _DM_TRY(_dm_nccl_types(n, "all_reduce", dtype, &nt, 1, op, &no));
    _DM_TRY(_dm_nccl_need_device(n, "all_reduce", send, recv));
    return _dm_nccl_enqueued(n, ncclAllReduce(send, recv, count, nt, no, n->comm, n->stream), "all_reduce");
}
static dm_status _dm_nccl_reduce_scatter(dm_collective* c, const void* send, void* recv, size_t count,
                                         dm_dtype dtype, dm_reduce_op op) {
    _dm_nccl* n = (_dm_nccl*)c;
    ncclDataType_t nt;
    ncclRedOp_t no;
    _DM_TRY(_dm_nccl_usable(n, "reduce_scatter"));
    _DM_TRY(_dm_nccl_types(n, "reduce_scatter", dtype, &nt, 1, op, &no));
    _DM_TRY(_dm_nccl_need_device(n, "reduce_scatter", send, recv));
    return _dm_nccl_enqueued(n, ncclReduceScatter(send, recv, count, nt, no, n->comm, n->stream),
                             "reduce_scatter");
}

/* Host buffers for the data-movement collectives: copied into device memory, run, copied back,
   synchronized. The copy back waits for the stream first (with the deadline): a copy into
   pageable host memory would otherwise block until the collective is done, with no deadline. */
typedef struct _dm_nccl_stage { void* dev; size_t bytes; } _dm_nccl_stage;
static dm_status _dm_nccl_stage_alloc(_dm_nccl* n, _dm_nccl_stage* s, size_t bytes, const char* what) {
    cudaError_t e;
    s->bytes = bytes;
    s->dev = NULL;
    e = cudaMalloc(&s->dev, bytes ? bytes : 1);
    return e == cudaSuccess ? DM_OK : _dm_nccl_cuda_fail(&n->base, e, what);
}

static dm_status _dm_nccl_all_gather(dm_collective* c, const void* send, void* recv, size_t count,
                                     dm_dtype dtype) {
    _dm_nccl* n = (_dm_nccl*)c;
    ncclDataType_t nt;
    size_t block = count * dm_dtype_size(dtype), total = block * (size_t)c->size;
    _dm_nccl_stage st_buf;
    dm_status st;
    int prev;
    _DM_TRY(_dm_nccl_usable(n, "all_gather"));
    _DM_TRY(_dm_nccl_types(n, "all_gather", dtype, &nt, 0, DM_SUM, NULL));
    if (_dm_nccl_is_device(send) && _dm_nccl_is_device(recv))
        return _dm_nccl_enqueued(n, ncclAllGather(send, recv, count, nt, n->comm, n->stream), "all_gather");
    /* Host buffers: one device block of world x count, our block copied to its slot first. */
    prev = _dm_nccl_enter(n);
    st = _dm_nccl_stage_alloc(n, &st_buf, total, "all_gather (host staging)");
    if (st == DM_OK) {
        unsigned char* dev = (unsigned char*)st_buf.dev;
        cudaMemcpyAsync(dev + (size_t)c->rank * block, send, block, cudaMemcpyDefault, n->stream);
        st = _dm_nccl_enqueued(n, ncclAllGather(dev + (size_t)c->rank * block, dev, count, nt, n->comm, n->stream),
                               "all_gather");
        if (st == DM_OK) st = _dm_nccl_wait(n, "all_gather", true);
        if (st == DM_OK) cudaMemcpyAsync(recv, dev, total, cudaMemcpyDefault, n->stream);
        if (st == DM_OK) st = _dm_nccl_wait(n, "all_gather", true);
        cudaFree(st_buf.dev);
    }
    _dm_nccl_leave(n, prev);
    return st;
}

static dm_status _dm_nccl_broadcast(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int root) {
    _dm_nccl* n = (_dm_nccl*)c;
    ncclDataType_t nt;
    size_t bytes = count * dm_dtype_size(dtype);
    _dm_nccl_stage st_buf;
    dm_status st;
    int prev;
    _DM_TRY(_dm_nccl_usable(n, "broadcast"));
    _DM_TRY(_dm_nccl_types(n, "broadcast", dtype, &nt, 0, DM_SUM, NULL));
    if (_dm_nccl_is_device(buf))
        return _dm_nccl_enqueued(n, ncclBroadcast(buf, buf, count, nt, root, n->comm, n->stream), "broadcast");
    prev = _dm_nccl_enter(n);
    st = _dm_nccl_stage_alloc(n, &st_buf, bytes, "broadcast (host staging)");
    if (st != DM_OK) {
        _dm_nccl_leave(n, prev);
        return st;
    }
    if (c->rank == root) cudaMemcpyAsync(st_buf.dev, buf, bytes, cudaMemcpyDefault, n->stream);
    st = _dm_nccl_enqueued(n, ncclBroadcast(st_buf.dev, st_buf.dev, count, nt, root, n->comm, n->stream),
                           "broadcast");
    if (st == DM_OK) st = _dm_nccl_wait(n, "broadcast", true);
    if (st == DM_OK) cudaMemcpyAsync(buf, st_buf.dev, bytes, cudaMemcpyDefault, n->stream);
    if (st == DM_OK) st = _dm_nccl_wait(n, "broadcast", true);
    cudaFree(st_buf.dev);
    _dm_nccl_leave(n, prev);
    return st;
}

static dm_status _dm_nccl_barrier(dm_collective* c) {
    _dm_nccl* n = (_dm_nccl*)c;
    _DM_TRY(_dm_nccl_usable(n, "barrier"));
    _DM_TRY(_dm_nccl_enqueued(n, ncclAllReduce(n->scratch, n->scratch, 1, ncclFloat32, ncclSum, n->comm,
                                               n->stream), "barrier"));
    return _dm_nccl_wait(n, "barrier", true);
}
static dm_status _dm_nccl_synchronize(dm_collective* c) {
    _dm_nccl* n = (_dm_nccl*)c;
    _DM_TRY(_dm_nccl_usable(n, "synchronize"));
    return _dm_nccl_wait(n, "synchronize", true);
}
static void* _dm_nccl_native(dm_collective* c) { return ((_dm_nccl*)c)->comm; }

/* >>nccl temporaries  Device scratch of all_gather_to_list and in-place all_to_all(_v):
   stream-ordered (cudaMallocAsync, cudaFreeAsync after the work that uses it), so nothing
   waits. A device without memory pools gets cudaMalloc, and the call then waits for its stream
   (with the deadline) before cudaFree. */
static dm_status _dm_nccl_tmp_alloc(_dm_nccl* n, size_t bytes, void** p, const char* what) {
    cudaError_t e;
    *p = NULL;
#if CUDART_VERSION >= 11020
    if (n->pools) e = cudaMallocAsync(p, bytes ? bytes : 1, n->stream);
    else
#endif
        e = cudaMalloc(p, bytes ? bytes : 1);
    if (e == cudaSuccess) return DM_OK;
    *p = NULL;
    cudaGetLastError();         /* not sticky: clear it for the next call */
    return _DM_FAIL(&n->base, DM_ERR_CUDA, "nccl: %s: no device memory for %zu bytes of scratch (cuda: %s)",
                    what, bytes, cudaGetErrorString(e));
}
/* Releases p once the work queued so far is done with it; returns st, the call's status so far,
   or the wait's failure. */
static dm_status _dm_nccl_tmp_free(_dm_nccl* n, void* p, dm_status st, const char* what) {
    dm_status w = DM_OK;
    if (!p) return st;
#if CUDART_VERSION >= 11020
    if (n->pools) {
        cudaFreeAsync(p, n->stream);
        return st;
    }
#endif
    if (n->comm) w = _dm_nccl_wait(n, what, true);
    cudaFree(p);
    return st != DM_OK ? st : w;
}

/* >>nccl groups  ncclSend/ncclRecv inside ncclGroupStart/End. Calls inside a group only queue
   (a failure may show at once or at ncclGroupEnd); the group is always ended, or every later
   NCCL call of this thread would join it. */
static void _dm_nccl_note(ncclResult_t* first, ncclResult_t r) {
    if (r != ncclSuccess && r != ncclInProgress && *first == ncclSuccess) *first = r;
}
static dm_status _dm_nccl_group_end(_dm_nccl* n, ncclResult_t first, const char* what) {
    ncclResult_t r = ncclGroupEnd();
    if (r == ncclInProgress) {      /* non-blocking communicator: wait until it is queued */
        dm_status st = _dm_nccl_wait(n, what, false);
        if (st != DM_OK || first == ncclSuccess) return st;
    } else if (first == ncclSuccess) {
        first = r;
    }
    return first == ncclSuccess ? DM_OK : _dm_nccl_fail(n, first, what);
}
static dm_status _dm_nccl_copy(_dm_nccl* n, void* dst, const void* src, size_t bytes, const char* what) {
    cudaError_t e;
    if (!bytes || dst == src) return DM_OK;
    e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, n->stream);
    return e == cudaSuccess ? DM_OK : _dm_nccl_cuda_fail(&n->base, e, what);
}

/* >>nccl rooted and point-to-point  Like the collectives above: queued on the stream, device
   memory only; data movement travels as bytes (any dtype, on any NCCL). */
static dm_status _dm_nccl_reduce_on(_dm_nccl* n, const void* send, void* recv, size_t count,
                                    dm_dtype dtype, dm_reduce_op op, int root) {
    ncclDataType_t nt;
    ncclRedOp_t no;
    _DM_TRY(_dm_nccl_usable(n, "reduce"));
    _DM_TRY(_dm_nccl_types(n, "reduce", dtype, &nt, 1, op, &no));
    if (n->base.rank != root) recv = NULL;   /* read at the root only (NCCL ignores it elsewhere) */
    if (!send) send = recv;
    _DM_TRY(_dm_nccl_need_device(n, "reduce", send, recv));
    return _dm_nccl_enqueued(n, ncclReduce(send, recv, count, nt, no, root, n->comm, n->stream), "reduce");
}

static dm_status _dm_nccl_gather_on(_dm_nccl* n, const void* send, void* recv, size_t count,
                                    dm_dtype dtype, int root) {
    size_t bytes = count * dm_dtype_size(dtype);
    unsigned char* own;
    ncclResult_t first = ncclSuccess;
    int r;
    _DM_TRY(_dm_nccl_usable(n, "gather"));
    if (!bytes) return DM_OK;   /* every rank skips it alike */
    if (n->base.rank != root) {
        _DM_TRY(_dm_nccl_need_device(n, "gather", send, NULL));
        return _dm_nccl_enqueued(n, ncclSend(send, bytes, ncclUint8, root, n->comm, n->stream), "gather");
    }
    own = (unsigned char*)recv + (size_t)root * bytes;
    if (!send) send = own;
    _DM_TRY(_dm_nccl_need_device(n, "gather", send, recv));
    _DM_TRY(_dm_nccl_copy(n, own, send, bytes, "gather: copying the root's block"));
    _dm_nccl_note(&first, ncclGroupStart());
    for (r = 0; r < n->base.size; r++)
        if (r != root)
            _dm_nccl_note(&first, ncclRecv((unsigned char*)recv + (size_t)r * bytes, bytes, ncclUint8, r,
                                           n->comm, n->stream));
    return _dm_nccl_group_end(n, first, "gather");
}

static dm_status _dm_nccl_scatter_on(_dm_nccl* n, const void* send, void* recv, size_t count,
                                     dm_dtype dtype, int root) {
    size_t bytes = count * dm_dtype_size(dtype);
    const unsigned char* own;
    ncclResult_t first = ncclSuccess;
    int r;
    _DM_TRY(_dm_nccl_usable(n, "scatter"));
    if (!bytes) return DM_OK;
    if (n->base.rank != root) {
        _DM_TRY(_dm_nccl_need_device(n, "scatter", recv, NULL));
        return _dm_nccl_enqueued(n, ncclRecv(recv, bytes, ncclUint8, root, n->comm, n->stream), "scatter");
    }
    own = (const unsigned char*)send + (size_t)root * bytes;
    if (!recv) recv = (void*)own;
    _DM_TRY(_dm_nccl_need_device(n, "scatter", send, recv));
    _DM_TRY(_dm_nccl_copy(n, recv, own, bytes, "scatter: copying the root's block"));
    _dm_nccl_note(&first, ncclGroupStart());
    for (r = 0; r < n->base.size; r++)
        if (r != root)
            _dm_nccl_note(&first, ncclSend((const unsigned char*)send + (size_t)r * bytes, bytes, ncclUint8, r,
                                           n->comm, n->stream));
    return _dm_nccl_group_end(n, first, "scatter");
}

/* all_to_all (counts and offsets NULL: block j is count elements at j * count) and
   all_to_all_v. send NULL or == recv: in place, recv's outgoing blocks first copied to scratch.
   NCCL cannot check that a pair's counts agree: only this rank's own pair is checked here. */
static size_t _dm_nccl_cnt(const size_t* counts, int j, size_t count) { return counts ? counts[j] : count; }
static size_t _dm_nccl_off(const size_t* offsets, int j, size_t count) {
    return offsets ? offsets[j] : (size_t)j * count;
}
static dm_status _dm_nccl_exchange(_dm_nccl* n, const char* what, const void* send, const size_t* sc,
                                   const size_t* so, void* recv, const size_t* rc, const size_t* ro,
                                   size_t count, dm_dtype dtype) {
    size_t es = dm_dtype_size(dtype), send_end = 0, recv_end = 0;
    int me = n->base.rank, j;
    const unsigned char* src = (const unsigned char*)send;
    unsigned char* dst = (unsigned char*)recv;
    void* tmp = NULL;
    ncclResult_t first = ncclSuccess;
    dm_status st;
    _DM_TRY(_dm_nccl_usable(n, what));
    if (_dm_nccl_cnt(sc, me, count) != _dm_nccl_cnt(rc, me, count))
        return _DM_FAIL(&n->base, DM_ERR_MISMATCH, "nccl: %s: rank %d sends itself %zu elements but "
                        "receives %zu from itself", what, me, _dm_nccl_cnt(sc, me, count),
                        _dm_nccl_cnt(rc, me, count));
    for (j = 0; j < n->base.size; j++) {   /* extents, in elements, of what is read and written */
        size_t s = _dm_nccl_cnt(sc, j, count), r = _dm_nccl_cnt(rc, j, count);
        if (s && _dm_nccl_off(so, j, count) + s > send_end) send_end = _dm_nccl_off(so, j, count) + s;
        if (r && _dm_nccl_off(ro, j, count) + r > recv_end) recv_end = _dm_nccl_off(ro, j, count) + r;
    }
    if (!send || send == recv) {
        if (send_end && !_dm_nccl_is_device(recv))
            return _dm_nccl_need_device(n, what, recv, NULL);
        if (send_end) {
            _DM_TRY(_dm_nccl_tmp_alloc(n, send_end * es, &tmp, what));
            st = _dm_nccl_copy(n, tmp, recv, send_end * es, what);
            if (st != DM_OK) return _dm_nccl_tmp_free(n, tmp, st, what);
        }
        src = (const unsigned char*)tmp;
    }
    st = DM_OK;
    if (send_end && !_dm_nccl_is_device(src)) st = _dm_nccl_need_device(n, what, src, NULL);
    if (st == DM_OK && recv_end && !_dm_nccl_is_device(dst)) st = _dm_nccl_need_device(n, what, dst, NULL);
    if (st == DM_OK)
        st = _dm_nccl_copy(n, dst + _dm_nccl_off(ro, me, count) * es, src + _dm_nccl_off(so, me, count) * es,
                           _dm_nccl_cnt(sc, me, count) * es, what);
    if (st == DM_OK) {
        _dm_nccl_note(&first, ncclGroupStart());
        for (j = 0; j < n->base.size; j++) {
            size_t s = _dm_nccl_cnt(sc, j, count), r = _dm_nccl_cnt(rc, j, count);
            if (j == me) continue;
            if (s) _dm_nccl_note(&first, ncclSend(src + _dm_nccl_off(so, j, count) * es, s * es, ncclUint8, j,
                                                  n->comm, n->stream));
            if (r) _dm_nccl_note(&first, ncclRecv(dst + _dm_nccl_off(ro, j, count) * es, r * es, ncclUint8, j,
                                                  n->comm, n->stream));
        }
        st = _dm_nccl_group_end(n, first, what);
    }
    return _dm_nccl_tmp_free(n, tmp, st, what);
}

/* Tags are not sent: NCCL matches a pair's messages in issue order. */
static dm_status _dm_nccl_send_on(_dm_nccl* n, const void* buf, size_t count, dm_dtype dtype, int peer) {
    _DM_TRY(_dm_nccl_usable(n, "send"));
    _DM_TRY(_dm_nccl_need_device(n, "send", buf, NULL));
    return _dm_nccl_enqueued(n, ncclSend(buf, count * dm_dtype_size(dtype), ncclUint8, peer, n->comm, n->stream),
                             "send");
}
static dm_status _dm_nccl_recv_on(_dm_nccl* n, void* buf, size_t count, dm_dtype dtype, int peer) {
    _DM_TRY(_dm_nccl_usable(n, "recv"));
    _DM_TRY(_dm_nccl_need_device(n, "recv", buf, NULL));
    return _dm_nccl_enqueued(n, ncclRecv(buf, count * dm_dtype_size(dtype), ncclUint8, peer, n->comm, n->stream),
                             "recv");
}

/* all_gather_to_list: all_gather into a device block, then one copy per rank. Host buffers
   (send or any recvs[r]) are staged and synchronized like all_gather's. */
static dm_status _dm_nccl_all_gather_to_list_on(_dm_nccl* n, const void* send, void* const* recvs,
                                                size_t count, dm_dtype dtype) {
    size_t bytes = count * dm_dtype_size(dtype), total = bytes * (size_t)n->base.size;
    bool host = !_dm_nccl_is_device(send);
    unsigned char* block = NULL;
    void* tmp = NULL;
    dm_status st;
    int r;
    _DM_TRY(_dm_nccl_usable(n, "all_gather_to_list"));
    if (!bytes) return DM_OK;   /* every rank skips it alike */
    for (r = 0; r < n->base.size && !host; r++) host = !_dm_nccl_is_device(recvs[r]);
    _DM_TRY(_dm_nccl_tmp_alloc(n, total, &tmp, "all_gather_to_list"));
    block = (unsigned char*)tmp;
    st = DM_OK;
    if (!_dm_nccl_is_device(send)) {    /* host send: into our slot of the block first */
        cudaError_t e = cudaMemcpyAsync(block + (size_t)n->base.rank * bytes, send, bytes, cudaMemcpyDefault,
                                        n->stream);
        if (e != cudaSuccess) st = _dm_nccl_cuda_fail(&n->base, e, "all_gather_to_list (host staging)");
        send = block + (size_t)n->base.rank * bytes;
    }
    if (st == DM_OK)
        st = _dm_nccl_enqueued(n, ncclAllGather(send, block, bytes, ncclUint8, n->comm, n->stream),
                               "all_gather_to_list");
    if (st == DM_OK && host) st = _dm_nccl_wait(n, "all_gather_to_list", true);
    for (r = 0; r < n->base.size && st == DM_OK; r++) {
        cudaError_t e = bytes ? cudaMemcpyAsync(recvs[r], block + (size_t)r * bytes, bytes, cudaMemcpyDefault,
                                                n->stream) : cudaSuccess;
        if (e != cudaSuccess) st = _dm_nccl_cuda_fail(&n->base, e, "all_gather_to_list: copying a block out");
    }
    if (st == DM_OK && host) st = _dm_nccl_wait(n, "all_gather_to_list", true);
    return _dm_nccl_tmp_free(n, tmp, st, "all_gather_to_list");
}

/* The vtable's entries for the calls above: on the communicator's device. */
static dm_status _dm_nccl_reduce(dm_collective* c, const void* send, void* recv, size_t count,
                                 dm_dtype dtype, dm_reduce_op op, int root) {
    _dm_nccl* n = (_dm_nccl*)c;
    int prev = _dm_nccl_enter(n);
    dm_status st = _dm_nccl_reduce_on(n, send, recv, count, dtype, op, root);
    _dm_nccl_leave(n, prev);
    return st;
}
static dm_status _dm_nccl_gather(dm_collective* c, const void* send, void* recv, size_t count,
                                 dm_dtype dtype, int root) {
    _dm_nccl* n = (_dm_nccl*)c;
    int prev = _dm_nccl_enter(n);
    dm_status st = _dm_nccl_gather_on(n, send, recv, count, dtype, root);
    _dm_nccl_leave(n, prev);
    return st;
}
static dm_status _dm_nccl_scatter(dm_collective* c, const void* send, void* recv, size_t count,
                                  dm_dtype dtype, int root) {
    _dm_nccl* n = (_dm_nccl*)c;
    int prev = _dm_nccl_enter(n);
    dm_status st = _dm_nccl_scatter_on(n, send, recv, count, dtype, root);
    _dm_nccl_leave(n, prev);
    return st;
}
static dm_status _dm_nccl_all_to_all_v(dm_collective* c, const void* send, const size_t* send_counts,
                                       const size_t* send_offsets, void* recv, const size_t* recv_counts,
                                       const size_t* recv_offsets, dm_dtype dtype) {
    _dm_nccl* n = (_dm_nccl*)c;
    int prev = _dm_nccl_enter(n);
    dm_status st = _dm_nccl_exchange(n, "all_to_all_v", send, send_counts, send_offsets, recv, recv_counts,
                                     recv_offsets, 0, dtype);
    _dm_nccl_leave(n, prev);
    return st;
}
static dm_status _dm_nccl_send(dm_collective* c, const void* buf, size_t count, dm_dtype dtype, int peer,
                               int tag) {
    _dm_nccl* n = (_dm_nccl*)c;
    int prev = _dm_nccl_enter(n);
    dm_status st = _dm_nccl_send_on(n, buf, count, dtype, peer);
    (void)tag;
    _dm_nccl_leave(n, prev);
    return st;
}
static dm_status _dm_nccl_recv(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int peer, int tag) {
    _dm_nccl* n = (_dm_nccl*)c;
    int prev = _dm_nccl_enter(n);
    dm_status st = _dm_nccl_recv_on(n, buf, count, dtype, peer);
    (void)tag;
    _dm_nccl_leave(n, prev);
    return st;
}
static dm_status _dm_nccl_all_gather_to_list(dm_collective* c, const void* send, void* const* recvs,
                                             size_t count, dm_dtype dtype) {
    _dm_nccl* n = (_dm_nccl*)c;
    int prev = _dm_nccl_enter(n);
    dm_status st = _dm_nccl_all_gather_to_list_on(n, send, recvs, count, dtype);
    _dm_nccl_leave(n, prev);
    return st;
}

/* >>nccl requests  start queues the operation on the stream as the blocking slot does (those
   on device memory do not wait; host-staged ones and, without memory pools, the ones needing
   scratch complete before start returns), records an event after it and returns a token
   holding the event. finish polls the event, NCCL's asynchronous error and the request's
   deadline (the collective's timeout counted from start); a failure or the deadline aborts
   the communicator (ncclCommAbort) like a blocking wait. It polls instead of
   cudaEventSynchronize so that a peer's failure or the deadline ends the wait. Object
   collectives and split return DM_ERR_UNSUPPORTED, recording nothing: the core runs them. */
static const char* _dm_nccl_op_name(dm_op_kind k) {
    switch (k) {
        case DM_OP_BARRIER: return "barrier";
        case DM_OP_ALL_REDUCE: return "all_reduce";
        case DM_OP_ALL_GATHER: return "all_gather";
        case DM_OP_ALL_GATHER_TO_LIST: return "all_gather_to_list";
        case DM_OP_REDUCE_SCATTER: return "reduce_scatter";
        case DM_OP_BROADCAST: return "broadcast";
        case DM_OP_REDUCE: return "reduce";
        case DM_OP_GATHER: return "gather";
        case DM_OP_SCATTER: return "scatter";
        case DM_OP_ALL_TO_ALL: return "all_to_all";
        case DM_OP_ALL_TO_ALL_V: return "all_to_all_v";
        case DM_OP_SEND: return "send";
        case DM_OP_RECV: return "recv";
        default: return NULL;   /* objects, split: the core's */
    }
}
static dm_status _dm_nccl_issue(_dm_nccl* n, const dm_op* op) {
    dm_collective* c = &n->base;
    size_t bytes = op->count * dm_dtype_size(op->dtype);
    switch (op->kind) {
        case DM_OP_BARRIER:
            _DM_TRY(_dm_nccl_usable(n, "barrier"));
            return _dm_nccl_enqueued(n, ncclAllReduce(n->scratch, n->scratch, 1, ncclFloat32, ncclSum, n->comm,
                                                      n->stream), "barrier");
        case DM_OP_ALL_REDUCE:
            return _dm_nccl_all_reduce(c, op->send ? op->send : op->recv, op->recv, op->count, op->dtype, op->op);
        case DM_OP_ALL_GATHER:
            return _dm_nccl_all_gather(c, op->send ? op->send : (unsigned char*)op->recv + (size_t)c->rank * bytes,
                                       op->recv, op->count, op->dtype);
        case DM_OP_ALL_GATHER_TO_LIST:
            return _dm_nccl_all_gather_to_list_on(n, op->send ? op->send : op->recvs[c->rank], op->recvs,
                                                  op->count, op->dtype);
        case DM_OP_REDUCE_SCATTER:
            return _dm_nccl_reduce_scatter(c, op->send, op->recv, op->count, op->dtype, op->op);
        case DM_OP_BROADCAST:   /* the buffer travels in send (recv accepted too) */
            return _dm_nccl_broadcast(c, op->send ? (void*)op->send : op->recv, op->count, op->dtype, op->root);
        case DM_OP_REDUCE:
            return _dm_nccl_reduce_on(n, op->send, op->recv, op->count, op->dtype, op->op, op->root);
        case DM_OP_GATHER:
            return _dm_nccl_gather_on(n, op->send, op->recv, op->count, op->dtype, op->root);
        case DM_OP_SCATTER:
            return _dm_nccl_scatter_on(n, op->send, op->recv, op->count, op->dtype, op->root);
        case DM_OP_ALL_TO_ALL:
            return _dm_nccl_exchange(n, "all_to_all", op->send, NULL, NULL, op->recv, NULL, NULL, op->count,
                                     op->dtype);
        case DM_OP_ALL_TO_ALL_V:
            return _dm_nccl_exchange(n, "all_to_all_v", op->send, op->send_counts, op->send_offsets, op->recv,
                                     op->recv_counts, op->recv_offsets, 0, op->dtype);
        case DM_OP_SEND:
            return _dm_nccl_send_on(n, op->send, op->count, op->dtype, op->root);
        case DM_OP_RECV:
            return _dm_nccl_recv_on(n, op->recv, op->count, op->dtype, op->root);
        default:
            return DM_ERR_UNSUPPORTED;
    }
}

static _dm_nccl_token* _dm_nccl_token_get(_dm_nccl* n, const char* what) {
    _dm_nccl_token* t = n->spare;
    if (t) {
        n->spare = t->next;
        n->spare_count--;
    } else {
        cudaError_t e;
        t = (_dm_nccl_token*)_dm_calloc(&n->base.allocator, sizeof(*t));
        if (!t) {
            _DM_FAIL(&n->base, DM_ERR_OUT_OF_MEMORY, "nccl: %s: out of memory for a request", what);
            return NULL;
        }
        e = cudaEventCreateWithFlags(&t->event, cudaEventDisableTiming);
        if (e != cudaSuccess) {
            _dm_free(&n->base.allocator, t);
            _dm_nccl_cuda_fail(&n->base, e, "creating a request's event");
            return NULL;
        }
    }
    t->prev = t->next = NULL;
    t->settled = false;
    t->status = DM_OK;
    return t;
}
static void _dm_nccl_token_release(_dm_nccl* n, _dm_nccl_token* t) {
    if (n->spare_count >= _DM_NCCL_SPARE_MAX) {
        cudaEventDestroy(t->event);
        _dm_free(&n->base.allocator, t);
        return;
    }
    t->next = n->spare;
    n->spare = t;
    n->spare_count++;
}

static dm_status _dm_nccl_start(dm_collective* c, const dm_op* op, void** token) {
    _dm_nccl* n = (_dm_nccl*)c;
    const char* what = _dm_nccl_op_name(op->kind);
    int64_t deadline = _dm_deadline(c->timeout_ms);
    _dm_nccl_token* t;
    dm_status st;
    int prev;
    *token = NULL;
    if (!what) return DM_ERR_UNSUPPORTED;
    _DM_TRY(_dm_nccl_usable(n, what));
    prev = _dm_nccl_enter(n);
    t = _dm_nccl_token_get(n, what);
    st = t ? _dm_nccl_issue(n, op) : DM_ERR_OUT_OF_MEMORY;
    if (st == DM_OK) {
        cudaError_t e = cudaEventRecord(t->event, n->stream);
        if (e != cudaSuccess) st = _dm_nccl_cuda_fail(c, e, "recording a request's event");
    }
    if (st != DM_OK) {
        if (t) _dm_nccl_token_release(n, t);
        _dm_nccl_leave(n, prev);
        return st;
    }
    t->deadline = deadline;
    t->timeout_ms = c->timeout_ms;
    t->seq = c->seq;
    t->what = what;
    t->next = n->live;
    if (n->live) n->live->prev = t;
    n->live = t;
    _dm_nccl_leave(n, prev);
    *token = t;
    return DM_OK;
}

static dm_status _dm_nccl_finish(dm_collective* c, void* token, bool block, bool* done) {
    _dm_nccl* n = (_dm_nccl*)c;
    _dm_nccl_token* t = (_dm_nccl_token*)token;
    int prev = _dm_nccl_enter(n);
    bool reported = false;      /* this call recorded the failure's message */
    dm_status st;
    if (done) *done = false;
    while (!t->settled) {
        ncclResult_t async = ncclSuccess;
        cudaError_t e = cudaEventQuery(t->event);
        if (e == cudaSuccess) {
            t->settled = true;
            t->status = DM_OK;
            break;
        }
        if (e != cudaErrorNotReady) {
            t->settled = true;
            t->status = _dm_nccl_cuda_fail(c, e, t->what);
            reported = true;
            break;
        }
        if (!n->comm) {         /* not reached: an abort settles every live token */
            t->settled = true;
            t->status = n->broken != DM_OK ? n->broken : DM_ERR_ABORTED;
            break;
        }
        ncclCommGetAsyncError(n->comm, &async);
        if (async != ncclSuccess && async != ncclInProgress) {
            st = _dm_nccl_fail_at(n, async, t->what, t->seq);
            _dm_nccl_abort(n, st);
            t->status = st;     /* even if its event completed in between: reported as failed */
            reported = true;
            break;
        }
        if (_dm_now_ms() >= t->deadline) {
            _dm_nccl_abort(n, DM_ERR_TIMEOUT);
            if (t->status != DM_OK) {
                _DM_FAIL(c, DM_ERR_TIMEOUT, "nccl: %s #%llu timed out after %d ms; the communicator was "
                         "aborted", t->what, (unsigned long long)t->seq, t->timeout_ms);
                reported = true;
            }
            break;
        }
        if (!block) {
            _dm_nccl_leave(n, prev);
            return DM_OK;
        }
        sched_yield();
    }
    st = t->status;
    if (st != DM_OK && !reported)
        _DM_FAIL(c, st, "nccl: %s #%llu did not complete: the communicator was aborted by a failure (%s)",
                 t->what, (unsigned long long)t->seq, dm_status_name(st));
    if (t->prev) t->prev->next = t->next;
    else n->live = t->next;
    if (t->next) t->next->prev = t->prev;
    _dm_nccl_token_release(n, t);
    _dm_nccl_leave(n, prev);
    if (done) *done = true;
    return st;
}

static void _dm_nccl_destroy(dm_collective* c) {
    _dm_nccl* n = (_dm_nccl*)c;
    dm_allocator a = c->allocator;
    int prev = _dm_nccl_enter(n), device = n->device;
    if (n->comm) {
        /* Let queued work finish (within the deadline) before the communicator goes. */
        if (_dm_nccl_wait(n, "destroy", true) == DM_OK && n->comm) ncclCommDestroy(n->comm);
        else if (n->comm) ncclCommAbort(n->comm);
    }
    while (n->live) {           /* requests the core did not finish (it finishes them first) */
        _dm_nccl_token* t = n->live;
        n->live = t->next;
        cudaEventDestroy(t->event);
        _dm_free(&a, t);
    }
    while (n->spare) {
        _dm_nccl_token* t = n->spare;
        n->spare = t->next;
        cudaEventDestroy(t->event);
        _dm_free(&a, t);
    }
    if (n->scratch) cudaFree(n->scratch);
    if (n->owns_stream && n->stream) cudaStreamDestroy(n->stream);
    _dm_free(&a, n);
    if (prev >= 0 && prev != device) cudaSetDevice(prev);
}

static dm_status _dm_nccl_split(dm_collective* c, int color, int key, dm_collective** out);

static const dm_collective_vtable _dm_nccl_vtable = {
    sizeof(dm_collective_vtable),    /* struct_size */
    DM_COLLECTIVE_VTABLE_VERSION,    /* version */
    "nccl",                          /* name */
    _dm_nccl_destroy,                /* destroy */
    _dm_nccl_barrier,                /* barrier */
    _dm_nccl_all_reduce,             /* all_reduce */
    _dm_nccl_all_gather,             /* all_gather */
    _dm_nccl_all_gather_to_list,     /* all_gather_to_list: one device block, copies out */
    _dm_nccl_reduce_scatter,         /* reduce_scatter */
    _dm_nccl_broadcast,              /* broadcast */
    _dm_nccl_split,                  /* split */
    _dm_nccl_native,                 /* native_handle: ncclComm_t */
    _dm_nccl_synchronize,            /* synchronize */
    NULL,                            /* transport */
    _dm_nccl_reduce,                 /* reduce: ncclReduce */
    _dm_nccl_gather,                 /* gather: grouped ncclRecv at the root */
    _dm_nccl_scatter,                /* scatter: grouped ncclSend at the root */
    _dm_nccl_all_to_all_v,           /* all_to_all_v: grouped ncclSend/ncclRecv */
    _dm_nccl_send,                   /* send: ncclSend (tag not sent) */
    _dm_nccl_recv,                   /* recv: ncclRecv (tag not sent) */
    _dm_nccl_start,                  /* start: queued on the stream, an event recorded after */
    _dm_nccl_finish,                 /* finish: the event, async errors and the deadline */
};

/* >>nccl lifetime */
static _dm_nccl* _dm_nccl_new(const dm_allocator* a, const dm_logger* lg, int rank, int size,
                              int timeout_ms, int device, cudaStream_t stream) {
    _dm_nccl* n = (_dm_nccl*)_dm_calloc(a, sizeof(_dm_nccl));
    if (!n) return NULL;
    _dm_collective_init(&n->base, &_dm_nccl_vtable, rank, size, timeout_ms, lg, a);
    n->device = device;
    n->base.device.type = DM_DEVICE_CUDA;
    n->base.device.index = device;
    n->stream = stream;
    return n;
}
/* Stream and scratch for a new object; the communicator comes after. */
static dm_status _dm_nccl_resources(_dm_nccl* n) {
    cudaError_t e;
    if (!n->stream) {
        /* Blocking (not cudaStreamNonBlocking): collectives then run after what the caller queued
           on the legacy default stream, like cudaMemcpy, without an explicit sync. */
        e = cudaStreamCreate(&n->stream);
        if (e != cudaSuccess) return _dm_nccl_cuda_fail(&n->base, e, "creating the stream");
        n->owns_stream = true;
    }
#if CUDART_VERSION >= 11020
    {
        int pools = 0;
        if (cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, n->device) != cudaSuccess) {
            cudaGetLastError();
            pools = 0;
        }
        n->pools = pools != 0;
    }
#endif
    e = cudaMalloc(&n->scratch, 16);
    if (e != cudaSuccess) return _dm_nccl_cuda_fail(&n->base, e, "allocating scratch");
    cudaMemset(n->scratch, 0, 16);
    return DM_OK;
}

static dm_status _dm_nccl_split(dm_collective* c, int color, int key, dm_collective** out) {
    _dm_nccl* n = (_dm_nccl*)c;
    _dm_nccl* m;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    ncclComm_t comm = NULL;
    int rank = 0, size = 0;
    dm_status st;
    _DM_TRY(_dm_nccl_usable(n, "split"));
    config.blocking = 0;
    {   /* The parent stays "in progress" after a non-blocking split even when the call itself
           returned ncclSuccess (seen with NCCL_SPLIT_NOCOLOR on 2.28): wait for it either way, or
           NCCL refuses the next call on the parent. */
        ncclResult_t r = ncclCommSplit(n->comm, color == DM_SPLIT_NONE ? NCCL_SPLIT_NOCOLOR : color, key,
                                       &comm, &config);
        if (r != ncclSuccess && r != ncclInProgress) return _dm_nccl_fail(n, r, "split");
        st = _dm_nccl_wait(n, "split", false);
    }
    if (st != DM_OK || color == DM_SPLIT_NONE) return st;
    {   /* the new communicator finishes its own initialisation */
        int64_t deadline = _dm_deadline(c->timeout_ms);
        ncclResult_t r = ncclInProgress;
        while (r == ncclInProgress && _dm_now_ms() < deadline) {
            ncclCommGetAsyncError(comm, &r);
            if (r == ncclInProgress) sched_yield();
        }
        if (r != ncclSuccess) {
            ncclCommAbort(comm);
            return r == ncclInProgress
                ? _DM_FAIL(c, DM_ERR_TIMEOUT, "nccl: split #%llu timed out after %d ms", (unsigned long long)c->seq, c->timeout_ms)
                : _dm_nccl_fail(n, r, "split");
        }
    }
    ncclCommUserRank(comm, &rank);
    ncclCommCount(comm, &size);
    m = _dm_nccl_new(&c->allocator, &c->logger, rank, size, c->timeout_ms, n->device, NULL);
    if (!m) { ncclCommDestroy(comm); return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "nccl: split: out of memory"); }
    m->comm = comm;
    _dm_copy_name(m->base.node_name, sizeof(m->base.node_name), c->node_name);
    st = _dm_nccl_resources(m);
    if (st != DM_OK) {
        _dm_copy_name(c->last_error, sizeof(c->last_error), m->base.last_error);
        _dm_nccl_destroy(&m->base);
        return st;
    }
    *out = &m->base;
    return DM_OK;
}

/* The unique id: from the desc, or published by rank 0 through the store. */
static dm_status _dm_nccl_unique_id(_dm_nccl* n, const dm_nccl_desc* d, ncclUniqueId* id) {
    if (d->unique_id) {
        memcpy(id, d->unique_id, sizeof(*id));
        return DM_OK;
    }
#if defined(DISTMESH_TCP)
    {
        dm_store* store = d->store;
        dm_store_desc sd;
        char key[256];
        void* value = NULL;
        size_t size = 0;
        dm_status st = DM_OK;
        ncclResult_t r;
        snprintf(key, sizeof(key), "%snccl_unique_id", d->prefix ? d->prefix : "distmesh_nccl/");
        if (!store) {
            memset(&sd, 0, sizeof(sd));
            sd.url = d->store_url;
            sd.is_server = n->base.rank == 0;
            sd.timeout_ms = n->base.timeout_ms;
            sd.logger = n->base.logger;
            sd.allocator = n->base.allocator;
            st = dm_store_create(&sd, &store);
            if (st != DM_OK) return _DM_FAIL(&n->base, st, "nccl: store: %s", "could not reach the rendezvous store");
        }
        if (n->base.rank == 0) {
            r = ncclGetUniqueId(id);
            if (r != ncclSuccess) st = _dm_nccl_fail(n, r, "ncclGetUniqueId");
            else if (dm_store_set(store, key, id, sizeof(*id)) != DM_OK)
                st = _DM_FAIL(&n->base, DM_ERR_NETWORK, "nccl: publishing the unique id: %s", dm_store_last_error(store));
        } else if (dm_store_get(store, key, &value, &size) != DM_OK) {
            st = _DM_FAIL(&n->base, DM_ERR_TIMEOUT, "nccl: waiting for rank 0's unique id: %s", dm_store_last_error(store));
        } else if (size != sizeof(*id)) {
            st = _DM_FAIL(&n->base, DM_ERR_PROTOCOL, "nccl: unique id of %zu bytes in the store", size);
        } else {
            memcpy(id, value, sizeof(*id));
        }
        if (value) dm_store_free(store, value);
        /* Rank 0 must keep a hosted store alive until every rank has read the id. */
        if (st == DM_OK && !d->store) {
            int64_t done = 0;
            char done_key[280];
            snprintf(done_key, sizeof(done_key), "%s_read", key);
            st = dm_store_add(store, done_key, 1, &done) == DM_OK ? DM_OK : DM_ERR_NETWORK;
            if (st == DM_OK && n->base.rank == 0) {
                int64_t deadline = _dm_deadline(n->base.timeout_ms);
                while (done < n->base.size && _dm_now_ms() < deadline && st == DM_OK) {
                    struct timespec ts = { 0, 2000000 };
                    nanosleep(&ts, NULL);
                    st = dm_store_add(store, done_key, 0, &done) == DM_OK ? DM_OK : DM_ERR_NETWORK;
                }
                if (st == DM_OK && done < n->base.size)
                    st = _DM_FAIL(&n->base, DM_ERR_TIMEOUT, "nccl: only %lld of %d ranks read the unique id",
                                  (long long)done, n->base.size);
            }
            if (st == DM_ERR_NETWORK) _DM_FAIL(&n->base, st, "nccl: store: %s", dm_store_last_error(store));
        }
        if (!d->store) dm_store_destroy(store);
        return st;
    }
#else
    (void)id;
    return _DM_FAIL(&n->base, DM_ERR_INVALID_ARG,
                    "nccl: no unique_id in the desc and no store (build with DISTMESH_TCP for store rendezvous)");
#endif
}

/* Rank, world and local rank from the desc or the environment. */
static dm_status _dm_nccl_placement(const dm_nccl_desc* d, int* rank, int* world, int* local_rank,
                                    int* local_size, char* err, size_t cap) {
    if (d->world_size == 0) {
        dm_env env;
        if (dm_env_detect(&env) != DM_OK)
            return _DM_REPORT(&d->logger, err, cap, DM_ERR_ENV, "%s", env.error);
        *rank = env.rank; *world = env.world_size; *local_rank = env.local_rank; *local_size = env.local_world_size;
        return DM_OK;
    }
    if (d->world_size < 0 || d->rank < 0 || d->rank >= d->world_size || d->local_rank < 0)
        return _DM_REPORT(&d->logger, err, cap, DM_ERR_INVALID_ARG, "nccl: rank %d / world_size %d / local_rank %d",
                          d->rank, d->world_size, d->local_rank);
    *rank = d->rank; *world = d->world_size; *local_rank = d->local_rank; *local_size = d->world_size;
    return DM_OK;
}

DM_API_IMPL dm_status dm_nccl_create(const dm_nccl_desc* desc, dm_collective** out) {
    _DM_ZERO(dm_nccl_desc, d);
    char err[DM_LAST_ERROR_SIZE];
    int rank = 0, world = 1, local_rank = 0, local_size = 1, ndev = 0, device;
    _dm_nccl* n;
    ncclUniqueId id;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    cudaError_t e;
    dm_status st;
    if (!out) return DM_ERR_INVALID_ARG;
    *out = NULL;
    if (desc) d = *desc;
    if (!_dm_allocator_valid(&d.allocator))
        return _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_INVALID_ARG, "nccl: allocator needs both functions or neither");
    _DM_TRY(_dm_nccl_placement(&d, &rank, &world, &local_rank, &local_size, err, sizeof(err)));
    e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev < 1)
        return _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_CUDA, "nccl: no CUDA device (%s)",
                          e != cudaSuccess ? cudaGetErrorString(e) : "count 0");
    device = d.cuda_device > 0 ? d.cuda_device - 1 : local_rank % ndev;
    if (device >= ndev)
        return _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_INVALID_ARG, "nccl: device %d of %d", device, ndev);
    e = cudaSetDevice(device);
    if (e != cudaSuccess)
        return _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_CUDA, "nccl: cudaSetDevice(%d): %s", device, cudaGetErrorString(e));
    n = _dm_nccl_new(&d.allocator, &d.logger, rank, world, d.timeout_ms, device, (cudaStream_t)d.stream);
    if (!n) return _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_OUT_OF_MEMORY, "nccl: out of memory");
    n->base.local_rank = local_rank;
    n->base.local_size = local_size;
    st = _dm_nccl_resources(n);
    if (st == DM_OK) st = _dm_nccl_unique_id(n, &d, &id);
    if (st == DM_OK) {
        config.blocking = 0;
        st = _dm_nccl_enqueued(n, ncclCommInitRankConfig(&n->comm, world, id, rank, &config), "init");
        /* ncclCommInitRankConfig may return before the communicator exists; wait for it. */
        if (st == DM_OK && n->comm) st = _dm_nccl_wait(n, "init", false);
    }
    if (st != DM_OK) {   /* the message went to the logger; nothing is left to clean up */
        _dm_nccl_destroy(&n->base);
        return st;
    }
    *out = &n->base;
    return DM_OK;
}

DM_API_IMPL struct CUstream_st* dm_nccl_stream(dm_collective* c) {
    return (c && c->vt == &_dm_nccl_vtable) ? (struct CUstream_st*)((_dm_nccl*)c)->stream : NULL;
}
DM_API_IMPL int dm_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) { cudaGetLastError(); return 0; }
    return n;
}
DM_API_IMPL dm_status dm_cuda_set_device(int device) {
    return cudaSetDevice(device) == cudaSuccess ? DM_OK : DM_ERR_CUDA;
}
DM_API_IMPL dm_status dm_cuda_current_device(int* out) {
    if (!out) return DM_ERR_INVALID_ARG;
    return cudaGetDevice(out) == cudaSuccess ? DM_OK : DM_ERR_CUDA;
}
DM_API_IMPL dm_status dm_cuda_synchronize(void) {
    return cudaDeviceSynchronize() == cudaSuccess ? DM_OK : DM_ERR_CUDA;
}
#endif /* DISTMESH_IMPLEMENTATION */

/*
MIT License

Copyright (c) 2026 the distmesh authors

Permission is hereby granted, free of charge, to any person obtaining a copy of this software and
associated documentation files (the "Software"), to deal in the Software without restriction,
including without limitation the rights to use, copy, modify, merge, publish, distribute,
sublicense, and/or sell copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all copies or
substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT
NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM,
DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT
OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
*/
