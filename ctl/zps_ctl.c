/* zps_ctl.c - zps-ctl, the operator's tool.
 *
 *   zps-ctl status [ENDPOINT] [--curve-secret FILE --server-key FILE]
 *                               the coordinator's job, step and members
 *   zps-ctl keygen NAME         a CurveZMQ keypair: NAME.key (secret) and NAME.pub
 *
 * It speaks the same wire as workers (a DEALER, one STATUS request) and
 * waits a bounded time for the answer. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_curve.h"
#include "common/zps_log.h"
#include "common/zps_wire.h"

#define ZPS_CTL_DEFAULT_ENDPOINT "tcp://127.0.0.1:5555"
#define ZPS_CTL_TIMEOUT_MS 3000

static void s_usage(FILE *f)
{
    fprintf(f,
            "usage: zps-ctl status [ENDPOINT] [--curve-secret FILE --server-key FILE]\n"
            "                                   (default %s)\n"
            "       zps-ctl keygen NAME         writes NAME.key (secret, 0600) and NAME.pub\n",
            ZPS_CTL_DEFAULT_ENDPOINT);
}

static void s_print_status(const Zps__Header *h)
{
    const Zps__Status *st = h->status;
    printf("job %016llx: %s, model %s (%llu parameters), dataset %s\n",
           (unsigned long long)h->job_id, st->state, st->model, (unsigned long long)st->n_params,
           st->dataset);
    printf("step %llu/%llu (epoch %llu), global batch %u, loss %.4f, last step %.2f ms",
           (unsigned long long)st->step, (unsigned long long)st->total_steps,
           (unsigned long long)st->epoch, st->global_batch, st->last_loss, st->last_step_ms);
    if (st->test_accuracy >= 0) {
        printf(", test accuracy %.4f", st->test_accuracy);
    }
    printf("\nmembers %zu of %u, refused messages %llu, evictions %llu, plan %u, "
           "step time median %.2f ms, p95 %.2f ms\n",
           st->n_members, st->workers_expected, (unsigned long long)st->bad_messages,
           (unsigned long long)st->evictions, st->generation, st->step_ms_median,
           st->step_ms_p95);
    if (st->n_members > 0) {
        printf("%4s  %-20s %-8s %6s %8s %10s %8s %10s %8s  %s\n", "rank", "host", "device",
               "share", "pushes", "compute_ms", "lag_ms", "samples/s", "pid", "state");
    }
    for (size_t i = 0; i < st->n_members; i++) {
        const Zps__Member *m = st->members[i];
        printf("%4u  %-20s %-8s %6u %8llu %10.2f %8.2f %10.0f %8u  %s\n", m->rank, m->host,
               m->device, m->share, (unsigned long long)m->pushes, m->compute_ms, m->lag_ms,
               m->samples_per_s, m->pid,
               !m->live ? "gone" : m->straggler ? "STRAGGLER" : "ok");
    }
}

static int s_status(const char *endpoint, const zps_curve *curve)
{
    int ret = 1;
    void *ctx = zmq_ctx_new();
    void *sock = ctx ? zps_wire_socket(ctx, ZMQ_DEALER, ZPS_CTL_TIMEOUT_MS) : NULL;
    if (!sock || zps_curve_client(curve, sock) != ZPS_OK || zmq_connect(sock, endpoint) != 0) {
        fprintf(stderr, "zps-ctl: cannot connect to %s: %s\n", endpoint, zmq_strerror(errno));
        goto out;
    }
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__STATUS);
    zps_wire_msg m;
    if (zps_wire_send(sock, NULL, &h, NULL, 0, NULL) != ZPS_OK) {
        fprintf(stderr, "zps-ctl: cannot send to %s\n", endpoint);
        goto out;
    }
    zps_err err = zps_wire_recv(sock, false, &m);
    if (err == ZPS_ETIMEDOUT) {
        fprintf(stderr, "zps-ctl: no answer from %s within %d ms (is zps-server running?)\n",
                endpoint, ZPS_CTL_TIMEOUT_MS);
    } else if (err != ZPS_OK || m.hdr->type != ZPS__MSG_TYPE__STATUS_REPLY || !m.hdr->status) {
        fprintf(stderr, "zps-ctl: %s did not answer with a status (%s)\n", endpoint,
                err == ZPS_OK && m.hdr->error[0] ? m.hdr->error : zps_strerror(err));
    } else {
        s_print_status(m.hdr);
        ret = 0;
    }
    zps_wire_msg_fini(&m);
out:
    if (sock) {
        int zero = 0;
        zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
        zmq_close(sock);
    }
    if (ctx) {
        zmq_ctx_term(ctx);
    }
    return ret;
}

int main(int argc, char **argv)
{
    zps_log_set_name("zps-ctl");
    zps_log_set_level(ZPS_LOG_WARN);
    if (argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        s_usage(stdout);
        return 0;
    }
    if (argc == 3 && strcmp(argv[1], "keygen") == 0) {
        if (zps_curve_keygen(argv[2]) != ZPS_OK) {
            return 1;
        }
        printf("wrote %s.key (secret) and %s.pub\n", argv[2], argv[2]);
        return 0;
    }
    if (argc < 2 || strcmp(argv[1], "status") != 0) {
        s_usage(stderr);
        return 2;
    }
    const char *endpoint = ZPS_CTL_DEFAULT_ENDPOINT, *secret = NULL, *server = NULL;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--curve-secret") == 0 && i + 1 < argc) {
            secret = argv[++i];
        } else if (strcmp(argv[i], "--server-key") == 0 && i + 1 < argc) {
            server = argv[++i];
        } else if (argv[i][0] != '-') {
            endpoint = argv[i];
        } else {
            s_usage(stderr);
            return 2;
        }
    }
    zps_curve curve = {0};
    if ((secret || server) && (!secret || !server || zps_curve_load(&curve, secret, server))) {
        fprintf(stderr, "zps-ctl: --curve-secret and --server-key go together\n");
        return 2;
    }
    return s_status(endpoint, &curve);
}
