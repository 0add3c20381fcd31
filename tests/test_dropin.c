/* test_dropin: what a program that drops distmesh in sees on stderr and gets back (issue 29).
   Each case runs in a forked child whose stderr goes to a file, with the environment it needs
   (RANK / WORLD_SIZE / DISTMESH_LOG ...), so the parent checks exactly what was printed:
   - a failed create with no logger prints its reason once, prefixed with the rank, and the
     reason is dm_last_error(NULL) (per thread); with a logger of the caller's, nothing is printed
     by distmesh and the logger got it;
   - a successful start of 2 TCP ranks prints nothing (DISTMESH_LOG=info shows its info line);
   - an error of a call on a collective is returned, not printed (DISTMESH_LOG=info prints it once);
   - DISTMESH_LOG's values, a malformed one, and dm_log_stderr's use of it;
   - DM_CHECK: nothing on success; one line and EXIT_FAILURE on failure, after a failed create
     without repeating the reason already printed;
   - README.md's first screen: which define gives what, and its example (examples/readme_first.c,
     the same code, compiled by `make`) checks with DM_CHECK. */
#define _GNU_SOURCE
#include "distmesh.h"
#include "prelude.h"
#include "test_world.h"
#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

static char g_dir[256];
TMPDIR_FIXTURES(g_dir, "dm_dropin")


/* Variables a launcher around the test run may have set, which would change what dm_init does. */
static void clean_env(void) {
    static const char* const vars[] = {
        "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
        "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_ID",
        "DISTMESH_RANK", "DISTMESH_WORLD_SIZE", "DISTMESH_LOCAL_RANK", "DISTMESH_LOCAL_WORLD_SIZE",
        "DISTMESH_STORE", "DISTMESH_LOG", "DISTMESH_TIMEOUT", "TORCHELASTIC_USE_AGENT_STORE", "DISTMESH_JOIN",
    };
    size_t i;
    for (i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) unsetenv(vars[i]);
}

/* ---- one child, its stderr in a file ---- */
typedef int (*child_fn)(void* ctx);
typedef struct child_run { child_fn fn; void* ctx; char err_path[400]; } child_run;
static int _child_main(int index, void* p) {
    child_run* r = (child_run*)p;
    int fd = open(r->err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    (void)index;
    if (fd < 0 || dup2(fd, 2) < 0) return 100;
    close(fd);
    clean_env();
    return r->fn(r->ctx);
}
/* Runs fn(ctx) in a child; returns its exit code, its stderr in err (cap bytes). */
static int run_child(child_fn fn, void* ctx, char* err, size_t cap) {
    static int seq;
    child_run r;
    tw_world w;
    int code;
    r.fn = fn;
    r.ctx = ctx;
    snprintf(r.err_path, sizeof(r.err_path), "%s/stderr%d", g_dir, seq++);
    memset(&w, 0, sizeof(w));
    w.alarm_s = 60;
    if (tw_spawn(&w, "child", 0, _child_main, &r) < 0) fail_msg("fork failed");
    tw_reap(&w, 90);
    code = tw_exit_code(&w, 0);
    err[0] = 0;
    tw_read_file(r.err_path, err, cap);
    return code;
}
/* s starts with prefix, else the test fails showing s. */
#define assert_prefix(s, prefix)                                                                    \
    do {                                                                                            \
        if (strncmp((s), (prefix), strlen(prefix)) != 0) fail_msg("\"%s\" does not start with \"%s\"", (s), (prefix)); \
    } while (0)
#define assert_lines(s, n)                                                                          \
    do {                                                                                            \
        if (count_lines(s) != (n)) fail_msg("want %d line(s), got: \"%s\"", (n), (s));                 \
    } while (0)
static int count_lines(const char* s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* The child reports a result string through a file next to its stderr. */
static char g_note_path[400];
static void note(const char* fmt, ...) {
    FILE* f = fopen(g_note_path, "w");
    va_list ap;
    if (!f) return;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fclose(f);
}
static void read_note(char* out, size_t cap) {
    out[0] = 0;
    tw_read_file(g_note_path, out, cap);
}
/* run_child(fn, ctx), which must exit 0; its stderr in err, the note it left in got. */
static void run_noted(child_fn fn, void* ctx, char* err, size_t err_cap, char* got, size_t got_cap) {
    snprintf(g_note_path, sizeof(g_note_path), "%s/note", g_dir);
    assert_int_equal(run_child(fn, ctx, err, err_cap), 0);
    read_note(got, got_cap);
}

/* ---- a failed create ---- */
/* RANK / WORLD_SIZE set, no MASTER_*, no store, no launcher: dm_init cannot rendezvous. */
static int child_init_fails(void* ctx) {
    dm_collective* c = (dm_collective*)0x1;
    dm_status st;
    (void)ctx;
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "2", 1);
    st = dm_init(NULL, &c);
    note("%s|%d|%s", dm_status_name(st), c == NULL, dm_last_error(NULL));
    return st == DM_OK ? 1 : 0;
}
static void test_dropin_failed_init_prints_once_with_rank(void** state) {
    char err[4096], got[2048], *reason;
    (void)state;
    run_noted(child_init_fails, NULL, err, sizeof(err), got, sizeof(got));
    reason = strrchr(got, '|');
    assert_non_null(reason);
    reason++;
    assert_prefix(got, "DM_ERR_");
    assert_non_null(strstr(got, "|1|"));                      /* *out stays NULL */
    assert_non_null(strstr(reason, "MASTER_ADDR"));           /* the reason, readable after the failure */
    /* printed once, one line, with the rank, the same text */
    assert_lines(err, 1);
    assert_prefix(err, "distmesh rank 1: error: ");
    assert_non_null(strstr(err, reason));
}

static int g_logged;
static void count_log(dm_log_level level, dm_status status, const char* message, const char* file, int line,
                      void* user_data) {
    (void)status; (void)message; (void)file; (void)line; (void)user_data;
    if (level == DM_LOG_ERROR) g_logged++;
}
static int child_init_fails_with_logger(void* ctx) {
    dm_init_desc d;
    dm_collective* c = NULL;
    dm_status st;
    (void)ctx;
    memset(&d, 0, sizeof(d));
    d.logger.func = count_log;
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "2", 1);
    st = dm_init(&d, &c);
    note("%d|%s", g_logged, dm_last_error(NULL));
    return st == DM_OK ? 1 : 0;
}
static void test_dropin_failed_init_with_logger_prints_nothing(void** state) {
    char err[4096], got[2048];
    (void)state;
    run_noted(child_init_fails_with_logger, NULL, err, sizeof(err), got, sizeof(got));
    assert_string_equal(err, "");                               /* the caller's logger decides */
    assert_true(atoi(got) >= 1);                                /* and it got the error */
    assert_non_null(strstr(got, "MASTER_ADDR"));                /* dm_last_error(NULL) too */
}

/* A create's reason belongs to the thread that made it, and the next create clears it. */
static void* other_thread_reads(void* p) {
    snprintf((char*)p, 256, "%s", dm_last_error(NULL));
    return NULL;
}
static int child_create_error_is_per_thread(void* ctx) {
    dm_fake_desc d;
    dm_collective* c = NULL;
    pthread_t t;
    char other[256];
    int bad;
    (void)ctx;
    memset(&d, 0, sizeof(d));
    d.world_size = 2;
    d.rank = 5;
    bad = dm_fake_create(&d, &c) == DM_ERR_INVALID_ARG && strstr(dm_last_error(NULL), "rank 5") != NULL;
    pthread_create(&t, NULL, other_thread_reads, other);
    pthread_join(t, NULL);
    d.rank = 1;
    if (dm_fake_create(&d, &c) != DM_OK) return 2;
    note("%d|%s|%s", bad, other, dm_last_error(NULL));
    dm_destroy(c);
    return 0;
}
static void test_dropin_create_error_is_per_thread(void** state) {
    char err[4096], got[2048];
    (void)state;
    run_noted(child_create_error_is_per_thread, NULL, err, sizeof(err), got, sizeof(got));
    assert_string_equal(got, "1|no collective (NULL)|no collective (NULL)");
    assert_lines(err, 1);                      /* the failed create's line */
    assert_prefix(err, "distmesh: error: fake: rank 5 is not below world_size 2");
}

/* ---- a successful start, and errors after it ---- */
typedef struct start_ctx { const char* log; char store[420]; int port; } start_ctx;
static int rank_starts(int index, void* p) {
    start_ctx* s = (start_ctx*)p;
    char r[16], path[400];
    float x[4] = { 1, 2, 3, 4 };
    dm_collective* c = NULL;
    int fd;
    dm_status st;
    snprintf(path, sizeof(path), "%s/start%d", g_dir, index);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || dup2(fd, 2) < 0) return 100;
    close(fd);
    clean_env();
    snprintf(r, sizeof(r), "%d", index);
    setenv("RANK", r, 1);
    setenv("WORLD_SIZE", "2", 1);
    if (s->port > 0) {                   /* rank 0 hosts the store, as under torchrun by hand */
        snprintf(r, sizeof(r), "%d", s->port);
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        setenv("MASTER_PORT", r, 1);
    } else {
        setenv("DISTMESH_STORE", s->store, 1);
    }
    if (s->log) setenv("DISTMESH_LOG", s->log, 1);
    st = dm_init(NULL, &c);
    if (st == DM_OK) st = dm_all_reduce(c, NULL, x, 4, DM_FLOAT32, DM_SUM);
    if (st == DM_OK) st = dm_barrier(c);
    dm_destroy(c);
    return st == DM_OK ? 0 : 1;
}
static void start_two(const char* log, bool hosted, char out[2][8192]) {
    start_ctx s;
    tw_store store;
    tw_world w;
    int i;
    char path[400];
    assert_int_equal(tw_store_file(&store, "dm_dropin_store"), 0);
    s.log = log;
    s.port = hosted ? tw_free_port() : 0;
    snprintf(s.store, sizeof(s.store), "%s", store.url);
    memset(&w, 0, sizeof(w));
    w.alarm_s = 60;
    assert_int_equal(tw_fork(&w, 2, rank_starts, &s), 0);
    assert_int_equal(tw_reap(&w, 90), 0);
    tw_store_close(&store);
    for (i = 0; i < 2; i++) {
        snprintf(path, sizeof(path), "%s/start%d", g_dir, i);
        out[i][0] = 0;
        tw_read_file(path, out[i], 8192);
    }
}
static void test_dropin_successful_start_is_silent(void** state) {
    char out[2][8192];
    (void)state;
    start_two(NULL, false, out);         /* a file store */
    assert_string_equal(out[0], "");
    assert_string_equal(out[1], "");
    start_two(NULL, true, out);          /* rank 0 hosts a TCP store at MASTER_ADDR:MASTER_PORT */
    assert_string_equal(out[0], "");
    assert_string_equal(out[1], "");
    start_two("info", false, out);       /* asked: the info lines come, with the rank */
    assert_non_null(strstr(out[0], "distmesh rank 0: info: "));
    assert_non_null(strstr(out[1], "distmesh rank 1: info: "));
}

typedef struct later_ctx { const char* log; bool check; } later_ctx;
static int child_later_error(void* p) {
    later_ctx* l = (later_ctx*)p;
    dm_fake_desc d;
    dm_collective* c[3];
    float x = 1;
    dm_status st;
    int r;
    if (l->log) setenv("DISTMESH_LOG", l->log, 1);
    memset(&d, 0, sizeof(d));
    d.world_size = 3;
    if (dm_thread_world_create(&d, c) != DM_OK) return 2;
    st = dm_all_reduce(c[2], NULL, &x, 1, (dm_dtype)99, DM_SUM);   /* checked before any communication */
    note("%s|%s", dm_status_name(st), dm_last_error(c[2]));
    if (l->check) DM_CHECK(c[2], dm_all_reduce(c[2], NULL, &x, 1, (dm_dtype)99, DM_SUM));
    for (r = 0; r < 3; r++) dm_destroy(c[r]);
    return st == DM_ERR_INVALID_ARG ? 0 : 3;
}
static void test_dropin_later_error_is_returned_not_printed(void** state) {
    char err[4096], got[2048];
    later_ctx l = { NULL, false };
    (void)state;
    run_noted(child_later_error, &l, err, sizeof(err), got, sizeof(got));
    assert_prefix(got, "DM_ERR_INVALID_ARG|");
    assert_true(strlen(got) > 25);                               /* the message is on the object */
    assert_string_equal(err, "");                                /* and nowhere else */
    /* DM_CHECK of the same call: one line with the call, the place, the status, the message */
    l.check = true;
    assert_int_equal(run_child(child_later_error, &l, err, sizeof(err)), EXIT_FAILURE);
    assert_lines(err, 1);
    assert_prefix(err, "distmesh rank 2: dm_all_reduce(c[2], NULL, &x, 1, (dm_dtype)99, DM_SUM) failed at ");
    assert_non_null(strstr(err, "test_dropin.c:"));
    assert_non_null(strstr(err, "[DM_ERR_INVALID_ARG]: "));
    assert_non_null(strstr(err, strchr(got, '|') + 1));
    /* DISTMESH_LOG=info: everything, errors where they happen, once */
    l.check = false;
    l.log = "info";
    assert_int_equal(run_child(child_later_error, &l, err, sizeof(err)), 0);
    assert_lines(err, 1);
    assert_prefix(err, "distmesh rank 2: error: ");
    assert_non_null(strstr(err, strchr(got, '|') + 1));
}

/* ---- DISTMESH_LOG ---- */
static int child_log_malformed(void* ctx) {
    dm_collective* c = NULL;
    dm_status st;
    (void)ctx;
    setenv("DISTMESH_LOG", "loud", 1);
    st = dm_fake_create(NULL, &c);
    note("%s|%s", dm_status_name(st), dm_last_error(NULL));
    dm_destroy(c);
    return 0;
}
static void test_dropin_log_malformed_fails_the_create(void** state) {
    char err[4096], got[2048];
    (void)state;
    run_noted(child_log_malformed, NULL, err, sizeof(err), got, sizeof(got));
    assert_string_equal(got, "DM_ERR_ENV|env: DISTMESH_LOG=\"loud\" is not one of error, warn, info, debug");
    assert_lines(err, 1);
    assert_non_null(strstr(err, "DISTMESH_LOG=\"loud\""));
}

static int child_log_stderr(void* ctx) {
    static const char* const levels[] = { NULL, "error", "warn", "info", "debug" };
    int i, l;
    (void)ctx;
    for (i = 0; i < 5; i++) {
        if (levels[i]) setenv("DISTMESH_LOG", levels[i], 1);
        else unsetenv("DISTMESH_LOG");
        for (l = DM_LOG_ERROR; l <= DM_LOG_DEBUG; l++) {
            char msg[64];
            snprintf(msg, sizeof(msg), "level %s message %d", levels[i] ? levels[i] : "unset", l);
            dm_log_stderr((dm_log_level)l, l == DM_LOG_ERROR ? DM_ERR_TIMEOUT : DM_OK, msg, "here.c", 7, NULL);
        }
    }
    return 0;
}
static void test_dropin_log_stderr_honours_level(void** state) {
    char err[8192];
    (void)state;
    assert_int_equal(run_child(child_log_stderr, NULL, err, sizeof(err)), 0);
    /* unset = warn: levels 0..1; error: 0; warn: 0..1; info: 0..2; debug: 0..3 */
    assert_lines(err, 2 + 1 + 2 + 3 + 4);
    assert_non_null(strstr(err, "distmesh error: level unset message 0 [DM_ERR_TIMEOUT] (here.c:7)\n"));
    assert_non_null(strstr(err, "distmesh warn: level unset message 1 (here.c:7)\n"));
    assert_null(strstr(err, "level unset message 2"));
    assert_null(strstr(err, "level error message 1"));
    assert_non_null(strstr(err, "level debug message 3"));
    assert_null(strstr(err, "level info message 3"));
}

/* ---- DM_CHECK ---- */
static int child_check_ok(void* ctx) {
    dm_collective* c = NULL;
    float x = 2;
    (void)ctx;
    DM_CHECK(NULL, dm_fake_create(NULL, &c));
    DM_CHECK(c, dm_all_reduce(c, NULL, &x, 1, DM_FLOAT32, DM_SUM));
    dm_destroy(c);
    return x == 2 ? 0 : 1;
}
static int child_check_failed_init(void* ctx) {
    dm_collective* c = NULL;
    (void)ctx;
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "2", 1);
    DM_CHECK(NULL, dm_init(NULL, &c));
    return 0;                                    /* not reached */
}
static void test_dropin_check(void** state) {
    char err[4096];
    const char* second;
    (void)state;
    assert_int_equal(run_child(child_check_ok, NULL, err, sizeof(err)), 0);
    assert_string_equal(err, "");
    assert_int_equal(run_child(child_check_failed_init, NULL, err, sizeof(err)), EXIT_FAILURE);
    assert_lines(err, 2);       /* the create's reason, then where it failed */
    assert_prefix(err, "distmesh rank 1: error: ");
    assert_non_null(strstr(err, "MASTER_ADDR"));
    second = strchr(err, '\n') + 1;
    assert_prefix(second, "distmesh rank 1: dm_init(NULL, &c) failed at ");
    assert_non_null(strstr(second, "test_dropin.c:"));
    assert_non_null(strstr(second, "[DM_ERR_ENV] (the reason is above)\n"));
    assert_null(strstr(second, "MASTER_ADDR"));  /* not twice */
}

/* ---- the README's first screen ---- */
/* README.md's first C block is examples/readme_first.c (which `make` compiles) without its
   opening comment, it checks with DM_CHECK, and the first screen says which define gives what. */
static void test_dropin_readme_first_screen(void** state) {
    static char readme[1 << 17], example[8192];
    const char *block, *end, *code, *screen_end;
    (void)state;
    assert_true(tw_read_file(DM_SRCDIR "/README.md", readme, sizeof(readme)) > 0);
    assert_true(tw_read_file(DM_SRCDIR "/examples/readme_first.c", example, sizeof(example)) > 0);
    block = strstr(readme, "```c\n");
    assert_non_null(block);
    block += 5;
    end = strstr(block, "```\n");
    assert_non_null(end);
    code = strstr(example, "*/\n");
    assert_non_null(code);
    code += 3;
    if (strlen(code) != (size_t)(end - block) || strncmp(code, block, (size_t)(end - block)) != 0)
        fail_msg("README.md's first C block differs from examples/readme_first.c");
    assert_non_null(strstr(code, "DM_CHECK(c, dm_all_reduce("));
    assert_non_null(strstr(code, "DM_CHECK(NULL, dm_thread_world_run("));
    screen_end = strstr(readme, "## API overview");
    assert_non_null(screen_end);
    readme[screen_end - readme] = 0;
    assert_non_null(strstr(readme, "| processes on one host | `DISTMESH_TCP`"));
    assert_non_null(strstr(readme, "shared memory between them"));
    assert_non_null(strstr(readme, "| processes on several hosts | `DISTMESH_TCP`"));
    assert_non_null(strstr(readme, "| GPUs, one per process | `DISTMESH_NCCL`"));
}

DM_TEST_MAIN(tmpdir_setup, tmpdir_teardown,
    cmocka_unit_test(test_dropin_failed_init_prints_once_with_rank),
    cmocka_unit_test(test_dropin_failed_init_with_logger_prints_nothing),
    cmocka_unit_test(test_dropin_create_error_is_per_thread),
    cmocka_unit_test(test_dropin_successful_start_is_silent),
    cmocka_unit_test(test_dropin_later_error_is_returned_not_printed),
    cmocka_unit_test(test_dropin_log_malformed_fails_the_create),
    cmocka_unit_test(test_dropin_log_stderr_honours_level),
    cmocka_unit_test(test_dropin_check),
    cmocka_unit_test(test_dropin_readme_first_screen))
