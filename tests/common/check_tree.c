/* check_tree.c - the canonical tree of a deterministic job: which ranges
 * are nodes, how a piece decomposes, and that a piece's stack sums give
 * each node the value of the tree's one order, whatever the split. */
#include <stdlib.h>
#include <string.h>

#include "common/zps_tree.h"
#include "tests/zps_check.h"

static zps_tree_node s_node(uint32_t lo, uint32_t size)
{
    return (zps_tree_node){.lo = lo, .size = size};
}

static void s_assert_node(zps_tree_node got, uint32_t lo, uint32_t size)
{
    ck_assert_msg(got.lo == lo && got.size == size, "node (%u, %u), want (%u, %u)", got.lo,
                  got.size, lo, size);
}

// The value of node x of the tree over leaf[0..n): left + right in fp32,
// or left alone when right lies past n (the definition in zps_tree.h).
static float s_value(const float *leaf, uint32_t n, zps_tree_node x)
{
    if (x.size == 1) {
        return leaf[x.lo];
    }
    zps_tree_node left = s_node(x.lo, x.size / 2), right = s_node(x.lo + x.size / 2, x.size / 2);
    float l = s_value(leaf, n, left);
    return zps_tree_empty(n, right) ? l : l + s_value(leaf, n, right);
}

// Leaves of very unlike magnitudes, so that the order of the sums shows
// in the result's bits.
static void s_leaves(float *leaf, uint32_t n, unsigned seed)
{
    srand(seed);
    static const float scale[] = {1e-6f, 1e-3f, 1.0f, 3e2f, 7e4f};
    for (uint32_t i = 0; i < n; i++) {
        leaf[i] = ((float)rand() / (float)RAND_MAX - 0.5f) * scale[rand() % 5];
    }
}

// Piece [lo, hi) summed as a worker sums it: its stack's nodes and values.
static int s_piece(const float *leaf, uint32_t n, uint32_t lo, uint32_t hi,
                   zps_tree_node *nodes, float *values)
{
    zps_tree_stack st;
    zps_tree_stack_init(&st, n);
    float slot[ZPS_TREE_MAX_STACK];
    for (uint32_t i = lo; i < hi; i++) {
        slot[zps_tree_stack_push(&st, i)] = leaf[i];
        int into, from;
        while (zps_tree_stack_merge(&st, &into, &from)) {
            ck_assert_int_eq(into + 1, from);
            slot[into] = slot[into] + slot[from];
        }
    }
    memcpy(nodes, st.node, (size_t)st.depth * sizeof *nodes);
    memcpy(values, slot, (size_t)st.depth * sizeof *values);
    return st.depth;
}

START_TEST(test_tree_width_is_the_next_power_of_two)
{
    ck_assert_uint_eq(zps_tree_width(1), 1);
    ck_assert_uint_eq(zps_tree_width(5), 8);
    ck_assert_uint_eq(zps_tree_width(8), 8);
    ck_assert_uint_eq(zps_tree_width(9), 16);
}
END_TEST

START_TEST(test_tree_node_of_names_aligned_ranges_only)
{
    zps_tree_node x;
    ck_assert(zps_tree_node_of(8, 0, 8, &x));
    s_assert_node(x, 0, 8);
    ck_assert(zps_tree_is_root(8, x));
    ck_assert(zps_tree_node_of(8, 2, 4, &x));
    s_assert_node(x, 2, 2);
    ck_assert(!zps_tree_node_of(8, 1, 3, &x)); // two leaves, but not siblings
    ck_assert(!zps_tree_node_of(8, 0, 3, &x)); // not a power of two
    ck_assert(!zps_tree_node_of(8, 0, 0, &x)); // empty
    ck_assert(!zps_tree_node_of(8, 4, 9, &x)); // past n
}
END_TEST

START_TEST(test_tree_a_range_cut_short_by_n_is_its_largest_node)
{
    // n = 6, w = 8: [4, 6) is (4, 2) and also (4, 4), whose right half is
    // empty: one value, named by its largest node.
    zps_tree_node x;
    ck_assert(zps_tree_node_of(6, 4, 6, &x));
    s_assert_node(x, 4, 4);
    s_assert_node(zps_tree_lift(6, s_node(4, 2)), 4, 4);
    ck_assert(zps_tree_node_of(6, 0, 6, &x));
    s_assert_node(x, 0, 8);
    ck_assert(zps_tree_is_root(6, x));
    ck_assert(zps_tree_empty(6, s_node(6, 2)));
    ck_assert(!zps_tree_empty(6, s_node(4, 2)));
    ck_assert_uint_eq(zps_tree_end(6, s_node(4, 4)), 6);
    s_assert_node(zps_tree_parent(s_node(4, 2)), 4, 4);
    s_assert_node(zps_tree_sibling(s_node(4, 2)), 6, 2);
    ck_assert(zps_tree_within(s_node(4, 2), s_node(0, 8)));
    ck_assert(!zps_tree_within(s_node(0, 8), s_node(4, 2)));
}
END_TEST

START_TEST(test_tree_a_piece_decomposes_into_its_canonical_nodes)
{
    float leaf[8] = {0};
    zps_tree_node nodes[ZPS_TREE_MAX_STACK];
    float values[ZPS_TREE_MAX_STACK];
    ck_assert_int_eq(s_piece(leaf, 8, 1, 5, nodes, values), 3); // [1,2) [2,4) [4,5)
    s_assert_node(nodes[0], 1, 1);
    s_assert_node(nodes[1], 2, 2);
    s_assert_node(nodes[2], 4, 1);
    ck_assert_int_eq(s_piece(leaf, 8, 0, 8, nodes, values), 1);
    s_assert_node(nodes[0], 0, 8);
}
END_TEST

// Every piece of every split of n leaves: each node the stack ends with is
// a node of the tree (node_of names it) with the value the tree gives it.
static void s_check_splits(uint32_t n, unsigned seed)
{
    float *leaf = malloc(n * sizeof *leaf);
    ck_assert_ptr_nonnull(leaf);
    s_leaves(leaf, n, seed);
    zps_tree_node nodes[ZPS_TREE_MAX_STACK];
    float values[ZPS_TREE_MAX_STACK];
    for (uint32_t lo = 0; lo < n; lo++) {
        for (uint32_t hi = lo + 1; hi <= n; hi++) {
            int depth = s_piece(leaf, n, lo, hi, nodes, values);
            uint32_t at = lo;
            for (int k = 0; k < depth; k++) {
                zps_tree_node named;
                uint32_t end = zps_tree_end(n, nodes[k]);
                ck_assert_uint_eq(nodes[k].lo, at); // left to right, tiling the piece
                ck_assert(zps_tree_node_of(n, nodes[k].lo, end, &named));
                float want = s_value(leaf, n, named);
                ck_assert_mem_eq(&values[k], &want, sizeof want);
                at = end;
            }
            ck_assert_uint_eq(at, hi);
            ck_assert_int_le(depth, 2 * ZPS_TREE_MAX_LEVELS);
        }
    }
    free(leaf);
}

START_TEST(test_tree_stack_sums_are_the_trees_values_for_every_piece)
{
    s_check_splits(8, 1);
    s_check_splits(6, 2);
    s_check_splits(13, 3);
    s_check_splits(1, 4);
}
END_TEST

START_TEST(test_tree_order_matters_so_the_check_can_fail)
{
    // The tree's root and a left-to-right sum of the same leaves differ
    // (1e8 + 1 rounds to 1e8): what the checks above compare is not
    // order-blind.
    float leaf[4] = {1e8f, 1.0f, -1e8f, 1.0f};
    float seq = 0;
    for (int i = 0; i < 4; i++) {
        seq += leaf[i];
    }
    ck_assert_float_eq(s_value(leaf, 4, s_node(0, 4)), 0.0f); // (1e8 + 1) + (-1e8 + 1)
    ck_assert_float_eq(seq, 1.0f);
}
END_TEST

Suite *zps_suite_tree(void)
{
    Suite *s = suite_create("tree");
    TCase *tc = tcase_create("tree");
    tcase_add_test(tc, test_tree_width_is_the_next_power_of_two);
    tcase_add_test(tc, test_tree_node_of_names_aligned_ranges_only);
    tcase_add_test(tc, test_tree_a_range_cut_short_by_n_is_its_largest_node);
    tcase_add_test(tc, test_tree_a_piece_decomposes_into_its_canonical_nodes);
    tcase_add_test(tc, test_tree_stack_sums_are_the_trees_values_for_every_piece);
    tcase_add_test(tc, test_tree_order_matters_so_the_check_can_fail);
    suite_add_tcase(s, tc);
    return s;
}
