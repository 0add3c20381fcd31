/* A test program's private directory under /tmp: made by its cmocka group setup, removed (with
   everything in it) by the teardown. */
#ifndef DM_TEST_TMPDIR_H
#define DM_TEST_TMPDIR_H
#include <stdio.h>
#include <stdlib.h>

/* dir (cap bytes) becomes "/tmp/<prefix>_XXXXXX", made with mkdtemp: 0, or -1. */
static int tmpdir_make(char* dir, size_t cap, const char* prefix) {
    snprintf(dir, cap, "/tmp/%s_XXXXXX", prefix);
    return mkdtemp(dir) ? 0 : -1;
}
static int tmpdir_remove(const char* dir) {
    char cmd[1100];   /* dir up to 1 KiB */
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}
/* The cmocka group fixtures tmpdir_setup (dir, a char array, becomes a fresh
   /tmp/<prefix>_XXXXXX) and tmpdir_teardown (removes it and everything in it). */
#define TMPDIR_FIXTURES(dir, prefix)                                                             \
    static int tmpdir_setup(void** state) {                                                      \
        (void)state;                                                                             \
        return tmpdir_make(dir, sizeof(dir), prefix);                                            \
    }                                                                                            \
    static int tmpdir_teardown(void** state) {                                                   \
        (void)state;                                                                             \
        return tmpdir_remove(dir);                                                               \
    }
#endif
