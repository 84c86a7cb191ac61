/* zps_zap.c - the ZAP handler thread (ZeroMQ RFC 27) for CURVE: three
 * allowlists, and the roles of each admitted key as its User-Id. */
#include "zps_zap.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/zps_curve.h"
#include "common/zps_log.h"
#include "server/zps_msgtab.h"

#define ZPS_ZAP_MAX_KEYS 1024
#define ZPS_ZAP_POLL_MS 200
#define ZPS_ZAP_DIR_LEN 4096

// An admitted key and what it may act as.
typedef struct s_key {
    uint8_t key[32]; // the public key
    uint8_t roles;   // zps_role bits
} s_key;

struct zps_zap {
    pthread_t thread;                      // the handler
    void *sock;                            // owned by the thread: REP on the ZAP endpoint
    char dirs[3][ZPS_ZAP_DIR_LEN];         // worker, shard, operator lists ("" if none)
    char own[ZPS_CURVE_KEY_LEN + 1];       // the server's own public key ("" if none)
    atomic_bool stop;                      // set by zps_zap_stop
    atomic_bool reload;                    // set by zps_zap_reload
    s_key keys[ZPS_ZAP_MAX_KEYS];          // thread's: the admitted keys
    int n_keys;
};

static const uint8_t s_list_role[3] = {ZPS_ROLE_WORKER, ZPS_ROLE_SHARD, ZPS_ROLE_OPERATOR};
static const char *const s_list_name[3] = {"worker", "shard", "operator"};

// Admits key with role, or adds the role to a key admitted already.
static void s_add(zps_zap *z, const uint8_t *key, uint8_t role)
{
    for (int i = 0; i < z->n_keys; i++) {
        if (memcmp(z->keys[i].key, key, 32) == 0) {
            z->keys[i].roles |= role;
            return;
        }
    }
    if (z->n_keys == ZPS_ZAP_MAX_KEYS) {
        zps_log_error("more than %d CURVE keys: the rest are not admitted", ZPS_ZAP_MAX_KEYS);
        return;
    }
    memcpy(z->keys[z->n_keys].key, key, 32);
    z->keys[z->n_keys++].roles = role;
}

// Reads every NAME.pub of one list's directory; keys it cannot read are
// skipped with a line each. Returns how many it admitted.
static int s_load_dir(zps_zap *z, const char *dir, uint8_t role)
{
    DIR *d = opendir(dir);
    if (!d) {
        zps_log_error("CURVE keys %s: cannot open the directory: %s", dir, strerror(errno));
        return 0;
    }
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 4, ".pub") != 0) {
            continue;
        }
        char path[ZPS_ZAP_DIR_LEN + 300], key[ZPS_CURVE_KEY_LEN + 1];
        uint8_t bin[32];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (zps_curve_read_key(path, key) == ZPS_OK && zmq_z85_decode(bin, key) != NULL) {
            s_add(z, bin, role);
            n++;
        }
    }
    if (closedir(d) != 0) {
        zps_log_warn("CURVE keys %s: closedir: %s", dir, strerror(errno));
    }
    return n;
}

static void s_load(zps_zap *z)
{
    z->n_keys = 0;
    char summary[256] = "";
    for (int l = 0; l < 3; l++) {
        if (!z->dirs[l][0]) {
            continue;
        }
        int n = s_load_dir(z, z->dirs[l], s_list_role[l]);
        size_t used = strlen(summary);
        snprintf(summary + used, sizeof summary - used, "%s%d %s key(s) from %s",
                 used ? ", " : "", n, s_list_name[l], z->dirs[l]);
    }
    uint8_t own[32];
    if (z->own[0] && zmq_z85_decode(own, z->own) != NULL) {
        s_add(z, own, ZPS_ROLE_SHARD);
    }
    zps_log_info("CURVE allowlists: %s%s", summary[0] ? summary : "none",
                 z->own[0] ? "; and this server's own key, as a shard's" : "");
}

static uint8_t s_roles_of(const zps_zap *z, const uint8_t *key)
{
    for (int i = 0; i < z->n_keys; i++) {
        if (memcmp(z->keys[i].key, key, 32) == 0) {
            return z->keys[i].roles;
        }
    }
    return 0;
}

// The User-Id of a connection: its roles, comma-separated.
static void s_user_id(uint8_t roles, char *out, size_t len)
{
    out[0] = '\0';
    for (int l = 0; l < 3; l++) {
        if (roles & s_list_role[l]) {
            size_t used = strlen(out);
            snprintf(out + used, len - used, "%s%s", used ? "," : "", s_list_name[l]);
        }
    }
}

// Receives the frames of one request (at most max; the rest dropped).
static int s_recv_frames(void *sock, zmq_msg_t *frames, int max)
{
    int n = 0, more = 1;
    while (more) {
        zmq_msg_t part;
        ZPS_ASSERT(zmq_msg_init(&part) == 0);
        if (zmq_msg_recv(&part, sock, 0) < 0) {
            ZPS_ASSERT(zmq_msg_close(&part) == 0);
            break;
        }
        more = zmq_msg_more(&part);
        if (n < max) {
            frames[n++] = part;
        } else {
            ZPS_ASSERT(zmq_msg_close(&part) == 0);
        }
    }
    return n;
}

// The reply's frames; false (logged) if libzmq did not take one, which
// leaves that handshake to time out: nothing is admitted by a lost answer.
static bool s_send_str(void *sock, const void *data, size_t len, bool more)
{
    if (zmq_send(sock, data, len, more ? ZMQ_SNDMORE : 0) < 0) {
        zps_log_warn("ZAP reply: %s", zmq_strerror(errno));
        return false;
    }
    return true;
}

static void s_answer(zps_zap *z)
{
    zmq_msg_t f[8];
    int n = s_recv_frames(z->sock, f, 8);
    // version, request id, domain, address, identity, mechanism, key
    bool curve = n == 7 && zmq_msg_size(&f[5]) == 5 && memcmp(zmq_msg_data(&f[5]), "CURVE", 5) == 0 &&
                 zmq_msg_size(&f[6]) == 32;
    uint8_t roles = curve ? s_roles_of(z, zmq_msg_data(&f[6])) : 0;
    bool ok = roles != 0;
    if (!ok) {
        char key[ZPS_CURVE_KEY_LEN + 1] = "?", addr[64] = "?";
        if (curve && !zmq_z85_encode(key, zmq_msg_data(&f[6]), 32)) {
            snprintf(key, sizeof key, "?");
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
    char user_id[64];
    s_user_id(roles, user_id, sizeof user_id);
    // A REP socket must answer every request, or it takes no other.
    bool sent = s_send_str(z->sock, "1.0", 3, true) &&
                s_send_str(z->sock, n > 1 ? zmq_msg_data(&f[1]) : "",
                           n > 1 ? zmq_msg_size(&f[1]) : 0, true) &&
                s_send_str(z->sock, ok ? "200" : "400", 3, true) &&
                s_send_str(z->sock, ok ? "OK" : "not authorized", ok ? 2 : 14, true) &&
                s_send_str(z->sock, user_id, strlen(user_id), true) &&
                s_send_str(z->sock, "", 0, false);
    (void)sent; // logged by s_send_str
    for (int i = 0; i < n; i++) {
        ZPS_ASSERT(zmq_msg_close(&f[i]) == 0);
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
        int rc = zmq_poll(&item, 1, ZPS_ZAP_POLL_MS);
        if (rc > 0) {
            s_answer(z);
        } else if (rc < 0 && errno == ETERM) {
            break;
        }
    }
    if (zmq_close(z->sock) != 0) {
        zps_log_warn("ZAP: zmq_close: %s", zmq_strerror(errno));
    }
    return NULL;
}

zps_zap *zps_zap_start(void *ctx, const zps_zap_keys *keys)
{
    zps_zap *z = calloc(1, sizeof *z);
    if (!z) {
        return NULL;
    }
    const char *dirs[3] = {keys->workers, keys->shards, keys->operators};
    for (int l = 0; l < 3; l++) {
        snprintf(z->dirs[l], sizeof z->dirs[l], "%s", dirs[l] ? dirs[l] : "");
    }
    snprintf(z->own, sizeof z->own, "%s", keys->own_public ? keys->own_public : "");
    s_load(z);
    int zero = 0;
    z->sock = zmq_socket(ctx, ZMQ_REP);
    if (!z->sock || zmq_setsockopt(z->sock, ZMQ_LINGER, &zero, sizeof zero) ||
        zmq_bind(z->sock, "inproc://zeromq.zap.01") != 0 ||
        pthread_create(&z->thread, NULL, s_run, z) != 0) {
        zps_log_error("cannot start the ZAP handler: %s", zmq_strerror(errno));
        if (z->sock && zmq_close(z->sock) != 0) {
            zps_log_warn("ZAP: zmq_close: %s", zmq_strerror(errno));
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
    if (pthread_join(z->thread, NULL) != 0) {
        zps_log_warn("ZAP: the handler thread could not be joined");
    }
    free(z);
    *zp = NULL;
}
