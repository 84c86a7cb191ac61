/* zmq_ceiling.c - the raw ZeroMQ throughput that bounds a zps sync step.
 *
 * It moves the bytes a zps step moves, over the same transport and in the
 * same shape, and does nothing else: W client processes (DEALER, like
 * zps-worker) each push a tensor of P elements to S server ROUTERs (each owns
 * a contiguous slice, like zps shards). As zps does with flat:P models, the
 * tensor goes as buckets of --bucket-floats elements (last bucket first),
 * one message each, cut into frames of at most --frame-bytes and sent
 * zero-copy; a server answers a bucket to every client, zero-copy from one
 * buffer, as soon as all W clients pushed it, so replies overlap pushes.
 * --bucket-floats 0 sends the whole slice as one message (no overlap). No
 * arithmetic, no validation beyond counts. zps can at best match it.
 *
 * Clients and extra shards are forked processes, as in zps, and all forks
 * happen before any ZeroMQ context exists (a context does not survive fork).
 * Endpoints travel over pipes, so tcp://HOST:* works. Shard 0 runs in the
 * parent and times the step the way the zps coordinator does: from the
 * arrival of one step's last push to the next one's.
 *
 *   zmq_ceiling --endpoint tcp://127.0.0.1:* --workers 2 --floats 4M \
 *               --steps 20 --warmup 3
 *
 * prints one line:
 *   ceiling transport=tcp workers=2 shards=1 floats=4194304 elem_bytes=4
 *   bucket_floats=1048576 frame_bytes=4194304 steps=20 warmup=3 step_ms=...
 *   step_ms_min=... step_ms_max=... bytes_per_step=... bytes_per_s=...
 *   gbytes_per_s=...
 * where bytes_per_s = 2*W*P*elem_bytes / median step time (GB = 1e9 bytes).
 *
 * Every wait is bounded by --timeout-ms; a timeout or a failed child exits
 * with status 1 after killing and reaping every child. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
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

#define S_MAX_WORKERS 256
#define S_MAX_SHARDS 16
#define S_MAX_FRAMES 4096       // frames per message, a sanity bound only
#define S_EP_LEN 256            // fixed-size endpoint records on the pipes
#define S_POLL_SLICE_MS 100     // how often a waiting parent looks at its children
#define S_HDR_MAGIC 0x7a70736365696cULL

// The header frame: the zps header is a small protobuf frame ahead of the
// payload; this one has about the same size and lets the peer check counts.
typedef struct s_hdr {
    uint64_t magic;
    uint64_t round;
    uint64_t shard;
    uint64_t client;
    uint64_t bucket;   // global bucket index
    uint64_t offset;   // first element of the bucket's part in this shard
    uint64_t count;    // its elements
    uint64_t bytes;    // payload bytes that follow
} s_hdr;

typedef struct s_cfg {
    const char *endpoint;
    int workers;
    int shards;
    uint64_t floats;      // P: elements per tensor
    uint64_t bucket;      // elements per bucket (0 on the command line: P)
    int elem_bytes;       // 4 for fp32, 2 for bf16/fp16 on the wire
    size_t frame_bytes;   // largest payload frame, a multiple of elem_bytes
    int steps;            // timed steps
    int warmup;           // untimed steps before them
    int timeout_ms;       // bound on every wait
    int io_threads;       // ZeroMQ I/O threads per context (zps: 1)
    bool quiet;
} s_cfg;

// Counts a buffer's zero-copy frames still held by ZeroMQ (as zps_wire_ref).
typedef struct s_ref {
    atomic_int inflight;
} s_ref;

typedef struct s_child {
    pid_t pid;
    const char *what;     // "client" or "shard"
    int index;
    bool reaped;
    int status;
} s_child;

static s_child s_children[S_MAX_WORKERS + S_MAX_SHARDS];
static int s_n_children;

static double s_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void s_sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

// ---------------------------------------------------------------------------
// Slices: shard k owns elements [k*P/S, (k+1)*P/S), as zps balances ranges.

static uint64_t s_slice_lo(const s_cfg *c, int k)
{
    return c->floats * (uint64_t)k / (uint64_t)c->shards;
}

static uint64_t s_slice_count(const s_cfg *c, int k)
{
    return s_slice_lo(c, k + 1) - s_slice_lo(c, k);
}

// Buckets: global ranges [g*B, (g+1)*B) of the tensor; shard k sees the
// parts of buckets first..last that fall in its slice (zps_model_range_buckets).
static uint64_t s_first_bucket(const s_cfg *c, int k)
{
    return s_slice_lo(c, k) / c->bucket;
}

static int s_n_buckets(const s_cfg *c, int k)
{
    uint64_t last = (s_slice_lo(c, k + 1) - 1) / c->bucket;
    return (int)(last - s_first_bucket(c, k) + 1);
}

// The part [*lo, *lo + *count) of global bucket g in shard k; false if none.
static bool s_bucket_part(const s_cfg *c, int k, uint64_t g, uint64_t *lo, uint64_t *count)
{
    uint64_t a = g * c->bucket, b = a + c->bucket;
    uint64_t slo = s_slice_lo(c, k), shi = s_slice_lo(c, k + 1);
    a = a > slo ? a : slo;
    b = b < shi ? b : shi;
    *lo = a;
    *count = b > a ? b - a : 0;
    return b > a;
}

// Shard k's endpoint: ipc paths need one per shard; tcp port * is unique anyway.
static void s_shard_endpoint(const s_cfg *c, int k, char *out, size_t len)
{
    size_t n = strlen(c->endpoint);
    bool ipc_path = strncmp(c->endpoint, "ipc://", 6) == 0 && c->endpoint[n - 1] != '*';
    if (c->shards > 1 && ipc_path) {
        snprintf(out, len, "%s-%d", c->endpoint, k);
    } else {
        snprintf(out, len, "%s", c->endpoint);
    }
}

// libzmq 4.3 leaves the socket file of an ipc:// path behind after close;
// a benchmark run must not litter (ipc://* cleans up after itself).
static void s_unlink_ipc(const char *bound)
{
    if (strncmp(bound, "ipc:///", 7) == 0) {
        unlink(bound + 6);
    }
}

// ---------------------------------------------------------------------------
// Sockets and frames.

static void *s_socket(void *ctx, int type, const s_cfg *c)
{
    void *s = zmq_socket(ctx, type);
    if (!s) {
        fprintf(stderr, "zmq_ceiling: zmq_socket: %s\n", zmq_strerror(errno));
        return NULL;
    }
    // The options zps_wire_socket sets, so the transport behaves the same.
    int linger = 2000;
    int64_t maxmsg = (int64_t)c->frame_bytes + (1 << 20);
    int hwm = 0;
    if (zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger) ||
        zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) ||
        zmq_setsockopt(s, ZMQ_RCVTIMEO, &c->timeout_ms, sizeof c->timeout_ms) ||
        zmq_setsockopt(s, ZMQ_SNDTIMEO, &c->timeout_ms, sizeof c->timeout_ms) ||
        zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm) ||
        zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm)) {
        fprintf(stderr, "zmq_ceiling: zmq_setsockopt: %s\n", zmq_strerror(errno));
        zmq_close(s);
        return NULL;
    }
    if (type == ZMQ_ROUTER) {
        // A reply to a vanished client must fail loudly, not vanish too.
        int on = 1;
        if (zmq_setsockopt(s, ZMQ_ROUTER_MANDATORY, &on, sizeof on)) {
            fprintf(stderr, "zmq_ceiling: ZMQ_ROUTER_MANDATORY: %s\n", zmq_strerror(errno));
            zmq_close(s);
            return NULL;
        }
    }
    return s;
}

static void *s_context(const s_cfg *c)
{
    void *ctx = zmq_ctx_new();
    if (!ctx) {
        fprintf(stderr, "zmq_ceiling: zmq_ctx_new: %s\n", zmq_strerror(errno));
        return NULL;
    }
    if (zmq_ctx_set(ctx, ZMQ_IO_THREADS, c->io_threads) != 0) {
        fprintf(stderr, "zmq_ceiling: ZMQ_IO_THREADS: %s\n", zmq_strerror(errno));
        zmq_ctx_term(ctx);
        return NULL;
    }
    return ctx;
}

// ZeroMQ calls this from its I/O thread once it is done with a frame: it may
// only drop the reference, exactly like zps_wire.c.
static void s_release(void *data, void *hint)
{
    (void)data;
    atomic_fetch_sub_explicit(&((s_ref *)hint)->inflight, 1, memory_order_release);
}

// Waits until ZeroMQ released every frame of ref, so the buffer could be
// written again (zps writes the next step's tensor into it).
static bool s_ref_wait(s_ref *ref, int timeout_ms, const char *who)
{
    double deadline = s_now_ms() + timeout_ms;
    while (atomic_load_explicit(&ref->inflight, memory_order_acquire) > 0) {
        if (s_now_ms() > deadline) {
            fprintf(stderr, "zmq_ceiling: %s: ZeroMQ held a send buffer for %d ms\n", who,
                    timeout_ms);
            return false;
        }
        s_sleep_us(20);
    }
    return true;
}

static bool s_send_part(void *sock, zmq_msg_t *m, bool more, const char *who)
{
    if (zmq_msg_send(m, sock, more ? ZMQ_SNDMORE : 0) < 0) {
        fprintf(stderr, "zmq_ceiling: %s: send: %s\n", who, zmq_strerror(errno));
        zmq_msg_close(m);
        return false;
    }
    return true;
}

// Sends [route,] header, payload frames; the payload zero-copy from buf.
static bool s_send_tensor(void *sock, zmq_msg_t *route, const s_hdr *h, const uint8_t *buf,
                          const s_cfg *c, s_ref *ref, const char *who)
{
    zmq_msg_t part;
    if (route) {
        zmq_msg_init(&part);
        zmq_msg_copy(&part, route);
        if (!s_send_part(sock, &part, true, who)) {
            return false;
        }
    }
    if (zmq_msg_init_size(&part, sizeof *h) != 0) {
        fprintf(stderr, "zmq_ceiling: %s: out of memory for a header\n", who);
        return false;
    }
    memcpy(zmq_msg_data(&part), h, sizeof *h);
    size_t bytes = h->bytes;
    if (!s_send_part(sock, &part, bytes > 0, who)) {
        return false;
    }
    while (bytes > 0) {
        size_t len = bytes < c->frame_bytes ? bytes : c->frame_bytes;
        atomic_fetch_add_explicit(&ref->inflight, 1, memory_order_relaxed);
        if (zmq_msg_init_data(&part, (void *)buf, len, s_release, ref) != 0) {
            atomic_fetch_sub(&ref->inflight, 1);
            fprintf(stderr, "zmq_ceiling: %s: zmq_msg_init_data failed\n", who);
            return false;
        }
        if (!s_send_part(sock, &part, bytes > len, who)) {
            return false;
        }
        buf += len;
        bytes -= len;
    }
    return true;
}

static bool s_more(void *sock)
{
    int more = 0;
    size_t len = sizeof more;
    return zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &len) == 0 && more;
}

// Receives the rest of a message whose first part is already in: the header,
// then every payload frame, which it drops (no arithmetic). Checks that the
// header is for this round and shard and that the payload matches its count.
static bool s_recv_body(void *sock, uint64_t round, int shard, int elem_bytes, s_hdr *got,
                        const char *who)
{
    zmq_msg_t part;
    zmq_msg_init(&part);
    // ZeroMQ delivers a multipart message whole: no part below can block.
    if (zmq_msg_recv(&part, sock, ZMQ_DONTWAIT) < 0) {
        fprintf(stderr, "zmq_ceiling: %s: header: %s\n", who, zmq_strerror(errno));
        zmq_msg_close(&part);
        return false;
    }
    bool ok = zmq_msg_size(&part) == sizeof *got;
    if (ok) {
        memcpy(got, zmq_msg_data(&part), sizeof *got);
        ok = got->magic == S_HDR_MAGIC && got->round == round && got->shard == (uint64_t)shard &&
             got->bytes == got->count * (uint64_t)elem_bytes;
    }
    zmq_msg_close(&part);
    size_t bytes = 0;
    int frames = 0;
    while (s_more(sock)) {
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, sock, ZMQ_DONTWAIT) < 0) {
            fprintf(stderr, "zmq_ceiling: %s: frame: %s\n", who, zmq_strerror(errno));
            zmq_msg_close(&part);
            return false;
        }
        bytes += zmq_msg_size(&part);
        frames++;
        zmq_msg_close(&part);
    }
    if (!ok || bytes != got->bytes || frames > S_MAX_FRAMES) {
        fprintf(stderr,
                "zmq_ceiling: %s: unexpected message in round %" PRIu64 " (%zu payload bytes in "
                "%d frames)\n",
                who, round, bytes, frames);
        return false;
    }
    return true;
}

// ---------------------------------------------------------------------------
// Children: a failed or hung child must never outlive a run.

static void s_kill_children(void)
{
    for (int i = 0; i < s_n_children; i++) {
        if (!s_children[i].reaped) {
            kill(s_children[i].pid, SIGKILL);
        }
    }
    for (int i = 0; i < s_n_children; i++) {
        if (!s_children[i].reaped) {
            waitpid(s_children[i].pid, &s_children[i].status, 0);
            s_children[i].reaped = true;
        }
    }
}

// Reaps exited children without blocking; false if one of them failed.
static bool s_check_children(void)
{
    bool ok = true;
    for (int i = 0; i < s_n_children; i++) {
        s_child *ch = &s_children[i];
        if (ch->reaped || waitpid(ch->pid, &ch->status, WNOHANG) != ch->pid) {
            continue;
        }
        ch->reaped = true;
        if (WIFEXITED(ch->status) && WEXITSTATUS(ch->status) == 0) {
            continue;
        }
        ok = false;
        if (WIFSIGNALED(ch->status)) {
            fprintf(stderr, "zmq_ceiling: %s %d (pid %d) died of signal %d\n", ch->what,
                    ch->index, (int)ch->pid, WTERMSIG(ch->status));
        } else {
            fprintf(stderr, "zmq_ceiling: %s %d (pid %d) exited with status %d\n", ch->what,
                    ch->index, (int)ch->pid, WEXITSTATUS(ch->status));
        }
    }
    return ok;
}

// Waits at most timeout_ms for every child to exit; false if one failed or hung.
static bool s_reap_children(int timeout_ms)
{
    double deadline = s_now_ms() + timeout_ms;
    for (;;) {
        if (!s_check_children()) {
            return false;
        }
        int left = 0;
        for (int i = 0; i < s_n_children; i++) {
            left += !s_children[i].reaped;
        }
        if (left == 0) {
            return true;
        }
        if (s_now_ms() > deadline) {
            fprintf(stderr, "zmq_ceiling: %d child process(es) still running after %d ms\n", left,
                    timeout_ms);
            return false;
        }
        s_sleep_us(2000);
    }
}

// The parent, stopped by SIGTERM/SIGINT (a script's timeout), takes its
// children with it and reaps them: kill, waitpid and _exit are
// async-signal-safe.
static void s_on_signal(int sig)
{
    for (int i = 0; i < s_n_children; i++) {
        if (!s_children[i].reaped) {
            kill(s_children[i].pid, SIGKILL);
        }
    }
    for (int i = 0; i < s_n_children; i++) {
        if (!s_children[i].reaped) {
            waitpid(s_children[i].pid, NULL, 0);
        }
    }
    _exit(128 + sig);
}

// In a child: die with the parent, so a killed benchmark leaves nothing behind.
static void s_child_init(pid_t parent)
{
    // The handler would kill this child's siblings (its copy of s_children).
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) {
        _exit(3);
    }
}

// Reads exactly len bytes from fd within timeout_ms.
static bool s_read_full(int fd, void *buf, size_t len, int timeout_ms)
{
    double deadline = s_now_ms() + timeout_ms;
    uint8_t *p = buf;
    while (len > 0) {
        int left = (int)(deadline - s_now_ms());
        if (left <= 0) {
            return false;
        }
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int rc = poll(&pfd, 1, left);
        if (rc < 0 && errno == EINTR) {
            continue;
        }
        if (rc <= 0) {
            return false;
        }
        ssize_t n = read(fd, p, len);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return false;
        }
        p += n;
        len -= (size_t)n;
    }
    return true;
}

static bool s_write_full(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return false;
        }
        p += n;
        len -= (size_t)n;
    }
    return true;
}

// ---------------------------------------------------------------------------
// Server: one shard's ROUTER. Shard 0 (the parent) records step times.

// Waits for the first part of the next message, at most timeout_ms. The
// parent waits in slices so that a dead child ends the run at once.
static bool s_wait_readable(void *sock, int timeout_ms, bool watch_children, const char *who)
{
    double deadline = s_now_ms() + timeout_ms;
    zmq_pollitem_t item = {.socket = sock, .events = ZMQ_POLLIN};
    for (;;) {
        int left = (int)(deadline - s_now_ms());
        if (left <= 0) {
            fprintf(stderr, "zmq_ceiling: %s: nothing arrived for %d ms\n", who, timeout_ms);
            return false;
        }
        int slice = watch_children && left > S_POLL_SLICE_MS ? S_POLL_SLICE_MS : left;
        int rc = zmq_poll(&item, 1, slice);
        if (rc < 0 && errno != EINTR) {
            fprintf(stderr, "zmq_ceiling: %s: zmq_poll: %s\n", who, zmq_strerror(errno));
            return false;
        }
        if (rc > 0) {
            return true;
        }
        if (watch_children && !s_check_children()) {
            return false;
        }
    }
}

// Serves every round: counts each bucket's pushes and answers a bucket to
// every client as soon as all W pushed it, as a zps shard does.
static bool s_serve(void *sock, const s_cfg *c, int k, double *done_ms)
{
    char who[32];
    snprintf(who, sizeof who, "shard %d", k);
    int rounds = c->warmup + c->steps + 1;
    uint64_t lo = s_slice_lo(c, k), first = s_first_bucket(c, k);
    int nb = s_n_buckets(c, k);
    size_t bytes = (size_t)s_slice_count(c, k) * (size_t)c->elem_bytes;
    uint8_t *buf = malloc(bytes);
    int *pushed = calloc((size_t)nb, sizeof *pushed);
    zmq_msg_t *routes = calloc((size_t)c->workers, sizeof *routes);
    bool *route_set = calloc((size_t)c->workers, sizeof *route_set);
    if (!buf || !pushed || !routes || !route_set) {
        fprintf(stderr, "zmq_ceiling: %s: cannot allocate %zu bytes\n", who, bytes);
        return false;
    }
    memset(buf, 1, bytes); // fault the pages in before timing
    s_ref ref = {0};
    bool ok = true;
    for (int r = 0; r < rounds && ok; r++) {
        memset(pushed, 0, (size_t)nb * sizeof *pushed);
        int need = nb * c->workers, got = 0;
        bool replied = false;
        while (got < need && ok) {
            zmq_msg_t route;
            s_hdr h = {0};
            ok = s_wait_readable(sock, c->timeout_ms, done_ms != NULL, who);
            if (!ok) {
                break;
            }
            zmq_msg_init(&route);
            if (zmq_msg_recv(&route, sock, ZMQ_DONTWAIT) < 0 || !s_more(sock)) {
                fprintf(stderr, "zmq_ceiling: %s: routing id: %s\n", who, zmq_strerror(errno));
                zmq_msg_close(&route);
                ok = false;
                break;
            }
            ok = s_recv_body(sock, (uint64_t)r, k, c->elem_bytes, &h, who);
            uint64_t plo = 0, pcount = 0;
            int b = (int)(h.bucket - first);
            if (ok && (h.client >= (uint64_t)c->workers || h.bucket < first || b >= nb ||
                       !s_bucket_part(c, k, h.bucket, &plo, &pcount) || h.offset != plo ||
                       h.count != pcount || pushed[b] == c->workers)) {
                fprintf(stderr, "zmq_ceiling: %s: bad push of bucket %" PRIu64 " in round %d\n",
                        who, h.bucket, r);
                ok = false;
            }
            if (ok && !route_set[h.client]) {
                // A DEALER keeps its routing id: learn it once.
                zmq_msg_init(&routes[h.client]);
                zmq_msg_copy(&routes[h.client], &route);
                route_set[h.client] = true;
            }
            zmq_msg_close(&route);
            if (!ok) {
                break;
            }
            got++;
            if (got == need && done_ms) {
                done_ms[r] = s_now_ms(); // the step is complete, as zps's step_ms sees it
            }
            if (++pushed[b] < c->workers) {
                continue;
            }
            // The buffer is rewritten each round in zps: last round's replies must be out.
            if (!replied) {
                ok = s_ref_wait(&ref, c->timeout_ms, who);
                replied = true;
            }
            s_hdr reply = {.magic = S_HDR_MAGIC, .round = (uint64_t)r, .shard = (uint64_t)k,
                           .bucket = h.bucket, .offset = plo, .count = pcount,
                           .bytes = pcount * (uint64_t)c->elem_bytes};
            for (int i = 0; i < c->workers && ok; i++) {
                reply.client = (uint64_t)i;
                ok = s_send_tensor(sock, &routes[i], &reply,
                                   buf + (plo - lo) * (uint64_t)c->elem_bytes, c, &ref, who);
            }
        }
    }
    for (int i = 0; i < c->workers; i++) {
        if (route_set[i]) {
            zmq_msg_close(&routes[i]);
        }
    }
    free(routes);
    free(route_set);
    free(pushed);
    // ZeroMQ must be done with buf before it is freed; after a failure the
    // process is about to exit, and buf is left to it rather than waited for.
    if (!ok || !s_ref_wait(&ref, c->timeout_ms, who)) {
        return false;
    }
    free(buf);
    return true;
}

// A forked shard k > 0: binds, tells the parent where, serves, exits.
static int s_shard_main(const s_cfg *c, int k, int ep_fd)
{
    char ep[S_EP_LEN] = {0};
    void *ctx = s_context(c);
    void *sock = ctx ? s_socket(ctx, ZMQ_ROUTER, c) : NULL;
    if (!sock) {
        return 1;
    }
    char want[S_EP_LEN];
    s_shard_endpoint(c, k, want, sizeof want);
    size_t len = sizeof ep;
    if (zmq_bind(sock, want) != 0 || zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, ep, &len) != 0) {
        fprintf(stderr, "zmq_ceiling: shard %d: cannot bind %s: %s\n", k, want,
                zmq_strerror(errno));
        return 1;
    }
    if (!s_write_full(ep_fd, ep, sizeof ep)) {
        fprintf(stderr, "zmq_ceiling: shard %d: cannot hand over its endpoint\n", k);
        return 1;
    }
    close(ep_fd);
    bool ok = s_serve(sock, c, k, NULL);
    zmq_close(sock);
    zmq_ctx_term(ctx);
    s_unlink_ipc(ep);
    return ok ? 0 : 1;
}

// ---------------------------------------------------------------------------
// Client: one DEALER per shard, like a zps worker.

static int s_client_main(const s_cfg *c, int id, int ep_fd)
{
    char who[32];
    snprintf(who, sizeof who, "client %d", id);
    char eps[S_MAX_SHARDS][S_EP_LEN];
    if (!s_read_full(ep_fd, eps, (size_t)c->shards * S_EP_LEN, c->timeout_ms)) {
        fprintf(stderr, "zmq_ceiling: %s: no endpoints from the parent within %d ms\n", who,
                c->timeout_ms);
        return 1;
    }
    close(ep_fd);
    size_t bytes = (size_t)c->floats * (size_t)c->elem_bytes;
    uint8_t *buf = malloc(bytes ? bytes : 1);
    if (!buf) {
        fprintf(stderr, "zmq_ceiling: %s: cannot allocate %zu bytes\n", who, bytes);
        return 1;
    }
    memset(buf, 2, bytes); // fault the pages in before timing
    void *ctx = s_context(c);
    void *socks[S_MAX_SHARDS] = {0};
    bool ok = ctx != NULL;
    for (int k = 0; k < c->shards && ok; k++) {
        socks[k] = s_socket(ctx, ZMQ_DEALER, c);
        ok = socks[k] != NULL;
        if (ok && zmq_connect(socks[k], eps[k]) != 0) {
            fprintf(stderr, "zmq_ceiling: %s: connect %s: %s\n", who, eps[k], zmq_strerror(errno));
            ok = false;
        }
    }
    s_ref ref = {0};
    int rounds = c->warmup + c->steps + 1;
    int64_t n_global = (int64_t)((c->floats + c->bucket - 1) / c->bucket);
    int want[S_MAX_SHARDS];
    zmq_pollitem_t items[S_MAX_SHARDS];
    for (int k = 0; k < c->shards; k++) {
        items[k] = (zmq_pollitem_t){.socket = socks[k], .events = ZMQ_POLLIN};
    }
    for (int r = 0; r < rounds && ok; r++) {
        // zps writes the next gradient into this buffer: ZeroMQ must be done with it.
        ok = s_ref_wait(&ref, c->timeout_ms, who);
        // Last bucket first, as backward finishes them; each to the shards it spans.
        for (int64_t g = n_global - 1; g >= 0 && ok; g--) {
            for (int k = 0; k < c->shards && ok; k++) {
                s_hdr h = {.magic = S_HDR_MAGIC, .round = (uint64_t)r, .shard = (uint64_t)k,
                           .client = (uint64_t)id, .bucket = (uint64_t)g};
                if (!s_bucket_part(c, k, (uint64_t)g, &h.offset, &h.count)) {
                    continue;
                }
                h.bytes = h.count * (uint64_t)c->elem_bytes;
                ok = s_send_tensor(socks[k], NULL, &h, buf + h.offset * (uint64_t)c->elem_bytes,
                                   c, &ref, who);
            }
        }
        // Every bucket of every shard comes back, in whatever order they finish.
        int left = 0;
        for (int k = 0; k < c->shards; k++) {
            want[k] = s_n_buckets(c, k);
            left += want[k];
        }
        double deadline = s_now_ms() + c->timeout_ms;
        while (left > 0 && ok) {
            int wait_ms = (int)(deadline - s_now_ms());
            int rc = wait_ms > 0 ? zmq_poll(items, c->shards, wait_ms) : 0;
            if (rc < 0 && errno == EINTR) {
                continue;
            }
            if (rc <= 0) {
                fprintf(stderr, "zmq_ceiling: %s: round %d replies incomplete after %d ms\n",
                        who, r, c->timeout_ms);
                ok = false;
                break;
            }
            for (int k = 0; k < c->shards && ok; k++) {
                if (!(items[k].revents & ZMQ_POLLIN)) {
                    continue;
                }
                s_hdr got;
                uint64_t plo, pcount;
                ok = s_recv_body(socks[k], (uint64_t)r, k, c->elem_bytes, &got, who);
                if (ok && (want[k] == 0 || !s_bucket_part(c, k, got.bucket, &plo, &pcount) ||
                           got.offset != plo || got.count != pcount)) {
                    fprintf(stderr, "zmq_ceiling: %s: bad reply for bucket %" PRIu64 "\n", who,
                            got.bucket);
                    ok = false;
                }
                if (ok) {
                    want[k]--;
                    left--;
                }
            }
        }
    }
    // After a failure zmq_ctx_term below drops (and releases) what is left.
    ok = ok && s_ref_wait(&ref, c->timeout_ms, who);
    for (int k = 0; k < c->shards; k++) {
        if (socks[k]) {
            zmq_close(socks[k]);
        }
    }
    if (ctx) {
        zmq_ctx_term(ctx);
    }
    free(buf);
    return ok ? 0 : 1;
}

// ---------------------------------------------------------------------------
// Flags.

static void s_usage(FILE *f)
{
    fprintf(f,
            "usage: zmq_ceiling [options]\n"
            "  --endpoint EP      tcp://127.0.0.1:* (default) or ipc://PATH; with --shards > 1\n"
            "                     an ipc PATH gets -K appended per shard\n"
            "  --workers W        client processes (default 2)\n"
            "  --shards S         server processes, each owning a slice (default 1)\n"
            "  --floats P         elements per tensor, suffix K/M = 2^10/2^20 (default 4M)\n"
            "  --elem-bytes N     bytes per element on the wire: 4 fp32, 2 bf16/fp16 (default 4)\n"
            "  --bucket-floats N  elements per pushed message, suffix K/M (default 1M, as zps's\n"
            "                     flat model; 0: the whole slice in one message)\n"
            "  --frame-bytes N    largest payload frame, suffix K/M (default 4M, as zps)\n"
            "  --steps N          timed steps (default 20)\n"
            "  --warmup K         untimed steps first (default 3)\n"
            "  --timeout-ms N     bound on every wait (default 60000)\n"
            "  --io-threads N     ZeroMQ I/O threads per process (default 1, as zps)\n"
            "  --quiet            no progress line on stderr\n");
}

static bool s_parse_size(const char *flag, const char *text, uint64_t lo, uint64_t hi,
                         uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    uint64_t mul = 1;
    if (end != text && (*end == 'k' || *end == 'K')) {
        mul = 1ull << 10;
        end++;
    } else if (end != text && (*end == 'm' || *end == 'M')) {
        mul = 1ull << 20;
        end++;
    }
    if (end == text || *end != '\0' || errno != 0 || text[0] == '-' || v > hi / mul ||
        v * mul < lo || v * mul > hi) {
        fprintf(stderr, "zmq_ceiling: %s: '%s' is not an integer in %" PRIu64 "..%" PRIu64 "\n",
                flag, text, lo, hi);
        return false;
    }
    *out = v * mul;
    return true;
}

static bool s_parse_opts(int argc, char **argv, s_cfg *c)
{
    *c = (s_cfg){.endpoint = "tcp://127.0.0.1:*", .workers = 2, .shards = 1,
                 .floats = 4u << 20, .bucket = 1u << 20, .elem_bytes = 4, .frame_bytes = 4u << 20, .steps = 20,
                 .warmup = 3, .timeout_ms = 60000, .io_threads = 1};
    enum { O_EP = 256, O_W, O_S, O_P, O_B, O_EB, O_FB, O_STEPS, O_WARM, O_TO, O_IO, O_Q, O_HELP };
    static const struct option opts[] = {
        {"endpoint", required_argument, NULL, O_EP},
        {"workers", required_argument, NULL, O_W},
        {"shards", required_argument, NULL, O_S},
        {"floats", required_argument, NULL, O_P},
        {"bucket-floats", required_argument, NULL, O_B},
        {"elem-bytes", required_argument, NULL, O_EB},
        {"frame-bytes", required_argument, NULL, O_FB},
        {"steps", required_argument, NULL, O_STEPS},
        {"warmup", required_argument, NULL, O_WARM},
        {"timeout-ms", required_argument, NULL, O_TO},
        {"io-threads", required_argument, NULL, O_IO},
        {"quiet", no_argument, NULL, O_Q},
        {"help", no_argument, NULL, O_HELP},
        {NULL, 0, NULL, 0},
    };
    int opt;
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        uint64_t v = 0;
        bool ok = true;
        switch (opt) {
        case O_EP: c->endpoint = optarg; break;
        case O_W:
            ok = s_parse_size("--workers", optarg, 1, S_MAX_WORKERS, &v);
            c->workers = (int)v;
            break;
        case O_S:
            ok = s_parse_size("--shards", optarg, 1, S_MAX_SHARDS, &v);
            c->shards = (int)v;
            break;
        case O_P: ok = s_parse_size("--floats", optarg, 1, 1ull << 32, &c->floats); break;
        case O_B: ok = s_parse_size("--bucket-floats", optarg, 0, 1ull << 32, &c->bucket); break;
        case O_EB:
            ok = s_parse_size("--elem-bytes", optarg, 1, 8, &v);
            c->elem_bytes = (int)v;
            break;
        case O_FB:
            ok = s_parse_size("--frame-bytes", optarg, 8, 1ull << 30, &v);
            c->frame_bytes = (size_t)v;
            break;
        case O_STEPS:
            ok = s_parse_size("--steps", optarg, 1, 1000000, &v);
            c->steps = (int)v;
            break;
        case O_WARM:
            ok = s_parse_size("--warmup", optarg, 0, 1000000, &v);
            c->warmup = (int)v;
            break;
        case O_TO:
            ok = s_parse_size("--timeout-ms", optarg, 1, 3600000, &v);
            c->timeout_ms = (int)v;
            break;
        case O_IO:
            ok = s_parse_size("--io-threads", optarg, 1, 64, &v);
            c->io_threads = (int)v;
            break;
        case O_Q: c->quiet = true; break;
        case O_HELP: s_usage(stdout); exit(0);
        default: ok = false; break;
        }
        if (!ok) {
            s_usage(stderr);
            return false;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "zmq_ceiling: unexpected argument '%s'\n", argv[optind]);
        return false;
    }
    if (strncmp(c->endpoint, "tcp://", 6) != 0 && strncmp(c->endpoint, "ipc://", 6) != 0) {
        fprintf(stderr, "zmq_ceiling: --endpoint must be tcp://... or ipc://...\n");
        return false;
    }
    if (strlen(c->endpoint) > S_EP_LEN - 8) {
        fprintf(stderr, "zmq_ceiling: --endpoint is longer than %d characters\n", S_EP_LEN - 8);
        return false;
    }
    if (c->bucket == 0 || c->bucket > c->floats) {
        c->bucket = c->floats;
    }
    // A frame never splits an element, as zps_wire_check_tensor demands.
    c->frame_bytes -= c->frame_bytes % (size_t)c->elem_bytes;
    uint64_t slice_bytes = s_slice_count(c, 0) * (uint64_t)c->elem_bytes;
    slice_bytes = slice_bytes < c->bucket * (uint64_t)c->elem_bytes
                      ? slice_bytes : c->bucket * (uint64_t)c->elem_bytes;
    if (c->floats < (uint64_t)c->shards ||
        (slice_bytes + c->frame_bytes - 1) / c->frame_bytes > S_MAX_FRAMES) {
        fprintf(stderr, "zmq_ceiling: %" PRIu64 " elements do not split into %d shards of at "
                        "most %d frames\n", c->floats, c->shards, S_MAX_FRAMES);
        return false;
    }
    return true;
}

static int s_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// ---------------------------------------------------------------------------

int main(int argc, char **argv)
{
    s_cfg c;
    if (!s_parse_opts(argc, argv, &c)) {
        return 2;
    }
    // A client's pipe closing under the parent must be an error, not a signal.
    signal(SIGPIPE, SIG_IGN);
    signal(SIGTERM, s_on_signal);
    signal(SIGINT, s_on_signal);
    pid_t parent = getpid();
    int shard_fd[S_MAX_SHARDS];   // parent's read ends: endpoints of shards 1..S-1
    int client_fd[S_MAX_WORKERS]; // parent's write ends: endpoints for each client

    // Fork everything first: no ZeroMQ context may exist before a fork.
    for (int k = 1; k < c.shards; k++) {
        int p[2];
        if (pipe(p) != 0) {
            fprintf(stderr, "zmq_ceiling: pipe: %s\n", strerror(errno));
            s_kill_children();
            return 1;
        }
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "zmq_ceiling: fork: %s\n", strerror(errno));
            s_kill_children();
            return 1;
        }
        if (pid == 0) {
            s_child_init(parent);
            close(p[0]);
            _exit(s_shard_main(&c, k, p[1]));
        }
        close(p[1]);
        shard_fd[k] = p[0];
        s_children[s_n_children++] = (s_child){.pid = pid, .what = "shard", .index = k};
    }
    for (int i = 0; i < c.workers; i++) {
        int p[2];
        if (pipe(p) != 0) {
            fprintf(stderr, "zmq_ceiling: pipe: %s\n", strerror(errno));
            s_kill_children();
            return 1;
        }
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "zmq_ceiling: fork: %s\n", strerror(errno));
            s_kill_children();
            return 1;
        }
        if (pid == 0) {
            s_child_init(parent);
            close(p[1]);
            _exit(s_client_main(&c, i, p[0]));
        }
        close(p[0]);
        client_fd[i] = p[1];
        s_children[s_n_children++] = (s_child){.pid = pid, .what = "client", .index = i};
    }

    int ret = 1;
    int rounds = c.warmup + c.steps + 1;
    double *done_ms = calloc((size_t)rounds + (size_t)c.steps, sizeof *done_ms); // + dt
    char eps[S_MAX_SHARDS][S_EP_LEN];
    memset(eps, 0, sizeof eps);
    void *ctx = s_context(&c);
    void *sock = ctx ? s_socket(ctx, ZMQ_ROUTER, &c) : NULL;
    if (!sock || !done_ms) {
        goto out;
    }
    char want[S_EP_LEN];
    s_shard_endpoint(&c, 0, want, sizeof want);
    size_t len = S_EP_LEN;
    if (zmq_bind(sock, want) != 0 || zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, eps[0], &len) != 0) {
        fprintf(stderr, "zmq_ceiling: cannot bind %s: %s\n", want, zmq_strerror(errno));
        goto out;
    }
    for (int k = 1; k < c.shards; k++) {
        if (!s_read_full(shard_fd[k], eps[k], S_EP_LEN, c.timeout_ms)) {
            fprintf(stderr, "zmq_ceiling: shard %d did not report its endpoint\n", k);
            s_check_children();
            goto out;
        }
        close(shard_fd[k]);
    }
    for (int i = 0; i < c.workers; i++) {
        if (!s_write_full(client_fd[i], eps, (size_t)c.shards * S_EP_LEN)) {
            fprintf(stderr, "zmq_ceiling: cannot hand the endpoints to client %d\n", i);
            s_check_children();
            goto out;
        }
        close(client_fd[i]);
    }
    if (!c.quiet) {
        fprintf(stderr, "zmq_ceiling: %s, %d workers, %d shards, %" PRIu64 " x %d bytes, "
                        "buckets of %" PRIu64 ", frames of %zu bytes, %d+%d steps\n",
                eps[0], c.workers, c.shards, c.floats, c.elem_bytes, c.bucket, c.frame_bytes,
                c.warmup, c.steps);
    }
    if (!s_serve(sock, &c, 0, done_ms)) {
        goto out;
    }
    if (!s_reap_children(c.timeout_ms)) {
        goto out;
    }
    // Step k's time is the gap between the arrivals of rounds k-1 and k's
    // last pushes, as zps's step_ms; the warm-up rounds are left out.
    double *dt = done_ms + rounds;
    for (int i = 0; i < c.steps; i++) {
        dt[i] = done_ms[c.warmup + i + 1] - done_ms[c.warmup + i];
    }
    qsort(dt, (size_t)c.steps, sizeof *dt, s_cmp_double);
    double med = c.steps % 2 ? dt[c.steps / 2] : (dt[c.steps / 2 - 1] + dt[c.steps / 2]) / 2;
    double step_bytes = 2.0 * c.workers * (double)c.floats * c.elem_bytes;
    double bps = step_bytes / (med / 1e3);
    printf("ceiling transport=%.3s workers=%d shards=%d floats=%" PRIu64 " elem_bytes=%d "
           "bucket_floats=%" PRIu64 " frame_bytes=%zu steps=%d warmup=%d step_ms=%.3f step_ms_min=%.3f step_ms_max=%.3f "
           "bytes_per_step=%.0f bytes_per_s=%.0f gbytes_per_s=%.3f\n",
           c.endpoint, c.workers, c.shards, c.floats, c.elem_bytes, c.bucket, c.frame_bytes, c.steps,
           c.warmup, med, dt[0], dt[c.steps - 1], step_bytes, bps, bps / 1e9);
    fflush(stdout);
    ret = 0;
out:
    if (ret != 0) {
        s_kill_children();
    }
    if (sock) {
        zmq_close(sock);
    }
    if (ctx) {
        zmq_ctx_term(ctx);
    }
    s_unlink_ipc(eps[0]);
    free(done_ms);
    return ret;
}
