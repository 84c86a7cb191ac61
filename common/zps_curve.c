/* zps_curve.c - key files and CURVE socket options. */
#include "zps_curve.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "zps_log.h"

static zps_err s_write_key(const char *path, const char *key, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) {
        zps_log_error("keygen: %s: %s", path, strerror(errno));
        return ZPS_EIO;
    }
    char line[ZPS_CURVE_KEY_LEN + 2];
    snprintf(line, sizeof line, "%s\n", key);
    bool ok = write(fd, line, strlen(line)) == (ssize_t)strlen(line) && fsync(fd) == 0;
    ok = close(fd) == 0 && ok;
    if (!ok) {
        zps_log_error("keygen: writing %s failed", path);
        unlink(path);
        return ZPS_EIO;
    }
    return ZPS_OK;
}

zps_err zps_curve_keygen(const char *name)
{
    char pub[ZPS_CURVE_KEY_LEN + 1], sec[ZPS_CURVE_KEY_LEN + 1];
    if (zmq_curve_keypair(pub, sec) != 0) {
        zps_log_error("keygen: %s (is libzmq built with CURVE?)", zmq_strerror(errno));
        return ZPS_EINVAL;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s.key", name);
    zps_err err = s_write_key(path, sec, 0600);
    if (err != ZPS_OK) {
        return err;
    }
    snprintf(path, sizeof path, "%s.pub", name);
    if ((err = s_write_key(path, pub, 0644)) != ZPS_OK) {
        snprintf(path, sizeof path, "%s.key", name);
        unlink(path);
    }
    return err;
}

zps_err zps_curve_read_key(const char *path, char *key)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        zps_log_error("key %s: %s", path, strerror(errno));
        return ZPS_ENOENT;
    }
    char line[128] = "";
    bool ok = fgets(line, sizeof line, f) != NULL;
    (void)fclose(f); // read only: a failed close loses nothing
    line[strcspn(line, "\r\n")] = '\0';
    uint8_t raw[32];
    if (!ok || strlen(line) != ZPS_CURVE_KEY_LEN || !zmq_z85_decode(raw, line)) {
        zps_log_error("key %s: not one Z85 key of %d characters", path, ZPS_CURVE_KEY_LEN);
        return ZPS_EINVAL;
    }
    memcpy(key, line, ZPS_CURVE_KEY_LEN + 1);
    return ZPS_OK;
}

zps_err zps_curve_load(zps_curve *c, const char *secret_path, const char *server_key_path)
{
    memset(c, 0, sizeof *c);
    zps_err err = zps_curve_read_key(secret_path, c->secret);
    if (err == ZPS_OK && zmq_curve_public(c->public_, c->secret) != 0) {
        zps_log_error("key %s: cannot derive its public key", secret_path);
        err = ZPS_EINVAL;
    }
    if (err == ZPS_OK && server_key_path) {
        err = zps_curve_read_key(server_key_path, c->server);
    }
    c->on = err == ZPS_OK;
    return err;
}

zps_err zps_curve_server(const zps_curve *c, void *sock)
{
    int one = 1;
    if (c->on && (zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof one) ||
                  zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, c->secret, ZPS_CURVE_KEY_LEN))) {
        zps_log_error("curve server options: %s", zmq_strerror(errno));
        return ZPS_EINVAL;
    }
    return ZPS_OK;
}

zps_err zps_curve_client(const zps_curve *c, void *sock)
{
    if (c->on && (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, c->server, ZPS_CURVE_KEY_LEN) ||
                  zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, c->public_, ZPS_CURVE_KEY_LEN) ||
                  zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, c->secret, ZPS_CURVE_KEY_LEN))) {
        zps_log_error("curve client options: %s", zmq_strerror(errno));
        return ZPS_EINVAL;
    }
    return ZPS_OK;
}

bool zps_curve_is_loopback(const char *ep)
{
    return strncmp(ep, "ipc://", 6) == 0 || strncmp(ep, "inproc://", 9) == 0 ||
           strncmp(ep, "tcp://127.", 10) == 0 || strncmp(ep, "tcp://localhost:", 16) == 0 ||
           strncmp(ep, "tcp://[::1]:", 12) == 0;
}
