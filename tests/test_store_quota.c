/* The store server's memory quota (issue 18, item 4): it charges what it holds (keys, values,
   bounded per-connection buffers), refuses the client that would go over it with a reason that
   client reads (a notice, distmesh_store.h >>store wire), and keeps serving everyone else.
   - the reproduction from the issue: DISTMESH_STORE_MAX_TOTAL=128 MiB, SET of a 64 MiB value
     (it was refused for a 128 MiB buffer, then the server thread called a NULL function);
   - a large GET's reply written from the value while the value is replaced and deleted;
   - the notice on the wire (distmesh clients get it, torch's see only the close);
   - many clients against a 1 MiB quota: the writers that fill it are refused one by one with
     DM_ERR_OUT_OF_MEMORY and the quota named, readers never notice.
   In-process server (its own thread), loopback only; every wait has a deadline. */
#define _GNU_SOURCE
#include "prelude.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

#include "distmesh.h"
#if !defined(DISTMESH_STORE_H) || !defined(DISTMESH_TCP)
#error "build with -DDISTMESH_TCP: distmesh.h then includes distmesh_store.h with its server"
#endif
#include "test_world.h"

#define MiB ((size_t)1 << 20)
#define KiB ((size_t)1 << 10)

/* Server log lines that say a client was closed for the quota. */
static atomic_int g_quota_closes;       /* the server thread counts, the test reads */
static void capture_log(dm_log_level level, dm_status status, const char* msg, const char* file, int line, void* ud) {
    (void)level; (void)file; (void)line; (void)ud;
    if (status == DM_ERR_OUT_OF_MEMORY && strstr(msg, "server closed client") && strstr(msg, "DISTMESH_STORE_MAX_TOTAL"))
        atomic_fetch_add(&g_quota_closes, 1);
}
static int quota_closes(void) { return atomic_load(&g_quota_closes); }

/* max_total 0: from DISTMESH_STORE_MAX_TOTAL. */
static dm_store* make_server(size_t max_total, size_t max_value, size_t max_conn) {
    char url[64];
    dm_store_desc d;
    dm_store* s = NULL;
    tw_store_desc_loopback(&d, url, sizeof(url), 0, 20000, "");
    d.logger.func = capture_log;
    d.max_total_bytes = max_total;
    d.max_value = max_value;
    d.max_conn_bytes = max_conn;
    CHECK_OK(dm_store_create(&d, &s));
    return s;
}
/* NULL on failure (for worker threads, which must not assert). */
static dm_store* try_client(int port) {
    char url[64];
    dm_store_desc d;
    dm_store* s = NULL;
    tw_store_desc_loopback(&d, url, sizeof(url), port, 20000, "");
    if (dm_store_create(&d, &s) != DM_OK) return NULL;
    return s;
}
static dm_store* make_client(int port) {
    dm_store* s = try_client(port);
    CHECK(s != NULL);
    return s;
}
static void fill(unsigned char* p, size_t n, unsigned seed) {
    size_t i;
    for (i = 0; i < n; i++) p[i] = (unsigned char)(i * 131 + seed);
}
/* A refusal as the client sees it: the quota's status, and the server's reason naming it. */
static bool is_quota_refusal(dm_store* s, dm_status st) {
    const char* e = dm_store_last_error(s);
    if (st != DM_ERR_OUT_OF_MEMORY || !strstr(e, "closed this client") || !strstr(e, "DISTMESH_STORE_MAX_TOTAL")) {
        print_message("not a quota refusal: %s: %s\n", dm_status_name(st), e);
        return false;
    }
    return true;
}
static void small_roundtrip(dm_store* s, const char* key) {
    void* v = NULL;
    size_t n = 0;
    CHECK_OK(dm_store_set(s, key, "value", 5));
    CHECK_OK(dm_store_get(s, key, &v, &n));
    CHECK(n == 5 && memcmp(v, "value", 5) == 0);
    dm_store_free(s, v);
}

/* The reproduction: under a 128 MiB quota a 64 MiB value is stored (its request buffer
   becomes the value: 64 MiB held, not 128 + 64); a second one is refused with the quota named,
   to that client only; the server goes on serving. */
static void test_quota_64mib_set(void** state) {
    const size_t big = 64 * MiB;
    unsigned char* v = (unsigned char*)malloc(big);
    void* got = NULL;
    size_t n = 0;
    int64_t keys = 0;
    dm_store *srv, *a, *b, *c;
    dm_status st;
    bool present = false;
    const char* k_big[1] = {"big"};
    (void)state;
    CHECK(v != NULL);
    fill(v, big, 7);
    setenv("DISTMESH_STORE_MAX_TOTAL", "134217728", 1);
    srv = make_server(0, 0, 0);
    unsetenv("DISTMESH_STORE_MAX_TOTAL");
    a = make_client(dm_store_port(srv));
    b = make_client(dm_store_port(srv));
    CHECK_OK(dm_store_set(a, "big", v, big));
    CHECK_OK(dm_store_num_keys(a, &keys));        /* a round trip: the SET was served */
    CHECK(keys >= 1);
    CHECK_OK(dm_store_check(b, k_big, 1, &present));
    CHECK(present);
    small_roundtrip(b, "small");
    /* a second 64 MiB value does not fit: a learns why, by its next call at the latest */
    fill(v, big, 9);
    st = dm_store_set(a, "big2", v, big);
    if (st == DM_OK) st = dm_store_num_keys(a, &keys);
    CHECK(is_quota_refusal(a, st));
    CHECK(quota_closes() >= 1);
    /* everyone else goes on; the first value is intact */
    small_roundtrip(b, "small2");
    c = make_client(dm_store_port(srv));
    small_roundtrip(c, "small3");
    CHECK_OK(dm_store_check(c, k_big, 1, &present));
    CHECK(present);
    /* and it comes back whole: the reply is written from the value, not from a 64 MiB copy */
    CHECK_OK(dm_store_get(c, "big", &got, &n));
    fill(v, big, 7);
    CHECK(n == big && memcmp(got, v, big) == 0);
    dm_store_free(c, got);
    small_roundtrip(b, "small4");
    dm_store_destroy(c);
    dm_store_destroy(b);
    dm_store_destroy(a);
    dm_store_destroy(srv);
    free(v);
}

/* With room for it (the default-sized quota) the same value goes in and comes back whole. */
static void test_quota_64mib_roundtrip_with_room(void** state) {
    const size_t big = 64 * MiB;
    unsigned char* v = (unsigned char*)malloc(big);
    void* got = NULL;
    size_t n = 0;
    dm_store *srv, *a;
    (void)state;
    CHECK(v != NULL);
    fill(v, big, 3);
    srv = make_server(256 * MiB, 0, 0);
    a = make_client(dm_store_port(srv));
    CHECK_OK(dm_store_set(a, "big", v, big));
    CHECK_OK(dm_store_get(a, "big", &got, &n));
    CHECK(n == big && memcmp(got, v, big) == 0);
    dm_store_free(a, got);
    CHECK_OK(dm_store_set(a, "big", v, big));    /* replacing it: 64 MiB held before and after */
    small_roundtrip(a, "small");
    dm_store_destroy(a);
    dm_store_destroy(srv);
    free(v);
}

/* ---- a reply written from the value while the value changes ---- */
static void put_u64(unsigned char* p, uint64_t v) {
    int i;
    for (i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
/* A c10d client on a raw socket (torch's way: VALIDATE, PING with its pid), 10 s timeouts. */
static int raw_client(int port) {
    unsigned char req[10], rep[4];
    int fd = tw_connect_loopback(AF_INET, port, 10);
    CHECK(fd >= 0);
    req[0] = 0x00; req[1] = 0xce; req[2] = 0xf7; req[3] = 0x85; req[4] = 0x3c;   /* VALIDATE magic */
    req[5] = 0x0d; req[6] = 1; req[7] = 2; req[8] = 3; req[9] = 4;              /* PING 0x04030201 */
    CHECK(send(fd, req, sizeof(req), 0) == (ssize_t)sizeof(req));
    CHECK(recv(fd, rep, 4, MSG_WAITALL) == 4 && rep[0] == 1 && rep[3] == 4);
    return fd;
}
/* A GET of a 16 MiB value that its client does not read yet stays in flight, written from the
   value; meanwhile the value is replaced, appended to and deleted. The reply still carries the
   old bytes whole (the replaced buffer lives until the write is done; ASan checks the rest),
   and the quota gets all of it back afterwards: the same SET fits again. */
static void test_quota_reply_from_value(void** state) {
    const size_t big = 16 * MiB;
    unsigned char* v = (unsigned char*)malloc(big);
    unsigned char* got = (unsigned char*)malloc(big);
    unsigned char req[32], len8[8];
    dm_store *srv, *a;
    bool deleted = false;
    int fd, i;
    (void)state;
    CHECK(v && got);
    srv = make_server(40 * MiB, 16 * MiB, 33 * MiB);   /* data share 35 MiB: two 16 MiB values */
    a = make_client(dm_store_port(srv));
    fill(v, big, 1);
    CHECK_OK(dm_store_set(a, "big", v, big));
    /* a SET has no reply: the check's answer on the same connection says the server has it (else
       the GET below could find no key, or the next SET arrive in the same buffer as this one) */
    {
        const char* key = "big";
        bool there = false;
        CHECK_OK(dm_store_check(a, &key, 1, &there));
        CHECK(there);
    }
    fd = raw_client(dm_store_port(srv));
    req[0] = 0x03;                                      /* GET "big", not read yet */
    put_u64(req + 1, 3);
    memcpy(req + 9, "big", 3);
    CHECK(send(fd, req, 12, 0) == 12);
    /* the server has queued the reply once its first bytes are here (peeked, within the socket's
       10 s); a fixed sleep was too short on a busy machine, and the GET then came after the
       replacement or in the middle of it */
    CHECK(recv(fd, len8, 8, MSG_PEEK | MSG_WAITALL) == 8);
    fill(v, big, 2);
    CHECK_OK(dm_store_set(a, "big", v, big));            /* the old value is still being written */
    CHECK_OK(dm_store_append(a, "big", "tail", 4));
    CHECK_OK(dm_store_delete(a, "big", &deleted));
    CHECK(deleted);
    small_roundtrip(a, "small");
    CHECK(tw_recv_all(fd, len8, 8));
    CHECK(len8[0] == 0 && len8[3] == 1 && len8[4] == 0);  /* 16 MiB */
    CHECK(tw_recv_all(fd, got, big));
    fill(v, big, 1);
    CHECK(memcmp(got, v, big) == 0);
    close(fd);
    for (i = 0; i < 2; i++) {                          /* all of it came back to the quota */
        int64_t keys = 0;
        char key[16];
        snprintf(key, sizeof(key), "b%d", i);
        CHECK_OK(dm_store_set(a, key, v, big));
        CHECK_OK(dm_store_num_keys(a, &keys));
    }
    dm_store_destroy(a);
    dm_store_destroy(srv);
    free(v);
    free(got);
}

/* ---- a large SET whose last bytes come with the next request ---- */
/* The buffer takes exactly a large SET's size (>>store server input); when the bytes before its
   last few fill it all but a little (under 4 KiB free), it must not grow again (it did, to
   twice the size: the last bytes then came with the next request, the buffer could not become
   the value, and the copy went over the quota: one CI failure, and about 1 in 500 runs beside
   other tests here). Here the SET comes whole but for its last 100 bytes, which come after a
   pause together with a CHECK: the answer is READY under a quota that has room for the value
   once, not twice. */
static void test_quota_set_tail_with_next_request(void** state) {
    const size_t big = 16 * MiB, tail = 100;
    unsigned char* req = (unsigned char*)malloc(20 + big + 20);
    unsigned char* p;
    unsigned char ready = 0xff;
    dm_store* srv;
    int fd, closes = quota_closes();
    (void)state;
    CHECK(req);
    srv = make_server(40 * MiB, 16 * MiB, 33 * MiB);
    fd = raw_client(dm_store_port(srv));
    p = req;
    *p++ = 0x01;                                        /* SET "big", 16 MiB */
    put_u64(p, 3); p += 8;
    memcpy(p, "big", 3); p += 3;
    put_u64(p, big); p += 8;
    fill(p, big, 4); p += big;
    *p++ = 0x05;                                        /* CHECK 1 key: "big" */
    put_u64(p, 1); p += 8;
    put_u64(p, 3); p += 8;
    memcpy(p, "big", 3); p += 3;
    CHECK(tw_send_all(fd, req, 20 + big - tail));
    usleep(300 * 1000);                                 /* the server reads all it has */
    CHECK(tw_send_all(fd, req + 20 + big - tail, tail + 20));
    CHECK(recv(fd, &ready, 1, MSG_WAITALL) == 1);       /* a refusal: the close (a torch-style client) */
    CHECK(ready == 0);                                  /* READY */
    CHECK(quota_closes() == closes);
    close(fd);
    dm_store_destroy(srv);
    free(req);
}

/* The notice on the wire: a client that marked its PING nonce as a distmesh client's ('D' in
   the top byte) gets FF "DMNOTE" 7F, the status, the reason, then the close; one with torch's
   nonce (its pid) just sees the close (no error reply in c10d). */
static void notice_after_bad_add(int port, uint32_t nonce, bool expect_notice) {
    unsigned char req[32], head[14], rest[400];
    static const unsigned char magic[8] = {0xFF, 'D', 'M', 'N', 'O', 'T', 'E', 0x7F};
    int fd = tw_connect_loopback(AF_INET, port, 10), i;
    CHECK(fd >= 0);
    req[0] = 0x00; req[1] = 0xce; req[2] = 0xf7; req[3] = 0x85; req[4] = 0x3c;   /* VALIDATE */
    req[5] = 0x0d;                                                              /* PING */
    for (i = 0; i < 4; i++) req[6 + i] = (unsigned char)(nonce >> (8 * i));
    CHECK(send(fd, req, 10, 0) == 10);
    CHECK(tw_recv_all(fd, head, 4) && memcmp(head, req + 6, 4) == 0);
    req[0] = 0x04;                                      /* ADD "text" 1: not a number */
    put_u64(req + 1, 4);
    memcpy(req + 9, "text", 4);
    put_u64(req + 13, 1);
    CHECK(send(fd, req, 21, 0) == 21);
    if (expect_notice) {
        int32_t st;
        size_t len;
        CHECK(tw_recv_all(fd, head, 14) && memcmp(head, magic, 8) == 0);
        st = (int32_t)((uint32_t)head[8] | ((uint32_t)head[9] << 8) | ((uint32_t)head[10] << 16) |
                       ((uint32_t)head[11] << 24));
        len = (size_t)head[12] | ((size_t)head[13] << 8);
        CHECK(st == DM_ERR_PROTOCOL && len > 0 && len < sizeof(rest));
        CHECK(tw_recv_all(fd, rest, len));
        rest[len] = 0;
        CHECK(strstr((const char*)rest, "decimal int64") != NULL);
    }
    CHECK(recv(fd, rest, sizeof(rest), 0) <= 0);    /* then the close, and nothing else */
    close(fd);
}
static void test_quota_notice_wire(void** state) {
    dm_store *srv, *a;
    (void)state;
    srv = make_server(0, 0, 0);
    a = make_client(dm_store_port(srv));
    CHECK_OK(dm_store_set(a, "text", "abc", 3));
    notice_after_bad_add(dm_store_port(srv), 0x44000000u | 4242u, true);
    notice_after_bad_add(dm_store_port(srv), 4242u, false);
    small_roundtrip(a, "still");
    dm_store_destroy(a);
    dm_store_destroy(srv);
}

/* ---- many clients against a small quota ---- */
#define N_WRITERS 12
#define N_READERS 4
#define WRITER_VALUE (100 * KiB)
typedef struct worker {
    int port, id;
    dm_status refused;          /* writers: the failure they got (DM_OK: none) */
    bool refusal_clear;         /* ... with the quota's status and the reason */
    int failures;               /* readers: operations that failed */
    pthread_t th;
} worker;

/* Stores 100 KiB values until the server refuses: the refusal must be the quota's. */
static void* writer_main(void* p) {
    worker* w = (worker*)p;
    dm_store* s = try_client(w->port);
    unsigned char* v = (unsigned char*)malloc(WRITER_VALUE);
    int i;
    w->refused = DM_OK;
    if (!s || !v) {             /* counted as a writer that was not refused clearly */
        w->refused = DM_ERR_INTERNAL;
        dm_store_destroy(s);
        free(v);
        return NULL;
    }
    fill(v, WRITER_VALUE, (unsigned)w->id);
    for (i = 0; i < 64 && w->refused == DM_OK; i++) {
        char key[32];
        const char* k[1];
        bool present = false;
        dm_status st;
        snprintf(key, sizeof(key), "w%d/%d", w->id, i);
        k[0] = key;
        st = dm_store_set(s, key, v, WRITER_VALUE);
        if (st == DM_OK) st = dm_store_check(s, k, 1, &present);     /* served, or why not */
        if (st != DM_OK) {
            w->refused = st;
            w->refusal_clear = st == DM_ERR_OUT_OF_MEMORY && strstr(dm_store_last_error(s), "closed this client") &&
                               strstr(dm_store_last_error(s), "DISTMESH_STORE_MAX_TOTAL");
            if (!w->refusal_clear) print_message("writer %d: %s\n", w->id, dm_store_last_error(s));
        }
    }
    free(v);
    dm_store_destroy(s);
    return NULL;
}
/* Reads its own key and waits on it over and over while the writers fill the store. */
static void* reader_main(void* p) {
    worker* w = (worker*)p;
    dm_store* s = try_client(w->port);
    char key[32], want[32];
    const char* k[1];
    int i;
    if (!s) {
        w->failures = 1;
        return NULL;
    }
    snprintf(key, sizeof(key), "r%d", w->id);
    snprintf(want, sizeof(want), "reader %d", w->id);
    k[0] = key;
    for (i = 0; i < 400; i++) {
        void* v = NULL;
        size_t n = 0;
        bool present = false;
        int64_t keys = 0;
        if (dm_store_get(s, key, &v, &n) != DM_OK || n != strlen(want) || memcmp(v, want, n) != 0) w->failures++;
        if (v) dm_store_free(s, v);
        if (dm_store_check(s, k, 1, &present) != DM_OK || !present) w->failures++;
        if (dm_store_wait(s, k, 1, 5000) != DM_OK) w->failures++;
        if (dm_store_num_keys(s, &keys) != DM_OK || keys < N_READERS) w->failures++;
        if (w->failures) {
            print_message("reader %d: %s\n", w->id, dm_store_last_error(s));
            break;
        }
    }
    dm_store_destroy(s);
    return NULL;
}

/* 12 writers fill a 1 MiB quota (its data share is 896 KiB: about eight 100 KiB values) while 4
   readers read: every writer is refused with the quota named, every reader succeeds throughout,
   and a new client is served afterwards. */
static void test_quota_many_clients(void** state) {
    worker wr[N_WRITERS], rd[N_READERS];
    dm_store *srv, *setup, *late;
    int i, refused_clear = 0, closes0 = quota_closes();
    (void)state;
    srv = make_server(1 * MiB, 256 * KiB, 600 * KiB);
    setup = make_client(dm_store_port(srv));
    for (i = 0; i < N_READERS; i++) {
        char key[32], val[32];
        snprintf(key, sizeof(key), "r%d", i);
        snprintf(val, sizeof(val), "reader %d", i);
        CHECK_OK(dm_store_set(setup, key, val, strlen(val)));
    }
    memset(wr, 0, sizeof(wr));
    memset(rd, 0, sizeof(rd));
    for (i = 0; i < N_READERS; i++) {
        rd[i].port = dm_store_port(srv);
        rd[i].id = i;
        CHECK(pthread_create(&rd[i].th, NULL, reader_main, &rd[i]) == 0);
    }
    for (i = 0; i < N_WRITERS; i++) {
        wr[i].port = dm_store_port(srv);
        wr[i].id = i;
        CHECK(pthread_create(&wr[i].th, NULL, writer_main, &wr[i]) == 0);
    }
    for (i = 0; i < N_WRITERS; i++) pthread_join(wr[i].th, NULL);
    for (i = 0; i < N_READERS; i++) pthread_join(rd[i].th, NULL);
    for (i = 0; i < N_WRITERS; i++) refused_clear += wr[i].refusal_clear;
    for (i = 0; i < N_READERS; i++) CHECK(rd[i].failures == 0);
    print_message("quota: %d of %d writers refused with the quota named; %d closes logged\n", refused_clear,
                  N_WRITERS, quota_closes() - closes0);
    CHECK(refused_clear == N_WRITERS);
    CHECK(quota_closes() - closes0 >= N_WRITERS);
    /* the store is full of data, yet a new client is served */
    late = make_client(dm_store_port(srv));
    {
        void* v = NULL;
        size_t n = 0;
        CHECK_OK(dm_store_get(late, "r0", &v, &n));
        CHECK(n == strlen("reader 0") && memcmp(v, "reader 0", n) == 0);
        dm_store_free(late, v);
    }
    dm_store_destroy(late);
    dm_store_destroy(setup);
    dm_store_destroy(srv);
}

DM_TEST_MAIN(NULL, NULL,
    cmocka_unit_test(test_quota_64mib_set),
    cmocka_unit_test(test_quota_64mib_roundtrip_with_room),
    cmocka_unit_test(test_quota_reply_from_value),
    cmocka_unit_test(test_quota_set_tail_with_next_request),
    cmocka_unit_test(test_quota_notice_wire),
    cmocka_unit_test(test_quota_many_clients))
