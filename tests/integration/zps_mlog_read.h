/* zps_mlog_read.h - a JSON-lines file (the metrics log of --metrics-log,
 * or a --log-json log) read back whole for the integration tests, so that
 * no test parses one by hand: one record a line, a step record per step. */
#ifndef ZPS_MLOG_READ_H
#define ZPS_MLOG_READ_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "zps_proc.h"

// Every line of the file at path, in order, as a JSON array of objects (the
// caller json_decrefs it); fails the test if the file is missing or a line
// is not a JSON object.
json_t *zps_mlog_read(const char *path);
// zps_mlog_read of a file under the scratch directory.
json_t *zps_procs_mlog(const zps_procs *ps, const char *name);

// True if rec is a step record ({"step": n, ...}); *step gets n.
bool zps_mlog_step(const json_t *rec, uint64_t *step);
// The entry of rank in rec's "workers" array, or NULL.
json_t *zps_mlog_worker(const json_t *rec, int rank);
// rec's number under key (integer or real); 0 if it has none.
double zps_mlog_num(const json_t *rec, const char *key);

#endif
