/* zps_atomic.h - files replaced whole or not at all.
 *
 * A writer fills a temporary beside the file (a dot name in the same
 * directory, so the rename stays on one file system and listings can tell it
 * from the real thing), syncs it, renames it over the file and syncs the
 * directory, so that a reader, a crash or a power loss sees the old file or
 * the new one, never half of either. Every failure is logged and removes the
 * temporary. */
#ifndef ZPS_ATOMIC_H
#define ZPS_ATOMIC_H

#include <limits.h>
#include <stddef.h>
#include <sys/types.h>

#include "common/zps_err.h"

// One file being replaced: fd is the temporary's, to write to between
// zps_atomic_begin and zps_atomic_commit.
typedef struct zps_atomic {
    int fd;
    char path[PATH_MAX];
    char tmp[PATH_MAX];
} zps_atomic;

// Creates the temporary "<dir>/.<name>.tmp.<pid>.<n>" for path with mode (the
// umask applies, as with open(2); a caller that wants an exact mode fchmods
// a->fd). ZPS_EINVAL: the path is too long; ZPS_EIO: the directory is
// missing or not writable.
zps_err zps_atomic_begin(zps_atomic *a, const char *path, mode_t mode);

// Ends what zps_atomic_begin began. err says how the caller's writes went:
// ZPS_OK syncs, closes and renames the temporary over the path, then syncs
// the directory; anything else (or a failure here) closes and removes the
// temporary and is returned. The fd is closed either way.
zps_err zps_atomic_commit(zps_atomic *a, zps_err err);

// Replaces path with the len bytes of buf: zps_atomic_begin, write,
// zps_atomic_commit.
zps_err zps_atomic_write(const char *path, const void *buf, size_t len, mode_t mode);

#endif
