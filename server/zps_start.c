/* zps_start.c - shard 0's start once the job's sizes are known: the run's
 * length from the flags and the train set, this shard's range, the
 * coordinator, and with --resume the newest step whose checkpoint and job
 * state are both valid. Start-up (zps_setup.c) calls it for a model named
 * by the flags, the declared model (zps_declare.c) when the first worker
 * declares one: it sits below both, so that neither calls the other. */
#include "server/zps_server_int.h"

#include "common/zps_groups.h"
#include "common/zps_ckpt.h"

// The coordinator's question before it decides a rollback (zps_coord_cfg).
static zps_err s_coord_restore(void *arg, uint64_t step)
{
    return zps_steps_restore(arg, step);
}

// Shard 0 restarted with --resume: the newest step of which both its
// checkpoint and the job state are valid. No checkpoint at all is a first
// start; checkpoints of which none is valid are an error, not a restart
// from scratch.
static zps_err s_resume_coordinator(zps_server *srv)
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

// The run's length from the flags and the train set's size, checked:
// 0, or 2 with *why saying what does not fit. *spe: steps per epoch.
static int s_job_steps(zps_server *srv, uint32_t n_train, uint64_t *spe, char *why, size_t len)
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
    *spe = n_train / o->global_batch;
    srv->total_steps = o->steps ? o->steps : o->epochs * *spe;
    if (srv->total_steps == 0) {
        snprintf(why, len, "the run has no steps (--epochs 0 or --steps 0)");
        return 2;
    }
    if (o->mode.diloco) {
        // The server's steps are rounds of H global batches each.
        uint64_t h = o->mode.inner_steps;
        if (o->steps && o->steps % h != 0) {
            snprintf(why, len, "--steps %llu is not a whole number of rounds of --inner-steps %llu",
                     (unsigned long long)o->steps, (unsigned long long)h);
            return 2;
        }
        if (srv->total_steps < h) {
            snprintf(why, len, "the run's %llu global batches make no round of --inner-steps %llu",
                     (unsigned long long)srv->total_steps, (unsigned long long)h);
            return 2;
        }
        if ((uint64_t)o->global_batch * h >= (1u << 24)) {
            // A shard weighs each pseudo-gradient by its samples of every
            // inner step, in a float that must hold it exactly.
            snprintf(why, len, "--global-batch %u times --inner-steps %llu must stay below 2^24",
                     o->global_batch, (unsigned long long)h);
            return 2;
        }
        uint32_t f = zps_outer_fragments(&o->mode);
        if (f > h || srv->model.n_params / o->shards < f) {
            snprintf(why, len, f > h ? "--fragments %u: more than --inner-steps %llu"
                                     : "--fragments %u: a shard's range is shorter than that",
                     f, (unsigned long long)h);
            return 2;
        }
        // A round is F steps (one per fragment) of H / F global batches.
        srv->total_steps = srv->total_steps / h * f;
    }
    return 0;
}

// --clip-grad-norm, or else what the workers declared with the model (0: none).
static float s_clip_grad_norm(const zps_server *srv)
{
    float clip = srv->o->clip_grad_norm > 0 ? srv->o->clip_grad_norm
                 : srv->declared            ? srv->declared->layout->clip_grad_norm
                                            : 0.0f;
    if (clip > 0) {
        zps_log_info("clipping every step's gradient to a global norm of at most %g",
                     (double)clip);
    }
    return clip;
}

// A declared layout's groups, taken when no optimizer flag was given:
// the workers' optimizer, group 0's settings the job's (its kind sizes the
// state), with no schedule but the table rank 0 may declare (a torch
// optimizer without a scheduler).
static void s_declared_optim(const zps_server *srv, zps_shard_cfg *cfg)
{
    cfg->layout = srv->declared ? srv->declared->layout : NULL;
    if (cfg->layout && cfg->layout->n_groups > 0 && !srv->o->optim_given) {
        zps_optim_cfg base = {.schedule = ZPS_LR_CONSTANT, .total_steps = srv->total_steps};
        cfg->optim = zps_groups_cfg(cfg->layout->groups[0], &base);
    }
}

// Shard 0 with the job's sizes known: the coordinator and this shard's
// range. *why says what does not fit (2), or memory ran out (1).
int zps_start_coordinator(zps_server *srv, uint32_t n_train, uint32_t n_test, char *why,
                          size_t len)
{
    const zps_server_opts *o = srv->o;
    uint64_t spe;
    int status = s_job_steps(srv, n_train, &spe, why, len);
    if (status != 0) {
        return status;
    }
    srv->dtype = o->wire_dtype;
    zps_shard_cfg cfg = {.index = 0, .model = &srv->model, .seed = o->seed,
                         .global_batch = o->global_batch, .dtype = o->wire_dtype,
                         .optim = o->optim, .await_init = srv->declared != NULL,
                         .threads = srv->threads, .mode = o->mode,
                         .micro_batch = o->micro_batch};
    cfg.clip_grad_norm = s_clip_grad_norm(srv);
    cfg.optim.total_steps = srv->total_steps;
    s_declared_optim(srv, &cfg);
    zps_optim_cfg inner = o->optim;
    if (o->mode.diloco) {
        cfg.optim = zps_outer_optim(&o->mode.outer);
        inner.total_steps = zps_outer_step_batch(&o->mode, srv->total_steps);
    }
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
        .mode = o->mode, .inner = inner, .clip_grad_norm = cfg.clip_grad_norm,
        .micro_batch = o->micro_batch, .no_host_aggregate = o->no_host_aggregate,
        .wire_code = o->wire_code,
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
