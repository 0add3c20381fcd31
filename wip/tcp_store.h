/* >>store  Rendezvous stores of the TCP backend: a section of distmesh_tcp.h (included from it
   right after its #error check; the lead inlines it there at the end).

   A dm_store is a key-value store shared by the ranks of a job, reached by URL:

       tcp://host:port       PyTorch c10d TCPStore, torch 2.x wire protocol. The process with
       tcp://[::1]:port      is_server hosts the server on its own thread (libuv, own loop);
                             every store (server process included) is a client over TCP.
       file:///abs/dir       one file per key in a shared directory (NFS, local disk).

   desc.url 0 -> $DISTMESH_STORE, else tcp://$MASTER_ADDR:$MASTER_PORT. With
   TORCHELASTIC_USE_AGENT_STORE=True (torchrun >= 2.x) the agent already serves the store on
   MASTER_PORT, so is_server is ignored and every rank is a client.

   Interop with torch: torch's TCPStore client prepends "/" to every key and torch's PrefixStore
   joins with "/": torch's PrefixStore("default_pg", store).set("x") is the wire key
   "/default_pg/x". A distmesh store with prefix "/default_pg/" sees the same keys.

   Semantics follow c10d: get waits for the key (WAIT then GET) until the timeout; add keeps the
   value as decimal text ("42"); compare_set on a missing key sets it only when `expected` is
   empty and returns the value now held (or `expected` when the key is missing and nothing was
   set); wait/get that time out return DM_ERR_TIMEOUT naming the keys; EOF or reset from the
   server -> DM_ERR_PEER_LOST, and the store is unusable afterwards (destroy it).

   Threads: every call on a store (and on its clones, which share its connection) holds the
   store's mutex for the whole request, so several threads may share one store; a long wait
   blocks the others. dm_store_last_error is per object and meant for the thread that got the
   failure. Memory: values returned by get / compare_set / multi_get are allocated with the
   store's allocator and released with dm_store_free. libuv allocates on its own. */
#ifndef DISTMESH_TCP_STORE_DECL
#define DISTMESH_TCP_STORE_DECL

#ifdef __cplusplus
extern "C" {
#endif

/* Limits of the server (a request beyond them closes that client with a protocol error) and of
   the client (values larger than DM_STORE_MAX_VALUE are refused before sending). */
enum {
    DM_STORE_MAX_KEY = 64 * 1024,               /* bytes of one key, prefix included */
    DM_STORE_MAX_VALUE = 64 * 1024 * 1024,      /* bytes of one value */
    DM_STORE_MAX_KEYS = 128 * 1024              /* keys of one wait / check / multi request */
};

typedef struct dm_store dm_store;

typedef struct dm_store_desc {
    const char* url;        /* "tcp://host:port" (IPv6: tcp://[::1]:port), "file:///abs/dir";
                               0 -> DISTMESH_STORE env, else tcp://MASTER_ADDR:MASTER_PORT */
    bool is_server;         /* tcp: host the server in this process (rank 0); ignored when
                               TORCHELASTIC_USE_AGENT_STORE=True (torchrun's agent serves it).
                               Port 0 -> an ephemeral port, see dm_store_port. The server binds
                               the url's host when it is a numeric loopback address (127.x,
                               ::1), else every interface (dual-stack ::, else 0.0.0.0) */
    const char* prefix;     /* 0 -> ""; prepended to every key, e.g. "default_pg/0/" */
    int timeout_ms;         /* 0 -> DISTMESH_TIMEOUT or DM_DEFAULT_TIMEOUT_MS; < 0 -> forever;
                               connect retries and every request, wait and get honour it */
    dm_logger logger;       /* 0 -> silent; the server thread logs protocol errors here */
    dm_allocator allocator; /* 0 -> malloc/free; set both or neither */
} dm_store_desc;

/* Connects (retrying until the timeout: the server may start later) and, with is_server,
   starts the server first. Fails with *out == NULL. */
DM_API dm_status dm_store_create(const dm_store_desc* desc, dm_store** out);
/* A second handle on parent's connection / server / directory (reference counted, so the two
   may be destroyed in any order); its keys get parent's prefix + prefix. */
DM_API dm_status dm_store_clone_prefixed(dm_store* parent, const char* prefix, dm_store** out);
/* Accepts NULL. The last handle closes the connection and stops the server thread. */
DM_API void dm_store_destroy(dm_store* s);

DM_API dm_status dm_store_set(dm_store* s, const char* key, const void* value, size_t size);
/* Waits for the key until the store timeout (like c10d get); *out_value (never NULL on success,
   even for an empty value) is freed with dm_store_free. */
DM_API dm_status dm_store_get(dm_store* s, const char* key, void** out_value, size_t* out_size);
DM_API void dm_store_free(dm_store* s, void* value);
/* Waits until every key exists. timeout_ms 0 -> the store timeout, < 0 -> forever. */
DM_API dm_status dm_store_wait(dm_store* s, const char* const* keys, size_t nkeys, int timeout_ms);
/* Adds delta to the integer held as decimal text (a missing key counts as 0); out (may be NULL)
   gets the new value. */
DM_API dm_status dm_store_add(dm_store* s, const char* key, int64_t delta, int64_t* out);
/* c10d compare_set: if the key holds `expected`, or is missing and expected_size == 0, it gets
   `desired`. out_value / out_size (both NULL or both set) get the value now held (`expected`
   when the key is missing and was not set); free with dm_store_free. */
DM_API dm_status dm_store_compare_set(dm_store* s, const char* key, const void* expected,
                                      size_t expected_size, const void* desired,
                                      size_t desired_size, void** out_value, size_t* out_size);
/* out_deleted (may be NULL): whether the key existed. */
DM_API dm_status dm_store_delete(dm_store* s, const char* key, bool* out_deleted);
/* Whether every key exists now (no waiting). */
DM_API dm_status dm_store_check(dm_store* s, const char* const* keys, size_t nkeys,
                                bool* out_all_present);
/* Keys in the whole store (every prefix). */
DM_API dm_status dm_store_num_keys(dm_store* s, int64_t* out);
/* "" after success; never NULL. */
DM_API const char* dm_store_last_error(const dm_store* s);
/* The port the server listens on (useful with port 0), else the port connected to; 0 for a
   file store or NULL. */
DM_API int dm_store_port(const dm_store* s);

/* Additions beyond the core set (c10d APPEND, MULTI_SET, MULTI_GET). */
/* Appends bytes to the key's value (a missing key is created). */
DM_API dm_status dm_store_append(dm_store* s, const char* key, const void* value, size_t size);
/* Sets n keys in one request. */
DM_API dm_status dm_store_multi_set(dm_store* s, const char* const* keys,
                                    const void* const* values, const size_t* sizes, size_t n);
/* Waits for n keys (store timeout), then gets them in one request: out_values[i] (each freed
   with dm_store_free) and out_sizes[i] are arrays of n the caller provides. */
DM_API dm_status dm_store_multi_get(dm_store* s, const char* const* keys, size_t n,
                                    void** out_values, size_t* out_sizes);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DISTMESH_TCP_STORE_DECL */

/* ============================================================================================ */
#if defined(DISTMESH_IMPLEMENTATION) && !defined(_DM_TCP_STORE_IMPL)
#define _DM_TCP_STORE_IMPL

#include <uv.h>
#include <sys/types.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/file.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <fcntl.h>
#include <dirent.h>

/* >>store wire  c10d TCPStore, torch 2.x (checked byte for byte against torch 2.11's client and
   both of its servers, see tests/fixtures/torch-2.11-wire.jsonl). A request is one opcode byte
   and its fields; integers are little-endian; a string or value is a uint64 length + bytes.
     VALIDATE    u32 magic 0x3C85F7CE                         (first request; no reply)
     PING        u32 nonce                         -> u32 nonce
     SET         key, value                                    (no reply)
     COMPARE_SET key, expected, desired            -> value now held
     GET         key                               -> value ("" when missing)
     ADD         key, i64 delta                    -> i64 new value (stored as decimal text)
     CHECK       u64 n, n keys                     -> u8 READY 0 / NOT_READY 1
     WAIT        u64 n, n keys                     -> u8 STOP_WAITING 0, when all exist
     GETNUMKEYS                                    -> i64
     DELETE_KEY  key                               -> i64 number deleted (0 / 1)
     APPEND      key, value                                    (no reply)
     MULTI_GET   u64 n, n keys                     -> n values
     MULTI_SET   u64 n, n (key, value)                         (no reply)
     CANCEL_WAIT                                   -> u8 WAIT_CANCELED 1 (after any STOP_WAITING
                                                      that raced with it)
   torch's client does get as WAIT [key] then GET, multi_get as WAIT keys then MULTI_GET. */
enum {
    _DM_STQ_VALIDATE = 0, _DM_STQ_SET, _DM_STQ_COMPARE_SET, _DM_STQ_GET, _DM_STQ_ADD,
    _DM_STQ_CHECK, _DM_STQ_WAIT, _DM_STQ_GETNUMKEYS, _DM_STQ_DELETE_KEY, _DM_STQ_APPEND,
    _DM_STQ_MULTI_GET, _DM_STQ_MULTI_SET, _DM_STQ_CANCEL_WAIT, _DM_STQ_PING
};
#define _DM_ST_MAGIC 0x3C85F7CEu
#define _DM_ST_READY 0
#define _DM_ST_NOT_READY 1
#define _DM_ST_STOP_WAITING 0
#define _DM_ST_WAIT_CANCELED 1
/* Largest request the server buffers: compare_set carries two values. */
#define _DM_ST_MAX_REQUEST ((size_t)2 * DM_STORE_MAX_VALUE + (size_t)4 * DM_STORE_MAX_KEY + 64)

/* >>store errors  Every foreign code goes through here: libuv codes directly, errno values via
   uv_translate_sys_error. */
_DM_PRIVATE dm_status _dm_status_from_uv(int uv_code) {
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
    default: return DM_ERR_NETWORK; /* ECONNREFUSED, EHOSTUNREACH, EADDRINUSE, EAI_*, ... */
    }
}
/* "ECONNREFUSED: connection refused" into buf, for the "(cause)" of a message. */
_DM_PRIVATE const char* _dm_store_uv_cause(int uv_code, char* buf, size_t cap) {
    char name[48], text[128];
    uv_err_name_r(uv_code, name, sizeof(name));
    uv_strerror_r(uv_code, text, sizeof(text));
    snprintf(buf, cap, "%s: %s", name, text);
    return buf;
}
_DM_PRIVATE int _dm_store_uv_errno(int e) { return e ? uv_translate_sys_error(e) : UV_EIO; }

/* >>store buffers  A growable byte buffer on an allocator; oom sticks until reset. */
typedef struct _dm_stbuf {
    unsigned char* p;
    size_t len, cap;
    bool oom;
    const dm_allocator* a;
} _dm_stbuf;
_DM_PRIVATE bool _dm_stbuf_reserve(_dm_stbuf* b, size_t extra) {
    unsigned char* np;
    size_t ncap;
    if (b->oom) return false;
    if (extra > SIZE_MAX / 2 - b->len) { b->oom = true; return false; }
    if (b->len + extra <= b->cap) return true;
    ncap = b->cap ? b->cap : 256;
    while (ncap < b->len + extra) ncap *= 2;
    np = (unsigned char*)_dm_malloc(b->a, ncap);
    if (!np) { b->oom = true; return false; }
    if (b->len) memcpy(np, b->p, b->len);
    _dm_free(b->a, b->p);
    b->p = np;
    b->cap = ncap;
    return true;
}
_DM_PRIVATE void _dm_stbuf_put(_dm_stbuf* b, const void* d, size_t n) {
    if (!_dm_stbuf_reserve(b, n)) return;
    if (n) memcpy(b->p + b->len, d, n);
    b->len += n;
}
_DM_PRIVATE void _dm_stbuf_u8(_dm_stbuf* b, unsigned v) {
    unsigned char c = (unsigned char)v;
    _dm_stbuf_put(b, &c, 1);
}
_DM_PRIVATE void _dm_stbuf_u64(_dm_stbuf* b, uint64_t v) {
    unsigned char le[8];
    int i;
    for (i = 0; i < 8; i++) le[i] = (unsigned char)(v >> (8 * i));
    _dm_stbuf_put(b, le, 8);
}
_DM_PRIVATE void _dm_stbuf_u32(_dm_stbuf* b, uint32_t v) {
    unsigned char le[4];
    int i;
    for (i = 0; i < 4; i++) le[i] = (unsigned char)(v >> (8 * i));
    _dm_stbuf_put(b, le, 4);
}
/* uint64 length + bytes */
_DM_PRIVATE void _dm_stbuf_str(_dm_stbuf* b, const void* d, size_t n) {
    _dm_stbuf_u64(b, (uint64_t)n);
    _dm_stbuf_put(b, d, n);
}
_DM_PRIVATE void _dm_stbuf_free(_dm_stbuf* b) {
    _dm_free(b->a, b->p);
    b->p = NULL;
    b->len = b->cap = 0;
    b->oom = false;
}
_DM_PRIVATE uint64_t _dm_st_get_u64(const unsigned char* p) {
    uint64_t v = 0;
    int i;
    for (i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
_DM_PRIVATE uint32_t _dm_st_get_u32(const unsigned char* p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
_DM_PRIVATE uint64_t _dm_st_hash(const void* d, size_t n) {   /* FNV-1a */
    const unsigned char* p = (const unsigned char*)d;
    uint64_t h = 1469598103934665603ull;
    size_t i;
    for (i = 0; i < n; i++) { h ^= p[i]; h *= 1099511628211ull; }
    return h;
}
/* c10d keeps add's value as decimal text and parses it like std::stoll: optional blanks, sign,
   digits, anything after ignored. false when there are no digits or it overflows. */
_DM_PRIVATE bool _dm_st_parse_i64(const unsigned char* p, size_t n, int64_t* out) {
    size_t i = 0;
    bool neg = false, any = false;
    uint64_t v = 0, lim;
    while (i < n && (p[i] == ' ' || (p[i] >= '\t' && p[i] <= '\r'))) i++;
    if (i < n && (p[i] == '+' || p[i] == '-')) neg = p[i++] == '-';
    lim = neg ? (uint64_t)INT64_MAX + 1u : (uint64_t)INT64_MAX;
    for (; i < n && p[i] >= '0' && p[i] <= '9'; i++) {
        unsigned d = (unsigned)(p[i] - '0');
        if (v > (lim - d) / 10) return false;
        v = v * 10 + d;
        any = true;
    }
    if (!any) return false;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return true;
}

/* ============================================================================================ */
/* >>store server  libuv, one thread, one loop owned by the server (never the default loop).
   Everything below runs on the server thread after dm_store_create has bound and listened. */

typedef struct _dm_kv {
    struct _dm_kv* next;
    uint64_t hash;
    unsigned char* key;
    size_t key_len;
    unsigned char* val;         /* allocated with at least 1 byte */
    size_t val_len, val_cap;
} _dm_kv;

struct _dm_srv_client;
typedef struct _dm_srv_wkey {
    uint64_t hash;
    const unsigned char* key;   /* into the waiter's own copy */
    size_t len;
    bool done;
} _dm_srv_wkey;
/* One pending WAIT of one client: the keys that were missing when it arrived. */
typedef struct _dm_srv_waiter {
    struct _dm_srv_waiter *prev, *next;
    struct _dm_srv_client* client;
    size_t nkeys, remaining;
    _dm_srv_wkey* keys;         /* same allocation as the waiter */
} _dm_srv_waiter;

typedef struct _dm_srv {
    uv_loop_t loop;
    uv_tcp_t listener;
    uv_async_t stop;
    pthread_t thread;
    bool thread_started, listener_open, stop_open;
    _dm_kv** buckets;
    size_t nbuckets, nkeys;
    struct _dm_srv_client* clients;
    _dm_srv_waiter* waiters;
    int port;
    dm_logger logger;
    dm_allocator allocator;
} _dm_srv;

typedef struct _dm_srv_client {
    uv_tcp_t tcp;               /* first: a handle pointer is a client pointer */
    _dm_srv* srv;
    struct _dm_srv_client *prev, *next;
    unsigned char* in;          /* received, not yet parsed bytes */
    size_t in_len, in_cap;
    size_t need;                /* don't parse again before in_len reaches this */
    bool validated, closing;
    _dm_srv_waiter* waiter;
    char peer[64];
} _dm_srv_client;

typedef struct _dm_srv_write {
    uv_write_t req;
    const dm_allocator* a;      /* the bytes follow the struct in the same allocation */
} _dm_srv_write;

/* -- the map -- */
_DM_PRIVATE _dm_kv** _dm_srv_slot(_dm_srv* s, const void* key, size_t n, uint64_t h) {
    _dm_kv** pp = &s->buckets[h & (s->nbuckets - 1)];
    for (; *pp; pp = &(*pp)->next)
        if ((*pp)->hash == h && (*pp)->key_len == n && memcmp((*pp)->key, key, n) == 0) break;
    return pp;
}
_DM_PRIVATE _dm_kv* _dm_srv_find(_dm_srv* s, const void* key, size_t n) {
    return *_dm_srv_slot(s, key, n, _dm_st_hash(key, n));
}
_DM_PRIVATE void _dm_srv_kv_free(_dm_srv* s, _dm_kv* e) {
    _dm_free(&s->allocator, e->key);
    _dm_free(&s->allocator, e->val);
    _dm_free(&s->allocator, e);
}
_DM_PRIVATE void _dm_srv_grow(_dm_srv* s) {
    size_t nb = s->nbuckets * 2, i;
    _dm_kv** b = (_dm_kv**)_dm_calloc(&s->allocator, nb * sizeof(*b));
    if (!b) return; /* keep the old table: longer chains, still correct */
    for (i = 0; i < s->nbuckets; i++) {
        _dm_kv* e = s->buckets[i];
        while (e) {
            _dm_kv* nx = e->next;
            e->next = b[e->hash & (nb - 1)];
            b[e->hash & (nb - 1)] = e;
            e = nx;
        }
    }
    _dm_free(&s->allocator, s->buckets);
    s->buckets = b;
    s->nbuckets = nb;
}
/* Replaces (append false) or extends (append true) the value; NULL when out of memory. */
_DM_PRIVATE _dm_kv* _dm_srv_put(_dm_srv* s, const unsigned char* key, size_t kn,
                                const unsigned char* val, size_t vn, bool append) {
    uint64_t h = _dm_st_hash(key, kn);
    _dm_kv** pp = _dm_srv_slot(s, key, kn, h);
    _dm_kv* e = *pp;
    if (!e) {
        e = (_dm_kv*)_dm_calloc(&s->allocator, sizeof(*e));
        if (!e) return NULL;
        e->key = (unsigned char*)_dm_malloc(&s->allocator, kn);
        e->val = (unsigned char*)_dm_malloc(&s->allocator, vn);
        if (!e->key || !e->val) { _dm_srv_kv_free(s, e); return NULL; }
        if (kn) memcpy(e->key, key, kn);
        if (vn) memcpy(e->val, val, vn);
        e->key_len = kn;
        e->val_len = e->val_cap = vn;
        e->hash = h;
        *pp = e;
        if (++s->nkeys > s->nbuckets) _dm_srv_grow(s);
        return e;
    }
    if (append && e->val_len + vn <= e->val_cap) {
        if (vn) memcpy(e->val + e->val_len, val, vn);
        e->val_len += vn;
        return e;
    }
    {
        size_t keep = append ? e->val_len : 0, cap = keep + vn;
        unsigned char* nv;
        if (append && cap < 2 * e->val_cap) cap = 2 * e->val_cap;
        nv = (unsigned char*)_dm_malloc(&s->allocator, cap);
        if (!nv) return NULL;
        if (keep) memcpy(nv, e->val, keep);
        if (vn) memcpy(nv + keep, val, vn);
        _dm_free(&s->allocator, e->val);
        e->val = nv;
        e->val_len = keep + vn;
        e->val_cap = cap;
    }
    return e;
}
_DM_PRIVATE bool _dm_srv_erase(_dm_srv* s, const unsigned char* key, size_t kn) {
    _dm_kv** pp = _dm_srv_slot(s, key, kn, _dm_st_hash(key, kn));
    _dm_kv* e = *pp;
    if (!e) return false;
    *pp = e->next;
    _dm_srv_kv_free(s, e);
    s->nkeys--;
    return true;
}

/* -- clients -- */
_DM_PRIVATE void _dm_srv_close_client(_dm_srv_client* c);

_DM_PRIVATE void _dm_srv_on_written(uv_write_t* req, int status) {
    _dm_srv_write* w = (_dm_srv_write*)req->data;
    _dm_srv_client* c = (_dm_srv_client*)req->handle;
    if (status < 0 && status != UV_ECANCELED && !c->closing) _dm_srv_close_client(c);
    _dm_free(w->a, w);
}
/* Queues bytes for the client (copied); a failure closes the client. */
_DM_PRIVATE void _dm_srv_send(_dm_srv_client* c, const void* d, size_t n) {
    _dm_srv_write* w;
    uv_buf_t buf;
    int rc;
    if (c->closing) return;
    w = (_dm_srv_write*)_dm_malloc(&c->srv->allocator, sizeof(*w) + n);
    if (!w) { _dm_srv_close_client(c); return; }
    w->a = &c->srv->allocator;
    memcpy((unsigned char*)(w + 1), d, n);
    buf.base = (char*)(w + 1);
    buf.len = n;
    w->req.data = w;
    rc = uv_write(&w->req, (uv_stream_t*)&c->tcp, &buf, 1, _dm_srv_on_written); /* copies buf */
    if (rc < 0) {
        _dm_free(w->a, w);
        _dm_srv_close_client(c);
    }
}
_DM_PRIVATE void _dm_srv_send_stbuf(_dm_srv_client* c, _dm_stbuf* b) {
    if (b->oom) _dm_srv_close_client(c);
    else _dm_srv_send(c, b->p, b->len);
    _dm_stbuf_free(b);
}

_DM_PRIVATE void _dm_srv_waiter_drop(_dm_srv* s, _dm_srv_waiter* w) {
    if (w->prev) w->prev->next = w->next;
    else s->waiters = w->next;
    if (w->next) w->next->prev = w->prev;
    if (w->client->waiter == w) w->client->waiter = NULL;
    _dm_free(&s->allocator, w);
}
/* A key now exists: every waiter that registered it counts it once; waiters done get
   STOP_WAITING. */
_DM_PRIVATE void _dm_srv_wake(_dm_srv* s, const unsigned char* key, size_t kn) {
    uint64_t h = _dm_st_hash(key, kn);
    _dm_srv_waiter* w = s->waiters;
    while (w) {
        _dm_srv_waiter* nx = w->next;
        size_t i;
        for (i = 0; i < w->nkeys; i++) {
            _dm_srv_wkey* k = &w->keys[i];
            if (!k->done && k->hash == h && k->len == kn && memcmp(k->key, key, kn) == 0) {
                k->done = true;
                w->remaining--;
            }
        }
        if (w->remaining == 0) {
            unsigned char b = _DM_ST_STOP_WAITING;
            _dm_srv_client* c = w->client;
            _dm_srv_waiter_drop(s, w);
            _dm_srv_send(c, &b, 1);
        }
        w = nx;
    }
}

_DM_PRIVATE void _dm_srv_on_client_closed(uv_handle_t* h) {
    _dm_srv_client* c = (_dm_srv_client*)h;
    _dm_srv* s = c->srv;
    if (c->prev) c->prev->next = c->next;
    else s->clients = c->next;
    if (c->next) c->next->prev = c->prev;
    _dm_free(&s->allocator, c->in);
    _dm_free(&s->allocator, c);
}
_DM_PRIVATE void _dm_srv_close_client(_dm_srv_client* c) {
    if (c->closing) return;
    c->closing = true;
    if (c->waiter) _dm_srv_waiter_drop(c->srv, c->waiter);
    uv_close((uv_handle_t*)&c->tcp, _dm_srv_on_client_closed);
}
_DM_PRIVATE _DM_PRINTF(2, 3) void _dm_srv_protocol_error(_dm_srv_client* c, const char* fmt, ...) {
    char what[256], msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    _DM_REPORT(&c->srv->logger, msg, sizeof(msg), DM_ERR_PROTOCOL,
               "tcp-store: server closed client %s (%s)", c->peer, what);
    _dm_srv_close_client(c);
}

/* -- request parsing. A cursor over the client's buffer; every read checks that the bytes are
   there (else: more needed, remembered in `need`) and every length against its cap. -- */
typedef struct _dm_srv_cur {
    const unsigned char* p;
    size_t len, off, need;
    const char* bad;            /* set when the request is malformed */
} _dm_srv_cur;
_DM_PRIVATE bool _dm_srv_have(_dm_srv_cur* k, size_t n) {
    if (k->bad) return false;
    if (n > k->len - k->off) {
        k->need = k->off + n;
        return false;
    }
    return true;
}
_DM_PRIVATE bool _dm_srv_rd_u64(_dm_srv_cur* k, uint64_t* v) {
    if (!_dm_srv_have(k, 8)) return false;
    *v = _dm_st_get_u64(k->p + k->off);
    k->off += 8;
    return true;
}
_DM_PRIVATE bool _dm_srv_rd_u32(_dm_srv_cur* k, uint32_t* v) {
    if (!_dm_srv_have(k, 4)) return false;
    *v = _dm_st_get_u32(k->p + k->off);
    k->off += 4;
    return true;
}
_DM_PRIVATE bool _dm_srv_rd_str(_dm_srv_cur* k, uint64_t cap, const char* what,
                                const unsigned char** d, size_t* n) {
    uint64_t len;
    if (!_dm_srv_rd_u64(k, &len)) return false;
    if (len > cap) { k->bad = what; return false; }
    if (!_dm_srv_have(k, (size_t)len)) return false;
    *d = k->p + k->off;
    *n = (size_t)len;
    k->off += (size_t)len;
    return true;
}
#define _DM_SRV_KEY(k, d, n) _dm_srv_rd_str((k), DM_STORE_MAX_KEY, "key longer than DM_STORE_MAX_KEY", (d), (n))
#define _DM_SRV_VAL(k, d, n) _dm_srv_rd_str((k), DM_STORE_MAX_VALUE, "value longer than DM_STORE_MAX_VALUE", (d), (n))
_DM_PRIVATE bool _dm_srv_rd_count(_dm_srv_cur* k, uint64_t* n) {
    if (!_dm_srv_rd_u64(k, n)) return false;
    if (*n > DM_STORE_MAX_KEYS) { k->bad = "key count above DM_STORE_MAX_KEYS"; return false; }
    return true;
}
/* Skips n keys (exec false: completeness check before anything is executed). */
_DM_PRIVATE bool _dm_srv_skip_keys(_dm_srv_cur* k, uint64_t n, bool values) {
    uint64_t i;
    const unsigned char* d;
    size_t len;
    for (i = 0; i < n; i++) {
        if (!_DM_SRV_KEY(k, &d, &len)) return false;
        if (values && !_DM_SRV_VAL(k, &d, &len)) return false;
    }
    return true;
}

_DM_PRIVATE bool _dm_srv_all_present(_dm_srv* s, _dm_srv_cur* k, uint64_t n) {
    uint64_t i;
    bool all = true;
    for (i = 0; i < n; i++) {
        const unsigned char* d = NULL;
        size_t len = 0;
        _DM_SRV_KEY(k, &d, &len);
        if (!_dm_srv_find(s, d, len)) all = false;
    }
    return all;
}

/* Parses and executes one request at the start of the buffer. Returns bytes consumed, 0 when
   more bytes are needed (k.need set), or closes the client and returns 0 (c->closing). */
_DM_PRIVATE size_t _dm_srv_one(_dm_srv_client* c) {
    _dm_srv* s = c->srv;
    _dm_srv_cur k;
    unsigned op;
    const unsigned char *key = NULL, *v1 = NULL, *v2 = NULL;
    size_t kn = 0, n1 = 0, n2 = 0;
    uint64_t cnt = 0;
    _dm_stbuf out;
    memset(&k, 0, sizeof(k));
    memset(&out, 0, sizeof(out));
    out.a = &s->allocator;
    k.p = c->in;
    k.len = c->in_len;
    op = k.p[k.off++];
    if (!c->validated && op != _DM_STQ_VALIDATE) {
        _dm_srv_protocol_error(c, "first request has opcode %u, not VALIDATE (a torch < 2.2 client?)", op);
        return 0;
    }
    switch (op) {
    case _DM_STQ_VALIDATE: {
        uint32_t magic;
        if (!_dm_srv_rd_u32(&k, &magic)) break;
        if (magic != _DM_ST_MAGIC) {
            _dm_srv_protocol_error(c, "VALIDATE magic 0x%08X, expected 0x%08X", (unsigned)magic, _DM_ST_MAGIC);
            return 0;
        }
        c->validated = true;
        return k.off;
    }
    case _DM_STQ_PING: {
        uint32_t nonce;
        if (!_dm_srv_rd_u32(&k, &nonce)) break;
        _dm_stbuf_u32(&out, nonce);
        _dm_srv_send_stbuf(c, &out);
        return k.off;
    }
    case _DM_STQ_SET:
    case _DM_STQ_APPEND:
        if (!_DM_SRV_KEY(&k, &key, &kn) || !_DM_SRV_VAL(&k, &v1, &n1)) break;
        if (!_dm_srv_put(s, key, kn, v1, n1, op == _DM_STQ_APPEND)) goto oom;
        _dm_srv_wake(s, key, kn);
        return k.off;
    case _DM_STQ_COMPARE_SET: {
        _dm_kv* e;
        if (!_DM_SRV_KEY(&k, &key, &kn) || !_DM_SRV_VAL(&k, &v1, &n1) || !_DM_SRV_VAL(&k, &v2, &n2)) break;
        e = _dm_srv_find(s, key, kn);
        if (!e && n1 == 0) {
            if (!(e = _dm_srv_put(s, key, kn, v2, n2, false))) goto oom;
        } else if (e && e->val_len == n1 && (n1 == 0 || memcmp(e->val, v1, n1) == 0)) {
            if (!(e = _dm_srv_put(s, key, kn, v2, n2, false))) goto oom;
        }
        if (e) _dm_stbuf_str(&out, e->val, e->val_len);
        else _dm_stbuf_str(&out, v1, n1);   /* missing and not set: c10d answers `expected` */
        _dm_srv_send_stbuf(c, &out);
        if (e) _dm_srv_wake(s, key, kn);
        return k.off;
    }
    case _DM_STQ_GET: {
        _dm_kv* e;
        if (!_DM_SRV_KEY(&k, &key, &kn)) break;
        e = _dm_srv_find(s, key, kn);
        if (e) _dm_stbuf_str(&out, e->val, e->val_len);
        else _dm_stbuf_str(&out, NULL, 0);
        _dm_srv_send_stbuf(c, &out);
        return k.off;
    }
    case _DM_STQ_ADD: {
        uint64_t delta;
        int64_t cur = 0;
        char txt[32];
        _dm_kv* e;
        if (!_DM_SRV_KEY(&k, &key, &kn) || !_dm_srv_rd_u64(&k, &delta)) break;
        e = _dm_srv_find(s, key, kn);
        if (e && !_dm_st_parse_i64(e->val, e->val_len, &cur)) {
            _dm_srv_protocol_error(c, "ADD on a key whose value is not a decimal int64");
            return 0;
        }
        cur = (int64_t)((uint64_t)cur + delta); /* wraps like two's complement */
        snprintf(txt, sizeof(txt), "%lld", (long long)cur);
        if (!_dm_srv_put(s, key, kn, (const unsigned char*)txt, strlen(txt), false)) goto oom;
        _dm_stbuf_u64(&out, (uint64_t)cur);
        _dm_srv_send_stbuf(c, &out);
        _dm_srv_wake(s, key, kn);
        return k.off;
    }
    case _DM_STQ_CHECK:
    case _DM_STQ_WAIT: {
        size_t start, i, missing = 0, bytes = 0;
        bool all;
        if (!_dm_srv_rd_count(&k, &cnt)) break;
        start = k.off;
        if (!_dm_srv_skip_keys(&k, cnt, false)) break;
        k.off = start;
        all = _dm_srv_all_present(s, &k, cnt);
        if (op == _DM_STQ_CHECK) {
            _dm_stbuf_u8(&out, all ? _DM_ST_READY : _DM_ST_NOT_READY);
            _dm_srv_send_stbuf(c, &out);
            return k.off;
        }
        if (all) {
            _dm_stbuf_u8(&out, _DM_ST_STOP_WAITING);
            _dm_srv_send_stbuf(c, &out);
            return k.off;
        }
        /* register the missing keys; one pending wait per client (a new one replaces it) */
        if (c->waiter) _dm_srv_waiter_drop(s, c->waiter);
        k.off = start;
        for (i = 0; i < cnt; i++) {
            _DM_SRV_KEY(&k, &key, &kn);
            if (!_dm_srv_find(s, key, kn)) { missing++; bytes += kn; }
        }
        {
            _dm_srv_waiter* w = (_dm_srv_waiter*)_dm_calloc(
                &s->allocator, sizeof(*w) + missing * sizeof(_dm_srv_wkey) + bytes);
            unsigned char* kp;
            size_t j = 0;
            if (!w) goto oom;
            w->keys = (_dm_srv_wkey*)(w + 1);
            kp = (unsigned char*)(w->keys + missing);
            k.off = start;
            for (i = 0; i < cnt; i++) {
                _DM_SRV_KEY(&k, &key, &kn);
                if (_dm_srv_find(s, key, kn)) continue;
                if (kn) memcpy(kp, key, kn);
                w->keys[j].key = kp;
                w->keys[j].len = kn;
                w->keys[j].hash = _dm_st_hash(key, kn);
                kp += kn;
                j++;
            }
            w->nkeys = w->remaining = missing;
            w->client = c;
            w->next = s->waiters;
            if (s->waiters) s->waiters->prev = w;
            s->waiters = w;
            c->waiter = w;
        }
        return k.off;
    }
    case _DM_STQ_GETNUMKEYS:
        _dm_stbuf_u64(&out, (uint64_t)s->nkeys);
        _dm_srv_send_stbuf(c, &out);
        return k.off;
    case _DM_STQ_DELETE_KEY:
        if (!_DM_SRV_KEY(&k, &key, &kn)) break;
        _dm_stbuf_u64(&out, _dm_srv_erase(s, key, kn) ? 1u : 0u);
        _dm_srv_send_stbuf(c, &out);
        return k.off;
    case _DM_STQ_MULTI_GET: {
        size_t start, i;
        if (!_dm_srv_rd_count(&k, &cnt)) break;
        start = k.off;
        if (!_dm_srv_skip_keys(&k, cnt, false)) break;
        k.off = start;
        for (i = 0; i < cnt; i++) {
            _dm_kv* e;
            _DM_SRV_KEY(&k, &key, &kn);
            e = _dm_srv_find(s, key, kn);
            if (e) _dm_stbuf_str(&out, e->val, e->val_len);
            else _dm_stbuf_str(&out, NULL, 0);
        }
        _dm_srv_send_stbuf(c, &out);
        return k.off;
    }
    case _DM_STQ_MULTI_SET: {
        size_t start, i;
        if (!_dm_srv_rd_count(&k, &cnt)) break;
        start = k.off;
        if (!_dm_srv_skip_keys(&k, cnt, true)) break;
        k.off = start;
        for (i = 0; i < cnt; i++) {
            _DM_SRV_KEY(&k, &key, &kn);
            _DM_SRV_VAL(&k, &v1, &n1);
            if (!_dm_srv_put(s, key, kn, v1, n1, false)) goto oom;
            _dm_srv_wake(s, key, kn);
        }
        return k.off;
    }
    case _DM_STQ_CANCEL_WAIT:
        if (c->waiter) _dm_srv_waiter_drop(s, c->waiter);
        _dm_stbuf_u8(&out, _DM_ST_WAIT_CANCELED);
        _dm_srv_send_stbuf(c, &out);
        return k.off;
    default:
        _dm_srv_protocol_error(c, "unknown opcode %u", op);
        return 0;
    }
    /* incomplete or malformed */
    _dm_stbuf_free(&out);
    if (k.bad) {
        _dm_srv_protocol_error(c, "opcode %u: %s", op, k.bad);
        return 0;
    }
    c->need = k.need;
    return 0;
oom:
    _dm_stbuf_free(&out);
    _dm_srv_protocol_error(c, "out of memory serving opcode %u", op);
    return 0;
}

_DM_PRIVATE void _dm_srv_alloc(uv_handle_t* h, size_t suggested, uv_buf_t* buf) {
    _dm_srv_client* c = (_dm_srv_client*)h;
    size_t want = 64 * 1024, cap;
    (void)suggested;
    if (c->need > c->in_len && c->need - c->in_len > want) want = c->need - c->in_len;
    if (c->in_cap - c->in_len < 4096 || (c->need > c->in_cap && c->in_cap < _DM_ST_MAX_REQUEST)) {
        unsigned char* np;
        cap = c->in_cap ? c->in_cap : 4096;
        while (cap < c->in_len + want && cap < _DM_ST_MAX_REQUEST) cap *= 2;
        if (cap > _DM_ST_MAX_REQUEST) cap = _DM_ST_MAX_REQUEST;
        if (cap > c->in_cap) {
            np = (unsigned char*)_dm_malloc(&c->srv->allocator, cap);
            if (np) {
                if (c->in_len) memcpy(np, c->in, c->in_len);
                _dm_free(&c->srv->allocator, c->in);
                c->in = np;
                c->in_cap = cap;
            }
        }
    }
    if (c->in_cap == c->in_len) {   /* full at the cap, or no memory: read_cb gets UV_ENOBUFS */
        buf->base = NULL;
        buf->len = 0;
        return;
    }
    buf->base = (char*)(c->in + c->in_len);
    buf->len = c->in_cap - c->in_len;
}

_DM_PRIVATE void _dm_srv_on_read(uv_stream_t* st, ssize_t nread, const uv_buf_t* buf) {
    _dm_srv_client* c = (_dm_srv_client*)st;
    size_t off = 0;
    (void)buf;
    if (c->closing) return;
    if (nread == UV_ENOBUFS) {
        _dm_srv_protocol_error(c, "request larger than %zu bytes", (size_t)_DM_ST_MAX_REQUEST);
        return;
    }
    if (nread < 0) {        /* EOF or reset: the client left; its pending wait goes with it */
        _dm_srv_close_client(c);
        return;
    }
    c->in_len += (size_t)nread;
    if (c->in_len < c->need) return;
    c->need = 0;
    while (off < c->in_len && !c->closing) {
        size_t used;
        /* parse on a view that starts at off */
        unsigned char* base = c->in;
        size_t total = c->in_len;
        c->in = base + off;
        c->in_len = total - off;
        used = _dm_srv_one(c);
        c->in = base;
        c->in_len = total;
        if (!used) break;
        off += used;
    }
    if (c->closing) return;
    /* need was computed on the view that started at off, which now moves to 0 */
    if (off) {
        memmove(c->in, c->in + off, c->in_len - off);
        c->in_len -= off;
    }
    if (c->in_len == 0 && c->in_cap > 1024 * 1024) {   /* give a big buffer back when idle */
        _dm_free(&c->srv->allocator, c->in);
        c->in = NULL;
        c->in_cap = 0;
    }
}

_DM_PRIVATE void _dm_srv_on_connect(uv_stream_t* l, int status) {
    _dm_srv* s = (_dm_srv*)l->data;
    _dm_srv_client* c;
    struct sockaddr_storage ss;
    int sl = (int)sizeof(ss);
    if (status < 0) {
        char cause[200], msg[300];
        _DM_REPORT(&s->logger, msg, sizeof(msg), _dm_status_from_uv(status),
                   "tcp-store: server accept failed (%s)", _dm_store_uv_cause(status, cause, sizeof(cause)));
        return;
    }
    c = (_dm_srv_client*)_dm_calloc(&s->allocator, sizeof(*c));
    if (!c) {   /* the connection stays in the backlog; the client times out */
        char msg[200];
        _DM_REPORT(&s->logger, msg, sizeof(msg), DM_ERR_OUT_OF_MEMORY, "tcp-store: server accept (out of memory)");
        return;
    }
    c->srv = s;
    if (uv_tcp_init(&s->loop, &c->tcp) < 0) { _dm_free(&s->allocator, c); return; }
    c->next = s->clients;
    if (s->clients) s->clients->prev = c;
    s->clients = c;
    snprintf(c->peer, sizeof(c->peer), "?");
    if (uv_accept(l, (uv_stream_t*)&c->tcp) < 0) { _dm_srv_close_client(c); return; }
    uv_tcp_nodelay(&c->tcp, 1);
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr*)&ss, &sl) == 0) {
        char ip[INET6_ADDRSTRLEN] = "?";
        int port = 0;
        if (ss.ss_family == AF_INET6) {
            uv_ip6_name((const struct sockaddr_in6*)&ss, ip, sizeof(ip));
            port = ntohs(((const struct sockaddr_in6*)&ss)->sin6_port);
        } else {
            uv_ip4_name((const struct sockaddr_in*)&ss, ip, sizeof(ip));
            port = ntohs(((const struct sockaddr_in*)&ss)->sin_port);
        }
        snprintf(c->peer, sizeof(c->peer), "%s:%d", ip, port);
    }
    if (uv_read_start((uv_stream_t*)&c->tcp, _dm_srv_alloc, _dm_srv_on_read) < 0) _dm_srv_close_client(c);
}

_DM_PRIVATE void _dm_srv_on_stop(uv_async_t* a) {
    _dm_srv* s = (_dm_srv*)a->data;
    _dm_srv_client* c = s->clients;
    while (c) {
        _dm_srv_client* nx = c->next;
        _dm_srv_close_client(c);
        c = nx;
    }
    if (s->listener_open) uv_close((uv_handle_t*)&s->listener, NULL);
    s->listener_open = false;
    uv_close((uv_handle_t*)&s->stop, NULL);
    s->stop_open = false;
}
_DM_PRIVATE void* _dm_srv_thread(void* arg) {
    _dm_srv* s = (_dm_srv*)arg;
    uv_run(&s->loop, UV_RUN_DEFAULT);   /* returns once on_stop has closed every handle */
    return NULL;
}
/* Frees everything; the loop must have no open handle (thread joined, or never started). */
_DM_PRIVATE void _dm_srv_free(_dm_srv* s) {
    size_t i;
    if (!s) return;
    if (s->listener_open) uv_close((uv_handle_t*)&s->listener, NULL);
    if (s->stop_open) uv_close((uv_handle_t*)&s->stop, NULL);
    {
        _dm_srv_client* c = s->clients;
        for (; c; c = c->next) _dm_srv_close_client(c);
    }
    uv_run(&s->loop, UV_RUN_DEFAULT);   /* runs the close callbacks */
    uv_loop_close(&s->loop);
    while (s->waiters) _dm_srv_waiter_drop(s, s->waiters);
    for (i = 0; i < s->nbuckets; i++) {
        _dm_kv* e = s->buckets[i];
        while (e) { _dm_kv* nx = e->next; _dm_srv_kv_free(s, e); e = nx; }
    }
    _dm_free(&s->allocator, s->buckets);
    _dm_free(&s->allocator, s);
}
_DM_PRIVATE void _dm_srv_stop(_dm_srv* s) {
    if (!s) return;
    if (s->thread_started) {
        uv_async_send(&s->stop);
        pthread_join(s->thread, NULL);
        s->thread_started = false;
    }
    _dm_srv_free(s);
}

/* Binds host:port (numeric loopback host: exactly it; else dual-stack ::, else 0.0.0.0),
   listens, starts the thread. err gets "what (cause)" on failure. */
_DM_PRIVATE dm_status _dm_srv_start(const char* host, int port, const dm_logger* lg,
                                    const dm_allocator* a, _dm_srv** out, char* err, size_t cap) {
    _dm_srv* s;
    struct sockaddr_storage ss;
    int rc, sl = (int)sizeof(ss);
    char cause[200];
    bool loop_open = false;
    const char* bound = host;
    *out = NULL;
    s = (_dm_srv*)_dm_calloc(a, sizeof(*s));
    if (!s) { snprintf(err, cap, "out of memory"); return DM_ERR_OUT_OF_MEMORY; }
    s->allocator = *a;
    s->logger = *lg;
    s->nbuckets = 64;
    s->buckets = (_dm_kv**)_dm_calloc(a, s->nbuckets * sizeof(_dm_kv*));
    if (!s->buckets) { rc = UV_ENOMEM; goto fail_what; }
    if ((rc = uv_loop_init(&s->loop)) < 0) goto fail_what;
    loop_open = true;
    if ((rc = uv_async_init(&s->loop, &s->stop, _dm_srv_on_stop)) < 0) goto fail_what;
    s->stop_open = true;
    s->stop.data = s;
    if ((rc = uv_tcp_init(&s->loop, &s->listener)) < 0) goto fail_what;
    s->listener_open = true;
    s->listener.data = s;
    {
        struct sockaddr_in6 a6;
        struct sockaddr_in a4;
        bool loop6 = strcmp(host, "::1") == 0;
        bool loop4 = (strncmp(host, "127.", 4) == 0 && uv_ip4_addr(host, port, &a4) == 0) ||
                     (strcmp(host, "localhost") == 0 && uv_ip4_addr("127.0.0.1", port, &a4) == 0);
        if (loop4) {
            rc = uv_tcp_bind(&s->listener, (const struct sockaddr*)&a4, 0);
        } else if (loop6) {
            uv_ip6_addr("::1", port, &a6);
            rc = uv_tcp_bind(&s->listener, (const struct sockaddr*)&a6, UV_TCP_IPV6ONLY);
        } else {
            bound = "::";
            uv_ip6_addr("::", port, &a6);
            rc = uv_tcp_bind(&s->listener, (const struct sockaddr*)&a6, 0);
            if (rc == 0) rc = uv_listen((uv_stream_t*)&s->listener, 1024, _dm_srv_on_connect);
            if (rc < 0 && rc != UV_EADDRINUSE) {   /* no IPv6 here: IPv4 on every interface */
                uv_close((uv_handle_t*)&s->listener, NULL);
                uv_run(&s->loop, UV_RUN_NOWAIT);
                if ((rc = uv_tcp_init(&s->loop, &s->listener)) < 0) { s->listener_open = false; goto fail_what; }
                bound = "0.0.0.0";
                uv_ip4_addr("0.0.0.0", port, &a4);
                rc = uv_tcp_bind(&s->listener, (const struct sockaddr*)&a4, 0);
            } else if (rc == 0) {
                goto listening;
            }
        }
        if (rc == 0) rc = uv_listen((uv_stream_t*)&s->listener, 1024, _dm_srv_on_connect);
        if (rc < 0) {
            snprintf(err, cap, "cannot listen on %.64s port %d (%.100s)", bound, port,
                     _dm_store_uv_cause(rc, cause, sizeof(cause)));
            _dm_srv_free(s);
            return _dm_status_from_uv(rc);
        }
    }
listening:
    if ((rc = uv_tcp_getsockname(&s->listener, (struct sockaddr*)&ss, &sl)) < 0) goto fail_what;
    s->port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6*)&ss)->sin6_port)
                                       : ntohs(((struct sockaddr_in*)&ss)->sin_port);
    if (pthread_create(&s->thread, NULL, _dm_srv_thread, s) != 0) { rc = UV_EAGAIN; goto fail_what; }
    s->thread_started = true;
    *out = s;
    return DM_OK;
fail_what:
    snprintf(err, cap, "cannot start the server (%.100s)", _dm_store_uv_cause(rc, cause, sizeof(cause)));
    if (loop_open) _dm_srv_free(s);
    else { _dm_free(a, s->buckets); _dm_free(a, s); }
    return _dm_status_from_uv(rc);
}

/* ============================================================================================ */
/* >>store object */

enum { _DM_STORE_TCP = 1, _DM_STORE_FILE = 2 };

/* The part clones share: connection (or directory) and server, behind one mutex. */
typedef struct _dm_store_shared {
    pthread_mutex_t mu;         /* held for each whole request; guards refs and fd */
    int refs;
    int kind;
    int fd;                     /* tcp client socket, -1 once broken */
    bool broken;
    char broken_why[160];
    _dm_srv* server;
    int port;
    char host[256];
    char* dir;                  /* file store directory */
    dm_allocator allocator;
} _dm_store_shared;

struct dm_store {
    _dm_store_shared* sh;
    char* prefix;
    size_t prefix_len;
    int timeout_ms;             /* resolved: > 0 or < 0 (forever) */
    dm_logger logger;
    dm_allocator allocator;
    char last_error[DM_LAST_ERROR_SIZE];
};

#define _DM_STORE_FAIL(s, st, ...) \
    _DM_REPORT(&(s)->logger, (s)->last_error, sizeof((s)->last_error), (st), __VA_ARGS__)

/* prefix + key into a new buffer (NUL-terminated for the file store's names). */
_DM_PRIVATE unsigned char* _dm_store_key(dm_store* s, const char* key, size_t* n) {
    size_t kl = strlen(key);
    unsigned char* p;
    if (kl > DM_STORE_MAX_KEY || s->prefix_len + kl > DM_STORE_MAX_KEY) return NULL;
    p = (unsigned char*)_dm_malloc(&s->allocator, s->prefix_len + kl + 1);
    if (!p) return NULL;
    if (s->prefix_len) memcpy(p, s->prefix, s->prefix_len);
    memcpy(p + s->prefix_len, key, kl + 1);
    *n = s->prefix_len + kl;
    return p;
}
/* "a", "b", "c" for messages (truncated). */
_DM_PRIVATE const char* _dm_store_keylist(dm_store* s, const char* const* keys, size_t n,
                                          char* buf, size_t cap) {
    size_t i, used = 0;
    buf[0] = 0;
    for (i = 0; i < n && used + 8 < cap; i++) {
        int w = snprintf(buf + used, cap - used, "%s\"%.*s%s\"", i ? ", " : "",
                         (int)(s->prefix_len > 64 ? 64 : s->prefix_len), s->prefix ? s->prefix : "", keys[i]);
        if (w < 0) break;
        used += (size_t)w;
        if (used >= cap) { used = cap - 1; break; }
    }
    if (i < n && cap > 5) snprintf(buf + (used > cap - 5 ? cap - 5 : used), 5, "...");
    return buf;
}

/* ---------------- tcp client: blocking socket, poll() deadlines ---------------- */

_DM_PRIVATE int _dm_store_poll_ms(int64_t deadline) {
    int64_t left;
    if (deadline == INT64_MAX) return 1000;
    left = deadline - _dm_now_ms();
    if (left <= 0) return 0;
    return left > 1000 ? 1000 : (int)left;
}
/* 0, or a uv error code (UV_ETIMEDOUT at the deadline). */
_DM_PRIVATE int _dm_store_send_all(int fd, const unsigned char* p, size_t n, int64_t deadline) {
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w > 0) { p += w; n -= (size_t)w; continue; }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pf;
            int ms = _dm_store_poll_ms(deadline), r;
            if (ms == 0) return UV_ETIMEDOUT;
            pf.fd = fd; pf.events = POLLOUT; pf.revents = 0;
            r = poll(&pf, 1, ms);
            if (r < 0 && errno != EINTR) return _dm_store_uv_errno(errno);
            continue;
        }
        return _dm_store_uv_errno(errno);
    }
    return 0;
}
_DM_PRIVATE int _dm_store_recv_all(int fd, unsigned char* p, size_t n, int64_t deadline) {
    while (n) {
        struct pollfd pf;
        int ms, r;
        ssize_t got;
        pf.fd = fd; pf.events = POLLIN; pf.revents = 0;
        ms = _dm_store_poll_ms(deadline);
        if (ms == 0) return UV_ETIMEDOUT;
        r = poll(&pf, 1, ms);
        if (r < 0) { if (errno == EINTR) continue; return _dm_store_uv_errno(errno); }
        if (r == 0) continue;
        got = recv(fd, p, n, 0);
        if (got > 0) { p += got; n -= (size_t)got; continue; }
        if (got == 0) return UV_EOF;
        if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
        return _dm_store_uv_errno(errno);
    }
    return 0;
}

/* The connection is unusable after a failure in the middle of a request. */
_DM_PRIVATE dm_status _dm_store_io_fail(dm_store* s, int uvc, const char* what) {
    char cause[200];
    _dm_store_shared* sh = s->sh;
    dm_status st = _dm_status_from_uv(uvc);
    _dm_store_uv_cause(uvc, cause, sizeof(cause));
    if (sh->fd >= 0) { close(sh->fd); sh->fd = -1; }
    sh->broken = true;
    snprintf(sh->broken_why, sizeof(sh->broken_why), "%.40s: %.100s", what, cause);
    if (uvc == UV_EOF) snprintf(cause, sizeof(cause), "EOF: the server closed the connection");
    return _DM_STORE_FAIL(s, st, "tcp-store: %s with %s:%d failed (%s)", what, sh->host, sh->port, cause);
}
_DM_PRIVATE dm_status _dm_store_check_conn(dm_store* s) {
    if (!s->sh->broken) return DM_OK;
    return _DM_STORE_FAIL(s, DM_ERR_PEER_LOST,
                          "tcp-store: connection to %s:%d is unusable after an earlier failure (%s)",
                          s->sh->host, s->sh->port, s->sh->broken_why);
}
_DM_PRIVATE dm_status _dm_store_send(dm_store* s, _dm_stbuf* b, const char* what) {
    int rc;
    if (b->oom) return _DM_STORE_FAIL(s, DM_ERR_OUT_OF_MEMORY, "tcp-store: %s (out of memory)", what);
    rc = _dm_store_send_all(s->sh->fd, b->p, b->len, _dm_deadline(s->timeout_ms));
    if (rc) return _dm_store_io_fail(s, rc, what);
    return DM_OK;
}
_DM_PRIVATE dm_status _dm_store_recv(dm_store* s, void* p, size_t n, int64_t deadline, const char* what) {
    int rc = _dm_store_recv_all(s->sh->fd, (unsigned char*)p, n, deadline);
    if (rc) return _dm_store_io_fail(s, rc, what);
    return DM_OK;
}
_DM_PRIVATE dm_status _dm_store_recv_u64(dm_store* s, uint64_t* v, const char* what) {
    unsigned char b[8];
    dm_status st = _dm_store_recv(s, b, 8, _dm_deadline(s->timeout_ms), what);
    if (st == DM_OK) *v = _dm_st_get_u64(b);
    return st;
}
/* uint64 length + bytes into a new buffer of the store's allocator. */
_DM_PRIVATE dm_status _dm_store_recv_value(dm_store* s, void** out, size_t* out_n, const char* what) {
    uint64_t n;
    unsigned char* p;
    dm_status st = _dm_store_recv_u64(s, &n, what);
    if (st != DM_OK) return st;
    if (n > DM_STORE_MAX_VALUE) {
        if (s->sh->fd >= 0) { close(s->sh->fd); s->sh->fd = -1; }
        s->sh->broken = true;
        snprintf(s->sh->broken_why, sizeof(s->sh->broken_why), "reply of %llu bytes", (unsigned long long)n);
        return _DM_STORE_FAIL(s, DM_ERR_PROTOCOL, "tcp-store: %s: reply of %llu bytes (above DM_STORE_MAX_VALUE)",
                              what, (unsigned long long)n);
    }
    p = (unsigned char*)_dm_malloc(&s->allocator, (size_t)n);
    if (!p) return _DM_STORE_FAIL(s, DM_ERR_OUT_OF_MEMORY, "tcp-store: %s (out of memory)", what);
    st = _dm_store_recv(s, p, (size_t)n, _dm_deadline(s->timeout_ms), what);
    if (st != DM_OK) { _dm_free(&s->allocator, p); return st; }
    *out = p;
    *out_n = (size_t)n;
    return DM_OK;
}
/* Protocol violation in a reply: the stream can't be trusted any more. */
_DM_PRIVATE dm_status _dm_store_bad_reply(dm_store* s, const char* what, unsigned got) {
    if (s->sh->fd >= 0) { close(s->sh->fd); s->sh->fd = -1; }
    s->sh->broken = true;
    snprintf(s->sh->broken_why, sizeof(s->sh->broken_why), "%s: unexpected reply byte %u", what, got);
    return _DM_STORE_FAIL(s, DM_ERR_PROTOCOL, "tcp-store: %s: unexpected reply byte %u from %s:%d",
                          what, got, s->sh->host, s->sh->port);
}

/* WAIT for already prefixed keys; at the deadline CANCEL_WAIT, as torch's client does. */
_DM_PRIVATE dm_status _dm_store_tcp_wait(dm_store* s, unsigned char* const* keys, const size_t* lens,
                                         size_t n, int timeout_ms, const char* const* names) {
    _dm_stbuf b;
    size_t i;
    unsigned char r;
    int rc;
    dm_status st;
    int64_t deadline = _dm_deadline(timeout_ms);
    memset(&b, 0, sizeof(b));
    b.a = &s->allocator;
    _dm_stbuf_u8(&b, _DM_STQ_WAIT);
    _dm_stbuf_u64(&b, (uint64_t)n);
    for (i = 0; i < n; i++) _dm_stbuf_str(&b, keys[i], lens[i]);
    st = _dm_store_send(s, &b, "wait");
    _dm_stbuf_free(&b);
    if (st != DM_OK) return st;
    rc = _dm_store_recv_all(s->sh->fd, &r, 1, deadline);
    if (rc == 0) return r == _DM_ST_STOP_WAITING ? DM_OK : _dm_store_bad_reply(s, "wait", r);
    if (rc != UV_ETIMEDOUT) return _dm_store_io_fail(s, rc, "wait");
    /* timed out: cancel, then expect WAIT_CANCELED (after a STOP_WAITING that crossed it) */
    r = _DM_STQ_CANCEL_WAIT;
    rc = _dm_store_send_all(s->sh->fd, &r, 1, _dm_deadline(s->timeout_ms));
    if (rc) return _dm_store_io_fail(s, rc, "cancel wait");
    if ((st = _dm_store_recv(s, &r, 1, _dm_deadline(s->timeout_ms), "cancel wait")) != DM_OK) return st;
    if (r == _DM_ST_STOP_WAITING) {
        if ((st = _dm_store_recv(s, &r, 1, _dm_deadline(s->timeout_ms), "cancel wait")) != DM_OK) return st;
    }
    if (r != _DM_ST_WAIT_CANCELED) return _dm_store_bad_reply(s, "cancel wait", r);
    {
        char list[300];
        return _DM_STORE_FAIL(s, DM_ERR_TIMEOUT, "tcp-store: wait for %s timed out after %d ms (ETIMEDOUT)",
                              _dm_store_keylist(s, names, n, list, sizeof(list)), timeout_ms);
    }
}

/* One connection attempt: connect, TCP_NODELAY, VALIDATE, PING. 0 or a uv code. */
_DM_PRIVATE int _dm_store_try_connect(const struct addrinfo* ai, int64_t deadline, int* out_fd) {
    int fd, rc, fl;
    unsigned char req[16], rep[4];
    uint32_t nonce = (uint32_t)getpid();
    _dm_stbuf b;
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) return _dm_store_uv_errno(errno);
    fl = fcntl(fd, F_GETFL, 0);
    fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc < 0 && errno != EINPROGRESS && errno != EINTR) {
        rc = _dm_store_uv_errno(errno);
        close(fd);
        return rc;
    }
    if (rc < 0) {
        for (;;) {
            struct pollfd pf;
            int ms = _dm_store_poll_ms(deadline), r, soerr = 0;
            socklen_t sl = sizeof(soerr);
            if (ms == 0) { close(fd); return UV_ETIMEDOUT; }
            pf.fd = fd; pf.events = POLLOUT; pf.revents = 0;
            r = poll(&pf, 1, ms);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) { rc = _dm_store_uv_errno(errno); close(fd); return rc; }
            if (r == 0) continue;
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
            if (soerr) { close(fd); return _dm_store_uv_errno(soerr); }
            break;
        }
    }
    fl = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &fl, sizeof(fl));
    /* VALIDATE + PING in one segment, like torch's client (two sends, no reply in between) */
    memset(&b, 0, sizeof(b));
    b.p = req;
    b.cap = sizeof(req);
    _dm_stbuf_u8(&b, _DM_STQ_VALIDATE);
    _dm_stbuf_u32(&b, _DM_ST_MAGIC);
    _dm_stbuf_u8(&b, _DM_STQ_PING);
    _dm_stbuf_u32(&b, nonce);
    if ((rc = _dm_store_send_all(fd, req, b.len, deadline)) != 0 ||
        (rc = _dm_store_recv_all(fd, rep, 4, deadline)) != 0) {
        close(fd);
        return rc;
    }
    if (_dm_st_get_u32(rep) != nonce) { close(fd); return UV_EPROTO; }
    *out_fd = fd;
    return 0;
}

_DM_PRIVATE dm_status _dm_store_tcp_connect(dm_store* s) {
    _dm_store_shared* sh = s->sh;
    int64_t deadline = _dm_deadline(s->timeout_ms);
    int backoff = 10, last = 0, tries = 0;
    char portstr[16], cause[200];
    snprintf(portstr, sizeof(portstr), "%d", sh->port);
    for (;;) {
        struct addrinfo hints, *res = NULL, *ai;
        int gai;
        memset(&hints, 0, sizeof(hints));
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_flags = AI_NUMERICSERV;
        tries++;
        gai = getaddrinfo(sh->host, portstr, &hints, &res);
        if (gai != 0) {
            last = gai == EAI_SYSTEM ? _dm_store_uv_errno(errno) : UV_EAI_NONAME;
            if (gai == EAI_AGAIN) last = UV_EAI_AGAIN;
            if (gai == EAI_MEMORY) last = UV_ENOMEM;
        } else {
            for (ai = res; ai; ai = ai->ai_next) {
                int fd = -1;
                int r = _dm_store_try_connect(ai, deadline, &fd);
                if (r == 0) { sh->fd = fd; last = 0; break; }
                if (r != UV_ETIMEDOUT || !last) last = r;   /* keep the real cause over our deadline */
            }
            freeaddrinfo(res);
            if (last == 0) return DM_OK;
            if (last == UV_EPROTO)
                return _DM_STORE_FAIL(s, DM_ERR_PROTOCOL,
                                      "tcp-store: %s:%d is not a torch 2.x TCPStore (wrong PING reply)",
                                      sh->host, sh->port);
        }
        {   /* sleep the backoff, or what is left of the timeout */
            int64_t left = deadline == INT64_MAX ? backoff : deadline - _dm_now_ms();
            struct timespec ts;
            if (left <= 0) break;
            if (left > backoff) left = backoff;
            ts.tv_sec = (time_t)(left / 1000);
            ts.tv_nsec = (long)(left % 1000) * 1000000L;
            nanosleep(&ts, NULL);
        }
        backoff = backoff * 2 > 500 ? 500 : backoff * 2;
    }
    return _DM_STORE_FAIL(s, last == UV_ENOMEM ? DM_ERR_OUT_OF_MEMORY : DM_ERR_TIMEOUT,
                          "tcp-store: connect to %s:%d timed out after %d ms and %d tries (%s)",
                          sh->host, sh->port, s->timeout_ms, tries,
                          _dm_store_uv_cause(last ? last : UV_ETIMEDOUT, cause, sizeof(cause)));
}

/* ---------------- file store ---------------- */

/* dir/<hex of key>; keys too long for a file name get "~" + two 64-bit hashes. */
_DM_PRIVATE char* _dm_fstore_path(dm_store* s, const unsigned char* key, size_t n) {
    const char* dir = s->sh->dir;
    size_t dl = strlen(dir), i, cap = dl + 2 + (n * 2 > 240 ? 40 : n * 2) + 1;
    char* p = (char*)_dm_malloc(&s->allocator, cap);
    static const char hx[] = "0123456789abcdef";
    char* q;
    if (!p) return NULL;
    memcpy(p, dir, dl);
    q = p + dl;
    *q++ = '/';
    if (n * 2 > 240) {
        uint64_t h1 = _dm_st_hash(key, n), h2 = 0x9e3779b97f4a7c15ull;
        for (i = 0; i < n; i++) h2 = (h2 ^ key[n - 1 - i]) * 0x100000001b3ull + 0x7f4a7c15ull;
        snprintf(q, 40, "~%016llx%016llx", (unsigned long long)h1, (unsigned long long)h2);
        return p;
    }
    for (i = 0; i < n; i++) { *q++ = hx[key[i] >> 4]; *q++ = hx[key[i] & 15]; }
    *q = 0;
    if (n == 0) { q[0] = '_'; q[1] = 0; }   /* the empty key */
    return p;
}
_DM_PRIVATE dm_status _dm_fstore_errno(dm_store* s, const char* what, const char* path, int e) {
    char cause[200];
    int uvc = _dm_store_uv_errno(e);
    return _DM_STORE_FAIL(s, _dm_status_from_uv(uvc) == DM_ERR_NETWORK ? DM_ERR_IO : _dm_status_from_uv(uvc),
                          "tcp-store: file store %s %s failed (%s)", what, path,
                          _dm_store_uv_cause(uvc, cause, sizeof(cause)));
}
_DM_PRIVATE void _dm_store_sleep_ms(int ms) {
    struct timespec ts;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (long)(ms % 1000) * 1000000L;
    nanosleep(&ts, NULL);
}
/* Reads the whole file; ENOENT -> DM_ERR_NOT_FOUND without a message. */
_DM_PRIVATE dm_status _dm_fstore_read(dm_store* s, const char* path, void** out, size_t* out_n) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat stt;
    unsigned char* p;
    size_t got = 0;
    if (fd < 0) {
        if (errno == ENOENT) return DM_ERR_NOT_FOUND;
        return _dm_fstore_errno(s, "open", path, errno);
    }
    if (fstat(fd, &stt) != 0) { int e = errno; close(fd); return _dm_fstore_errno(s, "stat", path, e); }
    if ((uint64_t)stt.st_size > DM_STORE_MAX_VALUE) {
        close(fd);
        return _DM_STORE_FAIL(s, DM_ERR_PROTOCOL, "tcp-store: file store %s holds %lld bytes (above DM_STORE_MAX_VALUE)",
                              path, (long long)stt.st_size);
    }
    p = (unsigned char*)_dm_malloc(&s->allocator, (size_t)stt.st_size);
    if (!p) { close(fd); return _DM_STORE_FAIL(s, DM_ERR_OUT_OF_MEMORY, "tcp-store: file store read %s (out of memory)", path); }
    while (got < (size_t)stt.st_size) {
        ssize_t r = read(fd, p + got, (size_t)stt.st_size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) { int e = errno; close(fd); _dm_free(&s->allocator, p); return _dm_fstore_errno(s, "read", path, e); }
        if (r == 0) break;  /* files are replaced by rename, never truncated: cannot happen */
        got += (size_t)r;
    }
    close(fd);
    *out = p;
    *out_n = got;
    return DM_OK;
}
/* write-to-temp + rename: readers see the old or the new value, never a partial one. */
_DM_PRIVATE dm_status _dm_fstore_write(dm_store* s, const char* path, const void* a, size_t an,
                                       const void* b, size_t bn) {
    char tmp[4096];
    int fd;
    size_t done = 0, total = an + bn;
    snprintf(tmp, sizeof(tmp), "%s/.tmp.%ld.%lx.%p", s->sh->dir, (long)getpid(),
             (unsigned long)pthread_self(), (void*)&done);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return _dm_fstore_errno(s, "create", tmp, errno);
    while (done < total) {
        const unsigned char* src = done < an ? (const unsigned char*)a + done : (const unsigned char*)b + (done - an);
        size_t chunk = done < an ? an - done : total - done;
        ssize_t w = write(fd, src, chunk);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) { int e = errno; close(fd); unlink(tmp); return _dm_fstore_errno(s, "write", tmp, e); }
        done += (size_t)w;
    }
    if (close(fd) != 0) { int e = errno; unlink(tmp); return _dm_fstore_errno(s, "close", tmp, e); }
    if (rename(tmp, path) != 0) { int e = errno; unlink(tmp); return _dm_fstore_errno(s, "rename", path, e); }
    return DM_OK;
}
/* The directory's lock file, flock'ed exclusively (across processes, and across threads since
   each call opens its own file description); polled until the deadline. */
_DM_PRIVATE dm_status _dm_fstore_lock(dm_store* s, int* out_fd) {
    char path[4096];
    int fd, backoff = 1;
    int64_t deadline = _dm_deadline(s->timeout_ms);
    snprintf(path, sizeof(path), "%s/.lock", s->sh->dir);
    fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return _dm_fstore_errno(s, "open", path, errno);
    while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno != EWOULDBLOCK && errno != EINTR) {
            int e = errno;
            close(fd);
            return _dm_fstore_errno(s, "flock", path, e);
        }
        if (_dm_now_ms() >= deadline) {
            close(fd);
            return _DM_STORE_FAIL(s, DM_ERR_TIMEOUT, "tcp-store: file store lock %s timed out after %d ms (ETIMEDOUT)",
                                  path, s->timeout_ms);
        }
        _dm_store_sleep_ms(backoff);
        backoff = backoff * 2 > 20 ? 20 : backoff * 2;
    }
    *out_fd = fd;
    return DM_OK;
}
_DM_PRIVATE void _dm_fstore_unlock(int fd) {
    flock(fd, LOCK_UN);
    close(fd);
}
_DM_PRIVATE dm_status _dm_fstore_wait(dm_store* s, unsigned char* const* keys, const size_t* lens,
                                      size_t n, int timeout_ms, const char* const* names) {
    int64_t deadline = _dm_deadline(timeout_ms);
    int backoff = 1;
    size_t i = 0;
    for (;;) {
        for (; i < n; i++) {    /* keys once seen are not looked at again */
            char* path = _dm_fstore_path(s, keys[i], lens[i]);
            int r;
            if (!path) return _DM_STORE_FAIL(s, DM_ERR_OUT_OF_MEMORY, "tcp-store: file store wait (out of memory)");
            r = access(path, F_OK);
            if (r != 0 && errno != ENOENT) {
                dm_status st = _dm_fstore_errno(s, "access", path, errno);
                _dm_free(&s->allocator, path);
                return st;
            }
            _dm_free(&s->allocator, path);
            if (r != 0) break;
        }
        if (i == n) return DM_OK;
        if (_dm_now_ms() >= deadline) {
            char list[300];
            return _DM_STORE_FAIL(s, DM_ERR_TIMEOUT, "tcp-store: file store wait for %s timed out after %d ms (ETIMEDOUT)",
                                  _dm_store_keylist(s, names, n, list, sizeof(list)), timeout_ms);
        }
        {
            int64_t left = deadline - _dm_now_ms();
            _dm_store_sleep_ms(left < backoff ? (int)(left > 0 ? left : 1) : backoff);
        }
        backoff = backoff * 2 > 50 ? 50 : backoff * 2;
    }
}
_DM_PRIVATE dm_status _dm_fstore_mkdirs(dm_store* s, const char* dir) {
    char path[4096];
    size_t i, n = strlen(dir);
    if (n == 0 || n >= sizeof(path))
        return _DM_STORE_FAIL(s, DM_ERR_INVALID_ARG, "tcp-store: file store directory \"%s\" is empty or too long", dir);
    memcpy(path, dir, n + 1);
    for (i = 1; i <= n; i++) {
        if (path[i] == '/' || path[i] == 0) {
            char c = path[i];
            path[i] = 0;
            if (mkdir(path, 0755) != 0 && errno != EEXIST) return _dm_fstore_errno(s, "mkdir", path, errno);
            path[i] = c;
        }
    }
    return DM_OK;
}

/* ============================================================================================ */
/* >>store public */

_DM_PRIVATE void _dm_store_shared_release(_dm_store_shared* sh) {
    bool last;
    dm_allocator a;
    pthread_mutex_lock(&sh->mu);
    last = --sh->refs == 0;
    pthread_mutex_unlock(&sh->mu);
    if (!last) return;
    a = sh->allocator;
    if (sh->fd >= 0) close(sh->fd);
    _dm_srv_stop(sh->server);
    _dm_free(&a, sh->dir);
    pthread_mutex_destroy(&sh->mu);
    _dm_free(&a, sh);
}
_DM_PRIVATE void _dm_store_free_obj(dm_store* s) {
    dm_allocator a = s->allocator;
    _dm_free(&a, s->prefix);
    _dm_free(&a, s);
}

/* TORCHELASTIC_USE_AGENT_STORE: torch's getCvarBool truthy spellings. */
_DM_PRIVATE bool _dm_store_agent_store(void) {
    const char* v = getenv("TORCHELASTIC_USE_AGENT_STORE");
    if (!v) return false;
    return strcmp(v, "1") == 0 || strcmp(v, "true") == 0 || strcmp(v, "True") == 0 ||
           strcmp(v, "TRUE") == 0 || strcmp(v, "yes") == 0 || strcmp(v, "y") == 0;
}

DM_API_IMPL dm_status dm_store_create(const dm_store_desc* desc, dm_store** out) {
    _DM_ZERO(dm_store_desc, d);
    dm_store* s;
    _dm_store_shared* sh;
    char url[600], err[DM_LAST_ERROR_SIZE];
    const char* u;
    dm_status st;
    if (!out) return DM_ERR_INVALID_ARG;
    *out = NULL;
    if (desc) d = *desc;
    if (!_dm_allocator_valid(&d.allocator))
        return _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_INVALID_ARG,
                          "tcp-store: allocator needs both functions or neither");
    u = d.url ? d.url : getenv("DISTMESH_STORE");
    if (u && *u) {
        snprintf(url, sizeof(url), "%s", u);
    } else {
        const char* ma = getenv("MASTER_ADDR");
        const char* mp = getenv("MASTER_PORT");
        if (!ma || !*ma || !mp || !*mp)
            return _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_ENV,
                              "tcp-store: no store url (set desc.url, DISTMESH_STORE, or MASTER_ADDR and MASTER_PORT)");
        if (strchr(ma, ':') && ma[0] != '[') snprintf(url, sizeof(url), "tcp://[%s]:%s", ma, mp);
        else snprintf(url, sizeof(url), "tcp://%s:%s", ma, mp);
    }
    s = (dm_store*)_dm_calloc(&d.allocator, sizeof(*s));
    sh = (_dm_store_shared*)_dm_calloc(&d.allocator, sizeof(*sh));
    if (!s || !sh) {
        _dm_free(&d.allocator, s);
        _dm_free(&d.allocator, sh);
        return _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_OUT_OF_MEMORY, "tcp-store: out of memory");
    }
    s->sh = sh;
    s->logger = d.logger;
    s->allocator = d.allocator;
    s->timeout_ms = _dm_resolve_timeout(d.timeout_ms);
    sh->allocator = d.allocator;
    sh->refs = 1;
    sh->fd = -1;
    pthread_mutex_init(&sh->mu, NULL);
    if (d.prefix && *d.prefix) {
        s->prefix_len = strlen(d.prefix);
        s->prefix = (char*)_dm_malloc(&s->allocator, s->prefix_len + 1);
        if (!s->prefix) { st = _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_OUT_OF_MEMORY, "tcp-store: out of memory"); goto fail; }
        memcpy(s->prefix, d.prefix, s->prefix_len + 1);
    }
    if (strncmp(url, "file://", 7) == 0) {
        const char* dir = url + 7;
        size_t n = strlen(dir);
        sh->kind = _DM_STORE_FILE;
        if (dir[0] != '/') {
            st = _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_INVALID_ARG,
                            "tcp-store: file store url \"%s\" needs an absolute path (file:///abs/dir)", url);
            goto fail;
        }
        while (n > 1 && dir[n - 1] == '/') n--;
        sh->dir = (char*)_dm_malloc(&d.allocator, n + 1);
        if (!sh->dir) { st = _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_OUT_OF_MEMORY, "tcp-store: out of memory"); goto fail; }
        memcpy(sh->dir, dir, n);
        sh->dir[n] = 0;
        if ((st = _dm_fstore_mkdirs(s, sh->dir)) != DM_OK) { snprintf(err, sizeof(err), "%s", s->last_error); goto fail; }
        s->last_error[0] = 0;
        *out = s;
        return DM_OK;
    }
    if (strncmp(url, "tcp://", 6) == 0) {
        const char* h = url + 6;
        const char* colon;
        char* end = NULL;
        long port;
        size_t hl;
        sh->kind = _DM_STORE_TCP;
        if (h[0] == '[') {
            const char* rb = strchr(h, ']');
            if (!rb || rb[1] != ':') goto bad_url;
            hl = (size_t)(rb - h - 1);
            memcpy(sh->host, h + 1, hl < sizeof(sh->host) ? hl : 0);
            colon = rb + 1;
        } else {
            colon = strrchr(h, ':');
            if (!colon) goto bad_url;
            hl = (size_t)(colon - h);
            if (hl >= sizeof(sh->host)) goto bad_url;
            memcpy(sh->host, h, hl);
        }
        if (hl == 0 || hl >= sizeof(sh->host)) goto bad_url;
        sh->host[hl] = 0;
        errno = 0;
        port = strtol(colon + 1, &end, 10);
        if (errno || end == colon + 1 || (*end && *end != '/' && *end != '?') || port < 0 || port > 65535)
            goto bad_url;
        sh->port = (int)port;
        if (d.is_server && !_dm_store_agent_store()) {
            char what[300];
            st = _dm_srv_start(sh->host, sh->port, &d.logger, &d.allocator, &sh->server, what, sizeof(what));
            if (st != DM_OK) {
                _DM_REPORT(&d.logger, err, sizeof(err), st, "tcp-store: server %s: %s", url, what);
                goto fail;
            }
            sh->port = sh->server->port;
        } else if (port == 0) {
            st = _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_INVALID_ARG,
                            "tcp-store: %s: port 0 needs is_server (a client must know the port)", url);
            goto fail;
        }
        if ((st = _dm_store_tcp_connect(s)) != DM_OK) { snprintf(err, sizeof(err), "%s", s->last_error); goto fail; }
        s->last_error[0] = 0;
        *out = s;
        return DM_OK;
    }
bad_url:
    st = _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_INVALID_ARG,
                    "tcp-store: bad store url \"%s\" (expected tcp://host:port, tcp://[v6]:port or file:///dir)", url);
fail:
    (void)err;
    _dm_store_shared_release(sh);
    _dm_store_free_obj(s);
    return st;
}

DM_API_IMPL dm_status dm_store_clone_prefixed(dm_store* parent, const char* prefix, dm_store** out) {
    dm_store* s;
    size_t pl = prefix ? strlen(prefix) : 0;
    if (!out) return DM_ERR_INVALID_ARG;
    *out = NULL;
    if (!parent) return DM_ERR_INVALID_ARG;
    s = (dm_store*)_dm_calloc(&parent->allocator, sizeof(*s));
    if (s && parent->prefix_len + pl) {
        s->prefix = (char*)_dm_malloc(&parent->allocator, parent->prefix_len + pl + 1);
        if (!s->prefix) { _dm_free(&parent->allocator, s); s = NULL; }
        else {
            if (parent->prefix_len) memcpy(s->prefix, parent->prefix, parent->prefix_len);
            if (pl) memcpy(s->prefix + parent->prefix_len, prefix, pl);
            s->prefix[parent->prefix_len + pl] = 0;
            s->prefix_len = parent->prefix_len + pl;
        }
    }
    if (!s) return _DM_STORE_FAIL(parent, DM_ERR_OUT_OF_MEMORY, "tcp-store: clone (out of memory)");
    s->sh = parent->sh;
    s->timeout_ms = parent->timeout_ms;
    s->logger = parent->logger;
    s->allocator = parent->allocator;
    pthread_mutex_lock(&s->sh->mu);
    s->sh->refs++;
    pthread_mutex_unlock(&s->sh->mu);
    *out = s;
    return DM_OK;
}

DM_API_IMPL void dm_store_destroy(dm_store* s) {
    if (!s) return;
    _dm_store_shared_release(s->sh);
    _dm_store_free_obj(s);
}

DM_API_IMPL const char* dm_store_last_error(const dm_store* s) { return s ? s->last_error : ""; }
DM_API_IMPL int dm_store_port(const dm_store* s) {
    return s && s->sh->kind == _DM_STORE_TCP ? s->sh->port : 0;
}
DM_API_IMPL void dm_store_free(dm_store* s, void* value) {
    if (value) _dm_free(s ? &s->allocator : NULL, value);
}

/* Every public operation: argument checks, then the lock, then the kind's code. */
#define _DM_STORE_BEGIN(s, name)                                                             \
    do {                                                                                     \
        if (!(s)) return DM_ERR_INVALID_ARG;                                                 \
        pthread_mutex_lock(&(s)->sh->mu);                                                    \
        (s)->last_error[0] = 0;                                                              \
        if ((s)->sh->kind == _DM_STORE_TCP && (st = _dm_store_check_conn(s)) != DM_OK) {    \
            pthread_mutex_unlock(&(s)->sh->mu);                                              \
            return st;                                                                       \
        }                                                                                    \
        (void)(name);                                                                        \
    } while (0)
#define _DM_STORE_END(s) pthread_mutex_unlock(&(s)->sh->mu)

_DM_PRIVATE dm_status _dm_store_bad_key(dm_store* s, const char* what, const char* key) {
    if (!key) return _DM_STORE_FAIL(s, DM_ERR_INVALID_ARG, "tcp-store: %s: key is NULL", what);
    if (s->prefix_len + strlen(key) > DM_STORE_MAX_KEY)
        return _DM_STORE_FAIL(s, DM_ERR_INVALID_ARG, "tcp-store: %s: key longer than DM_STORE_MAX_KEY (%d bytes)",
                              what, (int)DM_STORE_MAX_KEY);
    return _DM_STORE_FAIL(s, DM_ERR_OUT_OF_MEMORY, "tcp-store: %s (out of memory)", what);
}

_DM_PRIVATE dm_status _dm_store_set_locked(dm_store* s, const char* key, const void* value, size_t size,
                                           bool append) {
    const char* what = append ? "append" : "set";
    size_t kn;
    unsigned char* k;
    dm_status st;
    if (size && !value) return _DM_STORE_FAIL(s, DM_ERR_INVALID_ARG, "tcp-store: %s: value is NULL", what);
    if (size > DM_STORE_MAX_VALUE)
        return _DM_STORE_FAIL(s, DM_ERR_INVALID_ARG, "tcp-store: %s: value of %zu bytes is above DM_STORE_MAX_VALUE",
                              what, size);
    if (!key || !(k = _dm_store_key(s, key, &kn))) return _dm_store_bad_key(s, what, key);
    if (s->sh->kind == _DM_STORE_TCP) {
        _dm_stbuf b;
        memset(&b, 0, sizeof(b));
        b.a = &s->allocator;
        _dm_stbuf_u8(&b, append ? _DM_STQ_APPEND : _DM_STQ_SET);
        _dm_stbuf_str(&b, k, kn);
        _dm_stbuf_str(&b, value, size);
        st = _dm_store_send(s, &b, what);
        _dm_stbuf_free(&b);
    } else {
        char* path = _dm_fstore_path(s, k, kn);
        int lk = -1;
        if (!path) st = _DM_STORE_FAIL(s, DM_ERR_OUT_OF_MEMORY, "tcp-store: %s (out of memory)", what);
        else if ((st = _dm_fstore_lock(s, &lk)) == DM_OK) {
            void* old = NULL;
            size_t on = 0;
            if (append) {
                st = _dm_fstore_read(s, path, &old, &on);
                if (st == DM_ERR_NOT_FOUND) st = DM_OK;
            }
            if (st == DM_OK) st = _dm_fstore_write(s, path, old, on, value, size);
            _dm_free(&s->allocator, old);
            _dm_fstore_unlock(lk);
        }
        _dm_free(&s->allocator, path);
    }
    _dm_free(&s->allocator, k);
    return st;
}

DM_API_IMPL dm_status dm_store_set(dm_store* s, const char* key, const void* value, size_t size) {
    dm_status st;
    _DM_STORE_BEGIN(s, "set");
    st = _dm_store_set_locked(s, key, value, size, false);
    _DM_STORE_END(s);
    return st;
}
DM_API_IMPL dm_status dm_store_append(dm_store* s, const char* key, const void* value, size_t size) {
    dm_status st;
    _DM_STORE_BEGIN(s, "append");
    st = _dm_store_set_locked(s, key, value, size, true);
    _DM_STORE_END(s);
    return st;
}

/* Prefixed copies of n keys (freed with _dm_store_keys_free). */
_DM_PRIVATE dm_status _dm_store_keys(dm_store* s, const char* what, const char* const* keys, size_t n,
                                     unsigned char*** out_k, size_t** out_l) {
    size_t i;
    unsigned char** k;
    size_t* l;
    *out_k = NULL;
    *out_l = NULL;
    if (n && !keys) return _DM_STORE_FAIL(s, DM_ERR_INVALID_ARG, "tcp-store: %s: keys is NULL", what);
    if (n > DM_STORE_MAX_KEYS)
        return _DM_STORE_FAIL(s, DM_ERR_INVALID_ARG, "tcp-store: %s: %zu keys (above DM_STORE_MAX_KEYS)", what, n);
    k = (unsigned char**)_dm_calloc(&s->allocator, (n ? n : 1) * sizeof(*k));
    l = (size_t*)_dm_calloc(&s->allocator, (n ? n : 1) * sizeof(*l));
    if (!k || !l) {
        _dm_free(&s->allocator, k);
        _dm_free(&s->allocator, l);
        return _DM_STORE_FAIL(s, DM_ERR_OUT_OF_MEMORY, "tcp-store: %s (out of memory)", what);
    }
    for (i = 0; i < n; i++) {
        if (!keys[i] || !(k[i] = _dm_store_key(s, keys[i], &l[i]))) {
            size_t j;
            dm_status st = _dm_store_bad_key(s, what, keys[i]);
            for (j = 0; j < i; j++) _dm_free(&s->allocator, k[j]);
            _dm_free(&s->allocator, k);
            _dm_free(&s->allocator, l);
            return st;
        }
    }
    *out_k = k;
    *out_l = l;
    return DM_OK;
}
_DM_PRIVATE void _dm_store_keys_free(dm_store* s, unsigned char** k, size_t* l, size_t n) {
    size_t i;
    if (k) for (i = 0; i < n; i++) _dm_free(&s->allocator, k[i]);
    _dm_free(&s->allocator, k);
    _dm_free(&s->allocator, l);
}

_DM_PRIVATE dm_status _dm_store_wait_locked(dm_store* s, unsigned char* const* k, const size_t* l, size_t n,
                                            int timeout_ms, const char* const* names) {
    if (s->sh->kind == _DM_STORE_TCP) return _dm_store_tcp_wait(s, k, l, n, timeout_ms, names);
    return _dm_fstore_wait(s, k, l, n, timeout_ms, names);
}

DM_API_IMPL dm_status dm_store_wait(dm_store* s, const char* const* keys, size_t nkeys, int timeout_ms) {
    dm_status st;
    unsigned char** k;
    size_t* l;
    _DM_STORE_BEGIN(s, "wait");
    st = _dm_store_keys(s, "wait", keys, nkeys, &k, &l);
    if (st == DM_OK) {
        st = _dm_store_wait_locked(s, k, l, nkeys, timeout_ms ? timeout_ms : s->timeout_ms, keys);
        _dm_store_keys_free(s, k, l, nkeys);
    }
    _DM_STORE_END(s);
    return st;
}

/* GET (tcp) or read (file) of one prefixed key that is known to exist. */
_DM_PRIVATE dm_status _dm_store_get_one(dm_store* s, const unsigned char* k, size_t kn, const char* key,
                                        void** out, size_t* out_n) {
    dm_status st;
    if (s->sh->kind == _DM_STORE_TCP) {
        _dm_stbuf b;
        memset(&b, 0, sizeof(b));
        b.a = &s->allocator;
        _dm_stbuf_u8(&b, _DM_STQ_GET);
        _dm_stbuf_str(&b, k, kn);
        st = _dm_store_send(s, &b, "get");
        _dm_stbuf_free(&b);
        if (st == DM_OK) st = _dm_store_recv_value(s, out, out_n, "get");
        return st;
    } else {
        char* path = _dm_fstore_path(s, k, kn);
        if (!path) return _DM_STORE_FAIL(s, DM_ERR_OUT_OF_MEMORY, "tcp-store: get (out of memory)");
        st = _dm_fstore_read(s, path, out, out_n);
        if (st == DM_ERR_NOT_FOUND)  /* deleted between the wait and the read */
            st = _DM_STORE_FAIL(s, DM_ERR_NOT_FOUND, "tcp-store: file store get \"%s%s\": deleted while read (ENOENT)",
                                s->prefix ? s->prefix : "", key);
        _dm_free(&s->allocator, path);
        return st;
    }
}

DM_API_IMPL dm_status dm_store_get(dm_store* s, const char* key, void** out_value, size_t* out_size) {
    dm_status st;
    unsigned char* k;
    size_t kn;
    if (out_value) *out_value = NULL;
    if (out_size) *out_size = 0;
    _DM_STORE_BEGIN(s, "get");
    if (!out_value || !out_size) st = _DM_STORE_FAIL(s, DM_ERR_INVALID_ARG, "tcp-store: get: out_value or out_size is NULL");
    else if (!key || !(k = _dm_store_key(s, key, &kn))) st = _dm_store_bad_key(s, "get", key);
    else {
        st = _dm_store_wait_locked(s, &k, &kn, 1, s->timeout_ms, &key);
        if (st == DM_OK) st = _dm_store_get_one(s, k, kn, key, out_value, out_size);
        _dm_free(&s->allocator, k);
    }
    _DM_STORE_END(s);
    return st;
}

DM_API_IMPL dm_status dm_store_multi_get(dm_store* s, const char* const* keys, size_t n, void** out_values,
                                         size_t* out_sizes) {
    dm_status st;
    unsigned char** k;
    size_t* l;
    size_t i;
    if (out_values) for (i = 0; i < n; i++) out_values[i] = NULL;
    if (out_sizes) for (i = 0; i < n; i++) out_sizes[i] = 0;
    _DM_STORE_BEGIN(s, "multi_get");
    if (n && (!out_values || !out_sizes)) {
        st = _DM_STORE_FAIL(s, DM_ERR_INVALID_ARG, "tcp-store: multi_get: out_values or out_sizes is NULL");
        _DM_STORE_END(s);
        return st;
    }
    st = _dm_store_keys(s, "multi_get", keys, n, &k, &l);
    if (st == DM_OK) {
        st = _dm_store_wait_locked(s, k, l, n, s->timeout_ms, keys);
        if (st == DM_OK && s->sh->kind == _DM_STORE_TCP) {
            _dm_stbuf b;
            memset(&b, 0, sizeof(b));
            b.a = &s->allocator;
            _dm_stbuf_u8(&b, _DM_STQ_MULTI_GET);
            _dm_stbuf_u64(&b, (uint64_t)n);
            for (i = 0; i < n; i++) _dm_stbuf_str(&b, k[i], l[i]);
            st = _dm_store_send(s, &b, "multi_get");
            _dm_stbuf_free(&b);
            for (i = 0; i < n && st == DM_OK; i++) st = _dm_store_recv_value(s, &out_values[i], &out_sizes[i], "multi_get");
        } else if (st == DM_OK) {
            for (i = 0; i < n && st == DM_OK; i++) st = _dm_store_get_one(s, k[i], l[i], keys[i], &out_values[i], &out_sizes[i]);
        }
        if (st != DM_OK)
            for (i = 0; i < n; i++) { _dm_free(&s->allocator, out_values[i]); out_values[i] = NULL; out_sizes[i] = 0; }
        _dm_store_keys_free(s, k, l, n);
    }
    _DM_STORE_END(s);
    return st;
}

DM_API_IMPL dm_status dm_store_multi_set(dm_store* s, const char* const* keys, const void* const* values,
                                         const size_t* sizes, size_t n) {
    dm_status st;
    unsigned char** k;
    size_t* l;
    size_t i;
    _DM_STORE_BEGIN(s, "multi_set");
    if (n && (!values || !sizes)) {
        st = _DM_STORE_FAIL(s, DM_ERR_INVALID_ARG, "tcp-store: multi_set: values or sizes is NULL");
        _DM_STORE_END(s);
        return st;
    }
    for (i = 0; i < n; i++) {
        if ((sizes[i] && !values[i]) || sizes[i] > DM_STORE_MAX_VALUE) {
            st = _DM_STORE_FAIL(s, DM_ERR_INVALID_ARG, "tcp-store: multi_set: value %zu is NULL or above DM_STORE_MAX_VALUE", i);
            _DM_STORE_END(s);
            return st;
        }
    }
    st = _dm_store_keys(s, "multi_set", keys, n, &k, &l);
    if (st == DM_OK) {
        if (s->sh->kind == _DM_STORE_TCP) {
            _dm_stbuf b;
            memset(&b, 0, sizeof(b));
            b.a = &s->allocator;
            _dm_stbuf_u8(&b, _DM_STQ_MULTI_SET);
            _dm_stbuf_u64(&b, (uint64_t)n);
            for (i = 0; i < n; i++) { _dm_stbuf_str(&b, k[i], l[i]); _dm_stbuf_str(&b, values[i], sizes[i]); }
            st = _dm_store_send(s, &b, "multi_set");
            _dm_stbuf_free(&b);
        } else {
            for (i = 0; i < n && st == DM_OK; i++) st = _dm_store_set_locked(s, keys[i], values[i], sizes[i], false);
        }
        _dm_store_keys_free(s, k, l, n);
    }
    _DM_STORE_END(s);
    return st;
}

DM_API_IMPL dm_status dm_store_add(dm_store* s, const char* key, int64_t delta, int64_t* out) {
    dm_status st;
    unsigned char* k;
    size_t kn;
    _DM_STORE_BEGIN(s, "add");
    if (!key || !(k = _dm_store_key(s, key, &kn))) {
        st = _dm_store_bad_key(s, "add", key);
        _DM_STORE_END(s);
        return st;
    }
    if (s->sh->kind == _DM_STORE_TCP) {
        _dm_stbuf b;
        uint64_t v = 0;
        memset(&b, 0, sizeof(b));
        b.a = &s->allocator;
        _dm_stbuf_u8(&b, _DM_STQ_ADD);
        _dm_stbuf_str(&b, k, kn);
        _dm_stbuf_u64(&b, (uint64_t)delta);
        st = _dm_store_send(s, &b, "add");
        _dm_stbuf_free(&b);
        if (st == DM_OK) st = _dm_store_recv_u64(s, &v, "add");
        if (st == DM_OK && out) *out = (int64_t)v;
    } else {
        char* path = _dm_fstore_path(s, k, kn);
        int lk = -1;
        if (!path) st = _DM_STORE_FAIL(s, DM_ERR_OUT_OF_MEMORY, "tcp-store: add (out of memory)");
        else if ((st = _dm_fstore_lock(s, &lk)) == DM_OK) {
            void* old = NULL;
            size_t on = 0;
            int64_t cur = 0;
            st = _dm_fstore_read(s, path, &old, &on);
            if (st == DM_ERR_NOT_FOUND) st = DM_OK;
            else if (st == DM_OK && !_dm_st_parse_i64((const unsigned char*)old, on, &cur))
                st = _DM_STORE_FAIL(s, DM_ERR_INVALID_ARG, "tcp-store: file store add \"%s%s\": the value is not a decimal int64",
                                    s->prefix ? s->prefix : "", key);
            if (st == DM_OK) {
                char txt[32];
                cur = (int64_t)((uint64_t)cur + (uint64_t)delta);
                snprintf(txt, sizeof(txt), "%lld", (long long)cur);
                st = _dm_fstore_write(s, path, txt, strlen(txt), NULL, 0);
                if (st == DM_OK && out) *out = cur;
            }
            _dm_free(&s->allocator, old);
            _dm_fstore_unlock(lk);
        }
        _dm_free(&s->allocator, path);
    }
    _dm_free(&s->allocator, k);
    _DM_STORE_END(s);
    return st;
}

DM_API_IMPL dm_status dm_store_compare_set(dm_store* s, const char* key, const void* expected,
                                           size_t expected_size, const void* desired, size_t desired_size,
                                           void** out_value, size_t* out_size) {
    dm_status st;
    unsigned char* k;
    size_t kn;
    void* got = NULL;
    size_t gn = 0;
    if (out_value) *out_value = NULL;
    if (out_size) *out_size = 0;
    _DM_STORE_BEGIN(s, "compare_set");
    if ((expected_size && !expected) || (desired_size && !desired) || (!out_value) != (!out_size) ||
        expected_size > DM_STORE_MAX_VALUE || desired_size > DM_STORE_MAX_VALUE) {
        st = _DM_STORE_FAIL(s, DM_ERR_INVALID_ARG,
                            "tcp-store: compare_set: NULL value with a size, out_value/out_size not both set, or a value above DM_STORE_MAX_VALUE");
        _DM_STORE_END(s);
        return st;
    }
    if (!key || !(k = _dm_store_key(s, key, &kn))) {
        st = _dm_store_bad_key(s, "compare_set", key);
        _DM_STORE_END(s);
        return st;
    }
    if (s->sh->kind == _DM_STORE_TCP) {
        _dm_stbuf b;
        memset(&b, 0, sizeof(b));
        b.a = &s->allocator;
        _dm_stbuf_u8(&b, _DM_STQ_COMPARE_SET);
        _dm_stbuf_str(&b, k, kn);
        _dm_stbuf_str(&b, expected, expected_size);
        _dm_stbuf_str(&b, desired, desired_size);
        st = _dm_store_send(s, &b, "compare_set");
        _dm_stbuf_free(&b);
        if (st == DM_OK) st = _dm_store_recv_value(s, &got, &gn, "compare_set");
    } else {
        char* path = _dm_fstore_path(s, k, kn);
        int lk = -1;
        if (!path) st = _DM_STORE_FAIL(s, DM_ERR_OUT_OF_MEMORY, "tcp-store: compare_set (out of memory)");
        else if ((st = _dm_fstore_lock(s, &lk)) == DM_OK) {
            st = _dm_fstore_read(s, path, &got, &gn);
            if (st == DM_ERR_NOT_FOUND) {
                const void* src = expected_size == 0 ? desired : expected;
                size_t sn = expected_size == 0 ? desired_size : expected_size;
                st = expected_size == 0 ? _dm_fstore_write(s, path, desired, desired_size, NULL, 0) : DM_OK;
                if (st == DM_OK) {
                    got = _dm_malloc(&s->allocator, sn);
                    if (!got) st = _DM_STORE_FAIL(s, DM_ERR_OUT_OF_MEMORY, "tcp-store: compare_set (out of memory)");
                    else { if (sn) memcpy(got, src, sn); gn = sn; }
                }
            } else if (st == DM_OK && gn == expected_size && (gn == 0 || memcmp(got, expected, gn) == 0)) {
                st = _dm_fstore_write(s, path, desired, desired_size, NULL, 0);
                _dm_free(&s->allocator, got);
                got = NULL;
                if (st == DM_OK) {
                    got = _dm_malloc(&s->allocator, desired_size);
                    if (!got) st = _DM_STORE_FAIL(s, DM_ERR_OUT_OF_MEMORY, "tcp-store: compare_set (out of memory)");
                    else { if (desired_size) memcpy(got, desired, desired_size); gn = desired_size; }
                }
            }
            _dm_fstore_unlock(lk);
        }
        _dm_free(&s->allocator, path);
    }
    _dm_free(&s->allocator, k);
    if (st == DM_OK && out_value) { *out_value = got; *out_size = gn; got = NULL; }
    _dm_free(&s->allocator, got);
    _DM_STORE_END(s);
    return st;
}

DM_API_IMPL dm_status dm_store_delete(dm_store* s, const char* key, bool* out_deleted) {
    dm_status st;
    unsigned char* k;
    size_t kn;
    bool deleted = false;
    _DM_STORE_BEGIN(s, "delete");
    if (!key || !(k = _dm_store_key(s, key, &kn))) {
        st = _dm_store_bad_key(s, "delete", key);
        _DM_STORE_END(s);
        return st;
    }
    if (s->sh->kind == _DM_STORE_TCP) {
        _dm_stbuf b;
        uint64_t v = 0;
        memset(&b, 0, sizeof(b));
        b.a = &s->allocator;
        _dm_stbuf_u8(&b, _DM_STQ_DELETE_KEY);
        _dm_stbuf_str(&b, k, kn);
        st = _dm_store_send(s, &b, "delete");
        _dm_stbuf_free(&b);
        if (st == DM_OK) st = _dm_store_recv_u64(s, &v, "delete");
        deleted = v == 1;
    } else {
        char* path = _dm_fstore_path(s, k, kn);
        int lk = -1;
        if (!path) st = _DM_STORE_FAIL(s, DM_ERR_OUT_OF_MEMORY, "tcp-store: delete (out of memory)");
        else if ((st = _dm_fstore_lock(s, &lk)) == DM_OK) {
            if (unlink(path) == 0) deleted = true;
            else if (errno != ENOENT) st = _dm_fstore_errno(s, "unlink", path, errno);
            _dm_fstore_unlock(lk);
        }
        _dm_free(&s->allocator, path);
    }
    _dm_free(&s->allocator, k);
    if (st == DM_OK && out_deleted) *out_deleted = deleted;
    _DM_STORE_END(s);
    return st;
}

DM_API_IMPL dm_status dm_store_check(dm_store* s, const char* const* keys, size_t nkeys, bool* out_all_present) {
    dm_status st;
    unsigned char** k;
    size_t* l;
    size_t i;
    bool all = true;
    _DM_STORE_BEGIN(s, "check");
    st = _dm_store_keys(s, "check", keys, nkeys, &k, &l);
    if (st == DM_OK) {
        if (s->sh->kind == _DM_STORE_TCP) {
            _dm_stbuf b;
            unsigned char r = 0;
            memset(&b, 0, sizeof(b));
            b.a = &s->allocator;
            _dm_stbuf_u8(&b, _DM_STQ_CHECK);
            _dm_stbuf_u64(&b, (uint64_t)nkeys);
            for (i = 0; i < nkeys; i++) _dm_stbuf_str(&b, k[i], l[i]);
            st = _dm_store_send(s, &b, "check");
            _dm_stbuf_free(&b);
            if (st == DM_OK) st = _dm_store_recv(s, &r, 1, _dm_deadline(s->timeout_ms), "check");
            if (st == DM_OK && r != _DM_ST_READY && r != _DM_ST_NOT_READY) st = _dm_store_bad_reply(s, "check", r);
            all = r == _DM_ST_READY;
        } else {
            for (i = 0; i < nkeys && st == DM_OK && all; i++) {
                char* path = _dm_fstore_path(s, k[i], l[i]);
                if (!path) { st = _DM_STORE_FAIL(s, DM_ERR_OUT_OF_MEMORY, "tcp-store: check (out of memory)"); break; }
                if (access(path, F_OK) != 0) {
                    if (errno == ENOENT) all = false;
                    else st = _dm_fstore_errno(s, "access", path, errno);
                }
                _dm_free(&s->allocator, path);
            }
        }
        _dm_store_keys_free(s, k, l, nkeys);
    }
    if (st == DM_OK && out_all_present) *out_all_present = all;
    _DM_STORE_END(s);
    return st;
}

DM_API_IMPL dm_status dm_store_num_keys(dm_store* s, int64_t* out) {
    dm_status st = DM_OK;
    int64_t n = 0;
    _DM_STORE_BEGIN(s, "num_keys");
    if (s->sh->kind == _DM_STORE_TCP) {
        _dm_stbuf b;
        uint64_t v = 0;
        memset(&b, 0, sizeof(b));
        b.a = &s->allocator;
        _dm_stbuf_u8(&b, _DM_STQ_GETNUMKEYS);
        st = _dm_store_send(s, &b, "num_keys");
        _dm_stbuf_free(&b);
        if (st == DM_OK) st = _dm_store_recv_u64(s, &v, "num_keys");
        n = (int64_t)v;
    } else {
        DIR* dir = opendir(s->sh->dir);
        if (!dir) st = _dm_fstore_errno(s, "opendir", s->sh->dir, errno);
        else {
            struct dirent* e;
            while ((e = readdir(dir)) != NULL)
                if (e->d_name[0] != '.') n++;   /* key files never start with '.' */
            closedir(dir);
        }
    }
    if (st == DM_OK && out) *out = n;
    _DM_STORE_END(s);
    return st;
}

#undef _DM_STORE_BEGIN
#undef _DM_STORE_END
#undef _DM_SRV_KEY
#undef _DM_SRV_VAL

#endif /* DISTMESH_IMPLEMENTATION && !_DM_TCP_STORE_IMPL */
