/* dm_abort: a collective stopped from another thread (what the Python package's Ctrl-C does).
   The aborted rank's running call fails at once with DM_ERR_ABORTED and the reason; its peers,
   blocked in the same call or arriving later, fail with DM_ERR_ABORTED naming that rank, long
   before their deadline; later calls fail at once. On the Fake backend, the threaded world,
   and forked ranks over sockets and over shared memory. */
#define _GNU_SOURCE     /* POSIX 2008 for tests/test_world.h under -std=c11 */
#include "prelude.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include "distmesh.h"
#include "test_world.h"

#define W 3
#define VICTIM 1
#define DEADLINE_MS 20000
static tw_store g_store;

/* ---- Fake: the flag alone --------------------------------------------------------------- */
static void test_abort_fake(void** s) {
    dm_fake_desc d;
    dm_collective* c = NULL;
    dm_request* req = (dm_request*)&d;
    float x[2] = { 1, 2 };
    (void)s;
    assert_int_equal(dm_abort(NULL, "x"), DM_ERR_INVALID_ARG);
    memset(&d, 0, sizeof(d));
    assert_int_equal(dm_fake_create(&d, &c), DM_OK);
    assert_int_equal(dm_all_reduce(c, NULL, x, 2, DM_FLOAT32, DM_SUM), DM_OK);
    assert_int_equal(dm_abort(c, "stop here"), DM_OK);
    assert_int_equal(dm_all_reduce(c, NULL, x, 2, DM_FLOAT32, DM_SUM), DM_ERR_ABORTED);
    assert_non_null(strstr(dm_last_error(c), "rank 0 aborted: stop here"));
    assert_int_equal(dm_abort(c, "again"), DM_OK);        /* the first reason stays */
    assert_int_equal(dm_barrier_async(c, &req), DM_ERR_ABORTED);
    assert_null(req);
    assert_non_null(strstr(dm_last_error(c), "stop here"));
    assert_null(strstr(dm_last_error(c), "again"));
    dm_destroy(c);
    memset(&d, 0, sizeof(d));
    assert_int_equal(dm_fake_create(&d, &c), DM_OK);
    assert_int_equal(dm_abort(c, NULL), DM_OK);
    assert_int_equal(dm_barrier(c), DM_ERR_ABORTED);
    assert_non_null(strstr(dm_last_error(c), "rank 0 aborted: dm_abort"));
    dm_destroy(c);
}

/* ---- one scenario for every backend ------------------------------------------------------ */
/* Rank VICTIM enters an all_reduce that cannot finish (rank 2 is late) and a second thread
   aborts it after 200 ms. Rank 0 waits in the same all_reduce; rank 2 calls it after 700 ms.
   Each rank checks its own outcome and returns 0, or a code saying what went wrong. */
typedef struct aborter { dm_collective* c; double at; } aborter;
static void* abort_later(void* p) {
    aborter* a = (aborter*)p;
    usleep(200000);
    a->at = tw_now_s();
    dm_abort(a->c, "the test says stop");
    return NULL;
}
static int scenario(dm_collective* c) {
    float x[256];
    int r = dm_rank(c);
    double t0 = tw_now_s(), t;
    dm_status st;
    const char* e;
    memset(x, 0, sizeof(x));
    if (r == VICTIM) {
        pthread_t th;
        aborter a;
        a.c = c;
        a.at = 0;
        if (pthread_create(&th, NULL, abort_later, &a) != 0) return 10;
        st = dm_all_reduce(c, NULL, x, 256, DM_FLOAT32, DM_SUM);
        t = tw_now_s();
        pthread_join(th, NULL);
        e = dm_last_error(c);
        if (st != DM_ERR_ABORTED) { fprintf(stderr, "victim: %s: %s\n", dm_status_name(st), e); return 11; }
        if (!strstr(e, "rank 1 aborted: the test says stop")) { fprintf(stderr, "victim: %s\n", e); return 12; }
        if (t - a.at > 0.5) { fprintf(stderr, "victim: %.3f s after dm_abort\n", t - a.at); return 13; }
        if (dm_barrier(c) != DM_ERR_ABORTED) return 14;           /* later calls fail at once */
        return 0;
    }
    if (r == 2) usleep(700000);
    /* Over sockets rank 2 may finish its first call: all it needs from rank 1 can be on its
       way before the abort (rank 1 waits for rank 2, not the reverse). Its next call fails. */
    st = dm_all_reduce(c, NULL, x, 256, DM_FLOAT32, DM_SUM);
    if (st == DM_OK && r == 2) st = dm_all_reduce(c, NULL, x, 256, DM_FLOAT32, DM_SUM);
    t = tw_now_s() - t0;
    e = dm_last_error(c);
    if (st != DM_ERR_ABORTED) { fprintf(stderr, "rank %d: %s: %s\n", r, dm_status_name(st), e); return 21; }
    if (!strstr(e, "rank 1") || !strstr(e, "the test says stop")) {
        fprintf(stderr, "rank %d: %s\n", r, e);
        return 22;
    }
    if (t > 3.0) { fprintf(stderr, "rank %d: failed after %.3f s\n", r, t); return 23; }
    return 0;
}

static int scenario_c(dm_collective* c, void* u) { (void)u; return scenario(c); }
static int g_thread_codes[W];
static int thread_rank_body(dm_collective* c, void* u) {
    (void)u;
    g_thread_codes[dm_rank(c)] = scenario(c);
    return DM_OK;
}
static void test_abort_thread_world(void** s) {
    dm_fake_desc d = {0};
    int r;
    (void)s;
    d.world_size = W;
    d.timeout_ms = DEADLINE_MS;
    assert_int_equal(dm_thread_world_run(&d, thread_rank_body, NULL), DM_OK);
    for (r = 0; r < W; r++) assert_int_equal(g_thread_codes[r], 0);
}

/* Forked ranks meeting through a file store; transport "tcp" or NULL (shared memory). */
static void run_procs(const char* transport) {
    tw_dm_world w;
    tw_dm_world_init(&w, W, &g_store, transport, DEADLINE_MS);
    w.body_c = scenario_c;
    assert_int_equal(tw_dm_run(&w, 40), 0);
}
static void test_abort_tcp(void** s) { (void)s; run_procs("tcp"); }
static void test_abort_shm(void** s) { (void)s; run_procs(NULL); }

TW_STORE_FIXTURES(g_store, "dm_abort_test", SIG_IGN)     /* a peer's close must not end the program */

DM_TEST_MAIN(setup_store, teardown_store,
    cmocka_unit_test(test_abort_fake),
    cmocka_unit_test(test_abort_thread_world),
    cmocka_unit_test(test_abort_tcp),
    cmocka_unit_test(test_abort_shm))
