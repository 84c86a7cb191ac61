/* main.c - zps-worker: trains its slice of every global batch.
 *
 * It needs one address, the coordinator's. It says HELLO, receives the job
 * (model, dataset, plan, shards), pulls the parameters and loops: gather its
 * slice, forward and backward, push the mean gradient to every shard, and
 * drop the shards' new parameters in place. Every wait is bounded and says
 * what it waits for. */
#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/zps_clock.h"
#include "common/zps_curve.h"
#include "common/zps_dataset.h"
#include "common/zps_dtype.h"
#include "common/zps_flags.h"
#include "common/zps_log.h"
#include "common/zps_model.h"
#include "common/zps_pidfile.h"
#include "common/zps_plan.h"
#include "common/zps_rng.h"
#include "common/zps_wire.h"
#include "worker/zps_backend.h"
#include "worker/zps_heartbeat.h"
#include "worker/zps_sampler.h"
#include "worker/zps_schedule.h"

#define ZPS_WORKER_MAX_SHARDS 64
#define ZPS_WORKER_POLL_MS 1000
#define ZPS_WORKER_WAIT_LOG_MS 5000.0
#define ZPS_WORKER_EVAL_CHUNK 1024u
#define ZPS_WORKER_LATE_STEPS 2.0  // a slice not begun this many usual steps in: ask first
#define ZPS_WORKER_ASK_MS 500      // bound on the coordinator's answer to that
#define ZPS_WORKER_CALIBRATE 20    // --slowdown: computes that fix the time per sample
#define ZPS_WORKER_ASK_EVERY_MS 1000.0 // waiting for parameters: ask where the job is this often
#define ZPS_WORKER_RETRY_MS 20     // first wait before sending a "not yet" message again
#define ZPS_WORKER_RETRY_MAX_MS 1000 // longest such wait (doubling)
#define ZPS_WORKER_HELLO_AGAIN_MS 3000 // waiting for the JOB: HELLO again this often

typedef struct s_opts {
    const char *coordinator;  // endpoint of shard 0
    const char *device;       // "cpu", "cuda" or "cuda:N"
    zps_gpu_math gpu_math;    // what cuBLAS may use on a GPU
    bool check_device;        // only check that device can compute here
    uint32_t share;           // fixed share of the global batch, 0: split the rest
    const char *save_params;  // final flat vector, or NULL
    const char *cache_dir;    // decompressed datasets
    int threads;              // OpenBLAS threads
    int timeout_ms;           // bound on any reply of the running job
    int join_timeout_ms;      // bound on waiting for the job to start
    bool no_overlap;          // push after backward, not during (to measure the overlap)
    int heartbeat_ms;         // interval of the heartbeat to the coordinator
    const char *curve_secret; // CurveZMQ: this worker's secret key, or NULL
    const char *server_key;   // CurveZMQ: the servers' public key
    double slowdown;          // fault injection: compute takes this many times longer
    double stall_prob;        // fault injection: chance of a pause per step
    int stall_ms;             // fault injection: length of a pause
    uint64_t stall_seed;      // fault injection: draws which steps pause
    bool stall_seed_set;      // --stall-seed given (else the pid draws)
    const char *pid_file;     // for supervisors, or NULL
    int sndbuf;               // TCP send buffer of the shard sockets (0: the OS's)
} s_opts;

typedef struct s_shard_conn {
    void *sock;                                 // owned (shard 0: the coordinator's socket)
    char endpoint[256];                         // for log lines
    uint64_t lo, hi;                            // its range
    int n_buckets;                              // buckets of the range
    zps_bucket buckets[ZPS_MODEL_MAX_BUCKETS];  // as the shard sees them
    zps_bucket_set received;                    // buckets of parameters in this step
} s_shard_conn;

typedef struct s_worker {
    s_opts opts;                                  // flags
    void *ctx;                                    // owned
    s_shard_conn shards[ZPS_WORKER_MAX_SHARDS];   // shards[0] is the coordinator
    int n_shards;
    uint64_t job_id;                              // from JOB
    uint32_t rank;                                // from JOB
    uint64_t member_id;                           // from JOB, carried by pushes
    uint32_t global_batch;                        // B
    zps_schedule schedule;                        // what to compute at each step
    zps_heartbeat *heartbeat;                     // owned
    zps_curve curve;                              // CURVE keys, if on
    uint64_t seed, total_steps, steps_per_epoch, start_step;
    zps_model_spec model;
    zps_dtype dtype;                              // tensors on the wire
    zps_backend *be;                              // owned: the model's compute
    zps_dataset *data;                            // owned
    zps_sampler sampler;                          // owned
    float *x;                                     // owned: (max(count, eval chunk), inputs)
    uint32_t *labels;                             // owned: same rows
    uint32_t *eval_idx;                           // owned: ZPS_WORKER_EVAL_CHUNK indices
    uint8_t *wire;                                // owned: gradient in a 16-bit wire dtype
    zps_wire_ref grad_ref;                        // grads (or wire) still held by ZeroMQ
    float *next;                                  // owned: parameters of the next step, arriving
    uint64_t cur_step;                            // the step being computed, for the hook
    zps_work cur_work;                            // the slice being computed, for the hook
    double step_t0;                               // when it started (data, compute timings)
    double data_ms;                               // its data time
    zps_err push_err;                             // first failed push of the step
    uint64_t rollback_to;                         // step to start over from after a ROLLBACK
    uint64_t fault_seed;                          // draws the injected pauses, with the step
    uint64_t fault_step;                          // the step they were last drawn for
    double ms_per_sample;                         // --slowdown: own compute per sample
    int n_calib;                                  // computes it was measured on
    double params_ms;                             // when the current parameters were taken
    double usual_step_ms;                         // running mean of the time between those
    void *ask;                                    // owned: DEALER to the coordinator, STATUS only
    uint64_t done_step;                           // the step of the slices below
    zps_work done[1 + ZPS_SCHEDULE_EXTRAS];       // the slices computed of it, pieces too
    int n_done;
    double sum_data_ms, sum_compute_ms, sum_wait_ms; // per-step phases, summed
    uint64_t timed_steps;                         // steps in those sums
    uint64_t stopped_at;                          // the step a signal interrupted
    double pull_again_ms[ZPS_WORKER_MAX_SHARDS];  // when to send a refused PULL again (0: no)
    int retry_ms;                                 // the next "not yet" backoff
    double redo_ms;                               // when to compute refused pushes again (0: no)
    double next_ask_ms;                           // next "where is the job" while waiting
    double answered_ms;                           // the coordinator's last answer to that
    bool rejoin;                                  // handed on by the coordinator: HELLO again
    uint64_t ahead_of;                            // the job's step at the last ask, if behind us
    bool job_over;                                // the coordinator said the job is over
} s_worker;

// SIGTERM or SIGINT: every wait returns ZPS_ECLOSED within a poll interval,
// and the worker leaves the job instead of finishing it.
static volatile sig_atomic_t s_stop;

static void s_on_signal(int sig)
{
    (void)sig;
    s_stop = 1;
}

// ---------------------------------------------------------------------------
// Replies: bounded waits that say what they wait for.

// How the worker takes a refusal: every ERROR reply is judged here, once.
typedef enum s_verdict {
    S_RETRY, // "not yet": send the same again after a bounded backoff
    S_LOST,  // this worker may have been handed on: ask the coordinator
    S_OVER,  // the job is over
    S_FINAL, // refused for good: the worker ends (exit status 1)
} s_verdict;

static s_verdict s_judge(const Zps__Header *h, const char *from)
{
    zps_err code = h->error_code > 0 && h->error_code < ZPS_ECOUNT_ ? (zps_err)h->error_code
                                                                    : ZPS_EPROTO;
    const char *what = zps_wire_type_name((int)h->refused);
    const char *why = h->error ? h->error : "";
    switch (code) {
    case ZPS_EAGAIN:
        zps_log_info("%s: not yet (%s of step %llu): %s; sending again", from, what,
                     (unsigned long long)h->step, why);
        return S_RETRY;
    case ZPS_ECLOSED:
        zps_log_info("%s: the job is over: %s", from, why);
        return S_OVER;
    case ZPS_ENOENT:
    case ZPS_ESTALE:
        zps_log_warn("%s refused %s of step %llu: %s (%s); asking the coordinator where the job "
                     "is", from, what, (unsigned long long)h->step, why, zps_strerror(code));
        return S_LOST;
    default:
        zps_log_error("%s refused this worker for good: %s (%s)", from, why,
                      zps_strerror(code));
        return S_FINAL;
    }
}

// Receives the next message on sock into m, waiting at most timeout_ms and
// logging every few seconds. An ERROR is judged (s_judge): "not yet"
// returns ZPS_EAGAIN, the end of the job ZPS_ECLOSED, anything else its
// code.
static zps_err s_await(void *sock, const char *what, const char *endpoint, int timeout_ms,
                       zps_wire_msg *m)
{
    double start = zps_clock_ms(), next_log = start + ZPS_WORKER_WAIT_LOG_MS;
    for (;;) {
        zps_err err = zps_wire_recv(sock, false, m);
        if (err == ZPS_OK && m->hdr->type == ZPS__MSG_TYPE__ERROR &&
            (m->hdr->refused == ZPS__MSG_TYPE__PUSH || m->hdr->refused == ZPS__MSG_TYPE__PULL)) {
            // The answer to a push or pull from before (joining again after
            // a pause): what is awaited here is something else.
            zps_log_debug("%s: an old refusal of a %s, ignored", endpoint,
                          zps_wire_type_name((int)m->hdr->refused));
            zps_wire_msg_fini(m);
            continue;
        }
        if (err == ZPS_OK && m->hdr->type == ZPS__MSG_TYPE__ERROR) {
            switch (s_judge(m->hdr, endpoint)) {
            case S_RETRY: return ZPS_EAGAIN;
            case S_OVER: return ZPS_ECLOSED;
            default:
                return m->hdr->error_code > 0 && m->hdr->error_code < ZPS_ECOUNT_
                           ? (zps_err)m->hdr->error_code : ZPS_EPROTO;
            }
        }
        if (err != ZPS_ETIMEDOUT) {
            if (err != ZPS_OK) {
                zps_log_error("bad reply from %s while waiting for %s: %s", endpoint, what,
                              zps_strerror(err));
            }
            return err;
        }
        zps_wire_msg_fini(m);
        if (s_stop) {
            return ZPS_ECLOSED;
        }
        double now = zps_clock_ms();
        if (now - start > timeout_ms) {
            if (timeout_ms > ZPS_WORKER_HELLO_AGAIN_MS) { // shorter waits are retried
                zps_log_error("gave up after %.0f s waiting for %s from %s",
                              (now - start) / 1e3, what, endpoint);
            }
            return ZPS_ETIMEDOUT;
        }
        if (now > next_log) {
            zps_log_info("waiting %.0f s for %s from %s", (now - start) / 1e3, what, endpoint);
            next_log = now + ZPS_WORKER_WAIT_LOG_MS;
        }
    }
}

static zps_err s_send(s_worker *w, int shard, Zps__Header *h, const void *payload, size_t bytes,
                      zps_wire_ref *ref)
{
    h->job_id = w->job_id;
    h->rank = w->rank;
    h->member_id = w->member_id;
    zps_err err = zps_wire_send(w->shards[shard].sock, NULL, h, payload, bytes, ref);
    if (err != ZPS_OK) {
        zps_log_error("could not send %s to %s: %s", zps_wire_type_name(h->type),
                      w->shards[shard].endpoint, zps_strerror(err));
    }
    return err;
}

// ---------------------------------------------------------------------------
// Joining: HELLO, JOB, model, data, first parameters.

static zps_err s_hello(s_worker *w)
{
    char host[64] = "?";
    gethostname(host, sizeof host - 1);
    Zps__Hello hello = ZPS__HELLO__INIT;
    hello.host = host;
    hello.device = (char *)w->opts.device;
    hello.share = w->opts.share;
    hello.pid = (uint32_t)getpid();
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__HELLO);
    h.hello = &hello;
    return s_send(w, 0, &h, NULL, 0, NULL);
}

static zps_err s_take_shards(s_worker *w, const Zps__Job *job)
{
    if (job->n_shards == 0 || job->n_shards > ZPS_WORKER_MAX_SHARDS) {
        zps_log_error("job names %zu shards (1..%d)", job->n_shards, ZPS_WORKER_MAX_SHARDS);
        return ZPS_EPROTO;
    }
    uint64_t next = 0;
    for (size_t i = 0; i < job->n_shards; i++) {
        const Zps__ShardInfo *si = job->shards[i];
        if (si->index != i || si->lo != next || si->hi <= si->lo) {
            zps_log_error("job's shard %zu range [%llu, %llu) does not follow the previous one",
                          i, (unsigned long long)si->lo, (unsigned long long)si->hi);
            return ZPS_EPROTO;
        }
        next = si->hi;
        s_shard_conn *sc = &w->shards[i];
        sc->lo = si->lo;
        sc->hi = si->hi;
        if (i == 0) {
            continue; // the coordinator's socket, already connected
        }
        if (sc->sock && strcmp(sc->endpoint, si->endpoint) == 0) {
            continue; // joining again: the connection of before serves
        }
        if (sc->sock) {
            (void)zmq_close(sc->sock); // fails only for a handle that is not a socket
        }
        snprintf(sc->endpoint, sizeof sc->endpoint, "%s", si->endpoint);
        sc->sock = zps_wire_socket(w->ctx, ZMQ_DEALER, ZPS_WORKER_POLL_MS);
        zps_curve cv = w->curve; // a shard with a key pair of its own: the coordinator knows it
        if (i < job->n_shard_keys && strlen(job->shard_keys[i]) == ZPS_CURVE_KEY_LEN) {
            memcpy(cv.server, job->shard_keys[i], sizeof cv.server);
        }
        if (!sc->sock || zps_wire_set_sndbuf(sc->sock, w->opts.sndbuf) != ZPS_OK ||
            zps_curve_client(&cv, sc->sock) != ZPS_OK ||
            zmq_connect(sc->sock, sc->endpoint) != 0) {
            zps_log_error("cannot connect to shard %zu at %s", i, sc->endpoint);
            return ZPS_EIO;
        }
    }
    w->n_shards = (int)job->n_shards;
    for (int i = 0; i < w->n_shards; i++) {
        s_shard_conn *sc = &w->shards[i];
        sc->n_buckets = zps_model_range_buckets(&w->model, sc->lo, sc->hi, sc->buckets);
    }
    if (next != w->model.n_params) {
        zps_log_error("shards cover %llu parameters, the model has %zu",
                      (unsigned long long)next, w->model.n_params);
        return ZPS_EPROTO;
    }
    return ZPS_OK;
}

// A plan (and extras) from JOB or PLAN: into the schedule.
static zps_err s_take_plan(s_worker *w, Zps__Slice *const *slices, size_t n_slices, uint32_t gen,
                           uint64_t effective, Zps__Extra *const *extras, size_t n_extras)
{
    zps_plan plan;
    if (zps_plan_from_wire(slices, n_slices, w->global_batch, &plan) != ZPS_OK) {
        zps_log_error("the coordinator sent an inconsistent plan (generation %u)", gen);
        return ZPS_EPROTO;
    }
    zps_schedule_add_plan(&w->schedule, gen, effective, &plan);
    for (size_t i = 0; i < n_extras; i++) {
        const Zps__Extra *e = extras[i];
        if (e->rank == w->rank && e->count > 0 && e->count <= w->global_batch &&
            e->offset <= w->global_batch - e->count) {
            zps_schedule_add_extra(&w->schedule, e->step,
                                   (zps_work){.offset = e->offset, .count = e->count,
                                              .gen = e->generation});
            zps_log_info("handed slice [%u, %u) of step %llu", e->offset, e->offset + e->count,
                         (unsigned long long)e->step);
        }
    }
    return ZPS_OK;
}

static zps_err s_take_job(s_worker *w, const Zps__Header *h)
{
    const Zps__Job *job = h->job;
    if (!job || zps_model_parse(job->model, &w->model) != ZPS_OK ||
        !zps_dtype_valid((int)job->wire_dtype) || job->steps_per_epoch == 0 ||
        job->global_batch == 0) {
        zps_log_error("the coordinator sent a job without a usable model or wire dtype");
        return ZPS_EPROTO;
    }
    if (w->be && (h->job_id != w->job_id || (zps_dtype)job->wire_dtype != w->dtype ||
                  job->seed != w->seed || job->global_batch != w->global_batch)) {
        // Joining again: the model, data and buffers of before must fit.
        zps_log_error("joining again, the coordinator gave another job (%016llx)",
                      (unsigned long long)h->job_id);
        return ZPS_EPROTO;
    }
    w->dtype = (zps_dtype)job->wire_dtype;
    w->job_id = h->job_id;
    w->rank = job->rank;
    w->member_id = job->member_id;
    w->seed = job->seed;
    w->global_batch = job->global_batch;
    w->total_steps = job->total_steps;
    w->steps_per_epoch = job->steps_per_epoch;
    w->start_step = job->start_step;
    zps_schedule_init(&w->schedule, w->rank);
    zps_err err = s_take_plan(w, job->plan, job->n_plan, job->generation, job->plan_effective,
                              job->extras, job->n_extras);
    if (err != ZPS_OK) {
        return err;
    }
    char name[32];
    snprintf(name, sizeof name, "worker[%u]", w->rank);
    zps_log_set_name(name);
    zps_log_info("job %016llx: rank %u from step %llu, global batch %u, model %s, dataset %s",
                 (unsigned long long)w->job_id, w->rank, (unsigned long long)w->start_step,
                 w->global_batch, job->model, job->dataset);
    return s_take_shards(w, job);
}

static void s_on_bucket(void *arg, int bucket);

static zps_err s_setup_data(s_worker *w, const char *dataset, uint32_t rows)
{
    zps_dataset_spec ds;
    if (zps_dataset_parse(dataset, &ds) != ZPS_OK) {
        return ZPS_EINVAL;
    }
    uint32_t dim = zps_model_inputs(&w->model);
    w->data = zps_dataset_open(&ds, w->opts.cache_dir, w->seed, dim, zps_model_classes(&w->model));
    if (!w->data) {
        return ZPS_EIO;
    }
    zps_err err = zps_sampler_init(&w->sampler, w->seed, zps_dataset_size(w->data, ZPS_SPLIT_TRAIN),
                                   w->global_batch);
    if (err != ZPS_OK) {
        return err;
    }
    if (w->sampler.steps_per_epoch != w->steps_per_epoch) {
        zps_log_error("my dataset gives %llu steps per epoch, the job %llu",
                      (unsigned long long)w->sampler.steps_per_epoch,
                      (unsigned long long)w->steps_per_epoch);
        return ZPS_EINVAL;
    }
    w->x = malloc((size_t)rows * (dim ? dim : 1) * sizeof(float));
    w->labels = malloc(rows * sizeof(uint32_t));
    w->eval_idx = malloc(ZPS_WORKER_EVAL_CHUNK * sizeof(uint32_t));
    if (!w->x || !w->labels || !w->eval_idx) {
        zps_log_error("cannot allocate batch buffers (%u rows)", rows);
        return ZPS_ENOMEM;
    }
    return ZPS_OK;
}

static zps_err s_setup_compute(s_worker *w, const char *dataset)
{
    // Any slice of the batch may be handed to this worker.
    uint32_t rows = w->global_batch > ZPS_WORKER_EVAL_CHUNK ? w->global_batch
                                                           : ZPS_WORKER_EVAL_CHUNK;
    w->be = zps_backend_new(w->opts.device, w->opts.gpu_math, &w->model, rows,
                            w->seed ^ w->rank);
    if (!w->be) {
        return ZPS_EINVAL;
    }
    zps_backend_set_bucket_hook(w->be, s_on_bucket, w);
    if ((w->dtype != ZPS_DTYPE_F32 &&
         !(w->wire = malloc(w->model.n_params * zps_dtype_size(w->dtype)))) ||
        !(w->next = malloc(w->model.n_params * sizeof(float)))) {
        zps_log_error("cannot allocate the wire and parameter buffers");
        return ZPS_ENOMEM;
    }
    return zps_backend_uses_data(w->be) ? s_setup_data(w, dataset, rows) : ZPS_OK;
}

// A refusal from shard i while waiting for `step`'s parameters. "Not yet"
// sends the same again after a bounded backoff: a PULL as it was, a PUSH
// by computing its piece again (the gradient buffer has moved on; the
// compute is deterministic, so the piece gives the same gradient). "Lost"
// asks the coordinator at once where the job is.
// When to send a refused message again: the backoff now, doubled for the
// next refusal up to ZPS_WORKER_RETRY_MAX_MS (a bucket taken resets it).
static double s_backoff(s_worker *w)
{
    double at = zps_clock_ms() + w->retry_ms;
    w->retry_ms = w->retry_ms * 2 < ZPS_WORKER_RETRY_MAX_MS ? w->retry_ms * 2
                                                            : ZPS_WORKER_RETRY_MAX_MS;
    return at;
}

static zps_err s_on_refusal(s_worker *w, int i, uint64_t step, const Zps__Header *h)
{
    switch (s_judge(h, w->shards[i].endpoint)) {
    case S_RETRY: {
        double at = s_backoff(w);
        if (h->refused == ZPS__MSG_TYPE__PULL) {
            w->pull_again_ms[i] = at;
        } else if (h->refused == ZPS__MSG_TYPE__PUSH && step > 0 && h->step == step - 1 &&
                   h->samples > 0 && h->samples <= w->global_batch &&
                   h->batch_offset <= w->global_batch - h->samples) {
            zps_schedule_add_extra(&w->schedule, h->step,
                                   (zps_work){.offset = h->batch_offset, .count = h->samples,
                                              .gen = h->generation});
            w->redo_ms = at;
        }
        return ZPS_OK;
    }
    case S_LOST:
        // A PULL refused as from an unknown member may be a joiner's that
        // overtook the plan naming it: asked again, after asking the
        // coordinator, which says whether this worker was handed on.
        w->next_ask_ms = 0;
        if (h->refused == ZPS__MSG_TYPE__PULL) {
            w->pull_again_ms[i] = s_backoff(w);
        }
        return ZPS_OK;
    case S_OVER:
        w->job_over = true;
        return ZPS_ECLOSED;
    default:
        return ZPS_ECLOSED;
    }
}

// A JOB while training: the answer to a HELLO said again after a pause
// long enough that the member the first JOB named was evicted since, so
// the coordinator admitted this socket anew. The newer JOB is the member
// the coordinator knows; it is taken as on a rejoin. A copy of the JOB in
// hand changes nothing.
static zps_err s_become(s_worker *w, const Zps__Header *h);

static zps_err s_take_late_job(s_worker *w, const Zps__Header *h)
{
    if (!h->job || h->job->member_id == w->member_id) {
        return ZPS_OK;
    }
    zps_log_warn("rank %u was admitted again, as rank %u (a HELLO said again during a pause): "
                 "going on as that member", w->rank, h->job->rank);
    zps_err err = s_become(w, h);
    return err == ZPS_OK ? ZPS_EAGAIN : err;
}

// Checks a PARAMS message from shard i against what step `step` expects
// and drops its bucket into the model.
static zps_err s_take_bucket(s_worker *w, int i, uint64_t step, const zps_wire_msg *m)
{
    s_shard_conn *sc = &w->shards[i];
    const Zps__Header *h = m->hdr;
    char why[160] = "";
    int b = -1;
    if (h->type == ZPS__MSG_TYPE__ERROR) {
        return s_on_refusal(w, i, step, h);
    }
    if (h->type == ZPS__MSG_TYPE__PARAMS && h->step < step) {
        return ZPS_OK; // a late answer for a step already over: nothing to take
    }
    if (h->type == ZPS__MSG_TYPE__PARAMS && h->step > step) {
        // Either the job went on without this worker (its slices handed on
        // while it stalled), or these are from before a rollback, queued
        // while it was away: only the coordinator knows which. Asked now;
        // the answer says whether to catch up (s_where_is_job).
        w->next_ask_ms = 0;
        return ZPS_OK;
    }
    if (i == 0 && h->type == ZPS__MSG_TYPE__JOB) {
        return s_take_late_job(w, h);
    }
    if (h->type != ZPS__MSG_TYPE__PARAMS || h->step != step) {
        snprintf(why, sizeof why, "%s for step %llu, expected PARAMS for step %llu",
                 zps_wire_type_name(h->type), (unsigned long long)h->step,
                 (unsigned long long)step);
    } else if (zps_wire_check_tensor(m, (int)w->dtype, sc->lo, sc->hi, why, sizeof why) == ZPS_OK) {
        for (int k = 0; k < sc->n_buckets; k++) {
            if (sc->buckets[k].lo == h->offset && sc->buckets[k].hi == h->offset + h->count) {
                b = k;
            }
        }
        if (b >= 0 && zps_bucket_set_has(&sc->received, b)) {
            // A second answer (to a pull and a push both): the same values.
            return ZPS_OK;
        }
        if (b < 0) {
            snprintf(why, sizeof why, "[%llu, +%llu) is not one of the shard's buckets",
                     (unsigned long long)h->offset, (unsigned long long)h->count);
        }
    }
    if (b < 0) {
        zps_log_error("%s sent bad parameters: %s", sc->endpoint, why);
        return ZPS_EPROTO;
    }
    // Into the next step's buffer: the current parameters must stay whole
    // until the step is over, in case a slice of it is handed to us.
    float *dst = w->next + h->offset;
    size_t esize = zps_dtype_size(w->dtype);
    for (int f = 0; f < m->n_frames; f++) {
        zmq_msg_t *frame = (zmq_msg_t *)&m->frames[f];
        size_t len = zmq_msg_size(frame) / esize;
        zps_dtype_to_f32(w->dtype, zmq_msg_data(frame), dst, len);
        dst += len;
    }
    zps_bucket_set_add(&sc->received, b);
    w->retry_ms = ZPS_WORKER_RETRY_MS;
    return ZPS_OK;
}

static bool s_shard_received(const s_shard_conn *sc)
{
    return zps_bucket_set_full(&sc->received, sc->n_buckets);
}

static bool s_all_received(const s_worker *w)
{
    for (int i = 0; i < w->n_shards; i++) {
        if (!s_shard_received(&w->shards[i])) {
            return false;
        }
    }
    return true;
}

static zps_err s_compute(s_worker *w, uint64_t step, zps_work work);

// While waiting for `step`'s parameters, the pieces of step - 1 handed to
// this worker (or refused "not yet") are computed at once, on the
// parameters of step - 1, which stay in place until the wait is over.
static zps_err s_compute_extras(s_worker *w, uint64_t step)
{
    zps_work work[ZPS_SCHEDULE_EXTRAS];
    int n = step > 0 ? zps_schedule_take_extras(&w->schedule, step - 1, work, ZPS_SCHEDULE_EXTRAS)
                     : 0;
    zps_err err = ZPS_OK;
    for (int k = 0; err == ZPS_OK && k < n; k++) {
        err = s_compute(w, step - 1, work[k]);
    }
    return err;
}

// A message from shard i while waiting for parameters: a bucket of them,
// or (from the coordinator) a new plan, maybe with slices of the step in
// progress to compute right away.
static zps_err s_take_message(s_worker *w, int i, uint64_t step, const zps_wire_msg *m)
{
    const Zps__Header *h = m->hdr;
    if (i == 0 && h->type == ZPS__MSG_TYPE__ROLLBACK && h->plan) {
        // A shard came back from its checkpoint: start over from its step.
        const Zps__Plan *p = h->plan;
        zps_log_warn("rolling back to step %llu (plan %u)", (unsigned long long)h->step,
                     p->generation);
        zps_schedule_forget_before(&w->schedule, UINT64_MAX);
        zps_err err = s_take_plan(w, p->slices, p->n_slices, p->generation, p->effective_step,
                                  p->extras, p->n_extras);
        w->rollback_to = h->step;
        return err == ZPS_OK ? ZPS_EAGAIN : err;
    }
    if (i != 0 || h->type != ZPS__MSG_TYPE__PLAN || !h->plan) {
        return s_take_bucket(w, i, step, m);
    }
    const Zps__Plan *p = h->plan;
    zps_log_info("plan %u from step %llu: %zu members", p->generation,
                 (unsigned long long)p->effective_step, p->n_slices);
    zps_err err = s_take_plan(w, p->slices, p->n_slices, p->generation, p->effective_step,
                              p->extras, p->n_extras);
    return err == ZPS_OK ? s_compute_extras(w, step) : err;
}

// Receives every bucket of every shard for `step`, bounded by the timeout,
// then makes them the model's parameters.
static zps_err s_where_is_job(s_worker *w, uint64_t step);
static zps_err s_pull_from(s_worker *w, int i, uint64_t step);

// The poll timeout: the next "not yet" to send again, or the poll interval.
static long s_poll_ms(const s_worker *w, double now)
{
    double next = now + ZPS_WORKER_POLL_MS;
    for (int i = 0; i < w->n_shards; i++) {
        next = w->pull_again_ms[i] > 0 && w->pull_again_ms[i] < next ? w->pull_again_ms[i] : next;
    }
    next = w->redo_ms > 0 && w->redo_ms < next ? w->redo_ms : next;
    next = w->next_ask_ms < next ? w->next_ask_ms : next;
    return next > now ? (long)(next - now) + 1 : 0;
}

// What is due while waiting: refused PULLs and pushes sent again, and,
// after a long wait, the question where the job is.
static zps_err s_due(s_worker *w, uint64_t step, double now)
{
    zps_err err = ZPS_OK;
    for (int i = 0; err == ZPS_OK && i < w->n_shards; i++) {
        if (w->pull_again_ms[i] > 0 && now >= w->pull_again_ms[i]) {
            w->pull_again_ms[i] = 0;
            err = s_pull_from(w, i, step);
        }
    }
    if (err == ZPS_OK && w->redo_ms > 0 && now >= w->redo_ms) {
        w->redo_ms = 0;
        err = s_compute_extras(w, step);
    }
    if (err == ZPS_OK && now >= w->next_ask_ms) {
        err = s_where_is_job(w, step);
    }
    return err;
}

// Receives every bucket of every shard for `step`, then makes them the
// model's parameters. The wait has no fixed end while the job lives: after
// a while the coordinator is asked where the job is, and the worker goes
// on waiting, catches up, joins again, or ends (the job is over, or the
// coordinator stayed silent for --timeout-ms).
static zps_err s_take_params(s_worker *w, uint64_t step)
{
    zmq_pollitem_t items[ZPS_WORKER_MAX_SHARDS];
    for (int i = 0; i < w->n_shards; i++) {
        w->shards[i].received = (zps_bucket_set){0};
        items[i] = (zmq_pollitem_t){.socket = w->shards[i].sock, .events = ZMQ_POLLIN};
    }
    double start = zps_clock_ms(), next_log = start + ZPS_WORKER_WAIT_LOG_MS;
    double next_beat = start + w->opts.heartbeat_ms;
    double ask_after = 4 * w->usual_step_ms > ZPS_WORKER_ASK_EVERY_MS ? 4 * w->usual_step_ms
                                                                        : ZPS_WORKER_ASK_EVERY_MS;
    w->next_ask_ms = start + ask_after;
    w->answered_ms = start;
    while (!s_all_received(w)) {
        if (s_stop) {
            return ZPS_ECLOSED;
        }
        int rc = zmq_poll(items, w->n_shards, s_poll_ms(w, zps_clock_ms()));
        if (rc < 0 && errno != EINTR) {
            zps_log_error("zmq_poll on the shard sockets: %s", zmq_strerror(errno));
            return ZPS_EIO;
        }
        for (int i = 0; rc > 0 && i < w->n_shards; i++) {
            if (!(items[i].revents & ZMQ_POLLIN)) {
                continue;
            }
            zps_wire_msg m;
            zps_err err = zps_wire_recv(w->shards[i].sock, false, &m);
            if (err == ZPS_OK) {
                err = s_take_message(w, i, step, &m);
            }
            zps_wire_msg_fini(&m);
            if (err != ZPS_OK && err != ZPS_ETIMEDOUT) {
                return err;
            }
        }
        double now = zps_clock_ms();
        zps_err err = s_due(w, step, now);
        if (err != ZPS_OK) {
            return err;
        }
        if (now > next_beat) {
            // From the main socket too: a restarted coordinator learns from
            // it where this worker's replies go.
            Zps__Header h;
            zps_wire_header_init(&h, ZPS__MSG_TYPE__HEARTBEAT);
            h.flags = 1;
            (void)s_send(w, 0, &h, NULL, 0, NULL);
            next_beat = now + w->opts.heartbeat_ms;
        }
        if (now > next_log) {
            for (int i = 0; i < w->n_shards; i++) {
                if (!s_shard_received(&w->shards[i])) {
                    zps_log_info("waiting %.0f s for step %llu parameters from shard %d (%s)",
                                 (now - start) / 1e3, (unsigned long long)step, i,
                                 w->shards[i].endpoint);
                }
            }
            next_log = now + ZPS_WORKER_WAIT_LOG_MS;
        }
    }
    for (int i = 0; i < w->n_shards; i++) {
        w->pull_again_ms[i] = 0;
    }
    w->redo_ms = 0;
    memcpy(zps_backend_params(w->be), w->next, w->model.n_params * sizeof(float));
    zps_schedule_forget_before(&w->schedule, step);
    double now = zps_clock_ms();
    if (w->params_ms > 0) {
        double d = now - w->params_ms;
        w->usual_step_ms = w->usual_step_ms > 0 ? 0.9 * w->usual_step_ms + 0.1 * d : d;
    }
    w->params_ms = now;
    return ZPS_OK;
}

// Asks every shard for the parameters of `step`; they answer bucket by
// bucket, at once or as soon as the step's buckets are updated.
static zps_err s_pull_from(s_worker *w, int i, uint64_t step)
{
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__PULL);
    h.shard = (uint32_t)i;
    h.step = step;
    return s_send(w, i, &h, NULL, 0, NULL);
}

static zps_err s_pull(s_worker *w, uint64_t step)
{
    zps_err err = ZPS_OK;
    for (int i = 0; err == ZPS_OK && i < w->n_shards; i++) {
        err = s_pull_from(w, i, step);
    }
    return err == ZPS_OK ? s_take_params(w, step) : err;
}

static zps_err s_start_over(s_worker *w, uint64_t *t);

// HELLO until the job is given, within --join-timeout-ms: a coordinator
// recovering from a restart answers "again" (ZPS_EAGAIN) until it admits.
static zps_err s_hello_until_job(s_worker *w, zps_wire_msg *m)
{
    double deadline = zps_clock_ms() + w->opts.join_timeout_ms;
    for (;;) {
        zps_err err = s_hello(w);
        if (err != ZPS_OK) {
            return err;
        }
        // HELLO again now and then: a coordinator that restarted since has
        // forgotten a joiner that had no JOB yet (it admits a HELLO from
        // the same socket once).
        int left = (int)(deadline - zps_clock_ms());
        left = left < ZPS_WORKER_HELLO_AGAIN_MS ? left : ZPS_WORKER_HELLO_AGAIN_MS;
        err = s_await(w->shards[0].sock, "the job to start", w->shards[0].endpoint,
                      left > 100 ? left : 100, m);
        while (err == ZPS_OK && m->hdr->type != ZPS__MSG_TYPE__JOB && zps_clock_ms() < deadline) {
            // Joining again: what the coordinator sent the member of before
            // (plans, rollbacks) may still be queued. The JOB is what counts.
            zps_wire_msg_fini(m);
            left = (int)(deadline - zps_clock_ms());
            left = left < ZPS_WORKER_HELLO_AGAIN_MS ? left : ZPS_WORKER_HELLO_AGAIN_MS;
            err = s_await(w->shards[0].sock, "the job to start", w->shards[0].endpoint,
                          left > 100 ? left : 100, m);
        }
        if (err == ZPS_ETIMEDOUT && zps_clock_ms() < deadline && !s_stop) {
            zps_log_info("waiting %.0f s for the job to start from %s: saying HELLO again",
                         (zps_clock_ms() - (deadline - w->opts.join_timeout_ms)) / 1e3,
                         w->shards[0].endpoint);
            continue;
        }
        if (err == ZPS_ETIMEDOUT) {
            zps_log_error("gave up after %.0f s waiting for the job to start from %s "
                          "(--join-timeout-ms)", w->opts.join_timeout_ms / 1e3,
                          w->shards[0].endpoint);
        }
        if (err == ZPS_ECLOSED && !s_stop) {
            w->job_over = true;
        }
        if (err != ZPS_EAGAIN || zps_clock_ms() + ZPS_WORKER_POLL_MS > deadline || s_stop) {
            return err; // m: the caller finishes it, whatever it holds
        }
        zps_wire_msg_fini(m);
        zps_log_info("saying HELLO again in %d ms", ZPS_WORKER_POLL_MS);
        struct timespec ts = {ZPS_WORKER_POLL_MS / 1000, (ZPS_WORKER_POLL_MS % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
}

// The socket s_step_over asks on, connected at the start so that the
// question need not wait for a handshake; NULL (no asking) on failure.
static void *s_ask_socket(s_worker *w)
{
    void *sock = zps_wire_socket(w->ctx, ZMQ_DEALER, 10);
    if (!sock || zps_curve_client(&w->curve, sock) != ZPS_OK ||
        zmq_connect(sock, w->shards[0].endpoint) != 0) {
        zps_log_warn("no second socket to %s: a long pause will be followed by computing a "
                     "step that may be over", w->shards[0].endpoint);
        if (sock) {
            (void)zmq_close(sock); // fails only for a handle that is not a socket
        }
        return NULL;
    }
    return sock;
}

static zps_err s_join(s_worker *w)
{
    zps_wire_msg m = {0};
    zps_err err = s_hello_until_job(w, &m);
    if (err == ZPS_OK && m.hdr->type != ZPS__MSG_TYPE__JOB) {
        zps_log_error("expected JOB, got %s", zps_wire_type_name(m.hdr->type));
        err = ZPS_EPROTO;
    }
    if (err == ZPS_OK && (err = s_take_job(w, m.hdr)) == ZPS_OK) {
        err = s_setup_compute(w, m.hdr->job->dataset);
    }
    zps_wire_msg_fini(&m);
    if (err == ZPS_OK) {
        w->heartbeat = zps_heartbeat_start(w->ctx, w->shards[0].endpoint, &w->curve, w->job_id,
                                           w->rank, w->member_id, w->opts.heartbeat_ms);
        w->ask = s_ask_socket(w);
    }
    if (err == ZPS_OK && (err = s_pull(w, w->start_step)) == ZPS_EAGAIN) {
        err = s_start_over(w, &w->start_step);
    }
    return err;
}

// Handed on by the coordinator (evicted while paused, or its slices given
// away while it could not answer): HELLO again, as a new member, with the
// model, data and buffers already here; the loop goes on at the step the
// JOB names.
// The member a JOB names, taken while training: its heartbeat, and the
// loop starts over at the JOB's step.
static zps_err s_become(s_worker *w, const Zps__Header *h)
{
    zps_heartbeat_stop(&w->heartbeat);
    zps_err err = s_take_job(w, h);
    if (err != ZPS_OK) {
        return err;
    }
    w->heartbeat = zps_heartbeat_start(w->ctx, w->shards[0].endpoint, &w->curve, w->job_id,
                                       w->rank, w->member_id, w->opts.heartbeat_ms);
    w->rollback_to = w->start_step;
    w->done_step = UINT64_MAX;
    return ZPS_OK;
}

static zps_err s_rejoin(s_worker *w)
{
    w->rejoin = false;
    zps_heartbeat_stop(&w->heartbeat); // the old member is silent while HELLO waits
    zps_wire_msg m = {0};
    zps_err err = s_hello_until_job(w, &m);
    if (err == ZPS_OK) {
        err = s_become(w, m.hdr);
    }
    zps_wire_msg_fini(&m);
    return err;
}

// ---------------------------------------------------------------------------
// Training and evaluation.

// Evaluates test records [lo, hi) and reports them to the coordinator.
static zps_err s_evaluate_range(s_worker *w, uint64_t epoch, uint32_t lo, uint32_t hi)
{
    uint32_t correct = 0;
    double loss_sum = 0;
    for (uint32_t start = lo; start < hi; start += ZPS_WORKER_EVAL_CHUNK) {
        uint32_t n = hi - start < ZPS_WORKER_EVAL_CHUNK ? hi - start : ZPS_WORKER_EVAL_CHUNK;
        for (uint32_t i = 0; i < n; i++) {
            w->eval_idx[i] = start + i;
        }
        zps_err err = zps_dataset_gather(w->data, ZPS_SPLIT_TEST, w->eval_idx, n, w->x, w->labels);
        if (err == ZPS_OK) {
            err = zps_backend_evaluate(w->be, w->x, w->labels, n, &correct, &loss_sum);
        }
        if (err != ZPS_OK) {
            return err;
        }
    }
    Zps__Eval ev = ZPS__EVAL__INIT;
    ev.epoch = epoch;
    ev.correct = correct;
    ev.loss_sum = loss_sum;
    ev.count = hi - lo;
    ev.offset = lo;
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__EVAL);
    h.eval = &ev;
    zps_log_debug("epoch %llu: %u of %u test records right", (unsigned long long)epoch, correct,
                  hi - lo);
    return s_send(w, 0, &h, NULL, 0, NULL);
}

// The test set is split as the epoch's last step was: whoever computed
// samples [a, b) of the global batch B evaluates records [n a / B, n b / B).
// The slices tile the batch, so the ranges tile the test set, a worker's
// share of it follows its share of the batch, and the pieces of a late
// slice carry the evaluation of its owner, who may have been away then.
static zps_err s_evaluate(s_worker *w, uint64_t epoch, uint64_t epoch_step)
{
    if (w->done_step != epoch_step) {
        return ZPS_OK; // nothing computed at that step: others evaluate
    }
    uint64_t n_test = zps_dataset_size(w->data, ZPS_SPLIT_TEST), B = w->global_batch;
    zps_err err = ZPS_OK;
    for (int i = 0; err == ZPS_OK && i < w->n_done; i++) {
        const zps_work *wk = &w->done[i];
        err = s_evaluate_range(w, epoch, (uint32_t)(n_test * wk->offset / B),
                               (uint32_t)(n_test * (wk->offset + wk->count) / B));
    }
    return err;
}

// Pushes [lo, hi) of the gradient to shard i, zero-copy (from the wire
// buffer once converted, for a 16-bit dtype).
static zps_err s_push(s_worker *w, int i, uint64_t lo, uint64_t hi)
{
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__PUSH);
    h.step = w->cur_step;
    h.shard = (uint32_t)i;
    h.offset = lo;
    h.count = hi - lo;
    h.dtype = (Zps__DType)w->dtype;
    h.samples = w->cur_work.count;
    h.batch_offset = w->cur_work.offset;
    h.generation = w->cur_work.gen;
    h.loss = zps_backend_loss(w->be);
    h.data_ms = (float)w->data_ms;
    h.compute_ms = (float)(zps_clock_ms() - w->step_t0 - w->data_ms);
    const float *g = zps_backend_grads(w->be) + lo;
    const void *payload = g;
    size_t esize = zps_dtype_size(w->dtype);
    if (w->dtype != ZPS_DTYPE_F32) {
        payload = w->wire + lo * esize;
        zps_dtype_from_f32(w->dtype, g, w->wire + lo * esize, h.count);
    }
    return s_send(w, i, &h, payload, h.count * esize, &w->grad_ref);
}

// The backend finished a bucket's gradient: push it to the shards that own
// its parts while backward goes on with earlier layers.
static void s_push_bucket(s_worker *w, int bucket)
{
    uint64_t blo, bhi;
    zps_model_bucket(&w->model, bucket, &blo, &bhi);
    for (int i = 0; w->push_err == ZPS_OK && i < w->n_shards; i++) {
        uint64_t lo = blo > w->shards[i].lo ? blo : w->shards[i].lo;
        uint64_t hi = bhi < w->shards[i].hi ? bhi : w->shards[i].hi;
        if (lo < hi) {
            w->push_err = s_push(w, i, lo, hi);
        }
    }
}

static void s_on_bucket(void *arg, int bucket)
{
    s_worker *w = arg;
    if (!w->opts.no_overlap) {
        s_push_bucket(w, bucket);
    }
}

static void s_sleep_ms(double ms)
{
    if (ms > 0) {
        struct timespec ts = {(time_t)(ms / 1000), (long)(fmod(ms, 1000.0) * 1e6)};
        nanosleep(&ts, NULL);
    }
}

// --slowdown: the time per sample is the least of the first
// ZPS_WORKER_CALIBRATE computes, then fixed: this host at its best, warm
// and uncontended. A slower machine's speed is steady; a running mean
// would follow this host's contention (3 workers on 2 cores compute slower
// together than alone) and multiply it by F - 1, and a split made by
// throughput would be wrong as soon as it is used. The least, not the
// median: at 43 samples a slice one compute here takes 1-6 x the least,
// and their median is twice it.
static void s_calibrate(s_worker *w, double per_sample)
{
    if (w->n_calib == ZPS_WORKER_CALIBRATE) {
        return;
    }
    if (w->n_calib == 0 || per_sample < w->ms_per_sample) {
        w->ms_per_sample = per_sample;
    }
    w->n_calib++;
}

// Fault injection for tests and demos (--slowdown, --stall-prob): the
// pause comes before the compute, so a slowed worker pushes late. A slowed
// worker waits (F - 1) x its time per sample (s_calibrate) x the samples.
// Whether a step pauses is drawn from the seed and the step alone, once a
// step, so one --stall-seed pauses at the same steps in every run that
// computes them (a worker whose late slices were handed on skips steps);
// the log names each pause's step.
static void s_inject_faults(s_worker *w, uint64_t step, uint32_t samples)
{
    if (w->opts.slowdown > 1.0) {
        s_sleep_ms((w->opts.slowdown - 1.0) * w->ms_per_sample * samples);
    }
    if (w->opts.stall_prob <= 0 || step == w->fault_step) {
        return;
    }
    w->fault_step = step;
    zps_rng rng;
    zps_rng_seed(&rng, w->fault_seed, step);
    if (zps_rng_uniform(&rng) < w->opts.stall_prob) {
        zps_log_info("step %" PRIu64 ": injected stall of %d ms", step, w->opts.stall_ms);
        s_sleep_ms(w->opts.stall_ms);
    }
}

// Asks the coordinator for STATUS, as this member (its id: the answer
// says where this member stands), on the socket of its own, so that nothing
// meant for the step is read out of turn. Bounded by ZPS_WORKER_ASK_MS.
static zps_err s_ask(s_worker *w, zps_wire_msg *m)
{
    zmq_pollitem_t item = {.socket = w->ask, .events = ZMQ_POLLIN};
    while (w->ask && zmq_poll(&item, 1, 0) > 0) {
        zps_err late = zps_wire_recv(w->ask, false, m); // an answer past its bound
        zps_wire_msg_fini(m);
        if (late != ZPS_OK) {
            break;
        }
    }
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__STATUS);
    h.job_id = w->job_id;
    h.rank = w->rank;
    h.member_id = w->member_id;
    zps_err err = !w->ask ? ZPS_ECLOSED : zps_wire_send(w->ask, NULL, &h, NULL, 0, NULL);
    if (err == ZPS_OK) {
        err = s_await(w->ask, "the coordinator's step", w->shards[0].endpoint,
                      ZPS_WORKER_ASK_MS, m);
    }
    if (err == ZPS_OK && (m->hdr->type != ZPS__MSG_TYPE__STATUS_REPLY || !m->hdr->status)) {
        zps_wire_msg_fini(m);
        err = ZPS_EPROTO;
    }
    return err;
}

// Waited long for `step`'s parameters: where is the job? The worker goes
// on waiting while the job lives and it is a member; catches up when the
// job went past the step without it; joins again when it was handed on
// (evicted while paused, or its slice given away); ends when the job is
// over or the coordinator stays silent for --timeout-ms. The log says which.
static zps_err s_where_is_job(s_worker *w, uint64_t step)
{
    double now = zps_clock_ms();
    w->next_ask_ms = now + ZPS_WORKER_ASK_EVERY_MS;
    zps_wire_msg m;
    if (s_ask(w, &m) != ZPS_OK) {
        if (now - w->answered_ms > w->opts.timeout_ms) {
            zps_log_error("the coordinator at %s has not answered for %.0f s: leaving the job",
                          w->shards[0].endpoint, (now - w->answered_ms) / 1e3);
            return ZPS_ETIMEDOUT;
        }
        return ZPS_OK;
    }
    w->answered_ms = now;
    const Zps__Status *st = m.hdr->status;
    uint64_t at = st->steps_done_all; // a step is over once every shard completed it
    zps_err err = ZPS_OK;
    if (st->state && strcmp(st->state, "done") == 0) {
        zps_log_warn("the job is over (step %llu of %llu) without this worker's last step: "
                     "leaving it", (unsigned long long)at, (unsigned long long)st->total_steps);
        w->job_over = true;
        err = ZPS_ECLOSED;
    } else if (st->asker == ZPS__MEMBER_STATE__MEMBER_GONE ||
               st->asker == ZPS__MEMBER_STATE__MEMBER_UNKNOWN) {
        zps_log_warn("rank %u was handed on by the coordinator (it is at step %llu): joining "
                     "the job again", w->rank, (unsigned long long)at);
        w->rejoin = true;
        err = ZPS_EAGAIN;
    } else if (st->asker == ZPS__MEMBER_STATE__MEMBER_ACTIVE && at > step) {
        zps_log_warn("step %llu is over without this worker (the coordinator is at step %llu): "
                     "catching up there", (unsigned long long)step, (unsigned long long)at);
        w->rollback_to = at;
        err = ZPS_EAGAIN;
    } else if (st->asker == ZPS__MEMBER_STATE__MEMBER_ACTIVE && at + 1 < step &&
               at == w->ahead_of) {
        // Parameters of `step` need step - 1 done. Seen twice (a shard's
        // STEP_DONE may lag once), the job is behind this worker: it went
        // on in a timeline a rollback ended. Back to the job's step.
        zps_log_warn("waiting for step %llu while the job is at step %llu: going back there",
                     (unsigned long long)step, (unsigned long long)at);
        w->rollback_to = at;
        err = ZPS_EAGAIN;
    } else {
        zps_log_info("waiting for step %llu parameters: the coordinator is at step %llu (%s), "
                     "this worker %s", (unsigned long long)step, (unsigned long long)at,
                     st->state ? st->state : "?",
                     st->asker == ZPS__MEMBER_STATE__MEMBER_JOINING ? "joining" : "active");
    }
    w->ahead_of = at + 1 < step ? at : UINT64_MAX;
    zps_wire_msg_fini(&m);
    return err;
}

// Whether `step` is over without this worker: true after a pause (a stall,
// a swap storm) so long that the coordinator handed this worker's slice on
// and moved past the step. Then the slice is not computed (the others'
// copy counted), and the worker goes on at the step in progress, or at
// the one after it when speculation handed its slice of the step in
// progress to others too (the coordinator says so): otherwise nobody else
// computes that slice, and the step would wait for it for good. Only a slice begun ZPS_WORKER_LATE_STEPS usual steps after its
// parameters came asks.
static bool s_step_over(s_worker *w, uint64_t step)
{
    double waited = zps_clock_ms() - w->params_ms;
    if (!w->ask || w->usual_step_ms <= 0 || waited < ZPS_WORKER_LATE_STEPS * w->usual_step_ms) {
        return false;
    }
    zps_wire_msg m;
    if (s_ask(w, &m) != ZPS_OK) {
        return false; // no answer in time: compute it
    }
    uint64_t at = m.hdr->status->steps_done_all; // over once every shard completed it
    uint64_t covered = m.hdr->status->asker_covered;
    bool gone = m.hdr->status->asker == ZPS__MEMBER_STATE__MEMBER_GONE;
    zps_wire_msg_fini(&m);
    if (gone) {
        zps_log_warn("rank %u was handed on by the coordinator during a pause of %.0f ms: "
                     "joining the job again", w->rank, waited);
        w->rejoin = true;
        return true;
    }
    if (at <= step) {
        return false; // still open: compute it
    }
    // The step in progress too, if speculation handed this worker's slice
    // of it to others: computing it beside them would only slow them.
    uint64_t next = covered > at ? at + 1 : at;
    w->rollback_to = next < w->total_steps ? next : w->total_steps;
    zps_log_warn("step %llu was done without this worker (%.0f ms late; the coordinator is at "
                 "step %llu): rejoining at step %llu", (unsigned long long)step, waited,
                 (unsigned long long)at, (unsigned long long)w->rollback_to);
    return true;
}

// Computes one slice of a step on the current parameters and pushes its
// gradient bucket by bucket.
static zps_err s_compute(s_worker *w, uint64_t step, zps_work work)
{
    // ZeroMQ may still hold the last push's frames of the gradient buffer.
    zps_err err = zps_wire_ref_wait(&w->grad_ref, w->opts.timeout_ms);
    if (err != ZPS_OK) {
        return err;
    }
    w->cur_step = step;
    w->cur_work = work;
    w->push_err = ZPS_OK;
    w->step_t0 = zps_clock_ms();
    if (zps_backend_uses_data(w->be)) {
        const uint32_t *idx = zps_sampler_slice(&w->sampler, step, work.offset, work.count);
        if (!idx) {
            return ZPS_EINVAL;
        }
        err = zps_dataset_gather(w->data, ZPS_SPLIT_TRAIN, idx, work.count, w->x, w->labels);
        if (err != ZPS_OK) {
            return err;
        }
    }
    double t1 = zps_clock_ms();
    w->data_ms = t1 - w->step_t0;
    float loss;
    s_inject_faults(w, step, work.count);
    if (s_step_over(w, step)) {
        return ZPS_EAGAIN;
    }
    double tc = zps_clock_ms();
    err = zps_backend_train_step(w->be, w->x, w->labels, work.count, &loss);
    double per_sample = (zps_clock_ms() - tc) / (work.count ? work.count : 1);
    s_calibrate(w, per_sample);
    if (w->done_step != step) {
        w->done_step = step;
        w->n_done = 0;
    }
    if (err == ZPS_OK && w->n_done < 1 + ZPS_SCHEDULE_EXTRAS) {
        w->done[w->n_done++] = work;
    }
    for (int b = 0; err == ZPS_OK && w->opts.no_overlap && b < zps_model_n_buckets(&w->model);
         b++) {
        s_push_bucket(w, b);
    }
    w->sum_data_ms += w->data_ms;
    w->sum_compute_ms += zps_clock_ms() - t1;
    return err != ZPS_OK ? err : w->push_err;
}

static zps_err s_step(s_worker *w, uint64_t step)
{
    zps_work work[1 + ZPS_SCHEDULE_EXTRAS];
    int n = zps_schedule_take(&w->schedule, step, work, 1 + ZPS_SCHEDULE_EXTRAS);
    zps_err err = ZPS_OK;
    for (int k = 0; err == ZPS_OK && k < n; k++) {
        err = s_compute(w, step, work[k]);
    }
    if (err != ZPS_OK) {
        return err;
    }
    double t2 = zps_clock_ms();
    // Nothing to compute (a member only from the next step on): listen.
    err = n == 0 ? s_pull(w, step + 1) : s_take_params(w, step + 1);
    w->sum_wait_ms += zps_clock_ms() - t2;
    w->timed_steps++;
    return err;
}

// One line for benchmarks: where a step's time went, on this worker.
static void s_log_timing(const s_worker *w, double wall_ms)
{
    double n = w->timed_steps ? (double)w->timed_steps : 1.0;
    double step = wall_ms / n;
    zps_log_info("timing: %.3f ms/step over %llu steps: data %.3f, compute %.3f, "
                 "push and wait for parameters %.3f ms (%.1f%% of the step)",
                 step, (unsigned long long)w->timed_steps, w->sum_data_ms / n,
                 w->sum_compute_ms / n, w->sum_wait_ms / n,
                 step > 0 ? 100.0 * w->sum_wait_ms / n / step : 0.0);
}

// After a ROLLBACK (or a catch-up, or joining again): the parameters of
// its step, then the loop goes on from there (another ROLLBACK on the way
// starts over again).
static zps_err s_start_over(s_worker *w, uint64_t *t)
{
    zps_err err;
    do {
        if (w->rejoin && (err = s_rejoin(w)) != ZPS_OK) {
            return err;
        }
        *t = w->rollback_to;
        err = s_pull(w, *t);
    } while (err == ZPS_EAGAIN);
    return err;
}

static zps_err s_train(s_worker *w)
{
    double start = zps_clock_ms();
    for (uint64_t t = w->start_step; t < w->total_steps; t++) {
        zps_err err = s_stop ? ZPS_ECLOSED : s_step(w, t);
        if (s_stop) {
            zps_log_info("stopped by signal at step %llu: leaving the job", (unsigned long long)t);
            w->stopped_at = t;
            return ZPS_ECLOSED;
        }
        if (err == ZPS_EAGAIN && (err = s_start_over(w, &t)) == ZPS_OK) {
            t--; // step t is computed again
            continue;
        }
        if (err != ZPS_OK) {
            if (!w->job_over) {
                zps_log_error("step %llu failed: %s", (unsigned long long)t, zps_strerror(err));
            }
            return err;
        }
        bool epoch_end = (t + 1) % w->steps_per_epoch == 0;
        if (w->data && (epoch_end || t + 1 == w->total_steps) &&
            (err = s_evaluate(w, t / w->steps_per_epoch, t)) != ZPS_OK) {
            return err;
        }
    }
    s_log_timing(w, zps_clock_ms() - start);
    return ZPS_OK;
}

static zps_err s_save_params(const s_worker *w, const char *path)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        zps_log_error("--save-params %s: %s", tmp, strerror(errno));
        return ZPS_EIO;
    }
    size_t n = w->model.n_params;
    bool ok = fwrite(zps_backend_params(w->be), sizeof(float), n, f) == n;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        zps_log_error("--save-params %s: %s", path, strerror(errno));
        unlink(tmp);
        return ZPS_EIO;
    }
    zps_log_info("saved %zu parameters to %s", n, path);
    return ZPS_OK;
}

// BYE at the end of the job, or (step below the job's steps) on leaving it.
static void s_bye(s_worker *w, uint64_t step)
{
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__BYE);
    h.step = step;
    (void)s_send(w, 0, &h, NULL, 0, NULL);
}

// ---------------------------------------------------------------------------
// Flags and start-up.

static void s_usage(FILE *f)
{
    fprintf(f,
            "usage: zps-worker --coordinator ENDPOINT [options]\n"
            "  --coordinator ENDPOINT  shard 0, e.g. tcp://127.0.0.1:5555 (required)\n"
            "  --device cpu|cuda[:N]   compute backend (default cpu); cuda needs a CUDA build\n"
            "  --gpu-math fp32|tf32|bf16  what cuBLAS may use on a GPU (default fp32; tf32\n"
            "                          and bf16 use tensor cores, fp32 accumulate, see README)\n"
            "  --check-device          check that --device can compute here, then exit\n"
            "                          (0: it can; 2: it cannot, and why)\n"
            "  --share N               ask for N samples of each global batch (default: split)\n"
            "  --save-params FILE      write the final flat parameters (float32 LE)\n"
            "  --threads N             OpenBLAS threads (default 1)\n"
            "  --cache-dir DIR         decompressed datasets (default ~/.cache/zps)\n"
            "  --timeout-ms MS         leave the job when the coordinator stays silent this\n"
            "                          long (default 60000); while it answers, wait\n"
            "  --join-timeout-ms MS    bound on waiting for the job to start (default 600000)\n"
            "  --no-overlap            push after backward instead of during it (benchmarks)\n"
            "  --heartbeat-ms MS       heartbeat interval to the coordinator (default 1000)\n"
            "  --sndbuf BYTES          TCP send buffer per shard connection (default: the OS's)\n"
            "  --slowdown F            fault injection: compute takes F times longer\n"
            "  --stall-prob P --stall-ms M  fault injection: pause M ms with chance P a step\n"
            "  --stall-seed N          fault injection: which steps pause (default: from the pid)\n"
            "  --curve-secret FILE     CurveZMQ: this worker's secret key (zps-ctl keygen)\n"
            "  --server-key FILE       CurveZMQ: the servers' public key\n"
            "  --log-level LEVEL       debug, info, warn, error (default info)\n"
            "  --log-json              log lines as JSON objects\n"
            "  --pid-file FILE         write this process's pid there while it runs\n"
            "Every flag may come from the environment instead: --some-flag X as\n"
            "ZPS_SOME_FLAG=X, a switch as ZPS_SOME_FLAG=1. The command line wins.\n"
            "SIGTERM or SIGINT: the worker leaves the job (BYE) and exits 0.\n");
}

static bool s_parse_int(const char *flag, const char *text, long lo, long hi, long *out)
{
    long long v;
    bool ok = zps_flags_int("zps-worker", flag, text, lo, hi, &v);
    *out = ok ? (long)v : *out;
    return ok;
}

static bool s_parse_real(const char *flag, const char *text, double lo, double hi, double *out)
{
    return zps_flags_real("zps-worker", flag, text, lo, hi, out);
}

static bool s_parse_opts(int argc, char **argv, s_opts *o, char *cache_buf, size_t cache_len)
{
    enum { O_COORD = 256, O_DEVICE, O_SHARE, O_SAVE, O_THREADS, O_CACHE, O_TIMEOUT, O_JOIN,
           O_NO_OVERLAP, O_HEARTBEAT, O_CURVE_SECRET, O_SERVER_KEY, O_SLOWDOWN, O_STALL_PROB, O_STALL_SEED, O_SNDBUF,
           O_STALL_MS, O_LOG, O_LOG_JSON, O_PID_FILE, O_GPU_MATH, O_CHECK_DEVICE, O_HELP };
    static const struct option longopts[] = {
        {"coordinator", required_argument, 0, O_COORD},
        {"device", required_argument, 0, O_DEVICE},
        {"gpu-math", required_argument, 0, O_GPU_MATH},
        {"check-device", no_argument, 0, O_CHECK_DEVICE},
        {"share", required_argument, 0, O_SHARE},
        {"save-params", required_argument, 0, O_SAVE},
        {"threads", required_argument, 0, O_THREADS},
        {"cache-dir", required_argument, 0, O_CACHE},
        {"timeout-ms", required_argument, 0, O_TIMEOUT},
        {"join-timeout-ms", required_argument, 0, O_JOIN},
        {"no-overlap", no_argument, 0, O_NO_OVERLAP},
        {"heartbeat-ms", required_argument, 0, O_HEARTBEAT},
        {"curve-secret", required_argument, 0, O_CURVE_SECRET},
        {"server-key", required_argument, 0, O_SERVER_KEY},
        {"slowdown", required_argument, 0, O_SLOWDOWN},
        {"stall-prob", required_argument, 0, O_STALL_PROB},
        {"stall-ms", required_argument, 0, O_STALL_MS},
        {"stall-seed", required_argument, 0, O_STALL_SEED},
        {"sndbuf", required_argument, 0, O_SNDBUF},
        {"log-level", required_argument, 0, O_LOG},
        {"log-json", no_argument, 0, O_LOG_JSON},
        {"pid-file", required_argument, 0, O_PID_FILE},
        {"help", no_argument, 0, O_HELP},
        {0, 0, 0, 0},
    };
    char **args;
    if (zps_flags_from_env("zps-worker", longopts, environ, argc, argv, &argc, &args) != ZPS_OK) {
        return false;
    }
    argv = args;
    *o = (s_opts){.device = "cpu", .threads = 1, .timeout_ms = 60000, .join_timeout_ms = 600000,
                  .heartbeat_ms = 1000};
    long v = 0;
    int c;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        bool ok = true;
        switch (c) {
        case O_COORD: o->coordinator = optarg; break;
        case O_DEVICE: o->device = optarg; break;
        case O_GPU_MATH:
            ok = zps_backend_parse_gpu_math(optarg, &o->gpu_math);
            if (!ok) {
                fprintf(stderr, "zps-worker: --gpu-math: fp32, tf32 or bf16\n");
            }
            break;
        case O_CHECK_DEVICE: o->check_device = true; break;
        case O_SHARE: ok = s_parse_int("--share", optarg, 1, 1 << 24, &v); o->share = (uint32_t)v; break;
        case O_SAVE: o->save_params = optarg; break;
        case O_THREADS: ok = s_parse_int("--threads", optarg, 1, 256, &v); o->threads = (int)v; break;
        case O_CACHE: o->cache_dir = optarg; break;
        case O_TIMEOUT: ok = s_parse_int("--timeout-ms", optarg, 100, 86400000, &v); o->timeout_ms = (int)v; break;
        case O_JOIN: ok = s_parse_int("--join-timeout-ms", optarg, 100, 86400000, &v); o->join_timeout_ms = (int)v; break;
        case O_NO_OVERLAP: o->no_overlap = true; break;
        case O_CURVE_SECRET: o->curve_secret = optarg; break;
        case O_SERVER_KEY: o->server_key = optarg; break;
        case O_SLOWDOWN: ok = s_parse_real("--slowdown", optarg, 1.0, 1000.0, &o->slowdown); break;
        case O_STALL_PROB: ok = s_parse_real("--stall-prob", optarg, 0.0, 1.0, &o->stall_prob); break;
        case O_STALL_MS:
            ok = s_parse_int("--stall-ms", optarg, 0, 3600000, &v);
            o->stall_ms = (int)v;
            break;
        case O_STALL_SEED:
            ok = s_parse_int("--stall-seed", optarg, 0, LONG_MAX, &v);
            o->stall_seed = (uint64_t)v;
            o->stall_seed_set = true;
            break;
        case O_HEARTBEAT:
            ok = s_parse_int("--heartbeat-ms", optarg, 10, 3600000, &v);
            o->heartbeat_ms = (int)v;
            break;
        case O_SNDBUF:
            ok = s_parse_int("--sndbuf", optarg, 0, 1L << 30, &v);
            if (ok && v != 0 && v < 4096) {
                fprintf(stderr, "zps-worker: --sndbuf: '%s' is not 0 or 4096..%ld bytes\n", optarg,
                        1L << 30);
                ok = false;
            }
            o->sndbuf = (int)v;
            break;
        case O_LOG: {
            zps_log_level lvl;
            ok = zps_log_parse_level(optarg, &lvl);
            if (ok) {
                zps_log_set_level(lvl);
            } else {
                fprintf(stderr, "zps-worker: --log-level: debug, info, warn or error\n");
            }
            break;
        }
        case O_LOG_JSON: zps_log_set_json(true); break;
        case O_PID_FILE: o->pid_file = optarg; break;
        case O_HELP: s_usage(stdout); exit(0);
        default: ok = false; break;
        }
        if (!ok) {
            s_usage(stderr);
            free(args);
            return false;
        }
    }
    bool extra = optind < argc;
    if (extra || (!o->coordinator && !o->check_device)) {
        fprintf(stderr, extra ? "zps-worker: unexpected argument '%s'\n"
                              : "zps-worker: --coordinator is required%s\n",
                extra ? argv[optind] : "");
        s_usage(stderr);
        free(args);
        return false;
    }
    free(args);
    if (!o->cache_dir) {
        const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
        if (xdg && *xdg) {
            snprintf(cache_buf, cache_len, "%s/zps", xdg);
        } else {
            snprintf(cache_buf, cache_len, "%s/.cache/zps", home && *home ? home : "/tmp");
        }
        o->cache_dir = cache_buf;
    }
    return true;
}

static void s_worker_fini(s_worker *w)
{
    zps_heartbeat_stop(&w->heartbeat);
    if (w->ask) {
        (void)zmq_close(w->ask); // fails only for a handle that is not a socket
    }
    for (int i = 0; i < ZPS_WORKER_MAX_SHARDS; i++) {
        if (w->shards[i].sock) {
            (void)zmq_close(w->shards[i].sock);
        }
    }
    if (w->ctx) {
        zmq_ctx_term(w->ctx); // flushes the BYE within the linger, releases grad frames
    }
    zps_backend_destroy(&w->be);
    free(w->wire);
    free(w->next);
    zps_dataset_destroy(&w->data);
    zps_sampler_fini(&w->sampler);
    free(w->x);
    free(w->labels);
    free(w->eval_idx);
}

int main(int argc, char **argv)
{
    zps_log_set_name("worker");
    static s_worker w; // large (plan); static keeps it off the stack
    static char cache_dir[4096]; // w (static) points into it
    if (!s_parse_opts(argc, argv, &w.opts, cache_dir, sizeof cache_dir)) {
        return 2;
    }
    if (!zps_backend_supports(w.opts.device)) {
        return 2;
    }
    if (w.opts.check_device) {
        zps_log_info("--device %s can compute here", w.opts.device);
        return 0;
    }
    if (!w.opts.curve_secret != !w.opts.server_key) {
        fprintf(stderr, "zps-worker: --curve-secret and --server-key go together\n");
        return 2;
    }
    if (w.opts.curve_secret &&
        zps_curve_load(&w.curve, w.opts.curve_secret, w.opts.server_key) != ZPS_OK) {
        return 2;
    }
    if (w.opts.pid_file && zps_pidfile_write(w.opts.pid_file) != ZPS_OK) {
        return 2;
    }
    struct sigaction sa = {.sa_handler = s_on_signal};
    (void)sigaction(SIGTERM, &sa, NULL);
    (void)sigaction(SIGINT, &sa, NULL);
    openblas_set_num_threads(w.opts.threads);
    w.fault_seed = w.opts.stall_seed_set ? w.opts.stall_seed : (uint64_t)getpid();
    w.fault_step = UINT64_MAX;
    w.done_step = UINT64_MAX;
    w.ahead_of = UINT64_MAX;
    w.retry_ms = ZPS_WORKER_RETRY_MS;
    w.ctx = zmq_ctx_new();
    s_shard_conn *coord = &w.shards[0];
    snprintf(coord->endpoint, sizeof coord->endpoint, "%s", w.opts.coordinator);
    coord->sock = w.ctx ? zps_wire_socket(w.ctx, ZMQ_DEALER, ZPS_WORKER_POLL_MS) : NULL;
    if (!coord->sock || zps_wire_set_sndbuf(coord->sock, w.opts.sndbuf) != ZPS_OK ||
        zps_curve_client(&w.curve, coord->sock) != ZPS_OK ||
        zmq_connect(coord->sock, coord->endpoint) != 0) {
        zps_log_error("cannot connect to %s: %s", coord->endpoint, zmq_strerror(errno));
        s_worker_fini(&w);
        return 2;
    }
    zps_err err = s_join(&w);
    if (err == ZPS_OK) {
        err = s_train(&w);
    }
    if (err == ZPS_OK && w.opts.save_params) {
        err = s_save_params(&w, w.opts.save_params);
    }
    if (err == ZPS_OK) {
        s_bye(&w, w.total_steps);
        zps_log_info("done: %llu steps", (unsigned long long)w.total_steps);
    } else if (s_stop) {
        // Left on purpose: the coordinator hands this worker's share on at once.
        if (w.job_id) {
            s_bye(&w, w.stopped_at);
        }
        zps_log_info("stopped by signal");
        err = ZPS_OK;
    } else if (w.job_over) {
        // Not a failure of this worker: a supervisor need not restart it.
        zps_log_info("the job ended without this worker: exiting without final parameters");
        err = ZPS_OK;
    }
    s_worker_fini(&w);
    if (w.opts.pid_file) {
        zps_pidfile_remove(w.opts.pid_file);
    }
    return err == ZPS_OK ? 0 : 1;
}
