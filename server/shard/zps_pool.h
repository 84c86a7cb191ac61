/* zps_pool.h - a shard's threads: element-wise work split over ranges.
 *
 * zps_pool_for(p, n, ...) cuts [0, n) into a few contiguous ranges per
 * thread, and the threads, the caller's included, take the next range not
 * taken until none is left; it returns once every range is done. So a
 * thread the machine does not run (its core busy with a worker) holds
 * nothing up: the others, the caller at least, take its share. Element-wise
 * work, each element computed the same way whoever computes it, gives the
 * same bits for any number of threads (zps-server --threads). */
#ifndef ZPS_POOL_H
#define ZPS_POOL_H

#include <stddef.h>

// Below this many elements zps_pool_for runs fn once, in the caller: where
// the workers keep the cores busy, waking a thread for a smaller bucket
// cost more than it saved (docs/measurements.md, "Threads in a shard").
#define ZPS_POOL_MIN_SPLIT 131072

typedef struct zps_pool zps_pool;

// fn computes elements [lo, hi) of a job; `thread` (0 .. threads - 1, the
// caller 0) names its caller, for per-thread scratch. One thread may be
// handed several ranges of a job, one at a time.
typedef void (*zps_pool_fn)(void *arg, size_t lo, size_t hi, int thread);

// A pool of `threads` (1 .. ZPS_POOL_MAX, the caller included: threads - 1
// are started). NULL on failure, logged.
#define ZPS_POOL_MAX 64
zps_pool *zps_pool_new(int threads);
// Stops and joins the threads.
void zps_pool_destroy(zps_pool **p);

// zps-server --threads auto: the cores this process may run on, fewer if
// its cgroup's CPU quota allows fewer (a container's --cpus), at most
// ZPS_POOL_AUTO_MAX (the update is bound by memory: a few cores fill its
// bandwidth). On a shared machine the workers wait while their last bucket
// is updated, so the cores they leave idle then are there to take.
#define ZPS_POOL_AUTO_MAX 4
int zps_pool_auto_threads(void);
// The CPUs a cgroup quota allows the process, rounded up: cgroup v2's
// cpu.max ("QUOTA PERIOD"; "max": none) or v1's cpu.cfs_quota_us over
// cpu.cfs_period_us (-1: none), of its cgroup and of each one above it,
// the least of them; 0 if none is set or none can be read. proc is the
// process's cgroup list (/proc/self/cgroup), root where the hierarchies
// are mounted (/sys/fs/cgroup).
int zps_pool_quota_cpus(const char *proc, const char *root);

// Runs fn over [0, n), each range's length a multiple of `align` but the
// last (align >= 1), and waits for all of them.
void zps_pool_for(zps_pool *p, size_t n, size_t align, zps_pool_fn fn, void *arg);

#endif
