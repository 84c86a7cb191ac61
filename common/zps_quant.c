/* zps_quant.c - int8 and E3M0 block codecs of pseudo-gradients and the
 * worker's error feedback (formats in zps_quant.h). */
#include "zps_quant.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// The largest scale each encoder stores: what the decoder accepts. Float
// arithmetic is monotonic, so max|x| <= ZPS_QUANT_MAX gives an int8 scale
// max|x| / 127 <= S_INT8_MAX_SCALE, and 127 times it stays finite.
#define S_INT8_MAX_SCALE (ZPS_QUANT_MAX / 127.0f)
#define S_E3M0_MAX_SCALE ZPS_QUANT_MAX

// E3M0: the magnitude of exponent code c, relative to the scale.
static const float s_e3m0_mult[8] = {
    0.0f, 0x1p-6f, 0x1p-5f, 0x1p-4f, 0x1p-3f, 0x1p-2f, 0x1p-1f, 1.0f,
};
#define S_E3M0_SIGN 0x8u

static const char *const s_names[] = {
    [ZPS_QUANT_INT8] = "int8",
    [ZPS_QUANT_E3M0] = "e3m0",
};

zps_err zps_quant_parse(const char *name, zps_quant_kind *out)
{
    if (strcmp(name, "int8") == 0) {
        *out = ZPS_QUANT_INT8;
    } else if (strcmp(name, "e3m0") == 0) {
        *out = ZPS_QUANT_E3M0;
    } else {
        return ZPS_EINVAL;
    }
    return ZPS_OK;
}

static bool s_kind_ok(zps_quant_kind kind)
{
    return kind == ZPS_QUANT_INT8 || kind == ZPS_QUANT_E3M0;
}

const char *zps_quant_name(zps_quant_kind kind)
{
    return s_kind_ok(kind) ? s_names[kind] : "?";
}

zps_err zps_quant_size(zps_quant_kind kind, size_t n, size_t block, size_t *size)
{
    if (!s_kind_ok(kind) || block < 1 || block > ZPS_QUANT_MAX_BLOCK || n > SIZE_MAX / 8) {
        return ZPS_EINVAL;
    }
    size_t blocks = n / block + (n % block != 0);
    size_t codes = kind == ZPS_QUANT_INT8 ? n : n / 2 + n % 2;
    *size = 4 * blocks + codes;
    return ZPS_OK;
}

// ---------------------------------------------------------------- bytes

// fp32 little-endian, whatever the host's byte order.
static void s_put_f32(uint8_t *p, float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    p[0] = (uint8_t)u;
    p[1] = (uint8_t)(u >> 8);
    p[2] = (uint8_t)(u >> 16);
    p[3] = (uint8_t)(u >> 24);
}

static float s_get_f32(const uint8_t *p)
{
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                 (uint32_t)p[3] << 24;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

// ---------------------------------------------------------------- codes

// The E3M0 code of x in a block of scale s > 0 (|x| <= s): the nearest of
// the magnitudes 0, s 2^-6 .. s, ties to the larger. r = |x| / s in
// double, where the thresholds (midpoints) are exact.
static unsigned s_e3m0_code(float x, float s)
{
    double r = fabs((double)x) / (double)s;
    unsigned c;
    if (r < 0x1p-7) {
        return 0; // nearer 0 than s / 64: no sign either
    }
    if (r < 0x1p-6) {
        c = 1;
    } else {
        int e;
        double m = frexp(r, &e); // r = m 2^e, m in [0.5, 1): between 2^(e-1) and 2^e
        int k = m < 0.75 ? e - 1 : e;
        c = k + 7 > 7 ? 7 : (unsigned)(k + 7); // r <= 1: k <= 0
    }
    return signbit(x) ? c | S_E3M0_SIGN : c;
}

static float s_e3m0_value(unsigned code, float s)
{
    float v = s * s_e3m0_mult[code & 7u];
    return code & S_E3M0_SIGN ? -v : v;
}

static int8_t s_int8_code(float x, float s)
{
    float q = roundf(x / s);
    q = q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q;
    return (int8_t)q;
}

// Elements [at, at + len) of the block starting at element `at`, encoded
// into their codes of out (the codes part of the buffer) with scale s.
static void s_encode_block(zps_quant_kind kind, const float *x, size_t at, size_t len, float s,
                           uint8_t *codes)
{
    if (kind == ZPS_QUANT_INT8) {
        for (size_t i = at; i < at + len; i++) {
            codes[i] = s > 0 ? (uint8_t)s_int8_code(x[i], s) : 0;
        }
        return;
    }
    for (size_t i = at; i < at + len; i++) {
        unsigned c = s > 0 ? s_e3m0_code(x[i], s) : 0;
        // Element i - 1 of an odd i is written before it (in this block or
        // the one before), so each byte is set whole, then completed.
        if (i % 2 == 0) {
            codes[i / 2] = (uint8_t)c;
        } else {
            codes[i / 2] = (uint8_t)(codes[i / 2] | c << 4);
        }
    }
}

// The value of element i, of a block with scale s.
static float s_value(zps_quant_kind kind, const uint8_t *codes, size_t i, float s)
{
    if (kind == ZPS_QUANT_INT8) {
        return (float)(int8_t)codes[i] * s;
    }
    unsigned c = i % 2 == 0 ? codes[i / 2] & 0x0fu : codes[i / 2] >> 4;
    return s_e3m0_value(c, s);
}

// Whether |x[i]| <= ZPS_QUANT_MAX for all n (false for NaN).
static bool s_all_encodable(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!(fabsf(x[i]) <= ZPS_QUANT_MAX)) {
            return false;
        }
    }
    return true;
}

// Encodes x (checked: encodable) into out (of the right size).
static void s_encode(zps_quant_kind kind, size_t block, const float *x, size_t n, uint8_t *out)
{
    size_t blocks = n / block + (n % block != 0);
    uint8_t *codes = out + 4 * blocks;
    for (size_t b = 0; b < blocks; b++) {
        size_t at = b * block;
        size_t len = n - at < block ? n - at : block;
        float max = 0.0f;
        for (size_t i = at; i < at + len; i++) {
            float a = fabsf(x[i]);
            max = a > max ? a : max;
        }
        float s = kind == ZPS_QUANT_INT8 ? max / 127.0f : max;
        s_put_f32(out + 4 * b, s);
        s_encode_block(kind, x, at, len, s, codes);
    }
}

zps_err zps_quant_encode(zps_quant_kind kind, size_t block, const float *restrict x, size_t n,
                         uint8_t *restrict out, size_t out_len)
{
    size_t size;
    if (zps_quant_size(kind, n, block, &size) != ZPS_OK || out_len != size ||
        !s_all_encodable(x, n)) {
        return ZPS_EINVAL;
    }
    s_encode(kind, block, x, n, out);
    return ZPS_OK;
}

// Whether buf (of the right size) holds what the encoder can make.
static bool s_valid(zps_quant_kind kind, size_t block, const uint8_t *buf, size_t n)
{
    size_t blocks = n / block + (n % block != 0);
    const float max_scale = kind == ZPS_QUANT_INT8 ? S_INT8_MAX_SCALE : S_E3M0_MAX_SCALE;
    for (size_t b = 0; b < blocks; b++) {
        float s = s_get_f32(buf + 4 * b);
        if (!(s >= 0.0f && s <= max_scale)) { // refuses NaN too
            return false;
        }
    }
    const uint8_t *codes = buf + 4 * blocks;
    if (kind == ZPS_QUANT_INT8) {
        for (size_t i = 0; i < n; i++) {
            if (codes[i] == 0x80u) { // -128
                return false;
            }
        }
        return true;
    }
    for (size_t i = 0; i < n / 2 + n % 2; i++) {
        if ((codes[i] & 0x0fu) == S_E3M0_SIGN || (codes[i] >> 4) == S_E3M0_SIGN) {
            return false; // negative zero
        }
    }
    return n % 2 == 0 || (codes[n / 2] >> 4) == 0;
}

// x[i] = value (sub false) or x[i] -= value (sub true) over the n elements
// of a valid buffer.
static void s_decode(zps_quant_kind kind, size_t block, const uint8_t *buf, float *x, size_t n,
                     bool sub)
{
    size_t blocks = n / block + (n % block != 0);
    const uint8_t *codes = buf + 4 * blocks;
    for (size_t b = 0; b < blocks; b++) {
        float s = s_get_f32(buf + 4 * b);
        size_t at = b * block;
        size_t len = n - at < block ? n - at : block;
        for (size_t i = at; i < at + len; i++) {
            float v = s_value(kind, codes, i, s);
            x[i] = sub ? x[i] - v : v;
        }
    }
}

zps_err zps_quant_decode(zps_quant_kind kind, size_t block, const uint8_t *restrict buf,
                         size_t len, float *restrict x, size_t n)
{
    size_t size;
    if (zps_quant_size(kind, n, block, &size) != ZPS_OK) {
        return ZPS_EINVAL;
    }
    if (len != size || !s_valid(kind, block, buf, n)) {
        return ZPS_EPROTO;
    }
    s_decode(kind, block, buf, x, n, false);
    return ZPS_OK;
}

// ---------------------------------------------------------------- error feedback

struct zps_quant_ef {
    zps_quant_kind kind; // the format sent
    size_t block;        // elements per block
    size_t n;            // elements of the model
    float *e;            // owned: the residual, n floats
};

zps_quant_ef *zps_quant_ef_new(zps_quant_kind kind, size_t block, size_t n)
{
    size_t size;
    if (zps_quant_size(kind, n, block, &size) != ZPS_OK) {
        return NULL;
    }
    zps_quant_ef *ef = calloc(1, sizeof(*ef));
    if (ef == NULL) {
        return NULL;
    }
    ef->e = calloc(n > 0 ? n : 1, sizeof(float));
    if (ef->e == NULL) {
        free(ef);
        return NULL;
    }
    ef->kind = kind;
    ef->block = block;
    ef->n = n;
    return ef;
}

void zps_quant_ef_destroy(zps_quant_ef **ef)
{
    if (ef == NULL || *ef == NULL) {
        return;
    }
    free((*ef)->e);
    free(*ef);
    *ef = NULL;
}

zps_err zps_quant_ef_encode(zps_quant_ef *ef, size_t offset, const float *restrict delta,
                            size_t count, uint8_t *restrict out, size_t out_len)
{
    if (offset > ef->n || count > ef->n - offset) {
        return ZPS_ERANGE;
    }
    size_t size;
    if (zps_quant_size(ef->kind, count, ef->block, &size) != ZPS_OK || out_len != size) {
        return ZPS_EINVAL;
    }
    float *e = ef->e + offset;
    for (size_t i = 0; i < count; i++) {
        float t = e[i] + delta[i];
        if (!(fabsf(t) <= ZPS_QUANT_MAX)) {
            return ZPS_EINVAL;
        }
    }
    for (size_t i = 0; i < count; i++) {
        e[i] += delta[i];
    }
    s_encode(ef->kind, ef->block, e, count, out);
    s_decode(ef->kind, ef->block, out, e, count, true);
    return ZPS_OK;
}

const float *zps_quant_ef_residual(const zps_quant_ef *ef)
{
    return ef->e;
}

void zps_quant_ef_reset(zps_quant_ef *ef)
{
    memset(ef->e, 0, ef->n * sizeof(float));
}
