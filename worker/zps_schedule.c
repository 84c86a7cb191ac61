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
    int slot = 0;
    for (int i = 0; i < ZPS_SCHEDULE_PLANS; i++) {
        if (s->plans[i].gen >= gen && s->plans[i].gen != 0) {
            return;
        }
        if (s->plans[i].gen < s->plans[slot].gen) {
            slot = i;
        }
    }
    zps_schedule_plan *p = &s->plans[slot];
    *p = (zps_schedule_plan){.gen = gen, .effective = effective_step, .n = plan->n,
                             .position = -1};
    for (uint32_t i = 0; i < plan->n; i++) {
        if (plan->slices[i].rank == s->rank) {
            p->position = (int)i;
            p->mine = plan->slices[i];
        }
    }
}

void zps_schedule_add_extra(zps_schedule *s, uint64_t step, zps_work work)
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

static const zps_schedule_plan *s_plan_at(const zps_schedule *s, uint64_t step)
{
    const zps_schedule_plan *best = NULL;
    for (int i = 0; i < ZPS_SCHEDULE_PLANS; i++) {
        const zps_schedule_plan *p = &s->plans[i];
        if (p->gen != 0 && p->effective <= step && (!best || p->gen > best->gen)) {
            best = p;
        }
    }
    return best;
}

int zps_schedule_take(zps_schedule *s, uint64_t step, zps_work *out, int max)
{
    int n = 0;
    const zps_schedule_plan *p = s_plan_at(s, step);
    if (p && p->position >= 0 && n < max) {
        out[n++] = (zps_work){.offset = p->mine.offset, .count = p->mine.count, .gen = p->gen};
    }
    return n + zps_schedule_take_extras(s, step, out + n, max - n);
}

int zps_schedule_take_extras(zps_schedule *s, uint64_t step, zps_work *out, int max)
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
    for (int i = 0; i < s->n_extras;) {
        if (s->extras[i].step < step) {
            s->extras[i] = s->extras[--s->n_extras];
        } else {
            i++;
        }
    }
}
