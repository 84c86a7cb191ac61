/* zps_conn.c - libzps's wire client (zps_conn.h). */
#include "lib/zps_conn.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/zps_clock.h"
#include "common/zps_log.h"
#include "common/zps_sndbuf.h"

#define ZPS_CONN_WAIT_LOG_MS 5000.0
#define ZPS_CONN_HELLO_AGAIN_MS 3000 // waiting for the JOB: HELLO again this often

zps_conn_verdict zps_conn_judge(const Zps__Header *h, const char *from)
{
    zps_err code = h->error_code > 0 && h->error_code < ZPS_ECOUNT_ ? (zps_err)h->error_code
                                                                    : ZPS_EPROTO;
    const char *what = zps_wire_type_name((int)h->refused);
    const char *why = h->error ? h->error : "";
    switch (code) {
    case ZPS_EAGAIN:
        zps_log_info("%s: not yet (%s of step %llu): %s; sending again", from, what,
                     (unsigned long long)h->step, why);
        return ZPS_CONN_RETRY;
    case ZPS_ECLOSED:
        zps_log_info("%s: the job is over: %s", from, why);
        return ZPS_CONN_OVER;
    case ZPS_ENOENT:
    case ZPS_ESTALE:
        zps_log_warn("%s refused %s of step %llu: %s (%s); asking the coordinator where the job "
                     "is", from, what, (unsigned long long)h->step, why, zps_strerror(code));
        return ZPS_CONN_LOST;
    default:
        zps_log_error("%s refused this worker for good: %s (%s)", from, why,
                      zps_strerror(code));
        return ZPS_CONN_FINAL;
    }
}

// A refusal of a push or pull, received while waiting for something else
// (the JOB, a STATUS reply): the answer to one sent before, by the member
// of before when joining again after a pause. It says nothing of what is
// awaited, and is not judged (its verdict would be logged as if it were).
// Any other refusal counts: of the HELLO, or naming no message, as a
// coordinator recovering from a restart refuses; and the end of the job
// ends the wait whichever message it refused.
static bool s_of_before(const Zps__Header *h)
{
    return h->type == ZPS__MSG_TYPE__ERROR && h->error_code != ZPS_ECLOSED &&
           (h->refused == ZPS__MSG_TYPE__PUSH || h->refused == ZPS__MSG_TYPE__PULL);
}

zps_err zps_conn_await(zps_conn *n, void *sock, const char *what, const char *endpoint,
                       int timeout_ms, zps_wire_msg *m)
{
    double start = zps_clock_ms(), next_log = start + ZPS_CONN_WAIT_LOG_MS;
    for (;;) {
        zps_err err = zps_wire_recv(sock, false, m);
        if (err == ZPS_OK && s_of_before(m->hdr)) {
            zps_log_debug("%s: an old refusal of a %s, ignored", endpoint,
                          zps_wire_type_name((int)m->hdr->refused));
            zps_wire_msg_fini(m);
            continue;
        }
        if (err == ZPS_OK && m->hdr->type == ZPS__MSG_TYPE__ERROR) {
            switch (zps_conn_judge(m->hdr, endpoint)) {
            case ZPS_CONN_RETRY: return ZPS_EAGAIN;
            case ZPS_CONN_OVER: return ZPS_ECLOSED;
            default:
                return m->hdr->error_code > 0 && m->hdr->error_code < ZPS_ECOUNT_
                           ? (zps_err)m->hdr->error_code : ZPS_EPROTO;
            }
        }
        if (err != ZPS_ETIMEDOUT) {
            if (err != ZPS_OK) {
                zps_log_error("bad reply from %s while waiting for %s: %s", endpoint, what,
                              zps_strerror(err));
            }
            return err;
        }
        zps_wire_msg_fini(m);
        if (n->stop) {
            return ZPS_ECLOSED;
        }
        double now = zps_clock_ms();
        if (now - start > timeout_ms) {
            if (timeout_ms > ZPS_CONN_HELLO_AGAIN_MS) { // shorter waits are retried or asked again
                zps_log_error("gave up after %.0f s waiting for %s from %s",
                              (now - start) / 1e3, what, endpoint);
            }
            return ZPS_ETIMEDOUT;
        }
        if (now > next_log) {
            zps_log_info("waiting %.0f s for %s from %s", (now - start) / 1e3, what, endpoint);
            next_log = now + ZPS_CONN_WAIT_LOG_MS;
        }
    }
}

// What every send to a shard does around the send: this member's identity
// on the header before, the count of gradient bytes or the log line after.
static void s_identify(const zps_conn *n, Zps__Header *h)
{
    h->job_id = n->job_id;
    h->rank = n->rank;
    h->member_id = n->member_id;
}

// A push to shard 0 is heard by the coordinator there as a heartbeat
// (the server notes every push of a live member): the thread's next beat
// waits an interval from it.
static zps_err s_sent(zps_conn *n, int shard, const Zps__Header *h, size_t bytes, zps_err err)
{
    if (err == ZPS_OK && h->type == ZPS__MSG_TYPE__PUSH) {
        n->pushed_bytes += bytes;
        if (shard == 0) {
            zps_heartbeat_heard(n->heartbeat);
        }
    }
    if (err != ZPS_OK) {
        zps_log_error("could not send %s to %s: %s", zps_wire_type_name(h->type),
                      n->shards[shard].endpoint, zps_strerror(err));
    }
    return err;
}

zps_err zps_conn_send(zps_conn *n, int shard, Zps__Header *h, const void *payload, size_t bytes,
                      zps_wire_ref *ref)
{
    s_identify(n, h);
    zps_err err = zps_wire_send(n->shards[shard].sock, NULL, h, payload, bytes, ref);
    return s_sent(n, shard, h, bytes, err);
}

int zps_conn_bucket_of(const zps_conn_shard *sc, uint64_t lo, uint64_t hi)
{
    for (int b = 0; b < sc->n_buckets; b++) {
        if (sc->buckets[b].lo == lo && sc->buckets[b].hi == hi) {
            return b;
        }
    }
    return -1;
}

zps_err zps_conn_send_frames(zps_conn *n, int shard, Zps__Header *h, zmq_msg_t *frames,
                             int n_frames)
{
    s_identify(n, h);
    size_t bytes = 0;
    for (int f = 0; f < n_frames; f++) {
        bytes += zmq_msg_size(&frames[f]);
    }
    zps_err err = zps_wire_send_frames(n->shards[shard].sock, NULL, h, frames, n_frames);
    return s_sent(n, shard, h, bytes, err);
}

static zps_err s_hello(zps_conn *n)
{
    char host[64] = "?";
    gethostname(host, sizeof host - 1);
    Zps__Hello hello = ZPS__HELLO__INIT;
    hello.host = host;
    hello.device = n->device;
    hello.share = n->share;
    hello.pid = (uint32_t)getpid();
    hello.boot_id = n->boot;
    if (n->decl && zps_decl_any(n->decl)) {
        hello.layout = (Zps__Layout *)&n->decl->layout;
        hello.n_train = n->decl->n_train;
        hello.n_test = n->decl->n_test;
        hello.declares_schedule = n->decl->announces_table;
    }
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__HELLO);
    h.hello = &hello;
    // Not zps_conn_send, which reports a failed send as an error: a HELLO
    // that finds no connection (libzmq drops one whose CURVE handshake the
    // server refused) is tried again until the join deadline, and the
    // give-up line says why.
    s_identify(n, &h);
    return zps_wire_send(n->shards[0].sock, NULL, &h, NULL, 0, NULL);
}

static void s_sleep_ms(double ms)
{
    if (ms > 0) {
        struct timespec ts = {(time_t)(ms / 1000), (long)(fmod(ms, 1000.0) * 1e6)};
        nanosleep(&ts, NULL);
    }
}

// The JOB, until the deadline but at most ZPS_CONN_HELLO_AGAIN_MS: a
// coordinator that restarted since the HELLO has forgotten a joiner that
// had no JOB yet (it admits a HELLO from the same socket once).
static zps_err s_await_job(zps_conn *n, double deadline, zps_wire_msg *m)
{
    int left = (int)(deadline - zps_clock_ms());
    left = left < ZPS_CONN_HELLO_AGAIN_MS ? left : ZPS_CONN_HELLO_AGAIN_MS;
    return zps_conn_await(n, n->shards[0].sock, "the job to start", n->shards[0].endpoint,
                          left > 100 ? left : 100, m);
}

zps_err zps_conn_hello_until_job(zps_conn *n, int join_timeout_ms, zps_wire_msg *m)
{
    double start = zps_clock_ms(), deadline = start + join_timeout_ms;
    for (;;) {
        zps_err err = s_hello(n);
        bool sent = err == ZPS_OK;
        if (sent) {
            err = s_await_job(n, deadline, m);
        } else if (err != ZPS_ETIMEDOUT) {
            zps_log_error("could not send HELLO to %s: %s", n->shards[0].endpoint,
                          zps_strerror(err));
            return err;
        }
        while (err == ZPS_OK && m->hdr->type != ZPS__MSG_TYPE__JOB && zps_clock_ms() < deadline) {
            // Joining again: what the coordinator sent the member of before
            // (plans, rollbacks) may still be queued; its refusals of pushes
            // and pulls zps_conn_await skips. The JOB is what counts.
            zps_wire_msg_fini(m);
            err = s_await_job(n, deadline, m);
        }
        if (err == ZPS_ETIMEDOUT && zps_clock_ms() < deadline && !n->stop) {
            zps_log_info("waiting %.0f s for the job to start from %s: %s",
                         (zps_clock_ms() - start) / 1e3, n->shards[0].endpoint,
                         sent ? "saying HELLO again" : "no connection to say HELLO on yet");
            continue;
        }
        if (err == ZPS_ETIMEDOUT) {
            // A CURVE handshake the server refuses is silent on the wire.
            zps_log_error("gave up after %.0f s waiting for the job to start from %s (the join "
                          "timeout: ZPS_OPT_JOIN_TIMEOUT_MS, zps-worker's --join-timeout-ms)%s",
                          join_timeout_ms / 1e3, n->shards[0].endpoint,
                          n->curve.on ? "; with CURVE, is this worker's public key among the "
                                        "server's --authorized-keys?" : "");
        }
        if (err != ZPS_EAGAIN || zps_clock_ms() + ZPS_CONN_POLL_MS > deadline || n->stop) {
            return err; // m: the caller finishes it, whatever it holds
        }
        zps_wire_msg_fini(m);
        zps_log_info("saying HELLO again in %d ms", ZPS_CONN_POLL_MS);
        s_sleep_ms(ZPS_CONN_POLL_MS);
    }
}

zps_err zps_conn_take_shards(zps_conn *n, const Zps__Job *job, const zps_model_spec *model)
{
    if (job->n_shards == 0 || job->n_shards > ZPS_CONN_MAX_SHARDS) {
        zps_log_error("job names %zu shards (1..%d)", job->n_shards, ZPS_CONN_MAX_SHARDS);
        return ZPS_EPROTO;
    }
    uint64_t next = 0;
    for (size_t i = 0; i < job->n_shards; i++) {
        const Zps__ShardInfo *si = job->shards[i];
        if (si->index != i || si->lo != next || si->hi <= si->lo) {
            zps_log_error("job's shard %zu range [%llu, %llu) does not follow the previous one",
                          i, (unsigned long long)si->lo, (unsigned long long)si->hi);
            return ZPS_EPROTO;
        }
        next = si->hi;
        zps_conn_shard *sc = &n->shards[i];
        sc->lo = si->lo;
        sc->hi = si->hi;
        if (i == 0) {
            continue; // the coordinator's socket, already connected
        }
        if (sc->sock && strcmp(sc->endpoint, si->endpoint) == 0) {
            continue; // joining again: the connection of before serves
        }
        if (sc->sock) {
            (void)zmq_close(sc->sock); // fails only for a handle that is not a socket
        }
        snprintf(sc->endpoint, sizeof sc->endpoint, "%s", si->endpoint);
        sc->sock = zps_wire_socket(n->ctx, ZMQ_DEALER, ZPS_CONN_POLL_MS);
        zps_curve cv = n->curve; // a shard with a key pair of its own: the coordinator knows it
        if (i < job->n_shard_keys && strlen(job->shard_keys[i]) == ZPS_CURVE_KEY_LEN) {
            memcpy(cv.server, job->shard_keys[i], sizeof cv.server);
        }
        if (!sc->sock || zps_sndbuf_apply(n->ctx, sc->sock, n->sndbuf) != ZPS_OK ||
            zps_curve_client(&cv, sc->sock) != ZPS_OK ||
            zmq_connect(sc->sock, sc->endpoint) != 0) {
            zps_log_error("cannot connect to shard %zu at %s", i, sc->endpoint);
            return ZPS_EIO;
        }
    }
    n->n_shards = (int)job->n_shards;
    for (int i = 0; i < n->n_shards; i++) {
        zps_conn_shard *sc = &n->shards[i];
        sc->n_buckets = zps_model_range_buckets(model, sc->lo, sc->hi, sc->buckets);
    }
    if (next != model->n_params) {
        zps_log_error("shards cover %llu parameters, the model has %zu",
                      (unsigned long long)next, model->n_params);
        return ZPS_EPROTO;
    }
    return ZPS_OK;
}

void zps_conn_beat(zps_conn *n)
{
    zps_heartbeat_stop(&n->heartbeat);
    n->heartbeat = zps_heartbeat_start(n->ctx, n->shards[0].endpoint, &n->curve, n->job_id,
                                       n->rank, n->member_id, n->heartbeat_ms);
}

void zps_conn_open_ask(zps_conn *n)
{
    void *sock = zps_wire_socket(n->ctx, ZMQ_DEALER, 10);
    if (!sock || zps_curve_client(&n->curve, sock) != ZPS_OK ||
        zmq_connect(sock, n->shards[0].endpoint) != 0) {
        zps_log_warn("no second socket to %s: a long pause will be followed by computing a "
                     "step that may be over", n->shards[0].endpoint);
        if (sock) {
            (void)zmq_close(sock); // fails only for a handle that is not a socket
        }
        return;
    }
    n->ask = sock;
}

zps_err zps_conn_ask(zps_conn *n, int timeout_ms, zps_wire_msg *m)
{
    zmq_pollitem_t item = {.socket = n->ask, .events = ZMQ_POLLIN};
    while (n->ask && zmq_poll(&item, 1, 0) > 0) {
        zps_err late = zps_wire_recv(n->ask, false, m); // an answer past its bound
        zps_wire_msg_fini(m);
        if (late != ZPS_OK) {
            break;
        }
    }
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__STATUS);
    h.job_id = n->job_id;
    h.rank = n->rank;
    h.member_id = n->member_id;
    zps_err err = !n->ask ? ZPS_ECLOSED : zps_wire_send(n->ask, NULL, &h, NULL, 0, NULL);
    if (err == ZPS_OK) {
        err = zps_conn_await(n, n->ask, "the coordinator's step", n->shards[0].endpoint,
                             timeout_ms, m);
    }
    if (err == ZPS_OK && (m->hdr->type != ZPS__MSG_TYPE__STATUS_REPLY || !m->hdr->status)) {
        zps_wire_msg_fini(m);
        err = ZPS_EPROTO;
    }
    return err;
}

zps_err zps_conn_send_init(zps_conn *n, int i, const float *params)
{
    const zps_conn_shard *sc = &n->shards[i];
    zps_err err = ZPS_OK;
    for (int b = 0; err == ZPS_OK && b < sc->n_buckets; b++) {
        Zps__Header h;
        zps_wire_header_init(&h, ZPS__MSG_TYPE__INIT);
        h.shard = (uint32_t)i;
        h.offset = sc->buckets[b].lo;
        h.count = sc->buckets[b].hi - sc->buckets[b].lo;
        h.dtype = ZPS__DTYPE__F32; // initial values keep every bit, whatever the wire dtype
        if (n->decl && n->decl->table.n_lr > 0) {
            h.schedule = (Zps__Schedule *)&n->decl->table; // every INIT: the shard compares
        }
        err = zps_conn_send(n, i, &h, params + h.offset, h.count * sizeof(float), NULL);
    }
    return err;
}

zps_err zps_conn_pull(zps_conn *n, int i, uint64_t step)
{
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__PULL);
    h.shard = (uint32_t)i;
    h.step = step;
    return zps_conn_send(n, i, &h, NULL, 0, NULL);
}

// Whether shard i's endpoint is on this host: loopback, ipc, or this
// host's name (ZPS_CONN_SHM_AUTO offers shared memory to those only).
static bool s_endpoint_here(const char *ep)
{
    if (strncmp(ep, "ipc://", 6) == 0 || strncmp(ep, "tcp://127.", 10) == 0 ||
        strncmp(ep, "tcp://localhost:", 16) == 0 || strncmp(ep, "tcp://[::1]:", 12) == 0) {
        return true;
    }
    char host[256] = "";
    size_t len;
    if (strncmp(ep, "tcp://", 6) != 0 || gethostname(host, sizeof host - 1) != 0 ||
        !(len = strlen(host))) {
        return false;
    }
    return strncmp(ep + 6, host, len) == 0 && ep[6 + len] == ':';
}

void zps_conn_shm_refused(zps_conn *n, int i, const char *why)
{
    zps_conn_shard *sc = &n->shards[i];
    if (!sc->shm_off) {
        zps_log_info("%s: %s; pushing frames from now on", sc->endpoint, why ? why : "");
    }
    sc->shm_off = true;
    zps_shm_seg_fini(&sc->seg);
}

// Where piece p of step goes in shard i's segment, when it goes through
// shared memory: the half of the step's parity (the shard has read the
// other before this worker sees the parameters that let it compute the
// step after). A second piece of the same step would overwrite the first
// before the shard read it: frames, as would a shard that refused; NULL.
static uint8_t *s_shm_half(zps_conn *n, int i, uint64_t step, const zps_piece *p,
                           zps_dtype dtype)
{
    zps_conn_shard *sc = &n->shards[i];
    if (n->shm == ZPS_CONN_SHM_OFF || sc->shm_off || !n->boot[0] ||
        (n->shm == ZPS_CONN_SHM_AUTO && !s_endpoint_here(sc->endpoint))) {
        return NULL;
    }
    if (sc->shm_step == step + 1 &&
        (sc->shm_piece.offset != p->offset || sc->shm_piece.count != p->count)) {
        return NULL;
    }
    size_t half = (size_t)(sc->hi - sc->lo) * zps_dtype_size(dtype);
    if (sc->seg.size != 2 * half) {
        zps_shm_seg_fini(&sc->seg);
        char why[200];
        if (zps_shm_seg_create(&sc->seg, 2 * half, why, sizeof why) != ZPS_OK) {
            zps_conn_shm_refused(n, i, why);
            return NULL;
        }
        zps_log_info("%s: pushes through shared memory (%.1f MiB)", sc->endpoint,
                     (double)sc->seg.size / (1 << 20));
    }
    sc->shm_step = step + 1;
    sc->shm_piece = *p;
    return (uint8_t *)sc->seg.base + (step & 1) * half;
}

zps_err zps_conn_push(zps_conn *n, int i, uint64_t step, const zps_piece *p, uint64_t lo,
                      uint64_t hi, zps_dtype dtype, const float *grad, uint8_t *wire, float loss,
                      float data_ms, float compute_ms, zps_wire_ref *ref)
{
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__PUSH);
    h.step = step;
    h.shard = (uint32_t)i;
    h.offset = lo;
    h.count = hi - lo;
    h.dtype = (Zps__DType)dtype;
    h.samples = p->count;
    h.batch_offset = p->offset;
    h.generation = p->gen;
    h.loss = loss;
    h.data_ms = data_ms;
    h.compute_ms = compute_ms;
    const float *g = grad + lo;
    const void *payload = g;
    size_t esize = zps_dtype_size(dtype);
    uint8_t *half = s_shm_half(n, i, step, p, dtype);
    if (half) {
        const zps_conn_shard *sc = &n->shards[i];
        uint8_t *dst = half + (lo - sc->lo) * esize;
        zps_dtype_from_f32(dtype, g, dst, h.count); // a copy for fp32
        h.shm_size = sc->seg.size;
        h.shm_offset = (uint64_t)(dst - (uint8_t *)sc->seg.base);
        h.shm_pid = (uint32_t)getpid();
        h.shm_fd = (uint32_t)sc->seg.fd;
        h.shm_boot = n->boot;
        h.params_shm = !n->params_frames && !sc->params_frames;
        h.params_whole = h.params_shm; // one notice a step (zps_wait.c)
        return zps_conn_send(n, i, &h, NULL, 0, NULL);
    }
    if (dtype != ZPS_DTYPE_F32) {
        payload = wire + lo * esize;
        zps_dtype_from_f32(dtype, g, wire + lo * esize, h.count);
    }
    return zps_conn_send(n, i, &h, payload, h.count * esize, ref);
}

// Maps the segment of parameters h names (kept if it is already), checked
// as zps_conn_params_named says; the reason of a refusal in why.
static zps_err s_params_map(zps_conn *n, zps_conn_shard *sc, const Zps__Header *h, size_t esize,
                            char *why, size_t why_len)
{
    if (n->shm == ZPS_CONN_SHM_OFF || n->params_frames || sc->params_frames) {
        snprintf(why, why_len, "this worker takes parameters as frames");
        return ZPS_EPERM;
    }
    if (!n->boot[0] || !h->shm_boot || strcmp(h->shm_boot, n->boot) != 0) {
        snprintf(why, why_len, "the shard is on another host (boot id)");
        return ZPS_EPERM;
    }
    uint64_t most = ZPS_SHM_PARAMS_DATA + (sc->hi - sc->lo) * esize;
    if (h->shm_size > most) {
        snprintf(why, why_len, "a segment of %llu bytes; the shard's range takes %llu",
                 (unsigned long long)h->shm_size, (unsigned long long)most);
        return ZPS_ERANGE;
    }
    if (zps_shm_map_is(&sc->params, h->shm_pid, h->shm_fd, h->shm_size)) {
        return ZPS_OK;
    }
    zps_shm_map fresh;
    zps_err err = zps_shm_map_open_as(&fresh, ZPS_SHM_PARAMS_NAME, h->shm_pid, h->shm_fd,
                                      h->shm_size, why, why_len);
    if (err != ZPS_OK) {
        return err;
    }
    zps_shm_map_fini(&sc->params); // a shard restarted: its new segment
    sc->params = fresh;
    zps_log_info("%s: parameters through shared memory (%.1f MiB)", sc->endpoint,
                 (double)h->shm_size / (1 << 20));
    return ZPS_OK;
}

zps_err zps_conn_params_named(zps_conn *n, int i, uint32_t b, const Zps__Header *h,
                              size_t esize, zps_conn_shared *out)
{
    zps_conn_shard *sc = &n->shards[i];
    char why[200];
    zps_err err = s_params_map(n, sc, h, esize, why, sizeof why);
    if (err == ZPS_OK && h->count > (sc->hi - sc->lo)) {
        snprintf(why, sizeof why, "a bucket of %llu elements", (unsigned long long)h->count);
        err = ZPS_ERANGE;
    }
    if (err == ZPS_OK) {
        *out = (zps_conn_shared){.bucket = b, .step = h->step, .offset = h->offset,
                                 .count = h->count, .data_at = h->shm_offset,
                                 .bytes = (size_t)(h->count * esize), .pid = h->shm_pid,
                                 .fd = h->shm_fd, .size = h->shm_size};
        const void *src;
        err = zps_shm_params_peek(&sc->params, b, out->step, out->offset, out->count,
                                  out->data_at, out->bytes, &src, &out->seq, why, sizeof why);
    }
    if (err == ZPS_ESTALE) {
        zps_log_info("%s: %s; asking for frames", sc->endpoint, why);
    } else if (err != ZPS_OK) {
        zps_log_warn("%s: parameters through shared memory refused: %s; frames from now on",
                     sc->endpoint, why);
        sc->params_frames = true;
        zps_shm_map_fini(&sc->params);
    }
    return err;
}

const void *zps_conn_params_at(zps_conn *n, int i, const zps_conn_shared *s)
{
    zps_conn_shard *sc = &n->shards[i];
    char why[200] = "";
    const void *src = NULL;
    uint64_t seq = 0;
    if (!zps_shm_map_is(&sc->params, s->pid, s->fd, s->size)) {
        snprintf(why, sizeof why, "the shard's segment changed (a shard restarted)");
    } else if (zps_shm_params_peek(&sc->params, s->bucket, s->step, s->offset, s->count,
                                   s->data_at, s->bytes, &src, &seq, why, sizeof why) == ZPS_OK &&
               seq != s->seq) {
        snprintf(why, sizeof why, "bucket %u of step %llu written again", s->bucket,
                 (unsigned long long)s->step);
    } else if (src) {
        return src;
    }
    zps_log_info("%s: %s; asking for frames", sc->endpoint, why);
    return NULL;
}

bool zps_conn_params_still(zps_conn *n, int i, const zps_conn_shared *s)
{
    zps_conn_shard *sc = &n->shards[i];
    if (zps_shm_params_still(&sc->params, s->bucket, s->seq)) {
        return true;
    }
    zps_log_info("%s: bucket %u of step %llu written over while read; asking for frames",
                 sc->endpoint, s->bucket, (unsigned long long)s->step);
    return false;
}

zps_err zps_conn_push_delta(zps_conn *n, int i, uint64_t step, const zps_piece *p, uint64_t lo,
                            uint64_t hi, const void *payload, size_t len,
                            const zps_conn_outer *o, float loss, float compute_ms,
                            zps_wire_ref *ref)
{
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__PUSH);
    h.step = step;
    h.shard = (uint32_t)i;
    h.offset = lo;
    h.count = hi - lo;
    h.dtype = ZPS__DTYPE__F32;
    h.samples = p->count;
    h.batch_offset = p->offset;
    h.generation = p->gen;
    h.loss = loss;
    h.compute_ms = compute_ms;
    h.inner_steps = o->inner_steps;
    h.compress = o->compress;
    h.delta_norm = o->delta_norm;
    h.round_bytes = o->round_bytes;
    return zps_conn_send(n, i, &h, payload, len, ref);
}

// Whether the environment variable name says off; on (the default) for
// anything else, a value other than on or off logged.
static bool s_env_off(const char *name)
{
    const char *v = getenv(name);
    bool off = v && strcmp(v, "off") == 0;
    if (v && !off && strcmp(v, "on") != 0) {
        zps_log_warn("%s: '%s' is not on or off; on, the default", name, v);
    }
    return off;
}

zps_err zps_conn_init(zps_conn *n, const char *coordinator)
{
    memset(n, 0, sizeof *n);
    snprintf(n->device, sizeof n->device, "cpu");
    n->heartbeat_ms = 1000;
    n->shm = ZPS_CONN_SHM_AUTO;
    n->sndbuf = ZPS_SNDBUF_AUTO;
    (void)zps_shm_boot_id(n->boot); // "" if unreadable: no shared memory
    // Parameters through a same-host shard's segment, and parts to a host's
    // leader through the follower's, unless turned off (docs/choices.md,
    // "One pull per host", "One push per host").
    n->params_frames = s_env_off("ZPS_SHM_PARAMS");
    n->host_frames = s_env_off("ZPS_SHM_HOST");
    snprintf(n->shards[0].endpoint, sizeof n->shards[0].endpoint, "%s", coordinator);
    n->ctx = zmq_ctx_new();
    return n->ctx ? ZPS_OK : ZPS_ENOMEM;
}

void zps_conn_fini(zps_conn *n)
{
    zps_heartbeat_stop(&n->heartbeat);
    if (n->ask) {
        (void)zmq_close(n->ask); // fails only for a handle that is not a socket
        n->ask = NULL;
    }
    for (int i = 0; i < ZPS_CONN_MAX_SHARDS; i++) {
        if (n->shards[i].sock) {
            (void)zmq_close(n->shards[i].sock);
            n->shards[i].sock = NULL;
        }
        zps_shm_seg_fini(&n->shards[i].seg);
        zps_shm_map_fini(&n->shards[i].params);
    }
    if (n->ctx) {
        zmq_ctx_term(n->ctx); // flushes the BYE within the linger, releases the gradient's frames
        n->ctx = NULL;
    }
}

zps_err zps_conn_connect(zps_conn *n)
{
    zps_conn_shard *coord = &n->shards[0];
    if (coord->sock) {
        return ZPS_OK;
    }
    coord->sock = zps_wire_socket(n->ctx, ZMQ_DEALER, ZPS_CONN_POLL_MS);
    if (!coord->sock || zps_sndbuf_apply(n->ctx, coord->sock, n->sndbuf) != ZPS_OK ||
        zps_curve_client(&n->curve, coord->sock) != ZPS_OK ||
        zmq_connect(coord->sock, coord->endpoint) != 0) {
        zps_log_error("cannot connect to %s: %s", coord->endpoint, zmq_strerror(errno));
        return ZPS_EIO;
    }
    return ZPS_OK;
}
