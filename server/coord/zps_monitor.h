/* zps_monitor.h - who holds a step back, measured on shard 0's own clock.
 *
 * Each push is timestamped on arrival; a rank's lag in a step is when its
 * last push of the step arrived, minus the step's first arrival, so host
 * clocks never matter. The last ZPS_MONITOR_WINDOW steps of every rank are
 * kept (a ring): lag, compute time and samples, from which the monitor
 * flags stragglers and estimates each rank's throughput. */
#ifndef ZPS_MONITOR_H
#define ZPS_MONITOR_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/zps_plan.h"

#define ZPS_MONITOR_WINDOW 32

typedef struct zps_monitor zps_monitor;

typedef struct zps_monitor_view {
    float lag_ms;         // last complete step
    float compute_ms;     // mean over the window
    double samples_per_s; // throughput over the window (0 if unknown)
    bool straggler;       // lagging in most recent steps
    // Diloco, of the last complete round (0 in a synchronous job):
    uint32_t inner_steps; // its inner steps
    float delta_norm;     // the norm of its pseudo-gradient
    uint64_t bytes;       // payload bytes it pushed
} zps_monitor_view;

// Caller owns the result; NULL on failure.
zps_monitor *zps_monitor_new(void);
void zps_monitor_destroy(zps_monitor **m);

// A push of `rank` for `step` arrived at now_ms; compute_ms and samples are
// what the worker reported for the slice.
void zps_monitor_push(zps_monitor *m, uint64_t step, uint32_t rank, uint32_t samples,
                      float compute_ms, double now_ms);
// Diloco: what the worker of `rank` reported of round `step` with its
// pushes (call after zps_monitor_push of them): throughput then counts
// samples times inner steps.
// (fragment: the one its pushes carried, -1 without fragments; in the
// metrics log when >= 0.)
void zps_monitor_round(zps_monitor *m, uint64_t step, uint32_t rank, uint32_t inner_steps,
                       float delta_norm, uint64_t bytes, int fragment);
// The step completed after step_ms: closes its record for every rank that
// pushed, updates the straggler flags (logging each change) and, with
// metrics, writes the step's per-worker record ("workers":[...]).
void zps_monitor_step_done(zps_monitor *m, uint64_t step, double step_ms, FILE *json);

bool zps_monitor_view_of(const zps_monitor *m, uint32_t rank, zps_monitor_view *out);
// Median and 95th percentile of the window's step times (0 before any).
double zps_monitor_step_quantile(const zps_monitor *m, double q);

#endif
