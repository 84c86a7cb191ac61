/* check_http.c - zps-server --http: /metrics passes promtool's checks,
 * /status is JSON and names the slowed worker a straggler; every shard
 * answers the supervisor's probes /healthz and /readyz. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/zps_clock.h"
#include "zps_http_get.h"
#include "zps_integration.h"
#include "zps_proc.h"

static pid_t s_worker(zps_procs *ps, const char *ep, const char *log, const char *slow)
{
    const char *args[] = {"--coordinator", ep, "--cache-dir", ZPS_TEST_CACHE,
                          slow ? "--slowdown" : NULL, slow, NULL};
    return zps_procs_start(ps, "zps-worker", log, args);
}

// The flag /status shows for the slowed worker (rank, pid) is the one of
// /metrics, zps-ctl top and the log: one detector, four views of it.
static void s_check_flag_agrees(zps_procs *ps, const char *ep, const char *metrics, int rank,
                                pid_t pid)
{
    char want[96];
    const char *line = strstr(metrics, "zps_worker_straggler{rank=\"");
    for (; line; line = strstr(line + 1, "zps_worker_straggler{rank=\"")) {
        int r;
        const char *value = strstr(line, "} ");
        if (sscanf(line, "zps_worker_straggler{rank=\"%d\"", &r) == 1 && value) {
            ck_assert_msg(atof(value + 2) == (r == rank ? 1.0 : 0.0),
                          "/metrics: rank %d's zps_worker_straggler is %s", r, value + 2);
        }
    }
    const char *args[] = {"top", ep, "--iterations", "1", NULL};
    pid_t ctl = zps_procs_start(ps, "zps-ctl", "top.out", args);
    ck_assert_int_eq(zps_procs_wait(ps, ctl, 10000), 0);
    snprintf(want, sizeof want, " %u  STRAGGLER", (unsigned)pid);
    ck_assert_msg(zps_procs_log_has(ps, "top.out", want), "zps-ctl top lacks '%s'", want);
    ck_assert_int_eq(zps_procs_log_count(ps, "top.out", "STRAGGLER"), 1);
    snprintf(want, sizeof want, "rank %d is a straggler", rank);
    ck_assert_msg(zps_procs_log_has(ps, "server.log", want), "the server log lacks '%s'", want);
}

START_TEST(test_http_metrics_pass_promtool_and_status_names_the_straggler)
{
    zps_procs ps;
    zps_procs_init(&ps, "http");
    int port = zps_free_port();
    char http[64];
    snprintf(http, sizeof http, "127.0.0.1:%d", port);
    const char *args[] = {"--workers", "2", "--global-batch", "64", "--steps", "300", "--http",
                          http, NULL};
    pid_t server;
    char ep[256];
    snprintf(ep, sizeof ep, "%s", zps_procs_start_server(&ps, "server", &server, args, 10000));
    pid_t slow = s_worker(&ps, ep, "slow.log", "8");
    pid_t fast = s_worker(&ps, ep, "fast.log", NULL);

    // /status: JSON, and the slowed worker flagged within a bounded wait.
    bool flagged = false, parsed = false;
    json_int_t slow_rank = -1;
    double deadline = zps_clock_ms() + 60000;
    while (!flagged && zps_clock_ms() < deadline) {
        char *body = zps_http_get(port, "/status");
        json_error_t jerr;
        json_t *st = body && body[0] ? json_loads(body, 0, &jerr) : NULL;
        if (st) {
            parsed = true;
            ck_assert(json_is_string(json_object_get(st, "state")));
            // This start's figures: a first start trains from step 0.
            json_t *start = json_object_get(st, "start");
            ck_assert(json_is_object(start));
            ck_assert_int_eq(json_integer_value(json_object_get(start, "from_step")), 0);
            size_t i;
            json_t *m;
            json_array_foreach(json_object_get(st, "members"), i, m)
            {
                if (json_is_true(json_object_get(m, "straggler")) &&
                    json_integer_value(json_object_get(m, "pid")) == slow) {
                    flagged = true;
                    slow_rank = json_integer_value(json_object_get(m, "rank"));
                }
            }
            json_decref(st);
        }
        free(body);
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    ck_assert_msg(parsed, "/status never answered with JSON");
    ck_assert_msg(flagged, "/status did not flag the slowed worker");

    // /status?offset=&limit=: a page of the members, in rank order.
    char *page = zps_http_get(port, "/status?offset=1&limit=1");
    json_t *pst = page ? json_loads(page, 0, NULL) : NULL;
    ck_assert_msg(pst, "/status?offset=1&limit=1 is not JSON");
    ck_assert_int_eq(json_array_size(json_object_get(pst, "members")), 1);
    ck_assert_int_eq(
        json_integer_value(json_object_get(json_array_get(json_object_get(pst, "members"), 0),
                                           "rank")),
        1);
    ck_assert_int_eq(json_integer_value(json_object_get(pst, "members_total")), 2);
    json_decref(pst);
    free(page);

    // /metrics: Prometheus text that promtool accepts, a series per worker.
    char *metrics = zps_http_get(port, "/metrics");
    ck_assert_ptr_nonnull(metrics);
    ck_assert_ptr_nonnull(strstr(metrics, "zps_worker_lag_seconds{rank=\"0\""));
    ck_assert_ptr_nonnull(strstr(metrics, "zps_worker_lag_seconds{rank=\"1\""));
    s_check_flag_agrees(&ps, ep, metrics, (int)slow_rank, slow);
    FILE *f = fopen(zps_procs_path(&ps, "metrics.txt"), "w");
    fputs(metrics, f);
    fclose(f);
    free(metrics);
    if (access("/usr/bin/promtool", X_OK) == 0) {
        char cmd[700];
        snprintf(cmd, sizeof cmd, "/usr/bin/promtool check metrics < %s",
                 zps_procs_path(&ps, "metrics.txt"));
        ck_assert_msg(zps_procs_sh(&ps, cmd, "promtool.log", 30000) == 0,
                      "promtool check metrics failed; see %s/promtool.log", ps.dir);
    } else {
        fprintf(stderr, "SKIPPED: promtool check of /metrics: /usr/bin/promtool missing "
                        "(Debian package prometheus)\n");
    }
    ck_assert_int_eq(zps_procs_wait(&ps, slow, 120000), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, fast, 120000), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, server, 30000), 0);
    zps_procs_fini(&ps, false);
}
END_TEST

static bool s_eventually_ok(int port, const char *path, int timeout_ms)
{
    double deadline = zps_clock_ms() + timeout_ms;
    while (zps_clock_ms() < deadline) {
        char *body = zps_http_get(port, path);
        if (body) {
            free(body);
            return true;
        }
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return false;
}

// The probes of a supervisor on every shard: /healthz while the loop runs,
// /readyz once the coordinator has assigned the range. The shard
// advertises a name that is not the address it bound, and workers use it.
START_TEST(test_http_probes_on_every_shard_and_advertised_endpoint)
{
    zps_procs ps;
    zps_procs_init(&ps, "probes");
    int port0 = zps_free_port(), port1 = zps_free_port(), zport = zps_free_port();
    char http0[64], http1[64], listen0[64], listen1[64], adv1[64];
    snprintf(http0, sizeof http0, "127.0.0.1:%d", port0);
    snprintf(http1, sizeof http1, "127.0.0.1:%d", port1);
    snprintf(listen0, sizeof listen0, "tcp://127.0.0.1:%d", zport);
    snprintf(listen1, sizeof listen1, "tcp://0.0.0.0:%d", zps_free_port());
    snprintf(adv1, sizeof adv1, "tcp://localhost:%s", strrchr(listen1, ':') + 1);
    // Shard 1 first: alive, not ready, no coordinator's documents.
    const char *args1[] = {"--shard", "1", "--shards", "2", "--coordinator", listen0,
                           "--listen", listen1, "--advertise", adv1, "--http", http1, NULL};
    pid_t s1 = zps_procs_start(&ps, "zps-server", "shard1.log", args1);
    ck_assert_msg(s_eventually_ok(port1, "/healthz", 10000), "shard 1 /healthz never 200");
    char *body = zps_http_get(port1, "/readyz");
    ck_assert_msg(body == NULL, "shard 1 ready before it has a range");
    ck_assert_ptr_null(zps_http_get(port1, "/metrics"));
    const char *args0[] = {"--workers", "1", "--global-batch", "32", "--steps", "400",
                           "--model", "mlp:784-512-512-10", "--shards", "2", "--listen", listen0,
                           "--http", http0, NULL};
    pid_t s0 = zps_procs_start(&ps, "zps-server", "server.log", args0);
    ck_assert_msg(s_eventually_ok(port0, "/readyz", 5000), "shard 0 never ready");
    ck_assert_msg(s_eventually_ok(port0, "/healthz", 5000), "shard 0 /healthz never 200");
    // The ranges are assigned when the job starts, with its first worker.
    const char *wargs[] = {"--coordinator", listen0, "--cache-dir", ZPS_TEST_CACHE, NULL};
    pid_t w = zps_procs_start(&ps, "zps-worker", "worker.log", wargs);
    ck_assert_msg(s_eventually_ok(port1, "/readyz", 15000), "shard 1 never ready");
    ck_assert_int_eq(zps_procs_wait(&ps, w, 60000), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, s1, 30000), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, s0, 30000), 0);
    zps_procs_fini(&ps, false);
}
END_TEST

Suite *zps_suite_http(void)
{
    Suite *s = suite_create("http");
    TCase *tc = tcase_create("monitoring");
    tcase_set_timeout(tc, 180);
    tcase_add_test(tc, test_http_metrics_pass_promtool_and_status_names_the_straggler);
    tcase_add_test(tc, test_http_probes_on_every_shard_and_advertised_endpoint);
    suite_add_tcase(s, tc);
    return s;
}
