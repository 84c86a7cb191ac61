/* zps_optim.h - optimizers and learning-rate schedules.
 *
 * Shards apply them to their range of the flat vector; the update of an
 * element depends only on that element's parameter, state and gradient, so
 * a run gives the same bits however the vector is sharded. SGD follows
 * torch.optim.SGD exactly (dampening 0): that is what users compare with. */
#ifndef ZPS_OPTIM_H
#define ZPS_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zps_err.h"

typedef enum zps_lr_schedule {
    ZPS_LR_CONSTANT = 0,
    ZPS_LR_COSINE = 1, // decays to 0 at total_steps
} zps_lr_schedule;

typedef struct zps_optim_cfg {
    float lr;                  // peak learning rate
    float momentum;            // 0 disables the buffer
    bool nesterov;             // Nesterov momentum (needs momentum > 0)
    float weight_decay;        // L2, added to the gradient as in torch
    zps_lr_schedule schedule;  // per step
    uint64_t warmup_steps;     // linear warm-up from lr/warmup to lr
    uint64_t total_steps;      // length of the run, for the cosine
} zps_optim_cfg;

// "sgd" is the only optimizer for now; ZPS_EINVAL (logged) otherwise, or for
// settings torch would refuse (negative lr, nesterov without momentum).
zps_err zps_optim_check(const char *name, const zps_optim_cfg *cfg);
zps_err zps_optim_parse_schedule(const char *text, zps_lr_schedule *out);

// The learning rate used by the update of step `step` (0-based).
float zps_optim_lr_at(const zps_optim_cfg *cfg, uint64_t step);

// One SGD update of n elements: params and momentum_buf (zeroed before the
// first step) are updated in place from grad.
void zps_optim_sgd(const zps_optim_cfg *cfg, float lr, float *restrict params,
                   float *restrict momentum_buf, const float *restrict grad, size_t n);

#endif
