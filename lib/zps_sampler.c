/* zps_sampler.c - the global-batch sampler: one permutation per epoch.
 *
 * Every member of a job, and a single process training alone, computes the
 * same permutation from (seed, epoch), so the plan only has to name offsets
 * into the global batch, never lists of indices. */
#include "zps_sampler.h"

#include <stdlib.h>

#include "common/zps_log.h"
#include "common/zps_rng.h"

// Epoch streams carry a tag in the high 16 bits, so no epoch's stream is the
// model init stream (1) or one of the synthetic dataset's.
#define STREAM_EPOCH(e) ((0x5A3Dull << 48) ^ (uint64_t)(e))

zps_err zps_sampler_init(zps_sampler *s, uint64_t seed, uint32_t n, uint32_t batch)
{
    s->seed = seed;
    s->n = n;
    s->batch = batch;
    s->steps_per_epoch = 0;
    s->cached_epoch = UINT64_MAX;
    s->perm = NULL;
    if (batch == 0 || batch > n) {
        zps_log_error("sampler: global batch %u must be in 1..%u (the train set)", batch, n);
        return ZPS_EINVAL;
    }
    s->steps_per_epoch = n / batch;
    return ZPS_OK;
}

void zps_sampler_fini(zps_sampler *s)
{
    free(s->perm);
    s->perm = NULL;
    s->cached_epoch = UINT64_MAX;
}

// Fisher-Yates over [0, n), drawing j for i = n-1 down to 1: the order of
// draws is part of the contract, since every process must agree on it.
static void s_permute(uint32_t *perm, uint32_t n, uint64_t seed, uint64_t epoch)
{
    for (uint32_t i = 0; i < n; i++) {
        perm[i] = i;
    }
    zps_rng rng;
    zps_rng_seed(&rng, seed, STREAM_EPOCH(epoch));
    for (uint32_t i = n - 1; i > 0; i--) {
        uint32_t j = (uint32_t)zps_rng_below(&rng, (uint64_t)i + 1);
        uint32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

const uint32_t *zps_sampler_slice(zps_sampler *s, uint64_t step, uint32_t offset, uint32_t count)
{
    if ((uint64_t)offset + count > s->batch) {
        zps_log_error("sampler: slice [%u, %llu) is past the global batch of %u", offset,
                      (unsigned long long)offset + count, s->batch);
        return NULL;
    }
    ZPS_ASSERT(s->steps_per_epoch > 0); // init succeeded
    uint64_t epoch = step / s->steps_per_epoch;
    if (s->perm == NULL) {
        s->perm = malloc((size_t)s->n * sizeof *s->perm);
        if (s->perm == NULL) {
            zps_log_error("sampler: no memory for a permutation of %u records", s->n);
            return NULL;
        }
        s->cached_epoch = UINT64_MAX;
    }
    if (s->cached_epoch != epoch) {
        s_permute(s->perm, s->n, s->seed, epoch);
        s->cached_epoch = epoch;
    }
    uint64_t start = (step % s->steps_per_epoch) * s->batch + offset;
    return s->perm + start;
}
