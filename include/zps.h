/* zps.h - libzps, the worker side of zps as a library: the public C API.
 *
 * Any training code can be a zps worker. The caller keeps its model and its
 * training loop; libzps does everything between the caller's compute and the
 * wire: joining, plans, reassigned and speculative pieces, rollbacks,
 * rejoining, heartbeats, CURVE, pushing buckets while backward runs.
 *
 *     zps_client *c = zps_client_new("tcp://host:5555");
 *     zps_connect(c); zps_join(c);                 // the job: model, batch, ...
 *     zps_set_params(c, params, n);                // where new parameters land
 *     zps_set_dataset(c, n_train, n_test);         // optional: indices, evaluation
 *     zps_work w;
 *     for (;;) {
 *         int r = zps_next_work(c, &w);
 *         if (r == ZPS_NEXT_WORK) {                // train piece w of step w.step
 *             if (zps_work_start(c, &w) != ZPS_OK) continue;  // skipped: over already
 *             ...forward, backward; per final bucket b: zps_push_bucket(c, &w, b, grad, loss);
 *             zps_work_done(c, &w);
 *         } else if (r == ZPS_NEXT_EVAL) {         // test records [offset, offset + count)
 *             zps_eval_done(c, &w, correct, loss_sum);
 *         } else if (r == ZPS_NEXT_ROLLBACK || r == ZPS_NEXT_REJOINED) {
 *             continue;                            // params hold the step to go on from
 *         } else break;                            // DONE, OVER, STOPPED, ERROR
 *     }
 *     zps_leave(c); zps_client_destroy(&c);
 *
 * Rules: one thread drives a client; every call returns a code (zps_err, or
 * a zps_next for zps_next_work) and zps_errmsg gives the last failure's
 * sentence. The library never exits and never writes to stdout; it logs
 * through zps_set_log_hook (default: one line per message on stderr). No
 * struct layout here changes within a major version: zps_work only gains
 * fields out of its reserved tail. */
#ifndef ZPS_H
#define ZPS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ZPS_VERSION_MAJOR 1
#define ZPS_VERSION_MINOR 6
#define ZPS_VERSION_PATCH 0
#define ZPS_VERSION (ZPS_VERSION_MAJOR * 10000 + ZPS_VERSION_MINOR * 100 + ZPS_VERSION_PATCH)

// The library's version at run time (ZPS_VERSION of the build that made it);
// each pointer may be NULL.
int zps_version(int *major, int *minor, int *patch);

// ---------------------------------------------------------------------------
// Errors. The values never change; new codes are added before ZPS_ECOUNT_.
// This is the one definition: zps's servers and tools use it too (through
// common/zps_err.h), so what a server sends is a code named here.
typedef enum zps_err {
    ZPS_OK = 0,      // not an error
    ZPS_EINVAL,      // bad argument or configuration
    ZPS_EPROTO,      // malformed message from a peer
    ZPS_EVERSION,    // peer speaks another protocol version
    ZPS_EJOB,        // message belongs to another job
    ZPS_ERANGE,      // offset, count or index out of bounds
    ZPS_ESTALE,      // step or generation is not the current one
    ZPS_ENOENT,      // unknown member, file or name
    ZPS_EDUP,        // duplicate of something already counted
    ZPS_ESTATE,      // message not allowed in the current state
    ZPS_ENOMEM,      // allocation failed
    ZPS_EIO,         // file or socket I/O failed
    ZPS_ETIMEDOUT,   // a bounded wait ran out
    ZPS_ECLOSED,     // peer or job is gone
    ZPS_EAGAIN,      // not yet: hold the message and try again later
    ZPS_EPERM,       // the sender's role or credential does not allow this message
                     // (absent from 1.2.0's header, though 1.2's servers sent it all along)
    ZPS_ECOUNT_      // number of codes, not an error
} zps_err;

// Short, stable text for an error code (borrowed, never NULL).
const char *zps_strerror(zps_err err);

// ---------------------------------------------------------------------------
// Logging: process-wide, like sqlite3_config(SQLITE_CONFIG_LOG).

enum { ZPS_LOG_LEVEL_DEBUG = 0, ZPS_LOG_LEVEL_INFO, ZPS_LOG_LEVEL_WARN, ZPS_LOG_LEVEL_ERROR };

// Receives every log message at or above the level (level: ZPS_LOG_LEVEL_*;
// msg: one line without a newline, borrowed for the call). Called from the
// thread that logs, which may be the library's heartbeat thread.
typedef void (*zps_log_fn)(void *arg, int level, const char *msg);

// Sends log messages to fn instead of stderr; fn NULL restores stderr.
void zps_set_log_hook(zps_log_fn fn, void *arg);
// Messages below level (ZPS_LOG_LEVEL_*) are dropped; default INFO.
void zps_set_log_level(int level);

// ---------------------------------------------------------------------------
// The client.

typedef struct zps_client zps_client;

// A client of the job whose coordinator (shard 0) is at endpoint
// ("tcp://host:port"); nothing is sent yet. Caller owns the result
// (zps_client_destroy); NULL when memory or a ZeroMQ context runs out.
zps_client *zps_client_new(const char *coordinator);
// Closes the connections (a queued BYE still goes out within the linger)
// and frees; NULLs *c. Afterwards no gradient buffer is referenced.
void zps_client_destroy(zps_client **c);

// The last failure's code and one-line reason (borrowed, until the next
// failing call); "" and ZPS_OK when nothing failed.
const char *zps_errmsg(const zps_client *c);
zps_err zps_errcode(const zps_client *c);

typedef enum zps_opt {
    ZPS_OPT_DEVICE = 1,       // str: what this worker computes on, for the job's tables ("cpu")
    ZPS_OPT_SHARE,            // int: fixed samples of each global batch; 0 (default): split
    ZPS_OPT_TIMEOUT_MS,       // int: leave when the coordinator is silent this long (60000)
    ZPS_OPT_JOIN_TIMEOUT_MS,  // int: bound on waiting for the job to start (600000)
    // int: least heartbeat interval (1000); no beat while pushes say it;
    // two usual steps where longer (docs/choices.md, "Pushes are heartbeats")
    ZPS_OPT_HEARTBEAT_MS,
    // int: TCP send buffer per shard connection: -1 (default) auto, tuned
    // per connection (docs/running.md); 0 the OS's; else that many bytes
    ZPS_OPT_SNDBUF,
    // int: gradients to the shards on this host through shared memory
    // (a memfd; ZeroMQ carries only the header): 0 never; 1 (default) to
    // shards whose endpoint is on this host (loopback, ipc, this host's
    // name); 2 to every shard (one on another host refuses it once, and
    // the piece is pushed again as frames). A shard may refuse (--shm).
    ZPS_OPT_SHM,
} zps_opt;

// Options, before zps_connect. ZPS_EINVAL for an unknown option or a value
// out of range; a string is copied.
zps_err zps_client_set_int(zps_client *c, zps_opt opt, int64_t value);
zps_err zps_client_set_str(zps_client *c, zps_opt opt, const char *value);
// CurveZMQ: this worker's secret key file and the servers' public key file
// (zps-ctl keygen), read now: ZPS_ENOENT (no such file) or ZPS_EINVAL (not a
// key), with the reason.
zps_err zps_client_set_curve(zps_client *c, const char *secret_file, const char *server_key_file);

// Asks the client to leave: every wait returns within a poll interval and
// zps_next_work answers ZPS_NEXT_STOPPED. Async-signal-safe: may be called
// from a signal handler.
void zps_client_stop(zps_client *c);

// A model the job's server does not know (zps-server --model external):
// declared before zps_join, tensor by tensor, in the order they lie in the
// flat parameter vector (PyTorch: model.parameters()), fp32. The first
// admitted worker's declaration is the job's; every later worker's must be
// the same, or zps_join is refused with the first tensor that differs.
// A job of the built-in MLP (mlp:D0-...-Dk) admits a declaration of its
// flat layout too: per layer the weight (out, in), then the bias, as
// torch's nn.Sequential of nn.Linear; the names are the worker's own.
// Names are unique, 1..127 printable characters without spaces; ndim
// 0..8, each dimension at least 1. ZPS_EINVAL with the reason.
zps_err zps_declare_tensor(zps_client *c, const char *name, int ndim, const int64_t *shape);
// With a declared model, the dataset the job's global-batch permutation
// runs over (every worker declares the same; the server's --dataset
// size:N may fix n_train): work items then carry dataset indices, as after
// zps_set_dataset, which a declared model's caller need not call.
zps_err zps_declare_dataset(zps_client *c, uint32_t n_train, uint32_t n_test);
// 1.4: with a declared model, the max_norm of the training script's
// torch.nn.utils.clip_grad_norm_: the shards scale every step's averaged
// gradient so that its 2-norm over the whole model is at most max_norm
// (zps-server --clip-grad-norm, which wins if given: a different value is
// refused at zps_join). Before zps_join, with zps_declare_tensor; max_norm
// finite and > 0, else ZPS_EINVAL.
zps_err zps_declare_clip_grad_norm(zps_client *c, double max_norm);

// The user's optimizer, declared with the model (1.4; docs/optimizers.md):
// torch's param_groups, applied per tensor by the shards. A server started
// without optimizer flags takes them; one started with them refuses a
// declaration whose groups differ (zps_join fails, zps_errmsg names the
// first difference). Every later worker declares the same.
//
// Parameter group `group` (0..n-1, declared in order before zps_join; one
// declared again is replaced): kind ZPS_INNER_SGD, _ADAM or _ADAMW (the
// same for every group) and its hyperparameters as torch names them
// (momentum and nesterov: SGD; beta1, beta2, eps: Adam and AdamW). Without
// any, the server's flags are the optimizer. ZPS_EINVAL with the reason.
zps_err zps_declare_group(zps_client *c, int group, int kind, double lr, double momentum,
                          int nesterov, double weight_decay, double beta1, double beta2,
                          double eps);
// A declared tensor's group (default 0), before zps_join. ZPS_EINVAL.
zps_err zps_declare_tensor_group(zps_client *c, const char *name, int group);
// A buffer (1.4): a tensor of the flat vector (fp32, declared in its place
// as zps_declare_tensor does) that is not optimized. The worker pushes its
// value (the buffer after its forward) in the gradient at its range, and
// gets the new value back with the parameters: the sample-weighted mean of
// the values pushed (ZPS_BUFFER_AVERAGE), or the value pushed for the
// slice holding the global batch's sample 0 (ZPS_BUFFER_BROADCAST, as
// DDP broadcasts rank 0's buffers). ZPS_EINVAL.
enum { ZPS_BUFFER_AVERAGE = 1, ZPS_BUFFER_BROADCAST = 2 };
zps_err zps_declare_buffer(zps_client *c, const char *name, int ndim, const int64_t *shape,
                           int how);
// A learning-rate table (1.4): a torch scheduler run by rank 0 over the
// job's steps (ZPS_INFO_TOTAL_STEPS), lr[step * groups + g] the rate of
// group g in the update of step; past the table, its last row. Called
// twice: before zps_join with steps 0 and lr NULL, to announce it (a
// server given --lr or schedule flags refuses the join), then after
// zps_join and before the first zps_next_work with the table, which the
// library copies and sends with INIT when this client sends them (rank 0
// of a fresh job); otherwise it is ignored. groups must be the groups
// declared (1 without any). ZPS_EINVAL with the reason: bad sizes, a
// negative or non-finite rate, no announcement.
zps_err zps_declare_lr_table(zps_client *c, int groups, uint64_t steps, const float *lr);

// Connects to the coordinator. ZPS_EIO when the endpoint is unusable.
zps_err zps_connect(zps_client *c);
// Says HELLO until the coordinator admits this worker and sends the job
// (bounded by ZPS_OPT_JOIN_TIMEOUT_MS). ZPS_ECLOSED: the job is over, or
// zps_client_stop was called; anything else: refused or failed, see zps_errmsg.
zps_err zps_join(zps_client *c);

// ---------------------------------------------------------------------------
// The job, after zps_join.

typedef enum zps_info {
    ZPS_INFO_JOB_ID = 1,      // the job's id
    ZPS_INFO_RANK,            // this worker's rank (may change on rejoining)
    ZPS_INFO_SEED,            // the job's seed
    ZPS_INFO_GLOBAL_BATCH,    // B, samples of each step's global batch
    ZPS_INFO_TOTAL_STEPS,     // the job's steps
    ZPS_INFO_STEPS_PER_EPOCH, // steps of one pass over the data
    ZPS_INFO_START_STEP,      // the step this worker began at
    ZPS_INFO_STEP,            // the step being computed
    ZPS_INFO_N_PARAMS,        // P, floats of the flat parameter vector
    ZPS_INFO_N_BUCKETS,       // buckets of the gradient (zps_bucket_range)
    ZPS_INFO_MODE,            // ZPS_MODE_SYNC or ZPS_MODE_DILOCO (zps-server --mode)
    ZPS_INFO_INNER_STEPS,     // diloco: H, the job's inner steps per round (auto: the most)
    ZPS_INFO_INNER_OPTIM,     // diloco (1.3): the job's inner optimizer, ZPS_INNER_*
    ZPS_INFO_INNER_NESTEROV,  // diloco (1.3): 1 when its SGD momentum is Nesterov's
    ZPS_INFO_MICRO_BATCH,     // (1.6) M of a deterministic job (zps_push_micro); 0: none
    ZPS_INFO_PUSHED_BYTES,    // (1.6) gradient payload bytes this client sent on sockets (not
                              // shared memory) since zps_client_new, all steps
} zps_info;

// What a job computes. Synchronous: every step one global batch, and the
// shards' optimizer. DiLoCo (zps-server --mode diloco; docs/diloco.md):
// every step an outer round, in which this worker trains inner_steps
// global batches with its own optimizer and the library pushes its
// pseudo-gradient (the round's start minus its parameters); ZPS_INFO_STEP,
// ZPS_INFO_TOTAL_STEPS and ZPS_INFO_START_STEP count rounds then.
enum { ZPS_MODE_SYNC = 0, ZPS_MODE_DILOCO = 1 };
enum { ZPS_INFO_MODEL = 100, ZPS_INFO_DATASET }; // strings, for zps_info_str

// A number of the job; 0 for an unknown key or before zps_join.
uint64_t zps_info_u64(const zps_client *c, int key);
// The model ("mlp:784-128-10", "flat:P") or dataset name: borrowed, valid
// until the client is destroyed; "" before zps_join.
const char *zps_info_str(const zps_client *c, int key);
// Bucket b's range [*lo, *hi) of the flat vector; buckets tile it, in
// backward order of the layers (the last layer's first). ZPS_ERANGE.
zps_err zps_bucket_range(const zps_client *c, int bucket, uint64_t *lo, uint64_t *hi);

// A diloco job's inner optimizer (1.3): zps-server's --optimizer and its
// settings, for a caller that steps the job's optimizer rather than one of
// its own between zps_next_work and zps_inner_done (zps-worker does). The
// updates are torch.optim's (docs/optimizers.md): SGD with dampening 0,
// Adam with L2 decay added to the gradient, AdamW with decoupled decay.
// Its state is the caller's, kept across rounds.
enum { ZPS_INNER_SGD = 1, ZPS_INNER_ADAM, ZPS_INNER_ADAMW }; // ZPS_INFO_INNER_OPTIM
// Its real numbers, for zps_info_f64: --lr (the schedule's peak),
// --momentum (SGD), --weight-decay, --betas and --eps (Adam, AdamW).
enum {
    ZPS_INFO_INNER_LR = 200,
    ZPS_INFO_INNER_MOMENTUM,
    ZPS_INFO_INNER_WEIGHT_DECAY,
    ZPS_INFO_INNER_BETA1,
    ZPS_INFO_INNER_BETA2,
    ZPS_INFO_INNER_EPS,
};
// A real number of the job (1.3): a key above; 0 for an unknown key,
// before zps_join, and in a synchronous job. A float setting (--lr,
// --momentum, --weight-decay) comes back exactly, so (float) gives its bits.
double zps_info_f64(const zps_client *c, int key);
// The inner learning rate of the update that trains global batch step
// (zps_work.step of an inner step) (1.3): ZPS_INFO_INNER_LR under the job's
// --lr-schedule and --warmup-steps, run over every inner step of the job
// as one process's would run over its steps. A float's value, exactly;
// 0 before zps_join and in a synchronous job.
double zps_inner_lr(const zps_client *c, uint64_t step);

// The caller's parameter buffer, n = ZPS_INFO_N_PARAMS floats, borrowed
// until destroy. With a declared model, rank 0 of a job's first start
// (ZPS_INFO_RANK 0, ZPS_INFO_START_STEP 0) sends what the buffer holds at
// the first zps_next_work as the job's initial values, as Horovod's
// broadcast_parameters(root_rank=0): every worker then trains from them. The library writes a step's parameters into it only when
// all of them arrived and no piece of the step before is still computed
// (they arrive in a buffer of its own): between zps_next_work calls the
// buffer holds the parameters of the piece handed out.
zps_err zps_set_params(zps_client *c, float *params, size_t n);
// Declares the dataset the job's global-batch permutation runs over: with
// it, work items carry their dataset indices and the end of every epoch
// asks for evaluation items. Its steps per epoch must be the job's (ZPS_EINVAL).
zps_err zps_set_dataset(zps_client *c, uint32_t n_train, uint32_t n_test);

// ---------------------------------------------------------------------------
// Work.

typedef enum zps_work_kind {
    ZPS_WORK_TRAIN = 1, // train samples [offset, offset + count) of step's global batch
    ZPS_WORK_EVAL,      // evaluate test records [offset, offset + count)
} zps_work_kind;

// A work item: filled by zps_next_work, passed back to the calls below.
typedef struct zps_work {
    uint32_t kind;            // zps_work_kind
    uint32_t id;              // the library's, for checking
    uint64_t step;            // the step the piece belongs to
    uint64_t epoch;           // its epoch (step / steps per epoch)
    uint32_t offset, count;   // the piece of the global batch (EVAL: of the test set)
    const uint32_t *indices;  // TRAIN with a dataset: count train indices; borrowed
                              // until the next zps_next_work; else NULL
    double data_ms;           // set by the caller: ms spent loading it (metrics)
    // Diloco (1.2): this TRAIN item is inner step `inner` (0-based) of the
    // inner_steps this worker takes in outer round `round`; step is then
    // the global batch it trains, round * H + inner. All 0 in sync mode.
    uint32_t inner, inner_steps;
    uint64_t round;
    uint64_t reserved_[4];    // future fields; zero
} zps_work;

typedef enum zps_next {
    ZPS_NEXT_ERROR = -1,  // failed: zps_errcode, zps_errmsg; the client is spent
    ZPS_NEXT_WORK = 1,    // *out: a piece to train, on the parameters in the buffer
    ZPS_NEXT_EVAL,        // *out: test records to evaluate (zps_eval_done)
    ZPS_NEXT_ROLLBACK,    // the job went on at another step (a shard back from its
                          // checkpoint, or this worker catching up): the buffer holds it
    ZPS_NEXT_REJOINED,    // handed on (evicted while paused) and admitted again, or
                          // admitted anew (a JOB answering a HELLO said again):
                          // another member, whose ZPS_INFO_RANK may differ
    ZPS_NEXT_DONE,        // the job's last step is over: final parameters in the buffer
    ZPS_NEXT_OVER,        // the job ended without this worker
    ZPS_NEXT_STOPPED,     // zps_client_stop was called
} zps_next;

// The next thing to do, waiting for it as long as the job lives (every
// wait bounded by ZPS_OPT_TIMEOUT_MS of silence and logged every few
// seconds). Several pieces of a step come one after the other when the
// coordinator hands this worker a reassigned or speculative piece; one may
// come while the next step's parameters are awaited, and is computed on
// the parameters of its step, still in the buffer. The gradient buffer of
// the last pushes must not change before this returns.
int zps_next_work(zps_client *c, zps_work *out);

// Just before computing TRAIN item w (after loading its data): ZPS_OK to
// compute it; ZPS_EAGAIN when its step was done without this worker during
// a long pause: skip it, and zps_next_work catches up.
zps_err zps_work_start(zps_client *c, const zps_work *w);
// Pushes bucket b of w's mean gradient over its samples, grad being the
// whole flat gradient (P floats; the bucket's range is read, zero-copy:
// unchanged until the next zps_next_work), with the piece's mean loss.
// Call it as soon as the bucket is final, in any order, once per bucket.
zps_err zps_push_bucket(zps_client *c, const zps_work *w, int bucket, const float *grad,
                        float loss);
// A deterministic job (1.6; zps-server --deterministic --micro-batch M;
// docs/deterministic.md), whose bits do not depend on the split: with
// ZPS_INFO_MICRO_BATCH M > 0, every TRAIN item's offset and count are
// multiples of M, and zps_push_bucket is refused. Compute the item as
// count / M micro-batches, micro-batch i being samples [i*M, (i+1)*M) of
// the piece (indices[i*M ..]), each on its own with the same kernel on the
// same shapes (a fixed thread count), and push each one's mean gradient
// over its M samples, bucket by bucket as each is final, micro-batches in
// order (0, 1, ... for every bucket); loss is the micro-batch's mean loss.
// grad is read at once (the library keeps what it needs: the caller may
// reuse it when the call returns). The library sums micro-batches in the
// job's one order, a balanced tree over the global batch's B / M
// micro-batches, and pushes the sums of the piece's canonical subtrees once
// a bucket's last micro-batch is in; the shards finish the tree. So a
// micro-batch's sum is the same bits whoever computes it.
zps_err zps_push_micro(zps_client *c, const zps_work *w, uint32_t micro, int bucket,
                       const float *grad, float loss);
// w is computed and every bucket pushed; the first failed push's code.
zps_err zps_work_done(zps_client *c, const zps_work *w);
// Diloco, instead of zps_push_bucket and zps_work_done: inner step w is
// done (forward, backward, and the caller's own optimizer step on the
// parameter buffer), with its mean loss over the piece. After the round's
// last one the library pushes the pseudo-gradient to the shards (fp32, or
// compressed with error feedback, as the job says); the next
// zps_next_work waits for the round's outer parameters, which it writes
// into the buffer: every worker then holds the same bits. Keep the inner
// optimizer's state across rounds, as DiLoCo does.
zps_err zps_inner_done(zps_client *c, const zps_work *w, float loss);
// EVAL item w: of its count records, `correct` were classified right and
// their losses sum to loss_sum. Sent to the coordinator.
zps_err zps_eval_done(zps_client *c, const zps_work *w, uint32_t correct, double loss_sum);

// The train indices of [offset, offset + count) of step's global batch as
// every zps job orders its data: epoch e is one permutation of [0, n_train)
// seeded by (seed, e), step t the (t mod S)-th run of global_batch indices
// of epoch t / S, S = n_train / global_batch. What one process training on
// the global batch sees (a single-process reference, a data loader); the
// indices of a work item are these. out holds count; ZPS_EINVAL, ZPS_ENOMEM.
zps_err zps_batch_indices(uint64_t seed, uint32_t n_train, uint32_t global_batch, uint64_t step,
                          uint32_t offset, uint32_t count, uint32_t *out);

// Leaves the job: BYE at the step reached (after ZPS_NEXT_DONE: the end of
// the job), so the coordinator hands this worker's share on at once.
zps_err zps_leave(zps_client *c);

// ---------------------------------------------------------------------------
// A job's checkpoints (1.5): what zps-server --checkpoint-dir DIR leaves
// (every shard's shard-<I>-step-<T>.ckpt: its range of the flat vector and
// the optimizer's state there; with --model external the declared model
// too), read back whole, with the checks a restarted shard makes (size,
// format, CRC-32, every shard of the same job and step). No server is
// needed. python3 -m zps.checkpoint and zps.torch.load_checkpoint use it.

typedef struct zps_checkpoint zps_checkpoint;

// Opens the checkpoint of `step` in dir, or with step < 0 the newest step
// that every shard has a valid file of (a step missing from one shard, or
// whose file there is damaged, is passed over for the one before), and
// reads it whole into memory. Caller owns *out (zps_checkpoint_destroy).
// ZPS_ENOENT: no such step, or none complete; ZPS_EPROTO: the files do not
// make one job's vector; ZPS_EIO, ZPS_ENOMEM. The reason goes in why (len
// bytes, NUL-ended) when why is not NULL.
zps_err zps_checkpoint_open(const char *dir, int64_t step, zps_checkpoint **out, char *why,
                            size_t len);
// Frees; NULLs *k.
void zps_checkpoint_destroy(zps_checkpoint **k);

// Its numbers, for zps_checkpoint_info: the step (steps completed), the
// shards, P (floats of the flat vector), the optimizer (ZPS_INNER_SGD,
// _ADAM, _ADAMW) and its update count (Adam's t), the job's seed, the
// declared model's tensors and parameter groups (0 when the directory has
// no declared model: a job of a built-in model).
enum {
    ZPS_CHECKPOINT_STEP = 300,
    ZPS_CHECKPOINT_SHARDS,
    ZPS_CHECKPOINT_N_PARAMS,
    ZPS_CHECKPOINT_OPTIM,
    ZPS_CHECKPOINT_OPTIM_STEP,
    ZPS_CHECKPOINT_SEED,
    ZPS_CHECKPOINT_N_TENSORS,
    ZPS_CHECKPOINT_N_GROUPS,
};
// A number above; 0 for an unknown key.
uint64_t zps_checkpoint_info(const zps_checkpoint *k, int key);
// Tensor i of the declared model, in flat-vector order: its name
// (borrowed, until destroy), ndim and shape (at most 8 dimensions), its
// parameter group, and role (0 a parameter; ZPS_BUFFER_AVERAGE or
// _BROADCAST a buffer). ZPS_ERANGE.
zps_err zps_checkpoint_tensor(const zps_checkpoint *k, int i, const char **name, int *ndim,
                              int64_t *shape, int *group, int *role);
// Parameter group g as it was declared (zps_declare_group's values).
// ZPS_ERANGE.
zps_err zps_checkpoint_group(const zps_checkpoint *k, int g, int *kind, double *lr,
                             double *momentum, int *nesterov, double *weight_decay,
                             double *beta1, double *beta2, double *eps);
// Copies one array of P floats into out (n must be P): the parameters, or
// a slot of the optimizer's state: SGD's momentum buffer (ZPS_CHECKPOINT_STATE_0);
// Adam's exp_avg (_0) and exp_avg_sq (_1). ZPS_EINVAL for another n, ZPS_ERANGE
// for a slot the optimizer has not.
enum { ZPS_CHECKPOINT_PARAMS = 0, ZPS_CHECKPOINT_STATE_0, ZPS_CHECKPOINT_STATE_1 };
zps_err zps_checkpoint_read(const zps_checkpoint *k, int what, float *out, size_t n);

#ifdef __cplusplus
}
#endif

#endif
