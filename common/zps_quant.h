/* zps_quant.h - compressed pseudo-gradients (--mode diloco): int8 and 4-bit
 * E3M0 with one fp32 scale per block, and the worker's error feedback.
 *
 * A worker sends encode(delta + e) and keeps e := (delta + e) -
 * decode(sent), so what a round does not send is added to the next one's
 * delta: summed over rounds, what was sent differs from the sum of the
 * deltas by the residual e alone, which stays bounded: with D the
 * largest |delta| a block has had, |e| <= D / 253 for int8 (|e| <=
 * max|delta + e| / 254) and D / 2 for E3M0 (|e| <= max|delta + e| / 3).
 * A shard decodes into fp32 and accumulates as for fp32 pushes.
 *
 * The encoding of n elements cut into blocks of `block` elements (the
 * last one shorter when block does not divide n), nb = ceil(n / block)
 * blocks, is one byte buffer:
 *
 *   bytes [0, 4 nb)        the blocks' scales s_b, fp32, little-endian
 *   bytes [4 nb, size)     the codes of the n elements, in order
 *
 * int8 (ZPS_QUANT_INT8): size 4 nb + n. s_b = max|x| over the block / 127
 *   (in float); element x of the block is the int8 q = round(x / s_b),
 *   ties away from zero, in [-127, 127] (0 when s_b is 0); it decodes to
 *   q * s_b. |x - decoded| <= s_b / 2 and the last bits of the float
 *   arithmetic (ZPS_QUANT_INT8_BOUND): half the bound, one step
 *   s_b = max|x| / 127.
 * E3M0 (ZPS_QUANT_E3M0, as Streaming DiLoCo's 4-bit pseudo-gradients):
 *   size 4 nb + ceil(n / 2); element i's code is in byte i / 2, the low
 *   nibble for even i, the high one for odd i (a last, unpaired high
 *   nibble is 0). s_b = max|x| over the block. A code is a sign bit (bit
 *   3, set: negative) and a 3-bit exponent c (bits 0-2): c = 0 is zero
 *   (with the sign bit clear), c = 1..7 is +-s_b * 2^(c - 7), so the
 *   magnitudes are {0, s/64, s/32, s/16, s/8, s/4, s/2, s}. x encodes to
 *   the nearest of them (ties to the larger magnitude), so |x - decoded|
 *   <= max(|x| / 3, s_b / 128) (ZPS_QUANT_E3M0_BOUND).
 *
 * The encoder takes finite values of magnitude at most ZPS_QUANT_MAX and
 * refuses others (NaN, Inf, huge: ZPS_EINVAL, nothing written): a
 * diverged worker's delta is not sent. The decoder takes bytes from the
 * network: it refuses a buffer of another length than the encoding of n
 * elements has, a scale that is negative (-0 too), NaN or beyond what
 * the encoder makes, and a code the encoder never makes (int8 -128, E3M0
 * negative zero, the unpaired nibble set), all with ZPS_EPROTO and
 * nothing written; what it accepts decodes to finite values. A block size is in
 * [1, ZPS_QUANT_MAX_BLOCK]; others are ZPS_EINVAL. */
#ifndef ZPS_QUANT_H
#define ZPS_QUANT_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "zps_err.h"

// The format of a compressed pseudo-gradient. The numbers will travel on
// the wire: never renumber.
typedef enum zps_quant_kind {
    ZPS_QUANT_INT8 = 1, // int8 codes, fp32 scale per block
    ZPS_QUANT_E3M0 = 2, // 4-bit sign + exponent codes, fp32 scale per block
} zps_quant_kind;

#define ZPS_QUANT_BLOCK 256         // the default block, in elements
#define ZPS_QUANT_MAX_BLOCK 65536   // the largest block accepted
#define ZPS_QUANT_MAX 0x1p100f      // the largest magnitude encoded (about 1.3e30)

// The round trip's bound on |x - decode(encode(x))| for an element x of a
// block with scale s (as stored), for scales that are normal floats (a
// block whose max|x| is below about 1e-36 loses precision in its scale).
// int8's second term is the float rounding of x / s and of q * s; E3M0's
// thresholds are exact and its values s 2^-k too, its slack is for show.
#define ZPS_QUANT_INT8_BOUND(x, s) \
    (0.5 * (double)(s) + (fabs((double)(x)) + (double)(s)) * 0x1p-23)
#define ZPS_QUANT_E3M0_BOUND(x, s) \
    (fmax(fabs((double)(x)) / 3, (double)(s) / 128) * (1 + 1e-6))

// "int8" or "e3m0" into *out; ZPS_EINVAL, unlogged, otherwise.
zps_err zps_quant_parse(const char *name, zps_quant_kind *out);
// The name of a kind ("?" for a number that is none).
const char *zps_quant_name(zps_quant_kind kind);

// The bytes of the encoding of n elements in blocks of `block` into
// *size. ZPS_EINVAL, unlogged, for an unknown kind or a block out of
// range (or a size that would not fit a size_t).
zps_err zps_quant_size(zps_quant_kind kind, size_t n, size_t block, size_t *size);

// Encodes x[0, n) into out, whose length out_len must be the encoding's
// size. ZPS_EINVAL, unlogged and out untouched, for a kind, block or
// length that does not fit, or an element that is not finite or beyond
// ZPS_QUANT_MAX.
zps_err zps_quant_encode(zps_quant_kind kind, size_t block, const float *restrict x, size_t n,
                         uint8_t *restrict out, size_t out_len);

// Decodes buf (len bytes, from a peer) into x[0, n). ZPS_EPROTO, unlogged
// and x untouched, if buf is not a valid encoding of n elements in blocks
// of `block` (see above); ZPS_EINVAL for a kind or block that is none.
zps_err zps_quant_decode(zps_quant_kind kind, size_t block, const uint8_t *restrict buf,
                         size_t len, float *restrict x, size_t n);

// ---------------------------------------------------------------- error feedback

// A worker's residual e over the n elements of its model (fp32, zero at
// first), one per job: the elements encoded by one call are a range of
// them (one push's bucket), cut into blocks from the range's start.
typedef struct zps_quant_ef zps_quant_ef;

// Caller owns the result (zps_quant_ef_destroy); NULL if kind or block is
// none or memory runs out.
zps_quant_ef *zps_quant_ef_new(zps_quant_kind kind, size_t block, size_t n);
void zps_quant_ef_destroy(zps_quant_ef **ef);

// Encodes delta + e over elements [offset, offset + count) into out (of
// the encoding's size, out_len), and keeps e := (delta + e) - decode(out)
// there, as the receiver will decode it. delta is the range's own (count
// elements). ZPS_ERANGE for a range outside the n elements, ZPS_EINVAL for
// a wrong out_len or a delta + e that is not finite or beyond
// ZPS_QUANT_MAX; either way nothing changes, e included.
zps_err zps_quant_ef_encode(zps_quant_ef *ef, size_t offset, const float *restrict delta,
                            size_t count, uint8_t *restrict out, size_t out_len);

// The residual: n elements, borrowed, valid until the next call on ef.
const float *zps_quant_ef_residual(const zps_quant_ef *ef);
// Zeroes the residual: when the worker's theta_sync is set anew without
// its last push counted (a rollback, a rejoin), what was kept is void.
void zps_quant_ef_reset(zps_quant_ef *ef);

#endif
