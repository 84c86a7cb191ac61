/* check_outer.c - DiLoCo's outer step (zps_outer) against
 * torch.optim.SGD(nesterov=True) itself, through the values
 * tests/common/gen_outer_ref.py wrote into outer_ref.h, and by hand. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/zps_outer.h"
#include "common/zps_rng.h"
#include "tests/common/outer_ref.h"
#include "tests/zps_check.h"

// max |a - b| over max |ref|: relative to the array's scale, since single
// elements near zero carry last-bit differences of their own.
static double s_rel_diff(const float *a, const float *ref, size_t n)
{
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)ref[i]);
        diff = d > diff || isnan(d) ? d : diff;
        scale = fabs((double)ref[i]) > scale ? fabs((double)ref[i]) : scale;
    }
    return scale > 0 ? diff / scale : diff;
}

// max over the elements of |a - b| / max(|ref|, |ref - start|): relative to
// the element's value or to the distance it travelled from start, the
// larger (an element that passed near 0 carries the last bits of its steps,
// which are larger than itself).
static double s_elem_rel_diff(const float *a, const float *ref, const float *start, size_t n)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)ref[i]);
        double scale = fmax(fabs((double)ref[i]), fabs((double)ref[i] - (double)start[i]));
        double r = scale > 0 ? d / scale : d;
        worst = r > worst || isnan(r) ? r : worst;
    }
    return worst;
}

// One round as a shard runs it: each worker that arrived sends its delta
// with its samples; the shard averages and steps.
static void s_round(const zps_outer_cfg *cfg, float *params, float *buf, int r)
{
    double acc[OUTER_REF_N] = {0};
    double total = 0;
    for (int w = 0; w < OUTER_REF_WORKERS; w++) {
        uint32_t samples = outer_ref_samples[r][w];
        if (samples == 0) {
            continue; // did not arrive
        }
        zps_outer_accumulate(acc, samples, outer_ref_delta[r][w], OUTER_REF_N);
        total += samples;
    }
    ck_assert_int_eq(zps_outer_step(cfg, params, buf, acc, total, OUTER_REF_N), ZPS_OK);
}

// Each case of outer_ref.h: OUTER_REF_ROUNDS outer steps from the same
// parameters over the same workers' pseudo-gradients (one worker missing
// from each of two rounds) end within 1e-6 of torch's parameters and momentum buffer.
START_TEST(test_outer_follows_torch_sgd_nesterov_over_20_rounds)
{
    const outer_ref_case *c = &outer_ref_cases[_i];
    zps_outer_cfg cfg = {.lr = c->lr, .momentum = c->momentum};
    ck_assert_int_eq(zps_outer_validate(&cfg), ZPS_OK);
    float p[OUTER_REF_N], buf[OUTER_REF_N] = {0};
    memcpy(p, outer_ref_params0, sizeof p);
    for (int r = 0; r < OUTER_REF_ROUNDS; r++) {
        s_round(&cfg, p, buf, r);
    }
    double dp = s_rel_diff(p, c->params, OUTER_REF_N);
    double db = s_rel_diff(buf, c->buf, OUTER_REF_N);
    double ep = s_elem_rel_diff(p, c->params, outer_ref_params0, OUTER_REF_N);
    fprintf(stderr,
            "outer %s against torch: params %.3g (per element %.3g), momentum_buffer %.3g, "
            "relative\n",
            c->name, dp, ep, db);
    // torch's add(alpha) fuses its multiply-add (an FMA on AVX2), zps_optim
    // rounds twice: the parameters differ in the last bits of each step.
    ck_assert_msg(dp <= 1e-6, "%s: params %.3g from torch's", c->name, dp);
    ck_assert_msg(ep <= 1e-6, "%s: an element of params %.3g from torch's", c->name, ep);
    ck_assert_msg(db <= 1e-6, "%s: momentum buffer %.3g from torch's", c->name, db);
    // The rounds moved the parameters, by far more than the tolerance.
    ck_assert_double_gt(s_rel_diff(p, outer_ref_params0, OUTER_REF_N), 1e-2);
}
END_TEST

// The first step by hand: buf = mean (torch clones the gradient into it),
// theta -= lr * (1 + mu) * mean; and two workers' deltas averaged by their
// samples.
START_TEST(test_outer_first_step_by_hand)
{
    zps_outer_cfg cfg = {.lr = 0.5f, .momentum = 0.9f};
    float sync[2] = {1.0f, -2.0f};
    float local_a[2] = {0.5f, -2.0f}; // delta (0.5, 0), 3 samples
    float local_b[2] = {1.5f, -1.0f}; // delta (-0.5, -1), 1 sample
    float delta[2], p[2], buf[2] = {0};
    double acc[2] = {0};
    zps_outer_delta(sync, local_a, delta, 2);
    zps_outer_accumulate(acc, 3, delta, 2);
    zps_outer_delta(sync, local_b, delta, 2);
    zps_outer_accumulate(acc, 1, delta, 2);
    memcpy(p, sync, sizeof p);
    ck_assert_int_eq(zps_outer_step(&cfg, p, buf, acc, 4, 2), ZPS_OK);
    // mean = (0.25, -0.25)
    ck_assert_float_eq(buf[0], 0.25f);
    ck_assert_float_eq(buf[1], -0.25f);
    ck_assert_float_eq_tol(p[0], 1.0f - 0.5f * 1.9f * 0.25f, 1e-7f);
    ck_assert_float_eq_tol(p[1], -2.0f + 0.5f * 1.9f * 0.25f, 1e-7f);
    // The second step: buf = 0.9 * 0.25 + 0.25; theta -= lr * (0.25 + 0.9 * buf).
    float p1 = p[0];
    ck_assert_int_eq(zps_outer_step(&cfg, p, buf, acc, 4, 2), ZPS_OK);
    ck_assert_float_eq_tol(buf[0], 0.475f, 1e-7f);
    ck_assert_float_eq_tol(p[0], p1 - 0.5f * (0.25f + 0.9f * 0.475f), 1e-7f);
}
END_TEST

// lr 1 and momentum 0 (the H = 1 test): the outer step makes
// theta_sync the sample-weighted mean of the workers' theta_local, and
// touches no buffer (it may be NULL).
START_TEST(test_outer_lr1_momentum0_is_the_weighted_mean_of_the_workers)
{
    zps_outer_cfg cfg = {.lr = 1.0f, .momentum = 0.0f};
    zps_optim_cfg o = zps_outer_optim(&cfg);
    ck_assert(!o.nesterov);
    ck_assert_int_eq(zps_optim_validate(&o), ZPS_OK);
    float sync[3] = {0.25f, -1.0f, 3.0f};
    float local[2][3] = {{0.5f, -1.5f, 2.0f}, {0.0f, 0.5f, 4.0f}};
    const double samples[2] = {96, 32};
    double acc[3] = {0};
    float delta[3], p[3];
    for (int w = 0; w < 2; w++) {
        zps_outer_delta(sync, local[w], delta, 3);
        zps_outer_accumulate(acc, samples[w], delta, 3);
    }
    memcpy(p, sync, sizeof p);
    ck_assert_int_eq(zps_outer_step(&cfg, p, NULL, acc, 128, 3), ZPS_OK);
    for (int i = 0; i < 3; i++) {
        float mean = (float)((96 * (double)local[0][i] + 32 * (double)local[1][i]) / 128);
        ck_assert_float_eq_tol(p[i], mean, 1e-6f);
    }
}
END_TEST

// The H = 1 case at the level of the math: one inner SGD step at
// lr eta on each worker, then the outer step with lr 1 and momentum 0,
// equals synchronous SGD at eta on the sample-weighted mean gradient (as a
// shard averages it), within 1e-6, over 50 steps of 3 unlike workers.
START_TEST(test_outer_h1_equals_synchronous_sgd)
{
    enum { N = 300, W = 3, STEPS = 50 };
    const float eta = 0.05f;
    const double samples[W] = {40, 17, 71};
    static float sync_p[N], dl_p[N], local[N], delta[N], grad[W][N], mean[N];
    static double acc[N], gacc[N];
    zps_rng r;
    zps_rng_seed(&r, 19, 3);
    for (int i = 0; i < N; i++) {
        sync_p[i] = dl_p[i] = (float)(zps_rng_uniform(&r) * 2 - 1);
    }
    zps_optim_cfg inner = {.kind = ZPS_OPTIM_SGD, .lr = eta};
    zps_outer_cfg outer = {.lr = 1.0f, .momentum = 0.0f};
    double worst = 0, ulps = 0;
    for (int t = 0; t < STEPS; t++) {
        memset(acc, 0, sizeof acc);
        memset(gacc, 0, sizeof gacc);
        for (int w = 0; w < W; w++) {
            for (int i = 0; i < N; i++) {
                // A gradient that depends on the parameters, as a real one
                // does: each run takes it at its own parameters.
                double k = 1 + 0.3 * w, noise = 0.2 * zps_rng_normal(&r);
                grad[w][i] = (float)(dl_p[i] * k + noise);
                gacc[i] += samples[w] * (double)(float)(sync_p[i] * k + noise);
            }
            memcpy(local, dl_p, sizeof local);
            zps_optim_sgd(&inner, eta, local, NULL, grad[w], N);
            zps_outer_delta(dl_p, local, delta, N);
            zps_outer_accumulate(acc, samples[w], delta, N);
        }
        ck_assert_int_eq(zps_outer_step(&outer, dl_p, NULL, acc, 40 + 17 + 71, N), ZPS_OK);
        for (int i = 0; i < N; i++) {
            mean[i] = (float)(gacc[i] / (40 + 17 + 71));
        }
        zps_optim_sgd(&inner, eta, sync_p, NULL, mean, N);
        double d = s_rel_diff(dl_p, sync_p, N);
        worst = fmax(worst, d);
        ulps = 0;
        for (int i = 0; i < N; i++) {
            double u = fabs((double)dl_p[i] - (double)sync_p[i]) /
                       (double)(nextafterf(fabsf(sync_p[i]), INFINITY) - fabsf(sync_p[i]));
            ulps = fmax(ulps, u);
        }
    }
    // Each step, delta = theta - fl(theta - eta g) rounds to theta's last
    // bit where synchronous SGD's eta g does not: the runs part by a few
    // units in the last place, which the contraction of the steps keeps
    // from growing.
    fprintf(stderr,
            "outer H = 1 against synchronous SGD: at most %.3g relative (to max|theta|) over %d "
            "steps, last step %.0f units in the last place\n",
            worst, STEPS, ulps);
    ck_assert_double_le(worst, 1e-6);
}
END_TEST

// The update of an element depends on that element alone: any cut of the
// vector into calls (shards, buckets) gives the same bits, across the
// step's internal blocks too.
START_TEST(test_outer_is_the_same_bits_however_the_vector_is_cut)
{
    enum { N = 700 };
    static float whole[N], cut[N], bw[N], bc[N];
    static double acc[N];
    for (int i = 0; i < N; i++) {
        whole[i] = cut[i] = sinf((float)i);
    }
    memset(bw, 0, sizeof bw);
    memset(bc, 0, sizeof bc);
    zps_outer_cfg cfg = {.lr = ZPS_OUTER_LR, .momentum = ZPS_OUTER_MOMENTUM};
    const size_t bounds[] = {0, 1, 255, 256, 513, 699, N};
    for (int r = 0; r < 5; r++) {
        for (int i = 0; i < N; i++) {
            acc[i] = 1e-3 * cos((double)(i * (r + 1))) * 640;
        }
        ck_assert_int_eq(zps_outer_step(&cfg, whole, bw, acc, 640, N), ZPS_OK);
        for (size_t k = 0; k + 1 < sizeof bounds / sizeof bounds[0]; k++) {
            size_t lo = bounds[k], len = bounds[k + 1] - lo;
            ck_assert_int_eq(zps_outer_step(&cfg, cut + lo, bc + lo, acc + lo, 640, len),
                             ZPS_OK);
        }
    }
    ck_assert_mem_eq(whole, cut, sizeof whole);
    ck_assert_mem_eq(bw, bc, sizeof bw);
}
END_TEST

START_TEST(test_outer_refuses_bad_settings_and_an_empty_round)
{
    zps_outer_cfg ok = {.lr = ZPS_OUTER_LR, .momentum = ZPS_OUTER_MOMENTUM};
    ck_assert_int_eq(zps_outer_validate(&ok), ZPS_OK);
    zps_optim_cfg o = zps_outer_optim(&ok);
    ck_assert_int_eq(o.kind, ZPS_OPTIM_SGD);
    ck_assert(o.nesterov);
    ck_assert_float_eq(o.weight_decay, 0);
    ck_assert_int_eq(zps_optim_validate(&o), ZPS_OK);
    zps_outer_cfg bad[] = {ok, ok, ok, ok, ok, ok};
    bad[0].lr = -0.1f;
    bad[1].lr = NAN;
    bad[2].lr = INFINITY;
    bad[3].momentum = 1.0f;
    bad[4].momentum = -0.1f;
    bad[5].momentum = NAN;
    float p[2] = {1, 2}, buf[2] = {3, 4};
    const double acc[2] = {1, 1};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_msg(zps_outer_validate(&bad[i]) == ZPS_EINVAL, "setting %zu accepted", i);
        ck_assert_int_eq(zps_outer_step(&bad[i], p, buf, acc, 1, 2), ZPS_EINVAL);
    }
    // No worker arrived: no mean, nothing moves.
    ck_assert_int_eq(zps_outer_step(&ok, p, buf, acc, 0, 2), ZPS_EINVAL);
    ck_assert_int_eq(zps_outer_step(&ok, p, buf, acc, NAN, 2), ZPS_EINVAL);
    ck_assert_int_eq(zps_outer_step(&ok, p, buf, acc, -1, 2), ZPS_EINVAL);
    ck_assert_float_eq(p[0], 1);
    ck_assert_float_eq(p[1], 2);
    ck_assert_float_eq(buf[0], 3);
    ck_assert_float_eq(buf[1], 4);
}
END_TEST

// --fragments: the cuts tile the range, each fragment gets (hi - lo) / F
// elements (one more at most), a bucket is cut only where a fragment ends,
// and one fragment leaves the buckets as they are.
START_TEST(test_outer_fragments_cut_the_range_into_equal_parts)
{
    zps_outer_mode one = {.diloco = true, .inner_steps = 12, .fragments = 1};
    zps_outer_mode four = one;
    four.fragments = 4;
    // A range [100, 203) of 103 elements holding three buckets.
    const zps_bucket in[3] = {{150, 203}, {100, 101}, {101, 150}};
    zps_bucket out[16];
    ck_assert_int_eq(zps_outer_cut_buckets(&one, 100, 203, in, 3, out, 16), 3);
    ck_assert(memcmp(out, in, sizeof in) == 0);
    int n = zps_outer_cut_buckets(&four, 100, 203, in, 3, out, 16);
    ck_assert_int_eq(n, 6); // fragments start at 100, 125, 151, 177
    uint64_t size[4] = {0}, covered = 0;
    for (int k = 0; k < n; k++) {
        uint32_t f = zps_outer_fragment_at(&four, 100, 203, out[k].lo);
        ck_assert_uint_eq(zps_outer_fragment_at(&four, 100, 203, out[k].hi - 1), f);
        size[f] += out[k].hi - out[k].lo;
        covered += out[k].hi - out[k].lo;
    }
    ck_assert_uint_eq(covered, 103);
    for (int f = 0; f < 4; f++) {
        ck_assert_msg(size[f] == 25 || size[f] == 26, "fragment %d has %llu", f,
                      (unsigned long long)size[f]);
    }
    ck_assert_int_eq(zps_outer_cut_buckets(&four, 100, 203, in, 3, out, 5), -1);
    // F at most H, and within its bound.
    ck_assert_int_eq(zps_outer_mode_check(&four), ZPS_OK);
    four.fragments = 13;
    ck_assert_int_eq(zps_outer_mode_check(&four), ZPS_EINVAL);
    four.inner_steps = 10 * ZPS_OUTER_MAX_FRAGMENTS;
    four.fragments = 2 * ZPS_OUTER_MAX_FRAGMENTS;
    ck_assert_int_eq(zps_outer_mode_check(&four), ZPS_EINVAL);
    ck_assert_uint_eq(zps_outer_step_batch(&one, 3), 36);
    ck_assert_uint_eq(zps_outer_step_batches(&one, 3), 12);
    // H = 10 in 4 steps: they end at inner steps 2, 5, 7 and 10 of a round.
    four = one;
    four.inner_steps = 10;
    four.fragments = 4;
    static const uint32_t len[8] = {2, 3, 2, 3, 2, 3, 2, 3};
    for (uint64_t t = 0; t < 8; t++) {
        ck_assert_uint_eq(zps_outer_step_batches(&four, t), len[t]);
    }
    ck_assert_uint_eq(zps_outer_step_batch(&four, 6), 15);
    ck_assert_uint_eq(zps_outer_fragment_of_step(&four, 6), 2);
}
END_TEST

Suite *zps_suite_outer(void)
{
    Suite *s = suite_create("outer");
    TCase *tc = tcase_create("outer");
    tcase_add_loop_test(tc, test_outer_follows_torch_sgd_nesterov_over_20_rounds, 0,
                        (int)(sizeof outer_ref_cases / sizeof outer_ref_cases[0]));
    tcase_add_test(tc, test_outer_first_step_by_hand);
    tcase_add_test(tc, test_outer_lr1_momentum0_is_the_weighted_mean_of_the_workers);
    tcase_add_test(tc, test_outer_h1_equals_synchronous_sgd);
    tcase_add_test(tc, test_outer_is_the_same_bits_however_the_vector_is_cut);
    tcase_add_test(tc, test_outer_refuses_bad_settings_and_an_empty_round);
    tcase_add_test(tc, test_outer_fragments_cut_the_range_into_equal_parts);
    suite_add_tcase(s, tc);
    return s;
}
