/* An out-of-tree program built against an installed distmesh (tests/test_install.c builds it
   through pkg-config and through CMake). With no launcher variables dm_init gives a world of
   one; the all-reduce must leave the data as it is. */
#define DISTMESH_IMPLEMENTATION
#include <distmesh.h>
#include <stdio.h>

int main(void) {
    dm_collective* c = NULL;
    float x[4] = { 1.0f, 2.0f, 3.0f, 4.0f };
    dm_status st = dm_init(NULL, &c);
    if (st != DM_OK) {
        fprintf(stderr, "consumer: dm_init: %s\n", dm_strerror(st));
        return 1;
    }
    st = dm_all_reduce(c, NULL, x, 4, DM_FLOAT32, DM_SUM);
    if (st != DM_OK || x[3] != 4.0f) {
        fprintf(stderr, "consumer: all_reduce: %s\n", dm_last_error(c));
        dm_destroy(c);
        return 1;
    }
#if defined(DISTMESH_TCP)
    printf("consumer ok: distmesh %s, tcp backend compiled in\n", DISTMESH_VERSION);
#elif defined(DISTMESH_STORE_H)
    {   /* the store alone: linked, and refusing a url no store kind takes */
        dm_store* s = NULL;
        dm_store_desc d = {0};
        d.url = "nostore://here";
        if (dm_store_create(&d, &s) != DM_ERR_INVALID_ARG || s != NULL || dm_store_port(s) != 0) {
            fprintf(stderr, "consumer: store: an unknown url was not refused\n");
            dm_destroy(c);
            return 1;
        }
    }
    printf("consumer ok: distmesh %s, store compiled in\n", DISTMESH_VERSION);
#else
    printf("consumer ok: distmesh %s, core only\n", DISTMESH_VERSION);
#endif
    dm_destroy(c);
    return 0;
}
