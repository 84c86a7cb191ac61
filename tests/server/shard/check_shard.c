/* check_shard.c - the shard's per-bucket accumulate/average/update and its
 * refusals, fed messages built as the wire would deliver them. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/zps_ckpt.h"
#include "server/shard/zps_shard.h"
#include "tests/server/shard/zps_shard_fx.h"
#include "tests/zps_check.h"
#include "tests/zps_tmpdir.h"

// mlp:1-2-1 is [0, 4) for layer 0 (W 2x1, b 2) and [4, 7) for layer 1.
// The shard owns [2, 7): bucket 0 is [4, 7), bucket 1 is [2, 4), a range
// that starts inside layer 0.
#define LO 2
#define HI 7

// A PUSH as zps_wire_recv would return it: decoded header, payload frames.
// The slice is the rank's own, unless samples says otherwise.
static zps_wire_msg s_push(uint32_t rank, uint64_t member_id, uint64_t step, uint32_t samples,
                           uint64_t off, const float *vals, uint64_t count, zps_dtype dtype)
{
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__PUSH);
    h.rank = rank;
    h.member_id = member_id;
    h.step = step;
    h.samples = samples;
    h.batch_offset = zps_shard_fx_offset[rank == 0 ? 0 : 1]; // a stranger claims rank 1's
    h.generation = 1;
    h.offset = off;
    h.count = count;
    h.dtype = (Zps__DType)dtype;
    h.loss = (float)rank + 1.0f;
    zps_wire_msg m;
    zps_dtype_from_f32(dtype, vals, zps_shard_fx_msg(&m, &h, count * zps_dtype_size(dtype)),
                       count);
    return m;
}

static zps_err s_feed_as(zps_shard *s, zps_dtype dtype, uint32_t rank, uint64_t id,
                         uint64_t step, uint32_t samples, uint64_t off, const float *vals,
                         uint64_t count, int *ready)
{
    zps_wire_msg m = s_push(rank, id, step, samples, off, vals, count, dtype);
    char why[256] = "";
    zps_err err = zps_shard_push(s, &m, ready, why, sizeof why);
    ck_assert(err == ZPS_OK || why[0] != '\0');
    zps_wire_msg_fini(&m);
    return err;
}

static zps_err s_feed(zps_shard *s, uint32_t rank, uint64_t id, uint64_t step, uint32_t samples,
                      uint64_t off, const float *vals, uint64_t count, int *ready)
{
    return s_feed_as(s, ZPS_DTYPE_F32, rank, id, step, samples, off, vals, count, ready);
}

// Shard `index` of [lo, hi) on the fixture's batch and plan.
static zps_shard *s_shard_of(const zps_model_spec *model, uint32_t index, uint64_t lo,
                             uint64_t hi, zps_dtype dtype, float momentum)
{
    zps_shard_cfg cfg = {.index = index, .lo = lo, .hi = hi, .model = model, .seed = 4,
                         .global_batch = ZPS_SHARD_FX_BATCH, .dtype = dtype,
                         .optim = {.lr = 0.5f, .momentum = momentum,
                                   .schedule = ZPS_LR_CONSTANT}};
    zps_shard *s = zps_shard_new(&cfg);
    ck_assert_ptr_nonnull(s);
    zps_shard_fx_add_plan(s);
    return s;
}

static zps_shard *s_shard(const zps_model_spec *model, zps_dtype dtype, float momentum)
{
    zps_shard *s = s_shard_of(model, 1, LO, HI, dtype, momentum);
    ck_assert_int_eq(zps_shard_n_buckets(s), 2);
    return s;
}

// The shard's current f32 parameters of [LO, HI).
static void s_params(zps_shard *s, float *out)
{
    zps_shard_fx_params(s, LO, out);
}

// A flat model of 200 buckets (more than one 64-bit word of bucket bits):
// every bucket completes once both slices pushed it, a second copy of a
// bucket past the first word is a duplicate, and the step ends.
START_TEST(test_shard_tracks_buckets_past_the_first_64)
{
    zps_model_spec model;
    ck_assert_int_eq(zps_model_parse("flat:13107200", &model), ZPS_OK); // 200 x 65536
    ck_assert_int_eq(zps_model_n_buckets(&model), 200);
    zps_shard *s = s_shard_of(&model, 0, 0, model.n_params, ZPS_DTYPE_F32, 0);
    ck_assert_int_eq(zps_shard_n_buckets(s), 200);
    static float g[65536];
    int ready;
    for (int b = 199; b >= 0; b--) { // the end first, as backward pushes
        uint64_t off = (uint64_t)b * 65536;
        ck_assert_int_eq(s_feed(s, 0, 11, 0, 10, off, g, 65536, &ready), ZPS_OK);
        ck_assert_int_eq(ready, -1);
        if (b == 130) {
            ck_assert_int_eq(s_feed(s, 0, 11, 0, 10, off, g, 65536, &ready), ZPS_EDUP);
        }
        ck_assert_int_eq(s_feed(s, 1, 22, 0, 30, off, g, 65536, &ready), ZPS_OK);
        ck_assert_int_eq(ready, 199 - b);
        zps_shard_apply(s, ready);
        ck_assert(zps_shard_step_done(s) == (b == 0));
    }
    ck_assert(zps_shard_slice_done(s, 10, 30));
    zps_shard_end_step(s);
    ck_assert_uint_eq(zps_shard_step(s), 1);
    zps_shard_destroy(&s);
}
END_TEST

// --clip-grad-norm: a shard of [lo, hi) of the fixture's model, SGD with momentum.
static zps_shard *s_clip_shard(const zps_model_spec *model, uint64_t lo, uint64_t hi, float clip)
{
    zps_shard_cfg cfg = {.index = 0, .lo = lo, .hi = hi, .model = model, .seed = 4,
                         .global_batch = ZPS_SHARD_FX_BATCH, .dtype = ZPS_DTYPE_F32,
                         .optim = {.lr = 0.5f, .momentum = 0.9f, .schedule = ZPS_LR_CONSTANT},
                         .clip_grad_norm = clip};
    zps_shard *s = zps_shard_new(&cfg);
    ck_assert_ptr_nonnull(s);
    zps_shard_fx_add_plan(s);
    return s;
}

// Both ranks' pushes of every bucket of s (g0 from rank 0, g1 from rank 1,
// indexed from parameter 0); none makes a bucket ready.
static void s_clip_feed(zps_shard *s, const float *g0, const float *g1)
{
    for (int b = zps_shard_n_buckets(s) - 1; b >= 0; b--) {
        const void *data;
        uint64_t off, count;
        zps_wire_ref *ref;
        zps_shard_bucket_params(s, b, &data, &off, &count, &ref);
        int ready;
        ck_assert_int_eq(s_feed(s, 0, 11, 0, 10, off, g0 + off, count, &ready), ZPS_OK);
        ck_assert_int_eq(ready, -1);
        ck_assert(!zps_shard_norm_due(s, NULL) || b == 0);
        ck_assert_int_eq(s_feed(s, 1, 22, 0, 30, off, g1 + off, count, &ready), ZPS_OK);
        ck_assert_int_eq(ready, -1); // not even the bucket's last push updates it
    }
}

// With clipping on, no bucket is updated before the norm is supplied; the
// norm's coefficient times the averaged gradient is what the optimizer
// then takes; and two shards' parts of the sum of squares add up to one
// shard's, bit for bit, as do their parameters after the clipped update.
START_TEST(test_shard_clip_waits_for_the_norm_and_updates_on_coef_times_g)
{
    zps_model_spec model = zps_shard_fx_model();
    float g0[7] = {1, -2, 4, 0, -4, 8, 2}, g1[7] = {3, 2, 0, 4, 4, 0, 2};
    float g[7], init[7];
    zps_model_init_range(&model, 4, 0, 7, init);
    zps_sumsq want;
    zps_sumsq_init(&want);
    for (int i = 0; i < 7; i++) {
        g[i] = (float)((10.0 * g0[i] + 30.0 * g1[i]) / 40.0);
    }
    zps_sumsq_add(&want, g, 7);
    zps_shard *whole = s_clip_shard(&model, 0, 7, 1.0f);
    zps_shard *a = s_clip_shard(&model, 0, 4, 1.0f), *b = s_clip_shard(&model, 4, 7, 1.0f);
    ck_assert(zps_shard_clipping(whole));
    zps_shard *all[3] = {whole, a, b};
    for (int k = 0; k < 3; k++) {
        s_clip_feed(all[k], g0, g1);
        const float *v;
        ck_assert_int_eq(zps_shard_bucket_at(all[k], 0, 1, &v), ZPS_EAGAIN); // not updated
        ck_assert(!zps_shard_step_done(all[k]));
    }
    zps_sumsq pw, pa, pb;
    ck_assert(zps_shard_norm_due(whole, &pw));
    ck_assert(zps_shard_norm_due(a, &pa));
    ck_assert(zps_shard_norm_due(b, &pb));
    ck_assert_mem_eq(pw.limb, want.limb, sizeof want.limb);
    zps_sumsq_merge(&pa, &pb);
    ck_assert_mem_eq(pa.limb, pw.limb, sizeof pw.limb);
    float norm = zps_sumsq_norm(&pw);
    ck_assert_float_eq_tol(norm, sqrtf(g[0] * g[0] + g[1] * g[1] + g[2] * g[2] + g[3] * g[3] +
                                       g[4] * g[4] + g[5] * g[5] + g[6] * g[6]), 1e-5f);
    ck_assert_int_eq(zps_shard_clip(whole, 1, norm), ZPS_ESTALE); // another step: nothing
    for (int k = 0; k < 3; k++) {
        ck_assert_int_eq(zps_shard_clip(all[k], 0, norm), ZPS_OK);
        ck_assert_int_eq(zps_shard_clip(all[k], 0, norm), ZPS_ESTALE); // once
        ck_assert(!zps_shard_norm_due(all[k], NULL));
        for (int bk = 0; bk < zps_shard_n_buckets(all[k]); bk++) {
            ck_assert_int_eq(zps_shard_clip_next(all[k]), bk); // in push order
            ck_assert(zps_shard_bucket_params_are(all[k], bk, 1));
            zps_shard_apply(all[k], bk);
        }
        ck_assert_int_eq(zps_shard_clip_next(all[k]), -1);
        ck_assert(zps_shard_step_done(all[k]));
        zps_shard_end_step(all[k]);
    }
    // The optimizer on coef * g, from zero momentum, bit for bit.
    float coef = zps_sumsq_clip_coef(1.0f, norm), cg[7], want_p[7], mom[7] = {0};
    ck_assert_float_lt(coef, 1.0f); // the clip is active
    for (int i = 0; i < 7; i++) {
        cg[i] = g[i] * coef;
    }
    zps_optim_cfg o = {.lr = 0.5f, .momentum = 0.9f, .schedule = ZPS_LR_CONSTANT};
    zps_optim_sgd_to(&o, 0.5f, init, want_p, mom, cg, 7);
    float pw7[7], pab[7];
    zps_shard_fx_params(whole, 0, pw7);
    zps_shard_fx_params(a, 0, pab);
    zps_shard_fx_params(b, 0, pab);
    ck_assert_mem_eq(pw7, want_p, sizeof want_p);
    ck_assert_mem_eq(pab, want_p, sizeof want_p);
    for (int k = 0; k < 3; k++) {
        zps_shard_destroy(&all[k]);
    }
}
END_TEST

// The clipped path's threads: the mean and the sum of squares split over
// --threads give the same partial sum and, clipped, the same parameters.
// An MLP whose first layer's bucket is large enough to be split.
#define CLIP_P 160801u // mlp:400-400-1
START_TEST(test_shard_clip_threads_give_the_same_bits)
{
    zps_model_spec model;
    ck_assert_int_eq(zps_model_parse("mlp:400-400-1", &model), ZPS_OK);
    static float g0[CLIP_P], g1[CLIP_P];
    for (size_t i = 0; i < CLIP_P; i++) {
        g0[i] = (float)((int)(i % 97) - 48) * 0.01f;
        g1[i] = (float)((int)(i % 89) - 44) * 0.013f;
    }
    zps_sumsq part[2];
    float *p[2];
    for (int t = 0; t < 2; t++) {
        zps_shard_cfg cfg = {.lo = 0, .hi = CLIP_P, .model = &model, .seed = 4,
                             .global_batch = ZPS_SHARD_FX_BATCH, .dtype = ZPS_DTYPE_F32,
                             .optim = {.lr = 0.5f, .schedule = ZPS_LR_CONSTANT},
                             .threads = t ? 3 : 1, .clip_grad_norm = 1.0f};
        zps_shard *s = zps_shard_new(&cfg);
        ck_assert_ptr_nonnull(s);
        zps_shard_fx_add_plan(s);
        s_clip_feed(s, g0, g1);
        ck_assert(zps_shard_norm_due(s, &part[t]));
        ck_assert_int_eq(zps_shard_clip(s, 0, zps_sumsq_norm(&part[t])), ZPS_OK);
        while (zps_shard_clip_next(s) >= 0) {
        }
        p[t] = malloc(CLIP_P * sizeof(float));
        zps_shard_fx_params(s, 0, p[t]);
        zps_shard_destroy(&s);
    }
    ck_assert_mem_eq(part[0].limb, part[1].limb, sizeof part[0].limb);
    ck_assert_mem_eq(p[0], p[1], CLIP_P * sizeof(float));
    free(p[0]);
    free(p[1]);
}
END_TEST

START_TEST(test_shard_updates_each_bucket_by_weighted_average)
{
    zps_model_spec model = zps_shard_fx_model();
    zps_shard *s = s_shard(&model, ZPS_DTYPE_F32, 0);
    float init[HI - LO];
    zps_model_init_range(&model, 4, LO, HI, init);
    float g0[HI - LO] = {4, 0, -4, 8, 2}, g1[HI - LO] = {0, 4, 4, 0, 2};
    int ready;
    // Bucket 0 ([4, 7)) first, as backward produces it.
    ck_assert_int_eq(s_feed(s, 0, 11, 0, 10, 4, g0 + 2, 3, &ready), ZPS_OK);
    ck_assert_int_eq(ready, -1);
    ck_assert_int_eq(s_feed(s, 1, 22, 0, 30, 4, g1 + 2, 3, &ready), ZPS_OK);
    ck_assert_int_eq(ready, 0);
    zps_shard_apply(s, 0);
    ck_assert(!zps_shard_step_done(s));
    ck_assert(!zps_shard_slice_done(s, 0, 10));
    ck_assert_int_eq(s_feed(s, 1, 22, 0, 30, 2, g1, 2, &ready), ZPS_OK);
    ck_assert_int_eq(s_feed(s, 0, 11, 0, 10, 2, g0, 2, &ready), ZPS_OK);
    ck_assert_int_eq(ready, 1);
    ck_assert(zps_shard_slice_done(s, 0, 10));
    zps_shard_apply(s, 1);
    ck_assert(zps_shard_step_done(s));
    // loss = (10 * 1 + 30 * 2) / 40
    ck_assert_float_eq_tol(zps_shard_end_step(s), 1.75f, 1e-6f);
    ck_assert_uint_eq(zps_shard_step(s), 1);
    float p[HI - LO];
    s_params(s, p);
    for (int i = 0; i < HI - LO; i++) {
        float g = (10 * g0[i] + 30 * g1[i]) / 40; // {1, 3, 2, 2, 2}
        ck_assert_float_eq_tol(p[i], init[i] - 0.5f * g, 1e-6f);
    }
    zps_shard_destroy(&s);
    ck_assert_ptr_null(s);
}
END_TEST

START_TEST(test_shard_refusals_leave_parameters_untouched)
{
    zps_model_spec model = zps_shard_fx_model();
    zps_shard *s = s_shard(&model, ZPS_DTYPE_F32, 0.9f);
    float before[HI - LO], after[HI - LO];
    s_params(s, before);
    float g[HI - LO] = {1e6f, 1e6f, 1e6f, 1e6f, 1e6f};
    int ready;
    ck_assert_int_eq(s_feed(s, 0, 11, 1, 10, 4, g, 3, &ready), ZPS_EDUP);     // a member ahead
    ck_assert_int_eq(s_feed(s, 0, 77, 1, 10, 4, g, 3, &ready), ZPS_ESTALE);   // a stranger's future
    ck_assert_int_eq(s_feed(s, 2, 33, 0, 10, 4, g, 3, &ready), ZPS_ENOENT);   // unknown member
    ck_assert_int_eq(s_feed(s, 0, 12, 0, 10, 4, g, 3, &ready), ZPS_ENOENT);   // wrong member id
    ck_assert_int_eq(s_feed(s, 1, 11, 0, 30, 4, g, 3, &ready), ZPS_ENOENT);   // another's rank
    ck_assert_int_eq(s_feed(s, 1, 22, 0, 31, 4, g, 3, &ready), ZPS_EPROTO);   // past the batch
    ck_assert_int_eq(s_feed(s, 0, 11, 0, 10, 1, g, 3, &ready), ZPS_ERANGE);   // outside the range
    ck_assert_int_eq(s_feed(s, 0, 11, 0, 10, 5, g, 3, &ready), ZPS_ERANGE);
    ck_assert_int_eq(s_feed(s, 0, 11, 0, 10, 2, g, 5, &ready), ZPS_EPROTO);   // two buckets at once
    ck_assert_int_eq(s_feed(s, 0, 11, 0, 10, 4, g, 2, &ready), ZPS_EPROTO);   // part of a bucket
    ck_assert_int_eq(s_feed_as(s, ZPS_DTYPE_BF16, 0, 11, 0, 10, 4, g, 3, &ready), ZPS_EPROTO);
    ck_assert_int_eq(s_feed(s, 0, 11, 0, 10, 4, g, 3, &ready), ZPS_OK);
    ck_assert_int_eq(s_feed(s, 0, 11, 0, 10, 4, g, 3, &ready), ZPS_EDUP);     // again: dropped
    ck_assert_int_eq(s_feed(s, 0, 11, 0, 12, 4, g, 3, &ready), ZPS_EDUP);     // overlaps [0, 10)
    ck_assert_int_eq(ready, -1);
    s_params(s, after);
    ck_assert_mem_eq(before, after, sizeof before);
    zps_shard_destroy(&s);
}
END_TEST

// A slice pushed by another member than its owner (handed over) counts
// once; a push of a newer plan is held until the plan arrives; a push of
// an older plan after a newer one took effect is stale.
START_TEST(test_shard_counts_handed_slices_once_and_follows_generations)
{
    zps_model_spec model = zps_shard_fx_model();
    zps_shard *s = s_shard(&model, ZPS_DTYPE_F32, 0);
    float g[HI - LO] = {1, 1, 1, 1, 1};
    int ready;
    // Rank 1 computes rank 0's slice [0, 10) as well as its own.
    zps_wire_msg m = s_push(1, 22, 0, 10, 4, g + 2, 3, ZPS_DTYPE_F32);
    m.hdr->batch_offset = 0;
    char why[256];
    ck_assert_int_eq(zps_shard_push(s, &m, &ready, why, sizeof why), ZPS_OK);
    zps_wire_msg_fini(&m);
    // The owner's late copy is dropped.
    ck_assert_int_eq(s_feed(s, 0, 11, 0, 10, 4, g + 2, 3, &ready), ZPS_EDUP);
    ck_assert_int_eq(s_feed(s, 1, 22, 0, 30, 4, g + 2, 3, &ready), ZPS_OK);
    ck_assert_int_eq(ready, 0);
    // Generation 2 (rank 1 alone) from step 1 on: unknown yet, so held.
    m = s_push(1, 22, 1, 40, 4, g + 2, 3, ZPS_DTYPE_F32);
    m.hdr->batch_offset = 0;
    m.hdr->generation = 2;
    ck_assert_int_eq(zps_shard_push(s, &m, &ready, why, sizeof why), ZPS_EAGAIN);
    zps_wire_msg_fini(&m);
    zps_plan_slice only = {.rank = 1, .member_id = 22, .offset = 0, .count = 40};
    zps_plan solo = {.global_batch = 40, .n = 1, .slices = &only}; // borrowed: the shard copies
    zps_shard_add_plan(s, 2, 1, &solo);
    ck_assert_uint_eq(zps_shard_generation(s), 2);
    zps_shard_apply(s, 0);
    ck_assert_int_eq(s_feed(s, 1, 22, 0, 30, 2, g, 2, &ready), ZPS_OK);
    m = s_push(0, 11, 0, 10, 2, g, 2, ZPS_DTYPE_F32);
    ck_assert_int_eq(zps_shard_push(s, &m, &ready, why, sizeof why), ZPS_OK);
    zps_wire_msg_fini(&m);
    ck_assert_int_eq(ready, 1);
    zps_shard_apply(s, 1);
    zps_shard_end_step(s);
    // Step 1 is generation 2's: a member's generation-1 push is dropped;
    // one from rank 0, which only the forgotten generation 1 named (no step
    // from 1 on uses it), is refused as a stranger's is: it was handed on.
    ck_assert_int_eq(s_feed(s, 1, 22, 1, 40, 4, g + 2, 3, &ready), ZPS_EDUP);
    ck_assert_int_eq(s_feed(s, 0, 11, 1, 10, 4, g + 2, 3, &ready), ZPS_ESTALE);
    ck_assert_int_eq(s_feed(s, 0, 99, 1, 10, 4, g + 2, 3, &ready), ZPS_ESTALE);
    zps_shard_destroy(&s);
}
END_TEST

START_TEST(test_shard_serves_parameters_of_the_step_in_progress)
{
    zps_model_spec model = zps_shard_fx_model();
    zps_shard *s = s_shard(&model, ZPS_DTYPE_F32, 0);
    float init[HI - LO];
    zps_model_init_range(&model, 4, LO, HI, init);
    float g[HI - LO] = {2, 2, 2, 2, 2};
    int ready;
    const float *v;
    ck_assert_int_eq(zps_shard_bucket_at(s, 0, 1, &v), ZPS_EAGAIN);
    ck_assert_int_eq(s_feed(s, 0, 11, 0, 10, 4, g + 2, 3, &ready), ZPS_OK);
    ck_assert_int_eq(s_feed(s, 1, 22, 0, 30, 4, g + 2, 3, &ready), ZPS_OK);
    zps_shard_apply(s, 0);
    // Bucket 0 moved on to step 1; step 0's values are still served.
    ck_assert_int_eq(zps_shard_bucket_at(s, 0, 0, &v), ZPS_OK);
    ck_assert_float_eq(v[0], init[2]);
    ck_assert_int_eq(zps_shard_bucket_at(s, 0, 1, &v), ZPS_OK);
    ck_assert_float_eq_tol(v[0], init[2] - 1.0f, 1e-6f);
    ck_assert_int_eq(zps_shard_bucket_at(s, 1, 1, &v), ZPS_EAGAIN);
    ck_assert_int_eq(zps_shard_bucket_at(s, 1, 0, &v), ZPS_OK);
    ck_assert_int_eq(zps_shard_bucket_at(s, 1, 3, &v), ZPS_ESTALE);
    // The wire buffer, which a PULL is answered from zero-copy, holds bucket
    // 0 as of step 1 and bucket 1 as of step 0; older values are copies.
    ck_assert(zps_shard_bucket_params_are(s, 0, 1));
    ck_assert(!zps_shard_bucket_params_are(s, 0, 0));
    ck_assert(zps_shard_bucket_params_are(s, 1, 0));
    ck_assert(!zps_shard_bucket_params_are(s, 1, 1));
    const void *wire;
    uint64_t offset, count;
    zps_wire_ref *ref;
    zps_shard_bucket_params(s, 0, &wire, &offset, &count, &ref);
    ck_assert_int_eq(zps_shard_bucket_at(s, 0, 1, &v), ZPS_OK);
    ck_assert_mem_eq(wire, v, count * sizeof(float));
    zps_shard_destroy(&s);
}
END_TEST

// Both ranks push bucket `b` of their gradients (g[r]: the whole range),
// and the shard applies it: bucket 0 is [4, 7), bucket 1 [2, 4).
static void s_push_bucket(zps_shard *s, int b, const float *const g[2])
{
    uint64_t step = zps_shard_step(s);
    uint64_t off = b == 0 ? 4 : 2, count = b == 0 ? 3 : 2;
    int ready;
    for (uint32_t r = 0; r < 2; r++) {
        ck_assert_int_eq(s_feed(s, r, zps_shard_fx_id[r], step, zps_shard_fx_count[r], off,
                                g[r] + (off - LO), count, &ready),
                         ZPS_OK);
    }
    zps_shard_apply(s, ready);
}

// One step of both ranks pushing both buckets (g[r]: rank r's gradient),
// applied and ended.
static void s_step_ranks(zps_shard *s, const float *const g[2])
{
    s_push_bucket(s, 0, g);
    s_push_bucket(s, 1, g);
    ck_assert(zps_shard_step_done(s));
    zps_shard_end_step(s);
}

// One step of both ranks pushing both buckets with gradient g, applied.
static void s_step_both(zps_shard *s, const float *g)
{
    const float *const both[2] = {g, g};
    s_step_ranks(s, both);
}

// The parameters live in two arrays by step parity (zps_shard.c): each
// step serves the values before and after its update, the step before it
// until its own first update, and a buffer sent zero-copy that a peer
// still reads is never written, however many steps go by.
START_TEST(test_shard_keeps_what_a_peer_reads_and_serves_both_sides_of_an_update)
{
    zps_model_spec model = zps_shard_fx_model();
    zps_shard *s = s_shard(&model, ZPS_DTYPE_F32, 0.9f);
    float g[HI - LO] = {1, -2, 0.5f, 4, -1};
    float p0[HI - LO], p1[HI - LO], p2[HI - LO], held[3];
    s_params(s, p0);
    s_step_both(s, g);
    s_params(s, p1);
    // Bucket 0 as sent after step 0, held by a peer that does not read.
    const void *data;
    uint64_t off, count;
    zps_wire_ref *ref;
    zps_shard_bucket_params(s, 0, &data, &off, &count, &ref);
    ck_assert_uint_eq(off, 4);
    memcpy(held, data, sizeof held);
    atomic_fetch_add(&ref->inflight, 1);
    const float *v;
    ck_assert_int_eq(zps_shard_bucket_at(s, 0, 0, &v), ZPS_OK); // the step before, not yet updated
    ck_assert_mem_eq(v, p0 + 2, 3 * sizeof(float));
    for (int t = 1; t < 5; t++) {
        s_step_both(s, g);
        ck_assert_mem_eq(data, held, sizeof held); // never written while held
    }
    s_params(s, p2);
    ck_assert(memcmp(p2, p1, sizeof p2) != 0);
    atomic_fetch_sub(&ref->inflight, 1);
    // Mid-step: the bucket updated serves its values before and after.
    uint64_t step = zps_shard_step(s);
    const float *const both[2] = {g, g};
    s_push_bucket(s, 0, both);
    ck_assert_int_eq(zps_shard_bucket_at(s, 0, step, &v), ZPS_OK);
    ck_assert_mem_eq(v, p2 + 2, 3 * sizeof(float));
    ck_assert_int_eq(zps_shard_bucket_at(s, 0, step + 1, &v), ZPS_OK);
    ck_assert(memcmp(v, p2 + 2, 3 * sizeof(float)) != 0);
    ck_assert_int_eq(zps_shard_bucket_at(s, 0, step - 1, &v), ZPS_ESTALE);
    zps_shard_bucket_params(s, 0, &data, &off, &count, &ref);
    ck_assert_mem_eq(data, v, 3 * sizeof(float)); // what is sent is the new values
    zps_shard_destroy(&s);
}
END_TEST

// A declared model's shard: nothing served and no push counted until rank
// 0's initial values of every bucket are in; then they are the parameters.
START_TEST(test_shard_waits_for_initial_values_then_serves_them)
{
    zps_model_spec model = zps_shard_fx_model();
    zps_shard_cfg cfg = {.index = 1, .lo = LO, .hi = HI, .model = &model,
                         .global_batch = ZPS_SHARD_FX_BATCH, .dtype = ZPS_DTYPE_F32,
                         .await_init = true,
                         .optim = {.lr = 0.5f, .schedule = ZPS_LR_CONSTANT}};
    zps_shard *s = zps_shard_new(&cfg);
    ck_assert_ptr_nonnull(s);
    zps_shard_fx_add_plan(s);
    const float *v;
    int ready;
    float init[HI - LO] = {1, 2, 3, 4, 5}, g[HI - LO] = {0};
    ck_assert(zps_shard_awaits_init(s));
    ck_assert_int_eq(zps_shard_bucket_at(s, 0, 0, &v), ZPS_EAGAIN);
    ck_assert_int_eq(s_feed(s, 0, 11, 0, 10, 4, g, 3, &ready), ZPS_ESTATE);
    char why[256];
    bool complete;
    zps_wire_msg m = s_push(0, 11, 0, 10, 4, init + 2, 3, ZPS_DTYPE_F32);
    ck_assert_int_eq(zps_shard_take_init(s, &m, &complete, why, sizeof why), ZPS_OK);
    ck_assert(!complete);
    ck_assert_int_eq(zps_shard_take_init(s, &m, &complete, why, sizeof why), ZPS_EDUP);
    zps_wire_msg_fini(&m);
    m = s_push(0, 11, 0, 10, 3, init + 1, 3, ZPS_DTYPE_F32); // not a bucket of the shard
    ck_assert_int_eq(zps_shard_take_init(s, &m, &complete, why, sizeof why), ZPS_EPROTO);
    zps_wire_msg_fini(&m);
    m = s_push(0, 11, 0, 10, 2, init, 2, ZPS_DTYPE_BF16); // initial values are fp32
    ck_assert_int_ne(zps_shard_take_init(s, &m, &complete, why, sizeof why), ZPS_OK);
    zps_wire_msg_fini(&m);
    ck_assert_int_eq(zps_shard_bucket_at(s, 1, 0, &v), ZPS_EAGAIN);
    m = s_push(0, 11, 0, 10, 2, init, 2, ZPS_DTYPE_F32);
    ck_assert_int_eq(zps_shard_take_init(s, &m, &complete, why, sizeof why), ZPS_OK);
    ck_assert(complete);
    zps_wire_msg_fini(&m);
    ck_assert(!zps_shard_awaits_init(s));
    float got[HI - LO];
    s_params(s, got);
    for (int i = 0; i < HI - LO; i++) {
        ck_assert_float_eq(got[i], init[i]);
    }
    ck_assert_int_eq(zps_shard_bucket_at(s, 0, 0, &v), ZPS_OK);
    ck_assert_float_eq(v[0], init[2]);
    ck_assert_int_eq(s_feed(s, 0, 11, 0, 10, 4, g, 3, &ready), ZPS_OK);
    zps_shard_destroy(&s);
}
END_TEST

START_TEST(test_shard_bf16_pushes_and_replies)
{
    zps_model_spec model = zps_shard_fx_model();
    zps_shard *s = s_shard(&model, ZPS_DTYPE_BF16, 0);
    float init[HI - LO];
    zps_model_init_range(&model, 4, LO, HI, init);
    float g[HI - LO] = {1, 0.5f, -1, 2, 0.25f}; // exact in bf16
    int ready;
    for (uint32_t r = 0; r < 2; r++) {
        uint64_t id = zps_shard_fx_id[r];
        uint32_t n = zps_shard_fx_count[r];
        ck_assert_int_eq(s_feed_as(s, ZPS_DTYPE_BF16, r, id, 0, n, 4, g + 2, 3, &ready), ZPS_OK);
        ck_assert_int_eq(s_feed_as(s, ZPS_DTYPE_BF16, r, id, 0, n, 2, g, 2, &ready), ZPS_OK);
    }
    zps_shard_apply(s, 0);
    zps_shard_apply(s, 1);
    zps_shard_end_step(s);
    for (int b = 0; b < 2; b++) {
        const void *data;
        uint64_t off, count;
        zps_wire_ref *ref;
        zps_shard_bucket_params(s, b, &data, &off, &count, &ref);
        float p[3];
        zps_dtype_to_f32(ZPS_DTYPE_BF16, data, p, count);
        for (uint64_t i = 0; i < count; i++) {
            float want = init[off - LO + i] - 0.5f * g[off - LO + i];
            // bf16 keeps 8 significant bits
            ck_assert_float_eq_tol(p[i], want, fabsf(want) / 128 + 1e-6f);
        }
    }
    zps_shard_destroy(&s);
}
END_TEST

// ---------------------------------------------------------------- AdamW

// An AdamW (or, with kind, another optimizer's) shard 1 of 2 of [LO, HI):
// cosine schedule over 10 steps, so the rate changes from step to step too.
static zps_shard *s_optim_shard(const zps_model_spec *model, zps_optim_kind kind)
{
    zps_shard_cfg cfg = {.index = 1, .shards = 2, .lo = LO, .hi = HI, .model = model, .seed = 4,
                         .global_batch = ZPS_SHARD_FX_BATCH, .dtype = ZPS_DTYPE_F32,
                         .optim = {.kind = kind, .lr = 0.05f, .weight_decay = 0.1f,
                                   .momentum = 0.9f, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                                   .schedule = ZPS_LR_COSINE, .total_steps = 10}};
    zps_shard *s = zps_shard_new(&cfg);
    ck_assert_ptr_nonnull(s);
    zps_shard_fx_add_plan(s);
    return s;
}

// One whole step: both ranks push both buckets, gradients that change
// with the step (signs included), and the step ends.
static void s_adamw_step(zps_shard *s)
{
    uint64_t step = zps_shard_step(s);
    float g[2][HI - LO];
    for (int r = 0; r < 2; r++) {
        for (int i = 0; i < HI - LO; i++) {
            g[r][i] = sinf((float)(step * 7 + (uint64_t)i * 3 + (uint64_t)r)) * (float)(i + 1);
        }
    }
    const float *const ranks[2] = {g[0], g[1]};
    s_step_ranks(s, ranks);
}

// An AdamW shard saved after 3 steps and restored into a new shard goes on
// with the same bits as the one that never stopped: the checkpoint holds
// both moments and the step count that the bias corrections need.
START_TEST(test_shard_adamw_restored_from_checkpoint_continues_bitwise)
{
    zps_model_spec model = zps_shard_fx_model();
    char dir[64];
    zps_tmpdir_make(dir, sizeof dir, "shard");
    zps_shard *a = s_optim_shard(&model, ZPS_OPTIM_ADAMW);
    for (int t = 0; t < 3; t++) {
        s_adamw_step(a);
    }
    ck_assert_int_eq(zps_shard_save(a, dir, 1), ZPS_OK);
    float at3[HI - LO];
    s_params(a, at3);
    for (int t = 3; t < 8; t++) {
        s_adamw_step(a);
    }
    zps_shard *b = s_optim_shard(&model, ZPS_OPTIM_ADAMW);
    uint64_t loaded = 0;
    ck_assert_int_eq(zps_shard_restore(b, dir, UINT64_MAX, &loaded), ZPS_OK);
    ck_assert_uint_eq(loaded, 3);
    ck_assert_uint_eq(zps_shard_step(b), 3);
    float p[HI - LO], want[HI - LO];
    s_params(b, p);
    ck_assert_mem_eq(p, at3, sizeof p);
    for (int t = 3; t < 8; t++) {
        s_adamw_step(b);
    }
    s_params(a, want);
    s_params(b, p);
    ck_assert_mem_eq(p, want, sizeof p);
    ck_assert(memcmp(p, at3, sizeof p) != 0); // the 5 steps moved them
    // A shard of the same range with another optimizer refuses the checkpoint.
    zps_shard *other[2] = {s_optim_shard(&model, ZPS_OPTIM_SGD),
                           s_optim_shard(&model, ZPS_OPTIM_ADAM)};
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(zps_shard_restore(other[i], dir, UINT64_MAX, &loaded), ZPS_ENOENT);
        zps_shard_destroy(&other[i]);
    }
    zps_shard_destroy(&a);
    zps_shard_destroy(&b);
    ck_assert_int_eq(zps_tmpdir_remove(dir), 0);
}
END_TEST

// --threads: the same pushes give the same bits whatever the number of
// threads. An MLP of a bucket large enough to be split over the threads
// (zps_pool_for) and one that is not, each pushed in frames of unequal
// length (a thread's range starts and ends inside frames).
#define THREADS_MODEL "mlp:500-500-99"
#define THREADS_P 300099u // 500 * 500 + 500 in the first layer's bucket, 500 * 99 + 99

// Rank r's push of bucket [off, off + count) at `step`, in frames of at most
// frame elements, the values drawn from (r, step, off).
static zps_wire_msg s_push_frames(uint32_t rank, uint64_t step, uint64_t off, uint64_t count,
                                  zps_dtype dtype, uint64_t frame, float *vals)
{
    uint64_t st = 0x9e3779b97f4a7c15ull ^ (rank * 1000003ull + step * 7919ull + off);
    for (uint64_t i = 0; i < count; i++) {
        st ^= st << 13;
        st ^= st >> 7;
        st ^= st << 17;
        vals[i] = (float)((double)(st >> 11) / 9007199254740992.0 - 0.5);
    }
    zps_wire_msg m = s_push(rank, rank ? 22 : 11, step, rank ? 30 : 10, off, vals, count, dtype);
    zmq_msg_close(&m.frames[0]);
    size_t esize = zps_dtype_size(dtype);
    m.n_frames = 0;
    for (uint64_t at = 0; at < count; at += frame) {
        uint64_t len = count - at < frame ? count - at : frame;
        zmq_msg_init_size(&m.frames[m.n_frames], len * esize);
        zps_dtype_from_f32(dtype, vals + at, zmq_msg_data(&m.frames[m.n_frames]), len);
        m.n_frames++;
    }
    return m;
}

// How s_train feeds a shard: its threads and update, the rank that pushes
// each bucket first, each rank's frame length, and whether the shard reads
// the first push at once (zps_shard_settle) instead of keeping it.
typedef struct s_train_how {
    int threads;
    zps_optim_kind kind;
    zps_dtype dtype;
    uint32_t first;
    uint64_t frame[2];
    bool settle;
} s_train_how;

// Three steps of both ranks pushing every bucket into a shard; its
// parameters, as sent, into out (THREADS_P elements of the dtype).
static void s_train(const zps_model_spec *model, const s_train_how *how, uint8_t *out)
{
    zps_shard_cfg cfg = {.index = 0, .lo = 0, .hi = THREADS_P, .model = model, .seed = 4,
                         .global_batch = ZPS_SHARD_FX_BATCH, .dtype = how->dtype,
                         .threads = how->threads,
                         .optim = {.kind = how->kind, .lr = 0.01f, .momentum = 0.9f,
                                   .weight_decay = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f,
                                   .eps = 1e-8f, .schedule = ZPS_LR_CONSTANT}};
    zps_shard *s = zps_shard_new(&cfg);
    ck_assert_ptr_nonnull(s);
    zps_shard_fx_add_plan(s);
    static float vals[THREADS_P];
    for (uint64_t step = 0; step < 3; step++) {
        for (int b = zps_shard_n_buckets(s) - 1; b >= 0; b--) {
            const void *data;
            uint64_t off, count;
            zps_wire_ref *ref;
            zps_shard_bucket_params(s, b, &data, &off, &count, &ref);
            int ready = -1;
            for (uint32_t k = 0; k < 2; k++) {
                uint32_t r = k == 0 ? how->first : 1 - how->first;
                zps_wire_msg m = s_push_frames(r, step, off, count, how->dtype,
                                               how->frame[r], vals);
                char why[256] = "";
                ck_assert_int_eq(zps_shard_push(s, &m, &ready, why, sizeof why), ZPS_OK);
                zps_wire_msg_fini(&m); // the shard keeps references of its own
                if (k == 0 && how->settle) {
                    zps_shard_settle(s);
                }
            }
            ck_assert_int_eq(ready, b);
            zps_shard_apply(s, ready);
        }
        zps_shard_end_step(s);
    }
    size_t esize = zps_dtype_size(how->dtype);
    for (int b = 0; b < zps_shard_n_buckets(s); b++) {
        const void *data;
        uint64_t off, count;
        zps_wire_ref *ref;
        zps_shard_bucket_params(s, b, &data, &off, &count, &ref);
        memcpy(out + off * esize, data, count * esize);
    }
    zps_shard_destroy(&s);
}

static void s_train_threads(const zps_model_spec *model, int threads, zps_optim_kind kind,
                            zps_dtype dtype, uint8_t *out)
{
    s_train_how how = {.threads = threads, .kind = kind, .dtype = dtype,
                       .frame = {30000, 30000}};
    s_train(model, &how, out);
}

// The updates and wire dtypes that the bitwise tests below go through.
typedef struct s_case {
    zps_optim_kind kind;
    zps_dtype dtype;
} s_case;

static const s_case s_cases[] = {
    {ZPS_OPTIM_SGD, ZPS_DTYPE_F32}, {ZPS_OPTIM_ADAMW, ZPS_DTYPE_F32},
    {ZPS_OPTIM_SGD, ZPS_DTYPE_BF16}, {ZPS_OPTIM_SGD, ZPS_DTYPE_F16}};

START_TEST(test_shard_threads_give_the_same_bits_for_any_number)
{
    zps_model_spec model;
    ck_assert_int_eq(zps_model_parse(THREADS_MODEL, &model), ZPS_OK);
    static uint8_t one[THREADS_P * 4], many[THREADS_P * 4], init[THREADS_P * 4];
    for (size_t c = 0; c < sizeof s_cases / sizeof s_cases[0]; c++) {
        size_t bytes = THREADS_P * zps_dtype_size(s_cases[c].dtype);
        s_train_threads(&model, 1, s_cases[c].kind, s_cases[c].dtype, one);
        zps_model_init_range(&model, 4, 0, THREADS_P, (float *)init);
        ck_assert(memcmp(one, init, bytes) != 0); // the steps moved them
        const int threads[] = {2, 3, 7};
        for (int t = 0; t < 3; t++) {
            memset(many, 0xa5, sizeof many);
            s_train_threads(&model, threads[t], s_cases[c].kind, s_cases[c].dtype, many);
            ck_assert_msg(memcmp(one, many, bytes) == 0, "case %zu: %d threads differ from one",
                          c, threads[t]);
        }
    }
}
END_TEST

// A bucket's first push is kept unread and read with the second in one
// pass: the parameters are those of reading it at once (the shard settled
// after each first push), bit for bit, whichever rank comes first and
// wherever each push's frames end.
START_TEST(test_shard_kept_first_push_gives_the_bits_of_one_read_at_once)
{
    zps_model_spec model;
    ck_assert_int_eq(zps_model_parse(THREADS_MODEL, &model), ZPS_OK);
    static uint8_t at_once[THREADS_P * 4], kept[THREADS_P * 4];
    for (size_t c = 0; c < sizeof s_cases / sizeof s_cases[0]; c++) {
        size_t bytes = THREADS_P * zps_dtype_size(s_cases[c].dtype);
        s_train_how how = {.threads = 1, .kind = s_cases[c].kind, .dtype = s_cases[c].dtype,
                           .frame = {30000, 30000}, .settle = true};
        s_train(&model, &how, at_once);
        const s_train_how ways[] = {
            {.threads = 1, .frame = {30000, 30000}},
            {.threads = 1, .first = 1, .frame = {30000, 17000}},
            {.threads = 3, .first = 0, .frame = {7001, 30000}},
        };
        for (size_t w = 0; w < sizeof ways / sizeof ways[0]; w++) {
            s_train_how way = ways[w];
            way.kind = s_cases[c].kind;
            way.dtype = s_cases[c].dtype;
            memset(kept, 0xa5, sizeof kept);
            s_train(&model, &way, kept);
            ck_assert_msg(memcmp(at_once, kept, bytes) == 0,
                          "case %zu, way %zu: kept differs from read at once", c, w);
        }
    }
}
END_TEST

static int s_frees;

static void s_count_free(void *data, void *hint)
{
    (void)data;
    (void)hint;
    s_frees++;
}

// rank's push of bucket b at step 0 as a view of vals (shared memory's
// way): a frame of memory the shard does not own, with a free function.
static zps_err s_feed_view(zps_shard *s, uint32_t rank, int b, float *vals, int *ready)
{
    const void *data;
    uint64_t off, count;
    zps_wire_ref *ref;
    zps_shard_bucket_params(s, b, &data, &off, &count, &ref);
    zps_wire_msg m = s_push(rank, rank ? 22 : 11, 0, rank ? 30 : 10, off, vals, count,
                            ZPS_DTYPE_F32);
    zmq_msg_close(&m.frames[0]);
    zmq_msg_init_data(&m.frames[0], vals, count * sizeof(float), s_count_free, NULL);
    char why[256] = "";
    zps_err err = zps_shard_push(s, &m, ready, why, sizeof why);
    zps_wire_msg_fini(&m);
    return err;
}

// A view's free function says when its memory is no longer read: a kept
// view's only once the shard read it (with the next push, or settled) or
// dropped it (the shard gone), never while the shard may still read it.
START_TEST(test_shard_kept_view_is_freed_once_read_or_dropped)
{
    zps_model_spec model = zps_shard_fx_model();
    float init[HI - LO];
    zps_model_init_range(&model, 4, LO, HI, init);
    const float g0[3] = {-4, 8, 2}, g1[3] = {4, 0, 2};
    int ready;
    for (int way = 0; way < 3; way++) {
        zps_shard *s = s_shard(&model, ZPS_DTYPE_F32, 0);
        float view[3] = {g0[0], g0[1], g0[2]};
        s_frees = 0;
        ck_assert_int_eq(s_feed_view(s, 0, 0, view, &ready), ZPS_OK);
        ck_assert_int_eq(ready, -1);
        ck_assert_int_eq(s_frees, 0); // kept: the push's handling is over, the view is not
        if (way == 2) {
            zps_shard_destroy(&s);
            ck_assert_int_eq(s_frees, 1);
            continue;
        }
        if (way == 1) {
            zps_shard_settle(s);
            ck_assert_int_eq(s_frees, 1);
            memset(view, 0x7f, sizeof view); // read already: its owner may reuse it
        }
        ck_assert_int_eq(s_feed(s, 1, 22, 0, 30, 4, g1, 3, &ready), ZPS_OK);
        ck_assert_int_eq(ready, 0);
        ck_assert_int_eq(s_frees, 1);
        zps_shard_apply(s, 0);
        const float *v;
        ck_assert_int_eq(zps_shard_bucket_at(s, 0, 1, &v), ZPS_OK);
        for (int i = 0; i < 3; i++) {
            float g = (10 * g0[i] + 30 * g1[i]) / 40;
            ck_assert_float_eq_tol(v[i], init[2 + i] - 0.5f * g, 1e-6f);
        }
        zps_shard_destroy(&s);
    }
}
END_TEST

Suite *zps_suite_shard(void)
{
    Suite *s = suite_create("shard");
    TCase *tc = tcase_create("buckets");
    tcase_add_test(tc, test_shard_updates_each_bucket_by_weighted_average);
    tcase_add_test(tc, test_shard_tracks_buckets_past_the_first_64);
    tcase_add_test(tc, test_shard_refusals_leave_parameters_untouched);
    tcase_add_test(tc, test_shard_counts_handed_slices_once_and_follows_generations);
    tcase_add_test(tc, test_shard_serves_parameters_of_the_step_in_progress);
    tcase_add_test(tc, test_shard_keeps_what_a_peer_reads_and_serves_both_sides_of_an_update);
    tcase_add_test(tc, test_shard_bf16_pushes_and_replies);
    tcase_add_test(tc, test_shard_waits_for_initial_values_then_serves_them);
    tcase_add_test(tc, test_shard_adamw_restored_from_checkpoint_continues_bitwise);
    tcase_add_test(tc, test_shard_threads_give_the_same_bits_for_any_number);
    tcase_add_test(tc, test_shard_kept_first_push_gives_the_bits_of_one_read_at_once);
    tcase_add_test(tc, test_shard_kept_view_is_freed_once_read_or_dropped);
    tcase_add_test(tc, test_shard_clip_waits_for_the_norm_and_updates_on_coef_times_g);
    tcase_add_test(tc, test_shard_clip_threads_give_the_same_bits);
    suite_add_tcase(s, tc);
    return s;
}
