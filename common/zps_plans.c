/* zps_plans.c - the plan history shared by the coordinator, shards and workers. */
#include "zps_plans.h"

#include <string.h>

void zps_plans_init(zps_plans *p)
{
    memset(p, 0, sizeof *p);
}

void zps_plans_fini(zps_plans *p)
{
    for (int i = 0; i < ZPS_PLANS_MAX; i++) {
        zps_plan_fini(&p->gens[i].plan);
    }
    p->n = 0;
    p->n_handed = 0;
}

// Drops generations [from, from + k): their plans freed, the later ones
// moved down (a moved generation's slices move with it).
static void s_drop(zps_plans *p, int from, int k)
{
    for (int i = from; i < from + k; i++) {
        zps_plan_fini(&p->gens[i].plan);
    }
    memmove(&p->gens[from], &p->gens[from + k], (size_t)(p->n - from - k) * sizeof p->gens[0]);
    p->n -= k;
    memset(&p->gens[p->n], 0, (size_t)k * sizeof p->gens[0]); // no slices owned twice
}

zps_err zps_plans_add(zps_plans *p, uint32_t gen, uint64_t effective, const zps_plan *plan)
{
    if (gen == 0 || gen <= zps_plans_newest_gen(p)) {
        return ZPS_EDUP;
    }
    zps_plan copy = {0};
    if (zps_plan_copy(&copy, plan) != ZPS_OK) {
        return ZPS_ENOMEM;
    }
    // Superseded at every step they were to hold for: never in force now.
    while (p->n > 0 && p->gens[p->n - 1].effective >= effective) {
        s_drop(p, p->n - 1, 1);
    }
    if (p->n == ZPS_PLANS_MAX) {
        s_drop(p, 0, 1);
    }
    zps_plan_gen *g = &p->gens[p->n++];
    g->gen = gen;
    g->effective = effective;
    g->plan = copy; // the copy's slices move here
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
        s_drop(p, 0, keep_from);
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

bool zps_plans_names(const zps_plans *p, uint64_t member_id, uint32_t rank)
{
    if (member_id == 0) {
        return false; // a worker's copy of a plan names only its own id
    }
    for (int i = p->n - 1; i >= 0; i--) {
        const zps_plan_slice *sl = zps_plan_find(&p->gens[i].plan, rank);
        if (sl && sl->member_id == member_id) {
            return true;
        }
    }
    return false;
}
