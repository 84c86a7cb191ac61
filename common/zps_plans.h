/* zps_plans.h - the plan history: which plan generation is in force at a step.
 *
 * The coordinator makes plans in generations, each in force from a step
 * on; the coordinator, every shard and every worker keep the same history
 * (this one module) and ask it the same question: which plan holds at step
 * S, the step in progress, not the newest one, which may only hold from the
 * next step. A generation is kept while a step that may still be computed
 * uses it, and dropped once a newer generation is in force at the oldest
 * such step; a generation is never pushed out by newer ones piling up for
 * a later step (the fixed-slot history that did so lost the plan of the
 * step in progress, and that step then waited forever). Beside the
 * generations it keeps the slices of steps in progress handed to another
 * member than their owner: the coordinator's record of whom it handed
 * them to, and a worker's of what it was handed. */
#ifndef ZPS_PLANS_H
#define ZPS_PLANS_H

#include <stdbool.h>
#include <stdint.h>

#include "zps_err.h"
#include "zps_plan.h"

// Generations kept at most. A step boundary makes at most one (re-plans
// are coalesced), and steps in progress span two or three steps, so this
// is room to spare; past it the oldest goes.
#define ZPS_PLANS_MAX 8

typedef struct zps_plan_gen {
    uint32_t gen;       // generation number, 1 for the job's first plan
    uint64_t effective; // first step it holds for
    zps_plan plan;      // members and slices
} zps_plan_gen;

// Slices of steps in progress handed over at most: a slice is handed once
// per step (a second hand-over replaces the first), and steps in progress
// span two or three.
#define ZPS_PLANS_HANDED_MAX 64

// A slice of a step in progress that a member other than its owner in the
// plan computes (the owner left, or was late): who computes it now. The
// coordinator hands them; a worker keeps those handed to it until it
// computes them.
typedef struct zps_plans_handed {
    uint64_t step;
    uint32_t offset, count; // [offset, offset + count) of the global batch
    uint32_t gen;           // generation in force at that step
    uint32_t rank;          // who computes it now
} zps_plans_handed;

typedef struct zps_plans {
    zps_plan_gen gens[ZPS_PLANS_MAX]; // by effective step, oldest first
    int n;                            // generations kept
    zps_plans_handed handed[ZPS_PLANS_HANDED_MAX]; // in no order
    int n_handed;
} zps_plans;

void zps_plans_init(zps_plans *p);
// Frees every generation's plan; the history is empty after.
void zps_plans_fini(zps_plans *p);

// Records a copy of generation gen, in force from `effective` on. Generations are
// numbered in the order the coordinator makes them: one not newer than the
// newest known is ignored (ZPS_EDUP). The new one supersedes every kept
// generation that takes effect at or after `effective` (a rollback to an
// earlier step, or a re-plan of the same step): those are dropped.
// ZPS_ENOMEM (nothing changed) if the copy cannot be made.
zps_err zps_plans_add(zps_plans *p, uint32_t gen, uint64_t effective, const zps_plan *plan);

// The generation in force at `step` (the newest one in effect by then), or
// NULL if none is known; borrowed until the next add or forget.
const zps_plan_gen *zps_plans_at(const zps_plans *p, uint64_t step);
// The newest generation, or NULL.
const zps_plan_gen *zps_plans_newest(const zps_plans *p);
// The newest generation's number, 0 before the first.
uint32_t zps_plans_newest_gen(const zps_plans *p);

// Forgets what no step from `step` on can use: every generation older
// than the one in force at `step`, and the slices handed of steps before it.
void zps_plans_forget_before(zps_plans *p, uint64_t step);

// Records that the slice at h->offset of h->step goes to h->rank, in place
// of whoever it went to before. ZPS_ERANGE if the table is full.
zps_err zps_plans_hand(zps_plans *p, const zps_plans_handed *h);
// The slice of `step` at `offset` as handed, or NULL if it was not.
const zps_plans_handed *zps_plans_handed_at(const zps_plans *p, uint64_t step, uint32_t offset);
// Takes the slices of `step` handed out of the table, at most max, into
// out; returns how many.
int zps_plans_take_handed(zps_plans *p, uint64_t step, zps_plans_handed *out, int max);
// The samples of `step` handed to `rank`.
uint64_t zps_plans_handed_load(const zps_plans *p, uint64_t step, uint32_t rank);
// Forgets the slices handed of steps before `step` (computed by now).
void zps_plans_forget_handed_before(zps_plans *p, uint64_t step);
// Forgets every slice handed (a rollback replays from a new plan).
void zps_plans_clear_handed(zps_plans *p);

// Whether a kept generation names member_id at rank (a member keeps its
// rank for as long as it is one): a search by rank, not a scan of members.
bool zps_plans_names(const zps_plans *p, uint64_t member_id, uint32_t rank);

#endif
