/* check_outbox.c - the coordinator's outbox: messages queued keep their
 * order and their bytes until the loop sends them, on a real ROUTER, each
 * to its own peer; a header that pointed into the caller's stack is
 * packed when queued, not when sent. */
#include <string.h>
#include <zmq.h>

#include "server/coord/zps_outbox.h"
#include "tests/zps_check.h"

// A route as shard 0's ROUTER names a peer that set its identity.
static void s_route(zmq_msg_t *r, const char *id)
{
    ck_assert_int_eq(zmq_msg_init_size(r, strlen(id)), 0);
    memcpy(zmq_msg_data(r), id, strlen(id));
}

static void s_queue_error(zps_outbox *o, zmq_msg_t *route, uint64_t step)
{
    char why[32];
    snprintf(why, sizeof why, "step %llu", (unsigned long long)step);
    ck_assert_int_eq(zps_outbox_add_error(o, route, 7, step, ZPS_EINVAL, why), ZPS_OK);
    memset(why, 'x', sizeof why - 1); // queued already: changing it changes nothing
}

START_TEST(test_outbox_keeps_order_and_bytes_until_flushed_to_each_peer)
{
    void *ctx = zmq_ctx_new();
    void *router = zps_wire_socket(ctx, ZMQ_ROUTER, 1000);
    void *a = zps_wire_socket(ctx, ZMQ_DEALER, 1000), *b = zps_wire_socket(ctx, ZMQ_DEALER, 1000);
    ck_assert_int_eq(zmq_setsockopt(a, ZMQ_ROUTING_ID, "a", 1), 0);
    ck_assert_int_eq(zmq_setsockopt(b, ZMQ_ROUTING_ID, "b", 1), 0);
    ck_assert_int_eq(zmq_bind(router, "inproc://outbox"), 0);
    ck_assert_int_eq(zmq_connect(a, "inproc://outbox"), 0);
    ck_assert_int_eq(zmq_connect(b, "inproc://outbox"), 0);
    Zps__Header hello;
    zps_wire_header_init(&hello, ZPS__MSG_TYPE__HEARTBEAT); // routes exist once peers spoke
    ck_assert_int_eq(zps_wire_send(a, NULL, &hello, NULL, 0, NULL), ZPS_OK);
    ck_assert_int_eq(zps_wire_send(b, NULL, &hello, NULL, 0, NULL), ZPS_OK);
    for (int i = 0; i < 2; i++) {
        zps_wire_msg m;
        ck_assert_int_eq(zps_wire_recv(router, true, &m), ZPS_OK);
        zps_wire_msg_fini(&m);
    }
    zps_outbox o;
    zps_outbox_init(&o);
    zmq_msg_t ra, rb;
    s_route(&ra, "a");
    s_route(&rb, "b");
    for (uint64_t step = 0; step < 40; step++) { // past the first allocation
        s_queue_error(&o, step % 3 ? &ra : &rb, step);
    }
    ck_assert_uint_eq(o.n, 40);
    Zps__Header *h = zps_outbox_header(&o, 5);
    ck_assert_ptr_nonnull(h);
    ck_assert_str_eq(h->error, "step 5");
    zps__header__free_unpacked(h, NULL);
    ck_assert_ptr_null(zps_outbox_header(&o, 40));
    ck_assert_int_eq(zps_outbox_flush(&o, router), ZPS_OK);
    ck_assert_uint_eq(o.n, 0);
    for (uint64_t step = 0; step < 40; step++) {
        zps_wire_msg m;
        ck_assert_int_eq(zps_wire_recv(step % 3 ? a : b, false, &m), ZPS_OK);
        ck_assert_int_eq(m.hdr->type, ZPS__MSG_TYPE__ERROR);
        ck_assert_uint_eq(m.hdr->step, step); // each peer's in the order queued
        char why[32];
        snprintf(why, sizeof why, "step %llu", (unsigned long long)step);
        ck_assert_str_eq(m.hdr->error, why);
        zps_wire_msg_fini(&m);
    }
    s_queue_error(&o, &ra, 99);
    zps_outbox_clear(&o); // dropped, not sent
    zps_wire_msg m;
    ck_assert_int_eq(zps_wire_recv(a, false, &m), ZPS_ETIMEDOUT);
    zps_outbox_fini(&o);
    zmq_msg_close(&ra);
    zmq_msg_close(&rb);
    zps_wire_close(&a);
    zps_wire_close(&b);
    zps_wire_close(&router);
    zmq_ctx_term(ctx);
}
END_TEST

Suite *zps_suite_outbox(void)
{
    Suite *s = suite_create("outbox");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_outbox_keeps_order_and_bytes_until_flushed_to_each_peer);
    suite_add_tcase(s, tc);
    return s;
}
