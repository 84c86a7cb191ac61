/* zps_curve.h - CurveZMQ keys and socket options.
 *
 * A key file holds one Z85 key (40 characters) on one line: NAME.key the
 * secret (mode 0600), NAME.pub the public one. Servers (every shard) use
 * their secret as CURVE servers; workers, shards talking to the
 * coordinator, and zps-ctl are CURVE clients that name the server's public
 * key. Who may connect is decided by the server's ZAP handler
 * (server/zps_zap.h). */
#ifndef ZPS_CURVE_H
#define ZPS_CURVE_H

#include <stdbool.h>

#include "zps_err.h"

#define ZPS_CURVE_KEY_LEN 40 // Z85 text of a 32-byte key

typedef struct zps_curve {
    bool on;                                // CURVE in use
    char secret[ZPS_CURVE_KEY_LEN + 1];     // own secret key (Z85)
    char public_[ZPS_CURVE_KEY_LEN + 1];    // own public key, derived from the secret
    char server[ZPS_CURVE_KEY_LEN + 1];     // the server's public key (clients only)
} zps_curve;

// Writes NAME.key (0600) and NAME.pub. Refuses to overwrite. Logged.
zps_err zps_curve_keygen(const char *name);
// Reads one Z85 key from a file into key (ZPS_CURVE_KEY_LEN + 1 bytes).
zps_err zps_curve_read_key(const char *path, char *key);
// Loads the own secret (and derives the public key) and, for a client, the
// server's public key (server_key_path NULL for a server).
zps_err zps_curve_load(zps_curve *c, const char *secret_path, const char *server_key_path);

// Makes sock a CURVE server / client with c's keys (no-op when c->on is false).
zps_err zps_curve_server(const zps_curve *c, void *sock);
zps_err zps_curve_client(const zps_curve *c, void *sock);

// True if an endpoint binds only loopback (tcp://127.x, tcp://localhost,
// tcp://[::1], ipc://, inproc://): plain TCP is the default only there.
bool zps_curve_is_loopback(const char *endpoint);

#endif
