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

// A zps_clock_wall_ms time as "2026-12-02 16:21:38 UTC" ("?" if it cannot
// be told), for logs and zps-ctl.
#define ZPS_CLOCK_UTC_LEN 32
static inline void zps_clock_utc(uint64_t unix_ms, char out[ZPS_CLOCK_UTC_LEN])
{
    time_t t = (time_t)(unix_ms / 1000u);
    struct tm tm;
    if (!gmtime_r(&t, &tm) || !strftime(out, ZPS_CLOCK_UTC_LEN, "%Y-%m-%d %H:%M:%S UTC", &tm)) {
        out[0] = '?';
        out[1] = '\0';
    }
}

#endif
