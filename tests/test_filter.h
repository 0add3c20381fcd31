/* One test by name: `prog PATTERN` runs only the cmocka tests whose names match PATTERN
   (cmocka's wildcards: * any run, ? one character); `make test T=PATTERN` passes it through
   tests/run.sh. Arguments starting with '-' are left to the program (e.g. test_tcp_rendezvous's --rank).
   Include after <cmocka.h>. */
#ifndef DM_TEST_FILTER_H
#define DM_TEST_FILTER_H
static void dm_test_filter(int argc, char** argv) {
    if (argc > 1 && argv[1][0] && argv[1][0] != '-') cmocka_set_test_filter(argv[1]);
}
#endif
