/* zps_atomic.c - a temporary beside the file, fsync, rename, fsync the
 * directory: the one way the product replaces a file (checkpoints, the IDX
 * cache, pid and endpoint files, saved parameters, report pictures). */
#include "zps_atomic.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/zps_log.h"

// Tells apart the temporaries of one process's threads; the pid tells apart
// processes, so two writers never share a temporary.
static atomic_uint s_serial;

// The directory of path ("." for a bare name) into dir.
static void s_dirname(const char *path, char *dir, size_t cap)
{
    const char *slash = strrchr(path, '/');
    if (slash == NULL) {
        snprintf(dir, cap, ".");
    } else if (slash == path) {
        snprintf(dir, cap, "/");
    } else {
        snprintf(dir, cap, "%.*s", (int)(slash - path), path);
    }
}

// Makes the rename itself durable: without it a power loss can forget the
// new name even though the file's data reached the disk.
static zps_err s_sync_dir(const char *path)
{
    char dir[PATH_MAX];
    s_dirname(path, dir, sizeof dir);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        zps_log_error("%s: open directory to fsync: %s", dir, strerror(errno));
        return ZPS_EIO;
    }
    zps_err err = ZPS_OK;
    if (fsync(fd) != 0) {
        zps_log_error("%s: fsync directory: %s", dir, strerror(errno));
        err = ZPS_EIO;
    }
    close(fd);
    return err;
}

zps_err zps_atomic_begin(zps_atomic *a, const char *path, mode_t mode)
{
    a->fd = -1;
    const char *slash = strrchr(path, '/');
    int dlen = slash ? (int)(slash - path + 1) : 0;
    const char *name = path + dlen;
    if (snprintf(a->path, sizeof a->path, "%s", path) >= (int)sizeof a->path) {
        zps_log_error("%s: path too long", path);
        return ZPS_EINVAL;
    }
    // O_EXCL with a new serial on a clash: a temporary left by a crashed
    // writer of the same pid (a container's pid 1) is never reused.
    for (int tries = 0; tries < 100; tries++) {
        unsigned n = atomic_fetch_add(&s_serial, 1);
        int len = snprintf(a->tmp, sizeof a->tmp, "%.*s.%s.tmp.%ld.%u", dlen, path, name,
                           (long)getpid(), n);
        if (len < 0 || (size_t)len >= sizeof a->tmp) {
            zps_log_error("%s: path too long", path);
            return ZPS_EINVAL;
        }
        a->fd = open(a->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
        if (a->fd >= 0) {
            return ZPS_OK;
        }
        if (errno != EEXIST) {
            break;
        }
    }
    zps_log_error("%s: create temporary: %s", a->tmp, strerror(errno));
    return ZPS_EIO;
}

zps_err zps_atomic_commit(zps_atomic *a, zps_err err)
{
    if (err == ZPS_OK && fsync(a->fd) != 0) {
        zps_log_error("%s: fsync: %s", a->tmp, strerror(errno));
        err = ZPS_EIO;
    }
    // close can report a deferred write error (NFS), so it is checked too.
    if (close(a->fd) != 0 && err == ZPS_OK) {
        zps_log_error("%s: close: %s", a->tmp, strerror(errno));
        err = ZPS_EIO;
    }
    a->fd = -1;
    if (err == ZPS_OK && rename(a->tmp, a->path) != 0) {
        zps_log_error("%s: rename to %s: %s", a->tmp, a->path, strerror(errno));
        err = ZPS_EIO;
    }
    if (err != ZPS_OK) {
        (void)unlink(a->tmp);
        return err;
    }
    // The file is complete under its name; if the directory sync fails the
    // rename may not survive a power loss, which the caller must hear.
    return s_sync_dir(a->path);
}

// Writes len bytes, retrying interrupted and short writes.
static zps_err s_write_all(const zps_atomic *a, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t w = write(a->fd, p, len);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w < 0) {
            zps_log_error("%s: write: %s", a->tmp, strerror(errno));
            return ZPS_EIO;
        }
        p += w;
        len -= (size_t)w;
    }
    return ZPS_OK;
}

zps_err zps_atomic_write(const char *path, const void *buf, size_t len, mode_t mode)
{
    zps_atomic a;
    zps_err err = zps_atomic_begin(&a, path, mode);
    if (err != ZPS_OK) {
        return err;
    }
    return zps_atomic_commit(&a, s_write_all(&a, buf, len));
}
