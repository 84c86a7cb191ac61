/* zps_round.h - a worker's outer round of --mode diloco: the parameters
 * at its start (theta_sync), the pseudo-gradient delta = theta_sync -
 * theta_local once the inner steps are done, and what goes to the shards
 * of it: each range (a bucket cut to a shard) in fp32, or compressed with
 * the error feedback kept here (common/zps_quant.h), so the part of a
 * round's delta a push did not carry is added to the next one's.
 *
 * The payloads stay as they are until the next zps_round_delta, so a push
 * refused "not yet" is sent again with the same bytes (its residual is
 * already kept) and ZeroMQ reads them zero-copy. */
#ifndef ZPS_ROUND_H
#define ZPS_ROUND_H

#include <stddef.h>
#include <stdint.h>

#include "common/zps_err.h"
#include "common/zps_quant.h"

typedef struct zps_round {
    size_t n;             // P, floats of the flat vector
    int compress;         // a zps_quant_kind; 0: fp32
    float *sync;          // owned: theta at the round's start
    float *delta;         // owned: its pseudo-gradient (the fp32 payloads)
    zps_quant_ef *ef;     // owned, compressed: the residual
    uint8_t *enc;         // owned, compressed: every range's encoding, in range order
    int n_ranges;
    uint64_t *lo, *hi;    // owned: the ranges [lo, hi), disjoint, in push order
    size_t *at, *len;     // owned: their payloads' offsets (in enc, or in delta's bytes), bytes
    double norm;          // ||delta|| of the last zps_round_delta
    uint64_t bytes;       // the payload bytes of all ranges
} zps_round;

// A round over n floats, pushed as the n_ranges ranges [lo[k], hi[k]),
// compressed as `compress` (0: fp32). ZPS_ENOMEM or ZPS_EINVAL, logged;
// *r is then safe for zps_round_fini.
zps_err zps_round_init(zps_round *r, size_t n, int compress, const uint64_t *lo,
                       const uint64_t *hi, int n_ranges);
// Safe on zeroed memory and after a failed init.
void zps_round_fini(zps_round *r);

// The round starts from params (theta_sync := params).
void zps_round_begin(zps_round *r, const float *params);
// The inner steps are done at params: the delta, its norm, and (compressed)
// the encodings, the residual kept. ZPS_EINVAL, logged, if the delta is
// not finite or too large to encode: a diverged worker's is not sent.
zps_err zps_round_delta(zps_round *r, const float *params);
// Range k's payload as zps_round_delta left it.
void zps_round_payload(const zps_round *r, int k, const void **data, size_t *len);
// Forgets the residual: theta_sync was set anew without the last push
// counted (a rollback, a rejoin).
void zps_round_reset_feedback(zps_round *r);

#endif
