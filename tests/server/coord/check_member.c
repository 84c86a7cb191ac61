/* check_member.c - a member's life: who may be handed work of which step. */
#include "server/coord/zps_member.h"
#include "tests/zps_check.h"

START_TEST(test_member_joining_computes_nothing_until_a_plan_names_it)
{
    zps_member_life l;
    zps_member_admit(&l);
    ck_assert(zps_member_planned(&l));
    ck_assert(!zps_member_may_compute(&l, 402));
    ck_assert(!zps_member_may_compute(&l, 403));
    ck_assert_int_eq(zps_member_activate(&l, 403), ZPS_OK);
    ck_assert(!zps_member_may_compute(&l, 402)); // joined for 403: owns nothing of 402
    ck_assert(zps_member_may_compute(&l, 403));
    ck_assert(zps_member_may_compute(&l, 500));
}
END_TEST

START_TEST(test_member_departure_hands_on_and_retires)
{
    zps_member_life l;
    zps_member_admit_active(&l, 0);
    ck_assert_int_eq(zps_member_depart(&l, ZPS_EXIT_EVICTED), ZPS_OK);
    ck_assert_int_eq(l.state, ZPS_MEMBER_LEAVING);
    ck_assert(!zps_member_may_compute(&l, 10));
    ck_assert(!zps_member_planned(&l));
    ck_assert_int_eq(zps_member_depart(&l, ZPS_EXIT_LEFT), ZPS_ESTATE); // gone once
    ck_assert_int_eq(zps_member_activate(&l, 12), ZPS_ESTATE);          // no way back
    zps_member_retire(&l);
    ck_assert_int_eq(l.state, ZPS_MEMBER_GONE);
    ck_assert_int_eq(l.exit, ZPS_EXIT_EVICTED);
}
END_TEST

START_TEST(test_member_joiner_gone_before_its_plan_leaves_nothing_to_hand_on)
{
    zps_member_life l;
    zps_member_admit(&l);
    ck_assert_int_eq(zps_member_depart(&l, ZPS_EXIT_EVICTED), ZPS_OK);
    ck_assert_int_eq(l.state, ZPS_MEMBER_GONE);
}
END_TEST

START_TEST(test_member_rollback_moves_from_back_never_forward)
{
    zps_member_life l;
    zps_member_admit_active(&l, 40);
    ck_assert_int_eq(zps_member_activate(&l, 30), ZPS_OK);
    ck_assert_uint_eq(l.from, 30);
    ck_assert_int_eq(zps_member_activate(&l, 50), ZPS_OK);
    ck_assert_uint_eq(l.from, 30);
    ck_assert_int_eq(zps_member_depart(&l, ZPS_EXIT_FINISHED), ZPS_OK);
    ck_assert_int_eq(l.state, ZPS_MEMBER_GONE); // after the last step: nothing in flight
}
END_TEST

Suite *zps_suite_member(void)
{
    Suite *s = suite_create("member");
    TCase *tc = tcase_create("life");
    tcase_add_test(tc, test_member_joining_computes_nothing_until_a_plan_names_it);
    tcase_add_test(tc, test_member_departure_hands_on_and_retires);
    tcase_add_test(tc, test_member_joiner_gone_before_its_plan_leaves_nothing_to_hand_on);
    tcase_add_test(tc, test_member_rollback_moves_from_back_never_forward);
    suite_add_tcase(s, tc);
    return s;
}
