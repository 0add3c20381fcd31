/* What the NCCL stand-in's test programs share (tests/test_nccl_standin.c,
   tests/test_nccl_failures.c): the caller's device and the communicator's (g_device, checked by
   the stand-in on every device-bound call), same_host (every rank on this host at create),
   device memory of the communicator's device allocated outside that check, and the last-error
   check. Include after cmocka.h, distmesh.h (with DISTMESH_NCCL) and stand_in_cuda_nccl.h. */
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
/* Device memory of the communicator's device, allocated outside the device check. */
static float* dev(size_t count) {
    void* p = NULL;
    si_expect_device(-1);
    assert_int_equal(cudaSetDevice(g_device), cudaSuccess);
    assert_int_equal(cudaMalloc(&p, count * sizeof(float)), cudaSuccess);
    assert_int_equal(cudaSetDevice(CALLER_DEVICE), cudaSuccess);
    si_expect_device(g_device);
    return (float*)p;
}
static void dev_free(void* p) {
    si_expect_device(-1);
    cudaFree(p);                /* may answer a sticky error; the stand-in releases it anyway */
}
#endif /* DM_TEST_NCCL_UTIL_H */
