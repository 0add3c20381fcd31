/* test_env: dm_env_detect with setenv/unsetenv (torchrun, OpenMPI, PMI, Slurm, DISTMESH_*
   overrides and their precedence, malformed values), DISTMESH_TIMEOUT, and dm_init without a
   transport. Every test starts from an environment with none of the variables set. */
#define _POSIX_C_SOURCE 200809L /* setenv, unsetenv */
#include "distmesh.h"
#include "prelude.h"
#include <time.h>

static const char* const g_vars[] = {
    "DISTMESH_RANK", "DISTMESH_WORLD_SIZE", "DISTMESH_LOCAL_RANK", "DISTMESH_LOCAL_WORLD_SIZE",
    "DISTMESH_TIMEOUT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
    "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE", "SLURM_NODEID",
};
static int clean_env(void** state) {
    size_t i;
    (void)state;
    for (i = 0; i < sizeof(g_vars) / sizeof(g_vars[0]); i++) unsetenv(g_vars[i]);
    return 0;
}
static void set(const char* k, const char* v) { assert_int_equal(setenv(k, v, 1), 0); }
static dm_env detect_ok(void) {
    dm_env e;
    dm_status st = dm_env_detect(&e);
    if (st != DM_OK) fail_msg("dm_env_detect: %s: %s", dm_status_name(st), e.error);
    return e;
}
/* detect_ok in an environment of only the name/value pairs given (the list ends with NULL). */
static dm_env detect_only(const char* name, ...) {
    const char* k;
    va_list ap;
    clean_env(NULL);
    va_start(ap, name);
    for (k = name; k != NULL; k = va_arg(ap, const char*)) set(k, va_arg(ap, const char*));
    va_end(ap);
    return detect_ok();
}
/* Fails with DM_ERR_ENV and a message naming `var`. */
static void detect_fails_naming(const char* var) {
    dm_env e;
    assert_int_equal(dm_env_detect(&e), DM_ERR_ENV);
    if (!strstr(e.error, var)) fail_msg("message \"%s\" does not name %s", e.error, var);
}

/* Every field e has on every launcher, one assert each. */
static void assert_env(const dm_env* e, int rank, int world, int local_rank, int local_world, bool distributed,
                       const char* source, const char* master_addr, int master_port) {
    assert_int_equal(e->rank, rank);
    assert_int_equal(e->world_size, world);
    assert_int_equal(e->local_rank, local_rank);
    assert_int_equal(e->local_world_size, local_world);
    assert_int_equal(e->is_distributed, distributed);
    assert_string_equal(e->source, source);
    assert_string_equal(e->master_addr, master_addr);
    assert_int_equal(e->master_port, master_port);
}

static void test_env_nothing_set_is_rank0_of_1(void** state) {
    dm_env e;
    (void)state;
    e = detect_ok();
    assert_env(&e, 0, 1, 0, 1, false, "default", "", 0);
    assert_int_equal(e.timeout_ms, 0);
    assert_int_equal(dm_env_detect(NULL), DM_ERR_INVALID_ARG);
}

static void test_env_torchrun(void** state) {
    dm_env e;
    (void)state;
    set("RANK", "5"); set("WORLD_SIZE", "8"); set("LOCAL_RANK", "1"); set("LOCAL_WORLD_SIZE", "4");
    set("MASTER_ADDR", "10.1.2.3"); set("MASTER_PORT", "29500");
    e = detect_ok();
    assert_env(&e, 5, 8, 1, 4, true, "torchrun", "10.1.2.3", 29500);
    /* without local variables the world is one node */
    unsetenv("LOCAL_RANK");
    unsetenv("LOCAL_WORLD_SIZE");
    e = detect_ok();
    assert_int_equal(e.local_rank, 5);
    assert_int_equal(e.local_world_size, 8);
}

static void test_env_openmpi_pmi_slurm(void** state) {
    dm_env e;
    (void)state;
    set("OMPI_COMM_WORLD_RANK", "3"); set("OMPI_COMM_WORLD_SIZE", "4");
    set("OMPI_COMM_WORLD_LOCAL_RANK", "1"); set("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
    e = detect_ok();
    assert_string_equal(e.source, "openmpi");
    assert_true(e.rank == 3 && e.world_size == 4 && e.local_rank == 1 && e.local_world_size == 2);
    e = detect_only("PMI_RANK", "2", "PMI_SIZE", "6", "MPI_LOCALRANKID", "0", "MPI_LOCALNRANKS", "3", NULL);
    assert_string_equal(e.source, "pmi");
    assert_true(e.rank == 2 && e.world_size == 6 && e.local_rank == 0 && e.local_world_size == 3);
    e = detect_only("SLURM_PROCID", "6", "SLURM_NTASKS", "8", "SLURM_LOCALID", "2",
                    "SLURM_NTASKS_PER_NODE", "4", NULL);
    assert_string_equal(e.source, "slurm");
    assert_true(e.rank == 6 && e.world_size == 8 && e.local_rank == 2 && e.local_world_size == 4);
}

static void test_env_slurm_tasks_per_node_forms(void** state) {
    static const struct { const char* spec; const char* node; int want; } ok[] = {
        { "4(x2)", "0", 4 }, { "4(x2)", "1", 4 }, { "4(x2),3", "2", 3 }, { "2,3", "1", 3 },
        { "2,3", NULL, 2 }, { "5", NULL, 5 }, { "1(x3),6(x2)", "4", 6 },
    };
    static const char* const bad[] = { "4(x", "4(y2)", "abc", "", "4(x0)", "0", "4,", "4(x2)3", "-2" };
    size_t i;
    dm_env e;
    (void)state;
    set("SLURM_PROCID", "0"); set("SLURM_NTASKS", "12"); set("SLURM_LOCALID", "0");
    for (i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        set("SLURM_TASKS_PER_NODE", ok[i].spec);
        if (ok[i].node) set("SLURM_NODEID", ok[i].node); else unsetenv("SLURM_NODEID");
        e = detect_ok();
        if (e.local_world_size != ok[i].want)
            fail_msg("SLURM_TASKS_PER_NODE=%s node %s: local size %d, want %d", ok[i].spec,
                     ok[i].node ? ok[i].node : "-", e.local_world_size, ok[i].want);
    }
    /* SLURM_NTASKS_PER_NODE wins over SLURM_TASKS_PER_NODE */
    set("SLURM_NTASKS_PER_NODE", "3");
    set("SLURM_TASKS_PER_NODE", "4(x3)");
    e = detect_ok();
    assert_int_equal(e.local_world_size, 3);
    unsetenv("SLURM_NTASKS_PER_NODE");
    unsetenv("SLURM_NODEID");
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        set("SLURM_TASKS_PER_NODE", bad[i]);
        if (dm_env_detect(&e) != DM_ERR_ENV) fail_msg("SLURM_TASKS_PER_NODE=\"%s\" accepted", bad[i]);
        if (!strstr(e.error, "SLURM_TASKS_PER_NODE")) fail_msg("message \"%s\"", e.error);
    }
    set("SLURM_TASKS_PER_NODE", "4(x2)");
    set("SLURM_NODEID", "2");          /* no node 2 */
    detect_fails_naming("SLURM_TASKS_PER_NODE");
}

/* DISTMESH_* first, then torchrun, OpenMPI, PMI, Slurm; each source's local variables only with
   its own rank variables. */
static void test_env_precedence_and_overrides(void** state) {
    dm_env e;
    (void)state;
    set("SLURM_PROCID", "1"); set("SLURM_NTASKS", "16");
    set("PMI_RANK", "2"); set("PMI_SIZE", "12");
    set("OMPI_COMM_WORLD_RANK", "3"); set("OMPI_COMM_WORLD_SIZE", "10");
    set("OMPI_COMM_WORLD_LOCAL_RANK", "1"); set("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
    e = detect_ok();
    assert_string_equal(e.source, "openmpi");
    assert_int_equal(e.rank, 3);
    set("RANK", "4"); set("WORLD_SIZE", "8");
    e = detect_ok();
    assert_string_equal(e.source, "torchrun");
    assert_true(e.rank == 4 && e.world_size == 8);
    assert_true(e.local_rank == 4 && e.local_world_size == 8);  /* not OpenMPI's local values */
    set("DISTMESH_RANK", "6");
    e = detect_ok();
    assert_string_equal(e.source, "distmesh");
    assert_true(e.rank == 6 && e.world_size == 8);
    set("DISTMESH_WORLD_SIZE", "7"); set("DISTMESH_LOCAL_RANK", "2"); set("DISTMESH_LOCAL_WORLD_SIZE", "3");
    e = detect_ok();
    assert_true(e.rank == 6 && e.world_size == 7 && e.local_rank == 2 && e.local_world_size == 3);
    e = detect_only("DISTMESH_RANK", "1", "DISTMESH_WORLD_SIZE", "2", NULL);
    assert_string_equal(e.source, "distmesh");
    assert_true(e.rank == 1 && e.world_size == 2 && e.is_distributed);
    e = detect_only("PMI_RANK", "2", "PMI_SIZE", "12", "SLURM_PROCID", "1", "SLURM_NTASKS", "16", NULL);
    assert_string_equal(e.source, "pmi");
}

static void test_env_malformed_values(void** state) {
    static const char* const bad[] = { "abc", "-1", "", "99999999999", "3x", "1.5", "0x10" };
    static const char* const names[][2] = {
        { "RANK", "WORLD_SIZE" }, { "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE" },
        { "PMI_RANK", "PMI_SIZE" }, { "SLURM_PROCID", "SLURM_NTASKS" },
        { "DISTMESH_RANK", "DISTMESH_WORLD_SIZE" },
    };
    size_t s, i, which;
    (void)state;
    for (s = 0; s < sizeof(names) / sizeof(names[0]); s++)
        for (which = 0; which < 2; which++)
            for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                clean_env(NULL);
                set(names[s][0], "1");
                set(names[s][1], "4");
                set(names[s][which], bad[i]);
                detect_fails_naming(names[s][which]);
            }
    clean_env(NULL);
    set("RANK", "1"); set("WORLD_SIZE", "0");
    detect_fails_naming("WORLD_SIZE");
    set("WORLD_SIZE", "4"); set("LOCAL_RANK", "x");
    detect_fails_naming("LOCAL_RANK");
    set("LOCAL_RANK", "0"); set("LOCAL_WORLD_SIZE", "-3");
    detect_fails_naming("LOCAL_WORLD_SIZE");
    clean_env(NULL);
    set("RANK", "1");                       /* half a pair */
    detect_fails_naming("WORLD_SIZE");
    clean_env(NULL);
    set("WORLD_SIZE", "4");
    detect_fails_naming("RANK");
}

/* rank >= world size and local rank >= local size are errors naming the variables. */
static void test_env_rank_not_below_world(void** state) {
    dm_env e;
    (void)state;
    set("RANK", "4"); set("WORLD_SIZE", "4");
    assert_int_equal(dm_env_detect(&e), DM_ERR_ENV);
    assert_true(strlen(e.error) > 0);
    if (!strstr(e.error, "RANK") || !strstr(e.error, "WORLD_SIZE"))
        fail_msg("message \"%s\" does not name RANK and WORLD_SIZE", e.error);
    set("RANK", "1"); set("LOCAL_RANK", "2"); set("LOCAL_WORLD_SIZE", "2");
    assert_int_equal(dm_env_detect(&e), DM_ERR_ENV);
    if (!strstr(e.error, "LOCAL_RANK")) fail_msg("message \"%s\" does not name LOCAL_RANK", e.error);
    set("LOCAL_RANK", "0"); set("LOCAL_WORLD_SIZE", "5");   /* more local ranks than ranks */
    assert_int_equal(dm_env_detect(&e), DM_ERR_ENV);
    clean_env(NULL);
    set("DISTMESH_RANK", "3"); set("DISTMESH_WORLD_SIZE", "2");
    assert_int_equal(dm_env_detect(&e), DM_ERR_ENV);
    if (!strstr(e.error, "DISTMESH_RANK")) fail_msg("message \"%s\" does not name DISTMESH_RANK", e.error);
}

static void test_env_master_addr_and_port(void** state) {
    static const char* const bad_ports[] = { "abc", "0", "70000", "-5", "", "80x" };
    size_t i;
    dm_env e;
    char long_addr[300];
    (void)state;
    for (i = 0; i < sizeof(bad_ports) / sizeof(bad_ports[0]); i++) {
        set("MASTER_PORT", bad_ports[i]);
        detect_fails_naming("MASTER_PORT");
    }
    set("MASTER_PORT", "65535");
    e = detect_ok();
    assert_int_equal(e.master_port, 65535);
    set("MASTER_ADDR", "");
    detect_fails_naming("MASTER_ADDR");
    memset(long_addr, 'a', sizeof(long_addr) - 1);
    long_addr[sizeof(long_addr) - 1] = 0;
    set("MASTER_ADDR", long_addr);
    detect_fails_naming("MASTER_ADDR");
    set("MASTER_ADDR", "::1");
    e = detect_ok();
    assert_string_equal(e.master_addr, "::1");
}

static void test_env_distmesh_timeout(void** state) {
    static const struct { const char* v; int ms; } ok[] = {
        { "30", 30000 }, { "1.5", 1500 }, { "0.25", 250 }, { "-1", -1 }, { "18000", 18000000 },
        { "0.0001", 1 },
    };
    static const char* const bad[] = { "abc", "", "1s", "nan", "1e12", "--1" };
    size_t i;
    dm_env e;
    (void)state;
    for (i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        set("DISTMESH_TIMEOUT", ok[i].v);
        e = detect_ok();
        if (e.timeout_ms != ok[i].ms) fail_msg("DISTMESH_TIMEOUT=%s -> %d ms, want %d", ok[i].v, e.timeout_ms, ok[i].ms);
    }
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        set("DISTMESH_TIMEOUT", bad[i]);
        detect_fails_naming("DISTMESH_TIMEOUT");
    }
}

/* DISTMESH_TIMEOUT is the default deadline of a collective whose desc leaves timeout_ms 0. */
static int rank_skip(dm_collective* c, void* user) {
    float x = 1;
    (void)user;
    if (dm_rank(c) == 1) return DM_OK;
    return dm_all_reduce(c, NULL, &x, 1, DM_FLOAT32, DM_SUM);
}
static void test_env_timeout_is_the_default_deadline(void** state) {
    dm_fake_desc d = {0};
    struct timespec t0, t1;
    double secs;
    (void)state;
    set("DISTMESH_TIMEOUT", "0.3");
    d.world_size = 2;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(dm_thread_world_run(&d, rank_skip, NULL), DM_ERR_TIMEOUT);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    assert_true(secs >= 0.25 && secs < 20.0);
}

/* Without DISTMESH_TCP, dm_init gives a world-1 Fake, and refuses a multi-rank environment. */
static void test_env_init_without_transport(void** state) {
    dm_collective* c = NULL;
    dm_init_desc d;
    (void)state;
    memset(&d, 0, sizeof(d));
    assert_int_equal(dm_init(&d, &c), DM_OK);
    assert_non_null(c);
    assert_int_equal(dm_world_size(c), 1);
    assert_string_equal(dm_backend_name(c), "fake");
    dm_destroy(c);
    assert_int_equal(dm_init(NULL, &c), DM_OK);
    dm_destroy(c);
    set("RANK", "0"); set("WORLD_SIZE", "2");
    c = (dm_collective*)&d;
    assert_int_equal(dm_init(&d, &c), DM_ERR_UNSUPPORTED);
    assert_null(c);
    set("WORLD_SIZE", "abc");
    assert_int_equal(dm_init(&d, &c), DM_ERR_ENV);
    assert_null(c);
    assert_int_equal(dm_init(&d, NULL), DM_ERR_INVALID_ARG);
    assert_int_equal(dm_device_count(), 0);
}

/* local_from_launcher: both local variables of the source used (or both DISTMESH_LOCAL_*). */
static void test_env_local_from_launcher(void** state) {
    dm_env e;
    (void)state;
    set("RANK", "1"); set("WORLD_SIZE", "4");
    e = detect_ok();
    assert_false(e.local_from_launcher);
    assert_int_equal(e.local_rank, 1);
    set("LOCAL_RANK", "1"); set("LOCAL_WORLD_SIZE", "2");
    e = detect_ok();
    assert_true(e.local_from_launcher);
    e = detect_only("OMPI_COMM_WORLD_RANK", "3", "OMPI_COMM_WORLD_SIZE", "4",
                    "OMPI_COMM_WORLD_LOCAL_RANK", "1", "OMPI_COMM_WORLD_LOCAL_SIZE", "2", NULL);
    assert_true(e.local_from_launcher);
    assert_int_equal(e.local_world_size, 2);
    e = detect_only("SLURM_PROCID", "3", "SLURM_NTASKS", "4", "SLURM_LOCALID", "1",
                    "SLURM_TASKS_PER_NODE", "2(x2)", "SLURM_NODEID", "1", NULL);
    assert_true(e.local_from_launcher);
    e = detect_only("DISTMESH_RANK", "0", "DISTMESH_WORLD_SIZE", "2",
                    "DISTMESH_LOCAL_RANK", "0", "DISTMESH_LOCAL_WORLD_SIZE", "1", NULL);
    assert_true(e.local_from_launcher);
}

#define T(f) cmocka_unit_test_setup_teardown(f, clean_env, clean_env)
DM_TEST_MAIN(NULL, NULL,
    T(test_env_nothing_set_is_rank0_of_1),
    T(test_env_torchrun),
    T(test_env_openmpi_pmi_slurm),
    T(test_env_slurm_tasks_per_node_forms),
    T(test_env_precedence_and_overrides),
    T(test_env_malformed_values),
    T(test_env_rank_not_below_world),
    T(test_env_master_addr_and_port),
    T(test_env_distmesh_timeout),
    T(test_env_timeout_is_the_default_deadline),
    T(test_env_init_without_transport),
    T(test_env_local_from_launcher))
