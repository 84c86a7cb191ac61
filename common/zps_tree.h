/* zps_tree.h - the one order in which a deterministic job sums its
 * micro-batches (zps-server --deterministic --micro-batch M).
 *
 * The global batch is n = B / M micro-batches. Their mean gradients are
 * summed as a balanced binary tree over the micro-batch indices, padded to
 * the next power of two, w: node (lo, size), size a power of two and lo a
 * multiple of it, stands for micro-batches [lo, lo + size) cut to [0, n),
 * and its value is its left child's plus its right child's (fp32, one
 * rounding), or its left child's alone when the right one lies wholly past
 * n. So every node has one value, whoever computes it: a worker sums the
 * micro-batches of its piece into the piece's canonical nodes (the fewest
 * aligned nodes that tile it, at most about 2 log2 n), a shard adds the
 * nodes of every piece up to the root, and any split of the batch, any
 * reassigned or speculative piece, gives the root the same bits.
 *
 * A node is named by its micro-batches cut to [0, n): a node whose right
 * part lies past n has the range of its left part, and the same value, so
 * (offset, samples) of a push names one value; zps_tree_node_of gives the
 * largest node of that range, and a node past n is empty (no value). */
#ifndef ZPS_TREE_H
#define ZPS_TREE_H

#include <stdbool.h>
#include <stdint.h>

// Levels of a tree over up to 2^31 micro-batches, and the most nodes the
// canonical decomposition of one range can have.
#define ZPS_TREE_MAX_LEVELS 32
#define ZPS_TREE_MAX_STACK (2 * ZPS_TREE_MAX_LEVELS)

typedef struct zps_tree_node {
    uint32_t lo;   // first micro-batch
    uint32_t size; // a power of two; lo % size == 0
} zps_tree_node;

// w: the smallest power of two >= n (n >= 1).
uint32_t zps_tree_width(uint32_t n);
// The end of x's micro-batches cut to [0, n): min(lo + size, n).
uint32_t zps_tree_end(uint32_t n, zps_tree_node x);
// True when x lies wholly past n: it has no value, and its sibling's is its
// parent's.
bool zps_tree_empty(uint32_t n, zps_tree_node x);
bool zps_tree_is_root(uint32_t n, zps_tree_node x);
zps_tree_node zps_tree_parent(zps_tree_node x);
zps_tree_node zps_tree_sibling(zps_tree_node x);
// x raised while its sibling is empty: the largest node of x's range.
zps_tree_node zps_tree_lift(uint32_t n, zps_tree_node x);
// The node of micro-batches [lo, hi) (hi <= n), lifted: false if that range
// is not one node's (a piece not cut as the tree cuts it).
bool zps_tree_node_of(uint32_t n, uint32_t lo, uint32_t hi, zps_tree_node *out);
// True when a lies within b.
bool zps_tree_within(zps_tree_node a, zps_tree_node b);

// A piece's micro-batches summed as they come, in order: its canonical
// nodes, left to right, as a stack whose slot i the caller keeps a value
// for. zps_tree_stack_push says into which slot a new leaf's value goes;
// then, for as long as zps_tree_stack_merge says so, the caller adds the
// value of slot `from` into slot `into` (into + 1 == from, left + right).
// After the piece's last leaf the stack holds its canonical nodes.
typedef struct zps_tree_stack {
    uint32_t n;                               // micro-batches of the global batch
    int depth;                                // nodes held
    zps_tree_node node[ZPS_TREE_MAX_STACK];   // bottom first
} zps_tree_stack;

void zps_tree_stack_init(zps_tree_stack *st, uint32_t n);
// The slot for leaf `leaf` (< n).
int zps_tree_stack_push(zps_tree_stack *st, uint32_t leaf);
// True with a pair of slots to add (into += from), which becomes their
// parent in slot `into`; false once the top is no left node's right sibling.
bool zps_tree_stack_merge(zps_tree_stack *st, int *into, int *from);

#endif
