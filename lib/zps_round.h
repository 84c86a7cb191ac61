/* zps_round.h - a worker's outer round of --mode diloco: the parameters
 * at its start (theta_sync), the pseudo-gradient delta = theta_sync -
 * theta_local once the inner steps are done, and what goes to the shards
 * of it: each range (a bucket cut to a shard) in fp32, or compressed with
 * the error feedback kept here (common/zps_quant.h), so the part of a
 * round's delta a push did not carry is added to the next one's.
 *
 * The payloads stay as they are until the next zps_round_delta, so a push
 * refused "not yet" is sent again with the same bytes (its residual is
 * already kept) and ZeroMQ reads them zero-copy.
 *
 * With --fragments each range is of one fragment, and theta_sync, the
 * delta and the payloads of a fragment are taken on their own: a step
 * exchanges one fragment (common/zps_outer.h). */
#ifndef ZPS_ROUND_H
#define ZPS_ROUND_H

#include <stdbool.h>
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
    uint8_t *frag;        // owned: each range's fragment
    size_t *at, *len;     // owned: their payloads' offsets (in enc, or in delta's bytes), bytes
    double norm;          // ||delta|| of the last zps_round_delta
    uint64_t bytes;       // the payload bytes of all ranges
} zps_round;

// A round over n floats, pushed as the n_ranges ranges [lo[k], hi[k]) of
// fragments frag[k] (NULL: all 0), compressed as `compress` (0: fp32).
// ZPS_ENOMEM or ZPS_EINVAL, logged; *r is then safe for zps_round_fini.
zps_err zps_round_init(zps_round *r, size_t n, int compress, const uint64_t *lo,
                       const uint64_t *hi, const uint8_t *frag, int n_ranges);

// What zps_round_begin and zps_round_delta take: every range, or the
// ranges of one fragment (>= 0).
#define ZPS_ROUND_ALL (-1)
// Safe on zeroed memory and after a failed init.
void zps_round_fini(zps_round *r);

// The round starts from params (theta_sync := params), in every range or
// in fragment frag's.
void zps_round_begin(zps_round *r, const float *params, int frag);
// The inner steps are done at params: the delta, its norm, and (compressed)
// the encodings, the residual kept, of every range or fragment frag's (the
// others keep theirs). ZPS_EINVAL, logged, if the delta is not finite or
// too large to encode: a diverged worker's is not sent.
zps_err zps_round_delta(zps_round *r, const float *params, int frag);
// Whether range k is one that frag (a fragment or ZPS_ROUND_ALL) takes.
bool zps_round_has(const zps_round *r, int k, int frag);
// The payload bytes of every range, or of fragment frag's.
uint64_t zps_round_bytes(const zps_round *r, int frag);
// Range k's payload as zps_round_delta left it.
void zps_round_payload(const zps_round *r, int k, const void **data, size_t *len);
// Forgets the residual: theta_sync was set anew without the last push
// counted (a rollback, a rejoin).
void zps_round_reset_feedback(zps_round *r);

#endif
