/* distmesh._C: Mesh and Strategy (dmpy.h says what the other files hold).

   SECTIONS
     >>mesh  Mesh and Strategy
*/
#include "dmpy.h"

/* ============================================================================================ */
/* >>mesh  Mesh (dm_mesh) and Strategy (dm_strategy): holders owned by their world collective;
   their groups are Comm objects owned by them. */
typedef struct dmpy_mesh { dmpy_holder h; dmpy_log* log; } dmpy_mesh;

PyObject* dmpy_mesh_wrap(PyTypeObject* type, void* handle, int kind, dmpy_holder* owner, bool owns, dmpy_log* lg) {
    dmpy_mesh* o = (dmpy_mesh*)type->tp_alloc(type, 0);
    if (!o) {
        if (owns && kind == DMPY_MESH) dm_mesh_destroy((dm_mesh*)handle);
        else if (owns) dm_strategy_destroy((dm_strategy*)handle);
        return NULL;
    }
    o->h.handle = handle;
    o->h.owner = (dmpy_holder*)Py_XNewRef((PyObject*)owner);
    o->h.kind = kind;
    o->h.owns = owns;
    o->log = dmpy_log_ref(lg);
    dmpy_holder_link(&o->h);
    return (PyObject*)o;
}
static void dmpy_mesh_dealloc(PyObject* self) {
    dmpy_mesh* o = (dmpy_mesh*)self;
    PyObject_GC_UnTrack(self);
    dmpy_holder_dealloc_common(&o->h);
    dmpy_log_unref(o->log);
    o->log = NULL;
    Py_TYPE(self)->tp_free(self);
}
static PyObject* dmpy_holder_close(PyObject* self, PyObject* noargs) {
    (void)noargs;
    if (dmpy_close((dmpy_holder*)self) < 0) return NULL;
    Py_RETURN_NONE;
}
static dm_mesh* dmpy_mesh_handle(PyObject* self) { return (dm_mesh*)dmpy_handle(self); }
static int dmpy_dim_arg(PyObject* a, const char** name) { return dmpy_str(a, "dim", name); }

/* rank(dim=None) and size(dim=None): what q (dm_mesh_rank, dm_mesh_size) says of dim. */
static PyObject* dmpy_mesh_query(PyObject* self, PyObject* args, int (*q)(const dm_mesh*, const char*)) {
    PyObject* a = Py_None;
    const char* name;
    dm_mesh* m = dmpy_mesh_handle(self);
    int v;
    if (!m || !PyArg_ParseTuple(args, "|O", &a) || dmpy_dim_arg(a, &name) < 0) return NULL;
    v = q(m, name);
    if (v < 0) return dmpy_raise(DM_ERR_INVALID_ARG, dm_mesh_last_error(m));
    return PyLong_FromLong(v);
}
static PyObject* dmpy_mesh_rank(PyObject* self, PyObject* args) { return dmpy_mesh_query(self, args, dm_mesh_rank); }
static PyObject* dmpy_mesh_size(PyObject* self, PyObject* args) { return dmpy_mesh_query(self, args, dm_mesh_size); }
static PyObject* dmpy_mesh_group(PyObject* self, PyObject* args) {
    PyObject* a = Py_None;
    const char* name;
    dm_mesh* m = dmpy_mesh_handle(self);
    dm_collective* g;
    if (!m || !PyArg_ParseTuple(args, "|O", &a) || dmpy_dim_arg(a, &name) < 0) return NULL;
    g = dm_mesh_group(m, name);
    if (!g) return dmpy_raise(DM_ERR_INVALID_ARG, dm_mesh_last_error(m));
    if (g == dm_mesh_world(m)) {   /* the world: the Python object that owns it */
        dmpy_holder* w = ((dmpy_holder*)self)->owner;
        while (w && w->kind != DMPY_COMM) w = w->owner;
        if (w) return Py_NewRef((PyObject*)w);
    }
    return dmpy_comm_wrap(NULL, g, (dmpy_holder*)self, false, ((dmpy_mesh*)self)->log, NULL);
}
static PyObject* dmpy_mesh_dim_names(PyObject* self, PyObject* noargs) {
    dm_mesh* m = dmpy_mesh_handle(self);
    PyObject* out;
    int i, n;
    (void)noargs;
    if (!m) return NULL;
    n = dm_mesh_ndims(m);
    out = PyTuple_New(n);
    for (i = 0; out && i < n; i++) {
        PyObject* s = PyUnicode_FromString(dm_mesh_dim_name(m, i));
        if (!s) { Py_CLEAR(out); break; }
        PyTuple_SET_ITEM(out, i, s);
    }
    return out;
}
static PyMethodDef dmpy_mesh_methods[] = {
    { "rank", dmpy_mesh_rank, METH_VARARGS, "rank(dim=None): rank along dim (None: the world's)" },
    { "size", dmpy_mesh_size, METH_VARARGS, "size(dim=None): size of dim (None: the world's)" },
    { "group", dmpy_mesh_group, METH_VARARGS, "group(dim): the collective of dim (owned by the mesh)" },
    { "dim_names", dmpy_mesh_dim_names, METH_NOARGS, "the dims' names, outermost first" },
    { "close", dmpy_holder_close, METH_NOARGS, "closes its groups, then the mesh" },
    { NULL, NULL, 0, NULL }
};
PyTypeObject dmpy_MeshType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "distmesh._C.Mesh",
    .tp_basicsize = sizeof(dmpy_mesh),
    .tp_dealloc = dmpy_mesh_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Named dims over a world collective (dm_mesh); made by distmesh.Mesh(world, dims).",
    .tp_traverse = dmpy_holder_traverse,
    .tp_weaklistoffset = offsetof(dmpy_holder, weakrefs),
    .tp_methods = dmpy_mesh_methods,
};

static dm_strategy* dmpy_strategy_handle(PyObject* self) { return (dm_strategy*)dmpy_handle(self); }
static int dmpy_dim_enum(PyObject* a, dm_dim* out) {
    long v;
    if (dmpy_int(a, "dim", -1, INT_MIN, INT_MAX, &v) < 0) return -1;
    *out = (dm_dim)v;
    return 0;
}
/* size(dim) and rank(dim): what q (dm_strategy_size, dm_strategy_rank) says of dim. */
static PyObject* dmpy_strategy_query(PyObject* self, PyObject* arg, int (*q)(const dm_strategy*, dm_dim)) {
    dm_strategy* s = dmpy_strategy_handle(self);
    dm_dim d;
    int v;
    if (!s || dmpy_dim_enum(arg, &d) < 0) return NULL;
    v = q(s, d);
    if (v < 0) return dmpy_raise(DM_ERR_INVALID_ARG, dm_strategy_last_error(s));
    return PyLong_FromLong(v);
}
static PyObject* dmpy_strategy_size(PyObject* self, PyObject* arg) {
    return dmpy_strategy_query(self, arg, dm_strategy_size);
}
static PyObject* dmpy_strategy_rank(PyObject* self, PyObject* arg) {
    return dmpy_strategy_query(self, arg, dm_strategy_rank);
}
static PyObject* dmpy_strategy_group(PyObject* self, PyObject* arg) {
    dm_strategy* s = dmpy_strategy_handle(self);
    dm_collective* g;
    dm_dim d;
    if (!s || dmpy_dim_enum(arg, &d) < 0) return NULL;
    g = dm_strategy_group(s, d);
    if (!g) return dmpy_raise(DM_ERR_INVALID_ARG, dm_strategy_last_error(s));
    return dmpy_comm_wrap(NULL, g, (dmpy_holder*)self, false, ((dmpy_mesh*)self)->log, NULL);
}
static PyObject* dmpy_strategy_mesh(PyObject* self, bool model) {
    dm_strategy* s = dmpy_strategy_handle(self);
    dm_mesh* m;
    if (!s) return NULL;
    m = model ? dm_strategy_model_mesh(s) : dm_strategy_data_mesh(s);
    if (!m) return dmpy_raise(DM_ERR_INTERNAL, dm_strategy_last_error(s));
    return dmpy_mesh_wrap(&dmpy_MeshType, m, DMPY_MESH, (dmpy_holder*)self, false, ((dmpy_mesh*)self)->log);
}
static PyObject* dmpy_strategy_model_mesh(PyObject* self, PyObject* noargs) { (void)noargs; return dmpy_strategy_mesh(self, true); }
static PyObject* dmpy_strategy_data_mesh(PyObject* self, PyObject* noargs) { (void)noargs; return dmpy_strategy_mesh(self, false); }
static PyMethodDef dmpy_strategy_methods[] = {
    { "size", dmpy_strategy_size, METH_O, "size(dim: int) of one of the four dims" },
    { "rank", dmpy_strategy_rank, METH_O, "rank(dim: int) along one of the four dims" },
    { "group", dmpy_strategy_group, METH_O, "group(dim: int): the dim's collective (owned by the strategy)" },
    { "model_mesh", dmpy_strategy_model_mesh, METH_NOARGS, "(mp_replicate, mp_shard)" },
    { "data_mesh", dmpy_strategy_data_mesh, METH_NOARGS, "(dp, cp)" },
    { "close", dmpy_holder_close, METH_NOARGS, "closes its groups and meshes, then the strategy" },
    { NULL, NULL, 0, NULL }
};
PyTypeObject dmpy_StrategyType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "distmesh._C.Strategy",
    .tp_basicsize = sizeof(dmpy_mesh),
    .tp_dealloc = dmpy_mesh_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "LLaMA-Factory's model and data meshes over a world (dm_strategy).",
    .tp_traverse = dmpy_holder_traverse,
    .tp_weaklistoffset = offsetof(dmpy_holder, weakrefs),
    .tp_methods = dmpy_strategy_methods,
};

