/* nccl_overhead: what distmesh adds per call on NCCL world 1 at 8 bytes, against raw
   ncclAllReduce on the same communicator and stream. Both loops enqueue CALLS all-reduces,
   synchronizing every BATCH so the launch queue never throttles the host; the median over
   REPS rounds of the per-call time is reported, and the difference is distmesh's overhead.
     nccl_overhead [calls=20000] [reps=7] */
#define DISTMESH_IMPLEMENTATION
#include "distmesh.h"
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include "../tests/test_world.h"

enum { BATCH = 500 };
int main(int argc, char** argv) {
    int calls = argc > 1 ? atoi(argv[1]) : 20000, reps = argc > 2 ? atoi(argv[2]) : 7, i, k;
    double raw[64], dm[64];
    unsigned char id[DM_NCCL_UNIQUE_ID_BYTES];
    dm_nccl_desc d = {0};
    dm_collective* c = NULL;
    float* buf = NULL;
    ncclComm_t comm;
    cudaStream_t s;
    if (reps > 64) reps = 64;
    if (ncclGetUniqueId((ncclUniqueId*)(void*)id) != ncclSuccess) return 1;
    d.world_size = 1;
    d.unique_id = id;
    if (dm_nccl_create(&d, &c) != DM_OK) { fprintf(stderr, "create failed\n"); return 1; }
    comm = (ncclComm_t)dm_native_handle(c);
    s = (cudaStream_t)dm_nccl_stream(c);
    cudaMalloc((void**)&buf, 8);
    cudaMemset(buf, 0, 8);
    for (k = 0; k < reps; k++) {
        double t0 = tw_now_s();
        for (i = 0; i < calls; i++) {
            ncclAllReduce(buf, buf, 2, ncclFloat32, ncclSum, comm, s);
            if (i % BATCH == BATCH - 1) cudaStreamSynchronize(s);
        }
        cudaStreamSynchronize(s);
        raw[k] = (tw_now_s() - t0) / calls * 1e6;
        t0 = tw_now_s();
        for (i = 0; i < calls; i++) {
            if (dm_all_reduce(c, NULL, buf, 2, DM_FLOAT32, DM_SUM) != DM_OK) { fprintf(stderr, "%s\n", dm_last_error(c)); return 1; }
            if (i % BATCH == BATCH - 1) cudaStreamSynchronize(s);
        }
        dm_synchronize(c);
        dm[k] = (tw_now_s() - t0) / calls * 1e6;
    }
    tw_sort(raw, reps);
    tw_sort(dm, reps);
    printf("nccl world 1, 8 B all_reduce, median of %d x %d calls: raw ncclAllReduce %.3f us/call, "
           "dm_all_reduce %.3f us/call, distmesh overhead %.3f us/call\n",
           reps, calls, raw[reps / 2], dm[reps / 2], dm[reps / 2] - raw[reps / 2]);
    cudaFree(buf);
    dm_destroy(c);
    return 0;
}
