/* check_host.c - one push per host (docs/choices.md): two hosts of two
 * workers, a shard on each, the hosts told apart by ZPS_BOOT_ID (the
 * processes run on one kernel; network namespaces would need root). A
 * deterministic job ends with the same bits whether the hosts' leaders
 * push for their followers or every worker pushes itself, and the leaders
 * send fewer bytes than the workers did; a synchronous job ends within
 * round-off of the same job without aggregation, and with the same bits
 * whether the followers' parts reach the leader in shared memory, as
 * frames, or in shared memory a leader refuses; a leader SIGKILLed
 * mid-run: the job completes and the survivors hold the same bits; a step
 * slow for another host's reason does not make a follower whose part its
 * leader took push for itself, nor does a leader slow at a step 0 whose
 * parameters came late; a follower whose leader was not there at its
 * first part pushes through it once it is, and one that asked a stopped
 * leader about its part, left to it, through it again at the next step;
 * with --wire-code zstd (pushes and answers coded) a job ends with the
 * bits of the same job uncoded, and the flag refuses a rounded wire.
 * Real processes on loopback, every wait bounded, killed by pid at the
 * end. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/zps_model.h"
#include "zps_integration.h"
#include "zps_proc.h"

#define RUN_TIMEOUT_MS 120000
#define MODEL "mlp:784-64-10"
#define WORKERS 4
#define TANH_MLP_PARAMS 2372 // examples/tanh_mlp.c's model: 64 x 32 + 64 + 4 x 64 + 4

// One run of the job: its name, whether the leaders aggregate, whether it
// is deterministic, its steps.
typedef struct run {
    const char *tag;
    bool aggregate;
    bool deterministic;
    const char *steps;
    const char *stall_ms[WORKERS]; // worker k pauses this long every step (NULL: never)
    bool w0_first;        // worker 0 is admitted before the others start: rank 0, host a's leader
    bool w0_stopped;      // and stopped (SIGSTOP) once admitted: the caller lets it go
    bool quick_evict;     // --worker-timeout-ms 1500 (a worker is killed), else 10000
    bool slow_evict;      // --worker-timeout-ms 30000 (a worker is stopped for long)
    bool shm_off[WORKERS]; // worker k runs with ZPS_SHM_HOST=off: no parts in shared memory
    const char *speculate; // --speculate-after (NULL: off)
    bool coded;           // --wire-code zstd
    pid_t shard[2];
    pid_t w[WORKERS];
    char ep[256];
} run;

// Host of worker k (and shard k / 2 lives on host k too): a for 0, 1.
static const char *s_host(int k)
{
    return k == 0 ? "zps-test-host-a" : "zps-test-host-b";
}

static void s_start_shards(zps_procs *ps, run *r)
{
    char tag[64];
    const char *sargs[32] = {"--workers", "4", "--global-batch", "64", "--steps", r->steps,
                             "--seed", "3", "--shards", "2", "--model", MODEL, "--lr", "0.05",
                             "--worker-timeout-ms",
                             r->quick_evict ? "1500" : r->slow_evict ? "30000" : "10000",
                             "--host-aggregate", r->aggregate ? "on" : "off"};
    int n = 0;
    while (sargs[n]) {
        n++;
    }
    if (r->speculate) {
        sargs[n++] = "--speculate-after";
        sargs[n++] = r->speculate;
    }
    if (r->coded) {
        sargs[n++] = "--wire-code";
        sargs[n++] = "zstd";
    }
    if (r->deterministic) {
        sargs[n++] = "--deterministic";
        sargs[n++] = "--micro-batch";
        sargs[n++] = "8";
    }
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(setenv("ZPS_BOOT_ID", s_host(i), 1), 0);
        snprintf(tag, sizeof tag, "%s-s%d", r->tag, i);
        if (i == 0) {
            snprintf(r->ep, sizeof r->ep, "%s",
                     zps_procs_start_server(ps, tag, &r->shard[0], sargs, 10000));
        } else {
            const char *kargs[] = {"--shard", "1", "--shards", "2", "--coordinator", r->ep, NULL};
            zps_procs_start_server(ps, tag, &r->shard[1], kargs, 10000);
        }
    }
}

static void s_start(zps_procs *ps, run *r)
{
    s_start_shards(ps, r);
    for (int k = 0; k < WORKERS; k++) {
        char out[64], log[64];
        snprintf(out, sizeof out, "%s-w%d.bin", r->tag, k);
        snprintf(log, sizeof log, "%s-w%d.log", r->tag, k);
        bool stall = r->stall_ms[k] != NULL;
        const char *wargs[] = {"--coordinator", r->ep, "--save-params", zps_procs_path(ps, out),
                               "--cache-dir", ZPS_TEST_CACHE, "--timeout-ms", "30000",
                               "--heartbeat-ms", "100", stall ? "--stall-prob" : NULL, "1",
                               "--stall-ms", r->stall_ms[k], NULL};
        ck_assert_int_eq(setenv("ZPS_BOOT_ID", s_host(k / 2), 1), 0);
        ck_assert_int_eq(setenv("ZPS_SHM_HOST", r->shm_off[k] ? "off" : "on", 1), 0);
        r->w[k] = zps_procs_start(ps, "zps-worker", log, wargs);
        if (k == 0 && r->w0_first) {
            char s0[64];
            snprintf(s0, sizeof s0, "%s-s0.log", r->tag);
            zps_procs_wait_log(ps, s0, "admitted as rank 0", 30000);
            ck_assert_int_eq(r->w0_stopped ? kill(r->w[0], SIGSTOP) : 0, 0);
        }
    }
    ck_assert_int_eq(unsetenv("ZPS_BOOT_ID"), 0);
    ck_assert_int_eq(unsetenv("ZPS_SHM_HOST"), 0);
}

static void s_wait_all(zps_procs *ps, run *r)
{
    for (int k = 0; k < WORKERS; k++) {
        if (r->w[k] > 0) {
            ck_assert_msg(zps_procs_wait(ps, r->w[k], RUN_TIMEOUT_MS) == 0, "worker %d of %s", k,
                          r->tag);
        }
    }
    for (int i = 0; i < 2; i++) {
        ck_assert_msg(zps_procs_wait(ps, r->shard[i], 30000) == 0, "shard %d of %s", i, r->tag);
    }
}

static size_t s_n_params(void)
{
    zps_model_spec spec;
    ck_assert_int_eq(zps_model_parse(MODEL, &spec), ZPS_OK);
    return spec.n_params;
}

// Worker k's parameters, which every other worker of the run matches bitwise.
static float *s_agreed(zps_procs *ps, const run *r, size_t n)
{
    float *first = NULL;
    for (int k = 0; k < WORKERS; k++) {
        if (r->w[k] <= 0) {
            continue;
        }
        char file[64];
        snprintf(file, sizeof file, "%s-w%d.bin", r->tag, k);
        float *p = zps_procs_load_params(ps, file, n);
        if (!first) {
            first = p;
            continue;
        }
        ck_assert_msg(memcmp(first, p, n * sizeof(float)) == 0, "%s: worker %d differs",
                      r->tag, k);
        free(p);
    }
    return first;
}

// MiB of gradients worker k of a run pushed on sockets (its last line).
static double s_worker_mib(const zps_procs *ps, const run *r, int k)
{
    char log[64], line[512];
    snprintf(log, sizeof log, "%s-w%d.log", r->tag, k);
    FILE *f = fopen(zps_procs_path(ps, log), "r");
    ck_assert_ptr_nonnull(f);
    double mib = -1;
    while (fgets(line, sizeof line, f)) {
        const char *at = strstr(line, " steps; ");
        mib = at && strstr(line, "MiB of gradients pushed") ? atof(at + 8) : mib;
    }
    fclose(f);
    ck_assert_msg(mib >= 0, "%s says nothing of its pushes", log);
    return mib;
}

// MiB of gradients the workers of a run pushed on sockets.
static double s_pushed_mib(const zps_procs *ps, const run *r)
{
    double sum = 0;
    for (int k = 0; k < WORKERS; k++) {
        sum += s_worker_mib(ps, r, k);
    }
    return sum;
}

// The lines of a run's workers from `first` on that say `text`.
static int s_lines_from(const zps_procs *ps, const run *r, int first, const char *text)
{
    int n = 0;
    for (int k = first; k < WORKERS; k++) {
        char log[64];
        snprintf(log, sizeof log, "%s-w%d.log", r->tag, k);
        n += zps_procs_log_count(ps, log, text);
    }
    return n;
}

static void s_train(zps_procs *ps, run *r)
{
    s_start(ps, r);
    s_wait_all(ps, r);
}

// Run r ends with the bits a of a run whose followers' parts went to the
// leader in shared memory.
static void s_check_same_bits(zps_procs *ps, run *r, const float *a, size_t n)
{
    s_train(ps, r);
    float *f = s_agreed(ps, r, n);
    ck_assert_msg(memcmp(a, f, n * sizeof(float)) == 0,
                  "%s ends %.3g away from parts in shared memory", r->tag,
                  zps_max_abs_diff(a, f, n));
    free(f);
}

// A synchronous job's followers hand their parts to the leader in shared
// memory. The same job with ZPS_SHM_HOST=off (parts as frames), and with
// it off at host a's leader only (it refuses to map its follower's
// segment: the follower sends the same part again as frames, and frames
// from then on), ends with the same bits: the leader sums the same values
// in the same order (host a's ranks first in each).
static void s_check_against_frames(zps_procs *ps, const run *agg, const float *a, size_t n)
{
    ck_assert_int_eq(s_lines_from(ps, agg, 0, "parts to my leader through shared memory"), 2);
    ck_assert_int_eq(s_lines_from(ps, agg, 0, "cannot read my segment"), 0);
    run frames = {.tag = "frames", .aggregate = true, .steps = agg->steps, .w0_first = true,
                  .shm_off = {true, true, true, true}};
    s_check_same_bits(ps, &frames, a, n);
    ck_assert_int_eq(s_lines_from(ps, &frames, 0, "parts to my leader through"), 0);
    run refused = {.tag = "refused", .aggregate = true, .steps = agg->steps, .w0_first = true,
                   .shm_off = {true, false, false, false}};
    s_check_same_bits(ps, &refused, a, n);
    ck_assert_int_eq(zps_procs_log_count(ps, "refused-w1.log", "cannot read my segment"), 1);
}

// The same job with and without aggregation: the bits (deterministic) or
// within round-off (synchronous, where the leader's mean rounds once
// more, as another split of the batch would); fewer bytes with it. A
// deterministic job's parts (nodes, several a bucket) go as frames.
static void s_check_against_plain(bool deterministic)
{
    zps_procs ps;
    zps_procs_init(&ps, deterministic ? "host-bits" : "host-close");
    size_t n = s_n_params();
    // Host a first, ranks 0 and 1: which host's pair the leader sums
    // decides the rounding, and the runs compared bitwise share it.
    run agg = {.tag = "agg", .aggregate = true, .deterministic = deterministic, .steps = "30",
               .w0_first = true};
    run plain = {.tag = "plain", .aggregate = false, .deterministic = deterministic,
                 .steps = "30"};
    s_train(&ps, &agg);
    s_train(&ps, &plain);
    ck_assert_int_eq(s_lines_from(&ps, &agg, 0, "host group of 2 (plan 1): leading"), 2);
    ck_assert_int_eq(s_lines_from(&ps, &agg, 0, "host group of 2 (plan 1): following"), 2);
    ck_assert_int_eq(s_lines_from(&ps, &plain, 0, "host group"), 0);
    float *a = s_agreed(&ps, &agg, n), *b = s_agreed(&ps, &plain, n);
    double d = zps_max_abs_diff(a, b, n);
    double mib_agg = s_pushed_mib(&ps, &agg), mib_plain = s_pushed_mib(&ps, &plain);
    fprintf(stderr, "host aggregation (%s): %.3g from without; %.1f MiB pushed against %.1f\n",
            deterministic ? "deterministic" : "synchronous", d, mib_agg, mib_plain);
    if (deterministic) {
        ck_assert_msg(memcmp(a, b, n * sizeof(float)) == 0, "aggregated ends %.3g away", d);
        ck_assert_int_eq(s_lines_from(&ps, &agg, 0, "parts to my leader through"), 0);
        // Its nodes coded (--wire-code zstd), and the answers to them: the same bits.
        run coded = {.tag = "coded", .aggregate = true, .deterministic = true, .steps = "30",
                     .w0_first = true, .coded = true};
        s_check_same_bits(&ps, &coded, a, n);
        ck_assert_int_eq(s_lines_from(&ps, &coded, 0, "pushes coded, "), 2);
        ck_assert_int_eq(s_lines_from(&ps, &coded, 0, "coded, 0 buckets"), 0);
    } else {
        ck_assert_msg(d <= 1e-5, "aggregated ends %.3g away", d);
        s_check_against_frames(&ps, &agg, a, n);
    }
    // Each host's leader pushes one copy of the other host's range where
    // its two workers pushed two.
    ck_assert_msg(mib_agg <= 0.8 * mib_plain, "%.1f MiB pushed with aggregation, %.1f without",
                  mib_agg, mib_plain);
    free(a);
    free(b);
    zps_procs_fini(&ps, false);
}

START_TEST(test_host_deterministic_run_has_the_bits_of_one_without_aggregation)
{
    s_check_against_plain(true);
}
END_TEST

START_TEST(test_host_synchronous_run_within_round_off_of_one_without_aggregation)
{
    s_check_against_plain(false);
}
END_TEST

// From log `name`'s last line with `key`, the number after it and the one
// after `then` that follows (-1 each if none).
static void s_two_numbers(const zps_procs *ps, const char *name, const char *key,
                          const char *then, double *a, double *b)
{
    char line[512];
    FILE *f = fopen(zps_procs_path(ps, name), "r");
    ck_assert_ptr_nonnull(f);
    *a = *b = -1;
    while (fgets(line, sizeof line, f)) {
        const char *at = strstr(line, key), *next = at ? strstr(at, then) : NULL;
        if (next) {
            *a = atof(at + strlen(key));
            *b = atof(next + strlen(then));
        }
    }
    fclose(f);
}

// --wire-code zstd: the leaders' pushes coded, the shards' answers to
// them XORed with the step before. The same bits as the same job
// uncoded, and fewer bytes pushed.
START_TEST(test_host_coded_run_has_the_bits_of_one_uncoded)
{
    zps_procs ps;
    zps_procs_init(&ps, "host-coded");
    size_t n = s_n_params();
    run plain = {.tag = "plain", .aggregate = true, .steps = "30", .w0_first = true};
    run coded = {.tag = "coded", .aggregate = true, .steps = "30", .w0_first = true,
                 .coded = true};
    s_train(&ps, &plain);
    float *a = s_agreed(&ps, &plain, n);
    s_check_same_bits(&ps, &coded, a, n);
    // Each leader codes its pushes to the other host's shard and decodes
    // answers XORed with the step before.
    ck_assert_int_eq(s_lines_from(&ps, &coded, 0, "pushes coded, "), 2);
    ck_assert_int_eq(s_lines_from(&ps, &coded, 0, "not decoded"), 0);
    for (int k = 0; k < WORKERS; k += 2) { // the leaders: w0_first makes host a's rank 0
        char log[64];
        double pushes, decoded;
        snprintf(log, sizeof log, "coded-w%d.log", k);
        if (!zps_procs_log_has(&ps, log, "pushes coded")) {
            snprintf(log, sizeof log, "coded-w%d.log", k + 1);
        }
        s_two_numbers(&ps, log, "wire code: ", "pushes coded, ", &pushes, &decoded);
        // Every step's answers but the first's (its base came uncoded):
        // none goes uncoded for a push that came after an answer.
        ck_assert_msg(pushes >= 30 && decoded >= pushes * 29 / 30, "%s: %.0f pushes coded, "
                      "%.0f answers decoded against the step before", log, pushes, decoded);
    }
    for (int i = 0; i < 2; i++) { // each shard's answers shrink
        char log[64];
        double sent, ratio;
        snprintf(log, sizeof log, "coded-s%d.log", i);
        s_two_numbers(&ps, log, "wire code: ", "MiB of parameters (", &sent, &ratio);
        ck_assert_msg(sent > 0 && ratio > 0 && ratio < 0.95, "%s: %.0f answers coded, %.3f of "
                      "their size", log, sent, ratio);
    }
    ck_assert_int_eq(s_lines_from(&ps, &coded, 0, "not decoded"), 0);
    ck_assert_int_eq(s_lines_from(&ps, &plain, 0, "wire code"), 0);
    double mib_plain = s_pushed_mib(&ps, &plain), mib_coded = s_pushed_mib(&ps, &coded);
    fprintf(stderr, "wire code: %.2f MiB pushed against %.2f uncoded\n", mib_coded, mib_plain);
    ck_assert_msg(mib_coded < mib_plain, "%.2f MiB pushed coded, %.2f uncoded", mib_coded,
                  mib_plain);
    free(a);
    zps_procs_fini(&ps, false);
}
END_TEST

// --wire-code zstd is lossless fp32: with a rounded wire or diloco (whose
// --compress codes its pushes) the server exits 2 with one line, and never
// listens; so does a value it does not know.
START_TEST(test_host_wire_code_refusals_exit_2_with_one_line)
{
    static const struct {
        const char *args[4];
        const char *line;
    } refusals[] = {
        {{"--wire-dtype", "bf16", NULL}, "--wire-code zstd codes fp32 losslessly"},
        {{"--mode", "diloco", NULL}, "--wire-code zstd codes fp32 losslessly"},
        {{NULL}, "--wire-code"},
    };
    zps_procs ps;
    zps_procs_init(&ps, "host-code-refuse");
    for (size_t i = 0; i < sizeof refusals / sizeof refusals[0]; i++) {
        char log[32], ep_file[32];
        snprintf(log, sizeof log, "refusal-%zu.log", i);
        snprintf(ep_file, sizeof ep_file, "refusal-%zu.ep", i);
        const char *args[12] = {"--listen", "tcp://127.0.0.1:*", "--endpoint-file",
                                zps_procs_path(&ps, ep_file), "--wire-code",
                                refusals[i].args[0] ? "zstd" : "lz4"};
        size_t n = 6;
        for (size_t k = 0; refusals[i].args[k]; k++) {
            args[n++] = refusals[i].args[k];
        }
        args[n] = NULL;
        pid_t s = zps_procs_start(&ps, "zps-server", log, args);
        ck_assert_int_eq(zps_procs_wait(&ps, s, 10000), 2);
        ck_assert_msg(zps_procs_log_has(&ps, log, refusals[i].line), "refusal %zu lacks '%s'", i,
                      refusals[i].line);
        ck_assert_msg(zps_procs_log_count(&ps, log, "") == 1, "refusal %zu: not one line", i);
        ck_assert_msg(access(zps_procs_path(&ps, ep_file), F_OK) != 0,
                      "refusal %zu wrote an endpoint", i);
    }
    zps_procs_fini(&ps, false);
}
END_TEST

// The worker of host b whose log says it leads, within 30 s.
static int s_leader_of_b(const zps_procs *ps, const run *r)
{
    for (int tries = 0; tries < 300; tries++) {
        for (int k = 2; k < WORKERS; k++) {
            char log[64];
            snprintf(log, sizeof log, "%s-w%d.log", r->tag, k);
            if (zps_procs_log_has(ps, log, "host group of 2 (plan 1): leading")) {
                return k;
            }
        }
        struct timespec ts = {0, 100000000L};
        nanosleep(&ts, NULL);
    }
    ck_abort_msg("no leader of host b said so within 30 s");
    return -1;
}

// Uncoded (_i 0), and with --wire-code zstd (1): the survivors' leader
// goes on coding, and the shards answer the new group uncoded until its
// leader holds a step.
START_TEST(test_host_leader_killed_mid_run_job_completes_and_survivors_agree)
{
    zps_procs ps;
    zps_procs_init(&ps, _i ? "host-kill-coded" : "host-kill");
    size_t n = s_n_params();
    // A pause of 40 ms every step: 60 steps of this model take 80 ms on a
    // fast machine, over before a poll of the coordinator sees step 15.
    run r = {.tag = "kill", .aggregate = true, .deterministic = false, .steps = "60",
             .stall_ms = {"40", "40", "40", "40"}, .quick_evict = true, .coded = _i == 1};
    s_start(&ps, &r);
    int leader = s_leader_of_b(&ps, &r);
    zps_procs_wait_step(r.ep, 15, 60000);
    ck_assert_int_eq(kill(r.w[leader], SIGKILL), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, r.w[leader], 5000), -1);
    r.w[leader] = 0;
    s_wait_all(&ps, &r);
    float *a = s_agreed(&ps, &r, n);
    free(a);
    ck_assert_int_eq(s_lines_from(&ps, &r, 0, "pushes coded, "), _i ? 1 : 0); // host a's leader
    ck_assert_int_eq(s_lines_from(&ps, &r, 0, "not decoded"), 0);
    zps_procs_fini(&ps, false);
}
END_TEST

// Host b's leader stopped (SIGSTOP) after pushing its host's parts of the
// last step, before the shards' parameters come: host a's workers pause
// 6 s in that step, and the follower has asked the coordinator twice
// (after 1 and 3 s) when the leader stops. Its leader will not pass shard
// 0's last parameters on, but the shards keep them: once the coordinator
// says the job is over at the step the follower waits for, it asks shard
// 0 for them and ends with the job's parameters, not without them. The
// leader, let go once the follower is through, ends with them too: shard
// 1, whose last step was done long before, waits for the coordinator to
// end, which waits for the leader, so the segment its values are in is
// still there.
START_TEST(test_host_follower_whose_leader_stopped_asks_the_shards_for_the_last_parameters)
{
    zps_procs ps;
    zps_procs_init(&ps, "host-last");
    size_t n = s_n_params();
    run r = {.tag = "last", .aggregate = true, .deterministic = false, .steps = "1",
             .stall_ms = {"6000", "6000"}};
    s_start(&ps, &r);
    int leader = s_leader_of_b(&ps, &r), follower = leader == 2 ? 3 : 2;
    char log[64];
    snprintf(log, sizeof log, "last-w%d.log", follower);
    for (int tries = 0; zps_procs_log_count(&ps, log, "waiting for step 1 parameters") < 2;
         tries++) {
        ck_assert_msg(tries < 300, "the follower did not ask twice within 30 s");
        struct timespec ts = {0, 100000000L};
        nanosleep(&ts, NULL);
    }
    ck_assert_int_eq(kill(r.w[leader], SIGSTOP), 0);
    int st = zps_procs_wait(&ps, r.w[follower], RUN_TIMEOUT_MS);
    ck_assert_int_eq(kill(r.w[leader], SIGCONT), 0);
    ck_assert_msg(st == 0, "the follower exited with %d", st);
    pid_t waited = r.w[follower];
    r.w[follower] = 0; // reaped: s_wait_all waits for the others
    s_wait_all(&ps, &r);
    r.w[follower] = waited;
    ck_assert_int_eq(zps_procs_log_count(&ps, log, "pushing it myself"), 0);
    ck_assert(zps_procs_log_has(&ps, log, "waiting for them (1 shard(s) asked again)"));
    float *a = s_agreed(&ps, &r, n); // every worker's
    free(a);
    zps_procs_fini(&ps, false);
}
END_TEST

// Both workers of host a pause 7 s every step (their heartbeats go on:
// not evicted), longer than a follower's least wait for its leader (6 s)
// while nothing is known of the steps' length. Host b's follower handed
// its part to its leader, which took it (HOST_ACK) and pushed it: the step
// is slow for another host's reason, so the follower waits instead of
// computing and pushing its piece again. The job completes, all agreeing.
START_TEST(test_host_follower_waits_out_a_step_slow_elsewhere_once_its_part_is_taken)
{
    zps_procs ps;
    zps_procs_init(&ps, "host-slow");
    size_t n = s_n_params();
    run r = {.tag = "slow", .aggregate = true, .deterministic = false, .steps = "2",
             .stall_ms = {"7000", "7000"}};
    s_train(&ps, &r);
    ck_assert_int_eq(s_lines_from(&ps, &r, 0, "following"), 2);
    ck_assert_int_eq(s_lines_from(&ps, &r, 2, "did not take my part"), 0);
    ck_assert_int_eq(s_lines_from(&ps, &r, 2, "pushing it myself"), 0);
    float *a = s_agreed(&ps, &r, n);
    free(a);
    zps_procs_fini(&ps, false);
}
END_TEST

// Host a's leader (worker 0, admitted first: rank 0) pauses 7 s every
// step, its follower 0.5 s (so its part of step 0 comes while the leader
// pauses). At step 0, while the steps' length is unknown, the follower
// asks its leader after 6 s whether it holds its part; the leader, back,
// finds the part past its time to be taken (the follower might have
// pushed it itself: a sum with it would be refused as partly counted, the
// leader's own piece lost with it), says it leaves it to the follower,
// which pushes it, and pushes its own piece alone. The follower, pushing
// for itself that step, is not waited for after that one step's flush:
// said once, at step 0 (waited for every step, each step took 3 usual
// steps, and the usual step grew with them). The job completes and every
// worker agrees.
START_TEST(test_host_leader_slower_than_the_give_up_pushes_its_own_piece_alone)
{
    zps_procs ps;
    zps_procs_init(&ps, "host-slowlead");
    size_t n = s_n_params();
    run r = {.tag = "lead", .aggregate = true, .deterministic = false, .steps = "2",
             .stall_ms = {"7000", "500"}, .w0_first = true};
    s_train(&ps, &r);
    ck_assert(zps_procs_log_has(&ps, "lead-w0.log", "leading"));
    ck_assert(zps_procs_log_has(&ps, "lead-w1.log", "did not take my part"));
    ck_assert(zps_procs_log_has(&ps, "lead-w0.log", "left to it"));
    ck_assert(zps_procs_log_has(&ps, "lead-w1.log", "leaves it to me"));
    ck_assert_int_eq(zps_procs_log_count(&ps, "lead-w0.log", "not waited for"), 1);
    float *a = s_agreed(&ps, &r, n);
    free(a);
    zps_procs_fini(&ps, false);
}
END_TEST

// As the test above, but the first parameters come 3 s after the job
// starts, as they do when thousands of members start on a few cores: an
// external job (examples/tanh_mlp.c, --sleep-ms a piece), whose shards
// serve nothing until rank 0, host a's leader, sends the initial values,
// and rank 0 stopped (SIGSTOP) until then (evicted after 10 s of silence,
// not 1.5). Until a step is timed, the host's timers count steps of the
// first parameters' wait: the follower waits 18 s for its leader, not 6,
// and the leader, back from its 7 s, takes its part.
START_TEST(test_host_follower_waits_longer_for_its_leader_when_the_first_parameters_came_late)
{
    zps_procs ps;
    zps_procs_init(&ps, "host-late");
    const char *sargs[] = {"--workers", "4", "--model", "external", "--steps", "2",
                           "--global-batch", "64", "--lr", "0.1", "--shards", "2",
                           "--worker-timeout-ms", "10000", "--host-aggregate", "on", NULL};
    pid_t shard[2], w[WORKERS];
    char ep[256];
    ck_assert_int_eq(setenv("ZPS_BOOT_ID", s_host(0), 1), 0);
    snprintf(ep, sizeof ep, "%s", zps_procs_start_server(&ps, "s0", &shard[0], sargs, 10000));
    ck_assert_int_eq(setenv("ZPS_BOOT_ID", s_host(1), 1), 0);
    const char *kargs[] = {"--shard", "1", "--shards", "2", "--coordinator", ep, NULL};
    zps_procs_start_server(&ps, "s1", &shard[1], kargs, 10000);
    for (int k = 0; k < WORKERS; k++) {
        char out[32], log[32];
        snprintf(out, sizeof out, "w%d.bin", k);
        snprintf(log, sizeof log, "w%d.log", k);
        const char *wargs[] = {"--coordinator", ep, "--save", zps_procs_path(&ps, out),
                               "--sleep-ms", k == 0 ? "7000" : "500", NULL};
        ck_assert_int_eq(setenv("ZPS_BOOT_ID", s_host(k / 2), 1), 0);
        w[k] = zps_procs_start(&ps, "tanh_mlp", log, wargs);
        if (k == 0) {
            zps_procs_wait_log(&ps, "s0.log", "admitted as rank 0", 30000);
            ck_assert_int_eq(kill(w[0], SIGSTOP), 0);
        }
    }
    ck_assert_int_eq(unsetenv("ZPS_BOOT_ID"), 0);
    zps_procs_wait_log(&ps, "s0.log", "4 workers, 2 shards", 30000);
    struct timespec ts = {3, 0};
    nanosleep(&ts, NULL);
    ck_assert_int_eq(kill(w[0], SIGCONT), 0);
    for (int k = 0; k < WORKERS; k++) {
        ck_assert_msg(zps_procs_wait(&ps, w[k], RUN_TIMEOUT_MS) == 0, "worker %d", k);
    }
    for (int i = 0; i < 2; i++) {
        ck_assert_msg(zps_procs_wait(&ps, shard[i], 30000) == 0, "shard %d", i);
    }
    ck_assert(zps_procs_log_has(&ps, "w0.log", "leading"));
    ck_assert(zps_procs_log_has(&ps, "w1.log", "following"));
    ck_assert_int_eq(zps_procs_log_count(&ps, "w1.log", "did not take my part"), 0);
    ck_assert_int_eq(zps_procs_log_count(&ps, "w0.log", "left to it"), 0);
    float *first = zps_procs_load_params(&ps, "w0.bin", TANH_MLP_PARAMS);
    for (int k = 1; k < WORKERS; k++) {
        char file[32];
        snprintf(file, sizeof file, "w%d.bin", k);
        float *p = zps_procs_load_params(&ps, file, TANH_MLP_PARAMS);
        ck_assert_msg(memcmp(first, p, TANH_MLP_PARAMS * sizeof(float)) == 0,
                      "worker %d differs", k);
        free(p);
    }
    free(first);
    zps_procs_fini(&ps, false);
}
END_TEST

// The end of a run in which host a's follower pushed without its leader
// for a while: of the run's steps it pushed at most a tenth of what its
// leader pushed itself (`what` names the run in the line printed), and
// every worker agrees.
static void s_check_back_through_leader(zps_procs *ps, const run *r, size_t n, const char *what)
{
    double leader = s_worker_mib(ps, r, 0), follower = s_worker_mib(ps, r, 1);
    fprintf(stderr, "host %s: the follower pushed %.2f MiB, its leader %.2f\n", what, follower,
            leader);
    ck_assert_msg(follower <= 0.1 * leader, "the follower pushed %.2f MiB, its leader %.2f",
                  follower, leader);
    float *a = s_agreed(ps, r, n);
    free(a);
}

// Host a's leader (worker 0, rank 0) stopped (SIGSTOP) from its admission
// until its follower's first part found no connection to it (a leader
// binds its socket when it takes the plan; thousands of members starting
// on a few cores connect as late): the follower pushes step 0 for itself
// and tries its leader again at the next step's first part, without
// waiting. Through it from then on: of 20 steps, the follower sends at
// most 2 of its parts for the shard on host b itself, where its leader
// sends all 20 (before, it pushed every step for itself until the next
// plan). The job completes and every worker agrees.
START_TEST(test_host_follower_that_found_no_leader_at_first_pushes_through_it_once_there)
{
    zps_procs ps;
    zps_procs_init(&ps, "host-reach");
    size_t n = s_n_params();
    run r = {.tag = "reach", .aggregate = true, .steps = "20", .w0_first = true,
             .w0_stopped = true};
    s_start(&ps, &r);
    zps_procs_wait_log(&ps, "reach-w1.log", "not reached within", 60000);
    ck_assert_int_eq(kill(r.w[0], SIGCONT), 0);
    s_wait_all(&ps, &r);
    ck_assert(zps_procs_log_has(&ps, "reach-w0.log", "leading"));
    ck_assert(zps_procs_log_has(&ps, "reach-w1.log", "reached at step"));
    s_check_back_through_leader(&ps, &r, n, "reach");
    zps_procs_fini(&ps, false);
}
END_TEST

// Stops host a's leader (SIGSTOP) until its follower asks it about a
// part it did not take (6 s after the part went; the eviction is at 30),
// then lets it go. A stop that came after the leader took the follower's
// part of the step (then waiting for the step's parameters: no question
// comes) is let go after 15 s and made again, a few steps on.
static void s_stop_leader_until_asked(zps_procs *ps, const run *r, const char *follower_log)
{
    for (int stop = 0; stop < 4; stop++) {
        ck_assert_int_eq(kill(r->w[0], SIGSTOP), 0);
        bool asked = false;
        for (int ms = 0; ms < 15000 && !asked; ms += 100) {
            struct timespec ts = {0, 100 * 1000 * 1000};
            nanosleep(&ts, NULL);
            asked = zps_procs_log_has(ps, follower_log, "asking it whether it holds it");
        }
        ck_assert_int_eq(kill(r->w[0], SIGCONT), 0);
        if (asked) {
            return;
        }
        struct timespec ts = {1, 0};
        nanosleep(&ts, NULL);
    }
    ck_abort_msg("%s: no question to its stopped leader in 4 stops", follower_log);
}

// Host a's leader (rank 0) stopped once the job trains, every worker
// pausing 0.2 s a step, until its follower asked it about a part it did
// not take. Let go, the leader answers that it left the part (it came
// past its time to be taken): the follower pushes that step for itself
// and tries its leader again at the next step's first part, through it
// from then on. Of 30 steps it sends at most 3 of its parts for the shard
// on host b itself, where its leader sends all 30 (before, it pushed
// every step after the give-up for itself until the next plan, which a
// steady job never makes; 63 of 4,032 followers did in bench/swarm at
// 4096 members). The job completes and every worker agrees.
START_TEST(test_host_follower_that_gave_up_on_a_slow_leader_pushes_through_it_again)
{
    zps_procs ps;
    zps_procs_init(&ps, "host-again");
    size_t n = s_n_params();
    run r = {.tag = "again", .aggregate = true, .steps = "30", .w0_first = true,
             .stall_ms = {"200", "200", "200", "200"}, .slow_evict = true};
    s_start(&ps, &r);
    zps_procs_wait_log(&ps, "again-s0.log", "epoch 0: loss", 60000);
    s_stop_leader_until_asked(&ps, &r, "again-w1.log");
    s_wait_all(&ps, &r);
    ck_assert(zps_procs_log_has(&ps, "again-w0.log", "not taken: left to it"));
    ck_assert(zps_procs_log_has(&ps, "again-w1.log", "leaves it to me"));
    ck_assert(zps_procs_log_has(&ps, "again-w1.log", "tried again at step"));
    s_check_back_through_leader(&ps, &r, n, "again");
    zps_procs_fini(&ps, false);
}
END_TEST

// Host a's leader (rank 0) pauses 1.5 s before each step's compute, with
// --speculate-after. Shard 0 (host a, the coordinator's) has the
// follower's slice at once, pushed there directly; its part for shard 1
// (host b) waits in the leader. The leader's slice is handed to the others
// in pieces, and its follower's with it: shard 1 counts both from the
// pieces and never asks the leader for a run of its sum (before, it
// dropped each late sum as partly counted and asked for the follower's
// run, and every step waited for the leader: in one run 14 asks and 10.8 s
// for the 8 steps, against none and 1.6 s). The leader, left behind,
// catches up to the last step: every worker ends with the same
// parameters, within round-off of the job without a pause, aggregation or
// speculation (each sample counted once, in another order).
START_TEST(test_host_slow_leaders_followers_are_handed_on_with_it_by_speculation)
{
    zps_procs ps;
    zps_procs_init(&ps, "host-spec");
    size_t n = s_n_params();
    run r = {.tag = "spec", .aggregate = true, .steps = "8", .w0_first = true,
             .stall_ms = {"1500"}, .speculate = "0.25"};
    run plain = {.tag = "plain", .aggregate = false, .steps = "8"};
    s_train(&ps, &r);
    s_train(&ps, &plain);
    ck_assert(zps_procs_log_has(&ps, "spec-s0.log",
                                "rank 1's part for the shards elsewhere waits in its leader"));
    ck_assert_int_eq(zps_procs_log_count(&ps, "spec-s1.log", "was partly counted already"), 0);
    float *a = s_agreed(&ps, &r, n), *b = s_agreed(&ps, &plain, n);
    double d = zps_max_abs_diff(a, b, n);
    fprintf(stderr, "a slow leader's followers handed on with it: %.3g from the plain run\n", d);
    ck_assert_msg(d <= 1e-4, "ends %.3g away from the plain run", d);
    free(a);
    free(b);
    zps_procs_fini(&ps, false);
}
END_TEST

Suite *zps_suite_host(void)
{
    Suite *s = suite_create("host");
    TCase *tc = tcase_create("host");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_host_deterministic_run_has_the_bits_of_one_without_aggregation);
    tcase_add_test(tc, test_host_synchronous_run_within_round_off_of_one_without_aggregation);
    tcase_add_test(tc, test_host_coded_run_has_the_bits_of_one_uncoded);
    tcase_add_test(tc, test_host_wire_code_refusals_exit_2_with_one_line);
    tcase_add_loop_test(tc, test_host_leader_killed_mid_run_job_completes_and_survivors_agree, 0,
                        2);
    tcase_add_test(tc,
                   test_host_follower_whose_leader_stopped_asks_the_shards_for_the_last_parameters);
    suite_add_tcase(s, tc);
    // Steps of 7 s, and a leader stopped at its start: about a minute in
    // all, make test-long's (docs/tests.md).
    TCase *slow = tcase_create("slow");
    tcase_set_timeout(slow, 300);
    tcase_set_tags(slow, "long");
    tcase_add_test(slow, test_host_follower_waits_out_a_step_slow_elsewhere_once_its_part_is_taken);
    tcase_add_test(slow, test_host_leader_slower_than_the_give_up_pushes_its_own_piece_alone);
    tcase_add_test(slow,
                   test_host_follower_waits_longer_for_its_leader_when_the_first_parameters_came_late);
    tcase_add_test(slow,
                   test_host_follower_that_found_no_leader_at_first_pushes_through_it_once_there);
    tcase_add_test(slow, test_host_follower_that_gave_up_on_a_slow_leader_pushes_through_it_again);
    tcase_add_test(slow, test_host_slow_leaders_followers_are_handed_on_with_it_by_speculation);
    suite_add_tcase(s, slow);
    return s;
}
