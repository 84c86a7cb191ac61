/* zps_schedule.c - plans by generation, and extra slices, for one worker. */
#include "zps_schedule.h"

#include <string.h>

void zps_schedule_init(zps_schedule *s, uint32_t rank)
{
    memset(s, 0, sizeof *s);
    s->rank = rank;
}

void zps_schedule_add_plan(zps_schedule *s, uint32_t gen, uint64_t effective_step,
                           const zps_plan *plan)
{
    (void)zps_plans_add(&s->plans, gen, effective_step, plan); // an older one is ignored
}

void zps_schedule_add_extra(zps_schedule *s, uint64_t step, zps_piece work)
{
    for (int i = 0; i < s->n_extras; i++) {
        if (s->extras[i].step == step && s->extras[i].work.offset == work.offset) {
            return;
        }
    }
    if (s->n_extras < ZPS_SCHEDULE_EXTRAS) {
        s->extras[s->n_extras].step = step;
        s->extras[s->n_extras].work = work;
        s->n_extras++;
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
    int n = 0;
    for (int i = 0; i < s->n_extras;) {
        if (s->extras[i].step == step && n < max) {
            out[n++] = s->extras[i].work;
            s->extras[i] = s->extras[--s->n_extras];
        } else {
            i++;
        }
    }
    return n;
}

void zps_schedule_forget_before(zps_schedule *s, uint64_t step)
{
    if (step != UINT64_MAX) {
        zps_plans_forget_before(&s->plans, step);
    }
    for (int i = 0; i < s->n_extras;) {
        if (s->extras[i].step < step) {
            s->extras[i] = s->extras[--s->n_extras];
        } else {
            i++;
        }
    }
}
