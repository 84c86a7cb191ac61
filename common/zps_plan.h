/* zps_plan.h - who computes which part of a step's global batch.
 *
 * The coordinator makes a plan; shards use it to know which pushes make a
 * step complete; workers use it to find their slice. Members are in rank
 * order and their slices tile [0, global_batch) in that order. */
#ifndef ZPS_PLAN_H
#define ZPS_PLAN_H

#include <stdint.h>

#include "proto/zps.pb-c.h"
#include "zps_err.h"

#define ZPS_MAX_MEMBERS 256
#define ZPS_MAX_SHARDS 64

typedef struct zps_plan_slice {
    uint32_t rank;      // member rank
    uint64_t member_id; // the id the member's pushes must carry
    uint32_t offset;    // first sample of the global batch
    uint32_t count;     // samples
    uint32_t inner_steps; // --mode diloco: the member's inner steps per round (0: the job's H)
} zps_plan_slice;

typedef struct zps_plan {
    uint32_t global_batch;                    // B, the sum of the counts
    uint32_t n;                               // members
    zps_plan_slice slices[ZPS_MAX_MEMBERS];   // in rank order
} zps_plan;

// Splits B among n members: member i with shares[i] > 0 gets exactly that
// many samples, the others split the rest evenly (the lower ranks take the
// remainder). ZPS_EINVAL with the reason in why if that cannot be done.
zps_err zps_plan_split(uint32_t global_batch, const uint32_t *shares, uint32_t n, zps_plan *out,
                       char *why, size_t why_len);

// The plan's slice of a rank, or NULL.
const zps_plan_slice *zps_plan_find(const zps_plan *p, uint32_t rank);

// Converts to and from the wire's Slice list. from_wire checks that the
// slices tile [0, global_batch) in rank order.
zps_err zps_plan_from_wire(Zps__Slice *const *slices, size_t n, uint32_t global_batch,
                           zps_plan *out);

#endif
