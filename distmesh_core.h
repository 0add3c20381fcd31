/* distmesh_core.h -- distmesh's core calls. MIT license at end of file.

   Do not include this file yourself: it is part of distmesh.h's implementation, which includes
   it after the kernels and the trace (distmesh.h >>layers).

   WHAT IT HOLDS  What every dm_* call does before and after a backend's slot, and the objects
   built on the calls: the base struct's init, the wrappers' checks, a call turned into a dm_op,
   the object collectives, one checked operation run (sequence number, trace, slot or fallback),
   the request queue and its progress thread, the public calls, dm_destroy, the Fake backend,
   groups (dm_local, main_process_first), the mesh, the strategy, and dm_init without a
   transport. Together with distmesh.h (the API, status, config, environment, the core's state)
   it is the core.

   WHAT IT MAY CALL  distmesh.h, the kernels (the Fake's reductions, compression) and the trace's
   hooks. It reaches the engine, the schedules and the backends only through the vtable
   (c->vt), never by name: a backend is a layer above that fills the table.

   SECTIONS  Each opens with a comment that starts ">>tag" (search for it); in file order:
     the object and its calls
       >>collective base         the base struct's init, host identities (TCP, NCCL), blob lists
       >>validation              the wrappers' checks, fallbacks of missing slots
       >>public collectives      arguments into a dm_op (_dm_prep_*)
       >>objects                 the object collectives over the vtable
       >>run                     one checked operation: sequence number, slot or fallback
       >>requests                _async calls, the progress thread, dm_wait / dm_test
       >>public calls            dm_barrier ... dm_recv, dm_split, dm_shrink, dm_grow
       >>destroy                 dm_destroy, dm_set_timeout
     on top of the calls
       >>fake                    the Fake backend (world of one, simulated world of N)
       >>groups                  dm_local, sub-collectives of a known size, main_process_first
       >>mesh                    dm_mesh
       >>strategy                dm_strategy
       >>init                    dm_init without the TCP backend */
#ifndef DISTMESH_H
#error "distmesh_core.h is part of distmesh.h's implementation: include distmesh.h"
#endif

#if defined(DISTMESH_IMPL_INCLUDED) && !defined(DISTMESH_CORE_IMPL_INCLUDED)
#define DISTMESH_CORE_IMPL_INCLUDED
_DM_WARM_BEGIN
_DM_COLD_BEGIN
/* >>collective base */
_DM_PRIVATE void _dm_collective_init(dm_collective* c, _dm_core* core, const dm_collective_vtable* vt,
                                     int rank, int size, int timeout_ms, const dm_logger* logger,
                                     const dm_allocator* allocator) {
    c->vt = vt;
    c->core = core;
    c->rank = rank;
    c->size = size;
    c->local_rank = rank;
    c->local_size = size;
    c->device.type = DM_DEVICE_CPU;
    c->device.index = 0;
    c->timeout_ms = _dm_timeout_logged(timeout_ms, logger);
    c->seq = 0;
    if (logger) c->logger = *logger;
    if (allocator) c->allocator = *allocator;
    c->local = NULL;
    if (gethostname(c->node_name, sizeof(c->node_name) - 1) != 0) _dm_copy_name(c->node_name, 64, "localhost");
    c->node_name[sizeof(c->node_name) - 1] = 0;
    c->last_error[0] = 0;
    memset(core, 0, sizeof(*core));
    core->trace = _dm_trace_wanted(logger);
    core->max_object_bytes = _dm_cfg_bytes_logged(_DM_CFG_MAX_OBJECT_BYTES, logger);
    c->shrink_needs_exclude = false;
}

/* Which ranks share a host, for the backends that gather every member's host identity (TCP,
   NCCL): the host name and the kernel's boot id, or DISTMESH_TEST_HOST_ID (tests and benchmarks
   simulate hosts with it) -- never the launcher's LOCAL_WORLD_SIZE, which sub-groups break.
   name gets what dm_local groups by (node_name); id the identity (id_cap >= 96). */
_DM_PRIVATE void _dm_host_identity(char* name, size_t name_cap, char* id, size_t id_cap) {
    const char* test = _dm_cfg_raw(_DM_CFG_TEST_HOST_ID);
    char boot[64] = "";
    FILE* f;
    memset(name, 0, name_cap);
    memset(id, 0, id_cap);
    if (test) {
        _dm_copy_name(name, name_cap, test);
        snprintf(id, id_cap, "test:%s", test);
        return;
    }
    if (gethostname(name, name_cap - 1) != 0) _dm_copy_name(name, name_cap, "localhost");
    name[name_cap - 1] = 0;
    if ((f = fopen("/proc/sys/kernel/random/boot_id", "r")) != NULL) {
        if (!fgets(boot, sizeof(boot), f)) boot[0] = 0;
        fclose(f);
        boot[strcspn(boot, "\n")] = 0;
    }
    snprintf(id, id_cap, "%.54s/%.39s", name, boot);     /* a boot id is 36 bytes */
}
/* Orders host identities, equal ones by their address: records lie in rank order, so the first
   of equal identities is the lowest rank. */
_DM_PRIVATE int _dm_id_order(const void* a, const void* b) {
    const char* x = *(const char* const*)a;
    const char* y = *(const char* const*)b;
    int c = strcmp(x, y);
    return c ? c : (x < y ? -1 : x > y);
}
/* W records of `stride` bytes, each holding a NUL-terminated host identity at its start: host_of[j]
   (if not NULL) is the lowest rank on rank j's host, and *local_rank / *local_size are rank me's
   place on its host (ranks in order). Sorted, not compared pair by pair: O(W log W) at setup
   (a world of one rank per host made every pair meet). False when out of memory. */
_DM_PRIVATE bool _dm_hosts_from_ids(const dm_allocator* a, const unsigned char* ids, size_t stride, int W, int me,
                                    int* host_of, int* local_rank, int* local_size) {
    const char** by = (const char**)_dm_malloc(a, sizeof(*by) * (size_t)(W > 0 ? W : 1));
    int i, e, j;
    *local_rank = *local_size = 0;
    if (!by) return false;
    for (j = 0; j < W; j++) by[j] = (const char*)ids + (size_t)j * stride;
    qsort(by, (size_t)W, sizeof(*by), _dm_id_order);
    for (i = 0; i < W; i = e) {       /* each run of equal identities is a host */
        int first = (int)((size_t)((const unsigned char*)by[i] - ids) / stride), at = -1;
        for (e = i; e < W && strcmp(by[e], by[i]) == 0; e++) {
            j = (int)((size_t)((const unsigned char*)by[e] - ids) / stride);
            if (host_of) host_of[j] = first;
            if (j == me) at = e - i;
        }
        if (at >= 0) {
            *local_rank = at;
            *local_size = e - i;
        }
    }
    _dm_free(a, by);
    return true;
}

/* One block: the item array, then the bytes of every item back to back (so the bytes of a
   broadcast_objects result can travel as one buffer). */
_DM_PRIVATE dm_status _dm_blob_list_alloc(const dm_allocator* a, const size_t* sizes, size_t count,
                                          dm_blob_list* out) {
    size_t i, total = count * sizeof(dm_blob);
    unsigned char* block;
    out->items = NULL;
    out->count = 0;
    if (count > SIZE_MAX / sizeof(dm_blob)) return DM_ERR_OUT_OF_MEMORY;
    for (i = 0; i < count; i++) {
        if (sizes[i] > SIZE_MAX - total) return DM_ERR_OUT_OF_MEMORY;
        total += sizes[i];
    }
    block = (unsigned char*)_dm_malloc(a, total);
    if (!block) return DM_ERR_OUT_OF_MEMORY;
    out->items = (dm_blob*)(void*)block;
    out->count = count;
    total = count * sizeof(dm_blob);
    for (i = 0; i < count; i++) {
        out->items[i].data = block + total;
        out->items[i].size = sizes[i];
        total += sizes[i];
    }
    return DM_OK;
}

_DM_COLD_END
/* >>validation  The wrappers check everything a backend would otherwise trust. */

_DM_PRIVATE dm_status _dm_check_type(dm_collective* c, const char* op_name, dm_dtype dtype) {
    if ((unsigned)dtype >= DM_DTYPE_COUNT)
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: invalid dtype %d", op_name, (int)dtype);
    return DM_OK;
}
_DM_PRIVATE dm_status _dm_check_op(dm_collective* c, const char* op_name, dm_reduce_op op) {
    if ((unsigned)op >= DM_REDUCE_OP_COUNT)
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: invalid reduce op %d", op_name, (int)op);
    return DM_OK;
}
/* Bytes of count elements times blocks, or a failure if that overflows size_t. */
_DM_PRIVATE dm_status _dm_check_bytes(dm_collective* c, const char* op_name, size_t count,
                                      dm_dtype dtype, size_t blocks, size_t* out) {
    size_t esize = dm_dtype_size(dtype);
    if (blocks == 0) blocks = 1;
    if (count > SIZE_MAX / esize / blocks)
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: count %zu x %zu x %zu bytes overflows size_t",
                        op_name, count, blocks, esize);
    *out = count * esize * blocks;
    return DM_OK;
}
_DM_PRIVATE dm_status _dm_check_buffer(dm_collective* c, const char* op_name, const char* what,
                                       const void* p, size_t bytes) {
    if (!p && bytes > 0)
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: %s buffer is NULL", op_name, what);
    return DM_OK;
}
/* Two ranges either do not overlap or the small one sits exactly at the expected offset. */
_DM_PRIVATE bool _dm_layout_ok(const void* big, size_t big_bytes, const void* small,
                               size_t small_bytes, size_t expected_offset) {
    uintptr_t b = (uintptr_t)big, s = (uintptr_t)small;
    if (small_bytes == 0 || big_bytes == 0) return true;
    if (s + small_bytes <= b || b + big_bytes <= s) return true;
    return s == b + expected_offset;
}
_DM_PRIVATE dm_status _dm_begin(dm_collective* c, const char* op_name) {
    (void)op_name;
    _dm_errbuf(c)[0] = 0;
    /* atomic because dm_sequence may read it on another thread; a load and a store, not a
       locked add (a full barrier on x86), because one thread at a time runs an operation
       (_dm_submit's busy flag, the async queue) and only that thread counts */
    __atomic_store_n(&c->seq, __atomic_load_n(&c->seq, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
    return DM_OK;
}

/* all_gather through all_gather_to_list: one pointer per rank into recv. */
_DM_PRIVATE dm_status _dm_all_gather_via_list(dm_collective* c, const void* send, void* recv,
                                              size_t count, dm_dtype dtype) {
    size_t block = count * dm_dtype_size(dtype);
    void** ptrs = (void**)_dm_malloc(&c->allocator, sizeof(void*) * (size_t)c->size);
    dm_status st;
    int r;
    if (!ptrs) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "all_gather: no memory for %d pointers", c->size);
    for (r = 0; r < c->size; r++) ptrs[r] = (unsigned char*)recv + (size_t)r * block;
    st = c->vt->all_gather_to_list(c, send, (void* const*)ptrs, count, dtype);
    _dm_free(&c->allocator, ptrs);
    return st;
}
/* all_gather_to_list through all_gather: into a temporary of world x count, then copied out. */
_DM_PRIVATE dm_status _dm_all_gather_list_via_block(dm_collective* c, const void* send,
                                                    void* const* recvs, size_t count, dm_dtype dtype) {
    size_t block = count * dm_dtype_size(dtype);
    unsigned char* tmp = (unsigned char*)_dm_malloc(&c->allocator, block * (size_t)c->size);
    dm_status st;
    int r;
    if (!tmp) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "all_gather_to_list: no memory for %zu bytes",
                              block * (size_t)c->size);
    st = c->vt->all_gather(c, send, tmp, count, dtype);
    if (st == DM_OK)
        for (r = 0; r < c->size; r++)
            if (recvs[r] != tmp + (size_t)r * block) memmove(recvs[r], tmp + (size_t)r * block, block);
    _dm_free(&c->allocator, tmp);
    return st;
}

/* >>public collectives  Each call is checked (_dm_prep_*: arguments into a dm_op, failures
   before anything is queued or sent), then submitted (>>requests): run on the caller's thread,
   or queued for the progress thread by the _async twins. */
_DM_PRIVATE dm_status _dm_check_root(dm_collective* c, const char* name, int root) {
    if (root < 0 || root >= c->size)
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: root %d is not a rank of this %d-rank collective%s",
                        name, root, c->size, c->size == 1 ? " (only rank 0 exists)" : "");
    return DM_OK;
}
_DM_PRIVATE dm_status _dm_check_slot(dm_collective* c, const char* name, bool has) {
    if (!has) return _DM_FAIL(c, DM_ERR_UNSUPPORTED, "%s: backend %s has no %s", name, c->vt->name, name);
    return DM_OK;
}
_DM_PRIVATE void _dm_op_init(dm_op* o, dm_op_kind kind, dm_dtype dtype) {
    memset(o, 0, sizeof(*o));
    o->kind = kind;
    o->dtype = dtype;
}

_DM_PRIVATE dm_status _dm_prep_all_reduce(dm_collective* c, const void* send, void* recv, size_t count,
                                          dm_dtype dtype, dm_reduce_op op, dm_op* o) {
    static const char* name = "all_reduce";
    size_t bytes = 0;
    _DM_TRY(_dm_check_type(c, name, dtype));
    _DM_TRY(_dm_check_op(c, name, op));
    _DM_TRY(_dm_check_bytes(c, name, count, dtype, 1, &bytes));
    _DM_TRY(_dm_check_buffer(c, name, "recv", recv, bytes));
    if (!send) send = recv;
    if (!_dm_layout_ok(recv, bytes, send, bytes, 0))
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: send and recv overlap partially", name);
    _DM_TRY(_dm_check_slot(c, name, _DM_VT_HAS(c->vt, all_reduce)));
    _dm_op_init(o, DM_OP_ALL_REDUCE, dtype);
    o->send = send; o->recv = recv; o->count = count; o->op = op;
    return DM_OK;
}

/* dm_all_reduce_compressed's checks: dm_all_reduce's, then the mode against the dtype and the
   op, and the state's count (>>functions compression). */
_DM_PRIVATE dm_status _dm_prep_all_reduce_compressed(dm_collective* c, const void* send, void* recv, size_t count,
                                                     dm_dtype dtype, dm_reduce_op op, dm_compress mode,
                                                     dm_compress_state* state, dm_op* o) {
    static const char* name = "all_reduce";
    _DM_TRY(_dm_prep_all_reduce(c, send, recv, count, dtype, op, o));
    if ((unsigned)mode >= DM_COMPRESS_COUNT)
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: compression mode %d is not a dm_compress", name, (int)mode);
    if (mode == DM_COMPRESS_BF16 || mode == DM_COMPRESS_INT8) {
        if (!_dm_compressible_type(dtype))
            return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: compression %s takes float32, bfloat16 or float16, not %s",
                            name, dm_compress_name(mode), dm_dtype_name(dtype));
        if (op != DM_SUM && op != DM_MEAN)
            return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: compression %s takes sum or mean, not %s", name,
                            dm_compress_name(mode), dm_reduce_op_name(op));
    }
    if (state && state->count != count)
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: the compression state holds %zu elements, the call %zu", name,
                        state->count, count);
    if (state && !_dm_compressible_type(dtype))
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: a compression state takes float32, bfloat16 or float16, not %s",
                        name, dm_dtype_name(dtype));
    o->compress = mode;
    o->compress_state = state;
    return DM_OK;
}

_DM_PRIVATE dm_status _dm_prep_all_gather(dm_collective* c, const void* send, void* recv, size_t count,
                                          dm_dtype dtype, dm_op* o) {
    static const char* name = "all_gather";
    size_t bytes = 0, total = 0;
    _DM_TRY(_dm_check_type(c, name, dtype));
    _DM_TRY(_dm_check_bytes(c, name, count, dtype, 1, &bytes));
    _DM_TRY(_dm_check_bytes(c, name, count, dtype, (size_t)c->size, &total));
    _DM_TRY(_dm_check_buffer(c, name, "recv", recv, total));
    if (!send) send = (unsigned char*)recv + (size_t)c->rank * bytes;
    if (!_dm_layout_ok(recv, total, send, bytes, (size_t)c->rank * bytes))
        return _DM_FAIL(c, DM_ERR_INVALID_ARG,
                        "%s: send overlaps recv but is not at recv + rank * count (in-place layout)", name);
    _DM_TRY(_dm_check_slot(c, name, _DM_VT_HAS(c->vt, all_gather) || _DM_VT_HAS(c->vt, all_gather_to_list)));
    _dm_op_init(o, DM_OP_ALL_GATHER, dtype);
    o->send = send; o->recv = recv; o->count = count;
    return DM_OK;
}

_DM_PRIVATE dm_status _dm_prep_all_gather_to_list(dm_collective* c, const void* send, void* const* recvs,
                                                  size_t count, dm_dtype dtype, dm_op* o) {
    static const char* name = "all_gather_to_list";
    size_t bytes = 0;
    int r, q;
    _DM_TRY(_dm_check_type(c, name, dtype));
    _DM_TRY(_dm_check_bytes(c, name, count, dtype, (size_t)c->size, &bytes));
    bytes /= (size_t)c->size;
    if (!recvs) return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: recvs is NULL", name);
    for (r = 0; r < c->size; r++) {
        if (!recvs[r] && bytes)
            return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: recvs[%d] is NULL", name, r);
        for (q = 0; q < r && bytes; q++)
            if (!_dm_layout_ok(recvs[q], bytes, recvs[r], bytes, SIZE_MAX))
                return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: recvs[%d] and recvs[%d] overlap", name, q, r);
    }
    if (!send) send = recvs[c->rank];
    for (r = 0; r < c->size; r++)
        if (!_dm_layout_ok(recvs[r], bytes, send, bytes, r == c->rank ? 0 : SIZE_MAX))
            return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: send overlaps recvs[%d]", name, r);
    _DM_TRY(_dm_check_slot(c, "all_gather", _DM_VT_HAS(c->vt, all_gather) || _DM_VT_HAS(c->vt, all_gather_to_list)));
    _dm_op_init(o, DM_OP_ALL_GATHER_TO_LIST, dtype);
    o->send = send; o->recvs = recvs; o->count = count;
    return DM_OK;
}

_DM_PRIVATE dm_status _dm_prep_reduce_scatter(dm_collective* c, const void* send, void* recv, size_t recv_count,
                                              dm_dtype dtype, dm_reduce_op op, dm_op* o) {
    static const char* name = "reduce_scatter";
    size_t bytes = 0, total = 0;
    _DM_TRY(_dm_check_type(c, name, dtype));
    _DM_TRY(_dm_check_op(c, name, op));
    _DM_TRY(_dm_check_bytes(c, name, recv_count, dtype, 1, &bytes));
    _DM_TRY(_dm_check_bytes(c, name, recv_count, dtype, (size_t)c->size, &total));
    _DM_TRY(_dm_check_buffer(c, name, "recv", recv, bytes));
    _DM_TRY(_dm_check_buffer(c, name, "send", send, total));
    if (!send) send = recv; /* only reachable with zero bytes */
    if (!_dm_layout_ok(send, total, recv, bytes, (size_t)c->rank * bytes))
        return _DM_FAIL(c, DM_ERR_INVALID_ARG,
                        "%s: recv overlaps send but is not at send + rank * recv_count (in-place layout)", name);
    _DM_TRY(_dm_check_slot(c, name, _DM_VT_HAS(c->vt, reduce_scatter)));
    _dm_op_init(o, DM_OP_REDUCE_SCATTER, dtype);
    o->send = send; o->recv = recv; o->count = recv_count; o->op = op;
    return DM_OK;
}

_DM_PRIVATE dm_status _dm_prep_broadcast(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int root,
                                         dm_op* o) {
    static const char* name = "broadcast";
    size_t bytes = 0;
    _DM_TRY(_dm_check_type(c, name, dtype));
    _DM_TRY(_dm_check_bytes(c, name, count, dtype, 1, &bytes));
    _DM_TRY(_dm_check_buffer(c, name, "buf", buf, bytes));
    _DM_TRY(_dm_check_root(c, name, root));
    _DM_TRY(_dm_check_slot(c, name, _DM_VT_HAS(c->vt, broadcast)));
    _dm_op_init(o, DM_OP_BROADCAST, dtype);
    o->recv = buf; o->send = buf; o->count = count; o->root = root;
    return DM_OK;
}

/* reduce: send (count) everywhere, recv (count) at the root only. */
_DM_PRIVATE dm_status _dm_prep_reduce(dm_collective* c, const void* send, void* recv, size_t count, dm_dtype dtype,
                                      dm_reduce_op op, int root, dm_op* o) {
    static const char* name = "reduce";
    size_t bytes = 0;
    bool at_root;
    _DM_TRY(_dm_check_type(c, name, dtype));
    _DM_TRY(_dm_check_op(c, name, op));
    _DM_TRY(_dm_check_root(c, name, root));
    _DM_TRY(_dm_check_bytes(c, name, count, dtype, 1, &bytes));
    at_root = c->rank == root;
    if (at_root) _DM_TRY(_dm_check_buffer(c, name, "recv (at the root)", recv, bytes));
    if (!send) {
        if (!at_root) return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: send is NULL on rank %d (in place only at the root)", name, c->rank);
        send = recv;
    }
    _DM_TRY(_dm_check_buffer(c, name, "send", send, bytes));
    if (at_root && !_dm_layout_ok(recv, bytes, send, bytes, 0))
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: send and recv overlap partially", name);
    _DM_TRY(_dm_check_slot(c, name, _DM_VT_HAS(c->vt, reduce) || _DM_VT_HAS(c->vt, all_reduce)));
    _dm_op_init(o, DM_OP_REDUCE, dtype);
    o->send = send; o->recv = at_root ? recv : NULL; o->count = count; o->op = op; o->root = root;
    return DM_OK;
}

/* gather (send: count everywhere, recv: size * count at the root) and scatter (the mirror):
   the root's whole buffer and everyone's part; in place, the part is the root's own block. */
_DM_PRIVATE dm_status _dm_prep_rooted(dm_collective* c, bool gather, const void* send, void* recv, size_t count,
                                      dm_dtype dtype, int root, dm_op* o) {
    const char* name = gather ? "gather" : "scatter";
    const char *whole_name = gather ? "recv" : "send", *part_name = gather ? "send" : "recv";
    unsigned char* whole = (unsigned char*)(uintptr_t)(gather ? recv : send);
    const void* part = gather ? send : recv;
    size_t bytes = 0, total = 0;
    bool at_root = c->rank == root;
    _DM_TRY(_dm_check_type(c, name, dtype));
    _DM_TRY(_dm_check_root(c, name, root));
    _DM_TRY(_dm_check_bytes(c, name, count, dtype, 1, &bytes));
    _DM_TRY(_dm_check_bytes(c, name, count, dtype, (size_t)c->size, &total));
    if (at_root) {
        if (!whole && total)
            return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: %s buffer is NULL at the root", name, whole_name);
        if (!part) part = whole + (size_t)root * bytes;
        if (!_dm_layout_ok(whole, total, part, bytes, (size_t)root * bytes))
            return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: %s overlaps %s but is not at %s + root * count (in-place "
                            "layout)", name, part_name, whole_name, whole_name);
    }
    _DM_TRY(_dm_check_buffer(c, name, part_name, part, bytes));
    _DM_TRY(_dm_check_slot(c, name, gather ? _DM_VT_HAS(c->vt, gather) || _DM_VT_HAS(c->vt, all_gather) ||
                                                 _DM_VT_HAS(c->vt, all_gather_to_list)
                                           : _DM_VT_HAS(c->vt, scatter) || _DM_VT_HAS(c->vt, broadcast)));
    _dm_op_init(o, gather ? DM_OP_GATHER : DM_OP_SCATTER, dtype);
    o->send = gather ? part : (at_root ? whole : NULL);
    o->recv = gather ? (at_root ? whole : NULL) : (void*)(uintptr_t)part;
    o->count = count; o->root = root;
    return DM_OK;
}

/* The bytes one side of all_to_all_v spans (the largest offset + count), checking that the
   blocks do not overlap each other and that nothing overflows. */
_DM_PRIVATE dm_status _dm_a2a_span(dm_collective* c, const char* side, const size_t* counts, const size_t* offs,
                                   size_t esize, size_t* span) {
    static const char* name = "all_to_all_v";
    int i, j, W = c->size;
    *span = 0;
    if (!counts || !offs) return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: %s counts or offsets are NULL", name, side);
    for (i = 0; i < W; i++) {
        if (counts[i] > SIZE_MAX / esize || offs[i] > SIZE_MAX / esize - counts[i])
            return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: %s block %d (offset %zu, count %zu) overflows size_t",
                            name, side, i, offs[i], counts[i]);
        if ((offs[i] + counts[i]) * esize > *span) *span = (offs[i] + counts[i]) * esize;
        for (j = 0; j < i; j++)
            if (counts[i] && counts[j] && offs[i] < offs[j] + counts[j] && offs[j] < offs[i] + counts[i])
                return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: %s blocks %d and %d overlap", name, side, j, i);
    }
    return DM_OK;
}
_DM_PRIVATE dm_status _dm_prep_all_to_all_v(dm_collective* c, const void* send, const size_t* send_counts,
                                            const size_t* send_offsets, void* recv, const size_t* recv_counts,
                                            const size_t* recv_offsets, dm_dtype dtype, dm_op* o) {
    static const char* name = "all_to_all_v";
    size_t sspan = 0, rspan = 0;
    _DM_TRY(_dm_check_type(c, name, dtype));
    _DM_TRY(_dm_a2a_span(c, "recv", recv_counts, recv_offsets, dm_dtype_size(dtype), &rspan));
    _DM_TRY(_dm_check_buffer(c, name, "recv", recv, rspan));
    if (send) {
        _DM_TRY(_dm_a2a_span(c, "send", send_counts, send_offsets, dm_dtype_size(dtype), &sspan));
        _DM_TRY(_dm_check_buffer(c, name, "send", send, sspan));
        if (send != recv && !_dm_layout_ok(recv, rspan, send, sspan, SIZE_MAX))
            return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: send and recv overlap (pass send NULL for in place)", name);
    } else {
        send_counts = send_counts ? send_counts : recv_counts;      /* in place: recv's blocks go out */
        send_offsets = send_offsets ? send_offsets : recv_offsets;
        _DM_TRY(_dm_a2a_span(c, "send", send_counts, send_offsets, dm_dtype_size(dtype), &sspan));
        if (sspan > rspan) return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: in place, the send blocks reach beyond recv", name);
    }
    _DM_TRY(_dm_check_slot(c, name, _DM_VT_HAS(c->vt, all_to_all_v) || _DM_VT_HAS(c->vt, send)));
    _dm_op_init(o, DM_OP_ALL_TO_ALL_V, dtype);
    o->send = send; o->recv = recv;
    o->send_counts = send_counts; o->send_offsets = send_offsets;
    o->recv_counts = recv_counts; o->recv_offsets = recv_offsets;
    return DM_OK;
}
/* all_to_all: the uniform case (counts and offsets made at run time). */
_DM_PRIVATE dm_status _dm_prep_all_to_all(dm_collective* c, const void* send, void* recv, size_t count,
                                          dm_dtype dtype, dm_op* o) {
    static const char* name = "all_to_all";
    size_t total = 0;
    _DM_TRY(_dm_check_type(c, name, dtype));
    _DM_TRY(_dm_check_bytes(c, name, count, dtype, (size_t)c->size, &total));
    _DM_TRY(_dm_check_buffer(c, name, "recv", recv, total));
    if (send == recv) send = NULL;
    if (send) _DM_TRY(_dm_check_buffer(c, name, "send", send, total));
    if (send && !_dm_layout_ok(recv, total, send, total, SIZE_MAX))
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: send and recv overlap partially", name);
    _DM_TRY(_dm_check_slot(c, name, _DM_VT_HAS(c->vt, all_to_all_v) || _DM_VT_HAS(c->vt, send)));
    _dm_op_init(o, DM_OP_ALL_TO_ALL, dtype);
    o->send = send; o->recv = recv; o->count = count;
    return DM_OK;
}

/* A recv from any source (its buffer checked by the caller): the tag, a peer to hear from, the
   backend's slot. */
_DM_PRIVATE dm_status _dm_prep_recv_any(dm_collective* c, const void* buf, size_t count, dm_dtype dtype, int tag,
                                        dm_op* o) {
    if (tag < 0) return _DM_FAIL(c, DM_ERR_INVALID_ARG, "recv: tag %d is negative", tag);
    if (c->size == 1)
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "recv: from any source in a 1-rank collective (no other rank can send)");
    if (!_DM_VT_HAS(c->vt, recv_any))
        return _DM_FAIL(c, DM_ERR_UNSUPPORTED, "recv: the %s backend cannot receive from any source (%s)",
                        c->vt->name, strcmp(c->vt->name, "nccl") == 0 ? "NCCL matches a receive to one named peer"
                                                                     : "name the peer");
    _dm_op_init(o, DM_OP_RECV, dtype);
    o->recv = (void*)(uintptr_t)buf;
    o->count = count; o->root = DM_ANY_SOURCE; o->tag = tag;
    return DM_OK;
}
_DM_PRIVATE dm_status _dm_prep_p2p(dm_collective* c, bool sending, const void* buf, size_t count, dm_dtype dtype,
                                   int peer, int tag, dm_op* o) {
    const char* name = sending ? "send" : "recv";
    size_t bytes = 0;
    _DM_TRY(_dm_check_type(c, name, dtype));
    _DM_TRY(_dm_check_bytes(c, name, count, dtype, 1, &bytes));
    _DM_TRY(_dm_check_buffer(c, name, "buf", buf, bytes));
    if (peer == DM_ANY_SOURCE && !sending) return _dm_prep_recv_any(c, buf, count, dtype, tag, o);
    if (peer < 0 || peer >= c->size)
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: peer %d is not a rank of this %d-rank collective", name, peer, c->size);
    if (peer == c->rank)
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: peer %d is this rank (a rank cannot %s itself)", name, peer,
                        sending ? "send to" : "receive from");
    if (tag < 0) return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: tag %d is negative", name, tag);
    _DM_TRY(_dm_check_slot(c, name, sending ? _DM_VT_HAS(c->vt, send) : _DM_VT_HAS(c->vt, recv)));
    _dm_op_init(o, sending ? DM_OP_SEND : DM_OP_RECV, dtype);
    if (sending) o->send = buf; else o->recv = (void*)(uintptr_t)buf;
    o->count = count; o->root = peer; o->tag = tag;
    return DM_OK;
}

_DM_PRIVATE dm_status _dm_prep_gather_objects(dm_collective* c, const void* data, size_t size, dm_blob_list* out,
                                              dm_op* o) {
    static const char* name = "all_gather_objects";
    if (!out) return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: out is NULL", name);
    out->items = NULL;
    out->count = 0;
    if (size == 0) return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: object size is 0 (objects must hold bytes)", name);
    if (!data) return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: data is NULL", name);
    _dm_op_init(o, DM_OP_ALL_GATHER_OBJECTS, DM_UINT8);
    o->send = data; o->count = size; o->out_list = out;
    return DM_OK;
}
_DM_PRIVATE dm_status _dm_prep_broadcast_objects(dm_collective* c, const dm_blob* objects, size_t count, int root,
                                                 dm_blob_list* out, dm_op* o) {
    static const char* name = "broadcast_objects";
    size_t i;
    if (!out) return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: out is NULL", name);
    out->items = NULL;
    out->count = 0;
    _DM_TRY(_dm_check_root(c, name, root));
    if (c->rank == root) {
        if (!objects && count > 0) return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: objects is NULL", name);
        for (i = 0; i < count; i++) {
            if (objects[i].size == 0)
                return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: object %zu has size 0", name, i);
            if (!objects[i].data)
                return _DM_FAIL(c, DM_ERR_INVALID_ARG, "%s: object %zu has NULL data", name, i);
        }
    }
    _dm_op_init(o, DM_OP_BROADCAST_OBJECTS, DM_UINT8);
    o->objects = objects; o->count = count; o->root = root; o->out_list = out;
    return DM_OK;
}
/* >>objects  Sizes first (uint64 per rank), then the bytes padded to the largest object. */
/* The most bytes one object collective takes from its peers' word: DISTMESH_MAX_OBJECT_BYTES,
   read when c was made (>>config registry). */
_DM_PRIVATE uint64_t _dm_object_limit(const dm_collective* c) { return c->core->max_object_bytes; }
_DM_COLD_BEGIN
_DM_PRIVATE dm_status _dm_run_gather_objects(dm_collective* c, const void* data, size_t size, dm_blob_list* out) {
    static const char* name = "all_gather_objects";
    uint64_t* sizes64 = NULL;
    size_t* sizes = NULL;
    unsigned char *mine = NULL, *all = NULL;
    size_t max = 0, n, i;
    dm_status st;
    n = (size_t)c->size;
    sizes64 = (uint64_t*)_dm_malloc(&c->allocator, n * sizeof(uint64_t));
    sizes = (size_t*)_dm_malloc(&c->allocator, n * sizeof(size_t));
    if (!sizes64 || !sizes) { st = _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "%s: no memory", name); goto done; }
    sizes64[c->rank] = (uint64_t)size;
    st = dm_all_gather(c, NULL, sizes64, 1, DM_UINT64);
    if (st != DM_OK) goto done;
    if (sizes64[c->rank] != (uint64_t)size) {
        st = _DM_FAIL(c, DM_ERR_PROTOCOL, "%s: the gathered sizes give this rank %llu bytes, not its %zu",
                      name, (unsigned long long)sizes64[c->rank], size);
        goto done;
    }
    for (i = 0; i < n; i++) {   /* checked before any allocation: the padded total is max * n */
        uint64_t limit = _dm_object_limit(c);
        if (sizes64[i] == 0 || sizes64[i] > limit / n || sizes64[i] > (uint64_t)(SIZE_MAX / 2 / n)) {
            st = _DM_FAIL(c, DM_ERR_PROTOCOL, "%s: rank %zu announced an object of %llu bytes (0, or %d "
                          "objects of that size exceed DISTMESH_MAX_OBJECT_BYTES = %llu)", name, i,
                          (unsigned long long)sizes64[i], c->size, (unsigned long long)limit);
            goto done;
        }
        sizes[i] = (size_t)sizes64[i];
        if (sizes[i] > max) max = sizes[i];
    }
    mine = (unsigned char*)_dm_calloc(&c->allocator, max);
    all = (unsigned char*)_dm_malloc(&c->allocator, max * n);
    if (!mine || !all) { st = _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "%s: no memory for %zu bytes", name, max * n); goto done; }
    memcpy(mine, data, size);
    st = dm_all_gather(c, mine, all, max, DM_UINT8);
    if (st != DM_OK) goto done;
    if (_dm_blob_list_alloc(&c->allocator, sizes, n, out) != DM_OK) {
        st = _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "%s: no memory for the result", name);
        goto done;
    }
    for (i = 0; i < n; i++) memcpy((void*)out->items[i].data, all + i * max, sizes[i]);
done:
    _dm_free(&c->allocator, sizes64);
    _dm_free(&c->allocator, sizes);
    _dm_free(&c->allocator, mine);
    _dm_free(&c->allocator, all);
    return st;
}

/* Root announces the count, then the sizes; every rank allocates the result and the bytes
   travel in one broadcast straight into it. */
_DM_PRIVATE dm_status _dm_run_broadcast_objects(dm_collective* c, const dm_blob* objects, size_t count, int root,
                                                dm_blob_list* out) {
    static const char* name = "broadcast_objects";
    uint64_t n64 = 0;
    uint64_t* sizes64 = NULL;
    size_t* sizes = NULL;
    size_t i, n, total = 0;
    dm_status st;
    if (c->rank == root) n64 = (uint64_t)count;
    _DM_TRY(dm_broadcast(c, &n64, 1, DM_UINT64, root));
    /* every object costs its bytes plus 16 + sizeof(dm_blob) of bookkeeping: bound the count
       by the limit before the size arrays are allocated */
    if (n64 > _dm_object_limit(c) / (16 + sizeof(dm_blob) + 1) || n64 > (uint64_t)(SIZE_MAX / 16) ||
        (c->rank == root && n64 != (uint64_t)count))
        return _DM_FAIL(c, DM_ERR_PROTOCOL, "%s: root announced %llu objects (above what "
                        "DISTMESH_MAX_OBJECT_BYTES = %llu allows)", name, (unsigned long long)n64,
                        (unsigned long long)_dm_object_limit(c));
    n = (size_t)n64;
    sizes64 = (uint64_t*)_dm_calloc(&c->allocator, (n ? n : 1) * sizeof(uint64_t));
    sizes = (size_t*)_dm_calloc(&c->allocator, (n ? n : 1) * sizeof(size_t));
    if (!sizes64 || !sizes) { st = _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "%s: no memory", name); goto done; }
    if (c->rank == root) for (i = 0; i < n; i++) sizes64[i] = (uint64_t)objects[i].size;
    st = dm_broadcast(c, sizes64, n, DM_UINT64, root);
    if (st != DM_OK) goto done;
    for (i = 0; i < n; i++) {
        uint64_t limit = _dm_object_limit(c);
        if (sizes64[i] == 0 || sizes64[i] > (uint64_t)(SIZE_MAX / 2) - total || sizes64[i] > limit - total ||
            (c->rank == root && sizes64[i] != (uint64_t)objects[i].size)) {
            st = _DM_FAIL(c, DM_ERR_PROTOCOL, "%s: root announced object %zu of %llu bytes (0, or "
                          "the objects exceed DISTMESH_MAX_OBJECT_BYTES = %llu)",
                          name, i, (unsigned long long)sizes64[i], (unsigned long long)limit);
            goto done;
        }
        sizes[i] = (size_t)sizes64[i];
        total += sizes[i];
    }
    if (_dm_blob_list_alloc(&c->allocator, sizes, n, out) != DM_OK) {
        st = _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "%s: no memory for %zu bytes", name, total);
        goto done;
    }
    if (c->rank == root)
        for (i = 0; i < n; i++) memcpy((void*)out->items[i].data, objects[i].data, sizes[i]);
    if (n > 0) st = dm_broadcast(c, (void*)out->items[0].data, total, DM_UINT8, root);
    if (st != DM_OK) dm_blob_list_free(c, out);
done:
    _dm_free(&c->allocator, sizes64);
    _dm_free(&c->allocator, sizes);
    return st;
}


_DM_COLD_END
/* >>run  One checked operation, on whichever thread runs it: the sequence number (collectives
   only: point-to-point calls do not count), then the backend's slot or the core's fallback. */

/* As an operation starts: a collective counts in dm_sequence and clears the error buffer; a
   point-to-point call only clears it; an object collective counts through the collectives it
   makes. */
_DM_PRIVATE void _dm_op_begin(dm_collective* c, const dm_op* o) {
    if (o->kind == DM_OP_ALL_GATHER_OBJECTS || o->kind == DM_OP_BROADCAST_OBJECTS) return;
    if (o->kind == DM_OP_SEND || o->kind == DM_OP_RECV) _dm_errbuf(c)[0] = 0;
    else _dm_begin(c, _dm_op_name(o->kind));
}

_DM_PRIVATE dm_status _dm_run_barrier(dm_collective* c) {
    uint8_t token = 0;
    if (_DM_VT_HAS(c->vt, barrier)) return c->vt->barrier(c);
    /* a one-byte all-reduce cannot complete before every rank has entered it */
    return c->vt->all_reduce(c, &token, &token, 1, DM_UINT8, DM_MAX);
}

/* Fallbacks through the collectives every backend has, with temporaries where a rank's
   buffer is not significant (MPI's rule: recv at the root only). */
_DM_PRIVATE dm_status _dm_reduce_via_all_reduce(dm_collective* c, const dm_op* o) {
    size_t bytes = o->count * dm_dtype_size(o->dtype);
    void* out = o->recv ? o->recv : _dm_malloc(&c->allocator, bytes);
    dm_status st;
    if (!out) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "reduce: no memory for %zu bytes", bytes);
    st = c->vt->all_reduce(c, o->send, out, o->count, o->dtype, o->op);
    if (out != o->recv) _dm_free(&c->allocator, out);
    return st;
}
_DM_PRIVATE dm_status _dm_gather_via_all_gather(dm_collective* c, const dm_op* o) {
    size_t bytes = o->count * dm_dtype_size(o->dtype), total = bytes * (size_t)c->size;
    unsigned char* out = o->recv ? (unsigned char*)o->recv : (unsigned char*)_dm_malloc(&c->allocator, total);
    dm_status st;
    if (!out) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "gather: no memory for %zu bytes", total);
    st = _DM_VT_HAS(c->vt, all_gather) ? c->vt->all_gather(c, o->send, out, o->count, o->dtype)
                                        : _dm_all_gather_via_list(c, o->send, out, o->count, o->dtype);
    if (out != o->recv) _dm_free(&c->allocator, out);
    return st;
}
_DM_PRIVATE dm_status _dm_scatter_via_broadcast(dm_collective* c, const dm_op* o) {
    size_t bytes = o->count * dm_dtype_size(o->dtype), total = bytes * (size_t)c->size;
    unsigned char* all = o->send ? (unsigned char*)(uintptr_t)o->send : (unsigned char*)_dm_malloc(&c->allocator, total);
    dm_status st;
    if (!all) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "scatter: no memory for %zu bytes", total);
    st = c->vt->broadcast(c, all, o->count * (size_t)c->size, o->dtype, o->root);  /* the root's bytes are only read */
    if (st == DM_OK && all + (size_t)c->rank * bytes != o->recv) memmove(o->recv, all + (size_t)c->rank * bytes, bytes);
    if (all != o->send) _dm_free(&c->allocator, all);
    return st;
}
/* all_to_all_v through send and recv: step k sends to rank + k and receives from rank - k
   (sends do not wait for their receiver, so no step can deadlock). Tag -1: never a user's. */
_DM_PRIVATE dm_status _dm_a2a_via_p2p(dm_collective* c, const unsigned char* send, const size_t* sc, const size_t* so,
                                      unsigned char* recv, const size_t* rc, const size_t* ro, dm_dtype dtype) {
    size_t esize = dm_dtype_size(dtype);
    int k, W = c->size, r = c->rank;
    for (k = 1; k < W; k++) {
        int to = (r + k) % W, from = (r - k + W) % W;
        _DM_TRY(c->vt->send(c, send + so[to] * esize, sc[to], dtype, to, -1));
        _DM_TRY(c->vt->recv(c, recv + ro[from] * esize, rc[from], dtype, from, -1));
    }
    return DM_OK;
}
/* In place: the outgoing blocks (the span of sc/so in recv) copied out before recv is
   written. *copy is the caller's to free. */
_DM_PRIVATE dm_status _dm_a2a_copy_out(dm_collective* c, const void* recv, const size_t* sc, const size_t* so,
                                       size_t esize, unsigned char** copy) {
    size_t span = 0;
    int j;
    for (j = 0; j < c->size; j++)
        if ((so[j] + sc[j]) * esize > span) span = (so[j] + sc[j]) * esize;
    *copy = (unsigned char*)_dm_malloc(&c->allocator, span);
    if (!*copy) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "all_to_all: no memory for %zu bytes", span);
    if (span) memcpy(*copy, recv, span);
    return DM_OK;
}
/* A backend's slot gets send NULL for in place and copies this rank's own block itself (it
   may be device memory); the fallback through send and recv copies the outgoing blocks out of
   recv first. */
_DM_PRIVATE dm_status _dm_run_all_to_all_v(dm_collective* c, const void* send, const size_t* sc, const size_t* so,
                                           void* recv, const size_t* rc, const size_t* ro, dm_dtype dtype) {
    size_t esize = dm_dtype_size(dtype);
    unsigned char* copy = NULL;
    dm_status st;
    if (sc[c->rank] != rc[c->rank])
        return _DM_FAIL(c, DM_ERR_MISMATCH, "all_to_all_v: rank %d sends itself %zu elements but expects %zu",
                        c->rank, sc[c->rank], rc[c->rank]);
    if (_DM_VT_HAS(c->vt, all_to_all_v)) return c->vt->all_to_all_v(c, send, sc, so, recv, rc, ro, dtype);
    if (!send) {
        _DM_TRY(_dm_a2a_copy_out(c, recv, sc, so, esize, &copy));
        send = copy;
    }
    st = _dm_a2a_via_p2p(c, (const unsigned char*)send, sc, so, (unsigned char*)recv, rc, ro, dtype);
    if (st == DM_OK && sc[c->rank])
        memcpy((unsigned char*)recv + ro[c->rank] * esize, (const unsigned char*)send + so[c->rank] * esize,
               sc[c->rank] * esize);
    _dm_free(&c->allocator, copy);
    return st;
}
_DM_PRIVATE dm_status _dm_run_all_to_all(dm_collective* c, const dm_op* o) {
    size_t W = (size_t)c->size, j;
    size_t* a = (size_t*)_dm_malloc(&c->allocator, 2 * W * sizeof(size_t));
    dm_status st;
    if (!a) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "all_to_all: out of memory");
    for (j = 0; j < W; j++) { a[j] = o->count; a[W + j] = j * o->count; }
    st = _dm_run_all_to_all_v(c, o->send, a, a + W, o->recv, a, a + W, o->dtype);
    _dm_free(&c->allocator, a);
    return st;
}

/* A compressed all_reduce (or one with a state): the mode and state ride in the core for the
   slot (>>core state). Backends without the engine (Fake) run it exact, the state's residual
   added first; NCCL takes none. */
_DM_PRIVATE dm_status _dm_run_all_reduce_compressed(dm_collective* c, const dm_op* o) {
    dm_status st;
    if (strcmp(c->vt->name, "nccl") == 0)
        return _DM_FAIL(c, DM_ERR_UNSUPPORTED, "all_reduce: the nccl backend has no compression (mode %s)",
                        dm_compress_name(o->compress));
    if (!c->core->eng) {
        if (o->send != o->recv) memcpy(o->recv, o->send, o->count * dm_dtype_size(o->dtype));
        if (o->compress_state) _dm_cmp_flush(o->compress_state, o->recv, o->dtype, 0, o->count);
        return c->vt->all_reduce(c, o->recv, o->recv, o->count, o->dtype, o->op);
    }
    c->core->compress = o->compress;
    c->core->cstate = o->compress_state;
    st = c->vt->all_reduce(c, o->send, o->recv, o->count, o->dtype, o->op);
    c->core->compress = DM_COMPRESS_DEFAULT;
    c->core->cstate = NULL;
    return st;
}

/* The operation itself; _dm_op_run below adds the flight recorder and timeline when on. */
_DM_PRIVATE dm_status _dm_op_dispatch(dm_collective* c, const dm_op* o) {
    const dm_collective_vtable* vt = c->vt;
    _dm_op_begin(c, o);
    switch (o->kind) {
        case DM_OP_BARRIER: return _dm_run_barrier(c);
        case DM_OP_ALL_REDUCE:
            if (o->compress || o->compress_state) return _dm_run_all_reduce_compressed(c, o);
            return vt->all_reduce(c, o->send, o->recv, o->count, o->dtype, o->op);
        case DM_OP_ALL_GATHER:
            if (_DM_VT_HAS(vt, all_gather)) return vt->all_gather(c, o->send, o->recv, o->count, o->dtype);
            return _dm_all_gather_via_list(c, o->send, o->recv, o->count, o->dtype);
        case DM_OP_ALL_GATHER_TO_LIST:
            if (_DM_VT_HAS(vt, all_gather_to_list)) return vt->all_gather_to_list(c, o->send, o->recvs, o->count, o->dtype);
            return _dm_all_gather_list_via_block(c, o->send, o->recvs, o->count, o->dtype);
        case DM_OP_REDUCE_SCATTER: return vt->reduce_scatter(c, o->send, o->recv, o->count, o->dtype, o->op);
        case DM_OP_BROADCAST: return vt->broadcast(c, o->recv, o->count, o->dtype, o->root);
        case DM_OP_ALL_GATHER_OBJECTS: return _dm_run_gather_objects(c, o->send, o->count, o->out_list);
        case DM_OP_BROADCAST_OBJECTS: return _dm_run_broadcast_objects(c, o->objects, o->count, o->root, o->out_list);
        case DM_OP_REDUCE:
            if (_DM_VT_HAS(vt, reduce)) return vt->reduce(c, o->send, o->recv, o->count, o->dtype, o->op, o->root);
            return _dm_reduce_via_all_reduce(c, o);
        case DM_OP_GATHER:
            if (_DM_VT_HAS(vt, gather)) return vt->gather(c, o->send, o->recv, o->count, o->dtype, o->root);
            return _dm_gather_via_all_gather(c, o);
        case DM_OP_SCATTER:
            if (_DM_VT_HAS(vt, scatter)) return vt->scatter(c, o->send, o->recv, o->count, o->dtype, o->root);
            return _dm_scatter_via_broadcast(c, o);
        case DM_OP_ALL_TO_ALL: return _dm_run_all_to_all(c, o);
        case DM_OP_ALL_TO_ALL_V:
            return _dm_run_all_to_all_v(c, o->send, o->send_counts, o->send_offsets, o->recv, o->recv_counts,
                                        o->recv_offsets, o->dtype);
        case DM_OP_SEND: return vt->send(c, o->send, o->count, o->dtype, o->root, o->tag);
        case DM_OP_RECV:
            if (o->root == DM_ANY_SOURCE) return vt->recv_any(c, o->recv, o->count, o->dtype, o->tag, o->source);
            return vt->recv(c, o->recv, o->count, o->dtype, o->root, o->tag);
        case DM_OP_SPLIT: return vt->split(c, o->color, o->key, o->split_out);
    }
    return _DM_FAIL(c, DM_ERR_INTERNAL, "unknown operation kind %d", (int)o->kind);
}
/* Inlined into its two callers (a blocking call, the progress thread): one frame less on every
   operation's way down. */
_DM_PRIVATE _DM_ALWAYS_INLINE dm_status _dm_op_run(dm_collective* c, const dm_op* o) {
    if (__builtin_expect(_DM_TRACED(c) != NULL, 0)) {
        if (!_dm_trace_op_begin(c, o)) return _dm_trace_op_run_full(c, o, _dm_op_dispatch);
        return _dm_trace_op_end(c, o, _dm_op_dispatch(c, o));
    }
    return _dm_op_dispatch(c, o);
}

/* >>requests  Non-blocking calls. A request is one queued dm_op. The collective's progress
   thread (started by the first _async call) runs queued requests one at a time and marks them
   done in issue order; backends with a device stream (start and finish slots) queue them there
   instead. The queue (head .. tail) holds every request not yet done, in issue order, each
   queued, running or ran (ran: its result is in, an earlier one is not done yet); done ones
   leave it from the head (_dm_async_settle). The next to run (_dm_async_pick) is the head,
   except in a run of point-to-point requests (send and recv) at the head: there sends go
   first, then receives in issue order. A send is eager (it returns once its bytes are handed
   to the link, and reads what peers send meanwhile), so a rank that posted a recv before its
   send still sends, and two ranks that both did so do not wait on each other. A run of
   receives only that reaches the tail is held back (the send it waits on may not be queued
   yet) until something more is queued, someone waits for or tests one of them (release), or
   dm_destroy. Ownership: the queue, `inflight`, `owner` and each request's state, done and
   status are guarded by mu; a running request's message is written by the progress thread
   into the request (_dm_errbuf), never into c->last_error, which only the owning thread
   writes. */

/* Failures after which the collective cannot go on: the requests queued behind get them too. */
_DM_PRIVATE bool _dm_status_breaks(dm_status st) {
    return st == DM_ERR_TIMEOUT || st == DM_ERR_PEER_LOST || st == DM_ERR_MISMATCH || st == DM_ERR_NETWORK ||
           st == DM_ERR_PROTOCOL || st == DM_ERR_ABORTED || st == DM_ERR_NCCL || st == DM_ERR_CUDA ||
           st == DM_ERR_INTERNAL;
}
_DM_PRIVATE bool _dm_op_is_p2p(const dm_op* o) { return o->kind == DM_OP_SEND || o->kind == DM_OP_RECV; }

/* Requests at the head whose result is in are done, in issue order, and leave the queue.
   Caller holds mu. */
_DM_PRIVATE void _dm_async_settle(_dm_async* a) {
    while (a->head && a->head->state == _DM_RQ_RAN) {
        dm_request* r = a->head;
        a->head = r->next;
        r->next = NULL;
        r->done = true;
        a->inflight--;
    }
    if (!a->head) a->tail = NULL;
}

/* A request failed with a status that breaks the collective: every request not started yet
   ends with the same status, unrun, and the queue settles. Caller holds mu. */
_DM_PRIVATE void _dm_async_fail_queue(_dm_async* a, const dm_request* failed) {
    dm_request* r;
    for (r = a->head; r; r = r->next) {
        if (r->state != _DM_RQ_QUEUED) continue;
        r->status = failed->status;
        snprintf(r->msg, sizeof(r->msg), "%s was not run: the %s queued before it failed: %.400s",
                 _dm_op_name(r->op.kind), _dm_op_name(failed->op.kind), failed->msg);
        r->state = _DM_RQ_RAN;
    }
    _dm_async_settle(a);
}

/* The request to run next, or NULL to wait (see >>requests): the head; in a run of
   point-to-point requests at the head, its first send not started, else its first receive
   not started, unless the run holds receives only and reaches the tail and nobody released
   it (then NULL). Caller holds mu. */
_DM_PRIVATE dm_request* _dm_async_pick(_dm_async* a) {
    dm_request *r, *recv = NULL;
    if (!a->head || !_dm_op_is_p2p(&a->head->op)) return a->head;
    for (r = a->head; r && _dm_op_is_p2p(&r->op); r = r->next) {
        if (r->state != _DM_RQ_QUEUED) continue;
        if (r->op.kind == DM_OP_SEND) return r;
        if (!recv) recv = r;
    }
    if (!recv || r || a->stop || recv->qnum <= a->release) return recv;
    return NULL;
}

_DM_PRIVATE dm_status _dm_check_aborted(dm_collective* c, const dm_op* o);
static void* _dm_async_main(void* arg) {
    dm_collective* c = (dm_collective*)arg;
    _dm_async* a = c->core->async;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        dm_request* r;
        _dm_running saved;
        dm_status st;
        while ((r = _dm_async_pick(a)) == NULL && !a->stop) pthread_cond_wait(&a->work, &a->mu);
        if (!r) break;
        r->state = _DM_RQ_RUNNING;
        pthread_mutex_unlock(&a->mu);
        saved = _dm_tls_running;
        _dm_tls_running.c = c;
        _dm_tls_running.err = r->msg;
        _dm_trace_queued(r->tr_queued);
        st = _dm_check_aborted(c, &r->op);     /* held back past a dm_abort: not run */
        if (st == DM_OK) st = _dm_op_run(c, &r->op);
        _dm_tls_running = saved;
        pthread_mutex_lock(&a->mu);
        r->status = st;
        r->state = _DM_RQ_RAN;
        if (_dm_status_breaks(st)) _dm_async_fail_queue(a, r);
        else _dm_async_settle(a);
        pthread_cond_broadcast(&a->done);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

/* The collective's async state, made on first use (two threads racing: one wins). */
_DM_PRIVATE _dm_async* _dm_async_get(dm_collective* c) {
    _dm_async* a = __atomic_load_n(&c->core->async, __ATOMIC_ACQUIRE);
    _dm_async* none = NULL;
    pthread_condattr_t attr;
    if (a) return a;
    a = (_dm_async*)_dm_calloc(&c->allocator, sizeof(_dm_async));
    if (!a) return NULL;
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->work, NULL);
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&a->done, &attr);
    pthread_condattr_destroy(&attr);
    if (__atomic_compare_exchange_n(&c->core->async, &none, a, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) return a;
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->work);
    pthread_cond_destroy(&a->done);
    _dm_free(&c->allocator, a);
    return none;
}

/* Another thread owns this collective right now: say so without touching last_error (the
   owner's), through the logger. */
_DM_PRIVATE dm_status _dm_busy_named(dm_collective* c, const char* what) {
    _DM_LOG(&c->logger, DM_LOG_ERROR, "%s on rank %d: the collective is in use by another thread (%s); "
            "a collective belongs to one thread at a time", what, c->rank,
            __atomic_load_n(&c->core->async, __ATOMIC_ACQUIRE) ? "it has requests in flight" : "a call is running");
    return DM_ERR_BUSY;
}
_DM_PRIVATE dm_status _dm_busy(dm_collective* c, const dm_op* o) { return _dm_busy_named(c, _dm_op_name(o->kind)); }
/* Requests in flight that another thread issued (progress-thread or stream ones). Caller holds mu. */
_DM_PRIVATE bool _dm_async_foreign(const _dm_async* a) {
    return (a->inflight > 0 || a->streams > 0) && !pthread_equal(a->owner, pthread_self());
}

/* A request holding a copy of o; all_to_all_v's arrays are copied too (the caller may reuse
   them at once). */
_DM_PRIVATE dm_request* _dm_request_new(dm_collective* c, const dm_op* o) {
    dm_request* r = (dm_request*)_dm_calloc(&c->allocator, sizeof(dm_request));
    size_t W = (size_t)c->size;
    if (!r) return NULL;
    r->c = c;
    r->op = *o;
    if (o->kind == DM_OP_ALL_TO_ALL_V) {
        r->arrays = (size_t*)_dm_malloc(&c->allocator, 4 * W * sizeof(size_t));
        if (!r->arrays) { _dm_free(&c->allocator, r); return NULL; }
        memcpy(r->arrays, o->send_counts, W * sizeof(size_t));
        memcpy(r->arrays + W, o->send_offsets, W * sizeof(size_t));
        memcpy(r->arrays + 2 * W, o->recv_counts, W * sizeof(size_t));
        memcpy(r->arrays + 3 * W, o->recv_offsets, W * sizeof(size_t));
        r->op.send_counts = r->arrays; r->op.send_offsets = r->arrays + W;
        r->op.recv_counts = r->arrays + 2 * W; r->op.recv_offsets = r->arrays + 3 * W;
    }
    return r;
}
_DM_PRIVATE void _dm_request_free(dm_request* r) {
    dm_collective* c = r->c;
    _dm_free(&c->allocator, r->arrays);
    _dm_free(&c->allocator, r);
}
/* Unlinks r from the live list. Caller holds mu. */
_DM_PRIVATE void _dm_async_unlink(_dm_async* a, dm_request* r) {
    dm_request** p = &a->live;
    while (*p && *p != r) p = &(*p)->live;
    if (*p) *p = r->live;
}

/* r joins the requests dm_destroy frees if nobody waits for them. Caller holds mu. */
_DM_PRIVATE void _dm_async_track(_dm_async* a, dm_request* r) {
    r->live = a->live;
    a->live = r;
}
/* Queues r for the progress thread (started here the first time). Caller holds mu. */
_DM_PRIVATE dm_status _dm_async_enqueue(dm_collective* c, _dm_async* a, dm_request* r) {
    if (!a->started) {
        if (pthread_create(&a->thread, NULL, _dm_async_main, c) != 0)
            return _DM_FAIL(c, DM_ERR_INTERNAL, "%s: could not start the progress thread (%s)",
                            _dm_op_name(r->op.kind), strerror(errno));
        a->started = true;
    }
    _dm_async_track(a, r);
    if (_DM_TRACED(c)) r->tr_queued = _dm_trace_now();
    r->state = _DM_RQ_QUEUED;
    r->qnum = ++a->queued;
    if (a->tail) a->tail->next = r; else a->head = r;
    a->tail = r;
    a->inflight++;
    a->owner = pthread_self();
    pthread_cond_signal(&a->work);
    return DM_OK;
}

_DM_PRIVATE bool _dm_take_now(dm_collective* c) {
    int idle = 0;
    return __atomic_compare_exchange_n(&c->core->busy, &idle, 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}
/* Takes c for this thread (c->core->busy) by the deadline, or DM_ERR_BUSY naming the call. interrupt
   (dm_shrink with DM_SHRINK_ABORT): while another thread holds c, its operation is interrupted
   again at every try, so one that began after _dm_abort_in_flight looked ends too. */
_DM_PRIVATE dm_status _dm_take(dm_collective* c, const char* name, int64_t deadline, bool interrupt) {
    while (!_dm_take_now(c)) {
        if (_dm_now_ms() >= deadline)
            return _DM_FAIL(c, DM_ERR_BUSY, "%s: the collective is in use by another thread", name);
        if (interrupt && _DM_VT_HAS(c->vt, interrupt)) c->vt->interrupt(c);
        usleep(1000);
    }
    return DM_OK;
}

/* Waits for r (block) or looks (done), then frees it and hands its message to the issuing
   thread's last_error. A stream request's finish runs with c taken (c->core->busy), like a blocking
   call: it polls the backend's communicator, which nothing else may use meanwhile, and a
   dm_shrink(DM_SHRINK_ABORT) on another thread interrupts it (>>public calls). dm_wait waits
   for c (a shrink holding it) by the deadline; dm_test looks again later. */
_DM_PRIVATE dm_status _dm_request_finish(dm_request* r, bool block, bool* done) {
    dm_collective* c = r->c;
    _dm_async* a = c->core->async;
    bool mine;
    dm_status st;
    if (r->token) {             /* a backend stream request: finish writes last_error on failure */
        if (!block && !_dm_take_now(c)) { *done = false; return DM_OK; }
        if (block) _DM_TRY(_dm_take(c, "wait", _dm_deadline(c->timeout_ms), false));
        st = c->vt->finish(c, r->token, block, done);
        if (!*done) { __atomic_store_n(&c->core->busy, 0, __ATOMIC_RELEASE); return DM_OK; }
        if (r->tr_queued) _dm_trace_stream_end(c, &r->op, r->tr_index, r->tr_queued, st);
        if (st == DM_OK) c->last_error[0] = 0;
        pthread_mutex_lock(&a->mu);
        _dm_async_unlink(a, r);
        a->streams--;
        pthread_mutex_unlock(&a->mu);
        __atomic_store_n(&c->core->busy, 0, __ATOMIC_RELEASE);
        _dm_request_free(r);
        return st;
    }
    pthread_mutex_lock(&a->mu);
    if (!r->done && r->qnum > a->release) {   /* receives held back up to r may start now */
        a->release = r->qnum;
        pthread_cond_signal(&a->work);
    }
    while (block && !r->done) pthread_cond_wait(&a->done, &a->mu);
    *done = r->done;
    if (!r->done) { pthread_mutex_unlock(&a->mu); return DM_OK; }
    st = r->status;
    mine = a->inflight == 0 || pthread_equal(a->owner, pthread_self());
    _dm_async_unlink(a, r);
    pthread_mutex_unlock(&a->mu);
    if (mine && st != DM_OK) _dm_copy_name(c->last_error, sizeof(c->last_error), r->msg);
    else if (mine) c->last_error[0] = 0;
    _dm_request_free(r);
    return st;
}

_DM_PRIVATE dm_status _dm_submit(dm_collective* c, const dm_op* o);
/* After dm_abort every call fails at once with its message (a call already running is stopped
   by the backend, see _dm_eng_adopt_abort). */
_DM_PRIVATE dm_status _dm_check_aborted(dm_collective* c, const dm_op* o) {
    if (__builtin_expect(__atomic_load_n(&c->core->aborted, __ATOMIC_ACQUIRE) != 2, 1)) return DM_OK;
    return _DM_FAIL(c, DM_ERR_ABORTED, "%s #%llu: %s", _dm_op_name(o->kind),
                    (unsigned long long)__atomic_load_n(&c->seq, __ATOMIC_RELAXED), c->core->abort_msg);
}
/* An _async call: a backend stream request where the backend has one for this kind, else a
   request for the progress thread. A stream backend never shares its communicator with the
   progress thread: the kinds it cannot start (object collectives) run here, and the request
   is done when the call returns. */
_DM_PRIVATE dm_status _dm_submit_async(dm_collective* c, const dm_op* o, dm_request** out) {
    _dm_async* a = _dm_async_get(c);
    dm_request* r;
    dm_status st;
    if (!a) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "%s: out of memory", _dm_op_name(o->kind));
    _DM_TRY(_dm_check_aborted(c, o));
    pthread_mutex_lock(&a->mu);
    if (__atomic_load_n(&c->core->busy, __ATOMIC_ACQUIRE) || _dm_async_foreign(a)) {
        pthread_mutex_unlock(&a->mu);
        return _dm_busy(c, o);
    }
    r = _dm_request_new(c, o);
    if (!r) { pthread_mutex_unlock(&a->mu); return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "%s: out of memory", _dm_op_name(o->kind)); }
    if (_DM_VT_HAS(c->vt, start) && _DM_VT_HAS(c->vt, finish) && a->inflight == 0) {
        uint64_t seq = __atomic_load_n(&c->seq, __ATOMIC_RELAXED);
        /* start runs with c taken, not under mu: it may wait (host staging, under the deadline),
           and a dm_shrink(DM_SHRINK_ABORT) on another thread must be able to interrupt it */
        if (!_dm_take_now(c)) { pthread_mutex_unlock(&a->mu); _dm_request_free(r); return _dm_busy(c, o); }
        pthread_mutex_unlock(&a->mu);
        _dm_op_begin(c, o);
        st = c->vt->start(c, &r->op, &r->token);
        pthread_mutex_lock(&a->mu);
        if (st == DM_OK) {
            _dm_async_track(a, r);
            a->streams++;
            a->owner = pthread_self();
            pthread_mutex_unlock(&a->mu);
            __atomic_store_n(&c->core->busy, 0, __ATOMIC_RELEASE);
            if (_DM_TRACED(c))
                r->tr_index = _dm_trace_stream_start(c, &r->op, r->tr_queued = _dm_trace_now());
            *out = r;
            return DM_OK;
        }
        r->token = NULL;
        __atomic_store_n(&c->seq, seq, __ATOMIC_RELAXED);   /* not started: the run below counts it */
        pthread_mutex_unlock(&a->mu);
        __atomic_store_n(&c->core->busy, 0, __ATOMIC_RELEASE);
        if (st != DM_ERR_UNSUPPORTED) { _dm_request_free(r); return st; }
        st = _dm_submit(c, o);  /* counts the sequence number itself */
        pthread_mutex_lock(&a->mu);
        r->status = st;
        r->done = true;
        _dm_copy_name(r->msg, sizeof(r->msg), c->last_error);
        _dm_async_track(a, r);
        pthread_mutex_unlock(&a->mu);
        *out = r;
        return DM_OK;
    }
    st = _dm_async_enqueue(c, a, r);
    pthread_mutex_unlock(&a->mu);
    if (st != DM_OK) { _dm_request_free(r); return st; }
    *out = r;
    return DM_OK;
}

/* A blocking call: on this thread, unless requests are in flight (then queued behind them and
   waited for), or another thread is using the collective (DM_ERR_BUSY). Calls made by an
   operation that is running (object collectives, fallbacks) run at once. */
_DM_PRIVATE dm_status _dm_submit(dm_collective* c, const dm_op* o) {
    _dm_async* a = __atomic_load_n(&c->core->async, __ATOMIC_ACQUIRE);
    _dm_running saved;
    int idle = 0;
    dm_status st;
    if (_dm_tls_running.c == c) return _dm_op_run(c, o);
    _DM_TRY(_dm_check_aborted(c, o));
    if (!__atomic_compare_exchange_n(&c->core->busy, &idle, 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return _dm_busy(c, o);
    if (a) {
        pthread_mutex_lock(&a->mu);
        if (a->streams > 0 && !pthread_equal(a->owner, pthread_self())) {
            pthread_mutex_unlock(&a->mu);
            __atomic_store_n(&c->core->busy, 0, __ATOMIC_RELEASE);
            return _dm_busy(c, o);
        }
        if (a->inflight > 0) {
            dm_request* r = NULL;
            bool done = false;
            if (pthread_equal(a->owner, pthread_self()) && (r = _dm_request_new(c, o)) != NULL &&
                _dm_async_enqueue(c, a, r) != DM_OK) { _dm_request_free(r); r = NULL; }
            pthread_mutex_unlock(&a->mu);
            __atomic_store_n(&c->core->busy, 0, __ATOMIC_RELEASE);
            if (!r) return _dm_busy(c, o);
            return _dm_request_finish(r, true, &done);
        }
        pthread_mutex_unlock(&a->mu);
    }
    saved = _dm_tls_running;
    _dm_tls_running.c = c;
    _dm_tls_running.err = NULL;
    st = _dm_op_run(c, o);
    _dm_tls_running = saved;
    __atomic_store_n(&c->core->busy, 0, __ATOMIC_RELEASE);
    return st;
}

/* dm_destroy's part: the queued requests run to the end (each under its deadline), the
   progress thread stops, and requests never waited for are freed. */
_DM_PRIVATE void _dm_async_destroy(dm_collective* c) {
    _dm_async* a = c->core->async;
    if (!a) return;
    pthread_mutex_lock(&a->mu);
    a->stop = true;
    pthread_cond_signal(&a->work);
    pthread_mutex_unlock(&a->mu);
    if (a->started) pthread_join(a->thread, NULL);
    while (a->live) {
        dm_request* r = a->live;
        bool done = true;
        a->live = r->live;
        if (r->token) c->vt->finish(c, r->token, true, &done);
        _dm_request_free(r);
    }
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->work);
    pthread_cond_destroy(&a->done);
    _dm_free(&c->allocator, a);
    c->core->async = NULL;
}

DM_API_IMPL dm_status dm_wait(dm_request* req) {
    bool done = false;
    if (!req) return DM_ERR_INVALID_ARG;
    return _dm_request_finish(req, true, &done);
}
DM_API_IMPL dm_status dm_test(dm_request* req, bool* done) {
    bool d = false;
    dm_status st;
    if (!req || !done) return DM_ERR_INVALID_ARG;
    st = _dm_request_finish(req, false, &d);
    *done = d;
    return st;
}
DM_API_IMPL dm_status dm_wait_all(dm_request** reqs, size_t n) {
    dm_status first = DM_OK;
    size_t i;
    if (!reqs && n) return DM_ERR_INVALID_ARG;
    for (i = 0; i < n; i++) {
        dm_status st;
        if (!reqs[i]) continue;
        st = dm_wait(reqs[i]);
        reqs[i] = NULL;
        if (first == DM_OK) first = st;
    }
    return first;
}

/* >>public calls  Blocking: check, then run (or queue behind requests in flight). _async:
   check, then queue. dm_submit: the check its op's kind asks for (_dm_prep_op), then the same. */
#define _DM_BLOCKING(c, prep)                                                                 \
    do {                                                                                      \
        dm_op o_;                                                                             \
        if (!(c)) return DM_ERR_INVALID_ARG;                                                  \
        _DM_TRY(prep);                                                                        \
        return _dm_submit((c), &o_);                                                          \
    } while (0)
#define _DM_ASYNC(c, out, prep)                                                               \
    do {                                                                                      \
        dm_op o_;                                                                             \
        if (out) *(out) = NULL;                                                               \
        if (!(c)) return DM_ERR_INVALID_ARG;                                                  \
        if (!(out)) return _DM_FAIL((c), DM_ERR_INVALID_ARG, "request out is NULL");          \
        _DM_TRY(prep);                                                                        \
        return _dm_submit_async((c), &o_, (out));                                             \
    } while (0)
_DM_PRIVATE dm_status _dm_prep_barrier(dm_collective* c, dm_op* o) {
    _DM_TRY(_dm_check_slot(c, "barrier", _DM_VT_HAS(c->vt, barrier) || _DM_VT_HAS(c->vt, all_reduce)));
    _dm_op_init(o, DM_OP_BARRIER, DM_UINT8);
    return DM_OK;
}

DM_API_IMPL dm_status dm_barrier(dm_collective* c) { _DM_BLOCKING(c, _dm_prep_barrier(c, &o_)); }
DM_API_IMPL dm_status dm_barrier_async(dm_collective* c, dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_barrier(c, &o_));
}
DM_API_IMPL dm_status dm_all_reduce(dm_collective* c, const void* send, void* recv, size_t count,
                                    dm_dtype dtype, dm_reduce_op op) {
    _DM_BLOCKING(c, _dm_prep_all_reduce(c, send, recv, count, dtype, op, &o_));
}
DM_API_IMPL dm_status dm_all_reduce_async(dm_collective* c, const void* send, void* recv, size_t count,
                                          dm_dtype dtype, dm_reduce_op op, dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_all_reduce(c, send, recv, count, dtype, op, &o_));
}
DM_API_IMPL dm_status dm_all_reduce_compressed(dm_collective* c, const void* send, void* recv, size_t count,
                                               dm_dtype dtype, dm_reduce_op op, dm_compress mode,
                                               dm_compress_state* state) {
    _DM_BLOCKING(c, _dm_prep_all_reduce_compressed(c, send, recv, count, dtype, op, mode, state, &o_));
}
DM_API_IMPL dm_status dm_all_reduce_compressed_async(dm_collective* c, const void* send, void* recv, size_t count,
                                                     dm_dtype dtype, dm_reduce_op op, dm_compress mode,
                                                     dm_compress_state* state, dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_all_reduce_compressed(c, send, recv, count, dtype, op, mode, state, &o_));
}
DM_API_IMPL dm_status dm_all_gather(dm_collective* c, const void* send, void* recv, size_t count,
                                    dm_dtype dtype) {
    _DM_BLOCKING(c, _dm_prep_all_gather(c, send, recv, count, dtype, &o_));
}
DM_API_IMPL dm_status dm_all_gather_async(dm_collective* c, const void* send, void* recv, size_t count,
                                          dm_dtype dtype, dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_all_gather(c, send, recv, count, dtype, &o_));
}
DM_API_IMPL dm_status dm_all_gather_to_list(dm_collective* c, const void* send, void* const* recvs,
                                            size_t count, dm_dtype dtype) {
    _DM_BLOCKING(c, _dm_prep_all_gather_to_list(c, send, recvs, count, dtype, &o_));
}
DM_API_IMPL dm_status dm_all_gather_to_list_async(dm_collective* c, const void* send, void* const* recvs,
                                                  size_t count, dm_dtype dtype, dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_all_gather_to_list(c, send, recvs, count, dtype, &o_));
}
DM_API_IMPL dm_status dm_reduce_scatter(dm_collective* c, const void* send, void* recv,
                                        size_t recv_count, dm_dtype dtype, dm_reduce_op op) {
    _DM_BLOCKING(c, _dm_prep_reduce_scatter(c, send, recv, recv_count, dtype, op, &o_));
}
DM_API_IMPL dm_status dm_reduce_scatter_async(dm_collective* c, const void* send, void* recv, size_t recv_count,
                                              dm_dtype dtype, dm_reduce_op op, dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_reduce_scatter(c, send, recv, recv_count, dtype, op, &o_));
}
DM_API_IMPL dm_status dm_broadcast(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int root) {
    _DM_BLOCKING(c, _dm_prep_broadcast(c, buf, count, dtype, root, &o_));
}
DM_API_IMPL dm_status dm_broadcast_async(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int root,
                                         dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_broadcast(c, buf, count, dtype, root, &o_));
}
DM_API_IMPL dm_status dm_all_gather_objects(dm_collective* c, const void* data, size_t size, dm_blob_list* out) {
    _DM_BLOCKING(c, _dm_prep_gather_objects(c, data, size, out, &o_));
}
DM_API_IMPL dm_status dm_all_gather_objects_async(dm_collective* c, const void* data, size_t size,
                                                  dm_blob_list* out_list, dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_gather_objects(c, data, size, out_list, &o_));
}
DM_API_IMPL dm_status dm_broadcast_objects(dm_collective* c, const dm_blob* objects, size_t count, int root,
                                           dm_blob_list* out) {
    _DM_BLOCKING(c, _dm_prep_broadcast_objects(c, objects, count, root, out, &o_));
}
DM_API_IMPL dm_status dm_broadcast_objects_async(dm_collective* c, const dm_blob* objects, size_t count, int root,
                                                 dm_blob_list* out_list, dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_broadcast_objects(c, objects, count, root, out_list, &o_));
}
DM_API_IMPL dm_status dm_reduce(dm_collective* c, const void* send, void* recv, size_t count, dm_dtype dtype,
                                dm_reduce_op op, int root) {
    _DM_BLOCKING(c, _dm_prep_reduce(c, send, recv, count, dtype, op, root, &o_));
}
DM_API_IMPL dm_status dm_reduce_async(dm_collective* c, const void* send, void* recv, size_t count, dm_dtype dtype,
                                      dm_reduce_op op, int root, dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_reduce(c, send, recv, count, dtype, op, root, &o_));
}
DM_API_IMPL dm_status dm_gather(dm_collective* c, const void* send, void* recv, size_t count, dm_dtype dtype,
                                int root) {
    _DM_BLOCKING(c, _dm_prep_rooted(c, true, send, recv, count, dtype, root, &o_));
}
DM_API_IMPL dm_status dm_gather_async(dm_collective* c, const void* send, void* recv, size_t count, dm_dtype dtype,
                                      int root, dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_rooted(c, true, send, recv, count, dtype, root, &o_));
}
DM_API_IMPL dm_status dm_scatter(dm_collective* c, const void* send, void* recv, size_t count, dm_dtype dtype,
                                 int root) {
    _DM_BLOCKING(c, _dm_prep_rooted(c, false, send, recv, count, dtype, root, &o_));
}
DM_API_IMPL dm_status dm_scatter_async(dm_collective* c, const void* send, void* recv, size_t count,
                                       dm_dtype dtype, int root, dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_rooted(c, false, send, recv, count, dtype, root, &o_));
}
DM_API_IMPL dm_status dm_all_to_all(dm_collective* c, const void* send, void* recv, size_t count, dm_dtype dtype) {
    _DM_BLOCKING(c, _dm_prep_all_to_all(c, send, recv, count, dtype, &o_));
}
DM_API_IMPL dm_status dm_all_to_all_async(dm_collective* c, const void* send, void* recv, size_t count,
                                          dm_dtype dtype, dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_all_to_all(c, send, recv, count, dtype, &o_));
}
DM_API_IMPL dm_status dm_all_to_all_v(dm_collective* c, const void* send, const size_t* send_counts,
                                      const size_t* send_offsets, void* recv, const size_t* recv_counts,
                                      const size_t* recv_offsets, dm_dtype dtype) {
    _DM_BLOCKING(c, _dm_prep_all_to_all_v(c, send, send_counts, send_offsets, recv, recv_counts, recv_offsets,
                                          dtype, &o_));
}
DM_API_IMPL dm_status dm_all_to_all_v_async(dm_collective* c, const void* send, const size_t* send_counts,
                                            const size_t* send_offsets, void* recv, const size_t* recv_counts,
                                            const size_t* recv_offsets, dm_dtype dtype, dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_all_to_all_v(c, send, send_counts, send_offsets, recv, recv_counts, recv_offsets,
                                            dtype, &o_));
}
DM_API_IMPL dm_status dm_send(dm_collective* c, const void* buf, size_t count, dm_dtype dtype, int peer, int tag) {
    _DM_BLOCKING(c, _dm_prep_p2p(c, true, buf, count, dtype, peer, tag, &o_));
}
DM_API_IMPL dm_status dm_send_async(dm_collective* c, const void* buf, size_t count, dm_dtype dtype, int peer,
                                    int tag, dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_p2p(c, true, buf, count, dtype, peer, tag, &o_));
}
DM_API_IMPL dm_status dm_recv(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int peer, int tag) {
    _DM_BLOCKING(c, _dm_prep_p2p(c, false, buf, count, dtype, peer, tag, &o_));
}
DM_API_IMPL dm_status dm_recv_async(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int peer, int tag,
                                    dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_p2p(c, false, buf, count, dtype, peer, tag, &o_));
}
/* dm_recv_any: a recv from DM_ANY_SOURCE with the sender's slot. */
_DM_PRIVATE dm_status _dm_prep_recv_any_out(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int tag,
                                            int* source, dm_op* o) {
    if (source) *source = -1;
    _DM_TRY(_dm_prep_p2p(c, false, buf, count, dtype, DM_ANY_SOURCE, tag, o));
    o->source = source;
    return DM_OK;
}
DM_API_IMPL dm_status dm_recv_any(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int tag, int* source) {
    _DM_BLOCKING(c, _dm_prep_recv_any_out(c, buf, count, dtype, tag, source, &o_));
}
DM_API_IMPL dm_status dm_recv_any_async(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int tag,
                                        int* source, dm_request** out) {
    _DM_ASYNC(c, out, _dm_prep_recv_any_out(c, buf, count, dtype, tag, source, &o_));
}

_DM_PRIVATE dm_status _dm_prep_split(dm_collective* c, int color, int key, dm_collective** out, dm_op* o) {
    if (!out) return _DM_FAIL(c, DM_ERR_INVALID_ARG, "split: out is NULL");
    *out = NULL;
    if (color < DM_SPLIT_NONE)
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "split: color %d is negative (use DM_SPLIT_NONE to opt out)", color);
    _DM_TRY(_dm_check_slot(c, "split", _DM_VT_HAS(c->vt, split)));
    _dm_op_init(o, DM_OP_SPLIT, DM_UINT8);
    o->color = color; o->key = key; o->split_out = out;
    return DM_OK;
}
DM_API_IMPL dm_status dm_split(dm_collective* c, int color, int key, dm_collective** out) {
    _DM_BLOCKING(c, _dm_prep_split(c, color, key, out, &o_));
}

/* dm_submit's check: the prep of in's kind on in's fields, into o. */
_DM_PRIVATE dm_status _dm_prep_op(dm_collective* c, const dm_op* in, bool queued, dm_op* o) {
    switch (in->kind) {
        case DM_OP_BARRIER: return _dm_prep_barrier(c, o);
        case DM_OP_ALL_REDUCE:
            if (in->compress || in->compress_state)
                return _dm_prep_all_reduce_compressed(c, in->send, in->recv, in->count, in->dtype, in->op,
                                                      in->compress, in->compress_state, o);
            return _dm_prep_all_reduce(c, in->send, in->recv, in->count, in->dtype, in->op, o);
        case DM_OP_ALL_GATHER: return _dm_prep_all_gather(c, in->send, in->recv, in->count, in->dtype, o);
        case DM_OP_ALL_GATHER_TO_LIST:
            return _dm_prep_all_gather_to_list(c, in->send, in->recvs, in->count, in->dtype, o);
        case DM_OP_REDUCE_SCATTER:
            return _dm_prep_reduce_scatter(c, in->send, in->recv, in->count, in->dtype, in->op, o);
        case DM_OP_BROADCAST: return _dm_prep_broadcast(c, in->recv, in->count, in->dtype, in->root, o);
        case DM_OP_ALL_GATHER_OBJECTS: return _dm_prep_gather_objects(c, in->send, in->count, in->out_list, o);
        case DM_OP_BROADCAST_OBJECTS:
            return _dm_prep_broadcast_objects(c, in->objects, in->count, in->root, in->out_list, o);
        case DM_OP_REDUCE:
            return _dm_prep_reduce(c, in->send, in->recv, in->count, in->dtype, in->op, in->root, o);
        case DM_OP_GATHER: return _dm_prep_rooted(c, true, in->send, in->recv, in->count, in->dtype, in->root, o);
        case DM_OP_SCATTER: return _dm_prep_rooted(c, false, in->send, in->recv, in->count, in->dtype, in->root, o);
        case DM_OP_ALL_TO_ALL: return _dm_prep_all_to_all(c, in->send, in->recv, in->count, in->dtype, o);
        case DM_OP_ALL_TO_ALL_V:
            return _dm_prep_all_to_all_v(c, in->send, in->send_counts, in->send_offsets, in->recv, in->recv_counts,
                                         in->recv_offsets, in->dtype, o);
        case DM_OP_SEND: return _dm_prep_p2p(c, true, in->send, in->count, in->dtype, in->root, in->tag, o);
        case DM_OP_RECV:
            _DM_TRY(_dm_prep_p2p(c, false, in->recv, in->count, in->dtype, in->root, in->tag, o));
            if (o->root == DM_ANY_SOURCE) o->source = in->source;
            if (o->source) *o->source = -1;
            return DM_OK;
        case DM_OP_SPLIT:
            if (queued) return _DM_FAIL(c, DM_ERR_INVALID_ARG, "submit: split has no _async form");
            return _dm_prep_split(c, in->color, in->key, in->split_out, o);
    }
    return _DM_FAIL(c, DM_ERR_INVALID_ARG, "submit: op kind %d is not an operation", (int)in->kind);
}
DM_API_IMPL dm_status dm_submit(dm_collective* c, const dm_op* op, dm_request** out) {
    dm_op o;
    if (out) *out = NULL;
    if (!c) return DM_ERR_INVALID_ARG;
    if (!op) return _DM_FAIL(c, DM_ERR_INVALID_ARG, "submit: op is NULL");
    _DM_TRY(_dm_prep_op(c, op, out != NULL, &o));
    return out ? _dm_submit_async(c, &o, out) : _dm_submit(c, &o);
}

/* DM_SHRINK_ABORT's first step: requests not started yet complete with DM_ERR_ABORTED, the
   running one is interrupted (where the backend can) and finishes with its error. A call on
   another thread that holds c (a blocking call, dm_synchronize, dm_wait on a stream request)
   is interrupted too, and dm_shrink's _dm_take waits for it to let go. Returns once the queue
   is empty (each operation ends by its own deadline at the latest). Stream requests not being
   waited for stay: the backend's shrink settles them. */
_DM_PRIVATE void _dm_abort_in_flight(dm_collective* c) {
    _dm_async* a = __atomic_load_n(&c->core->async, __ATOMIC_ACQUIRE);
    bool can = _DM_VT_HAS(c->vt, interrupt);
    if (a) {
        dm_request* r;
        pthread_mutex_lock(&a->mu);
        for (r = a->head; r; r = r->next) {
            if (r->state != _DM_RQ_QUEUED) continue;
            r->status = DM_ERR_ABORTED;
            snprintf(r->msg, sizeof(r->msg), "%s was not run: aborted by dm_shrink(DM_SHRINK_ABORT)",
                     _dm_op_name(r->op.kind));
            r->state = _DM_RQ_RAN;
        }
        _dm_async_settle(a);    /* up to the running one, which settles the rest when it ends */
        if (a->inflight > 0 && can) c->vt->interrupt(c);
        while (a->inflight > 0) pthread_cond_wait(&a->done, &a->mu);
        pthread_cond_broadcast(&a->done);
        pthread_mutex_unlock(&a->mu);
    }
    if (__atomic_load_n(&c->core->busy, __ATOMIC_ACQUIRE) && can) c->vt->interrupt(c);
}
/* abort, shrink, grow: failures and step boundaries */
_DM_COLD_BEGIN
DM_API_IMPL dm_status dm_abort(dm_collective* c, const char* reason) {
    int none = 0;
    if (!c) return DM_ERR_INVALID_ARG;
    if (!__atomic_compare_exchange_n(&c->core->aborted, &none, 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return DM_OK;                           /* aborted already */
    snprintf(c->core->abort_msg, sizeof(c->core->abort_msg), "%s: rank %d aborted: %s", c->vt->name, c->rank,
             reason && reason[0] ? reason : "dm_abort");
    __atomic_store_n(&c->core->aborted, 2, __ATOMIC_RELEASE);
    _DM_LOG(&c->logger, DM_LOG_WARN, "%s", c->core->abort_msg);
    if (_DM_VT_HAS(c->vt, interrupt)) c->vt->interrupt(c);
    return DM_OK;
}

DM_API_IMPL dm_status dm_shrink(dm_collective* c, const int* exclude, int n_exclude, int flags, dm_collective** out) {
    _dm_async* a;
    bool* gone;
    int i;
    dm_status st;
    if (!c) return DM_ERR_INVALID_ARG;
    if (!out) return _DM_FAIL(c, DM_ERR_INVALID_ARG, "shrink: out is NULL");
    *out = NULL;
    if (flags != DM_SHRINK_DEFAULT && flags != DM_SHRINK_ABORT)
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "shrink: flags %d is neither DM_SHRINK_DEFAULT nor DM_SHRINK_ABORT", flags);
    if (n_exclude < 0 || (n_exclude > 0 && !exclude))
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "shrink: %d excluded ranks at %p", n_exclude, (const void*)exclude);
    if (n_exclude == 0 && c->shrink_needs_exclude)
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "shrink: the %s backend cannot find dead ranks itself: name the "
                        "excluded ranks (n_exclude is 0; the collective is untouched)", c->vt->name);
    for (i = 0; i < n_exclude; i++) {
        if (exclude[i] < 0 || exclude[i] >= c->size)
            return _DM_FAIL(c, DM_ERR_INVALID_ARG, "shrink: excluded rank %d is not a rank of this %d-rank collective",
                            exclude[i], c->size);
        if (exclude[i] == c->rank)
            return _DM_FAIL(c, DM_ERR_INVALID_ARG, "shrink: rank %d excludes itself (an excluded rank does not call "
                            "dm_shrink; it destroys the collective)", c->rank);
    }
    _DM_TRY(_dm_check_slot(c, "shrink", _DM_VT_HAS(c->vt, shrink)));
    a = __atomic_load_n(&c->core->async, __ATOMIC_ACQUIRE);
    if (flags == DM_SHRINK_ABORT) {
        _dm_abort_in_flight(c);
    } else if (a) {
        int inflight;
        pthread_mutex_lock(&a->mu);
        inflight = a->inflight + a->streams;
        pthread_mutex_unlock(&a->mu);
        if (inflight > 0)
            return _DM_FAIL(c, DM_ERR_BUSY, "shrink: %d requests in flight (wait for them, or use "
                            "DM_SHRINK_ABORT)", inflight);
    }
    _DM_TRY(_dm_take(c, "shrink", _dm_deadline(c->timeout_ms), flags == DM_SHRINK_ABORT));
    gone = (bool*)_dm_calloc(&c->allocator, sizeof(bool) * (size_t)c->size);
    if (!gone) {
        __atomic_store_n(&c->core->busy, 0, __ATOMIC_RELEASE);
        return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "shrink: out of memory");
    }
    for (i = 0; i < n_exclude; i++) gone[exclude[i]] = true;
    _dm_errbuf(c)[0] = 0;
    st = c->vt->shrink(c, gone, flags, out);
    if (st == DM_OK && *out && c->core->trace) _dm_trace_adopt(c, *out, "shrink", -1);
    _dm_free(&c->allocator, gone);
    __atomic_store_n(&c->core->busy, 0, __ATOMIC_RELEASE);
    if (st != DM_OK && *out) { dm_destroy(*out); *out = NULL; }
    return st;
}
DM_API_IMPL dm_status dm_grow(dm_collective* c, int n_new, dm_collective** out) {
    _dm_async* a;
    dm_status st;
    if (!c) return DM_ERR_INVALID_ARG;
    if (!out) return _DM_FAIL(c, DM_ERR_INVALID_ARG, "grow: out is NULL");
    *out = NULL;
    if (n_new < 1 || n_new > (1 << 20) - c->size)
        return _DM_FAIL(c, DM_ERR_INVALID_ARG, "grow: %d newcomers for a %d-rank collective (1 .. %d)", n_new,
                        c->size, (1 << 20) - c->size);
    _DM_TRY(_dm_check_slot(c, "grow", _DM_VT_HAS(c->vt, grow)));
    a = __atomic_load_n(&c->core->async, __ATOMIC_ACQUIRE);
    if (a) {
        int inflight;
        pthread_mutex_lock(&a->mu);
        inflight = a->inflight;
        pthread_mutex_unlock(&a->mu);
        if (inflight > 0) return _DM_FAIL(c, DM_ERR_BUSY, "grow: %d requests in flight (wait for them first)", inflight);
    }
    _DM_TRY(_dm_take(c, "grow", _dm_deadline(c->timeout_ms), false));
    _dm_begin(c, "grow");       /* a collective call: counts in dm_sequence, clears the error */
    st = c->vt->grow(c, n_new, out);
    if (st == DM_OK && *out && c->core->trace) _dm_trace_adopt(c, *out, "grow", -1);
    __atomic_store_n(&c->core->busy, 0, __ATOMIC_RELEASE);
    if (st != DM_OK && *out) { dm_destroy(*out); *out = NULL; }
    return st;
}
_DM_COLD_END

DM_API_IMPL void dm_blob_list_free(dm_collective* c, dm_blob_list* list) {
    if (!list) return;
    _dm_free(c ? &c->allocator : NULL, list->items);
    list->items = NULL;
    list->count = 0;
}

/* Like a blocking call, it takes c (the backend polls its communicator; a dm_shrink with
   DM_SHRINK_ABORT on another thread interrupts it): DM_ERR_BUSY while another thread uses c or
   has requests in flight on it. */
DM_API_IMPL dm_status dm_synchronize(dm_collective* c) {
    _dm_async* a;
    bool foreign = false;
    dm_status st;
    if (!c) return DM_ERR_INVALID_ARG;
    if (!_DM_VT_HAS(c->vt, synchronize)) return DM_OK;
    if (_dm_tls_running.c == c) return c->vt->synchronize(c);     /* inside a running operation */
    if (!_dm_take_now(c)) return _dm_busy_named(c, "synchronize");
    a = __atomic_load_n(&c->core->async, __ATOMIC_ACQUIRE);
    if (a) {
        pthread_mutex_lock(&a->mu);
        foreign = _dm_async_foreign(a);
        pthread_mutex_unlock(&a->mu);
    }
    st = foreign ? _dm_busy_named(c, "synchronize") : c->vt->synchronize(c);
    __atomic_store_n(&c->core->busy, 0, __ATOMIC_RELEASE);
    return st;
}

/* >>destroy  dm_destroy, and the deadline's setter (it waits for no request in flight). */
DM_API_IMPL void dm_destroy(dm_collective* c) {
    if (!c) return;
    _dm_trace_closing(c);           /* both read c->core->trace atomically: the progress thread may be */
    _dm_async_destroy(c);           /* making it (the recorder starts with the first operation) */
    if (c->local) dm_destroy(c->local);
    c->local = NULL;
    _dm_trace_release(c);
    if (c->vt && c->vt->destroy) c->vt->destroy(c);
}
/* The deadline is read by queued requests as they run: it changes only with none in flight. */
DM_API_IMPL dm_status dm_set_timeout(dm_collective* c, int timeout_ms) {
    _dm_async* a;
    bool busy = false;
    if (!c) return DM_ERR_INVALID_ARG;
    a = __atomic_load_n(&c->core->async, __ATOMIC_ACQUIRE);
    if (a) {
        pthread_mutex_lock(&a->mu);
        busy = a->inflight > 0;
        pthread_mutex_unlock(&a->mu);
    }
    if (busy) return _DM_FAIL(c, DM_ERR_BUSY, "set_timeout: requests are in flight; wait for them first");
    {
        char err[DM_LAST_ERROR_SIZE];
        if (_dm_cfg_timeout(timeout_ms, &c->timeout_ms, err, sizeof(err)) != DM_OK)
            return _DM_FAIL(c, DM_ERR_ENV, "set_timeout: %s", err);
    }
    return DM_OK;
}

_DM_COLD_BEGIN
/* >>fake  World 1, or one simulated member of an N-rank world where every rank holds the same
   data (see >>fake desc for each collective's result). */
typedef struct _dm_fake {
    dm_collective base;
    _dm_core core;
} _dm_fake;

static dm_status _dm_fake_create_with(const dm_fake_desc* d, dm_collective** out);

/* dst = x op x op ... (size copies), computed in blocks with x saved first, so in-place works
   and floats round at every step like a serial reduction of size equal values. */
static void _dm_fake_fold(const dm_collective* c, void* dst, const void* src, size_t count,
                          dm_dtype dtype, dm_reduce_op op) {
    unsigned char x[4096];
    size_t esize = dm_dtype_size(dtype), per = sizeof(x) / esize, done, m;
    int k;
    for (done = 0; done < count; done += m) {
        unsigned char* d = (unsigned char*)dst + done * esize;
        m = count - done < per ? count - done : per;
        memcpy(x, (const unsigned char*)src + done * esize, m * esize);
        if (d != x) memmove(d, x, m * esize);
        for (k = 1; k < c->size; k++) dm_reduce_local(dtype, op, d, x, m);
        if (op == DM_MEAN) dm_divide_local(dtype, d, m, c->size);
    }
}
/* The value recursive doubling (>>recursive doubling, _dm_sch_rd) computes when every rank holds
   x, per block of m elements: ranks folded into pairs hold A = x op x, the others B = x; each
   round combines aligned groups of newranks two halves at a time. A group wholly below rem
   holds A_k, wholly above B_k, and at most one group per level straddles rem: S. */
static void _dm_fake_rd_block(int W, unsigned char* d, size_t m, dm_dtype dtype, dm_reduce_op op) {
    unsigned char a[4096], b[4096], s[4096], t[4096];
    size_t bytes = m * dm_dtype_size(dtype);
    int p = 1, rem, size;
    while (p * 2 <= W) p *= 2;
    rem = W - p;
    memcpy(b, d, bytes);
    memcpy(a, d, bytes);
    dm_reduce_local(dtype, op, a, b, m);
    for (size = 1; size < p; size *= 2) {
        int lo = rem / (2 * size) * (2 * size), h;
        const unsigned char* half[2];
        for (h = 0; h < 2; h++) {
            int start = lo + h * size;
            half[h] = start + size <= rem ? a : start >= rem ? b : s;
        }
        if (lo < rem && rem < lo + 2 * size) {   /* this level's straddling group */
            memcpy(t, half[0], bytes);
            dm_reduce_local(dtype, op, t, half[1], m);
            memcpy(s, t, bytes);
        }
        memcpy(t, a, bytes);                     /* the kernels' operands never alias */
        dm_reduce_local(dtype, op, a, t, m);
        memcpy(t, b, bytes);
        dm_reduce_local(dtype, op, b, t, m);
    }
    memcpy(d, rem == 0 ? b : s, bytes);
}
static dm_status _dm_fake_all_reduce(dm_collective* c, const void* send, void* recv, size_t count,
                                     dm_dtype dtype, dm_reduce_op op) {
    size_t esize = dm_dtype_size(dtype), per = 4096 / esize, done, m;
    if (c->size == 1 || (count * esize > _DM_PICK_SMALL_BYTES && count >= (size_t)c->size)) {
        _dm_fake_fold(c, recv, send, count, dtype, op);    /* the ring's order: serial */
        return DM_OK;
    }
    if (send != recv) memmove(recv, send, count * esize);
    for (done = 0; done < count; done += m) {
        m = count - done < per ? count - done : per;
        _dm_fake_rd_block(c->size, (unsigned char*)recv + done * esize, m, dtype, op);
        if (op == DM_MEAN) dm_divide_local(dtype, (unsigned char*)recv + done * esize, m, c->size);
    }
    return DM_OK;
}
static dm_status _dm_fake_all_gather(dm_collective* c, const void* send, void* recv, size_t count,
                                     dm_dtype dtype) {
    size_t block = count * dm_dtype_size(dtype);
    unsigned char* mine = (unsigned char*)recv + (size_t)c->rank * block;
    int r;
    if (mine != send) memmove(mine, send, block);
    for (r = 0; r < c->size; r++)
        if (r != c->rank) memcpy((unsigned char*)recv + (size_t)r * block, mine, block);
    return DM_OK;
}
static dm_status _dm_fake_reduce_scatter(dm_collective* c, const void* send, void* recv,
                                         size_t recv_count, dm_dtype dtype, dm_reduce_op op) {
    size_t block = recv_count * dm_dtype_size(dtype);
    _dm_fake_fold(c, recv, (const unsigned char*)send + (size_t)c->rank * block, recv_count, dtype, op);
    return DM_OK;
}
static dm_status _dm_fake_broadcast(dm_collective* c, void* buf, size_t count, dm_dtype dtype, int root) {
    (void)c; (void)buf; (void)count; (void)dtype; (void)root;
    return DM_OK; /* every rank already holds the root's data */
}
static dm_status _dm_fake_barrier(dm_collective* c) { (void)c; return DM_OK; }
/* The root's block for this rank; a simulated non-root holds no other rank's data, so its recv
   is left as it is. */
static dm_status _dm_fake_scatter(dm_collective* c, const void* send, void* recv, size_t count, dm_dtype dtype,
                                  int root) {
    size_t bytes = count * dm_dtype_size(dtype);
    const unsigned char* mine = (const unsigned char*)send + (size_t)root * bytes;
    if (c->rank == root && mine != recv && bytes) memmove(recv, mine, bytes);
    return DM_OK;
}
/* Every rank i is a copy of this one, so what it sends here is this rank's block for itself:
   recv block i = send block rank (in place: recv's own block, saved first). */
static dm_status _dm_fake_all_to_all_v(dm_collective* c, const void* send, const size_t* sc, const size_t* so,
                                       void* recv, const size_t* rc, const size_t* ro, dm_dtype dtype) {
    size_t esize = dm_dtype_size(dtype), bytes = sc[c->rank] * esize;
    const unsigned char* src = (const unsigned char*)(send ? send : recv) + so[c->rank] * esize;
    unsigned char* saved = NULL;
    int i;
    for (i = 0; i < c->size; i++)
        if (rc[i] != sc[c->rank])
            return _DM_FAIL(c, DM_ERR_MISMATCH, "fake: all_to_all_v: rank %d (a copy of rank %d) sends %zu "
                            "elements here, recv_counts[%d] is %zu", i, c->rank, sc[c->rank], i, rc[i]);
    if (!send && bytes) {
        saved = (unsigned char*)_dm_malloc(&c->allocator, bytes);
        if (!saved) return _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "fake: all_to_all: no memory for %zu bytes", bytes);
        memcpy(saved, src, bytes);
        src = saved;
    }
    for (i = 0; i < c->size && bytes; i++) memmove((unsigned char*)recv + ro[i] * esize, src, bytes);
    _dm_free(&c->allocator, saved);
    return DM_OK;
}
/* A simulated rank cannot see the others' colors: the group is taken to be the whole world
   (every rank passed this color), with this rank's position kept. */
static dm_status _dm_fake_split(dm_collective* c, int color, int key, dm_collective** out) {
    _DM_ZERO(dm_fake_desc, d);
    (void)key;
    if (color == DM_SPLIT_NONE) return DM_OK;
    d.world_size = c->size;
    d.rank = c->rank;
    d.local_world_size = c->local_size;
    d.timeout_ms = c->timeout_ms;
    d.logger = c->logger;
    d.allocator = c->allocator;
    return _dm_fake_create_with(&d, out);
}
static void _dm_fake_destroy(dm_collective* c) {
    dm_allocator a = c->allocator;
    _dm_free(&a, c);
}
static const dm_collective_vtable _dm_fake_vtable = {
    sizeof(dm_collective_vtable),    /* struct_size */
    DM_COLLECTIVE_VTABLE_VERSION,    /* version */
    "fake",                          /* name */
    _dm_fake_destroy,                /* destroy */
    _dm_fake_barrier,                /* barrier */
    _dm_fake_all_reduce,             /* all_reduce */
    _dm_fake_all_gather,             /* all_gather */
    NULL,                            /* all_gather_to_list: core fallback */
    _dm_fake_reduce_scatter,         /* reduce_scatter */
    _dm_fake_broadcast,              /* broadcast */
    _dm_fake_split,                  /* split */
    NULL,                            /* native_handle */
    NULL,                            /* synchronize */
    NULL,                            /* transport: the backend's name */
    NULL,                            /* reduce: core fallback through all_reduce */
    NULL,                            /* gather: core fallback through all_gather */
    _dm_fake_scatter,                /* scatter */
    _dm_fake_all_to_all_v,           /* all_to_all_v */
    NULL,                            /* send */
    NULL,                            /* recv */
    NULL,                            /* start */
    NULL,                            /* finish */
    NULL,                            /* shrink */
    NULL,                            /* grow */
    NULL,                            /* interrupt */
    NULL,                            /* recv_any */
};

/* Checks the desc shared by dm_fake_create and dm_thread_world_create. err gets the reason. */
/* The host of rank r in desc d: host_of[r], else r's node from local_world_size. */
static int _dm_fake_host(const dm_fake_desc* d, int r) {
    return d->host_of ? d->host_of[r] : r / _dm_def(d->local_world_size, _dm_def(d->world_size, 1));
}
/* site_of: numbers >= 0, one site per host. */
static dm_status _dm_fake_sites_check(const dm_fake_desc* d, char* err, size_t cap) {
    int r, q, n = _dm_def(d->world_size, 1);
    for (r = 0; d->site_of && r < n; r++) {
        if (d->site_of[r] < 0)
            return _DM_REPORT(&d->logger, err, cap, DM_ERR_INVALID_ARG,
                              "fake: site_of[%d] is %d; sites are numbers >= 0", r, d->site_of[r]);
        for (q = 0; q < r; q++)
            if (_dm_fake_host(d, q) == _dm_fake_host(d, r) && d->site_of[q] != d->site_of[r])
                return _DM_REPORT(&d->logger, err, cap, DM_ERR_INVALID_ARG,
                                  "fake: ranks %d and %d share a host but site_of gives them sites %d and %d; "
                                  "a host is at one site", q, r, d->site_of[q], d->site_of[r]);
    }
    return DM_OK;
}
static dm_status _dm_fake_desc_check(const dm_fake_desc* d, bool check_rank, char* err, size_t cap) {
    if (!_dm_allocator_valid(&d->allocator))
        return _DM_REPORT(&d->logger, err, cap, DM_ERR_INVALID_ARG,
                          "fake: allocator needs both alloc_fn and free_fn, or neither");
    if (d->world_size < 0 || d->local_world_size < 0)
        return _DM_REPORT(&d->logger, err, cap, DM_ERR_INVALID_ARG,
                          "fake: world_size %d / local_world_size %d must not be negative",
                          d->world_size, d->local_world_size);
    if (check_rank && (d->rank < 0 || d->rank >= _dm_def(d->world_size, 1)))
        return _DM_REPORT(&d->logger, err, cap, DM_ERR_INVALID_ARG,
                          "fake: rank %d is not below world_size %d", d->rank, _dm_def(d->world_size, 1));
    if (d->host_of) {
        int r;
        for (r = 0; r < _dm_def(d->world_size, 1); r++)
            if (d->host_of[r] < 0)
                return _DM_REPORT(&d->logger, err, cap, DM_ERR_INVALID_ARG,
                                  "fake: host_of[%d] is %d; hosts are numbers >= 0", r, d->host_of[r]);
    }
    return _dm_fake_sites_check(d, err, cap);
}
/* Rank c->rank on host host_of[rank]: its local rank and size, and the node name dm_local
   groups by. */
static void _dm_fake_set_host(dm_collective* c, const int* host_of) {
    int r;
    c->local_rank = c->local_size = 0;
    for (r = 0; r < c->size; r++) {
        if (host_of[r] != host_of[c->rank]) continue;
        if (r < c->rank) c->local_rank++;
        c->local_size++;
    }
    snprintf(c->node_name, sizeof(c->node_name), "%s-node-%d", c->vt->name, host_of[c->rank]);
}
/* Node k holds ranks [k*L, (k+1)*L): the local rank and the node's size for rank r. */
static void _dm_fake_set_local(dm_collective* c, int local_world_size) {
    int L = local_world_size > 0 && local_world_size < c->size ? local_world_size : c->size;
    int node = c->rank / L, first = node * L;
    c->local_rank = c->rank - first;
    c->local_size = (c->size - first) < L ? (c->size - first) : L;
    snprintf(c->node_name, sizeof(c->node_name), "%s-node-%d", c->vt->name, node);
}
static dm_status _dm_fake_create_with(const dm_fake_desc* d, dm_collective** out) {
    _dm_fake* f = (_dm_fake*)_dm_calloc(&d->allocator, sizeof(_dm_fake));
    if (!f) return DM_ERR_OUT_OF_MEMORY;
    _dm_collective_init(&f->base, &f->core, &_dm_fake_vtable, d->rank, _dm_def(d->world_size, 1), d->timeout_ms,
                        &d->logger, &d->allocator);
    if (d->host_of) _dm_fake_set_host(&f->base, d->host_of);
    else _dm_fake_set_local(&f->base, d->local_world_size);
    *out = &f->base;
    return DM_OK;
}
static dm_status _dm_fake_create_checked(const dm_fake_desc* desc, dm_collective** out) {
    char err[DM_LAST_ERROR_SIZE];
    _DM_ZERO(dm_fake_desc, d);
    if (!out) return _DM_REPORT(NULL, err, sizeof(err), DM_ERR_INVALID_ARG, "fake: out is NULL");
    *out = NULL;
    if (desc) d = *desc;
    _DM_TRY(_dm_fake_desc_check(&d, true, err, sizeof(err)));
    _dm_create_rank(d.rank);
    _DM_TRY(_dm_cfg_check_create(&d.logger, d.timeout_ms, err, sizeof(err)));
    d.logger = _dm_logger_or_default(&d.logger, d.rank);
    return _dm_fake_create_with(&d, out);
}
DM_API_IMPL dm_status dm_fake_create(const dm_fake_desc* desc, dm_collective** out) {
    _dm_create_begin();
    return _dm_create_end(_dm_fake_create_checked(desc, out), desc && desc->logger.func);
}

/* >>groups  A sub-collective whose size and rank the caller already knows (mesh dims, the
   node-local group). A simulated Fake cannot learn the other ranks' colors, so it is handed the
   expected shape directly; every other backend splits for real and the shape is checked. */
static dm_status _dm_split_expect(dm_collective* c, int color, int key, int expect_size,
                                  int expect_rank, dm_collective** out) {
    dm_status st;
    *out = NULL;
    if (c->vt == &_dm_fake_vtable) {
        _DM_ZERO(dm_fake_desc, d);
        d.world_size = expect_size;
        d.rank = expect_rank;
        d.timeout_ms = c->timeout_ms;
        d.logger = c->logger;
        d.allocator = c->allocator;
        st = _dm_fake_create_with(&d, out);
        if (st != DM_OK) return _DM_FAIL(c, st, "fake: out of memory making a sub-collective");
        _dm_copy_name((*out)->node_name, sizeof((*out)->node_name), c->node_name);
        return DM_OK;
    }
    _DM_TRY(dm_split(c, color, key, out));
    if (!*out || (*out)->size != expect_size || (*out)->rank != expect_rank) {
        int got_size = *out ? (*out)->size : 0, got_rank = *out ? (*out)->rank : -1;
        dm_destroy(*out);
        *out = NULL;
        return _DM_FAIL(c, DM_ERR_INTERNAL, "%s: split gave rank %d of %d, expected rank %d of %d",
                        c->vt->name, got_rank, got_size, expect_rank, expect_size);
    }
    return DM_OK;
}

DM_API_IMPL dm_collective* dm_local(dm_collective* c) {
    enum { NAME = sizeof(((dm_collective*)0)->node_name) };
    char* names;
    int r, color = -1, lsize = 0, lrank = 0;
    if (!c) return NULL;
    if (c->local) return c->local;
    if (c->vt == &_dm_fake_vtable) {
        _dm_split_expect(c, 0, c->rank, c->local_size, c->local_rank, &c->local);
        return c->local;
    }
    names = (char*)_dm_malloc(&c->allocator, (size_t)NAME * (size_t)c->size);
    if (!names) { _DM_FAIL(c, DM_ERR_OUT_OF_MEMORY, "local: out of memory"); return NULL; }
    if (dm_all_gather(c, c->node_name, names, NAME, DM_UINT8) == DM_OK) {
        for (r = 0; r < c->size; r++) {
            const char* other = names + (size_t)r * NAME;
            if (strncmp(other, c->node_name, NAME) != 0) continue;
            if (color < 0) color = r;
            lsize++;
            if (r < c->rank) lrank++;
        }
        if (_dm_split_expect(c, color, c->rank, lsize, lrank, &c->local) == DM_OK) {
            c->local_rank = lrank;
            c->local_size = lsize;
        }
    }
    _dm_free(&c->allocator, names);
    return c->local;
}

DM_API_IMPL dm_status dm_main_process_first_begin(dm_collective* c, bool local_only) {
    dm_collective* g;
    if (!c) return DM_ERR_INVALID_ARG;
    g = local_only ? dm_local(c) : c;
    if (!g) return _DM_FAIL(c, DM_ERR_INTERNAL, "main_process_first: no local group (%s)", c->last_error);
    if (g->rank == 0) return DM_OK;
    if (dm_barrier(g) != DM_OK) return _DM_FAIL(c, DM_ERR_ABORTED, "main_process_first: %s", g->last_error);
    return DM_OK;
}
DM_API_IMPL dm_status dm_main_process_first_end(dm_collective* c, bool local_only) {
    dm_collective* g;
    if (!c) return DM_ERR_INVALID_ARG;
    g = local_only ? dm_local(c) : c;
    if (!g) return _DM_FAIL(c, DM_ERR_INTERNAL, "main_process_first: no local group (%s)", c->last_error);
    if (g->rank != 0) return DM_OK;
    if (dm_barrier(g) != DM_OK) return _DM_FAIL(c, DM_ERR_ABORTED, "main_process_first: %s", g->last_error);
    return DM_OK;
}

/* >>mesh */
struct dm_mesh {
    dm_collective* world;
    int ndims;
    char names[DM_MAX_DIMS][DM_MAX_DIM_NAME];
    int sizes[DM_MAX_DIMS];
    int coords[DM_MAX_DIMS];
    dm_collective* groups[DM_MAX_DIMS];
    dm_logger logger;
    dm_allocator allocator;
    char last_error[DM_LAST_ERROR_SIZE];
};

/* "dp=2 x tp=4" for messages. */
static void _dm_mesh_shape_text(const dm_mesh_desc* d, const int* sizes, char* buf, size_t cap) {
    size_t used = 0;
    int i;
    buf[0] = 0;
    for (i = 0; i < d->ndims && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%s=%d", i ? " x " : "", d->dim_names[i], sizes[i]);
}

/* The desc's logger, else the world's (the desc comment promises that default). */
static const dm_logger* _dm_mesh_desc_logger(const dm_mesh_desc* d) {
    return (d->logger.func || !d->world) ? &d->logger : &d->world->logger;
}

static dm_status _dm_mesh_check(const dm_mesh_desc* d, int* sizes, char* err, size_t cap) {
    const dm_logger* lg = _dm_mesh_desc_logger(d);
    int i, j, zero_at = -1;
    long long product = 1;      /* of the sizes given; stops growing once past the world */
    char shape[256];
    if (!d->world) return _DM_REPORT(lg, err, cap, DM_ERR_INVALID_ARG, "mesh: world is NULL");
    if (!_dm_allocator_valid(&d->allocator))
        return _DM_REPORT(lg, err, cap, DM_ERR_INVALID_ARG, "mesh: allocator needs both functions or neither");
    if (d->ndims < 1 || d->ndims > DM_MAX_DIMS)
        return _DM_REPORT(lg, err, cap, DM_ERR_INVALID_ARG, "mesh: ndims %d is not in 1..%d", d->ndims, DM_MAX_DIMS);
    for (i = 0; i < d->ndims; i++) {
        const char* n = d->dim_names[i];
        if (!n || !*n || strlen(n) >= DM_MAX_DIM_NAME)
            return _DM_REPORT(lg, err, cap, DM_ERR_INVALID_ARG,
                              "mesh: dim %d needs a name of 1..%d bytes", i, DM_MAX_DIM_NAME - 1);
        for (j = 0; j < i; j++)
            if (strcmp(d->dim_names[j], n) == 0)
                return _DM_REPORT(lg, err, cap, DM_ERR_INVALID_ARG, "mesh: dim name \"%s\" appears twice", n);
        if (d->dim_sizes[i] < 0)
            return _DM_REPORT(lg, err, cap, DM_ERR_INVALID_ARG, "mesh: dim %s has size %d", n, d->dim_sizes[i]);
        if (d->dim_sizes[i] == 0 && zero_at >= 0)
            return _DM_REPORT(lg, err, cap, DM_ERR_INVALID_ARG,
                              "mesh: dims %s and %s are both 0 (at most one size can be inferred)",
                              d->dim_names[zero_at], n);
        if (d->dim_sizes[i] == 0) zero_at = i;
        else if (product <= d->world->size) product *= d->dim_sizes[i];
        sizes[i] = d->dim_sizes[i];
    }
    /* The inferred dim takes what the others leave, when they divide the world. */
    if (zero_at >= 0 && product <= d->world->size && d->world->size % product == 0) {
        sizes[zero_at] = (int)(d->world->size / product);
        product = d->world->size;
    }
    if (zero_at >= 0 && sizes[zero_at] == 0) product = 0;
    if (product != d->world->size) {
        _dm_mesh_shape_text(d, d->dim_sizes, shape, sizeof(shape));
        return _DM_REPORT(lg, err, cap, DM_ERR_INVALID_ARG,
                          "mesh: dims (%s) do not multiply to the world size %d", shape, d->world->size);
    }
    return DM_OK;
}

/* Dim i's group: ranks equal in every other coordinate. Color = the rank with coordinate i
   zeroed (unique per group), key = coordinate i. Row-major: the last dim has stride 1. */
static dm_status _dm_mesh_build_groups(dm_mesh* m) {
    int i, stride = 1, rank = m->world->rank;
    int strides[DM_MAX_DIMS];
    for (i = m->ndims - 1; i >= 0; i--) {
        strides[i] = stride;
        m->coords[i] = (rank / stride) % m->sizes[i];
        stride *= m->sizes[i];
    }
    for (i = 0; i < m->ndims; i++) {
        dm_status st = _dm_split_expect(m->world, rank - m->coords[i] * strides[i], m->coords[i],
                                        m->sizes[i], m->coords[i], &m->groups[i]);
        if (st != DM_OK)
            return _DM_REPORT(&m->logger, m->last_error, sizeof(m->last_error), st,
                              "mesh: making the %s group failed: %s", m->names[i], m->world->last_error);
    }
    return DM_OK;
}

DM_API_IMPL dm_status dm_mesh_create(const dm_mesh_desc* desc, dm_mesh** out) {
    char err[DM_LAST_ERROR_SIZE];
    int sizes[DM_MAX_DIMS] = { 0 };
    dm_mesh* m;
    int i;
    dm_status st;
    if (out) *out = NULL;
    if (!desc) return DM_ERR_INVALID_ARG;           /* no object and no logger to tell */
    if (!out && desc->world)
        return _DM_REPORT(_dm_mesh_desc_logger(desc), desc->world->last_error, sizeof(desc->world->last_error),
                          DM_ERR_INVALID_ARG, "mesh: out is NULL");
    if (!out) return DM_ERR_INVALID_ARG;
    st = _dm_mesh_check(desc, sizes, err, sizeof(err));
    if (st != DM_OK) {
        if (desc->world) _dm_copy_name(desc->world->last_error, sizeof(desc->world->last_error), err);
        return st;
    }
    m = (dm_mesh*)_dm_calloc(desc->allocator.alloc_fn ? &desc->allocator : &desc->world->allocator, sizeof(dm_mesh));
    if (!m)
        return _DM_REPORT(_dm_mesh_desc_logger(desc), desc->world->last_error, sizeof(desc->world->last_error),
                          DM_ERR_OUT_OF_MEMORY, "mesh: out of memory");
    m->world = desc->world;
    m->ndims = desc->ndims;
    m->logger = desc->logger.func ? desc->logger : desc->world->logger;
    m->allocator = desc->allocator.alloc_fn ? desc->allocator : desc->world->allocator;
    for (i = 0; i < m->ndims; i++) {
        _dm_copy_name(m->names[i], DM_MAX_DIM_NAME, desc->dim_names[i]);
        m->sizes[i] = sizes[i];
    }
    st = _dm_mesh_build_groups(m);
    if (st != DM_OK) {
        _dm_copy_name(desc->world->last_error, sizeof(desc->world->last_error), m->last_error);
        dm_mesh_destroy(m);
        return st;
    }
    *out = m;
    return DM_OK;
}

DM_API_IMPL dm_status dm_mesh_create_dp_tp(dm_collective* world, int tp_size, dm_mesh** out) {
    _DM_ZERO(dm_mesh_desc, d);
    if (!world) return DM_ERR_INVALID_ARG;
    if (tp_size < 1) return _DM_FAIL(world, DM_ERR_INVALID_ARG, "mesh: tp_size %d must be >= 1", tp_size);
    d.world = world;
    d.ndims = 2;
    d.dim_names[0] = "dp";
    d.dim_names[1] = "tp";
    d.dim_sizes[0] = 0;
    d.dim_sizes[1] = tp_size;
    return dm_mesh_create(&d, out);
}

DM_API_IMPL void dm_mesh_destroy(dm_mesh* m) {
    dm_allocator a;
    int i;
    if (!m) return;
    for (i = 0; i < m->ndims; i++) dm_destroy(m->groups[i]);
    a = m->allocator;
    _dm_free(&a, m);
}
DM_API_IMPL int dm_mesh_ndims(const dm_mesh* m) { return m ? m->ndims : 0; }
/* Failures of the queries below are recorded on the mesh. The buffer is written only on
   failure (the mesh was allocated writable; the const is the caller's promise for successes). */
static int _dm_mesh_fail_dim(const dm_mesh* m, const char* name) {
    char dims[DM_MAX_DIMS * DM_MAX_DIM_NAME + 16];
    size_t used = 0;
    int i;
    if (!name || !*name) {
        _DM_REPORT(&m->logger, (char*)m->last_error, sizeof(m->last_error), DM_ERR_INVALID_ARG,
                   "mesh: dim must be specified. (%s name; NULL means the whole world in rank, "
                   "size and group)", name ? "an empty" : "a NULL");
        return -1;
    }
    dims[0] = 0;
    for (i = 0; i < m->ndims; i++)
        used += (size_t)snprintf(dims + used, sizeof(dims) - used, "%s%s", i ? ", " : "", m->names[i]);
    _DM_REPORT(&m->logger, (char*)m->last_error, sizeof(m->last_error), DM_ERR_INVALID_ARG,
               "mesh: no dim named \"%.*s\" (dims: %s)", DM_MAX_DIM_NAME, name, dims);
    return -1;
}
/* Index of name or -1, silently: for the accessors where a missing dim has a meaning. */
static int _dm_mesh_find(const dm_mesh* m, const char* name) {
    int i;
    if (!m || !name) return -1;
    for (i = 0; i < m->ndims; i++)
        if (strcmp(m->names[i], name) == 0) return i;
    return -1;
}
DM_API_IMPL const char* dm_mesh_dim_name(const dm_mesh* m, int i) {
    if (!m) return NULL;
    if (i >= 0 && i < m->ndims) return m->names[i];
    _DM_REPORT(&m->logger, (char*)m->last_error, sizeof(m->last_error), DM_ERR_INVALID_ARG,
               "mesh: dim index %d is not in 0..%d", i, m->ndims - 1);
    return NULL;
}
DM_API_IMPL int dm_mesh_dim_index(const dm_mesh* m, const char* name) {
    int i;
    if (!m) return -1;
    i = _dm_mesh_find(m, name);
    return i >= 0 ? i : _dm_mesh_fail_dim(m, name);
}
/* Index of name, or -1 with a message on the mesh; name NULL -> DM_MAX_DIMS (the world). */
static int _dm_mesh_lookup(const dm_mesh* m, const char* name) {
    int i;
    if (!name) return DM_MAX_DIMS;
    i = _dm_mesh_find(m, name);
    return i >= 0 ? i : _dm_mesh_fail_dim(m, name);
}
DM_API_IMPL int dm_mesh_rank(const dm_mesh* m, const char* name) {
    int i;
    if (!m) return -1;
    i = _dm_mesh_lookup(m, name);
    return i < 0 ? -1 : i == DM_MAX_DIMS ? m->world->rank : m->coords[i];
}
DM_API_IMPL int dm_mesh_size(const dm_mesh* m, const char* name) {
    int i;
    if (!m) return -1;
    i = _dm_mesh_lookup(m, name);
    return i < 0 ? -1 : i == DM_MAX_DIMS ? m->world->size : m->sizes[i];
}
DM_API_IMPL dm_collective* dm_mesh_group(dm_mesh* m, const char* name) {
    int i;
    if (!m) return NULL;
    i = _dm_mesh_lookup(m, name);
    return i < 0 ? NULL : i == DM_MAX_DIMS ? m->world : m->groups[i];
}
DM_API_IMPL dm_collective* dm_mesh_world(const dm_mesh* m) { return m ? m->world : NULL; }
DM_API_IMPL const char* dm_mesh_last_error(const dm_mesh* m) { return m ? m->last_error : "no mesh (NULL)"; }
/* A missing dp or tp dim is size 1, rank 0 (not a failure); a NULL mesh stays -1. */
DM_API_IMPL int dm_mesh_dp_rank(const dm_mesh* m) { return m && _dm_mesh_find(m, "dp") < 0 ? 0 : dm_mesh_rank(m, "dp"); }
DM_API_IMPL int dm_mesh_dp_world_size(const dm_mesh* m) { return m && _dm_mesh_find(m, "dp") < 0 ? 1 : dm_mesh_size(m, "dp"); }
DM_API_IMPL int dm_mesh_tp_rank(const dm_mesh* m) { return m && _dm_mesh_find(m, "tp") < 0 ? 0 : dm_mesh_rank(m, "tp"); }
DM_API_IMPL int dm_mesh_tp_world_size(const dm_mesh* m) { return m && _dm_mesh_find(m, "tp") < 0 ? 1 : dm_mesh_size(m, "tp"); }
DM_API_IMPL dm_collective* dm_mesh_tp_world(dm_mesh* m) { return dm_mesh_group(m, "tp"); }

/* >>strategy  LLaMA-Factory's DistributedStrategy with its exact messages. */
struct dm_strategy {
    dm_collective* world;
    int sizes[DM_DIM_COUNT];
    dm_mesh* model;             /* (mp_replicate, mp_shard) */
    dm_mesh* data;              /* (dp, cp) */
    dm_logger logger;           /* the desc's, else the world's */
    dm_allocator allocator;     /* the desc's, else the world's; frees the strategy itself */
    char last_error[DM_LAST_ERROR_SIZE];
};

DM_API_IMPL const char* dm_dim_name(dm_dim dim) {
    static const char* names[DM_DIM_COUNT] = { "mp_replicate", "mp_shard", "dp", "cp" };
    return ((unsigned)dim < DM_DIM_COUNT) ? names[dim] : "invalid";
}

static bool _dm_strategy_signs(int a, int b, const char* a_name, const char* b_name, char* error, size_t cap) {
    if (a >= 0 && b >= 0) return true;
    snprintf(error, cap, "%s and %s must be >= 0 (0 = default), got %d and %d.", a_name, b_name, a, b);
    return false;
}
/* One pair of the seed: a (default 1 or given) and b (default world / a) multiply to world;
   the sizes are not negative (checked before). */
static bool _dm_strategy_pair(int world, int a_in, int b_in, bool b_default_from_a, const char* a_name,
                              const char* b_name, int* a, int* b, char* error, size_t cap) {
    if (b_default_from_a) { *a = _dm_def(a_in, 1); *b = b_in; }
    else                  { *b = _dm_def(b_in, 1); *a = a_in; }
    if (b_default_from_a && *b == 0) {
        if (world % *a != 0) {
            snprintf(error, cap, "world_size %d is not divisible by %s %d.", world, a_name, *a);
            return false;
        }
        *b = world / *a;
    } else if (!b_default_from_a && *a == 0) {
        if (world % *b != 0) {
            snprintf(error, cap, "world_size %d is not divisible by %s %d.", world, b_name, *b);
            return false;
        }
        *a = world / *b;
    } else if ((long long)*a * *b != world) {
        snprintf(error, cap, "%s * %s must equal to world_size, got %d * %d != %d.", a_name, b_name, *a, *b, world);
        return false;
    }
    return true;
}

DM_API_IMPL dm_status dm_strategy_validate(const dm_strategy_desc* desc, int world_size,
                                           int out_sizes[DM_DIM_COUNT], char* error, size_t error_size) {
    char scratch[DM_LAST_ERROR_SIZE];
    int i;
    if (!error || !error_size) { error = scratch; error_size = sizeof(scratch); }
    error[0] = 0;
    if (!desc || !out_sizes) {
        snprintf(error, error_size, "strategy: %s is NULL", !desc ? "desc" : "out_sizes");
        return DM_ERR_INVALID_ARG;
    }
    if (world_size < 1) {
        snprintf(error, error_size, "strategy: world_size %d must be >= 1", world_size);
        return DM_ERR_INVALID_ARG;
    }
    /* Negative sizes are refused at every world size (the seed does not check them). */
    if (!_dm_strategy_signs(desc->mp_replicate_size, desc->mp_shard_size, "mp_replicate_size",
                            "mp_shard_size", error, error_size) ||
        !_dm_strategy_signs(desc->dp_size, desc->cp_size, "dp_size", "cp_size", error, error_size))
        return DM_ERR_INVALID_ARG;
    if (world_size == 1) {  /* not distributed: every size is 1 (the seed keeps mp_replicate, cp) */
        for (i = 0; i < DM_DIM_COUNT; i++) out_sizes[i] = 1;
        return DM_OK;
    }
    if (!_dm_strategy_pair(world_size, desc->mp_replicate_size, desc->mp_shard_size, true, "mp_replicate_size",
                           "mp_shard_size", &out_sizes[DM_DIM_MP_REPLICATE], &out_sizes[DM_DIM_MP_SHARD],
                           error, error_size) ||
        !_dm_strategy_pair(world_size, desc->dp_size, desc->cp_size, false, "dp_size", "cp_size",
                           &out_sizes[DM_DIM_DP], &out_sizes[DM_DIM_CP], error, error_size))
        return DM_ERR_INVALID_ARG;
    return DM_OK;
}

static dm_status _dm_strategy_mesh(dm_strategy* s, dm_dim a, dm_dim b, dm_mesh** out) {
    _DM_ZERO(dm_mesh_desc, d);
    d.world = s->world;
    d.ndims = 2;
    d.dim_names[0] = dm_dim_name(a);
    d.dim_names[1] = dm_dim_name(b);
    d.dim_sizes[0] = s->sizes[a];
    d.dim_sizes[1] = s->sizes[b];
    d.logger = s->logger;
    d.allocator = s->allocator;
    return dm_mesh_create(&d, out);
}

DM_API_IMPL dm_status dm_strategy_create(const dm_strategy_desc* desc, dm_strategy** out) {
    dm_strategy* s;
    int sizes[DM_DIM_COUNT];
    char err[DM_LAST_ERROR_SIZE];
    const dm_logger* lg;
    dm_collective* w;
    dm_status st;
    if (out) *out = NULL;
    if (!desc) return DM_ERR_INVALID_ARG;           /* no object and no logger to tell */
    w = desc->world;
    if (!w) return _DM_REPORT(&desc->logger, err, sizeof(err), DM_ERR_INVALID_ARG, "strategy: world is NULL");
    /* No strategy exists yet: failures of create are recorded on the world. */
    lg = desc->logger.func ? &desc->logger : &w->logger;
    if (!out) return _DM_REPORT(lg, w->last_error, sizeof(w->last_error), DM_ERR_INVALID_ARG, "strategy: out is NULL");
    if (!_dm_allocator_valid(&desc->allocator))
        return _DM_REPORT(lg, w->last_error, sizeof(w->last_error), DM_ERR_INVALID_ARG,
                          "strategy: allocator needs both alloc_fn and free_fn, or neither");
    st = dm_strategy_validate(desc, w->size, sizes, err, sizeof(err));
    if (st != DM_OK) return _DM_REPORT(lg, w->last_error, sizeof(w->last_error), st, "%s", err);
    s = (dm_strategy*)_dm_calloc(desc->allocator.alloc_fn ? &desc->allocator : &w->allocator, sizeof(dm_strategy));
    if (!s) return _DM_REPORT(lg, w->last_error, sizeof(w->last_error), DM_ERR_OUT_OF_MEMORY, "strategy: out of memory");
    s->world = w;
    s->logger = *lg;
    s->allocator = desc->allocator.alloc_fn ? desc->allocator : w->allocator;
    memcpy(s->sizes, sizes, sizeof(sizes));
    /* A mesh that fails has recorded and logged its message on the world already. */
    st = _dm_strategy_mesh(s, DM_DIM_MP_REPLICATE, DM_DIM_MP_SHARD, &s->model);
    if (st == DM_OK) st = _dm_strategy_mesh(s, DM_DIM_DP, DM_DIM_CP, &s->data);
    if (st != DM_OK) { dm_strategy_destroy(s); return st; }
    *out = s;
    return DM_OK;
}
DM_API_IMPL void dm_strategy_destroy(dm_strategy* s) {
    dm_allocator a;
    if (!s) return;
    dm_mesh_destroy(s->model);
    dm_mesh_destroy(s->data);
    a = s->allocator;
    _dm_free(&a, s);
}
/* The seed's get_device_mesh(dim=None) raises ValueError("dim must be specified."); C's
   dm_dim has no None, so a value outside the enum stands for it in size, rank and group. The
   buffer is written only on failure (see _dm_mesh_fail_dim on the const). */
static bool _dm_strategy_dim_ok(const dm_strategy* s, dm_dim dim) {
    if ((unsigned)dim < DM_DIM_COUNT) return true;
    _DM_REPORT(&s->logger, (char*)s->last_error, sizeof(s->last_error), DM_ERR_INVALID_ARG,
               "dim must be specified.");
    return false;
}
static dm_mesh* _dm_strategy_mesh_of(const dm_strategy* s, dm_dim dim) {
    return (dim == DM_DIM_DP || dim == DM_DIM_CP) ? s->data : s->model;
}
DM_API_IMPL int dm_strategy_size(const dm_strategy* s, dm_dim dim) {
    return (s && _dm_strategy_dim_ok(s, dim)) ? s->sizes[dim] : -1;
}
/* Both meshes hold their two dims, so the mesh lookups below cannot miss. */
DM_API_IMPL int dm_strategy_rank(const dm_strategy* s, dm_dim dim) {
    if (!s || !_dm_strategy_dim_ok(s, dim)) return -1;
    return dm_mesh_rank(_dm_strategy_mesh_of(s, dim), dm_dim_name(dim));
}
DM_API_IMPL dm_collective* dm_strategy_group(dm_strategy* s, dm_dim dim) {
    if (!s || !_dm_strategy_dim_ok(s, dim)) return NULL;
    return dm_mesh_group(_dm_strategy_mesh_of(s, dim), dm_dim_name(dim));
}
DM_API_IMPL dm_mesh* dm_strategy_model_mesh(dm_strategy* s) { return s ? s->model : NULL; }
DM_API_IMPL dm_mesh* dm_strategy_data_mesh(dm_strategy* s) { return s ? s->data : NULL; }
DM_API_IMPL const char* dm_strategy_last_error(const dm_strategy* s) { return s ? s->last_error : "no strategy (NULL)"; }

/* >>init  Without the TCP backend only a world of one can be built from the environment. */
#if !defined(DISTMESH_TCP)
static dm_status _dm_init_checked(const dm_init_desc* desc, dm_collective** out) {
    _DM_ZERO(dm_init_desc, d);
    _DM_ZERO(dm_fake_desc, f);
    dm_env env;
    char err[DM_LAST_ERROR_SIZE];
    dm_status st;
    if (!out) return _DM_REPORT(NULL, err, sizeof(err), DM_ERR_INVALID_ARG, "init: out is NULL");
    *out = NULL;
    if (desc) d = *desc;
    st = dm_env_detect(&env);
    if (st != DM_OK) return _DM_REPORT(&d.logger, err, sizeof(err), st, "%s", env.error);
    _dm_create_rank(env.rank);
    if (env.world_size > 1)
        return _DM_REPORT(&d.logger, err, sizeof(err), DM_ERR_UNSUPPORTED,
                          "init: the environment (%s) asks for %d ranks but this build has no transport "
                          "(define DISTMESH_TCP)", env.source, env.world_size);
    f.timeout_ms = d.timeout_ms;
    f.logger = d.logger;
    f.allocator = d.allocator;
    return dm_fake_create(&f, out);
}
DM_API_IMPL dm_status dm_init(const dm_init_desc* desc, dm_collective** out) {
    _dm_create_begin();
    return _dm_create_end(_dm_init_checked(desc, out), desc && desc->logger.func);
}
#endif
_DM_COLD_END
_DM_WARM_END
#endif /* DISTMESH_IMPL_INCLUDED && !DISTMESH_CORE_IMPL_INCLUDED */

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
