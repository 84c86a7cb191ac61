/* zps_shard.h - one shard: a range [lo, hi) of the flat parameter vector,
 * its optimizer state and one gradient accumulator.
 *
 * The shard is plain state and arithmetic, no sockets: the server loop
 * feeds it pushes and sends what it says is ready. Work is done per bucket
 * (a layer cut to the range): a bucket is updated as soon as every member
 * of the plan pushed it, with g = sum(n_i * g_i) / sum(n_i), exact for any
 * split of the global batch (DESIGN.md, "Weighted averaging"), and its new
 * parameters can go out while later buckets are still being pushed. */
#ifndef ZPS_SHARD_H
#define ZPS_SHARD_H

#include <stdbool.h>
#include <stdint.h>

#include "common/zps_dtype.h"
#include "common/zps_err.h"
#include "common/zps_model.h"
#include "common/zps_optim.h"
#include "common/zps_plan.h"
#include "common/zps_wire.h"

typedef struct zps_shard zps_shard;

typedef struct zps_shard_cfg {
    uint32_t index;            // shard number
    uint64_t lo, hi;           // the range owned
    const zps_model_spec *model; // borrowed: for the buckets and the initial values
    uint64_t seed;             // initial values
    zps_dtype dtype;           // element type of pushes and replies on the wire
    zps_optim_cfg optim;       // settings and schedule
} zps_shard_cfg;

// Caller owns the result; NULL on failure, logged.
zps_shard *zps_shard_new(const zps_shard_cfg *cfg);
void zps_shard_destroy(zps_shard **s);

uint64_t zps_shard_lo(const zps_shard *s);
uint64_t zps_shard_hi(const zps_shard *s);
// Steps completed: the step the shard accumulates now.
uint64_t zps_shard_step(const zps_shard *s);
int zps_shard_n_buckets(const zps_shard *s);

// The plan of the current and later steps. Contributions already counted
// for the current step are kept only for members still in it.
void zps_shard_set_plan(zps_shard *s, const zps_plan *plan);

// Counts a PUSH (header + payload) of one bucket. Refuses, with the reason
// in why and the parameters untouched, in this order: a tensor of the wrong
// shape or dtype (ZPS_EPROTO) or out of range (ZPS_ERANGE), a push for
// another step (ZPS_ESTALE), from a rank or member id not in the plan
// (ZPS_ENOENT), with a sample count other than the planned one or a range
// that is not one bucket (ZPS_EPROTO), or a bucket that rank already pushed
// this step (ZPS_EDUP). On success *ready is the bucket now pushed by every
// member (to update with zps_shard_apply), or -1.
zps_err zps_shard_push(zps_shard *s, const zps_wire_msg *m, int *ready, char *why,
                       size_t why_len);

// Updates a ready bucket with the step's learning rate. Once every bucket
// is updated the step is over: zps_shard_step_done says so.
void zps_shard_apply(zps_shard *s, int bucket);
bool zps_shard_step_done(const zps_shard *s);
// Closes a done step: advances the step, returns its sample-weighted mean loss.
float zps_shard_end_step(zps_shard *s);

// True when the rank pushed every bucket this step.
bool zps_shard_rank_done(const zps_shard *s, uint32_t rank);

// Where bucket b's current parameters are, in the wire dtype: *data
// (borrowed, unchanged until the bucket is next updated), its range, and
// the reference to pass to zps_wire_send to send them zero-copy.
void zps_shard_bucket_params(zps_shard *s, int b, const void **data, uint64_t *offset,
                             uint64_t *count, zps_wire_ref **ref);

#endif
