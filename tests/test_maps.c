/* The maps of the code, held against the code:
   - the cost model on paper (scripts/cost_model.py, through the model's front end
     scripts/cost_model.c) names, for a grid of layouts, counts and dtypes, the algorithm that
     the collectives then run on the threaded world given that layout (dm_last_algorithm):
     all_reduce and reduce by name, all_gather, reduce_scatter and broadcast by family (the
     threaded world's barrier is its own, not the engine's: the script's barrier is not held
     here);
   - the headers' tag indexes list their sections, each tag once (scripts/check_tags.py).
   Both are cheap: one python run each, 16 threaded worlds of 2-8 ranks (3 of them on sites). */
#define _GNU_SOURCE                 /* mkstemp, popen */
#include "distmesh.h"

#include "prelude.h"
#include <unistd.h>

#ifndef DM_SRCDIR
#define DM_SRCDIR "."
#endif
#ifndef DM_COST_MODEL
#define DM_COST_MODEL "build/plain/tools/cost_model"
#endif
#define PY "/usr/bin/python3"

#define MAX_RANKS 8
#define NLAYOUTS 16
static const int layouts[NLAYOUTS][MAX_RANKS + 1] = {    /* ranks, then host_of */
    { 2, 0, 0 }, { 2, 0, 1 }, { 3, 0, 0, 1 }, { 4, 0, 0, 1, 1 }, { 4, 0, 1, 0, 1 }, { 4, 0, 0, 0, 1 },
    { 4, 0, 1, 2, 3 }, { 5, 0, 0, 0, 1, 1 }, { 6, 0, 0, 0, 1, 1, 1 }, { 6, 0, 0, 1, 1, 2, 2 },
    { 6, 0, 1, 2, 0, 1, 2 }, { 8, 0, 0, 0, 0, 1, 1, 1, 1 }, { 8, 0, 0, 1, 1, 2, 2, 3, 3 },
    { 8, 0, 0, 1, 1, 2, 2, 3, 3 }, { 4, 0, 1, 2, 3 }, { 6, 0, 0, 1, 1, 2, 2 },
};
/* The last layouts' sites (dm_fake_desc.site_of, DISTMESH_SITE), from layout FIRST_SITED on:
   2 sites x 2 hosts x 2 ranks, 2 x 2 x 1, and 2 hosts at one site with 1 at the other. */
#define FIRST_SITED 13
static const int layout_sites[NLAYOUTS - FIRST_SITED][MAX_RANKS] = {
    { 0, 0, 0, 0, 1, 1, 1, 1 }, { 0, 0, 1, 1 }, { 0, 0, 0, 0, 1, 1 },
};
/* Around the model's bounds: fewer elements than ranks, 64 KiB (one host's rd/ring bound) for
   float32 and bfloat16, and sizes where the hosts' costs cross. */
#define NCOUNTS 7
static const size_t counts[NCOUNTS] = { 1, 5, 1000, 16384, 16385, 70000, 300000 };
#define NDTYPES 2
static const dm_dtype dtypes[NDTYPES] = { DM_FLOAT32, DM_BFLOAT16 };
#define NCONF (NCOUNTS * NDTYPES)
#define GATHER_MAX 1000     /* all_gather / reduce_scatter blocks: the choice is linear in them */

enum { ALL_REDUCE, REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, NCOLL };
static const char* const coll_names[NCOLL] = { "all_reduce", "reduce", "all_gather", "reduce_scatter",
                                               "broadcast" };

typedef struct ran {
    const char* algo[MAX_RANKS][NCONF][NCOLL];      /* dm_last_algorithm after each call */
} ran;

static int run_grid(dm_collective* c, void* user) {
    ran* out = (ran*)user;
    int r = dm_rank(c), W = dm_world_size(c), i;
    unsigned char *a = NULL, *b = NULL;
    int st = DM_OK;
    a = (unsigned char*)calloc(counts[NCOUNTS - 1] * 8, 1);
    b = (unsigned char*)calloc(counts[NCOUNTS - 1] * 8 + (size_t)W * GATHER_MAX * 8, 1);
    if (!a || !b) st = DM_ERR_OUT_OF_MEMORY;
    for (i = 0; i < NCONF && st == DM_OK; i++) {
        size_t n = counts[i / NDTYPES], g = n < GATHER_MAX ? n : GATHER_MAX;
        dm_dtype t = dtypes[i % NDTYPES];
        if ((st = dm_all_reduce(c, NULL, a, n, t, DM_SUM)) != DM_OK) break;
        out->algo[r][i][ALL_REDUCE] = dm_last_algorithm(c);
        if ((st = dm_reduce(c, a, b, n, t, DM_SUM, 0)) != DM_OK) break;
        out->algo[r][i][REDUCE] = dm_last_algorithm(c);
        if ((st = dm_all_gather(c, a, b, g, t)) != DM_OK) break;
        out->algo[r][i][ALL_GATHER] = dm_last_algorithm(c);
        if ((st = dm_reduce_scatter(c, b, a, g, t, DM_SUM)) != DM_OK) break;
        out->algo[r][i][REDUCE_SCATTER] = dm_last_algorithm(c);
        if ((st = dm_broadcast(c, a, n, t, W - 1)) != DM_OK) break;
        out->algo[r][i][BROADCAST] = dm_last_algorithm(c);
    }
    if (st != DM_OK) fprintf(stderr, "rank %d: %s\n", r, dm_last_error(c));
    free(a);
    free(b);
    return st;
}

/* The family of what ran: "two_level_ring" -> "two_level", "flat_chain" -> "flat". */
static int same_family(const char* family, const char* algo) {
    size_t n = strlen(family);
    return algo && strncmp(algo, family, n) == 0 && algo[n] == '_';
}

/* Asks the script for every (layout, count, dtype) of the grid at once. */
static int predict(char (*pred)[NCONF][NCOLL][32]) {
    char qpath[] = "/tmp/dm_test_maps_XXXXXX", cmd[1024], line[1024];
    FILE* q;
    FILE* p;
    int fd = mkstemp(qpath), l, i, k, got = 0;
    if (fd < 0) return -1;
    q = fdopen(fd, "w");
    for (l = 0; l < NLAYOUTS; l++)
        for (i = 0; i < NCONF; i++) {
            fprintf(q, "ranks=%d host_of=", layouts[l][0]);
            for (k = 0; k < layouts[l][0]; k++) fprintf(q, "%s%d", k ? "," : "", layouts[l][1 + k]);
            for (k = 0; l >= FIRST_SITED && k < layouts[l][0]; k++)
                fprintf(q, "%s%d", k ? "," : " site_of=", layout_sites[l - FIRST_SITED][k]);
            fprintf(q, " count=%zu dtype=%s\n", counts[i / NDTYPES], dm_dtype_name(dtypes[i % NDTYPES]));
        }
    fclose(q);
    snprintf(cmd, sizeof(cmd), "DM_COST_MODEL=%s %s %s/scripts/cost_model.py --query < %s", DM_COST_MODEL, PY,
             DM_SRCDIR, qpath);
    p = popen(cmd, "r");
    for (l = 0; p && l < NLAYOUTS; l++)
        for (i = 0; i < NCONF && fgets(line, sizeof(line), p); i++, got++) {
            for (k = 0; k < NCOLL; k++) {
                char key[40];
                const char* at;
                size_t n;
                snprintf(key, sizeof(key), " %s=", k == REDUCE ? "all_reduce" : coll_names[k]);
                at = strstr(line, key);
                if (!at) { fprintf(stderr, "no %s in the script's line: %s", key, line); unlink(qpath); return -1; }
                at += strlen(key);
                n = strcspn(at, " \n");
                snprintf(pred[l][i][k], 32, "%.*s", (int)(n < 31 ? n : 31), at);
            }
        }
    if (p && pclose(p) != 0) got = -1;
    unlink(qpath);
    return got == NLAYOUTS * NCONF ? 0 : -1;
}

static void test_cost_model_script_is_what_runs(void** state) {
    static char pred[NLAYOUTS][NCONF][NCOLL][32];
    static ran seen;
    int l, i, k, r, bad = 0, two_level = 0, names[5] = { 0, 0, 0, 0, 0 };
    (void)state;
    assert_int_equal(predict(pred), 0);
    for (l = 0; l < NLAYOUTS; l++) {
        dm_fake_desc d;
        memset(&d, 0, sizeof(d));
        memset(&seen, 0, sizeof(seen));
        d.world_size = layouts[l][0];
        d.host_of = &layouts[l][1];
        d.site_of = l >= FIRST_SITED ? layout_sites[l - FIRST_SITED] : NULL;
        d.timeout_ms = 60000;
        assert_int_equal(dm_thread_world_run(&d, run_grid, &seen), DM_OK);
        for (i = 0; i < NCONF; i++)
            for (k = 0; k < NCOLL; k++)
                for (r = 0; r < d.world_size; r++) {
                    const char* got = seen.algo[r][i][k];
                    const char* want = pred[l][i][k];
                    int ok = k <= REDUCE ? got && strcmp(got, want) == 0 : same_family(want, got);
                    if (!ok && bad++ < 20)
                        fprintf(stderr, "layout %d (%d ranks), count %zu %s, rank %d: %s ran %s, the script says %s\n",
                                l, d.world_size, counts[i / NDTYPES], dm_dtype_name(dtypes[i % NDTYPES]), r,
                                coll_names[k], got ? got : "(nothing)", want);
                    if (r == 0 && k == ALL_REDUCE) {
                        names[0] += strcmp(want, "flat_ring") == 0;
                        names[1] += strcmp(want, "flat_rd") == 0;
                        names[2] += strcmp(want, "two_level_ring") == 0;
                        names[3] += strcmp(want, "two_level_rd") == 0;
                        names[4] += strcmp(want, "three_level") == 0;
                    }
                    if (r == 0 && k > REDUCE) two_level += strcmp(want, "two_level") == 0;
                }
    }
    /* the grid reaches every all_reduce algorithm and both families, so it can tell them apart */
    fprintf(stderr, "all_reduce chosen: flat_ring %d, flat_rd %d, two_level_ring %d, two_level_rd %d, three_level %d; "
            "two-level choices of the others %d\n", names[0], names[1], names[2], names[3], names[4], two_level);
    assert_true(names[0] > 0 && names[1] > 0 && names[2] > 0 && names[3] > 0 && names[4] > 0 && two_level > 0);
    assert_int_equal(bad, 0);
}

static void test_tag_indexes(void** state) {
    (void)state;
    assert_int_equal(system(PY " " DM_SRCDIR "/scripts/check_tags.py"), 0);
}

DM_TEST_MAIN(NULL, NULL,
    cmocka_unit_test(test_cost_model_script_is_what_runs),
    cmocka_unit_test(test_tag_indexes))
