/* dm_bench: distmesh collective benchmark with nccl-tests' flags and table.

     dm_bench --np 4 -b 8 -e 64M -f 2             all_reduce float sum on 4 local ranks over TCP
     dm_bench -O all_gather --np 2 -b 1K -e 16M   other collectives: all_reduce, all_gather,
                                                  reduce_scatter, broadcast, barrier (one row of
                                                  0 bytes, whatever the sizes)
     torchrun --nproc-per-node 4 dm_bench ...     under a launcher (no --np): dm_init from the env

   nccl-tests' flags, same letters and meanings (long forms too, e.g. --minbytes 8):
     -b minbytes -e maxbytes (K/M/G suffixes), -f stepfactor, -i stepbytes (used when the factor
     is not above 1; default 1M), -n iters, -w warmup iters (untimed, before each size and
     placement), -m agg iters (collectives per timed iteration; time = total / (iters x m)),
     -c check count (0: no check, #wrong N/A), -o sum|prod|max|min|avg|all (mean = avg),
     -d float|half|bfloat16|double|int8|uint8|int32|uint32|int64|uint64|all (distmesh's names
     float32, float16, float64 too), -r root, -a 0|1|2|3 (the time reported across ranks:
     rank 0's, the mean, the min, the max; default 1), -C 0|1 (1: the time column is rank 0's own
     host time until its calls returned, not aggregated by -a; the bandwidths still use -a's),
     -z 0|1 (distmesh collectives always return complete; 1 adds nccl-tests' barrier after each
     timed collective), -t threads per process (1 only), -g GPUs per thread (0 or 1: the ranks
     run on CPUs, one per thread), -G CUDA graph launches (0 only), -p parallel init (0|1, one
     thread: nothing to parallelise).
   distmesh's own (long options; the short forms still work):
     -O, --coll NAME   collective (default all_reduce)
     -np, --np N       fork N ranks on 127.0.0.1, meeting through a file store in a fresh directory
     -B, --backend tcp|thread   thread: N ranks on N threads of this process
     -J, --json FILE   results as JSON (per row: time as printed and per-rank min/mean/max/rank 0)
     --timeout S       overall deadline in seconds (ranks are killed, exit status 2) and each
                       call's deadline
     --chunk BYTES     TCP pipelining unit
     -S, --sizes LIST  sizes ("8,4K,64M") instead of the -b/-e sweep
     -R, --rss         report each rank's peak RSS
     -I, --inplace-only  in place only: one buffer, for memory measurements
     --hosts H         with --np or --backend thread: H simulated hosts, ranks in contiguous
                       blocks (DISTMESH_TEST_HOST_ID / dm_fake_desc.host_of)
     --setup           report the setup: seconds from launch until the last rank's create
                       returned, the slowest create call, and open fds per rank (and rank 0's)
                       once every rank's create has returned
     --store file|rank0  with --np: where the ranks meet: a file store in a fresh directory
                       (default), or a TCP store that rank 0 hosts (as dm_init does)
     --launcher-env    with --np: each rank also gets RANK, WORLD_SIZE, LOCAL_RANK and
                       LOCAL_WORLD_SIZE (its --hosts block), as torchrun sets them
     --compress none|bf16|int8  all_reduce through dm_all_reduce_compressed with this mode
                       (no error-feedback state); the check then takes the compressed bound
                       (int8: world x the largest |value| / 254 per element, bf16: 2^-8 relative)
   Sizes follow nccl-tests: all_reduce/broadcast size = bytes per rank; all_gather size = bytes
   received (world x count); reduce_scatter size = bytes sent (world x count). algbw = size /
   time; busbw = algbw x 2(n-1)/n for all_reduce, (n-1)/n for all_gather and reduce_scatter, 1 for
   broadcast (GB/s = 1e9 B/s). Exit status: 0 all good, 1 a wrong value or a failed call, 2 bad
   arguments or the deadline passed. */
/* The build links distmesh.c's object (DM_LINKS_DISTMESH_C: one compile of the implementation
   for every program of a configuration); compiled alone, this file holds the implementation. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE     /* what the implementation defines for the code after it */
#endif
#ifndef DM_LINKS_DISTMESH_C
#define DISTMESH_IMPLEMENTATION
#endif
#include "distmesh.h"
#include "../tests/test_world.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

typedef enum { OP_ALL_REDUCE, OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_BROADCAST, OP_BARRIER, OP_COUNT } bench_op;
static const char* const k_op_names[] = { "all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier" };

/* nccl-tests' type names, in the order of ncclDataType_t (the order of -d all). */
static const struct { dm_dtype dtype; const char* name; } k_types[] = {
    { DM_INT8, "int8" },       { DM_UINT8, "uint8" },     { DM_INT32, "int32" },  { DM_UINT32, "uint32" },
    { DM_INT64, "int64" },     { DM_UINT64, "uint64" },   { DM_FLOAT16, "half" }, { DM_FLOAT32, "float" },
    { DM_FLOAT64, "double" },  { DM_BFLOAT16, "bfloat16" },
};
#define NTYPES ((int)(sizeof(k_types) / sizeof(k_types[0])))
/* nccl-tests' op names, in the order of ncclRedOp_t (= dm_reduce_op's order). */
static const char* const k_redop_names[DM_REDUCE_OP_COUNT] = { "sum", "prod", "max", "min", "avg" };

enum { AVG_RANK0, AVG_MEAN, AVG_MIN, AVG_MAX };

typedef struct bench_args {
    size_t min_bytes, max_bytes, step_bytes;
    double step_factor;
    int iters, warmup, agg_iters, check, root, nprocs, report_rss, inplace_only;
    int hosts, report_setup;    /* --hosts: simulated hosts for --np / thread; --setup */
    int store_rank0, launcher_env;  /* --store rank0; --launcher-env */
    int average, blocking, report_cputime;
    dm_dtype dtypes[NTYPES];
    int ndtypes;
    dm_reduce_op redops[DM_REDUCE_OP_COUNT];
    int nredops;
    dm_dtype dtype;            /* the combination being run */
    dm_reduce_op redop;
    bench_op op;
    const char* backend;       /* "tcp" or "thread" */
    const char* json_path;
    double deadline_s;
    size_t chunk_bytes;
    size_t sizes[64];          /* -S list; nsizes 0 -> the -b/-e sweep */
    int nsizes;
    dm_compress compress;      /* --compress: DM_COMPRESS_DEFAULT when not given */
} bench_args;

typedef struct bench_row {
    dm_dtype dtype;
    dm_reduce_op redop;
    size_t bytes, count;
    double us[2], algbw[2], busbw[2];
    double us_rank0[2], us_min[2], us_mean[2], us_max[2];   /* each rank's time, aggregated */
    unsigned long long calls[2];                             /* collectives in the timed loop */
    long long wrong[2];
    char algo[2][32];           /* dm_last_algorithm after the timed calls */
} bench_row;

static const char* type_name(dm_dtype t) {
    int i;
    for (i = 0; i < NTYPES; i++)
        if (k_types[i].dtype == t) return k_types[i].name;
    return "invalid";
}

/* >>args */
static int parse_compress(const char* v, bench_args* a) {
    if (strcmp(v, "none") == 0) a->compress = DM_COMPRESS_NONE;
    else if (strcmp(v, "bf16") == 0) a->compress = DM_COMPRESS_BF16;
    else if (strcmp(v, "int8") == 0) a->compress = DM_COMPRESS_INT8;
    else {
        fprintf(stderr, "dm_bench: --compress %s: expected none, bf16 or int8\n", v);
        return -1;
    }
    return 0;
}
static int parse_size(const char* flag, const char* s, size_t* out) {
    char* end = NULL;
    double v;
    errno = 0;
    v = strtod(s, &end);
    if (end == s || errno || v < 0) goto bad;
    switch (*end) {
        case 'K': case 'k': v *= 1024.0; end++; break;
        case 'M': case 'm': v *= 1024.0 * 1024.0; end++; break;
        case 'G': case 'g': v *= 1024.0 * 1024.0 * 1024.0; end++; break;
        default: break;
    }
    if (*end == 'B' || *end == 'b') end++;
    if (*end) goto bad;
    *out = (size_t)v;
    return 0;
bad:
    fprintf(stderr, "dm_bench: %s %s: not a size (bytes, K/M/G suffixes)\n", flag, s);
    return -1;
}
static int parse_int(const char* flag, const char* s, int* out) {
    char* end = NULL;
    long v;
    errno = 0;
    v = strtol(s, &end, 0);
    if (end == s || *end || errno || v < -2147483647L || v > 2147483647L) {
        fprintf(stderr, "dm_bench: %s %s: not an integer\n", flag, s);
        return -1;
    }
    *out = (int)v;
    return 0;
}
static int parse_double(const char* flag, const char* s, double* out) {
    char* end = NULL;
    errno = 0;
    *out = strtod(s, &end);
    if (end == s || *end || errno) {
        fprintf(stderr, "dm_bench: %s %s: not a number\n", flag, s);
        return -1;
    }
    return 0;
}
static int parse_dtypes(const char* s, bench_args* a) {
    static const char* alias[][2] = { { "float32", "float" }, { "float16", "half" }, { "float64", "double" },
                                      { "int", "int32" },     { "bf16", "bfloat16" }, { "char", "int8" } };
    int i;
    if (strcmp(s, "all") == 0) {
        for (i = 0; i < NTYPES; i++) a->dtypes[i] = k_types[i].dtype;
        a->ndtypes = NTYPES;
        return 0;
    }
    for (i = 0; i < (int)(sizeof(alias) / sizeof(alias[0])); i++)
        if (strcmp(s, alias[i][0]) == 0) s = alias[i][1];
    for (i = 0; i < NTYPES; i++)
        if (strcmp(s, k_types[i].name) == 0) { a->dtypes[0] = k_types[i].dtype; a->ndtypes = 1; return 0; }
    fprintf(stderr, "dm_bench: -d %s: unknown type (float, half, bfloat16, double, int8, uint8, int32, uint32, "
                    "int64, uint64 or all)\n", s);
    return -1;
}
static int parse_redops(const char* s, bench_args* a) {
    int i;
    if (strcmp(s, "all") == 0) {
        for (i = 0; i < DM_REDUCE_OP_COUNT; i++) a->redops[i] = (dm_reduce_op)i;
        a->nredops = DM_REDUCE_OP_COUNT;
        return 0;
    }
    if (strcmp(s, "mean") == 0) s = "avg";
    for (i = 0; i < DM_REDUCE_OP_COUNT; i++)
        if (strcmp(s, k_redop_names[i]) == 0) { a->redops[0] = (dm_reduce_op)i; a->nredops = 1; return 0; }
    fprintf(stderr, "dm_bench: -o %s: unknown op (sum, prod, max, min, avg or all)\n", s);
    return -1;
}
static void usage(FILE* f) {
    fprintf(f, "usage: dm_bench [nccl-tests flags] [distmesh flags]\n"
               "  nccl-tests: -b minbytes -e maxbytes -f stepfactor -i stepbytes -n iters -w warmup_iters\n"
               "    -m agg_iters -c check -o sum|prod|max|min|avg|all -d float|half|bfloat16|double|int8|uint8|\n"
               "    int32|uint32|int64|uint64|all -r root -a 0|1|2|3 (rank0|avg|min|max) -C 0|1 (report cputime)\n"
               "    -z 0|1 (blocking) -t 1 (threads per process) -g 0|1 (GPUs per thread) -G 0 -p 0|1\n"
               "  distmesh: -O, --coll all_reduce|all_gather|reduce_scatter|broadcast|barrier  -np, --np N\n"
               "    -B, --backend tcp|thread  -J, --json FILE  --timeout SECONDS  --chunk BYTES\n"
               "    -S, --sizes 8,4K,64M  -R, --rss  -I, --inplace-only  --hosts H  --setup\n"
               "    --store file|rank0  --launcher-env  -h, --help\n");
}

enum opt_id {
    O_MINB, O_MAXB, O_STEPB, O_STEPF, O_ITERS, O_WARMUP, O_AGG, O_CHECK, O_REDOP, O_DTYPE, O_ROOT, O_THREADS,
    O_GPUS, O_AVERAGE, O_BLOCKING, O_CPUTIME, O_GRAPH, O_PINIT, O_COLL, O_NP, O_BACKEND, O_JSON, O_TIMEOUT,
    O_CHUNK, O_SIZES, O_RSS, O_INPLACE, O_HOSTS, O_SETUP, O_STORE, O_LAUNCHER_ENV, O_COMPRESS, O_HELP
};
static const struct { const char* sh; const char* lg; int has_value; int id; } k_opts[] = {
    { "-b", "--minbytes", 1, O_MINB },      { "-e", "--maxbytes", 1, O_MAXB },
    { "-i", "--stepbytes", 1, O_STEPB },    { "-f", "--stepfactor", 1, O_STEPF },
    { "-n", "--iters", 1, O_ITERS },        { "-w", "--warmup_iters", 1, O_WARMUP },
    { "-m", "--agg_iters", 1, O_AGG },      { "-c", "--check", 1, O_CHECK },
    { "-o", "--op", 1, O_REDOP },           { "-d", "--datatype", 1, O_DTYPE },
    { "-r", "--root", 1, O_ROOT },          { "-t", "--nthreads", 1, O_THREADS },
    { "-g", "--ngpus", 1, O_GPUS },         { "-a", "--average", 1, O_AVERAGE },
    { "-z", "--blocking", 1, O_BLOCKING },  { "-C", "--report_cputime", 1, O_CPUTIME },
    { "-G", "--cudagraph", 1, O_GRAPH },    { "-p", "--parallel_init", 1, O_PINIT },
    { "-O", "--coll", 1, O_COLL },          { "-np", "--np", 1, O_NP },
    { "-B", "--backend", 1, O_BACKEND },    { "-J", "--json", 1, O_JSON },
    { NULL, "--timeout", 1, O_TIMEOUT },    { NULL, "--chunk", 1, O_CHUNK },
    { "-S", "--sizes", 1, O_SIZES },        { "-R", "--rss", 0, O_RSS },
    { "-I", "--inplace-only", 0, O_INPLACE }, { NULL, "--hosts", 1, O_HOSTS },
    { NULL, "--setup", 0, O_SETUP },        { NULL, "--store", 1, O_STORE },
    { NULL, "--launcher-env", 0, O_LAUNCHER_ENV }, { NULL, "--compress", 1, O_COMPRESS },
    { "-h", "--help", 0, O_HELP },
};
#define NOPTS ((int)(sizeof(k_opts) / sizeof(k_opts[0])))

/* One option: "-b 8", "-b8", "--minbytes 8", "--minbytes=8". Returns its index in k_opts and
   sets *value (NULL for flags), or -1. */
static int match_opt(int argc, char** argv, int* i, const char** value) {
    const char* f = argv[*i];
    int k;
    *value = NULL;
    for (k = 0; k < NOPTS; k++) {
        const char* sh = k_opts[k].sh;
        const char* attached = NULL;
        size_t n = strlen(k_opts[k].lg);
        int exact = sh && strcmp(f, sh) == 0;
        int as_long = strncmp(f, k_opts[k].lg, n) == 0 && (f[n] == 0 || f[n] == '=');
        int glued = sh && k_opts[k].has_value && strlen(sh) == 2 && f[0] == '-' && f[1] == sh[1] && f[2] &&
                    strcmp(f, "-np") != 0;
        if (!exact && !as_long && !glued) continue;
        if (as_long && f[n] == '=') attached = f + n + 1;
        else if (glued) attached = f + 2;
        if (!k_opts[k].has_value) {
            if (attached) return -1;
            return k;
        }
        if (attached) { *value = attached; return k; }
        if (*i + 1 >= argc) { fprintf(stderr, "dm_bench: %s needs a value\n", f); return -2; }
        *value = argv[++*i];
        return k;
    }
    return -1;
}

/* 0: run; 1: --help printed; -1: bad arguments (message printed). */
static int parse_args(int argc, char** argv, bench_args* a) {
    int i, threads = 1, gpus = 1, graphs = 0, pinit = 0;
    memset(a, 0, sizeof(*a));
    a->min_bytes = 32 * 1024 * 1024; a->max_bytes = 32 * 1024 * 1024;
    a->step_bytes = 1024 * 1024; a->step_factor = 1;
    a->iters = 20; a->warmup = 5; a->agg_iters = 1; a->check = 1; a->average = AVG_MEAN;
    a->dtypes[0] = DM_FLOAT32; a->ndtypes = 1; a->redops[0] = DM_SUM; a->nredops = 1;
    a->op = OP_ALL_REDUCE; a->backend = "tcp";
    for (i = 1; i < argc; i++) {
        const char* f = argv[i];
        const char* v = NULL;
        int k = match_opt(argc, argv, &i, &v), rc = 0;
        if (k == -2) return -1;
        if (k < 0) { fprintf(stderr, "dm_bench: unknown option %s\n", f); usage(stderr); return -1; }
        switch (k_opts[k].id) {
            case O_MINB: rc = parse_size(f, v, &a->min_bytes); break;
            case O_MAXB: rc = parse_size(f, v, &a->max_bytes); break;
            case O_STEPB: rc = parse_size(f, v, &a->step_bytes); break;
            case O_STEPF: rc = parse_double(f, v, &a->step_factor); break;
            case O_ITERS: rc = parse_int(f, v, &a->iters); break;
            case O_WARMUP: rc = parse_int(f, v, &a->warmup); break;
            case O_AGG: rc = parse_int(f, v, &a->agg_iters); break;
            case O_CHECK: rc = parse_int(f, v, &a->check); break;
            case O_REDOP: rc = parse_redops(v, a); break;
            case O_DTYPE: rc = parse_dtypes(v, a); break;
            case O_ROOT: rc = parse_int(f, v, &a->root); break;
            case O_THREADS: rc = parse_int(f, v, &threads); break;
            case O_GPUS: rc = parse_int(f, v, &gpus); break;
            case O_AVERAGE: rc = parse_int(f, v, &a->average); break;
            case O_BLOCKING: rc = parse_int(f, v, &a->blocking); break;
            case O_CPUTIME: rc = parse_int(f, v, &a->report_cputime); break;
            case O_GRAPH: rc = parse_int(f, v, &graphs); break;
            case O_PINIT: rc = parse_int(f, v, &pinit); break;
            case O_NP: rc = parse_int(f, v, &a->nprocs); break;
            case O_BACKEND: a->backend = v; break;
            case O_JSON: a->json_path = v; break;
            case O_TIMEOUT: rc = parse_double(f, v, &a->deadline_s); break;
            case O_CHUNK: rc = parse_size(f, v, &a->chunk_bytes); break;
            case O_RSS: a->report_rss = 1; break;
            case O_INPLACE: a->inplace_only = 1; break;
            case O_HOSTS: rc = parse_int(f, v, &a->hosts); break;
            case O_COMPRESS: rc = parse_compress(v, a); break;
            case O_SETUP: a->report_setup = 1; break;
            case O_STORE:
                if (strcmp(v, "rank0") == 0) a->store_rank0 = 1;
                else if (strcmp(v, "file") != 0) { fprintf(stderr, "dm_bench: --store %s: file or rank0\n", v); rc = -1; }
                break;
            case O_LAUNCHER_ENV: a->launcher_env = 1; break;
            case O_HELP: usage(stdout); return 1;
            case O_COLL: {
                int c, found = 0;
                for (c = 0; c < OP_COUNT; c++) if (strcmp(v, k_op_names[c]) == 0) { a->op = (bench_op)c; found = 1; }
                if (!found) { fprintf(stderr, "dm_bench: unknown collective %s\n", v); rc = -1; }
                break;
            }
            default: {  /* O_SIZES */
                char* list = strdup(v);
                char* tok;
                a->nsizes = 0;
                for (tok = strtok(list, ","); tok && rc == 0; tok = strtok(NULL, ",")) {
                    if (a->nsizes == 64) { fprintf(stderr, "dm_bench: %s: at most 64 sizes\n", f); rc = -1; break; }
                    rc = parse_size(f, tok, &a->sizes[a->nsizes++]);
                }
                free(list);
                if (rc == 0 && a->nsizes == 0) { fprintf(stderr, "dm_bench: %s: no sizes\n", f); rc = -1; }
                break;
            }
        }
        if (rc) return -1;
    }
    if (threads != 1) {
        fprintf(stderr, "dm_bench: -t %d: only one thread per process is supported (nccl-tests' threads per "
                        "process); start more ranks with --np N or a launcher\n", threads);
        return -1;
    }
    if (gpus != 0 && gpus != 1) {
        fprintf(stderr, "dm_bench: -g %d: dm_bench runs its ranks on CPUs, one per thread; -g (GPUs per thread) "
                        "takes 0 or 1\n", gpus);
        return -1;
    }
    if (graphs != 0) {
        fprintf(stderr, "dm_bench: -G %d: CUDA graphs need a GPU backend; dm_bench runs on CPUs (-G 0 only)\n", graphs);
        return -1;
    }
    if (pinit != 0 && pinit != 1) { fprintf(stderr, "dm_bench: -p takes 0 or 1\n"); return -1; }
    if (a->blocking != 0 && a->blocking != 1) { fprintf(stderr, "dm_bench: -z takes 0 or 1\n"); return -1; }
    if (a->report_cputime != 0 && a->report_cputime != 1) { fprintf(stderr, "dm_bench: -C takes 0 or 1\n"); return -1; }
    if (a->average < AVG_RANK0 || a->average > AVG_MAX) {
        fprintf(stderr, "dm_bench: -a %d: takes 0 (rank 0), 1 (mean), 2 (min) or 3 (max)\n", a->average);
        return -1;
    }
    if (a->nsizes) {
        int k;
        a->min_bytes = a->max_bytes = a->sizes[0];
        for (k = 1; k < a->nsizes; k++) {
            if (a->sizes[k] < a->min_bytes) a->min_bytes = a->sizes[k];
            if (a->sizes[k] > a->max_bytes) a->max_bytes = a->sizes[k];
        }
    }
    if (a->iters < 1 || a->warmup < 0 || a->agg_iters < 1 || a->check < 0 || a->min_bytes > a->max_bytes ||
        (!a->nsizes && a->min_bytes < a->max_bytes && a->step_factor <= 1 && a->step_bytes == 0)) {
        fprintf(stderr, "dm_bench: need -n >= 1, -w >= 0, -m >= 1, -c >= 0, -b <= -e and a step (-f > 1 or -i > 0)\n");
        return -1;
    }
    if (strcmp(a->backend, "tcp") != 0 && strcmp(a->backend, "thread") != 0) {
        fprintf(stderr, "dm_bench: --backend must be tcp or thread\n");
        return -1;
    }
    if (a->op == OP_ALL_GATHER || a->op == OP_BROADCAST || a->op == OP_BARRIER) { a->redops[0] = DM_SUM; a->nredops = 1; }  /* no op */
    if (a->op == OP_BARRIER) { a->ndtypes = 1; a->nsizes = 1; a->sizes[0] = 0; a->min_bytes = a->max_bytes = 0; }  /* one row */
    return 0;
}

/* >>data  Small integers that every dtype holds exactly; results that do not fit wrap (integers) or
   overflow (half) step by step, as the library's do. */
static double pattern(int rank, size_t i, int span) { return (double)((rank * 7 + (int)(i % 13)) % span); }
static double pattern_prod(int rank, size_t i) { return (double)(1 + ((rank + (int)(i % 5)) % 2)); }

static void store_value(dm_dtype t, void* buf, size_t i, double v) {
    switch (t) {   /* integers through int64: an out-of-range value wraps instead of being undefined */
        case DM_INT8: ((int8_t*)buf)[i] = (int8_t)(uint8_t)(int64_t)v; break;
        case DM_UINT8: ((uint8_t*)buf)[i] = (uint8_t)(int64_t)v; break;
        case DM_INT32: ((int32_t*)buf)[i] = (int32_t)(uint32_t)(int64_t)v; break;
        case DM_UINT32: ((uint32_t*)buf)[i] = (uint32_t)(int64_t)v; break;
        case DM_INT64: ((int64_t*)buf)[i] = (int64_t)v; break;
        case DM_UINT64: ((uint64_t*)buf)[i] = (uint64_t)(int64_t)v; break;
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
static int is_int(dm_dtype t) { return t <= DM_UINT64; }
static double as_stored(dm_dtype t, double v) {
    unsigned char tmp[8];
    store_value(t, tmp, 0, v);
    return load_value(t, tmp, 0);
}
static double value_of(const bench_args* a, int rank, size_t i) {
    /* bfloat16 holds integers exactly only up to 256: values below 4 keep sums of 64 ranks exact */
    return a->redop == DM_PROD ? pattern_prod(rank, i) : pattern(rank, i, a->dtype == DM_BFLOAT16 ? 4 : 16);
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
        acc = as_stored(a->dtype, acc);   /* each step stored: wraps (integers), overflows (half) */
    }
    if (a->redop == DM_MEAN) {
        if (is_int(a->dtype)) acc = trunc(acc / world);
        else acc = acc / world;
    }
    return acc;
}
static int close_enough(const bench_args* a, int world, double got, double want) {
    double tol = a->dtype == DM_FLOAT16 || a->dtype == DM_BFLOAT16 ? 1e-2 : a->dtype == DM_FLOAT32 ? 1e-6 : 0;
    if (a->compress == DM_COMPRESS_INT8 || a->compress == DM_COMPRESS_BF16) {   /* values below 16: */
        double lim = a->compress == DM_COMPRESS_INT8 ? world * 16.0 / 254 : world * 16.0 / 256;
        return fabs(got - want) <= lim + 1e-3 * fabs(want);   /* distmesh.h >>functions compression */
    }
    if (!is_int(a->dtype) && a->redop == DM_MEAN) return fabs(got - want) <= tol * fabs(want) + tol;
    return got == want;
}

/* >>run one size */
typedef struct bench_bufs { void* send; void* recv; size_t send_bytes, recv_bytes; } bench_bufs;

/* Elements per rank for a size. */
static size_t count_for(const bench_args* a, size_t bytes, int world) {
    size_t esize = dm_dtype_size(a->dtype);
    if (a->op == OP_ALL_GATHER || a->op == OP_REDUCE_SCATTER) return bytes / esize / (size_t)world;
    if (a->op == OP_BARRIER) return 0;
    return bytes / esize;
}

static dm_status run_once(const bench_args* a, dm_collective* c, const bench_bufs* b, size_t count, int in_place) {
    size_t esize = dm_dtype_size(a->dtype), block = count * esize;
    unsigned char* recv = (unsigned char*)b->recv;
    unsigned char* send = (unsigned char*)b->send;
    switch (a->op) {
        case OP_ALL_REDUCE:
            if (a->compress != DM_COMPRESS_DEFAULT)
                return dm_all_reduce_compressed(c, in_place ? NULL : send, in_place ? send : recv, count, a->dtype,
                                                a->redop, a->compress, NULL);
            return dm_all_reduce(c, in_place ? NULL : send, in_place ? send : recv, count, a->dtype, a->redop);
        case OP_ALL_GATHER:
            return dm_all_gather(c, in_place ? recv + (size_t)dm_rank(c) * block : send, recv, count, a->dtype);
        case OP_REDUCE_SCATTER:
            return dm_reduce_scatter(c, send, in_place ? send + (size_t)dm_rank(c) * block : recv, count,
                                     a->dtype, a->redop);
        case OP_BARRIER:
            return dm_barrier(c);
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
        case OP_BARRIER: break;
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
            for (i = 0; i < count; i++) wrong += !close_enough(a, world, load_value(a->dtype, out, i), expected_reduce(a, world, i));
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
                wrong += !close_enough(a, world, load_value(a->dtype, out, i), expected_reduce(a, world, (size_t)rank * count + i));
            break;
        }
        case OP_BARRIER: break;
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
    if (op == OP_BARRIER) return 0.0;
    return (double)(world - 1) / world;
}

/* -c: check-many times (fresh inputs each), stopping at the first wrong run; nccl-tests' count. */
static dm_status check_runs(const bench_args* a, dm_collective* c, const bench_bufs* b, size_t count, int ip,
                            long long* out) {
    int k;
    dm_status st;
    *out = -1;
    for (k = 0; k < a->check; k++) {
        double wrong;
        prepare(a, c, b, count, ip);
        if ((st = run_once(a, c, b, count, ip)) != DM_OK) return st;
        wrong = (double)count_wrong(a, c, b, count, ip);
        if ((st = dm_all_reduce(c, NULL, &wrong, 1, DM_FLOAT64, DM_SUM)) != DM_OK) return st;
        *out = (long long)wrong;
        if (*out) break;
    }
    return DM_OK;
}

/* Each rank's time, seen by every rank as rank 0's, the mean, the min and the max. */
static dm_status aggregate_time(dm_collective* c, double t, double* rank0, double* mean, double* mn, double* mx) {
    dm_status st;
    *rank0 = *mean = *mn = *mx = t;
    if ((st = dm_broadcast(c, rank0, 1, DM_FLOAT64, 0)) != DM_OK) return st;
    if ((st = dm_all_reduce(c, NULL, mean, 1, DM_FLOAT64, DM_MEAN)) != DM_OK) return st;
    if ((st = dm_all_reduce(c, NULL, mn, 1, DM_FLOAT64, DM_MIN)) != DM_OK) return st;
    return dm_all_reduce(c, NULL, mx, 1, DM_FLOAT64, DM_MAX);
}

/* One row: out-of-place then in-place; each checked, warmed up, then timed. */
static dm_status run_size(const bench_args* a, dm_collective* c, const bench_bufs* b, size_t bytes, bench_row* row) {
    int world = dm_world_size(c), ip, k, j;
    size_t count = count_for(a, bytes, world);
    memset(row, 0, sizeof(*row));
    row->dtype = a->dtype;
    row->redop = a->redop;
    row->count = count;
    row->bytes = count * dm_dtype_size(a->dtype) * ((a->op == OP_ALL_GATHER || a->op == OP_REDUCE_SCATTER) ? (size_t)world : 1);
    row->wrong[0] = -1;
    for (ip = a->inplace_only; ip < 2; ip++) {
        double t0, t, agg[4];
        uint64_t seq0;
        dm_status st;
        if ((st = check_runs(a, c, b, count, ip, &row->wrong[ip])) != DM_OK) return st;
        if (!a->check) prepare(a, c, b, count, ip);
        for (k = 0; k < a->warmup; k++)
            if ((st = run_once(a, c, b, count, ip)) != DM_OK) return st;
        if ((st = dm_barrier(c)) != DM_OK) return st;
        seq0 = dm_sequence(c);
        t0 = tw_now_s();
        for (k = 0; k < a->iters; k++)
            for (j = 0; j < a->agg_iters; j++) {
                if ((st = run_once(a, c, b, count, ip)) != DM_OK) return st;
                if (a->blocking && (st = dm_barrier(c)) != DM_OK) return st;
            }
        t = (tw_now_s() - t0) / ((double)a->iters * a->agg_iters);
        row->calls[ip] = (unsigned long long)(dm_sequence(c) - seq0);
        snprintf(row->algo[ip], sizeof(row->algo[ip]), "%s", dm_last_algorithm(c)[0] ? dm_last_algorithm(c) : "-");
        if ((st = aggregate_time(c, t, &agg[AVG_RANK0], &agg[AVG_MEAN], &agg[AVG_MIN], &agg[AVG_MAX])) != DM_OK) return st;
        row->us_rank0[ip] = agg[AVG_RANK0] * 1e6;
        row->us_mean[ip] = agg[AVG_MEAN] * 1e6;
        row->us_min[ip] = agg[AVG_MIN] * 1e6;
        row->us_max[ip] = agg[AVG_MAX] * 1e6;
        /* -C 1: rank 0's own time (it prints); bandwidths from -a's time either way */
        row->us[ip] = a->report_cputime ? t * 1e6 : agg[a->average] * 1e6;
        row->algbw[ip] = agg[a->average] > 0 ? (double)row->bytes / agg[a->average] / 1e9 : 0;
        row->busbw[ip] = row->algbw[ip] * bus_factor(a->op, world);
    }
    return DM_OK;
}

/* >>output  nccl-tests' layout. */
static void print_preamble(const bench_args* a, dm_collective* c) {
    int world = dm_world_size(c);
    printf("# distmesh dm_bench: %s, backend %s, transport %s, %d ranks\n", k_op_names[a->op], dm_backend_name(c),
           dm_transport_name(c), world);
    printf("# nThread 1 nGpus 0 minBytes %zu maxBytes %zu step: %g(%s) warmup iters: %d iters: %d agg iters: %d "
           "validation: %d graph: 0\n",
           a->min_bytes, a->max_bytes, a->step_factor > 1 ? a->step_factor : (double)a->step_bytes,
           a->step_factor > 1 ? "factor" : "bytes", a->warmup, a->iters, a->agg_iters, a->check);
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
    if (all && dm_all_gather(c, mine, all, 2, DM_INT64) == DM_OK && dm_rank(c) == 0)
        for (r = 0; r < world; r++)
            printf("#  Rank %2d Group  0 Pid %6lld on %10s device %2lld [cpu] CPU (local rank %lld)\n", r,
                   all[2 * r], host, all[2 * r + 1], all[2 * r + 1]);
    free(all);
}
static void print_header(void) {
    printf("#\n");
    printf("#                                                              out-of-place                       in-place          \n");
    printf("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong  algo\n");
    printf("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)              \n");
}
static int has_redop(const bench_args* a) { return a->op == OP_ALL_REDUCE || a->op == OP_REDUCE_SCATTER; }
static void print_row(const bench_args* a, const bench_row* row) {
    int ip;
    int root = a->op == OP_BROADCAST ? a->root : -1;
    printf("%12zu  %12zu  %8s  %6s  %6d", row->bytes, row->count, type_name(row->dtype),
           has_redop(a) ? k_redop_names[row->redop] : "none", root);
    for (ip = 0; ip < 2; ip++) {
        char wrong[24];
        double us = row->us[ip];
        if (row->wrong[ip] < 0) snprintf(wrong, sizeof(wrong), "N/A");
        else snprintf(wrong, sizeof(wrong), "%lld", row->wrong[ip]);
        printf(us >= 10000 ? "  %7.0f" : us >= 100 ? "  %7.1f" : "  %7.2f", us);
        printf("  %6.2f  %6.2f  %5s", row->algbw[ip], row->busbw[ip], wrong);
    }
    printf("  %s\n", row->algo[1]);      /* the in-place run's; both runs choose alike */
    fflush(stdout);
}
static void write_json(const bench_args* a, dm_collective* c, const bench_row* rows, int nrows, const double* rss_mib) {
    static const char* const pre[2] = { "oop", "ip" };
    FILE* f = fopen(a->json_path, "w");
    int i, r, ip;
    if (!f) { fprintf(stderr, "dm_bench: cannot write %s\n", a->json_path); return; }
    fprintf(f, "{\"backend\": \"%s\", \"transport\": \"%s\", \"collective\": \"%s\", \"ranks\": %d, \"dtype\": \"%s\", "
               "\"redop\": \"%s\", \"average\": %d, \"report_cputime\": %d, \"iters\": %d, \"agg_iters\": %d,\n \"rows\": [\n",
            dm_backend_name(c), dm_transport_name(c), k_op_names[a->op], dm_world_size(c),
            a->ndtypes > 1 ? "all" : type_name(a->dtypes[0]),
            !has_redop(a) ? "none" : a->nredops > 1 ? "all" : k_redop_names[a->redops[0]], a->average,
            a->report_cputime, a->iters, a->agg_iters);
    for (i = 0; i < nrows; i++) {
        const bench_row* w = &rows[i];
        fprintf(f, "  {\"bytes\": %zu, \"count\": %zu, \"type\": \"%s\", \"redop\": \"%s\", \"algo\": \"%s\"", w->bytes,
                w->count, type_name(w->dtype), has_redop(a) ? k_redop_names[w->redop] : "none", w->algo[1]);
        for (ip = 0; ip < 2; ip++)
            fprintf(f, ", \"%s_us\": %.3f, \"%s_algbw\": %.9g, \"%s_busbw\": %.9g, \"%s_wrong\": %lld, \"%s_us_rank0\": %.3f, "
                       "\"%s_us_mean\": %.3f, \"%s_us_min\": %.3f, \"%s_us_max\": %.3f, \"%s_calls\": %llu",
                    pre[ip], w->us[ip], pre[ip], w->algbw[ip], pre[ip], w->busbw[ip], pre[ip], w->wrong[ip], pre[ip],
                    w->us_rank0[ip], pre[ip], w->us_mean[ip], pre[ip], w->us_min[ip], pre[ip], w->us_max[ip], pre[ip],
                    w->calls[ip]);
        fprintf(f, "}%s\n", i + 1 < nrows ? "," : "");
    }
    fprintf(f, " ],\n \"peak_rss_mib\": [");
    for (r = 0; rss_mib && r < dm_world_size(c); r++) fprintf(f, "%s%.1f", r ? ", " : "", rss_mib[r]);
    fprintf(f, "]\n}\n");
    fclose(f);
}

/* >>rank body */
static size_t next_size(const bench_args* a, size_t bytes, int row_in_sweep) {
    if (a->nsizes) return row_in_sweep + 1 < a->nsizes ? a->sizes[row_in_sweep + 1] : (size_t)-1;
    if (a->min_bytes == a->max_bytes || bytes == 0) return (size_t)-1;
    return a->step_factor > 1 ? (size_t)((double)bytes * a->step_factor) : bytes + a->step_bytes;
}

static int rank_main(dm_collective* c, void* user) {
    bench_args args = *(const bench_args*)user;   /* each rank thread its own copy: dtype/redop change */
    bench_args* a = &args;
    int world = dm_world_size(c), nrows = 0, cap = 0, r, ti, oi;
    long long oob = 0;
    double avg_bus = 0, rss, *rss_all = NULL;
    bench_row* rows = NULL;
    bench_bufs b;
    dm_status st = DM_OK;
    struct rusage ru;
    if (a->root < 0 || a->root >= world) { fprintf(stderr, "dm_bench: root %d out of range\n", a->root); return DM_ERR_INVALID_ARG; }
    /* every buffer holds at most max_bytes: all_gather's receive and reduce_scatter's send are the size */
    b.send_bytes = a->max_bytes;
    b.recv_bytes = a->inplace_only && a->op != OP_ALL_GATHER ? 0 : a->max_bytes;   /* in place needs one buffer */
    b.send = malloc(b.send_bytes ? b.send_bytes : 1);
    b.recv = malloc(b.recv_bytes ? b.recv_bytes : 1);
    if (!b.send || !b.recv) { fprintf(stderr, "dm_bench: out of memory\n"); free(b.send); free(b.recv); return DM_ERR_OUT_OF_MEMORY; }
    memset(b.send, 0, b.send_bytes);
    memset(b.recv, 0, b.recv_bytes);
    if (dm_rank(c) == 0) print_preamble(a, c);
    print_rank_lines(c);
    if (dm_rank(c) == 0) print_header();
    for (ti = 0; ti < a->ndtypes && st == DM_OK; ti++)
        for (oi = 0; oi < a->nredops && st == DM_OK; oi++) {
            size_t bytes;
            int k = 0;
            a->dtype = a->dtypes[ti];
            a->redop = a->redops[oi];
            for (bytes = a->nsizes ? a->sizes[0] : a->min_bytes; bytes <= a->max_bytes; bytes = next_size(a, bytes, k++)) {
                if (nrows == cap) {
                    bench_row* grown = (bench_row*)realloc(rows, (size_t)(cap = cap ? 2 * cap : 64) * sizeof(*rows));
                    if (!grown) { st = DM_ERR_OUT_OF_MEMORY; break; }
                    rows = grown;
                }
                st = run_size(a, c, &b, bytes, &rows[nrows]);
                if (st != DM_OK) { fprintf(stderr, "rank %d: %s: %s\n", dm_rank(c), dm_status_name(st), dm_last_error(c)); break; }
                if (dm_rank(c) == 0) print_row(a, &rows[nrows]);
                oob += rows[nrows].wrong[0] > 0 ? rows[nrows].wrong[0] : 0;
                oob += rows[nrows].wrong[1] > 0 ? rows[nrows].wrong[1] : 0;
                avg_bus += a->inplace_only ? rows[nrows].busbw[1] : (rows[nrows].busbw[0] + rows[nrows].busbw[1]) / 2;
                nrows++;
            }
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
    free(rows);
    free(rss_all);
    free(b.send);
    free(b.recv);
    if (st != DM_OK) return st;
    return oob ? DM_ERR_INTERNAL : DM_OK;
}

/* >>setup  --setup: how long creating took and what it holds, over every rank. */
static double g_launch_s;       /* CLOCK_MONOTONIC when the launch began (inherited by forks) */
static dm_status report_setup(dm_collective* c, double call_s) {
    double mine[3], *all;
    int world = dm_world_size(c), r;
    dm_status st;
    mine[0] = tw_now_s() - g_launch_s;
    mine[1] = call_s;
    /* the descriptors a built group holds: counted once every rank's create has returned (a
       barrier), and the store's thread has had a moment to close what the others closed */
    if ((st = dm_barrier(c)) != DM_OK) return st;
    tw_sleep_ms(100);
    mine[2] = (double)tw_count_fds();
    all = (double*)calloc((size_t)world * 3, sizeof(double));
    if (!all) return DM_ERR_OUT_OF_MEMORY;
    st = dm_all_gather(c, mine, all, 3, DM_FLOAT64);
    if (st == DM_OK && dm_rank(c) == 0) {
        double launch = 0, call = 0, fds = 0, fsum = 0;
        for (r = 0; r < world; r++) {
            launch = all[3 * r] > launch ? all[3 * r] : launch;
            call = all[3 * r + 1] > call ? all[3 * r + 1] : call;
            fds = all[3 * r + 2] > fds ? all[3 * r + 2] : fds;
            fsum += all[3 * r + 2];
        }
        printf("# Setup: %d ranks, %d hosts, launch to last create %.3f s, slowest create call %.3f s, "
               "fds per rank max %.0f mean %.1f, rank 0 %.0f\n", world,
               dm_local_world_size(c) ? world / dm_local_world_size(c) : 0, launch, call, fds, fsum / world, all[2]);
    }
    free(all);
    return st;
}

/* >>launch  --np N: fork N ranks (tests/test_world.h) that meet through a file store in a fresh
   directory, or (--store rank0) through a TCP store that rank 0 hosts. */
/* A failed create has no object to hold its message: errors go to stderr. */
static void log_errors(dm_log_level level, dm_status st, const char* msg, const char* file, int line, void* user) {
    (void)st; (void)file; (void)line;
    if (level == DM_LOG_ERROR) fprintf(stderr, "rank %d: %s\n", (int)(intptr_t)user, msg);
}
typedef struct launch_ctx { const bench_args* a; const tw_store* store; } launch_ctx;
static int run_tcp_rank(int rank, void* ctx) {
    const bench_args* a = ((const launch_ctx*)ctx)->a;
    int world = a->nprocs;
    dm_tcp_desc d;
    dm_collective* c = NULL;
    dm_status st;
    double t0;
    tw_tcp_desc(&d, ((const launch_ctx*)ctx)->store, rank, world, a->deadline_s > 0 ? (int)(a->deadline_s * 1000) : 0);
    d.logger.func = log_errors;
    d.logger.user_data = (void*)(intptr_t)rank;
    d.chunk_bytes = a->chunk_bytes;
    if (a->hosts > 0) tw_sim_host((int)((long long)rank * a->hosts / world));
    if (a->launcher_env) {      /* rank r is on host r * H / N: its block's place and size */
        int h = a->hosts > 0 ? a->hosts : 1, host = (int)((long long)rank * h / world), first = 0, last = world, r;
        char v[16];
        for (r = 0; r < world; r++) {
            int hr = (int)((long long)r * h / world);
            if (hr < host) first = r + 1;
            if (hr > host && last == world) last = r;
        }
        snprintf(v, sizeof(v), "%d", rank); setenv("RANK", v, 1);
        snprintf(v, sizeof(v), "%d", world); setenv("WORLD_SIZE", v, 1);
        snprintf(v, sizeof(v), "%d", rank - first); setenv("LOCAL_RANK", v, 1);
        snprintf(v, sizeof(v), "%d", last - first); setenv("LOCAL_WORLD_SIZE", v, 1);
    }
    t0 = tw_now_s();
    st = dm_tcp_create(&d, &c);
    if (st != DM_OK) { fprintf(stderr, "rank %d: create failed: %s\n", rank, dm_strerror(st)); return 1; }
    if (a->report_setup && (st = report_setup(c, tw_now_s() - t0)) != DM_OK) {
        fprintf(stderr, "rank %d: setup report: %s\n", rank, dm_last_error(c));
        dm_destroy(c);
        return 1;
    }
    st = (dm_status)rank_main(c, (void*)a);
    dm_destroy(c);
    return st == DM_OK ? 0 : 1;
}

static int launch_local(const bench_args* a) {
    tw_store store;
    tw_world p;
    launch_ctx ctx;
    int r, n = a->nprocs, failed = 0;
    if (n < 1 || n > 1024) { fprintf(stderr, "dm_bench: --np must be 1..1024\n"); return 2; }
    if (a->hosts < 0 || a->hosts > n) { fprintf(stderr, "dm_bench: --hosts must be 1..%d\n", n); return 2; }
    g_launch_s = tw_now_s();
    if (a->store_rank0 ? tw_store_rank0(&store) != 0 : tw_store_file(&store, "dm_bench") != 0) {
        perror(a->store_rank0 ? "no free port" : "mkdtemp");
        return 2;
    }
    ctx.a = a;
    ctx.store = &store;
    memset(&p, 0, sizeof(p));
    p.alarm_s = a->deadline_s > 0 ? (int)ceil(a->deadline_s) + 10 : -1;  /* the parent kills them first */
    p.quick_exit = true;                /* fflush + _exit: the footer reaches the terminal */
    if (tw_fork(&p, n, run_tcp_rank, &ctx) != 0) { perror("fork"); failed = 1; }
    /* no --timeout: no limit (a year), as a launcher would wait */
    tw_reap(&p, a->deadline_s > 0 ? ceil(a->deadline_s) : 365 * 86400.0);
    if (p.timed_out) {
        fprintf(stderr, "dm_bench: deadline of %g s passed: killed the ranks\n", a->deadline_s);
        failed = 2;
    }
    for (r = 0; r < p.n && failed != 2; r++) {
        int st = p.status[r];
        if (st != -1 && WIFSIGNALED(st)) fprintf(stderr, "dm_bench: rank %d was killed by signal %d\n", r, WTERMSIG(st));
        /* One rank failed: the others fail by themselves (peer lost) or by their deadline. */
        if (tw_exit_code(&p, r) != 0 && !failed) failed = 1;
    }
    if (tw_store_close(&store) != 0) fprintf(stderr, "dm_bench: could not remove %s\n", store.dir);
    return failed;
}

int main(int argc, char** argv) {
    bench_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc > 0 ? 0 : 2;
    if (strcmp(a.backend, "thread") == 0) {
        dm_fake_desc d;
        int* host_of = NULL, r;
        dm_status st;
        memset(&d, 0, sizeof(d));
        d.world_size = a.nprocs > 0 ? a.nprocs : 1;
        d.timeout_ms = a.deadline_s > 0 ? (int)(a.deadline_s * 1000) : 0;
        if (a.hosts > 0) {
            if (!(host_of = (int*)calloc((size_t)d.world_size, sizeof(int)))) return 2;
            for (r = 0; r < d.world_size; r++) host_of[r] = (int)((long long)r * a.hosts / d.world_size);
            d.host_of = host_of;
        }
        st = dm_thread_world_run(&d, rank_main, &a);
        free(host_of);
        return st == DM_OK ? 0 : 1;
    }
    if (a.nprocs > 0) return launch_local(&a);
    {   /* under a launcher */
        dm_collective* c = NULL;
        dm_init_desc d;
        dm_status st;
        memset(&d, 0, sizeof(d));
        d.logger.func = dm_log_stderr;
        d.timeout_ms = a.deadline_s > 0 ? (int)(a.deadline_s * 1000) : 0;
        st = dm_init(&d, &c);
        if (st != DM_OK) { fprintf(stderr, "dm_bench: init failed: %s\n", dm_strerror(st)); return 1; }
        st = (dm_status)rank_main(c, &a);
        dm_destroy(c);
        return st == DM_OK ? 0 : 1;
    }
}
