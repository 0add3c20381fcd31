/* distmesh_shm.h -- distmesh's shared-memory transport. MIT license at end of file.

   Do not include this file yourself: it is part of the implementation, with the TCP backend:
   distmesh_tcp.h includes it at distmesh_tcp.h >>tcp shm include (DISTMESH_TCP: the segment
   needs Linux's memfd, futexes and eventfd). The memory rings it lays in the segment are the
   engine's memory link (distmesh_engine.h >>memory rings), which the threaded world uses too.

   WHAT IT HOLDS
   - the segment of a host's ranks (a memfd: header, abort words, bells, rings) and a rank's hold
     on it (_dm_shm_seg: the mapping, the watcher), its bells (futexes, and the membarrier that
     makes their wakers cheap), its link table _dm_shm_vt, the single-copy read of a peer's
     memory; made (_dm_shm_create), described to the members (_dm_shm_msg) and mapped by them
     (_dm_shm_attach), its links swapped in (_dm_shm_links);
   - the watcher that wakes a sleeping rank when a same-host peer dies.

   WHAT IT USES  the layers below it alone: the group (dm_collective: its allocator, logger,
   last error), the engine (_dm_eng: its links, memory rings, bells, abort word, read_peer),
   the wire integers (_dm_put32 ...) and the config registry. Nothing here names the TCP backend,
   the socket link or the store: what the segment needs of them its caller passes in (the nonce,
   the side sockets, the peers' names) or checks itself. The TCP backend calls these: its setup
   and vote (distmesh_tcp.h >>tcp shm setup), lifetime and shrink.

   SECTIONS  Each opens with a comment that starts ">>tag" (search for it); in file order:
       >>shm libc                the Linux calls the segment makes, declared when hidden
       >>shm segment             the shared segment of a host: rings, bells, futexes; its
                                 link table, a rank's hold on it (_dm_shm_seg)
       >>shm loss                the watcher that wakes sleepers when a same-host peer dies

   PRIVATE NAMES  _dm_shm_ _dm_futex_
   _dm_membarrier_ (the segment, its bells and fences). */
#ifndef DISTMESH_H
#error "distmesh_shm.h is part of distmesh.h's implementation: include distmesh.h"
#endif

#if defined(DISTMESH_IMPL_INCLUDED) && defined(DISTMESH_TCP) && !defined(DISTMESH_SHM_IMPL_INCLUDED)
#define DISTMESH_SHM_IMPL_INCLUDED
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

/* The engine's read_peer (distmesh_schedules.h >>single copy): the kernel copies from the peer's memory
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

#endif /* DISTMESH_IMPL_INCLUDED && DISTMESH_TCP && !DISTMESH_SHM_IMPL_INCLUDED */

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
