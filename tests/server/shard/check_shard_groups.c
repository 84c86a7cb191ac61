/* check_shard_groups.c - a declared model's parameter groups, buffers and
 * learning-rate table on the shards (common/zps_groups.h): each tensor's
 * elements follow their own group's update, an averaged buffer becomes the
 * sample-weighted mean of the pushed values and a broadcast one the value
 * of the slice holding sample 0, the table's row of each step is its rate,
 * and the bits are the same with the range cut into 1, 2 or 3 shards;
 * and so with --clip-grad-norm, whose norm is the parameters' alone. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/zps_groups.h"
#include "common/zps_layout.h"
#include "common/zps_sumsq.h"
#include "server/shard/zps_shard.h"
#include "tests/server/shard/zps_shard_fx.h"
#include "tests/zps_check.h"
#include "tests/zps_tmpdir.h"

// The layout: A[6] in group 0 (AdamW, decay 0.1), B[5] in group 1 (AdamW,
// decay 0), C[3] a buffer averaged, D[4] a buffer broadcast.
#define N_PARAMS 18
#define STEPS 3 // one more than the table's rows: the last row again

static uint64_t s_shape[4][1] = {{6}, {5}, {3}, {4}};
static const uint32_t s_role[4] = {ZPS_ROLE_PARAM, ZPS_ROLE_PARAM, ZPS_ROLE_AVERAGE,
                                   ZPS_ROLE_BROADCAST};
static const uint32_t s_group[4] = {0, 1, 0, 0};
static const float s_table[2 * 2] = {0.01f, 0.02f, 0.005f, 0.001f}; // [step][group]

typedef struct s_layout {
    Zps__Layout l;
    Zps__Tensor t[4];
    Zps__Tensor *tp[4];
    Zps__Optim g[2];
    Zps__Optim *gp[2];
} s_layout;

static void s_layout_init(s_layout *x)
{
    static char *names[4] = {"A", "B", "C", "D"};
    zps__layout__init(&x->l);
    for (int i = 0; i < 4; i++) {
        zps__tensor__init(&x->t[i]);
        x->t[i].name = names[i];
        x->t[i].shape = s_shape[i];
        x->t[i].n_shape = 1;
        x->t[i].role = s_role[i];
        x->t[i].group = s_group[i];
        x->tp[i] = &x->t[i];
    }
    for (int i = 0; i < 2; i++) {
        zps__optim__init(&x->g[i]);
        x->g[i].kind = ZPS_OPTIM_ADAMW;
        x->g[i].lr = 0.01f;
        x->g[i].weight_decay = i == 0 ? 0.1f : 0.0f;
        x->g[i].beta1 = 0.9;
        x->g[i].beta2 = 0.999;
        x->g[i].eps = 1e-8;
        x->gp[i] = &x->g[i];
    }
    x->l.tensors = x->tp;
    x->l.n_tensors = 4;
    x->l.groups = x->gp;
    x->l.n_groups = 2;
}

static float s_init(size_t i)
{
    return 0.05f * ((float)i - 9.0f);
}

// Rank r's pushed value of element i at step t (a gradient or a buffer's value).
static float s_val(int r, uint64_t t, size_t i)
{
    return (r == 0 ? 0.1f : -0.07f) * (float)(i + 1) + 0.01f * (float)t;
}

// One message of shard s's bucket b: INIT of the initial values (with the
// table) or rank r's PUSH of step t.
static zps_err s_send(zps_shard *s, int b, bool init, int r, uint64_t t)
{
    const void *data;
    uint64_t off, count;
    zps_wire_ref *ref;
    zps_shard_bucket_params(s, b, &data, &off, &count, &ref);
    Zps__Header h;
    Zps__Schedule table = ZPS__SCHEDULE__INIT;
    zps_wire_header_init(&h, init ? ZPS__MSG_TYPE__INIT : ZPS__MSG_TYPE__PUSH);
    if (init) {
        table.groups = 2;
        table.steps = 2;
        table.lr = (float *)s_table;
        table.n_lr = 4;
        h.schedule = &table;
    } else {
        h.rank = (uint32_t)r;
        h.member_id = zps_shard_fx_id[r];
        h.samples = zps_shard_fx_count[r];
        h.batch_offset = zps_shard_fx_offset[r];
        h.generation = 1;
        h.step = t;
    }
    h.offset = off;
    h.count = count;
    h.dtype = ZPS__DTYPE__F32;
    zps_wire_msg m;
    float *vals = (float *)(void *)zps_shard_fx_msg(&m, &h, count * sizeof(float));
    for (uint64_t i = 0; i < count; i++) {
        vals[i] = init ? s_init(off + i) : s_val(r, t, off + i);
    }
    char why[256] = "";
    bool complete;
    int ready = -1;
    zps_err err = init ? zps_shard_take_init(s, &m, &complete, why, sizeof why)
                       : zps_shard_push(s, &m, &ready, why, sizeof why);
    if (err == ZPS_OK && ready >= 0) {
        zps_shard_apply(s, ready);
    }
    zps_wire_msg_fini(&m);
    return err;
}

// Shard k of n of the layout (which must outlive it), awaiting INIT, with
// --clip-grad-norm clip (0: off).
static zps_shard *s_new_clip(const s_layout *x, zps_model_spec *model, int k, int n, float clip)
{
    char why[256];
    ck_assert_int_eq(zps_layout_check(&x->l, why, sizeof why), ZPS_OK);
    zps_layout_model(&x->l, model);
    ck_assert_uint_eq(model->n_params, N_PARAMS);
    zps_shard_cfg cfg = {.index = (uint32_t)k, .shards = (uint32_t)n, .model = model,
                         .global_batch = ZPS_SHARD_FX_BATCH, .dtype = ZPS_DTYPE_F32,
                         .optim = {.kind = ZPS_OPTIM_ADAMW, .lr = 0.01f, .beta1 = 0.9,
                                   .beta2 = 0.999, .eps = 1e-8},
                         .await_init = true, .layout = &x->l, .clip_grad_norm = clip};
    zps_model_shard_range(N_PARAMS, (uint32_t)k, (uint32_t)n, &cfg.lo, &cfg.hi);
    zps_shard *s = zps_shard_new(&cfg);
    ck_assert_ptr_nonnull(s);
    zps_shard_fx_add_plan(s);
    return s;
}

static zps_shard *s_new(const s_layout *x, zps_model_spec *model, int k, int n)
{
    return s_new_clip(x, model, k, n, 0.0f);
}

// Both ranks' pushes of step t, every bucket of shard s.
static void s_push_step(zps_shard *s, uint64_t t)
{
    for (int b = 0; b < zps_shard_n_buckets(s); b++) {
        ck_assert_int_eq(s_send(s, b, false, 0, t), ZPS_OK);
        ck_assert_int_eq(s_send(s, b, false, 1, t), ZPS_OK);
    }
}

// Steps [from, to) of the job on shard s.
static void s_steps(zps_shard *s, uint64_t from, uint64_t to)
{
    for (uint64_t t = from; t < to; t++) {
        s_push_step(s, t);
        ck_assert(zps_shard_step_done(s));
        zps_shard_end_step(s);
    }
}

static void s_init_all(zps_shard *s)
{
    for (int b = 0; b < zps_shard_n_buckets(s); b++) {
        ck_assert_int_eq(s_send(s, b, true, 0, 0), ZPS_OK);
    }
}

// STEPS steps of the job on n shards; out: the parameters after them.
static void s_run(int n, float *out)
{
    s_layout x;
    s_layout_init(&x);
    zps_model_spec model;
    for (int k = 0; k < n; k++) {
        zps_shard *s = s_new(&x, &model, k, n);
        s_init_all(s);
        s_steps(s, 0, STEPS);
        zps_shard_fx_params(s, zps_shard_lo(s), out + zps_shard_lo(s));
        zps_shard_destroy(&s);
    }
}

// Step t's averaged push of every element, as the shard rounds it (the
// weighted mean in double of rank 0's 10 samples and rank 1's 30).
static void s_mean(uint64_t t, float *g)
{
    for (size_t i = 0; i < N_PARAMS; i++) {
        double acc = 0.0 + (double)10.0f * (double)s_val(0, t, i);
        g[i] = (float)((acc + (double)30.0f * (double)s_val(1, t, i)) / 40.0);
    }
}

// Step t of the reference, tensor by tensor with zps_optim_adam_to: a
// parameter's update on pg (the gradient the optimizer takes), an averaged
// buffer's new value mean, a broadcast one's rank 0's push (its slice
// holds sample 0). p, m, v: the parameters and the moments, updated.
static void s_ref_step(const s_layout *x, uint64_t t, const float *pg, const float *mean,
                       float *p, float *m, float *v)
{
    zps_optim_cfg base = {.schedule = ZPS_LR_CONSTANT};
    const float *row = s_table + 2 * (t < 2 ? t : 1);
    float next[N_PARAMS];
    size_t at = 0;
    for (int k = 0; k < 4; k++) {
        size_t len = (size_t)s_shape[k][0];
        if (s_role[k] == ZPS_ROLE_PARAM) {
            zps_optim_cfg c = zps_groups_cfg(&x->g[s_group[k]], &base);
            zps_optim_adam_to(&c, row[s_group[k]], t + 1, p + at, next + at, m + at, v + at,
                              pg + at, len);
        }
        for (size_t i = at; i < at + len; i++) {
            if (s_role[k] == ZPS_ROLE_AVERAGE) {
                next[i] = mean[i];
            } else if (s_role[k] == ZPS_ROLE_BROADCAST) {
                next[i] = s_val(0, t, i);
            }
        }
        at += len;
    }
    memcpy(p, next, sizeof next);
}

// What the shards must compute, tensor by tensor, with zps_optim_adam_to.
static void s_reference(float *p)
{
    s_layout x;
    s_layout_init(&x);
    float m[N_PARAMS] = {0}, v[N_PARAMS] = {0}, grad[N_PARAMS];
    for (size_t i = 0; i < N_PARAMS; i++) {
        p[i] = s_init(i);
    }
    for (uint64_t t = 0; t < STEPS; t++) {
        s_mean(t, grad);
        s_ref_step(&x, t, grad, grad, p, m, v);
    }
}

START_TEST(test_shard_groups_follow_each_tensor_with_the_same_bits_on_1_2_3_shards)
{
    float want[N_PARAMS], got[3][N_PARAMS];
    s_reference(want);
    for (int n = 1; n <= 3; n++) {
        s_run(n, got[n - 1]);
        for (size_t i = 0; i < N_PARAMS; i++) {
            if (memcmp(&got[n - 1][i], &want[i], sizeof(float)) != 0) {
                ck_abort_msg("%d shards: element %zu is %.9g, expected %.9g", n, i,
                             got[n - 1][i], want[i]);
            }
        }
    }
}
END_TEST

START_TEST(test_shard_groups_refuse_bad_groups_and_name_the_difference)
{
    s_layout x;
    s_layout_init(&x);
    char why[256];
    ck_assert_int_eq(zps_groups_check(&x.l, why, sizeof why), ZPS_OK);
    zps_optim_cfg flags = {.kind = ZPS_OPTIM_ADAMW, .lr = 0.01f, .weight_decay = 0.1f,
                           .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
    ck_assert(zps_groups_differ_flags(&x.l, &flags, why, sizeof why));
    ck_assert_msg(strstr(why, "group 1 declares weight_decay 0, this job's --weight-decay is "
                              "0.1: start zps-server without optimizer flags") == why,
                  "%s", why);
    x.g[1].weight_decay = 0.1f;
    ck_assert(!zps_groups_differ_flags(&x.l, &flags, why, sizeof why));
    x.g[1].kind = ZPS_OPTIM_ADAM;
    ck_assert_int_eq(zps_groups_check(&x.l, why, sizeof why), ZPS_EINVAL);
    ck_assert_msg(strstr(why, "group 1") != NULL, "%s", why);
    x.g[1].kind = ZPS_OPTIM_ADAMW;
    x.g[1].beta2 = 1.0;
    ck_assert_int_eq(zps_groups_check(&x.l, why, sizeof why), ZPS_EINVAL);
    ck_assert_msg(strstr(why, "group 1 (adamw): beta2") != NULL, "%s", why);
    x.g[1].beta2 = 0.999;
    x.t[1].group = 2;
    ck_assert_int_eq(zps_groups_check(&x.l, why, sizeof why), ZPS_EINVAL);
    ck_assert_msg(strstr(why, "'B' is in group 2") != NULL, "%s", why);
    s_layout y;
    s_layout_init(&y);
    x.t[1].group = 0;
    ck_assert(zps_groups_differ(&y.l, &x.l, why, sizeof why));
    ck_assert_msg(strstr(why, "group 1 declares weight_decay 0.1") == why, "%s", why);
    x.g[1].weight_decay = 0.0f;
    ck_assert(zps_groups_differ(&y.l, &x.l, why, sizeof why));
    ck_assert_msg(strstr(why, "tensor 1 'B'") != NULL, "%s", why);
    float bad[4] = {0.1f, NAN, 0.1f, 0.1f};
    ck_assert_int_eq(zps_groups_check_table(2, 2, bad, 4, 2, why, sizeof why), ZPS_EINVAL);
    ck_assert_int_eq(zps_groups_check_table(1, 4, s_table, 4, 2, why, sizeof why), ZPS_EINVAL);
    ck_assert_int_eq(zps_groups_check_table(2, 2, s_table, 4, 2, why, sizeof why), ZPS_OK);
}
END_TEST

// A shard restarted from its checkpoint (--resume: no INIT again) takes
// the table kept beside it and ends where an uninterrupted one ends.
START_TEST(test_shard_groups_a_restored_shard_keeps_the_table)
{
    float want[N_PARAMS], got[N_PARAMS];
    s_run(1, want);
    s_layout x;
    s_layout_init(&x);
    zps_model_spec model;
    zps_shard *s = s_new(&x, &model, 0, 1);
    s_init_all(s);
    s_steps(s, 0, 1);
    ck_assert_int_eq(zps_shard_save(s, zps_tmpdir_dir(), 2), ZPS_OK);
    zps_shard_destroy(&s);
    s = s_new(&x, &model, 0, 1);
    uint64_t loaded;
    ck_assert_int_eq(zps_shard_restore(s, zps_tmpdir_dir(), UINT64_MAX, &loaded), ZPS_OK);
    ck_assert_uint_eq(loaded, 1);
    s_steps(s, 1, STEPS);
    zps_shard_fx_params(s, 0, got);
    zps_shard_destroy(&s);
    ck_assert(memcmp(got, want, sizeof got) == 0);
}
END_TEST

// INIT of bucket b of s (zeros) with a table of one group (NULL: none).
static zps_err s_init_with(zps_shard *s, int b, const float *lr, size_t n, char *why, size_t len)
{
    const void *data;
    uint64_t off, count;
    zps_wire_ref *ref;
    zps_shard_bucket_params(s, b, &data, &off, &count, &ref);
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__INIT);
    Zps__Schedule table = ZPS__SCHEDULE__INIT;
    table.groups = 1;
    table.steps = n;
    table.lr = (float *)lr;
    table.n_lr = n;
    h.schedule = lr ? &table : NULL;
    h.offset = off;
    h.count = count;
    h.dtype = ZPS__DTYPE__F32;
    zps_wire_msg m;
    memset(zps_shard_fx_msg(&m, &h, count * sizeof(float)), 0, count * sizeof(float));
    bool complete;
    zps_err err = zps_shard_take_init(s, &m, &complete, why, len);
    zps_wire_msg_fini(&m);
    return err;
}

// The first INIT's table is the shard's; a later INIT (another bucket)
// with another table, or none, is refused and changes nothing.
START_TEST(test_shard_groups_refuse_an_init_of_another_table)
{
    static uint64_t shape[1] = {70000}; // more than a bucket: two
    Zps__Tensor t = ZPS__TENSOR__INIT;
    Zps__Tensor *tp = &t;
    t.name = "big";
    t.shape = shape;
    t.n_shape = 1;
    t.role = ZPS_ROLE_AVERAGE; // declared: the shard cuts segments
    Zps__Layout l = ZPS__LAYOUT__INIT;
    l.tensors = &tp;
    l.n_tensors = 1;
    zps_model_spec model;
    zps_layout_model(&l, &model);
    zps_shard_cfg cfg = {.shards = 1, .model = &model, .lo = 0, .hi = model.n_params,
                         .global_batch = ZPS_SHARD_FX_BATCH, .dtype = ZPS_DTYPE_F32,
                         .await_init = true, .layout = &l};
    zps_shard *s = zps_shard_new(&cfg);
    ck_assert_ptr_nonnull(s);
    ck_assert_int_eq(zps_shard_n_buckets(s), 2);
    const float one[2] = {0.1f, 0.2f}, other[2] = {0.1f, 0.3f};
    char why[256] = "";
    ck_assert_int_eq(s_init_with(s, 0, one, 2, why, sizeof why), ZPS_OK);
    ck_assert_int_eq(s_init_with(s, 1, other, 2, why, sizeof why), ZPS_EPROTO);
    ck_assert_msg(strstr(why, "not the first INIT's") != NULL, "%s", why);
    ck_assert_int_eq(s_init_with(s, 1, NULL, 0, why, sizeof why), ZPS_EPROTO);
    ck_assert(zps_shard_awaits_init(s));
    ck_assert_int_eq(s_init_with(s, 1, one, 2, why, sizeof why), ZPS_OK);
    ck_assert(!zps_shard_awaits_init(s));
    zps_shard_destroy(&s);
    s = zps_shard_new(&cfg);
    float bad[2] = {0.1f, -1.0f};
    ck_assert_int_eq(s_init_with(s, 0, bad, 2, why, sizeof why), ZPS_EPROTO);
    ck_assert_msg(strstr(why, "step 1 group 0 is -1") != NULL, "%s", why);
    zps_shard_destroy(&s);
}
END_TEST

// ---------------------------------------------------------------------------
// --clip-grad-norm with groups and buffers: the norm is the parameters'
// gradient's alone, the coefficient scales that gradient only, and the
// buffers take their values unscaled.

#define CLIP_MAX 0.1f // the max norm: below every step's norm, so coef < 1

// The layout with a larger eps: Adam's update is scale-invariant but for
// eps, and with 1e-3 a wrong coefficient shows in many bits, not in one.
static void s_clip_layout_init(s_layout *x)
{
    s_layout_init(x);
    x->g[0].eps = 1e-3;
    x->g[1].eps = 1e-3;
}

// The exact sum of squares of g's parameter elements in [lo, hi), the
// buffers' left out.
static void s_param_sumsq(const float *g, uint64_t lo, uint64_t hi, zps_sumsq *out)
{
    zps_sumsq_init(out);
    uint64_t at = 0;
    for (int k = 0; k < 4; k++) {
        uint64_t end = at + s_shape[k][0];
        uint64_t from = at > lo ? at : lo, to = end < hi ? end : hi;
        if (s_role[k] == ZPS_ROLE_PARAM && from < to) {
            zps_sumsq_add(out, g + from, (size_t)(to - from));
        }
        at = end;
    }
}

static void s_assert_sumsq_eq(const zps_sumsq *got, const zps_sumsq *want, const char *what)
{
    ck_assert_msg(memcmp(got->limb, want->limb, sizeof want->limb) == 0 &&
                      got->flags == want->flags,
                  "%s: sum of squares %.9g, expected %.9g", what, zps_sumsq_value(got),
                  zps_sumsq_value(want));
}

// The clipped reference: each step's coefficient from the parameters'
// norm, the optimizer on coef * g, the buffers as unclipped.
static void s_clip_reference(float *p)
{
    s_layout x;
    s_clip_layout_init(&x);
    float m[N_PARAMS] = {0}, v[N_PARAMS] = {0}, g[N_PARAMS], cg[N_PARAMS];
    for (size_t i = 0; i < N_PARAMS; i++) {
        p[i] = s_init(i);
    }
    for (uint64_t t = 0; t < STEPS; t++) {
        s_mean(t, g);
        zps_sumsq ss;
        s_param_sumsq(g, 0, N_PARAMS, &ss);
        float coef = zps_sumsq_clip_coef(CLIP_MAX, zps_sumsq_norm(&ss));
        ck_assert_float_lt(coef, 1.0f);
        for (size_t i = 0; i < N_PARAMS; i++) {
            cg[i] = g[i] * coef;
        }
        s_ref_step(&x, t, cg, g, p, m, v);
    }
}

// Step t on n shards: the pushes; each shard's part of the sum of squares
// (its range's parameters alone) and their merge, the whole model's; each
// shard clipped by the norm of that, its buckets applied.
static void s_clip_step(zps_shard **s, int n, uint64_t t)
{
    float g[N_PARAMS];
    s_mean(t, g);
    zps_sumsq all, want, part, mine;
    zps_sumsq_init(&all);
    for (int k = 0; k < n; k++) {
        s_push_step(s[k], t);
        ck_assert(!zps_shard_step_done(s[k])); // waits for the norm
        ck_assert(zps_shard_norm_due(s[k], &part));
        s_param_sumsq(g, zps_shard_lo(s[k]), zps_shard_hi(s[k]), &mine);
        s_assert_sumsq_eq(&part, &mine, "a shard's part");
        zps_sumsq_merge(&all, &part);
    }
    s_param_sumsq(g, 0, N_PARAMS, &want);
    s_assert_sumsq_eq(&all, &want, "the shards' parts merged");
    float norm = zps_sumsq_norm(&all);
    for (int k = 0; k < n; k++) {
        ck_assert_int_eq(zps_shard_clip(s[k], t, norm), ZPS_OK);
        for (int b; (b = zps_shard_clip_next(s[k])) >= 0;) {
            zps_shard_apply(s[k], b);
        }
        ck_assert(zps_shard_step_done(s[k]));
        zps_shard_end_step(s[k]);
    }
}

// STEPS clipped steps of the job on n shards; out: the parameters after them.
static void s_clip_run(int n, float *out)
{
    s_layout x;
    s_clip_layout_init(&x);
    zps_model_spec model[3];
    zps_shard *s[3];
    for (int k = 0; k < n; k++) {
        s[k] = s_new_clip(&x, &model[k], k, n, CLIP_MAX);
        ck_assert(zps_shard_clipping(s[k]));
        s_init_all(s[k]);
    }
    for (uint64_t t = 0; t < STEPS; t++) {
        s_clip_step(s, n, t);
    }
    for (int k = 0; k < n; k++) {
        zps_shard_fx_params(s[k], zps_shard_lo(s[k]), out + zps_shard_lo(s[k]));
        zps_shard_destroy(&s[k]);
    }
}

// The buffers after the last step, spelled out: C ([11, 14)) the unscaled
// weighted mean of the pushes, D ([14, 18)) rank 0's (offset 0) push.
static void s_assert_buffers(const float *got)
{
    float g[N_PARAMS];
    s_mean(STEPS - 1, g);
    for (size_t i = 11; i < 14; i++) {
        ck_assert_msg(memcmp(&got[i], &g[i], sizeof(float)) == 0, "C: %zu", i);
    }
    for (size_t i = 14; i < N_PARAMS; i++) {
        float want = s_val(0, STEPS - 1, i);
        ck_assert_msg(memcmp(&got[i], &want, sizeof(float)) == 0, "D: %zu", i);
    }
}

// Clipping with groups and buffers: the norm's sum of squares covers the
// parameters' averaged gradient only; each parameter element is its
// group's AdamW on coef * g, the averaged buffer the unscaled mean, the
// broadcast one the offset-0 slice's value; the same bits on 1, 2, 3 shards.
START_TEST(test_shard_groups_clip_with_groups_and_buffers)
{
    float want[N_PARAMS], got[N_PARAMS];
    s_clip_reference(want);
    for (int n = 1; n <= 3; n++) {
        s_clip_run(n, got);
        s_assert_buffers(got);
        for (size_t i = 0; i < N_PARAMS; i++) {
            if (memcmp(&got[i], &want[i], sizeof(float)) != 0) {
                ck_abort_msg("%d shards: element %zu is %.9g, expected %.9g", n, i, got[i],
                             want[i]);
            }
        }
    }
}
END_TEST

Suite *zps_suite_shard_groups(void)
{
    Suite *s = suite_create("shard_groups");
    TCase *tc = tcase_create("groups");
    tcase_add_test(tc, test_shard_groups_follow_each_tensor_with_the_same_bits_on_1_2_3_shards);
    tcase_add_test(tc, test_shard_groups_refuse_bad_groups_and_name_the_difference);
    tcase_add_test(tc, test_shard_groups_a_restored_shard_keeps_the_table);
    tcase_add_test(tc, test_shard_groups_refuse_an_init_of_another_table);
    tcase_add_test(tc, test_shard_groups_clip_with_groups_and_buffers);
    zps_tmpdir_fixture(tc);
    suite_add_tcase(s, tc);
    return s;
}
