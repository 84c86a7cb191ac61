/* check_plans.c - the plan history: the plan in force at a step is the one
 * the step was planned with, however many generations pile up for later
 * steps; superseded generations go, the one in force stays. Slices handed
 * over: handed again, a slice moves and counts once; taken once; forgotten
 * with their step; a full table changes nothing. */
#include "common/zps_plans.h"
#include "tests/zps_check.h"

// A plan of n members (ranks first..first+n-1, ids 100 + rank) over B = 8.
static zps_plan s_plan(uint32_t first, uint32_t n)
{
    uint32_t shares[16] = {0};
    zps_plan p = {0};
    char why[64];
    ck_assert_uint_le(n, 16);
    ck_assert_int_eq(zps_plan_split(8, shares, n, &p, why, sizeof why), ZPS_OK);
    for (uint32_t i = 0; i < n; i++) {
        p.slices[i].rank = first + i;
        p.slices[i].member_id = 100 + first + i;
    }
    return p;
}

START_TEST(test_plans_keep_the_plan_in_force_while_later_ones_pile_up)
{
    zps_plans ps;
    zps_plans_init(&ps);
    zps_plan p1 = s_plan(0, 4);
    ck_assert_int_eq(zps_plans_add(&ps, 1, 0, &p1), ZPS_OK);
    // Ten re-plans of step 403 while step 402 is in progress: the old
    // fixed-slot history lost generation 1 here.
    for (uint32_t g = 2; g <= 12; g++) {
        zps_plan p = s_plan(0, 1 + g % 4);
        ck_assert_int_eq(zps_plans_add(&ps, g, 403, &p), ZPS_OK);
        zps_plan_fini(&p); // the history keeps a copy
    }
    const zps_plan_gen *at = zps_plans_at(&ps, 402);
    ck_assert_ptr_nonnull(at);
    ck_assert_uint_eq(at->gen, 1);
    ck_assert_uint_eq(at->plan.n, 4);
    ck_assert_uint_eq(zps_plans_at(&ps, 403)->gen, 12);
    ck_assert_int_eq(ps.n, 2); // the superseded plans of 403 are gone
    zps_plan_fini(&p1);
    zps_plans_fini(&ps);
}
END_TEST

START_TEST(test_plans_refuse_an_older_generation_and_follow_a_rollback)
{
    zps_plans ps;
    zps_plans_init(&ps);
    zps_plan p = s_plan(0, 2);
    ck_assert_int_eq(zps_plans_add(&ps, 5, 10, &p), ZPS_OK);
    ck_assert_int_eq(zps_plans_add(&ps, 6, 20, &p), ZPS_OK);
    ck_assert_int_eq(zps_plans_add(&ps, 6, 30, &p), ZPS_EDUP);
    ck_assert_int_eq(zps_plans_add(&ps, 4, 30, &p), ZPS_EDUP);
    ck_assert_ptr_null(zps_plans_at(&ps, 9));
    // A rollback to step 15: generation 7 holds from there, 6 never will.
    zps_plan q = s_plan(3, 3);
    ck_assert_int_eq(zps_plans_add(&ps, 7, 15, &q), ZPS_OK);
    ck_assert_uint_eq(zps_plans_at(&ps, 12)->gen, 5);
    ck_assert_uint_eq(zps_plans_at(&ps, 25)->gen, 7);
    ck_assert_uint_eq(zps_plans_newest_gen(&ps), 7);
    zps_plan_fini(&p);
    zps_plan_fini(&q);
    zps_plans_fini(&ps);
}
END_TEST

START_TEST(test_plans_forget_only_what_no_later_step_uses)
{
    zps_plans ps;
    zps_plans_init(&ps);
    zps_plan a = s_plan(0, 2), b = s_plan(2, 2), c = s_plan(4, 2);
    ck_assert_int_eq(zps_plans_add(&ps, 1, 0, &a), ZPS_OK);
    ck_assert_int_eq(zps_plans_add(&ps, 2, 5, &b), ZPS_OK);
    ck_assert_int_eq(zps_plans_add(&ps, 3, 9, &c), ZPS_OK);
    zps_plans_forget_before(&ps, 7);
    ck_assert_ptr_null(zps_plans_at(&ps, 4));
    ck_assert_uint_eq(zps_plans_at(&ps, 7)->gen, 2);
    ck_assert_uint_eq(zps_plans_at(&ps, 9)->gen, 3);
    ck_assert(!zps_plans_names(&ps, 100, 0)); // only in generation 1
    ck_assert(zps_plans_names(&ps, 102, 2));
    ck_assert(!zps_plans_names(&ps, 102, 3)); // a member at another's rank
    ck_assert(zps_plans_names(&ps, 105, 5));
    ck_assert(!zps_plans_names(&ps, 0, 2)); // a worker's copy names others as 0
    zps_plan_fini(&a);
    zps_plan_fini(&b);
    zps_plan_fini(&c);
    zps_plans_fini(&ps);
}
END_TEST

START_TEST(test_plans_full_history_drops_the_oldest)
{
    zps_plans ps;
    zps_plans_init(&ps);
    zps_plan p = s_plan(0, 1);
    for (uint32_t g = 1; g <= ZPS_PLANS_MAX + 3; g++) {
        ck_assert_int_eq(zps_plans_add(&ps, g, g * 10, &p), ZPS_OK);
    }
    ck_assert_int_eq(ps.n, ZPS_PLANS_MAX);
    ck_assert_ptr_null(zps_plans_at(&ps, 10));
    ck_assert_uint_eq(zps_plans_at(&ps, 1000)->gen, ZPS_PLANS_MAX + 3);
    zps_plan_fini(&p);
    zps_plans_fini(&ps);
}
END_TEST

// Slice `offset` of `step` handed to `rank` (4 samples, generation 1).
static zps_err s_hand(zps_plans *p, uint64_t step, uint32_t offset, uint32_t rank)
{
    zps_plans_handed h = {.step = step, .offset = offset, .count = 4, .gen = 1, .rank = rank};
    return zps_plans_hand(p, &h);
}

START_TEST(test_plans_handing_a_slice_again_moves_it_and_counts_it_once)
{
    zps_plans p;
    zps_plans_init(&p);
    ck_assert_int_eq(s_hand(&p, 5, 0, 1), ZPS_OK);
    ck_assert_int_eq(s_hand(&p, 5, 4, 1), ZPS_OK);
    ck_assert_int_eq(s_hand(&p, 6, 0, 2), ZPS_OK);
    ck_assert_uint_eq(zps_plans_handed_load(&p, 5, 1), 8);
    ck_assert_int_eq(s_hand(&p, 5, 4, 2), ZPS_OK); // its helper left too: to rank 2
    ck_assert_uint_eq(p.n_handed, 3);
    ck_assert_uint_eq(zps_plans_handed_load(&p, 5, 1), 4);
    ck_assert_uint_eq(zps_plans_handed_load(&p, 5, 2), 4);
    ck_assert_uint_eq(zps_plans_handed_at(&p, 5, 4)->rank, 2);
    ck_assert_ptr_null(zps_plans_handed_at(&p, 5, 8));
    ck_assert_ptr_null(zps_plans_handed_at(&p, 7, 0));
}
END_TEST

START_TEST(test_plans_handed_slices_are_taken_once_and_forgotten_with_their_step)
{
    zps_plans p;
    zps_plans_init(&p);
    for (uint32_t k = 0; k < ZPS_PLANS_HANDED_MAX; k++) {
        ck_assert_int_eq(s_hand(&p, 5 + k % 3, 4 * k, 1), ZPS_OK);
    }
    ck_assert_int_eq(s_hand(&p, 9, 0, 1), ZPS_ERANGE); // full: nothing changes
    ck_assert_int_eq(s_hand(&p, 5, 0, 3), ZPS_OK);       // a slice it has moves still
    zps_plans_handed out[ZPS_PLANS_HANDED_MAX];
    int n = zps_plans_take_handed(&p, 6, out, ZPS_PLANS_HANDED_MAX);
    ck_assert_int_eq(n, ZPS_PLANS_HANDED_MAX / 3);
    for (int i = 0; i < n; i++) {
        ck_assert_uint_eq(out[i].step, 6);
    }
    ck_assert_int_eq(zps_plans_take_handed(&p, 6, out, ZPS_PLANS_HANDED_MAX), 0); // once
    zps_plans_forget_before(&p, 7); // step 5 is done everywhere
    ck_assert_uint_eq(zps_plans_handed_load(&p, 5, 1) + zps_plans_handed_load(&p, 5, 3), 0);
    ck_assert_uint_gt(zps_plans_handed_load(&p, 7, 1), 0);
    zps_plans_clear_handed(&p);
    ck_assert_uint_eq(p.n_handed, 0);
}
END_TEST

Suite *zps_suite_plans(void)
{
    Suite *s = suite_create("plans");
    TCase *tc = tcase_create("history");
    tcase_add_test(tc, test_plans_keep_the_plan_in_force_while_later_ones_pile_up);
    tcase_add_test(tc, test_plans_refuse_an_older_generation_and_follow_a_rollback);
    tcase_add_test(tc, test_plans_forget_only_what_no_later_step_uses);
    tcase_add_test(tc, test_plans_full_history_drops_the_oldest);
    tcase_add_test(tc, test_plans_handing_a_slice_again_moves_it_and_counts_it_once);
    tcase_add_test(tc, test_plans_handed_slices_are_taken_once_and_forgotten_with_their_step);
    suite_add_tcase(s, tc);
    return s;
}
