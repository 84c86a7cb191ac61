/* zps_clock.h - monotonic time for timeouts and step timings. */
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

#endif
