/* check_dyl.c - DyLU's inner step counts (zps_dyl): in proportion to the
 * speeds, the fastest at H, at least 1, unmeasured workers at H. */
#include <math.h>
#include <string.h>

#include "common/zps_dyl.h"
#include "common/zps_rng.h"
#include "tests/zps_check.h"

START_TEST(test_dyl_steps_in_proportion_to_speed)
{
    const double speed[] = {10, 10, 5, 2.5};
    uint32_t steps[4];
    ck_assert_int_eq(zps_dyl_steps(100, speed, 4, steps), ZPS_OK);
    ck_assert_uint_eq(steps[0], 100);
    ck_assert_uint_eq(steps[1], 100);
    ck_assert_uint_eq(steps[2], 50);
    ck_assert_uint_eq(steps[3], 25);
    // The case: one of 4 workers slowed 2x.
    const double slowed[] = {20, 20, 10, 20};
    ck_assert_int_eq(zps_dyl_steps(50, slowed, 4, steps), ZPS_OK);
    ck_assert_uint_eq(steps[2], 25);
    ck_assert_uint_eq(steps[3], 50);
}
END_TEST

START_TEST(test_dyl_rounds_to_nearest_and_takes_at_least_one)
{
    const double speed[] = {9, 3, 6, 0.01, 4.5};
    uint32_t steps[5];
    ck_assert_int_eq(zps_dyl_steps(10, speed, 5, steps), ZPS_OK);
    ck_assert_uint_eq(steps[0], 10);
    ck_assert_uint_eq(steps[1], 3); // 3.33
    ck_assert_uint_eq(steps[2], 7); // 6.67
    ck_assert_uint_eq(steps[3], 1); // 0.011: at least 1
    ck_assert_uint_eq(steps[4], 5); // 5 exactly
    const double tie[] = {4, 1};
    ck_assert_int_eq(zps_dyl_steps(2, tie, 2, steps), ZPS_OK);
    ck_assert_uint_eq(steps[1], 1); // 0.5: ties up
    ck_assert_int_eq(zps_dyl_steps(1, speed, 5, steps), ZPS_OK);
    for (int i = 0; i < 5; i++) {
        ck_assert_uint_eq(steps[i], 1); // H = 1: everyone syncs every step
    }
}
END_TEST

// Random speeds: every worker's round is within half of one of its own
// steps of the fastest one's (unless it is held at 1 step), and none
// takes more than H.
START_TEST(test_dyl_rounds_last_about_the_same_on_every_worker)
{
    enum { N = 64, H = 500 };
    double speed[N];
    uint32_t steps[N];
    zps_rng r;
    zps_rng_seed(&r, 19, 2);
    for (int t = 0; t < 100; t++) {
        double v_max = 0;
        for (int i = 0; i < N; i++) {
            speed[i] = pow(10.0, 3.0 * zps_rng_uniform(&r));
            v_max = fmax(v_max, speed[i]);
        }
        ck_assert_int_eq(zps_dyl_steps(H, speed, N, steps), ZPS_OK);
        for (int i = 0; i < N; i++) {
            ck_assert_uint_ge(steps[i], 1);
            ck_assert_uint_le(steps[i], H);
            if (speed[i] == v_max) {
                ck_assert_uint_eq(steps[i], H);
            }
            if (steps[i] > 1) {
                double off = fabs(steps[i] / speed[i] - H / v_max);
                ck_assert_double_le(off, 0.5 / speed[i] * (1 + 1e-12));
            }
        }
    }
}
END_TEST

// A speed that is 0, negative, NaN or Inf is "not measured": that worker
// takes H and does not set the pace of the others; none measured, all H.
START_TEST(test_dyl_unmeasured_workers_take_h)
{
    const double speed[] = {0, NAN, 8, 4, -1, INFINITY};
    uint32_t steps[6];
    ck_assert_int_eq(zps_dyl_steps(20, speed, 6, steps), ZPS_OK);
    const uint32_t want[] = {20, 20, 20, 10, 20, 20};
    ck_assert_mem_eq(steps, want, sizeof want);
    const double none[] = {0, NAN};
    ck_assert_int_eq(zps_dyl_steps(20, none, 2, steps), ZPS_OK);
    ck_assert_uint_eq(steps[0], 20);
    ck_assert_uint_eq(steps[1], 20);
    // Refused: H = 0, steps untouched. n = 0 is nothing to do.
    memset(steps, 0xee, sizeof steps);
    ck_assert_int_eq(zps_dyl_steps(0, speed, 6, steps), ZPS_EINVAL);
    ck_assert_uint_eq(steps[0], 0xeeeeeeeeu);
    ck_assert_int_eq(zps_dyl_steps(20, speed, 0, steps), ZPS_OK);
    ck_assert_uint_eq(steps[0], 0xeeeeeeeeu);
    // The largest H.
    const double two[] = {2, 1};
    ck_assert_int_eq(zps_dyl_steps(UINT32_MAX, two, 2, steps), ZPS_OK);
    ck_assert_uint_eq(steps[0], UINT32_MAX);
    ck_assert_uint_eq(steps[1], UINT32_MAX / 2 + 1); // 2147483647.5: ties up
}
END_TEST

Suite *zps_suite_dyl(void)
{
    Suite *s = suite_create("dyl");
    TCase *tc = tcase_create("dyl");
    tcase_add_test(tc, test_dyl_steps_in_proportion_to_speed);
    tcase_add_test(tc, test_dyl_rounds_to_nearest_and_takes_at_least_one);
    tcase_add_test(tc, test_dyl_rounds_last_about_the_same_on_every_worker);
    tcase_add_test(tc, test_dyl_unmeasured_workers_take_h);
    suite_add_tcase(s, tc);
    return s;
}
