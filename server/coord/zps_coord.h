/* zps_coord.h - the coordinator role of shard 0.
 *
 * It holds the job, admits workers (rank, member id, share), makes the
 * plan, gathers test-set results, answers STATUS and writes the metrics log.
 * It never touches parameters: those belong to the shards. It answers on
 * the socket it is given (shard 0's ROUTER) and keeps no socket of its own. */
#ifndef ZPS_COORD_H
#define ZPS_COORD_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/zps_dtype.h"
#include "common/zps_err.h"
#include "common/zps_model.h"
#include "common/zps_optim.h"
#include "common/zps_outer.h"
#include "common/zps_plan.h"
#include "common/zps_sumsq.h"
#include "common/zps_wire.h"
#include "server/coord/zps_outbox.h"

typedef struct zps_coord_cfg {
    const char *model;            // borrowed: model spec text ("external": declared)
    const char *dataset;          // borrowed: dataset spec text ("size:N" when declared)
    // --model external: the layout the first worker declared, which every
    // HELLO must declare too, with the same dataset sizes. NULL otherwise.
    const Zps__Layout *layout;    // borrowed
    // A built-in MLP takes a HELLO that declares its layout (a torch
    // worker's nn.Sequential): zps_layout_differs_mlp. Borrowed; may be NULL.
    const zps_model_spec *spec;
    uint32_t n_train;             // the train records declared with it
    uint64_t seed;                // job seed
    uint32_t global_batch;        // B
    uint64_t total_steps;         // steps of the run
    uint64_t steps_per_epoch;     // floor(n_train / B)
    uint32_t n_test;              // test records, split among members for evaluation
    uint32_t workers;             // members to admit before step 0
    double worker_timeout_ms;     // a member silent this long is evicted
    uint64_t checkpoint_every;    // shards checkpoint after every this many steps (0: never)
    bool adaptive_split;          // shares follow measured throughput
    uint64_t n_params;            // length of the flat vector
    uint32_t shards;              // shard processes, this one (shard 0) included
    zps_optim_cfg optim;          // sent to the other shards (diloco: the outer step's)
    zps_outer_mode mode;          // --mode diloco; zeroed: synchronous
    zps_optim_cfg inner;          // diloco: sent to the workers, zps-worker's inner optimizer
    zps_dtype wire_dtype;         // element type of tensors on the wire
    const char *endpoint;         // borrowed: shard 0's endpoint, sent to workers
    FILE *metrics;                // borrowed: JSON lines, or NULL
    // Shard 0 goes back to its checkpoint of `step` before the coordinator
    // tells anyone else to: a rollback it cannot follow (no such
    // checkpoint) is refused and the job goes on. NULL: always possible.
    zps_err (*restore)(void *arg, uint64_t step);
    void *restore_arg;            // borrowed: passed to restore
    double (*clock_ms)(void);     // NULL: zps_clock_ms (a test passes its own)
    float clip_grad_norm;         // --clip-grad-norm, sent with ASSIGN (0: off)
    // --deterministic --micro-batch M, sent with JOB and ASSIGN (0: off):
    // every share and piece is whole micro-batches of M.
    uint32_t micro_batch;
    // --host-aggregate off: no plan to a worker carries its host group
    // (zeroed: on, the default).
    bool no_host_aggregate;
    bool wire_code; // --wire-code zstd: told to every worker and shard
} zps_coord_cfg;

typedef struct zps_coord zps_coord;

// Caller owns the result; NULL on failure, logged. cfg's borrowed strings
// must outlive the coordinator.
zps_coord *zps_coord_new(const zps_coord_cfg *cfg);
void zps_coord_destroy(zps_coord **c);

uint64_t zps_coord_job_id(const zps_coord *c);
// The plan once every member and shard is here, else NULL (borrowed).
const zps_plan *zps_coord_plan(const zps_coord *c);
// True once the run is over and members said goodbye (or stopped answering).
bool zps_coord_finished(const zps_coord *c);

// Handlers for messages addressed to the coordinator; each queues its
// answer in out when the message calls for one, and returns the reason it
// refused the message, if it did (already answered with ERROR).
zps_err zps_coord_on_hello(zps_coord *c, zps_outbox *out, zps_wire_msg *m);
zps_err zps_coord_on_register(zps_coord *c, zps_outbox *out, zps_wire_msg *m);
zps_err zps_coord_on_heartbeat(zps_coord *c, zps_outbox *out, zps_wire_msg *m);
zps_err zps_coord_on_ready(zps_coord *c, zps_outbox *out, zps_wire_msg *m);
zps_err zps_coord_on_eval(zps_coord *c, const zps_wire_msg *m);
zps_err zps_coord_on_bye(zps_coord *c, zps_outbox *out, const zps_wire_msg *m);
// bad_messages and step come from the shard(s), which the coordinator does not see.
void zps_coord_on_status(zps_coord *c, zps_outbox *out, zps_wire_msg *m, uint64_t step,
                         uint64_t bad_messages);

// STEP_DONE from a shard > 0: refused (ZPS_ESTALE, logged) for a step it
// cannot have done yet, more than one past shard 0's.
zps_err zps_coord_on_step_done(zps_coord *c, const zps_wire_msg *m);

// --clip-grad-norm. zps_coord_on_norm takes shard k's NORM (its exact
// sum of squares of `step`), zps_coord_note_norm shard 0's own part; with
// every shard's part of a step in, the norm is computed once, sent (NORM)
// to the shards > 0 and kept for shard 0, which takes it, once, with
// zps_coord_take_norm. A part of a step whose norm was sent already is
// answered with that norm again (a duplicate); parts of steps a rollback
// discards are forgotten. ZPS_EPROTO for a NORM that is not one.
zps_err zps_coord_on_norm(zps_coord *c, zps_outbox *out, const zps_wire_msg *m);
void zps_coord_note_norm(zps_coord *c, zps_outbox *out, uint64_t step, const zps_sumsq *part);
bool zps_coord_take_norm(zps_coord *c, uint64_t *step, float *norm);

// What the message table (server/zps_msgtab.h) asks of the coordinator:
// its state as a zps_at bit; whether a worker with this rank and member id
// was admitted; whether shard `index` was assigned, and whether `token` is
// its token.
uint32_t zps_coord_at(const zps_coord *c);
bool zps_coord_member_ok(const zps_coord *c, uint32_t rank, uint64_t member_id);
bool zps_coord_shard_assigned(const zps_coord *c, uint32_t index);
bool zps_coord_shard_token_ok(const zps_coord *c, uint32_t index, uint64_t token);

// A step completed on shard 0 with this mean loss after step_ms; counted[r]
// is the samples shard 0 counted from rank r (ZPS_MAX_MEMBERS entries).
void zps_coord_step_done(zps_coord *c, uint64_t step, float loss, double step_ms,
                         const uint32_t *counted);
// Shard 0 is about to send the first parameters of `step`: the step
// boundary. Membership changes since the last one take effect there, in
// one new plan from `step` on, queued in out: send it before those parameters.
void zps_coord_release(zps_coord *c, zps_outbox *out, uint64_t step);
// Shard `shard` has completed steps_done steps (from its STEP_DONE).
void zps_coord_shard_done(zps_coord *c, uint32_t shard, uint64_t steps_done);
// The newest plan generation and the step it holds from.
uint32_t zps_coord_generation(const zps_coord *c, uint64_t *effective);

// Saves the job state (job id, plan generation, members) beside the
// checkpoints of `step`, and restores it on a restart with --resume: the
// coordinator then waits (bounded) for shards and workers to come back and
// rolls everyone back to `step`.
zps_err zps_coord_save(const zps_coord *c, const char *dir, uint64_t step);
zps_err zps_coord_resume(zps_coord *c, const char *dir, uint64_t step);

// Adaptive split: every few steps, shares in proportion to each member's
// measured throughput, if that shortens the predicted step by >= 10 %;
// the new shares take effect at the next step boundary.
void zps_coord_adapt(zps_coord *c);
// The ranks whose parts of `step` for shards on other hosts go through
// `rank`: its host group's followers if it leads one, none otherwise (no
// group, --host-aggregate off, every shard on its host), in out: how
// many, at most max.
uint32_t zps_coord_followers(zps_coord *c, uint64_t step, uint32_t rank, uint32_t *out,
                             uint32_t max);
// Speculation: also hand the slice [offset, offset + count) of `step`,
// late, in pieces to the live members marked in `helper` (by rank). The
// first copy of a sample counts. False if there is no such member.
bool zps_coord_speculate(zps_coord *c, zps_outbox *out, uint64_t step, uint32_t offset,
                         uint32_t count, uint32_t late_rank, const bool *helper);
// What this start of the coordinator trained, and the job it belongs to:
// its figures are this start's only, whatever the checkpoints it resumed
// from, so that a resumed job's summary and status stay true.
typedef struct zps_coord_run {
    bool training;          // this start began training (false: waiting or recovering)
    uint64_t from_step;     // it trained from this step
    uint64_t to_step;       // to this one (steps completed on shard 0)
    uint64_t steps;         // steps it completed, any replayed after a rollback included
    double secs;            // since it began training, until the last step if done
    double ms_per_step;     // secs over steps, in ms (0 before the first)
    uint32_t starts;        // its number among the job's starts (1: the first; 0: unknown,
                            // resumed from the job state of an older zps)
    uint64_t job_started_unix_ms; // wall clock the job first began training (0: unknown)
} zps_coord_run;
void zps_coord_run_figures(const zps_coord *c, zps_coord_run *out);

// The median step time of the last steps (ms, 0 before any).
double zps_coord_median_step_ms(const zps_coord *c);

// The documents of --http, rendered from one census of the members
// (server/coord/zps_census.h): linear in members, a few hundred ms apart.
struct json_t;
typedef struct zps_coord_docs {
    char *metrics;         // owned: Prometheus text
    struct json_t *status; // owned: /status; its "members" are STATUS's rows without a page
    struct json_t *rows;   // owned: every member's /status row, in rank order (for pages)
} zps_coord_docs;

// step and bad_messages come from shard 0. zps_coord_docs_fini frees out.
zps_err zps_coord_render_docs(const zps_coord *c, uint64_t step, uint64_t bad_messages,
                              zps_coord_docs *out);
void zps_coord_docs_fini(zps_coord_docs *d);
// The two documents as text: Prometheus and /status's JSON (caller frees both).
zps_err zps_coord_render(const zps_coord *c, uint64_t step, uint64_t bad_messages,
                         char **metrics, char **status_json);

// A rollback decided (a restarted shard came back at an older step): true
// once, with the step shard 0 must restore.
bool zps_coord_take_rollback(zps_coord *c, uint64_t *step);

// A live member with this rank and member id was heard from now (a
// heartbeat, or any push it sends: pushes are its heartbeats while it
// trains, docs/choices.md "Thousands of members"); false if there is none.
bool zps_coord_heard(zps_coord *c, uint32_t rank, uint64_t member_id);
// Records a member's push arriving at now_ms (lag, timings for status).
void zps_coord_note_push(zps_coord *c, uint64_t step, uint32_t rank, uint32_t samples,
                         float compute_ms, double now_ms);
// A diloco member's figures of round `step` (its push with inner steps):
// fragment is the one its pushes carried (-1: no fragments).
void zps_coord_note_round(zps_coord *c, uint64_t step, uint32_t rank, uint32_t inner_steps,
                          float delta_norm, uint64_t bytes, int fragment);
// True for a --mode diloco job.
bool zps_coord_diloco(const zps_coord *c);
// Host and device of a rank, for log lines ("?" if unknown; borrowed).
const char *zps_coord_member_device(const zps_coord *c, uint32_t rank);

// Periodic work: evictions (and the new plan they make, queued in out),
// progress and waiting lines, the end-of-run deadline.
void zps_coord_tick(zps_coord *c, zps_outbox *out, double now_ms);

// Host and device of a rank, for log lines ("?" if unknown; borrowed).
const char *zps_coord_member_host(const zps_coord *c, uint32_t rank);

#endif
