/* check_zcode.c - the lossless code of the wire: the same bits back, with
 * and without a base, smaller where the high planes repeat, and every
 * frame the encoder does not make refused. */
#include <stdlib.h>
#include <string.h>

#include "common/zps_rng.h"
#include "common/zps_zcode.h"
#include "tests/zps_check.h"

#define N 100000

// n values like a step's parameters: small, of a few binades.
static float *s_values(uint64_t seed, size_t n)
{
    float *v = malloc(n * sizeof *v);
    zps_rng r;
    zps_rng_seed(&r, seed, 0);
    for (size_t i = 0; i < n; i++) {
        v[i] = (float)((zps_rng_uniform(&r) - 0.5) * 0.2);
    }
    return v;
}

// base after one small step: v - 1e-4 * g, as SGD moves parameters.
static float *s_stepped(const float *base, uint64_t seed, size_t n)
{
    float *v = s_values(seed, n);
    for (size_t i = 0; i < n; i++) {
        v[i] = base[i] - 1e-4f * v[i];
    }
    return v;
}

static size_t s_round_trip(const float *src, const float *base, size_t n)
{
    zps_zcode *z = NULL;
    ck_assert_int_eq(zps_zcode_new(&z), ZPS_OK);
    void *frame = NULL;
    size_t len = 0, count = 0;
    ck_assert_int_eq(zps_zcode_encode(z, src, base, n, &frame, &len), ZPS_OK);
    char why[160];
    ck_assert_int_eq(zps_zcode_count(frame, len, &count, why, sizeof why), ZPS_OK);
    ck_assert_uint_eq(count, n);
    float *back = malloc(n * sizeof *back);
    ck_assert_int_eq(zps_zcode_decode(z, frame, len, base, back, n, why, sizeof why), ZPS_OK);
    ck_assert_mem_eq(back, src, n * sizeof *back);
    free(back);
    free(frame);
    zps_zcode_destroy(&z);
    ck_assert_ptr_null(z);
    return len;
}

START_TEST(test_zcode_gives_back_the_same_bits_with_and_without_a_base)
{
    float *base = s_values(1, N), *next = s_stepped(base, 2, N);
    next[7] = -0.0f; // signs, zeros, NaN and Inf come back as they went
    next[8] = __builtin_nanf("0x12345");
    next[9] = -__builtin_inff();
    size_t plain = s_round_trip(next, NULL, N);
    size_t xored = s_round_trip(next, base, N);
    ck_assert_uint_le(plain, ZPS_ZCODE_HEADER + 4 * N);
    // The step's change leaves the high planes nearly all zeros.
    ck_assert_uint_lt(xored, plain);
    ck_assert_uint_lt(xored, 3 * N);
    for (size_t n = 1; n < 5; n++) {
        (void)s_round_trip(next, base, n); // frames too short for zstd to shrink
    }
    free(base);
    free(next);
}
END_TEST

START_TEST(test_zcode_a_frame_of_zeros_shrinks_to_almost_nothing)
{
    float *zeros = calloc(N, sizeof *zeros);
    ck_assert_uint_lt(s_round_trip(zeros, NULL, N), 200);
    free(zeros);
}
END_TEST

START_TEST(test_zcode_refuses_counts_out_of_range)
{
    zps_zcode *z = NULL;
    ck_assert_int_eq(zps_zcode_new(&z), ZPS_OK);
    float v[1] = {1};
    void *frame = NULL;
    size_t len = 0;
    ck_assert_int_eq(zps_zcode_encode(z, v, NULL, 0, &frame, &len), ZPS_EINVAL);
    ck_assert_int_eq(zps_zcode_encode(z, v, NULL, ZPS_ZCODE_MAX + 1, &frame, &len), ZPS_EINVAL);
    ck_assert_ptr_null(frame);
    zps_zcode_destroy(&z);
}
END_TEST

// Decodes a changed frame and asserts it is refused with a reason.
static void s_refused(zps_zcode *z, const uint8_t *frame, size_t len, const float *base,
                      size_t n)
{
    float out[64];
    char why[160] = "";
    size_t count;
    zps_err err = zps_zcode_count(frame, len, &count, why, sizeof why);
    if (err == ZPS_OK) {
        err = zps_zcode_decode(z, frame, len, base, out, n, why, sizeof why);
    }
    ck_assert_int_eq(err, ZPS_EPROTO);
    ck_assert_str_ne(why, "");
}

START_TEST(test_zcode_refuses_every_frame_the_encoder_does_not_make)
{
    enum { M = 64 };
    float *base = s_values(3, M), *next = s_stepped(base, 4, M), other[M];
    zps_zcode *z = NULL;
    ck_assert_int_eq(zps_zcode_new(&z), ZPS_OK);
    uint8_t *frame = NULL;
    size_t len = 0;
    ck_assert_int_eq(zps_zcode_encode(z, next, base, M, (void **)&frame, &len), ZPS_OK);
    uint8_t *bad = malloc(len + 1);
    // Cut short, or one byte more.
    for (size_t cut = 0; cut < len; cut += 7) {
        s_refused(z, frame, cut, base, M);
    }
    memcpy(bad, frame, len);
    bad[len] = 0;
    s_refused(z, bad, len + 1, base, M);
    // Every single byte flipped: the header, a plane's length, its zstd
    // frame, a stored plane, the hash.
    for (size_t at = 0; at < len; at++) {
        memcpy(bad, frame, len);
        bad[at] ^= 0x40;
        s_refused(z, bad, len, base, M);
    }
    // Another count than the one due; no base, or another one.
    s_refused(z, frame, len, base, M - 1);
    s_refused(z, frame, len, NULL, M);
    memcpy(other, base, sizeof other);
    other[M - 1] = 1.0f;
    s_refused(z, frame, len, other, M);
    free(bad);
    free(frame);
    free(base);
    free(next);
    zps_zcode_destroy(&z);
}
END_TEST

Suite *zps_suite_zcode(void)
{
    Suite *s = suite_create("zcode");
    TCase *tc = tcase_create("code");
    tcase_add_test(tc, test_zcode_gives_back_the_same_bits_with_and_without_a_base);
    tcase_add_test(tc, test_zcode_a_frame_of_zeros_shrinks_to_almost_nothing);
    tcase_add_test(tc, test_zcode_refuses_counts_out_of_range);
    tcase_add_test(tc, test_zcode_refuses_every_frame_the_encoder_does_not_make);
    suite_add_tcase(s, tc);
    return s;
}
