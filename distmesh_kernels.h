/* distmesh_kernels.h -- distmesh's kernels. MIT license at end of file.

   Do not include this file yourself: it is part of distmesh.h's implementation, which includes
   it first of its layers (distmesh.h >>layers). The public calls it defines are declared at
   distmesh.h >>functions status, >>functions hashing and >>functions compression.

   WHAT IT HOLDS  What runs over the bytes of one rank, with no other rank and no collective:
   SHA-256 and HMAC (the store's and the sealed records' hashing), the IEEE float semantics the
   reductions keep whatever the includer's flags, float16 / bfloat16 conversions, the reduction
   kernels (dm_reduce_local, dm_divide_local) and the compression kernels (error feedback, int8
   and bfloat16 codes).

   WHAT IT MAY CALL  distmesh.h alone (its types, memory, log, names). Every layer above calls
   these; nothing here calls up.

   SECTIONS  Each opens with a comment that starts ">>tag" (search for it); in file order:
       >>sha256                  SHA-256 and HMAC
       >>float semantics         IEEE semantics for what follows, whatever the includer's flags
       >>half                    float16 / bfloat16 conversions
       >>kernels                 dm_reduce_local, dm_divide_local
       >>compression kernels     the error-feedback state, int8 scales and codes, bfloat16 codes */
#ifndef DISTMESH_H
#error "distmesh_kernels.h is part of distmesh.h's implementation: include distmesh.h"
#endif

#if defined(DISTMESH_IMPL_INCLUDED) && !defined(DISTMESH_KERNELS_IMPL_INCLUDED)
#define DISTMESH_KERNELS_IMPL_INCLUDED
_DM_WARM_BEGIN
_DM_COLD_BEGIN
/* >>sha256  FIPS 180-4 section 6.2, written from the standard: 64-byte blocks, big-endian words. */
static const uint32_t _dm_sha256_k[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u, 0xab1c5ed5u,
    0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu, 0x9bdc06a7u, 0xc19bf174u,
    0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu, 0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau,
    0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u, 0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u,
    0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu, 0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u,
    0xa2bfe8a1u, 0xa81a664bu, 0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u,
    0x19a4c116u, 0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u, 0xc67178f2u
};
#define _DM_ROTR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))
_DM_PRIVATE void _dm_sha256_block(uint32_t h[8], const unsigned char* p) {
    uint32_t w[64], a, b, c, d, e, f, g, hh, t1, t2;
    int i;
    for (i = 0; i < 16; i++)
        w[i] = ((uint32_t)p[4 * i] << 24) | ((uint32_t)p[4 * i + 1] << 16) | ((uint32_t)p[4 * i + 2] << 8) |
               (uint32_t)p[4 * i + 3];
    for (i = 16; i < 64; i++) {
        uint32_t s0 = _DM_ROTR(w[i - 15], 7) ^ _DM_ROTR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = _DM_ROTR(w[i - 2], 17) ^ _DM_ROTR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    a = h[0]; b = h[1]; c = h[2]; d = h[3]; e = h[4]; f = h[5]; g = h[6]; hh = h[7];
    for (i = 0; i < 64; i++) {
        t1 = hh + (_DM_ROTR(e, 6) ^ _DM_ROTR(e, 11) ^ _DM_ROTR(e, 25)) + ((e & f) ^ (~e & g)) + _dm_sha256_k[i] + w[i];
        t2 = (_DM_ROTR(a, 2) ^ _DM_ROTR(a, 13) ^ _DM_ROTR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        hh = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
}
#undef _DM_ROTR
DM_API_IMPL void dm_sha256_init(dm_sha256_ctx* ctx) {
    static const uint32_t h0[8] = { 0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au,
                                    0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u };
    memcpy(ctx->h, h0, sizeof(h0));
    ctx->bytes = 0;
    ctx->used = 0;
}
DM_API_IMPL void dm_sha256_update(dm_sha256_ctx* ctx, const void* data, size_t size) {
    const unsigned char* p = (const unsigned char*)data;
    if (!size) return;                          /* data may be NULL then */
    ctx->bytes += size;
    if (ctx->used) {
        size_t take = 64 - ctx->used < size ? 64 - ctx->used : size;
        memcpy(ctx->buf + ctx->used, p, take);
        ctx->used += take;
        p += take;
        size -= take;
        if (ctx->used < 64) return;
        _dm_sha256_block(ctx->h, ctx->buf);
        ctx->used = 0;
    }
    for (; size >= 64; p += 64, size -= 64) _dm_sha256_block(ctx->h, p);
    if (size) memcpy(ctx->buf, p, size);
    ctx->used = size;
}
DM_API_IMPL void dm_sha256_final(dm_sha256_ctx* ctx, unsigned char out[32]) {
    uint64_t bits = ctx->bytes * 8;
    int i;
    ctx->buf[ctx->used++] = 0x80;              /* the 1 bit, then zeros, then the 64-bit length */
    if (ctx->used > 56) {
        memset(ctx->buf + ctx->used, 0, 64 - ctx->used);
        _dm_sha256_block(ctx->h, ctx->buf);
        ctx->used = 0;
    }
    memset(ctx->buf + ctx->used, 0, 56 - ctx->used);
    for (i = 0; i < 8; i++) ctx->buf[56 + i] = (unsigned char)(bits >> (56 - 8 * i));
    _dm_sha256_block(ctx->h, ctx->buf);
    for (i = 0; i < 8; i++) {
        out[4 * i] = (unsigned char)(ctx->h[i] >> 24);
        out[4 * i + 1] = (unsigned char)(ctx->h[i] >> 16);
        out[4 * i + 2] = (unsigned char)(ctx->h[i] >> 8);
        out[4 * i + 3] = (unsigned char)ctx->h[i];
    }
    memset(ctx, 0, sizeof(*ctx));
}
DM_API_IMPL void dm_sha256(const void* data, size_t size, unsigned char out[32]) {
    dm_sha256_ctx c;
    dm_sha256_init(&c);
    dm_sha256_update(&c, data, size);
    dm_sha256_final(&c, out);
}
/* RFC 2104: H((K ^ opad) || H((K ^ ipad) || msg)), K zero-padded to the 64-byte block. */
DM_API_IMPL void dm_hmac_sha256(const void* key, size_t key_size, const void* msg, size_t msg_size,
                                unsigned char out[32]) {
    unsigned char k[64], pad[64], inner[32];
    dm_sha256_ctx c;
    int i;
    memset(k, 0, sizeof(k));
    if (key_size > 64) dm_sha256(key, key_size, k);
    else if (key_size) memcpy(k, key, key_size);
    for (i = 0; i < 64; i++) pad[i] = (unsigned char)(k[i] ^ 0x36);
    dm_sha256_init(&c);
    dm_sha256_update(&c, pad, 64);
    dm_sha256_update(&c, msg, msg_size);
    dm_sha256_final(&c, inner);
    for (i = 0; i < 64; i++) pad[i] = (unsigned char)(k[i] ^ 0x5c);
    dm_sha256_init(&c);
    dm_sha256_update(&c, pad, 64);
    dm_sha256_update(&c, inner, 32);
    dm_sha256_final(&c, out);
    memset(k, 0, sizeof(k));
    memset(pad, 0, sizeof(pad));
}

_DM_COLD_END
/* >>float semantics  The conversions, the kernels and the division of MEAN keep the semantics
   documented at dm_reduce_op whatever the includer's flags: a program built with -Ofast or
   -ffast-math compiles the implementation with them, and they let the compiler assume no NaN
   (MAX/MIN lose it), turn x / n into x * (1/n) (MEAN rounds differently) and drop signed zeros.
   So this region asks for IEEE semantics (clang: float_control precise; gcc: no-fast-math), up to
   the pop after dm_divide_local. Tested by tests/fastmath.mk (gcc and clang, -Ofast).
   Subnormals follow the thread's floating-point environment: a program linked with -Ofast or
   -ffast-math starts with flush-to-zero on (x86's FTZ/DAZ), and then they flush here too, as they
   do in OpenMPI's and Gloo's reductions. */
_DM_WARM_END
#if defined(__clang__)
#pragma float_control(precise, on, push)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC optimize("no-fast-math")
#endif
/* gcc's -O2 cost model will not vectorise loops of unknown length; the loops over the data (the
   conversions, the kernels, MEAN's division and the compression kernels) are the hot path, so
   this region alone gets -O3 (scoped by push/pop, nothing leaks to the includer), one region so
   that its functions inline into each other (gcc does not inline across optimize attributes). */
#if defined(__GNUC__) && !defined(__clang__) && !defined(__OPTIMIZE_SIZE__) && defined(__OPTIMIZE__)
#define _DM_KERNELS_O3_BEGIN _Pragma("GCC push_options") _Pragma("GCC optimize(\"O3\")")
#define _DM_KERNELS_O3_END _Pragma("GCC pop_options")
#else
#define _DM_KERNELS_O3_BEGIN
#define _DM_KERNELS_O3_END
#endif
_DM_KERNELS_O3_BEGIN

/* >>half  float16 / bfloat16 <-> float32. Rounding is to nearest, ties to even, done with
   integer arithmetic on the bit patterns (no dependence on the FPU's rounding mode). */
_DM_PRIVATE uint32_t _dm_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
_DM_PRIVATE float _dm_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

DM_API_IMPL uint16_t dm_float_to_half(float f) {
    uint32_t x = _dm_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);           /* NaN -> quiet NaN */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);          /* >= 65520 -> inf */
    if (ax >= 0x38800000u) {                                           /* normal half */
        uint32_t mant_odd = (ax >> 13) & 1u;
        ax += 0xc8000000u + 0xfffu + mant_odd;    /* rebias exponent 127 -> 15, round to even */
        return (uint16_t)(sign | (ax >> 13));
    }
    if (ax < 0x33000000u) return sign;                                 /* < 2^-25 -> +-0 */
    {   /* subnormal half: shift the full mantissa, round to nearest even by hand */
        uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e;                 /* 14..24: half subnormal unit is 2^-24 */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
}
DM_API_IMPL float dm_half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return _dm_bits_f32(sign | 0x7f800000u | (m << 13));
    if (e != 0) return _dm_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
    {   /* zero or subnormal: m * 2^-24 is exact in float */
        float v = (float)m * 5.9604644775390625e-8f;
        return sign ? -v : v;               /* -0 stays -0: >>float semantics keeps signed zeros */
    }
}
DM_API_IMPL uint16_t dm_float_to_bfloat16(float f) {
    uint32_t x = _dm_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}
DM_API_IMPL float dm_bfloat16_to_float(uint16_t b) { return _dm_bits_f32((uint32_t)b << 16); }

/* >>kernels  dst = dst op src. One loop per dtype x op so the compiler vectorises each.
   Signed integers wrap: the arithmetic is done in the unsigned type of the same width (signed
   overflow would be undefined behaviour). MAX/MIN propagate NaN: (a >= b || a != a) ? a : b.
   dst and src must not overlap (callers reduce into an accumulator from a separate buffer). */
#define _DM_KERNEL_INT(name, T, U)                                                            \
    static void name(dm_reduce_op op, T* _DM_RESTRICT dst, const T* _DM_RESTRICT src, size_t n) {                       \
        size_t i;                                                                             \
        switch (op) {                                                                         \
            case DM_SUM: case DM_MEAN:                                                        \
                for (i = 0; i < n; i++) { dst[i] = (T)(U)((U)dst[i] + (U)src[i]); } break;        \
            case DM_PROD:                                                                     \
                for (i = 0; i < n; i++) { dst[i] = (T)(U)((U)dst[i] * (U)src[i]); } break;        \
            case DM_MAX:                                                                      \
                for (i = 0; i < n; i++) { dst[i] = dst[i] >= src[i] ? dst[i] : src[i]; } break;   \
            case DM_MIN:                                                                      \
                for (i = 0; i < n; i++) { dst[i] = dst[i] <= src[i] ? dst[i] : src[i]; } break;   \
            default: break;                                                                   \
        }                                                                                     \
    }
#define _DM_KERNEL_FLOAT(name, T)                                                             \
    static void name(dm_reduce_op op, T* _DM_RESTRICT dst, const T* _DM_RESTRICT src, size_t n) {                       \
        size_t i;                                                                             \
        switch (op) {                                                                         \
            case DM_SUM: case DM_MEAN: for (i = 0; i < n; i++) { dst[i] += src[i]; } break;       \
            case DM_PROD: for (i = 0; i < n; i++) { dst[i] *= src[i]; } break;                    \
            case DM_MAX:                                                                      \
                for (i = 0; i < n; i++) {                                                     \
                    T a = dst[i], b = src[i];                                                 \
                    dst[i] = (a >= b || a != a) ? a : b;                                      \
                }                                                                             \
                break;                                                                        \
            case DM_MIN:                                                                      \
                for (i = 0; i < n; i++) {                                                     \
                    T a = dst[i], b = src[i];                                                 \
                    dst[i] = (a <= b || a != a) ? a : b;                                      \
                }                                                                             \
                break;                                                                        \
            default: break;                                                                   \
        }                                                                                     \
    }
_DM_KERNEL_INT(_dm_reduce_i8, int8_t, uint8_t)
_DM_KERNEL_INT(_dm_reduce_u8, uint8_t, uint8_t)
_DM_KERNEL_INT(_dm_reduce_i32, int32_t, uint32_t)
_DM_KERNEL_INT(_dm_reduce_u32, uint32_t, uint32_t)
_DM_KERNEL_INT(_dm_reduce_i64, int64_t, uint64_t)
_DM_KERNEL_INT(_dm_reduce_u64, uint64_t, uint64_t)
_DM_KERNEL_FLOAT(_dm_reduce_f32, float)
_DM_KERNEL_FLOAT(_dm_reduce_f64, double)
#undef _DM_KERNEL_INT
#undef _DM_KERNEL_FLOAT

/* 16-bit floats: widen a block to float32, reduce there, round back once per step. */
static void _dm_reduce_16(dm_reduce_op op, uint16_t* dst, const uint16_t* src, size_t n, bool bf16) {
    float a[256], b[256];
    size_t done, i, m;
    for (done = 0; done < n; done += m) {
        m = n - done < 256 ? n - done : 256;
        if (bf16) {
            for (i = 0; i < m; i++) { a[i] = dm_bfloat16_to_float(dst[done + i]);
                                      b[i] = dm_bfloat16_to_float(src[done + i]); }
        } else {
            for (i = 0; i < m; i++) { a[i] = dm_half_to_float(dst[done + i]);
                                      b[i] = dm_half_to_float(src[done + i]); }
        }
        _dm_reduce_f32(op, a, b, m);
        if (bf16) for (i = 0; i < m; i++) dst[done + i] = dm_float_to_bfloat16(a[i]);
        else      for (i = 0; i < m; i++) dst[done + i] = dm_float_to_half(a[i]);
    }
}

DM_API_IMPL dm_status dm_reduce_local(dm_dtype dtype, dm_reduce_op op, void* dst, const void* src,
                                      size_t count) {
    if ((unsigned)dtype >= DM_DTYPE_COUNT || (unsigned)op >= DM_REDUCE_OP_COUNT)
        return DM_ERR_INVALID_ARG;
    if (count == 0) return DM_OK;
    if (!dst || !src) return DM_ERR_INVALID_ARG;
    switch (dtype) {
        case DM_INT8:     _dm_reduce_i8(op, (int8_t*)dst, (const int8_t*)src, count); break;
        case DM_UINT8:    _dm_reduce_u8(op, (uint8_t*)dst, (const uint8_t*)src, count); break;
        case DM_INT32:    _dm_reduce_i32(op, (int32_t*)dst, (const int32_t*)src, count); break;
        case DM_UINT32:   _dm_reduce_u32(op, (uint32_t*)dst, (const uint32_t*)src, count); break;
        case DM_INT64:    _dm_reduce_i64(op, (int64_t*)dst, (const int64_t*)src, count); break;
        case DM_UINT64:   _dm_reduce_u64(op, (uint64_t*)dst, (const uint64_t*)src, count); break;
        case DM_FLOAT16:  _dm_reduce_16(op, (uint16_t*)dst, (const uint16_t*)src, count, false); break;
        case DM_BFLOAT16: _dm_reduce_16(op, (uint16_t*)dst, (const uint16_t*)src, count, true); break;
        case DM_FLOAT32:  _dm_reduce_f32(op, (float*)dst, (const float*)src, count); break;
        case DM_FLOAT64:  _dm_reduce_f64(op, (double*)dst, (const double*)src, count); break;
        default: return DM_ERR_INVALID_ARG;
    }
    return DM_OK;
}

#define _DM_DIVIDE(T, buf, n, d) do { T* p_ = (T*)(buf); size_t i_;                          \
        for (i_ = 0; i_ < (n); i_++) p_[i_] = (T)(p_[i_] / (T)(d)); } while (0)
DM_API_IMPL dm_status dm_divide_local(dm_dtype dtype, void* buf, size_t count, int divisor) {
    size_t i;
    if ((unsigned)dtype >= DM_DTYPE_COUNT || divisor <= 0) return DM_ERR_INVALID_ARG;
    if (count == 0 || divisor == 1) return DM_OK;
    if (!buf) return DM_ERR_INVALID_ARG;
    switch (dtype) {
        case DM_INT8:    _DM_DIVIDE(int8_t, buf, count, divisor); break;
        case DM_UINT8:   _DM_DIVIDE(uint8_t, buf, count, divisor); break;
        case DM_INT32:   _DM_DIVIDE(int32_t, buf, count, divisor); break;
        case DM_UINT32:  _DM_DIVIDE(uint32_t, buf, count, divisor); break;
        case DM_INT64:   _DM_DIVIDE(int64_t, buf, count, divisor); break;
        case DM_UINT64:  _DM_DIVIDE(uint64_t, buf, count, divisor); break;
        case DM_FLOAT32: _DM_DIVIDE(float, buf, count, divisor); break;
        case DM_FLOAT64: _DM_DIVIDE(double, buf, count, divisor); break;
        case DM_FLOAT16: {
            uint16_t* p = (uint16_t*)buf;
            for (i = 0; i < count; i++) p[i] = dm_float_to_half(dm_half_to_float(p[i]) / (float)divisor);
            break;
        }
        case DM_BFLOAT16: {
            uint16_t* p = (uint16_t*)buf;
            for (i = 0; i < count; i++)
                p[i] = dm_float_to_bfloat16(dm_bfloat16_to_float(p[i]) / (float)divisor);
            break;
        }
        default: return DM_ERR_INVALID_ARG;
    }
    return DM_OK;
}
/* >>compression kernels  What the compressed all-reduce (dm_all_reduce_compressed, the
   schedule at >>compressed rails) computes on each rank: the error-feedback state, the dtype to
   float32 and back, the agreed int8 scales, encoding with the residual, summing and decoding.
   Inside >>float semantics: the rounding trick and the sums' order must survive -Ofast; -O3 as
   the reduction kernels (the loops over the data vectorise). */
struct dm_compress_state {
    size_t count;
    float* residual;            /* count floats: what compression dropped on this rank, in sum units */
};
DM_API_IMPL dm_status dm_compress_state_create(size_t count, dm_compress_state** out) {
    dm_compress_state* s;
    if (!out) return DM_ERR_INVALID_ARG;
    *out = NULL;
    if (count > SIZE_MAX / sizeof(float)) return DM_ERR_INVALID_ARG;
    s = (dm_compress_state*)calloc(1, sizeof(*s));
    if (!s) return DM_ERR_OUT_OF_MEMORY;
    s->count = count;
    s->residual = (float*)calloc(count ? count : 1, sizeof(float));
    if (!s->residual) { free(s); return DM_ERR_OUT_OF_MEMORY; }
    *out = s;
    return DM_OK;
}
DM_API_IMPL void dm_compress_state_destroy(dm_compress_state* s) {
    if (!s) return;
    free(s->residual);
    free(s);
}
DM_API_IMPL size_t dm_compress_state_count(const dm_compress_state* s) { return s ? s->count : 0; }
DM_API_IMPL float* dm_compress_state_residual(dm_compress_state* s) { return s ? s->residual : NULL; }
DM_API_IMPL const char* dm_compress_name(dm_compress mode) {
    static const char* names[DM_COMPRESS_COUNT] = { "default", "none", "bf16", "int8" };
    return (unsigned)mode < DM_COMPRESS_COUNT ? names[mode] : "unknown";
}
_DM_PRIVATE bool _dm_compressible_type(dm_dtype t) { return t == DM_FLOAT32 || t == DM_BFLOAT16 || t == DM_FLOAT16; }

/* n elements of dtype t (float32, bfloat16, float16) to float32, and back (round to nearest even). */
_DM_PRIVATE void _dm_cmp_to_float(dm_dtype t, const void* src, float* dst, size_t n) {
    const uint16_t* h = (const uint16_t*)src;
    size_t k;
    if (t == DM_FLOAT32) { memcpy(dst, src, n * sizeof(float)); return; }
    for (k = 0; k < n; k++) dst[k] = t == DM_BFLOAT16 ? dm_bfloat16_to_float(h[k]) : dm_half_to_float(h[k]);
}
_DM_PRIVATE void _dm_cmp_from_float(dm_dtype t, const float* src, void* dst, size_t n) {
    uint16_t* h = (uint16_t*)dst;
    size_t k;
    if (t == DM_FLOAT32) { memcpy(dst, src, n * sizeof(float)); return; }
    for (k = 0; k < n; k++) h[k] = t == DM_BFLOAT16 ? dm_float_to_bfloat16(src[k]) : dm_float_to_half(src[k]);
}
/* Adds the residual of elements [from, to) into buf (dtype t) and clears it there: the part of
   the error feedback that does not meet this rank's compressed block. */
_DM_PRIVATE void _dm_cmp_flush(dm_compress_state* s, void* buf, dm_dtype t, size_t from, size_t to) {
    size_t es = dm_dtype_size(t), k, n;
    float tmp[256];
    for (k = from; k < to; k += n) {
        size_t j;
        bool any = false;
        n = to - k < 256 ? to - k : 256;
        for (j = 0; j < n && !any; j++) any = s->residual[k + j] != 0.0f;
        if (!any) continue;
        _dm_cmp_to_float(t, (unsigned char*)buf + k * es, tmp, n);
        for (j = 0; j < n; j++) { tmp[j] += s->residual[k + j]; s->residual[k + j] = 0.0f; }
        _dm_cmp_from_float(t, tmp, (unsigned char*)buf + k * es, n);
    }
}
/* int8: the largest magnitude of each block of DM_COMPRESS_BLOCK elements (+inf where one is not
   finite); the hosts then agree the maximum of each (MAX is exact in any order). On the bits: a
   float's magnitude orders as its bits without the sign, and inf and NaN are the largest, so
   an unsigned max (which vectorises) finds both. */
_DM_PRIVATE void _dm_cmp_maxima(const float* v, size_t n, float* m) {
    size_t b, k, nb = (n + DM_COMPRESS_BLOCK - 1) / DM_COMPRESS_BLOCK;
    for (b = 0; b < nb; b++) {
        size_t end = (b + 1) * DM_COMPRESS_BLOCK < n ? (b + 1) * DM_COMPRESS_BLOCK : n;
        uint32_t mx = 0, u;
        for (k = b * DM_COMPRESS_BLOCK; k < end; k++) {
            memcpy(&u, &v[k], sizeof(u));
            u &= 0x7fffffffu;
            mx = u > mx ? u : mx;
        }
        if (mx >= 0x7f800000u) m[b] = INFINITY;
        else memcpy(&m[b], &mx, sizeof(mx));
    }
}
/* Round to nearest even for |x| < 2^22, in the default rounding mode: adding and taking away
   1.5 x 2^23 leaves no fraction bits (vectorises, no libm). */
_DM_PRIVATE float _dm_cmp_rint(float x) { return (x + 12582912.0f) - 12582912.0f; }
/* int8 codes of v against the agreed maxima m: q = round(v * 127 / m) (|q| <= 127 since |v| <=
   m), 0 in a block whose maximum is 0 or not finite. res (or NULL) gets what was dropped, v - q
   x m / 127, the residual the next call adds back (0 where the block is not finite). */
_DM_PRIVATE void _dm_cmp_int8_encode(const float* _DM_RESTRICT v, size_t n, const float* m, int8_t* _DM_RESTRICT q,
                                     float* _DM_RESTRICT res) {
    size_t b, k, nb = (n + DM_COMPRESS_BLOCK - 1) / DM_COMPRESS_BLOCK;
    for (b = 0; b < nb; b++) {
        size_t lo = b * DM_COMPRESS_BLOCK, end = lo + DM_COMPRESS_BLOCK < n ? lo + DM_COMPRESS_BLOCK : n;
        float mb = m[b], inv = mb > 0.0f && mb <= FLT_MAX ? 127.0f / mb : 0.0f, sc = mb / 127.0f;
        for (k = lo; k < end; k++) {
            int c = (int)_dm_cmp_rint(v[k] * inv);
            c = c > 127 ? 127 : c < -127 ? -127 : c;
            q[k] = (int8_t)c;
        }
        if (!res) continue;
        if (mb <= FLT_MAX)
            for (k = lo; k < end; k++) res[k] = v[k] - (float)q[k] * sc;
        else
            for (k = lo; k < end; k++) res[k] = 0.0f;
    }
}
/* The sums of codes back to values: s x m / 127, NaN in a block whose maximum is not finite.
   sum(k) is element k's sum of codes. */
#define _DM_CMP_INT8_DECODE(n, m, out, sum)                                                          \
    do {                                                                                             \
        size_t b_, k_, nb_ = ((n) + DM_COMPRESS_BLOCK - 1) / DM_COMPRESS_BLOCK;                      \
        for (b_ = 0; b_ < nb_; b_++) {                                                               \
            size_t lo_ = b_ * DM_COMPRESS_BLOCK, end_ = lo_ + DM_COMPRESS_BLOCK < (n) ? lo_ + DM_COMPRESS_BLOCK : (n); \
            float mb_ = (m)[b_], sc_ = mb_ <= FLT_MAX ? mb_ / 127.0f : NAN;                          \
            for (k_ = lo_; k_ < end_; k_++) (out)[k_] = (float)(sum(k_)) * sc_;                      \
        }                                                                                            \
    } while (0)
/* bfloat16 codes of v; res (or NULL) gets v - bfloat16(v) (0 where v is not finite). */
_DM_PRIVATE void _dm_cmp_bf16_encode(const float* v, size_t n, uint16_t* q, float* res) {
    size_t k;
    for (k = 0; k < n; k++) {
        q[k] = dm_float_to_bfloat16(v[k]);
        if (res) res[k] = fabsf(v[k]) <= FLT_MAX ? v[k] - dm_bfloat16_to_float(q[k]) : 0.0f;
    }
}

/* v += res (the error feedback), and MEAN's divide. */
_DM_PRIVATE void _dm_cmp_add(float* v, const float* res, size_t n) {
    size_t k;
    for (k = 0; k < n; k++) v[k] += res[k];
}
_DM_PRIVATE void _dm_cmp_divide(float* v, size_t n, int divide) {
    size_t k;
    for (k = 0; k < n; k++) v[k] /= (float)divide;
}
/* H hosts' gathered codes (host h's at all + h x len codes) summed into v in host order: int8
   exactly as integers (H <= 3 here, one loop each so it vectorises) and decoded against the
   agreed maxima m. */
_DM_PRIVATE void _dm_cmp_sum_gathered(dm_compress mode, const unsigned char* _DM_RESTRICT all, int H, size_t len,
                                      const float* m, float* _DM_RESTRICT v) {
    size_t k;
    int h;
    if (mode == DM_COMPRESS_INT8) {
        const int8_t *q0 = (const int8_t*)all, *q1 = q0 + len, *q2 = q1 + len;
#define _DM_CMP_SUM2(k) ((int32_t)q0[k] + q1[k])
#define _DM_CMP_SUM3(k) ((int32_t)q0[k] + q1[k] + q2[k])
        if (H == 2) _DM_CMP_INT8_DECODE(len, m, v, _DM_CMP_SUM2);
        else _DM_CMP_INT8_DECODE(len, m, v, _DM_CMP_SUM3);
#undef _DM_CMP_SUM2
#undef _DM_CMP_SUM3
    } else {
        const uint16_t* q = (const uint16_t*)all;
        for (k = 0; k < len; k++) v[k] = dm_bfloat16_to_float(q[k]);
        for (h = 1; h < H; h++)
            for (k = 0; k < len; k++) v[k] += dm_bfloat16_to_float(q[(size_t)h * len + k]);
    }
}
/* An owner's chunk (n elements): H hosts' codes of it (host h's at in + h x cmax codes) summed in
   host order into sums (2 bytes each): int8 exactly as int16; bf16 in float32, rounded to
   bfloat16 once, the rounding's error added to res (or NULL) where finite. */
_DM_PRIVATE void _dm_cmp_owner_sum(dm_compress mode, const unsigned char* in, int H, size_t cmax, size_t n,
                                   unsigned char* sums, float* res) {
    size_t k;
    int h;
    if (mode == DM_COMPRESS_INT8) {
        const int8_t* q = (const int8_t*)in;
        int16_t* out = (int16_t*)(void*)sums;
        for (k = 0; k < n; k++) {
            int32_t sum = 0;
            for (h = 0; h < H; h++) sum += q[(size_t)h * cmax + k];
            out[k] = (int16_t)sum;
        }
    } else {
        const uint16_t* q = (const uint16_t*)(const void*)in;
        uint16_t* out = (uint16_t*)(void*)sums;
        for (k = 0; k < n; k++) {
            float sum = 0.0f;
            for (h = 0; h < H; h++) sum += dm_bfloat16_to_float(q[(size_t)h * cmax + k]);
            out[k] = dm_float_to_bfloat16(sum);
            if (res && fabsf(sum) <= FLT_MAX) res[k] += sum - dm_bfloat16_to_float(out[k]);
        }
    }
}
/* The owners' sums (2 bytes an element, len) decoded into v. */
_DM_PRIVATE void _dm_cmp_decode_sums(dm_compress mode, const unsigned char* sums, size_t len, const float* m, float* v) {
    size_t k;
    if (mode == DM_COMPRESS_INT8) {
        const int16_t* q = (const int16_t*)(const void*)sums;
#define _DM_CMP_SUMS(k) q[k]
        _DM_CMP_INT8_DECODE(len, m, v, _DM_CMP_SUMS);
#undef _DM_CMP_SUMS
    } else {
        for (k = 0; k < len; k++) v[k] = dm_bfloat16_to_float(((const uint16_t*)(const void*)sums)[k]);
    }
}
_DM_KERNELS_O3_END
#undef _DM_DIVIDE
#if defined(__clang__)
#pragma float_control(pop)
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
#endif /* DISTMESH_IMPL_INCLUDED && !DISTMESH_KERNELS_IMPL_INCLUDED */

/*
------------------------------------------------------------------------------------------------
MIT License

Copyright (c) 2026 the distmesh authors

Permission is hereby granted, free of charge, to any person obtaining a copy of this software and
associated documentation files (the "Software"), to deal in the Software without restriction,
including without limitation the rights to use, copy, modify, merge, publish, distribute,
sublicense, and/or sell copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all copies or
substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT
NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM,
DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT
OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
------------------------------------------------------------------------------------------------
*/
