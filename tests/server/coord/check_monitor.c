/* check_monitor.c - the straggler detector, on a clock of its own: equal
 * workers whose arrival order is noise are never flagged; a slowed one that
 * the steps wait for is, within a few steps, and cleared once it keeps up;
 * a slow one the split has made small (it holds nothing back) is not. */
#include <stdlib.h>
#include <string.h>

#include "server/coord/zps_monitor.h"
#include "tests/zps_check.h"

// xorshift: the tests' noise, the same every run.
static double s_noise(uint64_t *st)
{
    *st ^= *st << 13;
    *st ^= *st >> 7;
    *st ^= *st << 17;
    return (double)(*st >> 11) / 9007199254740992.0; // [0, 1)
}

typedef struct s_job {
    zps_monitor *m;
    double now;
    uint64_t step, noise;
} s_job;

// One step of n ranks: rank i computes samples[i] at ms_per_sample[i] (each
// with up to `jitter` of noise, as shared cores give) and pushes when done.
static void s_step(s_job *j, int n, const uint32_t *samples, const double *ms_per_sample,
                   double jitter)
{
    double longest = 0;
    for (int i = 0; i < n; i++) {
        double ms = samples[i] * ms_per_sample[i] * (1 + jitter * (2 * s_noise(&j->noise) - 1));
        zps_monitor_push(j->m, j->step, (uint32_t)i, samples[i], (float)ms, j->now + ms);
        longest = ms > longest ? ms : longest;
    }
    zps_monitor_step_done(j->m, j->step, longest, NULL);
    j->now += longest + 1;
    j->step++;
}

static bool s_flagged(const s_job *j, uint32_t rank)
{
    zps_monitor_view v;
    ck_assert(zps_monitor_view_of(j->m, rank, &v));
    return v.straggler;
}

// Steps until rank is flagged (at most max); max + 1 if never.
static uint64_t s_steps_to_flag(s_job *j, double slowdown, uint64_t max)
{
    uint32_t samples[2] = {64, 64};
    double per[2] = {0.1, 0.1 * slowdown};
    for (uint64_t k = 1; k <= max; k++) {
        s_step(j, 2, samples, per, 0.1);
        if (s_flagged(j, 1)) {
            return k;
        }
    }
    return max + 1;
}

START_TEST(test_monitor_never_flags_two_equal_workers_whoever_arrives_last)
{
    s_job j = {.m = zps_monitor_new(), .noise = 88172645463325252ull};
    uint32_t samples[2] = {64, 64};
    double per[2] = {0.1, 0.1}; // 6.4 ms a step, +-25 %: the later one by up to 3 ms
    for (int k = 0; k < 2000; k++) {
        s_step(&j, 2, samples, per, 0.25);
        ck_assert_msg(!s_flagged(&j, 0) && !s_flagged(&j, 1), "flagged at step %d", k);
    }
    zps_monitor_destroy(&j.m);
}
END_TEST

START_TEST(test_monitor_flags_a_worker_slowed_1_5x_within_30_steps_and_3x_within_10)
{
    s_job j = {.m = zps_monitor_new(), .noise = 7};
    ck_assert_uint_le(s_steps_to_flag(&j, 1.5, 30), 30);
    ck_assert(!s_flagged(&j, 0));
    zps_monitor_destroy(&j.m);
    j = (s_job){.m = zps_monitor_new(), .noise = 7};
    ck_assert_uint_le(s_steps_to_flag(&j, 3.0, 10), 10);
    zps_monitor_destroy(&j.m);
}
END_TEST

START_TEST(test_monitor_flags_the_slowed_worker_whichever_its_rank)
{
    s_job j = {.m = zps_monitor_new(), .noise = 11};
    uint32_t samples[3] = {64, 64, 64};
    double per[3] = {0.3, 0.1, 0.1}; // rank 0 3x slower
    for (int k = 0; k < 10; k++) {
        s_step(&j, 3, samples, per, 0.1);
    }
    ck_assert(s_flagged(&j, 0) && !s_flagged(&j, 1) && !s_flagged(&j, 2));
    zps_monitor_destroy(&j.m);
}
END_TEST

START_TEST(test_monitor_clears_a_worker_that_keeps_up_again_once_and_for_good)
{
    s_job j = {.m = zps_monitor_new(), .noise = 99};
    ck_assert_uint_le(s_steps_to_flag(&j, 3.0, 10), 10);
    uint32_t samples[2] = {64, 64};
    double per[2] = {0.1, 0.1};
    int changes = 0;
    bool was = true;
    for (int k = 0; k < 200; k++) {
        s_step(&j, 2, samples, per, 0.25);
        changes += s_flagged(&j, 1) != was;
        was = s_flagged(&j, 1);
    }
    ck_assert(!was);
    ck_assert_int_eq(changes, 1); // cleared, and no flapping after
    zps_monitor_destroy(&j.m);
}
END_TEST

START_TEST(test_monitor_does_not_flag_a_slow_worker_the_step_does_not_wait_for)
{
    // Adaptive split: 3x slower per sample, a third of the samples.
    s_job j = {.m = zps_monitor_new(), .noise = 5};
    uint32_t samples[2] = {96, 32};
    double per[2] = {0.1, 0.3};
    for (int k = 0; k < 500; k++) {
        s_step(&j, 2, samples, per, 0.1);
        ck_assert(!s_flagged(&j, 1));
    }
    zps_monitor_destroy(&j.m);
}
END_TEST

START_TEST(test_monitor_flags_nobody_alone_and_only_the_slow_one_of_three)
{
    s_job j = {.m = zps_monitor_new(), .noise = 3};
    uint32_t one[1] = {64};
    double slow[1] = {1.0};
    for (int k = 0; k < 50; k++) {
        s_step(&j, 1, one, slow, 0.1);
        ck_assert(!s_flagged(&j, 0)); // no peers to be slow against
    }
    zps_monitor_destroy(&j.m);
    j = (s_job){.m = zps_monitor_new(), .noise = 3};
    uint32_t samples[3] = {40, 40, 40};
    double per[3] = {0.1, 0.2, 0.1};
    for (int k = 0; k < 10; k++) {
        s_step(&j, 3, samples, per, 0.1);
    }
    ck_assert(!s_flagged(&j, 0) && s_flagged(&j, 1) && !s_flagged(&j, 2));
    zps_monitor_destroy(&j.m);
}
END_TEST

// A diloco round's row: what each worker reported with its pushes, and
// throughput over the samples of all its inner steps.
START_TEST(test_monitor_records_a_diloco_round_per_worker)
{
    zps_monitor *m = zps_monitor_new();
    ck_assert_ptr_nonnull(m);
    zps_monitor_push(m, 0, 0, 32, 100.0f, 1000.0);
    zps_monitor_round(m, 0, 0, 10, 0.5f, 4096, -1);
    zps_monitor_push(m, 0, 1, 32, 100.0f, 1010.0);
    zps_monitor_round(m, 0, 1, 5, 0.25f, 4096, -1);
    char *text = NULL;
    size_t len = 0;
    FILE *json = open_memstream(&text, &len);
    ck_assert_ptr_nonnull(json);
    zps_monitor_step_done(m, 0, 110.0, json);
    fclose(json);
    ck_assert_ptr_nonnull(strstr(text, "\"inner_steps\":10,\"inner_samples\":320"));
    ck_assert_ptr_nonnull(strstr(text, "\"inner_steps\":5,\"inner_samples\":160"));
    ck_assert_ptr_nonnull(strstr(text, "\"bytes\":4096"));
    zps_monitor_view v;
    ck_assert(zps_monitor_view_of(m, 0, &v));
    ck_assert_uint_eq(v.inner_steps, 10);
    ck_assert_float_eq(v.delta_norm, 0.5f);
    ck_assert_uint_eq(v.bytes, 4096);
    ck_assert_double_eq_tol(v.samples_per_s, 3200.0, 1e-9); // 320 samples in 100 ms
    ck_assert(zps_monitor_view_of(m, 1, &v));
    ck_assert_double_eq_tol(v.samples_per_s, 1600.0, 1e-9);
    free(text);
    zps_monitor_destroy(&m);
}
END_TEST

Suite *zps_suite_monitor(void)
{
    Suite *s = suite_create("monitor");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_monitor_never_flags_two_equal_workers_whoever_arrives_last);
    tcase_add_test(tc, test_monitor_flags_a_worker_slowed_1_5x_within_30_steps_and_3x_within_10);
    tcase_add_test(tc, test_monitor_flags_the_slowed_worker_whichever_its_rank);
    tcase_add_test(tc, test_monitor_clears_a_worker_that_keeps_up_again_once_and_for_good);
    tcase_add_test(tc, test_monitor_does_not_flag_a_slow_worker_the_step_does_not_wait_for);
    tcase_add_test(tc, test_monitor_flags_nobody_alone_and_only_the_slow_one_of_three);
    tcase_add_test(tc, test_monitor_records_a_diloco_round_per_worker);
    suite_add_tcase(s, tc);
    return s;
}
