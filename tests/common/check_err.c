/* check_err.c - zps_strerror: a text of its own for every code of
 * include/zps.h, and a safe answer for the codes a peer may send that the
 * enum does not have. */
#include <string.h>

#include "common/zps_err.h"
#include "tests/zps_check.h"

START_TEST(test_err_every_code_has_a_text_of_its_own)
{
    for (int a = 0; a < ZPS_ECOUNT_; a++) {
        const char *text = zps_strerror((zps_err)a);
        ck_assert_str_ne(text, "unknown error");
        for (int b = 0; b < a; b++) {
            ck_assert_msg(strcmp(text, zps_strerror((zps_err)b)) != 0,
                          "codes %d and %d both read \"%s\"", a, b, text);
        }
    }
    ck_assert_str_eq(zps_strerror(ZPS_EPERM), "not permitted");
}
END_TEST

START_TEST(test_err_a_code_outside_the_enum_is_unknown)
{
    ck_assert_str_eq(zps_strerror(ZPS_ECOUNT_), "unknown error");
    ck_assert_str_eq(zps_strerror((zps_err)-1), "unknown error");
    ck_assert_str_eq(zps_strerror((zps_err)1000), "unknown error");
}
END_TEST

Suite *zps_suite_err(void)
{
    Suite *s = suite_create("err");
    TCase *tc = tcase_create("err");
    tcase_add_test(tc, test_err_every_code_has_a_text_of_its_own);
    tcase_add_test(tc, test_err_a_code_outside_the_enum_is_unknown);
    suite_add_tcase(s, tc);
    return s;
}
