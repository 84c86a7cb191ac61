/* zps_zcode.h - a lossless code for fp32 tensors on the wire (--wire-code
 * zstd): each element's four bytes split into four byte planes, each plane
 * compressed with zstd, optionally of the values XORed with a base that
 * both ends hold (the parameters of the step before: most of a step's
 * change leaves the sign, the exponent and the high mantissa bits as they
 * were, so those planes are mostly zeros). Decoding gives back the same
 * bits, so a job with the code computes what one without it does; it only
 * trades CPU for bytes (docs/choices.md, "A lossless code of the wire").
 *
 * A coded frame holds one frame's elements (at most ZPS_ZCODE_MAX
 * of them), little-endian:
 *
 *   bytes [0, 4)     "ZPZ1"
 *   bytes [4, 8)     n, the elements
 *   bytes [8, 16)    XXH3-64 of the decoded values (n * 4 bytes)
 *   bytes [16, 32)   len[p], p = 0..3: plane p's bytes in the frame
 *   bytes [32, ...)  the planes, plane 3 first, 0 last; plane p is byte
 *                    p of every element (p = 3: the sign and the
 *                    exponent's top); stored as it is when len[p] == n,
 *                    else one zstd frame of exactly n bytes
 *
 * The decoder takes bytes from the network: anything else than what the
 * encoder makes (a length that does not add up, a plane that is not n
 * bytes, a hash that does not match, which is also what a base other than
 * the encoder's gives) is ZPS_EPROTO with a reason, and what it wrote to
 * dst is not to be used. */
#ifndef ZPS_ZCODE_H
#define ZPS_ZCODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zps_err.h"

// Elements in one coded frame, at most: a wire frame's (ZPS_WIRE_FRAME_BYTES).
#define ZPS_ZCODE_MAX ((size_t)1 << 20)

// Bytes before the planes.
#define ZPS_ZCODE_HEADER 32

// The numbers of Header.wire_code (proto/zps.proto): never renumber.
typedef enum zps_zcode_kind {
    ZPS_ZCODE_NONE = 0,  // raw fp32 frames
    ZPS_ZCODE_PLANES = 1, // each frame coded, no base
    ZPS_ZCODE_XOR = 2,   // each frame coded, XORed with the base named by code_base
} zps_zcode_kind;

// One thread's coder: zstd's contexts and a scratch buffer, reused.
typedef struct zps_zcode zps_zcode;

// A new coder; ZPS_ENOMEM (logged) if there is no memory.
zps_err zps_zcode_new(zps_zcode **out);

// Frees *z and sets it to NULL; NULL is fine.
void zps_zcode_destroy(zps_zcode **z);

// Codes n (1..ZPS_ZCODE_MAX) fp32 values of src, XORed bit for bit with
// base's n values unless base is NULL, into *out (malloc'd, the caller's
// to free) of *out_len bytes. Either may be unaligned. ZPS_ENOMEM or
// ZPS_EINVAL (n out of range), logged.
zps_err zps_zcode_encode(zps_zcode *z, const void *src, const void *base, size_t n, void **out,
                         size_t *out_len);

// The elements a coded frame of len bytes holds, read from its header;
// ZPS_EPROTO and the reason if it is not one.
zps_err zps_zcode_count(const void *frame, size_t len, size_t *n, char *why, size_t why_len);

// Decodes a coded frame of n elements (zps_zcode_count's) into dst,
// XORing with base's n values unless base is NULL. ZPS_EPROTO and the
// reason for a frame the encoder did not make or a base other than its.
zps_err zps_zcode_decode(zps_zcode *z, const void *frame, size_t len, const void *base, void *dst,
                         size_t n, char *why, size_t why_len);

#endif
