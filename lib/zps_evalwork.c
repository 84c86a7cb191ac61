/* zps_evalwork.c - the evaluation of an epoch's end: its result sent to
 * the coordinator. */
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
