/* TCP backend, one host: the collective suite (tests/test_tcp.h) on forked worlds of 1, 2, 3, 4,
   7 and 8 ranks over shared memory and over sockets, a sleeping rank woken by its bell, two ranks
   placed on one core parted by the engine, large all-reduces by single copy and their fallback
   when a read is refused, the
   eager path's fallbacks, Reno on loopback sockets, mesh / split / node-local groups, fds after
   create / destroy cycles, mismatched calls on every rank, and a refused token. */
#define _GNU_SOURCE
#include "test_tcp.h"
#include <unistd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <sched.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <linux/capability.h>

/* What a one-host group of this size should be using. */
static const char* expected_transport(int world) {
    return world == 1 ? "self" : g_transport && strcmp(g_transport, "tcp") == 0 ? "tcp" : "shm";
}
static int body_suite(dm_collective* c, int rank, int world, void* arg) {
    (void)arg;
    if (dm_rank(c) != rank || dm_world_size(c) != world || strcmp(dm_backend_name(c), "tcp") != 0) return 1;
    if (dm_local_world_size(c) != world || dm_local_rank(c) != rank) return 1; /* one host */
    if (strcmp(dm_transport_name(c), expected_transport(world)) != 0) {
        fprintf(stderr, "rank %d: transport %s, expected %s\n", rank, dm_transport_name(c), expected_transport(world));
        return 1;
    }
    return suite(c, true);
}
/* Shared memory with a rank that waits asleep on its bell: each round, one rank enters late
   (4 ms, past the spin and yield phases), so the other is asleep and only the late rank's
   bell can wake it; with 2 MiB (twice a ring) the early rank also sleeps for room until the
   late one reads. The bell's waker skips the fence where every rank registered for the
   asymmetric barrier (distmesh.h, _dm_bell): a lost wake-up would cost the sleeper its 50 ms
   slice, so a median round far above the 4 ms delay means wake-ups are lost. */
static int body_sleep_wake(dm_collective* c, int rank, int world, void* arg) {
    enum { ROUNDS = 24 };
    size_t big = (size_t)512 << 10, i;    /* int32 elements: 2 MiB */
    int32_t* v = (int32_t*)malloc(big * sizeof(int32_t));
    double took[ROUNDS];
    int k;
    (void)world; (void)arg;
    RCHECK(v != NULL);
    RCHECK(strcmp(dm_transport_name(c), "shm") == 0);
    for (k = 0; k < ROUNDS; k++) {
        size_t n = k % 4 < 2 ? 2 : big;
        double t0;
        for (i = 0; i < n; i++) v[i] = (int32_t)(i + (size_t)k) * (rank + 1);
        RST(dm_barrier(c));
        t0 = tw_now_s();
        if (rank == k % 2) usleep(4000);
        RST(dm_all_reduce(c, NULL, v, n, DM_INT32, DM_SUM));
        took[k] = tw_now_s() - t0;
        for (i = 0; i < n; i++) RCHECK(v[i] == (int32_t)(i + (size_t)k) * 3);
    }
    free(v);
    tw_sort(took, ROUNDS);
    fprintf(stderr, "rank %d: rounds with a 4 ms late peer: median %.1f ms, max %.1f ms\n", rank,
            took[ROUNDS / 2] * 1e3, took[ROUNDS - 1] * 1e3);
    RCHECK(took[ROUNDS / 2] < 0.030);
    return 0;
}
static void test_shm_sleep_wake(void** s) { (void)s; assert_int_equal(run_world(2, body_sleep_wake, NULL, 60), 0); }

/* Two ranks on one core, each with a core of its own (issue 28 item 2: the slow launches). Both
   start pinned to the first core they may use, as a scheduler sometimes places them, then get
   their whole mask back; the scheduler alone tends to leave them together (every wait yields
   the core to the peer, two context switches a message). The engine must part them: after the
   rounds, the two run on different cores and the masks are what they were. */
static int allowed_cpus(cpu_set_t* set) {
    CPU_ZERO(set);
    return sched_getaffinity(0, sizeof(*set), set) == 0 ? CPU_COUNT(set) : 0;
}
static int body_moves_off(dm_collective* c, int rank, int world, void* arg) {
    enum { FLOATS = 1024, ROUNDS = 4000 };
    static float v[FLOATS];
    cpu_set_t all, one, after;
    int32_t cpus[2], mine, k, first = 0;
    double t0, took;
    (void)world; (void)arg;
    RCHECK(allowed_cpus(&all) >= 2);
    while (!CPU_ISSET(first, &all)) first++;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    RCHECK(sched_setaffinity(0, sizeof(one), &one) == 0);
    RST(dm_barrier(c));
    for (k = 0; k < 100; k++) RST(dm_all_reduce(c, NULL, v, FLOATS, DM_FLOAT32, DM_SUM));
    RCHECK(sched_getcpu() == first);
    RST(dm_barrier(c));
    RCHECK(sched_setaffinity(0, sizeof(all), &all) == 0);
    t0 = tw_now_s();
    for (k = 0; k < ROUNDS; k++) {
        RST(dm_barrier(c));
        RST(dm_all_reduce(c, NULL, v, FLOATS, DM_FLOAT32, DM_SUM));
    }
    took = tw_now_s() - t0;
    /* a snapshot: on a loaded host the scheduler may put them together again for a moment,
       so more rounds each time they are, up to 40 looks (left alone, they stay together
       throughout; with 10 looks a run beside a load of 5 on 2 cores once ended together) */
    for (k = 0; k < 40; k++) {
        int j;
        mine = sched_getcpu();
        RST(dm_all_gather(c, &mine, cpus, 1, DM_INT32));
        if (cpus[0] != cpus[1]) break;
        for (j = 0; j < 500; j++) RST(dm_all_reduce(c, NULL, v, FLOATS, DM_FLOAT32, DM_SUM));
    }
    fprintf(stderr, "rank %d: %d rounds of barrier + 4 KiB all-reduce started on one core: %.2f us a round, now on cores %d and %d\n",
            rank, ROUNDS, took / ROUNDS * 1e6, cpus[0], cpus[1]);
    RCHECK(cpus[0] != cpus[1]);
    RCHECK(allowed_cpus(&after) == CPU_COUNT(&all) && CPU_EQUAL(&after, &all));
    return 0;
}
static void test_shm_moves_off_peer_core(void** s) {
    cpu_set_t all;
    (void)s;
    if (allowed_cpus(&all) < 2 || sysconf(_SC_NPROCESSORS_ONLN) < 2) skip();
    assert_int_equal(run_world(2, body_moves_off, NULL, 60), 0);
}

/* A large all-reduce among the ranks of one host moves its all-gather by single copy (distmesh.h
   >>single copy): dm_last_algorithm says so, the sums are exact, and MEAN of fractional floats
   gives the ring's bits (the same reduce-scatter; only the all-gather's copies differ): the
   reference is a child group made after one rank set DISTMESH_SINGLE_COPY=0, where every rank
   must fall back to the ring, every time (the child remembers), in place and out of place,
   at the threshold (1 MiB a rank) and an odd count above it. With more ranks than cores the
   ring runs throughout (single copy does not pay there; the same checks hold). */
static int single_copy_round(dm_collective* c, size_t n, bool in_place, float* send, float* recv, const char* want) {
    int W = dm_world_size(c), r = dm_rank(c);
    size_t i;
    for (i = 0; i < n; i++) send[i] = (float)((int)(i % 11) + 2 * r);
    if (in_place) recv = send;
    RST(dm_all_reduce(c, in_place ? NULL : send, recv, n, DM_FLOAT32, DM_SUM));
    if (strcmp(dm_last_algorithm(c), want) != 0) {
        fprintf(stderr, "rank %d: %zu floats ran %s, expected %s\n", r, n, dm_last_algorithm(c), want);
        return 1;
    }
    for (i = 0; i < n; i++)
        if (recv[i] != (float)(W * (int)(i % 11) + W * (W - 1))) {
            fprintf(stderr, "rank %d: %zu floats wrong at %zu: %f\n", r, n, i, (double)recv[i]);
            return 1;
        }
    return 0;
}
/* Whether this machine lets one process read another's memory (ranks are siblings: a child reads
   its parent here, which Yama's ptrace_scope 1 and a container's seccomp forbid alike). */
static volatile uint64_t g_probe_word = 0x5eedf00dcafeULL;
static bool single_copy_permitted(void) {
    int status = 0;
    pid_t kid = fork();
    if (kid == 0) {
        uint64_t got = 0;
        struct iovec here = { &got, sizeof(got) }, there = { (void*)&g_probe_word, sizeof(got) };
        g_probe_word = 0;       /* the child's copy; the parent's still holds the pattern */
        _exit(process_vm_readv(getppid(), &here, 1, &there, 1, 0) == (ssize_t)sizeof(got) &&
              got == 0x5eedf00dcafeULL ? 0 : 1);
    }
    return kid > 0 && waitpid(kid, &status, 0) == kid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}
static int body_single_copy(dm_collective* c, int rank, int world, void* arg) {
    size_t n1 = (size_t)world << 18, big = n1 + 2 * (size_t)world + 1, i;   /* 1 MiB a rank; a bit more */
    const char* want = sysconf(_SC_NPROCESSORS_ONLN) >= world && *(const bool*)arg ? "flat_ring_single_copy" : "flat_ring";
    float* send = (float*)malloc(big * sizeof(float));
    float* recv = (float*)malloc(big * sizeof(float));
    float* mean[2];
    dm_collective* ring = NULL;
    int k;
    RCHECK(send && recv);
    RCHECK(strcmp(dm_transport_name(c), "shm") == 0);
    RCHECK(single_copy_round(c, n1 - 1, false, send, recv, "flat_ring") == 0);    /* under the threshold */
    for (k = 0; k < 4; k++)
        RCHECK(single_copy_round(c, k % 2 ? big : n1, k >= 2, send, recv, want) == 0);
    if (rank == 1) setenv("DISTMESH_SINGLE_COPY", "0", 1);
    RST(dm_split(c, 0, rank, &ring));
    unsetenv("DISTMESH_SINGLE_COPY");
    for (k = 0; k < 3; k++) RCHECK(single_copy_round(ring, big, k == 1, send, recv, "flat_ring") == 0);
    for (k = 0; k < 2; k++) {
        mean[k] = (float*)malloc(big * sizeof(float));
        RCHECK(mean[k] != NULL);
        for (i = 0; i < big; i++) mean[k][i] = (float)sin((double)(i * 7 + (size_t)rank * 13)) * 1.5f;
        RST(dm_all_reduce(k ? ring : c, NULL, mean[k], big, DM_FLOAT32, DM_MEAN));
    }
    RCHECK(strcmp(dm_last_algorithm(c), want) == 0);
    RCHECK(memcmp(mean[0], mean[1], big * sizeof(float)) == 0);
    dm_destroy(ring);
    free(mean[0]); free(mean[1]); free(send); free(recv);
    return 0;
}
static void test_shm_single_copy(void** s) {
    int w;
    bool permitted = single_copy_permitted();
    (void)s;
    if (!permitted) fprintf(stderr, "  processes may not read each other's memory here: the ring's all-gather is expected\n");
    for (w = 2; w <= 4; w++) assert_int_equal(run_world(w, body_single_copy, &permitted, 60), 0);
}

/* A single-copy read that the kernel refuses (distmesh_schedules.h >>single copy): rank 0 may no longer
   read rank 1 (every rank drops CAP_SYS_PTRACE, which root has, and rank 1 makes itself
   non-dumpable), while rank 1 still reads rank 0. Both ranks must then run the ring's all-gather
   for that call, with exact sums, and for every call after. The round before the refusal ran by
   single copy where this machine allows it, so the refusal is what turns it off. */
static int drop_ptrace_cap(void) {
    struct __user_cap_header_struct h;
    struct __user_cap_data_struct d[2];
    memset(&h, 0, sizeof(h));
    memset(d, 0, sizeof(d));
    h.version = _LINUX_CAPABILITY_VERSION_3;
    if (syscall(SYS_capget, &h, d) != 0) return -1;
    d[CAP_SYS_PTRACE / 32].effective &= ~(1u << (CAP_SYS_PTRACE % 32));
    return (int)syscall(SYS_capset, &h, d);
}
static int body_single_copy_refused(dm_collective* c, int rank, int world, void* arg) {
    size_t n = (size_t)world << 18;     /* 1 MiB a rank */
    const char* want = sysconf(_SC_NPROCESSORS_ONLN) >= world && *(const bool*)arg ? "flat_ring_single_copy" : "flat_ring";
    float* send = (float*)malloc(n * sizeof(float));
    float* recv = (float*)malloc(n * sizeof(float));
    int k;
    RCHECK(send && recv);
    RCHECK(single_copy_round(c, n, false, send, recv, want) == 0);
    RCHECK(drop_ptrace_cap() == 0);
    if (rank == 1) RCHECK(prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0);
    RST(dm_barrier(c));
    for (k = 0; k < 3; k++) RCHECK(single_copy_round(c, n, k == 1, send, recv, "flat_ring") == 0);
    free(send); free(recv);
    return 0;
}
static void test_shm_single_copy_refused(void** s) {
    bool permitted = single_copy_permitted();
    (void)s;
    assert_int_equal(run_world(2, body_single_copy_refused, &permitted, 60), 0);
}

/* Small exchanges over shared memory take the eager path (distmesh.h, >>eager) and fall back to
   the engine when they cannot: the peer late (every 13th call), a point-to-point message first
   in line (every 97th: rank 0 sends one to rank 1 before the all-reduce, rank 1 takes it after),
   a message split at the ring's end (12000 calls of 4-256 bytes wrap each 1 MiB ring a few
   times), odd sizes with padding (int8). Every value is checked, so a byte taken too many or
   too few desynchronises the stream and fails the next fingerprint. */
static int body_eager_stream(dm_collective* c, int rank, int world, void* arg) {
    enum { CALLS = 12000 };
    int32_t v[64];
    int8_t b[61];
    int k, i, q;
    (void)arg;
    RCHECK(strcmp(dm_transport_name(c), "shm") == 0);
    for (k = 0; k < CALLS; k++) {
        int n = 1 + (k * 7) % 64;
        int32_t note = k, got = -1;
        if (k % 97 == 0 && rank == 0) RST(dm_send(c, &note, 1, DM_INT32, 1, k));
        if (k % 13 == 0 && rank == k % world) usleep(200);
        if (k % 5 == 0) {
            int m = 1 + k % 61;
            for (i = 0; i < m; i++) b[i] = (int8_t)((rank + i + k) % 3);
            RST(dm_all_reduce(c, NULL, b, (size_t)m, DM_INT8, DM_MAX));
            for (i = 0; i < m; i++) {
                int want = 0;
                for (q = 0; q < world; q++) if ((q + i + k) % 3 > want) want = (q + i + k) % 3;
                RCHECK(b[i] == want);
            }
        } else {
            for (i = 0; i < n; i++) v[i] = (rank + 1) * (k + i);
            RST(dm_all_reduce(c, NULL, v, (size_t)n, DM_INT32, DM_SUM));
            for (i = 0; i < n; i++) RCHECK(v[i] == world * (world + 1) / 2 * (k + i));
        }
        if (k % 97 == 0 && rank == 1) {
            RST(dm_recv(c, &got, 1, DM_INT32, 0, k));
            RCHECK(got == k);
        }
        if (k % 1000 == 999) RST(dm_barrier(c));
    }
    return 0;
}
static void test_shm_eager_stream(void** s) {
    (void)s;
    assert_int_equal(run_world(2, body_eager_stream, NULL, 60), 0);
    assert_int_equal(run_world(4, body_eager_stream, NULL, 90), 0);
}

/* Sockets between ranks of one machine use Reno (distmesh_tcp.h, _dm_tcp_tune: BBR's pacing
   caps loopback). Seen from inside a rank: every connected TCP socket of the process whose
   two ends are loopback addresses (the data connections; the file store has none) says reno. */
static int body_reno(dm_collective* c, int rank, int world, void* arg) {
    int32_t v = rank;
    int fd, seen = 0;
    (void)world; (void)arg;
    RCHECK(strcmp(dm_transport_name(c), "tcp") == 0);
    RST(dm_all_reduce(c, NULL, &v, 1, DM_INT32, DM_SUM));   /* the links are made by now */
    for (fd = 0; fd < 1024; fd++) {
        struct sockaddr_in a, b;
        socklen_t la = sizeof(a), lb = sizeof(b), lc;
        char cc[32] = "";
        int type = 0;
        socklen_t lt = sizeof(type);
        if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &lt) != 0 || type != SOCK_STREAM) continue;
        if (getsockname(fd, (struct sockaddr*)&a, &la) != 0 || a.sin_family != AF_INET) continue;
        if (getpeername(fd, (struct sockaddr*)&b, &lb) != 0) continue;
        if (ntohl(a.sin_addr.s_addr) >> 24 != 127 || ntohl(b.sin_addr.s_addr) >> 24 != 127) continue;
        lc = sizeof(cc) - 1;
        RCHECK(getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, &lc) == 0);
        if (strcmp(cc, "reno") != 0) {
            fprintf(stderr, "rank %d: fd %d (a loopback connection) uses %s, not reno\n", rank, fd, cc);
            return 1;
        }
        seen++;
    }
    RCHECK(seen >= 1);
    return 0;
}
static void test_same_machine_sockets_reno(void** s) {
    int failed;
    (void)s;
    g_transport = "tcp";
    failed = run_world(2, body_reno, NULL, 60);
    g_transport = NULL;
    assert_int_equal(failed, 0);
}

static void test_world_1(void** s) { (void)s; assert_int_equal(run_world(1, body_suite, NULL, 60), 0); }
static void test_world_2(void** s) { (void)s; assert_int_equal(run_world(2, body_suite, NULL, 60), 0); }
static void test_world_3(void** s) { (void)s; assert_int_equal(run_world(3, body_suite, NULL, 60), 0); }
static void test_world_4(void** s) { (void)s; assert_int_equal(run_world(4, body_suite, NULL, 90), 0); }
static void test_world_8(void** s) { (void)s; assert_int_equal(run_world(8, body_suite, NULL, 120), 0); }
static void test_world_7(void** s) { (void)s; assert_int_equal(run_world(7, body_suite, NULL, 120), 0); }
/* The same suite with sockets forced (DISTMESH_TRANSPORT=tcp's desc twin). */
static void run_world_tcp(int world, double limit_s) {
    int failed;
    g_transport = "tcp";
    failed = run_world(world, body_suite, NULL, limit_s);
    g_transport = NULL;
    assert_int_equal(failed, 0);
}
static void test_world_tcp_2(void** s) { (void)s; run_world_tcp(2, 60); }
static void test_world_tcp_3(void** s) { (void)s; run_world_tcp(3, 60); }
static void test_world_tcp_4(void** s) { (void)s; run_world_tcp(4, 90); }

/* Mesh dp=2 x tp=4 over 8 ranks; split by rank % 3 with reversed keys; the node-local group. */
static int body_groups(dm_collective* c, int rank, int world, void* arg) {
    dm_mesh* m = NULL;
    dm_collective *sub = NULL, *loc;
    dm_mesh_desc md;
    int32_t v, want, q;
    (void)arg; (void)world;
    memset(&md, 0, sizeof(md));
    md.world = c;
    md.ndims = 2;
    md.dim_names[0] = "dp"; md.dim_names[1] = "tp";
    md.dim_sizes[0] = 2; md.dim_sizes[1] = 4;
    RST(dm_mesh_create(&md, &m));
    RCHECK(dm_mesh_dp_rank(m) == rank / 4 && dm_mesh_tp_rank(m) == rank % 4);
    RCHECK(strcmp(dm_backend_name(dm_mesh_group(m, "tp")), "tcp") == 0);
    RCHECK(strcmp(dm_transport_name(dm_mesh_group(m, "tp")), "shm") == 0);
    RCHECK(strcmp(dm_transport_name(dm_mesh_group(m, "dp")), "shm") == 0);
    v = rank;
    RCHECK(dm_all_reduce(dm_mesh_group(m, "tp"), NULL, &v, 1, DM_INT32, DM_SUM) == DM_OK);
    want = 0;
    for (q = 0; q < 4; q++) want += (rank / 4) * 4 + q;
    RCHECK(v == want);
    v = rank;
    RCHECK(dm_all_reduce(dm_mesh_group(m, "dp"), NULL, &v, 1, DM_INT32, DM_SUM) == DM_OK);
    RCHECK(v == (rank % 4) * 2 + 4);
    RCHECK(suite_all_reduce(dm_mesh_group(m, "tp"), 70001, DM_FLOAT32, DM_SUM, false, 3) == 0);
    dm_mesh_destroy(m);
    RST(dm_split(c, rank % 3, -rank, &sub));
    RCHECK(sub != NULL);
    {
        int members = 0, higher = 0;
        for (q = 0; q < world; q++) if (q % 3 == rank % 3) { members++; if (q > rank) higher++; }
        RCHECK(dm_world_size(sub) == members && dm_rank(sub) == higher);
    }
    RCHECK(suite(sub, false) == 0);
    dm_destroy(sub);
    RST(dm_split(c, rank == 0 ? DM_SPLIT_NONE : 1, 0, &sub));
    RCHECK((rank == 0) == (sub == NULL));
    if (sub) {
        v = 1;
        RCHECK(dm_all_reduce(sub, NULL, &v, 1, DM_INT32, DM_SUM) == DM_OK && v == world - 1);
        dm_destroy(sub);
    }
    loc = dm_local(c);
    RCHECK(loc && dm_world_size(loc) == world && dm_rank(loc) == rank);
    RST(dm_main_process_first_begin(c, true));
    RST(dm_main_process_first_end(c, true));
    return 0;
}
static void test_mesh_split_local(void** s) { (void)s; assert_int_equal(run_world(8, body_groups, NULL, 90), 0); }

/* 32 create / collective / destroy cycles: the fd count comes back to where it started. */
static int body_cycles(dm_collective* c, int rank, int world, void* arg) {
    int before = tw_count_fds(), i, after;
    (void)c; (void)arg;
    for (i = 0; i < 32; i++) {
        dm_tcp_desc d;
        dm_collective* x = NULL;
        float f = 1.0f;
        dm_status st;
        make_desc(&d, rank, world);
        st = dm_tcp_create(&d, &x);
        if (st != DM_OK) { fprintf(stderr, "rank %d: cycle %d: %s\n", rank, i, dm_status_name(st)); return 1; }
        if (dm_all_reduce(x, NULL, &f, 1, DM_FLOAT32, DM_SUM) != DM_OK || f != (float)world) return 1;
        dm_destroy(x);
    }
    after = tw_count_fds();
    if (after != before) { fprintf(stderr, "rank %d: %d fds before, %d after\n", rank, before, after); return 1; }
    return 0;
}
static void test_create_destroy_no_fd_leak(void** s) {
    (void)s;
    assert_int_equal(run_world_ex(3, body_cycles, NULL, 60, false), 0);
}

/* Ranks disagree on count: both report DM_ERR_MISMATCH naming both calls; then ABORTED. */
static int body_mismatch(dm_collective* c, int rank, int world, void* arg) {
    float x[11] = {0};
    dm_status st;
    (void)world; (void)arg;
    st = dm_all_reduce(c, NULL, x, rank == 0 ? 10 : 11, DM_FLOAT32, DM_SUM);
    if (st != DM_ERR_MISMATCH) { fprintf(stderr, "rank %d: got %s: %s\n", rank, dm_status_name(st), dm_last_error(c)); return 1; }
    if (!strstr(dm_last_error(c), "count 10") || !strstr(dm_last_error(c), "count 11")) {
        fprintf(stderr, "rank %d: message: %s\n", rank, dm_last_error(c));
        return 1;
    }
    return dm_barrier(c) == DM_ERR_ABORTED ? 0 : 1;
}
static void test_mismatch(void** s) { (void)s; assert_int_equal(run_world(2, body_mismatch, NULL, 30), 0); }

/* One error on every rank: rank 2 of 4 disagrees (another collective, another count, another
   root, count 0 against 8); every rank returns DM_ERR_MISMATCH with a message naming both
   calls, whether it saw the mismatch itself or learned it from the notice; later calls fail. */
static int body_mismatch_all(dm_collective* c, int rank, int world, void* arg) {
    int kind = *(const int*)arg;
    float x[64] = {0}, g[4 * 64];
    dm_status st;
    const char *a, *b;
    (void)world;
    switch (kind) {
        case 0:
            st = rank == 2 ? dm_all_gather(c, x, g, 10, DM_FLOAT32) : dm_all_reduce(c, NULL, x, 10, DM_FLOAT32, DM_SUM);
            a = "all_gather"; b = "all_reduce";
            break;
        case 1:
            st = dm_all_reduce(c, NULL, x, rank == 2 ? 10 : 11, DM_FLOAT32, DM_SUM);
            a = "count 10"; b = "count 11";
            break;
        case 2:
            st = dm_broadcast(c, x, 64, DM_FLOAT32, rank == 2 ? 2 : 0);
            a = "root 2"; b = "root 0";
            break;
        default:
            st = dm_all_reduce(c, NULL, x, rank == 2 ? 0 : 8, DM_FLOAT32, DM_SUM);
            a = "count 0"; b = "count 8";
            break;
    }
    if (st != DM_ERR_MISMATCH || !strstr(dm_last_error(c), a) || !strstr(dm_last_error(c), b)) {
        fprintf(stderr, "rank %d, case %d: %s: %s\n", rank, kind, dm_status_name(st), dm_last_error(c));
        return 1;
    }
    if (rank == 0) printf("  case %d, rank 0: %s\n", kind, dm_last_error(c));
    return dm_barrier(c) == DM_ERR_ABORTED ? 0 : 1;
}
static void mismatch_all(const char* transport) {
    int kind, failed = 0;
    g_transport = transport;
    for (kind = 0; kind < 4; kind++) failed += run_world(4, body_mismatch_all, &kind, 30);
    g_transport = NULL;
    assert_int_equal(failed, 0);
}
static void test_mismatch_every_rank_shm(void** s) { (void)s; mismatch_all(NULL); }
static void test_mismatch_every_rank_tcp(void** s) { (void)s; mismatch_all("tcp"); }

/* A rank with the wrong token is refused; the other one times out waiting for a real peer. */
static int body_token(dm_collective* c, int rank, int world, void* arg) {
    dm_tcp_desc d;
    dm_collective* x = NULL;
    dm_status st;
    (void)c; (void)arg;
    make_desc(&d, rank, world);
    d.token = rank == 1 ? "wrong" : "secret";
    d.timeout_ms = 1500;
    st = dm_tcp_create(&d, &x);
    if (x) dm_destroy(x);
    if (st != (rank == 1 ? DM_ERR_REFUSED : DM_ERR_TIMEOUT)) {
        fprintf(stderr, "rank %d: token test got %s\n", rank, dm_status_name(st));
        return 1;
    }
    return 0;
}
static void test_token_refused(void** s) { (void)s; assert_int_equal(run_world_ex(2, body_token, NULL, 30, false), 0); }

/* DISTMESH_TRANSPORT=tcp from the environment: sockets, and all collectives correct. */

int main(int argc, char** argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_world_1),
        cmocka_unit_test(test_world_2),
        cmocka_unit_test(test_shm_sleep_wake),
        cmocka_unit_test(test_shm_moves_off_peer_core),
        cmocka_unit_test(test_shm_eager_stream),
        cmocka_unit_test(test_shm_single_copy),
        cmocka_unit_test(test_shm_single_copy_refused),
        cmocka_unit_test(test_same_machine_sockets_reno),
        cmocka_unit_test(test_world_3),
        cmocka_unit_test(test_world_4),
        cmocka_unit_test(test_world_8),
        cmocka_unit_test(test_world_7),
        cmocka_unit_test(test_world_tcp_2),
        cmocka_unit_test(test_world_tcp_3),
        cmocka_unit_test(test_world_tcp_4),
        cmocka_unit_test(test_mesh_split_local),
        cmocka_unit_test(test_create_destroy_no_fd_leak),
        cmocka_unit_test(test_mismatch),
        cmocka_unit_test(test_mismatch_every_rank_shm),
        cmocka_unit_test(test_mismatch_every_rank_tcp),
        cmocka_unit_test(test_token_refused),
    };
    return TCP_RUN_TESTS(tests, argc, argv);
}
