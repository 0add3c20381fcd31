/* test_fake: the Fake backend (world of one, simulated world of N), the threaded world of N
   ranks on N threads, the public wrappers' argument checks, status names, logger and allocator
   hooks. One test_<area>_<behaviour>() per behaviour (STYLE 10, B6).

   The collective matrix (issue 2's acceptance): every collective on the threaded world at 1, 2,
   3, 4 and 7 ranks, every dtype (x every op where there is one), counts 0, 1, 3, 1000 and
   (1<<20)+3, in place and out of place, against a serial reference computed here. distmesh.h
   documents that the threaded world reduces in rank order 0..N-1, so the reference folds in that
   order with the same per-step rounding (16-bit floats: float32 arithmetic, round to nearest even
   at every step) and every result must match it bit for bit -- no tolerance, integers or floats.

   Inputs: rank r's element i is pool[(i + r*OFF) % P] with P = 65521 (prime) and OFF = 7919, so
   every rank holds different data, and the reference is periodic in i with period P: it is
   computed for P elements once per (world, dtype, op) and compared tile by tile. P is prime and
   larger than 1000, so no segment boundary, block size or rank offset of the implementation can
   line up with it and hide a misplaced block. Values: PROD draws small integers / floats in
   [0.5, 2] so products stay meaningful (integer wraparound is still deterministic and compared);
   the other ops draw full-range integers and floats in [-100, 100] with full mantissas (so the
   order of summation shows), never 0 or NaN (NaN and -0 are tested separately).

   The (1<<20)+3 case: the reductions run it for every dtype's SUM and six dtype x op pairs
   covering every op and both 16-bit floats (the kernels do not depend on the count; the large
   count is there for the schedules' segments and chunks). Sanitizers: ASan/TSan builds are
   3-15x slower. Under them (detected at compile time) the reductions' large case runs for the
   six pairs only, the data-movement collectives' for one dtype per element size, and only at 3
   and 7 ranks (uneven segments). Every other case, and every dtype x op at the other counts,
   runs everywhere. */
#define _POSIX_C_SOURCE 200809L /* nanosleep, clock_gettime under -std=c11 */
#include "distmesh.h"
#include "prelude.h"
#include "test_util.h"
#include <float.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>


#define P 65521u
#define OFF 7919u
#define LARGE ((size_t)(1u << 20) + 3)
static const int g_worlds[] = { 1, 2, 3, 4, 7 };
static const size_t g_counts[] = { 0, 1, 3, 1000, LARGE };
#define NWORLDS (sizeof(g_worlds) / sizeof(g_worlds[0]))
#define NCOUNTS (sizeof(g_counts) / sizeof(g_counts[0]))
#define MATRIX_TIMEOUT_MS 120000

/* ---- failures seen on rank threads (cmocka's asserts must stay on the main thread) ---- */
#define RCALL(c, expr) do { dm_status st_ = (expr); if (st_ != DM_OK) { \
        rank_fail(__LINE__, "rank %d: %s -> %s: %s", dm_rank(c), #expr, dm_status_name(st_), dm_last_error(c)); \
        return st_; } } while (0)
static void reset_failures(void) { atomic_store(&g_failures, 0); g_first_failure[0] = 0; }
static void assert_no_rank_failures(void) {
    if (atomic_load(&g_failures) != 0) fail_msg("%d failure(s) on rank threads, first: %s", atomic_load(&g_failures), g_first_failure);
}
static dm_status run_world(int n, dm_rank_fn fn, void* user, int timeout_ms) {
    dm_fake_desc d = {0};
    d.world_size = n;
    d.timeout_ms = timeout_ms;
    return dm_thread_world_run(&d, fn, user);
}

static void* xmalloc(size_t n) {
    void* p = malloc(n ? n : 1);
    if (!p) { fprintf(stderr, "out of memory (%zu bytes)\n", n); abort(); }
    return p;
}

/* ---- random numbers, conversions and the reference (independent of distmesh's code) ---- */
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) { return splitmix64(&g_rng); }
static double rnd_unit(void) { return (double)(rnd() >> 11) / 9007199254740992.0; }

static void gen_pool(dm_dtype t, dm_reduce_op op, unsigned char* pool) {
    size_t es = dm_dtype_size(t), i;
    for (i = 0; i < P; i++) {
        unsigned char* p = pool + i * es;
        if (!is_float(t)) {
            uint64_t v = rnd();
            if (op == DM_PROD) {
                switch (t) {
                    case DM_INT8: v = (uint64_t)((int64_t)(v % 5) - 2); break;
                    case DM_UINT8: v %= 3; break;
                    case DM_INT32: v = (uint64_t)((int64_t)(v % 15) - 7); break;
                    case DM_UINT32: v %= 8; break;
                    case DM_INT64: v = (uint64_t)((int64_t)(v % 601) - 300); break;
                    default: v %= 301; break;
                }
            }
            store_int(t, p, v);
        } else {
            double v = op == DM_PROD ? (0.5 + 1.5 * rnd_unit()) * ((rnd() & 1) ? -1 : 1) : (rnd_unit() * 2 - 1) * 100;
            store_float(t, p, v);
            if (load_float(t, p) == 0) store_float(t, p, 1.0);
        }
    }
}
/* dst[i] = tile[(start + i) % period] */
static void tile_fill(void* dst, const unsigned char* tile, size_t period, size_t start, size_t count, size_t es) {
    unsigned char* d = (unsigned char*)dst;
    size_t done = 0, at = start % period;
    while (done < count) {
        size_t m = period - at < count - done ? period - at : count - done;
        memcpy(d + done * es, tile + at * es, m * es);
        done += m;
        at = 0;
    }
}
/* First i with buf[i] != tile[(start + i) % period], or SIZE_MAX. */
static size_t tile_cmp(const void* buf, const unsigned char* tile, size_t period, size_t start, size_t count, size_t es) {
    const unsigned char* b = (const unsigned char*)buf;
    size_t done = 0, at = start % period, i;
    while (done < count) {
        size_t m = period - at < count - done ? period - at : count - done;
        if (memcmp(b + done * es, tile + at * es, m * es) != 0) {
            for (i = 0; i < m; i++)
                if (memcmp(b + (done + i) * es, tile + (at + i) * es, es) != 0) return done + i;
        }
        done += m;
        at = 0;
    }
    return SIZE_MAX;
}
static size_t rank_start(int r) { return ((size_t)r * OFF) % P; }

/* ---- the matrix ---- */
typedef struct matrix {
    int n;
    dm_dtype t;
    dm_reduce_op op;
    bool large;                  /* run the (1<<20)+3 case */
    unsigned char* pool;         /* P elements */
    unsigned char* ref;          /* P elements: every rank's element j reduced in recursive-doubling order */
    unsigned char* ring;         /* n tiles of P elements: tile b, in ring order for block b */
} matrix;

static void describe_elem(dm_dtype t, const void* p, char* buf, size_t cap) {
    if (is_float(t)) snprintf(buf, cap, "%a", load_float(t, p));
    else if (is_signed_int(t)) snprintf(buf, cap, "%lld", (long long)(int64_t)load_int(t, p));
    else snprintf(buf, cap, "%llu", (unsigned long long)load_int(t, p));
}
static void check_tile(const matrix* m, const char* what, int rank, size_t count, int mode, const void* buf,
                       const unsigned char* tile, size_t start, int line) {
    size_t es = dm_dtype_size(m->t), bad = tile_cmp(buf, tile, P, start, count, es);
    if (bad != SIZE_MAX) {
        char got[64], want[64];
        describe_elem(m->t, (const unsigned char*)buf + bad * es, got, sizeof(got));
        describe_elem(m->t, tile + ((start + bad) % P) * es, want, sizeof(want));
        rank_fail(line, "%s world %d %s %s count %zu mode %d rank %d: element %zu is %s, want %s", what, m->n,
                  dm_dtype_name(m->t), dm_reduce_op_name(m->op), count, mode, rank, bad, got, want);
    }
}

/* all_reduce's result follows its schedule's documented order: one tile, or one per ring block. */
static void check_all_reduce(const matrix* m, int rank, size_t count, int mode, const void* recv) {
    size_t es = dm_dtype_size(m->t), off, len;
    int b;
    if (ref_all_reduce_is_rd(count, es, m->n)) {
        check_tile(m, "all_reduce", rank, count, mode, recv, m->ref, 0, __LINE__);
        return;
    }
    for (b = 0; b < m->n; b++) {
        ref_block(count, m->n, b, &off, &len);
        check_tile(m, "all_reduce", rank, len, mode, (const unsigned char*)recv + off * es, m->ring + (size_t)b * P * es,
                   off, __LINE__);
    }
}

/* all_reduce and reduce_scatter: modes 0 out of place, 1 in place with send NULL, 2 in place
   with send == recv (all_reduce; small counts). reduce_scatter: 0 out of place, 1 in place with
   recv == send + rank*recv_count. */
static int rank_reductions(dm_collective* c, void* user) {
    const matrix* m = (const matrix*)user;
    int r = dm_rank(c), n = m->n, mode;
    size_t es = dm_dtype_size(m->t), ci;
    RCHECK(dm_world_size(c) == n && r >= 0 && r < n);
    for (ci = 0; ci < NCOUNTS; ci++) {
        size_t C = g_counts[ci];
        if (C == LARGE && !m->large) continue;
        for (mode = 0; mode < 3; mode++) {
            unsigned char* recv = (unsigned char*)xmalloc(C * es);
            unsigned char* send = mode == 0 ? (unsigned char*)xmalloc(C * es) : NULL;
            if (mode == 2 && C > 1000) { free(recv); break; }
            tile_fill(mode == 0 ? send : recv, m->pool, P, rank_start(r), C, es);
            if (mode == 0) memset(recv, 0xa5, C * es);
            RCALL(c, dm_all_reduce(c, mode == 0 ? send : mode == 1 ? NULL : recv, recv, C, m->t, m->op));
            check_all_reduce(m, r, C, mode, recv);
            if (mode == 0) check_tile(m, "all_reduce send kept", r, C, mode, send, m->pool, rank_start(r), __LINE__);
            free(recv);
            free(send);
        }
        for (mode = 0; mode < 2; mode++) {
            size_t total = (size_t)n * C;
            unsigned char* send = (unsigned char*)xmalloc(total * es);
            unsigned char* recv = mode == 0 ? (unsigned char*)xmalloc(C * es) : send + (size_t)r * C * es;
            tile_fill(send, m->pool, P, rank_start(r), total, es);
            if (mode == 0) memset(recv, 0x5a, C * es);
            RCALL(c, dm_reduce_scatter(c, send, recv, C, m->t, m->op));
            check_tile(m, "reduce_scatter", r, C, mode, recv, m->ring + (size_t)r * P * es, (size_t)r * C, __LINE__);
            if (mode == 0) {
                check_tile(m, "reduce_scatter send kept", r, total, mode, send, m->pool, rank_start(r), __LINE__);
                free(recv);
            }
            free(send);
        }
    }
    return DM_OK;
}

/* all_gather (modes: out of place, send NULL, send == recv + rank*count), all_gather_to_list
   (out of place, send NULL, send == recvs[rank]), broadcast from every root. */
static int rank_data_movement(dm_collective* c, void* user) {
    const matrix* m = (const matrix*)user;
    int r = dm_rank(c), n = m->n, mode, q, root;
    size_t es = dm_dtype_size(m->t), ci;
    for (ci = 0; ci < NCOUNTS; ci++) {
        size_t C = g_counts[ci], bytes = C * es;
        if (C == LARGE && !m->large) continue;
        for (mode = 0; mode < 3; mode++) {
            unsigned char* recv = (unsigned char*)xmalloc((size_t)n * bytes);
            unsigned char* send = mode == 0 ? (unsigned char*)xmalloc(bytes) : NULL;
            memset(recv, 0x77, (size_t)n * bytes);
            tile_fill(mode == 0 ? send : recv + (size_t)r * bytes, m->pool, P, rank_start(r), C, es);
            RCALL(c, dm_all_gather(c, mode == 0 ? send : mode == 1 ? NULL : recv + (size_t)r * bytes, recv, C, m->t));
            for (q = 0; q < n; q++)
                check_tile(m, "all_gather", r, C, mode, recv + (size_t)q * bytes, m->pool, rank_start(q), __LINE__);
            if (mode == 0) check_tile(m, "all_gather send kept", r, C, mode, send, m->pool, rank_start(r), __LINE__);
            free(recv);
            free(send);
        }
        for (mode = 0; mode < 3; mode++) {
            void** recvs = (void**)xmalloc(sizeof(void*) * (size_t)n);
            unsigned char* send = mode == 0 ? (unsigned char*)xmalloc(bytes) : NULL;
            for (q = 0; q < n; q++) { recvs[q] = xmalloc(bytes); memset(recvs[q], 0x66, bytes); }
            tile_fill(mode == 0 ? send : (unsigned char*)recvs[r], m->pool, P, rank_start(r), C, es);
            RCALL(c, dm_all_gather_to_list(c, mode == 0 ? send : mode == 1 ? NULL : recvs[r], (void* const*)recvs, C, m->t));
            for (q = 0; q < n; q++) {
                check_tile(m, "all_gather_to_list", r, C, mode, recvs[q], m->pool, rank_start(q), __LINE__);
                free(recvs[q]);
            }
            free(recvs);
            free(send);
        }
        for (root = 0; root < n; root++) {
            unsigned char* buf = (unsigned char*)xmalloc(bytes);
            if (r == root) tile_fill(buf, m->pool, P, rank_start(root), C, es);
            else memset(buf, 0x55, bytes);
            RCALL(c, dm_broadcast(c, buf, C, m->t, root));
            check_tile(m, "broadcast", r, C, root, buf, m->pool, rank_start(root), __LINE__);
            free(buf);
        }
    }
    return DM_OK;
}

/* Which (dtype, op) pairs run the large count (see the top comment). */
static bool large_for_reduction(dm_dtype t, dm_reduce_op op) {
    /* make test: the large count for every dtype's SUM and the pairs below (every op, each
       element size, the 16-bit paths); every (dtype, op) runs the small counts. All pairs at the
       large count took 37 s of test_fake's 50 here; the kernels do not depend on the count. */
    if (!TEST_SANITIZED && op == DM_SUM) return true;
    return (t == DM_FLOAT32 && op == DM_SUM) || (t == DM_FLOAT16 && op == DM_SUM) ||
           (t == DM_BFLOAT16 && op == DM_MEAN) || (t == DM_INT8 && op == DM_PROD) ||
           (t == DM_UINT64 && op == DM_MAX) || (t == DM_INT32 && op == DM_MIN);
}
static bool large_world(int n) { return !TEST_SANITIZED || n == 3 || n == 7; }
static bool large_for_movement(dm_dtype t) {
    if (!TEST_SANITIZED) return true;
    return t == DM_UINT8 || t == DM_FLOAT16 || t == DM_FLOAT32 || t == DM_FLOAT64;
}

static void test_thread_reductions_every_world_dtype_op_count(void** state) {
    matrix m;
    size_t wi, j;
    int t, op, r;
    (void)state;
    reset_failures();
    m.pool = (unsigned char*)xmalloc(P * 8);
    m.ref = (unsigned char*)xmalloc(P * 8);
    m.ring = (unsigned char*)xmalloc((size_t)8 * P * 8);
    for (t = 0; t < DM_DTYPE_COUNT; t++) {
        for (op = 0; op < DM_REDUCE_OP_COUNT; op++) {
            size_t es = dm_dtype_size((dm_dtype)t);
            m.t = (dm_dtype)t;
            m.op = (dm_reduce_op)op;
            gen_pool(m.t, m.op, m.pool);
            for (wi = 0; wi < NWORLDS; wi++) {
                m.n = g_worlds[wi];
                m.large = large_for_reduction(m.t, m.op) && large_world(m.n);
                for (j = 0; j < P; j++) {   /* the references, in the schedules' orders */
                    unsigned char v[8 * 8];
                    for (r = 0; r < m.n; r++) memcpy(v + (size_t)r * es, m.pool + ((j + rank_start(r)) % P) * es, es);
                    ref_order_rd(m.t, m.op, v, es, m.n, m.ref + j * es);
                    ref_finish(m.t, m.op, m.ref + j * es, m.n);
                    for (r = 0; r < m.n; r++) {
                        unsigned char* acc = m.ring + ((size_t)r * P + j) * es;
                        ref_order_ring(m.t, m.op, v, es, m.n, r, acc);
                        ref_finish(m.t, m.op, acc, m.n);
                    }
                }
                assert_int_equal(run_world(m.n, rank_reductions, &m, MATRIX_TIMEOUT_MS), DM_OK);
                assert_no_rank_failures();
            }
        }
    }
    free(m.pool);
    free(m.ref);
    free(m.ring);
}

static void test_thread_data_movement_every_world_dtype_count(void** state) {
    matrix m;
    size_t wi;
    int t;
    (void)state;
    reset_failures();
    m.pool = (unsigned char*)xmalloc(P * 8);
    m.ref = NULL;
    m.op = DM_SUM;
    for (t = 0; t < DM_DTYPE_COUNT; t++) {
        m.t = (dm_dtype)t;
        gen_pool(m.t, DM_SUM, m.pool);
        for (wi = 0; wi < NWORLDS; wi++) {
            m.n = g_worlds[wi];
            m.large = large_for_movement(m.t) && large_world(m.n);
            assert_int_equal(run_world(m.n, rank_data_movement, &m, MATRIX_TIMEOUT_MS), DM_OK);
            assert_no_rank_failures();
        }
    }
    free(m.pool);
}

/* Objects: rank r contributes r*37+1 bytes (one rank (1<<20)+3) of a rank-specific pattern. */
static size_t obj_size(int r) { return r == 1 ? LARGE : (size_t)r * 37 + 1; }
static unsigned char obj_byte(int r, size_t i) { return (unsigned char)(i * 131 + (size_t)r * 17 + 3); }
static int rank_objects(dm_collective* c, void* user) {
    int r = dm_rank(c), n = dm_world_size(c), q, root;
    size_t i;
    unsigned char* mine = (unsigned char*)xmalloc(obj_size(r));
    dm_blob_list list;
    (void)user;
    for (i = 0; i < obj_size(r); i++) mine[i] = obj_byte(r, i);
    RCALL(c, dm_all_gather_objects(c, mine, obj_size(r), &list));
    RCHECK(list.count == (size_t)n && list.items != NULL);
    for (q = 0; q < n && list.count == (size_t)n; q++) {
        RCHECK(list.items[q].size == obj_size(q));
        for (i = 0; i < list.items[q].size; i++)
            if (((const unsigned char*)list.items[q].data)[i] != obj_byte(q, i)) { RCHECK(!"object byte"); break; }
    }
    dm_blob_list_free(c, &list);
    RCHECK(list.items == NULL && list.count == 0);
    /* broadcast_objects from every root: root sends root+1 objects (one of them large when root
       is 1), zero objects from the last root. */
    for (root = 0; root < n; root++) {
        size_t count = root == n - 1 && n > 1 ? 0 : (size_t)root + 1, k;
        dm_blob objs[8];
        for (k = 0; k < count; k++) {
            objs[k].data = mine;
            objs[k].size = r == 1 && k == 0 ? obj_size(1) : k + 1;
        }
        RCALL(c, dm_broadcast_objects(c, r == root ? objs : NULL, r == root ? count : 0, root, &list));
        RCHECK(list.count == count);
        for (k = 0; k < list.count; k++) {
            size_t want = root == 1 && k == 0 ? obj_size(1) : k + 1;
            RCHECK(list.items[k].size == want);
            if (list.items[k].size == want)
                for (i = 0; i < want; i++)
                    if (((const unsigned char*)list.items[k].data)[i] != obj_byte(root, i)) { RCHECK(!"bcast byte"); break; }
        }
        dm_blob_list_free(c, &list);
    }
    free(mine);
    return DM_OK;
}
static void test_thread_objects_every_world(void** state) {
    size_t wi;
    (void)state;
    reset_failures();
    for (wi = 0; wi < NWORLDS; wi++) {
        assert_int_equal(run_world(g_worlds[wi], rank_objects, NULL, MATRIX_TIMEOUT_MS), DM_OK);
        assert_no_rank_failures();
    }
}

/* Barrier: nobody leaves round k before everyone has entered it (rank 0 arrives late). */
static atomic_int g_entered;
static int rank_barrier(dm_collective* c, void* user) {
    int n = dm_world_size(c), k;
    (void)user;
    for (k = 1; k <= 5; k++) {
        if (dm_rank(c) == 0) { struct timespec ts = { 0, 2000000 }; nanosleep(&ts, NULL); }
        atomic_fetch_add(&g_entered, 1);
        RCALL(c, dm_barrier(c));
        RCHECK(atomic_load(&g_entered) >= k * n);
        RCALL(c, dm_barrier(c)); /* keeps round k+1's increments after every round-k check */
    }
    return DM_OK;
}
static void test_thread_barrier_every_world(void** state) {
    size_t wi;
    (void)state;
    reset_failures();
    for (wi = 0; wi < NWORLDS; wi++) {
        atomic_store(&g_entered, 0);
        assert_int_equal(run_world(g_worlds[wi], rank_barrier, NULL, MATRIX_TIMEOUT_MS), DM_OK);
        assert_no_rank_failures();
    }
}

/* ---- status names ---- */
static void test_status_names_and_texts(void** state) {
    static const struct { dm_status st; const char* name; const char* text; } all[] = {
#define X(name, val, text) { DM_##name, "DM_" #name, text },
        DM_STATUS_LIST(X)
#undef X
    };
    static const int unknown[] = { 1, 2, -99, -100, 12345, INT_MIN, INT_MAX, -1000000 };
    size_t i, j;
    (void)state;
    assert_true(sizeof(all) / sizeof(all[0]) >= 17);
    for (i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        assert_string_equal(dm_status_name(all[i].st), all[i].name);
        assert_string_equal(dm_strerror(all[i].st), all[i].text);
        assert_true(strlen(all[i].text) > 0);
        if (all[i].st != DM_OK) assert_true(all[i].st < 0);
        for (j = 0; j < i; j++) assert_true(all[j].st != all[i].st);
    }
    assert_int_equal(DM_OK, 0);
    assert_string_equal(dm_status_name(DM_ERR_TIMEOUT), "DM_ERR_TIMEOUT");
    assert_string_equal(dm_strerror(DM_ERR_TIMEOUT), "timed out waiting for peers");
    for (i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
        const char* nm = dm_status_name((dm_status)unknown[i]);
        const char* tx = dm_strerror((dm_status)unknown[i]);
        assert_non_null(nm);
        assert_non_null(tx);
        assert_true(strlen(nm) > 0 && strlen(tx) > 0);
        for (j = 0; j < sizeof(all) / sizeof(all[0]); j++) assert_true(strcmp(nm, all[j].name) != 0);
        /* static strings: the same pointer every time, nothing to free */
        assert_ptr_equal(nm, dm_status_name((dm_status)unknown[i]));
    }
}

/* ---- Fake world of one: exactly Optimus-DL's FakeCollective ---- */
static dm_collective* make_fake(int world, int rank) {
    dm_fake_desc d = {0};
    dm_collective* c = NULL;
    d.world_size = world;
    d.rank = rank;
    assert_int_equal(dm_fake_create(&d, &c), DM_OK);
    assert_non_null(c);
    return c;
}

static void test_fake_world1_accessors(void** state) {
    dm_collective* c = make_fake(0, 0);
    dm_device dev = dm_default_device(c);
    (void)state;
    assert_int_equal(dm_rank(c), 0);
    assert_int_equal(dm_world_size(c), 1);
    assert_int_equal(dm_local_rank(c), 0);
    assert_int_equal(dm_local_world_size(c), 1);
    assert_true(dm_is_master(c));
    assert_true(dm_is_local_master(c));
    assert_int_equal(dev.type, DM_DEVICE_CPU);
    assert_int_equal(dev.index, 0);
    assert_string_equal(dm_backend_name(c), "fake");
    assert_null(dm_native_handle(c));
    assert_string_equal(dm_last_error(c), "");
    assert_int_equal(dm_synchronize(c), DM_OK);
    assert_int_equal(dm_set_timeout(c, 5), DM_OK);
    assert_int_equal(dm_set_timeout(c, -1), DM_OK);
    assert_int_equal(dm_set_timeout(c, 0), DM_OK);
    dm_destroy(c);
    dm_destroy(NULL);
    /* NULL collective: documented defaults, never a crash */
    assert_int_equal(dm_rank(NULL), -1);
    assert_int_equal(dm_world_size(NULL), -1);
    assert_false(dm_is_master(NULL));
    assert_non_null(dm_last_error(NULL));
    assert_int_equal(dm_barrier(NULL), DM_ERR_INVALID_ARG);
    assert_int_equal(dm_set_timeout(NULL, 1), DM_ERR_INVALID_ARG);
}

static void free_fn_unused(void* p, void* ud) { (void)ud; free(p); }
static int rank_noop(dm_collective* c, void* user) { (void)c; (void)user; return DM_OK; }

/* Every collective on world 1, every dtype x op, count 3: data left as is (MEAN divides by 1),
   out-of-place copies send to recv, all_gather copies the input, broadcast root 0 keeps it. */
static void test_fake_world1_collectives_leave_data(void** state) {
    dm_collective* c = make_fake(1, 0);
    int t, op;
    uint64_t seq0;
    (void)state;
    assert_int_equal(dm_barrier(c), DM_OK);
    for (t = 0; t < DM_DTYPE_COUNT; t++) {
        size_t es = dm_dtype_size((dm_dtype)t), b = 3 * es;
        unsigned char x[24], y[24], z[24], want[24];
        void* recvs[1];
        dm_blob_list list;
        dm_blob obj;
        for (op = 0; op < DM_REDUCE_OP_COUNT; op++) {
            size_t i;
            for (i = 0; i < b; i++) want[i] = (unsigned char)(i * 7 + 1 + (size_t)t);
            if (is_float((dm_dtype)t)) for (i = 0; i < 3; i++) store_float((dm_dtype)t, want + i * es, 1.5 + (double)i);
            memcpy(x, want, b);
            assert_int_equal(dm_all_reduce(c, NULL, x, 3, (dm_dtype)t, (dm_reduce_op)op), DM_OK);
            assert_memory_equal(x, want, b);
            memset(y, 0, b);
            assert_int_equal(dm_all_reduce(c, x, y, 3, (dm_dtype)t, (dm_reduce_op)op), DM_OK);
            assert_memory_equal(y, want, b);
            memset(y, 0, b);
            assert_int_equal(dm_reduce_scatter(c, x, y, 3, (dm_dtype)t, (dm_reduce_op)op), DM_OK);
            assert_memory_equal(y, want, b);
            assert_int_equal(dm_reduce_scatter(c, x, x, 3, (dm_dtype)t, (dm_reduce_op)op), DM_OK);
            assert_memory_equal(x, want, b);
        }
        memset(y, 0, b);
        assert_int_equal(dm_all_gather(c, x, y, 3, (dm_dtype)t), DM_OK);
        assert_memory_equal(y, want, b);
        assert_int_equal(dm_all_gather(c, NULL, y, 3, (dm_dtype)t), DM_OK);
        assert_memory_equal(y, want, b);
        memset(z, 0, b);
        recvs[0] = z;
        assert_int_equal(dm_all_gather_to_list(c, x, (void* const*)recvs, 3, (dm_dtype)t), DM_OK);
        assert_memory_equal(z, want, b);
        assert_int_equal(dm_broadcast(c, x, 3, (dm_dtype)t, 0), DM_OK);
        assert_memory_equal(x, want, b);
        obj.data = x;
        obj.size = b;
        assert_int_equal(dm_all_gather_objects(c, x, b, &list), DM_OK);
        assert_int_equal(list.count, 1);
        assert_int_equal(list.items[0].size, b);
        assert_memory_equal(list.items[0].data, want, b);
        dm_blob_list_free(c, &list);
        assert_int_equal(dm_broadcast_objects(c, &obj, 1, 0, &list), DM_OK);
        assert_int_equal(list.count, 1);
        assert_memory_equal(list.items[0].data, want, b);
        dm_blob_list_free(c, &list);
    }
    /* every collective bumps the sequence number by one */
    seq0 = dm_sequence(c);
    {
        float f = 1;
        assert_int_equal(dm_all_reduce(c, NULL, &f, 1, DM_FLOAT32, DM_SUM), DM_OK);
        assert_true(dm_sequence(c) == seq0 + 1);
        assert_int_equal(dm_broadcast(c, &f, 1, DM_FLOAT32, 0), DM_OK);
        assert_true(dm_sequence(c) == seq0 + 2);
    }
    dm_destroy(c);
}

static void test_fake_world1_broadcast_from_other_root_fails(void** state) {
    dm_collective* c = make_fake(1, 0);
    float x[2] = { 1, 2 };
    dm_blob obj = { x, sizeof(x) };
    dm_blob_list list = { NULL, 7 };
    (void)state;
    assert_int_equal(dm_broadcast(c, x, 2, DM_FLOAT32, 1), DM_ERR_INVALID_ARG);
    assert_true(strlen(dm_last_error(c)) > 0);
    assert_non_null(strstr(dm_last_error(c), "broadcast"));
    assert_int_equal(dm_broadcast(c, x, 2, DM_FLOAT32, -1), DM_ERR_INVALID_ARG);
    assert_int_equal(dm_broadcast_objects(c, &obj, 1, 1, &list), DM_ERR_INVALID_ARG);
    assert_true(strlen(dm_last_error(c)) > 0);
    assert_null(list.items);
    assert_int_equal(list.count, 0);
    assert_true(x[0] == 1 && x[1] == 2);
    /* the next success clears the message */
    assert_int_equal(dm_broadcast(c, x, 2, DM_FLOAT32, 0), DM_OK);
    assert_string_equal(dm_last_error(c), "");
    dm_destroy(c);
}

static void test_fake_world1_split_and_local(void** state) {
    dm_collective* c = make_fake(1, 0);
    dm_collective *s = NULL, *none = (dm_collective*)&s;
    dm_collective* l;
    int v = 5;
    (void)state;
    assert_int_equal(dm_split(c, 3, 0, &s), DM_OK);
    assert_non_null(s);
    assert_int_equal(dm_world_size(s), 1);
    assert_int_equal(dm_rank(s), 0);
    assert_int_equal(dm_all_reduce(s, NULL, &v, 1, DM_INT32, DM_SUM), DM_OK);
    assert_int_equal(v, 5);
    dm_destroy(s);
    assert_int_equal(dm_split(c, DM_SPLIT_NONE, 0, &none), DM_OK);
    assert_null(none);
    assert_int_equal(dm_split(c, -2, 0, &s), DM_ERR_INVALID_ARG);
    assert_true(strlen(dm_last_error(c)) > 0);
    assert_int_equal(dm_split(c, 0, 0, NULL), DM_ERR_INVALID_ARG);
    l = dm_local(c);
    assert_non_null(l);
    assert_ptr_equal(dm_local(c), l);            /* made once, owned by c */
    assert_int_equal(dm_world_size(l), 1);
    assert_int_equal(dm_main_process_first_begin(c, false), DM_OK);
    assert_int_equal(dm_main_process_first_end(c, false), DM_OK);
    assert_int_equal(dm_main_process_first_begin(c, true), DM_OK);
    assert_int_equal(dm_main_process_first_end(c, true), DM_OK);
    dm_destroy(c);                               /* destroys l too (ASan would see a leak) */
}

/* Simulated world of N: one member (desc.rank) of N ranks that all hold the same data. The
   results must equal what N real ranks holding that data produce: the serial fold of N copies
   (SUM x*N and PROD x^N rounded / wrapped at each step, MAX/MIN x, MEAN the fold divided by N). */
static int g_sim_n;
static const unsigned char* g_sim_x;
static int rank_same_data(dm_collective* c, void* user) {
    unsigned char* out = (unsigned char*)user + (size_t)dm_rank(c) * 64 * 8 * DM_REDUCE_OP_COUNT * DM_DTYPE_COUNT;
    int t, op;
    for (t = 0; t < DM_DTYPE_COUNT; t++)
        for (op = 0; op < DM_REDUCE_OP_COUNT; op++) {
            unsigned char* o = out + ((size_t)t * DM_REDUCE_OP_COUNT + (size_t)op) * 64 * 8;
            RCALL(c, dm_all_reduce(c, g_sim_x + (size_t)t * 64 * 8, o, 64, (dm_dtype)t, (dm_reduce_op)op));
        }
    return DM_OK;
}
static void test_fake_simulated_world_matches_ranks_with_same_data(void** state) {
    static const int worlds[][2] = { { 2, 1 }, { 3, 2 }, { 4, 0 }, { 7, 6 } };
    size_t w;
    (void)state;
    reset_failures();
    for (w = 0; w < sizeof(worlds) / sizeof(worlds[0]); w++) {
        int n = worlds[w][0], rank = worlds[w][1], t, op;
        size_t per = 64 * 8 * DM_REDUCE_OP_COUNT * DM_DTYPE_COUNT;
        unsigned char* x = (unsigned char*)xmalloc(64 * 8 * DM_DTYPE_COUNT);
        unsigned char* threaded = (unsigned char*)xmalloc(per * (size_t)n);
        unsigned char* pool = (unsigned char*)xmalloc(P * 8);
        dm_collective* c = make_fake(n, rank);
        assert_int_equal(dm_rank(c), rank);
        assert_int_equal(dm_world_size(c), n);
        assert_int_equal(dm_is_master(c), rank == 0);
        for (t = 0; t < DM_DTYPE_COUNT; t++) {
            gen_pool((dm_dtype)t, DM_SUM, pool);
            memcpy(x + (size_t)t * 64 * 8, pool, 64 * dm_dtype_size((dm_dtype)t));
            /* include values that wrap / round: the extremes of each integer type */
            if (!is_float((dm_dtype)t)) { store_int((dm_dtype)t, x + (size_t)t * 64 * 8, UINT64_MAX / 2 + 7); }
        }
        g_sim_n = n;
        g_sim_x = x;
        assert_int_equal(run_world(n, rank_same_data, threaded, 60000), DM_OK);
        assert_no_rank_failures();
        for (t = 0; t < DM_DTYPE_COUNT; t++) {
            size_t es = dm_dtype_size((dm_dtype)t);
            for (op = 0; op < DM_REDUCE_OP_COUNT; op++) {
                unsigned char got[64 * 8], inplace[64 * 8];
                const unsigned char* want = threaded + ((size_t)t * DM_REDUCE_OP_COUNT + (size_t)op) * 64 * 8;
                assert_int_equal(dm_all_reduce(c, x + (size_t)t * 64 * 8, got, 64, (dm_dtype)t, (dm_reduce_op)op), DM_OK);
                if (memcmp(got, want, 64 * es) != 0)
                    fail_msg("simulated world %d %s %s differs from %d real ranks", n, dm_dtype_name((dm_dtype)t),
                             dm_reduce_op_name((dm_reduce_op)op), n);
                memcpy(inplace, x + (size_t)t * 64 * 8, 64 * es);
                assert_int_equal(dm_all_reduce(c, NULL, inplace, 64, (dm_dtype)t, (dm_reduce_op)op), DM_OK);
                assert_memory_equal(inplace, want, 64 * es);
                if (op == DM_MAX || op == DM_MIN) assert_memory_equal(got, x + (size_t)t * 64 * 8, 64 * es);
            }
        }
        free(x); free(threaded); free(pool);
        dm_destroy(c);
    }
}

/* The documented shorthand: SUM x*N, PROD x^N, MAX/MIN/MEAN x, where nothing wraps or rounds. */
static void test_fake_simulated_world_documented_results(void** state) {
    dm_collective* c = make_fake(4, 3);
    int32_t v[3] = { 3, -5, 7 }, w[3];
    double d[2] = { 1.5, -0.25 }, e[2];
    uint16_t h[2] = { 0x3e00, 0xbc00 }, g[2]; /* 1.5, -1.0 in float16 */
    int i;
    (void)state;
    assert_int_equal(dm_all_reduce(c, v, w, 3, DM_INT32, DM_SUM), DM_OK);
    for (i = 0; i < 3; i++) assert_int_equal(w[i], v[i] * 4);
    assert_int_equal(dm_all_reduce(c, v, w, 3, DM_INT32, DM_PROD), DM_OK);
    for (i = 0; i < 3; i++) assert_int_equal(w[i], v[i] * v[i] * v[i] * v[i]);
    assert_int_equal(dm_all_reduce(c, v, w, 3, DM_INT32, DM_MEAN), DM_OK);
    assert_memory_equal(w, v, sizeof(v));
    assert_int_equal(dm_all_reduce(c, v, w, 3, DM_INT32, DM_MAX), DM_OK);
    assert_memory_equal(w, v, sizeof(v));
    assert_int_equal(dm_all_reduce(c, d, e, 2, DM_FLOAT64, DM_SUM), DM_OK);
    assert_true(e[0] == 6.0 && e[1] == -1.0);
    assert_int_equal(dm_all_reduce(c, d, e, 2, DM_FLOAT64, DM_MEAN), DM_OK);
    assert_true(e[0] == 1.5 && e[1] == -0.25);
    assert_int_equal(dm_all_reduce(c, h, g, 2, DM_FLOAT16, DM_PROD), DM_OK);
    assert_true(dm_half_to_float(g[0]) == 5.0625f && dm_half_to_float(g[1]) == 1.0f);
    assert_int_equal(dm_all_reduce(c, h, g, 2, DM_FLOAT16, DM_MEAN), DM_OK);
    assert_memory_equal(g, h, sizeof(h));
    /* all_gather: the input in every slot; reduce_scatter: this rank's block, reduced as above */
    {
        int32_t all[12], blocks[12], mine[3];
        assert_int_equal(dm_all_gather(c, v, all, 3, DM_INT32), DM_OK);
        for (i = 0; i < 12; i++) assert_int_equal(all[i], v[i % 3]);
        for (i = 0; i < 12; i++) blocks[i] = i;
        assert_int_equal(dm_reduce_scatter(c, blocks, mine, 3, DM_INT32, DM_SUM), DM_OK);
        for (i = 0; i < 3; i++) assert_int_equal(mine[i], (9 + i) * 4);
        assert_int_equal(dm_reduce_scatter(c, blocks, blocks + 9, 3, DM_INT32, DM_MAX), DM_OK);
        for (i = 0; i < 12; i++) assert_int_equal(blocks[i], i);
        /* broadcast from any root leaves the data */
        memcpy(w, v, sizeof(v));
        for (i = 0; i < 4; i++) assert_int_equal(dm_broadcast(c, w, 3, DM_INT32, i), DM_OK);
        assert_memory_equal(w, v, sizeof(v));
        assert_int_equal(dm_broadcast(c, w, 3, DM_INT32, 4), DM_ERR_INVALID_ARG);
    }
    /* objects: every rank's object equals this one's */
    {
        dm_blob_list list;
        dm_blob objs[2] = { { "ab", 2 }, { "xyz", 3 } };
        assert_int_equal(dm_all_gather_objects(c, "hello", 5, &list), DM_OK);
        assert_int_equal(list.count, 4);
        for (i = 0; i < 4; i++) {
            assert_int_equal(list.items[i].size, 5);
            assert_memory_equal(list.items[i].data, "hello", 5);
        }
        dm_blob_list_free(c, &list);
        /* from this rank as root (a non-root simulated member cannot know the root's objects) */
        assert_int_equal(dm_broadcast_objects(c, objs, 2, 3, &list), DM_OK);
        assert_int_equal(list.count, 2);
        assert_memory_equal(list.items[1].data, "xyz", 3);
        dm_blob_list_free(c, &list);
    }
    assert_int_equal(dm_barrier(c), DM_OK);
    dm_destroy(c);
}

static void test_fake_create_rejects_bad_desc(void** state) {
    dm_fake_desc d = {0};
    dm_collective* c = (dm_collective*)&d;
    (void)state;
    d.world_size = 4;
    d.rank = 4;
    assert_int_equal(dm_fake_create(&d, &c), DM_ERR_INVALID_ARG);
    assert_null(c);
    d.rank = -1;
    c = (dm_collective*)&d;
    assert_int_equal(dm_fake_create(&d, &c), DM_ERR_INVALID_ARG);
    assert_null(c);
    d.rank = 0;
    d.world_size = -2;
    assert_int_equal(dm_fake_create(&d, &c), DM_ERR_INVALID_ARG);
    d.world_size = 0;
    d.rank = 1;   /* world 0 means 1: rank 1 is out of range */
    assert_int_equal(dm_fake_create(&d, &c), DM_ERR_INVALID_ARG);
    d.rank = 0;
    d.allocator.alloc_fn = NULL;
    d.allocator.free_fn = free_fn_unused;
    assert_int_equal(dm_fake_create(&d, &c), DM_ERR_INVALID_ARG);
    assert_null(c);
    assert_int_equal(dm_fake_create(NULL, NULL), DM_ERR_INVALID_ARG);
    assert_int_equal(dm_fake_create(NULL, &c), DM_OK);      /* NULL desc: all defaults */
    assert_int_equal(dm_world_size(c), 1);
    dm_destroy(c);
    d.allocator.free_fn = NULL;
    d.world_size = -1;
    assert_int_equal(dm_thread_world_run(&d, rank_noop, NULL), DM_ERR_INVALID_ARG);
    assert_int_equal(dm_thread_world_run(NULL, NULL, NULL), DM_ERR_INVALID_ARG);
}

/* ---- threaded world ---- */
static int rank_accessors(dm_collective* c, void* user) {
    int r = dm_rank(c), L = *(const int*)user, n = dm_world_size(c);
    int node_first = (r / L) * L, lsize = n - node_first < L ? n - node_first : L;
    RCHECK(n == 7);
    RCHECK(dm_local_rank(c) == r - node_first);
    RCHECK(dm_local_world_size(c) == lsize);
    RCHECK(dm_is_master(c) == (r == 0));
    RCHECK(dm_is_local_master(c) == (r % L == 0));
    RCHECK(strcmp(dm_backend_name(c), "thread") == 0);
    RCHECK(dm_default_device(c).type == DM_DEVICE_CPU);
    RCHECK(dm_native_handle(c) == NULL);
    RCALL(c, dm_synchronize(c));
    {   /* the node-local group: all-reduce of ones gives the node's size */
        dm_collective* l = dm_local(c);
        int one = 1;
        RCHECK(l != NULL);
        if (!l) return DM_ERR_INTERNAL;
        RCHECK(dm_world_size(l) == lsize && dm_rank(l) == r - node_first);
        RCALL(l, dm_all_reduce(l, NULL, &one, 1, DM_INT32, DM_SUM));
        RCHECK(one == lsize);
    }
    return DM_OK;
}
static void test_thread_world_accessors_and_nodes(void** state) {
    dm_fake_desc d = {0};
    int L = 3;
    (void)state;
    reset_failures();
    d.world_size = 7;
    d.local_world_size = 3;   /* nodes {0,1,2} {3,4,5} {6} */
    d.timeout_ms = 20000;
    assert_int_equal(dm_thread_world_run(&d, rank_accessors, &L), DM_OK);
    assert_no_rank_failures();
    L = 7;
    d.local_world_size = 0;   /* one node */
    assert_int_equal(dm_thread_world_run(&d, rank_accessors, &L), DM_OK);
    assert_no_rank_failures();
}

static int rank_returns_code(dm_collective* c, void* user) {
    (void)user;
    switch (dm_rank(c)) {
        case 2: return DM_ERR_IO;
        case 4: return DM_ERR_NOT_FOUND;
        default: return DM_OK;
    }
}
static void test_thread_world_run_returns_lowest_failing_rank(void** state) {
    (void)state;
    assert_int_equal(run_world(5, rank_returns_code, NULL, 5000), DM_ERR_IO);
    assert_int_equal(run_world(2, rank_returns_code, NULL, 5000), DM_OK);
    assert_int_equal(run_world(0, rank_noop, NULL, 5000), DM_OK);
}

typedef struct manual_arg { dm_collective* c; int result; } manual_arg;
static void* manual_thread(void* p) {
    manual_arg* a = (manual_arg*)p;
    int64_t v = dm_rank(a->c) + 1;
    a->result = dm_all_reduce(a->c, NULL, &v, 1, DM_INT64, DM_SUM);
    if (a->result == DM_OK && v != 10) a->result = DM_ERR_INTERNAL;
    dm_destroy(a->c);   /* by its own thread */
    return NULL;
}
static void test_thread_world_create_with_own_threads(void** state) {
    dm_fake_desc d = {0};
    dm_collective* cs[4];
    pthread_t th[4];
    manual_arg args[4];
    int r;
    (void)state;
    d.world_size = 4;
    d.timeout_ms = 20000;
    assert_int_equal(dm_thread_world_create(&d, cs), DM_OK);
    for (r = 0; r < 4; r++) {
        assert_non_null(cs[r]);
        assert_int_equal(dm_rank(cs[r]), r);
        args[r].c = cs[r];
        assert_int_equal(pthread_create(&th[r], NULL, manual_thread, &args[r]), 0);
    }
    for (r = 0; r < 4; r++) { pthread_join(th[r], NULL); assert_int_equal(args[r].result, DM_OK); }
    d.world_size = -1;
    assert_int_equal(dm_thread_world_create(&d, cs), DM_ERR_INVALID_ARG);
}

/* MEAN of {1, 2} in int32 is 1 and of {-1, -2} is -1 (documented examples), on two real ranks. */
static int rank_mean_examples(dm_collective* c, void* user) {
    int32_t v[2];
    (void)user;
    v[0] = dm_rank(c) + 1;
    v[1] = -(dm_rank(c) + 1);
    RCALL(c, dm_all_reduce(c, NULL, v, 2, DM_INT32, DM_MEAN));
    RCHECK(v[0] == 1 && v[1] == -1);
    return DM_OK;
}
static void test_thread_mean_on_integers_truncates(void** state) {
    (void)state;
    reset_failures();
    assert_int_equal(run_world(2, rank_mean_examples, NULL, 10000), DM_OK);
    assert_no_rank_failures();
}

/* A NaN on one rank reaches every rank for every float dtype and op. */
static int rank_nan(dm_collective* c, void* user) {
    static const dm_dtype fts[] = { DM_FLOAT16, DM_BFLOAT16, DM_FLOAT32, DM_FLOAT64 };
    int k, op;
    (void)user;
    for (k = 0; k < 4; k++)
        for (op = 0; op < DM_REDUCE_OP_COUNT; op++) {
            unsigned char buf[3 * 8];
            size_t es = dm_dtype_size(fts[k]);
            store_float(fts[k], buf, 1.0);
            store_float(fts[k], buf + es, dm_rank(c) == 2 ? NAN : 2.0);
            store_float(fts[k], buf + 2 * es, dm_rank(c) == 0 ? NAN : -3.0);
            RCALL(c, dm_all_reduce(c, NULL, buf, 3, fts[k], (dm_reduce_op)op));
            RCHECK(!isnan(load_float(fts[k], buf)));
            RCHECK(isnan(load_float(fts[k], buf + es)));
            RCHECK(isnan(load_float(fts[k], buf + 2 * es)));
        }
    return DM_OK;
}
static void test_thread_nan_reaches_every_rank(void** state) {
    (void)state;
    reset_failures();
    assert_int_equal(run_world(4, rank_nan, NULL, 10000), DM_OK);
    assert_no_rank_failures();
}

/* Mismatched collectives: every rank gets DM_ERR_MISMATCH and a message, nobody hangs. */
static int rank_mismatch(dm_collective* c, void* user) {
    int kind = *(const int*)user, r = dm_rank(c);
    float buf[8] = { 0 };
    dm_status st;
    switch (kind) {
        case 0: st = dm_all_reduce(c, NULL, buf, r == 1 ? 4 : 3, DM_FLOAT32, DM_SUM); break;
        case 1: st = dm_all_reduce(c, NULL, buf, 2, r == 1 ? DM_INT32 : DM_FLOAT32, DM_SUM); break;
        case 2: st = dm_all_reduce(c, NULL, buf, 2, DM_FLOAT32, r == 1 ? DM_MAX : DM_SUM); break;
        case 3: st = dm_broadcast(c, buf, 2, DM_FLOAT32, r == 1 ? 1 : 0); break;
        default: st = r == 1 ? dm_broadcast(c, buf, 2, DM_FLOAT32, 0) : dm_all_reduce(c, NULL, buf, 2, DM_FLOAT32, DM_SUM); break;
    }
    RCHECK(st == DM_ERR_MISMATCH);
    RCHECK(strlen(dm_last_error(c)) > 0);
    return DM_OK;
}
static void test_thread_mismatch_detected_on_every_rank(void** state) {
    int kind;
    (void)state;
    reset_failures();
    for (kind = 0; kind < 5; kind++) {
        assert_int_equal(run_world(3, rank_mismatch, &kind, 10000), DM_OK);
        assert_no_rank_failures();
    }
}

/* Timeout: rank 1 skips the third collective; the others give up after the short deadline with
   DM_ERR_TIMEOUT naming the op and its sequence number. */
static char g_timeout_msg[3][DM_LAST_ERROR_SIZE];
static int rank_timeout(dm_collective* c, void* user) {
    int r = dm_rank(c);
    float x = 1;
    dm_status st;
    (void)user;
    RCALL(c, dm_barrier(c));
    RCALL(c, dm_all_reduce(c, NULL, &x, 1, DM_FLOAT32, DM_SUM));
    RCALL(c, dm_set_timeout(c, 200));
    if (r == 1) return DM_OK;
    st = dm_all_reduce(c, NULL, &x, 1, DM_FLOAT32, DM_SUM);
    RCHECK(st == DM_ERR_TIMEOUT);
    RCHECK(dm_sequence(c) == 3);
    snprintf(g_timeout_msg[r], sizeof(g_timeout_msg[r]), "%s", dm_last_error(c));
    return DM_OK;
}
static void test_thread_timeout_names_op_and_sequence(void** state) {
    struct timespec t0, t1;
    double secs;
    int r;
    (void)state;
    reset_failures();
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(run_world(3, rank_timeout, NULL, 30000), DM_OK);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_no_rank_failures();
    secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    assert_true(secs < 10.0);
    for (r = 0; r < 3; r += 2) {
        if (!strstr(g_timeout_msg[r], "all_reduce") || !strstr(g_timeout_msg[r], "3"))
            fail_msg("rank %d timeout message lacks the op or sequence number: \"%s\"", r, g_timeout_msg[r]);
    }
}

/* ---- bad input: a status and a message each, nothing written, never a crash ---- */
static int check_bad_input(dm_collective* c) {
    int n = dm_world_size(c), r = dm_rank(c);
    float f[4] = { 1, 2, 3, 4 };
    float big[64];
    void* recvs[8];
    void* nulls[8] = { NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL };
    dm_blob_list list = { NULL, 3 };
    dm_blob objs[2] = { { f, sizeof(f) }, { f, 0 } };
    int i;
    const size_t huge = SIZE_MAX / 2 + 1; /* x 2 bytes (or x 2 ranks) overflows size_t */
#define BAD(expr, want, opname) do { dm_status st_ = (expr); \
        if (st_ != (want)) rank_fail(__LINE__, "%s -> %s, want %s", #expr, dm_status_name(st_), dm_status_name(want)); \
        else if (strlen(dm_last_error(c)) == 0) rank_fail(__LINE__, "%s: empty dm_last_error", #expr); \
        else if ((opname)[0] && !strstr(dm_last_error(c), (opname))) \
            rank_fail(__LINE__, "%s: message \"%s\" does not name %s", #expr, dm_last_error(c), (opname)); \
    } while (0)
    for (i = 0; i < 8; i++) recvs[i] = big + 8 * i;
    /* NULL buffers */
    BAD(dm_all_reduce(c, f, NULL, 4, DM_FLOAT32, DM_SUM), DM_ERR_INVALID_ARG, "all_reduce");
    BAD(dm_all_reduce(c, NULL, NULL, 4, DM_FLOAT32, DM_SUM), DM_ERR_INVALID_ARG, "all_reduce");
    BAD(dm_all_gather(c, f, NULL, 4, DM_FLOAT32), DM_ERR_INVALID_ARG, "all_gather");
    BAD(dm_all_gather_to_list(c, f, NULL, 4, DM_FLOAT32), DM_ERR_INVALID_ARG, "all_gather_to_list");
    BAD(dm_all_gather_to_list(c, f, (void* const*)nulls, 4, DM_FLOAT32), DM_ERR_INVALID_ARG, "all_gather_to_list");
    BAD(dm_reduce_scatter(c, NULL, f, 1, DM_FLOAT32, DM_SUM), DM_ERR_INVALID_ARG, "reduce_scatter");
    BAD(dm_reduce_scatter(c, big, NULL, 1, DM_FLOAT32, DM_SUM), DM_ERR_INVALID_ARG, "reduce_scatter");
    BAD(dm_broadcast(c, NULL, 4, DM_FLOAT32, 0), DM_ERR_INVALID_ARG, "broadcast");
    BAD(dm_all_gather_objects(c, NULL, 4, &list), DM_ERR_INVALID_ARG, "all_gather_objects");
    RCHECK(list.items == NULL && list.count == 0);
    BAD(dm_all_gather_objects(c, f, 4, NULL), DM_ERR_INVALID_ARG, "all_gather_objects");
    BAD(dm_broadcast_objects(c, NULL, 2, r, &list), DM_ERR_INVALID_ARG, "broadcast_objects");
    BAD(dm_broadcast_objects(c, objs, 1, 0, NULL), DM_ERR_INVALID_ARG, "broadcast_objects");
    BAD(dm_split(c, 0, 0, NULL), DM_ERR_INVALID_ARG, "split");
    /* count * sizeof(dtype) overflows size_t (and count * world_size for the gathers) */
    BAD(dm_all_reduce(c, NULL, f, huge, DM_FLOAT32, DM_SUM), DM_ERR_INVALID_ARG, "all_reduce");
    BAD(dm_all_reduce(c, NULL, f, SIZE_MAX, DM_UINT64, DM_SUM), DM_ERR_INVALID_ARG, "all_reduce");
    BAD(dm_all_gather(c, f, big, huge, DM_FLOAT64), DM_ERR_INVALID_ARG, "all_gather");
    BAD(dm_all_gather_to_list(c, f, (void* const*)recvs, huge, DM_INT32), DM_ERR_INVALID_ARG, "all_gather_to_list");
    BAD(dm_reduce_scatter(c, big, f, huge, DM_FLOAT16, DM_SUM), DM_ERR_INVALID_ARG, "reduce_scatter");
    BAD(dm_broadcast(c, f, huge, DM_FLOAT32, 0), DM_ERR_INVALID_ARG, "broadcast");
    if (n >= 2) {  /* count * size fits, count * size * world does not */
        BAD(dm_all_gather(c, f, big, huge, DM_INT8), DM_ERR_INVALID_ARG, "all_gather");
        BAD(dm_reduce_scatter(c, big, f, huge, DM_INT8, DM_SUM), DM_ERR_INVALID_ARG, "reduce_scatter");
        BAD(dm_all_gather_to_list(c, f, (void* const*)recvs, huge, DM_INT8), DM_ERR_INVALID_ARG, "all_gather_to_list");
    }
    /* invalid dtype / op */
    BAD(dm_all_reduce(c, NULL, f, 4, (dm_dtype)99, DM_SUM), DM_ERR_INVALID_ARG, "all_reduce");
    BAD(dm_all_reduce(c, NULL, f, 4, (dm_dtype)-1, DM_SUM), DM_ERR_INVALID_ARG, "all_reduce");
    BAD(dm_all_reduce(c, NULL, f, 4, DM_DTYPE_COUNT, DM_SUM), DM_ERR_INVALID_ARG, "all_reduce");
    BAD(dm_all_reduce(c, NULL, f, 4, DM_FLOAT32, (dm_reduce_op)99), DM_ERR_INVALID_ARG, "all_reduce");
    BAD(dm_all_reduce(c, NULL, f, 4, DM_FLOAT32, (dm_reduce_op)-1), DM_ERR_INVALID_ARG, "all_reduce");
    BAD(dm_all_reduce(c, NULL, f, 0, (dm_dtype)99, DM_SUM), DM_ERR_INVALID_ARG, "all_reduce");
    BAD(dm_all_gather(c, f, big, 1, (dm_dtype)99), DM_ERR_INVALID_ARG, "all_gather");
    BAD(dm_all_gather_to_list(c, f, (void* const*)recvs, 1, (dm_dtype)99), DM_ERR_INVALID_ARG, "all_gather_to_list");
    BAD(dm_reduce_scatter(c, big, f, 1, (dm_dtype)99, DM_SUM), DM_ERR_INVALID_ARG, "reduce_scatter");
    BAD(dm_reduce_scatter(c, big, f, 1, DM_FLOAT32, DM_REDUCE_OP_COUNT), DM_ERR_INVALID_ARG, "reduce_scatter");
    BAD(dm_broadcast(c, f, 1, (dm_dtype)99, 0), DM_ERR_INVALID_ARG, "broadcast");
    /* root out of range */
    BAD(dm_broadcast(c, f, 4, DM_FLOAT32, -1), DM_ERR_INVALID_ARG, "broadcast");
    BAD(dm_broadcast(c, f, 4, DM_FLOAT32, n), DM_ERR_INVALID_ARG, "broadcast");
    BAD(dm_broadcast(c, f, 4, DM_FLOAT32, INT_MAX), DM_ERR_INVALID_ARG, "broadcast");
    BAD(dm_broadcast_objects(c, objs, 1, n, &list), DM_ERR_INVALID_ARG, "broadcast_objects");
    BAD(dm_broadcast_objects(c, objs, 1, -1, &list), DM_ERR_INVALID_ARG, "broadcast_objects");
    /* objects of size 0 */
    BAD(dm_all_gather_objects(c, f, 0, &list), DM_ERR_INVALID_ARG, "all_gather_objects");
    if (r == 0) BAD(dm_broadcast_objects(c, objs, 2, 0, &list), DM_ERR_INVALID_ARG, "broadcast_objects");
    RCHECK(list.items == NULL && list.count == 0);
    /* wrong in-place layouts (only meaningful where the buffers can overlap wrongly) */
    BAD(dm_all_reduce(c, big + 1, big, 4, DM_FLOAT32, DM_SUM), DM_ERR_INVALID_ARG, "all_reduce");
    BAD(dm_all_gather(c, big + (size_t)r * 4 + 1, big, 4, DM_FLOAT32), DM_ERR_INVALID_ARG, "all_gather");
    BAD(dm_reduce_scatter(c, big, big + (size_t)r * 4 + 1, 4, DM_FLOAT32, DM_SUM), DM_ERR_INVALID_ARG, "reduce_scatter");
    if (n > 1) {
        BAD(dm_all_gather(c, big + (size_t)((r + 1) % n) * 4, big, 4, DM_FLOAT32), DM_ERR_INVALID_ARG, "all_gather");
        BAD(dm_reduce_scatter(c, big, big + (size_t)((r + 1) % n) * 4, 4, DM_FLOAT32, DM_SUM), DM_ERR_INVALID_ARG, "reduce_scatter");
        recvs[1] = (float*)recvs[0] + 1;   /* overlapping list entries */
        BAD(dm_all_gather_to_list(c, NULL, (void* const*)recvs, 4, DM_FLOAT32), DM_ERR_INVALID_ARG, "all_gather_to_list");
        recvs[1] = big + 8;
        BAD(dm_all_gather_to_list(c, recvs[(r + 1) % n], (void* const*)recvs, 4, DM_FLOAT32), DM_ERR_INVALID_ARG, "all_gather_to_list");
    }
#undef BAD
    RCHECK(f[0] == 1 && f[1] == 2 && f[2] == 3 && f[3] == 4);
    /* the collective still works afterwards, and success clears the message */
    RCALL(c, dm_all_reduce(c, NULL, f, 4, DM_FLOAT32, DM_MAX));
    RCHECK(strcmp(dm_last_error(c), "") == 0);
    RCHECK(f[0] == 1 && f[3] == 4);
    return DM_OK;
}
static int rank_bad_input(dm_collective* c, void* user) { (void)user; return check_bad_input(c); }
static void test_bad_input_on_fake_and_thread_worlds(void** state) {
    dm_collective* c;
    (void)state;
    reset_failures();
    c = make_fake(1, 0);
    assert_int_equal(check_bad_input(c), DM_OK);
    dm_destroy(c);
    c = make_fake(4, 2);
    assert_int_equal(check_bad_input(c), DM_OK);
    dm_destroy(c);
    assert_no_rank_failures();
    /* every rank passes the same bad arguments: each fails locally before communicating */
    assert_int_equal(run_world(3, rank_bad_input, NULL, 20000), DM_OK);
    assert_no_rank_failures();
}

/* ---- logger (STYLE B6): errors are logged with their status, and recorded without a logger ---- */
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static dm_status g_logged[64];
static char g_logged_msg[64][DM_LAST_ERROR_SIZE];
static int g_nlogged;
static void capture_log(dm_log_level lvl, dm_status code, const char* msg, const char* file, int line, void* ud) {
    (void)file; (void)line;
    pthread_mutex_lock(&g_log_mu);
    if (g_nlogged < 64 && lvl == DM_LOG_ERROR && ud == (void*)&g_nlogged) {
        g_logged[g_nlogged] = code;
        snprintf(g_logged_msg[g_nlogged], DM_LAST_ERROR_SIZE, "%s", msg);
        g_nlogged++;
    }
    pthread_mutex_unlock(&g_log_mu);
}
static int rank_logged_mismatch(dm_collective* c, void* user) {
    float x[2] = { 0, 0 };
    (void)user;
    RCHECK(dm_all_reduce(c, NULL, x, dm_rank(c) == 0 ? 1 : 2, DM_FLOAT32, DM_SUM) == DM_ERR_MISMATCH);
    return DM_OK;
}
static void test_logger_captures_failures(void** state) {
    dm_fake_desc d = {0};
    dm_collective* c = NULL;
    float x = 1;
    int i;
    (void)state;
    g_nlogged = 0;
    d.logger.func = capture_log;
    d.logger.user_data = &g_nlogged;
    assert_int_equal(dm_fake_create(&d, &c), DM_OK);
    assert_int_equal(dm_all_reduce(c, NULL, &x, 1, (dm_dtype)99, DM_SUM), DM_ERR_INVALID_ARG);
    assert_int_equal(g_nlogged, 1);
    assert_int_equal(g_logged[0], DM_ERR_INVALID_ARG);
    assert_string_equal(g_logged_msg[0], dm_last_error(c));
    assert_int_equal(dm_broadcast(c, &x, 1, DM_FLOAT32, 3), DM_ERR_INVALID_ARG);
    assert_int_equal(g_nlogged, 2);
    assert_int_equal(dm_all_reduce(c, NULL, &x, 1, DM_FLOAT32, DM_SUM), DM_OK);
    assert_int_equal(g_nlogged, 2);                 /* success logs no error */
    dm_destroy(c);
    /* a bad desc is logged through the desc's logger */
    d.world_size = 2;
    d.rank = 5;
    assert_int_equal(dm_fake_create(&d, &c), DM_ERR_INVALID_ARG);
    assert_int_equal(g_nlogged, 3);
    assert_int_equal(g_logged[2], DM_ERR_INVALID_ARG);
    assert_true(strlen(g_logged_msg[2]) > 0);
    /* threaded world: called from every rank thread */
    g_nlogged = 0;
    d.world_size = 3;
    d.rank = 0;
    d.timeout_ms = 10000;
    reset_failures();
    assert_int_equal(dm_thread_world_run(&d, rank_logged_mismatch, NULL), DM_OK);
    assert_no_rank_failures();
    assert_int_equal(g_nlogged, 3);
    for (i = 0; i < 3; i++) assert_int_equal(g_logged[i], DM_ERR_MISMATCH);
    /* dm_log_stderr is a usable logger */
    d.logger.func = dm_log_stderr;
    d.world_size = 1;
    assert_int_equal(dm_fake_create(&d, &c), DM_OK);
    assert_int_equal(dm_broadcast(c, &x, 1, DM_FLOAT32, 1), DM_ERR_INVALID_ARG);
    dm_destroy(c);
}

/* ---- allocator hooks: every byte goes through them and comes back ---- */
static atomic_long g_allocs, g_frees;
static void* count_alloc(size_t size, void* ud) {
    if (ud != (void*)&g_allocs) return NULL;
    atomic_fetch_add(&g_allocs, 1);
    return malloc(size);
}
static void count_free(void* p, void* ud) {
    if (ud != (void*)&g_allocs || !p) return;
    atomic_fetch_add(&g_frees, 1);
    free(p);
}
static int rank_alloc_work(dm_collective* c, void* user) {
    dm_blob_list list;
    dm_collective* s = NULL;
    int v = 1;
    (void)user;
    RCALL(c, dm_all_gather_objects(c, "abc", 3, &list));
    dm_blob_list_free(c, &list);
    RCALL(c, dm_split(c, dm_rank(c) % 2, 0, &s));
    RCALL(s, dm_all_reduce(s, NULL, &v, 1, DM_INT32, DM_SUM));
    dm_destroy(s);
    RCHECK(dm_local(c) != NULL);
    return DM_OK;
}
static void test_allocator_hooks_see_every_allocation(void** state) {
    dm_fake_desc d = {0};
    dm_collective* c = NULL;
    dm_blob_list list;
    (void)state;
    reset_failures();
    atomic_store(&g_allocs, 0);
    atomic_store(&g_frees, 0);
    d.allocator.alloc_fn = count_alloc;
    d.allocator.free_fn = count_free;
    d.allocator.user_data = &g_allocs;
    assert_int_equal(dm_fake_create(&d, &c), DM_OK);
    assert_int_equal(dm_all_gather_objects(c, "x", 1, &list), DM_OK);
    dm_blob_list_free(c, &list);
    assert_non_null(dm_local(c));
    dm_destroy(c);
    assert_true(atomic_load(&g_allocs) > 0);
    assert_int_equal(atomic_load(&g_allocs), atomic_load(&g_frees));
    d.world_size = 4;
    d.timeout_ms = 20000;
    assert_int_equal(dm_thread_world_run(&d, rank_alloc_work, NULL), DM_OK);
    assert_no_rank_failures();
    assert_int_equal(atomic_load(&g_allocs), atomic_load(&g_frees));
}

/* Count 0: every collective succeeds and writes nothing. */
static int rank_count0(dm_collective* c, void* user) {
    unsigned char canary[64];
    void* recvs[8];
    int i;
    (void)user;
    memset(canary, 0xcd, sizeof(canary));
    for (i = 0; i < 8; i++) recvs[i] = canary;
    RCALL(c, dm_all_reduce(c, canary, canary + 8, 0, DM_FLOAT64, DM_SUM));
    RCALL(c, dm_all_gather(c, canary, canary + 8, 0, DM_FLOAT64));
    RCALL(c, dm_all_gather_to_list(c, canary, (void* const*)recvs, 0, DM_FLOAT64));
    RCALL(c, dm_reduce_scatter(c, canary, canary + 8, 0, DM_FLOAT64, DM_MEAN));
    RCALL(c, dm_broadcast(c, canary, 0, DM_FLOAT64, dm_world_size(c) - 1));
    for (i = 0; i < 64; i++) RCHECK(canary[i] == 0xcd);
    return DM_OK;
}
static void test_count_zero_writes_nothing(void** state) {
    dm_collective* c = make_fake(1, 0);
    (void)state;
    reset_failures();
    assert_int_equal(rank_count0(c, NULL), DM_OK);
    dm_destroy(c);
    assert_int_equal(run_world(3, rank_count0, NULL, 10000), DM_OK);
    assert_no_rank_failures();
}

DM_TEST_MAIN(NULL, NULL,
    cmocka_unit_test(test_status_names_and_texts),
    cmocka_unit_test(test_fake_world1_accessors),
    cmocka_unit_test(test_fake_world1_collectives_leave_data),
    cmocka_unit_test(test_fake_world1_broadcast_from_other_root_fails),
    cmocka_unit_test(test_fake_world1_split_and_local),
    cmocka_unit_test(test_fake_simulated_world_matches_ranks_with_same_data),
    cmocka_unit_test(test_fake_simulated_world_documented_results),
    cmocka_unit_test(test_fake_create_rejects_bad_desc),
    cmocka_unit_test(test_thread_world_accessors_and_nodes),
    cmocka_unit_test(test_thread_world_run_returns_lowest_failing_rank),
    cmocka_unit_test(test_thread_world_create_with_own_threads),
    cmocka_unit_test(test_thread_mean_on_integers_truncates),
    cmocka_unit_test(test_thread_nan_reaches_every_rank),
    cmocka_unit_test(test_thread_mismatch_detected_on_every_rank),
    cmocka_unit_test(test_thread_timeout_names_op_and_sequence),
    cmocka_unit_test(test_bad_input_on_fake_and_thread_worlds),
    cmocka_unit_test(test_logger_captures_failures),
    cmocka_unit_test(test_allocator_hooks_see_every_allocation),
    cmocka_unit_test(test_count_zero_writes_nothing),
    cmocka_unit_test(test_thread_barrier_every_world),
    cmocka_unit_test(test_thread_objects_every_world),
    cmocka_unit_test(test_thread_data_movement_every_world_dtype_count),
    cmocka_unit_test(test_thread_reductions_every_world_dtype_op_count))
