/* zps_coord.c - the coordinator object: its life, its clock, refusals, its
 * state for the message table, and what the loop tells it of pushes and of
 * the shards' steps. The bottom of the coordinator's files: any of them may
 * call these, and these call none of them (zps_coord_int.h). */
#include "zps_coord_int.h"

#include <stdlib.h>

#include "common/zps_clock.h"
#include "server/zps_msgtab.h"
#include "server/zps_token.h"

// The coordinator's clock: the monotonic one, or the test's (cfg.clock_ms).
double zps_coord_now(const zps_coord *c)
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
    if (zps_shm_boot_id(c->shards[0].boot_id) != ZPS_OK) {
        c->shards[0].boot_id[0] = '\0'; // unknown: leaders push to it as to another host's
    }
    c->shards[0].registered = c->shards[0].ready = true;
    c->n_registered = c->n_ready = 1;
    if (!(c->eval = zps_eval_new(cfg->n_test, cfg->metrics))) {
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
    zps_eval_destroy(&c->eval);
    zps_plans_fini(&c->plans);
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
    return c->state == ZPS_COORD_WAITING || !g ? NULL : &g->plan;
}

bool zps_coord_finished(const zps_coord *c)
{
    if (c->state != ZPS_COORD_DONE) {
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

const char *zps_coord_member_device(const zps_coord *c, uint32_t rank)
{
    return rank < c->n_members ? c->members[rank].device : "?";
}

void zps_coord_refuse(zps_coord *c, zps_outbox *out, zps_wire_msg *m, zps_err err,
                      const char *why)
{
    uint64_t left_out;
    // Anyone may send a HELLO or a REGISTER: their refusals must not flood the log.
    if (zps_log_limit_pass(&c->refusals, zps_coord_now(c), &left_out)) {
        zps_log_warn("refused a %s from %s: %s%s", zps_wire_type_name(m->hdr ? (int)m->hdr->type : -1),
                     m->peer[0] ? m->peer : "?", why,
                     left_out ? " (and more refusals, not logged)" : "");
    }
    (void)zps_outbox_add_error(out, &m->route, c->job_id, c->steps_done, err, why);
}

uint32_t zps_coord_at(const zps_coord *c)
{
    static const uint32_t at[] = {[ZPS_COORD_WAITING] = ZPS_AT_WAITING,
                                  [ZPS_COORD_ASSIGNING] = ZPS_AT_ASSIGNING,
                                  [ZPS_COORD_TRAINING] = ZPS_AT_TRAINING,
                                  [ZPS_COORD_DONE] = ZPS_AT_DONE,
                                  [ZPS_COORD_RECOVERING] = ZPS_AT_RECOVERING};
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
    return index > 0 && index < c->cfg.shards && c->state != ZPS_COORD_WAITING;
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


bool zps_coord_take_rollback(zps_coord *c, uint64_t *step)
{
    if (!c->rollback_pending) {
        return false;
    }
    c->rollback_pending = false;
    *step = c->rollback_step;
    return true;
}

zps_err zps_coord_on_step_done(zps_coord *c, const zps_wire_msg *m)
{
    uint32_t shard = m->hdr->shard;
    uint64_t done = m->hdr->step;
    if (c->state == ZPS_COORD_RECOVERING) {
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

zps_err zps_coord_on_eval(zps_coord *c, const zps_wire_msg *m)
{
    return zps_eval_take(c->eval, m->hdr->eval);
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

uint64_t zps_coord_epoch(const zps_coord *c, uint64_t step)
{
    uint64_t batch = c->cfg.mode.diloco ? zps_outer_step_batch(&c->cfg.mode, step) : step;
    return c->cfg.steps_per_epoch ? batch / c->cfg.steps_per_epoch : 0;
}

void zps_coord_note_round(zps_coord *c, uint64_t step, uint32_t rank, uint32_t inner_steps,
                          float delta_norm, uint64_t bytes, int fragment)
{
    zps_monitor_round(c->mon, step, rank, inner_steps, delta_norm, bytes, fragment);
}

bool zps_coord_diloco(const zps_coord *c)
{
    return c->cfg.mode.diloco;
}
