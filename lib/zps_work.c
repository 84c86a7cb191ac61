/* zps_work.c - the work loop turned inside out: what zps-worker's loop
 * did between two computes is a phase of zps_next_work, which returns
 * whenever the caller has something to compute and picks up where it left
 * off on the next call. Here: the phases, the pieces handed out and their
 * outcome (zps_work_start, zps_push_bucket, zps_work_done), the loop's end. */
#include "lib/zps_client_int.h"

#include <stdio.h>

#include "common/zps_clock.h"
#include "common/zps_log.h"
#include "common/zps_wire.h"

// Ends the loop for err: stopped, over, or failed (logged as the step's).
int zps_work_end(zps_client *c, zps_err err)
{
    c->phase = ZPS_PHASE_OVER;
    c->handed = false;
    if (c->conn.stop) {
        if (c->training) {
            zps_log_info("stopped by signal at step %llu: leaving the job",
                         (unsigned long long)c->t);
        }
        c->stopped_at = c->training ? c->t : 0;
        zps_client_fail(c, ZPS_ECLOSED);
        return ZPS_NEXT_STOPPED;
    }
    if (c->job_over) {
        zps_client_fail(c, ZPS_ECLOSED);
        return ZPS_NEXT_OVER;
    }
    if (c->training) {
        zps_log_error("step %llu failed: %s", (unsigned long long)c->t, zps_strerror(err));
    }
    zps_client_fail(c, err);
    return ZPS_NEXT_ERROR;
}

// Queues the pieces of step - 1 handed to this worker (or refused "not
// yet"): computed at once, on the parameters of step - 1, which stay in
// place until the wait is over.
void zps_work_queue_extras(zps_client *c, uint64_t step)
{
    if (step == 0) {
        return;
    }
    if (c->queue_pos >= c->n_queue) {
        c->n_queue = c->queue_pos = 0;
    }
    c->queue_step = step - 1;
    c->n_queue += zps_schedule_take_extras(&c->schedule, step - 1, c->queue + c->n_queue,
                                           ZPS_CLIENT_QUEUE - c->n_queue);
    zps_diloco_defer_handed(c, step);
}

bool zps_work_queued(const zps_client *c)
{
    return c->queue_pos < c->n_queue;
}

// Pushes [lo, hi) of grad, of the piece handed out, to shard i.
static zps_err s_push(zps_client *c, int i, uint64_t lo, uint64_t hi, const float *grad,
                      float loss, double data_ms)
{
    return zps_host_push(c, i, &c->cur_work, lo, hi, grad, loss, (float)data_ms,
                         (float)(zps_clock_ms() - c->step_t0 - data_ms));
}

// One line for benchmarks: where a step's time went, on this worker.
static void s_log_timing(const zps_client *c, double wall_ms)
{
    double n = c->timed_steps ? (double)c->timed_steps : 1.0;
    double step = wall_ms / n;
    zps_log_info("timing: %.3f ms/step over %llu steps: data %.3f, compute %.3f, "
                 "push and wait for parameters %.3f ms (%.1f%% of the step)",
                 step, (unsigned long long)c->timed_steps, c->sum_data_ms / n,
                 c->sum_compute_ms / n, c->sum_wait_ms / n,
                 step > 0 ? 100.0 * c->sum_wait_ms / n / step : 0.0);
}

// Hands out the next queued piece.
static int s_hand_out(zps_client *c, zps_work *out)
{
    if (c->mode.diloco) {
        return zps_diloco_hand_out(c, out);
    }
    zps_piece p = c->queue[c->queue_pos++];
    uint64_t step = c->queue_step;
    // ZeroMQ may still hold the last push's frames of the gradient buffer.
    zps_err err = zps_wire_ref_wait(&c->grad_ref, c->timeout_ms);
    if (err != ZPS_OK) {
        return zps_work_end(c, err);
    }
    const uint32_t *idx = NULL;
    if (c->has_data && !(idx = zps_sampler_slice(&c->sampler, step, p.offset, p.count))) {
        return zps_work_end(c, ZPS_EINVAL);
    }
    c->cur_step = step;
    c->cur_work = p;
    c->push_err = ZPS_OK;
    c->skip = false;
    c->handed = true;
    c->step_t0 = zps_clock_ms();
    *out = (zps_work){.kind = ZPS_WORK_TRAIN, .id = ++c->work_id, .step = step,
                      .epoch = step / c->steps_per_epoch, .offset = p.offset, .count = p.count,
                      .indices = idx};
    return ZPS_NEXT_WORK;
}

// Starts waiting for `step`'s parameters (asking for them first if pull).
static zps_err s_start_wait(zps_client *c, uint64_t step, zps_client_after after, bool pull)
{
    c->phase = ZPS_PHASE_WAIT;
    c->after = after;
    c->wait_step = step;
    c->wait_begun = false;
    c->n_queue = c->queue_pos = 0;
    return pull ? zps_wait_pull(c, step) : ZPS_OK;
}

// The wait for parameters ended with err. Returns 0 to go on, or what
// zps_next_work returns.
static int s_wait_over(zps_client *c, zps_err err)
{
    c->wait_begun = false;
    c->n_queue = c->queue_pos = 0;
    if (c->after == ZPS_AFTER_STEP || c->after == ZPS_AFTER_OVERLAP) {
        c->sum_wait_ms += zps_clock_ms() - c->t2;
        c->timed_steps++;
    }
    if (err == ZPS_EAGAIN) {
        c->phase = ZPS_PHASE_START_OVER;
        return 0;
    }
    if (err != ZPS_OK) {
        return zps_work_end(c, err);
    }
    if (!c->training) {
        c->training = true;
        c->train_start = zps_clock_ms();
    }
    zps_diloco_params_in(c, c->after);
    if (c->after == ZPS_AFTER_OVERLAP) {
        // The fragment of step t - 1 is merged: its evaluation is due, and
        // the shards being at t, the pieces of t may go out (the own one
        // next, in the compute phase).
        err = zps_diloco_push_deferred(c);
        if (err != ZPS_OK) {
            return zps_work_end(c, err);
        }
        zps_evalwork_plan(c, c->t - 1);
        c->phase = c->t >= c->total_steps ? ZPS_PHASE_EVAL : ZPS_PHASE_COMPUTE;
        return 0;
    }
    if (c->after == ZPS_AFTER_JOIN) {
        c->t = c->wait_step;
        c->phase = ZPS_PHASE_STEP;
        return 0;
    }
    if (c->after == ZPS_AFTER_START_OVER) {
        // Gone back, or admitted anew: the last push may not have counted.
        zps_round_reset_feedback(&c->round);
        c->t = c->wait_step;
        c->phase = ZPS_PHASE_STEP;
        bool rejoined = c->rejoined;
        c->rejoined = false;
        return rejoined ? ZPS_NEXT_REJOINED : ZPS_NEXT_ROLLBACK;
    }
    zps_evalwork_plan(c, c->t); // step t is over
    c->phase = ZPS_PHASE_EVAL;
    return 0;
}

// The phases of zps_next_work: each returns what zps_next_work returns,
// or 0 to go on with the phase it set.

static int s_phase_new(zps_client *c)
{
    zps_conn_beat(&c->conn);
    zps_conn_open_ask(&c->conn);
    zps_err err = zps_wait_send_init(c);
    if (err != ZPS_OK) {
        return zps_work_end(c, err);
    }
    c->t = c->start_step;
    err = s_start_wait(c, c->start_step, ZPS_AFTER_JOIN, true);
    return err != ZPS_OK ? zps_work_end(c, err) : 0;
}

// --overlap: waits for the parameters of step t, owed since the push of
// step t - 1 (no PULL: that push asked for them).
static int s_wait_owed(zps_client *c)
{
    zps_diloco_overlap_begin(c);
    c->t2 = zps_clock_ms();
    zps_err err = s_start_wait(c, c->t, ZPS_AFTER_OVERLAP, false);
    return err != ZPS_OK ? s_wait_over(c, err) : 0;
}

static int s_phase_step(zps_client *c)
{
    if (c->t >= c->total_steps && c->owed) {
        return s_wait_owed(c); // the last step's fragment
    }
    if (c->t >= c->total_steps) {
        zps_diloco_finish(c);
        s_log_timing(c, zps_clock_ms() - c->train_start);
        c->phase = ZPS_PHASE_DONE;
        return ZPS_NEXT_DONE;
    }
    if (c->mode.diloco) {
        c->round_pushed = c->inner_done = false;
        c->inner_h = c->inner_n = 0;
    }
    c->n_queue = zps_schedule_take(&c->schedule, c->t, c->queue, ZPS_CLIENT_QUEUE);
    c->queue_pos = 0;
    c->queue_step = c->t;
    c->n_step_work = c->n_queue;
    c->phase = ZPS_PHASE_COMPUTE;
    return 0;
}

// *piece_err: the outcome of the piece handed out last, taken here.
static int s_phase_compute(zps_client *c, zps_work *out, zps_err *piece_err)
{
    int r = 0;
    if (*piece_err == ZPS_EAGAIN) {
        c->phase = ZPS_PHASE_START_OVER; // its step was over: catch up
        *piece_err = ZPS_OK;
        return 0;
    }
    if (*piece_err != ZPS_OK) {
        return zps_work_end(c, *piece_err);
    }
    if (zps_work_queued(c) && (r = s_hand_out(c, out)) != 0) {
        return r;
    }
    if (c->mode.diloco && c->inner_h < c->inner_n) {
        return s_hand_out(c, out); // the round's inner steps go on
    }
    if (c->mode.diloco && c->inner_n > 0 && !c->inner_done) {
        zps_client_einval(c, "round %llu: its last inner step was handed out and never ended "
                          "with zps_inner_done", (unsigned long long)c->t);
        return zps_work_end(c, ZPS_EINVAL);
    }
    if (zps_diloco_overlaps(c) && c->owed) {
        return s_wait_owed(c); // then back here
    }
    if (zps_diloco_overlaps(c) && c->inner_n > 0) {
        // Pushed, and on to the next step without waiting: its parameters
        // are owed, and taken at the end of the next step's inner steps.
        zps_err err = zps_diloco_push_own(c);
        if (err != ZPS_OK) {
            return zps_work_end(c, err);
        }
        c->owed = true;
        c->phase = ZPS_PHASE_EVAL; // planned at the last merge, if any
        return 0;
    }
    // Nothing to compute (a member only from the next step on): ask.
    c->t2 = zps_clock_ms();
    zps_err err = s_start_wait(c, c->t + 1, ZPS_AFTER_STEP, c->n_step_work == 0);
    return err != ZPS_OK ? s_wait_over(c, err) : 0;
}

static int s_phase_wait(zps_client *c, zps_work *out, zps_err *piece_err)
{
    zps_err err = *piece_err;
    *piece_err = ZPS_OK;
    if (err == ZPS_OK) {
        err = zps_wait_run(c);
    }
    if (err == ZPS_OK && zps_work_queued(c)) {
        // diloco: 0 when pushed as missing, nothing to train; wait on
        return s_hand_out(c, out);
    }
    return s_wait_over(c, err);
}

static int s_phase_start_over(zps_client *c)
{
    zps_err err = ZPS_OK;
    if (c->rejoin && (err = zps_ask_rejoin(c)) != ZPS_OK) {
        return zps_work_end(c, err);
    }
    c->t = c->rollback_to;
    zps_host_code_forget(c); // the values of a step done over may differ
    err = s_start_wait(c, c->rollback_to, ZPS_AFTER_START_OVER, true);
    return err != ZPS_OK ? s_wait_over(c, err) : 0;
}

static int s_phase(zps_client *c, zps_work *out, zps_err *piece_err)
{
    switch (c->phase) {
    case ZPS_PHASE_NEW: return s_phase_new(c);
    case ZPS_PHASE_STEP: return s_phase_step(c);
    case ZPS_PHASE_COMPUTE: return s_phase_compute(c, out, piece_err);
    case ZPS_PHASE_WAIT: return s_phase_wait(c, out, piece_err);
    case ZPS_PHASE_EVAL: return zps_evalwork_hand_out(c, out);
    case ZPS_PHASE_START_OVER: return s_phase_start_over(c);
    case ZPS_PHASE_DONE: return ZPS_NEXT_DONE;
    case ZPS_PHASE_OVER:
    default:
        zps_client_einval(c, "the client's loop has ended");
        return ZPS_NEXT_ERROR;
    }
}

int zps_next_work(zps_client *c, zps_work *out)
{
    zps_client_begin(c);
    if (!c->params && c->phase == ZPS_PHASE_NEW) {
        zps_client_einval(c, "zps_set_params first");
        return ZPS_NEXT_ERROR;
    }
    // The outcome of the piece handed out last.
    zps_err piece_err = ZPS_OK;
    if (c->handed) {
        c->handed = false;
        piece_err = c->skip ? ZPS_EAGAIN : c->push_err;
    }
    for (;;) {
        if (c->conn.stop && c->phase != ZPS_PHASE_DONE && c->phase != ZPS_PHASE_OVER) {
            return zps_work_end(c, ZPS_ECLOSED);
        }
        int r = s_phase(c, out, &piece_err);
        if (r != 0) {
            return r;
        }
    }
}

// The piece w handed out last, or NULL (ZPS_EINVAL set).
bool zps_work_is_current(zps_client *c, const zps_work *w, uint32_t kind)
{
    if (!w || w->id != c->work_id || w->kind != kind || (kind == ZPS_WORK_TRAIN && !c->handed)) {
        zps_client_einval(c, "not the work item handed out last");
        return false;
    }
    return true;
}

zps_err zps_work_start(zps_client *c, const zps_work *w)
{
    zps_client_begin(c);
    if (!zps_work_is_current(c, w, ZPS_WORK_TRAIN)) {
        return ZPS_EINVAL;
    }
    if (zps_ask_step_over(c, c->cur_step)) {
        c->skip = true;
        return ZPS_EAGAIN;
    }
    return ZPS_OK;
}

zps_err zps_push_bucket(zps_client *c, const zps_work *w, int bucket, const float *grad,
                        float loss)
{
    if (!zps_work_is_current(c, w, ZPS_WORK_TRAIN)) {
        return ZPS_EINVAL;
    }
    if (c->mode.diloco) {
        return zps_client_einval(c, "a diloco job pushes no gradients: step your optimizer, then "
                                 "zps_inner_done");
    }
    if (c->micro.m) {
        return zps_client_einval(c, "a deterministic job pushes micro-batches: zps_push_micro");
    }
    if (bucket < 0 || bucket >= zps_model_n_buckets(&c->model) || !grad) {
        return zps_client_einval(c, "bucket %d: the model has %d", bucket,
                                 zps_model_n_buckets(&c->model));
    }
    uint64_t blo, bhi;
    zps_model_bucket(&c->model, bucket, &blo, &bhi);
    for (int i = 0; c->push_err == ZPS_OK && i < c->conn.n_shards; i++) {
        uint64_t lo = blo > c->conn.shards[i].lo ? blo : c->conn.shards[i].lo;
        uint64_t hi = bhi < c->conn.shards[i].hi ? bhi : c->conn.shards[i].hi;
        if (lo < hi) {
            c->push_err = s_push(c, i, lo, hi, grad, loss, w->data_ms);
        }
    }
    return c->push_err == ZPS_OK ? ZPS_OK : zps_client_fail(c, c->push_err);
}

zps_err zps_work_done(zps_client *c, const zps_work *w)
{
    if (!zps_work_is_current(c, w, ZPS_WORK_TRAIN)) {
        return ZPS_EINVAL;
    }
    if (c->mode.diloco) {
        return zps_client_einval(c, "a diloco job's inner steps end with zps_inner_done");
    }
    if (c->done_step != w->step) {
        c->done_step = w->step;
        c->n_done = 0;
    }
    if (c->n_done < ZPS_CLIENT_QUEUE) {
        c->done[c->n_done++] = c->cur_work;
    }
    c->sum_data_ms += w->data_ms;
    c->sum_compute_ms += zps_clock_ms() - c->step_t0 - w->data_ms;
    return c->push_err == ZPS_OK ? ZPS_OK : zps_client_fail(c, c->push_err);
}
