/* zps_server.c - the server loop: sockets, dispatch, timers.
 *
 * Every message read is checked against the message table
 * (server/zps_msgtab.h) in s_dispatch before any handler runs; a refusal
 * is counted, logged (a bounded number of lines a second) with the type,
 * the rank or shard it claims and the peer's address, and answered with
 * ERROR where the sender waits for an answer. Nothing a peer sends stops
 * the loop: the only ways out are the end of the run, a signal, and (on
 * shards > 0) the coordinator's own refusal or a rollback to a checkpoint
 * this shard does not have. */
#include "zps_server.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "common/zps_clock.h"
#include "common/zps_dataset.h"
#include "common/zps_layout.h"
#include "common/zps_log.h"
#include "common/zps_model.h"
#include "common/zps_pidfile.h"
#include "common/zps_wire.h"
#include "server/zps_ckpt.h"
#include "server/zps_coord.h"
#include "server/zps_http.h"
#include "server/zps_late.h"
#include "server/zps_msgtab.h"
#include "server/zps_shard.h"
#include "server/zps_shard_io.h"
#include "server/zps_timers.h"
#include "server/zps_token.h"
#include "server/zps_zap.h"
#include "common/zps_curve.h"

#define ZPS_SERVER_POLL_MS 200
#define ZPS_SERVER_REGISTER_MS 2000.0
#define ZPS_SERVER_SEND_TIMEOUT_MS 5000
#define ZPS_SERVER_METRICS_BUF (1 << 16) // longer than a step record of every member
#define ZPS_SERVER_STOP_GRACE_MS 3000.0 // after SIGTERM, for the step in progress to finish
#define ZPS_SERVER_TICK_MS 50.0         // the coordinator's clock: evictions, waiting lines
#define ZPS_SERVER_PUBLISH_MS 500.0     // refresh of what --http serves
#define ZPS_SERVER_DECLARE_LOG_MS 20000.0 // "waiting for the model" line

struct zps_server {
    const zps_server_opts *o;                    // borrowed: flags
    void *ctx;                                   // owned
    FILE *metrics;                               // owned: --metrics-log, or NULL
    bool pid_written;                            // --pid-file is ours to remove
    void *sock;                                  // owned: ROUTER for workers (and shards, on 0)
    void *up;                                    // owned: shard > 0: DEALER to the coordinator
    char endpoint[256];                          // what sock is bound to
    zps_model_spec model;                        // the job's model
    zps_coord *coord;                            // owned: shard 0 only
    zps_shard *shard;                            // owned: shard 0 from the start, others once assigned
    zps_shard_io io;                             // the shard's side of the wire
    uint64_t job_id;                             // shard > 0: from ASSIGN
    uint32_t global_batch;                       // B, from the job
    uint64_t total_steps;                        // steps of the run
    zps_dtype dtype;                             // element type of tensors on the wire
    uint64_t bad_messages;                       // refused or dropped messages
    uint32_t plan_gen;                           // newest generation given to the shard
    double step_start_ms;                        // when the current step began
    bool finished;                               // shard > 0: the last step is done
    zps_curve curve;                             // CURVE keys, if on
    zps_zap *zap;                                // owned: admits CURVE clients, if on
    zps_http *http;                              // owned: /metrics and /status, if asked
    uint64_t ckpt_every;                         // checkpoint after every this many steps
    bool stopping;                               // a signal was seen: stop between steps
    bool leave;                                  // the stop's grace ran out: stop now
    uint64_t shard_token;                        // shard > 0: the secret of its ASSIGN (0: none)
    zps_log_limit refusals;                      // bounds the log lines refusals cause
    char dataset[256];                           // shard 0: the dataset spec ("size:N": declared)
    uint32_t size_train;                         // external, --dataset size:N (0: the workers')
    Zps__Hello *declared;                        // owned: external: the model declared, or NULL
    zps_timers timers;                           // the loop's periodic and deadline checks
    int t_stall;                                 // timer ids in timers (-1: not added)
    int t_register;
    int t_speculate;
    int t_stop_grace;
    int t_declare_log;
};
typedef struct zps_server s_server;

static volatile sig_atomic_t s_stop;
static volatile sig_atomic_t s_reload_keys;

static void s_on_signal(int sig)
{
    if (sig == SIGHUP) {
        s_reload_keys = 1;
    } else {
        s_stop = 1;
    }
}

static uint64_t s_job_id(const s_server *srv)
{
    return srv->coord ? zps_coord_job_id(srv->coord) : srv->job_id;
}

// ---------------------------------------------------------------------------
// Refusals: one line, one counter, an ERROR reply; parameters untouched.

// A refusal never changes state: a counter, a line naming the type, the
// sender it claims and its address (at most ZPS_LOG_LIMIT_LINES a second:
// a flood must not fill the disk), and an ERROR where the sender waits for
// an answer (the message table says which do; an undecodable message is
// answered, its sender is lost otherwise).
static void s_refuse(s_server *srv, zps_wire_msg *m, zps_err err, const char *why)
{
    srv->bad_messages += err != ZPS_EAGAIN;
    const char *type = m->hdr ? zps_wire_type_name((int)m->hdr->type) : "undecodable message";
    char who[32] = "", claim[48] = "";
    if (m->hdr) {
        zps_msgtab_claim(m->hdr, who, sizeof who);
    }
    if (who[0]) {
        snprintf(claim, sizeof claim, " (%s)", who);
    }
    uint64_t left_out;
    if (err == ZPS_EAGAIN) {
        // "Not yet" is part of the protocol, not a bad message: its
        // sender sends again.
        zps_log_debug("not yet: %s%s: %s", type, claim, why);
    } else if (zps_log_limit_pass(&srv->refusals, zps_clock_ms(), &left_out)) {
        zps_log_warn("refused %s%s from %s: %s (%s) [%llu refused so far%s]", type, claim,
                     m->peer[0] ? m->peer : "?", why, zps_strerror(err),
                     (unsigned long long)srv->bad_messages,
                     left_out ? "; some not logged, at most 10 lines a second" : "");
    }
    bool reply = !m->hdr || m->hdr->version != ZPS_WIRE_VERSION ||
                 zps_msgtab_rule_of((int)m->hdr->type)->reply;
    if (m->has_route && reply && m->hdr) {
        // The refused message named, so that its sender knows what to send again.
        (void)zps_wire_send_refusal(srv->sock, &m->route, s_job_id(srv), m->hdr, err, why);
    } else if (m->has_route && reply) {
        (void)zps_wire_send_error(srv->sock, &m->route, s_job_id(srv),
                                  srv->shard ? zps_shard_step(srv->shard) : 0, err, why);
    }
}

static void s_sync_coord_plan(s_server *srv);

static void s_end_step(s_server *srv)
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
        s_sync_coord_plan(srv);
        zps_late_speculate_ahead(&srv->io, srv->coord, srv->sock, srv->o->speculate_after,
                                 step + 1, srv->total_steps);
    } else {
        Zps__Header h;
        zps_wire_header_init(&h, ZPS__MSG_TYPE__STEP_DONE);
        h.job_id = srv->job_id;
        h.shard = srv->o->shard;
        h.shard_token = srv->shard_token;
        h.step = step + 1;
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
        zps_log_info("shard %u: last step done", srv->o->shard);
        srv->finished = true;
    }
}

// A push, and what it means beyond the shard: its timing for the
// coordinator, the step boundary, the end of the step.
static void s_on_push(s_server *srv, zps_wire_msg *m)
{
    double quorum_ms = srv->io.quorum_ms;
    int ready;
    zps_err err = zps_shard_io_on_push(&srv->io, m, &ready);
    if (srv->io.quorum_ms != quorum_ms) {
        zps_timers_at(&srv->timers, srv->t_speculate, srv->io.quorum_ms); // the slices not in
    }
    if (srv->coord && err == ZPS_OK) {
        zps_coord_note_push(srv->coord, m->hdr->step, m->hdr->rank, m->hdr->samples,
                            m->hdr->compute_ms, zps_clock_ms());
    }
    if (ready < 0) {
        return;
    }
    if (srv->coord && zps_shard_io_between_steps(&srv->io)) {
        // The step boundary: the next step's plan goes out before its
        // first parameters (on the same socket, so it arrives first).
        zps_coord_release(srv->coord, srv->sock, zps_shard_step(srv->shard) + 1);
        s_sync_coord_plan(srv);
    }
    zps_shard_io_apply(&srv->io, ready);
    if (zps_shard_step_done(srv->shard)) {
        s_end_step(srv);
    }
}

static void s_dispatch(s_server *srv, zps_wire_msg *m);

static void s_add_plan(s_server *srv, uint32_t gen, uint64_t effective, const zps_plan *plan)
{
    zps_shard_add_plan(srv->shard, gen, effective, plan);
    srv->plan_gen = gen;
    zps_shard_io_plan_added(&srv->io);
}

static void s_take_plan(s_server *srv, uint32_t gen, uint64_t effective, const zps_plan *plan)
{
    zps_shard_io_start(&srv->io, srv->shard, srv->dtype);
    srv->global_batch = plan->global_batch;
    s_add_plan(srv, gen, effective, plan);
    srv->step_start_ms = zps_clock_ms();
    zps_timers_at(&srv->timers, srv->t_stall, srv->step_start_ms + srv->o->stall_warn_ms);
}

static void s_forget_step(s_server *srv);

// Shard 0 follows the coordinator's plan generations and rollbacks directly.
// Its checkpoint was restored already, before the coordinator decided the
// rollback (s_coord_restore): what is left is to forget the step in progress.
static void s_sync_coord_plan(s_server *srv)
{
    uint64_t rollback;
    if (zps_coord_take_rollback(srv->coord, &rollback)) {
        s_forget_step(srv);
    }
    uint64_t effective;
    uint32_t gen = zps_coord_generation(srv->coord, &effective);
    if (gen == srv->plan_gen || !zps_coord_plan(srv->coord)) {
        return;
    }
    if (!zps_shard_io_started(&srv->io)) {
        s_take_plan(srv, gen, effective, zps_coord_plan(srv->coord));
    } else {
        s_add_plan(srv, gen, effective, zps_coord_plan(srv->coord));
    }
}

// Messages for the coordinator (shard 0 only; the table sent the others'
// elsewhere). Handlers refuse what is wrong in a body (a share that does
// not fit, a rollback to a step shard 0 has no checkpoint of) and log it
// themselves; the refusal is counted here.
static void s_dispatch_coord(s_server *srv, zps_wire_msg *m)
{
    zps_err err = ZPS_OK;
    if (!srv->coord) {
        s_refuse(srv, m, ZPS_ESTATE, "this shard is not the coordinator (shard 0)");
        return;
    }
    switch (m->hdr->type) {
    case ZPS__MSG_TYPE__HELLO: err = zps_coord_on_hello(srv->coord, srv->sock, m); break;
    case ZPS__MSG_TYPE__REGISTER: err = zps_coord_on_register(srv->coord, srv->sock, m); break;
    case ZPS__MSG_TYPE__READY: err = zps_coord_on_ready(srv->coord, srv->sock, m); break;
    case ZPS__MSG_TYPE__EVAL: err = zps_coord_on_eval(srv->coord, m); break;
    case ZPS__MSG_TYPE__BYE: err = zps_coord_on_bye(srv->coord, srv->sock, m); break;
    // A member's heartbeat after it was evicted or finished: its own, not a refusal.
    case ZPS__MSG_TYPE__HEARTBEAT: (void)zps_coord_on_heartbeat(srv->coord, srv->sock, m); break;
    case ZPS__MSG_TYPE__STEP_DONE: err = zps_coord_on_step_done(srv->coord, m); break;
    case ZPS__MSG_TYPE__STATUS:
        zps_coord_on_status(srv->coord, srv->sock, m, zps_shard_step(srv->shard),
                            srv->bad_messages);
        break;
    default:
        s_refuse(srv, m, ZPS_EPROTO, "not a message for the coordinator");
        return;
    }
    srv->bad_messages += err != ZPS_OK;
    s_sync_coord_plan(srv);
}

// The message table's questions, answered by this server.
static bool s_tab_member_ok(void *arg, uint32_t rank, uint64_t member_id)
{
    const s_server *srv = arg;
    return srv->coord && zps_coord_member_ok(srv->coord, rank, member_id);
}

static bool s_tab_plan_member_ok(void *arg, uint32_t rank, uint64_t member_id)
{
    const s_server *srv = arg;
    return srv->shard && zps_shard_member_has_rank(srv->shard, rank, member_id);
}

static uint32_t s_tab_newest_generation(void *arg)
{
    const s_server *srv = arg;
    return srv->shard ? zps_shard_generation(srv->shard) : 0;
}

static bool s_tab_shard_assigned(void *arg, uint32_t index)
{
    const s_server *srv = arg;
    return srv->coord && zps_coord_shard_assigned(srv->coord, index);
}

static bool s_tab_shard_token_ok(void *arg, uint32_t index, uint64_t token)
{
    const s_server *srv = arg;
    return srv->coord && zps_coord_shard_token_ok(srv->coord, index, token);
}

// Every message read goes through here, held pushes again when their plan
// comes: the table first (who may send it, with what, when), then its handler.
static void s_on_undeclared(s_server *srv, zps_wire_msg *m);

static uint32_t s_at(const s_server *srv)
{
    if (srv->coord) {
        return zps_coord_at(srv->coord);
    }
    if (srv->o->shard == 0) {
        return ZPS_AT_WAITING; // an external model not declared yet
    }
    return srv->shard ? ZPS_AT_SERVING : ZPS_AT_UNASSIGNED;
}

static void s_dispatch(s_server *srv, zps_wire_msg *m)
{
    zps_msgtab_ctx x = {
        .at = s_at(srv),
        .curve = srv->curve.on,
        .job_id = s_job_id(srv),
        .arg = srv,
        .member_ok = s_tab_member_ok,
        .plan_member_ok = s_tab_plan_member_ok,
        .newest_generation = s_tab_newest_generation,
        .shard_assigned = s_tab_shard_assigned,
        .shard_token_ok = s_tab_shard_token_ok,
    };
    char why[256];
    zps_err err = zps_msgtab_check(&x, m->hdr, m->user_id, why, sizeof why);
    if (err != ZPS_OK) {
        s_refuse(srv, m, err, why);
        return;
    }
    if (srv->o->shard == 0 && !srv->coord) {
        s_on_undeclared(srv, m);
        return;
    }
    switch (m->hdr->type) {
    case ZPS__MSG_TYPE__PULL:
        zps_shard_io_on_pull(&srv->io, m);
        break;
    case ZPS__MSG_TYPE__PUSH:
        s_on_push(srv, m);
        break;
    case ZPS__MSG_TYPE__INIT:
        zps_shard_io_on_init(&srv->io, m);
        break;
    default:
        s_dispatch_coord(srv, m);
        break;
    }
}

// What the shard's I/O asks of the server.
static void s_io_refuse(void *arg, zps_wire_msg *m, zps_err err, const char *why)
{
    s_refuse(arg, m, err, why);
}

static uint64_t s_io_job_id(void *arg)
{
    return s_job_id(arg);
}

static void s_io_again(void *arg, zps_wire_msg *m)
{
    s_dispatch(arg, m);
}

static void s_read_one(s_server *srv)
{
    zps_wire_msg m;
    zps_err err = zps_wire_recv(srv->sock, true, &m);
    if (err == ZPS_EPROTO) {
        s_refuse(srv, &m, err, "header does not decode or too many frames");
    } else if (err == ZPS_EVERSION) {
        char why[96];
        snprintf(why, sizeof why, "protocol version %u, this server speaks %d",
                 m.hdr->version, ZPS_WIRE_VERSION);
        s_refuse(srv, &m, err, why);
    } else if (err == ZPS_OK) {
        s_dispatch(srv, &m);
    }
    zps_wire_msg_fini(&m);
}

// ---------------------------------------------------------------------------
// Shards 1..N-1: register with the coordinator, take the assignment.

static void s_register(s_server *srv)
{
    Zps__Register reg = ZPS__REGISTER__INIT;
    reg.index = srv->o->shard;
    reg.shards = srv->o->shards;
    reg.endpoint = srv->o->advertise ? (char *)srv->o->advertise : srv->endpoint;
    reg.resume = srv->o->resume;
    reg.serving = srv->shard != NULL;
    reg.public_key = srv->curve.on ? srv->curve.public_ : "";
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__REGISTER);
    h.shard = srv->o->shard;
    h.shard_token = srv->shard_token; // 0 until assigned, unless a restart kept it
    h.registration = &reg;
    if (zps_wire_send(srv->up, NULL, &h, NULL, 0, NULL) != ZPS_OK) {
        zps_log_warn("could not send REGISTER to %s", srv->o->coordinator);
    }
    zps_timers_at(&srv->timers, srv->t_register, zps_clock_ms() + ZPS_SERVER_REGISTER_MS);
}

static zps_err s_take_assignment(s_server *srv, const Zps__Header *h)
{
    const Zps__Job *job = h->job;
    zps_plan plan;
    char why[256] = "";
    if (job && job->layout && zps_layout_check(job->layout, why, sizeof why) == ZPS_OK) {
        zps_layout_model(job->layout, &srv->model); // declared by the workers
    }
    if (!job || !job->optim || job->n_shards != srv->o->shards || job->shard_token == 0 ||
        why[0] || (!job->layout && zps_model_parse(job->model, &srv->model) != ZPS_OK) ||
        zps_plan_from_wire(job->plan, job->n_plan, job->global_batch, &plan) != ZPS_OK ||
        !zps_dtype_valid((int)job->wire_dtype)) {
        zps_log_error("the coordinator sent an assignment this shard cannot use%s%s",
                      why[0] ? ": " : "", why);
        return ZPS_EPROTO;
    }
    const Zps__ShardInfo *me = job->shards[srv->o->shard];
    uint64_t lo, hi;
    zps_model_shard_range(srv->model.n_params, srv->o->shard, srv->o->shards, &lo, &hi);
    if (me->lo != lo || me->hi != hi) {
        zps_log_error("assigned [%llu, %llu), expected [%llu, %llu)", (unsigned long long)me->lo,
                      (unsigned long long)me->hi, (unsigned long long)lo, (unsigned long long)hi);
        return ZPS_EPROTO;
    }
    zps_shard_cfg cfg = {
        .index = srv->o->shard, .lo = lo, .hi = hi, .model = &srv->model, .seed = job->seed,
        .dtype = (zps_dtype)job->wire_dtype, .global_batch = job->global_batch,
        .optim = {.lr = job->optim->lr, .momentum = job->optim->momentum,
                  .nesterov = job->optim->nesterov, .weight_decay = job->optim->weight_decay,
                  .schedule = (zps_lr_schedule)job->optim->schedule,
                  .warmup_steps = job->optim->warmup_steps, .total_steps = job->total_steps,
                  .kind = (zps_optim_kind)job->optim->kind, .beta1 = job->optim->beta1,
                  .beta2 = job->optim->beta2, .eps = job->optim->eps},
        .await_init = job->layout != NULL,
    };
    if (zps_optim_validate(&cfg.optim) != ZPS_OK) {
        zps_log_error("the coordinator sent optimizer settings this shard cannot use");
        return ZPS_EPROTO;
    }
    srv->dtype = cfg.dtype;
    cfg.shards = srv->o->shards;
    if (!(srv->shard = zps_shard_new(&cfg))) {
        return ZPS_ENOMEM;
    }
    srv->ckpt_every = job->checkpoint_every;
    uint64_t resumed = 0;
    if (srv->o->resume &&
        zps_shard_restore(srv->shard, srv->o->checkpoint_dir, UINT64_MAX, &resumed) != ZPS_OK) {
        zps_log_warn("no valid checkpoint in %s: starting from step 0", srv->o->checkpoint_dir);
    }
    srv->job_id = h->job_id;
    srv->total_steps = job->total_steps;
    srv->shard_token = job->shard_token;
    // Kept where --resume looks: a restart must show the coordinator it is
    // this shard (server/zps_token.h). Without --checkpoint-dir it cannot.
    if (srv->o->checkpoint_dir && zps_token_save(srv->o->checkpoint_dir, srv->o->shard,
                                                 srv->shard_token) != ZPS_OK) {
        zps_log_warn("could not keep the shard token in %s: a restart of this shard will be "
                     "refused", srv->o->checkpoint_dir);
    }
    s_take_plan(srv, job->generation, job->plan_effective, &plan);
    zps_log_info("job %016llx: serving [%llu, %llu) of model %s, %llu steps",
                 (unsigned long long)srv->job_id, (unsigned long long)lo, (unsigned long long)hi,
                 job->model, (unsigned long long)job->total_steps);
    Zps__Header ready;
    zps_wire_header_init(&ready, ZPS__MSG_TYPE__READY);
    ready.job_id = srv->job_id;
    ready.shard = srv->o->shard;
    ready.shard_token = srv->shard_token;
    ready.step = resumed;
    return zps_wire_send(srv->up, NULL, &ready, NULL, 0, NULL);
}

// Loads this shard's checkpoint of `step`; nothing changes on failure.
static zps_err s_restore(s_server *srv, uint64_t step)
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

// The coordinator's question before it decides a rollback (zps_coord_cfg).
static zps_err s_coord_restore(void *arg, uint64_t step)
{
    return s_restore(arg, step);
}

// After a restore: the step in progress is forgotten, and replayed.
static void s_forget_step(s_server *srv)
{
    zps_shard_io_forget_step(&srv->io);
    srv->finished = false;
    srv->step_start_ms = zps_clock_ms();
}

// Goes back to the checkpoint of `step`: the steps after it are replayed.
static zps_err s_rollback(s_server *srv, uint64_t step)
{
    zps_err err = s_restore(srv, step);
    if (err == ZPS_OK) {
        s_forget_step(srv);
    }
    return err;
}

// A plan from the coordinator (PLAN or ROLLBACK) for this shard.
static void s_take_wire_plan(s_server *srv, const Zps__Plan *p)
{
    zps_plan plan;
    if (zps_plan_from_wire(p->slices, p->n_slices, srv->global_batch, &plan) == ZPS_OK) {
        s_add_plan(srv, p->generation, p->effective_step, &plan);
    } else {
        zps_log_warn("ignored an inconsistent plan from the coordinator");
    }
}

// Reads the coordinator's socket; a failure here ends the shard.
static zps_err s_read_up(s_server *srv)
{
    zps_wire_msg m;
    zps_err err = zps_wire_recv(srv->up, false, &m);
    if (err == ZPS_OK && m.hdr->type == ZPS__MSG_TYPE__ERROR &&
        m.hdr->error_code == ZPS_EAGAIN) {
        // An external model not declared yet: the REGISTER is said again.
        zps_log_info("the coordinator: not yet: %s", m.hdr->error ? m.hdr->error : "");
    } else if (err == ZPS_OK && m.hdr->type == ZPS__MSG_TYPE__ERROR) {
        zps_log_error("the coordinator refused this shard: %s", m.hdr->error);
        err = srv->shard ? ZPS_OK : ZPS_ECLOSED; // late refusals of a REGISTER do not matter
    } else if (err == ZPS_OK && m.hdr->type == ZPS__MSG_TYPE__ASSIGN && !srv->shard) {
        err = s_take_assignment(srv, m.hdr);
    } else if (err == ZPS_OK && m.hdr->type == ZPS__MSG_TYPE__ROLLBACK && srv->shard) {
        err = s_rollback(srv, m.hdr->step);
        if (err == ZPS_OK && m.hdr->plan) {
            s_take_wire_plan(srv, m.hdr->plan);
        }
    } else if (err == ZPS_OK && m.hdr->type == ZPS__MSG_TYPE__PLAN && srv->shard && m.hdr->plan) {
        s_take_wire_plan(srv, m.hdr->plan);
    } else if (err == ZPS_OK) {
        zps_log_warn("ignored %s from the coordinator", zps_wire_type_name(m.hdr->type));
    } else if (err == ZPS_ETIMEDOUT) {
        err = ZPS_OK;
    }
    zps_wire_msg_fini(&m);
    return err;
}

// ---------------------------------------------------------------------------
// The loop.

// Refreshes what --http serves, twice a second. Shards > 0 serve only the
// probes: ready once the coordinator has assigned their range.
static void s_publish(s_server *srv)
{
    if (!srv->http) {
        return;
    }
    char *metrics = NULL, *status = NULL;
    if (srv->coord && zps_coord_render(srv->coord, zps_shard_step(srv->shard),
                                       srv->bad_messages, &metrics, &status) != ZPS_OK) {
        return;
    }
    zps_http_publish(srv->http, metrics, status, srv->shard != NULL);
    free(metrics);
    free(status);
}

static bool s_over(const s_server *srv)
{
    return srv->coord ? zps_coord_finished(srv->coord) : srv->finished;
}

static bool s_between_steps(const s_server *srv)
{
    return zps_shard_io_between_steps(&srv->io);
}

// After SIGTERM or SIGINT the loop stops between steps, so that the
// checkpoint written on the way out is of a whole step; a step half applied
// gets ZPS_SERVER_STOP_GRACE_MS to finish (the stop-grace timer).
static void s_notice_stop(s_server *srv, double now)
{
    if (!s_stop || srv->stopping) {
        return;
    }
    srv->stopping = true;
    zps_timers_at(&srv->timers, srv->t_stop_grace, now + ZPS_SERVER_STOP_GRACE_MS);
    zps_log_info("stopping: %s", s_between_steps(srv)
                                     ? "between steps"
                                     : "waiting (bounded) for the step in progress to finish");
}

// Whether the step in progress is over is a state, not a time: looked at
// after every turn of the loop, not on a timer.
static bool s_stop_now(const s_server *srv)
{
    return srv->leave || (srv->stopping && s_between_steps(srv));
}

// The checkpoint written when stopped by a signal, if --checkpoint-dir is set.
static void s_stop_checkpoint(s_server *srv)
{
    uint64_t step = srv->shard ? zps_shard_step(srv->shard) : 0;
    if (!srv->o->checkpoint_dir || !srv->shard || step == 0) {
        zps_log_info("stopped by signal at step %llu%s", (unsigned long long)step,
                     srv->o->checkpoint_dir ? "" : " (no --checkpoint-dir: no checkpoint)");
        return;
    }
    if (!s_between_steps(srv)) {
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

// ---------------------------------------------------------------------------
// The timers: every periodic or deadline check of the loop.

// The coordinator's clock (evictions of silent workers, its waiting and
// progress lines) and the plans it makes there.
static void s_on_tick(void *arg, double now)
{
    s_server *srv = arg;
    if (srv->coord) {
        zps_coord_tick(srv->coord, srv->sock, now);
        s_sync_coord_plan(srv);
    }
}

// Shard 0 of an external job, until its model is declared.
static void s_on_declare_log(void *arg, double now)
{
    s_server *srv = arg;
    (void)now;
    if (srv->coord) {
        zps_timers_cancel(&srv->timers, srv->t_declare_log);
        return;
    }
    zps_log_info("waiting for the first worker to declare the model (--model external)");
}

// Shards > 0: REGISTER until assigned, and after it, for a coordinator
// that restarts, to say where this shard is.
static void s_on_register(void *arg, double now)
{
    s_server *srv = arg;
    (void)now;
    if (!srv->shard) {
        zps_log_info("waiting for the coordinator at %s to assign this shard's range",
                     srv->o->coordinator);
    }
    s_register(srv);
}

static void s_on_stall(void *arg, double now)
{
    s_server *srv = arg;
    if (zps_shard_io_started(&srv->io) && !srv->finished &&
        zps_shard_step(srv->shard) < srv->total_steps) {
        zps_late_warn_stall(&srv->io, srv->coord, srv->step_start_ms, now);
    }
}

// Speculation needs a look soon after a slice becomes late: a quarter of
// the wait, which follows the median step.
static double s_speculate_period(const s_server *srv)
{
    double late = srv->coord ? srv->o->speculate_after * zps_coord_median_step_ms(srv->coord) : 0;
    return late > 0 && late / 4 < ZPS_SERVER_POLL_MS ? late / 4 + 1 : ZPS_SERVER_POLL_MS;
}

static void s_on_speculate(void *arg, double now)
{
    s_server *srv = arg;
    zps_late_speculate(&srv->io, srv->coord, srv->sock, srv->o->speculate_after, now);
    zps_timers_set_period(&srv->timers, srv->t_speculate, s_speculate_period(srv));
}

static void s_on_publish(void *arg, double now)
{
    (void)now;
    s_publish(arg);
}

static void s_on_stop_grace(void *arg, double now)
{
    s_server *srv = arg;
    (void)now;
    srv->leave = true;
}

static int s_add(s_server *srv, const char *name, double period_ms, zps_timer_fn fn, bool now)
{
    int id = zps_timers_add(&srv->timers, name, period_ms, fn, srv);
    if (now) {
        zps_timers_at(&srv->timers, id, zps_clock_ms());
    }
    return id;
}

// The timer table, before anything can arm one of its timers.
static void s_add_timers(s_server *srv)
{
    const zps_server_opts *o = srv->o;
    zps_timers_init(&srv->timers);
    bool coordinator = o->shard == 0;
    srv->t_stall = s_add(srv, "stall warning", fmax(o->stall_warn_ms, 1), s_on_stall, false);
    srv->t_stop_grace = s_add(srv, "stop grace", 0, s_on_stop_grace, false);
    srv->t_speculate = coordinator && o->speculate_after > 0
                           ? s_add(srv, "speculation", ZPS_SERVER_POLL_MS, s_on_speculate, true)
                           : -1;
    srv->t_register =
        coordinator ? -1 : s_add(srv, "register", ZPS_SERVER_REGISTER_MS, s_on_register, false);
    srv->t_declare_log = coordinator ? s_add(srv, "declaration", ZPS_SERVER_DECLARE_LOG_MS,
                                             s_on_declare_log, true)
                                     : -1;
    if (coordinator) {
        (void)s_add(srv, "coordinator", ZPS_SERVER_TICK_MS, s_on_tick, true);
    }
    if (o->http) {
        (void)s_add(srv, "publish", ZPS_SERVER_PUBLISH_MS, s_on_publish, true);
    }
}

// ---------------------------------------------------------------------------
// The loop.

// Reads what is ready on both sockets: ZPS_ECLOSED where the coordinator's
// socket says this shard is done for.
static zps_err s_read_ready(s_server *srv, zmq_pollitem_t *items, int n_items)
{
    // Drain what is ready, but come back to the timers now and then.
    for (int i = 0; i < 64 && (items[0].revents & ZMQ_POLLIN); i++) {
        int events = 0;
        size_t len = sizeof events;
        if (zmq_getsockopt(srv->sock, ZMQ_EVENTS, &events, &len) != 0 ||
            !(events & ZMQ_POLLIN)) {
            break;
        }
        s_read_one(srv);
    }
    if (n_items == 2 && (items[1].revents & ZMQ_POLLIN) && s_read_up(srv) != ZPS_OK) {
        return ZPS_ECLOSED;
    }
    return ZPS_OK;
}

// What the loop does after reading, before the timers: held pushes
// replayed (never from inside a push's handling), keys reloaded on SIGHUP,
// a stop signal noticed.
static void s_after_read(s_server *srv)
{
    zps_shard_io_replay(&srv->io);
    if (s_reload_keys) {
        s_reload_keys = 0;
        zps_zap_reload(srv->zap);
    }
    s_notice_stop(srv, zps_clock_ms());
}

static int s_loop(s_server *srv)
{
    zmq_pollitem_t items[2] = {{.socket = srv->sock, .events = ZMQ_POLLIN},
                               {.socket = srv->up, .events = ZMQ_POLLIN}};
    int n_items = srv->up ? 2 : 1;
    s_notice_stop(srv, zps_clock_ms());
    while (!s_over(srv) && !s_stop_now(srv)) {
        long timeout = zps_timers_next_ms(&srv->timers, zps_clock_ms(), ZPS_SERVER_POLL_MS);
        int rc = zmq_poll(items, n_items, timeout);
        if (rc < 0 && errno != EINTR) {
            zps_log_error("zmq_poll: %s", zmq_strerror(errno));
            return 1;
        }
        if (rc > 0 && s_read_ready(srv, items, n_items) != ZPS_OK) {
            return 1;
        }
        s_after_read(srv);
        (void)zps_timers_run(&srv->timers, zps_clock_ms());
    }
    if (s_stop && !s_over(srv)) {
        s_stop_checkpoint(srv);
    }
    return 0;
}

// ---------------------------------------------------------------------------
// Start-up: any error here exits with a hint.

// Binds sock and reports the endpoint bound (a port of '*' resolved) in
// srv->endpoint and, if asked, in a file that launchers and tests wait for.
// CURVE on the bound socket, and the ZAP handler that admits clients; or,
// without CURVE, a warning (or a refusal) when the address is not loopback.
static int s_setup_security(s_server *srv)
{
    const zps_server_opts *o = srv->o;
    if (!o->curve_secret) {
        if (!zps_curve_is_loopback(o->listen)) {
            zps_log_warn("%s is reachable beyond this host and CurveZMQ is off: anyone who "
                         "reaches it can join the job (see --curve-secret)", o->listen);
            if (o->require_curve) {
                zps_log_error("--require-curve: refusing to listen without CurveZMQ");
                return 2;
            }
        }
        return 0;
    }
    if (zps_curve_load(&srv->curve, o->curve_secret, o->server_key) != ZPS_OK) {
        return 2;
    }
    if (!o->server_key) {
        memcpy(srv->curve.server, srv->curve.public_, sizeof srv->curve.server);
    }
    const char *domain = "zps";
    zps_zap_keys keys = {.workers = o->authorized_keys, .shards = o->shard_keys,
                         .operators = o->operator_keys, .own_public = srv->curve.public_};
    if (!(srv->zap = zps_zap_start(srv->ctx, &keys)) ||
        zps_curve_server(&srv->curve, srv->sock) != ZPS_OK ||
        zmq_setsockopt(srv->sock, ZMQ_ZAP_DOMAIN, domain, strlen(domain)) != 0) {
        return 2;
    }
    zps_log_info("CurveZMQ on: public key %s", srv->curve.public_);
    return 0;
}

static int s_bind(s_server *srv)
{
    const zps_server_opts *o = srv->o;
    if (zmq_bind(srv->sock, o->listen) != 0) {
        zps_log_error("cannot bind %s: %s", o->listen, zmq_strerror(errno));
        fprintf(stderr, "HINT: another zps-server may hold the port; pick another --listen\n");
        return 2;
    }
    size_t len = sizeof srv->endpoint;
    if (zmq_getsockopt(srv->sock, ZMQ_LAST_ENDPOINT, srv->endpoint, &len) != 0) {
        snprintf(srv->endpoint, sizeof srv->endpoint, "%s", o->listen);
    }
    if (o->endpoint_file) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", o->endpoint_file);
        FILE *f = fopen(tmp, "w");
        if (!f || fprintf(f, "%s\n", srv->endpoint) < 0 || fclose(f) != 0 ||
            rename(tmp, o->endpoint_file) != 0) {
            zps_log_error("--endpoint-file %s: %s", o->endpoint_file, strerror(errno));
            return 2;
        }
    }
    return 0;
}

// Shard 0 restarted with --resume: the newest step of which both its
// checkpoint and the job state are valid. No checkpoint at all is a first
// start; checkpoints of which none is valid are an error, not a restart
// from scratch.
static zps_err s_resume_coordinator(s_server *srv)
{
    uint64_t steps[64];
    int n = zps_ckpt_steps(srv->o->checkpoint_dir, 0, steps, 64);
    if (n == 0) {
        // A supervisor passes --resume on every start, the first included.
        zps_log_info("--resume: no checkpoint in %s yet: the job starts at step 0",
                     srv->o->checkpoint_dir);
        return ZPS_OK;
    }
    for (int i = n - 1; i >= 0; i--) {
        uint64_t loaded;
        if (zps_shard_restore(srv->shard, srv->o->checkpoint_dir, steps[i], &loaded) == ZPS_OK &&
            zps_coord_resume(srv->coord, srv->o->checkpoint_dir, steps[i]) == ZPS_OK) {
            srv->plan_gen = 0; // the coordinator's plan is taken again, with the rollback
            return ZPS_OK;
        }
        zps_log_warn("step %llu cannot be resumed; trying the one before",
                     (unsigned long long)steps[i]);
    }
    zps_log_error("--resume: no valid checkpoint and job state in %s", srv->o->checkpoint_dir);
    return ZPS_ENOENT;
}

// Shard 0 with the job's sizes known: the coordinator and this shard's
// range. *why says what does not fit (2), or memory ran out (1).
static int s_start_coordinator(s_server *srv, uint32_t n_train, uint32_t n_test, char *why,
                               size_t len)
{
    const zps_server_opts *o = srv->o;
    if (o->global_batch > n_train || o->global_batch < o->workers) {
        snprintf(why, len, "global batch %u must be between --workers (%u) and the train set (%u)",
                 o->global_batch, o->workers, n_train);
        return 2;
    }
    if (srv->model.n_params < o->shards) {
        snprintf(why, len, "%zu parameters cannot make %u shards", srv->model.n_params,
                 o->shards);
        return 2;
    }
    uint64_t spe = n_train / o->global_batch;
    srv->total_steps = o->steps ? o->steps : o->epochs * spe;
    if (srv->total_steps == 0) {
        snprintf(why, len, "the run has no steps (--epochs 0 or --steps 0)");
        return 2;
    }
    srv->dtype = o->wire_dtype;
    zps_shard_cfg cfg = {.index = 0, .model = &srv->model, .seed = o->seed,
                         .global_batch = o->global_batch, .dtype = o->wire_dtype,
                         .optim = o->optim, .await_init = srv->declared != NULL};
    cfg.optim.total_steps = srv->total_steps;
    zps_model_shard_range(srv->model.n_params, 0, o->shards, &cfg.lo, &cfg.hi);
    cfg.shards = o->shards;
    srv->ckpt_every = o->checkpoint_every;
    snprintf(why, len, "out of memory");
    if (!(srv->shard = zps_shard_new(&cfg))) {
        return 1;
    }
    zps_coord_cfg cc = {
        .model = srv->declared ? "external" : o->model, .dataset = srv->dataset,
        .layout = srv->declared ? srv->declared->layout : NULL, .spec = &srv->model,
        .n_train = n_train,
        .seed = o->seed, .global_batch = o->global_batch, .total_steps = srv->total_steps,
        .steps_per_epoch = spe, .n_test = n_test, .workers = o->workers,
        .n_params = srv->model.n_params, .shards = o->shards, .optim = cfg.optim,
        .wire_dtype = o->wire_dtype, .endpoint = srv->endpoint, .metrics = srv->metrics,
        .worker_timeout_ms = o->worker_timeout_ms, .checkpoint_every = o->checkpoint_every,
        .adaptive_split = o->adaptive_split, .restore = s_coord_restore, .restore_arg = srv,
    };
    if (!(srv->coord = zps_coord_new(&cc))) {
        zps_shard_destroy(&srv->shard);
        return 1;
    }
    if (o->resume && s_resume_coordinator(srv) != ZPS_OK) {
        snprintf(why, len, "--resume: no valid checkpoint and job state in %s",
                 o->checkpoint_dir);
        zps_coord_destroy(&srv->coord); // a declaration refused for it changes nothing
        zps_shard_destroy(&srv->shard);
        return 2;
    }
    zps_log_info("listening on %s: model %s (%zu parameters), dataset %s (%u train, %u test), "
                 "global batch %u, %llu steps, shard 0 of %u: [%llu, %llu)",
                 srv->endpoint, srv->declared ? srv->model.text : o->model,
                 srv->model.n_params, srv->dataset, n_train, n_test, o->global_batch,
                 (unsigned long long)srv->total_steps, o->shards, (unsigned long long)cfg.lo,
                 (unsigned long long)cfg.hi);
    return 0;
}

// Where the first declaration is kept, so that a coordinator restarted
// with --resume knows the model before any worker is back.
#define ZPS_SERVER_DECLARED "declared-model"
#define ZPS_SERVER_DECLARED_MAX (1u << 20)

// A declaration (the HELLO part: layout, dataset sizes) the job can take;
// why says what is wrong with it.
static bool s_declaration_ok(const s_server *srv, const Zps__Hello *hello, char *why,
                             size_t len)
{
    if (!hello || !hello->layout) {
        snprintf(why, len, "this job's model is declared by its workers (--model external): "
                           "this worker declared none");
        return false;
    }
    if (zps_layout_check(hello->layout, why, len) != ZPS_OK) {
        return false;
    }
    if (hello->n_train == 0 || (srv->size_train && hello->n_train != srv->size_train)) {
        snprintf(why, len, "declared %u train records; the job's --dataset is size:%u",
                 hello->n_train, srv->size_train);
        if (!srv->size_train) {
            snprintf(why, len, "declare the dataset's size: train records (and test records)");
        }
        return false;
    }
    return true;
}

// The job's model and dataset sizes from a declaration, then the rest of
// shard 0's start. Nothing stays set when it fails.
static int s_take_declaration(s_server *srv, const Zps__Hello *hello, char *why, size_t len)
{
    Zps__Hello copy = ZPS__HELLO__INIT; // what is kept: the declaration, not the host
    copy.layout = hello->layout;
    copy.n_train = hello->n_train;
    copy.n_test = hello->n_test;
    size_t n = zps__hello__get_packed_size(&copy);
    uint8_t *buf = n <= ZPS_SERVER_DECLARED_MAX ? malloc(n ? n : 1) : NULL;
    if (!buf) {
        snprintf(why, len, "a declaration of %zu bytes is more than this server keeps", n);
        return 2;
    }
    zps__hello__pack(&copy, buf);
    srv->declared = zps__hello__unpack(NULL, n, buf);
    int status = 1;
    snprintf(why, len, "out of memory");
    if (srv->declared) {
        zps_layout_model(srv->declared->layout, &srv->model);
        snprintf(srv->dataset, sizeof srv->dataset, "size:%u", hello->n_train);
        status = s_start_coordinator(srv, hello->n_train, hello->n_test, why, len);
    }
    if (status == 0 && srv->o->checkpoint_dir &&
        zps_ckpt_write_record(srv->o->checkpoint_dir, ZPS_SERVER_DECLARED, buf, n) != ZPS_OK) {
        zps_log_warn("could not keep the declared model in %s: a restart with --resume will "
                     "wait for a worker to declare it again", srv->o->checkpoint_dir);
    }
    free(buf);
    if (status != 0 && srv->declared) {
        zps__hello__free_unpacked(srv->declared, NULL);
        srv->declared = NULL;
    }
    return status;
}

// --resume of an external job: the declaration kept by the first start,
// if there is one. ZPS_ENOENT: none (the first worker declares it).
static zps_err s_load_declaration(s_server *srv, char *why, size_t len)
{
    uint8_t *buf = malloc(ZPS_SERVER_DECLARED_MAX);
    size_t n = 0;
    zps_err err = buf ? zps_ckpt_read_record(srv->o->checkpoint_dir, ZPS_SERVER_DECLARED, buf,
                                             ZPS_SERVER_DECLARED_MAX, &n)
                      : ZPS_ENOMEM;
    Zps__Hello *hello = err == ZPS_OK ? zps__hello__unpack(NULL, n, buf) : NULL;
    free(buf);
    if (err == ZPS_OK && (!hello || !s_declaration_ok(srv, hello, why, len))) {
        zps_log_error("%s/%s: not a usable declared model", srv->o->checkpoint_dir,
                      ZPS_SERVER_DECLARED);
        err = ZPS_EPROTO;
    }
    if (err == ZPS_OK && s_take_declaration(srv, hello, why, len) != 0) {
        err = ZPS_EINVAL;
    }
    if (hello) {
        zps__hello__free_unpacked(hello, NULL);
    }
    return err;
}

// Shard 0 of an external job before its model is declared: the first
// worker's HELLO declares it, then goes to the coordinator like any other.
// Until then everything else is "not yet".
static void s_on_undeclared(s_server *srv, zps_wire_msg *m)
{
    char why[320];
    if (m->hdr->type != ZPS__MSG_TYPE__HELLO) {
        s_refuse(srv, m, ZPS_EAGAIN, "waiting for the first worker to declare the model");
        return;
    }
    if (!s_declaration_ok(srv, m->hdr->hello, why, sizeof why)) {
        s_refuse(srv, m, ZPS_EINVAL, why);
        return;
    }
    if (s_take_declaration(srv, m->hdr->hello, why, sizeof why) != 0) {
        zps_log_error("the model declared by %s does not fit this job: %s",
                      m->hdr->hello->host ? m->hdr->hello->host : "?", why);
        s_refuse(srv, m, ZPS_EINVAL, why);
        return;
    }
    zps_log_info("model declared by %s: %zu tensors, %zu parameters in %d buckets (%s)",
                 m->hdr->hello->host ? m->hdr->hello->host : "?",
                 srv->declared->layout->n_tensors, srv->model.n_params,
                 zps_model_n_buckets(&srv->model), srv->model.text);
    s_dispatch_coord(srv, m);
}

// --dataset size:N of an external model: N train records, 1..2^32-1.
static zps_err s_parse_size(const char *text, uint32_t *n)
{
    char *end;
    errno = 0;
    unsigned long long v = strncmp(text, "size:", 5) == 0 && text[5] >= '0' && text[5] <= '9'
                               ? strtoull(text + 5, &end, 10)
                               : 0;
    if (v == 0 || v > UINT32_MAX || errno || *end) {
        return ZPS_EINVAL;
    }
    *n = (uint32_t)v;
    return ZPS_OK;
}

// Shard 0: the job from the flags, then the coordinator and this shard's
// range; for an external model, those once the model is declared.
static int s_setup_coordinator(s_server *srv)
{
    const zps_server_opts *o = srv->o;
    char why[320] = "";
    int status = 2;
    if (zps_optim_check(o->optimizer, &o->optim) != ZPS_OK) {
        fprintf(stderr, "HINT: zps-server --help lists the flags\n");
        return 2;
    }
    if (o->http && !(srv->http = zps_http_start(o->http))) {
        return 2;
    }
    if (strcmp(o->model, "external") == 0) {
        if (o->dataset && s_parse_size(o->dataset, &srv->size_train) != ZPS_OK) {
            zps_log_error("--dataset %s: an external model's dataset is size:N (train "
                          "records), or declared by the workers", o->dataset);
            return 2;
        }
        zps_err err = o->resume ? s_load_declaration(srv, why, sizeof why) : ZPS_ENOENT;
        if (err == ZPS_OK) {
            return 0;
        }
        if (err != ZPS_ENOENT) {
            zps_log_error("--resume: %s", why[0] ? why : "the declared model cannot be read");
            return 2;
        }
        zps_log_info("listening on %s: the model is declared by the first worker "
                     "(--model external), global batch %u", srv->endpoint, o->global_batch);
        return 0;
    }
    zps_dataset_spec ds;
    uint32_t n_train, n_test;
    snprintf(srv->dataset, sizeof srv->dataset, "%s", o->dataset ? o->dataset : "fashion-mnist");
    if (zps_model_parse(o->model, &srv->model) != ZPS_OK ||
        zps_dataset_parse(srv->dataset, &ds) != ZPS_OK ||
        zps_dataset_counts(&ds, &n_train, &n_test) != ZPS_OK) {
        fprintf(stderr, "HINT: zps-server --help lists the flags; fashion-mnist comes from the "
                        "Debian package dataset-fashion-mnist\n");
        return 2;
    }
    status = s_start_coordinator(srv, n_train, n_test, why, sizeof why);
    if (status != 0) {
        zps_log_error("%s", why);
    }
    return status;
}

static int s_setup_shard(s_server *srv)
{
    // A restart presents the token its first ASSIGN gave it: without it the
    // coordinator takes it for a stranger claiming this shard, and refuses.
    if (srv->o->resume) {
        zps_err err = zps_token_load(srv->o->checkpoint_dir, srv->o->shard, &srv->shard_token);
        if (err == ZPS_OK) {
            zps_log_info("presenting the shard token kept in %s", srv->o->checkpoint_dir);
        } else if (err == ZPS_ENOENT) {
            zps_log_info("no shard token in %s: registering as a shard not yet assigned",
                         srv->o->checkpoint_dir);
        }
    }
    srv->up = zps_wire_socket(srv->ctx, ZMQ_DEALER, ZPS_SERVER_SEND_TIMEOUT_MS);
    if (!srv->up || zps_curve_client(&srv->curve, srv->up) != ZPS_OK ||
        zmq_connect(srv->up, srv->o->coordinator) != 0) {
        zps_log_error("cannot connect to the coordinator at %s", srv->o->coordinator);
        return 2;
    }
    if (srv->o->http && !(srv->http = zps_http_start(srv->o->http))) {
        return 2;
    }
    zps_log_info("shard %u of %u listening on %s (workers reach it at %s); registering with %s",
                 srv->o->shard, srv->o->shards, srv->endpoint,
                 srv->o->advertise ? srv->o->advertise : srv->endpoint, srv->o->coordinator);
    s_register(srv);
    return 0;
}

static void s_log_peak_rss(const s_server *srv)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) {
        zps_log_info("shard %u: peak RSS %.1f MiB", srv->o->shard, ru.ru_maxrss / 1024.0);
    }
}

// The metrics log. Line-buffered with room for a whole record, so that
// each record is one write and a SIGKILL cannot leave half of one. A
// resumed run goes on with the log it had (replayed steps appear twice),
// after ending a last line a killed writer of before left unfinished.
static FILE *s_open_metrics(const char *path, bool resume)
{
    FILE *f = fopen(path, resume ? "a+" : "w");
    if (!f || setvbuf(f, NULL, _IOLBF, ZPS_SERVER_METRICS_BUF) != 0) {
        zps_log_error("--metrics-log %s: %s", path, strerror(errno));
        if (f) {
            (void)fclose(f);
        }
        return NULL;
    }
    if (resume && fseek(f, -1, SEEK_END) == 0 && fgetc(f) != '\n') {
        (void)fseek(f, 0, SEEK_END);
        fputc('\n', f);
    }
    return f;
}

// Everything zps_server_run sets up before its loop: sockets, security,
// the bind, and the coordinator or the shard. *status: 0, or the exit
// status on failure (2 bad configuration, 1 other).
zps_server *zps_server_open(const zps_server_opts *o, int *status)
{
    char name[32];
    snprintf(name, sizeof name, "server[%u]", o->shard);
    zps_log_set_name(name);
    s_server *srv = calloc(1, sizeof *srv);
    *status = 1;
    if (!srv) {
        return NULL;
    }
    srv->o = o;
    s_add_timers(srv);
    srv->ctx = zmq_ctx_new();
    if (!srv->ctx) {
        goto fail;
    }
    srv->sock = zps_wire_socket(srv->ctx, ZMQ_ROUTER, ZPS_SERVER_SEND_TIMEOUT_MS);
    zps_shard_io_hooks hooks = {.arg = srv, .refuse = s_io_refuse, .job_id = s_io_job_id,
                                .again = s_io_again};
    if (!srv->sock || zps_wire_set_sndbuf(srv->sock, o->sndbuf) != ZPS_OK ||
        zps_shard_io_init(&srv->io, srv->sock, o->shard, &hooks) != ZPS_OK) {
        goto fail;
    }
    if (o->metrics_log && !(srv->metrics = s_open_metrics(o->metrics_log, o->resume))) {
        *status = 2;
        goto fail;
    }
    if ((*status = s_setup_security(srv)) != 0 || (*status = s_bind(srv)) != 0) {
        goto fail;
    }
    if (o->pid_file && zps_pidfile_write(o->pid_file) != ZPS_OK) {
        *status = 2;
        goto fail;
    }
    srv->pid_written = o->pid_file != NULL;
    *status = o->shard == 0 ? s_setup_coordinator(srv) : s_setup_shard(srv);
    if (*status != 0) {
        goto fail;
    }
    return srv;
fail:
    zps_server_close(&srv);
    *status = *status ? *status : 1;
    return NULL;
}

int zps_server_run(const zps_server_opts *o)
{
    int ret;
    s_server *srv = zps_server_open(o, &ret);
    if (!srv) {
        return ret;
    }
    (void)signal(SIGINT, s_on_signal);
    (void)signal(SIGTERM, s_on_signal);
    (void)signal(SIGHUP, s_on_signal);
    ret = s_loop(srv);
    s_log_peak_rss(srv);
    zps_server_close(&srv);
    return ret;
}

int zps_server_turn(zps_server *srv)
{
    int n = 0;
    int events = 0;
    size_t len = sizeof events;
    while (zmq_getsockopt(srv->sock, ZMQ_EVENTS, &events, &len) == 0 && (events & ZMQ_POLLIN)) {
        s_read_one(srv);
        n++;
        len = sizeof events;
    }
    if (srv->up) {
        len = sizeof events;
        while (zmq_getsockopt(srv->up, ZMQ_EVENTS, &events, &len) == 0 &&
               (events & ZMQ_POLLIN)) {
            if (s_read_up(srv) != ZPS_OK) {
                return -1; // where the loop ends the shard
            }
            n++;
            len = sizeof events;
        }
    }
    zps_shard_io_replay(&srv->io);
    if (srv->coord) {
        zps_coord_tick(srv->coord, srv->sock, zps_clock_ms());
        s_sync_coord_plan(srv);
    }
    return n;
}

void *zps_server_ctx(zps_server *srv)
{
    return srv->ctx;
}

uint64_t zps_server_refused(const zps_server *srv)
{
    return srv->bad_messages;
}

bool zps_server_stopping(const zps_server *srv)
{
    (void)srv;
    return s_stop != 0;
}

zps_shard *zps_server_shard(zps_server *srv)
{
    return srv->shard;
}

zps_coord *zps_server_coord(zps_server *srv)
{
    return srv->coord;
}

void zps_server_close(zps_server **srvp)
{
    s_server *srv = *srvp;
    if (!srv) {
        return;
    }
    zps_shard_io_fini(&srv->io);
    zps_wire_close(&srv->sock);
    zps_wire_close(&srv->up);
    zps_zap_stop(&srv->zap);
    zps_http_stop(&srv->http);
    // Flushes replies (within the linger) and releases the shard's
    // zero-copy frames: the shard can go only after it.
    if (srv->ctx && zmq_ctx_term(srv->ctx) != 0) {
        zps_log_warn("zmq_ctx_term: %s", zmq_strerror(errno));
    }
    zps_coord_destroy(&srv->coord);
    zps_shard_destroy(&srv->shard);
    if (srv->declared) { // after the coordinator, which borrows its layout
        zps__hello__free_unpacked(srv->declared, NULL);
    }
    if (srv->metrics) {
        (void)fclose(srv->metrics);
    }
    if (srv->pid_written) {
        zps_pidfile_remove(srv->o->pid_file);
    }
    free(srv);
    *srvp = NULL;
}
