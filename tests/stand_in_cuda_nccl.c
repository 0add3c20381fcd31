/* STAND-IN for libcudart and libnccl -- not CUDA, not NCCL. It defines, with the real headers'
   prototypes, only the CUDA runtime and NCCL calls that distmesh_nccl.h (and the core's
   _dm_cuda_is_device) make, so that tests/test_nccl_standin.c can link against it instead of
   the real libraries and run where there is no GPU. What it models (see stand_in_cuda_nccl.h
   for the script):
   - "device memory" is host memory from malloc, registered so cudaPointerGetAttributes can
     tell it from host memory; copies and memsets really move the bytes;
   - a current device per thread, a device count, memory pools on or off;
   - streams that finish their work after a scripted number of polls, or never while held;
     events recorded behind such work;
   - communicators with a rank, a size, the device current when they were made (a split
     child: its parent's), an asynchronous state (ncclInProgress for a few polls after init,
     an error once a call failed or the script says a peer died); world-1 collectives copy
     send to recv, the rest move nothing;
   - NCCL's last-error text, which ncclCommAbort clears (read it before aborting);
   - CUDA's last error, and sticky errors that every later call returns.
   Single-threaded. */
#include <cuda_runtime.h>
#include <nccl.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stand_in_cuda_nccl.h"

enum { SI_MAX = 256, SI_RULES = 16, SI_NAMES = 64 };

typedef struct si_stream { int device, busy; unsigned held_epoch; } si_stream;
typedef struct si_event { int device; si_stream* stream; bool pending; unsigned held_epoch; } si_event;
typedef struct si_comm {
    int device, rank, nranks;
    ncclResult_t async;
    int polls_left;             /* ncclInProgress polls before ncclSuccess; -1: forever */
    unsigned char id_byte;      /* the unique id's first byte it was made with (init only) */
} si_comm;
typedef struct si_alloc { unsigned char* p; size_t bytes; int device; } si_alloc;
typedef struct si_rule { char fn[40]; int left; int code; bool sticky; } si_rule;
typedef struct si_name { char fn[40]; int calls; } si_name;

static struct {
    si_stats stats;
    si_rule rules[SI_RULES];
    si_name names[SI_NAMES];
    si_comm* comms[SI_MAX];
    si_stream* streams[SI_MAX];
    si_event* events[SI_MAX];
    si_alloc allocs[SI_MAX];
    int expect_device, device_count, busy_polls, init_polls;
    bool pools, held, init_forever, split_null;
    ncclResult_t child_fails;   /* what a split child's initialisation ends in, if not success */
    int version;                /* what ncclGetVersion reports */
    si_shrink_call shrink;      /* the last ncclCommShrink's arguments */
    unsigned ids;               /* ncclGetUniqueId calls, written into each id */
    unsigned epoch;
    ncclResult_t peer_died;     /* ncclSuccess, or what every communicator reports */
    cudaError_t sticky, last;
    char nccl_last[160];
} si = { .expect_device = -1, .device_count = 4, .init_polls = 2, .pools = true, .version = NCCL_VERSION_CODE };
static _Thread_local int si_current;
static int si_stream_query_calls;   /* atomic: read by another thread (si_stream_queries) */

/* >>script */
void si_reset(void) {
    int live_comms = si.stats.live_comms, live_streams = si.stats.live_streams;
    int live_events = si.stats.live_events, live_allocs = si.stats.live_allocs;
    memset(&si.stats, 0, sizeof(si.stats));
    si.stats.live_comms = live_comms;
    si.stats.live_streams = live_streams;
    si.stats.live_events = live_events;
    si.stats.live_allocs = live_allocs;
    memset(si.rules, 0, sizeof(si.rules));
    memset(si.names, 0, sizeof(si.names));
    si.expect_device = -1;
    si.device_count = 4;
    si.busy_polls = 0;
    si.init_polls = 2;
    si.pools = true;
    si.held = si.init_forever = si.split_null = false;
    si.peer_died = si.child_fails = ncclSuccess;
    si.version = NCCL_VERSION_CODE;
    memset(&si.shrink, 0, sizeof(si.shrink));
    si.sticky = si.last = cudaSuccess;
    si.nccl_last[0] = 0;
    si_current = 0;
    __atomic_store_n(&si_stream_query_calls, 0, __ATOMIC_RELEASE);
}
int si_stream_queries(void) { return __atomic_load_n(&si_stream_query_calls, __ATOMIC_ACQUIRE); }
const si_stats* si_get(void) { return &si.stats; }
int si_count(const char* fn) {
    int i;
    for (i = 0; i < SI_NAMES && si.names[i].fn[0]; i++)
        if (!strcmp(si.names[i].fn, fn)) return si.names[i].calls;
    return 0;
}
void si_fail(const char* fn, int nth, int code, bool sticky) {
    int i;
    for (i = 0; i < SI_RULES; i++)
        if (!si.rules[i].fn[0]) {
            snprintf(si.rules[i].fn, sizeof(si.rules[i].fn), "%s", fn);
            si.rules[i].left = nth;
            si.rules[i].code = code;
            si.rules[i].sticky = sticky;
            return;
        }
    fprintf(stderr, "stand-in: more than %d scripted results\n", SI_RULES);
    abort();
}
void si_expect_device(int device) { si.expect_device = device; }
void si_set_device_count(int count) { si.device_count = count; }
void si_set_memory_pools(bool supported) { si.pools = supported; }
void si_set_busy_polls(int polls) { si.busy_polls = polls; }
void si_hold_streams(bool held) {
    if (held && !si.held) si.epoch++;
    si.held = held;
}
void si_set_init_polls(int polls, bool forever) { si.init_polls = polls; si.init_forever = forever; }
void si_set_async_error(int nccl_result) { si.peer_died = (ncclResult_t)nccl_result; }
void si_split_gives_null(bool on) { si.split_null = on; }
void si_split_child_fails(int nccl_result) { si.child_fails = (ncclResult_t)nccl_result; }
void si_set_version(int version) { si.version = version; }
const si_shrink_call* si_last_shrink(void) { return &si.shrink; }

/* >>calls  Counting, the device check and the scripted result of one call. */
static void si_note(const char* fn) {
    int i;
    for (i = 0; i < SI_NAMES; i++) {
        if (!si.names[i].fn[0]) snprintf(si.names[i].fn, sizeof(si.names[i].fn), "%s", fn);
        if (!strcmp(si.names[i].fn, fn)) { si.names[i].calls++; return; }
    }
}
static void si_bound(const char* fn) {
    if (si.expect_device < 0 || si_current == si.expect_device) return;
    if (!si.stats.wrong_device_calls++)
        snprintf(si.stats.first_wrong_device_call, sizeof(si.stats.first_wrong_device_call),
                 "%s on device %d (expected %d)", fn, si_current, si.expect_device);
}
static bool si_is_enqueue(const char* fn) {
    static const char* const ops[] = { "ncclAllReduce", "ncclAllGather", "ncclBroadcast", "ncclReduce",
                                       "ncclReduceScatter", "ncclSend", "ncclRecv" };
    size_t i;
    for (i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
        if (!strcmp(fn, ops[i])) return true;
    return false;
}
/* The scripted result for this call of fn, if one is due (0 otherwise). */
static int si_scripted(const char* fn, bool* sticky) {
    int i;
    for (i = 0; i < SI_RULES; i++) {
        si_rule* r = &si.rules[i];
        if (!r->fn[0] || r->left <= 0) continue;
        if (strcmp(r->fn, fn) && !(strcmp(r->fn, "enqueue") == 0 && si_is_enqueue(fn))) continue;
        if (--r->left == 0) {
            if (sticky) *sticky = r->sticky;
            return r->code;
        }
    }
    return 0;
}
static cudaError_t si_cuda(const char* fn, bool bound) {
    bool sticky = false;
    cudaError_t e;
    si_note(fn);
    if (bound) si_bound(fn);
    if (si.sticky != cudaSuccess) return si.sticky;
    e = (cudaError_t)si_scripted(fn, &sticky);
    if (e != cudaSuccess) {
        if (sticky) si.sticky = e;
        else si.last = e;
    }
    return e;
}
static int si_find(void* const* table, const void* p) {
    int i;
    if (!p) return -1;
    for (i = 0; i < SI_MAX; i++)
        if (table[i] == p) return i;
    return -1;
}
static int si_slot(void* const* table) {
    int i;
    for (i = 0; i < SI_MAX; i++)
        if (!table[i]) return i;
    fprintf(stderr, "stand-in: more than %d live objects of one kind\n", SI_MAX);
    abort();
}
/* Work queued on s: it finishes after busy_polls polls, or never while held. */
static void si_queue(si_stream* s) {
    if (!s) return;
    s->busy = si.busy_polls;
    if (si.held) s->held_epoch = si.epoch;
}
static bool si_stream_busy(const si_stream* s) {
    return (si.held && s->held_epoch == si.epoch) || s->busy > 0;
}
/* A poll: busy work gets one step closer to done. */
static bool si_stream_done(si_stream* s) {
    if (si.held && s->held_epoch == si.epoch) return false;
    if (s->busy > 0) { s->busy--; return false; }
    return true;
}

/* >>memory */
static si_alloc* si_alloc_of(const void* p) {
    int i;
    const unsigned char* b = (const unsigned char*)p;
    for (i = 0; i < SI_MAX; i++)
        if (si.allocs[i].p && b >= si.allocs[i].p && b < si.allocs[i].p + si.allocs[i].bytes) return &si.allocs[i];
    return NULL;
}
static cudaError_t si_malloc(void** p, size_t bytes) {
    int i;
    if (!p) return cudaErrorInvalidValue;
    for (i = 0; i < SI_MAX; i++)
        if (!si.allocs[i].p) {
            si.allocs[i].p = (unsigned char*)calloc(1, bytes ? bytes : 1);
            if (!si.allocs[i].p) return cudaErrorMemoryAllocation;
            si.allocs[i].bytes = bytes ? bytes : 1;
            si.allocs[i].device = si_current;
            si.stats.live_allocs++;
            *p = si.allocs[i].p;
            return cudaSuccess;
        }
    return cudaErrorMemoryAllocation;
}
static cudaError_t si_free(void* p) {
    si_alloc* a;
    if (!p) return cudaSuccess;
    a = si_alloc_of(p);
    if (!a || a->p != p) { si.stats.bad_frees++; return cudaErrorInvalidValue; }
    free(a->p);
    memset(a, 0, sizeof(*a));
    si.stats.live_allocs--;
    return cudaSuccess;
}
cudaError_t cudaMalloc(void** devPtr, size_t size) {
    cudaError_t e = si_cuda("cudaMalloc", true);
    return e != cudaSuccess ? e : si_malloc(devPtr, size);
}
cudaError_t cudaMallocAsync(void** devPtr, size_t size, cudaStream_t hStream) {
    cudaError_t e = si_cuda("cudaMallocAsync", true);
    (void)hStream;
    return e != cudaSuccess ? e : si_malloc(devPtr, size);
}
/* Released even when the call fails (its error is still returned): the test process must not
   leak what a real context would keep or take with it. */
cudaError_t cudaFree(void* devPtr) {
    cudaError_t e = si_cuda("cudaFree", true), f = si_free(devPtr);
    return e != cudaSuccess ? e : f;
}
cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t hStream) {
    cudaError_t e = si_cuda("cudaFreeAsync", true), f = si_free(devPtr);
    (void)hStream;
    return e != cudaSuccess ? e : f;
}
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* attributes, const void* ptr) {
    cudaError_t e = si_cuda("cudaPointerGetAttributes", false);
    si_alloc* a;
    if (e != cudaSuccess) return e;
    memset(attributes, 0, sizeof(*attributes));
    a = si_alloc_of(ptr);
    attributes->type = a ? cudaMemoryTypeDevice : cudaMemoryTypeUnregistered;
    attributes->device = a ? a->device : -1;
    attributes->devicePointer = a ? (void*)ptr : NULL;
    attributes->hostPointer = a ? NULL : (void*)ptr;
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
    cudaError_t e = si_cuda("cudaMemcpyAsync", true);
    si_stream* s = (si_stream*)stream;
    (void)kind;
    if (e != cudaSuccess) return e;
    if (si_find((void* const*)si.streams, s) < 0) return cudaErrorInvalidResourceHandle;
    if ((!si_alloc_of(dst) || !si_alloc_of(src)) && si_stream_busy(s)) si.stats.host_copies_on_busy_stream++;
    if (count) memmove(dst, src, count);
    si_queue(s);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
    cudaError_t e = si_cuda("cudaMemsetAsync", true);
    si_stream* s = (si_stream*)stream;
    if (e != cudaSuccess) return e;
    if (si_find((void* const*)si.streams, s) < 0) return cudaErrorInvalidResourceHandle;
    if (!si_alloc_of(devPtr)) return cudaErrorInvalidValue;
    memset(devPtr, value, count);
    si_queue(s);
    return cudaSuccess;
}

/* >>devices, errors */
cudaError_t cudaGetDeviceCount(int* count) {
    cudaError_t e = si_cuda("cudaGetDeviceCount", false);
    if (e == cudaSuccess) *count = si.device_count;
    return e;
}
cudaError_t cudaSetDevice(int device) {
    cudaError_t e = si_cuda("cudaSetDevice", false);
    if (e != cudaSuccess) return e;
    if (device < 0 || device >= si.device_count) return si.last = cudaErrorInvalidDevice;
    si_current = device;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
    cudaError_t e = si_cuda("cudaGetDevice", false);
    if (e == cudaSuccess) *device = si_current;
    return e;
}
cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device) {
    cudaError_t e = si_cuda("cudaDeviceGetAttribute", false);
    if (e != cudaSuccess) return e;
    if (device < 0 || device >= si.device_count) return si.last = cudaErrorInvalidDevice;
    *value = attr == cudaDevAttrMemoryPoolsSupported ? si.pools : 0;
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
    int i;
    cudaError_t e = si_cuda("cudaDeviceSynchronize", true);
    if (e != cudaSuccess) return e;
    for (i = 0; i < SI_MAX; i++)
        if (si.streams[i] && si.streams[i]->device == si_current && si.held &&
            si.streams[i]->held_epoch == si.epoch) {
            fprintf(stderr, "stand-in: cudaDeviceSynchronize behind held work would hang on a GPU\n");
            abort();
        }
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void) {
    cudaError_t e = si.sticky != cudaSuccess ? si.sticky : si.last;
    si_note("cudaGetLastError");
    si.last = cudaSuccess;
    return e;
}
const char* cudaGetErrorString(cudaError_t error) {
    switch (error) {
        case cudaSuccess: return "no error (stand-in)";
        case cudaErrorInvalidValue: return "invalid argument (stand-in)";
        case cudaErrorMemoryAllocation: return "out of memory (stand-in)";
        case cudaErrorInvalidDevice: return "invalid device ordinal (stand-in)";
        case cudaErrorIllegalAddress: return "an illegal memory access was encountered (stand-in)";
        case cudaErrorLaunchFailure: return "unspecified launch failure (stand-in)";
        case cudaErrorNotReady: return "device not ready (stand-in)";
        default: return "some CUDA error (stand-in)";
    }
}

/* >>streams, events */
cudaError_t cudaStreamCreate(cudaStream_t* pStream) {
    cudaError_t e = si_cuda("cudaStreamCreate", true);
    si_stream* s;
    int i;
    if (e != cudaSuccess) return e;
    i = si_slot((void* const*)si.streams);
    s = (si_stream*)calloc(1, sizeof(*s));
    if (!s) return cudaErrorMemoryAllocation;
    s->device = si_current;
    si.streams[i] = s;
    si.stats.live_streams++;
    *pStream = (cudaStream_t)(void*)s;
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    cudaError_t e = si_cuda("cudaStreamDestroy", true);
    int i = si_find((void* const*)si.streams, stream), j;
    if (i < 0) return e != cudaSuccess ? e : cudaErrorInvalidResourceHandle;
    for (j = 0; j < SI_MAX; j++)
        if (si.events[j] && si.events[j]->stream == si.streams[i]) si.events[j]->stream = NULL;
    free(si.streams[i]);
    si.streams[i] = NULL;
    si.stats.live_streams--;
    return e;
}
cudaError_t cudaStreamQuery(cudaStream_t stream) {
    cudaError_t e = si_cuda("cudaStreamQuery", true);
    int i = si_find((void* const*)si.streams, stream);
    __atomic_add_fetch(&si_stream_query_calls, 1, __ATOMIC_ACQ_REL);
    if (e != cudaSuccess) return e;
    if (i < 0) return cudaErrorInvalidResourceHandle;
    return si_stream_done(si.streams[i]) ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
    cudaError_t e = si_cuda("cudaEventCreateWithFlags", true);
    si_event* ev;
    int i;
    (void)flags;
    if (e != cudaSuccess) return e;
    i = si_slot((void* const*)si.events);
    ev = (si_event*)calloc(1, sizeof(*ev));
    if (!ev) return cudaErrorMemoryAllocation;
    ev->device = si_current;
    si.events[i] = ev;
    si.stats.live_events++;
    *event = (cudaEvent_t)(void*)ev;
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
    cudaError_t e = si_cuda("cudaEventDestroy", true);
    int i = si_find((void* const*)si.events, event);
    if (i < 0) return e != cudaSuccess ? e : cudaErrorInvalidResourceHandle;
    free(si.events[i]);
    si.events[i] = NULL;
    si.stats.live_events--;
    return e;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    cudaError_t e = si_cuda("cudaEventRecord", true);
    int i = si_find((void* const*)si.events, event), j = si_find((void* const*)si.streams, stream);
    si_event* ev;
    if (e != cudaSuccess) return e;
    if (i < 0 || j < 0) return cudaErrorInvalidResourceHandle;
    ev = si.events[i];
    ev->stream = si.streams[j];
    ev->pending = (si.held && ev->stream->held_epoch == si.epoch) || ev->stream->busy > 0;
    ev->held_epoch = ev->stream->held_epoch;
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
    cudaError_t e = si_cuda("cudaEventQuery", true);
    int i = si_find((void* const*)si.events, event);
    si_event* ev;
    if (e != cudaSuccess) return e;
    if (i < 0) return cudaErrorInvalidResourceHandle;
    ev = si.events[i];
    if (!ev->pending) return cudaSuccess;
    if (si.held && ev->held_epoch == si.epoch) return cudaErrorNotReady;
    if (ev->stream && !si_stream_done(ev->stream)) return cudaErrorNotReady;
    ev->pending = false;
    return cudaSuccess;
}

/* >>nccl  Every call names its communicator; a NULL, freed or unknown one is counted. Not
   device-bound: the queries, ncclGroupStart, and ncclCommAbort / ncclCommDestroy (NCCL switches
   to the communicator's device for those itself). */
const char* ncclGetErrorString(ncclResult_t result) {
    switch (result) {
        case ncclSuccess: return "no error (stand-in)";
        case ncclUnhandledCudaError: return "unhandled cuda error (stand-in)";
        case ncclSystemError: return "unhandled system error (stand-in)";
        case ncclInternalError: return "internal error (stand-in)";
        case ncclInvalidArgument: return "invalid argument (stand-in)";
        case ncclInvalidUsage: return "invalid usage (stand-in)";
        case ncclRemoteError: return "remote process exited or there was a network error (stand-in)";
        case ncclInProgress: return "NCCL operation in progress (stand-in)";
        default: return "unknown result code (stand-in)";
    }
}
/* Like NCCL's: the calling thread's last error whatever the communicator. */
const char* ncclGetLastError(ncclComm_t comm) {
    (void)comm;
    si_note("ncclGetLastError");
    return si.nccl_last;
}
static si_comm* si_comm_of(ncclComm_t comm) {
    int i = si_find((void* const*)si.comms, comm);
    if (i < 0) { si.stats.stale_comm_calls++; return NULL; }
    return si.comms[i];
}
/* The scripted result of fn (the communicator keeps it as its asynchronous error). */
static ncclResult_t si_nccl(const char* fn, si_comm* c, bool bound) {
    ncclResult_t r;
    si_note(fn);
    if (bound) si_bound(fn);
    r = (ncclResult_t)si_scripted(fn, NULL);
    if (r != ncclSuccess && r != ncclInProgress) {
        snprintf(si.nccl_last, sizeof(si.nccl_last), "stand-in: %s scripted for %s", ncclGetErrorString(r), fn);
        if (c) c->async = r;
    }
    return r;
}
static si_comm* si_comm_new(int device, int rank, int nranks) {
    si_comm* c = (si_comm*)calloc(1, sizeof(*c));
    int i = si_slot((void* const*)si.comms);
    if (!c) abort();
    c->device = device;
    c->rank = rank;
    c->nranks = nranks;
    c->async = ncclInProgress;
    c->polls_left = si.init_forever ? -1 : si.init_polls;
    if (c->polls_left == 0) c->async = ncclSuccess;
    si.comms[i] = c;
    si.stats.live_comms++;
    return c;
}
static void si_comm_free(si_comm* c) {
    int i = si_find((void* const*)si.comms, c);
    si.comms[i] = NULL;
    free(c);
    si.stats.live_comms--;
}
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config) {
    si_comm* c = si_comm_new(si_current, rank, nranks);
    ncclResult_t r = si_nccl("ncclCommInitRankConfig", c, true);
    c->id_byte = (unsigned char)commId.internal[0];
    *comm = (ncclComm_t)(void*)c;       /* written even on failure, as NCCL does */
    if (r != ncclSuccess) return r;
    return config && !config->blocking && c->async == ncclInProgress ? ncclInProgress : ncclSuccess;
}
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
    si_comm* parent = si_comm_of(comm);
    si_comm* child;
    ncclResult_t r;
    (void)key; (void)config;
    if (!parent) return ncclInvalidArgument;
    r = si_nccl("ncclCommSplit", parent, true);
    if (parent->async != ncclSuccess && r == ncclSuccess) r = parent->async;
    *newcomm = NULL;
    if (r != ncclSuccess && r != ncclInProgress) {   /* NCCL writes the child even then */
        child = si_comm_new(parent->device, 0, 1);
        child->async = r;
        *newcomm = (ncclComm_t)(void*)child;
        return r;
    }
    parent->async = ncclInProgress;     /* the parent is "in progress" after a non-blocking split */
    parent->polls_left = 1;
    if (color == NCCL_SPLIT_NOCOLOR || si.split_null) return ncclSuccess;
    child = si_comm_new(parent->device, 0, 1);
    if (si.child_fails != ncclSuccess) {    /* its initialisation fails later, asynchronously */
        child->async = si.child_fails;
        snprintf(si.nccl_last, sizeof(si.nccl_last), "stand-in: the new communicator failed (%s)",
                 ncclGetErrorString(si.child_fails));
    }
    *newcomm = (ncclComm_t)(void*)child;
    return ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
    si_comm* c = si_comm_of(comm);
    ncclResult_t r;
    si_note("ncclCommGetAsyncError");
    r = (ncclResult_t)si_scripted("ncclCommGetAsyncError", NULL);
    if (r != ncclSuccess) return r;
    if (!c || !asyncError) return ncclInvalidArgument;
    if (si.peer_died != ncclSuccess && c->async == ncclSuccess) {
        c->async = si.peer_died;
        snprintf(si.nccl_last, sizeof(si.nccl_last), "stand-in: a peer died (%s)", ncclGetErrorString(si.peer_died));
    }
    if (c->async == ncclInProgress && c->polls_left > 0 && --c->polls_left == 0) c->async = ncclSuccess;
    *asyncError = c->async;
    return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
    si_comm* c = si_comm_of(comm);
    si_note("ncclCommAbort");
    if (!c) return ncclInvalidArgument;
    si.stats.aborts++;
    si.nccl_last[0] = 0;        /* what NCCL said about the failure is gone now */
    si_comm_free(c);
    return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    si_comm* c = si_comm_of(comm);
    si_note("ncclCommDestroy");
    if (!c) return ncclInvalidArgument;
    si.stats.destroys++;
    si_comm_free(c);
    return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
    si_comm* c = si_comm_of(comm);
    si_note("ncclCommUserRank");
    if (!c) return ncclInvalidArgument;
    *rank = c->rank;
    return ncclSuccess;
}
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
    si_comm* c = si_comm_of(comm);
    si_note("ncclCommCount");
    if (!c) return ncclInvalidArgument;
    *count = c->nranks;
    return ncclSuccess;
}
ncclResult_t ncclGroupStart(void) {
    si_note("ncclGroupStart");
    si.stats.group_depth++;
    return ncclSuccess;
}
ncclResult_t ncclGroupEnd(void) {
    ncclResult_t r = si_nccl("ncclGroupEnd", NULL, true);
    if (si.stats.group_depth <= 0) return ncclInvalidUsage;
    si.stats.group_depth--;
    return r;
}

/* One queued operation on comm and stream: the script, the sticky state, the stream's work. */
static ncclResult_t si_op(const char* fn, ncclComm_t comm, cudaStream_t stream) {
    si_comm* c = si_comm_of(comm);
    int j = si_find((void* const*)si.streams, stream);
    ncclResult_t r;
    if (!c) { si_note(fn); return ncclInvalidArgument; }
    r = si_nccl(fn, c, true);
    if (r != ncclSuccess) return r;
    if (c->async != ncclSuccess && c->async != ncclInProgress) return c->async;
    if (j < 0) return ncclInvalidArgument;
    si_queue(si.streams[j]);
    return ncclSuccess;
}
static size_t si_type_size(ncclDataType_t t) {
    switch (t) {
        case ncclInt8: case ncclUint8: return 1;
        case ncclFloat16: case ncclBfloat16: return 2;
        case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
        case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
        default: return 1;
    }
}
/* World 1: every collective leaves the data as it is, so it copies send to recv. */
static void si_world1_copy(ncclComm_t comm, void* recv, const void* send, size_t bytes) {
    si_comm* c = (si_comm*)(void*)comm;
    if (c->nranks == 1 && recv && send && recv != send && bytes) memmove(recv, send, bytes);
}
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    ncclResult_t r = si_op("ncclAllReduce", comm, stream);
    (void)op;
    if (r == ncclSuccess) si_world1_copy(comm, recvbuff, sendbuff, count * si_type_size(datatype));
    return r;
}
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    ncclResult_t r = si_op("ncclReduceScatter", comm, stream);
    (void)op;
    if (r == ncclSuccess) si_world1_copy(comm, recvbuff, sendbuff, recvcount * si_type_size(datatype));
    return r;
}
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    ncclResult_t r = si_op("ncclAllGather", comm, stream);
    if (r == ncclSuccess) si_world1_copy(comm, recvbuff, sendbuff, sendcount * si_type_size(datatype));
    return r;
}
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    ncclResult_t r = si_op("ncclBroadcast", comm, stream);
    (void)root;
    if (r == ncclSuccess) si_world1_copy(comm, recvbuff, sendbuff, count * si_type_size(datatype));
    return r;
}
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
    ncclResult_t r = si_op("ncclReduce", comm, stream);
    (void)op; (void)root;
    if (r == ncclSuccess) si_world1_copy(comm, recvbuff, sendbuff, count * si_type_size(datatype));
    return r;
}
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    (void)sendbuff; (void)count; (void)datatype; (void)peer;
    return si_op("ncclSend", comm, stream);
}
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    (void)recvbuff; (void)count; (void)datatype; (void)peer;
    return si_op("ncclRecv", comm, stream);
}

/* >>version, unique ids, shrink */
void si_comm_info(void* comm, int* rank, int* nranks, unsigned char* id_byte) {
    int i = si_find((void* const*)si.comms, comm);
    *rank = i < 0 ? -1 : si.comms[i]->rank;
    *nranks = i < 0 ? -1 : si.comms[i]->nranks;
    *id_byte = i < 0 ? 0 : si.comms[i]->id_byte;
}
ncclResult_t ncclGetVersion(int* version) {
    ncclResult_t r = si_nccl("ncclGetVersion", NULL, false);
    if (r == ncclSuccess) *version = si.version;
    return r;
}
/* Each id carries the number of the call in its first byte, for the test to follow it. */
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
    ncclResult_t r = si_nccl("ncclGetUniqueId", NULL, false);
    if (r != ncclSuccess) return r;
    memset(uniqueId, 0, sizeof(*uniqueId));
    uniqueId->internal[0] = (char)++si.ids;
    return ncclSuccess;
}
/* The child has the parent's rank less the excluded ranks below it; the arguments are kept
   for si_last_shrink. A failure writes a child anyway, as ncclCommSplit's does. */
ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm,
                            ncclConfig_t* config, int shrinkFlags) {
    si_comm* parent = si_comm_of(comm);
    si_comm* child;
    ncclResult_t r;
    int i, below = 0;
    if (!parent) return ncclInvalidArgument;
    r = si_nccl("ncclCommShrink", parent, true);
    si.shrink.calls++;
    si.shrink.flags = shrinkFlags;
    si.shrink.blocking = config ? config->blocking : -1;
    si.shrink.count = excludeRanksCount;
    for (i = 0; i < excludeRanksCount && i < SI_SHRINK_MAX; i++) {
        si.shrink.exclude[i] = excludeRanksList[i];
        if (excludeRanksList[i] < parent->rank) below++;
    }
    *newcomm = NULL;
    child = si_comm_new(parent->device, parent->rank - below, parent->nranks - excludeRanksCount);
    *newcomm = (ncclComm_t)(void*)child;
    if (r != ncclSuccess && r != ncclInProgress) child->async = r;
    else if (si.child_fails != ncclSuccess) {
        child->async = si.child_fails;
        snprintf(si.nccl_last, sizeof(si.nccl_last), "stand-in: the new communicator failed (%s)",
                 ncclGetErrorString(si.child_fails));
    }
    return r;
}

/* >>tcp staging  The TCP backend's CUDA staging (linked in since the test binary has
   DISTMESH_TCP for dm_shrink's store); the NCCL tests do not reach it. Waiting for work that
   is held would hang on a GPU, so it ends the test. */
static void si_no_wait_on_held(const char* fn, const si_stream* s) {
    if (s && si.held && s->held_epoch == si.epoch) {
        fprintf(stderr, "stand-in: %s behind held work would hang on a GPU\n", fn);
        abort();
    }
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    cudaError_t e = si_cuda("cudaStreamSynchronize", true);
    int i = si_find((void* const*)si.streams, stream);
    if (e != cudaSuccess) return e;
    if (i < 0) return cudaErrorInvalidResourceHandle;
    si_no_wait_on_held("cudaStreamSynchronize", si.streams[i]);
    si.streams[i]->busy = 0;
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    cudaError_t e = si_cuda("cudaEventSynchronize", true);
    int i = si_find((void* const*)si.events, event);
    if (e != cudaSuccess) return e;
    if (i < 0) return cudaErrorInvalidResourceHandle;
    si_no_wait_on_held("cudaEventSynchronize", si.events[i]->stream);
    si.events[i]->pending = false;
    return cudaSuccess;
}
/* Pinned host memory is plain host memory here (not registered as device memory). */
cudaError_t cudaMallocHost(void** ptr, size_t size) {
    cudaError_t e = si_cuda("cudaMallocHost", false);
    if (e != cudaSuccess) return e;
    *ptr = malloc(size ? size : 1);
    return *ptr ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeHost(void* ptr) {
    cudaError_t e = si_cuda("cudaFreeHost", false);
    free(ptr);
    return e;
}
