/* dm_grow on the TCP backend (docs/failures.md "Grow back"): member processes forked on
   127.0.0.1 create a world through a file store in a mkdtemp directory, then grow it with
   newcomer processes that join through the same store (dm_tcp_desc.join). Every process is a
   fork with its own alarm (tests/test_world.h); the parent kills whatever is left after the
   test's limit.

   Checks: ranks (members keep theirs, newcomers take the next in arrival order), the new
   group's size, an all-reduce whose exact sum is known, state moved by a broadcast from a
   member, growing twice, a newcomer with the wrong token, a newcomer that never comes (every
   member gets DM_ERR_TIMEOUT naming the missing rank within its deadline, and the old group
   still works), a newcomer with no grow open, disagreeing members and bad arguments; the
   compressed all-reduce's error-feedback state across a grow (members keep theirs, newcomers
   start at zero). */
#define _GNU_SOURCE
#include "distmesh.h"
#include "test_util.h"
#include "prelude.h"
#include <signal.h>
#include <time.h>
#include <unistd.h>
#include <sys/types.h>
#include <sys/wait.h>
#include "test_world.h"

static tw_store g_store;        /* the program's file store; tw_store_next: a fresh prefix per test */

/* A forked process returns 1 on a failed check, after a line naming it. */
static int pfailed(int line, const char* what, dm_status st, dm_collective* c) {
    if (st == DM_OK) fprintf(stderr, "%s: check failed at %s:%d: %s\n", tw_me.who, __FILE__, line, what);
    else fprintf(stderr, "%s: %s failed at %s:%d: %s: %s\n", tw_me.who, what, __FILE__, line, dm_status_name(st),
                 c ? dm_last_error(c) : "");
    return 1;
}
#define PCHECK(cond) do { if (!(cond)) return pfailed(__LINE__, #cond, DM_OK, NULL); } while (0)
#define PST(c, expr) do { dm_status st_ = (expr); if (st_ != DM_OK) return pfailed(__LINE__, #expr, st_, c); } while (0)

/* ---- processes ------------------------------------------------------------------------------ */
static tw_world g_procs;        /* the running test's processes */
/* Forks fn(index, arg), named "<who> <index>", with its own alarm at limit_s + 5. */
static void spawn(const char* who, int index, tw_fn fn, void* arg, double limit_s) {
    g_procs.alarm_s = (int)limit_s + 5;
    assert_true(tw_spawn(&g_procs, who, index, fn, arg) >= 0);
}
/* Waits for every spawned process; kills what is left after limit_s. Returns how many failed. */
static int reap(double limit_s) {
    int failed = tw_reap(&g_procs, limit_s);
    memset(&g_procs, 0, sizeof(g_procs));
    return failed;
}

static void new_run(void) { tw_store_next(&g_store); }
/* On a fresh store prefix, forks n_members members (indexes 0..) then n_new newcomers (newcomer may be NULL when n_new
   is 0), each with its own alarm; every one must succeed within limit_s. */
static void run_group(tw_fn member, int n_members, tw_fn newcomer, int n_new, double limit_s) {
    int i;
    new_run();
    for (i = 0; i < n_members; i++) spawn("member", i, member, NULL, limit_s);
    for (i = 0; i < n_new; i++) spawn("newcomer", i, newcomer, NULL, limit_s);
    assert_int_equal(reap(limit_s), 0);
}

/* ---- the group ------------------------------------------------------------------------------ */
static void make_desc(dm_tcp_desc* d, int rank, int world) { tw_tcp_desc(d, &g_store, rank, world, 20000); }
/* Member rank of 2 on the desc's transport (NULL: auto) with token (NULL: none). */
static dm_status create_member(int rank, const char* transport, const char* token, dm_collective** out) {
    dm_tcp_desc d;
    make_desc(&d, rank, 2);
    d.transport = transport;
    d.token = token;
    return dm_tcp_create(&d, out);
}
static dm_status join(dm_collective** out, const char* token, int timeout_ms) {
    dm_tcp_desc d;
    make_desc(&d, 0, 0);
    d.join = 1;
    d.token = token;
    d.timeout_ms = timeout_ms;
    return dm_tcp_create(&d, out);
}

/* An all-reduce whose exact result every rank knows: element i is sum over ranks (r + 1) * (i + 1). */
static int check_all_reduce(dm_collective* c) {
    int W = dm_world_size(c), r = dm_rank(c);
    double v[1000];
    size_t i;
    for (i = 0; i < 1000; i++) v[i] = (double)((r + 1) * (int)(i + 1));
    PST(c, dm_all_reduce(c, v, v, 1000, DM_FLOAT64, DM_SUM));
    for (i = 0; i < 1000; i++) PCHECK(v[i] == (double)(W * (W + 1) / 2 * (int)(i + 1)));
    return 0;
}
/* The state a member (rank 0) sends the newcomers: step and weights. */
static int move_state(dm_collective* c, int step) {
    float w[257];
    int i;
    for (i = 0; i < 257; i++) w[i] = dm_rank(c) == 0 ? (float)(step * 1000 + i) : -1.0f;
    PST(c, dm_broadcast(c, w, 257, DM_FLOAT32, 0));
    for (i = 0; i < 257; i++) PCHECK(w[i] == (float)(step * 1000 + i));
    return 0;
}
/* A member grows c by n_new and checks its rank and the size. */
static int grow_checked(dm_collective* c, int n_new, dm_collective** out) {
    int r = dm_rank(c), W = dm_world_size(c);
    PST(c, dm_grow(c, n_new, out));
    PCHECK(dm_rank(*out) == r && dm_world_size(*out) == W + n_new);
    return 0;
}

/* ---- 2 -> 3 -> 4, one newcomer each time; the first newcomer is a member of the second grow */
static int member_twice(int rank, void* arg) {
    dm_collective *c = NULL, *g3 = NULL, *g4 = NULL;
    int bad;
    (void)arg;
    PST(c, create_member(rank, NULL, NULL, &c));
    bad = check_all_reduce(c) || grow_checked(c, 1, &g3) || move_state(g3, 1) || check_all_reduce(g3);
    dm_destroy(c);      /* the grown group keeps its own handle on the store */
    c = NULL;
    bad = bad || grow_checked(g3, 1, &g4) || move_state(g4, 2) || check_all_reduce(g4);
    if (!bad && rank == 0) printf("  members 0, 1 grew to 3 then 4 ranks (%s): state and all-reduces correct\n",
                                  dm_transport_name(g4));
    dm_destroy(g4);
    dm_destroy(g3);
    dm_destroy(c);
    return bad;
}
static int newcomer_twice(int index, void* arg) {
    dm_collective *g = NULL, *g4 = NULL;
    int bad;
    (void)arg;
    if (index == 1) usleep(300000);     /* after newcomer 0: the second grow's */
    PST(g, join(&g, NULL, 20000));
    PCHECK(dm_rank(g) == 2 + index && dm_world_size(g) == 3 + index);
    bad = move_state(g, 1 + index) || check_all_reduce(g);
    if (!bad && index == 0) bad = grow_checked(g, 1, &g4) || move_state(g4, 2) || check_all_reduce(g4);
    dm_destroy(g4);
    dm_destroy(g);
    return bad;
}
static void test_grow_twice(void** s) {
    (void)s;
    run_group(member_twice, 2, newcomer_twice, 2, 60);
}

/* ---- 2 -> 4 at once: newcomers ranked in arrival order; sockets only ------------------------ */
static int member_two_new(int rank, void* arg) {
    dm_collective *c = NULL, *g = NULL;
    int bad;
    (void)arg;
    PST(c, create_member(rank, "tcp", NULL, &c));
    usleep(600000);                     /* both newcomers wait for their seats first */
    bad = grow_checked(c, 2, &g) || move_state(g, 7) || check_all_reduce(g);
    if (!bad) PCHECK(strcmp(dm_transport_name(g), "tcp") == 0);
    dm_destroy(g);
    dm_destroy(c);
    return bad;
}
static int newcomer_ordered(int index, void* arg) {
    dm_collective* g = NULL;
    int bad;
    (void)arg;
    usleep((useconds_t)index * 300000); /* newcomer 1 takes its ticket 300 ms after newcomer 0 */
    PST(g, join(&g, NULL, 20000));
    PCHECK(dm_rank(g) == 2 + index && dm_world_size(g) == 4);
    PCHECK(strcmp(dm_transport_name(g), "tcp") == 0);   /* the group's transport, from the seat */
    bad = move_state(g, 7) || check_all_reduce(g);
    dm_destroy(g);
    return bad;
}
static void test_grow_two_at_once(void** s) {
    (void)s;
    run_group(member_two_new, 2, newcomer_ordered, 2, 60);
}

/* ---- a newcomer that never comes: DM_ERR_TIMEOUT naming rank 2 by the deadline; the old
   group still works, and the next grow (the seat taken back, its ticket skipped) succeeds -- */
#define NEVER_MS 1500
static int member_never(int rank, void* arg) {
    dm_collective *c = NULL, *g = NULL;
    double t0, took;
    dm_status st;
    (void)arg;
    PST(c, create_member(rank, NULL, NULL, &c));
    PST(c, dm_set_timeout(c, NEVER_MS));
    t0 = tw_now_s();
    st = dm_grow(c, 1, &g);
    took = tw_now_s() - t0;
    if (st != DM_ERR_TIMEOUT || g || !strstr(dm_last_error(c), "rank 2 of 3 never joined") || took > NEVER_MS / 1e3 + 2) {
        fprintf(stderr, "%s: grow without a newcomer: %s after %.2f s (%s)\n", tw_me.who, dm_status_name(st), took,
                dm_last_error(c));
        return 1;
    }
    if (rank == 0) printf("  no newcomer: %s after %.2f s (deadline %.1f s): %s\n", dm_status_name(st), took,
                          NEVER_MS / 1e3, dm_last_error(c));
    PCHECK(check_all_reduce(c) == 0);   /* the group goes on */
    /* the newcomer that comes late: the revoked seat's ticket is void, the next grow seats it */
    PST(c, dm_set_timeout(c, 20000));
    PCHECK(grow_checked(c, 1, &g) == 0 && move_state(g, 3) == 0 && check_all_reduce(g) == 0);
    dm_destroy(g);
    dm_destroy(c);
    return 0;
}
static int newcomer_late(int index, void* arg) {
    dm_collective* g = NULL;
    int bad;
    (void)index; (void)arg;
    usleep((NEVER_MS + 1500) * 1000);   /* after the members' first grow failed */
    PST(g, join(&g, NULL, 20000));
    PCHECK(dm_rank(g) == 2 && dm_world_size(g) == 3);
    bad = move_state(g, 3) || check_all_reduce(g);
    dm_destroy(g);
    return bad;
}
static void test_grow_newcomer_never_comes(void** s) {
    (void)s;
    run_group(member_never, 2, newcomer_late, 1, 60);
}

/* ---- a newcomer with the wrong token is refused; the members fail by their deadline ------- */
#define TOKEN_MS 2000
static int member_token(int rank, void* arg) {
    dm_collective *c = NULL, *g = NULL;
    double t0, took;
    dm_status st;
    (void)arg;
    PST(c, create_member(rank, NULL, "secret", &c));
    PST(c, dm_set_timeout(c, TOKEN_MS));
    t0 = tw_now_s();
    st = dm_grow(c, 1, &g);
    took = tw_now_s() - t0;
    if (st == DM_OK || g || took > TOKEN_MS / 1e3 + 2) {
        fprintf(stderr, "%s: grow with a wrong-token newcomer: %s after %.2f s\n", tw_me.who, dm_status_name(st), took);
        dm_destroy(g);
        return 1;
    }
    if (rank == 0) printf("  wrong-token newcomer: members got %s after %.2f s: %s\n", dm_status_name(st), took,
                          dm_last_error(c));
    PCHECK(check_all_reduce(c) == 0);
    dm_destroy(c);
    return 0;
}
static int newcomer_wrong_token(int index, void* arg) {
    dm_collective* g = NULL;
    dm_status st;
    (void)index; (void)arg;
    st = join(&g, "wrong", TOKEN_MS);
    dm_destroy(g);
    if (st != DM_ERR_REFUSED) {
        fprintf(stderr, "%s: join with the wrong token: %s, expected DM_ERR_REFUSED\n", tw_me.who, dm_status_name(st));
        return 1;
    }
    return 0;
}
static void test_grow_wrong_token(void** s) {
    (void)s;
    run_group(member_token, 2, newcomer_wrong_token, 1, 30);
}

/* ---- shrink, then grow back to the original size with a new process: member rank 0 hosts a
   TCP store with a token (it stays); rank 2 leaves (DM_SHRINK_DEFAULT), a newcomer takes its
   place. The store moves to the shrunk group, the grown group takes a handle on it. */
static int g_port;
static int member_shrink_grow(int rank, void* arg) {
    dm_collective *c = NULL, *sh = NULL, *g = NULL;
    dm_tcp_desc d;
    char url[64];
    int gone = 2, bad;
    (void)arg;
    make_desc(&d, rank, 3);
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", g_port);
    d.store_url = url;                  /* rank 0 hosts it */
    d.token = "secret";
    PST(c, dm_tcp_create(&d, &c));
    PCHECK(check_all_reduce(c) == 0);
    if (rank == gone) {                 /* leaves: the others exclude it */
        dm_destroy(c);
        return 0;
    }
    PST(c, dm_shrink(c, &gone, 1, DM_SHRINK_DEFAULT, &sh));
    dm_destroy(c);
    PCHECK(dm_rank(sh) == rank && dm_world_size(sh) == 2);
    bad = check_all_reduce(sh) || grow_checked(sh, 1, &g) || move_state(g, 9) || check_all_reduce(g);
    dm_destroy(sh);
    if (bad) { dm_destroy(g); return 1; }
    /* the grown group shrinks too: rank 1 leaves, rank 0 and the newcomer stay */
    gone = 1;
    if (rank == 1) { dm_destroy(g); return 0; }
    PST(g, dm_shrink(g, &gone, 1, DM_SHRINK_DEFAULT, &sh));
    dm_destroy(g);
    PCHECK(dm_rank(sh) == 0 && dm_world_size(sh) == 2);
    bad = check_all_reduce(sh) || move_state(sh, 10);
    if (!bad && rank == 0) printf("  3 ranks, rank 2 left (dm_shrink), a new process took rank 2 (dm_grow), then rank 1 "
                                  "left (dm_shrink of the grown group): correct\n");
    if (!bad) bad = dm_barrier(sh) != DM_OK;    /* rank 0's store serves until everyone is done */
    dm_destroy(sh);
    return bad;
}
static int newcomer_shrink_grow(int index, void* arg) {
    dm_collective* g = NULL;
    dm_tcp_desc d;
    char url[64];
    int bad;
    (void)index; (void)arg;
    make_desc(&d, 0, 0);
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", g_port);
    d.store_url = url;
    d.token = "secret";
    d.join = 1;
    PST(g, dm_tcp_create(&d, &g));
    PCHECK(dm_rank(g) == 2 && dm_world_size(g) == 3);
    bad = move_state(g, 9) || check_all_reduce(g);
    if (!bad) {
        dm_collective* sh = NULL;
        int gone = 1;
        PST(g, dm_shrink(g, &gone, 1, DM_SHRINK_DEFAULT, &sh));
        PCHECK(dm_rank(sh) == 1 && dm_world_size(sh) == 2);
        bad = check_all_reduce(sh) || move_state(sh, 10) || dm_barrier(sh) != DM_OK;
        dm_destroy(sh);
    }
    dm_destroy(g);
    return bad;
}
static void test_grow_after_shrink(void** s) {
    (void)s;
    new_run();
    g_port = tw_free_port();
    assert_true(g_port > 0);
    spawn("member", 0, member_shrink_grow, NULL, 60);
    spawn("member", 1, member_shrink_grow, NULL, 60);
    spawn("member", 2, member_shrink_grow, NULL, 60);
    usleep(200000);                     /* after rank 0's store is up (it would be waited for anyway) */
    spawn("newcomer", 0, newcomer_shrink_grow, NULL, 60);
    assert_int_equal(reap(60), 0);
}

/* ---- a split group outlives its parent and still reaches the store: dm_grow on it after the
   parent is destroyed fails cleanly by its deadline (no newcomer), then the group works -------- */
static int member_split_orphan(int rank, void* arg) {
    dm_collective *c = NULL, *sub = NULL, *g = NULL;
    dm_status st;
    (void)arg;
    PST(c, create_member(rank, NULL, NULL, &c));
    PST(c, dm_split(c, 0, rank, &sub));
    dm_destroy(c);                      /* the world owned the store; sub has its own handle */
    PST(sub, dm_set_timeout(sub, 800));
    st = dm_grow(sub, 1, &g);
    PCHECK(st == DM_ERR_TIMEOUT && g == NULL);
    PST(sub, dm_set_timeout(sub, 20000));
    PCHECK(check_all_reduce(sub) == 0);
    dm_destroy(sub);
    return 0;
}
static void test_grow_split_after_parent_destroyed(void** s) {
    (void)s;
    run_group(member_split_orphan, 2, NULL, 0, 30);
}

/* ---- a launched newcomer: dm_init with DISTMESH_JOIN=1, DISTMESH_STORE, the default prefix -- */
static int member_env(int rank, void* arg) {
    dm_collective *c = NULL, *g = NULL;
    dm_tcp_desc d;
    int bad;
    (void)arg;
    make_desc(&d, rank, 2);
    d.prefix = NULL;                    /* "distmesh/", what dm_init uses */
    PST(c, dm_tcp_create(&d, &c));
    bad = grow_checked(c, 1, &g) || move_state(g, 5) || check_all_reduce(g);
    dm_destroy(g);
    dm_destroy(c);
    return bad;
}
static int newcomer_env(int index, void* arg) {
    dm_collective* g = NULL;
    dm_init_desc d;
    int bad;
    (void)index; (void)arg;
    memset(&d, 0, sizeof(d));
    d.timeout_ms = 20000;
    setenv("DISTMESH_JOIN", "1", 1);
    setenv("DISTMESH_STORE", g_store.url, 1);
    setenv("DISTMESH_SOCKET_IFNAME", "lo", 1);
    setenv("RANK", "0", 1);             /* a launcher's leftovers are ignored: the rank is assigned */
    setenv("WORLD_SIZE", "1", 1);
    PST(g, dm_init(&d, &g));
    PCHECK(strcmp(dm_backend_name(g), "tcp") == 0 && dm_rank(g) == 2 && dm_world_size(g) == 3);
    bad = move_state(g, 5) || check_all_reduce(g);
    dm_destroy(g);
    return bad;
}
static void test_grow_join_env(void** s) {
    (void)s;
    run_group(member_env, 2, newcomer_env, 1, 60);
}

/* ---- a newcomer with no grow open fails at its deadline, with a message ------------------- */
typedef struct { char msg[DM_LAST_ERROR_SIZE]; } log_capture;
static void capture(dm_log_level level, dm_status st, const char* msg, const char* file, int line, void* user) {
    (void)st; (void)file; (void)line;
    if (level == DM_LOG_ERROR) snprintf(((log_capture*)user)->msg, DM_LAST_ERROR_SIZE, "%s", msg);
}
static void test_join_without_grow(void** s) {
    dm_tcp_desc d;
    dm_collective* g = NULL;
    log_capture cap;
    double t0, took;
    dm_status st;
    (void)s;
    new_run();
    make_desc(&d, 0, 0);
    d.join = 1;
    d.timeout_ms = 700;
    d.logger.func = capture;
    d.logger.user_data = &cap;
    cap.msg[0] = 0;
    t0 = tw_now_s();
    st = dm_tcp_create(&d, &g);
    took = tw_now_s() - t0;
    printf("  join with no grow open: %s after %.2f s: %s\n", dm_status_name(st), took, cap.msg);
    assert_int_equal(st, DM_ERR_TIMEOUT);
    assert_null(g);
    assert_true(took >= 0.6 && took < 3);
    assert_non_null(strstr(cap.msg, "no group opened a grow"));
}

/* ---- members that disagree on n_new all fail and go on; bad arguments -------------------- */
static int member_disagree(int rank, void* arg) {
    dm_collective *c = NULL, *g = NULL;
    dm_status st;
    (void)arg;
    PST(c, create_member(rank, NULL, NULL, &c));
    st = dm_grow(c, rank + 1, &g);
    PCHECK(st == DM_ERR_INVALID_ARG && g == NULL && strstr(dm_last_error(c), "same n_new"));
    PCHECK(check_all_reduce(c) == 0);
    PCHECK(dm_grow(c, 0, &g) == DM_ERR_INVALID_ARG && g == NULL);
    PCHECK(dm_grow(c, -3, &g) == DM_ERR_INVALID_ARG && g == NULL);
    PCHECK(dm_grow(c, 1, NULL) == DM_ERR_INVALID_ARG);
    PCHECK(check_all_reduce(c) == 0);
    dm_destroy(c);
    return 0;
}
static void test_grow_bad_args(void** s) {
    dm_fake_desc fd;
    dm_collective *f = NULL, *g = NULL;
    dm_tcp_desc d;
    (void)s;
    assert_int_equal(dm_grow(NULL, 1, &g), DM_ERR_INVALID_ARG);
    memset(&fd, 0, sizeof(fd));
    assert_int_equal(dm_fake_create(&fd, &f), DM_OK);
    assert_int_equal(dm_grow(f, 1, &g), DM_ERR_UNSUPPORTED);   /* the fake backend has no newcomers */
    assert_null(g);
    dm_destroy(f);
    /* DISTMESH_JOIN must be 0 or 1 */
    new_run();
    make_desc(&d, 0, 1);
    setenv("DISTMESH_JOIN", "yes", 1);
    assert_int_equal(dm_tcp_create(&d, &g), DM_ERR_ENV);
    assert_null(g);
    unsetenv("DISTMESH_JOIN");
    run_group(member_disagree, 2, NULL, 0, 30);
}

/* ---- the compressed all-reduce's error feedback across dm_grow (issue 38) --------------------
   Members 0 and 1 on simulated hosts h0 and h1 (one rank each) run int8 all-reduces with their
   error-feedback states, then grow by two newcomers (h0, h1: 2 x 2, interleaved) that start
   with fresh states. After the grow every call's bits are the same on all 4 ranks, and the
   average over 48 calls of the same input converges to the exact sum: the members' residuals,
   made on the 2 x 1 layout, are valid on the new one. */
#define GC_COUNT 3000
#define GC_STEPS 48
static float gc_value(int r, size_t i) {
    uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(r * 40503u + 17u);
    h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    return (float)(((double)(h % 2001) - 1000.0) / 1000.0);
}
/* n compressed calls of this rank's input with state, each checked for the same bits on every
   rank; the sum of the results (over the calls) added into acc when acc is set. */
static int gc_calls(dm_collective* c, dm_compress_state* state, int n, double* acc) {
    float buf[GC_COUNT], all[4 * GC_COUNT];
    int k, q, W = dm_world_size(c);
    size_t i;
    for (k = 0; k < n; k++) {
        for (i = 0; i < GC_COUNT; i++) buf[i] = gc_value(dm_rank(c), i);
        PST(c, dm_all_reduce_compressed(c, NULL, buf, GC_COUNT, DM_FLOAT32, DM_SUM, DM_COMPRESS_INT8, state));
        PCHECK(strcmp(dm_last_algorithm(c), "two_level_int8") == 0);
        PST(c, dm_all_gather(c, buf, all, GC_COUNT, DM_FLOAT32));
        for (q = 1; q < W; q++) PCHECK(memcmp(all, all + (size_t)q * GC_COUNT, sizeof(buf)) == 0);
        for (i = 0; acc && i < GC_COUNT; i++) acc[i] += buf[i];
    }
    return 0;
}
/* After the grow: the average's worst error against the exact 4-rank sum, and one call's bound
   (the largest |host sum| x 2 hosts / 254), both checked on rank 0. */
static int gc_after_grow(dm_collective* g, dm_compress_state* state) {
    double acc[GC_COUNT] = { 0 }, worst = 0, m = 0;
    size_t i;
    int r;
    if (gc_calls(g, state, GC_STEPS, acc)) return 1;
    for (i = 0; i < GC_COUNT; i++) {
        double exact = 0, h0 = 0, h1 = 0;
        for (r = 0; r < 4; r++) {
            exact += gc_value(r, i);
            if (r % 2 == 0) h0 += gc_value(r, i); else h1 += gc_value(r, i);
        }
        worst = fmax(worst, fabs(acc[i] / GC_STEPS - exact));
        m = fmax(m, fmax(fabs(h0), fabs(h1)));
    }
    if (dm_rank(g) == 0)
        printf("  after the grow: average error over %d calls %.3g, one call's bound %.3g\n", GC_STEPS, worst, m * 2 / 254);
    PCHECK(worst < m * 2 / 254 / 8);
    /* what the members dropped on the 2 x 1 layout (their whole buffer) has been added back: a
       residual is left only in the block this rank now encodes (half of the buffer on 2 x 2) */
    for (r = 0, i = 0; i < GC_COUNT; i++) r += dm_compress_state_residual(state)[i] != 0.0f;
    PCHECK(r <= GC_COUNT / 2);
    return 0;
}
static int member_compress(int rank, void* arg) {
    dm_collective *c = NULL, *g = NULL;
    dm_compress_state* state = NULL;
    int bad;
    (void)arg;
    setenv("DISTMESH_TEST_HOST_ID", rank == 0 ? "h0" : "h1", 1);
    PST(c, create_member(rank, NULL, NULL, &c));
    PST(c, dm_compress_state_create(GC_COUNT, &state));
    bad = gc_calls(c, state, 8, NULL) || grow_checked(c, 2, &g) || gc_after_grow(g, state);
    dm_compress_state_destroy(state);
    dm_destroy(g);
    dm_destroy(c);
    return bad;
}
static int newcomer_compress(int index, void* arg) {
    dm_collective* g = NULL;
    dm_compress_state* state = NULL;
    int bad;
    (void)arg;
    setenv("DISTMESH_TEST_HOST_ID", index == 0 ? "h0" : "h1", 1);
    usleep((useconds_t)index * 300000);     /* rank 2 on h0, rank 3 on h1 */
    PST(g, join(&g, NULL, 20000));
    PCHECK(dm_rank(g) == 2 + index);
    PST(g, dm_compress_state_create(GC_COUNT, &state));     /* a newcomer starts at zero */
    bad = gc_after_grow(g, state);
    dm_compress_state_destroy(state);
    dm_destroy(g);
    return bad;
}
static void test_grow_compress_state(void** s) {
    (void)s;
    run_group(member_compress, 2, newcomer_compress, 2, 60);
}

/* ---- the example: examples/ddp_overlap.c --elastic / --rejoin ------------------------------- */
#ifndef DM_DDP
#define DM_DDP "build/plain/examples/ddp_overlap"
#endif
static char g_out[1 << 16];
/* Runs the example with args under a 90 s timeout; its stdout+stderr land in g_out. Returns its
   exit status. */
static int run_example(const char* args) {
    char cmd[1024];
    int rc;
    snprintf(cmd, sizeof(cmd), "env -u RANK -u WORLD_SIZE -u DISTMESH_STORE %s %s", DM_DDP, args);
    rc = tw_run_cmd(90, g_out, sizeof(g_out), cmd);
    printf("%s", g_out);
    return rc;
}
/* 3 ranks train; a newcomer process joins through dm_grow at step 21 and gets the weights by
   broadcast; all 4 end with identical weights and a lower loss. */
static void test_example_grow(void** s) {
    (void)s;
    assert_int_equal(run_example("--rejoin --kill-at 0 --rejoin-at 20 --steps 40 --hidden 64"), 0);
    check_has_all(g_out,
                  "newcomer: joined as rank 3 of 4 at step 21, weights received",
                  "grew to 4 ranks at step 21",
                  "weights identical on all 4 ranks",
                  ": down",
                  NULL);
}

/* 3 ranks train; rank 1 is kill -9'd at step 11; the survivors shrink, check identical weights,
   re-shard and go on; a restarted process joins at step 21 (dm_grow) and gets the weights; all 3
   end with identical weights and a lower loss. */
static void test_example_elastic_rejoin(void** s) {
    (void)s;
    assert_int_equal(run_example("--rejoin --kill-at 10 --rejoin-at 20 --steps 40 --hidden 64"), 0);
    check_has_all(g_out,
                  "supervisor: kill -9 of rank 1",
                  "rank 0 -> 0: DM_ERR_PEER_LOST at step 11; shrunk from 3 to 2 ranks",
                  "rank 2 -> 1: DM_ERR_PEER_LOST at step 11; shrunk from 3 to 2 ranks",
                  "resuming at step 11",
                  "newcomer: joined as rank 2 of 3 at step 21, weights received",
                  "weights identical on all 3 ranks",
                  ": down",
                  NULL);
}
/* --elastic alone: the two survivors finish. */
static void test_example_elastic(void** s) {
    (void)s;
    assert_int_equal(run_example("--elastic --kill-at 10 --steps 30 --hidden 64 --victim 0"), 0);
    check_has_all(g_out,
                  "supervisor: kill -9 of rank 0",
                  "shrunk from 3 to 2 ranks",
                  "weights identical on all 2 ranks",
                  ": down",
                  NULL);
}

TW_STORE_FIXTURES(g_store, "dm_grow_test", SIG_DFL)      /* SIGPIPE fatal: the library must never raise it */

DM_TEST_MAIN(setup_store, teardown_store,
    cmocka_unit_test(test_grow_twice),
    cmocka_unit_test(test_grow_two_at_once),
    cmocka_unit_test(test_grow_newcomer_never_comes),
    cmocka_unit_test(test_grow_wrong_token),
    cmocka_unit_test(test_grow_after_shrink),
    cmocka_unit_test(test_grow_split_after_parent_destroyed),
    cmocka_unit_test(test_grow_join_env),
    cmocka_unit_test(test_join_without_grow),
    cmocka_unit_test(test_grow_bad_args),
    cmocka_unit_test(test_grow_compress_state),
    cmocka_unit_test(test_example_grow),
    cmocka_unit_test(test_example_elastic),
    cmocka_unit_test(test_example_elastic_rejoin))
