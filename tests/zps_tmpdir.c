/* zps_tmpdir.c - mkdtemp and an nftw tree removal for the unit suites, so
 * no suite keeps its own copy (or shells out to rm -rf). */
#include "tests/zps_tmpdir.h"

#include <check.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

// mkdtemp of the template in buf, as long as len says snprintf made it.
static void s_mkdtemp(char *buf, size_t cap, int len)
{
    ck_assert_msg(len > 0 && (size_t)len < cap, "tmpdir name too long: %s", buf);
    ck_assert_msg(mkdtemp(buf) != NULL, "mkdtemp %s failed", buf);
}

void zps_tmpdir_make(char *buf, size_t cap, const char *tag)
{
    s_mkdtemp(buf, cap, snprintf(buf, cap, "/tmp/zps-%s-XXXXXX", tag));
}

void zps_tmpdir_make_in(char *buf, size_t cap, const char *parent)
{
    s_mkdtemp(buf, cap, snprintf(buf, cap, "%s/t-XXXXXX", parent));
}

static int s_rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

// A directory a test made read-only (or unreadable) could be neither
// listed nor emptied: a first walk, parents before children, opens each up
// before the depth-first walk removes it all.
static int s_open_up(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)ftw;
    if (flag == FTW_D || flag == FTW_DNR) {
        (void)chmod(path, (st->st_mode & 07777) | 0700);
    }
    return 0;
}

int zps_tmpdir_remove(const char *dir)
{
    (void)chmod(dir, 0700);
    (void)nftw(dir, s_open_up, 16, FTW_PHYS);
    return nftw(dir, s_rm_one, 16, FTW_DEPTH | FTW_PHYS) == 0 ? 0 : -1;
}

// The test case's directory and the running test's, one test case at a time
// (check runs them in turn; a forked test inherits both).
static char s_case_dir[64], s_test_dir[128];

static void s_case_setup(void)
{
    zps_tmpdir_make(s_case_dir, sizeof s_case_dir, "check");
}

static void s_case_teardown(void)
{
    (void)zps_tmpdir_remove(s_case_dir);
}

static void s_test_setup(void)
{
    zps_tmpdir_make_in(s_test_dir, sizeof s_test_dir, s_case_dir);
}

void zps_tmpdir_fixture(TCase *tc)
{
    tcase_add_unchecked_fixture(tc, s_case_setup, s_case_teardown);
    tcase_add_checked_fixture(tc, s_test_setup, NULL);
}

const char *zps_tmpdir_dir(void)
{
    return s_test_dir;
}
