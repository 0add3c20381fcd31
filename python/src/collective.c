/* distmesh._C: Comm, the collective, and the holders it shares with Mesh and Strategy (dmpy.h
   says what the other files hold).

   SECTIONS
     >>holders  Comm, Mesh, Strategy: who owns which handle; closing a holder closes its
                dependents first
     >>comm     Comm: accessors, collectives, groups
*/
#include "dmpy.h"

/* ============================================================================================ */
/* >>holders  Comm (a dm_collective), Mesh (dm_mesh) and Strategy (dm_strategy) share this head.
   owner: the holder whose handle this one's lives in (a mesh's group -> the mesh, the mesh ->
   its world, dm_local's group -> its parent), held strongly, so owners outlive dependents in
   Python. close() on an owner first closes every open holder whose owner chain reaches it
   (the registry is the list of open holders), then releases its own handle (when owns).
   dmpy_holder and dmpy_comm (a holder with its requests, log and device handling): dmpy.h. */
dmpy_holder* dmpy_holders;

void dmpy_holder_link(dmpy_holder* h) {
    h->prev = NULL;
    h->next = dmpy_holders;
    if (dmpy_holders) dmpy_holders->prev = h;
    dmpy_holders = h;
}
static void dmpy_holder_unlink(dmpy_holder* h) {
    if (h->prev) h->prev->next = h->next;
    else if (dmpy_holders == h) dmpy_holders = h->next;
    if (h->next) h->next->prev = h->prev;
    h->prev = h->next = NULL;
}
static bool dmpy_depends_on(const dmpy_holder* x, const dmpy_holder* h) {
    for (x = x->owner; x; x = x->owner)
        if (x == h) return true;
    return false;
}
/* The handle of an open holder whose owners are open too; else ValueError. */
void* dmpy_handle(void* self) {
    dmpy_holder* h = (dmpy_holder*)self;
    dmpy_holder* x;
    for (x = h; x; x = x->owner)
        if (!x->handle) {
            PyErr_SetString(PyExc_ValueError, x == h ? "this distmesh object is closed"
                                                     : "this distmesh object belongs to one that is closed");
            return NULL;
        }
    return h->handle;
}
int dmpy_close(dmpy_holder* h) {
    dmpy_holder* x;
    void* handle;
    if (!h->handle) return 0;
    if (h->busy > 0) {
        dmpy_raise(DM_ERR_BUSY, "close(): a call is running on this object in another thread");
        return -1;
    }
    for (;;) {                  /* dependents first; the registry changes as they close */
        for (x = dmpy_holders; x; x = x->next)
            if (x != h && x->handle && dmpy_depends_on(x, h)) break;
        if (!x) break;
        if (dmpy_close(x) < 0) return -1;
    }
    if (h->kind == DMPY_COMM && dmpy_request_finish_all((dmpy_comm*)h) < 0) return -1;
    if (h->busy > 0) {
        dmpy_raise(DM_ERR_BUSY, "close(): a call is running on this object in another thread");
        return -1;
    }
    handle = h->handle;
    h->handle = NULL;
    dmpy_holder_unlink(h);
    if (!h->owns) return 0;
    Py_BEGIN_ALLOW_THREADS
    if (h->kind == DMPY_COMM) dm_destroy((dm_collective*)handle);
    else if (h->kind == DMPY_MESH) dm_mesh_destroy((dm_mesh*)handle);
    else dm_strategy_destroy((dm_strategy*)handle);
    Py_END_ALLOW_THREADS
    return 0;
}
void dmpy_holder_dealloc_common(dmpy_holder* h) {
    if (h->weakrefs) PyObject_ClearWeakRefs((PyObject*)h);
    if (h->handle) {
        if (DMPY_FINALIZING()) {  /* leave the handle to the process's end */
            h->handle = NULL;
            dmpy_holder_unlink(h);
        } else if (dmpy_close(h) < 0) {
            PyErr_WriteUnraisable((PyObject*)h);
        }
    }
    Py_CLEAR(h->owner);
    Py_CLEAR(h->keep);
}

/* ============================================================================================ */
/* >>comm */
PyTypeObject* dmpy_comm_cls;
PyObject* dmpy_op_converter;

dm_collective* dmpy_comm_handle(PyObject* self) { return (dm_collective*)dmpy_handle(self); }

/* How c takes CUDA memory (>>device), from its backend (split, local and mesh groups included). */
static dmpy_dev dmpy_dev_of(dm_collective* c) {
    dmpy_dev d;
    d.kind = DMPY_DEV_NONE;
    d.stream = 0;
    d.backend = dm_backend_name(c);
#if defined(DISTMESH_NCCL)
    if (strcmp(d.backend, "nccl") == 0) {
        d.kind = DMPY_DEV_STREAM;
        d.stream = (Py_ssize_t)(intptr_t)dm_nccl_stream(c);
        if (d.stream == 0) d.stream = 1;        /* DLPack: 0 is ambiguous; 1 the legacy default stream */
    } else if (strcmp(d.backend, "tcp") == 0) {
        d.kind = DMPY_DEV_STAGED;
        d.stream = 1;
    }
#endif
    return d;
}

/* A Python object for c, of class cls (NULL: the registered Collective class). owns: close()
   destroys c; owner: the holder c lives in (borrowed handles). On failure an owned c is
   destroyed. */
PyObject* dmpy_comm_wrap(PyTypeObject* cls, dm_collective* c, dmpy_holder* owner, bool owns, dmpy_log* lg,
                         PyObject* keep) {
    dmpy_comm* o;
    if (!cls) cls = dmpy_comm_cls ? dmpy_comm_cls : &dmpy_CommType;
    o = (dmpy_comm*)cls->tp_alloc(cls, 0);
    if (!o) {
        if (owns) { Py_BEGIN_ALLOW_THREADS dm_destroy(c); Py_END_ALLOW_THREADS }
        return NULL;
    }
    o->h.handle = c;
    o->h.owner = (dmpy_holder*)Py_XNewRef((PyObject*)owner);
    o->h.keep = Py_XNewRef(keep);
    o->h.kind = DMPY_COMM;
    o->h.owns = owns;
    o->log = dmpy_log_ref(lg);
    o->dev = dmpy_dev_of(c);
    dmpy_holder_link(&o->h);
    return (PyObject*)o;
}
static PyObject* dmpy_comm_refuse(PyTypeObject* t, PyObject* a, PyObject* k) {
    (void)t; (void)a; (void)k;
    PyErr_SetString(PyExc_TypeError, "distmesh collectives are made by distmesh.init(), connect(), connect_nccl(), "
                    "FakeCollective(rank, world_size), thread_world(n, fn) or a Mesh / DistributedInterface");
    return NULL;
}
static void dmpy_comm_dealloc(PyObject* self) {
    dmpy_comm* o = (dmpy_comm*)self;
    PyObject_GC_UnTrack(self);
    dmpy_holder_dealloc_common(&o->h);
    dmpy_log_unref(o->log);
    o->log = NULL;
    Py_TYPE(self)->tp_free(self);
}
int dmpy_holder_traverse(PyObject* self, visitproc visit, void* arg) {
    dmpy_holder* h = (dmpy_holder*)self;
    Py_VISIT(h->owner);
    Py_VISIT(h->keep);
    return 0;
}

/* accessors: each reads one thing of the collective (raising if it is closed) and makes it a
   Python object with `make`, an expression in c */
#define DMPY_GET(name, make)                                                                 \
    static PyObject* dmpy_get_##name(PyObject* self, void* closure) {                        \
        dm_collective* c = dmpy_comm_handle(self);                                           \
        (void)closure;                                                                       \
        return c ? (make) : NULL;                                                            \
    }
DMPY_GET(rank, PyLong_FromLong(dm_rank(c)))
DMPY_GET(world_size, PyLong_FromLong(dm_world_size(c)))
DMPY_GET(local_rank, PyLong_FromLong(dm_local_rank(c)))
DMPY_GET(local_world_size, PyLong_FromLong(dm_local_world_size(c)))
DMPY_GET(is_master, PyBool_FromLong(dm_is_master(c)))
DMPY_GET(is_local_master, PyBool_FromLong(dm_is_local_master(c)))
DMPY_GET(backend, PyUnicode_FromString(dm_backend_name(c)))
DMPY_GET(transport, PyUnicode_FromString(dm_transport_name(c)))
DMPY_GET(last_algorithm, PyUnicode_FromString(dm_last_algorithm(c)))
DMPY_GET(last_error, PyUnicode_FromString(dm_last_error(c)))
DMPY_GET(sequence, PyLong_FromUnsignedLongLong((unsigned long long)dm_sequence(c)))
DMPY_GET(device, Py_BuildValue("(si)", dm_default_device(c).type == DM_DEVICE_CUDA ? "cuda" : "cpu",
                               dm_default_device(c).index))
#undef DMPY_GET
/* The CUDA stream (as an int) the collective's work is queued on: NCCL's; None elsewhere. */
static PyObject* dmpy_get_cuda_stream(PyObject* self, void* closure) {
    (void)closure;
    if (!dmpy_comm_handle(self)) return NULL;
    if (((dmpy_comm*)self)->dev.kind != DMPY_DEV_STREAM) Py_RETURN_NONE;
    return PyLong_FromSsize_t(((dmpy_comm*)self)->dev.stream);
}
static PyObject* dmpy_get_closed(PyObject* self, void* closure) {
    dmpy_holder* h;
    (void)closure;
    for (h = (dmpy_holder*)self; h; h = h->owner)
        if (!h->handle) Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

/* The op argument: an int (distmesh.ReduceOp), else what the registered converter makes of it
   (torch's ReduceOp, a name). */
static int dmpy_reduce_op(PyObject* o, dm_reduce_op* out) {
    long v;
    if (!PyLong_Check(o)) {     /* not __index__: torch's RedOpType numbers its ops otherwise */
        PyObject* conv;
        if (!dmpy_op_converter) {
            PyErr_Format(PyExc_TypeError, "op must be a distmesh.ReduceOp, not %.100s", Py_TYPE(o)->tp_name);
            return -1;
        }
        conv = PyObject_CallOneArg(dmpy_op_converter, o);
        if (!conv) return -1;
        v = PyLong_AsLong(conv);
        Py_DECREF(conv);
    } else {
        v = PyLong_AsLong(o);
    }
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < 0 || v >= DM_REDUCE_OP_COUNT) {
        PyErr_Format(PyExc_ValueError, "op %ld is not a distmesh.ReduceOp (SUM, PROD, MAX, MIN, MEAN)", v);
        return -1;
    }
    *out = (dm_reduce_op)v;
    return 0;
}

#define DMPY_PARSE(fn, nreq, ...)                                                            \
    static const char* const names_[] = { __VA_ARGS__ };                                     \
    PyObject* a_[sizeof(names_) / sizeof(names_[0])];                                        \
    dm_collective* c;                                                                        \
    if (dmpy_args(fn, args, nargs, kwnames, names_, (int)(sizeof(names_) / sizeof(names_[0])), (nreq), a_) < 0) \
        return NULL;                                                                         \
    if (!(c = dmpy_comm_handle(self))) return NULL

static PyObject* dmpy_barrier(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    dmpy_op o;
    int async_op;
    DMPY_PARSE("barrier", 0, "async_op");
    if (dmpy_bool(a_[0], &async_op) < 0) return NULL;
    dmpy_op_init(&o, DM_OP_BARRIER);
    return dmpy_run((dmpy_comm*)self, &o, async_op);
}

/* all_reduce's compress argument: None (DM_COMPRESS_DEFAULT: DISTMESH_COMPRESS decides) or a
   mode's name. */
static int dmpy_compress_arg(PyObject* o, dm_compress* out) {
    static const dm_compress modes[] = { DM_COMPRESS_NONE, DM_COMPRESS_BF16, DM_COMPRESS_INT8 };
    const char* name;
    size_t i;
    *out = DM_COMPRESS_DEFAULT;
    if (!o || o == Py_None) return 0;
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError, "compress must be None or a str (\"none\", \"bf16\", \"int8\"), not %.100s",
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    if (!(name = PyUnicode_AsUTF8(o))) return -1;
    for (i = 0; i < sizeof(modes) / sizeof(modes[0]); i++)
        if (strcmp(name, dm_compress_name(modes[i])) == 0) {
            *out = modes[i];
            return 0;
        }
    PyErr_Format(PyExc_ValueError, "compress must be None, \"none\", \"bf16\" or \"int8\", got %R", o);
    return -1;
}
/* all_reduce's state argument: None or a CompressState not in use by another call, then held
   by o until the call completes. */
static int dmpy_state_arg(PyObject* s, dmpy_op* o) {
    dmpy_cstate* st;
    if (!s || s == Py_None) return 0;
    if (!PyObject_TypeCheck(s, &dmpy_CompressStateType)) {
        PyErr_Format(PyExc_TypeError, "state must be a distmesh.CompressState, not %.100s", Py_TYPE(s)->tp_name);
        return -1;
    }
    st = (dmpy_cstate*)s;
    if (st->inuse) {
        dmpy_raise(DM_ERR_BUSY, "all_reduce(): this CompressState is held by a call not waited for yet "
                                "(one call at a time per state: wait for it first)");
        return -1;
    }
    st->inuse = true;
    o->state = (dmpy_cstate*)Py_NewRef(s);
    o->c.compress_state = st->s;
    return 0;
}

static PyObject* dmpy_all_reduce(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    const dmpy_dev* dev = &((dmpy_comm*)self)->dev;
    dmpy_op o;
    int async_op;
    DMPY_PARSE("all_reduce", 2, "tensor", "op", "send", "async_op", "compress", "state");
    dmpy_op_init(&o, DM_OP_ALL_REDUCE);
    if (dmpy_reduce_op(a_[1], &o.c.op) < 0 || dmpy_bool(a_[3], &async_op) < 0 ||
        dmpy_compress_arg(a_[4], &o.c.compress) < 0)
        return NULL;
    if (dmpy_buf_get(dev, a_[0], "tensor", DMPY_WRITE | DMPY_REDUCE, &o.b[0]) < 0) return NULL;
    if (a_[2] && a_[2] != Py_None) {
        if (dmpy_buf_get(dev, a_[2], "send", DMPY_REDUCE, &o.b[1]) < 0 ||
            dmpy_same_dtype(&o.b[1], "send", &o.b[0], "tensor") < 0 ||
            dmpy_size_is(&o.b[1], "send", o.b[0].nbytes, "tensor's size") < 0)
            goto fail;
        o.c.send = o.b[1].ptr;
    }
    if (dmpy_state_arg(a_[5], &o) < 0) goto fail;
    o.c.recv = o.b[0].ptr;
    o.c.count = o.b[0].count;
    o.c.dtype = (dm_dtype)o.b[0].dtype;
    return dmpy_run((dmpy_comm*)self, &o, async_op);
fail:
    dmpy_op_release(&o);
    return NULL;
}

static PyObject* dmpy_all_gather(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    const dmpy_dev* dev = &((dmpy_comm*)self)->dev;
    dmpy_op o;
    int async_op;
    size_t W;
    DMPY_PARSE("all_gather", 2, "output", "input", "async_op");
    W = (size_t)dm_world_size(c);
    if (dmpy_bool(a_[2], &async_op) < 0) return NULL;
    dmpy_op_init(&o, DM_OP_ALL_GATHER);
    if (dmpy_buf_get(dev, a_[0], "output", DMPY_WRITE, &o.b[0]) < 0 ||
        dmpy_buf_get(dev, a_[1], "input", DMPY_READ, &o.b[1]) < 0 ||
        dmpy_same_dtype(&o.b[0], "output", &o.b[1], "input") < 0 ||
        dmpy_size_is(&o.b[0], "output", W * o.b[1].nbytes, "world_size x input's size") < 0)
        goto fail;
    o.c.send = o.b[1].ptr;
    o.c.recv = o.b[0].ptr;
    o.c.count = dmpy_move_count(&o.b[1]);
    o.c.dtype = dmpy_move_dtype(&o.b[1]);
    return dmpy_run((dmpy_comm*)self, &o, async_op);
fail:
    dmpy_op_release(&o);
    return NULL;
}

static PyObject* dmpy_all_gather_to_list(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    const dmpy_dev* dev = &((dmpy_comm*)self)->dev;
    dmpy_op o;
    int async_op;
    Py_ssize_t W, i;
    PyObject* seq = NULL;
    DMPY_PARSE("all_gather_to_list", 2, "outputs", "input", "async_op");
    W = dm_world_size(c);
    if (dmpy_bool(a_[2], &async_op) < 0) return NULL;
    dmpy_op_init(&o, DM_OP_ALL_GATHER_TO_LIST);
    if (dmpy_buf_get(dev, a_[1], "input", DMPY_READ, &o.b[0]) < 0) return NULL;
    seq = PySequence_Fast(a_[0], "outputs must be a list of world_size buffers");
    if (!seq) goto fail;
    if (PySequence_Fast_GET_SIZE(seq) != W) {
        PyErr_Format(PyExc_ValueError, "outputs holds %zd buffers; all_gather_to_list needs world_size (%zd)",
                     PySequence_Fast_GET_SIZE(seq), W);
        goto fail;
    }
    o.many = (dmpy_buf*)PyMem_Calloc((size_t)W, sizeof(dmpy_buf));
    o.ptrs = (void**)PyMem_Calloc((size_t)W, sizeof(void*));
    if (!o.many || !o.ptrs) { PyErr_NoMemory(); goto fail; }
    for (i = 0; i < W; i++) {
        char what[48];
        snprintf(what, sizeof(what), "outputs[%zd]", i);
        if (dmpy_buf_get(dev, PySequence_Fast_GET_ITEM(seq, i), what, DMPY_WRITE, &o.many[i]) < 0) goto fail;
        o.nmany = i + 1;
        if (dmpy_same_dtype(&o.many[i], what, &o.b[0], "input") < 0 ||
            dmpy_size_is(&o.many[i], what, o.b[0].nbytes, "input's size") < 0)
            goto fail;
        o.ptrs[i] = o.many[i].ptr;
    }
    Py_CLEAR(seq);
    o.c.recvs = o.ptrs;
    o.c.send = o.b[0].ptr;
    o.c.count = dmpy_move_count(&o.b[0]);
    o.c.dtype = dmpy_move_dtype(&o.b[0]);
    return dmpy_run((dmpy_comm*)self, &o, async_op);
fail:
    Py_XDECREF(seq);
    dmpy_op_release(&o);
    return NULL;
}

static PyObject* dmpy_reduce_scatter(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    const dmpy_dev* dev = &((dmpy_comm*)self)->dev;
    dmpy_op o;
    int async_op;
    size_t W;
    DMPY_PARSE("reduce_scatter", 3, "output", "input", "op", "async_op");
    W = (size_t)dm_world_size(c);
    dmpy_op_init(&o, DM_OP_REDUCE_SCATTER);
    if (dmpy_reduce_op(a_[2], &o.c.op) < 0 || dmpy_bool(a_[3], &async_op) < 0) return NULL;
    if (dmpy_buf_get(dev, a_[0], "output", DMPY_WRITE | DMPY_REDUCE, &o.b[0]) < 0 ||
        dmpy_buf_get(dev, a_[1], "input", DMPY_REDUCE, &o.b[1]) < 0 ||
        dmpy_same_dtype(&o.b[1], "input", &o.b[0], "output") < 0 ||
        dmpy_size_is(&o.b[1], "input", W * o.b[0].nbytes, "world_size x output's size") < 0)
        goto fail;
    o.c.send = o.b[1].ptr;
    o.c.recv = o.b[0].ptr;
    o.c.count = o.b[0].count;
    o.c.dtype = (dm_dtype)o.b[0].dtype;
    return dmpy_run((dmpy_comm*)self, &o, async_op);
fail:
    dmpy_op_release(&o);
    return NULL;
}

static PyObject* dmpy_broadcast(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    const dmpy_dev* dev = &((dmpy_comm*)self)->dev;
    dmpy_op o;
    int async_op;
    long root;
    DMPY_PARSE("broadcast", 1, "tensor", "source_rank", "async_op");
    if (dmpy_int(a_[1], "source_rank", 0, INT_MIN, INT_MAX, &root) < 0 || dmpy_bool(a_[2], &async_op) < 0)
        return NULL;
    dmpy_op_init(&o, DM_OP_BROADCAST);
    if (dmpy_buf_get(dev, a_[0], "tensor", root == dm_rank(c) ? DMPY_READ : DMPY_WRITE, &o.b[0]) < 0) return NULL;
    o.c.recv = o.b[0].ptr;
    o.c.count = dmpy_move_count(&o.b[0]);
    o.c.dtype = dmpy_move_dtype(&o.b[0]);
    o.c.root = (int)root;
    return dmpy_run((dmpy_comm*)self, &o, async_op);
}

static PyObject* dmpy_reduce(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    const dmpy_dev* dev = &((dmpy_comm*)self)->dev;
    dmpy_op o;
    int async_op;
    long root;
    DMPY_PARSE("reduce", 3, "tensor", "root", "op", "async_op");
    dmpy_op_init(&o, DM_OP_REDUCE);
    if (dmpy_int(a_[1], "root", 0, INT_MIN, INT_MAX, &root) < 0 || dmpy_reduce_op(a_[2], &o.c.op) < 0 ||
        dmpy_bool(a_[3], &async_op) < 0)
        return NULL;
    if (dmpy_buf_get(dev, a_[0], "tensor", (root == dm_rank(c) ? DMPY_WRITE : DMPY_READ) | DMPY_REDUCE, &o.b[0]) < 0)
        return NULL;
    o.c.send = o.c.recv = o.b[0].ptr;       /* in place at the root; read only elsewhere */
    o.c.count = o.b[0].count;
    o.c.dtype = (dm_dtype)o.b[0].dtype;
    o.c.root = (int)root;
    return dmpy_run((dmpy_comm*)self, &o, async_op);
}

/* gather and scatter, mirror images: the small buffer on every rank (gather's input, scatter's
   output), the root's world_size times larger one (gather's output, scatter's input). */
static PyObject* dmpy_rooted_many(PyObject* self, dm_op_kind kind, PyObject* small, PyObject* big,
                                  PyObject* root_arg, PyObject* async_arg, dm_collective* c) {
    const dmpy_dev* dev = &((dmpy_comm*)self)->dev;
    bool gather = kind == DM_OP_GATHER;
    const char* small_name = gather ? "input" : "output";
    const char* big_name = gather ? "output" : "input";
    char big_at_root[32];
    dmpy_op o;
    int async_op;
    long root;
    size_t W = (size_t)dm_world_size(c);
    if (dmpy_int(root_arg, "root", 0, INT_MIN, INT_MAX, &root) < 0 || dmpy_bool(async_arg, &async_op) < 0) return NULL;
    dmpy_op_init(&o, kind);
    if (dmpy_buf_get(dev, small, small_name, gather ? DMPY_READ : DMPY_WRITE, &o.b[0]) < 0) return NULL;
    if (root == dm_rank(c)) {
        snprintf(big_at_root, sizeof(big_at_root), "%s (at the root)", big_name);
        if (dmpy_buf_get(dev, big, big_at_root, gather ? DMPY_WRITE : DMPY_READ, &o.b[1]) < 0 ||
            dmpy_same_dtype(&o.b[1], big_name, &o.b[0], small_name) < 0 ||
            dmpy_size_is(&o.b[1], big_name, W * o.b[0].nbytes, gather ? "world_size x input's size" : "world_size x output's size") < 0)
            goto fail;
        if (gather) o.c.recv = o.b[1].ptr;
        else o.c.send = o.b[1].ptr;
    }
    if (gather) o.c.send = o.b[0].ptr;
    else o.c.recv = o.b[0].ptr;
    o.c.count = dmpy_move_count(&o.b[0]);
    o.c.dtype = dmpy_move_dtype(&o.b[0]);
    o.c.root = (int)root;
    return dmpy_run((dmpy_comm*)self, &o, async_op);
fail:
    dmpy_op_release(&o);
    return NULL;
}
static PyObject* dmpy_gather(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    DMPY_PARSE("gather", 1, "input", "output", "root", "async_op");
    return dmpy_rooted_many(self, DM_OP_GATHER, a_[0], a_[1], a_[2], a_[3], c);
}
static PyObject* dmpy_scatter(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    DMPY_PARSE("scatter", 1, "output", "input", "root", "async_op");
    return dmpy_rooted_many(self, DM_OP_SCATTER, a_[0], a_[1], a_[2], a_[3], c);
}

static PyObject* dmpy_all_to_all(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    const dmpy_dev* dev = &((dmpy_comm*)self)->dev;
    dmpy_op o;
    int async_op;
    size_t W;
    DMPY_PARSE("all_to_all", 1, "output", "input", "async_op");
    W = (size_t)dm_world_size(c);
    if (dmpy_bool(a_[2], &async_op) < 0) return NULL;
    dmpy_op_init(&o, DM_OP_ALL_TO_ALL);
    if (dmpy_buf_get(dev, a_[0], "output", DMPY_WRITE, &o.b[0]) < 0) return NULL;
    if (a_[1] && a_[1] != Py_None) {
        if (dmpy_buf_get(dev, a_[1], "input", DMPY_READ, &o.b[1]) < 0 ||
            dmpy_same_dtype(&o.b[1], "input", &o.b[0], "output") < 0 ||
            dmpy_size_is(&o.b[1], "input", o.b[0].nbytes, "output's size") < 0)
            goto fail;
        o.c.send = o.b[1].ptr;
    }
    if (dmpy_move_count(&o.b[0]) % W != 0) {
        PyErr_Format(PyExc_ValueError, "output holds %zu elements, not a multiple of world_size (%zu)",
                     dmpy_move_count(&o.b[0]), W);
        goto fail;
    }
    o.c.recv = o.b[0].ptr;
    o.c.count = dmpy_move_count(&o.b[0]) / W;
    o.c.dtype = dmpy_move_dtype(&o.b[0]);
    return dmpy_run((dmpy_comm*)self, &o, async_op);
fail:
    dmpy_op_release(&o);
    return NULL;
}

/* counts (a sequence of W non-negative ints, in elements) into out[0..W) and prefix sums into
   offs; their total must fit in limit elements. */
static int dmpy_counts(PyObject* seq, const char* what, size_t W, size_t limit, size_t* out, size_t* offs) {
    PyObject* f = PySequence_Fast(seq, "counts must be a sequence of ints");
    size_t i, total = 0;
    if (!f) return -1;
    if ((size_t)PySequence_Fast_GET_SIZE(f) != W) {
        PyErr_Format(PyExc_ValueError, "%s has %zd entries; it needs world_size (%zu)", what,
                     PySequence_Fast_GET_SIZE(f), W);
        Py_DECREF(f);
        return -1;
    }
    for (i = 0; i < W; i++) {
        long v;
        if (dmpy_int(PySequence_Fast_GET_ITEM(f, (Py_ssize_t)i), what, 0, 0, LONG_MAX, &v) < 0) {
            Py_DECREF(f);
            return -1;
        }
        offs[i] = total;
        out[i] = (size_t)v;
        total += (size_t)v;
    }
    Py_DECREF(f);
    if (total > limit) {
        PyErr_Format(PyExc_ValueError, "%s add up to %zu elements; the buffer holds %zu", what, total, limit);
        return -1;
    }
    return 0;
}
static PyObject* dmpy_all_to_all_v(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    const dmpy_dev* dev = &((dmpy_comm*)self)->dev;
    dmpy_op o;
    int async_op;
    size_t W;
    DMPY_PARSE("all_to_all_v", 4, "output", "output_counts", "input", "input_counts", "async_op");
    W = (size_t)dm_world_size(c);
    if (dmpy_bool(a_[4], &async_op) < 0) return NULL;
    dmpy_op_init(&o, DM_OP_ALL_TO_ALL_V);
    if (dmpy_buf_get(dev, a_[0], "output", DMPY_WRITE, &o.b[0]) < 0 ||
        dmpy_buf_get(dev, a_[2], "input", DMPY_READ, &o.b[1]) < 0 ||
        dmpy_same_dtype(&o.b[1], "input", &o.b[0], "output") < 0)
        goto fail;
    o.arrays = (size_t*)PyMem_Calloc(4 * W, sizeof(size_t));
    if (!o.arrays) { PyErr_NoMemory(); goto fail; }
    if (dmpy_counts(a_[3], "input_counts", W, dmpy_move_count(&o.b[1]), o.arrays, o.arrays + W) < 0 ||
        dmpy_counts(a_[1], "output_counts", W, dmpy_move_count(&o.b[0]), o.arrays + 2 * W, o.arrays + 3 * W) < 0)
        goto fail;
    o.c.send_counts = o.arrays;
    o.c.send_offsets = o.arrays + W;
    o.c.recv_counts = o.arrays + 2 * W;
    o.c.recv_offsets = o.arrays + 3 * W;
    o.c.send = o.b[1].ptr;
    o.c.recv = o.b[0].ptr;
    o.c.dtype = dmpy_move_dtype(&o.b[0]);
    return dmpy_run((dmpy_comm*)self, &o, async_op);
fail:
    dmpy_op_release(&o);
    return NULL;
}

static PyObject* dmpy_p2p(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, bool send) {
    const dmpy_dev* dev = &((dmpy_comm*)self)->dev;
    dmpy_op o;
    int async_op;
    long peer, tag;
    DMPY_PARSE(send ? "send" : "recv", 2, "tensor", "peer", "tag", "async_op");
    if (dmpy_int(a_[1], "peer", 0, INT_MIN, INT_MAX, &peer) < 0 || dmpy_int(a_[2], "tag", 0, 0, INT_MAX, &tag) < 0 ||
        dmpy_bool(a_[3], &async_op) < 0)
        return NULL;
    dmpy_op_init(&o, send ? DM_OP_SEND : DM_OP_RECV);
    if (dmpy_buf_get(dev, a_[0], "tensor", send ? DMPY_READ : DMPY_WRITE, &o.b[0]) < 0) return NULL;
    if (send) o.c.send = o.b[0].ptr; else o.c.recv = o.b[0].ptr;
    o.c.count = dmpy_move_count(&o.b[0]);
    o.c.dtype = dmpy_move_dtype(&o.b[0]);
    o.c.root = (int)peer;
    o.c.tag = (int)tag;
    return dmpy_run((dmpy_comm*)self, &o, async_op);
}
static PyObject* dmpy_send(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    return dmpy_p2p(self, args, nargs, kwnames, true);
}
static PyObject* dmpy_recv(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    return dmpy_p2p(self, args, nargs, kwnames, false);
}

static PyObject* dmpy_blobs_to_list(const dm_blob_list* l) {
    PyObject* out = PyList_New((Py_ssize_t)l->count);
    size_t i;
    if (!out) return NULL;
    for (i = 0; i < l->count; i++) {
        PyObject* b = PyBytes_FromStringAndSize((const char*)l->items[i].data, (Py_ssize_t)l->items[i].size);
        if (!b) { Py_DECREF(out); return NULL; }
        PyList_SET_ITEM(out, (Py_ssize_t)i, b);
    }
    return out;
}
/* _all_gather_bytes(data) -> list of every rank's bytes (data: a non-empty bytes-like). */
static PyObject* dmpy_all_gather_bytes(PyObject* self, PyObject* data) {
    dm_collective* c = dmpy_comm_handle(self);
    dm_blob_list l = { NULL, 0 };
    Py_buffer v;
    dm_status st;
    PyObject* out;
    if (!c) return NULL;
    if (PyObject_GetBuffer(data, &v, PyBUF_SIMPLE) < 0) return NULL;
    DMPY_BLOCKING(self, c, st = dm_all_gather_objects(c, v.buf, (size_t)v.len, &l));
    PyBuffer_Release(&v);
    if (st != DM_OK) return dmpy_raise(st, dm_last_error(c));
    out = dmpy_blobs_to_list(&l);
    dm_blob_list_free(c, &l);
    return out;
}
/* _broadcast_bytes(items, root) -> the root's list of bytes on every rank (items: the root's
   list of non-empty bytes-likes; ignored elsewhere). */
static PyObject* dmpy_broadcast_bytes(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    dm_blob_list l = { NULL, 0 };
    dm_blob* blobs = NULL;
    Py_buffer* views = NULL;
    Py_ssize_t n = 0, i, got = 0;
    PyObject *seq = NULL, *out = NULL;
    long root;
    dm_status st;
    DMPY_PARSE("_broadcast_bytes", 2, "items", "root");
    if (dmpy_int(a_[1], "source_rank", 0, INT_MIN, INT_MAX, &root) < 0) return NULL;
    if (root == dm_rank(c)) {
        seq = PySequence_Fast(a_[0], "objects must be a list");
        if (!seq) return NULL;
        n = PySequence_Fast_GET_SIZE(seq);
        blobs = (dm_blob*)PyMem_Calloc((size_t)n + 1, sizeof(dm_blob));
        views = (Py_buffer*)PyMem_Calloc((size_t)n + 1, sizeof(Py_buffer));
        if (!blobs || !views) { PyErr_NoMemory(); goto done; }
        for (i = 0; i < n; i++, got++) {
            if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, i), &views[i], PyBUF_SIMPLE) < 0) goto done;
            blobs[i].data = views[i].buf;
            blobs[i].size = (size_t)views[i].len;
        }
    }
    DMPY_BLOCKING(self, c, st = dm_broadcast_objects(c, blobs, (size_t)n, (int)root, &l));
    if (st != DM_OK) { dmpy_raise(st, dm_last_error(c)); goto done; }
    out = dmpy_blobs_to_list(&l);
    dm_blob_list_free(c, &l);
done:
    for (i = 0; i < got; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(blobs);
    Py_XDECREF(seq);
    return out;
}

static PyObject* dmpy_split(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    dm_collective* n = NULL;
    long color, key;
    dm_status st;
    DMPY_PARSE("split", 1, "color", "key");
    if (dmpy_int(a_[0], "color", 0, -1, INT_MAX, &color) < 0 || dmpy_int(a_[1], "key", 0, INT_MIN, INT_MAX, &key) < 0)
        return NULL;
    DMPY_BLOCKING(self, c, st = dm_split(c, (int)color, (int)key, &n));
    if (st != DM_OK) return dmpy_raise(st, dm_last_error(c));
    if (!n) Py_RETURN_NONE;
    /* an independent collective with the parent's logger (its log outlives it: a reference) */
    return dmpy_comm_wrap(Py_TYPE(self), n, NULL, true, ((dmpy_comm*)self)->log, ((dmpy_holder*)self)->keep);
}
static PyObject* dmpy_local(PyObject* self, PyObject* noargs) {
    dm_collective *c = dmpy_comm_handle(self), *l = NULL;
    (void)noargs;
    if (!c) return NULL;
    DMPY_BLOCKING(self, c, l = dm_local(c));
    if (!l) return dmpy_raise(DM_ERR_INTERNAL, dm_last_error(c));
    return dmpy_comm_wrap(Py_TYPE(self), l, (dmpy_holder*)self, false, ((dmpy_comm*)self)->log, NULL);
}
static PyObject* dmpy_main_first(PyObject* self, PyObject* arg, bool begin) {
    dm_collective* c = dmpy_comm_handle(self);
    int local_only = PyObject_IsTrue(arg);
    dm_status st;
    if (!c || local_only < 0) return NULL;
    DMPY_BLOCKING(self, c, st = begin ? dm_main_process_first_begin(c, local_only != 0)
                                      : dm_main_process_first_end(c, local_only != 0));
    if (st != DM_OK) return dmpy_raise(st, dm_last_error(c));
    Py_RETURN_NONE;
}
static PyObject* dmpy_main_first_begin(PyObject* self, PyObject* arg) { return dmpy_main_first(self, arg, true); }
static PyObject* dmpy_main_first_end(PyObject* self, PyObject* arg) { return dmpy_main_first(self, arg, false); }
static PyObject* dmpy_synchronize(PyObject* self, PyObject* noargs) {
    dm_collective* c = dmpy_comm_handle(self);
    dm_status st;
    (void)noargs;
    if (!c) return NULL;
    DMPY_BLOCKING(self, c, st = dm_synchronize(c));
    if (st != DM_OK) return dmpy_raise(st, dm_last_error(c));
    Py_RETURN_NONE;
}
static PyObject* dmpy_set_timeout(PyObject* self, PyObject* arg) {
    dm_collective* c = dmpy_comm_handle(self);
    long ms;
    dm_status st;
    if (!c || dmpy_int(arg, "timeout_ms", 0, INT_MIN, INT_MAX, &ms) < 0) return NULL;
    st = dm_set_timeout(c, (int)ms);
    if (st != DM_OK) return dmpy_raise(st, dm_last_error(c));
    Py_RETURN_NONE;
}
static PyObject* dmpy_abort(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    const char* reason;
    DMPY_PARSE("abort", 0, "reason");
    if (dmpy_str(a_[0], "reason", &reason) < 0) return NULL;
    Py_BEGIN_ALLOW_THREADS
    dm_abort(c, reason);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}
static PyObject* dmpy_comm_close(PyObject* self, PyObject* noargs) {
    (void)noargs;
    if (dmpy_close((dmpy_holder*)self) < 0) return NULL;
    Py_RETURN_NONE;
}

#define DMPY_FAST(name, fn, doc) { name, (PyCFunction)(void (*)(void))fn, METH_FASTCALL | METH_KEYWORDS, doc }
static PyMethodDef dmpy_comm_methods[] = {
    DMPY_FAST("barrier", dmpy_barrier, "barrier(async_op=False)"),
    DMPY_FAST("all_reduce", dmpy_all_reduce,
              "all_reduce(tensor, op, send=None, async_op=False, compress=None, state=None): reduce tensor in "
              "place over every rank (send: read from another buffer of the same size instead). compress: "
              "\"none\", \"bf16\" or \"int8\" compresses the stage between hosts of a float SUM or MEAN "
              "(None: DISTMESH_COMPRESS decides); state: a CompressState of the buffer's count (error feedback)."),
    DMPY_FAST("all_gather", dmpy_all_gather,
              "all_gather(output, input, async_op=False): output holds world_size x input, rank r's at r."),
    DMPY_FAST("all_gather_to_list", dmpy_all_gather_to_list,
              "all_gather_to_list(outputs, input, async_op=False): outputs[r] gets rank r's input."),
    DMPY_FAST("reduce_scatter", dmpy_reduce_scatter,
              "reduce_scatter(output, input, op, async_op=False): input holds world_size blocks of output's size; "
              "rank r gets block r reduced."),
    DMPY_FAST("broadcast", dmpy_broadcast, "broadcast(tensor, source_rank=0, async_op=False)"),
    DMPY_FAST("reduce", dmpy_reduce, "reduce(tensor, root, op, async_op=False): the root's tensor gets the "
              "reduction (in place); the others' are read only."),
    DMPY_FAST("gather", dmpy_gather, "gather(input, output=None, root=0, async_op=False): output (root only) "
              "holds world_size x input."),
    DMPY_FAST("scatter", dmpy_scatter, "scatter(output, input=None, root=0, async_op=False): input (root only) "
              "holds world_size x output; rank r gets block r."),
    DMPY_FAST("all_to_all", dmpy_all_to_all, "all_to_all(output, input=None, async_op=False): world_size equal "
              "blocks each way (input None: in place)."),
    DMPY_FAST("all_to_all_v", dmpy_all_to_all_v, "all_to_all_v(output, output_counts, input, input_counts, "
              "async_op=False): per-rank counts in elements, blocks back to back."),
    DMPY_FAST("send", dmpy_send, "send(tensor, peer, tag=0, async_op=False)"),
    DMPY_FAST("recv", dmpy_recv, "recv(tensor, peer, tag=0, async_op=False)"),
    { "_all_gather_bytes", (PyCFunction)dmpy_all_gather_bytes, METH_O, "_all_gather_bytes(data) -> list of bytes" },
    DMPY_FAST("_broadcast_bytes", dmpy_broadcast_bytes, "_broadcast_bytes(items, root) -> list of bytes"),
    DMPY_FAST("split", dmpy_split, "split(color, key=0): like MPI_Comm_split; None for color -1."),
    { "_local", (PyCFunction)dmpy_local, METH_NOARGS, "the node-local group (a collective call the first time)" },
    { "main_process_first_begin", (PyCFunction)dmpy_main_first_begin, METH_O, "main_process_first_begin(local_only)" },
    { "main_process_first_end", (PyCFunction)dmpy_main_first_end, METH_O, "main_process_first_end(local_only)" },
    { "synchronize", (PyCFunction)dmpy_synchronize, METH_NOARGS, "waits for queued device work (NCCL)" },
    { "set_timeout", (PyCFunction)dmpy_set_timeout, METH_O, "set_timeout(ms): deadline of later calls "
      "(< 0 forever, 0 the default)" },
    DMPY_FAST("abort", dmpy_abort, "abort(reason=None): stop this collective from any thread (dm_abort)."),
    { "close", (PyCFunction)dmpy_comm_close, METH_NOARGS, "Waits for its requests, closes what depends on it, "
      "destroys it. Idempotent." },
    { NULL, NULL, 0, NULL }
};
static PyGetSetDef dmpy_comm_getset[] = {
    { "rank", dmpy_get_rank, NULL, "rank in this collective", NULL },
    { "world_size", dmpy_get_world_size, NULL, "ranks in this collective", NULL },
    { "local_rank", dmpy_get_local_rank, NULL, "rank among this host's ranks", NULL },
    { "local_world_size", dmpy_get_local_world_size, NULL, "ranks on this host", NULL },
    { "is_master", dmpy_get_is_master, NULL, "rank 0", NULL },
    { "is_local_master", dmpy_get_is_local_master, NULL, "local rank 0", NULL },
    { "backend", dmpy_get_backend, NULL, "\"fake\", \"thread\", \"tcp\", \"nccl\"", NULL },
    { "transport", dmpy_get_transport, NULL, "\"shm\", \"tcp\", \"shm+tcp\", \"self\", \"thread\", \"fake\"", NULL },
    { "last_algorithm", dmpy_get_last_algorithm, NULL, "the algorithm the last collective ran", NULL },
    { "last_error", dmpy_get_last_error, NULL, "the last failure's message (dm_last_error)", NULL },
    { "sequence", dmpy_get_sequence, NULL, "collectives issued so far", NULL },
    { "closed", dmpy_get_closed, NULL, "whether close() was called (on it or what it belongs to)", NULL },
    { "device", dmpy_get_device, NULL, "(\"cpu\", 0) or (\"cuda\", index): where its calls run (dm_default_device)",
      NULL },
    { "cuda_stream", dmpy_get_cuda_stream, NULL, "the CUDA stream its work is queued on, as an int (NCCL); else "
      "None", NULL },
    { NULL, NULL, NULL, NULL, NULL }
};
PyTypeObject dmpy_CommType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "distmesh._C.Comm",
    .tp_basicsize = sizeof(dmpy_comm),
    .tp_dealloc = dmpy_comm_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A distmesh collective (dm_collective); distmesh.Collective is its Python face.",
    .tp_traverse = dmpy_holder_traverse,
    .tp_weaklistoffset = offsetof(dmpy_holder, weakrefs),
    .tp_methods = dmpy_comm_methods,
    .tp_getset = dmpy_comm_getset,
    .tp_new = dmpy_comm_refuse,
};

