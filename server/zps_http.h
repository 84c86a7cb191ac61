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
struct json_t;

// Listens on "HOST:PORT" (IPv4). Caller owns the result; NULL on failure,
// logged.
zps_http *zps_http_start(const char *hostport);
// Replaces the documents served and the readiness (takes metrics,
// status and rows; NULL: not served, 404); also tells /healthz the loop is
// alive. status is /status as it is served without a query; rows, every
// member's row in rank order, make the pages of /status?offset=R&limit=N
// (server/coord/zps_census.h bounds them).
void zps_http_publish(zps_http *h, char *metrics, struct json_t *status, struct json_t *rows,
                      bool ready);
// Whether the documents are worth rendering now: asked for in the last
// minute, or 5 s old (else zps_http_alive keeps the old ones).
bool zps_http_wants_documents(zps_http *h);
// Tells /healthz the loop is alive and sets the readiness, documents kept.
void zps_http_alive(zps_http *h, bool ready);
void zps_http_stop(zps_http **h);

#endif
