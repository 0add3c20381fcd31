/* The program at the top of README.md ("Use it"), kept here so that `make` compiles it: four
   ranks on four threads of this process average a gradient; DM_CHECK prints any failure with
   its reason and exits.
   Build: cc -std=c11 -I. examples/readme_first.c distmesh.c -pthread -lm -o readme_first */
#include "distmesh.h"
#include <stdio.h>
#include <string.h>

static int rank_main(dm_collective* c, void* user_data) {
    float grad[3] = { 1.0f, 2.0f, (float)dm_rank(c) };
    (void)user_data;
    DM_CHECK(c, dm_all_reduce(c, NULL, grad, 3, DM_FLOAT32, DM_MEAN));   /* NULL send: in place */
    printf("rank %d of %d: %g %g %g\n", dm_rank(c), dm_world_size(c), grad[0], grad[1], grad[2]);
    return DM_OK;
}

int main(void) {
    dm_fake_desc desc;
    memset(&desc, 0, sizeof(desc));     /* zero means default (C: = {0}; C++: = {}) */
    desc.world_size = 4;                /* four real ranks on four threads of this process */
    DM_CHECK(NULL, dm_thread_world_run(&desc, rank_main, NULL));
    return 0;
}
