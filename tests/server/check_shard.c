/* check_shard.c - the shard's accumulate/average/update arithmetic and its
 * refusals, fed messages built as the wire would deliver them. */
#include <string.h>

#include "server/zps_shard.h"
#include "tests/zps_check.h"

#define LO 100
#define HI 104

// A PUSH as zps_wire_recv would return it: decoded header, payload frames.
static zps_wire_msg s_push(uint32_t rank, uint64_t member_id, uint64_t step, uint32_t samples,
                           uint64_t off, const float *vals, uint64_t count)
{
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__PUSH);
    h.rank = rank;
    h.member_id = member_id;
    h.step = step;
    h.samples = samples;
    h.offset = off;
    h.count = count;
    h.dtype = ZPS__DTYPE__F32;
    h.loss = (float)rank + 1.0f;
    uint8_t buf[128];
    size_t len = zps__header__pack(&h, buf);
    zps_wire_msg m;
    memset(&m, 0, sizeof m);
    m.hdr = zps__header__unpack(NULL, len, buf);
    zmq_msg_init_size(&m.frames[0], count * sizeof(float));
    memcpy(zmq_msg_data(&m.frames[0]), vals, count * sizeof(float));
    m.n_frames = 1;
    m.payload_bytes = count * sizeof(float);
    return m;
}

static zps_err s_feed(zps_shard *s, uint32_t rank, uint64_t id, uint64_t step, uint32_t samples,
                      uint64_t off, const float *vals, uint64_t count)
{
    zps_wire_msg m = s_push(rank, id, step, samples, off, vals, count);
    char why[256] = "";
    zps_err err = zps_shard_push(s, &m, why, sizeof why);
    ck_assert(err == ZPS_OK || why[0] != '\0');
    zps_wire_msg_fini(&m);
    return err;
}

static zps_shard *s_shard(float momentum)
{
    zps_optim_cfg cfg = {.lr = 0.5f, .momentum = momentum, .schedule = ZPS_LR_CONSTANT};
    float init[4] = {1, 2, 3, 4};
    zps_shard *s = zps_shard_new(0, LO, HI, &cfg, init);
    ck_assert_ptr_nonnull(s);
    zps_plan plan = {.global_batch = 40, .n = 2};
    plan.slices[0] = (zps_plan_slice){.rank = 0, .member_id = 11, .offset = 0, .count = 10};
    plan.slices[1] = (zps_plan_slice){.rank = 1, .member_id = 22, .offset = 10, .count = 30};
    zps_shard_set_plan(s, &plan);
    return s;
}

START_TEST(test_shard_weighted_average_by_samples)
{
    zps_shard *s = s_shard(0);
    float g0[4] = {4, 0, -4, 8}, g1[4] = {0, 4, 4, 0};
    ck_assert_int_eq(s_feed(s, 0, 11, 0, 10, LO, g0, 4), ZPS_OK);
    ck_assert(!zps_shard_ready(s));
    ck_assert(zps_shard_rank_done(s, 0));
    ck_assert_int_eq(s_feed(s, 1, 22, 0, 30, LO, g1, 4), ZPS_OK);
    ck_assert(zps_shard_ready(s));
    float loss = zps_shard_apply(s);
    // g = (10 * g0 + 30 * g1) / 40 = {1, 3, 2, 2}; p -= 0.5 g
    const float *p = zps_shard_params(s);
    ck_assert_float_eq_tol(p[0], 0.5f, 1e-6f);
    ck_assert_float_eq_tol(p[1], 0.5f, 1e-6f);
    ck_assert_float_eq_tol(p[2], 2.0f, 1e-6f);
    ck_assert_float_eq_tol(p[3], 3.0f, 1e-6f);
    // loss = (10 * 1 + 30 * 2) / 40
    ck_assert_float_eq_tol(loss, 1.75f, 1e-6f);
    ck_assert_uint_eq(zps_shard_step(s), 1);
    ck_assert(!zps_shard_ready(s));
    zps_shard_destroy(&s);
    ck_assert_ptr_null(s);
}
END_TEST

START_TEST(test_shard_accepts_pieces_per_layer)
{
    zps_shard *s = s_shard(0);
    float g[4] = {2, 2, 2, 2};
    ck_assert_int_eq(s_feed(s, 0, 11, 0, 10, LO + 2, g + 2, 2), ZPS_OK);
    ck_assert(!zps_shard_rank_done(s, 0));
    ck_assert_int_eq(s_feed(s, 0, 11, 0, 10, LO, g, 2), ZPS_OK);
    ck_assert(zps_shard_rank_done(s, 0));
    ck_assert_int_eq(s_feed(s, 1, 22, 0, 30, LO, g, 4), ZPS_OK);
    ck_assert(zps_shard_ready(s));
    zps_shard_apply(s);
    ck_assert_float_eq_tol(zps_shard_params(s)[0], 0.0f, 1e-6f);
    zps_shard_destroy(&s);
}
END_TEST

START_TEST(test_shard_refusals_leave_parameters_untouched)
{
    zps_shard *s = s_shard(0.9f);
    float g[4] = {1, 1, 1, 1};
    ck_assert_int_eq(s_feed(s, 0, 11, 1, 10, LO, g, 4), ZPS_ESTALE);   // future step
    ck_assert_int_eq(s_feed(s, 2, 33, 0, 10, LO, g, 4), ZPS_ENOENT);   // unknown rank
    ck_assert_int_eq(s_feed(s, 0, 12, 0, 10, LO, g, 4), ZPS_ENOENT);   // wrong member id
    ck_assert_int_eq(s_feed(s, 0, 11, 0, 11, LO, g, 4), ZPS_EPROTO);   // wrong sample count
    ck_assert_int_eq(s_feed(s, 0, 11, 0, 10, LO - 1, g, 4), ZPS_ERANGE); // outside the range
    ck_assert_int_eq(s_feed(s, 0, 11, 0, 10, LO + 1, g, 4), ZPS_ERANGE);
    ck_assert_int_eq(s_feed(s, 0, 11, 0, 10, LO, g, 2), ZPS_OK);
    ck_assert_int_eq(s_feed(s, 0, 11, 0, 10, LO + 1, g, 2), ZPS_EDUP);  // overlaps
    ck_assert(!zps_shard_ready(s));
    const float want[4] = {1, 2, 3, 4};
    ck_assert_mem_eq(zps_shard_params(s), want, sizeof want);
    // The step still completes with exactly the accepted pushes.
    ck_assert_int_eq(s_feed(s, 0, 11, 0, 10, LO + 2, g, 2), ZPS_OK);
    ck_assert_int_eq(s_feed(s, 1, 22, 0, 30, LO, g, 4), ZPS_OK);
    zps_shard_apply(s);
    ck_assert_float_eq_tol(zps_shard_params(s)[0], 0.5f, 1e-6f);
    ck_assert_int_eq(s_feed(s, 0, 11, 0, 10, LO, g, 4), ZPS_ESTALE); // the past step
    zps_shard_destroy(&s);
}
END_TEST

Suite *zps_suite_shard(void)
{
    Suite *s = suite_create("shard");
    TCase *tc = tcase_create("accumulate");
    tcase_add_test(tc, test_shard_weighted_average_by_samples);
    tcase_add_test(tc, test_shard_accepts_pieces_per_layer);
    tcase_add_test(tc, test_shard_refusals_leave_parameters_untouched);
    suite_add_tcase(s, tc);
    return s;
}
