/* zps_dtype.h - element types of tensors on the wire (fp32, bf16, fp16) and
 * the conversions between them and fp32.
 *
 * Workers may push gradients and shards may send parameters in a 16-bit type
 * to halve the bytes on the wire; every sum and every update still runs in
 * fp32. Rounding is round-to-nearest-even with the results of numpy and
 * PyTorch casts, so a run can be checked against a single-process run that
 * casts the same way: bf16 is the top half of an fp32, fp16 is IEEE binary16
 * (subnormals kept, overflow to +-Inf). NaN stays a quiet NaN of the same
 * sign and never rounds into Inf.
 *
 * The scalar conversions are inline and branch-free so that the bulk loops in
 * zps_dtype.c, which call them, vectorize. Wire buffers come straight from
 * ZeroMQ frames and need not be aligned: the bulk functions read and write
 * them byte-wise (memcpy), never through a cast pointer. */
#ifndef ZPS_DTYPE_H
#define ZPS_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "zps_err.h"

// Same numbers as proto/zps.proto's DType, so a header's field converts by a cast.
typedef enum zps_dtype {
    ZPS_DTYPE_F32 = 1,  // IEEE binary32
    ZPS_DTYPE_BF16 = 2, // bfloat16: sign, 8-bit exponent, 7-bit mantissa
    ZPS_DTYPE_F16 = 3,  // IEEE binary16: sign, 5-bit exponent, 10-bit mantissa
} zps_dtype;

// Bytes per element: 4, 2, 2; 0 for anything else (e.g. a wire value not checked yet).
size_t zps_dtype_size(zps_dtype d);

// Whether d (as it came off the wire) names an element type.
bool zps_dtype_valid(int d);

// Parses "fp32" | "bf16" | "fp16" (a config or command-line value); logs and
// returns ZPS_EINVAL on anything else, leaving *out untouched.
zps_err zps_dtype_parse(const char *text, zps_dtype *out);

// "fp32", "bf16", "fp16" (the names zps_dtype_parse takes); "invalid" otherwise.
const char *zps_dtype_name(zps_dtype d);

// ---------------------------------------------------------------- scalar conversions

static inline uint32_t zps_f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float zps_f32_from_bits(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

// fp32 -> bf16, round to nearest even. Adding 0x7fff plus the lowest kept bit
// carries into the kept half exactly when the dropped half is above the
// midpoint, or at it with an odd kept half; a carry out of the mantissa bumps
// the exponent, which is also how the largest finite values round to Inf.
// NaN is kept apart so that a payload in the low bits cannot carry it into
// Inf (or drop it to Inf by truncation); the quiet bit makes it a quiet NaN.
static inline uint16_t zps_bf16_from_f32(float x)
{
    uint32_t u = zps_f32_bits(x);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x0040u;
    bool is_nan = (u & 0x7fffffffu) > 0x7f800000u;
    return (uint16_t)(is_nan ? nan : rounded);
}

// bf16 -> fp32 is exact: the bits become the top half.
static inline float zps_bf16_to_f32(uint16_t h)
{
    return zps_f32_from_bits((uint32_t)h << 16);
}

// fp32 -> fp16, round to nearest even. The three ranges are computed without
// branches and selected, so that a loop over this vectorizes.
static inline uint16_t zps_f16_from_f32(float x)
{
    uint32_t u = zps_f32_bits(x);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu; // |x|

    // Normal fp16 (|x| >= 2^-14): rebias the exponent (127 -> 15) and drop
    // 13 mantissa bits with the same carry trick as bf16; a carry out of the
    // mantissa lands in the exponent, as rounding up to the next binade should.
    uint32_t rebiased = a - (112u << 23);
    uint32_t normal = (rebiased + 0x0fffu + ((rebiased >> 13) & 1u)) >> 13;

    // Subnormal fp16 (|x| < 2^-14): the result counts units of 2^-24, i.e.
    // the full significand shifted right by 126 - exponent. Shifts past 25
    // leave less than half a unit (zero); capping keeps them defined. A
    // round-up from the largest subnormal gives 0x0400, the smallest normal.
    // The clamp to [14, 25] also keeps the shifts defined (below 32, and
    // halfway's above 0) in lanes where the normal result is the one used.
    uint32_t exp = a >> 23;
    uint32_t shift = exp > 112u ? 14u : 126u - exp;
    shift = exp < 101u ? 25u : shift;
    uint32_t sig = (a & 0x007fffffu) | 0x00800000u;
    uint32_t kept = sig >> shift;
    uint32_t dropped = sig & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1u);
    uint32_t up = (dropped > halfway) | ((dropped == halfway) & kept);
    uint32_t subnormal = kept + up;

    // 65520 = 65504 + half an ulp, and 65504's mantissa is odd: ties and
    // anything above round to Inf.
    uint32_t inf = 0x7c00u;
    uint32_t nan = 0x7e00u | ((a >> 13) & 0x03ffu);

    uint32_t h = a < 0x38800000u ? subnormal : normal;
    h = a >= 0x477ff000u ? inf : h;
    h = a > 0x7f800000u ? nan : h;
    return (uint16_t)(sign | h);
}

// fp16 -> fp32 is exact. A subnormal (mant * 2^-24) is normalized in
// integers: its leading bit is found by comparisons rather than a float
// multiply, because GCC (with the default -ftrapping-math) will not execute
// a float operation that only one side of a select needs, and so would not
// vectorize the loop. A NaN is made quiet, as the F16C instruction and
// PyTorch do.
static inline float zps_f16_to_f32(uint16_t h)
{
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t exp = ((uint32_t)h >> 10) & 0x1fu;
    uint32_t mant = (uint32_t)h & 0x03ffu;

    uint32_t normal = (((uint32_t)h & 0x7fffu) << 13) + (112u << 23);

    // lead: the position of mant's leading bit (0..9), so the value is
    // 1.xxx * 2^(lead - 24): biased exponent lead + 103.
    uint32_t lead = (mant >= 0x002u) + (mant >= 0x004u) + (mant >= 0x008u) + (mant >= 0x010u) +
                    (mant >= 0x020u) + (mant >= 0x040u) + (mant >= 0x080u) + (mant >= 0x100u) +
                    (mant >= 0x200u);
    uint32_t subnormal = ((lead + 103u) << 23) | ((mant << (23u - lead)) & 0x007fffffu);
    subnormal = mant == 0 ? 0u : subnormal;

    uint32_t special = 0x7f800000u | (mant << 13) | (mant != 0 ? 0x00400000u : 0u);

    uint32_t a = exp == 0 ? subnormal : normal;
    a = exp == 0x1fu ? special : a;
    return zps_f32_from_bits(sign | a);
}

// ---------------------------------------------------------------- bulk conversions

// The bulk functions take a valid dtype (check wire values with
// zps_dtype_valid first; anything else is a bug and aborts). src and dst
// must not overlap; either may be unaligned. For ZPS_DTYPE_F32 they copy.

// n fp32 values of src to dtype d in dst (n * zps_dtype_size(d) bytes).
void zps_dtype_from_f32(zps_dtype d, const float *src, void *dst, size_t n);

// n elements of dtype d in src to fp32 in dst.
void zps_dtype_to_f32(zps_dtype d, const void *src, float *dst, size_t n);

// The shard's accumulate: dst[i] += scale * (float)src[i] for n elements of
// dtype d in src; dst is an aligned fp32 array. The product is rounded to
// fp32 before the add (never fused), so every machine gives the same bits.
void zps_dtype_axpy(zps_dtype d, float scale, const void *src, float *dst, size_t n);

#endif
