/* zps_refusals.c - a refused message's counter, line and answer
 * (zps_refusals.h). */
#include "zps_refusals.h"

#include <stdio.h>

#include "common/zps_clock.h"
#include "server/zps_msgtab.h"

void zps_refusals_answer(zps_refusals *r, void *sock, uint64_t job_id, uint64_t step,
                         zps_wire_msg *m, zps_err err, const char *why)
{
    r->count += err != ZPS_EAGAIN;
    const char *type = m->hdr ? zps_wire_type_name((int)m->hdr->type) : "undecodable message";
    char who[32] = "", claim[48] = "";
    if (m->hdr) {
        zps_msgtab_claim(m->hdr, who, sizeof who);
    }
    if (who[0]) {
        snprintf(claim, sizeof claim, " (%s)", who);
    }
    uint64_t left_out;
    if (err == ZPS_EAGAIN) {
        // "Not yet" is part of the protocol, not a bad message: its
        // sender sends again.
        zps_log_debug("not yet: %s%s: %s", type, claim, why);
    } else if (zps_log_limit_pass(&r->lines, zps_clock_ms(), &left_out)) {
        zps_log_warn("refused %s%s from %s: %s (%s) [%llu refused so far%s]", type, claim,
                     m->peer[0] ? m->peer : "?", why, zps_strerror(err),
                     (unsigned long long)r->count,
                     left_out ? "; some not logged, at most 10 lines a second" : "");
    }
    // The message table says which senders wait; an undecodable message is
    // answered, its sender is lost otherwise.
    bool reply = !m->hdr || m->hdr->version != ZPS_WIRE_VERSION ||
                 zps_msgtab_rule_of((int)m->hdr->type)->reply;
    if (m->has_route && reply && m->hdr) {
        // The refused message named, so that its sender knows what to send again.
        (void)zps_wire_send_refusal(sock, &m->route, job_id, m->hdr, err, why);
    } else if (m->has_route && reply) {
        (void)zps_wire_send_error(sock, &m->route, job_id, step, err, why);
    }
}
