/* zps_zap.h - who may connect to a CURVE server, and as what: a ZAP
 * handler that admits only the public keys of three allowlists (a
 * directory of NAME.pub files each) and tells the server each
 * connection's roles.
 *
 *   workers    --authorized-keys DIR  may join, push, pull, report
 *   shards     --shard-keys DIR       may register and report steps; the
 *                                     server's own key is one too (shards
 *                                     that share the coordinator's key pair)
 *   operators  --operator-keys DIR    may ask for STATUS (zps-ctl status, top)
 *
 * A key in several lists holds every role it is listed for. The roles go
 * back to libzmq as the connection's User-Id ("worker", "shard,operator"),
 * which every message received on it carries as metadata: the message
 * table (server/zps_msgtab.h) reads them from there.
 *
 * It runs in its own thread, as ZAP requires (libzmq asks it over
 * inproc://zeromq.zap.01 during each handshake); it shares nothing with the
 * server loop but two flags. Every refusal is logged with the key and the
 * peer's address. */
#ifndef ZPS_ZAP_H
#define ZPS_ZAP_H

#include "common/zps_err.h"

typedef struct zps_zap zps_zap;

// The allowlists; NULL for a list not given.
typedef struct zps_zap_keys {
    const char *workers;    // borrowed: directory of worker keys
    const char *shards;     // borrowed: directory of shard keys
    const char *operators;  // borrowed: directory of operator keys
    const char *own_public; // borrowed: the server's own public key (Z85), a shard key
} zps_zap_keys;

// Loads the lists and starts answering on ctx. The strings are copied.
// Caller owns the result (zps_zap_stop); NULL on failure, logged.
zps_zap *zps_zap_start(void *ctx, const zps_zap_keys *keys);
// Makes the handler read every list again before its next answer (SIGHUP).
void zps_zap_reload(zps_zap *z);
void zps_zap_stop(zps_zap **z);

#endif
