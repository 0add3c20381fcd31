/* The NCCL backend's reactions to failures, run without a GPU: distmesh_nccl.h compiled with
   the real CUDA and NCCL headers, linked against tests/stand_in_cuda_nccl.c (a scripted
   STAND-IN for libcudart and libnccl) instead of the real libraries. These tests say nothing
   about NCCL's or CUDA's own behaviour -- tests/test_nccl.c does, on a GPU -- only about what
   distmesh does with the results the stand-in is scripted to give (issue 20):
   - every NCCL error once work is queued aborts the communicator, once; started requests are
     settled; later calls are DM_ERR_ABORTED quoting the first cause (enqueue, group end,
     split's parent, an asynchronous error after ncclInProgress);
   - every call runs on the communicator's device and gives the caller's back;
   - host copies never queue behind unfinished work; staging is stream-ordered;
   - cudaMemcpyAsync, cudaSetDevice, cudaMemsetAsync, cudaFreeAsync and ncclCommGetAsyncError
     results are checked (no endless poll with an infinite timeout);
   - a failed or timed-out split aborts the child, keeping NCCL's error text;
   - a sticky CUDA error from an event or the stream aborts and settles every request;
   - nothing leaks (the stand-in counts what is live; ASan/LSan under `make asan`);
   - dm_shrink (issue 18): ncclCommShrink with the excluded ranks and the flag mapped, the
     fallback re-initialisation through the store (an NCCL reported older than 2.27, or a
     communicator a failure already aborted), the parent left only destroyable, failures with a
     status and message, and an operation on another thread interrupted by DM_SHRINK_ABORT;
   - the unique id through the store (rank 0 publishes it, the others read it);
   - issue 30, against a stand-in that behaves like NCCL 2.27/2.28 (jobs, ncclInProgress at
     world >= 2, shared abort flags, use after free): split and shrink wait for NCCL's job on the
     parent and abort the parent before the child (points 1, 3); the watchdog's
     dm_shrink(DM_SHRINK_ABORT) interrupts a blocking call, dm_synchronize, dm_wait and a staged
     _async start on another thread, reaches NCCL only after them, and the survivors work;
     another thread is DM_ERR_BUSY while requests run (2); n_exclude 0 refused untouched (4); a
     failed ncclCommDestroy closes its group and aborts (5); another GPU's memory refused (6); a
     shared abort flag spares the shrunk child (7); local facts from host identities (8); a
     parked communicator's scratch waits for its abort (9).
   - issue 52: dm_abort on another thread stops a shrink that re-initialises through the store,
     waiting for the unique id there or for the new communicator's init (item 1); a CUDA graph
     capture on the stream: enqueue-only calls captured, host-side waits refused with
     DM_ERR_INVALID_ARG, the capture and the communicator intact (item 2); a peer's death
     reported by NCCL (the stand-in) only over the network, and a rank killed on the same node
     reported by distmesh on every survivor, forked processes each with its stand-in (item 3);
     the stand-in's jobs and kernels end after a time, not a number of polls, and a watchdog's
     dm_abort frees a thread stuck inside CUDA (synchronous calls block) at once (section 2).
   Built twice (tests/nccl_standin.mk): with DISTMESH_TCP, the store a server hosted here; and
   with DISTMESH_NCCL alone, no libuv flags nor library, the store a file store (the store comes
   with the NCCL backend; only hosting one needs libuv, refused there with a message). */
#define _GNU_SOURCE     /* POSIX 2008 for tests/test_world.h under -std=c11; mkdtemp, setenv */
#include "distmesh.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <pthread.h>
#include "prelude.h"
#include <time.h>
#include <sched.h>
#include <sys/mman.h>

#include "test_world.h"
#include "test_util.h"
#include "stand_in_cuda_nccl.h"
#include "test_nccl_util.h"


/* The other ranks' host identities at create: the hook a test installed (g_hook: host tags),
   else same_host's -- one host, as most NCCL jobs of a few GPUs are (>>nccl peers). */
static si_gather_hook g_hook;
/* A communicator of world ranks on `device` (this is `rank`), made from a caller whose current
   device is CALLER_DEVICE; from then on every device-bound call must be on `device`. store and
   prefix: kept for dm_shrink's fallback (the unique id itself comes from the desc). */
static dm_collective* make_on(int world, int rank, int device, int timeout_ms, dm_store* store, const char* prefix) {
    dm_nccl_desc d;
    dm_collective* c = NULL;
    static const unsigned char id[DM_NCCL_UNIQUE_ID_BYTES];
    memset(&d, 0, sizeof(d));
    d.rank = rank;
    d.world_size = world;
    d.store = store;
    d.prefix = prefix;
    d.cuda_device = device + 1;
    d.unique_id = id;
    d.timeout_ms = timeout_ms;
    assert_int_equal(cudaSetDevice(CALLER_DEVICE), cudaSuccess);
    si_set_all_gather_peers(g_hook ? g_hook : same_host, NULL);
    assert_int_equal(dm_nccl_create(&d, &c), DM_OK);
    if (!g_hook) si_set_all_gather_peers(NULL, NULL);
    /* create leaves the communicator's device current (documented); the caller goes back */
    assert_int_equal(cudaSetDevice(CALLER_DEVICE), cudaSuccess);
    g_device = device;
    si_expect_device(device);
    return c;
}
static dm_collective* make(int world, int device, int timeout_ms) {
    return make_on(world, 0, device, timeout_ms, NULL, NULL);
}
static void caller_device_is_back(void) {
    int d = -1;
    if (cudaGetDevice(&d) == cudaSuccess) assert_int_equal(d, CALLER_DEVICE);
}
/* After dm_destroy and the test's own frees: nothing left, nothing misused -- no call on a
   freed communicator, none refused for being in progress, no operation another communicator's
   abort silently skipped, no wait that would hang on a GPU, no kernel given another GPU's
   memory, no NCCL job still running. Every test ends with it. */
static void nothing_left(void) {
    nothing_left_shared();
    assert_int_equal(si_get()->illegal_addresses, 0);
}
static void no_wrong_device(void) {
    if (si_get()->wrong_device_calls)
        fail_msg("%d calls on the wrong device, the first: %s", si_get()->wrong_device_calls,
                 si_get()->first_wrong_device_call);
}
/* The set-up most tests share: a fresh stand-in, a communicator of world ranks on device, and
   two device buffers of n floats. */
static dm_collective* make_with_buffers(int world, int device, int timeout_ms, size_t n, float** a, float** b) {
    dm_collective* c;
    si_reset();
    c = make(world, device, timeout_ms);
    *a = dev(n);
    *b = dev(n);
    return c;
}
/* Their end: both buffers freed, then nothing_left. */
static void free_buffers_nothing_left(float* a, float* b) {
    dev_free(a);
    dev_free(b);
    nothing_left();
}

/* Point 2 (and 3, 4): every slot, blocking and _async, on a world of 2 on device 2 while the
   caller's device is 0. Each operation keeps the stream busy for 5 ms, so a host copy queued
   without draining it first would be counted. */
static void test_standin_every_slot_runs_on_the_communicators_device(void** state) {
    dm_collective *c, *child = NULL;
    float *a, *b, host_src[N], host_dst[2 * N], host_buf[N];
    void* recvs[2];
    dm_request* req = NULL;
    bool done = false;
    int i, mallocs, frees, async_mallocs, async_frees;
    (void)state;
    si_reset();
    si_set_busy_us(5000);
    c = make(2, 2, 5000);
    a = dev(4 * N);
    b = dev(4 * N);
    for (i = 0; i < N; i++) host_src[i] = (float)i + 0.5f;
    memcpy(host_buf, host_src, sizeof(host_buf));
    CHECK_DM_OK(c, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM)); caller_device_is_back();
    CHECK_DM_OK(c, dm_reduce_scatter(c, a, b, N, DM_FLOAT32, DM_SUM)); caller_device_is_back();
    CHECK_DM_OK(c, dm_all_gather(c, a, b, N, DM_FLOAT32)); caller_device_is_back();
    CHECK_DM_OK(c, dm_broadcast(c, a, N, DM_FLOAT32, 0)); caller_device_is_back();
    CHECK_DM_OK(c, dm_barrier(c)); caller_device_is_back();
    CHECK_DM_OK(c, dm_synchronize(c)); caller_device_is_back();
    CHECK_DM_OK(c, dm_reduce(c, a, b, N, DM_FLOAT32, DM_SUM, 0)); caller_device_is_back();
    CHECK_DM_OK(c, dm_gather(c, a, b, N, DM_FLOAT32, 0)); caller_device_is_back();
    CHECK_DM_OK(c, dm_scatter(c, b, a, N, DM_FLOAT32, 0)); caller_device_is_back();
    CHECK_DM_OK(c, dm_all_to_all(c, a, b, N, DM_FLOAT32)); caller_device_is_back();
    CHECK_DM_OK(c, dm_all_to_all(c, NULL, b, N, DM_FLOAT32)); caller_device_is_back();
    CHECK_DM_OK(c, dm_send(c, a, N, DM_FLOAT32, 1, 7)); caller_device_is_back();
    CHECK_DM_OK(c, dm_recv(c, a, N, DM_FLOAT32, 1, 7)); caller_device_is_back();
    recvs[0] = b; recvs[1] = b + N;
    CHECK_DM_OK(c, dm_all_gather_to_list(c, a, recvs, N, DM_FLOAT32)); caller_device_is_back();

    /* Host staging: stream-ordered scratch only (no cudaMalloc / cudaFree, which wait for the
       whole device), and no host copy behind unfinished work. */
    mallocs = si_count("cudaMalloc"); frees = si_count("cudaFree");
    async_mallocs = si_count("cudaMallocAsync"); async_frees = si_count("cudaFreeAsync");
    memset(host_dst, 0, sizeof(host_dst));
    CHECK_DM_OK(c, dm_all_gather(c, host_src, host_dst, N, DM_FLOAT32)); caller_device_is_back();
    assert_memory_equal(host_dst, host_src, sizeof(host_src));    /* our block, rank 0's */
    CHECK_DM_OK(c, dm_broadcast(c, host_buf, N, DM_FLOAT32, 0)); caller_device_is_back();
    assert_memory_equal(host_buf, host_src, sizeof(host_src));
    recvs[0] = host_dst; recvs[1] = host_dst + N;
    CHECK_DM_OK(c, dm_all_gather_to_list(c, host_src, recvs, N, DM_FLOAT32)); caller_device_is_back();
    assert_memory_equal(host_dst, host_src, sizeof(host_src));
    assert_int_equal(si_count("cudaMalloc"), mallocs);
    assert_int_equal(si_count("cudaFree"), frees);
    assert_int_equal(si_count("cudaMallocAsync") - async_mallocs, 3);
    assert_int_equal(si_count("cudaFreeAsync") - async_frees, 3);
    assert_int_equal(si_get()->host_copies_on_busy_stream, 0);

    /* Requests: start and finish switch too. */
    CHECK_DM_OK(c, dm_all_reduce_async(c, a, b, N, DM_FLOAT32, DM_SUM, &req)); caller_device_is_back();
    CHECK_DM_OK(c, dm_test(req, &done)); caller_device_is_back();
    if (!done) CHECK_DM_OK(c, dm_wait(req));
    caller_device_is_back();
    CHECK_DM_OK(c, dm_scatter_async(c, b, a, N, DM_FLOAT32, 0, &req)); caller_device_is_back();
    CHECK_DM_OK(c, dm_wait(req)); caller_device_is_back();

    /* split: the child's stream, scratch and events on the parent's device. */
    CHECK_DM_OK(c, dm_split(c, 0, 0, &child)); caller_device_is_back();
    assert_non_null(child);
    CHECK_DM_OK(child, dm_all_reduce(child, a, b, N, DM_FLOAT32, DM_SUM)); caller_device_is_back();
    CHECK_DM_OK(child, dm_synchronize(child));
    dm_destroy(child); caller_device_is_back();
    dm_destroy(c); caller_device_is_back();
    no_wrong_device();
    assert_int_equal(si_get()->aborts, 0);
    assert_int_equal(si_get()->destroys, 2);
    free_buffers_nothing_left(a, b);
}

/* Point 1: ncclRemoteError on the 3rd enqueue (a peer died between calls), with two requests
   still running on the GPU. */
static void test_standin_nccl_error_on_enqueue_aborts_once(void** state) {
    dm_collective* c;
    dm_request *r1 = NULL, *r2 = NULL, *r3 = NULL;
    float *a, *b;
    (void)state;
    c = make_with_buffers(2, 1, 5000, 2 * N, &a, &b);
    si_fail("enqueue", 3, ncclRemoteError, false);
    si_hold_streams(true);      /* the two requests' kernels wait for the dead peer */
    CHECK_DM_OK(c, dm_all_reduce_async(c, a, b, N, DM_FLOAT32, DM_SUM, &r1));
    CHECK_DM_OK(c, dm_all_reduce_async(c, a, b, N, DM_FLOAT32, DM_SUM, &r2));
    CHECK_ST(c, DM_ERR_NETWORK, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
    CHECK_MSG(c, "scripted for ncclAllReduce");     /* NCCL's text, read before the abort */
    assert_int_equal(si_get()->aborts, 1);
    assert_int_equal(si_get()->live_comms, 0);
    /* settled by the abort, with the cause */
    CHECK_ST(c, DM_ERR_NETWORK, dm_wait(r1));
    CHECK_MSG(c, "did not complete");
    CHECK_MSG(c, "scripted for ncclAllReduce");
    CHECK_ST(c, DM_ERR_NETWORK, dm_wait(r2));
    /* later calls, blocking and not */
    CHECK_ST(c, DM_ERR_ABORTED, dm_barrier(c));
    CHECK_MSG(c, "scripted for ncclAllReduce");
    CHECK_ST(c, DM_ERR_ABORTED, dm_all_gather(c, a, b, N, DM_FLOAT32));
    CHECK_ST(c, DM_ERR_ABORTED, dm_all_reduce_async(c, a, b, N, DM_FLOAT32, DM_SUM, &r3));
    CHECK_MSG(c, "scripted for ncclAllReduce");
    CHECK_ST(c, DM_ERR_ABORTED, dm_synchronize(c));
    si_hold_streams(false);
    dm_destroy(c);
    assert_int_equal(si_get()->aborts, 1);          /* once */
    assert_int_equal(si_get()->destroys, 0);
    no_wrong_device();
    free_buffers_nothing_left(a, b);
}

/* Point 1 in groups: an error at ncclGroupEnd, a failing ncclSend inside a group (the group is
   still ended), and ncclInProgress followed by an asynchronous error. */
static void test_standin_group_and_async_errors_abort(void** state) {
    dm_collective* c;
    float *a, *b;
    (void)state;
    c = make_with_buffers(3, 1, 5000, 3 * N, &a, &b);
    si_fail("ncclGroupEnd", 1, ncclSystemError, false);
    CHECK_ST(c, DM_ERR_NETWORK, dm_gather(c, a, b, N, DM_FLOAT32, 0));
    CHECK_MSG(c, "gather");
    CHECK_MSG(c, "scripted for ncclGroupEnd");
    assert_int_equal(si_get()->aborts, 1);
    CHECK_ST(c, DM_ERR_ABORTED, dm_gather(c, a, b, N, DM_FLOAT32, 0));
    dm_destroy(c);

    c = make(3, 1, 5000);
    si_fail("ncclSend", 2, ncclInternalError, false);
    CHECK_ST(c, DM_ERR_NCCL, dm_scatter(c, a, b, N, DM_FLOAT32, 0));
    assert_int_equal(si_get()->group_depth, 0);
    assert_int_equal(si_get()->aborts, 2);
    CHECK_ST(c, DM_ERR_ABORTED, dm_all_to_all(c, a, b, N, DM_FLOAT32));
    dm_destroy(c);

    c = make(3, 1, 5000);
    si_fail("enqueue", 1, ncclInProgress, false);
    si_set_async_error(ncclRemoteError);
    CHECK_ST(c, DM_ERR_NETWORK, dm_send(c, a, N, DM_FLOAT32, 2, 0));
    CHECK_MSG(c, "a peer died");
    assert_int_equal(si_get()->aborts, 3);
    CHECK_ST(c, DM_ERR_ABORTED, dm_recv(c, a, N, DM_FLOAT32, 2, 0));
    dm_destroy(c);
    assert_int_equal(si_get()->aborts, 3);
    no_wrong_device();
    free_buffers_nothing_left(a, b);
}

/* Split on NCCL 2.27+ (the stand-in's header says how): ncclCommSplit returns with no child,
   the parent's job makes it. The call refused at once (no job, no child: the parent aborted);
   the job failing (the child written anyway, failed, and the error left on the parent: both
   aborted, the parent first, which joins the job, NCCL's text kept) or never ending (the
   deadline: the same); the job giving no child (a status, the parent usable); a poll of the
   parent that fails itself with an infinite timeout (a status, not an endless loop). After
   each: no job left running, nothing leaked. */
static void test_standin_split_failures_abort_the_child(void** state) {
    dm_collective *c, *child = NULL;
    float *a, *b;
    (void)state;
    c = make_with_buffers(2, 3, 5000, 2 * N, &a, &b);
    si_fail("ncclCommSplit", 1, ncclRemoteError, false);
    CHECK_ST(c, DM_ERR_NETWORK, dm_split(c, 0, 0, &child));
    assert_null(child);
    CHECK_MSG(c, "scripted for ncclCommSplit");
    assert_int_equal(si_get()->aborts, 1);
    assert_int_equal(si_get()->live_comms, 0);
    CHECK_ST(c, DM_ERR_ABORTED, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
    dm_destroy(c);

    c = make(2, 3, 5000);
    si_split_child_fails(ncclSystemError);
    CHECK_ST(c, DM_ERR_NETWORK, dm_split(c, 0, 0, &child));
    assert_null(child);
    CHECK_MSG(c, "the new communicator failed");    /* read before the aborts */
    assert_int_equal(si_get()->aborts, 3);          /* the parent, then the child its job wrote */
    assert_int_equal(si_get()->live_comms, 0);
    assert_int_equal(si_pending_jobs(), 0);
    si_split_child_fails(ncclSuccess);
    CHECK_ST(c, DM_ERR_ABORTED, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
    dm_destroy(c);

    c = make(2, 3, 200);
    si_set_init_us(0, true);                     /* the parent's job never ends */
    CHECK_ST(c, DM_ERR_TIMEOUT, dm_split(c, 1, 0, &child));
    assert_null(child);
    CHECK_MSG(c, "timed out");
    assert_int_equal(si_get()->aborts, 5);
    assert_int_equal(si_get()->live_comms, 0);
    assert_int_equal(si_pending_jobs(), 0);
    si_set_init_us(1000, false);
    dm_destroy(c);

    c = make(2, 3, -1);                             /* no deadline: nothing may poll forever */
    si_split_gives_null(true);
    CHECK_ST(c, DM_ERR_NCCL, dm_split(c, 0, 0, &child));
    assert_null(child);
    CHECK_MSG(c, "no communicator");
    si_split_gives_null(false);
    CHECK_DM_OK(c, dm_barrier(c));                     /* the parent is fine */
    /* the parent's second poll fails itself (its job still runs then: 10 s) */
    si_set_init_us(10000000, false);
    si_fail("ncclCommGetAsyncError", 2, ncclInvalidArgument, false);
    CHECK_ST(c, DM_ERR_INVALID_ARG, dm_split(c, 0, 0, &child));
    si_set_init_us(1000, false);
    assert_null(child);
    assert_int_equal(si_get()->aborts, 7);
    assert_int_equal(si_get()->live_comms, 0);
    dm_destroy(c);
    no_wrong_device();
    free_buffers_nothing_left(a, b);
}

/* Point 5: results that were not checked. */
static void test_standin_cuda_and_poll_results_are_checked(void** state) {
    dm_collective* c = NULL;
    dm_nccl_desc d;
    static const unsigned char id[DM_NCCL_UNIQUE_ID_BYTES];
    float host_src[N], host_dst[2 * N], *a, *b;
    int live;
    (void)state;
    si_reset();
    memset(host_src, 0, sizeof(host_src));
    /* cudaMemsetAsync of create's scratch: create fails, leaving nothing behind */
    memset(&d, 0, sizeof(d));
    d.world_size = 2;
    d.unique_id = id;
    si_fail("cudaMemsetAsync", 1, cudaErrorLaunchFailure, false);
    assert_int_equal(dm_nccl_create(&d, &c), DM_ERR_CUDA);
    assert_null(c);
    nothing_left();

    /* cudaMemcpyAsync of host staging: aborts, and the staging buffer is released */
    c = make(2, 1, 5000);
    live = si_get()->live_allocs;
    si_fail("cudaMemcpyAsync", 1, cudaErrorInvalidValue, false);
    CHECK_ST(c, DM_ERR_CUDA, dm_all_gather(c, host_src, host_dst, N, DM_FLOAT32));
    CHECK_MSG(c, "host staging");
    assert_int_equal(si_get()->live_allocs, live);
    assert_int_equal(si_get()->aborts, 1);
    CHECK_ST(c, DM_ERR_ABORTED, dm_all_gather(c, host_src, host_dst, N, DM_FLOAT32));
    dm_destroy(c);

    /* cudaFreeAsync of the staging buffer */
    c = make(2, 1, 5000);
    si_fail("cudaFreeAsync", 1, cudaErrorInvalidValue, false);
    CHECK_ST(c, DM_ERR_CUDA, dm_broadcast(c, host_dst, N, DM_FLOAT32, 0));
    assert_int_equal(si_get()->aborts, 2);
    dm_destroy(c);

    /* cudaSetDevice: nothing is queued on the wrong device */
    c = make(2, 1, 5000);
    a = dev(2 * N);
    b = dev(2 * N);
    si_fail("cudaSetDevice", 1, cudaErrorInvalidDevice, false);
    CHECK_ST(c, DM_ERR_CUDA, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
    CHECK_MSG(c, "cudaSetDevice");
    assert_int_equal(si_count("ncclAllReduce"), 0);
    assert_int_equal(si_get()->aborts, 3);
    dm_destroy(c);

    /* ncclCommGetAsyncError failing with an infinite timeout: a status, not an endless loop */
    c = make(2, 1, -1);
    si_set_busy_us(500000);                 /* still busy at the third poll */
    CHECK_DM_OK(c, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
    si_fail("ncclCommGetAsyncError", 3, ncclInternalError, false);
    CHECK_ST(c, DM_ERR_NCCL, dm_synchronize(c));
    assert_int_equal(si_get()->aborts, 4);
    si_set_busy_us(0);
    dm_destroy(c);
    no_wrong_device();
    free_buffers_nothing_left(a, b);
}

/* Point 3: with work that never finishes on the stream, a host-staged call waits under the
   deadline instead of inside cudaMemcpyAsync. */
static void test_standin_host_copy_waits_with_the_deadline(void** state) {
    dm_collective* c;
    float host_src[N], host_dst[2 * N], *a, *b;
    int copies;
    (void)state;
    si_reset();
    memset(host_src, 0, sizeof(host_src));
    c = make(2, 1, 150);
    a = dev(2 * N);
    b = dev(2 * N);
    si_hold_streams(true);
    CHECK_DM_OK(c, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
    copies = si_count("cudaMemcpyAsync");
    CHECK_ST(c, DM_ERR_TIMEOUT, dm_all_gather(c, host_src, host_dst, N, DM_FLOAT32));
    CHECK_MSG(c, "timed out");
    assert_int_equal(si_get()->host_copies_on_busy_stream, 0);
    assert_int_equal(si_count("cudaMemcpyAsync"), copies);
    assert_int_equal(si_get()->aborts, 1);
    si_hold_streams(false);
    dm_destroy(c);
    no_wrong_device();
    free_buffers_nothing_left(a, b);
}

/* Point 7: a sticky cudaErrorIllegalAddress from cudaEventQuery, then from cudaStreamQuery. */
static void test_standin_sticky_cuda_error_aborts_and_settles(void** state) {
    dm_collective* c;
    dm_request *r0 = NULL, *r1 = NULL, *r2 = NULL;
    float *a, *b;
    (void)state;
    c = make_with_buffers(2, 2, 5000, 2 * N, &a, &b);
    CHECK_DM_OK(c, dm_all_reduce_async(c, a, b, N, DM_FLOAT32, DM_SUM, &r0));
    CHECK_DM_OK(c, dm_wait(r0));
    si_hold_streams(true);
    CHECK_DM_OK(c, dm_all_reduce_async(c, a, b, N, DM_FLOAT32, DM_SUM, &r1));
    CHECK_DM_OK(c, dm_all_gather_async(c, a, b, N, DM_FLOAT32, &r2));
    si_fail("cudaEventQuery", 1, cudaErrorIllegalAddress, true);
    CHECK_ST(c, DM_ERR_CUDA, dm_wait(r1));
    CHECK_MSG(c, "illegal memory access");
    assert_int_equal(si_get()->aborts, 1);
    CHECK_ST(c, DM_ERR_CUDA, dm_wait(r2));
    CHECK_MSG(c, "did not complete");
    CHECK_MSG(c, "illegal memory access");
    CHECK_ST(c, DM_ERR_ABORTED, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
    CHECK_MSG(c, "illegal memory access");
    si_hold_streams(false);
    dm_destroy(c);                                  /* with every CUDA call failing */
    assert_int_equal(si_get()->aborts, 1);
    free_buffers_nothing_left(a, b);

    c = make_with_buffers(2, 2, 5000, 2 * N, &a, &b);
    CHECK_DM_OK(c, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
    si_fail("cudaStreamQuery", 1, cudaErrorIllegalAddress, true);
    CHECK_ST(c, DM_ERR_CUDA, dm_synchronize(c));
    assert_int_equal(si_get()->aborts, 1);
    CHECK_ST(c, DM_ERR_ABORTED, dm_barrier(c));
    CHECK_MSG(c, "illegal memory access");
    dm_destroy(c);
    assert_int_equal(si_get()->aborts, 1);
    no_wrong_device();
    free_buffers_nothing_left(a, b);
}

/* >>shrink */
static char g_dir[256];         /* the program's directory: file stores live in it */
TMPDIR_FIXTURES(g_dir, "dm_nccl_standin")
/* An empty store: hosted here with DISTMESH_TCP, else a file store in a new directory. */
static dm_store* rendezvous_store(int timeout_ms) {
    dm_store_desc sd;
    dm_store* st = NULL;
    memset(&sd, 0, sizeof(sd));
#if defined(DISTMESH_TCP)
    sd.url = "tcp://127.0.0.1:0";
    sd.is_server = true;
#else
    static int made;
    char url[320];
    snprintf(url, sizeof(url), "file://%s/store%d", g_dir, ++made);
    sd.url = url;
#endif
    sd.timeout_ms = timeout_ms;
    assert_int_equal(dm_store_create(&sd, &st), DM_OK);
    return st;
}
static void key_is_gone(dm_store* store, const char* key) {
    bool there = true;
    CHECK_DM_OK(NULL, dm_store_check(store, &key, 1, &there));
    if (there) fail_msg("the store still holds %s", key);
}
static void comm_is(dm_collective* c, int rank, int size) {
    int r = -2, n = -2;
    unsigned char id = 0;
    si_comm_info(dm_native_handle(c), &r, &n, &id);
    assert_int_equal(r, rank);
    assert_int_equal(n, size);
    assert_int_equal(dm_rank(c), rank);
    assert_int_equal(dm_world_size(c), size);
}

/* ncclCommShrink where NCCL has it: the excluded ranks in order, the flag mapped, a
   non-blocking config; the survivor renumbered in old order on the same device and timeout;
   the parent answers DM_ERR_ABORTED until destroyed. */
static void test_standin_shrink_uses_ncclCommShrink(void** state) {
    dm_collective *c, *s = NULL, *s2 = NULL;
    dm_request* req = NULL;
    int gone[2] = { 3, 0 }, gone2[1] = { 0 };
    float *a, *b;
    (void)state;
    si_reset();
    c = make_on(4, 2, 1, 4321, NULL, NULL);
    a = dev(2 * N);
    b = dev(2 * N);
    /* DEFAULT with a stream request not waited for: busy, nothing touched */
    CHECK_DM_OK(c, dm_all_reduce_async(c, a, b, N, DM_FLOAT32, DM_SUM, &req));
    CHECK_ST(c, DM_ERR_BUSY, dm_shrink(c, gone, 2, DM_SHRINK_DEFAULT, &s));
    assert_null(s);
    CHECK_DM_OK(c, dm_wait(req));
    assert_int_equal(si_last_shrink()->calls, 0);

    CHECK_DM_OK(c, dm_shrink(c, gone, 2, DM_SHRINK_DEFAULT, &s)); caller_device_is_back();
    assert_non_null(s);
    assert_int_equal(si_last_shrink()->calls, 1);
    assert_int_equal(si_last_shrink()->flags, NCCL_SHRINK_DEFAULT);
    assert_int_equal(si_last_shrink()->blocking, 0);
    assert_int_equal(si_last_shrink()->count, 2);
    assert_int_equal(si_last_shrink()->exclude[0], 0);
    assert_int_equal(si_last_shrink()->exclude[1], 3);
    comm_is(s, 1, 2);                               /* old ranks 1, 2 -> 0, 1 */
    assert_int_equal(s->timeout_ms, 4321);
    assert_int_equal(si_count("ncclCommInitRankConfig"), 1);    /* no re-init */
    CHECK_DM_OK(s, dm_all_reduce(s, a, b, N, DM_FLOAT32, DM_SUM)); caller_device_is_back();
    CHECK_ST(c, DM_ERR_ABORTED, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
    CHECK_MSG(c, "shrink");
    CHECK_ST(c, DM_ERR_ABORTED, dm_barrier(c));
    assert_int_equal(si_get()->live_comms, 1);      /* the parent's was released */

    /* DM_SHRINK_ABORT maps to NCCL_SHRINK_ABORT; shrinking twice */
    CHECK_DM_OK(s, dm_shrink(s, gone2, 1, DM_SHRINK_ABORT, &s2));
    assert_int_equal(si_last_shrink()->flags, NCCL_SHRINK_ABORT);
    assert_int_equal(si_last_shrink()->count, 1);
    assert_int_equal(si_last_shrink()->exclude[0], 0);
    comm_is(s2, 0, 1);
    CHECK_DM_OK(s2, dm_all_reduce(s2, a, b, N, DM_FLOAT32, DM_SUM));
    dm_destroy(s2);
    dm_destroy(s);
    dm_destroy(c);
    no_wrong_device();
    free_buffers_nothing_left(a, b);
}

/* Without ncclCommShrink (NCCL reported as 2.26.5) and after a failure that aborted the
   communicator: the parent is aborted and the survivors re-initialise with a unique id the
   new rank 0 publishes under "<prefix>shrink/<k>/nccl_unique_id". No store: a status, the
   parent untouched. */
static void test_standin_shrink_falls_back_to_reinit_through_the_store(void** state) {
    dm_collective *c, *s = NULL, *s2 = NULL;
    dm_store* store;
    int gone0[1] = { 0 }, gone1[1] = { 1 };
    unsigned char id[DM_NCCL_UNIQUE_ID_BYTES];
    float *a, *b;
    (void)state;
    si_reset();
    store = rendezvous_store(2000);
    si_set_version(NCCL_VERSION(2, 26, 5));

    c = make_on(3, 1, 1, 5000, NULL, NULL);         /* no store */
    a = dev(2 * N);
    b = dev(2 * N);
    CHECK_ST(c, DM_ERR_UNSUPPORTED, dm_shrink(c, gone0, 1, DM_SHRINK_DEFAULT, &s));
    assert_null(s);
    CHECK_MSG(c, "desc.store");
    CHECK_DM_OK(c, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));     /* still usable */
    dm_destroy(c);

    /* old rank 1 of 3 without rank 0: the new rank 0 publishes the id */
    c = make_on(3, 1, 1, 5000, store, "job/");
    CHECK_DM_OK(c, dm_shrink(c, gone0, 1, DM_SHRINK_DEFAULT, &s)); caller_device_is_back();
    assert_int_equal(si_last_shrink()->calls, 0);
    assert_int_equal(si_count("ncclGetUniqueId"), 1);
    comm_is(s, 0, 2);
    {
        int r, n;
        unsigned char first = 0;
        si_comm_info(dm_native_handle(s), &r, &n, &first);
        assert_int_equal(first, 1);                     /* the stand-in's first id */
    }
    {   /* counted by the new rank 0 only: the other survivor has not read it yet (issue 52, item 7) */
        int64_t count = 0;
        CHECK_DM_OK(NULL, dm_store_add(store, "job/shrink/1/nccl_unique_id_read", 0, &count));
        assert_int_equal(count, 1);
    }
    CHECK_ST(c, DM_ERR_ABORTED, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
    CHECK_DM_OK(s, dm_all_reduce(s, a, b, N, DM_FLOAT32, DM_SUM));
    dm_destroy(c);
    dm_destroy(s);
    s = NULL;

    /* old rank 2 of 3 without rank 1, after a failure aborted the communicator (ncclCommShrink
       exists again, but there is no communicator left to shrink): it reads the id old rank 0
       published (here: the test) and becomes rank 1 of 2 */
    si_set_version(NCCL_VERSION_CODE);
    c = make_on(3, 2, 1, 5000, store, "job2/");
    si_fail("enqueue", 1, ncclRemoteError, false);
    CHECK_ST(c, DM_ERR_NETWORK, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
    memset(id, 0, sizeof(id));
    id[0] = 77;
    CHECK_DM_OK(NULL, dm_store_set(store, "job2/shrink/1/nccl_unique_id", id, sizeof(id)));
    CHECK_DM_OK(c, dm_shrink(c, gone1, 1, DM_SHRINK_ABORT, &s));
    assert_int_equal(si_last_shrink()->calls, 0);
    comm_is(s, 1, 2);
    {
        int r, n;
        unsigned char first = 0;
        si_comm_info(dm_native_handle(s), &r, &n, &first);
        assert_int_equal(first, 77);
    }
    /* the next fallback shrink of this lineage uses generation 2 */
    si_set_version(NCCL_VERSION(2, 18, 1));
    id[0] = 78;
    CHECK_DM_OK(NULL, dm_store_set(store, "job2/shrink/2/nccl_unique_id", id, sizeof(id)));
    CHECK_DM_OK(s, dm_shrink(s, gone0, 1, DM_SHRINK_DEFAULT, &s2));
    comm_is(s2, 0, 1);
    dm_destroy(s2);
    dm_destroy(s);
    dm_destroy(c);
    dm_store_destroy(store);
    no_wrong_device();
    free_buffers_nothing_left(a, b);
}

/* Failing shrinks: a status and NCCL's message, *out NULL, nothing leaked, the parent aborted
   once its part has begun. */
static void test_standin_failed_shrink_reports_and_leaks_nothing(void** state) {
    dm_collective *c, *s = NULL;
    dm_store* store;
    int gone[1] = { 1 }, calls;
    float *a, *b;
    (void)state;
    c = make_with_buffers(3, 2, 5000, 2 * N, &a, &b);
    si_fail("ncclCommShrink", 1, ncclRemoteError, false);
    CHECK_ST(c, DM_ERR_NETWORK, dm_shrink(c, gone, 1, DM_SHRINK_ABORT, &s));
    assert_null(s);
    CHECK_MSG(c, "scripted for ncclCommShrink");
    CHECK_ST(c, DM_ERR_ABORTED, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
    assert_int_equal(si_get()->live_comms, 0);
    dm_destroy(c);

    c = make(3, 2, 5000);
    si_split_child_fails(ncclSystemError);          /* the new communicator's init fails */
    CHECK_ST(c, DM_ERR_NETWORK, dm_shrink(c, gone, 1, DM_SHRINK_DEFAULT, &s));
    assert_null(s);
    CHECK_MSG(c, "the new communicator failed");
    assert_int_equal(si_get()->live_comms, 0);
    si_split_child_fails(ncclSuccess);
    dm_destroy(c);

    /* DEFAULT waits for the parent's queued work first (NCCL wants it quiet), under the
       deadline: work that never ends is a timeout, and ncclCommShrink is not called */
    c = make(3, 2, 150);
    CHECK_DM_OK(c, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
    si_hold_streams(true);
    CHECK_DM_OK(c, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
    calls = si_last_shrink()->calls;
    CHECK_ST(c, DM_ERR_TIMEOUT, dm_shrink(c, gone, 1, DM_SHRINK_DEFAULT, &s));
    assert_null(s);
    assert_int_equal(si_last_shrink()->calls, calls);
    CHECK_ST(c, DM_ERR_ABORTED, dm_barrier(c));
    si_hold_streams(false);
    dm_destroy(c);

    /* fallback: the new rank 0's id never arrives */
    store = rendezvous_store(200);
    si_set_version(NCCL_VERSION(2, 20, 0));
    c = make_on(3, 2, 2, 5000, store, "late/");
    CHECK_ST(c, DM_ERR_TIMEOUT, dm_shrink(c, gone, 1, DM_SHRINK_DEFAULT, &s));
    assert_null(s);
    CHECK_MSG(c, "late/shrink/1/nccl_unique_id");
    CHECK_ST(c, DM_ERR_ABORTED, dm_barrier(c));
    dm_destroy(c);
    dm_store_destroy(store);
    /* arguments the core refuses before the backend runs */
    c = make(3, 2, 5000);
    CHECK_ST(c, DM_ERR_INVALID_ARG, dm_shrink(c, gone, 1, 7, &s));
    gone[0] = 0;
    CHECK_ST(c, DM_ERR_INVALID_ARG, dm_shrink(c, gone, 1, DM_SHRINK_DEFAULT, &s));   /* itself */
    CHECK_DM_OK(c, dm_barrier(c));
    dm_destroy(c);
    no_wrong_device();
    free_buffers_nothing_left(a, b);
}

/* >>threads  The watchdog (issue 30): an owner thread sits in an operation that cannot finish
   (its kernels wait on a dead peer: held work), and this thread calls dm_shrink with
   DM_SHRINK_ABORT once the owner polls. The owner must end promptly with DM_ERR_ABORTED, and
   no NCCL call of the watchdog may come while the owner is still inside its call: the hook
   sees every NCCL call that names a communicator, and one from the watchdog while the owner is
   inside waits (up to 2 s, holding the stand-in's lock) for the owner to return -- a wait that
   runs out is a call beside the owner's, counted. */
enum { OWN_BARRIER, OWN_SYNCHRONIZE, OWN_WAIT, OWN_START_HOST, OWN_GATHER_HOST, OWN_SPLIT };
typedef struct owner_job {
    dm_collective* c;
    int kind;
    float *a, *b;
    float host_src[N], host_dst[2 * N];
    dm_status st;
    int in_call;                /* atomic: 1 while the owner is inside its call */
    int pending_after;          /* si_pending_jobs() as soon as the call returned */
    int64_t returned_ms;
    dm_collective* split_out;
} owner_job;
static _Thread_local bool t_owner;   /* this thread is the owner */
static owner_job* g_job;             /* atomic: the owner's job while one runs */
static int g_beside;                 /* atomic: watchdog calls made beside the owner's call */
static void watchdog_hook(const char* fn, void* comm, void* user) {
    owner_job* j = __atomic_load_n(&g_job, __ATOMIC_ACQUIRE);
    int64_t until = tw_now_ms() + 2000;
    (void)fn; (void)comm; (void)user;
    if (!j || t_owner) return;
    while (__atomic_load_n(&j->in_call, __ATOMIC_ACQUIRE) && tw_now_ms() < until) sched_yield();
    if (__atomic_load_n(&j->in_call, __ATOMIC_ACQUIRE)) __atomic_add_fetch(&g_beside, 1, __ATOMIC_ACQ_REL);
}
static void* owner_main(void* arg) {
    owner_job* j = (owner_job*)arg;
    dm_request* req = NULL;
    t_owner = true;
    switch (j->kind) {
        case OWN_BARRIER:
            __atomic_store_n(&j->in_call, 1, __ATOMIC_RELEASE);
            j->st = dm_barrier(j->c);
            break;
        case OWN_SYNCHRONIZE:
            j->st = dm_all_reduce(j->c, j->a, j->b, N, DM_FLOAT32, DM_SUM);
            __atomic_store_n(&j->in_call, 1, __ATOMIC_RELEASE);
            if (j->st == DM_OK) j->st = dm_synchronize(j->c);
            break;
        case OWN_WAIT:
            j->st = dm_all_reduce_async(j->c, j->a, j->b, N, DM_FLOAT32, DM_SUM, &req);
            __atomic_store_n(&j->in_call, 1, __ATOMIC_RELEASE);
            if (j->st == DM_OK) j->st = dm_wait(req);
            break;
        case OWN_START_HOST:         /* host staging: the _async call itself waits for the stream */
            __atomic_store_n(&j->in_call, 1, __ATOMIC_RELEASE);
            j->st = dm_all_gather_async(j->c, j->host_src, j->host_dst, N, DM_FLOAT32, &req);
            if (j->st == DM_OK) j->st = dm_wait(req);
            break;
        case OWN_GATHER_HOST:
            __atomic_store_n(&j->in_call, 1, __ATOMIC_RELEASE);
            j->st = dm_all_gather(j->c, j->host_src, j->host_dst, N, DM_FLOAT32);
            break;
        default:
            __atomic_store_n(&j->in_call, 1, __ATOMIC_RELEASE);
            j->st = dm_split(j->c, 0, 0, &j->split_out);
            break;
    }
    j->returned_ms = tw_now_ms();
    j->pending_after = si_pending_jobs();
    __atomic_store_n(&j->in_call, 0, __ATOMIC_RELEASE);
    return NULL;
}
static int stream_polls(void) { return si_stream_queries(); }
static int async_polls(void) { return si_count("ncclCommGetAsyncError"); }
/* Runs the owner, then, once polls() has grown by 3 (the owner polls), shrinks its collective
   without rank `gone` with DM_SHRINK_ABORT from this thread; returns the shrink's status, *t0
   when it began. */
static dm_status watchdog_shrink(owner_job* j, int gone, int (*polls)(void), dm_collective** s, int64_t* t0) {
    pthread_t th;
    int base = polls();
    int64_t until = tw_now_ms() + 10000;
    dm_status st;
    __atomic_store_n(&g_beside, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&g_job, j, __ATOMIC_RELEASE);
    si_set_call_hook(watchdog_hook, NULL);
    assert_int_equal(pthread_create(&th, NULL, owner_main, j), 0);
    while (polls() < base + 3 && tw_now_ms() < until) sched_yield();
    *t0 = tw_now_ms();
    st = dm_shrink(j->c, &gone, 1, DM_SHRINK_ABORT, s);
    assert_int_equal(pthread_join(th, NULL), 0);
    si_set_call_hook(NULL, NULL);
    __atomic_store_n(&g_job, NULL, __ATOMIC_RELEASE);
    if (polls() < base + 3) fail_msg("the owner never polled (its call ended with %s)", dm_status_name(j->st));
    return st;
}
static void owner_init(owner_job* j, dm_collective* c, int kind, float* a, float* b) {
    memset(j, 0, sizeof(*j));
    j->c = c;
    j->kind = kind;
    j->a = a;
    j->b = b;
    j->st = DM_OK;
}

/* The owner in a blocking call, dm_synchronize, dm_wait on a stream request, an _async call
   staging host memory, each on work that never finishes (20 s deadline): dm_shrink(DM_SHRINK_ABORT) on this thread ends it at once with
   DM_ERR_ABORTED, reaches NCCL only after it (ncclCommShrink with NCCL_SHRINK_ABORT on the
   parked communicator), and the survivors' group works. Issue 30, point 2: stream requests and
   dm_synchronize were invisible to the core's ownership, so the shrink freed the communicator
   under the owner's poll. */
static void watchdog_case(int kind) {
    dm_collective *c, *s = NULL;
    owner_job job;
    int64_t t0;
    float *a, *b;
    c = make_with_buffers(2, 1, 20000, 2 * N, &a, &b);
    si_hold_streams(true);
    if (kind == OWN_START_HOST) CHECK_DM_OK(c, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));   /* never ends */
    owner_init(&job, c, kind, a, b);
    CHECK_DM_OK(c, watchdog_shrink(&job, 1, stream_polls, &s, &t0));
    si_hold_streams(false);
    if (job.st != DM_ERR_ABORTED) fail_msg("the owner's call ended with %s", dm_status_name(job.st));
    assert_true(job.returned_ms - t0 < 5000);
    assert_int_equal(__atomic_load_n(&g_beside, __ATOMIC_ACQUIRE), 0);
    assert_int_equal(si_last_shrink()->flags, NCCL_SHRINK_ABORT);
    comm_is(s, 0, 1);
    CHECK_DM_OK(s, dm_all_reduce(s, a, b, N, DM_FLOAT32, DM_SUM));
    CHECK_DM_OK(s, dm_synchronize(s));
    CHECK_ST(c, DM_ERR_ABORTED, dm_barrier(c));
    dm_destroy(s);
    dm_destroy(c);
    no_wrong_device();
    free_buffers_nothing_left(a, b);
}
static void test_standin_shrink_abort_interrupts_a_blocking_call(void** state) {
    (void)state;
    watchdog_case(OWN_BARRIER);
}
static void test_standin_shrink_abort_interrupts_dm_synchronize(void** state) {
    (void)state;
    watchdog_case(OWN_SYNCHRONIZE);
}
static void test_standin_shrink_abort_interrupts_a_staged_start(void** state) {
    (void)state;
    watchdog_case(OWN_START_HOST);
}
static void test_standin_shrink_abort_interrupts_dm_wait(void** state) {
    (void)state;
    watchdog_case(OWN_WAIT);
}

/* With a stream request in flight the collective belongs to the thread that issued it: another
   thread's blocking call, dm_synchronize and _async call get DM_ERR_BUSY and reach no NCCL call
   (point 2: they ran NCCL beside the owner). */
typedef struct { dm_collective* c; float *a, *b; dm_status barrier, sync, async; } other_job;
static void* other_thread(void* arg) {
    other_job* o = (other_job*)arg;
    dm_request* req = NULL;
    o->barrier = dm_barrier(o->c);
    o->sync = dm_synchronize(o->c);
    o->async = dm_all_reduce_async(o->c, o->a, o->b, N, DM_FLOAT32, DM_SUM, &req);
    if (req) dm_wait(req);
    return NULL;
}
static void test_standin_other_thread_is_busy_while_requests_run(void** state) {
    dm_collective* c;
    dm_request* req = NULL;
    other_job o;
    pthread_t th;
    int reduces;
    float *a, *b;
    (void)state;
    c = make_with_buffers(2, 1, 5000, 2 * N, &a, &b);
    CHECK_DM_OK(c, dm_all_reduce_async(c, a, b, N, DM_FLOAT32, DM_SUM, &req));
    reduces = si_count("ncclAllReduce");
    o.c = c; o.a = a; o.b = b;
    assert_int_equal(pthread_create(&th, NULL, other_thread, &o), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(o.barrier, DM_ERR_BUSY);
    assert_int_equal(o.sync, DM_ERR_BUSY);
    assert_int_equal(o.async, DM_ERR_BUSY);
    assert_int_equal(si_count("ncclAllReduce"), reduces);
    CHECK_DM_OK(c, dm_wait(req));
    CHECK_DM_OK(c, dm_synchronize(c));                 /* the owner's own calls still run */
    dm_destroy(c);
    no_wrong_device();
    free_buffers_nothing_left(a, b);
}

/* Point 3: a split whose job never ends, interrupted by dm_shrink(DM_SHRINK_ABORT) on another
   thread, aborts the parent before returning -- which joins NCCL's job, whose child is then
   aborted too -- so no job is left to write into the returned call's frame. The shrink then
   has no communicator left to shrink and no store: DM_ERR_UNSUPPORTED. */
static void test_standin_interrupted_split_leaves_no_job(void** state) {
    dm_collective *c, *s = NULL;
    owner_job job;
    int64_t t0;
    (void)state;
    si_reset();
    c = make(2, 1, 20000);
    si_set_init_us(0, true);
    owner_init(&job, c, OWN_SPLIT, NULL, NULL);
    CHECK_ST(c, DM_ERR_UNSUPPORTED, watchdog_shrink(&job, 1, async_polls, &s, &t0));
    assert_null(s);
    if (job.st != DM_ERR_ABORTED) fail_msg("the split ended with %s", dm_status_name(job.st));
    assert_null(job.split_out);
    assert_true(job.returned_ms - t0 < 5000);
    assert_int_equal(job.pending_after, 0);
    assert_int_equal(si_get()->live_comms, 0);      /* the parent, then the child its job wrote */
    si_set_init_us(1000, false);
    dm_destroy(c);
    no_wrong_device();
    nothing_left();
}

/* Issue 52, item 1: dm_abort on another thread stops a shrink that re-initialises through the
   store, wherever it waits: for the new rank 0's unique id in the store (dm_store_get sat
   there for the store's whole timeout, 20 s here), and for the new communicator's init (its
   poll looked only at the child and the deadline). The shrink ends DM_ERR_ABORTED, dm_abort
   returns, and no NCCL job is left. The bound asserted is a hang's (5 s); the latency is
   printed. */
typedef struct { dm_collective* c; int gone; dm_collective* out; dm_status st; int64_t returned_ms; } shrink_job;
static void* shrink_main(void* arg) {
    shrink_job* j = (shrink_job*)arg;
    j->st = dm_shrink(j->c, &j->gone, 1, DM_SHRINK_ABORT, &j->out);
    j->returned_ms = tw_now_ms();
    return NULL;
}
/* Shrinks c without `gone` on a thread, waits until ready() says the shrink sits where it
   should, then dm_abort from here; checks the shrink's DM_ERR_ABORTED and the times. */
static void abort_during_shrink(dm_collective* c, int gone, bool (*ready)(void), const char* where) {
    shrink_job j;
    pthread_t th;
    int64_t until = tw_now_ms() + 10000, t0, abort_back;
    memset(&j, 0, sizeof(j));
    j.c = c;
    j.gone = gone;
    assert_int_equal(pthread_create(&th, NULL, shrink_main, &j), 0);
    while (!ready() && tw_now_ms() < until) sched_yield();
    assert_true(ready());
    tw_sleep_ms(50);                    /* well inside the wait */
    t0 = tw_now_ms();
    assert_int_equal(dm_abort(c, "watchdog"), DM_OK);
    abort_back = tw_now_ms();
    assert_int_equal(pthread_join(th, NULL), 0);
    print_message("abort during a store shrink (%s): dm_abort returned after %lld ms, the shrink after %lld ms\n",
                  where, (long long)(abort_back - t0), (long long)(j.returned_ms - t0));
    if (j.st != DM_ERR_ABORTED)
        fail_msg("the shrink ended %s after %lld ms: %s", dm_status_name(j.st), (long long)(j.returned_ms - t0),
                 dm_last_error(c));
    assert_null(j.out);
    assert_true(j.returned_ms - t0 < 5000);
    assert_true(abort_back - t0 < 5000);
    assert_int_equal(si_pending_jobs(), 0);
}
static bool parent_aborted(void) { return si_get()->aborts >= 1; }
static bool child_initialising(void) { return si_pending_jobs() > 0; }
static void test_standin_abort_stops_a_store_shrink(void** state) {
    dm_collective* c;
    dm_store* store;
    (void)state;
    si_reset();
    store = rendezvous_store(20000);
    /* old rank 2 of 3 without rank 1: new rank 1, waiting for old rank 0's id, which never comes */
    c = make_on(3, 2, 1, 20000, store, "abort1/");
    abort_during_shrink(c, 1, parent_aborted, "waiting for the unique id");
    CHECK_ST(c, DM_ERR_ABORTED, dm_barrier(c));
    dm_destroy(c);
    /* old rank 1 of 3 without rank 0: new rank 0 publishes the id; the init never ends */
    si_reset();
    c = make_on(3, 1, 1, 20000, store, "abort2/");
    si_set_init_us(0, true);
    abort_during_shrink(c, 0, child_initialising, "initialising the new communicator");
    si_set_init_us(1000, false);
    dm_destroy(c);
    dm_store_destroy(store);
    no_wrong_device();
    nothing_left();
}

/* Issue 52, item 2: a CUDA graph capture on the communicator's stream is not a failure. The
   stand-in answers as CUDA does (stand_in_cuda_nccl.c >>capture: cudaStreamQuery 900 and the
   capture invalidated, cudaEventQuery 907 on an event recorded in it, cudaMalloc refused in
   global mode). Inside the capture the enqueue-only calls are captured (all_reduce, in-place
   all_to_all with stream-ordered scratch, an _async request, whose dm_wait is DM_OK at once);
   what waits on the host -- dm_synchronize, barrier, host-staged all_gather, broadcast and
   all_gather_to_list, an _async host-staged start, scratch without memory pools -- is
   DM_ERR_INVALID_ARG naming the capture, before touching the stream: the capture stays valid,
   nothing is aborted, and after cudaStreamEndCapture the communicator works. Before the fix
   dm_synchronize's cudaStreamQuery got 900 and aborted the communicator. */
static cudaError_t capture_call(dm_collective* c, bool begin) {
    cudaGraph_t graph = NULL;
    cudaError_t e;
    si_expect_device(-1);
    e = begin ? cudaStreamBeginCapture((cudaStream_t)dm_nccl_stream(c), cudaStreamCaptureModeGlobal)
              : cudaStreamEndCapture((cudaStream_t)dm_nccl_stream(c), &graph);
    if (graph) assert_int_equal(cudaGraphDestroy(graph), cudaSuccess);
    si_expect_device(g_device);
    return e;
}
#define CHECK_REFUSED_IN_CAPTURE(c, call) do {                                                  \
        CHECK_ST(c, DM_ERR_INVALID_ARG, call);                                                   \
        CHECK_MSG(c, "capturing a CUDA graph");                                                  \
        assert_int_equal(si_capture_status(dm_nccl_stream(c)), cudaStreamCaptureStatusActive);  \
    } while (0)
static void test_standin_capture_leaves_the_communicator_usable(void** state) {
    dm_collective* c;
    dm_request* req = NULL;
    float *a, *b, host[2 * N], host_out[2 * N * 2];
    void* list[2];
    int pools;
    (void)state;
    memset(host, 0, sizeof(host));
    for (pools = 1; pools >= 0; pools--) {
        si_reset();
        si_set_memory_pools(pools != 0);
        c = make(2, 1, 5000);
        a = dev(2 * N);
        b = dev(2 * N);
        list[0] = host_out;
        list[1] = host_out + N;
        assert_int_equal(capture_call(c, true), cudaSuccess);
        /* captured: enqueue only */
        CHECK_DM_OK(c, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
        CHECK_DM_OK(c, dm_all_gather(c, a, b, N, DM_FLOAT32));
        CHECK_DM_OK(c, dm_all_reduce_async(c, a, b, N, DM_FLOAT32, DM_SUM, &req));
        CHECK_DM_OK(c, dm_wait(req));
        if (pools) CHECK_DM_OK(c, dm_all_to_all(c, NULL, b, N / 2, DM_FLOAT32));   /* in place: scratch */
        else CHECK_REFUSED_IN_CAPTURE(c, dm_all_to_all(c, NULL, b, N / 2, DM_FLOAT32));
        /* refused: host-side waits */
        CHECK_REFUSED_IN_CAPTURE(c, dm_synchronize(c));
        CHECK_REFUSED_IN_CAPTURE(c, dm_barrier(c));
        CHECK_REFUSED_IN_CAPTURE(c, dm_all_gather(c, host, host_out, N, DM_FLOAT32));
        CHECK_REFUSED_IN_CAPTURE(c, dm_broadcast(c, host, N, DM_FLOAT32, 0));
        CHECK_REFUSED_IN_CAPTURE(c, dm_all_gather_to_list(c, a, list, N, DM_FLOAT32));
        req = NULL;
        CHECK_REFUSED_IN_CAPTURE(c, dm_all_gather_async(c, host, host_out, N, DM_FLOAT32, &req));
        assert_null(req);
        assert_int_equal(si_get()->capture_errors, 0);
        assert_int_equal(si_get()->aborts, 0);
        assert_int_equal(capture_call(c, false), cudaSuccess);    /* the capture was never invalidated */
        /* after the capture: everything works, nothing was aborted */
        CHECK_DM_OK(c, dm_synchronize(c));
        CHECK_DM_OK(c, dm_barrier(c));
        CHECK_DM_OK(c, dm_all_gather(c, host, host_out, N, DM_FLOAT32));
        CHECK_DM_OK(c, dm_all_to_all(c, NULL, b, N / 2, DM_FLOAT32));
        assert_int_equal(si_get()->aborts, 0);
        /* destroyed inside a capture (with memory pools: cudaFree is forbidden there): no wait
           for the stream, no abort */
        if (pools) {
            assert_int_equal(capture_call(c, true), cudaSuccess);
            CHECK_DM_OK(c, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
        }
        dm_destroy(c);          /* its owned stream, capture and all, is gone with it */
        assert_int_equal(si_get()->aborts, 0);
        assert_int_equal(si_get()->capture_errors, 0);
        no_wrong_device();
        free_buffers_nothing_left(a, b);
    }
    assert_int_equal(si_get()->live_graphs, 0);

    /* A graph that captured the communicator's work holds it: NCCL's destroy waits while the
       graph is alive (the stand-in counts that as a hang), so destroy the graph first. */
    for (pools = 0; pools < 2; pools++) {
        cudaGraph_t graph = NULL;
        si_reset();
        c = make(2, 1, 5000);
        a = dev(2 * N);
        b = dev(2 * N);
        assert_int_equal(capture_call(c, true), cudaSuccess);
        CHECK_DM_OK(c, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
        si_expect_device(-1);
        assert_int_equal(cudaStreamEndCapture((cudaStream_t)dm_nccl_stream(c), &graph), cudaSuccess);
        si_expect_device(g_device);
        if (pools == 0) {       /* the graph first: nothing waits */
            assert_int_equal(cudaGraphDestroy(graph), cudaSuccess);
            dm_destroy(c);
            free_buffers_nothing_left(a, b);
        } else {                /* the communicator first: NCCL would wait for the graph */
            dm_destroy(c);
            assert_int_equal(si_get()->hangs, 1);
            assert_non_null(strstr(si_get()->first_hang, "live CUDA graph"));
            assert_int_equal(cudaGraphDestroy(graph), cudaSuccess);
            si_reset();
            dev_free(a);
            dev_free(b);
            nothing_left();
        }
    }
}

/* Issue 52, item 3, the stand-in first: a peer's death is reported by NCCL only over the
   network (ncclRemoteError on every communicator: DM_ERR_NETWORK); a peer on this node leaves
   the work waiting for it spinning, with no error at all, until the deadline -- here, in one
   process, no local process really died, so distmesh has nothing to see either. */
static void test_standin_local_peer_death_is_silent(void** state) {
    dm_collective* c;
    float *a, *b;
    ncclResult_t async = ncclInternalError;
    (void)state;
    c = make_with_buffers(2, 1, 300, 2 * N, &a, &b);
    si_peer_dies(true);
    CHECK_DM_OK(c, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
    si_expect_device(-1);
    assert_int_equal(ncclCommGetAsyncError((ncclComm_t)dm_native_handle(c), &async), ncclSuccess);
    assert_int_equal(async, ncclSuccess);                       /* nothing reported */
    si_expect_device(g_device);
    CHECK_ST(c, DM_ERR_TIMEOUT, dm_synchronize(c));             /* the kernel spun until the deadline */
    si_hold_streams(false);
    dm_destroy(c);
    free_buffers_nothing_left(a, b);

    c = make_with_buffers(2, 1, 5000, 2 * N, &a, &b);
    si_peer_dies(false);
    CHECK_ST(c, DM_ERR_NETWORK, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
    dm_destroy(c);
    free_buffers_nothing_left(a, b);
}

/* Issue 52, item 3: a rank killed on the same node is reported on every survivor with
   DM_ERR_PEER_LOST naming it, long before the deadline (20 s), although NCCL (the stand-in,
   si_peer_dies(true)) reports nothing. LOCAL_W processes, each its own stand-in; their host
   identities (and process ids) travel through a shared page in place of NCCL's all_gather.
   Rank 1 is killed (kill -9) once all are ready; the survivors sit in dm_synchronize behind an
   all_reduce that waits for it. The bound asserted is a hang's (5 s); the latency from the
   kill to each survivor's return is printed. */
enum { LOCAL_W = 3, LOCAL_VICTIM = 1, LOCAL_REC = 512 };
typedef struct { int published[LOCAL_W]; unsigned char rec[LOCAL_W][LOCAL_REC]; } local_exchange;
static local_exchange* g_exchange;
static int g_exchange_rank;
static void exchange_hook(int peer, unsigned char* block, const unsigned char* mine, size_t bytes, void* user) {
    int64_t until = tw_now_ms() + 10000;
    (void)user;
    if (bytes > LOCAL_REC || peer >= LOCAL_W) return;
    if (!__atomic_load_n(&g_exchange->published[g_exchange_rank], __ATOMIC_ACQUIRE)) {
        memcpy(g_exchange->rec[g_exchange_rank], mine, bytes);
        __atomic_store_n(&g_exchange->published[g_exchange_rank], 1, __ATOMIC_RELEASE);
    }
    while (!__atomic_load_n(&g_exchange->published[peer], __ATOMIC_ACQUIRE) && tw_now_ms() < until) sched_yield();
    memcpy(block, g_exchange->rec[peer], bytes);
}
static int local_death_rank(int r, void* ctx) {
    static const unsigned char id[DM_NCCL_UNIQUE_ID_BYTES];
    dm_nccl_desc d;
    dm_collective* c = NULL;
    void *a = NULL, *b = NULL;
    dm_status st;
    (void)ctx;
    g_exchange_rank = r;
    si_reset();
    si_set_all_gather_peers(exchange_hook, NULL);
    memset(&d, 0, sizeof(d));
    d.rank = r;
    d.world_size = LOCAL_W;
    d.cuda_device = 2;
    d.unique_id = id;
    d.timeout_ms = 20000;
    if (dm_nccl_create(&d, &c) != DM_OK) {
        tw_report("rank %d create failed: %s\n", r, dm_last_error(NULL));
        return 1;
    }
    si_set_all_gather_peers(NULL, NULL);
    g_hook = NULL;
    if (cudaSetDevice(1) != cudaSuccess || cudaMalloc(&a, 64) != cudaSuccess || cudaMalloc(&b, 64) != cudaSuccess)
        return 1;
    if (r == LOCAL_VICTIM) {
        tw_ready();
        for (;;) tw_sleep_ms(1000);     /* until kill -9 */
    }
    si_peer_dies(true);                 /* the victim's part never comes: our kernels spin */
    st = dm_all_reduce(c, a, b, 4, DM_FLOAT32, DM_SUM);
    tw_ready();
    if (st == DM_OK) st = dm_synchronize(c);
    tw_report("rank %d %s %.6f %s\n", r, dm_status_name(st), tw_now_s(), dm_last_error(c));
    {   /* item 4: the survivors shrink without a store, together */
        int gone = LOCAL_VICTIM, size = -1;
        dm_collective* s = NULL;
        st = dm_shrink(c, &gone, 1, DM_SHRINK_ABORT, &s);
        if (st == DM_OK) {
            size = dm_world_size(s);
            si_hold_streams(false);     /* the new group's work ends: its members are alive */
            if (dm_all_reduce(s, a, b, 4, DM_FLOAT32, DM_SUM) != DM_OK || dm_synchronize(s) != DM_OK) size = -2;
        }
        tw_report("shrink %d %s %d %s\n", r, dm_status_name(st), size,
                  st != DM_OK ? dm_last_error(c) : size == -2 ? dm_last_error(s) : "");
        if (s) dm_destroy(s);
    }
    dm_destroy(c);
    cudaFree(a);
    cudaFree(b);
    for (;;) tw_sleep_ms(1000);         /* alive until every survivor reported (the parent ends us) */
}
typedef struct {
    int lines;
    char status[LOCAL_W][32];
    double at[LOCAL_W];
    char msg[LOCAL_W][256];
    char shrink[LOCAL_W][300];  /* "<status> <new size> <message>" */
} local_results;
static int local_line(char* line, void* u) {
    local_results* res = (local_results*)u;
    int r = -1, used = 0;
    char status[32];
    double at = 0;
    if (sscanf(line, "shrink %d %n", &r, &used) == 1 && r >= 0 && r < LOCAL_W) {
        snprintf(res->shrink[r], sizeof(res->shrink[r]), "%s", line + used);
        return 1;
    }
    if (sscanf(line, "rank %d %31s %lf %n", &r, status, &at, &used) < 3 || r < 0 || r >= LOCAL_W) {
        print_message("unexpected report: %s\n", line);
        return 1;
    }
    snprintf(res->status[r], sizeof(res->status[r]), "%s", status);
    res->at[r] = at;
    snprintf(res->msg[r], sizeof(res->msg[r]), "%s", line + used);
    res->lines++;
    return 1;
}
static void test_standin_local_peer_death_is_reported(void** state) {
    tw_world w;
    tw_reader rd;
    local_results res;
    int r;
    (void)state;
    memset(&res, 0, sizeof(res));
    g_exchange = (local_exchange*)mmap(NULL, sizeof(local_exchange), PROT_READ | PROT_WRITE,
                                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(g_exchange != MAP_FAILED);
    memset(g_exchange, 0, sizeof(*g_exchange));
    unsetenv("DISTMESH_TEST_HOST_ID");  /* every rank on this host */
    tw_world_init(&w, 60, true);
    w.quick_exit = true;
    assert_int_equal(tw_fork(&w, LOCAL_W, local_death_rank, NULL), 0);
    tw_reader_init(&rd, 2 * (LOCAL_W - 1), 40, local_line, &res);
    tw_reader_fault(&rd, LOCAL_VICTIM, 0, 50);
    tw_read_reports(&w, &rd);
    tw_kill_all(&w);
    munmap(g_exchange, sizeof(local_exchange));
    assert_true(rd.t_fault > 0);
    for (r = 0; r < LOCAL_W; r++) {
        if (r == LOCAL_VICTIM) continue;
        if (!res.status[r][0]) fail_msg("rank %d reported nothing", r);
        print_message("local peer killed: rank %d returned %s after %.1f ms\n", r, res.status[r],
                      (res.at[r] - rd.t_fault) * 1000);
        if (strcmp(res.status[r], "DM_ERR_PEER_LOST") != 0)
            fail_msg("rank %d: %s after %.0f ms: %s", r, res.status[r], (res.at[r] - rd.t_fault) * 1000, res.msg[r]);
        if (!strstr(res.msg[r], "rank 1 ")) fail_msg("rank %d's message lacks the rank: %s", r, res.msg[r]);
        assert_true(res.at[r] - rd.t_fault < 5.0);
        if (strncmp(res.shrink[r], "DM_OK 2 ", 8) != 0 && strcmp(res.shrink[r], "DM_OK 2") != 0)
            fail_msg("rank %d's shrink without a store: %s", r, res.shrink[r]);
    }
}

static dm_collective* make_on_hosts(int world, int rank, const char* const* tags);
/* Issue 52, item 4: DM_SHRINK_ABORT without a store on a communicator spanning hosts is refused
   at once (on every survivor alike: the host layout is the same everywhere), untouched, with a
   message; on one host it goes to ncclCommShrink (above). With a store it re-initialises. */
static void test_standin_shrink_abort_without_a_store_across_hosts_is_refused(void** state) {
    static const char* const two_hosts[4] = { "hA", "hA", "hB", "hB" };
    dm_collective *c, *s = NULL;
    int gone = 3;
    float *a, *b;
    (void)state;
    si_reset();
    c = make_on_hosts(4, 1, two_hosts);
    si_set_all_gather_peers(NULL, NULL);
    g_hook = NULL;
    a = dev(2 * N);
    b = dev(2 * N);
    CHECK_ST(c, DM_ERR_UNSUPPORTED, dm_shrink(c, &gone, 1, DM_SHRINK_ABORT, &s));
    CHECK_MSG(c, "spans hosts");
    assert_null(s);
    assert_int_equal(si_last_shrink()->calls, 0);
    assert_int_equal(si_get()->aborts, 0);
    CHECK_DM_OK(c, dm_shrink(c, &gone, 1, DM_SHRINK_DEFAULT, &s));   /* a planned removal still works */
    comm_is(s, 1, 3);
    dm_destroy(s);
    dm_destroy(c);
    unsetenv("DISTMESH_TEST_HOST_ID");
    no_wrong_device();
    free_buffers_nothing_left(a, b);
}

/* Issue 52, item 6: ncclGetLastError is one text for the whole process, never cleared (the
   stand-in keeps it across ncclCommAbort, as NCCL does), so it may be another call's: a
   failure's message names its own result first and quotes that text only after it, as
   context. Here a second communicator's asynchronous error (which writes no text) must not
   read as caused by the first one's "scripted for ncclAllReduce". */
static void test_standin_nccl_last_error_is_only_context(void** state) {
    dm_collective* c;
    float *a, *b;
    const char *msg, *own, *ctx, *stale;
    (void)state;
    c = make_with_buffers(2, 1, 5000, 2 * N, &a, &b);
    si_fail("enqueue", 1, ncclRemoteError, false);
    CHECK_ST(c, DM_ERR_NETWORK, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
    dm_destroy(c);                                      /* aborted: the text stays */
    si_expect_device(-1);
    assert_non_null(strstr(ncclGetLastError(NULL), "scripted for ncclAllReduce"));
    c = make(2, 1, 5000);
    si_fail("ncclCommGetAsyncError", 1, ncclSystemError, false);
    CHECK_ST(c, DM_ERR_NETWORK, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
    msg = dm_last_error(c);
    own = strstr(msg, ncclGetErrorString(ncclSystemError));
    ctx = strstr(msg, "NCCL's last error");
    stale = strstr(msg, "scripted for ncclAllReduce");
    if (!own || !ctx || !stale || !(own < ctx && ctx < stale))
        fail_msg("the call's own result first, NCCL's last error after it as context: \"%s\"", msg);
    dm_destroy(c);
    free_buffers_nothing_left(a, b);
}

/* Issue 52, section 2: the stand-in's ncclCommEnsureReady as NCCL's: a communicator still in
   progress refuses ncclCommUserRank (and split, shrink, destroy) with ncclInvalidArgument and
   keeps its state; only a collective's refusal (ncclEnqueueCheck's failure path) sets the
   state to that error. The stand-in used to set it for every caller. */
static void test_standin_ensure_ready_leaves_the_state_to_enqueue(void** state) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    ncclResult_t async = ncclSuccess;
    int rank = -1;
    void *a = NULL;
    (void)state;
    si_reset();
    memset(&id, 0, sizeof(id));
    config.blocking = 0;
    si_set_init_us(0, true);
    assert_int_equal(cudaSetDevice(1), cudaSuccess);
    assert_int_equal(cudaMalloc(&a, 64), cudaSuccess);
    assert_int_equal(ncclCommInitRankConfig(&comm, 2, id, 0, &config), ncclInProgress);
    assert_int_equal(ncclCommUserRank(comm, &rank), ncclInvalidArgument);
    assert_int_equal(ncclCommGetAsyncError(comm, &async), ncclSuccess);
    assert_int_equal(async, ncclInProgress);            /* untouched */
    assert_int_equal(ncclAllReduce(a, a, 4, ncclFloat32, ncclSum, comm, NULL), ncclInvalidArgument);
    assert_int_equal(ncclCommGetAsyncError(comm, &async), ncclSuccess);
    assert_int_equal(async, ncclInvalidArgument);       /* the enqueue check's failure sets it */
    assert_int_equal(ncclCommAbort(comm), ncclSuccess);
    assert_int_equal(cudaFree(a), cudaSuccess);
    assert_int_equal(cudaSetDevice(CALLER_DEVICE), cudaSuccess);
    assert_int_equal(si_get()->used_in_progress, 2);
    si_reset();                                         /* the refusals were this test's */
    nothing_left();
}

/* Issue 52, item 8: what a call costs the host. A wait for a kernel that takes 300 ms of wall
   time (si_set_work_us) must not keep a core busy: dm_synchronize's and dm_wait's polls back
   off to sleeps, so the thread's CPU time stays under a fifth of the wait (it was 40-100%:
   a sched_yield loop). Printed, not asserted: the CPU share of both waits, and calls per
   second and CPU microseconds per call of short all_reduces (world 2: each "in progress" for
   the launch's 100 us) with dm_synchronize after each (bench/nccl_host_cost.c measures more). */
static double thread_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
/* One wait on the 300 ms kernel (dm_wait(req), or dm_synchronize without one): it lasts, and
   this thread's CPU over it stays under a fifth of the wall time. */
static void wait_leaves_the_core(dm_collective* c, const char* what, dm_request* req) {
    double w0 = tw_now_s(), c0 = thread_cpu_s(), wall, cpu;
    CHECK_DM_OK(c, req ? dm_wait(req) : dm_synchronize(c));
    wall = tw_now_s() - w0;
    cpu = thread_cpu_s() - c0;
    print_message("%s on a 300 ms kernel: %.0f ms wall, %.1f ms CPU (%.1f%%)\n", what, wall * 1e3, cpu * 1e3,
                  100 * cpu / wall);
    assert_true(wall >= 0.25);
    assert_true(cpu < 0.2 * wall);
}
static void test_standin_waits_leave_the_core(void** state) {
    dm_collective* c;
    dm_request* req = NULL;
    float *a, *b;
    double w0, c0, wall, cpu;
    int i, calls = 2000;
    (void)state;
    c = make_with_buffers(2, 1, 20000, 2 * N, &a, &b);
    si_set_work_us(300000);
    CHECK_DM_OK(c, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
    wait_leaves_the_core(c, "dm_synchronize", NULL);
    CHECK_DM_OK(c, dm_all_reduce_async(c, a, b, N, DM_FLOAT32, DM_SUM, &req));
    wait_leaves_the_core(c, "dm_wait", req);
    si_set_work_us(0);
    w0 = tw_now_s();
    c0 = thread_cpu_s();
    for (i = 0; i < calls; i++) {
        CHECK_DM_OK(c, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
        CHECK_DM_OK(c, dm_synchronize(c));
    }
    wall = tw_now_s() - w0;
    cpu = thread_cpu_s() - c0;
    print_message("short all_reduce + dm_synchronize: %.0f calls/s, %.1f us CPU per call (stand-in)\n", calls / wall,
                  cpu * 1e6 / calls);
    dm_destroy(c);
    free_buffers_nothing_left(a, b);
}

/* Issue 52, section 2: the stand-in's jobs and kernels end after a time, as NCCL's threads and
   a GPU's work do, not after a number of polls (which tied their progress to how often distmesh
   polls). Each of NCCL's init, split and launch jobs and a kernel on the stream lasts WALL_US:
   every poll that returned before that time is up says "not yet", however many there are; past
   it, a single poll says done. */
enum { WALL_US = 200000 };
typedef struct wall_poll { ncclComm_t comm; cudaStream_t stream; } wall_poll;
static int job_running(const wall_poll* w) {
    ncclResult_t r = ncclInternalError;
    assert_int_equal(ncclCommGetAsyncError(w->comm, &r), ncclSuccess);
    if (r != ncclSuccess && r != ncclInProgress) fail_msg("the job failed: %d", (int)r);
    return r == ncclInProgress;
}
static int kernel_running(const wall_poll* w) {
    cudaError_t e = cudaStreamQuery(w->stream);
    if (e != cudaSuccess && e != cudaErrorNotReady) fail_msg("cudaStreamQuery: %d", (int)e);
    return e == cudaErrorNotReady;
}
/* started: before the call that began it; returned: after that call. Gives the times before
   and after the last poll (the one that saw it done). */
static void ends_by_time_not_polls(const char* what, int (*running)(const wall_poll*), const wall_poll* w,
                                   int64_t started, int64_t returned, int64_t last[2]) {
    int64_t up = started + (int64_t)WALL_US * 1000, after;
    int polls = 0;
    while (polls < 10000) {                     /* many, as fast as they come */
        int r = running(w);
        after = tw_now_ns();
        if (after >= up) break;
        polls++;
        if (!r) fail_msg("%s: done at poll %d, %.1f ms after its start, before its %d ms", what, polls,
                         (double)(after - started) / 1e6, WALL_US / 1000);
    }
    tw_sleep_us((long)((returned + (int64_t)WALL_US * 1000 - tw_now_ns()) / 1000) + 1000);
    last[0] = tw_now_ns();
    if (running(w)) fail_msg("%s: still running %d ms after its start", what, WALL_US / 1000);
    last[1] = tw_now_ns();
    print_message("%s: %d polls in its %d ms said \"not yet\", the one after said done\n", what, polls, WALL_US / 1000);
}
static void test_standin_work_ends_by_time_not_polls(void** state) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    ncclUniqueId id;
    ncclComm_t child = NULL;
    wall_poll w = { NULL, NULL };
    void* buf = NULL;
    int64_t t0, last[2];
    (void)state;
    si_reset();
    config.blocking = 0;
    assert_int_equal(ncclGetUniqueId(&id), ncclSuccess);
    assert_int_equal(cudaStreamCreate(&w.stream), cudaSuccess);
    assert_int_equal(cudaMalloc(&buf, 64), cudaSuccess);
    si_set_init_us(WALL_US, false);
    t0 = tw_now_ns();
    assert_int_equal(ncclCommInitRankConfig(&w.comm, 2, id, 0, &config), ncclInProgress);
    ends_by_time_not_polls("init", job_running, &w, t0, tw_now_ns(), last);
    t0 = tw_now_ns();
    assert_int_equal(ncclCommSplit(w.comm, 0, 0, &child, NULL), ncclSuccess);
    assert_null(child);                         /* written when the job ends */
    ends_by_time_not_polls("split", job_running, &w, t0, tw_now_ns(), last);
    assert_non_null(child);
    si_set_enqueue_us(WALL_US);
    si_set_work_us(WALL_US);
    t0 = tw_now_ns();
    assert_int_equal(ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, w.comm, w.stream), ncclInProgress);
    ends_by_time_not_polls("a collective's launch", job_running, &w, t0, tw_now_ns(), last);
    /* launched at the poll that saw the job end */
    ends_by_time_not_polls("its kernel", kernel_running, &w, last[0], last[1], last);
    assert_int_equal(ncclCommDestroy(child), ncclSuccess);
    assert_int_equal(ncclCommDestroy(w.comm), ncclSuccess);
    assert_int_equal(cudaStreamDestroy(w.stream), cudaSuccess);
    assert_int_equal(cudaFree(buf), cudaSuccess);
    si_reset();
    nothing_left();
}

/* Issue 52, section 2: a watchdog facing a thread stuck inside CUDA. The stand-in's
   synchronous calls really block behind a kernel that waits on a dead peer (>>waits in
   stand_in_cuda_nccl.c). A user's thread stuck there -- in cudaFree, dm_cuda_synchronize
   (cudaDeviceSynchronize), cudaStreamSynchronize on the collective's stream, cudaMemcpy on the
   legacy stream behind it (torch's .cpu()) -- is still stuck 300 ms later; the watchdog's
   dm_abort returns at once (no distmesh call holds the collective, so it aborts the
   communicator itself), the abort stops the kernel, and the stuck call returns cudaSuccess
   after it. distmesh_nccl.h's THREADS says what holds on NCCL. */
typedef struct stuck_call {
    int kind;
    cudaStream_t stream;
    void* mem;
    cudaError_t e;
    int done;                   /* atomic */
    int64_t ended_ns;
} stuck_call;
static const char* const stuck_kinds[] = { "cudaFree", "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaMemcpy" };
static void* stuck_in_cuda(void* arg) {
    stuck_call* s = (stuck_call*)arg;
    float host[N];
    if (cudaSetDevice(g_device) != cudaSuccess) s->e = cudaErrorInvalidDevice;
    else if (s->kind == 0) s->e = cudaFree(s->mem);
    else if (s->kind == 1) s->e = dm_cuda_synchronize() == DM_OK ? cudaSuccess : cudaErrorUnknown;
    else if (s->kind == 2) s->e = cudaStreamSynchronize(s->stream);
    else s->e = cudaMemcpy(host, s->mem, sizeof(host), cudaMemcpyDeviceToHost);
    s->ended_ns = tw_now_ns();
    __atomic_store_n(&s->done, 1, __ATOMIC_RELEASE);
    return NULL;
}
static void test_standin_watchdog_abort_frees_a_thread_stuck_in_cuda(void** state) {
    int kind;
    (void)state;
    for (kind = 0; kind < 4; kind++) {
        dm_collective* c;
        float *a, *b, *x;
        stuck_call s;
        pthread_t th;
        int64_t t0, t1;
        c = make_with_buffers(2, 1, 20000, 2 * N, &a, &b);
        x = dev(N);
        si_hold_streams(true);                  /* the kernel waits on a dead peer */
        CHECK_DM_OK(c, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
        memset(&s, 0, sizeof(s));
        s.kind = kind;
        s.stream = dm_nccl_stream(c);
        s.mem = kind == 0 ? (void*)x : (void*)b;
        assert_int_equal(pthread_create(&th, NULL, stuck_in_cuda, &s), 0);
        tw_sleep_ms(300);
        if (__atomic_load_n(&s.done, __ATOMIC_ACQUIRE))
            fail_msg("%s returned behind a kernel that never ends", stuck_kinds[kind]);
        t0 = tw_now_ns();
        assert_int_equal(dm_abort(c, "watchdog"), DM_OK);
        t1 = tw_now_ns();
        assert_int_equal(pthread_join(th, NULL), 0);
        print_message("%s stuck: dm_abort returned after %.1f ms, the stuck call %.1f ms after dm_abort began\n",
                      stuck_kinds[kind], (double)(t1 - t0) / 1e6, (double)(s.ended_ns - t0) / 1e6);
        assert_true(t1 - t0 < 1000000000LL);   /* not the collective's 20 s, nor the stand-in's 3 s bound */
        assert_int_equal(s.e, cudaSuccess);
        assert_true(s.ended_ns >= t0);          /* released by the abort */
        assert_int_equal(si_get()->aborts, 1);
        assert_int_equal(si_get()->wait_bounds, 0);
        assert_int_equal(si_get()->hangs, 1);   /* it was a wait behind a kernel that never ends */
        assert_non_null(strstr(si_get()->first_hang, stuck_kinds[kind]));
        si_hold_streams(false);
        CHECK_ST(c, DM_ERR_ABORTED, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
        dm_destroy(c);
        if (kind != 0) dev_free(x);
        no_wrong_device();
        si_reset();                             /* the hang was this test's */
        free_buffers_nothing_left(a, b);
    }
}

/* The stand-in's blocking communicators (bench/nccl_host_cost.c compares them): NCCL's default
   config or NCCL_COMM_BLOCKING=1 runs init and a collective's launch on the calling thread
   (each returns ncclSuccess after its time, no job left running), and distmesh works on one. */
static void test_standin_blocking_communicator_launches_in_the_call(void** state) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;      /* blocking: NCCL's default */
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    cudaStream_t stream = NULL;
    dm_collective* c;
    dm_request* req = NULL;
    float *a, *b;
    void* buf = NULL;
    int64_t t0;
    (void)state;
    si_reset();
    assert_int_equal(ncclGetUniqueId(&id), ncclSuccess);
    assert_int_equal(cudaStreamCreate(&stream), cudaSuccess);
    assert_int_equal(cudaMalloc(&buf, 64), cudaSuccess);
    assert_int_equal(ncclCommInitRankConfig(&comm, 2, id, 0, &config), ncclSuccess);
    assert_int_equal(si_pending_jobs(), 0);
    si_set_enqueue_us(100000);
    t0 = tw_now_ns();
    assert_int_equal(ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, comm, stream), ncclSuccess);
    assert_true(tw_now_ns() - t0 >= 100000000);         /* launched in the call */
    assert_int_equal(si_pending_jobs(), 0);
    assert_int_equal(ncclCommDestroy(comm), ncclSuccess);
    assert_int_equal(cudaStreamDestroy(stream), cudaSuccess);
    assert_int_equal(cudaFree(buf), cudaSuccess);

    si_reset();
    setenv("NCCL_COMM_BLOCKING", "1", 1);               /* over distmesh's config.blocking = 0 */
    c = make(2, 1, 5000);
    unsetenv("NCCL_COMM_BLOCKING");
    a = dev(N);
    b = dev(N);
    CHECK_DM_OK(c, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
    assert_int_equal(si_pending_jobs(), 0);
    CHECK_DM_OK(c, dm_all_reduce_async(c, a, b, N, DM_FLOAT32, DM_SUM, &req));
    CHECK_DM_OK(c, dm_wait(req));
    CHECK_DM_OK(c, dm_barrier(c));
    CHECK_DM_OK(c, dm_synchronize(c));
    dm_destroy(c);
    assert_int_equal(si_get()->used_in_progress, 0);
    no_wrong_device();
    free_buffers_nothing_left(a, b);
}

/* Point 9: on a device without memory pools, the scratch of a host-staged call interrupted
   while its kernels wait on a dead peer is not given to cudaFree (which would wait for the
   whole device, hence for those kernels, forever) until the shrink has stopped them. */
static void test_standin_parked_scratch_waits_for_the_abort(void** state) {
    dm_collective *c, *s = NULL;
    owner_job job;
    int64_t t0;
    float *a, *b;
    (void)state;
    si_reset();
    si_set_memory_pools(false);
    c = make(2, 1, 20000);
    a = dev(2 * N);
    b = dev(2 * N);
    si_hold_streams(true);
    CHECK_DM_OK(c, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));     /* a kernel that never ends */
    owner_init(&job, c, OWN_GATHER_HOST, a, b);
    CHECK_DM_OK(c, watchdog_shrink(&job, 1, stream_polls, &s, &t0));
    si_hold_streams(false);
    assert_int_equal(job.st, DM_ERR_ABORTED);
    assert_int_equal(__atomic_load_n(&g_beside, __ATOMIC_ACQUIRE), 0);
    CHECK_DM_OK(s, dm_all_gather(s, job.host_src, job.host_dst, N, DM_FLOAT32));
    dm_destroy(s);
    dm_destroy(c);
    no_wrong_device();
    free_buffers_nothing_left(a, b);
}

/* Point 1: NCCL 2.27+ writes the shrink's child only when the parent's job ends. A job that
   never ends (the deadline) or fails: the parent is aborted first, which joins the job, then
   the child it wrote -- nothing leaks, no job is left. (test_standin_shrink_uses_ncclCommShrink
   is the success.) */
static void test_standin_shrink_job_failures_abort_parent_then_child(void** state) {
    dm_collective *c, *s = NULL;
    int gone[1] = { 2 };
    float *a, *b;
    (void)state;
    c = make_with_buffers(3, 1, 200, 2 * N, &a, &b);
    si_set_init_us(0, true);
    CHECK_ST(c, DM_ERR_TIMEOUT, dm_shrink(c, gone, 1, DM_SHRINK_DEFAULT, &s));
    assert_null(s);
    CHECK_MSG(c, "timed out");
    assert_int_equal(si_get()->aborts, 2);
    assert_int_equal(si_get()->live_comms, 0);
    assert_int_equal(si_pending_jobs(), 0);
    CHECK_ST(c, DM_ERR_ABORTED, dm_barrier(c));
    si_set_init_us(1000, false);
    dm_destroy(c);

    c = make(3, 1, 5000);
    si_split_child_fails(ncclRemoteError);
    CHECK_ST(c, DM_ERR_NETWORK, dm_shrink(c, gone, 1, DM_SHRINK_ABORT, &s));
    assert_null(s);
    CHECK_MSG(c, "the new communicator failed");
    assert_int_equal(si_get()->aborts, 4);
    assert_int_equal(si_get()->live_comms, 0);
    si_split_child_fails(ncclSuccess);
    dm_destroy(c);
    no_wrong_device();
    free_buffers_nothing_left(a, b);
}

/* Point 4: NCCL cannot find dead ranks itself and refuses an empty exclude list; dm_shrink
   refuses n_exclude 0 first (DM_ERR_INVALID_ARG), with either flag, and leaves the collective
   as it was: no NCCL call, its request in flight undisturbed, its calls working. */
static void test_standin_shrink_without_excluded_ranks_is_refused(void** state) {
    dm_collective *c, *s = NULL;
    dm_request* req = NULL;
    float *a, *b;
    (void)state;
    c = make_with_buffers(3, 1, 5000, 2 * N, &a, &b);
    si_set_busy_us(20000);
    CHECK_DM_OK(c, dm_all_reduce_async(c, a, b, N, DM_FLOAT32, DM_SUM, &req));
    CHECK_ST(c, DM_ERR_INVALID_ARG, dm_shrink(c, NULL, 0, DM_SHRINK_ABORT, &s));
    assert_null(s);
    assert_int_equal(si_get()->aborts, 0);
    CHECK_DM_OK(c, dm_barrier(c));
    CHECK_ST(c, DM_ERR_INVALID_ARG, dm_shrink(c, NULL, 0, DM_SHRINK_ABORT, &s));
    CHECK_MSG(c, "excluded ranks");
    CHECK_ST(c, DM_ERR_INVALID_ARG, dm_shrink(c, NULL, 0, DM_SHRINK_DEFAULT, &s));
    assert_null(s);
    CHECK_DM_OK(c, dm_wait(req));
    assert_int_equal(si_last_shrink()->calls, 0);
    assert_int_equal(si_get()->aborts, 0);
    CHECK_DM_OK(c, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
    CHECK_DM_OK(c, dm_synchronize(c));
    dm_destroy(c);
    assert_int_equal(si_get()->destroys, 1);
    no_wrong_device();
    free_buffers_nothing_left(a, b);
}

/* Point 5: an asynchronous error that arrives after the last poll makes ncclCommDestroy fail
   (and leave its group open, freeing nothing): distmesh closes the group and aborts. Both on
   dm_destroy and on the healthy parent a DM_SHRINK_DEFAULT releases. */
static void test_standin_destroy_after_a_late_error_aborts(void** state) {
    dm_collective *c, *s = NULL;
    int gone[1] = { 2 };
    float *a, *b;
    (void)state;
    c = make_with_buffers(2, 1, 5000, 2 * N, &a, &b);
    CHECK_DM_OK(c, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
    si_fail("ncclCommDestroy", 1, ncclRemoteError, false);
    dm_destroy(c);
    assert_int_equal(si_get()->destroys, 0);
    assert_int_equal(si_get()->aborts, 1);
    assert_int_equal(si_get()->group_depth, 0);
    assert_int_equal(si_get()->live_comms, 0);

    c = make(3, 1, 5000);
    si_fail("ncclCommDestroy", 1, ncclRemoteError, false);
    CHECK_DM_OK(c, dm_shrink(c, gone, 1, DM_SHRINK_DEFAULT, &s));
    assert_int_equal(si_get()->aborts, 2);
    assert_int_equal(si_get()->group_depth, 0);
    CHECK_DM_OK(s, dm_all_reduce(s, a, b, N, DM_FLOAT32, DM_SUM));
    dm_destroy(s);
    dm_destroy(c);
    no_wrong_device();
    free_buffers_nothing_left(a, b);
}

/* Point 6: memory of another GPU is refused before anything is queued (DM_ERR_INVALID_ARG,
   the communicator usable), where NCCL's kernels would fault (a sticky illegal address); host
   memory is still staged where allowed, managed memory of any GPU accepted. */
static void test_standin_buffer_on_another_gpu_is_refused(void** state) {
    dm_collective* c;
    dm_request* req = NULL;
    float *a, *b, *other, *managed = NULL, host[2 * N];
    (void)state;
    c = make_with_buffers(2, 2, 5000, 2 * N, &a, &b);
    other = dev_on(3, 2 * N);
    CHECK_ST(c, DM_ERR_INVALID_ARG, dm_all_reduce(c, other, b, N, DM_FLOAT32, DM_SUM));
    CHECK_MSG(c, "GPU 3");
    CHECK_ST(c, DM_ERR_INVALID_ARG, dm_all_gather(c, a, other, N, DM_FLOAT32));
    CHECK_ST(c, DM_ERR_INVALID_ARG, dm_all_gather(c, host, other, N, DM_FLOAT32));
    CHECK_ST(c, DM_ERR_INVALID_ARG, dm_broadcast(c, other, N, DM_FLOAT32, 0));
    CHECK_ST(c, DM_ERR_INVALID_ARG, dm_send(c, other, N, DM_FLOAT32, 1, 0));
    CHECK_ST(c, DM_ERR_INVALID_ARG, dm_all_to_all(c, a, other, N / 2, DM_FLOAT32));
    CHECK_ST(c, DM_ERR_INVALID_ARG, dm_reduce_scatter_async(c, other, b, N / 2, DM_FLOAT32, DM_SUM, &req));
    assert_null(req);
    assert_int_equal(si_get()->aborts, 0);
    CHECK_DM_OK(c, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
    si_expect_device(-1);
    assert_int_equal(cudaSetDevice(3), cudaSuccess);
    assert_int_equal(cudaMallocManaged((void**)&managed, 2 * N * sizeof(float), cudaMemAttachGlobal), cudaSuccess);
    assert_int_equal(cudaSetDevice(CALLER_DEVICE), cudaSuccess);
    si_expect_device(g_device);
    CHECK_DM_OK(c, dm_all_reduce(c, managed, b, N, DM_FLOAT32, DM_SUM));
    CHECK_DM_OK(c, dm_synchronize(c));
    dm_destroy(c);
    no_wrong_device();
    dev_free(a);
    dev_free(b);
    dev_free(other);
    dev_free(managed);
    nothing_left();
}

/* Point 7: with NCCL_COMM_SHRINK_SHARE_RESOURCES=1 (which overrides the config) a
   DM_SHRINK_DEFAULT child shares its parent's abort flag: the healthy parent is destroyed,
   not aborted, so the child's work is not silently skipped. */
static void test_standin_shared_abort_flag_spares_the_shrunk_child(void** state) {
    dm_collective *c, *s = NULL;
    int gone[1] = { 2 };
    float *a, *b;
    (void)state;
    si_reset();
    setenv("NCCL_COMM_SHRINK_SHARE_RESOURCES", "1", 1);
    setenv("NCCL_COMM_SPLIT_SHARE_RESOURCES", "1", 1);
    c = make(3, 1, 5000);
    a = dev(2 * N);
    b = dev(2 * N);
    CHECK_DM_OK(c, dm_shrink(c, gone, 1, DM_SHRINK_DEFAULT, &s));
    CHECK_DM_OK(s, dm_all_reduce(s, a, b, N, DM_FLOAT32, DM_SUM));
    CHECK_DM_OK(s, dm_synchronize(s));
    assert_int_equal(si_get()->skipped_by_shared_abort, 0);     /* the child's work ran */
    assert_int_equal(si_get()->aborts, 0);
    assert_int_equal(si_get()->destroys, 1);
    dm_destroy(s);
    dm_destroy(c);
    unsetenv("NCCL_COMM_SHRINK_SHARE_RESOURCES");
    unsetenv("NCCL_COMM_SPLIT_SHARE_RESOURCES");
    no_wrong_device();
    free_buffers_nothing_left(a, b);
}

/* Point 8: dm_local_rank, dm_local_world_size and dm_is_local_master from the members' host
   identities (DISTMESH_TEST_HOST_ID here), on create, split and shrink, never the group's size.
   The other ranks' identities come from the stand-in's all_gather hook: each one's is this
   rank's with the host tag replaced (tags all 2 characters). */
static const char* g_tags[8];
static void hosts_hook(int peer, unsigned char* block, const unsigned char* mine, size_t bytes, void* user) {
    const char* own = getenv("DISTMESH_TEST_HOST_ID");
    size_t i;
    (void)user;
    memcpy(block, mine, bytes);
    for (i = 0; own && i + 2 <= bytes; i++)
        if (block[i] == (unsigned char)own[0] && block[i + 1] == (unsigned char)own[1]) memcpy(block + i, g_tags[peer], 2);
}
static dm_collective* make_on_hosts(int world, int rank, const char* const* tags) {
    int r;
    for (r = 0; r < world; r++) g_tags[r] = tags[r];
    setenv("DISTMESH_TEST_HOST_ID", tags[rank], 1);
    si_set_all_gather_peers(hosts_hook, NULL);
    g_hook = hosts_hook;
    return make_on(world, rank, 1, 5000, NULL, NULL);
}
static void local_is(dm_collective* c, int local_rank, int local_size) {
    assert_int_equal(dm_local_rank(c), local_rank);
    assert_int_equal(dm_local_world_size(c), local_size);
    assert_int_equal(dm_is_local_master(c), local_rank == 0);
}
static void test_standin_local_facts_from_host_identities(void** state) {
    static const char* const packed[4] = { "hA", "hA", "hB", "hB" };
    static const char* const mixed[4] = { "hA", "hB", "hA", "hB" };
    static const char* const alone[4] = { "hA", "hB", "hC", "hD" };
    static const char* const child[3] = { "hB", "hB", "hA" };
    dm_collective *c, *s = NULL;
    int gone0[1] = { 0 }, gone3[1] = { 3 }, r;
    (void)state;
    si_reset();
    c = make_on_hosts(4, 1, packed);
    local_is(c, 1, 2);
    assert_string_equal(c->node_name, "hA");
    CHECK_DM_OK(c, dm_shrink(c, gone0, 1, DM_SHRINK_DEFAULT, &s));   /* ranks 1, 2, 3: hA hB hB */
    comm_is(s, 0, 3);
    local_is(s, 0, 1);
    dm_destroy(s);
    dm_destroy(c);

    c = make_on_hosts(4, 1, packed);
    CHECK_DM_OK(c, dm_shrink(c, gone3, 1, DM_SHRINK_DEFAULT, &s));   /* ranks 0, 1, 2: hA hA hB */
    comm_is(s, 1, 3);
    local_is(s, 1, 2);
    dm_destroy(s);
    dm_destroy(c);

    c = make_on_hosts(4, 2, mixed);
    local_is(c, 1, 2);
    for (r = 0; r < 3; r++) g_tags[r] = child[r];                 /* the child's members */
    setenv("DISTMESH_TEST_HOST_ID", child[1], 1);
    si_set_split_child(1, 3);
    CHECK_DM_OK(c, dm_split(c, 0, 0, &s));
    comm_is(s, 1, 3);
    local_is(s, 1, 2);
    assert_string_equal(s->node_name, "hB");
    dm_destroy(s);
    dm_destroy(c);

    c = make_on_hosts(4, 3, alone);
    local_is(c, 0, 1);
    dm_destroy(c);
    si_set_all_gather_peers(NULL, NULL);
    g_hook = NULL;
    unsetenv("DISTMESH_TEST_HOST_ID");
    no_wrong_device();
    nothing_left();
}
/* The launcher's LOCAL_RANK / LOCAL_WORLD_SIZE win over the host identities (as on TCP). */
static void test_standin_local_facts_from_the_launcher(void** state) {
    static const char* const packed[4] = { "hA", "hA", "hB", "hB" };
    static const unsigned char id[DM_NCCL_UNIQUE_ID_BYTES];
    dm_nccl_desc d;
    dm_collective* c = NULL;
    int r;
    (void)state;
    si_reset();
    for (r = 0; r < 4; r++) g_tags[r] = packed[r];
    setenv("DISTMESH_TEST_HOST_ID", packed[1], 1);
    si_set_all_gather_peers(hosts_hook, NULL);
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "4", 1);
    setenv("LOCAL_RANK", "0", 1);
    setenv("LOCAL_WORLD_SIZE", "1", 1);
    memset(&d, 0, sizeof(d));
    d.unique_id = id;
    d.cuda_device = 2;
    d.timeout_ms = 5000;
    assert_int_equal(dm_nccl_create(&d, &c), DM_OK);
    local_is(c, 0, 1);
    dm_destroy(c);
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    unsetenv("LOCAL_RANK");
    unsetenv("LOCAL_WORLD_SIZE");
    unsetenv("DISTMESH_TEST_HOST_ID");
    si_set_all_gather_peers(NULL, NULL);
    g_hook = NULL;
    assert_int_equal(cudaSetDevice(CALLER_DEVICE), cudaSuccess);
    nothing_left();
}

/* >>rendezvous  No unique id in the desc: rank 0 publishes its ncclGetUniqueId through the
   store under "<prefix>nccl_unique_id", every other rank reads it -- in a build without
   DISTMESH_TCP too. */
static dm_collective* make_through(int world, int rank, dm_store* store, const char* prefix) {
    dm_nccl_desc d;
    dm_collective* c = NULL;
    memset(&d, 0, sizeof(d));
    d.rank = rank;
    d.world_size = world;
    d.store = store;
    d.prefix = prefix;
    d.cuda_device = 2;
    d.timeout_ms = 5000;
    assert_int_equal(cudaSetDevice(CALLER_DEVICE), cudaSuccess);
    if (dm_nccl_create(&d, &c) != DM_OK) fail_msg("dm_nccl_create through the store failed");
    assert_int_equal(cudaSetDevice(CALLER_DEVICE), cudaSuccess);
    return c;
}
static void test_standin_unique_id_through_the_store(void** state) {
    dm_collective* c;
    dm_store* store;
    unsigned char id[DM_NCCL_UNIQUE_ID_BYTES], first = 0;
    void* value = NULL;
    size_t len = 0;
    int r = -1, n = -1;
    (void)state;
    si_reset();
    store = rendezvous_store(2000);
    /* rank 0 of 1 publishes the id it got from ncclGetUniqueId and initialises with it; the last
       rank to have it (here rank 0 itself) deletes it (issue 52, item 7: the store, often
       torchrun's, outlives us) */
    c = make_through(1, 0, store, "rv0/");
    assert_int_equal(si_count("ncclGetUniqueId"), 1);
    si_comm_info(dm_native_handle(c), &r, &n, &first);
    assert_int_not_equal(first, 0);
    key_is_gone(store, "rv0/nccl_unique_id");
    key_is_gone(store, "rv0/nccl_unique_id_read");
    dm_destroy(c);
    /* rank 1 of 2 reads what rank 0 published (here: the test) */
    memset(id, 0, sizeof(id));
    id[0] = 55;
    CHECK_DM_OK(NULL, dm_store_set(store, "rv1/nccl_unique_id", id, sizeof(id)));
    c = make_through(2, 1, store, "rv1/");
    si_comm_info(dm_native_handle(c), &r, &n, &first);
    assert_int_equal(r, 1);
    assert_int_equal(n, 2);
    assert_int_equal(first, 55);
    assert_int_equal(si_count("ncclGetUniqueId"), 1);
    /* rank 0 (the test) has not counted itself: rank 1 is not the last, the id stays */
    CHECK_DM_OK(NULL, dm_store_get(store, "rv1/nccl_unique_id", &value, &len));
    assert_int_equal(len, DM_NCCL_UNIQUE_ID_BYTES);
    dm_store_free(store, value);
    dm_destroy(c);
    dm_store_destroy(store);
    {   /* a store the create opens itself (store_url), here a file store that outlives it: rank 0
           deletes the id and the count of its readers once every rank has read it */
        dm_nccl_desc d;
        dm_store_desc sd;
        char url[320];
        memset(&d, 0, sizeof(d));
        snprintf(url, sizeof(url), "file://%s/own_store", g_dir);
        d.rank = 0;
        d.world_size = 1;
        d.store_url = url;
        d.prefix = "own/";
        d.cuda_device = 2;
        d.timeout_ms = 5000;
        assert_int_equal(cudaSetDevice(CALLER_DEVICE), cudaSuccess);
        if (dm_nccl_create(&d, &c) != DM_OK) fail_msg("dm_nccl_create through store_url: %s", dm_last_error(NULL));
        dm_destroy(c);
        assert_int_equal(cudaSetDevice(CALLER_DEVICE), cudaSuccess);
        memset(&sd, 0, sizeof(sd));
        sd.url = url;
        sd.timeout_ms = 2000;
        assert_int_equal(dm_store_create(&sd, &store), DM_OK);
        key_is_gone(store, "own/nccl_unique_id");
        key_is_gone(store, "own/nccl_unique_id_read");
        dm_store_destroy(store);
    }
    nothing_left();
}

#if !defined(DISTMESH_TCP)
/* Without libuv, rank 0 cannot host the store its desc names: DM_ERR_UNSUPPORTED, and the
   store's reason reaches the logger (not "could not reach the rendezvous store"). */
static void test_standin_hosting_the_store_needs_libuv(void** state) {
    dm_nccl_desc d;
    dm_collective* c = NULL;
    (void)state;
    si_reset();
    unsetenv("TORCHELASTIC_USE_AGENT_STORE");
    memset(&d, 0, sizeof(d));
    d.rank = 0;
    d.world_size = 2;
    d.store_url = "tcp://127.0.0.1:0";
    d.cuda_device = 2;
    d.timeout_ms = 2000;
    d.logger.func = tu_capture_log;
    assert_int_equal(cudaSetDevice(CALLER_DEVICE), cudaSuccess);
    assert_int_equal(dm_nccl_create(&d, &c), DM_ERR_UNSUPPORTED);
    assert_null(c);
    assert_int_equal(g_tu_log.status, DM_ERR_UNSUPPORTED);
    if (!strstr(g_tu_log.msg, "nccl: store: tcp-store: server tcp://127.0.0.1:0: this build cannot host a store"))
        fail_msg("log: %s", g_tu_log.msg);
    assert_int_equal(si_count("ncclGetUniqueId"), 0);
    nothing_left();
}
#endif


static int standin_setup(void** state) {
    printf("NCCL backend against a scripted stand-in for libcudart/libnccl (no GPU involved)%s\n",
#if defined(DISTMESH_TCP)
           ", with DISTMESH_TCP");
#else
           ", without DISTMESH_TCP (store: file, no libuv)");
#endif
    return tmpdir_setup(state);
}
#if defined(DISTMESH_TCP)
#define STANDIN_NO_TCP_TESTS
#else
#define STANDIN_NO_TCP_TESTS cmocka_unit_test(test_standin_hosting_the_store_needs_libuv),
#endif
DM_TEST_MAIN(standin_setup, tmpdir_teardown,
    cmocka_unit_test(test_standin_every_slot_runs_on_the_communicators_device),
    cmocka_unit_test(test_standin_nccl_error_on_enqueue_aborts_once),
    cmocka_unit_test(test_standin_group_and_async_errors_abort),
    cmocka_unit_test(test_standin_split_failures_abort_the_child),
    cmocka_unit_test(test_standin_cuda_and_poll_results_are_checked),
    cmocka_unit_test(test_standin_host_copy_waits_with_the_deadline),
    cmocka_unit_test(test_standin_sticky_cuda_error_aborts_and_settles),
    cmocka_unit_test(test_standin_shrink_uses_ncclCommShrink),
    cmocka_unit_test(test_standin_shrink_falls_back_to_reinit_through_the_store),
    cmocka_unit_test(test_standin_failed_shrink_reports_and_leaks_nothing),
    cmocka_unit_test(test_standin_shrink_abort_interrupts_a_blocking_call),
    cmocka_unit_test(test_standin_shrink_abort_interrupts_dm_synchronize),
    cmocka_unit_test(test_standin_shrink_abort_interrupts_dm_wait),
    cmocka_unit_test(test_standin_shrink_abort_interrupts_a_staged_start),
    cmocka_unit_test(test_standin_other_thread_is_busy_while_requests_run),
    cmocka_unit_test(test_standin_interrupted_split_leaves_no_job),
    cmocka_unit_test(test_standin_abort_stops_a_store_shrink),
    cmocka_unit_test(test_standin_capture_leaves_the_communicator_usable),
    cmocka_unit_test(test_standin_local_peer_death_is_silent),
    cmocka_unit_test(test_standin_local_peer_death_is_reported),
    cmocka_unit_test(test_standin_shrink_abort_without_a_store_across_hosts_is_refused),
    cmocka_unit_test(test_standin_nccl_last_error_is_only_context),
    cmocka_unit_test(test_standin_ensure_ready_leaves_the_state_to_enqueue),
    cmocka_unit_test(test_standin_waits_leave_the_core),
    cmocka_unit_test(test_standin_work_ends_by_time_not_polls),
    cmocka_unit_test(test_standin_watchdog_abort_frees_a_thread_stuck_in_cuda),
    cmocka_unit_test(test_standin_blocking_communicator_launches_in_the_call),
    cmocka_unit_test(test_standin_parked_scratch_waits_for_the_abort),
    cmocka_unit_test(test_standin_shrink_job_failures_abort_parent_then_child),
    cmocka_unit_test(test_standin_shrink_without_excluded_ranks_is_refused),
    cmocka_unit_test(test_standin_destroy_after_a_late_error_aborts),
    cmocka_unit_test(test_standin_buffer_on_another_gpu_is_refused),
    cmocka_unit_test(test_standin_shared_abort_flag_spares_the_shrunk_child),
    cmocka_unit_test(test_standin_local_facts_from_host_identities),
    cmocka_unit_test(test_standin_local_facts_from_the_launcher),
    cmocka_unit_test(test_standin_unique_id_through_the_store),
    STANDIN_NO_TCP_TESTS)
