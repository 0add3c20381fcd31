/* distmesh_trace.h -- distmesh's flight recorder and timeline. MIT license at end of file.

   Do not include this file yourself: it is part of distmesh.h's implementation, which includes
   it after the kernels, before the core (distmesh.h >>layers). Users set it up through the
   environment and dm_flight_recorder_dump, both described at distmesh.h >>functions inside,
   and read it with scripts/dm_trace (docs/inside.md).

   WHAT IT HOLDS
   - the flight recorder: the last N operations of each collective in a ring
     (DISTMESH_FLIGHT_RECORDER), their state, and each peer's last fingerprint; dumped as JSON
     on a failure, on request (dm_flight_recorder_dump) and on SIGUSR1;
   - the timeline: one Chrome trace-event JSON file per rank (DISTMESH_TRACE=DIR).

   THE CORE AND THE ENGINE REACH IT ONLY THROUGH ITS HOOKS (>>trace hooks, which also holds
   their empty stand-ins: with DISTMESH_NO_TRACE the recorder is left out, the hooks compile to
   nothing, and dm_flight_recorder_dump answers DM_ERR_UNSUPPORTED):
   _dm_trace_wanted (init), _dm_trace_op_begin / _end / _run_full (every operation, when on),
   _dm_trace_queued, _dm_trace_now, _dm_trace_stream_start / _end (requests), _dm_trace_adopt,
   _dm_trace_closing, _dm_trace_release (split, shrink, grow, destroy), _dm_trace_peer_seen,
   _dm_trace_waited, _dm_trace_wait, _dm_trace_idle (fingerprints and waits in the engine), and the public
   dm_flight_recorder_dump. It calls distmesh.h alone (memory, log, config, op names, the
   request queue's types for its dumps); the full path runs an operation through the dispatcher
   the core hands it (_dm_trace_op_run_full's run).

   SECTIONS  Each opens with a comment that starts ">>tag" (search for it); in file order:
       >>trace hooks             what the core and the engine call; their DISTMESH_NO_TRACE
                                 stand-ins
       >>trace                   the recorder's ring, the rank's timeline file, the hooks
       >>trace dump              the flight recorder as JSON

   PRIVATE NAMES  _dm_trace_ (the recorder and the timeline), _dm_tr_ (entries and ring slots),
   _dm_tb_ (text buffers, growing or fixed). */
#ifndef DISTMESH_H
#error "distmesh_trace.h is part of distmesh.h's implementation: include distmesh.h"
#endif

#if defined(DISTMESH_IMPL_INCLUDED) && !defined(DISTMESH_TRACE_IMPL_INCLUDED)
#define DISTMESH_TRACE_IMPL_INCLUDED
_DM_WARM_BEGIN
/* >>trace hooks  What the core and the engine call of the flight recorder and the timeline.
   Where one runs per operation or per wait it sits behind _DM_TRACED(c), c->core->trace read
   relaxed (NULL: off). With DISTMESH_NO_TRACE the recorder (>>trace, >>trace dump) is left
   out: the trace stays NULL, _DM_TRACED(c) is a constant null pointer (those sites
   compile to nothing), the other hooks are empty stand-ins, and dm_flight_recorder_dump
   answers DM_ERR_UNSUPPORTED. */
#if !defined(DISTMESH_NO_TRACE)
#define _DM_TRACED(c) __atomic_load_n(&(c)->core->trace, __ATOMIC_RELAXED)
_DM_PRIVATE struct _dm_trace* _dm_trace_wanted(const dm_logger* lg);    /* a collective's init */
/* _dm_op_run, when on: begin says whether the recorder's fast path took o (then end follows
   the run); if not, the full path runs it (the timeline, object collectives, split). */
_DM_PRIVATE bool _dm_trace_op_begin(dm_collective* c, const dm_op* o);
_DM_PRIVATE dm_status _dm_trace_op_end(dm_collective* c, const dm_op* o, dm_status st);
_DM_PRIVATE dm_status _dm_trace_op_run_full(dm_collective* c, const dm_op* o, _dm_op_fn run);
_DM_PRIVATE int64_t _dm_trace_now(void);
_DM_PRIVATE void _dm_trace_queued(int64_t t_queued);                    /* a request about to run */
_DM_PRIVATE uint64_t _dm_trace_stream_start(dm_collective* c, const dm_op* o, int64_t t_start);
_DM_PRIVATE void _dm_trace_stream_end(dm_collective* c, const dm_op* o, uint64_t index, int64_t t_start,
                                      dm_status st);
_DM_PRIVATE void _dm_trace_adopt(dm_collective* c, dm_collective* child, const char* what, int color);
_DM_PRIVATE void _dm_trace_closing(dm_collective* c);                   /* dm_destroy */
_DM_PRIVATE void _dm_trace_release(dm_collective* c);
_DM_PRIVATE void _dm_trace_peer_seen(dm_collective* c, int peer, int kind, uint64_t seq);  /* fingerprints */
_DM_PRIVATE void _dm_trace_waited(dm_collective* c, int peer, int64_t since_us);           /* the engine */
_DM_PRIVATE void _dm_trace_wait(dm_collective* c, int peer, int64_t wait_us);
_DM_PRIVATE void _dm_trace_idle(dm_collective* c, bool slept);
#else
#define _DM_TRACED(c) ((struct _dm_trace*)0)
_DM_PRIVATE struct _dm_trace* _dm_trace_wanted(const dm_logger* lg) { (void)lg; return NULL; }
_DM_PRIVATE bool _dm_trace_op_begin(dm_collective* c, const dm_op* o) { (void)c; (void)o; return false; }
_DM_PRIVATE dm_status _dm_trace_op_end(dm_collective* c, const dm_op* o, dm_status st) { (void)c; (void)o; return st; }
_DM_PRIVATE dm_status _dm_trace_op_run_full(dm_collective* c, const dm_op* o, _dm_op_fn run) { return run(c, o); }
_DM_PRIVATE int64_t _dm_trace_now(void) { return 0; }
_DM_PRIVATE void _dm_trace_queued(int64_t t_queued) { (void)t_queued; }
_DM_PRIVATE uint64_t _dm_trace_stream_start(dm_collective* c, const dm_op* o, int64_t t_start) {
    (void)c; (void)o; (void)t_start;
    return 0;
}
_DM_PRIVATE void _dm_trace_stream_end(dm_collective* c, const dm_op* o, uint64_t index, int64_t t_start,
                                      dm_status st) {
    (void)c; (void)o; (void)index; (void)t_start; (void)st;
}
_DM_PRIVATE void _dm_trace_adopt(dm_collective* c, dm_collective* child, const char* what, int color) {
    (void)c; (void)child; (void)what; (void)color;
}
_DM_PRIVATE void _dm_trace_closing(dm_collective* c) { (void)c; }
_DM_PRIVATE void _dm_trace_release(dm_collective* c) { (void)c; }
_DM_PRIVATE void _dm_trace_peer_seen(dm_collective* c, int peer, int kind, uint64_t seq) {
    (void)c; (void)peer; (void)kind; (void)seq;
}
_DM_PRIVATE void _dm_trace_waited(dm_collective* c, int peer, int64_t since_us) { (void)c; (void)peer; (void)since_us; }
_DM_PRIVATE void _dm_trace_wait(dm_collective* c, int peer, int64_t wait_us) { (void)c; (void)peer; (void)wait_us; }
_DM_PRIVATE void _dm_trace_idle(dm_collective* c, bool slept) { (void)c; (void)slept; }
_DM_COLD_BEGIN
DM_API_IMPL dm_status dm_flight_recorder_dump(dm_collective* c, const char* path) {
    (void)path;
    if (!c) return DM_ERR_INVALID_ARG;
    return _DM_FAIL(c, DM_ERR_UNSUPPORTED, "flight_recorder_dump: this build has no flight recorder "
                    "(DISTMESH_NO_TRACE)");
}
_DM_COLD_END
#endif

#if !defined(DISTMESH_NO_TRACE)
/* >>trace  See inside: the flight recorder (the last N operations of each collective, in memory,
   dumped as JSON on failure, on request and on SIGUSR1) and the timeline (DISTMESH_TRACE: Chrome
   trace-event JSON, one file per rank). Names: _dm_trace is one collective's part (its group
   name, ring, peers' last fingerprints, the running operation's waits), _dm_trace_rank one
   rank's (the timeline file and its buffer, the dump's name, the list of its groups), shared
   by a collective and every sub-collective made from it, so a rank writes one file whatever
   groups it is in. c->core->trace is _dm_trace_pending (on, not made yet: made at the first
   operation, or handed down by the parent at split / shrink / grow) or NULL (off: the one test
   in _dm_op_run, plus one per fingerprint received and per idle spell in the engine). Threads: a
   group's ring is written by the thread running its operation (one at a time) without a lock,
   and read by dumps from any thread through each slot's sequence word (_dm_tr_slot: a seqlock);
   peers' fingerprints are atomics; the waits belong to the running thread; the group's mutex
   covers its transport and last error. Lock order: the process registry (SIGUSR1 only), then a
   rank's mutex, then a group's, then a collective's request queue (dumps list what is
   queued). Times are CLOCK_REALTIME nanoseconds, so files from several hosts line up (read on
   the coarse clock, a few ns instead of tens, when only the flight recorder is on; through the
   TSC for the timeline where the kernel keeps time with it: _dm_trace_clock; its anchor and the
   formatted seconds, t->clk_* and t->ts_*, belong to the running thread like the waits). */

#define _DM_TR_FLUSH_BYTES ((size_t)128 << 10)
#define _DM_TR_BUF_BYTES ((size_t)256 << 10)
#define _DM_TR_FLUSH_NS ((int64_t)100 * 1000000)
#define _DM_TR_RESERVE_BYTES ((uint64_t)1 << 20)
enum { _DM_TR_QUEUED = 0, _DM_TR_RUNNING, _DM_TR_DONE, _DM_TR_FAILED };
static const char* const _dm_tr_state_names[] = { "queued", "running", "done", "failed" };

typedef struct _dm_tr_entry {
    uint64_t seq;               /* the collective's sequence number (point-to-point: the last one) */
    uint64_t bytes;             /* count x dtype size as passed (all_to_all_v: sent) */
    int64_t t_queued, t_start, t_end;   /* ns; t_queued 0 for blocking calls, t_end 0 until done */
    const char* algorithm;      /* c->algorithm after the run (static), or NULL */
    int32_t status, root;
    uint8_t kind, state, async, composite;  /* composite: object collectives (run as several) */
    int8_t dtype;
} _dm_tr_entry;
/* One ring slot: entry number i packed into words (_dm_tr_slot_put), ver 2i + 2 once written,
   2i + 1 while being written (by the group's one writer; readers copy the words and retry when
   ver moved). */
typedef struct _dm_tr_slot {
    uint64_t ver;
    uint64_t w[8];
} _dm_tr_slot;

typedef struct _dm_trace_rank _dm_trace_rank;
typedef struct _dm_trace {
    _dm_trace_rank* rk;
    struct _dm_trace* next;     /* the rank's groups */
    dm_collective* c;           /* NULL once dm_destroy began (dumps no longer look at c) */
    char group[96];             /* "world", "world/s1c0" (first split, color 0), "world/shrink1" */
    char transport[32];         /* as of the last operation (dumps run on other threads) */
    char error[DM_LAST_ERROR_SIZE];     /* the last failure's message */
    int tid;                    /* the group's track in the timeline (queue times: tid + 1) */
    int children;               /* sub-collectives made from this one, for their names */
    int rank, size;
    pthread_mutex_t mu;         /* transport, error */
    /* Written by every operation, here in the struct's middle, away from lines another
       allocation may share (a threaded world's ranks are threads of one process). */
    _dm_tr_slot* ring;          /* cap + 1 slots: the last cap entries, and the running one's */
    uint32_t cap;
    uint32_t next_slot;         /* count % (cap + 1), kept by the writer: no division per operation */
    uint64_t count;             /* entries ever written (atomic, the writer's): entry i is in
                                   ring[i % (cap + 1)]; the running operation's is entry count */
    uint64_t ops;               /* operations the full path ended (the running thread's) */
    /* The recorder's fast path (_dm_trace_op_begin / _end), the running thread's: the running
       operation until its entry is written (at its first wait: _dm_trace_idle), and whether it
       slept (its end is read then). */
    const dm_op* fr_op;         /* the running operation (NULL: none, or the full path runs it) */
    uint64_t fr_seq;            /* its number */
    int64_t fr_queued, fr_start;    /* its queue time, its start (0: not written yet) */
    bool fr_slept;
    bool fast;                  /* the fast path runs its operations: a ring, no timeline */
    bool dumped;                /* dumped since the last success: one dump per failure */
    int ntouched;
    /* per rank of the group: the last collective fingerprint seen, its number << 8 | its kind
       (_DM_K_*; 0: none yet); after the ring, in the lines of its own allocation (hot) */
    uint64_t* peer_last;
    void* hot;                  /* that allocation: the ring and peer_last, 64-byte aligned inside */
    int64_t* wait_ns;           /* per rank: the running operation's waits, its thread's */
    int* touched;
    int64_t ts_sec;             /* the timeline's "ts" seconds, formatted once a second (_dm_tb_pts) */
    uint64_t clk_tsc, clk_mult, clk_span;   /* the timeline's clock (_dm_trace_clock), the running thread's */
    int64_t clk_ns;
    char ts_digits[24];
    size_t ts_len;
} _dm_trace;

struct _dm_trace_rank {
    pthread_mutex_t mu;         /* everything below but the constants */
    int refs;                   /* groups sharing it */
    int rank, size, instance;   /* instance: roots of this rank made before in this process */
    long pid;
    dm_allocator allocator;
    dm_logger logger;
    uint32_t fr_cap;            /* DISTMESH_FLIGHT_RECORDER */
    bool tsc;                   /* the kernel keeps time with the TSC: the timeline reads it (_dm_trace_clock) */
    char trace_dir[256], dump_dir[256];
    int fd;                     /* the timeline, -1: none (yet, or failed) */
    bool opened;                /* an open was tried */
    char* buf;                  /* events not written yet */
    size_t len;
    int64_t last_flush;
    uint64_t written;           /* bytes in the file */
    uint64_t reserved;          /* the file's blocks reserved up to here (_dm_trace_flush_locked), 0: none */
    bool no_reserve;            /* the file system said no */
    int ntids;
    _dm_trace* groups;
    bool registered;
    _dm_trace_rank* next;       /* the process registry (SIGUSR1) */
};

/* c->core->trace before the first operation: on, state not made yet. Never dereferenced. */
static char _dm_trace_pending_mark;
#define _dm_trace_pending ((struct _dm_trace*)(void*)&_dm_trace_pending_mark)
/* The thread running a request's operation: when it was queued (ns, 0: a blocking call). */
static _DM_THREAD_LOCAL int64_t _dm_tls_trace_queued;
/* A request's operation is about to run on this thread: when it was queued. */
_DM_PRIVATE void _dm_trace_queued(int64_t t_queued) { _dm_tls_trace_queued = t_queued; }
/* The process's part, for SIGUSR1 only: the ranks to dump and the pipe the handler writes. */
static pthread_mutex_t _dm_tr_reg_mu = PTHREAD_MUTEX_INITIALIZER;
static _dm_trace_rank* _dm_tr_reg;
static int _dm_tr_sigpipe[2] = { -1, -1 };
static int _dm_tr_instances[1024];      /* roots of rank r % 1024 made in this process: unique names */


_DM_PRIVATE int64_t _dm_trace_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
/* The flight recorder alone needs times good for "who was late by how much" in a hang: the
   coarse clock (a few ms of resolution, a few ns to read). The timeline wants the exact ones. */
_DM_PRIVATE int64_t _dm_trace_now_coarse(void) {
#if defined(CLOCK_REALTIME_COARSE)
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME_COARSE, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
#else
    return _dm_trace_now();
#endif
}
/* The timeline's clock can be the TSC where the kernel keeps CLOCK_REALTIME with it (x86-64
   Linux, clocksource "tsc": invariant and in step across cores, or the kernel would not use it).
   A TSC read costs ~9 ns here against ~20 for clock_gettime, and an event takes two. */
#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define _DM_TR_TSC 1
#endif
_DM_PRIVATE bool _dm_trace_tsc_usable(void) {
#if defined(_DM_TR_TSC)
    char b[16];
    ssize_t n;
    int fd = open("/sys/devices/system/clocksource/clocksource0/current_clocksource", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    n = read(fd, b, sizeof(b));
    close(fd);
    return n == 4 && memcmp(b, "tsc\n", 4) == 0;
#else
    return false;
#endif
}
/* DISTMESH_FLIGHT_RECORDER: entries per collective. The variables are checked by every create
   (_dm_cfg_check); read again here, a bad value is logged and the default kept. */
_DM_PRIVATE uint32_t _dm_trace_fr_cap(const dm_logger* lg) {
    return (uint32_t)_dm_cfg_int_logged(_DM_CFG_FLIGHT_RECORDER, lg);
}
/* At every collective's init: pending when the recorder or the timeline is on. */
_DM_PRIVATE struct _dm_trace* _dm_trace_wanted(const dm_logger* lg) {
    return _dm_trace_fr_cap(lg) > 0 || _dm_cfg_str_logged(_DM_CFG_TRACE, lg) ? _dm_trace_pending : NULL;
}

/* ---- text: a bounded buffer that grows (dumps) or stays fixed (one event line) ---- */
typedef struct _dm_tbuf {
    char* p;
    size_t len, cap;
    const dm_allocator* grow;   /* NULL: fixed, excess is dropped (bad is set) */
    bool bad;
} _dm_tbuf;
_DM_PRIVATE bool _dm_tb_room(_dm_tbuf* b, size_t n) {
    size_t cap;
    char* q;
    if (b->len + n < b->cap) return true;
    if (!b->grow || b->bad) { b->bad = true; return false; }
    cap = b->cap * 2 + n + 256;
    q = (char*)_dm_malloc(b->grow, cap);
    if (!q) { b->bad = true; return false; }
    memcpy(q, b->p, b->len);
    _dm_free(b->grow, b->p);
    b->p = q;
    b->cap = cap;
    return true;
}
_DM_PRIVATE void _dm_tb_mem(_dm_tbuf* b, const char* s, size_t n) {
    if (!_dm_tb_room(b, n)) return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
}
_DM_PRIVATE void _dm_tb_s(_dm_tbuf* b, const char* s) { _dm_tb_mem(b, s, strlen(s)); }
_DM_PRIVATE void _dm_tb_u(_dm_tbuf* b, uint64_t v) {
    char d[24];
    int n = 0;
    do { d[23 - n++] = (char)('0' + v % 10); v /= 10; } while (v);
    _dm_tb_mem(b, d + 24 - n, (size_t)n);
}
_DM_PRIVATE void _dm_tb_i(_dm_tbuf* b, int64_t v) {
    if (v < 0) { _dm_tb_mem(b, "-", 1); _dm_tb_u(b, (uint64_t)0 - (uint64_t)v); }
    else _dm_tb_u(b, (uint64_t)v);
}
/* Nanoseconds as microseconds with three decimals: trace-event "ts" and "dur". */
_DM_PRIVATE void _dm_tb_us(_dm_tbuf* b, int64_t ns) {
    char f[4];
    uint64_t frac;
    if (ns < 0) { _dm_tb_mem(b, "-", 1); ns = -ns; }
    _dm_tb_u(b, (uint64_t)ns / 1000);
    frac = (uint64_t)ns % 1000;
    f[0] = '.'; f[1] = (char)('0' + frac / 100); f[2] = (char)('0' + frac / 10 % 10); f[3] = (char)('0' + frac % 10);
    _dm_tb_mem(b, f, 4);
}
/* A JSON string: quotes, backslashes and control bytes escaped. */
_DM_PRIVATE void _dm_tb_str(_dm_tbuf* b, const char* s) {
    static const char hex[] = "0123456789abcdef";
    _dm_tb_mem(b, "\"", 1);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        char e[6];
        if (ch == '"' || ch == '\\') { e[0] = '\\'; e[1] = (char)ch; _dm_tb_mem(b, e, 2); }
        else if (ch < 0x20) {
            e[0] = '\\'; e[1] = 'u'; e[2] = '0'; e[3] = '0'; e[4] = hex[ch >> 4]; e[5] = hex[ch & 15];
            _dm_tb_mem(b, e, 6);
        } else _dm_tb_mem(b, s, 1);
    }
    _dm_tb_mem(b, "\"", 1);
}
_DM_PRIVATE void _dm_trace_dump_queued(dm_collective* c, _dm_tbuf* b);
/* "key": with the comma before it unless first. */
_DM_PRIVATE void _dm_tb_key(_dm_tbuf* b, const char* key, bool first) {
    if (!first) _dm_tb_mem(b, ",", 1);
    _dm_tb_str(b, key);
    _dm_tb_mem(b, ":", 1);
}

/* ---- the rank's timeline file ---- */
/* Writes the buffer out (caller holds rk->mu). A short write drops the rest: the timeline
   must never stop the job. On Linux the file's blocks are reserved a MiB ahead of the writes
   (fallocate, the size kept: what is written is all a reader sees, even after kill -9): a
   write into reserved blocks costs the file system less than one that allocates as it goes,
   some 15 ns per event of 220 bytes on ext4. The release gives back what was not written. */
_DM_PRIVATE void _dm_trace_flush_locked(_dm_trace_rank* rk, int64_t now) {
    size_t off = 0;
#if defined(_DM_HAS_FALLOCATE)
    if (rk->fd >= 0 && !rk->no_reserve && rk->written + rk->len > rk->reserved) {
        uint64_t want = rk->written + rk->len + _DM_TR_RESERVE_BYTES;
        if (fallocate(rk->fd, _DM_FALLOC_KEEP_SIZE, (off_t)rk->written, (off_t)(want - rk->written)) == 0)
            rk->reserved = want;
        else
            rk->no_reserve = true;
    }
#endif
    while (rk->fd >= 0 && off < rk->len) {
        ssize_t n = write(rk->fd, rk->buf + off, rk->len - off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        off += (size_t)n;
    }
    rk->written += off;
    rk->len = 0;
    rk->last_flush = now;
}
_DM_PRIVATE void _dm_trace_file_name(const _dm_trace_rank* rk, const char* dir, const char* what, char* out,
                                     size_t cap) {
    if (rk->instance > 0)
        snprintf(out, cap, "%s/%s.rank%d.pid%ld.%d.json", dir, what, rk->rank, rk->pid, rk->instance);
    else
        snprintf(out, cap, "%s/%s.rank%d.pid%ld.json", dir, what, rk->rank, rk->pid);
}
/* Room for n bytes at the end of the timeline's buffer, where the caller writes them and then
   calls _dm_trace_commit_locked; NULL: no timeline. The file is opened on first use: "[" then
   one event per line, each after a comma, so a killed process leaves everything up to its last
   flush, less the closing "]". Caller holds rk->mu. */
_DM_PRIVATE char* _dm_trace_room_locked(_dm_trace_rank* rk, size_t n, int64_t now) {
    if (!rk->trace_dir[0]) return NULL;
    if (!rk->opened) {
        char path[400], host[64];
        _DM_ZERO(_dm_tbuf, h);
        rk->opened = true;
        _dm_trace_file_name(rk, rk->trace_dir, "dm_trace", path, sizeof(path));
        mkdir(rk->trace_dir, 0777);
        rk->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        rk->buf = (char*)_dm_malloc(&rk->allocator, _DM_TR_BUF_BYTES);
        if (rk->fd < 0 || !rk->buf) {
            _DM_LOG(&rk->logger, DM_LOG_WARN, "trace: rank %d writes no timeline: %s: %s", rk->rank, path,
                    rk->fd < 0 ? strerror(errno) : "out of memory");
            if (rk->fd >= 0) close(rk->fd);
            rk->fd = -1;
            return NULL;
        }
        if (gethostname(host, sizeof(host) - 1) != 0) _dm_copy_name(host, sizeof(host), "localhost");
        host[sizeof(host) - 1] = 0;
        h.p = rk->buf; h.cap = _DM_TR_BUF_BYTES;
        _dm_tb_s(&h, "[{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":"); _dm_tb_i(&h, rk->rank);
        _dm_tb_s(&h, ",\"tid\":0,\"args\":{\"name\":\"rank "); _dm_tb_i(&h, rk->rank);
        _dm_tb_s(&h, "\"}},\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":"); _dm_tb_i(&h, rk->rank);
        _dm_tb_s(&h, ",\"tid\":0,\"args\":{\"sort_index\":"); _dm_tb_i(&h, rk->rank);
        _dm_tb_s(&h, "}},\n{\"name\":\"distmesh_rank\",\"ph\":\"M\",\"pid\":"); _dm_tb_i(&h, rk->rank);
        _dm_tb_s(&h, ",\"tid\":0,\"args\":{\"rank\":"); _dm_tb_i(&h, rk->rank);
        _dm_tb_s(&h, ",\"world_size\":"); _dm_tb_i(&h, rk->size);
        _dm_tb_s(&h, ",\"os_pid\":"); _dm_tb_i(&h, rk->pid);
        _dm_tb_s(&h, ",\"host\":"); _dm_tb_str(&h, host);
        _dm_tb_s(&h, ",\"version\":\"" DISTMESH_VERSION "\"}}");
        rk->len = h.len;
        _dm_trace_flush_locked(rk, now);
    }
    if (rk->fd < 0 || n > _DM_TR_BUF_BYTES) return NULL;
    if (rk->len + n > _DM_TR_BUF_BYTES) _dm_trace_flush_locked(rk, now);
    return rk->buf + rk->len;
}
/* n bytes written at _dm_trace_room_locked's room: kept, and flushed when due. */
_DM_PRIVATE void _dm_trace_commit_locked(_dm_trace_rank* rk, size_t n, int64_t now, bool flush) {
    rk->len += n;
    if (flush || rk->len >= _DM_TR_FLUSH_BYTES || now - rk->last_flush >= _DM_TR_FLUSH_NS)
        _dm_trace_flush_locked(rk, now);
}
_DM_PRIVATE void _dm_trace_append_locked(_dm_trace_rank* rk, const char* text, size_t n, int64_t now, bool flush) {
    char* p = _dm_trace_room_locked(rk, n, now);
    if (!p) return;
    memcpy(p, text, n);
    _dm_trace_commit_locked(rk, n, now, flush);
}
_DM_COLD_BEGIN
/* A group's two tracks, named: its operations, and the queue times of its _async calls. */
_DM_PRIVATE void _dm_trace_name_tracks(_dm_trace* t, const char* backend) {
    char line[512];
    _DM_ZERO(_dm_tbuf, b);
    int k;
    b.p = line; b.cap = sizeof(line);
    for (k = 0; k < 2; k++) {
        _dm_tb_s(&b, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":"); _dm_tb_i(&b, t->rk->rank);
        _dm_tb_s(&b, ",\"tid\":"); _dm_tb_i(&b, t->tid + k);
        _dm_tb_s(&b, ",\"args\":{\"name\":"); _dm_tb_str(&b, k ? "queued" : t->group);
        _dm_tb_s(&b, ",\"group\":"); _dm_tb_str(&b, t->group);
        _dm_tb_s(&b, ",\"rank\":"); _dm_tb_i(&b, t->rank);
        _dm_tb_s(&b, ",\"size\":"); _dm_tb_i(&b, t->size);
        _dm_tb_s(&b, ",\"backend\":"); _dm_tb_str(&b, backend);
        _dm_tb_s(&b, "}}");
    }
    pthread_mutex_lock(&t->rk->mu);
    _dm_trace_append_locked(t->rk, line, b.len, _dm_trace_now(), false);
    pthread_mutex_unlock(&t->rk->mu);
}

/* ---- making and releasing ---- */
_DM_PRIVATE void _dm_trace_sig_start(void);
_DM_PRIVATE _dm_trace_rank* _dm_trace_rank_new(dm_collective* c) {
    _dm_trace_rank* rk = (_dm_trace_rank*)_dm_calloc(&c->allocator, sizeof(_dm_trace_rank));
    const char* s;
    if (!rk) return NULL;
    pthread_mutex_init(&rk->mu, NULL);
    rk->rank = c->rank;
    rk->size = c->size;
    rk->pid = (long)getpid();
    rk->allocator = c->allocator;
    rk->logger = c->logger;
    rk->fr_cap = _dm_trace_fr_cap(&c->logger);
    rk->fd = -1;
    if ((s = _dm_cfg_str_logged(_DM_CFG_TRACE, &c->logger)) != NULL) _dm_copy_name(rk->trace_dir, sizeof(rk->trace_dir), s);
    if ((s = _dm_cfg_str_logged(_DM_CFG_DUMP_DIR, &c->logger)) != NULL) _dm_copy_name(rk->dump_dir, sizeof(rk->dump_dir), s);
    rk->last_flush = _dm_trace_now();
    rk->tsc = rk->trace_dir[0] && _dm_trace_tsc_usable();
    return rk;
}
/* A group's part of rank rk, linked into it; NULL when out of memory. */
_DM_PRIVATE _dm_trace* _dm_trace_group_new(dm_collective* c, _dm_trace_rank* rk, const char* group) {
    _dm_trace* t = (_dm_trace*)_dm_calloc(&c->allocator, sizeof(_dm_trace));
    size_t W = (size_t)(c->size > 0 ? c->size : 1), ring_bytes;
    if (!t) return NULL;
    t->cap = rk->fr_cap;
    ring_bytes = t->cap ? sizeof(_dm_tr_slot) * ((size_t)t->cap + 1) : 0;
    t->hot = _dm_calloc(&c->allocator, 64 + ring_bytes + sizeof(uint64_t) * W + 64);   /* padded both ends */
    t->wait_ns = (int64_t*)_dm_calloc(&c->allocator, sizeof(int64_t) * W);
    t->touched = (int*)_dm_calloc(&c->allocator, sizeof(int) * W);
    if (!t->hot || !t->wait_ns || !t->touched) {
        _dm_free(&c->allocator, t->hot);
        _dm_free(&c->allocator, t->wait_ns); _dm_free(&c->allocator, t->touched); _dm_free(&c->allocator, t);
        return NULL;
    }
    t->ring = (_dm_tr_slot*)(void*)((unsigned char*)t->hot + 64 - (uintptr_t)t->hot % 64);
    t->peer_last = (uint64_t*)(void*)((unsigned char*)t->ring + ring_bytes);
    if (!t->cap) t->ring = NULL;
    pthread_mutex_init(&t->mu, NULL);
    t->rk = rk;
    t->c = c;
    t->rank = c->rank;
    t->size = c->size;
    _dm_copy_name(t->group, sizeof(t->group), group);
    t->fast = t->cap > 0 && !rk->trace_dir[0];
    pthread_mutex_lock(&rk->mu);
    rk->refs++;
    t->tid = 2 * rk->ntids++;
    t->next = rk->groups;
    rk->groups = t;
    pthread_mutex_unlock(&rk->mu);
    _dm_trace_name_tracks(t, c->vt && c->vt->name ? c->vt->name : "none");
    return t;
}
_DM_COLD_END
/* c's state, made at its first operation as the root of a new rank ("world"). NULL: out of
   memory (c then runs untraced). */
_DM_PRIVATE _dm_trace* _dm_trace_get(dm_collective* c) {
    _dm_trace* t = __atomic_load_n(&c->core->trace, __ATOMIC_ACQUIRE);
    _dm_trace_rank* rk;
    if (t != _dm_trace_pending) return t;
    pthread_mutex_lock(&_dm_tr_reg_mu);    /* a dump on another thread may be making it too */
    t = __atomic_load_n(&c->core->trace, __ATOMIC_ACQUIRE);
    if (t != _dm_trace_pending) { pthread_mutex_unlock(&_dm_tr_reg_mu); return t; }
    rk = _dm_trace_rank_new(c);
    if (rk) rk->instance = __atomic_fetch_add(&_dm_tr_instances[(unsigned)c->rank % 1024u], 1, __ATOMIC_RELAXED);
    t = rk ? _dm_trace_group_new(c, rk, "world") : NULL;
    if (!t && rk) { pthread_mutex_destroy(&rk->mu); _dm_free(&c->allocator, rk); }
    if (t && rk->fr_cap > 0 && rk->dump_dir[0] && _dm_cfg_int_logged(_DM_CFG_DUMP_ON_SIGUSR1, &c->logger)) {
        _dm_trace_sig_start();
        rk->registered = true;
        rk->next = _dm_tr_reg;
        _dm_tr_reg = rk;
    }
    __atomic_store_n(&c->core->trace, t, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&_dm_tr_reg_mu);
    return t;
}
_DM_COLD_BEGIN
/* child, just made from c (split, shrink, grow), joins c's rank as group "<c's>/<what><k>". */
_DM_PRIVATE void _dm_trace_adopt(dm_collective* c, dm_collective* child, const char* what, int color) {
    _dm_trace* t = _dm_trace_get(c);
    _dm_trace* old = __atomic_load_n(&child->core->trace, __ATOMIC_ACQUIRE);
    char name[96];
    if (!t || (old && old != _dm_trace_pending)) return;
    t->children++;
    if (color >= 0) snprintf(name, sizeof(name), "%.60s/%s%dc%d", t->group, what, t->children, color);
    else snprintf(name, sizeof(name), "%.60s/%s%d", t->group, what, t->children);
    __atomic_store_n(&child->core->trace, _dm_trace_group_new(child, t->rk, name), __ATOMIC_RELEASE);
}
/* dm_destroy's first step: dumps stop looking at c (its requests and fields go away next). */
_DM_PRIVATE void _dm_trace_closing(dm_collective* c) {
    _dm_trace* t = __atomic_load_n(&c->core->trace, __ATOMIC_ACQUIRE);
    if (!t || t == _dm_trace_pending) return;
    pthread_mutex_lock(&t->rk->mu);
    t->c = NULL;
    pthread_mutex_unlock(&t->rk->mu);
}
/* dm_destroy's last step before the backend's: the group leaves its rank; the last one out
   flushes and closes the timeline (with its closing bracket). */
_DM_PRIVATE void _dm_trace_release(dm_collective* c) {
    _dm_trace* t = __atomic_load_n(&c->core->trace, __ATOMIC_ACQUIRE);
    _dm_trace_rank* rk;
    _dm_trace** p;
    bool last;
    __atomic_store_n(&c->core->trace, (_dm_trace*)NULL, __ATOMIC_RELEASE);
    if (!t || t == _dm_trace_pending) return;
    rk = t->rk;
    pthread_mutex_lock(&_dm_tr_reg_mu);
    pthread_mutex_lock(&rk->mu);
    for (p = &rk->groups; *p && *p != t; p = &(*p)->next) {}
    if (*p) *p = t->next;
    last = --rk->refs == 0;
    if (last && rk->registered) {
        _dm_trace_rank** q;
        for (q = &_dm_tr_reg; *q && *q != rk; q = &(*q)->next) {}
        if (*q) *q = rk->next;
    }
    if (last && rk->fd >= 0) {
        static const char tail[] = "\n]\n";
        _dm_trace_append_locked(rk, tail, sizeof(tail) - 1, _dm_trace_now(), true);
        if (rk->reserved > rk->written) {       /* the unused reserve back (a file only this process wrote) */
            struct stat st;
            if (fstat(rk->fd, &st) == 0 && (uint64_t)st.st_size == rk->written && ftruncate(rk->fd, st.st_size) != 0) {}
        }
        close(rk->fd);
        rk->fd = -1;
    }
    pthread_mutex_unlock(&rk->mu);
    pthread_mutex_unlock(&_dm_tr_reg_mu);
    pthread_mutex_destroy(&t->mu);
    _dm_free(&c->allocator, t->hot); _dm_free(&c->allocator, t->wait_ns); _dm_free(&c->allocator, t->touched);
    _dm_free(&c->allocator, t);
    if (!last) return;
    pthread_mutex_destroy(&rk->mu);
    _dm_free(&rk->allocator, rk->buf);
    _dm_free(&rk->allocator, rk);
}

_DM_COLD_END
/* ---- hooks in the engine ---- */
/* The running operation waited wait_us on peer (the thread running it calls this). */
_DM_PRIVATE void _dm_trace_wait(dm_collective* c, int peer, int64_t wait_us) {
    _dm_trace* t = __atomic_load_n(&c->core->trace, __ATOMIC_ACQUIRE);
    if (!t || t == _dm_trace_pending || peer < 0 || peer >= t->size || wait_us <= 0) return;
    if (t->wait_ns[peer] == 0) t->touched[t->ntouched++] = peer;
    t->wait_ns[peer] += wait_us * 1000;
}
/* An idle spell of the running operation that began at since_us (_dm_now_us) just ended:
   timed for the timeline only (the flight recorder keeps no waits, so it pays no clock). */
_DM_PRIVATE void _dm_trace_waited(dm_collective* c, int peer, int64_t since_us) {
    _dm_trace* t = __atomic_load_n(&c->core->trace, __ATOMIC_ACQUIRE);
    if (!t || t == _dm_trace_pending || !t->rk->trace_dir[0]) return;
    _dm_trace_wait(c, peer, _dm_now_us() - since_us);
}
/* A collective's fingerprint arrived from peer: the peer has entered collective #seq. */
_DM_PRIVATE void _dm_trace_peer_seen(dm_collective* c, int peer, int kind, uint64_t seq) {
    _dm_trace* t = __atomic_load_n(&c->core->trace, __ATOMIC_ACQUIRE);
    if (!t || t == _dm_trace_pending || peer < 0 || peer >= t->size || kind == 6 /* _DM_K_SETUP */) return;
    __atomic_store_n(&t->peer_last[peer], seq << 8 | (uint64_t)(kind & 0xff), __ATOMIC_RELAXED);
}

/* ---- one operation ---- */
/* What an entry says of its operation before it runs: the bytes (count x dtype size as
   passed; all_to_all_v: sent; objects: their bytes), and the root of the kinds that have one
   (else -1). */
#define _DM_TR_ROOTED (1u << DM_OP_BROADCAST | 1u << DM_OP_BROADCAST_OBJECTS | 1u << DM_OP_REDUCE | \
                       1u << DM_OP_GATHER | 1u << DM_OP_SCATTER | 1u << DM_OP_SEND | 1u << DM_OP_RECV)
_DM_PRIVATE uint64_t _dm_tr_bytes_summed(const dm_collective* c, const dm_op* o, size_t esize) {
    uint64_t bytes = 0;
    size_t i;
    if (o->kind == DM_OP_ALL_TO_ALL_V)
        for (i = 0; i < (size_t)c->size; i++) bytes += (uint64_t)o->send_counts[i] * esize;
    else
        for (i = 0; i < o->count; i++) bytes += o->objects[i].size;
    return bytes;
}
/* Always inlined, the summing kinds out of line: on the recorder's fast path a call here cost
   more than the count (see _dm_trace_fr_put). */
_DM_PRIVATE _DM_ALWAYS_INLINE uint64_t _dm_tr_bytes(const dm_collective* c, const dm_op* o) {
    size_t esize = (unsigned)o->dtype < DM_DTYPE_COUNT ? dm_dtype_size(o->dtype) : 1;
    if (o->kind == DM_OP_BARRIER || o->kind == DM_OP_SPLIT) return 0;
    if ((o->kind == DM_OP_ALL_TO_ALL_V && o->send_counts) || (o->kind == DM_OP_BROADCAST_OBJECTS && o->objects))
        return _dm_tr_bytes_summed(c, o, esize);
    return (uint64_t)o->count * esize;
}
_DM_PRIVATE int32_t _dm_tr_root(const dm_op* o) {
    return (unsigned)o->kind < 32 && (_DM_TR_ROOTED >> o->kind & 1u) ? o->root : -1;
}
/* The number _dm_op_begin is about to give o (object collectives: their first part's). */
_DM_PRIVATE uint64_t _dm_tr_seq_next(const dm_collective* c, const dm_op* o) {
    return __atomic_load_n(&c->seq, __ATOMIC_RELAXED) + (o->kind == DM_OP_SEND || o->kind == DM_OP_RECV ? 0 : 1);
}
_DM_PRIVATE void _dm_trace_describe(dm_collective* c, const dm_op* o, _dm_tr_entry* e) {
    memset(e, 0, sizeof(*e));
    e->kind = (uint8_t)o->kind;
    e->dtype = (int8_t)o->dtype;
    e->root = _dm_tr_root(o);
    e->composite = o->kind == DM_OP_ALL_GATHER_OBJECTS || o->kind == DM_OP_BROADCAST_OBJECTS;
    e->bytes = _dm_tr_bytes(c, o);
    e->seq = _dm_tr_seq_next(c, o);
}
/* The ring without a lock (Boehm's seqlock, "Can seqlocks get along with programming language
   memory models?", 2012): the writer marks the slot odd, stores the words, marks it even; a
   reader copies the words between two reads of ver and keeps them when both say entry i.
   The words are packed field by field (not the struct's bytes copied: no wide load of fields
   just stored narrow, which the CPU would stall on). On x86 the release fence and stores are
   plain stores: a slot costs its ten stores. Always inlined: the words then go from registers,
   not through the caller's array on the stack. */
_DM_PRIVATE _DM_ALWAYS_INLINE void _dm_tr_slot_write(_dm_tr_slot* s, uint64_t i, const uint64_t w[8]) {
    __atomic_store_n(&s->ver, 2 * i + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(&s->w[0], w[0], __ATOMIC_RELAXED);
    __atomic_store_n(&s->w[1], w[1], __ATOMIC_RELAXED);
    __atomic_store_n(&s->w[2], w[2], __ATOMIC_RELAXED);
    __atomic_store_n(&s->w[3], w[3], __ATOMIC_RELAXED);
    __atomic_store_n(&s->w[4], w[4], __ATOMIC_RELAXED);
    __atomic_store_n(&s->w[5], w[5], __ATOMIC_RELAXED);
    __atomic_store_n(&s->w[6], w[6], __ATOMIC_RELAXED);
    __atomic_store_n(&s->w[7], w[7], __ATOMIC_RELAXED);
    __atomic_store_n(&s->ver, 2 * i + 2, __ATOMIC_RELEASE);
}
/* Words 6 and 7 of an entry: status and root; kind, state, async, composite and dtype. */
_DM_PRIVATE uint64_t _dm_tr_w6(int32_t status, int32_t root) {
    return (uint64_t)(uint32_t)status | (uint64_t)(uint32_t)root << 32;
}
_DM_PRIVATE uint64_t _dm_tr_w7(const _dm_tr_entry* e) {
    return (uint64_t)e->kind | (uint64_t)e->state << 8 | (uint64_t)e->async << 16 | (uint64_t)e->composite << 24 |
           (uint64_t)(uint8_t)e->dtype << 32;
}
_DM_PRIVATE void _dm_tr_slot_put(_dm_tr_slot* s, uint64_t i, const _dm_tr_entry* e) {
    uint64_t w[8];
    w[0] = e->seq;
    w[1] = e->bytes;
    w[2] = (uint64_t)e->t_queued;
    w[3] = (uint64_t)e->t_start;
    w[4] = (uint64_t)e->t_end;
    w[5] = (uint64_t)(uintptr_t)e->algorithm;
    w[6] = _dm_tr_w6(e->status, e->root);
    w[7] = _dm_tr_w7(e);
    _dm_tr_slot_write(s, i, w);
}
/* Entry number i into e: false when the slot holds an older entry (i not written yet) or a
   newer one (overwritten), or stayed mid-write through every retry (a writer descheduled
   there). */
_DM_PRIVATE bool _dm_tr_slot_get(const _dm_tr_slot* s, uint64_t i, _dm_tr_entry* e) {
    uint64_t w[8], v1, v2;
    size_t k;
    int tries;
    for (tries = 0; tries < 1000; tries++) {
        v1 = __atomic_load_n(&s->ver, __ATOMIC_ACQUIRE);
        if (v1 > 2 * i + 2 || v1 < 2 * i + 1) return false;
        if (v1 == 2 * i + 2) {
            for (k = 0; k < 8; k++) w[k] = __atomic_load_n(&s->w[k], __ATOMIC_RELAXED);
            __atomic_thread_fence(__ATOMIC_ACQUIRE);
            v2 = __atomic_load_n(&s->ver, __ATOMIC_RELAXED);
            if (v1 == v2) {
                memset(e, 0, sizeof(*e));
                e->seq = w[0];
                e->bytes = w[1];
                e->t_queued = (int64_t)w[2];
                e->t_start = (int64_t)w[3];
                e->t_end = (int64_t)w[4];
                e->algorithm = (const char*)(uintptr_t)w[5];
                e->status = (int32_t)(uint32_t)w[6];
                e->root = (int32_t)(uint32_t)(w[6] >> 32);
                e->kind = (uint8_t)w[7];
                e->state = (uint8_t)(w[7] >> 8);
                e->async = (uint8_t)(w[7] >> 16);
                e->composite = (uint8_t)(w[7] >> 24);
                e->dtype = (int8_t)(uint8_t)(w[7] >> 32);
                return true;
            }
        }
        if (tries >= 16) sched_yield();
    }
    return false;
}
/* The slot of entry number i (see _dm_trace.ring). */
_DM_PRIVATE _dm_tr_slot* _dm_tr_slot_at(_dm_trace* t, uint64_t i) { return &t->ring[i % ((uint64_t)t->cap + 1)]; }
/* Count one more entry, published after its slot (the writer's). */
_DM_PRIVATE void _dm_tr_advance(_dm_trace* t) {
    t->next_slot = t->next_slot == t->cap ? 0 : t->next_slot + 1;
    __atomic_store_n(&t->count, t->count + 1, __ATOMIC_RELEASE);
}
/* Records e as entry number *index (a new one when *index is UINT64_MAX), on the group's
   writing thread: count is published after the slot. */
_DM_PRIVATE void _dm_trace_record(_dm_trace* t, const _dm_tr_entry* e, uint64_t* index) {
    uint64_t n;
    if (!t->cap) return;
    n = t->count;
    if (*index == UINT64_MAX) {
        *index = n;
        _dm_tr_slot_put(&t->ring[t->next_slot], n, e);
        _dm_tr_advance(t);
    } else if (*index + t->cap >= n) {
        _dm_tr_slot_put(_dm_tr_slot_at(t, *index), *index, e);    /* else overwritten since */
    }
}
/* The operation e starts: it goes into the slot after the newest entry (entry number count),
   where dumps find it running; its end rewrites the slot and counts it. */
_DM_PRIVATE void _dm_trace_running(_dm_trace* t, const _dm_tr_entry* e) {
    if (t->cap) _dm_tr_slot_put(&t->ring[t->next_slot], t->count, e);
}
/* The operation's end as seen by dumps, on the running thread: the failure message, and the
   transport (asked every 64 operations: a backend may add links as it goes, and asking walks
   them all). */
_DM_PRIVATE void _dm_trace_note_end(dm_collective* c, _dm_trace* t, dm_status st, bool first) {
    const char* tr;
    if (st == DM_OK && !first && (t->ops & 63) != 0) return;
    tr = dm_transport_name(c);
    if (st == DM_OK && strncmp(t->transport, tr, sizeof(t->transport) - 1) == 0) return;
    pthread_mutex_lock(&t->mu);
    _dm_copy_name(t->transport, sizeof(t->transport), tr);
    if (st != DM_OK) _dm_copy_name(t->error, sizeof(t->error), _dm_errbuf(c));
    pthread_mutex_unlock(&t->mu);
}
/* One event line, written straight into the timeline's buffer with room for _DM_TR_LINE: the
   hot path of the timeline, so no bounds checks per piece and no escaping (every string here
   is ours: op and dtype names, the group names made in _dm_trace_adopt, the backend's
   algorithm and transport names). */
#define _DM_TR_LINE 2048
#define _DM_TR_WAITS 32                 /* peers listed per event: the first 32 waited on */
#define _DM_TB_LIT(p, lit) (memcpy((p), (lit), sizeof(lit) - 1), (p) += sizeof(lit) - 1)
static const char _dm_tb_d2[] =         /* "00" "01" ... "99": two digits per division */
    "0001020304050607080910111213141516171819"
    "2021222324252627282930313233343536373839"
    "4041424344454647484950515253545556575859"
    "6061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";
_DM_PRIVATE char* _dm_tb_pstr(char* p, const char* s, size_t max) {
    size_t n = strlen(s);
    if (n > max) n = max;
    memcpy(p, s, n);
    return p + n;
}
_DM_PRIVATE char* _dm_tb_pu(char* p, uint64_t v) {
    char d[20];
    int n = 20;
    while (v >= 100) {
        unsigned k = (unsigned)(v % 100) * 2;
        v /= 100;
        d[--n] = _dm_tb_d2[k + 1];
        d[--n] = _dm_tb_d2[k];
    }
    if (v >= 10) { d[--n] = _dm_tb_d2[v * 2 + 1]; d[--n] = _dm_tb_d2[v * 2]; }
    else d[--n] = (char)('0' + v);
    memcpy(p, d + n, (size_t)(20 - n));
    return p + 20 - n;
}
/* ".ddd": the nanoseconds below a microsecond (frac < 1000). */
_DM_PRIVATE char* _dm_tb_pfrac(char* p, uint32_t frac) {
    p[0] = '.';
    p[1] = (char)('0' + frac / 100);
    memcpy(p + 2, _dm_tb_d2 + (frac % 100) * 2, 2);
    return p + 4;
}
/* ns as microseconds with three decimals (trace-event "ts" and "dur"). */
_DM_PRIVATE char* _dm_tb_pus(char* p, int64_t ns) {
    uint64_t u;
    if (ns < 0) { *p++ = '-'; ns = -ns; }
    u = (uint64_t)ns;
    p = _dm_tb_pu(p, u / 1000);
    return _dm_tb_pfrac(p, (uint32_t)(u % 1000));
}
/* A time stamp as _dm_tb_pus writes it, with the seconds' digits written once a second
   (t->ts_*, the running thread's): only the 6 + 3 digits below them are formatted per event. */
_DM_PRIVATE char* _dm_tb_pts(char* p, _dm_trace* t, int64_t ns) {
    int64_t sec = ns / 1000000000;
    uint32_t rem, us, frac;
    if (sec <= 0) return _dm_tb_pus(p, ns);
    if (sec != t->ts_sec) {
        t->ts_len = (size_t)(_dm_tb_pu(t->ts_digits, (uint64_t)sec) - t->ts_digits);
        t->ts_sec = sec;
    }
    rem = (uint32_t)(ns - sec * 1000000000);
    us = rem / 1000;
    frac = rem % 1000;
    memcpy(p, t->ts_digits, t->ts_len);
    p += t->ts_len;
    memcpy(p, _dm_tb_d2 + (us / 10000) * 2, 2);
    memcpy(p + 2, _dm_tb_d2 + (us / 100 % 100) * 2, 2);
    memcpy(p + 4, _dm_tb_d2 + (us % 100) * 2, 2);
    return _dm_tb_pfrac(p + 6, frac);
}
/* One trace event: the operation on the group's track, its queue time on the next track.
   Collectives carry no "cat" (the common case, kept short); the others say p2p, objects, queue. */
_DM_PRIVATE void _dm_trace_event(_dm_trace* t, const _dm_tr_entry* e, bool flush) {
    char *line, *p;
    const char* name = _dm_op_name((dm_op_kind)e->kind);
    int k;
    pthread_mutex_lock(&t->rk->mu);
    line = p = _dm_trace_room_locked(t->rk, _DM_TR_LINE, e->t_end);
    if (!p) { pthread_mutex_unlock(&t->rk->mu); return; }
    if (e->async && e->t_queued) {
        _DM_TB_LIT(p, ",\n{\"name\":\""); p = _dm_tb_pstr(p, name, 32);
        _DM_TB_LIT(p, "\",\"cat\":\"queue\",\"ph\":\"X\",\"pid\":"); p = _dm_tb_pu(p, (uint64_t)t->rk->rank);
        _DM_TB_LIT(p, ",\"tid\":"); p = _dm_tb_pu(p, (uint64_t)t->tid + 1);
        _DM_TB_LIT(p, ",\"ts\":"); p = _dm_tb_pts(p, t, e->t_queued);
        _DM_TB_LIT(p, ",\"dur\":"); p = _dm_tb_pus(p, e->t_start - e->t_queued);
        _DM_TB_LIT(p, ",\"args\":{\"seq\":"); p = _dm_tb_pu(p, e->seq);
        _DM_TB_LIT(p, ",\"group\":\""); p = _dm_tb_pstr(p, t->group, sizeof(t->group));
        _DM_TB_LIT(p, "\"}}");
    }
    _DM_TB_LIT(p, ",\n{\"name\":\""); p = _dm_tb_pstr(p, name, 32);
    if (e->composite) _DM_TB_LIT(p, "\",\"cat\":\"objects");
    else if (e->kind == DM_OP_SEND || e->kind == DM_OP_RECV) _DM_TB_LIT(p, "\",\"cat\":\"p2p");
    _DM_TB_LIT(p, "\",\"ph\":\"X\",\"pid\":"); p = _dm_tb_pu(p, (uint64_t)t->rk->rank);
    _DM_TB_LIT(p, ",\"tid\":"); p = _dm_tb_pu(p, (uint64_t)t->tid);
    _DM_TB_LIT(p, ",\"ts\":"); p = _dm_tb_pts(p, t, e->t_start);
    _DM_TB_LIT(p, ",\"dur\":"); p = _dm_tb_pus(p, e->t_end - e->t_start);
    _DM_TB_LIT(p, ",\"args\":{\"seq\":"); p = _dm_tb_pu(p, e->seq);
    _DM_TB_LIT(p, ",\"group\":\""); p = _dm_tb_pstr(p, t->group, sizeof(t->group));
    _DM_TB_LIT(p, "\",\"bytes\":"); p = _dm_tb_pu(p, e->bytes);
    _DM_TB_LIT(p, ",\"dtype\":\""); p = _dm_tb_pstr(p, dm_dtype_name((dm_dtype)e->dtype), 16);
    _DM_TB_LIT(p, "\",\"algorithm\":\""); p = _dm_tb_pstr(p, e->algorithm ? e->algorithm : "", 48);
    _DM_TB_LIT(p, "\",\"transport\":\""); p = _dm_tb_pstr(p, t->transport, sizeof(t->transport));
    *p++ = '"';
    if (e->root >= 0) { _DM_TB_LIT(p, ",\"root\":"); p = _dm_tb_pu(p, (uint64_t)e->root); }
    if (e->t_queued) { _DM_TB_LIT(p, ",\"queued\":"); p = _dm_tb_pts(p, t, e->t_queued); }
    if (e->status != DM_OK) {
        _DM_TB_LIT(p, ",\"status\":\""); p = _dm_tb_pstr(p, dm_status_name((dm_status)e->status), 40);
        *p++ = '"';
    }
    if (t->ntouched) {
        _DM_TB_LIT(p, ",\"wait_us\":{");
        for (k = 0; k < t->ntouched && k < _DM_TR_WAITS; k++) {
            int peer = t->touched[k];
            if (k) *p++ = ',';
            *p++ = '"'; p = _dm_tb_pu(p, (uint64_t)peer); *p++ = '"'; *p++ = ':';
            p = _dm_tb_pus(p, t->wait_ns[peer]);
        }
        *p++ = '}';
    }
    _DM_TB_LIT(p, "}}");
    _dm_trace_commit_locked(t->rk, (size_t)(p - line), e->t_end, flush);
    pthread_mutex_unlock(&t->rk->mu);
}
/* The timeline through the TSC (rk->tsc): an operation's start reads clock_gettime and the TSC
   together once its anchor is 100 ms old (clk_span ticks), measuring the ticks' rate against
   CLOCK_REALTIME over that span; every other read scales the TSC from the anchor (a few ns off
   clock_gettime at most). An end past the span, a rate not measured yet or one that moved by
   more than 1% (a migrated VM) read clock_gettime. */
#define _DM_TR_CLK_NS ((int64_t)100 * 1000000)
_DM_PRIVATE int64_t _dm_trace_clock_tsc(_dm_trace* t, bool start) {
#if defined(_DM_TR_TSC)
    uint64_t c0 = __builtin_ia32_rdtsc(), c1, mid, mult;
    int64_t ns, dn;
    if (t->clk_mult && c0 - t->clk_tsc < t->clk_span)
        return t->clk_ns + (int64_t)(((c0 - t->clk_tsc) * t->clk_mult) >> 32);
    ns = _dm_trace_now();
    if (!start) return ns;
    c1 = __builtin_ia32_rdtsc();
    if (c1 - c0 > 20000) return ns;     /* preempted between the reads (~10 us): no anchor there */
    mid = c0 + (c1 - c0) / 2;
    dn = ns - t->clk_ns;
    if (t->clk_ns && dn < _DM_TR_CLK_NS / 2 && t->clk_mult == 0) return ns;     /* measuring: too soon */
    if (t->clk_ns && dn > 0 && dn < ((int64_t)1 << 32) && mid > t->clk_tsc) {
        mult = ((uint64_t)dn << 32) / (mid - t->clk_tsc);
        if (t->clk_mult && (mult > t->clk_mult + t->clk_mult / 100 || mult < t->clk_mult - t->clk_mult / 100))
            mult = 0;
        t->clk_mult = mult;
        t->clk_span = mult ? ((uint64_t)_DM_TR_CLK_NS << 32) / mult : 0;
    }
    t->clk_tsc = mid;
    t->clk_ns = ns;
    return ns;
#else
    (void)t; (void)start;
    return _dm_trace_now();
#endif
}
_DM_PRIVATE int64_t _dm_trace_clock(_dm_trace* t, bool start) {
    if (!t->rk->trace_dir[0]) return _dm_trace_now_coarse();
    return t->rk->tsc ? _dm_trace_clock_tsc(t, start) : _dm_trace_now();
}
_DM_PRIVATE void _dm_trace_clear_waits(_dm_trace* t) {
    int k;
    for (k = 0; k < t->ntouched; k++) t->wait_ns[t->touched[k]] = 0;
    t->ntouched = 0;
}
_DM_PRIVATE dm_status _dm_trace_dump_rank(_dm_trace_rank* rk, const char* path, const char* reason);
/* A failure that breaks the group: the ones the flight recorder is dumped for. */
_DM_PRIVATE bool _dm_trace_dumps_on(dm_status st) {
    return st == DM_ERR_TIMEOUT || st == DM_ERR_PEER_LOST || st == DM_ERR_MISMATCH || st == DM_ERR_ABORTED ||
           st == DM_ERR_NETWORK || st == DM_ERR_PROTOCOL;
}
/* The end of an operation recorded in e (started, and entry *index): ring, timeline, dump. */
_DM_PRIVATE void _dm_trace_finish(dm_collective* c, _dm_trace* t, _dm_tr_entry* e, uint64_t* index, dm_status st) {
    e->t_end = _dm_trace_clock(t, false);
    e->status = (int32_t)st;
    e->state = st == DM_OK ? _DM_TR_DONE : _DM_TR_FAILED;
    e->algorithm = c->algorithm;
    _dm_trace_note_end(c, t, st, t->ops++ == 0);
    _dm_trace_record(t, e, index);
    if (t->rk->trace_dir[0]) _dm_trace_event(t, e, st != DM_OK);
    _dm_trace_clear_waits(t);
    if (st == DM_OK) { t->dumped = false; return; }
    if (_dm_trace_dumps_on(st) && !t->dumped && t->rk->dump_dir[0] && t->cap) {
        char reason[DM_LAST_ERROR_SIZE + 256];
        t->dumped = true;
        snprintf(reason, sizeof(reason), "%s in %s #%llu of group %.96s: %.511s", dm_status_name(st),
                 _dm_op_name((dm_op_kind)e->kind), (unsigned long long)e->seq, t->group, t->error);
        _dm_trace_dump_rank(t->rk, NULL, reason);
    }
}
/* ---- the flight recorder alone: the fast path ---- */
/* On by default, so it must cost nothing a caller can measure on the smallest collective (2
   ranks, 8 bytes over shared memory: ~0.2 us a call, 3% of which is ~6 ns, less than one read
   of the coarse clock). What an operation of at most _DM_TR_LAZY_COUNT elements does between
   the peer's bytes arriving and its own next ones leaving (the end of one call, the start of
   the next: every rank's time per call) is kept to a few stores; the rest is done where it
   waits anyway, at the engine's first look that finds nothing (_dm_trace_idle): its entry is
   written there, running, with its start read on the coarse clock. Its end rewrites the state,
   the algorithm and the end, which is the start's reading unless it slept (an idle spell past
   the engine's yielding, _dm_trace_idle(c, true)): on the coarse clock (a tick every 1-4 ms)
   such a call shows start = end almost always anyway. A call that never waited (it completed
   at once: no peer held it up) is written whole at its end, with one clock read for both
   times; until then it is not in the ring, so a dump taken in those microseconds does not list
   it as running. Larger operations are written as they start, with both ends read. */
#define _DM_TR_LAZY_COUNT ((size_t)8 << 10)
/* o's entry into its slot (entry number count): running from start, or done (it never waited:
   start and end one reading of the clock). Inlined into both callers: written out of line, with
   _dm_tr_bytes called, it cost 1.7 ns more an operation (dm_trace_bench --cpu: 7.0-8.3 ns
   against 5.9-6.1, three alternated runs each). */
_DM_PRIVATE _DM_ALWAYS_INLINE void _dm_trace_fr_put(dm_collective* c, _dm_trace* t, const dm_op* o, bool done,
                                                    int64_t start) {
    uint64_t w[8];
    w[0] = t->fr_seq;
    w[1] = _dm_tr_bytes(c, o);
    w[2] = (uint64_t)t->fr_queued;
    w[3] = (uint64_t)start;
    w[4] = done ? (uint64_t)start : 0;
    w[5] = done ? (uint64_t)(uintptr_t)c->algorithm : 0;
    w[6] = _dm_tr_w6(0, _dm_tr_root(o));
    w[7] = (uint64_t)o->kind | (uint64_t)(done ? _DM_TR_DONE : _DM_TR_RUNNING) << 8 |
           (uint64_t)(t->fr_queued != 0) << 16 | (uint64_t)(uint8_t)o->dtype << 32;
    _dm_tr_slot_write(&t->ring[t->next_slot], t->count, w);
}
/* o's entry, running, its start read now. */
_DM_PRIVATE void _dm_trace_fr_open(dm_collective* c, _dm_trace* t, const dm_op* o) {
    t->fr_start = _dm_trace_now_coarse();
    _dm_trace_fr_put(c, t, o, false, t->fr_start);
}
/* The running operation waits (the engine's hook, on the running thread): its entry is
   written now if it was not yet; slept: the wait went past yielding, so its end is read too. */
_DM_PRIVATE void _dm_trace_idle(dm_collective* c, bool slept) {
    _dm_trace* t = __atomic_load_n(&c->core->trace, __ATOMIC_RELAXED);
    if (!t || t == _dm_trace_pending || !t->fr_op) return;
    if (slept) t->fr_slept = true;
    if (!t->fr_start) _dm_trace_fr_open(c, t, t->fr_op);
}
/* _dm_op_run with the recorder or the timeline on, any operation: the full path. */
_DM_PRIVATE _DM_COLD dm_status _dm_trace_op_run_full(dm_collective* c, const dm_op* o, _dm_op_fn run) {
    _dm_trace* t = _dm_trace_get(c);
    _dm_tr_entry e;
    uint64_t index = UINT64_MAX;
    int64_t queued = _dm_tls_trace_queued;
    dm_status st;
    if (!t) return run(c, o);
    _dm_tls_trace_queued = 0;   /* an operation's own parts were not queued */
    _dm_trace_describe(c, o, &e);
    e.async = queued != 0;
    e.t_queued = queued;
    e.t_start = _dm_trace_clock(t, true);
    e.state = _DM_TR_RUNNING;
    _dm_trace_clear_waits(t);
    if (e.composite) _dm_trace_record(t, &e, &index);   /* its parts take the running slot */
    else _dm_trace_running(t, &e);
    st = run(c, o);
    _dm_trace_finish(c, t, &e, &index, st);
    if (o->kind == DM_OP_SPLIT && st == DM_OK && o->split_out && *o->split_out)
        _dm_trace_adopt(c, *o->split_out, "s", o->color);
    return st;
}
/* A failure on the fast path: the full path's end (the clock, the message, a dump). */
_DM_PRIVATE _DM_COLD dm_status _dm_trace_fr_failed(dm_collective* c, _dm_trace* t, const dm_op* o, dm_status st) {
    _dm_tr_entry e;
    uint64_t index = UINT64_MAX;
    _dm_trace_describe(c, o, &e);
    e.seq = t->fr_seq;
    e.async = t->fr_queued != 0;
    e.t_queued = t->fr_queued;
    e.t_start = t->fr_start ? t->fr_start : _dm_trace_now_coarse();
    _dm_trace_finish(c, t, &e, &index, st);
    return st;
}
/* The fast path (see above): the flight recorder on, the timeline off (t->fast), and not an
   object collective (those record themselves and their parts) nor a split (its child joins
   the rank's recorder): the full path runs those. */
#define _DM_TR_FULL_KINDS (1u << DM_OP_ALL_GATHER_OBJECTS | 1u << DM_OP_BROADCAST_OBJECTS | 1u << DM_OP_SPLIT)
/* _dm_op_run with the recorder or the timeline on, before the run: the fast path's start (false:
   the full path runs o instead). The entry's slot is written lazily (_dm_trace_fr_open): large
   operations at once, small ones at their first wait, or at the end. */
_DM_PRIVATE bool _dm_trace_op_begin(dm_collective* c, const dm_op* o) {
    _dm_trace* t = __atomic_load_n(&c->core->trace, __ATOMIC_ACQUIRE);
    if (!__builtin_expect(t && t != _dm_trace_pending && t->fast && (unsigned)o->kind < 32 &&
                          !(_DM_TR_FULL_KINDS >> o->kind & 1u), 1))
        return false;
    t->fr_seq = _dm_tr_seq_next(c, o);
    t->fr_queued = _dm_tls_trace_queued;
    if (t->fr_queued) _dm_tls_trace_queued = 0;
    t->fr_slept = false;
    t->fr_start = 0;
    if (o->count > _DM_TR_LAZY_COUNT) _dm_trace_fr_open(c, t, o);
    t->fr_op = o;
    return true;
}
/* ... and after it (the same slot: nothing advanced the ring while o ran). */
_DM_PRIVATE dm_status _dm_trace_op_end(dm_collective* c, const dm_op* o, dm_status st) {
    _dm_trace* t = __atomic_load_n(&c->core->trace, __ATOMIC_RELAXED);
    _dm_tr_slot* s = &t->ring[t->next_slot];
    uint64_t i = t->count, end;
    t->fr_op = NULL;
    if (st != DM_OK) return _dm_trace_fr_failed(c, t, o, st);
    if (!t->fr_start) {
        _dm_trace_fr_put(c, t, o, true, _dm_trace_now_coarse());   /* never waited: one write, one reading */
    } else {
        end = (uint64_t)(t->fr_slept || o->count > _DM_TR_LAZY_COUNT ? _dm_trace_now_coarse() : t->fr_start);
        __atomic_store_n(&s->ver, 2 * i + 1, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_RELEASE);
        __atomic_store_n(&s->w[4], end, __ATOMIC_RELAXED);
        __atomic_store_n(&s->w[5], (uint64_t)(uintptr_t)c->algorithm, __ATOMIC_RELAXED);
        __atomic_store_n(&s->w[7], (__atomic_load_n(&s->w[7], __ATOMIC_RELAXED) & ~((uint64_t)0xff << 8)) |
                         (uint64_t)_DM_TR_DONE << 8, __ATOMIC_RELAXED);
        __atomic_store_n(&s->ver, 2 * i + 2, __ATOMIC_RELEASE);
    }
    _dm_tr_advance(t);
    if ((i & 63) == 0) _dm_trace_note_end(c, t, st, true);    /* the transport, every 64 entries */
    t->dumped = false;          /* waits were noted (ntouched) only by a timeout: a failure */
    return st;
}
/* A backend stream request (start / finish slots) as the core sees it: started, then found done. */
_DM_PRIVATE uint64_t _dm_trace_stream_start(dm_collective* c, const dm_op* o, int64_t t_start) {
    _dm_trace* t = _dm_trace_get(c);
    _dm_tr_entry e;
    uint64_t index = UINT64_MAX;
    if (!t) return index;
    _dm_trace_describe(c, o, &e);
    e.seq = __atomic_load_n(&c->seq, __ATOMIC_RELAXED);    /* _dm_op_begin has counted it */
    e.async = 1;
    e.t_queued = t_start;
    e.t_start = t_start;
    e.state = _DM_TR_RUNNING;
    _dm_trace_record(t, &e, &index);
    return index;
}
_DM_PRIVATE void _dm_trace_stream_end(dm_collective* c, const dm_op* o, uint64_t index, int64_t t_start, dm_status st) {
    _dm_trace* t = __atomic_load_n(&c->core->trace, __ATOMIC_ACQUIRE);
    _dm_tr_entry e;
    if (!t || t == _dm_trace_pending) return;
    _dm_trace_describe(c, o, &e);
    if (t->cap && index != UINT64_MAX && index + t->cap >= t->count) {
        _dm_tr_entry was;
        if (_dm_tr_slot_get(_dm_tr_slot_at(t, index), index, &was)) e.seq = was.seq;
    }
    e.async = 1;
    e.t_queued = t_start;
    e.t_start = t_start;
    _dm_trace_finish(c, t, &e, &index, st);
}

_DM_COLD_BEGIN
/* ---- SIGUSR1: the handler only writes a byte; a thread does the dumping ---- */
static void _dm_trace_on_signal(int sig) {
    int saved = errno;
    char one = 1;
    (void)sig;
    if (write(_dm_tr_sigpipe[1], &one, 1) < 0) {}
    errno = saved;
}
static void* _dm_trace_sig_main(void* arg) {
    char b[16];
    (void)arg;
    for (;;) {
        _dm_trace_rank* rk;
        ssize_t n = read(_dm_tr_sigpipe[0], b, sizeof(b));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return NULL;
        pthread_mutex_lock(&_dm_tr_reg_mu);
        for (rk = _dm_tr_reg; rk; rk = rk->next) _dm_trace_dump_rank(rk, NULL, "SIGUSR1");
        pthread_mutex_unlock(&_dm_tr_reg_mu);
    }
}
/* The pipe, the dumping thread, then the handler (SA_RESTART: the application's interrupted
   system calls go on). */
static void _dm_trace_sig_once(void) {
    struct sigaction sa;
    pthread_t th;
    pthread_attr_t attr;
    if (pipe(_dm_tr_sigpipe) != 0) return;
    fcntl(_dm_tr_sigpipe[0], F_SETFD, FD_CLOEXEC);
    fcntl(_dm_tr_sigpipe[1], F_SETFD, FD_CLOEXEC);
    fcntl(_dm_tr_sigpipe[1], F_SETFL, O_NONBLOCK);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&th, &attr, _dm_trace_sig_main, NULL) != 0) { pthread_attr_destroy(&attr); return; }
    pthread_attr_destroy(&attr);
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = _dm_trace_on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
}
/* Once per process, under the registry's lock. A child forked after the parent started has the
   parent's pipe (read by the parent's thread) and copies of its ranks: it starts its own. */
static long _dm_tr_sig_pid;
_DM_PRIVATE void _dm_trace_sig_start(void) {
    if (_dm_tr_sig_pid == (long)getpid()) return;
    if (_dm_tr_sig_pid != 0) {
        close(_dm_tr_sigpipe[0]);
        close(_dm_tr_sigpipe[1]);
        _dm_tr_sigpipe[0] = _dm_tr_sigpipe[1] = -1;
        _dm_tr_reg = NULL;
    }
    _dm_tr_sig_pid = (long)getpid();
    _dm_trace_sig_once();
}
_DM_COLD_END

_DM_COLD_BEGIN
/* >>trace dump  The flight recorder as JSON: the rank, why, and per group its last operations
   (oldest first), the requests still queued, and its view of its peers (the last collective
   each was seen entering: its fingerprint arrived). Written to a temporary name and renamed,
   so a reader never sees half a dump. Caller holds nothing; takes rk->mu, then each group's. */
_DM_PRIVATE void _dm_trace_dump_queued(dm_collective* c, _dm_tbuf* b) {
    _dm_async* a = __atomic_load_n(&c->core->async, __ATOMIC_ACQUIRE);
    dm_request* r;
    bool first = true;
    if (!a) return;
    pthread_mutex_lock(&a->mu);
    for (r = a->head; r; r = r->next) {
        if (r->state != _DM_RQ_QUEUED) continue;    /* running, or ran and waiting for an earlier one */
        _dm_tb_s(b, first ? "\n      {\"op\":" : ",\n      {\"op\":");
        _dm_tb_str(b, _dm_op_name(r->op.kind));
        _dm_tb_s(b, ",\"state\":\"queued\",\"dtype\":"); _dm_tb_str(b, dm_dtype_name(r->op.dtype));
        _dm_tb_s(b, ",\"count\":"); _dm_tb_u(b, (uint64_t)r->op.count);
        _dm_tb_s(b, ",\"t_queued\":"); _dm_tb_us(b, r->tr_queued);
        _dm_tb_s(b, "}");
        first = false;
    }
    pthread_mutex_unlock(&a->mu);
}
_DM_PRIVATE void _dm_trace_dump_entry(_dm_tbuf* b, const _dm_tr_entry* e) {
    _dm_tb_s(b, "{\"seq\":"); _dm_tb_u(b, e->seq);
    _dm_tb_s(b, ",\"op\":"); _dm_tb_str(b, _dm_op_name((dm_op_kind)e->kind));
    _dm_tb_s(b, ",\"state\":"); _dm_tb_str(b, _dm_tr_state_names[e->state & 3]);
    if (e->status != DM_OK) { _dm_tb_s(b, ",\"status\":"); _dm_tb_str(b, dm_status_name((dm_status)e->status)); }
    _dm_tb_s(b, ",\"bytes\":"); _dm_tb_u(b, e->bytes);
    _dm_tb_s(b, ",\"dtype\":"); _dm_tb_str(b, dm_dtype_name((dm_dtype)e->dtype));
    if (e->root >= 0) { _dm_tb_s(b, ",\"root\":"); _dm_tb_i(b, e->root); }
    _dm_tb_s(b, ",\"algorithm\":"); _dm_tb_str(b, e->algorithm ? e->algorithm : "");
    _dm_tb_s(b, ",\"async\":"); _dm_tb_s(b, e->async ? "true" : "false");
    if (e->composite) _dm_tb_s(b, ",\"composite\":true");
    if (e->kind == DM_OP_SEND || e->kind == DM_OP_RECV) _dm_tb_s(b, ",\"p2p\":true");
    if (e->t_queued) { _dm_tb_s(b, ",\"t_queued\":"); _dm_tb_us(b, e->t_queued); }
    _dm_tb_s(b, ",\"t_start\":"); _dm_tb_us(b, e->t_start);
    if (e->t_end) { _dm_tb_s(b, ",\"t_end\":"); _dm_tb_us(b, e->t_end); }
    _dm_tb_s(b, "}");
}
/* The ring is copied first, newest entry first, and only then formatted: a group still running
   operations overwrites its oldest entries meanwhile, and what the copy keeps is the newest ones
   without a gap (it stops at the first entry overwritten). */
_DM_PRIVATE void _dm_trace_dump_group(_dm_tbuf* b, _dm_trace* t) {
    uint64_t i, from, n, got = 0;
    int p;
    bool first = true;
    dm_collective* c = t->c;
    _dm_tr_entry* snap = t->cap ? (_dm_tr_entry*)_dm_malloc(b->grow, sizeof(_dm_tr_entry) * t->cap) : NULL;
    pthread_mutex_lock(&t->mu);
    n = __atomic_load_n(&t->count, __ATOMIC_ACQUIRE);
    from = n > t->cap ? n - t->cap : 0;
    for (i = n; snap && i > from && _dm_tr_slot_get(_dm_tr_slot_at(t, i - 1), i - 1, &snap[got]); i--) got++;
    if (t->cap && !snap) b->bad = true;
    _dm_tb_s(b, "\n  {\"group\":"); _dm_tb_str(b, t->group);
    _dm_tb_s(b, ",\"rank\":"); _dm_tb_i(b, t->rank);
    _dm_tb_s(b, ",\"size\":"); _dm_tb_i(b, t->size);
    _dm_tb_s(b, ",\"backend\":"); _dm_tb_str(b, c && c->vt && c->vt->name ? c->vt->name : "");
    _dm_tb_s(b, ",\"transport\":"); _dm_tb_str(b, t->transport);
    _dm_tb_s(b, ",\"seq\":"); _dm_tb_u(b, c ? __atomic_load_n(&c->seq, __ATOMIC_RELAXED) : 0);
    _dm_tb_s(b, ",\"capacity\":"); _dm_tb_u(b, t->cap);
    _dm_tb_s(b, ",\"recorded\":"); _dm_tb_u(b, n);
    _dm_tb_s(b, ",\"last_error\":"); _dm_tb_str(b, t->error);
    _dm_tb_s(b, ",\n    \"ops\":[");
    for (i = got; i > 0; i--) {
        _dm_tb_s(b, i < got ? ",\n      " : "\n      ");
        _dm_trace_dump_entry(b, &snap[i - 1]);
    }
    _dm_free(b->grow, snap);
    if (t->cap) {                       /* the running one: entry n, not counted yet (a small
                                           one is there from its first wait: _dm_trace_op_begin) */
        _DM_ZERO(_dm_tr_entry, e);
        if (_dm_tr_slot_get(_dm_tr_slot_at(t, n), n, &e)) {
            _dm_tb_s(b, got ? ",\n      " : "\n      ");
            _dm_trace_dump_entry(b, &e);
        }
    }
    pthread_mutex_unlock(&t->mu);
    _dm_tb_s(b, "],\n    \"queued\":[");
    if (c) _dm_trace_dump_queued(c, b);
    _dm_tb_s(b, "],\n    \"peers\":[");
    for (p = 0; p < t->size; p++) {
        uint64_t last = __atomic_load_n(&t->peer_last[p], __ATOMIC_RELAXED);
        int kind = (int)(last & 0xff);
        if (p == t->rank || kind == 0) continue;
        _dm_tb_s(b, first ? "\n      {\"rank\":" : ",\n      {\"rank\":"); _dm_tb_i(b, p);
        _dm_tb_s(b, ",\"last_seq\":"); _dm_tb_u(b, last >> 8);
        _dm_tb_s(b, ",\"last_op\":"); _dm_tb_str(b, _dm_kind_name(kind));
        _dm_tb_s(b, "}");
        first = false;
    }
    _dm_tb_s(b, "]}");
}
_DM_PRIVATE dm_status _dm_trace_dump_rank(_dm_trace_rank* rk, const char* path, const char* reason) {
    char name[400], tmp[420], host[64];
    _DM_ZERO(_dm_tbuf, b);
    _dm_trace* t;
    const char* dir = rk->dump_dir[0] ? rk->dump_dir : rk->trace_dir;
    int fd;
    size_t off = 0;
    if (!path) {
        if (!dir[0]) return DM_ERR_INVALID_ARG;
        mkdir(dir, 0777);
        _dm_trace_file_name(rk, dir, "dm_fr", name, sizeof(name));
        path = name;
    }
    if (gethostname(host, sizeof(host) - 1) != 0) _dm_copy_name(host, sizeof(host), "localhost");
    host[sizeof(host) - 1] = 0;
    b.grow = &rk->allocator;
    b.cap = 4096;
    b.p = (char*)_dm_malloc(&rk->allocator, b.cap);
    if (!b.p) return DM_ERR_OUT_OF_MEMORY;
    pthread_mutex_lock(&rk->mu);
    _dm_tb_s(&b, "{\"distmesh_flight_recorder\":1,\"rank\":"); _dm_tb_i(&b, rk->rank);
    _dm_tb_s(&b, ",\"world_size\":"); _dm_tb_i(&b, rk->size);
    _dm_tb_s(&b, ",\"pid\":"); _dm_tb_i(&b, rk->pid);
    _dm_tb_s(&b, ",\"host\":"); _dm_tb_str(&b, host);
    _dm_tb_s(&b, ",\"reason\":"); _dm_tb_str(&b, reason);
    _dm_tb_s(&b, ",\"time_us\":"); _dm_tb_us(&b, _dm_trace_now());
    _dm_tb_s(&b, ",\"groups\":[");
    for (t = rk->groups; t; t = t->next) {
        _dm_trace_dump_group(&b, t);
        if (t->next) _dm_tb_s(&b, ",");
    }
    _dm_tb_s(&b, "]}\n");
    if (rk->fd >= 0) _dm_trace_flush_locked(rk, _dm_trace_now());
    pthread_mutex_unlock(&rk->mu);
    if (b.bad) { _dm_free(&rk->allocator, b.p); return DM_ERR_OUT_OF_MEMORY; }
    snprintf(tmp, sizeof(tmp), "%s.tmp%ld", path, (long)getpid());
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    while (fd >= 0 && off < b.len) {
        ssize_t n = write(fd, b.p + off, b.len - off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        off += (size_t)n;
    }
    _dm_free(&rk->allocator, b.p);
    if (fd < 0) return DM_ERR_INVALID_ARG;
    close(fd);
    if (off < b.len || rename(tmp, path) != 0) { unlink(tmp); return DM_ERR_INTERNAL; }
    return DM_OK;
}
DM_API_IMPL dm_status dm_flight_recorder_dump(dm_collective* c, const char* path) {
    _dm_trace* t;
    dm_status st;
    if (!c) return DM_ERR_INVALID_ARG;
    if (!__atomic_load_n(&c->core->trace, __ATOMIC_ACQUIRE))
        return _DM_FAIL(c, DM_ERR_UNSUPPORTED, "flight_recorder_dump: the flight recorder and the timeline are off "
                        "(DISTMESH_FLIGHT_RECORDER=0, DISTMESH_TRACE unset)");
    t = _dm_trace_get(c);
    if (!t) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "flight_recorder_dump: out of memory");
    st = _dm_trace_dump_rank(t->rk, path, "dm_flight_recorder_dump");
    if (st == DM_OK) return DM_OK;
    /* a watchdog thread may call this while c's own thread is inside a call: last_error is that
       thread's then, and the message only goes to the logger */
    if (__atomic_load_n(&c->core->busy, __ATOMIC_ACQUIRE)) {
        _DM_LOG(&c->logger, DM_LOG_ERROR, "flight_recorder_dump: %s", !path ? "no path, no directory" : path);
        return st;
    }
    if (st == DM_ERR_INVALID_ARG && !path)
        return _DM_FAIL(c, st, "flight_recorder_dump: no path given and neither DISTMESH_DUMP_DIR nor "
                        "DISTMESH_TRACE is set");
    return _DM_FAIL(c, st, "flight_recorder_dump: could not write %s (%s)", path ? path : "the dump", strerror(errno));
}

_DM_COLD_END

#endif /* !DISTMESH_NO_TRACE */
_DM_WARM_END
#endif /* DISTMESH_IMPL_INCLUDED && !DISTMESH_TRACE_IMPL_INCLUDED */

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
