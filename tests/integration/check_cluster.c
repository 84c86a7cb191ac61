/* check_cluster.c - deploy/local-cluster.sh starts a 2-shard, 2-worker
 * cluster that trains, reports it, and stops it leaving no process behind. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/zps_clock.h"
#include "zps_integration.h"
#include "zps_proc.h"

static const char *const s_names[] = {"server-0", "server-1", "worker-0", "worker-1"};

static pid_t s_read_pid(zps_procs *ps, const char *name)
{
    char rel[64];
    snprintf(rel, sizeof rel, "run/pids/%s.pid", name);
    FILE *f = fopen(zps_procs_path(ps, rel), "r");
    ck_assert_msg(f != NULL, "no pid file for %s", name);
    int pid = 0;
    ck_assert_int_eq(fscanf(f, "%d", &pid), 1);
    fclose(f);
    return (pid_t)pid;
}

static bool s_file_has(zps_procs *ps, const char *name, const char *text)
{
    FILE *f = fopen(zps_procs_path(ps, name), "r");
    if (!f) {
        return false;
    }
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, text) != NULL;
}

START_TEST(test_cluster_launcher_starts_and_stops_two_shards_two_workers)
{
    zps_procs ps;
    zps_procs_init(&ps, "cluster");
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "ZPS_WORKER_FLAGS='--cache-dir %s' deploy/local-cluster.sh start -s 2 -w 2 -d %s/run"
             " -- --steps 1000000 --global-batch 64",
             ZPS_TEST_CACHE, ps.dir);
    ck_assert_int_eq(zps_procs_sh(&ps, cmd, "start.out", 30000), 0);
    pid_t pids[4];
    for (int i = 0; i < 4; i++) {
        pids[i] = s_read_pid(&ps, s_names[i]);
        zps_procs_adopt(&ps, pids[i]);
    }
    // Training reaches the coordinator's status within a bounded time.
    snprintf(cmd, sizeof cmd, "deploy/local-cluster.sh status -d %s/run", ps.dir);
    double deadline = zps_clock_ms() + 30000;
    bool training = false;
    while (!training && zps_clock_ms() < deadline) {
        remove(zps_procs_path(&ps, "status.out"));
        ck_assert_int_eq(zps_procs_sh(&ps, cmd, "status.out", 10000), 0);
        training = s_file_has(&ps, "status.out", "training") &&
                   s_file_has(&ps, "status.out", "members 2 of 2");
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    ck_assert_msg(training, "the cluster did not report training within 30 s");
    for (int i = 0; i < 4; i++) {
        ck_assert_msg(s_file_has(&ps, "status.out", s_names[i]), "status omits %s", s_names[i]);
        ck_assert_msg(zps_proc_alive(pids[i]), "%s is not running", s_names[i]);
    }
    snprintf(cmd, sizeof cmd, "deploy/local-cluster.sh stop -d %s/run", ps.dir);
    ck_assert_int_eq(zps_procs_sh(&ps, cmd, "stop.out", 30000), 0);
    for (int i = 0; i < 4; i++) {
        ck_assert_msg(!zps_proc_alive(pids[i]), "%s (pid %d) survived stop", s_names[i],
                      (int)pids[i]);
    }
    zps_procs_fini(&ps, false);
}
END_TEST

Suite *zps_suite_cluster(void)
{
    Suite *s = suite_create("cluster");
    TCase *tc = tcase_create("launcher");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_cluster_launcher_starts_and_stops_two_shards_two_workers);
    suite_add_tcase(s, tc);
    return s;
}
