/* zps_rng.h - a small deterministic random generator (splitmix64).
 *
 * zps's promise rests on every process drawing the same numbers from the
 * same seed (init, permutation, synthetic data), on every machine and libc:
 * so no rand(), only this. */
#ifndef ZPS_RNG_H
#define ZPS_RNG_H

#include <math.h>
#include <stdint.h>

typedef struct zps_rng {
    uint64_t state; // advanced by every draw
} zps_rng;

// Seeds a stream from a seed and a stream id, so streams do not overlap.
static inline void zps_rng_seed(zps_rng *r, uint64_t seed, uint64_t stream)
{
    r->state = seed * 0x9E3779B97F4A7C15ull ^ (stream + 0x632BE59BD9B4E019ull);
}

static inline uint64_t zps_rng_next(zps_rng *r)
{
    uint64_t z = (r->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Uniform in [0, 1) with 53 random bits.
static inline double zps_rng_uniform(zps_rng *r)
{
    return (double)(zps_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

// Uniform integer in [0, n), n > 0; the modulo bias is below 2^-32 for n < 2^32.
static inline uint64_t zps_rng_below(zps_rng *r, uint64_t n)
{
    return zps_rng_next(r) % n;
}

// Standard normal (Box-Muller, one value per call).
static inline double zps_rng_normal(zps_rng *r)
{
    double u1 = 1.0 - zps_rng_uniform(r); // (0, 1]: log stays finite
    double u2 = zps_rng_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif
