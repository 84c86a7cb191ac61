/* zps_micro.h - a deterministic job's pushes (zps_push_micro): the
 * micro-batches of the piece handed out, summed as they come into the
 * piece's canonical nodes (common/zps_tree.h), bucket by bucket, and each
 * node pushed once a bucket's last micro-batch is in. */
#ifndef ZPS_MICRO_H
#define ZPS_MICRO_H

#include <stddef.h>
#include <stdint.h>

#include "common/zps_err.h"
#include "common/zps_model.h"
#include "common/zps_tree.h"

typedef struct zps_micro {
    uint32_t m;                                   // M; 0: not a deterministic job
    uint32_t n;                                   // B / M, the tree's leaves
    size_t p;                                     // floats of a slot (the flat vector)
    float *slot[ZPS_TREE_MAX_STACK];              // owned, as needed: a node's values, P floats
    uint32_t work_id;                             // the piece the state below is of
    zps_tree_stack stack[ZPS_MODEL_MAX_BUCKETS];  // each bucket's nodes so far
    uint32_t next[ZPS_MODEL_MAX_BUCKETS];         // each bucket's next micro-batch
    float *loss;                                  // owned: the piece's micro-batch losses
    uint32_t cap_loss;
} zps_micro;

// A zeroed zps_micro is an empty one; zps_micro_fini frees what it holds.
void zps_micro_fini(zps_micro *mb);
// The job's M (0: none) for a global batch B (a multiple of it) and P floats.
void zps_micro_set_job(zps_micro *mb, uint32_t m, uint32_t global_batch, size_t p);

#endif
