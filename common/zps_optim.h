/* zps_optim.h - optimizers and learning-rate schedules.
 *
 * Shards apply them to their range of the flat vector; the update of an
 * element depends only on that element's parameter, state and gradient, so
 * a run gives the same bits however the vector is sharded. Each follows
 * torch.optim exactly (SGD with dampening 0; Adam and AdamW with amsgrad
 * off, the order of torch's single-tensor float32 path): that is what users
 * compare with. */
#ifndef ZPS_OPTIM_H
#define ZPS_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zps_err.h"

typedef enum zps_lr_schedule {
    ZPS_LR_CONSTANT = 0,
    ZPS_LR_COSINE = 1, // decays to 0 at total_steps
    ZPS_LR_LINEAR = 2, // torch LinearLR(1, 0, decay steps): to 0 at total_steps
    ZPS_LR_STEP = 3,   // torch StepLR(step_size, gamma)
} zps_lr_schedule;

// Which update, and so which state a shard keeps. The numbers travel in
// ASSIGN and in checkpoints: never renumber.
typedef enum zps_optim_kind {
    ZPS_OPTIM_SGD = 0,   // torch.optim.SGD: one momentum buffer
    ZPS_OPTIM_ADAM = 1,  // torch.optim.Adam: L2 decay added to the gradient; two moments
    ZPS_OPTIM_ADAMW = 2, // torch.optim.AdamW: decoupled decay of the parameter; two moments
} zps_optim_kind;

typedef struct zps_optim_cfg {
    zps_optim_kind kind;       // the update (0: SGD, so a zeroed cfg is today's SGD)
    float lr;                  // peak learning rate
    float momentum;            // SGD: 0 disables the buffer
    bool nesterov;             // SGD: Nesterov momentum (needs momentum > 0)
    float weight_decay;        // SGD, Adam: L2 added to the gradient; AdamW: decoupled
    double beta1, beta2;       // Adam, AdamW: moment decay rates, in [0, 1)
    double eps;                // Adam, AdamW: added to the denominator, > 0
    zps_lr_schedule schedule;  // per step
    uint64_t warmup_steps;     // linear warm-up from lr/warmup to lr
    uint64_t total_steps;      // length of the run, for the cosine and the linear
    uint64_t step_size;        // step: the rate falls by gamma every step_size steps (>= 1)
    double gamma;              // step: the factor
} zps_optim_cfg;

// torch's defaults for Adam and AdamW.
#define ZPS_OPTIM_BETA1 0.9
#define ZPS_OPTIM_BETA2 0.999
#define ZPS_OPTIM_EPS 1e-8

// "sgd", "adam" or "adamw" into *out; ZPS_EINVAL otherwise, unlogged: the
// flag table (zps_opts) says it in its own line.
zps_err zps_optim_parse_kind(const char *name, zps_optim_kind *out);
// The name of a kind ("?" for a number that is none).
const char *zps_optim_name(zps_optim_kind kind);
// Floats of optimizer state per parameter: 1 for SGD (the momentum
// buffer), 2 for Adam and AdamW (exp_avg, exp_avg_sq).
int zps_optim_state_floats(zps_optim_kind kind);

// Whether cfg holds settings torch would accept for its kind (lr, momentum
// and weight decay >= 0, nesterov only with momentum; betas in [0, 1), eps
// > 0). ZPS_EINVAL, logged with the flag at fault, otherwise, or for an
// unknown kind.
zps_err zps_optim_validate(const zps_optim_cfg *cfg);
// zps_optim_validate, after checking that name is the name of cfg->kind
// (the flags set both).
zps_err zps_optim_check(const char *name, const zps_optim_cfg *cfg);
// "constant", "cosine", "linear" or "step" into *out; ZPS_EINVAL,
// unlogged, otherwise.
zps_err zps_optim_parse_schedule(const char *text, zps_lr_schedule *out);

// The learning rate used by the update of step `step` (0-based): after
// the warm-up, torch's closed form of the scheduler stepped once a step
// (CosineAnnealingLR, LinearLR, StepLR) over the steps after it.
float zps_optim_lr_at(const zps_optim_cfg *cfg, uint64_t step);

// One SGD update of n elements: params and momentum_buf (zeroed before the
// first step) are updated in place from grad.
void zps_optim_sgd(const zps_optim_cfg *cfg, float lr, float *restrict params,
                   float *restrict momentum_buf, const float *restrict grad, size_t n);

// The t-th (t >= 1) Adam or AdamW update (cfg->kind) of n elements:
// params, exp_avg and exp_avg_sq (both zeroed before t = 1) are updated in
// place from grad with learning rate lr, as torch.optim.Adam / AdamW.
void zps_optim_adam(const zps_optim_cfg *cfg, float lr, uint64_t t, float *restrict params,
                    float *restrict exp_avg, float *restrict exp_avg_sq,
                    const float *restrict grad, size_t n);

// The same updates, the new parameters written to out (which must not
// overlap params) and params left as they were: a shard keeps the
// parameters before a step's update and after it in two arrays, and
// needs no copy of them (server/shard/zps_shard.c). The same bits as in place.
void zps_optim_sgd_to(const zps_optim_cfg *cfg, float lr, const float *restrict params,
                      float *restrict out, float *restrict momentum_buf,
                      const float *restrict grad, size_t n);
void zps_optim_adam_to(const zps_optim_cfg *cfg, float lr, uint64_t t,
                       const float *restrict params, float *restrict out,
                       float *restrict exp_avg, float *restrict exp_avg_sq,
                       const float *restrict grad, size_t n);

#endif
