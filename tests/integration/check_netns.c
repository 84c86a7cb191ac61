/* check_netns.c - the multi-host path on one machine: deploy/netns-cluster.sh
 * puts 2 shards and 2 workers on hosts of their own (network namespaces
 * joined by a bridge), one worker behind a link limited by tc tbf. The
 * run reports each worker's lag, and ends equal to a single process; on
 * links that every flow shares, --sndbuf auto tunes the connections.
 * Needs root; skipped, visibly, without it or without network namespaces. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/zps_model.h"
#include "zps_integration.h"
#include "zps_mlog_read.h"
#include "zps_proc.h"

#define MODEL "mlp:784-512-512-10"

// Why the test cannot run here, or NULL.
static const char *s_cannot_run(zps_procs *ps)
{
    if (getuid() != 0) {
        return "needs root (ip netns, tc)";
    }
    char cmd[256];
    snprintf(cmd, sizeof cmd,
             "ip netns add zps-probe-%d && ip netns del zps-probe-%d && command -v tc",
             (int)getpid(), (int)getpid());
    if (zps_procs_sh(ps, cmd, "probe.log", 10000) != 0) {
        return "cannot make a network namespace or no tc (iproute2)";
    }
    return NULL;
}

// The rank a worker's log says it was given.
static int s_rank_of(zps_procs *ps, const char *log)
{
    FILE *f = fopen(zps_procs_path(ps, log), "r");
    ck_assert_ptr_nonnull(f);
    char line[1024];
    int rank = -1;
    while (rank < 0 && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, ": rank ");
        if (p && strstr(line, "job ")) {
            rank = atoi(p + 7);
        }
    }
    fclose(f);
    ck_assert_int_ge(rank, 0);
    return rank;
}

static int s_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// Median lag of each of 2 ranks over the metrics log.
static void s_median_lags(const char *path, double med[2])
{
    static double lag[2][4096];
    size_t n[2] = {0, 0};
    json_t *log = zps_mlog_read(path);
    size_t i;
    json_t *rec;
    json_array_foreach(log, i, rec)
    {
        for (int r = 0; r < 2; r++) {
            json_t *w = zps_mlog_worker(rec, r);
            if (w != NULL && n[r] < 4096) {
                lag[r][n[r]++] = zps_mlog_num(w, "lag_ms");
            }
        }
    }
    json_decref(log);
    for (int r = 0; r < 2; r++) {
        ck_assert_uint_gt(n[r], 10);
        qsort(lag[r], n[r], sizeof lag[r][0], s_cmp);
        med[r] = lag[r][n[r] / 2];
    }
}

START_TEST(test_netns_hosts_with_a_slow_link_train_equal_and_report_lag)
{
    zps_procs ps;
    zps_procs_init(&ps, "netns");
    const char *why = s_cannot_run(&ps);
    if (why) {
        fprintf(stderr, "SKIPPED: test_netns_hosts_with_a_slow_link_train_equal_and_report_lag: "
                        "%s\n", why);
        zps_procs_fini(&ps, false);
        return;
    }
    // The single process: one worker, the whole batch, on loopback.
    const char *args[] = {"--workers", "1", "--global-batch", "96", "--steps", "60",
                          "--model", MODEL, "--seed", "5", "--lr", "0.02", NULL};
    pid_t s;
    char ep[256];
    snprintf(ep, sizeof ep, "%s", zps_procs_start_server(&ps, "ref", &s, args, 10000));
    const char *wargs[] = {"--coordinator", ep, "--save-params", zps_procs_path(&ps, "ref.bin"),
                           "--cache-dir", ZPS_TEST_CACHE, NULL};
    pid_t w = zps_procs_start(&ps, "zps-worker", "ref-w.log", wargs);
    ck_assert_int_eq(zps_procs_wait(&ps, w, 120000), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, s, 30000), 0);

    // The emulated cluster: 2 shard hosts, 2 worker hosts, w1 behind 300 Mbit/s.
    char cmd[1024], cache[512];
    ck_assert_ptr_nonnull(realpath(ZPS_TEST_CACHE, cache));
    snprintf(cmd, sizeof cmd,
             "deploy/netns-cluster.sh -s 2 -w 2 -l w1=300mbit -o %s/hosts -t 150 "
             "-W '--cache-dir %s' -- --global-batch 96 --steps 60 --model %s --seed 5 "
             "--lr 0.02",
             ps.dir, cache, MODEL);
    ck_assert_msg(zps_procs_sh(&ps, cmd, "netns.log", 200000) == 0,
                  "the emulated cluster failed; see %s/netns.log and %s/hosts", ps.dir, ps.dir);

    double med[2];
    s_median_lags(zps_procs_path(&ps, "hosts/metrics.jsonl"), med);
    int slow = s_rank_of(&ps, "hosts/w1.log");
    fprintf(stderr, "netns: median lag behind the step's first push: rank %d (300 Mbit/s link) "
                    "%.1f ms, rank %d %.1f ms\n", slow, med[slow], 1 - slow, med[1 - slow]);
    ck_assert_msg(med[slow] > med[1 - slow], "the worker behind the slow link is not the late one");

    zps_model_spec spec;
    ck_assert_int_eq(zps_model_parse(MODEL, &spec), ZPS_OK);
    const char *outs[] = {"hosts/w0.bin", "hosts/w1.bin"};
    for (int k = 0; k < 2; k++) {
        double d = zps_procs_params_diff(&ps, "ref.bin", outs[k], spec.n_params);
        fprintf(stderr, "netns: max |single process - %s| = %.3g\n", outs[k], d);
        ck_assert_double_le(d, 1e-4);
    }
    zps_procs_fini(&ps, false);
}
END_TEST

// --sndbuf auto on shared links: every link at 100 Mbit/s, so each
// worker's link carries its flows to both shards and each shard's link
// the flows of both workers; the connections between hosts show a
// standing queue and each daemon takes over their send buffers (one log
// line a connection), and the run ends with both workers equal.
START_TEST(test_netns_sndbuf_auto_tunes_connections_between_hosts)
{
    zps_procs ps;
    zps_procs_init(&ps, "netns-sndbuf");
    const char *why = s_cannot_run(&ps);
    if (why) {
        fprintf(stderr, "SKIPPED: test_netns_sndbuf_auto_tunes_connections_between_hosts: %s\n",
                why);
        zps_procs_fini(&ps, false);
        return;
    }
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "deploy/netns-cluster.sh -s 2 -w 2 -r 100mbit -o %s/hosts -t 150 -- "
             "--model flat:1048576 --dataset synthetic:1024 --global-batch 16 --steps 8 "
             "--lr-schedule constant",
             ps.dir);
    ck_assert_msg(zps_procs_sh(&ps, cmd, "netns.log", 200000) == 0,
                  "the emulated cluster failed; see %s/netns.log and %s/hosts", ps.dir, ps.dir);
    const char *logs[] = {"hosts/s0.log", "hosts/s1.log", "hosts/w0.log", "hosts/w1.log"};
    for (size_t i = 0; i < sizeof logs / sizeof logs[0]; i++) {
        ck_assert_msg(zps_procs_log_has(&ps, logs[i], "sndbuf auto: to 10."),
                      "%s: no connection to another host got a tuned send buffer", logs[i]);
    }
    double d = zps_procs_params_diff(&ps, "hosts/w0.bin", "hosts/w1.bin", 1048576);
    ck_assert_double_eq(d, 0);
    zps_procs_fini(&ps, false);
}
END_TEST

Suite *zps_suite_netns(void)
{
    Suite *s = suite_create("netns");
    TCase *tc = tcase_create("hosts");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_netns_hosts_with_a_slow_link_train_equal_and_report_lag);
    tcase_add_test(tc, test_netns_sndbuf_auto_tunes_connections_between_hosts);
    suite_add_tcase(s, tc);
    return s;
}
