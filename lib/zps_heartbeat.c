/* zps_heartbeat.c - the heartbeat thread. */
#include "zps_heartbeat.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "common/zps_log.h"
#include "common/zps_wire.h"

struct zps_heartbeat {
    pthread_t thread;       // the beating thread
    void *sock;             // owned by the thread: DEALER to the coordinator
    atomic_bool stop;       // set by zps_heartbeat_stop
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
    while (!atomic_load(&hb->stop)) {
        // A beat that cannot go out now is not worth queueing: the next one follows.
        (void)zps_wire_send(hb->sock, NULL, &h, NULL, 0, NULL);
        for (int waited = 0; waited < hb->interval_ms && !atomic_load(&hb->stop); waited += 10) {
            struct timespec ts = {0, 10L * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
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
    hb->sock = zps_wire_socket(ctx, ZMQ_DEALER, interval_ms);
    if (!hb->sock || zps_curve_client(curve, hb->sock) != ZPS_OK ||
        zmq_connect(hb->sock, endpoint) != 0 ||
        pthread_create(&hb->thread, NULL, s_run, hb) != 0) {
        zps_log_error("cannot start the heartbeat to %s", endpoint);
        if (hb->sock) {
            (void)zmq_close(hb->sock);
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
    atomic_store(&hb->stop, true);
    pthread_join(hb->thread, NULL);
    free(hb);
    *hbp = NULL;
}
