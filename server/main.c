/* main.c - zps-server: one shard of the parameter vector, and on shard 0
 * the coordinator.
 *
 * One thread owns all state and runs a zmq_poll loop with a bounded timeout
 * (Redis's event loop, written with ZeroMQ): read a message, dispatch it to
 * the coordinator or the shard, then run the timers (progress, stall
 * warnings, end of run). A message from the network can be refused, never
 * crash the process or touch parameters before it was validated. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_clock.h"
#include "common/zps_dataset.h"
#include "common/zps_log.h"
#include "common/zps_model.h"
#include "common/zps_optim.h"
#include "common/zps_wire.h"
#include "server/zps_coord.h"
#include "server/zps_shard.h"

#define ZPS_SERVER_POLL_MS 200
#define ZPS_SERVER_STALL_WARN_MS 5000.0

typedef struct s_opts {
    const char *listen;       // endpoint to bind
    uint32_t workers;         // members before step 0
    const char *model;        // model spec
    const char *dataset;      // dataset spec
    uint32_t global_batch;    // B
    uint64_t epochs;          // run length in epochs, if steps is 0
    uint64_t steps;           // run length in steps (wins over epochs)
    const char *optimizer;    // "sgd"
    zps_optim_cfg optim;      // lr, momentum, schedule
    uint64_t seed;            // init, data order
    const char *metrics_log;  // JSON lines, or NULL
    const char *endpoint_file; // where to write the bound endpoint, or NULL
} s_opts;

typedef struct s_server {
    void *ctx;                                   // owned
    void *sock;                                  // owned: ROUTER bound to listen
    zps_shard *shard;                            // owned: [0, n_params)
    zps_coord *coord;                            // owned: shard 0 is the coordinator
    uint64_t bad_messages;                       // refused or dropped messages
    zmq_msg_t route[ZPS_MAX_MEMBERS];            // where each rank's PARAMS go
    bool route_set[ZPS_MAX_MEMBERS];             // route[i] is initialised
    double step_start_ms;                        // when the current step began
    double next_stall_ms;                        // next stall warning
} s_server;

static volatile sig_atomic_t s_stop;

static void s_on_signal(int sig)
{
    (void)sig;
    s_stop = 1;
}

// ---------------------------------------------------------------------------
// Refusals: one line, one counter, an ERROR reply; parameters untouched.

static void s_refuse(s_server *srv, zps_wire_msg *m, zps_err err, const char *why)
{
    srv->bad_messages++;
    const char *type = zps_wire_type_name(m->hdr ? (int)m->hdr->type : -1);
    zps_log_warn("refused %s: %s (%s) [%llu refused so far]", m->hdr ? type : "undecodable message",
                 why, zps_strerror(err), (unsigned long long)srv->bad_messages);
    if (m->has_route) {
        zps_wire_send_error(srv->sock, &m->route, zps_coord_job_id(srv->coord),
                            zps_shard_step(srv->shard), err, why);
    }
}

static void s_send_params(s_server *srv, zmq_msg_t *route, bool zero_copy)
{
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__PARAMS);
    h.job_id = zps_coord_job_id(srv->coord);
    h.step = zps_shard_step(srv->shard);
    h.offset = zps_shard_lo(srv->shard);
    h.count = zps_shard_hi(srv->shard) - h.offset;
    h.dtype = ZPS__DTYPE__F32;
    zps_wire_ref *ref = zero_copy ? zps_shard_params_ref(srv->shard) : NULL;
    zps_err err = zps_wire_send(srv->sock, route, &h, zps_shard_params(srv->shard),
                                h.count * sizeof(float), ref);
    if (err != ZPS_OK) {
        zps_log_warn("could not send step %llu parameters: %s", (unsigned long long)h.step,
                     zps_strerror(err));
    }
}

// Member checks shared by PULL and PUSH: right job, job started.
static bool s_check_member_msg(s_server *srv, zps_wire_msg *m)
{
    if (m->hdr->job_id != zps_coord_job_id(srv->coord)) {
        char why[96];
        snprintf(why, sizeof why, "job id %016llx is not this job's",
                 (unsigned long long)m->hdr->job_id);
        s_refuse(srv, m, ZPS_EJOB, why);
        return false;
    }
    if (!zps_coord_plan(srv->coord)) {
        s_refuse(srv, m, ZPS_ESTATE, "the job has not started");
        return false;
    }
    return true;
}

static void s_on_pull(s_server *srv, zps_wire_msg *m)
{
    if (!s_check_member_msg(srv, m)) {
        return;
    }
    const zps_plan_slice *sl = zps_plan_find(zps_coord_plan(srv->coord), m->hdr->rank);
    if (!sl || sl->member_id != m->hdr->member_id) {
        s_refuse(srv, m, ZPS_ENOENT, "PULL from a rank or member id not in the plan");
        return;
    }
    // Copied: a peer that never reads must not pin the zero-copy buffer.
    s_send_params(srv, &m->route, false);
}

static void s_complete_step(s_server *srv)
{
    uint64_t step = zps_shard_step(srv->shard);
    float loss = zps_shard_apply(srv->shard);
    double now = zps_clock_ms();
    zps_coord_step_done(srv->coord, step, loss, now - srv->step_start_ms);
    srv->step_start_ms = now;
    srv->next_stall_ms = now + ZPS_SERVER_STALL_WARN_MS;
    const zps_plan *plan = zps_coord_plan(srv->coord);
    for (uint32_t i = 0; i < plan->n; i++) {
        uint32_t r = plan->slices[i].rank;
        if (srv->route_set[r]) {
            s_send_params(srv, &srv->route[r], true);
        }
    }
}

static void s_on_push(s_server *srv, zps_wire_msg *m)
{
    if (!s_check_member_msg(srv, m)) {
        return;
    }
    char why[256];
    zps_err err = zps_shard_push(srv->shard, m, why, sizeof why);
    if (err != ZPS_OK) {
        s_refuse(srv, m, err, why);
        return;
    }
    uint32_t r = m->hdr->rank; // in the plan, so < ZPS_MAX_MEMBERS
    if (srv->route_set[r]) {
        zmq_msg_close(&srv->route[r]);
    }
    zmq_msg_init(&srv->route[r]);
    zmq_msg_copy(&srv->route[r], &m->route);
    srv->route_set[r] = true;
    zps_coord_note_push(srv->coord, r, m->hdr->compute_ms);
    if (zps_shard_ready(srv->shard)) {
        s_complete_step(srv);
    }
}

static void s_dispatch(s_server *srv, zps_wire_msg *m)
{
    zps_err err;
    switch (m->hdr->type) {
    case ZPS__MSG_TYPE__HELLO:
        err = zps_coord_on_hello(srv->coord, srv->sock, m);
        if (err != ZPS_OK) {
            srv->bad_messages++;
        } else if (zps_coord_plan(srv->coord)) {
            zps_shard_set_plan(srv->shard, zps_coord_plan(srv->coord));
            srv->step_start_ms = zps_clock_ms();
            srv->next_stall_ms = srv->step_start_ms + ZPS_SERVER_STALL_WARN_MS;
        }
        break;
    case ZPS__MSG_TYPE__PULL:
        s_on_pull(srv, m);
        break;
    case ZPS__MSG_TYPE__PUSH:
        s_on_push(srv, m);
        break;
    case ZPS__MSG_TYPE__EVAL:
    case ZPS__MSG_TYPE__BYE:
        if (m->hdr->job_id != zps_coord_job_id(srv->coord)) {
            s_refuse(srv, m, ZPS_EJOB, "job id is not this job's");
            return;
        }
        err = m->hdr->type == ZPS__MSG_TYPE__EVAL ? zps_coord_on_eval(srv->coord, m)
                                                  : zps_coord_on_bye(srv->coord, m);
        srv->bad_messages += err != ZPS_OK;
        break;
    case ZPS__MSG_TYPE__STATUS:
        zps_coord_on_status(srv->coord, srv->sock, m, zps_shard_step(srv->shard),
                            srv->bad_messages);
        break;
    default:
        s_refuse(srv, m, ZPS_EPROTO, "unexpected message type");
        break;
    }
}

static void s_read_one(s_server *srv)
{
    zps_wire_msg m;
    zps_err err = zps_wire_recv(srv->sock, true, &m);
    if (err == ZPS_EPROTO) {
        s_refuse(srv, &m, err, "header does not decode or too many frames");
    } else if (err == ZPS_EVERSION) {
        char why[96];
        snprintf(why, sizeof why, "protocol version %u, this server speaks %d",
                 m.hdr->version, ZPS_WIRE_VERSION);
        s_refuse(srv, &m, err, why);
    } else if (err == ZPS_OK) {
        s_dispatch(srv, &m);
    }
    zps_wire_msg_fini(&m);
}

// Names what a stalled step waits for, every ZPS_SERVER_STALL_WARN_MS.
static void s_warn_stall(s_server *srv, double now)
{
    const zps_plan *plan = zps_coord_plan(srv->coord);
    if (!plan || zps_coord_finished(srv->coord) || now < srv->next_stall_ms) {
        return;
    }
    for (uint32_t i = 0; i < plan->n; i++) {
        uint32_t r = plan->slices[i].rank;
        if (!zps_shard_rank_done(srv->shard, r)) {
            zps_log_warn("step %llu: waiting %.1f s for rank %u (%s): its push is missing",
                         (unsigned long long)zps_shard_step(srv->shard),
                         (now - srv->step_start_ms) / 1e3, r,
                         zps_coord_member_host(srv->coord, r));
        }
    }
    srv->next_stall_ms = now + ZPS_SERVER_STALL_WARN_MS;
}

static int s_run(s_server *srv)
{
    zmq_pollitem_t item = {.socket = srv->sock, .events = ZMQ_POLLIN};
    while (!s_stop && !zps_coord_finished(srv->coord)) {
        int rc = zmq_poll(&item, 1, ZPS_SERVER_POLL_MS);
        if (rc < 0 && errno != EINTR) {
            zps_log_error("zmq_poll: %s", zmq_strerror(errno));
            return 1;
        }
        // Drain what is ready, but come back to the timers now and then.
        for (int i = 0; rc > 0 && i < 64; i++) {
            int events = 0;
            size_t len = sizeof events;
            if (zmq_getsockopt(srv->sock, ZMQ_EVENTS, &events, &len) != 0 ||
                !(events & ZMQ_POLLIN)) {
                break;
            }
            s_read_one(srv);
        }
        double now = zps_clock_ms();
        zps_coord_tick(srv->coord, now);
        s_warn_stall(srv, now);
    }
    if (s_stop) {
        zps_log_info("stopped by signal at step %llu",
                     (unsigned long long)zps_shard_step(srv->shard));
    }
    return 0;
}

// ---------------------------------------------------------------------------
// Flags and start-up: any error here exits with a hint.

static void s_usage(FILE *f)
{
    fprintf(f,
            "usage: zps-server [options]\n"
            "  --listen ENDPOINT      bind here (default tcp://127.0.0.1:5555; port * picks one)\n"
            "  --endpoint-file FILE   write the bound endpoint here once listening\n"
            "  --workers N            workers to admit before step 0 (default 1)\n"
            "  --model SPEC           mlp:D0-D1-...-Dk (default mlp:784-512-512-10)\n"
            "  --dataset SPEC         fashion-mnist[:DIR] or synthetic:N (default fashion-mnist)\n"
            "  --global-batch B       samples per step over all workers (default 128)\n"
            "  --epochs E | --steps S run length (default 10 epochs)\n"
            "  --optimizer sgd        --lr X (0.05) --momentum X (0.9) --nesterov\n"
            "                         --weight-decay X (0)\n"
            "  --lr-schedule NAME     constant or cosine (default cosine, to 0 at the end)\n"
            "  --warmup-steps N       linear warm-up (default 0)\n"
            "  --seed N               init and data order (default 0)\n"
            "  --metrics-log FILE     JSON lines: one per step, one per evaluation\n"
            "  --log-level LEVEL      debug, info, warn, error (default info)\n");
}

static bool s_parse_u64(const char *flag, const char *text, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || end == text || *end || text[0] == '-') {
        fprintf(stderr, "zps-server: %s: '%s' is not a non-negative integer\n", flag, text);
        return false;
    }
    *out = v;
    return true;
}

static bool s_parse_float(const char *flag, const char *text, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(text, &end);
    if (errno || end == text || *end) {
        fprintf(stderr, "zps-server: %s: '%s' is not a number\n", flag, text);
        return false;
    }
    *out = v;
    return true;
}

static bool s_parse_opts(int argc, char **argv, s_opts *o)
{
    enum { O_LISTEN = 256, O_WORKERS, O_MODEL, O_DATASET, O_BATCH, O_EPOCHS, O_STEPS, O_OPTIM,
           O_LR, O_MOMENTUM, O_NESTEROV, O_WD, O_SCHED, O_WARMUP, O_SEED, O_METRICS, O_LOG,
           O_ENDPOINT_FILE, O_HELP };
    static const struct option longopts[] = {
        {"listen", required_argument, 0, O_LISTEN},
        {"workers", required_argument, 0, O_WORKERS},
        {"model", required_argument, 0, O_MODEL},
        {"dataset", required_argument, 0, O_DATASET},
        {"global-batch", required_argument, 0, O_BATCH},
        {"epochs", required_argument, 0, O_EPOCHS},
        {"steps", required_argument, 0, O_STEPS},
        {"optimizer", required_argument, 0, O_OPTIM},
        {"lr", required_argument, 0, O_LR},
        {"momentum", required_argument, 0, O_MOMENTUM},
        {"nesterov", no_argument, 0, O_NESTEROV},
        {"weight-decay", required_argument, 0, O_WD},
        {"lr-schedule", required_argument, 0, O_SCHED},
        {"warmup-steps", required_argument, 0, O_WARMUP},
        {"seed", required_argument, 0, O_SEED},
        {"metrics-log", required_argument, 0, O_METRICS},
        {"log-level", required_argument, 0, O_LOG},
        {"endpoint-file", required_argument, 0, O_ENDPOINT_FILE},
        {"help", no_argument, 0, O_HELP},
        {0, 0, 0, 0},
    };
    *o = (s_opts){
        .listen = "tcp://127.0.0.1:5555",
        .workers = 1,
        .model = "mlp:784-512-512-10",
        .dataset = "fashion-mnist",
        .global_batch = 128,
        .epochs = 10,
        .optimizer = "sgd",
        .optim = {.lr = 0.05f, .momentum = 0.9f, .schedule = ZPS_LR_COSINE},
    };
    uint64_t v;
    int c;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        bool ok = true;
        switch (c) {
        case O_LISTEN: o->listen = optarg; break;
        case O_WORKERS:
            ok = s_parse_u64("--workers", optarg, &v) && v >= 1 && v <= ZPS_MAX_MEMBERS;
            o->workers = (uint32_t)v;
            if (!ok) {
                fprintf(stderr, "zps-server: --workers must be 1..%d\n", ZPS_MAX_MEMBERS);
            }
            break;
        case O_MODEL: o->model = optarg; break;
        case O_DATASET: o->dataset = optarg; break;
        case O_BATCH:
            ok = s_parse_u64("--global-batch", optarg, &v) && v >= 1 && v <= (1u << 24);
            o->global_batch = (uint32_t)v;
            break;
        case O_EPOCHS: ok = s_parse_u64("--epochs", optarg, &o->epochs); break;
        case O_STEPS: ok = s_parse_u64("--steps", optarg, &o->steps); break;
        case O_OPTIM: o->optimizer = optarg; break;
        case O_LR: ok = s_parse_float("--lr", optarg, &o->optim.lr); break;
        case O_MOMENTUM: ok = s_parse_float("--momentum", optarg, &o->optim.momentum); break;
        case O_NESTEROV: o->optim.nesterov = true; break;
        case O_WD: ok = s_parse_float("--weight-decay", optarg, &o->optim.weight_decay); break;
        case O_SCHED: ok = zps_optim_parse_schedule(optarg, &o->optim.schedule) == ZPS_OK; break;
        case O_WARMUP: ok = s_parse_u64("--warmup-steps", optarg, &o->optim.warmup_steps); break;
        case O_SEED: ok = s_parse_u64("--seed", optarg, &o->seed); break;
        case O_METRICS: o->metrics_log = optarg; break;
        case O_ENDPOINT_FILE: o->endpoint_file = optarg; break;
        case O_LOG: {
            zps_log_level lvl;
            ok = zps_log_parse_level(optarg, &lvl);
            if (ok) {
                zps_log_set_level(lvl);
            } else {
                fprintf(stderr, "zps-server: --log-level: debug, info, warn or error\n");
            }
            break;
        }
        case O_HELP: s_usage(stdout); exit(0);
        default: ok = false; break;
        }
        if (!ok) {
            s_usage(stderr);
            return false;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "zps-server: unexpected argument '%s'\n", argv[optind]);
        return false;
    }
    if (o->global_batch == 0) {
        fprintf(stderr, "zps-server: --global-batch must be 1..%u\n", 1u << 24);
        return false;
    }
    return true;
}

// Binds sock and reports the endpoint bound (a port of '*' resolved) in
// endpoint and, if asked, in a file that launchers and tests wait for.
static int s_bind(void *sock, const char *listen, const char *endpoint_file, char *endpoint,
                  size_t len)
{
    if (zmq_bind(sock, listen) != 0) {
        zps_log_error("cannot bind %s: %s", listen, zmq_strerror(errno));
        fprintf(stderr, "HINT: another zps-server may hold the port; pick another --listen\n");
        return 2;
    }
    if (zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, endpoint, &len) != 0) {
        snprintf(endpoint, len, "%s", listen);
    }
    if (endpoint_file) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", endpoint_file);
        FILE *f = fopen(tmp, "w");
        if (!f || fprintf(f, "%s\n", endpoint) < 0 || fclose(f) != 0 ||
            rename(tmp, endpoint_file) != 0) {
            zps_log_error("--endpoint-file %s: %s", endpoint_file, strerror(errno));
            return 2;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    zps_log_set_name("server[0]");
    s_opts o;
    if (!s_parse_opts(argc, argv, &o)) {
        return 2;
    }
    zps_model_spec model;
    zps_dataset_spec ds;
    uint32_t n_train, n_test;
    if (zps_model_parse(o.model, &model) != ZPS_OK || zps_dataset_parse(o.dataset, &ds) != ZPS_OK ||
        zps_optim_check(o.optimizer, &o.optim) != ZPS_OK ||
        zps_dataset_counts(&ds, &n_train, &n_test) != ZPS_OK) {
        fprintf(stderr, "HINT: zps-server --help lists the flags; fashion-mnist comes from the "
                        "Debian package dataset-fashion-mnist\n");
        return 2;
    }
    if (o.global_batch > n_train || o.global_batch < o.workers) {
        zps_log_error("global batch %u must be between --workers (%u) and the train set (%u)",
                      o.global_batch, o.workers, n_train);
        return 2;
    }
    uint64_t spe = n_train / o.global_batch;
    uint64_t total = o.steps ? o.steps : o.epochs * spe;
    if (total == 0) {
        zps_log_error("the run has no steps (--epochs 0 or --steps 0)");
        return 2;
    }
    o.optim.total_steps = total;

    int ret = 1;
    FILE *metrics = NULL;
    s_server srv = {0};
    float *init = malloc(model.n_params * sizeof(float));
    if (!init) {
        zps_log_error("cannot allocate %zu parameters", model.n_params);
        return 1;
    }
    zps_model_init_params(&model, o.seed, init);
    srv.shard = zps_shard_new(0, 0, model.n_params, &o.optim, init);
    free(init);
    if (!srv.shard) {
        goto out;
    }
    if (o.metrics_log && !(metrics = fopen(o.metrics_log, "w"))) {
        zps_log_error("--metrics-log %s: %s", o.metrics_log, strerror(errno));
        goto out;
    }
    srv.ctx = zmq_ctx_new();
    srv.sock = srv.ctx ? zps_wire_socket(srv.ctx, ZMQ_ROUTER, 5000) : NULL;
    if (!srv.sock) {
        goto out;
    }
    char endpoint[256];
    if ((ret = s_bind(srv.sock, o.listen, o.endpoint_file, endpoint, sizeof endpoint)) != 0) {
        goto out;
    }
    ret = 1;
    zps_coord_cfg cc = {
        .model = o.model, .dataset = o.dataset, .seed = o.seed, .global_batch = o.global_batch,
        .total_steps = total, .steps_per_epoch = spe, .n_test = n_test, .workers = o.workers,
        .n_params = model.n_params, .endpoint = endpoint, .metrics = metrics,
    };
    if (!(srv.coord = zps_coord_new(&cc))) {
        goto out;
    }
    signal(SIGINT, s_on_signal);
    signal(SIGTERM, s_on_signal);
    zps_log_info("listening on %s: model %s (%zu parameters), dataset %s (%u train, %u test), "
                 "global batch %u, %llu steps",
                 endpoint, o.model, model.n_params, o.dataset, n_train, n_test, o.global_batch,
                 (unsigned long long)total);
    ret = s_run(&srv);
out:
    for (int i = 0; i < ZPS_MAX_MEMBERS; i++) {
        if (srv.route_set[i]) {
            zmq_msg_close(&srv.route[i]);
        }
    }
    if (srv.sock) {
        zmq_close(srv.sock);
    }
    if (srv.ctx) {
        zmq_ctx_term(srv.ctx); // releases the zero-copy frames of the shard's buffer
    }
    zps_coord_destroy(&srv.coord);
    zps_shard_destroy(&srv.shard);
    if (metrics) {
        fclose(metrics);
    }
    return ret;
}
