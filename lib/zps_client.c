/* zps_client.c - libzps: the worker side of zps behind include/zps.h.
 *
 * The work loop turned inside out, over the wire client (zps_conn.c): what
 * zps-worker's loop did between two computes is a phase of zps_next_work,
 * which returns whenever the caller has something to compute and picks up
 * where it left off on the next call. Here live the job (plans, the
 * schedule, the parameters arriving bucket by bucket), what each refusal
 * makes the worker do, what the coordinator's answer to "where is the
 * job" means, catching up and rejoining. Every wait is bounded and says
 * what it waits for. */
#include "include/zps.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/zps_clock.h"
#include "common/zps_curve.h"
#include "common/zps_dtype.h"
#include "common/zps_err.h"
#include "common/zps_layout.h"
#include "common/zps_log.h"
#include "common/zps_model.h"
#include "common/zps_optim.h"
#include "common/zps_outer.h"
#include "common/zps_plan.h"
#include "common/zps_wire.h"
#include "lib/zps_conn.h"
#include "lib/zps_decl.h"
#include "lib/zps_heartbeat.h"
#include "lib/zps_round.h"
#include "lib/zps_sampler.h"
#include "lib/zps_schedule.h"

_Static_assert(ZPS_LOG_LEVEL_ERROR == (int)ZPS_LOG_ERROR, "log levels must agree");

#define ZPS_CLIENT_WAIT_LOG_MS 5000.0
#define ZPS_CLIENT_LATE_STEPS 2.0      // a slice not begun this many usual steps in: ask first
#define ZPS_CLIENT_ASK_MS 500          // bound on the coordinator's answer to that
#define ZPS_CLIENT_ASK_EVERY_MS 1000.0 // waiting for parameters: ask where the job is this often
#define ZPS_CLIENT_RETRY_MS 20         // first wait before sending a "not yet" message again
#define ZPS_CLIENT_RETRY_MAX_MS 1000   // longest such wait (doubling)
#define ZPS_CLIENT_QUEUE (1 + ZPS_PLANS_HANDED_MAX)

// Where zps_next_work picks up.
typedef enum s_phase {
    P_NEW,        // joined; the first call starts heartbeats and pulls
    P_STEP,       // step t begins
    P_COMPUTE,    // handing out step t's pieces
    P_WAIT,       // waiting for wait_step's parameters (handing out late pieces)
    P_EVAL,       // handing out the evaluation of the epoch's end
    P_START_OVER, // after a rollback or catching up: pull rollback_to's parameters
    P_DONE,       // the last step is over
    P_OVER,       // ended: stopped, over, or failed
} s_phase;

// A frame of the next step's parameters, kept as it came until all are
// in: the current parameters stay whole until then (a slice of the step in
// progress may be handed to this worker while it waits), and the frames
// are copied into them once, in one pass, rather than into a buffer of
// their own and from there again.
typedef struct s_held {
    zmq_msg_t frame;  // owned: the received frame
    uint64_t offset;  // the parameter its first element is
} s_held;

// What a wait for parameters was for.
typedef enum s_after {
    A_JOIN,       // the first parameters
    A_STEP,       // those after step t
    A_START_OVER, // those of rollback_to
} s_after;

struct zps_client {
    zps_conn conn;                                 // the wire: sockets, identity, heartbeat
    int timeout_ms;                                // the coordinator's silence ends the job
    int join_timeout_ms;                           // bound on waiting for the job
    zps_err errcode;                               // the last failure
    char errmsg[256];                              // its sentence
    // The job.
    bool joined;                                   // a JOB was taken
    uint32_t global_batch;                         // B
    uint64_t seed, total_steps, steps_per_epoch, start_step;
    char model_name[256], dataset_name[256];       // from JOB
    zps_model_spec model;
    zps_dtype dtype;                               // tensors on the wire
    zps_schedule schedule;                         // what to compute at each step
    // Buffers.
    float *params;                                 // borrowed: the caller's parameters
    s_held *held;                                  // owned: frames of the next step's parameters,
                                                   // kept as they arrive (n_held of cap_held)
    int n_held, cap_held;
    uint8_t *wire;                                 // owned: gradient in a 16-bit wire dtype
    zps_wire_ref grad_ref;                         // the caller's gradient still held by ZeroMQ
    bool has_data;                                 // zps_set_dataset called
    zps_sampler sampler;                           // owned
    uint64_t n_test;                               // test records (64 bits: n_test * offset)
    // The piece handed out.
    uint32_t work_id;                              // its id
    bool handed;                                   // a piece is out; its outcome not yet taken
    bool skip;                                     // zps_work_start said skip it
    uint64_t cur_step;                             // its step
    zps_piece cur_work;                            // its slice
    double step_t0;                                // when it was handed out
    zps_err push_err;                              // its first failed push
    // Pieces to hand out.
    uint64_t queue_step;                           // their step
    zps_piece queue[ZPS_CLIENT_QUEUE];
    int n_queue, queue_pos;
    uint64_t eval_epoch;                           // the evaluation to hand out
    uint32_t eval_lo[ZPS_CLIENT_QUEUE], eval_hi[ZPS_CLIENT_QUEUE];
    int n_eval, eval_pos;
    // The loop.
    s_phase phase;
    s_after after;                                 // of the wait in progress
    bool training;                                 // past the first parameters
    bool rejoined;                                 // another member since the last start-over
    uint64_t t;                                    // the step in progress
    uint64_t wait_step;                            // the step whose parameters are awaited
    int n_step_work;                               // pieces of step t
    double t2;                                     // when the wait after step t began
    bool wait_begun;                               // the wait's state below is set
    double wait_start, next_log, next_beat;        // of the wait
    double train_start;                            // when training began
    uint64_t rollback_to;                          // step to start over from
    double params_ms;                              // when the current parameters were taken
    double usual_step_ms;                          // running mean of the time between those
    uint64_t done_step;                            // the step of the slices below
    zps_piece done[ZPS_CLIENT_QUEUE];              // the slices computed of it, pieces too
    int n_done;
    double sum_data_ms, sum_compute_ms, sum_wait_ms; // per-step phases, summed
    uint64_t timed_steps;                          // steps in those sums
    uint64_t stopped_at;                           // the step a stop interrupted
    double pull_again_ms[ZPS_CONN_MAX_SHARDS];   // when to send a refused PULL again (0: no)
    int retry_ms;                                  // the next "not yet" backoff
    double redo_ms;                                // when to compute refused pushes again (0: no)
    double next_ask_ms;                            // next "where is the job" while waiting
    double answered_ms;                            // the coordinator's last answer to that
    bool rejoin;                                   // handed on by the coordinator: HELLO again
    uint64_t ahead_of;                             // the job's step at the last ask, if behind us
    bool job_over;                                 // the coordinator said the job is over
    // A declared model (--model external).
    zps_decl decl;                                 // what HELLO declares
    bool send_init;                                // rank 0 of a first start: send INIT
    double init_again_ms[ZPS_CONN_MAX_SHARDS];     // when to send a refused INIT again (0: no)
    // --mode diloco: the round in progress (step t is round t).
    zps_outer_mode mode;                           // zeroed: synchronous
    zps_optim_cfg inner;                           // diloco: the job's inner optimizer, from JOB
    zps_round round;                               // owned: theta_sync, the delta, its payloads
    zps_piece own;                                 // this worker's slice of the round
    uint32_t inner_h, inner_n;                     // inner steps handed out, and to take
    bool round_pushed;                             // the round's pseudo-gradient is out
    uint32_t inner_taken;                          // the work id zps_inner_done took last
    double inner_loss;                             // the round's inner losses, summed
    double round_ms;                               // the round's compute, summed
};

// ---------------------------------------------------------------------------
// Errors: a code, and the sentence that was logged for it.

static zps_err s_fail(zps_client *c, zps_err err)
{
    const char *line = zps_log_last_error();
    c->errcode = err;
    snprintf(c->errmsg, sizeof c->errmsg, "%s", *line ? line : zps_strerror(err));
    return err;
}

static zps_err s_einval(zps_client *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static zps_err s_einval(zps_client *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->errmsg, sizeof c->errmsg, fmt, ap);
    va_end(ap);
    c->errcode = ZPS_EINVAL;
    return ZPS_EINVAL;
}

static void s_begin(zps_client *c)
{
    zps_log_clear_last_error();
    c->errcode = ZPS_OK;
    c->errmsg[0] = '\0';
}

// ---------------------------------------------------------------------------
// Replies: bounded waits that say what they wait for.

// ---------------------------------------------------------------------------
// Joining: HELLO, JOB.

// A plan (and extras) from JOB or PLAN: into the schedule.
static zps_err s_take_plan(zps_client *c, Zps__Slice *const *slices, size_t n_slices,
                           uint32_t gen, uint64_t effective, Zps__Extra *const *extras,
                           size_t n_extras)
{
    zps_plan plan;
    if (zps_plan_from_wire(slices, n_slices, c->global_batch, &plan) != ZPS_OK) {
        zps_log_error("the coordinator sent an inconsistent plan (generation %u)", gen);
        return ZPS_EPROTO;
    }
    zps_schedule_add_plan(&c->schedule, gen, effective, &plan);
    for (size_t i = 0; i < n_extras; i++) {
        const Zps__Extra *e = extras[i];
        if (e->rank == c->conn.rank && e->count > 0 && e->count <= c->global_batch &&
            e->offset <= c->global_batch - e->count) {
            zps_schedule_add_extra(&c->schedule, e->step,
                                   (zps_piece){.offset = e->offset, .count = e->count,
                                               .gen = e->generation});
            zps_log_info("handed slice [%u, %u) of step %llu", e->offset, e->offset + e->count,
                         (unsigned long long)e->step);
        }
    }
    return ZPS_OK;
}

// A diloco job's round: its ranges are the pushes of zps_push_bucket, a
// bucket cut to each shard, in the same order.
static zps_err s_take_mode(zps_client *c, const Zps__Job *job)
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
            .warmup_steps = o->warmup_steps, .total_steps = c->total_steps * c->mode.inner_steps};
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

static zps_err s_take_job(zps_client *c, const Zps__Header *h)
{
    const Zps__Job *job = h->job;
    zps_model_spec model;
    char why[256] = "";
    if (job && job->layout && zps_layout_check(job->layout, why, sizeof why) == ZPS_OK) {
        zps_layout_model(job->layout, &model); // declared by the workers
    }
    if (!job || why[0] || (!job->layout && zps_model_parse(job->model, &model) != ZPS_OK) ||
        !zps_dtype_valid((int)job->wire_dtype) || job->steps_per_epoch == 0 ||
        job->global_batch == 0) {
        zps_log_error("the coordinator sent a job without a usable model or wire dtype");
        return ZPS_EPROTO;
    }
    // A declaration joins a built-in job only as that MLP's flat layout.
    if (zps_decl_any(&c->decl) && !job->layout &&
        (model.kind != ZPS_MODEL_MLP ||
         zps_layout_differs_mlp(&model, &c->decl.layout, why, sizeof why))) {
        zps_log_error("the job's model %s is not the one declared%s%s", job->model,
                      why[0] ? ": " : "", why);
        return ZPS_EPROTO;
    }
    if (c->joined && (h->job_id != c->conn.job_id || (zps_dtype)job->wire_dtype != c->dtype ||
                      job->seed != c->seed || job->global_batch != c->global_batch)) {
        // Joining again: the model, data and buffers of before must fit.
        zps_log_error("joining again, the coordinator gave another job (%016llx)",
                      (unsigned long long)h->job_id);
        return ZPS_EPROTO;
    }
    c->model = model;
    c->dtype = (zps_dtype)job->wire_dtype;
    c->conn.job_id = h->job_id;
    c->conn.rank = job->rank;
    c->conn.member_id = job->member_id;
    c->seed = job->seed;
    c->global_batch = job->global_batch;
    c->total_steps = job->total_steps;
    c->steps_per_epoch = job->steps_per_epoch;
    c->start_step = job->start_step;
    c->send_init = job->send_init && job->layout;
    snprintf(c->model_name, sizeof c->model_name, "%s", job->model ? job->model : "");
    snprintf(c->dataset_name, sizeof c->dataset_name, "%s", job->dataset ? job->dataset : "");
    zps_schedule_init(&c->schedule, c->conn.rank);
    zps_err err = s_take_plan(c, job->plan, job->n_plan, job->generation, job->plan_effective,
                              job->extras, job->n_extras);
    if (err != ZPS_OK) {
        return err;
    }
    char name[32];
    snprintf(name, sizeof name, "worker[%u]", c->conn.rank);
    zps_log_set_name(name);
    zps_log_info("job %016llx: rank %u from step %llu, global batch %u, model %s, dataset %s",
                 (unsigned long long)c->conn.job_id, c->conn.rank, (unsigned long long)c->start_step,
                 c->global_batch, job->model, job->dataset);
    err = zps_conn_take_shards(&c->conn, job, &c->model);
    if (err == ZPS_OK) {
        err = s_take_mode(c, job);
    }
    c->joined = c->joined || err == ZPS_OK;
    return err;
}

// HELLO until the JOB comes; the job's end said so sets job_over.
static zps_err s_hello_until_job(zps_client *c, zps_wire_msg *m)
{
    zps_err err = zps_conn_hello_until_job(&c->conn, c->join_timeout_ms, m);
    if (err == ZPS_ECLOSED && !c->conn.stop) {
        c->job_over = true;
    }
    return err;
}

// The member a JOB names, taken while training: its heartbeat, and the
// loop starts over at the JOB's step (zps_next_work says ZPS_NEXT_REJOINED).
static zps_err s_become(zps_client *c, const Zps__Header *h)
{
    zps_heartbeat_stop(&c->conn.heartbeat);
    zps_err err = s_take_job(c, h);
    if (err != ZPS_OK) {
        return err;
    }
    zps_conn_beat(&c->conn);
    c->rollback_to = c->start_step;
    c->done_step = UINT64_MAX;
    c->rejoined = true;
    return ZPS_OK;
}

// Handed on by the coordinator (evicted while paused, or its slices given
// away while it could not answer): HELLO again, as a new member, with the
// model, data and buffers already here; the loop goes on at the step the
// JOB names.
static zps_err s_rejoin(zps_client *c)
{
    c->rejoin = false;
    zps_heartbeat_stop(&c->conn.heartbeat); // the old member is silent while HELLO waits
    zps_wire_msg m = {0};
    zps_err err = s_hello_until_job(c, &m);
    if (err == ZPS_OK) {
        err = s_become(c, m.hdr);
    }
    zps_wire_msg_fini(&m);
    return err;
}

// A JOB while training: the answer to a HELLO said again after a pause
// long enough that the member the first JOB named was evicted since, so
// the coordinator admitted this socket anew. The newer JOB is the member
// the coordinator knows; it is taken as on a rejoin. A copy of the JOB in
// hand changes nothing.
static zps_err s_take_late_job(zps_client *c, const Zps__Header *h)
{
    if (!h->job || h->job->member_id == c->conn.member_id) {
        return ZPS_OK;
    }
    zps_log_warn("rank %u was admitted again, as rank %u (a HELLO said again during a pause): "
                 "going on as that member", c->conn.rank, h->job->rank);
    zps_err err = s_become(c, h);
    return err == ZPS_OK ? ZPS_EAGAIN : err;
}

// ---------------------------------------------------------------------------
// Parameters: bounded waits for every bucket of every shard.

// Queues the pieces of step - 1 handed to this worker (or refused "not
// yet"): computed at once, on the parameters of step - 1, which stay in
// place until the wait is over.
static void s_queue_extras(zps_client *c, uint64_t step)
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
}

// When to send a refused message again: the backoff now, doubled for the
// next refusal up to ZPS_CLIENT_RETRY_MAX_MS (a bucket taken resets it).
static double s_backoff(zps_client *c)
{
    double at = zps_clock_ms() + c->retry_ms;
    c->retry_ms = c->retry_ms * 2 < ZPS_CLIENT_RETRY_MAX_MS ? c->retry_ms * 2
                                                            : ZPS_CLIENT_RETRY_MAX_MS;
    return at;
}

// A refusal from shard i while waiting for `step`'s parameters. "Not yet"
// sends the same again after a bounded backoff: a PULL as it was, a PUSH
// by computing its piece again (the gradient buffer has moved on; the
// compute is deterministic, so the piece gives the same gradient). "Lost"
// asks the coordinator at once where the job is.
static zps_err s_on_refusal(zps_client *c, int i, uint64_t step, const Zps__Header *h)
{
    if (h->refused == ZPS__MSG_TYPE__INIT &&
        (h->error_code == ZPS_EAGAIN || h->error_code == ZPS_ESTATE)) {
        // A shard not assigned yet (or restarting): its values again, later.
        zps_log_info("%s: not ready for the initial values (%s); sending them again",
                     c->conn.shards[i].endpoint, h->error ? h->error : "");
        c->init_again_ms[i] = s_backoff(c);
        return ZPS_OK;
    }
    if (h->refused == ZPS__MSG_TYPE__PUSH && h->shm_size > 0 && h->error_code == ZPS_EAGAIN) {
        zps_conn_shm_refused(&c->conn, i, h->error); // frames from now on, this piece too
    }
    switch (zps_conn_judge(h, c->conn.shards[i].endpoint)) {
    case ZPS_CONN_RETRY: {
        double at = s_backoff(c);
        if (h->refused == ZPS__MSG_TYPE__PULL) {
            c->pull_again_ms[i] = at;
        } else if (h->refused == ZPS__MSG_TYPE__PUSH && step > 0 && h->step == step - 1 &&
                   h->samples > 0 && h->samples <= c->global_batch &&
                   h->batch_offset <= c->global_batch - h->samples) {
            zps_schedule_add_extra(&c->schedule, h->step,
                                   (zps_piece){.offset = h->batch_offset, .count = h->samples,
                                               .gen = h->generation});
            c->redo_ms = at;
        }
        return ZPS_OK;
    }
    case ZPS_CONN_LOST:
        // A PULL refused as from an unknown member may be a joiner's that
        // overtook the plan naming it: asked again, after asking the
        // coordinator, which says whether this worker was handed on.
        c->next_ask_ms = 0;
        if (h->refused == ZPS__MSG_TYPE__PULL) {
            c->pull_again_ms[i] = s_backoff(c);
        }
        return ZPS_OK;
    case ZPS_CONN_OVER:
        c->job_over = true;
        return ZPS_ECLOSED;
    default:
        return ZPS_ECLOSED;
    }
}

// Lets go of the frames kept (a wait that starts over, or ends).
static void s_release_held(zps_client *c)
{
    for (int i = 0; i < c->n_held; i++) {
        ZPS_ASSERT(zmq_msg_close(&c->held[i].frame) == 0);
    }
    c->n_held = 0;
}

// Keeps the frames of a checked PARAMS message of the parameters from
// `offset` on (they leave m empty); ZPS_ENOMEM if there is no room.
static zps_err s_hold(zps_client *c, zps_wire_msg *m, uint64_t offset)
{
    if (c->n_held + m->n_frames > c->cap_held) {
        int cap = 2 * (c->n_held + m->n_frames) + 16;
        s_held *more = malloc((size_t)cap * sizeof *more);
        if (!more) {
            zps_log_error("out of memory keeping the parameters received");
            return ZPS_ENOMEM;
        }
        for (int i = 0; i < c->n_held; i++) {
            more[i].offset = c->held[i].offset;
            ZPS_ASSERT(zmq_msg_init(&more[i].frame) == 0);
            ZPS_ASSERT(zmq_msg_move(&more[i].frame, &c->held[i].frame) == 0);
            ZPS_ASSERT(zmq_msg_close(&c->held[i].frame) == 0);
        }
        free(c->held);
        c->held = more;
        c->cap_held = cap;
    }
    size_t esize = zps_dtype_size(c->dtype);
    for (int f = 0; f < m->n_frames; f++) {
        s_held *k = &c->held[c->n_held++];
        k->offset = offset;
        ZPS_ASSERT(zmq_msg_init(&k->frame) == 0);
        ZPS_ASSERT(zmq_msg_move(&k->frame, &m->frames[f]) == 0);
        offset += zmq_msg_size(&k->frame) / esize;
    }
    return ZPS_OK;
}

// The parameters received become the caller's, in one pass over the
// frames kept; they are let go of.
static void s_take_held(zps_client *c)
{
    size_t esize = zps_dtype_size(c->dtype);
    for (int i = 0; i < c->n_held; i++) {
        zmq_msg_t *frame = &c->held[i].frame;
        zps_dtype_to_f32(c->dtype, zmq_msg_data(frame), c->params + c->held[i].offset,
                         zmq_msg_size(frame) / esize);
    }
    s_release_held(c);
}

// Checks a PARAMS message from shard i against what step `step` expects
// and keeps its frames until the step's parameters are all in.
static zps_err s_take_bucket(zps_client *c, int i, uint64_t step, zps_wire_msg *m)
{
    zps_conn_shard *sc = &c->conn.shards[i];
    const Zps__Header *h = m->hdr;
    char why[160] = "";
    int b = -1;
    if (h->type == ZPS__MSG_TYPE__ERROR) {
        return s_on_refusal(c, i, step, h);
    }
    if (h->type == ZPS__MSG_TYPE__PARAMS && h->step < step) {
        return ZPS_OK; // a late answer for a step already over: nothing to take
    }
    if (h->type == ZPS__MSG_TYPE__PARAMS && h->step > step) {
        // Either the job went on without this worker (its slices handed on
        // while it stalled), or these are from before a rollback, queued
        // while it was away: only the coordinator knows which. Asked now;
        // the answer says whether to catch up (s_where_is_job).
        c->next_ask_ms = 0;
        return ZPS_OK;
    }
    if (i == 0 && h->type == ZPS__MSG_TYPE__JOB) {
        return s_take_late_job(c, h);
    }
    if (h->type != ZPS__MSG_TYPE__PARAMS || h->step != step) {
        snprintf(why, sizeof why, "%s for step %llu, expected PARAMS for step %llu",
                 zps_wire_type_name(h->type), (unsigned long long)h->step,
                 (unsigned long long)step);
    } else if (zps_wire_check_tensor(m, (int)c->dtype, sc->lo, sc->hi, why, sizeof why) ==
               ZPS_OK) {
        for (int k = 0; k < sc->n_buckets; k++) {
            if (sc->buckets[k].lo == h->offset && sc->buckets[k].hi == h->offset + h->count) {
                b = k;
            }
        }
        if (b >= 0 && zps_bucket_set_has(&sc->received, b)) {
            // A second answer (to a pull and a push both): the same values.
            return ZPS_OK;
        }
        if (b < 0) {
            snprintf(why, sizeof why, "[%llu, +%llu) is not one of the shard's buckets",
                     (unsigned long long)h->offset, (unsigned long long)h->count);
        }
    }
    if (b < 0) {
        zps_log_error("%s sent bad parameters: %s", sc->endpoint, why);
        return ZPS_EPROTO;
    }
    zps_err err = s_hold(c, m, h->offset);
    if (err != ZPS_OK) {
        return err;
    }
    zps_bucket_set_add(&sc->received, b);
    c->retry_ms = ZPS_CLIENT_RETRY_MS;
    return ZPS_OK;
}

static bool s_shard_received(const zps_conn_shard *sc)
{
    return zps_bucket_set_full(&sc->received, sc->n_buckets);
}

static bool s_all_received(const zps_client *c)
{
    for (int i = 0; i < c->conn.n_shards; i++) {
        if (!s_shard_received(&c->conn.shards[i])) {
            return false;
        }
    }
    return true;
}

// A message from shard i while waiting for parameters: a bucket of them,
// or (from the coordinator) a new plan, maybe with slices of the step in
// progress to compute right away.
static zps_err s_take_message(zps_client *c, int i, uint64_t step, zps_wire_msg *m)
{
    const Zps__Header *h = m->hdr;
    if (i == 0 && h->type == ZPS__MSG_TYPE__ROLLBACK && h->plan) {
        // A shard came back from its checkpoint: start over from its step.
        const Zps__Plan *p = h->plan;
        zps_log_warn("rolling back to step %llu (plan %u)", (unsigned long long)h->step,
                     p->generation);
        zps_schedule_forget_before(&c->schedule, UINT64_MAX);
        zps_err err = s_take_plan(c, p->slices, p->n_slices, p->generation, p->effective_step,
                                  p->extras, p->n_extras);
        c->rollback_to = h->step;
        return err == ZPS_OK ? ZPS_EAGAIN : err;
    }
    if (i != 0 || h->type != ZPS__MSG_TYPE__PLAN || !h->plan) {
        return s_take_bucket(c, i, step, m);
    }
    const Zps__Plan *p = h->plan;
    zps_log_info("plan %u from step %llu: %zu members", p->generation,
                 (unsigned long long)p->effective_step, p->n_slices);
    zps_err err = s_take_plan(c, p->slices, p->n_slices, p->generation, p->effective_step,
                              p->extras, p->n_extras);
    if (err == ZPS_OK) {
        s_queue_extras(c, step);
    }
    return err;
}

static zps_err s_pull(zps_client *c, uint64_t step)
{
    zps_err err = ZPS_OK;
    for (int i = 0; err == ZPS_OK && i < c->conn.n_shards; i++) {
        err = zps_conn_pull(&c->conn, i, step);
    }
    return err;
}

// Waited long for `step`'s parameters: where is the job? The worker goes
// on waiting while the job lives and it is a member; catches up when the
// job went past the step without it; joins again when it was handed on
// (evicted while paused, or its slice given away); ends when the job is
// over or the coordinator stays silent for the timeout. The log says which.
static zps_err s_where_is_job(zps_client *c, uint64_t step)
{
    double now = zps_clock_ms();
    c->next_ask_ms = now + ZPS_CLIENT_ASK_EVERY_MS;
    zps_wire_msg m;
    if (zps_conn_ask(&c->conn, ZPS_CLIENT_ASK_MS, &m) != ZPS_OK) {
        if (now - c->answered_ms > c->timeout_ms) {
            zps_log_error("the coordinator at %s has not answered for %.0f s: leaving the job",
                          c->conn.shards[0].endpoint, (now - c->answered_ms) / 1e3);
            return ZPS_ETIMEDOUT;
        }
        return ZPS_OK;
    }
    c->answered_ms = now;
    const Zps__Status *st = m.hdr->status;
    uint64_t at = st->steps_done_all; // a step is over once every shard completed it
    zps_err err = ZPS_OK;
    if (st->state && strcmp(st->state, "done") == 0) {
        zps_log_warn("the job is over (step %llu of %llu) without this worker's last step: "
                     "leaving it", (unsigned long long)at, (unsigned long long)st->total_steps);
        c->job_over = true;
        err = ZPS_ECLOSED;
    } else if (st->asker == ZPS__MEMBER_STATE__MEMBER_GONE ||
               st->asker == ZPS__MEMBER_STATE__MEMBER_UNKNOWN) {
        zps_log_warn("rank %u was handed on by the coordinator (it is at step %llu): joining "
                     "the job again", c->conn.rank, (unsigned long long)at);
        c->rejoin = true;
        err = ZPS_EAGAIN;
    } else if (st->asker == ZPS__MEMBER_STATE__MEMBER_ACTIVE && at > step) {
        zps_log_warn("step %llu is over without this worker (the coordinator is at step %llu): "
                     "catching up there", (unsigned long long)step, (unsigned long long)at);
        c->rollback_to = at;
        err = ZPS_EAGAIN;
    } else if (st->asker == ZPS__MEMBER_STATE__MEMBER_ACTIVE && at + 1 < step &&
               at == c->ahead_of) {
        // Parameters of `step` need step - 1 done. Seen twice (a shard's
        // STEP_DONE may lag once), the job is behind this worker: it went
        // on in a timeline a rollback ended. Back to the job's step.
        zps_log_warn("waiting for step %llu while the job is at step %llu: going back there",
                     (unsigned long long)step, (unsigned long long)at);
        c->rollback_to = at;
        err = ZPS_EAGAIN;
    } else {
        zps_log_info("waiting for step %llu parameters: the coordinator is at step %llu (%s), "
                     "this worker %s", (unsigned long long)step, (unsigned long long)at,
                     st->state ? st->state : "?",
                     st->asker == ZPS__MEMBER_STATE__MEMBER_JOINING ? "joining" : "active");
    }
    c->ahead_of = at + 1 < step ? at : UINT64_MAX;
    zps_wire_msg_fini(&m);
    return err;
}

// The poll timeout: the next "not yet" to send again, or the poll interval.
// Rank 0 of a declared model's first start: the caller's buffer, as it is
// now, becomes the job's initial values on every shard. They arrive back
// as step 0's parameters, like everyone's: the buffer is not written
// before all of them are in.
static zps_err s_send_init(zps_client *c)
{
    if (!c->send_init || c->start_step != 0) {
        return ZPS_OK;
    }
    c->send_init = false;
    zps_log_info("rank 0: sending the initial values of %zu parameters to %d shards",
                 c->model.n_params, c->conn.n_shards);
    zps_err err = ZPS_OK;
    for (int i = 0; err == ZPS_OK && i < c->conn.n_shards; i++) {
        err = zps_conn_send_init(&c->conn, i, c->params);
    }
    return err;
}

static long s_poll_ms(const zps_client *c, double now)
{
    double next = now + ZPS_CONN_POLL_MS;
    for (int i = 0; i < c->conn.n_shards; i++) {
        next = c->pull_again_ms[i] > 0 && c->pull_again_ms[i] < next ? c->pull_again_ms[i] : next;
    }
    for (int i = 0; i < c->conn.n_shards; i++) {
        next = c->init_again_ms[i] > 0 && c->init_again_ms[i] < next ? c->init_again_ms[i] : next;
    }
    next = c->redo_ms > 0 && c->redo_ms < next ? c->redo_ms : next;
    next = c->next_ask_ms < next ? c->next_ask_ms : next;
    return next > now ? (long)(next - now) + 1 : 0;
}

// What is due while waiting: refused PULLs and pushes sent again, and,
// after a long wait, the question where the job is.
static zps_err s_due(zps_client *c, uint64_t step, double now)
{
    zps_err err = ZPS_OK;
    for (int i = 0; err == ZPS_OK && i < c->conn.n_shards; i++) {
        if (c->pull_again_ms[i] > 0 && now >= c->pull_again_ms[i]) {
            c->pull_again_ms[i] = 0;
            err = zps_conn_pull(&c->conn, i, step);
        }
        if (err == ZPS_OK && c->init_again_ms[i] > 0 && now >= c->init_again_ms[i]) {
            c->init_again_ms[i] = 0;
            err = zps_conn_send_init(&c->conn, i, c->params);
        }
    }
    if (err == ZPS_OK && c->redo_ms > 0 && now >= c->redo_ms) {
        c->redo_ms = 0;
        s_queue_extras(c, step);
    }
    if (err == ZPS_OK && now >= c->next_ask_ms) {
        err = s_where_is_job(c, step);
    }
    return err;
}

static bool s_queued(const zps_client *c)
{
    return c->queue_pos < c->n_queue;
}

// Receives every bucket of every shard for wait_step, then makes them the
// caller's parameters. Returns ZPS_OK with pieces queued when some of the
// step before are to be computed first (the next call goes on waiting),
// ZPS_OK with none when the parameters are in place. The wait has no
// fixed end while the job lives: after a while the coordinator is asked
// where the job is, and the worker goes on waiting, catches up, joins
// again, or ends (the job is over, or the coordinator stayed silent for
// the timeout).
static zps_err s_wait(zps_client *c)
{
    uint64_t step = c->wait_step;
    zmq_pollitem_t items[ZPS_CONN_MAX_SHARDS];
    for (int i = 0; i < c->conn.n_shards; i++) {
        items[i] = (zmq_pollitem_t){.socket = c->conn.shards[i].sock, .events = ZMQ_POLLIN};
    }
    if (!c->wait_begun) {
        c->wait_begun = true;
        for (int i = 0; i < c->conn.n_shards; i++) {
            c->conn.shards[i].received = (zps_bucket_set){0};
        }
        s_release_held(c); // of a wait that did not finish
        c->wait_start = zps_clock_ms();
        c->next_log = c->wait_start + ZPS_CLIENT_WAIT_LOG_MS;
        c->next_beat = c->wait_start + c->conn.heartbeat_ms;
        double ask_after = 4 * c->usual_step_ms > ZPS_CLIENT_ASK_EVERY_MS ? 4 * c->usual_step_ms
                                                                            : ZPS_CLIENT_ASK_EVERY_MS;
        c->next_ask_ms = c->wait_start + ask_after;
        c->answered_ms = c->wait_start;
    }
    while (!s_all_received(c) || s_queued(c)) {
        if (s_queued(c)) {
            return ZPS_OK;
        }
        if (c->conn.stop) {
            return ZPS_ECLOSED;
        }
        int rc = zmq_poll(items, c->conn.n_shards, s_poll_ms(c, zps_clock_ms()));
        if (rc < 0 && errno != EINTR) {
            zps_log_error("zmq_poll on the shard sockets: %s", zmq_strerror(errno));
            return ZPS_EIO;
        }
        for (int i = 0; rc > 0 && i < c->conn.n_shards; i++) {
            if (!(items[i].revents & ZMQ_POLLIN)) {
                continue;
            }
            zps_wire_msg m;
            zps_err err = zps_wire_recv(c->conn.shards[i].sock, false, &m);
            if (err == ZPS_OK) {
                err = s_take_message(c, i, step, &m);
            }
            zps_wire_msg_fini(&m);
            if (err != ZPS_OK && err != ZPS_ETIMEDOUT) {
                return err;
            }
        }
        double now = zps_clock_ms();
        zps_err err = s_due(c, step, now);
        if (err != ZPS_OK) {
            return err;
        }
        if (now > c->next_beat) {
            // From the main socket too: a restarted coordinator learns from
            // it where this worker's replies go.
            Zps__Header h;
            zps_wire_header_init(&h, ZPS__MSG_TYPE__HEARTBEAT);
            h.flags = 1;
            (void)zps_conn_send(&c->conn, 0, &h, NULL, 0, NULL);
            c->next_beat = now + c->conn.heartbeat_ms;
        }
        if (now > c->next_log) {
            for (int i = 0; i < c->conn.n_shards; i++) {
                if (!s_shard_received(&c->conn.shards[i])) {
                    zps_log_info("waiting %.0f s for step %llu parameters from shard %d (%s)",
                                 (now - c->wait_start) / 1e3, (unsigned long long)step, i,
                                 c->conn.shards[i].endpoint);
                }
            }
            c->next_log = now + ZPS_CLIENT_WAIT_LOG_MS;
        }
    }
    for (int i = 0; i < c->conn.n_shards; i++) {
        c->pull_again_ms[i] = 0;
    }
    c->redo_ms = 0;
    s_take_held(c);
    zps_schedule_forget_before(&c->schedule, step);
    double now = zps_clock_ms();
    if (c->params_ms > 0) {
        double d = now - c->params_ms;
        c->usual_step_ms = c->usual_step_ms > 0 ? 0.9 * c->usual_step_ms + 0.1 * d : d;
    }
    c->params_ms = now;
    return ZPS_OK;
}

// Whether `step` is over without this worker: true after a pause (a stall,
// a swap storm) so long that the coordinator handed this worker's slice on
// and moved past the step. Then the slice is not computed (the others'
// copy counted), and the worker goes on at the step in progress, or at
// the one after it when speculation handed its slice of the step in
// progress to others too (the coordinator says so): otherwise nobody else
// computes that slice, and the step would wait for it for good. Only a
// slice begun ZPS_CLIENT_LATE_STEPS usual steps after its parameters came
// asks.
static bool s_step_over(zps_client *c, uint64_t step)
{
    double waited = zps_clock_ms() - c->params_ms;
    if (!c->conn.ask || c->usual_step_ms <= 0 || waited < ZPS_CLIENT_LATE_STEPS * c->usual_step_ms) {
        return false;
    }
    zps_wire_msg m;
    if (zps_conn_ask(&c->conn, ZPS_CLIENT_ASK_MS, &m) != ZPS_OK) {
        return false; // no answer in time: compute it
    }
    uint64_t at = m.hdr->status->steps_done_all; // over once every shard completed it
    uint64_t covered = m.hdr->status->asker_covered;
    bool gone = m.hdr->status->asker == ZPS__MEMBER_STATE__MEMBER_GONE;
    zps_wire_msg_fini(&m);
    if (gone) {
        zps_log_warn("rank %u was handed on by the coordinator during a pause of %.0f ms: "
                     "joining the job again", c->conn.rank, waited);
        c->rejoin = true;
        return true;
    }
    if (at <= step) {
        return false; // still open: compute it
    }
    // The step in progress too, if speculation handed this worker's slice
    // of it to others: computing it beside them would only slow them.
    uint64_t next = covered > at ? at + 1 : at;
    c->rollback_to = next < c->total_steps ? next : c->total_steps;
    zps_log_warn("step %llu was done without this worker (%.0f ms late; the coordinator is at "
                 "step %llu): rejoining at step %llu", (unsigned long long)step, waited,
                 (unsigned long long)at, (unsigned long long)c->rollback_to);
    return true;
}

// Pushes [lo, hi) of grad, of the piece handed out, to shard i.
static zps_err s_push(zps_client *c, int i, uint64_t lo, uint64_t hi, const float *grad,
                      float loss, double data_ms)
{
    return zps_conn_push(&c->conn, i, c->cur_step, &c->cur_work, lo, hi, c->dtype, grad, c->wire,
                         loss, (float)data_ms, (float)(zps_clock_ms() - c->step_t0 - data_ms),
                         &c->grad_ref);
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

// ---------------------------------------------------------------------------
// The public API: the handle.

int zps_version(int *major, int *minor, int *patch)
{
    if (major) {
        *major = ZPS_VERSION_MAJOR;
    }
    if (minor) {
        *minor = ZPS_VERSION_MINOR;
    }
    if (patch) {
        *patch = ZPS_VERSION_PATCH;
    }
    return ZPS_VERSION;
}

void zps_set_log_hook(zps_log_fn fn, void *arg)
{
    zps_log_set_hook(fn, arg);
}

void zps_set_log_level(int level)
{
    if (level >= ZPS_LOG_LEVEL_DEBUG && level <= ZPS_LOG_LEVEL_ERROR) {
        zps_log_set_level((zps_log_level)level);
    }
}

zps_client *zps_client_new(const char *coordinator)
{
    if (!coordinator || strlen(coordinator) >= sizeof ((zps_conn_shard *)0)->endpoint) {
        return NULL;
    }
    zps_client *c = calloc(1, sizeof *c);
    if (!c) {
        return NULL;
    }
    c->timeout_ms = 60000;
    c->join_timeout_ms = 600000;
    c->done_step = UINT64_MAX;
    c->ahead_of = UINT64_MAX;
    c->retry_ms = ZPS_CLIENT_RETRY_MS;
    zps_decl_init(&c->decl);
    if (zps_conn_init(&c->conn, coordinator) != ZPS_OK) {
        free(c);
        return NULL;
    }
    c->conn.decl = &c->decl;
    return c;
}

void zps_client_destroy(zps_client **cp)
{
    zps_client *c = *cp;
    if (!c) {
        return;
    }
    s_release_held(c);
    free(c->held);
    zps_conn_fini(&c->conn); // then ZeroMQ lets go of the caller's gradient
    free(c->wire);
    zps_round_fini(&c->round);
    zps_sampler_fini(&c->sampler);
    zps_decl_fini(&c->decl);
    free(c);
    *cp = NULL;
}

const char *zps_errmsg(const zps_client *c)
{
    return c ? c->errmsg : "no client";
}

zps_err zps_errcode(const zps_client *c)
{
    return c ? c->errcode : ZPS_EINVAL;
}

zps_err zps_client_set_int(zps_client *c, zps_opt opt, int64_t v)
{
    s_begin(c);
    int *dst = NULL;
    int64_t lo = 0, hi = 0;
    switch (opt) {
    case ZPS_OPT_SHARE:
        if (v < 0 || v > (1 << 24)) {
            return s_einval(c, "share %lld: 0..%d samples", (long long)v, 1 << 24);
        }
        c->conn.share = (uint32_t)v;
        return ZPS_OK;
    case ZPS_OPT_TIMEOUT_MS: dst = &c->timeout_ms; lo = 100; hi = 86400000; break;
    case ZPS_OPT_JOIN_TIMEOUT_MS: dst = &c->join_timeout_ms; lo = 100; hi = 86400000; break;
    case ZPS_OPT_HEARTBEAT_MS: dst = &c->conn.heartbeat_ms; lo = 10; hi = 3600000; break;
    case ZPS_OPT_SNDBUF: dst = &c->conn.sndbuf; lo = -1; hi = 1L << 30; break; // -1: auto
    case ZPS_OPT_SHM: dst = &c->conn.shm; lo = ZPS_CONN_SHM_OFF; hi = ZPS_CONN_SHM_ON; break;
    default: return s_einval(c, "option %d is not a number option", (int)opt);
    }
    if (v < lo || v > hi) {
        return s_einval(c, "option %d: %lld is not in %lld..%lld", (int)opt, (long long)v,
                        (long long)lo, (long long)hi);
    }
    *dst = (int)v;
    return ZPS_OK;
}

zps_err zps_client_set_str(zps_client *c, zps_opt opt, const char *v)
{
    s_begin(c);
    if (opt != ZPS_OPT_DEVICE) {
        return s_einval(c, "option %d is not a text option", (int)opt);
    }
    if (!v || strlen(v) >= sizeof c->conn.device) {
        return s_einval(c, "device: up to %zu characters", sizeof c->conn.device - 1);
    }
    snprintf(c->conn.device, sizeof c->conn.device, "%s", v);
    return ZPS_OK;
}

zps_err zps_client_set_curve(zps_client *c, const char *secret_file, const char *server_key_file)
{
    s_begin(c);
    if (!secret_file || !server_key_file) {
        return s_einval(c, "a CURVE secret key goes with the servers' public key");
    }
    zps_err err = zps_curve_load(&c->conn.curve, secret_file, server_key_file);
    return err == ZPS_OK ? ZPS_OK : s_fail(c, err);
}

void zps_client_stop(zps_client *c)
{
    if (c) {
        c->conn.stop = 1;
    }
}

zps_err zps_connect(zps_client *c)
{
    s_begin(c);
    zps_err err = zps_conn_connect(&c->conn);
    if (err != ZPS_OK) {
        return s_fail(c, err);
    }
    return ZPS_OK;
}

zps_err zps_join(zps_client *c)
{
    s_begin(c);
    if (!c->conn.shards[0].sock || c->joined) {
        return s_einval(c, c->joined ? "joined already" : "zps_connect first");
    }
    char why[256];
    if (zps_decl_any(&c->decl) && zps_layout_check(&c->decl.layout, why, sizeof why) != ZPS_OK) {
        return s_einval(c, "the declared model: %s", why);
    }
    if (zps_decl_any(&c->decl) && !c->decl.has_dataset) {
        return s_einval(c, "a declared model needs its dataset declared (zps_declare_dataset)");
    }
    zps_wire_msg m = {0};
    zps_err err = s_hello_until_job(c, &m);
    if (err == ZPS_OK && m.hdr->type != ZPS__MSG_TYPE__JOB) {
        zps_log_error("expected JOB, got %s", zps_wire_type_name(m.hdr->type));
        err = ZPS_EPROTO;
    }
    if (err == ZPS_OK) {
        err = s_take_job(c, m.hdr);
    }
    zps_wire_msg_fini(&m);
    if (err == ZPS_OK && c->decl.has_dataset) {
        return zps_set_dataset(c, c->decl.n_train, c->decl.n_test);
    }
    return err == ZPS_OK ? ZPS_OK : s_fail(c, err);
}

zps_err zps_declare_tensor(zps_client *c, const char *name, int ndim, const int64_t *shape)
{
    s_begin(c);
    if (c->joined) {
        return s_einval(c, "a model is declared before zps_join");
    }
    char why[256];
    zps_err err = zps_decl_tensor(&c->decl, name, ndim, shape, why, sizeof why);
    if (err == ZPS_EINVAL) {
        return s_einval(c, "%s", why);
    }
    return err == ZPS_OK ? ZPS_OK : s_fail(c, err);
}

zps_err zps_declare_dataset(zps_client *c, uint32_t n_train, uint32_t n_test)
{
    s_begin(c);
    char why[128];
    if (c->joined) {
        return s_einval(c, "a dataset is declared before zps_join");
    }
    if (zps_decl_dataset(&c->decl, n_train, n_test, why, sizeof why) != ZPS_OK) {
        return s_einval(c, "%s", why);
    }
    return ZPS_OK;
}

uint64_t zps_info_u64(const zps_client *c, int key)
{
    if (!c || !c->joined) {
        return 0;
    }
    switch (key) {
    case ZPS_INFO_JOB_ID: return c->conn.job_id;
    case ZPS_INFO_RANK: return c->conn.rank;
    case ZPS_INFO_SEED: return c->seed;
    case ZPS_INFO_GLOBAL_BATCH: return c->global_batch;
    case ZPS_INFO_TOTAL_STEPS: return c->total_steps;
    case ZPS_INFO_STEPS_PER_EPOCH: return c->steps_per_epoch;
    case ZPS_INFO_START_STEP: return c->start_step;
    case ZPS_INFO_STEP: return c->t;
    case ZPS_INFO_N_PARAMS: return c->model.n_params;
    case ZPS_INFO_N_BUCKETS: return (uint64_t)zps_model_n_buckets(&c->model);
    case ZPS_INFO_MODE: return c->mode.diloco ? ZPS_MODE_DILOCO : ZPS_MODE_SYNC;
    case ZPS_INFO_INNER_STEPS: return c->mode.inner_steps;
    case ZPS_INFO_INNER_OPTIM:
        return !c->mode.diloco                   ? 0
               : c->inner.kind == ZPS_OPTIM_ADAM  ? ZPS_INNER_ADAM
               : c->inner.kind == ZPS_OPTIM_ADAMW ? ZPS_INNER_ADAMW
                                                  : ZPS_INNER_SGD;
    case ZPS_INFO_INNER_NESTEROV: return c->mode.diloco && c->inner.nesterov;
    default: return 0;
    }
}

double zps_info_f64(const zps_client *c, int key)
{
    if (!c || !c->joined || !c->mode.diloco) {
        return 0;
    }
    switch (key) {
    case ZPS_INFO_INNER_LR: return c->inner.lr;
    case ZPS_INFO_INNER_MOMENTUM: return c->inner.momentum;
    case ZPS_INFO_INNER_WEIGHT_DECAY: return c->inner.weight_decay;
    case ZPS_INFO_INNER_BETA1: return c->inner.beta1;
    case ZPS_INFO_INNER_BETA2: return c->inner.beta2;
    case ZPS_INFO_INNER_EPS: return c->inner.eps;
    default: return 0;
    }
}

// The schedule stays in the library: the caller needs only each update's
// rate, and the schedules may grow without the API changing.
double zps_inner_lr(const zps_client *c, uint64_t step)
{
    if (!c || !c->joined || !c->mode.diloco) {
        return 0;
    }
    return zps_optim_lr_at(&c->inner, step);
}

const char *zps_info_str(const zps_client *c, int key)
{
    if (!c || !c->joined) {
        return "";
    }
    return key == ZPS_INFO_MODEL ? c->model_name : key == ZPS_INFO_DATASET ? c->dataset_name : "";
}

zps_err zps_bucket_range(const zps_client *c, int bucket, uint64_t *lo, uint64_t *hi)
{
    if (!c->joined || bucket < 0 || bucket >= zps_model_n_buckets(&c->model)) {
        return ZPS_ERANGE;
    }
    zps_model_bucket(&c->model, bucket, lo, hi);
    return ZPS_OK;
}

zps_err zps_set_params(zps_client *c, float *params, size_t n)
{
    s_begin(c);
    if (!c->joined || !params || n != c->model.n_params) {
        return s_einval(c, "the parameter buffer must hold the model's %zu floats (join first)",
                        c->joined ? c->model.n_params : 0);
    }
    if (c->dtype != ZPS_DTYPE_F32 && !c->wire &&
        !(c->wire = malloc(c->model.n_params * zps_dtype_size(c->dtype)))) {
        zps_log_error("cannot allocate the wire buffer");
        return s_fail(c, ZPS_ENOMEM);
    }
    c->params = params;
    return ZPS_OK;
}

zps_err zps_set_dataset(zps_client *c, uint32_t n_train, uint32_t n_test)
{
    s_begin(c);
    if (!c->joined) {
        return s_einval(c, "join first");
    }
    zps_sampler_fini(&c->sampler);
    c->has_data = false;
    zps_err err = zps_sampler_init(&c->sampler, c->seed, n_train, c->global_batch);
    if (err != ZPS_OK) {
        return s_fail(c, err);
    }
    if (c->sampler.steps_per_epoch != c->steps_per_epoch) {
        zps_log_error("my dataset gives %llu steps per epoch, the job %llu",
                      (unsigned long long)c->sampler.steps_per_epoch,
                      (unsigned long long)c->steps_per_epoch);
        return s_fail(c, ZPS_EINVAL);
    }
    c->has_data = true;
    c->n_test = n_test;
    return ZPS_OK;
}

// ---------------------------------------------------------------------------
// The public API: work.

// Ends the loop for err: stopped, over, or failed (logged as the step's).
static int s_end(zps_client *c, zps_err err)
{
    c->phase = P_OVER;
    c->handed = false;
    if (c->conn.stop) {
        if (c->training) {
            zps_log_info("stopped by signal at step %llu: leaving the job",
                         (unsigned long long)c->t);
        }
        c->stopped_at = c->training ? c->t : 0;
        s_fail(c, ZPS_ECLOSED);
        return ZPS_NEXT_STOPPED;
    }
    if (c->job_over) {
        s_fail(c, ZPS_ECLOSED);
        return ZPS_NEXT_OVER;
    }
    if (c->training) {
        zps_log_error("step %llu failed: %s", (unsigned long long)c->t, zps_strerror(err));
    }
    s_fail(c, err);
    return ZPS_NEXT_ERROR;
}

// ---------------------------------------------------------------------------
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
static int s_outer_hand_out(zps_client *c, zps_work *out)
{
    zps_err err = zps_wire_ref_wait(&c->grad_ref, c->timeout_ms);
    while (err == ZPS_OK && c->inner_h == c->inner_n && s_queued(c)) {
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
        return s_end(c, err);
    }
    if (c->inner_h == c->inner_n) {
        return 0;
    }
    uint32_t h = c->inner_h++;
    uint64_t batch = c->t * c->mode.inner_steps + h;
    const uint32_t *idx = NULL;
    if (c->has_data &&
        !(idx = zps_sampler_slice(&c->sampler, batch, c->own.offset, c->own.count))) {
        return s_end(c, ZPS_EINVAL);
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

// Hands out the next queued piece.
static int s_hand_out(zps_client *c, zps_work *out)
{
    if (c->mode.diloco) {
        return s_outer_hand_out(c, out);
    }
    zps_piece p = c->queue[c->queue_pos++];
    uint64_t step = c->queue_step;
    // ZeroMQ may still hold the last push's frames of the gradient buffer.
    zps_err err = zps_wire_ref_wait(&c->grad_ref, c->timeout_ms);
    if (err != ZPS_OK) {
        return s_end(c, err);
    }
    const uint32_t *idx = NULL;
    if (c->has_data && !(idx = zps_sampler_slice(&c->sampler, step, p.offset, p.count))) {
        return s_end(c, ZPS_EINVAL);
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
static zps_err s_start_wait(zps_client *c, uint64_t step, s_after after, bool pull)
{
    c->phase = P_WAIT;
    c->after = after;
    c->wait_step = step;
    c->wait_begun = false;
    c->n_queue = c->queue_pos = 0;
    return pull ? s_pull(c, step) : ZPS_OK;
}

// The wait for parameters ended with err. Returns 0 to go on, or what
// zps_next_work returns.
static int s_wait_over(zps_client *c, zps_err err)
{
    c->wait_begun = false;
    c->n_queue = c->queue_pos = 0;
    if (c->after == A_STEP) {
        c->sum_wait_ms += zps_clock_ms() - c->t2;
        c->timed_steps++;
    }
    if (err == ZPS_EAGAIN) {
        c->phase = P_START_OVER;
        return 0;
    }
    if (err != ZPS_OK) {
        return s_end(c, err);
    }
    if (!c->training) {
        c->training = true;
        c->train_start = zps_clock_ms();
    }
    if (c->after == A_JOIN) {
        c->t = c->wait_step;
        c->phase = P_STEP;
        return 0;
    }
    if (c->after == A_START_OVER) {
        // Gone back, or admitted anew: the last push may not have counted.
        zps_round_reset_feedback(&c->round);
        c->t = c->wait_step;
        c->phase = P_STEP;
        bool rejoined = c->rejoined;
        c->rejoined = false;
        return rejoined ? ZPS_NEXT_REJOINED : ZPS_NEXT_ROLLBACK;
    }
    // Step t is over: at an epoch's end (and the job's), the test set is
    // split as the step was: whoever computed samples [a, b) of the global
    // batch B evaluates records [n a / B, n b / B). The slices tile the
    // batch, so the ranges tile the test set, a worker's share of it
    // follows its share of the batch, and the pieces of a late slice carry
    // the evaluation of its owner, who may have been away then.
    // A diloco round is H global batches: its end may end an epoch.
    uint64_t t = c->t, h = c->mode.diloco ? c->mode.inner_steps : 1, spe = c->steps_per_epoch;
    bool epoch_end = (t + 1) * h / spe > t * h / spe;
    c->n_eval = c->eval_pos = 0;
    if (c->has_data && (epoch_end || t + 1 == c->total_steps) && c->done_step == t) {
        uint64_t B = c->global_batch;
        for (int i = 0; i < c->n_done; i++) {
            c->eval_lo[c->n_eval] = (uint32_t)(c->n_test * c->done[i].offset / B);
            c->eval_hi[c->n_eval++] =
                (uint32_t)(c->n_test * (c->done[i].offset + c->done[i].count) / B);
        }
        // The epoch that ended in the round (the later one, if two did), or
        // the job's last, still in progress.
        c->eval_epoch = epoch_end ? (t + 1) * h / spe - 1 : ((t + 1) * h - 1) / spe;
    }
    c->phase = P_EVAL;
    return 0;
}

int zps_next_work(zps_client *c, zps_work *out)
{
    s_begin(c);
    if (!c->params && c->phase == P_NEW) {
        s_einval(c, "zps_set_params first");
        return ZPS_NEXT_ERROR;
    }
    // The outcome of the piece handed out last.
    zps_err piece_err = ZPS_OK;
    if (c->handed) {
        c->handed = false;
        piece_err = c->skip ? ZPS_EAGAIN : c->push_err;
    }
    for (;;) {
        if (c->conn.stop && c->phase != P_DONE && c->phase != P_OVER) {
            return s_end(c, ZPS_ECLOSED);
        }
        zps_err err = ZPS_OK;
        int r = 0;
        switch (c->phase) {
        case P_NEW:
            zps_conn_beat(&c->conn);
            zps_conn_open_ask(&c->conn);
            if ((err = s_send_init(c)) != ZPS_OK) {
                return s_end(c, err);
            }
            c->t = c->start_step;
            err = s_start_wait(c, c->start_step, A_JOIN, true);
            if (err != ZPS_OK) {
                return s_end(c, err);
            }
            break;
        case P_STEP:
            if (c->t >= c->total_steps) {
                s_log_timing(c, zps_clock_ms() - c->train_start);
                c->phase = P_DONE;
                return ZPS_NEXT_DONE;
            }
            if (c->mode.diloco) {
                zps_round_begin(&c->round, c->params);
                c->round_pushed = false;
                c->inner_h = c->inner_n = 0;
            }
            c->n_queue = zps_schedule_take(&c->schedule, c->t, c->queue, ZPS_CLIENT_QUEUE);
            c->queue_pos = 0;
            c->queue_step = c->t;
            c->n_step_work = c->n_queue;
            c->phase = P_COMPUTE;
            break;
        case P_COMPUTE:
            if (piece_err == ZPS_EAGAIN) {
                c->phase = P_START_OVER; // its step was over: catch up
                piece_err = ZPS_OK;
                break;
            }
            if (piece_err != ZPS_OK) {
                return s_end(c, piece_err);
            }
            if (s_queued(c) && (r = s_hand_out(c, out)) != 0) {
                return r;
            }
            if (c->mode.diloco && c->inner_h < c->inner_n) {
                return s_hand_out(c, out); // the round's inner steps go on
            }
            if (c->mode.diloco && c->inner_n > 0 && !c->round_pushed) {
                s_einval(c, "round %llu: its last inner step was handed out and never ended "
                            "with zps_inner_done", (unsigned long long)c->t);
                return s_end(c, ZPS_EINVAL);
            }
            // Nothing to compute (a member only from the next step on): ask.
            c->t2 = zps_clock_ms();
            err = s_start_wait(c, c->t + 1, A_STEP, c->n_step_work == 0);
            if (err != ZPS_OK && (r = s_wait_over(c, err)) != 0) {
                return r;
            }
            break;
        case P_WAIT:
            err = piece_err;
            piece_err = ZPS_OK;
            if (err == ZPS_OK) {
                err = s_wait(c);
            }
            if (err == ZPS_OK && s_queued(c)) {
                if ((r = s_hand_out(c, out)) != 0) {
                    return r;
                }
                break; // diloco: pushed as missing, nothing to train; wait on
            }
            if ((r = s_wait_over(c, err)) != 0) {
                return r;
            }
            break;
        case P_EVAL:
            if (c->eval_pos < c->n_eval) {
                int k = c->eval_pos++;
                *out = (zps_work){.kind = ZPS_WORK_EVAL, .id = ++c->work_id, .step = c->t,
                                  .epoch = c->eval_epoch, .offset = c->eval_lo[k],
                                  .count = c->eval_hi[k] - c->eval_lo[k]};
                return ZPS_NEXT_EVAL;
            }
            c->t++;
            c->phase = P_STEP;
            break;
        case P_START_OVER:
            if (c->rejoin) {
                if ((err = s_rejoin(c)) != ZPS_OK) {
                    return s_end(c, err);
                }
            }
            c->t = c->rollback_to;
            err = s_start_wait(c, c->rollback_to, A_START_OVER, true);
            if (err != ZPS_OK && (r = s_wait_over(c, err)) != 0) {
                return r;
            }
            break;
        case P_DONE:
            return ZPS_NEXT_DONE;
        case P_OVER:
            s_einval(c, "the client's loop has ended");
            return ZPS_NEXT_ERROR;
        }
    }
}

// The piece w handed out last, or NULL (ZPS_EINVAL set).
static bool s_is_current(zps_client *c, const zps_work *w, uint32_t kind)
{
    if (!w || w->id != c->work_id || w->kind != kind || (kind == ZPS_WORK_TRAIN && !c->handed)) {
        s_einval(c, "not the work item handed out last");
        return false;
    }
    return true;
}

zps_err zps_work_start(zps_client *c, const zps_work *w)
{
    s_begin(c);
    if (!s_is_current(c, w, ZPS_WORK_TRAIN)) {
        return ZPS_EINVAL;
    }
    if (s_step_over(c, c->cur_step)) {
        c->skip = true;
        return ZPS_EAGAIN;
    }
    return ZPS_OK;
}

zps_err zps_push_bucket(zps_client *c, const zps_work *w, int bucket, const float *grad,
                        float loss)
{
    if (!s_is_current(c, w, ZPS_WORK_TRAIN)) {
        return ZPS_EINVAL;
    }
    if (c->mode.diloco) {
        return s_einval(c, "a diloco job pushes no gradients: step your optimizer, then "
                           "zps_inner_done");
    }
    if (bucket < 0 || bucket >= zps_model_n_buckets(&c->model) || !grad) {
        return s_einval(c, "bucket %d: the model has %d", bucket, zps_model_n_buckets(&c->model));
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
    return c->push_err == ZPS_OK ? ZPS_OK : s_fail(c, c->push_err);
}

zps_err zps_work_done(zps_client *c, const zps_work *w)
{
    if (!s_is_current(c, w, ZPS_WORK_TRAIN)) {
        return ZPS_EINVAL;
    }
    if (c->mode.diloco) {
        return s_einval(c, "a diloco job's inner steps end with zps_inner_done");
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
    return c->push_err == ZPS_OK ? ZPS_OK : s_fail(c, c->push_err);
}

zps_err zps_inner_done(zps_client *c, const zps_work *w, float loss)
{
    if (!s_is_current(c, w, ZPS_WORK_TRAIN)) {
        return ZPS_EINVAL;
    }
    if (!c->mode.diloco || w->inner != c->inner_h - 1 || c->inner_taken == w->id) {
        return s_einval(c, !c->mode.diloco ? "not a diloco job: zps_push_bucket, zps_work_done"
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
    return err == ZPS_OK ? ZPS_OK : s_fail(c, err);
}

zps_err zps_eval_done(zps_client *c, const zps_work *w, uint32_t correct, double loss_sum)
{
    s_begin(c);
    if (!s_is_current(c, w, ZPS_WORK_EVAL)) {
        return ZPS_EINVAL;
    }
    Zps__Eval ev = ZPS__EVAL__INIT;
    ev.epoch = w->epoch;
    ev.correct = correct;
    ev.loss_sum = loss_sum;
    ev.count = w->count;
    ev.offset = w->offset;
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__EVAL);
    h.eval = &ev;
    zps_log_debug("epoch %llu: %u of %u test records right", (unsigned long long)w->epoch,
                  correct, w->count);
    zps_err err = zps_conn_send(&c->conn, 0, &h, NULL, 0, NULL);
    return err == ZPS_OK ? ZPS_OK : s_fail(c, err);
}

zps_err zps_batch_indices(uint64_t seed, uint32_t n_train, uint32_t global_batch, uint64_t step,
                          uint32_t offset, uint32_t count, uint32_t *out)
{
    if (!out || global_batch == 0 || offset > global_batch || count > global_batch - offset) {
        return ZPS_EINVAL;
    }
    zps_sampler s = {0};
    zps_err err = zps_sampler_init(&s, seed, n_train, global_batch);
    const uint32_t *idx = err == ZPS_OK ? zps_sampler_slice(&s, step, offset, count) : NULL;
    if (err == ZPS_OK && !idx) {
        err = ZPS_ENOMEM;
    }
    if (idx) {
        memcpy(out, idx, count * sizeof *out);
    }
    zps_sampler_fini(&s);
    return err;
}

zps_err zps_leave(zps_client *c)
{
    s_begin(c);
    if (!c->conn.job_id) {
        return ZPS_OK;
    }
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__BYE);
    h.step = c->phase == P_DONE ? c->total_steps : c->stopped_at;
    zps_err err = zps_conn_send(&c->conn, 0, &h, NULL, 0, NULL);
    return err == ZPS_OK ? ZPS_OK : s_fail(c, err);
}
