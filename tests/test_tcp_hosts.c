/* TCP backend, transports and simulated hosts (DISTMESH_TEST_HOST_ID): shared memory inside a
   host and sockets between hosts, the same bytes from the threaded world, shared memory and
   sockets (one reduction order per schedule), the transport and algorithm choices and their
   refusals, several sockets per peer, and every layout of the two-level schedules on the
   threaded world and on forked ranks. */
#define _GNU_SOURCE
#include "test_tcp.h"
#include <dirent.h>
#include <unistd.h>

/* ---- transports: simulated hosts, bit-identical results, the choice ------------------------ */
/* Two simulated hosts (DISTMESH_TEST_HOST_ID), ranks interleaved: 0 and 2 on h0, 1 and 3 on h1.
   Same-host pairs use shm, cross-host pairs sockets, the ring goes host by host. */
static int body_hosts(dm_collective* c, int rank, int world, void* arg) {
    char host[16];
    dm_collective *pair = NULL, *cross = NULL;
    dm_tcp_desc d;
    (void)c; (void)arg;
    snprintf(host, sizeof(host), "h%d", rank % 2);
    setenv("DISTMESH_TEST_HOST_ID", host, 1);
    make_desc(&d, rank, world);
    RCHECK(dm_tcp_create(&d, &c) == DM_OK);
    RCHECK(strcmp(dm_transport_name(c), "shm+tcp") == 0);
    RCHECK(dm_local_world_size(c) == 2 && dm_local_rank(c) == rank / 2);
    RCHECK(strcmp(c->node_name, host) == 0);
    RCHECK(suite(c, false) == 0);
    RST(dm_split(c, rank % 2, rank, &pair));      /* one host each */
    RCHECK(strcmp(dm_transport_name(pair), "shm") == 0);
    RCHECK(suite_all_reduce(pair, 70001, DM_FLOAT32, DM_SUM, true, 11) == 0);
    RST(dm_split(c, rank / 2, rank, &cross));     /* {0,1} and {2,3}: across the hosts */
    RCHECK(strcmp(dm_transport_name(cross), "tcp") == 0);
    RCHECK(suite_all_reduce(cross, 70001, DM_FLOAT32, DM_SUM, true, 12) == 0);
    dm_destroy(cross);
    dm_destroy(pair);
    dm_destroy(c);
    return 0;
}
static void test_hosts_mixed(void** s) { (void)s; assert_int_equal(run_world_ex(4, body_hosts, NULL, 90, false), 0); }

/* The same float data reduced by the threaded world, shared memory and sockets give the same
   bytes: one reduction order per schedule, followed by every link. */
static const dm_dtype g_bw_types[3] = { DM_FLOAT32, DM_FLOAT16, DM_BFLOAT16 };
static const size_t g_bw_counts[2] = { 1000, ((size_t)1 << 20) + 3 };
static void bw_fill(dm_dtype t, int r, void* buf, size_t count) {
    size_t i;
    for (i = 0; i < count; i++) {
        float v = (float)(sin((double)i * 0.37 + r * 1.3) * 50.0);
        if (t == DM_FLOAT32) ((float*)buf)[i] = v;
        else if (t == DM_FLOAT16) ((uint16_t*)buf)[i] = dm_float_to_half(v);
        else ((uint16_t*)buf)[i] = dm_float_to_bfloat16(v);
    }
}
static void bw_path(char* out, size_t cap, const char* who, int world, int k, int rank) {
    snprintf(out, cap, "%s/bw-%s-%d-%d-%d", g_store.dir, who, world, k, rank);
}
/* Every case in place (SUM); each rank writes its result to a file named by who. */
static int bw_run(dm_collective* c, const char* who) {
    int k, r = dm_rank(c);
    for (k = 0; k < 6; k++) {
        dm_dtype t = g_bw_types[k / 2];
        size_t n = g_bw_counts[k % 2], es = dm_dtype_size(t);
        unsigned char* buf = (unsigned char*)malloc(n * es);
        char path[512];
        FILE* f;
        bw_fill(t, r, buf, n);
        RST(dm_all_reduce(c, NULL, buf, n, t, DM_SUM));
        bw_path(path, sizeof(path), who, dm_world_size(c), k, r);
        f = fopen(path, "wb");
        RCHECK(f && fwrite(buf, es, n, f) == n);
        fclose(f);
        free(buf);
    }
    return 0;
}
static int body_bitwise(dm_collective* c, int rank, int world, void* arg) {
    (void)rank; (void)world;
    return bw_run(c, (const char*)arg);
}
static int bw_thread_rank(dm_collective* c, void* user) { (void)user; return bw_run(c, "thread"); }
static void test_bitwise_across_transports(void** s) {
    int world, k, r;
    (void)s;
    for (world = 3; world <= 4; world++) {
        dm_fake_desc fd;
        memset(&fd, 0, sizeof(fd));
        fd.world_size = world;
        fd.timeout_ms = 60000;
        assert_int_equal(dm_thread_world_run(&fd, bw_thread_rank, NULL), DM_OK);
        assert_int_equal(run_world(world, body_bitwise, (void*)"shm", 60), 0);
        g_transport = "tcp";
        k = run_world(world, body_bitwise, (void*)"tcp", 60);
        g_transport = NULL;
        assert_int_equal(k, 0);
        for (k = 0; k < 6; k++)
            for (r = 0; r < world; r++) {
                char a[512], b[512], c[512];
                bw_path(a, sizeof(a), "thread", world, k, 0);
                bw_path(b, sizeof(b), "shm", world, k, r);
                bw_path(c, sizeof(c), "tcp", world, k, r);
                if (!tcp_files_same(a, b) || !tcp_files_same(a, c))
                    fail_msg("world %d, %s count %zu: rank %d's bytes differ between thread, shm and tcp", world,
                             dm_dtype_name(g_bw_types[k / 2]), g_bw_counts[k % 2], r);
            }
    }
}

/* DISTMESH_TRANSPORT=tcp from the environment: sockets, and all collectives correct. */
static int body_suite_tcp_env(dm_collective* c, int rank, int world, void* arg) {
    (void)rank; (void)world; (void)arg;
    RCHECK(strcmp(dm_transport_name(c), "tcp") == 0);
    return suite(c, false);
}

/* Failed creates have no object to hold their message: tests read it from the logger. */
static char g_logged[2048];
static void capture_log(dm_log_level level, dm_status st, const char* msg, const char* file, int line, void* user) {
    (void)st; (void)file; (void)line; (void)user;
    if (level == DM_LOG_ERROR) snprintf(g_logged, sizeof(g_logged), "%s", msg);
}

/* DISTMESH_TRANSPORT and desc.transport: bad values are refused with the accepted ones named;
   ranks that disagree on shm vs tcp fail the shm rank's create with a message that says so. */
static int body_disagree(dm_collective* c, int rank, int world, void* arg) {
    dm_tcp_desc d;
    dm_status st;
    (void)c; (void)arg;
    make_desc(&d, rank, world);
    d.transport = rank == 0 ? "shm" : "tcp";
    d.timeout_ms = 10000;
    d.logger.func = capture_log;
    c = NULL;
    st = dm_tcp_create(&d, &c);
    if (rank == 0) {
        RCHECK(st == DM_ERR_UNSUPPORTED && c == NULL);
        RCHECK(strstr(g_logged, "another rank asked for tcp") != NULL);
    } else {
        RCHECK(st == DM_OK && strcmp(dm_transport_name(c), "tcp") == 0);
        dm_destroy(c);
    }
    return 0;
}
static void test_transport_choice(void** s) {
    dm_tcp_desc d;
    dm_collective* c = NULL;
    (void)s;
    make_desc(&d, 0, 1);
    d.logger.func = capture_log;
    d.transport = "rdma";
    assert_int_equal(dm_tcp_create(&d, &c), DM_ERR_INVALID_ARG);
    assert_non_null(strstr(g_logged, "desc.transport is \"rdma\"; expected auto, shm or tcp"));
    d.transport = NULL;
    setenv("DISTMESH_TRANSPORT", "shared", 1);
    assert_int_equal(dm_tcp_create(&d, &c), DM_ERR_ENV);
    assert_non_null(strstr(g_logged, "env: DISTMESH_TRANSPORT=\"shared\" is not one of auto, shm, tcp"));
    setenv("DISTMESH_TRANSPORT", "tcp", 1);
    assert_int_equal(run_world(2, body_suite_tcp_env, NULL, 60), 0);
    unsetenv("DISTMESH_TRANSPORT");
    assert_int_equal(run_world_ex(2, body_disagree, NULL, 30, false), 0);
}

/* Sockets open in this process ("socket:[...]" in /proc/self/fd). */
static int count_sockets(void) {
    DIR* d = opendir("/proc/self/fd");
    struct dirent* e;
    int n = 0;
    if (!d) return -1;
    while ((e = readdir(d)) != NULL) {
        char path[300], link[64];
        ssize_t k;
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        k = readlink(path, link, sizeof(link) - 1);
        if (k > 0) { link[k] = 0; n += strncmp(link, "socket:", 7) == 0; }
    }
    closedir(d);
    return n;
}
/* Several sockets per peer: 4 ranks on 2 simulated hosts (0 and 2 on h0, 1 and 3 on h1), the
   count from the desc or, with *arg < 0, from DISTMESH_SOCKETS_PER_PEER. Each rank holds its
   listener and its recovery listener (both open for the group's life), one shm side socket to its host mate and n sockets to
   each rank of the other host (both are in P: ring neighbours); all-reduces
   that span many stripes (and a ring all-gather and a broadcast) come out right, and so do
   the groups split from it (the count is inherited). */
static int body_sockets(dm_collective* c, int rank, int world, void* arg) {
    int n = *(int*)arg < 0 ? -*(int*)arg : *(int*)arg, before = count_sockets(), after;
    dm_collective* cross = NULL;
    dm_tcp_desc d;
    (void)c;
    tw_sim_host(rank % 2);
    make_desc(&d, rank, world);
    if (*(int*)arg > 0) d.sockets_per_peer = n;
    RCHECK(dm_tcp_create(&d, &c) == DM_OK);
    after = count_sockets();
    if (after - before != 3 + 2 * n) {
        fprintf(stderr, "rank %d: %d sockets per peer: %d sockets opened, expected %d\n", rank, n, after - before,
                3 + 2 * n);
        return 1;
    }
    RCHECK(strcmp(dm_transport_name(c), "shm+tcp") == 0);
    RCHECK(suite_all_reduce(c, 1, DM_FLOAT32, DM_SUM, true, 31) == 0);
    RCHECK(suite_all_reduce(c, 70001, DM_INT32, DM_MAX, false, 32) == 0);
    RCHECK(suite_all_reduce(c, (size_t)3 << 20, DM_FLOAT32, DM_SUM, true, 33) == 0);   /* 12 MiB */
    RCHECK(suite_all_gather(c, 300001, DM_FLOAT64, 0, 34) == 0);
    RCHECK(suite_broadcast(c, 1000003, DM_UINT8, 3, 35) == 0);
    RST(dm_split(c, rank / 2, rank, &cross));     /* {0,1} and {2,3}: across the hosts */
    RCHECK(strcmp(dm_transport_name(cross), "tcp") == 0);
    RCHECK(suite_all_reduce(cross, (size_t)1 << 20, DM_FLOAT32, DM_SUM, false, 36) == 0);
    dm_destroy(cross);
    dm_destroy(c);
    return 0;
}
/* Each rank of a pair given a different count: both fail, saying so. */
static int body_sockets_disagree(dm_collective* c, int rank, int world, void* arg) {
    dm_tcp_desc d;
    (void)c; (void)arg;
    tw_sim_host(rank);
    make_desc(&d, rank, world);
    d.sockets_per_peer = rank + 1;
    d.logger.func = capture_log;
    c = NULL;
    RCHECK(dm_tcp_create(&d, &c) == DM_ERR_INVALID_ARG && c == NULL);
    RCHECK(strstr(g_logged, "different socket counts per peer (1 to 2") != NULL);
    return 0;
}
static void test_sockets_per_peer(void** s) {
    static const int counts[] = { 1, 2, 4, -3 };
    dm_tcp_desc d;
    dm_collective* c = NULL;
    int k;
    (void)s;
    make_desc(&d, 0, 1);
    d.logger.func = capture_log;
    d.sockets_per_peer = -1;
    assert_int_equal(dm_tcp_create(&d, &c), DM_ERR_INVALID_ARG);
    assert_non_null(strstr(g_logged, "desc.sockets_per_peer is -1; expected 1..16"));
    d.sockets_per_peer = 17;
    assert_int_equal(dm_tcp_create(&d, &c), DM_ERR_INVALID_ARG);
    d.sockets_per_peer = 0;
    setenv("DISTMESH_SOCKETS_PER_PEER", "4x", 1);
    assert_int_equal(dm_tcp_create(&d, &c), DM_ERR_ENV);
    assert_non_null(strstr(g_logged, "env: DISTMESH_SOCKETS_PER_PEER=\"4x\" is not an integer in 1..16"));
    setenv("DISTMESH_SOCKETS_PER_PEER", "0", 1);
    assert_int_equal(dm_tcp_create(&d, &c), DM_ERR_ENV);
    assert_null(c);
    unsetenv("DISTMESH_SOCKETS_PER_PEER");
    for (k = 0; k < 4; k++) {
        int n = counts[k];
        if (n < 0) {
            char v[16];
            snprintf(v, sizeof(v), "%d", -n);
            setenv("DISTMESH_SOCKETS_PER_PEER", v, 1);
        }
        assert_int_equal(run_world_ex(4, body_sockets, &n, 90, false), 0);
        unsetenv("DISTMESH_SOCKETS_PER_PEER");
    }
    assert_int_equal(run_world_ex(2, body_sockets_disagree, NULL, 30, false), 0);
    unsetenv("DISTMESH_TEST_HOST_ID");
}


/* ---- across hosts: simulated layouts and the two-level schedules --------------------------- */
/* A layout: hosts[r] is rank r's simulated host (DISTMESH_TEST_HOST_ID "h<n>" on TCP,
   dm_fake_desc.host_of on the threaded world). */
typedef struct layout { const char* name; int world; int hosts[8]; } layout;
static const layout g_layouts[] = {
    { "2x2", 4, { 0, 0, 1, 1 } },          { "2x3", 6, { 0, 0, 0, 1, 1, 1 } },
    { "3x2", 6, { 0, 0, 1, 1, 2, 2 } },    { "4x1", 4, { 0, 1, 2, 3 } },
    { "1x4", 4, { 0, 0, 0, 0 } },          { "3+1", 4, { 0, 0, 0, 1 } },
    { "2+1+1", 4, { 0, 0, 1, 2 } },        { "interleaved 2x2", 4, { 0, 1, 0, 1 } },
    { "interleaved 3+2", 5, { 1, 0, 1, 1, 0 } },
};
#define N_LAYOUTS ((int)(sizeof(g_layouts) / sizeof(g_layouts[0])))
/* Four layouts that stand for the nine: even, one rank per host, uneven and interleaved. */
static bool layout_key(const layout* l) {
    return strcmp(l->name, "2x2") == 0 || strcmp(l->name, "4x1") == 0 || strcmp(l->name, "3+1") == 0 ||
           strcmp(l->name, "interleaved 3+2") == 0;
}
/* Whether the per-layout suites run on l: every layout, or under a sanitizer the four (under
   ASan here the threaded suites took 61 s instead of about 105, the process suites 31 s
   instead of about 70, of test_tcp_hosts' 248 s). The second runs on a layout (two_level
   forced; sockets forced) take the four in make test too (sockets forced: 3+1 alone under a
   sanitizer): the same schedules as the first run's, another family or transport (the bytes
   across transports: test_layouts_bitwise). */
static bool layout_runs(const layout* l) { return !TEST_SANITIZED || layout_key(l); }
static const layout* g_layout;            /* the layout run_world's bodies take */

/* Creates this forked rank's collective on g_layout's host for it. */
static int layout_create(int rank, int world, dm_collective** c) {
    dm_tcp_desc d;
    tw_sim_host(g_layout->hosts[rank]);
    make_desc(&d, rank, world);
    return dm_tcp_create(&d, c) == DM_OK ? 0 : 1;
}

/* The threaded world on a layout: every collective x dtype x op (the suite), under auto and
   two_level on every layout, and under each forced algorithm on the uneven 3+1 and the
   interleaved 3+2. The suite's data are exact in every dtype, so any order of reduction must
   give the reference's bits. */
static int layout_thread_rank(dm_collective* c, void* user) { (void)user; return suite(c, false); }
/* The layout called name (one of g_layouts). */
static const layout* layout_named(const char* name) {
    int k;
    for (k = 0; strcmp(g_layouts[k].name, name) != 0; k++) {}
    return &g_layouts[k];
}
/* fn on every rank of the threaded world on layout l (60 s deadline). */
static dm_status run_thread_layout(const layout* l, dm_rank_fn fn) { return run_thread_hosts(l->world, l->hosts, fn, NULL); }
static void test_layouts_thread(void** s) {
    static const char* algos[] = { "auto", "two_level", "flat", "two_level_ring", "two_level_rd" };
    int k, a;
    (void)s;
    for (k = 0; k < N_LAYOUTS; k++)
        for (a = 0; a < 5 && layout_runs(&g_layouts[k]); a++) {
            if (a >= 2 && strcmp(g_layouts[k].name, "3+1") != 0 && strcmp(g_layouts[k].name, "interleaved 3+2") != 0)
                continue;
            /* under a sanitizer every algorithm on 3+1, auto alone on the other three (this test
               took 63 s of ASan's 151 s here with 14 suite runs; these 8 keep each algorithm once) */
            if (TEST_SANITIZED && a > 0 && strcmp(g_layouts[k].name, "3+1") != 0) continue;
            if (a == 1 && !layout_key(&g_layouts[k])) continue;
            setenv("DISTMESH_ALGO", algos[a], 1);
            if (run_thread_layout(&g_layouts[k], layout_thread_rank) != DM_OK)
                fail_msg("threaded world, layout %s, DISTMESH_ALGO=%s: the suite failed", g_layouts[k].name, algos[a]);
        }
    unsetenv("DISTMESH_ALGO");
}

/* The pipelined two-level all-reduce (distmesh.h, _dm_sch_2l_stage): counts of several
   segments, so stages run a host reduce-scatter, a host all-gather and a rail at once, on even
   (ring rails on 3 hosts, one exchange on 2), uneven and interleaved layouts, every op on exact
   int32 data and MEAN on float32, in and out of place, against the reference; and the
   algorithm that ran is the two-level ring. */
static int pipelined_rank(dm_collective* c, void* user) { (void)user; return suite_pipelined(c, "two_level_ring", 900); }
static void test_layouts_pipelined(void** s) {
    static const char* names[] = { "2x2", "3x2", "2x3", "3+1", "interleaved 3+2" };
    int i;
    (void)s;
    setenv("DISTMESH_ALGO", "two_level_ring", 1);
    for (i = 0; i < 5; i++) {
        if (run_thread_layout(layout_named(names[i]), pipelined_rank) != DM_OK)
            fail_msg("threaded world, layout %s: the pipelined two-level all_reduce failed", names[i]);
    }
    unsetenv("DISTMESH_ALGO");
}

/* P covers two_level_ring's rails both ways (_dm_peers_find): the rails all-reduce their blocks
   with a ring for large counts and with recursive doubling for small ones (5 hosts: rd by the
   model), and the threaded world fails a fixed-peer transfer outside P. On hosts of 4, 3, 3,
   3 and 3 ranks rail 1 is ranks 1, 5, 8, 11, 14, and its ring pairs 8-11 and 14-1 are peers
   through no other schedule (the uneven hosts keep all_gather flat), so a P computed with
   the small count's rails alone fails the large count. */
static const int g_rails_43333[] = { 0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4 };
static int rails_rank(dm_collective* c, void* user) {
    static const size_t counts[] = { 64, (size_t)1 << 20 };
    int k;
    (void)user;
    for (k = 0; k < 2; k++) {
        size_t n = counts[k], i;
        int W = dm_world_size(c), r = dm_rank(c), bad = 0;
        float* v = (float*)malloc(n * sizeof(float));
        dm_status st;
        if (!v) return DM_ERR_OUT_OF_MEMORY;
        for (i = 0; i < n; i++) v[i] = (float)(r + (int)(i % 7));
        st = dm_all_reduce(c, v, v, n, DM_FLOAT32, DM_SUM);
        for (i = 0; st == DM_OK && i < n; i++)
            if (v[i] != (float)(W * (W - 1) / 2 + W * (int)(i % 7))) bad = 1;
        if (st == DM_OK && strcmp(dm_last_algorithm(c), "two_level_ring") != 0) bad = 1;
        free(v);
        if (st != DM_OK || bad) {
            fprintf(stderr, "rank %d: two_level_ring all_reduce of %zu: %s %s (%s)\n", r, n, dm_status_name(st),
                    dm_last_error(c), dm_last_algorithm(c));
            return st != DM_OK ? (int)st : DM_ERR_INTERNAL;
        }
    }
    return DM_OK;
}
static void test_peers_rails(void** s) {
    dm_fake_desc fd;
    dm_status st;
    (void)s;
    memset(&fd, 0, sizeof(fd));
    fd.world_size = 16;
    fd.host_of = g_rails_43333;
    fd.timeout_ms = 60000;
    setenv("DISTMESH_ALGO", "two_level_ring", 1);
    st = dm_thread_world_run(&fd, rails_rank, NULL);
    unsetenv("DISTMESH_ALGO");
    assert_int_equal(st, DM_OK);
}

/* The same suite over processes on every layout: shm + sockets (auto), then sockets forced. */
static int body_layout_suite(dm_collective* c, int rank, int world, void* arg) {
    int bad;
    (void)arg;
    RCHECK(layout_create(rank, world, &c) == 0);
    bad = suite(c, false);
    dm_destroy(c);
    return bad;
}
static void test_layouts_tcp(void** s) {
    int k;
    (void)s;
    for (k = 0; k < N_LAYOUTS; k++) {
        g_layout = &g_layouts[k];
        if (!layout_runs(g_layout)) continue;
        if (run_world_ex(g_layout->world, body_layout_suite, NULL, 120, false) != 0)
            fail_msg("layout %s (auto): the suite failed", g_layout->name);
        if (!layout_key(g_layout) || (TEST_SANITIZED && strcmp(g_layout->name, "3+1") != 0)) continue;
        g_transport = "tcp";
        if (run_world_ex(g_layout->world, body_layout_suite, NULL, 120, false) != 0) {
            g_transport = NULL;
            fail_msg("layout %s (tcp forced): the suite failed", g_layout->name);
        }
        g_transport = NULL;
    }
}

/* Float data with real rounding: the threaded world (given the layout), shm + sockets and
   sockets alone give the same bytes for all_reduce, reduce_scatter and reduce. */
static int lb_run(dm_collective* c, const char* who) {
    static const size_t counts[3] = { 1000, 70001, ((size_t)1 << 20) + 3 };
    int k, r = dm_rank(c), W = dm_world_size(c);
    for (k = 0; k < 9; k++) {
        size_t n = counts[k % 3], rs = n / (size_t)W + 1;
        float* buf = (float*)malloc((n + rs * (size_t)W) * sizeof(float));
        char path[512];
        FILE* f;
        bw_fill(DM_FLOAT32, r, buf, n + rs * (size_t)W);
        if (k < 3) RST(dm_all_reduce(c, NULL, buf, n, DM_FLOAT32, DM_SUM));
        else if (k < 6) RST(dm_reduce_scatter(c, buf + n, buf, rs, DM_FLOAT32, DM_MEAN));
        else RST(dm_reduce(c, r == W - 1 ? NULL : buf, buf, n, DM_FLOAT32, DM_SUM, W - 1));
        bw_path(path, sizeof(path), who, W, k, r);
        f = fopen(path, "wb");
        if (k < 3) RCHECK(f && fwrite(buf, sizeof(float), n, f) == n);
        else if (k < 6) RCHECK(f && fwrite(buf, sizeof(float), rs, f) == rs);
        else RCHECK(f && fwrite(buf, sizeof(float), r == W - 1 ? n : 1, f) == (r == W - 1 ? n : 1));
        fclose(f);
        free(buf);
    }
    return 0;
}
static int lb_thread_rank(dm_collective* c, void* user) { (void)user; return lb_run(c, "lthread"); }
static int body_layout_bitwise(dm_collective* c, int rank, int world, void* arg) {
    int bad;
    RCHECK(layout_create(rank, world, &c) == 0);
    bad = lb_run(c, (const char*)arg);
    dm_destroy(c);
    return bad;
}
static void test_layouts_bitwise(void** s) {
    static const char* names[] = { "2x2", "2x3", "3+1", "interleaved 3+2" };
    int i, k, r;
    (void)s;
    for (i = 0; i < 4; i++) {
        g_layout = layout_named(names[i]);
        assert_int_equal(run_thread_layout(g_layout, lb_thread_rank), DM_OK);
        assert_int_equal(run_world_ex(g_layout->world, body_layout_bitwise, (void*)"lauto", 60, false), 0);
        g_transport = "tcp";
        k = run_world_ex(g_layout->world, body_layout_bitwise, (void*)"ltcp", 60, false);
        g_transport = NULL;
        assert_int_equal(k, 0);
        for (k = 0; k < 9; k++)
            for (r = 0; r < g_layout->world; r++) {
                char a[512], b[512], c[512];
                bw_path(a, sizeof(a), "lthread", g_layout->world, k, r);
                bw_path(b, sizeof(b), "lauto", g_layout->world, k, r);
                bw_path(c, sizeof(c), "ltcp", g_layout->world, k, r);
                if (!tcp_files_same(a, b) || !tcp_files_same(a, c))
                    fail_msg("layout %s, case %d: rank %d's bytes differ between thread, shm+tcp and tcp",
                             g_layout->name, k, r);
            }
    }
}

/* The choice is the documented function: on 2 hosts x 2 ranks a 16 MiB all_reduce runs the
   two-level rails and a 4-byte one the flat recursive doubling; broadcast chains host by host;
   DISTMESH_ALGO forces; an unknown name is refused with the accepted ones named. */
static int algo_rank(dm_collective* c, void* user) {
    const char* want_big = (const char*)user;
    size_t n = (size_t)4 << 20;
    float* x = (float*)calloc(n, sizeof(float));
    int bad = 0;
    if (!x) return 1;
    if (dm_all_reduce(c, NULL, x, n, DM_FLOAT32, DM_SUM) != DM_OK || strcmp(dm_last_algorithm(c), want_big) != 0) {
        fprintf(stderr, "rank %d: 16 MiB all_reduce ran %s, expected %s\n", dm_rank(c), dm_last_algorithm(c), want_big);
        bad = 1;
    }
    if (dm_broadcast(c, x, 10, DM_FLOAT32, 1) != DM_OK) bad = 1;
    if (strncmp(dm_last_algorithm(c), want_big, 4) != 0) bad = 1;      /* the same family */
    free(x);
    return bad;
}
/* A tcp create that the environment fails: DM_ERR_ENV, no collective, `logged` in its message. */
static void tcp_create_env_error(const char* logged) {
    dm_tcp_desc d;
    dm_collective* c = NULL;
    make_desc(&d, 0, 1);
    d.logger.func = capture_log;
    g_logged[0] = 0;
    assert_int_equal(dm_tcp_create(&d, &c), DM_ERR_ENV);
    assert_null(c);
    assert_non_null(strstr(g_logged, logged));
}
static void test_algo_choice(void** s) {
    static const int hosts[4] = { 0, 0, 1, 1 };
    dm_fake_desc fd;
    (void)s;
    memset(&fd, 0, sizeof(fd));
    fd.world_size = 4;
    fd.host_of = hosts;
    assert_int_equal(dm_thread_world_run(&fd, algo_rank, (void*)"two_level_ring"), DM_OK);
    setenv("DISTMESH_ALGO", "flat_ring", 1);
    assert_int_equal(dm_thread_world_run(&fd, algo_rank, (void*)"flat_ring"), DM_OK);
    setenv("DISTMESH_ALGO", "two_level_rd", 1);
    assert_int_equal(dm_thread_world_run(&fd, algo_rank, (void*)"two_level_rd"), DM_OK);
    setenv("DISTMESH_ALGO", "hierarchical", 1);
    fd.logger.func = capture_log;
    {
        dm_collective* cs[4];
        assert_int_equal(dm_thread_world_create(&fd, cs), DM_ERR_ENV);
        assert_non_null(strstr(g_logged, "env: DISTMESH_ALGO=\"hierarchical\" is not one of auto"));
    }
    tcp_create_env_error("one of auto, flat, two_level, flat_ring, flat_rd, two_level_ring, two_level_rd");
    unsetenv("DISTMESH_ALGO");
}

/* DISTMESH_HOST_LINK states the link between hosts to the cost model: 256 bytes on 2 x 2 ranks
   go by flat recursive doubling over the default link (25 us), and by the two-level schedule
   (the fewest crossings) over a 25 ms one; a malformed value fails the create on every kind. */
static int host_link_rank(dm_collective* c, void* user) {
    const char* want = (const char*)user;
    float x[64] = { 0 };
    if (dm_all_reduce(c, NULL, x, 64, DM_FLOAT32, DM_SUM) != DM_OK || strcmp(dm_last_algorithm(c), want) != 0) {
        fprintf(stderr, "rank %d: 256 B all_reduce ran %s, expected %s\n", dm_rank(c), dm_last_algorithm(c), want);
        return 1;
    }
    return 0;
}
static void test_host_link(void** s) {
    static const int hosts[4] = { 0, 0, 1, 1 };
    static const char* const bad[] = { "25000", "25000,", ",1", "0,1", "25000,0", "25000,1x", "1e8,1" };
    dm_fake_desc fd;
    dm_collective* cs[4];
    size_t i;
    (void)s;
    memset(&fd, 0, sizeof(fd));
    fd.world_size = 4;
    fd.host_of = hosts;
    unsetenv("DISTMESH_HOST_LINK");
    assert_int_equal(dm_thread_world_run(&fd, host_link_rank, (void*)"flat_rd"), DM_OK);
    setenv("DISTMESH_HOST_LINK", "25000,1", 1);
    assert_int_equal(dm_thread_world_run(&fd, host_link_rank, (void*)"two_level_ring"), DM_OK);
    fd.logger.func = capture_log;
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        setenv("DISTMESH_HOST_LINK", bad[i], 1);
        g_logged[0] = 0;
        assert_int_equal(dm_thread_world_create(&fd, cs), DM_ERR_ENV);
        assert_non_null(strstr(g_logged, "is not LATENCY_US,GBIT"));
    }
    tcp_create_env_error("DISTMESH_HOST_LINK=\"1e8,1\"");
    unsetenv("DISTMESH_HOST_LINK");
}

/* Mesh dp x tp = 2 x 4 over 2 hosts placed so that both dims span hosts (hosts alternate by
   rank), and split groups: each group chooses for its own layout, results exact. */
static int body_mesh_hosts(dm_collective* c, int rank, int world, void* arg) {
    dm_mesh* m = NULL;
    dm_mesh_desc md;
    dm_collective* half = NULL;
    (void)arg;
    RCHECK(layout_create(rank, world, &c) == 0);
    memset(&md, 0, sizeof(md));
    md.world = c;
    md.ndims = 2;
    md.dim_names[0] = "dp"; md.dim_sizes[0] = 2;
    md.dim_names[1] = "tp"; md.dim_sizes[1] = 4;
    RST(dm_mesh_create(&md, &m));
    RCHECK(suite_all_reduce(dm_mesh_group(m, "tp"), 70001, DM_FLOAT32, DM_SUM, false, 3) == 0);
    RCHECK(suite_all_reduce(dm_mesh_group(m, "tp"), 3, DM_INT32, DM_MAX, true, 4) == 0);
    RCHECK(suite_all_reduce(dm_mesh_group(m, "dp"), 70001, DM_BFLOAT16, DM_MEAN, true, 5) == 0);
    RCHECK(suite_reduce_scatter(dm_mesh_group(m, "tp"), 40001, DM_FLOAT32, DM_SUM, false, 6) == 0);
    RCHECK(suite_all_reduce(c, 300001, DM_FLOAT32, DM_SUM, true, 7) == 0);
    RST(dm_split(c, rank < 6 ? 0 : 1, -rank, &half));       /* 6 ranks (3+3 hosts), reversed, and 2 */
    RCHECK(suite_all_reduce(half, 70001, DM_INT64, DM_SUM, true, 8) == 0);
    RCHECK(suite_broadcast(half, 1237, DM_FLOAT16, 0, 9) == 0);
    dm_destroy(half);
    dm_mesh_destroy(m);
    dm_destroy(c);
    return 0;
}
static void test_mesh_across_hosts(void** s) {
    static const layout alt = { "alternating 2x4", 8, { 0, 1, 0, 1, 0, 1, 0, 1 } };
    (void)s;
    g_layout = &alt;
    assert_int_equal(run_world_ex(8, body_mesh_hosts, NULL, 120, false), 0);
}

int main(int argc, char** argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hosts_mixed),
        cmocka_unit_test(test_bitwise_across_transports),
        cmocka_unit_test(test_transport_choice),
        cmocka_unit_test(test_algo_choice),
        cmocka_unit_test(test_host_link),
        cmocka_unit_test(test_layouts_thread),
        cmocka_unit_test(test_layouts_pipelined),
        cmocka_unit_test(test_peers_rails),
        cmocka_unit_test(test_layouts_tcp),
        cmocka_unit_test(test_layouts_bitwise),
        cmocka_unit_test(test_mesh_across_hosts),
        cmocka_unit_test(test_sockets_per_peer),
    };
    return TCP_RUN_TESTS(tests, argc, argv);
}
