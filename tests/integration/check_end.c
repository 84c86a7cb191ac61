/* check_end.c - the end of a job, raced: what a worker sends while the
 * coordinator finishes (a HELLO, a push, a pull, a STATUS) ends that
 * worker with exit 0, and its BYE ends the server at once rather than
 * after the coordinator's grace for a member's last report (60 s). Each
 * test provokes one race with real processes: a worker frozen with
 * SIGSTOP, one slowed, one stalled by the seeded fault injection. Every
 * wait bounded; every process killed by pid at the end. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/zps_clock.h"
#include "common/zps_model.h"
#include "common/zps_rng.h"
#include "zps_integration.h"
#include "zps_proc.h"

// A small model: a step of a few ms, so that the job, sanitized or not,
// ends well within the waits below while a third of it is left after the
// freeze of the first test (polled every 5 ms).
#define MODEL "mlp:784-128-10"
#define STEPS 450
#define JOB_MS 120000 // a whole job, under the sanitizers and a loaded machine
// Well under the coordinator's grace for a member's last report
// (ZPS_COORD_END_GRACE_MS, 60 s): a server still up after it was waiting
// for a worker that had left without a word.
#define END_MS 20000

typedef struct job {
    zps_procs ps;
    pid_t server;
    pid_t w[3];
    char endpoint[256];
} job;

// Shard 0 of a job of two workers, with speculation (the worker that is
// there finishes the job alone) and no eviction in the test's time (the
// coordinator waits for a paused worker past the last step).
static void s_start_server(job *j, const char *tag)
{
    zps_procs_init(&j->ps, tag);
    char steps[16];
    snprintf(steps, sizeof steps, "%d", STEPS);
    const char *args[] = {"--workers", "2", "--global-batch", "96", "--steps", steps,
                          "--model", MODEL, "--seed", "1", "--speculate-after", "1",
                          "--worker-timeout-ms", "60000", NULL};
    snprintf(j->endpoint, sizeof j->endpoint, "%s",
             zps_procs_start_server(&j->ps, "server", &j->server, args, 10000));
}

// Worker i, with extra flags (NULL-terminated, or NULL).
static pid_t s_start_worker(job *j, int i, const char *const *extra)
{
    char out[32], log[32];
    snprintf(out, sizeof out, "w%d.bin", i);
    snprintf(log, sizeof log, "w%d.log", i);
    const char *args[24] = {"--coordinator", j->endpoint, "--save-params",
                            zps_procs_path(&j->ps, out), "--cache-dir", ZPS_TEST_CACHE,
                            "--timeout-ms", "10000", NULL};
    size_t n = 8;
    for (size_t k = 0; extra && extra[k]; k++) {
        args[n++] = extra[k];
    }
    args[n] = NULL;
    j->w[i] = zps_procs_start(&j->ps, "zps-worker", log, args);
    return j->w[i];
}

// Until STATUS says the last step is over (the server still waits for a
// member's last report).
static void s_wait_done(const job *j)
{
    double deadline = zps_clock_ms() + JOB_MS;
    for (;;) {
        zps_wire_msg m;
        zps_procs_status(j->endpoint, &m);
        bool done = m.hdr->status->state && strcmp(m.hdr->status->state, "done") == 0;
        zps_wire_msg_fini(&m);
        if (done) {
            return;
        }
        ck_assert_msg(zps_clock_ms() < deadline, "the job did not end within %d ms", JOB_MS);
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

// The worker ended with exit 0, either with the job's last step or told
// that the job is over; it never took the end for a refusal.
static void s_check_worker_ended(job *j, int i, int timeout_ms)
{
    char log[32];
    snprintf(log, sizeof log, "w%d.log", i);
    ck_assert_msg(zps_procs_wait(&j->ps, j->w[i], timeout_ms) == 0,
                  "worker %d did not exit 0 within %d ms (see %s/%s)", i, timeout_ms, j->ps.dir,
                  log);
    ck_assert_msg(zps_procs_log_has(&j->ps, log, "the job is over") ||
                      zps_procs_log_has(&j->ps, log, "done: "),
                  "worker %d: neither the job's end nor its last step in %s/%s", i, j->ps.dir,
                  log);
    ck_assert_msg(!zps_procs_log_has(&j->ps, log, "refused this worker for good"),
                  "worker %d took the job's end for a refusal", i);
}

// The server ends at once after its last worker: nobody was waited for.
static void s_check_server_ended(job *j)
{
    ck_assert_msg(zps_procs_wait(&j->ps, j->server, END_MS) == 0,
                  "the server did not exit 0 within %d ms of its last worker (see %s/server.log)",
                  END_MS, j->ps.dir);
    ck_assert_msg(!zps_procs_log_has(&j->ps, "server.log", "giving up on it"),
                  "the server waited for a worker that had left");
}

// The case: a worker started after the last step says HELLO to a
// coordinator that still waits for a paused member. Then the paused
// member wakes past the end: it asks the coordinator where the job is
// (STATUS) or pulls, learns that the job is over, and says BYE.
START_TEST(test_end_hello_after_the_last_step_exits_0_the_job_is_over)
{
    job j;
    s_start_server(&j, "end-hello");
    s_start_worker(&j, 0, NULL);
    s_start_worker(&j, 1, NULL);
    zps_procs_wait_step(j.endpoint, STEPS * 2 / 3, JOB_MS);
    ck_assert_int_eq(kill(j.w[1], SIGSTOP), 0);
    ck_assert_msg(zps_procs_wait(&j.ps, j.w[0], JOB_MS) == 0, "worker 0 failed");
    s_wait_done(&j);
    s_start_worker(&j, 2, NULL);
    s_check_worker_ended(&j, 2, END_MS);
    ck_assert(zps_procs_log_has(&j.ps, "w2.log", "the job is over: HELLO came after the last"));
    ck_assert(zps_procs_log_has(&j.ps, "w2.log", "exiting without final parameters"));
    ck_assert_int_eq(kill(j.w[1], SIGCONT), 0);
    s_check_worker_ended(&j, 1, END_MS);
    s_check_server_ended(&j);
    zps_procs_fini(&j.ps, false);
}
END_TEST

// A worker slowed 20 x: its slices are handed on, and its pushes and
// waits for parameters run past the last step. It learns that the job is
// over and leaves; the server does not wait for it.
START_TEST(test_end_slowed_worker_past_the_last_step_leaves_and_the_server_ends)
{
    job j;
    s_start_server(&j, "end-slow");
    static const char *const slow[] = {"--slowdown", "20", NULL};
    s_start_worker(&j, 0, NULL);
    s_start_worker(&j, 1, slow);
    ck_assert_msg(zps_procs_wait(&j.ps, j.w[0], JOB_MS) == 0, "worker 0 failed");
    s_check_worker_ended(&j, 1, END_MS);
    s_check_server_ended(&j);
    zps_procs_fini(&j.ps, false);
}
END_TEST

// The first step from `from` on that --stall-seed seed pauses with
// probability p (the worker's draw: zps_train.c's s_inject_faults).
static uint64_t s_first_stall(uint64_t seed, double p, uint64_t from)
{
    for (uint64_t step = from;; step++) {
        zps_rng rng;
        zps_rng_seed(&rng, seed, step);
        if (zps_rng_uniform(&rng) < p) {
            return step;
        }
    }
}

// A worker paused (the seeded stall) in the middle of the job wakes
// after the last step: it asks where the job is, pulls the last step's
// parameters and ends with the same bits as the worker that finished.
// The seed's draws pause no step of the job's first third; which step
// pauses first depends on the steps the worker computes (it skips those
// that were handed on while it was late), so the log is asked only that
// it paused, and woke to a job at its last step.
START_TEST(test_end_worker_stalled_past_the_last_step_pulls_the_final_parameters)
{
    const double p = 0.01;
    uint64_t seed = 1;
    while (s_first_stall(seed, p, 0) < STEPS / 3 || s_first_stall(seed, p, 0) > STEPS * 2 / 3) {
        seed++;
    }
    char seed_s[24], woke[64];
    snprintf(seed_s, sizeof seed_s, "%llu", (unsigned long long)seed);
    snprintf(woke, sizeof woke, "the coordinator is at step %d)", STEPS);
    job j;
    s_start_server(&j, "end-stall");
    // 10 s: longer than the rest of the job, sanitized or not.
    const char *const stall[] = {"--stall-prob", "0.01", "--stall-seed", seed_s, "--stall-ms",
                                 "10000", NULL};
    s_start_worker(&j, 0, NULL);
    s_start_worker(&j, 1, stall);
    ck_assert_msg(zps_procs_wait(&j.ps, j.w[0], JOB_MS) == 0, "worker 0 failed");
    s_check_worker_ended(&j, 1, END_MS);
    ck_assert_msg(zps_procs_log_has(&j.ps, "w1.log", "injected stall"), "worker 1 never paused");
    ck_assert_msg(zps_procs_log_has(&j.ps, "w1.log", woke), "no '%s' in w1.log", woke);
    zps_model_spec spec;
    ck_assert_int_eq(zps_model_parse(MODEL, &spec), ZPS_OK);
    double d = zps_procs_params_diff(&j.ps, "w0.bin", "w1.bin", spec.n_params);
    ck_assert_msg(d == 0, "the paused worker ends %.3g from the other", d);
    s_check_server_ended(&j);
    zps_procs_fini(&j.ps, false);
}
END_TEST

Suite *zps_suite_end(void)
{
    Suite *s = suite_create("end");
    TCase *tc = tcase_create("end");
    tcase_set_timeout(tc, 400);
    tcase_add_test(tc, test_end_hello_after_the_last_step_exits_0_the_job_is_over);
    tcase_add_test(tc, test_end_slowed_worker_past_the_last_step_leaves_and_the_server_ends);
    tcase_add_test(tc, test_end_worker_stalled_past_the_last_step_pulls_the_final_parameters);
    suite_add_tcase(s, tc);
    return s;
}
