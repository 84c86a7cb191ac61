/* zps_heartbeat.c - the heartbeat thread. */
#include "zps_heartbeat.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#include "common/zps_clock.h"
#include "common/zps_log.h"
#include "common/zps_wire.h"

struct zps_heartbeat {
    pthread_t thread;       // the beating thread
    void *sock;             // owned by the thread: DEALER to the coordinator
    pthread_mutex_t mu;     // guards stop, heard_ms and interval_ms
    pthread_cond_t wake;    // signalled by zps_heartbeat_stop (on the monotonic clock)
    bool stop;              // set by zps_heartbeat_stop
    double heard_ms;        // zps_heartbeat_heard's last time (0: never)
    uint64_t job_id;        // carried by every beat
    uint32_t rank;
    uint64_t member_id;
    int interval_ms;
};

// When the next beat is due: an interval after the later of the last beat
// and the last time the coordinator heard from this member otherwise.
static double s_next_ms(double beat_ms, double heard_ms, int interval_ms)
{
    return (heard_ms > beat_ms ? heard_ms : beat_ms) + interval_ms;
}

bool zps_heartbeat_due(double now_ms, double beat_ms, double heard_ms, int interval_ms)
{
    return now_ms >= s_next_ms(beat_ms, heard_ms, interval_ms);
}

static struct timespec s_deadline(double ms_from_now)
{
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    long long ns = (long long)(ms_from_now * 1e6);
    until.tv_sec += (time_t)(ns / 1000000000LL);
    until.tv_nsec += (long)(ns % 1000000000LL);
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    return until;
}

// Sleeps until a beat is due (an interval after the last beat or the last
// message the coordinator heard from this member otherwise, whichever is
// later), or less when stopped; whether to stop. The thread sleeps on a
// condition, not in short naps: a process holding thousands of clients
// (bench/swarm) would otherwise wake thousands of times each nap for
// nothing. A message heard while it sleeps moves its next wake, not this
// one: it wakes, finds the beat not due and sleeps on.
static bool s_wait(zps_heartbeat *hb, double beat_ms)
{
    pthread_mutex_lock(&hb->mu);
    double now = zps_clock_ms();
    while (!hb->stop && !zps_heartbeat_due(now, beat_ms, hb->heard_ms, hb->interval_ms)) {
        double next = s_next_ms(beat_ms, hb->heard_ms, hb->interval_ms);
        struct timespec until = s_deadline(next - now);
        (void)pthread_cond_timedwait(&hb->wake, &hb->mu, &until);
        now = zps_clock_ms();
    }
    bool stop = hb->stop;
    pthread_mutex_unlock(&hb->mu);
    return stop;
}

static void *s_run(void *arg)
{
    zps_heartbeat *hb = arg;
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__HEARTBEAT);
    h.job_id = hb->job_id;
    h.rank = hb->rank;
    h.member_id = hb->member_id;
    double beat_ms;
    do {
        // A beat that cannot go out now is not worth queueing: the next one follows.
        (void)zps_wire_send(hb->sock, NULL, &h, NULL, 0, NULL);
        beat_ms = zps_clock_ms();
    } while (!s_wait(hb, beat_ms));
    int zero = 0;
    if (zmq_setsockopt(hb->sock, ZMQ_LINGER, &zero, sizeof zero) != 0) {
        zps_log_warn("heartbeat: ZMQ_LINGER: %s", zmq_strerror(errno)); // a BYE may linger
    }
    (void)zmq_close(hb->sock); // fails only for a handle that is not a socket
    return NULL;
}

zps_heartbeat *zps_heartbeat_start(void *ctx, const char *endpoint, const zps_curve *curve,
                                   uint64_t job_id, uint32_t rank, uint64_t member_id,
                                   int interval_ms)
{
    zps_heartbeat *hb = calloc(1, sizeof *hb);
    if (!hb) {
        return NULL;
    }
    *hb = (zps_heartbeat){.job_id = job_id, .rank = rank, .member_id = member_id,
                          .interval_ms = interval_ms};
    pthread_condattr_t attr;
    bool synced = pthread_condattr_init(&attr) == 0;
    if (synced) {
        synced = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC) == 0 &&
                 pthread_cond_init(&hb->wake, &attr) == 0;
        (void)pthread_condattr_destroy(&attr);
    }
    if (synced) {
        (void)pthread_mutex_init(&hb->mu, NULL); // cannot fail with default attributes
    }
    hb->sock = synced ? zps_wire_socket(ctx, ZMQ_DEALER, interval_ms) : NULL;
    if (!hb->sock || zps_curve_client(curve, hb->sock) != ZPS_OK ||
        zmq_connect(hb->sock, endpoint) != 0 ||
        pthread_create(&hb->thread, NULL, s_run, hb) != 0) {
        zps_log_error("cannot start the heartbeat to %s", endpoint);
        if (hb->sock) {
            (void)zmq_close(hb->sock);
        }
        if (synced) {
            pthread_cond_destroy(&hb->wake);
            pthread_mutex_destroy(&hb->mu);
        }
        free(hb);
        return NULL;
    }
    return hb;
}

int zps_heartbeat_interval(int base_ms, double usual_step_ms, double worker_timeout_ms)
{
    double ms = 2 * usual_step_ms, cap = worker_timeout_ms / 4;
    ms = ms < cap ? ms : cap;
    return ms > base_ms ? (int)ms : base_ms;
}

void zps_heartbeat_set_interval(zps_heartbeat *hb, int interval_ms)
{
    if (!hb) {
        return;
    }
    pthread_mutex_lock(&hb->mu);
    hb->interval_ms = interval_ms;
    pthread_mutex_unlock(&hb->mu);
}

void zps_heartbeat_heard(zps_heartbeat *hb)
{
    if (!hb) {
        return;
    }
    pthread_mutex_lock(&hb->mu);
    hb->heard_ms = zps_clock_ms();
    pthread_mutex_unlock(&hb->mu);
}

void zps_heartbeat_stop(zps_heartbeat **hbp)
{
    zps_heartbeat *hb = *hbp;
    if (!hb) {
        return;
    }
    pthread_mutex_lock(&hb->mu);
    hb->stop = true;
    pthread_cond_signal(&hb->wake);
    pthread_mutex_unlock(&hb->mu);
    pthread_join(hb->thread, NULL);
    pthread_cond_destroy(&hb->wake);
    pthread_mutex_destroy(&hb->mu);
    free(hb);
    *hbp = NULL;
}
