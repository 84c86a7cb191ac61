/* zps_plans.c - the plan history shared by the coordinator, shards and workers. */
#include "zps_plans.h"

#include <string.h>

void zps_plans_init(zps_plans *p)
{
    p->n = 0;
    p->n_handed = 0;
}

zps_err zps_plans_add(zps_plans *p, uint32_t gen, uint64_t effective, const zps_plan *plan)
{
    if (gen == 0 || gen <= zps_plans_newest_gen(p)) {
        return ZPS_EDUP;
    }
    // Superseded at every step they were to hold for: never in force now.
    while (p->n > 0 && p->gens[p->n - 1].effective >= effective) {
        p->n--;
    }
    if (p->n == ZPS_PLANS_MAX) {
        memmove(&p->gens[0], &p->gens[1], (ZPS_PLANS_MAX - 1) * sizeof p->gens[0]);
        p->n--;
    }
    zps_plan_gen *g = &p->gens[p->n++];
    g->gen = gen;
    g->effective = effective;
    g->plan = *plan;
    return ZPS_OK;
}

// Kept generations are in effective order and, the later added the newer,
// in generation order too: the last one in effect by `step` is in force.
const zps_plan_gen *zps_plans_at(const zps_plans *p, uint64_t step)
{
    for (int i = p->n - 1; i >= 0; i--) {
        if (p->gens[i].effective <= step) {
            return &p->gens[i];
        }
    }
    return NULL;
}

const zps_plan_gen *zps_plans_newest(const zps_plans *p)
{
    return p->n > 0 ? &p->gens[p->n - 1] : NULL;
}

uint32_t zps_plans_newest_gen(const zps_plans *p)
{
    return p->n > 0 ? p->gens[p->n - 1].gen : 0;
}

void zps_plans_forget_before(zps_plans *p, uint64_t step)
{
    int keep_from = 0;
    for (int i = 0; i < p->n; i++) {
        if (p->gens[i].effective <= step) {
            keep_from = i;
        }
    }
    if (keep_from > 0) {
        memmove(&p->gens[0], &p->gens[keep_from], (size_t)(p->n - keep_from) * sizeof p->gens[0]);
        p->n -= keep_from;
    }
    zps_plans_forget_handed_before(p, step);
}

void zps_plans_forget_handed_before(zps_plans *p, uint64_t step)
{
    for (int i = 0; i < p->n_handed;) {
        if (p->handed[i].step < step) {
            p->handed[i] = p->handed[--p->n_handed];
        } else {
            i++;
        }
    }
}

zps_err zps_plans_hand(zps_plans *p, const zps_plans_handed *h)
{
    zps_plans_handed *old = (zps_plans_handed *)zps_plans_handed_at(p, h->step, h->offset);
    if (!old && p->n_handed == ZPS_PLANS_HANDED_MAX) {
        return ZPS_ERANGE;
    }
    *(old ? old : &p->handed[p->n_handed++]) = *h;
    return ZPS_OK;
}

const zps_plans_handed *zps_plans_handed_at(const zps_plans *p, uint64_t step, uint32_t offset)
{
    for (int i = 0; i < p->n_handed; i++) {
        if (p->handed[i].step == step && p->handed[i].offset == offset) {
            return &p->handed[i];
        }
    }
    return NULL;
}

int zps_plans_take_handed(zps_plans *p, uint64_t step, zps_plans_handed *out, int max)
{
    int n = 0;
    for (int i = 0; i < p->n_handed;) {
        if (p->handed[i].step == step && n < max) {
            out[n++] = p->handed[i];
            p->handed[i] = p->handed[--p->n_handed];
        } else {
            i++;
        }
    }
    return n;
}

uint64_t zps_plans_handed_load(const zps_plans *p, uint64_t step, uint32_t rank)
{
    uint64_t load = 0;
    for (int i = 0; i < p->n_handed; i++) {
        load += p->handed[i].step == step && p->handed[i].rank == rank ? p->handed[i].count : 0;
    }
    return load;
}

void zps_plans_clear_handed(zps_plans *p)
{
    p->n_handed = 0;
}

bool zps_plans_find_member(const zps_plans *p, uint64_t member_id, uint32_t *rank)
{
    if (member_id == 0) {
        return false; // a worker's copy of a plan names only its own id
    }
    for (int i = p->n - 1; i >= 0; i--) {
        const zps_plan *plan = &p->gens[i].plan;
        for (uint32_t k = 0; k < plan->n; k++) {
            if (plan->slices[k].member_id == member_id) {
                *rank = plan->slices[k].rank;
                return true;
            }
        }
    }
    return false;
}
