/* zps_nodes.h - a deterministic shard's sums of one step: for each bucket,
 * the tree nodes (common/zps_tree.h) pushed so far, each sibling pair added
 * into its parent as soon as both are in, up to the root.
 *
 * Nodes of a bucket are disjoint (the shard's slice table drops a push
 * that overlaps one counted), and disjoint aligned nodes that tile the
 * batch add up, pair by pair, to the root: so the root is in once the
 * bucket's pushes cover the batch, with the bits of the tree's one order,
 * whatever pieces the nodes came in and in what order they arrived.
 * Memory: one bucket-sized array per node held, reused across steps. */
#ifndef ZPS_NODES_H
#define ZPS_NODES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/zps_err.h"
#include "common/zps_tree.h"

typedef struct zps_nodes zps_nodes;

// Writes a push's values into dst (the bucket's length): copies them, or
// adds them (dst[i] = dst[i] + value, fp32) when add is true.
typedef void (*zps_nodes_fill_fn)(void *arg, float *dst, bool add);

// A store for a tree of n leaves over n_buckets buckets of the lengths
// given (copied). Caller owns the result; NULL on failure, logged.
zps_nodes *zps_nodes_new(uint32_t n, int n_buckets, const size_t *len);
void zps_nodes_destroy(zps_nodes **t);

// Node x of bucket b, its values written by fill: added to its sibling if
// that is in (and the sum to its own, up the tree), kept otherwise.
// ZPS_ENOMEM, nothing changed, when no array is left for it.
zps_err zps_nodes_add(zps_nodes *t, int b, zps_tree_node x, zps_nodes_fill_fn fill, void *arg);
// Bucket b's root, the sum of all its micro-batches, once it is in; NULL
// before.
const float *zps_nodes_root(const zps_nodes *t, int b);
// Nodes held for bucket b (tests, and a log line when a step ends short).
int zps_nodes_held(const zps_nodes *t, int b);
// Forgets every node: the step is over or abandoned. Arrays are kept.
void zps_nodes_clear(zps_nodes *t);

#endif
