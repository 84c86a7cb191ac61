/* zps_checkpoint.c - libzps: a job's checkpoints read back whole (1.5,
 * zps_checkpoint_open of include/zps.h), for tools and for zps.torch's
 * load_checkpoint and python3 -m zps.checkpoint.
 *
 * Nothing of the format is here: every file is read by common/zps_ckpt.c,
 * the server's own reader. zps_ckpt_peek gives a file's header; a load with
 * that header as its want then checks the size, the CRC and the meta, as a
 * restarted shard's load does. This file only decides which step is
 * complete (every shard's file of it valid, of one job, the ranges tiling
 * [0, P)) and gathers the shards' ranges into one flat vector per array. */
#include "include/zps.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_ckpt.h"
#include "common/zps_layout.h"
#include "common/zps_optim.h"
#include "proto/zps.pb-c.h"

#define S_MAX_STEPS 1024 // steps of shard 0 looked at, newest first

struct zps_checkpoint {
    zps_ckpt_meta meta;  // shard 0's, step and optimizer step included
    uint64_t n;          // P
    float *arr[3];       // parameters, then the optimizer's state slots (NULL if none)
    int slots;           // state slots: 1 SGD, 2 Adam
    Zps__Hello *declared; // the declared model, or NULL (a built-in model's job)
};

static void s_free(zps_checkpoint *k)
{
    for (int i = 0; i < 3; i++) {
        free(k->arr[i]);
    }
    if (k->declared) {
        zps__hello__free_unpacked(k->declared, NULL);
    }
    free(k);
}

// Whether shard i's header belongs with shard 0's and continues the
// vector at *at.
static bool s_same_job(const zps_ckpt_meta *m, const zps_ckpt_meta *first, uint32_t i,
                       uint64_t at, char *why, size_t len)
{
    if (m->shard != i || m->shards != first->shards || m->job_seed != first->job_seed ||
        m->model_hash != first->model_hash || m->optim != first->optim ||
        m->optim_step != first->optim_step) {
        snprintf(why, len, "shard %" PRIu32 "'s file is of another job, optimizer or update "
                           "count than shard 0's",
                 i);
        return false;
    }
    if (m->lo != at) {
        snprintf(why, len, "shard %" PRIu32 " covers [%" PRIu64 ", %" PRIu64
                           "), the shards before it end at %" PRIu64,
                 i, m->lo, m->hi, at);
        return false;
    }
    return true;
}

// Loads shard i's file of step (header m) into its range of k's arrays.
static zps_err s_load_shard(zps_checkpoint *k, const char *dir, const zps_ckpt_meta *m,
                            uint64_t step, char *why, size_t len)
{
    size_t n = (size_t)(m->hi - m->lo);
    float *state = malloc(((size_t)k->slots * n + 1) * sizeof(float));
    if (!state) {
        snprintf(why, len, "out of memory");
        return ZPS_ENOMEM;
    }
    uint64_t optim_step = 0;
    zps_err err = zps_ckpt_load(dir, m, step, k->arr[0] + m->lo, state, &optim_step);
    if (err != ZPS_OK) {
        snprintf(why, len, "shard %" PRIu32 "'s file of step %" PRIu64 " is not valid (%s)",
                 m->shard, step, zps_strerror(err));
    }
    for (int s = 0; err == ZPS_OK && s < k->slots; s++) {
        memcpy(k->arr[1 + s] + m->lo, state + (size_t)s * n, n * sizeof(float));
    }
    free(state);
    return err;
}

// Every shard's header of step, checked to be one job's that tiles [0, P):
// metas[i] is shard i's; *p is P. Caller owns *metas.
static zps_err s_headers(const char *dir, uint64_t step, zps_ckpt_meta **metas, uint64_t *p,
                         char *why, size_t len)
{
    zps_ckpt_meta first;
    zps_err err = zps_ckpt_peek(dir, 0, step, &first, why, len);
    if (err != ZPS_OK) {
        return err;
    }
    if (first.shards == 0 || first.shards > 4096) {
        snprintf(why, len, "shard 0's file of step %" PRIu64 " says %" PRIu32 " shards", step,
                 first.shards);
        return ZPS_EPROTO;
    }
    *metas = calloc(first.shards, sizeof **metas);
    if (!*metas) {
        return ZPS_ENOMEM;
    }
    uint64_t at = 0;
    for (uint32_t i = 0; i < first.shards && err == ZPS_OK; i++) {
        err = zps_ckpt_peek(dir, i, step, &(*metas)[i], why, len);
        if (err == ZPS_OK && !s_same_job(&(*metas)[i], &first, i, at, why, len)) {
            err = ZPS_EPROTO;
        }
        at = (*metas)[i].hi;
    }
    if (err == ZPS_OK && (at == 0 || at > ZPS_MODEL_MAX_FLAT)) {
        snprintf(why, len, "the shards' ranges make %" PRIu64 " floats", at);
        err = ZPS_EPROTO;
    }
    *p = at;
    return err;
}

// The checkpoint of exactly step, every shard's file loaded and checked.
static zps_err s_open_step(const char *dir, uint64_t step, zps_checkpoint **out, char *why,
                           size_t len)
{
    zps_ckpt_meta *metas = NULL;
    uint64_t p = 0;
    zps_err err = s_headers(dir, step, &metas, &p, why, len);
    zps_checkpoint *k = err == ZPS_OK ? calloc(1, sizeof *k) : NULL;
    if (err == ZPS_OK && k) {
        k->meta = metas[0];
        k->n = p;
        k->slots = zps_optim_state_floats(k->meta.optim);
        for (int i = 0; i <= k->slots; i++) {
            k->arr[i] = malloc((size_t)p * sizeof(float));
            err = k->arr[i] ? err : ZPS_ENOMEM;
        }
    } else if (err == ZPS_OK) {
        err = ZPS_ENOMEM;
    }
    for (uint32_t i = 0; err == ZPS_OK && i < k->meta.shards; i++) {
        err = s_load_shard(k, dir, &metas[i], step, why, len);
    }
    free(metas);
    if (err != ZPS_OK && k) {
        s_free(k);
        k = NULL;
    }
    *out = k;
    return err;
}

// The declared model kept beside the checkpoints, if any (a job of a
// built-in model has none); it must be the vector's model.
static zps_err s_declared(zps_checkpoint *k, const char *dir, char *why, size_t len)
{
    uint8_t *buf = malloc(ZPS_CKPT_DECLARED_MAX);
    size_t n = 0;
    zps_err err = buf ? zps_ckpt_read_record(dir, ZPS_CKPT_DECLARED, buf, ZPS_CKPT_DECLARED_MAX,
                                             &n)
                      : ZPS_ENOMEM;
    k->declared = err == ZPS_OK ? zps__hello__unpack(NULL, n, buf) : NULL;
    free(buf);
    if (err == ZPS_ENOENT) {
        return ZPS_OK;
    }
    char check[200];
    if (err == ZPS_OK && (!k->declared || !k->declared->layout ||
                          zps_layout_check(k->declared->layout, check, sizeof check) != ZPS_OK)) {
        snprintf(why, len, "%s/%s is not a declared model", dir, ZPS_CKPT_DECLARED);
        return ZPS_EPROTO;
    }
    if (err == ZPS_OK && zps_layout_n_params(k->declared->layout) != k->n) {
        snprintf(why, len, "%s/%s declares %" PRIu64 " floats, the checkpoints hold %" PRIu64,
                 dir, ZPS_CKPT_DECLARED, zps_layout_n_params(k->declared->layout), k->n);
        return ZPS_EPROTO;
    }
    return err;
}

// Step < 0: shard 0's steps newest first, the first complete one.
static zps_err s_open(const char *dir, int64_t step, zps_checkpoint **out, char *why,
                      size_t len)
{
    if (step >= 0) {
        return s_open_step(dir, (uint64_t)step, out, why, len);
    }
    uint64_t *steps = malloc(S_MAX_STEPS * sizeof *steps);
    int n = steps ? zps_ckpt_steps(dir, 0, steps, S_MAX_STEPS) : -1;
    zps_err err = n < 0 ? ZPS_EIO : ZPS_ENOENT;
    snprintf(why, len, "%s: no checkpoint (shard-0-step-<T>.ckpt)", dir);
    for (int i = n - 1; i >= 0 && err != ZPS_OK && err != ZPS_ENOMEM; i--) {
        err = s_open_step(dir, steps[i], out, why, len);
    }
    free(steps);
    if (err != ZPS_OK && err != ZPS_ENOMEM && n > 0) {
        char last[256]; // the last reason, cut to fit beside the rest
        size_t k = strnlen(why, sizeof last - 1);
        memcpy(last, why, k);
        last[k] = '\0';
        snprintf(why, len, "%s: no step that every shard has a valid file of (%d tried; the "
                           "oldest: %s)", dir, n, last);
        err = ZPS_ENOENT;
    }
    return err;
}

zps_err zps_checkpoint_open(const char *dir, int64_t step, zps_checkpoint **out, char *why,
                            size_t len)
{
    char scratch[512];
    if (!why || len == 0) {
        why = scratch;
        len = sizeof scratch;
    }
    why[0] = '\0';
    if (!dir || !out) {
        snprintf(why, len, "no directory or no result pointer");
        return ZPS_EINVAL;
    }
    *out = NULL;
    zps_checkpoint *k = NULL;
    zps_err err = s_open(dir, step, &k, why, len);
    if (err == ZPS_OK && (err = s_declared(k, dir, why, len)) != ZPS_OK) {
        s_free(k);
        k = NULL;
    }
    if (err == ZPS_OK) {
        why[0] = '\0';
    }
    *out = k;
    return err;
}

void zps_checkpoint_destroy(zps_checkpoint **k)
{
    if (k && *k) {
        s_free(*k);
        *k = NULL;
    }
}

uint64_t zps_checkpoint_info(const zps_checkpoint *k, int key)
{
    const Zps__Layout *l = k && k->declared ? k->declared->layout : NULL;
    switch (k ? key : 0) {
    case ZPS_CHECKPOINT_STEP:
        return k->meta.step;
    case ZPS_CHECKPOINT_SHARDS:
        return k->meta.shards;
    case ZPS_CHECKPOINT_N_PARAMS:
        return k->n;
    case ZPS_CHECKPOINT_OPTIM:
        return (uint64_t)k->meta.optim + ZPS_INNER_SGD;
    case ZPS_CHECKPOINT_OPTIM_STEP:
        return k->meta.optim_step;
    case ZPS_CHECKPOINT_SEED:
        return k->meta.job_seed;
    case ZPS_CHECKPOINT_N_TENSORS:
        return l ? l->n_tensors : 0;
    case ZPS_CHECKPOINT_N_GROUPS:
        return l ? l->n_groups : 0;
    default:
        return 0;
    }
}

zps_err zps_checkpoint_tensor(const zps_checkpoint *k, int i, const char **name, int *ndim,
                              int64_t *shape, int *group, int *role)
{
    if (!k || !k->declared || i < 0 || (size_t)i >= k->declared->layout->n_tensors) {
        return ZPS_ERANGE;
    }
    const Zps__Tensor *t = k->declared->layout->tensors[i];
    *name = t->name;
    *ndim = (int)t->n_shape;
    for (size_t d = 0; d < t->n_shape; d++) {
        shape[d] = (int64_t)t->shape[d];
    }
    *group = (int)t->group;
    *role = (int)t->role;
    return ZPS_OK;
}

zps_err zps_checkpoint_group(const zps_checkpoint *k, int g, int *kind, double *lr,
                             double *momentum, int *nesterov, double *weight_decay,
                             double *beta1, double *beta2, double *eps)
{
    if (!k || !k->declared || g < 0 || (size_t)g >= k->declared->layout->n_groups) {
        return ZPS_ERANGE;
    }
    const Zps__Optim *o = k->declared->layout->groups[g];
    *kind = (int)o->kind + ZPS_INNER_SGD;
    *lr = o->lr;
    *momentum = o->momentum;
    *nesterov = o->nesterov;
    *weight_decay = o->weight_decay;
    *beta1 = o->beta1;
    *beta2 = o->beta2;
    *eps = o->eps;
    return ZPS_OK;
}

zps_err zps_checkpoint_read(const zps_checkpoint *k, int what, float *out, size_t n)
{
    if (!k || !out || n != k->n) {
        return ZPS_EINVAL;
    }
    if (what < ZPS_CHECKPOINT_PARAMS || what > k->slots) {
        return ZPS_ERANGE;
    }
    memcpy(out, k->arr[what], n * sizeof(float));
    return ZPS_OK;
}
