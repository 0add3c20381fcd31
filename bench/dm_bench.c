/* dm_bench: distmesh collective benchmark that prints nccl-tests' table.

     dm_bench -np 4 -b 8 -e 64M -f 2            all_reduce float sum on 4 local ranks over TCP
     dm_bench -O all_gather -np 2 -b 1K -e 16M  other collectives: all_reduce, all_gather,
                                                reduce_scatter, broadcast
     torchrun --nproc-per-node 4 dm_bench ...   under a launcher (no -np): dm_init from the env

   Flags as nccl-tests: -b minbytes -e maxbytes -f stepfactor -i stepbytes -n iters -w warmup
   -c check(0/1) -d dtype -o op -r root; plus -O collective, -np N (fork N ranks on 127.0.0.1,
   rendezvous through a file store in a fresh temporary directory), -B tcp|thread, -J file (JSON
   results), -t seconds (overall deadline: ranks are killed and the exit status is 2), -R (report
   each rank's peak RSS), -I (in place only: one buffer, for memory measurements), -C chunk bytes
   (TCP pipelining unit), -S list of sizes ("8,4K,64M") instead of the -b/-e sweep.
   Sizes follow nccl-tests: all_reduce/broadcast size = bytes per rank; all_gather size = bytes
   received (world x count); reduce_scatter size = bytes sent (world x count). Time is the mean
   over -n iterations, the slowest rank's; algbw = size / time; busbw = algbw x 2(n-1)/n for
   all_reduce, (n-1)/n for all_gather and reduce_scatter, 1 for broadcast (GB/s = 1e9 B/s). */
#define DISTMESH_IMPLEMENTATION
#include "distmesh.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef enum { OP_ALL_REDUCE, OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_BROADCAST } bench_op;
static const char* const k_op_names[] = { "all_reduce", "all_gather", "reduce_scatter", "broadcast" };

typedef struct bench_args {
    size_t min_bytes, max_bytes, step_bytes;
    double step_factor;
    int iters, warmup, check, root, nprocs, report_rss, inplace_only;
    dm_dtype dtype;
    dm_reduce_op redop;
    bench_op op;
    const char* backend;       /* "tcp" or "thread" */
    const char* json_path;
    double deadline_s;
    size_t chunk_bytes;
    size_t sizes[64];          /* -S list; nsizes 0 -> the -b/-e/-f sweep */
    int nsizes;
} bench_args;

typedef struct bench_row {
    size_t bytes, count;
    double us[2], algbw[2], busbw[2];
    long long wrong[2];
} bench_row;

/* >>args */
static size_t parse_size(const char* s) {
    char* end = NULL;
    double v = strtod(s, &end);
    switch (*end) {
        case 'K': case 'k': v *= 1024.0; break;
        case 'M': case 'm': v *= 1024.0 * 1024.0; break;
        case 'G': case 'g': v *= 1024.0 * 1024.0 * 1024.0; break;
        default: break;
    }
    return v < 0 ? 0 : (size_t)v;
}
static int parse_dtype(const char* s, dm_dtype* out) {
    static const char* alias[][2] = { { "float", "float32" }, { "half", "float16" }, { "double", "float64" },
                                      { "int", "int32" }, { "bf16", "bfloat16" }, { "char", "int8" } };
    int i;
    for (i = 0; i < (int)(sizeof(alias) / sizeof(alias[0])); i++)
        if (strcmp(s, alias[i][0]) == 0) s = alias[i][1];
    for (i = 0; i < DM_DTYPE_COUNT; i++)
        if (strcmp(s, dm_dtype_name((dm_dtype)i)) == 0) { *out = (dm_dtype)i; return 0; }
    return -1;
}
static int parse_redop(const char* s, dm_reduce_op* out) {
    int i;
    if (strcmp(s, "avg") == 0) s = "mean";
    for (i = 0; i < DM_REDUCE_OP_COUNT; i++)
        if (strcmp(s, dm_reduce_op_name((dm_reduce_op)i)) == 0) { *out = (dm_reduce_op)i; return 0; }
    return -1;
}
static void usage(void) {
    fprintf(stderr, "usage: dm_bench [-O all_reduce|all_gather|reduce_scatter|broadcast] [-np N] [-B tcp|thread]\n"
                    "  [-b minbytes] [-e maxbytes] [-f factor | -i stepbytes] [-n iters] [-w warmup] [-c 0|1]\n"
                    "  [-d dtype] [-o sum|prod|max|min|avg] [-r root] [-J file.json] [-t seconds] [-R] [-I] [-C chunkbytes] [-S sizes]\n");
}
static int parse_args(int argc, char** argv, bench_args* a) {
    int i;
    memset(a, 0, sizeof(*a));
    a->min_bytes = 32 * 1024 * 1024; a->max_bytes = 32 * 1024 * 1024;
    a->step_factor = 1; a->iters = 20; a->warmup = 5; a->check = 1;
    a->dtype = DM_FLOAT32; a->redop = DM_SUM; a->op = OP_ALL_REDUCE; a->backend = "tcp";
    for (i = 1; i < argc; i++) {
        const char* f = argv[i];
        const char* v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(f, "-R") == 0) { a->report_rss = 1; continue; }
        if (strcmp(f, "-I") == 0) { a->inplace_only = 1; continue; }
        if (!v) { usage(); return -1; }
        i++;
        if (strcmp(f, "-b") == 0) a->min_bytes = parse_size(v);
        else if (strcmp(f, "-e") == 0) a->max_bytes = parse_size(v);
        else if (strcmp(f, "-f") == 0) a->step_factor = atof(v);
        else if (strcmp(f, "-i") == 0) { a->step_bytes = parse_size(v); a->step_factor = 1; }
        else if (strcmp(f, "-n") == 0) a->iters = atoi(v);
        else if (strcmp(f, "-w") == 0) a->warmup = atoi(v);
        else if (strcmp(f, "-c") == 0) a->check = atoi(v);
        else if (strcmp(f, "-r") == 0) a->root = atoi(v);
        else if (strcmp(f, "-np") == 0) a->nprocs = atoi(v);
        else if (strcmp(f, "-B") == 0) a->backend = v;
        else if (strcmp(f, "-J") == 0) a->json_path = v;
        else if (strcmp(f, "-t") == 0) a->deadline_s = atof(v);
        else if (strcmp(f, "-C") == 0) a->chunk_bytes = parse_size(v);
        else if (strcmp(f, "-S") == 0) {
            char* list = strdup(v);
            char* tok;
            for (tok = strtok(list, ","); tok && a->nsizes < 64; tok = strtok(NULL, ",")) a->sizes[a->nsizes++] = parse_size(tok);
            free(list);
            if (a->nsizes) { a->min_bytes = a->sizes[0]; a->max_bytes = a->sizes[0]; }
            { int k; for (k = 0; k < a->nsizes; k++) if (a->sizes[k] > a->max_bytes) a->max_bytes = a->sizes[k]; }
        }
        else if (strcmp(f, "-d") == 0) { if (parse_dtype(v, &a->dtype)) { fprintf(stderr, "dm_bench: unknown dtype %s\n", v); return -1; } }
        else if (strcmp(f, "-o") == 0) { if (parse_redop(v, &a->redop)) { fprintf(stderr, "dm_bench: unknown op %s\n", v); return -1; } }
        else if (strcmp(f, "-O") == 0) {
            int k, found = 0;
            for (k = 0; k < 4; k++) if (strcmp(v, k_op_names[k]) == 0) { a->op = (bench_op)k; found = 1; }
            if (!found) { fprintf(stderr, "dm_bench: unknown collective %s\n", v); return -1; }
        } else { usage(); return -1; }
    }
    if (a->iters < 1 || a->warmup < 0 || a->min_bytes > a->max_bytes || (a->step_factor <= 1 && !a->step_bytes && !a->nsizes && a->min_bytes != a->max_bytes)) {
        fprintf(stderr, "dm_bench: need -n >= 1, -w >= 0, -b <= -e and a step (-f > 1 or -i)\n");
        return -1;
    }
    if (strcmp(a->backend, "tcp") != 0 && strcmp(a->backend, "thread") != 0) {
        fprintf(stderr, "dm_bench: -B must be tcp or thread\n");
        return -1;
    }
    return 0;
}

/* >>data  Small integers that every dtype holds exactly, so sums of up to 64 ranks are exact. */
static double pattern(int rank, size_t i) { return (double)((rank * 7 + (int)(i % 13)) % 16); }
static double pattern_prod(int rank, size_t i) { return (double)(1 + ((rank + (int)(i % 5)) % 2)); }

static void store_value(dm_dtype t, void* buf, size_t i, double v) {
    switch (t) {
        case DM_INT8: ((int8_t*)buf)[i] = (int8_t)v; break;
        case DM_UINT8: ((uint8_t*)buf)[i] = (uint8_t)v; break;
        case DM_INT32: ((int32_t*)buf)[i] = (int32_t)v; break;
        case DM_UINT32: ((uint32_t*)buf)[i] = (uint32_t)v; break;
        case DM_INT64: ((int64_t*)buf)[i] = (int64_t)v; break;
        case DM_UINT64: ((uint64_t*)buf)[i] = (uint64_t)v; break;
        case DM_FLOAT16: ((uint16_t*)buf)[i] = dm_float_to_half((float)v); break;
        case DM_BFLOAT16: ((uint16_t*)buf)[i] = dm_float_to_bfloat16((float)v); break;
        case DM_FLOAT32: ((float*)buf)[i] = (float)v; break;
        default: ((double*)buf)[i] = v; break;
    }
}
static double load_value(dm_dtype t, const void* buf, size_t i) {
    switch (t) {
        case DM_INT8: return ((const int8_t*)buf)[i];
        case DM_UINT8: return ((const uint8_t*)buf)[i];
        case DM_INT32: return ((const int32_t*)buf)[i];
        case DM_UINT32: return ((const uint32_t*)buf)[i];
        case DM_INT64: return (double)((const int64_t*)buf)[i];
        case DM_UINT64: return (double)((const uint64_t*)buf)[i];
        case DM_FLOAT16: return dm_half_to_float(((const uint16_t*)buf)[i]);
        case DM_BFLOAT16: return dm_bfloat16_to_float(((const uint16_t*)buf)[i]);
        case DM_FLOAT32: return ((const float*)buf)[i];
        default: return ((const double*)buf)[i];
    }
}
static double value_of(const bench_args* a, int rank, size_t i) {
    return a->redop == DM_PROD ? pattern_prod(rank, i) : pattern(rank, i);
}
static void fill(const bench_args* a, void* buf, size_t count, int rank, size_t first) {
    size_t i;
    for (i = 0; i < count; i++) store_value(a->dtype, buf, i, value_of(a, rank, first + i));
}
/* The reduction of element i over all ranks, as the library defines it for these inputs. */
static double expected_reduce(const bench_args* a, int world, size_t i) {
    double acc = value_of(a, 0, i);
    int r;
    for (r = 1; r < world; r++) {
        double v = value_of(a, r, i);
        switch (a->redop) {
            case DM_PROD: acc *= v; break;
            case DM_MAX: acc = v > acc ? v : acc; break;
            case DM_MIN: acc = v < acc ? v : acc; break;
            default: acc += v; break;
        }
    }
    if (a->redop == DM_MEAN) {
        if (a->dtype <= DM_UINT64) acc = trunc(acc / world);
        else acc = acc / world;
    }
    return acc;
}
static int close_enough(const bench_args* a, double got, double want) {
    double tol = a->dtype == DM_FLOAT16 || a->dtype == DM_BFLOAT16 ? 1e-2 : a->dtype == DM_FLOAT32 ? 1e-6 : 0;
    if (a->dtype > DM_UINT64 && a->redop == DM_MEAN) return fabs(got - want) <= tol * fabs(want) + tol;
    return got == want;
}

/* >>run one size */
typedef struct bench_bufs { void* send; void* recv; size_t send_bytes, recv_bytes; } bench_bufs;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Elements per rank for a size, and the buffers' byte counts. */
static size_t count_for(const bench_args* a, size_t bytes, int world) {
    size_t esize = dm_dtype_size(a->dtype);
    if (a->op == OP_ALL_GATHER || a->op == OP_REDUCE_SCATTER) return bytes / esize / (size_t)world;
    return bytes / esize;
}

static dm_status run_once(const bench_args* a, dm_collective* c, const bench_bufs* b, size_t count, int in_place) {
    size_t esize = dm_dtype_size(a->dtype), block = count * esize;
    unsigned char* recv = (unsigned char*)b->recv;
    unsigned char* send = (unsigned char*)b->send;
    switch (a->op) {
        case OP_ALL_REDUCE:
            return dm_all_reduce(c, in_place ? NULL : send, in_place ? send : recv, count, a->dtype, a->redop);
        case OP_ALL_GATHER:
            return dm_all_gather(c, in_place ? recv + (size_t)dm_rank(c) * block : send, recv, count, a->dtype);
        case OP_REDUCE_SCATTER:
            return dm_reduce_scatter(c, send, in_place ? send + (size_t)dm_rank(c) * block : recv, count,
                                     a->dtype, a->redop);
        default:
            return dm_broadcast(c, in_place ? send : recv, count, a->dtype, a->root);
    }
}

/* Fills the inputs for one run (in place or not). */
static void prepare(const bench_args* a, dm_collective* c, const bench_bufs* b, size_t count, int in_place) {
    int rank = dm_rank(c), world = dm_world_size(c);
    size_t esize = dm_dtype_size(a->dtype), block = count * esize;
    switch (a->op) {
        case OP_ALL_REDUCE: fill(a, b->send, count, rank, 0); break;
        case OP_ALL_GATHER:
            if (in_place) fill(a, (unsigned char*)b->recv + (size_t)rank * block, count, rank, 0);
            else fill(a, b->send, count, rank, 0);
            break;
        case OP_REDUCE_SCATTER: fill(a, b->send, count * (size_t)world, rank, 0); break;
        default: {  /* the root holds the pattern; the others a value the pattern never takes */
            void* buf = in_place ? b->send : b->recv;
            size_t i;
            if (rank == a->root) fill(a, buf, count, rank, 0);
            else for (i = 0; i < count; i++) store_value(a->dtype, buf, i, 99);
            break;
        }
    }
}

/* Wrong elements of the result of one prepared run. */
static long long count_wrong(const bench_args* a, dm_collective* c, const bench_bufs* b, size_t count, int in_place) {
    int rank = dm_rank(c), world = dm_world_size(c), r;
    size_t esize = dm_dtype_size(a->dtype), block = count * esize, i;
    long long wrong = 0;
    switch (a->op) {
        case OP_ALL_REDUCE: {
            const void* out = in_place ? b->send : b->recv;
            for (i = 0; i < count; i++) wrong += !close_enough(a, load_value(a->dtype, out, i), expected_reduce(a, world, i));
            break;
        }
        case OP_ALL_GATHER:
            for (r = 0; r < world; r++)
                for (i = 0; i < count; i++)
                    wrong += load_value(a->dtype, (unsigned char*)b->recv + (size_t)r * block, i) != value_of(a, r, i);
            break;
        case OP_REDUCE_SCATTER: {
            const unsigned char* out = in_place ? (unsigned char*)b->send + (size_t)rank * block : (unsigned char*)b->recv;
            for (i = 0; i < count; i++)
                wrong += !close_enough(a, load_value(a->dtype, out, i), expected_reduce(a, world, (size_t)rank * count + i));
            break;
        }
        default: {
            const void* out = in_place ? b->send : b->recv;
            for (i = 0; i < count; i++) wrong += load_value(a->dtype, out, i) != value_of(a, a->root, i);
            break;
        }
    }
    return wrong;
}

static double bus_factor(bench_op op, int world) {
    if (op == OP_ALL_REDUCE) return 2.0 * (world - 1) / world;
    if (op == OP_BROADCAST) return 1.0;
    return (double)(world - 1) / world;
}

/* One row: out-of-place then in-place; each checked once, then timed. */
static dm_status run_size(const bench_args* a, dm_collective* c, const bench_bufs* b, size_t bytes, bench_row* row) {
    int world = dm_world_size(c), ip, k;
    size_t count = count_for(a, bytes, world);
    memset(row, 0, sizeof(*row));
    row->count = count;
    row->bytes = count * dm_dtype_size(a->dtype) * ((a->op == OP_ALL_GATHER || a->op == OP_REDUCE_SCATTER) ? (size_t)world : 1);
    row->wrong[0] = -1;
    for (ip = a->inplace_only; ip < 2; ip++) {
        double t0, t, slowest = 0, wrong;
        dm_status st;
        if (a->check) {
            prepare(a, c, b, count, ip);
            if ((st = run_once(a, c, b, count, ip)) != DM_OK) return st;
            wrong = (double)count_wrong(a, c, b, count, ip);
            if ((st = dm_all_reduce(c, NULL, &wrong, 1, DM_FLOAT64, DM_SUM)) != DM_OK) return st;
            row->wrong[ip] = (long long)wrong;
        } else {
            row->wrong[ip] = -1;
            prepare(a, c, b, count, ip);
        }
        for (k = 0; k < a->warmup; k++)
            if ((st = run_once(a, c, b, count, ip)) != DM_OK) return st;
        if ((st = dm_barrier(c)) != DM_OK) return st;
        t0 = now_s();
        for (k = 0; k < a->iters; k++)
            if ((st = run_once(a, c, b, count, ip)) != DM_OK) return st;
        t = (now_s() - t0) / a->iters;
        slowest = t;
        if ((st = dm_all_reduce(c, NULL, &slowest, 1, DM_FLOAT64, DM_MAX)) != DM_OK) return st;
        row->us[ip] = slowest * 1e6;
        row->algbw[ip] = slowest > 0 ? (double)row->bytes / slowest / 1e9 : 0;
        row->busbw[ip] = row->algbw[ip] * bus_factor(a->op, world);
    }
    return DM_OK;
}

/* >>output  nccl-tests' layout. */
static void print_preamble(const bench_args* a, dm_collective* c) {
    int world = dm_world_size(c);
    printf("# distmesh dm_bench: %s, backend %s, transport %s, %d ranks\n", k_op_names[a->op], dm_backend_name(c),
           dm_transport_name(c), world);
    printf("# nThread 1 nGpus 0 minBytes %zu maxBytes %zu step: %g(%s) warmup iters: %d iters: %d agg iters: 1 validation: %d graph: 0\n",
           a->min_bytes, a->max_bytes, a->step_bytes ? (double)a->step_bytes : a->step_factor,
           a->step_bytes ? "bytes" : "factor", a->warmup, a->iters, a->check);
    printf("#\n# Using devices\n");
}
static void print_rank_lines(dm_collective* c) {
    char host[64];
    long long mine[2], *all;
    int world = dm_world_size(c), r;
    if (world < 1) return;
    gethostname(host, sizeof(host));
    host[sizeof(host) - 1] = 0;
    mine[0] = (long long)getpid();
    mine[1] = (long long)dm_local_rank(c);
    all = (long long*)calloc((size_t)world * 2, sizeof(long long));
    if (dm_all_gather(c, mine, all, 2, DM_INT64) == DM_OK && dm_rank(c) == 0)
        for (r = 0; r < world; r++)
            printf("#  Rank %2d Group  0 Pid %6lld on %10s device %2lld [cpu] CPU (local rank %lld)\n", r,
                   all[2 * r], host, all[2 * r + 1], all[2 * r + 1]);
    free(all);
}
static void print_header(void) {
    printf("#\n");
    printf("#                                                              out-of-place                       in-place          \n");
    printf("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n");
    printf("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       \n");
}
static void print_row(const bench_args* a, const bench_row* row) {
    int ip;
    int root = a->op == OP_BROADCAST ? a->root : -1;
    const char* redop = (a->op == OP_ALL_REDUCE || a->op == OP_REDUCE_SCATTER) ? dm_reduce_op_name(a->redop) : "none";
    printf("%12zu  %12zu  %8s  %6s  %6d", row->bytes, row->count, dm_dtype_name(a->dtype), redop, root);
    for (ip = 0; ip < 2; ip++) {
        char wrong[24];
        if (row->wrong[ip] < 0) snprintf(wrong, sizeof(wrong), "N/A");
        else snprintf(wrong, sizeof(wrong), "%lld", row->wrong[ip]);
        printf(row->us[ip] >= 10000 ? "  %7.0f" : "  %7.2f", row->us[ip]);
        printf("  %6.2f  %6.2f  %5s", row->algbw[ip], row->busbw[ip], wrong);
    }
    printf("\n");
    fflush(stdout);
}
static void write_json(const bench_args* a, dm_collective* c, const bench_row* rows, int nrows, const double* rss_mib) {
    FILE* f = fopen(a->json_path, "w");
    int i, r;
    if (!f) { fprintf(stderr, "dm_bench: cannot write %s\n", a->json_path); return; }
    fprintf(f, "{\"backend\": \"%s\", \"transport\": \"%s\", \"collective\": \"%s\", \"ranks\": %d, \"dtype\": \"%s\", \"redop\": \"%s\",\n \"rows\": [\n",
            dm_backend_name(c), dm_transport_name(c), k_op_names[a->op], dm_world_size(c), dm_dtype_name(a->dtype), dm_reduce_op_name(a->redop));
    for (i = 0; i < nrows; i++)
        fprintf(f, "  {\"bytes\": %zu, \"count\": %zu, \"oop_us\": %.3f, \"oop_busbw\": %.4f, \"oop_wrong\": %lld, "
                   "\"ip_us\": %.3f, \"ip_busbw\": %.4f, \"ip_wrong\": %lld}%s\n",
                rows[i].bytes, rows[i].count, rows[i].us[0], rows[i].busbw[0], rows[i].wrong[0], rows[i].us[1],
                rows[i].busbw[1], rows[i].wrong[1], i + 1 < nrows ? "," : "");
    fprintf(f, " ],\n \"peak_rss_mib\": [");
    for (r = 0; rss_mib && r < dm_world_size(c); r++) fprintf(f, "%s%.1f", r ? ", " : "", rss_mib[r]);
    fprintf(f, "]\n}\n");
    fclose(f);
}

/* >>rank body */
static int rank_main(dm_collective* c, void* user) {
    const bench_args* a = (const bench_args*)user;
    int world = dm_world_size(c), nrows = 0, r;
    size_t bytes, max_count = count_for(a, a->max_bytes, world), esize = dm_dtype_size(a->dtype);
    long long oob = 0;
    double avg_bus = 0, rss, *rss_all = NULL;
    bench_row rows[128];
    bench_bufs b;
    dm_status st = DM_OK;
    struct rusage ru;
    if (a->root < 0 || a->root >= world) { fprintf(stderr, "dm_bench: root %d out of range\n", a->root); return DM_ERR_INVALID_ARG; }
    b.send_bytes = max_count * esize * ((a->op == OP_REDUCE_SCATTER) ? (size_t)world : 1);
    b.recv_bytes = max_count * esize * ((a->op == OP_ALL_GATHER) ? (size_t)world : 1);
    if (a->inplace_only && a->op != OP_ALL_GATHER) b.recv_bytes = 0;   /* in place needs one buffer */
    b.send = malloc(b.send_bytes ? b.send_bytes : 1);
    b.recv = malloc(b.recv_bytes ? b.recv_bytes : 1);
    if (!b.send || !b.recv) { fprintf(stderr, "dm_bench: out of memory\n"); return DM_ERR_OUT_OF_MEMORY; }
    memset(b.send, 0, b.send_bytes);
    memset(b.recv, 0, b.recv_bytes);
    if (dm_rank(c) == 0) print_preamble(a, c);
    print_rank_lines(c);
    if (dm_rank(c) == 0) print_header();
    for (bytes = a->nsizes ? a->sizes[0] : a->min_bytes; bytes <= a->max_bytes && nrows < 128;
         bytes = a->nsizes ? (nrows < a->nsizes ? a->sizes[nrows] : a->max_bytes + 1)
                 : a->step_bytes ? bytes + a->step_bytes : (size_t)((double)bytes * a->step_factor)) {
        st = run_size(a, c, &b, bytes, &rows[nrows]);
        if (st != DM_OK) { fprintf(stderr, "rank %d: %s: %s\n", dm_rank(c), dm_status_name(st), dm_last_error(c)); break; }
        if (dm_rank(c) == 0) print_row(a, &rows[nrows]);
        oob += rows[nrows].wrong[0] > 0 ? rows[nrows].wrong[0] : 0;
        oob += rows[nrows].wrong[1] > 0 ? rows[nrows].wrong[1] : 0;
        avg_bus += (rows[nrows].busbw[0] + rows[nrows].busbw[1]) / 2;
        nrows++;
        if ((!a->nsizes && a->min_bytes == a->max_bytes) || bytes == 0 || (a->nsizes && nrows >= a->nsizes)) break;
    }
    getrusage(RUSAGE_SELF, &ru);
    rss = (double)ru.ru_maxrss / 1024.0;    /* kilobytes on Linux */
    rss_all = world > 0 ? (double*)calloc((size_t)world, sizeof(double)) : NULL;
    if (st == DM_OK && rss_all) st = dm_all_gather(c, &rss, rss_all, 1, DM_FLOAT64);
    if (dm_rank(c) == 0 && st == DM_OK) {
        printf("# Out of bounds values : %lld %s\n", oob, oob ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %g \n", nrows ? avg_bus / nrows : 0.0);
        if (a->report_rss)
            for (r = 0; r < world; r++) printf("# Peak RSS rank %d     : %.1f MiB\n", r, rss_all[r]);
        printf("#\n");
        if (a->json_path) write_json(a, c, rows, nrows, rss_all);
    }
    free(rss_all);
    free(b.send);
    free(b.recv);
    if (st != DM_OK) return st;
    return oob ? DM_ERR_INTERNAL : DM_OK;
}

/* >>launch  -np N: fork N ranks that meet through a file store in a fresh directory. */
static volatile sig_atomic_t g_alarm;
static void on_alarm(int sig) { (void)sig; g_alarm = 1; }

static int run_tcp_rank(const bench_args* a, int rank, int world, const char* url) {
    dm_tcp_desc d;
    dm_collective* c = NULL;
    dm_status st;
    memset(&d, 0, sizeof(d));
    d.rank = rank;
    d.world_size = world;
    d.store_url = url;
    d.ifname = "lo";
    d.chunk_bytes = a->chunk_bytes;
    d.timeout_ms = a->deadline_s > 0 ? (int)(a->deadline_s * 1000) : 0;
    st = dm_tcp_create(&d, &c);
    if (st != DM_OK) { fprintf(stderr, "rank %d: create failed: %s\n", rank, dm_strerror(st)); return 1; }
    st = (dm_status)rank_main(c, (void*)a);
    dm_destroy(c);
    return st == DM_OK ? 0 : 1;
}

static int launch_local(const bench_args* a) {
    char dir[] = "/tmp/dm_bench_XXXXXX", url[128], cmd[160];
    pid_t pids[256];
    int r, n = a->nprocs, failed = 0, alive;
    if (n < 1 || n > 256) { fprintf(stderr, "dm_bench: -np must be 1..256\n"); return 2; }
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 2; }
    snprintf(url, sizeof(url), "file://%s", dir);
    fflush(stdout);
    for (r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            int rc = run_tcp_rank(a, r, n, url);
            fflush(NULL);               /* _exit skips stdio: the footer must reach the terminal */
            _exit(rc);
        }
        if (pids[r] < 0) { perror("fork"); n = r; failed = 1; break; }
    }
    signal(SIGALRM, on_alarm);
    if (a->deadline_s > 0) alarm((unsigned)ceil(a->deadline_s));
    for (alive = n; alive > 0;) {
        int status;
        pid_t p = waitpid(-1, &status, 0);
        if (p < 0) {
            if (g_alarm) {
                fprintf(stderr, "dm_bench: deadline of %g s passed: killing the ranks\n", a->deadline_s);
                for (r = 0; r < n; r++) kill(pids[r], SIGKILL);
                while (waitpid(-1, NULL, 0) > 0) {}
                failed = 2;
                break;
            }
            continue;
        }
        alive--;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            if (!failed) failed = 1;
            /* One rank failed: the others fail by themselves (peer lost) or by their deadline. */
        }
    }
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "dm_bench: could not remove %s\n", dir);
    return failed;
}

int main(int argc, char** argv) {
    bench_args a;
    if (parse_args(argc, argv, &a) != 0) return 2;
    if (strcmp(a.backend, "thread") == 0) {
        dm_fake_desc d;
        memset(&d, 0, sizeof(d));
        d.world_size = a.nprocs > 0 ? a.nprocs : 1;
        return dm_thread_world_run(&d, rank_main, &a) == DM_OK ? 0 : 1;
    }
    if (a.nprocs > 0) return launch_local(&a);
    {   /* under a launcher */
        dm_collective* c = NULL;
        dm_init_desc d;
        dm_status st;
        memset(&d, 0, sizeof(d));
        d.logger.func = dm_log_stderr;
        st = dm_init(&d, &c);
        if (st != DM_OK) { fprintf(stderr, "dm_bench: init failed: %s\n", dm_strerror(st)); return 1; }
        st = (dm_status)rank_main(c, &a);
        dm_destroy(c);
        return st == DM_OK ? 0 : 1;
    }
}
