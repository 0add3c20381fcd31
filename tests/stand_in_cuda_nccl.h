/* The script of tests/stand_in_cuda_nccl.c: a STAND-IN for libcudart and libnccl (not CUDA,
   not NCCL), linked in their place by tests/test_nccl_standin.c so that distmesh_nccl.h's
   reactions to failures can be tested on a machine without a GPU. It behaves as NCCL 2.27 and
   2.28 do with non-blocking communicators (what it imitates, with NCCL's source lines, is at
   the top of stand_in_cuda_nccl.c).

   A test scripts results ("ncclRemoteError on the 3rd enqueue", "a sticky
   cudaErrorIllegalAddress from cudaEventQuery") and reads what the backend did: how often it
   aborted, which device was current at each call, what is still allocated, and what the real
   libraries would not forgive (a call on a freed communicator, a call while one is in
   progress, a device-wide wait behind a kernel that never ends). Every call takes one lock, so
   two threads may call it; the hooks run under that lock and must not call it back. The
   synchronous CUDA calls really block (the lock released meanwhile) until their work is done
   or released, at most a few seconds (stand_in_cuda_nccl.c, its waits section). */
#ifndef STAND_IN_CUDA_NCCL_H
#define STAND_IN_CUDA_NCCL_H

#include <stdbool.h>
#include <stddef.h>

typedef struct si_stats {
    int aborts;                 /* ncclCommAbort calls on live communicators */
    int destroys;               /* ncclCommDestroy calls that freed a communicator */
    int stale_comm_calls;       /* NCCL calls given a NULL or unknown communicator */
    int use_after_free;         /* NCCL calls given a communicator after ncclCommAbort/Destroy */
    char first_use_after_free[96];      /* "ncclCommGetAsyncError on a communicator aborted before" */
    int used_in_progress;       /* calls NCCL refuses because the communicator is in progress
                                   (ncclCommEnsureReady: "Attempt to use communicator before the
                                   previous operation returned ncclSuccess") */
    int skipped_by_shared_abort;        /* operations on a communicator whose abort flag another
                                           one's ncclCommAbort set: NCCL would skip their work */
    int hangs;                  /* device-wide or stream waits behind work that never ends on its
                                   own (they block until it is released or aborted: >>waits in
                                   stand_in_cuda_nccl.c) */
    char first_hang[96];
    int illegal_addresses;      /* operations given another GPU's memory (a kernel fault) */
    int live_comms, live_streams, live_events, live_allocs;   /* created, not yet released */
    int wrong_device_calls;     /* calls bound to a device made while another was current */
    char first_wrong_device_call[96];   /* "cudaMallocAsync on device 0 (expected 2)" */
    int host_copies_on_busy_stream;     /* host<->device copies queued behind unfinished work */
    int group_depth;            /* open ncclGroupStart (and failed ncclCommDestroy) on all threads */
    int bad_frees;              /* cudaFree / cudaFreeAsync of memory the stand-in never gave */
    int before_launch;          /* an event recorded, memory freed or a copy queued on a stream
                                   whose NCCL work is accepted but not launched yet (NCCL 2.28
                                   launches it from its group thread once "in progress" clears) */
    char first_before_launch[96];
    int unordered_with_legacy;  /* NCCL work queued on a non-blocking stream while the legacy
                                   default stream had work before it (not waited for) */
    int stray_group_ends;       /* ncclGroupEnd outside any group ("not in a group call") */
    int capture_errors;         /* CUDA calls a stream capture refused (900, 906, 907) */
    int live_graphs;            /* graphs from cudaStreamEndCapture not destroyed yet */
    int wait_bounds;            /* synchronous waits the stand-in's bound ended (a GPU would still
                                   wait: stand_in_cuda_nccl.c >>waits) */
} si_stats;

/* Clears the script and the counters (not the live objects: leaks stay visible). */
void si_reset(void);
const si_stats* si_get(void);
/* A stream's capture status (enum cudaStreamCaptureStatus: 0 none, 1 active, 2 invalidated),
   -1 for an unknown stream, asked without counting a call (cudaStreamBeginCapture /
   cudaStreamEndCapture are the test's to call: see stand_in_cuda_nccl.c >>capture). */
int si_capture_status(void* stream);
/* Calls of fn (a CUDA or NCCL function name) since si_reset. */
int si_count(const char* fn);
/* cudaStreamQuery and cudaEventQuery calls since si_reset (atomic: for another thread). */
int si_stream_queries(void);
/* Communicators with a background job of NCCL's still running (init, split, shrink, group). */
int si_pending_jobs(void);

/* The nth call of fn from now on returns code: an ncclResult_t for "nccl..." names and for
   "enqueue" (any collective, ncclSend or ncclRecv), a cudaError_t for "cuda..." names. A
   failed NCCL call leaves its communicator's asynchronous error set (NCCL's non-blocking
   communicators keep it) and NCCL's last-error text set (one text for the process, as NCCL's:
   never cleared, only overwritten by the next error). sticky:
   the CUDA error stays, every later CUDA call returns it (as after an illegal address). For
   ncclCommGetAsyncError the code is the call's own result, nothing is written. ncclCommSplit
   and ncclCommShrink: refused at once, no job, *newcomm NULL. ncclCommDestroy: the error has
   just arrived (a late asynchronous error), which its ncclCommEnsureReady then finds. */
void si_fail(const char* fn, int nth, int code, bool sticky);

/* Device-bound calls (allocations, copies, streams, events, every NCCL call that queues work,
   init and split) made while the current device is not `device` are counted; -1: no check. */
void si_expect_device(int device);
void si_set_device_count(int count);        /* default 4 */
void si_set_memory_pools(bool supported);   /* cudaDevAttrMemoryPoolsSupported, default true */
/* Work takes wall time (CLOCK_MONOTONIC), as on a GPU: each operation queued from now on keeps
   its stream busy us longer, after what the stream has already (cudaStreamQuery and the events
   recorded behind it answer cudaErrorNotReady until then, however often they are asked).
   busy: every operation (copies, memsets, NCCL work); work: NCCL work only, on top. Both
   default 0: done at once. */
void si_set_busy_us(int us);
void si_set_work_us(int us);
/* While held, NCCL work queued from now on never finishes (a kernel waiting on a dead peer):
   the stream and the events recorded behind it report cudaErrorNotReady, until the hold is
   lifted or the communicator that queued it is aborted (ncclCommAbort, or ncclCommShrink with
   NCCL_SHRINK_ABORT on it), which stops its kernels. Copies are not held by themselves. */
void si_hold_streams(bool held);
/* NCCL's background jobs (init; split and shrink children, which run as a job of the parent)
   started from now on run for us of wall time (default 1000): the communicator that runs them
   reports ncclInProgress until then, and the first look at its state after that sees the job
   ended, however many polls came before (NCCL's own thread ends it, not the polls); forever:
   they never end on their own (until ncclCommAbort). */
void si_set_init_us(int us, bool forever);
/* Operations at world >= 2 (and ncclGroupEnd) return ncclInProgress: the group's launch is a
   job of us (default 100), after which the work reaches the stream. */
void si_set_enqueue_us(int us);
/* A blocking communicator (config.blocking 1, NCCL's default; NCCL_COMM_BLOCKING=1 in the
   environment at its creation) runs init, split, shrink and a group's launch on the calling
   thread and returns ncclSuccess once they are done. With launch_cpu, a launch's time is CPU
   work: spun on the calling thread of a blocking communicator, or, for a non-blocking one, on
   a thread started for each launch (as NCCL's group thread is), so that getrusage sees both
   (bench/nccl_host_cost.c). Default off: the time passes, nothing spins. */
void si_set_launch_cpu(bool on);
/* The first use of a peer connects to it inside the operation's job (NCCL 2.28 connects at
   first use: a communicator's first collective -- distmesh's create gathers host identities --
   and the first ncclSend / ncclRecv with each peer), which stays "in progress" until the peer
   arrives: us longer, or (never) until ncclCommAbort. Default 0: they are there. */
void si_set_peer_arrival_us(int us, bool never);
/* The asynchronous error every live communicator reports from now on (any NCCL error). */
void si_set_async_error(int nccl_result);
/* A peer died, as NCCL sees it: on another node (network transport) every communicator reports
   ncclRemoteError; on the same node (shared memory, P2P) nothing is reported and the NCCL work
   queued from now on spins forever (until ncclCommAbort), as si_hold_streams(true). */
void si_peer_dies(bool same_node);
/* Split jobs with a color end writing NULL into *newcomm. */
void si_split_gives_null(bool on);
/* The rank and size of the children split jobs make from now on (default 0 of 1: the stand-in
   does not know the other ranks' colors). */
void si_set_split_child(int rank, int nranks);
/* Split and shrink jobs started from now on fail: the child is written anyway, failed, and
   the parent reports this ncclResult_t (group.cc groupCleanup). */
void si_split_child_fails(int nccl_result);
/* What ncclGetVersion reports (default: the headers' NCCL_VERSION_CODE). */
void si_set_version(int version);
/* The arguments of the last ncclCommShrink call since si_reset. */
enum { SI_SHRINK_MAX = 16 };
typedef struct si_shrink_call {
    int calls, flags, blocking, count;
    int exclude[SI_SHRINK_MAX];
} si_shrink_call;
const si_shrink_call* si_last_shrink(void);
/* A live communicator's rank and size (-1 if comm is not live) and the first byte of the
   unique id it was initialised with (ncclGetUniqueId writes its call count there). */
void si_comm_info(void* comm, int* rank, int* nranks, unsigned char* id_byte);

/* Called (under the lock) at every NCCL call that names a communicator: fn's name, the handle. */
typedef void (*si_call_hook)(const char* fn, void* comm, void* user);
void si_set_call_hook(si_call_hook hook, void* user);
/* ncclAllGather at world >= 2 copies send into the caller's block; the other ranks' blocks
   are what this hook writes (bytes each; mine: this rank's data). NULL: left as they are. */
typedef void (*si_gather_hook)(int peer, unsigned char* block, const unsigned char* mine, size_t bytes,
                               void* user);
void si_set_all_gather_peers(si_gather_hook hook, void* user);

#endif
