/* dm_loss: how long after a rank's death every survivor knows (issue 18, item 3).

     dm_loss                          4 local ranks, 20 trials, shared memory
     dm_loss --transport tcp          the same over loopback sockets
     dm_loss --np 8 --trials 50

   Per trial: --np ranks are forked (tests/test_world.h: file store in a fresh directory,
   dm_tcp_create on 127.0.0.1) and pass a barrier; every rank but the victim then enters an 8-byte float32 sum
   all-reduce, which blocks because the victim never joins. After --settle ms (so the survivors
   are well past spinning and yielding, asleep in their blocking wait) the parent sends the
   victim kill -9. Each survivor writes the CLOCK_MONOTONIC time at which its all-reduce
   returned, and its status, to a pipe; latency = that time - the time just before kill().
   The victim goes round the ranks (trial % np), so rank 0 dies too. While they settle, the
   survivors' CPU time (every thread, from /proc) says what a blocked wait costs when idle
   (use a --settle of a second or more: the kernel counts in 10 ms ticks).
   A trial's figure is its slowest survivor (when every survivor knew); printed per trial, then
   the median and worst over the trials, and the median over every survivor's own latency.

   Options: --np N (2..64, default 4), --trials N (default 20), --settle MS (default 100),
   --transport auto|shm|tcp (default shm), --timeout S (each call's deadline, default 10).
   Exit status: 0, 1 (a survivor failed with another status than DM_ERR_PEER_LOST, or did not
   report within the deadline), 2 (bad arguments). A benchmark, not a test: timings on a shared
   machine are noisy; `make bench-loss` runs it (not part of `make test`). */
#define DISTMESH_IMPLEMENTATION
#include "distmesh.h"
#include "../tests/test_world.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct loss_args {
    int np, trials, settle_ms, timeout_s;
    const char* transport;
} loss_args;

typedef struct report { int32_t rank, status; int64_t t_ns; } report;

/* utime + stime of a process, every thread, in clock ticks; -1 when unreadable. */
static long long cpu_ticks(pid_t pid) {
    char path[64], buf[1024], *p;
    long long ut = 0, st = 0;
    FILE* f;
    size_t n;
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    if (!(f = fopen(path, "r"))) return -1;
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    if (!(p = strrchr(buf, ')'))) return -1;    /* fields 14 and 15 after the command name */
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lld %lld", &ut, &st) != 2) return -1;
    return ut + st;
}
static double g_idle_ticks, g_idle_s;           /* survivors' CPU while settling, and for how long */


/* One rank (its collective made by the harness): barrier, "R" on the pipe; the victim then
   sleeps until killed, the others block in an all-reduce and report when and how it ended. */
static int rank_body(dm_collective* c, int rank, int world, void* arg) {
    int victim = *(const int*)arg;
    float x = 1.0f;
    report rep;
    (void)world;
    if (dm_barrier(c) != DM_OK) { fprintf(stderr, "rank %d: barrier: %s\n", rank, dm_last_error(c)); return 1; }
    if (tw_ready() != 0) return 1;
    if (rank == victim) {
        for (;;) pause();
    }
    rep.status = (int32_t)dm_all_reduce(c, NULL, &x, 1, DM_FLOAT32, DM_SUM);
    rep.t_ns = tw_now_ns();
    rep.rank = rank;
    return tw_report_bytes(&rep, sizeof(rep)) == 0 ? 0 : 1;
}


/* One trial; lat gets each survivor's latency in ms (np - 1 of them). 0, or 1 on a failure. */
static int trial(const loss_args* a, int victim, double* lat) {
    tw_store store;
    tw_world p;
    tw_dm_world w;
    int r, i, failed = 0;
    int64_t t_kill;
    double deadline;
    if (tw_store_file(&store, "dm_loss") != 0) { perror("dm_loss"); return 1; }
    memset(&p, 0, sizeof(p));
    p.alarm_s = a->timeout_s + 30 + a->settle_ms / 1000;    /* past the reads' deadline */
    p.reports = true;
    p.quick_exit = true;
    memset(&w, 0, sizeof(w));
    w.world = a->np;
    w.store = &store;
    w.transport = a->transport;
    w.timeout_ms = a->timeout_s * 1000;
    w.body = rank_body;
    w.arg = &victim;
    if (tw_dm_fork(&p, &w) != 0) { perror("dm_loss: fork"); failed = 1; }
    deadline = tw_now_s() + a->timeout_s + 20;
    if (!failed && !tw_read_ready(&p, a->np, deadline)) failed = 1;
    if (!failed) {
        long long t0[64], t1;
        int64_t s0 = tw_now_ns();
        for (r = 0; r < a->np; r++) t0[r] = cpu_ticks(p.pid[r]);
        tw_sleep_ms(a->settle_ms);
        for (r = 0; r < a->np; r++)
            if (r != victim && t0[r] >= 0 && (t1 = cpu_ticks(p.pid[r])) >= 0) {
                g_idle_ticks += (double)(t1 - t0[r]);
                g_idle_s += (double)(tw_now_ns() - s0) / 1e9;
            }
        t_kill = tw_now_ns();
        tw_signal(&p, victim, SIGKILL);
        for (i = 0; i < a->np - 1; i++) {
            report rep;
            if (!tw_read_exact(&p, &rep, sizeof(rep), deadline)) { failed = 1; break; }
            lat[i] = (double)(rep.t_ns - t_kill) / 1e6;
            if (rep.status != DM_ERR_PEER_LOST) {
                fprintf(stderr, "rank %d: all_reduce ended with %s, not DM_ERR_PEER_LOST\n", rep.rank,
                        dm_status_name((dm_status)rep.status));
                failed = 1;
            }
        }
    }
    if (failed) fprintf(stderr, "trial with victim %d failed\n", victim);
    tw_kill_all(&p);
    if (tw_store_close(&store) != 0) fprintf(stderr, "dm_loss: could not remove %s\n", store.dir);
    return failed;
}

static int parse(int argc, char** argv, loss_args* a) {
    int i;
    a->np = 4;
    a->trials = 20;
    a->settle_ms = 100;
    a->timeout_s = 10;
    a->transport = "shm";
    for (i = 1; i < argc; i++) {
        const char* v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--np") == 0 && v) a->np = atoi(argv[++i]);
        else if (strcmp(argv[i], "--trials") == 0 && v) a->trials = atoi(argv[++i]);
        else if (strcmp(argv[i], "--settle") == 0 && v) a->settle_ms = atoi(argv[++i]);
        else if (strcmp(argv[i], "--timeout") == 0 && v) a->timeout_s = atoi(argv[++i]);
        else if (strcmp(argv[i], "--transport") == 0 && v) a->transport = argv[++i];
        else {
            fprintf(stderr, "usage: dm_loss [--np N] [--trials N] [--settle MS] [--transport auto|shm|tcp] "
                            "[--timeout S]\n");
            return 2;
        }
    }
    if (a->np < 2 || a->np > 64 || a->trials < 1 || a->settle_ms < 0 || a->timeout_s < 1) {
        fprintf(stderr, "dm_loss: --np 2..64, --trials >= 1, --settle >= 0, --timeout >= 1\n");
        return 2;
    }
    return 0;
}

int main(int argc, char** argv) {
    loss_args a;
    double *all, *worst;
    int t, i, n = 0, failed = 0;
    if (parse(argc, argv, &a)) return 2;
    all = (double*)calloc((size_t)a.trials * (size_t)a.np, sizeof(double));
    worst = (double*)calloc((size_t)a.trials, sizeof(double));
    if (!all || !worst) return 1;
    printf("# dm_loss: kill -9 of 1 of %d local ranks blocked in an 8 B all-reduce, transport %s, %d trials, "
           "settle %d ms\n", a.np, a.transport, a.trials, a.settle_ms);
    for (t = 0; t < a.trials; t++) {
        int victim = t % a.np;
        double* lat = all + n;
        if (trial(&a, victim, lat)) { failed = 1; continue; }
        worst[t] = 0;
        printf("trial %2d  victim %d  survivors (ms):", t, victim);
        for (i = 0; i < a.np - 1; i++) {
            printf(" %7.2f", lat[i]);
            if (lat[i] > worst[t]) worst[t] = lat[i];
        }
        printf("   slowest %7.2f\n", worst[t]);
        n += a.np - 1;
    }
    if (failed) { printf("# some trials failed (see stderr)\n"); return 1; }
    {
        double all_med = tw_median(all, n), w_med = tw_median(worst, a.trials);
        double w_max = worst[a.trials - 1];    /* sorted by tw_median() */
        printf("# slowest survivor per trial: median %.2f ms, worst %.2f ms (%d trials)\n", w_med, w_max, a.trials);
        printf("# every survivor: median %.2f ms, worst %.2f ms (%d reports)\n", all_med, all[n - 1], n);
        if (g_idle_s > 0)
            printf("# blocked survivors while settling: %.2f%% of a core each (%.0f ticks over %.1f rank-seconds)\n",
                   100.0 * g_idle_ticks / (double)sysconf(_SC_CLK_TCK) / g_idle_s, g_idle_ticks, g_idle_s);
        printf("{\"bench\":\"loss\",\"transport\":\"%s\",\"np\":%d,\"trials\":%d,\"slowest_median_ms\":%.3f,"
               "\"slowest_worst_ms\":%.3f,\"all_median_ms\":%.3f}\n", a.transport, a.np, a.trials, w_med, w_max, all_med);
    }
    free(all);
    free(worst);
    return 0;
}
