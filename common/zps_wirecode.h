/* zps_wirecode.h - a tensor message's frames coded and decoded with the
 * lossless code of common/zps_zcode.h (--wire-code zstd): a frame of the
 * message holds one coded frame of at most ZPS_ZCODE_MAX fp32 values, so
 * a decoded message has the frames, and the bytes, it would have had
 * uncoded, and every check of a tensor applies to it as to any other. */
#ifndef ZPS_WIRECODE_H
#define ZPS_WIRECODE_H

#include <stddef.h>
#include <stdint.h>

#include "zps_err.h"
#include "zps_wire.h"
#include "zps_zcode.h"

// Replaces frames [0, out->n_frames) of fp32 values by their code, each
// XORed with base's values at its place unless base is NULL (base[0] is
// the first element of the first frame). Whole or not at all: on
// ZPS_ENOMEM (logged) the frames are as they were.
zps_err zps_wirecode_encode(zps_zcode *z, zps_wire_msg *out, const float *base);

// Replaces the coded frames of a received tensor message (m->hdr->wire_code
// not 0) by the values they hold, XORed with base's (base[0] is element
// m->hdr->offset's) when wire_code is ZPS_ZCODE_XOR (base is then needed),
// and clears wire_code: m is then as if sent uncoded (code_base, which
// says what the sender holds, stays). At
// most max_count values are decoded (the receiver's range: a peer cannot
// make it allocate more). ZPS_EPROTO and the reason, m's frames then not
// to be used, for what the encoder does not make; ZPS_ENOMEM (logged).
zps_err zps_wirecode_decode(zps_zcode *z, zps_wire_msg *m, const float *base, uint64_t max_count,
                            char *why, size_t why_len);

#endif
