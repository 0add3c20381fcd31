/* memcpy_bw: single-core memcpy bandwidth, the ceiling of any copy between ranks on one host
   (scripts/compare.sh prints it beside the results). Copies a 64 MiB buffer ten times after a
   warm-up and prints the median: "memcpy GB/s=X" (GB = 1e9 bytes). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../tests/test_world.h"

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
        double t0 = tw_now_s();
        memcpy(dst, src, n);
        gbs[k] = (double)n / (tw_now_s() - t0) / 1e9;
        src[k] = dst[n - 1 - (size_t)k];   /* keep the copies observable */
    }
    printf("memcpy GB/s=%.3f\n", tw_median(gbs, RUNS));
    free(src);
    free(dst);
    return 0;
}
