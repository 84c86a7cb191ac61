/* zps_setup.c - the server's start-up and its undoing: sockets, CURVE and
 * the ZAP handler, the bind and --endpoint-file, the metrics log, the pid
 * file, and shard 0's job (started by zps_start.c, at once or once the model
 * is declared, zps_declare.c) or a shard's connection to the coordinator.
 * Any error here exits with a hint. */
#include "server/zps_server_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "common/zps_atomic.h"
#include "common/zps_dataset.h"
#include "common/zps_pidfile.h"
#include "common/zps_sndbuf.h"
#include "server/zps_token.h"

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
    int backlog = ZPS_SERVER_BACKLOG;
    if (zmq_setsockopt(srv->sock, ZMQ_BACKLOG, &backlog, sizeof backlog) != 0) {
        zps_log_error("zmq_setsockopt ZMQ_BACKLOG: %s", zmq_strerror(errno));
        return 2;
    }
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
    status = zps_start_coordinator(srv, n_train, n_test, why, sizeof why);
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
    const zps_shard_shm *t = &srv->io.shm;
    if (t->params_sent > 0) {
        zps_log_info("shard %u: %llu notices of parameters in its segment, %llu of them for "
                     "a whole step", srv->o->shard, (unsigned long long)t->params_sent,
                     (unsigned long long)t->params_whole_sent);
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
        zps_wire_set_rcvhwm(srv->sock, o->curve_secret ? ZPS_SERVER_RCVHWM_CURVE
                                                       : ZPS_SERVER_RCVHWM) != ZPS_OK ||
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
    zps_register_linger_stop(srv);
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
