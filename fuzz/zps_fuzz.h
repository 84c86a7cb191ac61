/* zps_fuzz.h - what the message-path fuzz target (zps_fuzz_msg.c) and its
 * seed generator (zps_fuzz_seeds.c) must agree on: the input format and
 * the fixed job the inputs are fed to.
 *
 * The target runs a real zps server (server/zps_server.h: the daemon's
 * own receive path, message table and handlers) on inproc sockets, and
 * plays its peers. An input is one byte of job configuration followed by
 * messages, read until the input ends (little-endian; every length is cut
 * to what is left, so any input decodes to some sequence of messages):
 *
 *   config   u8   bits 0-1: wire dtype (1 bf16, 2 fp16, else fp32; 3 is
 *                           fp32 with --wire-code zstd: coded pushes decoded)
 *                 bits 2-3: the server and how far the job is when the
 *                           messages begin (see zps_fuzz_stage)
 *                 bits 4-7: global batch - 2
 *   message  u8   the peer that sends it (zps_fuzz_peer), bits 0-1
 *            u16  header length H, then H bytes: a packed zps.Header, sent
 *                 as is if it does not decode; if it does, the placeholders
 *                 below are first replaced by what that peer really holds
 *            u8   frame count F (more than ZPS_WIRE_MAX_FRAMES are sent:
 *                 the server must refuse them)
 *            F x  u16 frame length L (bit 15 is ignored; kept so that
 *                 older inputs still read), then L bytes
 *
 * Placeholders: the job's id, the member ids and the shard token are drawn
 * from getrandom by the server, so inputs name them: a header from a
 * worker peer with job_id ZPS_FUZZ_JOB gets the real job id, one with
 * member_id ZPS_FUZZ_MEMBER0/1 the id that peer was admitted with; a
 * header from the shard peer with shard_token ZPS_FUZZ_TOKEN gets its
 * token. The stranger's headers are sent exactly as they are: it holds
 * nothing, and nothing it sends may change the job.
 *
 * The job is fixed and small, so that short inputs reach every state: the
 * model mlp:4-3-2 (23 parameters, two buckets), 2 shards, 2 workers, a
 * synthetic dataset, 16 steps. */
#ifndef ZPS_FUZZ_H
#define ZPS_FUZZ_H

#include <stdbool.h>
#include <stdint.h>

#include "common/zps_dtype.h"

#define ZPS_FUZZ_MODEL "mlp:4-3-2"
#define ZPS_FUZZ_DATASET "synthetic:48" // 8 test records
#define ZPS_FUZZ_STEPS 16
#define ZPS_FUZZ_SEED 7
#define ZPS_FUZZ_JOB 0x5eedull          // placeholders, see above
#define ZPS_FUZZ_MEMBER0 0x11ull
#define ZPS_FUZZ_MEMBER1 0x22ull
#define ZPS_FUZZ_TOKEN 0x70ce11ull
#define ZPS_FUZZ_FRAME_LEN 0x7fffu

// Who sends a message.
typedef enum zps_fuzz_peer {
    ZPS_FUZZ_WORKER0 = 0,  // a worker (admitted in the training stages)
    ZPS_FUZZ_WORKER1 = 1,
    ZPS_FUZZ_SHARD = 2,    // shard 1 to a coordinator; the coordinator to a shard 1
    ZPS_FUZZ_STRANGER = 3, // never admitted, never registered
} zps_fuzz_peer;

// The server under test, and how far the job is before the input's messages.
typedef enum zps_fuzz_stage {
    ZPS_FUZZ_WAITING = 0,    // shard 0, nobody has called yet
    ZPS_FUZZ_REGISTERED = 1, // shard 0, shard 1 registered, no worker yet
    ZPS_FUZZ_TRAINING = 2,   // shard 0, shard 1 assigned and ready, both workers admitted
    ZPS_FUZZ_SHARD1 = 3,     // shard 1, assigned by the coordinator peer; workers hold ids
} zps_fuzz_stage;

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

// Whether the job codes its pushes and answers (--wire-code zstd).
static inline bool zps_fuzz_coded(uint8_t config)
{
    return (config & 3u) == 3u;
}

static inline zps_fuzz_stage zps_fuzz_stage_of(uint8_t config)
{
    return (zps_fuzz_stage)((config >> 2) & 3u);
}

static inline uint32_t zps_fuzz_global_batch(uint8_t config)
{
    return 2u + (config >> 4);
}

#endif
