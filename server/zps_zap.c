/* zps_zap.c - the ZAP handler thread (ZeroMQ RFC 27) for CURVE. */
#include "zps_zap.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/zps_curve.h"
#include "common/zps_log.h"

#define ZPS_ZAP_MAX_KEYS 1024
#define ZPS_ZAP_POLL_MS 200

struct zps_zap {
    pthread_t thread;                      // the handler
    void *sock;                            // owned by the thread: REP on the ZAP endpoint
    char dir[4096];                        // authorized keys
    atomic_bool stop;                      // set by zps_zap_stop
    atomic_bool reload;                    // set by zps_zap_reload
    uint8_t keys[ZPS_ZAP_MAX_KEYS][32];    // thread's: the admitted public keys
    int n_keys;
};

// Reads every NAME.pub of the directory; keys it cannot read are skipped
// with a line each.
static void s_load(zps_zap *z)
{
    z->n_keys = 0;
    DIR *d = opendir(z->dir);
    if (!d) {
        zps_log_error("authorized keys %s: cannot open the directory", z->dir);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL && z->n_keys < ZPS_ZAP_MAX_KEYS) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 4, ".pub") != 0) {
            continue;
        }
        char path[4400], key[ZPS_CURVE_KEY_LEN + 1];
        snprintf(path, sizeof path, "%s/%s", z->dir, e->d_name);
        if (zps_curve_read_key(path, key) == ZPS_OK) {
            zmq_z85_decode(z->keys[z->n_keys++], key);
        }
    }
    closedir(d);
    zps_log_info("authorized keys %s: %d key(s)", z->dir, z->n_keys);
}

static bool s_admitted(const zps_zap *z, const uint8_t *key)
{
    for (int i = 0; i < z->n_keys; i++) {
        if (memcmp(z->keys[i], key, 32) == 0) {
            return true;
        }
    }
    return false;
}

// Receives the frames of one request (at most max; the rest dropped).
static int s_recv_frames(void *sock, zmq_msg_t *frames, int max)
{
    int n = 0, more = 1;
    while (more) {
        zmq_msg_t part;
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, sock, 0) < 0) {
            zmq_msg_close(&part);
            break;
        }
        more = zmq_msg_more(&part);
        if (n < max) {
            frames[n++] = part;
        } else {
            zmq_msg_close(&part);
        }
    }
    return n;
}

static void s_send_str(void *sock, const void *data, size_t len, bool more)
{
    zmq_send(sock, data, len, more ? ZMQ_SNDMORE : 0);
}

static void s_answer(zps_zap *z)
{
    zmq_msg_t f[8];
    int n = s_recv_frames(z->sock, f, 8);
    // version, request id, domain, address, identity, mechanism, key
    bool curve = n == 7 && zmq_msg_size(&f[5]) == 5 && memcmp(zmq_msg_data(&f[5]), "CURVE", 5) == 0 &&
                 zmq_msg_size(&f[6]) == 32;
    bool ok = curve && s_admitted(z, zmq_msg_data(&f[6]));
    if (!ok) {
        char key[ZPS_CURVE_KEY_LEN + 1] = "?", addr[64] = "?";
        if (curve) {
            zmq_z85_encode(key, zmq_msg_data(&f[6]), 32);
        }
        if (n > 3) {
            snprintf(addr, sizeof addr, "%.*s", (int)zmq_msg_size(&f[3]),
                     (const char *)zmq_msg_data(&f[3]));
        }
        zps_log_warn("refused a connection from %s: %s", addr,
                     curve ? "its CURVE key is not authorized" : "not a CURVE handshake");
        if (curve) {
            zps_log_warn("refused key: %s", key);
        }
    }
    s_send_str(z->sock, "1.0", 3, true);
    s_send_str(z->sock, n > 1 ? zmq_msg_data(&f[1]) : "", n > 1 ? zmq_msg_size(&f[1]) : 0, true);
    s_send_str(z->sock, ok ? "200" : "400", 3, true);
    s_send_str(z->sock, ok ? "OK" : "not authorized", ok ? 2 : 14, true);
    s_send_str(z->sock, "", 0, true);
    s_send_str(z->sock, "", 0, false);
    for (int i = 0; i < n; i++) {
        zmq_msg_close(&f[i]);
    }
}

static void *s_run(void *arg)
{
    zps_zap *z = arg;
    zmq_pollitem_t item = {.socket = z->sock, .events = ZMQ_POLLIN};
    while (!atomic_load(&z->stop)) {
        if (atomic_exchange(&z->reload, false)) {
            s_load(z);
        }
        if (zmq_poll(&item, 1, ZPS_ZAP_POLL_MS) > 0) {
            s_answer(z);
        }
    }
    zmq_close(z->sock);
    return NULL;
}

zps_zap *zps_zap_start(void *ctx, const char *dir)
{
    zps_zap *z = calloc(1, sizeof *z);
    if (!z) {
        return NULL;
    }
    snprintf(z->dir, sizeof z->dir, "%s", dir);
    s_load(z);
    int zero = 0;
    z->sock = zmq_socket(ctx, ZMQ_REP);
    if (!z->sock || zmq_setsockopt(z->sock, ZMQ_LINGER, &zero, sizeof zero) ||
        zmq_bind(z->sock, "inproc://zeromq.zap.01") != 0 ||
        pthread_create(&z->thread, NULL, s_run, z) != 0) {
        zps_log_error("cannot start the ZAP handler: %s", zmq_strerror(errno));
        if (z->sock) {
            zmq_close(z->sock);
        }
        free(z);
        return NULL;
    }
    return z;
}

void zps_zap_reload(zps_zap *z)
{
    if (z) {
        atomic_store(&z->reload, true);
    }
}

void zps_zap_stop(zps_zap **zp)
{
    zps_zap *z = *zp;
    if (!z) {
        return;
    }
    atomic_store(&z->stop, true);
    pthread_join(z->thread, NULL);
    free(z);
    *zp = NULL;
}
