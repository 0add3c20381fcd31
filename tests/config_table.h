/* README's table of environment variables, printed from distmesh.h's >>config registry (the
   _DM_CFG_LIST and _DM_CFG_LAUNCHER_LIST X-macros). Include after distmesh.h with
   DISTMESH_IMPLEMENTATION. Used by tests/config_table.c (`make config-table` rewrites README's
   table) and tests/test_config.c (fails when README's table differs). */
#ifndef DM_CONFIG_TABLE_H
#define DM_CONFIG_TABLE_H
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DM_CONFIG_TABLE_BEGIN "<!-- distmesh:config-table begin"
#define DM_CONFIG_TABLE_END "<!-- distmesh:config-table end -->"

/* The whole file at path, NUL-terminated, malloc'd (the caller frees it), or NULL. */
static char* dm_read_whole_file(const char* path) {
    FILE* f = fopen(path, "rb");
    char* p;
    long n;
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) { fclose(f); return NULL; }
    p = (char*)malloc((size_t)n + 1);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) { free(p); p = NULL; }
    if (p) p[n] = 0;
    fclose(f);
    return p;
}
typedef struct dm_text { char* p; size_t len, cap; bool full; } dm_text;
static void dm_text_add(dm_text* t, const char* fmt, ...) {
    va_list ap;
    int n;
    if (t->full) return;
    va_start(ap, fmt);
    n = vsnprintf(t->p + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= t->cap - t->len) { t->full = true; return; }
    t->len += (size_t)n;
}

/* What a value of v looks like, for the "values" column. */
static void dm_config_values(const _dm_cfg_var* v, dm_text* t) {
    const char* p;
    switch (v->type) {
    case _DM_CFG_T_INT:
        if (v->max >= INT_MAX) dm_text_add(t, "integer >= %lld", v->min);
        else dm_text_add(t, "integer %lld..%lld", v->min, v->max);
        break;
    case _DM_CFG_T_MS: dm_text_add(t, "milliseconds >= %lld", v->min); break;
    case _DM_CFG_T_BOOL: dm_text_add(t, "`0` or `1`"); break;
    case _DM_CFG_T_BYTES: dm_text_add(t, "bytes, `K`/`M`/`G` suffix"); break;
    case _DM_CFG_T_SECONDS:
        dm_text_add(t, "seconds, decimals allowed%s", v->min < 0 ? ", negative: forever" : "");
        break;
    case _DM_CFG_T_ENUM:
        dm_text_add(t, "`");
        for (p = v->choices; *p; p++) {
            if (*p == '|') dm_text_add(t, "`, `");
            else dm_text_add(t, "%c", *p);
        }
        dm_text_add(t, "`");
        break;
    default:
        if (v->max > 0) dm_text_add(t, "text, at most %lld bytes", v->max);
        else dm_text_add(t, "text");
        break;
    }
}
static const char* dm_config_reader(unsigned by) {
    switch (by) {
    case _DM_CFG_B_CORE: return "every collective";
    case _DM_CFG_B_ENV: return "dm_env_detect";
    case _DM_CFG_B_ENGINE: return "tcp, threaded world";
    case _DM_CFG_B_TCP: return "tcp";
    case _DM_CFG_B_STORE: return "store";
    case _DM_CFG_B_TCP_STORE: return "tcp, store";
    default: return "?";
    }
}
/* "A, B, C" -> "`A`, `B`, `C`". */
static void dm_config_names(const char* names, dm_text* t) {
    dm_text_add(t, "`");
    for (; *names; names++) {
        if (names[0] == ',' && names[1] == ' ') { dm_text_add(t, "`, `"); names++; }
        else dm_text_add(t, "%c", *names);
    }
    dm_text_add(t, "`");
}

/* The lines between the markers (the markers excluded), into out (cap bytes). false: too small. */
static bool dm_config_table(char* out, size_t cap) {
    dm_text t;
    int id;
    t.p = out; t.len = 0; t.cap = cap; t.full = false;
    out[0] = 0;
    dm_text_add(&t, "| variable | values | default | read by | meaning |\n| --- | --- | --- | --- | --- |\n");
    for (id = 0; id < _DM_CFG_COUNT; id++) {
        const _dm_cfg_var* v = &_dm_cfg_vars[id];
        dm_text_add(&t, "| `%s` | ", v->name);
        dm_config_values(v, &t);
        if (v->dflt[0]) dm_text_add(&t, " | `%s` | ", v->dflt);
        else dm_text_add(&t, " | unset | ");
        dm_text_add(&t, "%s | %s |\n", dm_config_reader(v->by), v->meaning);
    }
    dm_text_add(&t, "\nVariables of the launchers and other programs that distmesh reads:\n\n"
                    "| variables | read by | meaning |\n| --- | --- | --- |\n");
#define _DM_X(names, by, meaning) \
    dm_text_add(&t, "| "); dm_config_names(names, &t); dm_text_add(&t, " | %s | %s |\n", by, meaning);
    _DM_CFG_LAUNCHER_LIST(_DM_X)
#undef _DM_X
    return !t.full;
}

/* The text between README's markers: *begin (just after the begin marker's line) and *end (the
   start of the end marker's line). false when a marker is missing or out of order. */
static bool dm_config_find(const char* readme, const char** begin, const char** end) {
    const char* b = strstr(readme, DM_CONFIG_TABLE_BEGIN);
    const char* e;
    if (!b) return false;
    b = strchr(b, '\n');
    if (!b) return false;
    b++;
    e = strstr(b, DM_CONFIG_TABLE_END);
    if (!e) return false;
    while (e > b && e[-1] != '\n') e--;
    *begin = b;
    *end = e;
    return true;
}
#endif
