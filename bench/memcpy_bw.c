/* memcpy_bw: single-core memcpy bandwidth, the ceiling of any copy between ranks on one host
   (scripts/compare.sh prints it beside the results). Copies a 64 MiB buffer ten times after a
   warm-up and prints the median: "memcpy GB/s=X" (GB = 1e9 bytes). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}
static int by_value(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

int main(void) {
    enum { RUNS = 10 };
    size_t n = (size_t)64 << 20;
    unsigned char *src = malloc(n), *dst = malloc(n);
    double gbs[RUNS];
    int k;
    if (!src || !dst) return 1;
    memset(src, 1, n);
    memset(dst, 2, n);
    memcpy(dst, src, n);
    for (k = 0; k < RUNS; k++) {
        double t0 = now_s();
        memcpy(dst, src, n);
        gbs[k] = (double)n / (now_s() - t0) / 1e9;
        src[k] = dst[n - 1 - (size_t)k];   /* keep the copies observable */
    }
    qsort(gbs, RUNS, sizeof(gbs[0]), by_value);
    printf("memcpy GB/s=%.3f\n", (gbs[RUNS / 2 - 1] + gbs[RUNS / 2]) / 2);
    free(src);
    free(dst);
    return 0;
}
