/* check_cover.c - a shard's samples counted per bucket: ranges across word
 * boundaries, buckets apart, a count of what lies in a range, and clearing
 * for the next step; ranges past the batch or buckets that are not one
 * count nothing. */
#include "server/shard/zps_cover.h"
#include "tests/zps_check.h"

START_TEST(test_cover_counts_ranges_across_words_per_bucket)
{
    zps_cover c;
    ck_assert_int_eq(zps_cover_init(&c, 200, 3), ZPS_OK);
    zps_cover_add(&c, 1, 60, 130); // words 0, 1 and 2
    ck_assert(zps_cover_any(&c, 1, 129, 131));
    ck_assert(!zps_cover_any(&c, 1, 130, 200));
    ck_assert(!zps_cover_any(&c, 1, 0, 60));
    ck_assert(!zps_cover_any(&c, 0, 0, 200)); // another bucket
    ck_assert(!zps_cover_any(&c, 2, 60, 130));
    ck_assert_uint_eq(zps_cover_count(&c, 1, 0, 200), 70);
    ck_assert_uint_eq(zps_cover_count(&c, 1, 64, 128), 64);
    ck_assert_uint_eq(zps_cover_count(&c, 1, 100, 140), 30);
    zps_cover_add(&c, 1, 0, 60);
    ck_assert_uint_eq(zps_cover_count(&c, 1, 0, 130), 130);
    zps_cover_add(&c, 1, 190, 260); // clamped to the batch
    ck_assert_uint_eq(zps_cover_count(&c, 1, 0, 1000), 140);
    zps_cover_add(&c, 3, 0, 200); // not a bucket: nothing
    ck_assert(!zps_cover_any(&c, 3, 0, 200));
    zps_cover_clear(&c);
    ck_assert_uint_eq(zps_cover_count(&c, 1, 0, 200), 0);
    zps_cover_fini(&c);
    zps_cover_fini(&c); // twice is safe
}
END_TEST

START_TEST(test_cover_single_samples_at_word_edges)
{
    zps_cover c;
    ck_assert_int_eq(zps_cover_init(&c, 128, 1), ZPS_OK);
    zps_cover_add(&c, 0, 63, 64);
    zps_cover_add(&c, 0, 64, 65);
    zps_cover_add(&c, 0, 127, 128);
    ck_assert_uint_eq(zps_cover_count(&c, 0, 0, 128), 3);
    ck_assert(zps_cover_any(&c, 0, 63, 64));
    ck_assert(!zps_cover_any(&c, 0, 65, 127));
    ck_assert(!zps_cover_any(&c, 0, 10, 10)); // empty range
    zps_cover_fini(&c);
}
END_TEST

Suite *zps_suite_cover(void)
{
    Suite *s = suite_create("cover");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_cover_counts_ranges_across_words_per_bucket);
    tcase_add_test(tc, test_cover_single_samples_at_word_edges);
    suite_add_tcase(s, tc);
    return s;
}
