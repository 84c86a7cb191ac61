/* check_plan.c - splitting the global batch (common/zps_plan.h): the plain
 * split, and deterministic mode's split in whole micro-batches: the even
 * split, fixed shares rounded (halves up, at least one micro-batch), what
 * cannot be split refused with a reason, and pieces cut at micro-batches. */
#include <stdlib.h>
#include <string.h>

#include "common/zps_plan.h"
#include "tests/zps_check.h"

// Every slice of p: offsets tile [0, B) in order, each count a multiple of m.
static void s_assert_tiles(const zps_plan *p, uint32_t global_batch, uint32_t micro)
{
    uint32_t offset = 0;
    for (uint32_t i = 0; i < p->n; i++) {
        ck_assert_uint_eq(p->slices[i].rank, i);
        ck_assert_uint_eq(p->slices[i].offset, offset);
        ck_assert_uint_gt(p->slices[i].count, 0);
        if (micro) {
            ck_assert_uint_eq(p->slices[i].count % micro, 0);
        }
        offset += p->slices[i].count;
    }
    ck_assert_uint_eq(offset, global_batch);
    ck_assert_uint_eq(p->global_batch, global_batch);
}

START_TEST(test_plan_split_evenly_lower_ranks_take_the_remainder)
{
    uint32_t shares[3] = {0};
    zps_plan p = {0};
    char why[128];
    ck_assert_int_eq(zps_plan_split(64, shares, 3, &p, why, sizeof why), ZPS_OK);
    s_assert_tiles(&p, 64, 0);
    ck_assert_uint_eq(p.slices[0].count, 22);
    ck_assert_uint_eq(p.slices[1].count, 21);
    ck_assert_uint_eq(p.slices[2].count, 21);
    zps_plan_fini(&p);
}
END_TEST

START_TEST(test_plan_micro_even_split_is_whole_micro_batches)
{
    uint32_t shares[3] = {0};
    zps_plan p = {0};
    char why[128];
    ck_assert_int_eq(zps_plan_split_micro(64, 8, shares, 3, &p, why, sizeof why), ZPS_OK);
    s_assert_tiles(&p, 64, 8);
    ck_assert_uint_eq(p.slices[0].count, 24);
    ck_assert_uint_eq(p.slices[1].count, 24);
    ck_assert_uint_eq(p.slices[2].count, 16);
    // As many members as micro-batches: one each.
    uint32_t eight[8] = {0};
    ck_assert_int_eq(zps_plan_split_micro(64, 8, eight, 8, &p, why, sizeof why), ZPS_OK);
    s_assert_tiles(&p, 64, 8);
    ck_assert_uint_eq(p.slices[7].count, 8);
    zps_plan_fini(&p);
}
END_TEST

START_TEST(test_plan_micro_fixed_shares_and_the_rest)
{
    zps_plan p = {0};
    char why[128];
    uint32_t uneven[2] = {24, 40};
    ck_assert_int_eq(zps_plan_split_micro(64, 8, uneven, 2, &p, why, sizeof why), ZPS_OK);
    s_assert_tiles(&p, 64, 8);
    ck_assert_uint_eq(p.slices[0].count, 24);
    ck_assert_uint_eq(p.slices[1].count, 40);
    // A fixed share beside two that split the 5 micro-batches left: 24, 16.
    uint32_t mixed[3] = {24, 0, 0};
    ck_assert_int_eq(zps_plan_split_micro(64, 8, mixed, 3, &p, why, sizeof why), ZPS_OK);
    s_assert_tiles(&p, 64, 8);
    ck_assert_uint_eq(p.slices[1].count, 24);
    ck_assert_uint_eq(p.slices[2].count, 16);
    // M = 0 is the plain split.
    uint32_t none[3] = {0};
    ck_assert_int_eq(zps_plan_split_micro(64, 0, none, 3, &p, why, sizeof why), ZPS_OK);
    ck_assert_uint_eq(p.slices[0].count, 22);
    zps_plan_fini(&p);
}
END_TEST

START_TEST(test_plan_micro_refuses_what_is_not_whole_micro_batches)
{
    zps_plan p = {0};
    char why[128] = "";
    uint32_t zero[9] = {0};
    ck_assert_int_eq(zps_plan_split_micro(60, 8, zero, 2, &p, why, sizeof why), ZPS_EINVAL);
    ck_assert_ptr_nonnull(strstr(why, "micro-batches of 8"));
    uint32_t odd[2] = {20, 0};
    ck_assert_int_eq(zps_plan_split_micro(64, 8, odd, 2, &p, why, sizeof why), ZPS_EINVAL);
    ck_assert_ptr_nonnull(strstr(why, "share 20"));
    // Nine members, eight micro-batches: one would have none.
    ck_assert_int_eq(zps_plan_split_micro(64, 8, zero, 9, &p, why, sizeof why), ZPS_EINVAL);
    ck_assert_ptr_nonnull(strstr(why, "micro-batches of 8"));
    uint32_t over[2] = {64, 8};
    ck_assert_int_eq(zps_plan_split_micro(64, 8, over, 2, &p, why, sizeof why), ZPS_EINVAL);
    zps_plan_fini(&p);
}
END_TEST

START_TEST(test_plan_round_share_halves_up_at_least_one)
{
    ck_assert_uint_eq(zps_plan_round_share(24, 8), 24); // whole: as it is
    ck_assert_uint_eq(zps_plan_round_share(27, 8), 24);
    ck_assert_uint_eq(zps_plan_round_share(28, 8), 32); // a half: up
    ck_assert_uint_eq(zps_plan_round_share(29, 8), 32);
    ck_assert_uint_eq(zps_plan_round_share(3, 8), 8);   // at least one micro-batch
    ck_assert_uint_eq(zps_plan_round_share(1, 8), 8);
    ck_assert_uint_eq(zps_plan_round_share(0, 8), 0);   // no fixed share stays none
    ck_assert_uint_eq(zps_plan_round_share(27, 0), 27); // not deterministic
    ck_assert_uint_eq(zps_plan_round_share(7, 5), 5);   // odd M: 7/5 = 1.4
    ck_assert_uint_eq(zps_plan_round_share(8, 5), 10);  // 1.6
}
END_TEST

START_TEST(test_plan_pieces_cut_at_micro_batches)
{
    // [16, 56): five micro-batches of 8 in three pieces: 1, 2, 2 of them.
    ck_assert_uint_eq(zps_plan_max_pieces(40, 8), 5);
    uint32_t lo, hi, at = 16;
    for (uint32_t i = 0; i < 3; i++) {
        zps_plan_piece(16, 40, 8, i, 3, &lo, &hi);
        ck_assert_uint_eq(lo, at);
        ck_assert_uint_gt(hi, lo);
        ck_assert_uint_eq((hi - lo) % 8, 0);
        at = hi;
    }
    ck_assert_uint_eq(at, 56);
    // Without micro-batches: at samples, as before.
    ck_assert_uint_eq(zps_plan_max_pieces(5, 0), 5);
    zps_plan_piece(10, 5, 0, 1, 2, &lo, &hi);
    ck_assert_uint_eq(lo, 12);
    ck_assert_uint_eq(hi, 15);
}
END_TEST

START_TEST(test_plan_of_the_most_members_is_found_by_rank_and_copied_whole)
{
    uint32_t *shares = calloc(ZPS_MAX_MEMBERS, sizeof *shares);
    ck_assert_ptr_nonnull(shares);
    zps_plan p = {0}, q = {0};
    char why[128];
    ck_assert_int_eq(zps_plan_split(2 * ZPS_MAX_MEMBERS, shares, ZPS_MAX_MEMBERS, &p, why,
                                    sizeof why), ZPS_OK);
    s_assert_tiles(&p, 2 * ZPS_MAX_MEMBERS, 0);
    for (uint32_t i = 0; i < p.n; i++) {
        p.slices[i].rank = 3 * i; // ranks with gaps, as members leave
    }
    ck_assert_ptr_eq(zps_plan_find(&p, 3 * 1000), &p.slices[1000]);
    ck_assert_ptr_eq(zps_plan_find(&p, 0), &p.slices[0]);
    ck_assert_ptr_eq(zps_plan_find(&p, 3 * (ZPS_MAX_MEMBERS - 1)), &p.slices[ZPS_MAX_MEMBERS - 1]);
    ck_assert_ptr_null(zps_plan_find(&p, 3 * 1000 + 1));
    ck_assert_ptr_null(zps_plan_find(&p, 3 * ZPS_MAX_MEMBERS));
    ck_assert_int_eq(zps_plan_copy(&q, &p), ZPS_OK);
    p.slices[7].count = 0; // the copy owns its slices
    ck_assert_uint_eq(q.n, ZPS_MAX_MEMBERS);
    ck_assert_uint_eq(q.slices[7].count, 2);
    ck_assert_ptr_eq(zps_plan_find(&q, 3 * 7), &q.slices[7]);
    // One member more than the most: refused, and the plan left empty.
    ck_assert_int_eq(zps_plan_split(8 * ZPS_MAX_MEMBERS, shares, ZPS_MAX_MEMBERS + 1, &p, why,
                                    sizeof why), ZPS_EINVAL);
    ck_assert_uint_eq(p.n, 0);
    ck_assert_ptr_null(p.slices);
    zps_plan_fini(&q);
    zps_plan_fini(&p);
    free(shares);
}
END_TEST

Suite *zps_suite_plan(void)
{
    Suite *s = suite_create("plan");
    TCase *tc = tcase_create("split");
    tcase_add_test(tc, test_plan_split_evenly_lower_ranks_take_the_remainder);
    tcase_add_test(tc, test_plan_micro_even_split_is_whole_micro_batches);
    tcase_add_test(tc, test_plan_micro_fixed_shares_and_the_rest);
    tcase_add_test(tc, test_plan_micro_refuses_what_is_not_whole_micro_batches);
    tcase_add_test(tc, test_plan_round_share_halves_up_at_least_one);
    tcase_add_test(tc, test_plan_pieces_cut_at_micro_batches);
    tcase_add_test(tc, test_plan_of_the_most_members_is_found_by_rank_and_copied_whole);
    suite_add_tcase(s, tc);
    return s;
}
