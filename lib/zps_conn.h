/* zps_conn.h - libzps's wire client: one worker's connections to a job.
 *
 * The coordinator's socket (shard 0) and one per other shard, a second
 * socket to the coordinator for STATUS questions only, the heartbeat
 * thread; sending with this member's identity, bounded waits for a reply
 * that say what they wait for, the one place every refusal is judged,
 * HELLO until the job comes, PULL, PUSH and the question where the job
 * is. It knows nothing of steps in progress: the work loop
 * (zps_client.c) decides what to send when. */
#ifndef ZPS_CONN_H
#define ZPS_CONN_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/zps_curve.h"
#include "common/zps_dtype.h"
#include "common/zps_err.h"
#include "common/zps_model.h"
#include "common/zps_shm.h"
#include "common/zps_wire.h"
#include "lib/zps_decl.h"
#include "lib/zps_heartbeat.h"
#include "lib/zps_schedule.h"

#define ZPS_CONN_MAX_SHARDS 64
#define ZPS_CONN_POLL_MS 1000 // receive timeout of the sockets: every wait wakes this often

typedef struct zps_conn_shard {
    void *sock;                                 // owned (shard 0: the coordinator's socket)
    char endpoint[256];                         // for log lines
    uint64_t lo, hi;                            // its range
    int n_buckets;                              // buckets of the range
    zps_bucket buckets[ZPS_MODEL_MAX_BUCKETS];  // as the shard sees them
    zps_bucket_set received;                    // buckets of parameters in this step
    zps_shm_seg seg;                            // owned: pushes through shared memory, or empty
    bool shm_off;                               // refused (or failed): frames only
    uint64_t shm_step;                          // 1 + the step whose piece is in seg (0: none)
    zps_piece shm_piece;                        // that piece: the step's others go as frames
    zps_shm_map params;                         // owned: the shard's segment of parameters
    bool params_frames;                         // it failed: parameters as frames
    uint64_t params_pulled;                     // 1 + the step asked for again as frames
} zps_conn_shard;

// ZPS_OPT_SHM: which shards get gradients through shared memory.
enum { ZPS_CONN_SHM_OFF = 0, ZPS_CONN_SHM_AUTO = 1, ZPS_CONN_SHM_ON = 2 };

typedef struct zps_conn {
    char device[64];                            // for HELLO
    uint32_t share;                             // for HELLO
    const zps_decl *decl;                       // borrowed, for HELLO: a declared model, or NULL
    int sndbuf;                                 // TCP send buffer, 0: the OS's, -1: auto
    int shm;                                    // ZPS_CONN_SHM_*
    char boot[ZPS_SHM_BOOT_ID_LEN];             // this host's boot id, for the shards to compare
    bool params_frames;                         // ZPS_SHM_PARAMS=off: parameters as frames
    bool host_frames;                           // ZPS_SHM_HOST=off: parts to a host's leader as frames
    int heartbeat_ms;                           // heartbeat interval, the least
    double worker_timeout_ms;                   // the coordinator's eviction (0: not said)
    zps_curve curve;                            // CURVE keys, if on
    volatile sig_atomic_t stop;                 // set: every wait returns ZPS_ECLOSED
    void *ctx;                                  // owned
    zps_conn_shard shards[ZPS_CONN_MAX_SHARDS]; // shards[0] is the coordinator
    int n_shards;
    void *ask;                                  // owned: DEALER to the coordinator, STATUS only
    zps_heartbeat *heartbeat;                   // owned
    uint64_t job_id;                            // identity on the wire, from JOB
    uint32_t rank;
    uint64_t member_id;
    uint64_t pushed_bytes;                      // gradient payload sent on sockets, all steps
} zps_conn;

// How the worker takes a refusal.
typedef enum zps_conn_verdict {
    ZPS_CONN_RETRY, // "not yet": send the same again after a bounded backoff
    ZPS_CONN_LOST,  // this worker may have been handed on: ask the coordinator
    ZPS_CONN_OVER,  // the job is over
    ZPS_CONN_FINAL, // refused for good: the worker ends
} zps_conn_verdict;

// A ZeroMQ context and the coordinator's endpoint; nothing connected yet.
zps_err zps_conn_init(zps_conn *n, const char *coordinator);
// Closes every socket, stops the heartbeat, terminates the context (a
// queued BYE still goes out within the linger). Safe on zeroed memory.
void zps_conn_fini(zps_conn *n);
// Connects the coordinator's socket; ZPS_EIO (logged) when it cannot.
zps_err zps_conn_connect(zps_conn *n);

// Every ERROR reply is judged here, once, and logged with what it refused.
zps_conn_verdict zps_conn_judge(const Zps__Header *h, const char *from);
// Receives the next message on sock into m, waiting at most timeout_ms and
// logging every few seconds (a wait over 3 s that runs out, too). An ERROR
// is judged: "not yet" returns ZPS_EAGAIN, the end of the job ZPS_ECLOSED,
// anything else its code; a refusal of a push or pull (of before: what is
// awaited here is something else) is skipped, unless the job is over.
zps_err zps_conn_await(zps_conn *n, void *sock, const char *what, const char *endpoint,
                       int timeout_ms, zps_wire_msg *m);
// Sends h (with this member's identity) to shard i; logs a failure.
zps_err zps_conn_send(zps_conn *n, int shard, Zps__Header *h, const void *payload, size_t bytes,
                      zps_wire_ref *ref);

// The bucket of shard sc that is [lo, hi), or -1.
int zps_conn_bucket_of(const zps_conn_shard *sc, uint64_t lo, uint64_t hi);

// The same with payload frames of their own (zps_wire_send_frames: moved).
zps_err zps_conn_send_frames(zps_conn *n, int shard, Zps__Header *h, zmq_msg_t *frames,
                             int n_frames);

// HELLO until the job is given, within join_timeout_ms: a coordinator
// recovering from a restart answers "again" until it admits, and one
// restarted since forgot the HELLO, said again every 3 s. m holds the
// last message received, whatever the result: the caller finishes it.
zps_err zps_conn_hello_until_job(zps_conn *n, int join_timeout_ms, zps_wire_msg *m);
// The shards of JOB: their ranges and buckets of the model, connected
// (a connection of before to the same endpoint serves).
zps_err zps_conn_take_shards(zps_conn *n, const Zps__Job *job, const zps_model_spec *model);
// The heartbeat thread, from this member's identity (again after a rejoin).
void zps_conn_beat(zps_conn *n);
// The STATUS socket, connected early so a question need not wait for a
// handshake; without it (logged) the worker does not ask.
void zps_conn_open_ask(zps_conn *n);
// Asks the coordinator for STATUS as this member, on the STATUS socket,
// bounded by timeout_ms; m is a STATUS_REPLY with its status on ZPS_OK.
zps_err zps_conn_ask(zps_conn *n, int timeout_ms, zps_wire_msg *m);
// INIT of shard i's range of params (rank 0's initial values of a declared
// model), a bucket at a time, copied.
zps_err zps_conn_send_init(zps_conn *n, int i, const float *params);
// PULL of step's parameters from shard i.
zps_err zps_conn_pull(zps_conn *n, int i, uint64_t step);
// PUSH of [lo, hi) of grad, piece p's mean gradient of step, to shard i,
// zero-copy (converted into wire first for a 16-bit dtype); ref is held
// by ZeroMQ until the frames are sent.
zps_err zps_conn_push(zps_conn *n, int i, uint64_t step, const zps_piece *p, uint64_t lo,
                      uint64_t hi, zps_dtype dtype, const float *grad, uint8_t *wire, float loss,
                      float data_ms, float compute_ms, zps_wire_ref *ref);
// A diloco round's figures its pushes carry (proto/zps.proto's Header).
typedef struct zps_conn_outer {
    uint32_t inner_steps; // 0: the piece's member is missing from the round
    uint32_t compress;    // zps_quant_kind of the payload; 0: fp32
    float delta_norm;     // of the whole pseudo-gradient
    uint64_t round_bytes; // payload bytes of the round, to every shard
} zps_conn_outer;
// PUSH of [lo, hi) of a diloco pseudo-gradient for piece p of round
// `step` to shard i: payload (len bytes: fp32, or the encoding) by frames,
// zero-copy, ref held by ZeroMQ until they are sent.
zps_err zps_conn_push_delta(zps_conn *n, int i, uint64_t step, const zps_piece *p, uint64_t lo,
                            uint64_t hi, const void *payload, size_t len,
                            const zps_conn_outer *o, float loss, float compute_ms,
                            zps_wire_ref *ref);

// A bucket of parameters in a shard's segment, as a PARAMS header named it:
// read in place once the step's parameters are all in.
typedef struct zps_conn_shared {
    uint32_t bucket;              // its slot
    uint64_t step, offset, count; // what the slot holds
    uint64_t data_at;             // where its values are in the segment
    size_t bytes;                 // their size in the wire dtype
    int64_t pid, fd;              // the segment, as the header named it
    uint64_t size;
    uint64_t seq;                 // the slot's sequence when the header came
} zps_conn_shared;

// Bucket b of step h->step (h->count elements of esize bytes), which a
// PARAMS header of shard i names in the shard's segment of parameters,
// found there whole and not being written: *out says where. The segment is
// mapped at the first such header, checked as the shard checks a worker's
// (this host, this user, a sealed "zps-params" memfd, its size bounded by
// the shard's range).
// ZPS_ESTALE: those values were written over (a step this worker is late
// for); any other refusal: this worker asks for frames from now on
// (logged once). Either way the caller asks for the step again by PULL.
zps_err zps_conn_params_named(zps_conn *n, int i, uint32_t b, const Zps__Header *h,
                              size_t esize, zps_conn_shared *out);
// Where the values s names lie in shard i's segment, to be read in place,
// if the segment is the one named and the slot was not written since: NULL
// otherwise (logged; the caller asks for the step again). What is read
// from there is whole if zps_conn_params_still says so afterwards.
const void *zps_conn_params_at(zps_conn *n, int i, const zps_conn_shared *s);
// Whether the slot of s was not written since it was named: false (logged)
// if the shard wrote it again meanwhile.
bool zps_conn_params_still(zps_conn *n, int i, const zps_conn_shared *s);

// Shard i refused a push through shared memory (why, from its refusal):
// its pushes go as frames from now on. Logged once.
void zps_conn_shm_refused(zps_conn *n, int i, const char *why);

#endif
