/* zps_shard_io.h - the shard's side of the wire: PUSH, PULL and INIT from
 * the members, the parameters sent back bucket by bucket, pushes held for
 * a plan not heard of yet, and PULLs waiting for a step not reached yet.
 *
 * server/shard/zps_shard.c keeps the numbers and knows no socket; this module is
 * the I/O around it: it sends on the socket it is given, and keeps what it
 * knows of each rank in one table (zps_shard_io_rank). What a push means to
 * the coordinator (its timing, the step boundary, the end of a step) stays
 * with the loop (server/zps_server.c), which calls zps_shard_io_apply and
 * zps_shard_io_end_step at the right moments. */
#ifndef ZPS_SHARD_IO_H
#define ZPS_SHARD_IO_H

#include <stdbool.h>
#include <stdint.h>

#include "common/zps_dtype.h"
#include "common/zps_model.h"
#include "common/zps_plan.h"
#include "common/zps_wire.h"
#include "common/zps_zcode.h"
#include "server/shard/zps_shard.h"
#include "server/shard/zps_shard_shm.h"

#define ZPS_SHARD_IO_HELD 32    // pushes of a plan not heard of yet, kept until it arrives
#define ZPS_SHARD_IO_PULLERS 32 // PULLs waiting for a step not reached yet

// What the I/O knows of one rank, for the step in progress.
typedef struct zps_shard_io_rank {
    zmq_msg_t route;  // where its PARAMS go (valid while has_route)
    bool has_route;   // route is initialised
    bool pushed;      // pushed this step: send it each bucket as it is updated
    uint64_t served;  // step it was sent, as to a PULL, after a late push (each once)
    bool heard;       // pushed or pulled during this step (for any step)
    bool late_now;    // its slice was handed on this step (speculation)
    uint32_t own_in;  // buckets of its own slice counted this step
    bool shm_params;  // its last push came through shared memory: parameters too
    bool shm_whole;   // this step: in one PARAMS once every bucket is in (params_whole)
    bool noticed;     // this step: a bucket's own notice went to it (the first applied)
    // Its last push's code_base (--wire-code): 1 + the step whose
    // parameters of the range it holds as received (0: none, or uncoded).
    uint64_t code_base;
} zps_shard_io_rank;

// A PULL for parameters not there yet: answered bucket by bucket as they are.
typedef struct zps_shard_io_puller {
    zmq_msg_t route;     // who asked
    uint64_t step;       // for which step
    zps_bucket_set sent; // buckets already sent
    bool used;           // slot taken
} zps_shard_io_puller;

// What the I/O asks of the server around it.
typedef struct zps_shard_io_hooks {
    void *arg; // borrowed: the hooks' argument
    // Refuses a message: counted, logged, answered (the server's refusal).
    void (*refuse)(void *arg, zps_wire_msg *m, zps_err err, const char *why);
    // The job id to put on the parameters sent.
    uint64_t (*job_id)(void *arg);
    // A held push, once its plan came: through the message table again.
    void (*again)(void *arg, zps_wire_msg *m);
} zps_shard_io_hooks;

typedef struct zps_shard_io {
    void *sock;                           // borrowed: the ROUTER members reach
    zps_shard *shard;                     // borrowed: NULL until the first plan
    uint32_t index;                       // this shard's index
    zps_dtype dtype;                      // tensors on the wire
    zps_shard_io_hooks hooks;             // the server's side
    zps_shard_io_rank ranks[ZPS_MAX_MEMBERS]; // indexed by rank
    uint32_t n_ranks;                     // 1 + the highest rank with state: walks stop there
    uint32_t n_in;                        // ranks with all of their own slice counted
    double quorum_ms;                     // when as many slices were in as not, or 0
    zps_wire_msg *held;                   // owned: ZPS_SHARD_IO_HELD pushes on hold
    int n_held;                           // of them in use
    bool replay_held;                     // a plan arrived: count the held pushes
    zps_shard_io_puller pullers[ZPS_SHARD_IO_PULLERS]; // PULLs waiting for a step
    zps_shard_shm shm;                    // pushes through shared memory (same host)
    zps_zcode *code;                      // owned: --wire-code's coder (NULL until the job
                                          // codes or a coded push came)
    zps_wire_msg coded;                   // owned: bucket coded_b's answer of coded_step, coded
    int coded_b;                          // (-1: none) coded once, sent to every rank it fits
    uint64_t coded_step;
    uint64_t coded_sent, coded_bytes, coded_of; // answers sent coded, their bytes, uncoded
} zps_shard_io;

// Rank r's state (r < ZPS_MAX_MEMBERS, checked by the caller), counted in
// the per-step walks from now on.
zps_shard_io_rank *zps_shard_io_rank_of(zps_shard_io *io, uint32_t r);

// zps_shard_io_init readies an embedded io for `sock`; ZPS_ENOMEM if the
// room for held pushes cannot be had. zps_shard_io_fini is safe on zeroed
// memory and closes every route it keeps.
zps_err zps_shard_io_init(zps_shard_io *io, void *sock, uint32_t index,
                          const zps_shard_io_hooks *hooks);
void zps_shard_io_fini(zps_shard_io *io);
// zps_shard_io_start: the shard (borrowed) has its first plan; members'
// messages are served from now on.
void zps_shard_io_start(zps_shard_io *io, zps_shard *shard, zps_dtype dtype);
// zps_shard_io_code: the job codes its pushes and answers (--wire-code
// zstd); ZPS_ENOMEM (logged) if the coder cannot be had.
zps_err zps_shard_io_code(zps_shard_io *io);
// zps_shard_io_started says whether the shard has had its first plan.
bool zps_shard_io_started(const zps_shard_io *io);

// zps_shard_io_on_pull answers a PULL with what there is, and keeps it
// waiting for the rest.
void zps_shard_io_on_pull(zps_shard_io *io, zps_wire_msg *m);
// zps_shard_io_on_push takes a PUSH: ZPS_OK counted, ZPS_EDUP a second
// copy (dropped, its sender still gets the step's parameters), anything
// else held or refused (and already answered). *ready: the bucket the push
// completed (zps_shard_io_apply it), or -1.
zps_err zps_shard_io_on_push(zps_shard_io *io, zps_wire_msg *m, int *ready);
// zps_shard_io_apply updates bucket b and sends it to the step's pushers
// and to the PULLs that wait for it.
void zps_shard_io_apply(zps_shard_io *io, int b);
// zps_shard_io_on_init takes rank 0's initial values of a declared model.
void zps_shard_io_on_init(zps_shard_io *io, zps_wire_msg *m);

// zps_shard_io_own_in says whether rank r's own slice is in.
bool zps_shard_io_own_in(const zps_shard_io *io, uint32_t r);
// zps_shard_io_between_steps: no bucket of the step in progress is updated
// yet, so parameters and momentum are those after the completed steps.
bool zps_shard_io_between_steps(const zps_shard_io *io);

// zps_shard_io_end_step forgets the per-rank state of the step just done.
void zps_shard_io_end_step(zps_shard_io *io);
// zps_shard_io_forget_step forgets the step in progress after a restore:
// it is replayed, and PULLs that arrived before the rollback are served.
void zps_shard_io_forget_step(zps_shard_io *io);
// zps_shard_io_plan_added: a new plan reached the shard; the held pushes
// are counted by zps_shard_io_replay, from the loop.
void zps_shard_io_plan_added(zps_shard_io *io);
// zps_shard_io_replay sends the held pushes through hooks.again, if a plan
// came since they were held.
void zps_shard_io_replay(zps_shard_io *io);

#endif
