/* check_wire.c - framing over real ZeroMQ sockets (inproc ROUTER/DEALER),
 * every validation failure of zps_wire, sends that fail part-way leaving
 * nothing behind, and the plan's split. */
#include <stdlib.h>
#include <string.h>

#include "common/zps_plan.h"
#include "common/zps_wire.h"
#include "tests/zps_check.h"

typedef struct pair {
    void *ctx, *router, *dealer;
} pair;

static pair s_pair(void)
{
    pair p;
    p.ctx = zmq_ctx_new();
    p.router = zps_wire_socket(p.ctx, ZMQ_ROUTER, 2000);
    p.dealer = zps_wire_socket(p.ctx, ZMQ_DEALER, 2000);
    ck_assert_int_eq(zmq_bind(p.router, "inproc://wire"), 0);
    ck_assert_int_eq(zmq_connect(p.dealer, "inproc://wire"), 0);
    return p;
}

static void s_pair_close(pair *p)
{
    zmq_close(p->router);
    zmq_close(p->dealer);
    zmq_ctx_term(p->ctx);
}

// Sends raw frames from the dealer, as a hostile or broken peer would.
static void s_send_raw(void *sock, const void *const *parts, const size_t *lens, int n)
{
    for (int i = 0; i < n; i++) {
        ck_assert_int_ge(zmq_send(sock, parts[i], lens[i], i + 1 < n ? ZMQ_SNDMORE : 0), 0);
    }
}

START_TEST(test_wire_round_trip_with_multi_frame_tensor)
{
    pair p = s_pair();
    size_t n = ZPS_WIRE_FRAME_BYTES / sizeof(float) * 2 + 3; // three frames
    float *t = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        t[i] = (float)i * 0.5f;
    }
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__PUSH);
    h.job_id = 42;
    h.step = 7;
    h.offset = 10;
    h.count = n;
    h.dtype = ZPS__DTYPE__F32;
    h.samples = 64;
    h.loss = 1.25f;
    zps_wire_ref ref = {0};
    ck_assert_int_eq(zps_wire_send(p.dealer, NULL, &h, t, n * sizeof(float), &ref), ZPS_OK);

    zps_wire_msg m;
    ck_assert_int_eq(zps_wire_recv(p.router, true, &m), ZPS_OK);
    ck_assert(m.has_route);
    ck_assert_int_eq(m.hdr->type, ZPS__MSG_TYPE__PUSH);
    ck_assert_uint_eq(m.hdr->job_id, 42);
    ck_assert_uint_eq(m.hdr->step, 7);
    ck_assert_uint_eq(m.hdr->samples, 64);
    ck_assert_float_eq(m.hdr->loss, 1.25f);
    ck_assert_int_eq(m.n_frames, 3);
    char why[128];
    ck_assert_int_eq(zps_wire_check_tensor(&m, ZPS__DTYPE__F32, 0, n + 10, why, sizeof why),
                     ZPS_OK);
    float *back = malloc(n * sizeof(float));
    zps_wire_copy_payload(&m, back);
    ck_assert_mem_eq(back, t, n * sizeof(float));

    // The reply goes back through the routing id.
    Zps__Header r;
    zps_wire_header_init(&r, ZPS__MSG_TYPE__PARAMS);
    r.step = 8;
    ck_assert_int_eq(zps_wire_send(p.router, &m.route, &r, NULL, 0, NULL), ZPS_OK);
    zps_wire_msg_fini(&m);
    ck_assert_int_eq(zps_wire_recv(p.dealer, false, &m), ZPS_OK);
    ck_assert_int_eq(m.hdr->type, ZPS__MSG_TYPE__PARAMS);
    ck_assert_uint_eq(m.hdr->step, 8);
    zps_wire_msg_fini(&m);

    // Every zero-copy frame was released by ZeroMQ.
    ck_assert_int_eq(zps_wire_ref_wait(&ref, 2000), ZPS_OK);
    free(back);
    free(t);
    s_pair_close(&p);
}
END_TEST

START_TEST(test_wire_refuses_undecodable_header_but_keeps_route)
{
    pair p = s_pair();
    static const char junk[] = "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff garbage";
    const void *parts[] = {junk};
    size_t lens[] = {sizeof junk};
    s_send_raw(p.dealer, parts, lens, 1);
    zps_wire_msg m;
    ck_assert_int_eq(zps_wire_recv(p.router, true, &m), ZPS_EPROTO);
    ck_assert(m.has_route);
    ck_assert_ptr_null(m.hdr);
    // The error reply reaches the sender.
    zps_wire_send_error(p.router, &m.route, 0, 0, ZPS_EPROTO, "nope");
    zps_wire_msg_fini(&m);
    ck_assert_int_eq(zps_wire_recv(p.dealer, false, &m), ZPS_OK);
    ck_assert_int_eq(m.hdr->type, ZPS__MSG_TYPE__ERROR);
    ck_assert_int_eq(m.hdr->error_code, ZPS_EPROTO);
    ck_assert_str_eq(m.hdr->error, "nope");
    zps_wire_msg_fini(&m);
    s_pair_close(&p);
}
END_TEST

START_TEST(test_wire_refuses_truncated_header)
{
    pair p = s_pair();
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__PUSH);
    h.job_id = 0x1122334455667788ull;
    uint8_t buf[64];
    size_t len = zps__header__pack(&h, buf);
    const void *parts[] = {buf};
    size_t lens[] = {len - 3};
    s_send_raw(p.dealer, parts, lens, 1);
    zps_wire_msg m;
    ck_assert_int_eq(zps_wire_recv(p.router, true, &m), ZPS_EPROTO);
    zps_wire_msg_fini(&m);
    s_pair_close(&p);
}
END_TEST

START_TEST(test_wire_refuses_other_protocol_version)
{
    pair p = s_pair();
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__STATUS);
    h.version = ZPS_WIRE_VERSION + 1;
    ck_assert_int_eq(zps_wire_send(p.dealer, NULL, &h, NULL, 0, NULL), ZPS_OK);
    zps_wire_msg m;
    ck_assert_int_eq(zps_wire_recv(p.router, true, &m), ZPS_EVERSION);
    ck_assert_uint_eq(m.hdr->version, ZPS_WIRE_VERSION + 1);
    zps_wire_msg_fini(&m);
    s_pair_close(&p);
}
END_TEST

START_TEST(test_wire_refuses_too_many_frames_and_stays_in_sync)
{
    pair p = s_pair();
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__PUSH);
    uint8_t hb[64];
    size_t hl = zps__header__pack(&h, hb);
    ck_assert_int_ge(zmq_send(p.dealer, hb, hl, ZMQ_SNDMORE), 0);
    float x = 1;
    for (int i = 0; i < ZPS_WIRE_MAX_FRAMES + 5; i++) {
        ck_assert_int_ge(zmq_send(p.dealer, &x, sizeof x, i + 1 < ZPS_WIRE_MAX_FRAMES + 5 ? ZMQ_SNDMORE : 0), 0);
    }
    zps_wire_header_init(&h, ZPS__MSG_TYPE__STATUS);
    ck_assert_int_eq(zps_wire_send(p.dealer, NULL, &h, NULL, 0, NULL), ZPS_OK);
    zps_wire_msg m;
    ck_assert_int_eq(zps_wire_recv(p.router, true, &m), ZPS_EPROTO);
    zps_wire_msg_fini(&m);
    // The rest of the oversized message was drained: the next one reads whole.
    ck_assert_int_eq(zps_wire_recv(p.router, true, &m), ZPS_OK);
    ck_assert_int_eq(m.hdr->type, ZPS__MSG_TYPE__STATUS);
    zps_wire_msg_fini(&m);
    s_pair_close(&p);
}
END_TEST

// Sends a tensor header with a payload of `bytes` bytes in frames of `frame`.
static void s_send_tensor(void *sock, Zps__DType dtype, uint64_t off, uint64_t count,
                          size_t bytes, size_t frame)
{
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__PUSH);
    h.dtype = dtype;
    h.offset = off;
    h.count = count;
    uint8_t hb[64];
    size_t hl = zps__header__pack(&h, hb);
    ck_assert_int_ge(zmq_send(sock, hb, hl, bytes ? ZMQ_SNDMORE : 0), 0);
    uint8_t *payload = calloc(1, bytes + 1);
    for (size_t sent = 0; sent < bytes; sent += frame) {
        size_t len = bytes - sent < frame ? bytes - sent : frame;
        ck_assert_int_ge(zmq_send(sock, payload + sent, len, sent + len < bytes ? ZMQ_SNDMORE : 0), 0);
    }
    free(payload);
}

// Checks a tensor sent as `dtype` against a job whose dtype is `want`.
static zps_err s_check_as(pair *p, Zps__DType want, Zps__DType dtype, uint64_t off,
                          uint64_t count, size_t bytes, size_t frame)
{
    s_send_tensor(p->dealer, dtype, off, count, bytes, frame);
    zps_wire_msg m;
    ck_assert_int_eq(zps_wire_recv(p->router, true, &m), ZPS_OK);
    char why[128] = "";
    zps_err err = zps_wire_check_tensor(&m, want, 100, 200, why, sizeof why);
    ck_assert(err == ZPS_OK || why[0] != '\0');
    zps_wire_msg_fini(&m);
    return err;
}

static zps_err s_check(pair *p, Zps__DType dtype, uint64_t off, uint64_t count, size_t bytes,
                       size_t frame)
{
    return s_check_as(p, ZPS__DTYPE__F32, dtype, off, count, bytes, frame);
}

START_TEST(test_wire_check_tensor_bounds_dtype_and_length)
{
    pair p = s_pair();
    ck_assert_int_eq(s_check(&p, ZPS__DTYPE__F32, 100, 100, 400, 400), ZPS_OK);
    ck_assert_int_eq(s_check(&p, ZPS__DTYPE__F32, 150, 10, 40, 8), ZPS_OK);
    ck_assert_int_eq(s_check(&p, ZPS__DTYPE__BF16, 100, 10, 20, 20), ZPS_EPROTO);
    ck_assert_int_eq(s_check(&p, 77, 100, 10, 40, 40), ZPS_EPROTO);
    ck_assert_int_eq(s_check(&p, ZPS__DTYPE__F32, 99, 10, 40, 40), ZPS_ERANGE);
    ck_assert_int_eq(s_check(&p, ZPS__DTYPE__F32, 195, 10, 40, 40), ZPS_ERANGE);
    ck_assert_int_eq(s_check(&p, ZPS__DTYPE__F32, 200, 1, 4, 4), ZPS_ERANGE);
    ck_assert_int_eq(s_check(&p, ZPS__DTYPE__F32, 100, 0, 0, 1), ZPS_ERANGE);
    // count * 4 wraps around 2^64 to the payload length
    ck_assert_int_eq(s_check(&p, ZPS__DTYPE__F32, 100, (1ull << 62) + 1, 4, 4), ZPS_ERANGE);
    ck_assert_int_eq(s_check(&p, ZPS__DTYPE__F32, 100, 10, 36, 36), ZPS_EPROTO);
    ck_assert_int_eq(s_check(&p, ZPS__DTYPE__F32, 100, 10, 44, 44), ZPS_EPROTO);
    ck_assert_int_eq(s_check(&p, ZPS__DTYPE__F32, 100, 10, 40, 6), ZPS_EPROTO);
    // 16-bit jobs: two bytes an element, frames of whole elements.
    ck_assert_int_eq(s_check_as(&p, ZPS__DTYPE__BF16, ZPS__DTYPE__BF16, 100, 10, 20, 20), ZPS_OK);
    ck_assert_int_eq(s_check_as(&p, ZPS__DTYPE__F16, ZPS__DTYPE__F16, 100, 10, 20, 4), ZPS_OK);
    ck_assert_int_eq(s_check_as(&p, ZPS__DTYPE__BF16, ZPS__DTYPE__BF16, 100, 10, 40, 40),
                     ZPS_EPROTO);
    ck_assert_int_eq(s_check_as(&p, ZPS__DTYPE__BF16, ZPS__DTYPE__BF16, 100, 10, 20, 5),
                     ZPS_EPROTO);
    ck_assert_int_eq(s_check_as(&p, ZPS__DTYPE__BF16, ZPS__DTYPE__F16, 100, 10, 20, 20),
                     ZPS_EPROTO);
    s_pair_close(&p);
}
END_TEST

START_TEST(test_wire_recv_times_out)
{
    pair p = s_pair();
    int ms = 50;
    zmq_setsockopt(p.router, ZMQ_RCVTIMEO, &ms, sizeof ms);
    zps_wire_msg m;
    ck_assert_int_eq(zps_wire_recv(p.router, true, &m), ZPS_ETIMEDOUT);
    zps_wire_msg_fini(&m);
    s_pair_close(&p);
}
END_TEST

// --sndbuf: 0 leaves the OS's buffer (ZeroMQ's -1), a size is set as given.
START_TEST(test_wire_sndbuf_zero_keeps_the_os_default_and_a_size_is_set)
{
    void *ctx = zmq_ctx_new();
    void *s = zps_wire_socket(ctx, ZMQ_DEALER, 100);
    ck_assert_ptr_nonnull(s);
    int v = 0;
    size_t len = sizeof v;
    ck_assert_int_eq(zps_wire_set_sndbuf(s, 0), ZPS_OK);
    ck_assert_int_eq(zmq_getsockopt(s, ZMQ_SNDBUF, &v, &len), 0);
    ck_assert_int_eq(v, -1);
    ck_assert_int_eq(zps_wire_set_sndbuf(s, 32768), ZPS_OK);
    ck_assert_int_eq(zmq_getsockopt(s, ZMQ_SNDBUF, &v, &len), 0);
    ck_assert_int_eq(v, 32768);
    zmq_close(s);
    zmq_ctx_term(ctx);
}
END_TEST

// ---------------------------------------------------------------------------

// A PUSH of 3 payload frames (plus the header, plus the routing id from a
// ROUTER): the message whose parts a failure may hit.
static float *s_three_frames(size_t *n)
{
    *n = ZPS_WIRE_FRAME_BYTES / sizeof(float) * 2 + 5;
    float *t = malloc(*n * sizeof(float));
    for (size_t i = 0; i < *n; i++) {
        t[i] = (float)i;
    }
    return t;
}

// Receives one message and checks it is whole: the step it carries and
// the frames it should have.
static void s_expect_whole(void *sock, bool router, uint64_t step, int frames)
{
    zps_wire_msg m;
    ck_assert_int_eq(zps_wire_recv(sock, router, &m), ZPS_OK);
    ck_assert_uint_eq(m.hdr->step, step);
    ck_assert_int_eq(m.n_frames, frames);
    zps_wire_msg_fini(&m);
}

// SQLite's FAULTSIM: the loop's index is the part that fails to be built,
// from either end of a pair (a ROUTER's first part is the routing id). The
// message must vanish whole: the next one arrives alone, in one piece,
// and nothing else follows it. Zero-copy frames built before the failure
// are released.
START_TEST(test_wire_send_that_fails_mid_message_leaves_nothing_the_next_message_arrives_whole)
{
    int nth = _i;
    pair p = s_pair();
    size_t n;
    float *t = s_three_frames(&n);
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__PUSH);
    h.count = n;
    // Dealer to router: header, frame, frame, frame.
    zps_wire_ref ref = {0};
    h.step = 1;
    zps_wire_inject_fault(ZPS_WIRE_FAULT_BUILD, nth);
    ck_assert_int_eq(zps_wire_send(p.dealer, NULL, &h, t, n * sizeof(float), &ref),
                     nth < 4 ? ZPS_ENOMEM : ZPS_OK);
    zps_wire_inject_fault(ZPS_WIRE_FAULT_BUILD, -1);
    h.step = 2;
    ck_assert_int_eq(zps_wire_send(p.dealer, NULL, &h, t, n * sizeof(float), NULL), ZPS_OK);
    if (nth >= 4) {
        s_expect_whole(p.router, true, 1, 3);
    }
    zps_wire_msg m;
    ck_assert_int_eq(zps_wire_recv(p.router, true, &m), ZPS_OK);
    ck_assert_uint_eq(m.hdr->step, 2);
    ck_assert_int_eq(m.n_frames, 3);
    ck_assert_int_eq(zps_wire_ref_wait(&ref, 2000), ZPS_OK);
    // Router to dealer: routing id, header, frame, frame, frame.
    h.step = 3;
    zps_wire_inject_fault(ZPS_WIRE_FAULT_BUILD, nth);
    ck_assert_int_eq(zps_wire_send(p.router, &m.route, &h, t, n * sizeof(float), &ref),
                     nth < 5 ? ZPS_ENOMEM : ZPS_OK);
    zps_wire_inject_fault(ZPS_WIRE_FAULT_BUILD, -1);
    h.step = 4;
    ck_assert_int_eq(zps_wire_send(p.router, &m.route, &h, t, n * sizeof(float), NULL), ZPS_OK);
    zps_wire_msg_fini(&m);
    if (nth >= 5) {
        s_expect_whole(p.dealer, false, 3, 3);
    }
    s_expect_whole(p.dealer, false, 4, 3);
    ck_assert_int_eq(zps_wire_recv(p.dealer, false, &m), ZPS_ETIMEDOUT); // nothing glued behind
    zps_wire_msg_fini(&m);
    ck_assert_int_eq(zps_wire_ref_wait(&ref, 2000), ZPS_OK);
    free(t);
    s_pair_close(&p);
}
END_TEST

// A signal during a send (EINTR, before libzmq queued the part) makes that
// part go again: the message arrives whole, once.
START_TEST(test_wire_send_interrupted_by_a_signal_sends_the_part_again_whole)
{
    int nth = _i;
    pair p = s_pair();
    size_t n;
    float *t = s_three_frames(&n);
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__PUSH);
    h.step = 9;
    zps_wire_inject_fault(ZPS_WIRE_FAULT_EINTR, nth);
    ck_assert_int_eq(zps_wire_send(p.dealer, NULL, &h, t, n * sizeof(float), NULL), ZPS_OK);
    zps_wire_inject_fault(ZPS_WIRE_FAULT_EINTR, -1);
    s_expect_whole(p.router, true, 9, 3);
    zps_wire_msg m;
    ck_assert_int_eq(zps_wire_recv(p.router, true, &m), ZPS_ETIMEDOUT);
    zps_wire_msg_fini(&m);
    free(t);
    s_pair_close(&p);
}
END_TEST

START_TEST(test_wire_send_refuses_more_frames_than_a_receiver_takes)
{
    pair p = s_pair();
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__PUSH);
    // Never read: the size alone is refused before anything is built.
    static const float one = 1;
    size_t too_big = (size_t)ZPS_WIRE_FRAME_BYTES * ZPS_WIRE_MAX_FRAMES + 1;
    ck_assert_int_eq(zps_wire_send(p.dealer, NULL, &h, &one, too_big, NULL), ZPS_EINVAL);
    zps_wire_msg m;
    ck_assert_int_eq(zps_wire_recv(p.router, true, &m), ZPS_ETIMEDOUT);
    zps_wire_msg_fini(&m);
    s_pair_close(&p);
}
END_TEST

// The message table reads who sent a message from its metadata: over TCP
// the peer's address; no User-Id without CURVE.
START_TEST(test_wire_recv_gives_the_peer_address_over_tcp)
{
    void *ctx = zmq_ctx_new();
    void *router = zps_wire_socket(ctx, ZMQ_ROUTER, 2000);
    void *dealer = zps_wire_socket(ctx, ZMQ_DEALER, 2000);
    ck_assert_int_eq(zmq_bind(router, "tcp://127.0.0.1:*"), 0);
    char ep[128];
    size_t len = sizeof ep;
    ck_assert_int_eq(zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, ep, &len), 0);
    ck_assert_int_eq(zmq_connect(dealer, ep), 0);
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__STATUS);
    ck_assert_int_eq(zps_wire_send(dealer, NULL, &h, NULL, 0, NULL), ZPS_OK);
    zps_wire_msg m;
    ck_assert_int_eq(zps_wire_recv(router, true, &m), ZPS_OK);
    ck_assert_str_eq(m.peer, "127.0.0.1");
    ck_assert_str_eq(m.user_id, "");
    zps_wire_msg_fini(&m);
    zps_wire_close(&router);
    zps_wire_close(&dealer);
    ck_assert_ptr_null(router);
    zmq_ctx_term(ctx);
}
END_TEST

START_TEST(test_plan_split_fixed_and_even_shares)
{
    zps_plan p = {0};
    char why[128];
    uint32_t even[2] = {0, 0};
    ck_assert_int_eq(zps_plan_split(64, even, 2, &p, why, sizeof why), ZPS_OK);
    ck_assert_uint_eq(p.slices[0].count, 32);
    ck_assert_uint_eq(p.slices[1].offset, 32);
    uint32_t mixed[3] = {0, 16, 0};
    ck_assert_int_eq(zps_plan_split(67, mixed, 3, &p, why, sizeof why), ZPS_OK);
    ck_assert_uint_eq(p.slices[0].count, 26); // (67 - 16) = 51: 26 + 25
    ck_assert_uint_eq(p.slices[1].count, 16);
    ck_assert_uint_eq(p.slices[1].offset, 26);
    ck_assert_uint_eq(p.slices[2].count, 25);
    ck_assert_uint_eq(p.slices[2].offset, 42);
    uint32_t fixed[2] = {16, 48};
    ck_assert_int_eq(zps_plan_split(64, fixed, 2, &p, why, sizeof why), ZPS_OK);
    ck_assert_uint_eq(p.slices[1].offset, 16);
    zps_plan_fini(&p);
}
END_TEST

START_TEST(test_plan_split_refuses_impossible_shares)
{
    zps_plan p = {0};
    char why[128];
    uint32_t too_big[2] = {60, 10};
    uint32_t short_fixed[2] = {10, 10};
    uint32_t no_room[3] = {63, 0, 0};
    ck_assert_int_eq(zps_plan_split(64, too_big, 2, &p, why, sizeof why), ZPS_EINVAL);
    ck_assert_int_eq(zps_plan_split(64, short_fixed, 2, &p, why, sizeof why), ZPS_EINVAL);
    ck_assert_int_eq(zps_plan_split(64, no_room, 3, &p, why, sizeof why), ZPS_EINVAL);
    ck_assert_int_eq(zps_plan_split(64, too_big, 0, &p, why, sizeof why), ZPS_EINVAL);
    zps_plan_fini(&p);
}
END_TEST

START_TEST(test_plan_from_wire_checks_tiling)
{
    Zps__Slice a = ZPS__SLICE__INIT, b = ZPS__SLICE__INIT;
    a.rank = 0, a.offset = 0, a.count = 20;
    b.rank = 1, b.offset = 20, b.count = 44;
    Zps__Slice *s[2] = {&a, &b};
    zps_plan p = {0};
    ck_assert_int_eq(zps_plan_from_wire(s, 2, 64, &p), ZPS_OK);
    ck_assert_uint_eq(p.n, 2);
    ck_assert_int_eq(zps_plan_from_wire(s, 2, 65, &p), ZPS_EPROTO);
    b.offset = 21;
    ck_assert_int_eq(zps_plan_from_wire(s, 2, 65, &p), ZPS_EPROTO);
    b.offset = 20;
    b.rank = 0;
    ck_assert_int_eq(zps_plan_from_wire(s, 2, 64, &p), ZPS_EPROTO);
    b.rank = ZPS_MAX_MEMBERS; // past every per-rank table
    ck_assert_int_eq(zps_plan_from_wire(s, 2, 64, &p), ZPS_EPROTO);
    ck_assert_ptr_null(p.slices); // refused: nothing kept
    zps_plan_fini(&p);
}
END_TEST

Suite *zps_suite_wire(void)
{
    Suite *s = suite_create("wire");
    TCase *tc = tcase_create("frames");
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, test_wire_round_trip_with_multi_frame_tensor);
    tcase_add_test(tc, test_wire_refuses_undecodable_header_but_keeps_route);
    tcase_add_test(tc, test_wire_refuses_truncated_header);
    tcase_add_test(tc, test_wire_refuses_other_protocol_version);
    tcase_add_test(tc, test_wire_refuses_too_many_frames_and_stays_in_sync);
    tcase_add_test(tc, test_wire_check_tensor_bounds_dtype_and_length);
    tcase_add_test(tc, test_wire_recv_times_out);
    tcase_add_test(tc, test_wire_sndbuf_zero_keeps_the_os_default_and_a_size_is_set);
    tcase_add_loop_test(
        tc, test_wire_send_that_fails_mid_message_leaves_nothing_the_next_message_arrives_whole,
        0, 6);
    tcase_add_loop_test(tc, test_wire_send_interrupted_by_a_signal_sends_the_part_again_whole,
                        0, 4);
    tcase_add_test(tc, test_wire_send_refuses_more_frames_than_a_receiver_takes);
    tcase_add_test(tc, test_wire_recv_gives_the_peer_address_over_tcp);
    suite_add_tcase(s, tc);
    TCase *tp = tcase_create("plan");
    tcase_add_test(tp, test_plan_split_fixed_and_even_shares);
    tcase_add_test(tp, test_plan_split_refuses_impossible_shares);
    tcase_add_test(tp, test_plan_from_wire_checks_tiling);
    suite_add_tcase(s, tp);
    return s;
}
