/* nccl_host_cost: what an NCCL call costs the host through distmesh, on the CUDA/NCCL stand-in
   (tests/stand_in_cuda_nccl.c, no GPU): calls per second and CPU seconds per call (getrusage,
   the whole process: NCCL's launch threads included) of an 8-byte all-reduce at world 2, by
   four paths, on one build:
     nonblocking async   distmesh's communicator (non-blocking): dm_all_reduce_async + dm_wait
     nonblocking call    the same communicator: dm_all_reduce + dm_synchronize
     blocking call       a blocking communicator (NCCL_COMM_BLOCKING=1 at its creation):
                         dm_all_reduce + dm_synchronize
     blocking async      the blocking communicator: dm_all_reduce_async + dm_wait
   Each call waits for its work, so every path pays NCCL's launch and the kernel. The stand-in
   plays NCCL's launch as CPU work of launch_us (si_set_launch_cpu): on the calling thread of the
   blocking communicator, on a thread started per launch for the non-blocking one (NCCL 2.27 and
   2.28 start one per ncclGroupEnd), and the kernel as kernel_us of GPU time (no CPU). The
   paths run interleaved, REPS rounds; each row is the median of the rounds, and the last
   column the non-blocking async path's CPU per call over the blocking call's.
     nccl_host_cost [reps=7] [launch_us,kernel_us ...]   (default: 0,0 20,20 20,200 100,2000) */
#define _GNU_SOURCE
#include "distmesh.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "../tests/stand_in_cuda_nccl.h"
#include "../tests/test_world.h"

enum { PATHS = 4, MAX_REPS = 64, MAX_CASES = 16 };
static const char* const path_names[PATHS] = { "nonblocking async", "nonblocking call", "blocking call",
                                               "blocking async" };

static double cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           (double)ru.ru_stime.tv_usec * 1e-6;
}
static dm_collective* make(bool blocking) {
    static const unsigned char id[DM_NCCL_UNIQUE_ID_BYTES];
    dm_nccl_desc d;
    dm_collective* c = NULL;
    memset(&d, 0, sizeof(d));
    d.world_size = 2;
    d.unique_id = id;
    d.timeout_ms = 60000;
    if (blocking) setenv("NCCL_COMM_BLOCKING", "1", 1);   /* NCCL's override of the config */
    if (dm_nccl_create(&d, &c) != DM_OK) {
        fprintf(stderr, "nccl_host_cost: create failed\n");
        exit(1);
    }
    unsetenv("NCCL_COMM_BLOCKING");
    return c;
}
static void check(dm_collective* c, dm_status st) {
    if (st == DM_OK) return;
    fprintf(stderr, "nccl_host_cost: %s\n", dm_last_error(c));
    exit(1);
}
/* calls of one path; *wall and *cpu: seconds per call */
static void run(dm_collective* c, void* buf, bool async, int calls, double* wall, double* cpu) {
    double w0 = tw_now_s(), c0 = cpu_s();
    int i;
    for (i = 0; i < calls; i++) {
        if (async) {
            dm_request* r = NULL;
            check(c, dm_all_reduce_async(c, buf, buf, 2, DM_FLOAT32, DM_SUM, &r));
            check(c, dm_wait(r));
        } else {
            check(c, dm_all_reduce(c, buf, buf, 2, DM_FLOAT32, DM_SUM));
            check(c, dm_synchronize(c));
        }
    }
    *wall = (tw_now_s() - w0) / calls;
    *cpu = (cpu_s() - c0) / calls;
}
static double median(double* v, int n) {
    tw_sort(v, n);
    return v[n / 2];
}
int main(int argc, char** argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 7, cases = 0, k, p, r;
    int launch[MAX_CASES] = { 0, 20, 20, 100 }, kernel[MAX_CASES] = { 0, 20, 200, 2000 };
    dm_collective* comm[2];
    void* buf[2] = { NULL, NULL };
    if (reps < 1 || reps > MAX_REPS) reps = 7;
    for (k = 2; k < argc && cases < MAX_CASES; k++)
        if (sscanf(argv[k], "%d,%d", &launch[cases], &kernel[cases]) == 2) cases++;
    if (!cases) cases = 4;
    cudaSetDevice(0);
    comm[0] = make(false);
    comm[1] = make(true);
    cudaMalloc(&buf[0], 8);
    cudaMalloc(&buf[1], 8);
    printf("8 B all_reduce at world 2 on the stand-in, median of %d rounds; CPU: getrusage of the process\n", reps);
    printf("%9s %9s  %-18s %10s %11s %11s %9s\n", "launch_us", "kernel_us", "path", "calls/s", "CPU us/call",
           "wall us/call", "CPU x");
    for (k = 0; k < cases; k++) {
        double wall[PATHS][MAX_REPS], cpu[PATHS][MAX_REPS], mw[PATHS], mc[PATHS];
        int calls = 200000 / (launch[k] + kernel[k] + 10);      /* about 0.2 s a path and round */
        if (calls < 50) calls = 50;
        if (calls > 20000) calls = 20000;
        si_set_launch_cpu(true);
        si_set_enqueue_us(launch[k]);
        si_set_work_us(kernel[k]);
        for (p = 0; p < PATHS; p++) {           /* warm: the first use's connection, the request pool */
            double w, c;
            run(comm[p >= 2], buf[p >= 2], p == 0 || p == 3, 10, &w, &c);
        }
        for (r = 0; r < reps; r++)
            for (p = 0; p < PATHS; p++) run(comm[p >= 2], buf[p >= 2], p == 0 || p == 3, calls, &wall[p][r], &cpu[p][r]);
        for (p = 0; p < PATHS; p++) {
            mw[p] = median(wall[p], reps);
            mc[p] = median(cpu[p], reps);
        }
        for (p = 0; p < PATHS; p++)
            printf("%9d %9d  %-18s %10.0f %11.2f %11.2f %9.2f\n", launch[k], kernel[k], path_names[p], 1 / mw[p],
                   mc[p] * 1e6, mw[p] * 1e6, mc[p] / mc[2]);
    }
    cudaFree(buf[0]);
    cudaFree(buf[1]);
    dm_destroy(comm[0]);
    dm_destroy(comm[1]);
    return 0;
}
