/* check_shard_io.c - the shard's side of the wire (server/shard/zps_shard_io.h)
 * before and after its first plan: what it answers, through the refusal
 * hook the server gives it, and what it drops (a host's sum partly
 * counted: asking its leader for the rest); coded pushes and answers
 * (--wire-code zstd). */
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/zps_wirecode.h"
#include "server/shard/zps_shard.h"
#include "server/shard/zps_shard_io.h"
#include "tests/server/shard/zps_shard_fx.h"
#include "tests/zps_check.h"

typedef struct refusals {
    int n;                    // refusals the io asked the server to answer
    zps_err last;             // the code of the last one
    uint32_t offset[4], samples[4]; // the slice each of the first four names
} refusals;

static void s_refuse(void *arg, zps_wire_msg *m, zps_err err, const char *why)
{
    refusals *r = arg;
    (void)why;
    if (r->n < 4) {
        r->offset[r->n] = m->hdr->batch_offset;
        r->samples[r->n] = m->hdr->samples;
    }
    r->n++;
    r->last = err;
}

static uint64_t s_job_id(void *arg)
{
    (void)arg;
    return 1;
}

static void s_again(void *arg, zps_wire_msg *m)
{
    (void)arg;
    (void)m;
}

static void s_io_init(zps_shard_io *io, refusals *r)
{
    zps_shard_io_hooks hooks = {.arg = r, .refuse = s_refuse, .job_id = s_job_id,
                                .again = s_again};
    ck_assert_int_eq(zps_shard_io_init(io, NULL, 0, &hooks), ZPS_OK);
}

// Rank 0's push of `step`, generation 1, one f32 value.
static void s_push(zps_wire_msg *m, uint32_t rank, uint64_t step)
{
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__PUSH);
    h.rank = rank;
    h.member_id = zps_shard_fx_id[0];
    h.step = step;
    h.samples = zps_shard_fx_count[0];
    h.batch_offset = zps_shard_fx_offset[0];
    h.generation = 1;
    h.offset = 0;
    h.count = 1;
    h.dtype = ZPS__DTYPE__F32;
    float one = 1.0f;
    float *data = (float *)zps_shard_fx_msg(m, &h, sizeof one);
    *data = one;
}

// Rank r's push of step 0 of bucket b (the fixture's mlp:1-2-1: bucket 0
// is [4, 7), bucket 1 [0, 4)) over [batch_offset, +samples), with rank 0
// and 1's pieces when sum, from a peer with a routing id.
static void s_push_bucket(zps_wire_msg *m, int b, uint32_t r, uint32_t batch_offset,
                          uint32_t samples, bool sum)
{
    const zps_shard_fx_piece both[2] = {
        {0, zps_shard_fx_offset[0], zps_shard_fx_count[0]},
        {1, zps_shard_fx_offset[1], zps_shard_fx_count[1]},
    };
    const float half[4] = {0.5f, 0.5f, 0.5f, 0.5f};
    zps_shard_fx_push(m, r, zps_shard_fx_id[r], batch_offset, samples, both, sum ? 2 : 0,
                      b == 0 ? 4 : 0, b == 0 ? 3 : 4, half);
    ck_assert_int_eq(zmq_msg_init_size(&m->route, 5), 0);
    memcpy(zmq_msg_data(&m->route), "peer", 5);
    m->has_route = true;
}

// A started io over a new shard of the fixture's model and plan (the
// caller's to destroy).
static zps_shard *s_started(zps_shard_io *io, refusals *r)
{
    zps_model_spec model = zps_shard_fx_model();
    zps_shard_cfg cfg = {.index = 0, .lo = 0, .hi = model.n_params, .model = &model,
                         .seed = 4, .global_batch = ZPS_SHARD_FX_BATCH,
                         .dtype = ZPS_DTYPE_F32,
                         .optim = {.lr = 0.5f, .schedule = ZPS_LR_CONSTANT}};
    zps_shard *s = zps_shard_new(&cfg);
    ck_assert_ptr_nonnull(s);
    zps_shard_fx_add_plan(s);
    s_io_init(io, r);
    zps_shard_io_start(io, s, ZPS_DTYPE_F32);
    return s;
}

// The CI failure this guards: shard 0 restarted with --resume got a
// worker's push of step 70 a millisecond after it began to listen, before
// its coordinator took the members back. Refused (ESTATE, final to a
// worker), the push ended that worker; the rollback that follows tells it
// where to go instead.
START_TEST(test_shard_io_drops_a_push_that_reaches_a_restarted_shard_before_its_plan)
{
    zps_shard_io io;
    refusals r = {0};
    s_io_init(&io, &r);
    zps_wire_msg m;
    s_push(&m, 0, 70);
    int ready = 7;
    ck_assert_int_ne(zps_shard_io_on_push(&io, &m, &ready), ZPS_OK);
    ck_assert_int_eq(ready, -1);
    ck_assert_int_eq(r.n, 0);
    ck_assert_int_eq(io.n_held, 0);
    zps_wire_msg_fini(&m);
    zps_shard_io_fini(&io);
}
END_TEST

// Once started, what is wrong in a push is refused through the hook: the
// drop above is the state's, not a hook that is never called.
START_TEST(test_shard_io_refuses_a_rank_out_of_range_once_it_has_a_plan)
{
    zps_shard_io io;
    refusals r = {0};
    zps_shard *s = s_started(&io, &r);
    zps_wire_msg m;
    s_push(&m, ZPS_MAX_MEMBERS, 0);
    int ready = 7;
    ck_assert_int_ne(zps_shard_io_on_push(&io, &m, &ready), ZPS_OK);
    ck_assert_int_eq(ready, -1);
    ck_assert_int_eq(r.n, 1);
    ck_assert_int_eq(r.last, ZPS_ERANGE);
    zps_wire_msg_fini(&m);
    zps_shard_io_fini(&io);
    zps_shard_destroy(&s);
}
END_TEST

// A host leader's sum of which rank 1's own copy was counted first is
// dropped; its sender is told "not yet" for the run no one counted, rank
// 0's [0, 10), and that run pushed alone completes the bucket. Another
// copy of the sum, counted whole for its other bucket, asks for nothing.
START_TEST(test_shard_io_asks_the_leader_for_what_a_partly_counted_sum_took_with_it)
{
    zps_shard_io io;
    refusals r = {0};
    zps_shard *s = s_started(&io, &r);
    // A real socket to answer on: the parameters go to a peer not there,
    // which a ROUTER drops.
    void *ctx = zmq_ctx_new();
    void *sock = zmq_socket(ctx, ZMQ_ROUTER);
    ck_assert_ptr_nonnull(sock);
    io.sock = sock; // borrowed by the io
    zps_wire_msg m;
    int ready;
    s_push_bucket(&m, 1, 0, 0, 40, true); // bucket 1: the sum first, counted
    ck_assert_int_eq(zps_shard_io_on_push(&io, &m, &ready), ZPS_OK);
    zps_wire_msg_fini(&m);
    s_push_bucket(&m, 1, 0, 0, 40, true); // and again: counted whole, dropped silently
    ck_assert_int_eq(zps_shard_io_on_push(&io, &m, &ready), ZPS_EDUP);
    zps_wire_msg_fini(&m);
    ck_assert_int_eq(r.n, 0);
    s_push_bucket(&m, 0, 1, 10, 30, false); // bucket 0: rank 1's own copy first
    ck_assert_int_eq(zps_shard_io_on_push(&io, &m, &ready), ZPS_OK);
    zps_wire_msg_fini(&m);
    s_push_bucket(&m, 0, 0, 0, 40, true);
    ck_assert_int_eq(zps_shard_io_on_push(&io, &m, &ready), ZPS_EDUP);
    ck_assert_uint_eq(m.hdr->batch_offset, 0); // the message is put back as it came
    ck_assert_uint_eq(m.hdr->samples, 40);
    zps_wire_msg_fini(&m);
    ck_assert_int_eq(r.n, 1);
    ck_assert_int_eq(r.last, ZPS_EAGAIN);
    ck_assert_uint_eq(r.offset[0], 0);
    ck_assert_uint_eq(r.samples[0], 10);
    ck_assert(!zps_shard_step_done(s));
    s_push_bucket(&m, 0, 0, 0, 10, false);
    ck_assert_int_eq(zps_shard_io_on_push(&io, &m, &ready), ZPS_OK);
    ck_assert_int_ge(ready, 0);
    zps_wire_msg_fini(&m);
    ck_assert_int_eq(r.n, 1);
    zps_shard_io_fini(&io);
    zps_shard_destroy(&s);
    zmq_close(sock);
    zmq_ctx_term(ctx);
}
END_TEST

// Rank 0's push of the whole batch for bucket 0, coded (--wire-code
// zstd) with `code`, saying it holds step 0's values; a byte of its frame
// flipped if asked.
static void s_coded_push(zps_zcode *z, zps_wire_msg *m, uint32_t code, bool flip)
{
    s_push_bucket(m, 0, 0, 0, ZPS_SHARD_FX_BATCH, true);
    ck_assert_int_eq(zps_wirecode_encode(z, m, NULL), ZPS_OK);
    m->hdr->wire_code = code;
    m->hdr->code_base = 1;
    if (flip) {
        ((uint8_t *)zmq_msg_data(&m->frames[0]))[ZPS_ZCODE_HEADER] ^= 1;
    }
}

// A coded push the shard cannot decode is refused and counts nothing:
// coded against a base, or changed on the way. The same push coded right
// then completes the bucket alone, at a shard whose job does not code too
// (a coded push says what it is).
START_TEST(test_shard_io_refuses_a_coded_push_it_cannot_decode_and_counts_nothing)
{
    zps_shard_io io;
    refusals r = {0};
    zps_shard *s = s_started(&io, &r);
    zps_zcode *z = NULL;
    ck_assert_int_eq(zps_zcode_new(&z), ZPS_OK);
    zps_wire_msg m;
    int ready;
    s_coded_push(z, &m, ZPS_ZCODE_XOR, false);
    ck_assert_int_eq(zps_shard_io_on_push(&io, &m, &ready), ZPS_EPROTO);
    zps_wire_msg_fini(&m);
    ck_assert_ptr_null(io.code); // the job does not code: a coder made for the first to decode
    s_coded_push(z, &m, ZPS_ZCODE_PLANES, true);
    ck_assert_int_eq(zps_shard_io_on_push(&io, &m, &ready), ZPS_EPROTO);
    zps_wire_msg_fini(&m);
    ck_assert_int_eq(r.n, 2);
    ck_assert_int_eq(r.last, ZPS_EPROTO);
    ck_assert_int_eq(ready, -1);
    s_coded_push(z, &m, ZPS_ZCODE_PLANES, false);
    ck_assert_int_eq(zps_shard_io_on_push(&io, &m, &ready), ZPS_OK);
    ck_assert_int_eq(ready, 0);
    zps_wire_msg_fini(&m);
    ck_assert_int_eq(r.n, 2);
    zps_zcode_destroy(&z);
    zps_shard_io_fini(&io);
    zps_shard_destroy(&s);
}
END_TEST

// A shard with a coder over the fixture, a DEALER peer with the routing
// id s_push_bucket's pushes carry, and rank 0's push of bucket 0 (coded,
// saying it holds step code_base - 1's values) counted and applied: *a is
// the answer the peer received. held: bucket 0's step 0 values.
typedef struct answered {
    zps_shard_io io;
    refusals r;
    zps_shard *s;
    void *ctx, *sock, *peer;
    zps_zcode *z;
    float held[3]; // bucket 0 is [4, 7)
    zps_wire_msg a;
} answered;

static void s_answer(answered *t, uint64_t code_base)
{
    memset(t, 0, sizeof *t);
    t->s = s_started(&t->io, &t->r);
    ck_assert_int_eq(zps_shard_io_code(&t->io), ZPS_OK);
    t->ctx = zmq_ctx_new();
    t->sock = zps_wire_socket(t->ctx, ZMQ_ROUTER, 5000);
    t->peer = zps_wire_socket(t->ctx, ZMQ_DEALER, 5000);
    ck_assert_int_eq(zmq_setsockopt(t->peer, ZMQ_ROUTING_ID, "peer", 5), 0);
    ck_assert_int_eq(zmq_bind(t->sock, "inproc://check-shard-io-coded"), 0);
    ck_assert_int_eq(zmq_connect(t->peer, "inproc://check-shard-io-coded"), 0);
    t->io.sock = t->sock;
    const float *at;
    ck_assert_int_eq(zps_shard_bucket_at(t->s, 0, 0, &at), ZPS_OK);
    memcpy(t->held, at, sizeof t->held);
    ck_assert_int_eq(zps_zcode_new(&t->z), ZPS_OK);
    zps_wire_msg m;
    int ready;
    s_coded_push(t->z, &m, ZPS_ZCODE_PLANES, false);
    m.hdr->code_base = code_base;
    ck_assert_int_eq(zps_shard_io_on_push(&t->io, &m, &ready), ZPS_OK);
    ck_assert_int_eq(ready, 0);
    zps_wire_msg_fini(&m);
    zps_shard_io_apply(&t->io, 0);
    ck_assert_int_eq(zps_wire_recv(t->peer, false, &t->a), ZPS_OK);
    ck_assert_int_eq(t->a.hdr->type, ZPS__MSG_TYPE__PARAMS);
    ck_assert_uint_eq(t->a.hdr->step, 1);
    ck_assert_int_eq(t->r.n, 0);
}

// The answer's values, decoded, are the shard's step 1 values of bucket
// 0, which the step moved from those held.
static void s_answer_is_step_1(answered *t)
{
    const float *at;
    ck_assert_int_eq(zps_shard_bucket_at(t->s, 0, 1, &at), ZPS_OK);
    ck_assert_int_eq(t->a.n_frames, 1);
    ck_assert_uint_eq(zmq_msg_size(&t->a.frames[0]), sizeof t->held);
    ck_assert_mem_eq(zmq_msg_data(&t->a.frames[0]), at, sizeof t->held);
    ck_assert(memcmp(t->held, at, sizeof t->held) != 0);
}

static void s_answered_fini(answered *t)
{
    zps_wire_msg_fini(&t->a);
    zps_zcode_destroy(&t->z);
    zps_shard_io_fini(&t->io);
    zps_shard_destroy(&t->s);
    zps_wire_close(&t->peer);
    zps_wire_close(&t->sock);
    zmq_ctx_term(t->ctx);
}

// A coded push is counted as its values, and the answer to a pusher that
// holds the step's values goes coded against them: it decodes, against
// what the pusher holds, to the shard's new values bit for bit.
START_TEST(test_shard_io_answers_a_coded_push_xored_with_the_values_its_pusher_holds)
{
    answered t;
    s_answer(&t, 1); // holds step 0
    ck_assert_uint_eq(t.a.hdr->wire_code, ZPS_ZCODE_XOR);
    ck_assert_uint_eq(t.a.hdr->code_base, 1);
    char why[200] = "";
    ck_assert_msg(zps_wirecode_decode(t.z, &t.a, t.held, 3, why, sizeof why) == ZPS_OK, "%s",
                  why);
    s_answer_is_step_1(&t);
    s_answered_fini(&t);
}
END_TEST

// A pusher that holds no step, or another than the one the answer moves
// from, gets it uncoded: the shard codes only against what it holds.
START_TEST(test_shard_io_answers_uncoded_a_pusher_that_holds_another_step)
{
    const uint64_t bases[] = {0, 2};
    for (size_t k = 0; k < sizeof bases / sizeof bases[0]; k++) {
        answered t;
        s_answer(&t, bases[k]);
        ck_assert_uint_eq(t.a.hdr->wire_code, ZPS_ZCODE_NONE);
        s_answer_is_step_1(&t);
        s_answered_fini(&t);
    }
}
END_TEST

Suite *zps_suite_shard_io(void)
{
    Suite *s = suite_create("shard_io");
    TCase *tc = tcase_create("push");
    tcase_add_test(tc, test_shard_io_drops_a_push_that_reaches_a_restarted_shard_before_its_plan);
    tcase_add_test(tc, test_shard_io_refuses_a_rank_out_of_range_once_it_has_a_plan);
    tcase_add_test(tc, test_shard_io_asks_the_leader_for_what_a_partly_counted_sum_took_with_it);
    tcase_add_test(tc, test_shard_io_refuses_a_coded_push_it_cannot_decode_and_counts_nothing);
    tcase_add_test(tc, test_shard_io_answers_a_coded_push_xored_with_the_values_its_pusher_holds);
    tcase_add_test(tc, test_shard_io_answers_uncoded_a_pusher_that_holds_another_step);
    suite_add_tcase(s, tc);
    return s;
}
