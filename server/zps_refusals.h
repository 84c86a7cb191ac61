/* zps_refusals.h - what a refused message gets: a counter, a log line (a
 * bounded number a second: a flood must not fill the disk) naming its
 * type, the sender it claims and its address, and an ERROR where its
 * sender waits for an answer. A refusal changes nothing else. */
#ifndef ZPS_REFUSALS_H
#define ZPS_REFUSALS_H

#include <stdint.h>

#include "common/zps_log.h"
#include "common/zps_wire.h"

typedef struct zps_refusals {
    uint64_t count;      // refused or dropped messages (STATUS's bad_messages)
    zps_log_limit lines; // bounds the log lines refusals cause
} zps_refusals;

// zps_refusals_answer counts, logs and answers on `sock` a message refused
// with err; job_id and step label the ERROR. ZPS_EAGAIN ("not yet") is
// part of the protocol: answered, not counted, logged at debug level.
void zps_refusals_answer(zps_refusals *r, void *sock, uint64_t job_id, uint64_t step,
                         zps_wire_msg *m, zps_err err, const char *why);

#endif
