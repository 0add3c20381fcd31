/* A first distmesh program: four ranks on four threads of this process (the Fake backend's
   threaded world) all-reduce a vector, all-gather their ranks, and use a dp x tp mesh.
   Build: cc -std=c11 -I. examples/threaded_world.c distmesh.c -pthread -lm -o threaded_world */
#include "distmesh.h"
#include <stdio.h>

static int rank_main(dm_collective* c, void* user_data) {
    float grad[4] = { 1.0f, 2.0f, 3.0f, (float)dm_rank(c) };
    int ranks[4], me = dm_rank(c), one = 1;
    dm_mesh* mesh = NULL;
    dm_status st;
    (void)user_data;

    /* Average a gradient across all ranks, in place (send = NULL). */
    st = dm_all_reduce(c, NULL, grad, 4, DM_FLOAT32, DM_MEAN);
    if (st != DM_OK) goto fail;

    /* Every rank learns every rank's id: ranks[r] = r. */
    st = dm_all_gather(c, &me, ranks, 1, DM_INT32);
    if (st != DM_OK) goto fail;

    /* dp 2 x tp 2: tensor parallel innermost, so ranks {0,1} and {2,3} form the tp groups. */
    st = dm_mesh_create_dp_tp(c, 2, &mesh);
    if (st != DM_OK) goto fail;
    st = dm_all_reduce(dm_mesh_tp_world(mesh), NULL, &one, 1, DM_INT32, DM_SUM);
    if (st != DM_OK) goto fail;

    printf("rank %d: mean grad = [%g %g %g %g], gathered = [%d %d %d %d], dp %d/%d tp %d/%d, tp sum %d\n",
           me, grad[0], grad[1], grad[2], grad[3], ranks[0], ranks[1], ranks[2], ranks[3],
           dm_mesh_dp_rank(mesh), dm_mesh_dp_world_size(mesh), dm_mesh_tp_rank(mesh),
           dm_mesh_tp_world_size(mesh), one);
    dm_mesh_destroy(mesh);
    return DM_OK;
fail:
    fprintf(stderr, "rank %d: %s: %s\n", me, dm_status_name(st), dm_last_error(c));
    dm_mesh_destroy(mesh);
    return st;
}

int main(void) {
    dm_fake_desc desc = {0};         /* zero means default */
    desc.world_size = 4;
    desc.timeout_ms = 10000;         /* no call waits longer than this */
    dm_status st = dm_thread_world_run(&desc, rank_main, NULL);
    printf("%s\n", st == DM_OK ? "ok" : dm_strerror(st));
    return st == DM_OK ? 0 : 1;
}
