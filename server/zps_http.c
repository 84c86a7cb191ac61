/* zps_http.c - the HTTP thread (libmicrohttpd), its documents and probes. */
#include "zps_http.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_clock.h"
#include "common/zps_log.h"

// The loop publishes twice a second; this long without it, it is stuck.
#define ZPS_HTTP_STALE_MS 10000.0

struct zps_http {
    struct MHD_Daemon *daemon;  // owned
    pthread_mutex_t lock;       // guards what follows
    char *metrics;              // owned: Prometheus text, or NULL (shards > 0)
    char *status;               // owned: JSON, or NULL (shards > 0)
    bool ready;                 // what /readyz says
    double published_ms;        // the loop's last publish, for /healthz
};

// /healthz and /readyz: a code and a one-line body.
static unsigned s_probe(const zps_http *h, bool health, const char **body)
{
    if (health) {
        bool alive = h->published_ms > 0 && zps_clock_ms() - h->published_ms < ZPS_HTTP_STALE_MS;
        *body = alive ? "ok\n" : "the server loop has not run for 10 s\n";
        return alive ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE;
    }
    *body = h->ready ? "ready\n" : "not ready: waiting for the coordinator to assign a range\n";
    return h->ready ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE;
}

// The signature is libmicrohttpd's (MHD_AccessHandlerCallback).
static enum MHD_Result s_answer(void *cls, struct MHD_Connection *conn, const char *url,
                                const char *method, const char *version, const char *upload,
                                size_t *upload_len, // NOLINT(readability-non-const-parameter)
                                void **state)
{
    (void)version;
    (void)upload;
    (void)upload_len;
    (void)state;
    zps_http *h = cls;
    const char *type = NULL, *text = NULL;
    unsigned code = MHD_HTTP_OK;
    if (strcmp(method, "GET") != 0) {
        code = MHD_HTTP_METHOD_NOT_ALLOWED;
    }
    pthread_mutex_lock(&h->lock);
    if (code == MHD_HTTP_OK && strcmp(url, "/metrics") == 0 && h->metrics) {
        type = "text/plain; version=0.0.4";
        text = h->metrics;
    } else if (code == MHD_HTTP_OK && strcmp(url, "/status") == 0 && h->status) {
        type = "application/json";
        text = h->status;
    } else if (code == MHD_HTTP_OK &&
               (strcmp(url, "/healthz") == 0 || strcmp(url, "/readyz") == 0)) {
        type = "text/plain";
        code = s_probe(h, url[1] == 'h', &text);
    } else if (code == MHD_HTTP_OK) {
        code = MHD_HTTP_NOT_FOUND;
    }
    const char *body = text ? text
                       : code == MHD_HTTP_OK
                           ? ""
                           : "not found: /healthz, /readyz; on shard 0 /metrics, /status\n";
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), (void *)body,
                                                             MHD_RESPMEM_MUST_COPY);
    pthread_mutex_unlock(&h->lock);
    if (!r) {
        return MHD_NO;
    }
    if (type) {
        MHD_add_response_header(r, "Content-Type", type);
    }
    enum MHD_Result ret = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    return ret;
}

zps_http *zps_http_start(const char *hostport)
{
    char host[64], *end = NULL;
    struct sockaddr_in addr = {.sin_family = AF_INET};
    const char *colon = strrchr(hostport, ':');
    unsigned long port = colon ? strtoul(colon + 1, &end, 10) : 0;
    if (!colon || (size_t)(colon - hostport) >= sizeof host || end == colon + 1 || *end ||
        port > 65535) {
        zps_log_error("--http %s: expected HOST:PORT", hostport);
        return NULL;
    }
    snprintf(host, sizeof host, "%.*s", (int)(colon - hostport), hostport);
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) {
        zps_log_error("--http %s: HOST must be an IPv4 address", hostport);
        return NULL;
    }
    addr.sin_port = htons((uint16_t)port);
    zps_http *h = calloc(1, sizeof *h);
    if (!h) {
        return NULL;
    }
    pthread_mutex_init(&h->lock, NULL);
    h->daemon = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, (uint16_t)port, NULL, NULL,
                                 s_answer, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                                 MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
    if (!h->daemon) {
        zps_log_error("--http %s: cannot listen (port taken?)", hostport);
        pthread_mutex_destroy(&h->lock);
        free(h);
        return NULL;
    }
    zps_log_info("serving HTTP on http://%s", hostport);
    return h;
}

void zps_http_publish(zps_http *h, const char *metrics, const char *status_json, bool ready)
{
    char *m = metrics ? strdup(metrics) : NULL, *s = status_json ? strdup(status_json) : NULL;
    if ((metrics && !m) || (status_json && !s)) {
        free(m);
        free(s);
        return;
    }
    pthread_mutex_lock(&h->lock);
    free(h->metrics);
    free(h->status);
    h->metrics = m;
    h->status = s;
    h->ready = ready;
    h->published_ms = zps_clock_ms();
    pthread_mutex_unlock(&h->lock);
}

void zps_http_stop(zps_http **hp)
{
    zps_http *h = *hp;
    if (!h) {
        return;
    }
    MHD_stop_daemon(h->daemon);
    pthread_mutex_destroy(&h->lock);
    free(h->metrics);
    free(h->status);
    free(h);
    *hp = NULL;
}
