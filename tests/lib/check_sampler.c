/* check_sampler.c - the global-batch sampler: slices tile a step's batch,
 * steps of an epoch are disjoint, and the order depends only on
 * (seed, epoch), which is what lets W workers equal one process. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "tests/zps_check.h"
#include "lib/zps_sampler.h"

#define N 1000
#define B 64

// A copy of a slice: the sampler's view dies with the next epoch.
static uint32_t *s_copy(zps_sampler *s, uint64_t step, uint32_t offset, uint32_t count)
{
    const uint32_t *v = zps_sampler_slice(s, step, offset, count);
    ck_assert_ptr_nonnull(v);
    uint32_t *c = malloc(count * sizeof *c);
    ck_assert_ptr_nonnull(c);
    memcpy(c, v, count * sizeof *c);
    return c;
}

START_TEST(test_sampler_slices_cover_batch)
{
    zps_sampler s;
    ck_assert_int_eq(zps_sampler_init(&s, 9, N, B), ZPS_OK);
    static const uint32_t offsets[3] = {0, 16, 48};
    static const uint32_t counts[3] = {16, 32, 16};
    uint32_t *whole = s_copy(&s, 3, 0, B);
    bool seen[N] = {false};
    for (int w = 0; w < 3; w++) {
        const uint32_t *v = zps_sampler_slice(&s, 3, offsets[w], counts[w]);
        ck_assert_ptr_nonnull(v);
        for (uint32_t i = 0; i < counts[w]; i++) {
            ck_assert_uint_lt(v[i], N);
            ck_assert_msg(!seen[v[i]], "index %u in two slices", v[i]);
            seen[v[i]] = true;
            ck_assert_uint_eq(v[i], whole[offsets[w] + i]);
        }
    }
    for (uint32_t i = 0; i < B; i++) {
        ck_assert(seen[whole[i]]);
    }
    free(whole);
    zps_sampler_fini(&s);
}
END_TEST

START_TEST(test_sampler_steps_disjoint)
{
    zps_sampler s;
    ck_assert_int_eq(zps_sampler_init(&s, 9, N, B), ZPS_OK);
    bool seen[N] = {false};
    uint32_t distinct = 0;
    for (uint64_t t = 0; t < s.steps_per_epoch; t++) {
        const uint32_t *v = zps_sampler_slice(&s, t, 0, B);
        ck_assert_ptr_nonnull(v);
        for (uint32_t i = 0; i < B; i++) {
            ck_assert_msg(!seen[v[i]], "index %u in two steps of epoch 0", v[i]);
            seen[v[i]] = true;
            distinct++;
        }
    }
    ck_assert_uint_eq(distinct, (N / B) * B);
    zps_sampler_fini(&s);
}
END_TEST

START_TEST(test_sampler_is_permutation)
{
    zps_sampler s;
    ck_assert_int_eq(zps_sampler_init(&s, 5, N, N), ZPS_OK);
    const uint32_t *v = zps_sampler_slice(&s, 0, 0, N);
    ck_assert_ptr_nonnull(v);
    bool seen[N] = {false};
    uint32_t fixed = 0;
    for (uint32_t i = 0; i < N; i++) {
        ck_assert_uint_lt(v[i], N);
        ck_assert(!seen[v[i]]);
        seen[v[i]] = true;
        fixed += v[i] == i;
    }
    ck_assert_uint_lt(fixed, 20); // a shuffle, not the identity (about 1 expected)
    zps_sampler_fini(&s);
}
END_TEST

START_TEST(test_sampler_epochs_differ)
{
    zps_sampler s;
    ck_assert_int_eq(zps_sampler_init(&s, 9, N, B), ZPS_OK);
    uint64_t spe = s.steps_per_epoch;
    uint32_t *e0 = s_copy(&s, 0, 0, B);
    uint32_t *e1 = s_copy(&s, spe, 0, B);
    uint32_t *e2 = s_copy(&s, 2 * spe + 1, 0, B);
    ck_assert_int_ne(memcmp(e0, e1, B * sizeof *e0), 0);
    ck_assert_int_ne(memcmp(e1, e2, B * sizeof *e1), 0);
    // Going back to epoch 0 rebuilds the same permutation.
    uint32_t *again = s_copy(&s, 0, 0, B);
    ck_assert_mem_eq(e0, again, B * sizeof *e0);
    free(e0);
    free(e1);
    free(e2);
    free(again);
    zps_sampler_fini(&s);
}
END_TEST

START_TEST(test_sampler_seed_decides_order)
{
    zps_sampler a;
    zps_sampler b;
    zps_sampler c;
    ck_assert_int_eq(zps_sampler_init(&a, 1234, N, B), ZPS_OK);
    ck_assert_int_eq(zps_sampler_init(&b, 1234, N, B), ZPS_OK);
    ck_assert_int_eq(zps_sampler_init(&c, 1235, N, B), ZPS_OK);
    // b jumps straight to step 40: no state carries over from earlier steps.
    for (uint64_t t = 0; t < 40; t++) {
        ck_assert_ptr_nonnull(zps_sampler_slice(&a, t, 0, B));
    }
    const uint32_t *va = zps_sampler_slice(&a, 40, 0, B);
    const uint32_t *vb = zps_sampler_slice(&b, 40, 0, B);
    const uint32_t *vc = zps_sampler_slice(&c, 40, 0, B);
    ck_assert_ptr_nonnull(va);
    ck_assert_ptr_nonnull(vb);
    ck_assert_ptr_nonnull(vc);
    ck_assert_mem_eq(va, vb, B * sizeof *va);
    ck_assert_int_ne(memcmp(va, vc, B * sizeof *va), 0);
    zps_sampler_fini(&a);
    zps_sampler_fini(&b);
    zps_sampler_fini(&c);
}
END_TEST

START_TEST(test_sampler_slice_past_batch)
{
    zps_sampler s;
    ck_assert_int_eq(zps_sampler_init(&s, 1, N, B), ZPS_OK);
    ck_assert_ptr_null(zps_sampler_slice(&s, 0, 60, 5));
    ck_assert_ptr_null(zps_sampler_slice(&s, 0, B, 1));
    ck_assert_ptr_null(zps_sampler_slice(&s, 0, UINT32_MAX, 2)); // would wrap in 32 bits
    ck_assert_ptr_nonnull(zps_sampler_slice(&s, 0, 48, 16));
    ck_assert_ptr_nonnull(zps_sampler_slice(&s, 0, B, 0)); // empty, at the end
    zps_sampler_fini(&s);
}
END_TEST

START_TEST(test_sampler_steps_per_epoch)
{
    zps_sampler s;
    ck_assert_int_eq(zps_sampler_init(&s, 1, N, B), ZPS_OK);
    ck_assert_uint_eq(s.steps_per_epoch, 15); // 1000 / 64: the last 40 are dropped
    ck_assert_uint_eq(zps_sampler_epoch(&s, 14), 0);
    ck_assert_uint_eq(zps_sampler_epoch(&s, 15), 1);
    // The last step of an epoch ends at 15 * 64 = 960, inside the permutation.
    ck_assert_ptr_nonnull(zps_sampler_slice(&s, 14, 0, B));
    zps_sampler_fini(&s);
    ck_assert_int_eq(zps_sampler_init(&s, 1, B, B), ZPS_OK);
    ck_assert_uint_eq(s.steps_per_epoch, 1);
    zps_sampler_fini(&s);
    ck_assert_int_eq(zps_sampler_init(&s, 1, N, 0), ZPS_EINVAL);
    zps_sampler_fini(&s);
    ck_assert_int_eq(zps_sampler_init(&s, 1, N, N + 1), ZPS_EINVAL);
    zps_sampler_fini(&s);
    zps_sampler zero;
    memset(&zero, 0, sizeof zero);
    zps_sampler_fini(&zero); // safe on zeroed memory
}
END_TEST

Suite *zps_suite_sampler(void)
{
    Suite *s = suite_create("sampler");
    TCase *tc = tcase_create("order");
    tcase_add_test(tc, test_sampler_slices_cover_batch);
    tcase_add_test(tc, test_sampler_steps_disjoint);
    tcase_add_test(tc, test_sampler_is_permutation);
    tcase_add_test(tc, test_sampler_epochs_differ);
    tcase_add_test(tc, test_sampler_seed_decides_order);
    tcase_add_test(tc, test_sampler_slice_past_batch);
    tcase_add_test(tc, test_sampler_steps_per_epoch);
    suite_add_tcase(s, tc);
    return s;
}
