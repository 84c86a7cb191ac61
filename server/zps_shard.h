/* zps_shard.h - one shard: a range [lo, hi) of the flat parameter vector,
 * its optimizer state and one gradient accumulator.
 *
 * The shard is plain state and arithmetic, no sockets: the server loop
 * feeds it validated pushes and sends what it returns. A step is complete
 * when every member of the plan has covered the whole range; the update is
 * then g = sum(n_i * g_i) / sum(n_i), exact for any split of the global
 * batch (DESIGN.md, "Weighted averaging"). */
#ifndef ZPS_SHARD_H
#define ZPS_SHARD_H

#include <stdbool.h>
#include <stdint.h>

#include "common/zps_err.h"
#include "common/zps_optim.h"
#include "common/zps_plan.h"
#include "common/zps_wire.h"

typedef struct zps_shard zps_shard;

// A shard of [lo, hi) starting from init (hi - lo floats, copied). Caller
// owns the result; NULL on failure, logged.
zps_shard *zps_shard_new(uint32_t index, uint64_t lo, uint64_t hi, const zps_optim_cfg *optim,
                         const float *init);
void zps_shard_destroy(zps_shard **s);

uint64_t zps_shard_lo(const zps_shard *s);
uint64_t zps_shard_hi(const zps_shard *s);
// Steps completed: the step the shard accumulates now.
uint64_t zps_shard_step(const zps_shard *s);

// The parameters of the current step (hi - lo floats, borrowed), and the
// reference to pass to zps_wire_send to send them zero-copy. They do not
// change until the next zps_shard_apply.
const float *zps_shard_params(const zps_shard *s);
zps_wire_ref *zps_shard_params_ref(zps_shard *s);

// The plan of the current and later steps. Contributions already counted
// for the current step are kept only for members still in it.
void zps_shard_set_plan(zps_shard *s, const zps_plan *plan);

// Counts a PUSH (header + payload). Refuses, with the reason in why and
// the parameters untouched, in this order: a tensor of the wrong shape
// (ZPS_EPROTO) or out of range (ZPS_ERANGE), a push for another step
// (ZPS_ESTALE), from a rank or member id not in the plan (ZPS_ENOENT), with
// a sample count other than the planned one (ZPS_EPROTO), or overlapping
// what that rank already pushed this step (ZPS_EDUP).
zps_err zps_shard_push(zps_shard *s, const zps_wire_msg *m, char *why, size_t why_len);

// True when every planned member covered [lo, hi) this step.
bool zps_shard_ready(const zps_shard *s);
// True when the rank covered [lo, hi) this step.
bool zps_shard_rank_done(const zps_shard *s, uint32_t rank);

// Applies the step: averages, runs the optimizer with the step's learning
// rate, advances the step and clears the accumulator. Returns the step's
// sample-weighted mean loss.
float zps_shard_apply(zps_shard *s);

#endif
