/* zps_micro.c - zps_push_micro: a deterministic job's micro-batches summed
 * in the tree's order on the worker, and the piece's nodes pushed. */
#include "lib/zps_client_int.h"

#include <stdlib.h>
#include <string.h>

#include "common/zps_clock.h"

void zps_micro_fini(zps_micro *mb)
{
    for (int i = 0; i < ZPS_TREE_MAX_STACK; i++) {
        free(mb->slot[i]);
    }
    free(mb->loss);
    memset(mb, 0, sizeof *mb);
}

void zps_micro_set_job(zps_micro *mb, uint32_t m, uint32_t global_batch, size_t p)
{
    if (mb->p != p) {
        zps_micro_fini(mb); // another model: slots of another size
    }
    mb->m = m;
    mb->n = m ? global_batch / m : 0;
    mb->p = p;
    mb->work_id = 0;
}

// The state of piece w, begun afresh for a new one.
static zps_err s_begin(zps_client *c, zps_micro *mb, const zps_work *w)
{
    if (mb->work_id == w->id) {
        return ZPS_OK;
    }
    uint32_t k = w->count / mb->m;
    if (k > mb->cap_loss) {
        float *loss = realloc(mb->loss, k * sizeof *loss);
        if (!loss) {
            return zps_client_fail(c, ZPS_ENOMEM);
        }
        mb->loss = loss;
        mb->cap_loss = k;
    }
    for (int b = 0; b < zps_model_n_buckets(&c->model); b++) {
        zps_tree_stack_init(&mb->stack[b], mb->n);
        mb->next[b] = 0;
    }
    mb->work_id = w->id;
    return ZPS_OK;
}

static zps_err s_slot(zps_client *c, zps_micro *mb, int i)
{
    if (!mb->slot[i] && !(mb->slot[i] = malloc(mb->p * sizeof(float)))) {
        return zps_client_fail(c, ZPS_ENOMEM);
    }
    return ZPS_OK;
}

// Micro-batch `micro`'s bucket [lo, hi) into bucket b's stack: added into
// its left neighbours for as long as they are its siblings (left + right,
// the tree's one rounding per node), or kept in a slot of its own. A leaf
// added at once is read from grad, not copied first: the same sums, one
// pass over the bucket fewer (the mode is memory-bound, bench/deterministic.sh).
static zps_err s_add_leaf(zps_client *c, zps_micro *mb, int b, uint32_t leaf, uint64_t lo,
                          uint64_t hi, const float *grad)
{
    int at = zps_tree_stack_push(&mb->stack[b], leaf), into, from;
    bool kept = false;
    while (zps_tree_stack_merge(&mb->stack[b], &into, &from)) {
        float *dst = mb->slot[into];
        const float *src = from == at && !kept ? grad : mb->slot[from];
        for (uint64_t i = lo; i < hi; i++) {
            dst[i] = dst[i] + src[i];
        }
        kept = true; // the leaf is in slot `into` now
    }
    if (!kept) {
        if (s_slot(c, mb, at) != ZPS_OK) {
            return ZPS_ENOMEM;
        }
        memcpy(mb->slot[at] + lo, grad + lo, (hi - lo) * sizeof(float));
    }
    return ZPS_OK;
}

// The mean loss of the piece's micro-batches [lo, hi) (of the piece).
static float s_loss(const zps_micro *mb, uint32_t lo, uint32_t hi)
{
    double sum = 0;
    for (uint32_t i = lo; i < hi; i++) {
        sum += mb->loss[i];
    }
    return (float)(sum / (hi - lo));
}

// Bucket b's nodes, all final, to the shards that hold its range: each a
// slice of its own, the samples of its micro-batches.
static zps_err s_push_nodes(zps_client *c, zps_micro *mb, int b, uint64_t blo, uint64_t bhi,
                            const zps_work *w)
{
    uint32_t first = w->offset / mb->m;
    const zps_tree_stack *st = &mb->stack[b];
    for (int j = 0; j < st->depth; j++) {
        uint32_t end = zps_tree_end(mb->n, st->node[j]);
        zps_piece p = {.offset = st->node[j].lo * mb->m, .count = (end - st->node[j].lo) * mb->m,
                       .gen = c->cur_work.gen};
        float loss = s_loss(mb, st->node[j].lo - first, end - first);
        float compute_ms = (float)(zps_clock_ms() - c->step_t0 - w->data_ms);
        for (int i = 0; c->push_err == ZPS_OK && i < c->conn.n_shards; i++) {
            uint64_t lo = blo > c->conn.shards[i].lo ? blo : c->conn.shards[i].lo;
            uint64_t hi = bhi < c->conn.shards[i].hi ? bhi : c->conn.shards[i].hi;
            if (lo < hi) {
                c->push_err = zps_host_push(c, i, &p, lo, hi, mb->slot[j], loss,
                                            (float)w->data_ms, compute_ms);
            }
        }
    }
    return c->push_err;
}

static zps_err s_check(zps_client *c, const zps_work *w, uint32_t micro, int bucket,
                       const float *grad)
{
    const zps_micro *mb = &c->micro;
    if (mb->m == 0) {
        return zps_client_einval(c, "not a deterministic job: zps_push_bucket");
    }
    if (bucket < 0 || bucket >= zps_model_n_buckets(&c->model) || !grad) {
        return zps_client_einval(c, "bucket %d: the model has %d", bucket,
                                 zps_model_n_buckets(&c->model));
    }
    if (w->offset % mb->m || w->count % mb->m || micro >= w->count / mb->m) {
        return zps_client_einval(c, "micro-batch %u of piece [%u, +%u): micro-batches of %u",
                                 micro, w->offset, w->count, mb->m);
    }
    return ZPS_OK;
}

zps_err zps_push_micro(zps_client *c, const zps_work *w, uint32_t micro, int bucket,
                       const float *grad, float loss)
{
    if (!zps_work_is_current(c, w, ZPS_WORK_TRAIN) || s_check(c, w, micro, bucket, grad)) {
        return ZPS_EINVAL;
    }
    zps_micro *mb = &c->micro;
    if (s_begin(c, mb, w) != ZPS_OK) {
        return ZPS_ENOMEM;
    }
    if (micro != mb->next[bucket]) {
        return zps_client_einval(c, "micro-batch %u of bucket %d: micro-batch %u comes first",
                                 micro, bucket, mb->next[bucket]);
    }
    mb->loss[micro] = loss;
    uint64_t blo, bhi;
    zps_model_bucket(&c->model, bucket, &blo, &bhi);
    if (s_add_leaf(c, mb, bucket, w->offset / mb->m + micro, blo, bhi, grad) != ZPS_OK) {
        return ZPS_ENOMEM;
    }
    if (++mb->next[bucket] == w->count / mb->m && c->push_err == ZPS_OK) {
        (void)s_push_nodes(c, mb, bucket, blo, bhi, w);
    }
    return c->push_err == ZPS_OK ? ZPS_OK : zps_client_fail(c, c->push_err);
}
