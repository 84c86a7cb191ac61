/* zps_setup.c - the server's start-up and its undoing: sockets, CURVE and
 * the ZAP handler, the bind and --endpoint-file, the metrics log, the pid
 * file, and the coordinator (shard 0, with --resume) or the shard's
 * connection to it. Any error here exits with a hint. */
#include "server/zps_server_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "common/zps_atomic.h"
#include "common/zps_dataset.h"
#include "common/zps_pidfile.h"
#include "common/zps_sndbuf.h"
#include "server/zps_ckpt.h"
#include "server/zps_token.h"

// The coordinator's question before it decides a rollback (zps_coord_cfg).
static zps_err s_coord_restore(void *arg, uint64_t step)
{
    return zps_steps_restore(arg, step);
}

// Binds sock and reports the endpoint bound (a port of '*' resolved) in
// srv->endpoint and, if asked, in a file that launchers and tests wait for.
// CURVE on the bound socket, and the ZAP handler that admits clients; or,
// without CURVE, a warning (or a refusal) when the address is not loopback.
static int s_setup_security(zps_server *srv)
{
    const zps_server_opts *o = srv->o;
    if (!o->curve_secret) {
        if (!zps_curve_is_loopback(o->listen)) {
            zps_log_warn("%s is reachable beyond this host and CurveZMQ is off: anyone who "
                         "reaches it can join the job (see --curve-secret)", o->listen);
            if (o->require_curve) {
                zps_log_error("--require-curve: refusing to listen without CurveZMQ");
                return 2;
            }
        }
        return 0;
    }
    if (zps_curve_load(&srv->curve, o->curve_secret, o->server_key) != ZPS_OK) {
        return 2;
    }
    if (!o->server_key) {
        memcpy(srv->curve.server, srv->curve.public_, sizeof srv->curve.server);
    }
    const char *domain = "zps";
    zps_zap_keys keys = {.workers = o->authorized_keys, .shards = o->shard_keys,
                         .operators = o->operator_keys, .own_public = srv->curve.public_};
    if (!(srv->zap = zps_zap_start(srv->ctx, &keys)) ||
        zps_curve_server(&srv->curve, srv->sock) != ZPS_OK ||
        zmq_setsockopt(srv->sock, ZMQ_ZAP_DOMAIN, domain, strlen(domain)) != 0) {
        return 2;
    }
    zps_log_info("CurveZMQ on: public key %s", srv->curve.public_);
    return 0;
}

// Whether workers on this host may push through shared memory: the
// operator's --shm, or by default wherever CURVE is off. Under CURVE the
// log says which it is.
static void s_setup_shm(zps_server *srv)
{
    int shm = srv->o->shm;
    bool allow = shm == ZPS_SERVER_SHM_ALLOW || (shm == ZPS_SERVER_SHM_AUTO && !srv->curve.on);
    zps_shard_shm_init(&srv->io.shm, allow, srv->curve.on);
    if (srv->curve.on && allow) {
        zps_log_warn("--shm allow: workers on this host (same user) may push through shared "
                     "memory, which CURVE does not encrypt");
    } else if (srv->curve.on) {
        zps_log_info("CURVE: every push comes by frames (--shm allow lets workers on this host "
                     "push through shared memory)");
    }
}

static int s_bind(zps_server *srv)
{
    const zps_server_opts *o = srv->o;
    if (zmq_bind(srv->sock, o->listen) != 0) {
        zps_log_error("cannot bind %s: %s", o->listen, zmq_strerror(errno));
        fprintf(stderr, "HINT: another zps-server may hold the port; pick another --listen\n");
        return 2;
    }
    size_t len = sizeof srv->endpoint;
    if (zmq_getsockopt(srv->sock, ZMQ_LAST_ENDPOINT, srv->endpoint, &len) != 0) {
        snprintf(srv->endpoint, sizeof srv->endpoint, "%s", o->listen);
    }
    if (o->endpoint_file) {
        char line[sizeof srv->endpoint + 1];
        int n = snprintf(line, sizeof line, "%s\n", srv->endpoint);
        // 0666 less the umask: the mode fopen gave it.
        if (zps_atomic_write(o->endpoint_file, line, (size_t)n, 0666) != ZPS_OK) {
            zps_log_error("--endpoint-file %s: not written", o->endpoint_file);
            return 2;
        }
    }
    return 0;
}

// Shard 0 restarted with --resume: the newest step of which both its
// checkpoint and the job state are valid. No checkpoint at all is a first
// start; checkpoints of which none is valid are an error, not a restart
// from scratch.
static zps_err s_resume_coordinator(zps_server *srv)
{
    uint64_t steps[64];
    int n = zps_ckpt_steps(srv->o->checkpoint_dir, 0, steps, 64);
    if (n == 0) {
        // A supervisor passes --resume on every start, the first included.
        zps_log_info("--resume: no checkpoint in %s yet: the job starts at step 0",
                     srv->o->checkpoint_dir);
        return ZPS_OK;
    }
    for (int i = n - 1; i >= 0; i--) {
        uint64_t loaded;
        if (zps_shard_restore(srv->shard, srv->o->checkpoint_dir, steps[i], &loaded) == ZPS_OK &&
            zps_coord_resume(srv->coord, srv->o->checkpoint_dir, steps[i]) == ZPS_OK) {
            srv->plan_gen = 0; // the coordinator's plan is taken again, with the rollback
            return ZPS_OK;
        }
        zps_log_warn("step %llu cannot be resumed; trying the one before",
                     (unsigned long long)steps[i]);
    }
    zps_log_error("--resume: no valid checkpoint and job state in %s", srv->o->checkpoint_dir);
    return ZPS_ENOENT;
}

// Shard 0 with the job's sizes known: the coordinator and this shard's
// range. *why says what does not fit (2), or memory ran out (1).
// The run's length from the flags and the train set's size, checked:
// 0, or 2 with *why saying what does not fit. *spe: steps per epoch.
static int s_job_steps(zps_server *srv, uint32_t n_train, uint64_t *spe, char *why, size_t len)
{
    const zps_server_opts *o = srv->o;
    if (o->global_batch > n_train || o->global_batch < o->workers) {
        snprintf(why, len, "global batch %u must be between --workers (%u) and the train set (%u)",
                 o->global_batch, o->workers, n_train);
        return 2;
    }
    if (srv->model.n_params < o->shards) {
        snprintf(why, len, "%zu parameters cannot make %u shards", srv->model.n_params,
                 o->shards);
        return 2;
    }
    *spe = n_train / o->global_batch;
    srv->total_steps = o->steps ? o->steps : o->epochs * *spe;
    if (srv->total_steps == 0) {
        snprintf(why, len, "the run has no steps (--epochs 0 or --steps 0)");
        return 2;
    }
    if (o->mode.diloco) {
        // The server's steps are rounds of H global batches each.
        uint64_t h = o->mode.inner_steps;
        if (o->steps && o->steps % h != 0) {
            snprintf(why, len, "--steps %llu is not a whole number of rounds of --inner-steps %llu",
                     (unsigned long long)o->steps, (unsigned long long)h);
            return 2;
        }
        if (srv->total_steps < h) {
            snprintf(why, len, "the run's %llu global batches make no round of --inner-steps %llu",
                     (unsigned long long)srv->total_steps, (unsigned long long)h);
            return 2;
        }
        if ((uint64_t)o->global_batch * h >= (1u << 24)) {
            // A shard weighs each pseudo-gradient by its samples of every
            // inner step, in a float that must hold it exactly.
            snprintf(why, len, "--global-batch %u times --inner-steps %llu must stay below 2^24",
                     o->global_batch, (unsigned long long)h);
            return 2;
        }
        srv->total_steps /= h;
    }
    return 0;
}

int zps_setup_start_coordinator(zps_server *srv, uint32_t n_train, uint32_t n_test, char *why,
                               size_t len)
{
    const zps_server_opts *o = srv->o;
    uint64_t spe;
    int status = s_job_steps(srv, n_train, &spe, why, len);
    if (status != 0) {
        return status;
    }
    srv->dtype = o->wire_dtype;
    zps_shard_cfg cfg = {.index = 0, .model = &srv->model, .seed = o->seed,
                         .global_batch = o->global_batch, .dtype = o->wire_dtype,
                         .optim = o->optim, .await_init = srv->declared != NULL,
                         .threads = o->threads, .mode = o->mode};
    cfg.optim.total_steps = srv->total_steps;
    zps_optim_cfg inner = o->optim;
    if (o->mode.diloco) {
        cfg.optim = zps_outer_optim(&o->mode.outer);
        inner.total_steps = srv->total_steps * o->mode.inner_steps;
    }
    zps_model_shard_range(srv->model.n_params, 0, o->shards, &cfg.lo, &cfg.hi);
    cfg.shards = o->shards;
    srv->ckpt_every = o->checkpoint_every;
    snprintf(why, len, "out of memory");
    if (!(srv->shard = zps_shard_new(&cfg))) {
        return 1;
    }
    zps_coord_cfg cc = {
        .model = srv->declared ? "external" : o->model, .dataset = srv->dataset,
        .layout = srv->declared ? srv->declared->layout : NULL, .spec = &srv->model,
        .n_train = n_train,
        .seed = o->seed, .global_batch = o->global_batch, .total_steps = srv->total_steps,
        .steps_per_epoch = spe, .n_test = n_test, .workers = o->workers,
        .n_params = srv->model.n_params, .shards = o->shards, .optim = cfg.optim,
        .wire_dtype = o->wire_dtype, .endpoint = srv->endpoint, .metrics = srv->metrics,
        .worker_timeout_ms = o->worker_timeout_ms, .checkpoint_every = o->checkpoint_every,
        .adaptive_split = o->adaptive_split, .restore = s_coord_restore, .restore_arg = srv,
        .mode = o->mode, .inner = inner,
    };
    if (!(srv->coord = zps_coord_new(&cc))) {
        zps_shard_destroy(&srv->shard);
        return 1;
    }
    if (o->resume && s_resume_coordinator(srv) != ZPS_OK) {
        snprintf(why, len, "--resume: no valid checkpoint and job state in %s",
                 o->checkpoint_dir);
        zps_coord_destroy(&srv->coord); // a declaration refused for it changes nothing
        zps_shard_destroy(&srv->shard);
        return 2;
    }
    zps_log_info("listening on %s: model %s (%zu parameters), dataset %s (%u train, %u test), "
                 "global batch %u, %llu steps, shard 0 of %u: [%llu, %llu)",
                 srv->endpoint, srv->declared ? srv->model.text : o->model,
                 srv->model.n_params, srv->dataset, n_train, n_test, o->global_batch,
                 (unsigned long long)srv->total_steps, o->shards, (unsigned long long)cfg.lo,
                 (unsigned long long)cfg.hi);
    return 0;
}

// Shard 0: the job from the flags, then the coordinator and this shard's
// range; for an external model, those once the model is declared.
static int s_setup_coordinator(zps_server *srv)
{
    const zps_server_opts *o = srv->o;
    char why[320] = "";
    int status = 2;
    if (zps_optim_check(o->optimizer, &o->optim) != ZPS_OK ||
        (o->mode.diloco && zps_outer_validate(&o->mode.outer) != ZPS_OK)) {
        fprintf(stderr, "HINT: zps-server --help lists the flags\n");
        return 2;
    }
    if (o->http && !(srv->http = zps_http_start(o->http))) {
        return 2;
    }
    if (strcmp(o->model, "external") == 0) {
        if (o->dataset && zps_declare_parse_size(o->dataset, &srv->size_train) != ZPS_OK) {
            zps_log_error("--dataset %s: an external model's dataset is size:N (train "
                          "records), or declared by the workers", o->dataset);
            return 2;
        }
        zps_err err = o->resume ? zps_declare_load(srv, why, sizeof why) : ZPS_ENOENT;
        if (err == ZPS_OK) {
            return 0;
        }
        if (err != ZPS_ENOENT) {
            zps_log_error("--resume: %s", why[0] ? why : "the declared model cannot be read");
            return 2;
        }
        zps_log_info("listening on %s: the model is declared by the first worker "
                     "(--model external), global batch %u", srv->endpoint, o->global_batch);
        return 0;
    }
    zps_dataset_spec ds;
    uint32_t n_train, n_test;
    snprintf(srv->dataset, sizeof srv->dataset, "%s", o->dataset ? o->dataset : "fashion-mnist");
    if (zps_model_parse(o->model, &srv->model) != ZPS_OK ||
        zps_dataset_parse(srv->dataset, &ds) != ZPS_OK ||
        zps_dataset_counts(&ds, &n_train, &n_test) != ZPS_OK) {
        fprintf(stderr, "HINT: zps-server --help lists the flags; fashion-mnist comes from the "
                        "Debian package dataset-fashion-mnist\n");
        return 2;
    }
    status = zps_setup_start_coordinator(srv, n_train, n_test, why, sizeof why);
    if (status != 0) {
        zps_log_error("%s", why);
    }
    return status;
}

static int s_setup_shard(zps_server *srv)
{
    // A restart presents the token its first ASSIGN gave it: without it the
    // coordinator takes it for a stranger claiming this shard, and refuses.
    if (srv->o->resume) {
        zps_err err = zps_token_load(srv->o->checkpoint_dir, srv->o->shard, &srv->shard_token);
        if (err == ZPS_OK) {
            zps_log_info("presenting the shard token kept in %s", srv->o->checkpoint_dir);
        } else if (err == ZPS_ENOENT) {
            zps_log_info("no shard token in %s: registering as a shard not yet assigned",
                         srv->o->checkpoint_dir);
        }
    }
    srv->up = zps_wire_socket(srv->ctx, ZMQ_DEALER, ZPS_SERVER_SEND_TIMEOUT_MS);
    if (!srv->up || zps_curve_client(&srv->curve, srv->up) != ZPS_OK ||
        zmq_connect(srv->up, srv->o->coordinator) != 0) {
        zps_log_error("cannot connect to the coordinator at %s", srv->o->coordinator);
        return 2;
    }
    if (srv->o->http && !(srv->http = zps_http_start(srv->o->http))) {
        return 2;
    }
    zps_log_info("shard %u of %u listening on %s (workers reach it at %s); registering with %s",
                 srv->o->shard, srv->o->shards, srv->endpoint,
                 srv->o->advertise ? srv->o->advertise : srv->endpoint, srv->o->coordinator);
    zps_register_send(srv);
    return 0;
}

void zps_setup_log_peak_rss(const zps_server *srv)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) {
        zps_log_info("shard %u: peak RSS %.1f MiB", srv->o->shard, ru.ru_maxrss / 1024.0);
    }
}

// The metrics log. Line-buffered with room for a whole record, so that
// each record is one write and a SIGKILL cannot leave half of one. A
// resumed run goes on with the log it had (replayed steps appear twice),
// after ending a last line a killed writer of before left unfinished.
static FILE *s_open_metrics(const char *path, bool resume)
{
    FILE *f = fopen(path, resume ? "a+" : "w");
    if (!f || setvbuf(f, NULL, _IOLBF, ZPS_SERVER_METRICS_BUF) != 0) {
        zps_log_error("--metrics-log %s: %s", path, strerror(errno));
        if (f) {
            (void)fclose(f);
        }
        return NULL;
    }
    if (resume && fseek(f, -1, SEEK_END) == 0 && fgetc(f) != '\n') {
        (void)fseek(f, 0, SEEK_END);
        fputc('\n', f);
    }
    return f;
}

int zps_setup_open(zps_server *srv, const zps_shard_io_hooks *hooks)
{
    const zps_server_opts *o = srv->o;
    int status = 1;
    if (!(srv->ctx = zmq_ctx_new())) {
        return 1;
    }
    srv->sock = zps_wire_socket(srv->ctx, ZMQ_ROUTER, ZPS_SERVER_SEND_TIMEOUT_MS);
    if (!srv->sock || zps_sndbuf_apply(srv->ctx, srv->sock, o->sndbuf) != ZPS_OK ||
        zps_wire_set_rcvhwm(srv->sock, ZPS_SERVER_RCVHWM) != ZPS_OK ||
        zps_shard_io_init(&srv->io, srv->sock, o->shard, hooks) != ZPS_OK) {
        return 1;
    }
    if (o->metrics_log && !(srv->metrics = s_open_metrics(o->metrics_log, o->resume))) {
        return 2;
    }
    if ((status = s_setup_security(srv)) != 0 || (status = s_bind(srv)) != 0) {
        return status;
    }
    s_setup_shm(srv);
    if (o->pid_file && zps_pidfile_write(o->pid_file) != ZPS_OK) {
        return 2;
    }
    srv->pid_written = o->pid_file != NULL;
    return o->shard == 0 ? s_setup_coordinator(srv) : s_setup_shard(srv);
}

void zps_setup_close(zps_server *srv)
{
    zps_shard_io_fini(&srv->io);
    zps_wire_close(&srv->sock);
    zps_wire_close(&srv->up);
    zps_zap_stop(&srv->zap);
    zps_http_stop(&srv->http);
    // Flushes replies (within the linger) and releases the shard's
    // zero-copy frames: the shard can go only after it.
    if (srv->ctx && zmq_ctx_term(srv->ctx) != 0) {
        zps_log_warn("zmq_ctx_term: %s", zmq_strerror(errno));
    }
    srv->ctx = NULL;
    zps_coord_destroy(&srv->coord);
    zps_outbox_fini(&srv->out);
    zps_shard_destroy(&srv->shard);
    if (srv->declared) { // after the coordinator, which borrows its layout
        zps__hello__free_unpacked(srv->declared, NULL);
        srv->declared = NULL;
    }
    if (srv->metrics) {
        (void)fclose(srv->metrics);
        srv->metrics = NULL;
    }
    if (srv->pid_written) {
        zps_pidfile_remove(srv->o->pid_file);
        srv->pid_written = false;
    }
}
