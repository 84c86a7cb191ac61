/* zps_sampler.h - the global-batch sampler of DESIGN.md.
 *
 * Epoch e is one permutation of the train set, seeded by (seed, e); step t
 * is the (t mod S)-th run of B indices of epoch t / S, S = floor(N / B) (the
 * last partial batch is dropped). A worker's slice [offset, offset + count)
 * of that global batch is what it trains on, so a single process with batch
 * B sees exactly the samples that W workers see together. */
#ifndef ZPS_SAMPLER_H
#define ZPS_SAMPLER_H

#include <stdint.h>

#include "common/zps_err.h"

typedef struct zps_sampler {
    uint64_t seed;            // job seed
    uint32_t n;               // train records
    uint32_t batch;           // global batch B
    uint64_t steps_per_epoch; // floor(n / batch)
    uint64_t cached_epoch;    // epoch whose permutation is in perm, or UINT64_MAX
    uint32_t *perm;           // owned: permutation of [0, n) for cached_epoch
} zps_sampler;

// ZPS_EINVAL (logged) if batch is 0 or larger than n.
zps_err zps_sampler_init(zps_sampler *s, uint64_t seed, uint32_t n, uint32_t batch);
// Safe on zeroed memory.
void zps_sampler_fini(zps_sampler *s);

static inline uint64_t zps_sampler_epoch(const zps_sampler *s, uint64_t step)
{
    return step / s->steps_per_epoch;
}

// Indices of [offset, offset + count) of step's global batch: a borrowed
// view, valid until the sampler is asked for a step of another epoch.
// NULL (logged) if offset + count exceeds the global batch or memory runs out.
const uint32_t *zps_sampler_slice(zps_sampler *s, uint64_t step, uint32_t offset, uint32_t count);

#endif
