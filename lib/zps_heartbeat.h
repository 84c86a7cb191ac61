/* zps_heartbeat.h - tells the coordinator this worker is alive.
 *
 * A thread with its own DEALER socket sends HEARTBEAT when the coordinator
 * has heard nothing else from this member for an interval, so a long
 * compute step does not make a healthy worker look dead. What else counts
 * is the main thread's to say (zps_heartbeat_heard): a push to shard 0,
 * which the coordinator takes as a sign of life, or its part taken by its
 * host's leader, whose push names it (docs/choices.md, "Thousands of
 * members"). A member whose steps are shorter than the interval then
 * beats not at all, and the coordinator of thousands of members does not
 * read thousands of beats a second. Nor when steps are long: the interval
 * stretches to two usual steps (zps_heartbeat_interval), since beats that
 * came at every interval of a long step cost the coordinator in proportion
 * to the step, which on a few cores grows with the members (4096 on a
 * 2-core VM: 1.77 s of its CPU a step of 4 s, against 0.04 s). It shares
 * nothing with the main thread but a stop flag, that time and the
 * interval. */
#ifndef ZPS_HEARTBEAT_H
#define ZPS_HEARTBEAT_H

#include <stdbool.h>
#include <stdint.h>

#include "common/zps_curve.h"

typedef struct zps_heartbeat zps_heartbeat;

// Starts beating to the coordinator at endpoint. Caller owns the result
// (zps_heartbeat_stop); NULL on failure, logged.
zps_heartbeat *zps_heartbeat_start(void *ctx, const char *endpoint, const zps_curve *curve,
                                   uint64_t job_id, uint32_t rank, uint64_t member_id,
                                   int interval_ms);
// The coordinator heard from this member now by other means: the next beat
// is due an interval from now. NULL: nothing to do.
void zps_heartbeat_heard(zps_heartbeat *hb);
// The interval a member beats at: base_ms, or twice its usual step where
// that is longer (heard once a step, by its push to shard 0 or its
// leader's HOST_ACK, it then beats not at all while steps keep their
// length), at most a quarter of the coordinator's worker timeout (four
// beats before an eviction; 0: not known, base_ms), never under base_ms.
int zps_heartbeat_interval(int base_ms, double usual_step_ms, double worker_timeout_ms);
// The thread's interval from now on: counted from its next wake (no wake
// now: thousands of members set it every step).
void zps_heartbeat_set_interval(zps_heartbeat *hb, int interval_ms);
// Whether a beat is due at now_ms, the last having gone out at beat_ms and
// the coordinator having heard otherwise at heard_ms.
bool zps_heartbeat_due(double now_ms, double beat_ms, double heard_ms, int interval_ms);
// Stops the thread (it wakes at once), waits for it and frees.
void zps_heartbeat_stop(zps_heartbeat **hb);

#endif
