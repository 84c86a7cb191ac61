/* zps_coord.c - admission, plan, evaluation results, status, metrics log. */
#include "zps_coord.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "common/zps_clock.h"
#include "common/zps_layout.h"
#include "common/zps_log.h"
#include "common/zps_model.h"
#include "common/zps_plans.h"
#include "server/zps_ckpt.h"
#include "server/zps_member.h"
#include "server/zps_monitor.h"
#include "server/zps_msgtab.h"
#include "server/zps_outbox.h"
#include "server/zps_token.h"

#define ZPS_COORD_PROGRESS_MS 2000.0
#define ZPS_COORD_WAIT_LOG_MS 5000.0
// After the last step, how long members get to send results and goodbyes.
#define ZPS_COORD_END_GRACE_MS 60000.0

// WAITING for workers and shards, ASSIGNING ranges to the other shards
// (workers get the job once every shard serves), TRAINING, DONE.
// RECOVERING: restarted from a checkpoint, waiting for shards and workers
// to come back before everyone rolls back to it.
typedef enum s_state { S_WAITING, S_ASSIGNING, S_TRAINING, S_DONE, S_RECOVERING } s_state;

typedef struct s_member {
    uint32_t rank;        // position in the plan
    uint64_t member_id;   // secret-ish id its pushes carry
    char host[64];        // reported by the worker
    char device[32];      // reported by the worker
    uint32_t share;       // fixed share asked for, 0 for "split the rest"
    uint32_t pid;         // worker process id on its host
    zmq_msg_t route;      // routing id on shard 0's socket (for JOB)
    zps_member_life life; // joining, active from a step, leaving, gone (zps_member.h)
    uint64_t pushes;      // pushes seen on shard 0
    float compute_ms;     // last push's compute time
    bool has_job;         // was sent its JOB: plans go to it from now on
    bool route_known;     // route is valid (false after a coordinator restart until it calls)
    uint32_t adapted;     // share from the adaptive split (0: none)
    uint64_t covered;     // its slices of steps before this one were also handed to others
    double last_seen_ms;  // last message from it (heartbeats included)
} s_member;

// A slice of a step in progress handed to a live member.
typedef struct s_extra {
    uint64_t step;
    uint32_t offset, count;
    uint32_t gen;        // generation in force at that step
    uint32_t rank;       // who computes it now
} s_extra;

#define ZPS_COORD_EXTRAS 64

typedef struct s_shard_peer {
    bool registered;     // REGISTER received
    bool ready;          // READY received
    uint64_t token;      // the secret its ASSIGN carries and its messages must (0: none yet)
    char public_key[41]; // CURVE: the key it listens with, for workers ("" if the server's)
    char endpoint[256];  // where workers reach it
    zmq_msg_t route;     // routing id on shard 0's socket (for ASSIGN)
    uint64_t lo, hi;     // its range
} s_shard_peer;

// An epoch's evaluation, gathered from the workers' EVALs. Each worker
// evaluates the test records that match the samples it computed at the
// epoch's last step, pieces of late slices included, so a record can come
// twice (from a late slice's owner and from its helpers): the first copy
// counts, as with gradients.
typedef struct s_eval {
    uint64_t epoch;      // epoch being gathered, UINT64_MAX if none
    uint64_t correct;    // sum over members so far
    double loss_sum;
    uint64_t count;
    uint8_t *seen;       // owned: a bit per test record counted
    uint64_t last_done;  // the newest complete epoch, UINT64_MAX if none
} s_eval;

struct zps_coord {
    zps_coord_cfg cfg;                  // copy; strings borrowed
    uint64_t job_id;                    // random per run
    s_state state;                      // waiting, training, done
    uint32_t n_members;                 // admitted
    s_member members[ZPS_MAX_MEMBERS];  // in rank order
    s_shard_peer shards[ZPS_MAX_SHARDS]; // [0] is this process
    uint32_t n_registered;              // shards here, this one included
    uint32_t n_ready;                   // shards serving, this one included
    zps_plans plans;                    // generations still in use, the newest included
    uint32_t gen;                       // the newest generation made (1: the first plan)
    bool pending;                       // members came or went: re-plan at the next boundary
    uint64_t membership_changes;        // joins, departures and adapted splits, counted
    uint64_t replans;                   // plan generations made after the first
    uint64_t replans_step;              // the step boundary of the newest re-plan
    uint64_t released;                  // the newest step whose parameters shard 0 began to send
    uint64_t shard_done[ZPS_MAX_SHARDS]; // steps each shard completed
    s_extra extras[ZPS_COORD_EXTRAS];   // handed-over slices of steps in progress
    int n_extras;
    uint64_t evictions;                 // members evicted for silence
    zps_monitor *mon;                   // owned: lag, stragglers, throughput
    double recover_deadline_ms;         // RECOVERING: when to go on without the missing
    bool rollback_pending;              // shard 0 must restore rollback_step
    uint64_t rollback_step;
    uint64_t steps_done;                // last step_done + 1
    float last_loss;
    double last_step_ms;
    double test_accuracy;               // last complete evaluation, -1 before
    s_eval eval;                        // evaluation being gathered
    uint64_t evals_done;                // complete evaluations
    double next_log_ms;                 // next progress or waiting line
    double done_ms;                     // when the last step completed
    double started_ms;                  // when step 0 was planned
    double sum_step_ms;                 // for the mean in the progress line
    uint64_t n_step_ms;
    zps_log_limit refusals;             // bounds the lines refused messages cause
};

// The coordinator's clock: the monotonic one, or the test's (cfg.clock_ms).
static double s_now(const zps_coord *c)
{
    return c->cfg.clock_ms ? c->cfg.clock_ms() : zps_clock_ms();
}

zps_coord *zps_coord_new(const zps_coord_cfg *cfg)
{
    zps_coord *c = calloc(1, sizeof *c);
    if (!c) {
        zps_log_error("coordinator: out of memory");
        return NULL;
    }
    c->cfg = *cfg;
    if (!(c->mon = zps_monitor_new())) {
        free(c);
        return NULL;
    }
    // Job and member ids differ between runs, and none can be guessed from
    // another: STATUS shows the job id, and member ids are credentials.
    if (zps_token_new(&c->job_id) != ZPS_OK) {
        zps_monitor_destroy(&c->mon);
        free(c);
        return NULL;
    }
    for (uint32_t i = 0; i < cfg->shards; i++) {
        zps_model_shard_range(cfg->n_params, i, cfg->shards, &c->shards[i].lo, &c->shards[i].hi);
    }
    snprintf(c->shards[0].endpoint, sizeof c->shards[0].endpoint, "%s", cfg->endpoint);
    c->shards[0].registered = c->shards[0].ready = true;
    c->n_registered = c->n_ready = 1;
    c->test_accuracy = -1;
    c->eval.epoch = c->eval.last_done = UINT64_MAX;
    if (!(c->eval.seen = calloc(cfg->n_test / 8 + 1, 1))) {
        zps_monitor_destroy(&c->mon);
        free(c);
        return NULL;
    }
    return c;
}

void zps_coord_destroy(zps_coord **cp)
{
    zps_coord *c = *cp;
    if (!c) {
        return;
    }
    for (uint32_t i = 0; i < c->n_members; i++) {
        zps_wire_route_close(&c->members[i].route);
    }
    for (uint32_t i = 1; i < c->cfg.shards; i++) {
        if (c->shards[i].registered) {
            zps_wire_route_close(&c->shards[i].route);
        }
    }
    zps_monitor_destroy(&c->mon);
    free(c->eval.seen);
    free(c);
    *cp = NULL;
}

uint64_t zps_coord_job_id(const zps_coord *c)
{
    return c->job_id;
}

const zps_plan *zps_coord_plan(const zps_coord *c)
{
    const zps_plan_gen *g = zps_plans_newest(&c->plans);
    return c->state == S_WAITING || !g ? NULL : &g->plan;
}

bool zps_coord_finished(const zps_coord *c)
{
    if (c->state != S_DONE) {
        return false;
    }
    for (uint32_t i = 0; i < c->n_members; i++) {
        if (c->members[i].life.state == ZPS_MEMBER_ACTIVE) {
            return false;
        }
    }
    return true;
}

const char *zps_coord_member_host(const zps_coord *c, uint32_t rank)
{
    return rank < c->n_members ? c->members[rank].host : "?";
}

static void s_refuse(zps_coord *c, zps_outbox *out, zps_wire_msg *m, zps_err err, const char *why)
{
    uint64_t left_out;
    // Anyone may send a HELLO or a REGISTER: their refusals must not flood the log.
    if (zps_log_limit_pass(&c->refusals, s_now(c), &left_out)) {
        zps_log_warn("refused a %s from %s: %s%s", zps_wire_type_name(m->hdr ? (int)m->hdr->type : -1),
                     m->peer[0] ? m->peer : "?", why,
                     left_out ? " (and more refusals, not logged)" : "");
    }
    (void)zps_outbox_add_error(out, &m->route, c->job_id, c->steps_done, err, why);
}

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

static const zps_plan_gen *s_newest(const zps_coord *c)
{
    return zps_plans_newest(&c->plans);
}

static void s_extra_to_wire(const s_extra *e, Zps__Extra *w)
{
    zps__extra__init(w);
    w->step = e->step;
    w->rank = e->rank;
    w->offset = e->offset;
    w->count = e->count;
    w->generation = e->gen;
}

static void s_plan_to_wire(const zps_plan *plan, const s_member *only, Zps__Slice *slices,
                           Zps__Slice **ptrs)
{
    for (uint32_t i = 0; i < plan->n; i++) {
        zps__slice__init(&slices[i]);
        slices[i].rank = plan->slices[i].rank;
        slices[i].offset = plan->slices[i].offset;
        slices[i].count = plan->slices[i].count;
        // Ids authenticate pushes: a worker learns only its own.
        slices[i].member_id = !only || plan->slices[i].rank == only->rank
                                  ? plan->slices[i].member_id : 0;
        ptrs[i] = &slices[i];
    }
}

// JOB to a worker (its rank and id, and the step it starts at) or ASSIGN
// to a shard (every id, and the optimizer): the same Job message, told
// apart by `to_shard`.
static void s_send_job(zps_coord *c, zps_outbox *out, zmq_msg_t *route, Zps__MsgType type,
                       s_member *mem, uint64_t shard_token)
{
    const zps_plan_gen *g = s_newest(c);
    Zps__Slice slices[ZPS_MAX_MEMBERS];
    Zps__Slice *slice_ptrs[ZPS_MAX_MEMBERS];
    s_plan_to_wire(&g->plan, mem, slices, slice_ptrs);
    Zps__ShardInfo shards[ZPS_MAX_SHARDS];
    Zps__ShardInfo *shard_ptrs[ZPS_MAX_SHARDS];
    for (uint32_t i = 0; i < c->cfg.shards; i++) {
        zps__shard_info__init(&shards[i]);
        shards[i].index = i;
        shards[i].endpoint = c->shards[i].endpoint;
        shards[i].lo = c->shards[i].lo;
        shards[i].hi = c->shards[i].hi;
        shard_ptrs[i] = &shards[i];
    }
    Zps__Optim optim = ZPS__OPTIM__INIT;
    optim.lr = c->cfg.optim.lr;
    optim.momentum = c->cfg.optim.momentum;
    optim.nesterov = c->cfg.optim.nesterov;
    optim.weight_decay = c->cfg.optim.weight_decay;
    optim.schedule = (uint32_t)c->cfg.optim.schedule;
    optim.warmup_steps = c->cfg.optim.warmup_steps;
    optim.kind = (uint32_t)c->cfg.optim.kind;
    optim.beta1 = c->cfg.optim.beta1;
    optim.beta2 = c->cfg.optim.beta2;
    optim.eps = c->cfg.optim.eps;

    Zps__Job job = ZPS__JOB__INIT;
    job.model = (char *)c->cfg.model;
    job.dataset = (char *)c->cfg.dataset;
    job.seed = c->cfg.seed;
    job.global_batch = c->cfg.global_batch;
    job.total_steps = c->cfg.total_steps;
    job.steps_per_epoch = c->cfg.steps_per_epoch;
    job.rank = mem ? mem->rank : 0;
    job.member_id = mem ? mem->member_id : 0;
    job.n_plan = g->plan.n;
    job.plan = slice_ptrs;
    job.n_shards = c->cfg.shards;
    job.shards = shard_ptrs;
    job.wire_dtype = (Zps__DType)c->cfg.wire_dtype;
    Zps__Extra extras[ZPS_COORD_EXTRAS];
    Zps__Extra *extra_ptrs[ZPS_COORD_EXTRAS];
    size_t n_extras = 0;
    for (int i = 0; mem && i < c->n_extras; i++) {
        if (c->extras[i].rank == mem->rank) {
            s_extra_to_wire(&c->extras[i], &extras[n_extras]);
            extra_ptrs[n_extras] = &extras[n_extras];
            n_extras++;
        }
    }
    job.n_extras = n_extras;
    job.extras = extra_ptrs;
    job.generation = g->gen;
    job.plan_effective = g->effective;
    // The first step it computes: the one it is active from.
    job.start_step = mem ? mem->life.from : g->effective;
    job.optim = mem ? NULL : &optim;
    job.checkpoint_every = c->cfg.checkpoint_every;
    job.shard_token = shard_token;
    char *keys[ZPS_MAX_SHARDS];
    for (uint32_t i = 0; mem && i < c->cfg.shards; i++) {
        keys[i] = c->shards[i].public_key;
    }
    job.n_shard_keys = mem ? c->cfg.shards : 0;
    job.shard_keys = keys;
    job.layout = (Zps__Layout *)c->cfg.layout;
    // Rank 0 exists only at a first start (a resumed job's joiners come
    // after its members): its values are the job's initial ones.
    job.send_init = c->cfg.layout && mem && mem->rank == 0;

    Zps__Header h;
    zps_wire_header_init(&h, type);
    h.job_id = c->job_id;
    h.job = &job;
    if (mem) {
        mem->has_job = true;
        mem->last_seen_ms = s_now(c); // its heartbeats start once it has the job
    }
    if (zps_outbox_add(out, route, &h) != ZPS_OK) {
        zps_log_error("could not queue the job for %s", mem ? mem->host : "a shard");
    }
}

static void s_start_workers(zps_coord *c, zps_outbox *out)
{
    c->state = S_TRAINING;
    c->started_ms = s_now(c);
    c->next_log_ms = c->started_ms + ZPS_COORD_PROGRESS_MS;
    for (uint32_t i = 0; i < c->n_members; i++) {
        s_send_job(c, out, &c->members[i].route, ZPS__MSG_TYPE__JOB, &c->members[i], 0);
    }
    zps_log_info("job %016llx: %u workers, %u shards, %llu steps (%llu per epoch), model %s, "
                 "wire %s",
                 (unsigned long long)c->job_id, c->n_members, c->cfg.shards,
                 (unsigned long long)c->cfg.total_steps,
                 (unsigned long long)c->cfg.steps_per_epoch, c->cfg.model,
                 zps_dtype_name(c->cfg.wire_dtype));
}

// A plan over the members of the next plan (joining and active) in rank
// order: fixed shares where they still fit, the rest split evenly.
static zps_err s_make_plan(zps_coord *c, zps_plan *out)
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
    zps_err err = zps_plan_split(c->cfg.global_batch, shares, n, out, why, sizeof why);
    if (err != ZPS_OK && n > 0) {
        zps_log_warn("fixed shares no longer fit (%s); splitting the batch evenly", why);
        memset(shares, 0, sizeof shares);
        err = zps_plan_split(c->cfg.global_batch, shares, n, out, why, sizeof why);
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
    }
    return ZPS_OK;
}

static uint32_t s_live_flexible(const zps_coord *c)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < c->n_members; i++) {
        n += zps_member_planned(&c->members[i].life) && c->members[i].share == 0;
    }
    return n;
}

static uint32_t s_live_members(const zps_coord *c)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < c->n_members; i++) {
        n += zps_member_planned(&c->members[i].life);
    }
    return n;
}

static uint64_t s_global_done(const zps_coord *c)
{
    uint64_t done = c->shard_done[0];
    for (uint32_t i = 1; i < c->cfg.shards; i++) {
        done = c->shard_done[i] < done ? c->shard_done[i] : done;
    }
    return done;
}

// Whether a member can be handed work of `step` now: active by then, and
// reachable.
static bool s_can_take(const s_member *mem, uint64_t step)
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
        if (!s_can_take(&c->members[i], step)) {
            continue;
        }
        const zps_plan_slice *sl = zps_plan_find(plan, c->members[i].rank);
        uint64_t load = sl ? sl->count : 0;
        for (int k = 0; k < c->n_extras; k++) {
            load += c->extras[k].step == step && c->extras[k].rank == c->members[i].rank
                        ? c->extras[k].count : 0;
        }
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
        s_member *mem = &c->members[i];
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
    uint64_t lo = s_global_done(c);
    uint64_t hi = c->released > c->shard_done[0] ? c->released : c->shard_done[0];
    int kept = 0;
    bool handed = false;
    for (int k = 0; k < c->n_extras; k++) {
        if (c->extras[k].step >= lo) {
            c->extras[kept++] = c->extras[k];
        }
    }
    c->n_extras = kept;
    for (uint64_t t = lo; t <= hi && t < c->cfg.total_steps; t++) {
        const zps_plan_gen *g = zps_plans_at(&c->plans, t);
        for (uint32_t i = 0; g && i < g->plan.n; i++) {
            const zps_plan_slice *sl = &g->plan.slices[i];
            int k = 0;
            while (k < c->n_extras && !(c->extras[k].step == t && c->extras[k].offset == sl->offset)) {
                k++;
            }
            uint32_t owner = k < c->n_extras ? c->extras[k].rank : sl->rank;
            if (zps_member_may_compute(&c->members[owner].life, t) ||
                c->n_extras == ZPS_COORD_EXTRAS) {
                continue;
            }
            int to = s_least_loaded(c, t, &g->plan);
            if (to < 0 && (to = s_activate_joiner(c, t)) >= 0) {
                *woke_joiner = true;
            }
            if (to < 0) {
                return handed; // nobody: the step waits for a worker to join
            }
            if (k == c->n_extras) {
                c->n_extras++;
            }
            c->extras[k] = (s_extra){.step = t, .offset = sl->offset, .count = sl->count,
                                     .gen = g->gen, .rank = c->members[to].rank};
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
static void s_broadcast(zps_coord *c, zps_outbox *out, Zps__MsgType type, uint64_t step)
{
    const zps_plan_gen *g = s_newest(c);
    Zps__Slice slices[ZPS_MAX_MEMBERS];
    Zps__Slice *slice_ptrs[ZPS_MAX_MEMBERS];
    Zps__Extra extras[ZPS_COORD_EXTRAS];
    Zps__Extra *extra_ptrs[ZPS_COORD_EXTRAS];
    for (int k = 0; k < c->n_extras; k++) {
        s_extra_to_wire(&c->extras[k], &extras[k]);
        extra_ptrs[k] = &extras[k];
    }
    Zps__Plan plan = ZPS__PLAN__INIT;
    plan.generation = g->gen;
    plan.effective_step = g->effective;
    plan.n_slices = g->plan.n;
    plan.slices = slice_ptrs;
    plan.n_extras = (size_t)c->n_extras;
    plan.extras = extra_ptrs;
    Zps__Header h;
    zps_wire_header_init(&h, type);
    h.job_id = c->job_id;
    h.step = step;
    h.generation = g->gen;
    h.plan = &plan;
    s_plan_to_wire(&g->plan, NULL, slices, slice_ptrs);
    for (uint32_t i = 1; i < c->cfg.shards; i++) {
        (void)zps_outbox_add(out, &c->shards[i].route, &h);
    }
    for (uint32_t i = 0; i < c->n_members; i++) {
        s_member *mem = &c->members[i];
        if (zps_member_live(&mem->life) && mem->has_job && mem->route_known) {
            s_plan_to_wire(&g->plan, mem, slices, slice_ptrs);
            (void)zps_outbox_add(out, &mem->route, &h);
        }
    }
}

// JOB to the active members that do not have theirs yet (joiners).
static void s_send_new_jobs(zps_coord *c, zps_outbox *out)
{
    for (uint32_t i = 0; i < c->n_members; i++) {
        s_member *mem = &c->members[i];
        if (mem->life.state == ZPS_MEMBER_ACTIVE && !mem->has_job && mem->route_known) {
            s_send_job(c, out, &mem->route, ZPS__MSG_TYPE__JOB, mem, 0);
        }
    }
}

static bool s_commit(zps_coord *c, uint64_t effective);

// Hands the orphans of the steps in progress and tells whom: the others
// get the newest plan with the pieces. A joiner woken for a stuck step
// must be known to the shards before its pieces reach them, so the plan
// that names it is made now, from the first step whose parameters shard 0
// has not begun to send (no one can have computed it, and its PLAN
// reaches every worker before those parameters do); the joiner gets its
// JOB, its pieces in it.
static void s_reassign(zps_coord *c, zps_outbox *out)
{
    bool woke = false;
    bool handed = s_hand_orphans(c, &woke);
    if (woke && c->released + 1 < c->cfg.total_steps) {
        handed = s_commit(c, c->released + 1) || handed;
    }
    if (handed) {
        s_broadcast(c, out, ZPS__MSG_TYPE__PLAN, 0);
    }
    if (woke) {
        s_send_new_jobs(c, out);
    }
}

// A member that no plan of a step in progress names is gone for good.
static void s_retire_leavers(zps_coord *c)
{
    uint64_t lo = s_global_done(c);
    for (uint32_t i = 0; i < c->n_members; i++) {
        s_member *mem = &c->members[i];
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
static void s_note_change(zps_coord *c)
{
    c->pending = true;
    c->membership_changes++;
}

// The new generation over the members of the next plan, from `effective`
// on: joiners become active from there and get their JOB, everyone else
// the PLAN. False (nothing changed) if no member is left to plan for.
static bool s_commit(zps_coord *c, uint64_t effective)
{
    zps_plan plan;
    if (s_make_plan(c, &plan) != ZPS_OK) {
        return false;
    }
    zps_plans_forget_before(&c->plans, s_global_done(c));
    if (zps_plans_add(&c->plans, ++c->gen, effective, &plan) != ZPS_OK) {
        return false; // cannot happen: generations only grow
    }
    c->pending = false;
    c->replans++;
    c->replans_step = effective;
    for (uint32_t i = 0; i < c->n_members; i++) {
        if (c->members[i].life.state == ZPS_MEMBER_JOINING) {
            (void)zps_member_activate(&c->members[i].life, effective);
        }
    }
    s_retire_leavers(c);
    zps_log_info("plan %u from step %llu: %u workers", c->gen, (unsigned long long)effective,
                 plan.n);
    return true;
}

void zps_coord_release(zps_coord *c, zps_outbox *out, uint64_t step)
{
    c->released = step > c->released ? step : c->released;
    if (c->state != S_TRAINING || !c->pending || step >= c->cfg.total_steps) {
        return;
    }
    if (s_commit(c, step)) {
        s_broadcast(c, out, ZPS__MSG_TYPE__PLAN, 0);
        s_send_new_jobs(c, out);
    }
}

// A member left or fell silent: its pieces of the steps in progress go to
// others at once, and the plan without it comes at the next boundary.
static void s_depart(zps_coord *c, zps_outbox *out, s_member *mem, zps_member_exit why)
{
    if (zps_member_depart(&mem->life, why) != ZPS_OK) {
        return;
    }
    if (c->state == S_TRAINING && why != ZPS_EXIT_FINISHED) {
        s_note_change(c);
        s_reassign(c, out);
        if (s_live_members(c) == 0) {
            zps_log_warn("step %llu cannot complete: no live worker; waiting for workers to join",
                         (unsigned long long)s_global_done(c));
        }
    }
}

static void s_evict(zps_coord *c, zps_outbox *out, s_member *mem, double now_ms)
{
    c->evictions++;
    zps_log_warn("evicted rank %u (%s, pid %u, %s): silent for %.1f s [%llu evictions]",
                 mem->rank, mem->host, mem->pid, mem->device, (now_ms - mem->last_seen_ms) / 1e3,
                 (unsigned long long)c->evictions);
    s_depart(c, out, mem, ZPS_EXIT_EVICTED);
}

static s_member *s_member_by_id(zps_coord *c, uint64_t member_id)
{
    for (uint32_t i = 0; i < c->n_members; i++) {
        if (c->members[i].member_id == member_id) {
            return &c->members[i];
        }
    }
    return NULL;
}

static void s_try_recover(zps_coord *c, zps_outbox *out, bool deadline_passed);
static zps_err s_rollback(zps_coord *c, zps_outbox *out, uint64_t step, uint32_t shard);

// Heartbeats from a worker's main socket (flag 1) also say where its
// replies go: after a coordinator restart that is how routes come back.
zps_err zps_coord_on_heartbeat(zps_coord *c, zps_outbox *out, zps_wire_msg *m)
{
    s_member *mem = s_member_by_id(c, m->hdr->member_id);
    if (!mem || !zps_member_live(&mem->life)) {
        return ZPS_ENOENT;
    }
    mem->last_seen_ms = s_now(c);
    if ((m->hdr->flags & 1u) && !mem->route_known) {
        zps_wire_route_close(&mem->route);
        zps_wire_route_copy(&mem->route, &m->route);
        mem->route_known = true;
        zps_log_info("rank %u (%s) is back", mem->rank, mem->host);
        s_try_recover(c, out, false);
    }
    return ZPS_OK;
}

// RECOVERING: once every shard and live worker called back (or the wait
// ran out for the workers), everyone rolls back to the restored step.
static void s_try_recover(zps_coord *c, zps_outbox *out, bool deadline_passed)
{
    if (c->state != S_RECOVERING) {
        return;
    }
    for (uint32_t i = 1; i < c->cfg.shards; i++) {
        if (!c->shards[i].registered) {
            return; // no step can complete without it
        }
    }
    for (uint32_t i = 0; i < c->n_members; i++) {
        s_member *mem = &c->members[i];
        if (zps_member_live(&mem->life) && !mem->route_known) {
            if (!deadline_passed) {
                return;
            }
            (void)zps_member_depart(&mem->life, ZPS_EXIT_EVICTED);
            zps_member_retire(&mem->life);
            c->evictions++;
            zps_log_warn("rank %u (%s) did not come back after the restart: evicted", mem->rank,
                         mem->host);
        }
    }
    if (s_rollback(c, out, c->steps_done, 0) != ZPS_OK) {
        zps_log_error("cannot roll back to the restored step %llu; still recovering",
                      (unsigned long long)c->steps_done);
    }
}

zps_err zps_coord_on_step_done(zps_coord *c, const zps_wire_msg *m)
{
    uint32_t shard = m->hdr->shard;
    uint64_t done = m->hdr->step;
    if (c->state == S_RECOVERING) {
        return ZPS_OK; // steps of before the restart: the rollback resets them all
    }
    // A shard cannot be more than one step ahead of shard 0: its next step
    // needs pushes computed on shard 0's parameters of the step before.
    if (shard == 0 || shard >= c->cfg.shards || done > c->shard_done[0] + 1 ||
        done > c->cfg.total_steps) {
        zps_log_warn("dropped a STEP_DONE of shard %u for step %llu (shard 0 has done %llu)",
                     shard, (unsigned long long)done, (unsigned long long)c->shard_done[0]);
        return ZPS_ESTALE;
    }
    zps_coord_shard_done(c, shard, done);
    return ZPS_OK;
}

uint32_t zps_coord_at(const zps_coord *c)
{
    static const uint32_t at[] = {[S_WAITING] = ZPS_AT_WAITING,
                                  [S_ASSIGNING] = ZPS_AT_ASSIGNING,
                                  [S_TRAINING] = ZPS_AT_TRAINING,
                                  [S_DONE] = ZPS_AT_DONE,
                                  [S_RECOVERING] = ZPS_AT_RECOVERING};
    return at[c->state];
}

bool zps_coord_member_ok(const zps_coord *c, uint32_t rank, uint64_t member_id)
{
    // Admitted at some point: whether it is still live is the handler's to
    // say (an evicted worker's heartbeats are not an attack).
    return rank < c->n_members && zps_token_equal(c->members[rank].member_id, member_id);
}

bool zps_coord_shard_assigned(const zps_coord *c, uint32_t index)
{
    // ASSIGN goes to every shard when the job starts.
    return index > 0 && index < c->cfg.shards && c->state != S_WAITING;
}

bool zps_coord_shard_token_ok(const zps_coord *c, uint32_t index, uint64_t token)
{
    return index > 0 && index < c->cfg.shards && index < ZPS_MAX_SHARDS &&
           zps_token_equal(c->shards[index].token, token);
}

void zps_coord_shard_done(zps_coord *c, uint32_t shard, uint64_t steps_done)
{
    if (shard < c->cfg.shards && steps_done > c->shard_done[shard]) {
        c->shard_done[shard] = steps_done;
    }
}

uint32_t zps_coord_generation(const zps_coord *c, uint64_t *effective)
{
    const zps_plan_gen *g = s_newest(c);
    *effective = g ? g->effective : 0;
    return g ? g->gen : 0;
}

// Every member and shard is here: fix the plan, give the other shards
// their ranges, and start the workers once every shard serves.
static zps_err s_start(zps_coord *c, zps_outbox *out)
{
    if (c->n_members < c->cfg.workers || c->n_registered < c->cfg.shards) {
        return ZPS_OK;
    }
    zps_plan plan;
    zps_err err = s_make_plan(c, &plan);
    if (err != ZPS_OK) {
        return err;
    }
    c->gen = 1;
    zps_plans_init(&c->plans);
    (void)zps_plans_add(&c->plans, 1, 0, &plan);
    for (uint32_t i = 0; i < plan.n; i++) {
        const zps_plan_slice *sl = &plan.slices[i];
        (void)zps_member_activate(&c->members[i].life, 0);
        zps_log_info("rank %u: %s %s, samples [%u, %u) of %u", sl->rank, c->members[i].host,
                     c->members[i].device, sl->offset, sl->offset + sl->count,
                     c->cfg.global_batch);
    }
    // Each shard's token goes with its range: from now on only its holder
    // speaks for that shard (server/zps_msgtab.h).
    for (uint32_t i = 1; i < c->cfg.shards; i++) {
        if ((err = zps_token_new(&c->shards[i].token)) != ZPS_OK) {
            return err;
        }
    }
    c->state = S_ASSIGNING;
    for (uint32_t i = 1; i < c->cfg.shards; i++) {
        s_send_job(c, out, &c->shards[i].route, ZPS__MSG_TYPE__ASSIGN, NULL, c->shards[i].token);
    }
    if (c->n_ready == c->cfg.shards) {
        s_start_workers(c, out);
    }
    return ZPS_OK;
}

// Everyone goes back to `step`, which a restarted shard restored from its
// checkpoint (the others have a checkpoint of the same step): a new plan
// generation from there over every member still here (joiners included,
// active from `step`), and the steps after it replayed. Shard 0 restores
// first (cfg.restore): a rollback it cannot follow is refused, with nothing
// changed and nothing sent, and the job goes on.
static zps_err s_rollback(zps_coord *c, zps_outbox *out, uint64_t step, uint32_t shard)
{
    zps_err err;
    if (c->cfg.restore && (err = c->cfg.restore(c->cfg.restore_arg, step)) != ZPS_OK) {
        zps_log_error("shard %u asks to roll back to step %llu, which shard 0 cannot restore "
                      "(%s): refused; the job goes on without that rollback", shard,
                      (unsigned long long)step, zps_strerror(err));
        return err;
    }
    zps_log_warn("shard %u is back at step %llu: every shard and worker rolls back to it "
                 "and replays from there", shard, (unsigned long long)step);
    c->n_extras = 0;
    for (uint32_t i = 0; i < c->cfg.shards; i++) {
        c->shard_done[i] = step;
    }
    c->steps_done = step;
    c->released = step;
    c->state = S_TRAINING;
    if (!s_commit(c, step)) {
        // Nobody to plan for: everyone still rolls back, with the plan of
        // before, and the step waits for workers to join, as when all leave.
        zps_log_warn("no live worker to replay with: waiting for workers to join");
    }
    for (uint32_t i = 0; i < c->n_members; i++) {
        if (c->members[i].life.state == ZPS_MEMBER_ACTIVE) {
            (void)zps_member_activate(&c->members[i].life, step);
        }
    }
    c->rollback_pending = true;
    c->rollback_step = step;
    s_broadcast(c, out, ZPS__MSG_TYPE__ROLLBACK, step);
    s_send_new_jobs(c, out);
    return ZPS_OK;
}

bool zps_coord_take_rollback(zps_coord *c, uint64_t *step)
{
    if (!c->rollback_pending) {
        return false;
    }
    c->rollback_pending = false;
    *step = c->rollback_step;
    return true;
}

// The key a shard listens with, if it says (40 characters of Z85): workers
// connect to it with that key instead of shard 0's.
static void s_take_public_key(s_shard_peer *sp, const Zps__Register *r)
{
    size_t len = r->public_key ? strlen(r->public_key) : 0;
    bool z85 = len == sizeof sp->public_key - 1 &&
               strspn(r->public_key, "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRST"
                                     "UVWXYZ.-:+=^!/*?&<>()[]{}@%$#") == len;
    snprintf(sp->public_key, sizeof sp->public_key, "%s", z85 ? r->public_key : "");
}

// A shard registers again while training: it crashed and restarted. It
// gets its assignment again and says which step it restored (READY).
static zps_err s_shard_restarted(zps_coord *c, zps_outbox *out, zps_wire_msg *m, s_shard_peer *sp)
{
    const Zps__Register *r = m->hdr->registration;
    zps_wire_route_close(&sp->route);
    zps_wire_route_copy(&sp->route, &m->route);
    snprintf(sp->endpoint, sizeof sp->endpoint, "%s", r->endpoint);
    s_take_public_key(sp, r);
    sp->ready = false;
    zps_log_warn("shard %u at %s restarted%s; assigning its range again", r->index, sp->endpoint,
                 r->resume ? " from its checkpoint" : " without --resume");
    s_send_job(c, out, &sp->route, ZPS__MSG_TYPE__ASSIGN, NULL, sp->token);
    return ZPS_OK;
}

zps_err zps_coord_on_register(zps_coord *c, zps_outbox *out, zps_wire_msg *m)
{
    const Zps__Register *r = m->hdr->registration;
    if (!r || r->shards != c->cfg.shards || r->index == 0 || r->index >= c->cfg.shards ||
        !r->endpoint || !r->endpoint[0] || strlen(r->endpoint) >= sizeof c->shards[0].endpoint) {
        char why[160];
        snprintf(why, sizeof why, "REGISTER must name a shard 1..%u of %u and its endpoint",
                 c->cfg.shards - 1, c->cfg.shards);
        s_refuse(c, out, m, ZPS_EINVAL, why);
        return ZPS_EINVAL;
    }
    s_shard_peer *sp = &c->shards[r->index];
    if (r->serving) {
        // A shard saying where it is, every few seconds: after a restart of
        // the coordinator, this is how it finds its shards again.
        if (c->state == S_RECOVERING && !sp->registered) {
            zps_wire_route_copy(&sp->route, &m->route);
            snprintf(sp->endpoint, sizeof sp->endpoint, "%s", r->endpoint);
            s_take_public_key(sp, r);
            sp->registered = sp->ready = true;
            zps_log_info("shard %u at %s is back", r->index, sp->endpoint);
            s_try_recover(c, out, false);
        }
        return ZPS_OK;
    }
    if (c->state == S_TRAINING && sp->registered) {
        return s_shard_restarted(c, out, m, sp);
    }
    if (c->state != S_WAITING) {
        s_refuse(c, out, m, ZPS_ESTATE, "the job has started; shards cannot join it yet");
        return ZPS_ESTATE;
    }
    if (sp->registered) {
        zps_wire_route_close(&sp->route); // a restart before the job started: take the new one
    } else {
        c->n_registered++;
    }
    sp->registered = true;
    snprintf(sp->endpoint, sizeof sp->endpoint, "%s", r->endpoint);
    s_take_public_key(sp, r);
    zps_wire_route_copy(&sp->route, &m->route);
    zps_log_info("shard %u at %s registered: [%llu, %llu) (%u of %u shards)", r->index,
                 sp->endpoint, (unsigned long long)sp->lo, (unsigned long long)sp->hi,
                 c->n_registered, c->cfg.shards);
    return s_start(c, out);
}

zps_err zps_coord_on_ready(zps_coord *c, zps_outbox *out, zps_wire_msg *m)
{
    uint32_t i = m->hdr->shard;
    if (c->state == S_TRAINING && i > 0 && i < c->cfg.shards && !c->shards[i].ready) {
        // A restarted shard says which step it restored: everyone goes
        // back there, if that is a step the job has been at.
        if (m->hdr->step > c->steps_done) {
            zps_log_error("shard %u came back at step %llu, past the job's step %llu: its "
                          "rollback is refused", i, (unsigned long long)m->hdr->step,
                          (unsigned long long)c->steps_done);
            return ZPS_ESTALE;
        }
        zps_err err = s_rollback(c, out, m->hdr->step, i);
        c->shards[i].ready = err == ZPS_OK;
        return err;
    }
    if (c->state != S_ASSIGNING || i == 0 || i >= c->cfg.shards || c->shards[i].ready) {
        zps_log_warn("dropped an unexpected READY from shard %u", i);
        return ZPS_ESTATE;
    }
    c->shards[i].ready = true;
    if (++c->n_ready == c->cfg.shards) {
        s_start_workers(c, out);
    }
    return ZPS_OK;
}

static bool s_same_route(zmq_msg_t *a, zmq_msg_t *b)
{
    return zmq_msg_size(a) == zmq_msg_size(b) &&
           memcmp(zmq_msg_data(a), zmq_msg_data(b), zmq_msg_size(a)) == 0;
}

// Whether what a HELLO declares (a model, its dataset's sizes) is not the
// job's; why says how, naming the first tensor that differs.
static bool s_declared_differs(const zps_coord *c, const Zps__Hello *hello, char *why,
                               size_t len)
{
    if (!c->cfg.layout) {
        if (!hello->layout) {
            return false;
        }
        if (!c->cfg.spec || c->cfg.spec->kind != ZPS_MODEL_MLP) {
            snprintf(why, len, "this job trains %s: it takes no model declared by a worker",
                     c->cfg.model);
            return true;
        }
        // A worker of its own code (libzps) with the built-in MLP's layout.
        if (zps_layout_differs_mlp(c->cfg.spec, hello->layout, why, len)) {
            return true;
        }
    } else if (!hello->layout) {
        snprintf(why, len, "this job's model is declared by its workers (--model external): "
                           "this worker declared none");
        return true;
    }
    if (c->cfg.layout && zps_layout_digest(hello->layout) != zps_layout_digest(c->cfg.layout) &&
        zps_layout_differs(c->cfg.layout, hello->layout, why, len)) {
        return true;
    }
    if (hello->n_train != c->cfg.n_train || hello->n_test != c->cfg.n_test) {
        snprintf(why, len, "declared a dataset of %u train and %u test records; the job's has "
                           "%u and %u", hello->n_train, hello->n_test, c->cfg.n_train,
                 c->cfg.n_test);
        return true;
    }
    return false;
}

zps_err zps_coord_on_hello(zps_coord *c, zps_outbox *out, zps_wire_msg *m)
{
    const Zps__Hello *hello = m->hdr->hello;
    if (!hello) {
        s_refuse(c, out, m, ZPS_EPROTO, "HELLO without a hello body");
        return ZPS_EPROTO;
    }
    char why[320];
    if (s_declared_differs(c, hello, why, sizeof why)) {
        s_refuse(c, out, m, ZPS_EINVAL, why);
        return ZPS_EINVAL;
    }
    if (c->state == S_RECOVERING) {
        // Admitted once the members of before the restart are back or gone.
        s_refuse(c, out, m, ZPS_EAGAIN, "recovering from a restart: say HELLO again shortly");
        return ZPS_EAGAIN;
    }
    for (uint32_t i = 0; i < c->n_members; i++) {
        s_member *mem = &c->members[i];
        if (zps_member_live(&mem->life) && !mem->has_job &&
            s_same_route(&mem->route, &m->route)) {
            // A worker admitted and waiting for its JOB says HELLO again now
            // and then (it cannot tell a slow start or step from a
            // coordinator that restarted): it is admitted once.
            return ZPS_OK;
        }
    }
    bool joining = c->state == S_TRAINING;
    if ((c->state != S_WAITING && !joining) || c->n_members == ZPS_MAX_MEMBERS ||
        (!joining && c->n_members == c->cfg.workers)) {
        s_refuse(c, out, m, ZPS_ESTATE, "the job admits no more workers now");
        return ZPS_ESTATE;
    }
    uint64_t fixed = hello->share;
    uint32_t n_flex = hello->share == 0;
    for (uint32_t i = 0; i < c->n_members; i++) {
        bool planned = zps_member_planned(&c->members[i].life);
        fixed += planned ? c->members[i].share : 0;
        n_flex += planned && c->members[i].share == 0;
    }
    bool last = !joining && c->n_members + 1 == c->cfg.workers;
    if (fixed > c->cfg.global_batch || (last && n_flex == 0 && fixed != c->cfg.global_batch) ||
        (n_flex > 0 && c->cfg.global_batch - fixed < n_flex)) {
        snprintf(why, sizeof why,
                 "share %u does not fit: fixed shares would be %llu of global batch %u",
                 hello->share, (unsigned long long)fixed, c->cfg.global_batch);
        s_refuse(c, out, m, ZPS_EINVAL, why);
        return ZPS_EINVAL;
    }
    uint64_t member_id;
    if (zps_token_new(&member_id) != ZPS_OK) {
        s_refuse(c, out, m, ZPS_EAGAIN, "no member id could be drawn now; say HELLO again");
        return ZPS_EAGAIN;
    }
    s_member *mem = &c->members[c->n_members];
    memset(mem, 0, sizeof *mem);
    mem->rank = c->n_members;
    mem->member_id = member_id; // a credential: from the kernel, not from a seeded stream
    snprintf(mem->host, sizeof mem->host, "%s", hello->host ? hello->host : "?");
    snprintf(mem->device, sizeof mem->device, "%s", hello->device ? hello->device : "?");
    mem->share = hello->share;
    mem->pid = hello->pid;
    zps_member_admit(&mem->life);
    mem->route_known = true;
    mem->last_seen_ms = s_now(c);
    zps_wire_route_copy(&mem->route, &m->route);
    c->n_members++;
    if (!joining) {
        zps_log_info("worker %s pid %u (%s) admitted as rank %u (%u of %u)", mem->host, mem->pid,
                     mem->device, mem->rank, c->n_members, c->cfg.workers);
        return s_start(c, out);
    }
    // A member joins at the next step boundary, in the plan made there;
    // it gets its JOB then. Only if nobody else can compute the step in
    // progress does it become active from that step at once.
    zps_log_info("worker %s pid %u (%s) joins as rank %u from the next step boundary",
                 mem->host, mem->pid, mem->device, mem->rank);
    s_note_change(c);
    s_reassign(c, out);
    return ZPS_OK;
}

static void s_eval_complete(zps_coord *c)
{
    s_eval *e = &c->eval;
    double acc = (double)e->correct / (double)e->count;
    double loss = e->loss_sum / (double)e->count;
    c->test_accuracy = acc;
    c->evals_done++;
    zps_log_info("epoch %llu: test accuracy %.4f, test loss %.4f",
                 (unsigned long long)e->epoch, acc, loss);
    if (c->cfg.metrics) {
        fprintf(c->cfg.metrics, "{\"epoch\":%llu,\"test_accuracy\":%.6f,\"test_loss\":%.6f}\n",
                (unsigned long long)e->epoch, acc, loss);
        fflush(c->cfg.metrics);
    }
    e->last_done = e->epoch;
    e->epoch = UINT64_MAX;
}

// Whether a test record of [lo, hi) was counted already; if not, marks
// them all.
static bool s_eval_seen(s_eval *e, uint32_t lo, uint32_t hi)
{
    for (uint32_t i = lo; i < hi; i++) {
        if (e->seen[i / 8] & (1u << (i % 8))) {
            return true;
        }
    }
    for (uint32_t i = lo; i < hi; i++) {
        e->seen[i / 8] |= (uint8_t)(1u << (i % 8));
    }
    return false;
}

zps_err zps_coord_on_eval(zps_coord *c, const zps_wire_msg *m)
{
    const Zps__Eval *ev = m->hdr->eval;
    if (!ev || ev->count > c->cfg.n_test || ev->offset > c->cfg.n_test - ev->count ||
        ev->correct > ev->count || !isfinite(ev->loss_sum)) {
        zps_log_warn("dropped an EVAL without a valid body");
        return ZPS_EPROTO;
    }
    s_eval *e = &c->eval;
    if (e->last_done != UINT64_MAX && ev->epoch <= e->last_done) {
        return ZPS_OK; // a second copy of records of an epoch already complete
    }
    if (e->epoch != ev->epoch) {
        if (e->epoch != UINT64_MAX) {
            zps_log_warn("epoch %llu: evaluation incomplete (%llu of %u records)",
                         (unsigned long long)e->epoch, (unsigned long long)e->count,
                         c->cfg.n_test);
        }
        e->epoch = ev->epoch;
        e->correct = e->count = 0;
        e->loss_sum = 0;
        memset(e->seen, 0, c->cfg.n_test / 8 + 1);
    }
    if (s_eval_seen(e, (uint32_t)ev->offset, (uint32_t)(ev->offset + ev->count))) {
        zps_log_debug("epoch %llu: test records [%llu, %llu) came twice; the first copy counts",
                      (unsigned long long)ev->epoch, (unsigned long long)ev->offset,
                      (unsigned long long)(ev->offset + ev->count));
        return ZPS_OK;
    }
    e->correct += ev->correct;
    e->loss_sum += ev->loss_sum;
    e->count += ev->count;
    if (e->count >= c->cfg.n_test) {
        s_eval_complete(c);
    }
    return ZPS_OK;
}

zps_err zps_coord_on_bye(zps_coord *c, zps_outbox *out, const zps_wire_msg *m)
{
    uint32_t r = m->hdr->rank;
    if (r >= c->n_members || c->members[r].member_id != m->hdr->member_id) {
        zps_log_warn("dropped a BYE from an unknown member (rank %u)", r);
        return ZPS_ENOENT;
    }
    s_member *mem = &c->members[r];
    if (!zps_member_live(&mem->life)) {
        return ZPS_OK; // gone already (evicted, or a second BYE)
    }
    if (m->hdr->step < c->cfg.total_steps && c->state == S_TRAINING) {
        // Stopped by its supervisor: like an eviction, without the wait.
        zps_log_warn("rank %u (%s, pid %u) left at step %llu; the others take its share",
                     r, mem->host, mem->pid, (unsigned long long)m->hdr->step);
        s_depart(c, out, mem, ZPS_EXIT_LEFT);
        return ZPS_OK;
    }
    zps_log_info("rank %u (%s) finished", r, mem->host);
    s_depart(c, out, mem, ZPS_EXIT_FINISHED);
    return ZPS_OK;
}

static const char *s_state_name(s_state s)
{
    static const char *names[] = {"waiting", "assigning", "training", "done", "recovering"};
    return names[s];
}

// The fields of a member that STATUS and the saved job state share.
static void s_member_to_wire(const s_member *s, Zps__Member *out)
{
    zps__member__init(out);
    out->rank = s->rank;
    out->host = (char *)s->host;
    out->device = (char *)s->device;
    out->share = s->share;
    out->pid = s->pid;
    out->live = zps_member_live(&s->life);
}

void zps_coord_on_status(zps_coord *c, zps_outbox *out, zps_wire_msg *m, uint64_t step,
                         uint64_t bad_messages)
{
    Zps__Member members[ZPS_MAX_MEMBERS];
    Zps__Member *member_ptrs[ZPS_MAX_MEMBERS];
    for (uint32_t i = 0; i < c->n_members; i++) {
        const s_member *s = &c->members[i];
        s_member_to_wire(s, &members[i]);
        const zps_plan *plan = zps_coord_plan(c);
        const zps_plan_slice *sl = plan ? zps_plan_find(plan, s->rank) : NULL;
        members[i].share = c->state == S_WAITING          ? s->share
                           : sl && zps_member_live(&s->life) ? sl->count
                                                            : 0;
        members[i].pushes = s->pushes;
        members[i].compute_ms = s->compute_ms;
        zps_monitor_view v;
        if (zps_monitor_view_of(c->mon, s->rank, &v)) {
            members[i].lag_ms = v.lag_ms;
            members[i].straggler = v.straggler;
            members[i].samples_per_s = v.samples_per_s;
        }
        member_ptrs[i] = &members[i];
    }
    Zps__Status st = ZPS__STATUS__INIT;
    st.state = (char *)s_state_name(c->state);
    st.model = (char *)c->cfg.model;
    st.dataset = (char *)c->cfg.dataset;
    st.step = step;
    st.total_steps = c->cfg.total_steps;
    st.epoch = c->cfg.steps_per_epoch ? step / c->cfg.steps_per_epoch : 0;
    st.global_batch = c->cfg.global_batch;
    st.workers_expected = c->cfg.workers;
    st.n_members = c->n_members;
    st.members = member_ptrs;
    st.last_loss = c->last_loss;
    st.last_step_ms = c->last_step_ms;
    st.bad_messages = bad_messages;
    st.test_accuracy = c->test_accuracy;
    st.n_params = c->cfg.n_params;
    Zps__ShardInfo shards[ZPS_MAX_SHARDS];
    Zps__ShardInfo *shard_ptrs[ZPS_MAX_SHARDS];
    for (uint32_t i = 0; i < c->cfg.shards; i++) {
        zps__shard_info__init(&shards[i]);
        shards[i].index = i;
        shards[i].endpoint = c->shards[i].registered ? c->shards[i].endpoint : "";
        shards[i].lo = c->shards[i].lo;
        shards[i].hi = c->shards[i].hi;
        shard_ptrs[i] = &shards[i];
    }
    st.n_shards = c->cfg.shards;
    st.evictions = c->evictions;
    st.step_ms_median = zps_monitor_step_quantile(c->mon, 0.5);
    st.step_ms_p95 = zps_monitor_step_quantile(c->mon, 0.95);
    st.generation = c->gen;
    st.shards = shard_ptrs;
    st.replans = c->replans;
    st.steps_done_all = c->state == S_TRAINING || c->state == S_DONE ? s_global_done(c) : step;
    const s_member *asker = m->hdr->member_id ? s_member_by_id(c, m->hdr->member_id) : NULL;
    if (asker) {
        static const Zps__MemberState states[] = {
            [ZPS_MEMBER_JOINING] = ZPS__MEMBER_STATE__MEMBER_JOINING,
            [ZPS_MEMBER_ACTIVE] = ZPS__MEMBER_STATE__MEMBER_ACTIVE,
            [ZPS_MEMBER_LEAVING] = ZPS__MEMBER_STATE__MEMBER_GONE,
            [ZPS_MEMBER_GONE] = ZPS__MEMBER_STATE__MEMBER_GONE};
        st.asker = states[asker->life.state];
        st.asker_from = asker->life.from;
        st.asker_covered = asker->covered;
    }

    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__STATUS_REPLY);
    h.job_id = c->job_id;
    h.step = step;
    h.status = &st;
    (void)zps_outbox_add(out, &m->route, &h);
}

void zps_coord_step_done(zps_coord *c, uint64_t step, float loss, double step_ms,
                         const uint32_t *counted)
{
    c->steps_done = step + 1;
    zps_coord_shard_done(c, 0, step + 1);
    c->last_loss = loss;
    c->last_step_ms = step_ms;
    c->sum_step_ms += step_ms;
    c->n_step_ms++;
    FILE *f = c->cfg.metrics;
    if (f) {
        // The samples shard 0 counted, by who sent them (bucket 0, whose
        // counted slices tile the batch): each sample of the step once.
        uint64_t samples = 0;
        for (uint32_t r = 0; r < c->n_members; r++) {
            samples += counted[r];
        }
        const zps_plan_gen *g = zps_plans_at(&c->plans, step);
        fprintf(f,
                "{\"step\":%llu,\"epoch\":%llu,\"loss\":%.6f,\"samples\":%llu,\"step_ms\":%.3f,"
                "\"plan\":%u,\"replans\":%llu,\"counted\":[",
                (unsigned long long)step, (unsigned long long)(step / c->cfg.steps_per_epoch),
                loss, (unsigned long long)samples, step_ms, g ? g->gen : 0,
                (unsigned long long)c->replans);
        bool first = true;
        for (uint32_t r = 0; r < c->n_members; r++) {
            if (counted[r]) {
                fprintf(f, "%s[%u,%u]", first ? "" : ",", r, counted[r]);
                first = false;
            }
        }
        fprintf(f, "],\"workers\":[");
    }
    zps_monitor_step_done(c->mon, step, step_ms, f);
    if (f) {
        fprintf(f, "]}\n");
    }
    if (c->steps_done >= c->cfg.total_steps) {
        c->state = S_DONE;
        c->done_ms = s_now(c);
        double secs = (c->done_ms - c->started_ms) / 1e3;
        zps_log_info("trained %llu steps in %.1f s (%.2f ms/step)",
                     (unsigned long long)c->steps_done, secs, 1e3 * secs / c->steps_done);
        if (c->cfg.metrics) {
            fflush(c->cfg.metrics);
        }
    }
}

void zps_coord_note_push(zps_coord *c, uint64_t step, uint32_t rank, uint32_t samples,
                         float compute_ms, double now_ms)
{
    if (rank < c->n_members) {
        c->members[rank].last_seen_ms = now_ms;
        c->members[rank].pushes++;
        c->members[rank].compute_ms = compute_ms;
        zps_monitor_push(c->mon, step, rank, samples, compute_ms, now_ms);
    }
}

const char *zps_coord_member_device(const zps_coord *c, uint32_t rank)
{
    return rank < c->n_members ? c->members[rank].device : "?";
}

static void s_log_progress(zps_coord *c)
{
    uint64_t spe = c->cfg.steps_per_epoch;
    double mean = c->n_step_ms ? c->sum_step_ms / (double)c->n_step_ms : 0;
    zps_log_info("step %llu/%llu epoch %llu: loss %.4f, %.2f ms/step", (unsigned long long)c->steps_done,
                 (unsigned long long)c->cfg.total_steps,
                 (unsigned long long)(c->steps_done / spe), c->last_loss, mean);
    if (c->cfg.metrics) {
        fflush(c->cfg.metrics);
    }
    c->sum_step_ms = 0;
    c->n_step_ms = 0;
}

// The deadlines, checked at every tick (not behind the log's pace):
// silent members are evicted, a recovery goes on without those that did
// not call back, a member that does not finish after the last step is
// given up, and a joiner admitted too late is told the job is over.
static void s_check_deadlines(zps_coord *c, zps_outbox *out, double now_ms)
{
    // A joiner waits for its JOB, which comes at a step boundary, without
    // heartbeats: only a member with its job can fall silent.
    for (uint32_t i = 0; c->state >= S_ASSIGNING && i < c->n_members; i++) {
        s_member *mem = &c->members[i];
        if (mem->life.state == ZPS_MEMBER_ACTIVE && mem->has_job &&
            now_ms - mem->last_seen_ms > c->cfg.worker_timeout_ms) {
            s_evict(c, out, mem, now_ms);
        }
    }
    if (c->state == S_RECOVERING && now_ms > c->recover_deadline_ms) {
        s_try_recover(c, out, true);
    }
    for (uint32_t i = 0; c->state == S_DONE && i < c->n_members; i++) {
        s_member *mem = &c->members[i];
        if (mem->life.state == ZPS_MEMBER_JOINING) {
            // Admitted too late: the job ended before a boundary took it in.
            zps_outbox_add_error(out, &mem->route, c->job_id, c->steps_done, ZPS_ECLOSED,
                                 "the job is over");
            (void)zps_member_depart(&mem->life, ZPS_EXIT_LEFT);
        } else if (mem->life.state == ZPS_MEMBER_ACTIVE &&
                   now_ms - c->done_ms > ZPS_COORD_END_GRACE_MS) {
            zps_log_warn("rank %u (%s) did not finish within %.0f s of the last step; "
                         "giving up on it", i, mem->host, ZPS_COORD_END_GRACE_MS / 1e3);
            (void)zps_member_depart(&mem->life, ZPS_EXIT_EVICTED);
            zps_member_retire(&mem->life);
        }
    }
}

// What the coordinator waits for, said every few seconds.
static void s_log_waiting(zps_coord *c)
{
    switch (c->state) {
    case S_RECOVERING:
        zps_log_info("restarted at step %llu: waiting for shards and workers to call back",
                     (unsigned long long)c->steps_done);
        break;
    case S_WAITING:
        zps_log_info("waiting for %u more worker(s) to say HELLO and %u more shard(s) to "
                     "register (%u of %u workers, %u of %u shards)",
                     c->cfg.workers - c->n_members, c->cfg.shards - c->n_registered,
                     c->n_members, c->cfg.workers, c->n_registered, c->cfg.shards);
        break;
    case S_ASSIGNING:
        for (uint32_t i = 1; i < c->cfg.shards; i++) {
            if (!c->shards[i].ready) {
                zps_log_info("waiting for shard %u at %s to confirm its range", i,
                             c->shards[i].endpoint);
            }
        }
        break;
    case S_TRAINING:
        if (s_live_members(c) == 0) {
            zps_log_warn("step %llu cannot complete: no live worker; waiting for workers to "
                         "join (zps-worker --coordinator %s)",
                         (unsigned long long)s_global_done(c), c->cfg.endpoint);
        }
        s_log_progress(c);
        break;
    case S_DONE:
        for (uint32_t i = 0; i < c->n_members; i++) {
            if (c->members[i].life.state == ZPS_MEMBER_ACTIVE) {
                zps_log_info("run complete; waiting for rank %u (%s) to report and finish", i,
                             c->members[i].host);
            }
        }
        break;
    }
}

void zps_coord_tick(zps_coord *c, zps_outbox *out, double now_ms)
{
    s_check_deadlines(c, out, now_ms);
    if (now_ms >= c->next_log_ms) {
        s_log_waiting(c);
        c->next_log_ms = now_ms + (c->state == S_TRAINING ? ZPS_COORD_PROGRESS_MS
                                                          : ZPS_COORD_WAIT_LOG_MS);
    }
}

// ---------------------------------------------------------------------------
// Job state beside the checkpoints.

#define ZPS_COORD_STATE_MAX (1u << 20)
#define ZPS_COORD_RESUME_GEN_GAP 1000u

static void s_state_name_for(char *buf, size_t len, uint64_t step)
{
    snprintf(buf, len, "coord-step-%llu.state", (unsigned long long)step);
}

zps_err zps_coord_save(const zps_coord *c, const char *dir, uint64_t step)
{
    Zps__Member members[ZPS_MAX_MEMBERS];
    Zps__Member *ptrs[ZPS_MAX_MEMBERS];
    for (uint32_t i = 0; i < c->n_members; i++) {
        const s_member *s = &c->members[i];
        s_member_to_wire(s, &members[i]);
        members[i].member_id = s->member_id;
        ptrs[i] = &members[i];
    }
    Zps__JobState st = ZPS__JOB_STATE__INIT;
    st.job_id = c->job_id;
    st.generation = c->gen;
    st.step = step;
    st.n_members = c->n_members;
    st.members = ptrs;
    size_t len = zps__job_state__get_packed_size(&st);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) {
        return ZPS_ENOMEM;
    }
    zps__job_state__pack(&st, buf);
    char name[64];
    s_state_name_for(name, sizeof name, step);
    // The members' ids are credentials: the job state is the owner's only,
    // and so are the shards' tokens, which a restarted coordinator needs to
    // know its shards again (they never change, so one file serves every step).
    zps_err err = zps_ckpt_write_secret(dir, name, buf, len);
    free(buf);
    if (err == ZPS_OK && c->cfg.shards > 1) {
        uint64_t tokens[ZPS_MAX_SHARDS];
        for (uint32_t i = 0; i < c->cfg.shards; i++) {
            tokens[i] = c->shards[i].token;
        }
        err = zps_token_save_table(dir, tokens, c->cfg.shards);
    }
    if (err == ZPS_OK && step > 3 * c->cfg.checkpoint_every && c->cfg.checkpoint_every) {
        char old[600];
        s_state_name_for(name, sizeof name, step - 3 * c->cfg.checkpoint_every);
        snprintf(old, sizeof old, "%s/%s", dir, name);
        unlink(old); // as the shard keeps its newest three checkpoints
    }
    return err;
}

zps_err zps_coord_resume(zps_coord *c, const char *dir, uint64_t step)
{
    char name[64];
    s_state_name_for(name, sizeof name, step);
    uint8_t *buf = malloc(ZPS_COORD_STATE_MAX);
    size_t len = 0;
    zps_err err = buf ? zps_ckpt_read_record(dir, name, buf, ZPS_COORD_STATE_MAX, &len)
                      : ZPS_ENOMEM;
    Zps__JobState *st = err == ZPS_OK ? zps__job_state__unpack(NULL, len, buf) : NULL;
    free(buf);
    if (!st || st->step != step || st->n_members > ZPS_MAX_MEMBERS) {
        if (err == ZPS_OK) {
            zps_log_error("ckpt %s/%s: not a job state of step %llu", dir, name,
                          (unsigned long long)step);
        }
        if (st) {
            zps__job_state__free_unpacked(st, NULL);
        }
        return err == ZPS_OK ? ZPS_EPROTO : err;
    }
    c->job_id = st->job_id;
    // Plans made after this checkpoint and before the crash may still be
    // known to shards and workers under the next numbers: the plans of the
    // resumed run start well above them, so they supersede, never collide.
    c->gen = st->generation + ZPS_COORD_RESUME_GEN_GAP;
    c->n_members = (uint32_t)st->n_members;
    for (uint32_t i = 0; i < c->n_members; i++) {
        const Zps__Member *m = st->members[i];
        s_member *mem = &c->members[i];
        memset(mem, 0, sizeof *mem);
        mem->rank = i;
        mem->member_id = m->member_id;
        snprintf(mem->host, sizeof mem->host, "%s", m->host);
        snprintf(mem->device, sizeof mem->device, "%s", m->device);
        mem->share = m->share;
        mem->pid = m->pid;
        if (m->live) {
            zps_member_admit_active(&mem->life, step);
        } else {
            mem->life = (zps_member_life){.state = ZPS_MEMBER_GONE, .exit = ZPS_EXIT_EVICTED};
        }
        mem->has_job = true;
        mem->last_seen_ms = s_now(c);
        ZPS_ASSERT(zmq_msg_init(&mem->route) == 0); // unknown until its heartbeat
    }
    zps__job_state__free_unpacked(st, NULL);
    uint64_t tokens[ZPS_MAX_SHARDS] = {0};
    if (c->cfg.shards > 1 && zps_token_load_table(dir, tokens, c->cfg.shards) != ZPS_OK) {
        // Without them no shard can prove itself, and recovery waits.
        zps_log_error("%s/shard-tokens: missing or damaged: shards 1..%u cannot show they are "
                      "this job's, and the recovery waits for them", dir, c->cfg.shards - 1);
    }
    for (uint32_t i = 1; i < c->cfg.shards; i++) {
        c->shards[i].token = tokens[i];
    }
    zps_plan plan;
    zps_err perr = s_make_plan(c, &plan);
    zps_plans_init(&c->plans);
    if (perr == ZPS_OK) {
        (void)zps_plans_add(&c->plans, c->gen, step, &plan);
    }
    for (uint32_t i = 0; i < c->cfg.shards; i++) {
        c->shard_done[i] = step;
        c->shards[i].registered = c->shards[i].ready = i == 0;
    }
    c->steps_done = step;
    c->released = step;
    c->state = S_RECOVERING;
    c->recover_deadline_ms = s_now(c) + c->cfg.worker_timeout_ms;
    zps_log_info("job %016llx resumed at step %llu: %u members, plan %u; waiting for them",
                 (unsigned long long)c->job_id, (unsigned long long)step, c->n_members, c->gen);
    return perr;
}

// ---------------------------------------------------------------------------
// Adaptive split and speculation.

#define ZPS_COORD_ADAPT_EVERY 20   // steps between looks at the split
#define ZPS_COORD_ADAPT_GAIN 0.9   // replan only if the step gets this much shorter

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

void zps_coord_adapt(zps_coord *c)
{
    if (!c->cfg.adaptive_split || c->state != S_TRAINING || c->steps_done == 0 ||
        c->steps_done % ZPS_COORD_ADAPT_EVERY != 0) {
        return;
    }
    double thr[ZPS_MAX_MEMBERS];
    uint32_t idx[ZPS_MAX_MEMBERS], n = 0, now_share[ZPS_MAX_MEMBERS], next[ZPS_MAX_MEMBERS];
    for (uint32_t i = 0; i < c->n_members; i++) {
        zps_monitor_view v;
        const zps_plan_slice *sl = zps_plan_find(&s_newest(c)->plan, c->members[i].rank);
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
    if (n < 2 || n != s_live_flexible(c)) {
        return;
    }
    uint32_t B = 0;
    for (uint32_t i = 0; i < n; i++) {
        B += now_share[i];
    }
    s_proportional(B, thr, n, next);
    double t_now = 0, t_next = 0;
    for (uint32_t i = 0; i < n; i++) {
        t_now = fmax(t_now, now_share[i] / thr[i]);
        t_next = fmax(t_next, next[i] / thr[i]);
    }
    if (t_next > ZPS_COORD_ADAPT_GAIN * t_now) {
        return;
    }
    zps_log_info("adaptive split: predicted step %.2f -> %.2f ms; new shares by throughput",
                 t_now * 1e3, t_next * 1e3);
    for (uint32_t i = 0; i < n; i++) {
        c->members[idx[i]].adapted = next[i];
    }
    s_note_change(c); // the plan with the new shares comes at the next boundary
}

// Hands [offset, offset + count) of `step` to member `mem` as an extra of
// the plan it already has.
static void s_send_speculation(zps_coord *c, zps_outbox *out, const zps_plan_gen *g, s_member *mem,
                               uint64_t step, uint32_t offset, uint32_t count)
{
    s_extra e = {.step = step, .offset = offset, .count = count, .gen = g->gen,
                 .rank = mem->rank};
    Zps__Extra wire;
    Zps__Extra *wp = &wire;
    s_extra_to_wire(&e, &wire);
    Zps__Slice slices[ZPS_MAX_MEMBERS];
    Zps__Slice *ptrs[ZPS_MAX_MEMBERS];
    s_plan_to_wire(&g->plan, mem, slices, ptrs);
    Zps__Plan p = ZPS__PLAN__INIT;
    p.generation = g->gen; // the same plan: only the extra is new
    p.effective_step = g->effective;
    p.n_slices = g->plan.n;
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
    s_member *helpers[ZPS_MAX_MEMBERS];
    uint32_t k = 0;
    for (uint32_t i = 0; i < c->n_members; i++) {
        s_member *mem = &c->members[i];
        if (s_can_take(mem, step) && mem->rank != late_rank && helper[mem->rank]) {
            helpers[k++] = mem;
        }
    }
    k = k < count ? k : count;
    for (uint32_t i = 0; i < k; i++) {
        uint32_t lo = offset + (uint32_t)((uint64_t)count * i / k);
        uint32_t hi = offset + (uint32_t)((uint64_t)count * (i + 1) / k);
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

// ---------------------------------------------------------------------------
// The documents of --http.

// A Prometheus label value: backslash, quote and newline escaped (hosts
// and devices come from the workers).
static void s_label(FILE *f, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\' || *v == '"') {
            fputc('\\', f);
            fputc(*v, f);
        } else if (*v == '\n') {
            fputs("\\n", f);
        } else {
            fputc(*v, f);
        }
    }
}

static void s_metric_head(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void s_render_metrics(const zps_coord *c, uint64_t step, uint64_t bad, FILE *f)
{
    s_metric_head(f, "zps_steps_completed_total", "counter", "Steps completed on shard 0.");
    fprintf(f, "zps_steps_completed_total %llu\n", (unsigned long long)step);
    s_metric_head(f, "zps_steps_planned", "gauge", "Steps of the run.");
    fprintf(f, "zps_steps_planned %llu\n", (unsigned long long)c->cfg.total_steps);
    s_metric_head(f, "zps_loss", "gauge", "Mean training loss of the last step.");
    fprintf(f, "zps_loss %.6f\n", c->last_loss);
    s_metric_head(f, "zps_step_seconds_median", "gauge", "Median step time, last steps.");
    fprintf(f, "zps_step_seconds_median %.6f\n", zps_monitor_step_quantile(c->mon, 0.5) / 1e3);
    s_metric_head(f, "zps_step_seconds_p95", "gauge", "95th percentile step time, last steps.");
    fprintf(f, "zps_step_seconds_p95 %.6f\n", zps_monitor_step_quantile(c->mon, 0.95) / 1e3);
    s_metric_head(f, "zps_refused_messages_total", "counter", "Messages refused by shard 0.");
    fprintf(f, "zps_refused_messages_total %llu\n", (unsigned long long)bad);
    s_metric_head(f, "zps_evictions_total", "counter", "Workers evicted for silence.");
    fprintf(f, "zps_evictions_total %llu\n", (unsigned long long)c->evictions);
    s_metric_head(f, "zps_replans_total", "counter",
                  "Plan generations made after the first (one per step boundary at most).");
    fprintf(f, "zps_replans_total %llu\n", (unsigned long long)c->replans);
    s_metric_head(f, "zps_membership_changes_total", "counter",
                  "Joins, departures and adapted splits, gathered into those re-plans.");
    fprintf(f, "zps_membership_changes_total %llu\n", (unsigned long long)c->membership_changes);
    s_metric_head(f, "zps_test_accuracy", "gauge", "Last complete test-set evaluation.");
    fprintf(f, "zps_test_accuracy %.6f\n", c->test_accuracy);
    static const char *names[5] = {"zps_worker_lag_seconds", "zps_worker_compute_seconds",
                                   "zps_worker_samples_per_second", "zps_worker_share",
                                   "zps_worker_straggler"};
    static const char *help[5] = {"Lag behind the step's first arrival (shard 0's clock).",
                                  "Mean compute time of a step.", "Measured throughput.",
                                  "Samples of the global batch in the current plan.",
                                  "1 if flagged a straggler."};
    for (int k = 0; k < 5; k++) {
        s_metric_head(f, names[k], "gauge", help[k]);
        for (uint32_t i = 0; i < c->n_members; i++) {
            const s_member *m = &c->members[i];
            zps_monitor_view v = {0};
            if (!zps_member_live(&m->life)) {
                continue;
            }
            (void)zps_monitor_view_of(c->mon, m->rank, &v);
            const zps_plan *plan = zps_coord_plan(c);
            const zps_plan_slice *sl = plan ? zps_plan_find(plan, m->rank) : NULL;
            double value[5] = {v.lag_ms / 1e3, v.compute_ms / 1e3, v.samples_per_s,
                               sl ? sl->count : 0, v.straggler};
            fprintf(f, "%s{rank=\"%u\",host=\"", names[k], m->rank);
            s_label(f, m->host);
            fputs("\",device=\"", f);
            s_label(f, m->device);
            fprintf(f, "\"} %.6f\n", value[k]);
        }
    }
}

static json_t *s_render_status(const zps_coord *c, uint64_t step, uint64_t bad)
{
    json_t *members = json_array();
    for (uint32_t i = 0; i < c->n_members; i++) {
        const s_member *m = &c->members[i];
        zps_monitor_view v = {0};
        (void)zps_monitor_view_of(c->mon, m->rank, &v);
        const zps_plan *plan = zps_coord_plan(c);
        const zps_plan_slice *sl = plan ? zps_plan_find(plan, m->rank) : NULL;
        bool live = zps_member_live(&m->life);
        json_array_append_new(
            members,
            json_pack("{s:i, s:s, s:s, s:i, s:b, s:b, s:i, s:f, s:f, s:f, s:I}", "rank",
                      (int)m->rank, "host", m->host, "device", m->device, "pid", (int)m->pid,
                      "live", live, "straggler", v.straggler, "share",
                      sl && live ? (int)sl->count : 0, "lag_ms", (double)v.lag_ms,
                      "compute_ms", (double)v.compute_ms, "samples_per_s", v.samples_per_s,
                      "pushes", (json_int_t)m->pushes));
    }
    char job[24];
    snprintf(job, sizeof job, "%016llx", (unsigned long long)c->job_id);
    return json_pack("{s:s, s:s, s:s, s:s, s:I, s:I, s:i, s:i, s:f, s:f, s:f, s:f, s:I, s:I, "
                     "s:o}",
                     "state", s_state_name(c->state), "model", c->cfg.model, "dataset",
                     c->cfg.dataset, "job_id", job, "step",
                     (json_int_t)step, "total_steps", (json_int_t)c->cfg.total_steps,
                     "global_batch", (int)c->cfg.global_batch, "plan_generation", (int)c->gen,
                     "loss", (double)c->last_loss, "step_ms_median",
                     zps_monitor_step_quantile(c->mon, 0.5), "step_ms_p95",
                     zps_monitor_step_quantile(c->mon, 0.95), "test_accuracy",
                     c->test_accuracy, "refused_messages", (json_int_t)bad, "evictions",
                     (json_int_t)c->evictions, "members", members);
}

zps_err zps_coord_render(const zps_coord *c, uint64_t step, uint64_t bad_messages,
                         char **metrics, char **status_json)
{
    size_t len;
    *metrics = NULL;
    FILE *f = open_memstream(metrics, &len);
    if (!f) {
        return ZPS_ENOMEM;
    }
    s_render_metrics(c, step, bad_messages, f);
    if (fclose(f) != 0) {
        free(*metrics);
        *metrics = NULL;
        return ZPS_ENOMEM;
    }
    json_t *st = s_render_status(c, step, bad_messages);
    *status_json = st ? json_dumps(st, JSON_COMPACT) : NULL;
    json_decref(st);
    if (!*status_json) {
        free(*metrics);
        *metrics = NULL;
        return ZPS_ENOMEM;
    }
    return ZPS_OK;
}
