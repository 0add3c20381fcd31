/* distmesh_thread.h -- distmesh's threaded world. MIT license at end of file.

   Do not include this file yourself: it is part of distmesh.h's implementation, which includes
   it last of its layers (distmesh.h >>layers). Its public calls are declared at distmesh.h
   >>functions create.

   WHAT IT HOLDS  The threaded world: N ranks on N threads of one process, one backend of the
   engine with memory rings in the heap for links. Its members and their shared meeting place
   (the barrier every collective opens with, where fingerprints are compared), its vtable
   slots, split, dm_shrink among the ranks that stay, and dm_thread_world_create / _run.

   WHAT IT MAY CALL  Every layer below: distmesh.h, the kernels, the trace's hooks, the core
   (the base struct's init, the Fake's desc checks, dm_destroy), the engine and the schedules'
   entry points. Nothing below names it.

   SECTIONS  Each opens with a comment that starts ">>tag" (search for it); in file order:
       >>thread                  the threaded world: members, the shared barrier, slots, split
       >>thread shrink           dm_shrink on the threaded world
       >>thread create           its links, vtable, dm_thread_world_create / _run */
#ifndef DISTMESH_H
#error "distmesh_thread.h is part of distmesh.h's implementation: include distmesh.h"
#endif

#if defined(DISTMESH_IMPL_INCLUDED) && !defined(DISTMESH_THREAD_IMPL_INCLUDED)
#define DISTMESH_THREAD_IMPL_INCLUDED
_DM_WARM_BEGIN
/* >>thread  N ranks on N threads of one process. Every collective first meets on a shared
   barrier where each rank posts its fingerprint and all compare them (so a mismatch or a
   missing rank is reported by every rank), then runs the same schedule as the other transports
   over in-process rings (see >>links): the same steps, the same order of reduction, the same
   bits as shared memory and TCP for the same world size. */
typedef struct _dm_tw_slot {
    _dm_fp fp[2];               /* by sequence parity: a rank may post the next while others compare */
    int color, key;
    void* ptr;                  /* split: the new group's shared state, posted by its leader */
    const char* node;           /* split: the member's node_name, for the new group's local rank */
    int site;                   /* split, shrink: the member's site (_dm_thread.site) */
    uint64_t arrived_gen;       /* last barrier generation this rank reached */
} _dm_tw_slot;

typedef struct _dm_tw_shared {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int size;
    int refs;                   /* members not yet destroyed */
    int arrived;
    uint64_t generation;
    dm_status broken;           /* DM_OK, or why the world can no longer be used */
    int broken_rank;            /* the rank whose failure broke it (its notice), or -1 */
    char broken_msg[256];
    dm_allocator allocator;
    _dm_tw_slot* slots;
    /* the in-process transport: a ring per ordered pair of ranks, a bell per rank, sleeping on
       mu/cv; one failure word for the world */
    unsigned char* rings;
    size_t ring_cap, ring_stride;
    _dm_bell* bells;
    _dm_bell_ops bell_ops;
    _dm_abort abort;
    /* dm_shrink (>>thread shrink): who arrived, the union of the excluded, the outcome */
    bool *shrink_in, *shrink_gone;
    struct _dm_tw_shared* shrink_next;
    dm_status shrink_failed;
    char shrink_msg[256];
} _dm_tw_shared;

typedef struct _dm_thread {
    dm_collective base;
    _dm_core core;
    _dm_tw_shared* sh;
    _dm_eng lk;
    int site;                   /* dm_fake_desc.site_of's number for this member (0: one site) */
} _dm_thread;

#define _dm_tw_kind_name _dm_kind_name

static void _dm_tw_bell_wait(void* ctx, _dm_bell* b, uint32_t seen, int ms) {
    _dm_tw_shared* sh = (_dm_tw_shared*)ctx;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    while (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    pthread_mutex_lock(&sh->mu);
    if (__atomic_load_n(&b->seq, __ATOMIC_SEQ_CST) == seen) pthread_cond_timedwait(&sh->cv, &sh->mu, &ts);
    pthread_mutex_unlock(&sh->mu);
}
static void _dm_tw_bell_wake(void* ctx, _dm_bell* b) {
    _dm_tw_shared* sh = (_dm_tw_shared*)ctx;
    (void)b;
    pthread_mutex_lock(&sh->mu);
    pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
}
static const _dm_link_vt _dm_tw_link_vt = {
    "thread", _dm_mem_send, _dm_mem_recv, _dm_mem_peek, _dm_mem_consume, NULL, NULL, _dm_mem_destroy, 8,
    _dm_mem_sendv, NULL
};

/* Rings of 256 KiB for up to 8 ranks, smaller for larger worlds (16 MiB in all at most; the
   pages of pairs that never talk are never touched). */
static size_t _dm_tw_ring_cap(int size) {
    size_t cap = (size_t)256 << 10;
    while (cap > ((size_t)4 << 10) && cap * (size_t)size * (size_t)size > ((size_t)16 << 20)) cap /= 2;
    return cap;
}

static _dm_tw_shared* _dm_tw_shared_new(const dm_allocator* a, int size) {
    _dm_tw_shared* sh = (_dm_tw_shared*)_dm_calloc(a, sizeof(_dm_tw_shared));
    pthread_condattr_t attr;
    if (!sh) return NULL;
    sh->ring_cap = _dm_tw_ring_cap(size);
    sh->ring_stride = sizeof(_dm_ring) + sh->ring_cap;
    sh->slots = (_dm_tw_slot*)_dm_calloc(a, sizeof(_dm_tw_slot) * (size_t)size);
    sh->bells = (_dm_bell*)_dm_calloc(a, sizeof(_dm_bell) * (size_t)size);
    sh->rings = (unsigned char*)_dm_calloc(a, sh->ring_stride * (size_t)size * (size_t)size);
    if (!sh->slots || !sh->bells || !sh->rings) {
        _dm_free(a, sh->slots);
        _dm_free(a, sh->bells);
        _dm_free(a, sh->rings);
        _dm_free(a, sh);
        return NULL;
    }
    sh->bell_ops.wait = _dm_tw_bell_wait;
    sh->bell_ops.wake = _dm_tw_bell_wake;
    sh->bell_ops.ctx = sh;
    sh->allocator = *a;
    sh->size = size;
    sh->refs = size;
    sh->broken_rank = -1;
    pthread_mutex_init(&sh->mu, NULL);
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&sh->cv, &attr);
    pthread_condattr_destroy(&attr);
    return sh;
}
static void _dm_tw_shared_release(_dm_tw_shared* sh) {
    bool last;
    pthread_mutex_lock(&sh->mu);
    last = --sh->refs == 0;
    pthread_mutex_unlock(&sh->mu);
    if (!last) return;
    pthread_mutex_destroy(&sh->mu);
    pthread_cond_destroy(&sh->cv);
    _dm_free(&sh->allocator, sh->slots);
    _dm_free(&sh->allocator, sh->bells);
    _dm_free(&sh->allocator, sh->rings);
    _dm_free(&sh->allocator, sh->shrink_in);
    _dm_free(&sh->allocator, sh->shrink_gone);
    _dm_free(&sh->allocator, sh);
}

/* Marks the world unusable and wakes everyone; the caller holds sh->mu. */
static void _dm_tw_break_locked(_dm_tw_shared* sh, dm_status why, const char* msg) {
    if (sh->broken == DM_OK) {
        sh->broken = why;
        _dm_copy_name(sh->broken_msg, sizeof(sh->broken_msg), msg);
    }
    pthread_cond_broadcast(&sh->cv);
}
/* The ranks that have not reached generation gen, as "1, 3" (for timeout messages). */
static void _dm_tw_missing(const _dm_tw_shared* sh, uint64_t gen, char* buf, size_t cap) {
    size_t used = 0;
    int r;
    buf[0] = 0;
    for (r = 0; r < sh->size && used + 12 < cap; r++)
        if (sh->slots[r].arrived_gen < gen)
            used += (size_t)snprintf(buf + used, cap - used, "%s%d", used ? ", " : "", r);
}

/* The shared barrier with the collective's deadline. On timeout the world is broken so the
   ranks still waiting (or arriving later) fail too instead of hanging. */
static dm_status _dm_tw_barrier(_dm_thread* t, int kind) {
    _dm_tw_shared* sh = t->sh;
    dm_collective* c = &t->base;
    int64_t deadline = _dm_deadline(c->timeout_ms);
    uint64_t gen;
    dm_status st = DM_OK;
    char missing[128], msg[256];
    pthread_mutex_lock(&sh->mu);
    if (sh->broken != DM_OK) goto broken;
    gen = sh->generation;
    sh->slots[c->rank].arrived_gen = gen + 1;
    if (++sh->arrived == sh->size) {
        sh->arrived = 0;
        sh->generation++;
        pthread_cond_broadcast(&sh->cv);
        pthread_mutex_unlock(&sh->mu);
        return DM_OK;
    }
    while (sh->generation == gen && sh->broken == DM_OK) {
        if (deadline == INT64_MAX) {
            pthread_cond_wait(&sh->cv, &sh->mu);
        } else {
            struct timespec ts;
            int64_t now = _dm_now_ms();
            if (now >= deadline) {
                _dm_tw_missing(sh, gen + 1, missing, sizeof(missing));
                snprintf(msg, sizeof(msg), "thread: %s #%llu timed out after %d ms waiting for rank(s) %s",
                         _dm_tw_kind_name(kind), (unsigned long long)c->seq, c->timeout_ms, missing);
                _dm_tw_break_locked(sh, DM_ERR_TIMEOUT, msg);
                pthread_mutex_unlock(&sh->mu);
                return _DM_FAIL(c, DM_ERR_TIMEOUT, "%s", msg);
            }
            clock_gettime(CLOCK_MONOTONIC, &ts);
            ts.tv_sec += (time_t)((deadline - now) / 1000);
            ts.tv_nsec += (long)((deadline - now) % 1000) * 1000000L;
            if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
            pthread_cond_timedwait(&sh->cv, &sh->mu, &ts);
        }
    }
    if (sh->generation != gen) { pthread_mutex_unlock(&sh->mu); return DM_OK; }
broken:
    st = sh->broken == DM_ERR_TIMEOUT ? DM_ERR_TIMEOUT : DM_ERR_ABORTED;
    snprintf(msg, sizeof(msg), "%s", sh->broken_msg);
    if (sh->broken_rank >= 0 && sh->broken_rank != c->rank) {   /* another rank's failure: its cause */
        int rank = sh->broken_rank;
        st = sh->broken;
        pthread_mutex_unlock(&sh->mu);
        return _dm_eng_adopt(&t->lk, _dm_tw_kind_name(kind), st, rank, msg);
    }
    pthread_mutex_unlock(&sh->mu);
    return _DM_FAIL(c, st, "thread: %s #%llu failed: the world is broken (%s)",
                    _dm_tw_kind_name(kind), (unsigned long long)c->seq, msg);
}

/* Before every collective: post the fingerprint, meet, compare with rank 0's. A mismatch is
   seen identically by every rank, which all meet once more and report it. */
static dm_status _dm_tw_enter(_dm_thread* t, int kind, size_t count, int dtype, int op, int root) {
    int par = (int)(t->base.seq & 1), r;
    const _dm_fp* ref;
    _dm_fp_make(&t->sh->slots[t->base.rank].fp[par], &t->base, kind, dtype, op, root, count);
    _DM_TRY(_dm_tw_barrier(t, kind));
    ref = &t->sh->slots[0].fp[par];
    for (r = 1; r < t->base.size; r++) {
        const _dm_fp* o = &t->sh->slots[r].fp[par];
        if (_dm_fp_equal(o, ref)) continue;
        _DM_TRY(_dm_tw_barrier(t, kind));
        return _dm_eng_break(&t->lk, _dm_fp_mismatch(&t->base, "thread", 0, ref, r, o));
    }
    return DM_OK;
}

/* The engine's enter step (the core's slots run it before each collective). */
static dm_status _dm_tw_enter_hook(_dm_eng* lk, int kind, size_t count, int dtype, int op, int root) {
    return _dm_tw_enter((_dm_thread*)lk->c, kind, count, dtype, op, root);
}

static dm_status _dm_tw_barrier_slot(dm_collective* c) {
    _dm_thread* t = (_dm_thread*)c;
    _DM_TRY(_dm_eng_check_broken(&t->lk, "barrier"));
    _DM_TRY(_dm_tw_enter(t, _DM_K_BARRIER, 0, -1, -1, -1));
    return _dm_tw_barrier(t, _DM_K_BARRIER);
}

/* The threaded world's split, and its shrink and create below: cold. */
_DM_COLD_BEGIN
static dm_collective* _dm_tw_member_new(_dm_tw_shared* sh, int rank, const dm_fake_desc* d,
                                        const dm_collective* like);

/* The new member's local rank and size: members of its group on the same node, in new-rank order. */
static void _dm_tw_split_set_local(const _dm_tw_slot* slots, int n, int color, int key, int me,
                                   dm_collective* out) {
    int r, lrank = 0, lsize = 0;
    for (r = 0; r < n; r++) {
        if (slots[r].color != color || strcmp(slots[r].node, slots[me].node) != 0) continue;
        lsize++;
        if (slots[r].key < key || (slots[r].key == key && r < me)) lrank++;
    }
    out->local_rank = lrank;
    out->local_size = lsize;
}

/* The member's host layout: members whose nodes have the same name share a host. names[i]
   is the node of the member of rank i, sites[i] its site (_dm_thread.site). */
static void _dm_tw_set_layout(_dm_thread* t, const char* const* names, const int* sites) {
    int* hosts = t->lk.lay.host_of;     /* _dm_eng_set_layout may be given its own array */
    int r, q;
    for (r = 0; r < t->base.size; r++) {
        for (q = 0; q < r && strcmp(names[q], names[r]) != 0; q++) {}
        hosts[r] = q;
    }
    _dm_eng_set_layout(&t->lk, hosts, sites);
    if (_dm_peers_keep(&t->lk) != DM_OK) {   /* no check then, nothing else lost */
        _dm_free(&t->base.allocator, t->lk.peers);
        t->lk.peers = NULL;
    }
}
/* A split member's layout: the nodes of its group's members, in new-rank order. */
static dm_status _dm_tw_split_layout(_dm_thread* nt, const _dm_tw_slot* slots, int n, int color) {
    const char** names = (const char**)_dm_calloc(&nt->base.allocator, sizeof(char*) * (size_t)nt->base.size);
    int* sites = (int*)_dm_calloc(&nt->base.allocator, sizeof(int) * (size_t)nt->base.size);
    int r, q;
    if (!names || !sites) {
        _dm_free(&nt->base.allocator, names);
        _dm_free(&nt->base.allocator, sites);
        return DM_ERR_OUT_OF_MEMORY;
    }
    for (r = 0; r < n; r++) {
        int pos = 0;
        if (slots[r].color != color) continue;
        for (q = 0; q < n; q++)
            if (slots[q].color == color && (slots[q].key < slots[r].key || (slots[q].key == slots[r].key && q < r)))
                pos++;
        names[pos] = slots[r].node;
        sites[pos] = slots[r].site;
    }
    _dm_tw_set_layout(nt, names, sites);
    _dm_free(&nt->base.allocator, names);
    _dm_free(&nt->base.allocator, sites);
    return DM_OK;
}

/* split: post (color, key); each group's leader (first by (key, rank)) makes the shared state
   and posts it; members pick it up. Three meetings keep the slots stable while read. */
static dm_status _dm_tw_split(dm_collective* c, int color, int key, dm_collective** out) {
    _dm_thread* t = (_dm_thread*)c;
    _dm_tw_slot* slots = t->sh->slots;
    int r, n = 0, my_pos = 0, leader = -1;
    dm_status st;
    slots[c->rank].color = color;
    slots[c->rank].key = key;
    slots[c->rank].ptr = NULL;
    slots[c->rank].node = c->node_name;
    slots[c->rank].site = t->site;
    _DM_TRY(_dm_tw_enter(t, _DM_K_SPLIT, 0, -1, -1, -1));
    if (color != DM_SPLIT_NONE) {
        for (r = 0; r < c->size; r++) {
            if (slots[r].color != color) continue;
            n++;
            if (slots[r].key < key || (slots[r].key == key && r < c->rank)) my_pos++;
            if (leader < 0 || slots[r].key < slots[leader].key) leader = r;
        }
        if (leader == c->rank) slots[c->rank].ptr = _dm_tw_shared_new(&c->allocator, n);
    }
    _DM_TRY(_dm_tw_barrier(t, _DM_K_SPLIT));
    if (color != DM_SPLIT_NONE) {
        _dm_tw_shared* nsh = (_dm_tw_shared*)slots[leader].ptr;
        if (nsh) *out = _dm_tw_member_new(nsh, my_pos, NULL, c);
        if (*out) _dm_tw_split_set_local(slots, c->size, color, key, c->rank, *out);
        if (*out && _dm_tw_split_layout((_dm_thread*)*out, slots, c->size, color) != DM_OK) {
            dm_destroy(*out);
            *out = NULL;
        }
    }
    st = _dm_tw_barrier(t, _DM_K_SPLIT);
    if (st != DM_OK) { dm_destroy(*out); *out = NULL; return st; }
    if (color != DM_SPLIT_NONE && !*out) {
        /* Leader allocation or member allocation failed: nothing usable for this group. */
        return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "thread: split #%llu: out of memory",
                        (unsigned long long)c->seq);
    }
    return DM_OK;
}

/* >>thread shrink  The ranks that stay meet under the world's lock: each adds its excluded
   ranks to the union and waits until every rank outside the union has arrived; the one that
   completes the meeting makes the new world's shared state. Threads cannot die here, so the
   union is the whole answer; a rank that never comes is a timeout on every waiting rank. */
static bool _dm_tw_shrink_complete(const _dm_tw_shared* sh) {
    int r;
    for (r = 0; r < sh->size; r++)
        if (!sh->shrink_gone[r] && !sh->shrink_in[r]) return false;
    return true;
}
/* Waits (holding sh->mu) until the meeting is complete or failed; DM_OK or the failure. */
static dm_status _dm_tw_shrink_meet(_dm_thread* t, int64_t deadline) {
    _dm_tw_shared* sh = t->sh;
    int r, n = 0;
    while (!sh->shrink_next && sh->shrink_failed == DM_OK) {
        struct timespec ts;
        int64_t now = _dm_now_ms();
        if (_dm_tw_shrink_complete(sh)) {
            for (r = 0; r < sh->size; r++) n += !sh->shrink_gone[r];
            sh->shrink_next = _dm_tw_shared_new(&sh->allocator, n);
            if (!sh->shrink_next) {
                sh->shrink_failed = DM_ERR_OUT_OF_MEMORY;
                snprintf(sh->shrink_msg, sizeof(sh->shrink_msg), "thread: shrink: out of memory");
            }
            pthread_cond_broadcast(&sh->cv);
            break;
        }
        if (now >= deadline) {
            size_t used = 0;
            sh->shrink_failed = DM_ERR_TIMEOUT;
            used += (size_t)snprintf(sh->shrink_msg, sizeof(sh->shrink_msg), "thread: shrink timed out after %d ms "
                                     "waiting for rank(s)", t->base.timeout_ms);
            for (r = 0; r < sh->size && used + 12 < sizeof(sh->shrink_msg); r++)
                if (!sh->shrink_gone[r] && !sh->shrink_in[r])
                    used += (size_t)snprintf(sh->shrink_msg + used, sizeof(sh->shrink_msg) - used, " %d", r);
            pthread_cond_broadcast(&sh->cv);
            break;
        }
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += 20 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&sh->cv, &sh->mu, &ts);
    }
    return sh->shrink_failed;
}
static dm_status _dm_tw_shrink(dm_collective* c, const bool* excluded, int flags, dm_collective** out) {
    _dm_thread* t = (_dm_thread*)c;
    _dm_tw_shared* sh = t->sh;
    _dm_tw_shared* nsh;
    const char** names;
    int* sites;
    int r, rank = 0, n = 0;
    dm_status st;
    char msg[256];
    if (flags == DM_SHRINK_ABORT && t->lk.broken == DM_OK) {
        _DM_FAIL(c, DM_ERR_ABORTED, "thread: rank %d aborted the world (dm_shrink with DM_SHRINK_ABORT)", c->rank);
        _dm_eng_break(&t->lk, DM_ERR_ABORTED);
    }
    pthread_mutex_lock(&sh->mu);
    if (!sh->shrink_in) sh->shrink_in = (bool*)_dm_calloc(&sh->allocator, sizeof(bool) * (size_t)sh->size);
    if (!sh->shrink_gone) sh->shrink_gone = (bool*)_dm_calloc(&sh->allocator, sizeof(bool) * (size_t)sh->size);
    if (!sh->shrink_in || !sh->shrink_gone) {
        pthread_mutex_unlock(&sh->mu);
        return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "thread: shrink: out of memory");
    }
    if (sh->shrink_in[c->rank]) {
        pthread_mutex_unlock(&sh->mu);
        return _DM_FAIL(c, DM_ERR_ABORTED, "thread: shrink: this world was already shrunk; destroy it");
    }
    sh->shrink_in[c->rank] = true;
    sh->slots[c->rank].node = c->node_name;
    sh->slots[c->rank].site = t->site;
    for (r = 0; r < sh->size; r++) sh->shrink_gone[r] = sh->shrink_gone[r] || excluded[r];
    pthread_cond_broadcast(&sh->cv);
    st = _dm_tw_shrink_meet(t, _dm_deadline(c->timeout_ms));
    snprintf(msg, sizeof(msg), "%s", sh->shrink_msg);
    nsh = sh->shrink_next;
    if (st == DM_OK && sh->shrink_gone[c->rank]) st = DM_ERR_ABORTED;
    names = (const char**)_dm_calloc(&c->allocator, sizeof(char*) * (size_t)sh->size);
    sites = (int*)_dm_calloc(&c->allocator, sizeof(int) * (size_t)sh->size);
    for (r = 0; r < sh->size && names && sites; r++) {
        if (sh->shrink_gone[r]) continue;
        if (r < c->rank) rank++;
        sites[n] = sh->slots[r].site;
        names[n++] = sh->slots[r].node;
    }
    pthread_mutex_unlock(&sh->mu);
    if (t->lk.broken == DM_OK) {
        t->lk.broken = DM_ERR_ABORTED;
        _dm_copy_name(t->lk.broken_msg, sizeof(t->lk.broken_msg),
                      "this collective was shrunk into a new one by dm_shrink; destroy it");
    }
    if (st != DM_OK || !names || !sites) {
        _dm_free(&c->allocator, names);
        _dm_free(&c->allocator, sites);
        if (st == DM_OK) _dm_tw_shared_release(nsh);   /* this member's reference, never taken */
        if (st == DM_ERR_ABORTED)   /* not a member of the new world: it holds no reference for this rank */
            return _DM_FAIL(c, st, "thread: shrink: rank %d was left out by the other ranks", c->rank);
        return _DM_FAIL(c, st ? st : DM_ERR_OUT_OF_MEMORY, "%s", st ? msg : "thread: shrink: out of memory");
    }
    *out = _dm_tw_member_new(nsh, rank, NULL, c);
    if (*out) {
        _dm_thread* nt = (_dm_thread*)*out;
        (*out)->local_rank = 0;
        (*out)->local_size = 0;
        for (r = 0; r < n; r++) {
            if (strcmp(names[r], c->node_name) != 0) continue;
            if (r < rank) (*out)->local_rank++;
            (*out)->local_size++;
        }
        _dm_tw_set_layout(nt, names, sites);
    }
    _dm_free(&c->allocator, names);
    _dm_free(&c->allocator, sites);
    if (!*out) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "thread: shrink: out of memory");
    return DM_OK;
}

/* >>thread create  A member's links, its vtable, and the world made and run on threads. */

/* A failure on this member's links (a mismatch found by a dm_recv, say) breaks the whole
   world, so ranks waiting in the shared barrier fail with its cause instead of waiting for a
   rank that will not come. */
static void _dm_tw_notice_post(_dm_eng* lk, dm_status st, const char* msg) {
    _dm_tw_shared* sh = ((_dm_thread*)lk->c)->sh;
    pthread_mutex_lock(&sh->mu);
    if (sh->broken == DM_OK) sh->broken_rank = lk->c->rank;
    _dm_tw_break_locked(sh, st, msg);
    pthread_mutex_unlock(&sh->mu);
}

/* This member's end of every ring; its waits spin only while the world's threads fit the cores. */
static dm_status _dm_tw_links(_dm_thread* t) {
    _dm_tw_shared* sh = t->sh;
    int r, W = sh->size, me = t->base.rank;
    _DM_TRY(_dm_eng_init(&t->lk, &t->base, "thread", 0));
    t->lk.enter = _dm_tw_enter_hook;
    for (r = 0; r < W; r++) {
        if (r == me) continue;
        t->lk.links[r] = _dm_memlink_new(&sh->allocator, &_dm_tw_link_vt, sh->rings, sh->ring_stride,
                                         sh->ring_cap, W, me, r, sh->bells, &sh->bell_ops, -1);
        if (!t->lk.links[r]) return DM_ERR_OUT_OF_MEMORY;
        snprintf(t->lk.links[r]->where, sizeof(t->lk.links[r]->where), "thread %d", r);
    }
    t->lk.bell = &sh->bells[me];
    t->lk.bells = sh->bells;
    t->lk.nbells = W;
    t->lk.bell_ops = &sh->bell_ops;
    t->lk.abort = &sh->abort;
    t->lk.notice_post = _dm_tw_notice_post;
    _dm_eng_set_policy(&t->lk, W);
    return DM_OK;
}

/* dm_abort from another thread: the notice breaks the shared world (ranks in its barrier
   fail with the message) and the abort word wakes the rings' waiters, this rank's owner
   included. Nothing without dm_abort (dm_shrink's abort breaks the world on its own). */
static void _dm_tw_interrupt(dm_collective* c) { _dm_eng_abort_notify(&((_dm_thread*)c)->lk); }

static void _dm_tw_destroy(dm_collective* c) {
    _dm_thread* t = (_dm_thread*)c;
    dm_allocator a = c->allocator;
    _dm_eng_release(&t->lk);
    if (t->sh) _dm_tw_shared_release(t->sh);
    _dm_free(&a, t);
}

static const dm_collective_vtable _dm_thread_vtable = {
    sizeof(dm_collective_vtable),    /* struct_size */
    DM_COLLECTIVE_VTABLE_VERSION,    /* version */
    "thread",                        /* name */
    _dm_tw_destroy,                  /* destroy */
    _dm_tw_barrier_slot,             /* barrier: the world's shared barrier */
    _dm_coll_all_reduce,             /* all_reduce: the core's (>>entry points), after the meeting */
    NULL,                            /* all_gather: core builds it on all_gather_to_list */
    _dm_coll_all_gather_to_list,     /* all_gather_to_list */
    _dm_coll_reduce_scatter,         /* reduce_scatter */
    _dm_coll_broadcast,              /* broadcast */
    _dm_tw_split,                    /* split */
    NULL,                            /* native_handle */
    NULL,                            /* synchronize */
    NULL,                            /* transport: "thread" */
    _dm_coll_reduce,                 /* reduce */
    _dm_coll_gather,                 /* gather */
    _dm_coll_scatter,                /* scatter */
    _dm_coll_all_to_all_v,           /* all_to_all_v: the meeting compares kind and dtype, the pairs counts */
    _dm_coll_send,                   /* send: the two ranks only, no meeting */
    _dm_coll_recv,                   /* recv */
    NULL,                            /* start */
    NULL,                            /* finish */
    _dm_tw_shrink,                   /* shrink */
    NULL,                            /* grow */
    _dm_tw_interrupt,                /* interrupt: dm_abort */
    _dm_coll_recv_any,               /* recv_any: every peer's inbox */
};

/* A member of a shared world. like: copy logger, allocator, timeout and node name from it
   (split), or NULL with d to derive the node layout (world creation). A failed allocation
   drops this member's reference so the shared state is still freed. */
static dm_collective* _dm_tw_member_new(_dm_tw_shared* sh, int rank, const dm_fake_desc* d,
                                        const dm_collective* like) {
    _dm_thread* t = (_dm_thread*)_dm_calloc(&sh->allocator, sizeof(_dm_thread));
    if (!t) { _dm_tw_shared_release(sh); return NULL; }
    t->sh = sh;
    _dm_collective_init(&t->base, &t->core, &_dm_thread_vtable, rank, sh->size,
                        like ? like->timeout_ms : 0, like ? &like->logger : NULL, &sh->allocator);
    if (!like && d->host_of) _dm_fake_set_host(&t->base, d->host_of);
    else if (!like) _dm_fake_set_local(&t->base, d->local_world_size);
    else _dm_copy_name(t->base.node_name, sizeof(t->base.node_name), like->node_name);
    t->site = like ? ((const _dm_thread*)like)->site : d->site_of ? d->site_of[rank] : 0;
    if (_dm_tw_links(t) != DM_OK) { _dm_tw_destroy(&t->base); return NULL; }
    return &t->base;
}

static dm_status _dm_thread_world_create_checked(const dm_fake_desc* desc, dm_collective** out) {
    char err[DM_LAST_ERROR_SIZE];
    _dm_tw_shared* sh;
    int r, n;
    _DM_ZERO(dm_fake_desc, d);
    if (!out) return _DM_REPORT(NULL, err, sizeof(err), DM_ERR_INVALID_ARG, "thread: out is NULL");
    if (desc) d = *desc;
    n = _dm_def(d.world_size, 1);
    _DM_TRY(_dm_fake_desc_check(&d, false, err, sizeof(err)));
    for (r = 0; r < n; r++) out[r] = NULL;
    _DM_TRY(_dm_cfg_check_create(&d.logger, d.timeout_ms, err, sizeof(err)));
    {
        int algo;
        dm_compress mode;
        char why[200];
        if (_dm_eng_env(&algo, &mode, NULL, why, sizeof(why)) != DM_OK)
            return _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_ENV, "thread: %s", why);
    }
    sh = _dm_tw_shared_new(&d.allocator, n);
    if (!sh) return _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_OUT_OF_MEMORY, "thread: out of memory");
    for (r = 0; r < n; r++) {
        out[r] = _dm_tw_member_new(sh, r, &d, NULL);
        if (!out[r]) break;
        out[r]->timeout_ms = _dm_timeout_logged(d.timeout_ms, &d.logger);
        out[r]->logger = _dm_logger_or_default(&d.logger, r);
    }
    if (r == n) {
        const char** names = (const char**)_dm_calloc(&d.allocator, sizeof(char*) * (size_t)n);
        if (names) {
            for (r = 0; r < n; r++) names[r] = out[r]->node_name;
            for (r = 0; r < n; r++) _dm_tw_set_layout((_dm_thread*)out[r], names, d.site_of);
            _dm_free(&d.allocator, names);
            return DM_OK;
        }
        for (r = 0; r < n; r++) { dm_destroy(out[r]); out[r] = NULL; }
        return _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_OUT_OF_MEMORY, "thread: out of memory");
    }
    /* Member r failed (and released its reference); drop the references never handed out. */
    { int k; for (k = r + 1; k < n; k++) _dm_tw_shared_release(sh); }
    for (r = 0; r < n; r++) { dm_destroy(out[r]); out[r] = NULL; }
    return _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_OUT_OF_MEMORY, "thread: out of memory");
}
DM_API_IMPL dm_status dm_thread_world_create(const dm_fake_desc* desc, dm_collective** out) {
    _dm_create_begin();
    return _dm_create_end(_dm_thread_world_create_checked(desc, out), desc && desc->logger.func);
}

typedef struct _dm_tw_run_arg {
    dm_collective* c;
    dm_rank_fn fn;
    void* user;
    int result;
} _dm_tw_run_arg;
static void* _dm_tw_run_thread(void* p) {
    _dm_tw_run_arg* a = (_dm_tw_run_arg*)p;
    a->result = a->fn(a->c, a->user);
    return NULL;
}
DM_API_IMPL dm_status dm_thread_world_run(const dm_fake_desc* desc, dm_rank_fn fn, void* user_data) {
    _DM_ZERO(dm_fake_desc, d);
    dm_collective** cs;
    _dm_tw_run_arg* args;
    pthread_t* threads;
    int n, r, started = 0;
    dm_status st = DM_OK;
    if (!fn) return DM_ERR_INVALID_ARG;
    if (desc) d = *desc;
    if (d.world_size < 0) return DM_ERR_INVALID_ARG;
    n = _dm_def(d.world_size, 1);
    cs = (dm_collective**)_dm_calloc(&d.allocator, sizeof(*cs) * (size_t)n);
    args = (_dm_tw_run_arg*)_dm_calloc(&d.allocator, sizeof(*args) * (size_t)n);
    threads = (pthread_t*)_dm_calloc(&d.allocator, sizeof(*threads) * (size_t)n);
    if (!cs || !args || !threads) { st = DM_ERR_OUT_OF_MEMORY; goto done; }
    st = dm_thread_world_create(&d, cs);
    if (st != DM_OK) goto done;
    for (r = 0; r < n; r++) {
        args[r].c = cs[r];
        args[r].fn = fn;
        args[r].user = user_data;
        if (pthread_create(&threads[r], NULL, _dm_tw_run_thread, &args[r]) != 0) break;
        started++;
    }
    if (started < n) {
        /* Break the world so the ranks that did start fail at once instead of waiting. */
        _dm_tw_shared* sh = ((_dm_thread*)cs[0])->sh;
        pthread_mutex_lock(&sh->mu);
        _dm_tw_break_locked(sh, DM_ERR_INTERNAL, "could not start every rank thread");
        pthread_mutex_unlock(&sh->mu);
        st = DM_ERR_INTERNAL;
    }
    for (r = 0; r < started; r++) pthread_join(threads[r], NULL);
    for (r = 0; r < n; r++) dm_destroy(cs[r]);
    for (r = 0; r < started && st == DM_OK; r++)
        if (args[r].result != DM_OK) st = (dm_status)args[r].result;
done:
    _dm_free(&d.allocator, cs);
    _dm_free(&d.allocator, args);
    _dm_free(&d.allocator, threads);
    return st;
}

_DM_COLD_END
_DM_WARM_END
#endif /* DISTMESH_IMPL_INCLUDED && !DISTMESH_THREAD_IMPL_INCLUDED */

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
