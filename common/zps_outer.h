/* zps_outer.h - DiLoCo's outer step (--mode diloco), the math alone.
 *
 * A worker trains H inner steps from the parameters of the last outer step,
 * theta_sync, to its own theta_local, and sends the pseudo-gradient
 * delta = theta_sync - theta_local with the samples its inner steps took.
 * A shard averages the deltas of its range by those samples over the
 * workers that arrived, mean = sum(n_i * delta_i) / sum(n_i), and takes one
 * step of SGD with Nesterov momentum on the mean as if it were a gradient:
 * torch.optim.SGD(nesterov=True, momentum=mu, lr=lr, dampening=0,
 * weight_decay=0), in torch's single-tensor float32 order,
 *
 *     buf    = mu * buf + mean      (buf = mean at the first step)
 *     theta -= lr * (mean + mu * buf)
 *
 * The update is zps_optim_sgd's (zps_optim.h already has torch's Nesterov,
 * and a shard already keeps one state float per parameter for it, in its
 * checkpoints too); this module is what the mode puts around it: the
 * outer flags and their defaults, the pseudo-gradient, the weighted mean.
 * With momentum 0 the step is plain SGD, theta -= lr * mean (torch refuses
 * nesterov=True without momentum): lr 1 and momentum 0 make the outer step
 * theta_sync := the sample-weighted mean of the workers' theta_local. */
#ifndef ZPS_OUTER_H
#define ZPS_OUTER_H

#include <stddef.h>

#include "zps_err.h"
#include "zps_model.h"
#include "zps_optim.h"

// The defaults, DiLoCo's (Douillard et al., 2023).
#define ZPS_OUTER_LR 0.7f
#define ZPS_OUTER_MOMENTUM 0.9f

typedef struct zps_outer_cfg {
    float lr;       // --outer-lr, >= 0
    float momentum; // --outer-momentum, in [0, 1); 0: plain SGD, no buffer
} zps_outer_cfg;

#define ZPS_OUTER_INNER_STEPS 10 // --inner-steps' default, and auto's base H

// What --mode diloco makes of a job; all zero: a synchronous job. The
// job's steps are then outer rounds: round r's inner step h (h < H_i, the
// member's own inner steps) trains the member's slice of global batch
// r * H + h, so a run is reproducible from (seed, plan), and a worker with
// fewer inner steps trains the first of the round's batches.
typedef struct zps_outer_mode {
    bool diloco;          // --mode diloco
    uint32_t inner_steps; // H >= 1 (auto: the fastest member's)
    bool auto_steps;      // --inner-steps auto: each member's in proportion to its speed
    int compress;         // a zps_quant_kind for the pushes; 0: fp32
    zps_outer_cfg outer;  // the shards' optimizer
    // --fragments F (0 or 1: none; Streaming DiLoCo): every shard's range
    // is cut into F fragments of equal bytes, and a round of H inner steps
    // is F of the job's steps, step f of a round ending at inner step
    // (f + 1) * H / F (rounded down), after which fragment f alone is
    // exchanged. Each fragment is thus exchanged once per H inner steps,
    // fragment f at inner steps offset by f * H / F, and the network
    // carries one fragment at a time (docs/diloco.md, "Fragments").
    uint32_t fragments;
    // --overlap: a worker does not wait for the parameters of the fragment
    // it pushed; it takes the next step's inner steps, then merges them:
    // the fragment becomes the shards' new values plus what it trained
    // since the push. The delay is one step's inner steps, at most
    // ceil(H / F) (docs/diloco.md, "Overlap").
    bool overlap;
} zps_outer_mode;

#define ZPS_OUTER_MAX_INNER_STEPS (1u << 20) // --inner-steps' bound
#define ZPS_OUTER_MAX_FRAGMENTS 64           // --fragments' bound

// Whether a mode that came from the coordinator is one this build runs:
// H in [1, ZPS_OUTER_MAX_INNER_STEPS], compress 0 or a zps_quant_kind,
// fragments at most ZPS_OUTER_MAX_FRAGMENTS and H.
// ZPS_EINVAL, unlogged, otherwise.
zps_err zps_outer_mode_check(const zps_outer_mode *mode);

// F, at least 1.
static inline uint32_t zps_outer_fragments(const zps_outer_mode *mode)
{
    return mode->fragments > 1 ? mode->fragments : 1;
}

// The first global batch of the job's step t: t * H, or with fragments
// (t / F) * H + (t mod F) * H / F.
static inline uint64_t zps_outer_step_batch(const zps_outer_mode *mode, uint64_t t)
{
    uint64_t f = zps_outer_fragments(mode), h = mode->inner_steps;
    return t / f * h + t % f * h / f;
}

// The global batches of step t: H, or about H / F with fragments.
static inline uint32_t zps_outer_step_batches(const zps_outer_mode *mode, uint64_t t)
{
    return (uint32_t)(zps_outer_step_batch(mode, t + 1) - zps_outer_step_batch(mode, t));
}

// The fragment exchanged at the end of step t.
static inline uint32_t zps_outer_fragment_of_step(const zps_outer_mode *mode, uint64_t t)
{
    return (uint32_t)(t % zps_outer_fragments(mode));
}

// The fragment of element x of the range [lo, hi): f where
// lo + (hi - lo) * f / F <= x < lo + (hi - lo) * (f + 1) / F.
uint32_t zps_outer_fragment_at(const zps_outer_mode *mode, uint64_t lo, uint64_t hi, uint64_t x);

// The buckets in[0..n_in) of the range [lo, hi), cut where a fragment
// ends, into out (at most max; with one fragment, the same buckets).
// Returns how many, or -1 if more than max.
int zps_outer_cut_buckets(const zps_outer_mode *mode, uint64_t lo, uint64_t hi,
                          const zps_bucket *in, int n_in, zps_bucket *out, int max);

// Whether cfg is usable: lr >= 0 and finite, momentum in [0, 1) (torch
// takes any momentum >= 0, but from 1 on the buffer grows without bound).
// ZPS_EINVAL, logged with the flag at fault, otherwise.
zps_err zps_outer_validate(const zps_outer_cfg *cfg);

// The optimizer settings of the outer step: SGD, Nesterov when momentum >
// 0, no weight decay, a constant learning rate.
zps_optim_cfg zps_outer_optim(const zps_outer_cfg *cfg);

// The worker's pseudo-gradient of n elements: delta = sync - local.
void zps_outer_delta(const float *restrict sync, const float *restrict local,
                     float *restrict delta, size_t n);

// acc += weight * delta over n elements, in double: a worker's delta
// counted with its samples (any integer weight below 2^29 makes each
// product exact, so the sum depends only on the order of the workers).
void zps_outer_accumulate(double *restrict acc, double weight, const float *restrict delta,
                          size_t n);

// One outer step of n elements: mean = (float)(acc / total), total the sum
// of the weights accumulated, then the update of cfg into params and
// momentum_buf (zeroed before the first step; unused, and may be NULL,
// with momentum 0).
// acc is left as it is (the caller clears it for the next round).
// ZPS_EINVAL, unlogged and nothing changed, if total is not > 0 (no worker
// arrived: there is no mean) or cfg is not valid.
zps_err zps_outer_step(const zps_outer_cfg *cfg, float *restrict params,
                       float *restrict momentum_buf, const double *restrict acc, double total,
                       size_t n);

#endif
