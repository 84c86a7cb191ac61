/* zps_zcode.c - byte planes and zstd for fp32 frames (zps_zcode.h). */
#include "zps_zcode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include <zstd.h>

#include "zps_log.h"

// zstd's fastest level that still finds the runs of zeros in the high
// planes: bench/wire_lossless.py measured level 1's sizes.
#define S_LEVEL 1

struct zps_zcode {
    ZSTD_CCtx *cctx;
    ZSTD_DCtx *dctx;
    uint8_t *planes; // 4 * ZPS_ZCODE_MAX bytes: a frame's planes
    uint8_t *out;    // ZPS_ZCODE_HEADER + 4 * ZPS_ZCODE_MAX: a frame coded, before it is
                     // copied out at its size (a fresh buffer of the largest size would
                     // be mapped, and faulted in, each time)
};

zps_err zps_zcode_new(zps_zcode **out)
{
    zps_zcode *z = calloc(1, sizeof *z);
    if (z) {
        z->cctx = ZSTD_createCCtx();
        z->dctx = ZSTD_createDCtx();
        z->planes = malloc(4 * ZPS_ZCODE_MAX);
        z->out = malloc(ZPS_ZCODE_HEADER + 4 * ZPS_ZCODE_MAX);
    }
    if (!z || !z->cctx || !z->dctx || !z->planes || !z->out) {
        zps_log_error("out of memory for the wire's coder");
        zps_zcode_destroy(&z);
        return ZPS_ENOMEM;
    }
    *out = z;
    return ZPS_OK;
}

void zps_zcode_destroy(zps_zcode **z)
{
    if (!*z) {
        return;
    }
    ZSTD_freeCCtx((*z)->cctx);
    ZSTD_freeDCtx((*z)->dctx);
    free((*z)->planes);
    free((*z)->out);
    free(*z);
    *z = NULL;
}

static const uint8_t s_magic[4] = {'Z', 'P', 'Z', '1'};

// Where plane p's length lies in a frame's header.
static size_t s_len_at(int p)
{
    return 16 + 4 * (size_t)p;
}

static void s_put32(uint8_t *at, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        at[i] = (uint8_t)(v >> (8 * i));
    }
}

static uint32_t s_get32(const uint8_t *at)
{
    return (uint32_t)at[0] | (uint32_t)at[1] << 8 | (uint32_t)at[2] << 16 |
           (uint32_t)at[3] << 24;
}

static uint32_t s_word(const uint8_t *p, size_t i)
{
    uint32_t w;
    memcpy(&w, p + 4 * i, sizeof w);
    return w;
}

// planes[p * n + i] = byte p of element i of src (XOR base's).
static void s_split(const uint8_t *src, const uint8_t *base, size_t n, uint8_t *planes)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t w = s_word(src, i) ^ (base ? s_word(base, i) : 0u);
        planes[i] = (uint8_t)w;
        planes[n + i] = (uint8_t)(w >> 8);
        planes[2 * n + i] = (uint8_t)(w >> 16);
        planes[3 * n + i] = (uint8_t)(w >> 24);
    }
}

// The inverse of s_split into dst.
static void s_join(const uint8_t *planes, const uint8_t *base, size_t n, uint8_t *dst)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t w = (uint32_t)planes[i] | (uint32_t)planes[n + i] << 8 |
                     (uint32_t)planes[2 * n + i] << 16 | (uint32_t)planes[3 * n + i] << 24;
        w ^= base ? s_word(base, i) : 0u;
        memcpy(dst + 4 * i, &w, sizeof w);
    }
}

zps_err zps_zcode_encode(zps_zcode *z, const void *src, const void *base, size_t n, void **out,
                         size_t *out_len)
{
    if (n == 0 || n > ZPS_ZCODE_MAX) {
        zps_log_error("wire code: %zu elements in one frame (1..%zu)", n, ZPS_ZCODE_MAX);
        return ZPS_EINVAL;
    }
    // A plane that zstd cannot shrink is stored: the frame is never
    // longer than the values and its header.
    uint8_t *buf = z->out;
    s_split(src, base, n, z->planes);
    memcpy(buf, s_magic, sizeof s_magic);
    s_put32(buf + 4, (uint32_t)n);
    uint64_t hash = XXH3_64bits(src, 4 * n);
    s_put32(buf + 8, (uint32_t)hash);
    s_put32(buf + 12, (uint32_t)(hash >> 32));
    // From the top plane down: the sign and the exponent repeat most, the
    // low mantissa bytes least. Once a plane does not shrink by a 32nd,
    // those below it are stored without trying: zstd's time on bytes it
    // cannot shrink was half the coder's.
    size_t at = ZPS_ZCODE_HEADER;
    bool store = false;
    for (int p = 3; p >= 0; p--) {
        const uint8_t *plane = z->planes + (size_t)p * n;
        size_t len = store ? 0 : ZSTD_compressCCtx(z->cctx, buf + at, n - n / 32 - 1, plane, n,
                                                   S_LEVEL);
        if (store || ZSTD_isError(len)) { // stored (or n too small to shrink)
            memcpy(buf + at, plane, n);
            len = n;
            store = true;
        }
        s_put32(buf + s_len_at(p), (uint32_t)len);
        at += len;
    }
    if (!(*out = malloc(at))) {
        zps_log_error("out of memory coding %zu elements for the wire", n);
        return ZPS_ENOMEM;
    }
    memcpy(*out, buf, at);
    *out_len = at;
    return ZPS_OK;
}

zps_err zps_zcode_count(const void *frame, size_t len, size_t *n, char *why, size_t why_len)
{
    const uint8_t *f = frame;
    if (len < ZPS_ZCODE_HEADER || memcmp(f, s_magic, sizeof s_magic) != 0) {
        snprintf(why, why_len, "a coded frame of %zu bytes without its header", len);
        return ZPS_EPROTO;
    }
    size_t count = s_get32(f + 4), sum = ZPS_ZCODE_HEADER;
    if (count == 0 || count > ZPS_ZCODE_MAX) {
        snprintf(why, why_len, "a coded frame of %zu elements (1..%zu)", count, ZPS_ZCODE_MAX);
        return ZPS_EPROTO;
    }
    for (int p = 0; p < 4; p++) {
        size_t plen = s_get32(f + s_len_at(p));
        if (plen == 0 || plen > count) {
            snprintf(why, why_len, "a coded plane of %zu bytes for %zu elements", plen, count);
            return ZPS_EPROTO;
        }
        sum += plen;
    }
    if (sum != len) {
        snprintf(why, why_len, "a coded frame of %zu bytes whose planes add up to %zu", len, sum);
        return ZPS_EPROTO;
    }
    *n = count;
    return ZPS_OK;
}

// Plane p of a checked frame into z->planes; the reason if it is not n bytes.
static zps_err s_plane(zps_zcode *z, const uint8_t *at, size_t len, size_t n, int p, char *why,
                       size_t why_len)
{
    uint8_t *dst = z->planes + (size_t)p * n;
    if (len == n) {
        memcpy(dst, at, n);
        return ZPS_OK;
    }
    // The size zstd's header states is checked before any work is done.
    unsigned long long want = ZSTD_getFrameContentSize(at, len);
    size_t got = want == n ? ZSTD_decompressDCtx(z->dctx, dst, n, at, len) : 0;
    if (want != n || ZSTD_isError(got) || got != n) {
        snprintf(why, why_len, "coded plane %d is not %zu bytes of zstd%s%s", p, n,
                 ZSTD_isError(got) ? ": " : "", ZSTD_isError(got) ? ZSTD_getErrorName(got) : "");
        return ZPS_EPROTO;
    }
    return ZPS_OK;
}

zps_err zps_zcode_decode(zps_zcode *z, const void *frame, size_t len, const void *base, void *dst,
                         size_t n, char *why, size_t why_len)
{
    size_t count;
    zps_err err = zps_zcode_count(frame, len, &count, why, why_len);
    if (err != ZPS_OK) {
        return err;
    }
    if (count != n) {
        snprintf(why, why_len, "a coded frame of %zu elements where %zu were due", count, n);
        return ZPS_EPROTO;
    }
    const uint8_t *f = frame, *at = f + ZPS_ZCODE_HEADER;
    for (int p = 3; p >= 0; p--) {
        size_t plen = s_get32(f + s_len_at(p));
        err = s_plane(z, at, plen, n, p, why, why_len);
        if (err != ZPS_OK) {
            return err;
        }
        at += plen;
    }
    s_join(z->planes, base, n, dst);
    uint64_t hash = (uint64_t)s_get32(f + 8) | (uint64_t)s_get32(f + 12) << 32;
    if (XXH3_64bits(dst, 4 * n) != hash) {
        snprintf(why, why_len, "a coded frame whose values do not match its hash%s",
                 base ? " (a base other than its coder's?)" : "");
        return ZPS_EPROTO;
    }
    return ZPS_OK;
}
