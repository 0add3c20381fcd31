/* Acceptance tests of issue 19 "See inside": the timeline (DISTMESH_TRACE), the flight recorder
   (DISTMESH_FLIGHT_RECORDER, DISTMESH_DUMP_DIR, SIGUSR1, dm_flight_recorder_dump) and the report
   of scripts/dm_trace, on real forked ranks.

   - timeline_*: every op kind, blocking and _async, on the threaded world, shared memory and TCP;
     each rank's file must be valid JSON (python3's json module) with exactly one collective event
     per sequence number 1 .. dm_sequence(c), and one event per point-to-point and object call.
   - sleeper_*: 4 ranks, rank 2 sleeps past the deadline before an all_reduce: every survivor
     writes a dump, and the report names rank 2 and "all_reduce #3", first from the survivors'
     dumps alone (rank 2 still asleep), then again once rank 2 arrived late and dumped too.
   - mismatch: rank 2 skips a broadcast; the report names it.
   - killed: a rank killed by SIGKILL leaves its timeline readable up to its last flush.
   - sigusr1: a rank blocked in an all_reduce dumps on SIGUSR1 (state "running").
   - dump_call: dm_flight_recorder_dump with a path, without one, and with everything off.

   Every world runs in forked children (tests/test_world.h) under a hard limit (the parent kills
   what is left). Each test has its own directory under the program's mkdtemp directory. */
#define _GNU_SOURCE
#include "distmesh.h"
#include "prelude.h"
#include <signal.h>
#include <errno.h>
#include <time.h>
#include <unistd.h>
#include <sys/types.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include "test_world.h"

#ifndef DM_SRCDIR
#define DM_SRCDIR "."
#endif

enum { TR_THREAD = 0, TR_SHM, TR_TCP };
static const char* const g_tr_name[] = { "thread", "shm", "tcp" };
static char g_root[256];        /* the program's directory */
static char g_dir[400];         /* the running test's: traces and dumps */
static tw_store g_store;         /* the running test's file store */
static int g_timeout_ms = 5000;

/* A fresh directory pair for one test: g_dir (files the ranks write) and g_store's. */
static void fresh_dirs(const char* name) {
    char store[400];
    snprintf(g_dir, sizeof(g_dir), "%s/%s", g_root, name);
    snprintf(store, sizeof(store), "%s/%s.store", g_root, name);
    tmpdir_remove(g_dir);
    tmpdir_remove(store);
    assert_int_equal(mkdir(g_dir, 0700), 0);
    assert_int_equal(mkdir(store, 0700), 0);
    tw_store_dir(&g_store, store);
}
static char* slurp(const char* path) {
    FILE* f = fopen(path, "rb");
    char* buf;
    long n;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = (char*)malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); buf = NULL; }
    if (buf) buf[n] = 0;
    fclose(f);
    return buf;
}
/* The one file of rank r named <what>.rank<r>.pid*.json in g_dir (what: dm_trace, dm_fr). */
static char* rank_file(const char* what, int r) {
    char cmd[600], path[512];
    FILE* p;
    snprintf(cmd, sizeof(cmd), "ls %s/%s.rank%d.pid*.json 2>/dev/null | head -1", g_dir, what, r);
    p = popen(cmd, "r");
    if (!p) return NULL;
    if (!fgets(path, sizeof(path), p)) { pclose(p); return NULL; }
    pclose(p);
    path[strcspn(path, "\n")] = 0;
    return slurp(path);
}
/* scripts/dm_trace's report on dir (60 s at most) into out: its exit status. */
static int report(const char* dir, char* out, size_t cap) {
    char cmd[700];
    snprintf(cmd, sizeof(cmd), "python3 %s/scripts/dm_trace %s 2>&1", DM_SRCDIR, dir);
    return tw_run_cmd(60, out, cap, cmd);
}
#define CHECK_HAS(text, needle)                                                               \
    do {                                                                                      \
        if (!strstr((text), (needle))) fail_msg("missing \"%s\" in:\n%s", (needle), (text));   \
    } while (0)

/* ---- worlds ------------------------------------------------------------------------------------ */
typedef int (*body_fn)(dm_collective* c, void* arg);   /* 0: every check passed */
/* The environment every rank of a test sees (set in the child, before anything is made). */
typedef struct world_env { bool trace, dump, signal; const char* fr; } world_env;
static const world_env* g_env;  /* the world being forked's (the children inherit it) */
static void apply_env(int rank, void* arg) {
    const world_env* e = g_env;
    (void)rank; (void)arg;
    if (e->trace) setenv("DISTMESH_TRACE", g_dir, 1); else unsetenv("DISTMESH_TRACE");
    if (e->dump) setenv("DISTMESH_DUMP_DIR", g_dir, 1); else unsetenv("DISTMESH_DUMP_DIR");
    if (e->signal) setenv("DISTMESH_DUMP_ON_SIGUSR1", "1", 1); else unsetenv("DISTMESH_DUMP_ON_SIGUSR1");
    if (e->fr) setenv("DISTMESH_FLIGHT_RECORDER", e->fr, 1); else unsetenv("DISTMESH_FLIGHT_RECORDER");
}
/* Forks the world into p (one process per rank; one for the threaded world), each with env,
   calls' deadline timeout_ms, its own alarm at limit_s + 5. */
static void spawn(tw_world* p, int kind, int world, const world_env* env, int timeout_ms, body_fn body, void* arg,
                  double limit_s) {
    tw_dm_world w;
    memset(&w, 0, sizeof(w));
    w.world = world;
    w.store = &g_store;
    w.transport = g_tr_name[kind];
    w.timeout_ms = timeout_ms;
    w.before = apply_env;
    w.body_c = body;
    w.arg = arg;
    g_env = env;
    memset(p, 0, sizeof(*p));
    p->alarm_s = (int)limit_s + 5;
    assert_int_equal(tw_dm_fork(p, &w), 0);
}
#define RANK_CHECK(c, cond)                                                                       \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            fprintf(stderr, "[rank %d] test_trace.c:%d: %s (%s)\n", dm_rank(c), __LINE__, #cond,    \
                    dm_last_error(c));                                                            \
            return 1;                                                                             \
        }                                                                                         \
    } while (0)

/* ---- 1. timeline: every op kind, blocking and _async ------------------------------------------- */
/* Op kinds as the timeline names them, and how many events each rank's run of every_op makes. */
static const char* const g_collectives[] = { "barrier", "all_reduce", "all_gather", "all_gather_to_list",
                                             "reduce_scatter", "broadcast", "reduce", "gather", "scatter",
                                             "all_to_all", "all_to_all_v" };
#define NCOLL ((int)(sizeof(g_collectives) / sizeof(g_collectives[0])))

/* Every call once, blocking (async false) or as its _async twin. */
static int every_op(dm_collective* c, bool async) {
    int W = dm_world_size(c), r = dm_rank(c), k;
    int32_t a[64], b[64 * 8];
    void* list[8];
    size_t counts[8], offs[8];
    dm_request* q[20];
    int nq = 0;
    dm_blob blob;
    dm_blob_list out1, out2;
    memset(a, 0, sizeof(a));
    memset(b, 0, sizeof(b));
    memset(&out1, 0, sizeof(out1));
    memset(&out2, 0, sizeof(out2));
    for (k = 0; k < W; k++) { list[k] = b + 4 * k; counts[k] = 1; offs[k] = (size_t)k; }
    blob.data = a;
    blob.size = 8;
#define CALL(blocking, asyncall)                                                                 \
    do {                                                                                         \
        if (async) RANK_CHECK(c, (asyncall) == DM_OK);                                           \
        else RANK_CHECK(c, (blocking) == DM_OK);                                                 \
    } while (0)
    CALL(dm_barrier(c), dm_barrier_async(c, &q[nq++]));
    CALL(dm_all_reduce(c, NULL, a, 4, DM_INT32, DM_SUM), dm_all_reduce_async(c, NULL, a, 4, DM_INT32, DM_SUM, &q[nq++]));
    CALL(dm_all_gather(c, a, b, 4, DM_INT32), dm_all_gather_async(c, a, b, 4, DM_INT32, &q[nq++]));
    CALL(dm_all_gather_to_list(c, a, list, 4, DM_INT32), dm_all_gather_to_list_async(c, a, list, 4, DM_INT32, &q[nq++]));
    CALL(dm_reduce_scatter(c, b, a, 2, DM_INT32, DM_SUM), dm_reduce_scatter_async(c, b, a, 2, DM_INT32, DM_SUM, &q[nq++]));
    CALL(dm_broadcast(c, a, 4, DM_INT32, W - 1), dm_broadcast_async(c, a, 4, DM_INT32, W - 1, &q[nq++]));
    CALL(dm_all_gather_objects(c, a, 12, &out1), dm_all_gather_objects_async(c, a, 12, &out1, &q[nq++]));
    CALL(dm_broadcast_objects(c, &blob, 1, 0, &out2), dm_broadcast_objects_async(c, &blob, 1, 0, &out2, &q[nq++]));
    CALL(dm_reduce(c, a, b, 4, DM_INT32, DM_SUM, 0), dm_reduce_async(c, a, b, 4, DM_INT32, DM_SUM, 0, &q[nq++]));
    CALL(dm_gather(c, a, b, 4, DM_INT32, 0), dm_gather_async(c, a, b, 4, DM_INT32, 0, &q[nq++]));
    CALL(dm_scatter(c, b, a, 4, DM_INT32, 0), dm_scatter_async(c, b, a, 4, DM_INT32, 0, &q[nq++]));
    CALL(dm_all_to_all(c, b, b + 64, 1, DM_INT32), dm_all_to_all_async(c, b, b + 64, 1, DM_INT32, &q[nq++]));
    CALL(dm_all_to_all_v(c, b, counts, offs, b + 64, counts, offs, DM_INT32),
         dm_all_to_all_v_async(c, b, counts, offs, b + 64, counts, offs, DM_INT32, &q[nq++]));
    CALL(dm_send(c, a, 4, DM_INT32, (r + 1) % W, 7), dm_send_async(c, a, 4, DM_INT32, (r + 1) % W, 7, &q[nq++]));
    CALL(dm_recv(c, b, 4, DM_INT32, (r + W - 1) % W, 7), dm_recv_async(c, b, 4, DM_INT32, (r + W - 1) % W, 7, &q[nq++]));
#undef CALL
    if (async) RANK_CHECK(c, dm_wait_all(q, (size_t)nq) == DM_OK);
    dm_blob_list_free(c, &out1);
    dm_blob_list_free(c, &out2);
    return 0;
}
static int timeline_body(dm_collective* c, void* arg) {
    dm_collective* sub = NULL;
    FILE* f;
    char path[600];
    (void)arg;
    if (every_op(c, false) || every_op(c, true)) return 1;
    RANK_CHECK(c, dm_split(c, 0, dm_rank(c), &sub) == DM_OK);
    RANK_CHECK(c, dm_barrier(sub) == DM_OK);
    dm_destroy(sub);
    /* what the parent compares each file with */
    snprintf(path, sizeof(path), "%s/expect.rank%d", g_dir, dm_rank(c));
    f = fopen(path, "w");
    RANK_CHECK(c, f != NULL);
    fprintf(f, "%llu\n", (unsigned long long)dm_sequence(c));
    fclose(f);
    return 0;
}
/* Events of one rank's timeline: the collective ones of group "world" by sequence number, and
   how many of each name. A line is one event (the writer's format). */
typedef struct tl_counts { int by_seq[256]; int named[32]; int p2p_send, p2p_recv, objects, queue, lines, sub; } tl_counts;
static void count_events(const char* text, tl_counts* n) {
    const char* line = text;
    memset(n, 0, sizeof(*n));
    while (line && *line) {
        const char* end = strchr(line, '\n');
        char buf[2048];
        size_t len = end ? (size_t)(end - line) : strlen(line);
        if (len >= sizeof(buf)) len = sizeof(buf) - 1;
        memcpy(buf, line, len);
        buf[len] = 0;
        n->lines++;
        bool collective = strstr(buf, "\"ph\":\"X\"") && !strstr(buf, "\"cat\":");  /* written without one */
        if (collective && strstr(buf, "\"group\":\"world\"")) {
            const char* s = strstr(buf, "\"seq\":");
            int k, seq = s ? atoi(s + 6) : -1;
            if (seq >= 0 && seq < 256) n->by_seq[seq]++;
            for (k = 0; k < NCOLL; k++) {
                char want[64];
                snprintf(want, sizeof(want), "{\"name\":\"%s\",", g_collectives[k]);
                if (strstr(buf, want)) n->named[k]++;
            }
        } else if (collective) n->sub++;
        if (strstr(buf, "\"cat\":\"p2p\"") && strstr(buf, "{\"name\":\"send\"")) n->p2p_send++;
        if (strstr(buf, "\"cat\":\"p2p\"") && strstr(buf, "{\"name\":\"recv\"")) n->p2p_recv++;
        if (strstr(buf, "\"cat\":\"objects\"")) n->objects++;
        if (strstr(buf, "\"cat\":\"queue\"")) n->queue++;
        line = end ? end + 1 : NULL;
    }
}
static void timeline(int kind) {
    enum { W = 3 };
    tw_world p;
    world_env env = { true, false, false, NULL };
    char out[8192], cmd[2000];
    int r, k;
    fresh_dirs(g_tr_name[kind]);
    spawn(&p, kind, W, &env, g_timeout_ms, timeline_body, NULL, 60);
    assert_int_equal(tw_reap(&p, 60), 0);
    for (r = 0; r < W; r++) {
        char* text = rank_file("dm_trace", r);
        char* exp;
        char path[600];
        tl_counts cnt;
        unsigned long long seq = 0, s;
        if (!text) fail_msg("%s: rank %d wrote no timeline in %s", g_tr_name[kind], r, g_dir);
        snprintf(path, sizeof(path), "%s/expect.rank%d", g_dir, r);
        exp = slurp(path);
        assert_non_null(exp);
        seq = strtoull(exp, NULL, 10);
        free(exp);
        count_events(text, &cnt);
        /* a closed file ends with "]" and every line is whole */
        if (!strstr(text, "\n]\n")) fail_msg("%s: rank %d: timeline not closed", g_tr_name[kind], r);
        free(text);
        for (s = 1; s <= seq; s++)
            if (cnt.by_seq[s] != 1)
                fail_msg("%s: rank %d: %d events for collective #%llu (want 1; %llu collectives)", g_tr_name[kind], r,
                         cnt.by_seq[s], s, seq);
        if (seq + 1 < 256 && cnt.by_seq[seq + 1] != 0) fail_msg("%s: rank %d: an event past #%llu", g_tr_name[kind], r, seq);
        for (k = 0; k < NCOLL; k++)
            if (cnt.named[k] < 2) fail_msg("%s: rank %d: %d %s events (want 2 or more)", g_tr_name[kind], r, cnt.named[k], g_collectives[k]);
        assert_int_equal(cnt.p2p_send, 2);
        assert_int_equal(cnt.p2p_recv, 2);
        assert_int_equal(cnt.objects, 4);   /* all_gather_objects, broadcast_objects, each twice */
        if (cnt.queue < 15) fail_msg("%s: rank %d: %d queue events (want one per _async call)", g_tr_name[kind], r, cnt.queue);
        if (cnt.sub < 1) fail_msg("%s: rank %d: no event of the split-made group", g_tr_name[kind], r);
    }
    /* valid JSON for a real parser, and a report across the ranks */
    snprintf(cmd, sizeof(cmd), "python3 -c 'import json,glob,sys\nfor f in glob.glob(sys.argv[1]+\"/dm_trace.*.json\"): "
             "json.load(open(f))\nprint(\"valid\")' %s 2>&1", g_dir);
    assert_int_equal(tw_run_cmd(60, out, sizeof(out), cmd), 0);
    CHECK_HAS(out, "valid");
    assert_int_equal(report(g_dir, out, sizeof(out)), 0);
    CHECK_HAS(out, "3 timeline(s) (ranks 0,1,2)");
    CHECK_HAS(out, "== run report");
    CHECK_HAS(out, "all_to_all_v");
    /* one merged timeline, and the picture where gnuplot is installed */
    snprintf(cmd, sizeof(cmd), "python3 %s/scripts/dm_trace %s --merge %s/merged.json 2>&1 && python3 -c 'import json,sys\n"
             "print(len(json.load(open(sys.argv[1]))[\"traceEvents\"]))' %s/merged.json", DM_SRCDIR, g_dir, g_dir, g_dir);
    assert_int_equal(tw_run_cmd(60, out, sizeof(out), cmd), 0);
    CHECK_HAS(out, "merged");
    if (system("command -v gnuplot >/dev/null 2>&1") == 0) {
        snprintf(cmd, sizeof(cmd), "python3 %s/scripts/dm_trace %s --png %s/t.png 2>&1 && test -s %s/t.png", DM_SRCDIR, g_dir,
                 g_dir, g_dir);
        if (tw_run_cmd(60, out, sizeof(out), cmd) != 0) fail_msg("--png: %s", out);
    }
}
static void test_timeline_thread(void** s) { (void)s; timeline(TR_THREAD); }
static void test_timeline_shm(void** s) { (void)s; timeline(TR_SHM); }
static void test_timeline_tcp(void** s) { (void)s; timeline(TR_TCP); }

/* ---- 2. a rank sleeps past the deadline ------------------------------------------------------- */
enum { SLEEP_MS = 2500, SLEEP_TIMEOUT_MS = 700 };
static int sleeper_body(dm_collective* c, void* arg) {
    float x[2] = { 1, 2 };
    dm_status st;
    (void)arg;
    RANK_CHECK(c, dm_barrier(c) == DM_OK);
    RANK_CHECK(c, dm_barrier(c) == DM_OK);
    if (dm_rank(c) != 2) {
        RANK_CHECK(c, dm_all_reduce(c, NULL, x, 2, DM_FLOAT32, DM_SUM) != DM_OK);
        return 0;
    }
    tw_sleep_ms(SLEEP_MS);
    /* late: it fails, or (TCP) completes from the bytes its peers sent before they gave up;
       either way its own dump shows where it was */
    st = dm_all_reduce(c, NULL, x, 2, DM_FLOAT32, DM_SUM);
    RANK_CHECK(c, st == DM_OK || dm_flight_recorder_dump(c, NULL) == DM_OK);
    if (st == DM_OK) RANK_CHECK(c, dm_flight_recorder_dump(c, NULL) == DM_OK);
    return 0;
}
static void sleeper(int kind) {
    enum { W = 4 };
    tw_world p;
    bool survivors[W] = { true, true, false, true }, sleeper_only[W] = { false, false, true, false };
    world_env env = { false, true, false, NULL };
    char out[8192];
    int r;
    fresh_dirs(kind == TR_SHM ? "sleeper_shm" : "sleeper_tcp");
    spawn(&p, kind, W, &env, SLEEP_TIMEOUT_MS, sleeper_body, NULL, 30);
    if (tw_reap_some(&p, survivors, 20) != 0) { tw_kill_all(&p); fail_msg("a survivor failed"); }
    for (r = 0; r < W; r++) {
        char* d = rank_file("dm_fr", r);
        if (r == 2) {
            if (d) { free(d); tw_kill_all(&p); fail_msg("the sleeping rank dumped before it woke up"); }
            continue;
        }
        if (!d) { tw_kill_all(&p); fail_msg("survivor rank %d wrote no dump", r); }
        if (!strstr(d, "\"op\":\"all_reduce\",\"state\":\"failed\"")) {
            tw_kill_all(&p);
            fail_msg("rank %d's dump has no failed all_reduce:\n%s", r, d);
        }
        free(d);
    }
    report(g_dir, out, sizeof(out));
    printf("%s", out);
    if (!strstr(out, "all_reduce #3: ranks 0,1,3 entered") || !strstr(out, "rank 2's last op is barrier #2")) {
        tw_kill_all(&p);
        fail_msg("the report does not name rank 2 and all_reduce #3:\n%s", out);
    }
    /* rank 2 wakes, arrives late, fails and dumps too */
    assert_int_equal(tw_reap_some(&p, sleeper_only, 20), 0);
    report(g_dir, out, sizeof(out));
    printf("%s", out);
    CHECK_HAS(out, "all_reduce #3: ranks 0,1,3 entered");
    CHECK_HAS(out, "rank 2 entered late");
}
static void test_sleeper_shm(void** s) { (void)s; sleeper(TR_SHM); }
static void test_sleeper_tcp(void** s) { (void)s; sleeper(TR_TCP); }

/* ---- 3. one rank skips a call ----------------------------------------------------------------- */
static int skip_body(dm_collective* c, void* arg) {
    float x[4] = { 1, 2, 3, 4 };
    (void)arg;
    RANK_CHECK(c, dm_barrier(c) == DM_OK);
    if (dm_rank(c) != 2) RANK_CHECK(c, dm_broadcast(c, x, 4, DM_FLOAT32, 0) != DM_OK);
    RANK_CHECK(c, dm_all_reduce(c, NULL, x, 4, DM_FLOAT32, DM_SUM) != DM_OK);
    return 0;
}
static void test_mismatch(void** s) {
    enum { W = 4 };
    tw_world p;
    world_env env = { false, true, false, NULL };
    char out[8192];
    int r;
    (void)s;
    fresh_dirs("mismatch");
    spawn(&p, TR_TCP, W, &env, 3000, skip_body, NULL, 30);
    assert_int_equal(tw_reap(&p, 30), 0);
    for (r = 0; r < W; r++) {
        char* d = rank_file("dm_fr", r);
        if (!d) fail_msg("rank %d wrote no dump", r);
        free(d);
    }
    report(g_dir, out, sizeof(out));
    printf("%s", out);
    CHECK_HAS(out, "broadcast #2: ranks 0,1,3 entered");
    CHECK_HAS(out, "MISMATCH: rank 2 called all_reduce #2 instead");
}

/* ---- 4. a killed rank's timeline --------------------------------------------------------------- */
enum { KILL_OPS = 150 };
static int killed_body(dm_collective* c, void* arg) {
    float x[2] = { 1, 2 };
    int i;
    (void)arg;
    for (i = 0; i < KILL_OPS; i++) RANK_CHECK(c, dm_all_reduce(c, NULL, x, 2, DM_FLOAT32, DM_SUM) == DM_OK);
    tw_sleep_ms(250);              /* past the flush interval: the next event flushes everything */
    RANK_CHECK(c, dm_all_reduce(c, NULL, x, 2, DM_FLOAT32, DM_SUM) == DM_OK);
    if (dm_rank(c) == 1) raise(SIGKILL);
    RANK_CHECK(c, dm_all_reduce(c, NULL, x, 2, DM_FLOAT32, DM_SUM) != DM_OK);
    return 0;
}
static void test_killed(void** s) {
    enum { W = 2 };
    tw_world p;
    int k;
    world_env env = { true, false, false, NULL };
    char out[8192], cmd[800];
    char* text;
    tl_counts cnt;
    (void)s;
    fresh_dirs("killed");
    spawn(&p, TR_SHM, W, &env, 5000, killed_body, NULL, 30);
    tw_reap(&p, 30);
    assert_true(WIFEXITED(p.status[0]) && WEXITSTATUS(p.status[0]) == 0);
    assert_true(WIFSIGNALED(p.status[1]) && WTERMSIG(p.status[1]) == SIGKILL);
    text = rank_file("dm_trace", 1);
    assert_non_null(text);
    count_events(text, &cnt);
    if (strstr(text, "\n]\n")) { free(text); fail_msg("the killed rank's timeline was closed"); }
    free(text);
    for (k = 1; k <= KILL_OPS + 1; k++)
        if (cnt.by_seq[k] != 1) fail_msg("killed rank: %d events for all_reduce #%d (want 1)", cnt.by_seq[k], k);
    /* JSON once the bracket is added, and the report reads it as it is */
    snprintf(cmd, sizeof(cmd), "python3 -c 'import json,glob,sys\nf=glob.glob(sys.argv[1]+\"/dm_trace.rank1.*.json\")[0]\n"
             "print(len(json.loads(open(f).read()+\"]\")))' %s 2>&1", g_dir);
    assert_int_equal(tw_run_cmd(60, out, sizeof(out), cmd), 0);
    assert_true(atoi(out) >= KILL_OPS + 1);
    assert_int_equal(report(g_dir, out, sizeof(out)), 0);
    CHECK_HAS(out, "2 timeline(s) (ranks 0,1)");
}

/* ---- 5. SIGUSR1 -------------------------------------------------------------------------------- */
static int sig_body(dm_collective* c, void* arg) {
    float x[2] = { 1, 2 };
    char path[600];
    FILE* f;
    int i;
    (void)arg;
    for (i = 0; i < 3; i++) RANK_CHECK(c, dm_barrier(c) == DM_OK);
    snprintf(path, sizeof(path), "%s/ready.%d", g_dir, dm_rank(c));
    f = fopen(path, "w");
    RANK_CHECK(c, f != NULL);
    fclose(f);
    if (dm_rank(c) == 1) tw_sleep_ms(2500);   /* rank 0 waits in the all_reduce meanwhile */
    RANK_CHECK(c, dm_all_reduce(c, NULL, x, 2, DM_FLOAT32, DM_SUM) == DM_OK);
    return 0;
}
static bool file_exists(const char* path) { return access(path, F_OK) == 0; }
static void test_sigusr1(void** s) {
    enum { W = 2 };
    tw_world p;
    world_env env = { false, true, true, NULL };
    char r0[600], r1[600];
    char *d0 = NULL, *d1 = NULL;
    double end;
    (void)s;
    fresh_dirs("sigusr1");
    spawn(&p, TR_SHM, W, &env, 10000, sig_body, NULL, 30);
    snprintf(r0, sizeof(r0), "%s/ready.0", g_dir);
    snprintf(r1, sizeof(r1), "%s/ready.1", g_dir);
    end = tw_now_s() + 15;
    while ((!file_exists(r0) || !file_exists(r1)) && tw_now_s() < end) tw_sleep_ms(5);
    if (!file_exists(r0) || !file_exists(r1)) { tw_kill_all(&p); fail_msg("the ranks never got ready"); }
    /* until rank 0's dump shows its all_reduce running (it may not have entered it yet) */
    while (tw_now_s() < end) {
        tw_signal(&p, 0, SIGUSR1);
        tw_signal(&p, 1, SIGUSR1);
        tw_sleep_ms(100);
        free(d0);
        d0 = rank_file("dm_fr", 0);
        if (d0 && strstr(d0, "\"op\":\"all_reduce\",\"state\":\"running\"")) break;
    }
    d1 = rank_file("dm_fr", 1);
    assert_int_equal(tw_reap(&p, 20), 0);
    if (!d0 || !strstr(d0, "\"op\":\"all_reduce\",\"state\":\"running\"")) fail_msg("rank 0's dump: %s", d0 ? d0 : "none");
    CHECK_HAS(d0, "\"reason\":\"SIGUSR1\"");
    if (!d1) fail_msg("rank 1 wrote no dump on SIGUSR1");
    CHECK_HAS(d1, "{\"seq\":3,\"op\":\"barrier\",\"state\":\"done\"");
    free(d0);
    free(d1);
}

/* ---- 6. the documented call -------------------------------------------------------------------- */
static int dump_call_body(dm_collective* c, void* arg) {
    char path[600], *d;
    const char* mode = (const char*)arg;
    RANK_CHECK(c, dm_barrier(c) == DM_OK);
    snprintf(path, sizeof(path), "%s/call_%s.rank%d.json", g_dir, mode, dm_rank(c));
    if (strcmp(mode, "off") == 0) {
        RANK_CHECK(c, dm_flight_recorder_dump(c, path) == DM_ERR_UNSUPPORTED);
        RANK_CHECK(c, strstr(dm_last_error(c), "DISTMESH_FLIGHT_RECORDER=0") != NULL);
        RANK_CHECK(c, !file_exists(path));
        return 0;
    }
    RANK_CHECK(c, dm_flight_recorder_dump(c, NULL) == DM_ERR_INVALID_ARG);    /* no directory set */
    RANK_CHECK(c, dm_flight_recorder_dump(c, path) == DM_OK);
    d = slurp(path);
    RANK_CHECK(c, d != NULL);
    RANK_CHECK(c, strstr(d, "\"reason\":\"dm_flight_recorder_dump\"") != NULL);
    RANK_CHECK(c, strstr(d, "{\"seq\":1,\"op\":\"barrier\",\"state\":\"done\"") != NULL);
    free(d);
    return 0;
}
static void test_dump_call(void** s) {
    tw_world p;
    world_env on = { false, false, false, "8" }, off = { false, false, false, "0" };
    (void)s;
    fresh_dirs("dump_call");
    spawn(&p, TR_THREAD, 2, &on, 5000, dump_call_body, (void*)"on", 20);
    assert_int_equal(tw_reap(&p, 20), 0);
    spawn(&p, TR_THREAD, 2, &off, 5000, dump_call_body, (void*)"off", 20);
    assert_int_equal(tw_reap(&p, 20), 0);
}

static int setup(void** s) { (void)s; return tmpdir_make(g_root, sizeof(g_root), "dm_trace_test"); }
static int teardown(void** s) { (void)s; return tmpdir_remove(g_root); }

int main(int argc, char** argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_timeline_thread),
        cmocka_unit_test(test_timeline_shm),
        cmocka_unit_test(test_timeline_tcp),
        cmocka_unit_test(test_sleeper_shm),
        cmocka_unit_test(test_sleeper_tcp),
        cmocka_unit_test(test_mismatch),
        cmocka_unit_test(test_killed),
        cmocka_unit_test(test_sigusr1),
        cmocka_unit_test(test_dump_call),
    };
    signal(SIGPIPE, SIG_DFL);
    setvbuf(stdout, NULL, _IOLBF, 0);
    return DM_RUN_TESTS(argc, argv, tests, setup, teardown);
}
