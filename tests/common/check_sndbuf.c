/* check_sndbuf.c - --sndbuf auto (zps_sndbuf): the flag's values, the
 * buffer each tick's round trips ask for, which peers are on this host,
 * and a watched socket's life (it works, and ends with its context). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/un.h>
#include <time.h>
#include <zmq.h>

#include "common/zps_sndbuf.h"
#include "common/zps_wire.h"
#include "tests/zps_check.h"

START_TEST(test_sndbuf_flag_takes_auto_zero_and_a_size)
{
    int v = 7;
    ck_assert(zps_sndbuf_parse("auto", &v));
    ck_assert_int_eq(v, ZPS_SNDBUF_AUTO);
    ck_assert(zps_sndbuf_parse("0", &v));
    ck_assert_int_eq(v, 0);
    ck_assert(zps_sndbuf_parse("32768", &v));
    ck_assert_int_eq(v, 32768);
    ck_assert(zps_sndbuf_parse("1073741824", &v));
    ck_assert_int_eq(v, 1 << 30);
    v = 7;
    const char *bad[] = {"", "100", "4095", "1073741825", "-1", "32k", "Auto", " 4096"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_msg(!zps_sndbuf_parse(bad[i], &v), "'%s' taken", bad[i]);
    }
    ck_assert_int_eq(v, 7);
}
END_TEST

START_TEST(test_sndbuf_keeps_the_os_buffer_until_a_queue_stands)
{
    // Idle, or no min_rtt from the kernel: nothing learnt, nothing changes.
    zps_sndbuf_sample idle = {.srtt_us = 9000, .min_rtt_us = 5, .acked = 1000};
    ck_assert_int_eq(zps_sndbuf_next(0, 500000, &idle), 0);
    ck_assert_int_eq(zps_sndbuf_next(65536, 500000, &idle), 65536);
    zps_sndbuf_sample no_min = {.srtt_us = 9000, .min_rtt_us = 0, .acked = 1 << 20};
    ck_assert_int_eq(zps_sndbuf_next(0, 500000, &no_min), 0);
    // Busy on a clear path (a LAN, or a WAN's long but unqueued round
    // trip): the OS's autotuning stays.
    zps_sndbuf_sample lan = {.srtt_us = 90, .min_rtt_us = 50, .acked = 1 << 20};
    ck_assert_int_eq(zps_sndbuf_next(0, 500000, &lan), 0);
    zps_sndbuf_sample wan = {.srtt_us = 20400, .min_rtt_us = 20000, .acked = 1 << 20};
    ck_assert_int_eq(zps_sndbuf_next(0, 4 << 20, &wan), 0);
    // Twice the minimum but under a millisecond of queue: still the OS's.
    zps_sndbuf_sample short_q = {.srtt_us = 900, .min_rtt_us = 400, .acked = 1 << 20};
    ck_assert_int_eq(zps_sndbuf_next(0, 500000, &short_q), 0);
}
END_TEST

START_TEST(test_sndbuf_a_standing_queue_leaves_the_path_and_a_share_of_the_queue)
{
    // The emulated cluster: 8 ms of queue over a 5 us path. What the path
    // holds (500000 * 5 / 8000 = 312 bytes) plus the queue's share.
    zps_sndbuf_sample shared = {.srtt_us = 8000, .min_rtt_us = 5, .acked = 1 << 20};
    ck_assert_int_eq(zps_sndbuf_next(0, 500000, &shared), ZPS_SNDBUF_QUEUE_BYTES + 312);
    // Already set: from its own value, never under the queue's share.
    ck_assert_int_eq(zps_sndbuf_next(40000, 0, &shared), ZPS_SNDBUF_QUEUE_BYTES + 25);
    ck_assert_int_eq(zps_sndbuf_next(ZPS_SNDBUF_QUEUE_BYTES, 0, &shared),
                     ZPS_SNDBUF_QUEUE_BYTES + 20);
    // A long path with a queue as long as itself: half the buffer is the
    // path's, and it keeps that half.
    zps_sndbuf_sample wan = {.srtt_us = 40000, .min_rtt_us = 20000, .acked = 1 << 20};
    ck_assert_int_eq(zps_sndbuf_next(1 << 20, 0, &wan), (1 << 19) + ZPS_SNDBUF_QUEUE_BYTES);
    ck_assert_int_eq(zps_sndbuf_next(0, 8 << 20, &wan), ZPS_SNDBUF_MAX_BYTES);
}
END_TEST

START_TEST(test_sndbuf_without_a_queue_a_set_buffer_doubles_to_the_maximum)
{
    zps_sndbuf_sample clear = {.srtt_us = 60, .min_rtt_us = 50, .acked = 1 << 20};
    ck_assert_int_eq(zps_sndbuf_next(ZPS_SNDBUF_QUEUE_BYTES, 0, &clear),
                     2 * ZPS_SNDBUF_QUEUE_BYTES);
    ck_assert_int_eq(zps_sndbuf_next(3 << 20, 0, &clear), ZPS_SNDBUF_MAX_BYTES);
    ck_assert_int_eq(zps_sndbuf_next(ZPS_SNDBUF_MAX_BYTES, 0, &clear), ZPS_SNDBUF_MAX_BYTES);
    // srtt a little under min_rtt (smoothing): clear as well.
    zps_sndbuf_sample under = {.srtt_us = 45, .min_rtt_us = 50, .acked = 1 << 20};
    ck_assert_int_eq(zps_sndbuf_next(65536, 0, &under), 131072);
    // Between clear and queued: kept.
    zps_sndbuf_sample mid = {.srtt_us = 1200, .min_rtt_us = 400, .acked = 1 << 20};
    ck_assert_int_eq(zps_sndbuf_next(65536, 0, &mid), 65536);
}
END_TEST

static struct sockaddr_in s_in4(const char *a)
{
    struct sockaddr_in s = {.sin_family = AF_INET, .sin_port = htons(5555)};
    ck_assert_int_eq(inet_pton(AF_INET, a, &s.sin_addr), 1);
    return s;
}

static struct sockaddr_in6 s_in6(const char *a)
{
    struct sockaddr_in6 s = {.sin6_family = AF_INET6, .sin6_port = htons(5555)};
    ck_assert_int_eq(inet_pton(AF_INET6, a, &s.sin6_addr), 1);
    return s;
}

#define SA(x) ((const struct sockaddr *)&(x))

START_TEST(test_sndbuf_same_host_is_loopback_the_own_address_or_not_ip)
{
    struct sockaddr_in lo = s_in4("127.0.0.1"), lo2 = s_in4("127.0.1.1");
    struct sockaddr_in me = s_in4("10.77.0.10"), other = s_in4("10.77.0.100");
    ck_assert(zps_sndbuf_same_host(SA(lo), SA(lo)));
    ck_assert(zps_sndbuf_same_host(SA(me), SA(lo2)));
    ck_assert(zps_sndbuf_same_host(SA(me), SA(me)));
    ck_assert(!zps_sndbuf_same_host(SA(me), SA(other)));
    struct sockaddr_in6 lo6 = s_in6("::1"), mapped = s_in6("::ffff:127.0.0.1");
    struct sockaddr_in6 me6 = s_in6("fd00::10"), other6 = s_in6("fd00::100");
    struct sockaddr_in6 mapped_other = s_in6("::ffff:10.77.0.100");
    ck_assert(zps_sndbuf_same_host(SA(me6), SA(lo6)));
    ck_assert(zps_sndbuf_same_host(SA(me6), SA(mapped)));
    ck_assert(zps_sndbuf_same_host(SA(me6), SA(me6)));
    ck_assert(!zps_sndbuf_same_host(SA(me6), SA(other6)));
    ck_assert(!zps_sndbuf_same_host(SA(me6), SA(mapped_other)));
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    ck_assert(zps_sndbuf_same_host(SA(un), SA(un)));
}
END_TEST

// A size goes to ZMQ_SNDBUF, 0 and auto leave ZeroMQ's -1 (auto works on
// the connections instead); watched sockets carry messages both ways and
// their context ends (the watchers' PAIR sockets close on ETERM), whether
// the watched sockets close first or not at all before zmq_ctx_term's
// callers close them.
START_TEST(test_sndbuf_apply_sets_sizes_and_watched_sockets_work_and_end)
{
    void *ctx = zmq_ctx_new();
    void *router = zps_wire_socket(ctx, ZMQ_ROUTER, 2000);
    void *dealer = zps_wire_socket(ctx, ZMQ_DEALER, 2000);
    void *sized = zps_wire_socket(ctx, ZMQ_DEALER, 2000);
    ck_assert_ptr_nonnull(router);
    ck_assert_ptr_nonnull(dealer);
    ck_assert_ptr_nonnull(sized);
    int v = 0;
    size_t len = sizeof v;
    ck_assert_int_eq(zps_sndbuf_apply(ctx, sized, 32768), ZPS_OK);
    ck_assert_int_eq(zmq_getsockopt(sized, ZMQ_SNDBUF, &v, &len), 0);
    ck_assert_int_eq(v, 32768);
    ck_assert_int_eq(zps_sndbuf_apply(ctx, sized, 0), ZPS_OK);
    ck_assert_int_eq(zps_sndbuf_apply(ctx, router, ZPS_SNDBUF_AUTO), ZPS_OK);
    ck_assert_int_eq(zps_sndbuf_apply(ctx, dealer, ZPS_SNDBUF_AUTO), ZPS_OK);
    ck_assert_int_eq(zmq_getsockopt(dealer, ZMQ_SNDBUF, &v, &len), 0);
    ck_assert_int_eq(v, -1);
    ck_assert_int_eq(zmq_bind(router, "tcp://127.0.0.1:*"), 0);
    char ep[128];
    size_t eplen = sizeof ep;
    ck_assert_int_eq(zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, ep, &eplen), 0);
    ck_assert_int_eq(zmq_connect(dealer, ep), 0);
    // Several ticks' worth of traffic, so the watchers measure it.
    static char big[1 << 20];
    for (int i = 0; i < 8; i++) {
        ck_assert_int_eq(zmq_send(dealer, big, sizeof big, 0), (int)sizeof big);
        zmq_msg_t id, m;
        zmq_msg_init(&id);
        zmq_msg_init(&m);
        ck_assert_int_ge(zmq_msg_recv(&id, router, 0), 0);
        ck_assert_int_eq(zmq_msg_recv(&m, router, 0), (int)sizeof big);
        ck_assert_int_ge(zmq_msg_send(&id, router, ZMQ_SNDMORE), 0);
        ck_assert_int_eq(zmq_msg_send(&m, router, 0), (int)sizeof big);
        ck_assert_int_eq(zmq_recv(dealer, big, sizeof big, 0), (int)sizeof big);
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    zmq_close(dealer); // this watcher ends at its monitor's stop
    zmq_close(sized);
    zmq_close(router);
    ck_assert_int_eq(zmq_ctx_term(ctx), 0); // the tcase's timeout catches a hang
}
END_TEST

Suite *zps_suite_sndbuf(void)
{
    Suite *s = suite_create("sndbuf");
    TCase *tc = tcase_create("sndbuf");
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, test_sndbuf_flag_takes_auto_zero_and_a_size);
    tcase_add_test(tc, test_sndbuf_keeps_the_os_buffer_until_a_queue_stands);
    tcase_add_test(tc, test_sndbuf_a_standing_queue_leaves_the_path_and_a_share_of_the_queue);
    tcase_add_test(tc, test_sndbuf_without_a_queue_a_set_buffer_doubles_to_the_maximum);
    tcase_add_test(tc, test_sndbuf_same_host_is_loopback_the_own_address_or_not_ip);
    tcase_add_test(tc, test_sndbuf_apply_sets_sizes_and_watched_sockets_work_and_end);
    suite_add_tcase(s, tc);
    return s;
}
