/* zps_cover.h - which samples of the global batch each bucket of a shard
 * has counted in the step in progress.
 *
 * A push counts for its bucket only if its slice is disjoint from every
 * slice already counted for it (speculation hands pieces of a late slice to
 * others, and the first copy of a sample counts). With thousands of members
 * a scan of the step's slices per push is quadratic in the members; one bit
 * per sample and bucket makes the check and the "is this slice done" of the
 * late-slice detector linear in the slice instead. */
#ifndef ZPS_COVER_H
#define ZPS_COVER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/zps_err.h"

typedef struct zps_cover {
    uint32_t batch;  // B: samples per bucket
    int n_buckets;
    uint32_t words;  // 64-bit words per bucket
    uint64_t *bits;  // owned: n_buckets * words, bucket-major
} zps_cover;

// Room for n_buckets buckets of B samples, none counted; ZPS_ENOMEM if not.
zps_err zps_cover_init(zps_cover *c, uint32_t batch, int n_buckets);
// Frees; safe on zeroed memory and twice.
void zps_cover_fini(zps_cover *c);
// Whether any sample of [lo, hi) is counted for bucket b.
bool zps_cover_any(const zps_cover *c, int b, uint32_t lo, uint32_t hi);
// Samples of [lo, hi) counted for bucket b.
uint32_t zps_cover_count(const zps_cover *c, int b, uint32_t lo, uint32_t hi);
// Counts [lo, hi) for bucket b.
void zps_cover_add(zps_cover *c, int b, uint32_t lo, uint32_t hi);
// Nothing counted: the next step.
void zps_cover_clear(zps_cover *c);

#endif
