/* check_shard_deterministic.c - the shard of a --deterministic job: pushes
 * are nodes of the tree over the micro-batches, any split of the batch and
 * any arrival order give the update the same bits, and a push that is no
 * node, or one counted already, changes nothing. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/zps_tree.h"
#include "server/shard/zps_shard.h"
#include "tests/server/shard/zps_shard_fx.h"
#include "tests/zps_check.h"

// mlp:1-2-1: 7 parameters, buckets [4, 7) and [0, 4). Batch 40 in 8
// micro-batches of 5; rank 0 (id 11) and rank 1 (id 22) are members.
#define N 7
#define M 5
#define LEAVES 8

static zps_shard *s_shard(const zps_model_spec *model, uint32_t micro)
{
    zps_shard_cfg cfg = {.index = 0, .lo = 0, .hi = N, .model = model, .seed = 4,
                         .global_batch = ZPS_SHARD_FX_BATCH, .dtype = ZPS_DTYPE_F32,
                         .optim = {.lr = 0.5f, .schedule = ZPS_LR_CONSTANT},
                         .micro_batch = micro};
    zps_shard *s = zps_shard_new(&cfg);
    if (s) {
        zps_shard_fx_add_plan(s);
    }
    return s;
}

// Micro-batch i's gradient, element e: magnitudes far apart, so that the
// order of the sums shows in the bits.
static float s_leaf(uint32_t i, int e)
{
    static const float scale[LEAVES] = {1e-5f, 3e2f, 1.0f, 7e3f, 1e-2f, 5e4f, 0.3f, 2e1f};
    return scale[(i + (uint32_t)e) % LEAVES] * (e % 2 ? -1.0f : 1.0f) * (1.0f + 0.1f * i);
}

// The tree's value of node x for element e (common/zps_tree.h).
static float s_value(zps_tree_node x, int e)
{
    if (x.size == 1) {
        return s_leaf(x.lo, e);
    }
    zps_tree_node l = {x.lo, x.size / 2}, r = {x.lo + x.size / 2, x.size / 2};
    float v = s_value(l, e);
    return zps_tree_empty(LEAVES, r) ? v : v + s_value(r, e);
}

// Rank r's push of micro-batches [lo, lo + size) for parameters [plo, phi):
// the node's values, or (samples != 0) a slice [lo * M, +samples) with them.
static zps_err s_push_slice(zps_shard *s, uint32_t r, uint32_t offset, uint32_t samples,
                            zps_tree_node x, uint64_t plo, uint64_t phi)
{
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__PUSH);
    h.rank = r;
    h.member_id = zps_shard_fx_id[r];
    h.batch_offset = offset;
    h.samples = samples;
    h.generation = 1;
    h.offset = plo;
    h.count = phi - plo;
    h.dtype = ZPS__DTYPE__F32;
    h.loss = 1.0f;
    zps_wire_msg m;
    float *data = (float *)zps_shard_fx_msg(&m, &h, (phi - plo) * sizeof(float));
    for (uint64_t i = plo; i < phi; i++) {
        data[i - plo] = s_value(x, (int)i);
    }
    char why[256] = "";
    int ready;
    zps_err err = zps_shard_push(s, &m, &ready, why, sizeof why);
    ck_assert(err == ZPS_OK || why[0] != '\0');
    if (err != ZPS_OK) {
        fprintf(stderr, "refused as it should be: %s\n", why);
    }
    zps_wire_msg_fini(&m);
    return err;
}

// Node (lo, size) of both buckets, from rank r.
static void s_push_node(zps_shard *s, uint32_t r, uint32_t lo, uint32_t size)
{
    zps_tree_node x = {lo, size};
    uint32_t samples = (zps_tree_end(LEAVES, x) - lo) * M;
    ck_assert_int_eq(s_push_slice(s, r, lo * M, samples, x, 4, 7), ZPS_OK);
    ck_assert_int_eq(s_push_slice(s, r, lo * M, samples, x, 0, 4), ZPS_OK);
}

// Applies the step and reads the parameters.
static void s_finish(zps_shard *s, float *out)
{
    for (int b = 0; b < zps_shard_n_buckets(s); b++) {
        zps_shard_apply(s, b);
    }
    ck_assert(zps_shard_step_done(s));
    zps_shard_end_step(s);
    zps_shard_fx_params(s, 0, out);
}

START_TEST(test_shard_deterministic_any_split_and_order_updates_the_same_bits)
{
    zps_model_spec model = zps_shard_fx_model();
    // Three splits of the 8 micro-batches: 2 + 6, 4 + 4 arriving right
    // first, and 1 + 7; the rank that pushes a node matters no more.
    static const uint32_t nodes[3][4][2] = {
        {{0, 2}, {2, 2}, {4, 4}, {0, 0}},
        {{4, 4}, {0, 4}, {0, 0}, {0, 0}},
        {{7, 1}, {0, 4}, {4, 2}, {6, 1}},
    };
    float theta[N], got[3][N];
    for (int k = 0; k < 3; k++) {
        zps_shard *s = s_shard(&model, M);
        ck_assert_ptr_nonnull(s);
        zps_shard_fx_params(s, 0, theta);
        for (int i = 0; i < 4 && nodes[k][i][1]; i++) {
            s_push_node(s, (uint32_t)i % 2, nodes[k][i][0], nodes[k][i][1]);
        }
        s_finish(s, got[k]);
        zps_shard_destroy(&s);
    }
    ck_assert_mem_eq(got[1], got[0], sizeof got[0]);
    ck_assert_mem_eq(got[2], got[0], sizeof got[0]);
    for (int e = 0; e < N; e++) {
        // SGD at 0.5 on the mean, the root over 8 micro-batches.
        float g = s_value((zps_tree_node){0, LEAVES}, e) / LEAVES;
        ck_assert_msg(fabsf(got[0][e] - (theta[e] - 0.5f * g)) <= 1e-6f * (1 + fabsf(g)),
                      "element %d: %.9g", e, (double)got[0][e]);
    }
}
END_TEST

START_TEST(test_shard_deterministic_a_push_that_is_no_node_changes_nothing)
{
    zps_model_spec model = zps_shard_fx_model();
    zps_shard *s = s_shard(&model, M), *ref = s_shard(&model, M);
    ck_assert_ptr_nonnull(s);
    ck_assert_ptr_nonnull(ref);
    zps_tree_node root = {0, LEAVES};
    // Three micro-batches, two that are no siblings, a cut inside one.
    ck_assert_int_eq(s_push_slice(s, 0, 0, 3 * M, root, 4, 7), ZPS_EPROTO);
    ck_assert_int_eq(s_push_slice(s, 0, 1 * M, 2 * M, root, 4, 7), ZPS_EPROTO);
    ck_assert_int_eq(s_push_slice(s, 0, 2, 2 * M, root, 4, 7), ZPS_EPROTO);
    ck_assert_int_eq(s_push_slice(s, 0, 0, 2 * M + 1, root, 4, 7), ZPS_EPROTO);
    s_push_node(s, 0, 0, 4);
    // The same node again, and a node within it: counted already.
    ck_assert_int_eq(s_push_slice(s, 1, 0, 4 * M, root, 4, 7), ZPS_EDUP);
    ck_assert_int_eq(s_push_slice(s, 1, 2 * M, 2 * M, root, 0, 4), ZPS_EDUP);
    s_push_node(s, 1, 4, 4);
    s_push_node(ref, 0, 0, 4);
    s_push_node(ref, 1, 4, 4);
    float got[N], want[N];
    s_finish(s, got);
    s_finish(ref, want);
    ck_assert_mem_eq(got, want, sizeof want);
    zps_shard_destroy(&s);
    zps_shard_destroy(&ref);
}
END_TEST

START_TEST(test_shard_deterministic_refuses_a_batch_not_in_whole_micro_batches)
{
    zps_model_spec model = zps_shard_fx_model();
    zps_shard *s = s_shard(&model, 3); // 40 = 13 x 3 + 1
    ck_assert_ptr_null(s);
}
END_TEST

Suite *zps_suite_shard_deterministic(void)
{
    Suite *s = suite_create("shard_deterministic");
    TCase *tc = tcase_create("shard_deterministic");
    tcase_add_test(tc, test_shard_deterministic_any_split_and_order_updates_the_same_bits);
    tcase_add_test(tc, test_shard_deterministic_a_push_that_is_no_node_changes_nothing);
    tcase_add_test(tc, test_shard_deterministic_refuses_a_batch_not_in_whole_micro_batches);
    suite_add_tcase(s, tc);
    return s;
}
