/* check_flags.c - ZPS_<FLAG> variables become arguments that getopt sees
 * before the command line's, switches take on/off words and nothing else,
 * and the numeric parsers hold their ranges. */
#include <stdlib.h>
#include <string.h>

#include "common/zps_flags.h"
#include "tests/zps_check.h"

static const struct option s_opts[] = {
    {"global-batch", required_argument, 0, 'b'},
    {"resume", no_argument, 0, 'r'},
    {"listen", required_argument, 0, 'l'},
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0},
};

START_TEST(test_flags_env_name_is_upper_case_with_underscores)
{
    char name[32];
    ck_assert(zps_flags_env_name("global-batch", name, sizeof name));
    ck_assert_str_eq(name, "ZPS_GLOBAL_BATCH");
    ck_assert(!zps_flags_env_name("a-very-long-flag-name-indeed-yes", name, 16));
}
END_TEST

START_TEST(test_flags_env_comes_before_command_line_in_table_order)
{
    char *envp[] = {"ZPS_LISTEN=tcp://0.0.0.0:5555", "ZPS_RESUME=yes", "ZPS_GLOBAL_BATCH=64",
                    "ZPS_HELP=1", "ZPS_UNKNOWN=3", "PATH=/bin", NULL};
    char *argv[] = {"prog", "--global-batch", "128", NULL};
    int argc;
    char **v;
    ck_assert_int_eq(zps_flags_from_env("prog", s_opts, envp, 3, argv, &argc, &v), ZPS_OK);
    const char *want[] = {"prog", "--global-batch", "64", "--resume", "--listen",
                          "tcp://0.0.0.0:5555", "--global-batch", "128"};
    ck_assert_int_eq(argc, 8);
    for (int i = 0; i < argc; i++) {
        ck_assert_str_eq(v[i], want[i]);
    }
    ck_assert_ptr_null(v[argc]);
    free(v);
}
END_TEST

START_TEST(test_flags_switch_off_words_add_nothing)
{
    const char *offs[] = {"ZPS_RESUME=0", "ZPS_RESUME=false", "ZPS_RESUME=No", "ZPS_RESUME=",
                          "ZPS_RESUME=off"};
    for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++) {
        char *envp[] = {(char *)offs[i], NULL};
        char *argv[] = {"prog", NULL};
        int argc;
        char **v;
        ck_assert_int_eq(zps_flags_from_env("prog", s_opts, envp, 1, argv, &argc, &v), ZPS_OK);
        ck_assert_int_eq(argc, 1);
        free(v);
    }
}
END_TEST

START_TEST(test_flags_switch_with_other_value_is_refused)
{
    char *envp[] = {"ZPS_RESUME=maybe", NULL};
    char *argv[] = {"prog", NULL};
    int argc = -1;
    char **v = NULL;
    ck_assert_int_eq(zps_flags_from_env("prog", s_opts, envp, 1, argv, &argc, &v), ZPS_EINVAL);
    ck_assert_int_eq(argc, -1);
    ck_assert_ptr_null(v);
}
END_TEST

START_TEST(test_flags_numbers_hold_their_ranges)
{
    long long i = 7;
    ck_assert(zps_flags_int("p", "--n", "42", 1, 100, &i));
    ck_assert_int_eq(i, 42);
    ck_assert(!zps_flags_int("p", "--n", "101", 1, 100, &i));
    ck_assert(!zps_flags_int("p", "--n", "4x", 1, 100, &i));
    ck_assert(!zps_flags_int("p", "--n", "", 1, 100, &i));
    ck_assert_int_eq(i, 42);
    double d = 0;
    ck_assert(zps_flags_real("p", "--x", "0.5", 0, 1, &d));
    ck_assert_double_eq(d, 0.5);
    ck_assert(!zps_flags_real("p", "--x", "nan", 0, 1, &d));
    ck_assert(!zps_flags_real("p", "--x", "1.5", 0, 1, &d));
}
END_TEST

Suite *zps_suite_flags(void)
{
    Suite *s = suite_create("flags");
    TCase *tc = tcase_create("env");
    tcase_add_test(tc, test_flags_env_name_is_upper_case_with_underscores);
    tcase_add_test(tc, test_flags_env_comes_before_command_line_in_table_order);
    tcase_add_test(tc, test_flags_switch_off_words_add_nothing);
    tcase_add_test(tc, test_flags_switch_with_other_value_is_refused);
    tcase_add_test(tc, test_flags_numbers_hold_their_ranges);
    suite_add_tcase(s, tc);
    return s;
}
