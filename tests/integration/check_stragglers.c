/* check_stragglers.c - a slowed worker is seen, and the run adapts to it
 * without changing what is computed. Real processes on loopback. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/zps_clock.h"
#include "common/zps_model.h"
#include "common/zps_wire.h"
#include "zps_integration.h"
#include "zps_proc.h"

#define MODEL "mlp:784-512-512-10"

typedef struct view {
    uint64_t step;
    bool flagged;       // the slowed rank is flagged a straggler
    uint32_t share;     // the slowed rank's share
} view;

// STATUS, looking at the member whose pid is `pid`.
static view s_view(const char *endpoint, pid_t pid)
{
    void *ctx = zmq_ctx_new();
    void *sock = zps_wire_socket(ctx, ZMQ_DEALER, 5000);
    ck_assert_int_eq(zmq_connect(sock, endpoint), 0);
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__STATUS);
    ck_assert_int_eq(zps_wire_send(sock, NULL, &h, NULL, 0, NULL), ZPS_OK);
    zps_wire_msg m;
    ck_assert_int_eq(zps_wire_recv(sock, false, &m), ZPS_OK);
    view v = {.step = m.hdr->status->step};
    for (size_t i = 0; i < m.hdr->status->n_members; i++) {
        const Zps__Member *mem = m.hdr->status->members[i];
        if ((pid_t)mem->pid == pid) {
            v.flagged = mem->straggler;
            v.share = mem->share;
        }
    }
    zps_wire_msg_fini(&m);
    int zero = 0;
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_close(sock);
    zmq_ctx_term(ctx);
    return v;
}

// The q-quantile of step_ms over the metrics log's steps >= from.
static double s_step_quantile(zps_procs *ps, const char *log, uint64_t from, double q)
{
    FILE *f = fopen(zps_procs_path(ps, log), "r");
    ck_assert_ptr_nonnull(f);
    static double v[4096];
    size_t n = 0;
    char line[4096];
    unsigned long long step;
    double ms;
    while (fgets(line, sizeof line, f) && n < 4096) {
        const char *p = strstr(line, "\"step_ms\":");
        if (sscanf(line, "{\"step\":%llu", &step) == 1 && p && step >= from &&
            sscanf(p, "\"step_ms\":%lf", &ms) == 1) {
            v[n++] = ms;
        }
    }
    fclose(f);
    ck_assert_uint_gt(n, 10);
    for (size_t i = 1; i < n; i++) { // insertion sort: a few hundred values
        double x = v[i];
        size_t j = i;
        for (; j > 0 && v[j - 1] > x; j--) {
            v[j] = v[j - 1];
        }
        v[j] = x;
    }
    return v[(size_t)(q * (double)n)];
}

static double s_median_step(zps_procs *ps, const char *log, uint64_t from)
{
    return s_step_quantile(ps, log, from, 0.5);
}

static pid_t s_worker(zps_procs *ps, const char *ep, const char *name, const char *slow)
{
    char out[64], log[64];
    snprintf(out, sizeof out, "%s.bin", name);
    snprintf(log, sizeof log, "%s.log", name);
    const char *args[] = {"--coordinator", ep, "--save-params", zps_procs_path(ps, out),
                          "--cache-dir", ZPS_TEST_CACHE, slow ? "--slowdown" : NULL, slow, NULL};
    return zps_procs_start(ps, "zps-worker", log, args);
}

// One run of 3 workers, one slowed 8x (sleeping: on 2 shared cores a smaller
// factor hides behind CPU contention).
static void s_run(zps_procs *ps, const char *tag, bool adaptive, bool *flagged_by_20,
                  uint32_t *slow_share)
{
    char metrics[64], server[64], names[3][32];
    snprintf(metrics, sizeof metrics, "%s.jsonl", tag);
    snprintf(server, sizeof server, "%s-server", tag);
    const char *args[] = {"--workers", "3", "--global-batch", "96", "--steps", "80",
                          "--model", MODEL, "--seed", "5", "--lr", "0.02", "--metrics-log",
                          zps_procs_path(ps, metrics), adaptive ? "--adaptive-split" : NULL,
                          NULL};
    pid_t s;
    char ep[256];
    snprintf(ep, sizeof ep, "%s", zps_procs_start_server(ps, server, &s, args, 10000));
    pid_t w[3];
    for (int i = 0; i < 3; i++) {
        snprintf(names[i], sizeof names[i], "%s-w%d", tag, i);
        w[i] = s_worker(ps, ep, names[i], i == 0 ? "8" : NULL);
    }
    *flagged_by_20 = false;
    double deadline = zps_clock_ms() + 60000;
    view v = {0};
    while (v.step < 20 && zps_clock_ms() < deadline) {
        v = s_view(ep, w[0]);
        *flagged_by_20 = *flagged_by_20 || v.flagged;
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    while ((v = s_view(ep, w[0])).step < 70 && zps_clock_ms() < deadline) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    *slow_share = v.share;
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(zps_procs_wait(ps, w[i], 120000), 0);
    }
    ck_assert_int_eq(zps_procs_wait(ps, s, 30000), 0);
}

START_TEST(test_stragglers_slowed_worker_flagged_and_split_adapts_same_math)
{
    zps_procs ps;
    zps_procs_init(&ps, "straggle");
    bool flagged_fixed, flagged_adaptive;
    uint32_t share_fixed, share_adaptive;
    s_run(&ps, "fixed", false, &flagged_fixed, &share_fixed);
    s_run(&ps, "adaptive", true, &flagged_adaptive, &share_adaptive);
    double m_fixed = s_median_step(&ps, "fixed.jsonl", 40);
    double m_adaptive = s_median_step(&ps, "adaptive.jsonl", 40);
    fprintf(stderr, "slowed worker: flagged by step 20 %s/%s; share %u -> %u of 96; median step "
                    "%.2f ms fixed, %.2f ms adaptive (%.2fx)\n",
            flagged_fixed ? "yes" : "no", flagged_adaptive ? "yes" : "no", share_fixed,
            share_adaptive, m_fixed, m_adaptive, m_fixed / m_adaptive);
    ck_assert_msg(flagged_fixed && flagged_adaptive, "the slowed worker was not flagged by step 20");
    ck_assert_uint_eq(share_fixed, 32);
    // The split follows throughput; what that saves in time is measured by
    // benchmarks, not asserted here (the machines are shared and noisy).
    ck_assert_uint_lt(share_adaptive, 24);
    // The split changed, the computation did not.
    zps_model_spec spec;
    ck_assert_int_eq(zps_model_parse(MODEL, &spec), ZPS_OK);
    double d = zps_procs_params_diff(&ps, "fixed-w1.bin", "adaptive-w1.bin", spec.n_params);
    fprintf(stderr, "max |fixed - adaptive| = %.3g\n", d);
    ck_assert_double_le(d, 1e-4);
    zps_procs_fini(&ps, false);
}
END_TEST

// 3 workers, one pausing 50 ms (5 median steps) with chance 0.1 a step;
// with --speculate-after X, or without speculation if X is NULL.
static void s_stall_run(zps_procs *ps, const char *tag, const char *speculate)
{
    char metrics[64], server[64], names[3][32];
    snprintf(metrics, sizeof metrics, "%s.jsonl", tag);
    snprintf(server, sizeof server, "%s-server", tag);
    const char *args[] = {"--workers", "3", "--global-batch", "96", "--steps", "120",
                          "--model", MODEL, "--seed", "5", "--lr", "0.02", "--metrics-log",
                          zps_procs_path(ps, metrics), speculate ? "--speculate-after" : NULL,
                          speculate, NULL};
    pid_t s, w[3];
    char ep[256];
    snprintf(ep, sizeof ep, "%s", zps_procs_start_server(ps, server, &s, args, 10000));
    for (int i = 0; i < 3; i++) {
        char out[64], log[64];
        snprintf(names[i], sizeof names[i], "%s-w%d", tag, i);
        snprintf(out, sizeof out, "%s.bin", names[i]);
        snprintf(log, sizeof log, "%s.log", names[i]);
        const char *wargs[] = {"--coordinator", ep, "--save-params", zps_procs_path(ps, out),
                               "--cache-dir", ZPS_TEST_CACHE, i == 0 ? "--stall-prob" : NULL,
                               "0.1", "--stall-ms", "50", NULL};
        w[i] = zps_procs_start(ps, "zps-worker", log, wargs);
    }
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(zps_procs_wait(ps, w[i], 120000), 0);
    }
    ck_assert_int_eq(zps_procs_wait(ps, s, 30000), 0);
}

// Random pauses of one worker: speculation hands its late slices to the
// others, which cuts the slow tail of the step times, and the parameters
// are those of the run without speculation. The target of the issue, p95
// within 1.5 x the median, is printed, not asserted: on 2 shared cores a
// run without any pause already has a p95 of 1.2-1.45 x its median
// (bench/speculate.sh measures it).
START_TEST(test_stragglers_speculation_cuts_the_tail_of_random_stalls_same_math)
{
    zps_procs ps;
    zps_procs_init(&ps, "speculate");
    s_stall_run(&ps, "plain", NULL);
    s_stall_run(&ps, "spec", "0.25");
    double m0 = s_step_quantile(&ps, "plain.jsonl", 10, 0.5);
    double p0 = s_step_quantile(&ps, "plain.jsonl", 10, 0.95);
    double m1 = s_step_quantile(&ps, "spec.jsonl", 10, 0.5);
    double p1 = s_step_quantile(&ps, "spec.jsonl", 10, 0.95);
    fprintf(stderr, "random stalls: median %.2f ms, p95 %.2f ms (%.2fx) without speculation; "
                    "median %.2f ms, p95 %.2f ms (%.2fx) with it\n",
            m0, p0, p0 / m0, m1, p1, p1 / m1);
    ck_assert_msg(p1 <= 0.7 * p0, "speculation did not cut the p95 step time: %.2f -> %.2f ms",
                  p0, p1);
    zps_model_spec spec;
    ck_assert_int_eq(zps_model_parse(MODEL, &spec), ZPS_OK);
    double d = zps_procs_params_diff(&ps, "plain-w1.bin", "spec-w1.bin", spec.n_params);
    fprintf(stderr, "max |plain - speculated| = %.3g\n", d);
    ck_assert_double_le(d, 1e-4);
    zps_procs_fini(&ps, false);
}
END_TEST

Suite *zps_suite_stragglers(void)
{
    Suite *s = suite_create("stragglers");
    TCase *tc = tcase_create("adapt");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_stragglers_slowed_worker_flagged_and_split_adapts_same_math);
    tcase_add_test(tc, test_stragglers_speculation_cuts_the_tail_of_random_stalls_same_math);
    suite_add_tcase(s, tc);
    return s;
}
