/* zps_fuzz.h - what the message-path fuzz target (zps_fuzz_msg.c) and its
 * seed generator (zps_fuzz_seeds.c) must agree on: the input format and
 * the fixed job the inputs are fed to.
 *
 * An input is one byte of job configuration followed by messages, read
 * until the input ends (little-endian; every length is cut to what is left,
 * so any input decodes to some sequence of messages):
 *
 *   config   u8   bits 0-1: wire dtype (1 bf16, 2 fp16, else fp32)
 *                 bits 2-3: the range served (see zps_fuzz_range)
 *                 bits 4-7: global batch - 2
 *   message  u16  header length H, then H bytes: a packed zps.Header
 *            u8   frame count F; more than ZPS_WIRE_MAX_FRAMES is dropped
 *                 as zps_wire_recv drops it
 *            F x  u16 frame length L (bit 15: the frame points into the
 *                 input at its own, unaligned offset, as ZeroMQ's decoder
 *                 hands out small frames; else it is a fresh zmq_msg of
 *                 its own), then L bytes
 *
 * The job is fixed and small, so that short inputs reach every state: the
 * model mlp:4-3-2 (23 parameters, two buckets), a plan of two members that
 * split the global batch, plan generation 1 from step 0. */
#ifndef ZPS_FUZZ_H
#define ZPS_FUZZ_H

#include <stdint.h>

#include "common/zps_dtype.h"
#include "common/zps_model.h"

#define ZPS_FUZZ_MODEL "mlp:4-3-2"
#define ZPS_FUZZ_SEED 7                 // initial parameters
#define ZPS_FUZZ_MEMBER0 0x11u          // member ids of the first plan, in rank order
#define ZPS_FUZZ_MEMBER1 0x22u
#define ZPS_FUZZ_FRAME_UNALIGNED 0x8000u // frame length flag, see above
#define ZPS_FUZZ_FRAME_LEN 0x7fffu

static inline zps_dtype zps_fuzz_dtype(uint8_t config)
{
    switch (config & 3u) {
    case 1:
        return ZPS_DTYPE_BF16;
    case 2:
        return ZPS_DTYPE_F16;
    default:
        return ZPS_DTYPE_F32;
    }
}

// The range of the flat vector the shard serves: the whole model, either
// half, or the middle third (which starts and ends inside layer 0).
static inline void zps_fuzz_range(uint8_t config, const zps_model_spec *m, uint32_t *index,
                                  uint64_t *lo, uint64_t *hi)
{
    static const uint32_t shard[4] = {0, 0, 1, 1}, shards[4] = {1, 2, 2, 3};
    uint32_t k = (config >> 2) & 3u;
    *index = shard[k];
    zps_model_shard_range(m->n_params, shard[k], shards[k], lo, hi);
}

static inline uint32_t zps_fuzz_global_batch(uint8_t config)
{
    return 2u + (config >> 4);
}

#endif
