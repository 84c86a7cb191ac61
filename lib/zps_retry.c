/* zps_retry.c - what a shard's refusal makes the worker do while it waits
 * for parameters: "not yet" is sent again after a doubling backoff (a
 * PULL or an INIT as it was, a PUSH by computing its piece again), "lost"
 * asks the coordinator, "over" ends the loop. */
#include "lib/zps_client_int.h"

#include "common/zps_clock.h"
#include "common/zps_log.h"
#include "common/zps_wire.h"

// When to send a refused message again: the backoff now, doubled for the
// next refusal up to ZPS_CLIENT_RETRY_MAX_MS (a bucket taken resets it).
static double s_backoff(zps_client *c)
{
    double at = zps_clock_ms() + c->retry_ms;
    c->retry_ms = c->retry_ms * 2 < ZPS_CLIENT_RETRY_MAX_MS ? c->retry_ms * 2
                                                            : ZPS_CLIENT_RETRY_MAX_MS;
    return at;
}

// A refusal from shard i while waiting for `step`'s parameters. "Not yet"
// sends the same again after a bounded backoff: a PULL as it was, a PUSH
// by computing the slice it names again (the gradient buffer has moved on;
// the compute is deterministic, so the piece gives the same gradient), a
// run of a host's sum that a shard dropped too (zps_shard_io) pushed
// alone like any piece handed over. "Lost"
// asks the coordinator at once where the job is.
zps_err zps_retry_on_refusal(zps_client *c, int i, uint64_t step, const Zps__Header *h)
{
    if (h->refused == ZPS__MSG_TYPE__INIT &&
        (h->error_code == ZPS_EAGAIN || h->error_code == ZPS_ESTATE)) {
        // A shard not assigned yet (or restarting): its values again, later.
        zps_log_info("%s: not ready for the initial values (%s); sending them again",
                     c->conn.shards[i].endpoint, h->error ? h->error : "");
        zps_due_init_again(c, i, s_backoff(c));
        return ZPS_OK;
    }
    if (h->refused == ZPS__MSG_TYPE__PUSH && h->shm_size > 0 && h->error_code == ZPS_EAGAIN) {
        zps_conn_shm_refused(&c->conn, i, h->error); // frames from now on, this piece too
    }
    switch (zps_conn_judge(h, c->conn.shards[i].endpoint)) {
    case ZPS_CONN_RETRY: {
        double at = s_backoff(c);
        if (h->refused == ZPS__MSG_TYPE__PULL) {
            zps_due_pull_again(c, i, at);
        } else if (h->refused == ZPS__MSG_TYPE__PUSH && step > 0 && h->step == step - 1 &&
                   h->samples > 0 && h->samples <= c->global_batch &&
                   h->batch_offset <= c->global_batch - h->samples) {
            zps_schedule_add_extra(&c->schedule, h->step,
                                   (zps_piece){.offset = h->batch_offset, .count = h->samples,
                                               .gen = h->generation});
            zps_due_redo(c, at);
        }
        return ZPS_OK;
    }
    case ZPS_CONN_LOST:
        // A PULL refused as from an unknown member may be a joiner's that
        // overtook the plan naming it: asked again, after asking the
        // coordinator, which says whether this worker was handed on.
        zps_due_ask_at(c, 0);
        if (h->refused == ZPS__MSG_TYPE__PULL) {
            zps_due_pull_again(c, i, s_backoff(c));
        }
        return ZPS_OK;
    case ZPS_CONN_OVER:
        c->job_over = true;
        return ZPS_ECLOSED;
    default:
        return ZPS_ECLOSED;
    }
}
