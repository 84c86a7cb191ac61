/* zps_heartbeat.c - the heartbeat thread. */
#include "zps_heartbeat.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#include "common/zps_log.h"
#include "common/zps_wire.h"

struct zps_heartbeat {
    pthread_t thread;       // the beating thread
    void *sock;             // owned by the thread: DEALER to the coordinator
    pthread_mutex_t lock;   // guards stop, with wake
    pthread_cond_t wake;    // signalled by zps_heartbeat_stop (CLOCK_MONOTONIC)
    bool stop;              // set by zps_heartbeat_stop
    uint64_t job_id;        // carried by every beat
    uint32_t rank;
    uint64_t member_id;
    int interval_ms;
};

static void *s_run(void *arg)
{
    zps_heartbeat *hb = arg;
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__HEARTBEAT);
    h.job_id = hb->job_id;
    h.rank = hb->rank;
    h.member_id = hb->member_id;
    pthread_mutex_lock(&hb->lock);
    while (!hb->stop) {
        pthread_mutex_unlock(&hb->lock);
        // A beat that cannot go out now is not worth queueing: the next one follows.
        (void)zps_wire_send(hb->sock, NULL, &h, NULL, 0, NULL);
        // One wake an interval, not a poll of the flag: thousands of members
        // on a host (bench/swarm) would otherwise spend its cores waking.
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += hb->interval_ms / 1000;
        until.tv_nsec += (long)(hb->interval_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_mutex_lock(&hb->lock);
        while (!hb->stop && pthread_cond_timedwait(&hb->wake, &hb->lock, &until) != ETIMEDOUT) {
        }
    }
    pthread_mutex_unlock(&hb->lock);
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
    pthread_condattr_t ca;
    bool sync = pthread_condattr_init(&ca) == 0 &&
                pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 &&
                pthread_cond_init(&hb->wake, &ca) == 0;
    if (sync && pthread_mutex_init(&hb->lock, NULL) != 0) {
        pthread_cond_destroy(&hb->wake);
        sync = false;
    }
    hb->sock = sync ? zps_wire_socket(ctx, ZMQ_DEALER, interval_ms) : NULL;
    if (!hb->sock || zps_curve_client(curve, hb->sock) != ZPS_OK ||
        zmq_connect(hb->sock, endpoint) != 0 ||
        pthread_create(&hb->thread, NULL, s_run, hb) != 0) {
        zps_log_error("cannot start the heartbeat to %s", endpoint);
        if (hb->sock) {
            (void)zmq_close(hb->sock);
        }
        if (sync) {
            pthread_cond_destroy(&hb->wake);
            pthread_mutex_destroy(&hb->lock);
        }
        free(hb);
        return NULL;
    }
    return hb;
}

void zps_heartbeat_stop(zps_heartbeat **hbp)
{
    zps_heartbeat *hb = *hbp;
    if (!hb) {
        return;
    }
    pthread_mutex_lock(&hb->lock);
    hb->stop = true;
    pthread_cond_signal(&hb->wake);
    pthread_mutex_unlock(&hb->lock);
    pthread_join(hb->thread, NULL);
    pthread_cond_destroy(&hb->wake);
    pthread_mutex_destroy(&hb->lock);
    free(hb);
    *hbp = NULL;
}
