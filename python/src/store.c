/* distmesh._C: Store (dmpy.h says what the other files hold).

   SECTIONS
     >>store  Store: a rendezvous store (the torch backend's)
*/
#include "dmpy.h"

/* ============================================================================================ */
/* >>store  A rendezvous store (dm_store): tcp:// (c10d TCPStore, torch 1.13 and 2.x servers) or
   file://. The torch backend meets through one; a collective made on a Store keeps it alive.
   (dmpy_store: dmpy.h; the factories of module.c pass its dm_store.) */
static PyObject* dmpy_store_new(PyTypeObject* type, PyObject* args, PyObject* kw) {
    static char* names[] = { "url", "is_server", "prefix", "timeout_ms", NULL };
    const char *url = NULL, *prefix = NULL;
    int is_server = 0, timeout_ms = 0;
    dm_store_desc d;
    dm_store* s = NULL;
    dm_status st;
    char err[DM_LAST_ERROR_SIZE];
    dmpy_log* lg;
    dmpy_store* o;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "z|pzi", names, &url, &is_server, &prefix, &timeout_ms)) return NULL;
    memset(&d, 0, sizeof(d));
    d.url = url;
    d.is_server = is_server != 0;
    d.prefix = prefix;
    d.timeout_ms = timeout_ms;
    if (!(lg = dmpy_log_new())) return NULL;
    d.logger = dmpy_logger(lg);
    Py_BEGIN_ALLOW_THREADS
    st = dm_store_create(&d, &s);
    Py_END_ALLOW_THREADS
    if (st != DM_OK) {
        dmpy_log_last(lg, st, err, sizeof(err));
        dmpy_log_unref(lg);
        return dmpy_raise(st, err);
    }
    o = (dmpy_store*)type->tp_alloc(type, 0);
    if (!o) { dm_store_destroy(s); dmpy_log_unref(lg); return NULL; }
    o->s = s;
    o->log = lg;
    return (PyObject*)o;
}
static void dmpy_store_dealloc(dmpy_store* o) {
    if (o->s && !DMPY_FINALIZING()) {
        dm_store* s = o->s;
        Py_BEGIN_ALLOW_THREADS
        dm_store_destroy(s);
        Py_END_ALLOW_THREADS
        dmpy_log_unref(o->log);     /* a server thread may log until the store is destroyed */
    }
    o->s = NULL;
    o->log = NULL;
    Py_TYPE(o)->tp_free((PyObject*)o);
}
static PyObject* dmpy_store_set(dmpy_store* o, PyObject* args) {
    const char* key;
    Py_buffer v;
    dm_status st;
    if (!PyArg_ParseTuple(args, "sy*", &key, &v)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    st = dm_store_set(o->s, key, v.buf, (size_t)v.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&v);
    if (st != DM_OK) return dmpy_raise(st, dm_store_last_error(o->s));
    Py_RETURN_NONE;
}
static PyObject* dmpy_store_get(dmpy_store* o, PyObject* args) {
    const char* key;
    void* v = NULL;
    size_t n = 0;
    dm_status st;
    PyObject* out;
    if (!PyArg_ParseTuple(args, "s", &key)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    st = dm_store_get(o->s, key, &v, &n);
    Py_END_ALLOW_THREADS
    if (st != DM_OK) return dmpy_raise(st, dm_store_last_error(o->s));
    out = PyBytes_FromStringAndSize((const char*)v, (Py_ssize_t)n);
    dm_store_free(o->s, v);
    return out;
}
static PyObject* dmpy_store_add(dmpy_store* o, PyObject* args) {
    const char* key;
    long long delta;
    int64_t now = 0;
    dm_status st;
    if (!PyArg_ParseTuple(args, "sL", &key, &delta)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    st = dm_store_add(o->s, key, (int64_t)delta, &now);
    Py_END_ALLOW_THREADS
    if (st != DM_OK) return dmpy_raise(st, dm_store_last_error(o->s));
    return PyLong_FromLongLong((long long)now);
}
static PyObject* dmpy_store_port(dmpy_store* o, void* closure) {
    (void)closure;
    return PyLong_FromLong(dm_store_port(o->s));
}
static PyMethodDef dmpy_store_methods[] = {
    { "set", (PyCFunction)dmpy_store_set, METH_VARARGS, "set(key, value: bytes)" },
    { "get", (PyCFunction)dmpy_store_get, METH_VARARGS, "get(key) -> bytes (waits for the key)" },
    { "add", (PyCFunction)dmpy_store_add, METH_VARARGS, "add(key, delta) -> the new value" },
    { NULL, NULL, 0, NULL }
};
static PyGetSetDef dmpy_store_getset[] = {
    { "port", (getter)dmpy_store_port, NULL, "the port served (server) or connected to", NULL },
    { NULL, NULL, NULL, NULL, NULL }
};
PyTypeObject dmpy_StoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "distmesh._C.Store",
    .tp_basicsize = sizeof(dmpy_store),
    .tp_dealloc = (destructor)dmpy_store_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Store(url, is_server=False, prefix=None, timeout_ms=0): a distmesh rendezvous store (dm_store).",
    .tp_methods = dmpy_store_methods,
    .tp_getset = dmpy_store_getset,
    .tp_new = dmpy_store_new,
};

