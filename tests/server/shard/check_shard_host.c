/* check_shard_host.c - a host leader's push (Header.host_pieces): the shard
 * credits each piece to its member as if it had pushed it, updates as the
 * members' own pushes would, and refuses pieces that do not tile the
 * push's slice in order, name a rank outside the plan or are too many,
 * with nothing counted, and names what a sum dropped as partly counted
 * took with it. */
#include <math.h>
#include <string.h>

#include "server/shard/zps_shard.h"
#include "tests/server/shard/zps_shard_fx.h"
#include "tests/zps_check.h"

// The whole model (mlp:1-2-1, 7 parameters) on one shard: buckets [4, 7) and [0, 4).
#define N 7

typedef zps_shard_fx_piece s_piece;

// A PUSH of bucket [off, off + count) of step 0 from rank/id over
// [batch_offset, +samples), carrying n pieces (none: a plain push).
static zps_wire_msg s_push(uint32_t rank, uint64_t id, uint32_t batch_offset, uint32_t samples,
                           const s_piece *pieces, size_t n, uint64_t off, uint64_t count,
                           const float *vals)
{
    zps_wire_msg m;
    zps_shard_fx_push(&m, rank, id, batch_offset, samples, pieces, n, off, count, vals);
    return m;
}

static zps_err s_feed(zps_shard *s, uint32_t rank, uint64_t id, uint32_t batch_offset,
                      uint32_t samples, const s_piece *pieces, size_t n, int b, const float *g)
{
    uint64_t off = b == 0 ? 4 : 0, count = b == 0 ? 3 : 4;
    zps_wire_msg m = s_push(rank, id, batch_offset, samples, pieces, n, off, count, g + off);
    char why[256] = "";
    int ready;
    zps_err err = zps_shard_push(s, &m, &ready, why, sizeof why);
    ck_assert(err == ZPS_OK || why[0] != '\0'); // every refusal says why
    if (ready >= 0) {
        zps_shard_apply(s, ready);
    }
    zps_wire_msg_fini(&m);
    return err;
}

// micro: --deterministic --micro-batch (0: off); diloco: --mode diloco.
static zps_shard *s_shard_mode(const zps_model_spec *model, uint32_t micro, bool diloco)
{
    zps_shard_cfg cfg = {.index = 0, .shards = 1, .lo = 0, .hi = N, .model = model, .seed = 4,
                         .global_batch = ZPS_SHARD_FX_BATCH, .dtype = ZPS_DTYPE_F32,
                         .optim = {.lr = 0.5f, .schedule = ZPS_LR_CONSTANT},
                         .micro_batch = micro};
    if (diloco) {
        cfg.mode = (zps_outer_mode){.diloco = true, .inner_steps = 4};
    }
    zps_shard *s = zps_shard_new(&cfg);
    ck_assert_ptr_nonnull(s);
    ck_assert_int_eq(zps_shard_n_buckets(s), 2);
    zps_shard_fx_add_plan(s);
    return s;
}

static zps_shard *s_shard_micro(const zps_model_spec *model, uint32_t micro)
{
    return s_shard_mode(model, micro, false);
}

static zps_shard *s_shard(const zps_model_spec *model)
{
    return s_shard_micro(model, 0);
}

// Checks that shards a and b (their steps ended) hold the same parameters,
// within tol (0: the same bits), and destroys both.
static void s_check_alike(zps_shard **a, zps_shard **b, float tol)
{
    float p[N], q[N];
    zps_shard_fx_params(*a, 0, p);
    zps_shard_fx_params(*b, 0, q);
    for (int i = 0; i < N; i++) {
        ck_assert_msg(tol > 0 ? fabsf(p[i] - q[i]) <= tol : memcmp(&p[i], &q[i], sizeof p[i]) == 0,
                      "parameter %d: %.9g against %.9g", i, (double)p[i], (double)q[i]);
    }
    zps_shard_destroy(a);
    zps_shard_destroy(b);
}

// Rank 0, leader of ranks 0 and 1 on one host, pushes the whole batch
// once per bucket with both pieces: each rank is credited its own samples,
// and the update is the one the two members' own pushes of the same
// gradient give.
START_TEST(test_shard_credits_each_piece_of_a_leader_push_to_its_member)
{
    zps_model_spec model = zps_shard_fx_model();
    zps_shard *led = s_shard(&model), *own = s_shard(&model);
    float g[N] = {1, -2, 3, 0.5f, -1, 2, 4};
    const s_piece both[2] = {{0, 0, 10}, {1, 10, 30}};
    for (int b = 0; b < 2; b++) {
        ck_assert_int_eq(s_feed(led, 0, zps_shard_fx_id[0], 0, 40, both, 2, b, g), ZPS_OK);
        ck_assert_int_eq(s_feed(own, 0, zps_shard_fx_id[0], 0, 10, NULL, 0, b, g), ZPS_OK);
        ck_assert_int_eq(s_feed(own, 1, zps_shard_fx_id[1], 10, 30, NULL, 0, b, g), ZPS_OK);
    }
    ck_assert_uint_eq(zps_shard_counted(led, 0), 10);
    ck_assert_uint_eq(zps_shard_counted(led, 1), 30);
    ck_assert(zps_shard_slice_done(led, 0, 10) && zps_shard_slice_done(led, 10, 30));
    ck_assert(zps_shard_step_done(led) && zps_shard_step_done(own));
    ck_assert_float_eq_tol(zps_shard_end_step(led), 2.0f, 1e-6f);
    (void)zps_shard_end_step(own);
    s_check_alike(&led, &own, 1e-6f);
}
END_TEST

// A diloco push weighs its samples by its inner steps, which pieces do not
// carry: a leader's push there is refused, nothing counted.
START_TEST(test_shard_refuses_host_pieces_in_a_diloco_job)
{
    zps_model_spec model = zps_shard_fx_model();
    zps_shard *s = s_shard_mode(&model, 0, true);
    float g[N] = {1, -2, 3, 0.5f, -1, 2, 4};
    const s_piece both[2] = {{0, 0, 10}, {1, 10, 30}};
    ck_assert_int_eq(s_feed(s, 0, zps_shard_fx_id[0], 0, 40, both, 2, 0, g), ZPS_EPROTO);
    ck_assert_uint_eq(zps_shard_counted(s, 0), 0);
    ck_assert_uint_eq(zps_shard_counted(s, 1), 0);
    zps_shard_destroy(&s);
}
END_TEST

// Pieces with a gap, an overlap, out of order, empty, past the slice, of a
// rank the plan does not name, or more than ZPS_HOST_GROUP_MAX: refused
// before anything counts; the leader's good push still counts after them.
START_TEST(test_shard_refuses_pieces_that_do_not_tile_or_name_strangers)
{
    zps_model_spec model = zps_shard_fx_model();
    zps_shard *s = s_shard(&model);
    float before[N], after[N], g[N] = {1e6f, 1e6f, 1e6f, 1e6f, 1e6f, 1e6f, 1e6f};
    zps_shard_fx_params(s, 0, before);
    uint64_t id = zps_shard_fx_id[0];
    const s_piece gap[2] = {{0, 0, 10}, {1, 12, 28}};
    const s_piece overlap[2] = {{0, 0, 12}, {1, 10, 30}};
    const s_piece reversed[2] = {{1, 10, 30}, {0, 0, 10}};
    const s_piece empty[3] = {{0, 0, 10}, {1, 10, 0}, {1, 10, 30}};
    const s_piece short_[2] = {{0, 0, 10}, {1, 10, 20}};
    const s_piece stranger[2] = {{0, 0, 10}, {2, 10, 30}};
    ck_assert_int_eq(s_feed(s, 0, id, 0, 40, gap, 2, 0, g), ZPS_EPROTO);
    ck_assert_int_eq(s_feed(s, 0, id, 0, 40, overlap, 2, 0, g), ZPS_EPROTO);
    ck_assert_int_eq(s_feed(s, 0, id, 0, 40, reversed, 2, 0, g), ZPS_EPROTO);
    ck_assert_int_eq(s_feed(s, 0, id, 0, 40, empty, 3, 0, g), ZPS_EPROTO);
    ck_assert_int_eq(s_feed(s, 0, id, 0, 40, short_, 2, 0, g), ZPS_EPROTO);
    ck_assert_int_eq(s_feed(s, 0, id, 0, 40, stranger, 2, 0, g), ZPS_EPROTO);
    s_piece many[ZPS_HOST_GROUP_MAX + 1];
    for (uint32_t i = 0; i <= ZPS_HOST_GROUP_MAX; i++) {
        many[i] = (s_piece){0, i, 1}; // one too many, whatever else they say
    }
    ck_assert_int_eq(s_feed(s, 0, id, 0, 40, many, ZPS_HOST_GROUP_MAX + 1, 0, g), ZPS_EPROTO);
    ck_assert_uint_eq(zps_shard_counted(s, 0), 0);
    ck_assert_uint_eq(zps_shard_counted(s, 1), 0);
    ck_assert(!zps_shard_slice_done(s, 0, 10));
    zps_shard_fx_params(s, 0, after);
    ck_assert_mem_eq(before, after, sizeof before);
    const s_piece both[2] = {{0, 0, 10}, {1, 10, 30}};
    ck_assert_int_eq(s_feed(s, 0, id, 0, 40, both, 2, 0, g), ZPS_OK);
    ck_assert_uint_eq(zps_shard_counted(s, 1), 30);
    zps_shard_destroy(&s);
}
END_TEST

// --deterministic --micro-batch 10: the leader's push is a node of the
// tree (here the root, 4 micro-batches) and its pieces the members' parts
// of it, each credited to its member; pieces that do not tile it are
// refused as in any job.
START_TEST(test_shard_deterministic_leader_push_is_a_node_whose_pieces_are_credited)
{
    zps_model_spec model = zps_shard_fx_model();
    zps_shard *s = s_shard_micro(&model, 10);
    float g[N] = {1, 2, 3, 4, 5, 6, 7};
    uint64_t id = zps_shard_fx_id[0];
    const s_piece gap[2] = {{0, 0, 10}, {1, 20, 20}};
    ck_assert_int_eq(s_feed(s, 0, id, 0, 40, gap, 2, 0, g), ZPS_EPROTO);
    const s_piece both[2] = {{0, 0, 10}, {1, 10, 30}};
    for (int b = 0; b < 2; b++) {
        ck_assert_int_eq(s_feed(s, 0, id, 0, 40, both, 2, b, g), ZPS_OK);
    }
    ck_assert_uint_eq(zps_shard_counted(s, 0), 10);
    ck_assert_uint_eq(zps_shard_counted(s, 1), 30);
    ck_assert(zps_shard_step_done(s));
    zps_shard_destroy(&s);
}
END_TEST

// A sum of which a piece was counted already, its member's own copy
// first (a follower that gave up on its leader), is dropped whole: the
// shard names the runs of it no one counted, so that they can be asked
// for; pushed alone they complete the bucket as the members' own pushes
// would. A sum counted whole, one of another plan and a plain push name
// none.
START_TEST(test_shard_names_the_runs_a_partly_counted_sum_took_with_it)
{
    zps_model_spec model = zps_shard_fx_model();
    zps_shard *s = s_shard(&model), *own = s_shard(&model);
    float g[N] = {1, -2, 3, 0.5f, -1, 2, 4};
    const s_piece both[2] = {{0, 0, 10}, {1, 10, 30}};
    uint64_t id0 = zps_shard_fx_id[0], id1 = zps_shard_fx_id[1];
    // Rank 1's own copy of [10, 20) came first for bucket 0.
    ck_assert_int_eq(s_feed(s, 1, id1, 10, 10, NULL, 0, 0, g), ZPS_OK);
    ck_assert_int_eq(s_feed(s, 0, id0, 0, 40, both, 2, 0, g), ZPS_EDUP);
    zps_wire_msg m = s_push(0, id0, 0, 40, both, 2, 4, 3, g + 4);
    zps_shard_run runs[4];
    ck_assert_int_eq(zps_shard_uncounted(s, m.hdr, runs, 4), 2);
    ck_assert_uint_eq(runs[0].offset, 0);
    ck_assert_uint_eq(runs[0].count, 10);
    ck_assert_uint_eq(runs[1].offset, 20);
    ck_assert_uint_eq(runs[1].count, 20);
    // At most max written, all counted (as snprintf): the first run whole.
    zps_shard_run first[2] = {{0, 0}, {7, 7}};
    ck_assert_int_eq(zps_shard_uncounted(s, m.hdr, first, 1), 2);
    ck_assert_uint_eq(first[0].offset, 0);
    ck_assert_uint_eq(first[0].count, 10);
    ck_assert_uint_eq(first[1].offset, 7); // untouched
    ck_assert_uint_eq(first[1].count, 7);
    ck_assert_int_eq(zps_shard_uncounted(s, m.hdr, NULL, 0), 2);
    m.hdr->generation = 2; // not the plan in force: that step is computed again
    ck_assert_int_eq(zps_shard_uncounted(s, m.hdr, runs, 4), 0);
    zps_wire_msg_fini(&m);
    m = s_push(0, id0, 10, 10, NULL, 0, 4, 3, g + 4); // a plain push names none
    ck_assert_int_eq(zps_shard_uncounted(s, m.hdr, runs, 4), 0);
    zps_wire_msg_fini(&m);
    // Bucket 1 counted the sum whole: nothing of it is missing.
    ck_assert_int_eq(s_feed(s, 0, id0, 0, 40, both, 2, 1, g), ZPS_OK);
    m = s_push(0, id0, 0, 40, both, 2, 0, 4, g);
    ck_assert_int_eq(zps_shard_uncounted(s, m.hdr, runs, 4), 0);
    zps_wire_msg_fini(&m);
    // The runs pushed alone: the step ends as the members' own pushes end it.
    ck_assert(!zps_shard_step_done(s));
    ck_assert_int_eq(s_feed(s, 0, id0, 0, 10, NULL, 0, 0, g), ZPS_OK);
    ck_assert_int_eq(s_feed(s, 0, id0, 20, 20, NULL, 0, 0, g), ZPS_OK);
    ck_assert(zps_shard_step_done(s));
    for (int b = 0; b < 2; b++) {
        ck_assert_int_eq(s_feed(own, 0, id0, 0, 10, NULL, 0, b, g), ZPS_OK);
        ck_assert_int_eq(s_feed(own, 1, id1, 10, 30, NULL, 0, b, g), ZPS_OK);
    }
    (void)zps_shard_end_step(s);
    (void)zps_shard_end_step(own);
    s_check_alike(&s, &own, 1e-6f);
}
END_TEST

// --deterministic --micro-batch 10: the runs a partly counted sum (a node)
// took with it start and end on micro-batches, and pushed as nodes they
// end the step with the bits of the members' own pushes.
START_TEST(test_shard_deterministic_runs_of_a_partly_counted_sum_are_nodes_with_the_same_bits)
{
    zps_model_spec model = zps_shard_fx_model();
    zps_shard *s = s_shard_micro(&model, 10), *own = s_shard_micro(&model, 10);
    // A node's values are the sum of its leaves' (each micro-batch's mean):
    // a leaf g, two leaves 2g, the root 4g (exact in float).
    float g[N] = {1, -2, 3, 0.5f, -1, 2, 4}, g2[N], g4[N];
    for (int i = 0; i < N; i++) {
        g2[i] = 2 * g[i];
        g4[i] = 4 * g[i];
    }
    const s_piece both[2] = {{0, 0, 10}, {1, 10, 30}};
    uint64_t id0 = zps_shard_fx_id[0], id1 = zps_shard_fx_id[1];
    ck_assert_int_eq(s_feed(s, 1, id1, 10, 10, NULL, 0, 0, g), ZPS_OK); // a leaf first
    ck_assert_int_eq(s_feed(s, 0, id0, 0, 40, both, 2, 0, g4), ZPS_EDUP);
    zps_wire_msg m = s_push(0, id0, 0, 40, both, 2, 4, 3, g4 + 4);
    zps_shard_run runs[4];
    ck_assert_int_eq(zps_shard_uncounted(s, m.hdr, runs, 4), 2);
    zps_wire_msg_fini(&m);
    ck_assert_uint_eq(runs[0].offset, 0); // leaf 0
    ck_assert_uint_eq(runs[0].count, 10);
    ck_assert_uint_eq(runs[1].offset, 20); // leaves 2 and 3: one node
    ck_assert_uint_eq(runs[1].count, 20);
    ck_assert_int_eq(s_feed(s, 0, id0, 0, 40, both, 2, 1, g4), ZPS_OK);
    ck_assert_int_eq(s_feed(s, 0, id0, 0, 10, NULL, 0, 0, g), ZPS_OK);
    ck_assert_int_eq(s_feed(s, 0, id0, 20, 20, NULL, 0, 0, g2), ZPS_OK);
    ck_assert(zps_shard_step_done(s));
    for (int b = 0; b < 2; b++) {
        ck_assert_int_eq(s_feed(own, 0, id0, 0, 10, NULL, 0, b, g), ZPS_OK);
        ck_assert_int_eq(s_feed(own, 1, id1, 10, 10, NULL, 0, b, g), ZPS_OK);
        ck_assert_int_eq(s_feed(own, 1, id1, 20, 20, NULL, 0, b, g2), ZPS_OK);
    }
    ck_assert(zps_shard_step_done(own));
    (void)zps_shard_end_step(s);
    (void)zps_shard_end_step(own);
    s_check_alike(&s, &own, 0);
}
END_TEST

Suite *zps_suite_shard_host(void)
{
    Suite *s = suite_create("shard_host");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_shard_credits_each_piece_of_a_leader_push_to_its_member);
    tcase_add_test(tc, test_shard_refuses_pieces_that_do_not_tile_or_name_strangers);
    tcase_add_test(tc, test_shard_refuses_host_pieces_in_a_diloco_job);
    tcase_add_test(tc, test_shard_deterministic_leader_push_is_a_node_whose_pieces_are_credited);
    tcase_add_test(tc, test_shard_names_the_runs_a_partly_counted_sum_took_with_it);
    tcase_add_test(tc, test_shard_deterministic_runs_of_a_partly_counted_sum_are_nodes_with_the_same_bits);
    suite_add_tcase(s, tc);
    return s;
}
