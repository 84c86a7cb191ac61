/* check_sumsq.c - the exact sum of squares (common/zps_sumsq.h): the same
 * bits for any split of an array and any order of its terms, known values,
 * the extremes of float, and infinities and NaNs kept apart. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_sumsq.h"
#include "tests/zps_check.h"

#define S_N 4099

// Values over the whole float range, of both signs, some subnormal.
static void s_fill(float *x, size_t n, unsigned seed)
{
    srand(seed);
    for (size_t i = 0; i < n; i++) {
        float m = (float)rand() / (float)RAND_MAX * 2.0f - 1.0f;
        int e = rand() % 60 - 30;
        x[i] = ldexpf(m, e);
    }
    x[7] = 1e-44f;        // subnormal
    x[11] = 3.0e38f;      // near the top
    x[13] = -1.17549435e-38f; // the smallest normal
}

static zps_sumsq s_sum(const float *x, size_t n)
{
    zps_sumsq s;
    zps_sumsq_init(&s);
    zps_sumsq_add(&s, x, n);
    return s;
}

START_TEST(test_sumsq_any_split_gives_the_same_bits)
{
    static float x[S_N];
    s_fill(x, S_N, 7);
    zps_sumsq whole = s_sum(x, S_N);
    double want = zps_sumsq_value(&whole);
    size_t cuts[][2] = {{1, 2}, {100, 3000}, {2048, 2049}, {S_N / 3, 2 * S_N / 3}, {0, S_N}};
    for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
        // Three parts summed apart, merged in every order of two.
        zps_sumsq a = s_sum(x, cuts[c][0]);
        zps_sumsq b = s_sum(x + cuts[c][0], cuts[c][1] - cuts[c][0]);
        zps_sumsq d = s_sum(x + cuts[c][1], S_N - cuts[c][1]);
        zps_sumsq m1 = d;
        zps_sumsq_merge(&m1, &a);
        zps_sumsq_merge(&m1, &b);
        zps_sumsq m2 = a;
        zps_sumsq_merge(&m2, &b);
        zps_sumsq_merge(&m2, &d);
        ck_assert_mem_eq(m1.limb, whole.limb, sizeof whole.limb);
        ck_assert_mem_eq(m2.limb, whole.limb, sizeof whole.limb);
        double v = zps_sumsq_value(&m1);
        ck_assert_mem_eq(&v, &want, sizeof v);
    }
}
END_TEST

START_TEST(test_sumsq_order_does_not_matter)
{
    static float x[S_N], y[S_N];
    s_fill(x, S_N, 11);
    for (size_t i = 0; i < S_N; i++) {
        y[i] = x[S_N - 1 - i];
    }
    // Swap a few more around too.
    for (size_t i = 0; i + 17 < S_N; i += 31) {
        float t = y[i];
        y[i] = y[i + 17];
        y[i + 17] = t;
    }
    zps_sumsq a = s_sum(x, S_N), b = s_sum(y, S_N);
    ck_assert_mem_eq(a.limb, b.limb, sizeof a.limb);
}
END_TEST

START_TEST(test_sumsq_known_values)
{
    float x[] = {3.0f, -4.0f};
    zps_sumsq s = s_sum(x, 2);
    ck_assert_double_eq(zps_sumsq_value(&s), 25.0);
    ck_assert_float_eq(zps_sumsq_norm(&s), 5.0f);
    // 1 + 2^-60 squared terms: a double sum in order would drop the small
    // ones against the large; the exact sum keeps 2^20 of them (2^-100 each).
    static float y[(1 << 20) + 1];
    y[0] = 1.0f;
    for (size_t i = 1; i < sizeof y / sizeof y[0]; i++) {
        y[i] = 0x1p-50f;
    }
    zps_sumsq t = s_sum(y, sizeof y / sizeof y[0]);
    // 2^0 at bit 298, 2^-80 at bit 218, nothing else.
    for (int i = 0; i < ZPS_SUMSQ_LIMBS; i++) {
        uint64_t want = i == 4 ? 1ull << 42 : i == 3 ? 1ull << 26 : 0;
        ck_assert_uint_eq(t.limb[i], want);
    }
    // The largest float squared, many times: headroom above it.
    float big[3] = {3.4028235e38f, -3.4028235e38f, 3.4028235e38f};
    zps_sumsq u = s_sum(big, 3);
    double want = 3.0 * (double)3.4028235e38f * (double)3.4028235e38f;
    ck_assert_double_eq(zps_sumsq_value(&u), want);
    // The smallest subnormal: 2^-298, the accumulator's lowest bit.
    float tiny = 0x1p-149f;
    zps_sumsq v = s_sum(&tiny, 1);
    ck_assert_uint_eq(v.limb[0], 1);
    ck_assert_double_eq(zps_sumsq_value(&v), 0x1p-298);
    zps_sumsq z = s_sum(NULL, 0);
    ck_assert_double_eq(zps_sumsq_value(&z), 0.0);
}
END_TEST

START_TEST(test_sumsq_inf_and_nan_are_kept_apart)
{
    float x[] = {1.0f, INFINITY, 2.0f};
    zps_sumsq s = s_sum(x, 3);
    ck_assert(isinf(zps_sumsq_value(&s)));
    float y[] = {-INFINITY, NAN, 2.0f};
    zps_sumsq t = s_sum(y, 3);
    ck_assert(isnan(zps_sumsq_value(&t)));
    // Merged: a NaN anywhere wins.
    zps_sumsq_merge(&s, &t);
    ck_assert(isnan(zps_sumsq_value(&s)));
    float w[] = {1.0f, 2.0f};
    zps_sumsq fine = s_sum(w, 2);
    ck_assert_double_eq(zps_sumsq_value(&fine), 5.0);
}
END_TEST

START_TEST(test_sumsq_clip_coef_is_torchs)
{
    // max_norm / (norm + 1e-6) in float32, clamped to 1.
    ck_assert_float_eq(zps_sumsq_clip_coef(1.0f, 0.5f), 1.0f);
    float want = 0.5f / (2.0f + 1e-6f);
    ck_assert_float_eq(zps_sumsq_clip_coef(0.5f, 2.0f), want);
    ck_assert_float_eq(zps_sumsq_clip_coef(0.5f, INFINITY), 0.0f);
    ck_assert(isnan(zps_sumsq_clip_coef(0.5f, NAN)));
}
END_TEST

Suite *zps_suite_sumsq(void)
{
    Suite *s = suite_create("sumsq");
    TCase *tc = tcase_create("exact");
    tcase_add_test(tc, test_sumsq_any_split_gives_the_same_bits);
    tcase_add_test(tc, test_sumsq_order_does_not_matter);
    tcase_add_test(tc, test_sumsq_known_values);
    tcase_add_test(tc, test_sumsq_inf_and_nan_are_kept_apart);
    tcase_add_test(tc, test_sumsq_clip_coef_is_torchs);
    suite_add_tcase(s, tc);
    return s;
}
