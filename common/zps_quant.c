/* zps_quant.c - int8 and E3M0 block codecs of pseudo-gradients and the
 * worker's error feedback (formats in zps_quant.h). */
#include "zps_quant.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef __clang__
// Clang contracts a * b + c within one expression by default (GCC does not
// in ISO C mode): the worker's residual must subtract the value the
// receiver decodes, q * s rounded, not a fused q * s - x.
#pragma STDC FP_CONTRACT OFF
#endif

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

// Elements [at, at + len) of a block with scale s, into their codes (the
// codes part of the buffer).
//
// int8: q = round(x / s), ties away from zero, with x / s in double (so
// the only float rounding of the round trip is the decode's q * s).
// E3M0: the code is the number of thresholds |x| reaches: s / 128, then
// the midpoints 1.5 s 2^(c - 7) between magnitudes c and c + 1, exact in
// double: the nearest magnitude, ties to the larger.
static void s_encode_block(zps_quant_kind kind, const float *x, size_t at, size_t len, float s,
                           uint8_t *codes)
{
    if (kind == ZPS_QUANT_INT8) {
        const double inv = s > 0 ? 1.0 / (double)s : 0.0;
        for (size_t i = at; i < at + len; i++) {
            double d = (double)x[i] * inv;
            int q = (int)(d + (d < 0 ? -0.5 : 0.5)); // |d| <= 127 and a little
            q = q > 127 ? 127 : q < -127 ? -127 : q;
            codes[i] = (uint8_t)(int8_t)q;
        }
        return;
    }
    double t[7];
    t[0] = (double)s * 0x1p-7;
    for (int c = 1; c < 7; c++) {
        t[c] = (double)s * 1.5 * (double)s_e3m0_mult[c];
    }
    for (size_t i = at; i < at + len; i++) {
        double a = fabs((double)x[i]);
        unsigned c = 0;
        for (int j = 0; j < 7; j++) {
            c += a >= t[j];
        }
        if (s == 0.0f) {
            c = 0; // every threshold is 0
        }
        if (c != 0 && signbit(x[i])) {
            c |= S_E3M0_SIGN;
        }
        // Element i - 1 of an odd i is written before it (in this block or
        // the one before), so each byte is set whole, then completed.
        if (i % 2 == 0) {
            codes[i / 2] = (uint8_t)c;
        } else {
            codes[i / 2] = (uint8_t)(codes[i / 2] | c << 4);
        }
    }
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
        if (!(s >= 0.0f && s <= max_scale) || signbit(s)) { // NaN and -0 too
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
        size_t end = n - at < block ? n : at + block;
        if (kind == ZPS_QUANT_INT8) {
            for (size_t i = at; i < end; i++) {
                float v = (float)(int8_t)codes[i] * s;
                x[i] = sub ? x[i] - v : v;
            }
            continue;
        }
        float value[16]; // of each code in this block
        for (unsigned c = 0; c < 8; c++) {
            value[c] = s * s_e3m0_mult[c];
            value[c | S_E3M0_SIGN] = -value[c];
        }
        for (size_t i = at; i < end; i++) {
            float v = value[(codes[i / 2] >> (4 * (i % 2))) & 0x0fu];
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
