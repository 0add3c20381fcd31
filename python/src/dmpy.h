/* distmesh._C -- the CPython extension over distmesh's public C API (docs/python.md): the
   private header of its files (not installed). It holds the types more than one file uses and
   the functions they call in each other (dmpy_ prefix; the extension is built with
   -fvisibility=hidden, so none is exported).

   Nothing in the extension is a second implementation: every collective is a dm_* call on the
   caller's buffers. Its files turn Python objects into pointers, counts and dtypes (checked
   before anything is sent), statuses into exceptions, and keep the objects a call borrows
   alive. One file per thing it holds (search for the tag):
     module.c      >>args (positional-or-keyword arguments of the fast-call methods),
                   >>module (factories, module init)
     errors.c      >>errors (distmesh.Error and one subclass per status), >>log (the logger of
                   every collective made here: the last failure, for requests waited on another
                   thread than the one that issued them)
     buffers.c     >>buffers (buffer protocol and DLPack -> pointer, count, dtype; the checks),
                   >>device (what a collective does with CUDA memory, DLPack's stream),
                   >>acquire (dmpy_buf_get: an object's memory for a call, checked)
     request.c     >>sigint (Ctrl-C during a blocking call on the main thread), >>ops (one call:
                   a dm_op and its buffers, run blocking or queued), >>request (Request: an
                   async call's buffers until it completes)
     compress.c    >>compress (CompressState: a compressed all-reduce's error-feedback state)
     collective.c  >>holders (Comm, Mesh, Strategy: who owns which handle; closing a holder
                   closes its dependents first), >>specs (the collectives: one table of
                   per-operation specs, one function that runs any of them), >>comm (Comm:
                   accessors, groups, the type)
     store.c       >>store (Store: a rendezvous store, the torch backend's)
     mesh.c        >>mesh (Mesh and Strategy)
     impl.c        distmesh's implementation (the one file without Python.h)

   Threads: every blocking call releases the GIL. A Comm counts the calls running on it with
   the GIL released (busy); close() refuses while any runs.

   Builds: by default (setup.py) the host backends only (DISTMESH_TCP). With DISTMESH_NCCL
   (DISTMESH_NCCL=1 pip install ..., make install PY_NCCL=1) the NCCL backend too, and CUDA
   memory from DLPack exporters (>>buffers, >>device); NCCL_BUILT says which. setup.py,
   tests/python.mk and tests/python_nccl_standin.mk compile every .c file of python/src.

   SECTIONS: none here; the types and prototypes below go file by file, each type before its users.
*/
#ifndef DMPY_H
#define DMPY_H
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

/* module.c: arguments, module init */
int dmpy_args(const char* fn, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, const char* const* names,
              int nnames, int nreq, PyObject** out);
int dmpy_int(PyObject* o, const char* what, long dflt, long lo, long hi, long* out);
int dmpy_bool(PyObject* o, int* out);
int dmpy_str(PyObject* o, const char* what, const char** out);

/* errors.c: exceptions, the log */
typedef struct dmpy_log dmpy_log;
PyObject* dmpy_raise(dm_status st, const char* msg);
int dmpy_errors_init(PyObject* m);
PyObject* dmpy_m_error(PyObject* mod, PyObject* args);
dmpy_log* dmpy_log_new(void);
dmpy_log* dmpy_log_ref(dmpy_log* lg);
void dmpy_log_unref(dmpy_log* lg);
void dmpy_log_last(dmpy_log* lg, dm_status st, char* out, size_t cap);
dm_logger dmpy_logger(dmpy_log* lg);

/* buffers.c: what a call reads or writes (>>buffers) */
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
/* what a collective does with CUDA memory (>>device) */
enum { DMPY_DEV_NONE = 0, DMPY_DEV_STAGED = 1, DMPY_DEV_STREAM = 2 };
typedef struct dmpy_dev {
    int kind;
    Py_ssize_t stream;
    const char* backend;        /* dm_backend_name: static text */
} dmpy_dev;

void dmpy_buf_init(dmpy_buf* b);
void dmpy_buf_release(dmpy_buf* b);
const char* dmpy_dtype_name(int dtype);
/* The dtype that moves b (raw bytes go as uint8) and the count in that dtype. */
static inline dm_dtype dmpy_move_dtype(const dmpy_buf* b) { return b->dtype >= 0 ? (dm_dtype)b->dtype : DM_UINT8; }
static inline size_t dmpy_move_count(const dmpy_buf* b) { return b->dtype >= 0 ? b->count : b->nbytes; }
int dmpy_buf_get(const dmpy_dev* dev, PyObject* obj, const char* what, int flags, dmpy_buf* b);
int dmpy_same_dtype(const dmpy_buf* a, const char* an, const dmpy_buf* b, const char* bn);
int dmpy_size_is(const dmpy_buf* b, const char* what, size_t want, const char* why);

/* collective.c: holders (>>holders) and Comm */
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
struct dmpy_request;
typedef struct dmpy_comm {
    dmpy_holder h;
    struct dmpy_request* pending;   /* requests not finished yet */
    dmpy_log* log;
    dmpy_dev dev;                   /* what it does with CUDA memory (>>device) */
} dmpy_comm;

extern dmpy_holder* dmpy_holders;       /* the open holders */
extern PyTypeObject dmpy_CommType;
extern PyTypeObject* dmpy_comm_cls;     /* the Python class C-made collectives get (distmesh.Collective) */
extern PyObject* dmpy_op_converter;     /* op -> int for anything that is not an int (torch's ReduceOp, str) */
void dmpy_holder_link(dmpy_holder* h);
void* dmpy_handle(void* self);
int dmpy_close(dmpy_holder* h);
void dmpy_holder_dealloc_common(dmpy_holder* h);
int dmpy_holder_traverse(PyObject* self, visitproc visit, void* arg);
dm_collective* dmpy_comm_handle(PyObject* self);
PyObject* dmpy_comm_wrap(PyTypeObject* cls, dm_collective* c, dmpy_holder* owner, bool owns, dmpy_log* lg,
                         PyObject* keep);
int dmpy_comm_ready(void);

/* compress.c: CompressState */
typedef struct dmpy_cstate {
    PyObject_HEAD
    dm_compress_state* s;
    Py_ssize_t count;           /* the buffer's shape */
    bool inuse;                 /* a call holds it */
} dmpy_cstate;
extern PyTypeObject dmpy_CompressStateType;

/* request.c: Ctrl-C (>>sigint), one call (>>ops), Request */
typedef struct dmpy_sig { bool armed, registered; } dmpy_sig;
void dmpy_sig_begin(dm_collective* c, dmpy_sig* s);
void dmpy_sig_end(dmpy_sig* s);
int dmpy_sig_init(void);
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

#define DMPY_FIXED 3
typedef struct dmpy_op {
    dm_op c;                    /* the call itself, as dm_submit takes it */
    dmpy_buf b[DMPY_FIXED];     /* the buffers of the call */
    dmpy_buf* many;             /* all_gather_to_list's outputs */
    Py_ssize_t nmany;
    void** ptrs;                /* their pointers (c.recvs) */
    size_t* arrays;             /* all_to_all_v: counts and offsets, 4 x world (c.send_counts ...) */
    PyObject* result;           /* what the call returns (None when NULL; recv: the sender's rank) */
    int source;                 /* recv from any source: the sender (c.source points here) */
    dmpy_cstate* state;         /* all_reduce's CompressState (c.compress_state), held and in use */
} dmpy_op;
extern PyTypeObject dmpy_RequestType;
void dmpy_op_init(dmpy_op* o, dm_op_kind kind);
void dmpy_op_release(dmpy_op* o);
int dmpy_request_finish_all(dmpy_comm* c);
int dmpy_request_idle(dmpy_comm* c);
PyObject* dmpy_run(dmpy_comm* self, dmpy_op* o, int async_op);

/* store.c: Store */
typedef struct dmpy_store {
    PyObject_HEAD
    dm_store* s;
    dmpy_log* log;              /* the server thread logs into it: freed after the store */
} dmpy_store;
extern PyTypeObject dmpy_StoreType;

/* mesh.c: Mesh and Strategy */
extern PyTypeObject dmpy_MeshType, dmpy_StrategyType;
PyObject* dmpy_mesh_wrap(PyTypeObject* type, void* handle, int kind, dmpy_holder* owner, bool owns, dmpy_log* lg);

#endif /* DMPY_H */
