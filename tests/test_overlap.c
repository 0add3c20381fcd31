/* Communication overlapped with computation: runs the built examples/ddp_overlap (DM_DDP) and
   bench/dm_overlap (DM_OVERLAP_BENCH) as children under `timeout`, small sizes (a few seconds
   in all).
   - ddp_overlap on 2 threads and on 2 processes (RANK / WORLD_SIZE, file store): the loss goes
     down and every rank ends with the same weights;
   - with and without overlap the weights end as the same bytes (async all-reduces of buckets
     give what blocking ones give);
   - dm_overlap runs on 2 ranks over shared memory and TCP, finds no wrong value, and prints its
     table and a JSON line with every time and the hidden fraction. Timings are not judged
     here: they depend on the machine's free cores (see `make bench-overlap`). */
#define _GNU_SOURCE
#include "prelude.h"
#include <sys/wait.h>
#include <unistd.h>
#include "test_world.h"

#ifndef DM_DDP
#define DM_DDP "build/plain/examples/ddp_overlap"
#endif
#ifndef DM_OVERLAP_BENCH
#define DM_OVERLAP_BENCH "build/plain/bench/dm_overlap"
#endif

static char g_dir[64];
static char g_out[1 << 16], g_out1[1 << 16];

/* The file g_dir/name into buf. */
static void slurp(const char* name, char* buf, size_t cap) {
    char path[128];
    snprintf(path, sizeof(path), "%s/%s", g_dir, name);
    tw_read_file(path, buf, cap);
}

/* Runs a shell command (printf-style) under a 60 s timeout; its stdout+stderr land in g_out.
   Returns the exit status. */
static int sh(const char* fmt, ...) {
    char line[1024];
    TW_VFORMAT(line, fmt);
    return tw_run_cmd(60, g_out, sizeof(g_out), line);
}

static int setup(void** state) { (void)state; return tmpdir_make(g_dir, sizeof(g_dir), "dm_overlaptest"); }
static int teardown(void** state) { (void)state; return tmpdir_remove(g_dir); }

#define SMALL "--steps 20 --hidden 96 --layers 3 --bucket-mb 0.03"

/* The "hash min X max Y" of ddp_overlap's output, X == Y asserted; returns X. */
static unsigned long long final_hash(const char* out) {
    const char* p = strstr(out, "hash min ");
    unsigned long long lo = 0, hi = 1;
    assert_non_null(p);
    assert_int_equal(sscanf(p, "hash min %llx max %llx", &lo, &hi), 2);
    assert_true(lo == hi);
    return lo;
}

static void test_ddp_overlap_threads(void** state) {
    int rc;
    (void)state;
    rc = sh("env -u RANK -u WORLD_SIZE %s " SMALL, DM_DDP);
    if (rc != 0) fprintf(stderr, "%s", g_out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(g_out, "2 ranks (thread backend"));
    assert_non_null(strstr(g_out, "buckets all-reduced during backward"));
    assert_non_null(strstr(g_out, "weights identical on all 2 ranks"));
    assert_non_null(strstr(g_out, ": down"));
    final_hash(g_out);
}

/* The buckets are several (the point of the example) and cover every layer once. */
static void test_ddp_overlap_buckets(void** state) {
    const char* p;
    int n = 0;
    (void)state;
    assert_int_equal(sh("env -u RANK -u WORLD_SIZE %s " SMALL " --steps 1 --bucket-mb 0.0001", DM_DDP), 1);
    /* buckets of ~100 bytes: one per layer. One step: the loss has no time to go down (exit
       1), but the layout line comes first. */
    p = strstr(g_out, "4 buckets (backward order): [layers 3..3:");
    if (!p) fprintf(stderr, "%s", g_out);
    assert_non_null(p);
    for (p = g_out; (p = strstr(p, "[layers ")) != NULL; p++) n++;
    assert_int_equal(n, 4);
}

static void test_ddp_overlap_processes(void** state) {
    int rc;
    (void)state;
    /* two ranks placed like torchrun's, meeting in a file store */
    rc = sh("sh -c 'for r in 0 1; do RANK=$r WORLD_SIZE=2 DISTMESH_STORE=file://%s/store %s " SMALL
            " > %s/rank$r 2>&1 & eval p$r=$!; done; wait $p0 && wait $p1'", g_dir, DM_DDP, g_dir);
    slurp("rank0", g_out, sizeof(g_out));
    slurp("rank1", g_out1, sizeof(g_out1));
    if (rc != 0) fprintf(stderr, "rank 0:\n%s\nrank 1:\n%s", g_out, g_out1);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(g_out, "2 ranks (tcp backend"));
    assert_non_null(strstr(g_out, "weights identical on all 2 ranks"));
    assert_non_null(strstr(g_out, ": down"));
    final_hash(g_out);
}

/* Overlap changes when the all-reduces run, not what they compute. */
static void test_ddp_overlap_same_weights_as_blocking(void** state) {
    unsigned long long a, b;
    (void)state;
    assert_int_equal(sh("env -u RANK -u WORLD_SIZE %s " SMALL, DM_DDP), 0);
    a = final_hash(g_out);
    assert_int_equal(sh("env -u RANK -u WORLD_SIZE %s " SMALL " --no-overlap", DM_DDP), 0);
    assert_non_null(strstr(g_out, "no overlap"));
    b = final_hash(g_out);
    assert_true(a == b);
}

static void check_bench_output(const char* transport) {
    static const char* const keys[] = { "\"t_comm_ms\":", "\"t_async_ms\":", "\"t_comp_ms\":",
                                        "\"t_serial_ms\":", "\"t_overlap_ms\":", "\"hidden_fraction\":" };
    char want[64];
    const char* json = strstr(g_out, "\n{\"bench\":\"dm_overlap\"");
    size_t i;
    assert_non_null(strstr(g_out, "# wrong values: 0"));
    assert_non_null(json);
    snprintf(want, sizeof(want), "\"transport\":\"%s\"", transport);
    assert_non_null(strstr(json, want));
    for (i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) assert_non_null(strstr(json, keys[i]));
}

static void test_bench_overlap_shm_and_tcp(void** state) {
    int rc;
    (void)state;
    rc = sh("env DISTMESH_TRANSPORT=shm %s --bytes 1M --reps 3 --warmup 1 --timeout 40 --json %s/o.json",
            DM_OVERLAP_BENCH, g_dir);
    if (rc != 0) fprintf(stderr, "%s", g_out);
    assert_int_equal(rc, 0);
    check_bench_output("shm");
    slurp("o.json", g_out1, sizeof(g_out1));
    assert_true(strncmp(g_out1, "{\"bench\":\"dm_overlap\"", 21) == 0);
    rc = sh("%s --transport tcp --compute sleep --bytes 1M --reps 3 --warmup 1 --timeout 40", DM_OVERLAP_BENCH);
    if (rc != 0) fprintf(stderr, "%s", g_out);
    assert_int_equal(rc, 0);
    check_bench_output("tcp");
    assert_non_null(strstr(g_out, "\"compute\":\"sleep\""));
}

static void test_bench_overlap_bad_args(void** state) {
    (void)state;
    assert_int_equal(sh("%s --compute nope", DM_OVERLAP_BENCH), 2);
    assert_int_equal(sh("%s --bytes 0", DM_OVERLAP_BENCH), 2);
}

DM_TEST_MAIN(NULL, NULL,
    cmocka_unit_test_setup_teardown(test_ddp_overlap_threads, setup, teardown),
    cmocka_unit_test_setup_teardown(test_ddp_overlap_buckets, setup, teardown),
    cmocka_unit_test_setup_teardown(test_ddp_overlap_processes, setup, teardown),
    cmocka_unit_test_setup_teardown(test_ddp_overlap_same_weights_as_blocking, setup, teardown),
    cmocka_unit_test_setup_teardown(test_bench_overlap_shm_and_tcp, setup, teardown),
    cmocka_unit_test_setup_teardown(test_bench_overlap_bad_args, setup, teardown))
