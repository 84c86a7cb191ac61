/* zps_server_int.h - the server's state, shared by the files of the loop
 * at the top of server/ (the fuzzer and main.c see zps_server.h; the
 * coordinator, server/coord/, and the shard, server/shard/, see none of it).
 * Calls go one way, down this list: a file calls only those below it.
 *
 *   zps_server.c    the loop, dispatch through the message table, the timers
 *   zps_setup.c     start-up (sockets, CURVE, bind, the coordinator or the
 *                   shard) and its undoing
 *   zps_declare.c   shard 0 of --model external: the declared model
 *   zps_start.c     shard 0's start once the job's sizes are known
 *   zps_register.c  shards > 0: REGISTER, ASSIGN, and the coordinator's socket
 *   zps_steps.c     plans taken, a step's push, end, rollback, the stop's checkpoint
 *
 * One thread owns all of it; a message's handler and the timers' callbacks
 * run on it, one at a time. */
#ifndef ZPS_SERVER_INT_H
#define ZPS_SERVER_INT_H

#include <stdio.h>

#include "common/zps_curve.h"
#include "common/zps_log.h"
#include "common/zps_model.h"
#include "common/zps_timers.h"
#include "common/zps_wire.h"
#include "server/coord/zps_coord.h"
#include "server/shard/zps_shard.h"
#include "server/shard/zps_shard_io.h"
#include "server/zps_http.h"
#include "server/zps_refusals.h"
#include "server/zps_server.h"
#include "server/zps_zap.h"

#define ZPS_SERVER_POLL_MS 200
#define ZPS_SERVER_REGISTER_MS 2000.0
#define ZPS_SERVER_SEND_TIMEOUT_MS 5000
// Messages ZeroMQ reads ahead of the loop from each peer. Unbounded, a
// shard held every worker's push of a step at once when they all came
// together (the first step: 32 workers of a 1M model took it from 41 to
// 106 MiB); with 2 it held 48-51 MiB at 32 workers, with 1 43-45 (33 at
// 2 workers: bench/all.sh's case d, docs/measurements.md). With CurveZMQ,
// 2: with 1 a CURVE connection never delivered its first message (libzmq
// 4.3.4; the security tests show it), a cause not found yet.
#define ZPS_SERVER_RCVHWM 1
#define ZPS_SERVER_RCVHWM_CURVE 2
// Connections the kernel holds for ZeroMQ to accept. Each member opens
// three to shard 0 (its main socket, its heartbeat's, its questions') and
// thousands start at once: ZeroMQ's default of 100 overflowed at 4096
// members, the handshakes dropped were tried again after 1, 3, 7, 15... s,
// and members left a coordinator that had not yet accepted them. The
// kernel caps it at net.core.somaxconn (4096 by default).
#define ZPS_SERVER_BACKLOG (3 * ZPS_MAX_MEMBERS)
#define ZPS_SERVER_METRICS_BUF (1 << 16) // longer than a step record of every member
#define ZPS_SERVER_STOP_GRACE_MS 3000.0 // after SIGTERM, for the step in progress to finish
#define ZPS_SERVER_TICK_MS 50.0         // the coordinator's clock: evictions, waiting lines
// Shard > 0 after its last step: the longest it waits for the coordinator
// to end (the coordinator's grace for members to finish, and 5 s more).
#define ZPS_SERVER_LINGER_MS 65000.0
#define ZPS_SERVER_PUBLISH_MS 500.0     // refresh of what --http serves
#define ZPS_SERVER_DECLARE_LOG_MS 20000.0 // "waiting for the model" line
#define ZPS_SERVER_NORM_RESEND_MS 5000.0  // --clip-grad-norm: a part unanswered this long is
                                          // said, and sent again

struct zps_server {
    const zps_server_opts *o;                    // borrowed: flags
    void *ctx;                                   // owned
    FILE *metrics;                               // owned: --metrics-log, or NULL
    bool pid_written;                            // --pid-file is ours to remove
    void *sock;                                  // owned: ROUTER for workers (and shards, on 0)
    void *up;                                    // owned: shard > 0: DEALER to the coordinator
    char endpoint[256];                          // what sock is bound to
    zps_model_spec model;                        // the job's model
    zps_coord *coord;                            // owned: shard 0 only
    zps_outbox out;                              // what the coordinator queued: sent on sock
                                                 // after every call into it, before anything else
    zps_shard *shard;                            // owned: shard 0 at once, others once assigned
    zps_shard_io io;                             // the shard's side of the wire
    uint64_t job_id;                             // shard > 0: from ASSIGN
    uint32_t global_batch;                       // B, from the job
    uint64_t total_steps;                        // steps of the run
    zps_dtype dtype;                             // element type of tensors on the wire
    bool wire_code;                              // the job's --wire-code zstd
    int threads;                                 // the shard's: --threads, auto resolved
    zps_refusals refused;                        // refused or dropped messages, their lines
    uint32_t plan_gen;                           // newest generation given to the shard
    double step_start_ms;                        // when the current step began
    bool finished;                               // shard > 0: the last step is done, and the
                                                 // coordinator gone (or waited for long enough)
    void *up_mon;                                // owned: shard > 0 after its last step: up's
                                                 // disconnections (zps_register_linger)
    double linger_until_ms;                      // then: the longest it waits for them
    zps_curve curve;                             // CURVE keys, if on
    zps_zap *zap;                                // owned: admits CURVE clients, if on
    zps_http *http;                              // owned: /metrics and /status, if asked
    uint64_t ckpt_every;                         // checkpoint after every this many steps
    bool stopping;                               // a signal was seen: stop between steps
    bool leave;                                  // the stop's grace ran out: stop now
    uint64_t shard_token;                        // shard > 0: the secret of its ASSIGN (0: none)
    char dataset[256];                           // shard 0: the dataset spec ("size:N": declared)
    uint32_t size_train;                         // external, --dataset size:N (0: the workers')
    Zps__Hello *declared;                        // owned: external: the model declared, or NULL
    zps_timers timers;                           // the loop's periodic and deadline checks
    int t_stall;                                 // timer ids in timers (-1: not added)
    int t_register;
    int t_speculate;
    int t_stop_grace;
    int t_declare_log;
    int t_linger;
    double norm_wait_ms;                         // --clip-grad-norm: since when the shard waits
                                                 // for the norm (0: it does not)
};

// ---------------------------------------------------------------------------
// zps_setup.c

// zps_setup_open sets up what the loop needs: sockets (the shard's I/O on
// the ROUTER, with `hooks`), the metrics log, CURVE, the bind, the pid file,
// the coordinator or the shard. Returns 0, or the exit status (2 bad
// configuration, 1 other); zps_setup_close undoes what was done.
int zps_setup_open(zps_server *srv, const zps_shard_io_hooks *hooks);
void zps_setup_close(zps_server *srv);
// zps_setup_log_peak_rss logs the peak resident memory of the process,
// and how its parameters went out through its segment.
void zps_setup_log_peak_rss(const zps_server *srv);

// ---------------------------------------------------------------------------
// zps_declare.c

// zps_declare_on_undeclared: a message to shard 0 before the model is
// declared. ZPS_OK: it declared the model and the coordinator started (the
// loop hands it on); otherwise the loop refuses it with the error and *why.
zps_err zps_declare_on_undeclared(zps_server *srv, const zps_wire_msg *m, char *why, size_t len);
// zps_declare_load: --resume of an external job takes the declaration kept
// by its first start; ZPS_ENOENT if there is none.
zps_err zps_declare_load(zps_server *srv, char *why, size_t len);
// zps_declare_parse_size parses --dataset size:N of an external model.
zps_err zps_declare_parse_size(const char *text, uint32_t *n);

// ---------------------------------------------------------------------------
// zps_start.c

// zps_start_coordinator starts shard 0 once the job's sizes are known: 0,
// or 2 (*why says what does not fit) or 1 (out of memory).
int zps_start_coordinator(zps_server *srv, uint32_t n_train, uint32_t n_test, char *why,
                          size_t len);

// ---------------------------------------------------------------------------
// zps_register.c

// zps_register_send sends REGISTER to the coordinator and re-arms its timer.
void zps_register_send(zps_server *srv);
// A shard k > 0's message to its coordinator of `step` (READY, STEP_DONE,
// NORM): the header with its job, shard index and token, the credential
// the coordinator checks before it reads anything else.
void zps_register_up_header(const zps_server *srv, Zps__Header *h, Zps__MsgType type,
                            uint64_t step);
// zps_register_read_up reads the coordinator's socket; a failure ends the shard.
zps_err zps_register_read_up(zps_server *srv);
// zps_register_linger keeps a shard whose last step is done until its
// coordinator ends (zps_register_linger_check sets finished then);
// zps_register_linger_stop forgets it (a restore, a shard closing).
void zps_register_linger(zps_server *srv);
void zps_register_linger_check(zps_server *srv, double now);
void zps_register_linger_stop(zps_server *srv);

// ---------------------------------------------------------------------------
// zps_steps.c

// zps_steps_on_push takes a PUSH the table let through, and what follows
// from it: the step boundary, the bucket's update, the end of the step.
void zps_steps_on_push(zps_server *srv, zps_wire_msg *m);
// --clip-grad-norm. zps_steps_clip: the global norm of `step` came (from
// the coordinator's socket, or shard 0's own coordinator): the shard clips
// and updates every bucket, and sends them. zps_steps_take_norm: shard 0
// takes a norm its coordinator completed. zps_steps_norm_wait: from the
// loop's clock, a part unanswered for long is said and sent again.
void zps_steps_clip(zps_server *srv, uint64_t step, float norm);
void zps_steps_take_norm(zps_server *srv);
void zps_steps_norm_wait(zps_server *srv, double now);
// zps_steps_end ends the step the shard just completed.
void zps_steps_end(zps_server *srv);
// zps_steps_add_plan gives the shard a new plan generation.
void zps_steps_add_plan(zps_server *srv, uint32_t gen, uint64_t effective, const zps_plan *plan);
// zps_steps_take_plan: the first plan; the shard serves members from now on.
void zps_steps_take_plan(zps_server *srv, uint32_t gen, uint64_t effective, const zps_plan *plan);
// zps_steps_sync_coord: shard 0 follows the coordinator's plans and rollbacks.
void zps_steps_sync_coord(zps_server *srv);
// zps_steps_restore loads this shard's checkpoint of `step`; nothing
// changes on failure.
zps_err zps_steps_restore(zps_server *srv, uint64_t step);
// zps_steps_forget forgets the step in progress after a restore.
void zps_steps_forget(zps_server *srv);
// zps_steps_rollback goes back to the checkpoint of `step`.
zps_err zps_steps_rollback(zps_server *srv, uint64_t step);
// zps_steps_take_wire_plan takes a plan from the coordinator (PLAN or ROLLBACK).
void zps_steps_take_wire_plan(zps_server *srv, const Zps__Plan *p);
// zps_steps_stop_checkpoint writes the checkpoint of a stop by signal.
void zps_steps_stop_checkpoint(zps_server *srv);

#endif
