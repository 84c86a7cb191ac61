/* zps_pidfile.c - an atomically written pid file. */
#include "zps_pidfile.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/zps_log.h"

zps_err zps_pidfile_write(const char *path)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid()) >= (int)sizeof tmp) {
        zps_log_error("--pid-file %s: path too long", path);
        return ZPS_EINVAL;
    }
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%ld\n", (long)getpid()) < 0 || fclose(f) != 0 || rename(tmp, path) != 0) {
        zps_log_error("--pid-file %s: %s", path, strerror(errno));
        if (f) {
            (void)unlink(tmp);
        }
        return ZPS_EIO;
    }
    return ZPS_OK;
}

void zps_pidfile_remove(const char *path)
{
    FILE *f = fopen(path, "r");
    long pid = 0;
    if (!f) {
        return;
    }
    bool ours = fscanf(f, "%ld", &pid) == 1 && pid == (long)getpid();
    (void)fclose(f);
    if (ours) {
        (void)unlink(path);
    }
}
