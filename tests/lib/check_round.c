/* check_round.c - a worker's diloco round: the pseudo-gradient of its
 * ranges, fp32 or compressed, and the error feedback across rounds. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lib/zps_round.h"
#include "tests/zps_check.h"

#define N 1000

// Two ranges of a bucket cut by a shard boundary, and one more.
static const uint64_t s_lo[3] = {0, 300, 700}, s_hi[3] = {300, 700, N};

static void s_fill(float *x, double scale, unsigned seed)
{
    srand(seed);
    for (int i = 0; i < N; i++) {
        x[i] = (float)(scale * ((double)rand() / RAND_MAX - 0.5));
    }
}

START_TEST(test_round_fp32_payloads_are_the_pseudo_gradient)
{
    zps_round r;
    ck_assert_int_eq(zps_round_init(&r, N, 0, s_lo, s_hi, NULL, 3), ZPS_OK);
    float *sync = malloc(N * sizeof(float)), *local = malloc(N * sizeof(float));
    s_fill(sync, 2.0, 1);
    s_fill(local, 2.0, 2);
    zps_round_begin(&r, sync, ZPS_ROUND_ALL);
    ck_assert_int_eq(zps_round_delta(&r, local, ZPS_ROUND_ALL), ZPS_OK);
    double norm = 0;
    for (int k = 0; k < 3; k++) {
        const void *data;
        size_t len;
        zps_round_payload(&r, k, &data, &len);
        ck_assert_uint_eq(len, (s_hi[k] - s_lo[k]) * sizeof(float));
        const float *d = data;
        for (uint64_t i = s_lo[k]; i < s_hi[k]; i++) {
            ck_assert_float_eq(d[i - s_lo[k]], sync[i] - local[i]);
            norm += (double)d[i - s_lo[k]] * d[i - s_lo[k]];
        }
    }
    ck_assert_double_eq_tol(r.norm, sqrt(norm), 1e-9 * sqrt(norm));
    ck_assert_uint_eq(r.bytes, N * sizeof(float));
    // A diverged worker's pseudo-gradient is not sent.
    local[5] = NAN;
    ck_assert_int_eq(zps_round_delta(&r, local, ZPS_ROUND_ALL), ZPS_EINVAL);
    free(sync);
    free(local);
    zps_round_fini(&r);
}
END_TEST

// Over many rounds the sum of what was sent tracks the sum of the deltas:
// they differ by the residual kept, which stays within D / 253 (int8).
START_TEST(test_round_int8_feedback_keeps_the_sum_of_what_was_sent)
{
    zps_round r;
    ck_assert_int_eq(zps_round_init(&r, N, ZPS_QUANT_INT8, s_lo, s_hi, NULL, 3), ZPS_OK);
    float *theta = calloc(N, sizeof(float)), *local = malloc(N * sizeof(float));
    float *decoded = malloc(N * sizeof(float));
    double *sum_delta = calloc(N, sizeof(double)), *sum_sent = calloc(N, sizeof(double));
    double max_delta = 0, worst = 0;
    for (int round = 0; round < 200; round++) {
        zps_round_begin(&r, theta, ZPS_ROUND_ALL);
        s_fill(local, 0.02, 100 + (unsigned)round);
        for (int i = 0; i < N; i++) {
            local[i] += theta[i];
        }
        ck_assert_int_eq(zps_round_delta(&r, local, ZPS_ROUND_ALL), ZPS_OK);
        for (int k = 0; k < 3; k++) {
            const void *data;
            size_t len;
            zps_round_payload(&r, k, &data, &len);
            ck_assert_int_eq(zps_quant_decode(ZPS_QUANT_INT8, ZPS_QUANT_BLOCK, data, len,
                                              decoded + s_lo[k], s_hi[k] - s_lo[k]), ZPS_OK);
        }
        for (int i = 0; i < N; i++) {
            max_delta = fmax(max_delta, fabs(r.delta[i]));
            sum_delta[i] += r.delta[i];
            sum_sent[i] += decoded[i];
        }
        for (int i = 0; i < N; i++) {
            worst = fmax(worst, fabs(sum_delta[i] - sum_sent[i]));
        }
    }
    ck_assert_uint_lt(r.bytes, N * sizeof(float) / 3); // a quarter, and the scales
    // The residual's bound, and the float sums' own rounding over 200 rounds.
    ck_assert_double_le(worst, max_delta / 253 + 200 * 0x1p-23 * max_delta);
    // The feedback is real: without it the difference would grow with the rounds.
    ck_assert_double_gt(worst, 0);
    zps_round_reset_feedback(&r);
    ck_assert_float_eq(zps_quant_ef_residual(r.ef)[17], 0.0f);
    free(theta);
    free(local);
    free(decoded);
    free(sum_delta);
    free(sum_sent);
    zps_round_fini(&r);
}
END_TEST

START_TEST(test_round_refuses_a_range_outside_the_vector)
{
    zps_round r;
    uint64_t lo = 10, hi = N + 1;
    ck_assert_int_eq(zps_round_init(&r, N, 0, &lo, &hi, NULL, 1), ZPS_EINVAL);
    zps_round_fini(&r);
}
END_TEST

// --fragments: a fragment at a time, theta_sync and the payloads of the
// other fragments stay as they were; over every fragment, the payloads are
// the bits of the whole vector's in one pass.
START_TEST(test_round_fragments_are_taken_one_at_a_time)
{
    static const uint8_t frag[3] = {1, 0, 1};
    zps_round whole, parts;
    ck_assert_int_eq(zps_round_init(&whole, N, ZPS_QUANT_INT8, s_lo, s_hi, NULL, 3), ZPS_OK);
    ck_assert_int_eq(zps_round_init(&parts, N, ZPS_QUANT_INT8, s_lo, s_hi, frag, 3), ZPS_OK);
    float *sync = malloc(N * sizeof(float)), *local = malloc(N * sizeof(float));
    s_fill(sync, 2.0, 5);
    s_fill(local, 2.0, 6);
    zps_round_begin(&whole, sync, ZPS_ROUND_ALL);
    float *zeros = calloc(N, sizeof(float));
    zps_round_begin(&parts, zeros, ZPS_ROUND_ALL);
    zps_round_begin(&parts, sync, 0); // [300, 700) only
    ck_assert_float_eq(parts.sync[300], sync[300]);
    ck_assert_float_eq(parts.sync[699], sync[699]);
    ck_assert_float_eq(parts.sync[0], 0.0f);
    ck_assert_float_eq(parts.sync[700], 0.0f);
    zps_round_begin(&parts, sync, 1);
    ck_assert_int_eq(zps_round_delta(&whole, local, ZPS_ROUND_ALL), ZPS_OK);
    ck_assert_int_eq(zps_round_delta(&parts, local, 1), ZPS_OK);
    ck_assert_uint_eq(zps_round_bytes(&parts, 1),
                      zps_round_bytes(&whole, ZPS_ROUND_ALL) - zps_round_bytes(&parts, 0));
    const void *a, *b;
    size_t la, lb;
    ck_assert(zps_round_has(&parts, 1, 0) && !zps_round_has(&parts, 1, 1));
    ck_assert_int_eq(zps_round_delta(&parts, local, 0), ZPS_OK);
    for (int k = 0; k < 3; k++) {
        zps_round_payload(&whole, k, &a, &la);
        zps_round_payload(&parts, k, &b, &lb);
        ck_assert_uint_eq(la, lb);
        ck_assert_msg(memcmp(a, b, la) == 0, "range %d differs", k);
    }
    free(sync);
    free(local);
    free(zeros);
    zps_round_fini(&whole);
    zps_round_fini(&parts);
}
END_TEST

Suite *zps_suite_round(void)
{
    Suite *s = suite_create("round");
    TCase *tc = tcase_create("round");
    tcase_add_test(tc, test_round_fp32_payloads_are_the_pseudo_gradient);
    tcase_add_test(tc, test_round_int8_feedback_keeps_the_sum_of_what_was_sent);
    tcase_add_test(tc, test_round_refuses_a_range_outside_the_vector);
    tcase_add_test(tc, test_round_fragments_are_taken_one_at_a_time);
    suite_add_tcase(s, tc);
    return s;
}
