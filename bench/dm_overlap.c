/* dm_overlap: how much of an all-reduce dm_all_reduce_async hides behind computation.

     dm_overlap                       2 local ranks, 16 MiB float32 sum, compute ~ t_comm
     DISTMESH_TRANSPORT=tcp dm_overlap   the same over loopback sockets (default: shared memory)
     dm_overlap --compute sleep       "compute" that leaves the CPU idle (a GPU kernel, say)

   Each rank is a forked process (file store in a fresh directory, dm_tcp_create on 127.0.0.1).
   Per repetition, each case starts after a barrier and is timed on every rank; a case's time is
   the slowest rank's, and the table shows medians over the repetitions:
     t_comm     dm_all_reduce of --bytes, alone (blocking)
     t_async    dm_all_reduce_async + dm_wait, nothing in between (the async path's own cost)
     t_comp     the compute loop alone, calibrated to --ratio x t_comm
     t_serial   compute, then the blocking all-reduce
     t_overlap  dm_all_reduce_async, compute, dm_wait
   hidden = (t_serial - t_overlap) / t_comm: 1 when the communication is entirely hidden, 0 when
   overlapping gains nothing (it can also go negative, when running both at once costs more
   than running them one after the other). The target: hidden >= 0.5 at 2 ranks, 16 MiB,
   compute ~ t_comm.

   Compute kernels (--compute): spin (arithmetic on a few KiB that stay in L1: a CPU core kept
   busy, little memory traffic), stream (a += b * s over two 32 MiB arrays: memory bandwidth,
   which the shared-memory transport needs too), sleep (nanosleep: the CPU is free, as while a
   GPU computes). The progress thread that runs the queued all-reduce needs a core of its own to
   run beside a busy compute loop: with R ranks, R compute loops and R progress threads want 2R
   cores. The table's header says how many this machine has.

   Options: --np N (ranks, default 2), --bytes SIZE (K/M/G, default 16M), --reps N (default 20),
   --warmup N (default 3), --ratio X (t_comp / t_comm, default 1), --compute spin|stream|sleep,
   --transport auto|shm|tcp (default DISTMESH_TRANSPORT, else auto), --json FILE (also write the
   JSON line there), --timeout S (overall deadline, default 300; each call's too), --require F
   (exit 3 if hidden < F). Prints the table and one JSON line (starting with '{') on stdout.
   Exit status: 0, 1 (a failed call or a wrong result), 2 (bad arguments or the deadline),
   3 (--require not met). */
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
#include <time.h>
#include <unistd.h>

enum { C_COMM, C_ASYNC, C_COMP, C_SERIAL, C_OVERLAP, NCASES };
static const char* const k_case_names[NCASES] = { "t_comm", "t_async", "t_comp", "t_serial", "t_overlap" };
static const char* const k_case_what[NCASES] = {
    "blocking all_reduce alone",
    "all_reduce_async + wait, nothing between",
    "compute loop alone",
    "compute, then blocking all_reduce",
    "all_reduce_async, compute, wait",
};
enum { K_SPIN, K_STREAM, K_SLEEP };
static const char* const k_kernel_names[] = { "spin", "stream", "sleep" };

typedef struct args {
    int np, reps, warmup, kernel;
    size_t bytes;
    double ratio, timeout_s, require;
    const char* transport;
    const char* json_path;
} args;

/* >>compute  One unit of work per kernel; compute(units) runs `units` of them. */
#define STREAM_FLOATS (8u << 20)          /* 32 MiB per array */
static float* g_sa;
static float* g_sb;
static volatile float g_sink;

static void compute(int kernel, double units) {
    long n = (long)units, u;
    if (kernel == K_SLEEP) {              /* units are microseconds */
        struct timespec ts;
        ts.tv_sec = (time_t)(units / 1e6);
        ts.tv_nsec = (long)(fmod(units, 1e6) * 1e3);
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
        return;
    }
    if (kernel == K_SPIN) {               /* 1 unit: 64 floats x 64 multiply-adds, in registers/L1 */
        float v[64];
        int i, j;
        for (i = 0; i < 64; i++) v[i] = (float)i * 1e-3f;
        for (u = 0; u < n; u++)
            for (j = 0; j < 64; j++)
                for (i = 0; i < 64; i++) v[i] = v[i] * 0.9999f + 1e-4f;
        g_sink = v[0] + v[63];
        return;
    }
    {                                     /* stream: 1 unit = 64 KiB of a (read + write) and b */
        size_t chunk = 16384, pos = 0, i;
        for (u = 0; u < n; u++) {
            float* a = g_sa + pos;
            const float* b = g_sb + pos;
            for (i = 0; i < chunk; i++) a[i] += b[i] * 1e-7f;
            pos += chunk;
            if (pos + chunk > STREAM_FLOATS) pos = 0;
        }
        g_sink = g_sa[0];
    }
}

static int cmp_double(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return x < y ? -1 : x > y;
}
static double median(const double* v, int n) {
    double* s = (double*)malloc((size_t)n * sizeof(double));
    double m;
    if (!s || n < 1) { free(s); return 0; }
    memcpy(s, v, (size_t)n * sizeof(double));
    qsort(s, (size_t)n, sizeof(double), cmp_double);
    m = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    free(s);
    return m;
}
static double vmin(const double* v, int n) { double m = v[0]; int i; for (i = 1; i < n; i++) if (v[i] < m) m = v[i]; return m; }
static double vmax(const double* v, int n) { double m = v[0]; int i; for (i = 1; i < n; i++) if (v[i] > m) m = v[i]; return m; }

#define TRY(call)                                                                            \
    do {                                                                                     \
        st = (call);                                                                         \
        if (st != DM_OK) {                                                                   \
            fprintf(stderr, "rank %d: %s: %s: %s\n", rank, #call, dm_status_name(st),        \
                    dm_last_error(c));                                                       \
            goto done;                                                                       \
        }                                                                                    \
    } while (0)

/* One timed run of case k on this rank (after a barrier). */
static dm_status run_case(dm_collective* c, const args* a, int k, const float* send, float* recv,
                          size_t count, double units, double* out_s) {
    dm_request* req = NULL;
    dm_status st;
    int rank = dm_rank(c);
    double t0;
    TRY(dm_barrier(c));
    t0 = tw_now_s();
    switch (k) {
        case C_COMM:
            TRY(dm_all_reduce(c, send, recv, count, DM_FLOAT32, DM_SUM));
            break;
        case C_ASYNC:
            TRY(dm_all_reduce_async(c, send, recv, count, DM_FLOAT32, DM_SUM, &req));
            TRY(dm_wait(req));
            break;
        case C_COMP:
            compute(a->kernel, units);
            break;
        case C_SERIAL:
            compute(a->kernel, units);
            TRY(dm_all_reduce(c, send, recv, count, DM_FLOAT32, DM_SUM));
            break;
        default:
            /* send and recv belong to the library from here until dm_wait returns; the compute
               loop touches neither. */
            TRY(dm_all_reduce_async(c, send, recv, count, DM_FLOAT32, DM_SUM, &req));
            compute(a->kernel, units);
            TRY(dm_wait(req));
            break;
    }
    *out_s = tw_now_s() - t0;
done:
    return st;
}

/* Median of 7 blocking all-reduces, the slowest rank's (what compute is calibrated to). */
static dm_status time_comm(dm_collective* c, const args* a, const float* send, float* recv,
                           size_t count, double* out_s) {
    double t[7];
    int i;
    dm_status st = DM_OK;
    for (i = 0; i < 7 && st == DM_OK; i++) st = run_case(c, a, C_COMM, send, recv, count, 0, &t[i]);
    if (st != DM_OK) return st;
    *out_s = median(t, 7);
    return dm_all_reduce(c, NULL, out_s, 1, DM_FLOAT64, DM_MAX);
}

/* Units of compute that take `target` seconds on this rank; then agreed: the ranks' mean. */
static dm_status calibrate(dm_collective* c, int kernel, double target, double* units) {
    double u = 1, t = 0, t0, samples[5];
    int i;
    if (kernel == K_SLEEP) {
        *units = target * 1e6;
        return DM_OK;
    }
    while (t < 0.02 && u < 1e12) {        /* grow until one run takes >= 20 ms */
        u *= 2;
        t0 = tw_now_s();
        compute(kernel, u);
        t = tw_now_s() - t0;
    }
    for (i = 0; i < 5; i++) {
        t0 = tw_now_s();
        compute(kernel, u);
        samples[i] = tw_now_s() - t0;
    }
    *units = u * target / median(samples, 5);
    return dm_all_reduce(c, NULL, units, 1, DM_FLOAT64, DM_MEAN);
}

/* Calibration alone runs one loop per rank, and t_comm was measured once; the timed cases run
   after a barrier, all ranks at once, on cores that may be shared (SMT siblings, a VM's vCPUs,
   other jobs). So three rounds of correction, each timing the blocking all-reduce and the
   compute loop alternately, as the timed cases will, and scaling the compute to ratio x the
   all-reduce's median (the slowest rank's times). */
static dm_status refine(dm_collective* c, const args* a, const float* send, float* recv, size_t count,
                        double* units) {
    double t[10], m_comm, m_comp;
    int round, i, rank = dm_rank(c);
    dm_status st = DM_OK;
    if (a->ratio <= 0) return DM_OK;
    for (round = 0; round < 3; round++) {
        for (i = 0; i < 5; i++) {
            TRY(run_case(c, a, C_COMM, send, recv, count, 0, &t[i]));
            TRY(run_case(c, a, C_COMP, send, recv, count, *units, &t[5 + i]));
        }
        TRY(dm_all_reduce(c, NULL, t, 10, DM_FLOAT64, DM_MAX));
        m_comm = median(t, 5);
        m_comp = median(t + 5, 5);
        if (m_comp > 0) *units *= a->ratio * m_comm / m_comp;
    }
done:
    return st;
}

/* The 1-minute load average when the run started: other work on the machine takes cores the
   progress threads need, so it goes with the figures. */
static double g_load1 = -1;

/* The most overlap could hide: all of the shorter of compute and communication. */
static double ideal_hidden(const double* med) {
    double shorter = med[C_COMP] < med[C_COMM] ? med[C_COMP] : med[C_COMM];
    return med[C_COMM] > 0 ? shorter / med[C_COMM] : 0;
}

static int write_json(FILE* f, const args* a, dm_collective* c, const double* med, double hidden, long cpus) {
    int k;
    fprintf(f, "{\"bench\":\"dm_overlap\",\"np\":%d,\"bytes\":%zu,\"dtype\":\"float32\",\"op\":\"sum\","
            "\"backend\":\"%s\",\"transport\":\"%s\",\"compute\":\"%s\",\"ratio\":%g,\"reps\":%d,\"cpus\":%ld",
            dm_world_size(c), a->bytes, dm_backend_name(c), dm_transport_name(c), k_kernel_names[a->kernel],
            a->ratio, a->reps, cpus);
    fprintf(f, ",\"loadavg1\":%.2f", g_load1);
    for (k = 0; k < NCASES; k++) fprintf(f, ",\"%s_ms\":%.4f", k_case_names[k], med[k] * 1e3);
    fprintf(f, ",\"hidden_fraction\":%.4f,\"ideal_hidden_fraction\":%.4f,\"target\":0.5}\n", hidden,
            ideal_hidden(med));
    return ferror(f) ? -1 : 0;
}

static int rank_main(dm_collective* c, const args* a) {
    size_t count = a->bytes / sizeof(float), i;
    int rank = dm_rank(c), world = dm_world_size(c), r, k, order;
    float* send = (float*)malloc(count * sizeof(float));
    float* recv = (float*)malloc(count * sizeof(float));
    double* t = (double*)calloc((size_t)a->reps * NCASES, sizeof(double));
    double med[NCASES], mn[NCASES], mx[NCASES], t_comm = 0, units = 0, hidden;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    long wrong = 0;
    dm_status st = DM_OK;

    if (a->kernel == K_STREAM) {
        g_sa = (float*)calloc(STREAM_FLOATS, sizeof(float));
        g_sb = (float*)malloc(STREAM_FLOATS * sizeof(float));
        if (g_sb) for (i = 0; i < STREAM_FLOATS; i++) g_sb[i] = (float)(i % 7);
    }
    if (!send || !recv || !t || (a->kernel == K_STREAM && (!g_sa || !g_sb))) {
        fprintf(stderr, "rank %d: out of memory\n", rank);
        st = DM_ERR_OUT_OF_MEMORY;
        goto done;
    }
    for (i = 0; i < count; i++) send[i] = (float)((size_t)rank + i % 5);

    /* Warm up: links, shared-memory rings, the progress thread, the pages of both buffers. */
    for (r = 0; r < a->warmup; r++) {
        double dummy;
        TRY(run_case(c, a, C_COMM, send, recv, count, 0, &dummy));
        TRY(run_case(c, a, C_ASYNC, send, recv, count, 0, &dummy));
    }
    TRY(time_comm(c, a, send, recv, count, &t_comm));
    TRY(calibrate(c, a->kernel, a->ratio * t_comm, &units));
    TRY(refine(c, a, send, recv, count, &units));

    /* The cases rotate from one repetition to the next so slow drifts (frequency, page cache)
       do not favour any of them. */
    for (r = 0; r < a->reps; r++)
        for (order = 0; order < NCASES; order++) {
            k = (order + r) % NCASES;
            TRY(run_case(c, a, k, send, recv, count, units, &t[(size_t)k * (size_t)a->reps + (size_t)r]));
        }
    /* Each repetition's time is the slowest rank's. */
    TRY(dm_all_reduce(c, NULL, t, (size_t)a->reps * NCASES, DM_FLOAT64, DM_MAX));

    /* The last all-reduce left sum over ranks of send in recv. */
    for (i = 0; i < count; i++) {
        float expect = (float)((size_t)world * (i % 5)) + (float)(world * (world - 1) / 2);
        if (recv[i] != expect) wrong++;
    }
    TRY(dm_all_reduce(c, NULL, &wrong, 1, DM_INT64, DM_SUM));

    for (k = 0; k < NCASES; k++) {
        med[k] = median(t + (size_t)k * (size_t)a->reps, a->reps);
        mn[k] = vmin(t + (size_t)k * (size_t)a->reps, a->reps);
        mx[k] = vmax(t + (size_t)k * (size_t)a->reps, a->reps);
    }
    hidden = med[C_COMM] > 0 ? (med[C_SERIAL] - med[C_OVERLAP]) / med[C_COMM] : 0;
    if (rank == 0) {
        printf("# dm_overlap: all_reduce float32 sum, %zu bytes, %d ranks (%s backend, %s transport)\n",
               a->bytes, world, dm_backend_name(c), dm_transport_name(c));
        printf("# compute=%s calibrated to %.2f x t_comm (first estimate %.3f ms), %d repetitions, %ld CPUs online, "
               "load average %.2f at start\n", k_kernel_names[a->kernel], a->ratio, t_comm * 1e3, a->reps,
               cpus, g_load1);
        printf("# times: the slowest rank's, per repetition; median [min, max] over repetitions\n");
        printf("#%-10s %-42s %10s %10s %10s\n", "case", "what", "median_ms", "min_ms", "max_ms");
        for (k = 0; k < NCASES; k++)
            printf(" %-10s %-42s %10.3f %10.3f %10.3f\n", k_case_names[k], k_case_what[k], med[k] * 1e3,
                   mn[k] * 1e3, mx[k] * 1e3);
        printf("# hidden = (t_serial - t_overlap) / t_comm = %.3f (target >= 0.5)%s\n", hidden,
               hidden >= 0.5 ? "" : "  -- below target");
        printf("# at most min(t_comp, t_comm) / t_comm = %.3f could be hidden (t_comp / t_comm = %.2f)\n",
               ideal_hidden(med), med[C_COMM] > 0 ? med[C_COMP] / med[C_COMM] : 0);
        printf("# wrong values: %ld\n", wrong);
        write_json(stdout, a, c, med, hidden, cpus);
        if (a->json_path) {
            FILE* f = fopen(a->json_path, "w");
            if (!f || write_json(f, a, c, med, hidden, cpus) != 0) {
                fprintf(stderr, "dm_overlap: cannot write %s\n", a->json_path);
                st = DM_ERR_INTERNAL;
            }
            if (f) fclose(f);
        }
        fflush(stdout);
    }
    if (st == DM_OK && wrong) st = DM_ERR_INTERNAL;
    if (st == DM_OK && a->require > 0 && hidden < a->require) st = (dm_status)3;
done:
    free(send);
    free(recv);
    free(t);
    free(g_sa);
    free(g_sb);
    return (int)st;
}

/* >>launch  fork --np ranks (tests/test_world.h) meeting through a file store in a fresh
   directory. */
typedef struct launch_ctx { const args* a; const tw_store* store; } launch_ctx;
static int run_rank(int rank, void* ctx) {
    const args* a = ((const launch_ctx*)ctx)->a;
    dm_tcp_desc d;
    dm_collective* c = NULL;
    dm_status st;
    int rc;
    tw_tcp_desc(&d, ((const launch_ctx*)ctx)->store, rank, a->np, (int)(a->timeout_s * 1000));
    d.transport = a->transport;        /* NULL: DISTMESH_TRANSPORT, else auto */
    d.logger.func = dm_log_stderr;
    st = dm_tcp_create(&d, &c);
    if (st != DM_OK) {
        fprintf(stderr, "rank %d: create failed: %s\n", rank, dm_strerror(st));
        return 1;
    }
    rc = rank_main(c, a);
    dm_destroy(c);
    return rc == 3 ? 3 : rc != 0 ? 1 : 0;
}

/* Exit status: 0, 1 (a rank failed), 2 (the deadline passed), 3 (--require not met). */
static int launch(const args* a) {
    tw_store store;
    tw_world p;
    launch_ctx ctx;
    int r, rc = 0;
    if (tw_store_file(&store, "dm_overlap") != 0) { perror("mkdtemp"); return 2; }
    if (getloadavg(&g_load1, 1) != 1) g_load1 = -1;
    ctx.a = a;
    ctx.store = &store;
    memset(&p, 0, sizeof(p));
    p.alarm_s = (int)ceil(a->timeout_s) + 10;   /* the parent kills them first */
    p.quick_exit = true;
    if (tw_fork(&p, a->np, run_rank, &ctx) != 0) { perror("fork"); rc = 1; }
    tw_reap(&p, ceil(a->timeout_s));
    if (p.timed_out) {
        fprintf(stderr, "dm_overlap: deadline of %g s passed: killed the ranks\n", a->timeout_s);
        rc = 2;
    }
    for (r = 0; r < p.n && rc != 2; r++) {
        int code = tw_exit_code(&p, r);
        if (code < 0 || code >= 128) { if (!rc) rc = 1; }
        else if (code != 0 && rc != 1) rc = code;
    }
    if (tw_store_close(&store) != 0) fprintf(stderr, "dm_overlap: could not remove %s\n", store.dir);
    return rc;
}

static int parse_size(const char* s, size_t* out) {
    char* end = NULL;
    double v;
    errno = 0;
    v = strtod(s, &end);
    if (end == s || errno || v <= 0) return -1;
    switch (*end) {
        case 'K': case 'k': v *= 1024.0; end++; break;
        case 'M': case 'm': v *= 1048576.0; end++; break;
        case 'G': case 'g': v *= 1073741824.0; end++; break;
        default: break;
    }
    if (*end == 'B' || *end == 'b') end++;
    if (*end) return -1;
    *out = (size_t)v;
    return 0;
}

static int parse_double(const char* s, double* out) {
    char* end = NULL;
    errno = 0;
    *out = strtod(s, &end);
    return end == s || *end || errno ? -1 : 0;
}

static void usage(FILE* f) {
    fprintf(f, "usage: dm_overlap [--np N] [--bytes SIZE] [--reps N] [--warmup N] [--ratio X]\n"
               "                  [--compute spin|stream|sleep] [--transport auto|shm|tcp]\n"
               "                  [--json FILE] [--timeout S] [--require F]\n");
}

int main(int argc, char** argv) {
    args a;
    int i;
    memset(&a, 0, sizeof(a));
    a.np = 2; a.reps = 20; a.warmup = 3; a.kernel = K_SPIN;
    a.bytes = 16u << 20; a.ratio = 1.0; a.timeout_s = 300;
    for (i = 1; i < argc; i += 2) {       /* every option takes a value */
        const char* o = argv[i];
        const char* v = i + 1 < argc ? argv[i + 1] : NULL;
        double d = 0;
        if (strcmp(o, "-h") == 0 || strcmp(o, "--help") == 0) { usage(stdout); return 0; }
        if (!v) goto bad;
        if (strcmp(o, "--np") == 0) { if (parse_double(v, &d) || d < 1 || d > 64) goto bad; a.np = (int)d; }
        else if (strcmp(o, "--bytes") == 0) { if (parse_size(v, &a.bytes) || a.bytes < sizeof(float)) goto bad; }
        else if (strcmp(o, "--reps") == 0) { if (parse_double(v, &d) || d < 1 || d > 10000) goto bad; a.reps = (int)d; }
        else if (strcmp(o, "--warmup") == 0) { if (parse_double(v, &d) || d < 0 || d > 10000) goto bad; a.warmup = (int)d; }
        else if (strcmp(o, "--ratio") == 0) { if (parse_double(v, &a.ratio) || a.ratio < 0) goto bad; }
        else if (strcmp(o, "--timeout") == 0) { if (parse_double(v, &a.timeout_s) || a.timeout_s <= 0 || a.timeout_s > 86400) goto bad; }
        else if (strcmp(o, "--require") == 0) { if (parse_double(v, &a.require)) goto bad; }
        else if (strcmp(o, "--json") == 0) a.json_path = v;
        else if (strcmp(o, "--transport") == 0) a.transport = v;
        else if (strcmp(o, "--compute") == 0) {
            if (strcmp(v, "spin") == 0) a.kernel = K_SPIN;
            else if (strcmp(v, "stream") == 0) a.kernel = K_STREAM;
            else if (strcmp(v, "sleep") == 0) a.kernel = K_SLEEP;
            else goto bad;
        } else goto bad;
    }
    return launch(&a);
bad:
    fprintf(stderr, "dm_overlap: bad argument near \"%s\"\n", argv[i]);
    usage(stderr);
    return 2;
}
