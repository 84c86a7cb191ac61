/* check_client.c - libzps's public API without a job: versions, options,
 * error codes with their sentences, calls out of order refused, the log
 * hook. (Joining and training: tests/lib/install.sh, and every
 * integration test, whose zps-worker runs on this API.) */
#include <string.h>

#include "include/zps.h"
#include "tests/zps_check.h"

START_TEST(test_client_version)
{
    int major = -1, minor = -1, patch = -1;
    ck_assert_int_eq(zps_version(&major, &minor, &patch), ZPS_VERSION);
    ck_assert_int_eq(major, ZPS_VERSION_MAJOR);
    ck_assert_int_eq(minor, ZPS_VERSION_MINOR);
    ck_assert_int_eq(patch, ZPS_VERSION_PATCH);
    ck_assert_int_eq(zps_version(NULL, NULL, NULL), ZPS_VERSION);
}
END_TEST

START_TEST(test_client_options_refused_with_a_sentence)
{
    ck_assert_ptr_null(zps_client_new(NULL));
    zps_client *c = zps_client_new("tcp://127.0.0.1:1");
    ck_assert_ptr_nonnull(c);
    ck_assert_int_eq(zps_errcode(c), ZPS_OK);
    ck_assert_str_eq(zps_errmsg(c), "");
    ck_assert_int_eq(zps_client_set_int(c, ZPS_OPT_HEARTBEAT_MS, 1), ZPS_EINVAL);
    ck_assert_int_eq(zps_errcode(c), ZPS_EINVAL);
    ck_assert_ptr_nonnull(strstr(zps_errmsg(c), "10..3600000"));
    ck_assert_int_eq(zps_client_set_int(c, ZPS_OPT_HEARTBEAT_MS, 50), ZPS_OK);
    ck_assert_str_eq(zps_errmsg(c), ""); // a call that works clears it
    ck_assert_int_eq(zps_client_set_int(c, ZPS_OPT_DEVICE, 1), ZPS_EINVAL);
    ck_assert_int_eq(zps_client_set_str(c, ZPS_OPT_SHARE, "1"), ZPS_EINVAL);
    ck_assert_int_eq(zps_client_set_str(c, ZPS_OPT_DEVICE, "cuda:0"), ZPS_OK);
    ck_assert_int_eq(zps_client_set_int(c, ZPS_OPT_SHARE, -1), ZPS_EINVAL);
    ck_assert_int_eq(zps_client_set_curve(c, "/nonexistent/secret", "/nonexistent/pub"),
                     ZPS_ENOENT);
    ck_assert_str_ne(zps_errmsg(c), "");
    zps_client_destroy(&c);
    ck_assert_ptr_null(c);
    zps_client_destroy(&c); // NULL is fine
}
END_TEST

START_TEST(test_client_calls_out_of_order)
{
    zps_client *c = zps_client_new("tcp://127.0.0.1:1");
    ck_assert_int_eq(zps_join(c), ZPS_EINVAL); // not connected
    ck_assert_uint_eq(zps_info_u64(c, ZPS_INFO_N_PARAMS), 0);
    ck_assert_str_eq(zps_info_str(c, ZPS_INFO_MODEL), "");
    ck_assert_uint_eq(zps_info_u64(c, ZPS_INFO_INNER_OPTIM), 0);
    ck_assert(zps_info_f64(c, ZPS_INFO_INNER_LR) == 0);
    ck_assert(zps_info_f64(NULL, ZPS_INFO_INNER_EPS) == 0);
    ck_assert(zps_inner_lr(c, 0) == 0);
    uint64_t lo, hi;
    ck_assert_int_eq(zps_bucket_range(c, 0, &lo, &hi), ZPS_ERANGE);
    float p[4];
    ck_assert_int_eq(zps_set_params(c, p, 4), ZPS_EINVAL);
    ck_assert_int_eq(zps_set_dataset(c, 100, 10), ZPS_EINVAL);
    zps_work w;
    ck_assert_int_eq(zps_next_work(c, &w), ZPS_NEXT_ERROR);
    ck_assert_ptr_nonnull(strstr(zps_errmsg(c), "zps_set_params"));
    memset(&w, 0, sizeof w);
    w.kind = ZPS_WORK_TRAIN;
    ck_assert_int_eq(zps_work_start(c, &w), ZPS_EINVAL);
    ck_assert_int_eq(zps_work_done(c, &w), ZPS_EINVAL);
    ck_assert_int_eq(zps_leave(c), ZPS_OK); // not joined: nothing to say
    zps_client_destroy(&c);
}
END_TEST

// The declared optimizer's calls (1.4) refuse bad input in one line each.
START_TEST(test_client_declared_optimizer_refusals)
{
    zps_client *c = zps_client_new("tcp://127.0.0.1:1");
    int64_t shape[1] = {4};
    ck_assert_int_eq(zps_declare_tensor(c, "w", 1, shape), ZPS_OK);
    ck_assert_int_eq(zps_declare_group(c, 0, 7, 0.1, 0, 0, 0, 0.9, 0.999, 1e-8), ZPS_EINVAL);
    ck_assert_ptr_nonnull(strstr(zps_errmsg(c), "ZPS_INNER_SGD"));
    ck_assert_int_eq(zps_declare_group(c, 1, ZPS_INNER_SGD, 0.1, 0, 0, 0, 0, 0, 0), ZPS_EINVAL);
    ck_assert_ptr_nonnull(strstr(zps_errmsg(c), "in order"));
    ck_assert_int_eq(zps_declare_group(c, 0, ZPS_INNER_ADAMW, 0.1, 0, 0, 0.01, 0.9, 1.5, 1e-8),
                     ZPS_EINVAL);
    ck_assert_ptr_nonnull(strstr(zps_errmsg(c), "group 0 (adamw): beta2"));
    ck_assert_int_eq(zps_declare_group(c, 0, ZPS_INNER_SGD, 0.1, 0, 1, 0, 0, 0, 0), ZPS_EINVAL);
    ck_assert_ptr_nonnull(strstr(zps_errmsg(c), "nesterov"));
    ck_assert_int_eq(zps_declare_group(c, 0, ZPS_INNER_SGD, 0.1, 0.9, 1, 0, 0, 0, 0), ZPS_OK);
    ck_assert_int_eq(zps_declare_group(c, 1, ZPS_INNER_SGD, 0.2, 0.9, 0, 0, 0, 0, 0), ZPS_OK);
    ck_assert_int_eq(zps_declare_tensor_group(c, "v", 1), ZPS_EINVAL);
    ck_assert_ptr_nonnull(strstr(zps_errmsg(c), "no tensor 'v'"));
    ck_assert_int_eq(zps_declare_tensor_group(c, "w", 1), ZPS_OK);
    ck_assert_int_eq(zps_declare_buffer(c, "bn", 1, shape, 3), ZPS_EINVAL);
    ck_assert_int_eq(zps_declare_buffer(c, "bn", 1, shape, ZPS_BUFFER_BROADCAST), ZPS_OK);
    ck_assert_int_eq(zps_declare_tensor_group(c, "bn", 1), ZPS_EINVAL);
    ck_assert_ptr_nonnull(strstr(zps_errmsg(c), "is a buffer"));
    float lr[2] = {0.1f, 0.2f};
    ck_assert_int_eq(zps_declare_lr_table(c, 2, 1, lr), ZPS_EINVAL); // not joined yet
    ck_assert_ptr_nonnull(strstr(zps_errmsg(c), "after zps_join"));
    ck_assert_int_eq(zps_declare_lr_table(c, 2, 0, NULL), ZPS_OK); // the announcement
    zps_client_destroy(&c);
}
END_TEST

static int s_hook_calls;
static char s_hook_msg[256];

static void s_hook(void *arg, int level, const char *msg)
{
    (void)arg;
    if (level == ZPS_LOG_LEVEL_ERROR) {
        s_hook_calls++;
        strncpy(s_hook_msg, msg, sizeof s_hook_msg - 1);
    }
}

START_TEST(test_client_log_hook)
{
    zps_set_log_hook(s_hook, NULL);
    zps_client *c = zps_client_new("tcp://127.0.0.1:1");
    ck_assert_int_eq(zps_client_set_curve(c, "/nonexistent/secret", "/nonexistent/pub"),
                     ZPS_ENOENT);
    ck_assert_int_ge(s_hook_calls, 1);
    ck_assert_str_eq(zps_errmsg(c), s_hook_msg); // the sentence is the logged line
    zps_set_log_hook(NULL, NULL);
    zps_client_destroy(&c);
}
END_TEST

Suite *zps_suite_client(void)
{
    Suite *s = suite_create("client");
    TCase *tc = tcase_create("api");
    tcase_add_test(tc, test_client_version);
    tcase_add_test(tc, test_client_options_refused_with_a_sentence);
    tcase_add_test(tc, test_client_calls_out_of_order);
    tcase_add_test(tc, test_client_declared_optimizer_refusals);
    tcase_add_test(tc, test_client_log_hook);
    suite_add_tcase(s, tc);
    return s;
}
