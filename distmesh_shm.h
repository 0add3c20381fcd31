/* distmesh_shm.h -- distmesh's shared-memory transport. MIT license at end of file.

   Do not include this file yourself: it is part of the implementation. Two parts, each emitted
   once, by the header that includes it:
   - the memory rings, with the core: distmesh.h's implementation includes this file at
     distmesh.h >>rings include (with or without DISTMESH_TCP: the threaded world's links are
     memory rings in the heap);
   - the shared segment and the loss watcher, with the TCP backend: distmesh_tcp.h includes this
     file again at distmesh_tcp.h >>tcp shm include (DISTMESH_TCP: they need Linux's memfd,
     futexes and eventfd, and the engine the core defines after the rings).

   WHAT IT HOLDS
   - the memory link (_dm_memlink: two rings, one per direction, over bytes the two ranks share)
     and its functions, _dm_mem_*, which the link table of each memory transport names: this
     file's _dm_shm_vt (processes of one host) and the threaded world's _dm_tw_link_vt
     (distmesh.h >>thread);
   - the segment of a host's ranks (a memfd: header, abort words, bells, rings) and a rank's hold
     on it (_dm_shm_seg: the mapping, the watcher), its bells (futexes, and the membarrier that
     makes their wakers cheap), its link table _dm_shm_vt, the single-copy read of a peer's
     memory; made (_dm_shm_create), described to the members (_dm_shm_msg) and mapped by them
     (_dm_shm_attach), its links swapped in (_dm_shm_links);
   - the watcher that wakes a sleeping rank when a same-host peer dies.

   WHAT IT USES  the core alone, below it: for the rings distmesh.h >>links (_dm_link, _dm_iov,
   the bell) and >>memory (the allocator); for the segment also the group (dm_collective: its
   allocator, logger, last error), the engine (_dm_eng: its links, bells, abort word, read_peer),
   the wire integers (_dm_put32 ...) and the config registry. Nothing here names the TCP backend,
   the socket link or the store: what the segment needs of them its caller passes in (the nonce,
   the side sockets, the peers' names) or checks itself. The TCP backend calls these: its setup
   and vote (distmesh_tcp.h >>tcp shm setup), lifetime and shrink.

   SECTIONS  Each opens with a comment that starts ">>tag" (search for it); in file order:
     with the core (distmesh.h >>rings include)
       >>memory rings            the link between two ranks that share memory
     with the TCP backend (distmesh_tcp.h >>tcp shm include)
       >>shm libc                the Linux calls the segment makes, declared when hidden
       >>shm segment             the shared segment of a host: rings, bells, futexes; its
                                 link table, a rank's hold on it (_dm_shm_seg)
       >>shm loss                the watcher that wakes sleepers when a same-host peer dies

   PRIVATE NAMES  _dm_ring _dm_memlink _dm_mem_ (the memory link), _dm_shm_ _dm_futex_
   _dm_membarrier_ (the segment, its bells and fences). */
#ifndef DISTMESH_H
#error "distmesh_shm.h is part of distmesh.h's implementation: include distmesh.h"
#endif

/* Which part this include emits: the memory rings the first time (with the core), the segment
   the next time with DISTMESH_TCP (the backend's include, after the whole core it builds on). */
#if defined(DISTMESH_TCP) && defined(DISTMESH_SHM_RINGS_IMPL_INCLUDED) && !defined(DISTMESH_SHM_IMPL_INCLUDED)
#define DISTMESH_SHM_IMPL_INCLUDED
#define _DM_SHM_SEGMENT_NOW
#endif

#if defined(DISTMESH_IMPL_INCLUDED) && !defined(DISTMESH_SHM_RINGS_IMPL_INCLUDED)
#define DISTMESH_SHM_RINGS_IMPL_INCLUDED
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

#endif /* DISTMESH_IMPL_INCLUDED && !DISTMESH_SHM_RINGS_IMPL_INCLUDED */

#if defined(_DM_SHM_SEGMENT_NOW)
#undef _DM_SHM_SEGMENT_NOW
/* >>shm libc  The segment's share of distmesh.h >>libc: the Linux calls it makes, declared when
   the includer's mode hid them (glibc, C), and the kernel's constants under _DM_ names. */
#include <sys/types.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <linux/futex.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
#if defined(__GLIBC__) && !defined(__cplusplus)
#if !defined(__USE_GNU)
extern int memfd_create(const char* name, unsigned int flags);
extern ssize_t process_vm_readv(pid_t pid, const struct iovec* local, unsigned long nlocal,
                                const struct iovec* remote, unsigned long nremote, unsigned long flags);
#endif
#if !defined(__USE_MISC)
extern int madvise(void* addr, size_t len, int advice);
#endif
#endif
#define _DM_MFD_CLOEXEC 1u                  /* <linux/memfd.h> MFD_CLOEXEC */
#if defined(MADV_POPULATE_WRITE)
#define _DM_MADV_POPULATE_WRITE MADV_POPULATE_WRITE
#elif defined(__linux__)
#define _DM_MADV_POPULATE_WRITE 23          /* Linux 5.14; older kernels: EINVAL, then the loop */
#endif

/* >>shm segment  Ranks of one group on one host talk through a shared segment: a memfd the group's
   lowest local rank creates and the others open through /proc/<pid>/fd/<fd>, so nothing is
   ever named in /dev/shm and the memory goes with the last mapping, kill -9 included. Every
   member checks a random nonce in the header, so a segment that is not really shared (another
   pid namespace, another host with the same name) is refused, not trusted. Layout:
     header       64 B   magic u64, nonce[16], local size u32, 0 u32, ring cap u64, stride u64,
                         total bytes u64
     abort   8 x 256 B   the first failure (_dm_abort): the group's, then one per dm_shrink that
                         keeps the segment (>>tcp shrink)
     bells     L x 64 B  one per local rank (_dm_bell)
     rings   L*L x stride, stride = sizeof(_dm_ring) + cap: ring [i*L + j] carries i -> j
   The socket to each same-host peer stays open as the side channel: its end of stream is how a
   waiter learns that a peer died (a dead process rings no bell). */
#define _DM_SHM_MAGIC 0x314d48534d44ull        /* "DMSHM1" */
#define _DM_SHM_HEADER 64
#define _DM_SHM_ABORTS 8
typedef struct _dm_shm_msg {                    /* leader -> member over the socket, 40 bytes */
    unsigned char pid[4], fd[4], size[8], nonce[16], pad[8];
} _dm_shm_msg;

static void _dm_futex_wait(void* ctx, _dm_bell* b, uint32_t seen, int ms) {
    struct timespec ts;
    (void)ctx;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (long)(ms % 1000) * 1000000L;
    syscall(SYS_futex, &b->seq, FUTEX_WAIT, seen, &ts, NULL, 0);
}
static void _dm_futex_wake(void* ctx, _dm_bell* b) {
    (void)ctx;
    syscall(SYS_futex, &b->seq, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}
static const _dm_bell_ops _dm_futex_bell = { _dm_futex_wait, _dm_futex_wake, NULL, NULL };

/* The heavy side of the bell's asymmetric barrier (see _dm_bell): a full fence on every core
   that runs a thread of a registered process. Registering is once per process; a host's group
   uses it only when every one of its ranks registered (the setup's vote), else full fences. */
#if defined(SYS_membarrier)
/* the kernel ABI's values (linux/membarrier.h has them as enum constants, since Linux 4.16) */
#define _DM_MEMBARRIER_GLOBAL_EXPEDITED 2
#define _DM_MEMBARRIER_REGISTER_GLOBAL_EXPEDITED 4
static bool _dm_membarrier_register(void) {
    static int state;           /* 0 not tried, 1 registered, 2 unavailable */
    int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (s == 0) {
        s = syscall(SYS_membarrier, _DM_MEMBARRIER_REGISTER_GLOBAL_EXPEDITED, 0, 0) == 0 ? 1 : 2;
        __atomic_store_n(&state, s, __ATOMIC_RELEASE);
    }
    return s == 1;
}
static void _dm_membarrier(void) {
    if (syscall(SYS_membarrier, _DM_MEMBARRIER_GLOBAL_EXPEDITED, 0, 0) != 0)
        __atomic_thread_fence(__ATOMIC_SEQ_CST);   /* cannot fail once registered; a lost wake-up costs a slice */
}
static const _dm_bell_ops _dm_futex_bell_light = { _dm_futex_wait, _dm_futex_wake, NULL, _dm_membarrier };
#else
static bool _dm_membarrier_register(void) { return false; }
static const _dm_bell_ops _dm_futex_bell_light = { _dm_futex_wait, _dm_futex_wake, NULL, NULL };
#endif

/* The peer of a shm link is alive while its side socket has not ended. */
static int _dm_shm_alive(_dm_link* l, int* err) {
    _dm_memlink* m = (_dm_memlink*)l;
    struct pollfd p;
    char c;
    p.fd = m->side_fd;
    p.events = POLLIN | _DM_POLLRDHUP;
    p.revents = 0;
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLHUP | POLLERR | _DM_POLLRDHUP)) { *err = 0; return -1; }
    if (recv(m->side_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0) { *err = 0; return -1; }
    return 0;
}
static void _dm_shm_shutdown(_dm_link* l) { shutdown(((_dm_memlink*)l)->side_fd, SHUT_RDWR); }
static const _dm_link_vt _dm_shm_vt = {
    "shm", _dm_mem_send, _dm_mem_recv, _dm_mem_peek, _dm_mem_consume, _dm_shm_alive, _dm_shm_shutdown, _dm_mem_destroy,
    8, _dm_mem_sendv, NULL
};

/* The engine's read_peer (distmesh.h >>single copy): the kernel copies from the peer's memory
   straight into dst (Linux 3.2; the same user, and Yama's ptrace_scope 0, or the read fails
   with EPERM and the ring does the all-gather). A partial read goes on from where it stopped. */
static int _dm_shm_read_peer(_dm_eng* lk, int64_t pid, uint64_t addr, void* dst, size_t n) {
    unsigned char* d = (unsigned char*)dst;
    (void)lk;
    while (n) {
        struct iovec here, there;
        ssize_t got;
        here.iov_base = d; here.iov_len = n;
        there.iov_base = (void*)(uintptr_t)addr; there.iov_len = n;
        got = process_vm_readv((pid_t)pid, &here, 1, &there, 1, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return errno;
        if (got == 0) return EFAULT;
        d += got; addr += (uint64_t)got; n -= (size_t)got;
    }
    return 0;
}

/* the segment made and mapped: create, split, shrink. A rank's hold on its host's segment is a
   _dm_shm_seg, which the group that uses it keeps (dm_shrink hands it to the next group); the
   functions below take it with the core's types (the group, its engine) and what else they need
   as arguments: the nonce, the side sockets and the peers' names. */
_DM_COLD_BEGIN
typedef struct _dm_shm_seg {
    unsigned char* base;        /* the mapping (the layout above), or NULL */
    size_t size;
    struct _dm_shm_watch* watch; /* wakes this rank when a same-host peer dies (>>shm loss) */
} _dm_shm_seg;

/* Ring capacity per direction: 1 MiB while the L*L rings stay small, less for big hosts. */
static size_t _dm_shm_ring_cap(int L) {
    size_t cap = (size_t)1 << 20;
    while (cap > ((size_t)64 << 10) && (size_t)L * (size_t)L * cap > ((size_t)256 << 20)) cap >>= 1;
    return cap;
}

/* The leader's segment for L local ranks: created, sized, mapped and stamped with nonce (random,
   the caller's); failures are c's. *fd_out: the memfd, open until every member has mapped it. */
static dm_status _dm_shm_create(_dm_shm_seg* s, dm_collective* c, int L, const unsigned char nonce[16], int* fd_out) {
    size_t cap = _dm_shm_ring_cap(L), stride = sizeof(_dm_ring) + cap;
    size_t size = _DM_SHM_HEADER + _DM_SHM_ABORTS * sizeof(_dm_abort) + (size_t)L * sizeof(_dm_bell) +
                  (size_t)L * (size_t)L * stride;
    unsigned char* p;
    int fd = memfd_create("distmesh", _DM_MFD_CLOEXEC);
    if (fd < 0) return _DM_FAIL(c, DM_ERR_UNSUPPORTED, "tcp: shm: memfd_create failed (%s)", strerror(errno));
    if (ftruncate(fd, (off_t)size) != 0) {
        close(fd);
        return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "tcp: shm: cannot size the segment to %zu bytes (%s)", size,
                        strerror(errno));
    }
    p = (unsigned char*)mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "tcp: shm: mmap of %zu bytes failed (%s)", size, strerror(errno));
    }
    _dm_put64(p, _DM_SHM_MAGIC);
    memcpy(p + 8, nonce, 16);
    _dm_put32(p + 24, (uint32_t)L);
    _dm_put64(p + 32, cap);
    _dm_put64(p + 40, stride);
    _dm_put64(p + 48, size);
    s->base = p;
    s->size = size;
    *fd_out = fd;
    return DM_OK;
}

/* What a member needs to map the leader's segment (s, its memfd fd): the message's fields. */
static void _dm_shm_describe(const _dm_shm_seg* s, int fd, _dm_shm_msg* out) {
    _dm_put32(out->pid, (uint32_t)getpid());
    _dm_put32(out->fd, (uint32_t)fd);
    _dm_put64(out->size, s->size);
    memcpy(out->nonce, s->base + 8, 16);
}

/* A member maps the leader's segment and checks it is the one the leader described. */
static dm_status _dm_shm_attach(_dm_shm_seg* s, dm_collective* c, const _dm_shm_msg* m, int L) {
    char path[64];
    unsigned char* p;
    size_t size = (size_t)_dm_get64(m->size);
    int fd;
    snprintf(path, sizeof(path), "/proc/%u/fd/%u", (unsigned)_dm_get32(m->pid), (unsigned)_dm_get32(m->fd));
    fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return _DM_FAIL(c, DM_ERR_UNSUPPORTED, "tcp: shm: cannot open %s (%s)", path, strerror(errno));
    p = (unsigned char*)mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return _DM_FAIL(c, DM_ERR_UNSUPPORTED, "tcp: shm: mmap of %s failed (%s)", path, strerror(errno));
    s->base = p;
    s->size = size;
    if (_dm_get64(p) != _DM_SHM_MAGIC || memcmp(p + 8, m->nonce, 16) != 0 || (int)_dm_get32(p + 24) != L ||
        _dm_get64(p + 48) != size)
        return _DM_FAIL(c, DM_ERR_UNSUPPORTED, "tcp: shm: %s is not the segment the leader made (another "
                        "host or pid namespace behind the same host identity?)", path);
    return DM_OK;
}

/* Unmaps the segment (this rank's view of it; the memory goes with the last mapping). */
static void _dm_shm_unmap(_dm_shm_seg* s) {
    if (s->base) munmap(s->base, s->size);
    s->base = NULL;
}

/* Abort word slot (0: the first group's, then one per dm_shrink that keeps the segment). */
static _dm_abort* _dm_shm_abort_word(const _dm_shm_seg* s, int slot) {
    return (_dm_abort*)(void*)(s->base + _DM_SHM_HEADER) + slot;
}

/* Maps in the pages of a ring this rank uses now, not in the first collectives (content
   untouched: peers may already be writing). */
static void _dm_shm_prefault(unsigned char* p, size_t n) {
    size_t page = 4096, i;
    uintptr_t start = (uintptr_t)p & ~(uintptr_t)(page - 1);
    volatile unsigned char sink = 0;
#if defined(_DM_MADV_POPULATE_WRITE)
    if (madvise((void*)start, (size_t)((uintptr_t)p + n - start), _DM_MADV_POPULATE_WRITE) == 0) return;
#endif
    for (i = 0; i < n; i += page) sink = (unsigned char)(sink + ((volatile unsigned char*)p)[i]);
    (void)sink;
    (void)start;
}

/* Swaps the links of the same-host peers (local[0..L), this rank at index me, by their ranks in
   lk's group) for shm links and wires bells and abort word. Per group rank: side_fds, the socket
   each shm link keeps as its side channel (it must hold no unread byte: the caller checks), and
   addrs, the peer's name in the link's messages. */
static dm_status _dm_shm_links(_dm_shm_seg* s, _dm_eng* lk, const int* local, int L, int me, const int* side_fds,
                               char (*addrs)[64], const _dm_bell_ops* ops, bool single_copy) {
    dm_collective* c = lk->c;
    unsigned char* p = s->base;
    size_t cap = (size_t)_dm_get64(p + 32), stride = (size_t)_dm_get64(p + 40);
    _dm_bell* bells = (_dm_bell*)(void*)(p + _DM_SHM_HEADER + _DM_SHM_ABORTS * sizeof(_dm_abort));
    unsigned char* rings = (unsigned char*)(bells + L);
    int i;
    for (i = 0; i < L; i++) {
        int r = local[i];
        _dm_link* l;
        if (i == me) continue;
        l = _dm_memlink_new(&c->allocator, &_dm_shm_vt, rings, stride, cap, L, me, i, bells, ops, side_fds[r]);
        if (!l) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "tcp: out of memory");
        snprintf(l->where, sizeof(l->where), "%.40s, shm", addrs[r]);
        _dm_shm_prefault(rings + ((size_t)me * (size_t)L + (size_t)i) * stride, stride);
        _dm_shm_prefault(rings + ((size_t)i * (size_t)L + (size_t)me) * stride, stride);
        lk->links[r]->vt->destroy(lk->links[r], &c->allocator);
        lk->links[r] = l;
    }
    lk->bell = &bells[me];
    lk->bells = bells;
    lk->nbells = L;
    lk->bell_ops = ops;
    lk->abort = _dm_shm_abort_word(s, 0);
    lk->read_peer = single_copy ? _dm_shm_read_peer : NULL;
    lk->single_copy_no = !_dm_cfg_int_logged(_DM_CFG_SINGLE_COPY, &c->logger);
    return DM_OK;
}

/* >>shm loss  A rank asleep on its bell learns of a same-host peer's death at once. A dead
   process rings no bell, and the sleeper used to find out at its next look, up to 50 ms later
   (twice: a death is confirmed by a second look). So each group with shm links has a watcher
   thread, blocked in poll() on the side sockets of those links: the kernel closes a dead
   process's sockets, kill -9 included, and the watcher rings this rank's bell when one ends;
   the sleeper wakes, asks the link (_dm_shm_alive) and, seeing the peer gone, looks again at
   once (_dm_eng_block). Idle, the watcher costs nothing: it sleeps in poll until a socket ends
   or destroy stops it. (A pidfd would say the same thing; the side socket is what
   _dm_shm_alive already trusts, and it needs no newer kernel.) */
typedef struct _dm_shm_watch {
    pthread_t thread;
    _dm_bell* bell;             /* this rank's */
    int n;                      /* pfd[0] is the stop eventfd, pfd[1..n] the side sockets */
    struct pollfd pfd[1];       /* n + 1 of them, allocated with the struct */
} _dm_shm_watch;
static void* _dm_shm_watch_main(void* arg) {
    _dm_shm_watch* w = (_dm_shm_watch*)arg;
    for (;;) {
        int i, rc = poll(w->pfd, (nfds_t)w->n + 1, -1);
        if (rc < 0 && errno != EINTR) return NULL;     /* the 50 ms look remains */
        if (rc <= 0) continue;
        if (w->pfd[0].revents) return NULL;            /* destroy */
        for (i = 1; i <= w->n; i++) {
            if (!(w->pfd[i].revents & (POLLHUP | POLLERR | POLLNVAL | _DM_POLLRDHUP))) continue;
            w->pfd[i].fd = -1;                         /* told once; poll skips it from now on */
            _dm_bell_ring(w->bell, &_dm_futex_bell);
        }
    }
}
/* Starts s's watcher over the shm links of lk's group; without it (no thread, no eventfd) a
   death is still seen, only later. */
static void _dm_shm_watch_start(_dm_shm_seg* s, _dm_eng* lk) {
    dm_collective* c = lk->c;
    _dm_shm_watch* w;
    int r, n = 0;
    for (r = 0; r < c->size; r++)
        if (lk->links[r] && lk->links[r]->vt == &_dm_shm_vt) n++;
    if (n == 0) return;
    w = (_dm_shm_watch*)_dm_calloc(&c->allocator, sizeof(*w) + (size_t)n * sizeof(struct pollfd));
    if (!w) return;
    w->bell = lk->bell;
    w->pfd[0].fd = eventfd(0, EFD_CLOEXEC);
    w->pfd[0].events = POLLIN;
    for (r = 0; r < c->size; r++) {
        _dm_link* l = lk->links[r];
        if (!l || l->vt != &_dm_shm_vt) continue;
        w->n++;
        w->pfd[w->n].fd = ((_dm_memlink*)l)->side_fd;
        w->pfd[w->n].events = _DM_POLLRDHUP;
    }
    if (w->pfd[0].fd < 0 || pthread_create(&w->thread, NULL, _dm_shm_watch_main, w) != 0) {
        if (w->pfd[0].fd >= 0) close(w->pfd[0].fd);
        _dm_free(&c->allocator, w);
        _DM_LOG(&c->logger, DM_LOG_WARN, "tcp: shm: no watcher thread (%s); a same-host peer's death is "
                "noticed within about 100 ms instead of at once", strerror(errno));
        return;
    }
    s->watch = w;
}
/* Before the links and their sockets go; a is the allocator of the group that started it. */
static void _dm_shm_watch_stop(_dm_shm_seg* s, const dm_allocator* a) {
    _dm_shm_watch* w = s->watch;
    uint64_t one = 1;
    if (!w) return;
    while (write(w->pfd[0].fd, &one, sizeof(one)) < 0 && errno == EINTR) {}
    pthread_join(w->thread, NULL);
    close(w->pfd[0].fd);
    _dm_free(a, w);
    s->watch = NULL;
}

_DM_COLD_END

#endif /* the segment: DISTMESH_TCP, the second include */

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
