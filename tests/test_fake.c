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

   Sanitizers: ASan/TSan builds are 3-15x slower. Under them (detected at compile time), the
   (1<<20)+3 case runs for a subset only: six dtype x op pairs covering every op and both 16-bit
   floats for the reductions, one dtype per element size for the data-movement collectives. Every
   other case, and every dtype x op at the other counts, runs everywhere. */
#include "distmesh.h"
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define TEST_SANITIZED 1
#endif
#endif
#ifndef TEST_SANITIZED
#define TEST_SANITIZED 0
#endif

#define P 65521u
#define OFF 7919u
#define LARGE ((size_t)(1u << 20) + 3)
static const int g_worlds[] = { 1, 2, 3, 4, 7 };
static const size_t g_counts[] = { 0, 1, 3, 1000, LARGE };
#define NWORLDS (sizeof(g_worlds) / sizeof(g_worlds[0]))
#define NCOUNTS (sizeof(g_counts) / sizeof(g_counts[0]))
#define MATRIX_TIMEOUT_MS 120000

/* ---- failures seen on rank threads (cmocka's asserts must stay on the main thread) ---- */
static atomic_int g_failures;
static pthread_mutex_t g_fail_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_first_failure[1024];
static void rank_fail(int line, const char* fmt, ...) {
    va_list ap;
    pthread_mutex_lock(&g_fail_mu);
    if (atomic_fetch_add(&g_failures, 1) == 0) {
        int n = snprintf(g_first_failure, sizeof(g_first_failure), "line %d: ", line);
        va_start(ap, fmt);
        vsnprintf(g_first_failure + n, sizeof(g_first_failure) - (size_t)n, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&g_fail_mu);
}
/* Records and goes on (data checks). */
#define RCHECK(cond) do { if (!(cond)) rank_fail(__LINE__, "rank check failed: %s", #cond); } while (0)
/* Records and returns from the rank function (a failed collective: the rest would hang). */
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
static uint64_t rnd(void) {
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double rnd_unit(void) { return (double)(rnd() >> 11) / 9007199254740992.0; }
static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static float ref_half_to_float(uint16_t h) {
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e == 0x1f ? (m ? NAN : INFINITY) : e == 0 ? ldexp((double)m, -24) : ldexp((double)(1024 + m), e - 25);
    return (float)((h & 0x8000) ? -v : v);
}
static double ref_round(double v, int mant_bits, int emin) {
    int e;
    double ulp;
    if (v == 0 || isinf(v) || isnan(v)) return v;
    e = ilogb(v);
    if (e < emin) e = emin;
    ulp = ldexp(1.0, e - mant_bits);
    return nearbyint(v / ulp) * ulp;
}
static uint16_t ref_float_to_half(float f) {
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    double a;
    int e;
    if (isnan(f)) return (uint16_t)(sign | 0x7e00);
    a = fabs(ref_round((double)f, 10, -14));
    if (a >= 65536.0) return (uint16_t)(sign | 0x7c00);
    if (a == 0) return sign;
    if (a < ldexp(1.0, -14)) return (uint16_t)(sign | (uint16_t)(a * 16777216.0));
    e = ilogb(a);
    return (uint16_t)(sign | ((e + 15) << 10) | (uint16_t)(ldexp(a, 10 - e) - 1024.0));
}
static uint16_t ref_float_to_bf16(float f) {
    double v;
    if (isnan(f)) return (uint16_t)((f32_bits(f) >> 16) | 0x40);
    v = ref_round((double)f, 7, -126);
    if (fabs(v) > FLT_MAX) return signbit(f) ? 0xff80 : 0x7f80;
    return (uint16_t)(f32_bits((float)v) >> 16);
}
static bool is_float(dm_dtype t) { return t >= DM_FLOAT16; }
static bool is_signed_int(dm_dtype t) { return t == DM_INT8 || t == DM_INT32 || t == DM_INT64; }
static uint64_t load_int(dm_dtype t, const void* p) {
    switch (t) {
        case DM_INT8: return (uint64_t)(int64_t)*(const int8_t*)p;
        case DM_UINT8: return *(const uint8_t*)p;
        case DM_INT32: return (uint64_t)(int64_t)*(const int32_t*)p;
        case DM_UINT32: return *(const uint32_t*)p;
        case DM_INT64: return (uint64_t)*(const int64_t*)p;
        default: return *(const uint64_t*)p;
    }
}
static void store_int(dm_dtype t, void* p, uint64_t v) {
    uint8_t b[8];
    int i;
    for (i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    memcpy(p, b, dm_dtype_size(t)); /* little-endian hosts */
}
static double load_float(dm_dtype t, const void* p) {
    uint16_t h;
    switch (t) {
        case DM_FLOAT16: memcpy(&h, p, 2); return ref_half_to_float(h);
        case DM_BFLOAT16: memcpy(&h, p, 2); return bits_f32((uint32_t)h << 16);
        case DM_FLOAT32: return *(const float*)p;
        default: return *(const double*)p;
    }
}
static void store_float(dm_dtype t, void* p, double v) {
    uint16_t h;
    switch (t) {
        case DM_FLOAT16: h = ref_float_to_half((float)v); memcpy(p, &h, 2); break;
        case DM_BFLOAT16: h = ref_float_to_bf16((float)v); memcpy(p, &h, 2); break;
        case DM_FLOAT32: *(float*)p = (float)v; break;
        default: *(double*)p = v; break;
    }
}
/* acc = acc op x with distmesh's documented semantics (see test_reduce.c for the kernels). */
static void ref_step(dm_dtype t, dm_reduce_op op, void* acc, const void* x) {
    if (!is_float(t)) {
        uint64_t a = load_int(t, acc), b = load_int(t, x), r;
        bool gt = is_signed_int(t) ? (int64_t)a > (int64_t)b : a > b;
        r = (op == DM_SUM || op == DM_MEAN) ? a + b : op == DM_PROD ? a * b : op == DM_MAX ? (gt ? a : b) : (gt ? b : a);
        store_int(t, acc, r);
    } else if (t == DM_FLOAT64) {
        double a = load_float(t, acc), b = load_float(t, x);
        double r = (op == DM_SUM || op == DM_MEAN) ? a + b : op == DM_PROD ? a * b
                 : (isnan(a) || isnan(b)) ? NAN : op == DM_MAX ? (a > b ? a : b) : (a < b ? a : b);
        store_float(t, acc, r);
    } else {
        float a = (float)load_float(t, acc), b = (float)load_float(t, x);
        float r = (op == DM_SUM || op == DM_MEAN) ? a + b : op == DM_PROD ? a * b
                : (isnan(a) || isnan(b)) ? NAN : op == DM_MAX ? (a > b ? a : b) : (a < b ? a : b);
        store_float(t, acc, r);
    }
}
/* MEAN's last step: divide by the group size (integers truncate toward zero). */
static void ref_finish(dm_dtype t, dm_reduce_op op, void* acc, int n) {
    if (op != DM_MEAN) return;
    if (t == DM_FLOAT64) store_float(t, acc, load_float(t, acc) / n);
    else if (is_float(t)) store_float(t, acc, (float)load_float(t, acc) / (float)n);
    else if (is_signed_int(t)) store_int(t, acc, (uint64_t)((int64_t)load_int(t, acc) / n));
    else store_int(t, acc, load_int(t, acc) / (uint64_t)n);
}

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
    unsigned char* ref;          /* P elements: the reduction of every rank's element j */
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
            check_tile(m, "all_reduce", r, C, mode, recv, m->ref, 0, __LINE__);
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
            check_tile(m, "reduce_scatter", r, C, mode, recv, m->ref, (size_t)r * C, __LINE__);
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

/* Under sanitizers, which (dtype, op) pairs still run the large count (see the top comment). */
static bool large_for_reduction(dm_dtype t, dm_reduce_op op) {
    if (!TEST_SANITIZED) return true;
    return (t == DM_FLOAT32 && op == DM_SUM) || (t == DM_FLOAT16 && op == DM_SUM) ||
           (t == DM_BFLOAT16 && op == DM_MEAN) || (t == DM_INT8 && op == DM_PROD) ||
           (t == DM_UINT64 && op == DM_MAX) || (t == DM_INT32 && op == DM_MIN);
}
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
    for (t = 0; t < DM_DTYPE_COUNT; t++) {
        for (op = 0; op < DM_REDUCE_OP_COUNT; op++) {
            size_t es = dm_dtype_size((dm_dtype)t);
            m.t = (dm_dtype)t;
            m.op = (dm_reduce_op)op;
            m.large = large_for_reduction(m.t, m.op);
            gen_pool(m.t, m.op, m.pool);
            for (wi = 0; wi < NWORLDS; wi++) {
                m.n = g_worlds[wi];
                for (j = 0; j < P; j++) {   /* serial reference, rank order 0..n-1 */
                    unsigned char* acc = m.ref + j * es;
                    memcpy(acc, m.pool + ((j + rank_start(0)) % P) * es, es);
                    for (r = 1; r < m.n; r++) ref_step(m.t, m.op, acc, m.pool + ((j + rank_start(r)) % P) * es);
                    ref_finish(m.t, m.op, acc, m.n);
                }
                assert_int_equal(run_world(m.n, rank_reductions, &m, MATRIX_TIMEOUT_MS), DM_OK);
                assert_no_rank_failures();
            }
        }
    }
    free(m.pool);
    free(m.ref);
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
        m.large = large_for_movement(m.t);
        gen_pool(m.t, DM_SUM, m.pool);
        for (wi = 0; wi < NWORLDS; wi++) {
            m.n = g_worlds[wi];
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
    static const int unknown[] = { 1, 2, -17, -100, 12345, INT_MIN, INT_MAX, -1000000 };
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

/* @@MORE@@ */

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_names_and_texts),
        cmocka_unit_test(test_fake_world1_accessors),
        cmocka_unit_test(test_thread_barrier_every_world),
        cmocka_unit_test(test_thread_objects_every_world),
        cmocka_unit_test(test_thread_data_movement_every_world_dtype_count),
        cmocka_unit_test(test_thread_reductions_every_world_dtype_op_count),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
