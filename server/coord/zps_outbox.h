/* zps_outbox.h - what the coordinator has to send, queued for the loop.
 *
 * The coordinator decides and never sends: each handler appends its
 * answers, plans and jobs here as (route, header) and the server loop
 * sends them, in order, on shard 0's socket (zps_outbox_flush). So the
 * coordinator runs without a socket, and a test reads what it would have
 * sent (zps_outbox_header). Coordinator messages carry no tensors. */
#ifndef ZPS_OUTBOX_H
#define ZPS_OUTBOX_H

#include <stddef.h>
#include <stdint.h>

#include <zmq.h>

#include "common/zps_err.h"
#include "common/zps_wire.h"

typedef struct zps_outbox_msg {
    zmq_msg_t route; // the peer's routing id on shard 0's ROUTER (a copy)
    uint8_t *hdr;    // owned: the packed header
    size_t len;
} zps_outbox_msg;

typedef struct zps_outbox {
    zps_outbox_msg *msgs; // owned, oldest first
    size_t n, cap;
    uint64_t dropped;     // messages that could not be queued (out of memory), counted
} zps_outbox;

void zps_outbox_init(zps_outbox *o);
void zps_outbox_fini(zps_outbox *o);

// Queues h (packed now: it may point into the caller's stack) for route.
// ZPS_ENOMEM (logged, counted in dropped) if it cannot.
zps_err zps_outbox_add(zps_outbox *o, zmq_msg_t *route, const Zps__Header *h);
// Queues the ERROR that answers a refused message: code and one line.
zps_err zps_outbox_add_error(zps_outbox *o, zmq_msg_t *route, uint64_t job_id, uint64_t step,
                             zps_err code, const char *why);

// Sends every queued message on sock (a ROUTER), oldest first, and empties
// the outbox. A message that cannot go out is logged by the wire and
// dropped, as a direct send would be; the first such error is returned.
zps_err zps_outbox_flush(zps_outbox *o, void *sock);
// Empties it without sending.
void zps_outbox_clear(zps_outbox *o);

// For tests and logs: message i, unpacked (caller frees it with
// zps__header__free_unpacked), or NULL if i is out of range.
Zps__Header *zps_outbox_header(const zps_outbox *o, size_t i);

#endif
