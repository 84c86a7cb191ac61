/* bare_ps.c - the simplest honest parameter server over ZeroMQ, the peer
 * bench/all.sh holds zps against.
 *
 * W client processes (DEALER, like zps-worker) each hold P fp32 parameters
 * and a gradient of P floats; S shard processes (ROUTER, like zps-server)
 * each own a contiguous slice [k*P/S, (k+1)*P/S) of the parameters. A step:
 * every client pushes its gradient to the shards in chunks of --chunk-bytes
 * (1 MiB by default), one message per chunk, its payload sent zero-copy; a
 * shard sums each chunk into an fp32 accumulator as it arrives (the first
 * push is copied in), and with the W-th push it averages, applies plain SGD
 * (p -= lr * sum / W) in the same pass and replies the chunk's new
 * parameters to every client, zero-copy from the parameter buffer. A client
 * copies each reply into its parameters, and its next step starts when all
 * of them are in.
 *
 * Nothing else: no validation (a peer is trusted), no momentum, no double
 * accumulator, no membership, no timing frames. What zps does beyond this
 * is what the comparison prices.
 *
 * Reusing the buffers without waiting for ZeroMQ to release them is safe
 * by the protocol: a client's gradient is never written, and a shard
 * rewrites a chunk's parameters only with the W-th push of the next step,
 * which each client sends after it has received this step's reply.
 *
 * Shards 1..S-1 and the clients are forked before any ZeroMQ context
 * exists; endpoints travel over pipes, so tcp://HOST:* works. Shard 0 runs
 * in the parent and times a step as zps's coordinator and zmq_ceiling do:
 * the gap between the arrivals of two steps' last pushes.
 *
 *   bare_ps --workers 2 --shards 2 --floats 16M --steps 20 --warmup 3
 *
 * prints one line:
 *   bare_ps transport=tcp workers=2 shards=2 floats=16777216 chunk_floats=262144
 *   steps=20 warmup=3 step_ms=... step_ms_min=... step_ms_max=...
 *
 * Every wait is bounded by --timeout-ms; a failure kills and reaps every
 * child and exits 1. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#define B_MAX_WORKERS 256
#define B_MAX_SHARDS 16
#define B_EP_LEN 256      // fixed-size endpoint records on the pipes
#define B_ROUTE_MAX 256   // ZeroMQ routing ids are at most 255 bytes
#define B_SLICE_MS 100    // how often the parent looks at its children

typedef struct b_cfg {
    const char *endpoint;
    int workers;
    int shards;
    uint64_t floats;
    uint64_t chunk;   // floats per message
    float lr;
    int steps;        // timed steps
    int warmup;       // untimed steps before them
    int timeout_ms;
} b_cfg;

// The header frame ahead of each chunk's payload.
typedef struct b_hdr {
    uint32_t client;
    uint32_t chunk;   // index in the shard's slice
} b_hdr;

typedef struct b_child {
    pid_t pid;
    bool reaped;
} b_child;

static b_child b_children[B_MAX_WORKERS + B_MAX_SHARDS];
static int b_n_children;

static double b_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static uint64_t b_lo(const b_cfg *c, int k)
{
    return c->floats * (uint64_t)k / (uint64_t)c->shards;
}

static int b_n_chunks(const b_cfg *c, int k)
{
    uint64_t n = b_lo(c, k + 1) - b_lo(c, k);
    return (int)((n + c->chunk - 1) / c->chunk);
}

// Chunk j of shard k: its first element (in the whole vector) and count.
static void b_chunk(const b_cfg *c, int k, int j, uint64_t *lo, uint64_t *count)
{
    uint64_t a = b_lo(c, k) + (uint64_t)j * c->chunk, end = b_lo(c, k + 1);
    *lo = a;
    *count = end - a < c->chunk ? end - a : c->chunk;
}

// ---------------------------------------------------------------------------
// Children: none may outlive a run.

static void b_kill_children(void)
{
    for (int i = 0; i < b_n_children; i++) {
        if (!b_children[i].reaped) {
            kill(b_children[i].pid, SIGKILL);
            waitpid(b_children[i].pid, NULL, 0);
            b_children[i].reaped = true;
        }
    }
}

// Reaps exited children; false if one of them failed.
static bool b_check_children(void)
{
    bool ok = true;
    for (int i = 0; i < b_n_children; i++) {
        int st = 0;
        b_child *ch = &b_children[i];
        if (ch->reaped || waitpid(ch->pid, &st, WNOHANG) != ch->pid) {
            continue;
        }
        ch->reaped = true;
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "bare_ps: child %d (pid %d) failed (status %d)\n", i, (int)ch->pid, st);
            ok = false;
        }
    }
    return ok;
}

static bool b_reap_children(int timeout_ms)
{
    double deadline = b_now_ms() + timeout_ms;
    for (;;) {
        if (!b_check_children()) {
            return false;
        }
        int left = 0;
        for (int i = 0; i < b_n_children; i++) {
            left += !b_children[i].reaped;
        }
        if (left == 0) {
            return true;
        }
        if (b_now_ms() > deadline) {
            fprintf(stderr, "bare_ps: %d child(ren) still running after %d ms\n", left, timeout_ms);
            return false;
        }
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
}

// SIGTERM/SIGINT (a script's timeout): take the children along.
// kill, waitpid and _exit are async-signal-safe.
static void b_on_signal(int sig)
{
    for (int i = 0; i < b_n_children; i++) {
        if (!b_children[i].reaped) {
            kill(b_children[i].pid, SIGKILL);
            waitpid(b_children[i].pid, NULL, 0);
        }
    }
    _exit(128 + sig);
}

static bool b_read_full(int fd, void *buf, size_t len, int timeout_ms)
{
    double deadline = b_now_ms() + timeout_ms;
    uint8_t *p = buf;
    while (len > 0) {
        int left = (int)(deadline - b_now_ms());
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int rc = left > 0 ? poll(&pfd, 1, left) : 0;
        if (rc < 0 && errno == EINTR) {
            continue;
        }
        if (rc <= 0) {
            return false;
        }
        ssize_t n = read(fd, p, len);
        if (n <= 0) {
            if (n < 0 && errno == EINTR) {
                continue;
            }
            return false;
        }
        p += n;
        len -= (size_t)n;
    }
    return true;
}

static bool b_write_full(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n <= 0) {
            if (n < 0 && errno == EINTR) {
                continue;
            }
            return false;
        }
        p += n;
        len -= (size_t)n;
    }
    return true;
}

// ---------------------------------------------------------------------------
// Sockets.

static void *b_socket(void *ctx, int type, const b_cfg *c)
{
    void *s = zmq_socket(ctx, type);
    int linger = 2000, hwm = 0;
    if (!s || zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger) ||
        zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm) ||
        zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm) ||
        zmq_setsockopt(s, ZMQ_RCVTIMEO, &c->timeout_ms, sizeof c->timeout_ms) ||
        zmq_setsockopt(s, ZMQ_SNDTIMEO, &c->timeout_ms, sizeof c->timeout_ms)) {
        fprintf(stderr, "bare_ps: socket: %s\n", zmq_strerror(errno));
        if (s) {
            zmq_close(s);
        }
        return NULL;
    }
    return s;
}

// Sends [route,] header, payload; the payload zero-copy, never freed by ZeroMQ.
static bool b_send(void *sock, const uint8_t *route, size_t route_len, b_hdr h, const float *data,
                   uint64_t count)
{
    zmq_msg_t m;
    if (route && zmq_send(sock, route, route_len, ZMQ_SNDMORE) < 0) {
        return false;
    }
    if (zmq_send(sock, &h, sizeof h, ZMQ_SNDMORE) < 0) {
        return false;
    }
    // ZeroMQ takes a void *; it only reads a constant message (no free function).
    if (zmq_msg_init_data(&m, (void *)data, count * sizeof *data, NULL, NULL) != 0) {
        return false;
    }
    if (zmq_msg_send(&m, sock, 0) < 0) {
        zmq_msg_close(&m);
        return false;
    }
    return true;
}

// Waits for the next message, in slices if the children are to be watched.
static bool b_wait(void *sock, int timeout_ms, bool watch, const char *who)
{
    double deadline = b_now_ms() + timeout_ms;
    zmq_pollitem_t item = {.socket = sock, .events = ZMQ_POLLIN};
    for (;;) {
        int left = (int)(deadline - b_now_ms());
        if (left <= 0) {
            fprintf(stderr, "bare_ps: %s: nothing arrived for %d ms\n", who, timeout_ms);
            return false;
        }
        int rc = zmq_poll(&item, 1, watch && left > B_SLICE_MS ? B_SLICE_MS : left);
        if (rc > 0) {
            return true;
        }
        if (rc < 0 && errno != EINTR) {
            fprintf(stderr, "bare_ps: %s: poll: %s\n", who, zmq_strerror(errno));
            return false;
        }
        if (watch && !b_check_children()) {
            return false;
        }
    }
}

// ---------------------------------------------------------------------------
// Shard k: sums, averages, updates, replies. done_ms (shard 0 only) gets the
// time of each round's last push.

typedef struct b_shard {
    float *param;
    float *acc;
    int *pushed;                               // pushes of each chunk this round
    uint8_t route[B_MAX_WORKERS][B_ROUTE_MAX]; // each client's routing id
    size_t route_len[B_MAX_WORKERS];
} b_shard;

// One push of chunk j, its gradient g of count floats. The first is copied
// in, the middle ones added, the last one added, averaged and applied in
// one pass; true when this was the last.
static bool b_accumulate(b_shard *s, const b_cfg *c, uint64_t off, uint64_t count, int j,
                         const float *g)
{
    float *acc = s->acc + off, *p = s->param + off;
    int n = ++s->pushed[j];
    if (n < c->workers) {
        if (n == 1) {
            memcpy(acc, g, count * sizeof *g);
        } else {
            for (uint64_t i = 0; i < count; i++) {
                acc[i] += g[i];
            }
        }
        return false;
    }
    float scale = c->lr / (float)c->workers;
    if (n == 1) {
        for (uint64_t i = 0; i < count; i++) {
            p[i] -= scale * g[i];
        }
    } else {
        for (uint64_t i = 0; i < count; i++) {
            p[i] -= scale * (acc[i] + g[i]);
        }
    }
    s->pushed[j] = 0;
    return true;
}

// Receives one push (route, header, payload) and handles it; *round_done
// when it completed the round.
static bool b_shard_recv(void *sock, b_shard *s, const b_cfg *c, int k, int *left,
                         const char *who)
{
    uint8_t route[B_ROUTE_MAX];
    b_hdr h;
    int rn = zmq_recv(sock, route, sizeof route, ZMQ_DONTWAIT);
    int hn = rn > 0 ? zmq_recv(sock, &h, sizeof h, ZMQ_DONTWAIT) : -1;
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (hn != (int)sizeof h || zmq_msg_recv(&m, sock, ZMQ_DONTWAIT) < 0 ||
        h.client >= (uint32_t)c->workers || h.chunk >= (uint32_t)b_n_chunks(c, k)) {
        fprintf(stderr, "bare_ps: %s: a push did not arrive whole\n", who);
        zmq_msg_close(&m);
        return false;
    }
    if (s->route_len[h.client] == 0) {
        memcpy(s->route[h.client], route, (size_t)rn);
        s->route_len[h.client] = (size_t)rn;
    }
    uint64_t lo = 0, count = 0;
    b_chunk(c, k, (int)h.chunk, &lo, &count);
    uint64_t off = lo - b_lo(c, k);
    bool last = b_accumulate(s, c, off, count, (int)h.chunk, zmq_msg_data(&m));
    zmq_msg_close(&m);
    if (!last) {
        return true;
    }
    (*left)--;
    for (int w = 0; w < c->workers; w++) {
        b_hdr r = {.client = (uint32_t)w, .chunk = h.chunk};
        if (!b_send(sock, s->route[w], s->route_len[w], r, s->param + off, count)) {
            fprintf(stderr, "bare_ps: %s: reply: %s\n", who, zmq_strerror(errno));
            return false;
        }
    }
    return true;
}

// Shard k's buffers; NULL when out of memory. Freed by b_shard_free only
// after zmq_ctx_term: ZeroMQ may still be sending replies out of param.
static b_shard *b_shard_new(const b_cfg *c, int k)
{
    size_t n = (size_t)(b_lo(c, k + 1) - b_lo(c, k));
    b_shard *s = calloc(1, sizeof *s);
    if (!s) {
        return NULL;
    }
    s->param = malloc(n * sizeof *s->param);
    s->acc = malloc(n * sizeof *s->acc);
    s->pushed = calloc((size_t)b_n_chunks(c, k), sizeof *s->pushed);
    if (!s->param || !s->acc || !s->pushed) {
        free(s->pushed);
        free(s->acc);
        free(s->param);
        free(s);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) { // faults the pages in before timing
        s->param[i] = 0.01F;
        s->acc[i] = 0.0F;
    }
    return s;
}

static void b_shard_free(b_shard *s)
{
    if (s) {
        free(s->pushed);
        free(s->acc);
        free(s->param);
        free(s);
    }
}

static bool b_serve(void *sock, b_shard *s, const b_cfg *c, int k, double *done_ms)
{
    char who[32];
    snprintf(who, sizeof who, "shard %d", k);
    bool ok = true;
    int rounds = c->warmup + c->steps + 1;
    for (int r = 0; r < rounds && ok; r++) {
        int left = b_n_chunks(c, k);
        while (left > 0 && ok) {
            ok = b_wait(sock, c->timeout_ms, done_ms != NULL, who) &&
                 b_shard_recv(sock, s, c, k, &left, who);
        }
        if (done_ms) {
            done_ms[r] = b_now_ms();
        }
    }
    return ok;
}

static int b_shard_main(const b_cfg *c, int k, int ep_fd)
{
    char ep[B_EP_LEN] = {0};
    size_t len = sizeof ep;
    void *ctx = zmq_ctx_new();
    void *sock = ctx ? b_socket(ctx, ZMQ_ROUTER, c) : NULL;
    bool ok = sock && zmq_bind(sock, c->endpoint) == 0 &&
              zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, ep, &len) == 0 &&
              b_write_full(ep_fd, ep, sizeof ep);
    if (!ok) {
        fprintf(stderr, "bare_ps: shard %d: cannot bind %s: %s\n", k, c->endpoint,
                zmq_strerror(errno));
    }
    close(ep_fd);
    b_shard *s = ok ? b_shard_new(c, k) : NULL;
    if (ok && !s) {
        fprintf(stderr, "bare_ps: shard %d: out of memory\n", k);
    }
    ok = s && b_serve(sock, s, c, k, NULL);
    if (sock) {
        zmq_close(sock);
    }
    if (ctx) {
        zmq_ctx_term(ctx);
    }
    b_shard_free(s);
    return ok ? 0 : 1;
}

// ---------------------------------------------------------------------------
// Client: pushes every chunk, last first, then takes every reply.

static bool b_client_step(void **socks, const b_cfg *c, int id, const float *grad, float *param,
                          const char *who)
{
    int most = 0, left = 0;
    for (int k = 0; k < c->shards; k++) {
        int nc = b_n_chunks(c, k);
        most = nc > most ? nc : most;
        left += nc;
    }
    for (int j = most - 1; j >= 0; j--) {
        for (int k = 0; k < c->shards; k++) {
            uint64_t lo = 0, count = 0;
            if (j >= b_n_chunks(c, k)) {
                continue;
            }
            b_chunk(c, k, j, &lo, &count);
            b_hdr h = {.client = (uint32_t)id, .chunk = (uint32_t)j};
            if (!b_send(socks[k], NULL, 0, h, grad + lo, count)) {
                fprintf(stderr, "bare_ps: %s: push: %s\n", who, zmq_strerror(errno));
                return false;
            }
        }
    }
    zmq_pollitem_t items[B_MAX_SHARDS];
    for (int k = 0; k < c->shards; k++) {
        items[k] = (zmq_pollitem_t){.socket = socks[k], .events = ZMQ_POLLIN};
    }
    while (left > 0) {
        int rc = zmq_poll(items, c->shards, c->timeout_ms);
        if (rc < 0 && errno == EINTR) {
            continue;
        }
        if (rc <= 0) {
            fprintf(stderr, "bare_ps: %s: replies incomplete after %d ms\n", who, c->timeout_ms);
            return false;
        }
        for (int k = 0; k < c->shards; k++) {
            if (!(items[k].revents & ZMQ_POLLIN)) {
                continue;
            }
            b_hdr h;
            zmq_msg_t m;
            uint64_t lo = 0, count = 0;
            zmq_msg_init(&m);
            if (zmq_recv(socks[k], &h, sizeof h, 0) != (int)sizeof h ||
                zmq_msg_recv(&m, socks[k], 0) < 0 || h.chunk >= (uint32_t)b_n_chunks(c, k)) {
                fprintf(stderr, "bare_ps: %s: a reply did not arrive whole\n", who);
                zmq_msg_close(&m);
                return false;
            }
            b_chunk(c, k, (int)h.chunk, &lo, &count);
            memcpy(param + lo, zmq_msg_data(&m), count * sizeof *param);
            zmq_msg_close(&m);
            left--;
        }
    }
    return true;
}

static int b_client_main(const b_cfg *c, int id, int ep_fd)
{
    char who[32];
    char eps[B_MAX_SHARDS][B_EP_LEN];
    snprintf(who, sizeof who, "client %d", id);
    bool got = b_read_full(ep_fd, eps, (size_t)c->shards * B_EP_LEN, c->timeout_ms);
    close(ep_fd);
    if (!got) {
        fprintf(stderr, "bare_ps: %s: no endpoints from the parent\n", who);
        return 1;
    }
    size_t n = (size_t)c->floats;
    float *grad = malloc(n * sizeof *grad);
    float *param = malloc(n * sizeof *param);
    void *ctx = zmq_ctx_new();
    void *socks[B_MAX_SHARDS] = {0};
    bool ok = grad && param && ctx;
    if (ok) {
        for (size_t i = 0; i < n; i++) { // faults the pages in before timing
            grad[i] = 1e-3F;
            param[i] = 0.0F;
        }
    }
    for (int k = 0; k < c->shards && ok; k++) {
        socks[k] = b_socket(ctx, ZMQ_DEALER, c);
        ok = socks[k] && zmq_connect(socks[k], eps[k]) == 0;
    }
    int rounds = c->warmup + c->steps + 1;
    for (int r = 0; r < rounds && ok; r++) {
        ok = b_client_step(socks, c, id, grad, param, who);
    }
    for (int k = 0; k < c->shards; k++) {
        if (socks[k]) {
            zmq_close(socks[k]);
        }
    }
    if (ctx) {
        zmq_ctx_term(ctx);
    }
    free(param);
    free(grad);
    return ok ? 0 : 1;
}

// ---------------------------------------------------------------------------
// Flags.

static void b_usage(FILE *f)
{
    fprintf(f, "usage: bare_ps [options]\n"
               "  --endpoint EP      where the shards bind (default tcp://127.0.0.1:*)\n"
               "  --workers W        client processes (default 2)\n"
               "  --shards S         shard processes (default 1)\n"
               "  --floats P         parameters, suffix K/M = 2^10/2^20 (default 16M)\n"
               "  --chunk-bytes N    payload of one message, suffix K/M (default 1M)\n"
               "  --lr X             SGD learning rate (default 0.01)\n"
               "  --steps N          timed steps (default 20)\n"
               "  --warmup K         untimed steps first (default 3)\n"
               "  --timeout-ms N     bound on every wait (default 60000)\n");
}

static bool b_parse_size(const char *flag, const char *text, uint64_t lo, uint64_t hi,
                         uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    uint64_t mul = 1;
    if (end != text && (*end == 'k' || *end == 'K')) {
        mul = 1ULL << 10;
        end++;
    } else if (end != text && (*end == 'm' || *end == 'M')) {
        mul = 1ULL << 20;
        end++;
    }
    if (end == text || *end != '\0' || errno != 0 || text[0] == '-' || v > hi / mul ||
        v * mul < lo) {
        fprintf(stderr, "bare_ps: %s: '%s' is not an integer in %" PRIu64 "..%" PRIu64 "\n", flag,
                text, lo, hi);
        return false;
    }
    *out = v * mul;
    return true;
}

static bool b_parse_int(const char *flag, const char *text, int lo, int hi, int *out)
{
    uint64_t v = 0;
    if (!b_parse_size(flag, text, (uint64_t)lo, (uint64_t)hi, &v)) {
        return false;
    }
    *out = (int)v;
    return true;
}

static bool b_parse_opts(int argc, char **argv, b_cfg *c)
{
    *c = (b_cfg){.endpoint = "tcp://127.0.0.1:*", .workers = 2, .shards = 1,
                 .floats = 16U << 20, .chunk = 1U << 18, .lr = 0.01F, .steps = 20, .warmup = 3,
                 .timeout_ms = 60000};
    enum { O_EP = 256, O_W, O_S, O_P, O_CB, O_LR, O_STEPS, O_WARM, O_TO, O_HELP };
    static const struct option opts[] = {
        {"endpoint", required_argument, NULL, O_EP},
        {"workers", required_argument, NULL, O_W},
        {"shards", required_argument, NULL, O_S},
        {"floats", required_argument, NULL, O_P},
        {"chunk-bytes", required_argument, NULL, O_CB},
        {"lr", required_argument, NULL, O_LR},
        {"steps", required_argument, NULL, O_STEPS},
        {"warmup", required_argument, NULL, O_WARM},
        {"timeout-ms", required_argument, NULL, O_TO},
        {"help", no_argument, NULL, O_HELP},
        {NULL, 0, NULL, 0},
    };
    int opt = 0;
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        bool ok = true;
        uint64_t v = 0;
        char *end = NULL;
        switch (opt) {
        case O_EP: c->endpoint = optarg; break;
        case O_W: ok = b_parse_int("--workers", optarg, 1, B_MAX_WORKERS, &c->workers); break;
        case O_S: ok = b_parse_int("--shards", optarg, 1, B_MAX_SHARDS, &c->shards); break;
        case O_P: ok = b_parse_size("--floats", optarg, 1, 1ULL << 32, &c->floats); break;
        case O_CB:
            ok = b_parse_size("--chunk-bytes", optarg, sizeof(float), 1ULL << 30, &v);
            c->chunk = v / sizeof(float);
            break;
        case O_LR:
            c->lr = strtof(optarg, &end);
            ok = end != optarg && *end == '\0';
            break;
        case O_STEPS: ok = b_parse_int("--steps", optarg, 1, 1000000, &c->steps); break;
        case O_WARM: ok = b_parse_int("--warmup", optarg, 0, 1000000, &c->warmup); break;
        case O_TO: ok = b_parse_int("--timeout-ms", optarg, 1, 3600000, &c->timeout_ms); break;
        case O_HELP: b_usage(stdout); exit(0);
        default: ok = false; break;
        }
        if (!ok) {
            b_usage(stderr);
            return false;
        }
    }
    if (optind < argc || c->floats < (uint64_t)c->shards || strlen(c->endpoint) >= B_EP_LEN) {
        fprintf(stderr, "bare_ps: bad arguments (--help lists them)\n");
        return false;
    }
    return true;
}

static int b_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// Forks child i (a shard if k >= 1, else client id) with a pipe: the
// parent's end in *fd (read for a shard, write for a client).
static bool b_fork(const b_cfg *c, pid_t parent, int k, int id, int *fd)
{
    int p[2];
    if (pipe(p) != 0) {
        fprintf(stderr, "bare_ps: pipe: %s\n", strerror(errno));
        return false;
    }
    (void)fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "bare_ps: fork: %s\n", strerror(errno));
        close(p[0]);
        close(p[1]);
        return false;
    }
    if (pid == 0) {
        (void)signal(SIGTERM, SIG_DFL);
        (void)signal(SIGINT, SIG_DFL);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) {
            _exit(3);
        }
        if (k > 0) {
            close(p[0]);
            _exit(b_shard_main(c, k, p[1]));
        }
        close(p[1]);
        _exit(b_client_main(c, id, p[0]));
    }
    close(k > 0 ? p[1] : p[0]);
    *fd = k > 0 ? p[0] : p[1];
    b_children[b_n_children++] = (b_child){.pid = pid};
    return true;
}

// Shard 0's part once the children are forked: bind, hand the endpoints
// over, serve, time.
static int b_parent(const b_cfg *c, const int *shard_fd, const int *client_fd, double *done_ms)
{
    static char eps[B_MAX_SHARDS][B_EP_LEN];
    size_t len = B_EP_LEN;
    void *ctx = zmq_ctx_new();
    void *sock = ctx ? b_socket(ctx, ZMQ_ROUTER, c) : NULL;
    bool ok = sock && zmq_bind(sock, c->endpoint) == 0 &&
              zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, eps[0], &len) == 0;
    if (!ok) {
        fprintf(stderr, "bare_ps: cannot bind %s: %s\n", c->endpoint, zmq_strerror(errno));
    }
    for (int k = 1; k < c->shards && ok; k++) {
        ok = b_read_full(shard_fd[k], eps[k], B_EP_LEN, c->timeout_ms);
        if (!ok) {
            fprintf(stderr, "bare_ps: shard %d did not report its endpoint\n", k);
        }
    }
    for (int i = 0; i < c->workers && ok; i++) {
        ok = b_write_full(client_fd[i], eps, (size_t)c->shards * B_EP_LEN);
    }
    b_shard *s = ok ? b_shard_new(c, 0) : NULL;
    if (ok && !s) {
        fprintf(stderr, "bare_ps: shard 0: out of memory\n");
    }
    ok = s && b_serve(sock, s, c, 0, done_ms) && b_reap_children(c->timeout_ms);
    if (sock) {
        zmq_close(sock);
    }
    if (ctx) {
        zmq_ctx_term(ctx);
    }
    b_shard_free(s);
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    b_cfg c;
    if (!b_parse_opts(argc, argv, &c)) {
        return 2;
    }
    if (signal(SIGPIPE, SIG_IGN) == SIG_ERR || signal(SIGTERM, b_on_signal) == SIG_ERR ||
        signal(SIGINT, b_on_signal) == SIG_ERR) {
        fprintf(stderr, "bare_ps: signal: %s\n", strerror(errno));
        return 1;
    }
    pid_t parent = getpid();
    int shard_fd[B_MAX_SHARDS] = {0};
    int client_fd[B_MAX_WORKERS] = {0};
    bool ok = true;
    // Fork everything first: no ZeroMQ context may exist before a fork.
    for (int k = 1; k < c.shards && ok; k++) {
        ok = b_fork(&c, parent, k, 0, &shard_fd[k]);
    }
    for (int i = 0; i < c.workers && ok; i++) {
        ok = b_fork(&c, parent, 0, i, &client_fd[i]);
    }
    int rounds = c.warmup + c.steps + 1;
    double *done_ms = calloc((size_t)rounds, sizeof *done_ms);
    double *dt = calloc((size_t)c.steps, sizeof *dt);
    int ret = ok && done_ms && dt ? b_parent(&c, shard_fd, client_fd, done_ms) : 1;
    if (ret != 0) {
        b_kill_children();
    } else {
        for (int i = 0; i < c.steps; i++) {
            dt[i] = done_ms[c.warmup + i + 1] - done_ms[c.warmup + i];
        }
        qsort(dt, (size_t)c.steps, sizeof *dt, b_cmp_double);
        int h = c.steps / 2;
        double med = c.steps % 2 ? dt[h] : (dt[h - 1] + dt[h]) / 2;
        printf("bare_ps transport=%.3s workers=%d shards=%d floats=%" PRIu64
               " chunk_floats=%" PRIu64 " steps=%d warmup=%d step_ms=%.3f step_ms_min=%.3f "
               "step_ms_max=%.3f\n",
               c.endpoint, c.workers, c.shards, c.floats, c.chunk, c.steps, c.warmup, med, dt[0],
               dt[c.steps - 1]);
    }
    free(dt);
    free(done_ms);
    return ret;
}
