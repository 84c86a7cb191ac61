/* zps_timers.h - a loop's timer table: named timers, each with a period
 * or a one-off deadline and a callback. The earliest deadline sets the
 * loop's poll timeout, so a deadline is met when it falls due, not when
 * some other check (or a log line's rate limit) next looks at the clock.
 * Both loops run on one: the server's (server/zps_server.c) and libzps's
 * wait for parameters (lib/zps_wait.c).
 *
 * The table knows no clock of its own: the caller passes `now` (ms, any
 * monotonic origin), so a test drives it with a clock of its own. A table
 * is embedded storage (zps_timers_init, nothing to free). */
#ifndef ZPS_TIMERS_H
#define ZPS_TIMERS_H

#include <stdbool.h>

#define ZPS_TIMERS_MAX 16 // timers a table holds

// What a timer calls when due, with the `now` zps_timers_run was given.
typedef void (*zps_timer_fn)(void *arg, double now_ms);

typedef struct zps_timer {
    const char *name;   // borrowed: for logs and tests
    double period_ms;   // > 0: fires every period; 0: a deadline, fires once
    double due_ms;      // next firing; disarmed while `armed` is false
    bool armed;         // due_ms holds
    zps_timer_fn fn;    // what it calls
    void *arg;          // borrowed: fn's argument
} zps_timer;

typedef struct zps_timers {
    zps_timer t[ZPS_TIMERS_MAX]; // in the order added
    int n;                       // timers added
} zps_timers;

// zps_timers_init empties a table.
void zps_timers_init(zps_timers *ts);
// zps_timers_add adds a timer, disarmed, and returns its id (>= 0), or -1
// when the table is full. A period of 0 makes it a deadline timer.
int zps_timers_add(zps_timers *ts, const char *name, double period_ms, zps_timer_fn fn,
                   void *arg);
// zps_timers_at arms timer `id` to fire at `due_ms` (then, if periodic,
// every period after it). A callback may re-arm its own timer.
void zps_timers_at(zps_timers *ts, int id, double due_ms);
// zps_timers_set_period changes a periodic timer's period from its next firing on.
void zps_timers_set_period(zps_timers *ts, int id, double period_ms);
// zps_timers_cancel disarms timer `id`.
void zps_timers_cancel(zps_timers *ts, int id);
// zps_timers_armed says whether timer `id` is armed.
bool zps_timers_armed(const zps_timers *ts, int id);
// zps_timers_next_ms is the time from `now` to the earliest deadline, in
// whole ms rounded up, between 0 and max_ms (max_ms with none armed): the
// poll timeout, bounded so that the loop still sees signals.
long zps_timers_next_ms(const zps_timers *ts, double now_ms, long max_ms);
// zps_timers_run fires every timer due at `now`, each once, in the order
// added; a periodic one that fell behind by several periods fires once and
// is next due a period after now. Returns how many fired.
int zps_timers_run(zps_timers *ts, double now_ms);

#endif
