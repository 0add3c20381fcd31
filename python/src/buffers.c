/* distmesh._C: an object's memory for a call (dmpy.h says what the other files hold).

   SECTIONS
     >>buffers  buffer protocol and DLPack -> pointer, count, dtype; the checks
     >>device   what a collective does with CUDA memory (an NCCL build), DLPack's stream
     >>acquire  dmpy_buf_get: an object's memory for a call, checked
*/
#include "dmpy.h"

/* ============================================================================================ */
/* >>buffers  What a call reads or writes: an object's memory, without a copy.
   - The buffer protocol (numpy arrays, bytearray, memoryview, array.array, bytes): contiguous
     (C or Fortran order), its format naming the dtype.
   - torch tensors (torch._C._to_dlpack, which also exports tensors that require grad) and any
     other __dlpack__ exporter: CPU memory, compact strides; bfloat16 and float16 included.
     CUDA memory (DLPack kDLCUDA, kDLCUDAManaged) only in an NCCL build and on a collective
     that takes it (>>device); elsewhere a TypeError saying why.
   Formats distmesh cannot reduce (bool, int16, complex, records) still move as raw bytes
   (all_gather, broadcast, send, ...): dtype DMPY_RAW / DMPY_BOOL, counted in bytes.
   dmpy_buf, the DMPY_READ / WRITE / REDUCE flags and dmpy_dev are in dmpy.h. */
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

void dmpy_buf_init(dmpy_buf* b) { memset(b, 0, sizeof(*b)); b->dtype = DMPY_RAW; }
void dmpy_buf_release(dmpy_buf* b) {
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

const char* dmpy_dtype_name(int dtype) {
    if (dtype == DMPY_BOOL) return "bool";
    if (dtype < 0) return "raw bytes";
    return dm_dtype_name((dm_dtype)dtype);
}
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
int dmpy_buf_get(const dmpy_dev* dev, PyObject* obj, const char* what, int flags, dmpy_buf* b) {
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
int dmpy_same_dtype(const dmpy_buf* a, const char* an, const dmpy_buf* b, const char* bn) {
    if (a->dtype == b->dtype && (a->dtype >= 0 || a->itemsize == b->itemsize)) return 0;
    PyErr_Format(PyExc_TypeError, "%s holds %s (%zu-byte elements) but %s holds %s (%zu-byte elements)", an,
                 dmpy_dtype_name(a->dtype), a->itemsize, bn, dmpy_dtype_name(b->dtype), b->itemsize);
    return -1;
}
int dmpy_size_is(const dmpy_buf* b, const char* what, size_t want, const char* why) {
    if (b->nbytes == want) return 0;
    PyErr_Format(PyExc_ValueError, "%s holds %zu bytes; %s needs %zu", what, b->nbytes, why, want);
    return -1;
}

