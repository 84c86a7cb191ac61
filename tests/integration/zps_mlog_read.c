/* zps_mlog_read.c - jansson over a JSON-lines file, a line at a time. */
#include "zps_mlog_read.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>

json_t *zps_mlog_read(const char *path)
{
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "%s: cannot open", path);
    json_t *all = json_array();
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0;
    // getline: a step record of many workers outgrows any fixed buffer.
    while (getline(&line, &cap, f) > 0) {
        lineno++;
        json_error_t err;
        json_t *o = json_loads(line, 0, &err);
        ck_assert_msg(o != NULL && json_is_object(o), "%s line %d is not a JSON object: %s",
                      path, lineno, line);
        json_array_append_new(all, o);
    }
    free(line);
    fclose(f);
    return all;
}

json_t *zps_procs_mlog(const zps_procs *ps, const char *name)
{
    return zps_mlog_read(zps_procs_path(ps, name));
}

bool zps_mlog_step(const json_t *rec, uint64_t *step)
{
    json_t *s = json_object_get(rec, "step");
    if (!json_is_integer(s)) {
        return false;
    }
    *step = (uint64_t)json_integer_value(s);
    return true;
}

json_t *zps_mlog_worker(const json_t *rec, int rank)
{
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(rec, "workers"), i, w)
    {
        if (json_integer_value(json_object_get(w, "rank")) == rank) {
            return w;
        }
    }
    return NULL;
}

double zps_mlog_num(const json_t *rec, const char *key)
{
    return json_number_value(json_object_get(rec, key));
}
