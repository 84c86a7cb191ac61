/* zps_coord_plan.c - plans, handed-over slices and step boundaries. */
#include "zps_coord_int.h"

#include <string.h>

#include "common/zps_clock.h"
#include "common/zps_quant.h"
#include "common/zps_zcode.h"
#include "server/zps_token.h"

// ---------------------------------------------------------------------------
// Plans: generations (zps_plans), handed-over slices, step boundaries.
//
// Membership changes (joins, departures, an adapted split) during a step
// are gathered (c->pending) and take effect together in one new plan at
// the next step boundary: the moment shard 0 starts sending the next
// step's parameters (zps_coord_release). That PLAN goes out on shard 0's
// socket before any of those parameters, so every worker has it before it
// can begin the step, and no step in progress is re-split. The pieces of
// the steps in progress that lost their owner are handed over at once, to
// members that may compute those steps (zps_member_may_compute).

const zps_plan_gen *zps_coord_newest(const zps_coord *c)
{
    return zps_plans_newest(&c->plans);
}

uint32_t zps_coord_generation(const zps_coord *c, uint64_t *effective)
{
    const zps_plan_gen *g = zps_coord_newest(c);
    *effective = g ? g->effective : 0;
    return g ? g->gen : 0;
}

void zps_coord_extra_to_wire(const zps_plans_handed *e, Zps__Extra *w)
{
    zps__extra__init(w);
    w->step = e->step;
    w->rank = e->rank;
    w->offset = e->offset;
    w->count = e->count;
    w->generation = e->gen;
}

static void s_slice_to_wire(const zps_plan_slice *sl, Zps__Slice *w)
{
    zps__slice__init(w);
    w->rank = sl->rank;
    w->offset = sl->offset;
    w->count = sl->count;
    w->inner_steps = sl->inner_steps;
    w->member_id = sl->member_id;
}

size_t zps_coord_plan_to_wire(const zps_plan *plan, const zps_coord_member *only,
                              Zps__Slice *slices, Zps__Slice **ptrs)
{
    if (only) {
        // A worker computes its own slice only, and its id authenticates
        // its pushes: it learns no other. One slice, not the plan: a plan
        // to each of N members would make a re-plan cost N squared.
        const zps_plan_slice *sl = zps_plan_find(plan, only->rank);
        if (sl) {
            s_slice_to_wire(sl, &slices[0]);
            ptrs[0] = &slices[0];
        }
        return sl ? 1 : 0;
    }
    for (uint32_t i = 0; i < plan->n; i++) {
        s_slice_to_wire(&plan->slices[i], &slices[i]);
        ptrs[i] = &slices[i];
    }
    return plan->n;
}

// The shards' ranges and endpoints, as JOB and ASSIGN carry them.
static void s_shards_to_wire(const zps_coord *c, Zps__ShardInfo *shards, Zps__ShardInfo **ptrs)
{
    for (uint32_t i = 0; i < c->cfg.shards; i++) {
        zps__shard_info__init(&shards[i]);
        shards[i].index = i;
        shards[i].endpoint = (char *)c->shards[i].endpoint;
        shards[i].lo = c->shards[i].lo;
        shards[i].hi = c->shards[i].hi;
        shards[i].boot_id = (char *)c->shards[i].boot_id;
        ptrs[i] = &shards[i];
    }
}

static void s_optim_to_wire(const zps_optim_cfg *o, Zps__Optim *w)
{
    zps__optim__init(w);
    w->lr = o->lr;
    w->momentum = o->momentum;
    w->nesterov = o->nesterov;
    w->weight_decay = o->weight_decay;
    w->schedule = (uint32_t)o->schedule;
    w->warmup_steps = o->warmup_steps;
    w->kind = (uint32_t)o->kind;
    w->beta1 = o->beta1;
    w->beta2 = o->beta2;
    w->eps = o->eps;
    w->step_size = o->step_size;
    w->gamma = o->gamma;
}

static Zps__Outer s_mode_to_wire(const zps_outer_mode *m)
{
    Zps__Outer w = ZPS__OUTER__INIT;
    w.inner_steps = m->inner_steps;
    w.auto_steps = m->auto_steps;
    w.compress = (uint32_t)m->compress;
    w.fragments = zps_outer_fragments(m);
    w.overlap = m->overlap;
    return w;
}

// The handed-over slices member `mem` computes; their count.
static size_t s_extras_of(const zps_coord *c, const zps_coord_member *mem, Zps__Extra *extras,
                          Zps__Extra **ptrs)
{
    size_t n = 0;
    for (int i = 0; mem && i < c->plans.n_handed; i++) {
        if (c->plans.handed[i].rank == mem->rank) {
            zps_coord_extra_to_wire(&c->plans.handed[i], &extras[n]);
            ptrs[n] = &extras[n];
            n++;
        }
    }
    return n;
}

// The shards' public keys, which a worker's JOB carries (all: a worker's);
// returns keys.
static char **s_shard_keys(zps_coord *c, bool all, char **keys)
{
    for (uint32_t i = 0; all && i < c->cfg.shards; i++) {
        keys[i] = c->shards[i].public_key;
    }
    return keys;
}

// ms on the wire's 32 bits: a timeout past 49 days (a test's "never") says
// the most there is.
static uint32_t s_ms32(double ms)
{
    return ms < (double)UINT32_MAX ? (uint32_t)ms : UINT32_MAX;
}

// What every JOB and ASSIGN of the job says alike: its flags.
static void s_job_of_config(const zps_coord *c, Zps__Job *job)
{
    job->model = (char *)c->cfg.model;
    job->dataset = (char *)c->cfg.dataset;
    job->seed = c->cfg.seed;
    job->global_batch = c->cfg.global_batch;
    job->total_steps = c->cfg.total_steps;
    job->steps_per_epoch = c->cfg.steps_per_epoch;
    job->wire_dtype = (Zps__DType)c->cfg.wire_dtype;
    job->wire_code = c->cfg.wire_code ? ZPS_ZCODE_PLANES : ZPS_ZCODE_NONE;
    job->checkpoint_every = c->cfg.checkpoint_every;
    job->micro_batch = c->cfg.micro_batch;
    job->layout = (Zps__Layout *)c->cfg.layout;
}

// JOB to a worker (its rank and id, and the step it starts at) or ASSIGN
// to a shard (every id, and the optimizer): the same Job message, told
// apart by `to_shard`.
void zps_coord_send_job(zps_coord *c, zps_outbox *out, zmq_msg_t *route, Zps__MsgType type,
                        zps_coord_member *mem, uint64_t shard_token)
{
    const zps_plan_gen *g = zps_coord_newest(c);
    Zps__Slice slices[ZPS_MAX_MEMBERS];
    Zps__Slice *slice_ptrs[ZPS_MAX_MEMBERS];
    size_t n_slices = zps_coord_plan_to_wire(&g->plan, mem, slices, slice_ptrs);
    Zps__ShardInfo shards[ZPS_MAX_SHARDS];
    Zps__ShardInfo *shard_ptrs[ZPS_MAX_SHARDS];
    s_shards_to_wire(c, shards, shard_ptrs);
    Zps__Optim optim, inner;
    s_optim_to_wire(&c->cfg.optim, &optim);
    s_optim_to_wire(&c->cfg.inner, &inner);
    Zps__Outer outer = s_mode_to_wire(&c->cfg.mode);
    Zps__Extra extras[ZPS_PLANS_HANDED_MAX];
    Zps__Extra *extra_ptrs[ZPS_PLANS_HANDED_MAX];
    char *keys[ZPS_MAX_SHARDS];
    zps_coord_group_wire group;
    Zps__Job job = ZPS__JOB__INIT;
    s_job_of_config(c, &job);
    job.host = zps_coord_host_group(c, g, mem, &group);
    job.rank = mem ? mem->rank : 0;
    job.member_id = mem ? mem->member_id : 0;
    job.n_plan = n_slices;
    job.plan = slice_ptrs;
    job.n_shards = c->cfg.shards;
    job.shards = shard_ptrs;
    job.n_extras = s_extras_of(c, mem, extras, extra_ptrs);
    job.extras = extra_ptrs;
    job.generation = g->gen;
    job.plan_effective = g->effective;
    job.start_step = mem ? mem->life.from : g->effective; // the step it is active from
    job.optim = mem ? NULL : &optim;
    job.outer = c->cfg.mode.diloco ? &outer : NULL;
    job.inner = c->cfg.mode.diloco && mem ? &inner : NULL;
    job.clip_grad_norm = mem ? 0.0f : c->cfg.clip_grad_norm;
    job.worker_timeout_ms = mem ? s_ms32(c->cfg.worker_timeout_ms) : 0;
    job.shard_token = shard_token;
    job.n_shard_keys = mem ? c->cfg.shards : 0;
    job.shard_keys = s_shard_keys(c, mem != NULL, keys);
    // Rank 0 exists only at a first start (a resumed job's joiners come
    // after its members): its values are the job's initial ones.
    job.send_init = c->cfg.layout && mem && mem->rank == 0;
    Zps__Header h;
    zps_wire_header_init(&h, type);
    h.job_id = c->job_id;
    h.job = &job;
    if (mem) {
        mem->has_job = true;
        mem->last_seen_ms = zps_coord_now(c); // its heartbeats start once it has the job
    }
    if (zps_outbox_add(out, route, &h) != ZPS_OK) {
        zps_log_error("could not queue the job for %s", mem ? mem->host : "a shard");
    }
}

void zps_coord_start_workers(zps_coord *c, zps_outbox *out)
{
    c->state = ZPS_COORD_TRAINING;
    c->started_ms = zps_coord_now(c);
    c->started_step = 0;
    c->job_started_unix_ms = zps_clock_wall_ms();
    c->starts = 1;
    c->next_log_ms = c->started_ms + ZPS_COORD_PROGRESS_MS;
    for (uint32_t i = 0; i < c->n_members; i++) {
        zps_coord_send_job(c, out, &c->members[i].route, ZPS__MSG_TYPE__JOB, &c->members[i], 0);
    }
    zps_log_info("job %016llx: %u workers, %u shards, %llu steps (%llu per epoch), model %s, "
                 "wire %s%s",
                 (unsigned long long)c->job_id, c->n_members, c->cfg.shards,
                 (unsigned long long)c->cfg.total_steps,
                 (unsigned long long)c->cfg.steps_per_epoch, c->cfg.model,
                 zps_dtype_name(c->cfg.wire_dtype), c->cfg.wire_code ? ", coded (zstd)" : "");
    if (c->cfg.micro_batch > 0) {
        zps_log_info("deterministic: each step is %u micro-batches of %u, summed in one "
                     "canonical order whoever computes them",
                     c->cfg.global_batch / c->cfg.micro_batch, c->cfg.micro_batch);
    }
    if (c->cfg.mode.diloco) {
        uint32_t f = zps_outer_fragments(&c->cfg.mode);
        zps_log_info("mode diloco: a round is %s%u inner steps of the workers' own optimizer "
                     "in %u step(s), one fragment exchanged each%s; pseudo-gradients %s, outer "
                     "Nesterov lr %g momentum %g",
                     c->cfg.mode.auto_steps ? "at most " : "", c->cfg.mode.inner_steps, f,
                     c->cfg.mode.overlap ? ", merged one step later (overlap)" : "",
                     c->cfg.mode.compress ? zps_quant_name(c->cfg.mode.compress) : "fp32",
                     (double)c->cfg.mode.outer.lr, (double)c->cfg.mode.outer.momentum);
    }
}

// A plan over the members of the next plan (joining and active) in rank
// order: fixed shares where they still fit, the rest split evenly (in
// whole micro-batches under --deterministic).
zps_err zps_coord_make_plan(zps_coord *c, zps_plan *out)
{
    uint32_t shares[ZPS_MAX_MEMBERS] = {0}, live[ZPS_MAX_MEMBERS] = {0}, n = 0;
    uint64_t adapted = 0;
    for (uint32_t i = 0; i < c->n_members; i++) {
        if (zps_member_planned(&c->members[i].life)) {
            live[n] = i;
            adapted += c->members[i].adapted;
            shares[n++] = c->members[i].share;
        }
    }
    // An adaptive split holds only while it covers exactly the live members.
    bool use_adapted = adapted == c->cfg.global_batch;
    for (uint32_t i = 0; use_adapted && i < n; i++) {
        use_adapted = c->members[live[i]].adapted > 0;
    }
    for (uint32_t i = 0; use_adapted && i < n; i++) {
        shares[i] = c->members[live[i]].adapted;
    }
    char why[256];
    uint32_t m = c->cfg.micro_batch; // --deterministic: every share whole micro-batches
    zps_err err = zps_plan_split_micro(c->cfg.global_batch, m, shares, n, out, why, sizeof why);
    if (err != ZPS_OK && n > 0) {
        zps_log_warn("fixed shares no longer fit (%s); splitting the batch evenly", why);
        memset(shares, 0, sizeof shares);
        err = zps_plan_split_micro(c->cfg.global_batch, m, shares, n, out, why, sizeof why);
    }
    if (err != ZPS_OK) {
        if (n > 0) {
            zps_log_error("cannot plan the job: %s", why);
        }
        return err;
    }
    for (uint32_t i = 0; i < n; i++) {
        out->slices[i].rank = c->members[live[i]].rank;
        out->slices[i].member_id = c->members[live[i]].member_id;
        out->slices[i].inner_steps = c->cfg.mode.auto_steps ? c->members[live[i]].inner_steps : 0;
    }
    return ZPS_OK;
}

uint32_t zps_coord_live_flexible(const zps_coord *c)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < c->n_members; i++) {
        n += zps_member_planned(&c->members[i].life) && c->members[i].share == 0;
    }
    return n;
}

uint32_t zps_coord_live_members(const zps_coord *c)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < c->n_members; i++) {
        n += zps_member_planned(&c->members[i].life);
    }
    return n;
}

uint64_t zps_coord_global_done(const zps_coord *c)
{
    uint64_t done = c->shard_done[0];
    for (uint32_t i = 1; i < c->cfg.shards; i++) {
        done = c->shard_done[i] < done ? c->shard_done[i] : done;
    }
    return done;
}

// Whether a member can be handed work of `step` now: active by then, and
// reachable.
bool zps_coord_can_take(const zps_coord_member *mem, uint64_t step)
{
    return zps_member_may_compute(&mem->life, step) && mem->route_known;
}

// Of the members that can take work of `step`, the one with the least
// work at that step (its slice of the plan in force, and its extras).
static int s_least_loaded(const zps_coord *c, uint64_t step, const zps_plan *plan)
{
    int best = -1;
    uint64_t best_load = UINT64_MAX;
    for (uint32_t i = 0; i < c->n_members; i++) {
        if (!zps_coord_can_take(&c->members[i], step)) {
            continue;
        }
        const zps_plan_slice *sl = zps_plan_find(plan, c->members[i].rank);
        uint64_t load = (sl ? sl->count : 0) +
                        zps_plans_handed_load(&c->plans, step, c->members[i].rank);
        if (load < best_load) {
            best = (int)i;
            best_load = load;
        }
    }
    return best;
}

// Nobody here can compute the stuck `step`: a joining member becomes
// active from it (it pulls that step's parameters first), or -1.
static int s_activate_joiner(zps_coord *c, uint64_t step)
{
    for (uint32_t i = 0; i < c->n_members; i++) {
        zps_coord_member *mem = &c->members[i];
        if (mem->life.state == ZPS_MEMBER_JOINING && mem->route_known &&
            zps_member_activate(&mem->life, step) == ZPS_OK) {
            zps_log_info("rank %u (%s) is active from step %llu: no one else can compute it",
                         mem->rank, mem->host, (unsigned long long)step);
            return (int)i;
        }
    }
    return -1;
}

// Hands every slice of the steps in progress (and of the next, when its
// parameters are on their way) whose owner can no longer compute it to a
// member that can, once each: a slice that did arrive
// after all is dropped by the shards as a second copy, so handing out too
// much costs time, never correctness. Returns whether anything was handed.
static bool s_hand_orphans(zps_coord *c, bool *woke_joiner)
{
    // From the oldest step a shard still works on to the newest whose
    // plan is fixed: a step whose parameters shard 0 began to send keeps
    // the plan it had, whoever leaves during it.
    uint64_t lo = zps_coord_global_done(c);
    uint64_t hi = c->released > c->shard_done[0] ? c->released : c->shard_done[0];
    bool handed = false;
    zps_plans_forget_handed_before(&c->plans, lo);
    for (uint64_t t = lo; t <= hi && t < c->cfg.total_steps; t++) {
        const zps_plan_gen *g = zps_plans_at(&c->plans, t);
        for (uint32_t i = 0; g && i < g->plan.n; i++) {
            const zps_plan_slice *sl = &g->plan.slices[i];
            const zps_plans_handed *before = zps_plans_handed_at(&c->plans, t, sl->offset);
            uint32_t owner = before ? before->rank : sl->rank;
            if (zps_member_may_compute(&c->members[owner].life, t) ||
                c->plans.n_handed == ZPS_PLANS_HANDED_MAX) {
                continue;
            }
            int to = s_least_loaded(c, t, &g->plan);
            if (to < 0 && (to = s_activate_joiner(c, t)) >= 0) {
                *woke_joiner = true;
            }
            if (to < 0) {
                return handed; // nobody: the step waits for a worker to join
            }
            zps_plans_handed h = {.step = t, .offset = sl->offset, .count = sl->count,
                                  .gen = g->gen, .rank = c->members[to].rank};
            (void)zps_plans_hand(&c->plans, &h); // not full: see above
            handed = true;
            zps_log_info("step %llu: slice [%u, %u) of rank %u handed to rank %u (%s)",
                         (unsigned long long)t, sl->offset, sl->offset + sl->count, owner,
                         c->members[to].rank, c->members[to].host);
        }
    }
    return handed;
}

// The newest generation, with the handed-over slices, to every other shard
// and every worker that has its job (its own id only): as a PLAN, or as a
// ROLLBACK to `step`.
void zps_coord_broadcast(zps_coord *c, zps_outbox *out, Zps__MsgType type, uint64_t step)
{
    const zps_plan_gen *g = zps_coord_newest(c);
    Zps__Slice slices[ZPS_MAX_MEMBERS];
    Zps__Slice *slice_ptrs[ZPS_MAX_MEMBERS];
    Zps__Extra extras[ZPS_PLANS_HANDED_MAX];
    Zps__Extra *extra_ptrs[ZPS_PLANS_HANDED_MAX];
    for (int k = 0; k < c->plans.n_handed; k++) {
        zps_coord_extra_to_wire(&c->plans.handed[k], &extras[k]);
        extra_ptrs[k] = &extras[k];
    }
    zps_coord_group_wire group;
    Zps__Plan plan = ZPS__PLAN__INIT;
    plan.generation = g->gen;
    plan.effective_step = g->effective;
    plan.slices = slice_ptrs;
    plan.members = g->plan.n;
    plan.n_extras = (size_t)c->plans.n_handed;
    plan.extras = extra_ptrs;
    Zps__Header h;
    zps_wire_header_init(&h, type);
    h.job_id = c->job_id;
    h.step = step;
    h.generation = g->gen;
    h.plan = &plan;
    plan.n_slices = zps_coord_plan_to_wire(&g->plan, NULL, slices, slice_ptrs);
    for (uint32_t i = 1; i < c->cfg.shards; i++) {
        (void)zps_outbox_add(out, &c->shards[i].route, &h);
    }
    for (uint32_t i = 0; i < c->n_members; i++) {
        zps_coord_member *mem = &c->members[i];
        if (zps_member_live(&mem->life) && mem->has_job && mem->route_known) {
            plan.n_slices = zps_coord_plan_to_wire(&g->plan, mem, slices, slice_ptrs);
            plan.host = zps_coord_host_group(c, g, mem, &group);
            (void)zps_outbox_add(out, &mem->route, &h);
        }
    }
}

// JOB to the active members that do not have theirs yet (joiners).
void zps_coord_send_new_jobs(zps_coord *c, zps_outbox *out)
{
    for (uint32_t i = 0; i < c->n_members; i++) {
        zps_coord_member *mem = &c->members[i];
        if (mem->life.state == ZPS_MEMBER_ACTIVE && !mem->has_job && mem->route_known) {
            zps_coord_send_job(c, out, &mem->route, ZPS__MSG_TYPE__JOB, mem, 0);
        }
    }
}

// Hands the orphans of the steps in progress and tells whom: the others
// get the newest plan with the pieces. A joiner woken for a stuck step
// must be known to the shards before its pieces reach them, so the plan
// that names it is made now, from the first step whose parameters shard 0
// has not begun to send (no one can have computed it, and its PLAN
// reaches every worker before those parameters do); the joiner gets its
// JOB, its pieces in it.
void zps_coord_reassign(zps_coord *c, zps_outbox *out)
{
    bool woke = false;
    bool handed = s_hand_orphans(c, &woke);
    if (woke && c->released + 1 < c->cfg.total_steps) {
        handed = zps_coord_commit(c, c->released + 1) || handed;
    }
    if (handed) {
        zps_coord_broadcast(c, out, ZPS__MSG_TYPE__PLAN, 0);
    }
    if (woke) {
        zps_coord_send_new_jobs(c, out);
    }
}

// A member that no plan of a step in progress names is gone for good.
static void s_retire_leavers(zps_coord *c)
{
    uint64_t lo = zps_coord_global_done(c);
    for (uint32_t i = 0; i < c->n_members; i++) {
        zps_coord_member *mem = &c->members[i];
        bool named = false;
        for (int k = 0; mem->life.state == ZPS_MEMBER_LEAVING && k < c->plans.n; k++) {
            const zps_plan_gen *g = &c->plans.gens[k];
            bool in_use = k + 1 == c->plans.n || c->plans.gens[k + 1].effective > lo;
            named = named || (in_use && zps_plan_find(&g->plan, mem->rank));
        }
        if (mem->life.state == ZPS_MEMBER_LEAVING && !named) {
            zps_member_retire(&mem->life);
        }
    }
}

// Membership changed (or an adapted split is ready): the next step
// boundary makes one new plan for all the changes since the last one.
void zps_coord_note_change(zps_coord *c)
{
    c->pending = true;
    c->membership_changes++;
}

// The new generation over the members of the next plan, from `effective`
// on: joiners become active from there and get their JOB, everyone else
// the PLAN. False (nothing changed) if no member is left to plan for.
bool zps_coord_commit(zps_coord *c, uint64_t effective)
{
    zps_plan plan = {0};
    if (zps_coord_make_plan(c, &plan) != ZPS_OK) {
        return false;
    }
    uint32_t n = plan.n;
    zps_plans_forget_before(&c->plans, zps_coord_global_done(c));
    zps_err err = zps_plans_add(&c->plans, c->gen + 1, effective, &plan);
    zps_plan_fini(&plan);
    if (err != ZPS_OK) {
        zps_log_error("plan %u: %s; the plan in force stays", c->gen + 1, zps_strerror(err));
        return false; // out of memory: generations only grow
    }
    c->gen++;
    c->pending = false;
    c->replans++;
    c->replans_step = effective;
    for (uint32_t i = 0; i < c->n_members; i++) {
        if (c->members[i].life.state == ZPS_MEMBER_JOINING) {
            (void)zps_member_activate(&c->members[i].life, effective);
        }
    }
    s_retire_leavers(c);
    zps_log_info("plan %u from step %llu: %u workers", c->gen, (unsigned long long)effective, n);
    return true;
}

void zps_coord_release(zps_coord *c, zps_outbox *out, uint64_t step)
{
    c->released = step > c->released ? step : c->released;
    if (c->state != ZPS_COORD_TRAINING || !c->pending || step >= c->cfg.total_steps) {
        return;
    }
    if (zps_coord_commit(c, step)) {
        zps_coord_broadcast(c, out, ZPS__MSG_TYPE__PLAN, 0);
        zps_coord_send_new_jobs(c, out);
    }
}

// The first plan's members active from step 0, and a log line a member (the
// first 64 and the last: a job of thousands says the rest in one line).
static void s_activate_first(zps_coord *c, const zps_plan *plan)
{
    for (uint32_t i = 0; i < plan->n; i++) {
        const zps_plan_slice *sl = &plan->slices[i];
        (void)zps_member_activate(&c->members[i].life, 0);
        if (i < 64 || i + 1 == plan->n) {
            zps_log_info("rank %u: %s %s, samples [%u, %u) of %u", sl->rank, c->members[i].host,
                         c->members[i].device, sl->offset, sl->offset + sl->count,
                         c->cfg.global_batch);
        } else if (i == 64) {
            zps_log_info("ranks 64..%u: as the plan says (%u members)", plan->n - 2, plan->n);
        }
    }
}

// Every member and shard is here: fix the plan, give the other shards
// their ranges, and start the workers once every shard serves.
zps_err zps_coord_start(zps_coord *c, zps_outbox *out)
{
    if (c->n_members < c->cfg.workers || c->n_registered < c->cfg.shards) {
        return ZPS_OK;
    }
    zps_coord_group_ranks(c); // ranks are told to no one before the first plan
    c->hosts.gen = 0;
    zps_plan plan = {0};
    zps_err err = zps_coord_make_plan(c, &plan);
    if (err == ZPS_OK) {
        zps_plans_fini(&c->plans);
        err = zps_plans_add(&c->plans, 1, 0, &plan);
    }
    if (err != ZPS_OK) {
        zps_plan_fini(&plan);
        return err;
    }
    c->gen = 1;
    s_activate_first(c, &plan);
    zps_plan_fini(&plan);
    // Each shard's token goes with its range: from now on only its holder
    // speaks for that shard (server/zps_msgtab.h).
    for (uint32_t i = 1; i < c->cfg.shards; i++) {
        if ((err = zps_token_new(&c->shards[i].token)) != ZPS_OK) {
            return err;
        }
    }
    c->state = ZPS_COORD_ASSIGNING;
    for (uint32_t i = 1; i < c->cfg.shards; i++) {
        zps_coord_send_job(c, out, &c->shards[i].route, ZPS__MSG_TYPE__ASSIGN, NULL,
                           c->shards[i].token);
    }
    if (c->n_ready == c->cfg.shards) {
        zps_coord_start_workers(c, out);
    }
    return ZPS_OK;
}
