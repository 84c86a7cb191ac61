/* zps_tree.c - the canonical tree of a deterministic job's micro-batches. */
#include "zps_tree.h"

uint32_t zps_tree_width(uint32_t n)
{
    uint32_t w = 1;
    while (w < n && w < (1u << (ZPS_TREE_MAX_LEVELS - 1))) {
        w <<= 1;
    }
    return w;
}

uint32_t zps_tree_end(uint32_t n, zps_tree_node x)
{
    uint64_t end = (uint64_t)x.lo + x.size;
    return end < n ? (uint32_t)end : n;
}

bool zps_tree_empty(uint32_t n, zps_tree_node x)
{
    return x.lo >= n;
}

bool zps_tree_is_root(uint32_t n, zps_tree_node x)
{
    return x.lo == 0 && x.size >= zps_tree_width(n);
}

zps_tree_node zps_tree_parent(zps_tree_node x)
{
    return (zps_tree_node){.lo = x.lo & ~(2 * x.size - 1), .size = 2 * x.size};
}

zps_tree_node zps_tree_sibling(zps_tree_node x)
{
    return (zps_tree_node){.lo = x.lo ^ x.size, .size = x.size};
}

zps_tree_node zps_tree_lift(uint32_t n, zps_tree_node x)
{
    while (!zps_tree_is_root(n, x) && zps_tree_empty(n, zps_tree_sibling(x))) {
        x = zps_tree_parent(x);
    }
    return x;
}

bool zps_tree_node_of(uint32_t n, uint32_t lo, uint32_t hi, zps_tree_node *out)
{
    if (lo >= hi || hi > n) {
        return false;
    }
    // The smallest node that starts at lo and reaches hi; lifted, it is the
    // largest of the same range, if its range is [lo, hi) at all.
    uint32_t size = 1;
    while (size < hi - lo && size < (1u << (ZPS_TREE_MAX_LEVELS - 1))) {
        size <<= 1;
    }
    zps_tree_node x = {.lo = lo, .size = size};
    if (lo % size != 0 || zps_tree_end(n, x) != hi) {
        return false;
    }
    *out = zps_tree_lift(n, x);
    return true;
}

bool zps_tree_within(zps_tree_node a, zps_tree_node b)
{
    return a.lo >= b.lo && (uint64_t)a.lo + a.size <= (uint64_t)b.lo + b.size;
}

void zps_tree_stack_init(zps_tree_stack *st, uint32_t n)
{
    st->n = n;
    st->depth = 0;
}

int zps_tree_stack_push(zps_tree_stack *st, uint32_t leaf)
{
    // A piece's nodes are at most 2 per level: the stack never fills.
    st->node[st->depth] = zps_tree_lift(st->n, (zps_tree_node){.lo = leaf, .size = 1});
    return st->depth++;
}

bool zps_tree_stack_merge(zps_tree_stack *st, int *into, int *from)
{
    if (st->depth < 2) {
        return false;
    }
    zps_tree_node left = st->node[st->depth - 2], right = st->node[st->depth - 1];
    if (left.size != right.size || zps_tree_sibling(left).lo != right.lo || right.lo < left.lo) {
        return false;
    }
    *into = st->depth - 2;
    *from = st->depth - 1;
    st->node[st->depth - 2] = zps_tree_lift(st->n, zps_tree_parent(left));
    st->depth--;
    return true;
}
