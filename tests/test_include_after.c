/* test_include_after: the implementation included where a program already has its own includes
   (issue 29). tests/dropin.mk compiles this file in the compilers' default mode (no -std, no
   -D_GNU_SOURCE), gcc and clang, with -Wall -Wextra -Wpedantic -Werror and DISTMESH_TCP, so
   distmesh.h's >>libc declarations stand in for what glibc hides there (memfd_create, accept4,
   sched_getcpu, ...); the test then runs them: two forked ranks on shared memory (memfd, the
   listener's accept4, the spin's sched_getcpu) and over sockets. With DM_TEST_INCLUDE_ONLY the
   file is only the includes: dropin.mk compiles it so under -std=c11 and expects distmesh.h's one
   #error naming the rule, and nothing else. */
#include <stdio.h>
#include <pthread.h>
#include <math.h>
#define DISTMESH_IMPLEMENTATION
#include "distmesh.h"

#if !defined(DM_TEST_INCLUDE_ONLY)
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include "test_filter.h"
#include "test_world.h"

typedef struct ranks_ctx { char store[420]; const char* transport; } ranks_ctx;
static int rank_main(int index, void* p) {
    ranks_ctx* k = (ranks_ctx*)p;
    dm_tcp_desc d;
    dm_collective* c = NULL;
    double x[1000];
    int i;
    dm_status st;
    memset(&d, 0, sizeof(d));
    d.rank = index;
    d.world_size = 2;
    d.store_url = k->store;
    d.transport = k->transport;
    d.timeout_ms = 30000;
    st = dm_tcp_create(&d, &c);
    if (st != DM_OK) return 2;
    if (strcmp(dm_transport_name(c), k->transport) != 0) return 3;
    for (i = 0; i < 1000; i++) x[i] = sqrt((double)(i + index));
    st = dm_all_reduce(c, NULL, x, 1000, DM_FLOAT64, DM_MAX);
    for (i = 0; st == DM_OK && i < 1000; i++)
        if (x[i] != sqrt((double)(i + 1))) st = DM_ERR_INTERNAL;
    dm_destroy(c);
    return st == DM_OK ? 0 : 4;
}
static void run_two(const char* transport) {
    tw_store s;
    tw_world w;
    ranks_ctx k;
    assert_int_equal(tw_store_file(&s, "dm_include_after"), 0);
    snprintf(k.store, sizeof(k.store), "%s", s.url);
    k.transport = transport;
    memset(&w, 0, sizeof(w));
    w.alarm_s = 60;
    assert_int_equal(tw_fork(&w, 2, rank_main, &k), 0);
    assert_int_equal(tw_reap(&w, 90), 0);
    tw_store_close(&s);
}
static void test_include_after_shm(void** state) {
    (void)state;
    run_two("shm");
}
static void test_include_after_tcp(void** state) {
    (void)state;
    run_two("tcp");
}

int main(int argc, char** argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_include_after_shm),
        cmocka_unit_test(test_include_after_tcp),
    };
    dm_test_filter(argc, argv);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
