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

// Members of a job at most: ranks index fixed tables in the coordinator and
// in each shard (about 0.7 MiB a shard at this size, touched only as far as
// the highest rank in use); bench/swarm measures the control plane to here.
// Plans are sized by their members, not by this.
#define ZPS_MAX_MEMBERS 4096
#define ZPS_MAX_SHARDS 64
// Members of one host's group at most (proto HostGroup): a host with more
// is cut into groups of consecutive ranks, each with its own leader.
#define ZPS_HOST_GROUP_MAX 64

typedef struct zps_plan_slice {
    uint32_t rank;      // member rank
    uint64_t member_id; // the id the member's pushes must carry
    uint32_t offset;    // first sample of the global batch
    uint32_t count;     // samples
    uint32_t inner_steps; // --mode diloco: the member's inner steps per round (0: the job's H)
} zps_plan_slice;

// A plan owns its slices: zero it (or zps_plan_fini it) before the first
// call that fills it, and zps_plan_fini it when done. A plan is copied with
// zps_plan_copy, never by assignment.
typedef struct zps_plan {
    uint32_t global_batch;   // B, the sum of the counts
    uint32_t n;              // members
    zps_plan_slice *slices;  // owned: n of them, in rank order (ranks strictly increasing)
} zps_plan;

// Frees the slices; the plan is empty (and zeroed) after. Safe on zeroed
// memory and twice.
void zps_plan_fini(zps_plan *p);
// dst becomes a copy of src (dst's old slices are freed); ZPS_ENOMEM and
// dst empty if it cannot.
zps_err zps_plan_copy(zps_plan *dst, const zps_plan *src);

// Splits B among n members: member i with shares[i] > 0 gets exactly that
// many samples, the others split the rest evenly (the lower ranks take the
// remainder). ZPS_EINVAL with the reason in why if that cannot be done.
zps_err zps_plan_split(uint32_t global_batch, const uint32_t *shares, uint32_t n, zps_plan *out,
                       char *why, size_t why_len);

// --deterministic --micro-batch m: a member's share in whole micro-batches,
// rounded to the nearest (halves up), at least one. m = 0 or share = 0
// (no fixed share): as it is.
uint32_t zps_plan_round_share(uint32_t share, uint32_t micro);

// zps_plan_split in whole micro-batches of `micro` (0: zps_plan_split
// itself): B and every fixed share must be multiples of it (rounded with
// zps_plan_round_share first), and the others split the micro-batches
// left evenly, the lower ranks taking the remainder (B = 64, M = 8, three
// members: 24, 24, 16). ZPS_EINVAL with the reason in why otherwise.
zps_err zps_plan_split_micro(uint32_t global_batch, uint32_t micro, const uint32_t *shares,
                             uint32_t n, zps_plan *out, char *why, size_t why_len);

// Piece i of k of [offset, offset + count), cut at whole micro-batches of
// `micro` from offset (0: at samples): [*lo, *hi). k must be at most
// zps_plan_max_pieces; the pieces tile the range, none empty.
void zps_plan_piece(uint32_t offset, uint32_t count, uint32_t micro, uint32_t i, uint32_t k,
                    uint32_t *lo, uint32_t *hi);
// How many pieces [offset, offset + count) can make: its micro-batches
// (its samples with micro 0).
uint32_t zps_plan_max_pieces(uint32_t count, uint32_t micro);

// The plan's slice of a rank, or NULL (a binary search: slices are in rank
// order).
const zps_plan_slice *zps_plan_find(const zps_plan *p, uint32_t rank);

// Converts to and from the wire's Slice list. from_wire checks that the
// slices tile [0, global_batch) in strictly increasing rank order, each
// rank below ZPS_MAX_MEMBERS.
zps_err zps_plan_from_wire(Zps__Slice *const *slices, size_t n, uint32_t global_batch,
                           zps_plan *out);
// A worker's part of a plan: the coordinator sends a worker its own slice
// (none if the generation leaves it out), not every member's. Each slice
// must lie in [0, global_batch), ranks strictly increasing and below
// ZPS_MAX_MEMBERS; they need not tile the batch. ZPS_EPROTO otherwise.
zps_err zps_plan_part_from_wire(Zps__Slice *const *slices, size_t n, uint32_t global_batch,
                                zps_plan *out);

#endif
