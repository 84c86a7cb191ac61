/* zps_pool.c - a fork-join pool of threads for a shard's element-wise work. */
#include "zps_pool.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "common/zps_log.h"

// How long a join waits before it says what it waits for (then it waits
// on: the ranges are finite work, and the result is needed).
#define ZPS_POOL_WARN_S 10

struct zps_pool {
    int threads;               // the caller included
    pthread_t ids[ZPS_POOL_MAX];
    int started;               // threads started (threads - 1 when all went well)
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t round;            // bumped for each job; a thread runs each round once
    bool stop;
    zps_pool_fn fn;            // the job of this round
    void *arg;
    size_t n, chunk;           // elements, and each range's length
    int pending;               // ranges of this round not done yet
};

typedef struct s_start {
    zps_pool *p;
    int thread;
} s_start;

static void s_run(zps_pool *p, int thread)
{
    size_t lo = (size_t)thread * p->chunk;
    size_t hi = lo + p->chunk < p->n ? lo + p->chunk : p->n;
    if (lo < hi) {
        p->fn(p->arg, lo, hi, thread);
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
        pthread_mutex_unlock(&p->mu);
        s_run(p, thread);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) {
            pthread_cond_signal(&p->done);
        }
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
    p->threads = threads;
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

// Waits for the other threads' ranges of this round, saying what it waits
// for every ZPS_POOL_WARN_S.
static void s_join(zps_pool *p)
{
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += ZPS_POOL_WARN_S;
        if (pthread_cond_timedwait(&p->done, &p->mu, &until) == ETIMEDOUT) {
            zps_log_warn("shard threads: waiting %d s for %d of %d threads to finish their "
                         "ranges", ZPS_POOL_WARN_S, p->pending, p->threads);
        }
    }
    pthread_mutex_unlock(&p->mu);
}

void zps_pool_for(zps_pool *p, size_t n, size_t align, zps_pool_fn fn, void *arg)
{
    if (!p || p->started == 0 || n < ZPS_POOL_MIN_SPLIT) {
        if (n > 0) {
            fn(arg, 0, n, 0);
        }
        return;
    }
    int t = p->started + 1;
    size_t chunk = (n + (size_t)t - 1) / (size_t)t;
    chunk = (chunk + align - 1) / align * align;
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    p->chunk = chunk;
    p->pending = p->started;
    p->round++;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    s_run(p, 0);
    s_join(p);
}
