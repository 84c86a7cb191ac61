/* check_heartbeat.c - the heartbeat thread beats only when the coordinator
 * heard nothing else from its member for an interval, which stretches with
 * long steps: the rules, and the thread against a real ROUTER on
 * loopback. */
#include <time.h>
#include <zmq.h>

#include "common/zps_clock.h"
#include "common/zps_wire.h"
#include "lib/zps_heartbeat.h"
#include "tests/zps_check.h"

#define INTERVAL_MS 100

START_TEST(test_heartbeat_is_due_an_interval_after_the_later_of_beat_and_heard)
{
    ck_assert(zps_heartbeat_due(1100, 1000, 0, 100));    // nothing heard: the beat's interval
    ck_assert(!zps_heartbeat_due(1099, 1000, 0, 100));
    ck_assert(!zps_heartbeat_due(1100, 1000, 1050, 100)); // heard since: an interval from that
    ck_assert(zps_heartbeat_due(1150, 1000, 1050, 100));
    ck_assert(zps_heartbeat_due(1100, 1000, 900, 100));   // heard before the beat: the beat counts
}
END_TEST

// Twice the usual step where that is longer than the least interval, at
// most a quarter of the worker timeout, never under the least.
START_TEST(test_heartbeat_interval_stretches_to_two_steps_up_to_a_quarter_of_the_timeout)
{
    ck_assert_int_eq(zps_heartbeat_interval(1000, 5, 10000), 1000);    // short steps
    ck_assert_int_eq(zps_heartbeat_interval(1000, 800, 10000), 1600);  // two steps
    ck_assert_int_eq(zps_heartbeat_interval(1000, 4000, 10000), 2500); // a quarter of the timeout
    ck_assert_int_eq(zps_heartbeat_interval(1000, 4000, 0), 1000);     // timeout not said
    ck_assert_int_eq(zps_heartbeat_interval(1000, 4000, 2000), 1000);  // never under the least
    ck_assert_int_eq(zps_heartbeat_interval(1000, 0, 60000), 1000);    // no step timed yet
}
END_TEST

// Beats the ROUTER received within wait_ms (each a HEARTBEAT of rank 3).
static int s_beats(void *router, int wait_ms)
{
    int n = 0;
    double end = zps_clock_ms() + wait_ms;
    zmq_pollitem_t item = {.socket = router, .events = ZMQ_POLLIN};
    for (double now = zps_clock_ms(); now < end; now = zps_clock_ms()) {
        if (zmq_poll(&item, 1, (long)(end - now) + 1) <= 0) {
            continue;
        }
        zps_wire_msg m;
        ck_assert_int_eq(zps_wire_recv(router, true, &m), ZPS_OK);
        ck_assert_int_eq(m.hdr->type, ZPS__MSG_TYPE__HEARTBEAT);
        ck_assert_uint_eq(m.hdr->rank, 3);
        zps_wire_msg_fini(&m);
        n++;
    }
    return n;
}

// Beats due by now in a stretch from `from` with nothing heard: one per
// interval. The bound of the test counts what it controls: a stall of its
// own between two "heard" (a busy machine) allows a beat per interval.
static int s_allowed(double from)
{
    return (int)((zps_clock_ms() - from) / INTERVAL_MS);
}

// A ROUTER on loopback (*router, the caller's) and a heartbeat of rank 3
// to it every INTERVAL_MS (the caller's).
static zps_heartbeat *s_start(void *ctx, void **router)
{
    *router = zps_wire_socket(ctx, ZMQ_ROUTER, 1000);
    ck_assert_ptr_nonnull(*router);
    ck_assert_int_eq(zmq_bind(*router, "tcp://127.0.0.1:*"), 0);
    char ep[128];
    size_t len = sizeof ep;
    ck_assert_int_eq(zmq_getsockopt(*router, ZMQ_LAST_ENDPOINT, ep, &len), 0);
    zps_curve off = {.on = false};
    zps_heartbeat *hb = zps_heartbeat_start(ctx, ep, &off, 7, 3, 11, INTERVAL_MS);
    ck_assert_ptr_nonnull(hb);
    return hb;
}

// While the main thread says it was heard more often than the interval, no
// beat goes out after the first (at once); once it stops, beats come again.
START_TEST(test_heartbeat_thread_is_silent_while_heard_and_beats_when_not)
{
    void *ctx = zmq_ctx_new();
    void *router = NULL;
    zps_heartbeat *hb = s_start(ctx, &router);
    int allowed = 1;
    double last = zps_clock_ms();
    zps_heartbeat_heard(hb);
    for (int i = 0; i < 100; i++) {
        struct timespec nap = {.tv_nsec = 10 * 1000000L};
        nanosleep(&nap, NULL);
        allowed += s_allowed(last);
        last = zps_clock_ms();
        zps_heartbeat_heard(hb);
    }
    int silent = s_beats(router, INTERVAL_MS / 2); // what is on its way arrives
    allowed += s_allowed(last);
    ck_assert_msg(silent <= allowed, "%d beats while heard every 10 ms for 1 s (%d allowed)",
                  silent, allowed);
    // Not heard any more: it beats again, every interval.
    ck_assert_int_ge(s_beats(router, 10 * INTERVAL_MS), 2);
    zps_heartbeat_stop(&hb);
    ck_assert_ptr_null(hb);
    zmq_close(router);
    zmq_ctx_term(ctx);
}
END_TEST

// An interval set longer (4 x) holds from the thread's next wake: over 12
// intervals of the first length not heard, one beat at once and one per
// new interval (and one of slack), where the first length would have
// beaten 12 times; and at least the first.
START_TEST(test_heartbeat_thread_beats_at_the_interval_set)
{
    void *ctx = zmq_ctx_new();
    void *router = NULL;
    zps_heartbeat *hb = s_start(ctx, &router);
    zps_heartbeat_set_interval(hb, 4 * INTERVAL_MS);
    double from = zps_clock_ms();
    int beats = s_beats(router, 12 * INTERVAL_MS);
    int allowed = 2 + (int)((zps_clock_ms() - from) / (4 * INTERVAL_MS));
    ck_assert_msg(beats >= 1 && beats <= allowed, "%d beats in 12 intervals of %d ms (%d allowed)",
                  beats, INTERVAL_MS, allowed);
    zps_heartbeat_stop(&hb);
    zmq_close(router);
    zmq_ctx_term(ctx);
}
END_TEST

Suite *zps_suite_heartbeat(void)
{
    Suite *s = suite_create("heartbeat");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_heartbeat_is_due_an_interval_after_the_later_of_beat_and_heard);
    tcase_add_test(tc, test_heartbeat_thread_is_silent_while_heard_and_beats_when_not);
    tcase_add_test(tc, test_heartbeat_interval_stretches_to_two_steps_up_to_a_quarter_of_the_timeout);
    tcase_add_test(tc, test_heartbeat_thread_beats_at_the_interval_set);
    suite_add_tcase(s, tc);
    return s;
}
