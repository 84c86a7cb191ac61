/* zps_register.c - shards 1..N-1 and their coordinator: REGISTER until
 * assigned (and after, for a coordinator that restarts), the ASSIGN that
 * gives the range and the job, the PLANs and ROLLBACKs that follow, the
 * refusal that ends a shard the coordinator will not have, and the wait
 * after the last step for the coordinator to end. */
#include "server/zps_server_int.h"

#include <float.h>
#include <stdio.h>

#include "common/zps_clock.h"
#include "common/zps_layout.h"
#include "common/zps_zcode.h"
#include "server/zps_token.h"

// Says where this shard is, and (with a token kept from its first ASSIGN)
// that it is this shard; the timer says it again every ZPS_SERVER_REGISTER_MS.
void zps_register_send(zps_server *srv)
{
    Zps__Register reg = ZPS__REGISTER__INIT;
    reg.index = srv->o->shard;
    reg.shards = srv->o->shards;
    reg.endpoint = srv->o->advertise ? (char *)srv->o->advertise : srv->endpoint;
    reg.resume = srv->o->resume;
    reg.serving = srv->shard != NULL;
    reg.public_key = srv->curve.on ? srv->curve.public_ : "";
    // This host's ("": unknown), read once at setup: the coordinator tells
    // workers, whose host's leader pushes for its group only to another host.
    reg.boot_id = (char *)srv->io.shm.boot;
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

// The ASSIGN's deterministic mode: whole micro-batches of a synchronous
// fp32 job, and the one this shard was started with, if it was given one
// (a shard that would sum differently from the others breaks the promise).
static zps_err s_check_micro_batch(const zps_server *srv, const Zps__Job *job)
{
    uint32_t m = job->micro_batch;
    if (m > 0 && (job->global_batch % m != 0 || job->outer ||
                  (zps_dtype)job->wire_dtype != ZPS_DTYPE_F32)) {
        zps_log_error("the coordinator sent a --micro-batch %u this shard cannot use", m);
        return ZPS_EPROTO;
    }
    if (srv->o->micro_batch > 0 && srv->o->micro_batch != m) {
        zps_log_error("this shard was started with --deterministic --micro-batch %u; the job's "
                      "is %u (0: not deterministic)", srv->o->micro_batch, m);
        return ZPS_EPROTO;
    }
    return ZPS_OK;
}

// The ASSIGN's --wire-code: zstd only for a synchronous fp32 job, as
// shard 0's flags allow.
static zps_err s_check_wire_code(const Zps__Job *job)
{
    if (job->wire_code > ZPS_ZCODE_PLANES ||
        (job->wire_code && (job->outer || (zps_dtype)job->wire_dtype != ZPS_DTYPE_F32))) {
        zps_log_error("the coordinator sent a --wire-code this shard cannot use");
        return ZPS_EPROTO;
    }
    return ZPS_OK;
}

// The ASSIGN's job, checked against this shard's flags, as the shard's
// configuration and first plan; ZPS_EPROTO (logged) when it cannot be used.
static zps_err s_assignment_cfg(zps_server *srv, const Zps__Job *job, zps_shard_cfg *cfg,
                                zps_plan *plan)
{
    char why[256] = "";
    if (job && job->layout && zps_layout_check(job->layout, why, sizeof why) == ZPS_OK) {
        zps_layout_model(job->layout, &srv->model); // declared by the workers
    }
    if (!job || !job->optim || job->n_shards != srv->o->shards || job->shard_token == 0 ||
        why[0] || (!job->layout && zps_model_parse(job->model, &srv->model) != ZPS_OK) ||
        zps_plan_from_wire(job->plan, job->n_plan, job->global_batch, plan) != ZPS_OK ||
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
    *cfg = (zps_shard_cfg){
        .index = srv->o->shard, .lo = lo, .hi = hi, .model = &srv->model, .seed = job->seed,
        .dtype = (zps_dtype)job->wire_dtype, .global_batch = job->global_batch,
        .optim = {.lr = job->optim->lr, .momentum = job->optim->momentum,
                  .nesterov = job->optim->nesterov, .weight_decay = job->optim->weight_decay,
                  .schedule = (zps_lr_schedule)job->optim->schedule,
                  .warmup_steps = job->optim->warmup_steps, .total_steps = job->total_steps,
                  .kind = (zps_optim_kind)job->optim->kind, .beta1 = job->optim->beta1,
                  .beta2 = job->optim->beta2, .eps = job->optim->eps,
                  .step_size = job->optim->step_size, .gamma = job->optim->gamma},
        .await_init = job->layout != NULL, .layout = job->layout,
    };
    if (zps_optim_validate(&cfg->optim) != ZPS_OK) {
        zps_log_error("the coordinator sent optimizer settings this shard cannot use");
        return ZPS_EPROTO;
    }
    if (job->outer) {
        cfg->mode = (zps_outer_mode){.diloco = true, .inner_steps = job->outer->inner_steps,
                                     .auto_steps = job->outer->auto_steps,
                                     .compress = (int)job->outer->compress,
                                     .fragments = job->outer->fragments};
        if (zps_outer_mode_check(&cfg->mode) != ZPS_OK || cfg->dtype != ZPS_DTYPE_F32) {
            zps_log_error("the coordinator sent a diloco mode this shard cannot use");
            return ZPS_EPROTO;
        }
    }
    if (!(job->clip_grad_norm >= 0.0f && job->clip_grad_norm <= FLT_MAX) ||
        (job->outer && job->clip_grad_norm > 0)) {
        zps_log_error("the coordinator sent a --clip-grad-norm this shard cannot use");
        return ZPS_EPROTO;
    }
    cfg->clip_grad_norm = job->clip_grad_norm;
    if (s_check_wire_code(job) != ZPS_OK || s_check_micro_batch(srv, job) != ZPS_OK) {
        return ZPS_EPROTO;
    }
    cfg->micro_batch = job->micro_batch;
    cfg->shards = srv->o->shards;
    cfg->threads = srv->threads;
    return ZPS_OK;
}

// The shard of the assignment, from its newest checkpoint with --resume;
// *resumed: the step it resumes at.
static zps_err s_assigned_shard(zps_server *srv, const Zps__Header *h, const zps_shard_cfg *cfg,
                                uint64_t *resumed)
{
    const Zps__Job *job = h->job;
    srv->dtype = cfg->dtype;
    srv->wire_code = job->wire_code != ZPS_ZCODE_NONE;
    if (!(srv->shard = zps_shard_new(cfg))) {
        return ZPS_ENOMEM;
    }
    srv->ckpt_every = job->checkpoint_every;
    *resumed = 0;
    if (srv->o->resume &&
        zps_shard_restore(srv->shard, srv->o->checkpoint_dir, UINT64_MAX, resumed) != ZPS_OK) {
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
    return ZPS_OK;
}

static zps_err s_take_assignment(zps_server *srv, const Zps__Header *h)
{
    const Zps__Job *job = h->job;
    zps_shard_cfg cfg;
    zps_plan plan = {0};
    uint64_t resumed;
    zps_err err = s_assignment_cfg(srv, job, &cfg, &plan);
    if (err != ZPS_OK || (err = s_assigned_shard(srv, h, &cfg, &resumed)) != ZPS_OK) {
        zps_plan_fini(&plan);
        return err;
    }
    zps_steps_take_plan(srv, job->generation, job->plan_effective, &plan);
    zps_plan_fini(&plan);
    zps_log_info("job %016llx: serving [%llu, %llu) of model %s, %llu steps",
                 (unsigned long long)srv->job_id, (unsigned long long)cfg.lo,
                 (unsigned long long)cfg.hi, job->model, (unsigned long long)job->total_steps);
    Zps__Header ready;
    zps_register_up_header(srv, &ready, ZPS__MSG_TYPE__READY, resumed);
    return zps_wire_send(srv->up, NULL, &ready, NULL, 0, NULL);
}

void zps_register_up_header(const zps_server *srv, Zps__Header *h, Zps__MsgType type,
                            uint64_t step)
{
    zps_wire_header_init(h, type);
    h->job_id = srv->job_id;
    h->shard = srv->o->shard;
    h->shard_token = srv->shard_token;
    h->step = step;
}

// Reads the coordinator's socket; a failure here ends the shard.
zps_err zps_register_read_up(zps_server *srv)
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
        err = zps_steps_rollback(srv, m.hdr->step);
        if (err == ZPS_OK && m.hdr->plan) {
            zps_steps_take_wire_plan(srv, m.hdr->plan);
        }
    } else if (err == ZPS_OK && m.hdr->type == ZPS__MSG_TYPE__PLAN && srv->shard && m.hdr->plan) {
        zps_steps_take_wire_plan(srv, m.hdr->plan);
    } else if (err == ZPS_OK && m.hdr->type == ZPS__MSG_TYPE__NORM && srv->shard &&
               m.hdr->job_id == srv->job_id) {
        // --clip-grad-norm: from the coordinator's socket, as PLAN and ROLLBACK.
        zps_steps_clip(srv, m.hdr->step, m.hdr->grad_norm);
    } else if (err == ZPS_OK) {
        zps_log_warn("ignored %s from the coordinator", zps_wire_type_name(m.hdr->type));
    } else if (err == ZPS_ETIMEDOUT) {
        err = ZPS_OK;
    }
    zps_wire_msg_fini(&m);
    return err;
}

// ---------------------------------------------------------------------------
// After the last step.

// The coordinator waits for the members to be through (its grace), and
// until then one may still want this shard's last parameters: a PULL (its
// host's leader stopped before passing them on), or the segment that holds
// them, which is gone with this process. The shard ends when its
// connection to the coordinator closes, or after ZPS_SERVER_LINGER_MS.
void zps_register_linger(zps_server *srv)
{
    if (srv->up_mon) {
        return; // already watching: the last step said done twice changes nothing
    }
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://zps-up-%p", (void *)srv);
    if (!srv->up || zmq_socket_monitor(srv->up, ep, ZMQ_EVENT_DISCONNECTED) != 0 ||
        !(srv->up_mon = zmq_socket(srv->ctx, ZMQ_PAIR)) || zmq_connect(srv->up_mon, ep) != 0) {
        zps_log_warn("shard %u: last step done; the coordinator's connection cannot be watched "
                     "(%s): ending now", srv->o->shard, zmq_strerror(errno));
        zps_register_linger_stop(srv);
        srv->finished = true;
        return;
    }
    double now = zps_clock_ms();
    srv->linger_until_ms = now + ZPS_SERVER_LINGER_MS;
    zps_timers_at(&srv->timers, srv->t_linger, now);
    zps_log_info("shard %u: last step done; serving its parameters until the coordinator at %s "
                 "ends (at most %.0f s)", srv->o->shard, srv->o->coordinator,
                 ZPS_SERVER_LINGER_MS / 1e3);
}

void zps_register_linger_check(zps_server *srv, double now)
{
    zmq_pollitem_t item = {.socket = srv->up_mon, .events = ZMQ_POLLIN};
    if (srv->up_mon && zmq_poll(&item, 1, 0) > 0) {
        zps_log_info("shard %u: the coordinator has ended", srv->o->shard);
    } else if (now < srv->linger_until_ms) {
        return;
    } else {
        zps_log_warn("shard %u: the coordinator has not ended within %.0f s of the last step: "
                     "ending", srv->o->shard, ZPS_SERVER_LINGER_MS / 1e3);
    }
    zps_register_linger_stop(srv);
    srv->finished = true;
}

void zps_register_linger_stop(zps_server *srv)
{
    if (srv->up_mon) {
        (void)zmq_socket_monitor(srv->up, NULL, 0); // fails only for a socket not monitored
        zps_wire_close(&srv->up_mon);
    }
    if (srv->t_linger >= 0) {
        zps_timers_cancel(&srv->timers, srv->t_linger);
    }
}
