/* zps_diloco.c - --mode diloco: the round of a job in that mode. A
 * round's own slice is handed out as inner steps, one per global batch;
 * every other piece of the round (a slice handed over by a member that
 * left) is pushed at once as missing (inner steps 0), since its member's
 * inner steps died with it. The round's buffers are zps_round.c's. */
#include "lib/zps_client_int.h"

#include <stdlib.h>
#include <string.h>

#include "common/zps_clock.h"
#include "common/zps_log.h"
#include "common/zps_wire.h"

// A diloco job's round: its ranges are the pushes of zps_push_bucket, a
// bucket cut to each shard, in the same order.
zps_err zps_diloco_take_mode(zps_client *c, const Zps__Job *job)
{
    zps_round_fini(&c->round);
    memset(&c->mode, 0, sizeof c->mode);
    memset(&c->inner, 0, sizeof c->inner);
    if (!job->outer) {
        return ZPS_OK;
    }
    c->mode = (zps_outer_mode){.diloco = true, .inner_steps = job->outer->inner_steps,
                               .auto_steps = job->outer->auto_steps,
                               .compress = (int)job->outer->compress};
    if (zps_outer_mode_check(&c->mode) != ZPS_OK || c->dtype != ZPS_DTYPE_F32) {
        zps_log_error("the coordinator sent a diloco mode this library cannot run");
        return ZPS_EPROTO;
    }
    if (job->inner && job->inner->kind > ZPS_OPTIM_ADAMW) {
        zps_log_error("the coordinator sent an inner optimizer (%u) this library does not know",
                      job->inner->kind);
        return ZPS_EPROTO;
    }
    if (job->inner) {
        const Zps__Optim *o = job->inner;
        c->inner = (zps_optim_cfg){
            .kind = (zps_optim_kind)o->kind, .lr = o->lr, .momentum = o->momentum,
            .nesterov = o->nesterov, .weight_decay = o->weight_decay, .beta1 = o->beta1,
            .beta2 = o->beta2, .eps = o->eps, .schedule = (zps_lr_schedule)o->schedule,
            .warmup_steps = o->warmup_steps, .total_steps = c->total_steps * c->mode.inner_steps,
            .step_size = o->step_size, .gamma = o->gamma};
    }
    int nb = zps_model_n_buckets(&c->model), n = 0;
    uint64_t *lo = malloc(((size_t)nb + ZPS_CONN_MAX_SHARDS) * sizeof *lo);
    uint64_t *hi = malloc(((size_t)nb + ZPS_CONN_MAX_SHARDS) * sizeof *hi);
    zps_err err = lo && hi ? ZPS_OK : ZPS_ENOMEM;
    for (int b = 0; err == ZPS_OK && b < nb; b++) {
        uint64_t blo, bhi;
        zps_model_bucket(&c->model, b, &blo, &bhi);
        for (int i = 0; i < c->conn.n_shards; i++) {
            uint64_t l = blo > c->conn.shards[i].lo ? blo : c->conn.shards[i].lo;
            uint64_t r = bhi < c->conn.shards[i].hi ? bhi : c->conn.shards[i].hi;
            if (l < r) {
                lo[n] = l;
                hi[n++] = r;
            }
        }
    }
    if (err == ZPS_OK) {
        err = zps_round_init(&c->round, c->model.n_params, c->mode.compress, lo, hi, n);
    }
    free(lo);
    free(hi);
    return err;
}

// --mode diloco: a round's own slice is handed out as inner steps, one per
// global batch; every other piece of the round (a slice handed over by a
// member that left) is pushed at once as missing (inner steps 0), since
// its member's inner steps died with it.

// The inner steps this worker takes in round t: its slice's, or the job's H.
static uint32_t s_inner_steps(const zps_client *c, uint64_t t)
{
    const zps_plan_gen *g = zps_plans_at(&c->schedule.plans, t);
    const zps_plan_slice *own = g ? zps_plan_find(&g->plan, c->conn.rank) : NULL;
    uint32_t h = own && own->inner_steps ? own->inner_steps : c->mode.inner_steps;
    return h < c->mode.inner_steps ? h : c->mode.inner_steps;
}

// Whether piece p of round t is this worker's own slice in the plan.
static bool s_is_own(const zps_client *c, uint64_t t, const zps_piece *p)
{
    const zps_plan_gen *g = zps_plans_at(&c->schedule.plans, t);
    const zps_plan_slice *own = g ? zps_plan_find(&g->plan, c->conn.rank) : NULL;
    return own && own->offset == p->offset && own->count == p->count && g->gen == p->gen;
}

// Piece p of round `step` to every shard: the round's payloads with
// `inner` inner steps (0: missing, and its payload counts for nothing).
static zps_err s_push_round(zps_client *c, uint64_t step, const zps_piece *p, uint32_t inner,
                            float loss, float compute_ms)
{
    zps_conn_outer o = {.inner_steps = inner, .compress = (uint32_t)c->mode.compress,
                        .delta_norm = (float)c->round.norm, .round_bytes = c->round.bytes};
    for (int k = 0; k < c->round.n_ranges; k++) {
        uint64_t lo = c->round.lo[k], hi = c->round.hi[k];
        int i = 0;
        while (i < c->conn.n_shards - 1 && lo >= c->conn.shards[i].hi) {
            i++;
        }
        const void *data;
        size_t len;
        zps_round_payload(&c->round, k, &data, &len);
        zps_err err = zps_conn_push_delta(&c->conn, i, step, p, lo, hi, data, len, &o, loss,
                                          compute_ms, &c->grad_ref);
        if (err != ZPS_OK) {
            return err;
        }
    }
    return ZPS_OK;
}

// Records piece p of round t as pushed: the evaluation of the round's end
// is split by the pieces pushed, as in a synchronous step.
static void s_note_done(zps_client *c, uint64_t t, const zps_piece *p)
{
    if (c->done_step != t) {
        c->done_step = t;
        c->n_done = 0;
    }
    if (c->n_done < ZPS_CLIENT_QUEUE) {
        c->done[c->n_done++] = *p;
    }
}

// A piece of round `step` that is not trained here: the own slice once
// more (refused "not yet": the same payloads again), or another member's,
// pushed as missing: with the bytes of this worker's last pseudo-gradient
// (zeros before the first), which the shard reads as zeros.
static zps_err s_push_untrained(zps_client *c, uint64_t step, const zps_piece *p)
{
    bool again = step == c->t && c->round_pushed && s_is_own(c, step, p);
    if (again) {
        zps_log_info("round %llu: the pseudo-gradient of [%u, %u) again",
                     (unsigned long long)step, p->offset, p->offset + p->count);
        return s_push_round(c, step, p, c->inner_n, (float)(c->inner_loss / c->inner_n), 0);
    }
    zps_log_warn("round %llu: slice [%u, %u) of a member that left is missing from the round "
                 "(pushed with no weight)", (unsigned long long)step, p->offset,
                 p->offset + p->count);
    s_note_done(c, step, p);
    return s_push_round(c, step, p, 0, 0, 0);
}

// The next inner step to hand out, or 0 with nothing to train (the pieces
// queued pushed, as missing or again).
int zps_diloco_hand_out(zps_client *c, zps_work *out)
{
    zps_err err = zps_wire_ref_wait(&c->grad_ref, c->timeout_ms);
    while (err == ZPS_OK && c->inner_h == c->inner_n && zps_work_queued(c)) {
        zps_piece p = c->queue[c->queue_pos++];
        uint64_t step = c->queue_step;
        if (step == c->t && !c->round_pushed && c->inner_n == 0 && s_is_own(c, step, &p)) {
            c->own = p;
            c->inner_n = s_inner_steps(c, step);
            c->inner_h = 0;
            c->inner_loss = 0;
            c->round_ms = 0;
        } else {
            err = s_push_untrained(c, step, &p);
        }
    }
    if (err != ZPS_OK) {
        return zps_work_end(c, err);
    }
    if (c->inner_h == c->inner_n) {
        return 0;
    }
    uint32_t h = c->inner_h++;
    uint64_t batch = c->t * c->mode.inner_steps + h;
    const uint32_t *idx = NULL;
    if (c->has_data &&
        !(idx = zps_sampler_slice(&c->sampler, batch, c->own.offset, c->own.count))) {
        return zps_work_end(c, ZPS_EINVAL);
    }
    c->cur_step = c->t;
    c->cur_work = c->own;
    c->push_err = ZPS_OK;
    c->skip = false;
    c->handed = true;
    c->step_t0 = zps_clock_ms();
    *out = (zps_work){.kind = ZPS_WORK_TRAIN, .id = ++c->work_id, .step = batch,
                      .epoch = batch / c->steps_per_epoch, .offset = c->own.offset,
                      .count = c->own.count, .indices = idx, .inner = h,
                      .inner_steps = c->inner_n, .round = c->t};
    return ZPS_NEXT_WORK;
}

zps_err zps_inner_done(zps_client *c, const zps_work *w, float loss)
{
    if (!zps_work_is_current(c, w, ZPS_WORK_TRAIN)) {
        return ZPS_EINVAL;
    }
    if (!c->mode.diloco || w->inner != c->inner_h - 1 || c->inner_taken == w->id) {
        return zps_client_einval(
            c, !c->mode.diloco ? "not a diloco job: zps_push_bucket, zps_work_done"
               : c->inner_taken == w->id ? "this inner step is done already"
                                         : "not the inner step handed out last");
    }
    c->inner_taken = w->id;
    double ms = zps_clock_ms() - c->step_t0 - w->data_ms;
    c->inner_loss += loss;
    c->round_ms += ms;
    c->sum_data_ms += w->data_ms;
    c->sum_compute_ms += ms;
    if (c->inner_h < c->inner_n) {
        return ZPS_OK;
    }
    // The round's last inner step: its pseudo-gradient, once ZeroMQ has
    // let go of the payloads of the pushes before.
    zps_err err = zps_wire_ref_wait(&c->grad_ref, c->timeout_ms);
    if (err == ZPS_OK) {
        err = zps_round_delta(&c->round, c->params);
    }
    if (err == ZPS_OK) {
        err = s_push_round(c, c->t, &c->own, c->inner_n, (float)(c->inner_loss / c->inner_n),
                           (float)c->round_ms);
    }
    c->round_pushed = true;
    s_note_done(c, c->t, &c->own);
    c->push_err = err;
    return err == ZPS_OK ? ZPS_OK : zps_client_fail(c, err);
}
