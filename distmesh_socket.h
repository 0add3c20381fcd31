/* distmesh_socket.h -- distmesh's socket transport. MIT license at end of file.

   Do not include this file yourself: it is part of the TCP backend's implementation, which
   includes it (DISTMESH_TCP, at distmesh_tcp.h >>tcp socket include).

   WHAT IT HOLDS
   - the socket link (_dm_socklink, its link table _dm_sock_vt): one peer's stream over one
     nonblocking TCP socket, or striped over several (DISTMESH_SOCKETS_PER_PEER: stripe i of the
     stream on socket i % n, from an offset both ends agree on);
   - the encrypted link (_dm_aeadlink, _dm_aead_vt): AES-256-GCM records over a socket link
     (the core's, distmesh_engine.h >>sealed records), keyed per direction by HKDF-SHA256
     (>>socket aead); the link needs libcrypto and is there only with DISTMESH_OPENSSL
     (distmesh.h includes <openssl/evp.h> then), the key derivation always;
   - what the backend does to a connected socket: same machine?, its options (TCP_NODELAY, the
     buffers, the congestion control within one machine), a wait on one socket.

   WHAT IT USES  The core only (distmesh_engine.h >>links: _dm_link, _dm_iov; >>sealed records;
   >>memory; >>time), and the system headers of distmesh_tcp.h >>tcp implementation, included
   before it. The connections themselves are the backend's: it opens, proves (the hello) and
   closes them, and opens a striped link's extra sockets (distmesh_tcp.h >>tcp more sockets),
   then hands them to a link here.

   SECTIONS  Each opens with a comment that starts ">>tag" (search for it); in file order:
       >>socket link             the socket link (distmesh_engine.h >>links), striped over n sockets
       >>socket aead             encrypted links between hosts: sealed records over a socket link
       >>socket options          same machine?, socket options, waits on one socket

   PRIVATE NAMES  _dm_sock_ (the socket link), _dm_aead_ (the encrypted link, its keys),
   _dm_tcp_same_machine, _dm_tcp_tune, _dm_tcp_wait_fd (the options and the wait: the backend's
   names, kept). */
#ifndef DISTMESH_H
#error "distmesh_socket.h is part of distmesh.h's implementation: include distmesh.h with DISTMESH_TCP"
#endif

#if defined(DISTMESH_TCP_IMPL_INCLUDED) && !defined(DISTMESH_SOCKET_IMPL_INCLUDED)
#define DISTMESH_SOCKET_IMPL_INCLUDED
/* >>socket link  Each peer's socket is a link (distmesh.h, >>links): the schedules and the engine
   are the core's. Sockets stay nonblocking; every call moves what the kernel takes now.
   System calls are what small messages cost, so a send gathers every ready step (sendmsg of
   fingerprint and payload together), and a small receive reads ahead: whatever else has
   arrived lands in the link's buffer with it (one recvmsg for a fingerprint and its payload)
   and later receives take it from there. The engine asks the kernel (poll) only after a
   receive found the buffer empty, so nothing waits there unseen. */
#define _DM_SOCK_READAHEAD ((size_t)16 << 10)  /* receives below this read ahead into the buffer */
#define _DM_TCP_SOCKBUF     (4 << 20)           /* SO_SNDBUF / SO_RCVBUF when the kernel allows */
#define _DM_TCP_MAX_SOCKETS 16                  /* sockets per peer at most */
/* Several sockets per peer (DISTMESH_SOCKETS_PER_PEER): from the offset where both ends took
   the extra sockets on (base, the same at both ends), the stream is cut into stripes of
   _DM_SOCK_STRIPE bytes that go to the sockets in turn, stripe i on socket i % nsock, so both
   ends know where any byte travels from its offset alone and the order is kept; a large
   message keeps every socket's flow busy at once, a small one costs one socket. Stripe 0 is
   on the first socket, so bytes read ahead there before the switch are already in place. */
#define _DM_SOCK_STRIPE ((uint64_t)64 << 10)
typedef struct _dm_socklink {
    _dm_link base;              /* base.fd: fds[0] */
    int nsock;
    int fds[_DM_TCP_MAX_SOCKETS]; /* borrowed from _dm_tcp.fds */
    uint64_t sent, taken;       /* stream bytes sent, and handed to the engine */
    uint64_t sbase, tbase;      /* where the stripes start in each direction */
    size_t rpos, rend;          /* buffered bytes not yet taken: rbuf[rpos, rend) */
    unsigned char rbuf[_DM_SOCK_READAHEAD];
} _dm_socklink;
/* The socket that carries stream offset pos (stripes from base), and how many bytes from pos
   stay on it. */
static int _dm_sock_at(const _dm_socklink* s, uint64_t pos, uint64_t base, size_t* room) {
    uint64_t at = pos - base;
    if (s->nsock == 1) { *room = SIZE_MAX; return s->fds[0]; }
    *room = (size_t)(_DM_SOCK_STRIPE - at % _DM_SOCK_STRIPE);
    return s->fds[(at / _DM_SOCK_STRIPE) % (uint64_t)s->nsock];
}
static ptrdiff_t _dm_sock_result(ssize_t k, int* err) {
    if (k >= 0) return (ptrdiff_t)k;
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
    *err = errno;
    return -1;
}
static ptrdiff_t _dm_sock_sendv(_dm_link* l, const _dm_iov* iov, int n, int* err) {
    _dm_socklink* s = (_dm_socklink*)l;
    struct iovec v[_DM_LINK_IOV_MAX];
    struct msghdr mh;
    size_t room;
    int fd = _dm_sock_at(s, s->sent, s->sbase, &room), i, m = 0;
    ptrdiff_t k;
    for (i = 0; i < n && room > 0; i++) {      /* no further than the stripe's end */
        size_t len = iov[i].len < room ? iov[i].len : room;
        if (len == 0) continue;
        v[m].iov_base = (void*)(uintptr_t)iov[i].buf; v[m].iov_len = len; m++;
        room -= len;
    }
    memset(&mh, 0, sizeof(mh));
    mh.msg_iov = v;
    mh.msg_iovlen = (size_t)m;
    k = _dm_sock_result(sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL), err);
    if (k > 0) s->sent += (uint64_t)k;
    return k;
}
static ptrdiff_t _dm_sock_send(_dm_link* l, const void* buf, size_t n, int* err) {
    _dm_iov one;
    one.buf = buf;
    one.len = n;
    return _dm_sock_sendv(l, &one, 1, err);
}
static ptrdiff_t _dm_sock_recv(_dm_link* l, void* buf, size_t n, int* err) {
    _dm_socklink* s = (_dm_socklink*)l;
    struct iovec v[2];
    struct msghdr mh;
    size_t room, ahead;
    int fd;
    ssize_t k;
    if (s->rpos < s->rend) {            /* read ahead earlier (never past the stripe it came from) */
        size_t m = s->rend - s->rpos < n ? s->rend - s->rpos : n;
        memcpy(buf, s->rbuf + s->rpos, m);
        s->rpos += m;
        s->taken += m;
        return (ptrdiff_t)m;
    }
    fd = _dm_sock_at(s, s->taken, s->tbase, &room);
    if (n > room) n = room;
    ahead = room - n < sizeof(s->rbuf) ? room - n : sizeof(s->rbuf);
    if (n >= _DM_SOCK_READAHEAD || ahead == 0) k = recv(fd, buf, n, MSG_DONTWAIT);
    else {
        v[0].iov_base = buf; v[0].iov_len = n;
        v[1].iov_base = s->rbuf; v[1].iov_len = ahead;
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = v;
        mh.msg_iovlen = 2;
        k = recvmsg(fd, &mh, MSG_DONTWAIT);
        if (k > (ssize_t)n) { s->rpos = 0; s->rend = (size_t)k - n; k = (ssize_t)n; }
    }
    if (k == 0) { *err = 0; return -1; }        /* end of stream: the peer is gone */
    if (k > 0) s->taken += (uint64_t)k;
    return _dm_sock_result(k, err);
}
/* Bytes read ahead and not yet taken. */
static size_t _dm_sock_buffered(const _dm_link* l) {
    const _dm_socklink* s = (const _dm_socklink*)l;
    return s->rend - s->rpos;
}
/* The engine polls for a receive only once the buffer is empty: the next byte is at taken. */
static int _dm_sock_pollfd(_dm_link* l, bool out) {
    _dm_socklink* s = (_dm_socklink*)l;
    size_t room;
    return out ? _dm_sock_at(s, s->sent, s->sbase, &room) : _dm_sock_at(s, s->taken + _dm_sock_buffered(l), s->tbase, &room);
}
static void _dm_sock_shutdown(_dm_link* l) {
    _dm_socklink* s = (_dm_socklink*)l;
    int i;
    for (i = 0; i < s->nsock; i++) shutdown(s->fds[i], SHUT_RDWR);
}
static void _dm_sock_destroy(_dm_link* l, const dm_allocator* a) { _dm_free(a, l); }   /* fds[] owns the fds */
static const _dm_link_vt _dm_sock_vt = {
    "tcp", _dm_sock_send, _dm_sock_recv, NULL, NULL, NULL, _dm_sock_shutdown, _dm_sock_destroy, 0, _dm_sock_sendv,
    _dm_sock_pollfd
};

/* >>socket aead  Authenticated encryption of a link between hosts (DISTMESH_ENCRYPT; SECURITY.md
   "Encrypted links"): a link that wraps a socket link (above its striping: one stream) and
   carries its plaintext stream as sealed records (distmesh_engine.h >>sealed records: the format, the
   counter nonces, the cipher of each direction). Each direction of each connection has its own
   key (_dm_aead_key: HKDF-SHA256 of the token over both sides' hello nonces). A receive reads a
   whole record into the link's buffer and opens it before any of its bytes leave: nothing
   that fails the tag reaches a caller. It reads exactly the record it needs until the link is
   known to stay encrypted (_dm_aead_read_ahead), then up to a batch of records per socket
   call. A bad tag or a bad length is -1 with EBADMSG (the engine: DM_ERR_PROTOCOL naming the
   peer), and stays so. An end of stream inside a record is the end of stream it is (-1, err
   0: the peer gone), the part of the record dropped: a rank killed while it sent a record is
   a lost peer (dm_shrink), and a man in the middle who cuts the stream could as well have cut
   the connection. A send seals up to a batch of records (_DM_AEAD_BATCH) from the caller's
   bytes and reports them moved only once all of them are in the kernel (until then 0, would
   block: the engine presents the same bytes again and polls the socket), so nothing sealed
   waits in here unseen. The engine polls only after a receive returned 0, which this link
   returns only when the socket link under it did (its read-ahead empty too). The key
   derivation needs no libcrypto; the link does (DISTMESH_OPENSSL). */
/* the keys: once per link, at its setup */
_DM_COLD_BEGIN
/* The key of the direction from rank `from` to rank `to` on a connection whose hello exchanged
   nonces (connector's 32, acceptor's 32: salt), in the group with store prefix `group`. */
_DM_PRIVATE void _dm_aead_key(const char* token, const unsigned char nonces[64], const char* group, int from, int to,
                              unsigned char out[32]) {
    char info[700];
    int n = snprintf(info, sizeof(info), "distmesh link aead v1: rank %d to rank %d, socket 0, group %s", from, to,
                     group);
    if (n < 0) n = 0;
    if ((size_t)n >= sizeof(info)) n = (int)sizeof(info) - 1;
    _dm_hkdf_sha256(nonces, 64, token, strlen(token), info, (size_t)n, out);
}
_DM_COLD_END
#if defined(DISTMESH_OPENSSL)
/* Records per batch on a busy link: a send seals up to this many records (of the bytes the
   engine presents) and hands them to the kernel in one call, and a receive on a link that
   reads ahead (_dm_aead_read_ahead) takes up to this many from the kernel in one call. A
   socket call per 64 KiB record (three per record received) cost CPU beside the cipher's
   (2 ranks on 2 simulated hosts over loopback, 64 MiB, quiet 2-core VM: 63 ms, 51 ms in
   batches; CPU per rank 69 and 57 ms; docs/performance.md "Encrypted links between hosts").
   The records, their sizes and their order are the same either way. The batch buffers (_DM_AEAD_BIG each way) are
   allocated on a link's first send of more than a record, and first full-size record in. */
#define _DM_AEAD_BATCH 8
#define _DM_AEAD_BIG ((size_t)_DM_AEAD_BATCH * _DM_AEAD_MAX)
typedef struct _dm_aeadlink {
    _dm_link base;              /* base.fd, base.where: the socket link's */
    _dm_link* inner;            /* the socket link (owned) */
    _dm_rec seal, open;         /* each direction's cipher and record counter */
    dm_allocator al;            /* the group's (a copy): the batch buffers */
    unsigned char *obuf, *ibuf; /* one record each (the ones below), or _DM_AEAD_BIG bytes */
    size_t ocap, icap;
    size_t opos, oend;          /* the sealed records going out: obuf[opos, oend) */
    size_t oplain;              /* their plaintext bytes, reported once they are all out */
    size_t owed;                /* plaintext bytes out and not reported yet */
    size_t istart, ifill;       /* records in: ibuf[istart, ifill), the first one opened when plen */
    size_t ppos, plen;          /* opened plaintext not yet taken: ibuf + istart + HEAD [ppos, plen) */
    bool ahead;                 /* a receive may read past the record it needs (_dm_aead_read_ahead) */
    bool bad;                   /* a record failed: every later receive fails too */
    unsigned char obuf1[_DM_AEAD_MAX];
    unsigned char ibuf1[_DM_AEAD_MAX];
} _dm_aeadlink;
/* Swaps a one-record buffer for a batch's (its first `keep` bytes kept); on failure keeps the
   one record (slower, still correct). */
static void _dm_aead_grow(_dm_aeadlink* a, unsigned char** buf, size_t* cap, size_t keep) {
    unsigned char* big;
    if (*cap >= _DM_AEAD_BIG || !(big = (unsigned char*)_dm_malloc(&a->al, _DM_AEAD_BIG))) return;
    memcpy(big, *buf, keep);
    memset(*buf, 0, *cap);
    *buf = big;
    *cap = _DM_AEAD_BIG;
}
static void _dm_aead_drop(_dm_aeadlink* a, unsigned char* buf, size_t cap, const unsigned char* one) {
    memset(buf, 0, cap);
    if (buf != one) _dm_free(&a->al, buf);
}
/* Seals the pieces' bytes as records into obuf, as many as fit (at least one: n > 0):
   1, or 0 on failure. */
static int _dm_aead_seal(_dm_aeadlink* a, const _dm_iov* iov, int niov, size_t total) {
    size_t skip = 0, at = 0;
    int i = 0;
    a->opos = a->oend = a->oplain = 0;
    while (skip < total && a->oend + _DM_AEAD_MAX <= a->ocap) {
        _dm_iov cur[_DM_LINK_IOV_MAX];
        size_t n = total - skip < _DM_AEAD_RECORD ? total - skip : _DM_AEAD_RECORD;
        int m = 0, j;
        while (i < niov && at == iov[i].len) { i++; at = 0; }   /* the piece the record starts in */
        for (j = i; j < niov; j++, m++) {
            cur[m].buf = (const unsigned char*)iov[j].buf + (j == i ? at : 0);
            cur[m].len = iov[j].len - (j == i ? at : 0);
        }
        if (!_dm_rec_seal(&a->seal, cur, m, n, a->obuf + a->oend)) return 0;
        a->oend += _DM_AEAD_HEAD + n + _DM_AEAD_TAG;
        a->oplain += n;
        skip += n;
        while (n > 0) {                         /* past the record's bytes */
            size_t d = iov[i].len - at < n ? iov[i].len - at : n;
            at += d; n -= d;
            if (at == iov[i].len && n > 0) { i++; at = 0; }
        }
    }
    return 1;
}
static ptrdiff_t _dm_aead_sendv(_dm_link* l, const _dm_iov* iov, int niov, int* err) {
    _dm_aeadlink* a = (_dm_aeadlink*)l;
    size_t total = 0, take;
    int i;
    for (i = 0; i < niov; i++) total += iov[i].len;
    if (a->owed == 0 && a->oend == 0) {         /* nothing in flight: seal the next records */
        if (total == 0) return 0;
        if (total > _DM_AEAD_RECORD) _dm_aead_grow(a, &a->obuf, &a->ocap, 0);
        if (!_dm_aead_seal(a, iov, niov, total)) { *err = EIO; return -1; }
    }
    while (a->opos < a->oend) {
        ptrdiff_t k = a->inner->vt->send(a->inner, a->obuf + a->opos, a->oend - a->opos, err);
        if (k <= 0) return k;                   /* would block: the same bytes come again */
        a->opos += (size_t)k;
    }
    if (a->oend) { a->owed += a->oplain; a->opos = a->oend = a->oplain = 0; }
    take = a->owed < total ? a->owed : total;
    a->owed -= take;
    return (ptrdiff_t)take;
}
static ptrdiff_t _dm_aead_send(_dm_link* l, const void* buf, size_t n, int* err) {
    _dm_iov one;
    one.buf = buf;
    one.len = n;
    return _dm_aead_sendv(l, &one, 1, err);
}
/* How many bytes to ask the socket for, once ibuf has no whole record at istart (avail bytes of
   one, len its announced length when avail >= HEAD): up to the record's end, or with `ahead`
   as much as ibuf holds. Room is made first: the part moves to the front when less than a
   whole record fits after it (with a batch's buffer, once every few records). */
static size_t _dm_aead_room(_dm_aeadlink* a, size_t avail, size_t len) {
    if (a->icap - a->istart < _DM_AEAD_MAX) {
        memmove(a->ibuf, a->ibuf + a->istart, avail);
        a->istart = 0; a->ifill = avail;
    }
    if (a->ahead) return a->icap - a->ifill;
    return (avail < _DM_AEAD_HEAD ? _DM_AEAD_HEAD : _DM_AEAD_HEAD + len + _DM_AEAD_TAG) - avail;
}
static ptrdiff_t _dm_aead_recv(_dm_link* l, void* buf, size_t n, int* err) {
    _dm_aeadlink* a = (_dm_aeadlink*)l;
    for (;;) {
        size_t len = 0, avail = a->ifill - a->istart;
        unsigned char* rec = a->ibuf + a->istart;
        ptrdiff_t k;
        if (a->bad) { *err = EBADMSG; return -1; }
        if (a->ppos < a->plen) {                /* opened: hand it out */
            size_t m = a->plen - a->ppos < n ? a->plen - a->ppos : n;
            memcpy(buf, rec + _DM_AEAD_HEAD + a->ppos, m);
            a->ppos += m;
            if (a->ppos == a->plen) {           /* past the record */
                a->istart += _DM_AEAD_HEAD + a->plen + _DM_AEAD_TAG;
                a->ppos = a->plen = 0;
                if (a->istart == a->ifill) a->istart = a->ifill = 0;
            }
            return (ptrdiff_t)m;
        }
        if (n == 0) return 0;
        if (avail >= _DM_AEAD_HEAD) {
            if ((len = _dm_rec_len(rec)) == 0) { a->bad = true; continue; }
            if (avail >= _DM_AEAD_HEAD + len + _DM_AEAD_TAG) {  /* whole: open it in place */
                if (a->ahead && len == _DM_AEAD_RECORD && a->icap < _DM_AEAD_BIG) {     /* busy: batches */
                    _dm_aead_grow(a, &a->ibuf, &a->icap, a->ifill);
                    rec = a->ibuf + a->istart;
                }
                if (!_dm_rec_open(&a->open, rec, len)) { a->bad = true; continue; }
                a->ppos = 0;
                a->plen = len;
                continue;
            }
        }
        k = _dm_aead_room(a, avail, len);
        k = a->inner->vt->recv(a->inner, a->ibuf + a->ifill, (size_t)k, err);
        if (k < 0) {            /* an end inside a record too: the record is dropped, the peer gone */
            a->istart = a->ifill = 0;
            return -1;
        }
        if (k == 0) return 0;
        a->ifill += (size_t)k;
    }
}
static int _dm_aead_pollfd(_dm_link* l, bool out) {
    _dm_link* in = ((_dm_aeadlink*)l)->inner;
    return in->vt->pollfd ? in->vt->pollfd(in, out) : in->fd;
}
static void _dm_aead_shutdown(_dm_link* l) {
    _dm_link* in = ((_dm_aeadlink*)l)->inner;
    if (in->vt->shutdown) in->vt->shutdown(in);
}
static void _dm_aead_destroy(_dm_link* l, const dm_allocator* al) {
    _dm_aeadlink* a = (_dm_aeadlink*)l;
    a->inner->vt->destroy(a->inner, al);
    _dm_rec_free(&a->seal);
    _dm_rec_free(&a->open);
    _dm_aead_drop(a, a->obuf, a->ocap, a->obuf1);
    _dm_aead_drop(a, a->ibuf, a->icap, a->ibuf1);
    _dm_free(al, a);
}
static const _dm_link_vt _dm_aead_vt = {
    "tcp", _dm_aead_send, _dm_aead_recv, NULL, NULL, NULL, _dm_aead_shutdown, _dm_aead_destroy, 0, _dm_aead_sendv,
    _dm_aead_pollfd
};
/* inner wrapped with these keys (send: this rank's direction), or NULL (out of memory, or
   libcrypto failed); inner is the caller's again then. */
static _dm_link* _dm_aead_wrap(_dm_link* inner, const unsigned char send_key[32], const unsigned char recv_key[32],
                               const dm_allocator* al) {
    _dm_aeadlink* a = (_dm_aeadlink*)_dm_calloc(al, sizeof(_dm_aeadlink));
    if (!a) return NULL;
    if (!_dm_rec_init(&a->seal, true, send_key)) { _dm_free(al, a); return NULL; }
    if (!_dm_rec_init(&a->open, false, recv_key)) {
        _dm_rec_free(&a->seal);
        _dm_free(al, a);
        return NULL;
    }
    if (al) a->al = *al;
    a->obuf = a->obuf1; a->ocap = sizeof(a->obuf1);
    a->ibuf = a->ibuf1; a->icap = sizeof(a->ibuf1);
    a->base.vt = &_dm_aead_vt;
    a->base.fd = inner->fd;
    memcpy(a->base.where, inner->where, sizeof(a->base.where));
    a->inner = inner;
    return &a->base;
}
/* The socket link under a wrapper that is one (the engine never sees the difference). */
static _dm_aeadlink* _dm_aead_of(_dm_link* l) { return l && l->vt == &_dm_aead_vt ? (_dm_aeadlink*)l : NULL; }
/* The socket link again, once both ends stand at the same stream offset with nothing of a
   record buffered or in flight here (the ends of a build, >>tcp seal); NULL otherwise. The
   wrapper is freed. */
static _dm_link* _dm_aead_unwrap(_dm_link* l, const dm_allocator* al) {
    _dm_aeadlink* a = (_dm_aeadlink*)l;
    _dm_link* in = a->inner;
    if (a->ifill > a->istart || a->oend || a->owed) return NULL;
    memcpy(in->where, l->where, sizeof(in->where));
    a->inner = NULL;
    _dm_rec_free(&a->seal);
    _dm_rec_free(&a->open);
    _dm_aead_drop(a, a->obuf, a->ocap, a->obuf1);
    _dm_aead_drop(a, a->ibuf, a->icap, a->ibuf1);
    _dm_free(al, a);
    return in;
}
/* From now on the link stays encrypted to its end (its peer is on another host, the group
   built: >>tcp seal), so a receive may read past the record it needs, up to a batch of
   records in one call: nothing after them on the stream is ever plain. Until then a receive
   reads exactly one record, so that the link can go back to a plain socket (_dm_aead_unwrap)
   with no byte of what follows taken. */
static void _dm_aead_read_ahead(_dm_link* l) {
    if (_dm_aead_of(l)) ((_dm_aeadlink*)l)->ahead = true;
}
#endif /* DISTMESH_OPENSSL */
/* The socket link of a link made by the backend (wrapped or not); NULL for other links. */
static _dm_socklink* _dm_sock_of(_dm_link* l) {
#if defined(DISTMESH_OPENSSL)
    if (_dm_aead_of(l)) l = _dm_aead_of(l)->inner;
#endif
    return l && l->vt == &_dm_sock_vt ? (_dm_socklink*)l : NULL;
}
/* Bytes received and not yet taken (none may be left when a link is swapped for shm): the
   socket link's read-ahead, and an encrypted link's record in part or opened. */
static size_t _dm_sock_pending(const _dm_link* l) {
#if defined(DISTMESH_OPENSSL)
    if (l->vt == &_dm_aead_vt) {
        const _dm_aeadlink* a = (const _dm_aeadlink*)l;
        return a->ifill - a->istart + _dm_sock_buffered(a->inner);
    }
#endif
    return _dm_sock_buffered(l);
}

/* the options and the wait: create, split, hellos */
_DM_COLD_BEGIN
/* >>socket options  Same machine?, socket options, waits on one socket. */
/* Whether both ends of a connected socket are this machine: a loopback address, or the same
   address at both ends (the kernel routes it over loopback). */
static bool _dm_tcp_same_machine(int fd) {
    struct sockaddr_storage a, b;
    socklen_t la = sizeof(a), lb = sizeof(b);
    if (getsockname(fd, (struct sockaddr*)&a, &la) != 0 || getpeername(fd, (struct sockaddr*)&b, &lb) != 0 ||
        a.ss_family != b.ss_family)
        return false;
    if (a.ss_family == AF_INET) {
        uint32_t x = ntohl(((struct sockaddr_in*)&a)->sin_addr.s_addr), y = ntohl(((struct sockaddr_in*)&b)->sin_addr.s_addr);
        return x == y || (x >> 24 == 127 && y >> 24 == 127);
    }
    if (a.ss_family == AF_INET6) {
        const struct in6_addr *x = &((struct sockaddr_in6*)&a)->sin6_addr, *y = &((struct sockaddr_in6*)&b)->sin6_addr;
        return memcmp(x, y, sizeof(*x)) == 0 || (IN6_IS_ADDR_LOOPBACK(x) && IN6_IS_ADDR_LOOPBACK(y));
    }
    return false;
}
/* The far end of a connected socket as "address:port" into buf (for messages: a link made
   before the group's addresses are exchanged); "" when it cannot be read. */
static void _dm_tcp_peer_name(int fd, char* buf, size_t cap) {
    struct sockaddr_storage a;
    socklen_t la = sizeof(a);
    char host[INET6_ADDRSTRLEN];
    buf[0] = 0;
    if (fd < 0 || getpeername(fd, (struct sockaddr*)&a, &la) != 0) return;
    if (a.ss_family == AF_INET && inet_ntop(AF_INET, &((struct sockaddr_in*)&a)->sin_addr, host, sizeof(host)))
        snprintf(buf, cap, "%s:%u", host, (unsigned)ntohs(((struct sockaddr_in*)&a)->sin_port));
    else if (a.ss_family == AF_INET6 && inet_ntop(AF_INET6, &((struct sockaddr_in6*)&a)->sin6_addr, host, sizeof(host)))
        snprintf(buf, cap, "[%s]:%u", host, (unsigned)ntohs(((struct sockaddr_in6*)&a)->sin6_port));
}
/* TCP_NODELAY; the socket buffers; and on a connection within this machine, Reno congestion
   control. A kernel whose default is BBR paces every flow, and over loopback, where nothing is
   lost, pacing only caps the rate: measured on a 2-core VM with BBR as default, 2 ranks with
   sockets, a 4 MiB all-reduce took 1.15 ms with BBR and 0.50 ms with Reno or CUBIC. Reno is
   the one every kernel allows an unprivileged process to choose. Between hosts the system's
   choice stays. */
static void _dm_tcp_tune(int fd) {
    static int sockbuf = -1;    /* set buffers only where the kernel allows the full size, so
                                   loopback keeps its autotuning otherwise */
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
#if defined(TCP_CONGESTION)
    if (_dm_tcp_same_machine(fd)) setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, "reno", 4);
#endif
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
_DM_COLD_END

#endif /* DISTMESH_TCP_IMPL_INCLUDED && !DISTMESH_SOCKET_IMPL_INCLUDED */

/*
------------------------------------------------------------------------------------------------
MIT License

Copyright (c) 2026 the distmesh authors

Permission is hereby granted, free of charge, to any person obtaining a copy of this software and
associated documentation files (the "Software"), to deal in the Software without restriction,
including without limitation the rights to use, copy, modify, merge, publish, distribute,
sublicense, and/or sell copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all copies or
substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT
NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM,
DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT
OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
------------------------------------------------------------------------------------------------
*/
