/* zps_shard.c - accumulate pushes, average by samples, apply the optimizer,
 * per bucket. */
#include "zps_shard.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_log.h"

#define ZPS_SHARD_BLOCK 2048 // elements per pass of the update: the arrays stay in L1/L2
#define ZPS_SHARD_MAX_RETIRED 8

// The parameters as sent, in the wire dtype. ZeroMQ reads it from its I/O
// thread; while any frame of it is in flight it must not change.
typedef struct s_snapshot {
    uint8_t *data;       // owned: (hi - lo) elements of the wire dtype
    zps_wire_ref ref;    // frames still held by ZeroMQ
} s_snapshot;

struct zps_shard {
    uint32_t index;                                 // shard number
    uint64_t lo, hi;                                // the range owned
    size_t n;                                       // hi - lo
    zps_dtype dtype;                                // wire element type
    zps_optim_cfg optim;                            // settings and schedule
    uint64_t step;                                  // steps completed
    float *params;                                  // owned: master parameters, n
    float *momentum;                                // owned: optimizer state, n
    float *acc;                                     // owned: sum of n_i * g_i, n
    s_snapshot *snap;                               // owned: current parameters as sent
    s_snapshot *retired[ZPS_SHARD_MAX_RETIRED];     // owned: old snapshots a peer still reads
    int n_buckets;                                  // buckets of the range
    zps_bucket buckets[ZPS_MODEL_MAX_BUCKETS];      // in push order
    uint32_t pushes[ZPS_MODEL_MAX_BUCKETS];         // members that pushed each bucket this step
    bool applied[ZPS_MODEL_MAX_BUCKETS];            // bucket updated this step
    int n_applied;                                  // buckets updated this step
    zps_plan plan;                                  // who must push
    uint64_t pushed[ZPS_MAX_MEMBERS];               // per plan index: bitmask of buckets pushed
    float loss[ZPS_MAX_MEMBERS];                    // per plan index: mean loss of its slice
};

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

zps_shard *zps_shard_new(const zps_shard_cfg *cfg)
{
    zps_shard *s = calloc(1, sizeof *s);
    if (!s) {
        goto fail;
    }
    s->index = cfg->index;
    s->lo = cfg->lo;
    s->hi = cfg->hi;
    s->n = cfg->hi - cfg->lo;
    s->dtype = cfg->dtype;
    s->optim = cfg->optim;
    s->n_buckets = zps_model_range_buckets(cfg->model, s->lo, s->hi, s->buckets);
    s->params = s_alloc(s->n * sizeof(float));
    s->momentum = s_alloc(s->n * sizeof(float));
    s->acc = s_alloc(s->n * sizeof(float));
    s->snap = s_snapshot_new(s->n * zps_dtype_size(s->dtype));
    if (!s->params || !s->momentum || !s->acc || !s->snap) {
        goto fail;
    }
    zps_model_init_range(cfg->model, cfg->seed, s->lo, s->hi, s->params);
    zps_dtype_from_f32(s->dtype, s->params, s->snap->data, s->n);
    memset(s->momentum, 0, s->n * sizeof(float));
    memset(s->acc, 0, s->n * sizeof(float));
    return s;
fail:
    zps_log_error("shard %u: cannot allocate %llu parameters", cfg->index,
                  (unsigned long long)(cfg->hi - cfg->lo));
    zps_shard_destroy(&s);
    return NULL;
}

void zps_shard_destroy(zps_shard **sp)
{
    zps_shard *s = *sp;
    if (!s) {
        return;
    }
    // The owner closes its sockets first, so ZeroMQ has released every frame.
    s_snapshot_free(&s->snap);
    for (int i = 0; i < ZPS_SHARD_MAX_RETIRED; i++) {
        s_snapshot_free(&s->retired[i]);
    }
    free(s->params);
    free(s->momentum);
    free(s->acc);
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

void zps_shard_set_plan(zps_shard *s, const zps_plan *plan)
{
    uint64_t pushed[ZPS_MAX_MEMBERS] = {0};
    float loss[ZPS_MAX_MEMBERS] = {0};
    for (uint32_t i = 0; i < plan->n; i++) {
        for (uint32_t j = 0; j < s->plan.n; j++) {
            if (s->plan.slices[j].member_id == plan->slices[i].member_id &&
                s->plan.slices[j].count == plan->slices[i].count) {
                pushed[i] = s->pushed[j];
                loss[i] = s->loss[j];
            }
        }
    }
    s->plan = *plan;
    memcpy(s->pushed, pushed, sizeof pushed);
    memcpy(s->loss, loss, sizeof loss);
    for (int b = 0; b < s->n_buckets; b++) {
        s->pushes[b] = 0;
        for (uint32_t i = 0; i < plan->n; i++) {
            s->pushes[b] += (uint32_t)((s->pushed[i] >> b) & 1u);
        }
    }
}

static int s_plan_index(const zps_shard *s, uint32_t rank)
{
    for (uint32_t i = 0; i < s->plan.n; i++) {
        if (s->plan.slices[i].rank == rank) {
            return (int)i;
        }
    }
    return -1;
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

static void s_accumulate(zps_shard *s, const zps_wire_msg *m, float samples)
{
    float *acc = s->acc + (m->hdr->offset - s->lo);
    for (int f = 0; f < m->n_frames; f++) {
        zmq_msg_t *frame = (zmq_msg_t *)&m->frames[f];
        size_t len = zmq_msg_size(frame) / zps_dtype_size(s->dtype);
        zps_dtype_axpy(s->dtype, samples, zmq_msg_data(frame), acc, len);
        acc += len;
    }
}

zps_err zps_shard_push(zps_shard *s, const zps_wire_msg *m, int *ready, char *why,
                       size_t why_len)
{
    const Zps__Header *h = m->hdr;
    *ready = -1;
    // Cheapest and most basic first: the shape of the message, then whether
    // it belongs to this step, then who sent it.
    zps_err err = zps_wire_check_tensor(m, (int)s->dtype, s->lo, s->hi, why, why_len);
    if (err != ZPS_OK) {
        return err;
    }
    if (h->step != s->step) {
        snprintf(why, why_len, "push for step %llu, shard is at step %llu",
                 (unsigned long long)h->step, (unsigned long long)s->step);
        return ZPS_ESTALE;
    }
    int pi = s_plan_index(s, h->rank);
    if (pi < 0 || s->plan.slices[pi].member_id != h->member_id) {
        snprintf(why, why_len, "rank %u with member id %llx is not in the plan", h->rank,
                 (unsigned long long)h->member_id);
        return ZPS_ENOENT;
    }
    if (h->samples != s->plan.slices[pi].count) {
        snprintf(why, why_len, "rank %u pushed %u samples, its slice has %u", h->rank,
                 h->samples, s->plan.slices[pi].count);
        return ZPS_EPROTO;
    }
    int b = s_bucket_at(s, h->offset, h->offset + h->count);
    if (b < 0) {
        snprintf(why, why_len, "[%llu, +%llu) is not one of the shard's buckets",
                 (unsigned long long)h->offset, (unsigned long long)h->count);
        return ZPS_EPROTO;
    }
    if ((s->pushed[pi] >> b) & 1u) {
        snprintf(why, why_len, "rank %u already pushed bucket [%llu, %llu) of step %llu",
                 h->rank, (unsigned long long)s->buckets[b].lo,
                 (unsigned long long)s->buckets[b].hi, (unsigned long long)s->step);
        return ZPS_EDUP;
    }
    s_accumulate(s, m, (float)h->samples);
    if (s->pushed[pi] == 0) {
        s->loss[pi] = h->loss;
    }
    s->pushed[pi] |= 1ull << b;
    if (++s->pushes[b] == s->plan.n) {
        *ready = b;
    }
    return ZPS_OK;
}

bool zps_shard_rank_done(const zps_shard *s, uint32_t rank)
{
    int pi = s_plan_index(s, rank);
    uint64_t all = s->n_buckets == 64 ? ~0ull : (1ull << s->n_buckets) - 1;
    return pi >= 0 && s->pushed[pi] == all;
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

// Before the first update of a step: the replies of the last step have
// long been read (every member pushed again), unless a peer does not read;
// then that peer keeps the old snapshot and the shard moves to a new one.
static void s_prepare_snapshot(zps_shard *s)
{
    s_reap_retired(s);
    if (atomic_load(&s->snap->ref.inflight) == 0) {
        return;
    }
    size_t bytes = s->n * zps_dtype_size(s->dtype);
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
        (void)zps_wire_ref_wait(&s->snap->ref, 10000);
        return;
    }
    memcpy(fresh->data, s->snap->data, bytes);
    s->retired[slot] = s->snap;
    s->snap = fresh;
}

void zps_shard_apply(zps_shard *s, int bucket)
{
    if (s->n_applied == 0) {
        s_prepare_snapshot(s);
    }
    float total = (float)s->plan.global_batch;
    float lr = zps_optim_lr_at(&s->optim, s->step);
    size_t esize = zps_dtype_size(s->dtype);
    // Block by block, so each element crosses the memory bus once for the
    // average, the update, the snapshot and the reset.
    size_t end = s->buckets[bucket].hi - s->lo;
    for (size_t lo = s->buckets[bucket].lo - s->lo; lo < end; lo += ZPS_SHARD_BLOCK) {
        size_t len = end - lo < ZPS_SHARD_BLOCK ? end - lo : ZPS_SHARD_BLOCK;
        float *acc = s->acc + lo;
        for (size_t i = 0; i < len; i++) {
            acc[i] /= total;
        }
        zps_optim_sgd(&s->optim, lr, s->params + lo, s->momentum + lo, acc, len);
        memset(acc, 0, len * sizeof(float));
        zps_dtype_from_f32(s->dtype, s->params + lo, s->snap->data + lo * esize, len);
    }
    s->applied[bucket] = true;
    s->n_applied++;
}

bool zps_shard_step_done(const zps_shard *s)
{
    return s->n_applied == s->n_buckets && s->n_buckets > 0;
}

float zps_shard_end_step(zps_shard *s)
{
    double loss = 0;
    for (uint32_t i = 0; i < s->plan.n; i++) {
        loss += (double)s->plan.slices[i].count * s->loss[i];
    }
    memset(s->pushed, 0, sizeof(uint64_t) * s->plan.n);
    memset(s->pushes, 0, sizeof s->pushes);
    memset(s->applied, 0, sizeof s->applied);
    s->n_applied = 0;
    s->step++;
    return (float)(loss / s->plan.global_batch);
}

void zps_shard_bucket_params(zps_shard *s, int b, const void **data, uint64_t *offset,
                             uint64_t *count, zps_wire_ref **ref)
{
    *offset = s->buckets[b].lo;
    *count = s->buckets[b].hi - s->buckets[b].lo;
    *data = s->snap->data + (s->buckets[b].lo - s->lo) * zps_dtype_size(s->dtype);
    *ref = &s->snap->ref;
}
