/* check_http.c - zps-server --http: /metrics passes promtool's checks,
 * /status is JSON and names the slowed worker a straggler. */
#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/zps_clock.h"
#include "zps_integration.h"
#include "zps_proc.h"

// GET path from 127.0.0.1:port; returns the body (caller frees) or NULL.
static char *s_get(int port, const char *path)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (fd >= 0) {
            close(fd);
        }
        return NULL;
    }
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n", path);
    ck_assert_int_eq(write(fd, req, (size_t)n), n);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    ssize_t r;
    while ((r = read(fd, buf + len, cap - len - 1)) > 0) {
        len += (size_t)r;
        if (len + 1 == cap) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
    }
    close(fd);
    buf[len] = '\0';
    char *body = strstr(buf, "\r\n\r\n");
    if (!body || !strstr(buf, " 200 ")) {
        free(buf);
        return NULL;
    }
    memmove(buf, body + 4, strlen(body + 4) + 1);
    return buf;
}

static pid_t s_worker(zps_procs *ps, const char *ep, const char *log, const char *slow)
{
    const char *args[] = {"--coordinator", ep, "--cache-dir", ZPS_TEST_CACHE,
                          slow ? "--slowdown" : NULL, slow, NULL};
    return zps_procs_start(ps, "zps-worker", log, args);
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
    double deadline = zps_clock_ms() + 60000;
    while (!flagged && zps_clock_ms() < deadline) {
        char *body = s_get(port, "/status");
        json_error_t jerr;
        json_t *st = body && body[0] ? json_loads(body, 0, &jerr) : NULL;
        if (st) {
            parsed = true;
            ck_assert(json_is_string(json_object_get(st, "state")));
            size_t i;
            json_t *m;
            json_array_foreach(json_object_get(st, "members"), i, m)
            {
                flagged = flagged || (json_is_true(json_object_get(m, "straggler")) &&
                                      json_integer_value(json_object_get(m, "pid")) == slow);
            }
            json_decref(st);
        }
        free(body);
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    ck_assert_msg(parsed, "/status never answered with JSON");
    ck_assert_msg(flagged, "/status did not flag the slowed worker");

    // /metrics: Prometheus text that promtool accepts, a series per worker.
    char *metrics = s_get(port, "/metrics");
    ck_assert_ptr_nonnull(metrics);
    ck_assert_ptr_nonnull(strstr(metrics, "zps_worker_lag_seconds{rank=\"0\""));
    ck_assert_ptr_nonnull(strstr(metrics, "zps_worker_lag_seconds{rank=\"1\""));
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

Suite *zps_suite_http(void)
{
    Suite *s = suite_create("http");
    TCase *tc = tcase_create("monitoring");
    tcase_set_timeout(tc, 180);
    tcase_add_test(tc, test_http_metrics_pass_promtool_and_status_names_the_straggler);
    suite_add_tcase(s, tc);
    return s;
}
