/* A build with DISTMESH_NO_TRACE (distmesh_trace.h >>trace hooks): the recorder left out (only
   the hooks' empty stand-ins of distmesh_trace.h compiled), the
   collectives still run (the Fake world of one, the threaded world of 3 over its memory links:
   the engine's hook sites compiled away), dm_flight_recorder_dump answers DM_ERR_UNSUPPORTED
   with a message, and DISTMESH_TRACE / DISTMESH_FLIGHT_RECORDER / DISTMESH_DUMP_DIR write
   nothing. Its own TU with the implementation: no other object is linked. */
#define _GNU_SOURCE
#define DISTMESH_IMPLEMENTATION
#define DISTMESH_NO_TRACE
#include "distmesh.h"
#include "prelude.h"
#include "test_world.h"

#if defined(_DM_TR_FLUSH_BYTES)
#error "DISTMESH_NO_TRACE: distmesh_trace.h's recorder (>>trace) must be left out"
#endif

static char g_dir[256];
TMPDIR_FIXTURES(g_dir, "dm_notrace")

/* Each rank: an all_reduce of 1000 floats over the ring, one of 3 over recursive doubling, a
   broadcast and a barrier; the dump is refused on every rank. */
static int rank_body(dm_collective* c, void* user) {
    float big[1000], small[3] = { 1.0f, 2.0f, 3.0f };
    int i, r = dm_rank(c), bad = 0;
    (void)user;
    for (i = 0; i < 1000; i++) big[i] = (float)(r + i);
    if (dm_all_reduce(c, NULL, big, 1000, DM_FLOAT32, DM_SUM) != DM_OK) return DM_ERR_INTERNAL;
    for (i = 0; i < 1000; i++) bad |= big[i] != (float)(3 * i + 3);
    if (dm_all_reduce(c, NULL, small, 3, DM_FLOAT32, DM_MAX) != DM_OK) return DM_ERR_INTERNAL;
    bad |= small[0] != 1.0f || small[2] != 3.0f;
    small[0] = r == 1 ? 42.0f : 0.0f;
    if (dm_broadcast(c, small, 1, DM_FLOAT32, 1) != DM_OK || dm_barrier(c) != DM_OK) return DM_ERR_INTERNAL;
    bad |= small[0] != 42.0f;
    bad |= dm_flight_recorder_dump(c, NULL) != DM_ERR_UNSUPPORTED;
    return bad ? DM_ERR_INTERNAL : DM_OK;
}

static void test_notrace_thread_world_runs_collectives(void** state) {
    dm_fake_desc d = {0};
    (void)state;
    setenv("DISTMESH_TRACE", g_dir, 1);
    setenv("DISTMESH_FLIGHT_RECORDER", "64", 1);
    setenv("DISTMESH_DUMP_DIR", g_dir, 1);
    d.world_size = 3;
    d.timeout_ms = 20000;
    assert_int_equal(dm_thread_world_run(&d, rank_body, NULL), DM_OK);
    assert_int_equal(tw_count_entries(g_dir), 0);
    unsetenv("DISTMESH_TRACE");
    unsetenv("DISTMESH_FLIGHT_RECORDER");
    unsetenv("DISTMESH_DUMP_DIR");
}

static void test_notrace_dump_is_unsupported(void** state) {
    dm_fake_desc d = {0};
    dm_collective* c = NULL;
    float x[2] = { 1.0f, 2.0f };
    (void)state;
    assert_int_equal(dm_flight_recorder_dump(NULL, NULL), DM_ERR_INVALID_ARG);
    assert_int_equal(dm_fake_create(&d, &c), DM_OK);
    assert_int_equal(dm_all_reduce(c, NULL, x, 2, DM_FLOAT32, DM_SUM), DM_OK);
    assert_int_equal(dm_flight_recorder_dump(c, g_dir), DM_ERR_UNSUPPORTED);
    check_has_all(dm_last_error(c), "flight_recorder_dump", "DISTMESH_NO_TRACE", NULL);
    dm_destroy(c);
}

DM_TEST_MAIN(tmpdir_setup, tmpdir_teardown,
    cmocka_unit_test(test_notrace_thread_world_runs_collectives),
    cmocka_unit_test(test_notrace_dump_is_unsupported))
