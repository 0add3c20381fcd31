/* dm_bench speaks nccl-tests: its flags (-b -e -f -n -w -m -c -o -d -a -z -C -t -g -G) with
   nccl-tests' meanings, its type and op names in the table, and distmesh's own options as long
   options. Runs the built dm_bench (DM_BENCH) as a child on 2 local ranks (forked over TCP /
   shared memory on 127.0.0.1, or threads), each run under `timeout`; checks the table's columns,
   #wrong, and the JSON's per-rank times against what -a and -C select. */
#define _GNU_SOURCE
#include <math.h>
#include "prelude.h"
#include <unistd.h>
#include "test_world.h"

#ifndef DM_BENCH
#define DM_BENCH "build/plain/bench/dm_bench"
#endif

static char g_dir[64];
static char g_out[1 << 16], g_err[8192], g_json[1 << 16];

/* The file g_dir/name into buf. */
static void slurp(const char* name, char* buf, size_t cap) {
    char path[128];
    snprintf(path, sizeof(path), "%s/%s", g_dir, name);
    tw_read_file(path, buf, cap);
}

/* Runs dm_bench with ARGS (printf-style) under a 120 s timeout; its stdout, stderr and the JSON
   file g_dir/out.json (when ARGS pass --json there) land in g_out, g_err, g_json. Returns the
   exit status (124: timed out). */
static int bench(const char* fmt, ...) {
    char args[1024], cmd[2048];
    int rc;
    TW_VFORMAT(args, fmt);
    snprintf(cmd, sizeof(cmd), "rm -f %s/out.json; %s %s 2> %s/stderr", g_dir, DM_BENCH, args, g_dir);
    rc = tw_run_cmd(120, g_out, sizeof(g_out), cmd);        /* stdout only: stderr has its file */
    slurp("stderr", g_err, sizeof(g_err));
    slurp("out.json", g_json, sizeof(g_json));
    return rc;
}

static int setup(void** state) { (void)state; return tmpdir_make(g_dir, sizeof(g_dir), "dm_benchtest"); }
static int teardown(void** state) { (void)state; return tmpdir_remove(g_dir); }

/* One table row: the 13 columns of nccl-tests' table, then the algorithm distmesh chose. */
typedef struct row {
    unsigned long long size, count;
    char type[16], redop[16];
    int root;
    double us[2], algbw[2], busbw[2];
    char wrong[2][16];
    char algo[32];
} row;

/* The table's rows (lines not starting with '#'); fails on a line without those 14 columns or
   with an algorithm dm_last_algorithm does not name. */
static int table(row* rows, int cap) {
    char* save = NULL;
    char* copy = strdup(g_out);
    char* line;
    int n = 0;
    for (line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        row r;
        char extra[8];
        if (line[0] == '#') continue;
        if (sscanf(line, "%llu %llu %15s %15s %d %lf %lf %lf %15s %lf %lf %lf %15s %31s %7s", &r.size, &r.count, r.type,
                   r.redop, &r.root, &r.us[0], &r.algbw[0], &r.busbw[0], r.wrong[0], &r.us[1], &r.algbw[1], &r.busbw[1],
                   r.wrong[1], r.algo, extra) != 14) {
            free(copy);
            fail_msg("not a table row of 14 columns: \"%s\"\n%s", line, g_out);
        }
        if (strncmp(r.algo, "flat_", 5) != 0 && strncmp(r.algo, "two_level_", 10) != 0 && strcmp(r.algo, "-") != 0) {
            free(copy);
            fail_msg("row without an algorithm: \"%s\"", line);
        }
        if (n < cap) rows[n] = r;
        n++;
    }
    free(copy);
    return n;
}

/* The JSON's rows: pointers to each row's text (up to its '}'), in order. */
static int json_rows(const char** rows, int cap) {
    const char* p = g_json;
    int n = 0;
    while ((p = strstr(p, "{\"bytes\"")) != NULL) {
        if (n < cap) rows[n] = p;
        n++;
        p++;
    }
    return n;
}
static double json_num(const char* row, const char* key) {
    char pat[64];
    const char* end = strchr(row, '}');
    const char* p;
    snprintf(pat, sizeof(pat), "\"%s\": ", key);
    p = strstr(row, pat);
    if (!p || (end && p > end)) fail_msg("no \"%s\" in JSON row: %.300s", key, row);
    return strtod(p + strlen(pat), NULL);
}

static size_t esize_of(const char* type) {
    if (!strcmp(type, "int8") || !strcmp(type, "uint8")) return 1;
    if (!strcmp(type, "half") || !strcmp(type, "bfloat16")) return 2;
    if (!strcmp(type, "int32") || !strcmp(type, "uint32") || !strcmp(type, "float")) return 4;
    return 8;
}

/* The command: every nccl-tests type in nccl-tests' order and names, op avg, 8 B .. 1 KiB by
   factor 2, one check, mean across ranks, 2 collectives per timed iteration. */
static void test_bench_nccl_flags_all_types(void** state) {
    static const char* const types[] = { "int8", "uint8", "int32", "uint32", "int64",
                                         "uint64", "half", "float", "double", "bfloat16" };
    row rows[128];
    const char* jr[128];
    int n, i, nj, rc;
    (void)state;
    rc = bench("--np 2 -b 8 -e 1K -f 2 -d all -o avg -c 1 -a 1 -m 2 -n 4 -w 1 --timeout 90 --json %s/out.json", g_dir);
    if (rc != 0) fail_msg("exit %d\n%s\n%s", rc, g_out, g_err);
    if (!strstr(g_out, "agg iters: 2 validation: 1")) fail_msg("preamble: %s", g_out);
    if (!strstr(g_out, "#       size         count      type   redop    root     time   algbw   busbw #wrong"))
        fail_msg("header: %s", g_out);
    n = table(rows, 128);
    assert_int_equal(n, 10 * 8);
    for (i = 0; i < n; i++) {
        const row* r = &rows[i];
        unsigned long long want_size = 8ULL << (i % 8);
        if (strcmp(r->type, types[i / 8]) != 0 || r->size != want_size || strcmp(r->redop, "avg") != 0 ||
            r->root != -1 || r->count != want_size / esize_of(types[i / 8]) || strcmp(r->wrong[0], "0") != 0 ||
            strcmp(r->wrong[1], "0") != 0 || !(r->us[0] > 0) || !(r->us[1] > 0))
            fail_msg("row %d: %llu %llu %s %s %d ... #wrong %s %s (expected %s, %llu B, avg, root -1, #wrong 0)", i,
                     r->size, r->count, r->type, r->redop, r->root, r->wrong[0], r->wrong[1], types[i / 8], want_size);
    }
    if (!strstr(g_out, "# Out of bounds values : 0 OK")) fail_msg("footer: %s", g_out);
    /* -m 2: each timed iteration ran two collectives (the library's own count) */
    nj = json_rows(jr, 128);
    assert_int_equal(nj, n);
    for (i = 0; i < nj; i++) {
        assert_int_equal((int)json_num(jr[i], "oop_calls"), 4 * 2);
        assert_int_equal((int)json_num(jr[i], "ip_calls"), 4 * 2);
        assert_non_null(strstr(jr[i], "\"algo\": \"flat_rd\""));    /* small, one host */
    }
}

/* -t is nccl-tests' threads per process (it was distmesh's timeout): anything but 1 is refused with
   a message, as are -g above 1, CUDA graphs, and values nccl-tests does not have. */
static void test_bench_refuses_what_it_cannot_do(void** state) {
    static const struct { const char* args; const char* msg; } cases[] = {
        { "-t 2", "-t 2: only one thread per process" },
        { "--nthreads 4", "-t 4: only one thread per process" },
        { "-g 2", "-g 2: dm_bench runs its ranks on CPUs" },
        { "-G 1", "CUDA graphs need a GPU backend" },
        { "-z 2", "-z takes 0 or 1" },
        { "-a 4", "-a 4: takes 0 (rank 0), 1 (mean), 2 (min) or 3 (max)" },
        { "-C 2", "-C takes 0 or 1" },
        { "-d float8", "-d float8: unknown type" },
        { "-o mulsum", "-o mulsum: unknown op" },
        { "-b 1Q", "not a size" },
        { "-n 0", "need -n >= 1" },
        { "-m 0", "-m >= 1" },
        { "--chunk", "--chunk needs a value" },
        { "--frobnicate 1", "unknown option --frobnicate" },
    };
    size_t i;
    (void)state;
    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int rc = bench("-B thread --np 2 -b 8 -e 8 %s", cases[i].args);
        if (rc != 2 || !strstr(g_err, cases[i].msg) || g_out[0])
            fail_msg("dm_bench %s: exit %d (want 2), stderr \"%s\" (want \"%s\"), stdout \"%s\"", cases[i].args, rc,
                     g_err, cases[i].msg, g_out);
    }
    assert_int_equal(bench("-h"), 0);
    assert_non_null(strstr(g_out, "usage: dm_bench"));
}

/* Accepted as nccl-tests accepts them: -t 1, -g 0/1, -z 0/1, -G 0, -p, long and glued forms, and
   distmesh's names (float32, mean) printed with nccl-tests' (float, avg). */
static void test_bench_names_and_spellings(void** state) {
    static const char* const ops[] = { "sum", "prod", "max", "min", "avg" };
    row rows[16];
    int n, i, rc;
    (void)state;
    rc = bench("-B thread --np 2 -t 1 -g 1 -z 0 -G 0 -p 0 --minbytes=64 --maxbytes 256 -f4 -d float32 -o mean -n 2 -w 0");
    if (rc != 0) fail_msg("exit %d\n%s\n%s", rc, g_out, g_err);
    n = table(rows, 16);
    assert_int_equal(n, 2);
    assert_string_equal(rows[0].type, "float");
    assert_string_equal(rows[0].redop, "avg");
    assert_int_equal((int)rows[1].size, 256);
    rc = bench("-B thread --np 2 -g 0 -b 32 -e 32 -d half -o all -c 3 -n 1 -w 0");
    if (rc != 0) fail_msg("exit %d\n%s\n%s", rc, g_out, g_err);
    n = table(rows, 16);
    assert_int_equal(n, 5);
    for (i = 0; i < 5; i++) {
        assert_string_equal(rows[i].type, "half");
        assert_string_equal(rows[i].redop, ops[i]);
        assert_string_equal(rows[i].wrong[0], "0");
    }
    /* no -f: nccl-tests' step of 1 MiB; -c 0: no check, #wrong N/A */
    rc = bench("-B thread --np 2 -b 8 -e 1K -c 0 -n 1 -w 0");
    if (rc != 0) fail_msg("exit %d\n%s\n%s", rc, g_out, g_err);
    assert_int_equal(table(rows, 16), 1);
    assert_string_equal(rows[0].wrong[1], "N/A");
    /* distmesh's own options: long forms, and the old short ones that nccl-tests leaves free */
    rc = bench("--backend thread --np 2 --coll all_gather --sizes 8,4K --inplace-only --rss --chunk 64K --timeout 60 "
               "-n 1 -w 0 --json %s/out.json", g_dir);
    if (rc != 0) fail_msg("exit %d\n%s\n%s", rc, g_out, g_err);
    assert_int_equal(table(rows, 16), 2);
    assert_int_equal((int)rows[1].size, 4096);
    assert_string_equal(rows[1].redop, "none");
    assert_string_equal(rows[1].wrong[0], "N/A");   /* --inplace-only: no out-of-place run */
    if (!strstr(g_out, "# Peak RSS rank 1") || !strstr(g_json, "\"collective\": \"all_gather\""))
        fail_msg("%s\n%s", g_out, g_json);
    rc = bench("-B thread -np 2 -O broadcast -r 1 -S 16 -I -R -J %s/out.json -n 1 -w 0", g_dir);
    if (rc != 0) fail_msg("exit %d\n%s\n%s", rc, g_out, g_err);
    assert_int_equal(table(rows, 16), 1);
    assert_int_equal(rows[0].root, 1);
    assert_non_null(strstr(g_json, "\"collective\": \"broadcast\""));
    /* the barrier: one row of 0 bytes whatever the sizes, over TCP (the engine's own barrier) */
    rc = bench("-np 2 -O barrier -S 8,4K -J %s/out.json -n 3 -w 1", g_dir);
    if (rc != 0) fail_msg("exit %d\n%s\n%s", rc, g_out, g_err);
    assert_int_equal(table(rows, 16), 1);
    assert_int_equal((int)rows[0].size, 0);
    assert_string_equal(rows[0].redop, "none");
    if (!strstr(g_json, "\"collective\": \"barrier\"") || !strstr(g_json, "\"algo\": \"flat_dissemination\""))
        fail_msg("%s", g_json);
}

/* The printed time, in nccl-tests' format: within its rounding of WANT. */
static void expect_printed(double printed, double want, const char* what) {
    double step = want >= 10000 ? 1 : want >= 100 ? 0.1 : 0.01;
    if (fabs(printed - want) > step / 2 + 1e-9) fail_msg("%s: printed %g, JSON %g", what, printed, want);
}

/* -a picks which rank's time the table reports: 0 rank 0, 1 mean, 2 min, 3 max; the bandwidths
   follow it. -C 1 reports rank 0's own time while the bandwidths still follow -a. */
static void test_bench_average_and_cputime(void** state) {
    static const char* const pick[] = { "oop_us_rank0", "oop_us_mean", "oop_us_min", "oop_us_max" };
    int avg, cpu;
    (void)state;
    for (cpu = 0; cpu < 2; cpu++)
        for (avg = 0; avg < 4; avg++) {
            row rows[4];
            const char* jr[4];
            double us, agg, mn, mean, mx, r0, busbw;
            int rc = bench("-B thread --np 2 -b 64K -e 64K -n 3 -w 1 -a %d -C %d --json %s/out.json", avg, cpu, g_dir);
            if (rc != 0) fail_msg("exit %d\n%s\n%s", rc, g_out, g_err);
            assert_int_equal(table(rows, 4), 1);
            assert_int_equal(json_rows(jr, 4), 1);
            us = json_num(jr[0], "oop_us");
            agg = json_num(jr[0], pick[avg]);
            mn = json_num(jr[0], "oop_us_min");
            mean = json_num(jr[0], "oop_us_mean");
            mx = json_num(jr[0], "oop_us_max");
            r0 = json_num(jr[0], "oop_us_rank0");
            busbw = json_num(jr[0], "oop_busbw");
            if (!(mn > 0 && mn <= mean + 1e-3 && mean <= mx + 1e-3 && r0 >= mn - 1e-3 && r0 <= mx + 1e-3))
                fail_msg("per-rank times out of order: min %g mean %g max %g rank0 %g", mn, mean, mx, r0);
            /* -C 1: rank 0's own; else -a's pick */
            if (fabs(us - (cpu ? r0 : agg)) > 1e-3) fail_msg("-a %d -C %d: time %g, want %g", avg, cpu, us, cpu ? r0 : agg);
            expect_printed(rows[0].us[0], us, "table time");
            /* all_reduce of 2 ranks: busbw = algbw = 65536 B / -a's time */
            if (fabs(busbw - 65536.0 / (agg * 1e-6) / 1e9) > 1e-3 * busbw)
                fail_msg("-a %d -C %d: busbw %g, want %g from %g us", avg, cpu, busbw, 65536.0 / (agg * 1e-6) / 1e9, agg);
        }
}

/* -z 1 adds nccl-tests' barrier after each timed collective; -m runs m per iteration. */
static void test_bench_blocking_and_agg_iters(void** state) {
    const char* jr[2];
    int rc;
    (void)state;
    rc = bench("-B thread --np 2 -b 1K -e 1K -n 2 -m 3 -z 0 --json %s/out.json", g_dir);
    if (rc != 0) fail_msg("exit %d\n%s\n%s", rc, g_out, g_err);
    assert_int_equal(json_rows(jr, 2), 1);
    assert_int_equal((int)json_num(jr[0], "ip_calls"), 2 * 3);
    rc = bench("-B thread --np 2 -b 1K -e 1K -n 2 -m 3 -z 1 --json %s/out.json", g_dir);
    if (rc != 0) fail_msg("exit %d\n%s\n%s", rc, g_out, g_err);
    assert_int_equal(json_rows(jr, 2), 1);
    assert_int_equal((int)json_num(jr[0], "ip_calls"), 2 * 3 * 2);
}

DM_TEST_MAIN(setup, teardown,
    cmocka_unit_test(test_bench_nccl_flags_all_types),
    cmocka_unit_test(test_bench_refuses_what_it_cannot_do),
    cmocka_unit_test(test_bench_names_and_spellings),
    cmocka_unit_test(test_bench_average_and_cputime),
    cmocka_unit_test(test_bench_blocking_and_agg_iters))
