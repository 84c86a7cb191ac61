/* zps_diloco.c - --mode diloco: the round of a job in that mode. A
 * round's own slice is handed out as inner steps, one per global batch;
 * every other piece of the round (a slice handed over by a member that
 * left) is pushed at once as missing (inner steps 0), since its member's
 * inner steps died with it. The round's buffers are zps_round.c's.
 *
 * With --fragments a step is a part of a round and pushes one fragment;
 * with --overlap the push of step t waits for the parameters of step t,
 * taken after step t's inner steps, and merges them into what the
 * fragment trained since (docs/diloco.md). */
#include "lib/zps_client_int.h"

#include <stdlib.h>
#include <string.h>

#include "common/zps_clock.h"
#include "common/zps_log.h"
#include "common/zps_wire.h"

// With fragments, each shard's buckets are cut where a fragment ends, as
// the shard cuts its own (server/shard/zps_shard.c).
static zps_err s_cut_shard_buckets(zps_client *c)
{
    for (int i = 0; zps_outer_fragments(&c->mode) > 1 && i < c->conn.n_shards; i++) {
        zps_conn_shard *sc = &c->conn.shards[i];
        zps_bucket whole[ZPS_MODEL_MAX_BUCKETS];
        memcpy(whole, sc->buckets, (size_t)sc->n_buckets * sizeof *whole);
        int n = zps_outer_cut_buckets(&c->mode, sc->lo, sc->hi, whole, sc->n_buckets,
                                      sc->buckets, ZPS_MODEL_MAX_BUCKETS);
        if (n < 0) {
            zps_log_error("shard %d: its buckets cut into %u fragments are more than %d", i,
                          c->mode.fragments, ZPS_MODEL_MAX_BUCKETS);
            return ZPS_EPROTO;
        }
        sc->n_buckets = n;
    }
    return ZPS_OK;
}

// The round's ranges, the pushes of zps_push_bucket: a bucket cut to each
// shard (and there, with fragments, to each fragment), in the same order.
static zps_err s_round_init(zps_client *c)
{
    int nb = zps_model_n_buckets(&c->model), n = 0;
    // A bucket cut to the shards makes at most one range more per shard
    // boundary, and each cut of a fragment one more again.
    size_t max = (size_t)nb + (size_t)c->conn.n_shards * zps_outer_fragments(&c->mode);
    uint64_t *lo = malloc(max * sizeof *lo), *hi = malloc(max * sizeof *hi);
    uint8_t *frag = malloc(max);
    zps_err err = lo && hi && frag ? ZPS_OK : ZPS_ENOMEM;
    for (int b = 0; err == ZPS_OK && b < nb; b++) {
        uint64_t blo, bhi;
        zps_model_bucket(&c->model, b, &blo, &bhi);
        for (int i = 0; i < c->conn.n_shards; i++) {
            const zps_conn_shard *sc = &c->conn.shards[i];
            zps_bucket cut = {blo > sc->lo ? blo : sc->lo, bhi < sc->hi ? bhi : sc->hi};
            zps_bucket out[ZPS_OUTER_MAX_FRAGMENTS];
            int k = cut.lo < cut.hi ? zps_outer_cut_buckets(&c->mode, sc->lo, sc->hi, &cut, 1,
                                                            out, ZPS_OUTER_MAX_FRAGMENTS)
                                    : 0;
            for (int j = 0; j < k; j++, n++) {
                lo[n] = out[j].lo;
                hi[n] = out[j].hi;
                frag[n] = (uint8_t)zps_outer_fragment_at(&c->mode, sc->lo, sc->hi, out[j].lo);
            }
        }
    }
    if (err == ZPS_OK) {
        err = zps_round_init(&c->round, c->model.n_params, c->mode.compress, lo, hi, frag, n);
    }
    // A worker's own parameters differ from the global ones between
    // exchanges with fragments or overlap: they are kept aside while the
    // global ones are evaluated, and overlap keeps each fragment's as pushed.
    bool own = zps_outer_fragments(&c->mode) > 1 || c->mode.overlap;
    if (err == ZPS_OK && own &&
        (!(c->local = malloc(c->model.n_params * sizeof(float))) ||
         (c->mode.overlap && !(c->pushed_at = malloc(c->model.n_params * sizeof(float)))))) {
        zps_log_error("diloco: cannot allocate %zu floats for the worker's own parameters",
                      c->model.n_params);
        err = ZPS_ENOMEM;
    }
    free(lo);
    free(hi);
    free(frag);
    return err;
}

// A diloco job's mode, inner optimizer and round.
zps_err zps_diloco_take_mode(zps_client *c, const Zps__Job *job)
{
    zps_round_fini(&c->round);
    free(c->local);
    free(c->pushed_at);
    c->local = c->pushed_at = NULL;
    c->owed = false;
    c->n_deferred = 0;
    c->own_pushed = UINT64_MAX;
    memset(&c->mode, 0, sizeof c->mode);
    memset(&c->inner, 0, sizeof c->inner);
    if (!job->outer) {
        return ZPS_OK;
    }
    c->mode = (zps_outer_mode){.diloco = true, .inner_steps = job->outer->inner_steps,
                               .auto_steps = job->outer->auto_steps,
                               .compress = (int)job->outer->compress,
                               .fragments = job->outer->fragments,
                               .overlap = job->outer->overlap};
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
            .warmup_steps = o->warmup_steps,
            .total_steps = zps_outer_step_batch(&c->mode, c->total_steps),
            .step_size = o->step_size, .gamma = o->gamma};
    }
    zps_err err = s_cut_shard_buckets(c);
    return err == ZPS_OK ? s_round_init(c) : err;
}

// The fragment step t exchanges, as zps_round_begin and zps_round_delta
// take it: ZPS_ROUND_ALL without fragments (every range, in one pass).
static int s_fragment(const zps_client *c, uint64_t t)
{
    return zps_outer_fragments(&c->mode) > 1 ? (int)zps_outer_fragment_of_step(&c->mode, t)
                                             : ZPS_ROUND_ALL;
}

// --mode diloco: a round's own slice is handed out as inner steps, one per
// global batch; every other piece of the round (a slice handed over by a
// member that left) is pushed at once as missing (inner steps 0), since
// its member's inner steps died with it.

// The inner steps this worker takes in step t: its slice's share of the
// step's global batches, H_i of H (H_i: its slice's per round, or H), at
// least 1; without fragments, H_i.
static uint32_t s_inner_steps(const zps_client *c, uint64_t t)
{
    const zps_plan_gen *g = zps_plans_at(&c->schedule.plans, t);
    const zps_plan_slice *own = g ? zps_plan_find(&g->plan, c->conn.rank) : NULL;
    uint64_t H = c->mode.inner_steps;
    uint64_t h = own && own->inner_steps && own->inner_steps < H ? own->inner_steps : H;
    h = h * zps_outer_step_batches(&c->mode, t) / H;
    return h > 0 ? (uint32_t)h : 1;
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
                        .delta_norm = (float)c->round.norm,
                        .round_bytes = zps_round_bytes(&c->round, s_fragment(c, step))};
    for (int k = 0; k < c->round.n_ranges; k++) {
        if (!zps_round_has(&c->round, k, s_fragment(c, step))) {
            continue;
        }
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
    bool again = step == c->own_pushed && s_is_own(c, step, p);
    if (again) {
        zps_log_info("round %llu: the pseudo-gradient of [%u, %u) again",
                     (unsigned long long)step, p->offset, p->offset + p->count);
        return s_push_round(c, step, p, c->pushed_inner, (float)(c->inner_loss / c->inner_n), 0);
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
        } else if (c->owed && step == c->t && c->n_deferred < ZPS_CLIENT_QUEUE) {
            c->deferred[c->n_deferred++] = p; // --overlap: the shards may still be at t - 1
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
    uint64_t batch = zps_outer_step_batch(&c->mode, c->t) + h;
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

// Every fragment has trained the step's inner steps, and their compute.
static void s_add_step(zps_client *c)
{
    for (uint32_t g = 0; g < zps_outer_fragments(&c->mode); g++) {
        c->frag_inner[g] += c->inner_n;
        c->frag_ms[g] += c->round_ms;
    }
}

// The step's inner steps are done: every fragment has them, and the one
// the step exchanges pushes all it has had since its last exchange
// (pushed_inner); returns their compute time and starts that count over.
// The count a push carries is at most H, the shards' bound (a fragment
// may have trained more: with --overlap, steps whose slice moved go out
// with the next exchange); its pseudo-gradient is all of it.
static double s_count_fragment(zps_client *c)
{
    uint32_t f = zps_outer_fragment_of_step(&c->mode, c->t);
    s_add_step(c);
    double ms = c->frag_ms[f];
    c->pushed_inner = c->frag_inner[f] < c->mode.inner_steps ? c->frag_inner[f]
                                                             : c->mode.inner_steps;
    c->frag_inner[f] = 0;
    c->frag_ms[f] = 0;
    return ms;
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
    c->inner_done = true;
    if (c->mode.overlap) {
        return ZPS_OK; // pushed by the loop, once the owed parameters are merged
    }
    zps_err err = zps_diloco_push_own(c);
    c->push_err = err;
    return err == ZPS_OK ? ZPS_OK : zps_client_fail(c, err);
}

// --overlap: fragment f's values as of its push (from, in its ranges),
// which its merge measures what it trained since against.
static void s_keep_pushed(zps_client *c, int f, const float *from)
{
    for (int k = 0; c->pushed_at && k < c->round.n_ranges; k++) {
        if (zps_round_has(&c->round, k, f)) {
            uint64_t lo = c->round.lo[k];
            memcpy(c->pushed_at + lo, from + lo, (c->round.hi[k] - lo) * sizeof(float));
        }
    }
}

// --overlap: the step's inner steps began before its plan was known here.
// A new plan that keeps this worker's slice (new inner step counts of
// auto) only renews the generation the push carries. If it gives this
// worker another slice of step t (a member left or joined), what it
// trained is not that slice's: the slice is pushed as missing, and the
// inner steps stay in the fragments' own values, to go out with their
// next exchange. True if so.
static bool s_slice_moved(zps_client *c, zps_err *err)
{
    const zps_plan_gen *g = zps_plans_at(&c->schedule.plans, c->t);
    const zps_plan_slice *now = g ? zps_plan_find(&g->plan, c->conn.rank) : NULL;
    if (!c->mode.overlap || s_is_own(c, c->t, &c->own)) {
        return false;
    }
    if (now && now->offset == c->own.offset && now->count == c->own.count) {
        c->own.gen = g->gen;
        return false;
    }
    zps_log_warn("step %llu: the plan changed during its inner steps; they go out with the "
                 "next exchange of each fragment", (unsigned long long)c->t);
    s_add_step(c);
    // Nothing of the fragment went out: the merge of its owed values keeps
    // all it trained since theta_sync, as if pushed at theta_sync.
    s_keep_pushed(c, s_fragment(c, c->t), c->round.sync);
    c->round_pushed = true;
    *err = ZPS_OK;
    if (now) {
        zps_piece p = {.offset = now->offset, .count = now->count, .gen = g->gen};
        s_note_done(c, c->t, &p);
        *err = s_push_round(c, c->t, &p, 0, 0, 0);
    }
    return true;
}

zps_err zps_diloco_push_own(zps_client *c)
{
    zps_err err;
    if (s_slice_moved(c, &err)) {
        return err == ZPS_OK ? zps_diloco_push_deferred(c) : err;
    }
    // The pseudo-gradient of the fragment the step exchanges (of every
    // range, without fragments), once ZeroMQ has let go of the payloads of
    // the pushes before.
    double frag_ms = s_count_fragment(c);
    int f = s_fragment(c, c->t);
    err = zps_wire_ref_wait(&c->grad_ref, c->timeout_ms);
    if (err == ZPS_OK) {
        err = zps_round_delta(&c->round, c->params, f);
    }
    if (err == ZPS_OK) {
        err = s_push_round(c, c->t, &c->own, c->pushed_inner,
                           (float)(c->inner_loss / c->inner_n), (float)frag_ms);
    }
    c->round_pushed = true;
    c->own_pushed = c->t;
    s_note_done(c, c->t, &c->own);
    s_keep_pushed(c, f, c->params);
    return err == ZPS_OK ? zps_diloco_push_deferred(c) : err;
}

bool zps_diloco_overlaps(const zps_client *c)
{
    return c->mode.diloco && c->mode.overlap;
}

zps_err zps_diloco_push_deferred(zps_client *c)
{
    zps_err err = ZPS_OK;
    for (int i = 0; err == ZPS_OK && i < c->n_deferred; i++) {
        err = s_push_untrained(c, c->t, &c->deferred[i]);
    }
    c->n_deferred = 0;
    return err;
}

void zps_diloco_defer_handed(zps_client *c, uint64_t step)
{
    // Only in that wait: a rollback's, which also starts at t, drops what
    // is deferred, and its step takes its handed slices from the schedule.
    if (c->mode.diloco && c->phase == ZPS_PHASE_WAIT && c->after == ZPS_AFTER_OVERLAP &&
        step == c->t) {
        c->n_deferred += zps_schedule_take_extras(&c->schedule, step, c->deferred + c->n_deferred,
                                                  ZPS_CLIENT_QUEUE - c->n_deferred);
    }
}

// The fragment whose parameters the overlap's wait at step t takes: that
// of step t - 1 (every range without fragments).
static int s_owed_fragment(const zps_client *c)
{
    return s_fragment(c, c->t - 1);
}

void zps_diloco_overlap_begin(zps_client *c)
{
    int f = s_owed_fragment(c);
    for (int k = 0; k < c->round.n_ranges; k++) {
        if (zps_round_has(&c->round, k, f)) {
            for (uint64_t x = c->round.lo[k]; x < c->round.hi[k]; x++) {
                c->local[x] = c->params[x] - c->pushed_at[x];
            }
        }
    }
}

// --overlap: the owed parameters of fragment f are in params: they become
// theta_sync, and the fragment trains on from them with what it trained
// since its push.
static void s_merge(zps_client *c)
{
    int f = s_owed_fragment(c);
    zps_round_begin(&c->round, c->params, f);
    for (int k = 0; k < c->round.n_ranges; k++) {
        if (zps_round_has(&c->round, k, f)) {
            for (uint64_t x = c->round.lo[k]; x < c->round.hi[k]; x++) {
                c->params[x] += c->local[x];
            }
        }
    }
    // The delay: the inner steps trained between the push and the merge.
    uint32_t delay = c->t < c->total_steps ? c->inner_n : 0;
    if (delay > c->delay_max) {
        c->delay_max = delay;
        zps_log_info("overlap: step %llu's fragment merged %u inner steps after its push, the "
                     "most so far (bound %u)", (unsigned long long)c->t - 1, delay,
                     (c->mode.inner_steps + zps_outer_fragments(&c->mode) - 1) /
                         zps_outer_fragments(&c->mode));
    }
}

zps_bucket_set zps_diloco_not_awaited(const zps_client *c, int i, zps_client_after after,
                                      uint64_t step)
{
    zps_bucket_set idle = {0};
    if (!c->mode.diloco || zps_outer_fragments(&c->mode) == 1 || step == 0 ||
        (after != ZPS_AFTER_STEP && after != ZPS_AFTER_OVERLAP)) {
        return idle;
    }
    const zps_conn_shard *sc = &c->conn.shards[i];
    uint32_t f = zps_outer_fragment_of_step(&c->mode, step - 1);
    for (int b = 0; b < sc->n_buckets; b++) {
        if (zps_outer_fragment_at(&c->mode, sc->lo, sc->hi, sc->buckets[b].lo) != f) {
            zps_bucket_set_add(&idle, b);
        }
    }
    return idle;
}

void zps_diloco_params_in(zps_client *c, zps_client_after after)
{
    if (!c->mode.diloco) {
        return;
    }
    if (after == ZPS_AFTER_OVERLAP) {
        s_merge(c);
        c->owed = false;
        return;
    }
    if (after != ZPS_AFTER_STEP) {
        // Joined, gone back or admitted anew: every fragment starts over here.
        memset(c->frag_inner, 0, sizeof c->frag_inner);
        memset(c->frag_ms, 0, sizeof c->frag_ms);
        c->owed = false;
        c->n_deferred = 0;
        c->own_pushed = UINT64_MAX;
    }
    zps_round_begin(&c->round, c->params,
                    after == ZPS_AFTER_STEP ? s_fragment(c, c->t) : ZPS_ROUND_ALL);
}

void zps_diloco_eval_begin(zps_client *c)
{
    if (c->local) {
        memcpy(c->local, c->params, c->model.n_params * sizeof(float));
        memcpy(c->params, c->round.sync, c->model.n_params * sizeof(float));
    }
}

void zps_diloco_eval_end(zps_client *c)
{
    if (c->local) {
        memcpy(c->params, c->local, c->model.n_params * sizeof(float));
    }
}

void zps_diloco_finish(zps_client *c)
{
    if (c->local) {
        memcpy(c->params, c->round.sync, c->model.n_params * sizeof(float));
    }
}
