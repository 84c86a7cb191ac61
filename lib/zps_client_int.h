/* zps_client_int.h - libzps's handle inside: the struct of zps_client and
 * the calls between the rooms of its loop (zps_client.c, zps_work.c,
 * zps_job.c, zps_wait.c, zps_retry.c, zps_ask.c, zps_diloco.c,
 * zps_evalwork.c). Internal to lib/: nothing outside it includes this;
 * callers see the opaque handle of include/zps.h. */
#ifndef ZPS_CLIENT_INT_H
#define ZPS_CLIENT_INT_H

#include "include/zps.h"

#include <stdbool.h>
#include <stdint.h>

#include "common/zps_dtype.h"
#include "common/zps_err.h"
#include "common/zps_model.h"
#include "common/zps_optim.h"
#include "common/zps_outer.h"
#include "common/zps_plan.h"
#include "common/zps_timers.h"
#include "lib/zps_conn.h"
#include "lib/zps_decl.h"
#include "lib/zps_heartbeat.h"
#include "lib/zps_host.h"
#include "lib/zps_micro.h"
#include "lib/zps_round.h"
#include "lib/zps_sampler.h"
#include "lib/zps_schedule.h"

#define ZPS_CLIENT_WAIT_LOG_MS 5000.0  // a wait says what it waits for this often
#define ZPS_CLIENT_LATE_STEPS 2.0      // a slice not begun this many usual steps in: ask first
#define ZPS_CLIENT_ASK_MS 500          // bound on the coordinator's answer to that
#define ZPS_CLIENT_ASK_EVERY_MS 1000.0 // waiting for parameters: ask where the job is this often,
#define ZPS_CLIENT_ASK_MAX_MS 8000.0   // then twice as long each time, up to this
#define ZPS_CLIENT_RETRY_MS 20         // first wait before sending a "not yet" message again
#define ZPS_CLIENT_RETRY_MAX_MS 1000   // longest such wait (doubling)
#define ZPS_CLIENT_QUEUE (1 + ZPS_PLANS_HANDED_MAX)

// Where zps_next_work picks up.
typedef enum zps_client_phase {
    ZPS_PHASE_NEW,        // joined; the first call starts heartbeats and pulls
    ZPS_PHASE_STEP,       // step t begins
    ZPS_PHASE_COMPUTE,    // handing out step t's pieces
    ZPS_PHASE_WAIT,       // waiting for wait_step's parameters (handing out late pieces)
    ZPS_PHASE_EVAL,       // handing out the evaluation of the epoch's end
    ZPS_PHASE_START_OVER, // after a rollback or catching up: pull rollback_to's parameters
    ZPS_PHASE_DONE,       // the last step is over
    ZPS_PHASE_OVER,       // ended: stopped, over, or failed
} zps_client_phase;

// A bucket of the next step's parameters, kept as it came until all are
// in: the current parameters stay whole until then (a slice of the step in
// progress may be handed to this worker while it waits), and the buckets
// are copied into them once, in one pass, rather than into a buffer of
// their own and from there again. A bucket in a same-host shard's segment
// is kept as where it lies there, and read in place in that pass.
typedef struct zps_client_held {
    zmq_msg_t frame;        // owned: the received frame (empty if shared)
    uint64_t offset;        // the parameter its first element is
    bool shared;            // in shard `shard`'s segment, as `in` says
    int shard;
    zps_conn_shared in;
} zps_client_held;

// What a wait for parameters was for.
typedef enum zps_client_after {
    ZPS_AFTER_JOIN,       // the first parameters
    ZPS_AFTER_STEP,       // those after step t
    ZPS_AFTER_START_OVER, // those of rollback_to
    ZPS_AFTER_OVERLAP,    // diloco --overlap: those of step t, owed since the push of t - 1
} zps_client_after;

struct zps_client {
    zps_conn conn;                                 // the wire: sockets, identity, heartbeat
    int timeout_ms;                                // the coordinator's silence ends the job
    int join_timeout_ms;                           // bound on waiting for the job
    zps_err errcode;                               // the last failure
    char errmsg[256];                              // its sentence
    // The job.
    bool joined;                                   // a JOB was taken
    uint32_t global_batch;                         // B
    uint64_t seed, total_steps, steps_per_epoch, start_step;
    char model_name[256], dataset_name[256];       // from JOB
    zps_model_spec model;
    zps_dtype dtype;                               // tensors on the wire
    zps_schedule schedule;                         // what to compute at each step
    // Buffers.
    float *params;                                 // borrowed: the caller's parameters
    zps_client_held *held;                         // owned: frames of the next step's parameters,
                                                   // kept as they arrive (n_held of cap_held)
    int n_held, cap_held;
    uint8_t *wire;                                 // owned: gradient in a 16-bit wire dtype
    zps_wire_ref grad_ref;                         // the caller's gradient still held by ZeroMQ
    bool has_data;                                 // zps_set_dataset called
    zps_sampler sampler;                           // owned
    uint64_t n_test;                               // test records (64 bits: n_test * offset)
    // The piece handed out.
    uint32_t work_id;                              // its id
    bool handed;                                   // a piece is out; its outcome not yet taken
    bool skip;                                     // zps_work_start said skip it
    uint64_t cur_step;                             // its step
    zps_piece cur_work;                            // its slice
    double step_t0;                                // when it was handed out
    zps_err push_err;                              // its first failed push
    // Pieces to hand out.
    uint64_t queue_step;                           // their step
    zps_piece queue[ZPS_CLIENT_QUEUE];
    int n_queue, queue_pos;
    uint64_t eval_epoch;                           // the evaluation to hand out
    uint32_t eval_lo[ZPS_CLIENT_QUEUE], eval_hi[ZPS_CLIENT_QUEUE];
    int n_eval, eval_pos;
    // The loop.
    zps_client_phase phase;
    zps_client_after after;                        // of the wait in progress
    bool training;                                 // past the first parameters
    bool rejoined;                                 // another member since the last start-over
    uint64_t t;                                    // the step in progress
    uint64_t wait_step;                            // the step whose parameters are awaited
    int n_step_work;                               // pieces of step t
    double t2;                                     // when the wait after step t began
    bool wait_begun;                               // the wait's state below is set
    double wait_start;                             // when the wait began
    double train_start;                            // when training began
    uint64_t rollback_to;                          // step to start over from
    bool catching_up;                              // the job went on without this worker: the
                                                   // waits until parameters come ask early
    double params_ms;                              // when the current parameters were taken
    double usual_step_ms;                          // running mean of the time between those
    double first_wait_ms;                          // how long the first parameters took
    uint64_t done_step;                            // the step of the slices below
    zps_piece done[ZPS_CLIENT_QUEUE];              // the slices computed of it, pieces too
    int n_done;
    double sum_data_ms, sum_compute_ms, sum_wait_ms; // per-step phases, summed
    uint64_t timed_steps;                          // steps in those sums
    uint64_t stopped_at;                           // the step a stop interrupted
    // What falls due while waiting (zps_due.c): named timers, the earliest
    // the poll timeout.
    zps_timers timers;
    int t_pull, t_init, t_redo, t_ask, t_beat, t_log; // their ids
    zps_err due_err;                               // the first failure of those fired
    double pull_again_ms[ZPS_CONN_MAX_SHARDS];     // when to send a refused PULL again (0: no)
    int retry_ms;                                  // the next "not yet" backoff
    double answered_ms;                            // the coordinator's last answer to that
    int done_received;                             // buckets in when the job was last seen over
    double done_ms;                                // then (done_received -1: not seen yet)
    double ask_every_ms;                           // the wait between asks, doubling (reset by
                                                   // each wait for parameters)
    bool rejoin;                                   // handed on by the coordinator: HELLO again
    uint64_t ahead_of;                             // the job's step at the last ask, if behind us
    bool job_over;                                 // the coordinator said the job is over
    // A declared model (--model external).
    zps_decl decl;                                 // what HELLO declares
    bool send_init;                                // rank 0 of a first start: send INIT
    double init_again_ms[ZPS_CONN_MAX_SHARDS];     // when to send a refused INIT again (0: no)
    // --mode diloco: the round in progress (step t is round t).
    zps_outer_mode mode;                           // zeroed: synchronous
    zps_optim_cfg inner;                           // diloco: the job's inner optimizer, from JOB
    zps_round round;                               // owned: theta_sync, the delta, its payloads
    zps_piece own;                                 // this worker's slice of the round
    uint32_t inner_h, inner_n;                     // inner steps handed out, and to take
    bool round_pushed;                             // the round's pseudo-gradient is out
    bool inner_done;                               // its last inner step ended (zps_inner_done)
    uint64_t own_pushed;                           // the step whose own push went out last
    uint32_t inner_taken;                          // the work id zps_inner_done took last
    double inner_loss;                             // the round's inner losses, summed
    double round_ms;                               // the round's compute, summed
    uint32_t pushed_inner;                         // inner steps the pseudo-gradient pushed covers
    // --fragments F: each fragment's inner steps and compute since it was
    // last exchanged (what its pseudo-gradient covers), and the worker's
    // own parameters, kept aside while the global ones are evaluated.
    uint32_t frag_inner[ZPS_OUTER_MAX_FRAGMENTS];
    double frag_ms[ZPS_OUTER_MAX_FRAGMENTS];
    float *local;                                  // owned, F > 1 or overlap: n_params floats
    // --overlap: the parameters of step t are owed (the push of t - 1 did
    // not wait for them), the values of each fragment when it was pushed,
    // the pieces of step t to push as missing once the shards are at t,
    // and the largest delay of a merge, in inner steps.
    bool owed;
    float *pushed_at;                              // owned, overlap: n_params floats
    zps_piece deferred[ZPS_CLIENT_QUEUE];
    int n_deferred;
    uint32_t delay_max;
    // --deterministic: the piece's micro-batches summed in the tree's order.
    zps_micro micro;
    // One push per host: this worker's group and, leading it, the sums.
    zps_host host;
};

// zps_client.c: errors, a code and the sentence that was logged for it.
zps_err zps_client_fail(zps_client *c, zps_err err);
zps_err zps_client_einval(zps_client *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void zps_client_begin(zps_client *c);

// zps_work.c: the loop's end, and the pieces queued to hand out.
int zps_work_end(zps_client *c, zps_err err);
void zps_work_queue_extras(zps_client *c, uint64_t step);
bool zps_work_queued(const zps_client *c);
// Whether w is the piece handed out last (of that kind); ZPS_EINVAL set if not.
bool zps_work_is_current(zps_client *c, const zps_work *w, uint32_t kind);

// zps_job.c: a JOB, and a plan of it or of PLAN, into the client.
zps_err zps_job_take(zps_client *c, const Zps__Header *h);
zps_err zps_job_take_plan(zps_client *c, Zps__Slice *const *slices, size_t n_slices,
                          uint32_t gen, uint64_t effective, Zps__Extra *const *extras,
                          size_t n_extras, const Zps__HostGroup *host);

// zps_wait.c: the parameter wait.
zps_err zps_wait_run(zps_client *c);
zps_err zps_wait_pull(zps_client *c, uint64_t step);
int zps_wait_received(const zps_client *c);
int zps_wait_pull_missing(zps_client *c, uint64_t step);
zps_err zps_wait_send_init(zps_client *c);
void zps_wait_release_held(zps_client *c);

// zps_retry.c: a shard's refusal while waiting for `step`'s parameters.
zps_err zps_retry_on_refusal(zps_client *c, int i, uint64_t step, const Zps__Header *h);

// zps_ask.c: asking the coordinator, joining again.
zps_err zps_ask_hello_until_job(zps_client *c, zps_wire_msg *m);
zps_err zps_ask_rejoin(zps_client *c);
zps_err zps_ask_take_late_job(zps_client *c, const Zps__Header *h);
zps_err zps_ask_where_is_job(zps_client *c, uint64_t step);
bool zps_ask_step_over(zps_client *c, uint64_t step);

// zps_due.c: what falls due while waiting, as timers. zps_due_init
// adds them (once, to a zeroed client); zps_due_begin arms those of a wait
// that begins at `start`, zps_due_end disarms those of a wait that ended.
void zps_due_init(zps_client *c);
void zps_due_begin(zps_client *c, double start);
void zps_due_end(zps_client *c);
// The heartbeat interval now, of the thread and of the beats a wait sends
// from the main socket: --heartbeat-ms stretched to two usual steps
// (zps_heartbeat_interval).
int zps_due_beat_ms(const zps_client *c);
// Shard i's refused PULL (INIT) sent again at `at`.
void zps_due_pull_again(zps_client *c, int i, double at);
void zps_due_init_again(zps_client *c, int i, double at);
// The refused pushes queued computed again at `at`.
void zps_due_redo(zps_client *c, double at);
// The coordinator asked where the job is at `at` (0: at once).
void zps_due_ask_at(zps_client *c, double at);
// The poll timeout: the time to the earliest, at most ZPS_CONN_POLL_MS.
long zps_due_poll_ms(const zps_client *c, double now);
// Fires what is due at `now`; the first failure of those, or ZPS_OK.
zps_err zps_due_run(zps_client *c, double now);

// zps_evalwork.c: after step t, the evaluation to hand out (none if the
// step ends no epoch nor the job); the next piece of it, ZPS_NEXT_EVAL, or
// 0 with none left (on to the next step).
void zps_evalwork_plan(zps_client *c, uint64_t t);
int zps_evalwork_hand_out(zps_client *c, zps_work *out);

// zps_host.c, zps_host_sum.c, zps_host_serve.c: one push per host
// (lib/zps_host.h). The group of plan gen (NULL: none); the shards
// elsewhere, from JOB.
zps_err zps_host_take_group(zps_client *c, uint32_t gen, const Zps__HostGroup *g);
void zps_host_take_shards(zps_client *c, const Zps__Job *job);
// Pushes part p of the piece handed out ([lo, hi) of grad) to shard i:
// through the leader, into the leader's sums, or by itself.
zps_err zps_host_push(zps_client *c, int i, const zps_piece *p, uint64_t lo, uint64_t hi,
                      const float *grad, float loss, float data_ms, float compute_ms);
// Leading a group: takes the followers' pushes waiting on its socket.
bool zps_host_leads(const zps_client *c);
zps_err zps_host_drain(zps_client *c);
// Leading: PARAMS m from shard i go on to the followers (frames shared).
void zps_host_relay(zps_client *c, int i, const zps_wire_msg *m);
// --wire-code zstd (lib/zps_host_code.c): PARAMS m from shard i decoded
// in place (as if sent uncoded) and, leading, kept as what the next
// answer is coded against. False (logged) for coded parameters that did
// not decode: m is to be dropped; those of `step` (the one waited for)
// are asked for again uncoded, once a step and shard.
bool zps_host_code_take(zps_client *c, int i, zps_wire_msg *m, uint64_t step);
// Forgets every step the copy holds: the next answers come uncoded.
void zps_host_code_forget(zps_client *c);
// Following: whether m, from the leader's socket, is a shard's PARAMS
// passed on (for a shard elsewhere: the others come from the shards).
bool zps_host_from_leader(const zps_client *c, const zps_wire_msg *m);
// Following: takes m if it is the leader's HOST_ACK of the part handed to
// it: taken (not the leader's to lose: nothing asked after), or left to
// this worker, which then pushes it itself.
bool zps_host_take_ack(zps_client *c, const zps_wire_msg *m);
// Following: the leader's connection closed (its monitor said so): the
// piece handed to it is computed again and pushed by this worker.
void zps_host_on_event(zps_client *c);
// While waiting: a leader pushes what it holds once a member is late, a
// follower whose leader has not taken its part for a while asks it
// whether it holds it (and pushes the piece itself if told it does not).
zps_err zps_host_due(zps_client *c, double now);
// Following: whether zps_host_due would ask the leader now; what came on
// the host's socket (its HOST_ACK, however late) is read first.
bool zps_host_give_up_due(const zps_client *c, double now);

// zps_diloco.c: the round of --mode diloco.
zps_err zps_diloco_take_mode(zps_client *c, const Zps__Job *job);
int zps_diloco_hand_out(zps_client *c, zps_work *out);
// The step's pseudo-gradient (of its fragment), pushed with this worker's
// slice; with --overlap, then the pieces deferred.
zps_err zps_diloco_push_own(zps_client *c);
// --overlap: whether the job overlaps; before the wait for the owed
// parameters, what the fragment of step t - 1 trained since its push is
// kept aside (zps_diloco_params_in adds it to the new values); after it,
// the pieces of step t deferred until the shards are at t go out.
bool zps_diloco_overlaps(const zps_client *c);
void zps_diloco_overlap_begin(zps_client *c);
zps_err zps_diloco_push_deferred(zps_client *c);
// --overlap, in the wait for step t's owed parameters (step: t): slices
// of t handed meanwhile (a member left before pushing t - 1 to every
// shard, and both its steps were handed) are deferred with the rest, to go
// out once the shards are at t; the wait itself queues only those of t - 1.
void zps_diloco_defer_handed(zps_client *c, uint64_t step);
// --fragments: the buckets of shard i the wait for `after`'s parameters
// of `step` does not wait for (none but with fragments, after a step).
zps_bucket_set zps_diloco_not_awaited(const zps_client *c, int i, zps_client_after after,
                                      uint64_t step);
// The parameters of the wait that ended (`after`) are in: theta_sync takes
// them, of every fragment or of the one exchanged.
void zps_diloco_params_in(zps_client *c, zps_client_after after);
// The evaluation's pieces are handed out with the global parameters, those
// of the last exchange of every fragment (zps_diloco_eval_begin), and the
// worker's own come back after (zps_diloco_eval_end); the job ends with the
// global ones (zps_diloco_finish), the same bits on every worker. All three
// do nothing without fragments or overlap: the parameters are then the
// global ones.
void zps_diloco_eval_begin(zps_client *c);
void zps_diloco_eval_end(zps_client *c);
void zps_diloco_finish(zps_client *c);

#endif
