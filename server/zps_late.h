/* zps_late.h - slices a step waits for: speculation hands them, in pieces,
 * to the members that are done (the first copy of a sample counts), and
 * stall warnings name who is being waited for.
 *
 * Shard 0 only for speculation (the coordinator hands the pieces out);
 * any shard for the warnings. What a rank has sent this step comes from
 * the shard's I/O (server/shard/zps_shard_io.h), which keeps the late_now marks. */
#ifndef ZPS_LATE_H
#define ZPS_LATE_H

#include <stdint.h>

#include "server/coord/zps_coord.h"
#include "server/shard/zps_shard_io.h"

// zps_late_speculate hands on the slices late at `now` of the step in
// progress (--speculate-after `after` median steps), each once a step.
void zps_late_speculate(zps_shard_io *io, zps_coord *coord, zps_outbox *out, double after, double now);
// zps_late_speculate_ahead, at the start of `step`: a rank late on the
// step before that sent nothing during it has its slice handed at once.
void zps_late_speculate_ahead(zps_shard_io *io, zps_coord *coord, zps_outbox *out, double after,
                              uint64_t step, uint64_t total_steps);
// zps_late_warn_stall logs a line for each slice the step in progress
// still misses (host and device from the coordinator, if there is one), the
// first ZPS_LATE_WARN_RANKS of them, and one line counting the rest: a
// line for each of thousands of members, every few seconds, kept the loop
// writing the log instead of answering them (bench/swarm at 4096).
#define ZPS_LATE_WARN_RANKS 8
void zps_late_warn_stall(const zps_shard_io *io, const zps_coord *coord, double step_start_ms,
                         double now);

#endif
