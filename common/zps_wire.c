/* zps_wire.c - framing, decoding and bounds checks of zps messages. */
#include "zps_wire.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "zps_clock.h"
#include "zps_dtype.h"
#include "zps_log.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tensors travel as raw little-endian frames: a big-endian host needs byte swaps here"
#endif

void *zps_wire_socket(void *ctx, int type, int timeout_ms)
{
    void *s = zmq_socket(ctx, type);
    if (!s) {
        zps_log_error("zmq_socket: %s", zmq_strerror(errno));
        return NULL;
    }
    int linger = 2000;
    int64_t maxmsg = ZPS_WIRE_MAX_MSG_BYTES;
    int hwm = 0; // bounded by the protocol: a peer has at most one step in flight
    if (zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger) ||
        zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) ||
        zmq_setsockopt(s, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms) ||
        zmq_setsockopt(s, ZMQ_SNDTIMEO, &timeout_ms, sizeof timeout_ms) ||
        zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm) ||
        zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm)) {
        zps_log_error("zmq_setsockopt: %s", zmq_strerror(errno));
        zps_wire_close(&s);
        return NULL;
    }
    return s;
}

zps_err zps_wire_set_sndbuf(void *sock, int bytes)
{
    if (bytes <= 0) {
        return ZPS_OK;
    }
    if (zmq_setsockopt(sock, ZMQ_SNDBUF, &bytes, sizeof bytes) != 0) {
        zps_log_error("zmq_setsockopt ZMQ_SNDBUF %d: %s", bytes, zmq_strerror(errno));
        return ZPS_EIO;
    }
    return ZPS_OK;
}

zps_err zps_wire_set_rcvhwm(void *sock, int messages)
{
    if (zmq_setsockopt(sock, ZMQ_RCVHWM, &messages, sizeof messages) != 0) {
        zps_log_error("zmq_setsockopt ZMQ_RCVHWM %d: %s", messages, zmq_strerror(errno));
        return ZPS_EIO;
    }
    return ZPS_OK;
}

void zps_wire_header_init(Zps__Header *h, Zps__MsgType type)
{
    zps__header__init(h);
    h->version = ZPS_WIRE_VERSION;
    h->type = type;
}

// Drops the remaining parts of a message we refuse to hold.
static void s_drain(void *sock)
{
    int more = 1;
    size_t len = sizeof more;
    while (zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &len) == 0 && more) {
        zmq_msg_t part;
        ZPS_ASSERT(zmq_msg_init(&part) == 0);
        int rc = zmq_msg_recv(&part, sock, 0);
        ZPS_ASSERT(zmq_msg_close(&part) == 0);
        if (rc < 0) {
            break;
        }
        len = sizeof more;
    }
}

static bool s_more(void *sock)
{
    int more = 0;
    size_t len = sizeof more;
    return zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &len) == 0 && more;
}

// Copies one metadata property of a received frame ("" when the transport
// has none, as inproc, or the name is unknown).
static void s_meta(zmq_msg_t *frame, const char *name, char *out)
{
    const char *v = zmq_msg_gets(frame, name);
    snprintf(out, ZPS_WIRE_META_LEN, "%s", v ? v : "");
}

zps_err zps_wire_recv(void *sock, bool router, zps_wire_msg *m)
{
    memset(m, 0, sizeof *m);
    zmq_msg_t head;
    if (router) {
        ZPS_ASSERT(zmq_msg_init(&m->route) == 0);
        if (zmq_msg_recv(&m->route, sock, 0) < 0) {
            int e = errno;
            ZPS_ASSERT(zmq_msg_close(&m->route) == 0);
            return e == EAGAIN ? ZPS_ETIMEDOUT : ZPS_EIO;
        }
        m->has_route = true;
        s_meta(&m->route, "Peer-Address", m->peer);
        if (!s_more(sock)) {
            return ZPS_EPROTO;
        }
    }
    ZPS_ASSERT(zmq_msg_init(&head) == 0);
    if (zmq_msg_recv(&head, sock, 0) < 0) {
        int e = errno;
        ZPS_ASSERT(zmq_msg_close(&head) == 0);
        return e == EAGAIN ? ZPS_ETIMEDOUT : ZPS_EIO;
    }
    // Who sent it, from the connection: the table of who may send what
    // (server/zps_msgtab.h) reads the role ZAP gave the key, and refusals
    // name the address.
    s_meta(&head, "Peer-Address", m->peer);
    s_meta(&head, "User-Id", m->user_id);
    m->hdr = zps__header__unpack(NULL, zmq_msg_size(&head), zmq_msg_data(&head));
    ZPS_ASSERT(zmq_msg_close(&head) == 0);
    while (s_more(sock)) {
        if (m->n_frames == ZPS_WIRE_MAX_FRAMES) {
            s_drain(sock);
            return ZPS_EPROTO;
        }
        zmq_msg_t *f = &m->frames[m->n_frames];
        ZPS_ASSERT(zmq_msg_init(f) == 0);
        if (zmq_msg_recv(f, sock, 0) < 0) {
            ZPS_ASSERT(zmq_msg_close(f) == 0);
            return ZPS_EIO;
        }
        m->n_frames++;
        m->payload_bytes += zmq_msg_size(f);
    }
    if (!m->hdr) {
        return ZPS_EPROTO;
    }
    if (m->hdr->version != ZPS_WIRE_VERSION) {
        return ZPS_EVERSION;
    }
    return ZPS_OK;
}

// zmq_msg_init, _close, _move and _copy fail only on a message that is not
// one (EFAULT): a bug here, never the peer's doing.
void zps_wire_msg_fini(zps_wire_msg *m)
{
    if (m->has_route) {
        ZPS_ASSERT(zmq_msg_close(&m->route) == 0);
        m->has_route = false;
    }
    if (m->hdr) {
        zps__header__free_unpacked(m->hdr, NULL);
        m->hdr = NULL;
    }
    for (int i = 0; i < m->n_frames; i++) {
        ZPS_ASSERT(zmq_msg_close(&m->frames[i]) == 0);
    }
    m->n_frames = 0;
}

void zps_wire_msg_move(zps_wire_msg *dst, zps_wire_msg *src)
{
    memset(dst, 0, sizeof *dst);
    memcpy(dst->peer, src->peer, sizeof dst->peer);
    memcpy(dst->user_id, src->user_id, sizeof dst->user_id);
    if (src->has_route) {
        ZPS_ASSERT(zmq_msg_init(&dst->route) == 0);
        ZPS_ASSERT(zmq_msg_move(&dst->route, &src->route) == 0);
        dst->has_route = true;
        ZPS_ASSERT(zmq_msg_close(&src->route) == 0);
        src->has_route = false;
    }
    dst->hdr = src->hdr;
    src->hdr = NULL;
    for (int i = 0; i < src->n_frames; i++) {
        ZPS_ASSERT(zmq_msg_init(&dst->frames[i]) == 0);
        ZPS_ASSERT(zmq_msg_move(&dst->frames[i], &src->frames[i]) == 0);
        ZPS_ASSERT(zmq_msg_close(&src->frames[i]) == 0);
    }
    dst->n_frames = src->n_frames;
    dst->payload_bytes = src->payload_bytes;
    src->n_frames = 0;
}

void zps_wire_route_copy(zmq_msg_t *dst, zmq_msg_t *src)
{
    ZPS_ASSERT(zmq_msg_init(dst) == 0);
    ZPS_ASSERT(zmq_msg_copy(dst, src) == 0);
}

void zps_wire_route_close(zmq_msg_t *r)
{
    ZPS_ASSERT(zmq_msg_close(r) == 0);
}

void zps_wire_close(void **sock)
{
    if (*sock && zmq_close(*sock) != 0) {
        zps_log_warn("zmq_close: %s", zmq_strerror(errno));
    }
    *sock = NULL;
}

// ZeroMQ calls this from its I/O thread once a zero-copy frame is sent:
// it may only release the reference.
static void s_release(void *data, void *hint)
{
    (void)data;
    atomic_fetch_sub_explicit(&((zps_wire_ref *)hint)->inflight, 1, memory_order_release);
}

// ---------------------------------------------------------------------------
// Sending: build every part, then send them all.

#define S_MAX_PARTS (ZPS_WIRE_MAX_FRAMES + 2) // routing id, header, payload frames
#define S_EINTR_TRIES 100                     // a part interrupted this often: give up

static atomic_int s_fault_build = -1; // zps_wire_inject_fault
static atomic_int s_fault_eintr = -1;

void zps_wire_inject_fault(zps_wire_fault kind, int nth)
{
    atomic_store(kind == ZPS_WIRE_FAULT_BUILD ? &s_fault_build : &s_fault_eintr, nth);
}

// Whether building part i of a message is to fail (fault injection).
static bool s_build_fails(int i)
{
    return atomic_load_explicit(&s_fault_build, memory_order_relaxed) == i;
}

static zps_err s_build_copy(zmq_msg_t *f, const void *p, size_t len, int i)
{
    if (s_build_fails(i) || zmq_msg_init_size(f, len) != 0) {
        return ZPS_ENOMEM;
    }
    memcpy(zmq_msg_data(f), p, len);
    return ZPS_OK;
}

// A zero-copy frame of the caller's buffer: ZeroMQ calls s_release once it
// is done with it, sent or closed unsent.
static zps_err s_build_ref(zmq_msg_t *f, const void *p, size_t len, zps_wire_ref *ref, int i)
{
    if (s_build_fails(i)) {
        return ZPS_ENOMEM;
    }
    atomic_fetch_add_explicit(&ref->inflight, 1, memory_order_relaxed);
    if (zmq_msg_init_data(f, (void *)p, len, s_release, ref) != 0) {
        atomic_fetch_sub(&ref->inflight, 1);
        return ZPS_ENOMEM;
    }
    return ZPS_OK;
}

// Sends parts[0..n) as one message; the parts not sent are closed.
//
// Why a failure cannot leave half a message behind: the parts exist before
// the first is sent, so nothing of ours can fail between two of them. An
// interrupted send (EINTR, which libzmq returns before it queues anything)
// is sent again. Past the first part libzmq fails otherwise only when the
// socket is unusable (ETERM, ENOTSOCK): a pipe that fills up or goes away
// mid-message is libzmq's to handle, and it drops the message whole
// (router.cpp xsend, lb.cpp sendpipe, libzmq 4.3) rather than deliver part.
static zps_err s_send_parts(void *sock, zmq_msg_t *parts, int n)
{
    for (int i = 0; i < n; i++) {
        int tries = 0;
        for (;;) {
            int rc;
            if (atomic_load_explicit(&s_fault_eintr, memory_order_relaxed) == i && tries == 0) {
                rc = -1;
                errno = EINTR;
            } else {
                rc = zmq_msg_send(&parts[i], sock, i + 1 < n ? ZMQ_SNDMORE : 0);
            }
            if (rc >= 0) {
                break;
            }
            int e = errno;
            if (e == EINTR && ++tries < S_EINTR_TRIES) {
                continue;
            }
            zps_log_warn("send%s: %s", i > 0 ? " (mid-message)" : "", zmq_strerror(e));
            for (int k = i; k < n; k++) {
                ZPS_ASSERT(zmq_msg_close(&parts[k]) == 0);
            }
            return i == 0 && e == EAGAIN ? ZPS_ETIMEDOUT : ZPS_EIO;
        }
    }
    return ZPS_OK;
}

zps_err zps_wire_send(void *sock, zmq_msg_t *route, const Zps__Header *h, const void *payload,
                      size_t bytes, zps_wire_ref *ref)
{
    size_t n_frames = (bytes + ZPS_WIRE_FRAME_BYTES - 1) / ZPS_WIRE_FRAME_BYTES;
    if (n_frames > ZPS_WIRE_MAX_FRAMES) {
        zps_log_error("a %s of %zu bytes needs %zu frames; receivers take %d", 
                      zps_wire_type_name((int)h->type), bytes, n_frames, ZPS_WIRE_MAX_FRAMES);
        return ZPS_EINVAL;
    }
    zmq_msg_t parts[S_MAX_PARTS];
    int n = 0;
    zps_err err = ZPS_OK;
    if (route) {
        if (s_build_fails(n)) {
            err = ZPS_ENOMEM;
        } else {
            ZPS_ASSERT(zmq_msg_init(&parts[n]) == 0);
            ZPS_ASSERT(zmq_msg_copy(&parts[n], route) == 0);
            n++;
        }
    }
    size_t hlen = zps__header__get_packed_size(h);
    if (err == ZPS_OK && (s_build_fails(n) || zmq_msg_init_size(&parts[n], hlen) != 0)) {
        err = ZPS_ENOMEM;
    } else if (err == ZPS_OK) {
        zps__header__pack(h, zmq_msg_data(&parts[n]));
        n++;
    }
    const uint8_t *p = payload;
    while (err == ZPS_OK && bytes > 0) {
        size_t len = bytes < ZPS_WIRE_FRAME_BYTES ? bytes : ZPS_WIRE_FRAME_BYTES;
        err = ref ? s_build_ref(&parts[n], p, len, ref, n) : s_build_copy(&parts[n], p, len, n);
        n += err == ZPS_OK;
        p += len;
        bytes -= len;
    }
    if (err != ZPS_OK) {
        zps_log_warn("could not build a %s to send: %s", zps_wire_type_name((int)h->type),
                     zps_strerror(err));
        for (int k = 0; k < n; k++) {
            ZPS_ASSERT(zmq_msg_close(&parts[k]) == 0); // a zero-copy frame is released here
        }
        return err;
    }
    return s_send_parts(sock, parts, n);
}

zps_err zps_wire_send_frames(void *sock, zmq_msg_t *route, const Zps__Header *h,
                             zmq_msg_t *frames, int n_frames)
{
    zmq_msg_t parts[S_MAX_PARTS];
    int n = 0;
    zps_err err = n_frames <= ZPS_WIRE_MAX_FRAMES ? ZPS_OK : ZPS_EINVAL;
    size_t hlen = zps__header__get_packed_size(h);
    if (err == ZPS_OK && route) {
        ZPS_ASSERT(zmq_msg_init(&parts[n]) == 0);
        ZPS_ASSERT(zmq_msg_copy(&parts[n], route) == 0);
        n++;
    }
    if (err == ZPS_OK && zmq_msg_init_size(&parts[n], hlen) != 0) {
        err = ZPS_ENOMEM;
    } else if (err == ZPS_OK) {
        zps__header__pack(h, zmq_msg_data(&parts[n++]));
    }
    for (int f = 0; f < n_frames; f++) {
        ZPS_ASSERT(zmq_msg_init(&parts[n]) == 0);
        ZPS_ASSERT(zmq_msg_move(&parts[n], &frames[f]) == 0); // frames[f] is left empty
        n++;
    }
    if (err != ZPS_OK) {
        zps_log_warn("could not build a %s to send: %s", zps_wire_type_name((int)h->type),
                     zps_strerror(err));
        for (int k = 0; k < n; k++) {
            ZPS_ASSERT(zmq_msg_close(&parts[k]) == 0);
        }
        return err;
    }
    return s_send_parts(sock, parts, n);
}

zps_err zps_wire_send_packed(void *sock, zmq_msg_t *route, const void *hdr, size_t len)
{
    zmq_msg_t parts[2];
    int n = 0;
    if (route) {
        ZPS_ASSERT(zmq_msg_init(&parts[n]) == 0);
        ZPS_ASSERT(zmq_msg_copy(&parts[n], route) == 0);
        n++;
    }
    if (zmq_msg_init_size(&parts[n], len) != 0) {
        for (int k = 0; k < n; k++) {
            ZPS_ASSERT(zmq_msg_close(&parts[k]) == 0);
        }
        zps_log_warn("could not build a message of %zu bytes to send", len);
        return ZPS_ENOMEM;
    }
    memcpy(zmq_msg_data(&parts[n]), hdr, len);
    return s_send_parts(sock, parts, n + 1);
}

void zps_wire_error_header(Zps__Header *h, uint64_t job_id, uint64_t step, zps_err code,
                           const char *why)
{
    zps_wire_header_init(h, ZPS__MSG_TYPE__ERROR);
    h->job_id = job_id;
    h->step = step;
    h->error_code = (int32_t)code;
    h->error = (char *)why;
}

zps_err zps_wire_send_error(void *sock, zmq_msg_t *route, uint64_t job_id, uint64_t step,
                            zps_err code, const char *why)
{
    Zps__Header h;
    zps_wire_error_header(&h, job_id, step, code, why);
    return zps_wire_send(sock, route, &h, NULL, 0, NULL);
}

zps_err zps_wire_send_refusal(void *sock, zmq_msg_t *route, uint64_t job_id,
                              const Zps__Header *refused, zps_err code, const char *why)
{
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__ERROR);
    h.job_id = job_id;
    h.refused = refused->type;
    h.step = refused->step;
    h.shard = refused->shard;
    h.offset = refused->offset;
    h.count = refused->count;
    h.batch_offset = refused->batch_offset;
    h.samples = refused->samples;
    h.generation = refused->generation;
    h.shm_size = refused->shm_size; // a push through shared memory: it says so
    h.error_code = (int32_t)code;
    h.error = (char *)why;
    return zps_wire_send(sock, route, &h, NULL, 0, NULL);
}

zps_err zps_wire_check_tensor(const zps_wire_msg *m, int dtype, uint64_t lo, uint64_t hi,
                              char *why, size_t why_len)
{
    const Zps__Header *h = m->hdr;
    if ((int)h->dtype != dtype) {
        snprintf(why, why_len, "dtype %d, the job's is %s", (int)h->dtype,
                 zps_dtype_name((zps_dtype)dtype));
        return ZPS_EPROTO;
    }
    size_t esize = zps_dtype_size((zps_dtype)dtype);
    if (h->count == 0 || h->offset < lo || h->offset >= hi || h->count > hi - h->offset) {
        snprintf(why, why_len, "tensor [%llu, +%llu) outside [%llu, %llu)",
                 (unsigned long long)h->offset, (unsigned long long)h->count,
                 (unsigned long long)lo, (unsigned long long)hi);
        return ZPS_ERANGE;
    }
    if (m->payload_bytes != h->count * esize) {
        snprintf(why, why_len, "payload of %zu bytes for %llu elements of %zu bytes",
                 m->payload_bytes, (unsigned long long)h->count, esize);
        return ZPS_EPROTO;
    }
    for (int i = 0; i < m->n_frames; i++) {
        if (zmq_msg_size((zmq_msg_t *)&m->frames[i]) % esize != 0) {
            snprintf(why, why_len, "frame %d splits an element", i);
            return ZPS_EPROTO;
        }
    }
    return ZPS_OK;
}

void zps_wire_copy_payload(const zps_wire_msg *m, void *dst)
{
    uint8_t *d = dst;
    for (int i = 0; i < m->n_frames; i++) {
        zmq_msg_t *f = (zmq_msg_t *)&m->frames[i];
        memcpy(d, zmq_msg_data(f), zmq_msg_size(f));
        d += zmq_msg_size(f);
    }
}

void zps_wire_cursor_init(zps_wire_cursor *c, const zmq_msg_t *frames, int n_frames,
                          size_t esize)
{
    *c = (zps_wire_cursor){.frames = frames, .n_frames = n_frames, .esize = esize};
}

static size_t s_cursor_len(const zps_wire_cursor *c)
{
    return zmq_msg_size((zmq_msg_t *)&c->frames[c->f]) / c->esize;
}

const uint8_t *zps_wire_cursor_at(zps_wire_cursor *c, size_t i, size_t *len)
{
    if (i < c->at) {
        c->f = 0;
        c->at = 0;
    }
    while (c->f < c->n_frames - 1 && i >= c->at + s_cursor_len(c)) {
        c->at += s_cursor_len(c);
        c->f++;
    }
    size_t left = c->at + s_cursor_len(c) - i;
    ZPS_ASSERT(i < c->at + s_cursor_len(c));
    *len = *len < left ? *len : left;
    return (const uint8_t *)zmq_msg_data((zmq_msg_t *)&c->frames[c->f]) + (i - c->at) * c->esize;
}

// Above the largest frame, so that frames never get a mapping of their
// own; and free memory kept at the top of a heap up to many steps' worth
// of frames. Setting either also stops glibc's own adjustment of both.
#define S_MMAP_THRESHOLD (2 * ZPS_WIRE_MAX_MSG_BYTES)
#define S_TRIM_THRESHOLD (64 << 20)

void zps_wire_tune_malloc(void)
{
#ifdef __GLIBC__
    if (mallopt(M_MMAP_THRESHOLD, (int)S_MMAP_THRESHOLD) != 1 ||
        mallopt(M_TRIM_THRESHOLD, S_TRIM_THRESHOLD) != 1) {
        zps_log_warn("mallopt refused: received frames will page-fault their memory each step");
    }
#endif
}

zps_err zps_wire_ref_wait(zps_wire_ref *ref, int timeout_ms)
{
    double deadline = zps_clock_ms() + timeout_ms;
    while (atomic_load_explicit(&ref->inflight, memory_order_acquire) > 0) {
        if (zps_clock_ms() > deadline) {
            zps_log_error("waited %d ms for ZeroMQ to release a send buffer", timeout_ms);
            return ZPS_ETIMEDOUT;
        }
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
    return ZPS_OK;
}

const char *zps_wire_type_name(int type)
{
    const ProtobufCEnumValue *v =
        protobuf_c_enum_descriptor_get_value(&zps__msg_type__descriptor, type);
    return v ? v->name : "unknown";
}
