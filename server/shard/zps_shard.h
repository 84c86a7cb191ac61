/* zps_shard.h - one shard: a range [lo, hi) of the flat parameter vector,
 * its optimizer state and one gradient accumulator.
 *
 * The shard is plain state and arithmetic, no sockets: the server loop
 * feeds it pushes and sends what it says is ready. Work, not workers, is
 * the unit (DESIGN.md): a push carries the mean gradient of one slice
 * [offset, offset + count) of the step's global batch for one bucket (a
 * layer cut to the range). A bucket is updated as soon as the slices pushed
 * for it tile the global batch exactly, with g = sum(n_i * g_i) / sum(n_i);
 * the first copy of a slice counts and a second is dropped, so a slice may
 * be handed to another member when its owner dies or lags, and every
 * sample still counts exactly once. */
#ifndef ZPS_SHARD_H
#define ZPS_SHARD_H

#include <stdbool.h>
#include <stdint.h>

#include "common/zps_dtype.h"
#include "common/zps_err.h"
#include "common/zps_model.h"
#include "common/zps_optim.h"
#include "common/zps_outer.h"
#include "common/zps_plan.h"
#include "common/zps_sumsq.h"
#include "common/zps_wire.h"

typedef struct zps_shard zps_shard;

typedef struct zps_shard_cfg {
    uint32_t index;               // shard number
    uint32_t shards;              // shards in the job (for checkpoints)
    uint64_t lo, hi;              // the range owned
    const zps_model_spec *model;  // borrowed: for the buckets and the initial values
    uint64_t seed;                // initial values
    uint32_t global_batch;        // B: what the slices of a step must tile
    zps_dtype dtype;              // element type of pushes and replies on the wire
    zps_optim_cfg optim;          // settings and schedule
    // A model declared by its workers: its initial values are rank 0's,
    // sent with INIT (zps_shard_take_init). Until they are all in, or a
    // checkpoint is restored, nothing is served and no push is counted.
    bool await_init;
    // Threads that share the accumulate and the update of a bucket, the
    // caller's included (0 or 1: none besides it). Element-wise: the
    // parameters are the same bits for any number.
    int threads;
    // --mode diloco: a push is a member's pseudo-gradient of its inner
    // steps (header inner_steps, 0..H; 0: the member is missing, its
    // payload counts for nothing), weighted by samples * inner steps, fp32
    // or compressed as mode.compress says; optim is the outer step.
    zps_outer_mode mode;
    // --clip-grad-norm (0: off; a synchronous job's only): no bucket is
    // updated before the whole model's gradient norm is known
    // (zps_shard_norm_due, zps_shard_clip).
    float clip_grad_norm;
    // A declared model's layout (borrowed for zps_shard_new only; NULL:
    // none): its parameter groups and buffers (common/zps_groups.h), each
    // tensor's elements updated by its own (synchronous mode only).
    const Zps__Layout *layout;
    // --deterministic --micro-batch M (0: off; synchronous mode only, B a
    // multiple of M, fp32 wire): a push is the sum of the mean gradients of
    // the micro-batches of one canonical subtree (common/zps_tree.h), whose
    // slice is its samples; the shard holds the subtrees of a bucket and
    // adds siblings, in tree order, up to the root, whose mean over the
    // B / M micro-batches is the gradient: the same bits for any split.
    uint32_t micro_batch;
} zps_shard_cfg;

// Caller owns the result; NULL on failure, logged.
zps_shard *zps_shard_new(const zps_shard_cfg *cfg);
void zps_shard_destroy(zps_shard **s);

uint64_t zps_shard_lo(const zps_shard *s);
uint64_t zps_shard_hi(const zps_shard *s);
// Steps completed: the step the shard accumulates now.
uint64_t zps_shard_step(const zps_shard *s);
int zps_shard_n_buckets(const zps_shard *s);
// Diloco --fragments: whether bucket b is of a fragment the step in
// progress does not exchange (pushes for it are refused; it keeps its
// values, and is applied with the step's first update), and the buckets
// the step does exchange (all of them without fragments).
bool zps_shard_bucket_idle(const zps_shard *s, int b);
int zps_shard_n_step_buckets(const zps_shard *s);

// Plan generation `gen` holds from effective_step on (until a newer one
// takes effect): pushes for those steps must carry gen and come from its
// members. Plans arrive in generation order; an older one is ignored.
void zps_shard_add_plan(zps_shard *s, uint32_t gen, uint64_t effective_step,
                        const zps_plan *plan);
// The plan in force at the step in progress (not the newest, which may
// only hold from the next step), or NULL before the first.
const zps_plan *zps_shard_plan(const zps_shard *s);
// True if a plan the shard knows names member_id at rank.
bool zps_shard_is_member(const zps_shard *s, uint64_t member_id, uint32_t rank);
// True if a plan the shard knows has member_id, with this rank: the
// credential of a PUSH or PULL (server/zps_msgtab.h).
bool zps_shard_member_has_rank(const zps_shard *s, uint32_t rank, uint64_t member_id);
// The newest generation known (0 before the first plan).
uint32_t zps_shard_generation(const zps_shard *s);

// Counts a PUSH (header + payload) of one slice for one bucket. Refuses,
// with the reason in why and the parameters untouched, in this order: a
// tensor of the wrong shape or dtype (ZPS_EPROTO) or out of range
// (ZPS_ERANGE); a plan generation this shard has not heard of yet
// (ZPS_EAGAIN: hold the message until the plan arrives); a push for another
// step or of a generation not in force at its step (ZPS_ESTALE); a member
// id not in that plan (ZPS_ENOENT); a slice outside the global batch, a
// sample count other than its length, a range that is not one bucket, or a
// slice overlapping another slice of the step (ZPS_EPROTO). A second copy
// of a slice already counted for the bucket, a member's push for a step
// already complete, one computed under a superseded plan, or one for a step
// the shard has not reached (it restarted; a rollback follows), returns
// ZPS_EDUP and is dropped. On success *ready is the bucket this push
// completed, or -1. The push that completes a bucket updates it, in one
// pass with its own frames (read in place); zps_shard_apply then says its
// new values may go out. A bucket's first push that does not complete it
// is kept unread: the shard takes references to m's frames (zmq_msg_copy)
// and reads them with the bucket's next push. m itself need stay valid for
// the call only, but the bytes of a frame that is a view of someone else's
// memory must not change until its free function runs (the shard's last
// reference closed) or zps_shard_settle returned.
zps_err zps_shard_push(zps_shard *s, const zps_wire_msg *m, int *ready, char *why,
                       size_t why_len);
// Reads every kept push now (into the accumulator, as each bucket's first)
// and drops the shard's references to its frames: before memory that a
// kept view reads goes away (a worker's segment unmapped).
void zps_shard_settle(zps_shard *s);

// Marks a ready bucket (updated by the push that completed it) as
// applied: zps_shard_applied turns true, and once every bucket is applied
// the step is over: zps_shard_step_done says so.
void zps_shard_apply(zps_shard *s, int bucket);
bool zps_shard_applied(const zps_shard *s, int bucket);
bool zps_shard_step_done(const zps_shard *s);
// Closes a done step: advances the step, returns its sample-weighted mean loss.
float zps_shard_end_step(zps_shard *s);

// --clip-grad-norm. With clipping on, a push that completes a bucket only
// accumulates it (*ready stays -1) and averages its gradient, g = acc / B,
// into the shard's keeping, its exact sum of squares added to the shard's
// part of the norm; once every bucket of the range is complete,
// zps_shard_norm_due turns true, with the part (the sum over the range's
// g) in *partial (may be NULL). zps_shard_clip then takes the global norm
// of `step` (that of every shard's range): torch's coefficient,
// min(max_norm / (norm + 1e-6), 1) in float32. Each zps_shard_clip_next
// then updates one more bucket, in push order, with the optimizer on
// coefficient times g, and returns it, ready (zps_shard_apply); -1 once
// all are (so its values may go out while the next is computed).
// zps_shard_clip: ZPS_ESTALE, nothing changed, when the shard is not
// waiting for the norm of `step`.
bool zps_shard_clipping(const zps_shard *s);
bool zps_shard_norm_due(const zps_shard *s, zps_sumsq *partial);
zps_err zps_shard_clip(zps_shard *s, uint64_t step, float norm);
int zps_shard_clip_next(zps_shard *s);

// Samples of the step in progress counted from `rank` (bucket 0, whose
// counted slices tile the batch once the step is done: they add up to B).
uint32_t zps_shard_counted(const zps_shard *s, uint32_t rank);

// True when the slice [offset, offset + count) was pushed for every bucket
// this step.
bool zps_shard_slice_done(const zps_shard *s, uint32_t offset, uint32_t count);

// A run [offset, offset + count) of the global batch.
typedef struct zps_shard_run {
    uint32_t offset, count;
} zps_shard_run;

// For a host leader's sum refused as partly counted (zps_shard_push's
// ZPS_EDUP: one of its pieces was counted already, its member's own copy
// first): the runs of the sum's slice that its bucket has not counted, in
// batch order: how many, the first max of them in out (as snprintf, a
// count over max says how many did not fit). They went with the dropped
// sum and nobody else pushes them unless asked to compute them again. 0
// for any other push, and for one not of the step in progress or of a
// plan replaced at it (the step is computed again). In a deterministic job
// (--micro-batch) every run starts and ends on a micro-batch: the sum and
// every push counted are nodes of the tree, and a worker pushes a run as
// its canonical nodes.
int zps_shard_uncounted(const zps_shard *s, const Zps__Header *h, zps_shard_run *out, int max);

// Where bucket b's current parameters are, in the wire dtype: *data
// (borrowed, unchanged until the bucket is next updated), its range, and
// the reference to pass to zps_wire_send to send them zero-copy.
void zps_shard_bucket_params(zps_shard *s, int b, const void **data, uint64_t *offset,
                             uint64_t *count, zps_wire_ref **ref);
// True when those wire values are bucket b's parameters as of `step`, so
// that a PULL of that step can be answered from them zero-copy: one buffer
// for every joining peer instead of a copy each.
bool zps_shard_bucket_params_are(const zps_shard *s, int b, uint64_t step);

// Writes the shard's state after its completed steps (call between steps)
// as a checkpoint in dir, keeping the newest `keep`. Logged on failure.
zps_err zps_shard_save(const zps_shard *s, const char *dir, int keep);
// Goes back to the shard's checkpoint of `step` in dir (the newest valid
// one if step is UINT64_MAX; a corrupt one is reported and the previous one
// used): parameters, optimizer state and step; the step in progress is
// forgotten. Sets *loaded to the step restored. On failure nothing changes.
zps_err zps_shard_restore(zps_shard *s, const char *dir, uint64_t step, uint64_t *loaded);

// One bucket of rank 0's initial values (an INIT: fp32, one of the
// shard's buckets, each once). *complete turns true with the last one.
// ZPS_EDUP once they are all in or a checkpoint was restored (nothing to
// take); ZPS_EPROTO for a tensor that is not one of the buckets.
zps_err zps_shard_take_init(zps_shard *s, const zps_wire_msg *m, bool *complete, char *why,
                            size_t why_len);
// An INIT may carry a learning-rate table (Header.schedule): the first
// INIT's is taken, and the update of step s in group g uses lr[s][g] (past
// the table, its last row); a later INIT whose table differs (or that has
// none when the first had one, or the reverse) is ZPS_EPROTO, as is a
// table whose groups are not the layout's. Checkpoints keep it beside them.
// The learning-rate table (copied; its sizes checked by the caller, as
// zps_groups_check_table does): what an INIT's or a checkpoint's gives.
zps_err zps_shard_set_table(zps_shard *s, uint32_t groups, uint64_t steps, const float *lr);
// Whether the shard still waits for initial values.
bool zps_shard_awaits_init(const zps_shard *s);

// Bucket b's fp32 parameters as of `step` (a worker joining or replaying
// asks for them): ZPS_OK with *values (borrowed, until the next update),
// ZPS_EAGAIN if that step is not reached yet (ask again once the bucket is
// updated), ZPS_ESTALE if it is gone.
zps_err zps_shard_bucket_at(const zps_shard *s, int b, uint64_t step, const float **values);

#endif
