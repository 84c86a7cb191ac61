/* zps_wait.c - the wait for a step's parameters: every bucket of every
 * shard, its frames held as they came until all are in, then copied into
 * the caller's buffer in one pass. Meanwhile it takes plans and rollbacks,
 * hands back pieces to compute at once, resends what was refused and asks
 * where the job is; every wait is bounded and says what it waits for. */
#include "lib/zps_client_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/zps_clock.h"
#include "common/zps_log.h"
#include "common/zps_wire.h"

// Lets go of the frames kept (a wait that starts over, or ends).
void zps_wait_release_held(zps_client *c)
{
    for (int i = 0; i < c->n_held; i++) {
        ZPS_ASSERT(zmq_msg_close(&c->held[i].frame) == 0);
    }
    c->n_held = 0;
}

// Room for n more buckets kept; ZPS_ENOMEM (logged) if there is none.
static zps_err s_room(zps_client *c, int n)
{
    if (c->n_held + n <= c->cap_held) {
        return ZPS_OK;
    }
    int cap = 2 * (c->n_held + n) + 16;
    zps_client_held *more = malloc((size_t)cap * sizeof *more);
    if (!more) {
        zps_log_error("out of memory keeping the parameters received");
        return ZPS_ENOMEM;
    }
    for (int i = 0; i < c->n_held; i++) {
        more[i] = c->held[i]; // its frame moved below
        ZPS_ASSERT(zmq_msg_init(&more[i].frame) == 0);
        ZPS_ASSERT(zmq_msg_move(&more[i].frame, &c->held[i].frame) == 0);
        ZPS_ASSERT(zmq_msg_close(&c->held[i].frame) == 0);
    }
    free(c->held);
    c->held = more;
    c->cap_held = cap;
    return ZPS_OK;
}

// Keeps the frames of a checked PARAMS message of the parameters from
// `offset` on (they leave m empty); ZPS_ENOMEM if there is no room.
static zps_err s_hold(zps_client *c, zps_wire_msg *m, uint64_t offset)
{
    zps_err err = s_room(c, m->n_frames);
    if (err != ZPS_OK) {
        return err;
    }
    size_t esize = zps_dtype_size(c->dtype);
    for (int f = 0; f < m->n_frames; f++) {
        zps_client_held *k = &c->held[c->n_held++];
        *k = (zps_client_held){.offset = offset};
        ZPS_ASSERT(zmq_msg_init(&k->frame) == 0);
        ZPS_ASSERT(zmq_msg_move(&k->frame, &m->frames[f]) == 0);
        offset += zmq_msg_size(&k->frame) / esize;
    }
    return ZPS_OK;
}

// Keeps a bucket that lies in shard i's segment, to be read from there.
static zps_err s_hold_shared(zps_client *c, int i, const zps_conn_shared *in)
{
    zps_err err = s_room(c, 1);
    if (err == ZPS_OK) {
        zps_client_held *k = &c->held[c->n_held++];
        *k = (zps_client_held){.offset = in->offset, .shared = true, .shard = i, .in = *in};
        ZPS_ASSERT(zmq_msg_init(&k->frame) == 0); // empty: released as the others
    }
    return err;
}

// Asks shard i for `step`'s parameters again by PULL, as frames, once a
// step; whether it did now.
static bool s_pull_once(zps_client *c, int i, uint64_t step)
{
    zps_conn_shard *sc = &c->conn.shards[i];
    if (sc->params_pulled == step + 1) {
        return false;
    }
    sc->params_pulled = step + 1;
    (void)zps_conn_pull(&c->conn, i, step); // a failure is logged; the wait is bounded
    return true;
}

// The values of step `step` that shard i's segment was to hold cannot be
// read from there: most often the job went on without this worker (its
// slices handed on while it stalled), and a pull of a step the shard has
// passed is never answered. The coordinator says whether to catch up
// (zps_ask_where_is_job), as for later parameters as frames; the step is
// also asked for again by PULL, once, as frames.
static void s_ask_again(zps_client *c, int i, uint64_t step)
{
    zps_due_ask_at(c, 0);
    (void)s_pull_once(c, i, step);
}

// Bucket k kept in a shard's segment is lost (written over): it is
// received no more, and asked for again.
static void s_lose_shared(zps_client *c, const zps_client_held *k)
{
    zps_conn_shard *sc = &c->conn.shards[k->shard];
    zps_bucket_set_remove(&sc->received, (int)k->in.bucket);
    sc->params_pulled = 0; // a pull of before may have been answered already
    s_ask_again(c, k->shard, k->in.step);
}

// Whether every bucket kept in a shard's segment still lies there as its
// header said; those that do not are let go of and asked for again.
static bool s_shared_still_there(zps_client *c)
{
    int kept = 0;
    bool all = true;
    for (int i = 0; i < c->n_held; i++) {
        zps_client_held *k = &c->held[i];
        if (k->shared && !zps_conn_params_at(&c->conn, k->shard, &k->in)) {
            s_lose_shared(c, k);
            ZPS_ASSERT(zmq_msg_close(&k->frame) == 0);
            all = false;
            continue;
        }
        if (kept != i) {
            c->held[kept] = *k; // an empty frame for a shared one: nothing to move
            ZPS_ASSERT(zmq_msg_init(&c->held[kept].frame) == 0);
            ZPS_ASSERT(zmq_msg_move(&c->held[kept].frame, &k->frame) == 0);
            ZPS_ASSERT(zmq_msg_close(&k->frame) == 0);
        }
        kept++;
    }
    c->n_held = kept;
    return all;
}

// One bucket kept into the caller's buffer: false if it lay in a shard's
// segment and was written over while read (asked for again).
static bool s_take_one(zps_client *c, zps_client_held *k, size_t esize)
{
    if (!k->shared) {
        zps_dtype_to_f32(c->dtype, zmq_msg_data(&k->frame), c->params + k->offset,
                         zmq_msg_size(&k->frame) / esize);
        return true;
    }
    const void *src = zps_conn_params_at(&c->conn, k->shard, &k->in);
    if (src) {
        zps_dtype_to_f32(c->dtype, src, c->params + k->offset, k->in.count);
    }
    if (!src || !zps_conn_params_still(&c->conn, k->shard, &k->in)) {
        s_lose_shared(c, k);
        return false;
    }
    return true;
}

// The parameters received become the caller's, in one pass over the
// buckets kept, which are let go of. False, with nothing written, if a
// bucket kept in a shard's segment was written over since its header
// came; false with the rest written if one was written over during the
// pass (two steps' values in the caller's buffer, until the bucket asked
// for again comes: the job went on without this worker, and what the
// coordinator answers replaces them all). The wait then goes on.
static bool s_take_held(zps_client *c)
{
    if (!s_shared_still_there(c)) {
        return false;
    }
    size_t esize = zps_dtype_size(c->dtype);
    bool whole = true;
    for (int i = 0; i < c->n_held; i++) {
        whole = s_take_one(c, &c->held[i], esize) && whole;
    }
    zps_wait_release_held(c);
    return whole;
}

// Checks a PARAMS message's tensor against shard sc's range: in frames, or
// named in the shard's segment of parameters (no frames).
static zps_err s_check_params(const zps_client *c, const zps_conn_shard *sc,
                              const zps_wire_msg *m, char *why, size_t why_len)
{
    const Zps__Header *h = m->hdr;
    if (h->shm_size == 0) {
        return zps_wire_check_tensor(m, (int)c->dtype, sc->lo, sc->hi, why, why_len);
    }
    if (m->n_frames != 0 || (int)h->dtype != (int)c->dtype) {
        snprintf(why, why_len, "parameters through shared memory with %s",
                 m->n_frames ? "payload frames" : "another dtype than the job's");
        return ZPS_EPROTO;
    }
    if (h->count == 0 || h->offset < sc->lo || h->offset >= sc->hi ||
        h->count > sc->hi - h->offset) {
        snprintf(why, why_len, "tensor [%llu, +%llu) outside [%llu, %llu)",
                 (unsigned long long)h->offset, (unsigned long long)h->count,
                 (unsigned long long)sc->lo, (unsigned long long)sc->hi);
        return ZPS_ERANGE;
    }
    return ZPS_OK;
}

// Bucket b of a PARAMS message of shard i that names the shard's segment,
// kept as where it lies there: true. False when it cannot be
// (zps_conn_params_named says why): it is asked for again.
static bool s_name_shared(zps_client *c, int i, uint32_t b, const zps_wire_msg *m,
                          zps_conn_shared *in)
{
    size_t esize = zps_dtype_size(c->dtype);
    if (zps_conn_params_named(&c->conn, i, b, m->hdr, esize, in) == ZPS_OK) {
        return true;
    }
    s_ask_again(c, i, m->hdr->step);
    return false;
}

// A PARAMS of shard i that names every bucket of its range in its segment
// (shm_whole, one notice a step): each bucket not in yet is kept as if it
// had been named alone; one that cannot be is asked for again.
static zps_err s_take_whole(zps_client *c, int i, const zps_wire_msg *m)
{
    zps_conn_shard *sc = &c->conn.shards[i];
    if (m->hdr->offset != sc->lo || m->hdr->count != sc->hi - sc->lo) {
        zps_log_error("%s sent bad parameters: a whole step's notice of [%llu, +%llu), its "
                      "range is [%llu, %llu)", sc->endpoint, (unsigned long long)m->hdr->offset,
                      (unsigned long long)m->hdr->count, (unsigned long long)sc->lo,
                      (unsigned long long)sc->hi);
        return ZPS_EPROTO;
    }
    size_t esize = zps_dtype_size(c->dtype);
    Zps__Header one = *m->hdr; // its strings borrowed
    zps_wire_msg bucket = {.hdr = &one};
    for (int b = 0; b < sc->n_buckets; b++) {
        zps_conn_shared in;
        if (zps_bucket_set_has(&sc->received, b)) {
            continue;
        }
        one.offset = sc->buckets[b].lo;
        one.count = sc->buckets[b].hi - sc->buckets[b].lo;
        one.shm_offset = m->hdr->shm_offset + (one.offset - sc->lo) * esize;
        if (!s_name_shared(c, i, (uint32_t)b, &bucket, &in)) {
            return ZPS_OK; // asked again, as frames
        }
        zps_err err = s_hold_shared(c, i, &in);
        if (err != ZPS_OK) {
            return err;
        }
        zps_bucket_set_add(&sc->received, b);
    }
    c->retry_ms = ZPS_CLIENT_RETRY_MS;
    return ZPS_OK;
}

// Checks a PARAMS message from shard i against what step `step` expects
// and keeps its frames until the step's parameters are all in.
static zps_err s_take_bucket(zps_client *c, int i, uint64_t step, zps_wire_msg *m)
{
    zps_conn_shard *sc = &c->conn.shards[i];
    const Zps__Header *h = m->hdr;
    char why[160] = "";
    int b = -1;
    if (h->type == ZPS__MSG_TYPE__ERROR) {
        return zps_retry_on_refusal(c, i, step, h);
    }
    if (h->type == ZPS__MSG_TYPE__PARAMS && h->step < step) {
        return ZPS_OK; // a late answer for a step already over: nothing to take
    }
    if (h->type == ZPS__MSG_TYPE__PARAMS && h->step > step) {
        // Either the job went on without this worker (its slices handed on
        // while it stalled), or these are from before a rollback, queued
        // while it was away: only the coordinator knows which. Asked now;
        // the answer says whether to catch up (zps_ask_where_is_job).
        zps_due_ask_at(c, 0);
        return ZPS_OK;
    }
    if (i == 0 && h->type == ZPS__MSG_TYPE__JOB) {
        return zps_ask_take_late_job(c, h);
    }
    if (h->type != ZPS__MSG_TYPE__PARAMS || h->step != step) {
        snprintf(why, sizeof why, "%s for step %llu, expected PARAMS for step %llu",
                 zps_wire_type_name(h->type), (unsigned long long)h->step,
                 (unsigned long long)step);
    } else if (s_check_params(c, sc, m, why, sizeof why) == ZPS_OK) {
        if (h->shm_whole) {
            return s_take_whole(c, i, m);
        }
        b = zps_conn_bucket_of(sc, h->offset, h->offset + h->count);
        if (b >= 0 && zps_bucket_set_has(&sc->received, b)) {
            // A second answer (to a pull and a push both): the same values.
            return ZPS_OK;
        }
        if (b < 0) {
            snprintf(why, sizeof why, "[%llu, +%llu) is not one of the shard's buckets",
                     (unsigned long long)h->offset, (unsigned long long)h->count);
        }
    }
    if (b < 0) {
        zps_log_error("%s sent bad parameters: %s", sc->endpoint, why);
        return ZPS_EPROTO;
    }
    zps_err err;
    if (h->shm_size > 0) {
        zps_conn_shared in;
        if (!s_name_shared(c, i, (uint32_t)b, m, &in)) {
            return ZPS_OK; // asked again, as frames
        }
        err = s_hold_shared(c, i, &in);
    } else {
        err = s_hold(c, m, h->offset);
    }
    if (err != ZPS_OK) {
        return err;
    }
    zps_bucket_set_add(&sc->received, b);
    c->retry_ms = ZPS_CLIENT_RETRY_MS;
    return ZPS_OK;
}

static bool s_shard_received(const zps_conn_shard *sc)
{
    return zps_bucket_set_full(&sc->received, sc->n_buckets);
}

// The buckets of the awaited step in, from every shard.
int zps_wait_received(const zps_client *c)
{
    int n = 0;
    for (int i = 0; i < c->conn.n_shards; i++) {
        const zps_conn_shard *sc = &c->conn.shards[i];
        for (int b = 0; b < sc->n_buckets; b++) {
            n += zps_bucket_set_has(&sc->received, b);
        }
    }
    return n;
}

// The shards whose parameters of `step` exist (the coordinator has done
// the step) but are not all here are asked for them again by PULL, as
// frames, once a step; how many were.
int zps_wait_pull_missing(zps_client *c, uint64_t step)
{
    int asked = 0;
    for (int i = 0; i < c->conn.n_shards; i++) {
        asked += !s_shard_received(&c->conn.shards[i]) && s_pull_once(c, i, step);
    }
    return asked;
}

static bool s_all_received(const zps_client *c)
{
    for (int i = 0; i < c->conn.n_shards; i++) {
        if (!s_shard_received(&c->conn.shards[i])) {
            return false;
        }
    }
    return true;
}

// A message from shard i while waiting for parameters: a bucket of them,
// or (from the coordinator) a new plan, maybe with slices of the step in
// progress to compute right away.
static zps_err s_take_message(zps_client *c, int i, uint64_t step, zps_wire_msg *m)
{
    const Zps__Header *h = m->hdr;
    if (i == 0 && h->type == ZPS__MSG_TYPE__ROLLBACK && h->plan) {
        // A shard came back from its checkpoint: start over from its step.
        const Zps__Plan *p = h->plan;
        zps_log_warn("rolling back to step %llu (plan %u)", (unsigned long long)h->step,
                     p->generation);
        zps_schedule_forget_before(&c->schedule, UINT64_MAX);
        zps_err err = zps_job_take_plan(c, p->slices, p->n_slices, p->generation, p->effective_step,
                                        p->extras, p->n_extras, p->host);
        c->rollback_to = h->step;
        return err == ZPS_OK ? ZPS_EAGAIN : err;
    }
    if (i != 0 || h->type != ZPS__MSG_TYPE__PLAN || !h->plan) {
        return s_take_bucket(c, i, step, m);
    }
    const Zps__Plan *p = h->plan;
    zps_log_info("plan %u from step %llu: %u members", p->generation,
                 (unsigned long long)p->effective_step, p->members);
    zps_err err = zps_job_take_plan(c, p->slices, p->n_slices, p->generation, p->effective_step,
                                    p->extras, p->n_extras, p->host);
    if (err == ZPS_OK) {
        zps_work_queue_extras(c, step);
    }
    return err;
}

zps_err zps_wait_pull(zps_client *c, uint64_t step)
{
    zps_err err = ZPS_OK;
    for (int i = 0; err == ZPS_OK && i < c->conn.n_shards; i++) {
        err = zps_conn_pull(&c->conn, i, step);
    }
    return err;
}

// Rank 0 of a declared model's first start: the caller's buffer, as it is
// now, becomes the job's initial values on every shard. They arrive back
// as step 0's parameters, like everyone's: the buffer is not written
// before all of them are in.
zps_err zps_wait_send_init(zps_client *c)
{
    if (!c->send_init || c->start_step != 0) {
        return ZPS_OK;
    }
    c->send_init = false;
    zps_log_info("rank 0: sending the initial values of %zu parameters to %d shards",
                 c->model.n_params, c->conn.n_shards);
    zps_err err = ZPS_OK;
    for (int i = 0; err == ZPS_OK && i < c->conn.n_shards; i++) {
        err = zps_conn_send_init(&c->conn, i, c->params);
    }
    return err;
}

// Receives every bucket of every shard for wait_step, then makes them the
// caller's parameters. Returns ZPS_OK with pieces queued when some of the
// step before are to be computed first (the next call goes on waiting),
// ZPS_OK with none when the parameters are in place. The wait has no
// fixed end while the job lives: after a while the coordinator is asked
// where the job is, and the worker goes on waiting, catches up, joins
// again, or ends (the job is over, or the coordinator stayed silent for
// the timeout).
// What came on the host's socket while waiting: a leader takes its
// followers' pushes; a follower, the parameters its leader passes on.
static zps_err s_take_host(zps_client *c, uint64_t step)
{
    if (zps_host_leads(c)) {
        return zps_host_drain(c);
    }
    zmq_pollitem_t item = {.socket = c->host.sock, .events = ZMQ_POLLIN};
    zps_err err = ZPS_OK;
    while ((err == ZPS_OK || err == ZPS_ETIMEDOUT) && zmq_poll(&item, 1, 0) > 0) {
        zps_wire_msg m;
        err = zps_wire_recv(c->host.sock, false, &m);
        if (err == ZPS_OK && !zps_host_take_ack(c, &m) && zps_host_from_leader(c, &m)) {
            err = s_take_message(c, (int)m.hdr->shard, step, &m);
        }
        zps_wire_msg_fini(&m);
    }
    return err == ZPS_ETIMEDOUT || err == ZPS_EPROTO ? ZPS_OK : err;
}

// A message that came from shard i while waiting (passed on to the
// host's followers first if this worker leads them).
static zps_err s_take_from_shard(zps_client *c, int i, uint64_t step)
{
    zps_wire_msg m;
    zps_err err = zps_wire_recv(c->conn.shards[i].sock, false, &m);
    if (err == ZPS_OK && !zps_host_code_take(c, i, &m, step)) {
        if (m.hdr->step == step && c->host.code_pulled[i] != step + 1) {
            c->host.code_pulled[i] = step + 1; // the PULL brings the rest of the step too
            c->conn.shards[i].params_pulled = 0; // a pull of before may have been answered
            (void)s_pull_once(c, i, step); // answered uncoded
        } else if (m.hdr->step > step) {
            zps_due_ask_at(c, 0); // as s_take_bucket would have
        }
    } else if (err == ZPS_OK) {
        zps_host_relay(c, i, &m);
        err = s_take_message(c, i, step, &m);
    }
    zps_wire_msg_fini(&m);
    return err == ZPS_ETIMEDOUT ? ZPS_OK : err;
}

// One poll of the shards' sockets and the host's and its monitor's, what
// came taken, what fell due done.
static zps_err s_wait_once(zps_client *c, uint64_t step)
{
    // Built each time: a new plan may give the host's group other sockets.
    zmq_pollitem_t items[ZPS_CONN_MAX_SHARDS + 2];
    int n = c->conn.n_shards;
    for (int i = 0; i < c->conn.n_shards; i++) {
        items[i] = (zmq_pollitem_t){.socket = c->conn.shards[i].sock, .events = ZMQ_POLLIN};
    }
    if (c->host.sock) {
        items[n++] = (zmq_pollitem_t){.socket = c->host.sock, .events = ZMQ_POLLIN};
    }
    if (c->host.mon) {
        items[n++] = (zmq_pollitem_t){.socket = c->host.mon, .events = ZMQ_POLLIN};
    }
    int rc = zmq_poll(items, n, zps_due_poll_ms(c, zps_clock_ms()));
    if (rc < 0 && errno != EINTR) {
        zps_log_error("zmq_poll on the shard sockets: %s", zmq_strerror(errno));
        return ZPS_EIO;
    }
    zps_err err = ZPS_OK;
    for (int i = 0; err == ZPS_OK && rc > 0 && i < c->conn.n_shards; i++) {
        if (items[i].revents & ZMQ_POLLIN) {
            err = s_take_from_shard(c, i, step);
        }
    }
    for (int k = c->conn.n_shards; err == ZPS_OK && rc > 0 && k < n; k++) {
        if (!(items[k].revents & ZMQ_POLLIN)) {
            continue;
        }
        if (items[k].socket == c->host.sock) {
            err = s_take_host(c, step);
        } else {
            zps_host_on_event(c);
        }
    }
    if (err == ZPS_OK && c->host.sock && zps_host_give_up_due(c, zps_clock_ms())) {
        // An ack that came since the poll (or with a message the poll did
        // not flag) keeps the follower from pushing a piece its leader holds.
        err = s_take_host(c, step);
    }
    if (err == ZPS_OK) {
        err = zps_host_due(c, zps_clock_ms());
    }
    return err == ZPS_OK ? zps_due_run(c, zps_clock_ms()) : err;
}

// Receives every bucket of every shard for wait_step, then makes them the
// caller's parameters. Returns ZPS_OK with pieces queued when some of the
// step before are to be computed first (the next call goes on waiting),
// ZPS_OK with none when the parameters are in place. The wait has no
// fixed end while the job lives: after a while the coordinator is asked
// where the job is, and the worker goes on waiting, catches up, joins
// again, or ends (the job is over, or the coordinator stayed silent for
// the timeout).
zps_err zps_wait_run(zps_client *c)
{
    uint64_t step = c->wait_step;
    if (!c->wait_begun) {
        c->wait_begun = true;
        for (int i = 0; i < c->conn.n_shards; i++) {
            c->conn.shards[i].received = zps_diloco_not_awaited(c, i, c->after, step);
        }
        zps_wait_release_held(c); // of a wait that did not finish
        c->wait_start = zps_clock_ms();
        zps_due_begin(c, c->wait_start);
        c->answered_ms = c->wait_start;
        c->done_received = -1;
    }
    do {
        while (!s_all_received(c) || zps_work_queued(c)) {
            if (zps_work_queued(c)) {
                return ZPS_OK;
            }
            if (c->conn.stop) {
                return ZPS_ECLOSED;
            }
            zps_err err = s_wait_once(c, step);
            if (err != ZPS_OK) {
                return err;
            }
        }
    } while (!s_take_held(c));
    zps_due_end(c);
    c->catching_up = false;
    zps_schedule_forget_before(&c->schedule, step);
    double now = zps_clock_ms();
    if (c->params_ms > 0) {
        double d = now - c->params_ms;
        c->usual_step_ms = c->usual_step_ms > 0 ? 0.9 * c->usual_step_ms + 0.1 * d : d;
        zps_heartbeat_set_interval(c->conn.heartbeat, zps_due_beat_ms(c));
    } else {
        c->first_wait_ms = now - c->wait_start;
    }
    c->params_ms = now;
    return ZPS_OK;
}
