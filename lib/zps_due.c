/* zps_due.c - what falls due while a worker waits for parameters, as named
 * timers of a table (common/zps_timers.h) whose earliest deadline is the
 * wait's poll timeout, as in the server's loop: a refused PULL or INIT
 * sent again, refused pushes computed again, the question where the job
 * is, the heartbeat from the main socket, the line that says what the wait
 * waits for. A refusal per shard keeps its own time to send again; the
 * timer of that kind is armed at the earliest of them. */
#include "lib/zps_client_int.h"

#include "common/zps_clock.h"
#include "common/zps_log.h"
#include "common/zps_wire.h"

// The timer `id` at the earliest of at[] (0: none there), or disarmed.
static void s_arm_earliest(zps_client *c, int id, const double *at)
{
    double next = 0;
    for (int i = 0; i < c->conn.n_shards; i++) {
        next = at[i] > 0 && (next == 0 || at[i] < next) ? at[i] : next;
    }
    if (next > 0) {
        zps_timers_at(&c->timers, id, next);
    } else {
        zps_timers_cancel(&c->timers, id);
    }
}

static void s_pull_again(void *arg, double now)
{
    zps_client *c = arg;
    for (int i = 0; c->due_err == ZPS_OK && i < c->conn.n_shards; i++) {
        if (c->pull_again_ms[i] > 0 && now >= c->pull_again_ms[i]) {
            c->pull_again_ms[i] = 0;
            c->due_err = zps_conn_pull(&c->conn, i, c->wait_step);
        }
    }
    s_arm_earliest(c, c->t_pull, c->pull_again_ms);
}

static void s_init_again(void *arg, double now)
{
    zps_client *c = arg;
    for (int i = 0; c->due_err == ZPS_OK && i < c->conn.n_shards; i++) {
        if (c->init_again_ms[i] > 0 && now >= c->init_again_ms[i]) {
            c->init_again_ms[i] = 0;
            c->due_err = zps_conn_send_init(&c->conn, i, c->params);
        }
    }
    s_arm_earliest(c, c->t_init, c->init_again_ms);
}

static void s_redo(void *arg, double now)
{
    (void)now;
    zps_client *c = arg;
    if (c->due_err == ZPS_OK) {
        zps_work_queue_extras(c, c->wait_step);
    }
}

static void s_ask(void *arg, double now)
{
    (void)now;
    zps_client *c = arg;
    if (c->due_err == ZPS_OK) {
        c->due_err = zps_ask_where_is_job(c, c->wait_step); // it arms the next question
    }
}

int zps_due_beat_ms(const zps_client *c)
{
    return zps_heartbeat_interval(c->conn.heartbeat_ms, c->usual_step_ms,
                                  c->conn.worker_timeout_ms);
}

// From the main socket too: a restarted coordinator learns from it where
// this worker's replies go. The coordinator heard it: the thread's next
// beat waits an interval from it (both beating, a member waiting out long
// steps sent two beats an interval).
static void s_beat(void *arg, double now)
{
    zps_client *c = arg;
    if (c->due_err != ZPS_OK) {
        zps_timers_at(&c->timers, c->t_beat, now);
        return;
    }
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__HEARTBEAT);
    h.flags = 1;
    if (zps_conn_send(&c->conn, 0, &h, NULL, 0, NULL) == ZPS_OK) {
        zps_heartbeat_heard(c->conn.heartbeat);
    }
    zps_timers_at(&c->timers, c->t_beat, now + zps_due_beat_ms(c));
}

static void s_log(void *arg, double now)
{
    zps_client *c = arg;
    if (c->due_err != ZPS_OK) {
        zps_timers_at(&c->timers, c->t_log, now);
        return;
    }
    for (int i = 0; i < c->conn.n_shards; i++) {
        const zps_conn_shard *sc = &c->conn.shards[i];
        if (!zps_bucket_set_full(&sc->received, sc->n_buckets)) {
            zps_log_info("waiting %.0f s for step %llu parameters from shard %d (%s)",
                         (now - c->wait_start) / 1e3, (unsigned long long)c->wait_step, i,
                         sc->endpoint);
        }
    }
    zps_timers_at(&c->timers, c->t_log, now + ZPS_CLIENT_WAIT_LOG_MS);
}

void zps_due_init(zps_client *c)
{
    zps_timers_init(&c->timers);
    c->t_pull = zps_timers_add(&c->timers, "pull again", 0, s_pull_again, c);
    c->t_init = zps_timers_add(&c->timers, "init again", 0, s_init_again, c);
    c->t_redo = zps_timers_add(&c->timers, "redo pushes", 0, s_redo, c);
    c->t_ask = zps_timers_add(&c->timers, "where is the job", 0, s_ask, c);
    c->t_beat = zps_timers_add(&c->timers, "heartbeat", 0, s_beat, c);
    c->t_log = zps_timers_add(&c->timers, "wait log", 0, s_log, c);
}

void zps_due_begin(zps_client *c, double start)
{
    zps_timers_at(&c->timers, c->t_log, start + ZPS_CLIENT_WAIT_LOG_MS);
    zps_timers_at(&c->timers, c->t_beat, start + zps_due_beat_ms(c));
    double ask_after = 4 * c->usual_step_ms > ZPS_CLIENT_ASK_EVERY_MS ? 4 * c->usual_step_ms
                                                                        : ZPS_CLIENT_ASK_EVERY_MS;
    if (c->catching_up && c->usual_step_ms > 0) {
        // Its pull names the step the coordinator was at, which a fast
        // job may pass before the pull arrives: the shards never answer
        // it, and a second's wait for the next question left a stalled
        // worker of a 2 ms-a-step job a second behind at each catch-up,
        // computing nothing to the end (check_end, on a loaded machine).
        ask_after = 4 * c->usual_step_ms;
    }
    zps_timers_at(&c->timers, c->t_ask, start + ask_after);
    c->ask_every_ms = ZPS_CLIENT_ASK_EVERY_MS; // asks back off within one wait only
}

// A refused INIT's time to be sent again outlives the wait: it goes on in
// the next one, as the shard may not be ready yet.
void zps_due_end(zps_client *c)
{
    for (int i = 0; i < c->conn.n_shards; i++) {
        c->pull_again_ms[i] = 0;
    }
    zps_timers_cancel(&c->timers, c->t_pull);
    zps_timers_cancel(&c->timers, c->t_redo);
}

void zps_due_pull_again(zps_client *c, int i, double at)
{
    c->pull_again_ms[i] = at;
    s_arm_earliest(c, c->t_pull, c->pull_again_ms);
}

void zps_due_init_again(zps_client *c, int i, double at)
{
    c->init_again_ms[i] = at;
    s_arm_earliest(c, c->t_init, c->init_again_ms);
}

void zps_due_redo(zps_client *c, double at)
{
    zps_timers_at(&c->timers, c->t_redo, at);
}

void zps_due_ask_at(zps_client *c, double at)
{
    zps_timers_at(&c->timers, c->t_ask, at);
}

long zps_due_poll_ms(const zps_client *c, double now)
{
    return zps_timers_next_ms(&c->timers, now, ZPS_CONN_POLL_MS);
}

zps_err zps_due_run(zps_client *c, double now)
{
    c->due_err = ZPS_OK;
    zps_timers_run(&c->timers, now);
    return c->due_err;
}
