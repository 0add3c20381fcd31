/* The cost model's front end: distmesh.h's choice (>>choice), its very functions, run on the
   layouts given one per line on stdin, one answer line per query. scripts/cost_model.py builds
   it (make build/plain/tools/cost_model) and reads it, so the paper model is the code's model
   and has no copy to keep in step; tests/test_cost_model.c holds both against what the
   collectives run.

   query    ranks=N (per_host=L | host_of=H0,H1,...) count=C [dtype=float32] [shm=ALPHA,BETA]
            [cross=ALPHA,BETA] [per_site=K | site_of=S0,S1,...] [site=ALPHA,BETA]
            per_host=L: ranks [k L, (k + 1) L) on host k (the last host may have fewer);
            per_site=K: hosts [k K, (k + 1) K) at site k (DISTMESH_SITE), or site_of per rank;
            shm, cross, site: that link class's alpha (us) and beta (ns per byte), for
            predictions of other machines (else the model's own, the answer to "classes")
   answer   the query's fields, then all_reduce=ALGO (what dm_all_reduce and dm_reduce run),
            us.ALGO=US for every all_reduce algorithm (the model's cost, whether or not it
            could run; three_level only on several sites; two_level_int8 and two_level_bf16, or
            three_level_* across sites: dm_all_reduce_compressed's, which runs only when
            asked), sites=NS, rails=ring|rd (two_level_ring's rails), and the family (flat,
            two_level, three_level across sites) of all_gather, reduce_scatter (blocks of count
            elements), broadcast and barrier;
            or error=TEXT
   classes  one line per link class: class=NAME alpha=US beta=NS  # what it stands for; then the
            model's bounds

   DISTMESH_ALGO is honoured as the collectives honour it. */
#define DISTMESH_IMPLEMENTATION
#include "distmesh.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MODEL_MAX_RANKS (1 << 20)

/* A family by its levels: 1 flat, 2 two-level, 3 three-level (across sites). */
static const char* family(int levels) { return levels == 3 ? "three_level" : levels == 2 ? "two_level" : "flat"; }

static int parse_dtype(const char* s, dm_dtype* out) {
    int k;
    for (k = 0; k < DM_DTYPE_COUNT; k++)
        if (strcmp(s, dm_dtype_name((dm_dtype)k)) == 0) { *out = (dm_dtype)k; return 0; }
    return -1;
}

static int parse_class(const char* s, _dm_link_cost* out) {
    char* end;
    out->alpha_us = strtod(s, &end);
    if (*end != ',') return -1;
    out->beta_ns = strtod(end + 1, &end);
    return *end == 0 && out->alpha_us >= 0 && out->beta_ns >= 0 ? 0 : -1;
}

static void print_classes(void) {
#define _DM_X(name, alpha, beta, text) printf("class=%s alpha=%g beta=%g  # %s\n", #name, alpha, beta, text);
    _DM_COST_CLASSES(_DM_X)
#undef _DM_X
    printf("small_bytes=%zu two_level_block=%zu two_level_segments_max=%d\n", _DM_PICK_SMALL_BYTES,
           _DM_SCH_2L_BLOCK, _DM_SCH_2L_SEGMENTS_MAX);
}

/* n comma-separated numbers >= 0 from text into out; -1 when they are not. */
static int parse_list(char* text, int* out, int n) {
    int k;
    for (k = 0; k < n; k++) {
        out[k] = (int)strtol(text, &text, 10);
        if (out[k] < 0 || (*text != ',' && k < n - 1) || (*text && k == n - 1)) return -1;
        text++;
    }
    return 0;
}

/* One query: its tokens (modified), the answer printed. Returns 0, or -1 after an error line. */
static int answer(char* line) {
    _dm_link_cost classes[_DM_COST_NCLASSES];
    int ranks = 0, per_host = 0, per_site = 0, *host_of = NULL, *site_of = NULL, k, algo, rc = -1;
    long long count = -1;
    dm_dtype dtype = DM_FLOAT32;
    char *hosts_text = NULL, *sites_text = NULL;
    dm_collective* c = NULL;
    char* tok;
    _dm_eng lk;
    dm_fake_desc d;
    memset(&lk, 0, sizeof(lk));
    memset(&d, 0, sizeof(d));
    memcpy(classes, _dm_cost_classes, sizeof(classes));
    for (tok = strtok(line, " \t\r\n"); tok; tok = strtok(NULL, " \t\r\n")) {
        char* v = strchr(tok, '=');
        if (!v) { printf("error=\"not key=value: %s\"\n", tok); return -1; }
        *v++ = 0;
        if (strcmp(tok, "ranks") == 0) ranks = atoi(v);
        else if (strcmp(tok, "per_host") == 0) per_host = atoi(v);
        else if (strcmp(tok, "host_of") == 0) hosts_text = v;
        else if (strcmp(tok, "count") == 0) count = atoll(v);
        else if (strcmp(tok, "dtype") == 0 && parse_dtype(v, &dtype) == 0) {}
        else if (strcmp(tok, "shm") == 0 && parse_class(v, &classes[_DM_COST_SHM]) == 0) {}
        else if (strcmp(tok, "cross") == 0 && parse_class(v, &classes[_DM_COST_CROSS_HOST]) == 0) {}
        else if (strcmp(tok, "site") == 0 && parse_class(v, &classes[_DM_COST_CROSS_SITE]) == 0) {}
        else if (strcmp(tok, "per_site") == 0) per_site = atoi(v);
        else if (strcmp(tok, "site_of") == 0) sites_text = v;
        else { printf("error=\"bad %s=%s\"\n", tok, v); return -1; }
        printf("%s=%s ", tok, v);
    }
    if (ranks < 2 || ranks > MODEL_MAX_RANKS || count < 1 || (per_host < 1) == !hosts_text) {
        printf("error=\"need ranks=2..%d, count >= 1, and one of per_host >= 1 or host_of\"\n", MODEL_MAX_RANKS);
        return -1;
    }
    host_of = (int*)calloc(2 * (size_t)ranks, sizeof(int));
    if (!host_of) { printf("error=\"out of memory\"\n"); return -1; }
    for (k = 0; k < ranks && !hosts_text; k++) host_of[k] = k / per_host;
    if (hosts_text && parse_list(hosts_text, host_of, ranks) != 0) {
        printf("error=\"host_of needs %d numbers >= 0, comma separated\"\n", ranks);
        goto done;
    }
    if (per_site > 0 || sites_text) site_of = host_of + ranks;
    for (k = 0; k < ranks && per_site > 0; k++) site_of[k] = host_of[k] / per_site;
    if (sites_text && parse_list(sites_text, site_of, ranks) != 0) {
        printf("error=\"site_of needs %d numbers >= 0, comma separated\"\n", ranks);
        goto done;
    }
    d.world_size = ranks;
    d.host_of = host_of;
    d.site_of = site_of;
    if (dm_fake_create(&d, &c) != DM_OK || _dm_eng_init(&lk, c, "model", 0) != DM_OK) {
        printf("error=\"%s\"\n", c ? dm_last_error(c) : "fake: create failed");
        goto done;
    }
    lk.cost = classes;
    _dm_eng_set_layout(&lk, host_of, site_of);
    algo = _dm_pick_all_reduce(&lk, (size_t)count, dtype);
    printf("hosts=%d sites=%d all_reduce=%s", lk.lay.H, lk.lay.NS, _dm_algo_names[algo]);
    for (k = _DM_ALGO_FLAT_RING; k < _DM_ALGO_COUNT; k++)
        if (k != _DM_ALGO_THREE_LEVEL || lk.lay.NS > 1)
            printf(" us.%s=%.6f", _dm_algo_names[k], _dm_cost_all_reduce(&lk, k, (size_t)count, dtype));
    printf(_dm_pick_compressed_sites(&lk, (size_t)count) ? " us.three_level_int8=%.6f us.three_level_bf16=%.6f"
                                                         : " us.two_level_int8=%.6f us.two_level_bf16=%.6f",
           /* dm_all_reduce_compressed, when asked: across sites only the site link compressed */
           _dm_cost_compressed(&lk, (size_t)count, dm_dtype_size(dtype), DM_COMPRESS_INT8),
           _dm_cost_compressed(&lk, (size_t)count, dm_dtype_size(dtype), DM_COMPRESS_BF16));
    printf(" rails=%s", _dm_pick_rails_ring(&lk, (size_t)count, dtype) ? "ring" : "rd");
    k = _dm_pick_gather_three_level(&lk, (double)count * (double)dm_dtype_size(dtype))    ? 3
        : _dm_pick_gather_two_level(&lk, (double)count * (double)dm_dtype_size(dtype)) ? 2 : 1;
    printf(" all_gather=%s reduce_scatter=%s", family(k), family(k));
    printf(" broadcast=%s barrier=%s\n", family(_dm_pick_broadcast_three_level(&lk) ? 3 : _dm_pick_broadcast_two_level(&lk) ? 2 : 1),
           family(_dm_pick_barrier_three_level(&lk) ? 3 : _dm_pick_barrier_two_level(&lk) ? 2 : 1));
    rc = 0;
done:
    _dm_eng_release(&lk);
    dm_destroy(c);
    free(host_of);
    return rc;
}

int main(void) {
    char* line = NULL;
    size_t cap = 0;
    int failed = 0;
    while (getline(&line, &cap, stdin) > 0) {
        if (strspn(line, " \t\r\n") == strlen(line)) continue;
        if (strncmp(line, "classes", 7) == 0) print_classes();
        else if (answer(line) != 0) failed = 1;
        fflush(stdout);
    }
    free(line);
    return failed;
}
