/* TCP backend, the store host's descriptors (distmesh_tcp.h >>tcp relay, distmesh_store.h
   >>store server descriptors): ranks that know their local rank from the launcher rendezvous
   through one store connection per host, so a world whose store host could not hold a
   connection per rank still creates; a store host at its limit tells every rank why, at once;
   the store host raises its soft limit; the relay's hops are authenticated with a token; a
   leader that dies during the rendezvous fails its host's ranks at once. Every world here is
   small (a few seconds each): the big ones are `make test-scale`. */
#define _GNU_SOURCE
#include "test_tcp.h"
#include <sys/resource.h>
#include <unistd.h>

/* ---- a world of ranks that each report: status, how long create took, fds, message --------- */
/* What a rank reports (one line): rank, status, create's ms, fds after create, its limit,
   whether it logged the limit raise, its last error. */
typedef struct relay_report {
    int n, status[64], ms[64], fds[64], raised[64], wait_for[2];
    bool got[64];
    long limit[64];
    char msg[64][400];
} relay_report;
typedef struct relay_world {
    int world, per_host;
    bool launcher;              /* the launcher's variables (LOCAL_RANK ...): the relay */
    int limit_extra;            /* > 0: every rank's soft and hard RLIMIT_NOFILE = its open fds + this */
    bool limit_hard_stays;      /* ... the soft one only: the hard limit stays */
    const char* sockets;        /* DISTMESH_SOCKETS_PER_PEER of every rank, NULL: unset */
    int rank0_soft_extra;       /* > 0: rank 0's soft limit = its open fds + this ... */
    bool rank0_hard_stays;      /* ... and its hard limit stays (else: the same as the soft one) */
    int timeout_ms;
    const char* token;          /* DISTMESH_TOKEN of every rank, NULL: none */
    const char* token_of_last;  /* the last rank's, when it differs */
    int delay_rank, delay_ms;   /* one rank starts its create late (delay_ms > 0) */
    int others_delay_ms;        /* every rank but 0 starts its create this late */
    tw_store store;
    relay_report r;             /* the last relay_run's */
} relay_world;

/* The rank's last error of its own ("tcp: ..."; the store's thread in rank 0 logs its own
   "tcp-store: server ..." lines meanwhile) and whether it logged the limit raise. */
static char g_last_error[400];
static int g_raised;
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static void capture_log(dm_log_level level, dm_status st, const char* msg, const char* file, int line, void* user) {
    (void)st; (void)file; (void)line; (void)user;
    pthread_mutex_lock(&g_log_mu);
    if (level == DM_LOG_ERROR && strncmp(msg, "tcp: ", 5) == 0) snprintf(g_last_error, sizeof(g_last_error), "%s", msg);
    if (level == DM_LOG_DEBUG && strstr(msg, "raised this process's soft limit on open files")) g_raised = 1;
    pthread_mutex_unlock(&g_log_mu);
}
/* RLIMIT_NOFILE soft (and hard, unless hard_stays) = the fds open now + extra. */
static long limit_fds(int extra, bool hard_stays) {
    struct rlimit rl;
    long now = tw_count_fds();
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = (rlim_t)(now + extra);
    if (!hard_stays) rl.rlim_max = rl.rlim_cur;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) return -1;
    return (long)rl.rlim_cur;
}
static int relay_rank(dm_collective* c, int rank, int world, void* arg) {
    relay_world* w = (relay_world*)arg;
    dm_tcp_desc d;
    dm_status st;
    double t0;
    long limit = 0;
    int fds = -1, ms;
    char* nl;
    tw_tcp_desc(&d, &w->store, rank, world, w->timeout_ms);
    d.logger.func = capture_log;
    if (w->token) setenv("DISTMESH_TOKEN", rank == world - 1 && w->token_of_last ? w->token_of_last : w->token, 1);
    if (w->sockets) setenv("DISTMESH_SOCKETS_PER_PEER", w->sockets, 1);
    if (w->limit_extra > 0) limit = limit_fds(w->limit_extra, w->limit_hard_stays);
    if (rank == 0 && w->rank0_soft_extra > 0) limit = limit_fds(w->rank0_soft_extra, w->rank0_hard_stays);
    tw_ready();
    if (rank == w->delay_rank && w->delay_ms > 0) tw_sleep_ms(w->delay_ms);
    if (rank != 0 && w->others_delay_ms > 0) tw_sleep_ms(w->others_delay_ms);
    t0 = tw_now_s();
    st = dm_tcp_create(&d, &c);
    ms = (int)((tw_now_s() - t0) * 1000);
    if (st == DM_OK) {
        float x = 1;
        if (dm_all_reduce(c, NULL, &x, 1, DM_FLOAT32, DM_SUM) != DM_OK || x != (float)world ||
            dm_barrier(c) != DM_OK) {
            snprintf(g_last_error, sizeof(g_last_error), "after create: %s", dm_last_error(c));
            st = DM_ERR_INTERNAL;
        }
        tw_sleep_ms(100);   /* the store's thread closes what the others closed */
        fds = tw_count_fds();
    }
    pthread_mutex_lock(&g_log_mu);
    while ((nl = strchr(g_last_error, '\n')) != NULL) *nl = ' ';
    pthread_mutex_unlock(&g_log_mu);
    tw_report("%d %d %d %d %ld %d %s\n", rank, (int)st, ms, fds, limit, g_raised, st == DM_OK ? "-" : g_last_error);
    if (c) {
        dm_barrier(c);
        dm_destroy(c);
    }
    return 0;
}
static int relay_line(char* line, void* u) {
    relay_report* r = (relay_report*)u;
    int rank, st, ms, fds, raised, used = 0;
    long limit;
    if (sscanf(line, "%d %d %d %d %ld %d %n", &rank, &st, &ms, &fds, &limit, &raised, &used) < 6 || rank < 0 ||
        rank >= 64)
        return 0;
    r->status[rank] = st;
    r->ms[rank] = ms;
    r->fds[rank] = fds;
    r->limit[rank] = limit;
    r->raised[rank] = raised;
    snprintf(r->msg[rank], sizeof(r->msg[rank]), "%s", line + used);
    r->got[rank] = true;
    r->n++;
    return 1;
}
/* With wait_for set: done once those two ranks reported. */
static bool relay_done(void* u) {
    const relay_report* r = (const relay_report*)u;
    return r->wait_for[0] != r->wait_for[1] && r->got[r->wait_for[0]] && r->got[r->wait_for[1]];
}
/* Forks w (rank 0 hosts the store on a free port, as dm_init's does), reads every rank's
   report (limit_s at most; with kill_ms > 0, rank kill_rank is killed that long after every
   rank is ready, and the reading ends once ranks wait_a and wait_b reported), reaps (kills
   what is left after a kill). */
static void relay_run(relay_world* w, double limit_s, int kill_rank, int kill_ms, int wait_a, int wait_b) {
    relay_report* r = &w->r;
    tw_world p;
    tw_dm_world dw;
    tw_reader rr;
    memset(r, 0, sizeof(*r));
    r->wait_for[0] = wait_a;
    r->wait_for[1] = wait_b;
    tw_world_init(&p, (int)limit_s + 10, true);
    assert_int_equal(tw_store_rank0(&w->store), 0);
    memset(&dw, 0, sizeof(dw));
    dw.world = w->world;
    dw.store = &w->store;
    dw.per_host = w->per_host;
    dw.launcher_env = w->launcher;
    dw.no_create = true;
    dw.body = relay_rank;
    dw.arg = w;
    assert_int_equal(tw_dm_fork(&p, &dw), 0);
    tw_reader_init(&rr, w->world, limit_s, relay_line, r);
    rr.finished = relay_done;
    if (kill_ms > 0) tw_reader_fault(&rr, kill_rank, SIGKILL, kill_ms);
    tw_read_reports(&p, &rr);
    if (kill_ms > 0) tw_kill_all(&p);
    else tw_reap(&p, 30);
    tw_store_close(&w->store);
}
static void relay_print(const relay_world* w) {
    const relay_report* r = &w->r;
    int k;
    for (k = 0; k < w->world; k++)
        if (r->status[k] != DM_OK) printf("  rank %d: %s after %d ms: %s\n", k, dm_status_name((dm_status)r->status[k]),
                                          r->ms[k], r->msg[k]);
}
/* How many ranks created. */
static int relay_created(const relay_world* w) {
    int k, ok = 0;
    for (k = 0; k < w->world; k++) ok += w->r.status[k] == DM_OK;
    return ok;
}
/* relay_run without a kill, 60 s at most, then relay_print. Returns relay_created. */
static int relay_run_print(relay_world* w) {
    relay_run(w, 60, 0, 0, 0, 0);
    relay_print(w);
    return relay_created(w);
}
/* A world of `world` ranks, per_host to a simulated host (0: one host), with the launcher's
   variables (the relay) or without, a 30 s deadline; the rest as relay_world's zero says. */
static void relay_setup(relay_world* w, int world, int per_host, bool launcher) {
    memset(w, 0, sizeof(*w));
    w->world = world;
    w->per_host = per_host;
    w->launcher = launcher;
    w->timeout_ms = 30000;
}
/* How many ranks failed with a message holding a, b and c (NULL: only a and b); *slowest_ms:
   the slowest create. */
static int relay_named(const relay_world* w, const char* a, const char* b, const char* c, int* slowest_ms) {
    const relay_report* r = &w->r;
    int k, named = 0;
    *slowest_ms = 0;
    for (k = 0; k < w->world; k++) {
        named += r->status[k] != DM_OK && strstr(r->msg[k], a) && strstr(r->msg[k], b) && (!c || strstr(r->msg[k], c));
        if (r->ms[k] > *slowest_ms) *slowest_ms = r->ms[k];
    }
    return named;
}

/* ---- the file-descriptor wall ---------------------------------------------------------------- */
/* 24 ranks on 3 simulated hosts, rank 0 hosting the store, every rank limited to the fds it has
   open at its start + 34 (soft and hard: nothing to raise). Measured here: with the relay
   rank 0 holds about 20 more during create (its store's few connections, its host's 7 ranks
   at its relay), and needs 9 more for its peers; under ASan, once, 21 + 9 = 30, which failed
   the 28 this test first allowed. Without the relay it holds 40 (a connection per rank, its
   own included): so the world creates only through the relay. After create rank 0 holds no
   store connection at all. */
static void test_relay_fd_wall(void** s) {
    relay_world w;
    int ok;
    (void)s;
    relay_setup(&w, 24, 8, true);
    w.limit_extra = 34;
    ok = relay_run_print(&w);
    printf("  24 ranks on 3 hosts, each limited to its open fds + 34: %d created; rank 0 holds %d fds after create "
           "(limit %ld)\n", ok, w.r.fds[0], w.r.limit[0]);
    assert_int_equal(w.r.n, w.world);
    assert_int_equal(ok, w.world);
}

/* ---- a store host at its limit ----------------------------------------------------------------- */
/* 12 ranks that meet the store directly (no launcher variables), rank 0 hosting it with room
   for a few clients only: every rank fails, and every message names EMFILE, the connections
   the store holds and the limit; the refused ranks at once, the others (rank 0 included)
   within a second of their store's first refusal -- not at the 30 s deadline (rank 0's call
   returns about a second after the last client came: its store serves late ranks that long).
   The others start 0.3 s after rank 0, so that rank 0 has what it needs itself (its listeners)
   before its store's clients take the rest. */
static void test_store_emfile_named(void** s) {
    relay_world w;
    int named, slowest;
    char limit[32];
    (void)s;
    relay_setup(&w, 12, 0, false);
    w.rank0_soft_extra = 20;        /* the store's own few, rank 0's listeners, a few clients */
    w.others_delay_ms = 300;
    relay_run_print(&w);
    snprintf(limit, sizeof(limit), "limit is %ld open files", w.r.limit[0]);
    named = relay_named(&w, "EMFILE", "client connections", limit, &slowest);
    printf("  12 ranks, rank 0's store limited to %ld fds: %d of 12 failed naming EMFILE, the connections and the "
           "limit; the slowest create returned after %d ms\n", w.r.limit[0], named, slowest);
    assert_int_equal(w.r.n, w.world);
    assert_int_equal(named, w.world);
    assert_true(slowest < 5000);    /* a second or so here; the deadline is 30 s */
}

/* The same store host with a soft limit that low and a higher hard one: it raises its soft limit
   (logged at debug level) and every rank creates. */
static void test_store_raises_soft_limit(void** s) {
    relay_world w;
    int ok;
    (void)s;
    relay_setup(&w, 12, 0, false);
    w.rank0_soft_extra = 14;
    w.rank0_hard_stays = true;
    ok = relay_run_print(&w);
    printf("  12 ranks, rank 0's soft limit %ld: %d created, rank 0 logged the raise: %s\n", w.r.limit[0], ok,
           w.r.raised[0] ? "yes" : "no");
    assert_int_equal(ok, w.world);
    assert_true(w.r.raised[0]);
}

/* An ordinary rank whose schedules need more connections than its soft limit holds (16 sockets
   to each peer on the other host; every rank limited to its open fds + 24, the hard limit
   higher) raises it (logged at debug level), and every rank creates. */
static void test_rank_raises_soft_limit_for_its_peers(void** s) {
    relay_world w;
    int k, ok, raised = 0;
    (void)s;
    relay_setup(&w, 8, 4, true);
    w.limit_extra = 24;
    w.limit_hard_stays = true;
    w.sockets = "16";
    ok = relay_run_print(&w);
    for (k = 1; k < w.world; k++) raised += w.r.raised[k] != 0;
    printf("  8 ranks on 2 hosts, 16 sockets per peer, soft limits of open fds + 24: %d created, %d of ranks 1-7 "
           "raised theirs (rank 5 holds %d fds)\n", ok, raised, w.r.fds[5]);
    assert_int_equal(ok, w.world);
    assert_true(raised > 0);
}
/* The same with the hard limits that low too: the ranks whose P cannot fit fail before they
   connect, naming the limit, and the world fails at once, not at its 30 s deadline. */
static void test_rank_names_its_limit(void** s) {
    relay_world w;
    int k, named, slowest;
    (void)s;
    relay_setup(&w, 8, 4, true);
    w.limit_extra = 24;
    w.sockets = "16";
    relay_run(&w, 60, 0, 0, 0, 0);
    named = relay_named(&w, "cannot hold the connections", "RLIMIT_NOFILE", NULL, &slowest);
    printf("  the same with hard limits of open fds + 24: %d of 8 named their limit; the slowest create returned "
           "after %d ms\n", named, slowest);
    if (named == 0) relay_print(&w);
    assert_int_equal(w.r.n, w.world);
    for (k = 0; k < w.world; k++) assert_int_not_equal(w.r.status[k], DM_OK);
    assert_true(named > 0);
    assert_true(slowest < 10000);
}

/* ---- the relay's hops ------------------------------------------------------------------------- */
/* With DISTMESH_TOKEN every rank creates through its leader; a rank given another token is
   refused by its leader (DM_ERR_REFUSED naming the token) at once. */
static void test_relay_token(void** s) {
    relay_world w;
    (void)s;
    relay_setup(&w, 8, 4, true);
    w.token = "relay-secret";
    assert_int_equal(relay_run_print(&w), w.world);
    w.token_of_last = "another-secret";
    w.timeout_ms = 3000;            /* the others wait for it: their deadline */
    relay_run(&w, 30, 0, 0, 0, 0);
    printf("  rank 7 with another token: %s after %d ms: %s\n", dm_status_name((dm_status)w.r.status[7]), w.r.ms[7],
           w.r.msg[7]);
    assert_int_equal(w.r.status[7], DM_ERR_REFUSED);
    assert_non_null(strstr(w.r.msg[7], "DISTMESH_TOKEN"));
    assert_true(w.r.ms[7] < 2500);
}

/* A leader killed while its host's ranks wait for its answer (rank 2 of the other host starts
   late, so the world waits): those ranks fail at once with DM_ERR_PEER_LOST naming it. */
static void test_relay_leader_dies(void** s) {
    relay_world w;
    (void)s;
    relay_setup(&w, 6, 3, true);
    w.timeout_ms = 20000;
    w.delay_rank = 2;
    w.delay_ms = 4000;
    relay_run(&w, 40, 3, 1500, 4, 5);   /* rank 3 leads host 1 (ranks 3-5) */
    relay_print(&w);
    assert_int_equal(w.r.status[4], DM_ERR_PEER_LOST);
    assert_int_equal(w.r.status[5], DM_ERR_PEER_LOST);
    assert_non_null(strstr(w.r.msg[4], "leader (rank 3)"));
    assert_true(w.r.ms[4] < 3500 && w.r.ms[5] < 3500);      /* killed 1.5 s in; the deadline is 20 s */
}

int main(int argc, char** argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_relay_fd_wall),
        cmocka_unit_test(test_store_emfile_named),
        cmocka_unit_test(test_store_raises_soft_limit),
        cmocka_unit_test(test_rank_raises_soft_limit_for_its_peers),
        cmocka_unit_test(test_rank_names_its_limit),
        cmocka_unit_test(test_relay_token),
        cmocka_unit_test(test_relay_leader_dies),
    };
    return TCP_RUN_TESTS(tests, argc, argv);
}
