/* check_deterministic_runs.c - whole runs of a --deterministic job end with
 * the same bits whatever computes them (issue 29): the default model on
 * Fashion-MNIST, B = 64 in micro-batches of 8, trained by one worker, by
 * two of shares 24 + 40, by three under --adaptive-split and
 * --speculate-after 1 with one slowed 2x, by three of which one is
 * SIGKILLed and a new one joins, on 1 and 3 shards with a shard SIGKILLed
 * and resumed: every parameter file saved is cmp-equal to the first.
 *
 * The default mode could not pass this past ~100 steps (a last-bit
 * difference of summation order grows, docs/deterministic.md): make test
 * runs 150 steps of each case, make test-long 2 full epochs (1874 steps).
 * Real processes on loopback; every wait bounded; every process killed by
 * pid at the end. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_clock.h"
#include "common/zps_model.h"
#include "common/zps_wire.h"
#include "zps_integration.h"
#include "zps_proc.h"

#define MODEL "mlp:784-512-512-10"
#define MAX_W 4
#define MAX_S 3

// What happens to one run of the job.
typedef struct scenario {
    const char *tag;
    int workers;                   // started at once (--workers)
    const char *share[MAX_W];      // each one's --share (NULL: the coordinator's split)
    int shards;                    // 1 or 3
    const char *server_flags[6];   // more of shard 0's flags, NULL-terminated
    int slow;                      // index of a worker slowed 2x (-1: none)
    int kill_worker;               // index SIGKILLed at kill_at, a new one joining (-1)
    int kill_shard;                // shard SIGKILLed at kill_at and resumed (-1)
    uint64_t kill_at;              // step
    // Proof that it happened: a line of log <tag>-<log>.log holding `said`.
    const char *log, *said;
} scenario;

// The run's length: "--steps 150" (make test) or "--epochs 2" (test-long).
typedef struct length {
    const char *flag, *value;
    uint64_t steps;
} length;

typedef struct run {
    zps_procs *ps;
    const scenario *sc;
    const length *len;
    char listen[MAX_S][64];        // fixed addresses, for a restart
    char ck[MAX_S][512];           // checkpoint directories
    char ep[256];
    pid_t shard[MAX_S];
    pid_t w[MAX_W + 1];
    bool killed[MAX_W + 1];
    int n_w;
} run;

static void s_push(const char **args, int *n, const char *a)
{
    ck_assert_int_lt(*n, 62);
    args[(*n)++] = a;
    args[*n] = NULL;
}

// Shard i of the run, resumed or not.
static void s_start_shard(run *r, int i, bool resume)
{
    const scenario *sc = r->sc;
    const char *args[64];
    int n = 0;
    char idx[8], shards[8], tag[32];
    snprintf(idx, sizeof idx, "%d", i);
    snprintf(shards, sizeof shards, "%d", sc->shards);
    snprintf(tag, sizeof tag, "%s-shard%d%s", sc->tag, i, resume ? "-again" : "");
    // zps_procs_start_server logs to <tag>.log
    const char *common[] = {"--shard", idx, "--shards", shards, "--listen", r->listen[i],
                            "--checkpoint-dir", r->ck[i], NULL};
    for (int k = 0; common[k]; k++) {
        s_push(args, &n, common[k]);
    }
    if (i == 0) {
        const char *job[] = {"--workers", NULL, "--global-batch", "64", "--model", MODEL,
                             "--seed", "5", "--lr", "0.05", r->len->flag, r->len->value,
                             "--deterministic", "--micro-batch", "8",
                             "--checkpoint-every", "50", "--worker-timeout-ms", "1000", NULL};
        char workers[8];
        snprintf(workers, sizeof workers, "%d", sc->workers);
        job[1] = workers;
        for (int k = 0; k < (int)(sizeof job / sizeof job[0]) - 1; k++) {
            s_push(args, &n, job[k]);
        }
        for (int k = 0; sc->server_flags[k]; k++) {
            s_push(args, &n, sc->server_flags[k]);
        }
    } else {
        s_push(args, &n, "--coordinator");
        s_push(args, &n, r->ep);
    }
    if (resume) {
        s_push(args, &n, "--resume");
    }
    const char *ep = zps_procs_start_server(r->ps, tag, &r->shard[i], args, 10000);
    if (i == 0) {
        snprintf(r->ep, sizeof r->ep, "%s", ep);
    }
}

// Worker slot k, its parameters to <tag>-w<k>.bin.
static void s_start_worker(run *r, int k)
{
    const scenario *sc = r->sc;
    char out[64], log[64];
    snprintf(out, sizeof out, "%s-w%d.bin", sc->tag, k);
    snprintf(log, sizeof log, "%s-w%d.log", sc->tag, k);
    const char *args[64] = {"--coordinator", r->ep, "--save-params", zps_procs_path(r->ps, out),
                            "--cache-dir", ZPS_TEST_CACHE, "--heartbeat-ms", "100",
                            "--timeout-ms", "60000", NULL};
    int n = 10;
    if (k < MAX_W && sc->share[k]) {
        s_push(args, &n, "--share");
        s_push(args, &n, sc->share[k]);
    }
    if (k == sc->slow) {
        s_push(args, &n, "--slowdown");
        s_push(args, &n, "2");
    }
    r->w[k] = zps_procs_start(r->ps, "zps-worker", log, args);
    r->n_w = k + 1 > r->n_w ? k + 1 : r->n_w;
}

// The failure of the scenario, at its step.
static void s_disturb(run *r)
{
    const scenario *sc = r->sc;
    if (sc->kill_worker < 0 && sc->kill_shard < 0) {
        return;
    }
    (void)zps_procs_wait_step(r->ep, sc->kill_at, 120000);
    if (sc->kill_worker >= 0) {
        ck_assert_int_eq(kill(r->w[sc->kill_worker], SIGKILL), 0);
        (void)zps_procs_wait(r->ps, r->w[sc->kill_worker], 5000);
        r->killed[sc->kill_worker] = true;
        s_start_worker(r, sc->workers); // a new one joins
    }
    if (sc->kill_shard >= 0) {
        int i = sc->kill_shard;
        ck_assert_int_eq(kill(r->shard[i], SIGKILL), 0);
        (void)zps_procs_wait(r->ps, r->shard[i], 5000);
        s_start_shard(r, i, true);
    }
    fprintf(stderr, "%s: %s killed at step %llu\n", sc->tag,
            sc->kill_worker >= 0 ? "a worker" : "a shard", (unsigned long long)sc->kill_at);
}

// Runs the scenario to its end; every surviving worker saved its parameters.
static void s_run(zps_procs *ps, const scenario *sc, const length *len)
{
    run r = {.ps = ps, .sc = sc, .len = len};
    for (int i = 0; i < sc->shards; i++) {
        snprintf(r.listen[i], sizeof r.listen[i], "tcp://127.0.0.1:%d", zps_free_port());
        char name[64];
        snprintf(name, sizeof name, "%s-ck%d", sc->tag, i);
        snprintf(r.ck[i], sizeof r.ck[i], "%s", zps_procs_path(ps, name));
    }
    for (int i = 0; i < sc->shards; i++) {
        s_start_shard(&r, i, false);
    }
    for (int k = 0; k < sc->workers; k++) {
        s_start_worker(&r, k);
    }
    double t0 = zps_clock_ms();
    s_disturb(&r);
    int bound = (int)(len->steps * 200 + 60000); // 200 ms a step: far above any machine here
    for (int k = 0; k < r.n_w; k++) {
        if (!r.killed[k]) {
            ck_assert_msg(zps_procs_wait(ps, r.w[k], bound) == 0, "%s: worker %d failed; see %s",
                          sc->tag, k, ps->dir);
        }
    }
    for (int i = sc->shards - 1; i >= 0; i--) {
        ck_assert_int_eq(zps_procs_wait(ps, r.shard[i], 30000), 0);
    }
    fprintf(stderr, "%s: %llu steps in %.1f s\n", sc->tag, (unsigned long long)len->steps,
            (zps_clock_ms() - t0) / 1e3);
    if (sc->log) {
        char log[64];
        snprintf(log, sizeof log, "%s-%s.log", sc->tag, sc->log);
        ck_assert_msg(zps_procs_log_has(ps, log, sc->said), "%s: no '%s' in %s", sc->tag,
                      sc->said, log);
    }
}

// Every file a scenario's survivors saved is the reference's, bit for bit.
static void s_check_same(zps_procs *ps, const scenario *sc, const float *ref, size_t n)
{
    int checked = 0;
    for (int k = 0; k <= sc->workers; k++) {
        char name[64];
        snprintf(name, sizeof name, "%s-w%d.bin", sc->tag, k);
        float *p = NULL;
        size_t np = zps_read_floats(zps_procs_path(ps, name), &p);
        if (np == 0) {
            ck_assert_msg(k == sc->kill_worker || k == sc->workers, "%s: no parameters", name);
            continue;
        }
        ck_assert_uint_eq(np, n);
        double d = zps_max_abs_diff(p, ref, n);
        bool same = memcmp(p, ref, n * sizeof(float)) == 0;
        fprintf(stderr, "%s: %s the one-worker run (max |diff| %.3g)\n", name,
                same ? "bitwise equal to" : "DIFFERS from", d);
        ck_assert_msg(same, "%s differs from the one-worker run by up to %.3g", name, d);
        free(p);
        checked++;
    }
    ck_assert_int_ge(checked, 1);
}

static size_t s_n_params(void)
{
    zps_model_spec spec;
    ck_assert_int_eq(zps_model_parse(MODEL, &spec), ZPS_OK);
    return spec.n_params;
}

#define NONE -1
static const scenario s_one = {"one", 1, {NULL}, 1, {NULL}, NONE, NONE, NONE, 0, NULL, NULL};
static const scenario s_scenarios[] = {
    {"uneven", 2, {"24", "40"}, 1, {NULL}, NONE, NONE, NONE, 0, NULL, NULL},
    {"adaptive", 3, {NULL}, 1, {"--adaptive-split", "--speculate-after", "1", NULL}, 2, NONE,
     NONE, 0, "shard0", "adaptive split: predicted step"},
    {"churn", 3, {NULL}, 1, {NULL}, NONE, 1, NONE, 40, "shard0", "evicted rank"},
    // Checkpoints every 50 steps: killed at 70, the job rolls back to 50.
    {"coordinator", 2, {NULL}, 1, {NULL}, NONE, NONE, 0, 70, "shard0-again",
     "resumed at step 50"},
    {"shard", 2, {NULL}, 3, {NULL}, NONE, NONE, 2, 70, "shard2-again", "restored step 50"},
};

// The reference (one worker), then each scenario against it.
static void s_all(const length *len)
{
    zps_procs ps;
    zps_procs_init(&ps, "deterministic");
    size_t n = s_n_params();
    s_run(&ps, &s_one, len);
    float *ref = zps_procs_load_params(&ps, "one-w0.bin", n);
    for (size_t i = 0; i < sizeof s_scenarios / sizeof s_scenarios[0]; i++) {
        s_run(&ps, &s_scenarios[i], len);
        s_check_same(&ps, &s_scenarios[i], ref, n);
    }
    free(ref);
    zps_procs_fini(&ps, false);
}

START_TEST(test_deterministic_runs_150_steps_are_the_same_bits_for_every_scenario)
{
    static const length len = {"--steps", "150", 150};
    s_all(&len);
}
END_TEST

START_TEST(test_deterministic_runs_two_epochs_are_the_same_bits_for_every_scenario)
{
    static const length len = {"--epochs", "2", 2 * (60000 / 64)};
    s_all(&len);
}
END_TEST

Suite *zps_suite_deterministic_runs(void)
{
    Suite *s = suite_create("deterministic_runs");
    TCase *tc = tcase_create("short");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_deterministic_runs_150_steps_are_the_same_bits_for_every_scenario);
    suite_add_tcase(s, tc);
    TCase *epochs = tcase_create("epochs");
    tcase_set_tags(epochs, "long compute lane3"); // make test-long: minutes, a lane of its own
    tcase_set_timeout(epochs, 3600);
    tcase_add_test(epochs, test_deterministic_runs_two_epochs_are_the_same_bits_for_every_scenario);
    suite_add_tcase(s, epochs);
    return s;
}
