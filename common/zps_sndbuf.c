/* zps_sndbuf.c - --sndbuf auto: per connection, by locality and by the
 * queue each connection's round trips show (zps_sndbuf.h). */
#include "zps_sndbuf.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>
#ifdef __linux__
#include <linux/tcp.h> // struct tcp_info with tcpi_min_rtt, TCP_INFO
#endif

#include "zps_clock.h"
#include "zps_log.h"
#include "zps_wire.h"

bool zps_sndbuf_parse(const char *text, void *field)
{
    if (strcmp(text, "auto") == 0) {
        *(int *)field = ZPS_SNDBUF_AUTO;
        return true;
    }
    if (text[0] < '0' || text[0] > '9') {
        return false; // strtoll would take a sign or blanks
    }
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (end == text || *end != '\0' || errno != 0 || v < 0 || v > (1 << 30) ||
        (v != 0 && v < 4096)) {
        return false;
    }
    *(int *)field = (int)v;
    return true;
}

int zps_sndbuf_next(int cur, int os_bytes, const zps_sndbuf_sample *s)
{
    if (s->min_rtt_us == 0 || s->srtt_us == 0 || s->acked < ZPS_SNDBUF_QUEUE_BYTES) {
        return cur; // idle, or the kernel does not say: nothing learnt
    }
    uint64_t srtt = s->srtt_us, min_rtt = s->min_rtt_us;
    bool queue = srtt >= 2 * min_rtt && srtt - min_rtt >= ZPS_SNDBUF_QUEUE_US;
    int64_t next;
    if (queue) {
        int64_t base = cur > 0 ? cur : os_bytes;
        next = (int64_t)((uint64_t)base * min_rtt / srtt) + ZPS_SNDBUF_QUEUE_BYTES;
    } else if (cur > 0 && srtt - (srtt < min_rtt ? srtt : min_rtt) < ZPS_SNDBUF_QUEUE_US / 2) {
        next = 2 * (int64_t)cur; // no queue: the buffer may be what holds the flow back
    } else {
        return cur; // the OS's without a queue, or a queue too short to act on
    }
    if (next < ZPS_SNDBUF_QUEUE_BYTES) {
        next = ZPS_SNDBUF_QUEUE_BYTES;
    }
    if (next > ZPS_SNDBUF_MAX_BYTES) {
        next = ZPS_SNDBUF_MAX_BYTES;
    }
    return (int)next;
}

bool zps_sndbuf_same_host(const struct sockaddr *local, const struct sockaddr *peer)
{
    if (peer->sa_family == AF_INET && local->sa_family == AF_INET) {
        const struct in_addr *p = &((const struct sockaddr_in *)peer)->sin_addr;
        const struct in_addr *l = &((const struct sockaddr_in *)local)->sin_addr;
        return (ntohl(p->s_addr) >> 24) == 127 || p->s_addr == l->s_addr;
    }
    if (peer->sa_family == AF_INET6 && local->sa_family == AF_INET6) {
        const struct in6_addr *p = &((const struct sockaddr_in6 *)peer)->sin6_addr;
        const struct in6_addr *l = &((const struct sockaddr_in6 *)local)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(p) || memcmp(p, l, sizeof *p) == 0) {
            return true;
        }
        return IN6_IS_ADDR_V4MAPPED(p) && p->s6_addr[12] == 127;
    }
    return peer->sa_family != AF_INET && peer->sa_family != AF_INET6;
}

// ---------------------------------------------------------------------------
// The watcher: one thread per socket, fed by the socket's monitor.

typedef struct s_conn {
    int fd;                        // the connection's descriptor, owned by ZeroMQ
    struct sockaddr_storage local; // its ends when it was reported, to tell
    struct sockaddr_storage peer;  // a reused descriptor from it
    socklen_t local_len, peer_len;
    int cur;                       // the buffer auto set (0: still the OS's)
    uint64_t acked;                // tcpi_bytes_acked at the last tick
    char name[64];                 // the peer's address, for the log
} s_conn;

typedef struct s_watch {
    void *pair;     // owned: our end of the monitor
    s_conn *conns;  // owned: the connections to other hosts
    int n, cap;
} s_watch;

static atomic_uint s_watch_count;

// Whether fd is still the connection it was (same two ends).
static bool s_same_conn(const s_conn *c)
{
    struct sockaddr_storage a;
    socklen_t len = sizeof a;
    if (getsockname(c->fd, (struct sockaddr *)&a, &len) != 0 || len != c->local_len ||
        memcmp(&a, &c->local, len) != 0) {
        return false;
    }
    len = sizeof a;
    return getpeername(c->fd, (struct sockaddr *)&a, &len) == 0 && len == c->peer_len &&
           memcmp(&a, &c->peer, len) == 0;
}

static void s_forget(s_watch *w, int fd)
{
    for (int i = 0; i < w->n; i++) {
        if (w->conns[i].fd == fd) {
            w->conns[i] = w->conns[--w->n];
            return;
        }
    }
}

static void s_add(s_watch *w, int fd)
{
    s_conn c = {.fd = fd, .local_len = sizeof c.local, .peer_len = sizeof c.peer};
    if (getsockname(fd, (struct sockaddr *)&c.local, &c.local_len) != 0 ||
        getpeername(fd, (struct sockaddr *)&c.peer, &c.peer_len) != 0 ||
        zps_sndbuf_same_host((struct sockaddr *)&c.local, (struct sockaddr *)&c.peer)) {
        return; // gone already, or on this host: the OS's buffer
    }
    const void *a = c.peer.ss_family == AF_INET
                        ? (const void *)&((struct sockaddr_in *)&c.peer)->sin_addr
                        : (const void *)&((struct sockaddr_in6 *)&c.peer)->sin6_addr;
    if (!inet_ntop(c.peer.ss_family, a, c.name, sizeof c.name)) {
        snprintf(c.name, sizeof c.name, "?");
    }
    s_forget(w, fd); // a descriptor reused before its DISCONNECTED came
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 8;
        s_conn *p = realloc(w->conns, (size_t)cap * sizeof *p);
        if (!p) {
            return; // that connection keeps the OS's buffer
        }
        w->conns = p;
        w->cap = cap;
    }
    w->conns[w->n++] = c;
}

#ifdef __linux__
// Measures one connection and sets its buffer. False when it is gone.
static bool s_tune(s_conn *c)
{
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    memset(&ti, 0, sizeof ti);
    if (!s_same_conn(c) || getsockopt(c->fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) {
        return false;
    }
    if (len < offsetof(struct tcp_info, tcpi_min_rtt) + sizeof ti.tcpi_min_rtt) {
        return true; // a kernel before 4.6: no min_rtt, the OS's buffer stays
    }
    zps_sndbuf_sample s = {.srtt_us = ti.tcpi_rtt, .min_rtt_us = ti.tcpi_min_rtt,
                           .acked = ti.tcpi_bytes_acked - c->acked};
    c->acked = ti.tcpi_bytes_acked;
    int os = 0;
    socklen_t olen = sizeof os;
    if (c->cur == 0 && getsockopt(c->fd, SOL_SOCKET, SO_SNDBUF, &os, &olen) == 0) {
        os /= 2; // Linux reports twice what SO_SNDBUF asks for
    }
    int next = zps_sndbuf_next(c->cur, os, &s);
    if (next == c->cur) {
        return true;
    }
    if (setsockopt(c->fd, SOL_SOCKET, SO_SNDBUF, &next, sizeof next) != 0) {
        return false;
    }
    if (c->cur == 0) {
        zps_log_info("sndbuf auto: to %s a queue of %.1f ms over a %.3f ms path: send buffer "
                     "%d bytes (was the OS's %d)",
                     c->name, (s.srtt_us - s.min_rtt_us) / 1e3, s.min_rtt_us / 1e3, next, os);
    } else {
        zps_log_debug("sndbuf auto: to %s srtt %.3f ms, min %.3f ms: %d -> %d bytes", c->name,
                      s.srtt_us / 1e3, s.min_rtt_us / 1e3, c->cur, next);
    }
    c->cur = next;
    return true;
}
#else
static bool s_tune(s_conn *c)
{
    (void)c;
    return true;
}
#endif

// One monitor event: false when the monitor stopped.
static bool s_event(s_watch *w, zmq_msg_t *m)
{
    bool more = zmq_msg_more(m);
    uint16_t ev = 0;
    uint32_t fd = 0;
    if (zmq_msg_size(m) >= 6) {
        memcpy(&ev, zmq_msg_data(m), 2);
        memcpy(&fd, (const char *)zmq_msg_data(m) + 2, 4);
    }
    while (more) { // the endpoint frame
        zmq_msg_t rest;
        zmq_msg_init(&rest);
        if (zmq_msg_recv(&rest, w->pair, 0) < 0) {
            zmq_msg_close(&rest);
            return errno != ETERM;
        }
        more = zmq_msg_more(&rest);
        zmq_msg_close(&rest);
    }
    switch (ev) {
    case ZMQ_EVENT_CONNECTED:
    case ZMQ_EVENT_ACCEPTED: s_add(w, (int)fd); break;
    case ZMQ_EVENT_DISCONNECTED:
    case ZMQ_EVENT_CLOSED: s_forget(w, (int)fd); break;
    case ZMQ_EVENT_MONITOR_STOPPED: return false;
    default: break;
    }
    return true;
}

static void *s_watch_main(void *arg)
{
    s_watch *w = arg;
    double next_tick = zps_clock_ms() + ZPS_SNDBUF_TICK_MS;
    int timeout = ZPS_SNDBUF_TICK_MS;
    for (;;) {
        // Nothing to tune (every peer on this host, or none yet): wait for
        // the monitor's next event without waking, so the thread costs the
        // workers' cores nothing.
        int want = w->n > 0 ? ZPS_SNDBUF_TICK_MS : -1;
        if (want != timeout &&
            zmq_setsockopt(w->pair, ZMQ_RCVTIMEO, &want, sizeof want) == 0) {
            timeout = want;
        }
        zmq_msg_t m;
        zmq_msg_init(&m);
        int rc = zmq_msg_recv(&m, w->pair, 0);
        if (rc < 0 && errno != EAGAIN && errno != EINTR) {
            zmq_msg_close(&m);
            break; // ETERM: the context ends
        }
        bool go_on = rc < 0 || s_event(w, &m);
        zmq_msg_close(&m);
        if (!go_on) {
            break;
        }
        if (zps_clock_ms() >= next_tick) {
            next_tick = zps_clock_ms() + ZPS_SNDBUF_TICK_MS;
            for (int i = 0; i < w->n;) {
                if (s_tune(&w->conns[i])) {
                    i++;
                } else {
                    w->conns[i] = w->conns[--w->n];
                }
            }
        }
    }
    zmq_close(w->pair);
    free(w->conns);
    free(w);
    return NULL;
}

static zps_err s_watch_start(void *ctx, void *sock)
{
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://zps-sndbuf-%ld-%u", (long)getpid(),
             atomic_fetch_add(&s_watch_count, 1));
    s_watch *w = calloc(1, sizeof *w);
    if (!w || zmq_socket_monitor(sock, ep, ZMQ_EVENT_CONNECTED | ZMQ_EVENT_ACCEPTED |
                                               ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CLOSED |
                                               ZMQ_EVENT_MONITOR_STOPPED) != 0) {
        zps_log_error("sndbuf auto: cannot monitor the socket: %s", zmq_strerror(errno));
        free(w);
        return ZPS_EIO;
    }
    int linger = 0, tick = ZPS_SNDBUF_TICK_MS;
    // Connected here, before the socket connects or binds, so no event is
    // missed; the thread creation is the barrier that hands it over.
    w->pair = zmq_socket(ctx, ZMQ_PAIR);
    pthread_t t;
    pthread_attr_t attr;
    if (!w->pair || zmq_setsockopt(w->pair, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_setsockopt(w->pair, ZMQ_RCVTIMEO, &tick, sizeof tick) != 0 ||
        zmq_connect(w->pair, ep) != 0 || pthread_attr_init(&attr) != 0) {
        zps_log_error("sndbuf auto: cannot watch the socket: %s", zmq_strerror(errno));
        goto fail;
    }
    (void)pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &attr, s_watch_main, w);
    (void)pthread_attr_destroy(&attr);
    if (rc != 0) {
        zps_log_error("sndbuf auto: pthread_create: %s", strerror(rc));
        goto fail;
    }
    return ZPS_OK;
fail:
    (void)zmq_socket_monitor(sock, NULL, 0);
    if (w->pair) {
        zmq_close(w->pair);
    }
    free(w);
    return ZPS_EIO;
}

zps_err zps_sndbuf_apply(void *ctx, void *sock, int bytes)
{
    if (bytes == ZPS_SNDBUF_AUTO) {
#ifdef __linux__
        return s_watch_start(ctx, sock);
#else
        (void)ctx;
        return ZPS_OK;
#endif
    }
    return zps_wire_set_sndbuf(sock, bytes);
}
