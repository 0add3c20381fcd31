/* parity_bench: the same all-reduce harness for distmesh and OpenMPI, one source, launched the
   same way (mpirun), so the two are timed like for like (issue 17, item 4).

       mpirun -np N parity_bench_dm  NAME SIZE...     distmesh (dm_init: mpirun's rendezvous;
                                                      DISTMESH_TRANSPORT=tcp forces sockets)
       mpirun --mca btl tcp,self -np N parity_bench_mpi NAME SIZE...     OpenMPI

   float32 sum in place. For each size, two shapes, each after a warm-up:
     med   a barrier, then one timed all-reduce, `iters` times; each rank's median per call, and
           the slowest rank's median is reported
     b2b   a barrier, then `iters` all-reduces back to back; each rank's mean per call, and the
           slowest rank's mean is reported
   iters = 64 MiB / size, clamped to [10, 2000]. One line per size on rank 0:
       NAME ranks=N bytes=B med_us=X b2b_us=Y
   Built with -DPARITY_MPI for OpenMPI, else against distmesh with DISTMESH_TCP. */
#if defined(PARITY_MPI)
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
typedef MPI_Comm comm_t;
static int comm_open(int* argc, char*** argv, comm_t* c) { MPI_Init(argc, argv); *c = MPI_COMM_WORLD; return 0; }
static void comm_close(comm_t c) { (void)c; MPI_Finalize(); }
static int comm_rank(comm_t c) { int r; MPI_Comm_rank(c, &r); return r; }
static int comm_size(comm_t c) { int n; MPI_Comm_size(c, &n); return n; }
static int comm_barrier(comm_t c) { return MPI_Barrier(c) == MPI_SUCCESS ? 0 : -1; }
static int comm_sum(comm_t c, float* buf, size_t n) {
    return MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, c) == MPI_SUCCESS ? 0 : -1;
}
static int comm_max(comm_t c, double* v) {
    return MPI_Allreduce(MPI_IN_PLACE, v, 1, MPI_DOUBLE, MPI_MAX, c) == MPI_SUCCESS ? 0 : -1;
}
#else
#define DISTMESH_IMPLEMENTATION
#include "distmesh.h"  /* first: it sets the feature macros it needs */
typedef dm_collective* comm_t;
static int comm_open(int* argc, char*** argv, comm_t* c) {
    dm_status st;
    (void)argc; (void)argv;
    *c = NULL;
    st = dm_init(NULL, c);
    if (st != DM_OK) fprintf(stderr, "parity_bench: dm_init: %s\n", dm_status_name(st));
    return st == DM_OK ? 0 : -1;
}
static void comm_close(comm_t c) { dm_destroy(c); }
static int comm_rank(comm_t c) { return dm_rank(c); }
static int comm_size(comm_t c) { return dm_world_size(c); }
static int report(comm_t c, dm_status st) {
    if (st != DM_OK) fprintf(stderr, "parity_bench: rank %d: %s\n", dm_rank(c), dm_last_error(c));
    return st == DM_OK ? 0 : -1;
}
static int comm_barrier(comm_t c) { return report(c, dm_barrier(c)); }
static int comm_sum(comm_t c, float* buf, size_t n) { return report(c, dm_all_reduce(c, NULL, buf, n, DM_FLOAT32, DM_SUM)); }
static int comm_max(comm_t c, double* v) { return report(c, dm_all_reduce(c, NULL, v, 1, DM_FLOAT64, DM_MAX)); }
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../tests/test_world.h"

static double now_us(void) { return (double)tw_now_ns() / 1e3; }

/* The slowest rank's median per call and mean per call back to back, in microseconds. */
static int run_size(comm_t c, size_t bytes, double* med, double* b2b) {
    size_t count = bytes / sizeof(float) ? bytes / sizeof(float) : 1, j;
    long iters = (long)(((size_t)64 << 20) / bytes), k;
    float* buf = (float*)malloc(count * sizeof(float));
    double* t = NULL;
    double t0;
    int rc = -1;
    if (iters < 10) iters = 10;
    if (iters > 2000) iters = 2000;
    t = (double*)malloc((size_t)iters * sizeof(double));
    if (!buf || !t) goto done;
    for (j = 0; j < count; j++) buf[j] = 1.0f / 1024;
    for (k = 0; k < iters / 10 + 2; k++)
        if (comm_sum(c, buf, count)) goto done;
    for (k = 0; k < iters; k++) {
        if (comm_barrier(c)) goto done;
        t0 = now_us();
        if (comm_sum(c, buf, count)) goto done;
        t[k] = now_us() - t0;
    }
    *med = tw_median(t, (int)iters);
    if (comm_barrier(c)) goto done;
    t0 = now_us();
    for (k = 0; k < iters; k++)
        if (comm_sum(c, buf, count)) goto done;
    *b2b = (now_us() - t0) / (double)iters;
    if (comm_max(c, med) || comm_max(c, b2b)) goto done;
    rc = 0;
done:
    free(buf);
    free(t);
    return rc;
}

int main(int argc, char** argv) {
    comm_t c;
    int i, rc = 0;
    if (comm_open(&argc, &argv, &c)) return 1;
    if (argc < 3) {
        if (comm_rank(c) == 0) fprintf(stderr, "usage: parity_bench NAME SIZE...\n");
        comm_close(c);
        return 2;
    }
    for (i = 2; i < argc && rc == 0; i++) {
        size_t bytes = strtoull(argv[i], NULL, 10);
        double med = 0, b2b = 0;
        if (bytes == 0) { rc = 2; break; }
        rc = run_size(c, bytes, &med, &b2b);
        if (rc == 0 && comm_rank(c) == 0) {
            printf("%s ranks=%d bytes=%zu med_us=%.3f b2b_us=%.3f\n", argv[1], comm_size(c), bytes, med, b2b);
            fflush(stdout);
        }
    }
    comm_close(c);
    return rc ? 1 : 0;
}
