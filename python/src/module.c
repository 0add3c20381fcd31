/* distmesh._C -- the CPython extension over distmesh's public C API (docs/python.md).

   Nothing here is a second implementation: every collective is a dm_* call on the caller's
   buffers. This file turns Python objects into pointers, counts and dtypes (checked before
   anything is sent), statuses into exceptions, and keeps the objects a call borrows alive.

   Sections (search for the tag):
     >>args      positional-or-keyword arguments of the fast-call methods
     >>errors    distmesh.Error and one subclass per status
     >>log       the logger of every collective made here: the last failure, for requests waited
                 on another thread than the one that issued them
     >>buffers   buffer protocol and DLPack -> pointer, count, dtype; the checks
     >>device    what a collective does with CUDA memory (an NCCL build), DLPack's stream
     >>acquire   dmpy_buf_get: an object's memory for a call, checked
     >>holders   Comm, Mesh, Strategy: who owns which handle; closing a holder closes its
                 dependents first
     >>sigint    Ctrl-C during a blocking call on the main thread: dm_abort from a watcher thread
     >>compress  CompressState: a compressed all-reduce's error-feedback state
     >>ops       one call: a dm_op and its buffers, run blocking or queued
     >>request   Request: an async call's buffers until it completes
     >>comm      Comm: accessors, collectives, groups
     >>store     Store: a rendezvous store (the torch backend's)
     >>mesh      Mesh and Strategy
     >>module    factories, module init

   Threads: every blocking call releases the GIL. A Comm counts the calls running on it with
   the GIL released (busy); close() refuses while any runs.

   Builds: by default (setup.py) the host backends only (DISTMESH_TCP). With DISTMESH_NCCL
   (DISTMESH_NCCL=1 pip install ..., make install PY_NCCL=1) the NCCL backend too, and CUDA
   memory from DLPack exporters (>>buffers, >>device); NCCL_BUILT says which. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "distmesh.h"

#if PY_VERSION_HEX >= 0x030D0000
#define DMPY_FINALIZING() Py_IsFinalizing()
#else
#define DMPY_FINALIZING() _Py_IsFinalizing()
#endif

/* ============================================================================================ */
/* >>args */

/* out[i] gets the argument named names[i], positional or keyword (NULL when absent); the first
   nreq are required. */
static int dmpy_args(const char* fn, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames,
                     const char* const* names, int nnames, int nreq, PyObject** out) {
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
static int dmpy_int(PyObject* o, const char* what, long dflt, long lo, long hi, long* out) {
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
static int dmpy_bool(PyObject* o, int* out) {
    int v;
    if (!o) { *out = 0; return 0; }
    v = PyObject_IsTrue(o);
    if (v < 0) return -1;
    *out = v;
    return 0;
}
/* A str argument (absent or None -> NULL); the pointer lives as long as o. */
static int dmpy_str(PyObject* o, const char* what, const char** out) {
    if (!o || o == Py_None) { *out = NULL; return 0; }
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be a str, not %.100s", what, Py_TYPE(o)->tp_name);
        return -1;
    }
    *out = PyUnicode_AsUTF8(o);
    return *out ? 0 : -1;
}

/* ============================================================================================ */
/* >>errors  distmesh.Error(RuntimeError) carries .status (the dm_status, negative), .status_name
   ("DM_ERR_PEER_LOST") and .message; one subclass per failure status of DM_STATUS_LIST, made
   here from the list itself, so a status added to distmesh.h gets its class with no edit here.
   The class name: the C name without "ERR_", each word capitalized (ERR_PEER_LOST -> PeerLost),
   except where dmpy_err_renames gives the name Python users already catch. Its docstring is
   the C text (dm_strerror). InvalidArgument is a ValueError too. */
#define _DMPY_X(name, val, text) + 1
enum { DMPY_NSTATUS = 0 DM_STATUS_LIST(_DMPY_X) };
#undef _DMPY_X
typedef struct { dm_status status; const char* c_name; } dmpy_status_def;
static const dmpy_status_def dmpy_statuses[DMPY_NSTATUS] = {
#define _DMPY_X(name, val, text) { DM_##name, #name },
    DM_STATUS_LIST(_DMPY_X)
#undef _DMPY_X
};
typedef struct { dm_status status; const char* name; } dmpy_err_rename;
static const dmpy_err_rename dmpy_err_renames[] = {
    { DM_ERR_INVALID_ARG, "InvalidArgument" }, { DM_ERR_INTERNAL, "InternalError" },
    { DM_ERR_NETWORK, "NetworkError" },        { DM_ERR_PROTOCOL, "ProtocolError" },
    { DM_ERR_ENV, "EnvError" },                { DM_ERR_CUDA, "CudaError" },
    { DM_ERR_NCCL, "NcclError" },              { DM_ERR_IO, "FileSystemError" },
};
static PyObject* dmpy_Error;
static PyObject* dmpy_errs[DMPY_NSTATUS];   /* by index in dmpy_statuses; NULL for DM_OK */

static PyObject* dmpy_err_class(dm_status st) {
    int i;
    for (i = 0; i < DMPY_NSTATUS; i++)
        if (dmpy_statuses[i].status == st && dmpy_errs[i]) return dmpy_errs[i];
    return dmpy_Error;
}
/* The Python class name of a failure status: the rename, else ERR_PEER_LOST -> PeerLost. */
static void dmpy_err_name(const dmpy_status_def* s, char* out, size_t cap) {
    const char* p = s->c_name;
    size_t i, n = 0;
    int up = 1;
    for (i = 0; i < sizeof(dmpy_err_renames) / sizeof(dmpy_err_renames[0]); i++)
        if (dmpy_err_renames[i].status == s->status) {
            snprintf(out, cap, "%s", dmpy_err_renames[i].name);
            return;
        }
    if (strncmp(p, "ERR_", 4) == 0) p += 4;
    for (; *p && n + 1 < cap; p++) {
        if (*p == '_') { up = 1; continue; }
        out[n++] = up ? (char)toupper((unsigned char)*p) : (char)tolower((unsigned char)*p);
        up = 0;
    }
    out[n] = '\0';
}
/* The exception instance for st: "<message> [DM_ERR_...]", with its attributes set. */
static PyObject* dmpy_error_new(dm_status st, const char* msg) {
    PyObject *cls = dmpy_err_class(st), *exc, *v;
    if (!msg || !msg[0]) msg = dm_strerror(st);
    exc = PyObject_CallFunction(cls, "s", msg);
    if (!exc) return NULL;
    if ((v = PyLong_FromLong((long)st)) == NULL || PyObject_SetAttrString(exc, "status", v) < 0) goto fail;
    Py_DECREF(v);
    if ((v = PyUnicode_FromString(dm_status_name(st))) == NULL || PyObject_SetAttrString(exc, "status_name", v) < 0)
        goto fail;
    Py_DECREF(v);
    if ((v = PyUnicode_FromString(msg)) == NULL || PyObject_SetAttrString(exc, "message", v) < 0) goto fail;
    Py_DECREF(v);
    return exc;
fail:
    Py_XDECREF(v);
    Py_DECREF(exc);
    return NULL;
}
/* Raises st. When a signal arrived meanwhile (Ctrl-C aborted the call), Python's handler runs
   now: its exception (KeyboardInterrupt) is raised instead, with this error as its context. */
static PyObject* dmpy_raise(dm_status st, const char* msg) {
    PyObject* exc = dmpy_error_new(st, msg);
    if (!exc) return NULL;
    if (PyErr_CheckSignals() < 0) {
        PyObject *t, *v, *tb;
        PyErr_Fetch(&t, &v, &tb);
        PyErr_NormalizeException(&t, &v, &tb);
        if (v) PyException_SetContext(v, exc); else Py_DECREF(exc);   /* SetContext steals exc */
        PyErr_Restore(t, v, tb);
        return NULL;
    }
    PyErr_SetObject((PyObject*)Py_TYPE(exc), exc);
    Py_DECREF(exc);
    return NULL;
}

/* Error, then one class per failure status; _C.STATUSES lists every entry of DM_STATUS_LIST as
   (value, "DM_..." name, C text, class or None for DM_OK), in the list's order. */
static int dmpy_errors_init(PyObject* m) {
    PyObject* list;
    int i;
    dmpy_Error = PyErr_NewExceptionWithDoc("distmesh.Error",
        "A distmesh failure: .status (the C status, negative), .status_name, .message.", PyExc_RuntimeError, NULL);
    if (!dmpy_Error || PyModule_AddObjectRef(m, "Error", dmpy_Error) < 0) return -1;
    if (!(list = PyTuple_New(DMPY_NSTATUS))) return -1;
    for (i = 0; i < DMPY_NSTATUS; i++) {
        const dmpy_status_def* s = &dmpy_statuses[i];
        const char* text = dm_strerror(s->status);
        char name[64], qual[80], doc[320];
        PyObject *bases, *entry;
        if (s->status != DM_OK) {
            dmpy_err_name(s, name, sizeof(name));
            snprintf(qual, sizeof(qual), "distmesh.%s", name);
            snprintf(doc, sizeof(doc), "%c%s (%s = %d)%s.", toupper((unsigned char)text[0]), text + 1,
                     dm_status_name(s->status), (int)s->status,
                     s->status == DM_ERR_INVALID_ARG ? "; also a ValueError" : "");
            bases = s->status == DM_ERR_INVALID_ARG ? PyTuple_Pack(2, dmpy_Error, PyExc_ValueError)
                                                    : PyTuple_Pack(1, dmpy_Error);
            if (!bases) goto fail;
            dmpy_errs[i] = PyErr_NewExceptionWithDoc(qual, doc, bases, NULL);
            Py_DECREF(bases);
            if (!dmpy_errs[i] || PyModule_AddObjectRef(m, name, dmpy_errs[i]) < 0) goto fail;
        }
        entry = Py_BuildValue("(issO)", (int)s->status, dm_status_name(s->status), text,
                              dmpy_errs[i] ? dmpy_errs[i] : Py_None);
        if (!entry) goto fail;
        PyTuple_SET_ITEM(list, i, entry);
    }
    if (PyModule_AddObjectRef(m, "STATUSES", list) < 0) goto fail;
    Py_DECREF(list);
    return 0;
fail:
    Py_DECREF(list);
    return -1;
}
/* _C._error(status, message) -> the exception instance distmesh raises for status (tests). */
static PyObject* dmpy_m_error(PyObject* mod, PyObject* args) {
    int st;
    const char* msg;
    (void)mod;
    if (!PyArg_ParseTuple(args, "is:_error", &st, &msg)) return NULL;
    return dmpy_error_new((dm_status)st, msg);
}

/* ============================================================================================ */
/* >>log  Each collective made here logs into one of these (sub-collectives share their parent's).
   The library writes a request's failure into the issuing thread's last_error only when that
   thread waits for it; a request waited elsewhere (the torch backend's completer) takes its
   message from here. Called on any thread, without the GIL: plain C and a mutex. */
typedef struct dmpy_log {
    pthread_mutex_t mu;
    int refs;                   /* under the GIL */
    dm_status status;
    char msg[DM_LAST_ERROR_SIZE];
} dmpy_log;
static void dmpy_log_fn(dm_log_level level, dm_status status, const char* message, const char* file, int line,
                        void* user_data) {
    dmpy_log* lg = (dmpy_log*)user_data;
    (void)file; (void)line;
    if (level != DM_LOG_ERROR || !lg) return;
    pthread_mutex_lock(&lg->mu);
    lg->status = status;
    snprintf(lg->msg, sizeof(lg->msg), "%s", message ? message : "");
    pthread_mutex_unlock(&lg->mu);
}
static dmpy_log* dmpy_log_new(void) {
    dmpy_log* lg = (dmpy_log*)calloc(1, sizeof(dmpy_log));
    if (!lg) { PyErr_NoMemory(); return NULL; }
    pthread_mutex_init(&lg->mu, NULL);
    lg->refs = 1;
    return lg;
}
static dmpy_log* dmpy_log_ref(dmpy_log* lg) { if (lg) lg->refs++; return lg; }
static void dmpy_log_unref(dmpy_log* lg) {
    if (!lg || --lg->refs > 0) return;
    pthread_mutex_destroy(&lg->mu);
    free(lg);
}
/* The last failure logged with status st, or "" (copied into out). */
static void dmpy_log_last(dmpy_log* lg, dm_status st, char* out, size_t cap) {
    out[0] = 0;
    if (!lg) return;
    pthread_mutex_lock(&lg->mu);
    if (lg->status == st) snprintf(out, cap, "%s", lg->msg);
    pthread_mutex_unlock(&lg->mu);
}
static dm_logger dmpy_logger(dmpy_log* lg) {
    dm_logger l;
    l.func = dmpy_log_fn;
    l.user_data = lg;
    return l;
}

/* ============================================================================================ */
/* >>buffers  What a call reads or writes: an object's memory, without a copy.
   - The buffer protocol (numpy arrays, bytearray, memoryview, array.array, bytes): contiguous
     (C or Fortran order), its format naming the dtype.
   - torch tensors (torch._C._to_dlpack, which also exports tensors that require grad) and any
     other __dlpack__ exporter: CPU memory, compact strides; bfloat16 and float16 included.
     CUDA memory (DLPack kDLCUDA, kDLCUDAManaged) only in an NCCL build and on a collective
     that takes it (>>device); elsewhere a TypeError saying why.
   Formats distmesh cannot reduce (bool, int16, complex, records) still move as raw bytes
   (all_gather, broadcast, send, ...): dtype DMPY_RAW / DMPY_BOOL, counted in bytes. */
enum { DMPY_RAW = -1, DMPY_BOOL = -2 };
enum { DMPY_READ = 0, DMPY_WRITE = 1, DMPY_REDUCE = 2 };
typedef struct dmpy_buf {
    char* ptr;
    size_t nbytes, itemsize, count;   /* count: elements (raw: nbytes / itemsize) */
    int dtype;                        /* a dm_dtype, or DMPY_RAW / DMPY_BOOL */
    bool readonly;
    bool has_view;
    Py_buffer view;
    PyObject* capsule;                /* a DLPack capsule kept while the memory is used */
} dmpy_buf;

/* DLPack's ABI (dlpack.h v0.x, the layout torch 1.13 exports), declared here. */
typedef struct { int32_t device_type, device_id; } dmpy_dl_device;
typedef struct { uint8_t code, bits; uint16_t lanes; } dmpy_dl_dtype;
typedef struct {
    void* data;
    dmpy_dl_device device;
    int32_t ndim;
    dmpy_dl_dtype dtype;
    int64_t* shape;
    int64_t* strides;
    uint64_t byte_offset;
} dmpy_dl_tensor;
typedef struct dmpy_dl_managed {
    dmpy_dl_tensor dl_tensor;
    void* manager_ctx;
    void (*deleter)(struct dmpy_dl_managed*);
} dmpy_dl_managed;
enum { DMPY_DL_CPU = 1, DMPY_DL_CUDA = 2, DMPY_DL_CUDA_HOST = 3, DMPY_DL_CUDA_MANAGED = 13 };
enum { DMPY_DL_INT = 0, DMPY_DL_UINT = 1, DMPY_DL_FLOAT = 2, DMPY_DL_BFLOAT = 4, DMPY_DL_COMPLEX = 5,
       DMPY_DL_BOOL = 6 };

static PyObject* g_torch_tensor;      /* torch.Tensor, once torch has been imported */
static PyObject* g_to_dlpack;         /* torch._C._to_dlpack (else torch.utils.dlpack.to_dlpack) */

static void dmpy_buf_init(dmpy_buf* b) { memset(b, 0, sizeof(*b)); b->dtype = DMPY_RAW; }
static void dmpy_buf_release(dmpy_buf* b) {
    if (b->has_view) PyBuffer_Release(&b->view);
    if (b->capsule && PyErr_Occurred()) {     /* the exporter's capsule destructor may run Python */
        PyObject *t, *v, *tb;
        PyErr_Fetch(&t, &v, &tb);
        Py_CLEAR(b->capsule);
        PyErr_Restore(t, v, tb);
    }
    Py_CLEAR(b->capsule);
    b->has_view = false;
    b->ptr = NULL;
}

static const char* dmpy_dtype_name(int dtype) {
    if (dtype == DMPY_BOOL) return "bool";
    if (dtype < 0) return "raw bytes";
    return dm_dtype_name((dm_dtype)dtype);
}
/* The dtype that moves b (raw bytes go as uint8) and the count in that dtype. */
static dm_dtype dmpy_move_dtype(const dmpy_buf* b) { return b->dtype >= 0 ? (dm_dtype)b->dtype : DM_UINT8; }
static size_t dmpy_move_count(const dmpy_buf* b) { return b->dtype >= 0 ? b->count : b->nbytes; }

/* Buffer-protocol format -> dtype (native byte order only for reductions). */
static int dmpy_format_dtype(const char* fmt, Py_ssize_t itemsize, bool* foreign) {
    char k;
    *foreign = false;
    if (!fmt) return itemsize == 1 ? DM_UINT8 : DMPY_RAW;
    if (*fmt == '@' || *fmt == '=' || *fmt == '<') fmt++;
    else if (*fmt == '>' || *fmt == '!') { *foreign = true; return DMPY_RAW; }
    if (!fmt[0] || fmt[1]) return DMPY_RAW;           /* records, complex 'Zf', ... */
    k = fmt[0];
    switch (k) {
        case 'b': return DM_INT8;
        case 'B': return DM_UINT8;
        case '?': return DMPY_BOOL;
        case 'e': return itemsize == 2 ? DM_FLOAT16 : DMPY_RAW;
        case 'f': return itemsize == 4 ? DM_FLOAT32 : DMPY_RAW;
        case 'd': return itemsize == 8 ? DM_FLOAT64 : DMPY_RAW;
        case 'i': case 'l': case 'q': case 'n':
            return itemsize == 4 ? DM_INT32 : itemsize == 8 ? DM_INT64 : DMPY_RAW;
        case 'I': case 'L': case 'Q': case 'N':
            return itemsize == 4 ? DM_UINT32 : itemsize == 8 ? DM_UINT64 : DMPY_RAW;
        default: return DMPY_RAW;
    }
}
static int dmpy_dl_dtype_of(dmpy_dl_dtype t) {
    if (t.lanes != 1) return DMPY_RAW;
    switch (t.code) {
        case DMPY_DL_INT: return t.bits == 8 ? DM_INT8 : t.bits == 32 ? DM_INT32 : t.bits == 64 ? DM_INT64 : DMPY_RAW;
        case DMPY_DL_UINT: return t.bits == 8 ? DM_UINT8 : t.bits == 32 ? DM_UINT32 : t.bits == 64 ? DM_UINT64 : DMPY_RAW;
        case DMPY_DL_FLOAT:
            return t.bits == 16 ? DM_FLOAT16 : t.bits == 32 ? DM_FLOAT32 : t.bits == 64 ? DM_FLOAT64 : DMPY_RAW;
        case DMPY_DL_BFLOAT: return t.bits == 16 ? DM_BFLOAT16 : DMPY_RAW;
        case DMPY_DL_BOOL: return DMPY_BOOL;
        default: return DMPY_RAW;
    }
}

/* torch.Tensor and its exporter, looked up once torch is in sys.modules (never imported here). */
static bool dmpy_is_torch(PyObject* o) {
    if (!g_torch_tensor) {
        PyObject *name = PyUnicode_FromString("torch"), *torch, *c_mod;
        torch = name ? PyImport_GetModule(name) : NULL;
        Py_XDECREF(name);
        if (!torch) { PyErr_Clear(); return false; }
        g_torch_tensor = PyObject_GetAttrString(torch, "Tensor");
        c_mod = PyObject_GetAttrString(torch, "_C");
        g_to_dlpack = c_mod ? PyObject_GetAttrString(c_mod, "_to_dlpack") : NULL;
        Py_XDECREF(c_mod);
        if (!g_to_dlpack) {
            PyObject* u;
            PyErr_Clear();
            u = PyImport_ImportModule("torch.utils.dlpack");
            g_to_dlpack = u ? PyObject_GetAttrString(u, "to_dlpack") : NULL;
            Py_XDECREF(u);
        }
        Py_DECREF(torch);
        if (!g_torch_tensor || !g_to_dlpack) {
            PyErr_Clear();
            Py_CLEAR(g_torch_tensor);
            Py_CLEAR(g_to_dlpack);
            return false;
        }
    }
    return PyObject_TypeCheck(o, (PyTypeObject*)g_torch_tensor);
}

static int dmpy_buf_checks(dmpy_buf* b, const char* what, int flags) {
    if ((flags & DMPY_WRITE) && b->readonly) {
        PyErr_Format(PyExc_TypeError, "%s is read-only, and this call writes into it", what);
        return -1;
    }
    if ((flags & DMPY_REDUCE) && b->dtype < 0) {
        PyErr_Format(PyExc_TypeError, "%s holds %s, which distmesh cannot reduce (int8, uint8, int32, uint32, "
                     "int64, uint64, float16, bfloat16, float32, float64)", what, dmpy_dtype_name(b->dtype));
        return -1;
    }
    return 0;
}

static int dmpy_buf_from_view(PyObject* obj, const char* what, dmpy_buf* b) {
    bool foreign = false;
    if (PyObject_GetBuffer(obj, &b->view, PyBUF_RECORDS_RO) < 0) {
        PyObject *t, *v, *tb;
        PyErr_Fetch(&t, &v, &tb);
        PyErr_NormalizeException(&t, &v, &tb);
        PyErr_Format(PyExc_TypeError, "%s (%.100s): its buffer cannot be read (%S)", what, Py_TYPE(obj)->tp_name,
                     v ? v : Py_None);
        Py_XDECREF(t); Py_XDECREF(v); Py_XDECREF(tb);
        return -1;
    }
    b->has_view = true;
    if (!PyBuffer_IsContiguous(&b->view, 'A')) {
        PyErr_Format(PyExc_ValueError, "%s is not contiguous; pass a contiguous copy (numpy.ascontiguousarray, "
                     "tensor.contiguous())", what);
        return -1;
    }
    b->ptr = (char*)b->view.buf;
    b->nbytes = (size_t)b->view.len;
    b->itemsize = b->view.itemsize > 0 ? (size_t)b->view.itemsize : 1;
    b->count = b->nbytes / b->itemsize;
    b->readonly = b->view.readonly != 0;
    b->dtype = dmpy_format_dtype(b->view.format, b->view.itemsize, &foreign);   /* big-endian: raw bytes */
    return 0;
}

/* >>device  What a collective does with CUDA memory (set when it is wrapped, from its backend):
   NONE  refuses it (every collective of a CPU-only build; fake and thread in an NCCL build);
   STAGED  the TCP backend with DISTMESH_CUDA (implied by DISTMESH_NCCL): it copies through
         pinned host memory after the work queued on the legacy default stream, and returns
         with the result in device memory;
   STREAM  the NCCL backend: queued on the collective's stream; blocking calls here then wait
         for it (dm_synchronize, with the deadline: >>ops), so they return with the data ready,
         as mpi4py does over a CUDA-aware MPI; requests complete on the CUDA event recorded
         after their work, so wait() and is_completed() also mean the data is ready.
   stream: what the exporter's __dlpack__(stream=) gets (DLPack: the consumer's stream, which the
   producer makes wait for its pending work): the NCCL stream, or 1 (the legacy default
   stream) for STAGED. */
enum { DMPY_DEV_NONE = 0, DMPY_DEV_STAGED = 1, DMPY_DEV_STREAM = 2 };
typedef struct dmpy_dev {
    int kind;
    Py_ssize_t stream;
    const char* backend;        /* dm_backend_name: static text */
} dmpy_dev;

static bool dmpy_dl_is_cuda(int device_type) {
    return device_type == DMPY_DL_CUDA || device_type == DMPY_DL_CUDA_MANAGED;
}
/* 0 if dev takes CUDA memory, else -1 with a TypeError naming why (before anything is sent). */
static int dmpy_dev_refuse(const dmpy_dev* dev, const char* what, int device_type) {
    if (dev && dev->kind != DMPY_DEV_NONE) return 0;
#if defined(DISTMESH_NCCL)
    if (dev)
        PyErr_Format(PyExc_TypeError, "%s lives in CUDA memory (DLPack device type %d); the %s backend takes host "
                     "memory only (CUDA memory: a collective from distmesh.connect_nccl(), or connect()'s TCP "
                     "backend, which stages it)", what, device_type, dev->backend);
    else
        PyErr_Format(PyExc_TypeError, "%s lives in CUDA memory (DLPack device type %d); only a collective's calls "
                     "take it", what, device_type);
#else
    PyErr_Format(PyExc_TypeError, "%s lives in CUDA memory (DLPack device type %d); this build of distmesh takes "
                 "host memory only: CUDA tensors need a build with NCCL (DISTMESH_NCCL=1 pip install "
                 "--no-build-isolation ./python, or make install PY_NCCL=1; docs/python.md)", what, device_type);
#endif
    return -1;
}

#if defined(DISTMESH_NCCL)
/* The device type obj says it lives on before it is exported (torch: is_cuda; else DLPack's
   __dlpack_device__()), or 0 where it does not say. */
static int dmpy_dl_device_before(PyObject* obj, bool torch) {
    PyObject* r;
    int type = 0;
    if (torch) {
        r = PyObject_GetAttrString(obj, "is_cuda");
        if (r) type = PyObject_IsTrue(r) == 1 ? DMPY_DL_CUDA : 0;
        Py_XDECREF(r);
        PyErr_Clear();
        return type;
    }
    if (!PyObject_HasAttrString(obj, "__dlpack_device__")) return 0;
    r = PyObject_CallMethod(obj, "__dlpack_device__", NULL);
    if (r && PyTuple_Check(r) && PyTuple_GET_SIZE(r) >= 1) type = (int)PyLong_AsLong(PyTuple_GET_ITEM(r, 0));
    Py_XDECREF(r);
    PyErr_Clear();              /* an exporter that cannot say: __dlpack__() without a stream */
    return type;
}
/* obj.__dlpack__(stream=dev->stream); a torch tensor is detached first (torch refuses to export
   one that requires grad through __dlpack__; the detached tensor shares its memory). */
static PyObject* dmpy_dl_export_on_stream(PyObject* obj, bool torch, const dmpy_dev* dev) {
    PyObject *src, *fn, *args, *kw, *cap = NULL;
    src = torch ? PyObject_CallMethod(obj, "detach", NULL) : Py_NewRef(obj);
    if (!src) return NULL;
    fn = PyObject_GetAttrString(src, "__dlpack__");
    args = PyTuple_New(0);
    kw = Py_BuildValue("{s:n}", "stream", dev->stream);
    if (fn && args && kw) cap = PyObject_Call(fn, args, kw);
    Py_XDECREF(fn);
    Py_XDECREF(args);
    Py_XDECREF(kw);
    Py_DECREF(src);
    return cap;
}
#endif

/* obj's DLPack capsule. CUDA memory on a collective that takes it is exported with that
   collective's stream (>>device); elsewhere it is refused before the export (*refused: the
   TypeError is already set). The rest is exported as before. */
static PyObject* dmpy_dl_export(PyObject* obj, const char* what, bool torch, const dmpy_dev* dev, bool* refused) {
#if defined(DISTMESH_NCCL)
    int before = dmpy_dl_device_before(obj, torch);
    if (dmpy_dl_is_cuda(before)) {
        if (dmpy_dev_refuse(dev, what, before) < 0) { *refused = true; return NULL; }
        return dmpy_dl_export_on_stream(obj, torch, dev);
    }
#else
    (void)what; (void)dev;
#endif
    *refused = false;
    return torch ? PyObject_CallOneArg(g_to_dlpack, obj) : PyObject_CallMethod(obj, "__dlpack__", NULL);
}

/* >>acquire  An object's memory for one call: the buffer protocol, else DLPack; checked. */
static int dmpy_buf_from_dlpack(const dmpy_dev* dev, PyObject* obj, const char* what, bool torch, dmpy_buf* b) {
    dmpy_dl_managed* m;
    dmpy_dl_tensor* t;
    int64_t n = 1, expect = 1;
    int i;
    bool refused = false;
    b->capsule = dmpy_dl_export(obj, what, torch, dev, &refused);
    if (!b->capsule && refused) return -1;
    if (!b->capsule) {
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);
        PyErr_NormalizeException(&et, &ev, &etb);
        PyErr_Format(PyExc_TypeError, "%s (%.100s): cannot export it through DLPack (%S)", what,
                     Py_TYPE(obj)->tp_name, ev ? ev : Py_None);
        Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(etb);
        return -1;
    }
    m = (dmpy_dl_managed*)PyCapsule_GetPointer(b->capsule, "dltensor");
    if (!m) return -1;
    t = &m->dl_tensor;
    /* CUDA memory an exporter did not announce (no __dlpack_device__) goes without a stream:
       DLPack's producer then orders it on the legacy default stream, which both the NCCL
       stream and the TCP staging wait for. */
    if (dmpy_dl_is_cuda(t->device.device_type)) {
        if (dmpy_dev_refuse(dev, what, (int)t->device.device_type) < 0) return -1;
    } else if (t->device.device_type != DMPY_DL_CPU && t->device.device_type != DMPY_DL_CUDA_HOST) {
        PyErr_Format(PyExc_TypeError, "%s lives on device type %d (DLPack); distmesh takes CPU memory%s", what,
                     (int)t->device.device_type,
#if defined(DISTMESH_NCCL)
                     " and CUDA memory (device types 2, 13)"
#else
                     ""
#endif
                     );
        return -1;
    }
    for (i = 0; i < t->ndim; i++) n *= t->shape[i];
    if (t->strides && n > 0)     /* compact row-major: each stride the product of the later dims */
        for (i = t->ndim - 1; i >= 0; i--) {
            if (t->shape[i] != 1 && t->strides[i] != expect) {
                PyErr_Format(PyExc_ValueError, "%s is not contiguous; pass a contiguous copy (tensor.contiguous())",
                             what);
                return -1;
            }
            expect *= t->shape[i];
        }
    b->itemsize = ((size_t)t->dtype.bits * t->dtype.lanes + 7) / 8;
    if (b->itemsize == 0) b->itemsize = 1;
    b->ptr = (char*)t->data + t->byte_offset;
    b->count = (size_t)n;
    b->nbytes = (size_t)n * b->itemsize;
    b->readonly = false;
    b->dtype = dmpy_dl_dtype_of(t->dtype);
    return 0;
}

/* Acquires obj's memory for a call on a collective whose device handling is dev (NULL: none).
   flags: DMPY_WRITE (the call writes it), DMPY_REDUCE (a reducible dtype). */
static int dmpy_buf_get(const dmpy_dev* dev, PyObject* obj, const char* what, int flags, dmpy_buf* b) {
    bool torch;
    dmpy_buf_init(b);
    if (!obj || obj == Py_None) {
        PyErr_Format(PyExc_TypeError, "%s is None; a buffer is needed (a numpy array, bytearray, memoryview, "
                     "array.array or CPU torch tensor)", what);
        return -1;
    }
    if (PyObject_CheckBuffer(obj)) {
        if (dmpy_buf_from_view(obj, what, b) < 0) goto fail;
    } else if ((torch = dmpy_is_torch(obj)) || PyObject_HasAttrString(obj, "__dlpack__")) {
        if (dmpy_buf_from_dlpack(dev, obj, what, torch, b) < 0) goto fail;
    } else {
        PyErr_Format(PyExc_TypeError, "%s: expected a buffer (a numpy array, bytearray, memoryview, array.array or "
                     "CPU torch tensor), got %.100s", what, Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (dmpy_buf_checks(b, what, flags) < 0) goto fail;
    return 0;
fail:
    dmpy_buf_release(b);
    return -1;
}
/* a and b hold the same kind of element (dtype, and size for raw ones). */
static int dmpy_same_dtype(const dmpy_buf* a, const char* an, const dmpy_buf* b, const char* bn) {
    if (a->dtype == b->dtype && (a->dtype >= 0 || a->itemsize == b->itemsize)) return 0;
    PyErr_Format(PyExc_TypeError, "%s holds %s (%zu-byte elements) but %s holds %s (%zu-byte elements)", an,
                 dmpy_dtype_name(a->dtype), a->itemsize, bn, dmpy_dtype_name(b->dtype), b->itemsize);
    return -1;
}
static int dmpy_size_is(const dmpy_buf* b, const char* what, size_t want, const char* why) {
    if (b->nbytes == want) return 0;
    PyErr_Format(PyExc_ValueError, "%s holds %zu bytes; %s needs %zu", what, b->nbytes, why, want);
    return -1;
}

/* ============================================================================================ */
/* >>holders  Comm (a dm_collective), Mesh (dm_mesh) and Strategy (dm_strategy) share this head.
   owner: the holder whose handle this one's lives in (a mesh's group -> the mesh, the mesh ->
   its world, dm_local's group -> its parent), held strongly, so owners outlive dependents in
   Python. close() on an owner first closes every open holder whose owner chain reaches it
   (the registry is the list of open holders), then releases its own handle (when owns). */
enum { DMPY_COMM = 1, DMPY_MESH = 2, DMPY_STRATEGY = 3 };
typedef struct dmpy_holder {
    PyObject_HEAD
    void* handle;               /* NULL once closed */
    struct dmpy_holder* owner;
    PyObject* keep;             /* what the handle borrows (a Store) */
    int kind;
    bool owns;                  /* close() destroys the handle */
    int busy;                   /* calls running on it with the GIL released */
    struct dmpy_holder *prev, *next;
    PyObject* weakrefs;
} dmpy_holder;
static dmpy_holder* g_holders;

struct dmpy_request;
typedef struct dmpy_comm {
    dmpy_holder h;
    struct dmpy_request* pending;   /* requests not finished yet */
    dmpy_log* log;
    dmpy_dev dev;                   /* what it does with CUDA memory (>>device) */
} dmpy_comm;

static void dmpy_holder_link(dmpy_holder* h) {
    h->prev = NULL;
    h->next = g_holders;
    if (g_holders) g_holders->prev = h;
    g_holders = h;
}
static void dmpy_holder_unlink(dmpy_holder* h) {
    if (h->prev) h->prev->next = h->next;
    else if (g_holders == h) g_holders = h->next;
    if (h->next) h->next->prev = h->prev;
    h->prev = h->next = NULL;
}
static bool dmpy_depends_on(const dmpy_holder* x, const dmpy_holder* h) {
    for (x = x->owner; x; x = x->owner)
        if (x == h) return true;
    return false;
}
/* The handle of an open holder whose owners are open too; else ValueError. */
static void* dmpy_handle(void* self) {
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
static int dmpy_request_finish_all(dmpy_comm* c);
static int dmpy_close(dmpy_holder* h) {
    dmpy_holder* x;
    void* handle;
    if (!h->handle) return 0;
    if (h->busy > 0) {
        dmpy_raise(DM_ERR_BUSY, "close(): a call is running on this object in another thread");
        return -1;
    }
    for (;;) {                  /* dependents first; the registry changes as they close */
        for (x = g_holders; x; x = x->next)
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
static void dmpy_holder_dealloc_common(dmpy_holder* h) {
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
/* >>sigint  Ctrl-C while the main thread is blocked in a call (GIL released): Python's own
   handler only sets a flag, read when the call returns -- at its deadline. For the duration of
   each blocking call on the main thread this handler takes SIGINT's place: it writes the call's
   number to a pipe (async-signal-safe) and then runs Python's handler. A watcher thread (one per
   process, started at the first such call, all signals blocked) reads the pipe and calls
   dm_abort on the collective of that call if it is still running: the call fails at once with
   DM_ERR_ABORTED, the peers get an error naming this rank, and the caller raises what Python's
   handler set (KeyboardInterrupt). Between calls the handler stays in place (a SIGINT then only
   chains to Python's: no call is running, the watcher ignores it), because swapping it at every
   call cost two sigaction calls, half of Python's cost over the C call at 8 B. Whether it is
   still the installed one (signal.signal puts Python's back) is checked at a call at most every
   _DMPY_SIG_RECHECK_MS, so for that long after such a change a Ctrl-C in a call is Python's
   alone again (the call runs to its end or deadline). A SIGINT handler that is SIG_IGN or
   SIG_DFL is left alone (nothing is armed). */
#define _DMPY_SIG_RECHECK_MS 100
static struct {
    pthread_mutex_t mu;         /* guards running / running_gen and the watcher's start */
    int pipe_r, pipe_w;
    bool started, failed;
    struct sigaction python;    /* the handler chained to (Python's, read before arming) */
    bool have_python;
    uint64_t gen;               /* calls armed so far (atomic: the handler reads it) */
    dm_collective* running;     /* the armed call's collective, NULL between calls */
    uint64_t running_gen;
    unsigned long main_ident;   /* the main thread (PyThread_get_thread_ident) */
    bool installed;             /* ours was installed at checked_ms (the main thread's) */
    int64_t checked_ms;
} g_sig = { PTHREAD_MUTEX_INITIALIZER, -1, -1, false, false, { { 0 } }, false, 0, NULL, 0, 0, false, 0 };

static void dmpy_sigint_handler(int sig, siginfo_t* info, void* ctx) {
    int saved = errno;
    uint64_t gen = __atomic_load_n(&g_sig.gen, __ATOMIC_ACQUIRE);
    if (g_sig.pipe_w >= 0) {
        ssize_t n = write(g_sig.pipe_w, &gen, sizeof(gen));
        (void)n;
    }
    if (g_sig.python.sa_flags & SA_SIGINFO) {
        if (g_sig.python.sa_sigaction) g_sig.python.sa_sigaction(sig, info, ctx);
    } else if (g_sig.python.sa_handler != SIG_DFL && g_sig.python.sa_handler != SIG_IGN) {
        g_sig.python.sa_handler(sig);
    }
    errno = saved;
}
static void* dmpy_sig_watcher(void* arg) {
    sigset_t all;
    int fd = (int)(intptr_t)arg;
    (void)arg;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    for (;;) {
        uint64_t gen;
        ssize_t n = read(fd, &gen, sizeof(gen));
        if (n < 0 && errno == EINTR) continue;
        if (n != (ssize_t)sizeof(gen)) break;          /* the pipe closed (fork child reset) */
        pthread_mutex_lock(&g_sig.mu);
        if (g_sig.running && g_sig.running_gen == gen) dm_abort(g_sig.running, "KeyboardInterrupt (SIGINT)");
        pthread_mutex_unlock(&g_sig.mu);
    }
    return NULL;
}
/* A forked child has no watcher thread: it starts its own at its first armed call. */
static void dmpy_sig_atfork_child(void) {
    pthread_mutex_init(&g_sig.mu, NULL);
    if (g_sig.pipe_r >= 0) close(g_sig.pipe_r);
    if (g_sig.pipe_w >= 0) close(g_sig.pipe_w);
    g_sig.pipe_r = g_sig.pipe_w = -1;
    g_sig.started = g_sig.failed = false;
    g_sig.running = NULL;
}
static bool dmpy_sig_start(void) {
    pthread_t th;
    pthread_attr_t attr;
    int fds[2];
    if (g_sig.started) return true;
    if (g_sig.failed) return false;
    g_sig.failed = true;
    if (pipe2(fds, O_CLOEXEC) != 0) return false;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&th, &attr, dmpy_sig_watcher, (void*)(intptr_t)fds[0]) != 0) {
        pthread_attr_destroy(&attr);
        close(fds[0]); close(fds[1]);
        return false;
    }
    pthread_attr_destroy(&attr);
    g_sig.pipe_r = fds[0];
    g_sig.pipe_w = fds[1];
    if (sigaction(SIGINT, NULL, &g_sig.python) == 0) g_sig.have_python = true;
    g_sig.started = true;
    g_sig.failed = false;
    return true;
}
typedef struct dmpy_sig { bool armed, registered; } dmpy_sig;
/* Before a blocking call on c (GIL held). */
static int64_t dmpy_sig_now_ms(void) {
    struct timespec ts;
#if defined(CLOCK_MONOTONIC_COARSE)
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
#else
    clock_gettime(CLOCK_MONOTONIC, &ts);
#endif
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
static void dmpy_sig_begin(dm_collective* c, dmpy_sig* s) {
    struct sigaction ours, prev;
    int64_t now;
    s->armed = s->registered = false;
    if (PyThread_get_thread_ident() != g_sig.main_ident || !dmpy_sig_start() || !g_sig.have_python) return;
    pthread_mutex_lock(&g_sig.mu);
    if (g_sig.running) { pthread_mutex_unlock(&g_sig.mu); return; }  /* a nested call: the outer is armed */
    g_sig.running = c;
    g_sig.running_gen = __atomic_add_fetch(&g_sig.gen, 1, __ATOMIC_ACQ_REL);
    pthread_mutex_unlock(&g_sig.mu);
    s->registered = true;
    now = dmpy_sig_now_ms();
    if (g_sig.installed && now - g_sig.checked_ms < _DMPY_SIG_RECHECK_MS) { s->armed = true; return; }
    g_sig.installed = false;
    memset(&ours, 0, sizeof(ours));
    ours.sa_sigaction = dmpy_sigint_handler;
    ours.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&ours.sa_mask);
    if (sigaction(SIGINT, &ours, &prev) != 0) return;
    if (!(prev.sa_flags & SA_SIGINFO) && (prev.sa_handler == SIG_DFL || prev.sa_handler == SIG_IGN)) {
        sigaction(SIGINT, &prev, NULL);           /* Python does not handle SIGINT: leave it */
        g_sig.python = prev;
        return;
    }
    g_sig.installed = true;
    g_sig.checked_ms = now;
    s->armed = true;
    if ((prev.sa_flags & SA_SIGINFO) && prev.sa_sigaction == dmpy_sigint_handler) return;  /* ours still */
    if (memcmp(&prev, &g_sig.python, sizeof(prev)) != 0) g_sig.python = prev;   /* changed since */
}
static void dmpy_sig_end(dmpy_sig* s) {
    if (s->registered) {
        pthread_mutex_lock(&g_sig.mu);
        g_sig.running = NULL;
        pthread_mutex_unlock(&g_sig.mu);
    }
}

/* ============================================================================================ */
/* >>compress  distmesh.CompressState(count): a dm_compress_state (the error feedback of
   all_reduce(..., compress=, state=)), count float32 residuals. The object is itself a
   writable buffer of them (format "f", shape (count,)); .residual is a memoryview of it, which
   keeps the state alive while it is used. A call that takes the state holds a reference to it
   until it completes (async too) and marks it in use: the C state is one call at a time, so a
   second call or reset() meanwhile raises Busy before anything is sent. */
typedef struct dmpy_cstate {
    PyObject_HEAD
    dm_compress_state* s;
    Py_ssize_t count;           /* the buffer's shape */
    bool inuse;                 /* a call holds it */
} dmpy_cstate;
static PyTypeObject dmpy_CompressStateType;

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
static PyTypeObject dmpy_CompressStateType = {
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

/* ============================================================================================ */
/* >>ops  One call: the dm_op distmesh.h's dm_submit takes, and the buffers it holds until it is
   done, checked; run blocking (GIL released, Ctrl-C armed) or queued as a request. */
#define DMPY_FIXED 3
typedef struct dmpy_op {
    dm_op c;                    /* the call itself, as dm_submit takes it */
    dmpy_buf b[DMPY_FIXED];     /* the buffers of the call */
    dmpy_buf* many;             /* all_gather_to_list's outputs */
    Py_ssize_t nmany;
    void** ptrs;                /* their pointers (c.recvs) */
    size_t* arrays;             /* all_to_all_v: counts and offsets, 4 x world (c.send_counts ...) */
    PyObject* result;           /* what the call returns (None when NULL) */
    dmpy_cstate* state;         /* all_reduce's CompressState (c.compress_state), held and in use */
} dmpy_op;

static void dmpy_op_init(dmpy_op* o, dm_op_kind kind) {
    int i;
    memset(o, 0, sizeof(*o));
    o->c.kind = kind;
    for (i = 0; i < DMPY_FIXED; i++) dmpy_buf_init(&o->b[i]);
}
static void dmpy_op_release(dmpy_op* o) {
    Py_ssize_t i;
    for (i = 0; i < DMPY_FIXED; i++) dmpy_buf_release(&o->b[i]);
    for (i = 0; i < o->nmany; i++) dmpy_buf_release(&o->many[i]);
    PyMem_Free(o->many);
    PyMem_Free(o->ptrs);
    PyMem_Free(o->arrays);
    o->many = NULL;
    o->ptrs = NULL;
    o->arrays = NULL;
    o->nmany = 0;
    if (o->state) {
        o->state->inuse = false;
        Py_CLEAR(o->state);
    }
}


/* ============================================================================================ */
/* >>request  An async call: the buffers stay acquired (and their objects alive) until it is
   complete. wait() raises the call's failure; is_completed() never blocks. A request dropped
   unwaited is waited for by its destructor (the buffers may not go before the call is done),
   and close() waits for every request of its collective. */
typedef struct dmpy_request {
    PyObject_HEAD
    dmpy_comm* comm;
    dm_request* req;            /* NULL once finished */
    dmpy_op op;
    unsigned long thread;       /* the issuing thread */
    bool finished, waiting;
    dm_status status;
    char msg[DM_LAST_ERROR_SIZE];
    struct dmpy_request *prev, *next;   /* comm->pending */
} dmpy_request;
static PyTypeObject dmpy_RequestType;

static void dmpy_pending_unlink(dmpy_request* r) {
    if (r->prev) r->prev->next = r->next;
    else if (r->comm && r->comm->pending == r) r->comm->pending = r->next;
    if (r->next) r->next->prev = r->prev;
    r->prev = r->next = NULL;
}
/* The request is done with st (GIL held): its status and message, then its buffers released.
   A failure is raised before the buffers go, as dmpy_run does, so that a Ctrl-C's
   KeyboardInterrupt does not meet an exporter's capsule destructor written in Python (which
   would swallow it): with `raise`, the failure itself (dmpy_raise: the KeyboardInterrupt with
   the failure as its context); without, only a pending Ctrl-C, the failure kept for wait().
   0, or -1 with an exception set. */
static int dmpy_request_done(dmpy_request* r, dm_status st, bool raise) {
    int rc = 0;
    r->req = NULL;
    r->finished = true;
    r->status = st;
    r->msg[0] = 0;
    if (st != DM_OK) {
        dm_collective* c = (dm_collective*)r->comm->h.handle;
        if (c && PyThread_get_thread_ident() == r->thread) snprintf(r->msg, sizeof(r->msg), "%s", dm_last_error(c));
        if (!r->msg[0]) dmpy_log_last(r->comm->log, st, r->msg, sizeof(r->msg));
        if (raise) { dmpy_raise(st, r->msg); rc = -1; }
        else if (PyErr_CheckSignals() < 0) rc = -1;
    }
    {
        PyObject* keep = r->op.result;
        r->op.result = NULL;
        dmpy_op_release(&r->op);
        r->op.result = keep;
    }
    dmpy_pending_unlink(r);
    return rc;
}
/* Waits (GIL released; Ctrl-C armed on the main thread); 0, or -1 with an exception set: a
   concurrent wait, or what dmpy_request_done raised (`raise`: the call's own failure; else it
   is kept in r, see dmpy_request_result). */
static int dmpy_request_block(dmpy_request* r, bool raise) {
    dmpy_sig sg;
    dm_request* q = r->req;
    dm_status st;
    if (r->finished) return 0;
    if (r->waiting) {
        dmpy_raise(DM_ERR_BUSY, "wait(): another thread is waiting for this request");
        return -1;
    }
    r->waiting = true;
    r->comm->h.busy++;
    dmpy_sig_begin((dm_collective*)r->comm->h.handle, &sg);
    Py_BEGIN_ALLOW_THREADS
    st = dm_wait(q);
    Py_END_ALLOW_THREADS
    dmpy_sig_end(&sg);
    r->comm->h.busy--;
    r->waiting = false;
    return dmpy_request_done(r, st, raise);
}
static PyObject* dmpy_request_result(dmpy_request* r) {
    if (r->status != DM_OK) return dmpy_raise(r->status, r->msg);
    if (r->op.result) return Py_NewRef(r->op.result);
    Py_RETURN_NONE;
}
static int dmpy_request_finish_all(dmpy_comm* c) {
    while (c->pending) {
        dmpy_request* r = c->pending;
        Py_INCREF(r);
        if (dmpy_request_block(r, false) < 0) { Py_DECREF(r); return -1; }
        Py_DECREF(r);
    }
    return 0;
}
static PyObject* dmpy_request_wait(dmpy_request* r, PyObject* noargs) {
    (void)noargs;
    if (dmpy_request_block(r, true) < 0) return NULL;
    return dmpy_request_result(r);
}
static PyObject* dmpy_request_is_completed(dmpy_request* r, PyObject* noargs) {
    bool done = false;
    dm_status st;
    (void)noargs;
    if (r->finished) Py_RETURN_TRUE;
    if (r->waiting) Py_RETURN_FALSE;
    st = dm_test(r->req, &done);
    if (!done) Py_RETURN_FALSE;
    if (dmpy_request_done(r, st, false) < 0) return NULL;
    Py_RETURN_TRUE;
}
static PyObject* dmpy_request_get_status(dmpy_request* r, void* closure) {
    (void)closure;
    if (!r->finished) Py_RETURN_NONE;
    return PyLong_FromLong((long)r->status);
}
static void dmpy_request_dealloc(dmpy_request* r) {
    PyObject_GC_UnTrack(r);
    if (!r->finished && r->req) {
        PyObject *t, *v, *tb;
        PyErr_Fetch(&t, &v, &tb);
        if (DMPY_FINALIZING()) { dmpy_pending_unlink(r); }      /* the process ends: leave it */
        else if (dmpy_request_block(r, false) < 0) PyErr_WriteUnraisable((PyObject*)r);
        PyErr_Restore(t, v, tb);
    }
    dmpy_pending_unlink(r);
    dmpy_op_release(&r->op);
    Py_CLEAR(r->op.result);
    Py_CLEAR(r->comm);
    Py_TYPE(r)->tp_free((PyObject*)r);
}
static int dmpy_request_traverse(dmpy_request* r, visitproc visit, void* arg) {
    Py_VISIT(r->op.result);
    Py_VISIT(r->comm);
    return 0;
}
static PyMethodDef dmpy_request_methods[] = {
    { "wait", (PyCFunction)dmpy_request_wait, METH_NOARGS,
      "Blocks until the call is complete; returns its result (the output where it has one, else None) "
      "or raises its failure." },
    { "is_completed", (PyCFunction)dmpy_request_is_completed, METH_NOARGS,
      "Whether the call is complete (never blocks). wait() then returns at once." },
    { NULL, NULL, 0, NULL }
};
static PyGetSetDef dmpy_request_getset[] = {
    { "status", (getter)dmpy_request_get_status, NULL, "The C status once complete (0 = success), else None.", NULL },
    { NULL, NULL, NULL, NULL, NULL }
};
static PyTypeObject dmpy_RequestType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "distmesh.Request",
    .tp_basicsize = sizeof(dmpy_request),
    .tp_dealloc = (destructor)dmpy_request_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "An async distmesh call: wait(), is_completed().",
    .tp_traverse = (traverseproc)dmpy_request_traverse,
    .tp_methods = dmpy_request_methods,
    .tp_getset = dmpy_request_getset,
};

/* Runs o on self: blocking (returns the result) or queued (returns a Request). Releases o's
   buffers or hands them to the request. */
static PyObject* dmpy_run(dmpy_comm* self, dmpy_op* o, int async_op) {
    dm_collective* c = (dm_collective*)self->h.handle;
    dm_request* q = NULL;
    dm_status st;
    if (!async_op) {
        dmpy_sig sg;
        PyObject* res;
        dmpy_sig_begin(c, &sg);
        self->h.busy++;
        Py_BEGIN_ALLOW_THREADS
        st = dm_submit(c, &o->c, NULL);
#if defined(DISTMESH_NCCL)
        if (st == DM_OK && self->dev.kind == DMPY_DEV_STREAM) st = dm_synchronize(c);   /* >>device */
#endif
        Py_END_ALLOW_THREADS
        self->h.busy--;
        dmpy_sig_end(&sg);
        if (st != DM_OK) {
            /* raised before the buffers go: a Ctrl-C's KeyboardInterrupt (dmpy_raise) must not
               meet an exporter's capsule destructor written in Python, where it would be lost */
            dmpy_raise(st, dm_last_error(c));
            dmpy_op_release(o);
            Py_CLEAR(o->result);
            return NULL;
        }
        res = o->result ? o->result : Py_NewRef(Py_None);
        o->result = NULL;
        dmpy_op_release(o);
        return res;
    }
    {
        dmpy_request* r = PyObject_GC_New(dmpy_request, &dmpy_RequestType);
        if (!r) { dmpy_op_release(o); Py_CLEAR(o->result); return NULL; }
        r->comm = (dmpy_comm*)Py_NewRef((PyObject*)self);
        r->req = NULL;
        r->op = *o;             /* the buffers move into the request */
        r->thread = PyThread_get_thread_ident();
        r->finished = r->waiting = false;
        r->status = DM_OK;
        r->msg[0] = 0;
        r->prev = r->next = NULL;
        self->h.busy++;
        Py_BEGIN_ALLOW_THREADS
        st = dm_submit(c, &r->op.c, &q);
        Py_END_ALLOW_THREADS
        self->h.busy--;
        if (st != DM_OK) {
            r->finished = true;
            r->status = st;
            snprintf(r->msg, sizeof(r->msg), "%s", dm_last_error(c));
            dmpy_raise(st, r->msg);
            Py_DECREF(r);       /* releases the buffers (after the raise, as above) */
            return NULL;
        }
        r->req = q;
        r->next = self->pending;
        if (self->pending) self->pending->prev = r;
        self->pending = r;
        PyObject_GC_Track(r);
        return (PyObject*)r;
    }
}

/* ============================================================================================ */
/* >>comm */
static PyTypeObject dmpy_CommType;
static PyTypeObject* g_comm_cls;       /* the Python class C-made collectives get (distmesh.Collective) */
static PyObject* g_op_converter;       /* op -> int for anything that is not an int (torch's ReduceOp, str) */

static dm_collective* dmpy_comm_handle(PyObject* self) { return (dm_collective*)dmpy_handle(self); }

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
static PyObject* dmpy_comm_wrap(PyTypeObject* cls, dm_collective* c, dmpy_holder* owner, bool owns, dmpy_log* lg,
                                PyObject* keep) {
    dmpy_comm* o;
    if (!cls) cls = g_comm_cls ? g_comm_cls : &dmpy_CommType;
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
static int dmpy_holder_traverse(PyObject* self, visitproc visit, void* arg) {
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
        if (!g_op_converter) {
            PyErr_Format(PyExc_TypeError, "op must be a distmesh.ReduceOp, not %.100s", Py_TYPE(o)->tp_name);
            return -1;
        }
        conv = PyObject_CallOneArg(g_op_converter, o);
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

/* Runs a blocking call that is not an op (objects, groups) with the GIL released and Ctrl-C armed. */
#define DMPY_BLOCKING(self, c, stmt)                                                         \
    do {                                                                                     \
        dmpy_sig sg_;                                                                        \
        dmpy_sig_begin((c), &sg_);                                                           \
        ((dmpy_holder*)(self))->busy++;                                                      \
        Py_BEGIN_ALLOW_THREADS                                                               \
        stmt;                                                                                \
        Py_END_ALLOW_THREADS                                                                 \
        ((dmpy_holder*)(self))->busy--;                                                      \
        dmpy_sig_end(&sg_);                                                                  \
    } while (0)

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
static PyTypeObject dmpy_CommType = {
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

/* ============================================================================================ */
/* >>store  A rendezvous store (dm_store): tcp:// (c10d TCPStore, torch 1.13 and 2.x servers) or
   file://. The torch backend meets through one; a collective made on a Store keeps it alive. */
typedef struct dmpy_store {
    PyObject_HEAD
    dm_store* s;
    dmpy_log* log;              /* the server thread logs into it: freed after the store */
} dmpy_store;
static PyTypeObject dmpy_StoreType;
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
static PyTypeObject dmpy_StoreType = {
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

/* ============================================================================================ */
/* >>mesh  Mesh (dm_mesh) and Strategy (dm_strategy): holders owned by their world collective;
   their groups are Comm objects owned by them. */
typedef struct dmpy_mesh { dmpy_holder h; dmpy_log* log; } dmpy_mesh;
static PyTypeObject dmpy_MeshType, dmpy_StrategyType;

static PyObject* dmpy_mesh_wrap(PyTypeObject* type, void* handle, int kind, dmpy_holder* owner, bool owns,
                                dmpy_log* lg) {
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

static PyObject* dmpy_mesh_rank(PyObject* self, PyObject* args) {
    PyObject* a = Py_None;
    const char* name;
    dm_mesh* m = dmpy_mesh_handle(self);
    int v;
    if (!m || !PyArg_ParseTuple(args, "|O", &a) || dmpy_dim_arg(a, &name) < 0) return NULL;
    v = dm_mesh_rank(m, name);
    if (v < 0) return dmpy_raise(DM_ERR_INVALID_ARG, dm_mesh_last_error(m));
    return PyLong_FromLong(v);
}
static PyObject* dmpy_mesh_size(PyObject* self, PyObject* args) {
    PyObject* a = Py_None;
    const char* name;
    dm_mesh* m = dmpy_mesh_handle(self);
    int v;
    if (!m || !PyArg_ParseTuple(args, "|O", &a) || dmpy_dim_arg(a, &name) < 0) return NULL;
    v = dm_mesh_size(m, name);
    if (v < 0) return dmpy_raise(DM_ERR_INVALID_ARG, dm_mesh_last_error(m));
    return PyLong_FromLong(v);
}
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
static PyTypeObject dmpy_MeshType = {
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
static PyObject* dmpy_strategy_size(PyObject* self, PyObject* arg) {
    dm_strategy* s = dmpy_strategy_handle(self);
    dm_dim d;
    int v;
    if (!s || dmpy_dim_enum(arg, &d) < 0) return NULL;
    v = dm_strategy_size(s, d);
    if (v < 0) return dmpy_raise(DM_ERR_INVALID_ARG, dm_strategy_last_error(s));
    return PyLong_FromLong(v);
}
static PyObject* dmpy_strategy_rank(PyObject* self, PyObject* arg) {
    dm_strategy* s = dmpy_strategy_handle(self);
    dm_dim d;
    int v;
    if (!s || dmpy_dim_enum(arg, &d) < 0) return NULL;
    v = dm_strategy_rank(s, d);
    if (v < 0) return dmpy_raise(DM_ERR_INVALID_ARG, dm_strategy_last_error(s));
    return PyLong_FromLong(v);
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
static PyTypeObject dmpy_StrategyType = {
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
    Py_XSETREF(g_comm_cls, t);
    Py_RETURN_NONE;
}
static PyObject* dmpy_m_set_op_converter(PyObject* mod, PyObject* fn) {
    (void)mod;
    Py_XINCREF(fn);
    Py_XSETREF(g_op_converter, fn);
    Py_RETURN_NONE;
}
static PyObject* dmpy_m_open_handles(PyObject* mod, PyObject* noargs) {
    dmpy_holder* h;
    long n = 0;
    (void)mod; (void)noargs;
    for (h = g_holders; h; h = h->next) n++;
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
    PyObject *m, *threading, *mt, *ident;
    if (PyType_Ready(&dmpy_CommType) < 0 || PyType_Ready(&dmpy_RequestType) < 0 || PyType_Ready(&dmpy_StoreType) < 0 ||
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
#if defined(DISTMESH_NCCL)
        PyModule_AddObjectRef(m, "NCCL_BUILT", Py_True) < 0) {
#else
        PyModule_AddObjectRef(m, "NCCL_BUILT", Py_False) < 0) {
#endif
        Py_DECREF(m);
        return NULL;
    }
    /* Ctrl-C is armed only on the main thread (the only one Python raises KeyboardInterrupt in) */
    threading = PyImport_ImportModule("threading");
    mt = threading ? PyObject_CallMethod(threading, "main_thread", NULL) : NULL;
    ident = mt ? PyObject_GetAttrString(mt, "ident") : NULL;
    g_sig.main_ident = ident ? PyLong_AsUnsignedLong(ident) : 0;
    Py_XDECREF(ident);
    Py_XDECREF(mt);
    Py_XDECREF(threading);
    if (PyErr_Occurred()) { Py_DECREF(m); return NULL; }
    pthread_atfork(NULL, NULL, dmpy_sig_atfork_child);
    return m;
}
