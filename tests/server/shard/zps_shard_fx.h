/* zps_shard_fx.h - the shard suites' shared fixture (check_shard,
 * check_shard_outer, check_shard_host, check_shard_io): the small model,
 * the two-rank plan, PUSH messages as zps_wire_recv returns them (a host
 * leader's with its pieces), and a shard's parameters read back.
 *
 * The model is mlp:1-2-1 (7 parameters). The batch of 40 is rank 0's
 * (member 11) [0, 10) and rank 1's (member 22) [10, 40), generation 1. */
#ifndef ZPS_SHARD_FX_H
#define ZPS_SHARD_FX_H

#include <stddef.h>
#include <stdint.h>

#include "common/zps_model.h"
#include "common/zps_wire.h"
#include "server/shard/zps_shard.h"

#define ZPS_SHARD_FX_BATCH 40

// Of rank r: its slice's offset and count in the batch, and its member id.
extern const uint32_t zps_shard_fx_offset[2], zps_shard_fx_count[2];
extern const uint64_t zps_shard_fx_id[2];

// mlp:1-2-1.
zps_model_spec zps_shard_fx_model(void);
// Adds the two-rank plan to s, generation 1 from step 0.
void zps_shard_fx_add_plan(zps_shard *s);
// Makes *m a message as zps_wire_recv returns it: h through its wire
// encoding and one payload frame of bytes, whose data it returns for the
// caller to fill. A small frame's data lies inside *m itself (zmq keeps
// short messages inline), so fill it before m is copied or moved.
uint8_t *zps_shard_fx_msg(zps_wire_msg *m, const Zps__Header *h, size_t bytes);
// A host leader's piece: rank's samples [offset, +samples) of the batch.
typedef struct zps_shard_fx_piece {
    uint32_t rank, offset, samples;
} zps_shard_fx_piece;
// Makes *m a PUSH of step 0, generation 1, from rank (member id id) of the
// slice [batch_offset, +samples), carrying n host pieces (none: a plain
// push) and count f32 values of parameters [off, +count).
void zps_shard_fx_push(zps_wire_msg *m, uint32_t rank, uint64_t id, uint32_t batch_offset,
                       uint32_t samples, const zps_shard_fx_piece *pieces, size_t n,
                       uint64_t off, uint64_t count, const float *vals);
// The shard's current f32 parameters, out[i] holding parameter base + i.
void zps_shard_fx_params(zps_shard *s, uint64_t base, float *out);

#endif
