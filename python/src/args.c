/* distmesh._C -- the CPython extension over distmesh's public C API (docs/python.md): the
   arguments of its methods (dmpy.h says what the other files hold). The bottom of the
   extension: the other files call these, and these call nothing of theirs.

   SECTIONS
     >>args    positional-or-keyword arguments of the fast-call methods
*/
#include "dmpy.h"

/* ============================================================================================ */
/* >>args */

/* out[i] gets the argument named names[i], positional or keyword (NULL when absent); the first
   nreq are required. */
int dmpy_args(const char* fn, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, const char* const* names,
              int nnames, int nreq, PyObject** out) {
    Py_ssize_t k, nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    int i;
    if (nargs > nnames) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d arguments (%zd given)", fn, nnames, nargs);
        return -1;
    }
    for (i = 0; i < nnames; i++) out[i] = i < nargs ? args[i] : NULL;
    for (k = 0; k < nkw; k++) {
        PyObject* key = PyTuple_GET_ITEM(kwnames, k);
        for (i = 0; i < nnames; i++)
            if (PyUnicode_CompareWithASCIIString(key, names[i]) == 0) break;
        if (i == nnames) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", fn, key);
            return -1;
        }
        if (out[i]) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", fn, names[i]);
            return -1;
        }
        out[i] = args[nargs + k];
    }
    for (i = 0; i < nreq; i++)
        if (!out[i]) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", fn, names[i]);
            return -1;
        }
    return 0;
}
/* An int argument (absent or None -> dflt) within [lo, hi]. */
int dmpy_int(PyObject* o, const char* what, long dflt, long lo, long hi, long* out) {
    long v;
    if (!o || o == Py_None) { *out = dflt; return 0; }
    if (PyBool_Check(o) || !PyIndex_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", what, Py_TYPE(o)->tp_name);
        return -1;
    }
    v = PyLong_AsLong(o);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < lo || v > hi) {
        PyErr_Format(PyExc_ValueError, "%s must be in [%ld, %ld], got %ld", what, lo, hi, v);
        return -1;
    }
    *out = v;
    return 0;
}
int dmpy_bool(PyObject* o, int* out) {
    int v;
    if (!o) { *out = 0; return 0; }
    v = PyObject_IsTrue(o);
    if (v < 0) return -1;
    *out = v;
    return 0;
}
/* A str argument (absent or None -> NULL); the pointer lives as long as o. */
int dmpy_str(PyObject* o, const char* what, const char** out) {
    if (!o || o == Py_None) { *out = NULL; return 0; }
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be a str, not %.100s", what, Py_TYPE(o)->tp_name);
        return -1;
    }
    *out = PyUnicode_AsUTF8(o);
    return *out ? 0 : -1;
}
