/* distmesh_schedules.h -- distmesh's schedules. MIT license at end of file.

   Do not include this file yourself: it is part of distmesh.h's implementation, which includes
   it after the engine (distmesh.h >>layers).

   WHAT IT HOLDS  Every algorithm, each written once over the engine's links, and the choice
   among them: teams (the ranks a phase runs among), recursive doubling, rings, the single-copy
   ring of one host, compressed rails, two- and three-level all-reduce, the pipelined chain
   (broadcast), dissemination (barrier), the three-level all-gather, reduce-scatter and barrier,
   the cost model and the fixed choice, the entry points the backends' vtable slots call, and
   P, the fixed peers a rank's schedules use.

   ADDING AN ALGORITHM  Its schedule goes here as a section of its own, written with >>teams'
   vocabulary and the engine's exchange; its name goes to distmesh_engine.h >>algorithms
   (DISTMESH_ALGO); >>choice decides when it runs and >>peers lists the peers it talks to (a
   test holds P against every schedule). Nothing else changes.

   WHAT IT MAY CALL  distmesh.h, the kernels, the trace's hooks, the core (all_to_all's copy
   out) and the engine. The threaded world and the backends call it; it never names them.

   SECTIONS  Each opens with a comment that starts ">>tag" (search for it); in file order:
       >>teams                   teams, segments, step arrays: what schedules are written with
       >>recursive doubling      schedule: recursive doubling all-reduce
       >>ring                    schedules: ring all-reduce, ring all-gather, ring reduce-scatter
       >>single copy             a large one-host all-reduce's all-gather read from the peers' buffers
       >>compressed rails        a rail's block across hosts as int8 or bfloat16 codes
       >>two-level               schedule: two-level all-reduce (fold, host ring, rails, pipeline)
       >>three-level             schedule: three-level all-reduce (hosts at sites, DISTMESH_SITE)
       >>chain                   schedule: pipelined chain (broadcast)
       >>dissemination           schedule: dissemination rounds (barrier)
       >>three-level others      schedules: all-gather, reduce-scatter (pipelined), barrier, chain across sites
       >>choice                  the cost model and the fixed choice of algorithm
       >>site probe              the site link's latency measured, for the gathers' segments
       >>entry points            what the vtable slots call: check, choose, run, record
       >>peers                   P: the peers a rank's fixed-peer schedules use */
#ifndef DISTMESH_H
#error "distmesh_schedules.h is part of distmesh.h's implementation: include distmesh.h"
#endif

#if defined(DISTMESH_IMPL_INCLUDED) && !defined(DISTMESH_SCHEDULES_IMPL_INCLUDED)
#define DISTMESH_SCHEDULES_IMPL_INCLUDED
_DM_WARM_BEGIN
/* >>teams  A team is the ranks one phase of a schedule runs among, in the phase's order (a
   ring's positions); me is this rank's index in it. ranks NULL means rank i at index i. The
   flat ring is the whole group in host order; the two-level schedules run on one host's ranks
   (a slice of the layout's members), on a rail (local rank i of every host, host order, built
   in the layout's team scratch) or on a chain that starts at a root.
   Also here, what every schedule is written with: segments of a count (_dm_segment), step
   arrays and the ring transfer that runs them (_dm_steps), and the smallest schedule, the
   fingerprints alone (count 0). */
/* Segment s of count elements split in parts near-equal parts: the first count % parts get one
   more. Ring blocks and the threaded world's shares. */
_DM_PRIVATE void _dm_segment(size_t count, int parts, int s, size_t* off, size_t* len) {
    size_t base = count / (size_t)parts, extra = count % (size_t)parts, si = (size_t)s;
    *off = si * base + (si < extra ? si : extra);
    *len = base + (si < extra ? 1 : 0);
}
_DM_PRIVATE int _dm_mod(int a, int n) { return ((a % n) + n) % n; }
typedef struct _dm_team { const int* ranks; int n, me; } _dm_team;
_DM_PRIVATE int _dm_team_rank(const _dm_team* t, int i) { return t->ranks ? t->ranks[i] : i; }
_DM_PRIVATE int _dm_team_at(const _dm_team* t, int k) { return _dm_team_rank(t, _dm_mod(t->me + k, t->n)); }
_DM_PRIVATE _dm_team _dm_team_of(const int* ranks, int n, int me) {
    _dm_team t;
    t.ranks = ranks; t.n = n; t.me = me;
    return t;
}
_DM_PRIVATE _dm_team _dm_sch_flat(const _dm_eng* lk) { return _dm_team_of(lk->order, lk->c->size, lk->slot[lk->c->rank]); }
_DM_PRIVATE _dm_team _dm_sch_identity(const _dm_eng* lk) { return _dm_team_of(NULL, lk->c->size, lk->c->rank); }
/* This rank's host: its first n ranks (n <= the host's size) in local order. */
_DM_PRIVATE _dm_team _dm_sch_host(const _dm_eng* lk, int n) {
    const _dm_layout* y = &lk->lay;
    return _dm_team_of(y->members + y->start[y->host_of[lk->c->rank]], n, y->local[lk->c->rank]);
}
_DM_PRIVATE int _dm_sch_host_size(const _dm_eng* lk, int h) { return lk->lay.start[h + 1] - lk->lay.start[h]; }
/* Rail i: local rank i of every host (each has one), in host order. Uses the team scratch. */
_DM_PRIVATE _dm_team _dm_sch_rail(_dm_eng* lk, int i) {
    _dm_layout* y = &lk->lay;
    int h;
    for (h = 0; h < y->H; h++) y->team[h] = y->members[y->start[h] + i];
    return _dm_team_of(y->team, y->H, y->host_of[lk->c->rank]);
}

/* Step arrays for a ring transfer of n steps each way, with the fingerprint in step 0. */
typedef struct _dm_steps { _dm_sstep* ss; _dm_rstep* rs; _dm_fpbufs b; } _dm_steps;
_DM_PRIVATE dm_status _dm_steps_alloc(_dm_eng* lk, _dm_steps* st, int n, const _dm_fp* fp, const char* op) {
    st->ss = (_dm_sstep*)_dm_calloc(&lk->c->allocator, sizeof(_dm_sstep) * (size_t)n);
    st->rs = (_dm_rstep*)_dm_calloc(&lk->c->allocator, sizeof(_dm_rstep) * (size_t)n);
    if (!st->ss || !st->rs) {
        _dm_free(&lk->c->allocator, st->ss);
        _dm_free(&lk->c->allocator, st->rs);
        return _DM_FAIL(lk->c, DM_ERR_OUT_OF_MEMORY, "%s: %s: out of memory", lk->tag, op);
    }
    _dm_fp_steps(&st->b, fp, &st->ss[0], &st->rs[0]);
    return DM_OK;
}

/* Runs n ring steps each way over team t: send to the next position, receive from the previous. */
_DM_PRIVATE dm_status _dm_steps_run(_dm_eng* lk, const _dm_team* t, _dm_steps* st, int n, const char* op,
                                    dm_dtype dtype, dm_reduce_op rop, const _dm_fp* fp) {
    dm_status rc;
    _DM_ZERO(_dm_xfer, x);
    x.op = op; x.speer = _dm_team_at(t, 1); x.rpeer = _dm_team_at(t, -1);
    x.ss = st->ss; x.ns = n; x.rs = st->rs; x.nr = n; x.dtype = dtype; x.rop = rop; x.expect = fp;
    rc = _dm_eng_run(lk, &x);
    _dm_free(&lk->c->allocator, st->ss);
    _dm_free(&lk->c->allocator, st->rs);
    return rc;
}

/* Only the fingerprints around the ring (count 0: the arguments still have to agree). */
_DM_PRIVATE dm_status _dm_sch_fp_only(_dm_eng* lk, const char* op, const _dm_fp* fp) {
    _dm_team t = _dm_sch_flat(lk);
    return _dm_eng_sendrecv(lk, op, fp, _dm_team_at(&t, 1), NULL, 0, _dm_team_at(&t, -1), NULL, 0);
}

/* >>recursive doubling  All-reduce over a team in log2(n) exchanges (a fold first where n is not
   a power of two): the flat all_reduce of small messages, and the rails of the two-level one. */

/* Recursive doubling over team t on recv (already holding this rank's data). Teams that are
   not a power of two first fold index 2i into 2i+1 for i < rem, and hand the result back at
   the end. The order of reduction is fixed by the team alone: the same bits on every
   transport. divide > 0: MEAN, the result is divided by it. name: what a failure says ran. */
_DM_PRIVATE dm_status _dm_sch_rd_as(_dm_eng* lk, const char* name, const _dm_team* t, void* recv, size_t count,
                                    dm_dtype dtype, dm_reduce_op op, int divide, const _dm_fp* fp) {
    int W = t->n, r = t->me, p = 1, rem, newrank, mask;
    size_t bytes = count * dm_dtype_size(dtype);
    while (p * 2 <= W) p *= 2;
    rem = W - p;
    if (r < 2 * rem) {
        if (r % 2 == 0) {
            _DM_TRY(_dm_eng_sendrecv(lk, name, fp, _dm_team_rank(t, r + 1), recv, bytes, -1, NULL, 0));
            newrank = -1;
        } else {
            _DM_TRY(_dm_eng_sendrecv_reduce(lk, name, fp, -1, NULL, _dm_team_rank(t, r - 1), recv, count, dtype, op));
            newrank = r / 2;
        }
    } else {
        newrank = r - rem;
    }
    if (newrank >= 0) {
        for (mask = 1; mask < p; mask <<= 1) {
            int pn = newrank ^ mask, peer = _dm_team_rank(t, pn < rem ? pn * 2 + 1 : pn + rem);
            /* IEEE +, *, max, min are commutative, so both partners compute the same bits */
            _DM_TRY(_dm_eng_exchange(lk, name, fp, fp, peer, recv, bytes, peer, recv, bytes, true, dtype, op));
        }
    }
    if (r < 2 * rem) {
        if (r % 2) _DM_TRY(_dm_eng_sendrecv(lk, name, fp, _dm_team_rank(t, r - 1), recv, bytes, -1, NULL, 0));
        else _DM_TRY(_dm_eng_sendrecv(lk, name, fp, -1, NULL, 0, _dm_team_rank(t, r + 1), recv, bytes));
    }
    if (divide) dm_divide_local(dtype, recv, count, divide);
    return DM_OK;
}
/* The same, for the all-reduces and their rails. */
_DM_PRIVATE dm_status _dm_sch_rd(_dm_eng* lk, const _dm_team* t, void* recv, size_t count, dm_dtype dtype,
                                 dm_reduce_op op, int divide, const _dm_fp* fp) {
    return _dm_sch_rd_as(lk, "all_reduce", t, recv, count, dtype, op, divide, fp);
}

/* >>ring  Rings over a team: the all-reduce (reduce-scatter and all-gather steps as one
   pipelined stream, also the two-level all-reduce's host ring and ring rails), and the
   all-gather and reduce-scatter of K pieces per position that all_gather and reduce_scatter,
   flat and two-level, are built of. */

/* Ring all-reduce over team t, blocks by position: _dm_segment(count, n, p) is position p's.
   Its reduce-scatter steps (_DM_SCH_RING_RS: step g sends the block of position me-g-1 and
   receives and reduces that of me-g-2, so each position ends holding its own block, reduced
   in ring order starting after it) and its all-gather steps (_DM_SCH_RING_AG: step g sends the
   block of me-g, receives that of me-g-1) run as one pipelined stream. The all-gather alone
   starts from each position holding its own block in recv. divide > 0: MEAN's division, done
   on the last reduction of each block. */
#define _DM_SCH_RING_RS 1
#define _DM_SCH_RING_AG 2
/* Appends the steps of a ring over team t on count elements (in, out as for _dm_sch_ring) to st
   from step k on, and returns the next step. An all-gather after a reduce-scatter in the same
   call waits for it (its first block is the one the reduce-scatter finished last); an
   all-gather alone waits for nothing. */
_DM_PRIVATE int _dm_sch_ring_steps(_dm_steps* st, int k, const _dm_team* t, const unsigned char* in, unsigned char* out,
                                   size_t count, size_t esize, int divide, int phases) {
    int W = t->n, g, nrs = (phases & _DM_SCH_RING_RS) ? W - 1 : 0, nag = (phases & _DM_SCH_RING_AG) ? W - 1 : 0;
    size_t off, len;
    for (g = 0; g < nrs; g++, k++) {
        _dm_segment(count, W, _dm_mod(t->me - g - 1, W), &off, &len);
        st->ss[k].buf = (g == 0 ? in : out) + off * esize;
        st->ss[k].len = len * esize;
        st->ss[k].gate = g == 0 ? -1 : k - 1;
        _dm_segment(count, W, _dm_mod(t->me - g - 2, W), &off, &len);
        st->rs[k].buf = out + off * esize;
        st->rs[k].len = len * esize;
        st->rs[k].own = in + off * esize;
        st->rs[k].after_send = -1;
        st->rs[k].divide = g == W - 2 ? divide : 0;
    }
    for (g = 0; g < nag; g++, k++) {
        _dm_segment(count, W, _dm_mod(t->me - g, W), &off, &len);
        st->ss[k].buf = out + off * esize; st->ss[k].len = len * esize;
        st->ss[k].gate = g > 0 || nrs > 0 ? k - 1 : -1;
        _dm_segment(count, W, _dm_mod(t->me - g - 1, W), &off, &len);
        st->rs[k].buf = out + off * esize; st->rs[k].len = len * esize; st->rs[k].after_send = -1;
    }
    return k;
}
_DM_PRIVATE dm_status _dm_sch_ring(_dm_eng* lk, const _dm_team* t, const void* send, void* recv, size_t count,
                                   dm_dtype dtype, dm_reduce_op op, int divide, const _dm_fp* fp, int phases) {
    int W = t->n, n = 1 + ((phases & _DM_SCH_RING_RS) ? W - 1 : 0) + ((phases & _DM_SCH_RING_AG) ? W - 1 : 0);
    _dm_steps st;
    _DM_TRY(_dm_steps_alloc(lk, &st, n, fp, "all_reduce"));
    n = _dm_sch_ring_steps(&st, 1, t, (const unsigned char*)send, (unsigned char*)recv, count, dm_dtype_size(dtype),
                           divide, phases);
    return _dm_steps_run(lk, t, &st, n, "all_reduce", dtype, op, fp);
}

/* Ring all-gather over team t of K pieces per position: pieces[p * K + k] is piece k of
   position p, bytes each, this position's already in place. Step g sends the pieces of
   position me-g and receives those of me-g-1 straight into place, each forwarded the next
   step as it arrives. _dm_sch_gather_steps appends these steps to st from step i on (returns
   the next), for len bytes at offset off of each piece: the whole pieces, or one segment of
   them (the pipelined three-level gathers, >>three-level others). */
_DM_PRIVATE int _dm_sch_gather_steps(_dm_steps* st, int i, const _dm_team* t, void* const* pieces, int K, size_t off,
                                     size_t len) {
    int W = t->n, g, k;
    for (g = 0; g < W - 1; g++)
        for (k = 0; k < K; k++, i++) {
            st->ss[i].buf = (const unsigned char*)pieces[_dm_mod(t->me - g, W) * K + k] + off;
            st->ss[i].len = len;
            st->ss[i].gate = g == 0 ? -1 : i - K;
            st->rs[i].buf = (unsigned char*)pieces[_dm_mod(t->me - g - 1, W) * K + k] + off;
            st->rs[i].len = len;
            st->rs[i].after_send = -1;
        }
    return i;
}
_DM_PRIVATE dm_status _dm_sch_ring_gather(_dm_eng* lk, const _dm_team* t, void* const* pieces, int K, size_t bytes,
                                          int kind, dm_dtype dtype, const _dm_fp* fp) {
    int W = t->n, i;
    _dm_steps st;
    if (W == 1) return DM_OK;
    _DM_TRY(_dm_steps_alloc(lk, &st, 1 + (W - 1) * K, fp, _dm_kind_name(kind)));
    i = _dm_sch_gather_steps(&st, 1, t, pieces, K, 0, bytes);
    return _dm_steps_run(lk, t, &st, i, _dm_kind_name(kind), dtype, DM_SUM, fp);
}

/* Ring reduce-scatter over team t of K pieces per position, bytes each: in[p * K + k] is
   piece k of position p's block. Step g sends the partial pieces of position me-g-1 (this
   rank's input first, then scratch) and reduces the received ones of me-g-2 into scratch (K
   pieces), which must first have been sent on; the last step (this position's own pieces)
   lands in out (K pieces; out may be scratch). divide > 0: MEAN's division, on the last.
   _dm_sch_rs_steps appends these steps to st from step i on (returns the next), for len
   bytes at offset off of each piece, piece k of out and scratch at k x stride: the whole
   pieces (stride = len = bytes), or one segment of them (>>three-level others). Each element
   is reduced in the same order either way. */
_DM_PRIVATE int _dm_sch_rs_steps(_dm_steps* st, int i, const _dm_team* t, const unsigned char* const* in,
                                 unsigned char* out, unsigned char* scratch, size_t stride, int K, size_t off, size_t len,
                                 int divide) {
    int W = t->n, g, k;
    for (g = 0; g < W - 1; g++)
        for (k = 0; k < K; k++, i++) {
            _dm_rstep* s = &st->rs[i];
            st->ss[i].buf = g == 0 ? in[_dm_mod(t->me - 1, W) * K + k] + off : scratch + (size_t)k * stride + off;
            st->ss[i].len = len;
            st->ss[i].gate = g == 0 ? -1 : i - K;
            s->buf = (g == W - 2 ? out : scratch) + (size_t)k * stride + off;
            s->len = len;
            s->own = in[_dm_mod(t->me - g - 2, W) * K + k] + off;
            s->divide = g == W - 2 ? divide : 0;
            /* rs[i] overwrites scratch, which ss[i] (sent in the same step) still reads */
            s->after_send = g >= 1 && st->ss[i].buf == s->buf ? i : -1;
        }
    return i;
}
_DM_PRIVATE dm_status _dm_sch_ring_rs(_dm_eng* lk, const _dm_team* t, const unsigned char* const* in, unsigned char* out,
                                      unsigned char* scratch, int K, size_t bytes, dm_dtype dtype, dm_reduce_op op,
                                      int divide, const _dm_fp* fp) {
    int W = t->n, i;
    _dm_steps st;
    _DM_TRY(_dm_steps_alloc(lk, &st, 1 + (W - 1) * K, fp, "reduce_scatter"));
    i = _dm_sch_rs_steps(&st, 1, t, in, out, scratch, bytes, K, 0, bytes, divide);
    return _dm_steps_run(lk, t, &st, i, "reduce_scatter", dtype, op, fp);
}

/* >>single copy  A ring all-reduce among the ranks of one host, large: its reduce-scatter as
   above, then an all-gather in which each rank reads the peers' reduced blocks straight out of
   their buffers (the backend's read_peer: process_vm_readv), one copy instead of the ring's
   two (into the shared ring, out of it). 2 ranks, 16 MiB: 56 MiB through each rank's caches
   instead of 72 (docs/performance.md). After the reduce-scatter every position passes on where
   its block is (its pid and buffer; 0 when DISTMESH_SINGLE_COPY=0 there), which also says the
   block is final; then each reads the others; then every position passes on whether its reads
   succeeded, which also says it no longer reads anyone's buffer, so no rank returns (and lets
   its caller write the buffer) while another still reads it. If any read failed (no ptrace
   permission between the ranks: another user, Yama's ptrace_scope, a non-dumpable process; or
   a peer gone), every rank runs the ring's all-gather after all, and from then on: a lost peer
   is then reported by it as ever. The exchanges are ring all-gathers of 16 and 1 bytes. */
/* Each read at least 1 MiB: 2 ranks of a 2-core machine, medians of 5 launches, the ring
   against single copy: 1 MiB 122 against 140 us, 1.5 MiB 219 against 199, 2 MiB 307 against
   269, 16 MiB 2.78 against 2.28 ms (the ring's all-gather copies stay in cache while the
   messages are small; a read's cost per page does not). The backend offers read_peer only
   where the ranks have a core each (4 ranks on 2 cores: no gain, 8.2 against 7.7 ms at 16 MiB). */
#define _DM_SINGLE_COPY_BLOCK ((size_t)1 << 20)
/* The exchanges' rows (16 + 1 bytes and a pointer per rank) live in the engine's scratch, at
   least _DM_PICK_SMALL_BYTES: free once the reduce-scatter is done, as only reductions use it
   and the exchanges receive straight into place. */
#define _DM_SINGLE_COPY_ROW (16 + 1 + sizeof(void*))
_DM_PRIVATE bool _dm_sch_single_copy_fits(const _dm_eng* lk, size_t bytes) {
    size_t W = (size_t)lk->c->size;
    return lk->read_peer && !lk->single_copy_off && lk->lay.H == 1 && bytes / W >= _DM_SINGLE_COPY_BLOCK &&
           W * _DM_SINGLE_COPY_ROW <= _DM_PICK_SMALL_BYTES;
}
_DM_PRIVATE dm_status _dm_sch_single_gather(_dm_eng* lk, const _dm_team* t, unsigned char* rows, size_t bytes,
                                            void** pieces, const _dm_fp* fp) {
    int p;
    for (p = 0; p < t->n; p++) pieces[p] = rows + (size_t)p * bytes;
    return _dm_sch_ring_gather(lk, t, pieces, 1, bytes, _DM_K_ALL_REDUCE, DM_UINT8, fp);
}
/* This rank's reads of every other position's block into recv: true when all succeeded. */
_DM_PRIVATE bool _dm_sch_single_reads(_dm_eng* lk, const _dm_team* t, const unsigned char* where, unsigned char* recv,
                                      size_t count, size_t esize) {
    int p, err;
    size_t off, len;
    for (p = 0; p < t->n; p++) {
        const unsigned char* w = where + (size_t)p * 16;
        if (p == t->me) continue;
        if (_dm_get64(w + 8) == 0) return false;            /* that rank turned it off */
        _dm_segment(count, t->n, p, &off, &len);
        err = lk->read_peer(lk, (int64_t)_dm_get64(w), _dm_get64(w + 8) + off * esize, recv + off * esize, len * esize);
        if (err) {
            _DM_LOG(&lk->c->logger, DM_LOG_INFO, "%s: all_reduce #%llu: a single-copy read from rank %d failed (%s); "
                    "the all-gathers of large all-reduces go through the shared ring from now on", lk->tag,
                    (unsigned long long)lk->c->seq, _dm_team_rank(t, p), strerror(err));
            return false;
        }
    }
    return true;
}
_DM_PRIVATE dm_status _dm_sch_ring_single(_dm_eng* lk, const _dm_team* t, const void* send, void* recv, size_t count,
                                          dm_dtype dtype, dm_reduce_op op, int divide, const _dm_fp* fp) {
    int W = t->n, p;
    size_t esize = dm_dtype_size(dtype);
    unsigned char *where, *ok;
    void** pieces;
    bool all = true;
    _DM_TRY(_dm_sch_ring(lk, t, send, recv, count, dtype, op, divide, fp, _DM_SCH_RING_RS));
    pieces = (void**)(void*)lk->tmp;                        /* see _DM_SINGLE_COPY_ROW */
    where = lk->tmp + (size_t)W * sizeof(void*);
    ok = where + (size_t)W * 16;
    _dm_put64(where + (size_t)t->me * 16, (uint64_t)getpid());
    _dm_put64(where + (size_t)t->me * 16 + 8, lk->single_copy_no ? 0 : (uint64_t)(uintptr_t)recv);
    _DM_TRY(_dm_sch_single_gather(lk, t, where, 16, pieces, fp));
    ok[t->me] = _dm_sch_single_reads(lk, t, where, (unsigned char*)recv, count, esize) ? 1 : 0;
    _DM_TRY(_dm_sch_single_gather(lk, t, ok, 1, pieces, fp));
    for (p = 0; p < W; p++) all = all && ok[p];
    if (all) {
        lk->c->algorithm = "flat_ring_single_copy";        /* dm_last_algorithm */
        return DM_OK;
    }
    lk->single_copy_off = true;
    return _dm_sch_ring(lk, t, recv, recv, count, dtype, op, 0, fp, _DM_SCH_RING_AG);
}

/* >>compressed rails  The middle of the compressed two-level all-reduce
   (dm_all_reduce_compressed; _dm_sch_allreduce_2l with a _dm_cmp): rail i's block, already
   summed exactly on each host, crosses the hosts as codes (>>compression kernels) instead of
   values. Each rank of the rail holds the same block of its host's sum:
     int8: the hosts first agree one scale per DM_COMPRESS_BLOCK elements (recursive doubling
           of the block maxima, MAX); each encodes against them; the codes are summed as
           integers, so the sum is exact and the same whatever the order;
     bf16: values rounded to bfloat16, summed in float32 in host order.
   How the codes move: up to 3 hosts (int8) or 2 (bf16) every host sends its codes to every
   other (an all-gather, (H-1) x the block's codes), each sums all H in host order; beyond,
   host h owns chunk h of the block: the others send it their codes of it, it sums them (int8:
   exactly, into int16, |sum| <= 127 H; bf16: in float32, then rounded once to bfloat16, its own
   rounding error kept in its residual) and sends the sums back (2 (H-1)/H x the chunk's). Both
   send fewer bytes than exact float32 sums (2 (H-1)/H x 4 bytes an element); every rank decodes
   the same codes the same way, so all hold the same bits. With a residual (the block's part of
   the caller's dm_compress_state), it is added before encoding and holds what encoding dropped
   after. The links between rails' hosts beyond the ring's neighbours are met on demand. */
typedef struct _dm_cmp {
    dm_compress mode;           /* DM_COMPRESS_BF16 or DM_COMPRESS_INT8 */
    float* res;                 /* the error feedback at the block's first element, or NULL */
} _dm_cmp;
/* Whether the rail of H hosts sends every host's codes to every other (else through owners). */
_DM_PRIVATE bool _dm_cmp_gathers(dm_compress mode, int H) { return mode == DM_COMPRESS_INT8 ? H <= 3 : H <= 2; }
_DM_PRIVATE unsigned char* _dm_cmp_scratch(_dm_eng* lk, size_t need) {
    if (need > lk->cbuf_size) {
        _dm_free(&lk->c->allocator, lk->cbuf);
        lk->cbuf_size = 0;
        lk->cbuf = (unsigned char*)_dm_malloc(&lk->c->allocator, need);
        if (lk->cbuf) lk->cbuf_size = need;
    }
    return lk->cbuf;
}
/* Every host's codes (cb bytes each) to every other: host h's at all + h * len * cb. */
_DM_PRIVATE dm_status _dm_cmp_all_gather(_dm_eng* lk, const _dm_team* rail, const _dm_fp* fp, unsigned char* all,
                                         size_t bytes) {
    int H = rail->n, me = rail->me, r;
    for (r = 1; r < H; r++) {
        int to = (me + r) % H, from = (me - r + H) % H;
        _DM_TRY(_dm_eng_sendrecv(lk, "all_reduce", fp, _dm_team_rank(rail, to), all + (size_t)me * bytes, bytes,
                                 _dm_team_rank(rail, from), all + (size_t)from * bytes, bytes));
    }
    return DM_OK;
}
/* Through owners: chunk me of every host's codes (mine: this host's, len codes) into in (H
   slots of cmax codes), summed into sums (2 bytes an element, the whole block), then every
   owner's sums to every host; decoded into v. */
_DM_PRIVATE dm_status _dm_cmp_through_owners(_dm_eng* lk, const _dm_team* rail, const _dm_fp* fp, const _dm_cmp* cm,
                                             const unsigned char* mine, unsigned char* in, size_t cmax,
                                             unsigned char* sums, size_t len, const float* m, float* v) {
    static const char* name = "all_reduce";
    int H = rail->n, me = rail->me, r;
    size_t cb = cm->mode == DM_COMPRESS_INT8 ? 1 : 2, off, n, toff, tn;
    _dm_segment(len, H, me, &off, &n);
    memcpy(in + (size_t)me * cmax * cb, mine + off * cb, n * cb);
    for (r = 1; r < H; r++) {                   /* my chunk from every host */
        int to = (me + r) % H, from = (me - r + H) % H;
        _dm_segment(len, H, to, &toff, &tn);
        _DM_TRY(_dm_eng_sendrecv(lk, name, fp, _dm_team_rank(rail, to), mine + toff * cb, tn * cb,
                                 _dm_team_rank(rail, from), in + (size_t)from * cmax * cb, n * cb));
    }
    _dm_cmp_owner_sum(cm->mode, in, H, cmax, n, sums + off * 2, cm->res ? cm->res + off : NULL);
    for (r = 1; r < H; r++) {                   /* every chunk's sums from its owner */
        int to = (me + r) % H, from = (me - r + H) % H;
        _dm_segment(len, H, from, &toff, &tn);
        _DM_TRY(_dm_eng_sendrecv(lk, name, fp, _dm_team_rank(rail, to), sums + off * 2, n * 2,
                                 _dm_team_rank(rail, from), sums + toff * 2, tn * 2));
    }
    _dm_cmp_decode_sums(cm->mode, sums, len, m, v);
    return DM_OK;
}
/* One rail block's compression at work: the block as float32 (v: the block itself for float32,
   else scratch), the agreed maxima m (int8), and the codes (this host's at mine; gathering: H
   slots of len codes, host order; through owners: len codes, then the owners' slots and sums). */
typedef struct _dm_cmp_work {
    float *v, *m;
    unsigned char *codes, *mine;
    size_t len, nb, cmax, cb;
    bool gather, f32;
} _dm_cmp_work;
/* Through owners: where the sums (2 bytes each) start after this host's codes and the owners'
   slots, from w->codes (rounded up: int16 and uint16 stores need even addresses). */
_DM_PRIVATE size_t _dm_cmp_sums_at(const _dm_cmp_work* w, int H) {
    return (w->len * w->cb + (size_t)H * w->cmax * w->cb + 7) & ~(size_t)7;
}
/* The block to float32 with its residual added, the maxima agreed (int8), this host's codes. */
_DM_PRIVATE dm_status _dm_cmp_begin(_dm_eng* lk, const _dm_team* rail, unsigned char* block, size_t len, dm_dtype dtype,
                                    const _dm_fp* fp, const _dm_cmp* cm, _dm_cmp_work* w) {
    int H = rail->n;
    size_t fl, need;
    unsigned char* scratch;
    w->gather = _dm_cmp_gathers(cm->mode, H);
    w->f32 = dtype == DM_FLOAT32;
    w->len = len;
    w->cb = cm->mode == DM_COMPRESS_INT8 ? 1 : 2;
    w->nb = (len + DM_COMPRESS_BLOCK - 1) / DM_COMPRESS_BLOCK;
    w->cmax = len / (size_t)H + 1;
    fl = ((w->f32 ? 0 : len) + w->nb + 1) * sizeof(float);
    need = fl + (w->gather ? (size_t)H * len * w->cb : _dm_cmp_sums_at(w, H) + len * 2);
    scratch = _dm_cmp_scratch(lk, need);
    if (!scratch) return _DM_FAIL(lk->c, DM_ERR_OUT_OF_MEMORY, "%s: all_reduce: no memory for %zu bytes", lk->tag, need);
    w->m = (float*)(void*)scratch;              /* the maxima (nb + 1), then v (16-bit dtypes), then codes */
    w->v = w->f32 ? (float*)(void*)block : w->m + w->nb + 1;
    w->codes = scratch + fl;
    w->mine = w->gather ? w->codes + (size_t)rail->me * len * w->cb : w->codes;
    if (!w->f32) _dm_cmp_to_float(dtype, block, w->v, len);
    if (cm->res) _dm_cmp_add(w->v, cm->res, len);
    if (cm->mode == DM_COMPRESS_INT8) {
        _dm_cmp_maxima(w->v, len, w->m);
        _DM_TRY(_dm_sch_rd(lk, rail, w->m, w->nb, DM_FLOAT32, DM_MAX, 0, fp));
        _dm_cmp_int8_encode(w->v, len, w->m, (int8_t*)w->mine, cm->res);
    } else {
        _dm_cmp_bf16_encode(w->v, len, (uint16_t*)w->mine, cm->res);
    }
    return DM_OK;
}
/* v (the decoded sum) divided for MEAN and back into the block. */
_DM_PRIVATE void _dm_cmp_end(const _dm_cmp_work* w, unsigned char* block, dm_dtype dtype, int divide) {
    if (divide) _dm_cmp_divide(w->v, w->len, divide);
    if (!w->f32) _dm_cmp_from_float(dtype, w->v, block, w->len);
}
/* Rail's compressed all-reduce of block (len elements of dtype, in place), MEAN's divide last. */
_DM_PRIVATE dm_status _dm_sch_rail_compressed(_dm_eng* lk, const _dm_team* rail, unsigned char* block, size_t len,
                                              dm_dtype dtype, int divide, const _dm_fp* fp, const _dm_cmp* cm) {
    _dm_cmp_work w;
    dm_status st;
    _DM_TRY(_dm_cmp_begin(lk, rail, block, len, dtype, fp, cm, &w));
    lk->on_demand = true;
    if (w.gather) {
        st = _dm_cmp_all_gather(lk, rail, fp, w.codes, len * w.cb);
        if (st == DM_OK) _dm_cmp_sum_gathered(cm->mode, w.codes, rail->n, len, w.m, w.v);
    } else {
        st = _dm_cmp_through_owners(lk, rail, fp, cm, w.mine, w.codes + len * w.cb, w.cmax,
                                    w.codes + _dm_cmp_sums_at(&w, rail->n), len, w.m, w.v);
    }
    lk->on_demand = false;
    if (st == DM_OK) _dm_cmp_end(&w, block, dtype, divide);
    return st;
}

/* >>two-level  The two-level all-reduce: a fold onto R ranks of each host, the host's ring,
   R rails across the hosts, and the way back (_dm_sch_allreduce_2l); with R > 1 the middle runs
   pipelined by segment (_dm_sch_2l_stage). */

/* The pipelined middle of the two-level all-reduce (_dm_sch_allreduce_2l with ring rails): the
   buffer is cut into S segments (_dm_segment), and in stage s the host's ring reduce-scatters
   segment s and all-gathers segment s - 2 (one transfer, both on the host's links) while rail
   i all-reduces block i of segment s - 1 across the hosts (a ring, or between two hosts one
   exchange), the two transfers at once
   (_dm_eng_run_n): a host's shared-memory work hides behind its network link's, and the link
   stays busy. S is the model's choice (>>choice, _dm_pick_2l_segments: more segments hide more
   of the host's work, each costs the rail's steps' latency once more), a function of the
   layout, the count and the dtype, so every rank and every transport cuts alike; each segment
   is cut into R blocks as the whole buffer is when S = 1. At most _dm_sch_2l_max_segments: a
   rail's block of a segment of about _DM_SCH_2L_BLOCK bytes or more, at most
   _DM_SCH_2L_SEGMENTS_MAX segments, and an element per host in every segment's block. */
#define _DM_SCH_2L_BLOCK ((size_t)512 << 10)
#define _DM_SCH_2L_SEGMENTS_MAX 64
_DM_PRIVATE int _dm_pick_2l_segments(const _dm_eng* lk, size_t count, size_t esize, int R, bool rail_ring);
_DM_PRIVATE int _dm_pick_cmp_segments(const _dm_eng* lk, size_t count, size_t esize, int R, dm_compress mode);
/* Whether the two-level all-reduce with R rails runs pipelined: R > 1, each rail one transfer
   (a ring, or one exchange between two hosts; one host has no rail), and every rail's block
   of the whole buffer an element per host. The choice (_dm_pick_2l_segments) and the schedule
   (_dm_sch_allreduce_2l) both ask here. */
_DM_PRIVATE bool _dm_sch_2l_pipelined(const _dm_eng* lk, size_t count, int R, bool rail_ring) {
    int H = lk->lay.H;
    return R > 1 && (rail_ring || H <= 2) && count / (size_t)R >= (size_t)H;
}
/* The segments a compressed two-level all-reduce of count elements runs in: the model's
   between two hosts where it runs pipelined (_dm_sch_allreduce_2l), else 1. Rail rank i
   encodes block i of R of each (its error-feedback residual lives there). */
_DM_PRIVATE int _dm_sch_2l_cmp_segments(const _dm_eng* lk, size_t count, size_t esize, int R, dm_compress mode) {
    return _dm_sch_2l_pipelined(lk, count, R, false) && lk->lay.H == 2 ? _dm_pick_cmp_segments(lk, count, esize, R, mode) : 1;
}
_DM_PRIVATE int _dm_sch_2l_max_segments(size_t count, size_t esize, int R, int H) {
    size_t S = count * esize / (_DM_SCH_2L_BLOCK * (size_t)R);
    if (S > _DM_SCH_2L_SEGMENTS_MAX) S = _DM_SCH_2L_SEGMENTS_MAX;
    while (S > 1 && count / S < (size_t)R * (size_t)H) S--;
    return S < 1 ? 1 : (int)S;
}
/* One ring transfer over team t on the steps st holds (k of them), reducing through scratch tmp. */
_DM_PRIVATE void _dm_sch_ring_xfer(_dm_xfer* x, const _dm_team* t, const _dm_steps* st, int k, dm_dtype dtype,
                                   dm_reduce_op op, const _dm_fp* fp, unsigned char* tmp) {
    memset(x, 0, sizeof(*x));
    x->op = "all_reduce"; x->speer = _dm_team_at(t, 1); x->rpeer = _dm_team_at(t, -1);
    x->ss = st->ss; x->ns = k; x->rs = st->rs; x->nr = k;
    x->dtype = dtype; x->rop = op; x->expect = fp; x->tmp = tmp;
}
/* Stage s of S (see above): the host's transfer and the rail's, together. The rail is a ring
   (rail_ring), or recursive doubling between two hosts: one exchange of the block, each side
   reducing what arrives into its own (after sending it), so both get a op b. */
_DM_PRIVATE dm_status _dm_sch_2l_stage(_dm_eng* lk, const _dm_team* host, const _dm_team* rail, bool rail_ring,
                                       unsigned char* buf, size_t count, dm_dtype dtype, dm_reduce_op op, int divide,
                                       const _dm_fp* fp, int S, int s, const _dm_cmp* cm) {
    size_t esize = dm_dtype_size(dtype), off, len, boff, blen = 0;
    int R = host->n, n = 0, k;
    unsigned char* block = NULL;
    _dm_steps hs, rs;
    _dm_xfer x[2];
    _dm_cmp_work w;
    bool coded = false;                         /* the rail moves codes (cm, two hosts) */
    dm_status st = DM_OK;
    memset(&hs, 0, sizeof(hs));
    memset(&rs, 0, sizeof(rs));
    if (s < S || s >= 2) {
        _DM_TRY(_dm_steps_alloc(lk, &hs, 1 + 2 * (R - 1), fp, "all_reduce"));
        k = 1;
        if (s < S) {
            _dm_segment(count, S, s, &off, &len);
            k = _dm_sch_ring_steps(&hs, k, host, buf + off * esize, buf + off * esize, len, esize, 0, _DM_SCH_RING_RS);
        }
        if (s >= 2) {
            _dm_segment(count, S, s - 2, &off, &len);
            k = _dm_sch_ring_steps(&hs, k, host, buf + off * esize, buf + off * esize, len, esize, 0, _DM_SCH_RING_AG);
        }
        _dm_sch_ring_xfer(&x[n++], host, &hs, k, dtype, op, fp, lk->tmp2);
    }
    if (s >= 1 && s <= S) {
        _dm_segment(count, S, s - 1, &off, &len);
        _dm_segment(len, R, host->me, &boff, &blen);
        block = buf + (off + boff) * esize;
        if (rail->n == 1) {
            if (divide) dm_divide_local(dtype, block, blen, divide);
        } else if (cm) {                        /* two hosts: this host's codes for the other's */
            _dm_cmp blk = *cm;
            if (blk.res) blk.res += off + boff;
            st = _dm_cmp_begin(lk, rail, block, blen, dtype, fp, &blk, &w);
            if (st == DM_OK) st = _dm_steps_alloc(lk, &rs, 2, fp, "all_reduce");
            if (st == DM_OK) {
                rs.ss[1].buf = w.mine; rs.ss[1].len = blen * w.cb; rs.ss[1].gate = -1;
                rs.rs[1].buf = w.codes + (size_t)(1 - rail->me) * blen * w.cb; rs.rs[1].len = blen * w.cb;
                rs.rs[1].after_send = -1;
                _dm_sch_ring_xfer(&x[n++], rail, &rs, 2, DM_UINT8, DM_SUM, fp, NULL);
                coded = true;
            }
        } else {
            st = _dm_steps_alloc(lk, &rs, 1 + 2 * (rail->n - 1), fp, "all_reduce");
            if (st == DM_OK && rail_ring) {
                k = _dm_sch_ring_steps(&rs, 1, rail, block, block, blen, esize, divide, _DM_SCH_RING_RS | _DM_SCH_RING_AG);
                _dm_sch_ring_xfer(&x[n++], rail, &rs, k, dtype, op, fp, NULL);
            } else if (st == DM_OK) {       /* two hosts: the exchange */
                rs.ss[1].buf = block; rs.ss[1].len = blen * esize; rs.ss[1].gate = -1;
                rs.rs[1].buf = block; rs.rs[1].len = blen * esize; rs.rs[1].own = block;
                rs.rs[1].after_send = 1; rs.rs[1].divide = divide;
                _dm_sch_ring_xfer(&x[n++], rail, &rs, 2, dtype, op, fp, NULL);
            }
        }
    }
    if (st == DM_OK && n > 0) st = _dm_eng_run_n(lk, x, n);
    if (st == DM_OK && coded) {
        _dm_cmp_sum_gathered(cm->mode, w.codes, 2, blen, w.m, w.v);
        _dm_cmp_end(&w, block, dtype, divide);
    }
    _dm_free(&lk->c->allocator, hs.ss);
    _dm_free(&lk->c->allocator, hs.rs);
    _dm_free(&lk->c->allocator, rs.ss);
    _dm_free(&lk->c->allocator, rs.rs);
    return st;
}

/* The fold of the two- and three-level all-reduces on a host whose first R ranks (host, in
   local order) do the work: local rank e >= R sends its data to local rank e mod R and gets the
   result back (_dm_sch_folded: its whole part); local rank i < R reduces what its folded ranks
   send, in local order (_dm_sch_fold_in), and at the end sends them the result
   (_dm_sch_fold_out). */
_DM_PRIVATE dm_status _dm_sch_folded(_dm_eng* lk, const _dm_team* host, int R, void* recv, size_t bytes,
                                     const _dm_fp* fp) {
    int core = host->ranks[host->me % R];
    _DM_TRY(_dm_eng_sendrecv(lk, "all_reduce", fp, core, recv, bytes, -1, NULL, 0));
    return _dm_eng_sendrecv(lk, "all_reduce", fp, -1, NULL, 0, core, recv, bytes);
}
_DM_PRIVATE dm_status _dm_sch_fold_in(_dm_eng* lk, const _dm_team* host, int R, void* recv, size_t count,
                                      dm_dtype dtype, dm_reduce_op op, const _dm_fp* fp) {
    int e, L = _dm_sch_host_size(lk, lk->lay.host_of[lk->c->rank]);
    for (e = host->me + R; e < L; e += R)
        _DM_TRY(_dm_eng_sendrecv_reduce(lk, "all_reduce", fp, -1, NULL, host->ranks[e], recv, count, dtype, op));
    return DM_OK;
}
_DM_PRIVATE dm_status _dm_sch_fold_out(_dm_eng* lk, const _dm_team* host, int R, void* recv, size_t bytes,
                                       const _dm_fp* fp) {
    int e, L = _dm_sch_host_size(lk, lk->lay.host_of[lk->c->rank]);
    for (e = host->me + R; e < L; e += R)
        _DM_TRY(_dm_eng_sendrecv(lk, "all_reduce", fp, host->ranks[e], recv, bytes, -1, NULL, 0));
    return DM_OK;
}

/* Two-level all-reduce on recv (holding this rank's data) with R rails, R at most the
   smallest host's size:
     1. fold: on every host, local rank e >= R sends its data to local rank e mod R, which
        reduces what it gets in local order;
     2. the host's first R ranks reduce-scatter (ring): local rank i ends with block i of R;
     3. rail i (local rank i of every host) all-reduces block i across hosts: a ring when the
        block has an element per host and rail_ring is set, else recursive doubling;
     4. the first R ranks all-gather (ring); 5. each sends the result to the ranks it folded.
   With R > 1, and ring rails or two hosts, 2-4 run pipelined by segment (_dm_sch_2l_stage):
   block i is then block i of each segment. R = 1 is the small-message form: reduce to a host leader,
   recursive doubling among the leaders, broadcast inside the host. Every step's order is
   fixed by the layout and the count, so the bits are the same on every transport. */
_DM_PRIVATE dm_status _dm_sch_allreduce_2l(_dm_eng* lk, void* recv, size_t count, dm_dtype dtype, dm_reduce_op op,
                                           int divide, const _dm_fp* fp, int R, bool rail_ring, const _dm_cmp* cm) {
    static const char* name = "all_reduce";
    const _dm_layout* y = &lk->lay;
    int me = lk->c->rank, i = y->local[me], S, s;
    size_t esize = dm_dtype_size(dtype), bytes = count * esize, off, len;
    _dm_team host = _dm_sch_host(lk, R), rail;
    unsigned char* block;
    if (i >= R) return _dm_sch_folded(lk, &host, R, recv, bytes, fp);
    _DM_TRY(_dm_sch_fold_in(lk, &host, R, recv, count, dtype, op, fp));
    rail = _dm_sch_rail(lk, i);
    if (_dm_sch_2l_pipelined(lk, count, R, rail_ring) && (!cm || lk->lay.H == 2)) {
        S = cm ? _dm_sch_2l_cmp_segments(lk, count, esize, R, cm->mode) : _dm_pick_2l_segments(lk, count, esize, R, rail_ring);
        if (!lk->tmp2) lk->tmp2 = (unsigned char*)_dm_malloc(&lk->c->allocator, lk->tmp_size);
        if (!lk->tmp2) return _DM_FAIL(lk->c, DM_ERR_OUT_OF_MEMORY, "%s: %s: out of memory", lk->tag, name);
        for (s = 0; s < S + 2; s++)
            _DM_TRY(_dm_sch_2l_stage(lk, &host, &rail, rail_ring, (unsigned char*)recv, count, dtype, op, divide, fp,
                                     S, s, cm));
    } else {
        if (R > 1) _DM_TRY(_dm_sch_ring(lk, &host, recv, recv, count, dtype, op, 0, fp, _DM_SCH_RING_RS));
        _dm_segment(count, R, i, &off, &len);
        block = (unsigned char*)recv + off * esize;
        if (rail.n == 1) {
            if (divide) dm_divide_local(dtype, block, len, divide);
        } else if (cm) {
            _dm_cmp blk = *cm;
            if (blk.res) blk.res += off;
            _DM_TRY(_dm_sch_rail_compressed(lk, &rail, block, len, dtype, divide, fp, &blk));
        } else if (rail_ring && len >= (size_t)rail.n) {
            _DM_TRY(_dm_sch_ring(lk, &rail, block, block, len, dtype, op, divide, fp, _DM_SCH_RING_RS | _DM_SCH_RING_AG));
        } else {
            _DM_TRY(_dm_sch_rd(lk, &rail, block, len, dtype, op, divide, fp));
        }
        if (R > 1) _DM_TRY(_dm_sch_ring(lk, &host, recv, recv, count, dtype, op, 0, fp, _DM_SCH_RING_AG));
    }
    return _dm_sch_fold_out(lk, &host, R, recv, bytes, fp);
}

/* >>three-level  The three-level all-reduce (DISTMESH_SITE, "three_level"): ranks on a host,
   hosts at a site, sites joined by a slower link. Every byte a two-level schedule would put on
   the site link crosses it once: the sites' rails all-reduce 1 / (R x HS) of the buffer each,
   after the host's ring and the site's rails have reduced it, where HS is the hosts per site:
     1. fold onto the host's first R ranks (R = the smallest host's size), as two-level does;
     2. the host's ring reduce-scatters: local rank i holds block i of R;
     3. site rail i (local rank i of every host of the site, host order) reduce-scatters block
        i (a ring): the rank on the site's host j holds piece j of HS;
     4. cross rail (i, j) (local rank i of host j of every site, site order) all-reduces piece
        j: a ring over three sites or more, else recursive doubling (two sites: one exchange);
     5-7. the site rail's all-gather, the host's all-gather, the result back to the folded.
   Runs where every site has the same number of hosts and every piece an element per site
   (_dm_sch_3l_fits); the choice (>>choice) weighs it against the others. Phases run one after
   the other: the site link's phase is the long one by far. The order of reduction is fixed by
   the layout and the count, so the bits are the same on every transport. */

/* Site rail i: local rank i of every host of this rank's site, host order (the team scratch). */
_DM_PRIVATE _dm_team _dm_sch_site_rail(_dm_eng* lk, int i) {
    _dm_layout* y = &lk->lay;
    int h = y->host_of[lk->c->rank], first = y->site_start[y->site_of[h]], n = y->site_start[y->site_of[h] + 1] - first, k;
    for (k = 0; k < n; k++) y->team[k] = y->members[y->start[first + k] + i];
    return _dm_team_of(y->team, n, h - first);
}
/* Cross rail (i, j): local rank i of host j of every site, site order, j this rank's host's
   index at its site (the team scratch's second third, beside a site rail). */
_DM_PRIVATE _dm_team _dm_sch_cross_rail(_dm_eng* lk, int i) {
    _dm_layout* y = &lk->lay;
    int W = lk->c->size, h = y->host_of[lk->c->rank], s = y->site_of[h], j = h - y->site_start[s], k;
    for (k = 0; k < y->NS; k++) y->team[W + k] = y->members[y->start[y->site_start[k] + j] + i];
    return _dm_team_of(y->team + W, y->NS, s);
}
/* Whether the three-level all-reduce can run on count elements: two sites or more, every site
   the same number of hosts, and an element per site in every piece of step 4. */
_DM_PRIVATE bool _dm_sch_3l_fits(const _dm_eng* lk, size_t count) {
    const _dm_layout* y = &lk->lay;
    return y->NS > 1 && y->HSmin == y->HSmax && count >= (size_t)y->Lmin * (size_t)y->HSmin * (size_t)y->NS;
}
/* The bounds of this rank's piece in step 4 (ranks at local index >= R have none: len 0). */
_DM_PRIVATE void _dm_sch_3l_piece(_dm_eng* lk, size_t count, size_t* off, size_t* len) {
    const _dm_layout* y = &lk->lay;
    int i = y->local[lk->c->rank], h = y->host_of[lk->c->rank], s = y->site_of[h];
    size_t boff, blen;
    *off = *len = 0;
    if (i >= y->Lmin) return;
    _dm_segment(count, y->Lmin, i, &boff, &blen);
    _dm_segment(blen, y->site_start[s + 1] - y->site_start[s], h - y->site_start[s], off, len);
    *off += boff;
}
/* Steps 3-5 run pipelined by segment as the two-level middle does (_dm_sch_2l_stage, with the
   site rail as its host ring and the cross rail as its rail): in stage s the site rail
   reduce-scatters segment s of block i and all-gathers segment s - 2 while the cross rail
   all-reduces its piece of segment s - 1, so the site's links work while the site link does.
   S from the model (_dm_pick_3l_segments; 1: one phase after the other).
   cm (dm_all_reduce_compressed, DISTMESH_COMPRESS): the cross rails move codes
   (>>compressed rails), so only the site link is compressed; inside a site the sums stay exact.
   Not pipelined: each rank's residual stays on one piece (_dm_sch_3l_piece). */
_DM_PRIVATE int _dm_pick_3l_segments(const _dm_eng* lk, size_t len, size_t esize);
_DM_PRIVATE dm_status _dm_sch_allreduce_3l(_dm_eng* lk, void* recv, size_t count, dm_dtype dtype, dm_reduce_op op,
                                           int divide, const _dm_fp* fp, const _dm_cmp* cm) {
    const _dm_layout* y = &lk->lay;
    int R = y->Lmin, i = y->local[lk->c->rank], S, s;
    size_t esize = dm_dtype_size(dtype), bytes = count * esize, off, len, poff, plen;
    _dm_team host = _dm_sch_host(lk, R), site, cross;
    unsigned char *block, *piece;
    if (i >= R) return _dm_sch_folded(lk, &host, R, recv, bytes, fp);
    _DM_TRY(_dm_sch_fold_in(lk, &host, R, recv, count, dtype, op, fp));
    if (R > 1) _DM_TRY(_dm_sch_ring(lk, &host, recv, recv, count, dtype, op, 0, fp, _DM_SCH_RING_RS));
    _dm_segment(count, R, i, &off, &len);
    block = (unsigned char*)recv + off * esize;
    site = _dm_sch_site_rail(lk, i);
    cross = _dm_sch_cross_rail(lk, i);
    S = cm ? 1 : _dm_pick_3l_segments(lk, len, esize);
    if (S > 1) {                                /* steps 3-5 pipelined by segment */
        if (!lk->tmp2) lk->tmp2 = (unsigned char*)_dm_malloc(&lk->c->allocator, lk->tmp_size);
        if (!lk->tmp2) return _DM_FAIL(lk->c, DM_ERR_OUT_OF_MEMORY, "%s: all_reduce: out of memory", lk->tag);
        for (s = 0; s < S + 2; s++)
            _DM_TRY(_dm_sch_2l_stage(lk, &site, &cross, cross.n > 2, block, len, dtype, op, divide, fp, S, s, NULL));
        if (R > 1) _DM_TRY(_dm_sch_ring(lk, &host, recv, recv, count, dtype, op, 0, fp, _DM_SCH_RING_AG));
        return _dm_sch_fold_out(lk, &host, R, recv, bytes, fp);
    }
    if (site.n > 1) _DM_TRY(_dm_sch_ring(lk, &site, block, block, len, dtype, op, 0, fp, _DM_SCH_RING_RS));
    _dm_segment(len, site.n, site.me, &poff, &plen);
    piece = block + poff * esize;
    if (cm) {
        _dm_cmp blk = *cm;
        if (blk.res) blk.res += off + poff;
        _DM_TRY(_dm_sch_rail_compressed(lk, &cross, piece, plen, dtype, divide, fp, &blk));
    } else if (cross.n > 2) _DM_TRY(_dm_sch_ring(lk, &cross, piece, piece, plen, dtype, op, divide, fp, _DM_SCH_RING_RS | _DM_SCH_RING_AG));
    else _DM_TRY(_dm_sch_rd(lk, &cross, piece, plen, dtype, op, divide, fp));
    if (site.n > 1) _DM_TRY(_dm_sch_ring(lk, &site, block, block, len, dtype, op, 0, fp, _DM_SCH_RING_AG));
    if (R > 1) _DM_TRY(_dm_sch_ring(lk, &host, recv, recv, count, dtype, op, 0, fp, _DM_SCH_RING_AG));
    return _dm_sch_fold_out(lk, &host, R, recv, bytes, fp);
}

/* >>chain  The pipelined chain broadcast runs on: along the flat ring from the root, or host by
   host (two-level, >>entry points). */

/* Pipelined chain over team t from the rank at position root_pos; each rank forwards bytes to
   the next as they arrive from the previous. Every rank (the root too) compares a fingerprint
   from its predecessor, whatever root it was given: the last rank closes the ring with its
   own, and the root sends data only once that one agreed. Then the last rank, holding all the
   data, sends a done token to the root, which passes it down the chain; a rank returns once it
   has it. So no rank returns DM_OK unless every rank's arguments agreed (the token costs one
   more pass of a byte around the ring). */
_DM_PRIVATE dm_status _dm_sch_chain(_dm_eng* lk, const _dm_team* t, int root_pos, void* buf, size_t bytes,
                                    dm_dtype dtype, const _dm_fp* fp) {
    int W = t->n, pos = _dm_mod(t->me - root_pos, W), ns, nr;
    unsigned char token_out = 1, token_in = 0;
    _dm_sstep ss[3];
    _dm_rstep rs[3];
    _dm_fpbufs b;
    _DM_ZERO(_dm_xfer, x);
    memset(ss, 0, sizeof(ss));
    memset(rs, 0, sizeof(rs));
    _dm_fp_steps(&b, fp, &ss[0], &rs[0]);
    ns = nr = 1;
    if (pos < W - 1) {                      /* data on to the next rank */
        ss[ns].buf = (const unsigned char*)buf; ss[ns].len = bytes;
        ss[ns].gate = pos == 0 ? -1 : 1;
        ss[ns].after_recvs = pos == 0 ? 1 : 0;
        ns++;
    }
    if (pos > 0) {                          /* data from the previous rank */
        rs[nr].buf = (unsigned char*)buf; rs[nr].len = bytes; rs[nr].after_send = -1;
        nr++;
    }
    if (pos < W - 1) {                      /* the token: from the last rank (root) or the previous */
        rs[nr].buf = &token_in; rs[nr].len = 1; rs[nr].after_send = -1;
        nr++;
    }
    if (pos == W - 1 || pos < W - 2) {      /* the token on: the last starts it, W-2 ends it */
        ss[ns].buf = &token_out; ss[ns].len = 1; ss[ns].gate = -1;
        ss[ns].after_recvs = nr;
        ns++;
    }
    x.op = "broadcast";
    x.speer = _dm_team_at(t, 1);
    x.rpeer = _dm_team_at(t, -1);
    x.ss = ss; x.ns = ns; x.rs = rs; x.nr = nr;
    x.dtype = dtype; x.rop = DM_SUM; x.expect = fp;
    return _dm_eng_run(lk, &x);
}

/* >>dissemination  The barrier's rounds over a team: over every rank (flat), or among the host
   leaders (two-level, >>entry points). */

/* Dissemination barrier over team t: round k sends to index me + 2^k and waits for me - 2^k.
   The fingerprint carries the round (first + k) in its root field. */
_DM_PRIVATE dm_status _dm_sch_dissemination(_dm_eng* lk, const _dm_team* t, int first) {
    int k, round = first;
    _dm_fp fp;
    for (k = 1; k < t->n; k <<= 1, round++) {
        _dm_fp_make(&fp, lk->c, _DM_K_BARRIER, -1, -1, round, 0);
        _DM_TRY(_dm_eng_sendrecv(lk, "barrier", &fp, _dm_team_at(t, k), NULL, 0, _dm_team_at(t, -k), NULL, 0));
    }
    return DM_OK;
}

/* >>three-level others  all_gather, reduce_scatter, barrier and the broadcast chain across sites
   ("three_level_ring", "three_level_dissemination", "three_level_chain"): as the three-level
   all-reduce (>>three-level), every byte that must reach another site crosses the site link
   once, a barrier crosses it only in the site leaders' dissemination, and the chain crosses
   each site boundary once. The gathers run on even layouts (every host L ranks, every site HS
   hosts: _dm_pick_gather_three_level), the barrier and the chain on any sited one; in S > 1
   segments (the model's, _dm_pick_3l_gather_segments) their three phases run pipelined, as
   the two-level all-reduce's middle does (_dm_sch_2l_stage): stage by stage, three transfers
   at once (_dm_sch_3l_stage). */

/* The broadcast chain's k-th host from the root's host rh across sites: the hosts of rh's site
   from rh on, around the site, then the hosts after that site in host order, around: the other
   sites one after the other (hosts are numbered site by site). */
_DM_PRIVATE int _dm_sch_chain_host(const _dm_layout* y, int rh, int k) {
    int s = y->site_of[rh], first = y->site_start[s], HS = y->site_start[s + 1] - first;
    if (k < HS) return first + (rh - first + k) % HS;
    return (y->site_start[s + 1] + k - HS) % y->H;
}
/* The rank at local index i of host j of site k. */
_DM_PRIVATE int _dm_sch_3l_at(const _dm_layout* y, int k, int j, int i) {
    return y->members[y->start[y->site_start[k] + j] + i];
}
/* The host's ring of the two- and three-level all-gathers, their last step: local rank p's
   pieces are rail p's H blocks of recvs, host order. pieces: W entries of scratch. */
_DM_PRIVATE dm_status _dm_sch_all_gather_host(_dm_eng* lk, int kind, void* const* recvs, void** pieces, size_t bytes,
                                              dm_dtype dtype, const _dm_fp* fp) {
    const _dm_layout* y = &lk->lay;
    _dm_team t = _dm_sch_host(lk, y->Lmax);
    int p, q;
    for (p = 0; p < y->Lmax; p++)
        for (q = 0; q < y->H; q++) pieces[p * y->H + q] = recvs[y->members[y->start[q] + p]];
    return _dm_sch_ring_gather(lk, &t, pieces, y->H, bytes, kind, dtype, fp);
}
/* The host's ring of the two- and three-level reduce-scatters, their first step: rail i's H
   blocks of in (W blocks of bytes, rank order) reduced over the host into tmp (H blocks, host
   order) for local rank i; a host of one rank copies its blocks. pieces: W entries. */
_DM_PRIVATE dm_status _dm_sch_reduce_scatter_host(_dm_eng* lk, const unsigned char* in, const unsigned char** pieces,
                                                  unsigned char* tmp, size_t bytes, dm_dtype dtype, dm_reduce_op op,
                                                  const _dm_fp* fp) {
    const _dm_layout* y = &lk->lay;
    _dm_team t = _dm_sch_host(lk, y->Lmax);
    int p, q;
    for (p = 0; p < y->Lmax; p++)
        for (q = 0; q < y->H; q++) pieces[p * y->H + q] = in + (size_t)y->members[y->start[q] + p] * bytes;
    if (y->Lmax > 1) return _dm_sch_ring_rs(lk, &t, pieces, tmp, tmp, y->H, bytes, dtype, op, 0, fp);
    for (q = 0; q < y->H; q++) memcpy(tmp + (size_t)q * bytes, pieces[q], bytes);
    return DM_OK;
}
/* The transfers of one stage of a pipelined schedule, run together (_dm_eng_run_n): each a
   ring over its own team on steps of its own, with its own scratch for reductions. */
typedef struct _dm_sch_3l_stage {
    _dm_xfer x[_DM_ENG_XFER_MAX];
    _dm_steps st[_DM_ENG_XFER_MAX];
    int n;
} _dm_sch_3l_stage;
/* The steps of the stage's next transfer (n of them, the fingerprint first), or NULL when out
   of memory (recorded). */
_DM_PRIVATE _dm_steps* _dm_sch_3l_steps(_dm_eng* lk, _dm_sch_3l_stage* g, int n, const _dm_fp* fp, const char* op) {
    if (_dm_steps_alloc(lk, &g->st[g->n], n, fp, op) != DM_OK) return NULL;
    return &g->st[g->n++];
}
/* The stage's last steps (k of them) become its transfer over team t. */
_DM_PRIVATE void _dm_sch_3l_xfer(_dm_sch_3l_stage* g, const _dm_team* t, int k, const char* op, dm_dtype dtype,
                                 dm_reduce_op rop, const _dm_fp* fp, unsigned char* tmp) {
    _dm_xfer* x = &g->x[g->n - 1];
    _dm_sch_ring_xfer(x, t, &g->st[g->n - 1], k, dtype, rop, fp, tmp);
    x->op = op;
}
/* Runs the stage's transfers together (st: DM_OK, or a failure building them) and frees the
   steps. */
_DM_PRIVATE dm_status _dm_sch_3l_run(_dm_eng* lk, _dm_sch_3l_stage* g, dm_status st) {
    int j;
    if (st == DM_OK && g->n > 0) st = _dm_eng_run_n(lk, g->x, g->n);
    for (j = 0; j < g->n; j++) {
        _dm_free(&lk->c->allocator, g->st[j].ss);
        _dm_free(&lk->c->allocator, g->st[j].rs);
    }
    g->n = 0;
    return st;
}
/* The pieces the pipelined gathers' three rings move: the cross rail's NS (site order), the
   site rail's HS x NS (host j's: its rank i's at each site), the host's ring L x H (local rank
   p's: rail p's, host order); W + H + NS entries in all. */
typedef struct _dm_sch_3l_pieces { unsigned char **cross, **site, **host; } _dm_sch_3l_pieces;
_DM_PRIVATE void _dm_sch_3l_pieces_at(const _dm_layout* y, unsigned char** all, _dm_sch_3l_pieces* pc) {
    pc->cross = all; pc->site = all + y->NS; pc->host = all + y->NS + y->H;
}
/* The all-gather's: every piece the block of the rank at its place in recvs. */
_DM_PRIVATE void _dm_sch_3l_gather_pieces(_dm_eng* lk, void* const* recvs, unsigned char** all, _dm_sch_3l_pieces* pc) {
    const _dm_layout* y = &lk->lay;
    int i = y->local[lk->c->rank], NS = y->NS, j, k, p, q;
    _dm_team cross = _dm_sch_cross_rail(lk, i);
    _dm_sch_3l_pieces_at(y, all, pc);
    for (k = 0; k < NS; k++) pc->cross[k] = (unsigned char*)recvs[cross.ranks[k]];
    for (j = 0; j < y->HSmin; j++)
        for (k = 0; k < NS; k++) pc->site[j * NS + k] = (unsigned char*)recvs[_dm_sch_3l_at(y, k, j, i)];
    for (p = 0; p < y->Lmax; p++)
        for (q = 0; q < y->H; q++) pc->host[p * y->H + q] = (unsigned char*)recvs[y->members[y->start[q] + p]];
}
/* Stage s of the pipelined all-gather (S segments of count elements, S + 2 stages): the cross
   rail gathers segment s, the site rail segment s - 1 (its other sites' pieces arrived in
   stage s - 1), the host's ring segment s - 2, at once. */
_DM_PRIVATE dm_status _dm_sch_all_gather_3l_stage(_dm_eng* lk, int kind, const _dm_sch_3l_pieces* pc, size_t count,
                                                  size_t esize, dm_dtype dtype, const _dm_fp* fp, int S, int s) {
    const _dm_layout* y = &lk->lay;
    const char* op = _dm_kind_name(kind);
    int i = y->local[lk->c->rank], NS = y->NS, HS = y->HSmin, L = y->Lmax, k;
    _dm_team cross = _dm_sch_cross_rail(lk, i), site = _dm_sch_site_rail(lk, i), host = _dm_sch_host(lk, L);
    _dm_sch_3l_stage g;
    _dm_steps* st;
    size_t off, len;
    g.n = 0;
    if (s < S) {
        _dm_segment(count, S, s, &off, &len);
        if (!(st = _dm_sch_3l_steps(lk, &g, NS, fp, op)))
            return _dm_sch_3l_run(lk, &g, DM_ERR_OUT_OF_MEMORY);
        k = _dm_sch_gather_steps(st, 1, &cross, (void* const*)pc->cross, 1, off * esize, len * esize);
        _dm_sch_3l_xfer(&g, &cross, k, op, dtype, DM_SUM, fp, NULL);
    }
    if (s >= 1 && s <= S && HS > 1) {
        _dm_segment(count, S, s - 1, &off, &len);
        if (!(st = _dm_sch_3l_steps(lk, &g, 1 + (HS - 1) * NS, fp, op)))
            return _dm_sch_3l_run(lk, &g, DM_ERR_OUT_OF_MEMORY);
        k = _dm_sch_gather_steps(st, 1, &site, (void* const*)pc->site, NS, off * esize, len * esize);
        _dm_sch_3l_xfer(&g, &site, k, op, dtype, DM_SUM, fp, NULL);
    }
    if (s >= 2 && L > 1) {
        _dm_segment(count, S, s - 2, &off, &len);
        if (!(st = _dm_sch_3l_steps(lk, &g, 1 + (L - 1) * y->H, fp, op)))
            return _dm_sch_3l_run(lk, &g, DM_ERR_OUT_OF_MEMORY);
        k = _dm_sch_gather_steps(st, 1, &host, (void* const*)pc->host, y->H, off * esize, len * esize);
        _dm_sch_3l_xfer(&g, &host, k, op, dtype, DM_SUM, fp, NULL);
    }
    return _dm_sch_3l_run(lk, &g, DM_OK);
}
/* All-gather of W blocks of count elements into recvs (this rank's in place), over cross rail
   (i, j): the NS sites' blocks; then site rail i: the HS hosts' NS blocks each; then the
   host's ring: the L local ranks' H blocks each. The site link carries each block to each
   other site once (the two-level rails' ring carries (H - 1) / (NS - 1) / HS times as much).
   S > 1: the three run pipelined by segment (_dm_sch_all_gather_3l_stage), each block cut
   into S segments of elements (_dm_segment); the same bytes cross the same links. pieces: W
   entries of scratch. */
_DM_PRIVATE dm_status _dm_sch_all_gather_3l(_dm_eng* lk, int kind, void* const* recvs, void** pieces, size_t count,
                                            dm_dtype dtype, const _dm_fp* fp, int S) {
    const _dm_layout* y = &lk->lay;
    int i = y->local[lk->c->rank], HS = y->HSmin, NS = y->NS, j, k, s;
    size_t esize = dm_dtype_size(dtype), bytes = count * esize;
    _dm_team t = _dm_sch_cross_rail(lk, i);
    if (S > 1) {
        size_t n_all = (size_t)(lk->c->size + y->H + NS);
        unsigned char** all = (unsigned char**)_dm_malloc(&lk->c->allocator, sizeof(void*) * n_all);
        _dm_sch_3l_pieces pc;
        dm_status st = DM_OK;
        if (!all) return _DM_FAIL(lk->c, DM_ERR_OUT_OF_MEMORY, "%s: %s: out of memory", lk->tag, _dm_kind_name(kind));
        _dm_sch_3l_gather_pieces(lk, recvs, all, &pc);
        for (s = 0; s < S + 2 && st == DM_OK; s++)
            st = _dm_sch_all_gather_3l_stage(lk, kind, &pc, count, esize, dtype, fp, S, s);
        _dm_free(&lk->c->allocator, all);
        return st;
    }
    for (k = 0; k < NS; k++) pieces[k] = recvs[t.ranks[k]];
    _DM_TRY(_dm_sch_ring_gather(lk, &t, pieces, 1, bytes, kind, dtype, fp));
    t = _dm_sch_site_rail(lk, i);                 /* host j's pieces: its rank i's sites, site order */
    for (j = 0; j < HS; j++)
        for (k = 0; k < NS; k++) pieces[j * NS + k] = recvs[_dm_sch_3l_at(y, k, j, i)];
    _DM_TRY(_dm_sch_ring_gather(lk, &t, pieces, NS, bytes, kind, dtype, fp));
    return _dm_sch_all_gather_host(lk, kind, recvs, pieces, bytes, dtype, fp);
}
/* Stage s of the pipelined reduce-scatter (S segments of count elements, S + 2 stages), the
   all-gather's backwards: the host's ring reduces segment s into tmp (a host of one rank
   copies it), the site rail segment s - 1 of tmp into mid, the cross rail segment s - 2 of mid
   into out, at once, each reducing through scratch of its own (lk->tmp, chunks[0], chunks[1]:
   tmp_size bytes each). */
_DM_PRIVATE dm_status _dm_sch_reduce_scatter_3l_stage(_dm_eng* lk, const _dm_sch_3l_pieces* pc, unsigned char* out,
                                                      unsigned char* tmp, unsigned char* mid, unsigned char* const* chunks,
                                                      size_t count, dm_dtype dtype, dm_reduce_op op, int divide,
                                                      const _dm_fp* fp, int S, int s) {
    const _dm_layout* y = &lk->lay;
    int i = y->local[lk->c->rank], NS = y->NS, HS = y->HSmin, L = y->Lmax, H = y->H, k;
    size_t esize = dm_dtype_size(dtype), bytes = count * esize, off, len;
    _dm_team cross = _dm_sch_cross_rail(lk, i), site = _dm_sch_site_rail(lk, i), host = _dm_sch_host(lk, L);
    _dm_sch_3l_stage g;
    _dm_steps* st;
    g.n = 0;
    if (s < S) {
        _dm_segment(count, S, s, &off, &len);
        off *= esize; len *= esize;
        if (L == 1) {
            for (k = 0; k < H; k++) memcpy(tmp + (size_t)k * bytes + off, pc->host[k] + off, len);
        } else {
            if (!(st = _dm_sch_3l_steps(lk, &g, 1 + (L - 1) * H, fp, "reduce_scatter")))
                return _dm_sch_3l_run(lk, &g, DM_ERR_OUT_OF_MEMORY);
            k = _dm_sch_rs_steps(st, 1, &host, (const unsigned char* const*)pc->host, tmp, tmp, bytes, H, off, len, 0);
            _dm_sch_3l_xfer(&g, &host, k, "reduce_scatter", dtype, op, fp, NULL);
        }
    }
    if (s >= 1 && s <= S) {
        _dm_segment(count, S, s - 1, &off, &len);
        off *= esize; len *= esize;
        if (HS == 1) {
            for (k = 0; k < NS; k++) memcpy(mid + (size_t)k * bytes + off, pc->site[k] + off, len);
        } else {
            if (!(st = _dm_sch_3l_steps(lk, &g, 1 + (HS - 1) * NS, fp, "reduce_scatter")))
                return _dm_sch_3l_run(lk, &g, DM_ERR_OUT_OF_MEMORY);
            k = _dm_sch_rs_steps(st, 1, &site, (const unsigned char* const*)pc->site, mid, mid, bytes, NS, off, len, 0);
            _dm_sch_3l_xfer(&g, &site, k, "reduce_scatter", dtype, op, fp, chunks[0]);
        }
    }
    if (s >= 2) {
        _dm_segment(count, S, s - 2, &off, &len);
        off *= esize; len *= esize;
        if (!(st = _dm_sch_3l_steps(lk, &g, NS, fp, "reduce_scatter")))
            return _dm_sch_3l_run(lk, &g, DM_ERR_OUT_OF_MEMORY);
        k = _dm_sch_rs_steps(st, 1, &cross, (const unsigned char* const*)pc->cross, out, out, bytes, 1, off, len, divide);
        _dm_sch_3l_xfer(&g, &cross, k, "reduce_scatter", dtype, op, fp, chunks[1]);
    }
    return _dm_sch_3l_run(lk, &g, DM_OK);
}
/* Reduce-scatter, the all-gather's steps backwards: the host's ring reduces, for local rank i,
   rail i's H blocks (into tmp, host order, so site by site); site rail i reduces those into
   the NS blocks of its host's rank i at each site (tmp + H blocks); cross rail (i, j) reduces
   them into this rank's block of out (MEAN divides there). in: W blocks of count elements,
   rank order, read only in the first step (segment s of it in stage s when pipelined), so out
   may be one of them. pieces: W entries; tmp: H + NS blocks, then (S > 1) two scratch chunks
   of tmp_size bytes. S > 1: pipelined by segment (_dm_sch_reduce_scatter_3l_stage); every
   element is reduced by the same rings in the same order as with S = 1 (_dm_sch_rs_steps), so
   the bits are the same. */
_DM_PRIVATE dm_status _dm_sch_reduce_scatter_3l(_dm_eng* lk, const unsigned char* in, const unsigned char** pieces,
                                                unsigned char* out, unsigned char* tmp, size_t count, dm_dtype dtype,
                                                dm_reduce_op op, int divide, const _dm_fp* fp, int S) {
    const _dm_layout* y = &lk->lay;
    int i = y->local[lk->c->rank], HS = y->HSmin, NS = y->NS, W = lk->c->size, j, k, s;
    size_t bytes = count * dm_dtype_size(dtype);
    unsigned char* mid = tmp + (size_t)y->H * bytes;
    _dm_team t;
    if (S > 1) {
        unsigned char** all = (unsigned char**)_dm_malloc(&lk->c->allocator, sizeof(void*) * (size_t)(W + y->H + NS));
        unsigned char* chunks[2];
        _dm_sch_3l_pieces pc;
        dm_status st = DM_OK;
        if (!all) return _DM_FAIL(lk->c, DM_ERR_OUT_OF_MEMORY, "%s: reduce_scatter: out of memory", lk->tag);
        chunks[0] = mid + (size_t)NS * bytes;
        chunks[1] = chunks[0] + lk->tmp_size;
        _dm_sch_3l_pieces_at(y, all, &pc);
        for (k = 0; k < NS; k++) pc.cross[k] = mid + (size_t)k * bytes;
        for (j = 0; j < HS; j++)                  /* host j's pieces: site by site */
            for (k = 0; k < NS; k++) pc.site[j * NS + k] = tmp + (size_t)(y->site_start[k] + j) * bytes;
        for (j = 0; j < y->Lmax; j++)             /* local rank j's: rail j's H blocks, host order */
            for (k = 0; k < y->H; k++)
                pc.host[j * y->H + k] = (unsigned char*)in + (size_t)y->members[y->start[k] + j] * bytes;
        for (s = 0; s < S + 2 && st == DM_OK; s++)
            st = _dm_sch_reduce_scatter_3l_stage(lk, &pc, out, tmp, mid, chunks, count, dtype, op, divide, fp, S, s);
        _dm_free(&lk->c->allocator, all);
        return st;
    }
    _DM_TRY(_dm_sch_reduce_scatter_host(lk, in, pieces, tmp, bytes, dtype, op, fp));
    t = _dm_sch_site_rail(lk, i);                 /* host j's pieces: site by site */
    for (j = 0; j < HS; j++)
        for (k = 0; k < NS; k++) pieces[j * NS + k] = tmp + (size_t)(y->site_start[k] + j) * bytes;
    if (HS > 1) _DM_TRY(_dm_sch_ring_rs(lk, &t, pieces, mid, mid, NS, bytes, dtype, op, 0, fp));
    else for (k = 0; k < NS; k++) memcpy(mid + (size_t)k * bytes, pieces[k], bytes);
    t = _dm_sch_cross_rail(lk, i);
    for (k = 0; k < NS; k++) pieces[k] = mid + (size_t)k * bytes;
    return _dm_sch_ring_rs(lk, &t, pieces, out, out, 1, bytes, dtype, op, divide, fp);
}
/* Barrier: every rank tells its host's leader (local rank 0), each host's leader its site's
   leader (the first host's), the site leaders disseminate across the site link (ceil(log2
   NS) rounds instead of the host leaders' ceil(log2 H)), and the releases come back down. */
#define _DM_BARRIER_ROUND_ARRIVE 1000
#define _DM_BARRIER_ROUND_RELEASE 1001
#define _DM_BARRIER_ROUND_SITE_ARRIVE 1002
#define _DM_BARRIER_ROUND_SITE_RELEASE 1003
/* A leader's side of a barrier level: an arrival from each of n ranks, later a release to
   each; a member's side: its arrival at its leader, then the leader's release. */
_DM_PRIVATE dm_status _dm_sch_gather_arrivals(_dm_eng* lk, const _dm_fp* arrive, const int* from, int n) {
    int e;
    for (e = 0; e < n; e++) _DM_TRY(_dm_eng_sendrecv(lk, "barrier", arrive, -1, NULL, 0, from[e], NULL, 0));
    return DM_OK;
}
_DM_PRIVATE dm_status _dm_sch_send_releases(_dm_eng* lk, const _dm_fp* release, const int* to, int n) {
    int e;
    for (e = 0; e < n; e++) _DM_TRY(_dm_eng_sendrecv(lk, "barrier", release, to[e], NULL, 0, -1, NULL, 0));
    return DM_OK;
}
_DM_PRIVATE dm_status _dm_sch_arrive_wait(_dm_eng* lk, const _dm_fp* arrive, const _dm_fp* release, int leader) {
    _DM_TRY(_dm_eng_sendrecv(lk, "barrier", arrive, leader, NULL, 0, -1, NULL, 0));
    return _dm_eng_sendrecv(lk, "barrier", release, -1, NULL, 0, leader, NULL, 0);
}
_DM_PRIVATE dm_status _dm_sch_barrier_3l(_dm_eng* lk) {
    _dm_layout* y = &lk->lay;
    dm_collective* c = lk->c;
    int h = y->host_of[c->rank], s = y->site_of[h], first = y->site_start[s], hosts = y->site_start[s + 1] - first, k;
    const int* host = y->members + y->start[h];
    _dm_fp arrive, release, site_arrive, site_release;
    _dm_team t;
    _dm_fp_make(&arrive, c, _DM_K_BARRIER, -1, -1, _DM_BARRIER_ROUND_ARRIVE, 0);
    _dm_fp_make(&release, c, _DM_K_BARRIER, -1, -1, _DM_BARRIER_ROUND_RELEASE, 0);
    _dm_fp_make(&site_arrive, c, _DM_K_BARRIER, -1, -1, _DM_BARRIER_ROUND_SITE_ARRIVE, 0);
    _dm_fp_make(&site_release, c, _DM_K_BARRIER, -1, -1, _DM_BARRIER_ROUND_SITE_RELEASE, 0);
    if (y->local[c->rank] > 0) return _dm_sch_arrive_wait(lk, &arrive, &release, host[0]);
    _DM_TRY(_dm_sch_gather_arrivals(lk, &arrive, host + 1, _dm_sch_host_size(lk, h) - 1));
    for (k = 1; k < hosts; k++) y->team[k - 1] = y->members[y->start[first + k]];     /* the site's other leaders */
    if (h != first) {
        _DM_TRY(_dm_sch_arrive_wait(lk, &site_arrive, &site_release, y->members[y->start[first]]));
    } else {
        _DM_TRY(_dm_sch_gather_arrivals(lk, &site_arrive, y->team, hosts - 1));
        for (k = 0; k < y->NS; k++) y->team[c->size + k] = y->members[y->start[y->site_start[k]]];
        t = _dm_team_of(y->team + c->size, y->NS, s);
        _DM_TRY(_dm_sch_dissemination(lk, &t, 0));
        _DM_TRY(_dm_sch_send_releases(lk, &site_release, y->team, hosts - 1));
    }
    return _dm_sch_send_releases(lk, &release, host + 1, _dm_sch_host_size(lk, h) - 1);
}

/* >>choice  Which algorithm a collective runs: a fixed function of the group's size, its host
   layout, the count and the dtype, so every rank of a group picks the same one, and the same
   inputs on the same layout give the same bits on every transport (the threaded world given
   that layout, shared memory + sockets, sockets alone). Nothing is measured at run time but the
   site link's latency over sockets, and that only for the three-level gathers' segments, which
   never change the bits (>>site probe).

   The model (Hockney: a message of b bytes over a link of class c costs alpha_c + b * beta_c;
   the steps of one phase run on all links at once, so a phase costs its slowest link's steps)
   has three link classes, listed once below (_DM_COST_CLASSES): shared memory, same-host
   socket, cross-host socket. Ranks of one host are costed as shared memory whatever carries them, so that the choice
   never depends on the transport (DISTMESH_TRANSPORT=tcp gives the same bits); the same-host
   socket class is there for the predictions in docs/performance.md.

   One model, on paper too: scripts/cost_model.py does not copy it. It asks the model's front
   end (scripts/cost_model.c, this section's functions on a layout it is given, with other
   link classes where it predicts other networks through _dm_eng.cost), and tests/test_maps.c
   holds the script's answers against what the collectives run on the threaded world
   (dm_last_algorithm). A new all_reduce algorithm enters the model in two
   places here: its cost in _dm_cost_all_reduce, and when it may run in _dm_pick_all_reduce;
   the front end, the script's table and P (>>peers) take it from the list (>>algorithms).

   all_reduce (and reduce, which gives the root all_reduce's bits):
     one host, or one rank per host: recursive doubling at or below 64 KiB or with fewer
       elements than ranks, else the ring (measured on one host, not from this model);
     else the cheapest by the model of: the flat ring, flat recursive doubling, two-level with
       R = the smallest host's size rails (each rail a ring or recursive doubling, the cheaper)
       and two-level with one rail (host leaders, recursive doubling among them).
   all_gather, reduce_scatter: two-level (rails, then the host) when every host has the same
     number L > 1 of ranks, there are H > 1 hosts and the model says it is cheaper.
   broadcast: a chain from the root through its host, then host by host (two-level) whenever
     H > 1: it crosses each host boundary once.
   barrier: two-level (host leaders, dissemination among them) when the model says so.
   DISTMESH_ALGO forces the family (flat, two_level) or the all_reduce algorithm. */
/* The link classes: name, alpha (us), beta (ns per byte), what they stand for. */
#define _DM_COST_CLASSES(X)                                                                    \
    X(SHM, 1.0, 0.125, "shared memory: 8 GB/s, one core's memcpy")                             \
    X(SAME_HOST_SOCKET, 10.0, 0.6, "same-host socket: 1.6 GB/s, loopback TCP")                 \
    X(CROSS_HOST, 25.0, 0.8, "cross-host socket: 10 Gbit/s, shared by a host's flows")         \
    X(CROSS_SITE, 5000.0, 8.0, "cross-site link: 5 ms, 1 Gbit/s, shared by a site's flows")
enum {
#define _DM_X(name, alpha, beta, text) _DM_COST_##name,
    _DM_COST_CLASSES(_DM_X)
#undef _DM_X
    _DM_COST_NCLASSES
};
static const _dm_link_cost _dm_cost_classes[_DM_COST_NCLASSES] = {
#define _DM_X(name, alpha, beta, text) { alpha, beta },
    _DM_COST_CLASSES(_DM_X)
#undef _DM_X
};
/* Class k as this group's model sees it: the classes above, unless given others (lk->cost). */
_DM_PRIVATE const _dm_link_cost* _dm_cost_class(const _dm_eng* lk, int k) {
    if (lk->cost) return &lk->cost[k];
    if (k == _DM_COST_CROSS_HOST && lk->link_env[0].alpha_us > 0) return &lk->link_env[0];  /* DISTMESH_HOST_LINK */
    if (k == _DM_COST_CROSS_SITE && lk->link_env[1].alpha_us > 0) return &lk->link_env[1];  /* DISTMESH_SITE_LINK */
    return &_dm_cost_classes[k];
}
/* steps messages of b bytes each, in microseconds. */
_DM_PRIVATE double _dm_cost(const _dm_link_cost* k, double steps, double b) {
    return steps * (k->alpha_us + b * k->beta_ns * 1e-3);
}
_DM_PRIVATE int _dm_ceil_log2(int n) { int k = 0; while ((1 << k) < n) k++; return k; }
/* The model's scratch, 5 x size entries after the teams' (_dm_layout.team): a round's counts
   per host and per site (2 x size), its senders and partners (size each), a rail's leaders. */
_DM_PRIVATE int* _dm_cost_scratch(const _dm_eng* lk) { return lk->lay.team + 2 * lk->c->size; }
/* steps messages over two classes at once, b_site bytes on each site link (of class site) and
   b_host on each host link per step: the slower of the two, or the host link's alone on one
   site. */
_DM_PRIVATE double _dm_cost_sites_at(const _dm_eng* lk, const _dm_link_cost* site, double steps, double b_site,
                                     double b_host) {
    double host = _dm_cost(_dm_cost_class(lk, _DM_COST_CROSS_HOST), steps, b_host), t;
    if (lk->lay.NS < 2) return host;
    t = _dm_cost(site, steps, b_site);
    return t > host ? t : host;
}
/* The same over the site class (_dm_cost_class). */
_DM_PRIVATE double _dm_cost_sites(const _dm_eng* lk, double steps, double b_site, double b_host) {
    return _dm_cost_sites_at(lk, _dm_cost_class(lk, _DM_COST_CROSS_SITE), steps, b_site, b_host);
}
/* One round of pairs (rank a[i] sends b bytes to o[i], i < n): its slowest link. A host's
   flows across share its link, and a site's flows to other sites share the site's link, so a
   round costs alpha + (the most ranks of one host sending across) * b * beta, or the site
   link's for the most ranks of one site sending to another, whichever is slower; a round
   inside the hosts costs shared memory's. per_host: 2 x size entries of scratch. */
_DM_PRIVATE double _dm_cost_round(const _dm_eng* lk, const int* a, const int* o, int n, double b, int* per_host) {
    const _dm_layout* y = &lk->lay;
    int i, most = 0, most_site = 0, *per_site = per_host + y->H;
    for (i = 0; i < y->H; i++) per_host[i] = 0;
    for (i = 0; i < y->NS; i++) per_site[i] = 0;
    for (i = 0; i < n; i++) {
        int ha = y->host_of[a[i]], ho = y->host_of[o[i]];
        if (ha != ho && ++per_host[ha] > most) most = per_host[ha];
        if (y->site_of[ha] != y->site_of[ho] && ++per_site[y->site_of[ha]] > most_site) most_site = per_site[y->site_of[ha]];
    }
    return most ? _dm_cost_sites(lk, 1, b * most_site, b * most) : _dm_cost(_dm_cost_class(lk, _DM_COST_SHM), 1, b);
}
/* Recursive doubling over a team of N ranks (rank(i) at index i) with b bytes, round by round:
   over every rank (identity order), or over the host leaders (a rail). */
_DM_PRIVATE double _dm_cost_rd_rounds(const _dm_eng* lk, int N, const int* ranks, double b) {
    int W = lk->c->size, p = 1, rem, mask, q, n;
    int *per_host = _dm_cost_scratch(lk), *a = per_host + 2 * W, *o = a + W;  /* counts, senders, partners */
    double t = 0;
    while (p * 2 <= N) p *= 2;
    rem = N - p;
#define _DM_RANK_AT(i) (ranks ? ranks[i] : (i))
    for (q = 0, n = 0; q < rem; q++) { a[n] = _DM_RANK_AT(2 * q); o[n++] = _DM_RANK_AT(2 * q + 1); }
    if (rem) t += 2 * _dm_cost_round(lk, a, o, n, b, per_host);
    for (mask = 1; mask < p; mask <<= 1) {
        for (q = 0, n = 0; q < p; q++) {
            int pn = q ^ mask;
            a[n] = _DM_RANK_AT(q < rem ? 2 * q + 1 : q + rem);
            o[n++] = _DM_RANK_AT(pn < rem ? 2 * pn + 1 : pn + rem);
        }
        t += _dm_cost_round(lk, a, o, n, b, per_host);
    }
#undef _DM_RANK_AT
    return t;
}
_DM_PRIVATE double _dm_cost_flat_rd(const _dm_eng* lk, double b) { return _dm_cost_rd_rounds(lk, lk->c->size, NULL, b); }
/* The rails' recursive doubling across sites: the rounds of the host leaders' rail (each
   leader's b bytes stand for its host's R rails of b/R), in the model's own scratch. */
_DM_PRIVATE double _dm_cost_2l_rd_rails(const _dm_eng* lk, double b) {
    const _dm_layout* y = &lk->lay;
    int h, *leaders = _dm_cost_scratch(lk) + 4 * lk->c->size;
    for (h = 0; h < y->H; h++) leaders[h] = y->members[y->start[h]];
    return _dm_cost_rd_rounds(lk, y->H, leaders, b);
}
/* The flat ring crosses each host boundary, and each site boundary, once per step. */
_DM_PRIVATE double _dm_cost_flat_ring(const _dm_eng* lk, double b) {
    int W = lk->c->size;
    if (lk->lay.H < 2) return _dm_cost(_dm_cost_class(lk, _DM_COST_SHM), 2.0 * (W - 1), b / W);
    return _dm_cost_sites(lk, 2.0 * (W - 1), b / W, b / W);
}
/* The host's ring (R ranks) and the rails of the two-level all-reduce on b bytes, run over S
   segments: one after the other when S = 1, else pipelined (_dm_sch_2l_stage), the larger of
   the two (each S times as many steps of 1/S the bytes) plus the host's share of one segment
   (the reduce-scatter of the first, the all-gather of the last). A host's R rails share its
   link, so a rail step of b/R/H bytes costs the host b/H. Across sites a ring rail step puts
   b/H on each site link too (one host per site sends across); recursive doubling's rounds
   are those of its first host's ranks (_dm_cost_2l_rd_rails). */
_DM_PRIVATE double _dm_cost_2l_middle(const _dm_eng* lk, double b, int R, bool rail_ring, int S) {
    int H = lk->lay.H;
    double host = _dm_cost(_dm_cost_class(lk, _DM_COST_SHM), 2.0 * (R - 1) * S, b / R / S), rails;
    if (rail_ring) rails = _dm_cost_sites(lk, 2.0 * (H - 1) * S, b / H / S, b / H / S);
    else rails = lk->lay.NS > 1 ? S * _dm_cost_2l_rd_rails(lk, b / S)
                                : _dm_cost(_dm_cost_class(lk, _DM_COST_CROSS_HOST),
                                           (double)(_dm_ceil_log2(H) + ((H & (H - 1)) ? 2 : 0)) * S, b / S);
    if (S == 1) return host + rails;
    return (host > rails ? host : rails) + host / S;
}
/* The segments of the pipelined two-level all-reduce (R > 1, and ring rails or two hosts):
   of 1, 2, 4, ... and the most allowed (_dm_sch_2l_max_segments), the cheapest by the model
   (ties: the fewer). Else 1. */
_DM_PRIVATE int _dm_pick_2l_segments(const _dm_eng* lk, size_t count, size_t esize, int R, bool rail_ring) {
    int most = _dm_sch_2l_pipelined(lk, count, R, rail_ring) ? _dm_sch_2l_max_segments(count, esize, R, lk->lay.H) : 1;
    int S, best = 1;
    double b = (double)count * (double)esize, least = _dm_cost_2l_middle(lk, b, R, rail_ring, 1);
    for (S = 2; most > 1; S *= 2) {
        int k = S < most ? S : most;
        double t = _dm_cost_2l_middle(lk, b, R, rail_ring, k);
        if (t < least) { least = t; best = k; }
        if (S >= most) break;
    }
    return best;
}
/* Three-level (>>three-level) on b bytes, its steps inside a host: the fold and its return, the
   host's ring (R ranks); inside the sites: those and the site rails' ring (a host's R rails
   share its link: b/HS per step). */
_DM_PRIVATE double _dm_cost_3l_host(const _dm_eng* lk, double b) {
    const _dm_link_cost* shm = _dm_cost_class(lk, _DM_COST_SHM);
    int R = lk->lay.Lmin;
    return _dm_cost(shm, 2.0 * ((lk->lay.Lmax - 1) / R), b) + _dm_cost(shm, 2.0 * (R - 1), b / R);
}
_DM_PRIVATE double _dm_cost_3l_inside(const _dm_eng* lk, double b) {
    int HS = lk->lay.HSmin;
    double t = _dm_cost_3l_host(lk, b);
    return HS > 1 ? t + _dm_cost(_dm_cost_class(lk, _DM_COST_CROSS_HOST), 2.0 * (HS - 1), b / HS) : t;
}
_DM_PRIVATE double _dm_cost_3l_middle(const _dm_eng* lk, double b, int S);
_DM_PRIVATE int _dm_pick_3l_segments(const _dm_eng* lk, size_t len, size_t esize);
/* The fold and the host's ring, then the middle over the model's segments (S = 1: one phase
   after the other; the cross rails: a site's R x HS rails share its link, b/NS per ring step,
   or one exchange between two sites of b per site link and b/HS per host link). */
_DM_PRIVATE double _dm_cost_three_level(const _dm_eng* lk, size_t count, size_t esize) {
    int S = _dm_pick_3l_segments(lk, count / (size_t)lk->lay.Lmin, esize);
    double b = (double)count * (double)esize;
    return _dm_cost_3l_host(lk, b) + _dm_cost_3l_middle(lk, b, S);
}
/* Three-level's steps 3-5 on b bytes (a host's R blocks together) over S segments, as
   _dm_cost_2l_middle: one after the other when S = 1, else the larger of the site rails' and
   the cross rails' parts plus the site rails' share of one segment. */
_DM_PRIVATE double _dm_cost_3l_middle(const _dm_eng* lk, double b, int S) {
    int HS = lk->lay.HSmin, NS = lk->lay.NS;
    double site = _dm_cost(_dm_cost_class(lk, _DM_COST_CROSS_HOST), 2.0 * (HS - 1) * S, b / HS / S), cross;
    if (NS > 2) cross = _dm_cost_sites(lk, 2.0 * (NS - 1) * S, b / NS / S, b / HS / NS / S);
    else cross = _dm_cost_sites(lk, (double)S, b / S, b / HS / S);
    if (S == 1) return site + cross;
    return (site > cross ? site : cross) + site / S;
}
/* The segments of three-level's middle for a block of len elements: 1 where it cannot be cut
   (one host per site, or a piece of a segment without an element per site), else of 1, 2,
   4, ... and the most allowed (_dm_sch_2l_max_segments on the site rails), the cheapest. */
_DM_PRIVATE int _dm_pick_3l_segments(const _dm_eng* lk, size_t len, size_t esize) {
    const _dm_layout* y = &lk->lay;
    int HS = y->HSmin, NS = y->NS, most, S, best = 1;
    double b = (double)len * (double)esize * y->Lmin, least;
    if (HS < 2 || len / (size_t)HS < (size_t)NS) return 1;
    most = _dm_sch_2l_max_segments(len, esize, HS, NS);
    least = _dm_cost_3l_middle(lk, b, 1);
    for (S = 2; most > 1; S *= 2) {
        int k = S < most ? S : most;
        double t = _dm_cost_3l_middle(lk, b, k);
        if (t < least) { least = t; best = k; }
        if (S >= most) break;
    }
    return best;
}
/* The compressed three-level all-reduce: the cross rails gather the site's codes (n elements
   of cb bytes per site link, NS - 1 steps), int8's maxima agreed first. */
_DM_PRIVATE double _dm_cost_3l_compressed(const _dm_eng* lk, size_t count, size_t esize, dm_compress mode) {
    int HS = lk->lay.HSmin, NS = lk->lay.NS;
    double n = (double)count, cb = mode == DM_COMPRESS_INT8 ? 1 : 2, t;
    t = _dm_cost_3l_inside(lk, n * (double)esize) + _dm_cost_sites(lk, NS - 1.0, n * cb, n * cb / HS);
    if (mode == DM_COMPRESS_INT8) {
        double m = n / DM_COMPRESS_BLOCK * 4;
        t += _dm_cost_sites(lk, _dm_ceil_log2(NS), m, m / HS);
    }
    return t;
}
/* Two-level with R rails: the fold and its return, then the host's ring and the rails. */
_DM_PRIVATE double _dm_cost_two_level(const _dm_eng* lk, size_t count, size_t esize, int R, bool rail_ring) {
    const _dm_layout* y = &lk->lay;
    double b = (double)count * (double)esize;
    return _dm_cost(_dm_cost_class(lk, _DM_COST_SHM), 2.0 * ((y->Lmax - 1) / R), b) +
           _dm_cost_2l_middle(lk, b, R, rail_ring, _dm_pick_2l_segments(lk, count, esize, R, rail_ring));
}
/* The segments of the compressed two-level all-reduce where it runs pipelined (two hosts, R > 1
   rails; the schedule and the model below both ask here). int8: segments of a quarter the
   bytes (the rail moves a quarter of them, and encoding waits on the host's stage): on 2 x 2 at
   2 Gbit/s 16 MiB took 34.1 ms with the exact model's 8 segments, 28.1 ms with 64; bf16 (half
   the bytes) was slower with 32, so it takes the exact model's. */
_DM_PRIVATE int _dm_pick_cmp_segments(const _dm_eng* lk, size_t count, size_t esize, int R, dm_compress mode) {
    if (mode == DM_COMPRESS_INT8) return _dm_sch_2l_max_segments(count, esize * 4, R, lk->lay.H);
    return _dm_pick_2l_segments(lk, count, esize, R, false);
}
/* The compressed two-level all-reduce (>>compressed rails, dm_all_reduce_compressed) in mode on
   count elements of esize bytes, as two_level_ring is costed: the fold, the host's ring, and the
   rails moving codes instead of values (all R rails share the host's link, as above): int8's
   maxima agreed first (recursive doubling of 4 bytes per DM_COMPRESS_BLOCK elements), then the
   codes gathered (H - 1 steps of every element's code) or through owners (H - 1 steps of 1/H of
   the codes, H - 1 of 1/H of the 2-byte sums); pipelined by segment on two hosts. Only asked for
   (the choice never compresses by itself); the model's front end (scripts/cost_model.c) prints it
   beside the exact algorithms. */
/* A compressed rail step of b bytes per host: across sites (not pipelined by site) each host of
   a site may send across at once, so the site link is charged for all of them. */
_DM_PRIVATE double _dm_cost_cmp_rails(const _dm_eng* lk, double steps, double b) {
    return _dm_cost_sites(lk, steps, b * lk->lay.HSmax, b);
}
_DM_PRIVATE bool _dm_pick_compressed_sites(const _dm_eng* lk, size_t count);
_DM_PRIVATE double _dm_cost_compressed(const _dm_eng* lk, size_t count, size_t esize, dm_compress mode) {
    const _dm_layout* y = &lk->lay;
    const _dm_link_cost* shm = _dm_cost_class(lk, _DM_COST_SHM);
    int R = y->Lmin, H = y->H, S = 1;
    double b = (double)count * (double)esize, n = (double)count, cb = mode == DM_COMPRESS_INT8 ? 1 : 2, host, rails;
    if (_dm_pick_compressed_sites(lk, count)) return _dm_cost_3l_compressed(lk, count, esize, mode);
    if (_dm_sch_2l_pipelined(lk, count, R, false) && H == 2) S = _dm_pick_cmp_segments(lk, count, esize, R, mode);
    host = _dm_cost(shm, 2.0 * (R - 1) * S, b / R / S);
    rails = mode == DM_COMPRESS_INT8 ? _dm_cost_cmp_rails(lk, (double)_dm_ceil_log2(H) * S, n / DM_COMPRESS_BLOCK * 4 / S) : 0;
    if (_dm_cmp_gathers(mode, H)) rails += _dm_cost_cmp_rails(lk, (double)(H - 1) * S, n * cb / S);
    else rails += _dm_cost_cmp_rails(lk, (double)(H - 1) * S, n / H * cb / S) + _dm_cost_cmp_rails(lk, (double)(H - 1) * S, n / H * 2 / S);
    return _dm_cost(shm, 2.0 * ((y->Lmax - 1) / R), b) + (S == 1 ? host + rails : (host > rails ? host : rails) + host / S);
}
_DM_PRIVATE bool _dm_pick_forced_flat(const _dm_eng* lk) {
    return lk->algo == _DM_ALGO_FLAT || lk->algo == _DM_ALGO_FLAT_RING || lk->algo == _DM_ALGO_FLAT_RD;
}
_DM_PRIVATE bool _dm_pick_forced_two_level(const _dm_eng* lk) {
    return lk->algo == _DM_ALGO_TWO_LEVEL || lk->algo == _DM_ALGO_TWO_LEVEL_RING || lk->algo == _DM_ALGO_TWO_LEVEL_RD;
}
/* True when the hosts matter: more than one, and one with more than a rank; or several sites. */
_DM_PRIVATE bool _dm_pick_multi_host(const _dm_eng* lk) { return (lk->lay.H > 1 && lk->lay.Lmax > 1) || lk->lay.NS > 1; }

/* Two-level with R = the smallest host's size rails: whether the rails all-reduce their blocks
   with a ring (else recursive doubling): the cheaper by the model, a ring only where a block
   has an element per host. */
_DM_PRIVATE bool _dm_pick_rails_ring(const _dm_eng* lk, size_t count, dm_dtype dtype) {
    const _dm_layout* y = &lk->lay;
    size_t esize = dm_dtype_size(dtype);
    if (count / (size_t)y->Lmin < (size_t)y->H) return false;
    if (lk->rails_force) return lk->rails_force == 1;
    return _dm_cost_two_level(lk, count, esize, y->Lmin, true) <= _dm_cost_two_level(lk, count, esize, y->Lmin, false);
}
/* The model's cost of all_reduce algorithm algo (one of _DM_ALGO_FLAT_RING .. _DM_ALGO_COUNT - 1)
   on count elements of dtype, in microseconds, whether or not it could run (see below). */
_DM_PRIVATE double _dm_cost_all_reduce(const _dm_eng* lk, int algo, size_t count, dm_dtype dtype) {
    size_t esize = dm_dtype_size(dtype);
    double b = (double)count * (double)esize;
    switch (algo) {
    case _DM_ALGO_FLAT_RING: return _dm_cost_flat_ring(lk, b);
    case _DM_ALGO_FLAT_RD: return _dm_cost_flat_rd(lk, b);
    case _DM_ALGO_TWO_LEVEL_RING:
        return _dm_cost_two_level(lk, count, esize, lk->lay.Lmin, _dm_pick_rails_ring(lk, count, dtype));
    case _DM_ALGO_TWO_LEVEL_RD: return _dm_cost_two_level(lk, count, esize, 1, false);
    default: return _dm_cost_three_level(lk, count, esize);            /* _DM_ALGO_THREE_LEVEL */
    }
}
/* all_reduce's algorithm for count elements of dtype: one of _DM_ALGO_FLAT_RING .. _THREE_LEVEL.
   two_level_ring: the host's ring with R = the smallest host's size rails (each rail a ring or
   recursive doubling, _dm_pick_rails_ring); two_level_rd: one rail of host leaders;
   three_level: across sites (>>three-level), where it fits. */
_DM_PRIVATE int _dm_pick_all_reduce(const _dm_eng* lk, size_t count, dm_dtype dtype) {
    const _dm_layout* y = &lk->lay;
    int W = lk->c->size, H = y->H, R = y->Lmin, k, best = -1;
    double b = (double)count * (double)dm_dtype_size(dtype), cost[_DM_ALGO_COUNT];
    bool ring_fits = count >= (size_t)W, rails_fit = count >= (size_t)R * (size_t)H;
    bool flat_ok = lk->algo != _DM_ALGO_TWO_LEVEL, two_ok = lk->algo != _DM_ALGO_FLAT;
    switch (lk->algo) {
    case _DM_ALGO_FLAT_RING: return ring_fits ? _DM_ALGO_FLAT_RING : _DM_ALGO_FLAT_RD;
    case _DM_ALGO_FLAT_RD: return _DM_ALGO_FLAT_RD;
    case _DM_ALGO_TWO_LEVEL_RING: return rails_fit ? _DM_ALGO_TWO_LEVEL_RING : _DM_ALGO_TWO_LEVEL_RD;
    case _DM_ALGO_TWO_LEVEL_RD: return _DM_ALGO_TWO_LEVEL_RD;
    case _DM_ALGO_THREE_LEVEL:                  /* where it cannot run, the two-level forms */
        return _dm_sch_3l_fits(lk, count) ? _DM_ALGO_THREE_LEVEL : rails_fit ? _DM_ALGO_TWO_LEVEL_RING : _DM_ALGO_TWO_LEVEL_RD;
    default: break;
    }
    if (!_dm_pick_multi_host(lk) && lk->algo != _DM_ALGO_TWO_LEVEL)    /* measured on one host */
        return (b <= (double)_DM_PICK_SMALL_BYTES || !ring_fits) ? _DM_ALGO_FLAT_RD : _DM_ALGO_FLAT_RING;
    for (k = 0; k < _DM_ALGO_COUNT; k++) cost[k] = 1e300;
    if (flat_ok && ring_fits) cost[_DM_ALGO_FLAT_RING] = _dm_cost_all_reduce(lk, _DM_ALGO_FLAT_RING, count, dtype);
    if (flat_ok) cost[_DM_ALGO_FLAT_RD] = _dm_cost_all_reduce(lk, _DM_ALGO_FLAT_RD, count, dtype);
    if (two_ok && rails_fit && (R > 1 || _dm_pick_rails_ring(lk, count, dtype)))  /* R = 1 with rd: two_level_rd */
        cost[_DM_ALGO_TWO_LEVEL_RING] = _dm_cost_all_reduce(lk, _DM_ALGO_TWO_LEVEL_RING, count, dtype);
    if (two_ok) cost[_DM_ALGO_TWO_LEVEL_RD] = _dm_cost_all_reduce(lk, _DM_ALGO_TWO_LEVEL_RD, count, dtype);
    if (flat_ok && two_ok && _dm_sch_3l_fits(lk, count))
        cost[_DM_ALGO_THREE_LEVEL] = _dm_cost_all_reduce(lk, _DM_ALGO_THREE_LEVEL, count, dtype);
    for (k = _DM_ALGO_FLAT_RING; k < _DM_ALGO_COUNT; k++)     /* ties: the first in this order */
        if (best < 0 || cost[k] < cost[best]) best = k;
    return best;
}
/* all_gather / reduce_scatter with blocks of b bytes: two-level (rails, then the host)? Only
   on even layouts (every host L ranks). */
_DM_PRIVATE bool _dm_pick_gather_two_level(const _dm_eng* lk, double b) {
    const _dm_layout* y = &lk->lay;
    const _dm_link_cost *cross = _dm_cost_class(lk, _DM_COST_CROSS_HOST), *shm = _dm_cost_class(lk, _DM_COST_SHM);
    double flat, two;
    if (_dm_pick_forced_flat(lk) || y->H < 2 || y->Lmin != y->Lmax || y->Lmax < 2) return false;
    if (_dm_pick_forced_two_level(lk)) return true;
    flat = _dm_cost(cross, lk->c->size - 1, b);
    two = _dm_cost(cross, y->H - 1, b * y->Lmax) + _dm_cost(shm, y->Lmax - 1, b * y->H);
    return two < flat;
}
/* A pipeline of n phases over S segments, run stage by stage (_dm_eng_run_n): in stage s phase
   k works on segment s - k, and a stage costs its slowest phase; part[k]: phase k's cost on one
   segment. S = 1: the phases one after the other. */
_DM_PRIVATE double _dm_cost_stages(const double* part, int n, int S) {
    double t = 0;
    int s, k;
    for (s = 0; s < S + n - 1; s++) {
        double most = 0;
        for (k = 0; k < n; k++)
            if (s - k >= 0 && s - k < S && part[k] > most) most = part[k];
        t += most;
    }
    return t;
}
/* Three-level all_gather / reduce_scatter with blocks of b bytes over S segments (>>three-level
   others): on each segment the cross rails' NS - 1 steps put a site's L x HS blocks' segments
   on its link (L on each host's), the site rails' HS - 1 steps L x NS on each host's link, the
   host's ring L - 1 steps of H; stage by stage (_dm_cost_stages: each segment pays every
   step's latency again, the site link's too); site: the site link's class. */
_DM_PRIVATE double _dm_cost_3l_gather_in(const _dm_eng* lk, double b, int S, const _dm_link_cost* site) {
    const _dm_layout* y = &lk->lay;
    int L = y->Lmax, HS = y->HSmin, NS = y->NS;
    double part[3];
    b /= S;
    part[0] = _dm_cost_sites_at(lk, site, NS - 1.0, b * L * HS, b * L);
    part[1] = _dm_cost(_dm_cost_class(lk, _DM_COST_CROSS_HOST), HS - 1.0, b * L * NS);
    part[2] = _dm_cost(_dm_cost_class(lk, _DM_COST_SHM), L - 1.0, b * y->H);
    return _dm_cost_stages(part, 3, S);
}
/* The segments of the three-level gathers with blocks of b bytes, the site link of class site:
   of 1, 2, 4, ... and the most allowed (a block's segment _DM_SCH_3L_GATHER_SEGMENT bytes or
   more, at most _DM_SCH_2L_SEGMENTS_MAX), the most segments the model costs within
   _DM_SCH_3L_GATHER_SLACK of the cheapest. A function of the layout, b and the class, so every
   rank cuts alike; each segment has an element (b / S >= the minimum, far above an element).
   Why the slack: near its optimum the model's costs differ by a percent or so, and what it
   leaves out falls with the segment: on 2 sites x 2 hosts x 2 (hosts 2 Gbit/s, site link 200
   Mbit/s, told: DISTMESH_SITE_LINK=100,0.2 DISTMESH_HOST_LINK=100,2, where the model costs 4, 8
   and 16 segments within 1.6%) 16 MiB all_gather took 387 ms in 4 segments, 375 in 8, 351 in
   16 (a 128 KiB segment; 1.05x the bound, TCP's headers). A latency each segment pays again
   still cuts none (the class's 5 ms on those 2 MiB blocks: two segments cost 1.4% more). */
#define _DM_SCH_3L_GATHER_SEGMENT ((size_t)128 << 10)
#define _DM_SCH_3L_GATHER_SLACK 1.01
_DM_PRIVATE int _dm_pick_3l_gather_segments_at(const _dm_eng* lk, double b, const _dm_link_cost* site) {
    double most_d = b / (double)_DM_SCH_3L_GATHER_SEGMENT, cost[32], least;
    int most = most_d >= _DM_SCH_2L_SEGMENTS_MAX ? _DM_SCH_2L_SEGMENTS_MAX : most_d < 1 ? 1 : (int)most_d;
    int seg[32], n = 0, S, j, best = 1;
    for (S = 1; n < 32; S *= 2) {             /* 1, 2, 4, ..., most */
        seg[n] = S < most ? S : most;
        cost[n] = _dm_cost_3l_gather_in(lk, b, seg[n], site);
        n++;
        if (S >= most) break;
    }
    for (least = cost[0], j = 1; j < n; j++) least = cost[j] < least ? cost[j] : least;
    for (j = 0; j < n; j++)
        if (cost[j] <= least * _DM_SCH_3L_GATHER_SLACK) best = seg[j];
    return best;
}
/* The segments the gathers run: by the site link as measured (>>site probe) where it was, else
   by the site class. Segments never change the bits (each element meets the same rings in the
   same order), so a measurement may decide them; the family (below) stays the fixed model's. */
_DM_PRIVATE int _dm_pick_3l_gather_segments(const _dm_eng* lk, double b) {
    const _dm_link_cost* site = lk->site_link.alpha_us > 0 ? &lk->site_link : _dm_cost_class(lk, _DM_COST_CROSS_SITE);
    return _dm_pick_3l_gather_segments_at(lk, b, site);
}
_DM_PRIVATE double _dm_cost_3l_gather(const _dm_eng* lk, double b) {
    const _dm_link_cost* site = _dm_cost_class(lk, _DM_COST_CROSS_SITE);
    return _dm_cost_3l_gather_in(lk, b, _dm_pick_3l_gather_segments_at(lk, b, site), site);
}
/* Three-level all_gather / reduce_scatter? On even layouts across sites (every host L ranks,
   every site HS hosts), forced by DISTMESH_ALGO=three_level, else where the model finds it
   faster than the flat ring (W - 1 steps, a block on each host and site boundary) and the
   two-level rails' ring (H - 1 steps of L blocks on each boundary, then the host's). */
_DM_PRIVATE bool _dm_pick_gather_three_level(const _dm_eng* lk, double b) {
    const _dm_layout* y = &lk->lay;
    double three, flat, two;
    if (y->NS < 2 || y->HSmin != y->HSmax || y->Lmin != y->Lmax || _dm_pick_forced_flat(lk) || _dm_pick_forced_two_level(lk))
        return false;
    if (lk->algo == _DM_ALGO_THREE_LEVEL) return true;
    three = _dm_cost_3l_gather(lk, b);
    flat = _dm_cost_sites(lk, lk->c->size - 1.0, b, b);
    two = _dm_cost_sites(lk, y->H - 1.0, b * y->Lmax, b * y->Lmax) +
          _dm_cost(_dm_cost_class(lk, _DM_COST_SHM), y->Lmax - 1.0, b * y->H);
    return three < flat && three < two;
}
/* Dissemination over n ranks (ranks NULL: every rank, identity order): in round k each signals
   the one k on (mod n); zero bytes, so a round costs the latency of its slowest class of link. */
_DM_PRIVATE double _dm_cost_dissemination(const _dm_eng* lk, const int* ranks, int n) {
    int W = lk->c->size, k, r;
    int *per_host = _dm_cost_scratch(lk), *a = per_host + 2 * W, *o = a + W;  /* counts, senders, partners */
    double t = 0;
    for (k = 1; k < n; k <<= 1) {
        for (r = 0; r < n; r++) {
            a[r] = ranks ? ranks[r] : r;
            o[r] = ranks ? ranks[(r + k) % n] : (r + k) % n;
        }
        t += _dm_cost_round(lk, a, o, n, 0, per_host);
    }
    return t;
}
_DM_PRIVATE double _dm_cost_flat_dissemination(const _dm_eng* lk) { return _dm_cost_dissemination(lk, NULL, lk->c->size); }
/* broadcast: the two-level chain (host by host) whenever there are several hosts. */
_DM_PRIVATE bool _dm_pick_broadcast_two_level(const _dm_eng* lk) { return !_dm_pick_forced_flat(lk) && lk->lay.H >= 2; }
/* and across sites the site-ordered chain (three_level_chain), unless a family is forced */
_DM_PRIVATE bool _dm_pick_broadcast_three_level(const _dm_eng* lk) {
    return lk->lay.NS > 1 && !_dm_pick_forced_flat(lk) && !_dm_pick_forced_two_level(lk);
}
_DM_PRIVATE bool _dm_pick_barrier_two_level(const _dm_eng* lk) {
    const _dm_layout* y = &lk->lay;
    if (_dm_pick_forced_flat(lk) || y->H < 2) return false;
    if (_dm_pick_forced_two_level(lk)) return true;
    if (!_dm_pick_multi_host(lk)) return false;
    return _dm_cost(_dm_cost_class(lk, _DM_COST_SHM), 2.0 * (y->Lmax - 1), 0) +
           _dm_cost(_dm_cost_class(lk, _DM_COST_CROSS_HOST), _dm_ceil_log2(y->H), 0) < _dm_cost_flat_dissemination(lk);
}
/* Three-level barrier (>>three-level others)? Across sites, forced by DISTMESH_ALGO=
   three_level, else where the model finds it faster than the flat and two-level ones, each
   dissemination costed round by round (the site link's rounds are the ones that count). */
_DM_PRIVATE bool _dm_pick_barrier_three_level(const _dm_eng* lk) {
    const _dm_layout* y = &lk->lay;
    int k, *leaders = _dm_cost_scratch(lk) + 4 * lk->c->size;
    double inside, three, two;
    if (y->NS < 2 || _dm_pick_forced_flat(lk) || _dm_pick_forced_two_level(lk)) return false;
    if (lk->algo == _DM_ALGO_THREE_LEVEL) return true;
    inside = _dm_cost(_dm_cost_class(lk, _DM_COST_SHM), 2.0 * (y->Lmax - 1), 0);
    for (k = 0; k < y->NS; k++) leaders[k] = y->members[y->start[y->site_start[k]]];
    three = inside + _dm_cost(_dm_cost_class(lk, _DM_COST_CROSS_HOST), 2.0 * (y->HSmax - 1), 0) +
            _dm_cost_dissemination(lk, leaders, y->NS);
    for (k = 0; k < y->H; k++) leaders[k] = y->members[y->start[k]];
    two = inside + _dm_cost_dissemination(lk, leaders, y->H);
    return three < two && three < _dm_cost_flat_dissemination(lk);
}

/* >>site probe  The site link's latency measured, where the links are real (TCP sets
   lk->site_probe) and DISTMESH_SITE_LINK is unset: once per group, inside its first
   three-level all_gather or reduce_scatter (every rank of the group is in that call). The
   ranks at local index 0 time _DM_SITE_PROBE_REPS recursive doublings of 8 bytes on cross rail
   0 after one that makes the links, and take the median per exchange (a rank's exchange ends
   early or late by its partner's lag, alternately, so the middle two of an even number
   average it out; the median leaves out a rank that lost its core for a while); every rank
   then takes the largest over the group (recursive doubling) and at least the cross-host
   class's latency. The measurement decides only how many segments the three-level gathers cut
   (_dm_pick_3l_gather_segments): each segment pays the site link's latency again, so at the
   class's 5 ms a 16 MiB gather cuts none, while the 200 Mbit/s link of docs/performance.md
   "Sites" (tens of us) repays 16. Segments never change the bits; which algorithm runs, and
   the all-reduce's segments, stay the fixed model's (>>choice), the same on every transport.
   Cost: about 9 site-link exchanges and log2(W) group ones, once per group. The threaded
   world, the model's front end (lk->cost) and a told DISTMESH_SITE_LINK skip it; DISTMESH_LOG=
   info prints the result. */
#define _DM_SITE_PROBE_REPS 8
_DM_PRIVATE dm_status _dm_sch_site_probe(_dm_eng* lk, const _dm_fp* fp) {
    const _dm_layout* y = &lk->lay;
    double mine = 0, v, least = _dm_cost_class(lk, _DM_COST_CROSS_HOST)->alpha_us;
    int64_t t0, took[_DM_SITE_PROBE_REPS];
    int k, j, p = 1, steps;
    _dm_team t;
    if (!lk->site_probe || lk->dry || lk->site_link.alpha_us != 0 || lk->cost || lk->link_env[1].alpha_us > 0 || y->NS < 2)
        return DM_OK;
    lk->site_link.alpha_us = -1;            /* once: a failure leaves the class's */
    if (y->local[lk->c->rank] == 0) {
        t = _dm_sch_cross_rail(lk, 0);
        while (p * 2 <= t.n) p *= 2;
        steps = _dm_ceil_log2(p) + (t.n > p ? 2 : 0);
        for (k = 0; k <= _DM_SITE_PROBE_REPS; k++) {
            v = (double)k;
            t0 = _dm_now_us();
            _DM_TRY(_dm_sch_rd_as(lk, "site probe", &t, &v, 1, DM_FLOAT64, DM_MAX, 0, fp));
            if (k > 0) took[k - 1] = _dm_now_us() - t0;
        }
        for (k = 1; k < _DM_SITE_PROBE_REPS; k++)      /* insertion sort */
            for (j = k; j > 0 && took[j - 1] > took[j]; j--) {
                int64_t x = took[j];
                took[j] = took[j - 1];
                took[j - 1] = x;
            }
        mine = (double)(took[_DM_SITE_PROBE_REPS / 2 - 1] + took[_DM_SITE_PROBE_REPS / 2]) / 2.0 / steps;
    }
    t = _dm_sch_identity(lk);
    _DM_TRY(_dm_sch_rd_as(lk, "site probe", &t, &mine, 1, DM_FLOAT64, DM_MAX, 0, fp));
    lk->site_link.alpha_us = mine > least ? mine : least;
    lk->site_link.beta_ns = _dm_cost_class(lk, _DM_COST_CROSS_SITE)->beta_ns;
    _DM_LOG(&lk->c->logger, DM_LOG_INFO, "%s: rank %d of %d: site link measured: %.1f us one way (DISTMESH_SITE_LINK "
            "unset); the three-level gathers cut their segments by it", lk->tag, lk->c->rank, lk->c->size,
            lk->site_link.alpha_us);
    return DM_OK;
}
/* The segments *S of a three-level gather of blocks of b bytes: the site link measured first
   where it is still to be (_dm_sch_site_probe, every rank of the group in this call), then
   _dm_pick_3l_gather_segments, said at DISTMESH_LOG=debug with the site link that cut them. */
_DM_PRIVATE dm_status _dm_sch_3l_gather_segments(_dm_eng* lk, const char* op, const _dm_fp* fp, double b, int* S) {
    _DM_TRY(_dm_sch_site_probe(lk, fp));
    *S = _dm_pick_3l_gather_segments(lk, b);
    if (!lk->dry)
        _DM_LOG(&lk->c->logger, DM_LOG_DEBUG, "%s: %s #%llu: three_level_ring in %d segments (the site link %s)", lk->tag, op,
                (unsigned long long)lk->c->seq, *S,
                lk->site_link.alpha_us > 0 ? "as measured" : lk->link_env[1].alpha_us > 0 ? "as told" : "of the model");
    return DM_OK;
}

/* >>entry points  The vtable slots of the backends that run the engine (TCP, the threaded
   world): they fill their tables with these (_dm_coll_<slot>), which find the group's engine in
   c->core->eng. Each runs the backend's enter step (the threaded world's meeting), checks that
   the group is not broken, settles a world of one and a count of 0, makes the fingerprint, asks
   the choice (>>choice), runs the schedules and records what ran (dm_last_algorithm).
   all_to_all, reduce's blocks to the root, gather, scatter and point-to-point meet the peers
   the caller's arguments choose, outside P (connected on demand, >>peers); with DISTMESH_CUDA
   they refuse device memory (the collectives above them have CUDA staging in TCP's table). */

_DM_PRIVATE void _dm_coll_ran(_dm_eng* lk, const char* algorithm) { lk->c->algorithm = algorithm; }
_DM_PRIVATE _dm_eng* _dm_eng_of(dm_collective* c) { return c->core->eng; }
_DM_PRIVATE dm_status _dm_eng_enter(_dm_eng* lk, int kind, size_t count, int dtype, int op, int root) {
    if (!lk->enter || lk->dry) return DM_OK;
    return lk->enter(lk, kind, count, dtype, op, root);
}
/* The calls without a CUDA staging path take host memory only. */
_DM_PRIVATE dm_status _dm_coll_host_only(dm_collective* c, const char* op, const void* a, const void* b) {
#if defined(DISTMESH_CUDA)
    if (_dm_cuda_is_device(a) || _dm_cuda_is_device(b))
        return _DM_FAIL(c, DM_ERR_UNSUPPORTED, "%s: %s takes host buffers only (device buffers: the NCCL backend)",
                        c->vt->name, op);
#else
    (void)c; (void)op; (void)a; (void)b;
#endif
    return DM_OK;
}

/* all_reduce algorithm algo on buf (this rank's data in, the result out), for every algorithm
   but the flat ring (which reads send and writes recv, and whose reduce form stops halfway):
   all_reduce and reduce run them alike. A new algorithm is one more case here. */
_DM_PRIVATE dm_status _dm_coll_all_reduce_in_place(_dm_eng* lk, int algo, void* buf, size_t count, dm_dtype dtype,
                                                   dm_reduce_op op, int divide, const _dm_fp* fp) {
    _dm_team t;
    switch (algo) {
    case _DM_ALGO_FLAT_RD:
        t = _dm_sch_identity(lk);
        return _dm_sch_rd(lk, &t, buf, count, dtype, op, divide, fp);
    case _DM_ALGO_TWO_LEVEL_RING:
        return _dm_sch_allreduce_2l(lk, buf, count, dtype, op, divide, fp, lk->lay.Lmin,
                                    _dm_pick_rails_ring(lk, count, dtype), NULL);
    case _DM_ALGO_TWO_LEVEL_RD: return _dm_sch_allreduce_2l(lk, buf, count, dtype, op, divide, fp, 1, false, NULL);
    default: return _dm_sch_allreduce_3l(lk, buf, count, dtype, op, divide, fp, NULL);   /* _DM_ALGO_THREE_LEVEL */
    }
}
/* The compression this all_reduce asks for (>>functions compression): its dm_op's mode, or
   DISTMESH_COMPRESS for a float sum or mean that names none; 0 for none. */
_DM_PRIVATE int _dm_coll_compress_mode(const _dm_eng* lk, dm_dtype dtype, dm_reduce_op op) {
    dm_compress m = lk->c->core->compress;
    if (m == DM_COMPRESS_DEFAULT)
        m = _dm_compressible_type(dtype) && (op == DM_SUM || op == DM_MEAN) ? lk->compress_env : DM_COMPRESS_NONE;
    return m == DM_COMPRESS_NONE ? 0 : (int)m;
}
/* A compressed all_reduce across sites compresses only the site link: three_level with
   compressed cross rails, where three_level fits and no family is forced. */
_DM_PRIVATE bool _dm_pick_compressed_sites(const _dm_eng* lk, size_t count) {
    return _dm_sch_3l_fits(lk, count) && !_dm_pick_forced_two_level(lk);
}
/* Whether a compressed all_reduce (mode cm) of count elements runs compressed: the two-level
   schedule with compressed rails (or three_level's across sites); false where it cannot run
   and the call is exact (see >>functions compression). */
_DM_PRIVATE bool _dm_coll_compressed_runs(const _dm_eng* lk, size_t count, int cm) {
    const _dm_layout* y = &lk->lay;
    return cm && y->H >= 2 && y->H <= 258 && !_dm_pick_forced_flat(lk) && count / (size_t)y->Lmin >= (size_t)y->H;
}
/* With the caller's state cs, the residual of every element this rank does not encode goes into
   buf before the call (the encoded ones' is added where they are encoded): all of it on a
   folded rank; across sites outside its piece (_dm_sch_3l_piece); else outside block i of R
   of each segment the two-level schedule cuts (_dm_sch_2l_cmp_segments), so a residual that a
   new cut (another dtype, layout or count) leaves on a rank that no longer encodes it is not
   held back. */
_DM_PRIVATE void _dm_coll_cmp_flush_outside(_dm_eng* lk, dm_compress_state* cs, void* buf, size_t count,
                                           dm_dtype dtype, dm_compress mode, bool sites) {
    int R = lk->lay.Lmin, i = lk->lay.local[lk->c->rank], S, s;
    size_t from = 0, off = 0, len = 0, boff, blen;
    if (sites) {
        _dm_sch_3l_piece(lk, count, &off, &len);
        _dm_cmp_flush(cs, buf, dtype, 0, off);
        _dm_cmp_flush(cs, buf, dtype, off + len, count);
        return;
    }
    S = i < R ? _dm_sch_2l_cmp_segments(lk, count, dm_dtype_size(dtype), R, mode) : 0;
    for (s = 0; s < S; s++) {
        _dm_segment(count, S, s, &off, &len);
        _dm_segment(len, R, i, &boff, &blen);
        _dm_cmp_flush(cs, buf, dtype, from, off + boff);
        from = off + boff + blen;
    }
    _dm_cmp_flush(cs, buf, dtype, from, count);
}
_DM_PRIVATE dm_status _dm_coll_all_reduce_compressed(_dm_eng* lk, void* buf, size_t count, dm_dtype dtype,
                                                     dm_reduce_op op, int divide, const _dm_fp* fp) {
    dm_compress_state* cs = lk->c->core->cstate;
    bool sites = _dm_pick_compressed_sites(lk, count);
    _dm_cmp cm;
    cm.mode = (dm_compress)fp->compress;
    cm.res = cs ? cs->residual : NULL;
    if (cs) _dm_coll_cmp_flush_outside(lk, cs, buf, count, dtype, cm.mode, sites);
    if (sites) {
        _dm_coll_ran(lk, cm.mode == DM_COMPRESS_INT8 ? "three_level_int8" : "three_level_bf16");
        return _dm_sch_allreduce_3l(lk, buf, count, dtype, op, divide, fp, &cm);
    }
    _dm_coll_ran(lk, cm.mode == DM_COMPRESS_INT8 ? "two_level_int8" : "two_level_bf16");
    return _dm_sch_allreduce_2l(lk, buf, count, dtype, op, divide, fp, lk->lay.Lmin, false, &cm);
}
_DM_PRIVATE dm_status _dm_coll_all_reduce(dm_collective* c, const void* send, void* recv, size_t count,
                                          dm_dtype dtype, dm_reduce_op op) {
    _dm_eng* lk = _dm_eng_of(c);
    size_t bytes = count * dm_dtype_size(dtype);
    int algo, divide = op == DM_MEAN ? c->size : 0, cm;
    bool compressed;
    dm_compress_state* cs = c->core->cstate;
    _dm_team t;
    _dm_fp fp;
    _DM_TRY(_dm_eng_enter(lk, _DM_K_ALL_REDUCE, count, (int)dtype, (int)op, 0));
    _DM_TRY(_dm_eng_check_broken(lk, "all_reduce"));
    if (cs && send != recv) {                   /* error feedback adds to this rank's data: in place */
        if (bytes) memcpy(recv, send, bytes);
        send = recv;
    }
    cm = _dm_coll_compress_mode(lk, dtype, op);
    compressed = cm && _dm_coll_compressed_runs(lk, count, cm);
    if (cs && !compressed) _dm_cmp_flush(cs, recv, dtype, 0, count);   /* compressed: its own flush */
    if (lk->c->size == 1) {
        if (send != recv && bytes) memcpy(recv, send, bytes);
        return DM_OK;
    }
    _dm_fp_make(&fp, lk->c, _DM_K_ALL_REDUCE, (int)dtype, (int)op, 0, count);
    fp.compress = cm;
    if (count == 0) return _dm_sch_fp_only(lk, "all_reduce", &fp);
    if (compressed) {
        if (send != recv) memcpy(recv, send, bytes);
        return _dm_coll_all_reduce_compressed(lk, recv, count, dtype, op, divide, &fp);
    }
    algo = _dm_pick_all_reduce(lk, count, dtype);
    _dm_coll_ran(lk, _dm_algo_names[algo]);
    if (algo == _DM_ALGO_FLAT_RING) {
        t = _dm_sch_flat(lk);
        if (_dm_sch_single_copy_fits(lk, bytes))
            return _dm_sch_ring_single(lk, &t, send, recv, count, dtype, op, divide, &fp);
        return _dm_sch_ring(lk, &t, send, recv, count, dtype, op, divide, &fp, _DM_SCH_RING_RS | _DM_SCH_RING_AG);
    }
    if (send != recv) memcpy(recv, send, bytes);
    return _dm_coll_all_reduce_in_place(lk, algo, recv, count, dtype, op, divide, &fp);
}

/* Reduce to root: the root gets the bits dm_all_reduce would give, by the same algorithm.
   Flat ring: its reduce-scatter steps leave the rank at ring position p holding block p fully
   reduced, which it then sends to the root. The others run the whole all-reduce (into a
   temporary where this rank's recv is not significant). */
_DM_PRIVATE dm_status _dm_coll_reduce(dm_collective* c, const void* send, void* recv, size_t count, dm_dtype dtype,
                                      dm_reduce_op op, int root) {
    _dm_eng* lk = _dm_eng_of(c);
    int W = c->size, r = c->rank, q, algo, divide = op == DM_MEAN ? W : 0;
    size_t esize = dm_dtype_size(dtype), bytes = count * esize, off, len;
    unsigned char* out = (unsigned char*)recv;
    _dm_team t;
    _dm_fp fp;
    dm_status st;
    _DM_TRY(_dm_coll_host_only(c, "reduce", send, recv));
    _DM_TRY(_dm_eng_enter(lk, _DM_K_REDUCE, count, (int)dtype, (int)op, root));
    _DM_TRY(_dm_eng_check_broken(lk, "reduce"));
    if (W == 1) {
        if (send != recv && bytes) memcpy(recv, send, bytes);
        return DM_OK;
    }
    _dm_fp_make(&fp, c, _DM_K_REDUCE, (int)dtype, (int)op, root, count);
    if (count == 0) return _dm_sch_fp_only(lk, "reduce", &fp);
    if (r != root) {
        out = (unsigned char*)_dm_malloc(&c->allocator, bytes);
        if (!out) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "%s: reduce: no memory for %zu bytes", lk->tag, bytes);
    }
    algo = _dm_pick_all_reduce(lk, count, dtype);
    _dm_coll_ran(lk, _dm_algo_names[algo]);
    if (algo != _DM_ALGO_FLAT_RING) {
        if (send != out) memcpy(out, send, bytes);
        st = _dm_coll_all_reduce_in_place(lk, algo, out, count, dtype, op, divide, &fp);
    } else {
        t = _dm_sch_flat(lk);
        st = _dm_sch_ring(lk, &t, send, out, count, dtype, op, divide, &fp, _DM_SCH_RING_RS);
        if (st == DM_OK && r != root) {        /* this rank's block to the root */
            _dm_segment(count, W, lk->slot[r], &off, &len);
            st = _dm_eng_sendrecv_on_demand(lk, "reduce", &fp, root, out + off * esize, len * esize, root, NULL, 0);
        }
        for (q = 0; q < W && st == DM_OK && r == root; q++) {   /* the root takes every other block */
            if (q == root) continue;
            _dm_segment(count, W, lk->slot[q], &off, &len);
            st = _dm_eng_sendrecv_on_demand(lk, "reduce", &fp, q, NULL, 0, q, out + off * esize, len * esize);
        }
    }
    if (out != recv) _dm_free(&c->allocator, out);
    return st;
}

/* All-gather into per-rank buffers. Flat: one ring in host order. Two-level (even layouts):
   rail i gathers its members' blocks across hosts, then each host's ring gathers the rails'
   H blocks per rank. */
_DM_PRIVATE dm_status _dm_coll_all_gather_list(_dm_eng* lk, int kind, const void* send, void* const* recvs,
                                               size_t count, dm_dtype dtype) {
    const _dm_layout* y = &lk->lay;
    int W = lk->c->size, r = lk->c->rank, p, q;
    size_t bytes = count * dm_dtype_size(dtype);
    void* small[16];
    void** pieces = small;
    _dm_team t;
    dm_status st;
    _dm_fp fp;
    _DM_TRY(_dm_eng_check_broken(lk, _dm_kind_name(kind)));
    if (recvs[r] != send && bytes) memcpy(recvs[r], send, bytes);
    if (W == 1) return DM_OK;
    _dm_fp_make(&fp, lk->c, kind, (int)dtype, -1, 0, count);
    if (count == 0) return _dm_sch_fp_only(lk, _dm_kind_name(kind), &fp);
    if (W > 16 && !(pieces = (void**)_dm_malloc(&lk->c->allocator, sizeof(void*) * (size_t)W)))
        return _DM_FAIL(lk->c, DM_ERR_OUT_OF_MEMORY, "%s: %s: out of memory", lk->tag, _dm_kind_name(kind));
    if (_dm_pick_gather_three_level(lk, (double)bytes)) {
        _dm_coll_ran(lk, "three_level_ring");
        int S = 1;
        st = _dm_sch_3l_gather_segments(lk, _dm_kind_name(kind), &fp, (double)bytes, &S);
        if (st == DM_OK) st = _dm_sch_all_gather_3l(lk, kind, recvs, pieces, count, dtype, &fp, S);
    } else if (!_dm_pick_gather_two_level(lk, (double)bytes)) {
        _dm_coll_ran(lk, "flat_ring");
        t = _dm_sch_flat(lk);
        for (p = 0; p < W; p++) pieces[p] = recvs[lk->order[p]];
        st = _dm_sch_ring_gather(lk, &t, pieces, 1, bytes, kind, dtype, &fp);
    } else {
        _dm_coll_ran(lk, "two_level_ring");
        t = _dm_sch_rail(lk, y->local[r]);
        for (q = 0; q < y->H; q++) pieces[q] = recvs[t.ranks[q]];
        st = _dm_sch_ring_gather(lk, &t, pieces, 1, bytes, kind, dtype, &fp);
        if (st == DM_OK) st = _dm_sch_all_gather_host(lk, kind, recvs, pieces, bytes, dtype, &fp);
    }
    if (pieces != small) _dm_free(&lk->c->allocator, pieces);
    return st;
}

/* The all_gather_to_list slot. */
_DM_PRIVATE dm_status _dm_coll_all_gather_to_list(dm_collective* c, const void* send, void* const* recvs, size_t count,
                                                  dm_dtype dtype) {
    _dm_eng* lk = _dm_eng_of(c);
    _DM_TRY(_dm_eng_enter(lk, _DM_K_ALL_GATHER, count, (int)dtype, -1, 0));
    return _dm_coll_all_gather_list(lk, _DM_K_ALL_GATHER, send, recvs, count, dtype);
}
/* The same into one buffer of size blocks. */
_DM_PRIVATE dm_status _dm_coll_all_gather(dm_collective* c, const void* send, void* recv, size_t count, dm_dtype dtype) {
    _dm_eng* lk = _dm_eng_of(c);
    size_t bytes = count * dm_dtype_size(dtype);
    void* small[16] = { NULL };
    void** ptrs = small;
    dm_status st;
    int j, W = lk->c->size;
    _DM_TRY(_dm_eng_enter(lk, _DM_K_ALL_GATHER, count, (int)dtype, -1, 0));
    if (W > 16) {
        ptrs = (void**)_dm_malloc(&lk->c->allocator, sizeof(void*) * (size_t)W);
        if (!ptrs) return _DM_FAIL(lk->c, DM_ERR_OUT_OF_MEMORY, "%s: all_gather: out of memory", lk->tag);
    }
    for (j = 0; j < W; j++) ptrs[j] = (unsigned char*)recv + (size_t)j * bytes;
    st = _dm_coll_all_gather_list(lk, _DM_K_ALL_GATHER, send, (void* const*)ptrs, count, dtype);
    if (ptrs != small) _dm_free(&lk->c->allocator, ptrs);
    return st;
}

/* Reduce-scatter. Flat: one ring in host order. Two-level (even layouts): each host's ring
   reduces, for local rank i, the blocks of rail i (H pieces), then rail i's ring reduces
   those across hosts, each rank ending with its own block. Three-level across sites
   (>>three-level others; tmp H + NS blocks, and two scratch chunks where it runs pipelined,
   _dm_pick_3l_gather_segments). In place (recv is input block r), the flat
   ring's intermediate sums need a block of their own. */
_DM_PRIVATE dm_status _dm_coll_reduce_scatter(dm_collective* c, const void* send, void* recv, size_t n_elems,
                                              dm_dtype dtype, dm_reduce_op op) {
    _dm_eng* lk = _dm_eng_of(c);
    const _dm_layout* y = &lk->lay;
    int W = c->size, r = c->rank, p, q, H = y->H, divide = op == DM_MEAN ? W : 0, family, S = 1;
    size_t bytes = n_elems * dm_dtype_size(dtype), tmp_blocks, tmp_bytes;
    const unsigned char* in = (const unsigned char*)send;
    unsigned char *out = (unsigned char*)recv, *tmp = NULL;
    const unsigned char* small[16];
    const unsigned char** pieces = small;
    _dm_team t;
    _dm_fp fp;
    dm_status rc = DM_OK;
    _DM_TRY(_dm_eng_check_broken(lk, "reduce_scatter"));
    if (W == 1) {
        if (out != in && bytes) memcpy(out, in, bytes);
        return DM_OK;
    }
    _dm_fp_make(&fp, c, _DM_K_REDUCE_SCATTER, (int)dtype, (int)op, 0, n_elems);
    if (n_elems == 0) return _dm_sch_fp_only(lk, "reduce_scatter", &fp);
    family = _dm_pick_gather_three_level(lk, (double)bytes) ? 3 : _dm_pick_gather_two_level(lk, (double)bytes) ? 2 : 1;
    if (family == 3) tmp_blocks = (size_t)(H + y->NS);
    else if (family == 2) tmp_blocks = (size_t)H;
    else tmp_blocks = out == in + (size_t)r * bytes && W > 2 ? 1 : 0;     /* in place */
    if (family == 3) _DM_TRY(_dm_sch_3l_gather_segments(lk, "reduce_scatter", &fp, (double)bytes, &S));
    tmp_bytes = bytes * tmp_blocks + (S > 1 ? 2 * lk->tmp_size : 0);    /* pipelined: two scratch chunks */
    if (W > 16) pieces = (const unsigned char**)_dm_malloc(&c->allocator, sizeof(void*) * (size_t)W);
    if (tmp_bytes) tmp = (unsigned char*)_dm_malloc(&c->allocator, tmp_bytes);
    if (!pieces || (tmp_bytes && !tmp)) {
        rc = _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "%s: reduce_scatter: no memory for %zu bytes", lk->tag, tmp_bytes);
        goto done;
    }
    _dm_coll_ran(lk, family == 3 ? "three_level_ring" : family == 2 ? "two_level_ring" : "flat_ring");
    if (family == 3) {
        rc = _dm_sch_reduce_scatter_3l(lk, in, pieces, out, tmp, n_elems, dtype, op, divide, &fp, S);
    } else if (family == 1) {
        t = _dm_sch_flat(lk);
        for (p = 0; p < W; p++) pieces[p] = in + (size_t)lk->order[p] * bytes;
        rc = _dm_sch_ring_rs(lk, &t, pieces, out, tmp ? tmp : out, 1, bytes, dtype, op, divide, &fp);
    } else {
        rc = _dm_sch_reduce_scatter_host(lk, in, pieces, tmp, bytes, dtype, op, &fp);
        t = _dm_sch_rail(lk, y->local[r]);
        for (q = 0; q < H; q++) pieces[q] = tmp + (size_t)q * bytes;
        if (rc == DM_OK) rc = _dm_sch_ring_rs(lk, &t, pieces, out, out, 1, bytes, dtype, op, divide, &fp);
    }
done:
    if (pieces != small) _dm_free(&c->allocator, (void*)pieces);
    _dm_free(&c->allocator, tmp);
    return rc;
}

/* Broadcast: a chain. Flat: along the host-ordered ring from the root. Two-level (several
   hosts): the root, the rest of its host, then every other host in turn, so the data crosses
   each host boundary once, whatever the root. Across sites (three_level_chain) the hosts go
   site by site (_dm_sch_chain_host), so the chain also crosses each site boundary once: in
   host order from a root that is not on its site's first host it would cross back into the
   root's site, one more site link's latency. */
_DM_PRIVATE dm_status _dm_coll_broadcast(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int root) {
    _dm_eng* lk = _dm_eng_of(c);
    _dm_layout* y = &lk->lay;
    int W = c->size, n = 0, h, j, rh = y->host_of[root];
    bool sites = _dm_pick_broadcast_three_level(lk);
    _dm_team t;
    _dm_fp fp;
    dm_status st;
    _DM_TRY(_dm_eng_enter(lk, _DM_K_BROADCAST, count, (int)dtype, -1, root));
    _DM_TRY(_dm_eng_check_broken(lk, "broadcast"));
    if (W == 1) return DM_OK;
    _dm_fp_make(&fp, c, _DM_K_BROADCAST, (int)dtype, -1, root, count);
    if (!_dm_pick_broadcast_two_level(lk)) {
        _dm_coll_ran(lk, "flat_chain");
        t = _dm_sch_flat(lk);
        return _dm_sch_chain(lk, &t, lk->slot[root], buf, count * dm_dtype_size(dtype), dtype, &fp);
    }
    _dm_coll_ran(lk, sites ? "three_level_chain" : "two_level_chain");
    y->team[n++] = root;
    for (h = 0; h < y->H; h++) {
        int hh = sites ? _dm_sch_chain_host(y, rh, h) : (rh + h) % y->H;
        for (j = y->start[hh]; j < y->start[hh + 1]; j++)
            if (y->members[j] != root) y->team[n++] = y->members[j];
    }
    for (j = 0; j < W && y->team[j] != c->rank; j++) {}
    t = _dm_team_of(y->team, W, j);
    /* where the chain enters and leaves the root's host depends on the root: only root 0's
       chain is in P (>>peers); another root's extra pairs connect on demand */
    lk->on_demand = root != 0;
    st = _dm_sch_chain(lk, &t, 0, buf, count * dm_dtype_size(dtype), dtype, &fp);
    lk->on_demand = false;
    return st;
}

/* Barrier. Flat: dissemination over every rank. Two-level: every rank tells its host's
   leader, the leaders disseminate, each leader releases its host. Three-level across sites
   (>>three-level others). */
_DM_PRIVATE dm_status _dm_coll_barrier(dm_collective* c) {
    _dm_eng* lk = _dm_eng_of(c);
    const _dm_layout* y = &lk->lay;
    int h = y->host_of[c->rank], L = _dm_sch_host_size(lk, h), q;
    const int* host = y->members + y->start[h];
    _dm_team t;
    _dm_fp arrive, release;
    _DM_TRY(_dm_eng_enter(lk, _DM_K_BARRIER, 0, -1, -1, -1));
    _DM_TRY(_dm_eng_check_broken(lk, "barrier"));
    if (_dm_pick_barrier_three_level(lk)) {
        _dm_coll_ran(lk, "three_level_dissemination");
        return _dm_sch_barrier_3l(lk);
    }
    if (!_dm_pick_barrier_two_level(lk)) {
        _dm_coll_ran(lk, "flat_dissemination");
        t = _dm_sch_identity(lk);
        return _dm_sch_dissemination(lk, &t, 0);
    }
    _dm_coll_ran(lk, "two_level_dissemination");
    _dm_fp_make(&arrive, c, _DM_K_BARRIER, -1, -1, _DM_BARRIER_ROUND_ARRIVE, 0);
    _dm_fp_make(&release, c, _DM_K_BARRIER, -1, -1, _DM_BARRIER_ROUND_RELEASE, 0);
    if (y->local[c->rank] > 0) return _dm_sch_arrive_wait(lk, &arrive, &release, host[0]);
    _DM_TRY(_dm_sch_gather_arrivals(lk, &arrive, host + 1, L - 1));
    for (q = 0; q < y->H; q++) lk->lay.team[q] = y->members[y->start[q]];
    t = _dm_team_of(lk->lay.team, y->H, h);
    _DM_TRY(_dm_sch_dissemination(lk, &t, 0));
    return _dm_sch_send_releases(lk, &release, host + 1, L - 1);
}

/* All-to-all, pairwise: step k sends the block for rank + k and receives the block of rank - k.
   Each block's fingerprint describes its pair both ways: count = the elements sent, root = the
   elements the sender expects back (folded to 32 bits), so the receiver compares both with its
   own counts and either direction's disagreement fails both ranks of the pair. In place (send
   NULL), the outgoing blocks are copied out of recv first. */
_DM_PRIVATE int _dm_fold32(size_t v) { return (int)(uint32_t)((uint64_t)v ^ ((uint64_t)v >> 32)); }
_DM_PRIVATE dm_status _dm_coll_all_to_all_v(dm_collective* c, const void* send, const size_t* sc, const size_t* so,
                                            void* recv, const size_t* rc, const size_t* ro, dm_dtype dtype) {
    _dm_eng* lk = _dm_eng_of(c);
    int W = c->size, r = c->rank, k;
    size_t esize = dm_dtype_size(dtype);
    const unsigned char* in = (const unsigned char*)send;
    unsigned char *out = (unsigned char*)recv, *copy = NULL;
    dm_status st = DM_OK;
    _DM_TRY(_dm_coll_host_only(c, "all_to_all", send, recv));
    _DM_TRY(_dm_eng_enter(lk, _DM_K_ALL_TO_ALL, 0, (int)dtype, -1, 0));
    _DM_TRY(_dm_eng_check_broken(lk, "all_to_all"));
    if (!in) {
        _DM_TRY(_dm_a2a_copy_out(c, out, sc, so, esize, &copy));
        in = copy;
    }
    if (sc[r]) memcpy(out + ro[r] * esize, in + so[r] * esize, sc[r] * esize);
    for (k = 1; k < W && st == DM_OK; k++) {
        int to = (r + k) % W, from = (r - k + W) % W;
        _dm_fp mine, expect;
        _dm_fp_make(&mine, c, _DM_K_ALL_TO_ALL, (int)dtype, -1, _dm_fold32(rc[to]), sc[to]);
        _dm_fp_make(&expect, c, _DM_K_ALL_TO_ALL, (int)dtype, -1, _dm_fold32(sc[from]), rc[from]);
        lk->on_demand = true;
        st = _dm_eng_exchange(lk, "all_to_all", &mine, &expect, to, in + so[to] * esize, sc[to] * esize, from,
                              out + ro[from] * esize, rc[from] * esize, false, DM_UINT8, DM_SUM);
        lk->on_demand = false;
    }
    _dm_free(&c->allocator, copy);
    return st;
}

/* Gather and scatter: the root meets every other rank in turn, rank order; each pair trades
   fingerprints both ways, so both sides check the other's arguments. */
_DM_PRIVATE dm_status _dm_coll_rooted(_dm_eng* lk, int kind, const void* send, void* recv, size_t count, dm_dtype dtype,
                                      int root) {
    dm_collective* c = lk->c;
    int W = c->size, r = c->rank, q;
    size_t bytes = count * dm_dtype_size(dtype);
    const char* name = _dm_kind_name(kind);
    bool gather = kind == _DM_K_GATHER;
    _dm_fp fp;
    _DM_TRY(_dm_eng_check_broken(lk, name));
    if (r == root) {
        unsigned char* mine = gather ? (unsigned char*)recv + (size_t)r * bytes : (unsigned char*)recv;
        const unsigned char* src = gather ? (const unsigned char*)send : (const unsigned char*)send + (size_t)r * bytes;
        if (mine != src && bytes) memcpy(mine, src, bytes);
    }
    if (W == 1) return DM_OK;
    _dm_fp_make(&fp, c, kind, (int)dtype, -1, root, count);
    if (r != root) {
        if (gather) return _dm_eng_sendrecv_on_demand(lk, name, &fp, root, send, bytes, root, NULL, 0);
        return _dm_eng_sendrecv_on_demand(lk, name, &fp, root, NULL, 0, root, recv, bytes);
    }
    for (q = 0; q < W; q++) {
        if (q == root) continue;
        if (gather)
            _DM_TRY(_dm_eng_sendrecv_on_demand(lk, name, &fp, q, NULL, 0, q, (unsigned char*)recv + (size_t)q * bytes,
                                               bytes));
        else
            _DM_TRY(_dm_eng_sendrecv_on_demand(lk, name, &fp, q, (const unsigned char*)send + (size_t)q * bytes, bytes,
                                               q, NULL, 0));
    }
    return DM_OK;
}
/* The gather and scatter slots. */
_DM_PRIVATE dm_status _dm_coll_rooted_slot(dm_collective* c, int kind, const void* send, void* recv, size_t count,
                                           dm_dtype dtype, int root) {
    _dm_eng* lk = _dm_eng_of(c);
    _DM_TRY(_dm_coll_host_only(c, _dm_kind_name(kind), send, recv));
    _DM_TRY(_dm_eng_enter(lk, kind, count, (int)dtype, -1, root));
    return _dm_coll_rooted(lk, kind, send, recv, count, dtype, root);
}
_DM_PRIVATE dm_status _dm_coll_gather(dm_collective* c, const void* send, void* recv, size_t count, dm_dtype dtype,
                                      int root) {
    return _dm_coll_rooted_slot(c, _DM_K_GATHER, send, recv, count, dtype, root);
}
_DM_PRIVATE dm_status _dm_coll_scatter(dm_collective* c, const void* send, void* recv, size_t count, dm_dtype dtype,
                                       int root) {
    return _dm_coll_rooted_slot(c, _DM_K_SCATTER, send, recv, count, dtype, root);
}

/* A point-to-point message: its header (a fingerprint of kind send), then the payload. While
   the link to peer is full, what peer sends this way is read (into the inbox), so two ranks
   sending each other large messages at once both finish. */
#define _DM_P2P_SMALL 1024     /* payloads up to this travel in one step with their header */
_DM_PRIVATE dm_status _dm_coll_send(dm_collective* c, const void* buf, size_t count, dm_dtype dtype, int peer, int tag) {
    _dm_eng* lk = _dm_eng_of(c);
    _dm_sstep ss[2];
    unsigned char hdr[32 + _DM_P2P_SMALL];
    size_t bytes = count * dm_dtype_size(dtype);
    _dm_fp fp;
    _DM_ZERO(_dm_xfer, x);
    _DM_TRY(_dm_coll_host_only(c, "send", buf, NULL));
    _DM_TRY(_dm_eng_check_broken(lk, "send"));
    _dm_fp_make(&fp, lk->c, _DM_K_SEND, (int)dtype, -1, tag, count);
    fp.seq = lk->sent[peer]++;
    _dm_fp_encode(&fp, hdr);
    memset(ss, 0, sizeof(ss));
    ss[0].buf = hdr; ss[0].len = 32; ss[0].gate = -1;
    ss[1].buf = (const unsigned char*)buf; ss[1].len = bytes; ss[1].gate = -1;
    /* a small payload joins its header: one publish instead of two, the same bytes on the wire
       (the header is a multiple of 8, so the padding after the payload does not change) */
    if (bytes <= _DM_P2P_SMALL) {
        if (bytes) memcpy(hdr + 32, buf, bytes);
        ss[0].len = 32 + bytes;
        ss[1].len = 0;
    }
    x.op = "send"; x.speer = peer; x.rpeer = peer; x.ss = ss; x.ns = 2; x.nr = 0;
    x.dtype = DM_UINT8; x.rop = DM_SUM; x.inbox = true;
    return _dm_eng_run_on_demand(lk, &x);
}
/* The first message from peer with this tag: already kept (unexpected), or read as it comes. */
_DM_PRIVATE dm_status _dm_coll_recv(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int peer, int tag) {
    _dm_eng* lk = _dm_eng_of(c);
    _dm_want w;
    _DM_ZERO(_dm_xfer, x);
    _DM_TRY(_dm_coll_host_only(c, "recv", buf, NULL));
    _DM_TRY(_dm_eng_check_broken(lk, "recv"));
    w.tag = tag; w.dtype = dtype; w.count = count; w.buf = (unsigned char*)buf; w.done = false;
    w.any = false; w.from = -1;
    x.op = "recv"; x.speer = -1; x.rpeer = peer; x.ns = 0; x.nr = 0;
    x.dtype = DM_UINT8; x.rop = DM_SUM; x.inbox = true; x.want = &w;
    _DM_TRY(_dm_eng_take_unexpected(lk, &x, peer));
    if (w.done) return DM_OK;
    return _dm_eng_run_on_demand(lk, &x);
}
/* From any source: the first kept (unexpected) message with this tag, in the order this rank
   read them; else every connected peer's inbox is read in turn (rank order each round) until
   the header of one with the tag is in, and that message fills buf. *source: its sender. */
_DM_PRIVATE dm_status _dm_coll_recv_any(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int tag,
                                        int* source) {
    _dm_eng* lk = _dm_eng_of(c);
    _dm_want w;
    _DM_ZERO(_dm_xfer, x);
    if (source) *source = -1;
    _DM_TRY(_dm_coll_host_only(c, "recv", buf, NULL));
    _DM_TRY(_dm_eng_check_broken(lk, "recv"));
    w.tag = tag; w.dtype = dtype; w.count = count; w.buf = (unsigned char*)buf; w.done = false;
    w.any = true; w.from = -1;
    x.op = "recv"; x.speer = -1; x.rpeer = -1; x.ns = 0; x.nr = 0;
    x.dtype = DM_UINT8; x.rop = DM_SUM; x.inbox = true; x.want = &w;
    _DM_TRY(_dm_eng_take_unexpected(lk, &x, -1));
    if (!w.done) _DM_TRY(_dm_eng_run_on_demand(lk, &x));
    if (source) *source = w.from;
    return DM_OK;
}

_DM_COLD_BEGIN
/* >>peers  P, the peers this rank's fixed-peer schedules use on the group's layout: every
   rank of its host (shared memory), then what every all_reduce algorithm (flat ring and rd,
   two-level with Lmin rails, their rails once as rings and once as recursive doubling
   (rails_force: the count decides between them at run time), and with the leaders' rail;
   flat rd's and the rings' partners do not depend on the count), all_gather, reduce_scatter and
   barrier in every family (three-level across sites) and broadcast from root 0 touch, each run dry (_dm_eng_run records
   the peers of each transfer and moves nothing), so P follows the schedules as they are
   written. Every rank runs the same schedules, so P is symmetric: q is in P(r) exactly when r
   is in P(q). Not in it: what the caller's arguments choose (point-to-point, all_to_all,
   gather, scatter, reduce's blocks to the root, and where a two-level broadcast chain from
   another root enters and leaves its host: one host's last rank would otherwise pair with
   every rank of the next host): a backend connects those on demand (_dm_eng.connect). A new
   all_reduce algorithm is run here as it is (every _DM_ALGO_* from _DM_ALGO_FLAT_RING on); a
   schedule of another collective, or a choice inside one that its algorithm does not fix (as
   the rails' above), must be run here by hand; the threaded world checks every transfer
   outside on_demand against P (_dm_eng_check_peer), so the layout tests fail if it is not.
   in: size entries, set for the peers (never self). */
_DM_PRIVATE dm_status _dm_peers_find(_dm_eng* lk, bool* in) {
    static const int fam[3] = { _DM_ALGO_FLAT, _DM_ALGO_TWO_LEVEL, _DM_ALGO_THREE_LEVEL };
    dm_collective* c = lk->c;
    const _dm_layout* y = &lk->lay;
    int W = c->size, saved_algo = lk->algo, k;
    const char* saved_name = c->algorithm;
    unsigned char* buf = (unsigned char*)_dm_calloc(&c->allocator, 4 * (size_t)W);
    dm_status st = DM_OK;
    memset(in, 0, sizeof(bool) * (size_t)W);
    for (k = y->start[y->host_of[c->rank]]; k < y->start[y->host_of[c->rank] + 1]; k++) in[y->members[k]] = true;
    if (W == 1 || lk->broken != DM_OK) { _dm_free(&c->allocator, buf); in[c->rank] = false; return DM_OK; }
    if (!buf) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "%s: out of memory", lk->tag);
    lk->dry = true;
    lk->used = in;
    /* every all_reduce algorithm (W elements: every ring and rail fits), then two_level_ring
       again with its rails forced each way (ring, then rd: the count decides at run time) */
    for (k = _DM_ALGO_FLAT_RING; k < _DM_ALGO_COUNT + 2 && st == DM_OK; k++) {
        lk->algo = k < _DM_ALGO_COUNT ? k : _DM_ALGO_TWO_LEVEL_RING;
        lk->rails_force = k < _DM_ALGO_COUNT ? 0 : k - _DM_ALGO_COUNT + 1;
        st = _dm_coll_all_reduce(c, buf, buf, (size_t)W, DM_UINT8, DM_SUM);
    }
    lk->rails_force = 0;
    for (k = 0; k < (y->NS > 1 ? 3 : 2) && st == DM_OK; k++) {    /* three-level across sites */
        lk->algo = fam[k];
        st = _dm_coll_all_gather(c, buf, buf + W, 1, DM_UINT8);
        if (st == DM_OK) st = _dm_coll_reduce_scatter(c, buf, buf + 2 * W, 1, DM_UINT8, DM_SUM);
        if (st == DM_OK) st = _dm_coll_barrier(c);
        if (st == DM_OK) st = _dm_coll_broadcast(c, buf, 1, DM_UINT8, 0);
    }
    lk->dry = false;
    lk->used = NULL;
    lk->algo = saved_algo;
    c->algorithm = saved_name;
    in[c->rank] = false;
    _dm_free(&c->allocator, buf);
    return st;
}
/* Computes P into lk->peers: from then on a fixed-peer transfer outside it fails (the
   threaded world's check). */
_DM_PRIVATE dm_status _dm_peers_keep(_dm_eng* lk) {
    if (!lk->peers) lk->peers = (bool*)_dm_calloc(&lk->c->allocator, sizeof(bool) * (size_t)lk->c->size);
    if (!lk->peers) return _DM_FAIL(lk->c, DM_ERR_OUT_OF_MEMORY, "%s: out of memory", lk->tag);
    return _dm_peers_find(lk, lk->peers);
}

_DM_COLD_END
_DM_WARM_END
#endif /* DISTMESH_IMPL_INCLUDED && !DISTMESH_SCHEDULES_IMPL_INCLUDED */

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
