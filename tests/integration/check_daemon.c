/* check_daemon.c - the daemons under a supervisor: configuration from
 * ZPS_<FLAG> variables, --pid-file, --log-json, and SIGTERM, which stops
 * with exit 0 and a checkpoint that a restarted job resumes from, ending
 * where an uninterrupted run ends. Real processes on loopback; every wait
 * bounded; every process killed by pid at the end. */
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/zps_clock.h"
#include "common/zps_model.h"
#include "common/zps_wire.h"
#include "zps_integration.h"
#include "zps_mlog_read.h"
#include "zps_proc.h"

#define MODEL "mlp:784-512-512-10"
#define STEPS "80" // as in check_failures.c: lr 0.02, seed 5, batch 96
#define BATCH "96"

static void s_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

// The pid in a pid file, or 0 if there is none (yet).
static long s_read_pid(const char *path)
{
    FILE *f = fopen(path, "r");
    long pid = 0;
    if (f) {
        if (fscanf(f, "%ld", &pid) != 1) {
            pid = 0;
        }
        fclose(f);
    }
    return pid;
}

// Every line of the log is a JSON object with ts, level, proc and msg;
// returns how many lines there were.
static int s_check_json_log(zps_procs *ps, const char *log)
{
    json_t *lines = zps_procs_mlog(ps, log);
    size_t i;
    json_t *o;
    json_array_foreach(lines, i, o)
    {
        const char *keys[] = {"ts", "level", "proc", "msg"};
        for (int k = 0; k < 4; k++) {
            ck_assert_msg(json_is_string(json_object_get(o, keys[k])), "%s line %zu lacks %s",
                          log, i + 1, keys[k]);
        }
    }
    int n = (int)json_array_size(lines);
    json_decref(lines);
    return n;
}

// A job configured only through the environment (but for what the test
// helper puts on the command line, which wins over ZPS_LISTEN), with pid
// files and JSON logs.
START_TEST(test_daemon_environment_configures_server_and_worker)
{
    zps_procs ps;
    zps_procs_init(&ps, "daemon-env");
    char spid[512], wpid[512];
    snprintf(spid, sizeof spid, "%s", zps_procs_path(&ps, "server.pid"));
    snprintf(wpid, sizeof wpid, "%s", zps_procs_path(&ps, "worker.pid"));
    setenv("ZPS_LISTEN", "tcp://127.0.0.1:1", 1); // overridden by the command line
    setenv("ZPS_WORKERS", "1", 1);
    setenv("ZPS_MODEL", "mlp:784-32-10", 1);
    setenv("ZPS_GLOBAL_BATCH", "32", 1);
    setenv("ZPS_STEPS", "40", 1);
    setenv("ZPS_LR_SCHEDULE", "constant", 1);
    setenv("ZPS_NESTEROV", "yes", 1);
    setenv("ZPS_LOG_JSON", "1", 1);
    setenv("ZPS_PID_FILE", spid, 1);
    const char *none[] = {NULL};
    pid_t server;
    char ep[256];
    snprintf(ep, sizeof ep, "%s", zps_procs_start_server(&ps, "server", &server, none, 10000));
    double deadline = zps_clock_ms() + 5000;
    while (s_read_pid(spid) != server && zps_clock_ms() < deadline) {
        s_sleep_ms(10);
    }
    ck_assert_int_eq(s_read_pid(spid), server);
    setenv("ZPS_PID_FILE", wpid, 1);
    setenv("ZPS_COORDINATOR", ep, 1);
    setenv("ZPS_CACHE_DIR", ZPS_TEST_CACHE, 1);
    setenv("ZPS_SAVE_PARAMS", zps_procs_path(&ps, "w.bin"), 1);
    pid_t w = zps_procs_start(&ps, "zps-worker", "worker.log", none);
    ck_assert_int_eq(zps_procs_wait(&ps, w, 120000), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, server, 30000), 0);
    // The job is the environment's, the listen address the command line's.
    ck_assert_msg(zps_procs_log_has(&ps, "server.log", "global batch 32, 40 steps"),
                  "the server did not take its job from ZPS_*");
    ck_assert_msg(strcmp(ep, "tcp://127.0.0.1:1") != 0, "ZPS_LISTEN won over --listen");
    float *p;
    zps_model_spec spec;
    ck_assert_int_eq(zps_model_parse("mlp:784-32-10", &spec), ZPS_OK);
    ck_assert_uint_eq(zps_read_floats(zps_procs_path(&ps, "w.bin"), &p), spec.n_params);
    free(p);
    // Pid files go with their processes; every log line is JSON.
    ck_assert_msg(access(spid, F_OK) != 0, "the server left its pid file");
    ck_assert_msg(access(wpid, F_OK) != 0, "the worker left its pid file");
    ck_assert_int_gt(s_check_json_log(&ps, "server.log"), 3);
    ck_assert_int_gt(s_check_json_log(&ps, "worker.log"), 3);
    zps_procs_fini(&ps, false);
}
END_TEST

// A switch set to something that is neither on nor off, or a number out of
// range: exit 2, one line naming the variable or flag, nothing started.
START_TEST(test_daemon_bad_switch_value_fails_with_one_line)
{
    zps_procs ps;
    zps_procs_init(&ps, "daemon-bad");
    setenv("ZPS_ADAPTIVE_SPLIT", "maybe", 1);
    const char *args[] = {"--listen", "tcp://127.0.0.1:*", NULL};
    pid_t s = zps_procs_start(&ps, "zps-server", "server.log", args);
    ck_assert_int_eq(zps_procs_wait(&ps, s, 10000), 2);
    ck_assert_msg(zps_procs_log_has(&ps, "server.log", "ZPS_ADAPTIVE_SPLIT: 'maybe'"),
                  "the error does not name the variable and its value");
    unsetenv("ZPS_ADAPTIVE_SPLIT");
    setenv("ZPS_THREADS", "many", 1);
    const char *wargs[] = {"--coordinator", "tcp://127.0.0.1:1", NULL};
    pid_t w = zps_procs_start(&ps, "zps-worker", "worker.log", wargs);
    ck_assert_int_eq(zps_procs_wait(&ps, w, 10000), 2);
    ck_assert_msg(zps_procs_log_has(&ps, "worker.log", "--threads: 'many'"),
                  "the error does not name the flag and its value");
    unsetenv("ZPS_THREADS");
    // A number in no allowed range: a send buffer below a page.
    const char *bargs[] = {"--listen", "tcp://127.0.0.1:*", "--sndbuf", "100", NULL};
    s = zps_procs_start(&ps, "zps-server", "server-sndbuf.log", bargs);
    ck_assert_int_eq(zps_procs_wait(&ps, s, 10000), 2);
    ck_assert_msg(
        zps_procs_log_has(&ps, "server-sndbuf.log", "--sndbuf: '100' is not auto, 0 or 4096"),
        "the error does not name the flag and its range");
    zps_procs_fini(&ps, false);
}
END_TEST

// A worker saving its parameters as name.bin; stall_ms, if not NULL, the
// pause it takes every step.
static pid_t s_worker(zps_procs *ps, const char *ep, const char *name, const char *stall_ms)
{
    char out[64], log[64];
    snprintf(out, sizeof out, "%s.bin", name);
    snprintf(log, sizeof log, "%s.log", name);
    const char *args[13] = {"--coordinator", ep, "--save-params", zps_procs_path(ps, out),
                            "--cache-dir", ZPS_TEST_CACHE, "--heartbeat-ms", "100"};
    if (stall_ms) {
        const char *stall[] = {"--stall-prob", "1", "--stall-ms", stall_ms};
        memcpy(args + 8, stall, sizeof stall); // args[12] stays NULL
    }
    return zps_procs_start(ps, "zps-worker", log, args);
}

// SIGTERM to the server and then to its workers mid-run: all exit 0, the
// server writes a checkpoint of the last whole step; a new server with
// --resume and a new worker finish the job, equal to an uninterrupted run.
START_TEST(test_daemon_sigterm_checkpoints_and_restarted_job_ends_equal)
{
    zps_procs ps;
    zps_procs_init(&ps, "daemon-term");
    zps_model_spec spec;
    ck_assert_int_eq(zps_model_parse(MODEL, &spec), ZPS_OK);
    char ck[512], listen[64];
    snprintf(ck, sizeof ck, "%s", zps_procs_path(&ps, "ck"));
    snprintf(listen, sizeof listen, "tcp://127.0.0.1:%d", zps_free_port());
    const char *args[] = {"--workers", "2", "--global-batch", BATCH, "--steps", STEPS,
                          "--model", MODEL, "--seed", "5", "--lr", "0.02",
                          "--worker-timeout-ms", "1000", "--checkpoint-dir", ck,
                          "--checkpoint-every", "1000", "--listen", listen, NULL, NULL};
    const char *ref_args[] = {"--workers", "1", "--global-batch", BATCH, "--steps", STEPS,
                              "--model", MODEL, "--seed", "5", "--lr", "0.02", NULL};
    pid_t s;
    char ep[256];
    snprintf(ep, sizeof ep, "%s", zps_procs_start_server(&ps, "ref", &s, ref_args, 10000));
    pid_t r = s_worker(&ps, ep, "ref", NULL);
    ck_assert_int_eq(zps_procs_wait(&ps, r, 120000), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, s, 30000), 0);

    snprintf(ep, sizeof ep, "%s", zps_procs_start_server(&ps, "server", &s, args, 10000));
    // 20 ms a step: step 30 comes at about 0.6 s and SIGTERM lands mid-run,
    // where a fast machine ran the 80 steps within the poll's reach.
    pid_t w0 = s_worker(&ps, ep, "w0", "20"), w1 = s_worker(&ps, ep, "w1", "20");
    zps_procs_wait_step(ep, 30, 60000);
    ck_assert_int_eq(kill(s, SIGTERM), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, s, 10000), 0);
    ck_assert_int_eq(kill(w0, SIGTERM), 0);
    ck_assert_int_eq(kill(w1, SIGTERM), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, w0, 10000), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, w1, 10000), 0);
    ck_assert_msg(zps_procs_log_has(&ps, "server.log", "stopped by signal: checkpoint of step"),
                  "the server wrote no checkpoint on SIGTERM");
    ck_assert_msg(zps_procs_log_has(&ps, "w0.log", "stopped by signal"), "w0 did not stop cleanly");

    // The members of before are gone: the first worker to say HELLO after
    // the recovery wait joins and trains the rest of the job alone.
    args[sizeof args / sizeof args[0] - 2] = "--resume";
    snprintf(ep, sizeof ep, "%s", zps_procs_start_server(&ps, "again", &s, args, 10000));
    w0 = s_worker(&ps, ep, "a0", NULL);
    ck_assert_int_eq(zps_procs_wait(&ps, w0, 120000), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, s, 30000), 0);
    ck_assert_msg(zps_procs_log_has(&ps, "again.log", "resumed at step"), "the job did not resume");
    double d = zps_procs_params_diff(&ps, "ref.bin", "a0.bin", spec.n_params);
    fprintf(stderr, "SIGTERM at step 30, resumed: max |uninterrupted - resumed| = %.3g\n", d);
    ck_assert_double_le(d, 1e-4);
    zps_procs_fini(&ps, false);
}
END_TEST

Suite *zps_suite_daemon(void)
{
    Suite *s = suite_create("daemon");
    TCase *tc = tcase_create("supervised");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_daemon_environment_configures_server_and_worker);
    tcase_add_test(tc, test_daemon_bad_switch_value_fails_with_one_line);
    tcase_add_test(tc, test_daemon_sigterm_checkpoints_and_restarted_job_ends_equal);
    suite_add_tcase(s, tc);
    return s;
}
