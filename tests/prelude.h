/* What every cmocka test program starts with: the headers cmocka needs before <cmocka.h> (it
   includes none itself), the libc every test uses, the name filter (test_filter.h), the check
   macros, hex helpers and the program's main.

   Include it first, after only the program's feature macro (_GNU_SOURCE or _POSIX_C_SOURCE
   200809L, which must precede every system header) and, where the program is the one TU with
   the implementation, distmesh.h with DISTMESH_IMPLEMENTATION. Then distmesh.h and the other
   test headers (test_world.h, test_util.h, test_tcp.h) as the program needs them.

     CHECK(cond)               assert_true
     CHECK_OK(expr)            expr returns DM_OK; else its name and status, and the test fails
     CHECK_ST(c, want, expr)   expr returns want; else the status and dm_last_error(c)
     CHECK_DM_OK(c, expr)      CHECK_ST(c, DM_OK, expr)
     check_has_all(text, a, b, ..., NULL)   every needle is in text
     tohex / unhex             bytes <-> lowercase hex ("ab*4": the byte 0xab 4 times)
     DM_RUN_TESTS(argc, argv, tests, setup, teardown)
                               the filter of argv[1] (test_filter.h), then the group
     DM_TEST_MAIN(setup, teardown, cmocka_unit_test(a), ...)
                               a whole main() that does only that */
#ifndef DM_TEST_PRELUDE_H
#define DM_TEST_PRELUDE_H
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "test_filter.h"

#define CHECK(c) assert_true(c)
#define CHECK_OK(expr)                                                                           \
    do {                                                                                         \
        dm_status st_ = (expr);                                                                  \
        if (st_ != DM_OK) print_message("%s -> %s\n", #expr, dm_status_name(st_));              \
        assert_int_equal(st_, DM_OK);                                                            \
    } while (0)
#define CHECK_ST(c, want, expr)                                                                  \
    do {                                                                                         \
        dm_status s_ = (expr);                                                                   \
        if (s_ != (want))                                                                        \
            fail_msg("%s -> %s (want %s): %s", #expr, dm_status_name(s_), dm_status_name(want),  \
                     dm_last_error(c));                                                          \
    } while (0)
#define CHECK_DM_OK(c, expr) CHECK_ST(c, DM_OK, expr)

#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#endif
/* Fails the test naming the first needle (the list ends with NULL) that text lacks. */
static void check_has_all(const char* text, ...) {
    const char* needle;
    va_list ap;
    va_start(ap, text);
    while ((needle = va_arg(ap, const char*)) != NULL) {
        if (!strstr(text, needle)) {
            va_end(ap);
            fail_msg("missing \"%s\" in:\n%s", needle, text);
        }
    }
    va_end(ap);
}
/* p[0..n) as 2n lowercase hex digits and a NUL in out. */
static void tohex(const unsigned char* p, size_t n, char* out) {
    size_t i;
    for (i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", p[i]);
    out[2 * n] = 0;
}
/* Hex digits into at most cap bytes; "xx*N" is the byte xx N times. Returns the byte count. */
static size_t unhex(const char* h, unsigned char* out, size_t cap) {
    size_t n = 0;
    unsigned v;
    if (strchr(h, '*')) {
        size_t rep = (size_t)atoi(strchr(h, '*') + 1);
        if (rep > cap) rep = cap;
        sscanf(h, "%2x", &v);
        memset(out, (int)v, rep);
        return rep;
    }
    while (h[0] && h[1] && n < cap) {
        sscanf(h, "%2x", &v);
        out[n++] = (unsigned char)v;
        h += 2;
    }
    return n;
}
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic pop
#endif

#define DM_RUN_TESTS(argc, argv, tests, setup, teardown)                                         \
    (dm_test_filter(argc, argv), cmocka_run_group_tests(tests, setup, teardown))
#define DM_TEST_MAIN(setup, teardown, ...)                                                       \
    int main(int argc, char** argv) {                                                            \
        const struct CMUnitTest tests[] = {__VA_ARGS__};                                         \
        return DM_RUN_TESTS(argc, argv, tests, setup, teardown);                                 \
    }
#endif
