/* zps_pidfile.c - an atomically written pid file. */
#include "zps_pidfile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/zps_atomic.h"
#include "common/zps_log.h"

zps_err zps_pidfile_write(const char *path)
{
    char line[32];
    int len = snprintf(line, sizeof line, "%ld\n", (long)getpid());
    // 0666 less the umask: the mode fopen gave it.
    zps_err err = zps_atomic_write(path, line, (size_t)len, 0666);
    if (err != ZPS_OK) {
        zps_log_error("--pid-file %s: not written", path);
    }
    return err;
}

void zps_pidfile_remove(const char *path)
{
    FILE *f = fopen(path, "r");
    char line[32];
    if (!f) {
        return;
    }
    bool ours = fgets(line, sizeof line, f) && strtol(line, NULL, 10) == (long)getpid();
    (void)fclose(f);
    if (ours) {
        (void)unlink(path);
    }
}
