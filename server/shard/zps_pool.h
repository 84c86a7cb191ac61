/* zps_pool.h - a shard's threads: element-wise work split over ranges.
 *
 * zps_pool_for(p, n, ...) cuts [0, n) into one contiguous range per
 * thread (the caller's thread takes the first) and returns once every
 * range is done. Element-wise work, each element computed the same way
 * whoever computes it, gives the same bits for any number of threads
 * (zps-server --threads). Small jobs run inline: waking threads costs
 * more than a few thousand elements. */
#ifndef ZPS_POOL_H
#define ZPS_POOL_H

#include <stddef.h>

// Below this many elements zps_pool_for runs fn once, in the caller.
#define ZPS_POOL_MIN_SPLIT 16384

typedef struct zps_pool zps_pool;

// fn computes elements [lo, hi) of a job; `thread` (0 .. threads - 1)
// names its caller, for per-thread scratch.
typedef void (*zps_pool_fn)(void *arg, size_t lo, size_t hi, int thread);

// A pool of `threads` (1 .. ZPS_POOL_MAX, the caller included: threads - 1
// are started). NULL on failure, logged.
#define ZPS_POOL_MAX 64
zps_pool *zps_pool_new(int threads);
// Stops and joins the threads.
void zps_pool_destroy(zps_pool **p);

// Runs fn over [0, n), each range's length a multiple of `align` but the
// last (align >= 1), and waits for all of them.
void zps_pool_for(zps_pool *p, size_t n, size_t align, zps_pool_fn fn, void *arg);

#endif
