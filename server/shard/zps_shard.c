/* zps_shard.c - accumulate pushes, average by samples, apply the optimizer,
 * per bucket. */
#include "zps_shard.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_groups.h"
#include "common/zps_log.h"
#include "common/zps_plans.h"
#include "common/zps_quant.h"
#include "common/zps_ckpt.h"
#include "server/shard/zps_cover.h"
#include "server/shard/zps_kept.h"
#include "server/shard/zps_nodes.h"
#include "server/shard/zps_pool.h"

#define ZPS_SHARD_BLOCK 2048 // elements per pass of the update: the arrays stay in L1/L2
#define ZPS_SHARD_MAX_RETIRED 8

// An array of parameters that may be sent zero-copy: ZeroMQ reads it from
// its I/O thread, and while any frame of it is in flight it must not change.
typedef struct s_snapshot {
    uint8_t *data;       // owned: (hi - lo) elements (fp32, or the wire dtype)
    zps_wire_ref ref;    // frames still held by ZeroMQ
} s_snapshot;

// A slice of the global batch seen this step, and the buckets pushed for it.
typedef struct s_slice {
    uint32_t offset, count;  // [offset, offset + count) of the global batch
    zps_bucket_set buckets;  // buckets pushed
} s_slice;

struct zps_shard {
    uint32_t index;                                 // shard number
    uint32_t shards;                                // shards in the job
    uint64_t seed;                                  // the job's seed (checkpoints name it)
    uint64_t model_hash;                            // of the model spec (checkpoints name it)
    uint64_t lo, hi;                                // the range owned
    size_t n;                                       // hi - lo
    uint32_t global_batch;                          // B
    zps_dtype dtype;                                // wire element type
    zps_optim_cfg optim;                            // settings and schedule
    uint64_t step;                                  // steps completed
    // The parameters, fp32, in two arrays by the parity of the step: arr[t & 1]
    // holds them as of step t (before its update), and the update of a
    // bucket in step t reads them there and writes arr[(t + 1) & 1], so the
    // values before and after it both stay, with no copy. With an fp32
    // wire they are also what is sent, zero-copy (no snapshot).
    s_snapshot *arr[2];                             // owned: n floats each
    float *state;                                   // owned: optimizer state, state_floats * n
    int state_floats;                               // 1: SGD's momentum; 2: exp_avg, exp_avg_sq
    uint64_t optim_steps;                           // updates applied: Adam's t is one more
    double *acc;                                    // owned: sum of n_i * g_i, n (order-free);
                                                    // a bucket's is set by its first push
    float *grad;                                    // owned: a block of the averaged gradient a thread
    zps_pool *pool;                                 // owned: --threads beyond the caller, or NULL
    s_snapshot *snap;                               // owned: 16-bit wire dtype: current parameters
                                                    // as sent (NULL for fp32: arr is sent)
    s_snapshot *retired[ZPS_SHARD_MAX_RETIRED];     // owned: old snapshots a peer still reads
    int n_buckets;                                  // buckets of the range
    zps_bucket buckets[ZPS_MODEL_MAX_BUCKETS];      // in push order (cut at fragment ends)
    uint8_t fragment[ZPS_MODEL_MAX_BUCKETS];        // diloco --fragments: each bucket's
    uint32_t covered[ZPS_MODEL_MAX_BUCKETS];        // samples pushed for each bucket this step
    zps_kept kept[ZPS_MODEL_MAX_BUCKETS];           // a bucket's first push, not in acc yet:
                                                    // its next push adds both in one pass
    uint32_t weight[ZPS_MODEL_MAX_BUCKETS];         // and their weights (samples; diloco:
                                                    // samples * inner steps), the mean's divisor
    bool updated[ZPS_MODEL_MAX_BUCKETS];            // bucket's numbers updated this step
    int n_updated;                                  // buckets updated this step
    bool applied[ZPS_MODEL_MAX_BUCKETS];            // bucket updated and zps_shard_apply'd
    int n_applied;                                  // buckets applied this step
    s_slice slices[ZPS_MAX_MEMBERS];                // slices seen this step
    int n_slices;
    int32_t *slice_at;                              // owned, B: 1 + the slice at an offset, 0: none
    zps_cover cover;                                // samples counted per bucket this step
    double loss_sum;                                // sum of weight * loss over slices this step
    uint32_t loss_weight;                           // sum of those weights
    zps_outer_mode mode;                            // diloco: pushes are pseudo-gradients
    float *decoded;                                 // owned, diloco: n floats, a compressed push
                                                    // decoded, or the zeros of a missing member
    uint32_t counted[ZPS_MAX_MEMBERS];              // samples of bucket 0 counted from each rank this step
    zps_plans plans;                                // plan generations still in use
    bool awaiting_init;                             // rank 0's initial values not all in
    zps_bucket_set init_in;                         // buckets of them taken
    float clip;                                     // --clip-grad-norm's max norm (0: off)
    float *clipg;                                   // owned, clipping: n floats, the step's
                                                    // averaged gradient once all is in
    bool complete[ZPS_MODEL_MAX_BUCKETS];           // clipping: bucket's slices all counted
    int n_complete;                                 // of them
    bool norm_due;                                  // clipping: g is in clipg, the norm is not
    zps_sumsq partial;                              // clipping: the sum of squares of clipg
                                                    // (of the complete buckets, so far)
    bool clip_taken;                                // clipping: the step's norm is in, its
    float clip_coef;                                // coefficient; the buckets not updated
    int next_clip;                                  // yet are this one's and after
    zps_groups groups;                              // owned: the range's groups and buffers
    float *lrs;                                     // owned: each group's rate of the step
    float *bcast;                                   // owned, a broadcast buffer in the range:
                                                    // n floats, the sample-0 slice's pushes
    bool init_any;                                  // an INIT was taken (its table is the one)
    float *table;                                   // owned: declared rates, [step][group], or NULL
    uint32_t table_groups;                          // its columns
    uint64_t table_steps;                           // its rows
    // --deterministic: pushes are tree nodes, summed in the tree's order.
    uint32_t micro;                                 // M (0: off)
    uint32_t leaves;                                // B / M
    zps_nodes *nodes;                               // owned: the step's nodes per bucket
};

// FNV-1a: a checkpoint names the model it belongs to.
static uint64_t s_hash(const char *text)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        h = (h ^ *p) * 0x100000001b3ull;
    }
    return h;
}

static void *s_alloc(size_t bytes)
{
    void *p = NULL;
    return posix_memalign(&p, 64, bytes ? bytes : 1) == 0 ? p : NULL;
}

static s_snapshot *s_snapshot_new(size_t bytes)
{
    s_snapshot *sn = calloc(1, sizeof *sn);
    if (sn && !(sn->data = s_alloc(bytes))) {
        free(sn);
        sn = NULL;
    }
    return sn;
}

static void s_snapshot_free(s_snapshot **sp)
{
    if (*sp) {
        free((*sp)->data);
        free(*sp);
        *sp = NULL;
    }
}

// The parameters as of the step in progress (before its update), and
// where its update writes them.
static float *s_cur(const zps_shard *s)
{
    return (float *)(void *)s->arr[s->step & 1]->data;
}

static float *s_next(const zps_shard *s)
{
    return (float *)(void *)s->arr[(s->step + 1) & 1]->data;
}

static void s_prepare(zps_shard *s, s_snapshot **sp, size_t bytes);

// Both arrays (and the snapshot) become values, between steps: those of a
// checkpoint, or (values NULL) those of the step's own array, a new
// shard's or rank 0's. Every buffer is made writable first: one a peer
// still reads is replaced by a copy, which the source is taken from.
static void s_set_all(zps_shard *s, const float *values)
{
    size_t bytes = s->n * sizeof(float);
    s_prepare(s, &s->arr[0], bytes);
    s_prepare(s, &s->arr[1], bytes);
    if (s->snap) {
        s_prepare(s, &s->snap, s->n * zps_dtype_size(s->dtype));
    }
    const float *src = values ? values : s_cur(s);
    for (int k = 0; k < 2; k++) {
        if ((const void *)s->arr[k]->data != (const void *)src) {
            memcpy(s->arr[k]->data, src, bytes);
        }
    }
    if (s->snap) {
        zps_dtype_from_f32(s->dtype, src, s->snap->data, s->n);
    }
}

// The range's groups and buffers, from a declared layout (diloco's outer
// step is one for all), and what their updates need.
static zps_err s_groups_new(zps_shard *s, const zps_shard_cfg *cfg)
{
    if (cfg->mode.diloco || !cfg->layout) {
        return ZPS_OK;
    }
    if (zps_groups_build(&s->groups, cfg->layout, &cfg->optim, s->lo, s->hi) != ZPS_OK) {
        return ZPS_ENOMEM;
    }
    if (s->groups.n > 0 && !(s->lrs = calloc((size_t)s->groups.n, sizeof *s->lrs))) {
        return ZPS_ENOMEM;
    }
    if (s->groups.broadcast && !(s->bcast = s_alloc(s->n * sizeof(float)))) {
        return ZPS_ENOMEM;
    }
    return ZPS_OK;
}

// What clipping and a deterministic job add (s->buckets set): the kept
// gradient, the micro-batch and the tree's nodes held per bucket. ZPS_EINVAL
// for a deterministic job that is not one; every failure logged.
static zps_err s_micro_new(zps_shard *s, const zps_shard_cfg *cfg)
{
    s->micro = cfg->mode.diloco || !cfg->global_batch ? 0 : cfg->micro_batch;
    if ((s->clip > 0 || s->micro) && !(s->clipg = s_alloc(s->n * sizeof(float)))) {
        zps_log_error("shard %u: cannot allocate the kept gradient of %llu parameters",
                      cfg->index, (unsigned long long)s->n);
        return ZPS_ENOMEM;
    }
    if (!s->micro) {
        return ZPS_OK;
    }
    if (cfg->global_batch % s->micro != 0 || s->dtype != ZPS_DTYPE_F32) {
        zps_log_error("shard %u: a global batch of %u in whole fp32 micro-batches of %u: "
                      "not this job", cfg->index, cfg->global_batch, s->micro);
        return ZPS_EINVAL;
    }
    s->leaves = cfg->global_batch / s->micro;
    size_t len[ZPS_MODEL_MAX_BUCKETS];
    for (int b = 0; b < s->n_buckets; b++) {
        len[b] = s->buckets[b].hi - s->buckets[b].lo;
    }
    s->nodes = zps_nodes_new(s->leaves, s->n_buckets, len);
    return s->nodes ? ZPS_OK : ZPS_ENOMEM;
}

// The step's slices: indexed by offset, their samples by bucket.
// The range's buckets: the model's, cut where a diloco fragment ends.
static zps_err s_buckets_new(zps_shard *s, const zps_shard_cfg *cfg)
{
    zps_bucket whole[ZPS_MODEL_MAX_BUCKETS];
    int n = zps_model_range_buckets(cfg->model, s->lo, s->hi, whole);
    s->n_buckets = zps_outer_cut_buckets(&s->mode, s->lo, s->hi, whole, n, s->buckets,
                                         ZPS_MODEL_MAX_BUCKETS);
    if (s->n_buckets < 0) {
        zps_log_error("shard %u: %d buckets cut into %u fragments make more than %d",
                      s->index, n, zps_outer_fragments(&s->mode), ZPS_MODEL_MAX_BUCKETS);
        s->n_buckets = 0;
        return ZPS_EINVAL;
    }
    for (int b = 0; b < s->n_buckets; b++) {
        s->fragment[b] = (uint8_t)zps_outer_fragment_at(&s->mode, s->lo, s->hi, s->buckets[b].lo);
    }
    return ZPS_OK;
}

static zps_err s_slices_new(zps_shard *s)
{
    s->slice_at = calloc(s->global_batch ? s->global_batch : 1, sizeof *s->slice_at);
    if (!s->slice_at || zps_cover_init(&s->cover, s->global_batch, s->n_buckets) != ZPS_OK) {
        return ZPS_ENOMEM;
    }
    return ZPS_OK;
}

zps_shard *zps_shard_new(const zps_shard_cfg *cfg)
{
    zps_shard *s = calloc(1, sizeof *s);
    if (!s) {
        goto fail;
    }
    s->index = cfg->index;
    s->shards = cfg->shards ? cfg->shards : 1;
    s->seed = cfg->seed;
    s->model_hash = s_hash(cfg->model->text);
    s->lo = cfg->lo;
    s->hi = cfg->hi;
    s->n = cfg->hi - cfg->lo;
    s->dtype = cfg->dtype;
    s->optim = cfg->optim;
    s->global_batch = cfg->global_batch;
    s->awaiting_init = cfg->await_init;
    s->mode = cfg->mode;
    s->clip = cfg->mode.diloco ? 0.0f : cfg->clip_grad_norm;
    s->clip_coef = 1.0f; // a deterministic update without clipping: g times 1, g's bits
    if (s_buckets_new(s, cfg) != ZPS_OK || s_micro_new(s, cfg) != ZPS_OK) {
        goto refused; // said why
    }
    s->arr[0] = s_snapshot_new(s->n * sizeof(float));
    s->arr[1] = s_snapshot_new(s->n * sizeof(float));
    // The second moment only for Adam and AdamW: SGD's shard stays as large as before.
    s->state_floats = zps_optim_state_floats(cfg->optim.kind);
    s->state = s_alloc((size_t)s->state_floats * s->n * sizeof(float));
    s->acc = s_alloc(s->n * sizeof(double));
    if (s->mode.diloco && !(s->decoded = s_alloc(s->n * sizeof(float)))) {
        goto fail;
    }
    int threads = cfg->threads > 1 ? cfg->threads : 1;
    s->grad = s_alloc((size_t)threads * ZPS_SHARD_BLOCK * sizeof(float));
    if (threads > 1 && !(s->pool = zps_pool_new(threads))) {
        goto fail;
    }
    if (s->dtype != ZPS_DTYPE_F32) {
        s->snap = s_snapshot_new(s->n * zps_dtype_size(s->dtype));
    }
    if (s_groups_new(s, cfg) != ZPS_OK) {
        goto fail;
    }
    if (!s->arr[0] || !s->arr[1] || !s->state || !s->acc || !s->grad ||
        (s->dtype != ZPS_DTYPE_F32 && !s->snap) || s_slices_new(s) != ZPS_OK) {
        goto fail;
    }
    // Both arrays alike at first, as after a restore: the step before the
    // first reads the same values.
    zps_model_init_range(cfg->model, cfg->seed, s->lo, s->hi, s_cur(s));
    s_set_all(s, NULL);
    memset(s->state, 0, (size_t)s->state_floats * s->n * sizeof(float));
    memset(s->acc, 0, s->n * sizeof(double));
    return s;
fail:
    zps_log_error("shard %u: cannot allocate %llu parameters", cfg->index,
                  (unsigned long long)(cfg->hi - cfg->lo));
refused:
    zps_shard_destroy(&s);
    return NULL;
}

// Every kept push dropped unread: the step it was for is over or gone.
static void s_drop_kept(zps_shard *s)
{
    for (int b = 0; b < ZPS_MODEL_MAX_BUCKETS; b++) {
        zps_kept_drop(&s->kept[b]);
    }
}

void zps_shard_destroy(zps_shard **sp)
{
    zps_shard *s = *sp;
    if (!s) {
        return;
    }
    // The owner closes its sockets first, so ZeroMQ has released every frame.
    s_drop_kept(s);
    s_snapshot_free(&s->snap);
    zps_plans_fini(&s->plans);
    free(s->slice_at);
    zps_cover_fini(&s->cover);
    for (int i = 0; i < ZPS_SHARD_MAX_RETIRED; i++) {
        s_snapshot_free(&s->retired[i]);
    }
    s_snapshot_free(&s->arr[0]);
    s_snapshot_free(&s->arr[1]);
    free(s->state);
    free(s->acc);
    free(s->decoded);
    free(s->clipg);
    zps_nodes_destroy(&s->nodes);
    free(s->grad);
    zps_groups_fini(&s->groups);
    free(s->lrs);
    free(s->bcast);
    free(s->table);
    zps_pool_destroy(&s->pool);
    free(s);
    *sp = NULL;
}

uint64_t zps_shard_lo(const zps_shard *s)
{
    return s->lo;
}

uint64_t zps_shard_hi(const zps_shard *s)
{
    return s->hi;
}

uint64_t zps_shard_step(const zps_shard *s)
{
    return s->step;
}

int zps_shard_n_buckets(const zps_shard *s)
{
    return s->n_buckets;
}

void zps_shard_add_plan(zps_shard *s, uint32_t gen, uint64_t effective_step,
                        const zps_plan *plan)
{
    (void)zps_plans_add(&s->plans, gen, effective_step, plan); // an older one is ignored
}

uint32_t zps_shard_generation(const zps_shard *s)
{
    return zps_plans_newest_gen(&s->plans);
}

const zps_plan *zps_shard_plan(const zps_shard *s)
{
    const zps_plan_gen *g = zps_plans_at(&s->plans, s->step);
    return g ? &g->plan : NULL;
}

// The member id must go with the rank it claims: replies are routed by
// rank, and a member must not take another's.
static bool s_member_has_rank(const zps_shard *s, uint64_t member_id, uint32_t rank)
{
    return zps_plans_names(&s->plans, member_id, rank);
}

bool zps_shard_member_has_rank(const zps_shard *s, uint32_t rank, uint64_t member_id)
{
    return member_id != 0 && s_member_has_rank(s, member_id, rank);
}

// A member of any generation the shard knows may push: a slice of a step
// in progress can be handed to a member that joined after it began.
bool zps_shard_is_member(const zps_shard *s, uint64_t member_id, uint32_t rank)
{
    return zps_plans_names(&s->plans, member_id, rank);
}

static int s_bucket_at(const zps_shard *s, uint64_t lo, uint64_t hi)
{
    for (int b = 0; b < s->n_buckets; b++) {
        if (s->buckets[b].lo == lo && s->buckets[b].hi == hi) {
            return b;
        }
    }
    return -1;
}

bool zps_shard_bucket_idle(const zps_shard *s, int b)
{
    return s->fragment[b] != zps_outer_fragment_of_step(&s->mode, s->step);
}

int zps_shard_n_step_buckets(const zps_shard *s)
{
    int n = 0;
    for (int b = 0; b < s->n_buckets; b++) {
        n += !zps_shard_bucket_idle(s, b);
    }
    return n;
}

// The step's first bucket, whose counted slices tile the batch once: the
// loss and the samples of each rank are counted from it.
static int s_lead_bucket(const zps_shard *s)
{
    int b = 0;
    while (b < s->n_buckets - 1 && zps_shard_bucket_idle(s, b)) {
        b++;
    }
    return b;
}

// The entry of slice [offset, +count), added if new. Each bucket tiles the
// batch on its own: entries may overlap (a late slice and the pieces of it
// handed to others), but for bucket b only disjoint ones count. NULL with
// *partly set if [offset, +count) overlaps, without equalling, a slice
// already counted for b; NULL alone if the table is full.
// (The push was checked to lie in the batch.) The slice counted for b
// are disjoint, so one that has b is the only one of [offset, +count)
// that does: the cover's bits answer for the others without a scan.
static s_slice *s_slice_for(zps_shard *s, uint32_t offset, uint32_t count, int b, bool *partly)
{
    int32_t at = s->slice_at[offset];
    s_slice *same = at > 0 && s->slices[at - 1].count == count ? &s->slices[at - 1] : NULL;
    *partly = false;
    if (same && zps_bucket_set_has(&same->buckets, b)) {
        return same;
    }
    if (zps_cover_any(&s->cover, b, offset, offset + count)) {
        *partly = true;
        return NULL;
    }
    // Slices of [0, B) cannot outnumber the slots unless B is huge; a full
    // table means a peer is splitting the batch absurdly finely. A second
    // slice at one offset (another length) is kept, not indexed.
    if (same || s->n_slices == ZPS_MAX_MEMBERS) {
        return same;
    }
    s_slice *sl = &s->slices[s->n_slices++];
    *sl = (s_slice){.offset = offset, .count = count};
    if (at == 0) {
        s->slice_at[offset] = s->n_slices;
    }
    return sl;
}

// One push being added to the accumulator, for the threads.
typedef struct s_push_job {
    zps_shard *s;
    const zmq_msg_t *frames; // borrowed: the push's
    int n_frames;
    size_t at;               // its first element in the range
    float samples;
    bool first;           // the bucket's first push this step: acc is set, not added to
    const zps_kept *kept; // or the first is this kept one: acc is set to both
} s_push_job;

// acc[lo, hi) of the push's range += samples * its elements [lo, hi)
// (or = 0.0 + samples * them, for the first; or the kept push's and then
// these), which lie in one or more of its frames.
static void s_accumulate_range(void *arg, size_t lo, size_t hi, int thread)
{
    (void)thread;
    const s_push_job *j = arg;
    double *acc = j->s->acc + j->at;
    size_t esize = zps_dtype_size(j->s->dtype);
    zps_wire_cursor push, kept;
    zps_wire_cursor_init(&push, j->frames, j->n_frames, esize);
    if (j->kept) {
        zps_wire_cursor_init(&kept, j->kept->frames, j->kept->n_frames, esize);
    }
    for (size_t i = lo, n; i < hi; i += n) {
        n = hi - i; // cut where either push's frame ends
        const uint8_t *first = j->kept ? zps_wire_cursor_at(&kept, i, &n) : NULL;
        const uint8_t *src = zps_wire_cursor_at(&push, i, &n);
        if (j->kept) {
            zps_dtype_axpy2_set(j->s->dtype, j->kept->weight, first, j->samples, src, acc + i, n);
        } else if (j->first) {
            zps_dtype_axpy_set(j->s->dtype, j->samples, src, acc + i, n);
        } else {
            zps_dtype_axpy(j->s->dtype, j->samples, src, acc + i, n);
        }
    }
}

static void s_accumulate(zps_shard *s, const zps_wire_msg *m, float samples, bool first,
                         const zps_kept *kept)
{
    s_push_job j = {.s = s, .frames = m->frames, .n_frames = m->n_frames,
                    .at = m->hdr->offset - s->lo, .samples = samples, .first = first,
                    .kept = kept};
    zps_pool_for(s->pool, m->payload_bytes / zps_dtype_size(s->dtype), 1, s_accumulate_range,
                 &j);
}

// Bucket b's kept push into the accumulator, as the first it is, and
// dropped: its frames are no longer read.
static void s_settle(zps_shard *s, int b)
{
    zps_kept *k = &s->kept[b];
    if (!zps_kept_has(k)) {
        return;
    }
    s_push_job j = {.s = s, .frames = k->frames, .n_frames = k->n_frames,
                    .at = s->buckets[b].lo - s->lo, .samples = k->weight, .first = true};
    zps_pool_for(s->pool, s->buckets[b].hi - s->buckets[b].lo, 1, s_accumulate_range, &j);
    zps_kept_drop(k);
}

void zps_shard_settle(zps_shard *s)
{
    for (int b = 0; b < s->n_buckets; b++) {
        s_settle(s, b);
    }
}

static void s_update(zps_shard *s, int bucket, const zps_wire_msg *m, float weight, bool alone,
                     const zps_kept *kept);
static void s_complete(zps_shard *s, int b);
static void s_update_from_mean(zps_shard *s, int b);

// A push of the slice holding sample 0 (batch offset 0): its values are
// the broadcast buffers' new ones (DDP's rank 0), kept until the update.
static void s_keep_broadcast(zps_shard *s, const zps_wire_msg *m)
{
    float *dst = s->bcast + (m->hdr->offset - s->lo);
    size_t esize = zps_dtype_size(s->dtype);
    for (int f = 0; f < m->n_frames; f++) {
        zmq_msg_t *frame = (zmq_msg_t *)&m->frames[f];
        size_t len = zmq_msg_size(frame) / esize;
        zps_dtype_to_f32(s->dtype, zmq_msg_data(frame), dst, len);
        dst += len;
    }
}

// The loss and the samples of a counted push of bucket b, from its rank.
static void s_count_loss(zps_shard *s, const Zps__Header *h, int b, uint32_t weight)
{
    if (b == s_lead_bucket(s)) {
        // The counted slices of one bucket tile the batch: each sample's
        // loss once, whatever pieces the batch came in.
        s->loss_sum += (double)weight * h->loss;
        s->loss_weight += weight;
        if (h->n_host_pieces == 0) {
            s->counted[h->rank] += h->samples; // the rank was checked against the plan
        }
        // A host leader's push: each piece is its member's (s_check_pieces
        // checked their ranks against the plan), as if it had pushed it.
        for (size_t i = 0; i < h->n_host_pieces; i++) {
            s->counted[h->host_pieces[i]->rank] += h->host_pieces[i]->samples;
        }
    }
}

// Counts a checked push of bucket b, whose values are m's frames, with its
// weight: added to the accumulator, or, when it is the one that completes
// the bucket, averaged with it and the bucket updated in the same pass
// (the slices of a bucket are disjoint parts of the batch, so the covered
// samples reach B exactly with its last push). With clipping the last push
// is only added too: the update waits for the norm (s_complete).
// A bucket's first push that does not complete it is kept, unread, when
// keep allows (its frames stay as they are until the shard drops them):
// the next push reads both in one pass, and the accumulator is never
// written for the first alone.
static void s_count(zps_shard *s, const zps_wire_msg *m, int b, uint32_t weight, bool keep)
{
    const Zps__Header *h = m->hdr;
    bool first = s->covered[b] == 0;
    if (s->bcast && h->batch_offset == 0) {
        s_keep_broadcast(s, m);
    }
    s->covered[b] += h->samples;
    s->weight[b] += weight;
    bool last = s->covered[b] == s->global_batch;
    const zps_kept *kept = zps_kept_has(&s->kept[b]) ? &s->kept[b] : NULL;
    if (first && !last && keep && zps_kept_take(&s->kept[b], m, (float)weight)) {
        // Counted, not read yet.
    } else if (last && !s->clip) {
        s_update(s, b, m, (float)weight, first, kept);
    } else {
        s_accumulate(s, m, (float)weight, first, kept);
    }
    if (kept) {
        zps_kept_drop(&s->kept[b]);
    }
    if (last && s->clip) {
        s_complete(s, b);
    }
    s_count_loss(s, h, b, weight);
}

// A push's frames (fp32) into dst, copied or added: a tree node's values.
typedef struct s_fill_job {
    const zps_wire_msg *m;
} s_fill_job;

static void s_fill(void *arg, float *dst, bool add)
{
    const s_fill_job *j = arg;
    for (int f = 0; f < j->m->n_frames; f++) {
        zmq_msg_t *frame = (zmq_msg_t *)&j->m->frames[f];
        size_t len = zmq_msg_size(frame) / sizeof(float);
        const uint8_t *src = zmq_msg_data(frame);
        for (size_t i = 0; i < len; i++) {
            float v;
            memcpy(&v, src + i * sizeof v, sizeof v); // a frame need not be aligned
            dst[i] = add ? dst[i] + v : v;
        }
        dst += len;
    }
}

// Counts a checked push of bucket b in a deterministic job: node x of the
// tree, added up the tree; the push whose node completes the root makes
// the bucket's mean and, without clipping, updates it.
static zps_err s_count_node(zps_shard *s, const zps_wire_msg *m, int b, zps_tree_node x)
{
    s_fill_job j = {.m = m};
    if (zps_nodes_add(s->nodes, b, x, s_fill, &j) != ZPS_OK) {
        return ZPS_ENOMEM;
    }
    s->covered[b] += m->hdr->samples;
    s->weight[b] += m->hdr->samples;
    if (s->covered[b] == s->global_batch) {
        // Disjoint nodes that tile the batch add up to the root.
        ZPS_ASSERT(zps_nodes_root(s->nodes, b) != NULL);
        s_complete(s, b);
        if (!s->clip) {
            s_update_from_mean(s, b);
        }
    }
    s_count_loss(s, m->hdr, b, m->hdr->samples);
    return ZPS_OK;
}

// --mode diloco: whether the push is a pseudo-gradient this job takes (its
// compression, and inner steps up to the round's H), as a tensor of the
// range; a synchronous job's carries neither field.
static zps_err s_check_values(const zps_shard *s, const zps_wire_msg *m, char *why, size_t len)
{
    const Zps__Header *h = m->hdr;
    if (!s->mode.diloco && (h->inner_steps || h->compress)) {
        snprintf(why, len, "inner steps or compression in a push of a synchronous job");
        return ZPS_EPROTO;
    }
    if (h->compress != (uint32_t)s->mode.compress || h->inner_steps > s->mode.inner_steps) {
        snprintf(why, len, "push of %u inner steps compressed as %s; the job's are at most %u, %s",
                 h->inner_steps, h->compress ? zps_quant_name(h->compress) : "none",
                 s->mode.inner_steps,
                 s->mode.compress ? zps_quant_name(s->mode.compress) : "none");
        return ZPS_EPROTO;
    }
    if (!h->compress) {
        return zps_wire_check_tensor(m, (int)s->dtype, s->lo, s->hi, why, len);
    }
    // The tensor's fields as for fp32; its payload the encoding, one frame.
    size_t size = 0;
    if (h->dtype != ZPS__DTYPE__F32 || h->count == 0 || h->offset < s->lo ||
        h->offset >= s->hi || h->count > s->hi - h->offset) {
        snprintf(why, len, "compressed tensor [%llu, +%llu) of dtype %d outside [%llu, %llu)",
                 (unsigned long long)h->offset, (unsigned long long)h->count, (int)h->dtype,
                 (unsigned long long)s->lo, (unsigned long long)s->hi);
        return ZPS_ERANGE;
    }
    (void)zps_quant_size(h->compress, h->count, ZPS_QUANT_BLOCK, &size);
    if (m->n_frames != 1 || m->payload_bytes != size) {
        snprintf(why, len, "compressed payload of %zu bytes in %d frames; %llu elements take "
                 "%zu in one", m->payload_bytes, m->n_frames, (unsigned long long)h->count,
                 size);
        return ZPS_EPROTO;
    }
    return ZPS_OK;
}

// A diloco push's values as fp32 into s->decoded: the decoding of a
// compressed one, or zeros for a member missing from the round (inner
// steps 0: what it sent counts for nothing). ZPS_EPROTO for an encoding
// that is not one. Before anything is counted; the next push overwrites it.
static zps_err s_outer_decode(zps_shard *s, const zps_wire_msg *m, char *why, size_t len)
{
    const Zps__Header *h = m->hdr;
    float *x = s->decoded + (h->offset - s->lo);
    if (h->inner_steps == 0) {
        memset(x, 0, h->count * sizeof(float));
        return ZPS_OK;
    }
    const uint8_t *buf = zmq_msg_data((zmq_msg_t *)&m->frames[0]);
    if (zps_quant_decode(h->compress, ZPS_QUANT_BLOCK, buf, m->payload_bytes, x, h->count) !=
        ZPS_OK) {
        snprintf(why, len, "the %s encoding of [%llu, +%llu) does not decode",
                 zps_quant_name(h->compress), (unsigned long long)h->offset,
                 (unsigned long long)h->count);
        return ZPS_EPROTO;
    }
    return ZPS_OK;
}

// Whether a push's values are s->decoded's rather than its frames.
static bool s_decodes(const zps_shard *s, const Zps__Header *h)
{
    return s->mode.diloco && (h->compress || h->inner_steps == 0);
}

// s_count of m with the values s_outer_decode wrote, as one fp32 frame.
static void s_count_decoded(zps_shard *s, const zps_wire_msg *m, int b, uint32_t weight)
{
    zps_wire_msg view = {.hdr = m->hdr, .n_frames = 1};
    view.payload_bytes = m->hdr->count * sizeof(float);
    zmq_msg_init_data(&view.frames[0], s->decoded + (m->hdr->offset - s->lo),
                      view.payload_bytes, NULL, NULL);
    s_count(s, &view, b, weight, false); // the next push overwrites s->decoded
    zmq_msg_close(&view.frames[0]);
}

// Whether the push belongs to this step and plan; the reason otherwise.
static zps_err s_check_sender(const zps_shard *s, const Zps__Header *h, char *why, size_t len)
{
    if (h->generation > zps_shard_generation(s)) {
        snprintf(why, len, "plan generation %u is newer than this shard's %u", h->generation,
                 zps_shard_generation(s));
        return ZPS_EAGAIN;
    }
    if (h->step < s->step && zps_shard_is_member(s, h->member_id, h->rank)) {
        // A member's late copy of a slice handed over: the step is complete,
        // so every sample of it was counted already.
        snprintf(why, len, "push for step %llu, which is complete", (unsigned long long)h->step);
        return ZPS_EDUP;
    }
    const zps_plan_gen *g = zps_plans_at(&s->plans, h->step);
    if (g && h->generation < g->gen && zps_shard_is_member(s, h->member_id, h->rank)) {
        // Computed under a plan that a newer one replaced (after a rollback):
        // its step will be computed again under the new plan.
        snprintf(why, len, "push of plan %u, superseded by plan %u at step %llu",
                 h->generation, g->gen, (unsigned long long)h->step);
        return ZPS_EDUP;
    }
    if (h->step > s->step && zps_shard_is_member(s, h->member_id, h->rank)) {
        // A member ahead of this shard: the shard restarted from a
        // checkpoint, and the rollback on its way replays that step.
        snprintf(why, len, "push for step %llu, ahead of this shard (step %llu): a rollback "
                 "is coming", (unsigned long long)h->step, (unsigned long long)s->step);
        return ZPS_EDUP;
    }
    if (h->step != s->step) {
        snprintf(why, len, "push for step %llu, shard is at step %llu",
                 (unsigned long long)h->step, (unsigned long long)s->step);
        return ZPS_ESTALE;
    }
    if (!g || g->gen != h->generation) {
        snprintf(why, len, "plan generation %u is not the one in force at step %llu (%u)",
                 h->generation, (unsigned long long)h->step, g ? g->gen : 0);
        return ZPS_ESTALE;
    }
    if (!s_member_has_rank(s, h->member_id, h->rank)) {
        snprintf(why, len, "rank %u with member id %llx is not a member", h->rank,
                 (unsigned long long)h->member_id);
        return ZPS_ENOENT;
    }
    return ZPS_OK;
}

// A deterministic job's push: one node of the tree, its samples whole
// micro-batches; *node is it.
static zps_err s_check_node(const zps_shard *s, const Zps__Header *h, zps_tree_node *node,
                            char *why, size_t len)
{
    uint32_t m = s->micro;
    if (h->dtype != ZPS__DTYPE__F32 || h->batch_offset % m || h->samples % m ||
        !zps_tree_node_of(s->leaves, h->batch_offset / m, (h->batch_offset + h->samples) / m,
                          node)) {
        snprintf(why, len, "slice [%u, +%u) is not a node of the tree of %u fp32 micro-batches "
                 "of %u", h->batch_offset, h->samples, s->leaves, m);
        return ZPS_EPROTO;
    }
    return ZPS_OK;
}

// What the push covers: samples inside the global batch (a node of the
// tree in a deterministic job, *node) and one of the shard's buckets (*b).
static zps_err s_check_where(const zps_shard *s, const Zps__Header *h, int *b,
                             zps_tree_node *node, char *why, size_t len)
{
    if (h->samples == 0 || h->batch_offset >= s->global_batch ||
        h->samples > s->global_batch - h->batch_offset) {
        snprintf(why, len, "slice [%u, +%u) is not inside the global batch of %u",
                 h->batch_offset, h->samples, s->global_batch);
        return ZPS_EPROTO;
    }
    *b = s_bucket_at(s, h->offset, h->offset + h->count);
    if (*b < 0) {
        snprintf(why, len, "[%llu, +%llu) is not one of the shard's buckets",
                 (unsigned long long)h->offset, (unsigned long long)h->count);
        return ZPS_EPROTO;
    }
    if (zps_shard_bucket_idle(s, *b)) {
        snprintf(why, len, "[%llu, +%llu) is fragment %u, not exchanged at step %llu "
                 "(fragment %u)", (unsigned long long)h->offset, (unsigned long long)h->count,
                 s->fragment[*b], (unsigned long long)s->step,
                 zps_outer_fragment_of_step(&s->mode, s->step));
        return ZPS_EPROTO;
    }
    return s->micro ? s_check_node(s, h, node, why, len) : ZPS_OK;
}

// A host leader's push (Header.host_pieces): at most ZPS_HOST_GROUP_MAX
// pieces, in batch order, each of samples > 0, tiling the push's slice
// exactly, each of a rank in the plan in force. Checked before anything
// counts: the pieces say whom the samples are credited to.
static zps_err s_check_pieces(const zps_shard *s, const Zps__Header *h, char *why, size_t len)
{
    size_t n = h->n_host_pieces;
    if (n > 0 && s->mode.diloco) {
        // A round's pseudo-gradient is weighted by its inner steps, which
        // a piece does not carry: diloco pushes are each member's own.
        snprintf(why, len, "host pieces in a push of a diloco job");
        return ZPS_EPROTO;
    }
    if (n > ZPS_HOST_GROUP_MAX) {
        snprintf(why, len, "%zu host pieces in one push; at most %d", n, ZPS_HOST_GROUP_MAX);
        return ZPS_EPROTO;
    }
    const zps_plan *plan = zps_shard_plan(s);
    uint64_t at = h->batch_offset;
    for (size_t i = 0; i < n; i++) {
        const Zps__HostPiece *p = h->host_pieces[i];
        if (p->samples == 0 || p->batch_offset != at) {
            snprintf(why, len, "host piece %zu [%u, +%u) does not follow at %llu: the pieces "
                     "must tile [%u, +%u) in order", i, p->batch_offset, p->samples,
                     (unsigned long long)at, h->batch_offset, h->samples);
            return ZPS_EPROTO;
        }
        if (!plan || !zps_plan_find(plan, p->rank)) {
            snprintf(why, len, "host piece %zu names rank %u, not in the plan of step %llu", i,
                     p->rank, (unsigned long long)h->step);
            return ZPS_EPROTO;
        }
        at += p->samples;
    }
    if (n > 0 && at != (uint64_t)h->batch_offset + h->samples) {
        snprintf(why, len, "host pieces end at %llu; the push's slice [%u, +%u) ends at %llu",
                 (unsigned long long)at, h->batch_offset, h->samples,
                 (unsigned long long)h->batch_offset + h->samples);
        return ZPS_EPROTO;
    }
    return ZPS_OK;
}

// Counts an accepted push into bucket b: a node of the tree, a decoded
// pseudo-gradient or raw frames.
static zps_err s_count_push(zps_shard *s, const zps_wire_msg *m, int b, zps_tree_node node)
{
    const Zps__Header *h = m->hdr;
    // The weight of a member's pseudo-gradient is its samples of every
    // inner step (B * H < 2^24, checked at setup: exact in a float).
    uint32_t weight = s->mode.diloco ? h->samples * h->inner_steps : h->samples;
    if (s->micro) {
        return s_count_node(s, m, b, node);
    }
    if (s_decodes(s, h)) {
        s_count_decoded(s, m, b, weight);
    } else {
        s_count(s, m, b, weight, true);
    }
    return ZPS_OK;
}

zps_err zps_shard_push(zps_shard *s, const zps_wire_msg *m, int *ready, char *why,
                       size_t why_len)
{
    const Zps__Header *h = m->hdr;
    *ready = -1;
    if (s->awaiting_init) {
        // No honest worker pushes before it pulled them.
        snprintf(why, why_len, "the initial values from rank 0 are not all in yet");
        return ZPS_ESTATE;
    }
    // Cheapest and most basic first: the shape of the message, then whether
    // it belongs to this step and plan, then what it covers.
    zps_err err = s_check_values(s, m, why, why_len);
    if (err != ZPS_OK || (err = s_check_sender(s, h, why, why_len)) != ZPS_OK) {
        return err;
    }
    int b;
    zps_tree_node node = {0};
    if ((err = s_check_where(s, h, &b, &node, why, why_len)) != ZPS_OK ||
        (err = s_check_pieces(s, h, why, why_len)) != ZPS_OK) {
        return err;
    }
    if (s_decodes(s, h) && (err = s_outer_decode(s, m, why, why_len)) != ZPS_OK) {
        return err;
    }
    bool partly;
    s_slice *sl = s_slice_for(s, h->batch_offset, h->samples, b, &partly);
    if (partly) {
        // Speculation hands out pieces of a late slice: whichever copy
        // covers a sample first counts it, and this one came second.
        snprintf(why, why_len, "slice [%u, +%u) of step %llu is partly counted already for "
                 "bucket %d", h->batch_offset, h->samples, (unsigned long long)s->step, b);
        return ZPS_EDUP;
    }
    if (!sl) {
        snprintf(why, why_len, "slice [%u, +%u) of step %llu: too many slices in one step",
                 h->batch_offset, h->samples, (unsigned long long)s->step);
        return ZPS_EPROTO;
    }
    if (zps_bucket_set_has(&sl->buckets, b)) {
        snprintf(why, why_len, "slice [%u, +%u) of step %llu already counted for bucket %d",
                 h->batch_offset, h->samples, (unsigned long long)s->step, b);
        return ZPS_EDUP;
    }
    if ((err = s_count_push(s, m, b, node)) != ZPS_OK) {
        snprintf(why, why_len, "no memory for a tree node of bucket %d", b);
        return err;
    }
    zps_bucket_set_add(&sl->buckets, b);
    zps_cover_add(&s->cover, b, sl->offset, sl->offset + sl->count);
    *ready = s->updated[b] ? b : -1;
    return ZPS_OK;
}

bool zps_shard_slice_done(const zps_shard *s, uint32_t offset, uint32_t count)
{
    for (int b = 0; b < s->n_buckets; b++) {
        if (!zps_shard_bucket_idle(s, b) &&
            zps_cover_count(&s->cover, b, offset, offset + count) < count) {
            return false;
        }
    }
    return true;
}

int zps_shard_uncounted(const zps_shard *s, const Zps__Header *h, zps_shard_run *out, int max)
{
    int b = s_bucket_at(s, h->offset, h->offset + h->count);
    const zps_plan_gen *g = zps_plans_at(&s->plans, h->step);
    if (h->n_host_pieces == 0 || h->step != s->step || !g ||
        g->gen != h->generation || b < 0 ||
        zps_shard_bucket_idle(s, b) || h->samples == 0 || h->batch_offset >= s->global_batch ||
        h->samples > s->global_batch - h->batch_offset) {
        return 0;
    }
    int n = 0;
    uint32_t end = h->batch_offset + h->samples;
    bool in_run = false; // sample i - 1 is in the last run
    for (uint32_t i = h->batch_offset; i < end; i++) {
        if (zps_cover_any(&s->cover, b, i, i + 1)) {
            in_run = false;
            continue;
        }
        if (in_run) {
            if (n <= max) {
                out[n - 1].count++;
            }
        } else {
            if (n < max) {
                out[n] = (zps_shard_run){.offset = i, .count = 1};
            }
            n++;
            in_run = true;
        }
    }
    return n;
}

// Frees retired snapshots no peer reads any more.
static void s_reap_retired(zps_shard *s)
{
    for (int i = 0; i < ZPS_SHARD_MAX_RETIRED; i++) {
        if (s->retired[i] && atomic_load(&s->retired[i]->ref.inflight) == 0) {
            s_snapshot_free(&s->retired[i]);
        }
    }
}

// Before *sp is written (the first update of a step writes the array of
// the next and the snapshot): the replies sent from it have long been read
// (every member pushed again since), unless a peer does not read; then
// that peer keeps the old buffer and the shard moves to a new one, a copy.
static void s_prepare(zps_shard *s, s_snapshot **sp, size_t bytes)
{
    s_reap_retired(s);
    if (atomic_load(&(*sp)->ref.inflight) == 0) {
        return;
    }
    s_snapshot *fresh = s_snapshot_new(bytes);
    int slot = 0;
    while (slot < ZPS_SHARD_MAX_RETIRED && s->retired[slot]) {
        slot++;
    }
    if (!fresh || slot == ZPS_SHARD_MAX_RETIRED) {
        // Nowhere to go: wait (bounded) for the slow peer rather than
        // overwrite what it is being sent.
        zps_log_warn("shard %u: peers hold %d old parameter buffers; waiting for them",
                     s->index, ZPS_SHARD_MAX_RETIRED);
        free(fresh ? fresh->data : NULL);
        free(fresh);
        (void)zps_wire_ref_wait(&(*sp)->ref, 10000);
        return;
    }
    memcpy(fresh->data, (*sp)->data, bytes);
    s->retired[slot] = *sp;
    *sp = fresh;
}

// The push that completes a bucket, being counted and the bucket updated,
// for the threads.
typedef struct s_update_job {
    zps_shard *s;
    const zps_wire_msg *m; // borrowed: the push, its frames read in place
    size_t first;          // the bucket's first element in the range
    float weight;          // the push's weight
    uint32_t total;        // the weights of the bucket's pushes this step, the push's too
    bool alone;            // the bucket's only push this step: acc holds none
    const zps_kept *kept;  // or the bucket's other push, kept: acc holds none either
    float lr;
} s_update_job;

// The optimizer's update of elements [at, at + len) of the range, from
// the averaged gradient grad (of those elements), into the next array.
static void s_step(zps_shard *s, const zps_optim_cfg *cfg, float lr, size_t at, size_t len,
                   const float *grad)
{
    const float *in = s_cur(s) + at;
    float *out = s_next(s) + at;
    if (cfg->kind == ZPS_OPTIM_SGD) {
        zps_optim_sgd_to(cfg, lr, in, out, s->state + at, grad, len);
    } else {
        zps_optim_adam_to(cfg, lr, s->optim_steps + 1, in, out, s->state + at,
                          s->state + s->n + at, grad, len);
    }
}

// The segment holding element at of the range (segments tile it).
static const zps_seg *s_seg_at(const zps_shard *s, size_t at)
{
    size_t lo = 0, hi = s->groups.n_segs;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (s->groups.segs[mid].lo <= at) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return &s->groups.segs[lo];
}

// s_step of a range with groups or buffers: each tensor's piece by its
// own group's update, or a buffer's by its new value (the mean of the
// pushed values, which grad is; or the sample-0 slice's).
static void s_step_segments(zps_shard *s, size_t at, size_t len, const float *grad)
{
    size_t end = at + len;
    for (const zps_seg *seg = s_seg_at(s, at); at < end; seg++) {
        size_t to = seg->hi < end ? seg->hi : end;
        if (seg->role == ZPS_ROLE_PARAM) {
            s_step(s, &s->groups.cfg[seg->group], s->lrs[seg->group], at, to - at, grad);
        } else {
            const float *src = seg->role == ZPS_ROLE_AVERAGE ? grad : s->bcast + at;
            memcpy(s_next(s) + at, src, (to - at) * sizeof(float));
        }
        grad += to - at;
        at = to;
    }
}

// Elements [at, at + len) of the range, src the push's elements there (in
// the wire dtype), first the kept push's or NULL: the push added to the
// others and averaged, the parameters updated into the next step's array
// (which is what is sent with an fp32 wire; the snapshot otherwise). The
// bits of accumulating the push first and averaging after:
// zps_dtype_axpy_mean, zps_dtype_axpy2_mean.
static void s_update_block(const s_update_job *j, const uint8_t *first, const uint8_t *src,
                           size_t at, size_t len, float *grad)
{
    zps_shard *s = j->s;
    if (first) {
        zps_dtype_axpy2_mean(s->dtype, j->kept->weight, first, j->weight, src, j->total, grad,
                             len);
    } else {
        zps_dtype_axpy_mean(s->dtype, j->weight, src, j->alone ? NULL : s->acc + at, j->total,
                            grad, len);
    }
    if (s->groups.n_segs == 0) {
        s_step(s, &s->optim, j->lr, at, len, grad);
    } else {
        s_step_segments(s, at, len, grad);
    }
    const float *out = s_next(s) + at;
    if (s->snap) {
        zps_dtype_from_f32(s->dtype, out, s->snap->data + at * zps_dtype_size(s->dtype), len);
    }
}

// Elements [lo, hi) of the bucket, which lie in one or more of the push's
// frames (and the kept push's): block by block, so that each element
// crosses the memory bus once for all of it (the accumulator is read,
// never written back).
static void s_update_range(void *arg, size_t lo, size_t hi, int thread)
{
    const s_update_job *j = arg;
    size_t esize = zps_dtype_size(j->s->dtype);
    float *grad = j->s->grad + (size_t)thread * ZPS_SHARD_BLOCK;
    zps_wire_cursor push, kept;
    zps_wire_cursor_init(&push, j->m->frames, j->m->n_frames, esize);
    if (j->kept) {
        zps_wire_cursor_init(&kept, j->kept->frames, j->kept->n_frames, esize);
    }
    for (size_t i = lo, n; i < hi; i += n) {
        n = hi - i < ZPS_SHARD_BLOCK ? hi - i : ZPS_SHARD_BLOCK; // and where a frame ends
        const uint8_t *first = j->kept ? zps_wire_cursor_at(&kept, i, &n) : NULL;
        const uint8_t *src = zps_wire_cursor_at(&push, i, &n);
        s_update_block(j, first, src, j->first + i, n, grad);
    }
}

// Group g's learning rate of the step in progress: the declared table's
// (past its end, its last row), or cfg's schedule.
static float s_lr(const zps_shard *s, int g, const zps_optim_cfg *cfg)
{
    if (!s->table) {
        return zps_optim_lr_at(cfg, s->step);
    }
    uint64_t row = s->step < s->table_steps ? s->step : s->table_steps - 1;
    return s->table[row * s->table_groups + (uint64_t)g];
}

// Diloco with fragments: the buckets of the fragments that the step does
// not exchange keep their values into the next step's array, updated and
// applied at once (their values go out to nobody: no one waits for them).
static void s_carry_idle(zps_shard *s)
{
    for (int b = 0; b < s->n_buckets; b++) {
        if (zps_shard_bucket_idle(s, b)) {
            size_t first = s->buckets[b].lo - s->lo;
            memcpy(s_next(s) + first, s_cur(s) + first,
                   (s->buckets[b].hi - s->buckets[b].lo) * sizeof(float));
            s->updated[b] = s->applied[b] = true;
            s->n_updated++;
            s->n_applied++;
        }
    }
}

static void s_update(zps_shard *s, int bucket, const zps_wire_msg *m, float weight, bool alone,
                     const zps_kept *kept)
{
    if (s->n_updated == 0) {
        s_prepare(s, &s->arr[(s->step + 1) & 1], s->n * sizeof(float));
        if (s->snap) {
            s_prepare(s, &s->snap, s->n * zps_dtype_size(s->dtype));
        }
        s_carry_idle(s);
    }
    size_t first = s->buckets[bucket].lo - s->lo, len = s->buckets[bucket].hi - s->buckets[bucket].lo;
    if (s->weight[bucket] == 0) {
        // A diloco round that no member's pseudo-gradient reached (each one
        // missing): there is no mean, and the outer step is not taken.
        memcpy(s_next(s) + first, s_cur(s) + first, len * sizeof(float));
    } else {
        s_update_job j = {.s = s, .m = m, .first = first, .weight = weight,
                          .total = s->weight[bucket], .alone = alone, .kept = kept,
                          .lr = s_lr(s, 0, &s->optim)};
        for (int g = 0; g < s->groups.n; g++) {
            s->lrs[g] = s_lr(s, g, &s->groups.cfg[g]);
        }
        // Ranges of whole blocks, so that no block of the pass is cut in two.
        zps_pool_for(s->pool, len, ZPS_SHARD_BLOCK, s_update_range, &j);
    }
    s->updated[bucket] = true;
    s->n_updated++;
}

// ---------------------------------------------------------------------------
// --clip-grad-norm: the update waits for the whole model's gradient norm.

// One bucket averaged into clipg and its squares summed, for the threads:
// each thread sums into its own accumulator, and the sums are added after
// (exact integers: the same bits for any number of threads).
typedef struct s_mean_job {
    zps_shard *s;
    size_t first;               // the bucket's first element in the range
    double total;               // its pushes' weights
    const float *root;          // deterministic: the sum of the tree's leaves (else NULL)
    zps_sumsq part[ZPS_POOL_MAX]; // per thread
} s_mean_job;

// The squares of g's elements [at, at + len) of the range that are
// parameters' (a buffer's values are no gradient: clip_grad_norm_ over
// model.parameters() leaves them out).
static void s_sumsq_params(const zps_shard *s, zps_sumsq *part, size_t at, size_t len)
{
    const float *g = s->clipg;
    if (s->groups.n_segs == 0) {
        zps_sumsq_add(part, g + at, len);
        return;
    }
    size_t end = at + len;
    for (const zps_seg *seg = s_seg_at(s, at); at < end; seg++) {
        size_t to = seg->hi < end ? seg->hi : end;
        if (seg->role == ZPS_ROLE_PARAM) {
            zps_sumsq_add(part, g + at, to - at);
        }
        at = to;
    }
}

static void s_mean_range(void *arg, size_t lo, size_t hi, int thread)
{
    s_mean_job *j = arg;
    float *g = j->s->clipg + j->first;
    const double *acc = j->s->acc + j->first;
    if (j->root) {
        // The mean of the leaves, each a micro-batch's mean over M samples.
        float leaves = (float)j->s->leaves;
        for (size_t i = lo; i < hi; i++) {
            g[i] = j->root[i] / leaves;
        }
    } else {
        for (size_t i = lo; i < hi; i++) {
            g[i] = (float)(acc[i] / j->total);
        }
    }
    if (j->s->clip > 0) {
        s_sumsq_params(j->s, &j->part[thread], j->first + lo, hi - lo);
    }
}

// Bucket b's slices tile the batch (clipping): its mean gradient, as the
// unclipped update computes it ((float)(acc / total), zps_dtype_axpy_mean's
// bits), and its exact sum of squares added to the shard's part of the
// norm, at once, while later buckets are still being pushed; once every
// bucket is complete the part is due.
static void s_complete(zps_shard *s, int b)
{
    s->complete[b] = true;
    s_mean_job j = {.s = s, .first = s->buckets[b].lo - s->lo, .total = (double)s->weight[b],
                    .root = s->nodes ? zps_nodes_root(s->nodes, b) : NULL}; // zeroed, 5.6 KiB
    zps_pool_for(s->pool, s->buckets[b].hi - s->buckets[b].lo, 1, s_mean_range, &j);
    for (int t = 0; t < ZPS_POOL_MAX; t++) {
        zps_sumsq_merge(&s->partial, &j.part[t]);
    }
    if (++s->n_complete == s->n_buckets && s->clip > 0) {
        s->norm_due = true;
    }
}

bool zps_shard_clipping(const zps_shard *s)
{
    return s->clip > 0;
}

bool zps_shard_norm_due(const zps_shard *s, zps_sumsq *partial)
{
    if (s->norm_due && partial) {
        *partial = s->partial;
    }
    return s->norm_due;
}

// An averaged buffer's elements of [at, at + len) back to their mean:
// clipping scales gradients, not the buffers' values.
static void s_unclip_buffers(const zps_shard *s, size_t at, size_t len, float *grad)
{
    size_t end = at + len;
    float *g = grad;
    for (const zps_seg *seg = s_seg_at(s, at); at < end; seg++) {
        size_t to = seg->hi < end ? seg->hi : end;
        if (seg->role == ZPS_ROLE_AVERAGE) {
            memcpy(g, s->clipg + at, (to - at) * sizeof(float));
        }
        g += to - at;
        at = to;
    }
}

// The clipped update, for the threads: g times coef, then the optimizer.
typedef struct s_clip_job {
    zps_shard *s;
    size_t first; // the bucket's first element in the range
    float lr;
} s_clip_job;

static void s_clip_range(void *arg, size_t lo, size_t hi, int thread)
{
    const s_clip_job *j = arg;
    zps_shard *s = j->s;
    float *grad = s->grad + (size_t)thread * ZPS_SHARD_BLOCK;
    for (size_t at = j->first + lo; at < j->first + hi; at += ZPS_SHARD_BLOCK) {
        size_t len = j->first + hi - at < ZPS_SHARD_BLOCK ? j->first + hi - at : ZPS_SHARD_BLOCK;
        for (size_t i = 0; i < len; i++) {
            grad[i] = s->clipg[at + i] * s->clip_coef; // torch's g.mul_(clip_coef_clamped)
        }
        if (s->groups.n_segs == 0) {
            s_step(s, &s->optim, j->lr, at, len, grad);
        } else {
            s_unclip_buffers(s, at, len, grad);
            s_step_segments(s, at, len, grad);
        }
        const float *out = s_next(s) + at;
        if (s->snap) {
            zps_dtype_from_f32(s->dtype, out, s->snap->data + at * zps_dtype_size(s->dtype), len);
        }
    }
}

zps_err zps_shard_clip(zps_shard *s, uint64_t step, float norm)
{
    if (!s->norm_due || step != s->step) {
        return ZPS_ESTALE;
    }
    s_prepare(s, &s->arr[(s->step + 1) & 1], s->n * sizeof(float));
    if (s->snap) {
        s_prepare(s, &s->snap, s->n * zps_dtype_size(s->dtype));
    }
    s->clip_coef = zps_sumsq_clip_coef(s->clip, norm);
    for (int g = 0; g < s->groups.n; g++) {
        s->lrs[g] = s_lr(s, g, &s->groups.cfg[g]);
    }
    s->norm_due = false;
    s->clip_taken = true;
    s->next_clip = 0;
    return ZPS_OK;
}

// Bucket b updated from its mean gradient in clipg times clip_coef.
static void s_update_from_mean(zps_shard *s, int b)
{
    if (s->n_updated == 0 && !s->clip_taken) {
        s_prepare(s, &s->arr[(s->step + 1) & 1], s->n * sizeof(float));
        if (s->snap) {
            s_prepare(s, &s->snap, s->n * zps_dtype_size(s->dtype));
        }
        for (int g = 0; g < s->groups.n; g++) {
            s->lrs[g] = s_lr(s, g, &s->groups.cfg[g]);
        }
    }
    size_t first = s->buckets[b].lo - s->lo;
    s_clip_job j = {.s = s, .first = first, .lr = s_lr(s, 0, &s->optim)};
    zps_pool_for(s->pool, s->buckets[b].hi - s->buckets[b].lo, ZPS_SHARD_BLOCK, s_clip_range, &j);
    s->updated[b] = true;
    s->n_updated++;
}

int zps_shard_clip_next(zps_shard *s)
{
    if (!s->clip_taken || s->next_clip >= s->n_buckets) {
        return -1;
    }
    int b = s->next_clip++;
    s_update_from_mean(s, b);
    return b;
}

static void s_clip_forget(zps_shard *s)
{
    memset(s->complete, 0, sizeof s->complete);
    s->n_complete = 0;
    s->norm_due = false;
    s->clip_taken = false;
    zps_sumsq_init(&s->partial);
}

// What the step in progress counted, forgotten: it is over, or a
// checkpoint replaces it.
static void s_forget_step(zps_shard *s)
{
    s_drop_kept(s);
    memset(s->covered, 0, sizeof s->covered);
    memset(s->weight, 0, sizeof s->weight);
    s->loss_weight = 0;
    s->loss_sum = 0;
    memset(s->counted, 0, sizeof s->counted);
    memset(s->applied, 0, sizeof s->applied);
    memset(s->updated, 0, sizeof s->updated);
    s->n_applied = 0;
    s->n_updated = 0;
    for (int i = 0; i < s->n_slices; i++) {
        s->slice_at[s->slices[i].offset] = 0;
    }
    s->n_slices = 0;
    zps_cover_clear(&s->cover);
    s_clip_forget(s);
    if (s->nodes) {
        zps_nodes_clear(s->nodes);
    }
}

void zps_shard_apply(zps_shard *s, int bucket)
{
    ZPS_ASSERT(s->updated[bucket] && !s->applied[bucket]);
    s->applied[bucket] = true;
    s->n_applied++;
}

bool zps_shard_step_done(const zps_shard *s)
{
    return s->n_applied == s->n_buckets && s->n_buckets > 0;
}

bool zps_shard_applied(const zps_shard *s, int bucket)
{
    return s->applied[bucket];
}

float zps_shard_end_step(zps_shard *s)
{
    float loss = s->loss_weight ? (float)(s->loss_sum / s->loss_weight) : 0.0f;
    s_forget_step(s);
    s->step++;
    s->optim_steps++;
    zps_plans_forget_before(&s->plans, s->step);
    return loss;
}

uint32_t zps_shard_counted(const zps_shard *s, uint32_t rank)
{
    return rank < ZPS_MAX_MEMBERS ? s->counted[rank] : 0;
}

void zps_shard_bucket_params(zps_shard *s, int b, const void **data, uint64_t *offset,
                             uint64_t *count, zps_wire_ref **ref)
{
    *offset = s->buckets[b].lo;
    *count = s->buckets[b].hi - s->buckets[b].lo;
    size_t off = s->buckets[b].lo - s->lo;
    if (s->snap) {
        *data = s->snap->data + off * zps_dtype_size(s->dtype);
        *ref = &s->snap->ref;
        return;
    }
    s_snapshot *a = s->arr[(s->step + (s->updated[b] ? 1 : 0)) & 1];
    *data = (const float *)(const void *)a->data + off;
    *ref = &a->ref;
}

bool zps_shard_bucket_params_are(const zps_shard *s, int b, uint64_t step)
{
    return !s->awaiting_init && step == s->step + (s->updated[b] ? 1 : 0);
}

// Whether table (of an INIT; NULL: none) is the shard's: the first INIT's
// is taken (checked), a later one must be the same.
static zps_err s_take_table(zps_shard *s, const Zps__Schedule *t, char *why, size_t len)
{
    if (s->init_any) {
        bool same = !t == !s->table &&
                    (!t || (t->groups == s->table_groups && t->steps == s->table_steps &&
                            t->n_lr == (size_t)t->groups * t->steps &&
                            memcmp(t->lr, s->table, t->n_lr * sizeof(float)) == 0));
        if (!same) {
            snprintf(why, len, "this INIT's learning-rate table is not the first INIT's");
            return ZPS_EPROTO;
        }
        return ZPS_OK;
    }
    if (!t) {
        return ZPS_OK;
    }
    uint32_t want = s->groups.n ? (uint32_t)s->groups.n : 1;
    char reason[200];
    if (zps_groups_check_table(t->groups, t->steps, t->lr, t->n_lr, want, reason,
                               sizeof reason) != ZPS_OK) {
        snprintf(why, len, "%s", reason);
        return ZPS_EPROTO;
    }
    return zps_shard_set_table(s, t->groups, t->steps, t->lr) == ZPS_OK ? ZPS_OK : ZPS_ENOMEM;
}

zps_err zps_shard_set_table(zps_shard *s, uint32_t groups, uint64_t steps, const float *lr)
{
    float *copy = malloc((size_t)groups * steps * sizeof(float));
    if (!copy) {
        return ZPS_ENOMEM;
    }
    memcpy(copy, lr, (size_t)groups * steps * sizeof(float));
    free(s->table);
    s->table = copy;
    s->table_groups = groups;
    s->table_steps = steps;
    return ZPS_OK;
}

zps_err zps_shard_take_init(zps_shard *s, const zps_wire_msg *m, bool *complete, char *why,
                            size_t why_len)
{
    const Zps__Header *h = m->hdr;
    *complete = false;
    if (!s->awaiting_init) {
        snprintf(why, why_len, "the initial values are in already");
        return ZPS_EDUP;
    }
    zps_err err = zps_wire_check_tensor(m, ZPS_DTYPE_F32, s->lo, s->hi, why, why_len);
    if (err != ZPS_OK) {
        return err;
    }
    int b = s_bucket_at(s, h->offset, h->offset + h->count);
    if (b < 0) {
        snprintf(why, why_len, "[%llu, +%llu) is not one of the shard's buckets",
                 (unsigned long long)h->offset, (unsigned long long)h->count);
        return ZPS_EPROTO;
    }
    if (zps_bucket_set_has(&s->init_in, b)) {
        snprintf(why, why_len, "initial values of bucket %d came twice", b);
        return ZPS_EDUP;
    }
    if ((err = s_take_table(s, h->schedule, why, why_len)) != ZPS_OK) {
        return err;
    }
    s->init_any = true;
    float *dst = s_cur(s) + (h->offset - s->lo);
    for (int f = 0; f < m->n_frames; f++) {
        size_t bytes = zmq_msg_size((zmq_msg_t *)&m->frames[f]);
        memcpy(dst, zmq_msg_data((zmq_msg_t *)&m->frames[f]), bytes);
        dst += bytes / sizeof(float);
    }
    zps_bucket_set_add(&s->init_in, b);
    if (zps_bucket_set_full(&s->init_in, s->n_buckets)) {
        s->awaiting_init = false;
        s_set_all(s, NULL);
        *complete = true;
    }
    return ZPS_OK;
}

bool zps_shard_awaits_init(const zps_shard *s)
{
    return s->awaiting_init;
}

zps_err zps_shard_bucket_at(const zps_shard *s, int b, uint64_t step, const float **values)
{
    if (s->awaiting_init) {
        return ZPS_EAGAIN;
    }
    size_t off = s->buckets[b].lo - s->lo;
    if (step == s->step) {
        *values = s_cur(s) + off; // whether updated or not: the update wrote the other array
        return ZPS_OK;
    }
    if (step == s->step + 1) {
        *values = s_next(s) + off;
        return s->updated[b] ? ZPS_OK : ZPS_EAGAIN;
    }
    if (step + 1 == s->step && s->n_updated == 0) {
        *values = s_next(s) + off; // the array of step - 1, not yet written by this one
        return ZPS_OK;
    }
    return ZPS_ESTALE;
}

static zps_ckpt_meta s_meta(const zps_shard *s)
{
    return (zps_ckpt_meta){.shard = s->index, .shards = s->shards, .lo = s->lo, .hi = s->hi,
                           .step = s->step, .job_seed = s->seed, .model_hash = s->model_hash,
                           .optim = s->optim.kind, .optim_step = s->optim_steps};
}

// Where a shard keeps its learning-rate table, beside its checkpoints
// (written with each, as it never changes: a restarted shard reads it).
static void s_table_record(const zps_shard *s, char *name, size_t len)
{
    snprintf(name, len, "lr-table-%u", s->index);
}

static zps_err s_save_table(const zps_shard *s, const char *dir)
{
    Zps__Schedule t = ZPS__SCHEDULE__INIT;
    t.groups = s->table_groups;
    t.steps = s->table_steps;
    t.n_lr = (size_t)s->table_groups * s->table_steps;
    t.lr = s->table;
    size_t n = zps__schedule__get_packed_size(&t);
    uint8_t *buf = malloc(n);
    if (!buf) {
        return ZPS_ENOMEM;
    }
    zps__schedule__pack(&t, buf);
    char name[32];
    s_table_record(s, name, sizeof name);
    zps_err err = zps_ckpt_write_record(dir, name, buf, n);
    free(buf);
    return err;
}

// The table kept beside the checkpoints, if there is one and the shard has
// none (a restarted shard: rank 0 does not send INIT again).
static zps_err s_load_table(zps_shard *s, const char *dir)
{
    size_t cap = (size_t)ZPS_GROUPS_MAX_TABLE * 5 + 64, n = 0;
    uint8_t *buf = s->table ? NULL : malloc(cap);
    char name[32];
    s_table_record(s, name, sizeof name);
    zps_err err = buf ? zps_ckpt_read_record(dir, name, buf, cap, &n) : ZPS_OK;
    Zps__Schedule *t = buf && err == ZPS_OK ? zps__schedule__unpack(NULL, n, buf) : NULL;
    free(buf);
    char why[200];
    uint32_t want = s->groups.n ? (uint32_t)s->groups.n : 1;
    if (t && zps_groups_check_table(t->groups, t->steps, t->lr, t->n_lr, want, why,
                                    sizeof why) == ZPS_OK) {
        err = zps_shard_set_table(s, t->groups, t->steps, t->lr);
    } else if (buf && err == ZPS_OK) {
        zps_log_error("shard %u: %s/%s is not a usable learning-rate table", s->index, dir, name);
        err = ZPS_EPROTO;
    }
    if (t) {
        zps__schedule__free_unpacked(t, NULL);
    }
    return err == ZPS_ENOENT ? ZPS_OK : err;
}

zps_err zps_shard_save(const zps_shard *s, const char *dir, int keep)
{
    zps_ckpt_meta meta = s_meta(s);
    zps_err err = s->table ? s_save_table(s, dir) : ZPS_OK;
    return err == ZPS_OK ? zps_ckpt_write(dir, &meta, s_cur(s), s->state, keep) : err;
}

zps_err zps_shard_restore(zps_shard *s, const char *dir, uint64_t step, uint64_t *loaded)
{
    zps_ckpt_meta want = s_meta(s);
    // Loaded aside first (two scratch arrays), so a failure changes nothing.
    size_t state_bytes = (size_t)s->state_floats * s->n * sizeof(float);
    float *state = s_alloc(state_bytes), *params = s_alloc(s->n * sizeof(float));
    uint64_t optim_steps = 0;
    zps_err err = !state || !params ? ZPS_ENOMEM
                  : s_load_table(s, dir) != ZPS_OK ? ZPS_EPROTO
                  : step == UINT64_MAX
                      ? zps_ckpt_load_newest(dir, &want, loaded, params, state, &optim_steps)
                      : zps_ckpt_load(dir, &want, step, params, state, &optim_steps);
    if (err != ZPS_OK) {
        free(params);
        free(state);
        return err;
    }
    if (step != UINT64_MAX) {
        *loaded = step;
    }
    s_set_all(s, params); // both arrays, whatever the parity of the step restored
    free(params);
    memcpy(s->state, state, state_bytes);
    free(state);
    s->optim_steps = optim_steps;
    memset(s->acc, 0, s->n * sizeof(double));
    s_forget_step(s);
    s->step = *loaded;
    s->awaiting_init = false;
    zps_log_info("shard %u: restored step %llu from %s", s->index, (unsigned long long)s->step,
                 dir);
    return ZPS_OK;
}
