/* check_timers.c - the loops' timer table (common/), on a clock the test
 * drives: periodic timers fire at their period, a deadline once, the poll
 * timeout is the time to the earliest deadline (bounded), and a callback
 * may re-arm its own timer. */
#include "common/zps_timers.h"
#include "tests/zps_check.h"

typedef struct s_log {
    int fired[ZPS_TIMERS_MAX];     // firings per timer id
    double last_ms[ZPS_TIMERS_MAX]; // `now` of each one's last firing
} s_log;

typedef struct s_arg {
    s_log *log;
    int id;
} s_arg;

static void s_note(void *arg, double now_ms)
{
    s_arg *a = arg;
    a->log->fired[a->id]++;
    a->log->last_ms[a->id] = now_ms;
}

// Steps the clock from `from` to `to` a ms at a time, running the table.
static void s_drive(zps_timers *ts, double from, double to)
{
    for (double now = from; now <= to; now += 1) {
        (void)zps_timers_run(ts, now);
    }
}

START_TEST(test_timers_fires_each_timer_at_its_period)
{
    zps_timers ts;
    s_log log = {0};
    s_arg a = {&log, 0}, b = {&log, 1};
    zps_timers_init(&ts);
    ck_assert_int_eq(zps_timers_add(&ts, "ten", 10, s_note, &a), 0);
    ck_assert_int_eq(zps_timers_add(&ts, "twenty-five", 25, s_note, &b), 1);
    zps_timers_at(&ts, 0, 10);
    zps_timers_at(&ts, 1, 25);
    s_drive(&ts, 0, 100);
    ck_assert_int_eq(log.fired[0], 10); // at 10, 20, ..., 100
    ck_assert_int_eq(log.fired[1], 4);  // at 25, 50, 75, 100
    ck_assert_double_eq(log.last_ms[0], 100);
}
END_TEST

START_TEST(test_timers_next_deadline_is_the_earliest)
{
    zps_timers ts;
    s_log log = {0};
    s_arg a = {&log, 0}, b = {&log, 1}, c = {&log, 2};
    zps_timers_init(&ts);
    (void)zps_timers_add(&ts, "late", 500, s_note, &a);
    (void)zps_timers_add(&ts, "soon", 0, s_note, &b);
    (void)zps_timers_add(&ts, "disarmed", 0, s_note, &c);
    ck_assert_int_eq(zps_timers_next_ms(&ts, 0, 200), 200); // none armed: the bound
    zps_timers_at(&ts, 0, 500);
    zps_timers_at(&ts, 1, 37.2);
    ck_assert_int_eq(zps_timers_next_ms(&ts, 0, 200), 38); // rounded up, never early
    ck_assert_int_eq(zps_timers_next_ms(&ts, 30, 200), 8);
    ck_assert_int_eq(zps_timers_next_ms(&ts, 40, 200), 0); // overdue: poll without waiting
    (void)zps_timers_run(&ts, 40);
    ck_assert_int_eq(zps_timers_next_ms(&ts, 40, 200), 200); // 460 to go: the bound
    ck_assert_int_eq(zps_timers_next_ms(&ts, 400, 200), 100);
    ck_assert_int_eq(log.fired[2], 0);
}
END_TEST

START_TEST(test_timers_a_deadline_fires_once)
{
    zps_timers ts;
    s_log log = {0};
    s_arg a = {&log, 0};
    zps_timers_init(&ts);
    int id = zps_timers_add(&ts, "grace", 0, s_note, &a);
    zps_timers_at(&ts, id, 50);
    ck_assert_int_eq(zps_timers_run(&ts, 49), 0);
    ck_assert(zps_timers_armed(&ts, id));
    ck_assert_int_eq(zps_timers_run(&ts, 50), 1);
    s_drive(&ts, 51, 500);
    ck_assert_int_eq(log.fired[0], 1);
    ck_assert(!zps_timers_armed(&ts, id));
}
END_TEST

START_TEST(test_timers_a_late_periodic_timer_fires_once_and_catches_up)
{
    zps_timers ts;
    s_log log = {0};
    s_arg a = {&log, 0};
    zps_timers_init(&ts);
    (void)zps_timers_add(&ts, "tick", 10, s_note, &a);
    zps_timers_at(&ts, 0, 10);
    ck_assert_int_eq(zps_timers_run(&ts, 95), 1); // nine periods late: once, not nine times
    ck_assert_int_eq(zps_timers_next_ms(&ts, 95, 200), 10);
}
END_TEST

START_TEST(test_timers_a_cancelled_timer_does_not_fire)
{
    zps_timers ts;
    s_log log = {0};
    s_arg a = {&log, 0};
    zps_timers_init(&ts);
    (void)zps_timers_add(&ts, "tick", 10, s_note, &a);
    zps_timers_at(&ts, 0, 10);
    zps_timers_cancel(&ts, 0);
    s_drive(&ts, 0, 100);
    ck_assert_int_eq(log.fired[0], 0);
}
END_TEST

// A callback that re-arms its own deadline a given time after each firing.
typedef struct s_rearm {
    zps_timers *ts;
    int id;
    int fired;
    double again_ms;
} s_rearm;

static void s_rearm_fn(void *arg, double now_ms)
{
    s_rearm *r = arg;
    r->fired++;
    if (r->fired < 3) {
        zps_timers_at(r->ts, r->id, now_ms + r->again_ms);
    }
}

START_TEST(test_timers_a_callback_may_rearm_its_own_timer)
{
    zps_timers ts;
    zps_timers_init(&ts);
    s_rearm r = {.ts = &ts, .again_ms = 7};
    r.id = zps_timers_add(&ts, "self", 0, s_rearm_fn, &r);
    zps_timers_at(&ts, r.id, 0);
    s_drive(&ts, 0, 100);
    ck_assert_int_eq(r.fired, 3); // at 0, 7, 14; then it stays disarmed
    ck_assert(!zps_timers_armed(&ts, r.id));
}
END_TEST

START_TEST(test_timers_a_new_period_holds_from_the_next_firing)
{
    zps_timers ts;
    s_log log = {0};
    s_arg a = {&log, 0};
    zps_timers_init(&ts);
    (void)zps_timers_add(&ts, "tick", 10, s_note, &a);
    zps_timers_at(&ts, 0, 10);
    s_drive(&ts, 0, 10);
    zps_timers_set_period(&ts, 0, 50);
    ck_assert_int_eq(zps_timers_next_ms(&ts, 10, 200), 10); // still due at 20
    s_drive(&ts, 11, 120);
    ck_assert_int_eq(log.fired[0], 4); // at 10, 20, 70, 120
}
END_TEST

START_TEST(test_timers_a_full_table_refuses_a_timer)
{
    zps_timers ts;
    s_log log = {0};
    s_arg a = {&log, 0};
    zps_timers_init(&ts);
    for (int i = 0; i < ZPS_TIMERS_MAX; i++) {
        ck_assert_int_eq(zps_timers_add(&ts, "t", 1, s_note, &a), i);
    }
    ck_assert_int_eq(zps_timers_add(&ts, "one too many", 1, s_note, &a), -1);
}
END_TEST

Suite *zps_suite_timers(void)
{
    Suite *s = suite_create("timers");
    TCase *tc = tcase_create("table");
    tcase_add_test(tc, test_timers_fires_each_timer_at_its_period);
    tcase_add_test(tc, test_timers_next_deadline_is_the_earliest);
    tcase_add_test(tc, test_timers_a_deadline_fires_once);
    tcase_add_test(tc, test_timers_a_late_periodic_timer_fires_once_and_catches_up);
    tcase_add_test(tc, test_timers_a_cancelled_timer_does_not_fire);
    tcase_add_test(tc, test_timers_a_callback_may_rearm_its_own_timer);
    tcase_add_test(tc, test_timers_a_new_period_holds_from_the_next_firing);
    tcase_add_test(tc, test_timers_a_full_table_refuses_a_timer);
    suite_add_tcase(s, tc);
    return s;
}
