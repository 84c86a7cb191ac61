/* zps_shard.c - accumulate pushes, average by samples, apply the optimizer. */
#include "zps_shard.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_log.h"

// A member pushes its gradient for the range in one piece or per layer
// (buckets), each cut at shard boundaries: a few dozen pieces at most.
#define ZPS_SHARD_MAX_SEGMENTS 64
#define ZPS_SHARD_SNAP_WAIT_MS 1000
#define ZPS_SHARD_BLOCK 2048 // elements per pass of the update: 4 arrays stay in L1/L2

typedef struct s_contrib {
    uint64_t covered;                       // elements received this step
    int n_seg;                              // segments received this step
    uint64_t seg_lo[ZPS_SHARD_MAX_SEGMENTS]; // their ranges, to refuse overlaps
    uint64_t seg_hi[ZPS_SHARD_MAX_SEGMENTS];
    float loss;                              // the member's mean loss, from its first push
} s_contrib;

struct zps_shard {
    uint32_t index;            // shard number
    uint64_t lo, hi;           // the range owned
    size_t n;                  // hi - lo
    zps_optim_cfg optim;       // settings and schedule
    uint64_t step;             // steps completed
    float *params;             // owned: master parameters, n
    float *momentum;           // owned: optimizer state, n
    float *acc;                // owned: sum of n_i * g_i, n
    float *snap;               // owned: parameters as sent, n (zero-copy from here)
    zps_wire_ref snap_ref;     // frames of snap still held by ZeroMQ
    bool snap_fresh;           // snap holds params of the current step
    zps_plan plan;             // who must push
    s_contrib contrib[ZPS_MAX_MEMBERS]; // per plan index, this step
    float *scratch;            // owned: aligned copy of an unaligned frame
};

static float *s_alloc(size_t n)
{
    float *p = NULL;
    if (posix_memalign((void **)&p, 64, (n ? n : 1) * sizeof(float)) != 0) {
        return NULL;
    }
    return p;
}

zps_shard *zps_shard_new(uint32_t index, uint64_t lo, uint64_t hi, const zps_optim_cfg *optim,
                         const float *init)
{
    zps_shard *s = calloc(1, sizeof *s);
    if (!s) {
        goto fail;
    }
    s->index = index;
    s->lo = lo;
    s->hi = hi;
    s->n = hi - lo;
    s->optim = *optim;
    s->params = s_alloc(s->n);
    s->momentum = s_alloc(s->n);
    s->acc = s_alloc(s->n);
    s->snap = s_alloc(s->n);
    s->scratch = s_alloc(ZPS_WIRE_FRAME_BYTES / sizeof(float));
    if (!s->params || !s->momentum || !s->acc || !s->snap || !s->scratch) {
        goto fail;
    }
    memcpy(s->params, init, s->n * sizeof(float));
    memcpy(s->snap, init, s->n * sizeof(float));
    memset(s->momentum, 0, s->n * sizeof(float));
    memset(s->acc, 0, s->n * sizeof(float));
    s->snap_fresh = true;
    return s;
fail:
    zps_log_error("shard %u: cannot allocate %zu parameters", index, (size_t)(hi - lo));
    zps_shard_destroy(&s);
    return NULL;
}

void zps_shard_destroy(zps_shard **sp)
{
    zps_shard *s = *sp;
    if (!s) {
        return;
    }
    // ZeroMQ may still read snap from its I/O thread.
    (void)zps_wire_ref_wait(&s->snap_ref, 5000);
    free(s->params);
    free(s->momentum);
    free(s->acc);
    free(s->snap);
    free(s->scratch);
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

const float *zps_shard_params(const zps_shard *s)
{
    return s->snap_fresh ? s->snap : s->params;
}

zps_wire_ref *zps_shard_params_ref(zps_shard *s)
{
    return s->snap_fresh ? &s->snap_ref : NULL;
}

void zps_shard_set_plan(zps_shard *s, const zps_plan *plan)
{
    s_contrib kept[ZPS_MAX_MEMBERS];
    memset(kept, 0, sizeof(s_contrib) * plan->n);
    for (uint32_t i = 0; i < plan->n; i++) {
        for (uint32_t j = 0; j < s->plan.n; j++) {
            if (s->plan.slices[j].member_id == plan->slices[i].member_id &&
                s->plan.slices[j].count == plan->slices[i].count) {
                kept[i] = s->contrib[j];
            }
        }
    }
    s->plan = *plan;
    memcpy(s->contrib, kept, sizeof(s_contrib) * plan->n);
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

static bool s_overlaps(const s_contrib *c, uint64_t lo, uint64_t hi)
{
    for (int i = 0; i < c->n_seg; i++) {
        if (lo < c->seg_hi[i] && c->seg_lo[i] < hi) {
            return true;
        }
    }
    return false;
}

// acc[i] += n * g[i] over one frame.
static void s_accumulate(float *restrict acc, const float *restrict g, float n, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        acc[i] += n * g[i];
    }
}

zps_err zps_shard_push(zps_shard *s, const zps_wire_msg *m, char *why, size_t why_len)
{
    const Zps__Header *h = m->hdr;
    // Cheapest and most basic first: the shape of the message, then whether
    // it belongs to this step, then who sent it.
    zps_err err = zps_wire_check_tensor(m, s->lo, s->hi, why, why_len);
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
    s_contrib *c = &s->contrib[pi];
    uint64_t lo = h->offset, hi = h->offset + h->count;
    if (s_overlaps(c, lo, hi)) {
        snprintf(why, why_len, "rank %u already pushed part of [%llu, %llu) for step %llu",
                 h->rank, (unsigned long long)lo, (unsigned long long)hi,
                 (unsigned long long)s->step);
        return ZPS_EDUP;
    }
    if (c->n_seg == ZPS_SHARD_MAX_SEGMENTS) {
        snprintf(why, why_len, "rank %u pushed more than %d pieces in one step", h->rank,
                 ZPS_SHARD_MAX_SEGMENTS);
        return ZPS_EPROTO;
    }
    float n = (float)h->samples;
    float *acc = s->acc + (lo - s->lo);
    for (int f = 0; f < m->n_frames; f++) {
        zmq_msg_t *frame = (zmq_msg_t *)&m->frames[f];
        size_t len = zmq_msg_size(frame) / sizeof(float);
        const float *g = zmq_msg_data(frame);
        // A frame may sit unaligned in ZeroMQ's receive buffer.
        if ((uintptr_t)g % _Alignof(float) != 0) {
            memcpy(s->scratch, g, len * sizeof(float));
            g = s->scratch;
        }
        s_accumulate(acc, g, n, len);
        acc += len;
    }
    if (c->n_seg == 0) {
        c->loss = h->loss;
    }
    c->seg_lo[c->n_seg] = lo;
    c->seg_hi[c->n_seg] = hi;
    c->n_seg++;
    c->covered += h->count;
    return ZPS_OK;
}

bool zps_shard_rank_done(const zps_shard *s, uint32_t rank)
{
    int pi = s_plan_index(s, rank);
    return pi >= 0 && s->contrib[pi].covered == s->n;
}

bool zps_shard_ready(const zps_shard *s)
{
    if (s->plan.n == 0) {
        return false;
    }
    for (uint32_t i = 0; i < s->plan.n; i++) {
        if (s->contrib[i].covered != s->n) {
            return false;
        }
    }
    return true;
}

float zps_shard_apply(zps_shard *s)
{
    float total = (float)s->plan.global_batch;
    double loss = 0;
    for (uint32_t i = 0; i < s->plan.n; i++) {
        loss += (double)s->plan.slices[i].count * s->contrib[i].loss;
    }
    // Replies of the last step have long been read by now (every member
    // pushed again); a peer that does not read is sent copies instead.
    s->snap_fresh = zps_wire_ref_wait(&s->snap_ref, ZPS_SHARD_SNAP_WAIT_MS) == ZPS_OK;
    if (!s->snap_fresh) {
        zps_log_warn("shard %u: a peer still holds step %llu's parameters; sending copies",
                     s->index, (unsigned long long)s->step + 1);
    }
    // Block by block, so each element crosses the memory bus once for the
    // average, the update, the snapshot and the reset.
    float lr = zps_optim_lr_at(&s->optim, s->step);
    for (size_t lo = 0; lo < s->n; lo += ZPS_SHARD_BLOCK) {
        size_t len = s->n - lo < ZPS_SHARD_BLOCK ? s->n - lo : ZPS_SHARD_BLOCK;
        float *acc = s->acc + lo;
        for (size_t i = 0; i < len; i++) {
            acc[i] /= total;
        }
        zps_optim_sgd(&s->optim, lr, s->params + lo, s->momentum + lo, acc, len);
        memset(acc, 0, len * sizeof(float));
        if (s->snap_fresh) {
            memcpy(s->snap + lo, s->params + lo, len * sizeof(float));
        }
    }
    memset(s->contrib, 0, sizeof(s_contrib) * s->plan.n);
    s->step++;
    return (float)(loss / total);
}
