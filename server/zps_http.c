/* zps_http.c - the HTTP thread (libmicrohttpd), its documents and probes. */
#include "zps_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdint.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/zps_clock.h"
#include "common/zps_log.h"
#include "server/coord/zps_census.h"

// The loop publishes twice a second; this long without it, it is stuck.
#define ZPS_HTTP_STALE_MS 10000.0
// Nobody asked for /metrics or /status this long: the documents are
// rendered every ZPS_HTTP_IDLE_RENDER_MS only (a job of thousands of
// members renders them in tens of ms), so the first answer after a quiet
// spell is at most that old.
#define ZPS_HTTP_IDLE_MS 60000.0
#define ZPS_HTTP_IDLE_RENDER_MS 5000.0

struct zps_http {
    struct MHD_Daemon *daemon;  // owned
    pthread_mutex_t lock;       // guards what follows
    char *metrics;              // owned: Prometheus text, or NULL (shards > 0)
    char *status;               // owned: /status as JSON, or NULL (shards > 0)
    json_t *status_doc;         // owned: the same, for pages (its members replaced)
    json_t *rows;               // owned: every member's row, rank order, for pages
    bool ready;                 // what /readyz says
    double published_ms;        // the loop's last publish, for /healthz
    double rendered_ms;         // the last documents' publish
    double asked_ms;            // the last request for /metrics or /status
    bool asked;                 // there was one
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

// A whole number in 0..UINT32_MAX of a query argument; false if it is not one.
static bool s_arg_uint(struct MHD_Connection *conn, const char *name, uint32_t *v, bool *given)
{
    const char *s = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, name);
    if (!s) {
        return true;
    }
    char *end;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-' || x > UINT32_MAX) {
        return false;
    }
    *v = (uint32_t)x;
    *given = true;
    return true;
}

// /status?offset=R&limit=N: the document with members ranks R.. in rank
// order, N of them at most (0 or above ZPS_STATUS_PAGE_MAX: that many), and
// "page" saying which. Call under the lock; caller frees; NULL on failure.
static char *s_status_page(const zps_http *h, uint32_t offset, uint32_t limit)
{
    size_t n = json_array_size(h->rows);
    if (limit == 0 || limit > ZPS_STATUS_PAGE_MAX) {
        limit = ZPS_STATUS_PAGE_MAX;
    }
    size_t first = offset < n ? offset : n;
    size_t count = n - first < limit ? n - first : limit;
    json_t *doc = json_copy(h->status_doc);
    json_t *members = json_array();
    for (size_t i = 0; members && i < count; i++) {
        json_array_append(members, json_array_get(h->rows, first + i));
    }
    char *text = NULL;
    if (doc && members) {
        json_object_set(doc, "members", members);
        json_object_del(doc, "flagged_omitted");
        json_object_set_new(doc, "page", json_pack("{s:I, s:I, s:I}", "offset",
                                                   (json_int_t)first, "limit", (json_int_t)limit,
                                                   "count", (json_int_t)count));
        text = json_dumps(doc, JSON_COMPACT);
    }
    json_decref(members);
    json_decref(doc);
    return text;
}

// The body of GET url: a document, a page of /status, a probe's line.
// *owned: the body is the caller's to free. Call under the lock.
static unsigned s_body(zps_http *h, struct MHD_Connection *conn, const char *url,
                       const char **type, const char **text, char **owned)
{
    uint32_t offset = 0, limit = 0;
    bool paged = false;
    if (strcmp(url, "/metrics") == 0 || strcmp(url, "/status") == 0) {
        h->asked_ms = zps_clock_ms();
        h->asked = true;
    }
    if (strcmp(url, "/metrics") == 0 && h->metrics) {
        *type = "text/plain; version=0.0.4";
        *text = h->metrics;
    } else if (strcmp(url, "/status") == 0 && h->status) {
        if (!s_arg_uint(conn, "offset", &offset, &paged) ||
            !s_arg_uint(conn, "limit", &limit, &paged)) {
            *text = "bad request: /status?offset=RANK&limit=ROWS take whole numbers\n";
            return MHD_HTTP_BAD_REQUEST;
        }
        *type = "application/json";
        *owned = paged && h->rows ? s_status_page(h, offset, limit) : NULL;
        *text = paged && h->rows ? *owned : h->status;
        return *text ? MHD_HTTP_OK : MHD_HTTP_INTERNAL_SERVER_ERROR;
    } else if (strcmp(url, "/healthz") == 0 || strcmp(url, "/readyz") == 0) {
        *type = "text/plain";
        return s_probe(h, url[1] == 'h', text);
    } else {
        return MHD_HTTP_NOT_FOUND;
    }
    return MHD_HTTP_OK;
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
    char *owned = NULL;
    unsigned code = MHD_HTTP_METHOD_NOT_ALLOWED;
    pthread_mutex_lock(&h->lock);
    if (strcmp(method, "GET") == 0) {
        code = s_body(h, conn, url, &type, &text, &owned);
    }
    const char *body = text ? text
                       : code == MHD_HTTP_OK
                           ? ""
                           : "not found: /healthz, /readyz; on shard 0 /metrics, /status\n";
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), (void *)body,
                                                             MHD_RESPMEM_MUST_COPY);
    pthread_mutex_unlock(&h->lock);
    free(owned);
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

void zps_http_publish(zps_http *h, char *metrics, json_t *status, json_t *rows, bool ready)
{
    char *text = status ? json_dumps(status, JSON_COMPACT) : NULL;
    if (status && !text) {
        free(metrics);
        json_decref(status);
        json_decref(rows);
        return;
    }
    pthread_mutex_lock(&h->lock);
    free(h->metrics);
    free(h->status);
    json_decref(h->status_doc);
    json_decref(h->rows);
    h->metrics = metrics;
    h->status = text;
    h->status_doc = status;
    h->rows = rows;
    h->ready = ready;
    h->published_ms = h->rendered_ms = zps_clock_ms();
    pthread_mutex_unlock(&h->lock);
}

bool zps_http_wants_documents(zps_http *h)
{
    pthread_mutex_lock(&h->lock);
    double now = zps_clock_ms();
    bool wants = (h->asked && now - h->asked_ms < ZPS_HTTP_IDLE_MS) || h->rendered_ms == 0 ||
                 now - h->rendered_ms >= ZPS_HTTP_IDLE_RENDER_MS;
    pthread_mutex_unlock(&h->lock);
    return wants;
}

void zps_http_alive(zps_http *h, bool ready)
{
    pthread_mutex_lock(&h->lock);
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
    json_decref(h->status_doc);
    json_decref(h->rows);
    free(h);
    *hp = NULL;
}
