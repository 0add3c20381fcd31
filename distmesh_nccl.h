/* distmesh_nccl.h -- the NCCL backend of distmesh. MIT license at end of file.

   Do not include this file directly: define DISTMESH_NCCL (as a -D flag, in every TU) and include
   distmesh.h, which includes this header last. Compile with CUDA's include directory and link
   -lcudart -lnccl. The store (distmesh_store.h) comes with it for rendezvous; hosting the store
   on rank 0 needs DISTMESH_TCP too (libuv), else use a store hosted elsewhere, a file store, or
   pass the unique id.

   WHAT IT IS
   dm_nccl_create makes a communicator on this process's GPU (device = local rank % device count
   unless the desc names one, set with cudaSetDevice before init). The ncclUniqueId travels
   through the distmesh store (rank 0 publishes "<prefix>nccl_unique_id", the others wait for it)
   or is handed in by the caller (desc.unique_id, e.g. after MPI_Bcast). Communicators are
   non-blocking (ncclConfig_t.blocking = 0): init, split, shrink and every wait poll
   ncclCommGetAsyncError against the deadline, and on expiry the communicator is aborted
   (ncclCommAbort) and DM_ERR_TIMEOUT returned. What distmesh waits for has the deadline;
   ncclCommAbort and ncclCommDestroy themselves have none in NCCL (they join NCCL's threads and
   wait for the device), so a call that ends in one can outlast it. With NCCL_COMM_BLOCKING=1 in
   the environment NCCL makes the communicators blocking whatever the config says, and no
   deadline reaches into NCCL's calls.
   dm_local_rank, dm_local_world_size and dm_local come from the members' host identities (host
   name and boot id, or DISTMESH_TEST_HOST_ID), gathered at create and split (>>nccl hosts),
   as on the TCP backend; at create the launcher's LOCAL_RANK / LOCAL_WORLD_SIZE win.

   STREAM SEMANTICS
   Collectives enqueue on the object's CUDA stream (owned, or desc.stream) and return; the data
   is ready after dm_synchronize(c), which waits for the stream with the deadline. Barrier and
   the host-staged calls below synchronize before returning.

   BUFFERS
   all_reduce, reduce_scatter and the calls below take device (or managed) memory only: a host
   pointer, or device memory of another GPU than the communicator's (NCCL's kernels would fault
   on it: a sticky illegal address), is DM_ERR_INVALID_ARG with a message, before anything is
   queued (checked with cudaPointerGetAttributes).
   all_gather, all_gather_to_list and broadcast also accept host buffers, staged through a
   stream-ordered device buffer and synchronized (every copy from or to the host waits for the
   stream with the deadline first), so the core's object collectives, dm_local and
   main_process_first work on NCCL (slowly: they are for small control data). bfloat16 and MEAN
   need NCCL >= 2.10; older NCCL gives DM_ERR_UNSUPPORTED. MAX/MIN follow NCCL's NaN behaviour,
   not the core's.
   MEAN is ncclAvg, which is not the core's MEAN for floats: NCCL multiplies each rank's input
   by 1/n rounded to the dtype, then sums (integers: sums, then divides, like the core). The
   core sums (float16/bfloat16 accumulating in float32) and divides once. Where n is not a
   power of two the results differ by the rounding of 1/n: for bfloat16 on 3 ranks 1/3 rounds
   to 0.333984375, 0.2% high; float16 to 0.33325, 0.02% low; float32 and float64 differ only in
   the last bits (each product also rounds to the dtype before the sum). Doing the core's
   MEAN here would need a kernel to divide on the stream, which a header built by a C compiler
   cannot ship (and ncclRedOpCreatePreMulSum is the same pre-multiply): where the bias
   matters, all-reduce with DM_SUM and divide in your own kernel.

   FAILURES
   Once an operation has begun to queue work, every NCCL result other than success and
   ncclInProgress (a dead peer on another host shows up as ncclRemoteError on the next call;
   one on this host NCCL never reports: distmesh watches those processes itself and answers
   DM_ERR_PEER_LOST naming the rank, within about 10 ms of its death, in every wait; Linux,
   same pid namespace; >>nccl peers), every CUDA
   failure (a sticky one such as an illegal address seen by the stream or an event) and every
   deadline aborts the communicator (ncclCommAbort): started requests that had not completed
   finish with that status, and every later call returns DM_ERR_ABORTED quoting the first
   failure's message. Arguments refused before anything is queued (host pointers, dtypes, a
   rank's own all_to_all_v counts) and device memory too short for scratch leave it usable. Every call runs on
   the communicator's GPU (cudaSetDevice, checked) and gives the caller's current device back.

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
   - ncclSend / ncclRecv wait for the peer's matching call. The first ones between two ranks
     (NCCL 2.28 connects at first use, NCCL_RUNTIME_CONNECT=1 by default) wait inside NCCL's
     group job, which dm_send / dm_recv poll until it is accepted: two ranks that both dm_send
     first block inside dm_send until the deadline (DM_ERR_TIMEOUT, the communicator aborted;
     tests/test_nccl_failures.c, first_use_waits_for_peers). Once connected, the same order
     deadlocks on the GPU instead, and the next wait ends in DM_ERR_TIMEOUT. Order a pair's
     calls so one side receives first, or put both in one group (dm_all_to_all_v, whose
     ncclSend and ncclRecv share an ncclGroupStart/End).

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
   At world >= 2 every collective, ncclSend / ncclRecv and group of a non-blocking communicator
   returns ncclInProgress (NCCL 2.27, 2.28: a group thread launches the work) and distmesh polls
   ncclCommGetAsyncError until it is accepted; at world 1 NCCL runs a collective at once.
   Every poll loop (the stream, a request's event, NCCL's jobs) spins briefly, yields for 1 ms,
   then sleeps 50 us, 200 us after 4 ms, 1 ms after 16 ms: a wait for a long kernel costs the
   host about 2% of a core (the stand-in: 300 ms waited, 6-8 ms of CPU; a sched_yield loop took
   40-100%), and ends at most one sleep after its work. The first millisecond of a wait still
   costs a core (a yield returns at once when nothing else wants the core). Per call, this
   non-blocking path costs the host 1.0-1.25x what a blocking communicator's call does
   (NCCL_COMM_BLOCKING=1; calls per second and getrusage CPU, the stand-in playing NCCL's
   launch as CPU work on a thread per launch: make bench-nccl-host-cost, bench/README.md). Not
   measured on a GPU yet.

   CUDA GRAPHS
   While the object's stream captures a CUDA graph (cudaStreamBeginCapture on dm_nccl_stream(c),
   any mode; torch.compile's CUDA graphs), what only queues work is captured, as NCCL's own
   calls are: all_reduce, reduce_scatter, reduce, gather, scatter, all_to_all(_v), send, recv,
   and all_gather / broadcast / all_gather_to_list on device buffers. Scratch (in-place
   all_to_all, all_gather_to_list) needs memory pools then (cudaMallocAsync is a graph node;
   cudaMalloc would end the capture): without them such a call is refused. An _async call
   inside a capture gives a request whose dm_test / dm_wait answer DM_OK at once: its work
   belongs to the graph and runs at each cudaGraphLaunch (CUDA answers cudaErrorCapturedEvent,
   907, for its event; wait for the graph's stream after the launch instead). What waits for
   the stream on the host is refused with DM_ERR_INVALID_ARG naming the capture, before it
   touches the stream (cudaStreamQuery would answer cudaErrorStreamCaptureUnsupported, 900, and
   invalidate the capture): dm_synchronize, barrier, the host-staged calls and their _async
   starts, and a shrink without DM_SHRINK_ABORT. None of this aborts the communicator, and
   the capture stays valid (cudaStreamIsCapturing decides; a failed query counts as no
   capture). dm_destroy inside a capture does not wait for the stream; on a device without
   memory pools its cudaFree is refused by CUDA there, so destroy after the capture. NCCL's
   ncclCommDestroy waits while a graph that captured the communicator is alive: destroy the
   graphs first. Checked on the stand-in (tests/stand_in_cuda_nccl.c, its capture section), not
   yet on a GPU.

   THREADS
   A collective belongs to one thread at a time (distmesh.h's rule): its blocking calls, its
   _async calls, dm_wait / dm_test on its requests and dm_synchronize all take it, and another
   thread's call gets DM_ERR_BUSY (with requests in flight, from any thread but the issuer's).
   So no two NCCL calls on one communicator ever overlap. The calls made from another thread
   are dm_abort and dm_shrink(DM_SHRINK_ABORT), a watchdog's (or a Ctrl-C handler's): they set
   the interrupt flag, whatever holds the collective ends at its next poll with DM_ERR_ABORTED,
   and only then does the shrink run. A split or shrink that dm_abort reaches ends the same way
   wherever it waits: for NCCL's job on the parent, for the new communicator's initialisation
   (which is aborted), or, re-initialising through the store, for the unique id (the store is
   asked every 1-8 ms under the collective's deadline, not in one dm_store_get for the store's
   whole timeout): the stand-in test measures a few ms from dm_abort to the shrink's return. A
   create has no handle to abort yet; its store waits end at its deadline. After dm_abort the communicator is aborted
   (ncclCommAbort: kernels waiting on a dead peer stop, so the blocking stream, the legacy
   default stream behind it -- cudaMemcpy, torch's .cpu() -- and device-wide syncs do not wait
   forever): by the interrupted call, or, with none running, by dm_abort itself, which takes
   the collective for that (waiting, within the timeout, for a call that has not polled yet).
   After a DM_SHRINK_ABORT interrupt it is parked instead when ncclCommShrink(NCCL_SHRINK_ABORT)
   follows (no store), which stops its kernels.
   A thread stuck inside CUDA behind those kernels (cudaFree, cudaDeviceSynchronize or
   dm_cuda_synchronize, cudaStreamSynchronize on the stream, cudaMemcpy on the legacy stream:
   torch's .cpu()) is outside distmesh, so dm_abort from the watchdog finds the collective free,
   aborts the communicator itself and returns at once; the kernels stop, and the stuck call
   returns -- cudaSuccess, as the kernels ended (the data they were to produce is not there).
   Checked on the stand-in, whose synchronous calls block (tests/test_nccl_standin.c,
   watchdog_abort_frees_a_thread_stuck_in_cuda: dm_abort returns in under 1 ms, the stuck call
   right after). What does not hold on NCCL: ncclCommAbort sets the abort flags first (so the
   kernels stop) but then frees the communicator with CUDA calls of its own (cudaFree,
   cudaStreamSynchronize in commReclaim), which may wait for a driver lock the stuck thread
   holds, or behind another communicator's kernels still waiting on the dead peer (NCCL issues
   549, 564, 829: abort in sequence deadlocks): then dm_abort returns only when those do. Abort
   every communicator that waits on the dead peer, the one whose kernels hold the device first.
   Not covered either: a thread stuck inside CUDA within a distmesh call on the same collective
   (only the cudaFree of a host-staged call's scratch on a device without memory pools can be,
   behind another communicator's kernels): dm_abort cannot abort a communicator another thread
   is using, so it waits for that call's next poll, at most the collective's timeout.

   SHRINK
   Every survivor takes the same path, chosen from what they share (the NCCL loaded, the flags,
   whether there is a store), never from its own communicator's state, which after a failure
   differs between ranks (aborted by an error, alive, or still "in progress" waiting for a
   peer): DM_SHRINK_ABORT with desc.store aborts the communicator and re-initialises the
   survivors through the store; otherwise ncclCommShrink (NCCL 2.27+), and without it the
   store (>>nccl shrink). On the ncclCommShrink path a rank whose communicator a failure
   aborted, or one still in progress under DM_SHRINK_ABORT (NCCL_SHRINK_ABORT refuses it),
   fails at once (the others then wait for it until their deadline). So DM_SHRINK_ABORT
   without a store holds only on one host: there a local death (DM_ERR_PEER_LOST, >>nccl peers)
   parks the communicator instead of aborting it, and every survivor, whether it saw the death
   or not, goes into ncclCommShrink(NCCL_SHRINK_ABORT) together. On a communicator that spans
   hosts a remote death aborts some survivors (ncclRemoteError) and not others, so there
   DM_SHRINK_ABORT without a store is refused at once on every survivor (DM_ERR_UNSUPPORTED,
   the collective untouched): give it a store. NCCL has no agreement
   and cannot find dead ranks itself: every survivor must pass the same excluded ranks and
   flags, and n_exclude 0 is DM_ERR_INVALID_ARG with the collective untouched (ncclCommShrink
   refuses an empty list). After NCCL_SHRINK_DEFAULT the old communicator is destroyed, not aborted: a
   child made with NCCL_COMM_SHRINK_SHARE_RESOURCES=1 shares its abort flag. With
   NCCL_COMM_SPLIT_SHARE_RESOURCES=1 a split child and its parent share one abort flag (the
   variable overrides the config): a failure that aborts either stops the other's kernels.

   One create per store prefix: a second dm_nccl_create with the same store and prefix would read
   the first one's unique id; use dm_split for sub-groups (ncclCommSplit, no store needed).
   The keys are deleted once every rank has the id: each rank counts itself in
   "<prefix>nccl_unique_id_read" (a shrink's: "<prefix>shrink/<k>/nccl_unique_id_read"), and
   the last one deletes the id and the count; in a store the create opened itself (store_url)
   rank 0 does, once the count is full (it keeps a hosted store up until then). Not
   released: ncclGetUniqueId starts NCCL's bootstrap root (a thread and a listening socket on
   rank 0) that ends only when the ranks connect to it; a create that fails on rank 0 between
   ncclGetUniqueId and ncclCommInitRankConfig (publishing the id failed) leaves it, as NCCL
   has no call to stop it.
   Under torchrun the keys are per attempt ("<prefix>attempt/<TORCHELASTIC_RESTART_COUNT>/"):
   its agent store outlives a restart, and a restarted world must not read the dead one's id.

   VERSIONS
   The NCCL library loaded must be 2.18 or newer (ncclCommSplit, ncclConfig_t): checked at
   create (DM_ERR_UNSUPPORTED). ncclCommShrink (2.27) is a weak reference, used only where the
   library has it, so a program built with 2.27+ headers starts on an older NCCL even when
   bound at load (-z now); NCCL's symbols older than 2.18 are not weak, so there an older
   library fails to load before create can say why. ncclCommDestroy's failure path follows the
   library loaded too (its group opens only from 2.24).
   SECTIONS  Each opens with a comment that starts ">>tag" (search for it); in file order:
       >>nccl desc               dm_nccl_desc, dm_nccl_create, the CUDA device calls; the
                                 group (_dm_nccl)
       >>nccl errors             NCCL and CUDA codes into statuses, the abort rule, waits
       >>nccl peers              a local peer's death, seen through /proc (NCCL reports none)
       >>nccl capture            CUDA graph capture on the stream: what is refused
       >>nccl device             running on the communicator's device
       >>nccl types              dtypes and ops into NCCL's, device pointer checks
       >>nccl temporaries        device scratch, stream-ordered; copies
       >>nccl collectives        the collectives on the stream (_on functions)
       >>nccl groups             ncclSend/ncclRecv inside a group
       >>nccl rooted and point-to-point  reduce, gather, scatter, all_to_all, send, recv
       >>nccl slots              the vtable's entries
       >>nccl requests           _async (start; finish on CUDA events), destroy, the vtable
       >>nccl lifetime           a communicator's object, the config, NCCL's jobs, split
       >>nccl hosts              local rank and size from host identities
       >>nccl shrink             dm_shrink, interrupt; the unique id, dm_nccl_create, devices

   PRIVATE NAMES  _dm_nccl_ / _DM_NCCL_ for everything of this backend; the rest is the core's
   (distmesh.h, PRIVATE NAMES).
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
    int local_rank;             /* with world_size given: this process's rank on its node, which
                                   picks the device (dm_local_rank comes from host identities) */
    int cuda_device;            /* 0 -> local_rank % device count; d + 1 -> CUDA device d */
    struct dm_store* store;     /* borrowed: where the unique id travels; 0 -> store_url. Also
                                   dm_shrink's fallback rendezvous: keep it alive as long as the
                                   collective and the ones shrunk from it */
    const char* store_url;      /* 0 -> DISTMESH_STORE, else tcp://MASTER_ADDR:MASTER_PORT (rank 0
                                   hosts it: needs DISTMESH_TCP, else DM_ERR_UNSUPPORTED) */
    const char* prefix;         /* 0 -> "distmesh_nccl/" */
    const void* unique_id;      /* DM_NCCL_UNIQUE_ID_BYTES from ncclGetUniqueId on rank 0, shared
                                   by the caller; 0 -> through the store */
    struct CUstream_st* stream; /* 0 -> an owned stream ordered after the legacy default stream;
                                   else borrowed */
    int timeout_ms;             /* 0 -> DISTMESH_TIMEOUT or DM_DEFAULT_TIMEOUT_MS; < 0 -> forever */
    dm_logger logger;           /* 0 -> the default logger (distmesh.h dm_logger) */
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
#define _DM_NCCL_HAS_SHRINK (NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0))
/* The oldest NCCL library distmesh runs on (ncclCommSplit, ncclConfig_t.splitShare): checked at
   create. Newer symbols (ncclCommShrink, 2.27) are weak references, looked at before use, so a
   program linked against a newer NCCL and bound at load (-z now) still starts on this one. */
#define _DM_NCCL_FLOOR NCCL_VERSION(2, 18, 0)
#if _DM_NCCL_HAS_SHRINK && (defined(__GNUC__) || defined(__clang__))
#pragma weak ncclCommShrink
#endif

typedef struct _dm_nccl_token _dm_nccl_token;
/* A process of this host in the communicator, watched while distmesh waits (>>nccl peers). */
typedef struct _dm_nccl_peer {
    int rank;
    int64_t pid;
    uint64_t start;             /* its start time (/proc/<pid>/stat, field 22): a reused pid differs */
} _dm_nccl_peer;
typedef struct _dm_nccl {
    dm_collective base;
    _dm_core core;
    ncclComm_t comm;
    cudaStream_t stream;
    bool owns_stream;
    bool pools;                 /* stream-ordered allocation (cudaMallocAsync) works on the device */
    int device;
    void* scratch;              /* 16 device bytes for barrier */
    dm_status broken;           /* DM_OK, or why the communicator was aborted */
    char cause[DM_LAST_ERROR_SIZE]; /* the message of that first failure, quoted by later calls */
    _dm_nccl_token* live;       /* started requests not finished yet (>>nccl requests) */
    _dm_nccl_token* spare;      /* finished ones, kept with their events for the next start */
    int spare_count;
    int interrupt;              /* atomic; set by the interrupt slot on another thread (>>nccl shrink) */
    bool parked;                /* interrupted: comm kept only for ncclCommShrink(NCCL_SHRINK_ABORT) */
    int stopped;                /* atomic: dm_abort's ncclCommAbort has run (>>nccl shrink) */
    const struct _dm_nccl* watch;   /* while a split gathers its child's host identities (on the
                                       child): the parent, whose stop stops the child's waits */
    struct dm_store* store;     /* borrowed from the desc: the fallback shrink's rendezvous, or 0 */
    char prefix[128];           /* the desc's key prefix in that store */
    unsigned shrinks;           /* shrinks since create: the fallback's key generation */
    int* host_of;               /* per rank: the lowest rank on its host (>>nccl hosts) */
    void* deferred[4];          /* cudaMalloc'd scratch freed once the parked communicator is
                                   aborted (>>nccl temporaries) */
    int n_deferred;
    _dm_nccl_peer* peers;       /* the other members' processes on this host (>>nccl peers) */
    int n_peers;
    int64_t peers_next_ms;      /* when the next look at them is due */
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
    bool captured;              /* started while the stream captured a graph (>>nccl capture) */
    dm_status status;
};
enum { _DM_NCCL_SPARE_MAX = 64 };

/* >>nccl errors  Foreign codes are translated here only.
   The rule: once an operation has begun to queue work, any NCCL result other than ncclSuccess
   and ncclInProgress, and any CUDA failure, aborts the communicator (_dm_nccl_broke,
   _dm_nccl_cuda_broke); every later call answers DM_ERR_ABORTED quoting that first failure. A
   non-blocking communicator keeps an NCCL error (a peer that died shows up as ncclRemoteError
   on the next call), kernels already queued may wait on the GPU for a peer that is gone (the
   next device-wide CUDA call would hang), and a rank that skipped part of a collective is out
   of step with its peers: ncclCommAbort ends all three. Arguments refused before anything is
   queued (host pointers, dtypes, counts) and device memory too short for scratch leave the
   communicator usable. */
static dm_status _dm_status_from_nccl(ncclResult_t r) {
    switch (r) {
        case ncclSuccess: return DM_OK;
        case ncclInvalidArgument: case ncclInvalidUsage: return DM_ERR_INVALID_ARG;
        case ncclSystemError: case ncclRemoteError: return DM_ERR_NETWORK;
        case ncclUnhandledCudaError: return DM_ERR_CUDA;
        default: return DM_ERR_NCCL;
    }
}
/* Records r: the call's own result first; then, as context only, ncclGetLastError's text. NCCL
   keeps that text in one buffer for the whole process (debug.cc ncclLastError; comm is unused),
   written by any failure on any thread and never cleared, so it may be an older or another
   communicator's message: it is quoted after r, labelled, never as r's cause. */
static dm_status _dm_nccl_fail_on(_dm_nccl* n, ncclComm_t comm, ncclResult_t r, const char* what,
                                  uint64_t seq) {
    const char* last = ncclGetLastError(comm);
    if (!last || !last[0])
        return _DM_FAIL(&n->base, _dm_status_from_nccl(r), "nccl: %s #%llu failed: %s (%d)", what,
                        (unsigned long long)seq, ncclGetErrorString(r), (int)r);
    return _DM_FAIL(&n->base, _dm_status_from_nccl(r), "nccl: %s #%llu failed: %s (%d); NCCL's last error "
                    "(process-wide, possibly another call's): %s", what, (unsigned long long)seq,
                    ncclGetErrorString(r), (int)r, last);
}
static dm_status _dm_nccl_cuda_fail(dm_collective* c, cudaError_t e, const char* what) {
    return _DM_FAIL(c, DM_ERR_CUDA, "nccl: %s (cuda: %s)", what, cudaGetErrorString(e));
}

/* Aborts the communicator for st, whose message the caller has just recorded (it becomes the
   cause later calls quote). Only the first failure aborts. Started requests are decided first:
   those whose event has completed finished before the failure and stay DM_OK (NCCL's kernels
   end early only once ncclCommAbort runs), the others complete with st. */
static void _dm_nccl_settle(_dm_nccl* n, dm_status st) {
    _dm_nccl_token* t;
    for (t = n->live; t; t = t->next)
        if (!t->settled) {
            t->settled = true;
            t->status = t->captured || cudaEventQuery(t->event) == cudaSuccess ? DM_OK : st;
        }
    _dm_copy_name(n->cause, sizeof(n->cause), _dm_errbuf(&n->base));
    n->broken = st;
}
/* Ends the communicator with ncclCommAbort: its kernels stop (a parked one's too) and a
   background job of NCCL's on it (init, split, shrink) is joined -- ncclCommAbort runs
   ncclCommEnsureReady with the abort flag set, which joins the communicator's group job. The
   scratch whose cudaFree had to wait for that (>>nccl temporaries) is released after. */
static void _dm_nccl_drop(_dm_nccl* n) {
    int i;
    if (n->comm) ncclCommAbort(n->comm);
    n->comm = NULL;
    n->parked = false;
    for (i = 0; i < n->n_deferred; i++)
        if (cudaFree(n->deferred[i]) != cudaSuccess) cudaGetLastError();
    n->n_deferred = 0;
}
static void _dm_nccl_abort(_dm_nccl* n, dm_status st) {
    if (n->broken != DM_OK) return;
    _dm_nccl_settle(n, st);
    _dm_nccl_drop(n);
}
/* ncclCommDestroy for a communicator nothing is known to be wrong with, else ncclCommAbort. A
   destroy that fails (ncclCommEnsureReady finds an asynchronous error, or work in progress)
   returns without freeing anything; from NCCL 2.24 on it returns between its
   ncclGroupStartInternal and the matching end: ncclGroupEnd closes the group it left open (or
   every later NCCL call of this thread would join it). Before 2.24 it opens no group, and an
   ncclGroupEnd would be a stray "not in a group call" -- or close a group the caller opened --
   so the library loaded decides. Then ncclCommAbort frees the communicator. Destroy, not
   abort, where a child may share the communicator's abort flag (>>nccl lifetime). */
static void _dm_nccl_destroy_comm(ncclComm_t comm) {
    int v = 0;
    if (ncclCommDestroy(comm) == ncclSuccess) return;
    if (ncclGetVersion(&v) == ncclSuccess && v >= NCCL_VERSION(2, 24, 0)) (void)ncclGroupEnd();
    ncclCommAbort(comm);
}
static dm_status _dm_nccl_broke_at(_dm_nccl* n, ncclResult_t r, const char* what, uint64_t seq) {
    dm_status st = _dm_nccl_fail_on(n, n->comm, r, what, seq);
    _dm_nccl_abort(n, st);
    return st;
}
static dm_status _dm_nccl_broke(_dm_nccl* n, ncclResult_t r, const char* what) {
    return _dm_nccl_broke_at(n, r, what, n->base.seq);
}
/* A CUDA failure while an operation runs. What the stream or an event reports (an illegal
   address, a failed launch) is sticky: the context is lost for every request, so it aborts. */
static dm_status _dm_nccl_cuda_broke(_dm_nccl* n, cudaError_t e, const char* what) {
    dm_status st = _dm_nccl_cuda_fail(&n->base, e, what);
    cudaGetLastError();         /* clears a non-sticky error; a sticky one stays regardless */
    _dm_nccl_abort(n, st);
    return st;
}
/* An allocation before anything is queued: out of memory is the caller's to handle (the
   communicator stays usable); any other failure is the context's, and aborts. */
static dm_status _dm_nccl_cuda_alloc_fail(_dm_nccl* n, cudaError_t e, const char* what, size_t bytes) {
    if (e != cudaErrorMemoryAllocation) return _dm_nccl_cuda_broke(n, e, what);
    cudaGetLastError();         /* not sticky: clear it for the next call */
    if (!bytes)
        return _DM_FAIL(&n->base, DM_ERR_CUDA, "nccl: %s: out of device memory (cuda: %s)", what,
                        cudaGetErrorString(e));
    return _DM_FAIL(&n->base, DM_ERR_CUDA, "nccl: %s: no device memory for %zu bytes of scratch (cuda: %s)",
                    what, bytes, cudaGetErrorString(e));
}
static dm_status _dm_nccl_timed_out(_dm_nccl* n, const char* what, uint64_t seq, int timeout_ms) {
    dm_status st = _DM_FAIL(&n->base, DM_ERR_TIMEOUT, "nccl: %s #%llu timed out after %d ms; the "
                            "communicator was aborted", what, (unsigned long long)seq, timeout_ms);
    _dm_nccl_abort(n, st);
    return st;
}
/* NCCL's asynchronous state of comm. A query that fails itself (a NULL or stale handle) counts
   as that failure, so no loop polls it forever. */
static ncclResult_t _dm_nccl_async_error(ncclComm_t comm) {
    ncclResult_t async = ncclSuccess, r = ncclCommGetAsyncError(comm, &async);
    return r != ncclSuccess ? r : async;
}
/* Whether this NCCL has ncclCommShrink: at compile time, and in the library loaded (distmesh
   links libnccl.so.2, whose soname every 2.x shares: headers of 2.27+ may run on an older
   library). The symbol is weak (>>nccl desc, at the includes): a program bound at load
   (-z now) still starts on an NCCL without it, where its address is NULL. */
static bool _dm_nccl_can_shrink(void) {
#if _DM_NCCL_HAS_SHRINK
    int v = 0;
    ncclResult_t (*shrink)(ncclComm_t, int*, int, ncclComm_t*, ncclConfig_t*, int) = ncclCommShrink;
    return shrink != NULL && ncclGetVersion(&v) == ncclSuccess && v >= NCCL_VERSION(2, 27, 0);
#else
    return false;
#endif
}
/* The path every survivor of a shrink takes, from facts they share (never from the state of
   this rank's communicator, which differs between a rank that saw an error and one that only
   waited): ncclCommShrink where the NCCL loaded has it, unless DM_SHRINK_ABORT has a store to
   re-initialise through -- after a failure the survivors' communicators may be aborted on some
   ranks and alive on others, or still "in progress" (which NCCL_SHRINK_ABORT refuses), so all
   of them re-initialise. >>nccl shrink. */
static bool _dm_nccl_shrinks_natively(const _dm_nccl* n, bool abort_flag) {
    return _dm_nccl_can_shrink() && !(abort_flag && n->store);
}
/* An operation saw the interrupt slot's flag (dm_abort, or dm_shrink with DM_SHRINK_ABORT, on
   another thread): it ends with DM_ERR_ABORTED, started requests are settled as by an abort.
   The communicator is aborted (its kernels stop), unless a shrink follows that builds the
   survivors' communicator from it with ncclCommShrink(NCCL_SHRINK_ABORT), which stops its
   operations itself: then it is parked. After dm_abort (c->core->aborted) no shrink follows: a
   parked communicator's kernels, waiting on a dead peer, would hold the blocking stream and,
   behind it, the legacy default stream (cudaMemcpy) and every device-wide wait. */
static dm_status _dm_nccl_interrupted(_dm_nccl* n, const char* what, uint64_t seq) {
    dm_status st = _DM_FAIL(&n->base, DM_ERR_ABORTED, "nccl: %s #%llu was interrupted (dm_abort, or "
                            "dm_shrink with DM_SHRINK_ABORT, on another thread)", what, (unsigned long long)seq);
    bool dm_aborted = __atomic_load_n(&n->base.core->aborted, __ATOMIC_ACQUIRE) != 0;
    if (n->broken != DM_OK) return st;
    if (n->comm && !dm_aborted && _dm_nccl_shrinks_natively(n, true)) {
        _dm_nccl_settle(n, st);
        n->parked = true;
    } else {
        _dm_nccl_abort(n, st);
        if (dm_aborted) __atomic_store_n(&n->stopped, 1, __ATOMIC_RELEASE);
    }
    return st;
}
/* Whether another thread asked the running call to stop: the interrupt slot's flag, or dm_abort
   (the core's flag, which no call clears: a shrink clears the interrupt flag on entry, and its
   waits -- NCCL's job, the new communicator's init, the store -- must still end at dm_abort). */
static bool _dm_nccl_stop_asked(const _dm_nccl* n) {
    return __atomic_load_n(&n->interrupt, __ATOMIC_ACQUIRE) != 0 ||
           __atomic_load_n(&n->base.core->aborted, __ATOMIC_ACQUIRE) == 2;
}
static bool _dm_nccl_interrupt_seen(_dm_nccl* n) {
    return n->broken == DM_OK && (__atomic_load_n(&n->interrupt, __ATOMIC_ACQUIRE) != 0 ||
                                  (n->watch && _dm_nccl_stop_asked(n->watch)));
}
/* The end of a split or shrink that failed after dm_abort (the core's flag) reached it: the
   communicator, if the call left one, is aborted here, and the interrupt slot, waiting for
   that, is told (stopped) -- it need not wait for the collective to be free. */
static dm_status _dm_nccl_end_aborted(_dm_nccl* n, dm_status st) {
    if (st == DM_OK || __atomic_load_n(&n->base.core->aborted, __ATOMIC_ACQUIRE) != 2) return st;
    if (n->comm && n->broken == DM_OK) _dm_nccl_abort(n, st);
    else if (n->comm) _dm_nccl_drop(n);
    __atomic_store_n(&n->stopped, 1, __ATOMIC_RELEASE);
    return st;
}

static dm_status _dm_nccl_usable(_dm_nccl* n, const char* what) {
    if (_dm_nccl_interrupt_seen(n)) return _dm_nccl_interrupted(n, what, n->base.seq);
    if (n->broken == DM_OK && n->comm) return DM_OK;
    return _DM_FAIL(&n->base, DM_ERR_ABORTED, "nccl: %s #%llu: the communicator was aborted by an "
                    "earlier failure (%s: %s)", what, (unsigned long long)n->base.seq,
                    dm_status_name(n->broken), n->cause[0] ? n->cause : "no message");
}

/* A poll loop's pause. NCCL gives distmesh nothing to block on (no fd, no callback), so a wait
   spins briefly, yields until 1 ms, then sleeps: 50 us while the wait is under 4 ms, 200 us
   under 16 ms, then 1 ms (the engine's waits spin, yield, then block alike, distmesh_engine.h >>engine
   loop). A long kernel then costs the host about a thousand wake-ups a second instead of a
   core spinning in sched_yield, and a wait ends at most one sleep (at most 1/4 to 1/16 of what
   it has waited) after its work. start_us: when the wait began (_dm_now_us). */
static void _dm_nccl_pause(int64_t start_us) {
    int64_t idle = _dm_now_us() - start_us;
    struct timespec ts = { 0, 0 };
    if (idle < 20) { _dm_cpu_relax(); return; }
    if (idle < 1000) { sched_yield(); return; }
    ts.tv_nsec = idle < 4000 ? 50000 : idle < 16000 ? 200000 : 1000000;
    nanosleep(&ts, NULL);
}

/* >>nccl peers  NCCL reports a dead peer only through its network and proxy connections: ranks
   of one host talk over shared memory and P2P, whose kernels and proxy threads spin silently on
   a peer that was killed, so a local death would surface only at the deadline. distmesh
   watches the other members on its host itself: their process ids, start times and pid
   namespaces travel in the host identities' gather (>>nccl hosts), and every wait of distmesh's
   (the stream, a request, NCCL's job) looks at /proc/<pid>/stat of each local peer every
   _DM_NCCL_PEER_MS: gone, a zombie, or a reused pid (another start time) is a dead peer,
   DM_ERR_PEER_LOST naming the rank, and the communicator is aborted (its kernels stop).
   Only peers in this process's pid namespace are watched; where /proc is missing (not Linux)
   nothing is. A peer on another host is NCCL's to report (ncclRemoteError). */
enum { _DM_NCCL_PEER_MS = 10, _DM_NCCL_PROC_BYTES = 32 };
/* A process's state letter and start time from /proc/<pid>/stat; false if it cannot be read
   (*gone: it does not exist). */
static bool _dm_nccl_proc_stat(int64_t pid, char* state, uint64_t* start, bool* gone) {
#if defined(__linux__)
    char path[64], buf[1024], *p;
    ssize_t k;
    int fd, field;
    *gone = false;
    snprintf(path, sizeof(path), "/proc/%lld/stat", (long long)pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        *gone = errno == ENOENT || errno == ESRCH;
        return false;
    }
    k = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (k <= 0) {
        *gone = k < 0 && errno == ESRCH;
        return false;
    }
    buf[k] = 0;
    p = strrchr(buf, ')');      /* the command name may hold spaces and parentheses */
    if (!p || p[1] != ' ' || !p[2]) return false;
    *state = p[2];
    for (field = 3, p += 2; field < 22 && p; field++) {
        p = strchr(p, ' ');
        if (p) p++;
    }
    if (!p) return false;
    *start = strtoull(p, NULL, 10);
    return true;
#else
    (void)pid; (void)state; (void)start;
    *gone = false;
    return false;
#endif
}
/* This process's record for the gather: pid, start time, pid namespace (device, inode); all 0
   where they cannot be known (then no one watches it). */
static void _dm_nccl_proc_self(unsigned char rec[_DM_NCCL_PROC_BYTES]) {
    uint64_t v[4] = { 0, 0, 0, 0 };
#if defined(__linux__)
    struct stat ns;
    char state = 0;
    bool gone = false;
    uint64_t start = 0;
    if (stat("/proc/self/ns/pid", &ns) == 0 && _dm_nccl_proc_stat((int64_t)getpid(), &state, &start, &gone)) {
        v[0] = (uint64_t)getpid();
        v[1] = start;
        v[2] = (uint64_t)ns.st_dev;
        v[3] = (uint64_t)ns.st_ino;
    }
#endif
    memcpy(rec, v, sizeof(v));
}
/* The index in n->peers of a local peer found dead, or -1; at most every _DM_NCCL_PEER_MS. A
   /proc entry that cannot be read for another reason (permissions) counts as alive. */
static int _dm_nccl_peer_gone(_dm_nccl* n) {
    int64_t now;
    int i;
    if (!n->n_peers) return -1;
    now = _dm_now_ms();
    if (now < n->peers_next_ms) return -1;
    n->peers_next_ms = now + _DM_NCCL_PEER_MS;
    for (i = 0; i < n->n_peers; i++) {
        char state = 0;
        uint64_t start = 0;
        bool gone = false;
        if (_dm_nccl_proc_stat(n->peers[i].pid, &state, &start, &gone)) {
            if (state == 'Z' || state == 'X' || start != n->peers[i].start) return i;
        } else if (gone) {
            return i;
        }
    }
    return -1;
}
/* Records the loss of peer i (the caller aborts). */
static dm_status _dm_nccl_lost(_dm_nccl* n, int i, const char* what, uint64_t seq) {
    return _DM_FAIL(&n->base, DM_ERR_PEER_LOST, "nccl: %s #%llu: rank %d (pid %lld, on this host) is gone; NCCL "
                    "does not report a peer lost over shared memory or P2P (distmesh watches the ranks of its "
                    "host); the communicator was aborted", what, (unsigned long long)seq, n->peers[i].rank,
                    (long long)n->peers[i].pid);
}
/* The loss stops the communicator like an interrupt does (_dm_nccl_interrupted): aborted, or,
   where the survivors' shrink will be ncclCommShrink(NCCL_SHRINK_ABORT) without a store, parked
   for it -- an aborted communicator cannot be shrunk, and the survivors that did not wait
   (their communicators alive) take that path too, so every survivor of a single host can
   shrink. The shrink stops the parked kernels; dm_destroy or dm_abort aborts them. */
static dm_status _dm_nccl_peers_alive(_dm_nccl* n, const char* what, uint64_t seq) {
    int i = _dm_nccl_peer_gone(n);
    dm_status st;
    if (i < 0) return DM_OK;
    st = _dm_nccl_lost(n, i, what, seq);
    if (n->comm && _dm_nccl_shrinks_natively(n, true) &&
        __atomic_load_n(&n->base.core->aborted, __ATOMIC_ACQUIRE) == 0) {
        _dm_nccl_settle(n, st);
        n->parked = true;
    } else {
        _dm_nccl_abort(n, st);
    }
    return st;
}

/* >>nccl capture  While the stream captures a CUDA graph, its work is recorded, not run: NCCL's
   own calls are captured like kernels, but asking for the stream's progress ends the capture
   (cudaStreamQuery: cudaErrorStreamCaptureUnsupported, 900, and the capture is invalidated),
   an event recorded in it answers cudaErrorCapturedEvent (907), and in global capture mode
   cudaMalloc is refused too. Neither is a failure of the communicator: whatever would wait on
   the host (or needs cudaMalloc'd scratch) is refused before it touches the stream, with
   DM_ERR_INVALID_ARG naming the capture, and the communicator stays usable. A failed query
   counts as not capturing (the call then goes on as outside a capture). */
static bool _dm_nccl_capturing(_dm_nccl* n) {
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(n->stream, &cs) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return cs != cudaStreamCaptureStatusNone;
}
static dm_status _dm_nccl_no_capture(_dm_nccl* n, const char* what, const char* why) {
    if (!_dm_nccl_capturing(n)) return DM_OK;
    return _DM_FAIL(&n->base, DM_ERR_INVALID_ARG, "nccl: %s #%llu: the communicator's stream is capturing a CUDA "
                    "graph, and %s; call it outside the capture (the communicator is untouched)", what,
                    (unsigned long long)n->base.seq, why);
}
#define _DM_NCCL_HOST_WAIT "it waits for the stream on the host, which a capture forbids"

/* Polls until the communicator's pending work is accepted (and, with stream_too, the stream has
   drained), an asynchronous error shows up, or the deadline passes (then abort). Waiting for
   the stream during a capture is refused (>>nccl capture). */
static dm_status _dm_nccl_wait(_dm_nccl* n, const char* what, bool stream_too) {
    int64_t deadline = _dm_deadline(n->base.timeout_ms), t0 = _dm_now_us();
    if (!n->comm || n->broken != DM_OK) return _dm_nccl_usable(n, what);
    if (stream_too) _DM_TRY(_dm_nccl_no_capture(n, what, _DM_NCCL_HOST_WAIT));
    for (;;) {
        ncclResult_t async;
        if (_dm_nccl_interrupt_seen(n)) return _dm_nccl_interrupted(n, what, n->base.seq);
        async = _dm_nccl_async_error(n->comm);
        if (async != ncclSuccess && async != ncclInProgress) return _dm_nccl_broke(n, async, what);
        if (async == ncclSuccess) {
            cudaError_t e = stream_too ? cudaStreamQuery(n->stream) : cudaSuccess;
            if (e == cudaSuccess) return DM_OK;
            if (e != cudaErrorNotReady) return _dm_nccl_cuda_broke(n, e, what);
        }
        _DM_TRY(_dm_nccl_peers_alive(n, what, n->base.seq));
        if (_dm_now_ms() >= deadline) return _dm_nccl_timed_out(n, what, n->base.seq, n->base.timeout_ms);
        _dm_nccl_pause(t0);
    }
}
/* After enqueueing: a non-blocking communicator may answer ncclInProgress. */
static dm_status _dm_nccl_enqueued(_dm_nccl* n, ncclResult_t r, const char* what) {
    if (r == ncclSuccess) return DM_OK;
    if (r == ncclInProgress) return _dm_nccl_wait(n, what, false);
    return _dm_nccl_broke(n, r, what);
}

/* >>nccl device  Slots may run on a thread whose current device is another one (the core's
   progress thread, a caller driving several GPUs), and NCCL launches a one-rank communicator's
   kernels from the calling thread: every slot runs on the communicator's device
   (_dm_nccl_enter) and gives the caller's back afterwards (_dm_nccl_leave). A cudaSetDevice
   that fails there means the context is lost: it aborts like any CUDA failure. */
static dm_status _dm_nccl_set_device(_dm_nccl* n, int device, const char* what) {
    cudaError_t e = cudaSetDevice(device);
    dm_status st;
    if (e == cudaSuccess) return DM_OK;
    st = _DM_FAIL(&n->base, DM_ERR_CUDA, "nccl: %s #%llu: cudaSetDevice(%d) failed (cuda: %s)", what,
                  (unsigned long long)n->base.seq, device, cudaGetErrorString(e));
    cudaGetLastError();
    _dm_nccl_abort(n, st);
    return st;
}
/* To the communicator's device; *prev is the caller's (-1: unknown, nothing to give back). */
static dm_status _dm_nccl_switch(_dm_nccl* n, const char* what, int* prev) {
    if (cudaGetDevice(prev) != cudaSuccess) {
        cudaGetLastError();
        *prev = -1;
    }
    return *prev == n->device ? DM_OK : _dm_nccl_set_device(n, n->device, what);
}
static dm_status _dm_nccl_enter(_dm_nccl* n, const char* what, int* prev) {
    *prev = -1;
    _DM_TRY(_dm_nccl_usable(n, what));
    return _dm_nccl_switch(n, what, prev);
}
/* Gives the caller's device back; st is the slot's status, returned unless it is DM_OK and this
   fails. */
static dm_status _dm_nccl_leave(_dm_nccl* n, int prev, dm_status st, const char* what) {
    if (prev < 0 || prev == n->device) return st;
    if (st == DM_OK) return _dm_nccl_set_device(n, prev, what);
    if (cudaSetDevice(prev) != cudaSuccess) cudaGetLastError();   /* st's message is the one kept */
    return st;
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

/* Where a buffer lives: host memory (or memory CUDA does not know), memory NCCL's kernels on
   this communicator's GPU can read (its device memory, or managed memory, which every GPU
   reads; NULL too, which only comes with count 0), or another GPU's device memory. NCCL does not
   check pointers (unless NCCL_CHECK_POINTERS=1): its kernels would fault on the last kind, a
   sticky illegal address that loses the context. */
enum { _DM_NCCL_HOST, _DM_NCCL_HERE, _DM_NCCL_OTHER_GPU };
static int _dm_nccl_where(const _dm_nccl* n, const void* p, int* device) {
    struct cudaPointerAttributes attr;
    *device = -1;
    if (!p) return _DM_NCCL_HERE;
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
        cudaGetLastError();                 /* clear what an unknown pointer leaves */
        return _DM_NCCL_HOST;
    }
    if (attr.type == cudaMemoryTypeManaged) return _DM_NCCL_HERE;
    if (attr.type != cudaMemoryTypeDevice) return _DM_NCCL_HOST;
    *device = attr.device;
    return attr.device == n->device ? _DM_NCCL_HERE : _DM_NCCL_OTHER_GPU;
}
/* DM_OK for memory of this GPU, and for host memory where host_ok (*host says which, if asked);
   else DM_ERR_INVALID_ARG with a message, before anything is queued. */
static dm_status _dm_nccl_buffer(_dm_nccl* n, const char* what, const void* p, bool host_ok, bool* host) {
    int device;
    int w = _dm_nccl_where(n, p, &device);
    if (host) *host = w == _DM_NCCL_HOST;
    if (w == _DM_NCCL_HERE || (w == _DM_NCCL_HOST && host_ok)) return DM_OK;
    if (w == _DM_NCCL_HOST)
        return _DM_FAIL(&n->base, DM_ERR_INVALID_ARG,
                        "nccl: %s: buffer %p is host memory; NCCL needs device (or managed) memory", what, p);
    return _DM_FAIL(&n->base, DM_ERR_INVALID_ARG, "nccl: %s: buffer %p is device memory of GPU %d; this "
                    "communicator runs on GPU %d, whose kernels cannot read it", what, p, device, n->device);
}
static dm_status _dm_nccl_need_device(_dm_nccl* n, const char* what, const void* a, const void* b) {
    _DM_TRY(_dm_nccl_buffer(n, what, a, false, NULL));
    return _dm_nccl_buffer(n, what, b, false, NULL);
}


/* >>nccl temporaries  Device scratch (host staging, all_gather_to_list's block, in-place
   all_to_all(_v)'s copy, barrier's 16 bytes): stream-ordered (cudaMallocAsync, cudaFreeAsync
   after the work that uses it), so nothing waits for the whole device -- cudaFree does, and
   would hang behind another communicator's kernels waiting on a dead peer. A device without
   memory pools gets cudaMalloc, and the call then waits for its stream (with the deadline)
   before cudaFree. A parked communicator (interrupted, kept for NCCL_SHRINK_ABORT) may have
   kernels waiting on a dead peer that only its shrink or abort stops: its scratch is kept in
   deferred and freed after the abort (_dm_nccl_drop). */
static dm_status _dm_nccl_tmp_alloc(_dm_nccl* n, size_t bytes, void** p, const char* what) {
    cudaError_t e;
    *p = NULL;
#if CUDART_VERSION >= 11020
    if (n->pools) e = cudaMallocAsync(p, bytes ? bytes : 1, n->stream);     /* captured as a node */
    else
#endif
    {
        /* cudaMalloc in a capture ends it, and cudaFree would wait for the device (>>nccl capture) */
        if (n->comm) _DM_TRY(_dm_nccl_no_capture(n, what, "its device scratch needs memory pools (cudaMallocAsync) "
                                                 "in a capture; this device has none"));
        e = cudaMalloc(p, bytes ? bytes : 1);
    }
    if (e == cudaSuccess) return DM_OK;
    *p = NULL;
    return _dm_nccl_cuda_alloc_fail(n, e, what, bytes);
}
/* Releases p once the work queued so far is done with it; returns st, the call's status so far,
   or the release's failure. */
static dm_status _dm_nccl_tmp_free(_dm_nccl* n, void* p, dm_status st, const char* what) {
    dm_status w = DM_OK;
    cudaError_t e;
    if (!p) return st;
#if CUDART_VERSION >= 11020
    if (n->pools) e = cudaFreeAsync(p, n->stream);
    else
#endif
    {
        /* the wait first: an interrupt inside it parks the communicator, whose kernels may then
           never end -- so "parked" is looked at after it */
        if (n->comm && !n->parked) w = _dm_nccl_wait(n, what, true);
        if (n->parked && n->n_deferred < (int)(sizeof(n->deferred) / sizeof(n->deferred[0]))) {
            n->deferred[n->n_deferred++] = p;
            return st != DM_OK ? st : w;
        }
        if (n->parked) _dm_nccl_drop(n);    /* no room left: stop its kernels first */
        e = cudaFree(p);
    }
    if (e != cudaSuccess && st == DM_OK && w == DM_OK) return _dm_nccl_cuda_broke(n, e, what);
    if (e != cudaSuccess) cudaGetLastError();
    return st != DM_OK ? st : w;
}

/* A copy on the stream. host: src or dst is host memory; the stream is drained first, with the
   deadline, because CUDA may wait for the stream inside cudaMemcpyAsync (pageable memory either
   way), where no deadline reaches. */
static dm_status _dm_nccl_copy(_dm_nccl* n, void* dst, const void* src, size_t bytes, bool host,
                               const char* what) {
    cudaError_t e;
    if (!bytes || dst == src) return DM_OK;
    if (host) _DM_TRY(_dm_nccl_wait(n, what, true));
    e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, n->stream);
    return e == cudaSuccess ? DM_OK : _dm_nccl_cuda_broke(n, e, what);
}

/* >>nccl collectives  The _on functions run on the communicator's device (their slots, in
   >>nccl slots, switch to it). */
static dm_status _dm_nccl_all_reduce_on(_dm_nccl* n, const void* send, void* recv, size_t count,
                                        dm_dtype dtype, dm_reduce_op op) {
    ncclDataType_t nt;
    ncclRedOp_t no;
    _DM_TRY(_dm_nccl_usable(n, "all_reduce"));
    _DM_TRY(_dm_nccl_types(n, "all_reduce", dtype, &nt, 1, op, &no));
    _DM_TRY(_dm_nccl_need_device(n, "all_reduce", send, recv));
    return _dm_nccl_enqueued(n, ncclAllReduce(send, recv, count, nt, no, n->comm, n->stream), "all_reduce");
}
static dm_status _dm_nccl_reduce_scatter_on(_dm_nccl* n, const void* send, void* recv, size_t count,
                                            dm_dtype dtype, dm_reduce_op op) {
    ncclDataType_t nt;
    ncclRedOp_t no;
    _DM_TRY(_dm_nccl_usable(n, "reduce_scatter"));
    _DM_TRY(_dm_nccl_types(n, "reduce_scatter", dtype, &nt, 1, op, &no));
    _DM_TRY(_dm_nccl_need_device(n, "reduce_scatter", send, recv));
    return _dm_nccl_enqueued(n, ncclReduceScatter(send, recv, count, nt, no, n->comm, n->stream),
                             "reduce_scatter");
}

/* Host buffers for the data-movement collectives: copied into stream-ordered device scratch,
   run, copied back, synchronized; every copy from or to the host drains the stream first. */
static dm_status _dm_nccl_all_gather_on(_dm_nccl* n, const void* send, void* recv, size_t count,
                                        dm_dtype dtype) {
    ncclDataType_t nt;
    size_t block = count * dm_dtype_size(dtype), total = block * (size_t)n->base.size;
    bool host_send, host_recv;
    unsigned char* own;
    void* tmp = NULL;
    dm_status st;
    _DM_TRY(_dm_nccl_usable(n, "all_gather"));
    _DM_TRY(_dm_nccl_types(n, "all_gather", dtype, &nt, 0, DM_SUM, NULL));
    _DM_TRY(_dm_nccl_buffer(n, "all_gather", send, true, &host_send));
    _DM_TRY(_dm_nccl_buffer(n, "all_gather", recv, true, &host_recv));
    if (!host_send && !host_recv)
        return _dm_nccl_enqueued(n, ncclAllGather(send, recv, count, nt, n->comm, n->stream), "all_gather");
    _DM_TRY(_dm_nccl_no_capture(n, "all_gather", "host buffers are staged and " _DM_NCCL_HOST_WAIT));
    /* One device block of world x count, our block copied to its slot first. */
    _DM_TRY(_dm_nccl_tmp_alloc(n, total, &tmp, "all_gather (host staging)"));
    own = (unsigned char*)tmp + (size_t)n->base.rank * block;
    st = _dm_nccl_copy(n, own, send, block, host_send, "all_gather (host staging)");
    if (st == DM_OK)
        st = _dm_nccl_enqueued(n, ncclAllGather(own, tmp, count, nt, n->comm, n->stream), "all_gather");
    if (st == DM_OK) st = _dm_nccl_copy(n, recv, tmp, total, true, "all_gather (host staging)");
    if (st == DM_OK) st = _dm_nccl_wait(n, "all_gather", true);
    return _dm_nccl_tmp_free(n, tmp, st, "all_gather");
}

static dm_status _dm_nccl_broadcast_on(_dm_nccl* n, void* buf, size_t count, dm_dtype dtype, int root) {
    ncclDataType_t nt;
    size_t bytes = count * dm_dtype_size(dtype);
    void* tmp = NULL;
    dm_status st = DM_OK;
    bool host;
    _DM_TRY(_dm_nccl_usable(n, "broadcast"));
    _DM_TRY(_dm_nccl_types(n, "broadcast", dtype, &nt, 0, DM_SUM, NULL));
    _DM_TRY(_dm_nccl_buffer(n, "broadcast", buf, true, &host));
    if (!host)
        return _dm_nccl_enqueued(n, ncclBroadcast(buf, buf, count, nt, root, n->comm, n->stream), "broadcast");
    _DM_TRY(_dm_nccl_no_capture(n, "broadcast", "a host buffer is staged and " _DM_NCCL_HOST_WAIT));
    _DM_TRY(_dm_nccl_tmp_alloc(n, bytes, &tmp, "broadcast (host staging)"));
    if (n->base.rank == root) st = _dm_nccl_copy(n, tmp, buf, bytes, true, "broadcast (host staging)");
    if (st == DM_OK)
        st = _dm_nccl_enqueued(n, ncclBroadcast(tmp, tmp, count, nt, root, n->comm, n->stream), "broadcast");
    if (st == DM_OK) st = _dm_nccl_copy(n, buf, tmp, bytes, true, "broadcast (host staging)");
    if (st == DM_OK) st = _dm_nccl_wait(n, "broadcast", true);
    return _dm_nccl_tmp_free(n, tmp, st, "broadcast");
}

static dm_status _dm_nccl_barrier_on(_dm_nccl* n, bool wait) {
    _DM_TRY(_dm_nccl_usable(n, "barrier"));
    if (wait) _DM_TRY(_dm_nccl_no_capture(n, "barrier", _DM_NCCL_HOST_WAIT));
    _DM_TRY(_dm_nccl_enqueued(n, ncclAllReduce(n->scratch, n->scratch, 1, ncclFloat32, ncclSum, n->comm,
                                               n->stream), "barrier"));
    return wait ? _dm_nccl_wait(n, "barrier", true) : DM_OK;
}
static void* _dm_nccl_native(dm_collective* c) { return ((_dm_nccl*)c)->comm; }

/* >>nccl groups  ncclSend/ncclRecv inside ncclGroupStart/End. Calls inside a group only queue
   (a failure may show at once or at ncclGroupEnd); the group is always ended, or every later
   NCCL call of this thread would join it. */
static void _dm_nccl_note(ncclResult_t* first, ncclResult_t r) {
    if (r != ncclSuccess && r != ncclInProgress && *first == ncclSuccess) *first = r;
}
static dm_status _dm_nccl_group_end(_dm_nccl* n, ncclResult_t first, const char* what) {
    ncclResult_t r = ncclGroupEnd();
    if (first == ncclSuccess && r != ncclInProgress) first = r;
    if (first != ncclSuccess) return _dm_nccl_broke(n, first, what);
    /* non-blocking communicator: wait until the group is queued */
    return r == ncclInProgress ? _dm_nccl_wait(n, what, false) : DM_OK;
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
    _DM_TRY(_dm_nccl_copy(n, own, send, bytes, false, "gather: copying the root's block"));
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
    _DM_TRY(_dm_nccl_copy(n, recv, own, bytes, false, "scatter: copying the root's block"));
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
        if (send_end) _DM_TRY(_dm_nccl_need_device(n, what, recv, NULL));
        if (send_end) {
            _DM_TRY(_dm_nccl_tmp_alloc(n, send_end * es, &tmp, what));
            st = _dm_nccl_copy(n, tmp, recv, send_end * es, false, what);
            if (st != DM_OK) return _dm_nccl_tmp_free(n, tmp, st, what);
        }
        src = (const unsigned char*)tmp;
    }
    st = DM_OK;
    if (send_end) st = _dm_nccl_need_device(n, what, src, NULL);
    if (st == DM_OK && recv_end) st = _dm_nccl_need_device(n, what, dst, NULL);
    if (st == DM_OK)
        st = _dm_nccl_copy(n, dst + _dm_nccl_off(ro, me, count) * es, src + _dm_nccl_off(so, me, count) * es,
                           _dm_nccl_cnt(sc, me, count) * es, false, what);
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
    bool host_send, host, host_recv;
    unsigned char* block;
    void* tmp = NULL;
    dm_status st = DM_OK;
    int r;
    _DM_TRY(_dm_nccl_usable(n, "all_gather_to_list"));
    if (!bytes) return DM_OK;   /* every rank skips it alike */
    _DM_TRY(_dm_nccl_buffer(n, "all_gather_to_list", send, true, &host_send));
    host = host_send;
    for (r = 0; r < n->base.size; r++) {
        _DM_TRY(_dm_nccl_buffer(n, "all_gather_to_list", recvs[r], true, &host_recv));
        host = host || host_recv;
    }
    if (host) _DM_TRY(_dm_nccl_no_capture(n, "all_gather_to_list", "host buffers are staged and " _DM_NCCL_HOST_WAIT));
    host = host_send;
    _DM_TRY(_dm_nccl_tmp_alloc(n, total, &tmp, "all_gather_to_list"));
    block = (unsigned char*)tmp;
    if (host_send) {            /* into our slot of the block first */
        st = _dm_nccl_copy(n, block + (size_t)n->base.rank * bytes, send, bytes, true,
                           "all_gather_to_list (host staging)");
        send = block + (size_t)n->base.rank * bytes;
    }
    if (st == DM_OK)
        st = _dm_nccl_enqueued(n, ncclAllGather(send, block, bytes, ncclUint8, n->comm, n->stream),
                               "all_gather_to_list");
    for (r = 0; r < n->base.size && st == DM_OK; r++) {
        (void)_dm_nccl_buffer(n, "all_gather_to_list", recvs[r], true, &host_recv);   /* checked above */
        host = host || host_recv;
        st = _dm_nccl_copy(n, recvs[r], block + (size_t)r * bytes, bytes, host_recv,
                           "all_gather_to_list: copying a block out");
    }
    if (st == DM_OK && host) st = _dm_nccl_wait(n, "all_gather_to_list", true);
    return _dm_nccl_tmp_free(n, tmp, st, "all_gather_to_list");
}

/* >>nccl slots  The vtable's entries: each runs its _on function on the communicator's device. */
/* A slot's body: call (an _on function of n, the slot's object) runs on the communicator's
   device, between _dm_nccl_enter and _dm_nccl_leave; its status is returned. */
#define _DM_NCCL_ON_DEVICE(c, what, call)                               \
    do {                                                                \
        _dm_nccl* n = (_dm_nccl*)(c);                                   \
        int prev_;                                                      \
        dm_status st_ = _dm_nccl_enter(n, (what), &prev_);              \
        if (st_ == DM_OK) st_ = (call);                                 \
        return _dm_nccl_leave(n, prev_, st_, (what));                   \
    } while (0)
static dm_status _dm_nccl_all_reduce(dm_collective* c, const void* send, void* recv, size_t count,
                                     dm_dtype dtype, dm_reduce_op op) {
    _DM_NCCL_ON_DEVICE(c, "all_reduce", _dm_nccl_all_reduce_on(n, send, recv, count, dtype, op));
}
static dm_status _dm_nccl_reduce_scatter(dm_collective* c, const void* send, void* recv, size_t count,
                                         dm_dtype dtype, dm_reduce_op op) {
    _DM_NCCL_ON_DEVICE(c, "reduce_scatter", _dm_nccl_reduce_scatter_on(n, send, recv, count, dtype, op));
}
static dm_status _dm_nccl_all_gather(dm_collective* c, const void* send, void* recv, size_t count,
                                     dm_dtype dtype) {
    _DM_NCCL_ON_DEVICE(c, "all_gather", _dm_nccl_all_gather_on(n, send, recv, count, dtype));
}
static dm_status _dm_nccl_broadcast(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int root) {
    _DM_NCCL_ON_DEVICE(c, "broadcast", _dm_nccl_broadcast_on(n, buf, count, dtype, root));
}
static dm_status _dm_nccl_barrier(dm_collective* c) {
    _DM_NCCL_ON_DEVICE(c, "barrier", _dm_nccl_barrier_on(n, true));
}
static dm_status _dm_nccl_synchronize(dm_collective* c) {
    _DM_NCCL_ON_DEVICE(c, "synchronize", _dm_nccl_wait(n, "synchronize", true));
}
static dm_status _dm_nccl_reduce(dm_collective* c, const void* send, void* recv, size_t count,
                                 dm_dtype dtype, dm_reduce_op op, int root) {
    _DM_NCCL_ON_DEVICE(c, "reduce", _dm_nccl_reduce_on(n, send, recv, count, dtype, op, root));
}
static dm_status _dm_nccl_gather(dm_collective* c, const void* send, void* recv, size_t count,
                                 dm_dtype dtype, int root) {
    _DM_NCCL_ON_DEVICE(c, "gather", _dm_nccl_gather_on(n, send, recv, count, dtype, root));
}
static dm_status _dm_nccl_scatter(dm_collective* c, const void* send, void* recv, size_t count,
                                  dm_dtype dtype, int root) {
    _DM_NCCL_ON_DEVICE(c, "scatter", _dm_nccl_scatter_on(n, send, recv, count, dtype, root));
}
static dm_status _dm_nccl_all_to_all_v(dm_collective* c, const void* send, const size_t* send_counts,
                                       const size_t* send_offsets, void* recv, const size_t* recv_counts,
                                       const size_t* recv_offsets, dm_dtype dtype) {
    _DM_NCCL_ON_DEVICE(c, "all_to_all_v", _dm_nccl_exchange(n, "all_to_all_v", send, send_counts, send_offsets, recv,
                                                            recv_counts, recv_offsets, 0, dtype));
}
static dm_status _dm_nccl_send(dm_collective* c, const void* buf, size_t count, dm_dtype dtype, int peer,
                               int tag) {
    (void)tag;
    _DM_NCCL_ON_DEVICE(c, "send", _dm_nccl_send_on(n, buf, count, dtype, peer));
}
static dm_status _dm_nccl_recv(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int peer, int tag) {
    (void)tag;
    _DM_NCCL_ON_DEVICE(c, "recv", _dm_nccl_recv_on(n, buf, count, dtype, peer));
}
static dm_status _dm_nccl_all_gather_to_list(dm_collective* c, const void* send, void* const* recvs,
                                             size_t count, dm_dtype dtype) {
    _DM_NCCL_ON_DEVICE(c, "all_gather_to_list", _dm_nccl_all_gather_to_list_on(n, send, recvs, count, dtype));
}
#undef _DM_NCCL_ON_DEVICE

/* >>nccl requests  start queues the operation on the stream as the blocking slot does (those
   on device memory do not wait; host-staged ones and, without memory pools, the ones needing
   scratch complete before start returns), records an event after it and returns a token
   holding the event. finish polls the event, NCCL's asynchronous error and the request's
   deadline (the collective's timeout counted from start); a failure (a sticky CUDA error from
   the event included) or the deadline aborts the communicator (ncclCommAbort) like a blocking
   wait. It polls instead of cudaEventSynchronize so that a peer's failure or the deadline ends
   the wait. Object collectives and split return DM_ERR_UNSUPPORTED, recording nothing: the core
   runs them. */
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
    size_t bytes = op->count * dm_dtype_size(op->dtype);
    int me = n->base.rank;
    switch (op->kind) {
        case DM_OP_BARRIER:
            return _dm_nccl_barrier_on(n, false);
        case DM_OP_ALL_REDUCE:
            return _dm_nccl_all_reduce_on(n, op->send ? op->send : op->recv, op->recv, op->count, op->dtype, op->op);
        case DM_OP_ALL_GATHER:
            return _dm_nccl_all_gather_on(n, op->send ? op->send : (unsigned char*)op->recv + (size_t)me * bytes,
                                          op->recv, op->count, op->dtype);
        case DM_OP_ALL_GATHER_TO_LIST:
            return _dm_nccl_all_gather_to_list_on(n, op->send ? op->send : op->recvs[me], op->recvs,
                                                  op->count, op->dtype);
        case DM_OP_REDUCE_SCATTER:
            return _dm_nccl_reduce_scatter_on(n, op->send, op->recv, op->count, op->dtype, op->op);
        case DM_OP_BROADCAST:   /* the buffer travels in send (recv accepted too) */
            return _dm_nccl_broadcast_on(n, op->send ? (void*)op->send : op->recv, op->count, op->dtype, op->root);
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
            _dm_nccl_cuda_alloc_fail(n, e, "creating a request's event", 0);
            return NULL;
        }
    }
    t->prev = t->next = NULL;
    t->settled = t->captured = false;
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
    _DM_TRY(_dm_nccl_enter(n, what, &prev));
    t = _dm_nccl_token_get(n, what);
    st = t ? _dm_nccl_issue(n, op) : DM_ERR_OUT_OF_MEMORY;
    if (st == DM_OK) {
        cudaError_t e;
        t->captured = _dm_nccl_capturing(n);    /* then the event is a graph node (>>nccl capture) */
        e = cudaEventRecord(t->event, n->stream);
        if (e != cudaSuccess) st = _dm_nccl_cuda_broke(n, e, "recording a request's event");
    }
    if (st != DM_OK) {
        if (t) _dm_nccl_token_release(n, t);
        return _dm_nccl_leave(n, prev, st, what);
    }
    t->deadline = deadline;
    t->timeout_ms = c->timeout_ms;
    t->seq = c->seq;
    t->what = what;
    t->next = n->live;
    if (n->live) n->live->prev = t;
    n->live = t;
    /* Queued: a failure giving the device back aborts, which settles t; finish reports it. */
    (void)_dm_nccl_leave(n, prev, DM_OK, what);
    *token = t;
    return DM_OK;
}

static dm_status _dm_nccl_finish(dm_collective* c, void* token, bool block, bool* done) {
    _dm_nccl* n = (_dm_nccl*)c;
    _dm_nccl_token* t = (_dm_nccl_token*)token;
    const char* what = t->what;
    bool reported = false;      /* this call recorded the failure's message */
    int64_t t0 = _dm_now_us();
    dm_status st;
    int prev;
    if (done) *done = false;
    /* A failed switch aborts, which settles t; the message below then quotes the first cause. */
    (void)_dm_nccl_switch(n, what, &prev);
    if (t->captured && !t->settled) {   /* its work is the graph's: queued is all it does here */
        t->settled = true;
        t->status = DM_OK;
    }
    while (!t->settled) {
        cudaError_t e = cudaEventQuery(t->event);
        ncclResult_t async;
        if (e == cudaSuccess) {
            t->settled = true;
            t->status = DM_OK;
            break;
        }
        if (e != cudaErrorNotReady) {   /* sticky (an illegal address, a failed kernel): abort */
            char msg[96];
            snprintf(msg, sizeof(msg), "%s #%llu", what, (unsigned long long)t->seq);
            t->settled = true;
            t->status = DM_ERR_CUDA;
            _dm_nccl_cuda_broke(n, e, msg);
            reported = true;
            break;
        }
        if (!n->comm || n->broken != DM_OK) {   /* not reached: an abort settles every live token */
            t->settled = true;
            t->status = n->broken != DM_OK ? n->broken : DM_ERR_ABORTED;
            break;
        }
        if (_dm_nccl_interrupt_seen(n)) {       /* settles t: DM_OK if its event completed */
            _dm_nccl_interrupted(n, what, t->seq);
            reported = true;
            break;
        }
        async = _dm_nccl_async_error(n->comm);
        if (async != ncclSuccess && async != ncclInProgress) {
            st = _dm_nccl_broke_at(n, async, what, t->seq);
            t->settled = true;
            t->status = st;     /* even if its event completed in between: reported as failed */
            reported = true;
            break;
        }
        if (_dm_nccl_peers_alive(n, what, t->seq) != DM_OK) {   /* the abort settled t */
            reported = true;
            break;
        }
        if (_dm_now_ms() >= t->deadline) {
            /* the abort decides t: DM_OK if its event completed in the meantime */
            _dm_nccl_timed_out(n, what, t->seq, t->timeout_ms);
            reported = true;
            break;
        }
        if (!block) return _dm_nccl_leave(n, prev, DM_OK, what);
        _dm_nccl_pause(t0);
    }
    st = t->status;
    if (st != DM_OK && !reported)
        _DM_FAIL(c, st, "nccl: %s #%llu did not complete: the communicator was aborted by a failure (%s: %s)",
                 what, (unsigned long long)t->seq, dm_status_name(st), n->cause);
    if (t->prev) t->prev->next = t->next;
    else n->live = t->next;
    if (t->next) t->next->prev = t->prev;
    _dm_nccl_token_release(n, t);
    if (done) *done = true;
    return _dm_nccl_leave(n, prev, st, what);
}

static void _dm_nccl_destroy(dm_collective* c) {
    _dm_nccl* n = (_dm_nccl*)c;
    dm_allocator a = c->allocator;
    int prev = -1, device = n->device;
    /* Let queued work finish (within the deadline) before the communicator goes; a wait that
       fails aborts it, as does a failed switch to its device. A parked one is aborted. */
    bool on_device = _dm_nccl_switch(n, "destroy", &prev) == DM_OK;
    if (n->comm && n->broken == DM_OK && on_device &&
        _dm_nccl_wait(n, "destroy", n->stream != NULL && !_dm_nccl_capturing(n)) == DM_OK) {
        _dm_nccl_destroy_comm(n->comm);
        n->comm = NULL;
    }
    _dm_nccl_drop(n);
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
    /* Return codes are not acted on below: there is nothing left to abort, and after a sticky
       error the context itself holds what could not be released. */
    if (n->scratch) {
#if CUDART_VERSION >= 11020
        if (n->pools) cudaFreeAsync(n->scratch, n->stream);
        else
#endif
            cudaFree(n->scratch);
    }
    if (n->owns_stream && n->stream) cudaStreamDestroy(n->stream);
    cudaGetLastError();
    _dm_free(&a, n->host_of);
    _dm_free(&a, n->peers);
    _dm_free(&a, n);
    if (prev >= 0 && prev != device && cudaSetDevice(prev) != cudaSuccess) cudaGetLastError();
}

static dm_status _dm_nccl_split(dm_collective* c, int color, int key, dm_collective** out);
static dm_status _dm_nccl_shrink(dm_collective* c, const bool* gone, int flags, dm_collective** out);
static void _dm_nccl_interrupt(dm_collective* c);

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
    _dm_nccl_shrink,                 /* shrink: ncclCommShrink (2.27+), else re-init via the store */
    NULL,                            /* grow */
    _dm_nccl_interrupt,              /* interrupt: a flag the running wait polls; dm_abort aborts */
    NULL,                            /* recv_any: NCCL has no receive from any source */
};

/* >>nccl lifetime  A communicator's object; the config, NCCL's background jobs, split. */
static _dm_nccl* _dm_nccl_new(const dm_allocator* a, const dm_logger* lg, int rank, int size,
                              int timeout_ms, int device, cudaStream_t stream) {
    _dm_nccl* n = (_dm_nccl*)_dm_calloc(a, sizeof(_dm_nccl));
    if (!n) return NULL;
    _dm_collective_init(&n->base, &n->core, &_dm_nccl_vtable, rank, size, timeout_ms, lg, a);
    n->base.shrink_needs_exclude = true;    /* >>nccl shrink: NCCL cannot find the dead itself */
    n->device = device;
    n->base.device.type = DM_DEVICE_CUDA;
    n->base.device.index = device;
    n->stream = stream;
    return n;
}
/* The config of every communicator distmesh makes. Non-blocking: init, split and shrink return
   at once and their work runs as NCCL's background job, which distmesh polls under the
   deadline. No resources shared with the parent: a child that shares them shares the parent's
   abort flag (init.cc ncclCommInitChildComm), so aborting either stops the other's kernels. 0 is
   NCCL's default already, but NCCL_COMM_SPLIT_SHARE_RESOURCES / NCCL_COMM_SHRINK_SHARE_RESOURCES
   override the config (init.cc envConfigOverride): so a healthy parent is never aborted once a
   shrink made its child, it is destroyed (>>nccl shrink). With the split variable set, a split
   child and its parent stop together when a failure aborts either (NCCL's design). */
static void _dm_nccl_config(ncclConfig_t* config) {
    config->blocking = 0;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
    config->splitShare = 0;
#endif
#if _DM_NCCL_HAS_SHRINK
    config->shrinkShare = 0;
#endif
}
/* Stream and scratch for a new object (on its device); the communicator comes after. */
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
    _DM_TRY(_dm_nccl_tmp_alloc(n, 16, &n->scratch, "allocating scratch"));
    /* on the stream: cudaMemset would queue on the legacy default stream, behind every other
       blocking stream of the device */
    e = cudaMemsetAsync(n->scratch, 0, 16, n->stream);
    return e == cudaSuccess ? DM_OK : _dm_nccl_cuda_fail(&n->base, e, "clearing scratch");
}

/* NCCL's background job on the parent. ncclCommSplit and ncclCommShrink (2.27, 2.28:
   ncclCommInitChildComm) set *newcomm to NULL, launch the child's initialisation as a job of
   the parent and return ncclSuccess; the parent answers ncclInProgress until the job is over,
   and the job stores the child into *newcomm when it ends, whether it succeeded or not (a
   failed child also leaves its error on the parent). This polls the parent until then. On an
   error, the deadline or an interrupt it returns the failure (recorded), and the caller must
   abort the parent first -- ncclCommAbort joins the job -- and only then look at *newcomm, which
   it aborts too: returning while the job runs would leak the child and let NCCL write into a
   stack frame that is gone. A parked parent (an interrupted wait) is polled the same way. */
static dm_status _dm_nccl_job_wait(_dm_nccl* n, const char* what) {
    int64_t deadline = _dm_deadline(n->base.timeout_ms), t0 = _dm_now_us();
    unsigned long long seq = (unsigned long long)n->base.seq;
    for (;;) {
        ncclResult_t r = _dm_nccl_async_error(n->comm);
        if (r == ncclSuccess) return DM_OK;
        if (r != ncclInProgress) return _dm_nccl_fail_on(n, n->comm, r, what, n->base.seq);
        if (_dm_nccl_stop_asked(n))
            return _DM_FAIL(&n->base, DM_ERR_ABORTED, "nccl: %s #%llu was interrupted (dm_abort, or dm_shrink "
                            "with DM_SHRINK_ABORT, on another thread); the communicator was aborted", what, seq);
        {
            int gone = _dm_nccl_peer_gone(n);
            if (gone >= 0) return _dm_nccl_lost(n, gone, what, n->base.seq);
        }
        if (_dm_now_ms() >= deadline)
            return _DM_FAIL(&n->base, DM_ERR_TIMEOUT, "nccl: %s #%llu timed out after %d ms; the "
                            "communicator was aborted", what, seq, n->base.timeout_ms);
        _dm_nccl_pause(t0);
    }
}

/* A new communicator finishes its own initialisation under the deadline: an init's (the
   fallback shrink's ncclCommInitRankConfig runs as a job of the new communicator itself), and
   a split's or shrink's child, ready once its parent's job is over on 2.27+. On a failure, at
   the deadline or when another thread asks n's call to stop (dm_abort, DM_SHRINK_ABORT) it is
   aborted, after NCCL's error text has been read (quoted as context, >>nccl errors); the parent is not
   touched. */
static dm_status _dm_nccl_child_ready(_dm_nccl* n, ncclComm_t child, const char* what) {
    int64_t deadline = _dm_deadline(n->base.timeout_ms), t0 = _dm_now_us();
    ncclResult_t r;
    dm_status st;
    char msg[96];
    bool stop = false;
    while ((r = _dm_nccl_async_error(child)) == ncclInProgress && _dm_now_ms() < deadline &&
           !(stop = _dm_nccl_stop_asked(n)))
        _dm_nccl_pause(t0);
    if (r == ncclSuccess) return DM_OK;
    if (r == ncclInProgress && stop) {
        st = _DM_FAIL(&n->base, DM_ERR_ABORTED, "nccl: %s #%llu was interrupted (dm_abort, or dm_shrink with "
                      "DM_SHRINK_ABORT, on another thread) while the new communicator initialised; it was aborted",
                      what, (unsigned long long)n->base.seq);
    } else if (r == ncclInProgress) {
        st = _DM_FAIL(&n->base, DM_ERR_TIMEOUT, "nccl: %s #%llu timed out after %d ms; the new "
                      "communicator was aborted", what, (unsigned long long)n->base.seq, n->base.timeout_ms);
    } else {
        snprintf(msg, sizeof(msg), "%s: initialising the new communicator", what);
        st = _dm_nccl_fail_on(n, child, r, msg, n->base.seq);
    }
    ncclCommAbort(child);
    return st;
}

static dm_status _dm_nccl_hosts(_dm_nccl* n);
static dm_status _dm_nccl_hosts_of_members(_dm_nccl* m, const _dm_nccl* n, const int* members);

/* A new object around comm (ready), rank of size, on n's device, with n's timeout, logger,
   allocator and node name; stream 0 -> an owned one. On failure comm is released and n's last
   error says why: destroyed, not aborted, while nothing is wrong with it (it may share n's
   abort flag, >>nccl lifetime). */
static dm_status _dm_nccl_adopt(_dm_nccl* n, ncclComm_t comm, int rank, int size, cudaStream_t stream,
                                const char* what, dm_collective** out) {
    dm_collective* c = &n->base;
    dm_status st;
    _dm_nccl* m = _dm_nccl_new(&c->allocator, &c->logger, rank, size, c->timeout_ms, n->device, stream);
    if (!m) {
        _dm_nccl_destroy_comm(comm);
        return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "nccl: %s: out of memory", what);
    }
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

/* Split (see _dm_nccl_job_wait): a failure of the parent's part -- refused at once, or reported
   by its job -- aborts the parent, then the child the job wrote, if any. The child gathers its
   members' host identities before it is handed out. */
static dm_status _dm_nccl_split_on(_dm_nccl* n, int color, int key, dm_collective** out) {
    dm_collective* c = &n->base;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    ncclComm_t comm = NULL;
    int rank = 0, size = 0;
    ncclResult_t r;
    dm_status st;
    _DM_TRY(_dm_nccl_usable(n, "split"));
    _dm_nccl_config(&config);
    r = ncclCommSplit(n->comm, color == DM_SPLIT_NONE ? NCCL_SPLIT_NOCOLOR : color, key, &comm, &config);
    if (r == ncclSuccess || r == ncclInProgress) st = _dm_nccl_job_wait(n, "split");
    else st = _dm_nccl_fail_on(n, n->comm, r, "split", c->seq);
    if (st != DM_OK) {
        _dm_nccl_abort(n, st);          /* joins NCCL's job: comm is final from here on */
        if (comm) ncclCommAbort(comm);
        return st;
    }
    if (color == DM_SPLIT_NONE) return DM_OK;
    if (!comm)
        return _DM_FAIL(c, DM_ERR_NCCL, "nccl: split #%llu: ncclCommSplit returned no communicator for "
                        "color %d", (unsigned long long)c->seq, color);
    _DM_TRY(_dm_nccl_child_ready(n, comm, "split"));
    r = ncclCommUserRank(comm, &rank);
    if (r == ncclSuccess) r = ncclCommCount(comm, &size);
    if (r != ncclSuccess) {
        st = _dm_nccl_fail_on(n, comm, r, "split: the new communicator's rank and size", c->seq);
        ncclCommAbort(comm);
        return st;
    }
    _DM_TRY(_dm_nccl_adopt(n, comm, rank, size, NULL, "split", out));
    ((_dm_nccl*)*out)->watch = n;   /* dm_abort on the parent stops the child's gather too */
    st = _dm_nccl_hosts((_dm_nccl*)*out);
    ((_dm_nccl*)*out)->watch = NULL;
    if (st != DM_OK) {
        _dm_copy_name(c->last_error, sizeof(c->last_error), (*out)->last_error);
        _dm_nccl_destroy((dm_collective*)*out);
        *out = NULL;
    }
    return st;
}
static dm_status _dm_nccl_split(dm_collective* c, int color, int key, dm_collective** out) {
    _dm_nccl* n = (_dm_nccl*)c;
    int prev;
    dm_status st = _dm_nccl_enter(n, "split", &prev);
    if (st == DM_OK) st = _dm_nccl_split_on(n, color, key, out);
    if (st != DM_OK) return _dm_nccl_leave(n, prev, _dm_nccl_end_aborted(n, st), "split");
    (void)_dm_nccl_leave(n, prev, DM_OK, "split");   /* the child exists: *out is the caller's now */
    return DM_OK;
}

/* >>nccl hosts  dm_local_rank, dm_local_world_size and dm_local come from the members' host
   identities (the core's _dm_host_identity: host name and boot id, or DISTMESH_TEST_HOST_ID),
   as on the TCP backend, never from the group's size or the launcher's LOCAL_WORLD_SIZE. create
   and split gather them over the new communicator (one host-staged all_gather); a shrink's
   survivors take theirs from the parent's table (host_of), without communication. The
   launcher's LOCAL_RANK / LOCAL_WORLD_SIZE win at create, as on TCP. */
/* The members on this host, in this pid namespace, other than this process: the peers to watch
   (>>nccl peers), from the gathered records (stride rec, the process part at proc). */
static dm_status _dm_nccl_local_peers(_dm_nccl* n, const unsigned char* all, size_t rec, size_t proc,
                                      const int* host_of) {
    uint64_t me[4], v[4];
    int j, k = 0;
    memcpy(me, all + (size_t)n->base.rank * rec + proc, sizeof(me));
    _dm_free(&n->base.allocator, n->peers);
    n->peers = NULL;
    n->n_peers = 0;
    if (!me[0] || n->base.size < 2) return DM_OK;
    n->peers = (_dm_nccl_peer*)_dm_calloc(&n->base.allocator, sizeof(_dm_nccl_peer) * (size_t)n->base.size);
    if (!n->peers) return _DM_FAIL(&n->base, DM_ERR_OUT_OF_MEMORY, "nccl: hosts: out of memory");
    for (j = 0; j < n->base.size; j++) {
        memcpy(v, all + (size_t)j * rec + proc, sizeof(v));
        if (j == n->base.rank || host_of[j] != host_of[n->base.rank] || !v[0] || v[0] == me[0] ||
            v[2] != me[2] || v[3] != me[3])
            continue;
        n->peers[k].rank = j;
        n->peers[k].pid = (int64_t)v[0];
        n->peers[k].start = v[1];
        k++;
    }
    n->n_peers = k;
    return DM_OK;
}
static dm_status _dm_nccl_hosts(_dm_nccl* n) {
    enum { ID = 96, NAME = sizeof(((dm_collective*)0)->node_name), PROC = ID + NAME,
           REC = PROC + _DM_NCCL_PROC_BYTES };
    int W = n->base.size;
    unsigned char mine[REC];
    unsigned char* all = (unsigned char*)_dm_calloc(&n->base.allocator, (size_t)W * REC);
    int* host_of = (int*)_dm_malloc(&n->base.allocator, sizeof(int) * (size_t)W);
    dm_status st = DM_OK;
    int j;
    if (!all || !host_of) st = _DM_FAIL(&n->base, DM_ERR_OUT_OF_MEMORY, "nccl: hosts: out of memory");
    memset(mine, 0, sizeof(mine));
    _dm_host_identity((char*)mine + ID, NAME, (char*)mine, ID);
    _dm_nccl_proc_self(mine + PROC);       /* >>nccl peers */
    if (st == DM_OK && W == 1) memcpy(all, mine, REC);
    else if (st == DM_OK) st = _dm_nccl_all_gather_on(n, mine, all, REC, DM_UINT8);
    if (st == DM_OK) {
        for (j = 0; j < W; j++) all[(size_t)j * REC + ID - 1] = 0;
        if (!_dm_hosts_from_ids(&n->base.allocator, all, REC, W, n->base.rank, host_of, &n->base.local_rank,
                                &n->base.local_size))
            st = _DM_FAIL(&n->base, DM_ERR_OUT_OF_MEMORY, "nccl: hosts: out of memory");
    }
    if (st == DM_OK) st = _dm_nccl_local_peers(n, all, REC, PROC, host_of);
    if (st == DM_OK) {
        _dm_copy_name(n->base.node_name, sizeof(n->base.node_name), (const char*)mine + ID);
        _dm_free(&n->base.allocator, n->host_of);
        n->host_of = host_of;
        host_of = NULL;
    }
    _dm_free(&n->base.allocator, all);
    _dm_free(&n->base.allocator, host_of);
    return st;
}
/* m, a shrink's survivor, from its parent n: members[i] is new rank i's rank in n. */
static dm_status _dm_nccl_hosts_of_members(_dm_nccl* m, const _dm_nccl* n, const int* members) {
    int W = m->base.size, i, k;
    m->host_of = (int*)_dm_malloc(&m->base.allocator, sizeof(int) * (size_t)W);
    if (!m->host_of) return _DM_FAIL(&m->base, DM_ERR_OUT_OF_MEMORY, "nccl: shrink: out of memory");
    m->base.local_rank = m->base.local_size = 0;
    for (i = 0; i < W; i++) {
        int host = n->host_of ? n->host_of[members[i]] : members[i];
        for (k = 0; (n->host_of ? n->host_of[members[k]] : members[k]) != host; k++) {}
        m->host_of[i] = k;
    }
    for (i = 0; i < W; i++) {
        if (m->host_of[i] != m->host_of[m->base.rank]) continue;
        if (i < m->base.rank) m->base.local_rank++;
        m->base.local_size++;
    }
    if (n->n_peers) {           /* the watched peers that stay, renumbered (>>nccl peers) */
        m->peers = (_dm_nccl_peer*)_dm_calloc(&m->base.allocator, sizeof(_dm_nccl_peer) * (size_t)n->n_peers);
        if (!m->peers) return _DM_FAIL(&m->base, DM_ERR_OUT_OF_MEMORY, "nccl: shrink: out of memory");
        for (k = 0; k < n->n_peers; k++)
            for (i = 0; i < W; i++)
                if (members[i] == n->peers[k].rank) {
                    m->peers[m->n_peers] = n->peers[k];
                    m->peers[m->n_peers++].rank = i;
                }
    }
    return DM_OK;
}

/* >>nccl shrink  The survivors' communicator comes from ncclCommShrink where this NCCL has it
   (2.27+, also checked in the library loaded) and the parent's communicator is still alive:
   NCCL_SHRINK_DEFAULT for a planned removal, NCCL_SHRINK_ABORT after an interrupt or with
   DM_SHRINK_ABORT. Like a split it runs as NCCL's job on the parent (_dm_nccl_job_wait): the
   child exists only once the parent's job is over, and a failure aborts the parent (joining
   the job) before the child the job wrote. Otherwise -- an older NCCL, or a parent a failure
   has already aborted (every failure does, >>nccl errors) -- the parent is aborted and the
   survivors initialise a new communicator with a unique id that the lowest surviving rank
   publishes in the desc's store under "<prefix>shrink/<k>/nccl_unique_id" (k: the shrink's
   number since create, the same on every survivor). NCCL has no agreement and cannot find dead
   ranks itself: gone[] is this rank's list, every survivor must pass the same one (as
   ncclCommShrink requires), else NCCL hangs until the deadline or builds different groups; an
   empty list (which ncclCommShrink refuses) is refused by dm_shrink before anything is touched
   (shrink_needs_exclude). After success the parent's communicator is released -- destroyed
   after NCCL_SHRINK_DEFAULT (healthy, and the child may share its abort flag), aborted
   otherwise -- and the parent answers DM_ERR_ABORTED. */
/* dm_abort (c->core->aborted set before the slot runs) must stop NCCL's work even when no call is
   running to see the flag: the kernels of a collective that returned after queueing them may
   wait on a dead peer forever. So the slot takes the collective, as a call would, and aborts
   the communicator itself (on this thread, on its device); while another thread holds it,
   that thread's next poll aborts it (_dm_nccl_interrupted), and the slot waits for that, or
   for the collective to be free, within c's timeout (DM_DEFAULT_TIMEOUT_MS where it has none).
   A DM_SHRINK_ABORT only sets the flag: the shrink that follows decides. */
static void _dm_nccl_interrupt(dm_collective* c) {
    _dm_nccl* n = (_dm_nccl*)c;
    int64_t deadline;
    __atomic_store_n(&n->interrupt, 1, __ATOMIC_RELEASE);
    if (__atomic_load_n(&c->core->aborted, __ATOMIC_ACQUIRE) == 0) return;
    if (_dm_tls_running.c == c) return;     /* called inside this thread's own call: it sees the flag */
    deadline = _dm_deadline(c->timeout_ms > 0 ? c->timeout_ms : DM_DEFAULT_TIMEOUT_MS);
    while (!__atomic_load_n(&n->stopped, __ATOMIC_ACQUIRE)) {
        if (_dm_take_now(c)) {
            int prev = -1;
            if (n->comm && _dm_nccl_switch(n, "abort", &prev) == DM_OK) {
                if (n->broken == DM_OK) {
                    dm_status st = _DM_FAIL(c, DM_ERR_ABORTED, "nccl: %s", c->core->abort_msg);
                    _dm_nccl_abort(n, st);
                } else {
                    _dm_nccl_drop(n);       /* parked: the shrink it waited for will not come */
                }
            }
            (void)_dm_nccl_leave(n, prev, DM_OK, "abort");
            __atomic_store_n(&n->stopped, 1, __ATOMIC_RELEASE);
            __atomic_store_n(&c->core->busy, 0, __ATOMIC_RELEASE);
            return;
        }
        if (_dm_now_ms() >= deadline) return;
        sched_yield();
    }
}
/* The parent after a shrink: requests still on its stream settled (DM_OK if their event had
   completed, else DM_ERR_ABORTED), its communicator released (healthy: ncclCommDestroy, else
   ncclCommAbort, which joins NCCL's job), every later call DM_ERR_ABORTED. */
static void _dm_nccl_retire(_dm_nccl* n, const char* why, bool healthy) {
    _dm_nccl_token* t;
    for (t = n->live; t; t = t->next)
        if (!t->settled) {
            t->settled = true;
            t->status = t->captured || cudaEventQuery(t->event) == cudaSuccess ? DM_OK : DM_ERR_ABORTED;
        }
    if (healthy && n->comm) {
        _dm_nccl_destroy_comm(n->comm);
        n->comm = NULL;
    }
    _dm_nccl_drop(n);
    n->broken = DM_ERR_ABORTED;
    _dm_copy_name(n->cause, sizeof(n->cause), why);
}
/* ncclCommShrink and the wait for its job; *comm is what the job wrote (possibly a failed
   child): on failure the caller retires the parent first, then aborts *comm. */
static dm_status _dm_nccl_shrink_native(_dm_nccl* n, int* exclude, int n_exclude, bool stop, ncclComm_t* comm) {
#if _DM_NCCL_HAS_SHRINK
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    ncclResult_t r;
    /* NCCL_SHRINK_DEFAULT wants a quiet parent: the blocking calls' work may still be queued */
    if (!stop) _DM_TRY(_dm_nccl_wait(n, "shrink", true));
    _dm_nccl_config(&config);
    r = ncclCommShrink(n->comm, exclude, n_exclude, comm, &config, stop ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT);
    if (r != ncclSuccess && r != ncclInProgress)
        return _dm_nccl_fail_on(n, n->comm, r, "shrink: ncclCommShrink", n->base.seq);
    return _dm_nccl_job_wait(n, "shrink");
#else
    (void)exclude; (void)n_exclude; (void)stop; (void)comm;
    return _DM_FAIL(&n->base, DM_ERR_UNSUPPORTED, "nccl: shrink: built with NCCL %d, without ncclCommShrink",
                    NCCL_VERSION_CODE);
#endif
}
/* A unique id under key in a store that outlives the create (desc.store, kept for shrinks;
   torchrun's agent store) is not left there: every one of the size ranks, the publisher
   included, counts itself in "<key>_read" once it has the id, and the one whose count makes
   size -- the last to have it -- deletes the id and the count. */
static void _dm_nccl_id_taken(dm_store* store, const char* key, int size) {
    char count_key[300];
    int64_t got = 0;
    snprintf(count_key, sizeof(count_key), "%s_read", key);
    if (dm_store_add(store, count_key, 1, &got) == DM_OK && got >= size) {
        (void)dm_store_delete(store, key, NULL);
        (void)dm_store_delete(store, count_key, NULL);
    }
}
/* A key of the store, waited for under the collective's deadline and stopped by another
   thread's dm_abort or DM_SHRINK_ABORT (_dm_nccl_stop_asked): dm_store_get would sit in the
   store for the store's whole timeout, out of the interrupt's reach. So this asks whether the
   key is there (dm_store_check: one round trip, never blocking), sleeping 1 ms, doubling up to
   8 ms, in between (an abort is seen within about 10 ms), and gets it once it is. A store
   without check waits in dm_store_get, as before. */
static dm_status _dm_nccl_store_get(_dm_nccl* n, const char* key, void** value, size_t* len, const char* what) {
    int64_t deadline = _dm_deadline(n->base.timeout_ms);
    long sleep_ns = 1000000;
    for (;;) {
        bool there = false;
        if (_dm_nccl_stop_asked(n))
            return _DM_FAIL(&n->base, DM_ERR_ABORTED, "nccl: %s #%llu was interrupted (dm_abort, or dm_shrink with "
                            "DM_SHRINK_ABORT, on another thread) while waiting for %s in the store", what,
                            (unsigned long long)n->base.seq, key);
        if (dm_store_check(n->store, &key, 1, &there) != DM_OK || there) break;
        if (_dm_now_ms() >= deadline)
            return _DM_FAIL(&n->base, DM_ERR_TIMEOUT, "nccl: %s #%llu timed out after %d ms waiting for %s in the "
                            "store", what, (unsigned long long)n->base.seq, n->base.timeout_ms, key);
        {
            struct timespec ts = { 0, sleep_ns };
            nanosleep(&ts, NULL);
        }
        if (sleep_ns < 8000000) sleep_ns *= 2;
    }
    if (dm_store_get(n->store, key, value, len) != DM_OK)
        return _DM_FAIL(&n->base, DM_ERR_TIMEOUT, "nccl: %s: waiting for %s: %s", what, key,
                        dm_store_last_error(n->store));
    return DM_OK;
}
/* The fallback: a new communicator of size ranks through the store (see above). */
static dm_status _dm_nccl_shrink_reinit(_dm_nccl* n, int rank, int size, ncclComm_t* comm) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    ncclUniqueId id;
    char key[200];
    void* value = NULL;
    size_t len = 0;
    ncclResult_t r;
    dm_status st = DM_OK;
    if (!n->store)
        return _DM_FAIL(&n->base, DM_ERR_UNSUPPORTED, "nccl: shrink #%llu needs %s and a store to re-initialise "
                        "through (desc.store, kept alive by the caller; not for split children)",
                        (unsigned long long)n->base.seq, n->comm ? "ncclCommShrink (NCCL 2.27+)" :
                        "a communicator that no failure aborted for ncclCommShrink, or");
    snprintf(key, sizeof(key), "%sshrink/%u/nccl_unique_id", n->prefix, n->shrinks + 1);
    _dm_nccl_retire(n, "nccl: this communicator was aborted by dm_shrink; destroy it", false);
    if (rank == 0) {
        r = ncclGetUniqueId(&id);
        if (r != ncclSuccess) return _dm_nccl_fail_on(n, NULL, r, "shrink: ncclGetUniqueId", n->base.seq);
        if (dm_store_set(n->store, key, &id, sizeof(id)) != DM_OK)
            return _DM_FAIL(&n->base, DM_ERR_NETWORK, "nccl: shrink: publishing the unique id: %s",
                            dm_store_last_error(n->store));
        _dm_nccl_id_taken(n->store, key, size);
    } else if ((st = _dm_nccl_store_get(n, key, &value, &len, "shrink: the new rank 0's unique id")) != DM_OK) {
        return st;
    } else {
        if (len == sizeof(id)) memcpy(&id, value, sizeof(id));
        dm_store_free(n->store, value);
        if (len != sizeof(id))
            return _DM_FAIL(&n->base, DM_ERR_PROTOCOL, "nccl: shrink: unique id of %zu bytes in the store", len);
        _dm_nccl_id_taken(n->store, key, size);
    }
    _dm_nccl_config(&config);
    r = ncclCommInitRankConfig(comm, size, id, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) st = _dm_nccl_fail_on(n, *comm, r, "shrink: ncclCommInitRankConfig", n->base.seq);
    if (st == DM_OK && !*comm)
        st = _DM_FAIL(&n->base, DM_ERR_NCCL, "nccl: shrink: ncclCommInitRankConfig returned no communicator");
    else if (st == DM_OK) st = _dm_nccl_child_ready(n, *comm, "shrink");
    else if (*comm) ncclCommAbort(*comm);
    if (st != DM_OK) *comm = NULL;
    return st;
}
/* Whether the members are on more than one host (>>nccl hosts): the same answer on every one. */
static bool _dm_nccl_spans_hosts(const _dm_nccl* n) {
    int j;
    for (j = 0; n->host_of && j < n->base.size; j++)
        if (n->host_of[j] != n->host_of[0]) return true;
    return false;
}
static dm_status _dm_nccl_shrink_on(_dm_nccl* n, const bool* gone, int flags, dm_collective** out) {
    dm_collective* c = &n->base;
    int i, k = 0, rank = 0, size = 0;
    int* exclude = (int*)_dm_malloc(&c->allocator, sizeof(int) * (size_t)c->size * 2);
    int* members;               /* the survivors' ranks in c, in order: exclude's second half */
    ncclComm_t comm = NULL;
    bool native = _dm_nccl_shrinks_natively(n, flags == DM_SHRINK_ABORT);   /* the same on every survivor */
    bool stop = flags == DM_SHRINK_ABORT || n->parked;
    dm_status st;
    char why[DM_LAST_ERROR_SIZE];
    if (!exclude) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "nccl: shrink: out of memory");
    if (flags == DM_SHRINK_ABORT && !n->store && _dm_nccl_spans_hosts(n)) {
        _dm_free(&c->allocator, exclude);
        return _DM_FAIL(c, DM_ERR_UNSUPPORTED, "nccl: shrink #%llu: DM_SHRINK_ABORT without a store on a communicator "
                        "that spans hosts: after a failure NCCL reports it on some survivors only (ncclRemoteError, "
                        "which aborts them) while the others would wait in ncclCommShrink until the deadline; give "
                        "the collective a store (desc.store) to re-initialise through (the collective is untouched)",
                        (unsigned long long)c->seq);
    }
    members = exclude + c->size;
    for (i = 0; i < c->size; i++) {     /* survivors keep their order: the new rank counts them */
        if (gone[i]) exclude[k++] = i;
        else if (i < c->rank) rank++;
        if (!gone[i]) members[i - k] = i;
    }
    size = c->size - k;
    if (native && !n->comm) {
        st = _DM_FAIL(c, n->store ? DM_ERR_ABORTED : DM_ERR_UNSUPPORTED, "nccl: shrink #%llu: the survivors shrink "
                      "with ncclCommShrink%s, but an "
                      "earlier failure aborted this rank's communicator (%s: %s); give the collective a store "
                      "(desc.store) and shrink with DM_SHRINK_ABORT to re-initialise", (unsigned long long)c->seq,
                      n->store ? " (DM_SHRINK_DEFAULT)" : " (no store to re-initialise through)",
                      dm_status_name(n->broken), n->cause[0] ? n->cause : "no message");
    } else if (native && stop && _dm_nccl_async_error(n->comm) == ncclInProgress) {
        /* NCCL_SHRINK_ABORT clears the abort flags before its readiness check, which refuses a
           communicator in progress (ncclInvalidArgument); without a store nothing else is left */
        st = _DM_FAIL(c, DM_ERR_ABORTED, "nccl: shrink #%llu: this rank's communicator is still in progress (an "
                      "interrupted operation waits for a peer), which ncclCommShrink refuses; give the collective "
                      "a store (desc.store) to re-initialise through", (unsigned long long)c->seq);
        _dm_nccl_retire(n, _dm_errbuf(c), false);
    } else if (native) {
        st = _dm_nccl_shrink_native(n, exclude, k, stop, &comm);
        if (st == DM_OK && !comm)
            st = _DM_FAIL(c, DM_ERR_NCCL, "nccl: shrink #%llu: ncclCommShrink's job gave no communicator",
                          (unsigned long long)c->seq);
        if (st == DM_OK) {
            st = _dm_nccl_child_ready(n, comm, "shrink");      /* aborts the child on failure */
            if (st != DM_OK) comm = NULL;
        }
        if (st != DM_OK) {
            _dm_nccl_retire(n, _dm_errbuf(c), false);   /* aborting the parent joins NCCL's job */
            if (comm) ncclCommAbort(comm);              /* what the job wrote, final now */
            comm = NULL;
        }
    } else {
        st = _dm_nccl_shrink_reinit(n, rank, size, &comm);
    }
    if (st == DM_OK) {
        snprintf(why, sizeof(why), "nccl: shrink #%llu replaced this communicator by one of %d ranks; destroy it",
                 (unsigned long long)c->seq, size);
        _dm_nccl_retire(n, why, native && !stop);
        st = _dm_nccl_adopt(n, comm, rank, size, n->owns_stream ? NULL : n->stream, "shrink", out);
    }
    if (st == DM_OK) {
        _dm_nccl* m = (_dm_nccl*)*out;
        m->store = n->store;
        memcpy(m->prefix, n->prefix, sizeof(m->prefix));
        m->shrinks = n->shrinks + 1;
        st = _dm_nccl_hosts_of_members(m, n, members);
        if (st != DM_OK) {
            _dm_copy_name(c->last_error, sizeof(c->last_error), m->base.last_error);
            _dm_nccl_destroy(*out);
            *out = NULL;
        }
    }
    _dm_free(&c->allocator, exclude);
    return st;
}
/* The interrupt that brought a DM_SHRINK_ABORT here has done its work (the operation it was
   meant for has ended: the core holds the collective now): cleared, or the shrink's own wait
   for NCCL's job would take it for a new one. */
static dm_status _dm_nccl_shrink(dm_collective* c, const bool* gone, int flags, dm_collective** out) {
    _dm_nccl* n = (_dm_nccl*)c;
    int prev = -1;
    dm_status st;
    __atomic_store_n(&n->interrupt, 0, __ATOMIC_RELEASE);
    st = _dm_nccl_switch(n, "shrink", &prev);
    if (st == DM_OK) st = _dm_nccl_shrink_on(n, gone, flags, out);
    if (st != DM_OK) return _dm_nccl_leave(n, prev, _dm_nccl_end_aborted(n, st), "shrink");
    (void)_dm_nccl_leave(n, prev, DM_OK, "shrink");   /* *out exists: the caller's now */
    return DM_OK;
}

/* The unique id: from the desc, or published by rank 0 through the store. */
static dm_status _dm_nccl_unique_id(_dm_nccl* n, const dm_nccl_desc* d, ncclUniqueId* id) {
    if (d->unique_id) {
        memcpy(id, d->unique_id, sizeof(*id));
        return DM_OK;
    }
    {
        dm_store* store = d->store;
        dm_store_desc sd;
        char key[256], why[DM_LAST_ERROR_SIZE];
        void* value = NULL;
        size_t size = 0;
        dm_status st = DM_OK;
        ncclResult_t r;
        snprintf(key, sizeof(key), "%snccl_unique_id", n->prefix);   /* per attempt (_dm_store_attempt_prefix) */
        if (!store) {
            memset(&sd, 0, sizeof(sd));
            sd.url = d->store_url;
            sd.is_server = n->base.rank == 0;
            sd.timeout_ms = n->base.timeout_ms;
            sd.logger = n->base.logger;
            sd.allocator = n->base.allocator;
            st = _dm_store_create_err(&sd, false, &store, why, sizeof(why));
            if (st != DM_OK) return _DM_FAIL(&n->base, st, "nccl: store: %s", why);
        }
        if (n->base.rank == 0) {
            r = ncclGetUniqueId(id);
            if (r != ncclSuccess) st = _dm_nccl_fail_on(n, NULL, r, "ncclGetUniqueId", n->base.seq);
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
        if (st == DM_OK && d->store) _dm_nccl_id_taken(store, key, n->base.size);
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
                if (st == DM_OK) {  /* every rank has it: the store (often torchrun's, which outlives us) keeps nothing */
                    (void)dm_store_delete(store, key, NULL);
                    (void)dm_store_delete(store, done_key, NULL);
                }
            }
            if (st == DM_ERR_NETWORK) _DM_FAIL(&n->base, st, "nccl: store: %s", dm_store_last_error(store));
        }
        if (!d->store) dm_store_destroy(store);
        return st;
    }
}

/* Rank, world and local rank (for the device) from the desc or the environment; *launcher:
   the launcher named the local rank and size (they win over the host identities, >>nccl hosts). */
static dm_status _dm_nccl_placement(const dm_nccl_desc* d, int* rank, int* world, int* local_rank,
                                    int* local_size, bool* launcher, char* err, size_t cap) {
    *launcher = false;
    if (d->world_size == 0) {
        dm_env env;
        if (dm_env_detect(&env) != DM_OK)
            return _DM_REPORT(&d->logger, err, cap, DM_ERR_ENV, "%s", env.error);
        *rank = env.rank; *world = env.world_size; *local_rank = env.local_rank; *local_size = env.local_world_size;
        *launcher = env.local_from_launcher;
        return DM_OK;
    }
    if (d->world_size < 0 || d->rank < 0 || d->rank >= d->world_size || d->local_rank < 0)
        return _DM_REPORT(&d->logger, err, cap, DM_ERR_INVALID_ARG, "nccl: rank %d / world_size %d / local_rank %d",
                          d->rank, d->world_size, d->local_rank);
    *rank = d->rank; *world = d->world_size; *local_rank = d->local_rank; *local_size = 0;
    return DM_OK;
}
/* The launcher's LOCAL_RANK / LOCAL_WORLD_SIZE win over the host identities, as on TCP; a
   disagreement is worth a warning. */
static void _dm_nccl_local_from_launcher(_dm_nccl* n, int local_rank, int local_size) {
    if (local_rank != n->base.local_rank || local_size != n->base.local_size)
        _DM_LOG(&n->base.logger, DM_LOG_WARN, "nccl: the launcher says local rank %d of %d, host identities say "
                "%d of %d (host \"%s\"); using the launcher's", local_rank, local_size, n->base.local_rank,
                n->base.local_size, n->base.node_name);
    n->base.local_rank = local_rank;
    n->base.local_size = local_size;
}

static dm_status _dm_nccl_create_checked(const dm_nccl_desc* desc, dm_collective** out) {
    _DM_ZERO(dm_nccl_desc, d);
    char err[DM_LAST_ERROR_SIZE], why[DM_LAST_ERROR_SIZE], prefix[128];
    int rank = 0, world = 1, local_rank = 0, local_size = 1, ndev = 0, device;
    bool launcher = false;
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
    _DM_TRY(_dm_cfg_check_create(&d.logger, d.timeout_ms, err, sizeof(err)));   /* >>config registry */
    _DM_TRY(_dm_nccl_placement(&d, &rank, &world, &local_rank, &local_size, &launcher, err, sizeof(err)));
    _dm_create_rank(rank);                                   /* >>log: a failed create's message */
    d.logger = _dm_logger_or_default(&d.logger, rank);
    {
        int v = 0;
        ncclResult_t r = ncclGetVersion(&v);
        if (r != ncclSuccess || v < _DM_NCCL_FLOOR)
            return _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_UNSUPPORTED, "nccl: the NCCL library loaded is %d; "
                              "distmesh needs %d or newer (ncclCommSplit, ncclConfig_t)", r == ncclSuccess ? v : -1,
                              _DM_NCCL_FLOOR);
    }
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
    /* the attempt's keys (>>store for backends): a restarted rank never reads the dead attempt's unique id */
    st = _dm_store_attempt_prefix(d.prefix ? d.prefix : "distmesh_nccl/", prefix, sizeof(prefix), why, sizeof(why));
    if (st != DM_OK) return _DM_REPORT(&d.logger, err, sizeof(err), st, "nccl: %s", why);
    n = _dm_nccl_new(&d.allocator, &d.logger, rank, world, d.timeout_ms, device, (cudaStream_t)d.stream);
    if (!n) return _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_OUT_OF_MEMORY, "nccl: out of memory");
    n->store = d.store;
    _dm_copy_name(n->prefix, sizeof(n->prefix), prefix);
    st = _dm_nccl_resources(n);
    if (st == DM_OK) st = _dm_nccl_unique_id(n, &d, &id);
    if (st == DM_OK) {
        _dm_nccl_config(&config);
        st = _dm_nccl_enqueued(n, ncclCommInitRankConfig(&n->comm, world, id, rank, &config), "init");
        /* ncclCommInitRankConfig may return before the communicator exists; wait for it. */
        if (st == DM_OK && n->comm) st = _dm_nccl_wait(n, "init", false);
    }
    if (st == DM_OK) st = _dm_nccl_hosts(n);
    if (st == DM_OK && launcher) _dm_nccl_local_from_launcher(n, local_rank, local_size);
    if (st != DM_OK) {   /* the message went to the logger; nothing is left to clean up */
        _dm_nccl_destroy(&n->base);
        return st;
    }
    *out = &n->base;
    return DM_OK;
}
DM_API_IMPL dm_status dm_nccl_create(const dm_nccl_desc* desc, dm_collective** out) {
    _dm_create_begin();
    return _dm_create_end(_dm_nccl_create_checked(desc, out), desc && desc->logger.func);
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
