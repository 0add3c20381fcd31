/* Sites, a third level (DISTMESH_SITE, dm_fake_desc.site_of, dm_tcp_desc.site): the
   three-level all-reduce (distmesh_schedules.h >>three-level) on the threaded world over sited layouts
   (every collective, dtype and op; even, uneven, interleaved, three sites; split and shrink
   keep the sites), the three-level all_gather and reduce_scatter there (>>three-level
   others), the choice (the model takes all_reduce's for large messages across a slow site
   link, not for small ones or across a site link as fast as the hosts'; the gathers' across
   sites), the broadcast's site-ordered chain from every root, the same bytes from forked ranks
   over shared memory and sockets as from the threaded world, with the gathers, the broadcasts
   and the three-level barrier there, the site link's latency measured over sockets where
   DISTMESH_SITE_LINK is unset (once, agreed, cutting the gathers' segments), and the refusals (a host at two sites, bad site numbers,
   a bad DISTMESH_SITE_LINK, a long desc.site). */
#define _GNU_SOURCE
#include "test_tcp.h"
#include <unistd.h>

typedef struct sited {
    const char* name;
    int world;
    int hosts[8];
    int sites[8];
    bool fits;          /* three_level can run: every site the same number of hosts */
    bool even;          /* and every host the same number of ranks: three_level_ring gathers */
} sited;
#define N_SITED 7
static const sited g_sited[N_SITED] = {
    { "2 sites x 2 hosts x 2", 8, { 0, 0, 1, 1, 2, 2, 3, 3 }, { 0, 0, 0, 0, 1, 1, 1, 1 }, true, true },
    { "3 sites x 1 host x 2", 6, { 0, 0, 1, 1, 2, 2 }, { 0, 0, 1, 1, 2, 2 }, true, true },
    { "2 sites x 2 hosts, uneven 3+2+2+1", 8, { 0, 0, 0, 1, 1, 2, 2, 3 }, { 0, 0, 0, 0, 0, 1, 1, 1 }, true, false },
    { "interleaved sites and hosts", 8, { 0, 1, 2, 3, 0, 1, 2, 3 }, { 0, 1, 0, 1, 0, 1, 0, 1 }, true, true },
    { "2 sites x 2 hosts x 1", 4, { 0, 1, 2, 3 }, { 5, 5, 9, 9 }, true, true },
    { "2 hosts at one site, 1 at the other", 6, { 0, 0, 1, 1, 2, 2 }, { 0, 0, 0, 0, 1, 1 }, false, false },
    { "3 sites x 2 hosts x 1", 6, { 0, 1, 2, 3, 4, 5 }, { 0, 0, 1, 1, 2, 2 }, true, true },
};

static dm_status run_sited(const sited* l, dm_rank_fn fn, void* user) {
    dm_fake_desc fd;
    memset(&fd, 0, sizeof(fd));
    fd.world_size = l->world;
    fd.host_of = l->hosts;
    fd.site_of = l->sites;
    fd.timeout_ms = 60000;
    return dm_thread_world_run(&fd, fn, user);
}

/* A float32 sum of n elements of small integers (exact in any order) in place: right, and the
   algorithm that ran is want (NULL: any). */
static int sum_ran(dm_collective* c, size_t n, const char* want) {
    int W = dm_world_size(c), r = dm_rank(c), bad = 0;
    size_t i;
    float* v = (float*)malloc(n * sizeof(float));
    dm_status st;
    if (!v) return 1;
    for (i = 0; i < n; i++) v[i] = (float)(r + (int)(i % 5));
    st = dm_all_reduce(c, NULL, v, n, DM_FLOAT32, DM_SUM);
    for (i = 0; st == DM_OK && i < n; i++)
        if (v[i] != (float)(W * (W - 1) / 2 + W * (int)(i % 5))) { bad = 1; break; }
    if (st == DM_OK && want && strcmp(dm_last_algorithm(c), want) != 0) bad = 1;
    if (st != DM_OK || bad)
        fprintf(stderr, "rank %d of %d: all_reduce of %zu: %s, %s, ran %s (wanted %s) %s\n", r, W, n, dm_status_name(st),
                bad ? "wrong" : "right", dm_last_algorithm(c), want ? want : "any", dm_last_error(c));
    free(v);
    return st != DM_OK || bad;
}

/* Whether the last collective ran want (NULL: any); else a line naming what ran. */
static int ran_other(dm_collective* c, const char* what, const char* want) {
    if (!want || strcmp(dm_last_algorithm(c), want) == 0) return 0;
    fprintf(stderr, "rank %d of %d: %s ran %s, wanted %s\n", dm_rank(c), dm_world_size(c), what, dm_last_algorithm(c),
            want);
    return 1;
}
/* all_gather, then reduce_scatter in place (SUM) and out of place (MEAN), of n float32 elements
   per rank (the suite's exact data, test_tcp.h): right, and each ran want (NULL: any). */
static int gathers_ran(dm_collective* c, size_t n, const char* want) {
    int bad = suite_all_gather(c, n, DM_FLOAT32, 0, 1) || ran_other(c, "all_gather", want);
    bad |= suite_reduce_scatter(c, n, DM_FLOAT32, DM_SUM, true, 2) || ran_other(c, "reduce_scatter", want);
    bad |= suite_reduce_scatter(c, n, DM_FLOAT32, DM_MEAN, false, 3) || ran_other(c, "reduce_scatter", want);
    return bad;
}
/* A broadcast of n float32 elements from every root: right, and each ran want (NULL: any). */
static int broadcasts_ran(dm_collective* c, size_t n, const char* want) {
    int root, bad = 0;
    for (root = 0; root < dm_world_size(c) && !bad; root++)
        bad = suite_broadcast(c, n, DM_FLOAT32, root, root + 1) || ran_other(c, "broadcast", want);
    return bad;
}

/* ---- the threaded world ---------------------------------------------------------------------- */
/* The whole suite (every collective, dtype and op) on the first layout; on the others
   all_reduce in every op on one dtype per element size (the schedules move bytes by element
   size; the kernels are the suite's, tested there): int8, bfloat16 (rounded per step),
   float32, int64. The suite's exact data: any order of reduction gives the reference's bits;
   counts that fit three_level and not. Then a large all_reduce by the algorithm the layout
   allows. */
static const dm_dtype g_per_size[] = { DM_INT8, DM_BFLOAT16, DM_FLOAT32, DM_INT64 };
static int sited_suite_rank(dm_collective* c, void* user) {
    const sited* l = (const sited*)user;
    const char* algo = getenv("DISTMESH_ALGO");
    bool forced = algo && strcmp(algo, "three_level") == 0;
    int bad = 0, op, salt = 0;
    size_t t;
    if (l == &g_sited[0]) bad |= suite(c, false);
    for (t = 0; t < sizeof(g_per_size) / sizeof(g_per_size[0]) && l != &g_sited[0]; t++)
        for (op = 0; op < DM_REDUCE_OP_COUNT; op++) {
            bad |= suite_all_reduce(c, 5, g_per_size[t], (dm_reduce_op)op, true, ++salt);
            bad |= suite_all_reduce(c, 1237, g_per_size[t], (dm_reduce_op)op, op % 2 == 0, ++salt);
            bad |= suite_all_reduce(c, 70001, g_per_size[t], (dm_reduce_op)op, op % 2 != 0, ++salt);
        }
    /* forced: where it fits it runs, else the two-level forms (3 elements: no rail has one per
       host) */
    bad |= sum_ran(c, (size_t)1 << 20, forced ? (l->fits ? "three_level" : "two_level_ring") : NULL);
    bad |= sum_ran(c, 3, forced ? "two_level_rd" : NULL);
    /* the gathers across sites where the layout is even, else the two-level or flat ring */
    bad |= gathers_ran(c, 1001, forced && l->even ? "three_level_ring" : NULL);
    bad |= gathers_ran(c, 1, forced && l->even ? "three_level_ring" : NULL);
    bad |= broadcasts_ran(c, 1001, "three_level_chain");      /* any sited layout, forced or not */
    return bad;
}
static void test_sites_thread_layouts(void** s) {
    int k;
    (void)s;
    setenv("DISTMESH_ALGO", "three_level", 1);     /* auto: test_sites_choice */
    for (k = 0; k < N_SITED; k++) {
        if (TEST_SANITIZED && k != 0 && k != 2 && k != 6) continue;     /* even, uneven, rings */
        if (run_sited(&g_sited[k], sited_suite_rank, (void*)&g_sited[k]) != DM_OK)
            fail_msg("threaded world, %s, DISTMESH_ALGO=three_level: failed", g_sited[k].name);
    }
    unsetenv("DISTMESH_ALGO");
}

/* MEAN and every op on float data that is not exact: three_level divides once, on the cross
   rails, and every rank ends with the same bytes. */
static int mean_rank(dm_collective* c, void* user) {
    size_t n = ((size_t)1 << 18) + 5, i;
    int r = dm_rank(c), W = dm_world_size(c), bad = 0;
    float* v = (float*)malloc(n * sizeof(float));
    float* first = (float*)malloc(n * sizeof(float));
    (void)user;
    if (!v || !first) return 1;
    for (i = 0; i < n; i++) v[i] = (float)(r * 2 + (int)(i % 3));     /* mean: (W - 1) + i % 3, exact */
    RST(dm_all_reduce(c, NULL, v, n, DM_FLOAT32, DM_MEAN));
    for (i = 0; i < n && !bad; i++) bad = v[i] != (float)(W - 1 + (int)(i % 3));
    bad |= strcmp(dm_last_algorithm(c), "three_level") != 0;
    for (i = 0; i < n; i++) v[i] = (float)sin((double)i * 0.1 + r);
    RST(dm_all_reduce(c, NULL, v, n, DM_FLOAT32, DM_SUM));
    if (r == 0) memcpy(first, v, n * sizeof(float));
    RST(dm_broadcast(c, first, n, DM_FLOAT32, 0));
    bad |= memcmp(first, v, n * sizeof(float)) != 0;
    if (bad) fprintf(stderr, "rank %d: mean or same bytes failed (%s)\n", r, dm_last_algorithm(c));
    free(v);
    free(first);
    return bad;
}
static void test_sites_mean_same_bytes(void** s) {
    (void)s;
    setenv("DISTMESH_ALGO", "three_level", 1);  /* 3 x 1 x 2: auto takes the pipelined two-level ring */
    assert_int_equal(run_sited(&g_sited[0], mean_rank, NULL), DM_OK);
    assert_int_equal(run_sited(&g_sited[1], mean_rank, NULL), DM_OK);    /* the cross rails' ring */
    unsetenv("DISTMESH_ALGO");
}

/* The model: large messages cross a slow site link once (three_level), small ones take the
   fewest crossings (not three_level); with DISTMESH_SITE_LINK as fast as the hosts' link the
   extra phase does not pay and two_level_ring runs. Without sites the same hosts never run it. */
static int choice_rank(dm_collective* c, void* user) {
    const char* want = (const char*)user;
    int bad = sum_ran(c, (size_t)1 << 20, want);
    bad |= sum_ran(c, 2, NULL);
    if (strcmp(dm_last_algorithm(c), "three_level") == 0) {
        fprintf(stderr, "rank %d: 2 elements ran three_level\n", dm_rank(c));
        bad = 1;
    }
    return bad;
}
/* The gathers: across sites the cross rails' one step over the site link (three_level_ring);
   without sites the same hosts take the two-level ring. */
static int gather_choice_rank(dm_collective* c, void* user) { return gathers_ran(c, 1000, (const char*)user); }
static void test_sites_choice(void** s) {
    dm_fake_desc fd;
    (void)s;
    assert_int_equal(run_sited(&g_sited[0], choice_rank, (void*)"three_level"), DM_OK);
    assert_int_equal(run_sited(&g_sited[0], gather_choice_rank, (void*)"three_level_ring"), DM_OK);
    setenv("DISTMESH_SITE_LINK", "25,10", 1);
    assert_int_equal(run_sited(&g_sited[0], choice_rank, (void*)"two_level_ring"), DM_OK);
    unsetenv("DISTMESH_SITE_LINK");
    memset(&fd, 0, sizeof(fd));
    fd.world_size = 8;
    fd.host_of = g_sited[0].hosts;
    fd.timeout_ms = 60000;
    assert_int_equal(dm_thread_world_run(&fd, choice_rank, (void*)"two_level_ring"), DM_OK);
    assert_int_equal(dm_thread_world_run(&fd, gather_choice_rank, (void*)"two_level_ring"), DM_OK);
}

/* The pipelined middle (steps 3-5 by segment, _dm_sch_2l_stage on the site and cross rails):
   counts of several segments, every op on exact int32 data and MEAN on float32, in and out of
   place, on 2 sites x 2 hosts x 2 (the cross rails one exchange) and 3 sites x 2 hosts x 1
   (rings). */
static int pipelined_rank(dm_collective* c, void* user) { (void)user; return suite_pipelined(c, "three_level", 700); }
static void test_sites_pipelined(void** s) {
    (void)s;
    setenv("DISTMESH_ALGO", "three_level", 1);
    assert_int_equal(run_sited(&g_sited[0], pipelined_rank, NULL), DM_OK);
    if (!TEST_SANITIZED) assert_int_equal(run_sited(&g_sited[6], pipelined_rank, NULL), DM_OK);
    unsetenv("DISTMESH_ALGO");
}

/* The gathers pipelined (_dm_pick_3l_gather_segments: told links of 1 us latency, the model
   cuts blocks of 256 KiB and more in segments; by default it does not): right on the suite's
   exact data at block counts that no segment count divides, on 2 sites x 2 hosts x 2 (the
   cross rails one exchange, site rails and host rings), 3 sites x 2 hosts x 1 (cross rings,
   no host ring) and 3 sites x 1 host x 2 (no site rail); and reduce_scatter's bytes on data no
   order makes exact the same, SUM and MEAN, as with the phases one after another (three_level
   forced: the model's segments still). */
#define GATHERS_LINKS() (setenv("DISTMESH_SITE_LINK", "1,0.2", 1), setenv("DISTMESH_HOST_LINK", "1,2", 1))
#define GATHERS_UNLINK() (unsetenv("DISTMESH_SITE_LINK"), unsetenv("DISTMESH_HOST_LINK"))
static int gathers_pipelined_rank(dm_collective* c, void* user) {
    (void)user;
    return gathers_ran(c, ((size_t)1 << 18) + 3, "three_level_ring") ||
           gathers_ran(c, ((size_t)1 << 17) + 1, "three_level_ring");
}
#define RS_N (((size_t)1 << 17) + 5)
static float* g_rs_bytes[2][8];     /* [pipelined][rank]: SUM then MEAN, RS_N each */
static int rs_bytes_rank(dm_collective* c, void* user) {
    int r = dm_rank(c), W = dm_world_size(c);
    size_t i, n = RS_N * (size_t)W;
    float* in = (float*)malloc(n * sizeof(float));
    float* out = (float*)malloc(2 * RS_N * sizeof(float));
    RCHECK(in && out);
    ((float**)user)[r] = out;
    for (i = 0; i < n; i++) in[i] = (float)(sin((double)i * 0.37 + r * 1.3) * 50.0);
    RST(dm_reduce_scatter(c, in, out, RS_N, DM_FLOAT32, DM_SUM));
    RCHECK(strcmp(dm_last_algorithm(c), "three_level_ring") == 0);
    RST(dm_reduce_scatter(c, in, out + RS_N, RS_N, DM_FLOAT32, DM_MEAN));
    free(in);
    return 0;
}
static void test_sites_gathers_pipelined(void** s) {
    int k, r;
    (void)s;
    setenv("DISTMESH_ALGO", "three_level", 1);     /* 3 x 1 x 2: auto takes the two-level ring */
    GATHERS_LINKS();
    assert_int_equal(run_sited(&g_sited[0], gathers_pipelined_rank, NULL), DM_OK);
    if (!TEST_SANITIZED) {
        assert_int_equal(run_sited(&g_sited[6], gathers_pipelined_rank, NULL), DM_OK);
        assert_int_equal(run_sited(&g_sited[1], gathers_pipelined_rank, NULL), DM_OK);
    }
    for (k = 1; k >= 0; k--) {      /* pipelined, then not */
        if (k == 0) GATHERS_UNLINK();
        assert_int_equal(run_sited(&g_sited[0], rs_bytes_rank, (void*)g_rs_bytes[k]), DM_OK);
    }
    for (r = 0; r < 8; r++) {
        bool same = memcmp(g_rs_bytes[0][r], g_rs_bytes[1][r], 2 * RS_N * sizeof(float)) == 0;
        free(g_rs_bytes[0][r]);
        free(g_rs_bytes[1][r]);
        if (!same) fail_msg("rank %d: reduce_scatter pipelined gave other bytes than unpipelined", r);
    }
    unsetenv("DISTMESH_ALGO");
}

/* Compression across sites compresses only the site link (three_level_int8 / _bf16): every rank
   the same bytes, within int8's bound of the exact sum (2 sites x scale / 2; scale = the block's
   largest site sum / 127), the error-feedback residual only on the elements this rank encodes
   (its piece: block i of R, piece j of the site's HS), and with DISTMESH_ALGO=two_level the
   two-level compressed schedule over every host. */
/* Part s of count split in parts: the first count % parts one longer (the schedules' cut). */
static void segment(size_t count, int parts, int s, size_t* off, size_t* len) {
    size_t base = count / (size_t)parts, extra = count % (size_t)parts, si = (size_t)s;
    *off = si * base + (si < extra ? si : extra);
    *len = base + (si < extra ? 1 : 0);
}
static int compressed_rank(dm_collective* c, void* user) {
    size_t n = 40000, i, boff, blen, poff, plen;
    int r = dm_rank(c), W = dm_world_size(c), mode, bad = 0, local = r % 2, j = (r / 2) % 2;
    const char* want_prefix = (const char*)user;
    float* v = (float*)malloc(n * sizeof(float));
    float* first = (float*)malloc(n * sizeof(float));
    dm_compress_state* cs = NULL;
    if (!v || !first || dm_compress_state_create(n, &cs) != DM_OK) return 1;
    segment(n, 2, local, &boff, &blen);         /* 2 sites x 2 hosts x 2: block of R = 2, piece of HS = 2 */
    segment(blen, 2, j, &poff, &plen);
    poff += boff;
    for (mode = DM_COMPRESS_BF16; mode <= DM_COMPRESS_INT8; mode++) {
        char want[32];
        const float* res = dm_compress_state_residual(cs);
        for (i = 0; i < n; i++) v[i] = (float)sin((double)i * 0.01 + r) * 3.0f;
        RST(dm_all_reduce_compressed(c, NULL, v, n, DM_FLOAT32, DM_SUM, (dm_compress)mode, cs));
        snprintf(want, sizeof(want), "%s_%s", want_prefix, mode == DM_COMPRESS_INT8 ? "int8" : "bf16");
        bad |= strcmp(dm_last_algorithm(c), want) != 0;
        for (i = 0; i < n; i++) {
            double exact = 0;
            int q;
            for (q = 0; q < W; q++) exact += (float)sin((double)i * 0.01 + q) * 3.0f;
            bad |= fabs(v[i] - exact) > 0.2;       /* int8: 2 x (4 x 3 / 127) / 2; bf16 tighter */
        }
        if (strcmp(want_prefix, "three_level") == 0)
            for (i = 0; i < n; i++) bad |= (i < poff || i >= poff + plen) && res[i] != 0.0f;
        if (r == 0) memcpy(first, v, n * sizeof(float));
        RST(dm_broadcast(c, first, n, DM_FLOAT32, 0));
        bad |= memcmp(first, v, n * sizeof(float)) != 0;
        if (bad) fprintf(stderr, "rank %d: compressed %s (ran %s) failed\n", r, want, dm_last_algorithm(c));
    }
    dm_compress_state_destroy(cs);
    free(v);
    free(first);
    return bad;
}
static void test_sites_compressed(void** s) {
    (void)s;
    assert_int_equal(run_sited(&g_sited[0], compressed_rank, (void*)"three_level"), DM_OK);
    setenv("DISTMESH_ALGO", "two_level", 1);
    assert_int_equal(run_sited(&g_sited[0], compressed_rank, (void*)"two_level"), DM_OK);
    unsetenv("DISTMESH_ALGO");
}

/* Split and shrink keep the sites: {even, odd} of 2 sites x 2 hosts x 2 are 2 sites x 2 hosts x
   1 each; without rank 7 the last host has one rank (the fold of the others). */
static int split_shrink_rank(dm_collective* c, void* user) {
    dm_collective *half = NULL, *rest = NULL;
    int r = dm_rank(c), drop = 7, bad = 0;
    (void)user;
    RST(dm_split(c, r % 2, r, &half));
    bad |= sum_ran(half, (size_t)1 << 19, "three_level");
    dm_destroy(half);
    if (r == drop) return bad;
    RST(dm_shrink(c, &drop, 1, DM_SHRINK_DEFAULT, &rest));
    bad |= sum_ran(rest, (size_t)1 << 19, "three_level");
    dm_destroy(rest);
    return bad;
}
static void test_sites_split_shrink(void** s) {
    (void)s;
    assert_int_equal(run_sited(&g_sited[0], split_shrink_rank, NULL), DM_OK);
}

/* ---- forked ranks: shared memory inside a host, sockets between hosts ------------------------ */
static const sited* g_layout;     /* the layout the forked bodies take */
static void bytes_path(char* out, size_t cap, const char* who, int rank) {
    snprintf(out, cap, "%s/sites-%s-%d", g_store.dir, who, rank);
}
/* A float32 sum of data no order makes exact; this rank's result bytes to a file named by who. */
static int write_sum(dm_collective* c, const char* who) {
    size_t n = ((size_t)1 << 18) + 3, i;
    int r = dm_rank(c);
    float* v = (float*)malloc(n * sizeof(float));
    char path[512];
    FILE* f;
    if (!v) return 1;
    for (i = 0; i < n; i++) v[i] = (float)(sin((double)i * 0.37 + r * 1.3) * 50.0);
    RST(dm_all_reduce(c, NULL, v, n, DM_FLOAT32, DM_SUM));
    RCHECK(strcmp(dm_last_algorithm(c), "three_level") == 0);
    bytes_path(path, sizeof(path), who, r);
    f = fopen(path, "wb");
    RCHECK(f && fwrite(v, sizeof(float), n, f) == n);
    fclose(f);
    free(v);
    return 0;
}
static int thread_bytes_rank(dm_collective* c, void* user) { return write_sum(c, (const char*)user); }
/* This forked rank on g_layout's host and site. */
static int sited_create_logged(int rank, int world, const char* site, const dm_logger* logger, dm_collective** c) {
    dm_tcp_desc d;
    char name[16];
    tw_sim_host(g_layout->hosts[rank]);
    snprintf(name, sizeof(name), "site%d", g_layout->sites[rank]);
    setenv("DISTMESH_SITE", site ? site : name, 1);
    make_desc(&d, rank, world);
    if (logger) d.logger = *logger;
    return dm_tcp_create(&d, c) == DM_OK ? 0 : 1;
}
static int sited_create(int rank, int world, const char* site, dm_collective** c) {
    return sited_create_logged(rank, world, site, NULL, c);
}
/* The barrier across sites (three_level_dissemination): no rank leaves before the last one,
   which comes 200 ms late, has arrived. */
static int barrier_waits(dm_collective* c) {
    int r = dm_rank(c), W = dm_world_size(c);
    int64_t t0;
    RST(dm_barrier(c));
    t0 = tw_now_ms();
    if (r == W - 1) tw_sleep_ms(200);
    RST(dm_barrier(c));
    RCHECK(strcmp(dm_last_algorithm(c), "three_level_dissemination") == 0);
    if (tw_now_ms() - t0 < 150) {
        fprintf(stderr, "rank %d: left the barrier after %lld ms, before the late rank came\n", r, (long long)(tw_now_ms() - t0));
        return 1;
    }
    return 0;
}
static int body_bytes(dm_collective* c, int rank, int world, void* arg) {
    int bad;
    RCHECK(sited_create(rank, world, NULL, &c) == 0);
    bad = write_sum(c, (const char*)arg);
    bad |= sum_ran(c, (size_t)1 << 20, "three_level");
    bad |= gathers_ran(c, 1001, g_layout->even ? "three_level_ring" : NULL);
    bad |= broadcasts_ran(c, 1001, "three_level_chain");
    bad |= barrier_waits(c);
    dm_destroy(c);
    return bad;
}
static void test_sites_processes_same_bytes(void** s) {
    int k, r;
    (void)s;
    for (k = 0; k < (TEST_SANITIZED ? 1 : 2); k++) {     /* under a sanitizer shm+tcp only */
        const char* who = k == 0 ? "shm" : "tcp";
        g_layout = &g_sited[k == 0 ? 0 : 2];
        assert_int_equal(run_sited(g_layout, thread_bytes_rank, (void*)"thread"), DM_OK);
        g_transport = k == 0 ? NULL : "tcp";
        r = run_world_ex(g_layout->world, body_bytes, (void*)who, 90, false);
        g_transport = NULL;
        assert_int_equal(r, 0);
        for (r = 0; r < g_layout->world; r++) {
            char a[512], b[512];
            bytes_path(a, sizeof(a), "thread", 0);
            bytes_path(b, sizeof(b), who, r);
            if (!tcp_files_same(a, b)) fail_msg("%s, %s: rank %d's bytes differ from the threaded world's", g_layout->name, who, r);
        }
    }
    unsetenv("DISTMESH_SITE");
}

/* dm_shrink over sockets keeps the sites (the parent's layout without the gone rank). */
/* The pipelined gathers (test_sites_gathers_pipelined's links) over forked ranks: sockets
   reduce through the stage's scratch chunks, shared memory in place. */
static int body_gathers_pipelined(dm_collective* c, int rank, int world, void* arg) {
    int bad;
    (void)arg;
    RCHECK(sited_create(rank, world, NULL, &c) == 0);
    bad = gathers_ran(c, ((size_t)1 << 17) + 1, "three_level_ring");
    dm_destroy(c);
    return bad;
}
static void test_sites_processes_gathers_pipelined(void** s) {
    int k;
    (void)s;
    g_layout = &g_sited[0];
    GATHERS_LINKS();
    for (k = 0; k < (TEST_SANITIZED ? 1 : 2); k++) {     /* shm + tcp, then tcp alone */
        g_transport = k == 0 ? NULL : "tcp";
        assert_int_equal(run_world_ex(g_layout->world, body_gathers_pipelined, NULL, 90, false), 0);
    }
    g_transport = NULL;
    GATHERS_UNLINK();
    unsetenv("DISTMESH_SITE");
}
/* The site link measured (distmesh_schedules.h >>site probe): over sockets with
   DISTMESH_SITE_LINK unset, the group's first three-level gather measures it, once; every rank
   takes the same value, and the gathers cut their segments by it: blocks of 2 MiB in more than
   one wherever the link answers within 2 ms (the class's 5 ms cuts none). Told the link (here
   5 ms), nothing is measured and the told link decides: one segment. */
typedef struct probe_log { int probes, segs; double us; } probe_log;
static void probe_logger(dm_log_level level, dm_status st, const char* msg, const char* file, int line, void* user) {
    probe_log* p = (probe_log*)user;
    const char* m;
    (void)level; (void)st; (void)file; (void)line;
    if ((m = strstr(msg, "site link measured: "))) {
        p->probes++;
        p->us = atof(m + strlen("site link measured: "));
    } else if ((m = strstr(msg, "three_level_ring in "))) {
        p->segs = atoi(m + strlen("three_level_ring in "));
    }
}
static int body_site_probe(dm_collective* c, int rank, int world, void* arg) {
    const char* told = (const char*)arg;
    probe_log log;
    dm_logger logger = { probe_logger, NULL };
    double all[8];
    int k, segs, bad = 0;
    memset(&log, 0, sizeof(log));
    logger.user_data = &log;
    RCHECK(sited_create_logged(rank, world, NULL, &logger, &c) == 0);
    for (k = 0; k < 2 && !bad; k++) bad = gathers_ran(c, ((size_t)1 << 19) + 1, "three_level_ring");
    segs = log.segs;
    RST(dm_all_gather(c, &log.us, all, 1, DM_FLOAT64));
    dm_destroy(c);
    if (bad) return 1;
    if (told) {
        if (log.probes != 0 || segs != 1) {
            fprintf(stderr, "rank %d: told %s: %d measurements, %d segments (wanted 0 and 1)\n", rank, told, log.probes, segs);
            return 1;
        }
        return 0;
    }
    for (k = 0; k < world; k++)
        if (all[k] != log.us) {
            fprintf(stderr, "rank %d: measured %.1f us, rank %d %.1f us: the ranks did not agree\n", rank, log.us, k, all[k]);
            return 1;
        }
    if (log.probes != 1 || !(log.us > 0) || (log.us < 2000 && segs < 2)) {
        fprintf(stderr, "rank %d: %d measurements (wanted 1), %.1f us, %d segments\n", rank, log.probes, log.us, segs);
        return 1;
    }
    if (log.us >= 2000 && rank == 0) fprintf(stderr, "site link measured at %.0f us (a loaded machine): segments not checked\n", log.us);
    return 0;
}
static void test_sites_processes_site_probe(void** s) {
    (void)s;
    g_layout = &g_sited[0];
    g_transport = "tcp";
    assert_int_equal(run_world_ex(g_layout->world, body_site_probe, NULL, 90, false), 0);
    setenv("DISTMESH_SITE_LINK", "5000,1", 1);
    assert_int_equal(run_world_ex(g_layout->world, body_site_probe, (void*)"5000,1", 90, false), 0);
    unsetenv("DISTMESH_SITE_LINK");
    g_transport = NULL;
    unsetenv("DISTMESH_SITE");
}
static int body_tcp_shrink(dm_collective* c, int rank, int world, void* arg) {
    dm_collective* n = NULL;
    int drop = 7, bad;
    (void)arg;
    RCHECK(sited_create(rank, world, NULL, &c) == 0);
    bad = sum_ran(c, (size_t)1 << 19, "three_level");
    if (rank != drop) {
        RST(dm_shrink(c, &drop, 1, DM_SHRINK_DEFAULT, &n));
        bad |= sum_ran(n, (size_t)1 << 19, "three_level");
        dm_destroy(n);
    }
    dm_destroy(c);
    return bad;
}
static void test_sites_tcp_shrink(void** s) {
    (void)s;
    if (TEST_SANITIZED) skip();     /* the threaded world's shrink is there (test_sites_split_shrink) */
    g_layout = &g_sited[0];
    assert_int_equal(run_world_ex(8, body_tcp_shrink, NULL, 90, false), 0);
    unsetenv("DISTMESH_SITE");
}

/* ---- refusals --------------------------------------------------------------------------------- */
/* Two ranks on one host given different sites: every rank's create fails, naming the rule. */
static int body_two_sites_one_host(dm_collective* c, int rank, int world, void* arg) {
    dm_tcp_desc d;
    (void)arg;
    tw_sim_host(0);
    unsetenv("DISTMESH_SITE");
    make_desc(&d, rank, world);
    d.site = rank == 0 ? "east" : "west";
    RCHECK(dm_tcp_create(&d, &c) == DM_ERR_INVALID_ARG && c == NULL);
    RCHECK(strstr(dm_last_error(NULL), "a host is at one site") != NULL);
    RCHECK(strstr(dm_last_error(NULL), "\"east\"") != NULL && strstr(dm_last_error(NULL), "\"west\"") != NULL);
    return 0;
}
static int body_long_site(dm_collective* c, int rank, int world, void* arg) {
    dm_tcp_desc d;
    char site[80];
    (void)arg;
    memset(site, 'x', sizeof(site) - 1);
    site[sizeof(site) - 1] = 0;
    make_desc(&d, rank, world);
    d.site = site;
    RCHECK(dm_tcp_create(&d, &c) == DM_ERR_INVALID_ARG && c == NULL);
    RCHECK(strstr(dm_last_error(NULL), "site") != NULL);
    return 0;
}
static void test_sites_refusals(void** s) {
    static const int hosts[4] = { 0, 0, 1, 1 }, two_sites[4] = { 0, 1, 2, 2 }, negative[4] = { 0, 0, -1, -1 };
    dm_collective* cs[4] = { NULL, NULL, NULL, NULL };
    dm_fake_desc fd;
    (void)s;
    memset(&fd, 0, sizeof(fd));
    fd.world_size = 4;
    fd.host_of = hosts;
    fd.site_of = two_sites;
    assert_int_equal(dm_thread_world_create(&fd, cs), DM_ERR_INVALID_ARG);
    assert_non_null(strstr(dm_last_error(NULL), "a host is at one site"));
    fd.site_of = negative;
    assert_int_equal(dm_thread_world_create(&fd, cs), DM_ERR_INVALID_ARG);
    assert_non_null(strstr(dm_last_error(NULL), "site_of[2] is -1"));
    fd.host_of = NULL;                          /* nodes from local_world_size: 2 per node */
    fd.local_world_size = 2;
    fd.site_of = two_sites;
    assert_int_equal(dm_thread_world_create(&fd, cs), DM_ERR_INVALID_ARG);
    fd.site_of = hosts;
    assert_int_equal(dm_thread_world_create(&fd, cs), DM_OK);
    for (int r = 0; r < 4; r++) dm_destroy(cs[r]);
    setenv("DISTMESH_SITE_LINK", "fast", 1);
    assert_int_equal(dm_thread_world_create(&fd, cs), DM_ERR_ENV);
    assert_non_null(strstr(dm_last_error(NULL), "DISTMESH_SITE_LINK=\"fast\""));
    unsetenv("DISTMESH_SITE_LINK");
    assert_int_equal(run_world_ex(2, body_two_sites_one_host, NULL, 60, false), 0);
    assert_int_equal(run_world_ex(2, body_long_site, NULL, 60, false), 0);
    unsetenv("DISTMESH_TEST_HOST_ID");
}

int main(int argc, char** argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sites_thread_layouts),
        cmocka_unit_test(test_sites_mean_same_bytes),
        cmocka_unit_test(test_sites_choice),
        cmocka_unit_test(test_sites_pipelined),
        cmocka_unit_test(test_sites_gathers_pipelined),
        cmocka_unit_test(test_sites_compressed),
        cmocka_unit_test(test_sites_split_shrink),
        cmocka_unit_test(test_sites_processes_same_bytes),
        cmocka_unit_test(test_sites_processes_gathers_pipelined),
        cmocka_unit_test(test_sites_processes_site_probe),
        cmocka_unit_test(test_sites_tcp_shrink),
        cmocka_unit_test(test_sites_refusals),
    };
    return TCP_RUN_TESTS(tests, argc, argv);
}
