/* zps_kept.h - a bucket's first push of a step, kept unread until its next
 * push comes, so that the shard reads both in one pass and never writes
 * the first into its accumulator (docs/choices.md, "The first push waits
 * for the second").
 *
 * A kept push holds references of its own to the push's frames: ZeroMQ
 * shares their bytes, nothing is copied. A frame received from a socket
 * lives as long as a reference does. A frame that is a view of memory
 * someone else owns (a worker's shared-memory segment) must stay as it is
 * until the last reference is closed: its free function says when. */
#ifndef ZPS_KEPT_H
#define ZPS_KEPT_H

#include <stdbool.h>

#include "common/zps_wire.h"

typedef struct zps_kept {
    zmq_msg_t *frames; // owned: references to the push's frames; NULL: none kept
    int n_frames;
    float weight;      // the push's weight in the mean (its samples)
} zps_kept;

// Keeps references to m's payload frames and its weight, in an empty k.
// False, with nothing kept, if there is no memory for them: the caller
// then counts the push at once.
bool zps_kept_take(zps_kept *k, const zps_wire_msg *m, float weight);
// Whether k holds a push.
bool zps_kept_has(const zps_kept *k);
// Closes the references (a view's free function runs if it was the last);
// k is empty after. Safe on an empty or zeroed k.
void zps_kept_drop(zps_kept *k);

#endif
