/* zps_sumsq.c - an exact sum of squares of floats (zps_sumsq.h). */
#include "zps_sumsq.h"

#include <math.h>
#include <string.h>

#define S_BINS 256          // one per biased float exponent (255: inf and NaN, kept apart)
#define S_BIN_ADDS 65536    // squares of < 2^48 a bin takes before it is flushed (< 2^64)

void zps_sumsq_init(zps_sumsq *s)
{
    memset(s, 0, sizeof *s);
}

// limb[] += v << shift (shift < 64 * ZPS_SUMSQ_LIMBS - 64), carries included.
static void s_add_shifted(zps_sumsq *s, uint64_t v, unsigned shift)
{
    unsigned i = shift / 64, bit = shift % 64;
    uint64_t lo = v << bit, hi = bit ? v >> (64 - bit) : 0;
    uint64_t before = s->limb[i];
    s->limb[i] += lo;
    uint64_t carry = (s->limb[i] < before) + hi;
    for (i++; carry && i < ZPS_SUMSQ_LIMBS; i++) {
        before = s->limb[i];
        s->limb[i] += carry;
        carry = s->limb[i] < before;
    }
}

// Bin e holds a sum of m^2 (m the 24-bit significand) of floats of biased
// exponent e, each m^2 * 2^(2 * (e - 150)) (e >= 1) or m^2 * 2^-298 (e = 0,
// subnormals: m * 2^-149): added into the limbs at bit 2e - 2 (e >= 1) or 0.
static void s_flush(zps_sumsq *s, uint64_t *bins)
{
    for (unsigned e = 0; e < 255; e++) {
        if (bins[e] == 0) {
            continue;
        }
        // A sum of up to 2^16 values below 2^48: below 2^64, which may
        // straddle two limbs; shift < 2 * 254 - 2 = 506 < 576.
        s_add_shifted(s, bins[e], e ? 2 * e - 2 : 0);
        bins[e] = 0;
    }
}

void zps_sumsq_add(zps_sumsq *s, const float *x, size_t n)
{
    uint64_t bins[S_BINS] = {0};
    size_t since = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &x[i], sizeof bits);
        uint32_t e = (bits >> 23) & 0xffu, f = bits & 0x7fffffu;
        if (e == 255) {
            s->flags |= f ? ZPS_SUMSQ_NAN : ZPS_SUMSQ_INF;
            continue;
        }
        uint64_t m = e ? (f | 0x800000u) : f;
        bins[e] += m * m;
        if (++since == S_BIN_ADDS) {
            s_flush(s, bins);
            since = 0;
        }
    }
    s_flush(s, bins);
}

void zps_sumsq_merge(zps_sumsq *into, const zps_sumsq *from)
{
    uint64_t carry = 0;
    for (int i = 0; i < ZPS_SUMSQ_LIMBS; i++) {
        uint64_t a = into->limb[i], sum = a + from->limb[i];
        uint64_t c1 = sum < a;
        uint64_t out = sum + carry;
        carry = c1 + (out < sum);
        into->limb[i] = out;
    }
    into->flags |= from->flags;
}

double zps_sumsq_value(const zps_sumsq *s)
{
    if (s->flags & ZPS_SUMSQ_NAN) {
        return NAN;
    }
    if (s->flags & ZPS_SUMSQ_INF) {
        return INFINITY;
    }
    // Horner from the top: below 2^640 all along, so no step overflows;
    // each rounds the same way for the same limbs.
    double d = 0.0;
    for (int i = ZPS_SUMSQ_LIMBS - 1; i >= 0; i--) {
        d = d * 18446744073709551616.0 + (double)s->limb[i];
    }
    return ldexp(d, -298);
}

float zps_sumsq_norm(const zps_sumsq *s)
{
    return (float)sqrt(zps_sumsq_value(s));
}

float zps_sumsq_clip_coef(float max_norm, float norm)
{
    float coef = max_norm / (norm + 1e-6f);
    return coef > 1.0f ? 1.0f : coef; // a NaN stays NaN, as torch.clamp leaves it
}
