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

// Parses "fp32" | "bf16" | "fp16" (a config or command-line value); returns
// ZPS_EINVAL, unlogged (the flag table says it), on anything else, leaving
// *out untouched.
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

// The fp16 conversions below select with masks built by arithmetic, not
// with ?: or comparisons: GCC turns a ?: into a branch, moves the float
// operation into one side of it, and then (under the default
// -ftrapping-math) will not make it branch-free again, so the loop would not
// vectorize. Their float operations are exact, or rounded once by the FPU
// in the default rounding mode (round to nearest even; zps never changes
// it), and never see or make a subnormal fp32 for an input that is a normal
// fp32 (those are slow on some CPUs).

// fp32 -> fp16, round to nearest even. Adding c = 2^(E+13) to |x| (where
// 2^E <= |x| < 2^(E+1), and E is at least -14) leaves the sum with exactly
// fp16's precision at |x|'s binade: the FPU rounds |x| to the nearest fp16
// step, and the low bits of the sum count the steps (1024 + mantissa, or
// 2048 when the rounding carried into the next binade, which the exponent
// arithmetic turns into the right exponent). Below 2^-14 the step is the
// subnormal unit 2^-24 (E is held at -14), and the count is the subnormal.
// From 65520 up (65504 plus half a step, a tie going to even 2^16) the
// result is Inf; NaN keeps its sign and top payload bits and is made quiet.
static inline uint16_t zps_f16_from_f32(float x)
{
    uint32_t u = zps_f32_bits(x);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu; // |x|

    // Biased fp32 exponent, held to [113, 142] (2^-14 .. 2^15); outside it
    // the result is a subnormal, or overridden below.
    uint32_t e = a >> 23;
    e = e < 113u ? 113u : e;
    e = e > 142u ? 142u : e;
    float c = zps_f32_from_bits((e + 13u) << 23);
    float sum = zps_f32_from_bits(a) + c;
    uint32_t h = ((e - 113u) << 10) + (zps_f32_bits(sum) - zps_f32_bits(c));

    uint32_t inf = ((a - 0x477ff000u) >> 31) - 1u;         // all ones if a >= 65520
    uint32_t nan = 0u - ((0x7f800000u - a) >> 31);         // all ones if a > Inf
    uint32_t nan_bits = 0x7e00u | ((a >> 13) & 0x03ffu);
    h = (h & ~inf) | (inf & 0x7c00u);
    h = (h & ~nan) | (nan & nan_bits);
    return (uint16_t)(sign | h);
}

// fp16 -> fp32 is exact: the value is sig * 2^(max(exp, 1) - 25), with sig
// the mantissa plus the implicit bit of a normal number, and both the
// conversion of sig and the product by a power of two are exact. For
// exp = 31 that product is 2^16 * 1.mant, whose exponent bits only need
// filling up to make Inf or (with the quiet bit, as the F16C instruction and
// PyTorch set it) NaN.
static inline float zps_f16_to_f32(uint16_t h)
{
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t exp = ((uint32_t)h >> 10) & 0x1fu;
    uint32_t mant = (uint32_t)h & 0x03ffu;

    uint32_t normal = (exp + 31u) >> 5; // 1 if exp != 0
    uint32_t sig = mant | (normal << 10);
    uint32_t exp1 = exp + 1u - normal;  // max(exp, 1)
    float v = (float)(int32_t)sig * zps_f32_from_bits((exp1 + 102u) << 23);

    uint32_t special = 0u - ((exp + 1u) >> 5);    // all ones if exp == 31
    uint32_t quiet = ((mant + 0x03ffu) >> 10) << 22; // the quiet bit if mant != 0
    uint32_t a = zps_f32_bits(v) | (special & (0x7f800000u | quiet));
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

// The shard's accumulate: dst[i] += scale * src[i] for n elements of dtype
// d in src, in double. A float times a sample count is exact in double, and
// sums of a few such terms almost always are too: the result does not
// depend on the order in which pushes arrive, so runs are reproducible and
// the same whatever the number of workers. Never fused into an FMA, so
// every machine gives the same bits.
void zps_dtype_axpy(zps_dtype d, float scale, const void *src, double *dst, size_t n);

// The first push of a bucket: dst[i] = 0.0 + scale * src[i], the bits
// zps_dtype_axpy leaves in a zeroed dst (the sum with +0.0 included, which
// turns a -0.0 product into +0.0), so the accumulator needs no zeroing
// between steps and is written without being read.
void zps_dtype_axpy_set(zps_dtype d, float scale, const void *src, double *dst, size_t n);

// The push that completes a bucket, and the average, in one pass:
// out[i] = (float)((acc[i] + scale * src[i]) / (double)total), acc NULL
// standing for a zeroed one (0.0 + ...), total the batch's samples (> 0).
// The bits of zps_dtype_axpy into acc followed by that division (where a
// cheaper operation gives the same bits it is used: zps_dtype.c says
// when); the accumulator is only read.
void zps_dtype_axpy_mean(zps_dtype d, float scale, const void *src, const double *acc,
                         uint32_t total, float *out, size_t n);

// A bucket's first two pushes in one pass, (scale1, src1) the earlier:
// dst[i] = (0.0 + scale1 * src1[i]) + scale2 * src2[i], the bits of
// zps_dtype_axpy_set of the first followed by zps_dtype_axpy of the second.
void zps_dtype_axpy2_set(zps_dtype d, float scale1, const void *src1, float scale2,
                         const void *src2, double *dst, size_t n);

// The same two when the second completes the bucket: out[i] is
// zps_dtype_axpy_mean's of the second over an accumulator that holds the
// first, with no accumulator written or read.
void zps_dtype_axpy2_mean(zps_dtype d, float scale1, const void *src1, float scale2,
                          const void *src2, uint32_t total, float *out, size_t n);

#endif
