/* The process-world harness of the tests and the forking benchmarks: fork N processes (ranks)
   that each run a function with their index and a shared context, give them a report pipe,
   stop or kill one, reap them all by a deadline (what is left is killed, never waited for), read
   their reports (lines, ready marks, or fixed-size structs), plus the clocks, free loopback
   ports and fd counts every such program needs. With DISTMESH_TCP it also hands the ranks a
   store (a file store in a temporary directory, a server in this process or in a forked agent,
   or a free port for rank 0 to serve) and forks distmesh worlds on it.

   Stands beside test_util.h, not inside it: test_util.h is the core tests' reference arithmetic
   (it needs distmesh.h and cmocka's habits), while this header is plain POSIX up to its last
   two sections, so the benchmarks (no cmocka) and the programs built without the TCP backend
   include it too. Nothing here asserts: functions return counts and statuses, the caller
   checks them (cmocka's asserts in a test, an exit status in a benchmark). Every wait in it
   has a deadline. Include it once per program, after distmesh.h where that is included; the
   file needs POSIX 2008 (_GNU_SOURCE or _POSIX_C_SOURCE 200809L before its first header).

   Sections (search the tag):
     >>clock   tw_now_s / tw_now_ms / tw_now_ns (CLOCK_MONOTONIC), tw_sleep_ms / tw_sleep_us, tw_sort,
               tw_median
     >>host    tw_free_port, tw_listen_loopback, tw_count_entries, tw_count_fds, tw_connect_loopback,
               tw_recv_n, tw_send_all / tw_recv_all, tw_read_file, tw_run_cmd (a shell command under
               `timeout`, its output captured), TW_VFORMAT (a printf-style wrapper's arguments into a
               buffer);
               test_tmpdir.h's tmpdir_make / tmpdir_remove
     >>procs   tw_world: tw_world_init, tw_spawn, tw_fork, tw_signal, tw_kill, tw_reap,
               tw_reap_some, tw_kill_all, tw_exit_code; tw_me: who this process is
     >>report  in a child: tw_ready, tw_report, tw_report_bytes; in the parent: tw_reader
               (tw_reader_init, tw_reader_fault) and tw_read_reports (lines and "R" marks,
               optionally a fault once all are ready), tw_read_ready, tw_read_exact (structs)
     >>store   (DISTMESH_TCP) tw_store: tw_store_file, tw_store_dir, tw_store_serve,
               tw_store_agent, tw_store_rank0, tw_store_next, tw_store_close; tw_store_desc_loopback
     >>dm      (DISTMESH_TCP) tw_tcp_desc, tw_sim_host, tw_launcher_env, tw_dm_world:
               tw_dm_world_init, tw_dm_fork, tw_dm_run */
#ifndef DM_TEST_WORLD_H
#define DM_TEST_WORLD_H
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#if defined(DISTMESH_TCP)
#include "distmesh.h"
#endif

#if defined(__GLIBC__) && !defined(_GNU_SOURCE) && (!defined(_POSIX_C_SOURCE) || _POSIX_C_SOURCE < 200809L)
#error "test_world.h needs POSIX 2008: define _GNU_SOURCE (or _POSIX_C_SOURCE 200809L) before the first #include"
#endif

#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#define _TW_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define _TW_PRINTF(f, a)
#endif
#include "test_tmpdir.h"        /* tmpdir_make, tmpdir_remove (inside the pragma: a program may use neither) */

/* >>clock -------------------------------------------------------------------------------------- */
static double tw_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
static int64_t tw_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
static int64_t tw_now_ms(void) { return tw_now_ns() / 1000000; }
/* Sleeps us microseconds (ms milliseconds), signals or not. */
static void tw_sleep_us(long us) {
    struct timespec ts;
    ts.tv_sec = us / 1000000;
    ts.tv_nsec = (us % 1000000) * 1000L;
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}
static void tw_sleep_ms(int ms) { tw_sleep_us((long)ms * 1000); }
static int _tw_cmp_double(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return x < y ? -1 : x > y;
}
/* v[0..n) in ascending order. */
static void tw_sort(double* v, int n) { qsort(v, (size_t)n, sizeof(double), _tw_cmp_double); }
/* The median of v[0..n) (n >= 1); sorts v, so v[n - 1] is the largest afterwards. */
static double tw_median(double* v, int n) {
    tw_sort(v, n);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* >>host --------------------------------------------------------------------------------------- */
/* A loopback TCP port that is free right now (the kernel's choice for port 0), or 0. Someone
   may take it before the caller binds it: the tests use it at once, on a machine they own. */
static int tw_free_port(void) {
    struct sockaddr_in a;
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = 0;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && bind(fd, (struct sockaddr*)&a, sizeof(a)) == 0 && getsockname(fd, (struct sockaddr*)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}
/* A TCP socket listening on 127.0.0.1 at a port the kernel picks (into *port), made with the
   socket type flags given (SOCK_CLOEXEC, SOCK_NONBLOCK, or 0) and backlog; or -1. */
static int tw_listen_loopback(int flags, int backlog, int* port) {
    struct sockaddr_in a;
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM | flags, 0);
    if (fd < 0) return -1;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr*)&a, sizeof(a)) != 0 || listen(fd, backlog) != 0 ||
        getsockname(fd, (struct sockaddr*)&a, &len) != 0) {
        close(fd);
        return -1;
    }
    *port = ntohs(a.sin_port);
    return fd;
}
/* Entries of the directory at path but "." and "..", or -1. */
static int tw_count_entries(const char* path) {
    DIR* d = opendir(path);
    struct dirent* e;
    int n = 0;
    if (!d) return -1;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}
/* Descriptors open in this process (the directory's own not counted), or -1. */
static int tw_count_fds(void) {
    int n = tw_count_entries("/proc/self/fd");
    return n < 0 ? -1 : n - 1;
}
/* A client socket connected to 127.0.0.1 (family AF_INET) or ::1 (AF_INET6) at port, with
   TCP_NODELAY and send and receive timeouts of timeout_s (a blocking call cannot hang a test),
   or -1. */
static int tw_connect_loopback(int family, int port, int timeout_s) {
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1, rc;
    struct timeval tv;
    if (fd < 0) return -1;
    tv.tv_sec = timeout_s;
    tv.tv_usec = 0;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (family == AF_INET6) {
        struct sockaddr_in6 a;
        memset(&a, 0, sizeof(a));
        a.sin6_family = AF_INET6;
        a.sin6_port = htons((uint16_t)port);
        a.sin6_addr = in6addr_loopback;
        rc = connect(fd, (struct sockaddr*)&a, sizeof(a));
    } else {
        struct sockaddr_in a;
        memset(&a, 0, sizeof(a));
        a.sin_family = AF_INET;
        a.sin_port = htons((uint16_t)port);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        rc = connect(fd, (struct sockaddr*)&a, sizeof(a));
    }
    if (rc != 0) { close(fd); return -1; }
    return fd;
}
/* Reads n bytes from fd into p (EINTR retried), until EOF, an error or the socket's timeout. Returns
   the count read. */
static size_t tw_recv_n(int fd, unsigned char* p, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = recv(fd, p + got, n - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    return got;
}
/* All n bytes to or from a socket (EINTR retried; no SIGPIPE): true when they all went. */
static bool tw_send_all(int fd, const unsigned char* p, size_t n) {
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return false;
        p += k;
        n -= (size_t)k;
    }
    return true;
}
static bool tw_recv_all(int fd, unsigned char* p, size_t n) { return tw_recv_n(fd, p, n) == n; }

/* The file at path into buf (at most cap - 1 bytes, NUL-terminated; "" when unreadable).
   Returns the bytes read. */
static size_t tw_read_file(const char* path, char* buf, size_t cap) {
    FILE* f = fopen(path, "r");
    size_t n = 0;
    if (f) {
        n = fread(buf, 1, cap - 1, f);
        fclose(f);
    }
    buf[n] = 0;
    return n;
}
/* In a function declared (..., const char* fmt, ...): its printf-style arguments formatted into
   the char array buf (truncated to fit). For a program's own wrappers of tw_run_cmd. */
#define TW_VFORMAT(buf, fmt)                                                                    \
    do {                                                                                        \
        va_list ap_;                                                                            \
        va_start(ap_, fmt);                                                                     \
        vsnprintf(buf, sizeof(buf), fmt, ap_);                                                  \
        va_end(ap_);                                                                            \
    } while (0)
/* Runs the shell command cmd under `timeout -k 5 limit_s` (its whole process group is killed at
   the limit), its stdout and stderr into out (at most cap - 1 bytes, NUL-terminated). The
   output goes through a temporary file, not a pipe, so a daemon the command leaves behind
   cannot hold the reading open. Returns its exit status (124: timed out), or -1. */
static int tw_run_cmd(int limit_s, char* out, size_t cap, const char* cmd) {
    char path[] = "/tmp/tw_out_XXXXXX";
    size_t len = strlen(cmd), i, k;
    char* line = (char*)malloc(4 * len + 128);
    int fd = mkstemp(path), rc = -1;
    out[0] = 0;
    if (fd >= 0) close(fd);
    if (line && fd >= 0) {
        k = (size_t)snprintf(line, 64, "timeout -k 5 %d sh -c '", limit_s);
        for (i = 0; i < len; i++) {         /* ' becomes '\'' inside the single quotes */
            if (cmd[i] == '\'') { memcpy(line + k, "'\\''", 4); k += 4; }
            else line[k++] = cmd[i];
        }
        snprintf(line + k, 64, "' > %s 2>&1", path);
        fflush(NULL);
        rc = system(line);
        rc = rc != -1 && WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
        tw_read_file(path, out, cap);
    }
    if (fd >= 0) unlink(path);
    free(line);
    return rc;
}

/* >>procs -------------------------------------------------------------------------------------- */
#define TW_MAX_PROCS 1024
/* What a forked process runs: its index and the context the parent passed (a copy, as fork
   made it). Returns its exit status: 0 is success; values outside 1..255 exit as 1. */
typedef int (*tw_fn)(int index, void* ctx);

/* Who this process is: "parent" in the program, "<who> <index>" in a child of tw_spawn. */
static struct { int index; char who[48]; int report_fd; } tw_me = { -1, "parent", -1 };

/* Forked processes. Zero it, set the options, then tw_spawn / tw_fork; tw_reap (or
   tw_kill_all) ends it. Once every child is reaped the report pipe is closed. */
typedef struct tw_world {
    int alarm_s;                 /* each child's own deadline (SIGALRM, from its fork): 0 -> 65 s; < 0: none */
    bool reports;                /* 0 -> no pipe; true: children report through tw_ready / tw_report */
    bool quick_exit;             /* 0 -> children end with exit() (atexit, LeakSanitizer); true: fflush + _exit */
    /* the rest is the harness's */
    int n;                       /* children forked */
    bool timed_out;              /* a reap's deadline passed and it killed what was left */
    bool rd_open, wr_open;
    int rd, wr;                  /* the report pipe's ends in the parent */
    pid_t pid[TW_MAX_PROCS];
    int status[TW_MAX_PROCS];    /* wait status once reaped */
    bool reaped[TW_MAX_PROCS];
} tw_world;

/* *w zeroed, then children with an alarm of alarm_s, a report pipe if reports, ending with
   _exit (quick_exit): how most programs fork. */
static void tw_world_init(tw_world* w, int alarm_s, bool reports) {
    memset(w, 0, sizeof(*w));
    w->alarm_s = alarm_s;
    w->reports = reports;
    w->quick_exit = true;
}
static void _tw_close_writer(tw_world* w) {
    if (w->wr_open) close(w->wr);
    w->wr_open = false;
}
static void _tw_close_pipe_if_done(tw_world* w) {
    int i;
    for (i = 0; i < w->n; i++)
        if (!w->reaped[i]) return;
    _tw_close_writer(w);
    if (w->rd_open) close(w->rd);
    w->rd_open = false;
}
/* Forks one child into slot w->n running fn(index, ctx), named "<who> <index>" (who NULL:
   "rank"). Returns the slot, or -1 (too many, no pipe, fork failed). */
static int tw_spawn(tw_world* w, const char* who, int index, tw_fn fn, void* ctx) {
    pid_t p;
    if (w->n >= TW_MAX_PROCS) return -1;
    if (w->reports && !w->rd_open) {
        int fds[2];
        if (pipe(fds) != 0) return -1;
        w->rd = fds[0];
        w->wr = fds[1];
        w->rd_open = w->wr_open = true;
    }
    fflush(NULL);                /* buffered output would be written twice */
    p = fork();
    if (p < 0) return -1;
    if (p == 0) {
        int rc, code;
        tw_me.index = index;
        snprintf(tw_me.who, sizeof(tw_me.who), "%s %d", who ? who : "rank", index);
        if (w->reports) {
            close(w->rd);
            tw_me.report_fd = w->wr;
        }
        if (w->alarm_s >= 0) alarm(w->alarm_s ? (unsigned)w->alarm_s : 65u);
        rc = fn(index, ctx);
        code = rc == 0 ? 0 : rc > 0 && rc < 256 ? rc : 1;
        if (w->quick_exit) {
            fflush(NULL);
            _exit(code);
        }
        exit(code);
    }
    w->pid[w->n] = p;
    w->reaped[w->n] = false;
    w->status[w->n] = 0;
    return w->n++;
}
/* n children, indices 0..n-1 (slot = index when w was empty): 0, or -1 when a fork failed
   (those forked run on; reap them). */
static int tw_fork(tw_world* w, int n, tw_fn fn, void* ctx) {
    int i;
    for (i = 0; i < n; i++)
        if (tw_spawn(w, NULL, i, fn, ctx) < 0) return -1;
    return 0;
}
/* Sends sig to the child in slot i if it is not reaped yet. */
static void tw_signal(tw_world* w, int i, int sig) {
    if (i >= 0 && i < w->n && !w->reaped[i]) kill(w->pid[i], sig);
}
/* kill -9 of slot i (continued first, should it be stopped); tw_reap collects it. */
static void tw_kill(tw_world* w, int i) {
    tw_signal(w, i, SIGCONT);
    tw_signal(w, i, SIGKILL);
}
/* Collects slot i if it has ended; true when it is (now) reaped. */
static bool _tw_try_reap(tw_world* w, int i) {
    int st = 0;
    pid_t r;
    if (w->reaped[i]) return true;
    r = waitpid(w->pid[i], &st, WNOHANG);
    if (r == 0 || (r < 0 && errno == EINTR)) return false;
    w->status[i] = r == w->pid[i] ? st : -1;   /* -1: not our child any more (reaped elsewhere) */
    w->reaped[i] = true;
    return true;
}
static bool _tw_failed(const tw_world* w, int i) {
    return w->status[i] == -1 || !WIFEXITED(w->status[i]) || WEXITSTATUS(w->status[i]) != 0;
}
/* kill -9 of every selected child still there, and collects them (10 s at most: a process
   stuck in the kernel is left behind rather than waited for). Returns how many were killed. */
static int _tw_kill_rest(tw_world* w, const bool* which) {
    double end;
    int i, killed = 0, left;
    for (i = 0; i < w->n; i++)
        if (!w->reaped[i] && (!which || which[i])) { tw_kill(w, i); killed++; }
    end = tw_now_s() + 10;
    do {
        for (i = 0, left = 0; i < w->n; i++)
            if ((!which || which[i]) && !_tw_try_reap(w, i)) left++;
        if (left) tw_sleep_ms(1);
    } while (left && tw_now_s() < end);
    if (left) fprintf(stderr, "%d process(es) did not end after kill -9\n", left);
    return killed;
}
/* Waits for the children in slots where which[i] (NULL: all) until limit_s seconds from now;
   then kills what is left (a message on stderr, w->timed_out). Returns how many failed: an
   exit status other than 0, a signal, or killed here. */
static int tw_reap_some(tw_world* w, const bool* which, double limit_s) {
    double end = tw_now_s() + limit_s;
    int failed = 0, i, left;
    for (;;) {
        left = 0;
        for (i = 0; i < w->n; i++) {
            if ((which && !which[i]) || w->reaped[i]) continue;
            if (_tw_try_reap(w, i)) failed += _tw_failed(w, i);
            else left++;
        }
        if (left == 0) break;
        if (tw_now_s() > end) {
            fprintf(stderr, "%s: time limit %.0f s reached, killing %d of %d process(es)\n", tw_me.who, limit_s, left,
                    w->n);
            w->timed_out = true;
            failed += _tw_kill_rest(w, which);
            break;
        }
        tw_sleep_ms(w->n > 256 ? 5 : 2);
    }
    _tw_close_pipe_if_done(w);
    return failed;
}
static int tw_reap(tw_world* w, double limit_s) { return tw_reap_some(w, NULL, limit_s); }
/* kill -9 of every child left, collected; the report pipe closed. */
static void tw_kill_all(tw_world* w) {
    _tw_kill_rest(w, NULL);
    _tw_close_pipe_if_done(w);
}
/* Slot i's exit code: its exit status, 128 + the signal that ended it, or -1 (not reaped). */
static int tw_exit_code(const tw_world* w, int i) {
    int st;
    if (i < 0 || i >= w->n || !w->reaped[i] || w->status[i] == -1) return -1;
    st = w->status[i];
    return WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : -1;
}

/* >>report ------------------------------------------------------------------------------------- */
/* In a child of a world with reports. Each call is one write: up to PIPE_BUF bytes never mix
   with another child's. 0, or -1 (no pipe, or the write failed). */
static int tw_report_bytes(const void* p, size_t n) {
    if (tw_me.report_fd < 0) return -1;
    return write(tw_me.report_fd, p, n) == (ssize_t)n ? 0 : -1;
}
/* "R": this child is ready (the parent counts them; see tw_reader). */
static int tw_ready(void) { return tw_report_bytes("R", 1); }
/* One report line (end it with '\n'; at most 511 bytes). Lines must not start with 'R'. */
static int tw_vreport(const char* fmt, va_list ap) {
    char line[512];
    int n = vsnprintf(line, sizeof(line), fmt, ap);
    if (n < 0 || n >= (int)sizeof(line)) return -1;
    return tw_report_bytes(line, (size_t)n);
}
static int tw_report(const char* fmt, ...) _TW_PRINTF(1, 2);
static int tw_report(const char* fmt, ...) {
    va_list ap;
    int rc;
    va_start(ap, fmt);
    rc = tw_vreport(fmt, ap);
    va_end(ap);
    return rc;
}

/* The parent's view of the report pipe. Zero it, set deadline and on_line (the rest is
   optional), call tw_read_reports. */
typedef struct tw_reader {
    double deadline;                         /* required: tw_now_s() at which reading stops */
    int want;                                /* 0 -> read until the deadline, the pipe's end or finished */
    int poll_ms;                             /* the longest wait for data between ticks: 0 -> 20 */
    bool fault;                              /* 0 -> none; true: once every child is ready ... */
    int fault_rank;                          /* ... wait fault_delay_ms, then send this slot ... */
    int fault_sig;                           /* ... this signal (0 -> SIGKILL) */
    int fault_delay_ms;
    int (*on_line)(char* line, void* u);     /* required: a line without its '\n'; returns 1 if it counts */
    void (*on_ready)(int ready, void* u);    /* 0 -> none; after each "R" */
    void (*on_tick)(int ready, void* u);     /* 0 -> none; before each wait for data */
    bool (*finished)(void* u);               /* 0 -> none; true stops the reading */
    void* u;                                 /* handed to the callbacks */
    int ready;                               /* out: "R" marks read */
    double t_fault;                          /* out: when the fault was sent (0: never) */
} tw_reader;
/* r zeroed, then: stop at want lines (0: no count) or limit_s from now; each line to on_line(u). */
static void tw_reader_init(tw_reader* r, int want, double limit_s, int (*on_line)(char* line, void* u), void* u) {
    memset(r, 0, sizeof(*r));
    r->want = want;
    r->deadline = tw_now_s() + limit_s;
    r->on_line = on_line;
    r->u = u;
}
/* ... and once every child is ready: wait delay_ms, send sig (0: SIGKILL) to slot. */
static void tw_reader_fault(tw_reader* r, int slot, int sig, int delay_ms) {
    r->fault = true;
    r->fault_rank = slot;
    r->fault_sig = sig;
    r->fault_delay_ms = delay_ms;
}
static void _tw_maybe_fault(tw_world* w, tw_reader* r) {
    if (!r->fault || r->t_fault != 0 || r->ready < w->n) return;
    if (r->fault_delay_ms > 0) tw_sleep_ms(r->fault_delay_ms);
    tw_signal(w, r->fault_rank, r->fault_sig ? r->fault_sig : SIGKILL);
    r->t_fault = tw_now_s();
}
/* Reads "R" marks and lines until want lines counted, finished, the deadline or the pipe's end
   (every child gone). Returns the lines counted. Spawn every child before the first read: it
   closes the parent's write end. */
static int tw_read_reports(tw_world* w, tw_reader* r) {
    char buf[8192];
    size_t used = 0;
    int counted = 0;
    _tw_close_writer(w);
    if (!w->rd_open) return 0;
    while (tw_now_s() < r->deadline && (r->want <= 0 || counted < r->want) && !(r->finished && r->finished(r->u))) {
        struct pollfd pf;
        ssize_t k;
        int left_ms = (int)((r->deadline - tw_now_s()) * 1000) + 1, wait_ms = r->poll_ms > 0 ? r->poll_ms : 20;
        if (r->on_tick) r->on_tick(r->ready, r->u);
        _tw_maybe_fault(w, r);
        pf.fd = w->rd;
        pf.events = POLLIN;
        pf.revents = 0;
        if (poll(&pf, 1, wait_ms < left_ms ? wait_ms : left_ms) <= 0) continue;
        if (used == sizeof(buf) - 1) used = 0;   /* a line longer than the buffer: dropped */
        k = read(w->rd, buf + used, sizeof(buf) - 1 - used);
        if (k <= 0) break;
        used += (size_t)k;
        buf[used] = 0;
        for (;;) {
            char* nl;
            if (buf[0] == 'R') {
                memmove(buf, buf + 1, used);
                used--;
                r->ready++;
                if (r->on_ready) r->on_ready(r->ready, r->u);
                _tw_maybe_fault(w, r);
                continue;
            }
            nl = strchr(buf, '\n');
            if (!nl) break;
            *nl = 0;
            counted += r->on_line(buf, r->u);
            used -= (size_t)(nl + 1 - buf);
            memmove(buf, nl + 1, used + 1);
        }
    }
    return counted;
}
static bool tw_read_exact(tw_world* w, void* p, size_t n, double deadline_s);
/* Reads n "R" marks (nothing else may come first) before deadline_s: true, or false. */
static bool tw_read_ready(tw_world* w, int n, double deadline_s) {
    char c;
    int i;
    for (i = 0; i < n; i++)
        if (!tw_read_exact(w, &c, 1, deadline_s) || c != 'R') return false;
    return true;
}
/* Reads exactly n bytes (a child's fixed-size report, or its "R") before deadline_s
   (tw_now_s() time): true, or false at the deadline or the pipe's end. */
static bool tw_read_exact(tw_world* w, void* p, size_t n, double deadline_s) {
    size_t got = 0;
    _tw_close_writer(w);
    if (!w->rd_open) return false;
    while (got < n) {
        struct pollfd pf;
        ssize_t k;
        double left_s = deadline_s - tw_now_s();
        if (left_s <= 0) return false;
        pf.fd = w->rd;
        pf.events = POLLIN;
        pf.revents = 0;
        if (poll(&pf, 1, left_s > 1 ? 1000 : (int)(left_s * 1000) + 1) <= 0) continue;
        k = read(w->rd, (char*)p + got, n - got);
        if (k <= 0) return false;
        got += (size_t)k;
    }
    return true;
}

#if defined(DISTMESH_TCP)
/* >>store -------------------------------------------------------------------------------------- */
/* Where a forked world meets. ranks pass url as dm_tcp_desc.store_url and prefix as its key
   prefix; tw_store_next gives each world a fresh prefix, so one store serves a program. */
typedef struct tw_store {
    char dir[400];          /* a file store's directory ("" for a TCP store) */
    char url[420];          /* "file://<dir>" or "tcp://127.0.0.1:<port>" */
    char prefix[32];        /* the current world's key prefix, "run<n>/" ("" before tw_store_next) */
    int run;                /* worlds so far */
    int port;               /* a TCP store's port */
    bool owns_dir;          /* tw_store_close removes dir */
    pid_t agent;            /* > 0: a forked process serves the store */
    int agent_ctl;          /* the agent serves until this pipe end is closed */
    dm_store* server;       /* the store served by this process, or NULL */
} tw_store;

/* *d for a store on 127.0.0.1: a server on a port it picks (port 0) or a client of port, its
   url written into url (cap bytes), a deadline of timeout_ms, the token given (NULL: from
   DISTMESH_TOKEN); the rest zero (every default). */
static void tw_store_desc_loopback(dm_store_desc* d, char* url, size_t cap, int port, int timeout_ms,
                                   const char* token) {
    memset(d, 0, sizeof(*d));
    snprintf(url, cap, "tcp://127.0.0.1:%d", port);
    d->url = url;
    d->is_server = port == 0;
    d->timeout_ms = timeout_ms;
    d->token = token;
}
static void _tw_store_zero(tw_store* s) {
    memset(s, 0, sizeof(*s));
    s->agent_ctl = -1;
}
/* A file store in a fresh directory /tmp/<tag>_XXXXXX (removed by tw_store_close). 0 or -1. */
static int tw_store_file(tw_store* s, const char* tag) {
    _tw_store_zero(s);
    if (tmpdir_make(s->dir, sizeof(s->dir), tag) != 0) return -1;
    s->owns_dir = true;
    snprintf(s->url, sizeof(s->url), "file://%s", s->dir);
    return 0;
}
/* A file store in an existing directory dir (left in place by tw_store_close). */
static int tw_store_dir(tw_store* s, const char* dir) {
    _tw_store_zero(s);
    snprintf(s->dir, sizeof(s->dir), "%s", dir);
    snprintf(s->url, sizeof(s->url), "file://%s", dir);
    return 0;
}
/* A TCP store served by this process on an ephemeral loopback port (its server thread is not
   copied into children forked later; they only connect to it). 0 or -1. */
static int tw_store_serve(tw_store* s) {
    dm_store_desc d;
    _tw_store_zero(s);
    memset(&d, 0, sizeof(d));
    d.url = "tcp://127.0.0.1:0";
    d.is_server = true;
    if (dm_store_create(&d, &s->server) != DM_OK) return -1;
    s->port = dm_store_port(s->server);
    snprintf(s->url, sizeof(s->url), "tcp://127.0.0.1:%d", s->port);
    return 0;
}
/* A TCP store served by a forked agent process (as a launcher's agent does, and so that its
   memory can be measured or the process stopped): desc's url defaults to tcp://127.0.0.1:0,
   is_server is set. The agent serves until tw_store_close or this process ends, alarm_s at
   most (0 -> 600 s). 0, or -1 when it could not serve. */
static int tw_store_agent(tw_store* s, const dm_store_desc* desc, int alarm_s) {
    int up[2], ctl[2], port = -1;
    _tw_store_zero(s);
    if (pipe(up) != 0) return -1;
    if (pipe(ctl) != 0) { close(up[0]); close(up[1]); return -1; }
    fflush(NULL);
    s->agent = fork();
    if (s->agent == 0) {
        dm_store_desc d;
        dm_store* server = NULL;
        bool served;
        char b;
        close(up[0]);
        close(ctl[1]);
        alarm(alarm_s > 0 ? (unsigned)alarm_s : 600u);
        if (desc) d = *desc;
        else memset(&d, 0, sizeof(d));
        if (!d.url) d.url = "tcp://127.0.0.1:0";
        d.is_server = true;
        served = dm_store_create(&d, &server) == DM_OK;
        if (served) port = dm_store_port(server);
        if (write(up[1], &port, sizeof(port)) != (ssize_t)sizeof(port)) _exit(2);
        while (read(ctl[0], &b, 1) > 0) {}
        dm_store_destroy(server);
        _exit(served ? 0 : 1);
    }
    close(up[1]);
    close(ctl[0]);
    s->agent_ctl = ctl[1];
    if (s->agent < 0) { close(up[0]); close(ctl[1]); _tw_store_zero(s); return -1; }
    {   /* the port, or the agent's end */
        tw_world one;
        memset(&one, 0, sizeof(one));
        one.rd = up[0];
        one.rd_open = true;
        if (!tw_read_exact(&one, &port, sizeof(port), tw_now_s() + 30)) port = -1;
        close(up[0]);
    }
    s->port = port;
    snprintf(s->url, sizeof(s->url), "tcp://127.0.0.1:%d", port);
    return port > 0 ? 0 : -1;
}
/* A free loopback port for rank 0 of the world to serve the store on (dm_tcp_create does
   when store_url names its own address, and dm_init with MASTER_ADDR / MASTER_PORT). 0 or -1. */
static int tw_store_rank0(tw_store* s) {
    _tw_store_zero(s);
    s->port = tw_free_port();
    snprintf(s->url, sizeof(s->url), "tcp://127.0.0.1:%d", s->port);
    return s->port > 0 ? 0 : -1;
}
/* The next world's key prefix, "run<n>/" (also in s->prefix). */
static const char* tw_store_next(tw_store* s) {
    snprintf(s->prefix, sizeof(s->prefix), "run%d/", ++s->run);
    return s->prefix;
}
/* Ends the store: the agent asked to stop (5 s, then kill -9), the server destroyed, the
   directory removed if tw_store_file made it. 0, or -1 when the agent did not exit 0 or the
   directory could not be removed. */
static int tw_store_close(tw_store* s) {
    int rc = 0;
    if (s->agent > 0) {
        tw_world one;
        memset(&one, 0, sizeof(one));
        one.pid[0] = s->agent;
        one.n = 1;
        close(s->agent_ctl);
        if (tw_reap(&one, 5) != 0) rc = -1;
    }
    if (s->server) dm_store_destroy(s->server);
    if (s->owns_dir && tmpdir_remove(s->dir) != 0) rc = -1;
    _tw_store_zero(s);
    return rc;
}

/* >>dm ----------------------------------------------------------------------------------------- */
/* A TCP desc for rank of world on store s: its url and current prefix, loopback ("lo"),
   timeout_ms; the rest zero (defaults). Points into s: keep s alive while d is used. */
static void tw_tcp_desc(dm_tcp_desc* d, const tw_store* s, int rank, int world, int timeout_ms) {
    memset(d, 0, sizeof(*d));
    d->rank = rank;
    d->world_size = world;
    d->store_url = s && s->url[0] ? s->url : NULL;
    d->prefix = s && s->prefix[0] ? s->prefix : NULL;
    d->ifname = "lo";
    d->timeout_ms = timeout_ms;
}
/* This process runs on simulated host "h<host>" (DISTMESH_TEST_HOST_ID). */
static void tw_sim_host(int host) {
    char h[16];
    snprintf(h, sizeof(h), "h%d", host);
    setenv("DISTMESH_TEST_HOST_ID", h, 1);
}

/* This process is rank of world, local_rank of local_size on its host, as torchrun says it
   (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE). */
static void tw_launcher_env(int rank, int world, int local_rank, int local_size) {
    char v[16];
    snprintf(v, sizeof(v), "%d", rank); setenv("RANK", v, 1);
    snprintf(v, sizeof(v), "%d", world); setenv("WORLD_SIZE", v, 1);
    snprintf(v, sizeof(v), "%d", local_rank); setenv("LOCAL_RANK", v, 1);
    snprintf(v, sizeof(v), "%d", local_size); setenv("LOCAL_WORLD_SIZE", v, 1);
}

/* What every rank of a forked distmesh world runs: 0 when every check passed. */
typedef int (*tw_body)(dm_collective* c, int rank, int world, void* arg);
/* A distmesh world: each rank a forked process that creates its TCP collective and runs body
   (or, transport "thread", one forked process running the threaded world). Zero is default. */
typedef struct tw_dm_world {
    int world;                                     /* required: ranks */
    tw_store* store;                               /* required unless "thread": where they meet */
    const char* transport;                         /* 0 -> auto; "shm", "tcp"; "thread": dm_thread_world_run */
    int timeout_ms;                                /* 0 -> 30000: the collective's deadline */
    int per_host;                                  /* 0 -> one host; > 0: rank r on host h<r / per_host> */
    const int* host_of;                            /* 0 -> see per_host; else rank r on host h<host_of[r]> */
    bool launcher_env;                             /* 0 -> none; true: each rank gets tw_launcher_env for its
                                                      host (per_host blocks; host_of in rank order) */
    bool no_create;                                /* 0 -> made before body; true: body gets NULL */
    void (*before)(int rank, void* arg);           /* 0 -> none; in the child, before anything is made */
    void (*edit)(dm_tcp_desc* d, int rank, void* arg);  /* 0 -> none; the last word on the desc */
    tw_body body;                                  /* required, unless body_c */
    int (*body_c)(dm_collective* c, void* arg);    /* 0 -> body; else run instead (rank and world from c) */
    void* arg;                                     /* handed to body (body_c), before and edit */
} tw_dm_world;

/* The cmocka group fixtures setup_store (store becomes a file store named after tag; SIGPIPE
   gets on_sigpipe, SIG_DFL or SIG_IGN) and teardown_store. */
#define TW_STORE_FIXTURES(store, tag, on_sigpipe)                                               \
    static int setup_store(void** s) {                                                          \
        (void)s;                                                                                \
        signal(SIGPIPE, on_sigpipe);                                                            \
        return tw_store_file(&store, tag);                                                      \
    }                                                                                           \
    static int teardown_store(void** s) {                                                       \
        (void)s;                                                                                \
        return tw_store_close(&store);                                                          \
    }
/* *w zeroed (every default), then world ranks meeting through store over transport (NULL:
   auto) with a deadline of timeout_ms (0: 30000); the caller adds the body. */
static void tw_dm_world_init(tw_dm_world* w, int world, tw_store* store, const char* transport, int timeout_ms) {
    memset(w, 0, sizeof(*w));
    w->world = world;
    w->store = store;
    w->transport = transport;
    w->timeout_ms = timeout_ms;
}
static int _tw_dm_body(const tw_dm_world* w, dm_collective* c, int rank) {
    return w->body_c ? w->body_c(c, w->arg) : w->body(c, rank, w->world, w->arg);
}
static int _tw_dm_thread_rank(dm_collective* c, void* user) {
    const tw_dm_world* w = (const tw_dm_world*)user;
    return _tw_dm_body(w, c, dm_rank(c)) ? DM_ERR_INTERNAL : DM_OK;
}
static int _tw_dm_rank(int rank, void* ctx) {
    const tw_dm_world* w = (const tw_dm_world*)ctx;
    int timeout_ms = w->timeout_ms ? w->timeout_ms : 30000, rc;
    dm_collective* c = NULL;
    if (w->transport && strcmp(w->transport, "thread") == 0) {
        dm_fake_desc fd;
        if (w->before) w->before(rank, w->arg);
        memset(&fd, 0, sizeof(fd));
        fd.world_size = w->world;
        fd.timeout_ms = timeout_ms;
        fd.host_of = w->host_of;
        return dm_thread_world_run(&fd, _tw_dm_thread_rank, (void*)w) != DM_OK;
    }
    if (w->host_of) tw_sim_host(w->host_of[rank]);
    else if (w->per_host > 0) tw_sim_host(rank / w->per_host);
    if (w->launcher_env) {          /* its place among the ranks of its host */
        int j, lr = 0, ls = 0;
        for (j = 0; j < w->world; j++) {
            int same = w->host_of ? w->host_of[j] == w->host_of[rank]
                                  : w->per_host > 0 ? j / w->per_host == rank / w->per_host : 1;
            lr += same && j < rank;
            ls += same;
        }
        tw_launcher_env(rank, w->world, lr, ls);
    }
    if (w->before) w->before(rank, w->arg);
    if (!w->no_create) {
        dm_tcp_desc d;
        dm_status st;
        tw_tcp_desc(&d, w->store, rank, w->world, timeout_ms);
        d.transport = w->transport;
        if (w->edit) w->edit(&d, rank, w->arg);
        st = dm_tcp_create(&d, &c);
        if (st != DM_OK) {
            fprintf(stderr, "%s: dm_tcp_create: %s\n", tw_me.who, dm_status_name(st));
            return 1;
        }
    }
    rc = _tw_dm_body(w, c, rank);
    dm_destroy(c);
    return rc;
}
/* Forks w's ranks into p (p's options apply: alarm, reports, exit) with a fresh store prefix.
   0, or -1 when a fork failed (reap p all the same). */
static int tw_dm_fork(tw_world* p, tw_dm_world* w) {
    bool thread = w->transport && strcmp(w->transport, "thread") == 0;
    if (w->store) tw_store_next(w->store);
    return tw_fork(p, thread ? 1 : w->world, _tw_dm_rank, w);
}
/* Forks w and reaps it by limit_s (each rank's own alarm: limit_s + 5). Returns the processes
   that failed, did not start or were killed at the limit (0: all passed). */
static int tw_dm_run(tw_dm_world* w, double limit_s) {
    tw_world p;
    int failed;
    memset(&p, 0, sizeof(p));
    p.alarm_s = (int)limit_s + 5;
    failed = tw_dm_fork(&p, w) != 0;
    return failed + tw_reap(&p, limit_s);
}
#endif /* DISTMESH_TCP */

#undef _TW_PRINTF
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif /* DM_TEST_WORLD_H */
