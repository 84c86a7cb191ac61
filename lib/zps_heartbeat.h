/* zps_heartbeat.h - tells the coordinator this worker is alive.
 *
 * A thread with its own DEALER socket sends HEARTBEAT every interval, so
 * a long compute step does not make a healthy worker look dead. It shares
 * nothing with the main thread but a stop flag. */
#ifndef ZPS_HEARTBEAT_H
#define ZPS_HEARTBEAT_H

#include <stdint.h>

#include "common/zps_curve.h"

typedef struct zps_heartbeat zps_heartbeat;

// Starts beating to the coordinator at endpoint. Caller owns the result
// (zps_heartbeat_stop); NULL on failure, logged.
zps_heartbeat *zps_heartbeat_start(void *ctx, const char *endpoint, const zps_curve *curve,
                                   uint64_t job_id, uint32_t rank, uint64_t member_id,
                                   int interval_ms);
// Stops the thread (it wakes at once), waits for it and frees.
void zps_heartbeat_stop(zps_heartbeat **hb);

#endif
