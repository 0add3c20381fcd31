/* Interop with the torch that /usr/bin/python3 imports (Debian's python3-torch is 1.13, the
   protocol of torch < 2.2; the GPU machine has 2.x): tests/fixtures/torch_interop.py drives
   torch's TCPStore client against a distmesh server and distmesh's client (store_tool) against
   torch's servers. Skipped when torch does not import. */
#define _GNU_SOURCE
#include "prelude.h"

#ifndef DM_SRCDIR
#define DM_SRCDIR "."
#endif
#ifndef DM_STORE_TOOL
#define DM_STORE_TOOL "store_tool"
#endif
#define PY "/usr/bin/python3"

static void test_torch_tcpstore_interop_both_ways(void** state) {
    int rc;
    (void)state;
    if (system(PY " -c 'import torch.distributed' > /dev/null 2>&1") != 0) {
        fprintf(stderr, "SKIP: torch does not import in " PY " (python3-torch)\n");
        skip();
    }
    rc = system("timeout -k 5 240 " PY " " DM_SRCDIR "/tests/fixtures/torch_interop.py " DM_STORE_TOOL);
    assert_int_equal(rc, 0);
}

DM_TEST_MAIN(NULL, NULL,
    cmocka_unit_test(test_torch_tcpstore_interop_both_ways))
