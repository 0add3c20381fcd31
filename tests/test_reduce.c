/* test_reduce: the reduction kernels (dm_reduce_local, dm_divide_local) for every dtype x op,
   and the float16 / bfloat16 conversions, against references written independently here:
   conversions by scaling to an integer and rounding with nearbyint (ties to even) in double,
   cross-checked with the compiler's _Float16 where it has one; kernels by scalar loops in
   64-bit integer / float arithmetic following distmesh.h's documented semantics (integers wrap,
   MEAN accumulates like SUM and truncates when divided, 16-bit floats accumulate in float32 and
   round to nearest even at each step, MAX/MIN return NaN when either operand is NaN). */
#include "distmesh.h"
#include "prelude.h"
#include "test_util.h"
#include <float.h>
#include <math.h>

/* ---- deterministic random numbers (splitmix64) ---- */
static uint64_t g_rng = 0x243f6a8885a308d3ull;
static uint64_t rnd(void) { return splitmix64(&g_rng); }
static double rnd_unit(void) { return (double)(rnd() >> 11) / 9007199254740992.0; } /* [0,1) */

static bool half_is_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }
static bool bf16_is_nan(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f); }

/* ---- conversions ---- */
static void test_half_to_float_exhaustive(void** state) {
    uint32_t h;
    (void)state;
    for (h = 0; h < 65536; h++) {
        float got = dm_half_to_float((uint16_t)h), want = ref_half_to_float((uint16_t)h);
        if (isnan(want)) { if (!isnan(got)) fail_msg("half 0x%04x: %g is not NaN", h, got); continue; }
        if (f32_bits(got) != f32_bits(want)) fail_msg("half 0x%04x -> %a, want %a", h, got, want);
    }
}

static void test_float_to_half_round_trips_every_half(void** state) {
    uint32_t h;
    (void)state;
    for (h = 0; h < 65536; h++) {
        if (half_is_nan((uint16_t)h)) {
            assert_true(half_is_nan(dm_float_to_half(ref_half_to_float((uint16_t)h))));
            continue;
        }
        if (dm_float_to_half(ref_half_to_float((uint16_t)h)) != h)
            fail_msg("half 0x%04x does not round-trip (got 0x%04x)", h,
                     dm_float_to_half(ref_half_to_float((uint16_t)h)));
    }
}

/* The exact midpoint between consecutive halves goes to the even one; a float ulp either side goes
   to the nearer one. Covers subnormals, the normal boundary and 65504 -> 65520 -> inf. */
static void test_float_to_half_ties_to_even(void** state) {
    uint32_t h;
    (void)state;
    for (h = 0; h < 0x7c00; h++) {
        int s;
        for (s = 0; s < 2; s++) {
            uint16_t lo = (uint16_t)(h | (s ? 0x8000 : 0)), hi = (uint16_t)((h + 1) | (s ? 0x8000 : 0));
            float mid = (float)(((double)ref_half_to_float(lo) + (double)ref_half_to_float(hi)) / 2);
            uint16_t even = (h & 1) ? hi : lo;
            if (isinf(ref_half_to_float(hi))) mid = s ? -65520.0f : 65520.0f;
            if (dm_float_to_half(mid) != even)
                fail_msg("midpoint %a of 0x%04x/0x%04x -> 0x%04x, want 0x%04x", mid, lo, hi,
                         dm_float_to_half(mid), even);
            if (dm_float_to_half(nextafterf(mid, 0.0f)) != lo) fail_msg("below midpoint %a", mid);
            if (dm_float_to_half(nextafterf(mid, s ? -INFINITY : INFINITY)) != hi) fail_msg("above midpoint %a", mid);
        }
    }
}

static void test_float_to_half_edges(void** state) {
    (void)state;
    assert_int_equal(dm_float_to_half(0.0f), 0x0000);
    assert_int_equal(dm_float_to_half(-0.0f), 0x8000);
    assert_int_equal(dm_float_to_half(1.0f), 0x3c00);
    assert_int_equal(dm_float_to_half(-2.0f), 0xc000);
    assert_int_equal(dm_float_to_half(65504.0f), 0x7bff);
    assert_int_equal(dm_float_to_half(65519.996f), 0x7bff);
    assert_int_equal(dm_float_to_half(65520.0f), 0x7c00);       /* tie: rounds to even = inf */
    assert_int_equal(dm_float_to_half(-65520.0f), 0xfc00);
    assert_int_equal(dm_float_to_half(1e10f), 0x7c00);
    assert_int_equal(dm_float_to_half(FLT_MAX), 0x7c00);
    assert_int_equal(dm_float_to_half(INFINITY), 0x7c00);
    assert_int_equal(dm_float_to_half(-INFINITY), 0xfc00);
    assert_int_equal(dm_float_to_half(ldexpf(1, -14)), 0x0400);  /* smallest normal */
    assert_int_equal(dm_float_to_half(ldexpf(1, -24)), 0x0001);  /* smallest subnormal */
    assert_int_equal(dm_float_to_half(ldexpf(1, -25)), 0x0000);  /* tie between 0 and 1: even */
    assert_int_equal(dm_float_to_half(nextafterf(ldexpf(1, -25), 1)), 0x0001);
    assert_int_equal(dm_float_to_half(ldexpf(3, -25)), 0x0002);  /* tie between 1 and 2: even */
    assert_int_equal(dm_float_to_half(ldexpf(1023, -24)), 0x03ff); /* largest subnormal */
    assert_int_equal(dm_float_to_half(-ldexpf(1, -26)), 0x8000);
    assert_int_equal(dm_float_to_half(FLT_MIN), 0x0000);
    assert_int_equal(dm_float_to_half(bits_f32(1)), 0x0000);     /* float subnormal */
    assert_int_equal(dm_float_to_half(1.0f + ldexpf(1, -11)), 0x3c00); /* tie: 1.0 is even */
    assert_int_equal(dm_float_to_half(1.0f + ldexpf(3, -11)), 0x3c02);
    assert_true(half_is_nan(dm_float_to_half(NAN)));
    assert_true(half_is_nan(dm_float_to_half(-NAN)));
    assert_true(half_is_nan(dm_float_to_half(bits_f32(0x7f800001u)))); /* signalling, low payload */
    assert_true(half_is_nan(dm_float_to_half(bits_f32(0xffc00000u))));
    assert_true(isnan(dm_half_to_float(0x7e00)));
    assert_true(isinf(dm_half_to_float(0x7c00)) && dm_half_to_float(0xfc00) < 0);
    assert_true(dm_half_to_float(0x0001) == ldexpf(1, -24));
}

static void test_float_to_half_random(void** state) {
    int i;
    (void)state;
    for (i = 0; i < 2000000; i++) {
        /* half the draws anywhere, half where halves live (|x| < 2^17) */
        uint32_t u = (uint32_t)rnd();
        float f = (i & 1) ? bits_f32(u) : bits_f32((u & 0x80000000u) | (0x32000000u + (u % 0x15800000u)));
        uint16_t got = dm_float_to_half(f), want = ref_float_to_half(f);
        if (isnan(f)) { assert_true(half_is_nan(got)); continue; }
        if (got != want) fail_msg("float %a (0x%08x) -> 0x%04x, want 0x%04x", f, f32_bits(f), got, want);
#if defined(__FLT16_MAX__)
        {
            __extension__ _Float16 hw = (_Float16)f;
            uint16_t hb;
            memcpy(&hb, &hw, 2);
            if (got != hb) fail_msg("float %a -> 0x%04x, _Float16 says 0x%04x", f, got, hb);
        }
#endif
    }
}

static void test_bfloat16_conversions(void** state) {
    uint32_t b;
    int i;
    (void)state;
    for (b = 0; b < 65536; b++) {
        float f = dm_bfloat16_to_float((uint16_t)b);
        if (f32_bits(f) != b << 16) fail_msg("bf16 0x%04x -> 0x%08x", b, f32_bits(f));
        if (bf16_is_nan((uint16_t)b)) assert_true(bf16_is_nan(dm_float_to_bfloat16(f)));
        else if (dm_float_to_bfloat16(f) != b) fail_msg("bf16 0x%04x does not round-trip", b);
        if ((b & 0x7fff) < 0x7f80 && (b & 0x7fff) != 0x7f7f) {        /* midpoint with the next */
            uint32_t mid = (b << 16) + 0x8000u;
            uint16_t even = (b & 1) ? (uint16_t)(b + 1) : (uint16_t)b;
            if (dm_float_to_bfloat16(bits_f32(mid)) != even) fail_msg("bf16 midpoint 0x%08x", mid);
            if (dm_float_to_bfloat16(bits_f32(mid - 1)) != b) fail_msg("bf16 below midpoint 0x%08x", mid);
            if (dm_float_to_bfloat16(bits_f32(mid + 1)) != (uint16_t)(b + 1)) fail_msg("bf16 above 0x%08x", mid);
        }
    }
    assert_int_equal(dm_float_to_bfloat16(1.0f), 0x3f80);
    assert_int_equal(dm_float_to_bfloat16(bits_f32(0x3f808000u)), 0x3f80);  /* tie -> even */
    assert_int_equal(dm_float_to_bfloat16(bits_f32(0x3f818000u)), 0x3f82);
    assert_int_equal(dm_float_to_bfloat16(FLT_MAX), 0x7f80);              /* rounds up to inf */
    assert_int_equal(dm_float_to_bfloat16(-FLT_MAX), 0xff80);
    assert_int_equal(dm_float_to_bfloat16(bits_f32(0x7f7f7fffu)), 0x7f7f);
    assert_int_equal(dm_float_to_bfloat16(INFINITY), 0x7f80);
    assert_int_equal(dm_float_to_bfloat16(-0.0f), 0x8000);
    assert_int_equal(dm_float_to_bfloat16(bits_f32(1)), 0x0000);          /* tiny subnormal */
    assert_int_equal(dm_float_to_bfloat16(bits_f32(0x00008000u)), 0x0000); /* tie -> even 0 */
    assert_int_equal(dm_float_to_bfloat16(bits_f32(0x00018000u)), 0x0002);
    /* NaN stays NaN, whatever its payload (a naive rounding add turns 0x7fffffff into inf or 0) */
    assert_true(bf16_is_nan(dm_float_to_bfloat16(bits_f32(0x7f800001u))));
    assert_true(bf16_is_nan(dm_float_to_bfloat16(bits_f32(0x7fffffffu))));
    assert_true(bf16_is_nan(dm_float_to_bfloat16(bits_f32(0xff800001u))));
    assert_true(bf16_is_nan(dm_float_to_bfloat16(NAN)));
    for (i = 0; i < 2000000; i++) {
        float f = bits_f32((uint32_t)rnd());
        uint16_t got = dm_float_to_bfloat16(f);
        if (isnan(f)) { assert_true(bf16_is_nan(got)); continue; }
        if (got != ref_float_to_bf16(f)) fail_msg("float %a -> bf16 0x%04x, want 0x%04x", f, got, ref_float_to_bf16(f));
    }
}

/* ---- kernels ---- */
/* Equal: same bits, or both NaN, or (MAX/MIN only) equal values (+0 vs -0 is unspecified). */
static bool elem_equal(dm_dtype t, dm_reduce_op op, const void* a, const void* b) {
    size_t n = dm_dtype_size(t);
    if (memcmp(a, b, n) == 0) return true;
    if (!is_float(t)) return false;
    if (isnan(load_float(t, a)) && isnan(load_float(t, b))) return true;
    return (op == DM_MAX || op == DM_MIN) && load_float(t, a) == load_float(t, b);
}
static void fill_random(dm_dtype t, void* buf, size_t count, bool specials) {
    size_t es = dm_dtype_size(t), i;
    unsigned char* p = (unsigned char*)buf;
    for (i = 0; i < count; i++) {
        if (!is_float(t)) { store_int(t, p + i * es, rnd()); continue; }
        if (specials && rnd() % 16 == 0) {
            static const double sp[] = { NAN, INFINITY, -INFINITY, 0.0, -0.0, 1e-30, 65504.0, 3.4e38 };
            store_float(t, p + i * es, sp[rnd() % 8]);
        } else {
            store_float(t, p + i * es, (rnd_unit() * 2 - 1) * ldexp(1.0, (int)(rnd() % 20) - 10));
        }
    }
}

static void test_reduce_local_every_dtype_op(void** state) {
    static const size_t counts[] = { 0, 1, 7, 255, 256, 257, 1000, 4099 };
    int t, op;
    size_t ci;
    (void)state;
    for (t = 0; t < DM_DTYPE_COUNT; t++) {
        size_t es = dm_dtype_size((dm_dtype)t);
        for (op = 0; op < DM_REDUCE_OP_COUNT; op++) {
            for (ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
                size_t n = counts[ci], i;
                unsigned char* dst = (unsigned char*)malloc(n * es + 1);
                unsigned char* src = (unsigned char*)malloc(n * es + 1);
                unsigned char* want = (unsigned char*)malloc(n * es + 1);
                fill_random((dm_dtype)t, dst, n, true);
                fill_random((dm_dtype)t, src, n, true);
                memcpy(want, dst, n * es);
                for (i = 0; i < n; i++) ref_step((dm_dtype)t, (dm_reduce_op)op, want + i * es, src + i * es);
                assert_int_equal(dm_reduce_local((dm_dtype)t, (dm_reduce_op)op, dst, src, n), DM_OK);
                for (i = 0; i < n; i++)
                    if (!elem_equal((dm_dtype)t, (dm_reduce_op)op, dst + i * es, want + i * es))
                        fail_msg("%s %s count %zu: element %zu: got %g want %g", dm_dtype_name((dm_dtype)t),
                                 dm_reduce_op_name((dm_reduce_op)op), n, i,
                                 is_float((dm_dtype)t) ? load_float((dm_dtype)t, dst + i * es) : (double)load_int((dm_dtype)t, dst + i * es),
                                 is_float((dm_dtype)t) ? load_float((dm_dtype)t, want + i * es) : (double)load_int((dm_dtype)t, want + i * es));
                free(dst); free(src); free(want);
            }
        }
    }
}

/* NaN on either side: MAX/MIN give NaN (torch.maximum), SUM/PROD/MEAN follow IEEE. */
static void test_reduce_local_nan(void** state) {
    static const dm_dtype fts[] = { DM_FLOAT16, DM_BFLOAT16, DM_FLOAT32, DM_FLOAT64 };
    size_t k;
    int op;
    (void)state;
    for (k = 0; k < 4; k++) {
        dm_dtype t = fts[k];
        for (op = 0; op < DM_REDUCE_OP_COUNT; op++) {
            unsigned char dst[4 * 8], src[4 * 8];
            size_t es = dm_dtype_size(t);
            /* pairs: (NaN, 1), (1, NaN), (NaN, NaN), (inf, -inf) */
            store_float(t, dst + 0 * es, NAN); store_float(t, src + 0 * es, 1.0);
            store_float(t, dst + 1 * es, 1.0); store_float(t, src + 1 * es, NAN);
            store_float(t, dst + 2 * es, NAN); store_float(t, src + 2 * es, NAN);
            store_float(t, dst + 3 * es, INFINITY); store_float(t, src + 3 * es, -INFINITY);
            assert_int_equal(dm_reduce_local(t, (dm_reduce_op)op, dst, src, 4), DM_OK);
            assert_true(isnan(load_float(t, dst + 0 * es)));
            assert_true(isnan(load_float(t, dst + 1 * es)));
            assert_true(isnan(load_float(t, dst + 2 * es)));
            if (op == DM_SUM || op == DM_MEAN) assert_true(isnan(load_float(t, dst + 3 * es)));
            if (op == DM_PROD) assert_true(load_float(t, dst + 3 * es) == -INFINITY);
            if (op == DM_MAX) assert_true(load_float(t, dst + 3 * es) == INFINITY);
            if (op == DM_MIN) assert_true(load_float(t, dst + 3 * es) == -INFINITY);
        }
    }
}

/* Long vectors, NaN in the middle: the vectorised loop must still propagate it. */
static void test_reduce_local_nan_in_long_vectors(void** state) {
    enum { N = 1027 };
    float a[N], b[N];
    double c[N], d[N];
    int i, op;
    (void)state;
    for (op = DM_MAX; op <= DM_MIN; op++) {
        for (i = 0; i < N; i++) { a[i] = (float)i; b[i] = (float)(N - i); c[i] = i; d[i] = N - i; }
        a[517] = NAN; b[518] = NAN; c[3] = NAN; d[1026] = NAN;
        assert_int_equal(dm_reduce_local(DM_FLOAT32, (dm_reduce_op)op, a, b, N), DM_OK);
        assert_int_equal(dm_reduce_local(DM_FLOAT64, (dm_reduce_op)op, c, d, N), DM_OK);
        for (i = 0; i < N; i++) {
            bool fnan = i == 517 || i == 518, dnan = i == 3 || i == 1026;
            if (fnan != (bool)isnan(a[i])) fail_msg("float32 %s element %d", dm_reduce_op_name((dm_reduce_op)op), i);
            if (dnan != (bool)isnan(c[i])) fail_msg("float64 %s element %d", dm_reduce_op_name((dm_reduce_op)op), i);
            if (!fnan) assert_true(a[i] == (op == DM_MAX ? fmaxf((float)i, (float)(N - i)) : fminf((float)i, (float)(N - i))));
        }
    }
}

/* 16-bit floats round at every step: 2048 + 1 in float16 is 2048 (tie to even), so summing
   eight 1s onto 2048 one step at a time stays 2048, unlike a float32 accumulation. */
static void test_reduce_local_16bit_rounds_each_step(void** state) {
    uint16_t acc = dm_float_to_half(2048.0f), one = dm_float_to_half(1.0f);
    uint16_t bacc = dm_float_to_bfloat16(256.0f), bone = dm_float_to_bfloat16(1.0f);
    int i;
    (void)state;
    for (i = 0; i < 8; i++) {
        assert_int_equal(dm_reduce_local(DM_FLOAT16, DM_SUM, &acc, &one, 1), DM_OK);
        assert_int_equal(dm_reduce_local(DM_BFLOAT16, DM_SUM, &bacc, &bone, 1), DM_OK);
    }
    assert_true(dm_half_to_float(acc) == 2048.0f);
    assert_true(dm_bfloat16_to_float(bacc) == 256.0f);
    /* the float16 ulp in [2048, 4096) is 2: 2048 + 3 = 2051 is a tie between 2050 and 2052 -> 2052 */
    {
        uint16_t three = dm_float_to_half(3.0f);
        acc = dm_float_to_half(2048.0f);
        assert_int_equal(dm_reduce_local(DM_FLOAT16, DM_SUM, &acc, &three, 1), DM_OK);
        assert_true(dm_half_to_float(acc) == 2052.0f);
    }
    /* overflow: 65504 + 65504 is inf in float16 */
    acc = dm_float_to_half(65504.0f);
    one = acc;
    assert_int_equal(dm_reduce_local(DM_FLOAT16, DM_SUM, &acc, &one, 1), DM_OK);
    assert_int_equal(acc, 0x7c00);
}

static void test_reduce_local_integer_wraps(void** state) {
    int8_t a8 = 127, b8 = 1;
    uint8_t u8 = 255, v8 = 2;
    int32_t a32 = INT32_MAX, b32 = 2;
    int64_t a64 = INT64_MIN, b64 = -1;
    uint64_t u64 = UINT64_MAX, v64 = UINT64_MAX;
    (void)state;
    assert_int_equal(dm_reduce_local(DM_INT8, DM_SUM, &a8, &b8, 1), DM_OK);
    assert_int_equal(a8, -128);
    assert_int_equal(dm_reduce_local(DM_UINT8, DM_SUM, &u8, &v8, 1), DM_OK);
    assert_int_equal(u8, 1);
    assert_int_equal(dm_reduce_local(DM_INT32, DM_PROD, &a32, &b32, 1), DM_OK);
    assert_int_equal(a32, -2);
    assert_int_equal(dm_reduce_local(DM_INT64, DM_PROD, &a64, &b64, 1), DM_OK);
    assert_true(a64 == INT64_MIN);
    assert_int_equal(dm_reduce_local(DM_UINT64, DM_MIN, &u64, &v64, 1), DM_OK);
    assert_true(u64 == UINT64_MAX);
    a8 = -5; b8 = 3;
    assert_int_equal(dm_reduce_local(DM_INT8, DM_MAX, &a8, &b8, 1), DM_OK);
    assert_int_equal(a8, 3);
    u8 = 200; v8 = 3;  /* unsigned compare: 200 > 3 */
    assert_int_equal(dm_reduce_local(DM_UINT8, DM_MIN, &u8, &v8, 1), DM_OK);
    assert_int_equal(u8, 3);
}

/* MEAN on integers truncates toward zero (C's '/', like ncclAvg): {1,2} -> 1, {-1,-2} -> -1. */
static void test_mean_integers_truncate(void** state) {
    int32_t x[4] = { 1, -1, 7, -7 }, y[4] = { 2, -2, 0, 0 };
    int8_t a[3] = { -128, 127, -3 };
    uint64_t u[2] = { UINT64_MAX, 5 };
    (void)state;
    assert_int_equal(dm_reduce_local(DM_INT32, DM_MEAN, x, y, 4), DM_OK);
    assert_int_equal(x[0], 3);
    assert_int_equal(dm_divide_local(DM_INT32, x, 4, 2), DM_OK);
    assert_int_equal(x[0], 1);
    assert_int_equal(x[1], -1);
    assert_int_equal(x[2], 3);
    assert_int_equal(x[3], -3);
    assert_int_equal(dm_divide_local(DM_INT8, a, 3, 2), DM_OK);
    assert_int_equal(a[0], -64);
    assert_int_equal(a[1], 63);
    assert_int_equal(a[2], -1);
    assert_int_equal(dm_divide_local(DM_UINT64, u, 2, 3), DM_OK);
    assert_true(u[0] == UINT64_MAX / 3 && u[1] == 1);
}

static void test_divide_local_every_dtype(void** state) {
    int t, d;
    (void)state;
    for (t = 0; t < DM_DTYPE_COUNT; t++) {
        size_t es = dm_dtype_size((dm_dtype)t), i, n = 300;
        for (d = 1; d <= 7; d++) {
            unsigned char* buf = (unsigned char*)malloc(n * es);
            unsigned char* want = (unsigned char*)malloc(n * es);
            fill_random((dm_dtype)t, buf, n, false);
            for (i = 0; i < n; i++) {
                unsigned char* w = want + i * es;
                const unsigned char* x = buf + i * es;
                if (t == DM_FLOAT64) store_float((dm_dtype)t, w, load_float((dm_dtype)t, x) / d);
                else if (is_float((dm_dtype)t)) store_float((dm_dtype)t, w, (float)load_float((dm_dtype)t, x) / (float)d);
                else if (is_signed_int((dm_dtype)t)) store_int((dm_dtype)t, w, (uint64_t)((int64_t)load_int((dm_dtype)t, x) / d));
                else store_int((dm_dtype)t, w, load_int((dm_dtype)t, x) / (uint64_t)d);
            }
            assert_int_equal(dm_divide_local((dm_dtype)t, buf, n, d), DM_OK);
            for (i = 0; i < n; i++)
                if (memcmp(buf + i * es, want + i * es, es) != 0)
                    fail_msg("%s / %d element %zu", dm_dtype_name((dm_dtype)t), d, i);
            free(buf); free(want);
        }
    }
}

static void test_kernels_reject_bad_arguments(void** state) {
    float a[2] = { 1, 2 }, b[2] = { 3, 4 };
    (void)state;
    assert_int_equal(dm_reduce_local((dm_dtype)99, DM_SUM, a, b, 2), DM_ERR_INVALID_ARG);
    assert_int_equal(dm_reduce_local((dm_dtype)-1, DM_SUM, a, b, 2), DM_ERR_INVALID_ARG);
    assert_int_equal(dm_reduce_local(DM_DTYPE_COUNT, DM_SUM, a, b, 2), DM_ERR_INVALID_ARG);
    assert_int_equal(dm_reduce_local(DM_FLOAT32, (dm_reduce_op)99, a, b, 2), DM_ERR_INVALID_ARG);
    assert_int_equal(dm_reduce_local(DM_FLOAT32, (dm_reduce_op)-1, a, b, 2), DM_ERR_INVALID_ARG);
    assert_int_equal(dm_reduce_local(DM_FLOAT32, DM_REDUCE_OP_COUNT, a, b, 2), DM_ERR_INVALID_ARG);
    assert_int_equal(dm_reduce_local(DM_FLOAT32, DM_SUM, NULL, b, 2), DM_ERR_INVALID_ARG);
    assert_int_equal(dm_reduce_local(DM_FLOAT32, DM_SUM, a, NULL, 2), DM_ERR_INVALID_ARG);
    assert_true(a[0] == 1 && a[1] == 2);
    assert_int_equal(dm_reduce_local(DM_FLOAT32, DM_SUM, a, b, 0), DM_OK);
    assert_int_equal(dm_divide_local(DM_FLOAT32, a, 2, 0), DM_ERR_INVALID_ARG);
    assert_int_equal(dm_divide_local(DM_FLOAT32, a, 2, -3), DM_ERR_INVALID_ARG);
    assert_int_equal(dm_divide_local((dm_dtype)99, a, 2, 2), DM_ERR_INVALID_ARG);
    assert_int_equal(dm_divide_local(DM_FLOAT32, NULL, 2, 2), DM_ERR_INVALID_ARG);
    assert_true(a[0] == 1 && a[1] == 2);
}

static void test_dtype_and_op_names(void** state) {
    static const char* names[] = { "int8", "uint8", "int32", "uint32", "int64", "uint64",
                                   "float16", "bfloat16", "float32", "float64" };
    static const size_t sizes[] = { 1, 1, 4, 4, 8, 8, 2, 2, 4, 8 };
    static const char* ops[] = { "sum", "prod", "max", "min", "mean" };
    int i;
    (void)state;
    assert_int_equal(DM_DTYPE_COUNT, 10);
    assert_int_equal(DM_REDUCE_OP_COUNT, 5);
    for (i = 0; i < DM_DTYPE_COUNT; i++) {
        assert_string_equal(dm_dtype_name((dm_dtype)i), names[i]);
        assert_int_equal(dm_dtype_size((dm_dtype)i), sizes[i]);
    }
    for (i = 0; i < DM_REDUCE_OP_COUNT; i++) assert_string_equal(dm_reduce_op_name((dm_reduce_op)i), ops[i]);
    assert_int_equal(dm_dtype_size((dm_dtype)99), 0);
    assert_int_equal(dm_dtype_size((dm_dtype)-1), 0);
    assert_string_equal(dm_dtype_name((dm_dtype)99), "invalid");
    assert_string_equal(dm_dtype_name((dm_dtype)-1), "invalid");
    assert_string_equal(dm_reduce_op_name((dm_reduce_op)99), "invalid");
    assert_string_equal(dm_reduce_op_name((dm_reduce_op)-1), "invalid");
}

DM_TEST_MAIN(NULL, NULL,
    cmocka_unit_test(test_half_to_float_exhaustive),
    cmocka_unit_test(test_float_to_half_round_trips_every_half),
    cmocka_unit_test(test_float_to_half_ties_to_even),
    cmocka_unit_test(test_float_to_half_edges),
    cmocka_unit_test(test_float_to_half_random),
    cmocka_unit_test(test_bfloat16_conversions),
    cmocka_unit_test(test_reduce_local_every_dtype_op),
    cmocka_unit_test(test_reduce_local_nan),
    cmocka_unit_test(test_reduce_local_nan_in_long_vectors),
    cmocka_unit_test(test_reduce_local_16bit_rounds_each_step),
    cmocka_unit_test(test_reduce_local_integer_wraps),
    cmocka_unit_test(test_mean_integers_truncate),
    cmocka_unit_test(test_divide_local_every_dtype),
    cmocka_unit_test(test_kernels_reject_bad_arguments),
    cmocka_unit_test(test_dtype_and_op_names))
