/* The compressed all-reduce across hosts (distmesh.h >>functions compression, issue 38): int8
   and bf16 on the threaded world's simulated layouts and on forked ranks over shared memory
   and sockets (DISTMESH_TEST_HOST_ID). Every compressed call checks that all ranks hold the
   same bytes (an all_gather of the results) and that each element is within the documented
   bound of the exact sum, computed here in double from the inputs:
     int8: H x scale / 2, scale = the largest |host sum| of the element's block of DM_COMPRESS_BLOCK
           / 127 (where the blocks start depends on the segments the schedule cuts: the test
           takes the largest over the aligned blocks next to the element's, which hold any block
           of DM_COMPRESS_BLOCK elements around it);
     bf16: 2^-8 x (the sum of |host sums|, plus |the sum| from 3 hosts on);
   plus the output dtype's rounding. Then error feedback (the average over many calls converges
   to the exact sum with a state, not without), the state across dm_shrink and a split, the
   choice (exact on one host, under DISTMESH_ALGO=flat, with too few elements),
   DISTMESH_COMPRESS, refusals before anything is sent, mismatched modes, and training
   (examples/ddp_overlap.c --compress: the final loss against exact training's). */
#define _GNU_SOURCE
#include "test_tcp.h"

/* ---- data, layouts and the bound ----------------------------------------------------------- */
typedef struct clayout { const char* name; int world; int hosts[8]; } clayout;
static const clayout g_cl[] = {
    { "2x2", 4, { 0, 0, 1, 1 } },          { "3x2", 6, { 0, 0, 1, 1, 2, 2 } },
    { "4x1", 4, { 0, 1, 2, 3 } },          { "4x2", 8, { 0, 0, 1, 1, 2, 2, 3, 3 } },
    { "3+1", 4, { 0, 0, 0, 1 } },          { "interleaved 3+2", 5, { 1, 0, 1, 1, 0 } },
    { "1x4", 4, { 0, 0, 0, 0 } },
};
#define N_CL ((int)(sizeof(g_cl) / sizeof(g_cl[0])))

/* Rank r's element i. float32: fractions in [-1, 1] times a factor that changes every block, so
   blocks get different scales. bfloat16 / float16: multiples of 1/16 up to 2 in magnitude, so
   a host's sum (at most 4 ranks) is exact in the dtype whatever the order. */
static double cval(dm_dtype t, int r, size_t i) {
    uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(r * 40503u + 17u);
    h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    if (t == DM_FLOAT32) return ((double)(h % 2001) - 1000.0) / 1000.0 * (double)(1 + (i / 256) % 7);
    return ((double)(h % 65) - 32.0) / 16.0;
}
static void cfill(dm_dtype t, int r, void* buf, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) {
        double v = cval(t, r, i);
        if (t == DM_FLOAT32) ((float*)buf)[i] = (float)v;
        else if (t == DM_BFLOAT16) ((uint16_t*)buf)[i] = dm_float_to_bfloat16((float)v);
        else ((uint16_t*)buf)[i] = dm_float_to_half((float)v);
    }
}
static double cget(dm_dtype t, const void* buf, size_t i) {
    if (t == DM_FLOAT32) return ((const float*)buf)[i];
    if (t == DM_BFLOAT16) return dm_bfloat16_to_float(((const uint16_t*)buf)[i]);
    return dm_half_to_float(((const uint16_t*)buf)[i]);
}
static int cl_hosts(const clayout* l) {
    int r, H = 0;
    for (r = 0; r < l->world; r++) H = l->hosts[r] + 1 > H ? l->hosts[r] + 1 : H;
    return H;
}
static int cl_lmin(const clayout* l) {
    int h, r, n, m = 1 << 30, H = cl_hosts(l);
    for (h = 0; h < H; h++) {
        for (n = 0, r = 0; r < l->world; r++) n += l->hosts[r] == h;
        if (n < m) m = n;
    }
    return m;
}
/* Whether the call compresses on l (distmesh.h _dm_coll_compressed_runs). */
static bool cl_compresses(const clayout* l, size_t count) {
    int H = cl_hosts(l);
    return H >= 2 && count / (size_t)cl_lmin(l) >= (size_t)H;
}
/* The exact sum (sum) and the bound (bound) of every element, for mode on layout l. */
static void cl_expect(const clayout* l, dm_compress mode, dm_dtype t, dm_reduce_op op, size_t count, double* sum,
                      double* bound) {
    int H = cl_hosts(l), h, r;
    double* hs = (double*)calloc((size_t)H * count, sizeof(double));
    double out_eps = t == DM_FLOAT32 ? 1.2e-7 : t == DM_BFLOAT16 ? 1.0 / 256 : 1.0 / 2048;
    size_t i, j;
    assert_non_null(hs);
    for (r = 0; r < l->world; r++)
        for (i = 0; i < count; i++) hs[(size_t)l->hosts[r] * count + i] += cval(t, r, i);
    for (i = 0; i < count; i++) {
        double s = 0, a = 0;
        for (h = 0; h < H; h++) { s += hs[(size_t)h * count + i]; a += fabs(hs[(size_t)h * count + i]); }
        sum[i] = s;
        bound[i] = mode == DM_COMPRESS_BF16 ? (a + (H >= 3 ? fabs(s) : 0)) / 256.0 : 0;
    }
    if (mode == DM_COMPRESS_INT8) {             /* the largest |host sum| of any 256 elements holding i */
        size_t nb = (count + DM_COMPRESS_BLOCK - 1) / DM_COMPRESS_BLOCK, b;
        double* bm = (double*)calloc(nb, sizeof(double));
        assert_non_null(bm);
        for (h = 0; h < H; h++)
            for (j = 0; j < count; j++) bm[j / DM_COMPRESS_BLOCK] = fmax(bm[j / DM_COMPRESS_BLOCK], fabs(hs[(size_t)h * count + j]));
        for (i = 0; i < count; i++) {
            double m = bm[i / DM_COMPRESS_BLOCK];
            b = i / DM_COMPRESS_BLOCK;
            if (b > 0) m = fmax(m, bm[b - 1]);
            if (b + 1 < nb) m = fmax(m, bm[b + 1]);
            bound[i] = H * (m / 127.0) / 2.0;
        }
        free(bm);
    }
    for (i = 0; i < count; i++) {
        if (op == DM_MEAN) { sum[i] /= l->world; bound[i] /= l->world; }
        bound[i] = bound[i] * 1.001 + fabs(sum[i]) * out_eps + 1e-6 * (1 + fabs(sum[i]));
    }
    free(hs);
}

/* ---- one compressed call, checked ---------------------------------------------------------- */
typedef struct ccase {
    const clayout* l;
    dm_compress mode;
    dm_dtype t;
    dm_reduce_op op;
    size_t count;
    const double *sum, *bound;      /* cl_expect's, shared by the threaded world's ranks */
} ccase;

/* All ranks hold the same n bytes of buf: 0, or 1 after a line. */
static int same_everywhere(dm_collective* c, const void* buf, size_t n, const char* what) {
    int W = dm_world_size(c), r;
    unsigned char* all = (unsigned char*)malloc(n * (size_t)W);
    int bad = 0;
    if (!all || dm_all_gather(c, buf, all, n, DM_UINT8) != DM_OK) { free(all); return 1; }
    for (r = 1; r < W && !bad; r++)
        if (memcmp(all, all + (size_t)r * n, n) != 0) {
            fprintf(stderr, "%s: rank %d's result differs from rank 0's\n", what, r);
            bad = 1;
        }
    free(all);
    return bad;
}
/* Runs k's call on c and checks the algorithm, the bound and the bits: 0 or 1. */
static int ccase_run(dm_collective* c, const ccase* k, dm_compress_state* state) {
    size_t es = dm_dtype_size(k->t), i;
    void* buf = malloc(k->count * es + 1);
    char what[160];
    const char* want = !cl_compresses(k->l, k->count) ? NULL
                       : k->mode == DM_COMPRESS_INT8 ? "two_level_int8" : "two_level_bf16";
    int bad = 0;
    dm_status st;
    snprintf(what, sizeof(what), "layout %s, %s, %s, %s, count %zu, rank %d", k->l->name, dm_compress_name(k->mode),
             dm_dtype_name(k->t), dm_reduce_op_name(k->op), k->count, dm_rank(c));
    if (!buf) return 1;
    cfill(k->t, dm_rank(c), buf, k->count);
    st = dm_all_reduce_compressed(c, NULL, buf, k->count, k->t, k->op, k->mode, state);
    if (st != DM_OK) {
        fprintf(stderr, "%s: %s: %s\n", what, dm_status_name(st), dm_last_error(c));
        free(buf);
        return 1;
    }
    if (want ? strcmp(dm_last_algorithm(c), want) != 0 : strstr(dm_last_algorithm(c), "int8") || strstr(dm_last_algorithm(c), "bf16")) {
        fprintf(stderr, "%s: ran %s, expected %s\n", what, dm_last_algorithm(c), want ? want : "an exact algorithm");
        bad = 1;
    }
    for (i = 0; i < k->count && !bad; i++) {
        double got = cget(k->t, buf, i), err = fabs(got - k->sum[i]);
        double eps = k->t == DM_FLOAT32 ? 1e-5 : k->t == DM_BFLOAT16 ? 1.0 / 128 : 1.0 / 1024;
        double lim = want ? k->bound[i] : eps * (1 + fabs(k->sum[i]));
        if (!(err <= lim)) {
            fprintf(stderr, "%s: element %zu: %.9g, exact %.9g, error %.3g over the bound %.3g\n", what, i, got,
                    k->sum[i], err, lim);
            bad = 1;
        }
    }
    if (!bad) bad = same_everywhere(c, buf, k->count * es, what);
    free(buf);
    return bad;
}

/* ---- the threaded world: every layout, mode, dtype and op --------------------------------- */
static dm_status run_cl(const clayout* l, dm_rank_fn fn, void* user) { return run_thread_hosts(l->world, l->hosts, fn, user); }
static int ccase_rank(dm_collective* c, void* user) {
    return ccase_run(c, (const ccase*)user, NULL) ? DM_ERR_INTERNAL : DM_OK;
}
/* k on layout l, the expectation computed once for all its ranks. */
static void thread_case(ccase* k) {
    double* sum = (double*)malloc(k->count * sizeof(double));
    double* bound = (double*)malloc(k->count * sizeof(double));
    assert_true(sum && bound);
    cl_expect(k->l, k->mode, k->t, k->op, k->count, sum, bound);
    k->sum = sum;
    k->bound = bound;
    if (run_cl(k->l, ccase_rank, k) != DM_OK)
        fail_msg("threaded world, layout %s, %s, %s, %s, count %zu: failed (above)", k->l->name,
                 dm_compress_name(k->mode), dm_dtype_name(k->t), dm_reduce_op_name(k->op), k->count);
    free(sum);
    free(bound);
}
static void test_layouts_thread(void** s) {
    static const dm_dtype types[3] = { DM_FLOAT32, DM_BFLOAT16, DM_FLOAT16 };
    static const size_t counts[3] = { 1000, 3 * 65536 + 7, 3 };
    int l, m, t, n;
    (void)s;
    for (l = 0; l < N_CL; l++)
        for (m = 0; m < 2; m++)
            for (t = 0; t < 3; t++)
                for (n = 0; n < 3; n++) {
                    ccase k;
                    if (TEST_SANITIZED && n == 1 && t > 0) continue;
                    memset(&k, 0, sizeof(k));
                    k.l = &g_cl[l];
                    k.mode = m ? DM_COMPRESS_BF16 : DM_COMPRESS_INT8;
                    k.t = types[t];
                    k.op = (l + t + n) % 2 ? DM_MEAN : DM_SUM;
                    k.count = counts[n];
                    thread_case(&k);
                }
}

/* ---- error feedback ------------------------------------------------------------------------ */
/* The same input T times on 2x2 (int8, float32): with a state the average result converges to
   the exact sum (what one call drops, the next adds back: the average's error is the last
   residual / T), without it every call makes the same error. Rank 0 reports both maxima. */
#define EF_COUNT 5000
#define EF_STEPS 64
typedef struct ef_arg { const double* sum; double err[2]; } ef_arg;
static int ef_rank(dm_collective* c, void* user) {
    ef_arg* a = (ef_arg*)user;
    float* buf = (float*)malloc(EF_COUNT * sizeof(float));
    double* acc = (double*)calloc(EF_COUNT, sizeof(double));
    dm_compress_state* state = NULL;
    int with, step, bad = 0;
    size_t i;
    if (!buf || !acc || dm_compress_state_create(EF_COUNT, &state) != DM_OK) bad = 1;
    for (with = 0; with < 2 && !bad; with++) {
        double worst = 0;
        memset(acc, 0, EF_COUNT * sizeof(double));
        for (step = 0; step < EF_STEPS && !bad; step++) {
            cfill(DM_FLOAT32, dm_rank(c), buf, EF_COUNT);
            if (dm_all_reduce_compressed(c, NULL, buf, EF_COUNT, DM_FLOAT32, DM_SUM, DM_COMPRESS_INT8,
                                         with ? state : NULL) != DM_OK) bad = 1;
            for (i = 0; i < EF_COUNT; i++) acc[i] += buf[i];
        }
        if (!bad) bad = same_everywhere(c, buf, EF_COUNT * sizeof(float), "error feedback, last step");
        for (i = 0; i < EF_COUNT && !bad; i++)
            worst = fmax(worst, fabs(acc[i] / EF_STEPS - a->sum[i]));
        if (dm_rank(c) == 0) a->err[with] = worst;
    }
    if (!bad && dm_rank(c) < 2) {               /* rail ranks hold a residual, after compressed calls */
        const float* res = dm_compress_state_residual(state);
        double mx = 0;
        for (i = 0; i < EF_COUNT; i++) mx = fmax(mx, fabs(res[i]));
        if (!(mx > 0)) { fprintf(stderr, "rank %d: the residual is all zeros\n", dm_rank(c)); bad = 1; }
    }
    dm_compress_state_destroy(state);
    free(buf);
    free(acc);
    return bad ? DM_ERR_INTERNAL : DM_OK;
}
static void test_error_feedback(void** s) {
    double* sum = (double*)malloc(EF_COUNT * sizeof(double));
    double* bound = (double*)malloc(EF_COUNT * sizeof(double));
    ef_arg a;
    (void)s;
    memset(&a, 0, sizeof(a));
    cl_expect(&g_cl[0], DM_COMPRESS_INT8, DM_FLOAT32, DM_SUM, EF_COUNT, sum, bound);
    a.sum = sum;
    assert_int_equal(run_cl(&g_cl[0], ef_rank, &a), DM_OK);
    printf("  average error over %d calls: %.3g without a state, %.3g with\n", EF_STEPS, a.err[0], a.err[1]);
    assert_true(a.err[0] > 0);
    assert_true(a.err[1] < a.err[0] / 8);
    free(sum);
    free(bound);
}

/* Each element's residual lives on the one rank of its host that encodes it, whatever the last
   call cut: 2x2 (two hosts: the pipelined schedule, block i of R of each segment) with one state
   through a float32 call then a bfloat16 one of the same count (the segments follow the bytes,
   so the two calls cut differently), then float32 again. After each call no element may hold a
   residual on both ranks of a host: a residual the new cut leaves behind must go back into the
   buffer, not wait on a rank that no longer encodes it. */
#define RW_COUNT ((size_t)1 << 21)
static int residual_rank(dm_collective* c, void* user) {
    static const dm_dtype order[3] = { DM_FLOAT32, DM_BFLOAT16, DM_FLOAT32 };
    int r = dm_rank(c), mate = r ^ 1, k, bad = 0;     /* 2x2: ranks 2h and 2h+1 share host h */
    size_t i, both = 0, mine = 0;
    char ran[32];
    void* buf = malloc(RW_COUNT * sizeof(float));
    float* all = (float*)malloc(4 * RW_COUNT * sizeof(float));
    dm_compress_state* state = NULL;
    (void)user;
    if (!buf || !all || dm_compress_state_create(RW_COUNT, &state) != DM_OK) bad = 1;
    for (k = 0; k < 3 && !bad; k++) {
        cfill(order[k], r, buf, RW_COUNT);
        if (dm_all_reduce_compressed(c, NULL, buf, RW_COUNT, order[k], DM_SUM, DM_COMPRESS_INT8, state) != DM_OK) {
            bad = 1;
            break;
        }
        snprintf(ran, sizeof(ran), "%s", dm_last_algorithm(c));
        if (dm_all_gather(c, dm_compress_state_residual(state), all, RW_COUNT, DM_FLOAT32) != DM_OK) {
            bad = 1;
            break;
        }
        for (i = 0, both = mine = 0; i < RW_COUNT; i++) {
            mine += all[(size_t)r * RW_COUNT + i] != 0.0f;
            both += all[(size_t)r * RW_COUNT + i] != 0.0f && all[(size_t)mate * RW_COUNT + i] != 0.0f;
        }
        if (both || !mine || strcmp(ran, "two_level_int8") != 0) {
            fprintf(stderr, "rank %d, call %d (%s, ran %s): %zu residuals, %zu of them also on rank %d\n", r, k,
                    dm_dtype_name(order[k]), ran, mine, both, mate);
            bad = 1;
        }
    }
    dm_compress_state_destroy(state);
    free(buf);
    free(all);
    return bad ? DM_ERR_INTERNAL : DM_OK;
}
static void test_residual_where_encoded(void** s) {
    (void)s;
    assert_int_equal(run_cl(&g_cl[0], residual_rank, NULL), DM_OK);
}

/* ---- the state across dm_shrink and a split ------------------------------------------------ */
/* 3x2 on the threaded world, int8 with a state: 8 calls, then host 2's ranks leave; the
   survivors shrink (now 2x2) and go on with the same state for 56 more calls: every call's
   bits are the same on every survivor, and the average over the survivors' calls converges to
   their exact sum (the residuals kept from 3 hosts are valid on 2). Then a split of one rank
   per host (1x... across 2 hosts: 2 ranks) runs the same with a fresh state. */
#define SH_COUNT 3000
typedef struct sh_arg { const double* sum; double err; } sh_arg;
static int shrink_rank(dm_collective* c, void* user) {
    sh_arg* a = (sh_arg*)user;
    float* buf = (float*)malloc(SH_COUNT * sizeof(float));
    double* acc = (double*)calloc(SH_COUNT, sizeof(double));
    dm_compress_state* state = NULL;
    dm_collective *small = NULL, *pair = NULL;
    static const int gone[2] = { 4, 5 };
    int step, bad = 0, r = dm_rank(c);
    size_t i;
    if (!buf || !acc || dm_compress_state_create(SH_COUNT, &state) != DM_OK) bad = 1;
    for (step = 0; step < 8 && !bad; step++) {
        cfill(DM_FLOAT32, r, buf, SH_COUNT);
        bad = dm_all_reduce_compressed(c, NULL, buf, SH_COUNT, DM_FLOAT32, DM_SUM, DM_COMPRESS_INT8, state) != DM_OK;
    }
    if (r >= 4 || bad) goto done;               /* host 2 leaves */
    if (dm_shrink(c, gone, 2, DM_SHRINK_DEFAULT, &small) != DM_OK) { bad = 1; goto done; }
    for (step = 0; step < 56 && !bad; step++) {
        cfill(DM_FLOAT32, r, buf, SH_COUNT);
        bad = dm_all_reduce_compressed(small, NULL, buf, SH_COUNT, DM_FLOAT32, DM_SUM, DM_COMPRESS_INT8, state) != DM_OK ||
              strcmp(dm_last_algorithm(small), "two_level_int8") != 0 ||
              same_everywhere(small, buf, SH_COUNT * sizeof(float), "after the shrink");
        for (i = 0; i < SH_COUNT; i++) acc[i] += buf[i];
    }
    if (!bad && r == 0) {
        double worst = 0;
        for (i = 0; i < SH_COUNT; i++) worst = fmax(worst, fabs(acc[i] / 56 - a->sum[i]));
        a->err = worst;
    }
    if (!bad) bad = dm_split(small, r % 2, r, &pair) != DM_OK;      /* {0, 2} and {1, 3}: one rank per host */
    if (!bad) {
        dm_compress_state* fresh = NULL;
        bad = dm_compress_state_create(SH_COUNT, &fresh) != DM_OK;
        cfill(DM_FLOAT32, r, buf, SH_COUNT);
        if (!bad)
            bad = dm_all_reduce_compressed(pair, NULL, buf, SH_COUNT, DM_FLOAT32, DM_MEAN, DM_COMPRESS_INT8, fresh) != DM_OK ||
                  strcmp(dm_last_algorithm(pair), "two_level_int8") != 0 ||
                  same_everywhere(pair, buf, SH_COUNT * sizeof(float), "split across hosts");
        dm_compress_state_destroy(fresh);
    }
    dm_destroy(pair);
    dm_destroy(small);
done:
    dm_compress_state_destroy(state);
    free(buf);
    free(acc);
    return bad ? DM_ERR_INTERNAL : DM_OK;
}
static void test_state_across_shrink(void** s) {
    static const clayout after = { "2x2 after the shrink", 4, { 0, 0, 1, 1 } };
    double* sum = (double*)malloc(SH_COUNT * sizeof(double));
    double* bound = (double*)malloc(SH_COUNT * sizeof(double));
    double one;
    sh_arg a;
    size_t i;
    (void)s;
    memset(&a, 0, sizeof(a));
    cl_expect(&after, DM_COMPRESS_INT8, DM_FLOAT32, DM_SUM, SH_COUNT, sum, bound);
    a.sum = sum;
    assert_int_equal(run_cl(&g_cl[1], shrink_rank, &a), DM_OK);
    for (one = 0, i = 0; i < SH_COUNT; i++) one = fmax(one, bound[i]);
    printf("  average error over the 56 calls after the shrink: %.3g (one call's bound: %.3g)\n", a.err, one);
    /* the residuals carried over hold up to 3 hosts' drops: a few calls' bounds over 56 calls */
    assert_true(a.err < one / 8);
    free(sum);
    free(bound);
}

/* ---- the choice, DISTMESH_COMPRESS, refusals, mismatches ----------------------------------- */
static int env_rank(dm_collective* c, void* user) {
    float f[600];
    int32_t n[600];
    int i;
    (void)user;
    for (i = 0; i < 600; i++) { f[i] = (float)(i % 13) / 7.0f; n[i] = i; }
    if (dm_all_reduce(c, NULL, f, 600, DM_FLOAT32, DM_SUM) != DM_OK || strcmp(dm_last_algorithm(c), "two_level_int8") != 0)
        return DM_ERR_INTERNAL;
    if (dm_all_reduce(c, NULL, n, 600, DM_INT32, DM_SUM) != DM_OK || strstr(dm_last_algorithm(c), "int8"))
        return DM_ERR_INTERNAL;
    if (n[599] != 4 * 599) return DM_ERR_INTERNAL;
    if (dm_all_reduce(c, NULL, f, 600, DM_FLOAT32, DM_MAX) != DM_OK || strstr(dm_last_algorithm(c), "int8"))
        return DM_ERR_INTERNAL;
    /* an explicit mode wins over the variable */
    if (dm_all_reduce_compressed(c, NULL, f, 600, DM_FLOAT32, DM_SUM, DM_COMPRESS_NONE, NULL) != DM_OK ||
        strstr(dm_last_algorithm(c), "int8"))
        return DM_ERR_INTERNAL;
    return DM_OK;
}
static int flat_rank(dm_collective* c, void* user) {
    float f[600] = { 0 };
    (void)user;
    if (dm_all_reduce_compressed(c, NULL, f, 600, DM_FLOAT32, DM_SUM, DM_COMPRESS_INT8, NULL) != DM_OK) return DM_ERR_INTERNAL;
    return strstr(dm_last_algorithm(c), "flat") ? DM_OK : DM_ERR_INTERNAL;
}
static void test_choice_and_env(void** s) {
    (void)s;
    setenv("DISTMESH_COMPRESS", "int8", 1);
    assert_int_equal(run_cl(&g_cl[0], env_rank, NULL), DM_OK);
    setenv("DISTMESH_COMPRESS", "int4", 1);
    assert_int_equal(run_cl(&g_cl[0], flat_rank, NULL), DM_ERR_ENV);
    printf("  DISTMESH_COMPRESS=int4: %s\n", dm_last_error(NULL));
    assert_non_null(strstr(dm_last_error(NULL), "DISTMESH_COMPRESS"));
    unsetenv("DISTMESH_COMPRESS");
    setenv("DISTMESH_ALGO", "flat", 1);
    assert_int_equal(run_cl(&g_cl[0], flat_rank, NULL), DM_OK);
    unsetenv("DISTMESH_ALGO");
}

/* Refused before anything is sent: on rank 0 only, so a call that sent would hang its peers
   (the world's deadline) instead of returning at once. */
static int refuse_rank(dm_collective* c, void* user) {
    float f[600] = { 0 };
    int32_t n[600] = { 0 };
    dm_compress_state* st = NULL;
    (void)user;
    if (dm_rank(c) != 0) return DM_OK;
    if (dm_compress_state_create(599, &st) != DM_OK) return DM_ERR_INTERNAL;
#define REFUSED(call, text)                                                                      \
    do {                                                                                         \
        if ((call) != DM_ERR_INVALID_ARG || !strstr(dm_last_error(c), text)) {                   \
            fprintf(stderr, "%s: %s\n", #call, dm_last_error(c));                                \
            return DM_ERR_INTERNAL;                                                              \
        }                                                                                        \
        printf("  %s\n", dm_last_error(c));                                                      \
    } while (0)
    REFUSED(dm_all_reduce_compressed(c, NULL, n, 600, DM_INT32, DM_SUM, DM_COMPRESS_INT8, NULL), "int32");
    REFUSED(dm_all_reduce_compressed(c, NULL, f, 600, DM_FLOAT32, DM_MAX, DM_COMPRESS_BF16, NULL), "max");
    REFUSED(dm_all_reduce_compressed(c, NULL, f, 600, DM_FLOAT32, DM_SUM, (dm_compress)9, NULL), "mode 9");
    REFUSED(dm_all_reduce_compressed(c, NULL, f, 600, DM_FLOAT32, DM_SUM, DM_COMPRESS_INT8, st), "599");
    {
        dm_op o;
        memset(&o, 0, sizeof(o));
        o.kind = DM_OP_ALL_REDUCE; o.recv = n; o.count = 600; o.dtype = DM_INT32; o.op = DM_SUM;
        o.compress = DM_COMPRESS_INT8;
        REFUSED(dm_submit(c, &o, NULL), "int32");
    }
#undef REFUSED
    dm_compress_state_destroy(st);
    return DM_OK;
}
/* Rank 2 of 2x2 asks int8, the others bf16 (case 0) or none (case 1): DM_ERR_MISMATCH on every
   rank, naming the compression. */
static int mismatch_rank(dm_collective* c, void* user) {
    int kind = *(const int*)user;
    float f[1000] = { 0 };
    dm_compress other = kind == 0 ? DM_COMPRESS_BF16 : DM_COMPRESS_NONE;
    dm_status st = dm_all_reduce_compressed(c, NULL, f, 1000, DM_FLOAT32, DM_SUM,
                                            dm_rank(c) == 2 ? DM_COMPRESS_INT8 : other, NULL);
    if (st != DM_ERR_MISMATCH || !strstr(dm_last_error(c), "compressed int8")) {
        fprintf(stderr, "rank %d, case %d: %s: %s\n", dm_rank(c), kind, dm_status_name(st), dm_last_error(c));
        return DM_ERR_INTERNAL;
    }
    if (dm_rank(c) == 0) printf("  case %d, rank 0: %s\n", kind, dm_last_error(c));
    return DM_OK;
}
static void test_refusals_and_mismatch(void** s) {
    int kind;
    dm_collective* f = NULL;
    float x[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
    dm_compress_state* st = NULL;
    (void)s;
    assert_int_equal(run_cl(&g_cl[0], refuse_rank, NULL), DM_OK);
    for (kind = 0; kind < 2; kind++) assert_int_equal(run_cl(&g_cl[0], mismatch_rank, &kind), DM_OK);
    /* the Fake world runs it exact, the residual added first */
    assert_int_equal(dm_fake_create(NULL, &f), DM_OK);
    assert_int_equal(dm_compress_state_create(8, &st), DM_OK);
    dm_compress_state_residual(st)[3] = 0.5f;
    assert_int_equal(dm_all_reduce_compressed(f, NULL, x, 8, DM_FLOAT32, DM_SUM, DM_COMPRESS_INT8, st), DM_OK);
    assert_true(x[3] == 4.5f && x[2] == 3.0f && dm_compress_state_residual(st)[3] == 0.0f);
    assert_int_equal(dm_compress_state_count(st), 8);
    dm_compress_state_destroy(st);
    dm_destroy(f);
}

/* ---- forked ranks: shared memory inside each host, sockets between ------------------------- */
/* 2x2 and 4x1 (per_host 2 / 1) over the TCP backend: int8 and bf16, float32 and bfloat16, the
   bound and the bits, and a queued call (dm_all_reduce_compressed_async). */
static int tcp_body(dm_collective* c, int rank, int world, void* arg) {
    const clayout* l = (const clayout*)arg;
    static const size_t count = 2 * 65536 + 5;
    int m, t, bad = 0;
    (void)rank; (void)world;
    RCHECK(strcmp(dm_transport_name(c), l->hosts[1] == 0 ? "shm+tcp" : "tcp") == 0);
    for (m = 0; m < 2 && !bad; m++)
        for (t = 0; t < 2 && !bad; t++) {
            ccase k;
            double* sum = (double*)malloc(count * sizeof(double));
            double* bound = (double*)malloc(count * sizeof(double));
            RCHECK(sum && bound);
            memset(&k, 0, sizeof(k));
            k.l = l; k.mode = m ? DM_COMPRESS_BF16 : DM_COMPRESS_INT8; k.t = t ? DM_BFLOAT16 : DM_FLOAT32;
            k.op = t ? DM_MEAN : DM_SUM; k.count = count;
            cl_expect(l, k.mode, k.t, k.op, count, sum, bound);
            k.sum = sum; k.bound = bound;
            bad = ccase_run(c, &k, NULL);
            free(sum);
            free(bound);
        }
    {
        float* a = (float*)malloc(count * sizeof(float));
        float* b = (float*)malloc(count * sizeof(float));
        dm_request* req = NULL;
        RCHECK(a && b);
        cfill(DM_FLOAT32, dm_rank(c), a, count);
        cfill(DM_FLOAT32, dm_rank(c), b, count);
        RST(dm_all_reduce_compressed_async(c, NULL, a, count, DM_FLOAT32, DM_SUM, DM_COMPRESS_INT8, NULL, &req));
        RST(dm_wait(req));
        RST(dm_all_reduce_compressed(c, NULL, b, count, DM_FLOAT32, DM_SUM, DM_COMPRESS_INT8, NULL));
        RCHECK(memcmp(a, b, count * sizeof(float)) == 0);
        free(a);
        free(b);
    }
    return bad;
}
static void tcp_layout(const clayout* l, int per_host) {
    tw_dm_world w;
    tw_dm_world_init(&w, l->world, &g_store, NULL, 30000);
    w.per_host = per_host;
    w.body = tcp_body;
    w.arg = (void*)l;
    assert_int_equal(tw_dm_run(&w, 120), 0);
}
static void test_tcp_2x2(void** s) { (void)s; tcp_layout(&g_cl[0], 2); }
static void test_tcp_4x1(void** s) { (void)s; tcp_layout(&g_cl[2], 1); }

/* ---- training: examples/ddp_overlap.c on 2 simulated hosts x 2 ranks ---------------------- */
#ifndef DM_DDP
#define DM_DDP "build/plain/examples/ddp_overlap"
#endif
static char g_out[1 << 16];
/* The example's final loss with args (200 steps, 2 hosts x 2 threads), after checking that it
   ran the algorithm named algo and ended with identical weights on every rank. */
static double train_loss(const char* args, const char* algo) {
    char cmd[512];
    const char* p;
    double first = 0, last = -1;
    snprintf(cmd, sizeof(cmd), "env -u RANK -u WORLD_SIZE -u DISTMESH_STORE %s --threads 4 --hosts 2 --steps 200 "
             "--hidden 64 --bucket-mb 0.02 %s", DM_DDP, args);
    assert_int_equal(tw_run_cmd(120, g_out, sizeof(g_out), cmd), 0);
    assert_non_null(strstr(g_out, "weights identical on all 4 ranks"));
    assert_non_null(strstr(g_out, algo));
    p = strstr(g_out, "\nloss ");
    assert_non_null(p);
    assert_int_equal(sscanf(p, "\nloss %lf -> %lf", &first, &last), 2);
    printf("  %-32s %s: loss %.6f -> %.6f\n", args, algo, first, last);
    return last;
}
/* int8 with error feedback ends within 1% of exact training's loss (reported beside it: int8
   without feedback, bf16); every run's weights are the same bytes on all ranks. */
static void test_training_quality(void** s) {
    double exact, int8, int8_nofb, bf16;
    (void)s;
    exact = train_loss("--compress none", "gradients: two_level_");
    int8 = train_loss("--compress int8", "gradients: two_level_int8 (int8, error feedback)");
    int8_nofb = train_loss("--compress int8 --no-feedback", "gradients: two_level_int8 (int8, no error feedback)");
    bf16 = train_loss("--compress bf16", "gradients: two_level_bf16 (bf16, error feedback)");
    printf("  final loss relative to exact: int8 %+.3f%%, int8 without feedback %+.3f%%, bf16 %+.3f%%\n",
           100 * (int8 / exact - 1), 100 * (int8_nofb / exact - 1), 100 * (bf16 / exact - 1));
    assert_true(fabs(int8 / exact - 1) <= 0.01);
    assert_true(fabs(bf16 / exact - 1) <= 0.01);
}

int main(int argc, char** argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layouts_thread),
        cmocka_unit_test(test_error_feedback),
        cmocka_unit_test(test_residual_where_encoded),
        cmocka_unit_test(test_state_across_shrink),
        cmocka_unit_test(test_choice_and_env),
        cmocka_unit_test(test_refusals_and_mismatch),
        cmocka_unit_test(test_tcp_2x2),
        cmocka_unit_test(test_tcp_4x1),
        cmocka_unit_test(test_training_quality),
    };
    return TCP_RUN_TESTS(tests, argc, argv);
}
