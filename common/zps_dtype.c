/* zps_dtype.c - names of the element types and the bulk conversions.
 *
 * The bulk loops run over every gradient a shard receives, so they must
 * vectorize. They are plain C loops over the inline scalar conversions of
 * zps_dtype.h; on x86-64 with GCC or Clang and glibc each public function is
 * also compiled for AVX-512 and AVX2 (target_clones), and the loader picks
 * the best one the CPU has (ifunc). No -march flag is needed, so one binary
 * runs on every x86-64 machine, and other platforms build the plain loops.
 *
 * Every clone gives the same bits: the conversions are integer code and
 * single IEEE operations (exact, or rounded once), and the product and the
 * sum of axpy are rounded separately (never fused into an FMA, which the
 * AVX-512 clone could otherwise use), so a shard's result does not depend on
 * the CPU it runs on. */
#include "zps_dtype.h"

#include <string.h>

#include "zps_log.h"

#if defined(__x86_64__) && defined(__GNUC__) && defined(__GLIBC__)
// glibc provides ifunc, which target_clones needs; __GLIBC__ is known here
// because <string.h> is included above.
#define ZPS_DTYPE_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ZPS_DTYPE_CLONES
#endif

#if defined(__GNUC__) && !defined(__clang__) && !defined(__STRICT_ANSI__)
// GNU C mode (-std=gnu11) lets GCC fuse axpy's multiply and add into an FMA
// in the AVX-512 clone only (AVX-512F has FMA), so results would depend on
// the CPU. The tests catch it on such a CPU; this catches it at build time.
#error "build zps_dtype.c in ISO C mode (-std=c11), where GCC does not contract a * b + c"
#endif

#ifdef __clang__
// Clang contracts a * b + c within one expression by default; GCC does not
// in ISO C mode (-std=c11) and knows no such pragma (-Wunknown-pragmas).
#pragma STDC FP_CONTRACT OFF
#endif

// ---------------------------------------------------------------- names

size_t zps_dtype_size(zps_dtype d)
{
    switch (d) {
    case ZPS_DTYPE_F32:
        return 4;
    case ZPS_DTYPE_BF16:
    case ZPS_DTYPE_F16:
        return 2;
    }
    return 0;
}

bool zps_dtype_valid(int d)
{
    return d == ZPS_DTYPE_F32 || d == ZPS_DTYPE_BF16 || d == ZPS_DTYPE_F16;
}

zps_err zps_dtype_parse(const char *text, zps_dtype *out)
{
    static const zps_dtype all[] = {ZPS_DTYPE_F32, ZPS_DTYPE_BF16, ZPS_DTYPE_F16};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (strcmp(text, zps_dtype_name(all[i])) == 0) {
            *out = all[i];
            return ZPS_OK;
        }
    }
    return ZPS_EINVAL;
}

const char *zps_dtype_name(zps_dtype d)
{
    switch (d) {
    case ZPS_DTYPE_F32:
        return "fp32";
    case ZPS_DTYPE_BF16:
        return "bf16";
    case ZPS_DTYPE_F16:
        return "fp16";
    }
    return "invalid";
}

// ---------------------------------------------------------------- bulk loops
//
// Each loop is written out inside its cloned function rather than in a
// helper: a helper the compiler chose not to inline would be built for the
// default target only, and the clone calling it would lose its vector width.
// The cloned functions are static and wrapped by the public ones because
// Clang 14 gives a cloned function no symbol under its plain name, so other
// files could not link to it; the wrapper costs one call per tensor.
// Loads and stores of the byte pointers go through memcpy (one plain,
// possibly unaligned, vector access once compiled).

ZPS_DTYPE_CLONES
static void s_dtype_from_f32(zps_dtype d, const float *src, void *dst, size_t n)
{
    const unsigned char *s = (const unsigned char *)src;
    unsigned char *o = (unsigned char *)dst;
    switch (d) {
    case ZPS_DTYPE_F32:
        memcpy(o, s, n * sizeof(float));
        return;
    case ZPS_DTYPE_BF16:
        for (size_t i = 0; i < n; i++) {
            float x;
            memcpy(&x, s + i * 4, 4);
            uint16_t h = zps_bf16_from_f32(x);
            memcpy(o + i * 2, &h, 2);
        }
        return;
    case ZPS_DTYPE_F16:
        for (size_t i = 0; i < n; i++) {
            float x;
            memcpy(&x, s + i * 4, 4);
            uint16_t h = zps_f16_from_f32(x);
            memcpy(o + i * 2, &h, 2);
        }
        return;
    }
    ZPS_ASSERT(!"from_f32: invalid dtype");
}

ZPS_DTYPE_CLONES
static void s_dtype_to_f32(zps_dtype d, const void *src, float *dst, size_t n)
{
    const unsigned char *s = (const unsigned char *)src;
    unsigned char *o = (unsigned char *)dst;
    switch (d) {
    case ZPS_DTYPE_F32:
        memcpy(o, s, n * sizeof(float));
        return;
    case ZPS_DTYPE_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + i * 2, 2);
            float x = zps_bf16_to_f32(h);
            memcpy(o + i * 4, &x, 4);
        }
        return;
    case ZPS_DTYPE_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + i * 2, 2);
            float x = zps_f16_to_f32(h);
            memcpy(o + i * 4, &x, 4);
        }
        return;
    }
    ZPS_ASSERT(!"to_f32: invalid dtype");
}

ZPS_DTYPE_CLONES
static void s_dtype_axpy(zps_dtype d, float scale, const void *src, double *restrict dst, size_t n)
{
    const unsigned char *s = (const unsigned char *)src;
    const double k = scale;
    switch (d) {
    case ZPS_DTYPE_F32:
        for (size_t i = 0; i < n; i++) {
            float x;
            memcpy(&x, s + i * 4, 4);
            dst[i] += k * (double)x;
        }
        return;
    case ZPS_DTYPE_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + i * 2, 2);
            dst[i] += k * (double)zps_bf16_to_f32(h);
        }
        return;
    case ZPS_DTYPE_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + i * 2, 2);
            dst[i] += k * (double)zps_f16_to_f32(h);
        }
        return;
    }
    ZPS_ASSERT(!"axpy: invalid dtype");
}

ZPS_DTYPE_CLONES
static void s_dtype_axpy_set(zps_dtype d, float scale, const void *src, double *restrict dst,
                             size_t n)
{
    const unsigned char *s = (const unsigned char *)src;
    const double k = scale;
    switch (d) {
    case ZPS_DTYPE_F32:
        for (size_t i = 0; i < n; i++) {
            float x;
            memcpy(&x, s + i * 4, 4);
            dst[i] = 0.0 + k * (double)x;
        }
        return;
    case ZPS_DTYPE_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + i * 2, 2);
            dst[i] = 0.0 + k * (double)zps_bf16_to_f32(h);
        }
        return;
    case ZPS_DTYPE_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + i * 2, 2);
            dst[i] = 0.0 + k * (double)zps_f16_to_f32(h);
        }
        return;
    }
    ZPS_ASSERT(!"axpy_set: invalid dtype");
}

// Element i of src in dtype D. Always inlined into the cloned loops below,
// each of which passes a constant D, so that the selection folds away and
// every loop vectorizes at its clone's width.
__attribute__((always_inline)) static inline float s_elem(zps_dtype D, const unsigned char *s,
                                                          size_t i)
{
    if (D == ZPS_DTYPE_F32) {
        float x;
        memcpy(&x, s + i * 4, 4);
        return x;
    }
    uint16_t h;
    memcpy(&h, s + i * 2, 2);
    return D == ZPS_DTYPE_BF16 ? zps_bf16_to_f32(h) : zps_f16_to_f32(h);
}

#define S_LOOP(D, EXPR)                         \
    for (size_t i = 0; i < n; i++) {            \
        float x = s_elem((D), s, i);            \
        out[i] = (EXPR);                        \
    }

// The five ways of zps_dtype_axpy_mean (zps_dtype.h), each the same bits
// as (float)((acc[i] + k * x) / total), acc[i] being 0.0 without one:
// - only push, k == total: k * x is exact in double (24 by at most 24
//   significant bits), 0.0 + turns -0.0 into +0.0 and changes nothing
//   else, and the exact quotient (k * x) / k is x itself, which the casts
//   keep; a NaN comes out quiet with its sign and payload. That is x + 0.0f.
// - total a power of two: 1 / total is exact, so the product by it is the
//   exact quotient rounded once, as the division rounds it (subnormals
//   included): a multiplication instead of a division, several times as fast.
// - otherwise the division itself.
#define S_MEAN(D)                                                                   \
    if (!acc && same) {                                                             \
        S_LOOP(D, x + 0.0f)                                                         \
    } else if (!acc && pow2) {                                                      \
        S_LOOP(D, (float)((0.0 + k * (double)x) * inv))                             \
    } else if (!acc) {                                                              \
        S_LOOP(D, (float)((0.0 + k * (double)x) / t))                               \
    } else if (pow2) {                                                              \
        S_LOOP(D, (float)((acc[i] + k * (double)x) * inv))                          \
    } else {                                                                        \
        S_LOOP(D, (float)((acc[i] + k * (double)x) / t))                            \
    }

ZPS_DTYPE_CLONES
static void s_dtype_axpy_mean(zps_dtype d, float scale, const void *src,
                              const double *restrict acc, uint32_t total, float *restrict out,
                              size_t n)
{
    const unsigned char *s = (const unsigned char *)src;
    const double k = scale, t = (double)total, inv = 1.0 / t;
    const bool same = k == t;
    const bool pow2 = total != 0 && (total & (total - 1)) == 0;
    switch (d) {
    case ZPS_DTYPE_F32:
        S_MEAN(ZPS_DTYPE_F32)
        return;
    case ZPS_DTYPE_BF16:
        S_MEAN(ZPS_DTYPE_BF16)
        return;
    case ZPS_DTYPE_F16:
        S_MEAN(ZPS_DTYPE_F16)
        return;
    }
    ZPS_ASSERT(!"axpy_mean: invalid dtype");
}

#undef S_MEAN

// Two pushes at once, the earlier one first: the bits of zps_dtype_axpy_set
// of (k1, s1) followed by zps_dtype_axpy (or zps_dtype_axpy_mean) of
// (k2, s2), with no accumulator between them.
#define S_LOOP2(D, EXPR)                        \
    for (size_t i = 0; i < n; i++) {            \
        double a = 0.0 + k1 * (double)s_elem((D), s1, i); \
        float x = s_elem((D), s2, i);           \
        out[i] = (EXPR);                        \
    }

#define S_SET2(D) S_LOOP2(D, a + k2 * (double)x)

ZPS_DTYPE_CLONES
static void s_dtype_axpy2_set(zps_dtype d, float scale1, const void *src1, float scale2,
                              const void *src2, double *restrict out, size_t n)
{
    const unsigned char *s1 = (const unsigned char *)src1, *s2 = (const unsigned char *)src2;
    const double k1 = scale1, k2 = scale2;
    switch (d) {
    case ZPS_DTYPE_F32:
        S_SET2(ZPS_DTYPE_F32)
        return;
    case ZPS_DTYPE_BF16:
        S_SET2(ZPS_DTYPE_BF16)
        return;
    case ZPS_DTYPE_F16:
        S_SET2(ZPS_DTYPE_F16)
        return;
    }
    ZPS_ASSERT(!"axpy2_set: invalid dtype");
}

// As S_MEAN with an accumulator, the division by a power of two a product.
#define S_MEAN2(D)                                          \
    if (pow2) {                                             \
        S_LOOP2(D, (float)((a + k2 * (double)x) * inv))     \
    } else {                                                \
        S_LOOP2(D, (float)((a + k2 * (double)x) / t))       \
    }

ZPS_DTYPE_CLONES
static void s_dtype_axpy2_mean(zps_dtype d, float scale1, const void *src1, float scale2,
                               const void *src2, uint32_t total, float *restrict out, size_t n)
{
    const unsigned char *s1 = (const unsigned char *)src1, *s2 = (const unsigned char *)src2;
    const double k1 = scale1, k2 = scale2, t = (double)total, inv = 1.0 / t;
    const bool pow2 = total != 0 && (total & (total - 1)) == 0;
    switch (d) {
    case ZPS_DTYPE_F32:
        S_MEAN2(ZPS_DTYPE_F32)
        return;
    case ZPS_DTYPE_BF16:
        S_MEAN2(ZPS_DTYPE_BF16)
        return;
    case ZPS_DTYPE_F16:
        S_MEAN2(ZPS_DTYPE_F16)
        return;
    }
    ZPS_ASSERT(!"axpy2_mean: invalid dtype");
}

#undef S_MEAN2
#undef S_SET2
#undef S_LOOP2
#undef S_LOOP

// ---------------------------------------------------------------- public entry points

void zps_dtype_from_f32(zps_dtype d, const float *src, void *dst, size_t n)
{
    s_dtype_from_f32(d, src, dst, n);
}

void zps_dtype_to_f32(zps_dtype d, const void *src, float *dst, size_t n)
{
    s_dtype_to_f32(d, src, dst, n);
}

void zps_dtype_axpy(zps_dtype d, float scale, const void *src, double *dst, size_t n)
{
    s_dtype_axpy(d, scale, src, dst, n);
}

void zps_dtype_axpy_set(zps_dtype d, float scale, const void *src, double *dst, size_t n)
{
    s_dtype_axpy_set(d, scale, src, dst, n);
}

void zps_dtype_axpy_mean(zps_dtype d, float scale, const void *src, const double *acc,
                         uint32_t total, float *out, size_t n)
{
    s_dtype_axpy_mean(d, scale, src, acc, total, out, n);
}

void zps_dtype_axpy2_set(zps_dtype d, float scale1, const void *src1, float scale2,
                         const void *src2, double *dst, size_t n)
{
    s_dtype_axpy2_set(d, scale1, src1, scale2, src2, dst, n);
}

void zps_dtype_axpy2_mean(zps_dtype d, float scale1, const void *src1, float scale2,
                          const void *src2, uint32_t total, float *out, size_t n)
{
    s_dtype_axpy2_mean(d, scale1, src1, scale2, src2, total, out, n);
}
