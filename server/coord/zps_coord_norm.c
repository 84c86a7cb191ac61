/* zps_coord_norm.c - --clip-grad-norm on the coordinator: every shard's
 * exact sum of squares of a step's averaged gradient (common/zps_sumsq.h)
 * gathered, added exactly, and the global norm sent back to the shards
 * (NORM), which then clip and update. The sum is an integer, so the norm
 * has the same bits whatever the number of shards and the order the parts
 * came in. */
#include "zps_coord_int.h"

#include <string.h>

// The slot of `step`, taken if new (the oldest step's given up when full:
// its shards send their parts again while they wait).
static zps_coord_norm_slot *s_slot(zps_coord *c, uint64_t step)
{
    zps_coord_norm_slot *free_slot = NULL, *oldest = NULL;
    for (int i = 0; i < ZPS_COORD_NORM_SLOTS; i++) {
        zps_coord_norm_slot *sl = &c->norms[i];
        if (sl->used && sl->step == step) {
            return sl;
        }
        if (!sl->used && !free_slot) {
            free_slot = sl;
        }
        if (sl->used && (!oldest || sl->step < oldest->step)) {
            oldest = sl;
        }
    }
    zps_coord_norm_slot *sl = free_slot ? free_slot : oldest;
    memset(sl, 0, sizeof *sl);
    sl->used = true;
    sl->step = step;
    sl->since_ms = zps_coord_now(c);
    return sl;
}

// NORM of `step` to shard i > 0, on its route from REGISTER.
static void s_send_norm(zps_coord *c, zps_outbox *out, uint32_t i, uint64_t step, float norm)
{
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__NORM);
    h.job_id = c->job_id;
    h.step = step;
    h.shard = i;
    h.grad_norm = norm;
    if (zps_outbox_add(out, &c->shards[i].route, &h) != ZPS_OK) {
        zps_log_error("could not queue the gradient norm of step %llu for shard %u",
                      (unsigned long long)step, i);
    }
}

// Every part of the slot is in: the norm, once, to everyone.
static void s_complete(zps_coord *c, zps_outbox *out, zps_coord_norm_slot *sl)
{
    zps_sumsq sum;
    zps_sumsq_init(&sum);
    for (uint32_t i = 0; i < c->cfg.shards; i++) {
        zps_sumsq_merge(&sum, &sl->part[i]);
    }
    float norm = zps_sumsq_norm(&sum);
    uint64_t step = sl->step;
    sl->used = false;
    c->has_grad_norm = true;
    c->grad_norm_step = step;
    c->grad_norm = norm;
    c->norm_for_shard0 = true;
    for (uint32_t i = 1; i < c->cfg.shards; i++) {
        s_send_norm(c, out, i, step, norm);
    }
    zps_log_debug("step %llu: gradient norm %g", (unsigned long long)step, (double)norm);
}

// Shard `shard`'s part of `step`.
static void s_take(zps_coord *c, zps_outbox *out, uint32_t shard, uint64_t step,
                   const zps_sumsq *part)
{
    if (c->has_grad_norm && step == c->grad_norm_step) {
        // Its norm went out already: a copy sent again while the shard
        // waited, or one that crossed the norm. Answered again, idempotent.
        if (shard > 0) {
            s_send_norm(c, out, shard, step, c->grad_norm);
        }
        return;
    }
    if (c->has_grad_norm && step < c->grad_norm_step) {
        zps_log_debug("dropped shard %u's gradient norm part of step %llu: step %llu's is out",
                      shard, (unsigned long long)step, (unsigned long long)c->grad_norm_step);
        return;
    }
    zps_coord_norm_slot *sl = s_slot(c, step);
    if (!sl->in[shard]) {
        sl->in[shard] = true;
        sl->n_in++;
    }
    sl->part[shard] = *part; // a second copy replaces the first: the newest counts
    if (sl->n_in == c->cfg.shards) {
        s_complete(c, out, sl);
    }
}

zps_err zps_coord_on_norm(zps_coord *c, zps_outbox *out, const zps_wire_msg *m)
{
    const Zps__Header *h = m->hdr;
    if (c->cfg.clip_grad_norm <= 0 || h->shard == 0 || h->shard >= c->cfg.shards ||
        h->n_norm_limbs != ZPS_SUMSQ_LIMBS ||
        (h->norm_flags & ~(ZPS_SUMSQ_INF | ZPS_SUMSQ_NAN)) != 0) {
        zps_log_warn("dropped a NORM of shard %u for step %llu: %s", h->shard,
                     (unsigned long long)h->step,
                     c->cfg.clip_grad_norm <= 0 ? "the job does not clip" : "malformed");
        return ZPS_EPROTO;
    }
    if (c->state == ZPS_COORD_RECOVERING) {
        return ZPS_OK; // a step of before the restart: the rollback replays it
    }
    zps_sumsq part;
    zps_sumsq_init(&part);
    memcpy(part.limb, h->norm_limbs, sizeof part.limb);
    part.flags = h->norm_flags;
    s_take(c, out, h->shard, h->step, &part);
    return ZPS_OK;
}

void zps_coord_note_norm(zps_coord *c, zps_outbox *out, uint64_t step, const zps_sumsq *part)
{
    s_take(c, out, 0, step, part);
}

bool zps_coord_take_norm(zps_coord *c, uint64_t *step, float *norm)
{
    if (!c->norm_for_shard0) {
        return false;
    }
    c->norm_for_shard0 = false;
    *step = c->grad_norm_step;
    *norm = c->grad_norm;
    return true;
}

// A rollback to `step`: the parts of it and after are of steps replayed.
void zps_coord_norm_forget_from(zps_coord *c, uint64_t step)
{
    for (int i = 0; i < ZPS_COORD_NORM_SLOTS; i++) {
        if (c->norms[i].used && c->norms[i].step >= step) {
            c->norms[i].used = false;
        }
    }
    if (c->has_grad_norm && c->grad_norm_step >= step) {
        c->has_grad_norm = false; // its step is computed again: a new norm
        c->norm_for_shard0 = false;
    }
}

// A step waiting long for parts: which shards it waits for, every few seconds.
void zps_coord_norm_tick(zps_coord *c, double now_ms)
{
    if (now_ms < c->next_norm_log_ms) {
        return;
    }
    for (int i = 0; i < ZPS_COORD_NORM_SLOTS; i++) {
        const zps_coord_norm_slot *sl = &c->norms[i];
        if (!sl->used || now_ms - sl->since_ms < ZPS_COORD_WAIT_LOG_MS) {
            continue;
        }
        char names[256] = "";
        size_t at = 0;
        for (uint32_t k = 0; k < c->cfg.shards && at < sizeof names; k++) {
            if (!sl->in[k]) {
                int n = snprintf(names + at, sizeof names - at, "%s%u", at ? ", " : "", k);
                at += n > 0 ? (size_t)n : 0;
            }
        }
        zps_log_warn("step %llu: waiting for the gradient norm from shard%s %s",
                     (unsigned long long)sl->step, strchr(names, ',') ? "s" : "", names);
        c->next_norm_log_ms = now_ms + ZPS_COORD_WAIT_LOG_MS;
    }
}
