/* zps_server.c - the server loop: poll, dispatch, and the timers (server/
 * zps_timers.h) whose earliest deadline is the poll's timeout; the rest of
 * the loop is in the files server/zps_server_int.h lists, the coordinator
 * in server/coord/, the shard in server/shard/.
 *
 * Every message read is checked against the message table
 * (server/zps_msgtab.h) in s_dispatch before any handler runs; a refusal
 * is counted, logged (a bounded number of lines a second) with the type,
 * the rank or shard it claims and the peer's address, and answered with
 * ERROR where the sender waits for an answer. Nothing a peer sends stops
 * the loop: the only ways out are the end of the run, a signal, and (on
 * shards > 0) the coordinator's own refusal or a rollback to a checkpoint
 * this shard does not have. */
#include "server/zps_server_int.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>

#include "common/zps_clock.h"
#include "server/shard/zps_pool.h"
#include "server/zps_late.h"
#include "server/zps_msgtab.h"
#include "server/zps_refusals.h"

static volatile sig_atomic_t s_stop;
static volatile sig_atomic_t s_reload_keys;

static void s_on_signal(int sig)
{
    if (sig == SIGHUP) {
        s_reload_keys = 1;
    } else {
        s_stop = 1;
    }
}

// The coordinator's job id on shard 0, the ASSIGN's on the others (0 before it).
static uint64_t s_job_id(const zps_server *srv)
{
    return srv->coord ? zps_coord_job_id(srv->coord) : srv->job_id;
}

// A refusal: counted, logged, answered (server/zps_refusals.h); nothing else changes.
static void s_refuse(zps_server *srv, zps_wire_msg *m, zps_err err, const char *why)
{
    zps_refusals_answer(&srv->refused, srv->sock, s_job_id(srv),
                        srv->shard ? zps_shard_step(srv->shard) : 0, m, err, why);
}

// Messages for the coordinator (shard 0 only; the table sent the others'
// elsewhere). Handlers refuse what is wrong in a body (a share that does
// not fit, a rollback to a step shard 0 has no checkpoint of) and log it
// themselves; the refusal is counted here.
static void s_dispatch_coord(zps_server *srv, zps_wire_msg *m)
{
    zps_err err = ZPS_OK;
    if (!srv->coord) {
        s_refuse(srv, m, ZPS_ESTATE, "this shard is not the coordinator (shard 0)");
        return;
    }
    switch (m->hdr->type) {
    case ZPS__MSG_TYPE__HELLO: err = zps_coord_on_hello(srv->coord, &srv->out, m); break;
    case ZPS__MSG_TYPE__REGISTER: err = zps_coord_on_register(srv->coord, &srv->out, m); break;
    case ZPS__MSG_TYPE__READY: err = zps_coord_on_ready(srv->coord, &srv->out, m); break;
    case ZPS__MSG_TYPE__EVAL: err = zps_coord_on_eval(srv->coord, m); break;
    case ZPS__MSG_TYPE__BYE: err = zps_coord_on_bye(srv->coord, &srv->out, m); break;
    // A member's heartbeat after it was evicted or finished: its own, not a refusal.
    case ZPS__MSG_TYPE__HEARTBEAT: (void)zps_coord_on_heartbeat(srv->coord, &srv->out, m); break;
    case ZPS__MSG_TYPE__STEP_DONE: err = zps_coord_on_step_done(srv->coord, m); break;
    case ZPS__MSG_TYPE__NORM: err = zps_coord_on_norm(srv->coord, &srv->out, m); break;
    case ZPS__MSG_TYPE__STATUS:
        zps_coord_on_status(srv->coord, &srv->out, m, zps_shard_step(srv->shard),
                            srv->refused.count);
        break;
    default:
        s_refuse(srv, m, ZPS_EPROTO, "not a message for the coordinator");
        return;
    }
    srv->refused.count += err != ZPS_OK;
    (void)zps_outbox_flush(&srv->out, srv->sock);
    zps_steps_sync_coord(srv);
    zps_steps_take_norm(srv); // a NORM that completed a step's norm: shard 0's update
}

// Shard 0 of an external job before its model is declared (zps_declare.c
// says what a message means then, and starts the coordinator): the HELLO
// that declares it goes on to the coordinator, anything else is refused.
static void s_on_undeclared(zps_server *srv, zps_wire_msg *m)
{
    char why[320];
    zps_err err = zps_declare_on_undeclared(srv, m, why, sizeof why);
    if (err != ZPS_OK) {
        s_refuse(srv, m, err, why);
        return;
    }
    s_dispatch_coord(srv, m);
}

// The message table's questions, answered by this server.
static bool s_tab_member_ok(void *arg, uint32_t rank, uint64_t member_id)
{
    const zps_server *srv = arg;
    return srv->coord && zps_coord_member_ok(srv->coord, rank, member_id);
}

static bool s_tab_plan_member_ok(void *arg, uint32_t rank, uint64_t member_id)
{
    const zps_server *srv = arg;
    return srv->shard && zps_shard_member_has_rank(srv->shard, rank, member_id);
}

static uint32_t s_tab_newest_generation(void *arg)
{
    const zps_server *srv = arg;
    return srv->shard ? zps_shard_generation(srv->shard) : 0;
}

static bool s_tab_shard_assigned(void *arg, uint32_t index)
{
    const zps_server *srv = arg;
    return srv->coord && zps_coord_shard_assigned(srv->coord, index);
}

static bool s_tab_shard_token_ok(void *arg, uint32_t index, uint64_t token)
{
    const zps_server *srv = arg;
    return srv->coord && zps_coord_shard_token_ok(srv->coord, index, token);
}

static uint32_t s_at(const zps_server *srv)
{
    if (srv->coord) {
        return zps_coord_at(srv->coord);
    }
    if (srv->o->shard == 0) {
        return ZPS_AT_WAITING; // an external model not declared yet
    }
    return srv->shard ? ZPS_AT_SERVING : ZPS_AT_UNASSIGNED;
}

// Every message read goes through here, held pushes again when their plan
// comes: the table first (who may send it, with what, when), then its handler.
static void s_dispatch(zps_server *srv, zps_wire_msg *m)
{
    zps_msgtab_ctx x = {
        .at = s_at(srv),
        .curve = srv->curve.on,
        .job_id = s_job_id(srv),
        .arg = srv,
        .member_ok = s_tab_member_ok,
        .plan_member_ok = s_tab_plan_member_ok,
        .newest_generation = s_tab_newest_generation,
        .shard_assigned = s_tab_shard_assigned,
        .shard_token_ok = s_tab_shard_token_ok,
    };
    char why[256];
    zps_err err = zps_msgtab_check(&x, m->hdr, m->user_id, why, sizeof why);
    if (err != ZPS_OK) {
        s_refuse(srv, m, err, why);
        return;
    }
    if (srv->o->shard == 0 && !srv->coord) {
        s_on_undeclared(srv, m);
        return;
    }
    switch (m->hdr->type) {
    case ZPS__MSG_TYPE__PULL: zps_shard_io_on_pull(&srv->io, m); break;
    case ZPS__MSG_TYPE__PUSH: zps_steps_on_push(srv, m); break;
    case ZPS__MSG_TYPE__INIT: zps_shard_io_on_init(&srv->io, m); break;
    default: s_dispatch_coord(srv, m); break;
    }
}

// What the shard's I/O asks of the server.
static void s_io_refuse(void *arg, zps_wire_msg *m, zps_err err, const char *why)
{
    s_refuse(arg, m, err, why);
}

static uint64_t s_io_job_id(void *arg)
{
    return s_job_id(arg);
}

static void s_io_again(void *arg, zps_wire_msg *m)
{
    s_dispatch(arg, m);
}

static void s_read_one(zps_server *srv)
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

// ---------------------------------------------------------------------------
// Stopping.

static bool s_over(const zps_server *srv)
{
    return srv->coord ? zps_coord_finished(srv->coord) : srv->finished;
}

// After SIGTERM or SIGINT the loop stops between steps, so that the
// checkpoint written on the way out is of a whole step; a step half applied
// gets ZPS_SERVER_STOP_GRACE_MS to finish (the stop-grace timer).
static void s_notice_stop(zps_server *srv, double now)
{
    if (!s_stop || srv->stopping) {
        return;
    }
    srv->stopping = true;
    zps_timers_at(&srv->timers, srv->t_stop_grace, now + ZPS_SERVER_STOP_GRACE_MS);
    zps_log_info("stopping: %s", zps_shard_io_between_steps(&srv->io)
                                     ? "between steps"
                                     : "waiting (bounded) for the step in progress to finish");
}

// Between steps is a state, not a time: looked at after every turn of the
// loop. Only the grace is a timer.
static bool s_stop_now(const zps_server *srv)
{
    return srv->leave || (srv->stopping && zps_shard_io_between_steps(&srv->io));
}

// ---------------------------------------------------------------------------
// The timers: every periodic or deadline check of the loop.

// The coordinator's clock (evictions of silent workers, its waiting and
// progress lines) and the plans it makes there.
static void s_on_tick(void *arg, double now)
{
    zps_server *srv = arg;
    if (srv->coord) {
        zps_coord_tick(srv->coord, &srv->out, now);
        (void)zps_outbox_flush(&srv->out, srv->sock);
        zps_steps_sync_coord(srv);
    }
}

// Shard 0 of an external job, until its model is declared.
static void s_on_declare_log(void *arg, double now)
{
    zps_server *srv = arg;
    (void)now;
    if (srv->coord) {
        zps_timers_cancel(&srv->timers, srv->t_declare_log);
        return;
    }
    zps_log_info("waiting for the first worker to declare the model (--model external)");
}

// Shards > 0: REGISTER until assigned, and after it, for a coordinator
// that restarts, to say where this shard is.
static void s_on_register(void *arg, double now)
{
    zps_server *srv = arg;
    (void)now;
    if (!srv->shard) {
        zps_log_info("waiting for the coordinator at %s to assign this shard's range",
                     srv->o->coordinator);
    }
    zps_register_send(srv);
}

static void s_on_linger(void *arg, double now)
{
    zps_register_linger_check(arg, now);
}

static void s_on_stall(void *arg, double now)
{
    zps_server *srv = arg;
    if (zps_shard_io_started(&srv->io) && !srv->finished &&
        zps_shard_step(srv->shard) < srv->total_steps) {
        zps_late_warn_stall(&srv->io, srv->coord, srv->step_start_ms, now);
    }
}

// Speculation looks again when a slice under way becomes late (the
// quorum plus --speculate-after median steps), and otherwise every quarter
// of that wait: a helper may be refused now and found later.
static void s_on_speculate(void *arg, double now)
{
    zps_server *srv = arg;
    zps_late_speculate(&srv->io, srv->coord, &srv->out, srv->o->speculate_after, now);
    (void)zps_outbox_flush(&srv->out, srv->sock);
    double late = srv->coord ? srv->o->speculate_after * zps_coord_median_step_ms(srv->coord) : 0;
    double due = now + (late > 0 && late / 4 < ZPS_SERVER_POLL_MS ? late / 4 + 1
                                                                   : ZPS_SERVER_POLL_MS);
    if (late > 0 && srv->io.quorum_ms > 0 && srv->io.quorum_ms + late > now) {
        due = fmin(due, srv->io.quorum_ms + late);
    }
    zps_timers_at(&srv->timers, srv->t_speculate, due);
}

// Refreshes what --http serves. Shards > 0 serve only the probes: ready
// once the coordinator has assigned their range.
static void s_on_publish(void *arg, double now)
{
    zps_server *srv = arg;
    zps_coord_docs d = {0};
    (void)now;
    if (srv->coord && !zps_http_wants_documents(srv->http)) {
        zps_http_alive(srv->http, srv->shard != NULL); // nobody reads them: kept a while
        return;
    }
    if (srv->coord &&
        zps_coord_render_docs(srv->coord, zps_shard_step(srv->shard), srv->refused.count,
                              &d) != ZPS_OK) {
        return;
    }
    zps_http_publish(srv->http, d.metrics, d.status, d.rows, srv->shard != NULL);
}

// --clip-grad-norm, shards > 0: a norm awaited for long is said and asked again.
static void s_on_norm_wait(void *arg, double now)
{
    zps_steps_norm_wait(arg, now);
}

static void s_on_stop_grace(void *arg, double now)
{
    zps_server *srv = arg;
    (void)now;
    srv->leave = true;
}

static int s_add(zps_server *srv, const char *name, double period_ms, zps_timer_fn fn, bool now)
{
    int id = zps_timers_add(&srv->timers, name, period_ms, fn, srv);
    if (now) {
        zps_timers_at(&srv->timers, id, zps_clock_ms());
    }
    return id;
}

// The timer table, before anything can arm one of its timers.
static void s_add_timers(zps_server *srv)
{
    const zps_server_opts *o = srv->o;
    zps_timers_init(&srv->timers);
    bool coordinator = o->shard == 0;
    srv->t_stall = s_add(srv, "stall warning", fmax(o->stall_warn_ms, 1), s_on_stall, false);
    srv->t_stop_grace = s_add(srv, "stop grace", 0, s_on_stop_grace, false);
    srv->t_speculate = coordinator && o->speculate_after > 0
                           ? s_add(srv, "speculation", 0, s_on_speculate, true)
                           : -1;
    srv->t_register =
        coordinator ? -1 : s_add(srv, "register", ZPS_SERVER_REGISTER_MS, s_on_register, false);
    srv->t_declare_log = coordinator ? s_add(srv, "declaration", ZPS_SERVER_DECLARE_LOG_MS,
                                             s_on_declare_log, true)
                                     : -1;
    if (coordinator) {
        (void)s_add(srv, "coordinator", ZPS_SERVER_TICK_MS, s_on_tick, true);
    } else {
        (void)s_add(srv, "gradient norm", 1000.0, s_on_norm_wait, true);
    }
    srv->t_linger =
        coordinator ? -1 : s_add(srv, "coordinator's end", ZPS_SERVER_TICK_MS, s_on_linger, false);
    if (o->http) {
        (void)s_add(srv, "publish", ZPS_SERVER_PUBLISH_MS, s_on_publish, true);
    }
}

// ---------------------------------------------------------------------------
// The loop.

// Reads up to `max` messages ready on the ROUTER; returns how many.
static int s_drain(zps_server *srv, int max)
{
    int n = 0;
    int events = 0;
    size_t len = sizeof events;
    while (n < max && zmq_getsockopt(srv->sock, ZMQ_EVENTS, &events, &len) == 0 &&
           (events & ZMQ_POLLIN)) {
        s_read_one(srv);
        n++;
        len = sizeof events;
    }
    return n;
}

// What the loop does after reading, before the timers: held pushes
// replayed (never from inside a push's handling), keys reloaded on SIGHUP,
// a stop signal noticed.
static void s_after_read(zps_server *srv)
{
    zps_shard_io_replay(&srv->io);
    if (s_reload_keys) {
        s_reload_keys = 0;
        zps_zap_reload(srv->zap);
    }
    s_notice_stop(srv, zps_clock_ms());
}

static int s_loop(zps_server *srv)
{
    zmq_pollitem_t items[2] = {{.socket = srv->sock, .events = ZMQ_POLLIN},
                               {.socket = srv->up, .events = ZMQ_POLLIN}};
    int n_items = srv->up ? 2 : 1;
    s_notice_stop(srv, zps_clock_ms());
    while (!s_over(srv) && !s_stop_now(srv)) {
        long timeout = zps_timers_next_ms(&srv->timers, zps_clock_ms(), ZPS_SERVER_POLL_MS);
        int rc = zmq_poll(items, n_items, timeout);
        if (rc < 0 && errno != EINTR) {
            zps_log_error("zmq_poll: %s", zmq_strerror(errno));
            return 1;
        }
        if (rc > 0 && (items[0].revents & ZMQ_POLLIN)) {
            (void)s_drain(srv, 64); // then back to the timers, even under a flood
        }
        if (n_items == 2 && (items[1].revents & ZMQ_POLLIN) &&
            zps_register_read_up(srv) != ZPS_OK) {
            return 1;
        }
        s_after_read(srv);
        (void)zps_timers_run(&srv->timers, zps_clock_ms());
    }
    if (s_stop && !s_over(srv)) {
        zps_steps_stop_checkpoint(srv);
    }
    return 0;
}

// Everything zps_server_run sets up before its loop (zps_setup_open).
// *status: 0, or the exit status on failure (2 bad configuration, 1 other).
zps_server *zps_server_open(const zps_server_opts *o, int *status)
{
    char name[32];
    snprintf(name, sizeof name, "server[%u]", o->shard);
    zps_log_set_name(name);
    zps_server *srv = calloc(1, sizeof *srv);
    *status = 1;
    if (!srv) {
        return NULL;
    }
    srv->o = o;
    srv->wire_code = o->wire_code; // shard 0's; the others' come with the ASSIGN
    srv->threads = o->threads;
    if (srv->threads == 0) {
        srv->threads = zps_pool_auto_threads();
        zps_log_info("--threads auto: %d thread(s) share each large bucket's update (the cores "
                     "this process may run on, or fewer if its cgroup's CPU quota says so, at "
                     "most %d)", srv->threads, ZPS_POOL_AUTO_MAX);
    }
    s_add_timers(srv); // before anything can arm one of them
    zps_shard_io_hooks hooks = {.arg = srv, .refuse = s_io_refuse, .job_id = s_io_job_id,
                                .again = s_io_again};
    *status = zps_setup_open(srv, &hooks);
    if (*status != 0) {
        zps_server_close(&srv);
        return NULL;
    }
    return srv;
}

int zps_server_run(const zps_server_opts *o)
{
    int ret;
    zps_server *srv = zps_server_open(o, &ret);
    if (!srv) {
        return ret;
    }
    (void)signal(SIGINT, s_on_signal);
    (void)signal(SIGTERM, s_on_signal);
    (void)signal(SIGHUP, s_on_signal);
    ret = s_loop(srv);
    zps_setup_log_peak_rss(srv);
    zps_server_close(&srv);
    return ret;
}

int zps_server_turn(zps_server *srv)
{
    int n = s_drain(srv, INT_MAX);
    int events = 0;
    size_t len = sizeof events;
    while (srv->up && zmq_getsockopt(srv->up, ZMQ_EVENTS, &events, &len) == 0 &&
           (events & ZMQ_POLLIN)) {
        if (zps_register_read_up(srv) != ZPS_OK) {
            return -1; // where the loop ends the shard
        }
        n++;
        len = sizeof events;
    }
    zps_shard_io_replay(&srv->io);
    s_on_tick(srv, zps_clock_ms());
    return n;
}

void *zps_server_ctx(zps_server *srv)
{
    return srv->ctx;
}

uint64_t zps_server_refused(const zps_server *srv)
{
    return srv->refused.count;
}

bool zps_server_stopping(const zps_server *srv)
{
    (void)srv;
    return s_stop != 0;
}

zps_shard *zps_server_shard(zps_server *srv)
{
    return srv->shard;
}

zps_coord *zps_server_coord(zps_server *srv)
{
    return srv->coord;
}

void zps_server_close(zps_server **srvp)
{
    zps_server *srv = *srvp;
    if (!srv) {
        return;
    }
    zps_setup_close(srv);
    free(srv);
    *srvp = NULL;
}
