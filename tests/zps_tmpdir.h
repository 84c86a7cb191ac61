/* zps_tmpdir.h - the unit suites' scratch directories: one made fresh under
 * /tmp for a test (or a suite), and removed with all it holds at the end. */
#ifndef ZPS_TMPDIR_H
#define ZPS_TMPDIR_H

#include <check.h>
#include <stddef.h>

// Makes a new directory "/tmp/zps-<tag>-XXXXXX" and puts its name in buf
// (cap bytes); fails the running test if it cannot.
void zps_tmpdir_make(char *buf, size_t cap, const char *tag);

// Makes a new directory "<parent>/t-XXXXXX" (a test's own, below a suite's
// directory that an unchecked fixture removes even if the test crashed).
void zps_tmpdir_make_in(char *buf, size_t cap, const char *parent);

// Removes dir and everything below it, read-only directories a test left
// included. 0 on success, -1 if something stayed (the caller decides whether
// that fails a test: an unchecked teardown must not assert).
int zps_tmpdir_remove(const char *dir);

// Gives each test of tc a fresh directory of its own (zps_tmpdir_dir), below
// one the test case shares, which an unchecked fixture (run in the parent
// process) removes even when a test crashed.
void zps_tmpdir_fixture(TCase *tc);
// The running test's directory (of zps_tmpdir_fixture).
const char *zps_tmpdir_dir(void);

#endif
