/* check_atomic.c - zps_atomic: a file replaced whole, with the mode asked
 * for, and no temporary left behind whatever happens. */
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/zps_atomic.h"
#include "tests/zps_check.h"
#include "tests/zps_tmpdir.h"

static const char *s_path(const char *name)
{
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", zps_tmpdir_dir(), name);
    return path;
}

// The whole content of path, as a string (a static buffer).
static const char *s_read(const char *path)
{
    static char buf[256];
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

// How many entries the test's directory holds, . and .. aside.
static int s_entries(void)
{
    DIR *d = opendir(zps_tmpdir_dir());
    ck_assert_ptr_nonnull(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    }
    closedir(d);
    return n;
}

START_TEST(test_atomic_write_creates_the_file_with_its_content_and_mode)
{
    const char *path = s_path("a.txt");
    ck_assert_int_eq(zps_atomic_write(path, "hello\n", 6, 0600), ZPS_OK);
    ck_assert_str_eq(s_read(path), "hello\n");
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0600);
    ck_assert_int_eq(s_entries(), 1);
}
END_TEST

START_TEST(test_atomic_write_replaces_the_old_file_whole)
{
    const char *path = s_path("a.txt");
    ck_assert_int_eq(zps_atomic_write(path, "the old, longer content\n", 24, 0644), ZPS_OK);
    ck_assert_int_eq(zps_atomic_write(path, "new\n", 4, 0644), ZPS_OK);
    ck_assert_str_eq(s_read(path), "new\n");
    ck_assert_int_eq(s_entries(), 1);
}
END_TEST

START_TEST(test_atomic_commit_of_a_failed_write_keeps_the_old_file_and_no_temporary)
{
    const char *path = s_path("a.txt");
    ck_assert_int_eq(zps_atomic_write(path, "old\n", 4, 0644), ZPS_OK);
    zps_atomic a;
    ck_assert_int_eq(zps_atomic_begin(&a, path, 0644), ZPS_OK);
    ck_assert_int_eq(s_entries(), 2);
    ck_assert_int_eq(zps_atomic_commit(&a, ZPS_EIO), ZPS_EIO);
    ck_assert_str_eq(s_read(path), "old\n");
    ck_assert_int_eq(s_entries(), 1);
}
END_TEST

START_TEST(test_atomic_write_over_a_directory_fails_and_leaves_no_temporary)
{
    const char *path = s_path("sub");
    ck_assert_int_eq(mkdir(path, 0755), 0);
    ck_assert_int_eq(zps_atomic_write(path, "x", 1, 0644), ZPS_EIO);
    ck_assert_int_eq(s_entries(), 1);
}
END_TEST

START_TEST(test_atomic_write_into_a_missing_directory_is_refused)
{
    ck_assert_int_eq(zps_atomic_write(s_path("missing/a.txt"), "x", 1, 0644), ZPS_EIO);
    ck_assert_int_eq(s_entries(), 0);
}
END_TEST

START_TEST(test_atomic_write_of_a_too_long_path_is_refused)
{
    static char path[PATH_MAX + 16];
    memset(path, 'a', sizeof path - 1);
    path[sizeof path - 1] = '\0';
    ck_assert_int_eq(zps_atomic_write(path, "x", 1, 0644), ZPS_EINVAL);
}
END_TEST

Suite *zps_suite_atomic(void)
{
    Suite *s = suite_create("atomic");
    TCase *tc = tcase_create("atomic");
    zps_tmpdir_fixture(tc);
    tcase_add_test(tc, test_atomic_write_creates_the_file_with_its_content_and_mode);
    tcase_add_test(tc, test_atomic_write_replaces_the_old_file_whole);
    tcase_add_test(tc, test_atomic_commit_of_a_failed_write_keeps_the_old_file_and_no_temporary);
    tcase_add_test(tc, test_atomic_write_over_a_directory_fails_and_leaves_no_temporary);
    tcase_add_test(tc, test_atomic_write_into_a_missing_directory_is_refused);
    tcase_add_test(tc, test_atomic_write_of_a_too_long_path_is_refused);
    suite_add_tcase(s, tc);
    return s;
}
