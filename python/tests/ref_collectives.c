/* The C library's bytes for the Python tests: every collective case of python/tests/cases.py,
   run on a threaded world of W ranks through the C API, written with each rank's input and
   output. Shared memory and TCP reduce in the threaded world's order (distmesh.h, "Reduction
   order"), so these are the bytes every transport must give.

   usage: ref_collectives W FILE
   FILE: "DMREF1 W\n", then records: a text line "<name> <kind> <dtype> <op> <count> <root>\n"
   and per rank "<in bytes> <out bytes>\n" followed by the input and output bytes. */
#include "distmesh.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXW 8
enum { K_ALL_REDUCE, K_ALL_GATHER, K_ALL_GATHER_TO_LIST, K_REDUCE_SCATTER, K_BROADCAST, K_REDUCE, K_GATHER,
       K_SCATTER, K_ALL_TO_ALL, K_ALL_TO_ALL_V, K_SENDRECV };
static const char* g_kinds[] = { "all_reduce", "all_gather", "all_gather_to_list", "reduce_scatter", "broadcast",
                                 "reduce", "gather", "scatter", "all_to_all", "all_to_all_v", "sendrecv" };

typedef struct ref_case {
    int kind;
    dm_dtype dtype;
    dm_reduce_op op;
    size_t count;               /* elements per rank (the kind's count argument) */
    int root;                   /* < 0: counted from the end (W + root) */
    unsigned char *in[MAXW], *out[MAXW];
    size_t in_bytes, out_bytes;
} ref_case;

/* all_to_all_v: what rank i sends rank j (elements); zero counts included. */
static size_t v_count(int i, int j) { return (size_t)((i + 2 * j) % 3); }

/* Rank r's element e: values that make the reduction order show in floats, and wrap in ints. */
static void fill(dm_dtype t, dm_reduce_op op, int r, unsigned char* buf, size_t n) {
    size_t e;
    for (e = 0; e < n; e++) {
        uint64_t h = (uint64_t)r * 7919u + e * 104729u + (uint64_t)op * 31u;
        double f = (double)(h % 1000) / 7.0 - 61.3 + 1e-3 * r;
        if (op == DM_PROD) f = 1.0 + (double)(h % 13) / 64.0 - 0.09;
        switch (t) {
            case DM_INT8: ((int8_t*)buf)[e] = (int8_t)(uint8_t)(h * 37u); break;
            case DM_UINT8: ((uint8_t*)buf)[e] = (uint8_t)(h * 53u); break;
            case DM_INT32: ((int32_t*)buf)[e] = (int32_t)(uint32_t)(h * 2654435761u); break;
            case DM_UINT32: ((uint32_t*)buf)[e] = (uint32_t)(h * 2246822519u); break;
            case DM_INT64: ((int64_t*)buf)[e] = (int64_t)(h * 0x9E3779B97F4A7C15ull); break;
            case DM_UINT64: ((uint64_t*)buf)[e] = h * 0xC2B2AE3D27D4EB4Full; break;
            case DM_FLOAT16: ((uint16_t*)buf)[e] = dm_float_to_half((float)f); break;
            case DM_BFLOAT16: ((uint16_t*)buf)[e] = dm_float_to_bfloat16((float)f); break;
            case DM_FLOAT32: ((float*)buf)[e] = (float)f; break;
            case DM_FLOAT64: ((double*)buf)[e] = f * 1.0000001; break;
            default: break;
        }
    }
}

static ref_case g_cases[96];
static int g_ncases, g_world;

static void add(int kind, dm_dtype t, dm_reduce_op op, size_t count, int root) {
    ref_case* c;
    if (g_ncases == (int)(sizeof(g_cases) / sizeof(g_cases[0]))) { fprintf(stderr, "too many cases\n"); exit(2); }
    c = &g_cases[g_ncases++];
    size_t es = dm_dtype_size(t), W = (size_t)g_world;
    int r;
    c->kind = kind; c->dtype = t; c->op = op; c->count = count; c->root = root < 0 ? g_world + root : root;
    switch (kind) {
        case K_ALL_GATHER: case K_ALL_GATHER_TO_LIST: c->in_bytes = count * es; c->out_bytes = W * count * es; break;
        case K_REDUCE_SCATTER: c->in_bytes = W * count * es; c->out_bytes = count * es; break;
        case K_GATHER: c->in_bytes = count * es; c->out_bytes = W * count * es; break;
        case K_SCATTER: c->in_bytes = W * count * es; c->out_bytes = count * es; break;
        case K_ALL_TO_ALL: c->in_bytes = c->out_bytes = W * count * es; break;
        case K_ALL_TO_ALL_V: c->in_bytes = c->out_bytes = 3 * W * es; break;   /* room for any rank's counts */
        default: c->in_bytes = c->out_bytes = count * es; break;
    }
    for (r = 0; r < g_world; r++) {
        c->in[r] = (unsigned char*)calloc(1, c->in_bytes + 1);
        c->out[r] = (unsigned char*)calloc(1, c->out_bytes + 1);
        fill(t, op, r, c->in[r], c->in_bytes / es);
    }
}

static int run_case(dm_collective* c, ref_case* k) {
    int r = dm_rank(c), W = dm_world_size(c), j;
    size_t es = dm_dtype_size(k->dtype);
    unsigned char *in = k->in[r], *out = k->out[r];
    switch (k->kind) {
        case K_ALL_REDUCE:
            memcpy(out, in, k->in_bytes);
            return dm_all_reduce(c, NULL, out, k->count, k->dtype, k->op);
        case K_ALL_GATHER: return dm_all_gather(c, in, out, k->count, k->dtype);
        case K_ALL_GATHER_TO_LIST: {
            void* ptrs[MAXW];
            for (j = 0; j < W; j++) ptrs[j] = out + (size_t)j * k->count * es;
            return dm_all_gather_to_list(c, in, ptrs, k->count, k->dtype);
        }
        case K_REDUCE_SCATTER: return dm_reduce_scatter(c, in, out, k->count, k->dtype, k->op);
        case K_BROADCAST:
            memcpy(out, in, k->in_bytes);
            return dm_broadcast(c, out, k->count, k->dtype, k->root);
        case K_REDUCE:      /* in place at the root, as the Python call runs it */
            memcpy(out, in, k->in_bytes);
            return dm_reduce(c, out, out, k->count, k->dtype, k->op, k->root);
        case K_GATHER: return dm_gather(c, in, r == k->root ? out : NULL, k->count, k->dtype, k->root);
        case K_SCATTER: return dm_scatter(c, r == k->root ? in : NULL, out, k->count, k->dtype, k->root);
        case K_ALL_TO_ALL: return dm_all_to_all(c, in, out, k->count, k->dtype);
        case K_ALL_TO_ALL_V: {
            size_t sc[MAXW], so[MAXW], rc[MAXW], ro[MAXW], s = 0, q = 0;
            for (j = 0; j < W; j++) {
                sc[j] = v_count(r, j); so[j] = s; s += sc[j];
                rc[j] = v_count(j, r); ro[j] = q; q += rc[j];
            }
            return dm_all_to_all_v(c, in, sc, so, out, rc, ro, k->dtype);
        }
        case K_SENDRECV: {
            dm_status st = dm_send(c, in, k->count, k->dtype, (r + 1) % W, 5);
            if (st != DM_OK) return st;
            return dm_recv(c, out, k->count, k->dtype, (r + W - 1) % W, 5);
        }
        default: return DM_ERR_INTERNAL;
    }
}

static int rank_main(dm_collective* c, void* user) {
    int i;
    (void)user;
    for (i = 0; i < g_ncases; i++) {
        dm_status st = (dm_status)run_case(c, &g_cases[i]);
        if (st != DM_OK) {
            fprintf(stderr, "rank %d case %d (%s): %s\n", dm_rank(c), i, g_kinds[g_cases[i].kind], dm_last_error(c));
            return st;
        }
    }
    return DM_OK;
}

int main(int argc, char** argv) {
    dm_fake_desc d;
    FILE* f;
    int i, r, t, o;
    const dm_dtype all[] = { DM_INT8, DM_UINT8, DM_INT32, DM_UINT32, DM_INT64, DM_UINT64, DM_FLOAT16, DM_BFLOAT16,
                             DM_FLOAT32, DM_FLOAT64 };
    if (argc != 3 || (g_world = atoi(argv[1])) < 2 || g_world > MAXW) {
        fprintf(stderr, "usage: ref_collectives W(2..%d) FILE\n", MAXW);
        return 2;
    }
    /* keep in step with python/tests/cases.py: it runs these in this order */
    for (t = 0; t < 10; t++)
        for (o = 0; o < DM_REDUCE_OP_COUNT; o++) add(K_ALL_REDUCE, all[t], (dm_reduce_op)o, 13, 0);
    add(K_ALL_REDUCE, DM_FLOAT32, DM_SUM, 40000, 0);      /* > 64 KiB: the ring */
    add(K_ALL_REDUCE, DM_BFLOAT16, DM_SUM, 40000, 0);
    add(K_ALL_REDUCE, DM_FLOAT64, DM_MEAN, 20000, 0);
    add(K_ALL_REDUCE, DM_FLOAT16, DM_MAX, 40000, 0);
    add(K_ALL_GATHER, DM_FLOAT32, DM_SUM, 7, 0);
    add(K_ALL_GATHER, DM_BFLOAT16, DM_SUM, 50000, 0);
    add(K_ALL_GATHER_TO_LIST, DM_INT32, DM_SUM, 5, 0);
    add(K_REDUCE_SCATTER, DM_FLOAT32, DM_SUM, 9, 0);
    add(K_REDUCE_SCATTER, DM_FLOAT32, DM_SUM, 30000, 0);
    add(K_REDUCE_SCATTER, DM_BFLOAT16, DM_SUM, 20000, 0);
    add(K_BROADCAST, DM_FLOAT64, DM_SUM, 11, 1);
    add(K_BROADCAST, DM_UINT8, DM_SUM, 70000, -1);
    add(K_REDUCE, DM_FLOAT32, DM_SUM, 17, 2);
    add(K_REDUCE, DM_FLOAT32, DM_SUM, 30000, 0);
    add(K_GATHER, DM_INT64, DM_SUM, 3, 1);
    add(K_SCATTER, DM_FLOAT32, DM_SUM, 4, 0);
    add(K_ALL_TO_ALL, DM_INT32, DM_SUM, 3, 0);
    add(K_ALL_TO_ALL_V, DM_FLOAT32, DM_SUM, 0, 0);
    add(K_SENDRECV, DM_FLOAT32, DM_SUM, 6, 0);
    memset(&d, 0, sizeof(d));
    d.world_size = g_world;
    d.timeout_ms = 60000;
    if (dm_thread_world_run(&d, rank_main, NULL) != DM_OK) return 1;
    f = fopen(argv[2], "wb");
    if (!f) { perror(argv[2]); return 1; }
    fprintf(f, "DMREF1 %d\n", g_world);
    for (i = 0; i < g_ncases; i++) {
        ref_case* k = &g_cases[i];
        fprintf(f, "%s/%s/%s/%zu %d %d %d %zu %d\n", g_kinds[k->kind], dm_dtype_name(k->dtype),
                dm_reduce_op_name(k->op), k->count, k->kind, (int)k->dtype, (int)k->op, k->count, k->root);
        for (r = 0; r < g_world; r++) {
            fprintf(f, "%zu %zu\n", k->in_bytes, k->out_bytes);
            if (fwrite(k->in[r], 1, k->in_bytes, f) != k->in_bytes || fwrite(k->out[r], 1, k->out_bytes, f) != k->out_bytes)
                return 1;
        }
    }
    return fclose(f) == 0 ? 0 : 1;
}
