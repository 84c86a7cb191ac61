/* zps_nodes.c - a deterministic shard's tree nodes, added pair by pair. */
#include "zps_nodes.h"

#include <stdlib.h>

#include "common/zps_log.h"

typedef struct s_held {
    zps_tree_node node;
    float *values;      // owned: the bucket's length
} s_held;

typedef struct s_bucket {
    size_t len;         // floats of the bucket
    s_held *held;       // nodes in, at most n (disjoint, each at least a leaf)
    int n_held;
    float **spare;      // arrays not in use, kept for the next node
    int n_spare;
} s_bucket;

struct zps_nodes {
    uint32_t n;         // leaves
    int n_buckets;
    s_bucket *buckets;  // owned
};

zps_nodes *zps_nodes_new(uint32_t n, int n_buckets, const size_t *len)
{
    zps_nodes *t = calloc(1, sizeof *t);
    if (!t || !(t->buckets = calloc((size_t)n_buckets, sizeof *t->buckets))) {
        free(t);
        zps_log_error("cannot allocate the tree of %u micro-batches", n);
        return NULL;
    }
    t->n = n;
    t->n_buckets = n_buckets;
    for (int b = 0; b < n_buckets; b++) {
        s_bucket *k = &t->buckets[b];
        k->len = len[b];
        // Held and spare arrays together never outnumber the leaves, plus
        // the one being filled.
        k->held = calloc((size_t)n + 1, sizeof *k->held);
        k->spare = calloc((size_t)n + 1, sizeof *k->spare);
        if (!k->held || !k->spare) {
            zps_nodes_destroy(&t);
            zps_log_error("cannot allocate the tree of %u micro-batches", n);
            return NULL;
        }
    }
    return t;
}

void zps_nodes_destroy(zps_nodes **tp)
{
    zps_nodes *t = *tp;
    if (!t) {
        return;
    }
    zps_nodes_clear(t);
    for (int b = 0; b < t->n_buckets; b++) {
        s_bucket *k = &t->buckets[b];
        for (int i = 0; i < k->n_spare; i++) {
            free(k->spare[i]);
        }
        free(k->held);
        free(k->spare);
    }
    free(t->buckets);
    free(t);
    *tp = NULL;
}

static float *s_take(s_bucket *k)
{
    return k->n_spare > 0 ? k->spare[--k->n_spare] : malloc(k->len * sizeof(float));
}

static void s_give(s_bucket *k, float *values)
{
    k->spare[k->n_spare++] = values;
}

// The index of node x among k's held nodes, or -1.
static int s_find(const s_bucket *k, zps_tree_node x)
{
    for (int i = 0; i < k->n_held; i++) {
        if (k->held[i].node.lo == x.lo && k->held[i].node.size == x.size) {
            return i;
        }
    }
    return -1;
}

static void s_drop(s_bucket *k, int i)
{
    k->held[i] = k->held[--k->n_held];
}

// cur (its values owned) added into its held siblings, up the tree, then kept.
static void s_climb(const zps_nodes *t, s_bucket *k, s_held cur)
{
    int i;
    while (!zps_tree_is_root(t->n, cur.node) && (i = s_find(k, zps_tree_sibling(cur.node))) >= 0) {
        float *dst = k->held[i].values;
        for (size_t e = 0; e < k->len; e++) {
            dst[e] = dst[e] + cur.values[e];
        }
        s_give(k, cur.values);
        cur = (s_held){.node = zps_tree_lift(t->n, zps_tree_parent(cur.node)), .values = dst};
        s_drop(k, i);
    }
    k->held[k->n_held++] = cur;
}

zps_err zps_nodes_add(zps_nodes *t, int b, zps_tree_node x, zps_nodes_fill_fn fill, void *arg)
{
    s_bucket *k = &t->buckets[b];
    x = zps_tree_lift(t->n, x);
    int i = zps_tree_is_root(t->n, x) ? -1 : s_find(k, zps_tree_sibling(x));
    if (i >= 0) {
        // Its sibling is in: the push goes straight into it, no copy.
        s_held sib = k->held[i];
        s_drop(k, i);
        fill(arg, sib.values, true);
        s_climb(t, k, (s_held){.node = zps_tree_lift(t->n, zps_tree_parent(x)),
                               .values = sib.values});
        return ZPS_OK;
    }
    float *values = s_take(k);
    if (!values) {
        zps_log_error("cannot allocate a tree node of %zu floats", k->len);
        return ZPS_ENOMEM;
    }
    fill(arg, values, false);
    s_climb(t, k, (s_held){.node = x, .values = values});
    return ZPS_OK;
}

const float *zps_nodes_root(const zps_nodes *t, int b)
{
    const s_bucket *k = &t->buckets[b];
    for (int i = 0; i < k->n_held; i++) {
        if (zps_tree_is_root(t->n, k->held[i].node)) {
            return k->held[i].values;
        }
    }
    return NULL;
}

int zps_nodes_held(const zps_nodes *t, int b)
{
    return t->buckets[b].n_held;
}

void zps_nodes_clear(zps_nodes *t)
{
    for (int b = 0; b < t->n_buckets; b++) {
        s_bucket *k = &t->buckets[b];
        while (k->n_held > 0) {
            s_give(k, k->held[--k->n_held].values);
        }
    }
}
