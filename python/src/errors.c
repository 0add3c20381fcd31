/* distmesh._C: exceptions and the log (dmpy.h says what the other files hold).

   SECTIONS
     >>errors  distmesh.Error and one subclass per status
     >>log     the logger of every collective made here: the last failure, for requests waited
               on another thread than the one that issued them
*/
#include "dmpy.h"

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
PyObject* dmpy_raise(dm_status st, const char* msg) {
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
int dmpy_errors_init(PyObject* m) {
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
PyObject* dmpy_m_error(PyObject* mod, PyObject* args) {
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
struct dmpy_log {
    pthread_mutex_t mu;
    int refs;                   /* under the GIL */
    dm_status status;
    char msg[DM_LAST_ERROR_SIZE];
};
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
dmpy_log* dmpy_log_new(void) {
    dmpy_log* lg = (dmpy_log*)calloc(1, sizeof(dmpy_log));
    if (!lg) { PyErr_NoMemory(); return NULL; }
    pthread_mutex_init(&lg->mu, NULL);
    lg->refs = 1;
    return lg;
}
dmpy_log* dmpy_log_ref(dmpy_log* lg) { if (lg) lg->refs++; return lg; }
void dmpy_log_unref(dmpy_log* lg) {
    if (!lg || --lg->refs > 0) return;
    pthread_mutex_destroy(&lg->mu);
    free(lg);
}
/* The last failure logged with status st, or "" (copied into out). */
void dmpy_log_last(dmpy_log* lg, dm_status st, char* out, size_t cap) {
    out[0] = 0;
    if (!lg) return;
    pthread_mutex_lock(&lg->mu);
    if (lg->status == st) snprintf(out, cap, "%s", lg->msg);
    pthread_mutex_unlock(&lg->mu);
}
dm_logger dmpy_logger(dmpy_log* lg) {
    dm_logger l;
    l.func = dmpy_log_fn;
    l.user_data = lg;
    return l;
}

