/* zps_pool.c - a fork-join pool of threads for a shard's element-wise work. */
#include "zps_pool.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/zps_log.h"

// How long a join waits before it says what it waits for (then it waits
// on: the ranges are finite work, and the result is needed).
#define ZPS_POOL_WARN_S 10

// Ranges a job is cut into per thread: enough that the threads that run
// take the share of one that does not, few enough that taking one (a lock)
// costs nothing beside it.
#define ZPS_POOL_RANGES_PER_THREAD 4
// No range is shorter than this many elements (but the last).
#define ZPS_POOL_MIN_RANGE 4096

struct zps_pool {
    pthread_t ids[ZPS_POOL_MAX];
    int started;               // threads started (threads - 1 when all went well)
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t round;            // bumped for each job
    bool stop;
    zps_pool_fn fn;            // the job of this round
    void *arg;
    size_t n, chunk;           // elements, and each range's length
    size_t ranges, next;       // the job's ranges, and the next one not taken
    size_t finished;           // ranges done
};

typedef struct s_start {
    zps_pool *p;
    int thread;
} s_start;

// Takes and runs the round's ranges until none is left; called and
// returns with mu held. A thread that comes late to a round, or wakes for
// one that is over, finds none.
static void s_work(zps_pool *p, int thread)
{
    while (p->next < p->ranges) {
        size_t lo = p->next++ * p->chunk;
        size_t hi = lo + p->chunk < p->n ? lo + p->chunk : p->n;
        zps_pool_fn fn = p->fn;
        void *arg = p->arg;
        pthread_mutex_unlock(&p->mu);
        fn(arg, lo, hi, thread);
        pthread_mutex_lock(&p->mu);
        if (++p->finished == p->ranges) {
            pthread_cond_signal(&p->done);
        }
    }
}

static void *s_main(void *v)
{
    s_start *st = v;
    zps_pool *p = st->p;
    int thread = st->thread;
    free(st);
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->round == seen) {
            pthread_cond_wait(&p->go, &p->mu); // idle between jobs: no timeout to keep
        }
        if (p->stop) {
            break;
        }
        seen = p->round;
        s_work(p, thread);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

zps_pool *zps_pool_new(int threads)
{
    zps_pool *p = calloc(1, sizeof *p);
    if (!p || threads < 1 || threads > ZPS_POOL_MAX) {
        zps_log_error("shard threads: cannot make a pool of %d", threads);
        free(p);
        return NULL;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    for (int i = 1; i < threads; i++) {
        s_start *st = malloc(sizeof *st);
        if (st) {
            *st = (s_start){.p = p, .thread = i};
        }
        int rc = st ? pthread_create(&p->ids[i], NULL, s_main, st) : ENOMEM;
        if (rc != 0) {
            free(st);
            zps_log_error("shard threads: cannot start thread %d of %d", i, threads);
            zps_pool_destroy(&p);
            return NULL;
        }
        p->started++;
    }
    return p;
}

void zps_pool_destroy(zps_pool **pp)
{
    zps_pool *p = *pp;
    if (!p) {
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i <= p->started; i++) {
        pthread_join(p->ids[i], NULL);
    }
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    free(p);
    *pp = NULL;
}

int zps_pool_auto_threads(void)
{
    cpu_set_t set;
    int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    int quota = zps_pool_quota_cpus("/proc/self/cgroup", "/sys/fs/cgroup");
    n = quota > 0 && quota < n ? quota : n;
    return n < 1 ? 1 : n > ZPS_POOL_AUTO_MAX ? ZPS_POOL_AUTO_MAX : n;
}

// The first line of dir/name into buf; false if there is none.
static bool s_line(const char *dir, const char *name, char *buf, size_t len)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    bool ok = f && fgets(buf, (int)len, f) != NULL;
    if (f) {
        (void)fclose(f); // read only: nothing to lose
    }
    return ok;
}

// The integer at the start of s (-1 if none), and where it ends.
static long long s_int(const char *s, char **end)
{
    long long v = strtoll(s, end, 10);
    return *end == s ? -1 : v;
}

// The CPUs the quota in dir allows (v2's cpu.max, else v1's two files),
// rounded up; 0 for none or nothing readable.
static int s_quota_in(const char *dir)
{
    char line[64], *end;
    long long quota = -1, period = 0;
    if (s_line(dir, "cpu.max", line, sizeof line)) {
        quota = s_int(line, &end); // "max PERIOD": none
        period = quota > 0 ? s_int(end, &end) : 0;
    } else if (s_line(dir, "cpu.cfs_quota_us", line, sizeof line)) {
        quota = s_int(line, &end);
        period = s_line(dir, "cpu.cfs_period_us", line, sizeof line) ? s_int(line, &end) : 0;
    }
    if (quota <= 0 || period <= 0) {
        return 0;
    }
    long long cpus = quota / period + (quota % period != 0); // rounded up, never overflowing
    return cpus > INT_MAX ? INT_MAX : (int)cpus;
}

// The smaller of two quotas in CPUs, 0 meaning none.
static int s_least(int a, int b)
{
    return a > 0 && (b <= 0 || a < b) ? a : b;
}

// The least quota of the cgroup at root/path and those above it. Where a
// container sees its own cgroup at root but the host's path in proc, the
// paths below root are missing and root's own file counts.
static int s_quota_up(const char *root, char *path)
{
    int least = 0;
    for (;;) {
        char dir[PATH_MAX];
        if (snprintf(dir, sizeof dir, "%s%s", root, path) < (int)sizeof dir) {
            least = s_least(s_quota_in(dir), least);
        }
        char *slash = strrchr(path, '/');
        if (!slash || slash == path) {
            break;
        }
        *slash = '\0';
    }
    if (path[0] == '/' && path[1]) {
        least = s_least(s_quota_in(root), least); // the root itself
    }
    return least;
}

int zps_pool_quota_cpus(const char *proc, const char *root)
{
    FILE *f = fopen(proc, "r");
    char line[PATH_MAX + 128];
    int least = 0;
    while (f && fgets(line, sizeof line, f)) {
        // "ID:CONTROLLERS:PATH": v2 is "0::PATH", v1's cpu is a list holding "cpu".
        char *ctl = strchr(line, ':'), *path = ctl ? strchr(ctl + 1, ':') : NULL;
        if (!path) {
            continue;
        }
        *path++ = '\0';
        path[strcspn(path, "\n")] = '\0';
        ctl++;
        char base[PATH_MAX];
        bool v1cpu = false;
        for (char *c = ctl, *save = NULL, *tok; (tok = strtok_r(c, ",", &save)); c = NULL) {
            v1cpu = v1cpu || strcmp(tok, "cpu") == 0;
        }
        if (!ctl[0]) {
            snprintf(base, sizeof base, "%s", root);
        } else if (v1cpu) {
            snprintf(base, sizeof base, "%s/cpu", root); // "cpu,cpuacct" is mounted there too
        } else {
            continue;
        }
        least = s_least(s_quota_up(base, path), least);
    }
    if (f) {
        (void)fclose(f); // read only: nothing to lose
    }
    return least;
}

// Waits for the ranges other threads took (all are taken by now), saying
// what it waits for every ZPS_POOL_WARN_S; called with mu held.
static void s_join(zps_pool *p)
{
    while (p->finished < p->ranges) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += ZPS_POOL_WARN_S;
        if (pthread_cond_timedwait(&p->done, &p->mu, &until) == ETIMEDOUT) {
            zps_log_warn("shard threads: waiting %d s for %zu of %zu ranges to be finished by "
                         "the other threads", ZPS_POOL_WARN_S, p->ranges - p->finished,
                         p->ranges);
        }
    }
}

void zps_pool_for(zps_pool *p, size_t n, size_t align, zps_pool_fn fn, void *arg)
{
    if (!p || p->started == 0 || n < ZPS_POOL_MIN_SPLIT) {
        if (n > 0) {
            fn(arg, 0, n, 0);
        }
        return;
    }
    size_t ranges = (size_t)(p->started + 1) * ZPS_POOL_RANGES_PER_THREAD;
    size_t chunk = (n + ranges - 1) / ranges;
    chunk = chunk < ZPS_POOL_MIN_RANGE ? ZPS_POOL_MIN_RANGE : chunk;
    chunk = (chunk + align - 1) / align * align;
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    p->chunk = chunk;
    p->ranges = (n + chunk - 1) / chunk;
    p->next = 0;
    p->finished = 0;
    p->round++;
    pthread_cond_broadcast(&p->go);
    s_work(p, 0);
    s_join(p);
    pthread_mutex_unlock(&p->mu);
}
