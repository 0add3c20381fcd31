/* test_compile: two translation units that include distmesh.h plainly (this one and
   test_compile_b.c) linked with tests/impl.c into one program. Its build rule also depends on the
   gcc/clang compile checks (tests/compile_check.c, built as C and as C++), so a compile failure
   there fails `make test`. */
#include "distmesh.h"
#include "prelude.h"

int compile_b_fake_sum(int n);
const char* compile_b_status_name(dm_status st);

static void test_compile_two_tus_share_one_implementation(void** state) {
    (void)state;
    assert_int_equal(compile_b_fake_sum(5), 10);
    assert_string_equal(compile_b_status_name(DM_ERR_TIMEOUT), "DM_ERR_TIMEOUT");
    assert_ptr_equal(compile_b_status_name(DM_OK), dm_status_name(DM_OK));
}

static void test_compile_header_macros(void** state) {
    (void)state;
    assert_string_equal(DISTMESH_VERSION, "0.1.0");
    assert_true(DM_MAX_DIMS >= 4);
    assert_int_equal(DM_OK, 0);
    assert_int_equal(DM_SPLIT_NONE, -1);
#ifdef DISTMESH_IMPL_INCLUDED
    fail_msg("a plain include must not emit the implementation");
#endif
}

DM_TEST_MAIN(NULL, NULL,
    cmocka_unit_test(test_compile_two_tus_share_one_implementation),
    cmocka_unit_test(test_compile_header_macros))
