/* zps_pidfile.h - --pid-file for supervisors that track a daemon by file.
 *
 * The file is written whole or not at all (a temporary file renamed over
 * it), so a supervisor never reads half a pid, and removed at a clean exit. */
#ifndef ZPS_PIDFILE_H
#define ZPS_PIDFILE_H

#include "common/zps_err.h"

// Writes this process's pid and a newline to path. Logs the reason on failure.
zps_err zps_pidfile_write(const char *path);
// Removes path if it still holds this process's pid (a successor may own it).
void zps_pidfile_remove(const char *path);

#endif
