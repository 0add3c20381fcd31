/* reduce_local: the reduction kernel alone, dm_reduce_local(dst op= src), float32 and bfloat16,
   sum and max, at 64 KiB (in cache) and 16 MiB (memory bound). One key=value line per case:
   the median time of one call over --reps timed rounds (each round repeats the call enough to
   take some milliseconds) and the bytes of dst+src moved per second.
     reduce_local [--reps N]
   scripts/reduce_local_ab.sh builds it against two trees and compares them interleaved. */
#include "distmesh.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
static int cmp_double(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
    static const dm_dtype dtypes[] = { DM_FLOAT32, DM_BFLOAT16 };
    static const dm_reduce_op ops[] = { DM_SUM, DM_MAX };
    static const size_t sizes[] = { (size_t)64 << 10, (size_t)16 << 20 };
    int reps = 15, d, o, s, r;
    double t[101];
    if (argc == 3 && strcmp(argv[1], "--reps") == 0) reps = atoi(argv[2]);
    if (reps < 1 || reps > 101) { fprintf(stderr, "reduce_local [--reps 1..101]\n"); return 2; }
    for (s = 0; s < 2; s++) {
        size_t bytes = sizes[s], i;
        unsigned char* dst = (unsigned char*)malloc(bytes);
        unsigned char* src = (unsigned char*)malloc(bytes);
        if (!dst || !src) return 1;
        for (d = 0; d < 2; d++)
            for (o = 0; o < 2; o++) {
                size_t es = dm_dtype_size(dtypes[d]), count = bytes / es;
                long calls = (long)(((size_t)64 << 20) / bytes) + 1, k;   /* ~64 MiB per round */
                for (i = 0; i < count; i++) {   /* small values: sums stay finite over every call */
                    float v = (float)(i % 7) * 0.001f, w = (float)(i % 5) * 1e-7f;
                    if (dtypes[d] == DM_FLOAT32) { memcpy(dst + i * 4, &v, 4); memcpy(src + i * 4, &w, 4); }
                    else {
                        uint16_t a = dm_float_to_bfloat16(v), b = dm_float_to_bfloat16(w);
                        memcpy(dst + i * 2, &a, 2);
                        memcpy(src + i * 2, &b, 2);
                    }
                }
                dm_reduce_local(dtypes[d], ops[o], dst, src, count);            /* warm up */
                for (r = 0; r < reps; r++) {
                    double t0 = now_s();
                    for (k = 0; k < calls; k++) dm_reduce_local(dtypes[d], ops[o], dst, src, count);
                    t[r] = (now_s() - t0) / (double)calls;
                }
                qsort(t, (size_t)reps, sizeof(double), cmp_double);
                printf("kernel=reduce_local dtype=%s op=%s bytes=%zu us=%.3f GBps=%.2f\n", dm_dtype_name(dtypes[d]),
                       dm_reduce_op_name(ops[o]), bytes, t[reps / 2] * 1e6, 2.0 * (double)bytes / t[reps / 2] * 1e-9);
            }
        free(dst);
        free(src);
    }
    return 0;
}
