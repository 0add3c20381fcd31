/* distmesh._C: running one call, blocking or as a Request (dmpy.h says what the other files
   hold).

   SECTIONS
     >>sigint   Ctrl-C during a blocking call on the main thread: dm_abort from a watcher thread
     >>ops      one call: a dm_op and its buffers, run blocking or queued
     >>request  Request: an async call's buffers until it completes
*/
#include "dmpy.h"

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
void dmpy_sig_begin(dm_collective* c, dmpy_sig* s) {
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
void dmpy_sig_end(dmpy_sig* s) {
    if (s->registered) {
        pthread_mutex_lock(&g_sig.mu);
        g_sig.running = NULL;
        pthread_mutex_unlock(&g_sig.mu);
    }
}
/* At module init: Ctrl-C is armed only on the main thread (the only one Python raises
   KeyboardInterrupt in); a forked child starts its own watcher. 0, or -1 with an exception set. */
int dmpy_sig_init(void) {
    PyObject *threading, *mt, *ident;
    threading = PyImport_ImportModule("threading");
    mt = threading ? PyObject_CallMethod(threading, "main_thread", NULL) : NULL;
    ident = mt ? PyObject_GetAttrString(mt, "ident") : NULL;
    g_sig.main_ident = ident ? PyLong_AsUnsignedLong(ident) : 0;
    Py_XDECREF(ident);
    Py_XDECREF(mt);
    Py_XDECREF(threading);
    if (PyErr_Occurred()) return -1;
    pthread_atfork(NULL, NULL, dmpy_sig_atfork_child);
    return 0;
}

/* ============================================================================================ */
/* >>ops  One call: the dm_op distmesh.h's dm_submit takes, and the buffers it holds until it is
   done, checked (dmpy_op: dmpy.h); run blocking (GIL released, Ctrl-C armed) or queued as a
   request. */
void dmpy_op_init(dmpy_op* o, dm_op_kind kind) {
    int i;
    memset(o, 0, sizeof(*o));
    o->c.kind = kind;
    for (i = 0; i < DMPY_FIXED; i++) dmpy_buf_init(&o->b[i]);
}
void dmpy_op_release(dmpy_op* o) {
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
/* What a call that succeeded returns: its result, or None; a recv returns its sender's rank
   (the peer it named, or the one it took a message from: peer None, any source). */
static PyObject* dmpy_op_result(dmpy_op* o) {
    PyObject* res = o->result;
    o->result = NULL;
    if (o->c.kind == DM_OP_RECV) {
        Py_XDECREF(res);
        return PyLong_FromLong(o->c.root == DM_ANY_SOURCE ? o->source : o->c.root);
    }
    return res ? res : Py_NewRef(Py_None);
}
static PyObject* dmpy_request_result(dmpy_request* r) {
    PyObject* keep;
    if (r->status != DM_OK) return dmpy_raise(r->status, r->msg);
    keep = r->op.result ? Py_NewRef(r->op.result) : NULL;   /* wait() may be called again */
    {
        PyObject* res = dmpy_op_result(&r->op);
        r->op.result = keep;
        return res;
    }
}
int dmpy_request_finish_all(dmpy_comm* c) {
    while (c->pending) {
        dmpy_request* r = c->pending;
        Py_INCREF(r);
        if (dmpy_request_block(r, false) < 0) { Py_DECREF(r); return -1; }
        Py_DECREF(r);
    }
    return 0;
}
/* Whether nothing of c is in flight (distmesh.torch's inline path, docs/python.md "Async"): no
   call running on it with the GIL released, and every request issued on it finished. Requests
   that have completed but were not waited for yet are finished here (as is_completed() does:
   their failure kept for wait()); one another thread is waiting for counts as in flight. 1, 0,
   or -1 with an exception set (a Ctrl-C met while finishing one). */
int dmpy_request_idle(dmpy_comm* c) {
    dmpy_request *r, *next;
    if (c->h.busy > 0) return 0;
    for (r = c->pending; r; r = next) {
        bool done = false;
        dm_status st;
        next = r->next;
        if (r->finished || r->waiting || !r->req) return 0;
        st = dm_test(r->req, &done);
        if (!done) return 0;
        Py_INCREF(r);
        if (dmpy_request_done(r, st, false) < 0) { Py_DECREF(r); return -1; }
        next = c->pending;      /* done unlinked r: start again from the head */
        Py_DECREF(r);
    }
    return 1;
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
PyTypeObject dmpy_RequestType = {
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
PyObject* dmpy_run(dmpy_comm* self, dmpy_op* o, int async_op) {
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
        res = dmpy_op_result(o);
        dmpy_op_release(o);
        return res;
    }
    {
        dmpy_request* r = PyObject_GC_New(dmpy_request, &dmpy_RequestType);
        if (!r) { dmpy_op_release(o); Py_CLEAR(o->result); return NULL; }
        r->comm = (dmpy_comm*)Py_NewRef((PyObject*)self);
        r->req = NULL;
        r->op = *o;             /* the buffers move into the request */
        if (r->op.c.source) r->op.c.source = &r->op.source;    /* recv from any source: the sender lands here */
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

