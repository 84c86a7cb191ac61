/* zps_http.h - /metrics (Prometheus text) and /status (JSON) over HTTP, and
 * the probes supervisors ask: /healthz (200 while the server loop runs) and
 * /readyz (200 once the shard serves its range).
 *
 * libmicrohttpd serves from its own thread. The server loop publishes the
 * two documents every few hundred ms; the HTTP thread only copies the
 * newest ones out under a lock, so a slow scraper never touches job state
 * and the loop never waits for the network. */
#ifndef ZPS_HTTP_H
#define ZPS_HTTP_H

#include <stdbool.h>

typedef struct zps_http zps_http;

// Listens on "HOST:PORT" (IPv4). Caller owns the result; NULL on failure,
// logged.
zps_http *zps_http_start(const char *hostport);
// Replaces the documents served (copied; NULL: not served, 404) and the
// readiness; also tells /healthz the loop is alive.
void zps_http_publish(zps_http *h, const char *metrics, const char *status_json, bool ready);
void zps_http_stop(zps_http **h);

#endif
