/* zps_server.h - the zps-server process: one shard of the parameter
 * vector, and on shard 0 also the coordinator.
 *
 * One thread owns all state and runs a zmq_poll loop with a bounded timeout
 * (Redis's event loop, written with ZeroMQ): read a message, dispatch it to
 * the coordinator or the shard, then run the timers (progress, stall
 * warnings, end of run). A message from the network can be refused; it can
 * never crash the process or touch parameters before it was validated. */
#ifndef ZPS_SERVER_H
#define ZPS_SERVER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/zps_dtype.h"
#include "common/zps_optim.h"
#include "common/zps_outer.h"

// --shm: whether workers on this host may push through shared memory.
typedef enum zps_server_shm {
    ZPS_SERVER_SHM_AUTO = 0, // allowed, except under CURVE
    ZPS_SERVER_SHM_ALLOW,    // allowed, under CURVE too (said in the log)
    ZPS_SERVER_SHM_DENY,     // every push by frames
} zps_server_shm;

typedef struct zps_server_opts {
    uint32_t shard;             // this shard's index
    uint32_t shards;            // shard processes in the job
    const char *listen;         // endpoint to bind
    const char *endpoint_file;  // where to write the bound endpoint, or NULL
    const char *coordinator;    // shard > 0: shard 0's endpoint
    // The job; shard 0 only (the others receive it from the coordinator).
    uint32_t workers;           // members before step 0
    const char *model;          // model spec, or "external": declared by the workers
    const char *dataset;        // dataset spec; NULL: fashion-mnist (external: declared)
    uint32_t global_batch;      // B
    uint64_t epochs;            // run length in epochs, if steps is 0
    uint64_t steps;             // run length in steps (wins over epochs)
    const char *optimizer;      // "sgd"
    zps_optim_cfg optim;        // lr, momentum, schedule (diloco: zps-worker's inner optimizer)
    bool optim_given;           // an optimizer flag was given: declared groups must match them
    bool schedule_given;        // --lr, --lr-schedule or its flags given: no declared table
    zps_outer_mode mode;        // --mode diloco and its flags; zeroed: synchronous
    uint64_t seed;              // init, data order
    zps_dtype wire_dtype;       // gradients and parameters on the wire
    const char *metrics_log;    // JSON lines, or NULL
    double worker_timeout_ms;   // a worker silent this long is evicted
    uint64_t checkpoint_every;  // shard 0: checkpoint every this many steps (0: never)
    const char *checkpoint_dir; // where this shard writes its checkpoints, or NULL
    bool resume;                // start from this shard's newest valid checkpoint
    const char *curve_secret;   // this server's CURVE secret key file, or NULL
    const char *server_key;     // shard > 0: the coordinator's public key (default: own)
    const char *authorized_keys; // directory of the workers' public keys
    const char *shard_keys;     // directory of the shards' public keys, or NULL
    const char *operator_keys;  // directory of the operators' public keys (STATUS only), or NULL
    bool require_curve;         // refuse to run without CURVE
    double stall_warn_ms;       // while a step waits, name what it waits for this often
    bool adaptive_split;        // shard 0: shares follow measured throughput
    bool no_host_aggregate;     // shard 0: --host-aggregate off (no host groups in plans)
    bool wire_code;             // shard 0: --wire-code zstd (common/zps_zcode.h)
    double speculate_after;     // shard 0: hand a late slice on after this many median steps (0: off)
    const char *http;           // HOST:PORT of /healthz, /readyz (shard 0: /metrics, /status)
    const char *advertise;      // shard > 0: endpoint given to workers (default: bound one)
    const char *pid_file;       // for supervisors, or NULL
    int sndbuf;                 // TCP send buffer of the data socket (0: the OS's, -1: auto)
    int shm;                    // --shm: a zps_server_shm
    int threads;                // threads of the shard's accumulate and update (1: the loop's
                                // only; 0: auto, zps_pool_auto_threads)
    float clip_grad_norm;       // shard 0: clip by the global gradient norm to this (0: off)
    bool deterministic;         // --deterministic: the same bits for any split (needs micro_batch)
    uint32_t micro_batch;       // --micro-batch M: shard 0's M, sent to all (0: off); shards > 0
                                // given it check the coordinator's against it
} zps_server_opts;

// Runs a shard until the job is over or SIGINT/SIGTERM; returns the exit
// status (0 done, 1 failure, 2 bad configuration).
int zps_server_run(const zps_server_opts *o);

// ---------------------------------------------------------------------------
// The pieces of zps_server_run, for the fuzzer (fuzz/zps_fuzz_msg.c): it
// feeds the daemon's own receive path, message table and handlers through
// inproc sockets of the server's context, so a finding there is a finding
// in the daemon.

typedef struct zps_server zps_server;
typedef struct zps_shard zps_shard;
typedef struct zps_coord zps_coord;

// Sets a server up as zps_server_run does (sockets, CURVE, bind, the
// coordinator or the shard), without signal handlers or the loop. Caller
// owns the result (zps_server_close); NULL on failure, with the exit status
// in *status (1, or 2 for a bad configuration).
zps_server *zps_server_open(const zps_server_opts *o, int *status);
// One turn of the loop without waiting: every message ready on the
// server's sockets read and dispatched (s_read_one, the loop's function),
// held pushes replayed, the coordinator's timers run. Returns how many
// messages were read, or -1 where the loop would end the process (a shard
// > 0 that its coordinator refused, or told to roll back to a checkpoint
// it does not have).
int zps_server_turn(zps_server *srv);
// The context of the server's sockets (borrowed): peers on inproc live in it.
void *zps_server_ctx(zps_server *srv);
// Messages refused so far (what STATUS calls bad_messages).
uint64_t zps_server_refused(const zps_server *srv);
// True once something asked the loop to stop (only a signal may).
bool zps_server_stopping(const zps_server *srv);
// The shard and (shard 0) the coordinator, borrowed, for the fuzzer's checks.
zps_shard *zps_server_shard(zps_server *srv);
zps_coord *zps_server_coord(zps_server *srv);
// Closes the sockets, ends the context, frees everything; *srv becomes NULL.
void zps_server_close(zps_server **srv);

#endif
