/* zps_clock.h - monotonic time for timeouts and step timings, and the wall
 * clock for what must mean the same across restarts (a job's first start). */
#ifndef ZPS_CLOCK_H
#define ZPS_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline double zps_clock_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

// Milliseconds since the epoch (CLOCK_REALTIME): may jump; never for a duration
// within one process, only for one across processes.
static inline uint64_t zps_clock_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

#endif
