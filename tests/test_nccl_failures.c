/* The NCCL backend's failure paths of issue 41 (part 2), against the CUDA/NCCL stand-in
   (tests/stand_in_cuda_nccl.c; no GPU involved), beside tests/test_nccl_standin.c:
   - dm_abort stops NCCL's work: the communicator is aborted, on the owner's thread or, on an
     idle collective, by dm_abort itself; no wait on the legacy default stream (cudaMemcpy) or the
     whole device hangs afterwards (item 1);
   - scratch of a call interrupted inside its stream wait is not given to cudaFree while the
     parked communicator's kernels run, nor after a dm_abort there (item 3);
   - the survivors of a shrink take one path whatever their own communicator's state: one whose
     communicator a failure aborted and one only interrupted both re-initialise, and so does one
     whose communicator is still "in progress" (items 2 and 4);
   - the unique id's store key is per torchrun attempt (item 5);
   - a failed ncclCommDestroy before NCCL 2.24 leaves no stray ncclGroupEnd (item 6);
   - an NCCL older than the floor is refused at create; ncclCommShrink is a weak reference, so
     a program links and runs on an NCCL without it (item 7; tests/nccl_failures.mk builds this
     file a second time against a stand-in without the symbol);
   and what the stand-in models for them: NCCL 2.28 launches a call's work when "in progress"
   clears, not at the call; the first use of a peer waits for it; a blocking stream and the
   legacy default stream wait for each other; ncclCommDestroy opens a group only from 2.24. */
#define _GNU_SOURCE
#include "distmesh.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>

#include <cmocka.h>
#include "test_filter.h"
#include "test_world.h"
#include "stand_in_cuda_nccl.h"
#include "test_nccl_util.h"

static char g_dir[256];

#define CHECK_ST(c, want, expr) do { dm_status s_ = (expr);                                   \
        if (s_ != (want)) fail_msg("%s -> %s (want %s): %s", #expr, dm_status_name(s_),          \
                                   dm_status_name(want), dm_last_error(c));                      \
    } while (0)
#define CHECK_OK(c, expr) CHECK_ST(c, DM_OK, expr)

/* Every rank on this host by default (same_host): where each is a host of its own,
   DM_SHRINK_ABORT without a store is refused. */
/* A communicator of `world` ranks, this one `rank`, on `device`; the unique id: id_byte in the
   desc (0: through `store`, under prefix). */
static dm_collective* make_with(int world, int rank, int device, int timeout_ms, dm_store* store,
                                const char* prefix, bool id_in_desc) {
    dm_nccl_desc d;
    dm_collective* c = NULL;
    static const unsigned char id[DM_NCCL_UNIQUE_ID_BYTES];
    memset(&d, 0, sizeof(d));
    d.rank = rank;
    d.world_size = world;
    d.store = store;
    d.prefix = prefix;
    d.cuda_device = device + 1;
    d.unique_id = id_in_desc ? id : NULL;
    d.timeout_ms = timeout_ms;
    assert_int_equal(cudaSetDevice(CALLER_DEVICE), cudaSuccess);
    si_set_all_gather_peers(same_host, NULL);
    if (dm_nccl_create(&d, &c) != DM_OK) fail_msg("dm_nccl_create: %s", dm_last_error(NULL));
    si_set_all_gather_peers(NULL, NULL);
    assert_int_equal(cudaSetDevice(CALLER_DEVICE), cudaSuccess);
    g_device = device;
    si_expect_device(device);
    return c;
}
static dm_collective* make(int world, int rank, int timeout_ms, dm_store* store, const char* prefix) {
    return make_with(world, rank, 1, timeout_ms, store, prefix, true);
}
static dm_store* rendezvous_store(int timeout_ms) {
    dm_store_desc sd;
    dm_store* st = NULL;
    static int made;
    char url[320];
    memset(&sd, 0, sizeof(sd));
    snprintf(url, sizeof(url), "file://%s/store%d", g_dir, ++made);
    sd.url = url;
    sd.timeout_ms = timeout_ms;
    assert_int_equal(dm_store_create(&sd, &st), DM_OK);
    return st;
}
static unsigned char id_of(dm_collective* c, int rank, int size) {
    int r = -2, n = -2;
    unsigned char id = 0;
    si_comm_info(dm_native_handle(c), &r, &n, &id);
    assert_int_equal(r, rank);
    assert_int_equal(n, size);
    return id;
}
/* Every test ends here: nothing left, nothing misused (tests/test_nccl_standin.c's list, and
   the stand-in's new counts). */
static void nothing_left(void) {
    const si_stats* s = si_get();
    nothing_left_shared();
    if (s->before_launch) fail_msg("%d uses of a stream ahead of NCCL's launch, the first: %s", s->before_launch,
                                   s->first_before_launch);
    if (s->wrong_device_calls) fail_msg("%d calls on the wrong device, the first: %s", s->wrong_device_calls,
                                        s->first_wrong_device_call);
    assert_int_equal(s->unordered_with_legacy, 0);
    assert_int_equal(s->stray_group_ends, 0);
}
/* What a user does after an abort: copies to the host on the legacy default stream (cudaMemcpy;
   cudaMemcpyAsync on stream 0 and cudaStreamSynchronize(0)), and a device-wide sync; none may
   wait behind NCCL's kernels. */
static void user_copies_back(float* d) {
    float host[N];
    si_expect_device(-1);
    assert_int_equal(cudaSetDevice(g_device), cudaSuccess);
    assert_int_equal(cudaMemcpy(host, d, sizeof(host), cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(cudaMemcpyAsync(host, d, sizeof(host), cudaMemcpyDeviceToHost, 0), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(0), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(cudaSetDevice(CALLER_DEVICE), cudaSuccess);
    if (si_get()->hangs) fail_msg("after the abort: %s", si_get()->first_hang);
    si_expect_device(g_device);
}

/* >>owner  A thread inside a call on c while this one calls dm_abort or dm_shrink. */
enum { OWN_SYNCHRONIZE, OWN_ALL_TO_ALL_IN_PLACE, OWN_SEND };
typedef struct owner_job {
    dm_collective* c;
    int kind;
    float *a, *b;
    dm_status st;
} owner_job;
static void* owner_main(void* arg) {
    owner_job* j = (owner_job*)arg;
    switch (j->kind) {
        case OWN_SYNCHRONIZE: j->st = dm_synchronize(j->c); break;
        case OWN_ALL_TO_ALL_IN_PLACE: j->st = dm_all_to_all(j->c, NULL, j->a, N / 2, DM_FLOAT32); break;
        default: j->st = dm_send(j->c, j->a, N, DM_FLOAT32, 1, 0); break;
    }
    return NULL;
}
static int stream_polls(void) { return si_stream_queries(); }
static int async_polls(void) { return si_count("ncclCommGetAsyncError"); }
/* Starts the owner; returns once polls() has grown by 3 (the owner waits inside its call). */
static void owner_start(owner_job* j, pthread_t* th, int (*polls)(void)) {
    int base = polls();
    int64_t until = tw_now_ms() + 10000;
    j->st = DM_OK;
    assert_int_equal(pthread_create(th, NULL, owner_main, j), 0);
    while (polls() < base + 3 && tw_now_ms() < until) sched_yield();
    if (polls() < base + 3) fail_msg("the owner never polled");
}
/* An owner thread on c sending N floats of a fresh buffer (*a; *b a second one) to rank 1, which
   never comes (the shrink cases below): started once it polls the communicator. */
static void owner_sends_to_the_absent(dm_collective* c, owner_job* job, pthread_t* th, float** a, float** b) {
    *a = dev(N);
    *b = dev(N);
    si_set_peer_arrival_us(0, true);
    memset(job, 0, sizeof(*job));
    job->c = c;
    job->kind = OWN_SEND;
    job->a = *a;
    job->b = *b;
    owner_start(job, th, async_polls);
}

/* Item 1: dm_abort while the owner waits in dm_synchronize for kernels that never end (a dead
   peer): the owner ends with DM_ERR_ABORTED, the communicator is aborted (its kernels stop), and
   the user's cudaMemcpy and cudaDeviceSynchronize then return. Before: on NCCL 2.27+ the
   communicator was parked for a shrink that never came. */
static void test_failures_dm_abort_stops_a_running_calls_kernels(void** state) {
    dm_collective* c;
    owner_job job;
    pthread_t th;
    float *a, *b;
    (void)state;
    si_reset();
    c = make(2, 0, 20000, NULL, NULL);
    a = dev(N);
    b = dev(N);
    si_hold_streams(true);
    CHECK_OK(c, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));     /* never ends */
    memset(&job, 0, sizeof(job));
    job.c = c;
    job.kind = OWN_SYNCHRONIZE;
    owner_start(&job, &th, stream_polls);
    CHECK_OK(c, dm_abort(c, "watchdog"));
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(job.st, DM_ERR_ABORTED);
    user_copies_back(b);
    assert_int_equal(si_get()->aborts, 1);
    si_expect_device(-1);
    assert_int_equal(cudaSetDevice(g_device), cudaSuccess);
    assert_int_equal(cudaStreamQuery((cudaStream_t)dm_nccl_stream(c)), cudaSuccess);   /* its kernels stopped */
    assert_int_equal(cudaSetDevice(CALLER_DEVICE), cudaSuccess);
    si_expect_device(g_device);
    si_hold_streams(false);
    CHECK_ST(c, DM_ERR_ABORTED, dm_synchronize(c));
    dm_destroy(c);
    dev_free(a);
    dev_free(b);
    nothing_left();
}

/* Item 1, no call running: the all-reduce returned with its kernels queued (they wait on a dead
   peer), and dm_abort comes from a watcher: it aborts the communicator itself before returning,
   so the user's copy back does not wait forever. */
static void test_failures_dm_abort_stops_an_idle_collectives_kernels(void** state) {
    dm_collective* c;
    float *a, *b;
    (void)state;
    si_reset();
    c = make(2, 0, 20000, NULL, NULL);
    a = dev(N);
    b = dev(N);
    si_hold_streams(true);
    CHECK_OK(c, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
    CHECK_OK(c, dm_abort(c, "Ctrl-C"));
    user_copies_back(b);
    assert_int_equal(si_get()->aborts, 1);
    si_hold_streams(false);
    CHECK_ST(c, DM_ERR_ABORTED, dm_synchronize(c));
    CHECK_ST(c, DM_ERR_ABORTED, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
    CHECK_MSG(c, "Ctrl-C");
    dm_destroy(c);
    dev_free(a);
    dev_free(b);
    nothing_left();
}

/* Item 3's set-up: no memory pools, the streams held, an owner thread in an in-place all_to_all
   whose scratch waits for its stream. */
static dm_collective* start_scratch_wait(owner_job* job, pthread_t* th, float** a, float** b) {
    dm_collective* c;
    si_reset();
    si_set_memory_pools(false);
    c = make(2, 0, 20000, NULL, NULL);
    *a = dev(N);
    *b = dev(N);
    si_hold_streams(true);
    memset(job, 0, sizeof(*job));
    job->c = c;
    job->kind = OWN_ALL_TO_ALL_IN_PLACE;
    job->a = *a;
    owner_start(job, th, stream_polls);
    return c;
}

#if !defined(SI_WITHOUT_SHRINK)
/* Item 3: no memory pools; an in-place all_to_all copies its outgoing blocks to cudaMalloc'd
   scratch and, before cudaFree, waits for its stream -- where the watchdog's
   dm_shrink(DM_SHRINK_ABORT) (no store: ncclCommShrink follows) interrupts it and the
   communicator is parked with its kernels running. The scratch waits for the shrink's abort:
   no cudaFree behind a kernel that never ends. */
static void test_failures_interrupted_scratch_wait_keeps_the_scratch(void** state) {
    dm_collective *c, *s = NULL;
    owner_job job;
    pthread_t th;
    int gone = 1;
    float *a, *b;
    (void)state;
    c = start_scratch_wait(&job, &th, &a, &b);
    CHECK_OK(c, dm_shrink(c, &gone, 1, DM_SHRINK_ABORT, &s));
    assert_int_equal(pthread_join(th, NULL), 0);
    si_hold_streams(false);
    assert_int_equal(job.st, DM_ERR_ABORTED);
    assert_int_equal(si_last_shrink()->flags, NCCL_SHRINK_ABORT);
    (void)id_of(s, 0, 1);
    dm_destroy(s);
    dm_destroy(c);
    dev_free(a);
    dev_free(b);
    nothing_left();
}
#endif

/* Item 3 as the review reproduced it: the same wait, ended by dm_abort instead: the
   communicator is aborted (item 1), so the scratch's cudaFree then waits for nothing. */
static void test_failures_dm_abort_in_a_scratch_wait(void** state) {
    dm_collective* c;
    owner_job job;
    pthread_t th;
    float *a, *b;
    (void)state;
    c = start_scratch_wait(&job, &th, &a, &b);
    CHECK_OK(c, dm_abort(c, "watchdog"));
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(job.st, DM_ERR_ABORTED);
    user_copies_back(a);
    si_hold_streams(false);
    dm_destroy(c);
    dev_free(a);
    dev_free(b);
    nothing_left();
}

/* Items 2 and 4: survivors shrink with DM_SHRINK_ABORT after a failure, with a store. Old rank 1
   of 3 saw the failure (ncclRemoteError: its communicator aborted), old rank 2 only hangs (its
   communicator alive) -- both re-initialise through the store (one id, ranks 0 and 1 of 2), no
   ncclCommShrink on either. Before: rank 2 called ncclCommShrink and waited for rank 1, which
   waited in the store for an id. */
static void test_failures_survivors_take_one_shrink_path(void** state) {
    dm_collective *c1, *c2, *s1 = NULL, *s2 = NULL;
    dm_store* store;
    int gone = 0;
    float *a, *b;
    unsigned char id1, id2;
    (void)state;
    si_reset();
    store = rendezvous_store(3000);
    c1 = make(3, 1, 3000, store, "mixed/");
    c2 = make(3, 2, 3000, store, "mixed/");
    a = dev(N);
    b = dev(N);
    si_fail("enqueue", 1, ncclRemoteError, false);
    CHECK_ST(c1, DM_ERR_NETWORK, dm_all_reduce(c1, a, b, N, DM_FLOAT32, DM_SUM));   /* aborted */
    CHECK_OK(c2, dm_all_reduce(c2, a, b, N, DM_FLOAT32, DM_SUM));                   /* alive */
    CHECK_OK(c1, dm_shrink(c1, &gone, 1, DM_SHRINK_ABORT, &s1));
    CHECK_OK(c2, dm_shrink(c2, &gone, 1, DM_SHRINK_ABORT, &s2));
    assert_int_equal(si_last_shrink()->calls, 0);
    id1 = id_of(s1, 0, 2);
    id2 = id_of(s2, 1, 2);
    assert_int_equal(id1, id2);
    assert_int_not_equal(id1, 0);
    {   /* both survivors have it: the last one deleted the id and its count (issue 52, item 7) */
        static const char* const keys[2] = { "mixed/shrink/1/nccl_unique_id", "mixed/shrink/1/nccl_unique_id_read" };
        int k;
        for (k = 0; k < 2; k++) {
            bool there = true;
            CHECK_OK(NULL, dm_store_check(store, &keys[k], 1, &there));
            if (there) fail_msg("the store still holds %s", keys[k]);
        }
    }
    CHECK_ST(c2, DM_ERR_ABORTED, dm_barrier(c2));
    CHECK_OK(s1, dm_all_reduce(s1, a, b, N, DM_FLOAT32, DM_SUM));
    CHECK_OK(s1, dm_synchronize(s1));
    dm_destroy(s1);
    dm_destroy(s2);
    dm_destroy(c1);
    dm_destroy(c2);
    dm_store_destroy(store);
    dev_free(a);
    dev_free(b);
    nothing_left();
}

/* Item 4: the first send to rank 1 waits for it, and it never arrives (NCCL connects to a
   peer at first use: the communicator stays "in progress"); the watchdog shrinks with DM_SHRINK_ABORT and a
   store: the survivors re-initialise. Before: ncclCommShrink(NCCL_SHRINK_ABORT) on the
   communicator in progress was refused (ncclInvalidArgument) and the shrink failed. */
static void test_failures_shrink_of_a_communicator_in_progress(void** state) {
    dm_collective *c, *s = NULL;
    dm_store* store;
    owner_job job;
    pthread_t th;
    int gone = 1;
    float *a, *b;
    (void)state;
    si_reset();
    store = rendezvous_store(3000);
    c = make(2, 0, 20000, store, "progress/");
    owner_sends_to_the_absent(c, &job, &th, &a, &b);
    CHECK_OK(c, dm_shrink(c, &gone, 1, DM_SHRINK_ABORT, &s));
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(job.st, DM_ERR_ABORTED);
    assert_int_equal(si_last_shrink()->calls, 0);
    (void)id_of(s, 0, 1);
    si_set_peer_arrival_us(0, false);
    CHECK_OK(s, dm_all_reduce(s, a, b, N, DM_FLOAT32, DM_SUM));
    dm_destroy(s);
    dm_destroy(c);
    dm_store_destroy(store);
    dev_free(a);
    dev_free(b);
    nothing_left();
}

#if !defined(SI_WITHOUT_SHRINK)
/* Item 4 without a store: nothing to re-initialise through, so the shrink fails at once with a
   message instead of handing NCCL a communicator in progress (which it refuses, counted in
   used_in_progress). */
static void test_failures_shrink_in_progress_without_a_store_fails_cleanly(void** state) {
    dm_collective *c, *s = NULL;
    owner_job job;
    pthread_t th;
    int gone = 1;
    float *a, *b;
    (void)state;
    si_reset();
    c = make(2, 0, 20000, NULL, NULL);
    owner_sends_to_the_absent(c, &job, &th, &a, &b);
    CHECK_ST(c, DM_ERR_ABORTED, dm_shrink(c, &gone, 1, DM_SHRINK_ABORT, &s));
    assert_null(s);
    CHECK_MSG(c, "still in progress");
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(si_last_shrink()->calls, 0);
    dm_destroy(c);
    dev_free(a);
    dev_free(b);
    nothing_left();
}
#endif

/* Item 5: torchrun's agent store outlives a restart. Attempt 0 left its id under the plain
   key; attempt 1's rank 1 must read attempt 1's id, not that one. */
static void test_failures_unique_id_is_per_restart(void** state) {
    dm_collective* c;
    dm_store* store;
    unsigned char id[DM_NCCL_UNIQUE_ID_BYTES];
    (void)state;
    si_reset();
    store = rendezvous_store(3000);
    memset(id, 0, sizeof(id));
    id[0] = 11;                 /* the dead attempt's */
    CHECK_OK(NULL, dm_store_set(store, "rs/nccl_unique_id", id, sizeof(id)));
    CHECK_OK(NULL, dm_store_set(store, "rs/attempt/0/nccl_unique_id", id, sizeof(id)));
    id[0] = 22;                 /* attempt 1's rank 0 */
    CHECK_OK(NULL, dm_store_set(store, "rs/attempt/1/nccl_unique_id", id, sizeof(id)));
    setenv("TORCHELASTIC_RESTART_COUNT", "1", 1);
    c = make_with(2, 1, 1, 3000, store, "rs/", false);
    unsetenv("TORCHELASTIC_RESTART_COUNT");
    assert_int_equal(id_of(c, 1, 2), 22);
    dm_destroy(c);
    dm_store_destroy(store);
    nothing_left();
}

/* Item 6: NCCL 2.23 (before 2.24 ncclCommDestroy opens no group): a destroy that fails (a late
   asynchronous error) is followed by ncclCommAbort, and no ncclGroupEnd outside a group. On
   2.24+ the group it left open is closed. */
static void test_failures_failed_destroy_ends_only_its_own_group(void** state) {
    dm_collective* c;
    (void)state;
    si_reset();
    si_set_version(NCCL_VERSION(2, 23, 4));
    c = make(2, 0, 3000, NULL, NULL);
    si_fail("ncclCommDestroy", 1, ncclRemoteError, false);
    dm_destroy(c);
    assert_int_equal(si_get()->aborts, 1);
    assert_int_equal(si_get()->stray_group_ends, 0);
    assert_int_equal(si_get()->group_depth, 0);
    si_set_version(NCCL_VERSION(2, 24, 3));
    c = make(2, 0, 3000, NULL, NULL);
    si_fail("ncclCommDestroy", 1, ncclRemoteError, false);
    dm_destroy(c);
    assert_int_equal(si_get()->aborts, 2);
    assert_int_equal(si_get()->group_depth, 0);
    nothing_left();
}

/* Item 7: an NCCL older than the floor (2.18: ncclCommSplit) is refused at create with a
   message; the built-in one below 2.27 has no ncclCommShrink and shrinks through the store. */
static void test_failures_create_checks_the_nccl_loaded(void** state) {
    dm_nccl_desc d;
    dm_collective *c = NULL, *s = NULL;
    dm_store* store;
    unsigned char id[DM_NCCL_UNIQUE_ID_BYTES];
    int gone = 2;
    (void)state;
    si_reset();
    memset(&d, 0, sizeof(d));
    memset(id, 0, sizeof(id));
    d.rank = 0;
    d.world_size = 2;
    d.unique_id = id;
    d.timeout_ms = 2000;
    si_set_version(NCCL_VERSION(2, 17, 1));
    assert_int_equal(dm_nccl_create(&d, &c), DM_ERR_UNSUPPORTED);
    assert_null(c);
    if (!strstr(dm_last_error(NULL), "needs 21800")) fail_msg("%s", dm_last_error(NULL));
    assert_int_equal(si_count("ncclCommInitRankConfig"), 0);
    si_set_version(NCCL_VERSION(2, 26, 6));
    store = rendezvous_store(3000);
    c = make(3, 0, 3000, store, "floor/");
    CHECK_OK(c, dm_shrink(c, &gone, 1, DM_SHRINK_DEFAULT, &s));
    assert_int_equal(si_last_shrink()->calls, 0);
    (void)id_of(s, 0, 2);
    dm_destroy(s);
    dm_destroy(c);
    dm_store_destroy(store);
    nothing_left();
}

/* The stand-in's launch (NCCL 2.28): work accepted with ncclInProgress is launched by NCCL's
   group thread when that clears. A request's event, its staging copies and its scratch's
   release must come after the poll that saw it clear (counted in before_launch otherwise):
   stream requests, host staging, gather/scatter groups and an in-place all_to_all with
   scratch, each "in progress" for 2 ms and its work 1 ms on the stream. */
static void test_failures_work_follows_the_launch(void** state) {
    dm_collective* c;
    dm_request* req = NULL;
    float *a, *b;
    float host[2 * N];
    int pools;
    (void)state;
    for (pools = 0; pools < 2; pools++) {
        si_reset();
        si_set_memory_pools(pools != 0);
        si_set_enqueue_us(2000);
        si_set_busy_us(1000);
        c = make(2, 0, 3000, NULL, NULL);
        a = dev(2 * N);
        b = dev(2 * N);
        memset(host, 0, sizeof(host));
        CHECK_OK(c, dm_all_reduce_async(c, a, b, N, DM_FLOAT32, DM_SUM, &req));
        CHECK_OK(c, dm_wait(req));
        CHECK_OK(c, dm_all_gather(c, host, host, N, DM_FLOAT32));
        CHECK_OK(c, dm_broadcast(c, host, N, DM_FLOAT32, 0));
        CHECK_OK(c, dm_all_to_all(c, NULL, a, N, DM_FLOAT32));
        CHECK_OK(c, dm_all_to_all_async(c, NULL, a, N, DM_FLOAT32, &req));
        CHECK_OK(c, dm_wait(req));
        CHECK_OK(c, dm_barrier(c));
        CHECK_OK(c, dm_synchronize(c));
        dm_destroy(c);
        dev_free(a);
        dev_free(b);
        nothing_left();
    }
}

/* The stand-in's first use (NCCL 2.28 connects to a peer at its first operation, inside the
   group job; a first send its peer): a peer that arrives late is waited for (create's
   all-gather, then a first send); one that never does is the call's
   deadline (DM_ERR_TIMEOUT, the communicator aborted, no job left), never a hang. */
static void test_failures_first_use_waits_for_peers_with_the_deadline(void** state) {
    dm_collective* c;
    float *a, *b;
    int64_t t0;
    (void)state;
    si_reset();
    si_set_peer_arrival_us(20000, false);   /* 20 ms late */
    c = make(2, 0, 3000, NULL, NULL);
    a = dev(N);
    b = dev(N);
    CHECK_OK(c, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
    CHECK_OK(c, dm_send(c, a, N, DM_FLOAT32, 1, 0));
    CHECK_OK(c, dm_synchronize(c));
    dm_destroy(c);
    c = make(2, 0, 200, NULL, NULL);
    si_set_peer_arrival_us(0, true);
    t0 = tw_now_ms();
    CHECK_ST(c, DM_ERR_TIMEOUT, dm_send(c, a, N, DM_FLOAT32, 1, 0));
    assert_true(tw_now_ms() - t0 < 5000);
    assert_int_equal(si_get()->aborts, 1);
    assert_int_equal(si_pending_jobs(), 0);
    dm_destroy(c);
    dev_free(a);
    dev_free(b);
    nothing_left();
}

/* The stand-in's streams: the library's own stream is blocking, so a collective runs after
   what the user queued on the legacy default stream (here a cudaMemcpyAsync on stream 0 that
   stays busy), and the legacy stream's cudaMemcpy waits for the collective. A non-blocking
   stream would count in unordered_with_legacy. */
static void test_failures_stream_is_ordered_with_the_legacy_stream(void** state) {
    dm_collective* c;
    float *a, *b;
    float host[N];
    (void)state;
    si_reset();
    c = make(2, 0, 3000, NULL, NULL);
    a = dev(N);
    b = dev(N);
    memset(host, 0, sizeof(host));
    si_set_busy_us(50000);                  /* the copy keeps the legacy stream busy 50 ms */
    si_expect_device(-1);
    assert_int_equal(cudaSetDevice(g_device), cudaSuccess);
    assert_int_equal(cudaMemcpyAsync(a, host, sizeof(host), cudaMemcpyHostToDevice, 0), cudaSuccess);
    assert_int_equal(cudaSetDevice(CALLER_DEVICE), cudaSuccess);
    si_expect_device(g_device);
    CHECK_OK(c, dm_all_reduce(c, a, b, N, DM_FLOAT32, DM_SUM));
    CHECK_OK(c, dm_synchronize(c));
    user_copies_back(b);
    dm_destroy(c);
    dev_free(a);
    dev_free(b);
    nothing_left();
}

static int group_setup(void** state) {
    (void)state;
    return tmpdir_make(g_dir, sizeof(g_dir), "dm_nccl_failures");
}
static int group_teardown(void** state) {
    (void)state;
    return tmpdir_remove(g_dir);
}

int main(int argc, char** argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_failures_dm_abort_stops_a_running_calls_kernels),
        cmocka_unit_test(test_failures_dm_abort_stops_an_idle_collectives_kernels),
#if !defined(SI_WITHOUT_SHRINK)       /* these two go through ncclCommShrink */
        cmocka_unit_test(test_failures_interrupted_scratch_wait_keeps_the_scratch),
        cmocka_unit_test(test_failures_shrink_in_progress_without_a_store_fails_cleanly),
#endif
        cmocka_unit_test(test_failures_dm_abort_in_a_scratch_wait),
        cmocka_unit_test(test_failures_survivors_take_one_shrink_path),
        cmocka_unit_test(test_failures_shrink_of_a_communicator_in_progress),
        cmocka_unit_test(test_failures_unique_id_is_per_restart),
        cmocka_unit_test(test_failures_failed_destroy_ends_only_its_own_group),
        cmocka_unit_test(test_failures_create_checks_the_nccl_loaded),
        cmocka_unit_test(test_failures_work_follows_the_launch),
        cmocka_unit_test(test_failures_first_use_waits_for_peers_with_the_deadline),
        cmocka_unit_test(test_failures_stream_is_ordered_with_the_legacy_stream),
    };
    dm_test_filter(argc, argv);
#if defined(SI_WITHOUT_SHRINK)
    printf("NCCL failure paths (issue 41) against a CUDA/NCCL stand-in of NCCL 2.26 (no ncclCommShrink)\n");
#else
    printf("NCCL failure paths (issue 41) against the CUDA/NCCL stand-in (no GPU involved)\n");
#endif
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
