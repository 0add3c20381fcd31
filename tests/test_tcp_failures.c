/* TCP backend, failures: kill -9 or SIGSTOP of one of 4 forked ranks during all-reduces (64 MiB
   and 8 B, shared memory and sockets, flat and two-level on simulated hosts): every survivor
   reports DM_ERR_PEER_LOST (DM_ERR_TIMEOUT for the stopped rank) within its bound and no
   shared-memory segment outlives the world; kill -9 of a rank while the world splits in a
   loop, and a split bounded by dm_set_timeout. Survivors report through the world's pipe
   (tests/test_world.h). */
#define _GNU_SOURCE
#include "test_tcp.h"
#include <dirent.h>
#include <time.h>
#include <unistd.h>

/* ---- fault tests: 4 ranks, one killed or stopped, survivors report through a pipe ---------- */
static int body_fault(dm_collective* c, int rank, int world, void* arg) {
    int mode = *(int*)arg, i;
    size_t n = mode == 0 ? ((size_t)16 << 20) : mode == 2 ? 2 : ((size_t)1 << 18);
    float* x = (float*)calloc(n, sizeof(float));
    dm_status st = DM_OK;
    (void)world;
    if (mode == 1) dm_set_timeout(c, 1500);
    if (dm_barrier(c) != DM_OK) return 1;
    if (tw_ready() != 0) return 1;
    for (i = 0; i < 100000000 && st == DM_OK; i++) st = dm_all_reduce(c, NULL, x, n, DM_FLOAT32, DM_SUM);
    if (tw_report("%d %d\n", rank, (int)st) != 0) return 1;
    /* the next call fails at once: still peer-lost after a peer died, aborted after a timeout */
    if (dm_all_reduce(c, NULL, x, 1, DM_FLOAT32, DM_SUM) !=
        (st == DM_ERR_PEER_LOST ? DM_ERR_PEER_LOST : DM_ERR_ABORTED)) return 1;
    free(x);
    sleep(2);   /* stay connected so slower survivors see their own failure, not our exit */
    return 0;
}
static int g_fault_hosts;       /* > 0: ranks r / g_fault_hosts share a simulated host */
static int g_victim = 2;
static int g_fault_world = 4;
/* test_fault's view of the report pipe: each survivor's line is "rank status". */
typedef struct fault_watch {
    int world;
    int* status_of;
    const tw_reader* rr;
} fault_watch;
static int fault_line(char* line, void* u) {
    fault_watch* w = (fault_watch*)u;
    int rk = -1, st = 0;
    if (sscanf(line, "%d %d", &rk, &st) != 2 || rk < 0 || rk >= w->world) return 0;
    w->status_of[rk] = st;
    printf("  rank %d: %s after %.2f s\n", rk, dm_status_name((dm_status)st), tw_now_s() - w->rr->t_fault);
    return 1;
}
/* mode 0: kill -9 during 64 MiB all_reduces, 1: SIGSTOP, 2: kill -9 during 8-byte all_reduces,
   of g_victim 300 ms after every rank is ready. Returns the seconds from the fault to the last
   survivor's report. */
static double test_fault(int mode) {
    int r, reports, world = g_fault_world, victim = g_victim;
    int status_of[4] = {1, 1, 1, 1};
    double took;
    tw_world p;
    tw_reader rr;
    fault_watch w;
    fork_reporting_world(&p, world, 60000, g_fault_hosts, body_fault, &mode);
    memset(&w, 0, sizeof(w));
    w.world = world;
    w.status_of = status_of;
    w.rr = &rr;
    tw_reader_init(&rr, world - 1, 30, fault_line, &w);
    tw_reader_fault(&rr, victim, mode == 1 ? SIGSTOP : SIGKILL, 300);
    reports = tw_read_reports(&p, &rr);
    took = tw_now_s() - rr.t_fault;
    tw_kill(&p, victim);
    tw_reap(&p, 45);            /* the survivors leave 2 s after their report */
    assert_true(rr.t_fault > 0);
    assert_int_equal(reports, world - 1);
    for (r = 0; r < world; r++)
        if (r != victim) assert_int_equal(status_of[r], mode == 1 ? DM_ERR_TIMEOUT : DM_ERR_PEER_LOST);
    if (mode == 1) assert_true(took < 1.5 + 3.0);
    return took;
}
/* Entries in /dev/shm: segments must never outlive a job, kill -9 included. */
static int count_dev_shm(void) {
    DIR* d = opendir("/dev/shm");
    struct dirent* e;
    int n = 0;
    if (!d) return 0;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}
/* Survivors of a kill -9 report DM_ERR_PEER_LOST within 1 s (the reporting itself included),
   over shared memory (auto) and over sockets, small and large messages, several trials. */
static void fault_kill_trials(const char* transport, int mode, int trials) {
    int shm_before = count_dev_shm(), k;
    double worst = 0;
    g_transport = transport;
    for (k = 0; k < trials; k++) {
        double took = test_fault(mode);
        if (took > worst) worst = took;
    }
    g_transport = NULL;
    printf("  %s, %s messages: %d trials, slowest survivor reported after %.2f s\n", transport ? transport : "auto",
           mode == 0 ? "64 MiB" : "8-byte", trials, worst);
    assert_true(worst < 1.0);
    assert_int_equal(count_dev_shm(), shm_before);
}
static void test_fault_kill(void** s) { (void)s; fault_kill_trials(NULL, 0, 3); }
/* (make test-loaded runs each of these again and again, quiet, beside a hog and on one core:
   here a few trials each) */
static void test_fault_kill_small(void** s) { (void)s; fault_kill_trials(NULL, 2, 3); }
static void test_fault_kill_tcp(void** s) { (void)s; fault_kill_trials("tcp", 0, 2); }
/* kill -9 during 64 MiB all_reduces on another shape of world (per_host > 0: ranks r / per_host
   share a simulated host), then back to the default one (4 ranks, one host, victim 2). */
static void fault_kill_shaped(int world, int per_host, int victim, int trials) {
    g_fault_world = world;
    g_fault_hosts = per_host;
    g_victim = victim;
    fault_kill_trials(NULL, 0, trials);
    g_fault_world = 4;
    g_fault_hosts = 0;
    g_victim = 2;
}
/* 2 ranks, 64 MiB: the all-gathers read the peer's buffer (distmesh_schedules.h >>single copy) where the
   machine allows it, so a kill may land while the survivor reads the victim's buffer. */
static void test_fault_kill_single_copy(void** s) { (void)s; fault_kill_shaped(2, 0, 1, 3); }
static void test_fault_stop(void** s) { (void)s; (void)test_fault(1); }

/* kill -9 during two-level all_reduces (2 hosts x 2 ranks, 64 MiB: the rails) of a host
   leader (rank 2, local rank 0 of host 1) and of a non-leader (rank 3): every survivor fails
   within 1 s. */
static void test_fault_kill_two_level(void** s) {
    (void)s;
    fault_kill_shaped(4, 2, 2, 2);
    fault_kill_shaped(4, 2, 3, 2);
}

/* ---- split under failure ------------------------------------------------------------------ */
/* Every rank splits the world again and again (all in one group, then even / odd ranks),
   destroying each new group, until a split fails; it reports "rank status splits next_status
   next_ms": the failed split, how many went before, and the parent's next call, which must fail
   at once (the failed split broke it). */
static int body_split_loop(dm_collective* c, int rank) {
    dm_status st = DM_OK, next;
    int i;
    double t0;
    if (dm_barrier(c) != DM_OK) return 1;
    if (tw_ready() != 0) return 1;
    for (i = 0; st == DM_OK; i++) {
        dm_collective* sub = NULL;
        st = dm_split(c, i % 2 ? rank % 2 : 0, rank, &sub);
        if (st == DM_OK) dm_destroy(sub);
    }
    if (st != DM_ERR_PEER_LOST) fprintf(stderr, "rank %d: split: %s: %s\n", rank, dm_status_name(st), dm_last_error(c));
    t0 = tw_now_s();
    next = dm_barrier(c);
    if (tw_report("%d %d %d %d %.4f\n", rank, (int)st, i - 1, (int)next, tw_now_s() - t0) != 0) return 1;
    sleep(1);
    return 0;
}
static int body_split_rank(dm_collective* c, int rank, int world, void* arg) {
    (void)world; (void)arg;
    return body_split_loop(c, rank);
}
/* What the survivors of one split trial said. */
typedef struct split_watch {
    int world, victim;
    int *status_of, *next_of, *splits_of;
    double *next_ms, last;
    const tw_reader* rr;
} split_watch;
/* "rank status splits next_status next_seconds" from each survivor */
static int split_line(char* line, void* u) {
    split_watch* w = (split_watch*)u;
    int rk = -1, st = 0, n = 0, nx = 0;
    double ms = 0, t_kill = w->rr->t_fault;
    if (sscanf(line, "%d %d %d %d %lf", &rk, &st, &n, &nx, &ms) != 5 || rk < 0 || rk >= w->world || rk == w->victim)
        return 0;
    w->status_of[rk] = st;
    w->splits_of[rk] = n;
    w->next_of[rk] = nx;
    w->next_ms[rk] = ms;
    if (t_kill > 0 && tw_now_s() - t_kill > w->last) w->last = tw_now_s() - t_kill;
    return 1;
}
/* One trial: 4 ranks split in a loop, `victim` gets kill -9 delay_ms after all are ready.
   Returns the seconds from the kill to the last survivor's report; checks every survivor. */
static double split_kill_trial(int victim, int delay_ms) {
    int r, reports, world = 4;
    int status_of[4] = {1, 1, 1, 1}, next_of[4] = {1, 1, 1, 1}, splits_of[4] = {0, 0, 0, 0};
    double next_ms[4] = {9, 9, 9, 9};
    tw_world p;
    tw_reader rr;
    split_watch w;
    fork_reporting_world(&p, world, 10000, 0, body_split_rank, NULL);  /* a survivor left waiting: 10 s */
    memset(&w, 0, sizeof(w));
    w.world = world;
    w.victim = victim;
    w.status_of = status_of;
    w.next_of = next_of;
    w.splits_of = splits_of;
    w.next_ms = next_ms;
    w.rr = &rr;
    tw_reader_init(&rr, world - 1, 30, split_line, &w);
    rr.poll_ms = 2;
    tw_reader_fault(&rr, victim, SIGKILL, delay_ms);
    reports = tw_read_reports(&p, &rr);
    tw_kill(&p, victim);
    tw_reap(&p, 45);            /* the survivors leave 1 s after their report */
    printf("  kill -9 of rank %d %3d ms into the splits:", victim, delay_ms);
    for (r = 0; r < world; r++)
        if (r != victim) printf(" rank %d %s after %d splits;", r, dm_status_name((dm_status)status_of[r]), splits_of[r]);
    printf(" last report %.3f s after the kill\n", w.last);
    assert_true(rr.t_fault > 0);
    assert_int_equal(reports, world - 1);
    for (r = 0; r < world; r++) {
        if (r == victim) continue;
        assert_int_equal(status_of[r], DM_ERR_PEER_LOST);
        assert_int_equal(next_of[r], DM_ERR_PEER_LOST);   /* the parent is broken ... */
        assert_true(next_ms[r] < 0.05);                   /* ... and says so at once */
    }
    return w.last;
}

/* kill -9 of one of 4 ranks at a random moment while they split: every survivor's split fails
   with DM_ERR_PEER_LOST within 1 s (the world's timeout is 10 s), and the parent is broken. */
static void test_split_kill(void** s) {
    unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
    double worst = 0;
    int k;
    (void)s;
    printf("  seed %u\n", seed);
    srand(seed);
    for (k = 0; k < 5; k++) {      /* (more in make test-loaded) */
        double took = split_kill_trial(rand() % 4, 10 + rand() % 300);
        if (took > worst) worst = took;
    }
    printf("  5 trials: slowest survivor reported %.3f s after the kill\n", worst);
    assert_true(worst < 1.0);
}

/* dm_set_timeout on the parent bounds the split: rank 3 never calls it, the others fail with
   DM_ERR_TIMEOUT after about 1.5 s (not the world's 30 s) and the parent is broken. */
static int body_split_timeout(dm_collective* c, int rank, int world, void* arg) {
    dm_collective* sub = NULL;
    dm_status st;
    double t0, took;
    (void)world; (void)arg;
    dm_set_timeout(c, 1500);
    RST(dm_barrier(c));
    if (rank == 3) { sleep(4); return 0; }
    t0 = tw_now_s();
    st = dm_split(c, 0, rank, &sub);
    took = tw_now_s() - t0;
    printf("  rank %d: split %s after %.2f s: %s\n", rank, dm_status_name(st), took, dm_last_error(c));
    RCHECK(st == DM_ERR_TIMEOUT && sub == NULL);
    RCHECK(took > 1.2 && took < 3.0);
    t0 = tw_now_s();
    RCHECK(dm_barrier(c) == DM_ERR_ABORTED && tw_now_s() - t0 < 0.05);
    return 0;
}
static void test_split_timeout(void** s) { (void)s; assert_int_equal(run_world(4, body_split_timeout, NULL, 30), 0); }

int main(int argc, char** argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fault_kill),
        cmocka_unit_test(test_fault_kill_small),
        cmocka_unit_test(test_fault_kill_tcp),
        cmocka_unit_test(test_fault_kill_single_copy),
        cmocka_unit_test(test_fault_stop),
        cmocka_unit_test(test_fault_kill_two_level),
        cmocka_unit_test(test_split_kill),
        cmocka_unit_test(test_split_timeout),
    };
    return TCP_RUN_TESTS(tests, argc, argv);
}
