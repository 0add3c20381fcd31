/* wip/tcp_ring.h -- implementation section of distmesh_tcp.h (the collective backend): included
   from its implementation block, inlined there before release. Sees the whole distmesh.h core. */
#include <uv.h>
#include <sys/types.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <fcntl.h>

/* >>tcp constants */
#define _DM_TCP_HELLO_MAGIC 0x48544d44u   /* "DMTH" little-endian: connection hello */
#define _DM_TCP_ACK_MAGIC   0x41544d44u   /* "DMTA": hello answer */
#define _DM_TCP_FP_MAGIC    0x46544d44u   /* "DMTF": collective fingerprint */
#define _DM_TCP_VERSION     1u
#define _DM_TCP_IO_MAX      ((size_t)1 << 30)   /* bytes per send/recv call (2 GiB+ messages) */
#define _DM_TCP_SMALL_BYTES ((size_t)64 << 10)  /* all_reduce at or below: recursive doubling */
#define _DM_TCP_SOCKBUF     (4 << 20)           /* SO_SNDBUF / SO_RCVBUF when the kernel allows */

enum { _DM_TCP_ACK_OK = 0, _DM_TCP_ACK_TOKEN = 1, _DM_TCP_ACK_GROUP = 2, _DM_TCP_ACK_RANK = 3 };
enum { _DM_TCP_K_ALL_REDUCE = 1, _DM_TCP_K_ALL_GATHER, _DM_TCP_K_REDUCE_SCATTER, _DM_TCP_K_BROADCAST,
       _DM_TCP_K_BARRIER, _DM_TCP_K_SETUP };

typedef struct _dm_tcp {
    dm_collective base;
    struct dm_store* store;     /* used by create and split; owned when own_store */
    bool own_store;
    char prefix[512];           /* this group's key prefix, generation included */
    char user_prefix[480];      /* the prefix as given (split builds on it) */
    char ifname[128];           /* the interface spec as resolved ("" = by route) */
    char token[128];            /* "" = none */
    uint64_t digest[2];         /* keyed hash of token and group */
    size_t chunk_bytes;
    int* fds;                   /* socket per rank, -1 for self */
    char (*addrs)[64];          /* "host:port" per rank, for messages */
    unsigned char* tmp;         /* max(chunk_bytes, _DM_TCP_SMALL_BYTES) bytes of scratch */
    size_t tmp_size;
    struct sockaddr_storage self_sa; /* where this rank listened (split listens there again) */
    dm_status broken;           /* DM_OK, or the failure that broke the collective */
    char broken_msg[256];
} _dm_tcp;

/* >>tcp little helpers */
_DM_PRIVATE void _dm_tcp_put32(unsigned char* p, uint32_t v) {
    p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8); p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}
_DM_PRIVATE uint32_t _dm_tcp_get32(const unsigned char* p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
_DM_PRIVATE void _dm_tcp_put64(unsigned char* p, uint64_t v) {
    _dm_tcp_put32(p, (uint32_t)v);
    _dm_tcp_put32(p + 4, (uint32_t)(v >> 32));
}
_DM_PRIVATE uint64_t _dm_tcp_get64(const unsigned char* p) {
    return (uint64_t)_dm_tcp_get32(p) | ((uint64_t)_dm_tcp_get32(p + 4) << 32);
}
/* FNV-1a with a splitmix64 finish, seeded: the token digest and the group id. */
_DM_PRIVATE uint64_t _dm_tcp_hash(uint64_t seed, const char* a, const char* b) {
    uint64_t h = 0xcbf29ce484222325ull ^ (seed * 0x9e3779b97f4a7c15ull);
    const char* s;
    int k;
    for (k = 0; k < 2; k++) {
        for (s = k ? b : a; s && *s; s++) { h ^= (unsigned char)*s; h *= 0x100000001b3ull; }
        h ^= 0xff; h *= 0x100000001b3ull;
    }
    h ^= h >> 30; h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27; h *= 0x94d049bb133111ebull;
    return h ^ (h >> 31);
}

static const char* _dm_tcp_kind_name(int kind) {
    switch (kind) {
        case _DM_TCP_K_ALL_REDUCE: return "all_reduce";
        case _DM_TCP_K_ALL_GATHER: return "all_gather";
        case _DM_TCP_K_REDUCE_SCATTER: return "reduce_scatter";
        case _DM_TCP_K_BROADCAST: return "broadcast";
        case _DM_TCP_K_BARRIER: return "barrier";
        case _DM_TCP_K_SETUP: return "setup";
        default: return "unknown collective";
    }
}

/* Fingerprint, 32 bytes on the wire: magic u32, kind u8, dtype u8, op u8, 0 u8, root i32,
   0 u32, count u64, seq u64 (little-endian). Sent first by every collective. */
typedef struct _dm_tcp_fp {
    int kind, dtype, op, root;
    uint64_t count, seq;
} _dm_tcp_fp;

static void _dm_tcp_fp_encode(const _dm_tcp_fp* f, unsigned char* p) {
    memset(p, 0, 32);
    _dm_tcp_put32(p, _DM_TCP_FP_MAGIC);
    p[4] = (unsigned char)f->kind; p[5] = (unsigned char)f->dtype; p[6] = (unsigned char)f->op;
    _dm_tcp_put32(p + 8, (uint32_t)f->root);
    _dm_tcp_put64(p + 16, f->count);
    _dm_tcp_put64(p + 24, f->seq);
}
static void _dm_tcp_fp_decode(const unsigned char* p, _dm_tcp_fp* f) {
    f->kind = p[4]; f->dtype = p[5]; f->op = p[6];
    f->root = (int)_dm_tcp_get32(p + 8);
    f->count = _dm_tcp_get64(p + 16);
    f->seq = _dm_tcp_get64(p + 24);
}
static void _dm_tcp_fp_text(const _dm_tcp_fp* f, char* buf, size_t cap) {
    int n = snprintf(buf, cap, "%s #%llu (", _dm_tcp_kind_name(f->kind), (unsigned long long)f->seq);
    if (n < 0 || (size_t)n >= cap) return;
    if (f->kind == _DM_TCP_K_BARRIER) { snprintf(buf + n, cap - (size_t)n, "round %d)", f->root); return; }
    n += snprintf(buf + n, cap - (size_t)n, "%s, count %llu", dm_dtype_name((dm_dtype)f->dtype),
                  (unsigned long long)f->count);
    if ((size_t)n >= cap) return;
    if (f->kind == _DM_TCP_K_ALL_REDUCE || f->kind == _DM_TCP_K_REDUCE_SCATTER)
        n += snprintf(buf + n, cap - (size_t)n, ", %s", dm_reduce_op_name((dm_reduce_op)f->op));
    if ((size_t)n >= cap) return;
    if (f->kind == _DM_TCP_K_BROADCAST) n += snprintf(buf + n, cap - (size_t)n, ", root %d", f->root);
    if ((size_t)n < cap) snprintf(buf + n, cap - (size_t)n, ")");
}

/* >>tcp failure  Every communication failure breaks the collective; peer loss and protocol
   errors also shut the sockets down, so ranks blocked on this one fail fast instead of waiting
   for their deadline. A timeout leaves them: the others reach their own deadlines. */
static dm_status _dm_tcp_break(_dm_tcp* t, dm_status st) {
    int r;
    if (t->broken == DM_OK) {
        t->broken = st;
        _dm_copy_name(t->broken_msg, sizeof(t->broken_msg), t->base.last_error);
        if (st != DM_ERR_TIMEOUT)
            for (r = 0; r < t->base.size; r++)
                if (t->fds[r] >= 0) shutdown(t->fds[r], SHUT_RDWR);
    }
    return st;
}
static dm_status _dm_tcp_check_broken(_dm_tcp* t, const char* op) {
    if (t->broken == DM_OK) return DM_OK;
    return _DM_FAIL(&t->base, DM_ERR_ABORTED, "tcp: %s #%llu: the collective is broken by an earlier "
                    "failure (%s): %s", op, (unsigned long long)t->base.seq, dm_status_name(t->broken),
                    t->broken_msg);
}

/* >>tcp engine  One full-duplex transfer: a stream of send steps to one peer and a stream of
   recv steps from another (or the same) peer on nonblocking sockets, driven by poll(). A send
   step may be gated by a recv step: it sends only the bytes of that step already final, which
   is how ring steps forward data the moment it is reduced (chunked pipelining across steps).
   A recv step either lands straight in its buffer or, with `own` set, goes through one chunk
   of scratch and is reduced: buf = own op received, chunk by chunk, while the next chunk is
   already in the kernel's buffers. */
typedef struct _dm_tcp_sstep {
    const unsigned char* buf;
    size_t len;
    int gate;                   /* recv step whose final bytes bound this step's, or -1 */
} _dm_tcp_sstep;
typedef struct _dm_tcp_rstep {
    unsigned char* buf;
    size_t len;
    const unsigned char* own;   /* reduce mode: buf = own op received (own may equal buf) */
    int after_send;             /* send step that must have sent a chunk before buf is written, or -1 */
    int divide;                 /* > 0: dm_divide_local each reduced chunk by this (MEAN) */
} _dm_tcp_rstep;
typedef struct _dm_tcp_xfer {
    const char* op;             /* for messages */
    int speer, rpeer;           /* ranks, -1 for none */
    _dm_tcp_sstep* ss;
    int ns;
    _dm_tcp_rstep* rs;
    int nr;
    dm_dtype dtype;
    dm_reduce_op rop;
    const _dm_tcp_fp* expect;   /* when set, recv step 0 is a fingerprint to compare with it */
} _dm_tcp_xfer;

static dm_status _dm_tcp_io_fail(_dm_tcp* t, const _dm_tcp_xfer* x, int peer, bool sending, int err) {
    bool lost = (err == 0 || err == EPIPE || err == ECONNRESET || err == ECONNABORTED || err == ENOTCONN ||
                 err == ESHUTDOWN);
    if (lost)
        _DM_FAIL(&t->base, DM_ERR_PEER_LOST, "tcp: %s #%llu: rank %d (%s) %s while %s", x->op,
                 (unsigned long long)t->base.seq, peer, t->addrs[peer],
                 err == 0 ? "closed the connection (EOF)" : strerror(err),
                 sending ? "sending to it" : "receiving from it");
    else
        _DM_FAIL(&t->base, DM_ERR_NETWORK, "tcp: %s #%llu: %s rank %d (%s) failed (%s)", x->op,
                 (unsigned long long)t->base.seq, sending ? "send to" : "recv from", peer, t->addrs[peer],
                 strerror(err));
    return _dm_tcp_break(t, lost ? DM_ERR_PEER_LOST : DM_ERR_NETWORK);
}

static dm_status _dm_tcp_check_fp(_dm_tcp* t, const _dm_tcp_xfer* x, const unsigned char* wire) {
    _dm_tcp_fp got;
    char mine[160], theirs[160];
    if (_dm_tcp_get32(wire) != _DM_TCP_FP_MAGIC) {
        _DM_FAIL(&t->base, DM_ERR_PROTOCOL, "tcp: %s #%llu: rank %d (%s) sent malformed bytes "
                 "(bad fingerprint magic 0x%08x)", x->op, (unsigned long long)t->base.seq, x->rpeer,
                 t->addrs[x->rpeer], (unsigned)_dm_tcp_get32(wire));
        return _dm_tcp_break(t, DM_ERR_PROTOCOL);
    }
    _dm_tcp_fp_decode(wire, &got);
    if (got.kind == x->expect->kind && got.dtype == x->expect->dtype && got.op == x->expect->op &&
        got.root == x->expect->root && got.count == x->expect->count && got.seq == x->expect->seq)
        return DM_OK;
    _dm_tcp_fp_text(x->expect, mine, sizeof(mine));
    _dm_tcp_fp_text(&got, theirs, sizeof(theirs));
    _DM_FAIL(&t->base, DM_ERR_MISMATCH, "tcp: mismatched collectives: rank %d called %s, rank %d called %s",
             t->base.rank, mine, x->rpeer, theirs);
    return _dm_tcp_break(t, DM_ERR_MISMATCH);
}

static dm_status _dm_tcp_run(_dm_tcp* t, const _dm_tcp_xfer* x) {
    int sfd = x->speer >= 0 ? t->fds[x->speer] : -1, rfd = x->rpeer >= 0 ? t->fds[x->rpeer] : -1;
    int si = 0, ri = 0;
    size_t so = 0, ro = 0, rdone = 0, tfill = 0;
    size_t esize = dm_dtype_size(x->dtype), chunk = t->chunk_bytes;
    int64_t deadline = _dm_deadline(t->base.timeout_ms);
    for (;;) {
        bool progress = false, want_out = false, want_in = false;
        /* send: as far as the gate allows, until the socket is full */
        while (si < x->ns) {
            const _dm_tcp_sstep* s = &x->ss[si];
            size_t limit = s->len, n;
            ssize_t k;
            if (so == s->len) { si++; so = 0; progress = true; continue; }
            if (s->gate >= 0) {
                size_t fin = s->gate < ri ? x->rs[s->gate].len : s->gate == ri ? rdone : 0;
                if (fin < limit) limit = fin;
            }
            if (so >= limit) break;
            n = limit - so < _DM_TCP_IO_MAX ? limit - so : _DM_TCP_IO_MAX;
            k = send(sfd, s->buf + so, n, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (k > 0) { so += (size_t)k; progress = true; continue; }
            if (k < 0 && errno == EINTR) continue;
            if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) { want_out = true; break; }
            return _dm_tcp_io_fail(t, x, x->speer, true, k == 0 ? 0 : errno);
        }
        /* recv: straight into place, or a chunk of scratch that is then reduced */
        while (ri < x->nr) {
            const _dm_tcp_rstep* r = &x->rs[ri];
            unsigned char* dst;
            size_t want;
            ssize_t k;
            if (rdone == r->len) {
                if (ri == 0 && x->expect) {
                    dm_status st = _dm_tcp_check_fp(t, x, r->buf);
                    if (st != DM_OK) return st;
                }
                ri++; ro = rdone = tfill = 0; progress = true;
                continue;
            }
            if (!r->own) { dst = r->buf + ro; want = r->len - ro; }
            else {
                size_t clen = r->len - rdone < chunk ? r->len - rdone : chunk;
                if (tfill == clen) {
                    unsigned char* out = r->buf + rdone;
                    if (r->after_send >= 0) {
                        size_t sent = r->after_send < si ? SIZE_MAX : r->after_send == si ? so : 0;
                        if (sent < rdone + clen && !(r->after_send == si && so == x->ss[si].len)) break;
                    }
                    if (r->own + rdone != out) memcpy(out, r->own + rdone, clen);
                    dm_reduce_local(x->dtype, x->rop, out, t->tmp, clen / esize);
                    if (r->divide > 0) dm_divide_local(x->dtype, out, clen / esize, r->divide);
                    rdone += clen; tfill = 0; progress = true;
                    continue;
                }
                dst = t->tmp + tfill; want = clen - tfill;
            }
            if (want > _DM_TCP_IO_MAX) want = _DM_TCP_IO_MAX;
            k = recv(rfd, dst, want, MSG_DONTWAIT);
            if (k > 0) {
                if (r->own) tfill += (size_t)k; else { ro += (size_t)k; rdone = ro; }
                progress = true;
                continue;
            }
            if (k < 0 && errno == EINTR) continue;
            if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) { want_in = true; break; }
            return _dm_tcp_io_fail(t, x, x->rpeer, false, k == 0 ? 0 : errno);
        }
        if (si == x->ns && ri == x->nr) return DM_OK;
        if (!progress) {
            struct pollfd p[2];
            int np = 0, rc, wait_ms;
            int64_t now = _dm_now_ms();
            if (now >= deadline) {
                bool recv_wait = ri < x->nr;
                int peer = recv_wait ? x->rpeer : x->speer;
                _DM_FAIL(&t->base, DM_ERR_TIMEOUT, "tcp: %s #%llu timed out after %d ms waiting to %s rank %d (%s)",
                         x->op, (unsigned long long)t->base.seq, t->base.timeout_ms,
                         recv_wait ? "receive from" : "send to", peer, t->addrs[peer]);
                return _dm_tcp_break(t, DM_ERR_TIMEOUT);
            }
            if (!want_in && !want_out) {
                _DM_FAIL(&t->base, DM_ERR_INTERNAL, "tcp: %s #%llu: transfer stalled (send step %d, recv step %d)",
                         x->op, (unsigned long long)t->base.seq, si, ri);
                return _dm_tcp_break(t, DM_ERR_INTERNAL);
            }
            {
                int hup = -1;   /* index of the send peer's entry when it is watched for EOF only */
                if (sfd >= 0 && sfd == rfd) {
                    p[np].fd = sfd; p[np].events = (short)((want_out ? POLLOUT : 0) | (want_in ? POLLIN : 0)); np++;
                } else {
                    /* the send peer never writes to us: readable means EOF or reset, seen at once
                       (only while we still owe it bytes: once done it may leave) */
                    if (sfd >= 0 && si < x->ns) {
                        hup = np;
                        p[np].fd = sfd; p[np].events = (short)(POLLRDHUP | (want_out ? POLLOUT : 0)); np++;
                    }
                    if (rfd >= 0 && want_in) { p[np].fd = rfd; p[np].events = POLLIN; np++; }
                }
                wait_ms = deadline - now > 1000 ? 1000 : (int)(deadline - now);
                rc = poll(p, (nfds_t)np, wait_ms);
                if (rc < 0 && errno != EINTR) {
                    _DM_FAIL(&t->base, DM_ERR_NETWORK, "tcp: %s #%llu: poll failed (%s)", x->op,
                             (unsigned long long)t->base.seq, strerror(errno));
                    return _dm_tcp_break(t, DM_ERR_NETWORK);
                }
                if (rc > 0 && hup >= 0 && (p[hup].revents & (POLLRDHUP | POLLHUP | POLLERR))) {
                    int err = 0;
                    socklen_t len = sizeof(err);
                    getsockopt(sfd, SOL_SOCKET, SO_ERROR, &err, &len);
                    return _dm_tcp_io_fail(t, x, x->speer, true, err);
                }
            }
        }
    }
}

/* Fingerprint buffers live on the caller's stack; step 0 of both streams carries them. */
typedef struct _dm_tcp_fpbufs { unsigned char out[32], in[32]; } _dm_tcp_fpbufs;

static void _dm_tcp_fp_steps(_dm_tcp_fpbufs* b, const _dm_tcp_fp* fp, _dm_tcp_sstep* s, _dm_tcp_rstep* r) {
    _dm_tcp_fp_encode(fp, b->out);
    if (s) { s->buf = b->out; s->len = 32; s->gate = -1; }
    if (r) { memset(r, 0, sizeof(*r)); r->buf = b->in; r->len = 32; r->after_send = -1; }
}

/* Exchange with one peer (or two): send sbuf to speer and receive rlen bytes from rpeer into
   rbuf, each preceded by the fingerprint. speer/rpeer -1 = that direction is idle. */
static dm_status _dm_tcp_sendrecv(_dm_tcp* t, const char* op, const _dm_tcp_fp* fp, int speer,
                                  const void* sbuf, size_t slen, int rpeer, void* rbuf, size_t rlen) {
    _dm_tcp_sstep ss[2];
    _dm_tcp_rstep rs[2];
    _dm_tcp_fpbufs b;
    _DM_ZERO(_dm_tcp_xfer, x);
    _dm_tcp_fp_steps(&b, fp, &ss[0], &rs[0]);
    ss[1].buf = (const unsigned char*)sbuf; ss[1].len = slen; ss[1].gate = -1;
    memset(&rs[1], 0, sizeof(rs[1]));
    rs[1].buf = (unsigned char*)rbuf; rs[1].len = rlen; rs[1].after_send = -1;
    x.op = op; x.speer = speer; x.rpeer = rpeer; x.ss = ss; x.rs = rs;
    x.ns = speer >= 0 ? 2 : 0; x.nr = rpeer >= 0 ? 2 : 0;
    x.dtype = DM_UINT8; x.rop = DM_SUM; x.expect = fp;
    return _dm_tcp_run(t, &x);
}

/* >>tcp algorithms */
static void _dm_tcp_fp_make(_dm_tcp* t, _dm_tcp_fp* f, int kind, dm_dtype dtype, dm_reduce_op op,
                            int root, size_t count) {
    f->kind = kind; f->dtype = (int)dtype; f->op = (int)op; f->root = root;
    f->count = (uint64_t)count; f->seq = t->base.seq;
}
/* Ring block j of count elements over size ranks: the first count % size blocks get one more. */
static void _dm_tcp_block(size_t count, int size, int j, size_t* off, size_t* len) {
    size_t base = count / (size_t)size, extra = count % (size_t)size, uj = (size_t)j;
    *off = uj * base + (uj < extra ? uj : extra);
    *len = base + (uj < extra ? 1 : 0);
}
static int _dm_tcp_mod(int a, int n) { return ((a % n) + n) % n; }

/* Recursive doubling on recv (already holding this rank's data). Worlds that are not a power of
   two first fold rank 2i into 2i+1 for i < rem, and hand the result back at the end. */
static dm_status _dm_tcp_allreduce_rd(_dm_tcp* t, void* recv, size_t count, dm_dtype dtype,
                                      dm_reduce_op op, const _dm_tcp_fp* fp) {
    static const char* name = "all_reduce";
    int W = t->base.size, r = t->base.rank, p = 1, rem, newrank, mask;
    size_t bytes = count * dm_dtype_size(dtype);
    while (p * 2 <= W) p *= 2;
    rem = W - p;
    if (r < 2 * rem) {
        if (r % 2 == 0) {
            _DM_TRY(_dm_tcp_sendrecv(t, name, fp, r + 1, recv, bytes, -1, NULL, 0));
            newrank = -1;
        } else {
            _DM_TRY(_dm_tcp_sendrecv(t, name, fp, -1, NULL, 0, r - 1, t->tmp, bytes));
            dm_reduce_local(dtype, op, recv, t->tmp, count);
            newrank = r / 2;
        }
    } else {
        newrank = r - rem;
    }
    if (newrank >= 0) {
        for (mask = 1; mask < p; mask <<= 1) {
            int pn = newrank ^ mask, peer = pn < rem ? pn * 2 + 1 : pn + rem;
            _DM_TRY(_dm_tcp_sendrecv(t, name, fp, peer, recv, bytes, peer, t->tmp, bytes));
            /* IEEE +, *, max, min are commutative, so both partners compute the same bits */
            dm_reduce_local(dtype, op, recv, t->tmp, count);
        }
    }
    if (r < 2 * rem) {
        if (r % 2) _DM_TRY(_dm_tcp_sendrecv(t, name, fp, r - 1, recv, bytes, -1, NULL, 0));
        else _DM_TRY(_dm_tcp_sendrecv(t, name, fp, -1, NULL, 0, r + 1, recv, bytes));
    }
    if (op == DM_MEAN) dm_divide_local(dtype, recv, count, W);
    return DM_OK;
}

/* Ring all-reduce: W-1 reduce-scatter steps (step g sends block r-g-1, receives and reduces
   block r-g-2, so rank r ends holding block r) then W-1 all-gather steps (step g sends block
   r-g, receives block r-g-1), all in one pipelined stream. */
static dm_status _dm_tcp_allreduce_ring(_dm_tcp* t, const void* send, void* recv, size_t count,
                                        dm_dtype dtype, dm_reduce_op op, const _dm_tcp_fp* fp) {
    int W = t->base.size, r = t->base.rank, g, n = 2 * (W - 1) + 1;
    size_t esize = dm_dtype_size(dtype), off, len;
    const unsigned char* in = (const unsigned char*)send;
    unsigned char* out = (unsigned char*)recv;
    _dm_tcp_fpbufs b;
    _dm_tcp_sstep* ss = (_dm_tcp_sstep*)_dm_malloc(&t->base.allocator, sizeof(_dm_tcp_sstep) * (size_t)n);
    _dm_tcp_rstep* rs = (_dm_tcp_rstep*)_dm_calloc(&t->base.allocator, sizeof(_dm_tcp_rstep) * (size_t)n);
    dm_status st;
    _DM_ZERO(_dm_tcp_xfer, x);
    if (!ss || !rs) {
        _dm_free(&t->base.allocator, ss);
        _dm_free(&t->base.allocator, rs);
        return _DM_FAIL(&t->base, DM_ERR_OUT_OF_MEMORY, "tcp: all_reduce: out of memory");
    }
    _dm_tcp_fp_steps(&b, fp, &ss[0], &rs[0]);
    for (g = 0; g < W - 1; g++) {
        _dm_tcp_block(count, W, _dm_tcp_mod(r - g - 1, W), &off, &len);
        ss[1 + g].buf = (g == 0 ? in : out) + off * esize;
        ss[1 + g].len = len * esize;
        ss[1 + g].gate = g == 0 ? -1 : g;
        _dm_tcp_block(count, W, _dm_tcp_mod(r - g - 2, W), &off, &len);
        rs[1 + g].buf = out + off * esize;
        rs[1 + g].len = len * esize;
        rs[1 + g].own = in + off * esize;
        rs[1 + g].after_send = -1;
        rs[1 + g].divide = (op == DM_MEAN && g == W - 2) ? W : 0;
    }
    for (g = 0; g < W - 1; g++) {
        int k = W + g;
        _dm_tcp_block(count, W, _dm_tcp_mod(r - g, W), &off, &len);
        ss[k].buf = out + off * esize; ss[k].len = len * esize; ss[k].gate = k - 1;
        _dm_tcp_block(count, W, _dm_tcp_mod(r - g - 1, W), &off, &len);
        rs[k].buf = out + off * esize; rs[k].len = len * esize; rs[k].after_send = -1;
    }
    x.op = "all_reduce"; x.speer = (r + 1) % W; x.rpeer = (r - 1 + W) % W;
    x.ss = ss; x.ns = n; x.rs = rs; x.nr = n; x.dtype = dtype; x.rop = op; x.expect = fp;
    st = _dm_tcp_run(t, &x);
    _dm_free(&t->base.allocator, ss);
    _dm_free(&t->base.allocator, rs);
    return st;
}

static dm_status _dm_tcp_all_reduce(dm_collective* c, const void* send, void* recv, size_t count,
                                    dm_dtype dtype, dm_reduce_op op) {
    _dm_tcp* t = (_dm_tcp*)c;
    size_t bytes = count * dm_dtype_size(dtype);
    _dm_tcp_fp fp;
    _DM_TRY(_dm_tcp_check_broken(t, "all_reduce"));
    if (c->size == 1 || count == 0) {
        if (send != recv) memcpy(recv, send, bytes);
        return DM_OK;
    }
    _dm_tcp_fp_make(t, &fp, _DM_TCP_K_ALL_REDUCE, dtype, op, 0, count);
    if (bytes <= _DM_TCP_SMALL_BYTES || count < (size_t)c->size) {
        if (send != recv) memcpy(recv, send, bytes);
        return _dm_tcp_allreduce_rd(t, recv, count, dtype, op, &fp);
    }
    return _dm_tcp_allreduce_ring(t, send, recv, count, dtype, op, &fp);
}

/* Ring all-gather into per-rank buffers: step g sends block r-g (own input first), receives
   block r-g-1 straight into place and forwards it the next step as it arrives. */
static dm_status _dm_tcp_allgather_ring(_dm_tcp* t, int kind, const void* send, void* const* recvs,
                                        size_t count, dm_dtype dtype) {
    int W = t->base.size, r = t->base.rank, g, n = W;
    size_t bytes = count * dm_dtype_size(dtype);
    _dm_tcp_fpbufs b;
    _dm_tcp_fp fp;
    _dm_tcp_sstep* ss;
    _dm_tcp_rstep* rs;
    dm_status st;
    _DM_ZERO(_dm_tcp_xfer, x);
    if (recvs[r] != send) memcpy(recvs[r], send, bytes);
    if (W == 1 || count == 0) return DM_OK;
    ss = (_dm_tcp_sstep*)_dm_malloc(&t->base.allocator, sizeof(_dm_tcp_sstep) * (size_t)n);
    rs = (_dm_tcp_rstep*)_dm_calloc(&t->base.allocator, sizeof(_dm_tcp_rstep) * (size_t)n);
    if (!ss || !rs) {
        _dm_free(&t->base.allocator, ss);
        _dm_free(&t->base.allocator, rs);
        return _DM_FAIL(&t->base, DM_ERR_OUT_OF_MEMORY, "tcp: all_gather: out of memory");
    }
    _dm_tcp_fp_make(t, &fp, kind, dtype, DM_SUM, 0, count);
    _dm_tcp_fp_steps(&b, &fp, &ss[0], &rs[0]);
    for (g = 0; g < W - 1; g++) {
        ss[1 + g].buf = (const unsigned char*)(g == 0 ? send : recvs[_dm_tcp_mod(r - g, W)]);
        ss[1 + g].len = bytes;
        ss[1 + g].gate = g == 0 ? -1 : g;
        rs[1 + g].buf = (unsigned char*)recvs[_dm_tcp_mod(r - g - 1, W)];
        rs[1 + g].len = bytes;
        rs[1 + g].after_send = -1;
    }
    x.op = _dm_tcp_kind_name(kind); x.speer = (r + 1) % W; x.rpeer = (r - 1 + W) % W;
    x.ss = ss; x.ns = n; x.rs = rs; x.nr = n; x.dtype = dtype; x.rop = DM_SUM; x.expect = &fp;
    st = _dm_tcp_run(t, &x);
    _dm_free(&t->base.allocator, ss);
    _dm_free(&t->base.allocator, rs);
    return st;
}

static dm_status _dm_tcp_all_gather_to_list(dm_collective* c, const void* send, void* const* recvs,
                                            size_t count, dm_dtype dtype) {
    _dm_tcp* t = (_dm_tcp*)c;
    _DM_TRY(_dm_tcp_check_broken(t, "all_gather_to_list"));
    return _dm_tcp_allgather_ring(t, _DM_TCP_K_ALL_GATHER, send, recvs, count, dtype);
}

static dm_status _dm_tcp_all_gather(dm_collective* c, const void* send, void* recv, size_t count,
                                    dm_dtype dtype) {
    _dm_tcp* t = (_dm_tcp*)c;
    size_t bytes = count * dm_dtype_size(dtype);
    void* small[16];
    void** ptrs = small;
    dm_status st;
    int j;
    _DM_TRY(_dm_tcp_check_broken(t, "all_gather"));
    if (c->size > 16) {
        ptrs = (void**)_dm_malloc(&c->allocator, sizeof(void*) * (size_t)c->size);
        if (!ptrs) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "tcp: all_gather: out of memory");
    }
    for (j = 0; j < c->size; j++) ptrs[j] = (unsigned char*)recv + (size_t)j * bytes;
    st = _dm_tcp_allgather_ring(t, _DM_TCP_K_ALL_GATHER, send, (void* const*)ptrs, count, dtype);
    if (ptrs != small) _dm_free(&c->allocator, ptrs);
    return st;
}

/* Ring reduce-scatter: step g sends block r-g-1 and reduces the received block r-g-2 into a
   scratch block (recv when out of place) that must first have been sent on; the last step
   (block r) lands in recv. */
static dm_status _dm_tcp_reduce_scatter(dm_collective* c, const void* send, void* recv, size_t n_elems,
                                        dm_dtype dtype, dm_reduce_op op) {
    _dm_tcp* t = (_dm_tcp*)c;
    int W = c->size, r = c->rank, g, n = W;
    size_t bytes = n_elems * dm_dtype_size(dtype);
    const unsigned char* in = (const unsigned char*)send;
    unsigned char *out = (unsigned char*)recv, *scratch = out, *own_scratch = NULL;
    _dm_tcp_fpbufs b;
    _dm_tcp_fp fp;
    _dm_tcp_sstep* ss;
    _dm_tcp_rstep* rs;
    dm_status st;
    _DM_ZERO(_dm_tcp_xfer, x);
    _DM_TRY(_dm_tcp_check_broken(t, "reduce_scatter"));
    if (W == 1 || n_elems == 0) {
        if (out != in) memcpy(out, in, bytes);
        return DM_OK;
    }
    /* in place, recv is input block r: intermediate sums need a block of their own */
    if (out == in + (size_t)r * bytes && W > 2) {
        own_scratch = (unsigned char*)_dm_malloc(&c->allocator, bytes);
        if (!own_scratch) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "tcp: reduce_scatter: no memory for %zu bytes", bytes);
        scratch = own_scratch;
    }
    ss = (_dm_tcp_sstep*)_dm_malloc(&c->allocator, sizeof(_dm_tcp_sstep) * (size_t)n);
    rs = (_dm_tcp_rstep*)_dm_calloc(&c->allocator, sizeof(_dm_tcp_rstep) * (size_t)n);
    if (!ss || !rs) {
        _dm_free(&c->allocator, ss);
        _dm_free(&c->allocator, rs);
        _dm_free(&c->allocator, own_scratch);
        return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "tcp: reduce_scatter: out of memory");
    }
    _dm_tcp_fp_make(t, &fp, _DM_TCP_K_REDUCE_SCATTER, dtype, op, 0, n_elems);
    _dm_tcp_fp_steps(&b, &fp, &ss[0], &rs[0]);
    for (g = 0; g < W - 1; g++) {
        ss[1 + g].buf = g == 0 ? in + (size_t)_dm_tcp_mod(r - 1, W) * bytes : scratch;
        ss[1 + g].len = bytes;
        ss[1 + g].gate = g == 0 ? -1 : g;
    }
    for (g = 0; g < W - 1; g++) {
        _dm_tcp_rstep* s = &rs[1 + g];
        s->buf = g == W - 2 ? out : scratch;
        s->len = bytes;
        s->own = in + (size_t)_dm_tcp_mod(r - g - 2, W) * bytes;
        s->divide = (op == DM_MEAN && g == W - 2) ? W : 0;
    }
    /* rs[g+1] overwrites scratch, which ss[g+1] (sent in the same step) still reads */
    for (g = 1; g < W - 1; g++)
        if (ss[1 + g].buf == rs[1 + g].buf) rs[1 + g].after_send = 1 + g;
        else rs[1 + g].after_send = -1;
    x.op = "reduce_scatter"; x.speer = (r + 1) % W; x.rpeer = (r - 1 + W) % W;
    x.ss = ss; x.ns = n; x.rs = rs; x.nr = n; x.dtype = dtype; x.rop = op; x.expect = &fp;
    st = _dm_tcp_run(t, &x);
    _dm_free(&c->allocator, ss);
    _dm_free(&c->allocator, rs);
    _dm_free(&c->allocator, own_scratch);
    return st;
}

/* Pipelined chain from root: position p = rank - root; each rank forwards bytes to p+1 as they
   arrive from p-1. */
static dm_status _dm_tcp_broadcast(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int root) {
    _dm_tcp* t = (_dm_tcp*)c;
    int W = c->size, pos = _dm_tcp_mod(c->rank - root, W);
    size_t bytes = count * dm_dtype_size(dtype);
    _dm_tcp_sstep ss[2];
    _dm_tcp_rstep rs[2];
    _dm_tcp_fpbufs b;
    _dm_tcp_fp fp;
    _DM_ZERO(_dm_tcp_xfer, x);
    _DM_TRY(_dm_tcp_check_broken(t, "broadcast"));
    if (W == 1 || count == 0) return DM_OK;
    _dm_tcp_fp_make(t, &fp, _DM_TCP_K_BROADCAST, dtype, DM_SUM, root, count);
    _dm_tcp_fp_steps(&b, &fp, &ss[0], &rs[0]);
    ss[1].buf = (const unsigned char*)buf; ss[1].len = bytes; ss[1].gate = pos == 0 ? -1 : 1;
    memset(&rs[1], 0, sizeof(rs[1]));
    rs[1].buf = (unsigned char*)buf; rs[1].len = bytes; rs[1].after_send = -1;
    x.op = "broadcast";
    x.speer = pos < W - 1 ? (c->rank + 1) % W : -1;
    x.rpeer = pos > 0 ? (c->rank - 1 + W) % W : -1;
    x.ss = ss; x.ns = x.speer >= 0 ? 2 : 0; x.rs = rs; x.nr = x.rpeer >= 0 ? 2 : 0;
    x.dtype = dtype; x.rop = DM_SUM; x.expect = &fp;
    return _dm_tcp_run(t, &x);
}

/* Dissemination barrier: round k sends to rank + 2^k and waits for rank - 2^k. */
static dm_status _dm_tcp_barrier(dm_collective* c) {
    _dm_tcp* t = (_dm_tcp*)c;
    int W = c->size, k, round = 0;
    _dm_tcp_fp fp;
    _DM_TRY(_dm_tcp_check_broken(t, "barrier"));
    for (k = 1; k < W; k <<= 1, round++) {
        _dm_tcp_fp_make(t, &fp, _DM_TCP_K_BARRIER, DM_UINT8, DM_SUM, round, 0);
        _DM_TRY(_dm_tcp_sendrecv(t, "barrier", &fp, (c->rank + k) % W, NULL, 0, (c->rank - k + W) % W, NULL, 0));
    }
    return DM_OK;
}

/* >>tcp addresses  "host:port" / "[v6]:port" <-> sockaddr, interface choice (uv does the
   parsing, printing and interface listing). */
static bool _dm_tcp_parse_addr(const char* s, struct sockaddr_storage* out) {
    char host[128];
    const char* colon = strrchr(s, ':');
    size_t n;
    int port;
    if (!colon) return false;
    port = atoi(colon + 1);
    if (port <= 0 || port > 65535) return false;
    if (s[0] == '[') {
        n = (size_t)(colon - s);
        if (n < 3 || s[n - 1] != ']' || n - 2 >= sizeof(host)) return false;
        memcpy(host, s + 1, n - 2); host[n - 2] = 0;
        return uv_ip6_addr(host, port, (struct sockaddr_in6*)out) == 0;
    }
    n = (size_t)(colon - s);
    if (n >= sizeof(host)) return false;
    memcpy(host, s, n); host[n] = 0;
    return uv_ip4_addr(host, port, (struct sockaddr_in*)out) == 0;
}
static void _dm_tcp_format_addr(const struct sockaddr* sa, char* out, size_t cap) {
    char host[INET6_ADDRSTRLEN];
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6* s6 = (const struct sockaddr_in6*)(const void*)sa;
        uv_ip6_name(s6, host, sizeof(host));
        snprintf(out, cap, "[%s]:%d", host, ntohs(s6->sin6_port));
    } else {
        const struct sockaddr_in* s4 = (const struct sockaddr_in*)(const void*)sa;
        uv_ip4_name(s4, host, sizeof(host));
        snprintf(out, cap, "%s:%d", host, ntohs(s4->sin_port));
    }
}

/* NCCL-style interface spec: "a,b" prefixes, "=a,b" exact names, leading '^' excludes. */
static bool _dm_tcp_if_match(const char* spec, const char* name) {
    bool exclude = false, exact = false, hit = false;
    const char* p;
    if (*spec == '^') { exclude = true; spec++; }
    if (*spec == '=') { exact = true; spec++; }
    for (p = spec; *p && !hit;) {
        const char* e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n > 0) hit = exact ? (strlen(name) == n && strncmp(name, p, n) == 0) : strncmp(name, p, n) == 0;
        p += n + (e ? 1 : 0);
    }
    return exclude ? !hit : hit;
}

/* The local address to listen on: an interface matching spec (IPv4 before IPv6, link-local v6
   skipped), or else the source address the kernel would use to reach route_host. */
static dm_status _dm_tcp_pick_addr(_dm_tcp* t, const char* spec, const char* route_host,
                                   struct sockaddr_storage* out) {
    uv_interface_address_t* ifs = NULL;
    int n = 0, i, pass, rc;
    memset(out, 0, sizeof(*out));
    if (spec && *spec) {
        rc = uv_interface_addresses(&ifs, &n);
        if (rc != 0)
            return _DM_FAIL(&t->base, DM_ERR_NETWORK, "tcp: cannot list interfaces (%s)", uv_strerror(rc));
        for (pass = 0; pass < 2; pass++)
            for (i = 0; i < n; i++) {
                int fam = ifs[i].address.address4.sin_family;
                if (!_dm_tcp_if_match(spec, ifs[i].name)) continue;
                if (pass == 0 && fam == AF_INET) {
                    memcpy(out, &ifs[i].address.address4, sizeof(struct sockaddr_in));
                    uv_free_interface_addresses(ifs, n);
                    return DM_OK;
                }
                if (pass == 1 && fam == AF_INET6 && !IN6_IS_ADDR_LINKLOCAL(&ifs[i].address.address6.sin6_addr)) {
                    memcpy(out, &ifs[i].address.address6, sizeof(struct sockaddr_in6));
                    uv_free_interface_addresses(ifs, n);
                    return DM_OK;
                }
            }
        uv_free_interface_addresses(ifs, n);
        return _DM_FAIL(&t->base, DM_ERR_NETWORK, "tcp: no interface with an address matches \"%s\"", spec);
    }
    if (route_host && *route_host) {
        uv_loop_t loop;
        uv_getaddrinfo_t req;
        struct addrinfo hints;
        memset(&hints, 0, sizeof(hints));
        hints.ai_socktype = SOCK_DGRAM;
        if (uv_loop_init(&loop) == 0) {
            rc = uv_getaddrinfo(&loop, &req, NULL, route_host, "9", &hints);
            if (rc == 0 && req.addrinfo) {
                int fd = socket(req.addrinfo->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
                socklen_t len = sizeof(*out);
                bool ok = fd >= 0 && connect(fd, req.addrinfo->ai_addr, req.addrinfo->ai_addrlen) == 0 &&
                          getsockname(fd, (struct sockaddr*)out, &len) == 0;
                if (fd >= 0) close(fd);
                uv_freeaddrinfo(req.addrinfo);
                uv_loop_close(&loop);
                if (ok) return DM_OK;
            } else {
                uv_loop_close(&loop);
            }
        }
        _DM_LOG(&t->base.logger, DM_LOG_WARN, "tcp: no route to %s; using the first interface", route_host);
    }
    /* nothing to go by: the first non-loopback IPv4 address, else loopback */
    rc = uv_interface_addresses(&ifs, &n);
    for (i = 0; rc == 0 && i < n; i++)
        if (!ifs[i].is_internal && ifs[i].address.address4.sin_family == AF_INET) {
            memcpy(out, &ifs[i].address.address4, sizeof(struct sockaddr_in));
            uv_free_interface_addresses(ifs, n);
            return DM_OK;
        }
    if (rc == 0) uv_free_interface_addresses(ifs, n);
    uv_ip4_addr("127.0.0.1", 0, (struct sockaddr_in*)out);
    return DM_OK;
}

/* >>tcp sockets */
static void _dm_tcp_tune(int fd) {
    static int sockbuf = -1;    /* set buffers only where the kernel allows the full size, so
                                   loopback keeps its autotuning otherwise */
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (sockbuf < 0) {
        FILE* f = fopen("/proc/sys/net/core/wmem_max", "r");
        long v = 0;
        if (f) { if (fscanf(f, "%ld", &v) != 1) v = 0; fclose(f); }
        sockbuf = v >= _DM_TCP_SOCKBUF ? _DM_TCP_SOCKBUF : 0;
    }
    if (sockbuf > 0) {
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sockbuf, sizeof(sockbuf));
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sockbuf, sizeof(sockbuf));
    }
}
/* Waits for fd to be ready for events, up to the deadline. 1 ready, 0 timeout, -1 error. */
static int _dm_tcp_wait_fd(int fd, short events, int64_t deadline) {
    for (;;) {
        struct pollfd p;
        int64_t left = deadline - _dm_now_ms();
        int rc;
        if (left <= 0) return 0;
        p.fd = fd; p.events = events; p.revents = 0;
        rc = poll(&p, 1, left > 1000 ? 1000 : (int)left);
        if (rc > 0) return 1;
        if (rc < 0 && errno != EINTR) return -1;
    }
}
/* Blocking-style exact read/write on a nonblocking fd with a deadline: 1 ok, 0 timeout, -1 EOF
   or error (errno; 0 for EOF). */
static int _dm_tcp_read_full(int fd, void* buf, size_t n, int64_t deadline) {
    size_t got = 0;
    while (got < n) {
        ssize_t k = recv(fd, (char*)buf + got, n - got, MSG_DONTWAIT);
        if (k > 0) { got += (size_t)k; continue; }
        if (k == 0) { errno = 0; return -1; }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
        k = _dm_tcp_wait_fd(fd, POLLIN, deadline);
        if (k <= 0) return (int)k;
    }
    return 1;
}
static int _dm_tcp_write_full(int fd, const void* buf, size_t n, int64_t deadline) {
    size_t put = 0;
    while (put < n) {
        ssize_t k = send(fd, (const char*)buf + put, n - put, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k > 0) { put += (size_t)k; continue; }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return -1;
        k = _dm_tcp_wait_fd(fd, POLLOUT, deadline);
        if (k <= 0) return (int)k;
    }
    return 1;
}

/* Hello, 48 bytes: magic u32, version u32, rank u32, world u32, group u64, digest 2 x u64,
   0 u64. Ack, 8 bytes: magic u32, status u32. */
static void _dm_tcp_hello_encode(const _dm_tcp* t, uint64_t group, unsigned char* p) {
    memset(p, 0, 48);
    _dm_tcp_put32(p, _DM_TCP_HELLO_MAGIC);
    _dm_tcp_put32(p + 4, _DM_TCP_VERSION);
    _dm_tcp_put32(p + 8, (uint32_t)t->base.rank);
    _dm_tcp_put32(p + 12, (uint32_t)t->base.size);
    _dm_tcp_put64(p + 16, group);
    _dm_tcp_put64(p + 24, t->digest[0]);
    _dm_tcp_put64(p + 32, t->digest[1]);
}

/* Connects to rank j at addr with retries until the deadline; sends the hello. */
static dm_status _dm_tcp_connect_peer(_dm_tcp* t, int j, uint64_t group, int64_t deadline) {
    struct sockaddr_storage sa;
    unsigned char hello[48];
    int fd = -1, rc, err;
    if (!_dm_tcp_parse_addr(t->addrs[j], &sa))
        return _DM_FAIL(&t->base, DM_ERR_PROTOCOL, "tcp: rank %d published a malformed address \"%s\"", j, t->addrs[j]);
    for (;;) {
        socklen_t len = sizeof(err);
        fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) return _DM_FAIL(&t->base, DM_ERR_NETWORK, "tcp: socket() failed (%s)", strerror(errno));
        rc = connect(fd, (struct sockaddr*)&sa, sa.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                                          : sizeof(struct sockaddr_in));
        err = rc == 0 ? 0 : errno;
        if (err == EINPROGRESS) {
            rc = _dm_tcp_wait_fd(fd, POLLOUT, deadline);
            err = rc == 1 ? 0 : ETIMEDOUT;
            if (rc == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        }
        if (err == 0) break;
        close(fd);
        fd = -1;
        if (_dm_now_ms() >= deadline)
            return _DM_FAIL(&t->base, DM_ERR_TIMEOUT, "tcp: setup timed out connecting to rank %d at %s (%s)",
                            j, t->addrs[j], strerror(err));
        usleep(20000);
    }
    _dm_tcp_tune(fd);
    _dm_tcp_hello_encode(t, group, hello);
    if (_dm_tcp_write_full(fd, hello, sizeof(hello), deadline) != 1) {
        close(fd);
        return _DM_FAIL(&t->base, DM_ERR_NETWORK, "tcp: setup: sending the hello to rank %d at %s failed",
                        j, t->addrs[j]);
    }
    t->fds[j] = fd;
    return DM_OK;
}

/* Accepts connections until every higher rank has said hello. Strangers (bad magic, group,
   rank or token) get a refusal ack and are closed; they do not count. */
static dm_status _dm_tcp_accept_peers(_dm_tcp* t, int lfd, uint64_t group, int64_t deadline) {
    int missing = t->base.size - 1 - t->base.rank;
    while (missing > 0) {
        unsigned char hello[48], ack[8];
        uint32_t status = _DM_TCP_ACK_OK;
        int fd, rc, peer;
        int64_t hello_deadline;
        rc = _dm_tcp_wait_fd(lfd, POLLIN, deadline);
        if (rc == 0) {
            int j;
            for (j = t->base.rank + 1; j < t->base.size && t->fds[j] >= 0; j++) {}
            return _DM_FAIL(&t->base, DM_ERR_TIMEOUT, "tcp: setup timed out after %d ms waiting for rank %d "
                            "to connect (%d of %d peers missing)", t->base.timeout_ms, j, missing,
                            t->base.size - 1 - t->base.rank);
        }
        if (rc < 0) return _DM_FAIL(&t->base, DM_ERR_NETWORK, "tcp: setup: poll on the listener failed (%s)", strerror(errno));
        fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) continue;
        /* a silent stranger cannot hold the rendezvous for more than a few seconds */
        hello_deadline = _dm_now_ms() + 5000 < deadline ? _dm_now_ms() + 5000 : deadline;
        if (_dm_tcp_read_full(fd, hello, sizeof(hello), hello_deadline) != 1) { close(fd); continue; }
        peer = (int)_dm_tcp_get32(hello + 8);
        if (_dm_tcp_get32(hello) != _DM_TCP_HELLO_MAGIC || _dm_tcp_get32(hello + 4) != _DM_TCP_VERSION) {
            _DM_LOG(&t->base.logger, DM_LOG_WARN, "tcp: setup: refused a connection with a bad hello");
            close(fd);
            continue;
        }
        if (_dm_tcp_get64(hello + 16) != group || (int)_dm_tcp_get32(hello + 12) != t->base.size)
            status = _DM_TCP_ACK_GROUP;
        else if (peer <= t->base.rank || peer >= t->base.size || t->fds[peer] >= 0)
            status = _DM_TCP_ACK_RANK;
        else if (_dm_tcp_get64(hello + 24) != t->digest[0] || _dm_tcp_get64(hello + 32) != t->digest[1])
            status = _DM_TCP_ACK_TOKEN;
        _dm_tcp_put32(ack, _DM_TCP_ACK_MAGIC);
        _dm_tcp_put32(ack + 4, status);
        rc = _dm_tcp_write_full(fd, ack, sizeof(ack), hello_deadline);
        if (status != _DM_TCP_ACK_OK || rc != 1) {
            _DM_LOG(&t->base.logger, DM_LOG_WARN, "tcp: setup: refused a connection claiming rank %d (%s)", peer,
                    status == _DM_TCP_ACK_TOKEN ? "wrong token" : status == _DM_TCP_ACK_GROUP ? "other group" : "bad rank");
            close(fd);
            continue;
        }
        _dm_tcp_tune(fd);
        t->fds[peer] = fd;
        missing--;
    }
    return DM_OK;
}

static dm_status _dm_tcp_read_ack(_dm_tcp* t, int j, int64_t deadline) {
    unsigned char ack[8];
    int rc = _dm_tcp_read_full(t->fds[j], ack, sizeof(ack), deadline);
    uint32_t status;
    if (rc == 0)
        return _DM_FAIL(&t->base, DM_ERR_TIMEOUT, "tcp: setup timed out waiting for rank %d (%s) to accept",
                        j, t->addrs[j]);
    if (rc < 0)
        return _DM_FAIL(&t->base, DM_ERR_REFUSED, "tcp: setup: rank %d (%s) closed the connection during the "
                        "hello (%s)", j, t->addrs[j], errno ? strerror(errno) : "EOF");
    if (_dm_tcp_get32(ack) != _DM_TCP_ACK_MAGIC)
        return _DM_FAIL(&t->base, DM_ERR_PROTOCOL, "tcp: setup: rank %d (%s) answered with malformed bytes", j, t->addrs[j]);
    status = _dm_tcp_get32(ack + 4);
    if (status == _DM_TCP_ACK_TOKEN)
        return _DM_FAIL(&t->base, DM_ERR_REFUSED, "tcp: setup: rank %d (%s) refused this rank's token "
                        "(set the same DISTMESH_TOKEN / desc.token on every rank)", j, t->addrs[j]);
    if (status != _DM_TCP_ACK_OK)
        return _DM_FAIL(&t->base, DM_ERR_REFUSED, "tcp: setup: rank %d (%s) refused the connection (%s)", j,
                        t->addrs[j], status == _DM_TCP_ACK_GROUP ? "different group or world size" : "rank taken");
    return DM_OK;
}

/* >>tcp store access (the store API of wip/tcp_store.h) */
static dm_status _dm_tcp_store_fail(_dm_tcp* t, dm_status st, const char* what, const char* key) {
    return _DM_FAIL(&t->base, st, "tcp: store %s \"%s\" failed: %s", what, key, dm_store_last_error(t->store));
}
static dm_status _dm_tcp_store_get_str(_dm_tcp* t, const char* key, char* out, size_t cap) {
    void* v = NULL;
    size_t n = 0;
    dm_status st = dm_store_get(t->store, key, &v, &n);
    if (st != DM_OK) return _dm_tcp_store_fail(t, st, "get", key);
    if (n >= cap) n = cap - 1;
    memcpy(out, v, n);
    out[n] = 0;
    dm_store_free(t->store, v);
    return DM_OK;
}

/* >>tcp lifetime */
static void _dm_tcp_free(_dm_tcp* t) {
    dm_allocator a = t->base.allocator;
    int r;
    if (t->fds)
        for (r = 0; r < t->base.size; r++)
            if (t->fds[r] >= 0) close(t->fds[r]);
    if (t->own_store) dm_store_destroy(t->store);
    _dm_free(&a, t->fds);
    _dm_free(&a, t->addrs);
    _dm_free(&a, t->tmp);
    _dm_free(&a, t);
}
static void _dm_tcp_destroy(dm_collective* c) { _dm_tcp_free((_dm_tcp*)c); }

static dm_status _dm_tcp_split(dm_collective* c, int color, int key, dm_collective** out);

static const dm_collective_vtable _dm_tcp_vtable = {
    sizeof(dm_collective_vtable),    /* struct_size */
    DM_COLLECTIVE_VTABLE_VERSION,    /* version */
    "tcp",                           /* name */
    _dm_tcp_destroy,                 /* destroy */
    _dm_tcp_barrier,                 /* barrier: dissemination */
    _dm_tcp_all_reduce,              /* all_reduce: recursive doubling / ring */
    _dm_tcp_all_gather,              /* all_gather: ring */
    _dm_tcp_all_gather_to_list,      /* all_gather_to_list: ring into the caller's buffers */
    _dm_tcp_reduce_scatter,          /* reduce_scatter: ring */
    _dm_tcp_broadcast,               /* broadcast: pipelined chain */
    _dm_tcp_split,                   /* split */
    NULL,                            /* native_handle: none */
    NULL,                            /* synchronize: nothing queued */
};

/* Everything the rendezvous needs, resolved from the desc and the environment. */
typedef struct _dm_tcp_setup {
    int rank, size, timeout_ms;
    struct dm_store* store;
    bool own_store;
    const char* prefix;
    const char* ifname;
    const char* token;
    const char* route_host;     /* host to route toward when no interface is named */
    const struct sockaddr_storage* bind_sa; /* listen here (split), else pick by ifname/route */
    size_t chunk_bytes;
    dm_logger logger;
    dm_allocator allocator;
} _dm_tcp_setup;

/* The rendezvous: generation, listen, publish, connect down / accept up, acks, host names. */
static dm_status _dm_tcp_build(const _dm_tcp_setup* s, dm_collective** out) {
    _dm_tcp* t;
    struct sockaddr_storage sa;
    socklen_t salen;
    char key[600], self_addr[64];
    int64_t gen = 0, deadline;
    uint64_t group;
    int lfd = -1, j, one = 1;
    size_t chunk;
    dm_status st;
    char* names = NULL;
    enum { NAME = sizeof(((dm_collective*)0)->node_name) };

    t = (_dm_tcp*)_dm_calloc(&s->allocator, sizeof(_dm_tcp));
    if (!t) {
        if (s->own_store) dm_store_destroy(s->store);
        return DM_ERR_OUT_OF_MEMORY;
    }
    _dm_collective_init(&t->base, &_dm_tcp_vtable, s->rank, s->size, s->timeout_ms, &s->logger, &s->allocator);
    t->store = s->store;
    t->own_store = s->own_store;
    _dm_copy_name(t->user_prefix, sizeof(t->user_prefix), s->prefix);
    _dm_copy_name(t->ifname, sizeof(t->ifname), s->ifname ? s->ifname : "");
    _dm_copy_name(t->token, sizeof(t->token), s->token ? s->token : "");
    chunk = s->chunk_bytes ? s->chunk_bytes : ((size_t)512 << 10);
    chunk = (chunk + 7) / 8 * 8;            /* a whole number of elements of every dtype */
    t->chunk_bytes = chunk;
    t->tmp_size = chunk > _DM_TCP_SMALL_BYTES ? chunk : _DM_TCP_SMALL_BYTES;
    t->fds = (int*)_dm_malloc(&t->base.allocator, sizeof(int) * (size_t)s->size);
    t->addrs = (char(*)[64])_dm_calloc(&t->base.allocator, 64 * (size_t)s->size);
    t->tmp = (unsigned char*)_dm_malloc(&t->base.allocator, t->tmp_size);
    names = (char*)_dm_calloc(&t->base.allocator, (size_t)NAME * (size_t)s->size);
    if (!t->fds || !t->addrs || !t->tmp || !names) {
        st = _DM_FAIL(&t->base, DM_ERR_OUT_OF_MEMORY, "tcp: out of memory");
        goto fail;
    }
    for (j = 0; j < s->size; j++) t->fds[j] = -1;
    deadline = _dm_deadline(t->base.timeout_ms);

    /* generation: create/destroy cycles under one prefix get fresh keys. No rank can start the
       next cycle's add before every rank did this one's (connecting needs everyone's address). */
    snprintf(key, sizeof(key), "%sgen", t->user_prefix);
    st = dm_store_add(t->store, key, 1, &gen);
    if (st != DM_OK) { _dm_tcp_store_fail(t, st, "add", key); goto fail; }
    snprintf(t->prefix, sizeof(t->prefix), "%.480sg%lld/", t->user_prefix, (long long)((gen - 1) / s->size));
    group = _dm_tcp_hash(1, t->prefix, NULL);
    t->digest[0] = _dm_tcp_hash(2, t->prefix, t->token);
    t->digest[1] = _dm_tcp_hash(3, t->token, t->prefix);

    /* listen on the chosen interface, ephemeral port */
    if (s->bind_sa) memcpy(&sa, s->bind_sa, sizeof(sa));
    else if ((st = _dm_tcp_pick_addr(t, t->ifname, s->route_host, &sa)) != DM_OK) goto fail;
    salen = sa.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    if (sa.ss_family == AF_INET6) ((struct sockaddr_in6*)&sa)->sin6_port = 0;
    else ((struct sockaddr_in*)&sa)->sin_port = 0;
    lfd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (lfd < 0) { st = _DM_FAIL(&t->base, DM_ERR_NETWORK, "tcp: socket() failed (%s)", strerror(errno)); goto fail; }
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(lfd, (struct sockaddr*)&sa, salen) != 0 || listen(lfd, 512) != 0) {
        char where[64];
        _dm_tcp_format_addr((struct sockaddr*)&sa, where, sizeof(where));
        st = _DM_FAIL(&t->base, DM_ERR_NETWORK, "tcp: cannot listen on %s (%s)", where, strerror(errno));
        goto fail;
    }
    salen = sizeof(sa);
    getsockname(lfd, (struct sockaddr*)&sa, &salen);
    memcpy(&t->self_sa, &sa, sizeof(sa));
    _dm_tcp_format_addr((struct sockaddr*)&sa, self_addr, sizeof(self_addr));
    _dm_copy_name(t->addrs[s->rank], 64, self_addr);
    snprintf(key, sizeof(key), "%saddr/%d", t->prefix, s->rank);
    st = dm_store_set(t->store, key, self_addr, strlen(self_addr));
    if (st != DM_OK) { _dm_tcp_store_fail(t, st, "set", key); goto fail; }

    /* every address first (so rank j is done with the store once rank 0 has its connection),
       then connect to each lower rank */
    for (j = 0; j < s->rank; j++) {
        snprintf(key, sizeof(key), "%saddr/%d", t->prefix, j);
        st = _dm_tcp_store_get_str(t, key, t->addrs[j], 64);
        if (st != DM_OK) goto fail;
    }
    for (j = 0; j < s->rank; j++) {
        st = _dm_tcp_connect_peer(t, j, group, deadline);
        if (st != DM_OK) goto fail;
    }
    st = _dm_tcp_accept_peers(t, lfd, group, deadline);
    if (st != DM_OK) goto fail;
    for (j = 0; j < s->rank; j++) {
        st = _dm_tcp_read_ack(t, j, deadline);
        if (st != DM_OK) goto fail;
    }
    close(lfd);
    lfd = -1;
    for (j = 0; j < s->size; j++)
        if (t->fds[j] >= 0) {
            struct sockaddr_storage peer;
            socklen_t plen = sizeof(peer);
            if (getpeername(t->fds[j], (struct sockaddr*)&peer, &plen) == 0 && j > s->rank)
                _dm_tcp_format_addr((struct sockaddr*)&peer, t->addrs[j], 64);
        }

    /* host names: node_name, local rank and local size (ranks on the same host) */
    {
        void* small[16];
        void** ptrs = small;
        int lrank = 0, lsize = 0;
        char host[NAME];
        size_t hn = sizeof(host);
        memset(host, 0, sizeof(host));
        if (uv_os_gethostname(host, &hn) != 0) _dm_copy_name(host, sizeof(host), "localhost");
        if (s->size > 16) ptrs = (void**)_dm_malloc(&t->base.allocator, sizeof(void*) * (size_t)s->size);
        if (!ptrs) { st = _DM_FAIL(&t->base, DM_ERR_OUT_OF_MEMORY, "tcp: out of memory"); goto fail; }
        for (j = 0; j < s->size; j++) ptrs[j] = names + (size_t)j * NAME;
        st = _dm_tcp_allgather_ring(t, _DM_TCP_K_SETUP, host, (void* const*)ptrs, NAME, DM_UINT8);
        if (ptrs != small) _dm_free(&t->base.allocator, ptrs);
        if (st != DM_OK) goto fail;
        for (j = 0; j < s->size; j++) {
            names[(size_t)j * NAME + NAME - 1] = 0;
            if (strcmp(names + (size_t)j * NAME, host) != 0) continue;
            if (j < s->rank) lrank++;
            lsize++;
        }
        _dm_copy_name(t->base.node_name, sizeof(t->base.node_name), host);
        t->base.local_rank = lrank;
        t->base.local_size = lsize;
    }
    _dm_free(&t->base.allocator, names);
    /* the store stays only where split may need it again */
    *out = &t->base;
    return DM_OK;
fail:
    if (lfd >= 0) close(lfd);
    _dm_free(&s->allocator, names);
    _dm_tcp_free(t);
    return st;
}

/* Failed creates have no object to hold the message: it goes to the logger only. */
static dm_status _dm_tcp_report(const dm_logger* lg, dm_status st, const char* msg) {
    char err[DM_LAST_ERROR_SIZE];
    return _DM_REPORT(lg, err, sizeof(err), st, "%s", msg);
}

DM_API_IMPL dm_status dm_tcp_create(const dm_tcp_desc* desc, dm_collective** out) {
    _DM_ZERO(dm_tcp_desc, d);
    _DM_ZERO(_dm_tcp_setup, s);
    char err[DM_LAST_ERROR_SIZE], url[320], host[256];
    dm_env env;
    dm_status st;
    if (!out) return DM_ERR_INVALID_ARG;
    *out = NULL;
    if (desc) d = *desc;
    if (!_dm_allocator_valid(&d.allocator))
        return _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_INVALID_ARG,
                          "tcp: allocator needs both alloc_fn and free_fn, or neither");
    st = dm_env_detect(&env);
    if (st != DM_OK) return _dm_tcp_report(&d.logger, st, env.error);
    if (d.world_size == 0) { d.world_size = env.world_size; d.rank = env.rank; }
    if (d.world_size < 1 || d.rank < 0 || d.rank >= d.world_size)
        return _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_INVALID_ARG,
                          "tcp: rank %d is not in 0..world_size-1 (world_size %d)", d.rank, d.world_size);
    s.rank = d.rank;
    s.size = d.world_size;
    s.timeout_ms = d.timeout_ms ? d.timeout_ms : env.timeout_ms;
    s.prefix = d.prefix ? d.prefix : "distmesh/";
    if (strlen(s.prefix) > 150)
        return _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_INVALID_ARG, "tcp: prefix longer than 150 bytes");
    s.ifname = d.ifname ? d.ifname : getenv("DISTMESH_SOCKET_IFNAME");
    if (!s.ifname || !*s.ifname) s.ifname = getenv("GLOO_SOCKET_IFNAME");
    s.token = d.token ? d.token : getenv("DISTMESH_TOKEN");
    s.chunk_bytes = d.chunk_bytes;
    s.logger = d.logger;
    s.allocator = d.allocator;
    s.route_host = env.master_addr[0] ? env.master_addr : NULL;
    s.store = d.store;
    host[0] = 0;
    if (!s.store) {
        _DM_ZERO(dm_store_desc, sd);
        const char* agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
        const char* u = d.store_url ? d.store_url : getenv("DISTMESH_STORE");
        if (!u || !*u) {
            if (!env.master_addr[0] || env.master_port <= 0)
                return _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_ENV,
                                  "tcp: no store: set desc.store / store_url, DISTMESH_STORE, or MASTER_ADDR and MASTER_PORT");
            snprintf(url, sizeof(url), "tcp://%s:%d", env.master_addr, env.master_port);
        } else {
            _dm_copy_name(url, sizeof(url), u);
        }
        if (strncmp(url, "tcp://", 6) == 0) {
            const char* h = url + 6;
            const char* colon = strrchr(h, ':');
            size_t n = colon ? (size_t)(colon - h) : strlen(h);
            if (*h == '[' && n >= 2) { h++; n -= 2; }
            if (n < sizeof(host)) { memcpy(host, h, n); host[n] = 0; }
            s.route_host = host;
        }
        sd.url = url;
        sd.is_server = strncmp(url, "tcp://", 6) == 0 && d.rank == 0 && !(agent && strcmp(agent, "True") == 0);
        sd.timeout_ms = s.timeout_ms;
        sd.logger = d.logger;
        sd.allocator = d.allocator;
        st = dm_store_create(&sd, &s.store);
        if (st != DM_OK)
            return _DM_REPORT(&d.logger, err, sizeof(err), st, "tcp: cannot open the store %s", url);
        s.own_store = true;
    }
    return _dm_tcp_build(&s, out);
}

/* >>tcp split  (color, key) from every rank, then the members rendezvous again through the
   same store under "<prefix>split<seq>/<color>/", ordered by (key, old rank). */
static dm_status _dm_tcp_split(dm_collective* c, int color, int key, dm_collective** out) {
    _dm_tcp* t = (_dm_tcp*)c;
    int32_t mine[2];
    int32_t* all;
    int W = c->size, j, new_rank = 0, new_size = 0;
    char prefix[512];
    dm_status st;
    void* small[16];
    void** ptrs = small;
    _DM_ZERO(_dm_tcp_setup, s);
    *out = NULL;
    _DM_TRY(_dm_tcp_check_broken(t, "split"));
    if (!t->store) return _DM_FAIL(c, DM_ERR_UNSUPPORTED, "tcp: split needs the store, which is gone");
    all = (int32_t*)_dm_malloc(&c->allocator, sizeof(int32_t) * 2 * (size_t)W);
    if (W > 16) ptrs = (void**)_dm_malloc(&c->allocator, sizeof(void*) * (size_t)W);
    if (!all || !ptrs) {
        _dm_free(&c->allocator, all);
        if (ptrs != small) _dm_free(&c->allocator, ptrs);
        return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "tcp: split: out of memory");
    }
    mine[0] = color; mine[1] = key;
    for (j = 0; j < W; j++) ptrs[j] = all + 2 * j;
    st = _dm_tcp_allgather_ring(t, _DM_TCP_K_ALL_GATHER, mine, (void* const*)ptrs, 2, DM_INT32);
    if (ptrs != small) _dm_free(&c->allocator, ptrs);
    if (st != DM_OK || color < 0) { _dm_free(&c->allocator, all); return st; }
    for (j = 0; j < W; j++) {
        if (all[2 * j] != color) continue;
        new_size++;
        if (all[2 * j + 1] < key || (all[2 * j + 1] == key && j < c->rank)) new_rank++;
    }
    _dm_free(&c->allocator, all);
    if (strlen(t->prefix) + 40 > sizeof(t->user_prefix))
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "tcp: split: groups nested too deeply (store prefix \"%s\")", t->prefix);
    snprintf(prefix, sizeof(prefix), "%.470ssplit%llu/%d/", t->prefix, (unsigned long long)c->seq, color);
    s.rank = new_rank;
    s.size = new_size;
    s.timeout_ms = c->timeout_ms;
    s.store = t->store;
    s.own_store = false;
    s.prefix = prefix;
    s.ifname = t->ifname;
    s.token = t->token;
    s.route_host = NULL;
    s.bind_sa = &t->self_sa;    /* the parent's interface and address family */
    s.chunk_bytes = t->chunk_bytes;
    s.logger = c->logger;
    s.allocator = c->allocator;
    st = _dm_tcp_build(&s, out);
    if (st != DM_OK) return _DM_FAIL(c, st, "tcp: split (color %d) failed to connect its %d members", color, new_size);
    (*out)->timeout_ms = c->timeout_ms;
    return DM_OK;
}

/* >>tcp init */
DM_API_IMPL dm_status dm_init(const dm_init_desc* desc, dm_collective** out) {
    _DM_ZERO(dm_init_desc, d);
    _DM_ZERO(dm_fake_desc, f);
    _DM_ZERO(dm_tcp_desc, td);
    dm_env env;
    dm_status st;
    if (!out) return DM_ERR_INVALID_ARG;
    *out = NULL;
    if (desc) d = *desc;
    st = dm_env_detect(&env);
    if (st != DM_OK) return _dm_tcp_report(&d.logger, st, env.error);
    if (env.world_size > 1) {
        td.rank = env.rank;
        td.world_size = env.world_size;
        td.timeout_ms = d.timeout_ms;
        td.logger = d.logger;
        td.allocator = d.allocator;
        return dm_tcp_create(&td, out);
    }
    f.timeout_ms = d.timeout_ms;
    f.logger = d.logger;
    f.allocator = d.allocator;
    return dm_fake_create(&f, out);
}
