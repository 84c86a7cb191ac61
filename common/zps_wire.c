/* zps_wire.c - framing, decoding and bounds checks of zps messages. */
#include "zps_wire.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

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
        zmq_close(s);
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
        zmq_msg_init(&part);
        int rc = zmq_msg_recv(&part, sock, 0);
        zmq_msg_close(&part);
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

zps_err zps_wire_recv(void *sock, bool router, zps_wire_msg *m)
{
    memset(m, 0, sizeof *m);
    zmq_msg_t head;
    if (router) {
        zmq_msg_init(&m->route);
        if (zmq_msg_recv(&m->route, sock, 0) < 0) {
            zmq_msg_close(&m->route);
            return errno == EAGAIN ? ZPS_ETIMEDOUT : ZPS_EIO;
        }
        m->has_route = true;
        if (!s_more(sock)) {
            return ZPS_EPROTO;
        }
    }
    zmq_msg_init(&head);
    if (zmq_msg_recv(&head, sock, 0) < 0) {
        zmq_msg_close(&head);
        return errno == EAGAIN ? ZPS_ETIMEDOUT : ZPS_EIO;
    }
    m->hdr = zps__header__unpack(NULL, zmq_msg_size(&head), zmq_msg_data(&head));
    zmq_msg_close(&head);
    while (s_more(sock)) {
        if (m->n_frames == ZPS_WIRE_MAX_FRAMES) {
            s_drain(sock);
            return ZPS_EPROTO;
        }
        zmq_msg_t *f = &m->frames[m->n_frames];
        zmq_msg_init(f);
        if (zmq_msg_recv(f, sock, 0) < 0) {
            zmq_msg_close(f);
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

void zps_wire_msg_fini(zps_wire_msg *m)
{
    if (m->has_route) {
        zmq_msg_close(&m->route);
        m->has_route = false;
    }
    if (m->hdr) {
        zps__header__free_unpacked(m->hdr, NULL);
        m->hdr = NULL;
    }
    for (int i = 0; i < m->n_frames; i++) {
        zmq_msg_close(&m->frames[i]);
    }
    m->n_frames = 0;
}

void zps_wire_msg_move(zps_wire_msg *dst, zps_wire_msg *src)
{
    memset(dst, 0, sizeof *dst);
    if (src->has_route) {
        zmq_msg_init(&dst->route);
        zmq_msg_move(&dst->route, &src->route);
        dst->has_route = true;
        zmq_msg_close(&src->route);
        src->has_route = false;
    }
    dst->hdr = src->hdr;
    src->hdr = NULL;
    for (int i = 0; i < src->n_frames; i++) {
        zmq_msg_init(&dst->frames[i]);
        zmq_msg_move(&dst->frames[i], &src->frames[i]);
        zmq_msg_close(&src->frames[i]);
    }
    dst->n_frames = src->n_frames;
    dst->payload_bytes = src->payload_bytes;
    src->n_frames = 0;
}

// ZeroMQ calls this from its I/O thread once a zero-copy frame is sent:
// it may only release the reference.
static void s_release(void *data, void *hint)
{
    (void)data;
    atomic_fetch_sub_explicit(&((zps_wire_ref *)hint)->inflight, 1, memory_order_release);
}

static zps_err s_send_part(void *sock, zmq_msg_t *msg, bool more)
{
    if (zmq_msg_send(msg, sock, more ? ZMQ_SNDMORE : 0) < 0) {
        zps_log_warn("send: %s", zmq_strerror(errno));
        zmq_msg_close(msg);
        return errno == EAGAIN ? ZPS_ETIMEDOUT : ZPS_EIO;
    }
    return ZPS_OK;
}

static zps_err s_send_frame(void *sock, const uint8_t *p, size_t len, bool more, zps_wire_ref *ref)
{
    zmq_msg_t f;
    if (ref) {
        atomic_fetch_add_explicit(&ref->inflight, 1, memory_order_relaxed);
        if (zmq_msg_init_data(&f, (void *)p, len, s_release, ref) != 0) {
            atomic_fetch_sub(&ref->inflight, 1);
            return ZPS_ENOMEM;
        }
    } else {
        if (zmq_msg_init_size(&f, len) != 0) {
            return ZPS_ENOMEM;
        }
        memcpy(zmq_msg_data(&f), p, len);
    }
    return s_send_part(sock, &f, more);
}

zps_err zps_wire_send(void *sock, zmq_msg_t *route, const Zps__Header *h, const void *payload,
                      size_t bytes, zps_wire_ref *ref)
{
    zps_err err;
    zmq_msg_t part;
    if (route) {
        zmq_msg_init(&part);
        zmq_msg_copy(&part, route);
        if ((err = s_send_part(sock, &part, true)) != ZPS_OK) {
            return err;
        }
    }
    size_t hlen = zps__header__get_packed_size(h);
    if (zmq_msg_init_size(&part, hlen) != 0) {
        return ZPS_ENOMEM;
    }
    zps__header__pack(h, zmq_msg_data(&part));
    if ((err = s_send_part(sock, &part, bytes > 0)) != ZPS_OK) {
        return err;
    }
    const uint8_t *p = payload;
    while (bytes > 0) {
        size_t len = bytes < ZPS_WIRE_FRAME_BYTES ? bytes : ZPS_WIRE_FRAME_BYTES;
        if ((err = s_send_frame(sock, p, len, bytes > len, ref)) != ZPS_OK) {
            return err;
        }
        p += len;
        bytes -= len;
    }
    return ZPS_OK;
}

void zps_wire_send_error(void *sock, zmq_msg_t *route, uint64_t job_id, uint64_t step,
                         zps_err code, const char *why)
{
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__ERROR);
    h.job_id = job_id;
    h.step = step;
    h.error_code = (int32_t)code;
    h.error = (char *)why;
    (void)zps_wire_send(sock, route, &h, NULL, 0, NULL);
}

void zps_wire_send_refusal(void *sock, zmq_msg_t *route, uint64_t job_id,
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
    h.error_code = (int32_t)code;
    h.error = (char *)why;
    (void)zps_wire_send(sock, route, &h, NULL, 0, NULL);
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
