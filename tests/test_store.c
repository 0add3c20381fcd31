/* Tests of the rendezvous stores (distmesh_store.h): the c10d
   TCPStore wire protocol byte for byte (server against a raw socket, client against a scripted
   fake server, both from bytes recorded from torch 2.11, tests/fixtures/torch-2.11-wire.jsonl),
   every operation, concurrency (threads and forked processes), timeouts, malformed input, port 0,
   IPv6 loopback, the file store with concurrent processes, env urls, clones, fd hygiene.
   Loopback only; every blocking step has a deadline. */
#define _GNU_SOURCE
#include "prelude.h"

#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "distmesh.h"
#if !defined(DISTMESH_STORE_H) || !defined(DISTMESH_TCP)
#error "build with -DDISTMESH_TCP: distmesh.h then includes distmesh_store.h with its server"
#endif
#include "test_world.h"


/* ---- helpers ---- */

static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int g_protocol_errors;     /* the server thread counts, the test reads */
static char g_last_log[512];
static void capture_log(dm_log_level level, dm_status status, const char* msg, const char* file, int line, void* ud) {
    (void)level; (void)file; (void)line; (void)ud;
    pthread_mutex_lock(&g_log_mu);
    if (status == DM_ERR_PROTOCOL) g_protocol_errors++;
    snprintf(g_last_log, sizeof(g_last_log), "%s", msg);
    pthread_mutex_unlock(&g_log_mu);
}
static int protocol_errors(void) { return atomic_load(&g_protocol_errors); }

/* dm_store_create of url: a server or a client, keys under prefix (NULL: none), a deadline
   of timeout_ms, logging through log (NULL: silent). *out is NULL when it fails. */
static dm_status open_store(const char* url, const char* prefix, bool is_server, dm_log_fn log, int timeout_ms,
                            dm_store** out) {
    dm_store_desc d;
    memset(&d, 0, sizeof(d));
    d.url = url;
    d.prefix = prefix;
    d.is_server = is_server;
    d.logger.func = log;
    d.timeout_ms = timeout_ms;
    *out = NULL;
    return dm_store_create(&d, out);
}
static dm_store* make_server(const char* host, int timeout_ms) {
    char url[128];
    dm_store* s = NULL;
    snprintf(url, sizeof(url), "tcp://%s:0", host);
    CHECK_OK(open_store(url, NULL, true, capture_log, timeout_ms, &s));
    CHECK(dm_store_port(s) > 0);
    return s;
}
/* NULL when it cannot connect. */
static dm_store* make_client(const char* host, int port, const char* prefix, int timeout_ms) {
    char url[128];
    dm_store* s = NULL;
    if (strchr(host, ':')) snprintf(url, sizeof(url), "tcp://[%s]:%d", host, port);
    else snprintf(url, sizeof(url), "tcp://%s:%d", host, port);
    open_store(url, prefix, false, NULL, timeout_ms, &s);
    return s;
}

/* The PING nonce of our client: the pid, top byte 'D' (a distmesh client). */
static uint32_t client_nonce(void) { return 0x44000000u | ((uint32_t)getpid() & 0xFFFFFFu); }

/* What our client sends on connect (VALIDATE, then PING with client_nonce()), in hex, and
   the nonce alone, little-endian in hex: what a store echoes back. */
typedef struct our_connect { char c2s[64], echo[16]; } our_connect;
static void our_connect_hex(our_connect* oc) {
    uint32_t pid = client_nonce();
    unsigned char le[4];
    le[0] = (unsigned char)pid; le[1] = (unsigned char)(pid >> 8);
    le[2] = (unsigned char)(pid >> 16); le[3] = (unsigned char)(pid >> 24);
    tohex(le, 4, oc->echo);
    snprintf(oc->c2s, sizeof(oc->c2s), "00cef7853c0d%s", oc->echo);
}

/* dm_store_check of keys[0..n) answers want. */
static void check_is(dm_store* s, const char* const* keys, size_t n, bool want) {
    bool b = !want;
    CHECK_OK(dm_store_check(s, keys, n, &b));
    CHECK(b == want);
}
/* dm_store_get of key answers the n bytes want (a buffer even for n 0). */
static void check_get(dm_store* s, const char* key, const void* want, size_t n) {
    void* v = NULL;
    size_t vn = 0;
    bool same;
    dm_status st = dm_store_get(s, key, &v, &vn);
    if (st != DM_OK) fail_msg("get \"%s\" -> %s: %s", key, dm_status_name(st), dm_store_last_error(s));
    same = v != NULL && vn == n && memcmp(v, want, n) == 0;
    dm_store_free(s, v);
    if (!same) fail_msg("get \"%s\": %zu bytes, not the %zu bytes wanted", key, vn, n);
}
/* dm_store_compare_set(key, expected, desired) answers want (each a string, its bytes without
   the NUL). */
static void check_cas(dm_store* s, const char* key, const char* expected, const char* desired, const char* want) {
    void* v = NULL;
    size_t vn = 0, n = strlen(want);
    bool same;
    dm_status st = dm_store_compare_set(s, key, expected, strlen(expected), desired, strlen(desired), &v, &vn);
    if (st != DM_OK)
        fail_msg("compare_set \"%s\" -> %s: %s", key, dm_status_name(st), dm_store_last_error(s));
    same = vn == n && memcmp(v, want, n) == 0;
    if (!same)
        print_message("compare_set \"%s\" \"%s\" -> \"%s\": got %zu bytes \"%.*s\", want \"%s\"\n", key, expected,
                      desired, vn, (int)vn, vn ? (const char*)v : "", want);
    dm_store_free(s, v);
    CHECK(same);
}
/* multi_set of m1 = "x" and m2 = "yy", then multi_get answers both. */
static void check_multi(dm_store* s) {
    const char* keys[2] = {"m1", "m2"};
    const void* vals[2] = {"x", "yy"};
    size_t sizes[2] = {1, 2};
    void* outv[2];
    size_t outn[2];
    CHECK_OK(dm_store_multi_set(s, keys, vals, sizes, 2));
    CHECK_OK(dm_store_multi_get(s, keys, 2, outv, outn));
    CHECK(outn[0] == 1 && outn[1] == 2 && memcmp(outv[0], "x", 1) == 0 && memcmp(outv[1], "yy", 2) == 0);
    dm_store_free(s, outv[0]);
    dm_store_free(s, outv[1]);
}
/* num_keys answers nkeys; deleting key says it was there, deleting it again that it was not. */
static void check_keys_then_delete(dm_store* s, int64_t nkeys, const char* key) {
    int64_t x = -1;
    bool b = false;
    CHECK_OK(dm_store_num_keys(s, &x));
    assert_int_equal(x, nkeys);
    CHECK_OK(dm_store_delete(s, key, &b));
    CHECK(b);
    CHECK_OK(dm_store_delete(s, key, &b));
    CHECK(!b);
}
/* Raw client socket to 127.0.0.1 (or ::1) with 5 s send/recv timeouts. */
static int raw_connect(int family, int port) {
    int fd = tw_connect_loopback(family, port, 5);
    CHECK(fd >= 0);
    return fd;
}
static void send_raw(int fd, const void* p, size_t n) {
    const unsigned char* b = (const unsigned char*)p;
    while (n) {
        ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
        if (w <= 0) return;    /* the server may already have closed us: checked by the caller */
        b += w;
        n -= (size_t)w;
    }
}
static void send_hex(int fd, const char* hex) {
    unsigned char buf[4096];
    size_t n = unhex(hex, buf, sizeof(buf));
    send_raw(fd, buf, n);
}
static void expect_hex(int fd, const char* hex, const char* what) {
    unsigned char want[4096], got[4096];
    char gh[8200];
    size_t n = unhex(hex, want, sizeof(want)), g = tw_recv_n(fd, got, n);
    tohex(got, g, gh);
    if (g != n || memcmp(want, got, n) != 0) print_message("%s: expected %s got %s\n", what, hex, gh);
    assert_string_equal(gh, hex);
}
/* Nothing arrives within ms. */
static void expect_silence(int fd, int ms) {
    struct pollfd pf;
    pf.fd = fd;
    pf.events = POLLIN;
    pf.revents = 0;
    assert_int_equal(poll(&pf, 1, ms), 0);
}
/* The peer closes the connection (EOF or reset) within 5 s. */
static void expect_closed(int fd) {
    unsigned char b[256];
    int64_t end = tw_now_ms() + 5000;
    for (;;) {
        ssize_t r = recv(fd, b, sizeof(b), 0);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) return;
        CHECK(tw_now_ms() < end);
    }
}

/* ---- fixtures recorded from torch 2.11 (client and both servers agree byte for byte) ---- */
typedef struct wire_step {
    const char* what;
    const char* c2s;
    const char* s2c;        /* "" -> no reply; "-" -> silence, then CANCEL_WAIT 0c -> 01 */
} wire_step;
static const wire_step k_torch_wire[] = {
    {"connect: VALIDATE + PING", "00cef7853c0d7f020000", "7f020000"},
    {"set /k1=v1", "0103000000000000002f6b3102000000000000007631", ""},
    {"get /k1: wait", "06010000000000000003000000000000002f6b31", "00"},
    {"get /k1", "0303000000000000002f6b31", "02000000000000007631"},
    {"add /cnt 5", "0404000000000000002f636e740500000000000000", "0500000000000000"},
    {"add /cnt -7", "0404000000000000002f636e74f9ffffffffffffff", "feffffffffffffff"},
    {"compare_set /k1 v1->v2", "0203000000000000002f6b310200000000000000763102000000000000007632", "02000000000000007632"},
    {"compare_set /k1 zz->v3 (mismatch)", "0203000000000000002f6b3102000000000000007a7a02000000000000007633", "02000000000000007632"},
    {"compare_set /miss ''->new", "0205000000000000002f6d697373000000000000000003000000000000006e6577", "03000000000000006e6577"},
    {"compare_set /miss2 x->y", "0206000000000000002f6d69737332010000000000000078010000000000000079", "010000000000000078"},
    {"check [/k1,/nope]", "05020000000000000003000000000000002f6b3105000000000000002f6e6f7065", "01"},
    {"check [/k1]", "05010000000000000003000000000000002f6b31", "00"},
    {"wait [/k1]", "06010000000000000003000000000000002f6b31", "00"},
    {"wait [/nokey] times out", "06010000000000000006000000000000002f6e6f6b6579", "-"},
    {"num_keys", "07", "0300000000000000"},
    {"delete /k1", "0803000000000000002f6b31", "0100000000000000"},
    {"delete /k1 again", "0803000000000000002f6b31", "0000000000000000"},
    {"append /ap a", "0903000000000000002f6170010000000000000061", ""},
    {"append /ap bc", "0903000000000000002f617002000000000000006263", ""},
    {"multi_set /m1=x /m2=yy", "0b020000000000000003000000000000002f6d3101000000000000007803000000000000002f6d3202000000000000007979", ""},
    {"multi_get: wait", "06020000000000000003000000000000002f6d3103000000000000002f6d32", "00"},
    {"multi_get", "0a020000000000000003000000000000002f6d3103000000000000002f6d32", "01000000000000007802000000000000007979"},
    {"PrefixStore(pg/) set a=b", "0106000000000000002f70672f2f61010000000000000062", ""},
    {"get /absent: wait times out", "06010000000000000007000000000000002f616273656e74", "-"},
    {"set /e=''", "0102000000000000002f650000000000000000", ""},
    /* not in the capture: follow-ups that pin the server's state after the steps above */
    {"get /ap", "0303000000000000002f6170", "0300000000000000616263"},
    {"get missing: empty value", "0305000000000000002f6e6f6e65", "0000000000000000"},
    {"num_keys", "07", "0700000000000000"},
};

static void test_server_wire_matches_torch(void** state) {
    dm_store* srv = make_server("127.0.0.1", 5000);
    int fd = raw_connect(AF_INET, dm_store_port(srv));
    size_t i;
    (void)state;
    for (i = 0; i < sizeof(k_torch_wire) / sizeof(k_torch_wire[0]); i++) {
        const wire_step* w = &k_torch_wire[i];
        send_hex(fd, w->c2s);
        if (strcmp(w->s2c, "-") == 0) {
            expect_silence(fd, 100);
            send_hex(fd, "0c");
            expect_hex(fd, "01", w->what);
        } else if (w->s2c[0]) {
            expect_hex(fd, w->s2c, w->what);
        }
    }
    /* a wait that is answered later: registered, then woken by another client's set */
    send_hex(fd, "06010000000000000005000000000000002f6c617465");   /* wait [/late] */
    expect_silence(fd, 50);
    {
        dm_store* c = make_client("127.0.0.1", dm_store_port(srv), "/", 5000);
        CHECK(c);
        CHECK_OK(dm_store_set(c, "late", "1", 1));
        dm_store_destroy(c);
    }
    expect_hex(fd, "00", "wait woken by a set");
    close(fd);
    dm_store_destroy(srv);
}

/* ---- scripted fake server for the client side ---- */
typedef struct fake_server {
    int lfd, port;
    pthread_t th;
    const wire_step* steps;
    size_t nsteps;
    bool close_after;           /* close once the steps are done */
    char failure[512];
} fake_server;

static void* fake_server_main(void* arg) {
    fake_server* f = (fake_server*)arg;
    struct timeval tv;
    size_t i;
    int fd = accept(f->lfd, NULL, NULL);
    tv.tv_sec = 5;
    tv.tv_usec = 0;
    if (fd < 0) { snprintf(f->failure, sizeof(f->failure), "accept failed"); return NULL; }
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    for (i = 0; i < f->nsteps && !f->failure[0]; i++) {
        const wire_step* w = &f->steps[i];
        unsigned char want[4096], got[4096], rep[4096];
        char gh[8200];
        size_t n = unhex(w->c2s, want, sizeof(want)), g = tw_recv_n(fd, got, n), rn;
        if (g != n || memcmp(want, got, n) != 0) {
            tohex(got, g, gh);
            snprintf(f->failure, sizeof(f->failure), "%.60s: client sent %.200s, expected %.200s", w->what, gh, w->c2s);
            break;
        }
        if (strcmp(w->s2c, "-") == 0) {        /* the client must cancel: 0c */
            g = tw_recv_n(fd, got, 1);
            if (g != 1 || got[0] != 0x0c) {
                snprintf(f->failure, sizeof(f->failure), "%s: no CANCEL_WAIT", w->what);
                break;
            }
            send_hex(fd, "01");
            continue;
        }
        rn = unhex(w->s2c, rep, sizeof(rep));
        if (rn) send_raw(fd, rep, rn);
    }
    if (f->close_after) close(fd);
    else {
        unsigned char b[64];
        while (recv(fd, b, sizeof(b), 0) > 0) {}   /* until the client hangs up */
        close(fd);
    }
    return NULL;
}
static void fake_server_start(fake_server* f, const wire_step* steps, size_t n, bool close_after) {
    memset(f, 0, sizeof(*f));
    f->steps = steps;
    f->nsteps = n;
    f->close_after = close_after;
    f->lfd = tw_listen_loopback(SOCK_CLOEXEC, 4, &f->port);
    CHECK(f->lfd >= 0);
    CHECK(pthread_create(&f->th, NULL, fake_server_main, f) == 0);
}
/* A fake server's first step: our client's connect (its bytes in *oc, which outlives the
   server), answered with s2c (NULL: the echo a store sends). */
static void our_connect_step(wire_step* step, our_connect* oc, const char* s2c) {
    our_connect_hex(oc);
    step->what = "connect: VALIDATE + PING";
    step->c2s = oc->c2s;
    step->s2c = s2c ? s2c : oc->echo;
}
/* fake_server_start, then our client of it (the key prefix given, 3 s), which must connect. */
static dm_store* fake_server_client(fake_server* f, const wire_step* steps, size_t n, bool close_after,
                                    const char* prefix) {
    dm_store* c;
    fake_server_start(f, steps, n, close_after);
    c = make_client("127.0.0.1", f->port, prefix, 3000);
    CHECK(c);
    return c;
}
static void fake_server_join(fake_server* f) {
    pthread_join(f->th, NULL);
    close(f->lfd);
    if (f->failure[0]) print_message("fake server: %s\n", f->failure);
    assert_string_equal(f->failure, "");
}

static void test_client_wire_matches_torch(void** state) {
    /* the same fixtures, with our PING nonce: our pid (torch uses getpid() too), marked as a
       distmesh client's in its top byte (distmesh_store.h, >>store wire) */
    static wire_step steps[sizeof(k_torch_wire) / sizeof(k_torch_wire[0])];
    our_connect oc;
    fake_server f;
    dm_store* c;
    size_t ns = 0;
    int64_t x = 0;
    bool b = false;
    (void)state;
    memcpy(steps, k_torch_wire, sizeof(steps));
    our_connect_step(&steps[0], &oc, NULL);
    ns = 25;    /* the recorded part */
    c = fake_server_client(&f, steps, ns, false, "/");
    CHECK_OK(dm_store_set(c, "k1", "v1", 2));
    check_get(c, "k1", "v1", 2);
    CHECK_OK(dm_store_add(c, "cnt", 5, &x));
    assert_int_equal(x, 5);
    CHECK_OK(dm_store_add(c, "cnt", -7, &x));
    assert_int_equal(x, -2);
    check_cas(c, "k1", "v1", "v2", "v2");
    check_cas(c, "k1", "zz", "v3", "v2");
    check_cas(c, "miss", "", "new", "new");
    CHECK_OK(dm_store_compare_set(c, "miss2", "x", 1, "y", 1, NULL, NULL));
    {
        const char* k2[2] = {"k1", "nope"};
        const char* k1[1] = {"k1"};
        const char* kn[1] = {"nokey"};
        CHECK_OK(dm_store_check(c, k2, 2, &b));
        CHECK(!b);
        CHECK_OK(dm_store_check(c, k1, 1, &b));
        CHECK(b);
        CHECK_OK(dm_store_wait(c, k1, 1, 0));
        assert_int_equal(dm_store_wait(c, kn, 1, 150), DM_ERR_TIMEOUT);
        CHECK(strstr(dm_store_last_error(c), "nokey") != NULL);
    }
    check_keys_then_delete(c, 3, "k1");
    CHECK_OK(dm_store_append(c, "ap", "a", 1));
    CHECK_OK(dm_store_append(c, "ap", "bc", 2));
    check_multi(c);
    {
        dm_store* pg = NULL;
        CHECK_OK(dm_store_clone_prefixed(c, "pg//", &pg));   /* torch's PrefixStore joins with "/" */
        CHECK_OK(dm_store_set(pg, "a", "b", 1));
        dm_store_destroy(pg);
    }
    {
        dm_store* shorter = NULL;
        CHECK_OK(dm_store_clone_prefixed(c, "", &shorter));
        dm_store_destroy(shorter);
    }
    /* get of a key that never comes: WAIT, timeout, CANCEL_WAIT (store timeout 3 s is too long
       for a test, so a clone can't change it; use wait's own timeout through get's path) */
    {
        const char* ka[1] = {"absent"};
        assert_int_equal(dm_store_wait(c, ka, 1, 150), DM_ERR_TIMEOUT);
    }
    CHECK_OK(dm_store_set(c, "e", "", 0));
    dm_store_destroy(c);
    fake_server_join(&f);
}

/* STOP_WAITING that crosses CANCEL_WAIT: the client reads both and reports the timeout. */
static void test_client_cancel_race(void** state) {
    static wire_step steps[3];
    our_connect oc;
    fake_server f;
    dm_store* c;
    const char* k[1] = {"x"};
    (void)state;
    our_connect_step(&steps[0], &oc, NULL);
    steps[1].what = "wait [x]"; steps[1].c2s = "060100000000000000010000000000000078"; steps[1].s2c = "";
    steps[2].what = "cancel"; steps[2].c2s = "0c"; steps[2].s2c = "0001";
    c = fake_server_client(&f, steps, 3, false, NULL);
    assert_int_equal(dm_store_wait(c, k, 1, 100), DM_ERR_TIMEOUT);
    dm_store_destroy(c);
    fake_server_join(&f);
}

/* The server goes away mid-session: DM_ERR_PEER_LOST, then the store stays failed. */
static void test_client_peer_lost(void** state) {
    static wire_step steps[1];
    our_connect oc;
    fake_server f;
    dm_store* c;
    int64_t x;
    (void)state;
    our_connect_step(&steps[0], &oc, NULL);
    c = fake_server_client(&f, steps, 1, true, NULL);
    fake_server_join(&f);
    assert_int_equal(dm_store_add(c, "k", 1, &x), DM_ERR_PEER_LOST);
    CHECK(strncmp(dm_store_last_error(c), "tcp-store: ", 11) == 0);
    assert_int_equal(dm_store_set(c, "k", "v", 1), DM_ERR_PEER_LOST);
    dm_store_destroy(c);
}

/* A server that answers PING with the wrong nonce is not a torch 2.x store. */
static void test_client_rejects_bad_ping(void** state) {
    static wire_step steps[1];
    our_connect oc;
    fake_server f;
    dm_store* c = NULL;
    char url[64];
    (void)state;
    our_connect_step(&steps[0], &oc, "deadbeef");
    fake_server_start(&f, steps, 1, true);
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", f.port);
    assert_int_equal(open_store(url, NULL, false, NULL, 2000, &c), DM_ERR_PROTOCOL);
    CHECK(c == NULL);
    fake_server_join(&f);
}

/* ---- every op through our client and our server ---- */
static void test_ops_roundtrip(void** state) {
    dm_store* srv = make_server("127.0.0.1", 5000);
    dm_store* c = make_client("127.0.0.1", dm_store_port(srv), "job/", 5000);
    void* v = NULL;
    size_t n = 0, i;
    int64_t x = 0;
    unsigned char* big;
    const size_t bign = 4u << 20;
    (void)state;
    CHECK(c);
    assert_int_equal(dm_store_port(c), dm_store_port(srv));
    CHECK_OK(dm_store_set(c, "a", "hello", 5));
    check_get(c, "a", "hello", 5);
    CHECK_OK(dm_store_get(srv, "job/a", &v, &n));          /* the server's own store has no prefix */
    CHECK(n == 5);
    dm_store_free(srv, v);
    CHECK_OK(dm_store_set(c, "empty", NULL, 0));
    check_get(c, "empty", "", 0);
    CHECK_OK(dm_store_add(c, "n", 40, &x));
    CHECK_OK(dm_store_add(c, "n", 2, &x));
    assert_int_equal(x, 42);
    check_get(c, "n", "42", 2);                            /* add keeps decimal text, like c10d */
    CHECK_OK(dm_store_add(c, "n", INT64_MIN, &x));
    assert_int_equal(x, INT64_MIN + 42);
    /* not a number: the server drops us, saying why (a notice in place of the reply) */
    assert_int_equal(dm_store_add(c, "a", 1, &x), DM_ERR_PROTOCOL);
    CHECK(strstr(dm_store_last_error(c), "closed this client") && strstr(dm_store_last_error(c), "decimal int64"));
    dm_store_destroy(c);
    c = make_client("127.0.0.1", dm_store_port(srv), "job/", 5000);
    CHECK(c);
    check_cas(c, "cas", "", "one", "one");
    check_cas(c, "cas", "two", "three", "one");
    check_cas(c, "cas", "one", "three", "three");
    check_cas(c, "nokey", "exp", "des", "exp");            /* missing + expected: answers expected */
    {
        const char* k[3] = {"a", "cas", "nokey"};
        check_is(c, k, 2, true);
        check_is(c, k, 3, false);
        check_is(c, k, 0, true);
    }
    check_keys_then_delete(c, 4, "a");                      /* a, empty, n, cas */
    CHECK_OK(dm_store_append(c, "log", "ab", 2));
    CHECK_OK(dm_store_append(c, "log", "cd", 2));
    check_get(c, "log", "abcd", 4);
    big = (unsigned char*)malloc(bign);
    for (i = 0; i < bign; i++) big[i] = (unsigned char)(i * 7 + 3);
    CHECK_OK(dm_store_set(c, "big", big, bign));
    check_get(c, "big", big, bign);
    free(big);
    /* argument errors, caught before anything is sent */
    assert_int_equal(dm_store_set(c, NULL, "x", 1), DM_ERR_INVALID_ARG);
    assert_int_equal(dm_store_set(c, "k", NULL, 1), DM_ERR_INVALID_ARG);
    assert_int_equal(dm_store_set(c, "k", "x", (size_t)DM_STORE_MAX_VALUE + 1), DM_ERR_INVALID_ARG);
    CHECK(strstr(dm_store_last_error(c), "DM_STORE_MAX_VALUE") != NULL);
    assert_int_equal(dm_store_get(c, "k", NULL, &n), DM_ERR_INVALID_ARG);
    assert_int_equal(dm_store_set(NULL, "k", "x", 1), DM_ERR_INVALID_ARG);
    CHECK_OK(dm_store_set(c, "still", "ok", 2));            /* the connection is intact */
    CHECK_OK(dm_store_get(c, "still", &v, &n));
    dm_store_free(c, v);
    assert_string_equal(dm_store_last_error(c), "");
    dm_store_destroy(c);
    dm_store_destroy(srv);
    dm_store_destroy(NULL);
}

typedef struct waiter_arg {
    dm_store* s;
    const char* keys[3];
    size_t n;
    int timeout_ms;
    dm_status st;
    int64_t took_ms;
} waiter_arg;
static void* waiter_main(void* p) {
    waiter_arg* w = (waiter_arg*)p;
    int64_t t0 = tw_now_ms();
    w->st = dm_store_wait(w->s, w->keys, w->n, w->timeout_ms);
    w->took_ms = tw_now_ms() - t0;
    return NULL;
}

static void test_wait_wakes_and_times_out(void** state) {
    dm_store* srv = make_server("127.0.0.1", 5000);
    dm_store* a = make_client("127.0.0.1", dm_store_port(srv), NULL, 5000);
    dm_store* c = make_client("127.0.0.1", dm_store_port(srv), NULL, 5000);
    waiter_arg w;
    pthread_t th;
    void* v;
    size_t n;
    int64_t t0;
    (void)state;
    CHECK(a && c);
    memset(&w, 0, sizeof(w));
    w.s = a;
    w.keys[0] = "x"; w.keys[1] = "y"; w.keys[2] = "x";
    w.n = 3;
    w.timeout_ms = 5000;
    pthread_create(&th, NULL, waiter_main, &w);
    tw_sleep_ms(100);
    CHECK_OK(dm_store_set(c, "x", "1", 1));
    tw_sleep_ms(50);
    CHECK_OK(dm_store_set(c, "y", "2", 1));
    pthread_join(th, NULL);
    assert_int_equal(w.st, DM_OK);
    CHECK(w.took_ms >= 100 && w.took_ms < 4000);
    /* timeout names the key; the server and the connection survive */
    {
        const char* k[2] = {"never", "x"};
        t0 = tw_now_ms();
        assert_int_equal(dm_store_wait(a, k, 2, 200), DM_ERR_TIMEOUT);
        CHECK(tw_now_ms() - t0 >= 190);
        CHECK(strstr(dm_store_last_error(a), "\"never\"") != NULL);
        CHECK(strstr(dm_store_last_error(a), "timed out") != NULL);
    }
    CHECK_OK(dm_store_get(a, "x", &v, &n));
    dm_store_free(a, v);
    /* get waits with the store timeout */
    {
        dm_store* quick = NULL;
        char url[64];
        snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", dm_store_port(srv));
        CHECK_OK(open_store(url, NULL, false, NULL, 250, &quick));
        t0 = tw_now_ms();
        assert_int_equal(dm_store_get(quick, "nothing", &v, &n), DM_ERR_TIMEOUT);
        CHECK(v == NULL && tw_now_ms() - t0 >= 240);
        CHECK(strstr(dm_store_last_error(quick), "nothing") != NULL);
        CHECK_OK(dm_store_set(quick, "nothing", "now", 3));
        CHECK_OK(dm_store_get(quick, "nothing", &v, &n));
        dm_store_free(quick, v);
        dm_store_destroy(quick);
    }
    /* a client that disconnects while waiting leaves nothing behind */
    {
        int fd = raw_connect(AF_INET, dm_store_port(srv));
        send_hex(fd, "00cef7853c");
        send_hex(fd, "0601000000000000000300000000000000717171");   /* wait [qqq] */
        tw_sleep_ms(50);
        close(fd);
        tw_sleep_ms(50);
        CHECK_OK(dm_store_set(c, "qqq", "v", 1));   /* wakes nobody, crashes nothing */
    }
    dm_store_destroy(a);
    dm_store_destroy(c);
    dm_store_destroy(srv);
}

/* ---- concurrency ---- */
typedef struct worker_arg {
    int port, id, n, n_own;
    dm_store* shared;           /* non-NULL: use this store (shared between threads) */
    dm_status st;
} worker_arg;
static void* worker_main(void* p) {
    worker_arg* w = (worker_arg*)p;
    dm_store* s = w->shared ? w->shared : make_client("127.0.0.1", w->port, "conc/", 10000);
    char key[32], val[32], other[32];
    int i;
    w->st = DM_OK;
    if (!s) { w->st = DM_ERR_NETWORK; return NULL; }
    for (i = 0; i < 20 && w->st == DM_OK; i++) {
        int64_t x;
        w->st = dm_store_add(s, "counter", 1, &x);
        if (w->st == DM_OK && x < 1) w->st = DM_ERR_INTERNAL;
    }
    snprintf(key, sizeof(key), "k%d", w->id);
    snprintf(val, sizeof(val), "v%d", w->id);
    if (w->st == DM_OK) w->st = dm_store_set(s, key, val, strlen(val));
    /* each get waits for a key of a thread with its own connection: a thread that waits on a
       shared store holds it, so two sharers must not wait for each other */
    {
        int o = w->shared ? w->id - w->n_own : (w->id + 1) % w->n;
        snprintf(other, sizeof(other), "k%d", o);
        snprintf(val, sizeof(val), "v%d", o);
    }
    if (w->st == DM_OK) {
        void* v = NULL;
        size_t n = 0;
        char want[32];
        snprintf(want, sizeof(want), "%s", val);
        w->st = dm_store_get(s, other, &v, &n);
        if (w->st == DM_OK && (n != strlen(want) || memcmp(v, want, n) != 0)) w->st = DM_ERR_INTERNAL;
        dm_store_free(s, v);
    }
    if (!w->shared) dm_store_destroy(s);
    return NULL;
}

static void test_many_clients_threads(void** state) {
    enum { N = 32, SHARED = 8 };
    dm_store* srv = make_server("127.0.0.1", 10000);
    dm_store* shared = make_client("127.0.0.1", dm_store_port(srv), "conc/", 10000);
    pthread_t th[N + SHARED];
    worker_arg w[N + SHARED];
    int i;
    int64_t x;
    (void)state;
    CHECK(shared);
    for (i = 0; i < N + SHARED; i++) {
        memset(&w[i], 0, sizeof(w[i]));
        w[i].port = dm_store_port(srv);
        w[i].id = i;
        w[i].n = N + SHARED;
        w[i].n_own = N;
        w[i].shared = i >= N ? shared : NULL;   /* 8 threads share one store (one connection) */
        CHECK(pthread_create(&th[i], NULL, worker_main, &w[i]) == 0);
    }
    for (i = 0; i < N + SHARED; i++) {
        pthread_join(th[i], NULL);
        if (w[i].st != DM_OK) print_message("worker %d: %s\n", i, dm_status_name(w[i].st));
        assert_int_equal(w[i].st, DM_OK);
    }
    CHECK_OK(dm_store_add(shared, "counter", 0, &x));
    assert_int_equal(x, (N + SHARED) * 20);
    dm_store_destroy(shared);
    dm_store_destroy(srv);
}

/* Forked worker processes (tests/test_world.h): each has an alarm of 20 s as its own deadline,
   and the parent kills what is left after 25 s. */
typedef struct proc_workers { int port, n; } proc_workers;
static int worker_proc(int i, void* ctx) {
    const proc_workers* pw = (const proc_workers*)ctx;
    worker_arg w;
    memset(&w, 0, sizeof(w));
    w.port = pw->port;
    w.id = i;
    w.n = pw->n;
    w.n_own = pw->n;
    worker_main(&w);
    return w.st == DM_OK ? 0 : 1;
}
static void test_many_clients_processes(void** state) {
    enum { P = 8 };
    dm_store* srv = make_server("127.0.0.1", 10000);
    proc_workers pw;
    tw_world procs;
    int64_t x;
    (void)state;
    pw.port = dm_store_port(srv);
    pw.n = P;
    tw_world_init(&procs, 20, false);
    CHECK(tw_fork(&procs, P, worker_proc, &pw) == 0);
    assert_int_equal(tw_reap(&procs, 25), 0);
    CHECK_OK(dm_store_add(srv, "conc/counter", 0, &x));
    assert_int_equal(x, P * 20);
    dm_store_destroy(srv);
}

/* ---- malformed input: that client is closed with a logged protocol error; others go on ---- */
static void test_malformed_input(void** state) {
    dm_store* srv = make_server("127.0.0.1", 5000);
    int port = dm_store_port(srv), fd, i, before = protocol_errors();
    static const char* const bad[] = {
        "07",                                        /* torch < 2.2 (no VALIDATE): WATCH_KEY, unsupported */
        "00efbeadde",                                /* bad magic */
        "00cef7853c63",                              /* unknown opcode 0x63 */
        "00cef7853c0e",                              /* opcode 14 (torch's queue ops: unsupported) */
        "00cef7853c01ffffffffffffff7f",              /* key length 2^63 */
        "00cef7853c0101000000000000006b0000001000000000", /* value of 256 MiB */
        "00cef7853c06ffffffff00000000",              /* wait for 4G keys */
        "00cef7853c0bffffffffffffffff",              /* multi_set count 2^64-1 */
        "00cef7853c0001000000000000",                /* VALIDATE again then garbage: opcode 0 twice is ok, then 01 + short */
    };
    void* v;
    size_t n;
    (void)state;
    for (i = 0; i < 8; i++) {
        fd = raw_connect(AF_INET, port);
        send_hex(fd, bad[i]);
        expect_closed(fd);
        close(fd);
    }
    tw_sleep_ms(20);
    CHECK(protocol_errors() >= before + 8);
    pthread_mutex_lock(&g_log_mu);
    CHECK(strstr(g_last_log, "tcp-store: server closed client 127.0.0.1:") != NULL);
    pthread_mutex_unlock(&g_log_mu);
    /* a request sent one byte at a time is parsed once it is whole */
    fd = raw_connect(AF_INET, port);
    {
        unsigned char req[64];
        size_t rn = unhex("00cef7853c" "0103000000000000006b3131020000000000000076310d" "01020304", req, sizeof(req));
        size_t j;
        for (j = 0; j < rn; j++) { send_raw(fd, &req[j], 1); if (j % 7 == 0) tw_sleep_ms(1); }
        expect_hex(fd, "01020304", "ping after a byte-by-byte set");
    }
    close(fd);
    check_get(srv, "k11", "v1", 2);
    /* random bytes from 60 connections, with and without VALIDATE first */
    srand(1234);
    for (i = 0; i < 60; i++) {
        unsigned char junk[512];
        size_t j, jn = 1 + (size_t)(rand() % (int)sizeof(junk));
        for (j = 0; j < jn; j++) junk[j] = (unsigned char)rand();
        fd = raw_connect(AF_INET, port);
        if (i % 2) send_hex(fd, "00cef7853c");
        send_raw(fd, junk, jn);
        close(fd);
    }
    tw_sleep_ms(50);
    CHECK_OK(dm_store_set(srv, "alive", "yes", 3));
    CHECK_OK(dm_store_get(srv, "alive", &v, &n));
    dm_store_free(srv, v);
    dm_store_destroy(srv);
}

/* ---- connect: port 0, retry until the server appears, timeout, IPv6 ---- */
static void half_free(void* p, void* ud) { (void)ud; free(p); }
typedef struct late_server { int port; dm_store* s; } late_server;
static void* late_server_main(void* p) {
    late_server* l = (late_server*)p;
    char url[64];
    dm_store_desc d;
    tw_sleep_ms(300);
    memset(&d, 0, sizeof(d));
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", l->port);
    d.url = url;
    d.is_server = true;
    d.timeout_ms = 5000;
    if (dm_store_create(&d, &l->s) != DM_OK) l->s = NULL;
    return NULL;
}
static void test_connect_retry_and_timeout(void** state) {
    late_server l;
    pthread_t th;
    dm_store* c;
    dm_store_desc d;
    char url[64];
    int64_t t0;
    (void)state;
    l.port = tw_free_port();
    l.s = NULL;
    pthread_create(&th, NULL, late_server_main, &l);
    t0 = tw_now_ms();
    c = make_client("127.0.0.1", l.port, NULL, 5000);     /* refused until the server is up */
    pthread_join(th, NULL);
    CHECK(l.s != NULL);
    CHECK(c != NULL);
    CHECK(tw_now_ms() - t0 >= 250);
    assert_int_equal(dm_store_port(l.s), l.port);
    CHECK_OK(dm_store_set(c, "k", "v", 1));
    dm_store_destroy(c);
    /* the port is taken now: a second server fails with a network status and a message */
    memset(&d, 0, sizeof(d));
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", l.port);
    d.url = url;
    d.is_server = true;
    c = (dm_store*)&d;
    assert_int_equal(dm_store_create(&d, &c), DM_ERR_NETWORK);
    CHECK(c == NULL);
    dm_store_destroy(l.s);
    /* nobody listens: DM_ERR_TIMEOUT after about the timeout */
    d.is_server = false;
    d.url = url;
    d.timeout_ms = 300;
    d.logger.func = capture_log;
    t0 = tw_now_ms();
    assert_int_equal(dm_store_create(&d, &c), DM_ERR_TIMEOUT);
    CHECK(tw_now_ms() - t0 >= 250 && tw_now_ms() - t0 < 3000);
    pthread_mutex_lock(&g_log_mu);
    if (!strstr(g_last_log, "ECONNREFUSED")) print_message("log: %s\n", g_last_log);
    CHECK(strstr(g_last_log, "ECONNREFUSED") != NULL);
    pthread_mutex_unlock(&g_log_mu);
    /* bad urls */
    d.timeout_ms = 200;
    d.url = "tcp://127.0.0.1";
    assert_int_equal(dm_store_create(&d, &c), DM_ERR_INVALID_ARG);
    d.url = "tcp://127.0.0.1:99999";
    assert_int_equal(dm_store_create(&d, &c), DM_ERR_INVALID_ARG);
    d.url = "udp://x:1";
    assert_int_equal(dm_store_create(&d, &c), DM_ERR_INVALID_ARG);
    d.url = "tcp://127.0.0.1:0";                              /* a client must know the port */
    assert_int_equal(dm_store_create(&d, &c), DM_ERR_INVALID_ARG);
    d.url = "file://relative/dir";
    assert_int_equal(dm_store_create(&d, &c), DM_ERR_INVALID_ARG);
    d.url = "tcp://localhost:1";
    d.allocator.alloc_fn = NULL;
    d.allocator.free_fn = half_free;
    assert_int_equal(dm_store_create(&d, &c), DM_ERR_INVALID_ARG);
    CHECK(c == NULL);
}

static bool have_ipv6_loopback(void) {
    struct sockaddr_in6 a;
    int fd = socket(AF_INET6, SOCK_STREAM, 0), ok;
    if (fd < 0) return false;
    memset(&a, 0, sizeof(a));
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_loopback;
    ok = bind(fd, (struct sockaddr*)&a, sizeof(a)) == 0;
    close(fd);
    return ok;
}
static void test_ipv6_loopback(void** state) {
    dm_store *srv, *c;
    int fd;
    (void)state;
    if (!have_ipv6_loopback()) {
        print_message("SKIP: no IPv6 loopback (::1) on this host\n");
        skip();
    }
    srv = make_server("[::1]", 5000);
    c = make_client("::1", dm_store_port(srv), NULL, 5000);
    CHECK(c);
    CHECK_OK(dm_store_set(c, "six", "v6", 2));
    check_get(srv, "six", "v6", 2);
    fd = raw_connect(AF_INET6, dm_store_port(srv));
    send_hex(fd, "00cef7853c0d04030201");
    expect_hex(fd, "04030201", "ping over IPv6");
    close(fd);
    dm_store_destroy(c);
    dm_store_destroy(srv);
}

/* ---- clones, env urls, agent store ---- */
static void test_clone_and_env(void** state) {
    dm_store* srv = make_server("127.0.0.1", 5000);
    dm_store *c, *clone = NULL, *e = NULL;
    dm_store_desc d;
    char port[16];
    void* v;
    size_t n;
    (void)state;
    c = make_client("127.0.0.1", dm_store_port(srv), "pg/", 5000);
    CHECK(c);
    CHECK_OK(dm_store_clone_prefixed(c, "sub/", &clone));
    dm_store_destroy(c);                                   /* the clone keeps the connection */
    CHECK_OK(dm_store_set(clone, "k", "v", 1));
    CHECK_OK(dm_store_get(srv, "pg/sub/k", &v, &n));
    dm_store_free(srv, v);
    /* url 0: MASTER_ADDR / MASTER_PORT */
    snprintf(port, sizeof(port), "%d", dm_store_port(srv));
    unsetenv("DISTMESH_STORE");
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", port, 1);
    memset(&d, 0, sizeof(d));
    d.timeout_ms = 3000;
    d.prefix = "pg/sub/";
    CHECK_OK(dm_store_create(&d, &e));
    CHECK_OK(dm_store_get(e, "k", &v, &n));
    dm_store_free(e, v);
    dm_store_destroy(e);
    /* torchrun's agent already serves MASTER_PORT: is_server is ignored (no EADDRINUSE) */
    setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
    d.is_server = true;
    CHECK_OK(dm_store_create(&d, &e));
    CHECK_OK(dm_store_get(e, "k", &v, &n));
    dm_store_free(e, v);
    dm_store_destroy(e);
    unsetenv("TORCHELASTIC_USE_AGENT_STORE");
    assert_int_equal(dm_store_create(&d, &e), DM_ERR_NETWORK);  /* now it really tries to serve */
    unsetenv("MASTER_ADDR");
    unsetenv("MASTER_PORT");
    d.is_server = false;
    assert_int_equal(dm_store_create(&d, &e), DM_ERR_ENV);
    dm_store_destroy(clone);
    dm_store_destroy(srv);
}

/* ---- file store ---- */
static void rm_tree(const char* dir) {
    DIR* d = opendir(dir);
    struct dirent* e;
    char p[512];
    if (!d) return;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}
static dm_store* make_file_store(const char* dir, const char* prefix, int timeout_ms) {
    char url[512];
    dm_store* s = NULL;
    snprintf(url, sizeof(url), "file://%s", dir);
    open_store(url, prefix, false, NULL, timeout_ms, &s);
    return s;
}
static void test_file_store_ops(void** state) {
    char tmpl[] = "/tmp/dm_store_XXXXXX";
    char* dir = mkdtemp(tmpl);
    char sub[256];
    dm_store* s;
    void* v;
    size_t n;
    int64_t x;
    bool b;
    int64_t t0;
    (void)state;
    CHECK(dir);
    snprintf(sub, sizeof(sub), "%s/nested", dir);          /* created on demand */
    s = make_file_store(sub, "g/", 3000);
    CHECK(s);
    assert_int_equal(dm_store_port(s), 0);
    CHECK_OK(dm_store_set(s, "a", "hello", 5));
    check_get(s, "a", "hello", 5);
    CHECK_OK(dm_store_add(s, "n", 5, &x));
    CHECK_OK(dm_store_add(s, "n", -7, &x));
    assert_int_equal(x, -2);
    check_cas(s, "c", "", "one", "one");
    check_cas(s, "c", "bad", "two", "one");
    check_cas(s, "c", "one", "two", "two");
    check_cas(s, "zz", "e", "d", "e");
    CHECK_OK(dm_store_append(s, "log", "ab", 2));
    CHECK_OK(dm_store_append(s, "log", "c", 1));
    check_get(s, "log", "abc", 3);
    {
        const char* k[2] = {"a", "zz"};
        CHECK_OK(dm_store_check(s, k, 1, &b));
        CHECK(b);
        CHECK_OK(dm_store_check(s, k, 2, &b));
        CHECK(!b);
        t0 = tw_now_ms();
        assert_int_equal(dm_store_wait(s, k, 2, 200), DM_ERR_TIMEOUT);
        CHECK(tw_now_ms() - t0 >= 190);
        CHECK(strstr(dm_store_last_error(s), "zz") != NULL);
    }
    check_keys_then_delete(s, 4, "a");                      /* a, n, c, log */
    {
        char longkey[400];
        memset(longkey, 'k', sizeof(longkey) - 1);
        longkey[sizeof(longkey) - 1] = 0;                   /* longer than a file name: hashed */
        CHECK_OK(dm_store_set(s, longkey, "L", 1));
        CHECK_OK(dm_store_get(s, longkey, &v, &n));
        CHECK(n == 1);
        dm_store_free(s, v);
    }
    check_multi(s);
    /* DISTMESH_STORE with url 0 */
    {
        char url[300];
        dm_store_desc d;
        dm_store* e = NULL;
        snprintf(url, sizeof(url), "file://%s/", sub);
        setenv("DISTMESH_STORE", url, 1);
        memset(&d, 0, sizeof(d));
        d.prefix = "g/";
        CHECK_OK(dm_store_create(&d, &e));
        CHECK_OK(dm_store_get(e, "log", &v, &n));
        dm_store_free(e, v);
        dm_store_destroy(e);
        unsetenv("DISTMESH_STORE");
    }
    dm_store_destroy(s);
    rm_tree(sub);
    rm_tree(dir);
}

enum { FS_PROCS = 6, FS_ADDS = 40 };
/* One of FS_PROCS processes on the file store in dir: adds, concurrent writes of one key,
   its own key and its neighbour's. */
static int file_store_proc(int i, void* dir) {
    dm_store* c;
    char key[16], want[16];
    int j, ok = 1;
    c = make_file_store((const char*)dir, NULL, 15000);
    if (!c) return 2;
    for (j = 0; j < FS_ADDS && ok; j++) ok = dm_store_add(c, "ctr", 1, NULL) == DM_OK;
    for (j = 0; j < 10 && ok; j++) {           /* concurrent writers of one key: never torn */
        char val[64];
        memset(val, 'a' + i, sizeof(val));
        ok = dm_store_set(c, "shared", val, sizeof(val)) == DM_OK;
    }
    snprintf(key, sizeof(key), "r%d", i);
    snprintf(want, sizeof(want), "r%d", (i + 1) % FS_PROCS);
    if (ok) ok = dm_store_set(c, key, "x", 1) == DM_OK;
    if (ok) {
        void* v = NULL;
        size_t n = 0;
        ok = dm_store_get(c, want, &v, &n) == DM_OK && n == 1;
        dm_store_free(c, v);
        ok = ok && dm_store_get(c, "shared", &v, &n) == DM_OK && n == 64;
        if (ok) { for (j = 1; j < 64; j++) if (((char*)v)[j] != ((char*)v)[0]) ok = 0; }
        dm_store_free(c, v);
    }
    dm_store_destroy(c);
    return ok ? 0 : 1;
}
static void test_file_store_processes(void** state) {
    char tmpl[] = "/tmp/dm_store_XXXXXX";
    char* dir = mkdtemp(tmpl);
    dm_store* s;
    int64_t x;
    tw_world procs;
    (void)state;
    CHECK(dir);
    tw_world_init(&procs, 20, false);
    CHECK(tw_fork(&procs, FS_PROCS, file_store_proc, dir) == 0);
    assert_int_equal(tw_reap(&procs, 25), 0);
    s = make_file_store(dir, NULL, 3000);
    CHECK(s);
    CHECK_OK(dm_store_add(s, "ctr", 0, &x));
    assert_int_equal(x, FS_PROCS * FS_ADDS);
    dm_store_destroy(s);
    rm_tree(dir);
}

/* ---- nothing leaks: descriptors back to where they were ---- */
static void test_no_fd_leak(void** state) {
    int before = tw_count_fds(), k;
    (void)state;
    for (k = 0; k < 3; k++) {
        dm_store* srv = make_server("127.0.0.1", 5000);
        dm_store* a = make_client("127.0.0.1", dm_store_port(srv), NULL, 5000);
        dm_store* b = make_client("127.0.0.1", dm_store_port(srv), NULL, 5000);
        const char* key[1] = {"never"};
        CHECK(a && b);
        CHECK_OK(dm_store_set(a, "k", "v", 1));
        assert_int_equal(dm_store_wait(b, key, 1, 50), DM_ERR_TIMEOUT);
        dm_store_destroy(a);                     /* b is still connected when the server stops */
        dm_store_destroy(srv);
        dm_store_destroy(b);
    }
    assert_int_equal(tw_count_fds(), before);
}

int main(int argc, char** argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_server_wire_matches_torch),
        cmocka_unit_test(test_client_wire_matches_torch),
        cmocka_unit_test(test_client_cancel_race),
        cmocka_unit_test(test_client_peer_lost),
        cmocka_unit_test(test_client_rejects_bad_ping),
        cmocka_unit_test(test_ops_roundtrip),
        cmocka_unit_test(test_wait_wakes_and_times_out),
        cmocka_unit_test(test_many_clients_threads),
        cmocka_unit_test(test_many_clients_processes),
        cmocka_unit_test(test_malformed_input),
        cmocka_unit_test(test_connect_retry_and_timeout),
        cmocka_unit_test(test_ipv6_loopback),
        cmocka_unit_test(test_clone_and_env),
        cmocka_unit_test(test_file_store_ops),
        cmocka_unit_test(test_file_store_processes),
        cmocka_unit_test(test_no_fd_leak),
    };
    signal(SIGPIPE, SIG_IGN);
    return DM_RUN_TESTS(argc, argv, tests, NULL, NULL);
}
