/* Every store operation through each kind's operations table (distmesh_store.h, >>store tcp ops
   and >>store file ops), with the same expected results, and what the common layer does around
   them (keys, prefix, last error, a broken connection). Built twice (tests/store.mk):
   - with DISTMESH_TCP: the tcp kind against a server this process hosts; and the causes of
     >>store codes against libuv's own names and texts, code by code;
   - with DISTMESH_STORE alone, no libuv on the command line nor at link (tests/no_libuv/uv.h
     stops any include of uv.h): the tcp kind against a server in another process
     (tests/fixtures/store_tool serve, built with DISTMESH_TCP), hosting refused with
     DM_ERR_UNSUPPORTED and a message, torchrun's agent store still reachable.
   Loopback only; every blocking step has a deadline. */
#define DISTMESH_IMPLEMENTATION
#include "distmesh.h"
#include "test_util.h"

#include "prelude.h"
#include "test_tmpdir.h"

#include <errno.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#if !defined(DISTMESH_STORE_H)
#error "build with -DDISTMESH_TCP or -DDISTMESH_STORE"
#endif
#if !defined(DISTMESH_TCP) && !defined(DM_STORE_TOOL)
#error "without DISTMESH_TCP, DM_STORE_TOOL names the store_tool that hosts a server"
#endif

#define CHECK_MSG(s, text) do { if (!strstr(dm_store_last_error(s), (text)))                      \
        fail_msg("last error \"%s\" lacks \"%s\"", dm_store_last_error(s), (text)); } while (0)

static char g_dir[256];
TMPDIR_FIXTURES(g_dir, "dm_store_kinds")
static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- a server: hosted here (with libuv), else store_tool in a child process ---- */
typedef struct server {
    dm_store* hosted;           /* with DISTMESH_TCP */
    pid_t pid;                  /* else the child, serving until its stdin closes */
    int stdin_fd;
    int port;
    char url[64];               /* tcp://127.0.0.1:<port> */
} server;

static void server_start(server* sv) {
    memset(sv, 0, sizeof(*sv));
    sv->stdin_fd = -1;
#if defined(DISTMESH_TCP)
    {
        dm_store_desc d;
        memset(&d, 0, sizeof(d));
        d.url = "tcp://127.0.0.1:0";
        d.is_server = true;
        d.timeout_ms = 5000;
        CHECK_OK(dm_store_create(&d, &sv->hosted));
        sv->port = dm_store_port(sv->hosted);
    }
#else
    {
        char port_file[300];
        int in[2];
        int64_t deadline = now_ms() + 10000;
        snprintf(port_file, sizeof(port_file), "%s/port.%d", g_dir, (int)getpid());
        unlink(port_file);
        CHECK(pipe(in) == 0);
        sv->pid = fork();
        CHECK(sv->pid >= 0);
        if (sv->pid == 0) {
            dup2(in[0], 0);
            close(in[0]);
            close(in[1]);
            execl(DM_STORE_TOOL, DM_STORE_TOOL, "serve", port_file, (char*)NULL);
            _exit(127);
        }
        close(in[0]);
        sv->stdin_fd = in[1];
        while (sv->port <= 0 && now_ms() < deadline) {
            FILE* f = fopen(port_file, "r");
            struct timespec ts = { 0, 10 * 1000000L };
            if (f) {
                if (fscanf(f, "%d", &sv->port) != 1) sv->port = 0;
                fclose(f);
            }
            if (sv->port <= 0) nanosleep(&ts, NULL);
        }
        CHECK(sv->port > 0);
    }
#endif
    snprintf(sv->url, sizeof(sv->url), "tcp://127.0.0.1:%d", sv->port);
}
/* Stops the server (its connections close); waits for the child with a deadline. */
static void server_stop(server* sv) {
    dm_store_destroy(sv->hosted);
    sv->hosted = NULL;
    if (sv->stdin_fd >= 0) close(sv->stdin_fd);
    sv->stdin_fd = -1;
    if (sv->pid > 0) {
        int64_t deadline = now_ms() + 10000;
        int status = 0;
        pid_t r;
        while ((r = waitpid(sv->pid, &status, WNOHANG)) == 0 && now_ms() < deadline) {
            struct timespec ts = { 0, 10 * 1000000L };
            nanosleep(&ts, NULL);
        }
        if (r == 0) {
            kill(sv->pid, SIGKILL);
            waitpid(sv->pid, &status, 0);
        }
        CHECK(r == sv->pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
        sv->pid = 0;
    }
}

static dm_store* open_url(const char* url, const char* prefix) {
    dm_store_desc d;
    dm_store* s = NULL;
    memset(&d, 0, sizeof(d));
    d.url = url;
    d.prefix = prefix;
    d.timeout_ms = 5000;
    CHECK_OK(dm_store_create(&d, &s));
    return s;
}

static void get_is(dm_store* s, const char* key, const char* want, size_t want_n) {
    void* v = NULL;
    size_t n = 99;
    CHECK_OK(dm_store_get(s, key, &v, &n));
    CHECK(v != NULL);
    assert_int_equal(n, want_n);
    CHECK(want_n == 0 || memcmp(v, want, want_n) == 0);
    dm_store_free(s, v);
}
/* *d zeroed, then url with timeout_ms, logging to g_tu_log (cleared). */
static void logged_desc(dm_store_desc* d, const char* url, int timeout_ms) {
    memset(d, 0, sizeof(*d));
    d->url = url;
    d->timeout_ms = timeout_ms;
    d->logger.func = tu_capture_log;
    g_tu_log.msg[0] = 0;
}
/* dm_store_check of keys[0..n) answers want. */
static void check_is(dm_store* s, const char* const* keys, size_t n, bool want) {
    bool b = !want;
    CHECK_OK(dm_store_check(s, keys, n, &b));
    CHECK(b == want);
}
static void compare_set_is(dm_store* s, const char* key, const char* expected, const char* desired, const char* want) {
    void* v = NULL;
    size_t n = 99;
    CHECK_OK(dm_store_compare_set(s, key, expected, strlen(expected), desired, strlen(desired), &v, &n));
    assert_int_equal(n, strlen(want));
    CHECK(memcmp(v, want, n) == 0);
    dm_store_free(s, v);
}

/* A request with a reply on s: what s sent before (SET, APPEND and MULTI_SET have no reply) has
   been served once it returns, so another connection then sees it. */
static void served(dm_store* s) {
    int64_t n = 0;
    CHECK_OK(dm_store_num_keys(s, &n));
}

/* Every slot once or more on s, read back through other (a second handle with the same prefix:
   another connection, or another create on the same directory). Starts from an empty store;
   leaves 6 keys in it. */
static void every_operation(dm_store* s, dm_store* other) {
    int64_t x = 0;
    bool b = false;
    /* set, get (through the other handle), the empty value */
    CHECK_OK(dm_store_set(s, "a", "hello", 5));
    get_is(other, "a", "hello", 5);
    CHECK_OK(dm_store_set(s, "a", "bye", 3));                 /* replaced */
    served(s);
    get_is(other, "a", "bye", 3);
    CHECK_OK(dm_store_set(s, "empty", NULL, 0));
    get_is(other, "empty", "", 0);
    /* append: a missing key is created */
    CHECK_OK(dm_store_append(s, "log", "ab", 2));
    served(s);
    CHECK_OK(dm_store_append(other, "log", "cd", 2));
    served(other);
    get_is(s, "log", "abcd", 4);
    /* add: decimal text, a missing key counts as 0 */
    CHECK_OK(dm_store_add(s, "n", 40, &x));
    assert_int_equal(x, 40);
    CHECK_OK(dm_store_add(other, "n", 2, &x));
    assert_int_equal(x, 42);
    CHECK_OK(dm_store_add(s, "n", -50, NULL));                /* out may be NULL */
    get_is(s, "n", "-8", 2);
    /* compare_set: every branch */
    compare_set_is(s, "cas", "", "one", "one");               /* missing, expected empty: set */
    compare_set_is(s, "cas", "two", "three", "one");          /* mismatch: the value held */
    compare_set_is(other, "cas", "one", "three", "three");    /* match: swapped */
    compare_set_is(s, "nokey", "exp", "des", "exp");          /* missing, expected set: not set */
    CHECK_OK(dm_store_compare_set(s, "cas", "three", 5, "four", 4, NULL, NULL));  /* no out */
    get_is(s, "cas", "four", 4);
    /* check and wait */
    {
        const char* k[3] = { "a", "cas", "nokey" };
        int64_t t0;
        check_is(s, k, 2, true);
        check_is(s, k, 3, false);
        check_is(s, k, 0, true);
        CHECK_OK(dm_store_wait(s, k, 2, 1000));
        t0 = now_ms();
        assert_int_equal(dm_store_wait(s, k, 3, 300), DM_ERR_TIMEOUT);
        CHECK(now_ms() - t0 >= 290);
        CHECK_MSG(s, "\"k/nokey\"");
        CHECK_MSG(s, "timed out after 300 ms");
    }
    /* delete */
    CHECK_OK(dm_store_delete(s, "a", &b));
    CHECK(b);
    CHECK_OK(dm_store_delete(other, "a", &b));
    CHECK(!b);
    CHECK_OK(dm_store_delete(s, "a", NULL));
    CHECK_OK(dm_store_check(other, (const char* const[]){ "a" }, 1, &b));
    CHECK(!b);
    /* multi_set, multi_get */
    {
        const char* keys[2] = { "m1", "m2" };
        const void* vals[2] = { "x", "yy" };
        size_t sizes[2] = { 1, 2 };
        void* outv[2] = { NULL, NULL };
        size_t outn[2] = { 9, 9 };
        CHECK_OK(dm_store_multi_set(s, keys, vals, sizes, 2));
        CHECK_OK(dm_store_multi_get(other, keys, 2, outv, outn));
        CHECK(outn[0] == 1 && memcmp(outv[0], "x", 1) == 0);
        CHECK(outn[1] == 2 && memcmp(outv[1], "yy", 2) == 0);
        dm_store_free(other, outv[0]);
        dm_store_free(other, outv[1]);
        CHECK_OK(dm_store_multi_set(s, keys, vals, sizes, 0));
        CHECK_OK(dm_store_multi_get(s, keys, 0, NULL, NULL));
    }
    /* num_keys: empty, log, n, cas, m1, m2 */
    CHECK_OK(dm_store_num_keys(s, &x));
    assert_int_equal(x, 6);
    /* the common checks, the same for every kind */
    assert_int_equal(dm_store_set(s, NULL, "x", 1), DM_ERR_INVALID_ARG);
    CHECK_MSG(s, "set: key is NULL");
    assert_int_equal(dm_store_append(s, "k", NULL, 1), DM_ERR_INVALID_ARG);
    CHECK_MSG(s, "append: value is NULL");
    assert_int_equal(dm_store_get(s, "k", NULL, NULL), DM_ERR_INVALID_ARG);
    assert_int_equal(dm_store_wait(s, NULL, 1, 100), DM_ERR_INVALID_ARG);
    CHECK_MSG(s, "wait: keys is NULL");
    assert_int_equal(dm_store_check(s, (const char* const[]){ "a", NULL }, 2, &b), DM_ERR_INVALID_ARG);
    CHECK_MSG(s, "check: key is NULL");
    assert_int_equal(dm_store_compare_set(s, "cas", NULL, 1, "x", 1, NULL, NULL), DM_ERR_INVALID_ARG);
    assert_int_equal(dm_store_multi_set(s, (const char* const[]){ "m1" }, NULL, NULL, 1), DM_ERR_INVALID_ARG);
    {
        char* longkey = (char*)malloc(DM_STORE_MAX_KEY + 1);
        memset(longkey, 'k', DM_STORE_MAX_KEY);
        longkey[DM_STORE_MAX_KEY - 1] = 0;                      /* with the 2-byte prefix: one too long */
        assert_int_equal(dm_store_add(s, longkey, 1, &x), DM_ERR_INVALID_ARG);
        CHECK_MSG(s, "add: key longer than DM_STORE_MAX_KEY");
        free(longkey);
    }
    /* none of that reached the store; the last error clears on success */
    CHECK_OK(dm_store_num_keys(s, &x));
    assert_int_equal(x, 6);
    assert_string_equal(dm_store_last_error(s), "");
}

/* The tcp kind: every operation, with a clone (sharing the connection) as the second handle and a
   second connection for what the server holds; the port is the server's. */
static void test_kinds_tcp_every_operation(void** state) {
    server sv;
    dm_store *s, *clone = NULL, *other;
    (void)state;
    server_start(&sv);
    s = open_url(sv.url, "k/");
    other = open_url(sv.url, "k/");
    assert_int_equal(dm_store_port(s), sv.port);
    every_operation(s, other);
    /* a clone shares the connection and adds its prefix */
    CHECK_OK(dm_store_clone_prefixed(s, "c/", &clone));
    CHECK_OK(dm_store_set(clone, "x", "1", 1));
    get_is(other, "c/x", "1", 1);
    assert_int_equal(dm_store_port(clone), sv.port);
    dm_store_destroy(s);                /* the clone keeps the connection */
    get_is(clone, "x", "1", 1);
    dm_store_destroy(clone);
    dm_store_destroy(other);
    server_stop(&sv);
}

/* The file kind: every operation, with a second create on the same directory as the second
   handle; each key is a file there, and the port is 0. */
static void test_kinds_file_every_operation(void** state) {
    char dir[300], url[320], path[400];
    dm_store *s, *clone = NULL, *other;
    struct stat stt;
    (void)state;
    snprintf(dir, sizeof(dir), "%s/file_kind", g_dir);
    snprintf(url, sizeof(url), "file://%s", dir);
    s = open_url(url, "k/");
    other = open_url(url, "k/");
    assert_int_equal(dm_store_port(s), 0);
    every_operation(s, other);
    snprintf(path, sizeof(path), "%s/%s", dir, "6b2f6c6f67");   /* "k/log" in hex */
    CHECK(stat(path, &stt) == 0 && stt.st_size == 4);
    CHECK_OK(dm_store_clone_prefixed(s, "c/", &clone));
    CHECK_OK(dm_store_set(clone, "x", "1", 1));
    get_is(other, "c/x", "1", 1);
    assert_int_equal(dm_store_port(clone), 0);
    dm_store_destroy(s);
    get_is(clone, "x", "1", 1);
    dm_store_destroy(clone);
    dm_store_destroy(other);
}

/* A url no kind takes: the message lists every kind's forms (>>store kinds). */
static void test_kinds_bad_url_lists_every_kind(void** state) {
    dm_store_desc d;
    dm_store* s = (dm_store*)&d;
    (void)state;
    memset(&d, 0, sizeof(d));
    d.url = "redis://127.0.0.1:6379";
    d.logger.func = tu_capture_log;
    g_tu_log.msg[0] = 0;
    assert_int_equal(dm_store_create(&d, &s), DM_ERR_INVALID_ARG);
    CHECK(s == NULL);
    assert_string_equal(g_tu_log.msg, "tcp-store: bad store url \"redis://127.0.0.1:6379\" (expected tcp://host:port, "
                               "tcp://[v6]:port or file:///dir)");
    d.url = "tcp://127.0.0.1";                  /* the kind's own parse says the same */
    assert_int_equal(dm_store_create(&d, &s), DM_ERR_INVALID_ARG);
    CHECK(strstr(g_tu_log.msg, "(expected tcp://host:port, tcp://[v6]:port or file:///dir)") != NULL);
    d.url = "file://relative/dir";
    assert_int_equal(dm_store_create(&d, &s), DM_ERR_INVALID_ARG);
    CHECK(strstr(g_tu_log.msg, "needs an absolute path") != NULL);
}

/* The server goes away: the call in flight fails with DM_ERR_PEER_LOST, and every later call
   at once, saying the connection is unusable and why (the common layer's check). */
static void test_kinds_tcp_broken_connection(void** state) {
    server sv;
    char where[64];
    dm_store* s;
    int64_t x = 0;
    (void)state;
    server_start(&sv);
    snprintf(where, sizeof(where), "connection to 127.0.0.1:%d is unusable", sv.port);
    s = open_url(sv.url, "");
    CHECK_OK(dm_store_add(s, "n", 1, &x));
    server_stop(&sv);
    assert_int_equal(dm_store_add(s, "n", 1, &x), DM_ERR_PEER_LOST);
    CHECK_MSG(s, "add with 127.0.0.1");
    assert_int_equal(dm_store_num_keys(s, &x), DM_ERR_PEER_LOST);
    CHECK_MSG(s, where);
    CHECK_MSG(s, "(add: ");
    dm_store_destroy(s);
}

/* A refused connect names its cause as libuv would ("ECONNREFUSED: connection refused"), with
   or without libuv in the build. */
static void test_kinds_connect_cause_worded_as_libuv(void** state) {
    server sv;
    dm_store_desc d;
    dm_store* s = NULL;
    (void)state;
    server_start(&sv);                          /* a port that was just free: closed again */
    server_stop(&sv);
    logged_desc(&d, sv.url, 300);
    assert_int_equal(dm_store_create(&d, &s), DM_ERR_TIMEOUT);
    CHECK(s == NULL);
    if (!strstr(g_tu_log.msg, "(ECONNREFUSED: connection refused)")) print_message("log: %s\n", g_tu_log.msg);
    CHECK(strstr(g_tu_log.msg, "(ECONNREFUSED: connection refused)") != NULL);
}

#if defined(DISTMESH_TCP)
/* The translation the store made with libuv's codes before its client and file store left
   libuv (kept here to compare). */
static dm_status status_from_uv(int uv_code) {
    switch (uv_code) {
    case 0: return DM_OK;
    case UV_ETIMEDOUT: return DM_ERR_TIMEOUT;
    case UV_ECONNRESET: case UV_EPIPE: case UV_EOF: case UV_ECONNABORTED: case UV_ENOTCONN:
        return DM_ERR_PEER_LOST;
    case UV_ENOMEM: case UV_ENOBUFS: return DM_ERR_OUT_OF_MEMORY;
    case UV_EINVAL: return DM_ERR_INVALID_ARG;
    case UV_ENOENT: case UV_EACCES: case UV_EPERM: case UV_EEXIST: case UV_ENOSPC: case UV_EROFS:
    case UV_EISDIR: case UV_ENOTDIR: case UV_ENAMETOOLONG: case UV_EIO: case UV_EMFILE:
    case UV_ENFILE:
        return DM_ERR_IO;
    default: return DM_ERR_NETWORK;
    }
}
/* Every code's cause as >>store codes words it, against libuv's uv_err_name and uv_strerror,
   and its status against libuv's codes: every message and status the store gave when it called
   libuv stays the same. */
static void test_kinds_causes_match_libuv(void** state) {
    int extra[3] = { UV_EOF, UV_EAI_AGAIN, UV_EAI_NONAME };
    int code, wrong = 0;
    (void)state;
    for (code = -160; code < 3; code++) {
        char ours[200], name[100], text[100], theirs[220];
        int c = code < 0 ? code : extra[code];
        _dm_st_cause(c, ours, sizeof(ours));
        uv_err_name_r(c, name, sizeof(name));
        uv_strerror_r(c, text, sizeof(text));
        snprintf(theirs, sizeof(theirs), "%s: %s", name, text);
        if (strcmp(ours, theirs) != 0) {
            print_message("code %d: \"%s\", libuv \"%s\"\n", c, ours, theirs);
            wrong++;
        }
        if (_dm_st_status(c) != status_from_uv(c)) {
            print_message("code %d: %s, libuv's code %s\n", c, dm_status_name(_dm_st_status(c)),
                          dm_status_name(status_from_uv(c)));
            wrong++;
        }
    }
    assert_int_equal(wrong, 0);
}
#else
/* Without libuv there is no server: hosting is refused with a status and a message that says
   what to do; a client of torchrun's agent store (is_server ignored) and a file store work. */
static void test_kinds_hosting_without_libuv_is_refused(void** state) {
    server sv;
    dm_store_desc d;
    dm_store* s = NULL;
    (void)state;
    logged_desc(&d, "tcp://127.0.0.1:0", 2000);
    d.is_server = true;
    unsetenv("TORCHELASTIC_USE_AGENT_STORE");
    assert_int_equal(dm_store_create(&d, &s), DM_ERR_UNSUPPORTED);
    CHECK(s == NULL);
    assert_int_equal(g_tu_log.status, DM_ERR_UNSUPPORTED);
    CHECK(strstr(g_tu_log.msg, "tcp-store: server tcp://127.0.0.1:0: this build cannot host a store") != NULL);
    CHECK(strstr(g_tu_log.msg, "DISTMESH_TCP") != NULL && strstr(g_tu_log.msg, "file:///dir") != NULL);
    server_start(&sv);
    d.url = sv.url;
    setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
    CHECK_OK(dm_store_create(&d, &s));          /* the agent serves it: a client */
    unsetenv("TORCHELASTIC_USE_AGENT_STORE");
    CHECK_OK(dm_store_set(s, "x", "1", 1));
    get_is(s, "x", "1", 1);
    dm_store_destroy(s);
    server_stop(&sv);
}
#endif


/* A server thread's peer may close first: SIGPIPE must not end the program. */
static int kinds_setup(void** state) {
    signal(SIGPIPE, SIG_IGN);
    return tmpdir_setup(state);
}
#if defined(DISTMESH_TCP)
#define KINDS_BUILD_TEST test_kinds_causes_match_libuv
#else
#define KINDS_BUILD_TEST test_kinds_hosting_without_libuv_is_refused
#endif
DM_TEST_MAIN(kinds_setup, tmpdir_teardown,
    cmocka_unit_test(test_kinds_tcp_every_operation),
    cmocka_unit_test(test_kinds_file_every_operation),
    cmocka_unit_test(test_kinds_bad_url_lists_every_kind),
    cmocka_unit_test(test_kinds_tcp_broken_connection),
    cmocka_unit_test(test_kinds_connect_cause_worded_as_libuv),
    cmocka_unit_test(KINDS_BUILD_TEST))
