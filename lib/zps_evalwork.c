/* zps_evalwork.c - the evaluation of an epoch's end (and the job's): the
 * test set split as the step was, the pieces handed out after the step,
 * each one's result sent to the coordinator. */
#include "lib/zps_client_int.h"

#include "common/zps_log.h"
#include "common/zps_wire.h"

zps_err zps_eval_done(zps_client *c, const zps_work *w, uint32_t correct, double loss_sum)
{
    zps_client_begin(c);
    if (!zps_work_is_current(c, w, ZPS_WORK_EVAL)) {
        return ZPS_EINVAL;
    }
    Zps__Eval ev = ZPS__EVAL__INIT;
    ev.epoch = w->epoch;
    ev.correct = correct;
    ev.loss_sum = loss_sum;
    ev.count = w->count;
    ev.offset = w->offset;
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__EVAL);
    h.eval = &ev;
    zps_log_debug("epoch %llu: %u of %u test records right", (unsigned long long)w->epoch,
                  correct, w->count);
    zps_err err = zps_conn_send(&c->conn, 0, &h, NULL, 0, NULL);
    return err == ZPS_OK ? ZPS_OK : zps_client_fail(c, err);
}

void zps_evalwork_plan(zps_client *c, uint64_t t)
{
    // At an epoch's end (and the job's), the test set is
    // split as the step was: whoever computed samples [a, b) of the global
    // batch B evaluates records [n a / B, n b / B). The slices tile the
    // batch, so the ranges tile the test set, a worker's share of it
    // follows its share of the batch, and the pieces of a late slice carry
    // the evaluation of its owner, who may have been away then.
    // A diloco round is H global batches: its end may end an epoch.
    // (With fragments, a step is a part of a round.)
    uint64_t spe = c->steps_per_epoch;
    uint64_t at = c->mode.diloco ? zps_outer_step_batch(&c->mode, t) : t;
    uint64_t end = c->mode.diloco ? zps_outer_step_batch(&c->mode, t + 1) : t + 1;
    bool epoch_end = end / spe > at / spe;
    c->n_eval = c->eval_pos = 0;
    if (c->has_data && (epoch_end || t + 1 == c->total_steps) && c->done_step == t) {
        uint64_t B = c->global_batch;
        for (int i = 0; i < c->n_done; i++) {
            c->eval_lo[c->n_eval] = (uint32_t)(c->n_test * c->done[i].offset / B);
            c->eval_hi[c->n_eval++] =
                (uint32_t)(c->n_test * (c->done[i].offset + c->done[i].count) / B);
        }
        // The epoch that ended in the round (the later one, if two did), or
        // the job's last, still in progress.
        c->eval_epoch = epoch_end ? end / spe - 1 : (end - 1) / spe;
    }
}

int zps_evalwork_hand_out(zps_client *c, zps_work *out)
{
    if (c->eval_pos < c->n_eval) {
        if (c->eval_pos == 0) {
            zps_diloco_eval_begin(c); // diloco: the global parameters are evaluated
        }
        int k = c->eval_pos++;
        *out = (zps_work){.kind = ZPS_WORK_EVAL, .id = ++c->work_id, .step = c->t,
                          .epoch = c->eval_epoch, .offset = c->eval_lo[k],
                          .count = c->eval_hi[k] - c->eval_lo[k]};
        return ZPS_NEXT_EVAL;
    }
    if (c->n_eval > 0) {
        zps_diloco_eval_end(c);
    }
    c->n_eval = c->eval_pos = 0;
    c->t++;
    c->phase = ZPS_PHASE_STEP;
    return 0;
}
