/* zps_coord_policy.c - the straggler policy: adaptive split and speculation. */
#include "zps_coord_int.h"

#include <math.h>

#include "common/zps_dyl.h"

// ---------------------------------------------------------------------------
// Adaptive split and speculation.

#define ZPS_COORD_ADAPT_EVERY 20   // steps between looks at the split
#define ZPS_COORD_ADAPT_GAIN 0.9   // replan only if the step gets this much shorter
#define ZPS_COORD_DYL_EVERY 2      // diloco rounds between looks at the inner steps

double zps_coord_median_step_ms(const zps_coord *c)
{
    return zps_monitor_step_quantile(c->mon, 0.5);
}

// Integer shares of B in proportion to w[0..n), each at least 1, summing
// to B exactly (largest remainders get the leftovers).
static void s_proportional(uint32_t B, const double *w, uint32_t n, uint32_t *out)
{
    double total = 0;
    for (uint32_t i = 0; i < n; i++) {
        total += w[i];
    }
    uint32_t given = 0;
    double rem[ZPS_MAX_MEMBERS];
    for (uint32_t i = 0; i < n; i++) {
        double exact = (double)(B - n) * w[i] / total;
        out[i] = 1 + (uint32_t)exact;
        rem[i] = exact - floor(exact);
        given += out[i];
    }
    while (given < B) {
        uint32_t best = 0;
        for (uint32_t i = 1; i < n; i++) {
            best = rem[i] > rem[best] ? i : best;
        }
        out[best]++;
        rem[best] = -1;
        given++;
    }
}

// --inner-steps auto: every few rounds (of F steps with --fragments), each
// member's inner steps from its measured speed, in inner steps per second
// (zps_dyl_steps: the fastest takes H); a member not measured yet takes H.
// A change re-plans at the next step's boundary, so a step's inner steps
// are fixed in its plan.
static void s_adapt_inner_steps(zps_coord *c)
{
    uint64_t every = (uint64_t)ZPS_COORD_DYL_EVERY * zps_outer_fragments(&c->cfg.mode);
    if (c->steps_done % every != 0) {
        return;
    }
    double speed[ZPS_MAX_MEMBERS];
    uint32_t idx[ZPS_MAX_MEMBERS], steps[ZPS_MAX_MEMBERS], n = 0;
    const zps_plan *plan = &zps_coord_newest(c)->plan;
    for (uint32_t i = 0; i < c->n_members; i++) {
        const zps_plan_slice *sl = zps_plan_find(plan, c->members[i].rank);
        if (!zps_member_planned(&c->members[i].life) || !sl) {
            continue;
        }
        zps_monitor_view v;
        bool measured = zps_monitor_view_of(c->mon, c->members[i].rank, &v) &&
                        v.samples_per_s > 0;
        speed[n] = measured ? v.samples_per_s / sl->count : 0; // inner steps per second
        idx[n++] = i;
    }
    if (n == 0 || zps_dyl_steps(c->cfg.mode.inner_steps, speed, n, steps) != ZPS_OK) {
        return;
    }
    bool changed = false;
    for (uint32_t k = 0; k < n; k++) {
        zps_coord_member *m = &c->members[idx[k]];
        uint32_t now = m->inner_steps ? m->inner_steps : c->cfg.mode.inner_steps;
        // Within a tenth of H the count stays: the speeds of shared cores
        // wander, and each change is a re-plan.
        uint32_t gap = steps[k] > now ? steps[k] - now : now - steps[k];
        if (10 * gap <= c->cfg.mode.inner_steps) {
            continue;
        }
        zps_log_info("inner steps auto: rank %u (%s) %u -> %u inner steps a round "
                     "(%.1f inner steps/s)", m->rank, m->host, now, steps[k], speed[k]);
        changed = true;
        m->inner_steps = steps[k];
    }
    if (changed) {
        zps_coord_note_change(c); // the plan with them comes at the next boundary
    }
}

void zps_coord_adapt(zps_coord *c)
{
    if (c->cfg.mode.auto_steps && c->state == ZPS_COORD_TRAINING && c->steps_done > 0) {
        s_adapt_inner_steps(c);
        return;
    }
    if (!c->cfg.adaptive_split || c->state != ZPS_COORD_TRAINING || c->steps_done == 0 ||
        c->steps_done % ZPS_COORD_ADAPT_EVERY != 0) {
        return;
    }
    double thr[ZPS_MAX_MEMBERS];
    uint32_t idx[ZPS_MAX_MEMBERS], n = 0, now_share[ZPS_MAX_MEMBERS], next[ZPS_MAX_MEMBERS];
    for (uint32_t i = 0; i < c->n_members; i++) {
        zps_monitor_view v;
        const zps_plan_slice *sl = zps_plan_find(&zps_coord_newest(c)->plan, c->members[i].rank);
        bool planned = zps_member_planned(&c->members[i].life);
        if (!planned || !sl || c->members[i].share ||
            !zps_monitor_view_of(c->mon, c->members[i].rank, &v) || v.samples_per_s <= 0) {
            if (planned && c->members[i].share == 0) {
                return; // a member without a measure yet: wait
            }
            continue;
        }
        thr[n] = v.samples_per_s;
        now_share[n] = sl->count;
        idx[n++] = i;
    }
    if (n < 2 || n != zps_coord_live_flexible(c)) {
        return;
    }
    uint32_t B = 0;
    for (uint32_t i = 0; i < n; i++) {
        B += now_share[i];
    }
    // --deterministic: shares in whole micro-batches (B is), each at least one.
    uint32_t unit = c->cfg.micro_batch ? c->cfg.micro_batch : 1;
    s_proportional(B / unit, thr, n, next);
    for (uint32_t i = 0; i < n; i++) {
        next[i] *= unit;
    }
    double t_now = 0, t_next = 0;
    for (uint32_t i = 0; i < n; i++) {
        t_now = fmax(t_now, now_share[i] / thr[i]);
        t_next = fmax(t_next, next[i] / thr[i]);
    }
    if (t_next > ZPS_COORD_ADAPT_GAIN * t_now) {
        return;
    }
    zps_log_info("adaptive split: predicted step %.2f -> %.2f ms; new shares by throughput%s",
                 t_now * 1e3, t_next * 1e3,
                 unit > 1 ? ", in whole micro-batches (--deterministic)" : "");
    for (uint32_t i = 0; i < n; i++) {
        c->members[idx[i]].adapted = next[i];
    }
    zps_coord_note_change(c); // the plan with the new shares comes at the next boundary
}

// Hands [offset, offset + count) of `step` to member `mem` as an extra of
// the plan it already has.
static void s_send_speculation(zps_coord *c, zps_outbox *out, const zps_plan_gen *g,
                               zps_coord_member *mem, uint64_t step, uint32_t offset,
                               uint32_t count)
{
    zps_plans_handed e = {.step = step, .offset = offset, .count = count, .gen = g->gen,
                          .rank = mem->rank};
    Zps__Extra wire;
    Zps__Extra *wp = &wire;
    zps_coord_extra_to_wire(&e, &wire);
    Zps__Slice own; // a member learns its own slice only
    Zps__Slice *ptrs[1];
    zps_coord_group_wire group;
    Zps__Plan p = ZPS__PLAN__INIT;
    p.host = zps_coord_host_group(c, g, mem, &group); // the same plan, the same group
    p.generation = g->gen; // the same plan: only the extra is new
    p.effective_step = g->effective;
    p.members = g->plan.n;
    p.n_slices = zps_coord_plan_to_wire(&g->plan, mem, &own, ptrs);
    p.slices = ptrs;
    p.n_extras = 1;
    p.extras = &wp;
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__PLAN);
    h.job_id = c->job_id;
    h.generation = g->gen;
    h.plan = &p;
    (void)zps_outbox_add(out, &mem->route, &h);
}

bool zps_coord_speculate(zps_coord *c, zps_outbox *out, uint64_t step, uint32_t offset,
                         uint32_t count, uint32_t late_rank, const bool *helper)
{
    const zps_plan_gen *g = zps_plans_at(&c->plans, step);
    if (!g) {
        return false;
    }
    // In pieces, one per helper: the copy is done sooner than by one
    // helper alone. The owner's own copy then no longer counts in a bucket
    // where a piece came first (the pieces must all come), which is the
    // price of not waiting for it.
    zps_coord_member *helpers[ZPS_MAX_MEMBERS];
    uint32_t k = 0;
    for (uint32_t i = 0; i < c->n_members; i++) {
        zps_coord_member *mem = &c->members[i];
        if (zps_coord_can_take(mem, step) && mem->rank != late_rank && helper[mem->rank]) {
            helpers[k++] = mem;
        }
    }
    // --deterministic: cut at whole micro-batches, as the slice is.
    uint32_t most = zps_plan_max_pieces(count, c->cfg.micro_batch);
    k = k < most ? k : most;
    for (uint32_t i = 0; i < k; i++) {
        uint32_t lo, hi;
        zps_plan_piece(offset, count, c->cfg.micro_batch, i, k, &lo, &hi);
        s_send_speculation(c, out, g, helpers[i], step, lo, hi - lo);
    }
    if (k > 0) {
        zps_log_info("step %llu: slice [%u, %u) of rank %u is late; also handed to %u "
                     "member(s), in pieces", (unsigned long long)step, offset, offset + count,
                     late_rank, k);
        // The late member, back, may skip that step: others compute it.
        for (uint32_t i = 0; i < c->n_members; i++) {
            if (c->members[i].rank == late_rank && c->members[i].covered < step + 1) {
                c->members[i].covered = step + 1;
            }
        }
    }
    return k > 0;
}
