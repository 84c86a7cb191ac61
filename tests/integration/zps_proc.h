/* zps_proc.h - real processes for integration tests: start zps daemons,
 * wait for them with a bound, and kill by pid whatever is left. */
#ifndef ZPS_PROC_H
#define ZPS_PROC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/zps_wire.h"

#define ZPS_PROC_MAX 32

// The processes one test started; zps_procs_kill_all reaps them all.
typedef struct zps_procs {
    pid_t pids[ZPS_PROC_MAX]; // started, not yet reaped (0: free slot)
    char dir[256];            // the test's scratch directory (logs, outputs)
} zps_procs;

// Makes a scratch directory under $TMPDIR.
void zps_procs_init(zps_procs *ps, const char *name);
// Around a runner's run: the directories its tests make are listed, and
// those still there at the end (a failed test's: a passing one removes
// its own) have the last lines of their logs printed if print_kept.
void zps_procs_begin_run(void);
void zps_procs_end_run(bool print_kept);
// Kills (SIGKILL) and reaps every process still running, removes the
// scratch directory unless keep is set (a failing test keeps its logs).
void zps_procs_fini(zps_procs *ps, bool keep);

// Starts bin/<prog> (ZPS_BIN_DIR overrides bin) with NULL-terminated args,
// stdout and stderr to <dir>/<log>. Returns the pid.
pid_t zps_procs_start(zps_procs *ps, const char *prog, const char *log, const char *const *args);
// Waits up to timeout_ms for pid to exit; returns its exit status, or -1 if
// it did not exit in time (it is then killed) or died of a signal.
int zps_procs_wait(zps_procs *ps, pid_t pid, int timeout_ms);

// Starts a server with `args` on a free loopback port, logging to
// <tag>.log; returns its endpoint (static storage, overwritten by the next
// call) once the server listens, within timeout_ms.
const char *zps_procs_start_server(zps_procs *ps, const char *tag, pid_t *pid,
                                   const char *const *args, int timeout_ms);

// Makes the test responsible for a pid it did not start (a launcher's
// daemon): zps_procs_fini kills it too.
void zps_procs_adopt(zps_procs *ps, pid_t pid);
// True while pid runs (a zombie counts as gone).
bool zps_proc_alive(pid_t pid);
// Runs a shell command line with a bound; returns its exit status or -1.
int zps_procs_sh(zps_procs *ps, const char *cmdline, const char *log, int timeout_ms);

// Asks the server at endpoint for STATUS (bounded, 5 s) into m; fails the
// test without an answer. The caller reads m->hdr->status, then finishes m.
void zps_procs_status(const char *endpoint, zps_wire_msg *m);

// Bounded waits; each fails the test when the bound passes. Until the log
// file under the scratch directory has a line with text:
void zps_procs_wait_log(const zps_procs *ps, const char *log, const char *text, int timeout_ms);
// Until shard 0 at endpoint has completed `step` steps; returns the steps
// it has completed.
uint64_t zps_procs_wait_step(const char *endpoint, uint64_t step, int timeout_ms);

// A TCP port on 127.0.0.1 that was free a moment ago (for a server that
// must come back on the same address after a restart).
int zps_free_port(void);

// Path under the scratch directory (static storage, 8 rotating buffers).
const char *zps_procs_path(const zps_procs *ps, const char *name);
// Forks; in the child (0 returned) stdout and stderr go to <dir>/<log>
// and the child dies with the test. The pid is not in ps's table: the
// caller waits for it and kills it.
pid_t zps_procs_fork_logged(const zps_procs *ps, const char *log);

// Reads a file of floats; returns how many, or 0 on error. Caller frees *out.
size_t zps_read_floats(const char *path, float **out);
// The file of n floats (saved parameters) under the scratch directory;
// fails the test if it holds another count. Caller frees.
float *zps_procs_load_params(const zps_procs *ps, const char *name, size_t n);
// max |a[i] - b[i]| (NaN if either holds a NaN: no bound holds then).
double zps_max_abs_diff(const float *a, const float *b, size_t n);
// zps_max_abs_diff of two such files.
double zps_procs_params_diff(const zps_procs *ps, const char *a, const char *b, size_t n);
// The lines of the log file under the scratch directory that contain
// text; -1 if there is no such file.
int zps_procs_log_count(const zps_procs *ps, const char *log, const char *text);
// True if the log file under the scratch directory has a line with text.
bool zps_procs_log_has(const zps_procs *ps, const char *log, const char *text);

#endif
