/* What the TCP backend's test programs (tests/test_tcp_*.c) share: the collective suite every
   rank runs (every collective, dtype and op against a serial reference), the checks of a forked
   rank, and the programs' worlds on test_world.h: a file store in a mkdtemp directory made by
   the cmocka group setup (the file store needs no server thread that fork could orphan), one
   key prefix per world, and g_transport for desc.transport.

   Reference: data are small integers (|x| <= 4, products of at most 8 factors of |x| <= 2) that
   every dtype represents exactly, so every reduction order gives the same bits and results are
   compared with memcmp against a serial reduction in rank order (tolerance: exact). One case
   with fractional float32 data uses a relative tolerance of 1e-5.

   The programs, by what they hold (one cmocka program each, all linking $(BUILD)/tcp/impl.o):
     test_tcp_collectives  every collective on one host: worlds of 1..8 ranks over shared
                           memory and sockets, wake-ups, the eager path, groups, fds, mismatches
     test_tcp_hosts        transports and simulated hosts: mixed shm+tcp, bit-identical results
                           across transports and layouts, the choices, sockets per peer
     test_tcp_failures     kill -9 and SIGSTOP of a rank (flat and two-level), split under failure
     test_tcp_sparse       many ranks on simulated hosts: connections only where schedules need
                           them, kill -9 among them, P checked on the threaded world (--scale)
     test_tcp_rendezvous   dm_init, IPv6, a TCP store and rank 0's, network namespaces (--rank)
     test_sites            sites (DISTMESH_SITE): the three-level all-reduce, all_gather,
                           reduce_scatter and barrier, their choice, their bytes */
#ifndef DM_TEST_TCP_H
#define DM_TEST_TCP_H
#include "distmesh.h"
#include "test_util.h"
#include "test_world.h"
#include <math.h>
#include "prelude.h"

#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#endif

/* ---- checks in a forked rank: return 1 (its exit status) on a failure ------------------------ */
/* (test_util.h's RCHECK records for rank threads instead.) */
#undef RCHECK
#define RCHECK(cond)                                                                      \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "rank %d: check failed at %s:%d: %s\n", tw_me.index, __FILE__, \
                    __LINE__, #cond);                                                     \
            return 1;                                                                     \
        }                                                                                 \
    } while (0)
#define RST(expr)                                                                         \
    do {                                                                                  \
        dm_status st_ = (expr);                                                           \
        if (st_ != DM_OK) {                                                               \
            fprintf(stderr, "rank %d: %s failed at %s:%d: %s: %s\n", tw_me.index, #expr,  \
                    __FILE__, __LINE__, dm_status_name(st_), dm_last_error(c));           \
            return 1;                                                                     \
        }                                                                                 \
    } while (0)

/* ---- the reference ------------------------------------------------------------------------- */
static void fill(dm_dtype t, dm_reduce_op op, int r, void* buf, size_t count, int salt) {
    size_t i;
    for (i = 0; i < count; i++) set_val(t, buf, i, gen(t, op, r, i, salt));
}
/* Serial reference: ranks 0..W-1 reduced in order, MEAN divided at the end. */
static void reference(dm_dtype t, dm_reduce_op op, int W, void* out, void* scratch, size_t count,
                      size_t first, int salt) {
    size_t es = dm_dtype_size(t), i;
    int r;
    for (r = 0; r < W; r++) {
        unsigned char* dst = r == 0 ? (unsigned char*)out : (unsigned char*)scratch;
        for (i = 0; i < count; i++) set_val(t, dst, i, gen(t, op, r, first + i, salt));
        if (r > 0) dm_reduce_local(t, op, out, scratch, count);
    }
    (void)es;
    if (op == DM_MEAN) dm_divide_local(t, out, count, W);
}

/* ---- the collective suite, run by every rank ------------------------------------------------ */
/* A reduction's verdict: 0, or 1 after a line naming what failed (the call's status st, or a
   result other than ref). */
static int suite_reduced(dm_collective* c, const char* what, dm_status st, dm_dtype t, dm_reduce_op op, size_t count,
                         bool in_place, const void* got, const void* ref) {
    const char* how = in_place ? "in place" : "out of place";
    if (st != DM_OK) {
        fprintf(stderr, "rank %d: %s %s %s count %zu %s: %s\n", dm_rank(c), what, dm_dtype_name(t),
                dm_reduce_op_name(op), count, how, dm_last_error(c));
        return 1;
    }
    if (memcmp(got, ref, count * dm_dtype_size(t)) != 0) {
        fprintf(stderr, "rank %d: %s %s %s count %zu %s: wrong result\n", dm_rank(c), what, dm_dtype_name(t),
                dm_reduce_op_name(op), count, how);
        return 1;
    }
    return 0;
}
static int suite_all_reduce(dm_collective* c, size_t count, dm_dtype t, dm_reduce_op op, bool in_place, int salt) {
    int W = dm_world_size(c), r = dm_rank(c);
    size_t es = dm_dtype_size(t), n = count ? count : 1;
    unsigned char* send = (unsigned char*)malloc(n * es);
    unsigned char* recv = (unsigned char*)malloc(n * es);
    unsigned char* ref = (unsigned char*)malloc(n * es);
    unsigned char* scr = (unsigned char*)malloc(n * es);
    int bad;
    fill(t, op, r, send, count, salt);
    memset(recv, 0x5a, n * es);
    if (in_place) memcpy(recv, send, count * es);
    reference(t, op, W, ref, scr, count, 0, salt);
    bad = suite_reduced(c, "all_reduce", dm_all_reduce(c, in_place ? NULL : send, recv, count, t, op), t, op, count,
                        in_place, recv, ref);
    free(send); free(recv); free(ref); free(scr);
    return bad;
}

static int suite_reduce_scatter(dm_collective* c, size_t rc, dm_dtype t, dm_reduce_op op, bool in_place, int salt) {
    int W = dm_world_size(c), r = dm_rank(c);
    size_t es = dm_dtype_size(t), n = rc * (size_t)W + 1;
    unsigned char* send = (unsigned char*)malloc(n * es);
    unsigned char* out = (unsigned char*)malloc(n * es);
    unsigned char* ref = (unsigned char*)malloc(n * es);
    unsigned char* scr = (unsigned char*)malloc(n * es);
    unsigned char* recv = in_place ? send + (size_t)r * rc * es : out;
    int bad;
    fill(t, op, r, send, rc * (size_t)W, salt);
    reference(t, op, W, ref, scr, rc, (size_t)r * rc, salt);
    bad = suite_reduced(c, "reduce_scatter", dm_reduce_scatter(c, send, recv, rc, t, op), t, op, rc, in_place, recv,
                        ref);
    free(send); free(out); free(ref); free(scr);
    return bad;
}

static int suite_all_gather(dm_collective* c, size_t count, dm_dtype t, int mode, int salt) {
    int W = dm_world_size(c), r = dm_rank(c), j;
    size_t es = dm_dtype_size(t), bytes = count * es;
    unsigned char* send = (unsigned char*)malloc(bytes + 1);
    unsigned char* recv = (unsigned char*)malloc(bytes * (size_t)W + 1);
    unsigned char* one = (unsigned char*)malloc(bytes + 1);
    void* ptrs[64];
    dm_status st;
    int bad = 0;
    fill(t, DM_SUM, r, send, count, salt);
    memset(recv, 0x33, bytes * (size_t)W + 1);
    if (mode == 0) st = dm_all_gather(c, send, recv, count, t);
    else if (mode == 1) {
        memcpy(recv + (size_t)r * bytes, send, bytes);
        st = dm_all_gather(c, NULL, recv, count, t);
    } else {
        /* to_list with the slots in reverse order */
        for (j = 0; j < W; j++) ptrs[j] = recv + (size_t)(W - 1 - j) * bytes;
        st = dm_all_gather_to_list(c, send, ptrs, count, t);
    }
    if (st != DM_OK) {
        fprintf(stderr, "rank %d: all_gather mode %d: %s\n", r, mode, dm_last_error(c));
        bad = 1;
    }
    for (j = 0; j < W && !bad; j++) {
        unsigned char* got = mode == 2 ? (unsigned char*)ptrs[j] : recv + (size_t)j * bytes;
        fill(t, DM_SUM, j, one, count, salt);
        if (memcmp(got, one, bytes) != 0) {
            fprintf(stderr, "rank %d: all_gather mode %d %s count %zu: block %d wrong\n", r, mode, dm_dtype_name(t), count, j);
            bad = 1;
        }
    }
    free(send); free(recv); free(one);
    return bad;
}

static int suite_broadcast(dm_collective* c, size_t count, dm_dtype t, int root, int salt) {
    int r = dm_rank(c), bad = 0;
    size_t es = dm_dtype_size(t);
    unsigned char* buf = (unsigned char*)malloc(count * es + 1);
    unsigned char* ref = (unsigned char*)malloc(count * es + 1);
    fill(t, DM_SUM, root, ref, count, salt);
    if (r == root) memcpy(buf, ref, count * es);
    else memset(buf, 0x77, count * es);
    if (dm_broadcast(c, buf, count, t, root) != DM_OK) {
        fprintf(stderr, "rank %d: broadcast root %d: %s\n", r, root, dm_last_error(c));
        bad = 1;
    } else if (memcmp(buf, ref, count * es) != 0) {
        fprintf(stderr, "rank %d: broadcast root %d count %zu: wrong\n", r, root, count);
        bad = 1;
    }
    free(buf); free(ref);
    return bad;
}

/* 64 MiB float32 SUM all_reduce checked in closed form: x_r[i] = (i % 7) + r - 3. */
static int suite_big(dm_collective* c, bool in_place) {
    int W = dm_world_size(c), r = dm_rank(c), bad = 0;
    size_t n = (size_t)16 << 20, i;
    float* send = (float*)malloc(n * sizeof(float));
    float* recv = in_place ? send : (float*)malloc(n * sizeof(float));
    for (i = 0; i < n; i++) send[i] = (float)((int)(i % 7) + r - 3);
    if (dm_all_reduce(c, in_place ? NULL : send, recv, n, DM_FLOAT32, DM_SUM) != DM_OK) {
        fprintf(stderr, "rank %d: 64 MiB all_reduce: %s\n", r, dm_last_error(c));
        bad = 1;
    }
    for (i = 0; i < n && !bad; i++)
        if (recv[i] != (float)(W * ((int)(i % 7) - 3) + W * (W - 1) / 2)) {
            fprintf(stderr, "rank %d: 64 MiB all_reduce wrong at %zu: %f\n", r, i, recv[i]);
            bad = 1;
        }
    if (!in_place) free(recv);
    free(send);
    return bad;
}

/* Fractional float32 data: relative tolerance 1e-5 against a double reference. */
static int suite_float_tolerance(dm_collective* c) {
    int W = dm_world_size(c), r = dm_rank(c), bad = 0, q;
    size_t n = 100003, i;
    float* x = (float*)malloc(n * sizeof(float));
    for (i = 0; i < n; i++) x[i] = (float)sin((double)(i * 7 + (size_t)r * 13)) * 1.5f;
    if (dm_all_reduce(c, NULL, x, n, DM_FLOAT32, DM_MEAN) != DM_OK) { free(x); return 1; }
    for (i = 0; i < n && !bad; i++) {
        double ref = 0;
        for (q = 0; q < W; q++) ref += (double)(float)sin((double)(i * 7 + (size_t)q * 13)) * 1.5;
        ref /= W;
        if (fabs(x[i] - ref) > 1e-5 * (fabs(ref) + 1.0)) {
            fprintf(stderr, "rank %d: float MEAN off at %zu: %g vs %g\n", r, i, x[i], ref);
            bad = 1;
        }
    }
    free(x);
    return bad;
}

static int suite_objects(dm_collective* c) {
    int W = dm_world_size(c), r = dm_rank(c), j;
    char msg[64];
    dm_blob_list all, got;
    dm_blob objs[2];
    snprintf(msg, sizeof(msg), "rank-%d-%.*s", r, r + 1, "xxxxxxxxxxxxxxxx");
    RST(dm_all_gather_objects(c, msg, strlen(msg) + 1, &all));
    RCHECK(all.count == (size_t)W);
    for (j = 0; j < W; j++) {
        char want[64];
        snprintf(want, sizeof(want), "rank-%d-%.*s", j, j + 1, "xxxxxxxxxxxxxxxx");
        RCHECK(strcmp((const char*)all.items[j].data, want) == 0);
    }
    dm_blob_list_free(c, &all);
    objs[0].data = "alpha"; objs[0].size = 6;
    objs[1].data = "be"; objs[1].size = 3;
    RST(dm_broadcast_objects(c, r == W - 1 ? objs : NULL, r == W - 1 ? 2 : 0, W - 1, &got));
    RCHECK(got.count == 2 && strcmp((const char*)got.items[0].data, "alpha") == 0 &&
           strcmp((const char*)got.items[1].data, "be") == 0);
    dm_blob_list_free(c, &got);
    return 0;
}

/* Every collective, every dtype x op, counts 0, 1, W-1, odd and ring-sized, in and out of place. */
static int suite(dm_collective* c, bool big) {
    int W = dm_world_size(c), root, bad = 0, salt = 0, mode;
    size_t counts[5];
    int t, op, k;
    counts[0] = 0; counts[1] = 1; counts[2] = (size_t)(W - 1); counts[3] = 1237; counts[4] = 70001;
    RST(dm_barrier(c));
    for (t = 0; t < DM_DTYPE_COUNT; t++)
        for (op = 0; op < DM_REDUCE_OP_COUNT; op++)
            for (k = 0; k < 5; k++) {
                bad |= suite_all_reduce(c, counts[k], (dm_dtype)t, (dm_reduce_op)op, k % 2 == 0, ++salt);
                if (k >= 3) bad |= suite_all_reduce(c, counts[k], (dm_dtype)t, (dm_reduce_op)op, k % 2 != 0, ++salt);
            }
    for (t = 0; t < DM_DTYPE_COUNT; t++)
        for (op = 0; op < DM_REDUCE_OP_COUNT; op++) {
            bad |= suite_reduce_scatter(c, 1, (dm_dtype)t, (dm_reduce_op)op, false, ++salt);
            bad |= suite_reduce_scatter(c, 0, (dm_dtype)t, (dm_reduce_op)op, true, ++salt);
            bad |= suite_reduce_scatter(c, 1237, (dm_dtype)t, (dm_reduce_op)op, op % 2 == 0, ++salt);
            bad |= suite_reduce_scatter(c, 40001, (dm_dtype)t, (dm_reduce_op)op, op % 2 != 0, ++salt);
        }
    for (t = 0; t < DM_DTYPE_COUNT; t++)
        for (k = 0; k < 5; k++)
            for (mode = 0; mode < 3; mode++) bad |= suite_all_gather(c, counts[k], (dm_dtype)t, mode, ++salt);
    for (root = 0; root < W; root++) {
        bad |= suite_broadcast(c, 1, DM_INT32, root, ++salt);
        bad |= suite_broadcast(c, 1237, DM_FLOAT16, root, ++salt);
        bad |= suite_broadcast(c, 300001, DM_FLOAT64, root, ++salt);
    }
    bad |= suite_broadcast(c, 0, DM_UINT8, 0, ++salt);
    bad |= suite_float_tolerance(c);
    bad |= suite_objects(c);
    if (big) {
        bad |= suite_big(c, false);
        if (W == 2 || W == 4) bad |= suite_big(c, true);
    }
    RST(dm_barrier(c));
    return bad;
}

/* A pipelined all_reduce's counts (several segments): every op on exact int32 data and MEAN on
   float32, in and out of place, against the reference; the algorithm that ran is want. */
static int suite_pipelined(dm_collective* c, const char* want, int salt) {
    static const size_t counts[2] = { ((size_t)3 << 20) + 7, ((size_t)1 << 20) + 3 };
    int op, k, bad = 0;
    for (k = 0; k < 2; k++)
        for (op = 0; op < DM_REDUCE_OP_COUNT; op++) {
            dm_dtype t = op == DM_MEAN ? DM_FLOAT32 : DM_INT32;
            if (k == 1 && op != DM_SUM) continue;
            bad |= suite_all_reduce(c, counts[k], t, (dm_reduce_op)op, (op + k) % 2 == 0, ++salt);
            if (strcmp(dm_last_algorithm(c), want) != 0) {
                fprintf(stderr, "rank %d: %zu elements ran %s\n", dm_rank(c), counts[k], dm_last_algorithm(c));
                bad = 1;
            }
        }
    return bad;
}

/* Whether files a and b hold the same bytes (both there). */
static bool tcp_files_same(const char* a, const char* b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool same = fa && fb;
    int x = 0, y = 0;
    while (same && x != EOF) {
        x = fgetc(fa);
        y = fgetc(fb);
        same = x == y;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

/* fn on every rank of the threaded world of world ranks, rank r on simulated host host_of[r]
   (60 s deadline). */
static dm_status run_thread_hosts(int world, const int* host_of, dm_rank_fn fn, void* user) {
    dm_fake_desc fd;
    memset(&fd, 0, sizeof(fd));
    fd.world_size = world;
    fd.host_of = host_of;
    fd.timeout_ms = 60000;
    return dm_thread_world_run(&fd, fn, user);
}

/* ---- the programs' worlds ------------------------------------------------------------------ */
static tw_store g_store;          /* the program's file store (setup_store); one prefix per world */
static const char* g_transport;   /* desc.transport of the worlds run_world forks (NULL: auto) */

/* rank of world on g_store, with g_transport and a 30 s deadline. */
static void make_desc(dm_tcp_desc* d, int rank, int world) {
    tw_tcp_desc(d, &g_store, rank, world, 30000);
    d->transport = g_transport;
}
/* Forks world ranks; each creates its collective as make_desc says (unless create is false:
   body gets NULL), runs body, exits 0/1. Returns the number of failed ranks; kills everyone
   after limit_s. */
static int run_world_ex(int world, tw_body body, void* arg, double limit_s, bool create) {
    tw_dm_world w;
    tw_dm_world_init(&w, world, &g_store, g_transport, 30000);
    w.no_create = !create;
    w.body = body;
    w.arg = arg;
    return tw_dm_run(&w, limit_s);
}
static int run_world(int world, tw_body body, void* arg, double limit_s) {
    return run_world_ex(world, body, arg, limit_s, true);
}

/* A world whose ranks report through a pipe (tw_ready, tw_report), forked into p: each rank
   creates its collective with timeout_ms (ranks r / per_host on one simulated host when
   per_host > 0), runs body and exits with its result (40 s alarm). */
static void fork_reporting_world(tw_world* p, int world, int timeout_ms, int per_host, tw_body body, void* arg) {
    tw_dm_world w;
    tw_world_init(p, 40, true);
    tw_dm_world_init(&w, world, &g_store, g_transport, timeout_ms);
    w.per_host = per_host;
    w.body = body;
    w.arg = arg;
    assert_int_equal(tw_dm_fork(p, &w), 0);
}

static int setup_store(void** s) { (void)s; return tw_store_file(&g_store, "dm_tcp_test"); }
static int teardown_store(void** s) { (void)s; return tw_store_close(&g_store); }
/* A program's run of its tests: SIGPIPE left fatal (the library must never raise it), the
   name filter (test_filter.h), the tests as one group on the program's store. */
#define TCP_RUN_TESTS(tests, argc, argv)                                                   \
    (signal(SIGPIPE, SIG_DFL), dm_test_filter(argc, argv),                                \
     cmocka_run_group_tests(tests, setup_store, teardown_store))

#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif /* DM_TEST_TCP_H */
