/* check_swarm.c - members by the hundred and the thousand (issue 30, Tests;
 * DESIGN.md "Scale"): 600 real zps-worker processes against one server
 * train flat:4096 for 100 steps with every step's samples counted once, and
 * the swarm (bench/swarm.c: libzps clients, many to a process) completes a
 * few steps with 4096 members. Both are tagged long (make test-long): they
 * take minutes and most of a small machine. The per-member cost is the
 * benchmark's to measure, not a timed test's. */
#include <check.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/zps_clock.h"
#include "zps_integration.h"
#include "zps_mlog_read.h"
#include "zps_proc.h"

#define SW_WORKERS 600
#define SW_STEPS 100
#define SW_BATCH 1200 // two samples a worker
#define SW_RUN_MS (600 * 1000)

// RLIMIT_NOFILE to its hard limit: the server holds a few connections a
// worker, and inherits the test's limit.
static void s_raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = rl.rlim_max;
        ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
    }
}

// zps-worker i, logging to w<i>.log; it dies with the test (zps_procs holds
// at most ZPS_PROC_MAX processes, so the workers are this file's).
static pid_t s_start_worker(const zps_procs *ps, const char *endpoint, int i)
{
    char log[32], path[512];
    snprintf(log, sizeof log, "w%d.log", i);
    const char *bin = getenv("ZPS_BIN_DIR");
    snprintf(path, sizeof path, "%s/zps-worker", bin && *bin ? bin : "bin");
    pid_t pid = zps_procs_fork_logged(ps, log);
    if (pid == 0) {
        execl(path, path, "--coordinator", endpoint, "--timeout-ms", "120000", "--sndbuf", "0",
              (char *)NULL);
        _exit(127);
    }
    return pid;
}

// Waits for every worker within the bound; how many exited 0. Those left
// are killed. Each worker is waited for by its pid: waitpid(-1) reaped
// the server too when it exited before the last worker was reaped (it
// exits with the job), and zps_procs_wait then waited 30 s for a child
// that was gone (two failures of make test-long).
static int s_wait_workers(pid_t *pids, int n, int timeout_ms)
{
    double deadline = zps_clock_ms() + timeout_ms;
    int left = n, ok = 0;
    while (left > 0 && zps_clock_ms() < deadline) {
        int reaped = 0;
        for (int i = 0; i < n; i++) {
            int status;
            if (pids[i] > 0 && waitpid(pids[i], &status, WNOHANG) == pids[i]) {
                ok += WIFEXITED(status) && WEXITSTATUS(status) == 0;
                pids[i] = 0;
                left--;
                reaped++;
            }
        }
        if (reaped == 0) {
            struct timespec ts = {0, 20 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    for (int i = 0; i < n; i++) {
        if (pids[i] > 0) {
            kill(pids[i], SIGKILL);
            waitpid(pids[i], NULL, 0);
            pids[i] = 0;
        }
    }
    return ok;
}

// A step record's "counted" holds [rank, samples] of bucket 0 on shard 0,
// whose counted slices tile the batch (the shard takes a slice once): the
// samples add up to B, each rank once; with no re-plan, every worker of
// the 600 is in it.
static void s_check_counted_once(const json_t *rec, uint64_t step)
{
    static unsigned char seen[SW_WORKERS];
    memset(seen, 0, sizeof seen);
    json_int_t sum = 0;
    int ranks = 0;
    size_t i;
    json_t *piece;
    json_array_foreach(json_object_get(rec, "counted"), i, piece)
    {
        json_int_t rank = json_integer_value(json_array_get(piece, 0));
        json_int_t cnt = json_integer_value(json_array_get(piece, 1));
        ck_assert_msg(rank >= 0 && rank < SW_WORKERS && cnt > 0 && !seen[rank],
                      "step %" PRIu64 ": [rank %lld, %lld samples] out of place", step,
                      (long long)rank, (long long)cnt);
        seen[rank] = 1;
        ranks++;
        sum += cnt;
    }
    ck_assert_msg(sum == SW_BATCH, "step %" PRIu64 ": the ranks counted %lld samples, not %d",
                  step, (long long)sum, SW_BATCH);
    if (zps_mlog_num(rec, "replans") == 0) {
        ck_assert_msg(ranks == SW_WORKERS, "step %" PRIu64 ": %d ranks counted, not %d", step,
                      ranks, SW_WORKERS);
    }
}

// Every step 0..SW_STEPS-1 has one record whose samples are the batch,
// counted once.
static void s_check_metrics(const zps_procs *ps)
{
    static bool got[SW_STEPS];
    memset(got, 0, sizeof got);
    json_t *log = zps_procs_mlog(ps, "metrics.jsonl");
    size_t i;
    json_t *rec;
    json_array_foreach(log, i, rec)
    {
        uint64_t step;
        if (!zps_mlog_step(rec, &step)) {
            continue;
        }
        ck_assert_msg(step < SW_STEPS && !got[step], "step %" PRIu64 " recorded twice or past "
                      "the end", step);
        got[step] = true;
        ck_assert_msg(zps_mlog_num(rec, "samples") == SW_BATCH, "step %" PRIu64 " counted %.0f "
                      "samples, not %d", step, zps_mlog_num(rec, "samples"), SW_BATCH);
        s_check_counted_once(rec, step);
    }
    json_decref(log);
    for (int s = 0; s < SW_STEPS; s++) {
        ck_assert_msg(got[s], "no record of step %d", s);
    }
}

START_TEST(test_swarm_600_workers_count_every_sample_once)
{
    static pid_t pids[SW_WORKERS];
    zps_procs ps;
    zps_procs_init(&ps, "swarm600");
    s_raise_nofile();
    char workers[16], batch[16], steps[16], data[32];
    snprintf(workers, sizeof workers, "%d", SW_WORKERS);
    snprintf(batch, sizeof batch, "%d", SW_BATCH);
    snprintf(steps, sizeof steps, "%d", SW_STEPS);
    snprintf(data, sizeof data, "synthetic:%d", SW_BATCH * 8);
    const char *sargs[] = {"--workers", workers, "--model", "flat:4096", "--dataset", data,
                           "--global-batch", batch, "--steps", steps, "--lr-schedule",
                           "constant", "--worker-timeout-ms", "60000", "--sndbuf", "0",
                           "--metrics-log", zps_procs_path(&ps, "metrics.jsonl"), NULL};
    pid_t server;
    char ep[256];
    snprintf(ep, sizeof ep, "%s", zps_procs_start_server(&ps, "server", &server, sargs, 10000));
    for (int i = 0; i < SW_WORKERS; i++) {
        pids[i] = s_start_worker(&ps, ep, i);
    }
    int ok = s_wait_workers(pids, SW_WORKERS, SW_RUN_MS);
    ck_assert_msg(ok == SW_WORKERS, "%d of %d workers finished the job; logs in %s", ok,
                  SW_WORKERS, ps.dir);
    ck_assert_int_eq(zps_procs_wait(&ps, server, 30000), 0);
    s_check_metrics(&ps);
    zps_procs_fini(&ps, false);
}
END_TEST

// The swarm at 4096 members, a few steps: bench/swarm exits 0 only when
// every member reached the job's end and every server exited 0. ZPS_SWARM
// names the binary (make test-integration-long sets it).
START_TEST(test_swarm_4096_members_complete)
{
    const char *swarm = getenv("ZPS_SWARM");
    zps_procs ps;
    zps_procs_init(&ps, "swarm4096");
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "TMPDIR='%s' '%s' --members 4096 --warmup 2 --steps 3 --timeout-s 540",
             ps.dir, swarm && *swarm ? swarm : "build/bench/swarm");
    int rc = zps_procs_sh(&ps, cmd, "swarm.log", 570 * 1000);
    ck_assert_msg(rc == 0, "bench/swarm at 4096 members: exit %d; see %s/swarm.log", rc,
                  ps.dir);
    zps_procs_fini(&ps, false);
}
END_TEST

Suite *zps_suite_swarm(void)
{
    Suite *s = suite_create("swarm");
    TCase *tc = tcase_create("long");
    tcase_set_timeout(tc, 660);
    tcase_set_tags(tc, "long"); // make test-long: minutes, and most of the machine
    tcase_add_test(tc, test_swarm_600_workers_count_every_sample_once);
    tcase_add_test(tc, test_swarm_4096_members_complete);
    suite_add_tcase(s, tc);
    return s;
}
