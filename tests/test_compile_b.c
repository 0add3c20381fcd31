/* Second translation unit of test_compile: includes distmesh.h plainly (no implementation), so
   a definition leaking out of the implementation guard, or a missing DM_API, breaks the link. */
#include "distmesh.h"

/* Sum of 0..n-1 through a world-1 Fake created in this TU; -1 on failure. */
int compile_b_fake_sum(int n) {
    dm_fake_desc d = {0};
    dm_collective* c = NULL;
    int64_t v = 0;
    int i;
    if (dm_fake_create(&d, &c) != DM_OK) return -1;
    for (i = 0; i < n; i++) v += i;
    if (dm_all_reduce(c, NULL, &v, 1, DM_INT64, DM_SUM) != DM_OK) v = -1;
    dm_destroy(c);
    return (int)v;
}

const char* compile_b_status_name(dm_status st) { return dm_status_name(st); }
