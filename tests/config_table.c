/* Prints README's table of environment variables from distmesh.h's >>config registry; with
   `--write FILE` replaces the table between FILE's markers instead (`make config-table` does that
   to README.md). tests/test_config.c fails while README's table differs from this output. */
#define DISTMESH_IMPLEMENTATION
#include "distmesh.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "config_table.h"

static char g_table[1 << 16];


int main(int argc, char** argv) {
    const char *b, *e;
    char* doc;
    FILE* f;
    if (!dm_config_table(g_table, sizeof(g_table))) { fprintf(stderr, "config_table: table too long\n"); return 1; }
    if (argc == 1) {
        fputs(g_table, stdout);
        return 0;
    }
    if (argc != 3 || strcmp(argv[1], "--write") != 0) {
        fprintf(stderr, "usage: %s [--write README.md]\n", argv[0]);
        return 2;
    }
    doc = dm_read_whole_file(argv[2]);
    if (!doc) { fprintf(stderr, "config_table: cannot read %s\n", argv[2]); return 1; }
    if (!dm_config_find(doc, &b, &e)) {
        fprintf(stderr, "config_table: %s has no \"%s ... -->\" line followed by \"%s\"\n", argv[2],
                DM_CONFIG_TABLE_BEGIN, DM_CONFIG_TABLE_END);
        free(doc);
        return 1;
    }
    f = fopen(argv[2], "wb");
    if (!f || fwrite(doc, 1, (size_t)(b - doc), f) != (size_t)(b - doc) || fputs(g_table, f) < 0 ||
        fputs(e, f) < 0 || fclose(f) != 0) {
        fprintf(stderr, "config_table: cannot write %s\n", argv[2]);
        free(doc);
        return 1;
    }
    free(doc);
    printf("config_table: %s: the table between its markers is the registry's now\n", argv[2]);
    return 0;
}
