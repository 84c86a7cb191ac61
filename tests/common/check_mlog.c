/* check_mlog.c - the metrics log's description: every key has a name of
 * its own, and what the writers write is the JSON object the reader
 * expects, member by member. */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/zps_mlog.h"
#include "tests/zps_check.h"

START_TEST(test_mlog_every_key_has_a_name_of_its_own)
{
    for (int a = 0; a < ZPS_MLOG_N_KEYS; a++) {
        ck_assert_ptr_nonnull(zps_mlog_name((zps_mlog_key)a));
        ck_assert_str_ne(zps_mlog_name((zps_mlog_key)a), "?");
        for (int b = 0; b < a; b++) {
            ck_assert_str_ne(zps_mlog_name((zps_mlog_key)a), zps_mlog_name((zps_mlog_key)b));
        }
    }
    ck_assert_str_eq(zps_mlog_name(ZPS_MLOG_N_KEYS), "?");
}
END_TEST

START_TEST(test_mlog_writers_make_an_object_with_those_keys_and_values)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ck_assert_ptr_nonnull(f);
    fputc('{', f);
    zps_mlog_uint(f, true, ZPS_MLOG_STEP, 4611686018427387904ull);
    zps_mlog_real(f, false, ZPS_MLOG_STEP_MS, 12.3456, 3);
    zps_mlog_key_only(f, false, ZPS_MLOG_WORKERS);
    fputs("[]}", f);
    ck_assert_int_eq(fclose(f), 0);
    json_error_t err;
    json_t *o = json_loads(text, 0, &err);
    ck_assert_msg(o != NULL, "not JSON: %s (%s)", text, err.text);
    ck_assert_uint_eq(json_object_size(o), 3);
    ck_assert(json_is_array(json_object_get(o, zps_mlog_name(ZPS_MLOG_WORKERS))));
    ck_assert_double_eq_tol(json_real_value(json_object_get(o, zps_mlog_name(ZPS_MLOG_STEP_MS))),
                            12.346, 1e-9);
    ck_assert_str_eq(text, "{\"step\":4611686018427387904,\"step_ms\":12.346,\"workers\":[]}");
    json_decref(o);
    free(text);
}
END_TEST

Suite *zps_suite_mlog(void)
{
    Suite *s = suite_create("mlog");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_mlog_every_key_has_a_name_of_its_own);
    tcase_add_test(tc, test_mlog_writers_make_an_object_with_those_keys_and_values);
    suite_add_tcase(s, tc);
    return s;
}
