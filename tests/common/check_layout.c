/* check_layout.c - a model declared by its workers: what a layout may be,
 * how two are told apart (by the first tensor that differs), and how the
 * flat vector is cut into buckets (small neighbours grouped, large tensors
 * cut, never more than ZPS_MODEL_MAX_BUCKETS, tiling the vector). */
#include <stdio.h>
#include <string.h>

#include "common/zps_layout.h"
#include "tests/zps_check.h"

#define S_MAX 1024

// A layout of n tensors named names[i] ("t<i>" when NULL) of one
// dimension sizes[i] each; lives in the struct.
typedef struct s_layout {
    Zps__Layout l;
    Zps__Tensor t[S_MAX];
    Zps__Tensor *ptrs[S_MAX];
    uint64_t shapes[S_MAX][2];
    char names[S_MAX][24]; // "t" and a size_t
} s_layout;

static void s_make(s_layout *s, size_t n, const char *const *names, const uint64_t *sizes)
{
    zps__layout__init(&s->l);
    for (size_t i = 0; i < n; i++) {
        zps__tensor__init(&s->t[i]);
        snprintf(s->names[i], sizeof s->names[i], "t%zu", i);
        s->t[i].name = names ? (char *)names[i] : s->names[i];
        s->shapes[i][0] = sizes[i];
        s->t[i].shape = s->shapes[i];
        s->t[i].n_shape = 1;
        s->ptrs[i] = &s->t[i];
    }
    s->l.tensors = s->ptrs;
    s->l.n_tensors = n;
}

// Buckets tile [0, P) downwards from bucket 0, none empty.
static void s_assert_tiles(const zps_model_spec *m)
{
    uint64_t hi = m->n_params;
    for (int b = 0; b < zps_model_n_buckets(m); b++) {
        uint64_t blo, bhi;
        zps_model_bucket(m, b, &blo, &bhi);
        ck_assert_uint_eq(bhi, hi);
        ck_assert_uint_lt(blo, bhi);
        hi = blo;
    }
    ck_assert_uint_eq(hi, 0);
}

START_TEST(test_layout_groups_small_neighbours_and_cuts_large_tensors)
{
    static s_layout s;
    const char *names[] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
    uint64_t sizes[] = {200000, 10, 5000, 100};
    s_make(&s, 4, names, sizes);
    char why[256];
    ck_assert_int_eq(zps_layout_check(&s.l, why, sizeof why), ZPS_OK);
    zps_model_spec m;
    zps_layout_model(&s.l, &m);
    ck_assert_int_eq(m.kind, ZPS_MODEL_EXTERNAL);
    ck_assert_uint_eq(m.n_params, 205110);
    ck_assert_int_eq(zps_model_n_buckets(&m), 5);
    s_assert_tiles(&m);
    uint64_t lo, hi;
    zps_model_bucket(&m, 0, &lo, &hi); // backward finishes the last tensors first: grouped
    ck_assert_uint_eq(lo, 200000);
    ck_assert_uint_eq(hi, 205110);
    zps_model_bucket(&m, 1, &lo, &hi); // fc1.weight in four equal pieces
    ck_assert_uint_eq(lo, 150000);
    ck_assert_uint_eq(hi, 200000);
    zps_model_bucket(&m, 4, &lo, &hi);
    ck_assert_uint_eq(lo, 0);
    ck_assert_uint_eq(hi, 50000);
    char text[64]; // what checkpoints name: the layout's digest
    snprintf(text, sizeof text, "external:%016llx",
             (unsigned long long)zps_layout_digest(&s.l));
    ck_assert_str_eq(m.text, text);
}
END_TEST

START_TEST(test_layout_never_makes_more_than_the_most_buckets)
{
    static s_layout s;
    uint64_t sizes[S_MAX];
    for (int i = 0; i < S_MAX; i++) {
        sizes[i] = 60000; // each alone in a bucket of the first size: 1024 of them
    }
    s_make(&s, S_MAX, NULL, sizes);
    char why[256];
    ck_assert_int_eq(zps_layout_check(&s.l, why, sizeof why), ZPS_OK);
    zps_model_spec m;
    zps_layout_model(&s.l, &m);
    ck_assert_int_le(zps_model_n_buckets(&m), ZPS_MODEL_MAX_BUCKETS);
    ck_assert_int_ge(zps_model_n_buckets(&m), ZPS_MODEL_MAX_BUCKETS / 2);
    s_assert_tiles(&m);
}
END_TEST

START_TEST(test_layout_check_refuses_what_cannot_be_a_model)
{
    static s_layout s;
    char why[256];
    uint64_t sizes[] = {4, 4};
    const char *dup[] = {"w", "w"};
    s_make(&s, 2, dup, sizes);
    ck_assert_int_eq(zps_layout_check(&s.l, why, sizeof why), ZPS_EINVAL);
    ck_assert_ptr_nonnull(strstr(why, "'w' is declared twice"));
    const char *spaced[] = {"a b", "c"};
    s_make(&s, 2, spaced, sizes);
    ck_assert_int_eq(zps_layout_check(&s.l, why, sizeof why), ZPS_EINVAL);
    const char *empty[] = {"", "c"};
    s_make(&s, 2, empty, sizes);
    ck_assert_int_eq(zps_layout_check(&s.l, why, sizeof why), ZPS_EINVAL);
    uint64_t zero[] = {4, 0};
    s_make(&s, 2, NULL, zero);
    ck_assert_int_eq(zps_layout_check(&s.l, why, sizeof why), ZPS_EINVAL);
    ck_assert_ptr_nonnull(strstr(why, "tensor 1 't1'"));
    uint64_t huge[] = {ZPS_MODEL_MAX_FLAT, 1};
    s_make(&s, 2, NULL, huge);
    ck_assert_int_eq(zps_layout_check(&s.l, why, sizeof why), ZPS_EINVAL);
    s_make(&s, 0, NULL, sizes);
    ck_assert_int_eq(zps_layout_check(&s.l, why, sizeof why), ZPS_EINVAL);
    ck_assert_int_eq(zps_layout_check(NULL, why, sizeof why), ZPS_EINVAL);
}
END_TEST

START_TEST(test_layout_differs_names_the_first_tensor_that_differs)
{
    static s_layout a, b;
    const char *names[] = {"emb", "fc.weight", "fc.bias"};
    uint64_t sizes[] = {100, 640, 10};
    s_make(&a, 3, names, sizes);
    s_make(&b, 3, names, sizes);
    char why[256] = "";
    ck_assert(!zps_layout_differs(&a.l, &b.l, why, sizeof why));
    ck_assert_uint_eq(zps_layout_digest(&a.l), zps_layout_digest(&b.l));
    b.shapes[1][0] = 320;
    ck_assert(zps_layout_differs(&a.l, &b.l, why, sizeof why));
    ck_assert_ptr_nonnull(strstr(why, "tensor 1 differs"));
    ck_assert_ptr_nonnull(strstr(why, "'fc.weight' [640]"));
    ck_assert_ptr_nonnull(strstr(why, "[320]"));
    ck_assert_uint_ne(zps_layout_digest(&a.l), zps_layout_digest(&b.l));
    b.shapes[1][0] = 640;
    b.l.n_tensors = 2; // one tensor fewer
    ck_assert(zps_layout_differs(&a.l, &b.l, why, sizeof why));
    ck_assert_ptr_nonnull(strstr(why, "tensor 2 'fc.bias' is not declared"));
    ck_assert_uint_ne(zps_layout_digest(&a.l), zps_layout_digest(&b.l));
}
END_TEST

// A torch nn.Sequential(Linear(4, 3), ReLU(), Linear(3, 2)): W (out, in),
// then b, per layer, named as torch names them.
static void s_sequential(s_layout *s, uint64_t first_out)
{
    static const char *names[] = {"0.weight", "0.bias", "2.weight", "2.bias"};
    uint64_t shapes[4][2] = {{first_out, 4}, {first_out, 0}, {2, 3}, {2, 0}};
    uint64_t sizes[4] = {0};
    s_make(s, 4, names, sizes);
    for (int i = 0; i < 4; i++) {
        s->shapes[i][0] = shapes[i][0];
        s->shapes[i][1] = shapes[i][1];
        s->t[i].n_shape = i % 2 ? 1 : 2;
    }
}

START_TEST(test_layout_of_a_torch_sequential_is_the_builtin_mlps)
{
    zps_model_spec m;
    ck_assert_int_eq(zps_model_parse("mlp:4-3-2", &m), ZPS_OK);
    static s_layout s;
    s_sequential(&s, 3);
    char why[256] = "";
    ck_assert(!zps_layout_differs_mlp(&m, &s.l, why, sizeof why));
    ck_assert_uint_eq(zps_layout_n_params(&s.l), m.n_params);
}
END_TEST

START_TEST(test_layout_differs_from_the_builtin_mlp_naming_the_layer)
{
    zps_model_spec m;
    ck_assert_int_eq(zps_model_parse("mlp:4-3-2", &m), ZPS_OK);
    static s_layout s;
    s_sequential(&s, 5); // Linear(4, 5): another width
    char why[256] = "";
    ck_assert(zps_layout_differs_mlp(&m, &s.l, why, sizeof why));
    ck_assert_str_eq(why, "tensor 0 differs: mlp:4-3-2 has layer 0's weight [3, 4] there, "
                          "declared '0.weight' [5, 4]");
    s_sequential(&s, 3);
    s.shapes[0][0] = 4; // transposed: (in, out) is not nn.Linear's (out, in)
    s.shapes[0][1] = 3;
    ck_assert(zps_layout_differs_mlp(&m, &s.l, why, sizeof why));
    s_sequential(&s, 3);
    s.l.n_tensors = 3; // the last bias missing
    ck_assert(zps_layout_differs_mlp(&m, &s.l, why, sizeof why));
    ck_assert_str_eq(why, "mlp:4-3-2 is 4 tensors (weight and bias of 2 layers), 3 declared");
}
END_TEST

Suite *zps_suite_layout(void)
{
    Suite *s = suite_create("layout");
    TCase *tc = tcase_create("declared");
    tcase_add_test(tc, test_layout_groups_small_neighbours_and_cuts_large_tensors);
    tcase_add_test(tc, test_layout_never_makes_more_than_the_most_buckets);
    tcase_add_test(tc, test_layout_check_refuses_what_cannot_be_a_model);
    tcase_add_test(tc, test_layout_differs_names_the_first_tensor_that_differs);
    tcase_add_test(tc, test_layout_of_a_torch_sequential_is_the_builtin_mlps);
    tcase_add_test(tc, test_layout_differs_from_the_builtin_mlp_naming_the_layer);
    suite_add_tcase(s, tc);
    return s;
}
