/* check_optim.c - SGD updates and schedules against hand-computed values
 * (torch.optim.SGD semantics). */
#include <math.h>

#include "common/zps_optim.h"
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
    ck_assert_int_eq(zps_optim_check("adam", &ok), ZPS_EINVAL);
    ck_assert_int_eq(zps_optim_check("sgd", &nesterov_no_mu), ZPS_EINVAL);
    ck_assert_int_eq(zps_optim_check("sgd", &negative), ZPS_EINVAL);
    ck_assert_int_eq(zps_optim_check("sgd", &nan_lr), ZPS_EINVAL);
    ck_assert_int_eq(zps_optim_parse_schedule("cosine", &sched), ZPS_OK);
    ck_assert_int_eq(sched, ZPS_LR_COSINE);
    ck_assert_int_eq(zps_optim_parse_schedule("linear", &sched), ZPS_EINVAL);
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
    suite_add_tcase(s, tc);
    return s;
}
