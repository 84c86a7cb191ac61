/* zps_ask.c - asking the coordinator where the job is, and what its
 * answer makes the worker do: wait on, catch up, go back, join again as a
 * new member (HELLO until a JOB), or leave. Every question is bounded
 * (ZPS_CLIENT_ASK_MS); no answer is never taken for one. */
#include "lib/zps_client_int.h"

#include <string.h>

#include "common/zps_clock.h"
#include "common/zps_log.h"
#include "common/zps_wire.h"

// HELLO until the JOB comes; the job's end said so sets job_over.
zps_err zps_ask_hello_until_job(zps_client *c, zps_wire_msg *m)
{
    zps_err err = zps_conn_hello_until_job(&c->conn, c->join_timeout_ms, m);
    if (err == ZPS_ECLOSED && !c->conn.stop) {
        c->job_over = true;
    }
    return err;
}

// The member a JOB names, taken while training: its heartbeat, and the
// loop starts over at the JOB's step (zps_next_work says ZPS_NEXT_REJOINED).
static zps_err s_become(zps_client *c, const Zps__Header *h)
{
    zps_heartbeat_stop(&c->conn.heartbeat);
    zps_err err = zps_job_take(c, h);
    if (err != ZPS_OK) {
        return err;
    }
    zps_conn_beat(&c->conn);
    c->rollback_to = c->start_step;
    c->done_step = UINT64_MAX;
    c->rejoined = true;
    return ZPS_OK;
}

// Handed on by the coordinator (evicted while paused, or its slices given
// away while it could not answer): HELLO again, as a new member, with the
// model, data and buffers already here; the loop goes on at the step the
// JOB names.
zps_err zps_ask_rejoin(zps_client *c)
{
    c->rejoin = false;
    zps_heartbeat_stop(&c->conn.heartbeat); // the old member is silent while HELLO waits
    zps_wire_msg m = {0};
    zps_err err = zps_ask_hello_until_job(c, &m);
    if (err == ZPS_OK) {
        err = s_become(c, m.hdr);
    }
    zps_wire_msg_fini(&m);
    return err;
}

// A JOB while training: the answer to a HELLO said again after a pause
// long enough that the member the first JOB named was evicted since, so
// the coordinator admitted this socket anew. The newer JOB is the member
// the coordinator knows; it is taken as on a rejoin. A copy of the JOB in
// hand changes nothing.
zps_err zps_ask_take_late_job(zps_client *c, const Zps__Header *h)
{
    if (!h->job || h->job->member_id == c->conn.member_id) {
        return ZPS_OK;
    }
    zps_log_warn("rank %u was admitted again, as rank %u (a HELLO said again during a pause): "
                 "going on as that member", c->conn.rank, h->job->rank);
    zps_err err = s_become(c, h);
    return err == ZPS_OK ? ZPS_EAGAIN : err;
}

// The job is over, and this worker waits for `step`'s parameters. If they
// are the last ones and it is still a member, they exist and the shards
// keep them while members are through: late (a large model on a slow link
// streams them for seconds) or lost on the way (a host's leader that
// stopped before passing them on). The shards missing are asked for them
// again, once, and the wait goes on while buckets come, judged every
// second (an answer may also follow another at once). ZPS_OK: wait on.
// A member still, but left behind (its slices handed on while it paused,
// the job faster without it), it catches up to the last step and waits
// for those (ZPS_EAGAIN): every member ends with the final parameters, as
// every rank of DDP does, whichever of them saves the model. Otherwise
// the job went on without this worker: it leaves (ZPS_ECLOSED).
static zps_err s_job_done(zps_client *c, const Zps__Status *st, uint64_t step, double now)
{
    uint64_t at = st->steps_done_all;
    if (st->asker == ZPS__MEMBER_STATE__MEMBER_ACTIVE && at > step && at == c->total_steps) {
        zps_log_warn("the job is over (step %llu) without this worker's steps from %llu: "
                     "catching up to its last parameters", (unsigned long long)at,
                     (unsigned long long)step);
        c->rollback_to = at;
        c->catching_up = true;
        return ZPS_EAGAIN;
    }
    int in = zps_wait_received(c);
    bool first = c->done_received < 0;
    bool judged = first || now - c->done_ms >= ZPS_CLIENT_ASK_EVERY_MS;
    bool coming = first || !judged || in > c->done_received;
    if (st->asker == ZPS__MEMBER_STATE__MEMBER_ACTIVE && at == step && coming) {
        if (first) {
            int asked = zps_wait_pull_missing(c, step);
            zps_log_warn("the job is over at step %llu, whose parameters have not all come: "
                         "waiting for them (%d shard(s) asked again)", (unsigned long long)step,
                         asked);
        }
        if (judged) {
            c->done_received = in;
            c->done_ms = now;
        }
        // Asked again a second from now, not after the backed-off wait:
        // nothing else comes of a job that is over.
        c->ask_every_ms = ZPS_CLIENT_ASK_EVERY_MS;
        zps_due_ask_at(c, now + ZPS_CLIENT_ASK_EVERY_MS);
        return ZPS_OK;
    }
    zps_log_warn("the job is over (step %llu of %llu) without this worker's last step: "
                 "leaving it", (unsigned long long)at, (unsigned long long)st->total_steps);
    c->job_over = true;
    return ZPS_ECLOSED;
}

// Waited long for `step`'s parameters: where is the job? The worker goes
// on waiting while the job lives and it is a member; catches up when the
// job went past the step without it; joins again when it was handed on
// (evicted while paused, or its slice given away); ends when the job is
// over (once it has the last parameters, if they are owed to it:
// s_job_done) or the coordinator stays silent for the timeout. The log
// says which.
zps_err zps_ask_where_is_job(zps_client *c, uint64_t step)
{
    double now = zps_clock_ms();
    // Asks back off while the wait goes on: thousands of members waiting
    // for one step (the first of a large job) would otherwise ask the
    // coordinator thousands of times a second. Never past a quarter of the
    // timeout, so a silent coordinator is still found in time.
    double cap = c->timeout_ms / 4.0 < ZPS_CLIENT_ASK_MAX_MS ? c->timeout_ms / 4.0
                                                             : ZPS_CLIENT_ASK_MAX_MS;
    double every = c->ask_every_ms > ZPS_CLIENT_ASK_EVERY_MS ? c->ask_every_ms
                                                             : ZPS_CLIENT_ASK_EVERY_MS;
    zps_due_ask_at(c, now + every);
    c->ask_every_ms = 2 * every < cap ? 2 * every : (cap > every ? cap : every);
    zps_wire_msg m;
    if (zps_conn_ask(&c->conn, ZPS_CLIENT_ASK_MS, &m) != ZPS_OK) {
        if (now - c->answered_ms > c->timeout_ms) {
            zps_log_error("the coordinator at %s has not answered for %.0f s: leaving the job",
                          c->conn.shards[0].endpoint, (now - c->answered_ms) / 1e3);
            return ZPS_ETIMEDOUT;
        }
        return ZPS_OK;
    }
    c->answered_ms = now;
    const Zps__Status *st = m.hdr->status;
    uint64_t at = st->steps_done_all; // a step is over once every shard completed it
    zps_err err = ZPS_OK;
    if (st->state && strcmp(st->state, "done") == 0) {
        err = s_job_done(c, st, step, now);
    } else if (st->asker == ZPS__MEMBER_STATE__MEMBER_GONE ||
               st->asker == ZPS__MEMBER_STATE__MEMBER_UNKNOWN) {
        zps_log_warn("rank %u was handed on by the coordinator (it is at step %llu): joining "
                     "the job again", c->conn.rank, (unsigned long long)at);
        c->rejoin = true;
        err = ZPS_EAGAIN;
    } else if (st->asker == ZPS__MEMBER_STATE__MEMBER_ACTIVE && at > step) {
        zps_log_warn("step %llu is over without this worker (the coordinator is at step %llu): "
                     "catching up there", (unsigned long long)step, (unsigned long long)at);
        c->rollback_to = at;
        c->catching_up = true;
        err = ZPS_EAGAIN;
    } else if (st->asker == ZPS__MEMBER_STATE__MEMBER_ACTIVE && at + 1 < step &&
               at == c->ahead_of) {
        // Parameters of `step` need step - 1 done. Seen twice (a shard's
        // STEP_DONE may lag once), the job is behind this worker: it went
        // on in a timeline a rollback ended. Back to the job's step.
        zps_log_warn("waiting for step %llu while the job is at step %llu: going back there",
                     (unsigned long long)step, (unsigned long long)at);
        c->rollback_to = at;
        err = ZPS_EAGAIN;
    } else {
        zps_log_info("waiting for step %llu parameters: the coordinator is at step %llu (%s), "
                     "this worker %s", (unsigned long long)step, (unsigned long long)at,
                     st->state ? st->state : "?",
                     st->asker == ZPS__MEMBER_STATE__MEMBER_JOINING ? "joining" : "active");
    }
    c->ahead_of = at + 1 < step ? at : UINT64_MAX;
    zps_wire_msg_fini(&m);
    return err;
}

// Whether `step` is over without this worker: true after a pause (a stall,
// a swap storm) so long that the coordinator handed this worker's slice on
// and moved past the step. Then the slice is not computed (the others'
// copy counted), and the worker goes on at the step in progress, or at
// the one after it when speculation handed its slice of the step in
// progress to others too (the coordinator says so): otherwise nobody else
// computes that slice, and the step would wait for it for good. Only a
// slice begun ZPS_CLIENT_LATE_STEPS usual steps after its parameters came
// asks.
bool zps_ask_step_over(zps_client *c, uint64_t step)
{
    double waited = zps_clock_ms() - c->params_ms;
    if (!c->conn.ask || c->usual_step_ms <= 0 || waited < ZPS_CLIENT_LATE_STEPS * c->usual_step_ms) {
        return false;
    }
    zps_wire_msg m;
    if (zps_conn_ask(&c->conn, ZPS_CLIENT_ASK_MS, &m) != ZPS_OK) {
        return false; // no answer in time: compute it
    }
    uint64_t at = m.hdr->status->steps_done_all; // over once every shard completed it
    uint64_t covered = m.hdr->status->asker_covered;
    bool gone = m.hdr->status->asker == ZPS__MEMBER_STATE__MEMBER_GONE;
    zps_wire_msg_fini(&m);
    if (gone) {
        zps_log_warn("rank %u was handed on by the coordinator during a pause of %.0f ms: "
                     "joining the job again", c->conn.rank, waited);
        c->rejoin = true;
        return true;
    }
    if (at <= step) {
        return false; // still open: compute it
    }
    // The step in progress too, if speculation handed this worker's slice
    // of it to others: computing it beside them would only slow them.
    uint64_t next = covered > at ? at + 1 : at;
    c->rollback_to = next < c->total_steps ? next : c->total_steps;
    c->catching_up = true;
    zps_log_warn("step %llu was done without this worker (%.0f ms late; the coordinator is at "
                 "step %llu): rejoining at step %llu", (unsigned long long)step, waited,
                 (unsigned long long)at, (unsigned long long)c->rollback_to);
    return true;
}
