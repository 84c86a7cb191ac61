/* zps_coord_recover.c - shards registering, restarting, and rolling everyone back. */
#include "zps_coord_int.h"

#include <string.h>

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
    zps_plans_clear_handed(&c->plans);
    zps_coord_norm_forget_from(c, step);
    for (uint32_t i = 0; i < c->cfg.shards; i++) {
        c->shard_done[i] = step;
    }
    c->steps_done = step;
    c->released = step;
    c->state = ZPS_COORD_TRAINING;
    if (!zps_coord_commit(c, step)) {
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
    zps_coord_broadcast(c, out, ZPS__MSG_TYPE__ROLLBACK, step);
    zps_coord_send_new_jobs(c, out);
    return ZPS_OK;
}

// Live members here: those of before that called back, and workers
// admitted since the restart; and whether one of before has not.
static uint32_t s_present(const zps_coord *c, bool *missing)
{
    uint32_t n = 0;
    *missing = false;
    for (uint32_t i = 0; i < c->n_members; i++) {
        const zps_coord_member *mem = &c->members[i];
        if (zps_member_live(&mem->life)) {
            n += mem->route_known;
            *missing = *missing || !mem->route_known;
        }
    }
    return n;
}

// RECOVERING: once every shard is back and every live worker called back,
// or the ones here make --workers (workers of a requeued job are new
// processes: the members of before will not call back), or the wait ran
// out, the silent ones are evicted and everyone rolls back to the
// restored step, starting there together.
void zps_coord_try_recover(zps_coord *c, zps_outbox *out, bool deadline_passed)
{
    if (c->state != ZPS_COORD_RECOVERING) {
        return;
    }
    for (uint32_t i = 1; i < c->cfg.shards; i++) {
        if (!c->shards[i].registered) {
            return; // no step can complete without it
        }
    }
    bool missing;
    uint32_t present = s_present(c, &missing);
    if (missing && !deadline_passed && present < c->cfg.workers) {
        return;
    }
    for (uint32_t i = 0; i < c->n_members; i++) {
        zps_coord_member *mem = &c->members[i];
        if (zps_member_live(&mem->life) && !mem->route_known) {
            (void)zps_member_depart(&mem->life, ZPS_EXIT_EVICTED);
            zps_member_retire(&mem->life);
            c->evictions++;
            zps_log_warn("rank %u (%s) did not come back after the restart: evicted (%s)",
                         mem->rank, mem->host,
                         deadline_passed ? "the wait ran out" : "the workers here make --workers");
        }
    }
    if (s_rollback(c, out, c->steps_done, 0) != ZPS_OK) {
        zps_log_error("cannot roll back to the restored step %llu; still recovering",
                      (unsigned long long)c->steps_done);
        return;
    }
    // This start trains from here: its time and steps count from now.
    c->started_ms = zps_coord_now(c);
    c->started_step = c->steps_done;
    c->next_log_ms = c->started_ms + ZPS_COORD_PROGRESS_MS;
}

// The key a shard listens with, if it says (40 characters of Z85): workers
// connect to it with that key instead of shard 0's. And its host, which a
// worker's host leader compares with its own.
static void s_take_key_and_host(zps_coord *c, zps_coord_peer *sp, const Zps__Register *r)
{
    zps_coord_take_boot_id(c, sp->boot_id, r->boot_id, "a shard's REGISTER");
    size_t len = r->public_key ? strlen(r->public_key) : 0;
    bool z85 = len == sizeof sp->public_key - 1 &&
               strspn(r->public_key, "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRST"
                                     "UVWXYZ.-:+=^!/*?&<>()[]{}@%$#") == len;
    snprintf(sp->public_key, sizeof sp->public_key, "%s", z85 ? r->public_key : "");
}

// A shard registers again while training: it crashed and restarted. It
// gets its assignment again and says which step it restored (READY).
static zps_err s_shard_restarted(zps_coord *c, zps_outbox *out, zps_wire_msg *m, zps_coord_peer *sp)
{
    const Zps__Register *r = m->hdr->registration;
    zps_wire_route_close(&sp->route);
    zps_wire_route_copy(&sp->route, &m->route);
    snprintf(sp->endpoint, sizeof sp->endpoint, "%s", r->endpoint);
    s_take_key_and_host(c, sp, r);
    sp->ready = false;
    zps_log_warn("shard %u at %s restarted%s; assigning its range again", r->index, sp->endpoint,
                 r->resume ? " from its checkpoint" : " without --resume");
    zps_coord_send_job(c, out, &sp->route, ZPS__MSG_TYPE__ASSIGN, NULL, sp->token);
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
        zps_coord_refuse(c, out, m, ZPS_EINVAL, why);
        return ZPS_EINVAL;
    }
    zps_coord_peer *sp = &c->shards[r->index];
    if (r->serving) {
        // A shard saying where it is, every few seconds: after a restart of
        // the coordinator, this is how it finds its shards again.
        if (c->state == ZPS_COORD_RECOVERING && !sp->registered) {
            zps_wire_route_copy(&sp->route, &m->route);
            snprintf(sp->endpoint, sizeof sp->endpoint, "%s", r->endpoint);
            s_take_key_and_host(c, sp, r);
            sp->registered = sp->ready = true;
            zps_log_info("shard %u at %s is back", r->index, sp->endpoint);
            zps_coord_try_recover(c, out, false);
        }
        return ZPS_OK;
    }
    if (c->state == ZPS_COORD_TRAINING && sp->registered) {
        return s_shard_restarted(c, out, m, sp);
    }
    if (c->state != ZPS_COORD_WAITING) {
        zps_coord_refuse(c, out, m, ZPS_ESTATE, "the job has started; shards cannot join it yet");
        return ZPS_ESTATE;
    }
    if (sp->registered) {
        zps_wire_route_close(&sp->route); // a restart before the job started: take the new one
    } else {
        c->n_registered++;
    }
    sp->registered = true;
    snprintf(sp->endpoint, sizeof sp->endpoint, "%s", r->endpoint);
    s_take_key_and_host(c, sp, r);
    zps_wire_route_copy(&sp->route, &m->route);
    zps_log_info("shard %u at %s registered: [%llu, %llu) (%u of %u shards)", r->index,
                 sp->endpoint, (unsigned long long)sp->lo, (unsigned long long)sp->hi,
                 c->n_registered, c->cfg.shards);
    return zps_coord_start(c, out);
}

zps_err zps_coord_on_ready(zps_coord *c, zps_outbox *out, zps_wire_msg *m)
{
    uint32_t i = m->hdr->shard;
    if (c->state == ZPS_COORD_TRAINING && i > 0 && i < c->cfg.shards && !c->shards[i].ready) {
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
    if (c->state != ZPS_COORD_ASSIGNING || i == 0 || i >= c->cfg.shards || c->shards[i].ready) {
        zps_log_warn("dropped an unexpected READY from shard %u", i);
        return ZPS_ESTATE;
    }
    c->shards[i].ready = true;
    if (++c->n_ready == c->cfg.shards) {
        zps_coord_start_workers(c, out);
    }
    return ZPS_OK;
}


