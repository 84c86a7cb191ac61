/* zps_optim.c - SGD (torch semantics) and the learning-rate schedules. */
#include "zps_optim.h"

#include <math.h>
#include <string.h>

#include "zps_log.h"

zps_err zps_optim_check(const char *name, const zps_optim_cfg *cfg)
{
    if (strcmp(name, "sgd") != 0) {
        zps_log_error("optimizer '%s': only sgd is supported", name);
        return ZPS_EINVAL;
    }
    if (!(cfg->lr >= 0) || !(cfg->momentum >= 0) || !(cfg->weight_decay >= 0)) {
        zps_log_error("optimizer: lr, momentum and weight decay must be >= 0");
        return ZPS_EINVAL;
    }
    if (cfg->nesterov && cfg->momentum <= 0) {
        zps_log_error("optimizer: nesterov needs momentum > 0");
        return ZPS_EINVAL;
    }
    return ZPS_OK;
}

zps_err zps_optim_parse_schedule(const char *text, zps_lr_schedule *out)
{
    if (strcmp(text, "constant") == 0) {
        *out = ZPS_LR_CONSTANT;
    } else if (strcmp(text, "cosine") == 0) {
        *out = ZPS_LR_COSINE;
    } else {
        zps_log_error("lr schedule '%s': expected constant or cosine", text);
        return ZPS_EINVAL;
    }
    return ZPS_OK;
}

float zps_optim_lr_at(const zps_optim_cfg *cfg, uint64_t step)
{
    if (step < cfg->warmup_steps) {
        return (float)(cfg->lr * (double)(step + 1) / (double)cfg->warmup_steps);
    }
    if (cfg->schedule == ZPS_LR_CONSTANT || cfg->total_steps <= cfg->warmup_steps) {
        return cfg->lr;
    }
    // torch's CosineAnnealingLR(T_max = decay steps, eta_min = 0), stepped per step.
    double t = (double)(step - cfg->warmup_steps);
    double span = (double)(cfg->total_steps - cfg->warmup_steps);
    return (float)(cfg->lr * 0.5 * (1.0 + cos(M_PI * t / span)));
}

void zps_optim_sgd(const zps_optim_cfg *cfg, float lr, float *restrict params,
                   float *restrict momentum_buf, const float *restrict grad, size_t n)
{
    const float wd = cfg->weight_decay;
    const float mu = cfg->momentum;
    if (mu == 0.0f) {
        for (size_t i = 0; i < n; i++) {
            params[i] -= lr * (grad[i] + wd * params[i]);
        }
        return;
    }
    if (cfg->nesterov) {
        for (size_t i = 0; i < n; i++) {
            float g = grad[i] + wd * params[i];
            float b = mu * momentum_buf[i] + g;
            momentum_buf[i] = b;
            params[i] -= lr * (g + mu * b);
        }
        return;
    }
    for (size_t i = 0; i < n; i++) {
        float b = mu * momentum_buf[i] + (grad[i] + wd * params[i]);
        momentum_buf[i] = b;
        params[i] -= lr * b;
    }
}
