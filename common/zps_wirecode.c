/* zps_wirecode.c - coded frames of a tensor message (zps_wirecode.h). */
#include "zps_wirecode.h"

#include <stdio.h>
#include <stdlib.h>

#include "zps_log.h"

// A coded frame holds what one wire frame would have.
_Static_assert(ZPS_ZCODE_MAX * sizeof(float) == ZPS_WIRE_FRAME_BYTES, "frame sizes");

static void s_free(void *data, void *hint)
{
    (void)hint;
    free(data);
}

static void s_close_all(zmq_msg_t *frames, int n)
{
    for (int f = 0; f < n; f++) {
        ZPS_ASSERT(zmq_msg_close(&frames[f]) == 0);
    }
}

// frames[0, n) replace m's, which are closed; m->payload_bytes is theirs.
static void s_replace(zps_wire_msg *m, zmq_msg_t *frames, int n)
{
    s_close_all(m->frames, m->n_frames);
    m->payload_bytes = 0;
    for (int f = 0; f < n; f++) {
        ZPS_ASSERT(zmq_msg_init(&m->frames[f]) == 0);
        ZPS_ASSERT(zmq_msg_move(&m->frames[f], &frames[f]) == 0);
        ZPS_ASSERT(zmq_msg_close(&frames[f]) == 0);
        m->payload_bytes += zmq_msg_size(&m->frames[f]);
    }
    m->n_frames = n;
}

zps_err zps_wirecode_encode(zps_zcode *z, zps_wire_msg *out, const float *base)
{
    zmq_msg_t coded[ZPS_WIRE_MAX_FRAMES];
    size_t at = 0;
    for (int f = 0; f < out->n_frames; f++) {
        size_t n = zmq_msg_size(&out->frames[f]) / sizeof(float);
        void *buf;
        size_t len;
        zps_err err = zps_zcode_encode(z, zmq_msg_data(&out->frames[f]), base ? base + at : NULL,
                                       n, &buf, &len);
        if (err != ZPS_OK) {
            s_close_all(coded, f);
            return err;
        }
        if (zmq_msg_init_data(&coded[f], buf, len, s_free, NULL) != 0) {
            free(buf);
            s_close_all(coded, f);
            zps_log_error("out of memory coding a frame for the wire");
            return ZPS_ENOMEM;
        }
        at += n;
    }
    s_replace(out, coded, out->n_frames);
    return ZPS_OK;
}

// Frame f of m decoded into *dst (made here), its values XORed with
// base's from element `at` of the message; *n its count.
static zps_err s_decode_frame(zps_zcode *z, zps_wire_msg *m, int f, const float *base,
                              uint64_t at, uint64_t max_count, zmq_msg_t *dst, size_t *n,
                              char *why, size_t why_len)
{
    const void *data = zmq_msg_data(&m->frames[f]);
    size_t len = zmq_msg_size(&m->frames[f]);
    zps_err err = zps_zcode_count(data, len, n, why, why_len);
    if (err != ZPS_OK) {
        return err;
    }
    if (*n > max_count - at || *n > m->hdr->count - at) {
        snprintf(why, why_len, "coded frames of more than %llu elements",
                 (unsigned long long)(m->hdr->count < max_count ? m->hdr->count : max_count));
        return ZPS_EPROTO;
    }
    if (zmq_msg_init_size(dst, *n * sizeof(float)) != 0) {
        zps_log_error("out of memory decoding a frame of %zu elements", *n);
        return ZPS_ENOMEM;
    }
    err = zps_zcode_decode(z, data, len, base ? base + at : NULL, zmq_msg_data(dst), *n, why,
                           why_len);
    if (err != ZPS_OK) {
        ZPS_ASSERT(zmq_msg_close(dst) == 0);
    }
    return err;
}

zps_err zps_wirecode_decode(zps_zcode *z, zps_wire_msg *m, const float *base, uint64_t max_count,
                            char *why, size_t why_len)
{
    Zps__Header *h = m->hdr;
    if (h->wire_code != ZPS_ZCODE_PLANES && h->wire_code != ZPS_ZCODE_XOR) {
        snprintf(why, why_len, "wire code %u (1 or 2)", h->wire_code);
        return ZPS_EPROTO;
    }
    if (h->wire_code == ZPS_ZCODE_XOR && !base) {
        snprintf(why, why_len, "values XORed with step %llu's, which are not here",
                 (unsigned long long)(h->code_base ? h->code_base - 1 : 0));
        return ZPS_EPROTO;
    }
    const float *with = h->wire_code == ZPS_ZCODE_XOR ? base : NULL;
    zmq_msg_t plain[ZPS_WIRE_MAX_FRAMES];
    uint64_t at = 0;
    for (int f = 0; f < m->n_frames; f++) {
        size_t n;
        zps_err err = s_decode_frame(z, m, f, with, at, max_count, &plain[f], &n, why, why_len);
        if (err != ZPS_OK) {
            s_close_all(plain, f);
            return err;
        }
        at += n;
    }
    if (at != h->count) {
        s_close_all(plain, m->n_frames);
        snprintf(why, why_len, "coded frames of %llu elements for a tensor of %llu",
                 (unsigned long long)at, (unsigned long long)h->count);
        return ZPS_EPROTO;
    }
    s_replace(m, plain, m->n_frames);
    h->wire_code = 0;
    return ZPS_OK;
}
