/* TCP backend, many ranks on simulated hosts: a rank connects only where its schedules need it
   (the create opens no more fds than its peers P, the fixed-peer collectives none, the others
   connect on demand, also with two sockets per peer), kill -9 among 64 ranks and before anyone
   connected to the victim, and P checked transfer by transfer on the threaded world. The big
   worlds meet through a TCP store an agent process serves, each rank with a launcher's
   LOCAL_RANK (so through its host's leader, distmesh_tcp.h >>tcp relay, and with no store
   connection once built). `test_tcp_sparse --scale N [per_host]` measures create time and fds
   by hand. */
#define _GNU_SOURCE
#include "test_tcp.h"
#include <unistd.h>

/* ---- sparse connections: many ranks on simulated hosts --------------------------------------- */
/* A world of up to BIG_MAX forked ranks, rank r on simulated host "h<r / per_host>", over a
   TCP store served outside the ranks (their fds count only their own client). Each rank runs
   a body and reports one line through a pipe; "R" says it is ready. */
#define BIG_MAX 512
static int g_big_per_host = 8;
static int g_peers_logged = -1;     /* the create's "N peers connected" (INFO), in a rank */
static char g_big_error[512];
static double g_big_t_start;        /* when the forks began (the ranks inherit it) */
static void capture_peers(dm_log_level level, dm_status st, const char* msg, const char* file, int line, void* user) {
    int r, w, n;
    (void)st; (void)file; (void)line; (void)user;
    if (level == DM_LOG_INFO && sscanf(msg, "tcp: rank %d of %d: %d peers connected", &r, &w, &n) == 3)
        g_peers_logged = n;
    if (level == DM_LOG_ERROR) snprintf(g_big_error, sizeof(g_big_error), "%s", msg);
}
typedef int (*big_body)(dm_collective* c, int rank, int world, double t_start, int fds_before, void* arg);
typedef struct big_ctx { big_body body; void* arg; int timeout_ms; const tw_store* store; } big_ctx;
/* A rank of the big world: its fds before its create, the create (its log captured), body. */
static int big_rank(dm_collective* c, int rank, int world, void* arg) {
    const big_ctx* b = (const big_ctx*)arg;
    dm_tcp_desc d;
    int rc, fds_before;
    tw_tcp_desc(&d, b->store, rank, world, b->timeout_ms);
    d.logger.func = capture_peers;
    setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);      /* rank 0 too is the agent's client */
    fds_before = tw_count_fds();
    if (dm_tcp_create(&d, &c) != DM_OK) {
        fprintf(stderr, "rank %d: create failed: %s\n", rank, g_big_error);
        return 1;
    }
    rc = b->body(c, rank, world, g_big_t_start, fds_before, b->arg);
    dm_destroy(c);
    return rc;
}
/* Forks the world into p (a report pipe, 120 s alarm), rank r on simulated host
   h<r / g_big_per_host>, over a TCP store (s) served by an agent process forked first: no server
   thread runs in this process while the ranks are forked (a child inheriting an allocator lock
   held by that thread would hang in its first malloc; GCC 12's AddressSanitizer takes no such
   lock around fork: the likely cause of a rank that never joined in one make asan run). 0, or -1. */
static int big_fork(tw_world* p, tw_store* s, int world, int timeout_ms, big_body body, void* arg) {
    tw_dm_world w;
    big_ctx b;
    tw_world_init(p, 120, true);
    if (tw_store_agent(s, NULL, 0) != 0) return -1;
    b.body = body;
    b.arg = arg;
    b.timeout_ms = timeout_ms;
    b.store = s;
    memset(&w, 0, sizeof(w));
    w.world = world;
    w.store = s;
    w.per_host = g_big_per_host;
    w.launcher_env = true;          /* as torchrun: LOCAL_RANK, so through the host's leader */
    w.no_create = true;
    w.body = big_rank;
    w.arg = &b;
    g_big_t_start = tw_now_s();
    return tw_dm_fork(p, &w);
}
/* Reads report lines from p until `lines` counted or limit_s passed (each goes to on_line).
   kill_ms > 0: once every rank is ready, wait that many ms and kill -9 rank kill_victim
   (rr->t_fault: when). Returns the lines counted. */
static int big_collect(tw_world* p, tw_reader* rr, int lines, double limit_s, int (*on_line)(char* line, void* u),
                       void* u, int kill_ms, int kill_victim) {
    tw_reader_init(rr, lines, limit_s, on_line, u);
    rr->poll_ms = 2;
    if (kill_ms > 0) tw_reader_fault(rr, kill_victim, SIGKILL, kill_ms);
    return tw_read_reports(p, rr);
}
/* The ranks leave by themselves (their report is written); the store goes after them. */
static void big_reap(tw_world* p, tw_store* s) {
    tw_reap(p, 130);
    tw_store_close(s);
}

/* Every rank: its create time and fds before and after, the fixed-peer collectives (no new
   fds), then all_to_all and point-to-point across the world (connected on demand), checked. */
typedef struct big_stats {
    int world, lines, bad, peers_max, peers_min, extra_max, fds_max, lazy_bad;
    double create_end_max, create_ms[BIG_MAX], t_start;
    int fds[BIG_MAX];
} big_stats;
static int body_sparse(dm_collective* c, int rank, int world, double t_start, int fds_before, void* arg) {
    bool lazy = arg != NULL;
    int fds_created = tw_count_fds(), fds_fixed, fds_lazy = -1, j, bad = 0;
    double t_created = tw_now_s();
    float* x = (float*)calloc((size_t)1 << 18, sizeof(float));
    int32_t* a2a_in = (int32_t*)malloc(sizeof(int32_t) * (size_t)world);
    int32_t* a2a_out = (int32_t*)malloc(sizeof(int32_t) * (size_t)world);
    int32_t v = rank, w = -1;
    (void)t_start;
    if (!x || !a2a_in || !a2a_out) return 1;
    for (j = 0; j < 4 && !bad; j++) {       /* every fixed-peer schedule: rd, two-level, chain, barrier */
        x[0] = (float)rank;
        bad |= dm_all_reduce(c, NULL, x, j % 2 ? 2 : (size_t)1 << 18, DM_FLOAT32, DM_SUM) != DM_OK;
        bad |= x[0] != (float)world * (float)(world - 1) / 2.0f;
        bad |= dm_broadcast(c, x, 16, DM_FLOAT32, 0) != DM_OK;
        bad |= dm_barrier(c) != DM_OK;
        bad |= dm_all_gather(c, &v, a2a_out, 1, DM_INT32) != DM_OK || a2a_out[world - 1] != world - 1;
    }
    fds_fixed = tw_count_fds();
    /* A fence between the count above and the first on-demand connection: ranks leave a
       collective at different times, and one that has left the last fixed-peer collective
       dials its lower peers for all_to_all at once (rank 0 first: every rank's lowest) while
       a slower rank may still be inside that collective, whose waits serve the listener and
       accept the dial -- an fd counted as opened by the fixed-peer collectives (seen once in
       CI on rank 0). No rank leaves this barrier before every rank has entered it, so every
       count above is taken before any dial. The barrier's own peers are connected already. */
    if (lazy && !bad) bad |= dm_barrier(c) != DM_OK;
    if (lazy && !bad) {
        for (j = 0; j < world; j++) a2a_in[j] = rank * 1000 + j;
        bad |= dm_all_to_all(c, a2a_in, a2a_out, 1, DM_INT32) != DM_OK;
        for (j = 0; j < world && !bad; j++) bad |= a2a_out[j] != j * 1000 + rank;
        bad |= dm_send(c, &v, 1, DM_INT32, (rank + world / 2) % world, 5) != DM_OK;
        bad |= dm_recv(c, &w, 1, DM_INT32, (rank + world - world / 2) % world, 5) != DM_OK;
        bad |= w != (rank + world - world / 2) % world;
        bad |= dm_broadcast(c, x, 16, DM_FLOAT32, world - 3) != DM_OK;    /* another root's chain */
        bad |= dm_barrier(c) != DM_OK;
        fds_lazy = tw_count_fds();
    }
    if (bad) fprintf(stderr, "rank %d: %s\n", rank, dm_last_error(c));
    if (tw_report("%d %d %.6f %d %d %d %d %d\n", rank, bad, t_created, fds_before, fds_created, fds_fixed, fds_lazy,
                  g_peers_logged) != 0)
        return 1;
    free(x); free(a2a_in); free(a2a_out);
    return bad;
}
static int sparse_line(char* line, void* u) {
    big_stats* b = (big_stats*)u;
    int r, bad, f0, f1, f2, f3, n;
    double t;
    if (sscanf(line, "%d %d %lf %d %d %d %d %d", &r, &bad, &t, &f0, &f1, &f2, &f3, &n) != 8 || r < 0 || r >= b->world)
        return 1;
    b->lines++;
    b->bad += bad;
    if (t > b->create_end_max) b->create_end_max = t;
    b->fds[r] = f1 - f0;
    if (f1 - f0 > b->fds_max) b->fds_max = f1 - f0;
    if (n > b->peers_max) b->peers_max = n;
    if (n < b->peers_min) b->peers_min = n;
    /* beyond P and the host: the listener, the recovery listener (dm_shrink) and the shm
       watcher's eventfd, nothing else (no store client: a built group holds none) */
    if (f1 - f0 - n > b->extra_max) b->extra_max = f1 - f0 - n;
    /* exact: body_sparse counts before a barrier that fences off the on-demand dials */
    if (f2 != f1) fprintf(stderr, "rank %d: the fixed-peer collectives opened %d fds\n", r, f2 - f1);
    if (f2 != f1) b->lazy_bad++;
    if (f3 >= 0 && f3 < f2) b->lazy_bad++;
    return 1;
}
static int cmp_int(const void* a, const void* b) { return *(const int*)a - *(const int*)b; }
static void big_sparse_run(int world, int per_host, bool lazy, big_stats* b) {
    tw_world p;
    tw_store s;
    tw_reader rr;
    int sorted[BIG_MAX];
    memset(b, 0, sizeof(*b));
    b->world = world;
    b->peers_min = 1 << 30;
    g_big_per_host = per_host;
    b->t_start = tw_now_s();
    if (big_fork(&p, &s, world, 60000, body_sparse, lazy ? (void*)1 : NULL) != 0) {
        big_reap(&p, &s);
        fail_msg("could not fork a world of %d ranks", world);
    }
    big_collect(&p, &rr, world, 150, sparse_line, b, 0, 0);
    big_reap(&p, &s);
    memcpy(sorted, b->fds, sizeof(int) * (size_t)world);
    qsort(sorted, (size_t)world, sizeof(int), cmp_int);
    printf("  %d ranks on %d simulated hosts: world created %.2f s after the forks; fds per rank opened by create: "
           "median %d, max %d; peers connected: %d-%d of %d\n", world, (world + per_host - 1) / per_host,
           b->create_end_max - b->t_start, sorted[world / 2], b->fds_max, b->peers_min, b->peers_max, world - 1);
}
/* 64 ranks on 8 hosts: a rank's create opens no more fds than its schedules' peers (P, which
   create logs) plus the listener, the recovery listener and the shm watcher's eventfd; the
   fixed-peer collectives (root 0's broadcast among them) open none; all_to_all and send/recv
   across the world connect on demand. */
static void test_sparse_fds(void** s) {
    int W = 64, L = W / 8;
    big_stats b;
    (void)s;
    if (TEST_SANITIZED) {       /* many sanitized processes on 2 cores starve: ranks never join */
        printf("  skipped under a sanitizer (an fd count; the plain build runs it)\n");
        skip();
    }
    big_sparse_run(W, L, true, &b);
    assert_int_equal(b.lines, W);
    assert_int_equal(b.bad, 0);
    assert_int_equal(b.lazy_bad, 0);
    assert_true(b.peers_min >= L - 1 && b.peers_max < (W - 1) / 2);  /* the host, and far from the world */
    if (b.extra_max > 3) fprintf(stderr, "  a rank's create opened %d fds beyond its peers\n", b.extra_max);
    assert_true(b.extra_max <= 3);
}

/* Two sockets per cross-host peer with connections only where the schedules need them: 32
   ranks on 8 hosts; P's cross-host peers get their second socket at create, so the fixed-peer
   collectives (large all-reduces striped over both) open none; the peers connected on demand
   (all_to_all, send / recv, another root's broadcast) keep one socket and work. */
static void test_sparse_sockets(void** s) {
    big_stats b;
    (void)s;
    if (TEST_SANITIZED) {       /* see test_sparse_fds */
        printf("  skipped under a sanitizer (an fd count; the plain build runs it)\n");
        skip();
    }
    setenv("DISTMESH_SOCKETS_PER_PEER", "2", 1);
    big_sparse_run(32, 4, true, &b);
    unsetenv("DISTMESH_SOCKETS_PER_PEER");
    assert_int_equal(b.lines, 32);
    assert_int_equal(b.bad, 0);
    assert_int_equal(b.lazy_bad, 0);
}

/* kill -9 of one of 64 ranks (8 hosts) during small all_reduces: every survivor, most of them
   never connected to it, fails with DM_ERR_PEER_LOST within 1 s, and its message names the
   victim (the first cause, spread by the abort notice and the links). */
typedef struct big_kill { int world, victim, lines, lost, named; double last; const tw_reader* rr; } big_kill;
static int body_sparse_kill(dm_collective* c, int rank, int world, double t_start, int fds_before, void* arg) {
    int victim = *(int*)arg, i;
    float x[2] = { 1, 2 };
    dm_status st = DM_OK;
    char needle[32];
    (void)world; (void)t_start; (void)fds_before;
    if (dm_barrier(c) != DM_OK) return 1;
    if (tw_ready() != 0) return 1;
    for (i = 0; i < 100000000 && st == DM_OK; i++) st = dm_all_reduce(c, NULL, x, 2, DM_FLOAT32, DM_SUM);
    snprintf(needle, sizeof(needle), "rank %d ", victim);
    if (st != DM_ERR_PEER_LOST || !strstr(dm_last_error(c), needle))
        fprintf(stderr, "rank %d: %s: %s\n", rank, dm_status_name(st), dm_last_error(c));
    if (tw_report("%d %d %d\n", rank, (int)st, strstr(dm_last_error(c), needle) != NULL) != 0) return 1;
    sleep(2);   /* stay, so slower survivors see their own failure, not this exit */
    return 0;
}
static int sparse_kill_line(char* line, void* u) {
    big_kill* k = (big_kill*)u;
    int r, st, named;
    double t_kill = k->rr->t_fault;
    if (sscanf(line, "%d %d %d", &r, &st, &named) != 3 || r == k->victim) return 1;
    k->lines++;
    k->lost += st == DM_ERR_PEER_LOST;
    k->named += named;
    if (t_kill > 0 && tw_now_s() - t_kill > k->last) k->last = tw_now_s() - t_kill;
    return 1;
}
static void sparse_kill_trial(int victim) {
    big_kill k;
    tw_world p;
    tw_store s;
    tw_reader rr;
    memset(&k, 0, sizeof(k));
    k.rr = &rr;
    k.world = TEST_SANITIZED ? 32 : 64;     /* see test_sparse_fds */
    k.victim = victim % k.world;
    g_big_per_host = k.world / 8;
    if (big_fork(&p, &s, k.world, 30000, body_sparse_kill, &k.victim) != 0) {
        big_reap(&p, &s);
        fail_msg("could not fork a world of %d ranks", k.world);
    }
    big_collect(&p, &rr, k.world - 1, 60, sparse_kill_line, &k, 300, k.victim);
    big_reap(&p, &s);
    printf("  %d ranks, kill -9 of rank %d: %d of %d survivors reported (%d DM_ERR_PEER_LOST, %d naming rank %d), "
           "the last %.3f s after the kill\n", k.world, k.victim, k.lines, k.world - 1, k.lost, k.named, k.victim, k.last);
    assert_true(rr.t_fault > 0);
    assert_int_equal(k.lines, k.world - 1);
    assert_int_equal(k.lost, k.world - 1);
    assert_int_equal(k.named, k.world - 1);
    assert_true(k.last < 1.0);
}
/* a non-leader (rank 27: host 3, local rank 3) and a host leader (rank 40: host 5) */
static void test_sparse_kill(void** s) {
    (void)s;
    sparse_kill_trial(27);
    sparse_kill_trial(40);
}

/* kill -9 of a rank before anyone connected to it on demand: 8 ranks on 8 simulated hosts
   (ranks 2 and 4 have no link to rank 7: P there is ring, rd and dissemination partners),
   rank 7 is killed, then (mode 0) every survivor calls all_to_all, or (mode 1) rank 2 alone
   calls dm_recv from rank 7 while the others idle: nobody else can tell it, so it must find
   out itself (it waits for 7 to dial, and probes 7's listener meanwhile). Every reporting
   survivor fails with DM_ERR_PEER_LOST within 1 s of starting its call. */
static int body_lazy_kill(dm_collective* c, int rank, int world, void* arg) {
    int mode = *(int*)arg, j;
    int32_t in[8], out[8];
    double t0;
    dm_status st;
    if (dm_barrier(c) != DM_OK) return 1;
    if (tw_ready() != 0) return 1;
    usleep(500000);                     /* the victim is killed meanwhile */
    if (mode == 1 && rank != 2) { sleep(3); return 0; }
    for (j = 0; j < world; j++) in[j] = rank;
    t0 = tw_now_s();
    st = mode == 0 ? dm_all_to_all(c, in, out, 1, DM_INT32) : dm_recv(c, out, 1, DM_INT32, 7, 0);
    t0 = tw_now_s() - t0;
    if (st != DM_ERR_PEER_LOST) fprintf(stderr, "rank %d: %s: %s\n", rank, dm_status_name(st), dm_last_error(c));
    else printf("  rank %d: %s\n", rank, dm_last_error(c));
    if (tw_report("%d %d %.4f\n", rank, (int)st, t0) != 0) return 1;
    sleep(2);
    return 0;
}
/* lazy_kill_trial's view of the report pipe: each survivor's line is "rank status seconds". */
typedef struct lazy_watch {
    int victim, lost;
    double worst;
} lazy_watch;
static int lazy_line(char* line, void* u) {
    lazy_watch* w = (lazy_watch*)u;
    int rk, st;
    double took;
    if (sscanf(line, "%d %d %lf", &rk, &st, &took) != 3 || rk == w->victim) return 0;
    w->lost += st == DM_ERR_PEER_LOST;
    if (took > w->worst) w->worst = took;
    return 1;
}
static void lazy_kill_trial(int mode) {
    int reports, world = 8, victim = 7, lost, want = mode == 0 ? 7 : 1;
    double worst;
    lazy_watch w;
    tw_world p;
    tw_reader rr;
    memset(&w, 0, sizeof(w));
    w.victim = victim;
    tw_reader_init(&rr, want, 30, lazy_line, &w);
    rr.poll_ms = 2;
    tw_reader_fault(&rr, victim, SIGKILL, 0);     /* as soon as every rank is ready */
    fork_reporting_world(&p, world, 30000, 1, body_lazy_kill, &mode);
    reports = tw_read_reports(&p, &rr);
    lost = w.lost;
    worst = w.worst;
    tw_reap(&p, 45);
    printf("  %s after kill -9 of rank %d: %d of %d DM_ERR_PEER_LOST, the slowest after %.3f s\n",
           mode == 0 ? "all_to_all" : "rank 2's recv from it", victim, lost, want, worst);
    assert_int_equal(reports, want);
    assert_int_equal(lost, want);
    assert_true(worst < 1.0);
}
static void test_lazy_kill(void** s) {
    (void)s;
    lazy_kill_trial(0);
    lazy_kill_trial(1);
}

/* By hand (not in CI): test_tcp_sparse --scale N [per_host]: create time and fds per rank of N ranks on
   simulated hosts of per_host ranks (default 32: 256 ranks on 8 hosts). */
static int scale_main(int world, int per_host) {
    big_stats b;
    if (world < 2 || world > BIG_MAX || per_host < 1) { fprintf(stderr, "--scale N [per_host]: 2 <= N <= %d\n", BIG_MAX); return 2; }
    big_sparse_run(world, per_host, false, &b);
    return b.lines == world && b.bad == 0 ? 0 : 1;
}

/* The threaded world checks every transfer of a fixed-peer schedule against P (distmesh.h,
   >>peers: DM_ERR_INTERNAL outside it), so P must cover what each schedule touches. Small
   worlds hide a gap (P is nearly everyone there), so this runs 24 ranks on layouts where P is
   sparse: every collective at sizes that pick each algorithm, under auto and forced
   families, plus the calls connected on demand (reduce's blocks to the root, gather,
   scatter, all_to_all, send/recv, broadcast from other roots). */
#define PEERS_W 24
#define PCHECK(cond)                                                                      \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "rank %d: %s failed: %s\n", r, #cond, dm_last_error(c));      \
            bad = 1;                                                                      \
        }                                                                                 \
    } while (0)
static int peers_rank(dm_collective* c, void* user) {
    static const size_t counts[4] = { 1, 7, 5000, 300001 };
    int r = dm_rank(c), W = dm_world_size(c), k, j, bad = 0;
    float* x = (float*)malloc(sizeof(float) * (300001 + PEERS_W * 1000));
    float* y = (float*)malloc(sizeof(float) * PEERS_W * 1000);
    float v = (float)r, got = -1, sum = (float)(W * (W - 1) / 2);
    (void)user;
    if (!x || !y) return 1;
    for (k = 0; k < 4; k++) {
        for (j = 0; j < (int)counts[k]; j++) x[j] = (float)r;
        PCHECK(dm_all_reduce(c, NULL, x, counts[k], DM_FLOAT32, DM_SUM) == DM_OK && x[counts[k] - 1] == sum);
        for (j = 0; j < (int)counts[k]; j++) x[j] = (float)r;
        PCHECK(dm_reduce(c, r == 7 ? NULL : x, x, counts[k], DM_FLOAT32, DM_SUM, 7) == DM_OK && (r != 7 || x[0] == sum));
    }
    for (k = 0; k < 2; k++) {
        size_t n = k ? 1000 : 1;
        for (j = 0; j < (int)n; j++) x[j] = (float)r;
        PCHECK(dm_all_gather(c, x, y, n, DM_FLOAT32) == DM_OK && y[(size_t)(W - 1) * n] == (float)(W - 1));
        for (j = 0; j < (int)n * W; j++) x[j] = 1.0f;
        PCHECK(dm_reduce_scatter(c, x, y, n, DM_FLOAT32, DM_SUM) == DM_OK && y[n - 1] == (float)W);
    }
    for (k = 0; k < 3; k++) {
        int root = k == 0 ? 0 : k == 1 ? 5 : W - 1;
        x[0] = (float)(r == root ? 42 : 0);
        PCHECK(dm_broadcast(c, x, 3, DM_FLOAT32, root) == DM_OK && x[0] == 42.0f);
    }
    PCHECK(dm_barrier(c) == DM_OK);
    PCHECK(dm_gather(c, &v, y, 1, DM_FLOAT32, 3) == DM_OK && (r != 3 || y[W - 1] == (float)(W - 1)));
    PCHECK(dm_scatter(c, y, &got, 1, DM_FLOAT32, 3) == DM_OK && (r != 3 || got == (float)r));
    for (j = 0; j < W; j++) x[j] = (float)(r * 100 + j);
    PCHECK(dm_all_to_all(c, x, y, 1, DM_FLOAT32) == DM_OK && y[W - 1] == (float)((W - 1) * 100 + r));
    PCHECK(dm_send(c, &v, 1, DM_FLOAT32, (r + 11) % W, 9) == DM_OK);
    PCHECK(dm_recv(c, &got, 1, DM_FLOAT32, (r + W - 11) % W, 9) == DM_OK && got == (float)((r + W - 11) % W));
    free(x);
    free(y);
    return bad;
}
#undef PCHECK
static void test_peers_thread(void** s) {
    static const char* algos[] = { "auto", "flat", "two_level", "flat_rd", "two_level_rd", "two_level_ring" };
    int hosts[3][PEERS_W], k, a, r;
    (void)s;
    for (r = 0; r < PEERS_W; r++) {
        hosts[0][r] = r / 6;                                    /* 4 hosts x 6 */
        hosts[1][r] = r % 3;                                    /* 3 x 8, interleaved */
        hosts[2][r] = r < 10 ? 0 : r < 17 ? 1 : r < 22 ? 2 : 3; /* 10 + 7 + 5 + 2 */
    }
    for (k = 0; k < 3; k++)
        for (a = 0; a < 6; a++) {
            dm_fake_desc fd;
            memset(&fd, 0, sizeof(fd));
            fd.world_size = PEERS_W;
            fd.host_of = hosts[k];
            fd.timeout_ms = 60000;
            setenv("DISTMESH_ALGO", algos[a], 1);
            if (dm_thread_world_run(&fd, peers_rank, NULL) != DM_OK)
                fail_msg("threaded world of %d, layout %d, DISTMESH_ALGO=%s: a transfer left P or a result is wrong",
                         PEERS_W, k, algos[a]);
        }
    unsetenv("DISTMESH_ALGO");
}

int main(int argc, char** argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peers_thread),
        cmocka_unit_test(test_sparse_fds),
        cmocka_unit_test(test_sparse_sockets),
        cmocka_unit_test(test_sparse_kill),
        cmocka_unit_test(test_lazy_kill),
    };
    signal(SIGPIPE, SIG_DFL);   /* the library must never raise it */
    if (argc > 2 && strcmp(argv[1], "--scale") == 0) return scale_main(atoi(argv[2]), argc > 3 ? atoi(argv[3]) : 32);
    return TCP_RUN_TESTS(tests, argc, argv);
}
