/* What the kill -9 benchmarks share (dm_loss.c, dm_shrink.c): a monotonic clock in ns, the
   median of doubles (sorts them), and an exact read from the ranks' report pipe with a
   deadline. Included once per program, after distmesh.h. */
#ifndef DM_BENCH_KILL_UTIL_H
#define DM_BENCH_KILL_UTIL_H
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
static int cmp_double(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return x < y ? -1 : x > y;
}
static double median(double* v, int n) {
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
/* Reads exactly n bytes from fd before deadline_ns; false otherwise. */
static bool read_full(int fd, void* p, size_t n, int64_t deadline_ns) {
    size_t got = 0;
    while (got < n) {
        struct pollfd pf;
        int64_t left_ms = (deadline_ns - mono_ns()) / 1000000;
        ssize_t k;
        if (left_ms <= 0) return false;
        pf.fd = fd; pf.events = POLLIN; pf.revents = 0;
        if (poll(&pf, 1, (int)(left_ms > 1000 ? 1000 : left_ms)) <= 0) continue;
        k = read(fd, (char*)p + got, n - got);
        if (k <= 0) return false;
        got += (size_t)k;
    }
    return true;
}
#endif
