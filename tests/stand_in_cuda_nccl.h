/* The script of tests/stand_in_cuda_nccl.c: a STAND-IN for libcudart and libnccl (not CUDA,
   not NCCL), linked in their place by tests/test_nccl_standin.c so that distmesh_nccl.h's
   reactions to failures can be tested on a machine without a GPU.

   A test scripts results ("ncclRemoteError on the 3rd enqueue", "a sticky
   cudaErrorIllegalAddress from cudaEventQuery") and reads what the backend did: how often it
   aborted, which device was current at each call, what is still allocated. Single-threaded:
   the stand-in takes no locks (one thread at a time may call it; si_stream_queries excepted). */
#ifndef STAND_IN_CUDA_NCCL_H
#define STAND_IN_CUDA_NCCL_H

#include <stdbool.h>

typedef struct si_stats {
    int aborts;                 /* ncclCommAbort calls on live communicators */
    int destroys;               /* ncclCommDestroy calls on live communicators */
    int stale_comm_calls;       /* NCCL calls given a NULL, freed or unknown communicator */
    int live_comms, live_streams, live_events, live_allocs;   /* created, not yet released */
    int wrong_device_calls;     /* calls bound to a device made while another was current */
    char first_wrong_device_call[96];   /* "cudaMallocAsync on device 0 (expected 2)" */
    int host_copies_on_busy_stream;     /* host<->device copies queued behind unfinished work */
    int group_depth;            /* ncclGroupStart minus ncclGroupEnd */
    int bad_frees;              /* cudaFree / cudaFreeAsync of memory the stand-in never gave */
} si_stats;

/* Clears the script and the counters (not the live objects: leaks stay visible). */
void si_reset(void);
const si_stats* si_get(void);
/* Calls of fn (a CUDA or NCCL function name) since si_reset. */
int si_count(const char* fn);
/* cudaStreamQuery calls since si_reset; the one thing another thread may read while a call
   of the stand-in runs. */
int si_stream_queries(void);

/* The nth call of fn from now on returns code: an ncclResult_t for "nccl..." names and for
   "enqueue" (any collective, ncclSend or ncclRecv), a cudaError_t for "cuda..." names. A
   failed NCCL call leaves its communicator's asynchronous error set (NCCL's non-blocking
   communicators keep it) and NCCL's last-error text set until the next ncclCommAbort. sticky:
   the CUDA error stays, every later CUDA call returns it (as after an illegal address). For
   ncclCommGetAsyncError the code is the call's own result, nothing is written. */
void si_fail(const char* fn, int nth, int code, bool sticky);

/* Device-bound calls (allocations, copies, streams, events, every NCCL call that queues work,
   init and split) made while the current device is not `device` are counted; -1: no check. */
void si_expect_device(int device);
void si_set_device_count(int count);        /* default 4 */
void si_set_memory_pools(bool supported);   /* cudaDevAttrMemoryPoolsSupported, default true */
/* After each queued operation a stream reports cudaErrorNotReady this many times (to
   cudaStreamQuery and to its events) before it is drained. Default 0. */
void si_set_busy_polls(int polls);
/* While held, work queued from now on never finishes (a kernel waiting on a dead peer):
   the stream and the events recorded behind it report cudaErrorNotReady. */
void si_hold_streams(bool held);
/* New communicators (init, split children) report ncclInProgress to this many polls of
   ncclCommGetAsyncError before ncclSuccess (default 2); forever: never finish. */
void si_set_init_polls(int polls, bool forever);
/* The asynchronous error every live communicator reports from now on (a peer died). */
void si_set_async_error(int nccl_result);
/* ncclCommSplit with a color returns ncclSuccess and writes NULL into *newcomm. */
void si_split_gives_null(bool on);
/* Split and shrink children made from now on fail their initialisation with this ncclResult_t. */
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

#endif
