/* distmesh_engine.h -- distmesh's link engine. MIT license at end of file.

   Do not include this file yourself: it is part of distmesh.h's implementation, which includes
   it after the core (distmesh.h >>layers).

   WHAT IT HOLDS  The link engine: the link every transport fills (its ops table, the bell that
   wakes a sleeping rank, the abort word of a host's ranks), the memory link (rings in the heap
   between threads or in a shared segment between processes), the fingerprint that opens every
   collective, the sealed records of links that leave the host, the algorithm names, and the
   engine a group's schedules run on: its state, the failure rule, the point-to-point inbox, the
   pump that moves one transfer, the loop that drives transfers to their end under the deadline,
   the eager path over memory links, and the exchange (one step with one or two peers).

   WHAT IT MAY CALL  distmesh.h (failures, logs, config, the fingerprint's kinds), the kernels
   (reductions while receiving, SHA-256 for keys), the trace's hooks (waits, fingerprints seen)
   and the core (the object limit that bounds unexpected point-to-point bytes). The
   schedules and the backends call it; it never names them: a transport comes in through
   _dm_link_vt, a backend's connect through the engine's callbacks.

   SECTIONS  Each opens with a comment that starts ">>tag" (search for it); in file order:
       >>links                   the link ops table every transport fills, the bell, the abort word
       >>memory rings            the link between two ranks that share memory (heap or segment)
       >>fingerprint             the 32 bytes that open every collective, the mismatch message
       >>sealed records          AES-256-GCM records and HKDF keys: the encrypted links' and the store's
       >>algorithms              the all_reduce algorithms, DISTMESH_ALGO's names
       >>engine                  a group's state (_dm_eng), layout, init, release, transfers
       >>engine failure          the failure rule: break, abort word, notices, adopt
       >>engine inbox            point-to-point messages between collectives
       >>engine pump             moving one transfer's send and recv steps
       >>engine loop             driving transfers: spin, yield, block, deadline, connect
       >>eager                   small exchanges over memory links (an exception to the layers)
       >>exchange                one step with one or two peers: sendrecv, sendrecv_reduce */
#ifndef DISTMESH_H
#error "distmesh_engine.h is part of distmesh.h's implementation: include distmesh.h"
#endif

#if defined(DISTMESH_IMPL_INCLUDED) && !defined(DISTMESH_ENGINE_IMPL_INCLUDED)
#define DISTMESH_ENGINE_IMPL_INCLUDED
_DM_WARM_BEGIN
/* >>links  A link is one rank's channel to one peer: an ordered byte stream each way. Every
   schedule below (recursive doubling, rings, chain broadcast, dissemination barrier) is written
   once over links and driven by one engine, so whatever carries the bytes (sockets, rings in
   shared memory between processes, rings in the heap between threads) the steps and the order
   in which values are reduced are the same, and so are the results, bit for bit.
   Here: the ops table every transport fills (_dm_link_vt), the bell that wakes a rank asleep
   on memory links, and the abort word the ranks of one host share. */
typedef struct _dm_link _dm_link;
/* One piece of a gathered send (_dm_link_vt.sendv). */
typedef struct _dm_iov { const void* buf; size_t len; } _dm_iov;
#define _DM_LINK_IOV_MAX 8          /* pieces per gathered send */
typedef struct _dm_link_vt {
    const char* name;           /* the transport: "tcp", "shm", "thread" */
    /* Nonblocking: move up to n bytes and return how many (0: would block), or -1 with *err set
       (0: the peer is gone, end of stream; else an errno value). */
    ptrdiff_t (*send)(_dm_link* l, const void* buf, size_t n, int* err);
    ptrdiff_t (*recv)(_dm_link* l, void* buf, size_t n, int* err);
    /* Optional: the readable bytes in place (contiguous), and their release after use; lets a
       reduction read straight from the link instead of through scratch. */
    const unsigned char* (*peek)(_dm_link* l, size_t* n);
    void (*consume)(_dm_link* l, size_t n);
    /* Optional, asked only while blocked: 0 if the peer is still there, else -1 with *err. */
    int (*alive)(_dm_link* l, int* err);
    void (*shutdown)(_dm_link* l);  /* optional: the collective broke; make the peer fail fast */
    void (*destroy)(_dm_link* l, const dm_allocator* a);
    /* 0, or 8: every step is padded to a multiple of 8 bytes on this link, so data read in
       place (peek) is aligned for every dtype. */
    size_t align;
    /* Optional: send as much of the pieces, in order, as can move now (same result as send).
       The engine then sends every step that is ready in one call: a fingerprint and its payload
       are one system call on a socket, one publish and one bell on a ring. */
    ptrdiff_t (*sendv)(_dm_link* l, const _dm_iov* iov, int n, int* err);
    /* Optional: the socket to poll for the next send (out) or receive, where a link has several
       (striped sockets); else fd. */
    int (*pollfd)(_dm_link* l, bool out);
} _dm_link_vt;
struct _dm_link {
    const _dm_link_vt* vt;
    int fd;                     /* pollable when blocked (sockets); -1: memory, waits on the bell */
    char where[64];             /* the peer, for messages: "10.0.0.2:4711", "pid 4242" */
};

/* A bell wakes a rank asleep on memory links. A rank about to sleep sets `sleeping`, reads
   seq, tries once more, and sleeps only while seq is unchanged (a futex between processes, a
   condition variable between threads). Every write into one of its rings and every read that
   frees space in one is followed by a look at `sleeping`: only a sleeper's bell is bumped and
   woken. Either the waker sees `sleeping`, or the sleeper's last try sees the bytes, so no
   wake-up is lost, and while nobody sleeps the line holding seq does not bounce between cores.
   That needs a store-load barrier on both sides, between each one's store and its load. It is
   a full fence on both, unless the ops have a heavy `barrier`: then wakers (the hot path, every
   message) only stop the compiler, and the sleeper (after 200 us to 1 ms idle) calls barrier(),
   which runs a full fence on every core running a waker (Linux membarrier, every process of
   the host's group registered), so the asymmetric pair orders like two fences. One cache line. */
typedef struct _dm_bell {
    uint32_t seq, sleeping;
    int32_t cpu;                /* the core its rank last waited on, plus 1 (0: not known) */
    unsigned char pad[52];
} _dm_bell;
typedef struct _dm_bell_ops {
    void (*wait)(void* ctx, _dm_bell* b, uint32_t seen, int ms);
    void (*wake)(void* ctx, _dm_bell* b);
    void* ctx;
    void (*barrier)(void);      /* NULL: full fences on both sides */
} _dm_bell_ops;

_DM_PRIVATE void _dm_bell_ring(_dm_bell* b, const _dm_bell_ops* ops) {
    if (ops->barrier) __atomic_signal_fence(__ATOMIC_SEQ_CST);
    else __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (!__atomic_load_n(&b->sleeping, __ATOMIC_SEQ_CST)) return;
    __atomic_fetch_add(&b->seq, 1u, __ATOMIC_SEQ_CST);
    ops->wake(ops->ctx, b);
}
/* The sleeper's half: after announcing (sleeping, seq), before its last look. */
_DM_PRIVATE void _dm_bell_announced(const _dm_bell_ops* ops) {
    if (ops->barrier) ops->barrier();
    else __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

/* The first failure of a group whose ranks share memory, for all of them: its status, the rank
   that saw it and that rank's message, so every rank reports the cause, not "peer lost".
   status: 0 none yet, 1 while the message is being written, else the dm_status. */
typedef struct _dm_abort { int32_t status, rank; char msg[248]; } _dm_abort;

/* >>memory rings  The link between two ranks that share memory (shared memory between processes,
   the heap between threads): one ring per direction. A ring holds bytes [tail, head) of the stream
   in data[pos & (cap - 1)]. Only the sender moves head, only the receiver moves tail. A small
   publish (at most _DM_RING_INLINE bytes, a multiple of 8) is also copied into head's cache line
   (inl, tagged with its stream position and length), so a reader that finds it at its tail takes
   the bytes with head: one transfer between cores instead of two (head's line, then the data's).
   The copy is a seqlock (Boehm's, as the flight recorder's ring): a reader keeps what it copied
   only when the tag read before and after is the same. Bytes at a stream position never change, so
   a tag, however old, is right about the bytes it names. */
#define _DM_RING_INLINE 48
typedef struct _dm_ring {
    uint64_t head;
    uint64_t inl_tag;           /* position << 6 | length of the bytes in inl; UINT64_MAX while written */
    uint64_t inl[_DM_RING_INLINE / 8];
    uint64_t tail;
    /* dm_shrink: head when the sender stopped the old group's stream, published with the new
       group's epoch (distmesh_tcp.h, >>tcp shrink). Two marks, by the new group's slot: a sender
       may shrink again before a slow reader has read the mark of the shrink before. */
    uint64_t stop[2];
    uint32_t stop_epoch[2];
    unsigned char pad[32];
} _dm_ring;
#define _DM_RING_GRAIN ((size_t)64 << 10)   /* bytes per publish: the reader starts early */

typedef struct _dm_memlink {
    _dm_link base;
    _dm_ring *out, *in;         /* this rank -> peer, peer -> this rank */
    /* Copies of the two positions this side alone moves (out->head, in->tail), so the hot
       path reads no line the peer also reads: a line a peer keeps reading can migrate to its
       core, and reading it back costs a transfer between cores on every message. */
    uint64_t out_head, in_tail;
    /* The peer's positions as last read; each only moves forward, so what is counted from them
       is never too much, and their lines are read again only when that runs out. A reader that
       looked again on every peek would pay a transfer between cores per message whenever the
       peer had moved on to its next send (it writes head then, taking the line back). */
    uint64_t out_tail;          /* out->tail: room, read again only when short */
    uint64_t in_head;           /* in->head: bytes to read, read again only when none are left */
    uint64_t inl_buf[_DM_RING_INLINE / 8];      /* the peer's small publish at inl_from, from in->inl */
    uint64_t inl_from;
    size_t inl_len;             /* 0: none */
    unsigned char *out_data, *in_data;
    size_t cap;                 /* bytes per ring, a power of two */
    _dm_bell* peer_bell;        /* rung after writing (data for it) and reading (space for it) */
    const _dm_bell_ops* bell_ops;
    int side_fd;                /* shm: a socket to the peer whose end says it died; else -1 */
} _dm_memlink;

/* The n bytes just written at stream position pos, again into head's line (see >>memory rings). */
_DM_PRIVATE void _dm_ring_put_inline(_dm_memlink* m, uint64_t pos, size_t n) {
    uint64_t w[_DM_RING_INLINE / 8];
    size_t at = (size_t)pos & (m->cap - 1), first = m->cap - at < n ? m->cap - at : n, i;
    memcpy(w, m->out_data + at, first);
    if (n > first) memcpy((unsigned char*)w + first, m->out_data, n - first);
    __atomic_store_n(&m->out->inl_tag, UINT64_MAX, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    for (i = 0; i < n / 8; i++) __atomic_store_n(&m->out->inl[i], w[i], __ATOMIC_RELAXED);
    __atomic_store_n(&m->out->inl_tag, pos << 6 | n, __ATOMIC_RELEASE);
}
/* The peer's small publish that starts at pos, into m->inl_buf: its length, or 0 when the copy
   in head's line holds another (or was being rewritten while read). */
_DM_PRIVATE size_t _dm_ring_get_inline(_dm_memlink* m, uint64_t pos) {
    uint64_t t1 = __atomic_load_n(&m->in->inl_tag, __ATOMIC_ACQUIRE), t2;
    size_t n = (size_t)(t1 & 63), i;
    if (t1 == UINT64_MAX || t1 >> 6 != pos || n == 0) return 0;
    for (i = 0; i < n / 8; i++) m->inl_buf[i] = __atomic_load_n(&m->in->inl[i], __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    t2 = __atomic_load_n(&m->in->inl_tag, __ATOMIC_RELAXED);
    return t1 == t2 ? n : 0;
}

/* Free bytes in the out ring, counted from the peer's tail as last read, which is read again
   only when that count is under need. */
_DM_PRIVATE size_t _dm_mem_room(_dm_memlink* m, size_t need) {
    size_t room = m->cap - (size_t)(m->out_head - m->out_tail);
    if (room >= need) return room;
    m->out_tail = __atomic_load_n(&m->out->tail, __ATOMIC_ACQUIRE);
    return m->cap - (size_t)(m->out_head - m->out_tail);
}
/* Copies the pieces into the ring as far as space (and one grain) allows; one publish, one bell. */
_DM_PRIVATE ptrdiff_t _dm_mem_sendv(_dm_link* l, const _dm_iov* iov, int niov, int* err) {
    _dm_memlink* m = (_dm_memlink*)l;
    uint64_t head = m->out_head;
    size_t want = 0, room, done = 0;
    int i;
    (void)err;
    for (i = 0; i < niov; i++) want += iov[i].len;
    room = _dm_mem_room(m, want < _DM_RING_GRAIN ? want : _DM_RING_GRAIN);
    if (room > _DM_RING_GRAIN) room = _DM_RING_GRAIN;
    for (i = 0; i < niov && done < room; i++) {
        size_t n = iov[i].len < room - done ? iov[i].len : room - done;
        size_t at = (size_t)(head + done) & (m->cap - 1), first = m->cap - at < n ? m->cap - at : n;
        if (n == 0) continue;
        memcpy(m->out_data + at, iov[i].buf, first);
        if (n > first) memcpy(m->out_data, (const unsigned char*)iov[i].buf + first, n - first);
        done += n;
    }
    if (done == 0) return 0;
    if (done <= _DM_RING_INLINE && done % 8 == 0) _dm_ring_put_inline(m, head, done);
    m->out_head = head + done;
    __atomic_store_n(&m->out->head, m->out_head, __ATOMIC_RELEASE);
    _dm_bell_ring(m->peer_bell, m->bell_ops);
    return (ptrdiff_t)done;
}
_DM_PRIVATE ptrdiff_t _dm_mem_send(_dm_link* l, const void* buf, size_t n, int* err) {
    _dm_iov one;
    one.buf = buf;
    one.len = n;
    return _dm_mem_sendv(l, &one, 1, err);
}
_DM_PRIVATE const unsigned char* _dm_mem_peek(_dm_link* l, size_t* n) {
    _dm_memlink* m = (_dm_memlink*)l;
    uint64_t tail = m->in_tail, head = m->in_head;
    size_t avail, at = (size_t)tail & (m->cap - 1);
    if (tail - m->inl_from < m->inl_len) {          /* inside the small publish taken with head */
        *n = m->inl_len - (size_t)(tail - m->inl_from);
        return (const unsigned char*)m->inl_buf + (tail - m->inl_from);
    }
    if (head == tail) {
        head = m->in_head = __atomic_load_n(&m->in->head, __ATOMIC_ACQUIRE);
        if (head != tail && (m->inl_len = _dm_ring_get_inline(m, tail)) > 0) {
            m->inl_from = tail;
            *n = m->inl_len;
            return (const unsigned char*)m->inl_buf;
        }
    }
    avail = (size_t)(head - tail);
    if (avail > m->cap - at) avail = m->cap - at;
    *n = avail < _DM_RING_GRAIN ? avail : _DM_RING_GRAIN;
    return m->in_data + at;
}
_DM_PRIVATE void _dm_mem_consume(_dm_link* l, size_t n) {
    _dm_memlink* m = (_dm_memlink*)l;
    m->in_tail += n;
    __atomic_store_n(&m->in->tail, m->in_tail, __ATOMIC_RELEASE);
    _dm_bell_ring(m->peer_bell, m->bell_ops);
}
_DM_PRIVATE ptrdiff_t _dm_mem_recv(_dm_link* l, void* buf, size_t n, int* err) {
    size_t got = 0, k;
    (void)err;
    while (got < n) {           /* twice at most: up to the end of the ring, then from its start */
        const unsigned char* p = _dm_mem_peek(l, &k);
        if (k == 0) break;
        if (k > n - got) k = n - got;
        memcpy((unsigned char*)buf + got, p, k);
        _dm_mem_consume(l, k);
        got += k;
    }
    return (ptrdiff_t)got;
}
_DM_PRIVATE void _dm_mem_destroy(_dm_link* l, const dm_allocator* a) { _dm_free(a, l); }

/* Links the pair (me, peer) through rings[me * size + peer] (out) and rings[peer * size + me]
   (in), each followed by its cap bytes of data at stride. */
_DM_PRIVATE _dm_link* _dm_memlink_new(const dm_allocator* a, const _dm_link_vt* vt, unsigned char* rings,
                                      size_t stride, size_t cap, int size, int me, int peer,
                                      _dm_bell* bells, const _dm_bell_ops* ops, int side_fd) {
    _dm_memlink* m = (_dm_memlink*)_dm_calloc(a, sizeof(_dm_memlink));
    if (!m) return NULL;
    m->base.vt = vt;
    m->base.fd = -1;
    m->out = (_dm_ring*)(void*)(rings + ((size_t)me * (size_t)size + (size_t)peer) * stride);
    m->in = (_dm_ring*)(void*)(rings + ((size_t)peer * (size_t)size + (size_t)me) * stride);
    m->out_data = (unsigned char*)(m->out + 1);
    m->in_data = (unsigned char*)(m->in + 1);
    m->out_head = __atomic_load_n(&m->out->head, __ATOMIC_RELAXED);
    m->in_tail = m->in_head = __atomic_load_n(&m->in->tail, __ATOMIC_RELAXED);
    m->out_tail = __atomic_load_n(&m->out->tail, __ATOMIC_ACQUIRE);
    m->cap = cap;
    m->peer_bell = &bells[peer];
    m->bell_ops = ops;
    m->side_fd = side_fd;
    return &m->base;
}


/* >>fingerprint  Sent first by every collective on every link and compared by the receiver:
   32 bytes, magic u32 "DMTF", kind u8, dtype u8, op u8, compression u8 (all_reduce's
   dm_compress when compressing, else 0), root i32, 0 u32, count u64, seq u64, little-endian.
   One format and one message for every backend. */
#define _DM_FP_MAGIC 0x46544d44u
/* A point-to-point message is a fingerprint of kind _DM_K_SEND (root = the tag, seq = the
   sender's message number to this peer) followed by count elements; _DM_K_RECV only names
   what a receiver expected, in messages. */
typedef struct _dm_fp {
    int kind, dtype, op, root;  /* dtype, op, root: -1 when the kind has none */
    int compress;               /* all_reduce: DM_COMPRESS_BF16 / _INT8 when it compresses, else 0 */
    uint64_t count, seq;
} _dm_fp;

_DM_PRIVATE void _dm_put32(unsigned char* p, uint32_t v) {
    p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8); p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}
_DM_PRIVATE uint32_t _dm_get32(const unsigned char* p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
_DM_PRIVATE void _dm_put64(unsigned char* p, uint64_t v) {
    _dm_put32(p, (uint32_t)v);
    _dm_put32(p + 4, (uint32_t)(v >> 32));
}
_DM_PRIVATE uint64_t _dm_get64(const unsigned char* p) {
    return (uint64_t)_dm_get32(p) | ((uint64_t)_dm_get32(p + 4) << 32);
}
_DM_PRIVATE void _dm_fp_make(_dm_fp* f, const dm_collective* c, int kind, int dtype, int op, int root,
                             size_t count) {
    f->kind = kind; f->dtype = dtype; f->op = op; f->root = root; f->compress = 0;
    f->count = (uint64_t)count; f->seq = c->seq;
}
_DM_PRIVATE void _dm_fp_encode(const _dm_fp* f, unsigned char* p) {
    memset(p, 0, 32);
    _dm_put32(p, _DM_FP_MAGIC);
    p[4] = (unsigned char)f->kind; p[5] = (unsigned char)f->dtype; p[6] = (unsigned char)f->op;
    p[7] = (unsigned char)f->compress;
    _dm_put32(p + 8, (uint32_t)f->root);
    _dm_put64(p + 16, f->count);
    _dm_put64(p + 24, f->seq);
}
_DM_PRIVATE void _dm_fp_decode(const unsigned char* p, _dm_fp* f) {
    f->kind = p[4];
    f->dtype = p[5] == 0xff ? -1 : p[5];
    f->op = p[6] == 0xff ? -1 : p[6];
    f->compress = p[7];
    f->root = (int)_dm_get32(p + 8);
    f->count = _dm_get64(p + 16);
    f->seq = _dm_get64(p + 24);
}
_DM_PRIVATE bool _dm_fp_equal(const _dm_fp* a, const _dm_fp* b) {
    return a->kind == b->kind && a->dtype == b->dtype && a->op == b->op && a->root == b->root &&
           a->compress == b->compress && a->count == b->count && a->seq == b->seq;
}
/* "all_reduce #7 (float32, count 3, sum)", "broadcast #2 (int8, count 4, root 1)". */
_DM_PRIVATE void _dm_fp_text(const _dm_fp* f, char* buf, size_t cap) {
    int n = snprintf(buf, cap, "%s #%llu", _dm_kind_name(f->kind), (unsigned long long)f->seq);
    if (n < 0 || (size_t)n >= cap) return;
    if (f->kind == _DM_K_BARRIER) { snprintf(buf + n, cap - (size_t)n, " (round %d)", f->root); return; }
    if (f->dtype < 0) return;
    n += snprintf(buf + n, cap - (size_t)n, " (%s, count %llu", dm_dtype_name((dm_dtype)f->dtype),
                  (unsigned long long)f->count);
    if ((size_t)n < cap && f->op >= 0 &&
        (f->kind == _DM_K_ALL_REDUCE || f->kind == _DM_K_REDUCE_SCATTER || f->kind == _DM_K_REDUCE))
        n += snprintf(buf + n, cap - (size_t)n, ", %s", dm_reduce_op_name((dm_reduce_op)f->op));
    if ((size_t)n < cap && f->compress > 0 && f->compress < DM_COMPRESS_COUNT)
        n += snprintf(buf + n, cap - (size_t)n, ", compressed %s", dm_compress_name((dm_compress)f->compress));
    if ((size_t)n < cap && (f->kind == _DM_K_BROADCAST || f->kind == _DM_K_REDUCE || f->kind == _DM_K_GATHER ||
                            f->kind == _DM_K_SCATTER))
        n += snprintf(buf + n, cap - (size_t)n, ", root %d", f->root);
    if ((size_t)n < cap && f->kind == _DM_K_ALL_TO_ALL)
        n += snprintf(buf + n, cap - (size_t)n, " from the sender, %d back", f->root);
    if ((size_t)n < cap && (f->kind == _DM_K_SEND || f->kind == _DM_K_RECV))
        n += snprintf(buf + n, cap - (size_t)n, ", tag %d", f->root);
    if ((size_t)n < cap) snprintf(buf + n, cap - (size_t)n, ")");
}
_DM_PRIVATE dm_status _dm_fp_mismatch(dm_collective* c, const char* tag, int me, const _dm_fp* mine,
                                      int peer, const _dm_fp* theirs) {
    char a[160], b[160];
    _dm_fp_text(mine, a, sizeof(a));
    _dm_fp_text(theirs, b, sizeof(b));
    return _DM_FAIL(c, DM_ERR_MISMATCH, "%s: mismatched collectives: rank %d called %s, rank %d called %s",
                    tag, me, a, peer, b);
}

/* >>sealed records  What crosses a network that is not trusted, sealed: the encrypted links
   between hosts (distmesh_socket.h >>socket aead) and the store's connections with a token
   (distmesh_store.h >>store seal) carry their plaintext stream as records
       length  u32 little-endian, 1.._DM_AEAD_RECORD: the record's plaintext bytes
       sealed  length bytes of AES-256-GCM ciphertext (libcrypto's EVP), then its 16-byte tag
   with the length as associated data and the direction's record counter as the 96-bit nonce
   (4 zero bytes, the counter u64 little-endian): sender and receiver count records alike, so no
   nonce repeats under a key and a record replayed, reordered, dropped, flipped or spliced from
   another connection fails its tag. Each direction of each connection has its own key, from
   HKDF-SHA256 of the token over both ends' handshake nonces (the callers name the direction in
   the info). Here: the key derivation (libc only) and one direction's cipher (_dm_rec, with
   DISTMESH_OPENSSL): seal the next record into a buffer, open the next one in place. */
#define _DM_AEAD_RECORD ((size_t)64 << 10)  /* plaintext bytes per record at most */
#define _DM_AEAD_HEAD 4
#define _DM_AEAD_TAG 16
#define _DM_AEAD_MAX (_DM_AEAD_HEAD + _DM_AEAD_RECORD + _DM_AEAD_TAG)   /* one whole record */
_DM_COLD_BEGIN
/* HKDF-SHA256 (RFC 5869), one 32-byte block: extract with salt over ikm, expand with info. */
_DM_PRIVATE void _dm_hkdf_sha256(const void* salt, size_t salt_n, const void* ikm, size_t ikm_n, const char* info,
                                 size_t info_n, unsigned char out[32]) {
    unsigned char prk[32], msg[1024];
    if (info_n > sizeof(msg) - 1) info_n = sizeof(msg) - 1;
    dm_hmac_sha256(salt, salt_n, ikm, ikm_n, prk);
    memcpy(msg, info, info_n);
    msg[info_n] = 1;
    dm_hmac_sha256(prk, sizeof(prk), msg, info_n + 1, out);
    memset(prk, 0, sizeof(prk));
}
_DM_COLD_END
#if defined(DISTMESH_OPENSSL)
/* One direction of a connection: its cipher under its key, and its record counter (the next
   record's nonce). */
typedef struct _dm_rec {
    EVP_CIPHER_CTX* ctx;
    uint64_t seq;
} _dm_rec;
/* Keyed for sealing (seal) or opening: true, or false (out of memory, or libcrypto has no
   AES-256-GCM) with nothing to free. */
_DM_PRIVATE bool _dm_rec_init(_dm_rec* r, bool seal, const unsigned char key[32]) {
    r->seq = 0;
    r->ctx = EVP_CIPHER_CTX_new();
    if (r->ctx && (seal ? EVP_EncryptInit_ex(r->ctx, EVP_aes_256_gcm(), NULL, key, NULL)
                        : EVP_DecryptInit_ex(r->ctx, EVP_aes_256_gcm(), NULL, key, NULL)) == 1)
        return true;
    EVP_CIPHER_CTX_free(r->ctx);
    r->ctx = NULL;
    return false;
}
_DM_PRIVATE void _dm_rec_free(_dm_rec* r) {
    EVP_CIPHER_CTX_free(r->ctx);
    r->ctx = NULL;
}
_DM_PRIVATE void _dm_rec_nonce(uint64_t seq, unsigned char iv[12]) {
    int i;
    memset(iv, 0, 4);
    for (i = 0; i < 8; i++) iv[4 + i] = (unsigned char)(seq >> (8 * i));
}
/* Seals the first n bytes of the pieces (1 <= n <= _DM_AEAD_RECORD) as the next record into
   out (n + _DM_AEAD_HEAD + _DM_AEAD_TAG bytes): true, or false when libcrypto failed. */
_DM_PRIVATE bool _dm_rec_seal(_dm_rec* r, const _dm_iov* iov, int niov, size_t n, unsigned char* out) {
    unsigned char iv[12];
    size_t off = 0;
    int i, outl = 0;
    _dm_put32(out, (uint32_t)n);
    _dm_rec_nonce(r->seq++, iv);
    if (EVP_EncryptInit_ex(r->ctx, NULL, NULL, NULL, iv) != 1 ||
        EVP_EncryptUpdate(r->ctx, NULL, &outl, out, _DM_AEAD_HEAD) != 1)
        return false;
    for (i = 0; i < niov && off < n; i++) {
        size_t k = iov[i].len < n - off ? iov[i].len : n - off;
        if (k == 0) continue;
        if (EVP_EncryptUpdate(r->ctx, out + _DM_AEAD_HEAD + off, &outl, (const unsigned char*)iov[i].buf, (int)k) != 1)
            return false;
        off += k;
    }
    return EVP_EncryptFinal_ex(r->ctx, out + _DM_AEAD_HEAD + n, &outl) == 1 &&
           EVP_CIPHER_CTX_ctrl(r->ctx, EVP_CTRL_GCM_GET_TAG, _DM_AEAD_TAG, out + _DM_AEAD_HEAD + n) == 1;
}
/* The length a record's head announces, or 0 when no record may have it (0, or above
   _DM_AEAD_RECORD): the stream is bad from there. */
_DM_PRIVATE size_t _dm_rec_len(const unsigned char* head) {
    size_t n = _dm_get32(head);
    return n > _DM_AEAD_RECORD ? 0 : n;
}
/* Opens the next record, whole in rec (head, n sealed bytes, tag), in place: its plaintext is
   rec + _DM_AEAD_HEAD. true, or false when it fails its tag (then nothing of it may be used). */
_DM_PRIVATE bool _dm_rec_open(_dm_rec* r, unsigned char* rec, size_t n) {
    unsigned char iv[12];
    int outl = 0;
    _dm_rec_nonce(r->seq++, iv);
    return EVP_DecryptInit_ex(r->ctx, NULL, NULL, NULL, iv) == 1 &&
           EVP_DecryptUpdate(r->ctx, NULL, &outl, rec, _DM_AEAD_HEAD) == 1 &&
           EVP_DecryptUpdate(r->ctx, rec + _DM_AEAD_HEAD, &outl, rec + _DM_AEAD_HEAD, (int)n) == 1 &&
           EVP_CIPHER_CTX_ctrl(r->ctx, EVP_CTRL_GCM_SET_TAG, _DM_AEAD_TAG, rec + _DM_AEAD_HEAD + n) == 1 &&
           EVP_DecryptFinal_ex(r->ctx, rec + _DM_AEAD_HEAD + n, &outl) == 1;
}
#endif /* DISTMESH_OPENSSL */

/* >>algorithms  The algorithms a group may run, and DISTMESH_ALGO's names for them. A family
   (flat, two_level) forces the level and leaves ring or recursive doubling to the cost model;
   an algorithm forces both where it can run (a ring needs at least one element per rank of its
   ring; else its family's other form runs). Collectives without a ring and an rd form
   (broadcast, barrier, all_gather, reduce_scatter) follow the family. Read once when a group's
   engine is made (_dm_eng_init); the choice (>>choice) honours it. */
enum {
    _DM_ALGO_AUTO = 0, _DM_ALGO_FLAT, _DM_ALGO_TWO_LEVEL,
    _DM_ALGO_FLAT_RING, _DM_ALGO_FLAT_RD, _DM_ALGO_TWO_LEVEL_RING, _DM_ALGO_TWO_LEVEL_RD, _DM_ALGO_THREE_LEVEL,
    _DM_ALGO_COUNT
};
static const char* const _dm_algo_names[_DM_ALGO_COUNT] = {
    "auto", "flat", "two_level", "flat_ring", "flat_rd", "two_level_ring", "two_level_rd", "three_level"
};
/* A link class of the cost model (>>choice): alpha (us per message), beta (ns per byte). */
typedef struct _dm_link_cost { double alpha_us, beta_ns; } _dm_link_cost;
/* DISTMESH_HOST_LINK, "LATENCY_US,GBIT": the one-way latency (microseconds) and the rate
   (Gbit/s) of the link between hosts, for the cost model's cross-host class (>>choice) in
   place of its 25 us and 10 Gbit/s. Distant hosts need it: at 25 ms one way the model's
   default pipelines a large two-level all-reduce in many segments, each of which then waits
   a round trip (docs/performance.md "Wide-area round trips"). Unset: alpha 0 (the class's).
   It changes only which algorithm and how many segments run, so every rank must be given the
   same, like DISTMESH_ALGO. DISTMESH_SITE_LINK is the same for the link between sites (the
   cross-site class). */
_DM_PRIVATE dm_status _dm_eng_link_env(_dm_cfg_id id, _dm_link_cost* out, char* err, size_t cap) {
    const char* s = NULL;
    char* end = NULL;
    double us, gbit;
    out->alpha_us = out->beta_ns = 0;
    _DM_TRY(_dm_cfg_str(id, &s, err, cap));
    if (!s || !*s) return DM_OK;
    errno = 0;
    us = strtod(s, &end);
    if (end != s && *end == ',') {
        const char* g = end + 1;
        gbit = strtod(g, &end);
        if (end != g && *end == 0 && errno == 0 && us > 0 && us <= 1e7 && gbit > 0 && gbit <= 1e4) {
            out->alpha_us = us;
            out->beta_ns = 8.0 / gbit;      /* ns per byte at gbit Gbit/s */
            return DM_OK;
        }
    }
    snprintf(err, cap, "env: DISTMESH_%s=\"%.40s\" is not LATENCY_US,GBIT (one-way us in (0, 1e7], "
             "Gbit/s in (0, 1e4]; e.g. 25000,1)", id == _DM_CFG_HOST_LINK ? "HOST_LINK" : "SITE_LINK", s);
    return DM_ERR_ENV;
}
/* The engine's variables: DISTMESH_ALGO (unset: auto; its choices are _dm_algo_names in order,
   >>config registry), DISTMESH_COMPRESS as a dm_compress (none|bf16|int8:
   DM_COMPRESS_NONE, _BF16, _INT8), DISTMESH_HOST_LINK and DISTMESH_SITE_LINK (links may be
   NULL: only checked; else links[0] the host link, links[1] the site link). A bad value is
   DM_ERR_ENV with err saying what is accepted. */
_DM_PRIVATE dm_status _dm_eng_env(int* algo, dm_compress* compress, _dm_link_cost* links, char* err, size_t cap) {
    int mode = 0;
    _dm_link_cost link[2];
    _DM_TRY(_dm_cfg_int(_DM_CFG_ALGO, algo, err, cap));
    _DM_TRY(_dm_cfg_int(_DM_CFG_COMPRESS, &mode, err, cap));
    *compress = (dm_compress)(DM_COMPRESS_NONE + mode);
    _DM_TRY(_dm_eng_link_env(_DM_CFG_HOST_LINK, &link[0], err, cap));
    _DM_TRY(_dm_eng_link_env(_DM_CFG_SITE_LINK, &link[1], err, cap));
    if (links) { links[0] = link[0]; links[1] = link[1]; }
    return DM_OK;
}

/* >>engine  The state one group's schedules run on (_dm_eng: its links, scratch, host layout,
   broken state and the backend's hooks), made and released here, the wait policy, and the
   transfer a schedule hands the engine (_dm_xfer: a stream of send steps and one of recv
   steps). The failure rule, the inbox, the pump and the loop follow in their own sections. */

#define _DM_ENG_IO_MAX      ((size_t)1 << 30)  /* bytes per link call (2 GiB+ messages) */
#define _DM_ENG_SPIN_US     5                  /* see _dm_eng_set_policy */
/* A point-to-point message that arrived before the dm_recv asking for it (see >>engine inbox). */
typedef struct _dm_umsg {
    struct _dm_umsg* next;
    int peer;
    _dm_fp fp;                  /* its header: dtype, count, tag (root), number (seq) */
    size_t bytes;
    unsigned char* data;
} _dm_umsg;
/* What a peer sends between collectives, read at the boundaries: a point-to-point message
   (header, payload, padding) or the next collective's fingerprint, which stays in hdr until
   that collective's first recv step takes it (fp_ready). State survives between calls: a send
   that reads while it waits may stop anywhere in a message. */
typedef struct _dm_inbox {
    unsigned char hdr[32];
    size_t hfill;               /* header bytes read */
    bool fp_ready;              /* hdr is a collective's fingerprint, not yet taken */
    bool payload;               /* reading a payload (into msg->data, or a dm_recv's buffer) */
    _dm_umsg* msg;              /* the unexpected message being filled, or NULL */
    unsigned char* dst;
    size_t len, fill, pad, padfill;
} _dm_inbox;
/* Which ranks share a host, as the schedules see it: hosts numbered by first
   appearance, each host's ranks in rank order. One host (every rank) unless the backend says
   otherwise (_dm_eng_set_hosts). All arrays live in one allocation owned by the _dm_eng. */
typedef struct _dm_layout {
    int H;                      /* hosts */
    int Lmin, Lmax;             /* fewest and most ranks on one host */
    int* host_of;               /* rank -> host */
    int* local;                 /* rank -> its index among its host's ranks */
    int* members;               /* ranks host by host: host h's are members[start[h] .. start[h+1]) */
    int* start;                 /* H + 1 entries */
    int* team;                  /* scratch, 7 x size entries: teams' ranks (rails, chains; a site
                                   rail and a cross rail at once) in the first 2 x size, the
                                   cost model's rounds in the rest (_dm_cost_scratch), so that
                                   a schedule may ask the model with its teams built */
    bool contiguous;            /* every host's ranks are consecutive numbers */
    /* Sites (DISTMESH_SITE): groups of hosts joined by a slower link. Hosts are numbered site
       by site, so site s holds hosts site_start[s] .. site_start[s+1] and the flat ring and
       every rail cross each site boundary once. One site unless the backend says otherwise. */
    int NS;                     /* sites */
    int HSmin, HSmax;           /* fewest and most hosts at one site */
    int* site_of;               /* host -> site (H entries) */
    int* site_start;            /* NS + 1 entries */
} _dm_layout;

typedef struct _dm_eng {
    dm_collective* c;
    const char* tag;            /* message prefix: the backend */
    /* Optional, the backend's step before each collective the core's slots run (not point-to-
       point, not dry runs): the threaded world meets there and compares fingerprints. */
    dm_status (*enter)(struct _dm_eng* lk, int kind, size_t count, int dtype, int op, int root);
    _dm_link** links;           /* per rank, NULL for this rank */
    int* order;                 /* ring position -> rank: same-host ranks adjacent */
    int* slot;                  /* rank -> ring position */
    unsigned char* tmp;         /* scratch: max(chunk, _DM_PICK_SMALL_BYTES) bytes */
    unsigned char* tmp2;        /* a second one, tmp_size bytes, made when first needed: for the
                                   host ring that runs beside a rail (_dm_sch_2l_stage) */
    size_t tmp_size, chunk;     /* chunk: pipelining unit of reductions through scratch */
    dm_status broken;           /* DM_OK, or the failure that broke the group */
    char broken_msg[256];
    _dm_bell* bell;             /* this rank's bell when it has memory links, else NULL */
    _dm_bell* bells;            /* the bells of the ranks sharing memory (a failure wakes them) */
    int nbells;
    const _dm_bell_ops* bell_ops;
    _dm_abort* abort;           /* the failure word shared by same-host ranks, or NULL */
    int spin_us, yield_us;      /* a wait spins, then yields until yield_us, then blocks */
    int beside_looks;           /* looks in a row that found a peer on this core (_dm_eng_move_off) */
    int64_t moved_us;           /* when this rank last moved off a peer's core, 0 never */
    /* Optional: the backend's channel for abort notices that reach every rank, not only the
       neighbours of a failure (TCP: a key in the store). post is called once, with the status
       and message of the first failure this rank saw itself; read returns such a notice (its
       status, DM_OK for none) when a peer hangs up, so the cause is reported, not "EOF". */
    void (*notice_post)(struct _dm_eng* lk, dm_status st, const char* msg);
    dm_status (*notice_read)(struct _dm_eng* lk, int* rank, char* msg, size_t cap);
    bool adopting;              /* breaking because of another rank's notice: do not re-post */
    _dm_inbox* inbox;           /* per rank (>>engine inbox) */
    _dm_umsg *uhead, *utail;    /* unexpected messages in arrival order */
    size_t ubytes;              /* their bytes, bounded by DISTMESH_MAX_OBJECT_BYTES */
    uint64_t* sent;             /* per rank: point-to-point messages sent to it (their number) */
    struct pollfd* pfds;        /* size + 2 x _DM_ENG_XFER_MAX + _DM_ENG_SERVICE_FDS entries for _dm_eng_block */
    _dm_layout lay;             /* which ranks share a host */
    int algo;                   /* DISTMESH_ALGO: _DM_ALGO_AUTO or the family / algorithm forced */
    dm_compress compress_env;   /* DISTMESH_COMPRESS: DM_COMPRESS_NONE, _BF16 or _INT8 */
    unsigned char* cbuf;        /* the compressed rails' scratch (>>compressed rails), grown on demand */
    size_t cbuf_size;
    const _dm_link_cost* cost;  /* NULL: the model's link classes (>>choice); the model's front
                                   end gives others, to predict other networks */
    _dm_link_cost link_env[2];  /* DISTMESH_HOST_LINK, DISTMESH_SITE_LINK: the links between hosts
                                   and between sites as the user states them (alpha 0: unset, the
                                   class's) */
    bool site_probe;            /* the backend's links are real (TCP): where DISTMESH_SITE_LINK is
                                   unset, the site link's latency is measured (>>site probe) */
    _dm_link_cost site_link;    /* that measurement (alpha 0: not yet; < 0: not to be made), with
                                   the site class's beta; the three-level gathers' segments only */
    /* P's bookkeeping (>>peers). dry: transfers record their peers in `used` and move nothing.
       peers (optional): P, the peers of this rank's fixed-peer schedules; a transfer of such a
       schedule (not on_demand) with a peer outside it is DM_ERR_INTERNAL, so a schedule that
       changes without _dm_peers_find is caught by the tests. */
    bool dry, on_demand;
    int rails_force;            /* 0: the model decides the rails (_dm_pick_rails_ring), 1: ring,
                                   2: recursive doubling; set by _dm_peers_find only */
    bool* used;
    bool* peers;
    /* Optional (TCP: connections only where the schedules need them): links may be NULL until
       a transfer needs them. connect makes the links to peers[0..n) by the deadline, or fails
       with its message recorded; poll_fill puts up to cap descriptors that need service while this rank
       blocks (a listener, handshakes in progress) into p; service moves them on without
       blocking, so a rank that connects to this one is answered from any wait; hangup (on
       break) stops answering. */
    dm_status (*connect)(struct _dm_eng* lk, const int* peers, int n, int64_t deadline);
    int (*poll_fill)(struct _dm_eng* lk, struct pollfd* p, int cap);
    void (*service)(struct _dm_eng* lk);
    void (*hangup)(struct _dm_eng* lk);
    /* Optional (TCP, every rank of the group on one host over shared memory): copies n bytes at
       addr in process pid into dst, whole, and returns 0 or an errno. With it a flat ring
       all-reduce moves its all-gather by single copy (>>single copy); single_copy_off: a read
       failed once, and the ring's all-gather runs from then on (every rank knows it at once). */
    int (*read_peer)(struct _dm_eng* lk, int64_t pid, uint64_t addr, void* dst, size_t n);
    bool single_copy_off;
    bool single_copy_no;        /* DISTMESH_SINGLE_COPY=0 on this rank: it offers no buffer */
} _dm_eng;
#define _DM_ENG_SERVICE_FDS 80      /* pfds entries kept for poll_fill */
#define _DM_ENG_XFER_MAX 3          /* transfers run together (_dm_eng_run_n) */

/* Numbers the sites by first appearance into site (rank -> site; site_of NULL: one site) and
   the hosts site by site, each site's by first appearance, into y->host_of; key holds host_of's
   numbers (the callers' arrays may alias y->host_of). A host is a (site, host number) pair,
   so a host number given at two sites is two hosts (the backends refuse that before). */
_DM_PRIVATE void _dm_eng_number_hosts(_dm_layout* y, int W, const int* key, const int* site_of, int* site) {
    int r, q, s;
    y->NS = 0;
    for (r = 0; r < W; r++) {
        for (q = 0; q < r && site_of && site_of[q] != site_of[r]; q++) {}
        site[r] = q < r ? site[q] : y->NS++;
    }
    y->H = 0;
    for (s = 0; s < y->NS; s++) {
        y->site_start[s] = y->H;
        for (r = 0; r < W; r++) {
            if (site[r] != s) continue;
            for (q = 0; q < r && (site[q] != s || key[q] != key[r]); q++) {}
            if (q == r) y->site_of[y->H] = s;
            y->host_of[r] = q < r ? y->host_of[q] : y->H++;
        }
        if (s == 0 || y->H - y->site_start[s] < y->HSmin) y->HSmin = y->H - y->site_start[s];
        if (s == 0 || y->H - y->site_start[s] > y->HSmax) y->HSmax = y->H - y->site_start[s];
    }
    y->site_start[y->NS] = y->H;
}
/* Tells the group which ranks share a host and which hosts a site: host_of[r] is any number
   naming rank r's host (equal numbers, same host; may alias lk->lay.host_of), site_of[r] (NULL:
   one site) any number naming its site, the same for every rank of a host. Numbers the hosts
   site by site (_dm_eng_number_hosts), lists each host's ranks, and puts the flat ring in host
   order (ranks sorted by host, then by rank, as NCCL orders rings), so a ring crosses hosts
   once per host instead of at every hop, and sites once per site. Every rank of the group must
   be given the same layout. */
_DM_PRIVATE void _dm_eng_set_layout(_dm_eng* lk, const int* host_of, const int* site_of) {
    _dm_layout* y = &lk->lay;
    int W = lk->c->size, r, h, p = 0;
    int *key = y->team, *sites = y->team + W, *site = y->team + 2 * W;
    for (r = 0; r < W; r++) key[r] = host_of[r];          /* host_of may be y->host_of */
    for (r = 0; r < W && site_of; r++) sites[r] = site_of[r];
    _dm_eng_number_hosts(y, W, key, site_of ? sites : NULL, site);
    y->Lmin = W;
    y->Lmax = 0;
    y->contiguous = true;
    for (h = 0; h < y->H; h++) {
        y->start[h] = p;
        for (r = 0; r < W; r++)
            if (y->host_of[r] == h) {
                if (p > y->start[h] && y->members[p - 1] != r - 1) y->contiguous = false;
                y->local[r] = p - y->start[h];
                y->members[p] = r;
                lk->order[p] = r;
                lk->slot[r] = p;
                p++;
            }
        if (p - y->start[h] < y->Lmin) y->Lmin = p - y->start[h];
        if (p - y->start[h] > y->Lmax) y->Lmax = p - y->start[h];
    }
    y->start[y->H] = p;
}
/* One site: _dm_eng_set_layout without sites. */
_DM_PRIVATE void _dm_eng_set_hosts(_dm_eng* lk, const int* host_of) { _dm_eng_set_layout(lk, host_of, NULL); }

/* a group's engine made and released: create, split, destroy */
_DM_COLD_BEGIN
/* Scratch, ring order (identity), one host, DISTMESH_ALGO, DISTMESH_COMPRESS and the wait
   policy; links are the backend's to fill. A bad variable is DM_ERR_ENV with its message in
   last_error. */
_DM_PRIVATE dm_status _dm_eng_init(_dm_eng* lk, dm_collective* c, const char* tag, size_t chunk) {
    int r, W = c->size;
    memset(lk, 0, sizeof(*lk));
    lk->c = c;
    lk->tag = tag;
    c->core->eng = lk;
    {
        char err[200];
        if (_dm_eng_env(&lk->algo, &lk->compress_env, lk->link_env, err, sizeof(err)) != DM_OK)
            return _DM_FAIL(c, DM_ERR_ENV, "%s: %s", tag, err);
    }
    chunk = chunk ? chunk : ((size_t)512 << 10);
    lk->chunk = (chunk + 7) / 8 * 8;    /* a whole number of elements of every dtype */
    lk->tmp_size = lk->chunk > _DM_PICK_SMALL_BYTES ? lk->chunk : _DM_PICK_SMALL_BYTES;
    lk->tmp = (unsigned char*)_dm_malloc(&c->allocator, lk->tmp_size);
    lk->links = (_dm_link**)_dm_calloc(&c->allocator, sizeof(_dm_link*) * (size_t)W);
    lk->order = (int*)_dm_malloc(&c->allocator, sizeof(int) * 2 * (size_t)W);
    lk->inbox = (_dm_inbox*)_dm_calloc(&c->allocator, sizeof(_dm_inbox) * (size_t)W);
    lk->sent = (uint64_t*)_dm_calloc(&c->allocator, sizeof(uint64_t) * (size_t)W);
    lk->pfds = (struct pollfd*)_dm_calloc(&c->allocator, sizeof(struct pollfd) * ((size_t)W + 2 * _DM_ENG_XFER_MAX + _DM_ENG_SERVICE_FDS));
    lk->lay.host_of = (int*)_dm_calloc(&c->allocator, sizeof(int) * (13 * (size_t)W + 2));
    if (!lk->tmp || !lk->links || !lk->order || !lk->inbox || !lk->sent || !lk->pfds || !lk->lay.host_of)
        return DM_ERR_OUT_OF_MEMORY;
    lk->slot = lk->order + W;
    for (r = 0; r < W; r++) lk->order[r] = lk->slot[r] = r;
    lk->lay.local = lk->lay.host_of + W;
    lk->lay.members = lk->lay.local + W;
    lk->lay.start = lk->lay.members + W;
    lk->lay.team = lk->lay.start + W + 1;
    lk->lay.site_of = lk->lay.team + 7 * W;
    lk->lay.site_start = lk->lay.site_of + W;
    _dm_eng_set_hosts(lk, lk->lay.host_of);    /* all zeros: one host */
    memset(lk->tmp, 0, lk->tmp_size);   /* fault the scratch in now, not in the first collectives */
    lk->spin_us = _DM_ENG_SPIN_US;
    lk->yield_us = 1000;
    return DM_OK;
}
_DM_PRIVATE void _dm_eng_release(_dm_eng* lk) {
    const dm_allocator* a;
    int r;
    if (!lk->c) return;         /* never initialised (a create that failed early) */
    a = &lk->c->allocator;
    if (lk->links)
        for (r = 0; r < lk->c->size; r++)
            if (lk->links[r]) lk->links[r]->vt->destroy(lk->links[r], a);
    _dm_free(a, lk->links);
    _dm_free(a, lk->order);
    _dm_free(a, lk->tmp);
    _dm_free(a, lk->tmp2);
    lk->tmp2 = NULL;
    _dm_free(a, lk->cbuf);
    lk->cbuf = NULL;
    lk->cbuf_size = 0;
    while (lk->uhead) {
        _dm_umsg* m = lk->uhead;
        lk->uhead = m->next;
        _dm_free(a, m);
    }
    if (lk->inbox)
        for (r = 0; r < lk->c->size; r++) _dm_free(a, lk->inbox[r].msg);
    _dm_free(a, lk->inbox);
    _dm_free(a, lk->sent);
    _dm_free(a, lk->pfds);
    _dm_free(a, lk->lay.host_of);
    _dm_free(a, lk->peers);
    lk->peers = NULL;
    lk->pfds = NULL;
    lk->lay.host_of = NULL;
    lk->links = NULL; lk->order = NULL; lk->tmp = NULL; lk->inbox = NULL; lk->sent = NULL;
}
_DM_COLD_END
/* Waiting policy for `local` ranks of a group on this host: spin only while every rank can
   have a core of its own; with more ranks than cores a spinning rank would steal the time of
   the rank it waits for, so it yields at once. The spin is short even then: on a busy host
   the scheduler now and then runs two ranks of a group on one core, and there every wait
   lasts the whole spin before the peer runs (measured on 2 loaded cores, 8-byte all-reduce
   between 2 ranks: ~103 us per call with a 50 us spin, ~13 us with 5 us); a reply that comes
   quickly at all comes within a few microseconds, over shared memory and loopback sockets. */
/* Whether local ranks sharing this host have a core each (online cores; else they take turns
   on them, and a waiting rank should give its core up soon). */
_DM_PRIVATE bool _dm_eng_core_per_rank(int local) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return local <= (cores < 1 ? 1 : cores);
}
_DM_PRIVATE void _dm_eng_set_policy(_dm_eng* lk, int local) {
    bool own_core = _dm_eng_core_per_rank(local);
    lk->spin_us = own_core ? _DM_ENG_SPIN_US : 0;
    lk->yield_us = own_core ? 1000 : 200;
}

/* The transport a group uses: the name shared by all its links, or "a+b" for a mix. */
_DM_PRIVATE const char* _dm_eng_transport(const _dm_eng* lk, char* buf, size_t cap) {
    const char* first = NULL;
    int r;
    for (r = 0; r < lk->c->size; r++) {
        const char* n;
        if (!lk->links || !lk->links[r]) continue;
        n = lk->links[r]->vt->name;
        if (!first) first = n;
        else if (strcmp(first, n) != 0) {
            snprintf(buf, cap, "%s+%s", strcmp(first, "shm") == 0 ? first : n, strcmp(first, "shm") == 0 ? n : first);
            return buf;
        }
    }
    return first ? first : "self";
}

/* A transfer: a stream of send steps to one peer and a stream of recv steps from another (or
   the same) peer. A send step may be gated by a recv step: it sends only the bytes of that
   step already final, which is how ring steps forward data the moment it is reduced (chunked
   pipelining across steps). A recv step either lands straight in its buffer or, with `own`
   set, is reduced as it arrives: buf = own op received, read in place from links that can
   peek, else through one chunk of scratch. */
typedef struct _dm_sstep {
    const unsigned char* buf;
    size_t len;
    int gate;                   /* recv step whose final bytes bound this step's, or -1 */
    int after_recvs;            /* > 0: starts only once recv steps 0..after_recvs-1 are done */
} _dm_sstep;
typedef struct _dm_rstep {
    unsigned char* buf;
    size_t len;
    const unsigned char* own;   /* reduce mode: buf = own op received (own may equal buf) */
    int after_send;             /* send step that must have sent bytes before buf is written, or -1 */
    int divide;                 /* > 0: dm_divide_local each reduced piece by this (MEAN) */
} _dm_rstep;
typedef struct _dm_xfer {
    const char* op;             /* for messages */
    int speer, rpeer;           /* ranks, -1 for none */
    _dm_sstep* ss;
    int ns;
    _dm_rstep* rs;
    int nr;
    dm_dtype dtype;
    dm_reduce_op rop;
    const _dm_fp* expect;       /* when set, recv step 0 is a fingerprint to compare with it */
    bool inbox;                 /* also read rpeer's inbox (>>engine inbox): into want, else unexpected */
    struct _dm_want* want;      /* a dm_recv: done once its message is in place */
    unsigned char* tmp;         /* scratch for reductions through it (chunk bytes), NULL: lk->tmp;
                                   transfers run together (_dm_eng_run_n) each need their own */
} _dm_xfer;
typedef struct _dm_want {
    int tag;
    dm_dtype dtype;
    size_t count;
    unsigned char* buf;
    bool done;
    bool any;                   /* from any peer (DM_ANY_SOURCE): every connected peer's inbox is read */
    int from;                   /* the peer whose message fills buf (claimed at its header), or -1 */
} _dm_want;

/* Where the two streams stand. */
typedef struct _dm_xstate {
    int si, ri;                 /* current send / recv step */
    size_t so;                  /* bytes of send step si sent */
    size_t rdone;               /* bytes of recv step ri final */
    size_t tfill;               /* bytes of the current scratch piece received */
    size_t spad, rpad;          /* padding bytes sent / skipped after the current steps */
    bool want_out, want_in;     /* the last attempt would have blocked */
} _dm_xstate;
/* Padding after a step of len bytes on link l (see _dm_link_vt.align). */
_DM_PRIVATE size_t _dm_eng_pad(const _dm_link* l, size_t len) {
    size_t a = l->vt->align;
    return a ? (a - len % a) % a : 0;
}

/* >>engine failure  Every failure while communicating breaks the group, and later calls fail at
   once. The rank that sees a failure first tells the others (the backend's notice, the abort
   word of its host, its links shut down); a rank that learns of it from them adopts its status
   and message, so every rank reports the cause. A failed link call and a fingerprint that does
   not match break the group here too. */

/* The failure itself is cold; looking for one (_dm_eng_adopt_abort, _dm_eng_check_broken) is not. */
_DM_COLD_BEGIN
/* Posts the first failure into the shared abort word and wakes every same-host rank. */
_DM_PRIVATE void _dm_eng_post_abort_msg(_dm_eng* lk, dm_status st, const char* msg) {
    int32_t none = 0;
    int r;
    if (!lk->abort) return;
    if (!__atomic_compare_exchange_n(&lk->abort->status, &none, 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return;
    lk->abort->rank = lk->c->rank;
    _dm_copy_name(lk->abort->msg, sizeof(lk->abort->msg), msg);
    __atomic_store_n(&lk->abort->status, (int32_t)st, __ATOMIC_RELEASE);
    for (r = 0; r < lk->nbells; r++) _dm_bell_ring(&lk->bells[r], lk->bell_ops);
}
_DM_PRIVATE void _dm_eng_post_abort(_dm_eng* lk, dm_status st) { _dm_eng_post_abort_msg(lk, st, _dm_errbuf(lk->c)); }
/* dm_abort's part on the aborting thread (a backend's interrupt slot calls it): the notice and
   the abort word go out before the backend hangs up, so a peer that finds this rank gone reads
   why. Both are safe beside the owner's thread (the notice channel locks; the word is CAS'd);
   the owner breaks the group itself when it wakes (_dm_eng_adopt_abort). */
_DM_PRIVATE void _dm_eng_abort_notify(_dm_eng* lk) {
    if (__atomic_load_n(&lk->c->core->aborted, __ATOMIC_ACQUIRE) != 2) return;
    if (lk->notice_post) lk->notice_post(lk, DM_ERR_ABORTED, lk->c->core->abort_msg);
    _dm_eng_post_abort_msg(lk, DM_ERR_ABORTED, lk->c->core->abort_msg);
    if (lk->bell) _dm_bell_ring(lk->bell, lk->bell_ops);     /* the owner may sleep on its bell */
}
/* Marks the group broken with st (the message is already in last_error) and tells the others:
   the backend's notice first, then the abort word, then every link is shut down, so a peer
   blocked on this rank fails at once and finds the cause waiting (timeouts included: the
   group is broken either way, and the others learn why now, not at their own deadlines). The
   order matters where links are sparse: a rank that learns of the failure second-hand (the
   abort word, a link closed by a rank that adopted it) must find the notice already there. */
_DM_PRIVATE dm_status _dm_eng_break(_dm_eng* lk, dm_status st) {
    int r;
    if (lk->broken != DM_OK) return st;
    lk->broken = st;
    _dm_copy_name(lk->broken_msg, sizeof(lk->broken_msg), _dm_errbuf(lk->c));
    if (!lk->adopting && lk->notice_post) lk->notice_post(lk, st, _dm_errbuf(lk->c));
    _dm_eng_post_abort(lk, st);
    if (lk->hangup) lk->hangup(lk);
    for (r = 0; r < lk->c->size; r++)
        if (lk->links[r] && lk->links[r]->vt->shutdown) lk->links[r]->vt->shutdown(lk->links[r]);
    return st;
}
/* This rank fails with another rank's status and message. */
_DM_PRIVATE dm_status _dm_eng_adopt(_dm_eng* lk, const char* op, dm_status st, int rank, const char* msg) {
    _DM_FAIL(lk->c, st, "%s: %s #%llu failed because rank %d failed: %s", lk->tag, op,
             (unsigned long long)lk->c->seq, rank, msg);
    lk->adopting = true;
    _dm_eng_break(lk, st);
    lk->adopting = false;
    return st;
}
/* A peer hung up: if some rank posted a notice, its cause is this rank's too. */
_DM_PRIVATE dm_status _dm_eng_adopt_notice(_dm_eng* lk, const char* op) {
    char msg[DM_LAST_ERROR_SIZE];
    int rank = -1;
    dm_status st = lk->notice_read ? lk->notice_read(lk, &rank, msg, sizeof(msg)) : DM_OK;
    if (st == DM_OK || rank == lk->c->rank) return DM_OK;
    return _dm_eng_adopt(lk, op, st, rank, msg);
}
_DM_COLD_END
/* dm_abort was called on this rank (the group breaks with its message), or another same-host
   rank failed first (the shared abort word). */
_DM_PRIVATE dm_status _dm_eng_adopt_abort(_dm_eng* lk, const char* op) {
    int32_t st;
    if (__builtin_expect(__atomic_load_n(&lk->c->core->aborted, __ATOMIC_ACQUIRE) == 2, 0) && lk->broken == DM_OK) {
        _DM_FAIL(lk->c, DM_ERR_ABORTED, "%s: %s #%llu: %s", lk->tag, op, (unsigned long long)lk->c->seq,
                 lk->c->core->abort_msg);
        lk->adopting = true;    /* dm_abort's thread posted the notice (_dm_eng_abort_notify) */
        _dm_eng_break(lk, DM_ERR_ABORTED);
        lk->adopting = false;
        return DM_ERR_ABORTED;
    }
    st = lk->abort ? __atomic_load_n(&lk->abort->status, __ATOMIC_ACQUIRE) : 0;
    if (st >= 0) return DM_OK;
    return _dm_eng_adopt(lk, op, (dm_status)st, lk->abort->rank, lk->abort->msg);
}
/* Later calls fail at once: DM_ERR_PEER_LOST when a peer is gone (the caller's question is "is
   my job still whole?"), else DM_ERR_ABORTED. */
_DM_PRIVATE dm_status _dm_eng_check_broken(_dm_eng* lk, const char* op) {
    dm_status st;
    if (lk->broken == DM_OK) return _dm_eng_adopt_abort(lk, op);   /* this call fails with the cause */
    st = lk->broken == DM_ERR_PEER_LOST ? DM_ERR_PEER_LOST : DM_ERR_ABORTED;
    return _DM_FAIL(lk->c, st, "%s: %s #%llu: the collective is broken by an earlier failure (%s): %s",
                    lk->tag, op, (unsigned long long)lk->c->seq, dm_status_name(lk->broken), lk->broken_msg);
}

_DM_PRIVATE dm_status _dm_eng_io_fail(_dm_eng* lk, const _dm_xfer* x, int peer, bool sending, int err) {
    bool lost = (err == 0 || err == EPIPE || err == ECONNRESET || err == ECONNABORTED || err == ENOTCONN ||
                 err == ESHUTDOWN);
    dm_status st;
    if (_dm_eng_adopt_abort(lk, x->op) != DM_OK) return lk->broken;
    if (lost && _dm_eng_adopt_notice(lk, x->op) != DM_OK) return lk->broken;
    if (lost)
        st = _DM_FAIL(lk->c, DM_ERR_PEER_LOST, "%s: %s #%llu: rank %d (%s) %s while %s", lk->tag, x->op,
                      (unsigned long long)lk->c->seq, peer, lk->links[peer]->where,
                      err == 0 ? "closed the connection (EOF)" : strerror(err),
                      sending ? "sending to it" : "receiving from it");
    else if (err == EBADMSG)    /* an encrypted link's record failed (distmesh_socket.h >>socket aead) */
        st = _DM_FAIL(lk->c, DM_ERR_PROTOCOL, "%s: %s #%llu: %s rank %d (%s) failed: a record failed its "
                      "authentication (tampered, replayed, reordered or dropped on the way)", lk->tag, x->op,
                      (unsigned long long)lk->c->seq, sending ? "send to" : "recv from", peer, lk->links[peer]->where);
    else
        st = _DM_FAIL(lk->c, DM_ERR_NETWORK, "%s: %s #%llu: %s rank %d (%s) failed (%s)", lk->tag, x->op,
                      (unsigned long long)lk->c->seq, sending ? "send to" : "recv from", peer,
                      lk->links[peer]->where, strerror(err));
    return _dm_eng_break(lk, st);
}

_DM_PRIVATE dm_status _dm_eng_check_fp(_dm_eng* lk, const _dm_xfer* x, const unsigned char* wire) {
    _dm_fp got;
    if (_dm_get32(wire) != _DM_FP_MAGIC) {
        _DM_FAIL(lk->c, DM_ERR_PROTOCOL, "%s: %s #%llu: rank %d (%s) sent malformed bytes (bad "
                 "fingerprint magic 0x%08x)", lk->tag, x->op, (unsigned long long)lk->c->seq, x->rpeer,
                 lk->links[x->rpeer]->where, (unsigned)_dm_get32(wire));
        return _dm_eng_break(lk, DM_ERR_PROTOCOL);
    }
    _dm_fp_decode(wire, &got);
    if (_DM_TRACED(lk->c)) _dm_trace_peer_seen(lk->c, x->rpeer, got.kind, got.seq);
    if (_dm_fp_equal(&got, x->expect)) return DM_OK;
    _dm_fp_mismatch(lk->c, lk->tag, lk->c->rank, x->expect, x->rpeer, &got);
    return _dm_eng_break(lk, DM_ERR_MISMATCH);
}

/* >>engine inbox  Point-to-point messages share each link's stream with the collectives,
   between them: a sender is never inside a collective on that link when it sends one.
   Receivers read them at boundaries through the inbox, match them to a dm_recv (x->want) by
   tag, in arrival order, or keep them as unexpected until one asks. */

/* want got message fp from peer: same dtype and count, or DM_ERR_MISMATCH naming both. */
_DM_PRIVATE dm_status _dm_eng_want_check(_dm_eng* lk, const _dm_xfer* x, int peer, const _dm_fp* got) {
    _dm_fp mine;
    const _dm_want* w = x->want;
    if (got->dtype == (int)w->dtype && got->count == (uint64_t)w->count) return DM_OK;
    _dm_fp_make(&mine, lk->c, _DM_K_RECV, (int)w->dtype, -1, w->tag, w->count);
    mine.seq = got->seq;
    _dm_fp_mismatch(lk->c, lk->tag, lk->c->rank, &mine, peer, got);
    return _dm_eng_break(lk, DM_ERR_MISMATCH);
}
/* Whether a message from peer with tag goes to the dm_recv x waits for: its peer (or any),
   its tag, and no other peer's message already filling its buffer. */
_DM_PRIVATE bool _dm_eng_want_takes(const _dm_xfer* x, int peer, int tag) {
    const _dm_want* w = x->want;
    return w && !w->done && w->from < 0 && (w->any || x->rpeer == peer) && tag == w->tag;
}
/* The first unexpected message from peer (peer < 0: from any peer, in the order this rank read
   them) with want's tag, copied into its buffer and freed: DM_OK with want->done and
   want->from set, DM_OK without them when there is none, or the mismatch. */
_DM_PRIVATE dm_status _dm_eng_take_unexpected(_dm_eng* lk, const _dm_xfer* x, int peer) {
    _dm_umsg **p = &lk->uhead, *m = NULL, *prev = NULL;
    for (; *p; prev = *p, p = &(*p)->next)
        if ((peer < 0 || (*p)->peer == peer) && (*p)->fp.root == x->want->tag) { m = *p; break; }
    if (!m) return DM_OK;
    peer = m->peer;
    _DM_TRY(_dm_eng_want_check(lk, x, peer, &m->fp));
    *p = m->next;
    if (lk->utail == m) lk->utail = prev;
    lk->ubytes -= m->bytes;
    if (m->bytes) memcpy(x->want->buf, m->data, m->bytes);
    _dm_free(&lk->c->allocator, m);
    x->want->from = peer;
    x->want->done = true;
    return DM_OK;
}
/* A whole header is in: a collective's fingerprint waits for its collective; a message's
   payload goes to the dm_recv waiting for its tag, else into a new unexpected message. */
_DM_PRIVATE dm_status _dm_eng_inbox_header(_dm_eng* lk, const _dm_xfer* x, int peer) {
    _dm_inbox* in = &lk->inbox[peer];
    _dm_fp fp;
    size_t bytes;
    in->hfill = 0;
    if (_dm_get32(in->hdr) != _DM_FP_MAGIC) {
        _DM_FAIL(lk->c, DM_ERR_PROTOCOL, "%s: %s: rank %d (%s) sent malformed bytes (bad header magic 0x%08x)",
                 lk->tag, x->op, peer, lk->links[peer]->where, (unsigned)_dm_get32(in->hdr));
        return _dm_eng_break(lk, DM_ERR_PROTOCOL);
    }
    _dm_fp_decode(in->hdr, &fp);
    if (fp.kind != _DM_K_SEND) { in->fp_ready = true; return DM_OK; }
    if (fp.dtype < 0 || fp.dtype >= DM_DTYPE_COUNT || fp.count > SIZE_MAX / 8) {
        _DM_FAIL(lk->c, DM_ERR_PROTOCOL, "%s: %s: rank %d (%s) sent a message header with dtype %d, count %llu",
                 lk->tag, x->op, peer, lk->links[peer]->where, fp.dtype, (unsigned long long)fp.count);
        return _dm_eng_break(lk, DM_ERR_PROTOCOL);
    }
    bytes = (size_t)fp.count * dm_dtype_size((dm_dtype)fp.dtype);
    in->payload = true;
    in->len = bytes;
    in->fill = in->padfill = 0;
    in->pad = _dm_eng_pad(lk->links[peer], bytes);
    if (_dm_eng_want_takes(x, peer, fp.root)) {
        _DM_TRY(_dm_eng_want_check(lk, x, peer, &fp));
        x->want->from = peer;   /* claimed: another peer's message with the tag is kept meanwhile */
        in->msg = NULL;
        in->dst = x->want->buf;
        return DM_OK;
    }
    if (bytes > _dm_object_limit(lk->c) - (lk->ubytes < _dm_object_limit(lk->c) ? lk->ubytes : _dm_object_limit(lk->c))) {
        _DM_FAIL(lk->c, DM_ERR_PROTOCOL, "%s: %s: rank %d sent a message of %zu bytes (tag %d) that no recv has "
                 "asked for yet, beyond the %llu bytes kept waiting (DISTMESH_MAX_OBJECT_BYTES)", lk->tag, x->op,
                 peer, bytes, fp.root, (unsigned long long)_dm_object_limit(lk->c));
        return _dm_eng_break(lk, DM_ERR_PROTOCOL);
    }
    in->msg = (_dm_umsg*)_dm_malloc(&lk->c->allocator, sizeof(_dm_umsg) + bytes);
    if (!in->msg) {
        _DM_FAIL(lk->c, DM_ERR_OUT_OF_MEMORY, "%s: %s: no memory to keep a message of %zu bytes from rank %d",
                 lk->tag, x->op, bytes, peer);
        return _dm_eng_break(lk, DM_ERR_OUT_OF_MEMORY);
    }
    in->msg->next = NULL;
    in->msg->peer = peer;
    in->msg->fp = fp;
    in->msg->bytes = bytes;
    in->msg->data = (unsigned char*)(in->msg + 1);
    in->dst = in->msg->data;
    lk->ubytes += bytes;
    return DM_OK;
}
/* A whole payload is in: the dm_recv is done, or the message joins the unexpected ones (and
   is taken at once if the waiting dm_recv wants its tag: nothing older with it can wait). */
_DM_PRIVATE dm_status _dm_eng_inbox_message(_dm_eng* lk, const _dm_xfer* x, int peer) {
    _dm_inbox* in = &lk->inbox[peer];
    _dm_umsg* m = in->msg;
    in->payload = false;
    in->msg = NULL;
    if (!m) { x->want->done = true; return DM_OK; }
    if (lk->utail) lk->utail->next = m; else lk->uhead = m;
    lk->utail = m;
    if (_dm_eng_want_takes(x, peer, m->fp.root)) return _dm_eng_take_unexpected(lk, x, peer);
    return DM_OK;
}
/* Reads peer's inbox as far as it can: until x->want is done, the link is empty, or the next
   collective's fingerprint is in (which a dm_recv cannot wait past: that peer will send
   nothing more before this rank joins the collective, so it fails with DM_ERR_MISMATCH; a
   dm_recv from any source leaves that peer and reads the others). */
_DM_PRIVATE dm_status _dm_eng_pump_inbox(_dm_eng* lk, const _dm_xfer* x, _dm_xstate* s, int peer, bool* progress) {
    _dm_inbox* in = &lk->inbox[peer];
    _dm_link* l = lk->links[peer];
    for (;;) {
        unsigned char sink[8];
        ptrdiff_t k;
        int err = 0;
        if (x->want && x->want->done) return DM_OK;
        if (in->fp_ready) {
            _dm_fp theirs, mine;
            if (!x->want || x->want->any) return DM_OK;
            _dm_fp_decode(in->hdr, &theirs);
            _dm_fp_make(&mine, lk->c, _DM_K_RECV, (int)x->want->dtype, -1, x->want->tag, x->want->count);
            mine.seq = lk->c->seq;
            _dm_fp_mismatch(lk->c, lk->tag, lk->c->rank, &mine, peer, &theirs);
            return _dm_eng_break(lk, DM_ERR_MISMATCH);
        }
        if (!in->payload) k = l->vt->recv(l, in->hdr + in->hfill, 32 - in->hfill, &err);
        else if (in->fill < in->len) {
            size_t n = in->len - in->fill < _DM_ENG_IO_MAX ? in->len - in->fill : _DM_ENG_IO_MAX;
            k = l->vt->recv(l, in->dst + in->fill, n, &err);
        } else if (in->padfill < in->pad) k = l->vt->recv(l, sink, in->pad - in->padfill, &err);
        else { _DM_TRY(_dm_eng_inbox_message(lk, x, peer)); *progress = true; continue; }
        if (k == 0) { s->want_in = true; return DM_OK; }
        if (k < 0) return _dm_eng_io_fail(lk, x, peer, false, err);
        *progress = true;
        if (!in->payload) {
            in->hfill += (size_t)k;
            if (in->hfill == 32) _DM_TRY(_dm_eng_inbox_header(lk, x, peer));
        } else if (in->fill < in->len) in->fill += (size_t)k;
        else in->padfill += (size_t)k;
    }
}

/* A dm_recv from any source reads every connected peer's inbox in turn, until one message
   with its tag is in (links made meanwhile, by a peer that connects to this rank on demand,
   are read from the next round on). */
_DM_PRIVATE dm_status _dm_eng_pump_any(_dm_eng* lk, const _dm_xfer* x, _dm_xstate* s, bool* progress) {
    int p;
    for (p = 0; p < lk->c->size && !x->want->done; p++)
        if (p != lk->c->rank && lk->links[p]) _DM_TRY(_dm_eng_pump_inbox(lk, x, s, p, progress));
    if (!x->want->done) s->want_in = true;      /* waits for bytes, or for a peer to connect */
    return DM_OK;
}
/* A send that cannot move reads what every other peer sent too: in a ring of large sends
   (each rank sending to the next before receiving from the previous) every rank's link fills,
   and only the receivers' reading frees them. */
_DM_PRIVATE dm_status _dm_eng_drain_others(_dm_eng* lk, const _dm_xfer* x, _dm_xstate* s, bool* progress) {
    int p;
    for (p = 0; p < lk->c->size; p++)
        if (p != x->rpeer && lk->links[p]) _DM_TRY(_dm_eng_pump_inbox(lk, x, s, p, progress));
    return DM_OK;
}

/* >>engine pump  Moving one transfer's bytes without blocking: send steps as far as their
   gates allow (every ready step in one call on links with sendv), recv steps straight into
   place or reduced as they arrive (in place from links that can peek, else through scratch),
   and the padding after each step (_dm_eng_pad). */

/* How many bytes of send step i (at or after the current one) may go now: none before its
   after_recvs are in, and no more of a gated step than its recv step has made final. */
_DM_PRIVATE size_t _dm_eng_send_limit(const _dm_xfer* x, const _dm_xstate* s, int i) {
    const _dm_sstep* st = &x->ss[i];
    size_t limit = st->len;
    if (s->ri < st->after_recvs) return 0;
    if (st->gate >= 0) {
        size_t fin = st->gate < s->ri ? x->rs[st->gate].len : st->gate == s->ri ? s->rdone : 0;
        if (fin < limit) limit = fin;
    }
    return limit;
}
/* The pieces that may go now, from the current send step on: each step's ready bytes and its
   padding, up to the first step not wholly ready, _DM_LINK_IOV_MAX pieces, or 64 KiB gathered
   (beyond that a system call per step costs nothing worth saving). */
_DM_PRIVATE int _dm_eng_gather(const _dm_xfer* x, const _dm_xstate* s, const _dm_link* l, _dm_iov* iov) {
    static const unsigned char zeros[8] = { 0 };
    size_t total = 0;
    int n = 0, i;
    for (i = s->si; i < x->ns && n < _DM_LINK_IOV_MAX - 1 && total < ((size_t)64 << 10); i++) {
        const _dm_sstep* st = &x->ss[i];
        size_t from = i == s->si ? s->so : 0, limit = _dm_eng_send_limit(x, s, i);
        size_t pad = _dm_eng_pad(l, st->len) - (i == s->si ? s->spad : 0);
        if (from < limit) {
            size_t len = limit - from < _DM_ENG_IO_MAX ? limit - from : _DM_ENG_IO_MAX;
            iov[n].buf = st->buf + from; iov[n].len = len; n++;
            total += len;
            if (from + len < st->len) break;
        } else if (from < st->len) break;
        if (pad) { iov[n].buf = zeros; iov[n].len = pad; n++; total += pad; }
    }
    return n;
}
/* k bytes of the gathered pieces went: the send state moves past them. */
_DM_PRIVATE void _dm_eng_sent(const _dm_xfer* x, _dm_xstate* s, const _dm_link* l, size_t k) {
    while (k > 0) {
        const _dm_sstep* st = &x->ss[s->si];
        size_t pad = _dm_eng_pad(l, st->len), d;
        if (s->so < st->len) { d = st->len - s->so < k ? st->len - s->so : k; s->so += d; k -= d; }
        else if (s->spad < pad) { d = pad - s->spad < k ? pad - s->spad : k; s->spad += d; k -= d; }
        else { s->si++; s->so = s->spad = 0; }
    }
}
/* Links with sendv: every ready step in one call. */
_DM_PRIVATE dm_status _dm_eng_pump_sendv(_dm_eng* lk, const _dm_xfer* x, _dm_xstate* s, _dm_link* l, bool* progress) {
    for (;;) {
        _dm_iov iov[_DM_LINK_IOV_MAX];
        ptrdiff_t k;
        int n, err = 0;
        while (s->si < x->ns && s->so == x->ss[s->si].len && s->spad == _dm_eng_pad(l, x->ss[s->si].len)) {
            s->si++; s->so = s->spad = 0; *progress = true;
        }
        if (s->si == x->ns || (n = _dm_eng_gather(x, s, l, iov)) == 0) return DM_OK;
        k = l->vt->sendv(l, iov, n, &err);
        if (k > 0) { _dm_eng_sent(x, s, l, (size_t)k); *progress = true; continue; }
        if (k == 0) { s->want_out = true; return DM_OK; }
        return _dm_eng_io_fail(lk, x, x->speer, true, err);
    }
}

/* Sends as far as the gates allow, until the link is full. */
_DM_PRIVATE dm_status _dm_eng_pump_send(_dm_eng* lk, const _dm_xfer* x, _dm_xstate* s, bool* progress) {
    _dm_link* l = x->speer >= 0 ? lk->links[x->speer] : NULL;
    static const unsigned char zeros[8] = { 0 };
    if (l && l->vt->sendv) return _dm_eng_pump_sendv(lk, x, s, l, progress);
    while (s->si < x->ns) {
        const _dm_sstep* st = &x->ss[s->si];
        size_t limit, n;
        ptrdiff_t k;
        int err = 0;
        if (s->so == st->len) {
            size_t pad = _dm_eng_pad(l, st->len);
            if (s->spad < pad) {
                k = l->vt->send(l, zeros, pad - s->spad, &err);
                if (k > 0) { s->spad += (size_t)k; *progress = true; continue; }
                if (k == 0) { s->want_out = true; break; }
                return _dm_eng_io_fail(lk, x, x->speer, true, err);
            }
            s->si++; s->so = s->spad = 0; *progress = true;
            continue;
        }
        if (s->ri < st->after_recvs) break;
        limit = _dm_eng_send_limit(x, s, s->si);
        if (s->so >= limit) break;
        n = limit - s->so < _DM_ENG_IO_MAX ? limit - s->so : _DM_ENG_IO_MAX;
        k = l->vt->send(l, st->buf + s->so, n, &err);
        if (k > 0) { s->so += (size_t)k; *progress = true; continue; }
        if (k == 0) { s->want_out = true; break; }
        return _dm_eng_io_fail(lk, x, x->speer, true, err);
    }
    return DM_OK;
}

/* How many bytes of recv step r may be written at offset `from`: all, unless its after_send
   step has not sent them yet (it reads the same buffer). */
_DM_PRIVATE size_t _dm_eng_writable(const _dm_xstate* s, const _dm_rstep* r, size_t from) {
    size_t sent;
    if (r->after_send < 0 || r->after_send < s->si) return r->len - from;
    sent = r->after_send == s->si ? s->so : 0;
    return sent > from ? sent - from : 0;
}
/* One reduced piece of recv step r landed: out = own op piece (then / divide for MEAN). */
_DM_PRIVATE void _dm_eng_reduce_piece(const _dm_xfer* x, const _dm_rstep* r, size_t at, const unsigned char* piece,
                                      size_t bytes) {
    size_t esize = dm_dtype_size(x->dtype);
    unsigned char* out = r->buf + at;
    if (r->own + at != out) memcpy(out, r->own + at, bytes);
    dm_reduce_local(x->dtype, x->rop, out, piece, bytes / esize);
    if (r->divide > 0) dm_divide_local(x->dtype, out, bytes / esize, r->divide);
}
/* Reduces straight from a link that can peek. Returns false when the link has fewer readable
   contiguous bytes than one element (an element split at the ring's end goes through scratch). */
_DM_PRIVATE bool _dm_eng_reduce_in_place(const _dm_xfer* x, _dm_xstate* s, _dm_link* l, const _dm_rstep* r,
                                         bool* progress) {
    size_t esize = dm_dtype_size(x->dtype), n, room;
    const unsigned char* p = l->vt->peek(l, &n);
    if (((uintptr_t)p & (esize - 1)) != 0) return false;   /* links that peek pad to 8 (align) */
    if (n > r->len - s->rdone) n = r->len - s->rdone;
    room = _dm_eng_writable(s, r, s->rdone);
    if (n > room) n = room;
    n -= n % esize;
    if (n == 0) return false;
    _dm_eng_reduce_piece(x, r, s->rdone, p, n);
    l->vt->consume(l, n);
    s->rdone += n;
    *progress = true;
    return true;
}

/* Receives: straight into place, or reduced as it arrives. */
_DM_PRIVATE dm_status _dm_eng_pump_recv(_dm_eng* lk, const _dm_xfer* x, _dm_xstate* s, bool* progress) {
    _dm_link* l = x->rpeer >= 0 ? lk->links[x->rpeer] : NULL;
    unsigned char* tmp = x->tmp ? x->tmp : lk->tmp;
    size_t esize = dm_dtype_size(x->dtype);
    while (s->ri < x->nr) {
        const _dm_rstep* r = &x->rs[s->ri];
        unsigned char* dst;
        size_t want;
        ptrdiff_t k;
        int err = 0;
        if (s->rdone == r->len) {
            size_t pad = _dm_eng_pad(l, r->len);
            if (s->rpad < pad) {
                unsigned char sink[8];
                k = l->vt->recv(l, sink, pad - s->rpad, &err);
                if (k > 0) { s->rpad += (size_t)k; *progress = true; continue; }
                if (k == 0) { s->want_in = true; break; }
                return _dm_eng_io_fail(lk, x, x->rpeer, false, err);
            }
            if (s->ri == 0 && x->expect) _DM_TRY(_dm_eng_check_fp(lk, x, r->buf));
            s->ri++; s->rdone = s->tfill = s->rpad = 0; *progress = true;
            continue;
        }
        if (s->ri == 0 && x->expect && s->rdone == 0) {   /* the fingerprint comes through the inbox */
            _dm_inbox* in = &lk->inbox[x->rpeer];
            if (!in->fp_ready) _DM_TRY(_dm_eng_pump_inbox(lk, x, s, x->rpeer, progress));
            if (!in->fp_ready) break;
            memcpy(r->buf, in->hdr, 32);
            in->fp_ready = false;
            s->rdone = 32;
            *progress = true;
            continue;
        }
        if (!r->own) {
            dst = r->buf + s->rdone; want = r->len - s->rdone;
        } else {
            size_t clen;
            if (l->vt->peek && s->tfill == 0 && _dm_eng_reduce_in_place(x, s, l, r, progress)) continue;
            /* through scratch: a chunk, or one element where peeking cannot serve it */
            clen = l->vt->peek ? esize : lk->chunk;
            if (clen > r->len - s->rdone) clen = r->len - s->rdone;
            if (s->tfill == clen) {
                if (_dm_eng_writable(s, r, s->rdone) < clen) break;
                _dm_eng_reduce_piece(x, r, s->rdone, tmp, clen);
                s->rdone += clen; s->tfill = 0; *progress = true;
                continue;
            }
            dst = tmp + s->tfill; want = clen - s->tfill;
        }
        if (want > _DM_ENG_IO_MAX) want = _DM_ENG_IO_MAX;
        k = l->vt->recv(l, dst, want, &err);
        if (k > 0) {
            if (r->own) s->tfill += (size_t)k; else s->rdone += (size_t)k;
            *progress = true;
            continue;
        }
        if (k == 0) { s->want_in = true; break; }
        return _dm_eng_io_fail(lk, x, x->rpeer, false, err);
    }
    return DM_OK;
}

/* >>engine loop  Driving transfers to the end (_dm_eng_run_n): each round pumps every transfer;
   with nothing to move, a wait spins, then yields, then blocks (poll on sockets, the bell on
   memory links) under the collective's deadline. Before a transfer starts, its peers are
   checked against P (>>peers) and their links made where missing (the backend's connect). */

_DM_PRIVATE void _dm_cpu_relax(void) {
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
    __builtin_ia32_pause();
#elif (defined(__GNUC__) || defined(__clang__)) && defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

#if defined(POLLRDHUP)
#define _DM_POLLRDHUP POLLRDHUP
#elif defined(__linux__) && !defined(__sparc__)
#define _DM_POLLRDHUP 0x2000        /* Linux's value (GNU-only in glibc's <poll.h>; >>libc) */
#else
#define _DM_POLLRDHUP 0
#endif
/* A rank these transfers wait on over memory that last waited on this rank's core, or -1. A
   busy host now and then runs two ranks of one group on one core; a spin there only keeps the
   peer off the core, so the wait goes straight on to yielding it. */
_DM_PRIVATE int _dm_eng_peer_beside(_dm_eng* lk, const _dm_xfer* xs, int n) {
#if defined(_DM_HAS_SCHED_GETCPU)
    int cpu = sched_getcpu() + 1, j, k;
    if (!lk->bell || cpu <= 0) return -1;
    if (__atomic_load_n(&lk->bell->cpu, __ATOMIC_RELAXED) != cpu) __atomic_store_n(&lk->bell->cpu, cpu, __ATOMIC_RELAXED);
    for (j = 0; j < n; j++)
        for (k = 0; k < 2; k++) {
            int peer = k ? xs[j].speer : xs[j].rpeer;
            _dm_link* l = peer >= 0 ? lk->links[peer] : NULL;
            if (l && l->fd < 0 && __atomic_load_n(&((_dm_memlink*)l)->peer_bell->cpu, __ATOMIC_RELAXED) == cpu) return peer;
        }
#else
    (void)lk; (void)xs; (void)n;
#endif
    return -1;
}
/* Two ranks that each have a core of their own (spin_us > 0) but run on one: the slow mode of
   some launches. Once the scheduler has put the two on one core, each wait yields the core to
   the other, every message costs two context switches (at 4 KiB between two ranks: 3.3-3.7 us
   a call instead of 1.1-1.2, the whole launch long), and the scheduler does not part them,
   because they always ran a moment ago (cache hot). So after _DM_ENG_BESIDE_LOOKS looks in a
   row that found the peer on this core, the higher of the two ranks moves off it: its affinity
   mask without this core, which migrates it at once, then the mask it had, so the placement
   stays the scheduler's (and the caller's: a rank pinned to one core, or to the peer's, stays).
   At most once per _DM_ENG_MOVE_GAP_US, so a host that truly lacks the cores does not thrash. */
#define _DM_ENG_BESIDE_LOOKS 64
#define _DM_ENG_MOVE_GAP_US  50000
_DM_PRIVATE void _dm_eng_move_off(_dm_eng* lk, int peer, int64_t now) {
#if defined(_DM_HAS_SCHED_GETCPU) && defined(SYS_sched_getaffinity) && defined(SYS_sched_setaffinity)
    unsigned long mask[16], off[16];    /* 1024 cpus; a larger host keeps its placement */
    const int bits = (int)(8 * sizeof(unsigned long));
    long n;
    int cpu, w, others = 0;
    if (peer < 0) { lk->beside_looks = 0; return; }
    if (++lk->beside_looks < _DM_ENG_BESIDE_LOOKS || lk->c->rank < peer) return;
    if (lk->moved_us != 0 && now - lk->moved_us < _DM_ENG_MOVE_GAP_US) return;
    lk->beside_looks = 0;
    lk->moved_us = now;
    cpu = sched_getcpu();
    memset(mask, 0, sizeof(mask));
    n = syscall(SYS_sched_getaffinity, 0, sizeof(mask), mask);  /* this thread's; bytes copied */
    if (n <= 0 || cpu < 0 || cpu >= (int)(8 * (size_t)n)) return;
    memcpy(off, mask, sizeof(off));
    off[cpu / bits] &= ~(1ul << (cpu % bits));
    for (w = 0; w < (int)((size_t)n / sizeof(unsigned long)); w++) others |= off[w] != 0;
    if (!others) return;                                        /* pinned here: stay */
    if (syscall(SYS_sched_setaffinity, 0, (size_t)n, off) == 0)
        (void)syscall(SYS_sched_setaffinity, 0, (size_t)n, mask);
#else
    (void)lk; (void)peer; (void)now;
#endif
}
_DM_PRIVATE int _dm_eng_fd(_dm_link* l, bool out) { return l->vt->pollfd ? l->vt->pollfd(l, out) : l->fd; }
/* Whether transfer x has moved everything (and, for a dm_recv, has its message). */
_DM_PRIVATE bool _dm_eng_xfer_done(const _dm_xfer* x, const _dm_xstate* s) {
    return s->si == x->ns && s->ri == x->nr && (!x->want || x->want->done);
}
/* The pollfds one waiting transfer needs, appended at p[*np]; *memory is set when it waits on
   a memory link. Returns the index of its send peer's hang-up entry, or -1. */
_DM_PRIVATE int _dm_eng_poll_xfer(_dm_eng* lk, const _dm_xfer* x, const _dm_xstate* s, struct pollfd* p, int* np,
                                  bool* memory) {
    _dm_link* sl = x->speer >= 0 && s->si < x->ns ? lk->links[x->speer] : NULL;
    _dm_link* rl = x->rpeer >= 0 && (s->ri < x->nr || x->inbox) ? lk->links[x->rpeer] : NULL;
    int hup = -1, k;
    if ((sl && sl->fd < 0) || (rl && rl->fd < 0)) *memory = true;
    if (sl && rl && sl == rl && sl->fd >= 0 && _dm_eng_fd(sl, true) == _dm_eng_fd(rl, false)) {
        p[*np].fd = _dm_eng_fd(sl, true);
        p[*np].events = (short)((s->want_out ? POLLOUT : 0) | (s->want_in ? POLLIN : 0)); (*np)++;
    } else {
        /* the send peer's hang-up (while we still owe it bytes; once done it may leave): RDHUP,
           which bytes it sends us do not raise */
        if (sl && sl->fd >= 0) {
            hup = *np;
            p[*np].fd = _dm_eng_fd(sl, true); p[*np].events = (short)(_DM_POLLRDHUP | (s->want_out ? POLLOUT : 0)); (*np)++;
        }
        if (rl && rl->fd >= 0 && s->want_in) { p[*np].fd = _dm_eng_fd(rl, false); p[*np].events = POLLIN; (*np)++; }
    }
    /* a blocked send also waits for the other peers' bytes; a recv from any source for all */
    if (x->inbox && (x->want ? x->want->any : sl != NULL))
        for (k = 0; k < lk->c->size; k++) {
            _dm_link* o = lk->links[k];
            if (!o || k == x->rpeer || lk->inbox[k].fp_ready) continue;
            if (o->fd >= 0) { p[*np].fd = _dm_eng_fd(o, false); p[*np].events = POLLIN; (*np)++; }
            else *memory = true;
        }
    return hup;
}
/* The blocking phase of a wait on n transfers: sleep until a link may move, a slice passes, or
   the deadline. Sockets sleep in poll(); memory links on this rank's bell, waking every 50 ms
   to ask whether their peers still live (a backend may ring the bell when one dies: the TCP
   backend's shm watcher does); a mix polls the sockets briefly and goes round again. Once a
   peer was seen gone, the next look comes at once, without sleeping. */
_DM_PRIVATE dm_status _dm_eng_block(_dm_eng* lk, const _dm_xfer* xs, const _dm_xstate* s, int n, uint32_t seen,
                                    int64_t deadline, int* dead) {
    struct pollfd* p = lk->pfds;
    int np = 0, hup[_DM_ENG_XFER_MAX], rc, err = 0, j, k;
    bool memory = false;
    int64_t left = deadline - _dm_now_ms();
    int slice = left > 1000 ? 1000 : (int)left;
    for (j = 0; j < n; j++)
        hup[j] = _dm_eng_xfer_done(&xs[j], &s[j]) ? -1 : _dm_eng_poll_xfer(lk, &xs[j], &s[j], p, &np, &memory);
    if (memory && np == 0 && lk->bell) {
        if (*dead == 0) lk->bell_ops->wait(lk->bell_ops->ctx, lk->bell, seen, slice < 50 ? slice : 50);
    } else {
        if (lk->poll_fill) np += lk->poll_fill(lk, p + np, _DM_ENG_SERVICE_FDS);
        rc = poll(p, (nfds_t)np, memory ? (slice < 1 ? slice : 1) : slice);
        if (rc < 0 && errno != EINTR) {
            _DM_FAIL(lk->c, DM_ERR_NETWORK, "%s: %s #%llu: poll failed (%s)", lk->tag, xs[0].op,
                     (unsigned long long)lk->c->seq, strerror(errno));
            return _dm_eng_break(lk, DM_ERR_NETWORK);
        }
        for (j = 0; rc > 0 && j < n; j++)
            if (hup[j] >= 0 && (p[hup[j]].revents & (_DM_POLLRDHUP | POLLHUP | POLLERR))) {
                socklen_t len = sizeof(err);
                getsockopt(p[hup[j]].fd, SOL_SOCKET, SO_ERROR, &err, &len);
                return _dm_eng_io_fail(lk, &xs[j], xs[j].speer, true, err);
            }
    }
    if (lk->service) lk->service(lk);   /* a rank connecting to this one is answered from here */
    /* memory links: a peer that died cannot ring; ask its side channel. Seen twice in a row
       with no progress between (bytes it wrote before dying are taken first) means lost. */
    for (j = 0; j < n; j++) {
        const _dm_xfer* x = &xs[j];
        bool any = x->want && x->want->any;
        if (_dm_eng_xfer_done(x, &s[j])) continue;
        for (k = 0; k < (any ? lk->c->size : 2); k++) {
            int peer = any ? (k != lk->c->rank ? k : -1)
                     : k == 0 ? (s[j].ri < x->nr || x->inbox ? x->rpeer : -1) : (s[j].si < x->ns ? x->speer : -1);
            _dm_link* l = peer >= 0 ? lk->links[peer] : NULL;
            if (!l || l->fd >= 0 || !l->vt->alive || l->vt->alive(l, &err) == 0) continue;
            if (++*dead < 2) return DM_OK;
            return _dm_eng_io_fail(lk, x, peer, !any && k != 0, err);
        }
    }
    return DM_OK;
}

/* The links to a transfer's peers before it starts: there, or made now by the backend
   (connect, given both missing peers at once so it can make them in the order that cannot
   deadlock). */
_DM_PRIVATE dm_status _dm_eng_ensure(_dm_eng* lk, const _dm_xfer* x, int64_t deadline) {
    char why[DM_LAST_ERROR_SIZE];
    int need[2], n = 0;
    dm_status st;
    if (x->speer >= 0 && !lk->links[x->speer]) need[n++] = x->speer;
    if (x->rpeer >= 0 && x->rpeer != x->speer && !lk->links[x->rpeer]) need[n++] = x->rpeer;
    if (n == 0) return DM_OK;
    if (!lk->connect) {
        _DM_FAIL(lk->c, DM_ERR_INTERNAL, "%s: %s #%llu: no link to rank %d", lk->tag, x->op,
                 (unsigned long long)lk->c->seq, need[0]);
        return _dm_eng_break(lk, DM_ERR_INTERNAL);
    }
    if (deadline == 0) deadline = _dm_deadline(lk->c->timeout_ms);    /* _dm_eng_run sets its own at the first wait */
    st = lk->connect(lk, need, n, deadline);
    if (st == DM_OK && (x->speer < 0 || lk->links[x->speer]) && (x->rpeer < 0 || lk->links[x->rpeer])) return DM_OK;
    if (_dm_eng_adopt_abort(lk, x->op) != DM_OK) return lk->broken;
    if (st == DM_ERR_PEER_LOST && _dm_eng_adopt_notice(lk, x->op) != DM_OK) return lk->broken;
    if (st == DM_OK) st = DM_ERR_INTERNAL;
    _dm_copy_name(why, sizeof(why), _dm_errbuf(lk->c));
    _DM_FAIL(lk->c, st, "%s: %s #%llu: %s", lk->tag, x->op, (unsigned long long)lk->c->seq, why);
    return _dm_eng_break(lk, st);
}
/* A fixed-peer schedule's transfer with a peer outside P (>>peers): P is out of date. */
_DM_PRIVATE dm_status _dm_eng_check_peer(_dm_eng* lk, const _dm_xfer* x, int peer) {
    if (peer < 0 || !lk->peers || lk->on_demand || lk->peers[peer]) return DM_OK;
    _DM_FAIL(lk->c, DM_ERR_INTERNAL, "%s: %s #%llu: rank %d is not among the peers this rank's schedules use "
             "(_dm_peers_find is out of date with the schedules)", lk->tag, x->op, (unsigned long long)lk->c->seq, peer);
    return _dm_eng_break(lk, DM_ERR_INTERNAL);
}

/* Whether an unfinished transfer waits to receive (bytes, or a dm_recv's message), else to send. */
_DM_PRIVATE bool _dm_eng_recv_wait(const _dm_xfer* x, const _dm_xstate* s) {
    return s->ri < x->nr || (x->want && !x->want->done);
}
/* Drives n transfers (at most _DM_ENG_XFER_MAX, on links to different peers) to the end
   together: each round moves what it can on each; with nothing to move it waits, spinning
   first, then yielding, then blocking, all under the collective's deadline (counted from the
   first clock read: one that never waits needs no clock). While spinning, and in the first
   idle rounds, the clock is read every 16th round only, so bytes that land are seen a clock
   read sooner. Running two or three at once is
   how a schedule overlaps phases on different links (the two-level all-reduce's host ring on
   shared memory and its rail across hosts; the three-level gathers' host ring, site rail and
   cross rail); each needs its own scratch (_dm_xfer.tmp). */
_DM_PRIVATE dm_status _dm_eng_run_n(_dm_eng* lk, const _dm_xfer* xs, int n) {
    _dm_xstate s[_DM_ENG_XFER_MAX];
    int64_t deadline = 0, idle_since = 0;
    int dead = 0, j, first = 0;     /* first: the first transfer not done */
    unsigned quiet = 0;             /* idle rounds since the last progress */
    uint32_t seen = 0;
    bool blocking = false, spinning = false;
    int wait_peer = -1;             /* the peer an idle spell waits on (>>trace) */
    dm_status st = DM_OK;
    for (j = 0; j < n && lk->used; j++) {
        if (xs[j].speer >= 0) lk->used[xs[j].speer] = true;
        if (xs[j].rpeer >= 0) lk->used[xs[j].rpeer] = true;
    }
    if (lk->dry) return DM_OK;
    for (j = 0; j < n; j++) {
        _DM_TRY(_dm_eng_check_peer(lk, &xs[j], xs[j].speer));
        _DM_TRY(_dm_eng_check_peer(lk, &xs[j], xs[j].rpeer));
        _DM_TRY(_dm_eng_ensure(lk, &xs[j], deadline));
    }
    memset(s, 0, sizeof(s[0]) * (size_t)n);
    for (;;) {
        bool progress = false, done = true;
        if (blocking && lk->bell) {     /* announce the sleep before the last look (see _dm_bell) */
            __atomic_store_n(&lk->bell->sleeping, 1u, __ATOMIC_SEQ_CST);
            seen = __atomic_load_n(&lk->bell->seq, __ATOMIC_SEQ_CST);
            _dm_bell_announced(lk->bell_ops);           /* the last look comes after both */
        }
        for (j = first; j < n && st == DM_OK; j++) {
            const _dm_xfer* x = &xs[j];
            _dm_xstate* sj = &s[j];
            sj->want_in = sj->want_out = false;
            if (_dm_eng_xfer_done(x, sj)) continue;
            st = _dm_eng_pump_send(lk, x, sj, &progress);
            if (st == DM_OK) st = _dm_eng_pump_recv(lk, x, sj, &progress);
            if (st == DM_OK && x->want && x->want->any) st = _dm_eng_pump_any(lk, x, sj, &progress);
            else if (st == DM_OK && x->inbox && (x->want || sj->si < x->ns))
                st = _dm_eng_pump_inbox(lk, x, sj, x->rpeer, &progress);
            if (st == DM_OK && x->inbox && !x->want && !progress && sj->si < x->ns)
                st = _dm_eng_drain_others(lk, x, sj, &progress);
            if (!_dm_eng_xfer_done(x, sj)) done = false;
        }
        /* stay announced through the sleep: a peer that writes after the last look must ring */
        if (blocking && lk->bell && (st != DM_OK || progress))
            __atomic_store_n(&lk->bell->sleeping, 0u, __ATOMIC_SEQ_CST);
        if (st != DM_OK) return st;
        if (progress && idle_since && _DM_TRACED(lk->c))
            _dm_trace_waited(lk->c, wait_peer, idle_since);
        if (done) return DM_OK;
        while (_dm_eng_xfer_done(&xs[first], &s[first])) first++;
        if (progress) { idle_since = 0; quiet = 0; blocking = spinning = false; dead = 0; continue; }
        for (j = first; j < n; j++)
            if (!_dm_eng_xfer_done(&xs[j], &s[j]) && !s[j].want_in && !s[j].want_out) {
                _DM_FAIL(lk->c, DM_ERR_INTERNAL, "%s: %s #%llu: transfer stalled (send step %d, recv step %d)",
                         lk->tag, xs[j].op, (unsigned long long)lk->c->seq, s[j].si, s[j].ri);
                return _dm_eng_break(lk, DM_ERR_INTERNAL);
            }
        /* the first 15 idle rounds spin too, unclocked: a small message is often there by then */
        if ((spinning || (idle_since == 0 && lk->spin_us > 0)) && (++quiet & 15) != 0) continue;
        {
            int64_t now = _dm_now_us(), idle;
            const _dm_xfer* x = &xs[first];
            if (idle_since == 0) {
                idle_since = now;
                wait_peer = _dm_eng_recv_wait(x, &s[first]) ? x->rpeer : x->speer;
                if (deadline == 0) deadline = lk->c->timeout_ms < 0 ? INT64_MAX : now / 1000 + lk->c->timeout_ms;
                if (_DM_TRACED(lk->c)) _dm_trace_idle(lk->c, false);
            }
            idle = now - idle_since;
            if (idle < lk->spin_us) {
                int beside = _dm_eng_peer_beside(lk, xs + first, n - first);
                _dm_eng_move_off(lk, beside, now);
                spinning = beside < 0;
            } else spinning = false;
            if (spinning) { _dm_cpu_relax(); continue; }
            st = _dm_eng_adopt_abort(lk, x->op);
            if (st == DM_OK && now / 1000 >= deadline) {
                bool recv_wait = _dm_eng_recv_wait(x, &s[first]);
                int peer = recv_wait ? x->rpeer : x->speer;
                if (_DM_TRACED(lk->c)) _dm_trace_wait(lk->c, peer, now - idle_since);
                if (peer < 0)   /* a recv from any source */
                    _DM_FAIL(lk->c, DM_ERR_TIMEOUT, "%s: %s #%llu timed out after %d ms waiting to receive a "
                             "message with tag %d from any rank", lk->tag, x->op, (unsigned long long)lk->c->seq,
                             lk->c->timeout_ms, x->want->tag);
                else
                    _DM_FAIL(lk->c, DM_ERR_TIMEOUT, "%s: %s #%llu timed out after %d ms waiting to %s rank %d (%s)",
                             lk->tag, x->op, (unsigned long long)lk->c->seq, lk->c->timeout_ms,
                             recv_wait ? "receive from" : "send to", peer, lk->links[peer]->where);
                st = _dm_eng_break(lk, DM_ERR_TIMEOUT);
            }
            if (st != DM_OK) break;
            if (idle < lk->yield_us) { sched_yield(); continue; }
            if (!blocking && lk->bell) { blocking = true; continue; }  /* one more look, announced */
            if (_DM_TRACED(lk->c)) _dm_trace_idle(lk->c, true);
            st = _dm_eng_block(lk, xs + first, s + first, n - first, seen, deadline, &dead);
            if (st != DM_OK) break;
        }
    }
    if (lk->bell) __atomic_store_n(&lk->bell->sleeping, 0u, __ATOMIC_SEQ_CST);
    return st;
}
_DM_PRIVATE dm_status _dm_eng_run(_dm_eng* lk, const _dm_xfer* x) { return _dm_eng_run_n(lk, x, 1); }

/* A transfer whose peer the caller's arguments choose (point-to-point, all_to_all, the rooted
   collectives' meetings with the root): outside P (>>peers), connected on demand. */
_DM_PRIVATE dm_status _dm_eng_run_on_demand(_dm_eng* lk, const _dm_xfer* x) {
    dm_status st;
    lk->on_demand = true;
    st = _dm_eng_run(lk, x);
    lk->on_demand = false;
    return st;
}

/* >>eager  A small exchange over memory links, mostly without the engine: the fingerprint and
   payload go in one publish when they fit, and the peer's, when they land within a few looks,
   are checked and taken straight from its ring. Anything else (no room, the peer's bytes not
   there yet or split at the ring's end, a point-to-point message first in line, an inbox
   mid-message, a dry run) leaves what is left to _dm_eng_run, with the same checks and waits.
   The wire bytes are the engine's; it only saves the bookkeeping, which is most of an 8-byte
   all-reduce between two cores.

   The one exception to the layers. Everywhere else the engine knows a link by its ops table
   alone; here it (1) tells a memory link by its ops (peek == _dm_mem_peek: the shared-memory
   links and the threaded world's, which _dm_memlink_new alone makes, base first, so the cast
   to _dm_memlink holds), (2) calls the ring's functions directly (the room left, one gathered
   publish, bytes read in place) and (3) reads the per-peer state the loop would have kept (the
   inbox, P's bookkeeping). Allowed because it is the whole cost of the smallest collectives on
   one host, and the layered way (ops for "room for n bytes" and "n whole bytes in place" on
   every link) would serve this transport only: a socket can promise neither.
   What it may assume: the exchange's steps are the fingerprint and one payload each way
   (_dm_eng_exchange builds nothing else); between engine calls every link is at a message
   boundary both ways (a transfer returns only when done, and after a failure the group is
   broken and no exchange runs), except the receiving inbox, which it checks.
   What keeps it correct: the same bytes (the engine's gather, padding included, so a peer on
   the engine's path reads them alike); all or nothing on each side (the whole message is
   published or none; the peer's is taken only whole and contiguous, never a point-to-point
   header); the engine's checks and reduction (_dm_eng_check_fp, _dm_eng_reduce_piece: the same
   order, the same bits); P recorded as the loop records it, and left to the loop where a peer
   is outside P; and test_shm_eager_stream (tests/test_tcp.c), which drives every fallback. */
#define _DM_EAGER_MAX ((size_t)256)     /* payload bytes each way */
#define _DM_EAGER_LOOKS 64

_DM_PRIVATE bool _dm_eng_eager_ok(const _dm_eng* lk, const _dm_xfer* x) {
    const _dm_link *sl, *rl;
    const _dm_inbox* in;
    if (lk->dry || x->speer < 0 || x->rpeer < 0 || x->ss[1].len > _DM_EAGER_MAX || x->rs[1].len > _DM_EAGER_MAX)
        return false;
    if (lk->peers && !lk->on_demand && (!lk->peers[x->speer] || !lk->peers[x->rpeer])) return false;
    sl = lk->links[x->speer]; rl = lk->links[x->rpeer]; in = &lk->inbox[x->rpeer];
    return sl && rl && sl->vt->peek == _dm_mem_peek && rl->vt->peek == _dm_mem_peek && in->hfill == 0 &&
           !in->fp_ready && !in->payload;
}
/* Both send steps (fingerprint, then step 1 with its padding) in one publish, or nothing. */
_DM_PRIVATE bool _dm_eng_eager_send(_dm_eng* lk, const _dm_xfer* x) {
    _dm_link* l = lk->links[x->speer];
    size_t total = 32 + x->ss[1].len + _dm_eng_pad(l, x->ss[1].len);
    _dm_iov iov[_DM_LINK_IOV_MAX];
    _dm_xstate start;
    int n, err = 0;
    if (_dm_mem_room((_dm_memlink*)l, total) < total) return false;
    memset(&start, 0, sizeof(start));
    n = _dm_eng_gather(x, &start, l, iov);
    if (lk->used) lk->used[x->speer] = true;
    return _dm_mem_sendv(l, iov, n, &err) == (ptrdiff_t)total;
}
/* The peer's fingerprint and step 1, when whole and contiguous in its ring within a few looks:
   true with *st set (the fingerprint's verdict), else false with nothing taken. */
_DM_PRIVATE bool _dm_eng_eager_recv(_dm_eng* lk, const _dm_xfer* x, dm_status* st) {
    _dm_link* l = lk->links[x->rpeer];
    const _dm_rstep* r = &x->rs[1];
    size_t len = r->len, total = 32 + len + _dm_eng_pad(l, len), n = 0;
    const unsigned char* p = NULL;
    int look, looks = lk->spin_us > 0 ? _DM_EAGER_LOOKS : 1;     /* without a core each, no spin */
    p = _dm_mem_peek(l, &n);
    if (n < total && _DM_TRACED(lk->c))
        _dm_trace_idle(lk->c, false);       /* a wait: where the flight recorder reads its clock */
    for (look = 1; look < looks && n < total; look++) p = _dm_mem_peek(l, &n);
    if (n < total || _dm_get32(p) != _DM_FP_MAGIC || p[4] == _DM_K_SEND) return false;
    if (r->own && ((uintptr_t)(p + 32) & (dm_dtype_size(x->dtype) - 1)) != 0) return false;
    if (lk->used) lk->used[x->rpeer] = true;
    *st = _dm_eng_check_fp(lk, x, p);
    if (*st != DM_OK) return true;
    if (r->own) _dm_eng_reduce_piece(x, r, 0, p + 32, len);
    else if (len) memcpy(r->buf, p + 32, len);
    _dm_mem_consume(l, total);
    return true;
}

/* >>exchange  One step with one peer each way (or two): a fingerprint, then the payload,
   received straight or reduced as it arrives (_dm_eng_exchange); most schedules are made of
   these (_dm_eng_sendrecv, _dm_eng_sendrecv_reduce). Small ones over memory links go the eager
   way when they can (>>eager). Fingerprint buffers live on the caller's stack; step 0 of both
   streams carries them. */
typedef struct _dm_fpbufs { unsigned char out[32], in[32]; } _dm_fpbufs;

_DM_PRIVATE void _dm_fp_steps(_dm_fpbufs* b, const _dm_fp* fp, _dm_sstep* s, _dm_rstep* r) {
    _dm_fp_encode(fp, b->out);
    if (s) { s->buf = b->out; s->len = 32; s->gate = -1; s->after_recvs = 0; }
    if (r) { memset(r, 0, sizeof(*r)); r->buf = b->in; r->len = 32; r->after_send = -1; }
}

/* Exchange with one peer (or two): send slen bytes of sbuf to speer and receive rlen bytes from
   rpeer into rbuf, each preceded by a fingerprint: fp goes out, and what arrives must equal
   expect (the same as fp, except where the two sides of a pair describe it from their ends:
   all_to_all). speer/rpeer -1 = that direction is idle. With reduce, what arrives is reduced
   into rbuf instead (rbuf = rbuf op received, read in place from links that can peek: one copy
   less than receiving into scratch); rbuf may then also be what is sent, and is written only
   behind the bytes already sent. */
_DM_PRIVATE dm_status _dm_eng_exchange(_dm_eng* lk, const char* op, const _dm_fp* fp, const _dm_fp* expect, int speer,
                                       const void* sbuf, size_t slen, int rpeer, void* rbuf, size_t rlen, bool reduce,
                                       dm_dtype dtype, dm_reduce_op rop) {
    _dm_sstep ss[2];
    _dm_rstep rs[2];
    _dm_fpbufs b;
    _DM_ZERO(_dm_xfer, x);
    _dm_fp_steps(&b, fp, &ss[0], &rs[0]);
    ss[1].buf = (const unsigned char*)sbuf; ss[1].len = slen; ss[1].gate = -1; ss[1].after_recvs = 0;
    memset(&rs[1], 0, sizeof(rs[1]));
    rs[1].buf = (unsigned char*)rbuf; rs[1].len = rlen;
    rs[1].own = reduce ? (const unsigned char*)rbuf : NULL;
    rs[1].after_send = reduce && speer >= 0 && sbuf == rbuf ? 1 : -1;
    x.op = op; x.speer = speer; x.rpeer = rpeer; x.ss = ss; x.rs = rs;
    x.ns = speer >= 0 ? 2 : 0; x.nr = rpeer >= 0 ? 2 : 0;
    x.dtype = reduce ? dtype : DM_UINT8; x.rop = reduce ? rop : DM_SUM; x.expect = expect;
    if (_dm_eng_eager_ok(lk, &x) && _dm_eng_eager_send(lk, &x)) {
        dm_status st;
        if (_dm_eng_eager_recv(lk, &x, &st)) return st;
        x.speer = -1; x.ns = 0;             /* sent: the engine only receives */
        rs[1].after_send = -1;
    }
    return _dm_eng_run(lk, &x);
}
_DM_PRIVATE dm_status _dm_eng_sendrecv(_dm_eng* lk, const char* op, const _dm_fp* fp, int speer, const void* sbuf,
                                       size_t slen, int rpeer, void* rbuf, size_t rlen) {
    return _dm_eng_exchange(lk, op, fp, fp, speer, sbuf, slen, rpeer, rbuf, rlen, false, DM_UINT8, DM_SUM);
}
_DM_PRIVATE dm_status _dm_eng_sendrecv_reduce(_dm_eng* lk, const char* op, const _dm_fp* fp, int speer, const void* sbuf,
                                              int rpeer, void* buf, size_t count, dm_dtype dtype, dm_reduce_op rop) {
    size_t bytes = count * dm_dtype_size(dtype);
    return _dm_eng_exchange(lk, op, fp, fp, speer, sbuf, bytes, rpeer, buf, bytes, true, dtype, rop);
}

_DM_PRIVATE dm_status _dm_eng_sendrecv_on_demand(_dm_eng* lk, const char* op, const _dm_fp* fp, int speer,
                                                 const void* sbuf, size_t slen, int rpeer, void* rbuf, size_t rlen) {
    dm_status st;
    lk->on_demand = true;
    st = _dm_eng_sendrecv(lk, op, fp, speer, sbuf, slen, rpeer, rbuf, rlen);
    lk->on_demand = false;
    return st;
}

_DM_WARM_END
#endif /* DISTMESH_IMPL_INCLUDED && !DISTMESH_ENGINE_IMPL_INCLUDED */

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
