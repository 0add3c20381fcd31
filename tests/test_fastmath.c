/* test_fastmath: the documented float semantics of the reductions (dm_reduce_op's comment, README
   "Dtypes and ops") hold when the implementation is compiled with -Ofast, as a program built with
   -Ofast or -ffast-math compiles it (issue 29). tests/dropin.mk links this file (compiled with the
   usual flags, so the expectations below are IEEE) with tests/impl.c compiled by gcc -Ofast, and
   again by clang -Ofast, and links the program with -Ofast too, as that program would be (its
   startup code then turns on flush-to-zero; no value here is subnormal: those follow the thread's
   floating-point environment, as documented).
   - MAX/MIN give NaN when any rank holds one: a threaded world of 3 ranks, the NaN on each rank
     in turn, float32 / float64 / float16 / bfloat16, at a size that runs recursive doubling and
     one that runs the ring (the reproduction: 1 instead of NaN in 2 of 3 placements);
   - MEAN divides (x / n, not x * (1/n), which rounds differently);
   - SUM keeps IEEE's -0 + -0 = -0 and 16-bit floats round to nearest even at each step. */
#include "distmesh.h"
#include "prelude.h"
#include "test_util.h"
#include <math.h>

static const dm_dtype k_floats[] = { DM_FLOAT32, DM_FLOAT64, DM_FLOAT16, DM_BFLOAT16 };
#define N_RANKS 3
#define SMALL 67                  /* 268 B of float32: recursive doubling */
#define LARGE 40001               /* 160 KB of float32: the ring */

static bool elem_is_nan(dm_dtype t, const unsigned char* p) {
    uint16_t h;
    uint32_t u;
    uint64_t v;
    switch (t) {
        case DM_FLOAT16: memcpy(&h, p, 2); return (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        case DM_BFLOAT16: memcpy(&h, p, 2); return (h & 0x7f80) == 0x7f80 && (h & 0x7f);
        case DM_FLOAT32: memcpy(&u, p, 4); return (u & 0x7fffffffu) > 0x7f800000u;
        default: memcpy(&v, p, 8); return (v & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
    }
}
/* A quiet NaN of dtype t (by its bits: this file may be compiled with anything). */
static void store_nan(dm_dtype t, unsigned char* p, bool negative) {
    uint16_t h = (uint16_t)((t == DM_FLOAT16 ? 0x7e00 : 0x7fc0) | (negative ? 0x8000 : 0));
    uint32_t u = 0x7fc00000u | (negative ? 0x80000000u : 0);
    uint64_t v = 0x7ff8000000000000ull | (negative ? 0x8000000000000000ull : 0);
    if (t == DM_FLOAT16 || t == DM_BFLOAT16) memcpy(p, &h, 2);
    else if (t == DM_FLOAT32) memcpy(p, &u, 4);
    else memcpy(p, &v, 8);
}

/* ---- MAX / MIN with a NaN on one rank ---- */
typedef struct nan_case { dm_dtype dtype; dm_reduce_op op; size_t count; int nan_rank; } nan_case;
/* Rank r's element i: finite and different on every rank (so a dropped NaN shows as a number),
   infinities now and then; the NaN rank holds NaN everywhere (a negative one every third). */
static void fill_nan_case(const nan_case* k, int r, unsigned char* buf) {
    size_t es = dm_dtype_size(k->dtype), i;
    for (i = 0; i < k->count; i++) {
        if (r == k->nan_rank) { store_nan(k->dtype, buf + i * es, i % 3 == 0); continue; }
        if (i % 17 == 5) store_float(k->dtype, buf + i * es, (r & 1) ? INFINITY : -INFINITY);
        else store_float(k->dtype, buf + i * es, (double)((int)(i % 23) - 11) + 0.25 * r);
    }
}
static int rank_nan(dm_collective* c, void* p) {
    const nan_case* k = (const nan_case*)p;
    size_t es = dm_dtype_size(k->dtype), i;
    unsigned char* buf = (unsigned char*)malloc(k->count * es);
    dm_status st;
    if (!buf) return DM_ERR_OUT_OF_MEMORY;
    fill_nan_case(k, dm_rank(c), buf);
    st = dm_all_reduce(c, NULL, buf, k->count, k->dtype, k->op);
    if (st != DM_OK) rank_fail(__LINE__, "rank %d: all_reduce: %s", dm_rank(c), dm_last_error(c));
    for (i = 0; st == DM_OK && i < k->count; i++)
        if (!elem_is_nan(k->dtype, buf + i * es)) {
            rank_fail(__LINE__, "%s %s of %zu, NaN on rank %d: rank %d element %zu is %g, not NaN",
                      dm_dtype_name(k->dtype), dm_reduce_op_name(k->op), k->count, k->nan_rank, dm_rank(c), i,
                      load_float(k->dtype, buf + i * es));
            break;
        }
    free(buf);
    return st;
}
static void reset_failures(void) { atomic_store(&g_failures, 0); g_first_failure[0] = 0; }
static void test_fastmath_max_min_nan_every_placement(void** state) {
    static const size_t counts[] = { SMALL, LARGE };
    dm_fake_desc d;
    size_t t, ci;
    int op, p;
    (void)state;
    memset(&d, 0, sizeof(d));
    d.world_size = N_RANKS;
    reset_failures();
    for (t = 0; t < sizeof(k_floats) / sizeof(k_floats[0]); t++)
        for (op = DM_MAX; op <= DM_MIN; op++)
            for (ci = 0; ci < 2; ci++)
                for (p = 0; p < N_RANKS; p++) {
                    nan_case k;
                    k.dtype = k_floats[t];
                    k.op = (dm_reduce_op)op;
                    k.count = counts[ci];
                    k.nan_rank = p;
                    assert_int_equal(dm_thread_world_run(&d, rank_nan, &k), DM_OK);
                }
    if (atomic_load(&g_failures)) fail_msg("%d failure(s), first: %s", atomic_load(&g_failures), g_first_failure);
}

/* Without NaN, MAX / MIN are the plain ones (infinities included). */
static int rank_max_plain(dm_collective* c, void* p) {
    float v[4] = { 1.0f, -2.0f, 0.5f, 0 };
    float want_max[4] = { 3.0f, 0.0f, INFINITY, 0 };
    int r = dm_rank(c), i;
    (void)p;
    v[0] += (float)r;            /* 1 2 3 */
    v[1] += (float)r;            /* -2 -1 0 */
    v[2] = r == 1 ? INFINITY : v[2];
    v[3] = (float)(r * 2);
    want_max[3] = 4.0f;
    if (dm_all_reduce(c, NULL, v, 4, DM_FLOAT32, DM_MAX) != DM_OK) { rank_fail(__LINE__, "%s", dm_last_error(c)); return 1; }
    for (i = 0; i < 4; i++)
        if (f32_bits(v[i]) != f32_bits(want_max[i])) rank_fail(__LINE__, "max element %d: %g, want %g", i, v[i], want_max[i]);
    return 0;
}
static void test_fastmath_max_without_nan(void** state) {
    dm_fake_desc d;
    (void)state;
    memset(&d, 0, sizeof(d));
    d.world_size = N_RANKS;
    reset_failures();
    assert_int_equal(dm_thread_world_run(&d, rank_max_plain, NULL), DM_OK);
    if (atomic_load(&g_failures)) fail_msg("%s", g_first_failure);
}

/* ---- MEAN divides ---- */
/* Sums that are exact (small integers), so only the division rounds: x / 3 in IEEE. Among them,
   several where x * (1/3) rounds to another value, which a reciprocal would give. */
static int rank_mean(dm_collective* c, void* p) {
    const dm_dtype* t = (const dm_dtype*)p;
    size_t es = dm_dtype_size(*t), i, n = 64;
    unsigned char buf[64 * 8], want[8];
    int r = dm_rank(c);
    for (i = 0; i < n; i++) store_float(*t, buf + i * es, (double)(i + 1 + (size_t)r * 7 + (r == 2)));
    if (dm_all_reduce(c, NULL, buf, n, *t, DM_MEAN) != DM_OK) { rank_fail(__LINE__, "%s", dm_last_error(c)); return 1; }
    for (i = 0; i < n; i++) {
        double sum = (double)(3 * i + 25);             /* (i+1) + (i+8) + (i+16): never a multiple of 3 */
        if (*t == DM_FLOAT64) { double q = sum / 3.0; memcpy(want, &q, 8); }
        else if (*t == DM_FLOAT32) { float q = (float)sum / 3.0f; memcpy(want, &q, 4); }
        else store_float(*t, want, (double)((float)sum / 3.0f));       /* in float32, then to 16 bits */
        if (memcmp(want, buf + i * es, es) != 0) {
            rank_fail(__LINE__, "%s mean element %zu: %.17g, want %.17g", dm_dtype_name(*t), i,
                      load_float(*t, buf + i * es), load_float(*t, want));
            return 1;
        }
    }
    return 0;
}
static void test_fastmath_mean_divides(void** state) {
    static const dm_dtype ts[] = { DM_FLOAT32, DM_FLOAT64, DM_BFLOAT16, DM_FLOAT16 };
    dm_fake_desc d;
    size_t i;
    int differ = 0;
    (void)state;
    /* the cases do tell x / 3 from x * (1/3) */
    for (i = 1; i <= 64; i++) {
        volatile float third = 1.0f / 3.0f, x = (float)(3 * (i - 1) + 25);
        if (x / 3.0f != x * third) differ++;
    }
    assert_true(differ > 0);
    memset(&d, 0, sizeof(d));
    d.world_size = N_RANKS;
    reset_failures();
    for (i = 0; i < sizeof(ts) / sizeof(ts[0]); i++)
        assert_int_equal(dm_thread_world_run(&d, rank_mean, (void*)&ts[i]), DM_OK);
    if (atomic_load(&g_failures)) fail_msg("%s", g_first_failure);
}

/* ---- signed zeros, 16-bit rounding ---- */
static void test_fastmath_sum_signed_zero_and_rounding(void** state) {
    float a[2], b[2];
    double x[1], y[1];
    uint16_t h[3], hs[3], bf[2], bs[2];
    (void)state;
    a[0] = b[0] = -0.0f;
    a[1] = 1.0f; b[1] = -1.0f;
    assert_int_equal(dm_reduce_local(DM_FLOAT32, DM_SUM, a, b, 2), DM_OK);
    assert_int_equal(f32_bits(a[0]), 0x80000000u);     /* -0 + -0 = -0 */
    assert_int_equal(f32_bits(a[1]), 0x00000000u);     /* 1 + -1 = +0 */
    x[0] = y[0] = -0.0;
    assert_int_equal(dm_reduce_local(DM_FLOAT64, DM_SUM, x, y, 1), DM_OK);
    assert_true(signbit(x[0]) && x[0] == 0);
    /* float16: -0 + -0 = -0; 1 + 2^-11 ties to even (1); 1+2^-10 + 2^-11 ties up to 1+2^-9 */
    h[0] = 0x8000; hs[0] = 0x8000;
    h[1] = 0x3c00; hs[1] = 0x1000;                     /* 1, 2^-11 */
    h[2] = 0x3c01; hs[2] = 0x1000;                     /* 1+2^-10, 2^-11 */
    assert_int_equal(dm_reduce_local(DM_FLOAT16, DM_SUM, h, hs, 3), DM_OK);
    assert_int_equal(h[0], 0x8000);
    assert_int_equal(h[1], 0x3c00);
    assert_int_equal(h[2], 0x3c02);
    assert_int_equal(f32_bits(dm_half_to_float(0x8000)), 0x80000000u);
    /* bfloat16: 1 + 2^-8 ties to even (1); 1+2^-7 + 2^-8 ties up to 1+2^-6 */
    bf[0] = 0x3f80; bs[0] = 0x3b80;
    bf[1] = 0x3f81; bs[1] = 0x3b80;
    assert_int_equal(dm_reduce_local(DM_BFLOAT16, DM_SUM, bf, bs, 2), DM_OK);
    assert_int_equal(bf[0], 0x3f80);
    assert_int_equal(bf[1], 0x3f82);
}

DM_TEST_MAIN(NULL, NULL,
    cmocka_unit_test(test_fastmath_max_min_nan_every_placement),
    cmocka_unit_test(test_fastmath_max_without_nan),
    cmocka_unit_test(test_fastmath_mean_divides),
    cmocka_unit_test(test_fastmath_sum_signed_zero_and_rounding))
