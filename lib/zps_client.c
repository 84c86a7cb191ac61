/* zps_client.c - libzps: the worker side of zps behind include/zps.h.
 *
 * The handle and all but the work loop: errors and their sentence,
 * options, connecting, joining, declaring a model, what the job says
 * (zps_info_*), the caller's buffers and dataset, leaving. The loop lives
 * in rooms over the struct of zps_client_int.h: zps_work.c (the phases of
 * zps_next_work and the pieces handed out), zps_job.c (the job and its
 * plans), zps_wait.c (the parameter wait), zps_retry.c (refusals),
 * zps_ask.c (asking the coordinator, rejoining), zps_diloco.c (the round),
 * zps_evalwork.c (the evaluation of an epoch's end). */
#include "lib/zps_client_int.h"

#include <float.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_curve.h"
#include "common/zps_layout.h"
#include "common/zps_log.h"
#include "common/zps_wire.h"

_Static_assert(ZPS_LOG_LEVEL_ERROR == (int)ZPS_LOG_ERROR, "log levels must agree");

// ---------------------------------------------------------------------------
// Errors: a code, and the sentence that was logged for it.

zps_err zps_client_fail(zps_client *c, zps_err err)
{
    const char *line = zps_log_last_error();
    c->errcode = err;
    snprintf(c->errmsg, sizeof c->errmsg, "%s", *line ? line : zps_strerror(err));
    return err;
}

zps_err zps_client_einval(zps_client *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->errmsg, sizeof c->errmsg, fmt, ap);
    va_end(ap);
    c->errcode = ZPS_EINVAL;
    return ZPS_EINVAL;
}

void zps_client_begin(zps_client *c)
{
    zps_log_clear_last_error();
    c->errcode = ZPS_OK;
    c->errmsg[0] = '\0';
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
    zps_due_init(c);
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
    zps_wait_release_held(c);
    free(c->held);
    zps_host_fini(&c->host); // its socket, before the context ends
    zps_conn_fini(&c->conn); // then ZeroMQ lets go of the caller's gradient
    free(c->wire);
    zps_round_fini(&c->round);
    free(c->local);
    free(c->pushed_at);
    zps_micro_fini(&c->micro);
    zps_sampler_fini(&c->sampler);
    zps_decl_fini(&c->decl);
    zps_schedule_fini(&c->schedule);
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
    zps_client_begin(c);
    int *dst = NULL;
    int64_t lo = 0, hi = 0;
    switch (opt) {
    case ZPS_OPT_SHARE:
        if (v < 0 || v > (1 << 24)) {
            return zps_client_einval(c, "share %lld: 0..%d samples", (long long)v, 1 << 24);
        }
        c->conn.share = (uint32_t)v;
        return ZPS_OK;
    case ZPS_OPT_TIMEOUT_MS: dst = &c->timeout_ms; lo = 100; hi = 86400000; break;
    case ZPS_OPT_JOIN_TIMEOUT_MS: dst = &c->join_timeout_ms; lo = 100; hi = 86400000; break;
    case ZPS_OPT_HEARTBEAT_MS: dst = &c->conn.heartbeat_ms; lo = 10; hi = 3600000; break;
    case ZPS_OPT_SNDBUF: dst = &c->conn.sndbuf; lo = -1; hi = 1L << 30; break; // -1: auto
    case ZPS_OPT_SHM: dst = &c->conn.shm; lo = ZPS_CONN_SHM_OFF; hi = ZPS_CONN_SHM_ON; break;
    default: return zps_client_einval(c, "option %d is not a number option", (int)opt);
    }
    if (v < lo || v > hi) {
        return zps_client_einval(c, "option %d: %lld is not in %lld..%lld", (int)opt, (long long)v,
                                 (long long)lo, (long long)hi);
    }
    *dst = (int)v;
    return ZPS_OK;
}

zps_err zps_client_set_str(zps_client *c, zps_opt opt, const char *v)
{
    zps_client_begin(c);
    if (opt != ZPS_OPT_DEVICE) {
        return zps_client_einval(c, "option %d is not a text option", (int)opt);
    }
    if (!v || strlen(v) >= sizeof c->conn.device) {
        return zps_client_einval(c, "device: up to %zu characters", sizeof c->conn.device - 1);
    }
    snprintf(c->conn.device, sizeof c->conn.device, "%s", v);
    return ZPS_OK;
}

zps_err zps_client_set_curve(zps_client *c, const char *secret_file, const char *server_key_file)
{
    zps_client_begin(c);
    if (!secret_file || !server_key_file) {
        return zps_client_einval(c, "a CURVE secret key goes with the servers' public key");
    }
    zps_err err = zps_curve_load(&c->conn.curve, secret_file, server_key_file);
    return err == ZPS_OK ? ZPS_OK : zps_client_fail(c, err);
}

void zps_client_stop(zps_client *c)
{
    if (c) {
        c->conn.stop = 1;
    }
}

zps_err zps_connect(zps_client *c)
{
    zps_client_begin(c);
    zps_err err = zps_conn_connect(&c->conn);
    if (err != ZPS_OK) {
        return zps_client_fail(c, err);
    }
    return ZPS_OK;
}

zps_err zps_join(zps_client *c)
{
    zps_client_begin(c);
    if (!c->conn.shards[0].sock || c->joined) {
        return zps_client_einval(c, c->joined ? "joined already" : "zps_connect first");
    }
    char why[256];
    if (zps_decl_any(&c->decl) && zps_layout_check(&c->decl.layout, why, sizeof why) != ZPS_OK) {
        return zps_client_einval(c, "the declared model: %s", why);
    }
    if (zps_decl_any(&c->decl) && !c->decl.has_dataset) {
        return zps_client_einval(
            c, "a declared model needs its dataset declared (zps_declare_dataset)");
    }
    if (!zps_decl_any(&c->decl) && c->decl.layout.clip_grad_norm > 0) {
        return zps_client_einval(c, "clip_grad_norm is declared with the model "
                                    "(zps_declare_tensor)");
    }
    zps_wire_msg m = {0};
    zps_err err = zps_ask_hello_until_job(c, &m);
    if (err == ZPS_OK && m.hdr->type != ZPS__MSG_TYPE__JOB) {
        zps_log_error("expected JOB, got %s", zps_wire_type_name(m.hdr->type));
        err = ZPS_EPROTO;
    }
    if (err == ZPS_OK) {
        err = zps_job_take(c, m.hdr);
    }
    zps_wire_msg_fini(&m);
    if (err == ZPS_OK && c->decl.has_dataset) {
        return zps_set_dataset(c, c->decl.n_train, c->decl.n_test);
    }
    return err == ZPS_OK ? ZPS_OK : zps_client_fail(c, err);
}

zps_err zps_declare_tensor(zps_client *c, const char *name, int ndim, const int64_t *shape)
{
    zps_client_begin(c);
    if (c->joined) {
        return zps_client_einval(c, "a model is declared before zps_join");
    }
    char why[256];
    zps_err err = zps_decl_tensor(&c->decl, name, ndim, shape, why, sizeof why);
    if (err == ZPS_EINVAL) {
        return zps_client_einval(c, "%s", why);
    }
    return err == ZPS_OK ? ZPS_OK : zps_client_fail(c, err);
}

zps_err zps_declare_dataset(zps_client *c, uint32_t n_train, uint32_t n_test)
{
    zps_client_begin(c);
    char why[128];
    if (c->joined) {
        return zps_client_einval(c, "a dataset is declared before zps_join");
    }
    if (zps_decl_dataset(&c->decl, n_train, n_test, why, sizeof why) != ZPS_OK) {
        return zps_client_einval(c, "%s", why);
    }
    return ZPS_OK;
}

zps_err zps_declare_clip_grad_norm(zps_client *c, double max_norm)
{
    zps_client_begin(c);
    if (c->joined) {
        return zps_client_einval(c, "clip_grad_norm is declared before zps_join");
    }
    if (!(max_norm > 0.0 && max_norm <= FLT_MAX)) {
        return zps_client_einval(c, "clip_grad_norm %g: a max norm is finite and > 0", max_norm);
    }
    c->decl.layout.clip_grad_norm = (float)max_norm;
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
    case ZPS_INFO_MICRO_BATCH: return c->micro.m;
    case ZPS_INFO_PUSHED_BYTES: return c->conn.pushed_bytes;
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
    zps_client_begin(c);
    if (!c->joined || !params || n != c->model.n_params) {
        return zps_client_einval(
            c, "the parameter buffer must hold the model's %zu floats (join first)",
            c->joined ? c->model.n_params : 0);
    }
    if (c->dtype != ZPS_DTYPE_F32 && !c->wire &&
        !(c->wire = malloc(c->model.n_params * zps_dtype_size(c->dtype)))) {
        zps_log_error("cannot allocate the wire buffer");
        return zps_client_fail(c, ZPS_ENOMEM);
    }
    c->params = params;
    return ZPS_OK;
}

zps_err zps_set_dataset(zps_client *c, uint32_t n_train, uint32_t n_test)
{
    zps_client_begin(c);
    if (!c->joined) {
        return zps_client_einval(c, "join first");
    }
    zps_sampler_fini(&c->sampler);
    c->has_data = false;
    zps_err err = zps_sampler_init(&c->sampler, c->seed, n_train, c->global_batch);
    if (err != ZPS_OK) {
        return zps_client_fail(c, err);
    }
    if (c->sampler.steps_per_epoch != c->steps_per_epoch) {
        zps_log_error("my dataset gives %llu steps per epoch, the job %llu",
                      (unsigned long long)c->sampler.steps_per_epoch,
                      (unsigned long long)c->steps_per_epoch);
        return zps_client_fail(c, ZPS_EINVAL);
    }
    c->has_data = true;
    c->n_test = n_test;
    return ZPS_OK;
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
    zps_client_begin(c);
    if (!c->conn.job_id) {
        return ZPS_OK;
    }
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__BYE);
    h.step = c->phase == ZPS_PHASE_DONE ? c->total_steps : c->stopped_at;
    zps_err err = zps_conn_send(&c->conn, 0, &h, NULL, 0, NULL);
    return err == ZPS_OK ? ZPS_OK : zps_client_fail(c, err);
}
