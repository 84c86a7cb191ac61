/* check_pool.c - the shard's fork-join pool (server/shard/zps_pool.c): every
 * element computed once, ranges cut where the caller asked, and a thread
 * that does not run holds nobody up (the others take its ranges); --threads
 * auto's count of the cores, and of a cgroup's CPU quota (read from a tree
 * of files laid out as the kernel's). */
#include <check.h>
#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "server/shard/zps_pool.h"
#include "tests/zps_check.h"
#include "tests/zps_tmpdir.h"

// Counts how often each element was computed, and checks each range's
// start against the alignment asked for.
typedef struct s_count_job {
    _Atomic uint32_t *seen;
    size_t align;
    _Atomic int misaligned;
    _Atomic int bad_thread;
    int threads;
} s_count_job;

static void s_count(void *arg, size_t lo, size_t hi, int thread)
{
    s_count_job *j = arg;
    if (lo % j->align != 0) {
        j->misaligned++;
    }
    if (thread < 0 || thread >= j->threads) {
        j->bad_thread++;
    }
    for (size_t i = lo; i < hi; i++) {
        j->seen[i]++;
    }
}

START_TEST(test_pool_computes_every_element_once_for_any_size_and_threads)
{
    const size_t sizes[] = {1, 1000, ZPS_POOL_MIN_SPLIT - 1, ZPS_POOL_MIN_SPLIT,
                            ZPS_POOL_MIN_SPLIT + 1, 300001, 401920};
    const size_t aligns[] = {1, 2048};
    const int threads[] = {1, 2, 3, 7};
    _Atomic uint32_t *seen = calloc(401920, sizeof *seen);
    ck_assert_ptr_nonnull(seen);
    for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
        zps_pool *p = zps_pool_new(threads[t]);
        ck_assert_ptr_nonnull(p);
        for (size_t n = 0; n < sizeof sizes / sizeof sizes[0]; n++) {
            for (size_t a = 0; a < sizeof aligns / sizeof aligns[0]; a++) {
                for (size_t i = 0; i < sizes[n]; i++) {
                    seen[i] = 0;
                }
                s_count_job j = {.seen = seen, .align = aligns[a], .threads = threads[t]};
                zps_pool_for(p, sizes[n], aligns[a], s_count, &j);
                size_t wrong = 0;
                for (size_t i = 0; i < sizes[n]; i++) {
                    wrong += seen[i] != 1;
                }
                ck_assert_msg(wrong == 0, "%d threads, n %zu: %zu elements not computed once",
                              threads[t], sizes[n], wrong);
                ck_assert_int_eq(j.misaligned, 0);
                ck_assert_int_eq(j.bad_thread, 0);
            }
        }
        zps_pool_destroy(&p);
        ck_assert_ptr_null(p);
    }
    free(seen);
}
END_TEST

// A helper thread that stops in its first range until the caller has done
// every other range (or 10 s pass): with ranges taken as threads come, the
// caller gets there; had each thread its fixed share, it never would.
typedef struct s_stall_job {
    size_t ranges;             // in the job (as the caller counts them)
    _Atomic size_t by_caller;  // ranges the caller ran
    _Atomic int stalled;       // helpers that waited
    _Atomic int timed_out;
} s_stall_job;

static void s_stall(void *arg, size_t lo, size_t hi, int thread)
{
    (void)lo;
    (void)hi;
    s_stall_job *j = arg;
    if (thread == 0) {
        j->by_caller++;
        return;
    }
    j->stalled++;
    struct timespec start, now, nap = {0, 1000000};
    clock_gettime(CLOCK_MONOTONIC, &start);
    while (j->by_caller < j->ranges - j->stalled) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - start.tv_sec > 10) {
            j->timed_out++;
            return;
        }
        nanosleep(&nap, NULL);
    }
}

static void s_ranges(void *arg, size_t lo, size_t hi, int thread)
{
    (void)lo;
    (void)hi;
    (void)thread;
    (*(_Atomic size_t *)arg)++;
}

START_TEST(test_pool_caller_takes_the_ranges_of_a_thread_that_does_not_run)
{
    zps_pool *p = zps_pool_new(2);
    ck_assert_ptr_nonnull(p);
    size_t n = 1u << 20;
    _Atomic size_t ranges = 0;
    zps_pool_for(p, n, 1, s_ranges, &ranges);
    ck_assert_uint_ge(ranges, 4); // a few a thread, for the others to take
    s_stall_job j = {.ranges = ranges};
    zps_pool_for(p, n, 1, s_stall, &j);
    ck_assert_int_eq(j.timed_out, 0);
    ck_assert_uint_ge(j.by_caller, j.ranges - 1);
    zps_pool_destroy(&p);
}
END_TEST

// auto counts the cores this process may run on (its affinity, as taskset
// or a container's cpuset sets it), fewer if its cgroup's quota allows
// fewer, up to the cap.
START_TEST(test_pool_auto_threads_counts_the_cores_it_may_run_on)
{
    cpu_set_t all, one;
    ck_assert_int_eq(sched_getaffinity(0, sizeof all, &all), 0);
    int n = zps_pool_auto_threads();
    int cores = CPU_COUNT(&all);
    int quota = zps_pool_quota_cpus("/proc/self/cgroup", "/sys/fs/cgroup");
    cores = quota > 0 && quota < cores ? quota : cores;
    ck_assert_int_eq(n, cores < ZPS_POOL_AUTO_MAX ? cores : ZPS_POOL_AUTO_MAX);
    int first = 0;
    while (!CPU_ISSET(first, &all)) {
        first++;
    }
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    ck_assert_int_eq(sched_setaffinity(0, sizeof one, &one), 0);
    ck_assert_int_eq(zps_pool_auto_threads(), 1);
    ck_assert_int_eq(sched_setaffinity(0, sizeof all, &all), 0);
}
END_TEST

// Writes text to dir/name, making the directories on the way.
static void s_put(const char *dir, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    for (char *c = path + strlen(dir) + 1; *c; c++) {
        if (*c == '/') {
            *c = '\0';
            ck_assert(mkdir(path, 0700) == 0 || errno == EEXIST);
            *c = '/';
        }
    }
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_ge(fputs(text, f), 0);
    ck_assert_int_eq(fclose(f), 0);
}

static int s_quota(const char *dir, const char *proc)
{
    char file[512];
    s_put(dir, "self-cgroup", proc);
    snprintf(file, sizeof file, "%s/self-cgroup", dir);
    return zps_pool_quota_cpus(file, dir);
}

// A quota is rounded up to whole CPUs, the least of a cgroup's and its
// parents' counts, "max" and -1 are none, and a path the mount does not
// hold (a container that sees its own cgroup at the root) falls back to
// the root's.
START_TEST(test_pool_quota_counts_the_cpus_a_cgroup_allows)
{
    char dir[256];
    zps_tmpdir_make(dir, sizeof dir, "pool-quota");
    // cgroup v2: 1.5 CPUs below a parent with none.
    s_put(dir, "cpu.max", "max 100000\n");
    s_put(dir, "a/cpu.max", "max 100000\n");
    s_put(dir, "a/b/cpu.max", "150000 100000\n");
    ck_assert_int_eq(s_quota(dir, "0::/a/b\n"), 2);
    // A parent's smaller quota wins.
    s_put(dir, "a/cpu.max", "50000 100000\n");
    ck_assert_int_eq(s_quota(dir, "0::/a/b\n"), 1);
    // No quota anywhere.
    s_put(dir, "a/cpu.max", "max 100000\n");
    s_put(dir, "a/b/cpu.max", "max 100000\n");
    ck_assert_int_eq(s_quota(dir, "0::/a/b\n"), 0);
    // A host's path the mount does not have: the root's own quota.
    s_put(dir, "cpu.max", "300000 100000\n");
    ck_assert_int_eq(s_quota(dir, "0::/docker/1234\n"), 3);
    // cgroup v1: the cpu hierarchy's files; other controllers' lines ignored.
    s_put(dir, "cpu/x/cpu.cfs_quota_us", "250000\n");
    s_put(dir, "cpu/x/cpu.cfs_period_us", "100000\n");
    s_put(dir, "cpu/cpu.cfs_quota_us", "-1\n");
    s_put(dir, "cpu/cpu.cfs_period_us", "100000\n");
    ck_assert_int_eq(s_quota(dir, "5:memory:/x\n4:cpu,cpuacct:/x\n"), 3);
    s_put(dir, "cpu/x/cpu.cfs_quota_us", "-1\n");
    ck_assert_int_eq(s_quota(dir, "4:cpu,cpuacct:/x\n"), 0);
    // No such list: none.
    ck_assert_int_eq(zps_pool_quota_cpus("/nonexistent/cgroup", dir), 0);
    ck_assert_int_eq(zps_tmpdir_remove(dir), 0);
}
END_TEST

Suite *zps_suite_pool(void)
{
    Suite *s = suite_create("pool");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_pool_computes_every_element_once_for_any_size_and_threads);
    tcase_add_test(tc, test_pool_caller_takes_the_ranges_of_a_thread_that_does_not_run);
    tcase_add_test(tc, test_pool_auto_threads_counts_the_cores_it_may_run_on);
    tcase_add_test(tc, test_pool_quota_counts_the_cpus_a_cgroup_allows);
    suite_add_tcase(s, tc);
    return s;
}
