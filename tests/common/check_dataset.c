/* check_dataset.c - dataset names, counts, and the records gather returns:
 * Fashion-MNIST from the Debian package, a small IDX directory written here,
 * and synthetic data. Caches go to a mkdtemp directory that an unchecked
 * fixture (run in the parent) removes, each test in its own subdirectory. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/zps_dataset.h"
#include "tests/zps_check.h"
#include "tests/zps_tmpdir.h"

#define FASHION_DIM 784
#define FASHION_CLASSES 10

// ---------------------------------------------------------------- helpers

static zps_dataset_spec s_spec(const char *text)
{
    zps_dataset_spec spec;
    ck_assert_int_eq(zps_dataset_parse(text, &spec), ZPS_OK);
    return spec;
}

// Writes a plain IDX file with n records of `size` bytes, byte j of record
// i being (i * 31 + j) % mod.
static void s_write_idx(const char *name, uint32_t magic, uint32_t n, uint32_t size, int mod)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", zps_tmpdir_dir(), name);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    uint32_t words[3] = {magic, n, size};
    int n_words = 1 + (int)(magic & 0xFF); // magic, then one word per dimension
    for (int w = 0; w < n_words; w++) {
        uint8_t be[4] = {words[w] >> 24, words[w] >> 16, words[w] >> 8, words[w]};
        fwrite(be, 1, 4, f);
    }
    for (uint32_t i = 0; i < n; i++) {
        for (uint32_t j = 0; j < size; j++) {
            fputc((int)((i * 31 + j) % (uint32_t)mod), f);
        }
    }
    ck_assert_int_eq(fclose(f), 0);
}

// A tiny uncompressed Fashion-MNIST look-alike in the test's directory: records of 4 bytes,
// labels 0..2, 7 train and `n_test_labels` test labels for 3 test images.
static void s_write_small_dataset(uint32_t n_test_labels)
{
    s_write_idx("train-images-idx3-ubyte", 0x00000802, 7, 4, 256);
    s_write_idx("train-labels-idx1-ubyte", 0x00000801, 7, 1, 3);
    s_write_idx("t10k-images-idx3-ubyte", 0x00000802, 3, 4, 256);
    s_write_idx("t10k-labels-idx1-ubyte", 0x00000801, n_test_labels, 1, 3);
}

static zps_dataset_spec s_small_spec(void)
{
    char text[PATH_MAX];
    snprintf(text, sizeof text, "fashion-mnist:%s", zps_tmpdir_dir());
    return s_spec(text);
}

static void s_assert_unit_range(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(x[i] >= 0.0f && x[i] <= 1.0f, "x[%zu] = %g", i, (double)x[i]);
    }
}

// ---------------------------------------------------------------- parse

START_TEST(test_dataset_parse_errors)
{
    static const char *bad[] = {
        "",           "mnist",          "synthetic",      "synthetic:",
        "synthetic:0", "synthetic:-1",  "synthetic:+5",   "synthetic: 5",
        "synthetic:12x", "synthetic:4294967296", "fashion-mnist:", "fashion-mnistx",
        "Fashion-MNIST",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        zps_dataset_spec spec;
        ck_assert_msg(zps_dataset_parse(bad[i], &spec) == ZPS_EINVAL, "accepted '%s'", bad[i]);
    }
    char longdir[400];
    memset(longdir, 'a', sizeof longdir);
    memcpy(longdir, "fashion-mnist:/", 15);
    longdir[sizeof longdir - 1] = '\0';
    zps_dataset_spec spec;
    ck_assert_int_eq(zps_dataset_parse(longdir, &spec), ZPS_EINVAL);
}
END_TEST

START_TEST(test_dataset_parse_names)
{
    zps_dataset_spec spec = s_spec("fashion-mnist");
    ck_assert_int_eq(spec.kind, ZPS_DATASET_IDX);
    ck_assert_str_eq(spec.dir, "/usr/share/datasets/fashion-mnist");
    spec = s_spec("fashion-mnist:/data/fm");
    ck_assert_int_eq(spec.kind, ZPS_DATASET_IDX);
    ck_assert_str_eq(spec.dir, "/data/fm");
    spec = s_spec("synthetic:4294967295");
    ck_assert_int_eq(spec.kind, ZPS_DATASET_SYNTHETIC);
    ck_assert_uint_eq(spec.n_synthetic, 4294967295u);
}
END_TEST

// ---------------------------------------------------------------- counts

START_TEST(test_dataset_counts_fashion)
{
    zps_dataset_spec spec = s_spec("fashion-mnist");
    uint32_t n_train = 0;
    uint32_t n_test = 0;
    ck_assert_msg(zps_dataset_counts(&spec, &n_train, &n_test) == ZPS_OK,
                  "Fashion-MNIST missing: apt-get install dataset-fashion-mnist");
    ck_assert_uint_eq(n_train, 60000);
    ck_assert_uint_eq(n_test, 10000);
}
END_TEST

START_TEST(test_dataset_counts_synthetic)
{
    uint32_t n_train = 0;
    uint32_t n_test = 0;
    zps_dataset_spec spec = s_spec("synthetic:600");
    ck_assert_int_eq(zps_dataset_counts(&spec, &n_train, &n_test), ZPS_OK);
    ck_assert_uint_eq(n_train, 600);
    ck_assert_uint_eq(n_test, 100);
    spec = s_spec("synthetic:5");
    ck_assert_int_eq(zps_dataset_counts(&spec, &n_train, &n_test), ZPS_OK);
    ck_assert_uint_eq(n_train, 5);
    ck_assert_uint_eq(n_test, 1);
    zps_dataset *d = zps_dataset_open(&spec, NULL, 1, 8, 3);
    ck_assert_ptr_nonnull(d);
    ck_assert_uint_eq(zps_dataset_size(d, ZPS_SPLIT_TRAIN), 5);
    ck_assert_uint_eq(zps_dataset_size(d, ZPS_SPLIT_TEST), 1);
    zps_dataset_destroy(&d);
    ck_assert_ptr_null(d);
}
END_TEST

START_TEST(test_dataset_missing_dir)
{
    char text[PATH_MAX];
    snprintf(text, sizeof text, "fashion-mnist:%s/none", zps_tmpdir_dir());
    zps_dataset_spec spec = s_spec(text);
    uint32_t n_train;
    uint32_t n_test;
    ck_assert_int_eq(zps_dataset_counts(&spec, &n_train, &n_test), ZPS_ENOENT);
    ck_assert_ptr_null(zps_dataset_open(&spec, zps_tmpdir_dir(), 1, 4, 3));
}
END_TEST

// ---------------------------------------------------------------- IDX

START_TEST(test_dataset_fashion_gather)
{
    zps_dataset_spec spec = s_spec("fashion-mnist");
    zps_dataset *a = zps_dataset_open(&spec, zps_tmpdir_dir(), 1, FASHION_DIM, FASHION_CLASSES);
    ck_assert_ptr_nonnull(a);
    ck_assert_uint_eq(zps_dataset_size(a, ZPS_SPLIT_TRAIN), 60000);
    ck_assert_uint_eq(zps_dataset_size(a, ZPS_SPLIT_TEST), 10000);
    static const uint32_t idx[4] = {59999, 0, 12345, 7};
    static float xa[4 * FASHION_DIM];
    static float xb[4 * FASHION_DIM];
    uint32_t la[4];
    uint32_t lb[4];
    ck_assert_int_eq(zps_dataset_gather(a, ZPS_SPLIT_TRAIN, idx, 4, xa, la), ZPS_OK);
    s_assert_unit_range(xa, 4 * FASHION_DIM);
    float sum = 0.0f;
    for (size_t i = 0; i < FASHION_DIM; i++) {
        sum += xa[i];
    }
    ck_assert_msg(sum > 10.0f, "record 59999 is nearly blank (sum %g)", (double)sum);
    // A second open reads the cache and must give the same records.
    zps_dataset *b = zps_dataset_open(&spec, zps_tmpdir_dir(), 2, FASHION_DIM, FASHION_CLASSES);
    ck_assert_ptr_nonnull(b);
    ck_assert_int_eq(zps_dataset_gather(b, ZPS_SPLIT_TRAIN, idx, 4, xb, lb), ZPS_OK);
    ck_assert_mem_eq(xa, xb, sizeof xa);
    ck_assert_mem_eq(la, lb, sizeof la);
    for (int i = 0; i < 4; i++) {
        ck_assert_uint_lt(la[i], FASHION_CLASSES);
    }
    uint32_t last = 9999;
    ck_assert_int_eq(zps_dataset_gather(b, ZPS_SPLIT_TEST, &last, 1, xb, lb), ZPS_OK);
    s_assert_unit_range(xb, FASHION_DIM);
    zps_dataset_destroy(&a);
    zps_dataset_destroy(&b);
}
END_TEST

START_TEST(test_dataset_idx_plain_files)
{
    s_write_small_dataset(3);
    zps_dataset_spec spec = s_small_spec();
    uint32_t n_train;
    uint32_t n_test;
    ck_assert_int_eq(zps_dataset_counts(&spec, &n_train, &n_test), ZPS_OK);
    ck_assert_uint_eq(n_train, 7);
    ck_assert_uint_eq(n_test, 3);
    zps_dataset *d = zps_dataset_open(&spec, NULL, 1, 4, 3);
    ck_assert_ptr_nonnull(d);
    uint32_t idx[2] = {6, 1};
    float x[8];
    uint32_t labels[2];
    ck_assert_int_eq(zps_dataset_gather(d, ZPS_SPLIT_TRAIN, idx, 2, x, labels), ZPS_OK);
    // Record 6, byte 2 is (6 * 31 + 2) % 256 = 188.
    ck_assert_float_eq(x[2], 188.0f / 255.0f);
    ck_assert_float_eq(x[4], 31.0f / 255.0f);
    ck_assert_uint_eq(labels[0], (6 * 31) % 3);
    ck_assert_uint_eq(labels[1], 31 % 3);
    zps_dataset_destroy(&d);
}
END_TEST

START_TEST(test_dataset_idx_refuses_mismatch)
{
    s_write_small_dataset(3);
    zps_dataset_spec spec = s_small_spec();
    ck_assert_ptr_null(zps_dataset_open(&spec, NULL, 1, 5, 3)); // record size
    ck_assert_ptr_null(zps_dataset_open(&spec, NULL, 1, 4, 2)); // label 2 >= classes
    ck_assert_ptr_null(zps_dataset_open(&spec, NULL, 1, 0, 3));
    s_write_small_dataset(2); // 3 test images, 2 labels
    uint32_t n_train;
    uint32_t n_test;
    ck_assert_int_eq(zps_dataset_counts(&spec, &n_train, &n_test), ZPS_EINVAL);
    ck_assert_ptr_null(zps_dataset_open(&spec, NULL, 1, 4, 3));
}
END_TEST

// ---------------------------------------------------------------- synthetic

START_TEST(test_dataset_synthetic_deterministic)
{
    zps_dataset_spec spec = s_spec("synthetic:1000");
    zps_dataset *a = zps_dataset_open(&spec, NULL, 42, 20, 10);
    zps_dataset *b = zps_dataset_open(&spec, NULL, 42, 20, 10);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    uint32_t many[3] = {3, 999, 500};
    uint32_t one = 999;
    float xa[60];
    float xb[20];
    uint32_t la[3];
    uint32_t lb[1];
    ck_assert_int_eq(zps_dataset_gather(a, ZPS_SPLIT_TRAIN, many, 3, xa, la), ZPS_OK);
    s_assert_unit_range(xa, 60);
    for (int i = 0; i < 60; i++) {
        ck_assert_float_lt(xa[i], 1.0f);
    }
    // Record 999 alone, from another open, equals record 999 among others.
    ck_assert_int_eq(zps_dataset_gather(b, ZPS_SPLIT_TRAIN, &one, 1, xb, lb), ZPS_OK);
    ck_assert_mem_eq(xa + 20, xb, sizeof xb);
    ck_assert_uint_eq(la[1], lb[0]);
    // The test split is another set of records.
    ck_assert_int_eq(zps_dataset_gather(b, ZPS_SPLIT_TEST, many, 1, xb, lb), ZPS_OK);
    ck_assert_int_ne(memcmp(xa, xb, sizeof xb), 0);
    zps_dataset_destroy(&a);
    zps_dataset_destroy(&b);
}
END_TEST

START_TEST(test_dataset_synthetic_seeds_differ)
{
    zps_dataset_spec spec = s_spec("synthetic:100");
    zps_dataset *a = zps_dataset_open(&spec, NULL, 1, 16, 10);
    zps_dataset *b = zps_dataset_open(&spec, NULL, 2, 16, 10);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    uint32_t idx[100];
    for (uint32_t i = 0; i < 100; i++) {
        idx[i] = i;
    }
    static float xa[100 * 16];
    static float xb[100 * 16];
    uint32_t la[100];
    uint32_t lb[100];
    ck_assert_int_eq(zps_dataset_gather(a, ZPS_SPLIT_TRAIN, idx, 100, xa, la), ZPS_OK);
    ck_assert_int_eq(zps_dataset_gather(b, ZPS_SPLIT_TRAIN, idx, 100, xb, lb), ZPS_OK);
    ck_assert_int_ne(memcmp(xa, xb, sizeof xa), 0);
    ck_assert_int_ne(memcmp(la, lb, sizeof la), 0);
    zps_dataset_destroy(&a);
    zps_dataset_destroy(&b);
}
END_TEST

// Every class occurs and none dominates: the centred map balances them.
START_TEST(test_dataset_synthetic_labels_vary)
{
    enum { N = 2000, DIM = 64, CLASSES = 10 };
    zps_dataset_spec spec = s_spec("synthetic:2000");
    zps_dataset *d = zps_dataset_open(&spec, NULL, 7, DIM, CLASSES);
    ck_assert_ptr_nonnull(d);
    static uint32_t idx[N];
    static float x[N * DIM];
    static uint32_t labels[N];
    for (uint32_t i = 0; i < N; i++) {
        idx[i] = i;
    }
    ck_assert_int_eq(zps_dataset_gather(d, ZPS_SPLIT_TRAIN, idx, N, x, labels), ZPS_OK);
    uint32_t per_class[CLASSES] = {0};
    for (uint32_t i = 0; i < N; i++) {
        ck_assert_uint_lt(labels[i], CLASSES);
        per_class[labels[i]]++;
    }
    for (int c = 0; c < CLASSES; c++) {
        ck_assert_msg(per_class[c] > N / CLASSES / 4 && per_class[c] < N / 2,
                      "class %d has %u of %d records", c, per_class[c], N);
    }
    zps_dataset_destroy(&d);
}
END_TEST

START_TEST(test_dataset_gather_range)
{
    zps_dataset_spec spec = s_spec("synthetic:60");
    zps_dataset *d = zps_dataset_open(&spec, NULL, 1, 4, 3);
    ck_assert_ptr_nonnull(d);
    float x[8];
    uint32_t labels[2];
    uint32_t train_bad[2] = {0, 60};
    uint32_t test_bad[2] = {9, 10};
    uint32_t test_ok[2] = {9, 0};
    ck_assert_int_eq(zps_dataset_gather(d, ZPS_SPLIT_TRAIN, train_bad, 2, x, labels), ZPS_ERANGE);
    ck_assert_int_eq(zps_dataset_gather(d, ZPS_SPLIT_TEST, test_bad, 2, x, labels), ZPS_ERANGE);
    ck_assert_int_eq(zps_dataset_gather(d, ZPS_SPLIT_TEST, test_ok, 2, x, labels), ZPS_OK);
    zps_dataset_destroy(&d);
    s_write_small_dataset(3);
    zps_dataset_spec small = s_small_spec();
    d = zps_dataset_open(&small, NULL, 1, 4, 3);
    ck_assert_ptr_nonnull(d);
    uint32_t idx_bad = 7;
    ck_assert_int_eq(zps_dataset_gather(d, ZPS_SPLIT_TRAIN, &idx_bad, 1, x, labels), ZPS_ERANGE);
    zps_dataset_destroy(&d);
    zps_dataset_destroy(&d); // already NULL: safe
}
END_TEST

Suite *zps_suite_dataset(void)
{
    Suite *s = suite_create("dataset");
    TCase *tc = tcase_create("datasets");
    zps_tmpdir_fixture(tc);
    tcase_set_timeout(tc, 120); // decompressing Fashion-MNIST under valgrind
    tcase_add_test(tc, test_dataset_parse_errors);
    tcase_add_test(tc, test_dataset_parse_names);
    tcase_add_test(tc, test_dataset_counts_fashion);
    tcase_add_test(tc, test_dataset_counts_synthetic);
    tcase_add_test(tc, test_dataset_missing_dir);
    tcase_add_test(tc, test_dataset_fashion_gather);
    tcase_add_test(tc, test_dataset_idx_plain_files);
    tcase_add_test(tc, test_dataset_idx_refuses_mismatch);
    tcase_add_test(tc, test_dataset_synthetic_deterministic);
    tcase_add_test(tc, test_dataset_synthetic_seeds_differ);
    tcase_add_test(tc, test_dataset_synthetic_labels_vary);
    tcase_add_test(tc, test_dataset_gather_range);
    suite_add_tcase(s, tc);
    return s;
}
