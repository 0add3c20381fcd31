/* All-reduce across processes over TCP, placed by the environment (torchrun, mpirun, srun, or
   by hand). Each rank prints its rank, world size, local rank, backend and transport (shm
   between ranks on one host, tcp across hosts). One run script per launcher, four ranks here:

     examples/launch_torchrun.sh   torchrun --nproc_per_node 4 --master_port 29500 --no_python ...
     examples/launch_mpirun.sh     mpirun -np 4 ...             (no MASTER_* variables needed)
     examples/launch_srun.sh       srun -n 4 ...                (no MASTER_* variables needed)
     examples/launch_by_hand.sh    RANK=r WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 ... &

   By hand and under torchrun, rank 0 (or torchrun's agent) hosts the rendezvous store at
   MASTER_ADDR:MASTER_PORT (a PyTorch-compatible TCPStore); under mpirun and srun on one host the
   ranks meet in a private file store named after the job. Every rank publishes its address
   there and the ranks connect to each other.
   Build: cc -std=c11 -DDISTMESH_TCP -I. examples/tcp_all_reduce.c distmesh.c -luv -pthread -lm
   (or `make`: build/plain/examples/tcp_all_reduce, the scripts' default program) */
#include "distmesh.h"
#include <stdio.h>
#include <stdlib.h>

int main(void) {
    dm_init_desc desc = {0};             /* zero means default */
    dm_collective* c = NULL;
    size_t n = 1 << 20, i;
    float* grad;
    float expect;
    int ok;

    desc.timeout_ms = 30000;             /* no call waits longer than 30 s for a peer */
    /* TCP when WORLD_SIZE > 1, else a world of one. A failure prints its reason (with the rank)
       and exits; so does DM_CHECK below. */
    DM_CHECK(NULL, dm_init(&desc, &c));
    grad = (float*)malloc(n * sizeof(float));
    if (!grad) return 1;
    for (i = 0; i < n; i++) grad[i] = (float)dm_rank(c);

    DM_CHECK(c, dm_all_reduce(c, NULL, grad, n, DM_FLOAT32, DM_MEAN));    /* in place */
    expect = (float)(dm_world_size(c) - 1) / 2.0f;
    printf("rank %d of %d (%s backend, %s transport, local %d/%d): mean %g, expected %g\n",
           dm_rank(c), dm_world_size(c), dm_backend_name(c), dm_transport_name(c), dm_local_rank(c),
           dm_local_world_size(c), grad[0], expect);
    ok = grad[0] == expect && grad[n - 1] == expect;
    free(grad);
    dm_destroy(c);
    return ok ? 0 : 1;
}
