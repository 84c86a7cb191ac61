/* zps_optim.c - SGD, Adam and AdamW (torch semantics) and the
 * learning-rate schedules.
 *
 * The update loops run over every parameter of a shard each step, block by
 * block from L1 (server/shard/zps_shard.c): on x86-64 with GCC or Clang and glibc
 * they are also compiled for AVX-512 and AVX2 (target_clones, as
 * common/zps_dtype.c does), and the loader picks the best the CPU has.
 * Every clone gives the same bits: each element is the same sequence of
 * single IEEE float operations (the square root included), never
 * contracted into an FMA, whatever the vector width. */
#include "zps_optim.h"

#include <math.h>
#include <string.h>

#include "zps_log.h"

#if defined(__x86_64__) && defined(__GNUC__) && defined(__GLIBC__)
#define ZPS_OPTIM_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ZPS_OPTIM_CLONES
#endif

#if defined(__GNUC__) && !defined(__clang__) && !defined(__STRICT_ANSI__)
// GNU C mode lets GCC fuse a * b + c into an FMA in the AVX-512 and AVX2
// clones, so results would depend on the CPU (see common/zps_dtype.c).
#error "build zps_optim.c in ISO C mode (-std=c11), where GCC does not contract a * b + c"
#endif

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

static const char *const s_names[] = {
    [ZPS_OPTIM_SGD] = "sgd",
    [ZPS_OPTIM_ADAM] = "adam",
    [ZPS_OPTIM_ADAMW] = "adamw",
};
#define S_N_KINDS ((int)(sizeof s_names / sizeof s_names[0]))

zps_err zps_optim_parse_kind(const char *name, zps_optim_kind *out)
{
    for (int k = 0; k < S_N_KINDS; k++) {
        if (strcmp(name, s_names[k]) == 0) {
            *out = (zps_optim_kind)k;
            return ZPS_OK;
        }
    }
    return ZPS_EINVAL;
}

const char *zps_optim_name(zps_optim_kind kind)
{
    return (int)kind >= 0 && (int)kind < S_N_KINDS ? s_names[kind] : "?";
}

int zps_optim_state_floats(zps_optim_kind kind)
{
    return kind == ZPS_OPTIM_SGD ? 1 : 2;
}

zps_err zps_optim_validate(const zps_optim_cfg *cfg)
{
    if ((int)cfg->kind < 0 || (int)cfg->kind >= S_N_KINDS) {
        zps_log_error("optimizer %d: expected sgd (0), adam (1) or adamw (2)", (int)cfg->kind);
        return ZPS_EINVAL;
    }
    const char *name = s_names[cfg->kind];
    // The negated comparisons refuse NaN too.
    if (!(cfg->lr >= 0) || !(cfg->weight_decay >= 0)) {
        zps_log_error("optimizer %s: --lr and --weight-decay must be >= 0", name);
        return ZPS_EINVAL;
    }
    if (cfg->schedule == ZPS_LR_STEP && (cfg->step_size == 0 || !(cfg->gamma >= 0) ||
                                         isinf(cfg->gamma))) {
        zps_log_error("--lr-schedule step needs --lr-step-size >= 1 and a finite --lr-gamma "
                      ">= 0");
        return ZPS_EINVAL;
    }
    if (cfg->kind == ZPS_OPTIM_SGD) {
        if (!(cfg->momentum >= 0)) {
            zps_log_error("optimizer sgd: --momentum must be >= 0");
            return ZPS_EINVAL;
        }
        if (cfg->nesterov && cfg->momentum <= 0) {
            zps_log_error("optimizer sgd: --nesterov needs --momentum > 0");
            return ZPS_EINVAL;
        }
        return ZPS_OK;
    }
    if (!(cfg->beta1 >= 0 && cfg->beta1 < 1) || !(cfg->beta2 >= 0 && cfg->beta2 < 1)) {
        zps_log_error("optimizer %s: --betas %g,%g: each must be in [0, 1)", name, cfg->beta1,
                      cfg->beta2);
        return ZPS_EINVAL;
    }
    // torch accepts eps = 0, but then a parameter whose gradients were all
    // zero divides 0 by 0 and turns NaN.
    if (!(cfg->eps > 0) || isinf(cfg->eps)) {
        zps_log_error("optimizer %s: --eps %g must be > 0 and finite", name, cfg->eps);
        return ZPS_EINVAL;
    }
    return ZPS_OK;
}

zps_err zps_optim_check(const char *name, const zps_optim_cfg *cfg)
{
    zps_optim_kind kind;
    if (zps_optim_parse_kind(name, &kind) != ZPS_OK) {
        zps_log_error("--optimizer '%s': expected sgd, adam or adamw", name);
        return ZPS_EINVAL;
    }
    if (kind != cfg->kind) {
        zps_log_error("--optimizer %s does not match its settings (%s)", name,
                      zps_optim_name(cfg->kind));
        return ZPS_EINVAL;
    }
    return zps_optim_validate(cfg);
}

zps_err zps_optim_parse_schedule(const char *text, zps_lr_schedule *out)
{
    if (strcmp(text, "constant") == 0) {
        *out = ZPS_LR_CONSTANT;
    } else if (strcmp(text, "cosine") == 0) {
        *out = ZPS_LR_COSINE;
    } else if (strcmp(text, "linear") == 0) {
        *out = ZPS_LR_LINEAR;
    } else if (strcmp(text, "step") == 0) {
        *out = ZPS_LR_STEP;
    } else {
        return ZPS_EINVAL;
    }
    return ZPS_OK;
}

float zps_optim_lr_at(const zps_optim_cfg *cfg, uint64_t step)
{
    if (step < cfg->warmup_steps) {
        return (float)(cfg->lr * (double)(step + 1) / (double)cfg->warmup_steps);
    }
    uint64_t after = step - cfg->warmup_steps;
    if (cfg->schedule == ZPS_LR_STEP && cfg->step_size > 0) {
        // torch's StepLR: lr * gamma ** (t // step_size).
        uint64_t decays = after / cfg->step_size; // floor, as torch's //
        return (float)(cfg->lr * pow(cfg->gamma, (double)decays));
    }
    if (cfg->schedule == ZPS_LR_CONSTANT || cfg->schedule == ZPS_LR_STEP ||
        cfg->total_steps <= cfg->warmup_steps) {
        return cfg->lr;
    }
    double t = (double)after;
    double span = (double)(cfg->total_steps - cfg->warmup_steps);
    if (cfg->schedule == ZPS_LR_LINEAR) {
        // torch's LinearLR(start_factor 1, end_factor 0, total_iters = decay steps).
        double done = t < span ? t : span;
        return (float)(cfg->lr * (1.0 + (0.0 - 1.0) * done / span));
    }
    // torch's CosineAnnealingLR(T_max = decay steps, eta_min = 0), stepped per step.
    return (float)(cfg->lr * 0.5 * (1.0 + cos(M_PI * t / span)));
}

// Static and wrapped by the public functions, as in common/zps_dtype.c:
// Clang 14 gives a cloned function no symbol under its plain name.
ZPS_OPTIM_CLONES
static void s_sgd(const zps_optim_cfg *cfg, float lr, const float *restrict params,
                  float *restrict out, float *restrict momentum_buf, const float *restrict grad,
                  size_t n)
{
    const float wd = cfg->weight_decay;
    const float mu = cfg->momentum;
    if (mu == 0.0f) {
        for (size_t i = 0; i < n; i++) {
            out[i] = params[i] - lr * (grad[i] + wd * params[i]);
        }
        return;
    }
    if (cfg->nesterov) {
        for (size_t i = 0; i < n; i++) {
            float g = grad[i] + wd * params[i];
            float b = mu * momentum_buf[i] + g;
            momentum_buf[i] = b;
            out[i] = params[i] - lr * (g + mu * b);
        }
        return;
    }
    for (size_t i = 0; i < n; i++) {
        float b = mu * momentum_buf[i] + (grad[i] + wd * params[i]);
        momentum_buf[i] = b;
        out[i] = params[i] - lr * b;
    }
}

// torch.optim.Adam / AdamW, _single_tensor_adam(w) with amsgrad off. torch
// computes the step's scalars as Python floats (double) and rounds each to
// float32 where it meets a tensor; so does this, and each tensor op is one
// float32 operation in torch's order, so that the bits follow torch's
// formula (torch's own CPU kernels fuse some multiply-adds on AVX2; -std=c11
// keeps the compiler from fusing any here, the same on every machine).
ZPS_OPTIM_CLONES
static void s_adam(const zps_optim_cfg *cfg, float lr, uint64_t t, const float *restrict params,
                   float *restrict out, float *restrict exp_avg, float *restrict exp_avg_sq,
                   const float *restrict grad, size_t n)
{
    ZPS_ASSERT(t >= 1 && cfg->kind != ZPS_OPTIM_SGD);
    const double bias_correction1 = 1.0 - pow(cfg->beta1, (double)t);
    const double bias_correction2 = 1.0 - pow(cfg->beta2, (double)t);
    const float neg_step_size = (float)-((double)lr / bias_correction1);
    const float bias_correction2_sqrt = (float)sqrt(bias_correction2);
    const float beta2 = (float)cfg->beta2;
    const float one_minus_beta2 = (float)(1.0 - cfg->beta2);
    const float eps = (float)cfg->eps;
    // exp_avg.lerp_(grad, 1 - beta1): torch's lerp takes a weight below 0.5
    // from the start point, and a larger one from the end point.
    const float weight = (float)(1.0 - cfg->beta1);
    const bool small_weight = weight < 0.5f;
    const float one_minus_weight = 1.0f - weight;
    const bool adamw = cfg->kind == ZPS_OPTIM_ADAMW;
    const float wd = cfg->weight_decay;
    const float decay = (float)(1.0 - (double)lr * (double)wd); // AdamW: param.mul_(1 - lr * wd)
    for (size_t i = 0; i < n; i++) {
        float p = params[i];
        float g = grad[i];
        if (adamw) {
            p = p * decay;
        } else if (wd != 0.0f) {
            g = g + wd * p; // Adam: grad.add(param, alpha=weight_decay)
        }
        float m = exp_avg[i];
        m = small_weight ? m + weight * (g - m) : g - (g - m) * one_minus_weight;
        float v = exp_avg_sq[i] * beta2 + one_minus_beta2 * g * g;
        float denom = sqrtf(v) / bias_correction2_sqrt + eps;
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
        out[i] = p + neg_step_size * m / denom;
    }
}

void zps_optim_sgd_to(const zps_optim_cfg *cfg, float lr, const float *restrict params,
                      float *restrict out, float *restrict momentum_buf,
                      const float *restrict grad, size_t n)
{
    s_sgd(cfg, lr, params, out, momentum_buf, grad, n);
}

void zps_optim_adam_to(const zps_optim_cfg *cfg, float lr, uint64_t t,
                       const float *restrict params, float *restrict out,
                       float *restrict exp_avg, float *restrict exp_avg_sq,
                       const float *restrict grad, size_t n)
{
    s_adam(cfg, lr, t, params, out, exp_avg, exp_avg_sq, grad, n);
}

// The updates in place: a block at a time into a buffer and back, so that
// one loop (with every pointer restrict) computes both kinds of update.
#define S_INPLACE_BLOCK 1024

void zps_optim_sgd(const zps_optim_cfg *cfg, float lr, float *restrict params,
                   float *restrict momentum_buf, const float *restrict grad, size_t n)
{
    float out[S_INPLACE_BLOCK];
    for (size_t at = 0; at < n; at += S_INPLACE_BLOCK) {
        size_t len = n - at < S_INPLACE_BLOCK ? n - at : S_INPLACE_BLOCK;
        s_sgd(cfg, lr, params + at, out, momentum_buf + at, grad + at, len);
        memcpy(params + at, out, len * sizeof(float));
    }
}

void zps_optim_adam(const zps_optim_cfg *cfg, float lr, uint64_t t, float *restrict params,
                    float *restrict exp_avg, float *restrict exp_avg_sq,
                    const float *restrict grad, size_t n)
{
    float out[S_INPLACE_BLOCK];
    for (size_t at = 0; at < n; at += S_INPLACE_BLOCK) {
        size_t len = n - at < S_INPLACE_BLOCK ? n - at : S_INPLACE_BLOCK;
        s_adam(cfg, lr, t, params + at, out, exp_avg + at, exp_avg_sq + at, grad + at, len);
        memcpy(params + at, out, len * sizeof(float));
    }
}
