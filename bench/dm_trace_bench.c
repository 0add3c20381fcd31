/* dm_trace_bench: what the flight recorder and the timeline cost (issue 19), and the demo run
   behind the README's timeline picture.

     dm_trace_bench                   overhead: 8 B float32 all_reduce on 2 local ranks (shm)
     dm_trace_bench --demo DIR        a few training-like steps on 4 ranks, rank 3 slow, timeline in DIR
     dm_trace_bench --cpu             the CPU per operation alone: one process, world-1 Fake collectives

   Overhead: every rank makes three worlds at once, one per configuration, each with its own
   environment when it is made (the core reads it then):
     off    DISTMESH_FLIGHT_RECORDER=0, no DISTMESH_TRACE: the one test of c->trace per op
     fr     the default: the flight recorder on (64 entries), no timeline
     trace  the flight recorder and DISTMESH_TRACE=<--dir> (the timeline written to disk)
   and times blocks of --iters blocking all_reduces on them in turn (off, fr, trace, off, ...), so
   a slow spell of the machine hits every configuration alike. A block's time per op is the slowest
   rank's (each rank times the block after a barrier; rank 0 collects with an all_reduce MAX). The
   result: per configuration the median over --blocks blocks, and the ratios fr/off and
   trace/off (the bound: trace/off <= 1.03 at 8 B).

   --cpu: the same three configurations on Fake collectives of world 1 in this one process (an
   operation that does next to nothing: no peers, no waits, no spinning), blocks in turn; prints
   per configuration the median ns per operation and fr-off, trace-off: what the recorder and the
   timeline add to every operation's CPU, the part of the ratio above that machine noise and the
   peers' waiting do not blur.

   Options: --np N (2), --bytes B (8), --iters N (2000), --blocks N (15), --transport shm|tcp
   (shm), --dir DIR (build/bench/trace: the timeline files, and the store), --timeout S (120),
   --control (all three worlds "off": how far apart identical worlds measure, the noise floor),
   --only off|fr|trace (all three worlds that one: to profile it alone), --cpu, --pin (rank r
   on CPU r mod the CPUs there are, Linux: unpinned, two ranks on a 2-core machine share a core
   now and then, and an 8 B all_reduce then takes ~4x as long, a second regime in the numbers).
   Prints one key=value line per configuration and one with the ratios. Exit status 0, 1 (a
   failed call), 2 (bad arguments or the deadline). */
#define DISTMESH_IMPLEMENTATION
#include "distmesh.h"
#include "../tests/test_world.h"

#include <errno.h>
#include <sched.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { CFG_OFF, CFG_FR, CFG_TRACE, NCFG };
static const char* const k_cfg[NCFG] = { "off", "fr", "trace" };

typedef struct args {
    int np, iters, blocks, timeout_s;
    size_t bytes;
    const char* transport;
    const char* dir;
    const char* demo;
} args;

/* --control: every world made "off", to see how far apart three identical worlds measure.
   --only CFG: every world made CFG (one configuration to profile alone). */
static int g_control, g_only = -1, g_cpu, g_pin;
static void set_cfg_env(int cfg, const char* trace_dir) {
    if (g_control) cfg = CFG_OFF;
    if (g_only >= 0) cfg = g_only;
    setenv("DISTMESH_FLIGHT_RECORDER", cfg == CFG_OFF ? "0" : "64", 1);
    unsetenv("DISTMESH_DUMP_DIR");
    if (cfg == CFG_TRACE) setenv("DISTMESH_TRACE", trace_dir, 1);
    else unsetenv("DISTMESH_TRACE");
}
/* World `name` of this rank over the file store in store_dir. */
static dm_status make_world(const args* a, int rank, const char* store_dir, const char* name, dm_collective** out) {
    dm_tcp_desc d;
    char url[PATH_MAX + 16], prefix[64];
    snprintf(url, sizeof(url), "file://%s", store_dir);
    snprintf(prefix, sizeof(prefix), "%s/", name);
    tw_tcp_desc(&d, NULL, rank, a->np, a->timeout_s * 1000);
    d.store_url = url;
    d.prefix = prefix;
    d.transport = a->transport;
    return dm_tcp_create(&d, out);
}
#define TRY(c, expr)                                                                              \
    do {                                                                                          \
        dm_status st_ = (expr);                                                                   \
        if (st_ != DM_OK) {                                                                       \
            fprintf(stderr, "rank %d: %s: %s (%s)\n", rank, #expr, dm_status_name(st_),           \
                    (c) ? dm_last_error(c) : "");                                                 \
            return 1;                                                                             \
        }                                                                                         \
    } while (0)

/* ---- overhead ---- */
static int overhead_rank(const args* a, int rank, const char* store_dir, const char* trace_dir) {
    dm_collective* w[NCFG] = { NULL, NULL, NULL };
    double* per_op = (double*)calloc((size_t)(NCFG * a->blocks), sizeof(double));
    size_t count = a->bytes / 4 ? a->bytes / 4 : 1;
    float* x = (float*)calloc(count, sizeof(float));
    int k, b, i, rc = 0;
    if (!per_op || !x) return 1;
    for (k = 0; k < NCFG; k++) {
        set_cfg_env(k, trace_dir);
        TRY(w[k], make_world(a, rank, store_dir, k_cfg[k], &w[k]));
        TRY(w[k], dm_barrier(w[k]));          /* the configuration is taken at the first op */
        for (i = 0; i < 200; i++) TRY(w[k], dm_all_reduce(w[k], NULL, x, count, DM_FLOAT32, DM_SUM));
    }
    for (b = 0; b < a->blocks && rc == 0; b++)
        for (k = 0; k < NCFG; k++) {
            double t0, t;
            TRY(w[k], dm_barrier(w[k]));
            t0 = tw_now_s();
            for (i = 0; i < a->iters; i++) TRY(w[k], dm_all_reduce(w[k], NULL, x, count, DM_FLOAT32, DM_SUM));
            t = (tw_now_s() - t0) / a->iters * 1e6;
            TRY(w[k], dm_all_reduce(w[k], NULL, &t, 1, DM_FLOAT64, DM_MAX));   /* the slowest rank's */
            per_op[k * a->blocks + b] = t;
        }
    if (rank == 0 && rc == 0) {
        double med[NCFG];
        for (k = 0; k < NCFG; k++) {
            med[k] = tw_median(per_op + k * a->blocks, a->blocks);
            printf("config=%s np=%d transport=%s bytes=%zu iters=%d blocks=%d median_us_per_op=%.3f\n", k_cfg[k], a->np,
                   dm_transport_name(w[k]), count * 4, a->iters, a->blocks, med[k]);
        }
        if (g_control) printf("control: all three worlds are \"off\"\n");
        printf("ratio fr/off=%.4f trace/off=%.4f trace/fr=%.4f\n", med[CFG_FR] / med[CFG_OFF], med[CFG_TRACE] / med[CFG_OFF],
               med[CFG_TRACE] / med[CFG_FR]);
    }
    for (k = 0; k < NCFG; k++) dm_destroy(w[k]);
    free(per_op);
    free(x);
    return rc;
}

/* ---- --cpu: one process, world-1 Fake collectives ---- */
static int cpu_overhead(const args* a, const char* trace_dir) {
    dm_collective* w[NCFG] = { NULL, NULL, NULL };
    double* per_op = (double*)calloc((size_t)(NCFG * a->blocks), sizeof(double));
    size_t count = a->bytes / 4 ? a->bytes / 4 : 1;
    float* x = (float*)calloc(count, sizeof(float));
    int k, b, i, rank = 0, rc = 0;
    dm_fake_desc d;
    memset(&d, 0, sizeof(d));
    if (!per_op || !x) return 1;
    for (k = 0; k < NCFG; k++) {
        set_cfg_env(k, trace_dir);
        TRY(w[k], dm_fake_create(&d, &w[k]));
        for (i = 0; i < 1000; i++) TRY(w[k], dm_all_reduce(w[k], NULL, x, count, DM_FLOAT32, DM_SUM));
    }
    for (b = 0; b < a->blocks; b++)
        for (k = 0; k < NCFG; k++) {
            double t0 = tw_now_s();
            for (i = 0; i < a->iters; i++) TRY(w[k], dm_all_reduce(w[k], NULL, x, count, DM_FLOAT32, DM_SUM));
            per_op[k * a->blocks + b] = (tw_now_s() - t0) / a->iters * 1e9;
        }
    {
        double med[NCFG];
        for (k = 0; k < NCFG; k++) {
            med[k] = tw_median(per_op + k * a->blocks, a->blocks);
            printf("config=%s np=1 backend=fake bytes=%zu iters=%d blocks=%d median_ns_per_op=%.1f\n", k_cfg[k],
                   count * 4, a->iters, a->blocks, med[k]);
        }
        printf("cpu_ns fr-off=%.1f trace-off=%.1f\n", med[CFG_FR] - med[CFG_OFF], med[CFG_TRACE] - med[CFG_OFF]);
    }
    for (k = 0; k < NCFG; k++) dm_destroy(w[k]);
    free(per_op);
    free(x);
    return rc;
}

/* ---- demo: a data-parallel step, gradients all-reduced in buckets behind "backward" ---- */
static int demo_rank(const args* a, int rank, const char* store_dir) {
    enum { STEPS = 6, BUCKETS = 4, BUCKET = 256 << 10 };
    dm_collective* c = NULL;
    float* grads = (float*)calloc((size_t)BUCKETS * BUCKET, sizeof(float));
    float loss = 1.0f;
    int s, k;
    if (!grads) return 1;
    setenv("DISTMESH_TRACE", a->demo, 1);
    TRY(c, make_world(a, rank, store_dir, "demo", &c));
    TRY(c, dm_broadcast(c, grads, BUCKET, DM_FLOAT32, 0));      /* the initial weights */
    for (s = 0; s < STEPS; s++) {
        dm_request* q[BUCKETS];
        tw_sleep_us(rank == 3 ? 5000 : 1500);                      /* forward; rank 3 is slow */
        for (k = BUCKETS - 1; k >= 0; k--) {                    /* backward, last layers first */
            tw_sleep_us(400);
            TRY(c, dm_all_reduce_async(c, NULL, grads + (size_t)k * BUCKET, BUCKET, DM_FLOAT32, DM_MEAN, &q[k]));
        }
        TRY(c, dm_wait_all(q, BUCKETS));
        TRY(c, dm_all_reduce(c, NULL, &loss, 1, DM_FLOAT32, DM_MEAN));
        if (s % 3 == 2) TRY(c, dm_barrier(c));                  /* a checkpoint */
    }
    dm_destroy(c);
    free(grads);
    return 0;
}

/* ---- launch ---- */
static int parse(int argc, char** argv, args* a) {
    int i;
    a->np = 2; a->iters = 2000; a->blocks = 15; a->timeout_s = 120; a->bytes = 8;
    a->transport = "shm"; a->dir = "build/bench/trace"; a->demo = NULL;
    for (i = 1; i < argc; i++) {
        const char* v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--control") == 0) { g_control = 1; continue; }
        if (strcmp(argv[i], "--cpu") == 0) { g_cpu = 1; continue; }
        if (strcmp(argv[i], "--pin") == 0) { g_pin = 1; continue; }
        if (!v) { fprintf(stderr, "dm_trace_bench: %s needs a value\n", argv[i]); return 2; }
        if (strcmp(argv[i], "--np") == 0) a->np = atoi(v);
        else if (strcmp(argv[i], "--iters") == 0) a->iters = atoi(v);
        else if (strcmp(argv[i], "--blocks") == 0) a->blocks = atoi(v);
        else if (strcmp(argv[i], "--bytes") == 0) a->bytes = (size_t)strtoull(v, NULL, 10);
        else if (strcmp(argv[i], "--transport") == 0) a->transport = v;
        else if (strcmp(argv[i], "--dir") == 0) a->dir = v;
        else if (strcmp(argv[i], "--timeout") == 0) a->timeout_s = atoi(v);
        else if (strcmp(argv[i], "--demo") == 0) a->demo = v;
        else if (strcmp(argv[i], "--only") == 0) {
            for (g_only = NCFG - 1; g_only >= 0 && strcmp(v, k_cfg[g_only]) != 0; g_only--) {}
            if (g_only < 0) { fprintf(stderr, "dm_trace_bench: --only off|fr|trace\n"); return 2; }
        }
        else { fprintf(stderr, "dm_trace_bench: unknown option %s\n", argv[i]); return 2; }
        i++;
    }
    if (a->demo) a->np = 4;
    if (a->np < 1 || a->np > 64 || a->iters < 1 || a->blocks < 1 || a->timeout_s < 1) {
        fprintf(stderr, "dm_trace_bench: bad --np, --iters, --blocks or --timeout\n");
        return 2;
    }
    return 0;
}
/* One forked rank (tests/test_world.h), pinned to a core with --pin. */
typedef struct rank_ctx { const args* a; const char *store, *trace_dir; } rank_ctx;
static int trace_rank(int rank, void* ctx) {
    const rank_ctx* x = (const rank_ctx*)ctx;
#if defined(__linux__)
    if (g_pin) {
        cpu_set_t set;
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        CPU_ZERO(&set);
        CPU_SET((int)(rank % (n > 0 ? n : 1)), &set);
        if (sched_setaffinity(0, sizeof(set), &set) != 0) perror("sched_setaffinity");
    }
#endif
    return x->a->demo ? demo_rank(x->a, rank, x->store) : overhead_rank(x->a, rank, x->store, x->trace_dir);
}
int main(int argc, char** argv) {
    args a;
    char store[PATH_MAX], trace_dir[600], cmd[PATH_MAX + 700];
    int rc = 0;
    rank_ctx x;
    tw_world p;
    if (parse(argc, argv, &a)) return 2;
    mkdir("build", 0777);
    mkdir("build/bench", 0777);
    mkdir(a.dir, 0777);
    if (a.demo) mkdir(a.demo, 0777);
    snprintf(store, sizeof(store), "%s/store.%ld", a.demo ? a.demo : a.dir, (long)getpid());
    snprintf(trace_dir, sizeof(trace_dir), "%s/timeline.%ld", a.dir, (long)getpid());
    if (mkdir(store, 0700) != 0) { perror(store); return 2; }
    if (store[0] != '/') {                       /* the file store wants an absolute path */
        char abs[PATH_MAX];
        if (!realpath(store, abs)) { perror(store); return 2; }
        snprintf(store, sizeof(store), "%s", abs);
    }
    fflush(stdout);
    if (g_cpu) {
        rc = cpu_overhead(&a, trace_dir);
        snprintf(cmd, sizeof(cmd), "rm -rf '%s' '%s'", store, trace_dir);
        if (system(cmd) != 0) {}
        return rc;
    }
    x.a = &a;
    x.store = store;
    x.trace_dir = trace_dir;
    memset(&p, 0, sizeof(p));
    p.alarm_s = a.timeout_s + 10;
    if (tw_fork(&p, a.np, trace_rank, &x) != 0) rc = 1;
    if (tw_reap(&p, a.timeout_s) != 0) rc = 1;
    if (p.timed_out) {
        fprintf(stderr, "dm_trace_bench: deadline of %d s passed\n", a.timeout_s);
        rc = 2;
    }
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' '%s'", store, trace_dir);   /* the timelines can be large */
    if (system(cmd) != 0) {}
    return rc;
}
