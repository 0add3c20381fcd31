/* Helpers shared by the core tests: reference float16/bfloat16 conversions written
   independently of distmesh.h (scale, round with nearbyint in double: ties to even), element
   load/store for every dtype, one reference reduction step with the documented semantics, and
   a recorder for failures seen on rank threads (cmocka's asserts must stay on the main thread).
   Everything is static: each test program includes this once. */
#ifndef DM_TEST_UTIL_H
#define DM_TEST_UTIL_H
#include "distmesh.h"
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-variable"
#endif

/* ---- reference conversions ---- */
static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* ---- reference conversions ---- */
static float ref_half_to_float(uint16_t h) {
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v;
    if (e == 0x1f) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp((double)m, -24);
    else v = ldexp((double)(1024 + m), e - 25);
    return (float)((h & 0x8000) ? -v : v);
}
/* v rounded to mant_bits explicit mantissa bits, exponent floor emin (subnormals), ties to even. */
static double ref_round(double v, int mant_bits, int emin) {
    int e;
    double ulp;
    if (v == 0 || isinf(v) || isnan(v)) return v;
    e = ilogb(v);
    if (e < emin) e = emin;
    ulp = ldexp(1.0, e - mant_bits);
    return nearbyint(v / ulp) * ulp; /* the default rounding mode: to nearest, ties to even */
}
static uint16_t ref_float_to_half(float f) {
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    double a;
    int e;
    if (isnan(f)) return (uint16_t)(sign | 0x7e00);
    a = fabs(ref_round((double)f, 10, -14));
    if (a >= 65536.0) return (uint16_t)(sign | 0x7c00);         /* includes inf */
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

/* ---- test data ---- */
/* splitmix64: the next of the sequence whose state is *s. */
static uint64_t splitmix64(uint64_t* s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* buf[i] = v in dtype t (v small: exact in every dtype). */
static void set_val(dm_dtype t, void* buf, size_t i, int v) {
    switch (t) {
        case DM_INT8: ((int8_t*)buf)[i] = (int8_t)v; break;
        case DM_UINT8: ((uint8_t*)buf)[i] = (uint8_t)v; break;
        case DM_INT32: ((int32_t*)buf)[i] = v; break;
        case DM_UINT32: ((uint32_t*)buf)[i] = (uint32_t)v; break;
        case DM_INT64: ((int64_t*)buf)[i] = v; break;
        case DM_UINT64: ((uint64_t*)buf)[i] = (uint64_t)v; break;
        case DM_FLOAT16: ((uint16_t*)buf)[i] = dm_float_to_half((float)v); break;
        case DM_BFLOAT16: ((uint16_t*)buf)[i] = dm_float_to_bfloat16((float)v); break;
        case DM_FLOAT32: ((float*)buf)[i] = (float)v; break;
        case DM_FLOAT64: ((double*)buf)[i] = (double)v; break;
        default: break;
    }
}
static bool is_unsigned(dm_dtype t) { return t == DM_UINT8 || t == DM_UINT32 || t == DM_UINT64; }
/* Rank r's element i of a reduction case: small integers, non-negative for unsigned types, so
   every order of reduction gives the same bits. */
static int gen(dm_dtype t, dm_reduce_op op, int r, size_t i, int salt) {
    unsigned h = (unsigned)(r * 131 + (int)(i % 100003) * 7 + salt * 17);
    if (op == DM_PROD) return is_unsigned(t) ? (int)(h % 3) : (int)(h % 5) - 2;
    return is_unsigned(t) ? (int)(h % 5) : (int)(h % 9) - 4;
}

/* ---- elements ---- */
static bool is_signed_int(dm_dtype t) { return t == DM_INT8 || t == DM_INT32 || t == DM_INT64; }
static bool is_float(dm_dtype t) { return t >= DM_FLOAT16; }

/* Integer element as int64 (signed types) or uint64 (unsigned), stored in a uint64. */
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
static void store_int(dm_dtype t, void* p, uint64_t v) { /* low bits: wraps like unsigned math */
    size_t n = dm_dtype_size(t);
    uint8_t b[8];
    size_t i;
    for (i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    memcpy(p, b, n); /* little-endian host (x86-64, aarch64) */
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
/* a op b for floating values; a NaN on either side wins max and min. */
static double ref_float_op(dm_reduce_op op, double a, double b) {
    switch (op) {
        case DM_SUM: case DM_MEAN: return a + b;
        case DM_PROD: return a * b;
        case DM_MAX: return (isnan(a) || isnan(b)) ? NAN : (a > b ? a : b);
        default: return (isnan(a) || isnan(b)) ? NAN : (a < b ? a : b);
    }
}
/* One step acc = acc op x, the documented semantics. Arithmetic of float16/bfloat16/float32 is
   done in float (each result rounded to float first), float64 in double. */
static void ref_step(dm_dtype t, dm_reduce_op op, void* acc, const void* x) {
    if (!is_float(t)) {
        uint64_t a = load_int(t, acc), b = load_int(t, x), r;
        bool gt = is_signed_int(t) ? (int64_t)a > (int64_t)b : a > b;
        switch (op) {
            case DM_SUM: case DM_MEAN: r = a + b; break;
            case DM_PROD: r = a * b; break;
            case DM_MAX: r = gt ? a : b; break;
            default: r = gt ? b : a; break;
        }
        store_int(t, acc, r);
    } else if (t == DM_FLOAT64) {
        store_float(t, acc, ref_float_op(op, load_float(t, acc), load_float(t, x)));
    } else {    /* one + or * in double rounded to float is float's own (53 >= 2 * 24 + 2 bits) */
        float a = (float)load_float(t, acc), b = (float)load_float(t, x);
        store_float(t, acc, (float)ref_float_op(op, a, b));
    }
}
/* DM_MEAN's last step: acc / n, in acc's own arithmetic (integers truncate); other ops: nothing. */
static void ref_finish(dm_dtype t, dm_reduce_op op, void* acc, int n) {
    if (op != DM_MEAN) return;
    if (t == DM_FLOAT64) store_float(t, acc, load_float(t, acc) / n);
    else if (is_float(t)) store_float(t, acc, (float)load_float(t, acc) / (float)n);
    else if (is_signed_int(t)) store_int(t, acc, (uint64_t)((int64_t)load_int(t, acc) / n));
    else store_int(t, acc, load_int(t, acc) / (uint64_t)n);
}

/* ---- the documented reduction orders (distmesh.h, "Reduction order"); v[r] is rank r's value ---- */
/* Ring (all_reduce above 64 KiB, reduce_scatter): block b is folded starting at rank b+1, in
   ring order, ending with rank b. */
static void ref_order_ring(dm_dtype t, dm_reduce_op op, const unsigned char* v, size_t es, int n, int b, void* out) {
    int k;
    memcpy(out, v + (size_t)((b + 1) % n) * es, es);
    for (k = 2; k <= n; k++) ref_step(t, op, out, v + (size_t)((b + k) % n) * es);
}
/* Recursive doubling (all_reduce up to 64 KiB): with p the largest power of two <= n and
   rem = n - p, rank 2i+1 first takes v[2i+1] op v[2i] for i < rem; the p survivors (in rank
   order) then combine pairwise at distances 1, 2, 4, ... */
static void ref_order_rd(dm_dtype t, dm_reduce_op op, const unsigned char* v, size_t es, int n, void* out) {
    unsigned char w[64][8], nw[64][8];
    int p = 1, rem, i, mask;
    while (p * 2 <= n) p *= 2;
    rem = n - p;
    for (i = 0; i < p; i++) {
        if (i < rem) {
            memcpy(w[i], v + (size_t)(2 * i + 1) * es, es);
            ref_step(t, op, w[i], v + (size_t)(2 * i) * es);
        } else {
            memcpy(w[i], v + (size_t)(i + rem) * es, es);
        }
    }
    for (mask = 1; mask < p; mask <<= 1) {
        for (i = 0; i < p; i++) {
            memcpy(nw[i], w[i], es);
            ref_step(t, op, nw[i], w[i ^ mask]);
        }
        memcpy(w, nw, sizeof(w));
    }
    memcpy(out, w[0], es);
}
/* Which schedule all_reduce runs: recursive doubling for small messages, else the ring. */
static bool ref_all_reduce_is_rd(size_t count, size_t es, int n) { return count * es <= 65536 || count < (size_t)n; }
/* Ring block b of count elements in n parts: the first count % n blocks get one more. */
static void ref_block(size_t count, int n, int b, size_t* off, size_t* len) {
    size_t base = count / (size_t)n, extra = count % (size_t)n, bi = (size_t)b;
    *off = bi * base + (bi < extra ? bi : extra);
    *len = base + (bi < extra ? 1 : 0);
}

/* ---- a logger that keeps the last message: desc.logger.func = tu_capture_log ---- */
typedef struct tu_log {
    dm_log_level level;
    dm_status status;
    char msg[1024];
} tu_log;
static tu_log g_tu_log;
static void tu_capture_log(dm_log_level level, dm_status status, const char* msg, const char* file, int line,
                           void* ud) {
    (void)file; (void)line; (void)ud;
    g_tu_log.level = level;
    g_tu_log.status = status;
    snprintf(g_tu_log.msg, sizeof(g_tu_log.msg), "%s", msg);
}

/* ---- failures on rank threads ---- */
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
#define RCHECK(cond) do { if (!(cond)) rank_fail(__LINE__, "rank check failed: %s", #cond); } while (0)
/* Records and returns from the rank function (a failed collective: the rest would hang). */

#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif /* DM_TEST_UTIL_H */
