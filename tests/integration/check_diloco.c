/* check_diloco.c - --mode diloco with real processes: one inner step with
 * SGD and an outer step of lr 1, momentum 0 is synchronous SGD; every
 * worker holds the same bits after the rounds, compressed or not; a
 * worker killed in the middle of a round is missing from it, and the run
 * goes on. Every wait bounded; every process killed by pid at the end. */
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/zps_clock.h"
#include "common/zps_model.h"
#include "zps_integration.h"
#include "zps_mlog_read.h"
#include "zps_proc.h"

#define MODEL "mlp:784-512-512-10"
#define RUN_TIMEOUT_MS 120000

static size_t s_n_params(void)
{
    zps_model_spec spec;
    ck_assert_int_eq(zps_model_parse(MODEL, &spec), ZPS_OK);
    return spec.n_params;
}

// Starts shard 0 with the common flags, then `extra` (NULL-terminated).
// A diloco worker pushes once a round, so between rounds only its
// heartbeats (every second) say it lives: the eviction timeout leaves room
// for a late one (a sanitized worker's round takes 1.5 s).
static const char *s_start_server(zps_procs *ps, const char *tag, pid_t *pid, const char *workers,
                                  const char *steps, const char *const *extra)
{
    static char endpoint[256];
    char metrics[64];
    snprintf(metrics, sizeof metrics, "%s-metrics.jsonl", tag);
    const char *args[40] = {"--workers", workers, "--global-batch", "96", "--steps", steps,
                            "--model", MODEL, "--seed", "3", "--worker-timeout-ms", "3000",
                            "--metrics-log", zps_procs_path(ps, metrics), NULL};
    size_t n = 0;
    while (args[n]) {
        n++;
    }
    for (size_t i = 0; extra[i]; i++) {
        ck_assert_uint_lt(n + 1, sizeof args / sizeof args[0]);
        args[n++] = extra[i];
    }
    snprintf(endpoint, sizeof endpoint, "%s", zps_procs_start_server(ps, tag, pid, args, 10000));
    return endpoint;
}

static pid_t s_start_worker(zps_procs *ps, const char *endpoint, const char *tag, int i)
{
    char out[64], log[64];
    snprintf(out, sizeof out, "%s-w%d.bin", tag, i);
    snprintf(log, sizeof log, "%s-w%d.log", tag, i);
    const char *args[] = {"--coordinator", endpoint, "--save-params", zps_procs_path(ps, out),
                          "--cache-dir", ZPS_TEST_CACHE, "--timeout-ms", "30000", NULL};
    return zps_procs_start(ps, "zps-worker", log, args);
}

// Starts shard 1 of 2 beside shard 0 at ep (args: extra flags, NULL-ended).
static pid_t s_start_shard1(zps_procs *ps, const char *ep, const char *log, char *listen,
                            size_t len, const char *const *extra)
{
    if (!listen[0]) {
        snprintf(listen, len, "tcp://127.0.0.1:%d", zps_free_port());
    }
    const char *args[16] = {"--shard", "1", "--shards", "2", "--coordinator", ep, "--listen",
                            listen};
    size_t n = 8;
    for (size_t i = 0; extra[i]; i++) {
        ck_assert_uint_lt(n + 1, sizeof args / sizeof args[0]);
        args[n++] = extra[i];
    }
    args[n] = NULL;
    return zps_procs_start(ps, "zps-server", log, args);
}

// A job of shard 0 (the coordinator, with `flags`), shard 1 (with
// `shard1`, its log TAG-shard1.log) and `workers` workers, all started.
typedef struct s_two_shards {
    pid_t s0, s1, w[3];
    char ep[256];     // shard 0's endpoint
    char listen1[64]; // shard 1's, kept for a restart
} s_two_shards;

static void s_start_two_shards(zps_procs *ps, s_two_shards *j, const char *tag, int workers,
                               const char *steps, const char *const *flags,
                               const char *const *shard1)
{
    char count[12], log[64];
    ck_assert_int_le(workers, 3);
    snprintf(count, sizeof count, "%d", workers);
    snprintf(log, sizeof log, "%s-shard1.log", tag);
    *j = (s_two_shards){.s0 = -1};
    snprintf(j->ep, sizeof j->ep, "%s", s_start_server(ps, tag, &j->s0, count, steps, flags));
    j->s1 = s_start_shard1(ps, j->ep, log, j->listen1, sizeof j->listen1, shard1);
    for (int i = 0; i < workers; i++) {
        j->w[i] = s_start_worker(ps, j->ep, tag, i);
    }
}

// A whole run of `workers` workers; every process must succeed.
static void s_run(zps_procs *ps, const char *tag, int workers, const char *steps,
                  const char *const *extra)
{
    char count[8];
    snprintf(count, sizeof count, "%d", workers);
    pid_t server, w[8];
    const char *ep = s_start_server(ps, tag, &server, count, steps, extra);
    for (int i = 0; i < workers; i++) {
        w[i] = s_start_worker(ps, ep, tag, i);
    }
    for (int i = 0; i < workers; i++) {
        ck_assert_msg(zps_procs_wait(ps, w[i], RUN_TIMEOUT_MS) == 0, "%s: worker %d failed", tag,
                      i);
    }
    ck_assert_msg(zps_procs_wait(ps, server, 30000) == 0, "%s: the server failed", tag);
}

// The workers of a run hold the same bits, trained away from the start.
static void s_check_aligned(zps_procs *ps, const char *tag, int workers)
{
    size_t n = s_n_params();
    zps_model_spec spec;
    ck_assert_int_eq(zps_model_parse(MODEL, &spec), ZPS_OK);
    float *init = malloc(n * sizeof(float));
    ck_assert_ptr_nonnull(init);
    zps_model_init_params(&spec, 3, init);
    char name[64];
    snprintf(name, sizeof name, "%s-w0.bin", tag);
    float *w0 = zps_procs_load_params(ps, name, n);
    double moved = zps_max_abs_diff(w0, init, n);
    fprintf(stderr, "%s: max |final - initial| = %.3g\n", tag, moved);
    ck_assert_double_gt(moved, 1e-2);
    for (int i = 1; i < workers; i++) {
        snprintf(name, sizeof name, "%s-w%d.bin", tag, i);
        float *wi = zps_procs_load_params(ps, name, n);
        ck_assert_msg(memcmp(w0, wi, n * sizeof(float)) == 0, "%s: worker %d differs from 0",
                      tag, i);
        free(wi);
    }
    free(w0);
    free(init);
}

// Inner SGD at lr 0.05 without momentum, one inner step, outer SGD at lr 1
// without momentum: theta - 1 * mean(theta - (theta - 0.05 g_i)) is
// theta - 0.05 mean(g_i), synchronous SGD, but for the roundings of the
// subtractions. Per step and parameter the mode rounds twice at theta's
// precision where synchronous SGD rounds once (the worker's inner step
// lands on theta's grid, then the outer step does), so the two part by
// at most one ulp of theta a step: after T steps, at most
// T * 2^-23 * max|theta|, if the training does not amplify differences.
// A softmax regression (mlp:784-10, no ReLU) does not: its loss is smooth
// and convex, and at lr 0.05 a step contracts a difference. With ReLUs
// the bound is luck: a pre-activation that rounding moves across zero
// flips a unit's gradient for one sample, a jump of about
// lr / B * |delta| * |x| (measured: 3.4e-5 at step 23 of the 784-512-512-10
// model under OpenBLAS's Haswell kernels, 2.1e-7 over 40 steps without a
// flip under SkylakeX and Prescott); docs/tests.md has the figures.
#define SMOOTH_MODEL "mlp:784-10"
#define H1_STEPS 40

static double s_max_abs(const float *p, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        m = fabs(p[i]) > m ? fabs(p[i]) : m;
    }
    return m;
}

START_TEST(test_diloco_one_inner_step_equals_synchronous_sgd)
{
    zps_procs ps;
    zps_procs_init(&ps, "diloco-h1");
    static const char *const sync[] = {"--model", SMOOTH_MODEL, "--lr", "0.05", "--momentum",
                                       "0", NULL};
    static const char *const diloco[] = {"--model", SMOOTH_MODEL, "--lr", "0.05", "--momentum",
                                         "0", "--mode", "diloco", "--inner-steps", "1",
                                         "--outer-lr", "1", "--outer-momentum", "0", NULL};
    char steps[8];
    snprintf(steps, sizeof steps, "%d", H1_STEPS);
    s_run(&ps, "sync", 2, steps, sync);
    s_run(&ps, "h1", 2, steps, diloco);
    zps_model_spec spec;
    ck_assert_int_eq(zps_model_parse(SMOOTH_MODEL, &spec), ZPS_OK);
    size_t n = spec.n_params;
    float *init = malloc(n * sizeof(float));
    ck_assert_ptr_nonnull(init);
    zps_model_init_params(&spec, 3, init);
    float *a = zps_procs_load_params(&ps, "sync-w0.bin", n);
    float *b = zps_procs_load_params(&ps, "h1-w0.bin", n);
    float *b1 = zps_procs_load_params(&ps, "h1-w1.bin", n);
    double top = fmax(s_max_abs(init, n), s_max_abs(a, n));
    double bound = H1_STEPS * ldexp(top, -23);
    double d = zps_max_abs_diff(a, b, n);
    fprintf(stderr, "diloco H=1 against synchronous SGD after %d steps: max |diff| = %.3g "
                    "(bound: %d steps x 2^-23 x max|theta| %.3g = %.3g)\n",
            H1_STEPS, d, H1_STEPS, top, bound);
    ck_assert_double_gt(zps_max_abs_diff(a, init, n), 1e-2); // it trained
    ck_assert_msg(d <= bound, "H = 1 ends %.3g from synchronous SGD, beyond the rounding's %.3g",
                  d, bound);
    ck_assert_msg(memcmp(b, b1, n * sizeof(float)) == 0, "the diloco workers differ");
    free(a);
    free(b);
    free(b1);
    free(init);
    zps_procs_fini(&ps, false);
}
END_TEST

// Rounds of 4 inner steps of the default SGD with momentum (each worker's
// own buffer), the outer Nesterov step at its defaults.
static void s_check_rounds(const char *compress)
{
    zps_procs ps;
    zps_procs_init(&ps, "diloco-rounds");
    const char *const flags[] = {"--lr", "0.05", "--mode", "diloco", "--inner-steps", "4",
                                 "--compress", compress, NULL};
    s_run(&ps, compress, 3, "40", flags);
    s_check_aligned(&ps, compress, 3);
    zps_procs_fini(&ps, false);
}

START_TEST(test_diloco_workers_hold_the_same_bits_after_rounds_fp32)
{
    s_check_rounds("none");
}
END_TEST

START_TEST(test_diloco_workers_hold_the_same_bits_after_rounds_int8)
{
    s_check_rounds("int8");
}
END_TEST

START_TEST(test_diloco_workers_hold_the_same_bits_after_rounds_e3m0)
{
    s_check_rounds("e3m0");
}
END_TEST

static uint64_t s_step(const char *endpoint)
{
    zps_wire_msg m;
    zps_procs_status(endpoint, &m);
    uint64_t step = m.hdr->status->step;
    zps_wire_msg_fini(&m);
    return step;
}

START_TEST(test_diloco_worker_killed_mid_round_is_missing_and_run_completes)
{
    zps_procs ps;
    zps_procs_init(&ps, "diloco-kill");
    const char *const flags[] = {"--lr", "0.05", "--mode", "diloco", "--inner-steps", "20",
                                 "--compress", "int8", NULL};
    pid_t server, w[3];
    const char *ep = s_start_server(&ps, "kill", &server, "3", "400", flags);
    for (int i = 0; i < 3; i++) {
        w[i] = s_start_worker(&ps, ep, "kill", i);
    }
    zps_procs_wait_step(ep, 3, 60000);
    // Some inner steps into a round (a round takes 20 of them).
    struct timespec ts = {0, 50 * 1000000L};
    nanosleep(&ts, NULL);
    uint64_t killed_at = s_step(ep);
    ck_assert_int_eq(kill(w[1], SIGKILL), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, w[1], 5000), -1);
    ck_assert_int_eq(zps_procs_wait(&ps, w[0], RUN_TIMEOUT_MS), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, w[2], RUN_TIMEOUT_MS), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, server, 30000), 0);
    ck_assert_msg(zps_procs_log_has(&ps, "kill.log", "rank 1 (") &&
                      zps_procs_log_has(&ps, "kill.log", "left during its inner steps"),
                  "the server's log does not name the round and the missing worker");
    int missing = zps_procs_log_count(&ps, "kill-w0.log", "is missing from the round") +
                  zps_procs_log_count(&ps, "kill-w2.log", "is missing from the round");
    fprintf(stderr, "killed rank 1 after round %llu: its slice pushed as missing %d times\n",
            (unsigned long long)killed_at, missing);
    ck_assert_int_ge(missing, 1);
    // The survivors took the same outer steps.
    size_t n = s_n_params();
    ck_assert_double_eq(zps_procs_params_diff(&ps, "kill-w0.bin", "kill-w2.bin", n), 0);
    zps_procs_fini(&ps, false);
}
END_TEST

// A worker joining a running job starts from the current round's
// parameters, the last outer step, and ends with the others' bits.
START_TEST(test_diloco_joining_worker_starts_from_the_current_round)
{
    zps_procs ps;
    zps_procs_init(&ps, "diloco-join");
    const char *const flags[] = {"--lr", "0.05", "--mode", "diloco", "--inner-steps", "10",
                                 "--compress", "int8", NULL};
    pid_t server, w[3];
    const char *ep = s_start_server(&ps, "join", &server, "2", "400", flags);
    for (int i = 0; i < 2; i++) {
        w[i] = s_start_worker(&ps, ep, "join", i);
    }
    zps_procs_wait_step(ep, 3, 60000);
    // The rounds' figures, as zps-ctl status and top show them.
    zps_wire_msg m;
    zps_procs_status(ep, &m);
    const Zps__Member *first = m.hdr->status->members[0];
    fprintf(stderr, "round %llu, rank 0: %u inner steps, |delta| %.4g, %llu bytes\n",
            (unsigned long long)m.hdr->status->step, first->inner_steps,
            (double)first->delta_norm, (unsigned long long)first->round_bytes);
    ck_assert_uint_eq(first->inner_steps, 10);
    ck_assert_float_gt(first->delta_norm, 0);
    ck_assert_uint_gt(first->round_bytes, 0);
    ck_assert_uint_lt(first->round_bytes, s_n_params() * sizeof(float) / 3); // int8
    zps_wire_msg_fini(&m);
    w[2] = s_start_worker(&ps, ep, "join", 2);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(zps_procs_wait(&ps, w[i], RUN_TIMEOUT_MS), 0);
    }
    ck_assert_int_eq(zps_procs_wait(&ps, server, 30000), 0);
    ck_assert_msg(!zps_procs_log_has(&ps, "join-w2.log", "from step 0,"),
                  "the joiner started from round 0");
    s_check_aligned(&ps, "join", 3);
    zps_procs_fini(&ps, false);
}
END_TEST

// Shard 1 killed and restarted from its checkpoint: the job goes back to
// that round's outer step (parameters and outer momentum) and trains the
// rounds again. With a stateless inner optimizer (SGD without momentum) and
// fp32 pushes the replay gives the same bits as a run never interrupted.
START_TEST(test_diloco_shard_restarted_from_checkpoint_goes_back_to_its_round)
{
    zps_procs ps;
    zps_procs_init(&ps, "diloco-restart");
    const char *const flags[] = {"--lr", "0.05", "--momentum", "0", "--mode", "diloco",
                                 "--inner-steps", "5", NULL};
    s_run(&ps, "ref", 2, "100", flags);
    char ck0[512], ck1[512], shard1[64];
    snprintf(ck0, sizeof ck0, "%s", zps_procs_path(&ps, "ck0"));
    snprintf(ck1, sizeof ck1, "%s", zps_procs_path(&ps, "ck1"));
    snprintf(shard1, sizeof shard1, "tcp://127.0.0.1:%d", zps_free_port());
    const char *const more[] = {"--lr", "0.05", "--momentum", "0", "--mode", "diloco",
                                "--inner-steps", "5", "--shards", "2", "--checkpoint-every",
                                "4", "--checkpoint-dir", ck0, "--worker-timeout-ms", "30000",
                                NULL};
    const char *const first[] = {"--checkpoint-dir", ck1, NULL};
    const char *const again[] = {"--checkpoint-dir", ck1, "--resume", NULL};
    pid_t s0, s1, w[2];
    char ep[256];
    snprintf(ep, sizeof ep, "%s", s_start_server(&ps, "restart", &s0, "2", "100", more));
    s1 = s_start_shard1(&ps, ep, "shard1.log", shard1, sizeof shard1, first);
    for (int i = 0; i < 2; i++) {
        w[i] = s_start_worker(&ps, ep, "restart", i);
    }
    zps_procs_wait_step(ep, 10, 60000);
    ck_assert_int_eq(kill(s1, SIGKILL), 0);
    zps_procs_wait(&ps, s1, 5000);
    s1 = s_start_shard1(&ps, ep, "shard1.log", shard1, sizeof shard1, again);
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(zps_procs_wait(&ps, w[i], RUN_TIMEOUT_MS), 0);
    }
    ck_assert_int_eq(zps_procs_wait(&ps, s1, 30000), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, s0, 30000), 0);
    ck_assert_msg(zps_procs_log_has(&ps, "restart.log", "rolls back to it"), "no rollback");
    size_t n = s_n_params();
    double d = zps_procs_params_diff(&ps, "ref-w0.bin", "restart-w0.bin", n);
    fprintf(stderr, "diloco with shard 1 restarted at round 10: max |uninterrupted - run| = %.3g\n",
            d);
    ck_assert_double_eq(d, 0);
    s_check_aligned(&ps, "restart", 2);
    zps_procs_fini(&ps, false);
}
END_TEST

// Rounds of 4 global batches over epochs of 10 (synthetic:960, batch 96):
// epochs end inside rounds 2, 4 and 7, and each is evaluated once, as the
// epoch that ended; the last round evaluates the epoch in progress.
START_TEST(test_diloco_every_epoch_is_evaluated_when_rounds_straddle_epochs)
{
    zps_procs ps;
    zps_procs_init(&ps, "diloco-epochs");
    const char *const flags[] = {"--mode", "diloco", "--inner-steps", "4", "--dataset",
                                 "synthetic:960", NULL};
    s_run(&ps, "epochs", 2, "40", flags);
    for (int e = 0; e < 4; e++) {
        char want[48];
        snprintf(want, sizeof want, "{\"epoch\":%d,\"test_accuracy\"", e);
        ck_assert_msg(zps_procs_log_count(&ps, "epochs-metrics.jsonl", want) == 1,
                      "epoch %d is not evaluated once", e);
    }
    ck_assert_int_eq(zps_procs_log_count(&ps, "epochs-metrics.jsonl", "test_accuracy"), 4);
    zps_procs_fini(&ps, false);
}
END_TEST

// The inner steps of `rank` in the last round of a metrics log, or -1.
static int s_last_inner_steps(zps_procs *ps, const char *metrics, uint32_t rank)
{
    json_t *log = zps_procs_mlog(ps, metrics);
    int found = -1;
    size_t i;
    json_t *rec;
    json_array_foreach(log, i, rec)
    {
        json_t *w = zps_mlog_worker(rec, (int)rank);
        if (json_is_integer(json_object_get(w, "inner_steps"))) {
            found = (int)zps_mlog_num(w, "inner_steps");
        }
    }
    json_decref(log);
    return found;
}

// --inner-steps auto: a worker slowed 3x takes about a third of the inner
// steps of the fast one, which takes H; both end with the same bits. The
// slowdown is a pause of 2x the worker's quiet compute time; two workers
// sharing 2 cores with the server compute slower than that, and the pause
// stays, so the measured ratio falls from 3 towards 1.5 as the load
// grows (2 x load: 2, H_i 5): the bound takes 2 to 7.
START_TEST(test_diloco_auto_gives_a_worker_slowed_3x_fewer_inner_steps)
{
    zps_procs ps;
    zps_procs_init(&ps, "diloco-auto");
    const char *const flags[] = {"--lr", "0.05", "--mode", "diloco", "--inner-steps", "auto:10",
                                 NULL};
    pid_t server, w[2];
    const char *ep = s_start_server(&ps, "auto", &server, "2", "400", flags);
    w[0] = s_start_worker(&ps, ep, "auto", 0);
    char out[64];
    snprintf(out, sizeof out, "%s", zps_procs_path(&ps, "auto-w1.bin"));
    const char *slow[] = {"--coordinator", ep, "--save-params", out, "--cache-dir",
                          ZPS_TEST_CACHE, "--timeout-ms", "30000", "--slowdown", "3", NULL};
    w[1] = zps_procs_start(&ps, "zps-worker", "auto-w1.log", slow);
    // Which rank the slowed process is.
    double deadline = zps_clock_ms() + 60000;
    uint32_t slow_rank = UINT32_MAX;
    while (slow_rank == UINT32_MAX) {
        ck_assert_msg(zps_clock_ms() < deadline, "the job did not start within 60 s");
        zps_wire_msg m;
        zps_procs_status(ep, &m);
        for (size_t i = 0; i < m.hdr->status->n_members; i++) {
            if (m.hdr->status->members[i]->pid == (uint32_t)w[1]) {
                slow_rank = m.hdr->status->members[i]->rank;
            }
        }
        zps_wire_msg_fini(&m);
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(zps_procs_wait(&ps, w[i], RUN_TIMEOUT_MS), 0);
    }
    ck_assert_int_eq(zps_procs_wait(&ps, server, 30000), 0);
    int slow_h = s_last_inner_steps(&ps, "auto-metrics.jsonl", slow_rank);
    int fast_h = s_last_inner_steps(&ps, "auto-metrics.jsonl", 1 - slow_rank);
    fprintf(stderr, "inner steps auto:10 in the last round: slowed 3x %d, the other %d\n", slow_h,
            fast_h);
    ck_assert_int_eq(fast_h, 10);
    ck_assert_msg(slow_h >= 2 && slow_h <= 7, "the slowed worker took %d inner steps", slow_h);
    ck_assert(zps_procs_log_has(&ps, "auto.log", "inner steps auto: rank"));
    s_check_aligned(&ps, "auto", 2);
    zps_procs_fini(&ps, false);
}
END_TEST

// --fragments 1 is plain DiLoCo: the same bits as a run without the flag.
START_TEST(test_diloco_one_fragment_is_plain_diloco_bitwise)
{
    zps_procs ps;
    zps_procs_init(&ps, "diloco-f1");
    const char *const plain[] = {"--lr", "0.05", "--mode", "diloco", "--inner-steps", "4",
                                 "--compress", "int8", NULL};
    const char *const one[] = {"--lr", "0.05", "--mode", "diloco", "--inner-steps", "4",
                               "--compress", "int8", "--fragments", "1", NULL};
    s_run(&ps, "plain", 2, "40", plain);
    s_run(&ps, "one", 2, "40", one);
    s_check_aligned(&ps, "one", 2);
    ck_assert_double_eq(zps_procs_params_diff(&ps, "plain-w0.bin", "one-w0.bin", s_n_params()),
                        0);
    ck_assert(!zps_procs_log_has(&ps, "one-metrics.jsonl", "\"fragment\""));
    zps_procs_fini(&ps, false);
}
END_TEST

// Checks the metrics log of a run of `steps` steps with F fragments: each
// step's every worker row carries fragment step mod F, so each round of F
// steps exchanged every fragment once, in offset order, each row about
// 1/F of the bytes of the whole model (int8: 1 byte an element, plus the
// scales).
static void s_check_fragment_rows(zps_procs *ps, const char *metrics, uint64_t steps, int f,
                                  int workers)
{
    json_t *log = zps_procs_mlog(ps, metrics);
    uint64_t rows = 0, seen = 0, next = 0;
    size_t i;
    json_t *rec;
    json_array_foreach(log, i, rec)
    {
        uint64_t step;
        if (!zps_mlog_step(rec, &step)) {
            continue;
        }
        ck_assert_uint_eq(step, next++); // every step, in order
        for (int r = 0; r < workers; r++) {
            json_t *w = zps_mlog_worker(rec, r);
            ck_assert_msg(w && json_is_integer(json_object_get(w, "fragment")),
                          "step %llu: no fragment for rank %d", (unsigned long long)step, r);
            ck_assert_uint_eq((uint64_t)zps_mlog_num(w, "fragment"), step % (uint64_t)f);
            double bytes = zps_mlog_num(w, "bytes");
            ck_assert_msg(bytes > 0.9 * (double)s_n_params() / f &&
                              bytes < 1.1 * (double)s_n_params() / f,
                          "step %llu: %.0f bytes pushed", (unsigned long long)step, bytes);
            rows++;
        }
        seen++;
    }
    json_decref(log);
    ck_assert_uint_eq(seen, steps);
    ck_assert_uint_eq(rows, steps * (uint64_t)workers);
}

// --fragments 4 over 2 shards, rounds of 8 inner steps in int8: a step is
// 2 inner steps and exchanges one fragment (a quarter of each shard's
// range), each fragment once per round in order; the workers end with the
// same bits, the global parameters, and these are not plain DiLoCo's.
START_TEST(test_diloco_four_fragments_are_exchanged_once_a_round_in_order)
{
    zps_procs ps;
    zps_procs_init(&ps, "diloco-f4");
    const char *const flags[] = {"--lr", "0.05", "--mode", "diloco", "--inner-steps", "8",
                                 "--compress", "int8", "--fragments", "4", "--shards", "2",
                                 NULL};
    const char *const none[] = {NULL};
    pid_t s0, s1, w[2];
    char ep[256], shard1[64] = "";
    snprintf(ep, sizeof ep, "%s", s_start_server(&ps, "f4", &s0, "2", "64", flags));
    s1 = s_start_shard1(&ps, ep, "f4-shard1.log", shard1, sizeof shard1, none);
    for (int i = 0; i < 2; i++) {
        w[i] = s_start_worker(&ps, ep, "f4", i);
    }
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(zps_procs_wait(&ps, w[i], RUN_TIMEOUT_MS), 0);
    }
    ck_assert_int_eq(zps_procs_wait(&ps, s1, 30000), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, s0, 30000), 0);
    s_check_fragment_rows(&ps, "f4-metrics.jsonl", 32, 4, 2);
    s_check_aligned(&ps, "f4", 2);
    const char *const plain[] = {"--lr", "0.05", "--mode", "diloco", "--inner-steps", "8",
                                 "--compress", "int8", NULL};
    s_run(&ps, "plain", 2, "64", plain);
    double d = zps_procs_params_diff(&ps, "plain-w0.bin", "f4-w0.bin", s_n_params());
    fprintf(stderr, "4 fragments against plain diloco after 8 rounds: max |diff| = %.3g\n", d);
    ck_assert_double_gt(d, 0);
    zps_procs_fini(&ps, false);
}
END_TEST

// The largest merge delay a worker's log reports (--overlap), and its bound.
static int s_worst_delay(zps_procs *ps, const char *log, int *bound)
{
    FILE *f = fopen(zps_procs_path(ps, log), "r");
    ck_assert_ptr_nonnull(f);
    char line[1024];
    int worst = -1;
    while (fgets(line, sizeof line, f)) {
        const char *at = strstr(line, "fragment merged ");
        int d, b;
        if (at && sscanf(at, "fragment merged %d inner steps after its push, the most so far "
                              "(bound %d)", &d, &b) == 2) {
            worst = d > worst ? d : worst;
            *bound = b;
        }
    }
    fclose(f);
    return worst;
}

// --overlap with 4 fragments of a round of 10 (steps of 2, 3, 2, 3 inner
// steps) over 2 shards: each fragment's new values are merged one step
// after its push, so a merge comes 2 or 3 inner steps late and never more
// than ceil(10 / 4) = 3; every fragment still goes out once a round in
// order, and the workers end on the same bits.
START_TEST(test_diloco_overlap_merges_within_its_bound_and_workers_agree)
{
    zps_procs ps;
    zps_procs_init(&ps, "diloco-overlap");
    const char *const flags[] = {"--lr", "0.05", "--mode", "diloco", "--inner-steps", "10",
                                 "--compress", "int8", "--fragments", "4", "--overlap",
                                 "--shards", "2", NULL};
    const char *const none[] = {NULL};
    s_two_shards j;
    s_start_two_shards(&ps, &j, "ov", 2, "80", flags, none);
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(zps_procs_wait(&ps, j.w[i], RUN_TIMEOUT_MS), 0);
    }
    ck_assert_int_eq(zps_procs_wait(&ps, j.s1, 30000), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, j.s0, 30000), 0);
    s_check_fragment_rows(&ps, "ov-metrics.jsonl", 32, 4, 2);
    s_check_aligned(&ps, "ov", 2);
    for (int i = 0; i < 2; i++) {
        char log[32];
        snprintf(log, sizeof log, "ov-w%d.log", i);
        int bound = 0, worst = s_worst_delay(&ps, log, &bound);
        fprintf(stderr, "overlap: worker %d merged at worst %d inner steps late (bound %d)\n", i,
                worst, bound);
        ck_assert_int_eq(bound, 3);
        ck_assert_msg(worst >= 2 && worst <= bound, "worker %d: delay %d", i, worst);
    }
    zps_procs_fini(&ps, false);
}
END_TEST

// --overlap through failures: a worker SIGKILLed in the middle of the run
// and shard 1 killed and restarted from its checkpoint; the run completes
// and the survivors end on the same bits.
START_TEST(test_diloco_overlap_survives_a_killed_worker_and_a_restarted_shard)
{
    zps_procs ps;
    zps_procs_init(&ps, "diloco-overlap-fail");
    char ck0[512], ck1[512];
    snprintf(ck0, sizeof ck0, "%s", zps_procs_path(&ps, "ck0"));
    snprintf(ck1, sizeof ck1, "%s", zps_procs_path(&ps, "ck1"));
    const char *const flags[] = {"--lr", "0.05", "--mode", "diloco", "--inner-steps", "8",
                                 "--fragments", "4", "--overlap", "--shards", "2",
                                 "--checkpoint-every", "4", "--checkpoint-dir", ck0, NULL};
    const char *const first[] = {"--checkpoint-dir", ck1, NULL};
    const char *const again[] = {"--checkpoint-dir", ck1, "--resume", NULL};
    s_two_shards j;
    s_start_two_shards(&ps, &j, "ovf", 3, "480", flags, first);
    zps_procs_wait_step(j.ep, 12, 60000);
    ck_assert_int_eq(kill(j.w[1], SIGKILL), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, j.w[1], 5000), -1);
    zps_procs_wait_step(j.ep, 40, 60000);
    ck_assert_int_eq(kill(j.s1, SIGKILL), 0);
    zps_procs_wait(&ps, j.s1, 5000);
    j.s1 = s_start_shard1(&ps, j.ep, "ovf-shard1.log", j.listen1, sizeof j.listen1, again);
    ck_assert_int_eq(zps_procs_wait(&ps, j.w[0], RUN_TIMEOUT_MS), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, j.w[2], RUN_TIMEOUT_MS), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, j.s1, 30000), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, j.s0, 30000), 0);
    ck_assert_msg(zps_procs_log_has(&ps, "ovf.log", "rolls back to it"), "no rollback");
    ck_assert_double_eq(zps_procs_params_diff(&ps, "ovf-w0.bin", "ovf-w2.bin", s_n_params()), 0);
    zps_procs_fini(&ps, false);
}
END_TEST

// --overlap, a member killed while shard 1 is held (SIGSTOP): shard 0 is
// at step t, shard 1 still at t - 1, so its slices of both steps are
// handed to the survivor while the survivor waits for step t's owed
// parameters, before its push of t. It pushes both as missing, the one of
// t once the shards are at t, and the run completes.
START_TEST(test_diloco_overlap_a_member_lost_between_shards_hands_both_steps_to_a_waiting_worker)
{
    zps_procs ps;
    zps_procs_init(&ps, "diloco-overlap-held");
    const char *const flags[] = {"--lr", "0.05", "--mode", "diloco", "--inner-steps", "8",
                                 "--fragments", "4", "--overlap", "--shards", "2", NULL};
    const char *const none[] = {NULL};
    s_two_shards j;
    s_start_two_shards(&ps, &j, "held", 2, "160", flags, none);
    zps_procs_wait_step(j.ep, 8, 60000);
    ck_assert_int_eq(kill(j.s1, SIGSTOP), 0);
    // Both workers push the step and block in the wait for the next one's
    // parameters, which shard 1 holds back.
    struct timespec ts = {1, 0};
    nanosleep(&ts, NULL);
    ck_assert_int_eq(kill(j.w[1], SIGKILL), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, j.w[1], 5000), -1);
    // Evicted after 3 s of silence (--worker-timeout-ms 3000).
    zps_procs_wait_log(&ps, "held.log", "evicted rank", 15000);
    ts.tv_sec = 1;
    nanosleep(&ts, NULL);
    ck_assert_int_eq(kill(j.s1, SIGCONT), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, j.w[0], RUN_TIMEOUT_MS), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, j.s1, 30000), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, j.s0, 30000), 0);
    int missing = zps_procs_log_count(&ps, "held-w0.log", "is missing from the round");
    fprintf(stderr, "held: the killed worker's slices pushed as missing %d times\n", missing);
    ck_assert_int_ge(missing, 2);
    zps_procs_fini(&ps, false);
}
END_TEST

// --fragments more than --inner-steps: refused before anything starts.
START_TEST(test_diloco_more_fragments_than_inner_steps_are_refused)
{
    zps_procs ps;
    zps_procs_init(&ps, "diloco-f3");
    const char *args[] = {"--listen", "tcp://127.0.0.1:0", "--workers", "1", "--mode", "diloco",
                          "--inner-steps", "2", "--fragments", "3", NULL};
    pid_t p = zps_procs_start(&ps, "zps-server", "f3.log", args);
    ck_assert_int_eq(zps_procs_wait(&ps, p, 10000), 2);
    ck_assert(zps_procs_log_has(&ps, "f3.log", "--fragments 3: more than --inner-steps 2"));
    zps_procs_fini(&ps, false);
}
END_TEST

Suite *zps_suite_diloco(void)
{
    Suite *s = suite_create("diloco");
    TCase *tc = tcase_create("diloco");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_diloco_one_inner_step_equals_synchronous_sgd);
    tcase_add_test(tc, test_diloco_workers_hold_the_same_bits_after_rounds_fp32);
    tcase_add_test(tc, test_diloco_workers_hold_the_same_bits_after_rounds_int8);
    tcase_add_test(tc, test_diloco_workers_hold_the_same_bits_after_rounds_e3m0);
    tcase_add_test(tc, test_diloco_worker_killed_mid_round_is_missing_and_run_completes);
    tcase_add_test(tc, test_diloco_auto_gives_a_worker_slowed_3x_fewer_inner_steps);
    tcase_add_test(tc, test_diloco_shard_restarted_from_checkpoint_goes_back_to_its_round);
    tcase_add_test(tc, test_diloco_joining_worker_starts_from_the_current_round);
    tcase_add_test(tc, test_diloco_every_epoch_is_evaluated_when_rounds_straddle_epochs);
    tcase_add_test(tc, test_diloco_one_fragment_is_plain_diloco_bitwise);
    tcase_add_test(tc, test_diloco_four_fragments_are_exchanged_once_a_round_in_order);
    tcase_add_test(tc, test_diloco_more_fragments_than_inner_steps_are_refused);
    tcase_add_test(tc, test_diloco_overlap_merges_within_its_bound_and_workers_agree);
    tcase_add_test(tc, test_diloco_overlap_survives_a_killed_worker_and_a_restarted_shard);
    tcase_add_test(tc,
                   test_diloco_overlap_a_member_lost_between_shards_hands_both_steps_to_a_waiting_worker);
    suite_add_tcase(s, tc);
    return s;
}
