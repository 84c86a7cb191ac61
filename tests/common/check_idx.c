/* check_idx.c - IDX files: round trips plain and gzipped, the decompression
 * cache, rejection of bad files, and the real Fashion-MNIST labels.
 *
 * Files are written into a mkdtemp directory made by an unchecked fixture,
 * which runs in the parent process, so it is removed even when a test fails;
 * each test works in a fresh subdirectory of it, so no test sees another's
 * cache. */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "common/zps_idx.h"
#include "tests/zps_check.h"
#include "tests/zps_tmpdir.h"

#define FASHION_DIR "/usr/share/datasets/fashion-mnist"

// ---------------------------------------------------------------- helpers

// Path of name inside the test directory (a static buffer per slot).
static const char *s_path(int slot, const char *name)
{
    static char bufs[4][PATH_MAX];
    snprintf(bufs[slot], sizeof bufs[slot], "%s/%s", zps_tmpdir_dir(), name);
    return bufs[slot];
}

// Writes an IDX file: `magic` then big-endian dims, then len bytes of data;
// gzipped if gz.
static void s_write_raw(const char *path, uint32_t magic, const uint32_t *dims, int n_dims,
                        const uint8_t *data, size_t len, int gz)
{
    uint8_t head[4 + 4 * 8];
    uint32_t words[9];
    words[0] = magic;
    for (int i = 0; i < n_dims; i++) {
        words[i + 1] = dims[i];
    }
    for (int i = 0; i <= n_dims; i++) {
        head[4 * i] = (uint8_t)(words[i] >> 24);
        head[4 * i + 1] = (uint8_t)(words[i] >> 16);
        head[4 * i + 2] = (uint8_t)(words[i] >> 8);
        head[4 * i + 3] = (uint8_t)words[i];
    }
    size_t head_len = 4 + 4 * (size_t)n_dims;
    if (gz) {
        gzFile f = gzopen(path, "wb");
        ck_assert_ptr_nonnull(f);
        ck_assert_int_eq(gzwrite(f, head, (unsigned)head_len), (int)head_len);
        if (len > 0) {
            ck_assert_int_eq(gzwrite(f, data, (unsigned)len), (int)len);
        }
        ck_assert_int_eq(gzclose(f), Z_OK);
        return;
    }
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(head, 1, head_len, f), head_len);
    if (len > 0) {
        ck_assert_uint_eq(fwrite(data, 1, len, f), len);
    }
    ck_assert_int_eq(fclose(f), 0);
}

// The test images: 5 records of 2 x 3 bytes with distinct values.
static const uint32_t s_dims[3] = {5, 2, 3};
static uint8_t s_data[30];

static void s_fill_data(void)
{
    for (int i = 0; i < 30; i++) {
        s_data[i] = (uint8_t)(i * 7 + 3);
    }
}

static void s_write_images(const char *path, int gz)
{
    s_fill_data();
    s_write_raw(path, 0x00000803, s_dims, 3, s_data, sizeof s_data, gz);
}

static void s_assert_images(const zps_idx *idx)
{
    ck_assert_uint_eq(idx->n, 5);
    ck_assert_uint_eq(idx->record_size, 6);
    ck_assert_int_eq(idx->n_dims, 3);
    ck_assert_uint_eq(idx->dims[0], 5);
    ck_assert_uint_eq(idx->dims[1], 2);
    ck_assert_uint_eq(idx->dims[2], 3);
    ck_assert_mem_eq(idx->data, s_data, sizeof s_data);
}

// The one regular file in dir (the cached copy); fails on any other count,
// which also catches temporary files left behind.
static void s_only_file(const char *dir, char *out, size_t out_len)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int files = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') {
            continue;
        }
        files++;
        int len = snprintf(out, out_len, "%s/%s", dir, e->d_name);
        ck_assert_int_lt(len, (int)out_len);
    }
    closedir(d);
    ck_assert_int_eq(files, 1);
}

// ---------------------------------------------------------------- tests

START_TEST(test_idx_plain_roundtrip)
{
    const char *path = s_path(0, "images");
    s_write_images(path, 0);
    zps_idx idx;
    ck_assert_int_eq(zps_idx_open(path, NULL, &idx), ZPS_OK);
    s_assert_images(&idx);
    zps_idx_close(&idx);
    ck_assert_ptr_null(idx.map);
    zps_idx_close(&idx); // twice is safe
}
END_TEST

START_TEST(test_idx_gz_roundtrip)
{
    const char *path = s_path(0, "images.gz");
    const char *cache = s_path(1, "cache/a/b"); // created with its parents
    s_write_images(path, 1);
    zps_idx idx;
    ck_assert_int_eq(zps_idx_open(path, cache, &idx), ZPS_OK);
    s_assert_images(&idx);
    zps_idx_close(&idx);
    char cached[PATH_MAX];
    s_only_file(cache, cached, sizeof cached);
    struct stat st;
    ck_assert_int_eq(stat(cached, &st), 0);
    ck_assert_int_eq(st.st_size, 16 + 30);
}
END_TEST

START_TEST(test_idx_cache_reused)
{
    const char *path = s_path(0, "images.gz");
    const char *cache = s_path(1, "cache");
    s_write_images(path, 1);
    zps_idx idx;
    ck_assert_int_eq(zps_idx_open(path, cache, &idx), ZPS_OK);
    zps_idx_close(&idx);
    char cached[PATH_MAX];
    s_only_file(cache, cached, sizeof cached);
    struct stat before;
    ck_assert_int_eq(stat(cached, &before), 0);
    usleep(20000); // a rewrite would then show in the mtime too
    ck_assert_int_eq(zps_idx_open(path, cache, &idx), ZPS_OK);
    s_assert_images(&idx);
    zps_idx_close(&idx);
    struct stat after;
    ck_assert_int_eq(stat(cached, &after), 0);
    ck_assert_uint_eq(after.st_ino, before.st_ino);
    ck_assert_int_eq(after.st_mtim.tv_sec, before.st_mtim.tv_sec);
    ck_assert_int_eq(after.st_mtim.tv_nsec, before.st_mtim.tv_nsec);
}
END_TEST

START_TEST(test_idx_incomplete_cache_rebuilt)
{
    const char *path = s_path(0, "images.gz");
    const char *cache = s_path(1, "cache");
    s_write_images(path, 1);
    zps_idx idx;
    ck_assert_int_eq(zps_idx_open(path, cache, &idx), ZPS_OK);
    zps_idx_close(&idx);
    char cached[PATH_MAX];
    s_only_file(cache, cached, sizeof cached);
    ck_assert_int_eq(truncate(cached, 20), 0);
    ck_assert_int_eq(zps_idx_open(path, cache, &idx), ZPS_OK);
    s_assert_images(&idx);
    zps_idx_close(&idx);
    struct stat st;
    ck_assert_int_eq(stat(cached, &st), 0);
    ck_assert_int_eq(st.st_size, 16 + 30);
}
END_TEST

START_TEST(test_idx_bad_magic)
{
    static const uint32_t magics[] = {
        0x12345803, // not zero-led
        0x00000903, // signed bytes
        0x00000D03, // floats
        0x00000800, // no dimensions
        0x00000805, // too many dimensions
    };
    const char *path = s_path(0, "bad");
    for (size_t i = 0; i < sizeof magics / sizeof magics[0]; i++) {
        s_write_raw(path, magics[i], s_dims, 3, s_data, sizeof s_data, (int)(i % 2));
        zps_idx idx;
        ck_assert_int_eq(zps_idx_open(path, s_path(1, "cache"), &idx), ZPS_EINVAL);
        ck_assert_ptr_null(idx.map);
        ck_assert_uint_eq(idx.n, 0);
        uint32_t n = 7;
        ck_assert_int_eq(zps_idx_count(path, &n), ZPS_EINVAL);
    }
}
END_TEST

START_TEST(test_idx_truncated)
{
    s_fill_data();
    zps_idx idx;
    const char *plain = s_path(0, "short");
    s_write_raw(plain, 0x00000803, s_dims, 3, s_data, sizeof s_data - 1, 0);
    ck_assert_int_eq(zps_idx_open(plain, NULL, &idx), ZPS_EINVAL);
    ck_assert_ptr_null(idx.map);
    // A gzipped stream shorter than its header leaves no cache file behind.
    const char *gz = s_path(1, "short.gz");
    const char *cache = s_path(2, "cache");
    s_write_raw(gz, 0x00000803, s_dims, 3, s_data, sizeof s_data - 6, 1);
    ck_assert_int_eq(zps_idx_open(gz, cache, &idx), ZPS_EINVAL);
    DIR *d = opendir(cache);
    ck_assert_ptr_nonnull(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        ck_assert_msg(e->d_name[0] == '.', "left in the cache: %s", e->d_name);
    }
    closedir(d);
    // Cut inside the header itself.
    const char *head = s_path(3, "head");
    FILE *f = fopen(head, "wb");
    ck_assert_ptr_nonnull(f);
    fwrite("\0\0\x08\x03\0\0", 1, 6, f);
    fclose(f);
    ck_assert_int_eq(zps_idx_open(head, NULL, &idx), ZPS_EINVAL);
}
END_TEST

START_TEST(test_idx_too_long)
{
    s_fill_data();
    const char *path = s_path(0, "long.gz");
    // Fewer records in the header than in the stream: corrupt, not cut.
    static const uint32_t dims[3] = {4, 2, 3};
    s_write_raw(path, 0x00000803, dims, 3, s_data, sizeof s_data, 1);
    zps_idx idx;
    ck_assert_int_eq(zps_idx_open(path, s_path(1, "cache"), &idx), ZPS_EINVAL);
    s_write_raw(s_path(2, "long"), 0x00000803, dims, 3, s_data, sizeof s_data, 0);
    ck_assert_int_eq(zps_idx_open(s_path(2, "long"), NULL, &idx), ZPS_EINVAL);
}
END_TEST

START_TEST(test_idx_size_overflow)
{
    const char *path = s_path(0, "huge");
    static const uint32_t huge[4] = {1, 65536, 65536, 2}; // record of 2^33 bytes
    s_write_raw(path, 0x00000804, huge, 4, NULL, 0, 0);
    zps_idx idx;
    ck_assert_int_eq(zps_idx_open(path, NULL, &idx), ZPS_EINVAL);
    static const uint32_t zero[3] = {5, 0, 3};
    s_write_raw(path, 0x00000803, zero, 3, NULL, 0, 0);
    ck_assert_int_eq(zps_idx_open(path, NULL, &idx), ZPS_EINVAL);
}
END_TEST

START_TEST(test_idx_missing_file)
{
    zps_idx idx;
    ck_assert_int_eq(zps_idx_open(s_path(0, "nope.gz"), s_path(1, "c"), &idx), ZPS_ENOENT);
    uint32_t n;
    ck_assert_int_eq(zps_idx_count(s_path(0, "nope.gz"), &n), ZPS_ENOENT);
}
END_TEST

START_TEST(test_idx_gz_needs_cache_dir)
{
    const char *path = s_path(0, "images.gz");
    s_write_images(path, 1);
    zps_idx idx;
    ck_assert_int_eq(zps_idx_open(path, NULL, &idx), ZPS_EINVAL);
    ck_assert_int_eq(zps_idx_open(path, "", &idx), ZPS_EINVAL);
}
END_TEST

START_TEST(test_idx_count)
{
    const char *plain = s_path(0, "images");
    const char *gz = s_path(1, "images.gz");
    s_write_images(plain, 0);
    s_write_images(gz, 1);
    uint32_t n = 0;
    ck_assert_int_eq(zps_idx_count(plain, &n), ZPS_OK);
    ck_assert_uint_eq(n, 5);
    n = 0;
    ck_assert_int_eq(zps_idx_count(gz, &n), ZPS_OK);
    ck_assert_uint_eq(n, 5);
    // Only the header is read: a file cut after it still counts.
    const char *cut = s_path(2, "cut");
    s_write_raw(cut, 0x00000801, (const uint32_t[]){60000}, 1, NULL, 0, 0);
    ck_assert_int_eq(zps_idx_count(cut, &n), ZPS_OK);
    ck_assert_uint_eq(n, 60000);
}
END_TEST

// The package is a declared dependency (DESIGN.md): its absence is a failure.
START_TEST(test_idx_fashion_train_labels)
{
    struct stat st;
    ck_assert_msg(stat(FASHION_DIR, &st) == 0,
                  FASHION_DIR " is missing: apt-get install dataset-fashion-mnist");
    const char *path = FASHION_DIR "/train-labels-idx1-ubyte.gz";
    uint32_t n = 0;
    ck_assert_int_eq(zps_idx_count(path, &n), ZPS_OK);
    ck_assert_uint_eq(n, 60000);
    zps_idx idx;
    ck_assert_int_eq(zps_idx_open(path, s_path(0, "cache"), &idx), ZPS_OK);
    ck_assert_uint_eq(idx.n, 60000);
    ck_assert_int_eq(idx.n_dims, 1);
    ck_assert_uint_eq(idx.record_size, 1);
    uint32_t per_class[256] = {0};
    for (uint32_t i = 0; i < idx.n; i++) {
        per_class[idx.data[i]]++;
    }
    for (int c = 0; c < 10; c++) {
        ck_assert_uint_eq(per_class[c], 6000); // the training set is balanced
    }
    zps_idx_close(&idx);
}
END_TEST

Suite *zps_suite_idx(void)
{
    Suite *s = suite_create("idx");
    TCase *tc = tcase_create("files");
    zps_tmpdir_fixture(tc);
    tcase_set_timeout(tc, 60); // the real labels under valgrind
    tcase_add_test(tc, test_idx_plain_roundtrip);
    tcase_add_test(tc, test_idx_gz_roundtrip);
    tcase_add_test(tc, test_idx_cache_reused);
    tcase_add_test(tc, test_idx_incomplete_cache_rebuilt);
    tcase_add_test(tc, test_idx_bad_magic);
    tcase_add_test(tc, test_idx_truncated);
    tcase_add_test(tc, test_idx_too_long);
    tcase_add_test(tc, test_idx_size_overflow);
    tcase_add_test(tc, test_idx_missing_file);
    tcase_add_test(tc, test_idx_gz_needs_cache_dir);
    tcase_add_test(tc, test_idx_count);
    tcase_add_test(tc, test_idx_fashion_train_labels);
    suite_add_tcase(s, tc);
    return s;
}
