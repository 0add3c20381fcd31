/* dm_shrink (issue 18): planned removal and shrink after kill -9, on the threaded world, shared
   memory, sockets and a group spanning two simulated hosts. Forked ranks (tests/test_world.h)
   report to the test over a pipe; the test kills the victims and checks that every survivor holds the same group
   (size, renumbering in old order) and that the new group computes correctly.
   DM_SHRINK_TRIALS=N repeats each kill case N times (make test-shrink-trials: 20). */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "distmesh.h"
#include "distmesh_tcp.h"
#include "test_world.h"
#include "test_filter.h"

#define MAXW 16
static tw_store g_store;        /* the program's file store; a fresh prefix per world */
static int trials(int dflt) {
    const char* v = getenv("DM_SHRINK_TRIALS");
    return v && atoi(v) > 0 ? atoi(v) : dflt;
}

/* ---- the threaded world ------------------------------------------------------------------ */
/* Every rank's value is old_rank + 1; the sum over the members is checked. */
static int check_sum(dm_collective* c, int expect) {
    int32_t v[3];
    int k;
    for (k = 0; k < 3; k++) v[k] = (int32_t)(dm_rank(c) * 0 + 1 + k);
    if (dm_all_reduce(c, v, v, 3, DM_INT32, DM_SUM) != DM_OK) return 1;
    for (k = 0; k < 3; k++)
        if (v[k] != (int32_t)(dm_world_size(c) * (1 + k))) return 1;
    (void)expect;
    return 0;
}
/* The old ranks of the new group, in new-rank order, gathered over it. */
static int members_of(dm_collective* c, int old_rank, int32_t* out) {
    int32_t mine = old_rank;
    return dm_all_gather(c, &mine, out, 1, DM_INT32) == DM_OK ? 0 : 1;
}

typedef struct th_case { int flags; int world; int drop1; int drop2; } th_case;
static int th_body(dm_collective* c, void* user) {
    const th_case* k = (const th_case*)user;
    int r = dm_rank(c), bad = 0, i;
    dm_collective *n = NULL, *m = NULL;
    int32_t members[MAXW];
    if (r == k->drop1) return 0;                  /* leaves: destroyed by the runner */
    if (dm_shrink(c, &k->drop1, 1, k->flags, &n) != DM_OK) return 1;
    if (dm_world_size(n) != k->world - 1) bad = 1;
    if (dm_rank(n) != r - (r > k->drop1)) bad = 1;
    if (members_of(n, r, members) || check_sum(n, 0)) bad = 1;
    for (i = 0, r = 0; i < k->world; i++)
        if (i != k->drop1 && members[r++] != i) bad = 1;
    if (dm_world_size(n) % 2 == 0) {            /* Mesh users rebuild their dims in one call */
        dm_mesh* mesh = NULL;
        int32_t one = 1;
        if (dm_mesh_create_dp_tp(n, 2, &mesh) != DM_OK ||
            dm_all_reduce(dm_mesh_tp_world(mesh), &one, &one, 1, DM_INT32, DM_SUM) != DM_OK || one != 2)
            bad = 1;
        dm_mesh_destroy(mesh);
    }
    /* the parent gives way */
    if (dm_barrier(c) != DM_ERR_ABORTED) bad = 1;
    /* shrinking twice: drop2 is a rank of n */
    if (dm_rank(n) == k->drop2) { dm_destroy(n); return bad; }
    if (dm_shrink(n, &k->drop2, 1, DM_SHRINK_DEFAULT, &m) != DM_OK) bad = 1;
    else {
        if (dm_world_size(m) != k->world - 2 || check_sum(m, 0)) bad = 1;
        dm_destroy(m);
    }
    dm_destroy(n);
    return bad;
}
static void test_thread_shrink_default(void** s) {
    th_case k = { DM_SHRINK_DEFAULT, 5, 2, 0 };
    dm_fake_desc d;
    (void)s;
    memset(&d, 0, sizeof(d));
    d.world_size = k.world;
    d.timeout_ms = 10000;
    assert_int_equal(dm_thread_world_run(&d, th_body, &k), DM_OK);
}
static void test_thread_shrink_abort(void** s) {
    th_case k = { DM_SHRINK_ABORT, 4, 0, 2 };
    int hosts[4] = { 0, 1, 0, 1 };
    dm_fake_desc d;
    (void)s;
    memset(&d, 0, sizeof(d));
    d.world_size = k.world;
    d.timeout_ms = 10000;
    d.host_of = hosts;
    assert_int_equal(dm_thread_world_run(&d, th_body, &k), DM_OK);
}
/* A rank that is neither excluded nor arrives: every survivor times out, none hangs. */
static int th_missing_body(dm_collective* c, void* user) {
    int drop = 3, r = dm_rank(c);
    dm_collective* n = NULL;
    dm_status st;
    (void)user;
    if (r == 2) { usleep(1500000); return 0; }   /* never calls dm_shrink */
    if (r == drop) return 0;
    st = dm_shrink(c, &drop, 1, DM_SHRINK_DEFAULT, &n);
    return st == DM_ERR_TIMEOUT && n == NULL && strstr(dm_last_error(c), "2") ? 0 : 1;
}
static void test_thread_shrink_timeout(void** s) {
    dm_fake_desc d;
    (void)s;
    memset(&d, 0, sizeof(d));
    d.world_size = 4;
    d.timeout_ms = 500;
    assert_int_equal(dm_thread_world_run(&d, th_missing_body, NULL), DM_OK);
}
static int th_args_body(dm_collective* c, void* user) {
    dm_collective* n = (dm_collective*)1;
    int self = dm_rank(c), out_of_range = 9, ok = 0;
    (void)user;
    ok += dm_shrink(c, &self, 1, DM_SHRINK_DEFAULT, &n) == DM_ERR_INVALID_ARG && n == NULL;
    ok += dm_shrink(c, &out_of_range, 1, DM_SHRINK_DEFAULT, &n) == DM_ERR_INVALID_ARG;
    ok += dm_shrink(c, NULL, 1, DM_SHRINK_DEFAULT, &n) == DM_ERR_INVALID_ARG;
    ok += dm_shrink(c, NULL, 0, 7, &n) == DM_ERR_INVALID_ARG;
    ok += dm_shrink(c, NULL, 0, DM_SHRINK_DEFAULT, NULL) == DM_ERR_INVALID_ARG;
    ok += dm_shrink(NULL, NULL, 0, DM_SHRINK_DEFAULT, &n) == DM_ERR_INVALID_ARG;
    ok += dm_grow(c, 0, &n) == DM_ERR_INVALID_ARG;
    return ok == 7 && dm_barrier(c) == DM_OK ? 0 : 1;
}
static void test_shrink_bad_args(void** s) {
    dm_fake_desc d;
    dm_collective* f = NULL;
    dm_collective* n = NULL;
    (void)s;
    memset(&d, 0, sizeof(d));
    d.world_size = 3;
    d.timeout_ms = 5000;
    assert_int_equal(dm_thread_world_run(&d, th_args_body, NULL), DM_OK);
    memset(&d, 0, sizeof(d));
    assert_int_equal(dm_fake_create(&d, &f), DM_OK);        /* a backend without shrink */
    assert_int_equal(dm_shrink(f, NULL, 0, DM_SHRINK_DEFAULT, &n), DM_ERR_UNSUPPORTED);
    dm_destroy(f);
}

/* ---- forked ranks ------------------------------------------------------------------------ */
/* How a kill case runs: the world, its store, who dies and when. */
typedef struct kcase {
    const char* name;
    int world;
    const char* transport;      /* "tcp", or NULL: shared memory */
    int hosts;                  /* 0: one host; else ranks per simulated host */
    bool rank0_store;           /* MASTER_ADDR/PORT: rank 0 hosts the store */
    int victim, victim2;        /* victim2 >= 0: killed as the survivors enter dm_shrink */
    int op;                     /* 0 idle, 1 all_reduce, 2 all_gather, 3 reduce_scatter, 4 broadcast,
                                   5 barrier, 6 planned removal (DM_SHRINK_DEFAULT) */
    int nsock;                  /* sockets per peer across hosts (0: 1) */
} kcase;
static int g_port;              /* rank0_store: the port rank 0 serves the store on */

/* One report to the test (at most PIPE_BUF bytes: never interleaved with another rank's); a
   rank that cannot report ends (exit status 3). */
#define say(...) do { if (tw_report(__VA_ARGS__) != 0) _exit(3); } while (0)
/* One operation of the kind the case names, on c (every rank the same). */
static dm_status one_op(dm_collective* c, int op, float* buf, size_t n) {
    switch (op) {
    case 2: return dm_all_gather(c, buf, buf + n, n / (size_t)dm_world_size(c) / 2, DM_FLOAT32);
    case 3: return dm_reduce_scatter(c, buf, buf + n, n / (size_t)dm_world_size(c) / 2, DM_FLOAT32, DM_SUM);
    case 4: return dm_broadcast(c, buf, n, DM_FLOAT32, 1);
    case 5: return dm_barrier(c);
    default: return dm_all_reduce(c, buf, buf, n, DM_FLOAT32, DM_SUM);
    }
}
/* Groups still split from the shrunk one, the store host dead or not (a mesh is splits): the
   halves by new rank parity each count their members. */
static int split_check(dm_collective* n) {
    dm_collective* half = NULL;
    int32_t one = 1;
    int bad, expect = (dm_world_size(n) + (dm_rank(n) % 2 == 0)) / 2;
    if (dm_split(n, dm_rank(n) % 2, 0, &half) != DM_OK) return 1;
    bad = dm_all_reduce(half, &one, &one, 1, DM_INT32, DM_SUM) != DM_OK || one != expect;
    dm_destroy(half);
    return bad;
}
/* 4 MiB across the new group (striped where there are several sockets per peer): every
   element the sum of (old rank + 1), sum. */
static int big_check(dm_collective* n, int old_rank, int32_t sum) {
    size_t count = (size_t)1 << 20, i;
    float* x = (float*)malloc(count * sizeof(float));
    int bad;
    if (!x) return 1;
    for (i = 0; i < count; i++) x[i] = (float)(old_rank + 1);
    bad = dm_all_reduce(n, NULL, x, count, DM_FLOAT32, DM_SUM) != DM_OK;
    for (i = 0; !bad && i < count; i += 4099) bad = x[i] != (float)sum;
    free(x);
    return bad;
}
/* Every pair talks, also those outside the new group's schedules (connected on demand). */
static int a2a_check(dm_collective* n, int old_rank) {
    int32_t in[MAXW], out[MAXW];
    int j, W = dm_world_size(n), bad;
    for (j = 0; j < W; j++) in[j] = old_rank * 100 + j;
    bad = dm_all_to_all(n, in, out, 1, DM_INT32) != DM_OK;
    for (j = 0; !bad && j < W; j++) bad = out[j] % 100 != dm_rank(n);
    return bad;
}
/* After the shrink: the group's sum of (old rank + 1) and its members, gathered. Reports
   "<old rank> S <status> <size> <new rank> <sum or -check> <members...>" in one write (the
   ranks share the pipe; a write of at most PIPE_BUF bytes is never interleaved). */
static void report_group(const char* lead, dm_collective* n, int r, dm_status st) {
    int32_t v = r + 1, members[MAXW];
    int i, check = 1;
    char line[256];
    size_t len;
    if (st == DM_OK) {
        check = dm_all_reduce(n, &v, &v, 1, DM_INT32, DM_SUM) == DM_OK ? 0 : 2;
        if (check == 0 && members_of(n, r, members)) check = 3;
        if (check == 0 && split_check(n)) check = 4;
        if (check == 0 && big_check(n, r, v)) check = 5;
        if (check == 0 && a2a_check(n, r)) check = 6;
    }
    len = (size_t)snprintf(line, sizeof(line), "%s%d S %d %d %d %d", lead, r, (int)st, st == DM_OK ? dm_world_size(n) : 0,
                           st == DM_OK ? dm_rank(n) : -1, check ? -check : (int)v);
    for (i = 0; st == DM_OK && check == 0 && i < dm_world_size(n); i++)
        len += (size_t)snprintf(line + len, sizeof(line) - len, " %d", (int)members[i]);
    say("%s\n", line);
}
static int kill_body(const kcase* k, dm_collective* c, int r) {
    size_t n = 16384;
    float* buf = (float*)calloc(2 * n, sizeof(float));
    dm_collective* g = NULL;
    dm_status st;
    int rounds = 0;
    double t0;
    say("R");
    if (k->op == 6) {                           /* planned: the victim leaves, the others exclude it */
        if (r == k->victim) { free(buf); return 0; }
        st = dm_shrink(c, &k->victim, 1, DM_SHRINK_DEFAULT, &g);
    } else {
        double until = tw_now_s() + 30;         /* a safety cap: the kill comes 150-250 ms after ready */
        if (k->op == 0) usleep(600000);         /* idle while the victim dies */
        do {
            st = one_op(c, k->op, buf, n);
            rounds++;
        } while (st == DM_OK && ((rounds & 1023) || tw_now_s() < until));
        if (st != DM_ERR_PEER_LOST && st != DM_ERR_ABORTED)
            say("%d E %d\n", r, (int)st);
        say("%d X\n", r);                     /* entering dm_shrink */
        t0 = tw_now_s();
        st = dm_shrink(c, NULL, 0, DM_SHRINK_ABORT, &g);
        say("%d M %.3f\n", r, (tw_now_s() - t0) * 1000);   /* how long dm_shrink took */
        if (st != DM_OK) fprintf(stderr, "rank %d: shrink: %s\n", r, dm_last_error(c));
    }
    report_group("", g, r, st);
    /* a second death left a dead member: shrink again, the ranks that remain agree */
    if (st == DM_OK && k->victim2 >= 0 && dm_world_size(g) > k->world - 2) {
        dm_collective* h = NULL;
        st = dm_shrink(g, NULL, 0, DM_SHRINK_ABORT, &h);
        if (st != DM_OK) fprintf(stderr, "rank %d: second shrink: %s\n", r, dm_last_error(g));
        {
            char lead[16];
            snprintf(lead, sizeof(lead), "%d T ", r);
            report_group(lead, h, r, st);
        }
        dm_destroy(h);
    }
    dm_destroy(g);
    free(buf);
    return 0;
}
/* The case's desc: rank 0 serving the store (MASTER_ADDR / MASTER_PORT) or the file store,
   sockets per peer. */
static void kcase_edit(dm_tcp_desc* d, int rank, void* arg) {
    const kcase* k = (const kcase*)arg;
    (void)rank;
    if (k->rank0_store) {
        char port[16];
        snprintf(port, sizeof(port), "%d", g_port);
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        setenv("MASTER_PORT", port, 1);
        d->store_url = NULL;
    }
    d->sockets_per_peer = k->nsock;
}
static int kcase_body(dm_collective* c, int rank, int world, void* arg) {
    (void)world;
    return kill_body((const kcase*)arg, c, rank);
}
/* The case's world forked into p: a report pipe, 60 s alarms, 10 s deadlines. */
static void fork_world(tw_world* p, const kcase* k) {
    tw_dm_world w;
    g_port = k->rank0_store ? tw_free_port() : 0;
    memset(p, 0, sizeof(*p));
    p->alarm_s = 60;
    p->reports = true;
    memset(&w, 0, sizeof(w));
    w.world = k->world;
    w.store = &g_store;
    w.transport = k->transport;
    w.timeout_ms = 10000;
    w.per_host = k->hosts;
    w.edit = kcase_edit;
    w.body = kcase_body;
    w.arg = (void*)k;
    assert_int_equal(tw_dm_fork(p, &w), 0);
}

/* What the survivors said after their (first, T: second) shrink. */
typedef struct report { bool got; int st, size, rank, sum, members[MAXW]; } report;
static void parse_report(const char* line, report* first, report* second) {
    int r = -1, st, size, rank, sum, off = 0, i;
    report* out;
    const char* p = line;
    bool again = false;
    if (sscanf(p, "%d T %n", &r, &off) == 1 && off > 0) { again = true; p += off; }
    if (sscanf(p, "%d S %d %d %d %d%n", &r, &st, &size, &rank, &sum, &off) != 5 || r < 0 || r >= MAXW) return;
    out = again ? &second[r] : &first[r];
    out->got = true;
    out->st = st; out->size = size; out->rank = rank; out->sum = sum;
    p += off;
    for (i = 0; i < size && i < MAXW; i++) {
        int m = -1, used = 0;
        if (sscanf(p, " %d%n", &m, &used) != 1) break;
        out->members[i] = m;
        p += used;
    }
}
/* Every rank in alive[] reported the same group: DM_OK, the expected size, ranks renumbered in
   old order, members = alive, sum of old rank + 1 over them. */
static void check_group(const char* what, const report* rep, const bool* alive, int world) {
    int r, n = 0, sum = 0, i;
    for (r = 0; r < world; r++)
        if (alive[r]) { n++; sum += r + 1; }
    for (r = 0, i = 0; r < world; r++) {
        if (!alive[r]) continue;
        if (!rep[r].got || rep[r].st != DM_OK || rep[r].size != n || rep[r].rank != i || rep[r].sum != sum) {
            fail_msg("%s: rank %d reported status %d, size %d, rank %d, sum %d (expected 0, %d, %d, %d)", what, r,
                     rep[r].st, rep[r].size, rep[r].rank, rep[r].sum, n, i, sum);
        }
        i++;
    }
}
/* What run_kill_case reads from the pipe. */
typedef struct kwatch {
    const kcase* k;
    tw_world* p;
    report *first, *second;
    const bool* alive;
    int expect_first, entered;
    double t_planned;           /* planned removal: when every rank was ready */
    double shrink_ms[MAXW];     /* how long each survivor's (first) dm_shrink took, -1: unknown */
    double t_failed[MAXW];      /* when each survivor's call failed (its X), 0: not yet */
    char bad_line[256];         /* a survivor's other status than PEER_LOST / ABORTED */
} kwatch;
static void kill_case_ready(int ready, void* u) {
    kwatch* w = (kwatch*)u;
    if (ready == w->k->world && w->t_planned == 0) w->t_planned = tw_now_s();
}
static int kill_case_line(char* line, void* u) {
    kwatch* w = (kwatch*)u;
    if (strstr(line, " X")) {
        int r = -1;
        if (sscanf(line, "%d X", &r) == 1 && r >= 0 && r < MAXW && w->t_failed[r] == 0) w->t_failed[r] = tw_now_s();
        if (w->k->victim2 >= 0 && w->entered++ == 0) {
            usleep((unsigned)(rand() % 4000));
            tw_signal(w->p, w->k->victim2, SIGKILL);
        }
    } else if (strstr(line, " M ")) {
        int r = -1;
        double ms;
        if (sscanf(line, "%d M %lf", &r, &ms) == 2 && r >= 0 && r < MAXW && w->shrink_ms[r] < 0) w->shrink_ms[r] = ms;
    } else if (strstr(line, " E ")) {
        if (!w->bad_line[0]) snprintf(w->bad_line, sizeof(w->bad_line), "%s", line);
    } else {
        parse_report(line, w->first, w->second);
    }
    return 0;
}
/* Every expected survivor reported (a group that kept the second victim: its second report). */
static bool kill_case_done(void* u) {
    const kwatch* w = (const kwatch*)u;
    const kcase* k = w->k;
    int r, got = 0;
    for (r = 0; r < k->world; r++)
        got += w->alive[r] && w->first[r].got &&
               (k->victim2 < 0 || w->first[r].st != DM_OK || w->first[r].size == k->world - 2 || w->second[r].got);
    return got >= w->expect_first;
}
/* The store's host died: a shrink needs no store, so it must not wait for one (a notice's
   reconnect used to wait 1 s twice for the dead store). The check bounds that wait, not a
   speed: the median survivor's dm_shrink and its report of the loss each within
   STORE_WAIT_BOUND_MS, under the 2 s the old wait cost and far over what a busy machine adds
   (the 100 and 500 ms this once asserted were missed beside a CPU hog). The line printed here
   gives the figures; make bench-shrink and bench-loss time shrinks and losses. */
#define STORE_WAIT_BOUND_MS 1500
static int cmp_double(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return x < y ? -1 : x > y;
}
static void check_store_host_shrink(const kcase* k, const kwatch* w, double t_kill) {
    double ms[MAXW], lost[MAXW];
    int r, n = 0;
    for (r = 0; r < k->world; r++) {
        if (r == k->victim || w->shrink_ms[r] < 0 || w->t_failed[r] == 0) continue;
        lost[n] = (w->t_failed[r] - t_kill) * 1000;
        ms[n++] = w->shrink_ms[r];
    }
    if (n != k->world - 1) fail_msg("%s: %d of %d survivors said how long dm_shrink took", k->name, n, k->world - 1);
    qsort(ms, (size_t)n, sizeof(double), cmp_double);
    qsort(lost, (size_t)n, sizeof(double), cmp_double);
    printf("  %s: the loss reported after %.1f ms, dm_shrink took %.1f ms (median survivor; slowest %.1f and %.1f ms) "
           "with the store's host dead\n", k->name, lost[n / 2], ms[n / 2], lost[n - 1], ms[n - 1]);
    if (ms[n / 2] > STORE_WAIT_BOUND_MS)
        fail_msg("%s: dm_shrink took %.1f ms (median survivor) with the store's host dead: more than %d ms "
                 "(waiting for the store?)", k->name, ms[n / 2], STORE_WAIT_BOUND_MS);
    if (lost[n / 2] > STORE_WAIT_BOUND_MS)
        fail_msg("%s: the loss of the store's host reached the survivors after %.1f ms (median): more than %d ms "
                 "(waiting for the store?)", k->name, lost[n / 2], STORE_WAIT_BOUND_MS);
}

/* Runs one case: kills the victim once every rank is ready (and victim2 as the first survivor
   enters dm_shrink), collects the reports, checks them. */
static void run_kill_case(const kcase* k) {
    int r;
    report first[MAXW], second[MAXW];
    bool alive[MAXW], after_first[MAXW];
    double t_kill, t_end;
    tw_world p;
    tw_reader rr;
    kwatch w;
    memset(first, 0, sizeof(first));
    memset(second, 0, sizeof(second));
    fork_world(&p, k);
    for (r = 0; r < k->world; r++) alive[r] = after_first[r] = r != k->victim;
    if (k->victim2 >= 0) alive[k->victim2] = false;
    memset(&w, 0, sizeof(w));
    w.k = k;
    w.p = &p;
    w.first = first;
    w.second = second;
    w.alive = alive;
    w.expect_first = k->world - 1 - (k->victim2 >= 0);
    for (r = 0; r < MAXW; r++) w.shrink_ms[r] = -1;
    tw_reader_init(&rr, 0, 40, kill_case_line, &w);
    rr.on_ready = kill_case_ready;
    rr.finished = kill_case_done;
    if (k->op != 6) tw_reader_fault(&rr, k->victim, SIGKILL, 150 + rand() % 100);
    /* planned removal: the ranks shrink at once, timed from "ready" */
    tw_read_reports(&p, &rr);
    t_kill = k->op != 6 ? rr.t_fault : w.t_planned;
    t_end = tw_now_s();
    tw_kill_all(&p);
    if (w.bad_line[0])
        fail_msg("%s: a survivor failed with another status than PEER_LOST / ABORTED: %s", k->name, w.bad_line);
    if (k->victim2 < 0) {
        check_group(k->name, first, after_first, k->world);
        if (k->rank0_store && k->victim == 0 && k->op != 6) check_store_host_shrink(k, &w, t_kill);
        printf("  %s: %d survivors agreed, %.0f ms from the kill to the last report\n", k->name, k->world - 1,
               (t_end - t_kill) * 1000);
        return;
    }
    /* a second death: the first shrink gave every remaining survivor one group, or every one an
       error; a group that kept the second victim shrinks again to the true survivors */
    {
        int ok = 0, err = 0, size = -1;
        for (r = 0; r < k->world; r++) {
            if (!alive[r]) continue;
            if (!first[r].got) fail_msg("%s: rank %d never reported (a hang)", k->name, r);
            if (first[r].st == DM_OK) {
                ok++;
                if (size >= 0 && first[r].size != size)
                    fail_msg("%s: two different groups: sizes %d and %d", k->name, size, first[r].size);
                size = first[r].size;
            } else {
                err++;
            }
        }
        if (ok && err) {            /* never: a shrink succeeds everywhere or nowhere */
            for (r = 0; r < k->world; r++)
                if (alive[r] && first[r].st != DM_OK) fail_msg("%s: rank %d's shrink failed (%d) while others "
                                                               "succeeded", k->name, r, first[r].st);
        }
        if (ok && size == k->world - 1) check_group(k->name, second, alive, k->world);
        else if (ok) check_group(k->name, first, alive, k->world);
        printf("  %s: %s (%s)\n", k->name, ok ? "one group on every survivor" : "an error on every survivor",
               ok && size == k->world - 1 ? "the second victim was a member: shrunk again" : "direct");
    }
}

static int g_nsock;             /* kill_cases' sockets per peer */
static void kill_cases(const char* name, int world, const char* transport, int hosts, bool rank0_store, int n) {
    static const char* ops[] = { "idle", "all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier" };
    int t, victims[3] = { 0, world / 2, world - 1 };
    for (t = 0; t < n; t++) {
        char label[128];
        kcase k = { .name = label, .world = world, .transport = transport, .hosts = hosts, .rank0_store = rank0_store,
                    .victim = victims[t % 3], .victim2 = -1, .op = t % 6, .nsock = g_nsock };
        snprintf(label, sizeof(label), "%s, kill -9 rank %d, %s", name, k.victim, ops[k.op]);
        run_kill_case(&k);
    }
}
static void test_kill_shm(void** s) { (void)s; kill_cases("shm 4 ranks, rank 0 hosts the store", 4, NULL, 0, true, 6 * trials(1)); }
static void test_kill_tcp(void** s) { (void)s; kill_cases("tcp 4 ranks", 4, "tcp", 0, false, 6 * trials(1)); }
static void test_kill_hosts(void** s) { (void)s; kill_cases("2 hosts x 2 ranks", 4, NULL, 2, true, 3 * trials(1)); }
static void test_kill_sockets(void** s) {
    (void)s;
    g_nsock = 3;
    kill_cases("2 hosts x 3 ranks, 3 sockets per peer", 6, NULL, 3, false, 3 * trials(1));
    g_nsock = 0;
}
static void test_kill_16_hosts(void** s) {
    (void)s;
    kill_cases("16 ranks on 8 simulated hosts", 16, NULL, 2, false, 2 * trials(1));
}
/* Rank 0 hosts the store and dies during all-reduces: shrink on shm and on tcp. */
static void test_kill_store_host(void** s) {
    int t;
    (void)s;
    for (t = 0; t < 2 * trials(2); t++) {
        kcase k = { .name = t % 2 ? "tcp 4 ranks, kill -9 of rank 0 (the store's host), all_reduce"
                                  : "shm 4 ranks, kill -9 of rank 0 (the store's host), all_reduce",
                    .world = 4, .transport = t % 2 ? "tcp" : NULL, .rank0_store = true, .victim = 0, .victim2 = -1,
                    .op = 1 };
        run_kill_case(&k);
    }
}
static void test_kill_8(void** s) { (void)s; kill_cases("shm 8 ranks", 8, NULL, 0, false, 3 * trials(1)); }
static void test_planned_removal(void** s) {
    kcase k = { .name = "planned removal of rank 1 of 4 (tcp)", .world = 4, .transport = "tcp", .victim = 1,
                .victim2 = -1, .op = 6 };
    (void)s;
    run_kill_case(&k);
    k.name = "planned removal of rank 0 of 3 (shm, rank 0 hosts the store)";
    k.world = 3;
    k.transport = NULL;
    k.rank0_store = true;
    k.victim = 0;
    run_kill_case(&k);
}
static void test_second_death(void** s) {
    int t;
    (void)s;
    for (t = 0; t < 2 * trials(1); t++) {
        kcase k = { .name = t % 2 ? "second death during shrink (tcp)" : "second death during shrink (shm)",
                    .world = 5, .transport = t % 2 ? "tcp" : NULL, .victim = 1, .victim2 = 3, .op = 1 };
        run_kill_case(&k);
    }
}

/* Two shrinks back to back while one survivor is slow inside the first: rank 2's allocator
   sleeps on every allocation of its first dm_shrink, so ranks 0 and 1 finish the agreement, return
   and start the second shrink (marking their shared-memory rings for it) before rank 2 has read
   where their old streams stopped. Every survivor must get the same group twice; with one stop
   mark per ring, the second overwrote the first and rank 2 timed out reading it while the others
   had their group. Rank 3 leaves before the first shrink (planned removal). */
static volatile int g_slow_alloc;
static void* slow_alloc(size_t size, void* u) {
    (void)u;
    if (g_slow_alloc) usleep(20000);
    return malloc(size);
}
static void slow_free(void* ptr, void* u) { (void)u; free(ptr); }
static void back_to_back_edit(dm_tcp_desc* d, int rank, void* arg) {
    (void)arg;
    if (rank != 2) return;
    d->allocator.alloc_fn = slow_alloc;
    d->allocator.free_fn = slow_free;
}
static int back_to_back_body(dm_collective* c, int r, int world, void* arg) {
    dm_collective *g = NULL, *h = NULL;
    int leaver = world - 1, bad = 0;
    int32_t v = r + 1;
    (void)arg;
    if (r == leaver) return 0;
    g_slow_alloc = r == 2;
    bad |= dm_shrink(c, &leaver, 1, DM_SHRINK_DEFAULT, &g) != DM_OK;
    g_slow_alloc = 0;
    if (bad) fprintf(stderr, "rank %d: first shrink: %s\n", r, dm_last_error(c));
    if (!bad && dm_shrink(g, NULL, 0, DM_SHRINK_DEFAULT, &h) != DM_OK) {
        fprintf(stderr, "rank %d: second shrink: %s\n", r, dm_last_error(g));
        bad = 1;
    }
    if (!bad && (dm_all_reduce(h, &v, &v, 1, DM_INT32, DM_SUM) != DM_OK || v != 6 || dm_world_size(h) != 3)) {
        fprintf(stderr, "rank %d: the twice shrunk group: sum %d, size %d (%s)\n", r, (int)v, dm_world_size(h),
                dm_last_error(h));
        bad = 1;
    }
    dm_destroy(h);
    dm_destroy(g);
    return bad;
}
static void test_back_to_back_shrink(void** s) {
    tw_dm_world w;
    (void)s;
    tw_dm_world_init(&w, 4, &g_store, NULL, 5000);
    w.edit = back_to_back_edit;
    w.body = back_to_back_body;
    assert_int_equal(tw_dm_run(&w, 40), 0);
}

/* DM_SHRINK_ABORT with a request in flight: ranks 0 and 1 wait in an all_reduce_async that rank
   2 (alive, busy elsewhere) never joins; they shrink it away. The request completes first, with
   an error; the two form a group of 2 long before the request's own deadline. */
static int inflight_body(const char* transport, int r) {
    dm_collective *c = NULL, *n = NULL;
    dm_tcp_desc d;
    dm_request* req = NULL;
    float x[1024];
    int drop = 2, bad = 0;
    double t0;
    memset(x, 0, sizeof(x));
    tw_tcp_desc(&d, &g_store, r, 3, 20000);
    d.transport = transport;
    if (dm_tcp_create(&d, &c) != DM_OK) return 1;
    if (r == 2) { usleep(1500000); dm_destroy(c); return 0; }
    bad |= dm_all_reduce_async(c, x, x, 1024, DM_FLOAT32, DM_SUM, &req) != DM_OK;
    usleep(200000);
    t0 = tw_now_s();
    bad |= dm_shrink(c, &drop, 1, DM_SHRINK_ABORT, &n) != DM_OK;
    bad |= tw_now_s() - t0 > 5.0;                  /* not the request's 20 s deadline */
    bad |= req == NULL || dm_wait(req) == DM_OK;  /* it completed, with its error */
    bad |= n == NULL || dm_world_size(n) != 2 || check_sum(n, 0);
    if (bad) fprintf(stderr, "rank %d: in-flight shrink: %s\n", r, dm_last_error(n ? n : c));
    dm_destroy(n);
    dm_destroy(c);
    return bad;
}
static int inflight_proc(int r, void* transport) { return inflight_body((const char*)transport, r); }
static void run_inflight(const char* transport) {
    tw_world p;
    memset(&p, 0, sizeof(p));
    p.alarm_s = 40;
    tw_store_next(&g_store);
    assert_int_equal(tw_fork(&p, 3, inflight_proc, (void*)transport), 0);
    assert_int_equal(tw_reap(&p, 45), 0);
}
static void test_abort_in_flight(void** s) { (void)s; run_inflight("tcp"); run_inflight(NULL); }

int main(int argc, char** argv) {
    int rc;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shrink_bad_args),
        cmocka_unit_test(test_thread_shrink_default),
        cmocka_unit_test(test_thread_shrink_abort),
        cmocka_unit_test(test_thread_shrink_timeout),
        cmocka_unit_test(test_planned_removal),
        cmocka_unit_test(test_abort_in_flight),
        cmocka_unit_test(test_kill_shm),
        cmocka_unit_test(test_kill_tcp),
        cmocka_unit_test(test_kill_store_host),
        cmocka_unit_test(test_kill_hosts),
        cmocka_unit_test(test_kill_8),
        cmocka_unit_test(test_kill_16_hosts),
        cmocka_unit_test(test_kill_sockets),
        cmocka_unit_test(test_second_death),
        cmocka_unit_test(test_back_to_back_shrink),
    };
    signal(SIGPIPE, SIG_IGN);
    srand((unsigned)getpid());
    dm_test_filter(argc, argv);
    if (tw_store_file(&g_store, "dm_shrink_test") != 0) return 1;
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    tw_store_close(&g_store);
    return rc;
}
