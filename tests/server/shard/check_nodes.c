/* check_nodes.c - a deterministic shard's tree nodes: the root of a bucket
 * has the tree's bits whatever pieces its nodes came in and in whatever
 * order they arrived, and the store forgets a step whole. */
#include <stdlib.h>
#include <string.h>

#include "server/shard/zps_nodes.h"
#include "tests/zps_check.h"

#define LEN 3     // floats of the one bucket
#define MAX_N 16  // leaves at most

typedef struct s_push {
    zps_tree_node node;
    float values[LEN];
} s_push;

static void s_fill(void *arg, float *dst, bool add)
{
    const s_push *p = arg;
    for (int e = 0; e < LEN; e++) {
        dst[e] = add ? dst[e] + p->values[e] : p->values[e];
    }
}

// Leaf i's gradient: unlike magnitudes, so that the order of sums shows.
static void s_leaves(float leaf[][LEN], uint32_t n, unsigned seed)
{
    srand(seed);
    static const float scale[] = {1e-6f, 1e-3f, 1.0f, 3e2f, 7e4f};
    for (uint32_t i = 0; i < n; i++) {
        for (int e = 0; e < LEN; e++) {
            leaf[i][e] = ((float)rand() / (float)RAND_MAX - 0.5f) * scale[rand() % 5];
        }
    }
}

// The tree's value of node x, element e (zps_tree.h's definition).
static float s_value(float leaf[][LEN], uint32_t n, zps_tree_node x, int e)
{
    if (x.size == 1) {
        return leaf[x.lo][e];
    }
    zps_tree_node l = {x.lo, x.size / 2}, r = {x.lo + x.size / 2, x.size / 2};
    float v = s_value(leaf, n, l, e);
    return zps_tree_empty(n, r) ? v : v + s_value(leaf, n, r, e);
}

// The pushes of a split of [0, n) at cuts (ascending, inside (0, n)): each
// piece's canonical nodes with the tree's values, as workers push them.
static int s_split(float leaf[][LEN], uint32_t n, const uint32_t *cuts, int n_cuts, s_push *out)
{
    int k = 0;
    for (int c = 0; c <= n_cuts; c++) {
        uint32_t lo = c ? cuts[c - 1] : 0, hi = c < n_cuts ? cuts[c] : n;
        zps_tree_stack st;
        zps_tree_stack_init(&st, n);
        for (uint32_t i = lo; i < hi; i++) {
            int into, from;
            (void)zps_tree_stack_push(&st, i);
            while (zps_tree_stack_merge(&st, &into, &from)) {
            }
        }
        for (int d = 0; d < st.depth; d++, k++) {
            out[k].node = st.node[d];
            for (int e = 0; e < LEN; e++) {
                out[k].values[e] = s_value(leaf, n, zps_tree_lift(n, st.node[d]), e);
            }
        }
    }
    return k;
}

// The root after pushes p[0..k) in the order `order`.
static void s_root(uint32_t n, const s_push *p, const int *order, int k, float *root)
{
    size_t len = LEN;
    zps_nodes *t = zps_nodes_new(n, 1, &len);
    ck_assert_ptr_nonnull(t);
    for (int i = 0; i < k; i++) {
        ck_assert_ptr_null(zps_nodes_root(t, 0)); // not before the last
        ck_assert_int_eq(zps_nodes_add(t, 0, p[order[i]].node, s_fill, (void *)&p[order[i]]),
                         ZPS_OK);
    }
    ck_assert_ptr_nonnull(zps_nodes_root(t, 0));
    ck_assert_int_eq(zps_nodes_held(t, 0), 1);
    memcpy(root, zps_nodes_root(t, 0), LEN * sizeof(float));
    zps_nodes_destroy(&t);
    ck_assert_ptr_null(t);
}

static void s_shuffle(int *order, int k)
{
    for (int i = k - 1; i > 0; i--) {
        int j = rand() % (i + 1), tmp = order[i];
        order[i] = order[j];
        order[j] = tmp;
    }
}

// Random splits of n leaves, their pushes in random orders: every root has
// the bits of the tree's root.
static void s_check_any_split(uint32_t n, unsigned seed)
{
    float leaf[MAX_N][LEN];
    s_leaves(leaf, n, seed);
    float want[LEN];
    for (int e = 0; e < LEN; e++) {
        want[e] = s_value(leaf, n, (zps_tree_node){0, zps_tree_width(n)}, e);
    }
    for (int trial = 0; trial < 50; trial++) {
        uint32_t cuts[MAX_N];
        int n_cuts = 0;
        for (uint32_t c = 1; c < n; c++) {
            if (rand() % 3 == 0) {
                cuts[n_cuts++] = c;
            }
        }
        s_push p[4 * MAX_N];
        int k = s_split(leaf, n, cuts, n_cuts, p);
        int order[4 * MAX_N];
        for (int i = 0; i < k; i++) {
            order[i] = i;
        }
        s_shuffle(order, k);
        float got[LEN];
        s_root(n, p, order, k, got);
        ck_assert_mem_eq(got, want, sizeof want);
    }
}

START_TEST(test_nodes_any_split_in_any_order_gives_the_trees_root)
{
    s_check_any_split(8, 1);
    s_check_any_split(13, 2);
    s_check_any_split(6, 3);
    s_check_any_split(1, 4);
}
END_TEST

START_TEST(test_nodes_the_root_differs_from_a_sum_in_arrival_order)
{
    // What the test above compares is not order-blind: summing the same
    // leaves left to right gives other bits.
    float leaf[MAX_N][LEN];
    s_leaves(leaf, 13, 2);
    int differ = 0;
    for (int e = 0; e < LEN; e++) {
        float seq = 0;
        for (int i = 0; i < 13; i++) {
            seq += leaf[i][e];
        }
        float root = s_value(leaf, 13, (zps_tree_node){0, 16}, e);
        differ += memcmp(&seq, &root, sizeof seq) != 0;
    }
    ck_assert_int_gt(differ, 0);
}
END_TEST

START_TEST(test_nodes_clear_forgets_the_step_and_keeps_working)
{
    size_t len = LEN;
    zps_nodes *t = zps_nodes_new(4, 1, &len);
    ck_assert_ptr_nonnull(t);
    s_push a = {.node = {0, 2}, .values = {1, 2, 3}}, b = {.node = {2, 2}, .values = {4, 5, 6}};
    ck_assert_int_eq(zps_nodes_add(t, 0, a.node, s_fill, &a), ZPS_OK);
    ck_assert_int_eq(zps_nodes_held(t, 0), 1);
    zps_nodes_clear(t);
    ck_assert_int_eq(zps_nodes_held(t, 0), 0);
    ck_assert_ptr_null(zps_nodes_root(t, 0));
    // The step again: a's old sum is gone, the root is a + b once.
    ck_assert_int_eq(zps_nodes_add(t, 0, b.node, s_fill, &b), ZPS_OK);
    ck_assert_ptr_null(zps_nodes_root(t, 0));
    ck_assert_int_eq(zps_nodes_add(t, 0, a.node, s_fill, &a), ZPS_OK);
    const float *root = zps_nodes_root(t, 0);
    ck_assert_ptr_nonnull(root);
    ck_assert(root[0] == 5 && root[1] == 7 && root[2] == 9);
    zps_nodes_destroy(&t);
}
END_TEST

Suite *zps_suite_nodes(void)
{
    Suite *s = suite_create("nodes");
    TCase *tc = tcase_create("nodes");
    tcase_add_test(tc, test_nodes_any_split_in_any_order_gives_the_trees_root);
    tcase_add_test(tc, test_nodes_the_root_differs_from_a_sum_in_arrival_order);
    tcase_add_test(tc, test_nodes_clear_forgets_the_step_and_keeps_working);
    suite_add_tcase(s, tc);
    return s;
}
