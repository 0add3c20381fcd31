/* distmesh._C: CompressState (dmpy.h says what the other files hold).

   SECTIONS
     >>compress  CompressState: a compressed all-reduce's error-feedback state
*/
#include "dmpy.h"

/* ============================================================================================ */
/* >>compress  distmesh.CompressState(count): a dm_compress_state (the error feedback of
   all_reduce(..., compress=, state=)), count float32 residuals. The object is itself a
   writable buffer of them (format "f", shape (count,)); .residual is a memoryview of it, which
   keeps the state alive while it is used. A call that takes the state holds a reference to it
   until it completes (async too) and marks it in use: the C state is one call at a time, so a
   second call or reset() meanwhile raises Busy before anything is sent. (dmpy_cstate: dmpy.h.) */
static PyObject* dmpy_cstate_new(PyTypeObject* type, PyObject* args, PyObject* kw) {
    static char* kwlist[] = { "count", NULL };
    PyObject* counto;
    Py_ssize_t count;
    dm_compress_state* s = NULL;
    dmpy_cstate* o;
    dm_status st;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O:CompressState", kwlist, &counto)) return NULL;
    if (PyBool_Check(counto) || !PyIndex_Check(counto)) {
        PyErr_Format(PyExc_TypeError, "count must be an int, not %.100s", Py_TYPE(counto)->tp_name);
        return NULL;
    }
    count = PyNumber_AsSsize_t(counto, PyExc_OverflowError);
    if (count == -1 && PyErr_Occurred()) return NULL;
    if (count < 0) {
        PyErr_Format(PyExc_ValueError, "count must be >= 0, got %zd", count);
        return NULL;
    }
    st = dm_compress_state_create((size_t)count, &s);
    if (st != DM_OK) return dmpy_raise(st, dm_last_error(NULL));
    o = (dmpy_cstate*)type->tp_alloc(type, 0);
    if (!o) { dm_compress_state_destroy(s); return NULL; }
    o->s = s;
    o->count = (Py_ssize_t)dm_compress_state_count(s);
    o->inuse = false;
    return (PyObject*)o;
}
static void dmpy_cstate_dealloc(dmpy_cstate* o) {
    dm_compress_state_destroy(o->s);        /* no call holds it: each holds a reference */
    o->s = NULL;
    Py_TYPE(o)->tp_free((PyObject*)o);
}
static int dmpy_cstate_getbuffer(PyObject* self, Py_buffer* view, int flags) {
    dmpy_cstate* o = (dmpy_cstate*)self;
    float* r = dm_compress_state_residual(o->s);
    static float empty;
    if (PyBuffer_FillInfo(view, self, r ? (void*)r : (void*)&empty, o->count * (Py_ssize_t)sizeof(float), 0,
                          flags) < 0)
        return -1;
    view->itemsize = sizeof(float);
    if (flags & PyBUF_FORMAT) view->format = (char*)"f";
    if (flags & PyBUF_ND) view->shape = &o->count;
    if (flags & PyBUF_STRIDES) view->strides = &view->itemsize;
    return 0;
}
static PyBufferProcs dmpy_cstate_as_buffer = { dmpy_cstate_getbuffer, NULL };
static PyObject* dmpy_cstate_count(PyObject* self, void* closure) {
    (void)closure;
    return PyLong_FromSsize_t(((dmpy_cstate*)self)->count);
}
static PyObject* dmpy_cstate_residual(PyObject* self, void* closure) {
    (void)closure;
    return PyMemoryView_FromObject(self);
}
static PyObject* dmpy_cstate_reset(PyObject* self, PyObject* noargs) {
    dmpy_cstate* o = (dmpy_cstate*)self;
    float* r = dm_compress_state_residual(o->s);
    (void)noargs;
    if (o->inuse) return dmpy_raise(DM_ERR_BUSY, "CompressState.reset(): a call is using this state");
    if (r && o->count) memset(r, 0, (size_t)o->count * sizeof(float));
    Py_RETURN_NONE;
}
static PyObject* dmpy_cstate_repr(PyObject* self) {
    return PyUnicode_FromFormat("distmesh.CompressState(%zd)", ((dmpy_cstate*)self)->count);
}
static PyMethodDef dmpy_cstate_methods[] = {
    { "reset", dmpy_cstate_reset, METH_NOARGS,
      "Zeros the residual (a fresh start; Busy while a call is using the state)." },
    { NULL, NULL, 0, NULL }
};
static PyGetSetDef dmpy_cstate_getset[] = {
    { "count", dmpy_cstate_count, NULL, "the elements of the buffer this state serves", NULL },
    { "residual", dmpy_cstate_residual, NULL,
      "a writable memoryview of the count float32 residuals (what compression dropped, added to the next "
      "call): numpy.frombuffer(s.residual, numpy.float32), torch.frombuffer(s.residual, dtype=torch.float32); "
      "read it to checkpoint, write it to restore", NULL },
    { NULL, NULL, NULL, NULL, NULL }
};
PyTypeObject dmpy_CompressStateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "distmesh.CompressState",
    .tp_basicsize = sizeof(dmpy_cstate),
    .tp_dealloc = (destructor)dmpy_cstate_dealloc,
    .tp_repr = dmpy_cstate_repr,
    .tp_as_buffer = &dmpy_cstate_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "CompressState(count): the error feedback of a compressed all-reduce (C: dm_compress_state), one "
              "per buffer of count elements, passed as all_reduce(..., compress=\"int8\", state=s) to every call "
              "on that buffer: what compression dropped on this rank (count float32 residuals, zeros at first) "
              "is added to the next call. It belongs to the rank, not to a collective. One call at a time "
              "(a second one meanwhile raises Busy). The object is also a buffer of its residual.",
    .tp_methods = dmpy_cstate_methods,
    .tp_getset = dmpy_cstate_getset,
    .tp_new = dmpy_cstate_new,
};

