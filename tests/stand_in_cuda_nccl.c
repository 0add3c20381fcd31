/* STAND-IN for libcudart and libnccl -- not CUDA, not NCCL. It defines, with the real headers'
   prototypes, only the CUDA runtime and NCCL calls that distmesh_nccl.h (and the core's CUDA
   checks, and the TCP backend's staging) make, so that tests/test_nccl_standin.c can link
   against it instead of the real libraries and run where there is no GPU. The script is in
   stand_in_cuda_nccl.h.

   WHAT IT IMITATES: NCCL 2.27 and 2.28 with non-blocking communicators (config.blocking = 0;
   blocking ones run NCCL's jobs on the calling thread, >>blocking), read from NVIDIA/nccl at tags v2.27.7-1 and v2.28.9-1 (line numbers: v2.28.9-1, then
   v2.27.7-1 where they differ):
   - Background jobs. ncclCommInitRankConfig writes *newcomm at once (src/init.cc
     ncclCommInitRankDev, 2001 / 1805) and initialises it as a job; the new communicator
     reports ncclInProgress until the job ends, and the call returns that state
     (ncclCommInitRankConfig, 2140 / 1943). ncclCommSplit and ncclCommShrink (both
     ncclCommInitChildComm, 2550 / 2250) set *newcomm = NULL (2572 / 2272), launch the child's
     initialisation as a job of the PARENT (ncclAsyncLaunch with the parent; src/group.cc
     ncclGroupEndInternal, 705-738, marks it ncclInProgress and starts a thread) and return
     ncclSuccess (NCCLCHECK lets ncclInProgress through). The job stores the child into
     *newcomm when it ends, also when it failed (ncclCommInitRankFunc's exit, 1612 / 1483), and a
     failed job leaves its error on the parent (group.cc groupCleanup, 391). Here a job runs for
     a time (si_set_init_us; default SI_INIT_US) and ends at the first look at the
     communicator's state after it, however many polls came before: then the child is written.
   - ncclCommGetAsyncError returns the communicator's state; ncclSuccess also joins its group
     job (2706 / 2405). ncclCommEnsureReady (373 / 310), run by every call on a communicator
     (collectives through src/enqueue.cc ncclEnqueueCheck 2637, split, shrink, user rank, count,
     destroy): a communicator in progress is ncclInvalidArgument ("Attempt to use communicator
     before the previous operation returned ncclSuccess", counted in used_in_progress), an
     error state is returned; with the abort flag set it joins the job and returns ncclSuccess.
     It leaves the state alone; only ncclEnqueueCheck's failure path (enqueue.cc, fail:
     ncclCommSetAsyncError on a non-blocking communicator) makes a collective's, ncclSend's or
     ncclRecv's refusal the communicator's state.
   - Collectives (enqueue.cc): at nRanks == 1 ncclLaunchOneRank runs at once (2569: the data
     is copied, ncclSuccess); otherwise the task joins a group, and ncclGroupEndInternal of a
     non-blocking communicator marks it ncclInProgress and returns ncclInProgress (group.cc
     738); the call returns the communicator's state (enqueue.cc 2658). Inside ncclGroupStart /
     ncclGroupEnd the calls only queue; ncclGroupEnd returns ncclInProgress, or the first error
     of the group (ncclGroupErrCheck). Group depth is per thread (group.cc ncclGroupDepth); an
     ncclGroupEnd outside a group is ncclInvalidUsage (656), counted in stray_group_ends.
   - Launch: the work of such a call is launched by NCCL's group thread (group.cc
     ncclGroupEndInternal's job, groupLaunchNonBlocking, 735) once it runs, not at the call: here it
     reaches its stream when the job ends (the poll that sees "in progress" clear). An event
     recorded on that stream, a copy queued on it, or memory it uses freed before then would
     run ahead of the work: counted in before_launch.
   - First use: NCCL 2.28 connects to peers lazily (NCCL_RUNTIME_CONNECT, default 1: init.cc 57,
     1269), inside that job (the first collective its
     ring's and tree's peers, the first send or receive with a peer that peer), so the job waits
     for a peer that has not arrived: si_set_peer_arrival_us adds time, or never ends it
     (until ncclCommAbort).
   - ncclCommShrink (2645 / 2344): NCCL_SHRINK_ABORT first sets the parent's abort flags and
     waits for its device stream (its kernels stop), then clears them; a NULL or empty exclude
     list is ncclInvalidArgument (2562 / 2262), the list is sorted in place, the caller's own
     rank in it is ncclInvalidArgument, and ncclCommEnsureReady runs on the parent.
   - Shared resources (2582 / 2281): a child shares its parent's abort flag when the PARENT's
     config.splitShare (split) or config.shrinkShare (shrink without NCCL_SHRINK_ABORT) is 1;
     NCCL_COMM_SPLIT_SHARE_RESOURCES / NCCL_COMM_SHRINK_SHARE_RESOURCES override the config
     (envConfigOverride, 1719-1730 / 1555-1562); unset, both are 0. ncclCommAbort sets the flag
     (setCommAbortFlags), so the kernels of every communicator sharing it stop; their later
     operations pass ncclCommEnsureReady and do nothing (counted in skipped_by_shared_abort).
   - ncclCommAbort (2503 / 2207): the abort flag, then ncclCommEnsureReady joins the job
     running on the communicator (a split or shrink job then ends failed and writes its child),
     then the communicator is reclaimed -- at once, or, inside an open group of this thread, at
     the ncclGroupEnd that closes it (the reclaim is a group job).
   - ncclCommDestroy (2358 / 2159): ncclGroupStartInternal, then ncclCommEnsureReady; if that
     fails (an asynchronous error, or in progress) it returns the error WITHOUT the matching
     group end and without freeing: the communicator stays, and the thread stays inside a group.
     The group opens only from 2.24 on (v2.23.4-1's ncclCommDestroy, 2088, has no
     ncclGroupStartInternal): below that (si_set_version) it returns with no group open.
   - Anything given a communicator after its ncclCommAbort or ncclCommDestroy is a use after
     free (NCCL would read freed memory): counted, and every test ends by checking none
     happened. Communicators are never really freed here (a tombstone), so their addresses are
     never reused and such a call is always recognised.
   CUDA, as far as distmesh relies on it:
   - "device memory" is host memory from malloc, registered with the device current at
     allocation so cudaPointerGetAttributes tells it from host memory; copies and memsets
     really move the bytes; a collective given another GPU's memory faults (a sticky
     cudaErrorIllegalAddress, counted in illegal_addresses);
   - a current device per thread, a device count, memory pools on or off;
   - streams whose work takes wall time (si_set_busy_us, si_set_work_us: done once the time has
     passed, however often they are asked), or never ends while held;
     the legacy default stream (0, cudaStreamLegacy) and the blocking streams wait for each
     other: cudaMemcpy and cudaStreamSynchronize(0) behind held work on a blocking stream hang
     (counted), work queued on a blocking stream inherits what the legacy stream still has
     busy, and NCCL work on a non-blocking stream (cudaStreamCreateWithFlags) queued while it
     is busy is counted in unordered_with_legacy;
     events recorded behind such work; cudaFree, cudaDeviceSynchronize, cudaMemcpy and the
     stream and event synchronizations wait for the device (or the stream): they block, the
     lock released, until the work is done or released (ncclCommAbort of its communicator),
     behind held work counted in hangs, and never past SI_WAIT_BOUND_MS (>>waits);
   - CUDA's last error, and sticky errors that every later call returns;
   - a peer's death (si_peer_dies): reported (ncclRemoteError) only over the network; a peer on
     the same node leaves the work waiting for it spinning, silently;
   - stream capture (>>capture): per-stream capture state, 900 from cudaStreamQuery and
     cudaStreamSynchronize (invalidating the capture), 907 from cudaEventQuery on a captured
     event, unsafe calls refused in global mode, 901 at cudaStreamEndCapture after that; a
     live graph holds the communicators it captured: their ncclCommDestroy / ncclCommAbort
     would wait for it (counted in hangs);
   Every entry point takes one recursive lock, so two threads may call it (one at a time). */
#define _GNU_SOURCE
#include <cuda_runtime.h>
#include <nccl.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "stand_in_cuda_nccl.h"

#if defined(SI_WITHOUT_SHRINK)
#define SI_VERSION NCCL_VERSION(2, 26, 6)
#else
#define SI_VERSION NCCL_VERSION_CODE
#endif
/* NCCL's jobs take this long by default: an init, split or shrink, and a group's launch. */
#define SI_INIT_US 1000
#define SI_ENQUEUE_US 100
enum { SI_MAX = 256, SI_RULES = 16, SI_NAMES = 64, SI_GROUP_MAX = 16, SI_LAUNCH_BUFS = 64, SI_DEVICES = 16 };

typedef struct si_comm si_comm;
typedef struct si_flag { int set; } si_flag;     /* an abort flag, shared by resource-sharing comms */
typedef struct si_stream {
    int device;
    bool nonblocking;           /* cudaStreamNonBlocking: not ordered with the legacy default stream */
    bool held;                  /* work queued while held never finishes on its own */
    int capture;                /* enum cudaStreamCaptureStatus: none, active, invalidated (>>capture) */
    int64_t until_ns;           /* its work runs until then (CLOCK_MONOTONIC; si_set_busy_us, si_set_work_us) */
    si_comm* captured[4];       /* the communicators whose work this capture recorded */
    int n_captured;
    enum cudaStreamCaptureMode capture_mode;
    si_comm* held_by;           /* the communicator whose kernel it is (its abort stops it), or NULL */
    unsigned gen;               /* bumped whenever held work is released */
} si_stream;
typedef struct si_event {
    int device;
    si_stream* stream;
    bool pending, held;
    bool captured;              /* last recorded on a capturing stream (>>capture) */
    int64_t until_ns;           /* the stream's until_ns when recorded */
    unsigned gen;
} si_event;
/* A background job of NCCL's, running on the communicator that owns it. */
typedef struct si_job {
    bool active;
    bool forever;               /* never ends on its own (until ncclCommAbort) */
    int64_t until_ns;           /* else it ends then (CLOCK_MONOTONIC), however often it is polled */
    ncclResult_t result;        /* what it ends with */
    si_comm* child;             /* split / shrink: the child it writes; NULL: none (NOCOLOR) */
    ncclComm_t* target;         /* where it writes the child (the caller's variable) */
    bool writes;                /* split / shrink: it writes *target when it ends */
} si_job;
struct si_comm {
    si_comm* next_all;          /* every communicator ever made (tombstones included) */
    bool dead;                  /* ncclCommAbort / ncclCommDestroy returned for it */
    bool reclaimed;             /* its resources are gone (counted out of live_comms) */
    bool reclaim_at_group_end;  /* aborted inside an open group of this thread */
    char died_in[32];           /* which call made it dead */
    int device, rank, nranks;
    ncclResult_t async;         /* ncclSuccess, ncclInProgress, or its error */
    si_job job;
    si_flag* abort_flag;
    int split_share, shrink_share;  /* its config after the environment */
    unsigned char id_byte;      /* the unique id's first byte it was made with (init only) */
    bool in_group;              /* has operations queued in this thread's open group */
    bool blocking;              /* config.blocking (NCCL's default 1), NCCL_COMM_BLOCKING over it */
    int graph_refs;             /* live CUDA graphs that captured its work (>>capture) */
    /* Accepted, not launched yet: NCCL 2.28's group thread launches a call's work once the
       communicator's "in progress" clears (the job ends), not at the call. */
    bool launch_pending;
    si_stream* launch_stream;
    const void* launch_bufs[SI_LAUNCH_BUFS];
    int n_launch_bufs;
    bool connected;             /* its collectives' peers arrived: the first collective's job waited */
    unsigned long long p2p_connected;   /* per peer (< 64): the first send/recv's job waited for it */
    bool pend_collective;       /* the pending launch has a collective */
    unsigned long long pend_peers;      /* ... and point-to-point with these peers */
};
typedef struct si_alloc { unsigned char* p; size_t bytes; int device; bool managed; } si_alloc;
typedef struct si_rule { char fn[40]; int left; int code; bool sticky; } si_rule;
typedef struct si_name { char fn[40]; int calls; } si_name;

static struct {
    si_stats stats;
    si_rule rules[SI_RULES];
    si_name names[SI_NAMES];
    si_comm* all;               /* every communicator ever made, newest first */
    si_stream* streams[SI_MAX];
    si_event* events[SI_MAX];
    si_alloc allocs[SI_MAX];
    int expect_device, device_count;
    int busy_us;                /* every queued operation keeps its stream busy this long */
    int work_us;                /* NCCL work keeps its stream busy this long */
    int init_us, enqueue_us;    /* NCCL's jobs: init, split, shrink; a group's launch */
    bool pools, hold, init_forever, split_null;
    bool launch_cpu;            /* a launch's time is CPU work (si_set_launch_cpu) */
    int arrival_us;             /* the first operation of a communicator waits this much longer for its peers */
    bool never_arrive;          /* ... or forever (until ncclCommAbort) */
    si_stream* legacy[SI_DEVICES];  /* each device's legacy default stream (stream 0), made on first use */
    int split_rank, split_nranks;   /* what a split child is (default 0 of 1) */
    ncclResult_t child_fails;   /* what split and shrink jobs end in, if not success */
    int version;                /* what ncclGetVersion reports */
    si_shrink_call shrink;      /* the last ncclCommShrink's arguments */
    unsigned ids;               /* ncclGetUniqueId calls, written into each id */
    ncclResult_t peer_died;     /* ncclSuccess, or what every communicator reports */
    cudaError_t sticky, last;
    char nccl_last[160];
    si_call_hook call_hook;
    void* call_hook_user;
    si_gather_hook gather_hook;
    void* gather_hook_user;
} si = { .expect_device = -1, .device_count = 4, .init_us = SI_INIT_US, .enqueue_us = SI_ENQUEUE_US, .pools = true,
         .split_nranks = 1, .version = SI_VERSION };
static _Thread_local int si_current;
static _Thread_local int si_depth;                  /* ncclGroupDepth, per thread as in NCCL */
static _Thread_local ncclResult_t si_group_error;   /* ncclGroupError */
static _Thread_local si_comm* si_group[SI_GROUP_MAX];   /* communicators with queued operations */
static _Thread_local int si_ngroup;
static int si_stream_query_calls;   /* atomic: read by another thread (si_stream_queries) */

/* >>lock  One recursive lock around every entry point. */
static pthread_mutex_t si_mu;
static pthread_cond_t si_cv;        /* a blocked wait's wake-up (>>waits) */
static pthread_once_t si_mu_once = PTHREAD_ONCE_INIT;
static void si_mu_init(void) {
    pthread_mutexattr_t attr;
    pthread_condattr_t cattr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&si_mu, &attr);
    pthread_mutexattr_destroy(&attr);
    pthread_condattr_init(&cattr);
    pthread_condattr_setclock(&cattr, CLOCK_MONOTONIC);
    pthread_cond_init(&si_cv, &cattr);
    pthread_condattr_destroy(&cattr);
}
static void si_lock(void) {
    pthread_once(&si_mu_once, si_mu_init);
    pthread_mutex_lock(&si_mu);
}
static void si_unlock(void) { pthread_mutex_unlock(&si_mu); }
#define SI_RETURN(v) do { __typeof__(v) si_v_ = (v); si_unlock(); return si_v_; } while (0)

static void si_job_tick(si_comm* c);

/* >>script */
void si_reset(void) {
    si_stats keep;
    si_lock();
    keep = si.stats;
    memset(&si.stats, 0, sizeof(si.stats));
    si.stats.live_comms = keep.live_comms;
    si.stats.live_streams = keep.live_streams;
    si.stats.live_events = keep.live_events;
    si.stats.live_allocs = keep.live_allocs;
    si.stats.live_graphs = keep.live_graphs;
    si.stats.group_depth = keep.group_depth;
    memset(si.rules, 0, sizeof(si.rules));
    memset(si.names, 0, sizeof(si.names));
    si.expect_device = -1;
    si.device_count = 4;
    si.busy_us = si.work_us = 0;
    si.init_us = SI_INIT_US;
    si.enqueue_us = SI_ENQUEUE_US;
    si.pools = true;
    si.hold = si.init_forever = si.split_null = si.launch_cpu = false;
    si.arrival_us = 0;
    si.never_arrive = false;
    si.split_rank = 0;
    si.split_nranks = 1;
    si.peer_died = si.child_fails = ncclSuccess;
    si.version = SI_VERSION;
    memset(&si.shrink, 0, sizeof(si.shrink));
    si.sticky = si.last = cudaSuccess;
    si.nccl_last[0] = 0;
    si.call_hook = NULL;
    si.gather_hook = NULL;
    si_current = 0;
    __atomic_store_n(&si_stream_query_calls, 0, __ATOMIC_RELEASE);
    si_unlock();
}
int si_stream_queries(void) { return __atomic_load_n(&si_stream_query_calls, __ATOMIC_ACQUIRE); }
const si_stats* si_get(void) { return &si.stats; }
int si_count(const char* fn) {
    int i;
    si_lock();
    for (i = 0; i < SI_NAMES && si.names[i].fn[0]; i++)
        if (!strcmp(si.names[i].fn, fn)) SI_RETURN(si.names[i].calls);
    SI_RETURN(0);
}
int si_pending_jobs(void) {
    si_comm* c;
    int n = 0;
    si_lock();
    for (c = si.all; c; c = c->next_all) {
        if (!c->dead) si_job_tick(c);
        if (!c->reclaimed && c->job.active) n++;
    }
    SI_RETURN(n);
}
void si_fail(const char* fn, int nth, int code, bool sticky) {
    int i;
    si_lock();
    for (i = 0; i < SI_RULES; i++)
        if (!si.rules[i].fn[0]) {
            snprintf(si.rules[i].fn, sizeof(si.rules[i].fn), "%s", fn);
            si.rules[i].left = nth;
            si.rules[i].code = code;
            si.rules[i].sticky = sticky;
            si_unlock();
            return;
        }
    fprintf(stderr, "stand-in: more than %d scripted results\n", SI_RULES);
    abort();
}
static void si_release_held(si_stream* s);
void si_expect_device(int device) { si_lock(); si.expect_device = device; si_unlock(); }
void si_set_device_count(int count) { si_lock(); si.device_count = count; si_unlock(); }
void si_set_memory_pools(bool supported) { si_lock(); si.pools = supported; si_unlock(); }
void si_set_busy_us(int us) { si_lock(); si.busy_us = us; si_unlock(); }
void si_set_work_us(int us) { si_lock(); si.work_us = us; si_unlock(); }
static int64_t si_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
/* us from now, in si_now_ns's clock (0 or less: now). */
static int64_t si_after_us(int us) { return si_now_ns() + (int64_t)(us > 0 ? us : 0) * 1000; }
void si_hold_streams(bool held) {
    int i;
    si_lock();
    si.hold = held;
    if (!held)
        for (i = 0; i < SI_MAX; i++)
            if (si.streams[i]) si_release_held(si.streams[i]);
    si_unlock();
}
void si_set_init_us(int us, bool forever) {
    si_lock(); si.init_us = us; si.init_forever = forever; si_unlock();
}
void si_set_enqueue_us(int us) { si_lock(); si.enqueue_us = us; si_unlock(); }
void si_set_launch_cpu(bool on) { si_lock(); si.launch_cpu = on; si_unlock(); }
void si_set_peer_arrival_us(int us, bool never) {
    si_lock(); si.arrival_us = us; si.never_arrive = never; si_unlock();
}
void si_set_async_error(int nccl_result) { si_lock(); si.peer_died = (ncclResult_t)nccl_result; si_unlock(); }
/* A peer's death as NCCL sees it: over the network (net transport, its proxy) the connection
   fails and every communicator reports ncclRemoteError; on this host (shared memory, P2P) the
   kernels and proxy threads waiting for it spin, and nothing is reported -- the work queued
   from now on never ends, until ncclCommAbort (proxy.cc and transport/shm.cc have no
   liveness check of their peer). */
void si_peer_dies(bool same_node) {
    si_lock();
    if (same_node) si.hold = true;
    else si.peer_died = ncclRemoteError;
    si_unlock();
}
void si_split_gives_null(bool on) { si_lock(); si.split_null = on; si_unlock(); }
void si_set_split_child(int rank, int nranks) { si_lock(); si.split_rank = rank; si.split_nranks = nranks; si_unlock(); }
void si_split_child_fails(int nccl_result) { si_lock(); si.child_fails = (ncclResult_t)nccl_result; si_unlock(); }
void si_set_version(int version) { si_lock(); si.version = version; si_unlock(); }
const si_shrink_call* si_last_shrink(void) { return &si.shrink; }
void si_set_call_hook(si_call_hook hook, void* user) {
    si_lock(); si.call_hook = hook; si.call_hook_user = user; si_unlock();
}
void si_set_all_gather_peers(si_gather_hook hook, void* user) {
    si_lock(); si.gather_hook = hook; si.gather_hook_user = user; si_unlock();
}

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
static void si_hang(const char* what) {
    if (!si.stats.hangs++)
        snprintf(si.stats.first_hang, sizeof(si.stats.first_hang), "%s", what);
}

/* >>streams  Work queued on s keeps it busy for a time (si_set_busy_us, and for NCCL work
   si_set_work_us), after the work already there, as a GPU runs it: however often the stream is
   asked, it is done only once that time has passed. An NCCL kernel queued while the streams are
   held never finishes on its own (it waits on a dead peer), nor does what is queued behind it,
   until the hold is lifted or its communicator is aborted; copies are not held by themselves. */
static void si_queue(si_stream* s, si_comm* by) {
    si_stream* l;
    int64_t now = si_now_ns(), start;
    int us = si.busy_us + (by ? si.work_us : 0);
    if (!s || s->capture != cudaStreamCaptureStatusNone) return;    /* captured: a graph node, not work */
    start = s->until_ns > now ? s->until_ns : now;                   /* behind what runs already */
    if (us > 0) s->until_ns = start + (int64_t)us * 1000;
    /* A blocking stream's new work waits for what the legacy default stream holds before it; a
       non-blocking stream's does not: NCCL work there may read inputs not written yet. */
    l = s->device >= 0 && s->device < SI_DEVICES ? si.legacy[s->device] : NULL;
    if (l && l != s && l->until_ns > now) {
        if (!s->nonblocking && s->until_ns < l->until_ns) s->until_ns = l->until_ns;
        else if (s->nonblocking && by) si.stats.unordered_with_legacy++;
    }
    if (si.hold && by && !s->held) {
        s->held = true;
        s->held_by = by;
    }
}
static void si_release_held(si_stream* s) {
    if (!s->held) return;
    s->held = false;
    s->held_by = NULL;
    s->gen++;
    pthread_cond_broadcast(&si_cv);     /* a blocked wait behind it goes on (>>waits) */
}
static bool si_stream_busy(const si_stream* s) { return s->held || si_now_ns() < s->until_ns; }
/* The legacy default stream (stream 0, cudaStreamLegacy) of the current device: made on first
   use, part of the context (never counted in live_streams, never freed). */
static si_stream* si_legacy_stream(void) {
    int d = si_current >= 0 && si_current < SI_DEVICES ? si_current : 0;
    if (!si.legacy[d]) {
        si.legacy[d] = (si_stream*)calloc(1, sizeof(si_stream));
        if (!si.legacy[d]) abort();
        si.legacy[d]->device = d;
    }
    return si.legacy[d];
}
/* A stream handle: the legacy default stream for 0 or cudaStreamLegacy, else a live stream. */
static si_stream* si_stream_of(cudaStream_t stream) {
    int i;
    if (stream == NULL || stream == cudaStreamLegacy) return si_legacy_stream();
    i = si_find((void* const*)si.streams, stream);
    return i < 0 ? NULL : si.streams[i];
}
/* >>waits  The synchronous calls (cudaStreamSynchronize, cudaEventSynchronize, cudaMemcpy,
   cudaDeviceSynchronize, cudaFree) really wait, as CUDA's do: the calling thread blocks, with
   the stand-in's lock released, until the work it waits for is done -- its time passed, held
   work released (si_hold_streams(false), or ncclCommAbort of the communicator that queued it).
   Behind held work (a kernel waiting on a dead peer) the call is counted in hangs first, as it
   would never return on its own; so that no test hangs forever, a wait ends after
   SI_WAIT_BOUND_MS whatever it waits for, counted in wait_bounds (a GPU would still wait).
   Another thread may call the stand-in meanwhile: the watchdog's abort is what ends it. */
enum { SI_WAIT_BOUND_MS = 3000 };
/* What a wait waits for: a stream (NULL: every stream of the device, or only its blocking ones
   for the legacy stream), or an event. */
typedef struct si_waiter { const si_stream* stream; const si_event* event; int device; bool blocking_only; } si_waiter;
static bool si_event_pending(const si_event* ev);
static bool si_stream_live(const si_stream* s) {
    int d;
    for (d = 0; d < SI_DEVICES; d++)
        if (si.legacy[d] == s) return true;
    return si_find((void* const*)si.streams, s) >= 0;
}
static bool si_waiting(const si_waiter* w) {
    int i;
    if (w->event) return si_find((void* const*)si.events, w->event) >= 0 && si_event_pending(w->event);
    if (w->stream) return si_stream_live(w->stream) && si_stream_busy(w->stream);
    if (w->device >= 0 && w->device < SI_DEVICES && si.legacy[w->device] && si_stream_busy(si.legacy[w->device]))
        return true;
    for (i = 0; i < SI_MAX; i++)
        if (si.streams[i] && si.streams[i]->device == w->device && !(w->blocking_only && si.streams[i]->nonblocking) &&
            si_stream_busy(si.streams[i]))
            return true;
    return false;
}
/* Blocks (lock released, held once by the caller) while w waits; what: the hang's words when it
   waits behind held work. */
static void si_block(const si_waiter* w, bool held, const char* what) {
    int64_t bound = si_now_ns() + (int64_t)SI_WAIT_BOUND_MS * 1000000;
    if (held) si_hang(what);
    while (si_waiting(w)) {
        struct timespec ts;
        int64_t now = si_now_ns(), until = now + 1000000;      /* a look each ms: timed work ends by itself */
        if (now >= bound) {
            si.stats.wait_bounds++;
            return;
        }
        ts.tv_sec = (time_t)(until / 1000000000);
        ts.tv_nsec = (long)(until % 1000000000);
        pthread_cond_timedwait(&si_cv, &si_mu, &ts);
    }
}
/* Whether one of the streams w waits for holds work that never ends on its own. */
static bool si_waits_on_held(const si_waiter* w) {
    int i;
    for (i = 0; i < SI_MAX; i++)
        if (si.streams[i] && si.streams[i]->held && si.streams[i]->device == w->device &&
            !(w->blocking_only && si.streams[i]->nonblocking))
            return true;
    return false;
}
/* Work on the legacy default stream waits for every blocking stream of the device: behind held
   work (a kernel waiting on a dead peer) a synchronous call there never returns on its own. */
static void si_legacy_wait(const char* fn) {
    si_waiter w = { NULL, NULL, si_current, true };
    char what[96];
    snprintf(what, sizeof(what), "%s on the legacy stream behind a kernel that never ends", fn);
    si_block(&w, si_waits_on_held(&w), what);
}
/* A device-wide wait (cudaFree, cudaDeviceSynchronize): every stream of the device. */
static void si_device_wait(const char* fn) {
    si_waiter w = { NULL, NULL, si_current, false };
    char what[96];
    snprintf(what, sizeof(what), "%s on device %d behind a kernel that never ends", fn, si_current);
    si_block(&w, si_waits_on_held(&w), what);
}

/* >>capture  CUDA graph capture, as the runtime answers it (CUDA 12/13 documentation of
   cudaStreamBeginCapture, cudaStreamQuery, cudaEventQuery; "Prohibited and Unhandled
   Operations" of the programming guide's CUDA Graphs section). Between cudaStreamBeginCapture
   and cudaStreamEndCapture the stream's work is recorded into a graph, not run (here the bytes
   still move at once, as if the graph ran right away; the stream never gets busy). Asking for
   the capturing stream's progress (cudaStreamQuery, cudaStreamSynchronize) is
   cudaErrorStreamCaptureUnsupported (900) and invalidates the capture; an event last recorded
   on a capturing stream answers cudaEventQuery and cudaEventSynchronize with
   cudaErrorCapturedEvent (907), also after the capture ended (the record was a graph node,
   not an event on the device); while a stream captures in global or thread-local mode (here
   from any thread: thread-local forbids them only on the capturing thread),
   potentially unsafe calls (cudaMalloc, cudaFree, cudaMemcpy, cudaDeviceSynchronize) are
   cudaErrorStreamCaptureUnsupported and invalidate it, and a synchronous call on the legacy
   stream behind a capturing blocking stream is cudaErrorStreamCaptureImplicit (906).
   cudaMallocAsync / cudaFreeAsync on the stream are allocation nodes, allowed. An invalidated
   capture ends with cudaErrorStreamCaptureInvalidated (901) and no graph. Not sticky: the
   errors are the call's and the last error's. Counted: capture_errors. */
static cudaError_t si_capture_error(si_stream* s, cudaError_t e) {
    if (s && s->capture == cudaStreamCaptureStatusActive) s->capture = cudaStreamCaptureStatusInvalidated;
    si.stats.capture_errors++;
    si.last = e;
    return e;
}
/* A potentially unsafe call while a stream captures in a mode that forbids it: every such
   capture is invalidated, and the call fails. */
static cudaError_t si_unsafe_in_capture(void) {
    int i;
    bool hit = false;
    for (i = 0; i < SI_MAX; i++) {
        si_stream* s = si.streams[i];
        if (s && s->capture == cudaStreamCaptureStatusActive && s->capture_mode != cudaStreamCaptureModeRelaxed) {
            s->capture = cudaStreamCaptureStatusInvalidated;
            hit = true;
        }
    }
    return hit ? si_capture_error(NULL, cudaErrorStreamCaptureUnsupported) : cudaSuccess;
}
/* A synchronous call on the legacy stream, which would join a capturing blocking stream. */
static cudaError_t si_legacy_in_capture(void) {
    int i;
    for (i = 0; i < SI_MAX; i++) {
        si_stream* s = si.streams[i];
        if (s && s->capture == cudaStreamCaptureStatusActive && !s->nonblocking && s->device == si_current)
            return si_capture_error(s, cudaErrorStreamCaptureImplicit);
    }
    return cudaSuccess;
}
int si_capture_status(void* stream) {
    int i, st = -1;
    si_lock();
    i = si_find((void* const*)si.streams, stream);
    if (i >= 0) st = si.streams[i]->capture;
    SI_RETURN(st);
}

/* >>memory */
static si_alloc* si_alloc_of(const void* p) {
    int i;
    const unsigned char* b = (const unsigned char*)p;
    for (i = 0; i < SI_MAX; i++)
        if (si.allocs[i].p && b >= si.allocs[i].p && b < si.allocs[i].p + si.allocs[i].bytes) return &si.allocs[i];
    return NULL;
}

/* >>launch  What touches NCCL work accepted but not launched yet (its communicator still "in
   progress"): an event recorded on its stream completes before the work; memory freed, or a
   copy made, on its stream goes ahead of it. Counted in before_launch. */
static void si_early(const char* what) {
    if (!si.stats.before_launch++)
        snprintf(si.stats.first_before_launch, sizeof(si.stats.first_before_launch), "%s", what);
}
static bool si_launch_pending_on(const si_stream* s) {
    si_comm* c;
    for (c = si.all; c; c = c->next_all)
        if (!c->dead && c->launch_pending && c->launch_stream == s) return true;
    return false;
}
static bool si_launch_uses(const si_alloc* a) {
    si_comm* c;
    int i;
    if (!a) return false;
    for (c = si.all; c; c = c->next_all)
        for (i = 0; !c->dead && c->launch_pending && i < c->n_launch_bufs; i++) {
            const unsigned char* b = (const unsigned char*)c->launch_bufs[i];
            if (b >= a->p && b < a->p + a->bytes) return true;
        }
    return false;
}
static cudaError_t si_malloc(void** p, size_t bytes, bool managed) {
    int i;
    if (!p) return cudaErrorInvalidValue;
    for (i = 0; i < SI_MAX; i++)
        if (!si.allocs[i].p) {
            si.allocs[i].p = (unsigned char*)calloc(1, bytes ? bytes : 1);
            if (!si.allocs[i].p) return cudaErrorMemoryAllocation;
            si.allocs[i].bytes = bytes ? bytes : 1;
            si.allocs[i].device = si_current;
            si.allocs[i].managed = managed;
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
    cudaError_t e;
    si_lock();
    e = si_cuda("cudaMalloc", true);
    if (e == cudaSuccess) e = si_unsafe_in_capture();
    SI_RETURN(e != cudaSuccess ? e : si_malloc(devPtr, size, false));
}
cudaError_t cudaMallocManaged(void** devPtr, size_t size, unsigned int flags) {
    cudaError_t e;
    (void)flags;
    si_lock();
    e = si_cuda("cudaMallocManaged", false);
    SI_RETURN(e != cudaSuccess ? e : si_malloc(devPtr, size, true));
}
cudaError_t cudaMallocAsync(void** devPtr, size_t size, cudaStream_t hStream) {
    cudaError_t e;
    (void)hStream;
    si_lock();
    e = si_cuda("cudaMallocAsync", true);
    SI_RETURN(e != cudaSuccess ? e : si_malloc(devPtr, size, false));
}
/* Released even when the call fails (its error is still returned): the test process must not
   leak what a real context would keep or take with it. cudaFree waits for the whole device. */
cudaError_t cudaFree(void* devPtr) {
    cudaError_t e, f;
    si_lock();
    e = si_cuda("cudaFree", true);
    if (e == cudaSuccess && devPtr && (f = si_unsafe_in_capture()) != cudaSuccess)
        SI_RETURN(f);                       /* refused by a capture: nothing is released */
    if (devPtr) si_device_wait("cudaFree");
    if (si_launch_uses(si_alloc_of(devPtr))) si_early("cudaFree of memory that NCCL work not launched yet uses");
    f = si_free(devPtr);
    SI_RETURN(e != cudaSuccess ? e : f);
}
cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t hStream) {
    cudaError_t e, f;
    (void)hStream;
    si_lock();
    e = si_cuda("cudaFreeAsync", true);
    if (si_launch_uses(si_alloc_of(devPtr))) si_early("cudaFreeAsync of memory that NCCL work not launched yet uses");
    f = si_free(devPtr);
    SI_RETURN(e != cudaSuccess ? e : f);
}
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* attributes, const void* ptr) {
    cudaError_t e;
    si_alloc* a;
    si_lock();
    e = si_cuda("cudaPointerGetAttributes", false);
    if (e != cudaSuccess) SI_RETURN(e);
    memset(attributes, 0, sizeof(*attributes));
    a = si_alloc_of(ptr);
    attributes->type = !a ? cudaMemoryTypeUnregistered : a->managed ? cudaMemoryTypeManaged : cudaMemoryTypeDevice;
    attributes->device = a ? a->device : -1;
    attributes->devicePointer = a ? (void*)ptr : NULL;
    attributes->hostPointer = a ? NULL : (void*)ptr;
    SI_RETURN(cudaSuccess);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
    cudaError_t e;
    si_stream* s;
    (void)kind;
    si_lock();
    e = si_cuda("cudaMemcpyAsync", true);
    if (e != cudaSuccess) SI_RETURN(e);
    s = si_stream_of(stream);
    if (!s) SI_RETURN(cudaErrorInvalidResourceHandle);
    if ((!si_alloc_of(dst) || !si_alloc_of(src)) && si_stream_busy(s)) si.stats.host_copies_on_busy_stream++;
    if (si_launch_pending_on(s)) si_early("cudaMemcpyAsync on a stream whose NCCL work is not launched yet");
    if (count) memmove(dst, src, count);
    si_queue(s, NULL);
    SI_RETURN(cudaSuccess);
}
cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
    cudaError_t e;
    si_stream* s;
    si_lock();
    e = si_cuda("cudaMemsetAsync", true);
    if (e != cudaSuccess) SI_RETURN(e);
    s = si_stream_of(stream);
    if (!s) SI_RETURN(cudaErrorInvalidResourceHandle);
    if (!si_alloc_of(devPtr)) SI_RETURN(cudaErrorInvalidValue);
    memset(devPtr, value, count);
    si_queue(s, NULL);
    SI_RETURN(cudaSuccess);
}

/* Synchronous, on the legacy default stream: it waits for every blocking stream of the device. */
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
    cudaError_t e;
    (void)kind;
    si_lock();
    e = si_cuda("cudaMemcpy", true);
    if (e == cudaSuccess) e = si_unsafe_in_capture();
    if (e == cudaSuccess) e = si_legacy_in_capture();
    if (e != cudaSuccess) SI_RETURN(e);
    si_legacy_wait("cudaMemcpy");
    if (count) memmove(dst, src, count);
    SI_RETURN(cudaSuccess);
}

/* >>devices, errors */
cudaError_t cudaGetDeviceCount(int* count) {
    cudaError_t e;
    si_lock();
    e = si_cuda("cudaGetDeviceCount", false);
    if (e == cudaSuccess) *count = si.device_count;
    SI_RETURN(e);
}
cudaError_t cudaSetDevice(int device) {
    cudaError_t e;
    si_lock();
    e = si_cuda("cudaSetDevice", false);
    if (e != cudaSuccess) SI_RETURN(e);
    if (device < 0 || device >= si.device_count) SI_RETURN(si.last = cudaErrorInvalidDevice);
    si_current = device;
    SI_RETURN(cudaSuccess);
}
cudaError_t cudaGetDevice(int* device) {
    cudaError_t e;
    si_lock();
    e = si_cuda("cudaGetDevice", false);
    if (e == cudaSuccess) *device = si_current;
    SI_RETURN(e);
}
cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device) {
    cudaError_t e;
    si_lock();
    e = si_cuda("cudaDeviceGetAttribute", false);
    if (e != cudaSuccess) SI_RETURN(e);
    if (device < 0 || device >= si.device_count) SI_RETURN(si.last = cudaErrorInvalidDevice);
    *value = attr == cudaDevAttrMemoryPoolsSupported ? si.pools : 0;
    SI_RETURN(cudaSuccess);
}
cudaError_t cudaDeviceSynchronize(void) {
    cudaError_t e;
    si_lock();
    e = si_cuda("cudaDeviceSynchronize", true);
    if (e == cudaSuccess) e = si_unsafe_in_capture();
    if (e == cudaSuccess) si_device_wait("cudaDeviceSynchronize");
    SI_RETURN(e);
}
cudaError_t cudaGetLastError(void) {
    cudaError_t e;
    si_lock();
    e = si.sticky != cudaSuccess ? si.sticky : si.last;
    si_note("cudaGetLastError");
    si.last = cudaSuccess;
    SI_RETURN(e);
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
        case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing (stand-in)";
        case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture (stand-in)";
        case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing blocking stream (stand-in)";
        case cudaErrorCapturedEvent: return "operation not permitted on an event last recorded in a capturing stream (stand-in)";
        default: return "some CUDA error (stand-in)";
    }
}

/* >>streams, events */
static cudaError_t si_stream_create(const char* fn, cudaStream_t* pStream, bool nonblocking) {
    cudaError_t e;
    si_stream* s;
    int i;
    si_lock();
    e = si_cuda(fn, true);
    if (e != cudaSuccess) SI_RETURN(e);
    i = si_slot((void* const*)si.streams);
    s = (si_stream*)calloc(1, sizeof(*s));
    if (!s) SI_RETURN(cudaErrorMemoryAllocation);
    s->device = si_current;
    s->nonblocking = nonblocking;
    si.streams[i] = s;
    si.stats.live_streams++;
    *pStream = (cudaStream_t)(void*)s;
    SI_RETURN(cudaSuccess);
}
/* A blocking stream: ordered with the legacy default stream, both ways. */
cudaError_t cudaStreamCreate(cudaStream_t* pStream) { return si_stream_create("cudaStreamCreate", pStream, false); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
    return si_stream_create("cudaStreamCreateWithFlags", pStream, (flags & cudaStreamNonBlocking) != 0);
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    cudaError_t e;
    int i, j;
    si_lock();
    e = si_cuda("cudaStreamDestroy", true);
    i = si_find((void* const*)si.streams, stream);
    if (i < 0) SI_RETURN(e != cudaSuccess ? e : cudaErrorInvalidResourceHandle);
    for (j = 0; j < SI_MAX; j++)
        if (si.events[j] && si.events[j]->stream == si.streams[i]) si.events[j]->stream = NULL;
    free(si.streams[i]);
    si.streams[i] = NULL;
    si.stats.live_streams--;
    SI_RETURN(e);
}
cudaError_t cudaStreamQuery(cudaStream_t stream) {
    cudaError_t e;
    int i;
    si_lock();
    e = si_cuda("cudaStreamQuery", true);
    i = si_find((void* const*)si.streams, stream);
    __atomic_add_fetch(&si_stream_query_calls, 1, __ATOMIC_ACQ_REL);
    if (e != cudaSuccess) SI_RETURN(e);
    if (i < 0) SI_RETURN(cudaErrorInvalidResourceHandle);
    if (si.streams[i]->capture != cudaStreamCaptureStatusNone)
        SI_RETURN(si_capture_error(si.streams[i], cudaErrorStreamCaptureUnsupported));
    SI_RETURN(!si_stream_busy(si.streams[i]) ? cudaSuccess : cudaErrorNotReady);
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
    cudaError_t e;
    si_event* ev;
    int i;
    (void)flags;
    si_lock();
    e = si_cuda("cudaEventCreateWithFlags", true);
    if (e != cudaSuccess) SI_RETURN(e);
    i = si_slot((void* const*)si.events);
    ev = (si_event*)calloc(1, sizeof(*ev));
    if (!ev) SI_RETURN(cudaErrorMemoryAllocation);
    ev->device = si_current;
    si.events[i] = ev;
    si.stats.live_events++;
    *event = (cudaEvent_t)(void*)ev;
    SI_RETURN(cudaSuccess);
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
    cudaError_t e;
    int i;
    si_lock();
    e = si_cuda("cudaEventDestroy", true);
    i = si_find((void* const*)si.events, event);
    if (i < 0) SI_RETURN(e != cudaSuccess ? e : cudaErrorInvalidResourceHandle);
    free(si.events[i]);
    si.events[i] = NULL;
    si.stats.live_events--;
    SI_RETURN(e);
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    cudaError_t e;
    int i, j;
    si_event* ev;
    si_lock();
    e = si_cuda("cudaEventRecord", true);
    i = si_find((void* const*)si.events, event);
    j = si_find((void* const*)si.streams, stream);
    if (e != cudaSuccess) SI_RETURN(e);
    if (i < 0 || j < 0) SI_RETURN(cudaErrorInvalidResourceHandle);
    ev = si.events[i];
    ev->stream = si.streams[j];
    ev->captured = ev->stream->capture != cudaStreamCaptureStatusNone;
    if (ev->captured) {         /* a graph node: nothing to wait for on the device */
        ev->pending = ev->held = false;
        SI_RETURN(cudaSuccess);
    }
    if (si_launch_pending_on(ev->stream)) si_early("cudaEventRecord on a stream whose NCCL work is not launched yet");
    ev->pending = si_stream_busy(ev->stream);
    ev->held = ev->stream->held;
    ev->until_ns = ev->stream->until_ns;
    ev->gen = ev->stream->gen;
    SI_RETURN(cudaSuccess);
}
/* Done once the work before it is: held work released since (a later hold does not count),
   and the time the work before it takes passed. */
static bool si_event_pending(const si_event* ev) {
    const si_stream* s = ev->stream;
    if (!ev->pending) return false;
    if (ev->held && s && s->held && s->gen == ev->gen) return true;
    return si_now_ns() < ev->until_ns;
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
    cudaError_t e;
    int i;
    si_event* ev;
    si_stream* s;
    si_lock();
    e = si_cuda("cudaEventQuery", true);
    i = si_find((void* const*)si.events, event);
    __atomic_add_fetch(&si_stream_query_calls, 1, __ATOMIC_ACQ_REL);
    if (e != cudaSuccess) SI_RETURN(e);
    if (i < 0) SI_RETURN(cudaErrorInvalidResourceHandle);
    ev = si.events[i];
    s = ev->stream;
    if (ev->captured) SI_RETURN(si_capture_error(NULL, cudaErrorCapturedEvent));
    if (!ev->pending) SI_RETURN(cudaSuccess);
    if (ev->held && s && s->held && s->gen == ev->gen) SI_RETURN(cudaErrorNotReady);
    if (si_now_ns() < ev->until_ns) SI_RETURN(cudaErrorNotReady);
    ev->pending = false;
    SI_RETURN(cudaSuccess);
}
/* The TCP backend's CUDA staging (linked in since the test binary has DISTMESH_TCP for
   dm_shrink's store); the NCCL tests do not reach it. */
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    cudaError_t e;
    int i;
    si_lock();
    e = si_cuda("cudaStreamSynchronize", true);
    i = si_find((void* const*)si.streams, stream);
    if (e != cudaSuccess) SI_RETURN(e);
    if (stream == NULL || stream == cudaStreamLegacy) {     /* the legacy stream: every blocking one */
        if ((e = si_legacy_in_capture()) != cudaSuccess) SI_RETURN(e);
        si_legacy_wait("cudaStreamSynchronize");
        SI_RETURN(cudaSuccess);
    }
    if (i < 0) SI_RETURN(cudaErrorInvalidResourceHandle);
    if (si.streams[i]->capture != cudaStreamCaptureStatusNone)
        SI_RETURN(si_capture_error(si.streams[i], cudaErrorStreamCaptureUnsupported));
    if (si_launch_pending_on(si.streams[i])) si_early("cudaStreamSynchronize on a stream whose NCCL work is not launched yet");
    {
        si_waiter w = { si.streams[i], NULL, si.streams[i]->device, false };
        si_block(&w, si.streams[i]->held, "cudaStreamSynchronize behind a kernel that never ends");
    }
    SI_RETURN(cudaSuccess);
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    cudaError_t e;
    int i;
    si_lock();
    e = si_cuda("cudaEventSynchronize", true);
    i = si_find((void* const*)si.events, event);
    if (e != cudaSuccess) SI_RETURN(e);
    if (i < 0) SI_RETURN(cudaErrorInvalidResourceHandle);
    if (si.events[i]->captured) SI_RETURN(si_capture_error(NULL, cudaErrorCapturedEvent));
    {
        si_event* ev = si.events[i];
        si_waiter w = { NULL, ev, ev->device, false };
        si_block(&w, ev->held && ev->stream && ev->stream->held && ev->stream->gen == ev->gen,
                 "cudaEventSynchronize behind a kernel that never ends");
        if (si_find((void* const*)si.events, ev) >= 0 && !si_event_pending(ev)) ev->pending = false;
    }
    SI_RETURN(cudaSuccess);
}
/* >>capture's calls. A graph holds the communicators whose work it captured (counted in
   live_graphs): NCCL's ncclCommDestroy / ncclCommAbort wait while such a graph is alive (its
   kernels may still be launched), so here they count a hang. */
typedef struct si_graph { si_comm* comms[4]; int n; } si_graph;
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
    cudaError_t e;
    int i;
    si_lock();
    e = si_cuda("cudaStreamBeginCapture", true);
    if (e != cudaSuccess) SI_RETURN(e);
    if (stream == NULL || stream == cudaStreamLegacy) SI_RETURN(si.last = cudaErrorStreamCaptureUnsupported);
    i = si_find((void* const*)si.streams, stream);
    if (i < 0) SI_RETURN(cudaErrorInvalidResourceHandle);
    if (si.streams[i]->capture != cudaStreamCaptureStatusNone) SI_RETURN(si.last = cudaErrorIllegalState);
    si.streams[i]->capture = cudaStreamCaptureStatusActive;
    si.streams[i]->capture_mode = mode;
    si.streams[i]->n_captured = 0;
    SI_RETURN(cudaSuccess);
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* pGraph) {
    cudaError_t e;
    int i, was;
    si_lock();
    e = si_cuda("cudaStreamEndCapture", true);
    if (e != cudaSuccess) SI_RETURN(e);
    i = si_find((void* const*)si.streams, stream);
    if (i < 0) SI_RETURN(cudaErrorInvalidResourceHandle);
    was = si.streams[i]->capture;
    if (was == cudaStreamCaptureStatusNone) SI_RETURN(si.last = cudaErrorIllegalState);
    si.streams[i]->capture = cudaStreamCaptureStatusNone;
    *pGraph = NULL;
    if (was == cudaStreamCaptureStatusInvalidated) SI_RETURN(si.last = cudaErrorStreamCaptureInvalidated);
    {
        si_graph* g = (si_graph*)calloc(1, sizeof(si_graph));
        int k;
        if (!g) SI_RETURN(cudaErrorMemoryAllocation);
        for (k = 0; k < si.streams[i]->n_captured; k++) {
            g->comms[g->n++] = si.streams[i]->captured[k];
            si.streams[i]->captured[k]->graph_refs++;
        }
        *pGraph = (cudaGraph_t)(void*)g;
    }
    si.stats.live_graphs++;
    SI_RETURN(cudaSuccess);
}
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus* pCaptureStatus) {
    cudaError_t e;
    int i;
    si_lock();
    e = si_cuda("cudaStreamIsCapturing", false);
    if (e != cudaSuccess) SI_RETURN(e);
    if (stream == NULL || stream == cudaStreamLegacy) {
        if ((e = si_legacy_in_capture()) != cudaSuccess) SI_RETURN(e);
        *pCaptureStatus = cudaStreamCaptureStatusNone;
        SI_RETURN(cudaSuccess);
    }
    i = si_find((void* const*)si.streams, stream);
    if (i < 0) SI_RETURN(cudaErrorInvalidResourceHandle);
    *pCaptureStatus = (enum cudaStreamCaptureStatus)si.streams[i]->capture;
    SI_RETURN(cudaSuccess);
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    si_lock();
    si_note("cudaGraphDestroy");
    if (!graph) SI_RETURN(cudaErrorInvalidValue);
    {
        si_graph* g = (si_graph*)(void*)graph;
        int k;
        for (k = 0; k < g->n; k++) g->comms[k]->graph_refs--;
        free(g);
    }
    si.stats.live_graphs--;
    SI_RETURN(cudaSuccess);
}
/* Pinned host memory is plain host memory here (not registered as device memory). */
cudaError_t cudaMallocHost(void** ptr, size_t size) {
    cudaError_t e;
    si_lock();
    e = si_cuda("cudaMallocHost", false);
    if (e != cudaSuccess) SI_RETURN(e);
    *ptr = malloc(size ? size : 1);
    SI_RETURN(*ptr ? cudaSuccess : cudaErrorMemoryAllocation);
}
cudaError_t cudaFreeHost(void* ptr) {
    cudaError_t e;
    si_lock();
    e = si_cuda("cudaFreeHost", false);
    free(ptr);
    SI_RETURN(e);
}

/* >>nccl communicators  Every call names its communicator: a NULL or unknown one is counted
   in stale_comm_calls, a freed one in use_after_free. Not device-bound: the queries,
   ncclGroupStart, and ncclCommAbort / ncclCommDestroy (NCCL switches to the communicator's
   device for those itself). */
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
/* Like NCCL's: the last error whatever the communicator. */
const char* ncclGetLastError(ncclComm_t comm) {
    (void)comm;
    si_lock();
    si_note("ncclGetLastError");
    SI_RETURN((const char*)si.nccl_last);
}
static void si_nccl_text(const char* fmt, const char* a, ncclResult_t r) {
    snprintf(si.nccl_last, sizeof(si.nccl_last), fmt, ncclGetErrorString(r), a);
}
/* The communicator a call names: live, or NULL after counting a stale or freed handle. */
static si_comm* si_comm_of(const char* fn, ncclComm_t comm) {
    si_comm* c;
    si_note(fn);
    if (si.call_hook) si.call_hook(fn, (void*)comm, si.call_hook_user);
    for (c = si.all; c; c = c->next_all)
        if ((void*)c == (void*)comm) break;
    if (!c) { si.stats.stale_comm_calls++; return NULL; }
    if (c->dead) {
        if (!si.stats.use_after_free++)
            snprintf(si.stats.first_use_after_free, sizeof(si.stats.first_use_after_free),
                     "%s on a communicator freed by %s", fn, c->died_in);
        return NULL;
    }
    return c;
}
static int si_env_int(const char* name, int dflt) {
    const char* s = getenv(name);
    return s && *s ? atoi(s) : dflt;
}
/* A new communicator; its config's share fields (NCCL_CONFIG_UNDEF_INT: NCCL's default, 0),
   then the environment over them (envConfigOverride). */
static si_comm* si_comm_new(int device, int rank, int nranks, const ncclConfig_t* config, si_flag* shared) {
    si_comm* c = (si_comm*)calloc(1, sizeof(*c));
    if (!c) abort();
    c->device = device;
    c->rank = rank;
    c->nranks = nranks;
    c->async = ncclSuccess;
    c->split_share = config && config->splitShare != NCCL_CONFIG_UNDEF_INT ? config->splitShare : 0;
    c->shrink_share = config && config->shrinkShare != NCCL_CONFIG_UNDEF_INT ? config->shrinkShare : 0;
    c->blocking = config && config->blocking != NCCL_CONFIG_UNDEF_INT ? config->blocking != 0 : true;
    c->blocking = si_env_int("NCCL_COMM_BLOCKING", c->blocking) != 0;
    c->split_share = si_env_int("NCCL_COMM_SPLIT_SHARE_RESOURCES", c->split_share);
    c->shrink_share = si_env_int("NCCL_COMM_SHRINK_SHARE_RESOURCES", c->shrink_share);
    c->abort_flag = shared;
    if (!c->abort_flag) {
        c->abort_flag = (si_flag*)calloc(1, sizeof(si_flag));
        if (!c->abort_flag) abort();
    }
    c->next_all = si.all;
    si.all = c;
    si.stats.live_comms++;
    return c;
}
/* >>blocking  A blocking communicator (config.blocking 1, NCCL's default, or NCCL_COMM_BLOCKING=1)
   runs NCCL's jobs on the calling thread: init, split, shrink and a group's launch return once
   done, ncclSuccess, after their time (spent under the stand-in's lock). A non-blocking one runs
   them on a thread of NCCL's (group.cc: one started per ncclGroupEnd, and per init). The time
   is wall time only, unless si_set_launch_cpu: then a launch is CPU work, spun on the calling
   thread (blocking) or on a thread started for it (non-blocking), so that getrusage sees what
   each kind of communicator costs the host. */
static void si_spin_until(int64_t until) {
    while (si_now_ns() < until) {}
}
static void si_spend(int us, bool cpu) {
    int64_t until = si_after_us(us);
    struct timespec ts;
    if (us <= 0) return;
    if (cpu) { si_spin_until(until); return; }
    ts.tv_sec = us / 1000000;
    ts.tv_nsec = (long)(us % 1000000) * 1000;
    nanosleep(&ts, NULL);
}
static void* si_launch_thread(void* arg) {
    int64_t until = *(int64_t*)arg;
    free(arg);
    si_spin_until(until);
    return NULL;
}
/* NCCL's group thread for a non-blocking launch that ends at until: started, detached, spinning. */
static void si_launch_on_a_thread(int64_t until) {
    pthread_t th;
    pthread_attr_t attr;
    int64_t* arg = (int64_t*)malloc(sizeof(int64_t));
    if (!arg) abort();
    *arg = until;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&th, &attr, si_launch_thread, arg) != 0) free(arg);
    pthread_attr_destroy(&attr);
}

/* Starts a job on c that runs for us of wall time (forever: until ncclCommAbort): c reports
   ncclInProgress until it ends. */
static void si_job_start(si_comm* c, int us, bool forever, ncclResult_t result, si_comm* child, ncclComm_t* target,
                         bool writes) {
    c->job.active = true;
    c->job.forever = forever;
    c->job.until_ns = si_after_us(us);
    c->job.result = result;
    c->job.child = child;
    c->job.target = target;
    c->job.writes = writes;
    c->async = ncclInProgress;
}
/* The job ends with result: a split or shrink writes its child (failed too), and a failure
   is left on the communicator that ran it. */
static void si_job_end(si_comm* c, ncclResult_t result) {
    si_job j = c->job;
    memset(&c->job, 0, sizeof(c->job));
    if (c->launch_pending && result == ncclSuccess) {   /* the group thread launches the work now */
        si_queue(c->launch_stream, c);
        if (c->pend_collective) c->connected = true;
        c->p2p_connected |= c->pend_peers;
    }
    c->launch_pending = false;
    c->pend_collective = false;
    c->pend_peers = 0;
    c->n_launch_bufs = 0;
    if (j.child) {
        j.child->async = result;
        if (result != ncclSuccess)
            si_nccl_text("stand-in: the new communicator failed (%s)%s", "", result);
    }
    if (j.writes) *j.target = (ncclComm_t)(void*)j.child;
    c->async = result;
}
/* A job whose time is up has ended (NCCL's thread ends it on its own; here whoever reads the
   state next sees it, whatever the number of polls before). */
static void si_job_tick(si_comm* c) {
    if (c->job.active && !c->job.forever && si_now_ns() >= c->job.until_ns) si_job_end(c, c->job.result);
}
/* c's state as ncclCommGetAsyncError reads it; a peer that died shows on a quiet communicator. */
static ncclResult_t si_state(si_comm* c) {
    si_job_tick(c);
    if (si.peer_died != ncclSuccess && c->async == ncclSuccess && !c->job.active) {
        c->async = si.peer_died;
        si_nccl_text("stand-in: a peer died (%s)%s", "", si.peer_died);
    }
    return c->async;
}
/* ncclCommEnsureReady. */
static ncclResult_t si_ensure_ready(si_comm* c) {
    ncclResult_t r;
    if (c->abort_flag->set) return ncclSuccess;
    r = si_state(c);
    if (r == ncclInProgress) {
        si.stats.used_in_progress++;
        snprintf(si.nccl_last, sizeof(si.nccl_last),
                 "stand-in: Attempt to use communicator before the previous operation returned ncclSuccess");
        return ncclInvalidArgument;     /* the state is left as it is: only si_op's caller sets it */
    }
    return r;
}
/* The resources go (counted out of live_comms); the handle is dead already. */
static void si_reclaim(si_comm* c) {
    if (c->reclaimed) return;
    c->reclaimed = true;
    c->reclaim_at_group_end = false;
    si.stats.live_comms--;
}
static void si_kill(si_comm* c, const char* by) {
    c->dead = true;
    c->launch_pending = false;          /* never launched */
    snprintf(c->died_in, sizeof(c->died_in), "%s", by);
}
/* c's kernels stop (its abort flag was set): the held work of every communicator sharing the
   flag is released. */
static void si_flag_stops_kernels(si_flag* f) {
    int i;
    for (i = 0; i < SI_MAX; i++)
        if (si.streams[i] && si.streams[i]->held && si.streams[i]->held_by &&
            si.streams[i]->held_by->abort_flag == f)
            si_release_held(si.streams[i]);
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config) {
    si_comm* c;
    ncclResult_t r;
    si_lock();
    si_note("ncclCommInitRankConfig");
    si_bound("ncclCommInitRankConfig");
    r = (ncclResult_t)si_scripted("ncclCommInitRankConfig", NULL);
    if (r != ncclSuccess && r != ncclInProgress) {   /* refused at once: *comm NULL, nothing made */
        si_nccl_text("stand-in: %s scripted for %s", "ncclCommInitRankConfig", r);
        *comm = NULL;
        SI_RETURN(r);
    }
    c = si_comm_new(si_current, rank, nranks, config, NULL);
    c->id_byte = (unsigned char)commId.internal[0];
    *comm = (ncclComm_t)(void*)c;                   /* at once (ncclCommInitRankDev) */
    if (!c->blocking && (si.init_forever || si.init_us > 0))
        si_job_start(c, si.init_us, si.init_forever, ncclSuccess, NULL, NULL, false);
    else if (c->blocking && si.init_forever)
        si_hang("ncclCommInitRankConfig of a blocking communicator whose init never ends");
    else if (c->blocking)
        si_spend(si.init_us, false);
    SI_RETURN(c->async);
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
    si_comm* c;
    ncclResult_t r;
    si_lock();
    c = si_comm_of("ncclCommGetAsyncError", comm);
    r = (ncclResult_t)si_scripted("ncclCommGetAsyncError", NULL);
    if (r != ncclSuccess) SI_RETURN(r);
    if (!c || !asyncError) SI_RETURN(ncclInvalidArgument);
    *asyncError = si_state(c);
    SI_RETURN(ncclSuccess);
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
    si_comm* c;
    si_lock();
    c = si_comm_of("ncclCommAbort", comm);
    if (!c) SI_RETURN(comm ? ncclInvalidArgument : ncclSuccess);
    si.stats.aborts++;
    if (c->graph_refs > 0) si_hang("ncclCommAbort of a communicator a live CUDA graph captured");
    c->abort_flag->set = 1;                 /* setCommAbortFlags: every sharer's kernels stop */
    si_flag_stops_kernels(c->abort_flag);
    si_job_tick(c);                         /* a job whose time was up ended well */
    if (c->job.active) si_job_end(c, ncclInternalError);  /* ncclCommEnsureReady joins it */
    /* ncclGetLastError's text stays: NCCL keeps one process-wide buffer (debug.cc ncclLastError)
       that only the next error overwrites */
    si_kill(c, "ncclCommAbort");
    if (si_depth > 0) c->reclaim_at_group_end = true;    /* the reclaim job waits for the group */
    else si_reclaim(c);
    SI_RETURN(ncclSuccess);
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    si_comm* c;
    ncclResult_t r;
    bool opens;
    si_lock();
    c = si_comm_of("ncclCommDestroy", comm);
    if (!c) SI_RETURN(comm ? ncclInvalidArgument : ncclSuccess);
    opens = si.version >= NCCL_VERSION(2, 24, 0);   /* ncclGroupStartInternal, from 2.24 on */
    if (opens) {
        si_depth++;
        si.stats.group_depth++;
    }
    r = (ncclResult_t)si_scripted("ncclCommDestroy", NULL);
    if (r != ncclSuccess) {                 /* an asynchronous error arrived since the last poll */
        si_nccl_text("stand-in: %s scripted for %s", "ncclCommDestroy", r);
        c->async = r;
    }
    r = si_ensure_ready(c);
    if (r != ncclSuccess) SI_RETURN(r);     /* no group end, nothing freed (2381 / 2182) */
    if (c->graph_refs > 0) si_hang("ncclCommDestroy of a communicator a live CUDA graph captured");
    if (opens) {
        si_depth--;
        si.stats.group_depth--;
    }
    si.stats.destroys++;
    si_kill(c, "ncclCommDestroy");
    if (si_depth > 0) c->reclaim_at_group_end = true;
    else si_reclaim(c);
    SI_RETURN(ncclSuccess);
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
    si_comm* c;
    ncclResult_t r;
    si_lock();
    c = si_comm_of("ncclCommUserRank", comm);
    if (!c) SI_RETURN(ncclInvalidArgument);
    if ((r = si_ensure_ready(c)) != ncclSuccess) SI_RETURN(r);
    *rank = c->rank;
    SI_RETURN(ncclSuccess);
}
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
    si_comm* c;
    ncclResult_t r;
    si_lock();
    c = si_comm_of("ncclCommCount", comm);
    if (!c) SI_RETURN(ncclInvalidArgument);
    if ((r = si_ensure_ready(c)) != ncclSuccess) SI_RETURN(r);
    *count = c->nranks;
    SI_RETURN(ncclSuccess);
}

/* >>nccl groups */
static void si_op_job(si_comm* c);
ncclResult_t ncclGroupStart(void) {
    si_lock();
    si_note("ncclGroupStart");
    if (si_depth++ == 0) { si_group_error = ncclSuccess; si_ngroup = 0; }
    si.stats.group_depth++;
    SI_RETURN(ncclSuccess);
}
ncclResult_t ncclGroupEnd(void) {
    ncclResult_t r;
    si_comm* c;
    int i;
    bool launched = false;
    si_lock();
    si_note("ncclGroupEnd");
    si_bound("ncclGroupEnd");
    if (si_depth == 0) {
        si.stats.stray_group_ends++;
        snprintf(si.nccl_last, sizeof(si.nccl_last), "stand-in: ncclGroupEnd: not in a group call");
        SI_RETURN(ncclInvalidUsage);
    }
    si.stats.group_depth--;
    if (--si_depth > 0) SI_RETURN(ncclSuccess);
    r = (ncclResult_t)si_scripted("ncclGroupEnd", NULL);
    if (r == ncclSuccess) r = si_group_error;
    if (r != ncclSuccess) si_nccl_text("stand-in: %s scripted for %s", "ncclGroupEnd", r);
    for (i = 0; i < si_ngroup; i++) {       /* the group's tasks: launched, or failed together */
        c = si_group[i];
        c->in_group = false;
        if (c->dead) continue;
        if (r != ncclSuccess) { c->async = r; c->launch_pending = false; }
        else { si_op_job(c); if (c->job.active) launched = true; }
    }
    si_ngroup = 0;
    for (c = si.all; c; c = c->next_all)   /* reclaims queued inside the group */
        if (c->reclaim_at_group_end) si_reclaim(c);
    if (r != ncclSuccess) SI_RETURN(r);
    SI_RETURN(launched ? ncclInProgress : ncclSuccess);
}

/* >>nccl operations  One collective or point-to-point call on comm and stream: the script,
   ncclCommEnsureReady, the stream's work, then at once (world 1), queued in the open group, or
   as a group of its own that reports ncclInProgress. */
/* Accepted: launched when the communicator's job ends (si_job_end). */
static void si_pend(si_comm* c, si_stream* s, const void* a, const void* b, int peer) {
    c->launch_pending = true;
    if (peer < 0) c->pend_collective = true;
    else if (peer < 64) c->pend_peers |= 1ULL << peer;
    c->launch_stream = s;
    if (a && c->n_launch_bufs < SI_LAUNCH_BUFS) c->launch_bufs[c->n_launch_bufs++] = a;
    if (b && c->n_launch_bufs < SI_LAUNCH_BUFS) c->launch_bufs[c->n_launch_bufs++] = b;
}
/* The group thread's job for accepted operations: "in progress" for enqueue_us; the first use
   of a peer also waits for it to arrive (NCCL 2.28 connects at first use, inside that job: a
   communicator's first collective its ring's and tree's peers, a first ncclSend/ncclRecv that
   peer): arrival_us longer, or until ncclCommAbort. */
static void si_op_job(si_comm* c) {
    int us = si.enqueue_us > 0 ? si.enqueue_us : 0;
    bool first = (c->pend_collective && c->nranks >= 2 && !c->connected) || (c->pend_peers & ~c->p2p_connected);
    bool never = first && si.never_arrive;
    if (first && si.arrival_us > 0) us += si.arrival_us;
    if (c->blocking) {                      /* on the caller's thread (>>blocking) */
        if (never) si_hang("a blocking communicator's launch waits for a peer that never arrives");
        si_spend(us, si.launch_cpu);
        si_job_start(c, 0, false, ncclSuccess, NULL, NULL, false);
        si_job_end(c, ncclSuccess);
        return;
    }
    si_job_start(c, us, never, ncclSuccess, NULL, NULL, false);
    if (us == 0 && !never) si_job_end(c, ncclSuccess);
    else if (si.launch_cpu && !never) si_launch_on_a_thread(c->job.until_ns);
}
static si_alloc* si_other_gpu(const void* p, const si_comm* c) {
    si_alloc* a = p ? si_alloc_of(p) : NULL;
    return a && !a->managed && a->device != c->device ? a : NULL;
}
static ncclResult_t si_op(const char* fn, ncclComm_t comm, cudaStream_t stream, const void* a, const void* b,
                          int peer, bool* run) {
    bool collective = peer < 0;
    si_comm* c = si_comm_of(fn, comm);
    int j = si_find((void* const*)si.streams, stream);
    ncclResult_t r;
    *run = false;
    if (!c) return ncclInvalidArgument;
    si_bound(fn);
    r = (ncclResult_t)si_scripted(fn, NULL);
    if (r != ncclSuccess) si_nccl_text("stand-in: %s scripted for %s", fn, r);
    else r = si_ensure_ready(c);
    if (r == ncclSuccess && c->abort_flag->set) {   /* another communicator's abort stopped it */
        si.stats.skipped_by_shared_abort++;
        return ncclSuccess;
    }
    if (r == ncclSuccess && j < 0) r = ncclInvalidArgument;
    if (r != ncclSuccess && r != ncclInProgress) {
        /* ncclEnqueueCheck's fail: ncclCommSetAsyncError on a non-blocking communicator -- the
           one place a refused call changes the state (split, shrink, destroy, user rank and
           count leave it) */
        c->async = r;
        if (si_depth > 0 && si_group_error == ncclSuccess) si_group_error = r;
        return r;
    }
    if (si_other_gpu(a, c) || si_other_gpu(b, c)) {     /* the kernel faults */
        si.stats.illegal_addresses++;
        si.sticky = cudaErrorIllegalAddress;
    }
    *run = true;
    if (si.streams[j]->capture != cudaStreamCaptureStatusNone) {    /* recorded into the graph */
        si_stream* cs = si.streams[j];
        int k;
        for (k = 0; k < cs->n_captured && cs->captured[k] != c; k++) {}
        if (k == cs->n_captured && k < 4) cs->captured[cs->n_captured++] = c;
    }
    if (collective && c->nranks == 1 && r == ncclSuccess && si_depth == 0) {   /* ncclLaunchOneRank */
        si_queue(si.streams[j], c);
        return ncclSuccess;
    }
    si_pend(c, si.streams[j], a, b, peer);
    if (si_depth > 0) {                     /* queued until the group ends */
        if (!c->in_group && si_ngroup < SI_GROUP_MAX) { c->in_group = true; si_group[si_ngroup++] = c; }
        return ncclSuccess;
    }
    si_op_job(c);
    return c->async;
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
    bool run;
    ncclResult_t r;
    (void)op;
    si_lock();
    r = si_op("ncclAllReduce", comm, stream, sendbuff, recvbuff, -1, &run);
    if (run) si_world1_copy(comm, recvbuff, sendbuff, count * si_type_size(datatype));
    SI_RETURN(r);
}
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    bool run;
    ncclResult_t r;
    (void)op;
    si_lock();
    r = si_op("ncclReduceScatter", comm, stream, sendbuff, recvbuff, -1, &run);
    if (run) si_world1_copy(comm, recvbuff, sendbuff, recvcount * si_type_size(datatype));
    SI_RETURN(r);
}
/* World >= 2: send goes into this rank's block; the others are the hook's (else untouched). */
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    bool run;
    ncclResult_t r;
    size_t bytes = sendcount * si_type_size(datatype);
    si_lock();
    r = si_op("ncclAllGather", comm, stream, sendbuff, recvbuff, -1, &run);
    if (run && ((si_comm*)(void*)comm)->nranks == 1) si_world1_copy(comm, recvbuff, sendbuff, bytes);
    else if (run && bytes) {
        si_comm* c = (si_comm*)(void*)comm;
        unsigned char* own = (unsigned char*)recvbuff + (size_t)c->rank * bytes;
        int p;
        if (own != sendbuff) memmove(own, sendbuff, bytes);
        for (p = 0; p < c->nranks && si.gather_hook; p++)
            if (p != c->rank) si.gather_hook(p, (unsigned char*)recvbuff + (size_t)p * bytes, own, bytes, si.gather_hook_user);
    }
    SI_RETURN(r);
}
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    bool run;
    ncclResult_t r;
    (void)root;
    si_lock();
    r = si_op("ncclBroadcast", comm, stream, sendbuff, recvbuff, -1, &run);
    if (run) si_world1_copy(comm, recvbuff, sendbuff, count * si_type_size(datatype));
    SI_RETURN(r);
}
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
    bool run;
    ncclResult_t r;
    (void)op; (void)root;
    si_lock();
    r = si_op("ncclReduce", comm, stream, sendbuff, recvbuff, -1, &run);
    if (run) si_world1_copy(comm, recvbuff, sendbuff, count * si_type_size(datatype));
    SI_RETURN(r);
}
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    bool run;
    (void)count; (void)datatype;
    si_lock();
    SI_RETURN(si_op("ncclSend", comm, stream, sendbuff, NULL, peer, &run));
}
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    bool run;
    (void)count; (void)datatype;
    si_lock();
    SI_RETURN(si_op("ncclRecv", comm, stream, recvbuff, NULL, peer, &run));
}

/* >>nccl split and shrink  ncclCommInitChildComm: the child's initialisation is a job of the
   parent; *newcomm stays NULL until it ends. A scripted result refuses the call at once. */
static ncclResult_t si_child_job(si_comm* parent, ncclComm_t* newcomm, bool make, int rank, int nranks,
                                 const ncclConfig_t* config, bool share) {
    si_comm* child = NULL;
    ncclConfig_t inherit;
    *newcomm = NULL;
    if (make) {
        if (!config) {                      /* copyCommConfig: the parent's */
            memset(&inherit, 0, sizeof(inherit));
            inherit.blocking = parent->blocking;
            inherit.splitShare = parent->split_share;
            inherit.shrinkShare = parent->shrink_share;
            config = &inherit;
        }
        child = si_comm_new(parent->device, rank, nranks, config, share ? parent->abort_flag : NULL);
    }
    si_job_start(parent, si.init_us, si.init_forever, si.child_fails, child, newcomm, true);
    if (parent->blocking && !si.init_forever) si_spend(si.init_us, false);     /* >>blocking */
    if ((si.init_us <= 0 || parent->blocking) && !si.init_forever) si_job_end(parent, parent->job.result);
    return ncclSuccess;                     /* NCCLCHECK lets the group's ncclInProgress through */
}
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
    si_comm* parent;
    ncclResult_t r;
    (void)key;
    si_lock();
    parent = si_comm_of("ncclCommSplit", comm);
    if (!parent) SI_RETURN(ncclInvalidArgument);
    si_bound("ncclCommSplit");
    r = (ncclResult_t)si_scripted("ncclCommSplit", NULL);
    if (r != ncclSuccess) si_nccl_text("stand-in: %s scripted for %s", "ncclCommSplit", r);
    else r = si_ensure_ready(parent);
    if (r != ncclSuccess) {
        *newcomm = NULL;
        SI_RETURN(r);
    }
    SI_RETURN(si_child_job(parent, newcomm, color != NCCL_SPLIT_NOCOLOR && !si.split_null, si.split_rank,
                           si.split_nranks, config, parent->split_share == 1));
}
#if !defined(SI_WITHOUT_SHRINK)
static int si_compare_ints(const void* a, const void* b) {
    int x = *(const int*)a, y = *(const int*)b;
    return (x > y) - (x < y);
}
/* The child has the parent's rank less the excluded ranks below it; the arguments are kept
   for si_last_shrink. (SI_WITHOUT_SHRINK: an NCCL 2.26 library, which has no ncclCommShrink.) */
ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm,
                            ncclConfig_t* config, int shrinkFlags) {
    si_comm* parent;
    ncclResult_t r;
    int i, below = 0;
    si_lock();
    parent = si_comm_of("ncclCommShrink", comm);
    if (!parent) SI_RETURN(ncclInvalidArgument);
    si_bound("ncclCommShrink");
    si.shrink.calls++;
    si.shrink.flags = shrinkFlags;
    si.shrink.blocking = config ? config->blocking : -1;
    si.shrink.count = excludeRanksCount;
    if (shrinkFlags & NCCL_SHRINK_ABORT)    /* abort flags set, device stream synchronized, cleared */
        si_flag_stops_kernels(parent->abort_flag);
    r = (ncclResult_t)si_scripted("ncclCommShrink", NULL);
    if (r != ncclSuccess) si_nccl_text("stand-in: %s scripted for %s", "ncclCommShrink", r);
    if (r == ncclSuccess && (!excludeRanksList || excludeRanksCount <= 0)) {
        snprintf(si.nccl_last, sizeof(si.nccl_last), "stand-in: ncclCommShrink: no ranks to exclude");
        r = ncclInvalidArgument;
    }
    if (r == ncclSuccess) {
        qsort(excludeRanksList, (size_t)excludeRanksCount, sizeof(int), si_compare_ints);
        for (i = 0; i < excludeRanksCount; i++) {
            if (i < SI_SHRINK_MAX) si.shrink.exclude[i] = excludeRanksList[i];
            if (excludeRanksList[i] == parent->rank) {
                snprintf(si.nccl_last, sizeof(si.nccl_last), "stand-in: ncclCommShrink: rank %d excludes itself",
                         parent->rank);
                r = ncclInvalidArgument;
            }
            if (excludeRanksList[i] < parent->rank) below++;
        }
    }
    if (r == ncclSuccess) r = si_ensure_ready(parent);
    if (r != ncclSuccess) SI_RETURN(r);
    SI_RETURN(si_child_job(parent, newcomm, true, parent->rank - below, parent->nranks - excludeRanksCount, config,
                           !(shrinkFlags & NCCL_SHRINK_ABORT) && parent->shrink_share == 1));
}
#endif

/* >>version, unique ids */
void si_comm_info(void* comm, int* rank, int* nranks, unsigned char* id_byte) {
    si_comm* c;
    si_lock();
    for (c = si.all; c; c = c->next_all)
        if ((void*)c == comm && !c->dead) break;
    *rank = c ? c->rank : -1;
    *nranks = c ? c->nranks : -1;
    *id_byte = c ? c->id_byte : 0;
    si_unlock();
}
ncclResult_t ncclGetVersion(int* version) {
    ncclResult_t r;
    si_lock();
    si_note("ncclGetVersion");
    r = (ncclResult_t)si_scripted("ncclGetVersion", NULL);
    if (r == ncclSuccess) *version = si.version;
    SI_RETURN(r);
}
/* Each id carries the number of the call in its first byte, for the test to follow it. */
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
    ncclResult_t r;
    si_lock();
    si_note("ncclGetUniqueId");
    r = (ncclResult_t)si_scripted("ncclGetUniqueId", NULL);
    if (r != ncclSuccess) {
        si_nccl_text("stand-in: %s scripted for %s", "ncclGetUniqueId", r);
        SI_RETURN(r);
    }
    memset(uniqueId, 0, sizeof(*uniqueId));
    uniqueId->internal[0] = (char)++si.ids;
    SI_RETURN(ncclSuccess);
}
