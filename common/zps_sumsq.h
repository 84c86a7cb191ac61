/* zps_sumsq.h - an exact sum of squares of floats, for the global gradient
 * norm of --clip-grad-norm (docs/optimizers.md).
 *
 * The square of a float is exact in 48 bits of mantissa, and every square
 * lies in [2^-298, 2^256): a fixed-point integer whose lowest bit is 2^-298
 * holds any of them exactly, and a sum of them too (a Kulisch accumulator).
 * ZPS_SUMSQ_LIMBS 64-bit limbs leave 640 - 554 = 86 bits of headroom, more
 * than any count of terms can use. Integer addition is associative, so the
 * sum has the same bits whatever the order of the terms and wherever an
 * array is cut: the shards each sum their range, the coordinator adds the
 * shards' sums (zps_sumsq_merge), and the norm is the same bits for 1, 2 or
 * 3 shards. Infinities and NaNs are counted apart (flags) and decide the
 * result: a NaN term makes it NaN, an infinite one (and no NaN) infinite. */
#ifndef ZPS_SUMSQ_H
#define ZPS_SUMSQ_H

#include <stddef.h>
#include <stdint.h>

#define ZPS_SUMSQ_LIMBS 10    // 640 bits, lowest bit 2^-298
#define ZPS_SUMSQ_INF 1u      // flags: an infinite term was added
#define ZPS_SUMSQ_NAN 2u      // flags: a NaN term was added

typedef struct zps_sumsq {
    uint64_t limb[ZPS_SUMSQ_LIMBS]; // the sum, least significant limb first
    uint32_t flags;                 // ZPS_SUMSQ_INF | ZPS_SUMSQ_NAN
} zps_sumsq;

// zps_sumsq_init: the empty sum (zeroed memory is one too).
void zps_sumsq_init(zps_sumsq *s);
// zps_sumsq_add adds x[i]^2 for i < n, exactly.
void zps_sumsq_add(zps_sumsq *s, const float *x, size_t n);
// zps_sumsq_merge adds the sum `from` to `into`, exactly.
void zps_sumsq_merge(zps_sumsq *into, const zps_sumsq *from);
// zps_sumsq_value: the sum as a double (NaN, +inf per the flags), converted
// once and deterministically, highest limb first: the same bits for the
// same sum.
double zps_sumsq_value(const zps_sumsq *s);
// zps_sumsq_norm: the 2-norm, (float)sqrt(zps_sumsq_value(s)).
float zps_sumsq_norm(const zps_sumsq *s);
// zps_sumsq_clip_coef: torch.nn.utils.clip_grad_norm_'s coefficient in
// float32, max_norm / (norm + 1e-6) clamped to at most 1 (NaN stays NaN).
float zps_sumsq_clip_coef(float max_norm, float norm);

#endif
