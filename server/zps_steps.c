/* zps_steps.c - a shard's steps as the loop sees them: plans taken (from
 * the coordinator's socket, or on shard 0 from the coordinator itself), a
 * push and the step boundary it may make, the end of a step (the
 * coordinator told, a checkpoint written), a rollback, and the checkpoint
 * written when a signal stops the server. The shard's numbers are
 * server/shard/zps_shard.c's, its wire is server/shard/zps_shard_io.c's. */
#include "server/zps_server_int.h"

#include "common/zps_clock.h"
#include "server/zps_late.h"

// Bucket b is updated: the step boundary if it is the step's first (the
// next step's plan goes out before its first parameters, on the same
// socket, so it arrives first), its values sent, and the step's end after
// the last.
static void s_apply(zps_server *srv, int b)
{
    if (srv->coord && zps_shard_io_between_steps(&srv->io)) {
        zps_coord_release(srv->coord, &srv->out, zps_shard_step(srv->shard) + 1);
        (void)zps_outbox_flush(&srv->out, srv->sock);
        zps_steps_sync_coord(srv);
    }
    zps_shard_io_apply(&srv->io, b);
    if (zps_shard_step_done(srv->shard)) {
        zps_steps_end(srv);
    }
}

// --clip-grad-norm: this shard's part of the step's norm, to the
// coordinator (shard 0: itself; the norm may be complete at once).
static void s_send_norm_part(zps_server *srv)
{
    zps_sumsq part;
    if (!zps_shard_norm_due(srv->shard, &part)) {
        return;
    }
    uint64_t step = zps_shard_step(srv->shard);
    if (srv->coord) {
        zps_coord_note_norm(srv->coord, &srv->out, step, &part);
        (void)zps_outbox_flush(&srv->out, srv->sock);
        zps_steps_take_norm(srv);
        return;
    }
    Zps__Header h;
    zps_register_up_header(srv, &h, ZPS__MSG_TYPE__NORM, step);
    h.n_norm_limbs = ZPS_SUMSQ_LIMBS;
    h.norm_limbs = part.limb;
    h.norm_flags = part.flags;
    (void)zps_wire_send(srv->up, NULL, &h, NULL, 0, NULL);
}

void zps_steps_clip(zps_server *srv, uint64_t step, float norm)
{
    if (zps_shard_clip(srv->shard, step, norm) != ZPS_OK) {
        zps_log_debug("the gradient norm of step %llu came again or late: ignored",
                      (unsigned long long)step);
        return;
    }
    srv->norm_wait_ms = 0;
    // One bucket updated and sent at a time, so that the workers take the
    // first while the next is computed. A rollback taken at the step
    // boundary (s_apply's first) forgets the norm: then no more is updated.
    int b;
    while ((b = zps_shard_clip_next(srv->shard)) >= 0) {
        s_apply(srv, b);
    }
}

void zps_steps_take_norm(zps_server *srv)
{
    uint64_t step;
    float norm;
    if (srv->coord && zps_coord_take_norm(srv->coord, &step, &norm)) {
        zps_steps_clip(srv, step, norm);
    }
}

void zps_steps_norm_wait(zps_server *srv, double now)
{
    if (!srv->shard || !zps_shard_norm_due(srv->shard, NULL)) {
        srv->norm_wait_ms = 0;
        return;
    }
    if (srv->norm_wait_ms == 0) {
        srv->norm_wait_ms = now;
        return;
    }
    if (now - srv->norm_wait_ms < ZPS_SERVER_NORM_RESEND_MS) {
        return;
    }
    // Bounded: said, and the part sent again (a duplicate is answered
    // with the norm, if it is out already).
    zps_log_warn("step %llu: shard %u waiting for the gradient norm from the coordinator "
                 "(%.0f s)", (unsigned long long)zps_shard_step(srv->shard), srv->o->shard,
                 (now - srv->norm_wait_ms) / 1e3);
    srv->norm_wait_ms = now;
    s_send_norm_part(srv);
}

// A counted push's timing for the coordinator: the pusher's, or from a
// host's leader each piece's, as if its member had pushed it.
static void s_note_pushers(zps_server *srv, const Zps__Header *h)
{
    double now = zps_clock_ms();
    if (h->n_host_pieces == 0) {
        // A diloco slice pushed as missing keeps its sender alive and
        // counts nothing of it.
        bool missing = zps_coord_diloco(srv->coord) && h->inner_steps == 0;
        zps_coord_note_push(srv->coord, h->step, h->rank, missing ? 0 : h->samples,
                            missing ? 0.0f : h->compute_ms, now);
    }
    for (size_t i = 0; i < h->n_host_pieces; i++) {
        const Zps__HostPiece *p = h->host_pieces[i];
        zps_coord_note_push(srv->coord, h->step, p->rank, p->samples, p->compute_ms, now);
    }
}

// The fragment a counted diloco push carried, from the range it updated
// (-1 without fragments).
static int s_fragment_pushed(const zps_server *srv, const Zps__Header *h)
{
    const zps_outer_mode *mode = &srv->o->mode;
    if (zps_outer_fragments(mode) == 1) {
        return -1;
    }
    return (int)zps_outer_fragment_at(mode, zps_shard_lo(srv->shard), zps_shard_hi(srv->shard),
                                      h->offset);
}

// A push, and what it means beyond the shard: its timing for the
// coordinator, the step boundary, the bucket's update, the end of the
// step; with --clip-grad-norm, the shard's part of the norm once its
// whole range is in.
void zps_steps_on_push(zps_server *srv, zps_wire_msg *m)
{
    double quorum_ms = srv->io.quorum_ms;
    bool was_due = zps_shard_io_started(&srv->io) && zps_shard_norm_due(srv->shard, NULL);
    int ready;
    if (srv->coord) {
        // Counted or not (a duplicate, a stale generation), a push is a sign
        // of life: its sender beats only when it has not pushed for a while.
        (void)zps_coord_heard(srv->coord, m->hdr->rank, m->hdr->member_id);
    }
    zps_err err = zps_shard_io_on_push(&srv->io, m, &ready);
    if (srv->io.quorum_ms != quorum_ms) {
        zps_timers_at(&srv->timers, srv->t_speculate, srv->io.quorum_ms); // the slices not in
    }
    if (srv->coord && err == ZPS_OK) {
        const Zps__Header *h = m->hdr;
        s_note_pushers(srv, h);
        if (h->inner_steps > 0) {
            zps_coord_note_round(srv->coord, h->step, h->rank, h->inner_steps, h->delta_norm,
                                 h->round_bytes, s_fragment_pushed(srv, h));
        }
    }
    if (err == ZPS_OK && !was_due && zps_shard_norm_due(srv->shard, NULL)) {
        s_send_norm_part(srv);
        return;
    }
    if (ready >= 0) {
        s_apply(srv, ready);
    }
}

// The end of a step: the coordinator told (shard 0: itself, and the next
// step's speculation; others: STEP_DONE), the per-rank state forgotten,
// the periodic checkpoint written.
void zps_steps_end(zps_server *srv)
{
    uint64_t step = zps_shard_step(srv->shard);
    uint32_t counted[ZPS_MAX_MEMBERS];
    for (uint32_t r = 0; r < ZPS_MAX_MEMBERS; r++) {
        counted[r] = zps_shard_counted(srv->shard, r);
    }
    float loss = zps_shard_end_step(srv->shard);
    double now = zps_clock_ms();
    if (srv->coord) {
        zps_coord_step_done(srv->coord, step, loss, now - srv->step_start_ms, counted);
        zps_coord_adapt(srv->coord);
        zps_steps_sync_coord(srv);
        zps_late_speculate_ahead(&srv->io, srv->coord, &srv->out, srv->o->speculate_after,
                                 step + 1, srv->total_steps);
        (void)zps_outbox_flush(&srv->out, srv->sock);
    } else {
        Zps__Header h;
        zps_register_up_header(srv, &h, ZPS__MSG_TYPE__STEP_DONE, step + 1);
        (void)zps_wire_send(srv->up, NULL, &h, NULL, 0, NULL);
    }
    zps_shard_io_end_step(&srv->io);
    if (srv->ckpt_every && srv->o->checkpoint_dir && (step + 1) % srv->ckpt_every == 0 &&
        zps_shard_save(srv->shard, srv->o->checkpoint_dir, 3) == ZPS_OK && srv->coord) {
        (void)zps_coord_save(srv->coord, srv->o->checkpoint_dir, step + 1);
    }
    srv->step_start_ms = now;
    zps_timers_at(&srv->timers, srv->t_stall, now + srv->o->stall_warn_ms);
    if (step + 1 == srv->total_steps && !srv->coord) {
        zps_register_linger(srv);
    }
}

void zps_steps_add_plan(zps_server *srv, uint32_t gen, uint64_t effective, const zps_plan *plan)
{
    zps_shard_add_plan(srv->shard, gen, effective, plan);
    srv->plan_gen = gen;
    zps_shard_io_plan_added(&srv->io);
}

void zps_steps_take_plan(zps_server *srv, uint32_t gen, uint64_t effective, const zps_plan *plan)
{
    zps_shard_io_start(&srv->io, srv->shard, srv->dtype);
    if (srv->wire_code) {
        (void)zps_shard_io_code(&srv->io); // without a coder (logged), answers go uncoded
    }
    srv->global_batch = plan->global_batch;
    zps_steps_add_plan(srv, gen, effective, plan);
    srv->step_start_ms = zps_clock_ms();
    zps_timers_at(&srv->timers, srv->t_stall, srv->step_start_ms + srv->o->stall_warn_ms);
}

// Shard 0 follows the coordinator's plan generations and rollbacks directly.
// Its checkpoint was restored already, before the coordinator decided the
// rollback (the restore hook, server/zps_setup.c): what is left is to
// forget the step in progress.
void zps_steps_sync_coord(zps_server *srv)
{
    uint64_t rollback;
    if (zps_coord_take_rollback(srv->coord, &rollback)) {
        zps_steps_forget(srv);
    }
    uint64_t effective;
    uint32_t gen = zps_coord_generation(srv->coord, &effective);
    if (gen == srv->plan_gen || !zps_coord_plan(srv->coord)) {
        return;
    }
    if (!zps_shard_io_started(&srv->io)) {
        zps_steps_take_plan(srv, gen, effective, zps_coord_plan(srv->coord));
    } else {
        zps_steps_add_plan(srv, gen, effective, zps_coord_plan(srv->coord));
    }
}

// Loads this shard's checkpoint of `step`; nothing changes on failure.
zps_err zps_steps_restore(zps_server *srv, uint64_t step)
{
    uint64_t loaded;
    zps_err err = srv->o->checkpoint_dir
                      ? zps_shard_restore(srv->shard, srv->o->checkpoint_dir, step, &loaded)
                      : ZPS_ENOENT;
    if (err != ZPS_OK) {
        zps_log_error("cannot roll back to step %llu: no such checkpoint in %s",
                      (unsigned long long)step,
                      srv->o->checkpoint_dir ? srv->o->checkpoint_dir : "(no --checkpoint-dir)");
    }
    return err;
}

// After a restore: the step in progress is forgotten, and replayed.
void zps_steps_forget(zps_server *srv)
{
    zps_shard_io_forget_step(&srv->io);
    zps_register_linger_stop(srv);
    srv->finished = false;
    srv->step_start_ms = zps_clock_ms();
}

// Goes back to the checkpoint of `step`: the steps after it are replayed.
zps_err zps_steps_rollback(zps_server *srv, uint64_t step)
{
    zps_err err = zps_steps_restore(srv, step);
    if (err == ZPS_OK) {
        zps_steps_forget(srv);
    }
    return err;
}

// A plan from the coordinator (PLAN or ROLLBACK) for this shard.
void zps_steps_take_wire_plan(zps_server *srv, const Zps__Plan *p)
{
    zps_plan plan = {0};
    if (zps_plan_from_wire(p->slices, p->n_slices, srv->global_batch, &plan) == ZPS_OK) {
        zps_steps_add_plan(srv, p->generation, p->effective_step, &plan);
    } else {
        zps_log_warn("ignored an inconsistent plan from the coordinator");
    }
    zps_plan_fini(&plan);
}

// The checkpoint written when stopped by a signal, if --checkpoint-dir is set.
void zps_steps_stop_checkpoint(zps_server *srv)
{
    uint64_t step = srv->shard ? zps_shard_step(srv->shard) : 0;
    if (!srv->o->checkpoint_dir || !srv->shard || step == 0) {
        zps_log_info("stopped by signal at step %llu%s", (unsigned long long)step,
                     srv->o->checkpoint_dir ? "" : " (no --checkpoint-dir: no checkpoint)");
        return;
    }
    if (!zps_shard_io_between_steps(&srv->io)) {
        zps_log_warn("stopped by signal in the middle of step %llu: no new checkpoint (the "
                     "newest periodic one stands)", (unsigned long long)step);
        return;
    }
    if (zps_shard_save(srv->shard, srv->o->checkpoint_dir, 3) == ZPS_OK &&
        (!srv->coord || zps_coord_save(srv->coord, srv->o->checkpoint_dir, step) == ZPS_OK)) {
        zps_log_info("stopped by signal: checkpoint of step %llu written to %s",
                     (unsigned long long)step, srv->o->checkpoint_dir);
    }
}
