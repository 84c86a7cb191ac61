/* check_dtype.c - wire element types: hand-picked rounding cases (ties,
 * NaN, Inf, overflow, -0, subnormals), every 16-bit pattern, a reference
 * rounding computed another way (nearest value in double precision), and the
 * bulk functions against the scalar ones on unaligned buffers. */
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_dtype.h"
#include "common/zps_rng.h"
#include "tests/zps_check.h"

// zps_check.h may not list this suite yet; a repeated declaration is harmless.
Suite *zps_suite_dtype(void);

static float s_f(uint32_t bits)
{
    return zps_f32_from_bits(bits);
}

static uint16_t s_bf16(uint32_t bits)
{
    return zps_bf16_from_f32(s_f(bits));
}

static uint16_t s_f16(uint32_t bits)
{
    return zps_f16_from_f32(s_f(bits));
}

static bool s_is_nan16(uint16_t h, int mant_bits)
{
    uint32_t exp_mask = 0x7fffu & ~((1u << mant_bits) - 1u);
    return (h & exp_mask) == exp_mask && (h & ((1u << mant_bits) - 1u)) != 0;
}

// ---------------------------------------------------------------- names

START_TEST(test_dtype_size_name_parse)
{
    zps_dtype d = ZPS_DTYPE_F32;
    ck_assert_uint_eq(zps_dtype_size(ZPS_DTYPE_F32), 4);
    ck_assert_uint_eq(zps_dtype_size(ZPS_DTYPE_BF16), 2);
    ck_assert_uint_eq(zps_dtype_size(ZPS_DTYPE_F16), 2);
    ck_assert_uint_eq(zps_dtype_size((zps_dtype)0), 0);
    ck_assert_uint_eq(zps_dtype_size((zps_dtype)4), 0);
    ck_assert(zps_dtype_valid(1) && zps_dtype_valid(2) && zps_dtype_valid(3));
    ck_assert(!zps_dtype_valid(0) && !zps_dtype_valid(4) && !zps_dtype_valid(-1));
    ck_assert_str_eq(zps_dtype_name(ZPS_DTYPE_F32), "fp32");
    ck_assert_str_eq(zps_dtype_name(ZPS_DTYPE_BF16), "bf16");
    ck_assert_str_eq(zps_dtype_name(ZPS_DTYPE_F16), "fp16");
    ck_assert_str_eq(zps_dtype_name((zps_dtype)9), "invalid");
    ck_assert_int_eq(zps_dtype_parse("bf16", &d), ZPS_OK);
    ck_assert_int_eq(d, ZPS_DTYPE_BF16);
    ck_assert_int_eq(zps_dtype_parse("fp16", &d), ZPS_OK);
    ck_assert_int_eq(d, ZPS_DTYPE_F16);
    ck_assert_int_eq(zps_dtype_parse("fp32", &d), ZPS_OK);
    ck_assert_int_eq(d, ZPS_DTYPE_F32);
    // A refused name leaves the previous value.
    ck_assert_int_eq(zps_dtype_parse("float16", &d), ZPS_EINVAL);
    ck_assert_int_eq(zps_dtype_parse("BF16", &d), ZPS_EINVAL);
    ck_assert_int_eq(zps_dtype_parse("", &d), ZPS_EINVAL);
    ck_assert_int_eq(d, ZPS_DTYPE_F32);
}
END_TEST

// ---------------------------------------------------------------- bf16

START_TEST(test_dtype_bf16_exact_round_trip)
{
    // 1, -2.5, 0.15625, largest finite, smallest normal, smallest and largest subnormal
    const uint16_t pats[] = {0x3f80, 0xc020, 0x3e20, 0x7f7f, 0x0080, 0x0001, 0x007f, 0xff7f};
    for (size_t i = 0; i < sizeof pats / sizeof pats[0]; i++) {
        float x = zps_bf16_to_f32(pats[i]);
        ck_assert_uint_eq(zps_f32_bits(x), (uint32_t)pats[i] << 16);
        ck_assert_uint_eq(zps_bf16_from_f32(x), pats[i]);
    }
    ck_assert_float_eq(zps_bf16_to_f32(0x3f80), 1.0f);
    ck_assert_float_eq(zps_bf16_to_f32(0xc020), -2.5f);
    ck_assert_uint_eq(zps_bf16_from_f32(0.15625f), 0x3e20);
}
END_TEST

START_TEST(test_dtype_bf16_ties_to_even)
{
    ck_assert_uint_eq(s_bf16(0x3f808000), 0x3f80); // tie, even below
    ck_assert_uint_eq(s_bf16(0x3f818000), 0x3f82); // tie, odd below: up
    ck_assert_uint_eq(s_bf16(0x3f808001), 0x3f81); // above the tie
    ck_assert_uint_eq(s_bf16(0x3f807fff), 0x3f80); // below the tie
    ck_assert_uint_eq(s_bf16(0xbf808000), 0xbf80); // negative: same magnitude rules
    ck_assert_uint_eq(s_bf16(0xbf818000), 0xbf82);
    ck_assert_uint_eq(s_bf16(0x3f7f8000), 0x3f80); // carry into the exponent: 0.998.. -> 1
    ck_assert_uint_eq(s_bf16(0x00008000), 0x0000); // subnormal tie to even zero
    ck_assert_uint_eq(s_bf16(0x00018000), 0x0002);
}
END_TEST

START_TEST(test_dtype_bf16_nan_inf_overflow_and_zero)
{
    ck_assert_uint_eq(s_bf16(0x7fc00000), 0x7fc0);
    ck_assert_uint_eq(s_bf16(0xffc00000), 0xffc0); // sign kept
    // A NaN with only low bits set would truncate to Inf: it must stay NaN.
    ck_assert_uint_eq(s_bf16(0x7f800001), 0x7fc0);
    ck_assert_uint_eq(s_bf16(0xff800001), 0xffc0);
    // Rounding 0x7fffffff up would carry into the sign bit.
    ck_assert_uint_eq(s_bf16(0x7fffffff), 0x7fff);
    ck_assert(s_is_nan16(s_bf16(0x7fbfffff), 7)); // signalling in, NaN out
    ck_assert(isnan(zps_bf16_to_f32(0x7fc1)));
    ck_assert(isnan(zps_bf16_to_f32(0xff81)));
    ck_assert_uint_eq(s_bf16(0x7f800000), 0x7f80);
    ck_assert_uint_eq(s_bf16(0xff800000), 0xff80);
    ck_assert(isinf(zps_bf16_to_f32(0x7f80)) && zps_bf16_to_f32(0x7f80) > 0);
    ck_assert(isinf(zps_bf16_to_f32(0xff80)) && zps_bf16_to_f32(0xff80) < 0);
    // FLT_MAX is past the last bf16 midpoint: Inf. The midpoint itself is a
    // tie with an odd mantissa below (0x7f7f): Inf too.
    ck_assert_uint_eq(s_bf16(0x7f7fffff), 0x7f80);
    ck_assert_uint_eq(s_bf16(0xff7fffff), 0xff80);
    ck_assert_uint_eq(s_bf16(0x7f7f8000), 0x7f80);
    ck_assert_uint_eq(s_bf16(0x7f7f7fff), 0x7f7f);
    ck_assert_uint_eq(zps_bf16_from_f32(-0.0f), 0x8000);
    ck_assert_uint_eq(zps_bf16_from_f32(0.0f), 0x0000);
    ck_assert(signbit(zps_bf16_to_f32(0x8000)) && zps_bf16_to_f32(0x8000) == 0.0f);
}
END_TEST

// ---------------------------------------------------------------- fp16

START_TEST(test_dtype_f16_exact_round_trip)
{
    const struct {
        uint16_t h;
        float x;
    } cases[] = {
        {0x3c00, 1.0f},         {0xc000, -2.0f},       {0x7bff, 65504.0f},
        {0xfbff, -65504.0f},    {0x0400, 0x1p-14f},    {0x0001, 0x1p-24f},
        {0x03ff, 0x3ffp-24f},   {0x3555, 0x555p-12f}, {0x3bff, 0x7ffp-11f},
        {0x8001, -0x1p-24f},    {0x5640, 100.0f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ck_assert_float_eq(zps_f16_to_f32(cases[i].h), cases[i].x);
        ck_assert_uint_eq(zps_f16_from_f32(cases[i].x), cases[i].h);
    }
}
END_TEST

START_TEST(test_dtype_f16_ties_to_even)
{
    // Around 1 the fp16 ulp is 2^-10, so 2^-11 is half an ulp.
    ck_assert_uint_eq(zps_f16_from_f32(1.0f + 0x1p-11f), 0x3c00);         // tie, even below
    ck_assert_uint_eq(zps_f16_from_f32(1.0f + 0x3p-11f), 0x3c02);         // tie, odd below: up
    ck_assert_uint_eq(zps_f16_from_f32(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01); // above the tie
    ck_assert_uint_eq(zps_f16_from_f32(1.0f + 0x1p-11f - 0x1p-20f), 0x3c00); // below the tie
    ck_assert_uint_eq(zps_f16_from_f32(-1.0f - 0x3p-11f), 0xbc02);
    ck_assert_uint_eq(zps_f16_from_f32(0x7ffp-11f + 0x1p-12f), 0x3c00); // carry into the exponent
    // Subnormal ties, in units of the smallest subnormal 2^-24.
    ck_assert_uint_eq(zps_f16_from_f32(0x1p-25f), 0x0000);            // 0.5 -> 0
    ck_assert_uint_eq(zps_f16_from_f32(0x3p-25f), 0x0002);            // 1.5 -> 2
    ck_assert_uint_eq(zps_f16_from_f32(0x5p-25f), 0x0002);            // 2.5 -> 2
    ck_assert_uint_eq(zps_f16_from_f32(0x1p-25f + 0x1p-40f), 0x0001); // just above 0.5
    ck_assert_uint_eq(zps_f16_from_f32(-0x3p-25f), 0x8002);
    // 1023.5 units lies between the largest subnormal and the smallest normal.
    ck_assert_uint_eq(zps_f16_from_f32(0x7ffp-25f), 0x0400);
    ck_assert_uint_eq(zps_f16_from_f32(0x7fdp-25f), 0x03fe); // 1022.5 -> 1022
}
END_TEST

START_TEST(test_dtype_f16_nan_inf_overflow_and_zero)
{
    ck_assert_uint_eq(s_f16(0x7fc00000), 0x7e00);
    ck_assert_uint_eq(s_f16(0xffc00000), 0xfe00); // sign kept
    ck_assert_uint_eq(s_f16(0x7f800001), 0x7e00); // low bits only: NaN, not Inf
    ck_assert_uint_eq(s_f16(0xff800001), 0xfe00);
    ck_assert(s_is_nan16(s_f16(0x7fffffff), 10));
    ck_assert(s_is_nan16(s_f16(0x7f802000), 10)); // signalling in, NaN out
    // A signalling fp16 NaN becomes a quiet fp32 NaN.
    ck_assert(isnan(zps_f16_to_f32(0x7c01)));
    ck_assert_uint_eq(zps_f32_bits(zps_f16_to_f32(0x7c01)) & 0x00400000u, 0x00400000u);
    ck_assert(isnan(zps_f16_to_f32(0xfe00)) && signbit(zps_f16_to_f32(0xfe00)));
    ck_assert_uint_eq(s_f16(0x7f800000), 0x7c00);
    ck_assert_uint_eq(s_f16(0xff800000), 0xfc00);
    ck_assert(isinf(zps_f16_to_f32(0x7c00)) && zps_f16_to_f32(0x7c00) > 0);
    ck_assert(isinf(zps_f16_to_f32(0xfc00)) && zps_f16_to_f32(0xfc00) < 0);
    // 65520 is the midpoint above 65504 (odd mantissa): it and all above go to Inf.
    ck_assert_uint_eq(zps_f16_from_f32(65519.99f), 0x7bff);
    ck_assert_uint_eq(zps_f16_from_f32(65520.0f), 0x7c00);
    ck_assert_uint_eq(zps_f16_from_f32(-65520.0f), 0xfc00);
    ck_assert_uint_eq(zps_f16_from_f32(1e6f), 0x7c00);
    ck_assert_uint_eq(s_f16(0x7f7fffff), 0x7c00);
    ck_assert_uint_eq(zps_f16_from_f32(-0.0f), 0x8000);
    ck_assert_uint_eq(zps_f16_from_f32(0.0f), 0x0000);
    ck_assert(signbit(zps_f16_to_f32(0x8000)) && zps_f16_to_f32(0x8000) == 0.0f);
    // Below half the smallest subnormal: a zero of the same sign.
    ck_assert_uint_eq(zps_f16_from_f32(-1e-10f), 0x8000);
    ck_assert_uint_eq(s_f16(0x00000001), 0x0000); // fp32 subnormals too
    ck_assert_uint_eq(s_f16(0x807fffff), 0x8000);
}
END_TEST

START_TEST(test_dtype_f16_subnormals)
{
    ck_assert_float_eq(zps_f16_to_f32(0x0001), 5.9604644775390625e-08f); // 2^-24
    ck_assert_float_eq(zps_f16_to_f32(0x8001), -5.9604644775390625e-08f);
    for (uint32_t k = 1; k < 0x400; k++) {
        float x = ldexpf((float)k, -24);
        ck_assert_float_eq(zps_f16_to_f32((uint16_t)k), x);
        ck_assert_float_eq(zps_f16_to_f32((uint16_t)(k | 0x8000)), -x);
        ck_assert_uint_eq(zps_f16_from_f32(x), k);
        ck_assert_uint_eq(zps_f16_from_f32(-x), k | 0x8000);
        // A quarter unit either way still rounds to k.
        ck_assert_uint_eq(zps_f16_from_f32(x + 0x1p-26f), k);
        ck_assert_uint_eq(zps_f16_from_f32(x - 0x1p-26f), k);
    }
}
END_TEST

// ---------------------------------------------------------------- every pattern

START_TEST(test_dtype_every_16bit_pattern_round_trips)
{
    for (uint32_t p = 0; p <= 0xffff; p++) {
        uint16_t h = (uint16_t)p;
        float xb = zps_bf16_to_f32(h);
        float xh = zps_f16_to_f32(h);
        if (s_is_nan16(h, 7)) {
            ck_assert_msg(isnan(xb), "bf16 %#x: not NaN in fp32", p);
            ck_assert(s_is_nan16(zps_bf16_from_f32(xb), 7));
            ck_assert_uint_eq(zps_bf16_from_f32(xb) & 0x8000, h & 0x8000);
        } else {
            ck_assert_msg(zps_bf16_from_f32(xb) == h, "bf16 %#x -> %#x", p,
                          zps_bf16_from_f32(xb));
        }
        if (s_is_nan16(h, 10)) {
            ck_assert_msg(isnan(xh), "fp16 %#x: not NaN in fp32", p);
            ck_assert(s_is_nan16(zps_f16_from_f32(xh), 10));
            ck_assert_uint_eq(zps_f16_from_f32(xh) & 0x8000, h & 0x8000);
        } else {
            ck_assert_msg(zps_f16_from_f32(xh) == h, "fp16 %#x -> %#x", p, zps_f16_from_f32(xh));
        }
    }
}
END_TEST

// ---------------------------------------------------------------- reference rounding

// A 16-bit float format: mant_bits mantissa bits and the exponent bias.
typedef struct fmt16 {
    int mant_bits; // 7 (bf16) or 10 (fp16)
    int bias;      // 127 or 15
    uint16_t inf;  // the +Inf pattern
} fmt16;

static const fmt16 BF16 = {7, 127, 0x7f80};
static const fmt16 F16 = {10, 15, 0x7c00};

// Magnitude of a positive pattern in double. The +Inf pattern is given the
// value the next binade would start at, which is where IEEE rounding puts
// the overflow threshold (round as if the exponent were unbounded).
static double s_value(const fmt16 *f, uint16_t p)
{
    int e = p >> f->mant_bits;
    int m = p & ((1 << f->mant_bits) - 1);
    if (e == 0) {
        return ldexp(m, 1 - f->bias - f->mant_bits);
    }
    return ldexp((1 << f->mant_bits) + m, e - f->bias - f->mant_bits);
}

// x rounded to the format by the textbook rule, not by bit tricks: the
// nearest representable value, the even pattern on a tie. NaN is left to
// the caller.
static uint16_t s_reference(const fmt16 *f, float x)
{
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs((double)x);
    if (a >= s_value(f, f->inf)) {
        return sign | f->inf;
    }
    // Largest pattern lo with value(lo) <= a (positive patterns are ordered).
    uint16_t lo = 0;
    uint16_t hi = f->inf;
    while (hi - lo > 1) {
        uint16_t mid = (uint16_t)((lo + hi) / 2);
        if (s_value(f, mid) <= a) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    double below = a - s_value(f, lo);
    double above = s_value(f, (uint16_t)(lo + 1)) - a;
    uint16_t p = lo;
    if (above < below || (above == below && (lo & 1))) {
        p = (uint16_t)(lo + 1);
    }
    return sign | p;
}

// Random fp32 patterns that hit every region: anything at all, values near
// the 16-bit ranges, and exact midpoints between 16-bit values.
static uint32_t s_random_f32(zps_rng *r)
{
    uint32_t u = (uint32_t)zps_rng_next(r);
    switch (zps_rng_below(r, 4)) {
    case 0:
        return u;
    case 1: // exponents 2^-30 .. 2^17, around the fp16 range
        return (u & 0x807fffffu) | ((uint32_t)(97 + zps_rng_below(r, 48)) << 23);
    case 2: // an fp16 midpoint or one fp32 ulp off it
        return ((u & 0xffffe000u) | 0x1000u) + (uint32_t)zps_rng_below(r, 3) - 1u;
    default: // a bf16 midpoint or one fp32 ulp off it
        return ((u & 0xffff0000u) | 0x8000u) + (uint32_t)zps_rng_below(r, 3) - 1u;
    }
}

START_TEST(test_dtype_rounding_matches_reference)
{
    zps_rng r;
    zps_rng_seed(&r, 42, 0);
    for (int i = 0; i < 100000; i++) {
        uint32_t u = s_random_f32(&r);
        float x = s_f(u);
        if (isnan(x)) {
            ck_assert(s_is_nan16(zps_bf16_from_f32(x), 7));
            ck_assert(s_is_nan16(zps_f16_from_f32(x), 10));
            continue;
        }
        ck_assert_msg(zps_bf16_from_f32(x) == s_reference(&BF16, x), "bf16 of %#x: %#x, not %#x",
                      u, zps_bf16_from_f32(x), s_reference(&BF16, x));
        ck_assert_msg(zps_f16_from_f32(x) == s_reference(&F16, x), "fp16 of %#x: %#x, not %#x", u,
                      zps_f16_from_f32(x), s_reference(&F16, x));
    }
}
END_TEST

#ifdef __FLT16_MAX__
// GCC's _Float16 cast (libgcc's soft-float, or F16C) is a third opinion.
START_TEST(test_dtype_f16_matches_compiler_cast)
{
    zps_rng r;
    zps_rng_seed(&r, 43, 0);
    for (int i = 0; i < 100000; i++) {
        uint32_t u = s_random_f32(&r);
        volatile float x = s_f(u);
        _Float16 c = (_Float16)x;
        uint16_t want;
        memcpy(&want, &c, sizeof want);
        uint16_t got = zps_f16_from_f32(x);
        if (isnan(x)) {
            ck_assert(s_is_nan16(got, 10) && s_is_nan16(want, 10));
            continue;
        }
        ck_assert_msg(got == want, "fp16 of %#x: %#x, cast gives %#x", u, got, want);
        ck_assert_float_eq(zps_f16_to_f32(got), (float)c);
    }
}
END_TEST
#endif

// ---------------------------------------------------------------- bulk functions

#define BULK_N 1031 // odd, past several vector widths, so every loop has a tail

// Fills n fp32 values (as bits) with s_random_f32 and a few specials.
static void s_fill(zps_rng *r, uint32_t *bits, size_t n, bool with_nan)
{
    for (size_t i = 0; i < n; i++) {
        bits[i] = s_random_f32(r);
        if (!with_nan && isnan(s_f(bits[i]))) {
            bits[i] = 0x3f808000u; // a bf16 tie instead
        }
    }
    const uint32_t specials[] = {0x80000000u, 0x7f800000u, 0xff800000u, 0x7f7fffffu,
                                 0x00000001u, 0x33800000u, 0x477ff000u, 0x7f800001u};
    for (size_t i = 0; i < sizeof specials / sizeof specials[0] && i < n; i++) {
        bits[i * 7 % n] = (!with_nan && specials[i] == 0x7f800001u) ? 0 : specials[i];
    }
}

START_TEST(test_dtype_bulk_matches_scalar_unaligned)
{
    static const zps_dtype types[] = {ZPS_DTYPE_F32, ZPS_DTYPE_BF16, ZPS_DTYPE_F16};
    static const size_t lengths[] = {0, 1, 7, 16, 33, BULK_N};
    uint32_t bits[BULK_N];
    // Room for offsets of 0..3 bytes on either side.
    unsigned char *src = malloc(BULK_N * 4 + 4);
    unsigned char *dst = malloc(BULK_N * 4 + 4);
    unsigned char *back = malloc(BULK_N * 4 + 4);
    ck_assert(src && dst && back);
    zps_rng r;
    zps_rng_seed(&r, 44, 0);
    for (size_t t = 0; t < 3; t++) {
        zps_dtype d = types[t];
        size_t es = zps_dtype_size(d);
        for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
            size_t n = lengths[li];
            for (size_t off = 0; off < 4; off++) {
                s_fill(&r, bits, BULK_N, true);
                memcpy(src + off, bits, n * 4);
                zps_dtype_from_f32(d, (const float *)(void *)(src + off), dst + 3 - off, n);
                for (size_t i = 0; i < n; i++) {
                    uint16_t want = d == ZPS_DTYPE_BF16 ? s_bf16(bits[i]) : s_f16(bits[i]);
                    if (d == ZPS_DTYPE_F32) {
                        ck_assert(memcmp(dst + 3 - off + i * 4, &bits[i], 4) == 0);
                    } else {
                        uint16_t got;
                        memcpy(&got, dst + 3 - off + i * es, 2);
                        ck_assert_msg(got == want, "%s from_f32[%zu] of %#x: %#x, not %#x",
                                      zps_dtype_name(d), i, bits[i], got, want);
                    }
                }
                // And back, into a buffer offset the other way.
                zps_dtype_to_f32(d, dst + 3 - off, (float *)(void *)(back + off), n);
                for (size_t i = 0; i < n; i++) {
                    uint16_t h;
                    memcpy(&h, dst + 3 - off + i * es, 2);
                    float want = d == ZPS_DTYPE_F32    ? s_f(bits[i])
                                 : d == ZPS_DTYPE_BF16 ? zps_bf16_to_f32(h)
                                                       : zps_f16_to_f32(h);
                    ck_assert_msg(memcmp(back + off + i * 4, &want, 4) == 0,
                                  "%s to_f32[%zu] differs", zps_dtype_name(d), i);
                }
            }
        }
    }
    free(back);
    free(dst);
    free(src);
}
END_TEST

START_TEST(test_dtype_axpy_matches_reference)
{
    static const zps_dtype types[] = {ZPS_DTYPE_F32, ZPS_DTYPE_BF16, ZPS_DTYPE_F16};
    static const float scales[] = {1.0f, 0.25f, 3.0f / 7.0f, -2.0f};
    uint32_t bits[BULK_N];
    float vals[BULK_N];
    double *acc = malloc(BULK_N * sizeof(double));
    double *want = malloc(BULK_N * sizeof(double));
    unsigned char *src = malloc(BULK_N * 4 + 1);
    ck_assert(acc && want && src);
    zps_rng r;
    zps_rng_seed(&r, 45, 0);
    for (size_t t = 0; t < 3; t++) {
        zps_dtype d = types[t];
        size_t es = zps_dtype_size(d);
        for (size_t si = 0; si < sizeof scales / sizeof scales[0]; si++) {
            // NaNs are left out: which NaN a sum returns is not ours to fix.
            s_fill(&r, bits, BULK_N, false);
            for (size_t i = 0; i < BULK_N; i++) {
                acc[i] = zps_rng_normal(&r);
            }
            memcpy(want, acc, BULK_N * sizeof(double));
            // The source sits one byte off alignment, as in a receive buffer.
            memcpy(vals, bits, sizeof vals);
            zps_dtype_from_f32(d, vals, src + 1, BULK_N);
            for (size_t i = 0; i < BULK_N; i++) {
                uint16_t h;
                memcpy(&h, src + 1 + i * es, 2);
                float x = d == ZPS_DTYPE_F32    ? s_f(bits[i])
                          : d == ZPS_DTYPE_BF16 ? zps_bf16_to_f32(h)
                                                : zps_f16_to_f32(h);
                // volatile: the exact product is added unfused, as promised.
                volatile double term = (double)scales[si] * (double)x;
                want[i] += term;
            }
            zps_dtype_axpy(d, scales[si], src + 1, acc, BULK_N);
            for (size_t i = 0; i < BULK_N; i++) {
                ck_assert_msg(memcmp(&acc[i], &want[i], sizeof(double)) == 0,
                              "%s axpy[%zu]: %a, not %a", zps_dtype_name(d), i, acc[i], want[i]);
            }
        }
    }
    free(src);
    free(want);
    free(acc);
}
END_TEST

// The shard's fused pass (server/shard/zps_shard.c) gives the bits of the plain
// one: the first push set with axpy_set is axpy into zeros, and the last
// push averaged with axpy_mean is axpy followed by the division, for
// totals that are powers of two (a multiplication instead) or not, and
// for a push that is the bucket's only one (scale == total: x + 0.0f),
// -0, Inf, subnormals and (one NaN operand, whose NaN comes out) NaN
// included.
START_TEST(test_dtype_axpy_mean_matches_axpy_then_divide)
{
    static const zps_dtype types[] = {ZPS_DTYPE_F32, ZPS_DTYPE_BF16, ZPS_DTYPE_F16};
    static const uint32_t totals[] = {1, 2, 3, 7, 8, 16, 24, 128, 1000, 1u << 20, 16777217u};
    uint32_t bits[BULK_N];
    double *acc = malloc(BULK_N * sizeof(double));
    double *ref = malloc(BULK_N * sizeof(double));
    float *got = malloc(BULK_N * sizeof(float));
    unsigned char *src = malloc(BULK_N * 4 + 1);
    ck_assert(acc && ref && got && src);
    zps_rng r;
    zps_rng_seed(&r, 46, 0);
    for (size_t t = 0; t < 3; t++) {
        zps_dtype d = types[t];
        for (size_t ti = 0; ti < sizeof totals / sizeof totals[0]; ti++) {
            uint32_t total = totals[ti];
            for (int alone = 0; alone < 2; alone++) {
                // Alone: the push is the whole batch; else a part of it after others.
                float scale = alone ? (float)total : (float)(total / 2 ? total / 2 : 1);
                s_fill(&r, bits, BULK_N, alone);
                zps_dtype_from_f32(d, (const float *)(void *)bits, src + 1, BULK_N);
                for (size_t i = 0; i < BULK_N; i++) {
                    acc[i] = zps_rng_normal(&r) * 1e3;
                    ref[i] = alone ? 0.0 : acc[i];
                }
                if (alone) {
                    // The first push: set, as axpy into zeros would.
                    zps_dtype_axpy_set(d, scale, src + 1, acc, BULK_N);
                    zps_dtype_axpy(d, scale, src + 1, ref, BULK_N);
                    ck_assert(memcmp(acc, ref, BULK_N * sizeof(double)) == 0);
                    memset(ref, 0, BULK_N * sizeof(double));
                }
                zps_dtype_axpy_mean(d, scale, src + 1, alone ? NULL : acc, total, got, BULK_N);
                zps_dtype_axpy(d, scale, src + 1, ref, BULK_N);
                for (size_t i = 0; i < BULK_N; i++) {
                    volatile double q = ref[i] / (double)total;
                    float want = (float)q;
                    ck_assert_msg(memcmp(&got[i], &want, sizeof want) == 0,
                                  "%s mean[%zu] total %u%s: %a, not %a", zps_dtype_name(d), i,
                                  total, alone ? " alone" : "", got[i], want);
                }
            }
        }
    }
    free(src);
    free(got);
    free(ref);
    free(acc);
}
END_TEST

// A bucket's first two pushes read in one pass (the first kept unread:
// server/shard/zps_kept.h) give the bits of the first set into the
// accumulator and the second added (axpy2_set) or averaged (axpy2_mean),
// for totals that are powers of two or not, the sources off alignment.
START_TEST(test_dtype_axpy2_matches_set_then_axpy)
{
    static const zps_dtype types[] = {ZPS_DTYPE_F32, ZPS_DTYPE_BF16, ZPS_DTYPE_F16};
    static const uint32_t totals[] = {3, 8, 40, 128, 1000, 16777217u};
    uint32_t bits[BULK_N];
    double *acc = malloc(BULK_N * sizeof(double)), *got = malloc(BULK_N * sizeof(double));
    float *mean = malloc(BULK_N * sizeof(float)), *want = malloc(BULK_N * sizeof(float));
    unsigned char *a = malloc(BULK_N * 4 + 1), *b = malloc(BULK_N * 4 + 3);
    ck_assert(acc && got && mean && want && a && b);
    zps_rng r;
    zps_rng_seed(&r, 47, 0);
    for (size_t t = 0; t < 3; t++) {
        zps_dtype d = types[t];
        for (size_t ti = 0; ti < sizeof totals / sizeof totals[0]; ti++) {
            uint32_t total = totals[ti];
            float k1 = (float)(total / 3 ? total / 3 : 1), k2 = (float)(total - total / 3 - 1);
            s_fill(&r, bits, BULK_N, false);
            zps_dtype_from_f32(d, (const float *)(void *)bits, a + 1, BULK_N);
            s_fill(&r, bits, BULK_N, false);
            zps_dtype_from_f32(d, (const float *)(void *)bits, b + 3, BULK_N);
            zps_dtype_axpy_set(d, k1, a + 1, acc, BULK_N);
            zps_dtype_axpy_mean(d, k2, b + 3, acc, total, want, BULK_N);
            zps_dtype_axpy(d, k2, b + 3, acc, BULK_N);
            zps_dtype_axpy2_set(d, k1, a + 1, k2, b + 3, got, BULK_N);
            zps_dtype_axpy2_mean(d, k1, a + 1, k2, b + 3, total, mean, BULK_N);
            ck_assert_msg(memcmp(acc, got, BULK_N * sizeof(double)) == 0, "%s set, total %u",
                          zps_dtype_name(d), total);
            ck_assert_msg(memcmp(mean, want, BULK_N * sizeof(float)) == 0, "%s mean, total %u",
                          zps_dtype_name(d), total);
        }
    }
    free(b);
    free(a);
    free(want);
    free(mean);
    free(got);
    free(acc);
}
END_TEST

// An unchecked dtype reaching the bulk functions is a bug: they abort.
START_TEST(test_dtype_bulk_aborts_on_invalid_dtype)
{
    float x = 1.0f;
    double y = 0.0;
    zps_dtype_axpy((zps_dtype)0, 1.0f, &x, &y, 1);
}
END_TEST

Suite *zps_suite_dtype(void)
{
    Suite *s = suite_create("dtype");
    TCase *tc = tcase_create("dtype");
    tcase_add_test(tc, test_dtype_size_name_parse);
    tcase_add_test(tc, test_dtype_bf16_exact_round_trip);
    tcase_add_test(tc, test_dtype_bf16_ties_to_even);
    tcase_add_test(tc, test_dtype_bf16_nan_inf_overflow_and_zero);
    tcase_add_test(tc, test_dtype_f16_exact_round_trip);
    tcase_add_test(tc, test_dtype_f16_ties_to_even);
    tcase_add_test(tc, test_dtype_f16_nan_inf_overflow_and_zero);
    tcase_add_test(tc, test_dtype_f16_subnormals);
    tcase_add_test(tc, test_dtype_every_16bit_pattern_round_trips);
    tcase_add_test(tc, test_dtype_rounding_matches_reference);
#ifdef __FLT16_MAX__
    tcase_add_test(tc, test_dtype_f16_matches_compiler_cast);
#endif
    tcase_add_test(tc, test_dtype_bulk_matches_scalar_unaligned);
    tcase_add_test(tc, test_dtype_axpy_matches_reference);
    tcase_add_test(tc, test_dtype_axpy_mean_matches_axpy_then_divide);
    tcase_add_test(tc, test_dtype_axpy2_matches_set_then_axpy);
    tcase_add_test_raise_signal(tc, test_dtype_bulk_aborts_on_invalid_dtype, SIGABRT);
    suite_add_tcase(s, tc);
    return s;
}
