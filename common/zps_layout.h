/* zps_layout.h - a model declared by its workers (--model external): its
 * named tensors, as they travel in HELLO, JOB and ASSIGN (Zps__Layout).
 *
 * The first admitted worker's layout fixes the job's: P, the bucket cuts
 * (so every process cuts the flat vector alike) and the digest every later
 * worker's layout is compared by. A mismatch is told by the first tensor
 * that differs. Socket-free: the coordinator, the shards and libzps use it
 * on what they received or built. */
#ifndef ZPS_LAYOUT_H
#define ZPS_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/zps.pb-c.h"
#include "zps_err.h"
#include "zps_model.h"

#define ZPS_LAYOUT_MAX_TENSORS 4096
#define ZPS_LAYOUT_MAX_DIMS 8
#define ZPS_LAYOUT_MAX_NAME 127 // bytes of a tensor's name

// Whether l can be a job's model: 1..ZPS_LAYOUT_MAX_TENSORS tensors, each
// with a unique name of printable characters without spaces, at most
// ZPS_LAYOUT_MAX_DIMS dimensions of at least 1 each, and 1..ZPS_MODEL_MAX_FLAT
// elements in all; its groups and roles as zps_groups_check has them.
// ZPS_EINVAL with the reason in why.
zps_err zps_layout_check(const Zps__Layout *l, char *why, size_t len);

// Elements of the flat vector (the product of each shape, summed).
uint64_t zps_layout_n_params(const Zps__Layout *l);

// FNV-1a over names and shapes, in order: equal layouts, equal digests.
uint64_t zps_layout_digest(const Zps__Layout *l);

// False when the two are the same; true with why naming the first tensor
// that differs (its index, name and shapes, or which side has more).
bool zps_layout_differs(const Zps__Layout *ours, const Zps__Layout *theirs, char *why,
                        size_t len);

// False when a declared layout is built-in MLP m's flat layout: for each
// layer in forward order its weight (out, in), then its bias (out), as
// torch's nn.Sequential of nn.Linear declares them. The names are the
// declarer's own; only the shapes and their order count. True with why
// naming the first tensor that differs.
bool zps_layout_differs_mlp(const zps_model_spec *m, const Zps__Layout *l, char *why,
                            size_t len);

// The model spec of a checked layout: kind ZPS_MODEL_EXTERNAL, its text
// "external:<digest>" (what checkpoints name), P, and the bucket cuts. A
// bucket is one tensor, or neighbouring small tensors grouped up to about
// ZPS_MODEL_FLAT_BUCKET elements, or a piece of a large tensor; numbered
// from the last tensor on, the order backward finishes them (as DDP's
// buckets); at most ZPS_MODEL_MAX_BUCKETS (the size doubles until they fit).
// Shards cut them once more at their range's ends (zps_model_range_buckets).
void zps_layout_model(const Zps__Layout *l, zps_model_spec *out);

#endif
