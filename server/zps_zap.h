/* zps_zap.h - who may connect to a CURVE server: a ZAP handler that admits
 * only the public keys in an authorized-keys directory (one NAME.pub each).
 *
 * It runs in its own thread, as ZAP requires (libzmq asks it over
 * inproc://zeromq.zap.01 during each handshake); it shares nothing with the
 * server loop but two flags. Every refusal is logged with the key and the
 * peer's address. */
#ifndef ZPS_ZAP_H
#define ZPS_ZAP_H

#include "common/zps_err.h"

typedef struct zps_zap zps_zap;

// Loads the keys of dir and starts answering on ctx. Caller owns the
// result (zps_zap_stop); NULL on failure, logged.
zps_zap *zps_zap_start(void *ctx, const char *dir);
// Makes the handler read dir again before its next answer (SIGHUP).
void zps_zap_reload(zps_zap *z);
void zps_zap_stop(zps_zap **z);

#endif
