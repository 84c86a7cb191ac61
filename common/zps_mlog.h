/* zps_mlog.h - the metrics log's format (--metrics-log), described once.
 *
 * One JSON object a line: a record per step and one per complete
 * evaluation. The server writes them (the step in server/coord/zps_coord_render.c,
 * the workers' rows in server/coord/zps_monitor.c, the evaluation in
 * server/coord/zps_eval.c) and zps-ctl report reads them (ctl/zps_report.c), each
 * key through this table, so that writer and reader cannot disagree on a
 * name. A step record:
 *
 *   {"step":S,"epoch":E,"loss":L,"samples":N,"step_ms":T,"plan":G,"replans":R,
 *    ["grad_norm":X,] "counted":[[rank,n],...],
 *    "workers":[{"rank":r,"lag_ms":x,"compute_ms":y,"samples":n},...]}
 * (a diloco round's rows add "inner_steps", "inner_samples", "delta_norm",
 * "bytes")
 *
 * and an evaluation: {"epoch":E,"test_accuracy":A,"test_loss":L}. */
#ifndef ZPS_MLOG_H
#define ZPS_MLOG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef enum zps_mlog_key {
    ZPS_MLOG_STEP,          // step record: its step (an evaluation has none)
    ZPS_MLOG_EPOCH,         // both: the epoch
    ZPS_MLOG_LOSS,          // step: mean training loss
    ZPS_MLOG_SAMPLES,       // step: samples counted; worker row: its samples
    ZPS_MLOG_STEP_MS,       // step: its time on shard 0
    ZPS_MLOG_PLAN,          // step: the plan generation in force
    ZPS_MLOG_REPLANS,       // step: re-plans so far
    ZPS_MLOG_COUNTED,       // step: [[rank, samples counted from it], ...]
    ZPS_MLOG_WORKERS,       // step: the workers' rows
    ZPS_MLOG_RANK,          // worker row
    ZPS_MLOG_LAG_MS,        // worker row: behind the step's first arrival
    ZPS_MLOG_COMPUTE_MS,    // worker row
    ZPS_MLOG_TEST_ACCURACY, // evaluation
    ZPS_MLOG_TEST_LOSS,     // evaluation
    ZPS_MLOG_INNER_STEPS,   // worker row, diloco: its inner steps of the round
    ZPS_MLOG_INNER_SAMPLES, // worker row, diloco: the samples they trained
    ZPS_MLOG_DELTA_NORM,    // worker row, diloco: the norm of its pseudo-gradient
    ZPS_MLOG_BYTES,         // worker row, diloco: payload bytes it pushed in the round
    ZPS_MLOG_GRAD_NORM,     // step, --clip-grad-norm: the global gradient norm, before clipping
    ZPS_MLOG_FRAGMENT,      // worker row, diloco --fragments: the fragment its pushes carried
    ZPS_MLOG_N_KEYS
} zps_mlog_key;

// The key's name in the JSON objects.
const char *zps_mlog_name(zps_mlog_key k);

// Writers of one member of an object: `"name":value`, after a comma
// unless it is the object's first.
void zps_mlog_uint(FILE *f, bool first, zps_mlog_key k, uint64_t v);
// A real with `decimals` digits after the point.
void zps_mlog_real(FILE *f, bool first, zps_mlog_key k, double v, int decimals);
// `"name":` only, for an array the caller writes.
void zps_mlog_key_only(FILE *f, bool first, zps_mlog_key k);

#endif
