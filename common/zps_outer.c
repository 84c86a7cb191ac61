/* zps_outer.c - DiLoCo's outer step: pseudo-gradients, their sample-
 * weighted mean and the Nesterov update of zps_optim. */
#include "zps_outer.h"

#include <math.h>

#include "zps_log.h"
#include "zps_quant.h"

#ifdef __clang__
// Clang contracts a * b + c within one expression by default (GCC does not
// in ISO C mode): the weighted sum must round each product as the
// reference (tests/common/gen_outer_ref.py) does.
#pragma STDC FP_CONTRACT OFF
#endif

// Elements averaged per call of zps_optim_sgd: the mean of a block is made
// on the stack, so a step needs no buffer of the range's size.
#define S_BLOCK 256

// The negated comparisons refuse NaN too.
static bool s_lr_ok(const zps_outer_cfg *cfg)
{
    return cfg->lr >= 0 && isfinite(cfg->lr);
}

static bool s_momentum_ok(const zps_outer_cfg *cfg)
{
    return cfg->momentum >= 0 && cfg->momentum < 1;
}

zps_err zps_outer_validate(const zps_outer_cfg *cfg)
{
    if (!s_lr_ok(cfg)) {
        zps_log_error("--outer-lr %g: must be >= 0 and finite", (double)cfg->lr);
        return ZPS_EINVAL;
    }
    if (!s_momentum_ok(cfg)) {
        zps_log_error("--outer-momentum %g: must be in [0, 1)", (double)cfg->momentum);
        return ZPS_EINVAL;
    }
    return ZPS_OK;
}

zps_err zps_outer_mode_check(const zps_outer_mode *mode)
{
    bool steps_ok = mode->inner_steps >= 1 && mode->inner_steps <= ZPS_OUTER_MAX_INNER_STEPS;
    bool compress_ok = mode->compress == 0 || mode->compress == ZPS_QUANT_INT8 ||
                       mode->compress == ZPS_QUANT_E3M0;
    uint32_t f = zps_outer_fragments(mode);
    bool fragments_ok = f <= ZPS_OUTER_MAX_FRAGMENTS && f <= mode->inner_steps;
    return steps_ok && compress_ok && fragments_ok ? ZPS_OK : ZPS_EINVAL;
}

// Where fragment f of [lo, hi) begins.
static uint64_t s_fragment_lo(uint32_t f_count, uint64_t lo, uint64_t hi, uint32_t f)
{
    return lo + (hi - lo) * f / f_count;
}

uint32_t zps_outer_fragment_at(const zps_outer_mode *mode, uint64_t lo, uint64_t hi, uint64_t x)
{
    uint32_t n = zps_outer_fragments(mode), f = 0;
    while (f + 1 < n && s_fragment_lo(n, lo, hi, f + 1) <= x) {
        f++;
    }
    return f;
}

int zps_outer_cut_buckets(const zps_outer_mode *mode, uint64_t lo, uint64_t hi,
                          const zps_bucket *in, int n_in, zps_bucket *out, int max)
{
    uint32_t n = zps_outer_fragments(mode);
    int k = 0;
    for (int i = 0; i < n_in; i++) {
        for (uint64_t at = in[i].lo; at < in[i].hi;) {
            uint32_t f = zps_outer_fragment_at(mode, lo, hi, at);
            uint64_t end = f + 1 < n ? s_fragment_lo(n, lo, hi, f + 1) : hi;
            end = end < in[i].hi ? end : in[i].hi;
            if (k == max) {
                return -1;
            }
            out[k++] = (zps_bucket){at, end};
            at = end;
        }
    }
    return k;
}

zps_optim_cfg zps_outer_optim(const zps_outer_cfg *cfg)
{
    zps_optim_cfg o = {
        .kind = ZPS_OPTIM_SGD,
        .lr = cfg->lr,
        .momentum = cfg->momentum,
        .nesterov = cfg->momentum > 0,
        .schedule = ZPS_LR_CONSTANT,
    };
    return o;
}

void zps_outer_delta(const float *restrict sync, const float *restrict local,
                     float *restrict delta, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        delta[i] = sync[i] - local[i];
    }
}

void zps_outer_accumulate(double *restrict acc, double weight, const float *restrict delta,
                          size_t n)
{
    for (size_t i = 0; i < n; i++) {
        acc[i] += weight * (double)delta[i];
    }
}

zps_err zps_outer_step(const zps_outer_cfg *cfg, float *restrict params,
                       float *restrict momentum_buf, const double *restrict acc, double total,
                       size_t n)
{
    if (!(total > 0) || isinf(total) || !s_lr_ok(cfg) || !s_momentum_ok(cfg)) {
        return ZPS_EINVAL;
    }
    const zps_optim_cfg o = zps_outer_optim(cfg);
    float mean[S_BLOCK];
    for (size_t at = 0; at < n; at += S_BLOCK) {
        size_t len = n - at < S_BLOCK ? n - at : S_BLOCK;
        for (size_t i = 0; i < len; i++) {
            mean[i] = (float)(acc[at + i] / total);
        }
        zps_optim_sgd(&o, o.lr, params + at, momentum_buf ? momentum_buf + at : NULL, mean, len);
    }
    return ZPS_OK;
}
