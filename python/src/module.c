/* distmesh._C -- the CPython extension over distmesh's public C API (docs/python.md): its
   module (dmpy.h says what the other files hold). The top of the extension: it calls into the
   other files (their types and factories), none of them into it.

   SECTIONS
     >>module  factories, module init
*/
#include "dmpy.h"

/* ============================================================================================ */
/* >>module  Factories. Each collective gets a fresh log (thread_world: one for its ranks). */
static int dmpy_cls_arg(PyObject* o, PyTypeObject** out) {
    *out = NULL;
    if (!o || o == Py_None) return 0;
    if (!PyType_Check(o) || !PyType_IsSubtype((PyTypeObject*)o, &dmpy_CommType)) {
        PyErr_SetString(PyExc_TypeError, "cls must be a subclass of distmesh._C.Comm");
        return -1;
    }
    *out = (PyTypeObject*)o;
    return 0;
}
static PyObject* dmpy_failed_create(dm_status st, dmpy_log* lg) {
    char msg[DM_LAST_ERROR_SIZE];
    dmpy_log_last(lg, st, msg, sizeof(msg));
    dmpy_log_unref(lg);
    return dmpy_raise(st, msg);
}
/* The end of a factory: the failure raised, or the new collective wrapped (owned), with keep
   (a Store it borrows, NULL: none) held as long as it lives; the factory's reference on lg goes. */
static PyObject* dmpy_created(dm_status st, dm_collective* c, dmpy_log* lg, PyTypeObject* cls, PyObject* keep) {
    PyObject* out;
    if (st != DM_OK) return dmpy_failed_create(st, lg);
    out = dmpy_comm_wrap(cls, c, NULL, true, lg, keep);
    dmpy_log_unref(lg);
    return out;
}
/* A factory's store argument: None or a distmesh._C.Store (0), else a TypeError (-1). */
static int dmpy_store_arg(PyObject* storeo) {
    if (storeo == Py_None || PyObject_TypeCheck(storeo, &dmpy_StoreType)) return 0;
    PyErr_SetString(PyExc_TypeError, "store must be a distmesh._C.Store");
    return -1;
}

static PyObject* dmpy_m_fake(PyObject* mod, PyObject* args, PyObject* kw) {
    static char* names[] = { "rank", "world_size", "local_world_size", "timeout_ms", "cls", NULL };
    int rank = 0, world = 1, local = 0, timeout_ms = 0;
    PyObject* clso = NULL;
    PyTypeObject* cls;
    dm_fake_desc d;
    dm_collective* c = NULL;
    dmpy_log* lg;
    dm_status st;
    (void)mod;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|iiiiO", names, &rank, &world, &local, &timeout_ms, &clso) ||
        dmpy_cls_arg(clso, &cls) < 0 || !(lg = dmpy_log_new()))
        return NULL;
    memset(&d, 0, sizeof(d));
    d.rank = rank;
    d.world_size = world;
    d.local_world_size = local;
    d.timeout_ms = timeout_ms;
    d.logger = dmpy_logger(lg);
    if (world < 1) { dmpy_log_unref(lg); return dmpy_raise(DM_ERR_INVALID_ARG, "fake: world_size must be >= 1"); }
    st = dm_fake_create(&d, &c);
    return dmpy_created(st, c, lg, cls, NULL);
}
static PyObject* dmpy_m_thread_world(PyObject* mod, PyObject* args, PyObject* kw) {
    static char* names[] = { "world_size", "local_world_size", "timeout_ms", "cls", NULL };
    int world, local = 0, timeout_ms = 0, r;
    PyObject *clso = NULL, *list;
    PyTypeObject* cls;
    dm_fake_desc d;
    dm_collective** cs;
    dmpy_log* lg;
    dm_status st;
    (void)mod;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "i|iiO", names, &world, &local, &timeout_ms, &clso) ||
        dmpy_cls_arg(clso, &cls) < 0)
        return NULL;
    if (world < 1 || world > 4096) return dmpy_raise(DM_ERR_INVALID_ARG, "thread_world: world_size must be 1..4096");
    if (!(lg = dmpy_log_new())) return NULL;
    cs = (dm_collective**)PyMem_Calloc((size_t)world, sizeof(dm_collective*));
    if (!cs) { dmpy_log_unref(lg); return PyErr_NoMemory(); }
    memset(&d, 0, sizeof(d));
    d.world_size = world;
    d.local_world_size = local;
    d.timeout_ms = timeout_ms;
    d.logger = dmpy_logger(lg);
    Py_BEGIN_ALLOW_THREADS
    st = dm_thread_world_create(&d, cs);
    Py_END_ALLOW_THREADS
    if (st != DM_OK) { PyMem_Free(cs); return dmpy_failed_create(st, lg); }
    list = PyList_New(world);
    for (r = 0; r < world; r++) {
        /* a failed wrap destroys its own rank; the ranks after it are destroyed here, the ones
           before close with the list */
        PyObject* o = list ? dmpy_comm_wrap(cls, cs[r], NULL, true, lg, NULL) : NULL;
        if (!o) {
            int k;
            for (k = list ? r + 1 : r; k < world; k++) dm_destroy(cs[k]);
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, r, o);
    }
    PyMem_Free(cs);
    dmpy_log_unref(lg);
    return list;
}
static PyObject* dmpy_m_init(PyObject* mod, PyObject* args, PyObject* kw) {
    static char* names[] = { "timeout_ms", "cls", NULL };
    int timeout_ms = 0;
    PyObject* clso = NULL;
    PyTypeObject* cls;
    dm_init_desc d;
    dm_collective* c = NULL;
    dmpy_log* lg;
    dm_status st;
    (void)mod;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|iO", names, &timeout_ms, &clso) || dmpy_cls_arg(clso, &cls) < 0 ||
        !(lg = dmpy_log_new()))
        return NULL;
    memset(&d, 0, sizeof(d));
    d.timeout_ms = timeout_ms;
    d.logger = dmpy_logger(lg);
    Py_BEGIN_ALLOW_THREADS
    st = dm_init(&d, &c);
    Py_END_ALLOW_THREADS
    return dmpy_created(st, c, lg, cls, NULL);
}
static PyObject* dmpy_m_tcp(PyObject* mod, PyObject* args, PyObject* kw) {
    static char* names[] = { "rank", "world_size", "store", "store_url", "prefix", "transport", "timeout_ms",
                             "ifname", "cls", NULL };
    int rank = 0, world = 0, timeout_ms = 0;
    const char *url = NULL, *prefix = NULL, *transport = NULL, *ifname = NULL;
    PyObject *storeo = Py_None, *clso = NULL;
    PyTypeObject* cls;
    dm_tcp_desc d;
    dm_collective* c = NULL;
    dmpy_log* lg;
    dm_status st;
    (void)mod;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|iiOzzzizO", names, &rank, &world, &storeo, &url, &prefix,
                                     &transport, &timeout_ms, &ifname, &clso) ||
        dmpy_cls_arg(clso, &cls) < 0)
        return NULL;
    if (dmpy_store_arg(storeo) < 0) return NULL;
    if (!(lg = dmpy_log_new())) return NULL;
    memset(&d, 0, sizeof(d));
    d.rank = rank;
    d.world_size = world;
    d.store = storeo != Py_None ? ((dmpy_store*)storeo)->s : NULL;
    d.store_url = url;
    d.prefix = prefix;
    d.transport = transport;
    d.timeout_ms = timeout_ms;
    d.ifname = ifname;
    d.logger = dmpy_logger(lg);
    Py_BEGIN_ALLOW_THREADS
    st = dm_tcp_create(&d, &c);
    Py_END_ALLOW_THREADS
    /* the collective borrows the store (splits and abort notices use it): keep it alive */
    return dmpy_created(st, c, lg, cls, storeo != Py_None ? storeo : NULL);
}
/* dm_nccl_create; in a build without NCCL, Unsupported saying how to build with it. cuda_device
   -1: local_rank % device count (the desc's 0); d: device d (the desc's d + 1). */
static PyObject* dmpy_m_nccl(PyObject* mod, PyObject* args, PyObject* kw) {
    static char* names[] = { "rank", "world_size", "local_rank", "cuda_device", "store", "store_url", "prefix",
                             "timeout_ms", "cls", NULL };
    int rank = 0, world = 0, local_rank = 0, cuda_device = -1, timeout_ms = 0;
    const char *url = NULL, *prefix = NULL;
    PyObject *storeo = Py_None, *clso = NULL;
    PyTypeObject* cls;
    (void)mod;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|iiiiOzziO", names, &rank, &world, &local_rank, &cuda_device,
                                     &storeo, &url, &prefix, &timeout_ms, &clso) ||
        dmpy_cls_arg(clso, &cls) < 0)
        return NULL;
    if (dmpy_store_arg(storeo) < 0) return NULL;
    if (cuda_device < -1) return dmpy_raise(DM_ERR_INVALID_ARG, "nccl: cuda_device must be >= 0 (-1: the default)");
#if defined(DISTMESH_NCCL)
    {
        dm_nccl_desc d;
        dm_collective* c = NULL;
        dmpy_log* lg;
        dm_status st;
        if (!(lg = dmpy_log_new())) return NULL;
        memset(&d, 0, sizeof(d));
        d.rank = rank;
        d.world_size = world;
        d.local_rank = local_rank;
        d.cuda_device = cuda_device + 1;
        d.store = storeo != Py_None ? ((dmpy_store*)storeo)->s : NULL;
        d.store_url = url;
        d.prefix = prefix;
        d.timeout_ms = timeout_ms;
        d.logger = dmpy_logger(lg);
        Py_BEGIN_ALLOW_THREADS
        st = dm_nccl_create(&d, &c);
        Py_END_ALLOW_THREADS
        /* dm_shrink's fallback re-initialises through the store: keep it alive */
        return dmpy_created(st, c, lg, cls, storeo != Py_None ? storeo : NULL);
    }
#else
    (void)rank; (void)world; (void)local_rank; (void)url; (void)prefix; (void)timeout_ms; (void)cls;
    return dmpy_raise(DM_ERR_UNSUPPORTED, "nccl: this build of distmesh has no NCCL backend; build it with CUDA and "
                      "NCCL installed: DISTMESH_NCCL=1 pip install --no-build-isolation ./python, or make install "
                      "PY_NCCL=1 (CUDA_HOME, NCCL_HOME: where they are; default /usr/local/cuda)");
#endif
}

static PyObject* dmpy_m_mesh(PyObject* mod, PyObject* args) {
    PyObject *world, *names, *sizes, *nf = NULL, *sf = NULL, *out = NULL;
    dm_collective* w;
    dm_mesh_desc d;
    dm_mesh* m = NULL;
    dm_status st;
    Py_ssize_t i, n;
    (void)mod;
    if (!PyArg_ParseTuple(args, "O!OO", &dmpy_CommType, &world, &names, &sizes)) return NULL;
    if (!(w = dmpy_comm_handle(world))) return NULL;
    nf = PySequence_Fast(names, "names must be a sequence of str");
    sf = nf ? PySequence_Fast(sizes, "sizes must be a sequence of int") : NULL;
    if (!sf) goto done;
    n = PySequence_Fast_GET_SIZE(nf);
    if (n != PySequence_Fast_GET_SIZE(sf) || n < 1 || n > DM_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "a mesh has 1..%d dims, as many names as sizes", DM_MAX_DIMS);
        goto done;
    }
    memset(&d, 0, sizeof(d));
    d.world = w;
    d.ndims = (int)n;
    for (i = 0; i < n; i++) {
        long v;
        if (dmpy_str(PySequence_Fast_GET_ITEM(nf, i), "dim name", &d.dim_names[i]) < 0 || !d.dim_names[i] ||
            dmpy_int(PySequence_Fast_GET_ITEM(sf, i), "dim size", 0, INT_MIN, INT_MAX, &v) < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "dim names must be str");
            goto done;
        }
        d.dim_sizes[i] = (int)v;
    }
    DMPY_BLOCKING(world, w, st = dm_mesh_create(&d, &m));
    if (st != DM_OK) { dmpy_raise(st, dm_last_error(w)); goto done; }
    out = dmpy_mesh_wrap(&dmpy_MeshType, m, DMPY_MESH, (dmpy_holder*)world, true, ((dmpy_comm*)world)->log);
done:
    Py_XDECREF(nf);
    Py_XDECREF(sf);
    return out;
}
static PyObject* dmpy_m_mesh_dp_tp(PyObject* mod, PyObject* args) {
    PyObject* world;
    int tp;
    dm_collective* w;
    dm_mesh* m = NULL;
    dm_status st;
    (void)mod;
    if (!PyArg_ParseTuple(args, "O!i", &dmpy_CommType, &world, &tp)) return NULL;
    if (!(w = dmpy_comm_handle(world))) return NULL;
    DMPY_BLOCKING(world, w, st = dm_mesh_create_dp_tp(w, tp, &m));
    if (st != DM_OK) return dmpy_raise(st, dm_last_error(w));
    return dmpy_mesh_wrap(&dmpy_MeshType, m, DMPY_MESH, (dmpy_holder*)world, true, ((dmpy_comm*)world)->log);
}
static PyObject* dmpy_m_strategy(PyObject* mod, PyObject* args) {
    PyObject* world;
    dm_collective* w;
    dm_strategy_desc d;
    dm_strategy* s = NULL;
    dm_status st;
    (void)mod;
    memset(&d, 0, sizeof(d));
    if (!PyArg_ParseTuple(args, "O!iiii", &dmpy_CommType, &world, &d.mp_replicate_size, &d.mp_shard_size,
                          &d.dp_size, &d.cp_size))
        return NULL;
    if (!(w = dmpy_comm_handle(world))) return NULL;
    d.world = w;
    DMPY_BLOCKING(world, w, st = dm_strategy_create(&d, &s));
    if (st != DM_OK) return dmpy_raise(st, dm_last_error(w));
    return dmpy_mesh_wrap(&dmpy_StrategyType, s, DMPY_STRATEGY, (dmpy_holder*)world, true, ((dmpy_comm*)world)->log);
}
static PyObject* dmpy_m_strategy_validate(PyObject* mod, PyObject* args) {
    dm_strategy_desc d;
    int world, sizes[DM_DIM_COUNT];
    char err[DM_LAST_ERROR_SIZE];
    dm_status st;
    (void)mod;
    memset(&d, 0, sizeof(d));
    if (!PyArg_ParseTuple(args, "iiiii", &world, &d.mp_replicate_size, &d.mp_shard_size, &d.dp_size, &d.cp_size))
        return NULL;
    st = dm_strategy_validate(&d, world, sizes, err, sizeof(err));
    if (st != DM_OK) return dmpy_raise(st, err);
    return Py_BuildValue("(iiii)", sizes[0], sizes[1], sizes[2], sizes[3]);
}
static PyObject* dmpy_m_env_detect(PyObject* mod, PyObject* noargs) {
    dm_env e;
    dm_status st;
    (void)mod; (void)noargs;
    st = dm_env_detect(&e);
    if (st != DM_OK) return dmpy_raise(st, e.error);
    return Py_BuildValue("{s:i,s:i,s:i,s:i,s:O,s:O,s:s,s:s,s:i,s:i}", "rank", e.rank, "world_size", e.world_size,
                         "local_rank", e.local_rank, "local_world_size", e.local_world_size, "local_from_launcher",
                         e.local_from_launcher ? Py_True : Py_False, "is_distributed",
                         e.is_distributed ? Py_True : Py_False, "source", e.source, "master_addr", e.master_addr,
                         "master_port", e.master_port, "timeout_ms", e.timeout_ms);
}
static PyObject* dmpy_m_dim_name(PyObject* mod, PyObject* arg) {
    long v;
    (void)mod;
    if (dmpy_int(arg, "dim", 0, INT_MIN, INT_MAX, &v) < 0) return NULL;
    return PyUnicode_FromString(dm_dim_name((dm_dim)v));
}
/* buffer_info(obj) -> (dtype name, count, nbytes, readonly): what a call would take from obj. */
static PyObject* dmpy_m_buffer_info(PyObject* mod, PyObject* obj) {
    dmpy_buf b;
    PyObject* out;
    (void)mod;
    if (dmpy_buf_get(NULL, obj, "buffer", DMPY_READ, &b) < 0) return NULL;
    out = Py_BuildValue("(snnO)", dmpy_dtype_name(b.dtype), (Py_ssize_t)b.count, (Py_ssize_t)b.nbytes,
                        b.readonly ? Py_True : Py_False);
    dmpy_buf_release(&b);
    return out;
}
static PyObject* dmpy_m_set_comm_class(PyObject* mod, PyObject* cls) {
    PyTypeObject* t;
    (void)mod;
    if (dmpy_cls_arg(cls, &t) < 0) return NULL;
    Py_XINCREF(t);
    Py_XSETREF(dmpy_comm_cls, t);
    Py_RETURN_NONE;
}
static PyObject* dmpy_m_set_op_converter(PyObject* mod, PyObject* fn) {
    (void)mod;
    Py_XINCREF(fn);
    Py_XSETREF(dmpy_op_converter, fn);
    Py_RETURN_NONE;
}
static PyObject* dmpy_m_open_handles(PyObject* mod, PyObject* noargs) {
    dmpy_holder* h;
    long n = 0;
    (void)mod; (void)noargs;
    for (h = dmpy_holders; h; h = h->next) n++;
    return PyLong_FromLong(n);
}

static PyMethodDef dmpy_module_methods[] = {
    { "fake", (PyCFunction)(void (*)(void))dmpy_m_fake, METH_VARARGS | METH_KEYWORDS,
      "fake(rank=0, world_size=1, local_world_size=0, timeout_ms=0, cls=None): a Fake collective" },
    { "thread_world", (PyCFunction)(void (*)(void))dmpy_m_thread_world, METH_VARARGS | METH_KEYWORDS,
      "thread_world(world_size, local_world_size=0, timeout_ms=0, cls=None): one collective per rank" },
    { "init", (PyCFunction)(void (*)(void))dmpy_m_init, METH_VARARGS | METH_KEYWORDS,
      "init(timeout_ms=0, cls=None): the collective the environment asks for (dm_init)" },
    { "tcp", (PyCFunction)(void (*)(void))dmpy_m_tcp, METH_VARARGS | METH_KEYWORDS,
      "tcp(rank=0, world_size=0, store=None, store_url=None, prefix=None, transport=None, timeout_ms=0, "
      "ifname=None, cls=None): dm_tcp_create" },
    { "nccl", (PyCFunction)(void (*)(void))dmpy_m_nccl, METH_VARARGS | METH_KEYWORDS,
      "nccl(rank=0, world_size=0, local_rank=0, cuda_device=-1, store=None, store_url=None, prefix=None, "
      "timeout_ms=0, cls=None): dm_nccl_create (Unsupported in a build without NCCL: see NCCL_BUILT)" },
    { "mesh", dmpy_m_mesh, METH_VARARGS, "mesh(world, names, sizes) -> Mesh" },
    { "mesh_dp_tp", dmpy_m_mesh_dp_tp, METH_VARARGS, "mesh_dp_tp(world, tp_size) -> Mesh" },
    { "strategy", dmpy_m_strategy, METH_VARARGS, "strategy(world, mp_replicate, mp_shard, dp, cp) -> Strategy" },
    { "strategy_validate", dmpy_m_strategy_validate, METH_VARARGS,
      "strategy_validate(world_size, mp_replicate, mp_shard, dp, cp) -> the four sizes" },
    { "env_detect", dmpy_m_env_detect, METH_NOARGS, "where this process sits (dm_env_detect)" },
    { "dim_name", dmpy_m_dim_name, METH_O, "dim_name(dim) -> \"mp_replicate\", ..." },
    { "buffer_info", dmpy_m_buffer_info, METH_O, "buffer_info(obj) -> (dtype, count, nbytes, readonly)" },
    { "_set_comm_class", dmpy_m_set_comm_class, METH_O, "the class C-made collectives get" },
    { "_set_op_converter", dmpy_m_set_op_converter, METH_O, "op -> int for non-int ops" },
    { "_open_handles", dmpy_m_open_handles, METH_NOARGS, "holders not closed yet (tests)" },
    { "_error", dmpy_m_error, METH_VARARGS, "_error(status, message) -> the exception raised for status (tests)" },
    { NULL, NULL, 0, NULL }
};
static struct PyModuleDef dmpy_module = {
    PyModuleDef_HEAD_INIT, "distmesh._C", "distmesh's CPython extension (see the distmesh package).", -1,
    dmpy_module_methods, NULL, NULL, NULL, NULL
};

PyMODINIT_FUNC PyInit__C(void) {
    PyObject* m;
    if (dmpy_comm_ready() < 0 || PyType_Ready(&dmpy_RequestType) < 0 || PyType_Ready(&dmpy_StoreType) < 0 ||
        PyType_Ready(&dmpy_MeshType) < 0 || PyType_Ready(&dmpy_StrategyType) < 0 ||
        PyType_Ready(&dmpy_CompressStateType) < 0)
        return NULL;
    m = PyModule_Create(&dmpy_module);
    if (!m) return NULL;
    if (dmpy_errors_init(m) < 0 || PyModule_AddObjectRef(m, "Comm", (PyObject*)&dmpy_CommType) < 0 ||
        PyModule_AddObjectRef(m, "Request", (PyObject*)&dmpy_RequestType) < 0 ||
        PyModule_AddObjectRef(m, "Store", (PyObject*)&dmpy_StoreType) < 0 ||
        PyModule_AddObjectRef(m, "Mesh", (PyObject*)&dmpy_MeshType) < 0 ||
        PyModule_AddObjectRef(m, "Strategy", (PyObject*)&dmpy_StrategyType) < 0 ||
        PyModule_AddObjectRef(m, "CompressState", (PyObject*)&dmpy_CompressStateType) < 0 ||
        PyModule_AddIntConstant(m, "COMPRESS_BLOCK", DM_COMPRESS_BLOCK) < 0 ||
        PyModule_AddStringConstant(m, "VERSION", DISTMESH_VERSION) < 0 ||
        PyModule_AddIntConstant(m, "DEFAULT_TIMEOUT_MS", DM_DEFAULT_TIMEOUT_MS) < 0 ||
#if defined(DISTMESH_OPENSSL)
        PyModule_AddObjectRef(m, "OPENSSL_BUILT", Py_True) < 0 ||
#else
        PyModule_AddObjectRef(m, "OPENSSL_BUILT", Py_False) < 0 ||
#endif
#if defined(DISTMESH_NCCL)
        PyModule_AddObjectRef(m, "NCCL_BUILT", Py_True) < 0) {
#else
        PyModule_AddObjectRef(m, "NCCL_BUILT", Py_False) < 0) {
#endif
        Py_DECREF(m);
        return NULL;
    }
    if (dmpy_sig_init() < 0) { Py_DECREF(m); return NULL; }   /* Ctrl-C: the main thread (>>sigint) */
    return m;
}
