/* Encrypted links between hosts (DISTMESH_ENCRYPT, distmesh_socket.h >>socket aead,
   distmesh_tcp.h >>tcp seal), every step with a deadline:
   - the key derivation: HKDF-SHA256 against RFC 5869 test case 1; one key per direction and
     per connection;
   - the encrypted link alone over a socket pair: a stream in odd pieces (records of every
     size) comes through; a flipped bit is EBADMSG and nothing of that record reaches the
     caller's buffer; a stream that ends inside a record is the end of stream (err 0), the
     part dropped; a send seals a batch of records (the same records on the wire) and a link
     that stays encrypted reads several records at once, one that may go back to a plain socket
     exactly its own, a flip inside a batch caught;
   - a man in the middle between forked ranks on two simulated hosts (DISTMESH_TEST_HOST_ID):
     this program defines connect() itself, so every data connection a rank opens goes to a
     proxy thread of that rank, which connects onward to the real listener and relays (the
     hello passes: the connector signs the address it meant). The proxy parses the sealed
     records and tampers with the first large one (an all-reduce's data, not the setup's):
     flips a bit, replays it, swaps it with the next, drops it, cuts it and closes, or puts a
     record of another connection (2 ranks: of the other direction) in its place. On 2 and 4
     ranks every rank's 4 MiB all-reduce either returns the right result or fails within 1 s
     (the rank that reads the record with DM_ERR_PROTOCOL naming the peer's address, the
     others as the failure reaches them; a cut stream is a lost peer), never a wrong result.
     Controls: untampered through
     the proxy, encrypted, gives the right result (and the proxy saw records); with
     DISTMESH_ENCRYPT=0 and the token the proxy's flipped bit reaches a result (the test can
     fail); DISTMESH_ENCRYPT=1 without a token is DM_ERR_ENV naming both variables;
   - every way a group gets links (create, split, links made on demand, shrink with none
     excluded and without rank 0, renumbered), over shared
     memory or sockets within a host and 1 or 2 sockets per peer: exactly the links between
     hosts are encrypted (their ops table, looked at directly), and every result is right.
   This program compiles the implementation itself (DISTMESH_IMPLEMENTATION, DISTMESH_TCP,
   DISTMESH_OPENSSL) to drive the link and the key derivation directly. */
#define _GNU_SOURCE
#include "prelude.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define DISTMESH_IMPLEMENTATION
#include "distmesh.h"
#if !defined(DISTMESH_TCP) || !defined(DISTMESH_OPENSSL)
#error "build with -DDISTMESH_TCP -DDISTMESH_OPENSSL"
#endif
#include "test_world.h"

static tw_store g_store;
TW_STORE_FIXTURES(g_store, "dm_encrypt_test", SIG_IGN)

/* ---- key derivation ------------------------------------------------------------------------ */
static void test_hkdf_rfc5869(void** state) {
    unsigned char ikm[22], salt[13], okm[32];
    char info[10], hx[65];
    int i;
    (void)state;
    memset(ikm, 0x0b, sizeof(ikm));
    for (i = 0; i < 13; i++) salt[i] = (unsigned char)i;
    for (i = 0; i < 10; i++) info[i] = (char)(0xf0 + i);
    _dm_hkdf_sha256(salt, sizeof(salt), ikm, sizeof(ikm), info, sizeof(info), okm);
    tohex(okm, 32, hx);     /* the first 32 of case 1's 42 bytes */
    assert_string_equal(hx, "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf");
}

static void test_keys_per_direction_and_connection(void** state) {
    unsigned char n1[64], n2[64], k01[32], k10[32], k01b[32], k01c[32], k01d[32];
    (void)state;
    memset(n1, 1, sizeof(n1));
    memset(n2, 1, sizeof(n2));
    n2[63] = 2;
    _dm_aead_key("secret", n1, "distmesh/g0/", 0, 1, k01);
    _dm_aead_key("secret", n1, "distmesh/g0/", 1, 0, k10);
    _dm_aead_key("secret", n2, "distmesh/g0/", 0, 1, k01b);
    _dm_aead_key("other", n1, "distmesh/g0/", 0, 1, k01c);
    _dm_aead_key("secret", n1, "distmesh/g1/", 0, 1, k01d);
    CHECK(memcmp(k01, k10, 32) != 0);
    CHECK(memcmp(k01, k01b, 32) != 0);
    CHECK(memcmp(k01, k01c, 32) != 0);
    CHECK(memcmp(k01, k01d, 32) != 0);
    _dm_aead_key("secret", n1, "distmesh/g0/", 0, 1, k01b);
    CHECK(memcmp(k01, k01b, 32) == 0);
}

/* ---- the link alone over a socket pair ---------------------------------------------------- */
static _dm_link* pair_link(int fd, const unsigned char* ks, const unsigned char* kr) {
    static const dm_allocator none = { 0 };
    _dm_socklink* s = (_dm_socklink*)_dm_calloc(&none, sizeof(_dm_socklink));
    _dm_link* w;
    s->base.vt = &_dm_sock_vt;
    s->base.fd = s->fds[0] = fd;
    s->nsock = 1;
    snprintf(s->base.where, sizeof(s->base.where), "pair fd %d", fd);
    w = _dm_aead_wrap(&s->base, ks, kr, &none);
    assert_non_null(w);
    return w;
}
/* Destroys the two links of a pair and closes its sockets. */
static void pair_close(_dm_link* a, _dm_link* b, const int sv[2]) {
    static const dm_allocator none = { 0 };
    a->vt->destroy(a, &none);
    b->vt->destroy(b, &none);
    close(sv[0]);
    close(sv[1]);
}
/* Moves n bytes from a to b through the links, in pieces of varying size; 0, or the receive's
   errno (-1 for a failed send). */
static int pump_through(_dm_link* a, _dm_link* b, const unsigned char* src, unsigned char* dst, size_t n) {
    size_t sent = 0, got = 0, step = 1;
    int64_t deadline = tw_now_ms() + 10000;
    while (got < n && tw_now_ms() < deadline) {
        int err = 0;
        ptrdiff_t k;
        if (sent < n) {
            size_t m = step < n - sent ? step : n - sent;
            k = a->vt->send(a, src + sent, m, &err);
            if (k < 0) return -1;
            sent += (size_t)k;
            step = step * 3 + 1;
            if (step > 300000) step = 1;
        }
        k = b->vt->recv(b, dst + got, n - got < 7000 ? n - got : 7000, &err);
        if (k < 0) return err ? err : -2;
        got += (size_t)k;
    }
    return got == n ? 0 : -3;
}
static void test_link_round_trip_and_flip(void** state) {
    int sv[2], i, err = 0;
    unsigned char k1[32], k2[32], rec[64];
    size_t n = (size_t)3 << 20;
    unsigned char* src = (unsigned char*)malloc(n);
    unsigned char* dst = (unsigned char*)malloc(n);
    _dm_link *a, *b;
    ptrdiff_t k;
    (void)state;
    memset(k1, 7, 32);
    memset(k2, 9, 32);
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) == 0);
    a = pair_link(sv[0], k1, k2);
    b = pair_link(sv[1], k2, k1);
    for (i = 0; i < (int)n; i++) src[i] = (unsigned char)(i * 131 + (i >> 9));
    assert_int_equal(pump_through(a, b, src, dst, n), 0);
    CHECK(memcmp(src, dst, n) == 0);
    assert_int_equal(pump_through(b, a, src, dst, 100000), 0);     /* the other direction */
    CHECK(memcmp(src, dst, 100000) == 0);
    /* one record of 40 bytes, a bit flipped on the wire: nothing of it reaches the buffer */
    k = a->vt->send(a, src, 40, &err);
    assert_int_equal((int)k, 40);
    CHECK(tw_recv_n(sv[1], rec, 4 + 40 + 16) == 60);
    rec[4 + 17] ^= 0x10;
    CHECK(write(sv[0], rec, 60) == 60);     /* back in at a's end of the pair: b reads it */
    memset(dst, 0xee, 64);
    for (i = 0; i < 1000; i++) {
        k = b->vt->recv(b, dst, 64, &err);
        if (k != 0) break;
        tw_sleep_ms(1);
    }
    assert_int_equal((int)k, -1);
    assert_int_equal(err, EBADMSG);
    for (i = 0; i < 64; i++) CHECK(dst[i] == 0xee);
    k = b->vt->recv(b, dst, 64, &err);     /* and stays failed */
    assert_int_equal((int)k, -1);
    pair_close(a, b, sv);
    /* a stream cut inside a record: the end of stream, nothing of the part handed out */
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) == 0);
    a = pair_link(sv[0], k1, k2);
    b = pair_link(sv[1], k2, k1);
    k = a->vt->send(a, src, 40, &err);
    assert_int_equal((int)k, 40);
    CHECK(tw_recv_n(sv[1], rec, 60) == 60);
    CHECK(write(sv[0], rec, 30) == 30);
    shutdown(sv[0], SHUT_WR);
    memset(dst, 0xee, 64);
    for (i = 0; i < 1000; i++) {
        err = -1;
        k = b->vt->recv(b, dst, 64, &err);
        if (k != 0) break;
        tw_sleep_ms(1);
    }
    assert_int_equal((int)k, -1);
    assert_int_equal(err, 0);
    for (i = 0; i < 64; i++) CHECK(dst[i] == 0xee);
    pair_close(a, b, sv);
    free(src);
    free(dst);
}

/* Sends n bytes (two pieces) through a, the sealed records read raw off the pair's other end
   into raw (up to cap): the count the send reported in its one call that moved them, and the
   raw bytes in *got. */
static ptrdiff_t send_batch_raw(_dm_link* a, int raw_fd, const unsigned char* src, size_t n, unsigned char* raw,
                                size_t cap, size_t* got) {
    _dm_iov two[2];
    ptrdiff_t k = 0;
    int i, err = 0;
    two[0].buf = src; two[0].len = 1000;
    two[1].buf = src + 1000; two[1].len = n - 1000;
    *got = 0;
    for (i = 0; i < 10000 && k == 0; i++) {    /* 0 until every record of the batch is out */
        ssize_t r;
        k = a->vt->sendv(a, two, 2, &err);
        while ((r = recv(raw_fd, raw + *got, cap - *got, MSG_DONTWAIT)) > 0) *got += (size_t)r;
    }
    for (i = 0; i < 100; i++) {                /* what the kernel still held */
        ssize_t r = recv(raw_fd, raw + *got, cap - *got, MSG_DONTWAIT);
        if (r > 0) *got += (size_t)r;
        else tw_sleep_ms(1);
    }
    return k;
}
/* Writes raw into fd whole (the pair's end the link is not on: the link reads it). */
static void put_raw(int fd, const unsigned char* raw, size_t n) {
    size_t off = 0;
    int i;
    for (i = 0; i < 10000 && off < n; i++) {
        ssize_t w = write(fd, raw + off, n - off);
        if (w > 0) off += (size_t)w;
        else tw_sleep_ms(1);
    }
    CHECK(off == n);
}
/* Receives up to want bytes into dst (waiting up to 10 s for the first): the count, or -1 with
   *err. */
static ptrdiff_t recv_some(_dm_link* b, unsigned char* dst, size_t want, int* err) {
    ptrdiff_t k = 0;
    int i;
    for (i = 0; i < 10000 && k == 0; i++) {
        k = b->vt->recv(b, dst, want, err);
        if (k == 0) tw_sleep_ms(1);
    }
    return k;
}
/* Bytes of records the encrypted link holds (read from its socket link, not yet handed out). */
static size_t aead_held(_dm_link* l) {
    const _dm_aeadlink* x = (const _dm_aeadlink*)l;
    return x->ifill - x->istart;
}
/* A busy link in batches: a send seals as many records of the presented bytes as a batch
   holds and reports them in one call (once all are out), the records on the wire as they were
   (65536 bytes each, then the rest; pieces crossed); a link told it stays encrypted
   (_dm_aead_read_ahead) takes several records from the socket in one read, one that is not
   takes exactly the record it needs (it may go back to a plain socket: nothing after its
   records may be taken); a flipped bit in a batch: the records before it come through, then
   EBADMSG, nothing of the flipped record in the buffer. */
static void test_link_batches(void** state) {
    const size_t n = 2 * (size_t)65536 + 100, wire = 2 * ((size_t)4 + 65536 + 16) + 4 + 100 + 16;
    unsigned char k1[32], k2[32], peek1;
    unsigned char* src = (unsigned char*)malloc(n);
    unsigned char* dst = (unsigned char*)malloc(n);
    unsigned char* raw = (unsigned char*)malloc(2 * wire);
    size_t got = 0, i;
    int sv[2], err = 0, ahead;
    ptrdiff_t k;
    _dm_link *a, *b;
    (void)state;
    memset(k1, 3, 32);
    memset(k2, 5, 32);
    for (i = 0; i < n; i++) src[i] = (unsigned char)(i * 7 + (i >> 11));
    for (ahead = 0; ahead < 3; ahead++) {      /* 0: exact reads, 1: read ahead, 2: read ahead, a flip */
        CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) == 0);
        a = pair_link(sv[0], k1, k2);
        b = pair_link(sv[1], k2, k1);
        if (ahead) _dm_aead_read_ahead(b);
        assert_int_equal((int)a->vt->send(a, src, 40, &err), 40);      /* a small record first */
        CHECK(tw_recv_n(sv[1], raw, 60) == 60);
        k = send_batch_raw(a, sv[1], src, n, raw + 60, 2 * wire, &got);
        assert_int_equal((int)k, (int)n);                      /* the batch in one call */
        assert_int_equal((int)got, (int)wire);                 /* three records, no more */
        assert_int_equal((int)_dm_get32(raw + 60), 65536);
        assert_int_equal((int)_dm_get32(raw + 60 + 4 + 65536 + 16), 65536);
        assert_int_equal((int)_dm_get32(raw + 60 + 2 * (4 + 65536 + 16)), 100);
        if (ahead == 2) raw[60 + 4 + 65536 + 16 + 4 + 300] ^= 0x01;   /* the second record */
        put_raw(sv[0], raw, 60 + wire);        /* in at a's end: b reads them */
        memset(dst, 0xee, n);
        assert_int_equal((int)recv_some(b, dst, 40, &err), 40);
        CHECK(memcmp(src, dst, 40) == 0);
        if (!ahead) CHECK(aead_held(b) == 0);  /* the small record taken alone (the socket link's own
                                                  read-ahead stays its own when it is unwrapped) */
        else CHECK(aead_held(b) > 0);           /* read past it */
        assert_int_equal((int)recv_some(b, dst, 7, &err), 7);  /* the first record whole, opened */
        assert_int_equal((int)recv_some(b, dst + 7, 65536 - 7, &err), 65536 - 7);
        k = recv_some(b, dst + 65536, n, &err);
        if (ahead == 2) {
            assert_int_equal((int)k, -1);
            assert_int_equal(err, EBADMSG);
            CHECK(memcmp(src, dst, 65536) == 0);
            for (i = 65536; i < n; i++) CHECK(dst[i] == 0xee);
        } else {
            assert_int_equal((int)k, 65536);
            /* the third record: in the link's buffer when it reads ahead, else still in the socket */
            if (ahead) {
                CHECK(recv(sv[1], &peek1, 1, MSG_PEEK | MSG_DONTWAIT) < 0);
                assert_int_equal((int)_dm_sock_pending(b), 4 + 100 + 16);
            } else {
                CHECK(recv(sv[1], &peek1, 1, MSG_PEEK | MSG_DONTWAIT) == 1);
                assert_int_equal((int)aead_held(b), 0);
            }
            assert_int_equal((int)recv_some(b, dst + 2 * 65536, 100, &err), 100);
            CHECK(memcmp(src, dst, n) == 0);
        }
        pair_close(a, b, sv);
    }
    free(src);
    free(dst);
    free(raw);
}

/* ---- the man in the middle ----------------------------------------------------------------- */
enum { MITM_NONE, MITM_FLIP, MITM_REPLAY, MITM_REORDER, MITM_DROP, MITM_TRUNCATE, MITM_SPLICE, MITM_PLAIN_FLIP,
       MITM_SETUP_FLIP };
static const char* const mode_names[] = { "none", "flip", "replay", "reorder", "drop", "truncate", "splice",
                                          "plain flip", "setup flip" };
#define BIG_RECORD 8192         /* records this large are an all-reduce's data, not the setup's */
#define REC_MAX (4 + 65536 + 16)
#define N_FLOATS ((size_t)1 << 20)
#define PLAIN_FLIP_AT ((long)1 << 20)   /* the plain control flips a bit this far into a direction */
typedef struct rank_out {
    int done, status, correct;
    int64_t ms;
    char msg[300];
} rank_out;
typedef struct mitm_shared {    /* MAP_SHARED: the parent and every forked rank */
    int mode, world;
    int claims;                 /* tampers claimed (the first large record anywhere wins) */
    int tampered;               /* tampers done */
    int records, big;           /* records seen (well-formed lengths), large ones */
    int donor_state;            /* SPLICE: 0 none, 1 being written, 2 ready */
    long donor_conn, donor_dir;
    size_t donor_len;
    unsigned char donor[REC_MAX];
    rank_out out[8];
} mitm_shared;
static mitm_shared* g_sh;
static int g_mitm_on;           /* in a rank: connects go through a proxy */
static long g_conn_seq;

static int real_connect(int fd, const struct sockaddr* sa, socklen_t len) {
    return (int)syscall(SYS_connect, fd, sa, len);
}

typedef struct proxy_conn {
    int a, b;                   /* a: the rank's connection to the proxy; b: onward to the listener */
    long id;
    pthread_mutex_t mu;
    bool cut;
} proxy_conn;
typedef struct proxy_dir {
    proxy_conn* pc;
    int in, out, dir;           /* dir 0: connector -> acceptor, 1: acceptor -> connector */
} proxy_dir;

static bool claim(void) { return __atomic_fetch_add(&g_sh->claims, 1, __ATOMIC_SEQ_CST) == 0; }
static void tampered(void) { __atomic_fetch_add(&g_sh->tampered, 1, __ATOMIC_SEQ_CST); }

/* Plain bytes through, one bit flipped at PLAIN_FLIP_AT (once, anywhere). */
static void pump_plain(proxy_dir* d, bool flip) {
    unsigned char buf[65536];
    long at = 0;
    for (;;) {
        ssize_t k = recv(d->in, buf, sizeof(buf), 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return;
        if (flip && at <= PLAIN_FLIP_AT && PLAIN_FLIP_AT < at + k && claim()) {
            buf[PLAIN_FLIP_AT - at] ^= 0x40;
            tampered();
        }
        at += k;
        if (!tw_send_all(d->out, buf, (size_t)k)) return;
    }
}
/* Whether a spliced record may come from (conn, dir) into d's stream: another connection on 4
   ranks, the other direction of the same one on 2 (there is one connection between hosts). */
static bool donor_fits(const proxy_dir* d) {
    if (g_sh->world > 2) return g_sh->donor_conn != d->pc->id;
    return g_sh->donor_conn != d->pc->id || g_sh->donor_dir != d->dir;
}
static void* pump(void* arg) {
    proxy_dir* d = (proxy_dir*)arg;
    unsigned char hs[88];
    unsigned char* rec = (unsigned char*)malloc(REC_MAX);
    unsigned char* held = (unsigned char*)malloc(REC_MAX);
    size_t held_len = 0;
    size_t hs_len = d->dir == 0 ? 56 + 32 : 72 + 8;     /* hello + proof; challenge + ack */
    int mode = g_sh->mode;
    size_t first = d->dir == 0 ? 56 : 72;              /* each message on its own: they alternate */
    if (!tw_recv_all(d->in, hs, first) || !tw_send_all(d->out, hs, first)) goto end;
    if (!tw_recv_all(d->in, hs, hs_len - first) || !tw_send_all(d->out, hs, hs_len - first)) goto end;
    if (mode == MITM_PLAIN_FLIP) { pump_plain(d, true); goto end; }
    for (;;) {
        size_t len, n;
        bool big;
        if (!tw_recv_all(d->in, rec, 4)) break;
        len = (size_t)rec[0] | (size_t)rec[1] << 8 | (size_t)rec[2] << 16 | (size_t)rec[3] << 24;
        if (len == 0 || len > 65536) {  /* not records (a link within a host, unsealed): plain */
            if (!tw_send_all(d->out, rec, 4)) break;
            pump_plain(d, false);
            break;
        }
        n = 4 + len + 16;
        if (!tw_recv_all(d->in, rec + 4, n - 4)) break;
        __atomic_fetch_add(&g_sh->records, 1, __ATOMIC_SEQ_CST);
        big = len >= BIG_RECORD;
        if (big) __atomic_fetch_add(&g_sh->big, 1, __ATOMIC_SEQ_CST);
        if (held_len) {                 /* REORDER: this one first, then the one held back */
            tampered();                 /* counted first: the ranks may fail and exit before a count after */
            if (!tw_send_all(d->out, rec, n) || !tw_send_all(d->out, held, held_len)) break;
            held_len = 0;
            continue;
        }
        if (big && mode == MITM_SPLICE) {
            int empty = 0;
            if (__atomic_compare_exchange_n(&g_sh->donor_state, &empty, 1, false, __ATOMIC_SEQ_CST,
                                            __ATOMIC_SEQ_CST)) {
                memcpy(g_sh->donor, rec, n);
                g_sh->donor_len = n;
                g_sh->donor_conn = d->pc->id;
                g_sh->donor_dir = d->dir;
                __atomic_store_n(&g_sh->donor_state, 2, __ATOMIC_SEQ_CST);
            } else if (__atomic_load_n(&g_sh->donor_state, __ATOMIC_SEQ_CST) == 2 && donor_fits(d) && claim()) {
                tampered();             /* counted first, as REORDER's */
                if (!tw_send_all(d->out, g_sh->donor, g_sh->donor_len)) break;
                continue;
            }
        } else if ((big || (mode == MITM_SETUP_FLIP && d->dir == 0)) && mode != MITM_NONE && claim()) {
            if (mode == MITM_FLIP || mode == MITM_SETUP_FLIP) {
                rec[4 + len / 2] ^= 0x40;     /* a bit no float sum rounds away */
                tampered();
            } else if (mode == MITM_REPLAY) {
                tampered();             /* counted first, as REORDER's */
                if (!tw_send_all(d->out, rec, n)) break;
            } else if (mode == MITM_REORDER) {
                memcpy(held, rec, n);
                held_len = n;
                continue;
            } else if (mode == MITM_DROP) {
                tampered();
                continue;
            } else if (mode == MITM_TRUNCATE) {
                tampered();             /* counted first, as REORDER's */
                (void)tw_send_all(d->out, rec, 4 + len / 2);
                pthread_mutex_lock(&d->pc->mu);
                d->pc->cut = true;
                shutdown(d->pc->a, SHUT_RDWR);
                shutdown(d->pc->b, SHUT_RDWR);
                pthread_mutex_unlock(&d->pc->mu);
                break;
            }
        }
        if (!tw_send_all(d->out, rec, n)) break;
    }
end:
    shutdown(d->out, SHUT_WR);
    free(rec);
    free(held);
    return NULL;
}
typedef struct proxy_start {
    int lfd;
    struct sockaddr_in dst;
} proxy_start;
static void* proxy_main(void* arg) {
    proxy_start* ps = (proxy_start*)arg;
    proxy_conn* pc = (proxy_conn*)calloc(1, sizeof(proxy_conn));
    proxy_dir* d = (proxy_dir*)calloc(2, sizeof(proxy_dir));
    struct pollfd p;
    pthread_t t[2];
    int i;
    p.fd = ps->lfd;
    p.events = POLLIN;
    if (poll(&p, 1, 20000) != 1 || (pc->a = accept(ps->lfd, NULL, NULL)) < 0) goto out;
    pc->b = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (pc->b < 0 || real_connect(pc->b, (struct sockaddr*)&ps->dst, sizeof(ps->dst)) != 0) {
        close(pc->a);           /* the listener is gone: the connector sees its connection end */
        if (pc->b >= 0) close(pc->b);
        goto out;
    }
    pc->id = (long)getpid() * 1000 + __atomic_fetch_add(&g_conn_seq, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_init(&pc->mu, NULL);
    for (i = 0; i < 2; i++) {
        d[i].pc = pc;
        d[i].dir = i;
        d[i].in = i == 0 ? pc->a : pc->b;
        d[i].out = i == 0 ? pc->b : pc->a;
        pthread_create(&t[i], NULL, pump, &d[i]);
    }
    for (i = 0; i < 2; i++) pthread_join(t[i], NULL);
    close(pc->a);
    close(pc->b);
out:
    close(ps->lfd);
    free(ps);
    free(d);
    free(pc);
    return NULL;
}
/* Every IPv4 connect of a rank with the man in the middle on goes to a fresh proxy of its own:
   a listener on 127.0.0.1 whose thread accepts this one connection and connects onward. */
#if defined(__USE_GNU) && !defined(__cplusplus)   /* glibc's transparent union under _GNU_SOURCE */
int connect(int fd, __CONST_SOCKADDR_ARG arg, socklen_t len) {
    const struct sockaddr* sa = arg.__sockaddr__;
#else
int connect(int fd, const struct sockaddr* sa, socklen_t len) {
#endif
    proxy_start* ps;
    struct sockaddr_in at;
    socklen_t alen = sizeof(at);
    pthread_t th;
    pthread_attr_t attr;
    int lfd;
    if (!g_mitm_on || !sa || sa->sa_family != AF_INET) return real_connect(fd, sa, len);
    lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    memset(&at, 0, sizeof(at));
    at.sin_family = AF_INET;
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (lfd < 0 || bind(lfd, (struct sockaddr*)&at, sizeof(at)) != 0 || listen(lfd, 1) != 0 ||
        getsockname(lfd, (struct sockaddr*)&at, &alen) != 0) {
        if (lfd >= 0) close(lfd);
        return real_connect(fd, sa, len);
    }
    ps = (proxy_start*)calloc(1, sizeof(*ps));
    ps->lfd = lfd;
    memcpy(&ps->dst, sa, sizeof(ps->dst));
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_create(&th, &attr, proxy_main, ps);
    pthread_attr_destroy(&attr);
    return real_connect(fd, (struct sockaddr*)&at, sizeof(at));
}

/* ---- the ranks ----------------------------------------------------------------------------- */
typedef struct mitm_case {
    int mode;
    int encrypt;                /* desc.encrypt */
    bool proxy;
} mitm_case;
static void mitm_before(int rank, void* arg) {
    const mitm_case* mc = (const mitm_case*)arg;
    (void)rank;
    g_mitm_on = mc->proxy;
}
static void mitm_edit(dm_tcp_desc* d, int rank, void* arg) {
    const mitm_case* mc = (const mitm_case*)arg;
    (void)rank;
    d->token = "encrypt-test-token";
    d->encrypt = mc->encrypt;
    d->transport = "auto";
}
/* The proxy threads of the connections a rank made run in its process, so its exit would cut off
   what they still forward for the others (a peer would see EOF): each rank stays until every rank
   is done (10 s at most). */
static void mitm_wait_all_done(int world) {
    int64_t end = tw_now_ms() + 10000;
    int r;
    for (r = 0; r < world; r++)
        while (!__atomic_load_n(&g_sh->out[r].done, __ATOMIC_SEQ_CST) && tw_now_ms() < end) tw_sleep_ms(1);
}
static int mitm_body(dm_collective* c, int rank, int world, void* arg) {
    float* x = (float*)malloc(N_FLOATS * sizeof(float));
    rank_out* o = &g_sh->out[rank];
    int64_t t0;
    size_t i;
    dm_status st;
    (void)arg;
    for (i = 0; i < N_FLOATS; i++) x[i] = (float)((int)(i % 7) + rank + 1);    /* no zeros: a flipped bit shows */
    st = dm_barrier(c);
    t0 = tw_now_ms();
    if (st == DM_OK) st = dm_all_reduce(c, NULL, x, N_FLOATS, DM_FLOAT32, DM_SUM);
    o->ms = tw_now_ms() - t0;
    o->status = (int)st;
    o->correct = 1;
    for (i = 0; i < N_FLOATS && o->correct; i++)
        if (x[i] != (float)(world * ((int)(i % 7) + 1) + world * (world - 1) / 2)) o->correct = 0;
    snprintf(o->msg, sizeof(o->msg), "%s", st == DM_OK ? "" : dm_last_error(c));
    __atomic_store_n(&o->done, 1, __ATOMIC_SEQ_CST);
    free(x);
    mitm_wait_all_done(world);
    return 0;
}
/* Runs world ranks (2 simulated hosts) with the man in the middle as mc says; fills g_sh. */
static void run_mitm(int world, const mitm_case* mc) {
    tw_dm_world w;
    int failed;
    memset(g_sh, 0, sizeof(*g_sh));
    g_sh->mode = mc->mode;
    g_sh->world = world;
    tw_dm_world_init(&w, world, &g_store, "auto", 20000);
    w.per_host = world / 2;
    w.before = mitm_before;
    w.edit = mitm_edit;
    w.body = mitm_body;
    w.arg = (void*)mc;
    failed = tw_dm_run(&w, 40);
    if (failed) print_message("%s on %d ranks: %d rank processes failed (create, or the limit)\n",
                              mode_names[mc->mode], world, failed);
    assert_int_equal(failed, 0);
}
static void print_outcomes(int world) {
    int r;
    for (r = 0; r < world; r++)
        print_message("  rank %d: %s in %lld ms, result %s%s%s\n", r, dm_status_name((dm_status)g_sh->out[r].status),
                      (long long)g_sh->out[r].ms,
                      g_sh->out[r].status != DM_OK ? "undefined (failed)" : g_sh->out[r].correct ? "right" : "WRONG",
                      g_sh->out[r].msg[0] ? ": " : "", g_sh->out[r].msg);
}
/* Tampered: every rank is right or failed within 1 s; none wrong; the reader of the record
   failed with DM_ERR_PROTOCOL naming its peer (truncation: or the cut seen as a lost peer). */
static void check_tampered(int world, int mode) {
    mitm_case mc;
    int r, failed = 0, protocol = 0;
    mc.mode = mode;
    mc.encrypt = 1;
    mc.proxy = true;
    run_mitm(world, &mc);
    print_message("%s on %d ranks: %d tamper(s), %d records (%d large)\n", mode_names[mode], world, g_sh->tampered,
                  g_sh->records, g_sh->big);
    print_outcomes(world);
    CHECK(g_sh->tampered >= 1);
    for (r = 0; r < world; r++) {
        rank_out* o = &g_sh->out[r];
        CHECK(o->done);
        if (o->status == DM_OK) {
            CHECK(o->correct);
            continue;
        }
        failed++;
        CHECK(o->ms < 1000);
        if (o->status == DM_ERR_PROTOCOL) {
            protocol++;
            CHECK(strstr(o->msg, "127.0.0.1:") != NULL);     /* the peer's address */
            CHECK(strstr(o->msg, "authentication") != NULL);
        }
    }
    CHECK(failed >= 1);
    if (mode != MITM_TRUNCATE) CHECK(protocol >= 1);
}
/* SETUP_FLIP: the ranks make the group themselves, and the first sealed record of any size from
   a connector to the rank that accepted it (the setup's exchange, before the ranks' addresses
   are known: the acceptor knows no address of the connector yet) is flipped. The create of the
   rank that reads it fails with DM_ERR_PROTOCOL naming the peer's address ("()" before the
   link knew it); the others' fail too. */
static int mitm_create_body(dm_collective* none, int rank, int world, void* arg) {
    rank_out* o = &g_sh->out[rank];
    dm_tcp_desc d;
    dm_collective* c = NULL;
    int64_t t0 = tw_now_ms();
    (void)none;
    tw_tcp_desc(&d, &g_store, rank, world, 3000);
    mitm_edit(&d, rank, arg);
    o->status = (int)dm_tcp_create(&d, &c);
    o->ms = tw_now_ms() - t0;
    snprintf(o->msg, sizeof(o->msg), "%s", o->status == DM_OK ? "" : dm_last_error(NULL));
    __atomic_store_n(&o->done, 1, __ATOMIC_SEQ_CST);
    dm_destroy(c);
    return 0;
}
static void test_setup_flip_names_the_peer(void** state) {
    mitm_case mc = { MITM_SETUP_FLIP, 1, true };
    tw_dm_world w;
    int r, protocol = 0;
    (void)state;
    memset(g_sh, 0, sizeof(*g_sh));
    g_sh->mode = mc.mode;
    g_sh->world = 2;
    tw_dm_world_init(&w, 2, &g_store, "auto", 3000);
    w.per_host = 1;
    w.no_create = true;
    w.before = mitm_before;
    w.body = mitm_create_body;
    w.arg = &mc;
    assert_int_equal(tw_dm_run(&w, 40), 0);
    print_outcomes(2);
    CHECK(g_sh->tampered == 1);
    for (r = 0; r < 2; r++) {
        rank_out* o = &g_sh->out[r];
        CHECK(o->done && o->status != DM_OK);
        CHECK(strstr(o->msg, "()") == NULL);                    /* every message names what it knows */
        if (o->status == DM_ERR_PROTOCOL) {
            protocol++;
            check_has_all(o->msg, "127.0.0.1:", "authentication", NULL);
        }
    }
    CHECK(protocol >= 1);
}
/* Whether every one of world ranks is done, DM_OK and right; if not, every rank's outcome is
   printed (once). */
static bool all_right(int world) {
    int r;
    for (r = 0; r < world; r++)
        if (!(g_sh->out[r].done && g_sh->out[r].status == DM_OK && g_sh->out[r].correct)) {
            print_outcomes(world);
            return false;
        }
    return true;
}
static void test_untampered_encrypted(void** state) {
    int world;
    (void)state;
    for (world = 2; world <= 4; world += 2) {
        mitm_case mc = { MITM_NONE, 1, true };
        run_mitm(world, &mc);
        print_message("untampered on %d ranks: %d records (%d large)\n", world, g_sh->records, g_sh->big);
        CHECK(all_right(world));
        CHECK(g_sh->big >= 8);          /* the data went as sealed records */
        CHECK(g_sh->tampered == 0);
    }
    {   /* the default with a token (desc.encrypt 0, DISTMESH_ENCRYPT unset) is the same */
        mitm_case mc = { MITM_NONE, 0, true };
        unsetenv("DISTMESH_ENCRYPT");
        run_mitm(2, &mc);
        CHECK(all_right(2));
        CHECK(g_sh->big >= 8);
    }
}
static void test_plain_flip_gets_through(void** state) {
    mitm_case mc = { MITM_PLAIN_FLIP, 0, true };
    int r, wrong = 0;
    (void)state;
    setenv("DISTMESH_ENCRYPT", "0", 1);     /* the token stays: only the hello is protected */
    run_mitm(2, &mc);
    unsetenv("DISTMESH_ENCRYPT");
    print_message("plain flip on 2 ranks: %d tamper(s)\n", g_sh->tampered);
    print_outcomes(2);
    CHECK(g_sh->tampered == 1);
    CHECK(g_sh->big == 0);
    for (r = 0; r < 2; r++) wrong += g_sh->out[r].status == DM_OK && !g_sh->out[r].correct;
    CHECK(wrong >= 1);                      /* the man in the middle changed a result */
}
static void test_flip(void** state) { (void)state; check_tampered(2, MITM_FLIP); check_tampered(4, MITM_FLIP); }
static void test_replay(void** state) { (void)state; check_tampered(2, MITM_REPLAY); check_tampered(4, MITM_REPLAY); }
static void test_reorder(void** state) { (void)state; check_tampered(2, MITM_REORDER); check_tampered(4, MITM_REORDER); }
static void test_drop(void** state) { (void)state; check_tampered(2, MITM_DROP); check_tampered(4, MITM_DROP); }
static void test_truncate(void** state) {
    (void)state;
    check_tampered(2, MITM_TRUNCATE);
    check_tampered(4, MITM_TRUNCATE);
}
static void test_splice(void** state) { (void)state; check_tampered(2, MITM_SPLICE); check_tampered(4, MITM_SPLICE); }

/* ---- every way a group gets links, encrypted --------------------------------------------- */
/* Each of c's links is encrypted exactly when its peer is on another simulated host (rank r on
   host r / per_host of the parent world: host_of of the group itself). 0 when so. */
static int links_sealed_right(dm_collective* c, const char* when) {
    _dm_tcp* t = (_dm_tcp*)c;
    int j, me = dm_rank(c), bad = 0;
    for (j = 0; j < dm_world_size(c); j++) {
        _dm_link* l = t->lk.links[j];
        bool other = t->host_of[j] != t->host_of[me], sealed = l && l->vt == &_dm_aead_vt;
        if (j == me || !l) continue;
        if (sealed != other) {
            fprintf(stderr, "rank %d (%s): link to rank %d (%s host, %s) is %s\n", me, when, j,
                    other ? "another" : "the same", l->vt->name, sealed ? "encrypted" : "plain");
            bad = 1;
        }
    }
    return bad;
}
static int reduce_ok(dm_collective* c, size_t n) {
    int W = dm_world_size(c), r = dm_rank(c);
    float* x = (float*)malloc(n * sizeof(float));
    size_t i;
    int bad = 0;
    for (i = 0; i < n; i++) x[i] = (float)((int)(i % 5) + r);
    if (dm_all_reduce(c, NULL, x, n, DM_FLOAT32, DM_SUM) != DM_OK) {
        fprintf(stderr, "rank %d: all_reduce of %zu: %s\n", r, n, dm_last_error(c));
        bad = 1;
    }
    for (i = 0; i < n && !bad; i++)
        if (x[i] != (float)(W * (int)(i % 5) + W * (W - 1) / 2)) bad = 1;
    free(x);
    return bad;
}
/* Every ordered pair in turn: the lower rank sends, the higher receives, then back (links to
   peers outside P are made on demand, >>tcp lazy). */
static int pairs_ok(dm_collective* c) {
    int W = dm_world_size(c), r = dm_rank(c), i, j, bad = 0;
    size_t n = 100000, k;
    int32_t* b = (int32_t*)malloc(n * sizeof(int32_t));
    for (i = 0; i < W; i++)
        for (j = i + 1; j < W; j++) {
            if (r != i && r != j) continue;
            for (k = 0; k < n; k++) b[k] = (int32_t)(k * 3) + i * 1000 + j;
            if (r == i) bad |= dm_send(c, b, n, DM_INT32, j, 7) != DM_OK;
            else bad |= dm_recv(c, b, n, DM_INT32, i, 7) != DM_OK;
            for (k = 0; k < n && !bad; k++) bad |= b[k] != (int32_t)(k * 3) + i * 1000 + j;
            if (r == j) bad |= dm_send(c, b, n, DM_INT32, i, 8) != DM_OK;
            else bad |= dm_recv(c, b, n, DM_INT32, j, 8) != DM_OK;
            if (bad) fprintf(stderr, "rank %d: pair %d-%d: %s\n", r, i, j, dm_last_error(c));
        }
    free(b);
    return bad;
}
static int paths_body(dm_collective* c, int rank, int world, void* arg) {
    dm_collective *half = NULL, *shrunk = NULL;
    int bad = 0;
    (void)world;
    (void)arg;
    bad |= links_sealed_right(c, "create");
    bad |= reduce_ok(c, (size_t)1 << 20);
    bad |= reduce_ok(c, 1000);
    if (dm_split(c, rank % 2, rank, &half) != DM_OK) {
        fprintf(stderr, "rank %d: split: %s\n", rank, dm_last_error(c));
        return 1;
    }
    bad |= links_sealed_right(half, "split");
    bad |= reduce_ok(half, (size_t)1 << 20);
    dm_destroy(half);
    bad |= pairs_ok(c);
    bad |= links_sealed_right(c, "pairs");
    if (dm_shrink(c, NULL, 0, DM_SHRINK_DEFAULT, &shrunk) != DM_OK) {
        fprintf(stderr, "rank %d: shrink: %s\n", rank, dm_last_error(c));
        return 1;
    }
    bad |= links_sealed_right(shrunk, "shrink");
    bad |= reduce_ok(shrunk, (size_t)1 << 20);
    bad |= pairs_ok(shrunk);
    if (rank != 0) {            /* without rank 0: the survivors renumbered, 1 + 2 on two hosts */
        dm_collective* three = NULL;
        int ex = 0;
        if (dm_shrink(shrunk, &ex, 1, DM_SHRINK_DEFAULT, &three) != DM_OK) {
            fprintf(stderr, "rank %d: shrink without rank 0: %s\n", rank, dm_last_error(shrunk));
            dm_destroy(shrunk);
            return 1;
        }
        bad |= dm_world_size(three) != 3 || dm_rank(three) != rank - 1;
        bad |= links_sealed_right(three, "shrink without rank 0");
        bad |= reduce_ok(three, (size_t)1 << 20);
        bad |= pairs_ok(three);
        dm_destroy(three);
    }
    dm_destroy(shrunk);
    return bad;
}
typedef struct paths_case { const char* transport; int sockets; } paths_case;
static void paths_edit(dm_tcp_desc* d, int rank, void* arg) {
    const paths_case* pc = (const paths_case*)arg;
    (void)rank;
    d->token = "encrypt-test-token";
    d->transport = pc->transport;
    d->sockets_per_peer = pc->sockets;
}
/* Create, split, on-demand links, shrink (none excluded) on 4 ranks over 2 simulated hosts,
   shared memory or sockets within a host, 1 or 2 sockets per peer: the links between hosts are
   encrypted, those within a host not, and every result is right. */
static void test_encrypted_paths(void** state) {
    static const paths_case cases[] = { { "auto", 1 }, { "tcp", 2 } };
    size_t k;
    (void)state;
    for (k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        tw_dm_world w;
        int failed;
        tw_dm_world_init(&w, 4, &g_store, cases[k].transport, 20000);
        w.per_host = 2;
        w.edit = paths_edit;
        w.body = paths_body;
        w.arg = (void*)&cases[k];
        failed = tw_dm_run(&w, 60);
        if (failed) print_message("transport %s, %d sockets per peer: %d ranks failed\n", cases[k].transport,
                                  cases[k].sockets, failed);
        assert_int_equal(failed, 0);
    }
}

/* ---- the settings -------------------------------------------------------------------------- */
static void test_encrypt_needs_token(void** state) {
    dm_tcp_desc d;
    dm_collective* c = NULL;
    char err[DM_LAST_ERROR_SIZE];
    bool on = true;
    (void)state;
    unsetenv("DISTMESH_TOKEN");
    setenv("DISTMESH_ENCRYPT", "1", 1);
    tw_tcp_desc(&d, &g_store, 0, 1, 5000);
    assert_int_equal(dm_tcp_create(&d, &c), DM_ERR_ENV);
    CHECK(c == NULL);
    assert_int_equal(_dm_tcp_parse_encrypt(0, NULL, &on, err, sizeof(err)), DM_ERR_ENV);
    check_has_all(err, "DISTMESH_ENCRYPT", "DISTMESH_TOKEN", NULL);
    setenv("DISTMESH_ENCRYPT", "yes", 1);
    assert_int_equal(dm_tcp_create(&d, &c), DM_ERR_ENV);
    unsetenv("DISTMESH_ENCRYPT");
    d.encrypt = 1;                          /* the desc's: an invalid argument */
    assert_int_equal(dm_tcp_create(&d, &c), DM_ERR_INVALID_ARG);
    d.encrypt = 2;
    assert_int_equal(dm_tcp_create(&d, &c), DM_ERR_INVALID_ARG);
    /* the default: on with a token, off without; -1 and DISTMESH_ENCRYPT=0 turn it off */
    assert_int_equal(_dm_tcp_parse_encrypt(0, "t", &on, err, sizeof(err)), DM_OK);
    CHECK(on);
    assert_int_equal(_dm_tcp_parse_encrypt(0, NULL, &on, err, sizeof(err)), DM_OK);
    CHECK(!on);
    assert_int_equal(_dm_tcp_parse_encrypt(-1, "t", &on, err, sizeof(err)), DM_OK);
    CHECK(!on);
    setenv("DISTMESH_ENCRYPT", "0", 1);
    assert_int_equal(_dm_tcp_parse_encrypt(0, "t", &on, err, sizeof(err)), DM_OK);
    CHECK(!on);
    assert_int_equal(_dm_tcp_parse_encrypt(1, "t", &on, err, sizeof(err)), DM_OK);  /* the desc wins */
    CHECK(on);
    unsetenv("DISTMESH_ENCRYPT");
}

/* Ranks given different settings: the hello carries the connector's (version 3: it encrypts),
   so the acceptor refuses it and the connector's create fails naming the setting, in both
   directions of the mismatch; no rank's create succeeds. */
static int mismatch_body(dm_collective* c, int rank, int world, void* arg) {
    int low = *(const int*)arg;     /* rank 0's desc.encrypt; rank 1 the other */
    dm_tcp_desc d;
    dm_status st;
    tw_sim_host(rank);
    tw_tcp_desc(&d, &g_store, rank, world, 1500);     /* the acceptor waits it out */
    d.token = "encrypt-test-token";
    d.encrypt = rank == 0 ? low : -low;
    st = dm_tcp_create(&d, &c);
    if (st == DM_OK) {
        dm_destroy(c);
        return 1;
    }
    if (rank == 1) {        /* the connector: the acceptor's refusal */
        const char* e = dm_last_error(NULL);
        if (st != DM_ERR_INVALID_ARG || !strstr(e, "DISTMESH_ENCRYPT") ||
            !strstr(e, low == 1 ? "this rank does not encrypt" : "this rank encrypts")) {
            fprintf(stderr, "rank 1: %s: %s\n", dm_status_name(st), e);
            return 1;
        }
    }
    return 0;
}
static void test_encrypt_mismatch_named(void** state) {
    static const int lows[2] = { 1, -1 };
    int k;
    (void)state;
    for (k = 0; k < 2; k++) {
        tw_dm_world w;
        tw_dm_world_init(&w, 2, &g_store, NULL, 1500);
        w.no_create = true;
        w.body = mismatch_body;
        w.arg = (void*)&lows[k];
        assert_int_equal(tw_dm_run(&w, 30), 0);
    }
    unsetenv("DISTMESH_TEST_HOST_ID");
}

int main(int argc, char** argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hkdf_rfc5869),
        cmocka_unit_test(test_keys_per_direction_and_connection),
        cmocka_unit_test(test_link_round_trip_and_flip),
        cmocka_unit_test(test_link_batches),
        cmocka_unit_test(test_encrypt_needs_token),
        cmocka_unit_test(test_encrypt_mismatch_named),
        cmocka_unit_test(test_untampered_encrypted),
        cmocka_unit_test(test_encrypted_paths),
        cmocka_unit_test(test_plain_flip_gets_through),
        cmocka_unit_test(test_flip),
        cmocka_unit_test(test_replay),
        cmocka_unit_test(test_reorder),
        cmocka_unit_test(test_drop),
        cmocka_unit_test(test_truncate),
        cmocka_unit_test(test_splice),
        cmocka_unit_test(test_setup_flip_names_the_peer),
    };
    g_sh = (mitm_shared*)mmap(NULL, sizeof(mitm_shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (g_sh == MAP_FAILED) return 1;
    unsetenv("DISTMESH_ENCRYPT");
    unsetenv("DISTMESH_TOKEN");
    return DM_RUN_TESTS(argc, argv, tests, setup_store, teardown_store);
}
