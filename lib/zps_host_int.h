/* zps_host_int.h - what the files of one push per host (lib/zps_host.c,
 * zps_host_sum.c, zps_host_serve.c) call of one another; nothing else of
 * libzps includes it. Their calls for the loop are in lib/zps_client_int.h. */
#ifndef ZPS_HOST_INT_H
#define ZPS_HOST_INT_H

#include "lib/zps_client_int.h"

// zps_host.c: the state, the group and its socket.
void zps_host_part_fini(zps_host_part *p);
void zps_host_bucket_clear(zps_host_bucket *hb);
// The socket of this group: bound by the leader, connected to it by a
// follower. False (logged once; the host's workers push themselves) if
// there is no private directory for it or ZeroMQ refuses.
bool zps_host_open(zps_client *c);
// How long a follower waits for its leader to take a step's part:
// max(ZPS_HOST_GIVE_UP_MIN_MS, 6 steps), fixed at the step's first part.
double zps_host_give_up_ms(const zps_client *c);
// A follower whose piece went to a leader it no longer has, or that went
// silent: the piece is computed again and pushed by this worker itself
// (the shards keep the first copy of a sample if the leader's came after
// all), and so is every piece until it tries the leader again.
void zps_host_give_up(zps_client *c, const char *why);

// zps_host_code.c (--wire-code zstd): a push to shard i coded in place
// (hd says so), when the job codes; as it was if it cannot be (memory).
void zps_host_code_push(zps_client *c, int i, Zps__Header *hd, zps_wire_msg *out);
// Frees the coder and the copy of the parameters; safe on zeroed memory.
void zps_host_code_fini(zps_host *h);

// zps_host_sum.c: the leader's sums.
// out's frames become src's, shared (ZeroMQ counts the references), not copied.
void zps_host_share_frames(zps_wire_msg *out, const zps_wire_msg *src);
// Pushes every bucket of the step still held (a group that changed, a
// member that went silent, a new step).
void zps_host_flush_all(zps_client *c);
// The leader turns to `step`: what is left of the one before is pushed.
void zps_host_lead_step(zps_client *c, uint64_t step);
// Before a step is pushed on the timer: the members none of whose parts
// came are not waited for from now on, until one of theirs comes. A
// follower that gave up on this leader pushes for itself for a while, so
// without this every step of that while waited the timer out, and the
// timer, 3 usual steps, grew with the steps it lengthened: at 1024
// members steps went 5, 9, 11, 13 ... 48 s.
void zps_host_mark_absent(zps_client *c);
// Takes part p (moved) for shard i's bucket b of the step being summed:
// pushed with the bucket once every member's piece is in, or at once if
// the bucket was pushed already. A part that overlaps one held is dropped.
zps_err zps_host_add_part(zps_client *c, int i, int b, zps_host_part *p);

// zps_host_serve.c: the leader's socket.
// The HOST_ACK of rank's part of `step` with flags: a leader's answer
// (flags 0 or ZPS_HOST_LEFT) or a follower's question (ZPS_HOST_ASK).
void zps_host_ack_header(const zps_client *c, uint32_t rank, uint64_t step, uint32_t flags,
                         Zps__Header *a);

#endif
