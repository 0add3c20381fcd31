/* TCP backend, rendezvous: dm_init from torchrun-style variables with a file store, IPv6
   loopback chosen by the route toward MASTER_ADDR, a c10d TCP store served by an agent process
   with every rank its client, rank 0 serving the store (MASTER_ADDR / MASTER_PORT), and ranks in
   network namespaces on a bridge (tests/netns_test.sh, as root). `test_tcp_rendezvous --rank`
   runs one rank of the collective suite from the environment (dm_init): the netns test starts
   it inside the namespaces. */
#define _GNU_SOURCE
#include "test_tcp.h"
#include <unistd.h>
#include <sys/stat.h>
#include <sys/wait.h>

/* torchrun's RANK and WORLD_SIZE, DISTMESH_STORE a file store in the directory
   <g_store.dir>/sub, sockets on lo. */
static void file_store_env(int rank, int world, const char* sub) {
    char v[512];
    snprintf(v, sizeof(v), "%d", rank); setenv("RANK", v, 1);
    snprintf(v, sizeof(v), "%d", world); setenv("WORLD_SIZE", v, 1);
    snprintf(v, sizeof(v), "file://%s/%s", g_store.dir, sub);
    setenv("DISTMESH_STORE", v, 1);
    setenv("DISTMESH_SOCKET_IFNAME", "=lo", 1);
}
/* A world of n ranks running body (limit_s at most), once the store's directory
   <g_store.dir>/sub is made. */
static void run_in_store_dir(const char* sub, int n, tw_body body, double limit_s) {
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/%s", g_store.dir, sub);
    assert_int_equal(mkdir(dir, 0700), 0);
    assert_int_equal(run_world_ex(n, body, NULL, limit_s, false), 0);
}

/* dm_init builds a TCP world from torchrun-style variables and DISTMESH_STORE. */
static int body_init(dm_collective* c, int rank, int world, void* arg) {
    dm_collective* x = NULL;
    float f = 2.0f;
    (void)c; (void)arg;
    file_store_env(rank, world, "init");
    RCHECK(dm_init(NULL, &x) == DM_OK);
    RCHECK(strcmp(dm_backend_name(x), "tcp") == 0 && dm_rank(x) == rank && dm_world_size(x) == world);
    RCHECK(dm_all_reduce(x, NULL, &f, 1, DM_FLOAT32, DM_MEAN) == DM_OK && f == 2.0f);
    dm_destroy(x);
    return 0;
}
static void test_dm_init(void** s) {
    (void)s;
    run_in_store_dir("init", 2, body_init, 30);             /* DISTMESH_STORE's own directory */
}

/* torchrun restarts a world on a store that outlives the attempt (here a file store): attempt 0
   dies during create (rank 2 never comes; ranks 0 and 1 time out, their generation count and
   addresses left in the store), attempt 1 meets afresh and works. With one prefix for every
   attempt, attempt 1's ranks read attempt 0's keys, split between two generations and time out. */
static int body_restart(dm_collective* c, int rank, int world, void* arg) {
    dm_collective* x = NULL;
    int32_t sum = rank;
    (void)c; (void)arg;
    file_store_env(rank, world, "restart");
    setenv("TORCHELASTIC_RESTART_COUNT", "0", 1);
    setenv("DISTMESH_TIMEOUT", "2", 1);
    if (rank == world - 1) {
        usleep(3000000);                    /* attempt 0: dead before its create */
    } else {
        RCHECK(dm_init(NULL, &x) == DM_ERR_TIMEOUT);
        RCHECK(x == NULL);
    }
    setenv("TORCHELASTIC_RESTART_COUNT", "1", 1);
    setenv("DISTMESH_TIMEOUT", "20", 1);
    if (dm_init(NULL, &x) != DM_OK) {
        fprintf(stderr, "rank %d: attempt 1: %s\n", rank, dm_last_error(NULL));
        return 1;
    }
    RCHECK(dm_all_reduce(x, NULL, &sum, 1, DM_INT32, DM_SUM) == DM_OK && sum == world * (world - 1) / 2);
    dm_destroy(x);
    /* a count that is no count is refused, naming the variable */
    setenv("TORCHELASTIC_RESTART_COUNT", "one", 1);
    RCHECK(dm_init(NULL, &x) == DM_ERR_ENV && strstr(dm_last_error(NULL), "TORCHELASTIC_RESTART_COUNT"));
    return 0;
}
static void test_restart_same_store(void** s) {
    (void)s;
    run_in_store_dir("restart", 3, body_restart, 40);
}

/* IPv6: no interface named, the route toward MASTER_ADDR=::1 picks [::1]. */
static int body_ipv6(dm_collective* c, int rank, int world, void* arg) {
    dm_tcp_desc d;
    dm_collective* x = NULL;
    (void)c; (void)arg;
    make_desc(&d, rank, world);
    d.ifname = NULL;
    unsetenv("DISTMESH_SOCKET_IFNAME");
    unsetenv("GLOO_SOCKET_IFNAME");
    setenv("MASTER_ADDR", "::1", 1);
    setenv("MASTER_PORT", "1", 1);
    RCHECK(dm_tcp_create(&d, &x) == DM_OK);
    RCHECK(suite_all_reduce(x, 70001, DM_FLOAT32, DM_SUM, true, 5) == 0);
    RCHECK(suite_broadcast(x, 1000, DM_INT64, world - 1, 6) == 0);
    dm_destroy(x);
    return 0;
}
static void test_ipv6(void** s) {
    (void)s;
    if (system("ip -6 addr show dev lo 2>/dev/null | grep -q '::1'") != 0) { printf("  ipv6: skipped (no ::1)\n"); skip(); }
    assert_int_equal(run_world_ex(3, body_ipv6, NULL, 30, false), 0);
}

/* The c10d-protocol TCP store served on an ephemeral port by an agent process forked from this
   one (so the ranks forked from this one do not inherit a half-copied server thread), as
   torchrun's agent serves it; the ranks, rank 0 too, are its clients. */
static int body_small(dm_collective* c, int rank, int world, void* arg) {
    dm_collective* sub = NULL;
    int32_t v = rank;
    (void)arg;
    RST(dm_all_reduce(c, NULL, &v, 1, DM_INT32, DM_SUM));
    RCHECK(v == world * (world - 1) / 2);
    RCHECK(suite_all_reduce(c, 70001, DM_BFLOAT16, DM_MAX, false, 9) == 0);
    RST(dm_split(c, rank % 2, rank, &sub));
    v = 1;
    RST(dm_all_reduce(sub, NULL, &v, 1, DM_INT32, DM_SUM));
    RCHECK(v == dm_world_size(sub));
    dm_destroy(sub);
    return 0;
}
static void test_tcp_store_clients(void** s) {
    tw_store agent;
    dm_store_desc sd;
    int failed;
    (void)s;
    memset(&sd, 0, sizeof(sd));
    sd.timeout_ms = 30000;
    failed = tw_store_agent(&agent, &sd, 90) == 0 ? 0 : 1;
    if (!failed) {
        tw_dm_world w;
        tw_dm_world_init(&w, 4, &agent, NULL, 30000);
        w.body = body_small;
        setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);   /* rank 0 is a client too */
        failed = tw_dm_run(&w, 60);
        unsetenv("TORCHELASTIC_USE_AGENT_STORE");
    }
    tw_store_close(&agent);
    assert_int_equal(failed, 0);
}

/* dm_init as torchrun starts it: MASTER_ADDR / MASTER_PORT, rank 0 hosting the store. */
static int g_free_port;
static int body_init_hosted(dm_collective* c, int rank, int world, void* arg) {
    char v[32];
    dm_collective* x = NULL;
    dm_init_desc id;
    (void)c; (void)arg;
    snprintf(v, sizeof(v), "%d", rank); setenv("RANK", v, 1);
    snprintf(v, sizeof(v), "%d", world); setenv("WORLD_SIZE", v, 1);
    snprintf(v, sizeof(v), "%d", g_free_port); setenv("MASTER_PORT", v, 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    unsetenv("DISTMESH_STORE");
    unsetenv("DISTMESH_SOCKET_IFNAME");
    memset(&id, 0, sizeof(id));
    id.timeout_ms = 20000;
    RCHECK(dm_init(&id, &x) == DM_OK);
    RCHECK(body_small(x, rank, world, NULL) == 0);
    RST(dm_barrier(x));   /* rank 0's store outlives everyone's split */
    dm_destroy(x);
    return 0;
}
static void test_dm_init_hosted_store(void** s) {
    (void)s;
    g_free_port = tw_free_port();   /* an ephemeral port that is free right now */
    assert_true(g_free_port > 0);
    assert_int_equal(run_world_ex(3, body_init_hosted, NULL, 60, false), 0);
}

/* ---- netns: namespaces on a bridge: 3 x 1 rank, then 2 x 2 simulated hosts (netns_test.sh) - */
static void test_netns(void** s) {
    char cmd[1024], self[512];
    ssize_t n;
    int rc;
    (void)s;
    if (geteuid() != 0) { printf("  netns: skipped (needs root)\n"); skip(); }
    if (system("ip netns list >/dev/null 2>&1") != 0) { printf("  netns: skipped (`ip netns` unavailable)\n"); skip(); }
    n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    assert_true(n > 0);
    self[n] = 0;
    snprintf(cmd, sizeof(cmd), "bash %s/tests/netns_test.sh %s", DM_SRCDIR, self);
    rc = system(cmd);
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77) { printf("  netns: skipped (could not create namespaces)\n"); skip(); }
    assert_int_equal(rc, 0);
}

/* One rank from the environment (used by netns_test.sh). DM_TEST_EXPECT_TRANSPORT and
   DM_TEST_EXPECT_LOCAL_SIZE, when set, are what the group must have found (simulated hosts). */
static int rank_expectations(dm_collective* c) {
    const char* transport = getenv("DM_TEST_EXPECT_TRANSPORT");
    const char* local = getenv("DM_TEST_EXPECT_LOCAL_SIZE");
    if (transport && strcmp(dm_transport_name(c), transport) != 0) {
        fprintf(stderr, "rank %d: transport %s, expected %s\n", dm_rank(c), dm_transport_name(c), transport);
        return 1;
    }
    if (local && dm_local_world_size(c) != atoi(local)) {
        fprintf(stderr, "rank %d: local world size %d, expected %s\n", dm_rank(c), dm_local_world_size(c), local);
        return 1;
    }
    return 0;
}
static int rank_main(void) {
    dm_collective* c = NULL;
    dm_status st;
    int bad;
    st = dm_init(NULL, &c);
    if (st != DM_OK) { fprintf(stderr, "dm_init: %s\n", dm_status_name(st)); return 1; }
    tw_me.index = dm_rank(c);
    bad = rank_expectations(c);
    bad |= suite(c, false);
    if (!bad && getenv("DISTMESH_ALGO") && strncmp(getenv("DISTMESH_ALGO"), "two_level", 9) == 0) {
        size_t n = (size_t)1 << 18;             /* the schedules the run was asked for did run */
        float* x = (float*)calloc(n, sizeof(float));
        if (!x || dm_all_reduce(c, NULL, x, n, DM_FLOAT32, DM_SUM) != DM_OK ||
            strncmp(dm_last_algorithm(c), "two_level_", 10) != 0) {
            fprintf(stderr, "rank %d: DISTMESH_ALGO=%s ran %s\n", dm_rank(c), getenv("DISTMESH_ALGO"), dm_last_algorithm(c));
            bad = 1;
        }
        free(x);
    }
    if (!bad) printf("rank %d of %d (%s, local %d/%d, %s, %s): all collectives correct\n", dm_rank(c), dm_world_size(c),
                     c->node_name, dm_local_rank(c), dm_local_world_size(c), dm_transport_name(c), dm_last_algorithm(c));
    dm_destroy(c);
    return bad;
}

int main(int argc, char** argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dm_init),
        cmocka_unit_test(test_restart_same_store),
        cmocka_unit_test(test_ipv6),
        cmocka_unit_test(test_tcp_store_clients),
        cmocka_unit_test(test_dm_init_hosted_store),
        cmocka_unit_test(test_netns),
    };
    signal(SIGPIPE, SIG_DFL);   /* the library must never raise it */
    if (argc > 1 && strcmp(argv[1], "--rank") == 0) return rank_main();
    return TCP_RUN_TESTS(tests, argc, argv);
}
