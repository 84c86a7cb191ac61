/* check_model.c - model spec parsing, layout and initialisation. */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_model.h"
#include "tests/zps_check.h"

START_TEST(test_model_parse_lays_out_weights_then_bias)
{
    zps_model_spec m;
    ck_assert_int_eq(zps_model_parse("mlp:784-512-512-10", &m), ZPS_OK);
    ck_assert_int_eq(m.n_layers, 3);
    ck_assert_uint_eq(m.n_params, 784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10);
    ck_assert_uint_eq(m.layers[0].w_off, 0);
    ck_assert_uint_eq(m.layers[0].b_off, 784 * 512);
    ck_assert_uint_eq(m.layers[1].w_off, 784 * 512 + 512);
    ck_assert_uint_eq(m.layers[2].b_off, m.n_params - 10);
    ck_assert_uint_eq(zps_model_inputs(&m), 784);
    ck_assert_uint_eq(zps_model_classes(&m), 10);
}
END_TEST

START_TEST(test_model_parse_refuses_bad_specs)
{
    static const char *bad[] = {"", "mlp:", "mlp:10", "mlp:10-", "mlp:10--3", "mlp:10-0",
                                "mlp:-1-3", "mlp:10-x", "cnn:10-10", "mlp:10-2000000",
                                "mlp:1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1"};
    zps_model_spec m;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_msg(zps_model_parse(bad[i], &m) == ZPS_EINVAL, "accepted '%s'", bad[i]);
    }
}
END_TEST

START_TEST(test_model_init_is_he_normal_and_deterministic)
{
    zps_model_spec m;
    ck_assert_int_eq(zps_model_parse("mlp:400-300-10", &m), ZPS_OK);
    float *a = malloc(m.n_params * sizeof(float));
    float *b = malloc(m.n_params * sizeof(float));
    float *c = malloc(m.n_params * sizeof(float));
    zps_model_init_params(&m, 7, a);
    zps_model_init_params(&m, 7, b);
    zps_model_init_params(&m, 8, c);
    ck_assert_mem_eq(a, b, m.n_params * sizeof(float));
    ck_assert(memcmp(a, c, m.n_params * sizeof(float)) != 0);
    // Layer 0: 120000 weights ~ N(0, 2/400): the sample std is within 1%.
    double sum = 0, sq = 0;
    size_t nw = 400 * 300;
    for (size_t i = 0; i < nw; i++) {
        sum += a[i];
        sq += (double)a[i] * a[i];
    }
    double mean = sum / nw, std = sqrt(sq / nw - mean * mean);
    ck_assert_double_lt(fabs(mean), 0.002);
    ck_assert_double_lt(fabs(std - sqrt(2.0 / 400)), 0.01 * sqrt(2.0 / 400));
    for (uint32_t i = 0; i < 300; i++) {
        ck_assert_float_eq(a[m.layers[0].b_off + i], 0.0f);
    }
    free(a);
    free(b);
    free(c);
}
END_TEST

START_TEST(test_model_flat_and_its_buckets)
{
    zps_model_spec m;
    ck_assert_int_eq(zps_model_parse("flat:2500000", &m), ZPS_OK);
    ck_assert_int_eq(m.kind, ZPS_MODEL_FLAT);
    ck_assert_uint_eq(m.n_params, 2500000);
    ck_assert_int_eq(zps_model_n_buckets(&m), 39); // 256 KiB buckets, the last short
    uint64_t lo, hi;
    zps_model_bucket(&m, 0, &lo, &hi); // backward order: the end first
    ck_assert_uint_eq(lo, 38u << 16);
    ck_assert_uint_eq(hi, 2500000);
    zps_model_bucket(&m, 38, &lo, &hi);
    ck_assert_uint_eq(lo, 0);
    ck_assert_uint_eq(hi, 1u << 16);
    // Past 256 of them, 256 equal buckets.
    ck_assert_int_eq(zps_model_parse("flat:67108864", &m), ZPS_OK);
    ck_assert_int_eq(zps_model_n_buckets(&m), ZPS_MODEL_MAX_BUCKETS);
    zps_model_bucket(&m, 0, &lo, &hi);
    ck_assert_uint_eq(hi - lo, 1u << 18);
    ck_assert_int_eq(zps_model_parse("flat:0", &m), ZPS_EINVAL);
    ck_assert_int_eq(zps_model_parse("flat:67108865", &m), ZPS_EINVAL);
    ck_assert_int_eq(zps_model_parse("flat:12x", &m), ZPS_EINVAL);
}
END_TEST

// How far the count of order[0..k) in each of s equal ranges of 0..n-1
// strays from its even share, at worst over every k.
static double s_worst_share(const int *order, int n, int s)
{
    double worst = 0;
    int count[8] = {0};
    for (int k = 1; k <= n; k++) {
        for (int r = 0; r < s; r++) {
            int lo = r * n / s, hi = (r + 1) * n / s;
            count[r] += order[k - 1] >= lo && order[k - 1] < hi;
            double off = fabs(count[r] - (double)k * (hi - lo) / n);
            worst = off > worst ? off : worst;
        }
    }
    return worst;
}

START_TEST(test_model_spread_order_gives_every_shard_its_share_from_the_first_push)
{
    int order[ZPS_MODEL_MAX_BUCKETS], in_order[ZPS_MODEL_MAX_BUCKETS];
    for (int n = 1; n <= ZPS_MODEL_MAX_BUCKETS; n++) {
        zps_model_spread_order(n, order);
        bool seen[ZPS_MODEL_MAX_BUCKETS] = {false};
        for (int k = 0; k < n; k++) {
            ck_assert(order[k] >= 0 && order[k] < n && !seen[order[k]]);
            seen[order[k]] = true;
            in_order[k] = k;
        }
        for (int s = 2; s <= 8; s++) { // 2.87 buckets at worst over these
            ck_assert_msg(s_worst_share(order, n, s) < 3.0, "%d buckets, %d shards", n, s);
        }
    }
    // In bucket order the first quarter of 256 all go to one of 4 shards.
    ck_assert_double_eq(s_worst_share(in_order, 256, 4), 48.0);
}
END_TEST

START_TEST(test_model_buckets_are_layers_cut_at_shard_ranges)
{
    zps_model_spec m;
    ck_assert_int_eq(zps_model_parse("mlp:784-512-512-10", &m), ZPS_OK);
    ck_assert_int_eq(zps_model_n_buckets(&m), 3);
    uint64_t lo, hi;
    zps_model_bucket(&m, 0, &lo, &hi);
    ck_assert_uint_eq(lo, m.layers[2].w_off);
    ck_assert_uint_eq(hi, m.n_params);
    // Three shards balanced by bytes: ranges tile the vector, cut inside layers.
    uint64_t next = 0;
    int total = 0;
    for (uint32_t i = 0; i < 3; i++) {
        zps_model_shard_range(m.n_params, i, 3, &lo, &hi);
        ck_assert_uint_eq(lo, next);
        ck_assert_uint_le(hi - lo, m.n_params / 3 + 1);
        next = hi;
        zps_bucket b[ZPS_MODEL_MAX_BUCKETS];
        int n = zps_model_range_buckets(&m, lo, hi, b);
        for (int k = 0; k < n; k++) {
            ck_assert_uint_ge(b[k].lo, lo);
            ck_assert_uint_le(b[k].hi, hi);
            ck_assert_uint_lt(b[k].lo, b[k].hi);
            total += (int)(b[k].hi - b[k].lo);
        }
    }
    ck_assert_uint_eq(next, m.n_params);
    ck_assert_int_eq(total, (int)m.n_params);
}
END_TEST

START_TEST(test_model_init_range_equals_slice_of_whole_init)
{
    zps_model_spec m;
    ck_assert_int_eq(zps_model_parse("mlp:30-20-10", &m), ZPS_OK);
    float *all = malloc(m.n_params * sizeof(float));
    float part[300];
    zps_model_init_params(&m, 9, all);
    zps_model_init_range(&m, 9, 500, 800, part); // across layer 0's end and layer 1
    ck_assert_mem_eq(part, all + 500, sizeof part);
    free(all);
}
END_TEST

Suite *zps_suite_model(void)
{
    Suite *s = suite_create("model");
    TCase *tc = tcase_create("spec");
    tcase_add_test(tc, test_model_parse_lays_out_weights_then_bias);
    tcase_add_test(tc, test_model_parse_refuses_bad_specs);
    tcase_add_test(tc, test_model_init_is_he_normal_and_deterministic);
    tcase_add_test(tc, test_model_flat_and_its_buckets);
    tcase_add_test(tc, test_model_spread_order_gives_every_shard_its_share_from_the_first_push);
    tcase_add_test(tc, test_model_buckets_are_layers_cut_at_shard_ranges);
    tcase_add_test(tc, test_model_init_range_equals_slice_of_whole_init);
    suite_add_tcase(s, tc);
    return s;
}
