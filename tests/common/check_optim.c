/* check_optim.c - SGD updates and schedules against hand-computed values
 * (torch.optim.SGD semantics); Adam and AdamW against torch.optim.Adam and
 * AdamW themselves, through the values tests/common/gen_adam_ref.py wrote
 * into adam_ref.h. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/zps_optim.h"
#include "tests/common/adam_ref.h"
#include "tests/zps_check.h"

#define EPS 1e-6f

START_TEST(test_optim_plain_sgd_with_weight_decay)
{
    zps_optim_cfg cfg = {.lr = 0.1f, .weight_decay = 0.01f};
    float p[2] = {1.0f, -2.0f}, buf[2] = {0}, g[2] = {0.5f, 0.25f};
    zps_optim_sgd(&cfg, 0.1f, p, buf, g, 2);
    // p - lr * (g + wd * p)
    ck_assert_float_eq_tol(p[0], 1.0f - 0.1f * (0.5f + 0.01f), EPS);
    ck_assert_float_eq_tol(p[1], -2.0f - 0.1f * (0.25f - 0.02f), EPS);
}
END_TEST

START_TEST(test_optim_momentum_two_steps)
{
    zps_optim_cfg cfg = {.lr = 0.1f, .momentum = 0.9f};
    float p[1] = {1.0f}, buf[1] = {0}, g1[1] = {1.0f}, g2[1] = {0.5f};
    zps_optim_sgd(&cfg, 0.1f, p, buf, g1, 1);
    // step 1: buf = g = 1, p = 1 - 0.1 = 0.9
    ck_assert_float_eq_tol(buf[0], 1.0f, EPS);
    ck_assert_float_eq_tol(p[0], 0.9f, EPS);
    zps_optim_sgd(&cfg, 0.1f, p, buf, g2, 1);
    // step 2: buf = 0.9 * 1 + 0.5 = 1.4, p = 0.9 - 0.14 = 0.76
    ck_assert_float_eq_tol(buf[0], 1.4f, EPS);
    ck_assert_float_eq_tol(p[0], 0.76f, EPS);
}
END_TEST

START_TEST(test_optim_nesterov_two_steps)
{
    zps_optim_cfg cfg = {.lr = 0.1f, .momentum = 0.9f, .nesterov = true};
    float p[1] = {1.0f}, buf[1] = {0}, g1[1] = {1.0f}, g2[1] = {0.5f};
    zps_optim_sgd(&cfg, 0.1f, p, buf, g1, 1);
    // buf = 1, update g + mu * buf = 1.9, p = 1 - 0.19 = 0.81
    ck_assert_float_eq_tol(p[0], 0.81f, EPS);
    zps_optim_sgd(&cfg, 0.1f, p, buf, g2, 1);
    // buf = 0.9 + 0.5 = 1.4, update 0.5 + 1.26 = 1.76, p = 0.81 - 0.176 = 0.634
    ck_assert_float_eq_tol(p[0], 0.634f, EPS);
}
END_TEST

START_TEST(test_optim_cosine_schedule_with_warmup)
{
    zps_optim_cfg cfg = {.lr = 0.05f, .schedule = ZPS_LR_COSINE, .total_steps = 100};
    ck_assert_float_eq_tol(zps_optim_lr_at(&cfg, 0), 0.05f, EPS);
    ck_assert_float_eq_tol(zps_optim_lr_at(&cfg, 50), 0.025f, EPS);
    ck_assert_float_eq_tol(zps_optim_lr_at(&cfg, 25), 0.05f * 0.5f * (1 + cosf(M_PI / 4)), EPS);
    ck_assert_float_eq_tol(zps_optim_lr_at(&cfg, 100), 0.0f, EPS);
    cfg.warmup_steps = 10;
    ck_assert_float_eq_tol(zps_optim_lr_at(&cfg, 0), 0.005f, EPS);
    ck_assert_float_eq_tol(zps_optim_lr_at(&cfg, 9), 0.05f, EPS);
    ck_assert_float_eq_tol(zps_optim_lr_at(&cfg, 10), 0.05f, EPS);
    ck_assert_float_eq_tol(zps_optim_lr_at(&cfg, 55), 0.025f, EPS);
    cfg.schedule = ZPS_LR_CONSTANT;
    ck_assert_float_eq_tol(zps_optim_lr_at(&cfg, 99), 0.05f, EPS);
}
END_TEST

START_TEST(test_optim_refuses_bad_settings)
{
    zps_optim_cfg ok = {.lr = 0.1f, .momentum = 0.9f};
    zps_optim_cfg nesterov_no_mu = {.lr = 0.1f, .nesterov = true};
    zps_optim_cfg negative = {.lr = -0.1f};
    zps_optim_cfg nan_lr = {.lr = NAN};
    zps_lr_schedule sched;
    ck_assert_int_eq(zps_optim_check("sgd", &ok), ZPS_OK);
    ck_assert_int_eq(zps_optim_check("adam", &ok), ZPS_EINVAL); // the settings are SGD's
    ck_assert_int_eq(zps_optim_check("lamb", &ok), ZPS_EINVAL);
    ck_assert_int_eq(zps_optim_check("sgd", &nesterov_no_mu), ZPS_EINVAL);
    ck_assert_int_eq(zps_optim_check("sgd", &negative), ZPS_EINVAL);
    ck_assert_int_eq(zps_optim_check("sgd", &nan_lr), ZPS_EINVAL);
    ck_assert_int_eq(zps_optim_parse_schedule("cosine", &sched), ZPS_OK);
    ck_assert_int_eq(sched, ZPS_LR_COSINE);
    ck_assert_int_eq(zps_optim_parse_schedule("linear", &sched), ZPS_OK);
    ck_assert_int_eq(sched, ZPS_LR_LINEAR);
    ck_assert_int_eq(zps_optim_parse_schedule("step", &sched), ZPS_OK);
    ck_assert_int_eq(sched, ZPS_LR_STEP);
    ck_assert_int_eq(zps_optim_parse_schedule("exponential", &sched), ZPS_EINVAL);
    zps_optim_cfg no_size = {.lr = 0.1f, .schedule = ZPS_LR_STEP, .gamma = 0.5};
    ck_assert_int_eq(zps_optim_validate(&no_size), ZPS_EINVAL);
    no_size.step_size = 3;
    ck_assert_int_eq(zps_optim_validate(&no_size), ZPS_OK);
}
END_TEST

// The values torch 1.13's schedulers gave an SGD of lr 0.05 stepped once a
// step (/usr/bin/python3 with Debian's python3-torch):
// LinearLR(o, start_factor=1.0, end_factor=0.0, total_iters=90) and
// StepLR(o, step_size=7, gamma=0.5); here after 10 steps of warm-up, so
// scheduler step t is zps step 10 + t.
START_TEST(test_optim_linear_and_step_schedules_follow_torch)
{
    static const struct { uint64_t t; double lr; } linear[] = {
        {0, 0.05}, {1, 0.04944444444444445}, {45, 0.02500000000000002},
        {89, 0.0005555555555555564}, {90, 0.0}, {99, 0.0},
    };
    static const struct { uint64_t t; double lr; } step[] = {
        {0, 0.05}, {6, 0.05}, {7, 0.025}, {13, 0.025}, {14, 0.0125}, {39, 0.0015625},
    };
    zps_optim_cfg cfg = {.lr = 0.05f, .schedule = ZPS_LR_LINEAR, .warmup_steps = 10,
                         .total_steps = 100};
    for (size_t i = 0; i < sizeof linear / sizeof linear[0]; i++) {
        ck_assert_float_eq_tol(zps_optim_lr_at(&cfg, 10 + linear[i].t), (float)linear[i].lr,
                               1e-8f);
    }
    ck_assert_float_eq_tol(zps_optim_lr_at(&cfg, 4), 0.025f, EPS); // the warm-up
    cfg = (zps_optim_cfg){.lr = 0.05f, .schedule = ZPS_LR_STEP, .warmup_steps = 10,
                          .total_steps = 100, .step_size = 7, .gamma = 0.5};
    for (size_t i = 0; i < sizeof step / sizeof step[0]; i++) {
        ck_assert_float_eq(zps_optim_lr_at(&cfg, 10 + step[i].t), (float)step[i].lr);
    }
}
END_TEST

// ---------------------------------------------------------------- Adam, AdamW

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
    return diff / scale;
}

// Each case of adam_ref.h: ADAM_REF_STEPS updates from the same parameters
// and gradients end within 1e-6 of torch's parameters and both moments.
START_TEST(test_optim_adam_and_adamw_follow_torch_over_20_steps)
{
    const adam_ref_case *c = &adam_ref_cases[_i];
    float p[ADAM_REF_N], m[ADAM_REF_N] = {0}, v[ADAM_REF_N] = {0};
    memcpy(p, adam_ref_params0, sizeof p);
    ck_assert_int_eq(zps_optim_validate(&c->cfg), ZPS_OK);
    for (uint64_t t = 0; t < ADAM_REF_STEPS; t++) {
        float lr = zps_optim_lr_at(&c->cfg, t);
        ck_assert_float_eq(lr, c->cfg.lr); // constant schedule
        zps_optim_adam(&c->cfg, lr, t + 1, p, m, v, adam_ref_grad[t], ADAM_REF_N);
    }
    double dp = s_rel_diff(p, c->params, ADAM_REF_N);
    double dm = s_rel_diff(m, c->exp_avg, ADAM_REF_N);
    double dv = s_rel_diff(v, c->exp_avg_sq, ADAM_REF_N);
    fprintf(stderr, "%s against torch: params %.3g, exp_avg %.3g, exp_avg_sq %.3g (relative)\n",
            c->name, dp, dm, dv);
    ck_assert_msg(dp <= 1e-6, "%s: params %.3g from torch's", c->name, dp);
    ck_assert_msg(dm <= 1e-6, "%s: exp_avg %.3g from torch's", c->name, dm);
    ck_assert_msg(dv <= 1e-6, "%s: exp_avg_sq %.3g from torch's", c->name, dv);
    // The run moved the parameters, by far more than the tolerance.
    ck_assert_double_gt(s_rel_diff(p, adam_ref_params0, ADAM_REF_N), 1e-2);
}
END_TEST

// Step 1 by hand: m = (1 - b1) g, v = (1 - b2) g^2, and with the bias
// corrections the update is lr * g / (|g| + eps): lr, whatever |g|.
START_TEST(test_optim_adam_first_step_moves_each_parameter_by_lr)
{
    zps_optim_cfg cfg = {.kind = ZPS_OPTIM_ADAM, .lr = 0.01f, .beta1 = 0.9, .beta2 = 0.999,
                         .eps = 1e-8};
    float p[4] = {1, -1, 0.5f, 2}, m[4] = {0}, v[4] = {0}, g[4] = {0.5f, -4, 1e-3f, 0};
    zps_optim_adam(&cfg, cfg.lr, 1, p, m, v, g, 4);
    ck_assert_float_eq_tol(p[0], 1 - 0.01f, 1e-6f);
    ck_assert_float_eq_tol(p[1], -1 + 0.01f, 1e-6f);
    ck_assert_float_eq_tol(p[2], 0.5f - 0.01f, 1e-6f);
    ck_assert_float_eq(p[3], 2); // no gradient, no weight decay: no move, no NaN
    ck_assert_float_eq_tol(m[1], 0.1f * -4, 1e-7f);
    ck_assert_float_eq_tol(v[1], 0.001f * 16, 1e-8f);
}
END_TEST

// Weight decay: Adam adds wd * p to the gradient (so it goes through the
// moments), AdamW shrinks p by lr * wd * p first and leaves the moments alone.
START_TEST(test_optim_adam_l2_and_adamw_decoupled_decay)
{
    zps_optim_cfg adam = {.kind = ZPS_OPTIM_ADAM, .lr = 0.1f, .weight_decay = 0.5f,
                          .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
    zps_optim_cfg adamw = adam;
    adamw.kind = ZPS_OPTIM_ADAMW;
    float p[1] = {2}, m[1] = {0}, v[1] = {0}, g[1] = {0};
    zps_optim_adam(&adam, adam.lr, 1, p, m, v, g, 1);
    // g' = 0 + 0.5 * 2 = 1: m = 0.1, v = 0.001, p = 2 - 0.1
    ck_assert_float_eq_tol(m[0], 0.1f, 1e-7f);
    ck_assert_float_eq_tol(v[0], 0.001f, 1e-9f);
    ck_assert_float_eq_tol(p[0], 1.9f, 1e-6f);
    p[0] = 2, m[0] = 0, v[0] = 0;
    zps_optim_adam(&adamw, adamw.lr, 1, p, m, v, g, 1);
    // p = 2 * (1 - 0.1 * 0.5) = 1.9, and no gradient: the moments stay 0
    ck_assert_float_eq_tol(p[0], 1.9f, 1e-6f);
    ck_assert_float_eq(m[0], 0);
    ck_assert_float_eq(v[0], 0);
}
END_TEST

// The update of an element depends on that element alone: any cut of the
// vector into calls (shards, blocks) gives the same bits.
START_TEST(test_optim_adamw_is_the_same_bits_however_the_vector_is_cut)
{
    const adam_ref_case *c = &adam_ref_cases[1];
    float whole[ADAM_REF_N], mw[ADAM_REF_N] = {0}, vw[ADAM_REF_N] = {0};
    float cut[ADAM_REF_N], mc[ADAM_REF_N] = {0}, vc[ADAM_REF_N] = {0};
    memcpy(whole, adam_ref_params0, sizeof whole);
    memcpy(cut, adam_ref_params0, sizeof cut);
    const size_t bounds[] = {0, 1, 7, 100, 101, 255, ADAM_REF_N};
    for (uint64_t t = 0; t < ADAM_REF_STEPS; t++) {
        zps_optim_adam(&c->cfg, c->cfg.lr, t + 1, whole, mw, vw, adam_ref_grad[t], ADAM_REF_N);
        for (size_t k = 0; k + 1 < sizeof bounds / sizeof bounds[0]; k++) {
            size_t lo = bounds[k], len = bounds[k + 1] - lo;
            zps_optim_adam(&c->cfg, c->cfg.lr, t + 1, cut + lo, mc + lo, vc + lo,
                           adam_ref_grad[t] + lo, len);
        }
    }
    ck_assert_mem_eq(whole, cut, sizeof whole);
    ck_assert_mem_eq(mw, mc, sizeof mw);
    ck_assert_mem_eq(vw, vc, sizeof vw);
}
END_TEST

START_TEST(test_optim_refuses_bad_adam_settings)
{
    zps_optim_cfg ok = {.kind = ZPS_OPTIM_ADAMW, .lr = 1e-3f, .weight_decay = 0.01f,
                        .beta1 = ZPS_OPTIM_BETA1, .beta2 = ZPS_OPTIM_BETA2, .eps = ZPS_OPTIM_EPS};
    ck_assert_int_eq(zps_optim_check("adamw", &ok), ZPS_OK);
    ck_assert_int_eq(zps_optim_check("adam", &ok), ZPS_EINVAL); // not the kind it holds
    zps_optim_cfg bad[] = {ok, ok, ok, ok, ok, ok, ok, ok, ok};
    bad[0].beta1 = 1;
    bad[1].beta2 = -0.1;
    bad[2].beta2 = NAN;
    bad[3].eps = 0;
    bad[4].eps = -1e-8;
    bad[5].eps = INFINITY;
    bad[6].lr = -1e-3f;
    bad[7].weight_decay = -0.01f;
    bad[8].kind = (zps_optim_kind)3;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_msg(zps_optim_validate(&bad[i]) == ZPS_EINVAL, "setting %zu accepted", i);
    }
    zps_optim_cfg zero_betas = ok;
    zero_betas.beta1 = 0;
    zero_betas.beta2 = 0;
    ck_assert_int_eq(zps_optim_validate(&zero_betas), ZPS_OK); // [0, 1), as torch
    zps_optim_kind kind;
    ck_assert_int_eq(zps_optim_parse_kind("adam", &kind), ZPS_OK);
    ck_assert_int_eq(kind, ZPS_OPTIM_ADAM);
    ck_assert_int_eq(zps_optim_parse_kind("AdamW", &kind), ZPS_EINVAL);
    ck_assert_str_eq(zps_optim_name(ZPS_OPTIM_ADAMW), "adamw");
    ck_assert_int_eq(zps_optim_state_floats(ZPS_OPTIM_SGD), 1);
    ck_assert_int_eq(zps_optim_state_floats(ZPS_OPTIM_ADAM), 2);
}
END_TEST

Suite *zps_suite_optim(void)
{
    Suite *s = suite_create("optim");
    TCase *tc = tcase_create("sgd");
    tcase_add_test(tc, test_optim_plain_sgd_with_weight_decay);
    tcase_add_test(tc, test_optim_momentum_two_steps);
    tcase_add_test(tc, test_optim_nesterov_two_steps);
    tcase_add_test(tc, test_optim_cosine_schedule_with_warmup);
    tcase_add_test(tc, test_optim_refuses_bad_settings);
    tcase_add_test(tc, test_optim_linear_and_step_schedules_follow_torch);
    suite_add_tcase(s, tc);
    TCase *adam = tcase_create("adam");
    tcase_add_loop_test(adam, test_optim_adam_and_adamw_follow_torch_over_20_steps, 0,
                        (int)(sizeof adam_ref_cases / sizeof adam_ref_cases[0]));
    tcase_add_test(adam, test_optim_adam_first_step_moves_each_parameter_by_lr);
    tcase_add_test(adam, test_optim_adam_l2_and_adamw_decoupled_decay);
    tcase_add_test(adam, test_optim_adamw_is_the_same_bits_however_the_vector_is_cut);
    tcase_add_test(adam, test_optim_refuses_bad_adam_settings);
    suite_add_tcase(s, adam);
    return s;
}
