/* zps_schedule.c - plans by generation, and extra slices, for one worker. */
#include "zps_schedule.h"

#include <string.h>

void zps_schedule_init(zps_schedule *s, uint32_t rank)
{
    zps_plans_fini(&s->plans);
    memset(s, 0, sizeof *s);
    s->rank = rank;
}

void zps_schedule_fini(zps_schedule *s)
{
    zps_plans_fini(&s->plans);
}

void zps_schedule_add_plan(zps_schedule *s, uint32_t gen, uint64_t effective_step,
                           const zps_plan *plan)
{
    (void)zps_plans_add(&s->plans, gen, effective_step, plan); // an older one is ignored
}

void zps_schedule_add_extra(zps_schedule *s, uint64_t step, zps_piece work)
{
    if (!zps_plans_handed_at(&s->plans, step, work.offset)) {
        zps_plans_handed h = {.step = step, .offset = work.offset, .count = work.count,
                              .gen = work.gen, .rank = s->rank};
        (void)zps_plans_hand(&s->plans, &h); // a full table drops it: another computes it
    }
}

int zps_schedule_take(zps_schedule *s, uint64_t step, zps_piece *out, int max)
{
    int n = 0;
    const zps_plan_gen *g = zps_plans_at(&s->plans, step);
    const zps_plan_slice *mine = g ? zps_plan_find(&g->plan, s->rank) : NULL;
    if (mine && n < max) {
        out[n++] = (zps_piece){.offset = mine->offset, .count = mine->count, .gen = g->gen};
    }
    return n + zps_schedule_take_extras(s, step, out + n, max - n);
}

int zps_schedule_take_extras(zps_schedule *s, uint64_t step, zps_piece *out, int max)
{
    zps_plans_handed h[ZPS_PLANS_HANDED_MAX];
    int n = zps_plans_take_handed(&s->plans, step, h,
                                  max < ZPS_PLANS_HANDED_MAX ? max : ZPS_PLANS_HANDED_MAX);
    for (int i = 0; i < n; i++) {
        out[i] = (zps_piece){.offset = h[i].offset, .count = h[i].count, .gen = h[i].gen,
                             .extra = true};
    }
    return n;
}

void zps_schedule_forget_before(zps_schedule *s, uint64_t step)
{
    if (step == UINT64_MAX) {
        zps_plans_clear_handed(&s->plans); // the run is over: the plans stay for the last step
    } else {
        zps_plans_forget_before(&s->plans, step);
    }
}
