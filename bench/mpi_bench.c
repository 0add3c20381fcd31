/* mpi_bench: in-place MPI_Allreduce of floats, for scripts/compare.sh (OpenMPI over TCP:
   mpirun --mca pml ob1 --mca btl tcp,self -np N mpi_bench ITERS WARMUP BYTES...; shared memory:
   --mca btl vader,self). Prints one line per size: NAME ranks=N bytes=B us=T (mean per
   all-reduce, slowest rank), NAME from $MPI_BENCH_NAME (default "mpi"). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
    int rank, world, iters, warmup, i, k;
    const char* name = getenv("MPI_BENCH_NAME") ? getenv("MPI_BENCH_NAME") : "mpi";
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (argc < 4) {
        if (rank == 0) fprintf(stderr, "usage: mpi_bench ITERS WARMUP BYTES...\n");
        MPI_Finalize();
        return 2;
    }
    iters = atoi(argv[1]);
    warmup = atoi(argv[2]);
    for (i = 3; i < argc; i++) {
        size_t bytes = strtoull(argv[i], NULL, 10), count = bytes / sizeof(float) ? bytes / sizeof(float) : 1, j;
        float* in = (float*)malloc(count * sizeof(float));
        double t0, us, slowest;
        for (j = 0; j < count; j++) in[j] = 1.0f;
        for (k = 0; k < warmup; k++) MPI_Allreduce(MPI_IN_PLACE, in, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        for (k = 0; k < iters; k++) MPI_Allreduce(MPI_IN_PLACE, in, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        us = (MPI_Wtime() - t0) * 1e6 / iters;
        MPI_Reduce(&us, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0) printf("%s ranks=%d bytes=%zu us=%.3f\n", name, world, count * sizeof(float), slowest);
        fflush(stdout);
        free(in);
    }
    MPI_Finalize();
    return 0;
}
