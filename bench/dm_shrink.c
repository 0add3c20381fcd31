/* dm_shrink_bench: how long a shrink after a failure takes, against destroy + re-create of the
   same survivors (issue 18).

     dm_shrink_bench                      8 local ranks, 20 trials, shared memory
     dm_shrink_bench --np 4 --hosts 2     2 simulated hosts x 2 ranks (DISTMESH_TEST_HOST_ID)
     dm_shrink_bench --transport tcp

   Per trial: --np ranks are forked (tests/test_world.h: a TCP store served by this process, as a
   launcher's agent store is, or with --store file a file store in a fresh directory;
   dm_tcp_create on 127.0.0.1) and pass a barrier; every rank but the victim then blocks in an 8-byte all-reduce
   and the parent sends the victim kill -9 (the victim goes round the ranks, rank 0 included).
   Each survivor notes when its all-reduce returned DM_ERR_PEER_LOST, calls
   dm_shrink(DM_SHRINK_ABORT) and runs an 8-byte all-reduce on the new collective, and notes
   when that returned. shrink = the last survivor's end - the last survivor's error. Then, for
   comparison, the survivors pass a barrier on the new collective, note the time, destroy both
   collectives, create a new world of the same survivors through the store (a fresh prefix) and
   run the same all-reduce: re-create = the last end - the last start. Medians over the trials.
   A benchmark, not a test: `make bench-shrink` runs it (not part of `make test`). */
#define DISTMESH_IMPLEMENTATION
#include "distmesh.h"
#include "../tests/test_world.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct shrink_args { int np, hosts, trials, timeout_s; const char* transport; bool file_store; } shrink_args;
/* A survivor's times (ns, CLOCK_MONOTONIC): error, shrunk + first all-reduce, re-create start, end. */
typedef struct report { int32_t rank, status; int64_t t_err, t_shrunk, t_rc0, t_rc1; } report;


/* What every rank knows: the options, the victim, the store. */
typedef struct trial_ctx { const shrink_args* a; int victim; const tw_store* store; } trial_ctx;
static void make_desc(const trial_ctx* t, dm_tcp_desc* d, int rank, int size) {
    tw_tcp_desc(d, t->store, rank, size, t->a->timeout_s * 1000);
    d->transport = t->a->transport;
}
/* One rank (on its simulated host, if any): create, barrier, "R"; the victim then sleeps until
   killed, the others time the error, the shrink and the re-create, and report them. */
static int rank_main(dm_collective* c, int rank, int world, void* arg) {
    const trial_ctx* t = (const trial_ctx*)arg;
    dm_tcp_desc d;
    dm_collective *n = NULL, *again = NULL;
    float x = 1.0f;
    report rep;
    make_desc(t, &d, rank, world);
    if (dm_tcp_create(&d, &c) != DM_OK || dm_barrier(c) != DM_OK) { fprintf(stderr, "rank %d: create failed\n", rank); return 1; }
    if (tw_ready() != 0) return 1;
    if (rank == t->victim) for (;;) pause();
    memset(&rep, 0, sizeof(rep));
    rep.rank = rank;
    rep.status = (int32_t)dm_all_reduce(c, NULL, &x, 1, DM_FLOAT32, DM_SUM);
    rep.t_err = tw_now_ns();
    if (rep.status == DM_ERR_PEER_LOST) {
        rep.status = (int32_t)dm_shrink(c, NULL, 0, DM_SHRINK_ABORT, &n);
        if (rep.status == DM_OK) rep.status = (int32_t)dm_all_reduce(n, NULL, &x, 1, DM_FLOAT32, DM_SUM);
        rep.t_shrunk = tw_now_ns();
        if (rep.status != DM_OK) fprintf(stderr, "rank %d: %s\n", rank, dm_last_error(n ? n : c));
    }
    if (rep.status == DM_OK && (rep.status = (int32_t)dm_barrier(n)) == DM_OK) {
        int nr = dm_rank(n), ns = dm_world_size(n);
        rep.t_rc0 = tw_now_ns();
        dm_destroy(n);
        dm_destroy(c);
        n = c = NULL;
        make_desc(t, &d, nr, ns);
        d.prefix = "again/";
        rep.status = (int32_t)dm_tcp_create(&d, &again);
        if (rep.status == DM_OK) rep.status = (int32_t)dm_all_reduce(again, NULL, &x, 1, DM_FLOAT32, DM_SUM);
        rep.t_rc1 = tw_now_ns();
    }
    if (tw_report_bytes(&rep, sizeof(rep)) != 0) return 1;
    dm_destroy(again);
    dm_destroy(n);
    dm_destroy(c);
    return 0;
}


/* One trial: *shrink_ms and *recreate_ms as described above. 0, or 1 on a failure. */
static int trial(const shrink_args* a, int victim, double* shrink_ms, double* recreate_ms) {
    tw_store store;
    tw_world p;
    tw_dm_world w;
    trial_ctx t;
    int i, failed = 0;
    int64_t err = 0, shrunk = 0, rc0 = 0, rc1 = 0;
    double deadline;
    /* the agent's store (outlives every rank), or a file store */
    if ((a->file_store ? tw_store_file(&store, "dm_shrink") : tw_store_serve(&store)) != 0) {
        fprintf(stderr, "dm_shrink_bench: no store\n");
        return 1;
    }
    t.a = a;
    t.victim = victim;
    t.store = &store;
    memset(&p, 0, sizeof(p));
    p.alarm_s = 3 * a->timeout_s + 30;        /* past the reads' deadline */
    p.reports = true;
    p.quick_exit = true;
    memset(&w, 0, sizeof(w));
    w.world = a->np;
    w.store = &store;
    w.per_host = a->hosts > 0 ? a->np / a->hosts : 0;
    w.no_create = true;                       /* the rank destroys and re-creates its own */
    w.body = rank_main;
    w.arg = &t;
    if (tw_dm_fork(&p, &w) != 0) { perror("dm_shrink_bench: fork"); failed = 1; }
    deadline = tw_now_s() + 3 * a->timeout_s + 20;
    if (!failed && !tw_read_ready(&p, a->np, deadline)) failed = 1;
    if (!failed) {
        tw_sleep_ms(50);
        tw_signal(&p, victim, SIGKILL);
        for (i = 0; i < a->np - 1; i++) {
            report rep;
            if (!tw_read_exact(&p, &rep, sizeof(rep), deadline) || rep.status != DM_OK) { failed = 1; break; }
            if (rep.t_err > err) err = rep.t_err;
            if (rep.t_shrunk > shrunk) shrunk = rep.t_shrunk;
            if (rep.t_rc0 > rc0) rc0 = rep.t_rc0;
            if (rep.t_rc1 > rc1) rc1 = rep.t_rc1;
        }
    }
    if (failed) fprintf(stderr, "trial with victim %d failed\n", victim);
    tw_kill_all(&p);
    if (tw_store_close(&store) != 0) fprintf(stderr, "dm_shrink_bench: could not remove %s\n", store.dir);
    *shrink_ms = (double)(shrunk - err) / 1e6;
    *recreate_ms = (double)(rc1 - rc0) / 1e6;
    return failed;
}

static int parse(int argc, char** argv, shrink_args* a) {
    int i;
    a->np = 8;
    a->hosts = 0;
    a->trials = 20;
    a->timeout_s = 10;
    a->transport = "shm";
    a->file_store = false;
    for (i = 1; i < argc; i++) {
        const char* v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--np") == 0 && v) a->np = atoi(argv[++i]);
        else if (strcmp(argv[i], "--hosts") == 0 && v) a->hosts = atoi(argv[++i]);
        else if (strcmp(argv[i], "--trials") == 0 && v) a->trials = atoi(argv[++i]);
        else if (strcmp(argv[i], "--timeout") == 0 && v) a->timeout_s = atoi(argv[++i]);
        else if (strcmp(argv[i], "--transport") == 0 && v) a->transport = argv[++i];
        else if (strcmp(argv[i], "--store") == 0 && v) a->file_store = strcmp(argv[++i], "file") == 0;
        else {
            fprintf(stderr, "usage: dm_shrink_bench [--np N] [--hosts H] [--trials N] [--transport auto|shm|tcp] "
                            "[--store tcp|file] [--timeout S]\n");
            return 2;
        }
    }
    if (a->np < 3 || a->np > 64 || a->trials < 1 || a->timeout_s < 1 || a->hosts < 0 ||
        (a->hosts > 0 && a->np % a->hosts != 0)) {
        fprintf(stderr, "dm_shrink_bench: --np 3..64, --hosts dividing --np, --trials >= 1, --timeout >= 1\n");
        return 2;
    }
    return 0;
}

int main(int argc, char** argv) {
    shrink_args a;
    double *sh, *rc;
    int t, failed = 0, n = 0;
    if (parse(argc, argv, &a)) return 2;
    sh = (double*)calloc((size_t)a.trials, sizeof(double));
    rc = (double*)calloc((size_t)a.trials, sizeof(double));
    if (!sh || !rc) return 1;
    printf("# dm_shrink_bench: kill -9 of 1 of %d ranks (%s), transport %s, %s store, %d trials\n", a.np,
           a.hosts ? "simulated hosts" : "one host", a.transport, a.file_store ? "file" : "tcp", a.trials);
    for (t = 0; t < a.trials; t++) {
        if (trial(&a, t % a.np, &sh[n], &rc[n])) { failed = 1; continue; }
        printf("trial %2d  victim %d  shrink %8.2f ms   destroy + re-create %8.2f ms\n", t, t % a.np, sh[n], rc[n]);
        n++;
    }
    if (n > 0) {
        double ms = tw_median(sh, n), mr = tw_median(rc, n);
        printf("# median over %d trials: shrink %.2f ms (worst %.2f), destroy + re-create %.2f ms: ratio %.3f\n", n,
               ms, sh[n - 1], mr, ms / mr);
        printf("{\"bench\":\"shrink\",\"transport\":\"%s\",\"np\":%d,\"hosts\":%d,\"store\":\"%s\",\"trials\":%d,\"shrink_median_ms\":%.3f,"
               "\"recreate_median_ms\":%.3f}\n", a.transport, a.np, a.hosts, a.file_store ? "file" : "tcp", n, ms, mr);
    }
    free(sh);
    free(rc);
    return failed;
}
