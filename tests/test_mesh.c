/* test_mesh: dm_mesh (named dims, row-major, last innermost) and the LLaMA-Factory strategy on
   the threaded world of 8 ranks with real collectives on every group; dm_split like
   MPI_Comm_split; dm_local; main_process_first ordering; validation messages. */
#define _POSIX_C_SOURCE 200809L /* nanosleep under -std=c11 */
#include "distmesh.h"
#include "prelude.h"
#include "test_util.h"
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#define RCALL(c, expr) do { dm_status st_ = (expr); if (st_ != DM_OK) { \
        rank_fail(__LINE__, "%s -> %s: %s", #expr, dm_status_name(st_), (c) ? dm_last_error(c) : ""); \
        return st_; } } while (0)
static void run_ranks(int n, dm_rank_fn fn, void* user) {
    dm_fake_desc d = {0};
    atomic_store(&g_failures, 0);
    g_first_failure[0] = 0;
    d.world_size = n;
    d.timeout_ms = 30000;
    assert_int_equal(dm_thread_world_run(&d, fn, user), DM_OK);
    if (atomic_load(&g_failures)) fail_msg("%d rank failure(s), first: %s", atomic_load(&g_failures), g_first_failure);
}

/* ---- a logger that keeps the failures it sees, a counting allocator, a simulated Fake member ---- */
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_nlogged;
static dm_status g_logged_st;
static char g_logged_msg[DM_LAST_ERROR_SIZE];
static void capture_log(dm_log_level lvl, dm_status st, const char* msg, const char* file, int line, void* ud) {
    (void)file; (void)line;
    if (lvl != DM_LOG_ERROR || ud != (void*)&g_nlogged) return;
    pthread_mutex_lock(&g_log_mu);
    g_nlogged++;
    g_logged_st = st;
    snprintf(g_logged_msg, sizeof(g_logged_msg), "%s", msg);
    pthread_mutex_unlock(&g_log_mu);
}
static void log_reset(void) { g_nlogged = 0; g_logged_st = DM_OK; g_logged_msg[0] = 0; }
/* Exactly one more error was logged since `before`, with status st and text msg. */
static void assert_logged(int before, dm_status st, const char* msg) {
    assert_int_equal(g_nlogged, before + 1);
    assert_int_equal(g_logged_st, st);
    assert_string_equal(g_logged_msg, msg);
}

/* Counting allocator: fails every allocation once `fail_after` more have succeeded (-1: never). */
typedef struct counting_alloc { int allocs, frees, fail_after; } counting_alloc;
static void* counting_malloc(size_t n, void* ud) {
    counting_alloc* a = (counting_alloc*)ud;
    if (a->fail_after == 0) return NULL;
    if (a->fail_after > 0) a->fail_after--;
    a->allocs++;
    return malloc(n);
}
static void counting_free(void* p, void* ud) { ((counting_alloc*)ud)->frees++; free(p); }

static dm_collective* make_fake(int world, int rank, bool with_logger) {
    dm_fake_desc fd = {0};
    dm_collective* c = NULL;
    fd.world_size = world;
    fd.rank = rank;
    if (with_logger) { fd.logger.func = capture_log; fd.logger.user_data = &g_nlogged; }
    assert_int_equal(dm_fake_create(&fd, &c), DM_OK);
    return c;
}

/* Checks group g of world rank `rank`: its members (world ranks, in group-rank order) must be
   members[0..size); all_gather, all_reduce, broadcast from every root and reduce_scatter on it. */
static int check_group(dm_collective* g, int rank, const int* members, int size) {
    int32_t got[16], sum = 0, want_sum = 0, block[16], mine;
    int i, pos = -1, root;
    RCHECK(g != NULL);
    if (!g) return DM_ERR_INTERNAL;
    for (i = 0; i < size; i++) { if (members[i] == rank) pos = i; want_sum += members[i]; }
    RCHECK(dm_world_size(g) == size);
    RCHECK(dm_rank(g) == pos);
    RCALL(g, dm_all_gather(g, &rank, got, 1, DM_INT32));
    for (i = 0; i < size; i++) RCHECK(got[i] == members[i]);
    sum = rank;
    RCALL(g, dm_all_reduce(g, NULL, &sum, 1, DM_INT32, DM_SUM));
    RCHECK(sum == want_sum);
    for (root = 0; root < size; root++) {
        int32_t v = rank;
        RCALL(g, dm_broadcast(g, &v, 1, DM_INT32, root));
        RCHECK(v == members[root]);
    }
    for (i = 0; i < size; i++) block[i] = rank * 100 + i;
    RCALL(g, dm_reduce_scatter(g, block, &mine, 1, DM_INT32, DM_SUM));
    RCHECK(mine == want_sum * 100 + pos * size);
    RCALL(g, dm_barrier(g));
    return DM_OK;
}

/* *d: a mesh of c with dims named dp and tp, sized dp x tp (0: inferred from the world). */
static void dp_tp_desc(dm_mesh_desc* d, dm_collective* c, int dp, int tp) {
    memset(d, 0, sizeof(*d));
    d->world = c;
    d->ndims = 2;
    d->dim_names[0] = "dp";
    d->dim_names[1] = "tp";
    d->dim_sizes[0] = dp;
    d->dim_sizes[1] = tp;
}

/* (dp 2, tp 4): dp_rank = rank / 4, tp_rank = rank % 4; tp groups {0..3} {4..7}; dp groups
   {t, t+4}. Built both by dm_mesh_create and by dm_mesh_create_dp_tp. */
static int rank_dp_tp(dm_collective* c, void* user) {
    int r = dm_rank(c), way, i, members[8];
    (void)user;
    for (way = 0; way < 3; way++) {
        dm_mesh* m = NULL;
        if (way == 1) {
            RCALL(c, dm_mesh_create_dp_tp(c, 4, &m));
        } else {
            dm_mesh_desc d;
            dp_tp_desc(&d, c, way == 0 ? 2 : 0, 4);     /* way 2: dp inferred from the world size */
            RCALL(c, dm_mesh_create(&d, &m));
        }
        RCHECK(dm_mesh_ndims(m) == 2);
        RCHECK(strcmp(dm_mesh_dim_name(m, 0), "dp") == 0 && strcmp(dm_mesh_dim_name(m, 1), "tp") == 0);
        RCHECK(dm_mesh_dim_name(m, 2) == NULL && dm_mesh_dim_name(m, -1) == NULL);
        RCHECK(dm_mesh_dim_index(m, "tp") == 1 && dm_mesh_dim_index(m, "pp") == -1);
        RCHECK(dm_mesh_rank(m, "dp") == r / 4 && dm_mesh_rank(m, "tp") == r % 4);
        RCHECK(dm_mesh_size(m, "dp") == 2 && dm_mesh_size(m, "tp") == 4);
        RCHECK(dm_mesh_dp_rank(m) == r / 4 && dm_mesh_tp_rank(m) == r % 4);
        RCHECK(dm_mesh_dp_world_size(m) == 2 && dm_mesh_tp_world_size(m) == 4);
        RCHECK(dm_mesh_rank(m, NULL) == r && dm_mesh_size(m, NULL) == 8);
        RCHECK(dm_mesh_group(m, NULL) == c && dm_mesh_world(m) == c);
        RCHECK(dm_mesh_tp_world(m) == dm_mesh_group(m, "tp"));
        /* unknown dim: -1 / NULL and a message */
        RCHECK(dm_mesh_rank(m, "nope") == -1 && dm_mesh_size(m, "nope") == -1);
        RCHECK(dm_mesh_group(m, "nope") == NULL);
        RCHECK(strstr(dm_mesh_last_error(m), "nope") != NULL);
        for (i = 0; i < 4; i++) members[i] = (r / 4) * 4 + i;
        check_group(dm_mesh_group(m, "tp"), r, members, 4);
        members[0] = r % 4;
        members[1] = r % 4 + 4;
        check_group(dm_mesh_group(m, "dp"), r, members, 2);
        dm_mesh_destroy(m);
    }
    return DM_OK;
}
static void test_mesh_dp2_tp4_on_8_ranks(void** state) { (void)state; run_ranks(8, rank_dp_tp, NULL); }

/* (2, 2, 2) named a, b, c: rank = 4a + 2b + c; each dim's group varies one coordinate. */
static int rank_222(dm_collective* c, void* user) {
    dm_mesh_desc d;
    dm_mesh* m = NULL;
    int r = dm_rank(c), co[3] = { r / 4, (r / 2) % 2, r % 2 }, stride[3] = { 4, 2, 1 }, dim, k;
    static const char* names[3] = { "a", "b", "c" };
    (void)user;
    memset(&d, 0, sizeof(d));
    d.world = c;
    d.ndims = 3;
    for (dim = 0; dim < 3; dim++) { d.dim_names[dim] = names[dim]; d.dim_sizes[dim] = 2; }
    RCALL(c, dm_mesh_create(&d, &m));
    for (dim = 0; dim < 3; dim++) {
        int members[2];
        RCHECK(dm_mesh_rank(m, names[dim]) == co[dim]);
        RCHECK(dm_mesh_size(m, names[dim]) == 2);
        for (k = 0; k < 2; k++) members[k] = r - co[dim] * stride[dim] + k * stride[dim];
        check_group(dm_mesh_group(m, names[dim]), r, members, 2);
    }
    /* a mesh without dp/tp: the Optimus accessors say size 1, rank 0 */
    RCHECK(dm_mesh_dp_world_size(m) == 1 && dm_mesh_dp_rank(m) == 0);
    RCHECK(dm_mesh_tp_world_size(m) == 1 && dm_mesh_tp_rank(m) == 0);
    dm_mesh_destroy(m);
    return DM_OK;
}
static void test_mesh_2x2x2_on_8_ranks(void** state) { (void)state; run_ranks(8, rank_222, NULL); }

/* Validation: no communication, so a simulated Fake member is enough. */
static void test_mesh_validation_messages(void** state) {
    dm_collective* c = make_fake(8, 5, false);
    dm_mesh_desc d;
    dm_mesh* m = (dm_mesh*)&d;
    (void)state;
    dp_tp_desc(&d, c, 3, 3);
    assert_int_equal(dm_mesh_create(&d, &m), DM_ERR_INVALID_ARG);
    assert_null(m);
    assert_non_null(strstr(dm_last_error(c), "8"));
    d.dim_sizes[0] = 0;            /* 8 / 3 is no integer */
    assert_int_equal(dm_mesh_create(&d, &m), DM_ERR_INVALID_ARG);
    d.dim_sizes[1] = 0;            /* two inferred dims */
    assert_int_equal(dm_mesh_create(&d, &m), DM_ERR_INVALID_ARG);
    assert_true(strlen(dm_last_error(c)) > 0);
    d.dim_sizes[0] = -2;
    d.dim_sizes[1] = -4;
    assert_int_equal(dm_mesh_create(&d, &m), DM_ERR_INVALID_ARG);
    d.dim_sizes[0] = 2;
    d.dim_sizes[1] = 4;
    d.dim_names[1] = "dp";         /* duplicate name */
    assert_int_equal(dm_mesh_create(&d, &m), DM_ERR_INVALID_ARG);
    assert_non_null(strstr(dm_last_error(c), "dp"));
    d.dim_names[1] = NULL;
    assert_int_equal(dm_mesh_create(&d, &m), DM_ERR_INVALID_ARG);
    d.dim_names[1] = "a_name_that_is_much_longer_than_thirty_one_bytes";
    assert_int_equal(dm_mesh_create(&d, &m), DM_ERR_INVALID_ARG);
    d.dim_names[1] = "tp";
    d.ndims = 0;
    assert_int_equal(dm_mesh_create(&d, &m), DM_ERR_INVALID_ARG);
    d.ndims = DM_MAX_DIMS + 1;
    assert_int_equal(dm_mesh_create(&d, &m), DM_ERR_INVALID_ARG);
    d.ndims = 2;
    d.world = NULL;
    assert_int_equal(dm_mesh_create(&d, &m), DM_ERR_INVALID_ARG);
    assert_int_equal(dm_mesh_create(NULL, &m), DM_ERR_INVALID_ARG);
    assert_int_equal(dm_mesh_create(&d, NULL), DM_ERR_INVALID_ARG);
    assert_int_equal(dm_mesh_create_dp_tp(c, 3, &m), DM_ERR_INVALID_ARG);
    assert_true(strlen(dm_last_error(c)) > 0);
    assert_int_equal(dm_mesh_create_dp_tp(c, 0, &m), DM_ERR_INVALID_ARG);
    assert_int_equal(dm_mesh_create_dp_tp(NULL, 2, &m), DM_ERR_INVALID_ARG);
    /* a valid mesh on the simulated member: coordinates of rank 5 in (dp 2, tp 4) */
    assert_int_equal(dm_mesh_create_dp_tp(c, 4, &m), DM_OK);
    assert_int_equal(dm_mesh_dp_rank(m), 1);
    assert_int_equal(dm_mesh_tp_rank(m), 1);
    assert_int_equal(dm_world_size(dm_mesh_tp_world(m)), 4);
    assert_int_equal(dm_rank(dm_mesh_tp_world(m)), 1);
    assert_int_equal(dm_world_size(dm_mesh_group(m, "dp")), 2);
    dm_mesh_destroy(m);
    dm_mesh_destroy(NULL);
    assert_int_equal(dm_mesh_ndims(NULL), 0);
    assert_int_equal(dm_mesh_rank(NULL, "dp"), -1);
    dm_destroy(c);
}

/* ---- strategy ---- */
/* dm_strategy_validate of d for world is refused (DM_ERR_INVALID_ARG) with msg in its buffer. */
static void validate_refuses(const dm_strategy_desc* d, int world, const char* msg) {
    int sizes[DM_DIM_COUNT];
    char err[256];
    assert_int_equal(dm_strategy_validate(d, world, sizes, err, sizeof(err)), DM_ERR_INVALID_ARG);
    assert_string_equal(err, msg);
}
static void test_strategy_defaults_and_seed_messages(void** state) {
    dm_strategy_desc d;
    int sizes[DM_DIM_COUNT];
    char err[256];
    (void)state;
    memset(&d, 0, sizeof(d));
    assert_int_equal(dm_strategy_validate(&d, 8, sizes, err, sizeof(err)), DM_OK);
    assert_int_equal(sizes[DM_DIM_MP_REPLICATE], 1);
    assert_int_equal(sizes[DM_DIM_MP_SHARD], 8);
    assert_int_equal(sizes[DM_DIM_DP], 8);
    assert_int_equal(sizes[DM_DIM_CP], 1);
    d.mp_replicate_size = 2;
    d.cp_size = 2;
    assert_int_equal(dm_strategy_validate(&d, 8, sizes, err, sizeof(err)), DM_OK);
    assert_int_equal(sizes[DM_DIM_MP_REPLICATE], 2);
    assert_int_equal(sizes[DM_DIM_MP_SHARD], 4);
    assert_int_equal(sizes[DM_DIM_DP], 4);
    assert_int_equal(sizes[DM_DIM_CP], 2);
    memset(&d, 0, sizeof(d));
    d.mp_shard_size = 4;   /* the seed's example config: mp_replicate 1, shard 4, dp 2, cp 1 */
    d.dp_size = 4;
    assert_int_equal(dm_strategy_validate(&d, 4, sizes, err, sizeof(err)), DM_OK);
    memset(&d, 0, sizeof(d));
    d.mp_replicate_size = 3;
    d.mp_shard_size = 3;
    validate_refuses(&d, 8, "mp_replicate_size * mp_shard_size must equal to world_size, got 3 * 3 != 8.");
    memset(&d, 0, sizeof(d));
    d.dp_size = 3;
    d.cp_size = 3;
    validate_refuses(&d, 8, "dp_size * cp_size must equal to world_size, got 3 * 3 != 8.");
    d.dp_size = 3;
    d.cp_size = 0;         /* cp defaults to 1 */
    validate_refuses(&d, 8, "dp_size * cp_size must equal to world_size, got 3 * 1 != 8.");
    memset(&d, 0, sizeof(d));
    d.mp_shard_size = 2;   /* mp_replicate defaults to 1 */
    validate_refuses(&d, 8, "mp_replicate_size * mp_shard_size must equal to world_size, got 1 * 2 != 8.");
    memset(&d, 0, sizeof(d));
    d.mp_replicate_size = 3;   /* inferred shard would not be an integer */
    assert_int_equal(dm_strategy_validate(&d, 8, sizes, err, sizeof(err)), DM_ERR_INVALID_ARG);
    assert_true(strlen(err) > 0);
    memset(&d, 0, sizeof(d));
    d.cp_size = -1;
    assert_int_equal(dm_strategy_validate(&d, 8, sizes, err, sizeof(err)), DM_ERR_INVALID_ARG);
    /* not distributed: every size forced to 1, whatever was asked */
    memset(&d, 0, sizeof(d));
    d.mp_replicate_size = 3;
    d.mp_shard_size = 3;
    d.dp_size = 5;
    d.cp_size = 7;
    assert_int_equal(dm_strategy_validate(&d, 1, sizes, err, sizeof(err)), DM_OK);
    assert_true(sizes[0] == 1 && sizes[1] == 1 && sizes[2] == 1 && sizes[3] == 1);
    assert_int_equal(dm_strategy_validate(NULL, 8, sizes, err, sizeof(err)), DM_ERR_INVALID_ARG);
    assert_int_equal(dm_strategy_validate(&d, 0, sizes, err, sizeof(err)), DM_ERR_INVALID_ARG);
    assert_string_equal(dm_dim_name(DM_DIM_MP_REPLICATE), "mp_replicate");
    assert_string_equal(dm_dim_name(DM_DIM_MP_SHARD), "mp_shard");
    assert_string_equal(dm_dim_name(DM_DIM_DP), "dp");
    assert_string_equal(dm_dim_name(DM_DIM_CP), "cp");
    assert_string_equal(dm_dim_name((dm_dim)9), "invalid");
}

/* Strategy on 8 real ranks: model mesh (mp_replicate 2 x mp_shard 4), data mesh (dp 4 x cp 2). */
static int rank_strategy(dm_collective* c, void* user) {
    dm_strategy_desc d;
    dm_strategy* s = NULL;
    int r = dm_rank(c), members[8], i;
    (void)user;
    memset(&d, 0, sizeof(d));
    d.world = c;
    d.mp_replicate_size = 2;
    d.cp_size = 2;
    RCALL(c, dm_strategy_create(&d, &s));
    RCHECK(dm_strategy_size(s, DM_DIM_MP_REPLICATE) == 2 && dm_strategy_size(s, DM_DIM_MP_SHARD) == 4);
    RCHECK(dm_strategy_size(s, DM_DIM_DP) == 4 && dm_strategy_size(s, DM_DIM_CP) == 2);
    RCHECK(strcmp(dm_strategy_last_error(s), "") == 0);
    RCHECK(dm_strategy_size(s, (dm_dim)7) == -1 && dm_strategy_rank(s, (dm_dim)7) == -1);
    RCHECK(dm_strategy_group(s, (dm_dim)7) == NULL);
    RCHECK(strcmp(dm_strategy_last_error(s), "dim must be specified.") == 0);
    RCHECK(dm_strategy_rank(s, DM_DIM_MP_REPLICATE) == r / 4 && dm_strategy_rank(s, DM_DIM_MP_SHARD) == r % 4);
    RCHECK(dm_strategy_rank(s, DM_DIM_DP) == r / 2 && dm_strategy_rank(s, DM_DIM_CP) == r % 2);
    RCHECK(dm_mesh_ndims(dm_strategy_model_mesh(s)) == 2 && dm_mesh_ndims(dm_strategy_data_mesh(s)) == 2);
    RCHECK(strcmp(dm_mesh_dim_name(dm_strategy_model_mesh(s), 0), "mp_replicate") == 0);
    RCHECK(strcmp(dm_mesh_dim_name(dm_strategy_data_mesh(s), 1), "cp") == 0);
    for (i = 0; i < 4; i++) members[i] = (r / 4) * 4 + i;
    check_group(dm_strategy_group(s, DM_DIM_MP_SHARD), r, members, 4);
    members[0] = r % 4; members[1] = r % 4 + 4;
    check_group(dm_strategy_group(s, DM_DIM_MP_REPLICATE), r, members, 2);
    for (i = 0; i < 4; i++) members[i] = r % 2 + 2 * i;
    check_group(dm_strategy_group(s, DM_DIM_DP), r, members, 4);
    members[0] = (r / 2) * 2; members[1] = (r / 2) * 2 + 1;
    check_group(dm_strategy_group(s, DM_DIM_CP), r, members, 2);
    dm_strategy_destroy(s);
    /* a bad strategy fails on every rank with the seed's message, before any communication */
    d.mp_replicate_size = 3;
    d.mp_shard_size = 3;
    s = (dm_strategy*)&d;
    RCHECK(dm_strategy_create(&d, &s) == DM_ERR_INVALID_ARG);
    RCHECK(s == NULL);
    RCHECK(strstr(dm_last_error(c), "mp_replicate_size * mp_shard_size must equal to world_size, got 3 * 3 != 8.") != NULL);
    d.mp_replicate_size = 0;
    d.mp_shard_size = 0;
    d.dp_size = 3;
    d.cp_size = 3;
    RCHECK(dm_strategy_create(&d, &s) == DM_ERR_INVALID_ARG);
    RCHECK(strstr(dm_last_error(c), "dp_size * cp_size must equal to world_size, got 3 * 3 != 8.") != NULL);
    return DM_OK;
}
static void test_strategy_on_8_ranks(void** state) { (void)state; run_ranks(8, rank_strategy, NULL); }

static void test_strategy_world1_forces_sizes_to_1(void** state) {
    dm_collective* c = make_fake(0, 0, false);       /* world_size 0: the default, 1 */
    dm_strategy_desc d;
    dm_strategy* s = NULL;
    int dim;
    float x = 2.5f;
    (void)state;
    memset(&d, 0, sizeof(d));
    d.world = c;
    d.mp_replicate_size = 2;
    d.dp_size = 4;
    assert_int_equal(dm_strategy_create(&d, &s), DM_OK);
    for (dim = 0; dim < DM_DIM_COUNT; dim++) {
        assert_int_equal(dm_strategy_size(s, (dm_dim)dim), 1);
        assert_int_equal(dm_strategy_rank(s, (dm_dim)dim), 0);
        assert_non_null(dm_strategy_group(s, (dm_dim)dim));
    }
    /* the seeds' default op: MEAN over dp, on one rank the data stays */
    assert_int_equal(dm_all_reduce(dm_strategy_group(s, DM_DIM_DP), NULL, &x, 1, DM_FLOAT32, DM_MEAN), DM_OK);
    assert_true(x == 2.5f);
    dm_strategy_destroy(s);
    dm_strategy_destroy(NULL);
    assert_int_equal(dm_strategy_create(NULL, &s), DM_ERR_INVALID_ARG);
    dm_destroy(c);
}

/* ---- every failure of a strategy / mesh call is recorded and logged ---- */
/* LLaMA-Factory raises ValueError("dim must be specified.") in get_device_mesh when dim is
   None (seed 002); C's "no dim" is a dm_dim outside the enum. Each of size, rank and group, on
   a fresh strategy (so the message can only come from that call), at world 1 and on a
   simulated member of 8, with the logger of the desc and, when the desc has none, the world's. */
static void test_strategy_dim_must_be_specified(void** state) {
    static const int bad[] = { -1, DM_DIM_COUNT, 7, 1000 };
    static const int worlds[][2] = { { 1, 0 }, { 8, 5 } };
    int w, b, call, logger_on_desc;
    (void)state;
    for (w = 0; w < 2; w++)
        for (logger_on_desc = 0; logger_on_desc < 2; logger_on_desc++)
            for (b = 0; b < (int)(sizeof(bad) / sizeof(bad[0])); b++)
                for (call = 0; call < 3; call++) {
                    dm_collective* c = make_fake(worlds[w][0], worlds[w][1], !logger_on_desc);
                    dm_strategy_desc d;
                    dm_strategy* s = NULL;
                    dm_dim dim = (dm_dim)bad[b];
                    int before;
                    memset(&d, 0, sizeof(d));
                    d.world = c;
                    if (logger_on_desc) { d.logger.func = capture_log; d.logger.user_data = &g_nlogged; }
                    assert_int_equal(dm_strategy_create(&d, &s), DM_OK);
                    assert_string_equal(dm_strategy_last_error(s), "");
                    log_reset();
                    before = g_nlogged;
                    if (call == 0) assert_int_equal(dm_strategy_size(s, dim), -1);
                    if (call == 1) assert_int_equal(dm_strategy_rank(s, dim), -1);
                    if (call == 2) assert_null(dm_strategy_group(s, dim));
                    assert_string_equal(dm_strategy_last_error(s), "dim must be specified.");
                    assert_logged(before, DM_ERR_INVALID_ARG, "dim must be specified.");
                    assert_string_equal(dm_last_error(c), "");   /* the strategy's, not the world's */
                    /* a later success leaves the message; the next failure writes it again */
                    assert_int_equal(dm_strategy_size(s, DM_DIM_DP), worlds[w][0]);
                    assert_int_equal(dm_strategy_rank(s, DM_DIM_MP_SHARD), worlds[w][1]);
                    assert_non_null(dm_strategy_group(s, DM_DIM_CP));
                    assert_string_equal(dm_strategy_last_error(s), "dim must be specified.");
                    assert_int_equal(g_nlogged, before + 1);
                    dm_strategy_destroy(s);
                    dm_destroy(c);
                }
    /* no logger anywhere: still recorded */
    {
        dm_collective* c = make_fake(2, 1, false);
        dm_strategy_desc d;
        dm_strategy* s = NULL;
        memset(&d, 0, sizeof(d));
        d.world = c;
        assert_int_equal(dm_strategy_create(&d, &s), DM_OK);
        assert_null(dm_strategy_group(s, (dm_dim)-1));
        assert_string_equal(dm_strategy_last_error(s), "dim must be specified.");
        dm_strategy_destroy(s);
        dm_destroy(c);
    }
    /* no strategy: -1 / NULL and a fixed text, nothing to record on */
    assert_int_equal(dm_strategy_size(NULL, DM_DIM_DP), -1);
    assert_int_equal(dm_strategy_rank(NULL, DM_DIM_DP), -1);
    assert_null(dm_strategy_group(NULL, DM_DIM_DP));
    assert_null(dm_strategy_model_mesh(NULL));
    assert_null(dm_strategy_data_mesh(NULL));
    assert_string_equal(dm_strategy_last_error(NULL), "no strategy (NULL)");
}

/* dm_strategy_create on c with these sizes (0: the default) is refused: DM_ERR_INVALID_ARG,
   *out NULL, msg as c's last error, and logged once (through c's logger). */
static void assert_sizes_refused(dm_collective* c, int mp_replicate, int mp_shard, int dp, int cp, const char* msg) {
    dm_strategy_desc d;
    dm_strategy* s;
    int before = g_nlogged;
    memset(&d, 0, sizeof(d));
    d.world = c;
    d.mp_replicate_size = mp_replicate; d.mp_shard_size = mp_shard;     /* the model mesh */
    d.dp_size = dp; d.cp_size = cp;                                      /* the data mesh */
    s = (dm_strategy*)&d;
    assert_int_equal(dm_strategy_create(&d, &s), DM_ERR_INVALID_ARG);
    assert_null(s);
    assert_string_equal(dm_last_error(c), msg);
    assert_logged(before, DM_ERR_INVALID_ARG, msg);
}

/* dm_strategy_create has no strategy to hold a failure: each one returns its status, leaves
   *out NULL, records the message on the world and logs it (desc's logger, else the world's). */
static void test_strategy_create_failures_reported(void** state) {
    dm_collective* c = make_fake(8, 3, true);
    dm_strategy_desc d;
    dm_strategy* s;
    int before;
    (void)state;
    log_reset();
    /* the seed's own ValueErrors, word for word */
    assert_sizes_refused(c, 3, 3, 0, 0, "mp_replicate_size * mp_shard_size must equal to world_size, got 3 * 3 != 8.");
    assert_sizes_refused(c, 0, 0, 2, 2, "dp_size * cp_size must equal to world_size, got 2 * 2 != 8.");
    /* departures: an inferred size must divide the world; negative sizes are refused */
    assert_sizes_refused(c, 3, 0, 0, 0, "world_size 8 is not divisible by mp_replicate_size 3.");
    assert_sizes_refused(c, 0, 0, 0, 3, "world_size 8 is not divisible by cp_size 3.");
    assert_sizes_refused(c, -2, -4, 0, 0,   /* the seed would pass -2 * -4 == 8 */
                         "mp_replicate_size and mp_shard_size must be >= 0 (0 = default), got -2 and -4.");
    /* the desc's logger wins over the world's */
    memset(&d, 0, sizeof(d));
    d.world = c;
    d.dp_size = 3;
    d.logger.func = capture_log;
    d.logger.user_data = &g_nlogged;
    before = g_nlogged;
    assert_int_equal(dm_strategy_create(&d, &s), DM_ERR_INVALID_ARG);
    assert_logged(before, DM_ERR_INVALID_ARG, "dp_size * cp_size must equal to world_size, got 3 * 1 != 8.");
    /* bad arguments */
    memset(&d, 0, sizeof(d));
    d.world = c;
    d.allocator.alloc_fn = counting_malloc;   /* free_fn missing */
    before = g_nlogged;
    assert_int_equal(dm_strategy_create(&d, &s), DM_ERR_INVALID_ARG);
    assert_non_null(strstr(dm_last_error(c), "strategy: allocator needs both"));
    assert_logged(before, DM_ERR_INVALID_ARG, dm_last_error(c));
    memset(&d, 0, sizeof(d));
    d.world = c;
    before = g_nlogged;
    assert_int_equal(dm_strategy_create(&d, NULL), DM_ERR_INVALID_ARG);
    assert_string_equal(dm_last_error(c), "strategy: out is NULL");
    assert_logged(before, DM_ERR_INVALID_ARG, "strategy: out is NULL");
    d.world = NULL;             /* nothing to record on: the desc's logger hears it */
    d.logger.func = capture_log;
    d.logger.user_data = &g_nlogged;
    s = (dm_strategy*)&d;
    before = g_nlogged;
    assert_int_equal(dm_strategy_create(&d, &s), DM_ERR_INVALID_ARG);
    assert_null(s);
    assert_logged(before, DM_ERR_INVALID_ARG, "strategy: world is NULL");
    s = (dm_strategy*)&d;
    assert_int_equal(dm_strategy_create(NULL, &s), DM_ERR_INVALID_ARG);
    assert_null(s);
    dm_destroy(c);
}

/* Out of memory at every allocation dm_strategy_create makes (the strategy, both meshes and
   their four sub-collectives): DM_ERR_OUT_OF_MEMORY with a message on the world, *out NULL,
   nothing leaked; then it succeeds. Sub-collectives use the world's allocator, so world and
   strategy share the counting one. */
static void test_strategy_create_out_of_memory(void** state) {
    counting_alloc ca = { 0, 0, -1 };
    dm_fake_desc fd = {0};
    dm_collective* c = NULL;
    dm_strategy_desc d;
    dm_strategy* s = NULL;
    int k, failures = 0;
    (void)state;
    fd.world_size = 8;
    fd.rank = 6;
    fd.allocator.alloc_fn = counting_malloc;
    fd.allocator.free_fn = counting_free;
    fd.allocator.user_data = &ca;
    fd.logger.func = capture_log;
    fd.logger.user_data = &g_nlogged;
    assert_int_equal(dm_fake_create(&fd, &c), DM_OK);
    memset(&d, 0, sizeof(d));
    d.world = c;
    d.mp_replicate_size = 2;
    d.cp_size = 4;
    d.allocator = fd.allocator;
    for (k = 0; k < 64; k++) {
        int live = ca.allocs - ca.frees, before;
        log_reset();
        before = g_nlogged;
        ca.fail_after = k;
        s = (dm_strategy*)&d;
        if (dm_strategy_create(&d, &s) == DM_OK) break;
        failures++;
        assert_null(s);
        assert_non_null(strstr(dm_last_error(c), "out of memory"));
        assert_true(g_nlogged > before);
        assert_int_equal(g_logged_st, DM_ERR_OUT_OF_MEMORY);
        assert_int_equal(ca.allocs - ca.frees, live);     /* nothing leaked */
    }
    ca.fail_after = -1;
    assert_non_null(s);
    assert_int_equal(failures, 7);  /* strategy, model mesh + 2 groups, data mesh + 2 groups */
    assert_int_equal(dm_strategy_size(s, DM_DIM_MP_SHARD), 4);
    assert_int_equal(dm_strategy_rank(s, DM_DIM_DP), 1);   /* rank 6 in (dp 2, cp 4) */
    assert_int_equal(dm_strategy_rank(s, DM_DIM_CP), 2);
    dm_strategy_destroy(s);
    dm_destroy(c);
    assert_int_equal(ca.allocs, ca.frees);
}

/* dm_strategy_validate: each failure's status and message in the caller's buffer. */
static void test_strategy_validate_failure_messages(void** state) {
    dm_strategy_desc d;
    int sizes[DM_DIM_COUNT];
    char err[256];
    (void)state;
    memset(&d, 0, sizeof(d));
    validate_refuses(NULL, 8, "strategy: desc is NULL");
    assert_int_equal(dm_strategy_validate(&d, 8, NULL, err, sizeof(err)), DM_ERR_INVALID_ARG);
    assert_string_equal(err, "strategy: out_sizes is NULL");
    validate_refuses(&d, 0, "strategy: world_size 0 must be >= 1");
    d.dp_size = -1;             /* refused even where world 1 would force it to 1 */
    validate_refuses(&d, 1, "dp_size and cp_size must be >= 0 (0 = default), got -1 and 0.");
    d.dp_size = 0;
    d.mp_shard_size = 3;
    validate_refuses(&d, 6, "mp_replicate_size * mp_shard_size must equal to world_size, got 1 * 3 != 6.");
    assert_int_equal(dm_strategy_validate(&d, 3, sizes, err, sizeof(err)), DM_OK);
    assert_string_equal(err, "");
    assert_int_equal(dm_strategy_validate(&d, 3, sizes, NULL, 0), DM_OK);
    assert_int_equal(dm_strategy_validate(&d, 6, sizes, NULL, 0), DM_ERR_INVALID_ARG);
    err[0] = 'x';               /* a one-byte buffer gets the empty prefix of the message */
    assert_int_equal(dm_strategy_validate(&d, 6, sizes, err, 1), DM_ERR_INVALID_ARG);
    assert_int_equal(err[0], 0);
}

/* Mesh queries that fail: -1 / NULL, a message on the mesh, logged. An empty name is "no dim"
   (the seed's message); NULL is the whole world for rank/size/group but no dim for dim_index. */
static void test_mesh_bad_dim_messages(void** state) {
    dm_collective* c = make_fake(8, 5, true);
    dm_mesh* m = NULL;
    int before;
    (void)state;
    log_reset();
    assert_int_equal(dm_mesh_create_dp_tp(c, 4, &m), DM_OK);
    assert_string_equal(dm_mesh_last_error(m), "");
    before = g_nlogged;
    assert_int_equal(dm_mesh_rank(m, ""), -1);
    assert_non_null(strstr(dm_mesh_last_error(m), "dim must be specified."));
    assert_logged(before, DM_ERR_INVALID_ARG, dm_mesh_last_error(m));
    assert_int_equal(dm_mesh_size(m, NULL), 8);         /* the world; leaves the message */
    assert_non_null(strstr(dm_mesh_last_error(m), "dim must be specified."));
    assert_int_equal(dm_mesh_group(m, "tp"), dm_mesh_tp_world(m));
    before = g_nlogged;
    assert_null(dm_mesh_group(m, "cp"));
    assert_string_equal(dm_mesh_last_error(m), "mesh: no dim named \"cp\" (dims: dp, tp)");
    assert_logged(before, DM_ERR_INVALID_ARG, dm_mesh_last_error(m));
    before = g_nlogged;
    assert_int_equal(dm_mesh_size(m, ""), -1);
    assert_non_null(strstr(dm_mesh_last_error(m), "dim must be specified."));
    assert_int_equal(g_nlogged, before + 1);
    before = g_nlogged;
    assert_null(dm_mesh_group(m, ""));
    assert_int_equal(g_nlogged, before + 1);
    before = g_nlogged;
    assert_null(dm_mesh_dim_name(m, 2));
    assert_string_equal(dm_mesh_last_error(m), "mesh: dim index 2 is not in 0..1");
    assert_logged(before, DM_ERR_INVALID_ARG, dm_mesh_last_error(m));
    assert_null(dm_mesh_dim_name(m, -1));
    assert_string_equal(dm_mesh_last_error(m), "mesh: dim index -1 is not in 0..1");
    before = g_nlogged;
    assert_int_equal(dm_mesh_dim_index(m, NULL), -1);
    assert_non_null(strstr(dm_mesh_last_error(m), "dim must be specified. (a NULL name"));
    assert_logged(before, DM_ERR_INVALID_ARG, dm_mesh_last_error(m));
    assert_int_equal(dm_mesh_dim_index(m, "pp"), -1);
    assert_string_equal(dm_mesh_last_error(m), "mesh: no dim named \"pp\" (dims: dp, tp)");
    assert_int_equal(dm_mesh_dim_index(m, "tp"), 1);
    dm_mesh_destroy(m);
    /* a mesh without dp/tp: the Optimus accessors' size 1 / rank 0 is no failure */
    {
        dm_mesh_desc d;
        memset(&d, 0, sizeof(d));
        d.world = c;
        d.ndims = 1;
        d.dim_names[0] = "ep";
        assert_int_equal(dm_mesh_create(&d, &m), DM_OK);
        before = g_nlogged;
        assert_int_equal(dm_mesh_dp_rank(m), 0);
        assert_int_equal(dm_mesh_dp_world_size(m), 1);
        assert_int_equal(dm_mesh_tp_rank(m), 0);
        assert_int_equal(dm_mesh_tp_world_size(m), 1);
        assert_string_equal(dm_mesh_last_error(m), "");
        assert_int_equal(g_nlogged, before);
        assert_null(dm_mesh_tp_world(m));                /* no group to hand out: a failure */
        assert_string_equal(dm_mesh_last_error(m), "mesh: no dim named \"tp\" (dims: ep)");
        dm_mesh_destroy(m);
    }
    /* a failed create is logged through the world's logger when the desc has none */
    before = g_nlogged;
    assert_int_equal(dm_mesh_create_dp_tp(c, 3, &m), DM_ERR_INVALID_ARG);
    assert_logged(before, DM_ERR_INVALID_ARG, dm_last_error(c));
    before = g_nlogged;
    assert_int_equal(dm_mesh_create_dp_tp(c, 4, NULL), DM_ERR_INVALID_ARG);
    assert_string_equal(dm_last_error(c), "mesh: out is NULL");
    assert_logged(before, DM_ERR_INVALID_ARG, "mesh: out is NULL");
    assert_int_equal(dm_mesh_dp_rank(NULL), -1);
    assert_int_equal(dm_mesh_tp_world_size(NULL), -1);
    assert_null(dm_mesh_dim_name(NULL, 0));
    assert_int_equal(dm_mesh_dim_index(NULL, "dp"), -1);
    assert_string_equal(dm_mesh_last_error(NULL), "no mesh (NULL)");
    dm_destroy(c);
}

/* ---- split: like MPI_Comm_split ---- */
static int rank_split(dm_collective* c, void* user) {
    int r = dm_rank(c), n = dm_world_size(c), i, k;
    dm_collective* s = NULL;
    int members[8], cnt = 0;
    (void)user;
    /* color r % 3 (ranks 0 and 6 opt out with DM_SPLIT_NONE), key reverses the order */
    int color = (r == 0 || r == 6) ? DM_SPLIT_NONE : r % 3;
    RCALL(c, dm_split(c, color, n - r, &s));
    if (color == DM_SPLIT_NONE) {
        RCHECK(s == NULL);
    } else {
        for (i = n - 1; i >= 0; i--)   /* descending old rank = ascending key */
            if (i != 0 && i != 6 && i % 3 == color) members[cnt++] = i;
        check_group(s, r, members, cnt);
        dm_destroy(s);
    }
    /* equal keys: ordered by old rank; one color for everyone = a copy of the world */
    RCALL(c, dm_split(c, 7, 0, &s));
    for (i = 0; i < n; i++) members[i] = i;
    check_group(s, r, members, n);
    /* a split of the split still works */
    {
        dm_collective* s2 = NULL;
        RCALL(s, dm_split(s, dm_rank(s) / 4, -dm_rank(s), &s2));
        cnt = 0;
        for (k = 0; k < n; k++) if (k / 4 == r / 4) members[cnt++] = k;
        for (i = 0; i < cnt / 2; i++) { int tmp = members[i]; members[i] = members[cnt - 1 - i]; members[cnt - 1 - i] = tmp; }
        check_group(s2, r, members, cnt);
        dm_destroy(s2);
    }
    dm_destroy(s);
    RCHECK(dm_split(c, -5, 0, &s) == DM_ERR_INVALID_ARG);
    return DM_OK;
}
static void test_split_like_mpi_comm_split(void** state) { (void)state; run_ranks(8, rank_split, NULL); }

/* ---- dm_local and main_process_first ---- */
static atomic_int g_phase_done[8];
static atomic_int g_order_errors;
static int rank_main_first(dm_collective* c, void* user) {
    int r = dm_rank(c), lsize = 3, node_first = (r / 3) * 3, k;
    dm_collective* l = dm_local(c);
    (void)user;
    RCHECK(l != NULL);
    if (!l) return DM_ERR_INTERNAL;
    RCHECK(dm_local(c) == l);
    if (node_first == 6) lsize = 2;
    RCHECK(dm_world_size(l) == lsize && dm_rank(l) == r - node_first);
    RCHECK(dm_local_rank(c) == r - node_first && dm_local_world_size(c) == lsize);
    /* global: rank 0 works first, everyone else only after rank 0's end */
    RCALL(c, dm_main_process_first_begin(c, false));
    if (r != 0 && !atomic_load(&g_phase_done[0])) atomic_fetch_add(&g_order_errors, 1);
    if (r == 0) {
        struct timespec ts = { 0, 20000000 };
        nanosleep(&ts, NULL);
        atomic_store(&g_phase_done[0], 1);
    }
    RCALL(c, dm_main_process_first_end(c, false));
    RCALL(c, dm_barrier(c));
    /* local: each node's local master first */
    RCALL(c, dm_main_process_first_begin(c, true));
    if (r != node_first && !atomic_load(&g_phase_done[node_first == 0 ? 1 : node_first])) atomic_fetch_add(&g_order_errors, 1);
    if (r == node_first) {
        struct timespec ts = { 0, 10000000 };
        nanosleep(&ts, NULL);
        atomic_store(&g_phase_done[node_first == 0 ? 1 : node_first], 1);
    }
    RCALL(c, dm_main_process_first_end(c, true));
    for (k = 0; k < 2; k++) RCALL(c, dm_barrier(c));
    return DM_OK;
}
static void test_local_group_and_main_process_first(void** state) {
    dm_fake_desc d = {0};
    int i;
    (void)state;
    for (i = 0; i < 8; i++) atomic_store(&g_phase_done[i], 0);
    atomic_store(&g_order_errors, 0);
    atomic_store(&g_failures, 0);
    d.world_size = 8;
    d.local_world_size = 3;   /* nodes {0,1,2} {3,4,5} {6,7} */
    d.timeout_ms = 30000;
    assert_int_equal(dm_thread_world_run(&d, rank_main_first, NULL), DM_OK);
    if (atomic_load(&g_failures)) fail_msg("first: %s", g_first_failure);
    assert_int_equal(atomic_load(&g_order_errors), 0);
}

DM_TEST_MAIN(NULL, NULL,
    cmocka_unit_test(test_mesh_dp2_tp4_on_8_ranks),
    cmocka_unit_test(test_mesh_2x2x2_on_8_ranks),
    cmocka_unit_test(test_mesh_validation_messages),
    cmocka_unit_test(test_strategy_defaults_and_seed_messages),
    cmocka_unit_test(test_strategy_on_8_ranks),
    cmocka_unit_test(test_strategy_world1_forces_sizes_to_1),
    cmocka_unit_test(test_strategy_dim_must_be_specified),
    cmocka_unit_test(test_strategy_create_failures_reported),
    cmocka_unit_test(test_strategy_create_out_of_memory),
    cmocka_unit_test(test_strategy_validate_failure_messages),
    cmocka_unit_test(test_mesh_bad_dim_messages),
    cmocka_unit_test(test_split_like_mpi_comm_split),
    cmocka_unit_test(test_local_group_and_main_process_first))
