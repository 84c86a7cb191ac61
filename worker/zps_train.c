/* zps_train.c - zps-worker's training loop over libzps's public API. */
#include "worker/zps_train.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/zps_clock.h"
#include "common/zps_dataset.h"
#include "common/zps_log.h"
#include "common/zps_model.h"
#include "common/zps_rng.h"
#include "common/zps_optim.h"
#include "worker/zps_backend.h"

#define ZPS_TRAIN_EVAL_CHUNK 1024u
#define ZPS_TRAIN_CALIBRATE 20 // --slowdown: computes that fix the time per sample

struct zps_train {
    zps_train_opts opts;      // flags
    zps_client *c;            // borrowed
    zps_model_spec model;     // the job's
    zps_backend *be;          // owned: the model's compute
    zps_dataset *data;        // owned, NULL for a flat model
    float *x;                 // owned: (max(B, eval chunk), inputs)
    uint32_t *labels;         // owned: same rows
    uint32_t *eval_idx;       // owned: ZPS_TRAIN_EVAL_CHUNK indices
    const zps_work *cur;      // borrowed: the piece being computed, for the bucket hook
    uint64_t fault_step;      // the step the injected pauses were last drawn for
    double ms_per_sample;     // --slowdown: own compute per sample
    int n_calib;              // computes it was measured on
    // --mode diloco: the inner optimizer, this worker's own.
    bool diloco;
    zps_optim_cfg inner;      // the job's --optimizer, --momentum, ... (the rate: zps_inner_lr)
    float *inner_state;       // owned: its state, state floats per parameter
    uint64_t inner_t;         // Adam's t: inner updates taken here
    // --deterministic: the job's micro-batch M (0: off), and the one being computed.
    uint32_t micro_batch;
    uint32_t micro;
};

// Bucket b of the gradient computed last, to the shards: the piece's
// (zps_push_bucket), or one micro-batch's of a deterministic job.
static void s_push(zps_train *t, const zps_work *w, int bucket)
{
    const float *grad = zps_backend_grads(t->be);
    float loss = zps_backend_loss(t->be);
    if (t->micro_batch) {
        (void)zps_push_micro(t->c, w, t->micro, bucket, grad, loss);
    } else {
        (void)zps_push_bucket(t->c, w, bucket, grad, loss);
    }
}

// The backend finished a bucket's gradient: push it while backward goes on.
static void s_on_bucket(void *arg, int bucket)
{
    zps_train *t = arg;
    if (!t->opts.no_overlap && !t->diloco) {
        s_push(t, t->cur, bucket);
    }
}

// Diloco: the job's inner optimizer, as include/zps.h gives it, into the
// settings common/'s updates take; its state, zeroed, for the first round.
static bool s_setup_inner(zps_train *t)
{
    zps_client *c = t->c;
    uint64_t kind = zps_info_u64(c, ZPS_INFO_INNER_OPTIM);
    t->inner = (zps_optim_cfg){
        .kind = kind == ZPS_INNER_ADAMW ? ZPS_OPTIM_ADAMW
                : kind == ZPS_INNER_ADAM ? ZPS_OPTIM_ADAM
                                         : ZPS_OPTIM_SGD,
        // The float settings come back as doubles exactly: the same bits.
        .lr = (float)zps_info_f64(c, ZPS_INFO_INNER_LR),
        .momentum = (float)zps_info_f64(c, ZPS_INFO_INNER_MOMENTUM),
        .nesterov = zps_info_u64(c, ZPS_INFO_INNER_NESTEROV) != 0,
        .weight_decay = (float)zps_info_f64(c, ZPS_INFO_INNER_WEIGHT_DECAY),
        .beta1 = zps_info_f64(c, ZPS_INFO_INNER_BETA1),
        .beta2 = zps_info_f64(c, ZPS_INFO_INNER_BETA2),
        .eps = zps_info_f64(c, ZPS_INFO_INNER_EPS)};
    size_t floats = (size_t)zps_optim_state_floats(t->inner.kind) * t->model.n_params;
    if (!(t->inner_state = calloc(floats ? floats : 1, sizeof(float)))) {
        zps_log_error("cannot allocate the inner optimizer's %zu floats", floats);
        return false;
    }
    t->diloco = true;
    return true;
}

static bool s_setup_data(zps_train *t, uint32_t rows)
{
    zps_dataset_spec ds;
    if (zps_dataset_parse(zps_info_str(t->c, ZPS_INFO_DATASET), &ds) != ZPS_OK) {
        return false;
    }
    uint32_t dim = zps_model_inputs(&t->model);
    t->data = zps_dataset_open(&ds, t->opts.cache_dir, zps_info_u64(t->c, ZPS_INFO_SEED), dim,
                               zps_model_classes(&t->model));
    if (!t->data || zps_set_dataset(t->c, zps_dataset_size(t->data, ZPS_SPLIT_TRAIN),
                                    zps_dataset_size(t->data, ZPS_SPLIT_TEST)) != ZPS_OK) {
        return false;
    }
    t->x = malloc((size_t)rows * (dim ? dim : 1) * sizeof(float));
    t->labels = malloc(rows * sizeof(uint32_t));
    t->eval_idx = malloc(ZPS_TRAIN_EVAL_CHUNK * sizeof(uint32_t));
    if (!t->x || !t->labels || !t->eval_idx) {
        zps_log_error("cannot allocate batch buffers (%u rows)", rows);
        return false;
    }
    return true;
}

zps_train *zps_train_new(zps_client *c, const zps_train_opts *opts)
{
    zps_train *t = calloc(1, sizeof *t);
    if (!t) {
        zps_log_error("out of memory");
        return NULL;
    }
    t->opts = *opts;
    t->c = c;
    t->fault_step = UINT64_MAX;
    t->micro_batch = (uint32_t)zps_info_u64(c, ZPS_INFO_MICRO_BATCH);
    if (zps_model_parse(zps_info_str(c, ZPS_INFO_MODEL), &t->model) != ZPS_OK) {
        goto fail;
    }
    // Any slice of the batch may be handed to this worker.
    uint32_t B = (uint32_t)zps_info_u64(c, ZPS_INFO_GLOBAL_BATCH);
    uint32_t rows = B > ZPS_TRAIN_EVAL_CHUNK ? B : ZPS_TRAIN_EVAL_CHUNK;
    t->be = zps_backend_new(opts->device, opts->gpu_math, &t->model, rows,
                            zps_info_u64(c, ZPS_INFO_SEED) ^ zps_info_u64(c, ZPS_INFO_RANK));
    if (!t->be) {
        goto fail;
    }
    zps_backend_set_bucket_hook(t->be, s_on_bucket, t);
    if (zps_set_params(c, zps_backend_params(t->be), t->model.n_params) != ZPS_OK) {
        goto fail;
    }
    if (zps_backend_uses_data(t->be) && !s_setup_data(t, rows)) {
        goto fail;
    }
    if (zps_info_u64(c, ZPS_INFO_MODE) == ZPS_MODE_DILOCO && !s_setup_inner(t)) {
        goto fail;
    }
    return t;
fail:
    zps_train_destroy(&t);
    return NULL;
}

void zps_train_destroy(zps_train **tp)
{
    zps_train *t = *tp;
    if (!t) {
        return;
    }
    zps_backend_destroy(&t->be);
    zps_dataset_destroy(&t->data);
    free(t->x);
    free(t->labels);
    free(t->eval_idx);
    free(t->inner_state);
    free(t);
    *tp = NULL;
}

const float *zps_train_params(const zps_train *t, size_t *n_params)
{
    *n_params = t->model.n_params;
    return zps_backend_params(t->be);
}

static void s_sleep_ms(double ms)
{
    if (ms > 0) {
        struct timespec ts = {(time_t)(ms / 1000), (long)(fmod(ms, 1000.0) * 1e6)};
        nanosleep(&ts, NULL);
    }
}

// --slowdown: the time per sample is the least of the first
// ZPS_TRAIN_CALIBRATE computes, then fixed: this host at its best, warm
// and uncontended. A slower machine's speed is steady; a running mean
// would follow this host's contention (3 workers on 2 cores compute slower
// together than alone) and multiply it by F - 1, and a split made by
// throughput would be wrong as soon as it is used. The least, not the
// median: at 43 samples a slice one compute here takes 1-6 x the least,
// and their median is twice it.
static void s_calibrate(zps_train *t, double per_sample)
{
    if (t->n_calib == ZPS_TRAIN_CALIBRATE) {
        return;
    }
    if (t->n_calib == 0 || per_sample < t->ms_per_sample) {
        t->ms_per_sample = per_sample;
    }
    t->n_calib++;
}

// Fault injection for tests and demos (--slowdown, --stall-prob): the
// pause comes before the compute, so a slowed worker pushes late. A slowed
// worker waits (F - 1) x its time per sample (s_calibrate) x the samples.
// Whether a step pauses is drawn from the seed and the step alone, once a
// step, so one --stall-seed pauses at the same steps in every run that
// computes them (a worker whose late slices were handed on skips steps);
// the log names each pause's step.
static void s_inject_faults(zps_train *t, uint64_t step, uint32_t samples)
{
    if (t->opts.slowdown > 1.0) {
        s_sleep_ms((t->opts.slowdown - 1.0) * t->ms_per_sample * samples);
    }
    if (t->opts.stall_prob <= 0 || step == t->fault_step) {
        return;
    }
    t->fault_step = step;
    zps_rng rng;
    zps_rng_seed(&rng, t->opts.fault_seed, step);
    if (zps_rng_uniform(&rng) < t->opts.stall_prob) {
        zps_log_info("step %" PRIu64 ": injected stall of %d ms", step, t->opts.stall_ms);
        s_sleep_ms(t->opts.stall_ms);
    }
}

// Diloco: the inner optimizer's step on this worker's parameters, at the
// learning rate of the global batch w trains (the schedule runs over every
// inner step of the run, as one process's would over its steps).
static void s_inner_step(zps_train *t, const zps_work *w)
{
    float *params = zps_backend_params(t->be);
    const float *grad = zps_backend_grads(t->be);
    size_t n = t->model.n_params;
    float lr = (float)zps_inner_lr(t->c, w->step);
    if (t->inner.kind == ZPS_OPTIM_SGD) {
        zps_optim_sgd(&t->inner, lr, params, t->inner_state, grad, n);
    } else {
        zps_optim_adam(&t->inner, lr, ++t->inner_t, params, t->inner_state,
                       t->inner_state + n, grad, n);
    }
}

// Forward and backward of n samples from row `row` of the piece's data,
// and, with --no-overlap, its buckets pushed after.
static zps_err s_train_rows(zps_train *t, const zps_work *w, uint32_t row, uint32_t n,
                            float *loss)
{
    size_t dim = zps_model_inputs(&t->model);
    zps_err err = zps_backend_train_step(t->be, t->x ? t->x + (size_t)row * dim : NULL,
                                         t->labels ? t->labels + row : NULL, n, loss);
    if (err != ZPS_OK || !t->opts.no_overlap || t->diloco) {
        return err;
    }
    int n_buckets = (int)zps_info_u64(t->c, ZPS_INFO_N_BUCKETS), order[ZPS_MODEL_MAX_BUCKETS];
    zps_model_spread_order(n_buckets, order);
    for (int b = 0; b < n_buckets; b++) {
        s_push(t, w, order[b]);
    }
    return err;
}

// The piece's gradient: at once, or, in a deterministic job, micro-batch
// by micro-batch, each on its own (the same kernel on the same shapes
// wherever it is computed); *loss their mean.
static zps_err s_train(zps_train *t, const zps_work *w, float *loss)
{
    if (!t->micro_batch) {
        return s_train_rows(t, w, 0, w->count, loss);
    }
    uint32_t n = w->count / t->micro_batch;
    double sum = 0;
    zps_err err = ZPS_OK;
    for (t->micro = 0; err == ZPS_OK && t->micro < n; t->micro++) {
        float one;
        err = s_train_rows(t, w, t->micro * t->micro_batch, t->micro_batch, &one);
        sum += one;
    }
    *loss = (float)(sum / n);
    return err;
}

// Computes piece w on the current parameters and pushes its gradient bucket
// by bucket (diloco: takes the inner step). ZPS_OK also when the client
// said to skip it.
static zps_err s_compute(zps_train *t, zps_work *w)
{
    double t0 = zps_clock_ms();
    if (t->data) {
        zps_err err = zps_dataset_gather(t->data, ZPS_SPLIT_TRAIN, w->indices, w->count, t->x,
                                         t->labels);
        if (err != ZPS_OK) {
            return err;
        }
    }
    w->data_ms = zps_clock_ms() - t0;
    s_inject_faults(t, w->step, w->count);
    if (zps_work_start(t->c, w) != ZPS_OK) {
        return ZPS_OK; // its step is over: the client catches up
    }
    t->cur = w;
    float loss;
    double tc = zps_clock_ms();
    zps_err err = s_train(t, w, &loss);
    s_calibrate(t, (zps_clock_ms() - tc) / (w->count ? w->count : 1));
    if (err == ZPS_OK && t->diloco) {
        s_inner_step(t, w);
        err = zps_inner_done(t->c, w, loss);
        t->cur = NULL;
        return err;
    }
    if (err == ZPS_OK) {
        err = zps_work_done(t->c, w);
    }
    t->cur = NULL;
    return err;
}

// Evaluates test records [offset, offset + count) of w.
static zps_err s_evaluate(zps_train *t, const zps_work *w)
{
    uint32_t correct = 0;
    double loss_sum = 0;
    uint32_t lo = w->offset, hi = w->offset + w->count;
    for (uint32_t start = lo; start < hi; start += ZPS_TRAIN_EVAL_CHUNK) {
        uint32_t n = hi - start < ZPS_TRAIN_EVAL_CHUNK ? hi - start : ZPS_TRAIN_EVAL_CHUNK;
        for (uint32_t i = 0; i < n; i++) {
            t->eval_idx[i] = start + i;
        }
        zps_err err = zps_dataset_gather(t->data, ZPS_SPLIT_TEST, t->eval_idx, n, t->x,
                                         t->labels);
        if (err == ZPS_OK) {
            err = zps_backend_evaluate(t->be, t->x, t->labels, n, &correct, &loss_sum);
        }
        if (err != ZPS_OK) {
            return err;
        }
    }
    return zps_eval_done(t->c, w, correct, loss_sum);
}

int zps_train_run(zps_train *t)
{
    for (;;) {
        zps_work w;
        int r = zps_next_work(t->c, &w);
        if (r == ZPS_NEXT_WORK) {
            zps_err err = s_compute(t, &w);
            if (err != ZPS_OK) {
                zps_log_error("step %llu failed: %s", (unsigned long long)w.step,
                              zps_strerror(err));
                return ZPS_NEXT_ERROR;
            }
        } else if (r == ZPS_NEXT_EVAL) {
            if (s_evaluate(t, &w) != ZPS_OK) {
                return ZPS_NEXT_ERROR;
            }
        } else if (r != ZPS_NEXT_ROLLBACK && r != ZPS_NEXT_REJOINED) {
            return r;
        }
    }
}
