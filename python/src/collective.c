/* distmesh._C: Comm, the collective, and the holders it shares with Mesh and Strategy (dmpy.h
   says what the other files hold).

   SECTIONS
     >>holders  Comm, Mesh, Strategy: who owns which handle; closing a holder closes its
                dependents first
     >>specs    the collectives: one table of per-operation specs, one function that runs any
                of them; the few written by hand
     >>comm     Comm: accessors, groups, the byte-object calls, the type
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
/* >>specs  The collectives, one table: an entry per method names its dm_op_kind, its arguments
   (what each is: a buffer, the reduce op, the root or peer, ...), what each buffer is to the
   call (read, written, reduced; send or recv; optional; the root's only) and the size rule
   between two buffers; dmpy_collective parses, acquires, checks and runs any of them, and
   dmpy_comm_ready makes their methods. The checks, their order and their messages are the
   ones each wrapper wrote by hand before: the scalars in the order of the arguments, then
   the buffers in that order, then the size rule, then the state.
   Written by hand (their arguments are not buffers under a size rule): all_gather_to_list (a
   list of outputs) and all_to_all_v (counts) below, _all_gather_bytes and _broadcast_bytes
   (objects, not a dm_op) in >>comm. */

/* The arguments of a hand-written method: a_[i] is the one named by the i-th name (NULL when
   absent), c the collective (open). */
#define DMPY_PARSE(fn, nreq, ...)                                                            \
    static const char* const names_[] = { __VA_ARGS__ };                                     \
    PyObject* a_[sizeof(names_) / sizeof(names_[0])];                                        \
    dm_collective* c;                                                                        \
    if (dmpy_args(fn, args, nargs, kwnames, names_, (int)(sizeof(names_) / sizeof(names_[0])), (nreq), a_) < 0) \
        return NULL;                                                                         \
    if (!(c = dmpy_comm_handle(self))) return NULL

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

/* What an argument is (dmpy_spec_arg.role). */
enum {
    DMPY_A_BUF = 1,             /* a buffer, as its flags say: o.b[0], then o.b[1] */
    DMPY_A_OP,                  /* the reduce op (c.op) */
    DMPY_A_ROOT,                /* an int, default 0 (c.root): the root, or send/recv's peer */
    DMPY_A_TAG,                 /* an int in [0, INT_MAX], default 0 (c.tag) */
    DMPY_A_ASYNC,               /* async_op: return a Request */
    DMPY_A_COMPRESS,            /* all_reduce's compress (c.compress) */
    DMPY_A_STATE                /* all_reduce's CompressState (c.compress_state), taken last */
};
/* What a buffer is to the call (dmpy_spec_arg.buf). Without a WRITE flag it is only read. */
enum {
    DMPY_B_WRITE = 1,           /* written */
    DMPY_B_WRITE_ROOT = 2,      /* written at the root, read elsewhere */
    DMPY_B_WRITE_NONROOT = 4,   /* read at the root, written elsewhere */
    DMPY_B_REDUCE = 8,          /* reduced: a dtype distmesh reduces */
    DMPY_B_SEND = 16,           /* c.send */
    DMPY_B_RECV = 32,           /* c.recv */
    DMPY_B_OPTIONAL = 64,       /* absent or None: no buffer */
    DMPY_B_ROOT_ONLY = 128      /* taken at the root only ("<name> (at the root)") */
};
/* How the second buffer's size follows from the first's (same element type in both). The
   call's count is in the elements of the buffer the rule measures by (the first, all_gather's
   input), divided by world_size for blocks. */
enum {
    DMPY_SIZE_NONE = 0,         /* one buffer */
    DMPY_SIZE_EQUAL,            /* the second holds as many bytes as the first */
    DMPY_SIZE_SECOND_IS_WORLD,  /* the second holds world_size x the first */
    DMPY_SIZE_FIRST_IS_WORLD    /* the first holds world_size x the second */
};
#define DMPY_SPEC_ARGS 6
typedef struct dmpy_spec_arg {
    const char* name;           /* as Python passes it by keyword and the messages name it */
    int role;                   /* DMPY_A_ */
    int buf;                    /* DMPY_A_BUF: DMPY_B_ flags */
} dmpy_spec_arg;
typedef struct dmpy_spec {
    const char* name;           /* the method */
    dm_op_kind kind;
    int nreq;                   /* the first nreq arguments are required */
    dmpy_spec_arg args[DMPY_SPEC_ARGS];   /* in their positional order; the rest { NULL } */
    int size;                   /* DMPY_SIZE_ */
    bool blocks;                /* count: the first buffer's / world_size, which must divide it */
    const char* doc;
} dmpy_spec;

/* The table's methods, in the order of the Comm's methods: DMPY_S_<method> is an entry's index
   and dmpy_c_<method> its method (below). */
#define DMPY_SPECS(X) X(barrier) X(all_reduce) X(all_gather) X(reduce_scatter) X(broadcast) X(reduce) X(gather) \
    X(scatter) X(all_to_all) X(send) X(recv)
#define _DMPY_X(m) DMPY_S_##m,
enum { DMPY_SPECS(_DMPY_X) DMPY_NSPECS };
#undef _DMPY_X

#define _DMPY_ASYNC { "async_op", DMPY_A_ASYNC, 0 }
static const dmpy_spec dmpy_specs[DMPY_NSPECS] = {
    [DMPY_S_barrier] = { "barrier", DM_OP_BARRIER, 0, { _DMPY_ASYNC }, DMPY_SIZE_NONE, false,
        "barrier(async_op=False)" },
    [DMPY_S_all_reduce] = { "all_reduce", DM_OP_ALL_REDUCE, 2,
        { { "tensor", DMPY_A_BUF, DMPY_B_WRITE | DMPY_B_REDUCE | DMPY_B_RECV }, { "op", DMPY_A_OP, 0 },
          { "send", DMPY_A_BUF, DMPY_B_REDUCE | DMPY_B_SEND | DMPY_B_OPTIONAL }, _DMPY_ASYNC,
          { "compress", DMPY_A_COMPRESS, 0 }, { "state", DMPY_A_STATE, 0 } },
        DMPY_SIZE_EQUAL, false,
        "all_reduce(tensor, op, send=None, async_op=False, compress=None, state=None): reduce tensor in "
        "place over every rank (send: read from another buffer of the same size instead). compress: "
        "\"none\", \"bf16\" or \"int8\" compresses the stage between hosts of a float SUM or MEAN "
        "(None: DISTMESH_COMPRESS decides); state: a CompressState of the buffer's count (error feedback)." },
    [DMPY_S_all_gather] = { "all_gather", DM_OP_ALL_GATHER, 2,
        { { "output", DMPY_A_BUF, DMPY_B_WRITE | DMPY_B_RECV }, { "input", DMPY_A_BUF, DMPY_B_SEND }, _DMPY_ASYNC },
        DMPY_SIZE_FIRST_IS_WORLD, false,
        "all_gather(output, input, async_op=False): output holds world_size x input, rank r's at r." },
    [DMPY_S_reduce_scatter] = { "reduce_scatter", DM_OP_REDUCE_SCATTER, 3,
        { { "output", DMPY_A_BUF, DMPY_B_WRITE | DMPY_B_REDUCE | DMPY_B_RECV },
          { "input", DMPY_A_BUF, DMPY_B_REDUCE | DMPY_B_SEND }, { "op", DMPY_A_OP, 0 }, _DMPY_ASYNC },
        DMPY_SIZE_SECOND_IS_WORLD, false,
        "reduce_scatter(output, input, op, async_op=False): input holds world_size blocks of output's size; "
        "rank r gets block r reduced." },
    [DMPY_S_broadcast] = { "broadcast", DM_OP_BROADCAST, 1,
        { { "tensor", DMPY_A_BUF, DMPY_B_WRITE_NONROOT | DMPY_B_RECV }, { "source_rank", DMPY_A_ROOT, 0 },
          _DMPY_ASYNC },
        DMPY_SIZE_NONE, false, "broadcast(tensor, source_rank=0, async_op=False)" },
    [DMPY_S_reduce] = { "reduce", DM_OP_REDUCE, 3,     /* in place at the root; read only elsewhere */
        { { "tensor", DMPY_A_BUF, DMPY_B_WRITE_ROOT | DMPY_B_REDUCE | DMPY_B_SEND | DMPY_B_RECV },
          { "root", DMPY_A_ROOT, 0 }, { "op", DMPY_A_OP, 0 }, _DMPY_ASYNC },
        DMPY_SIZE_NONE, false,
        "reduce(tensor, root, op, async_op=False): the root's tensor gets the reduction (in place); the others' "
        "are read only." },
    /* gather and scatter, mirror images: the small buffer on every rank (gather's input,
       scatter's output), the root's world_size times larger one (gather's output, scatter's input) */
    [DMPY_S_gather] = { "gather", DM_OP_GATHER, 1,
        { { "input", DMPY_A_BUF, DMPY_B_SEND }, { "output", DMPY_A_BUF, DMPY_B_WRITE | DMPY_B_RECV | DMPY_B_ROOT_ONLY },
          { "root", DMPY_A_ROOT, 0 }, _DMPY_ASYNC },
        DMPY_SIZE_SECOND_IS_WORLD, false,
        "gather(input, output=None, root=0, async_op=False): output (root only) holds world_size x input." },
    [DMPY_S_scatter] = { "scatter", DM_OP_SCATTER, 1,
        { { "output", DMPY_A_BUF, DMPY_B_WRITE | DMPY_B_RECV }, { "input", DMPY_A_BUF, DMPY_B_SEND | DMPY_B_ROOT_ONLY },
          { "root", DMPY_A_ROOT, 0 }, _DMPY_ASYNC },
        DMPY_SIZE_SECOND_IS_WORLD, false,
        "scatter(output, input=None, root=0, async_op=False): input (root only) holds world_size x output; "
        "rank r gets block r." },
    [DMPY_S_all_to_all] = { "all_to_all", DM_OP_ALL_TO_ALL, 1,
        { { "output", DMPY_A_BUF, DMPY_B_WRITE | DMPY_B_RECV }, { "input", DMPY_A_BUF, DMPY_B_SEND | DMPY_B_OPTIONAL },
          _DMPY_ASYNC },
        DMPY_SIZE_EQUAL, true,
        "all_to_all(output, input=None, async_op=False): world_size equal blocks each way (input None: in place)." },
    [DMPY_S_send] = { "send", DM_OP_SEND, 2,
        { { "tensor", DMPY_A_BUF, DMPY_B_SEND }, { "peer", DMPY_A_ROOT, 0 }, { "tag", DMPY_A_TAG, 0 }, _DMPY_ASYNC },
        DMPY_SIZE_NONE, false, "send(tensor, peer, tag=0, async_op=False)" },
    [DMPY_S_recv] = { "recv", DM_OP_RECV, 2,
        { { "tensor", DMPY_A_BUF, DMPY_B_WRITE | DMPY_B_RECV }, { "peer", DMPY_A_ROOT, 0 }, { "tag", DMPY_A_TAG, 0 },
          _DMPY_ASYNC },
        DMPY_SIZE_NONE, false, "recv(tensor, peer, tag=0, async_op=False): the message with this tag from peer, "
        "or from any rank with peer None (the first with the tag: distmesh.h dm_recv_any); returns the sender's "
        "rank (a Request whose wait() returns it)" },
};
#undef _DMPY_ASYNC

/* One call of s on self: its arguments parsed, its buffers acquired and checked, the dm_op
   filled and run (blocking, or a Request). */
static PyObject* dmpy_collective(const dmpy_spec* s, PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                                 PyObject* kwnames) {
    const dmpy_dev* dev = &((dmpy_comm*)self)->dev;
    const char* names[DMPY_SPEC_ARGS];
    PyObject* a[DMPY_SPEC_ARGS];
    const dmpy_spec_arg* bufs[2] = { NULL, NULL };
    PyObject *objs[2] = { NULL, NULL }, *state = NULL;
    bool taken[2] = { false, false };
    dmpy_op o;
    dm_collective* c;
    int i, n, nb = 0, async_op = 0;
    long root = 0, tag = 0;
    bool at_root;
    size_t W;
    for (n = 0; n < DMPY_SPEC_ARGS && s->args[n].name; n++) names[n] = s->args[n].name;
    if (dmpy_args(s->name, args, nargs, kwnames, names, n, s->nreq, a) < 0) return NULL;
    if (!(c = dmpy_comm_handle(self))) return NULL;
    W = (size_t)dm_world_size(c);
    dmpy_op_init(&o, s->kind);
    for (i = 0; i < n; i++) {           /* the scalars, in the order of the arguments */
        const dmpy_spec_arg* p = &s->args[i];
        int rc = 0;
        switch (p->role) {
            case DMPY_A_BUF: bufs[nb] = p; objs[nb++] = a[i]; break;
            case DMPY_A_OP: rc = dmpy_reduce_op(a[i], &o.c.op); break;
            case DMPY_A_ROOT:
                if (s->kind == DM_OP_RECV && a[i] == Py_None) root = DM_ANY_SOURCE;     /* recv from any source */
                else rc = dmpy_int(a[i], p->name, 0, INT_MIN, INT_MAX, &root);
                break;
            case DMPY_A_TAG: rc = dmpy_int(a[i], p->name, 0, 0, INT_MAX, &tag); break;
            case DMPY_A_ASYNC: rc = dmpy_bool(a[i], &async_op); break;
            case DMPY_A_COMPRESS: rc = dmpy_compress_arg(a[i], &o.c.compress); break;
            case DMPY_A_STATE: state = a[i]; break;
        }
        if (rc < 0) return NULL;
    }
    o.c.root = (int)root;
    o.c.tag = (int)tag;
    if (s->kind == DM_OP_RECV && root == DM_ANY_SOURCE) {
        o.source = -1;
        o.c.source = &o.source;
    }
    at_root = nb > 0 && root == dm_rank(c);
    for (i = 0; i < nb; i++) {          /* the buffers */
        int f = bufs[i]->buf, flags = f & DMPY_B_REDUCE ? DMPY_REDUCE : DMPY_READ;
        const char* what = bufs[i]->name;
        char at_the_root[48];
        if ((f & DMPY_B_OPTIONAL) && (!objs[i] || objs[i] == Py_None)) continue;
        if (f & DMPY_B_ROOT_ONLY) {
            if (!at_root) continue;
            snprintf(at_the_root, sizeof(at_the_root), "%s (at the root)", what);
            what = at_the_root;
        }
        if ((f & DMPY_B_WRITE) || ((f & DMPY_B_WRITE_ROOT) && at_root) || ((f & DMPY_B_WRITE_NONROOT) && !at_root))
            flags |= DMPY_WRITE;
        if (dmpy_buf_get(dev, objs[i], what, flags, &o.b[i]) < 0) goto fail;
        taken[i] = true;
        if (f & DMPY_B_SEND) o.c.send = o.b[i].ptr;
        if (f & DMPY_B_RECV) o.c.recv = o.b[i].ptr;
    }
    if (taken[0] && taken[1] && s->size != DMPY_SIZE_NONE) {   /* the size rule */
        int k = s->size == DMPY_SIZE_FIRST_IS_WORLD ? 0 : 1;     /* the buffer checked, against o.b[!k] */
        const dmpy_buf *chk = &o.b[k], *by = &o.b[!k];
        const char *chk_name = bufs[k]->name, *by_name = bufs[!k]->name;
        size_t want = (s->size == DMPY_SIZE_EQUAL ? 1 : W) * by->nbytes;
        if (dmpy_same_dtype(chk, chk_name, by, by_name) < 0) goto fail;
        if (chk->nbytes != want) {
            char why[48];
            if (s->size == DMPY_SIZE_EQUAL) snprintf(why, sizeof(why), "%s's size", by_name);
            else snprintf(why, sizeof(why), "world_size x %s's size", by_name);
            dmpy_size_is(chk, chk_name, want, why);
            goto fail;
        }
    }
    if (s->blocks && dmpy_move_count(&o.b[0]) % W != 0) {
        PyErr_Format(PyExc_ValueError, "%s holds %zu elements, not a multiple of world_size (%zu)", bufs[0]->name,
                     dmpy_move_count(&o.b[0]), W);
        goto fail;
    }
    if (dmpy_state_arg(state, &o) < 0) goto fail;
    if (nb > 0) {                       /* the count: in the elements of the buffer the rule measures by */
        const dmpy_buf* by = &o.b[s->size == DMPY_SIZE_FIRST_IS_WORLD ? 1 : 0];
        o.c.count = dmpy_move_count(by) / (s->blocks ? W : 1);
        o.c.dtype = dmpy_move_dtype(by);
    }
    return dmpy_run((dmpy_comm*)self, &o, async_op);
fail:
    dmpy_op_release(&o);
    return NULL;
}

/* The table's methods: dmpy_c_<method> runs the entry DMPY_S_<method>. */
typedef PyObject* (*dmpy_fastcall)(PyObject*, PyObject* const*, Py_ssize_t, PyObject*);
#define _DMPY_X(m)                                                                           \
    static PyObject* dmpy_c_##m(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) { \
        return dmpy_collective(&dmpy_specs[DMPY_S_##m], self, args, nargs, kwnames);         \
    }
DMPY_SPECS(_DMPY_X)
#undef _DMPY_X
#define _DMPY_X(m) dmpy_c_##m,
static const dmpy_fastcall dmpy_spec_fns[DMPY_NSPECS] = { DMPY_SPECS(_DMPY_X) };
#undef _DMPY_X

/* Written by hand: outputs is a list of world_size buffers, each checked against input. */
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
static PyObject* dmpy_idle(PyObject* self, PyObject* noargs) {
    int idle;
    (void)noargs;
    if (!dmpy_comm_handle(self)) return NULL;
    if ((idle = dmpy_request_idle((dmpy_comm*)self)) < 0) return NULL;
    return PyBool_FromLong(idle);
}
static PyObject* dmpy_comm_close(PyObject* self, PyObject* noargs) {
    (void)noargs;
    if (dmpy_close((dmpy_holder*)self) < 0) return NULL;
    Py_RETURN_NONE;
}

#define DMPY_FAST(name, fn, doc) { name, (PyCFunction)(void (*)(void))fn, METH_FASTCALL | METH_KEYWORDS, doc }
#define _DMPY_X(m) { #m, NULL, 0, NULL },
static PyMethodDef dmpy_comm_methods[] = {
    DMPY_SPECS(_DMPY_X)         /* the table's collectives (>>specs), filled by dmpy_comm_ready */
    DMPY_FAST("all_gather_to_list", dmpy_all_gather_to_list,
              "all_gather_to_list(outputs, input, async_op=False): outputs[r] gets rank r's input."),
    DMPY_FAST("all_to_all_v", dmpy_all_to_all_v, "all_to_all_v(output, output_counts, input, input_counts, "
              "async_op=False): per-rank counts in elements, blocks back to back."),
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
    { "_idle", (PyCFunction)dmpy_idle, METH_NOARGS, "_idle() -> whether nothing of this collective is in flight "
      "(no call running, every request finished; completed ones are finished here)" },
    { "close", (PyCFunction)dmpy_comm_close, METH_NOARGS, "Waits for its requests, closes what depends on it, "
      "destroys it. Idempotent." },
    { NULL, NULL, 0, NULL }
};
#undef _DMPY_X
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
/* Comm's type, ready: first its methods from the spec table (>>specs). 0, or -1 with an
   exception set (PyType_Ready's). */
int dmpy_comm_ready(void) {
    int i;
    for (i = 0; i < DMPY_NSPECS; i++) {
        PyMethodDef* m = &dmpy_comm_methods[i];
        m->ml_name = dmpy_specs[i].name;
        m->ml_meth = (PyCFunction)(void (*)(void))dmpy_spec_fns[i];
        m->ml_flags = METH_FASTCALL | METH_KEYWORDS;
        m->ml_doc = dmpy_specs[i].doc;
    }
    return PyType_Ready(&dmpy_CommType);
}
