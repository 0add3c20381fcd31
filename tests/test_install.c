/* `make install` into a private DESTDIR, then an out-of-tree consumer (tests/consumer/) built
   and run through pkg-config (distmesh, distmesh-tcp) and through CMake (find_package(distmesh)
   with the distmesh::distmesh and distmesh::tcp targets). Each step's output goes to a log that
   is printed when the step fails. The CMake test skips when cmake is missing. */
#define _GNU_SOURCE
#include "prelude.h"
#include <unistd.h>
#include "test_world.h"

#ifndef DM_SRCDIR
#define DM_SRCDIR "."
#endif

static char g_dir[64];

/* Runs a shell command in g_dir (300 s at most); prints its output when it fails. */
static int sh(const char* fmt, ...) {
    static char log[1 << 16];
    char cmd[4096], full[4400];
    int rc;
    TW_VFORMAT(cmd, fmt);
    /* a make started from `make test` must not inherit the parent's jobserver */
    snprintf(full, sizeof(full), "cd %s && env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL sh -c '%s'", g_dir, cmd);
    rc = tw_run_cmd(300, log, sizeof(log), full);
    if (rc != 0) fprintf(stderr, "command failed (%d): %s\n%s", rc, cmd, log);
    return rc;
}

static int setup(void** state) {
    (void)state;
    snprintf(g_dir, sizeof(g_dir), "/tmp/dm_install_XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    return sh("make -s -C %s install DESTDIR=%s/root PREFIX=/usr", DM_SRCDIR, g_dir);
}
static int teardown(void** state) {
    char cmd[128];
    (void)state;
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_install_layout(void** state) {
    (void)state;
    assert_int_equal(sh("test -f root/usr/include/distmesh.h && test -f root/usr/include/distmesh_tcp.h && "
                        "test -f root/usr/include/distmesh_store.h && test -f root/usr/include/distmesh_trace.h && "
                        "test -f root/usr/include/distmesh_shm.h && test -f root/usr/include/distmesh_socket.h && "
                        "test -f root/usr/include/distmesh_kernels.h && test -f root/usr/include/distmesh_core.h && "
                        "test -f root/usr/include/distmesh_engine.h && test -f root/usr/include/distmesh_schedules.h && "
                        "test -f root/usr/include/distmesh_thread.h && "
                        "test -f root/usr/include/distmesh_nccl.h && test -f root/usr/lib/pkgconfig/distmesh.pc && "
                        "test -f root/usr/lib/pkgconfig/distmesh-tcp.pc && "
                        "test -f root/usr/lib/cmake/distmesh/distmesh-config.cmake && "
                        "test -f root/usr/lib/cmake/distmesh/distmesh-config-version.cmake"), 0);
    /* distmesh.pc names libuv in Requires; the installed prefix is the one asked for */
    assert_int_equal(sh("grep -q \"^Requires: libuv\" root/usr/lib/pkgconfig/distmesh.pc && "
                        "grep -q \"^prefix=/usr$\" root/usr/lib/pkgconfig/distmesh.pc"), 0);
}

/* --define-prefix: the .pc files sit in a DESTDIR, so their prefix is taken from where they are */
#define PKGCONF "PKG_CONFIG_PATH=$PWD/root/usr/lib/pkgconfig pkg-config --define-prefix"

static void test_install_pkgconfig_consumer(void** state) {
    (void)state;
    assert_int_equal(sh(PKGCONF " --cflags --libs distmesh > flags_core && "
                        "grep -q -- \"-I$PWD/root/usr/include\" flags_core && grep -q -- -luv flags_core"), 0);
    assert_int_equal(sh("cc -std=c11 -Wall -Wextra -Wpedantic -Werror %s/tests/consumer/consumer.c "
                        "$(" PKGCONF " --cflags --libs distmesh) -o consumer_core && ./consumer_core | "
                        "grep -q \"core only\"", DM_SRCDIR), 0);
    assert_int_equal(sh("cc -std=c11 -Wall -Wextra -Wpedantic -Werror %s/tests/consumer/consumer.c "
                        "$(" PKGCONF " --cflags --libs distmesh-tcp) -o consumer_tcp && ./consumer_tcp | "
                        "grep -q \"tcp backend\"", DM_SRCDIR), 0);
}

static void test_install_cmake_consumer(void** state) {
    (void)state;
    if (system("command -v cmake > /dev/null 2>&1") != 0) {
        fprintf(stderr, "SKIP: cmake not installed\n");
        skip();
    }
    /* no build type: the consumers compile at -O0 (what is tested is finding and linking the
       targets, not the code; -O3 made this the slowest part of the program), two at a time */
    assert_int_equal(sh("cmake -S %s/tests/consumer -B cm -DCMAKE_PREFIX_PATH=$PWD/root/usr "
                        "&& cmake --build cm -j 2", DM_SRCDIR), 0);
    assert_int_equal(sh("cm/consumer_core | grep -q \"core only\" && cm/consumer_tcp | grep -q \"tcp backend\" && "
                        "cm/consumer_store | grep -q \"store compiled in\""), 0);
    /* asking for a component that does not exist fails with a message naming it */
    assert_int_equal(sh("mkdir -p bad && printf \"cmake_minimum_required(VERSION 3.14)\\nproject(x C)\\n"
                        "find_package(distmesh REQUIRED COMPONENTS nope)\\n\" > bad/CMakeLists.txt && "
                        "! cmake -S bad -B badb -DCMAKE_PREFIX_PATH=$PWD/root/usr > bad.log 2>&1 && "
                        "grep -q \"unknown component\" bad.log"), 0);
}

DM_TEST_MAIN(setup, teardown,
    cmocka_unit_test(test_install_layout),
    cmocka_unit_test(test_install_pkgconfig_consumer),
    cmocka_unit_test(test_install_cmake_consumer))
