/* check_shard_outer.c - the shard of a --mode diloco job: pseudo-gradients
 * weighted by samples x inner steps under the outer step, members missing
 * from a round, compressed pushes, and what it refuses of them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_outer.h"
#include "common/zps_quant.h"
#include "server/shard/zps_shard.h"
#include "tests/server/shard/zps_shard_fx.h"
#include "tests/zps_check.h"

// mlp:1-2-1: 7 parameters, one shard of all of them: bucket 0 is [4, 7)
// (the last layer), bucket 1 [0, 4). Batch 40: rank 0 (id 11) has [0, 10),
// rank 1 (id 22) [10, 40).
#define N 7
#define H 4

// A diloco shard at outer lr 1 and momentum 0 (the step is theta -= mean),
// compressing as `compress`; diloco false: a synchronous one.
static zps_shard *s_shard(const zps_model_spec *model, bool diloco, int compress)
{
    zps_outer_cfg outer = {.lr = 1.0f, .momentum = 0.0f};
    zps_shard_cfg cfg = {.index = 0, .lo = 0, .hi = N, .model = model, .seed = 4,
                         .global_batch = ZPS_SHARD_FX_BATCH, .dtype = ZPS_DTYPE_F32,
                         .optim = zps_outer_optim(&outer)};
    if (diloco) {
        cfg.mode = (zps_outer_mode){.diloco = true, .inner_steps = H, .compress = compress,
                                    .outer = outer};
    }
    zps_shard *s = zps_shard_new(&cfg);
    ck_assert_ptr_nonnull(s);
    zps_shard_fx_add_plan(s);
    ck_assert_int_eq(zps_shard_n_buckets(s), 2);
    return s;
}

static void s_params(zps_shard *s, float *out)
{
    zps_shard_fx_params(s, 0, out);
}

// The step s_push pushes for (round 0 but in the fragments' test).
static uint64_t s_push_step;

// Rank r's push of delta[lo, hi) of round s_push_step with `inner` inner steps, its
// payload fp32 or encoded as `compress`; `corrupt` turns its first code into
// one the encoder never makes.
static zps_err s_push(zps_shard *s, uint32_t r, uint32_t inner, int compress, bool corrupt,
                      const float *delta, uint64_t lo, uint64_t hi, int *ready)
{
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__PUSH);
    h.rank = r;
    h.step = s_push_step;
    h.member_id = zps_shard_fx_id[r];
    h.samples = zps_shard_fx_count[r];
    h.batch_offset = zps_shard_fx_offset[r];
    h.generation = 1;
    h.offset = lo;
    h.count = hi - lo;
    h.dtype = ZPS__DTYPE__F32;
    h.inner_steps = inner;
    h.compress = (uint32_t)compress;
    h.loss = 1.0f;
    size_t bytes = (hi - lo) * sizeof(float);
    if (compress) {
        ck_assert_int_eq(zps_quant_size(compress, hi - lo, ZPS_QUANT_BLOCK, &bytes), ZPS_OK);
    }
    zps_wire_msg m;
    uint8_t *data = zps_shard_fx_msg(&m, &h, bytes);
    if (compress) {
        ck_assert_int_eq(zps_quant_encode(compress, ZPS_QUANT_BLOCK, delta + lo, hi - lo, data,
                                          bytes), ZPS_OK);
        if (corrupt) {
            data[4] = compress == ZPS_QUANT_INT8 ? 0x80 : 0x08; // int8 -128; E3M0 -0
        }
    } else {
        memcpy(data, delta + lo, bytes);
    }
    char why[256] = "";
    zps_err err = zps_shard_push(s, &m, ready, why, sizeof why);
    ck_assert(err == ZPS_OK || why[0] != '\0');
    if (err != ZPS_OK) {
        fprintf(stderr, "refused as it should be: %s\n", why);
    }
    zps_wire_msg_fini(&m);
    return err;
}

// Both buckets of rank r's pseudo-gradient.
static void s_push_all(zps_shard *s, uint32_t r, uint32_t inner, int compress,
                       const float *delta)
{
    int ready;
    ck_assert_int_eq(s_push(s, r, inner, compress, false, delta, 4, 7, &ready), ZPS_OK);
    ck_assert_int_eq(s_push(s, r, inner, compress, false, delta, 0, 4, &ready), ZPS_OK);
}

static void s_apply_all(zps_shard *s)
{
    for (int b = 0; b < zps_shard_n_buckets(s); b++) {
        zps_shard_apply(s, b);
    }
    ck_assert(zps_shard_step_done(s));
}

// theta - (wa * a + wb * b) / (wa + wb), element by element.
static void s_expect(const float *theta, const float *a, double wa, const float *b, double wb,
                     float *out)
{
    for (int i = 0; i < N; i++) {
        out[i] = theta[i] - (float)((wa * a[i] + wb * b[i]) / (wa + wb));
    }
}

static void s_assert_close(const float *got, const float *want, double tol)
{
    for (int i = 0; i < N; i++) {
        ck_assert_msg(fabs((double)got[i] - want[i]) <= tol, "element %d: %.9g, want %.9g", i,
                      (double)got[i], (double)want[i]);
    }
}

static const float s_da[N] = {0.5f, -0.25f, 0.125f, 1.0f, -2.0f, 0.75f, 0.3f};
static const float s_db[N] = {-0.1f, 0.2f, 0.4f, -0.8f, 1.6f, 0.05f, -0.3f};

START_TEST(test_shard_outer_weighs_pseudo_gradients_by_samples_times_inner_steps)
{
    zps_model_spec model = zps_shard_fx_model();
    zps_shard *s = s_shard(&model, true, 0);
    float theta[N], got[N], want[N];
    s_params(s, theta);
    s_push_all(s, 0, 4, 0, s_da); // 10 samples x 4 inner steps
    s_push_all(s, 1, 1, 0, s_db); // 30 x 1
    s_apply_all(s);
    zps_shard_end_step(s);
    s_params(s, got);
    s_expect(theta, s_da, 40, s_db, 30, want);
    s_assert_close(got, want, 1e-6);
    zps_shard_destroy(&s);
}
END_TEST

START_TEST(test_shard_outer_a_missing_member_counts_for_nothing)
{
    zps_model_spec model = zps_shard_fx_model();
    zps_shard *s = s_shard(&model, true, 0);
    float theta[N], got[N], want[N];
    s_params(s, theta);
    // Rank 1's slice pushed as missing (by whoever took it on), with
    // values that would count heavily if they counted at all.
    float junk[N];
    for (int i = 0; i < N; i++) {
        junk[i] = 1e6f;
    }
    s_push_all(s, 1, 0, 0, junk);
    s_push_all(s, 0, 3, 0, s_da);
    s_apply_all(s);
    zps_shard_end_step(s);
    s_params(s, got);
    s_expect(theta, s_da, 1, s_db, 0, want);
    s_assert_close(got, want, 0);
    zps_shard_destroy(&s);
}
END_TEST

START_TEST(test_shard_outer_a_round_no_member_reached_keeps_the_parameters)
{
    zps_model_spec model = zps_shard_fx_model();
    zps_shard *s = s_shard(&model, true, ZPS_QUANT_INT8);
    float theta[N], got[N];
    s_params(s, theta);
    s_push_all(s, 0, 0, ZPS_QUANT_INT8, s_da);
    s_push_all(s, 1, 0, ZPS_QUANT_INT8, s_db);
    s_apply_all(s);
    zps_shard_end_step(s);
    ck_assert_uint_eq(zps_shard_step(s), 1);
    s_params(s, got);
    ck_assert_mem_eq(got, theta, sizeof theta);
    zps_shard_destroy(&s);
}
END_TEST

// A compressed push counts what it decodes to.
static void s_check_compressed(int compress)
{
    zps_model_spec model = zps_shard_fx_model();
    zps_shard *s = s_shard(&model, true, compress);
    float theta[N], got[N], want[N], da[N], db[N];
    s_params(s, theta);
    size_t size;
    for (int k = 0; k < 2; k++) {
        const float *src = k ? s_db : s_da;
        float *dst = k ? db : da;
        for (uint64_t lo = 0, hi = 4; lo < N; lo = hi, hi = N) { // the two buckets
            uint8_t enc[64];
            ck_assert_int_eq(zps_quant_size(compress, hi - lo, ZPS_QUANT_BLOCK, &size), ZPS_OK);
            ck_assert_int_eq(zps_quant_encode(compress, ZPS_QUANT_BLOCK, src + lo, hi - lo, enc,
                                              size), ZPS_OK);
            ck_assert_int_eq(zps_quant_decode(compress, ZPS_QUANT_BLOCK, enc, size, dst + lo,
                                              hi - lo), ZPS_OK);
        }
    }
    s_push_all(s, 0, 2, compress, s_da);
    s_push_all(s, 1, 2, compress, s_db);
    s_apply_all(s);
    zps_shard_end_step(s);
    s_params(s, got);
    s_expect(theta, da, 20, db, 60, want);
    s_assert_close(got, want, 1e-6);
    // Compression lost something: the test tells decoded from raw values.
    float raw[N];
    s_expect(theta, s_da, 20, s_db, 60, raw);
    ck_assert(memcmp(raw, want, sizeof raw) != 0);
    zps_shard_destroy(&s);
}

START_TEST(test_shard_outer_counts_int8_pushes_as_they_decode)
{
    s_check_compressed(ZPS_QUANT_INT8);
}
END_TEST

START_TEST(test_shard_outer_counts_e3m0_pushes_as_they_decode)
{
    s_check_compressed(ZPS_QUANT_E3M0);
}
END_TEST

START_TEST(test_shard_outer_refusals_count_nothing)
{
    zps_model_spec model = zps_shard_fx_model();
    // A synchronous job's push carries no inner steps.
    zps_shard *sync = s_shard(&model, false, 0);
    int ready;
    ck_assert_int_eq(s_push(sync, 0, 1, 0, false, s_da, 4, 7, &ready), ZPS_EPROTO);
    zps_shard_destroy(&sync);

    zps_shard *s = s_shard(&model, true, ZPS_QUANT_INT8);
    float theta[N], got[N], want[N];
    s_params(s, theta);
    ck_assert_int_eq(s_push(s, 0, H + 1, ZPS_QUANT_INT8, false, s_da, 4, 7, &ready),
                     ZPS_EPROTO);                                       // beyond the round's H
    ck_assert_int_eq(s_push(s, 0, 2, 0, false, s_da, 4, 7, &ready), ZPS_EPROTO); // fp32
    ck_assert_int_eq(s_push(s, 0, 2, ZPS_QUANT_E3M0, false, s_da, 4, 7, &ready),
                     ZPS_EPROTO);                                       // another format
    ck_assert_int_eq(s_push(s, 0, 2, ZPS_QUANT_INT8, true, s_da, 4, 7, &ready),
                     ZPS_EPROTO);                                       // a code never made
    // Nothing of those was counted: the round ends as if they never came.
    float da[N], db[N];
    for (uint64_t lo = 0, hi = 4; lo < N; lo = hi, hi = N) {
        uint8_t enc[64];
        size_t size;
        ck_assert_int_eq(zps_quant_size(ZPS_QUANT_INT8, hi - lo, ZPS_QUANT_BLOCK, &size), ZPS_OK);
        for (int k = 0; k < 2; k++) {
            ck_assert_int_eq(zps_quant_encode(ZPS_QUANT_INT8, ZPS_QUANT_BLOCK,
                                              (k ? s_db : s_da) + lo, hi - lo, enc, size),
                             ZPS_OK);
            ck_assert_int_eq(zps_quant_decode(ZPS_QUANT_INT8, ZPS_QUANT_BLOCK, enc, size,
                                              (k ? db : da) + lo, hi - lo), ZPS_OK);
        }
    }
    s_push_all(s, 0, 2, ZPS_QUANT_INT8, s_da);
    s_push_all(s, 1, 2, ZPS_QUANT_INT8, s_db);
    s_apply_all(s);
    zps_shard_end_step(s);
    s_params(s, got);
    s_expect(theta, da, 20, db, 60, want);
    s_assert_close(got, want, 1e-6);
    zps_shard_destroy(&s);
}
END_TEST

// --fragments 2 over the 7 parameters: fragment 0 is [0, 3), fragment 1
// [3, 7), so bucket [0, 4) is cut in two. Step 0 exchanges fragment 0 and
// step 1 fragment 1: a push of the other fragment is refused, the step
// ends with its own buckets, and the other's parameters stay as they are.
START_TEST(test_shard_outer_fragments_exchange_one_fragment_a_step)
{
    zps_model_spec model = zps_shard_fx_model();
    zps_outer_cfg outer = {.lr = 1.0f, .momentum = 0.0f};
    zps_shard_cfg cfg = {.index = 0, .lo = 0, .hi = N, .model = &model, .seed = 4,
                         .global_batch = ZPS_SHARD_FX_BATCH, .dtype = ZPS_DTYPE_F32,
                         .optim = zps_outer_optim(&outer),
                         .mode = {.diloco = true, .inner_steps = H, .outer = outer,
                                  .fragments = 2}};
    zps_shard *s = zps_shard_new(&cfg);
    ck_assert_ptr_nonnull(s);
    zps_shard_fx_add_plan(s);
    ck_assert_int_eq(zps_shard_n_buckets(s), 3); // [4, 7), [0, 3), [3, 4)
    float theta[N], got[N], want[N];
    s_params(s, theta);
    static const uint64_t lo[2][2] = {{0, 0}, {4, 3}}, hi[2][2] = {{3, 0}, {7, 4}};
    for (uint64_t step = 0; step < 2; step++) {
        int other = 1 - (int)step, ready;
        s_push_step = step;
        ck_assert_int_eq(zps_shard_n_step_buckets(s), step == 0 ? 1 : 2);
        ck_assert_int_eq(s_push(s, 0, 2, 0, false, s_da, lo[other][0], hi[other][0], &ready),
                         ZPS_EPROTO);
        for (uint32_t r = 0; r < 2; r++) {
            for (int k = 0; k < 2 && hi[step][k] > 0; k++) {
                ck_assert_int_eq(s_push(s, r, 2 + 2 * (uint32_t)step, 0, false,
                                        r ? s_db : s_da, lo[step][k], hi[step][k], &ready),
                                 ZPS_OK);
                if (ready >= 0) {
                    ck_assert(!zps_shard_bucket_idle(s, ready));
                    zps_shard_apply(s, ready);
                }
            }
        }
        ck_assert(zps_shard_step_done(s));
        zps_shard_end_step(s);
        s_params(s, got);
        // The fragment exchanged moved by the weighted mean; the other did not.
        s_expect(theta, s_da, 10, s_db, 30, want);
        for (int i = 0; i < N; i++) {
            bool mine = step == 0 ? i < 3 : i >= 3;
            if (mine) {
                ck_assert_msg(fabs((double)got[i] - want[i]) <= 1e-6, "element %d", i);
                theta[i] = got[i];
            } else {
                ck_assert_msg(got[i] == theta[i], "element %d moved in another fragment's step",
                              i);
            }
        }
    }
    s_push_step = 0;
    zps_shard_destroy(&s);
}
END_TEST

Suite *zps_suite_shard_outer(void)
{
    Suite *s = suite_create("shard_outer");
    TCase *tc = tcase_create("shard_outer");
    tcase_add_test(tc, test_shard_outer_weighs_pseudo_gradients_by_samples_times_inner_steps);
    tcase_add_test(tc, test_shard_outer_a_missing_member_counts_for_nothing);
    tcase_add_test(tc, test_shard_outer_a_round_no_member_reached_keeps_the_parameters);
    tcase_add_test(tc, test_shard_outer_counts_int8_pushes_as_they_decode);
    tcase_add_test(tc, test_shard_outer_counts_e3m0_pushes_as_they_decode);
    tcase_add_test(tc, test_shard_outer_refusals_count_nothing);
    tcase_add_test(tc, test_shard_outer_fragments_exchange_one_fragment_a_step);
    suite_add_tcase(s, tc);
    return s;
}
