/* zps_schedule.h - what this worker computes at each step.
 *
 * The coordinator's plans come in generations, each in force from a step
 * on; besides its own slice, a worker may be handed slices of a step in
 * progress whose owner left ("extras"). The schedule answers, for a step,
 * which slices to compute and which generation their pushes carry. */
#ifndef ZPS_SCHEDULE_H
#define ZPS_SCHEDULE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/zps_plan.h"
#include "common/zps_plans.h"

// One slice to compute, and the generation its pushes carry.
typedef struct zps_piece {
    uint32_t offset, count; // [offset, offset + count) of the global batch
    uint32_t gen;           // plan generation in force at its step
    bool extra;             // handed to this worker (another's slice, or one to compute
                            // again): pushed by it alone, never through its host's leader
} zps_piece;

typedef struct zps_schedule {
    uint32_t rank;   // this worker's rank
    zps_plans plans; // generations still in use, and the slices handed to it not yet computed
} zps_schedule;

// On zeroed memory, or a schedule in use: its plans are freed first.
void zps_schedule_init(zps_schedule *s, uint32_t rank);
// Frees the plans; safe on zeroed memory and twice.
void zps_schedule_fini(zps_schedule *s);
// Records plan generation `gen`, in force from effective_step on; older
// generations than the newest known are ignored.
void zps_schedule_add_plan(zps_schedule *s, uint32_t gen, uint64_t effective_step,
                           const zps_plan *plan);
// Records a slice of `step` handed to this worker (ignored if already known).
void zps_schedule_add_extra(zps_schedule *s, uint64_t step, zps_piece work);
// The slices to compute at `step` (own slice first, then extras), at most
// max; removes the extras it returns.
int zps_schedule_take(zps_schedule *s, uint64_t step, zps_piece *out, int max);
// Only the extras of `step` (a plan arriving mid-step adds work to the
// step, never repeats the own slice already pushed).
int zps_schedule_take_extras(zps_schedule *s, uint64_t step, zps_piece *out, int max);
// Drops extras of steps before `step` (they were completed by others), and
// the plans no step from `step` on uses.
void zps_schedule_forget_before(zps_schedule *s, uint64_t step);

#endif
