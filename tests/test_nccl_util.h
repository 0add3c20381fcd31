/* What the NCCL stand-in's test programs share (tests/test_nccl_standin.c,
   tests/test_nccl_failures.c): the caller's device and the communicator's (g_device, checked by
   the stand-in on every device-bound call), same_host (every rank on this host at create),
   device memory of the communicator's device allocated outside that check, the last-error
   check, and the counts every test ends with. Include after cmocka.h, distmesh.h (with DISTMESH_NCCL) and stand_in_cuda_nccl.h. */
#ifndef DM_TEST_NCCL_UTIL_H
#define DM_TEST_NCCL_UTIL_H
#include <string.h>

enum { CALLER_DEVICE = 0, N = 16 };

static int g_device = -1;       /* the communicator's device, while one is checked */

#define CHECK_MSG(c, text) do { if (!strstr(dm_last_error(c), (text)))                          \
        fail_msg("last error \"%s\" lacks \"%s\"", dm_last_error(c), (text)); } while (0)

/* The other ranks' host identities at create (si_set_all_gather_peers): this rank's own, and
   its process id, so every rank is on this host and none is watched (the stand-in alone leaves
   their blocks zero: every rank a host of its own). */
static void same_host(int peer, unsigned char* block, const unsigned char* mine, size_t bytes, void* user) {
    (void)peer; (void)user;
    memcpy(block, mine, bytes);
}
/* Device memory of `device` (dev: the communicator's), allocated outside the device check. */
static float* dev_on(int device, size_t count) {
    void* p = NULL;
    si_expect_device(-1);
    assert_int_equal(cudaSetDevice(device), cudaSuccess);
    assert_int_equal(cudaMalloc(&p, count * sizeof(float)), cudaSuccess);
    assert_int_equal(cudaSetDevice(CALLER_DEVICE), cudaSuccess);
    si_expect_device(g_device);
    return (float*)p;
}
static float* dev(size_t count) { return dev_on(g_device, count); }
static void dev_free(void* p) {
    si_expect_device(-1);
    cudaFree(p);                /* may answer a sticky error; the stand-in releases it anyway */
}
/* What every test ends with (each program adds its own counts): no call on a freed
   communicator, none refused for being in progress, no operation another communicator's abort
   silently skipped, no wait that would hang on a GPU, no NCCL job still running, nothing left
   alive, no bad free, no group left open. */
static void nothing_left_shared(void) {
    const si_stats* s = si_get();
    if (s->use_after_free) fail_msg("%d calls on freed communicators, the first: %s", s->use_after_free,
                                    s->first_use_after_free);
    if (s->hangs) fail_msg("%d waits that would hang on a GPU, the first: %s", s->hangs, s->first_hang);
    assert_int_equal(s->wait_bounds, 0);
    assert_int_equal(s->used_in_progress, 0);
    assert_int_equal(s->skipped_by_shared_abort, 0);
    assert_int_equal(si_pending_jobs(), 0);
    assert_int_equal(s->live_comms, 0);
    assert_int_equal(s->live_streams, 0);
    assert_int_equal(s->live_events, 0);
    assert_int_equal(s->live_allocs, 0);
    assert_int_equal(s->stale_comm_calls, 0);
    assert_int_equal(s->bad_frees, 0);
    assert_int_equal(s->group_depth, 0);
}
#endif /* DM_TEST_NCCL_UTIL_H */
