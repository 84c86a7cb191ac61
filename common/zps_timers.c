/* zps_timers.c - a loop's timer table (zps_timers.h). A handful
 * of timers, scanned in full: a heap would save nothing at this size. */
#include "common/zps_timers.h"

#include <math.h>
#include <stddef.h>

void zps_timers_init(zps_timers *ts)
{
    *ts = (zps_timers){.n = 0};
}

static zps_timer *s_timer(zps_timers *ts, int id)
{
    return id >= 0 && id < ts->n ? &ts->t[id] : NULL;
}

int zps_timers_add(zps_timers *ts, const char *name, double period_ms, zps_timer_fn fn,
                   void *arg)
{
    if (ts->n == ZPS_TIMERS_MAX || !fn || period_ms < 0) {
        return -1;
    }
    ts->t[ts->n] = (zps_timer){.name = name, .period_ms = period_ms, .fn = fn, .arg = arg};
    return ts->n++;
}

void zps_timers_at(zps_timers *ts, int id, double due_ms)
{
    zps_timer *t = s_timer(ts, id);
    if (t) {
        t->due_ms = due_ms;
        t->armed = true;
    }
}

void zps_timers_set_period(zps_timers *ts, int id, double period_ms)
{
    zps_timer *t = s_timer(ts, id);
    if (t && t->period_ms > 0 && period_ms > 0) {
        t->period_ms = period_ms;
    }
}

void zps_timers_cancel(zps_timers *ts, int id)
{
    zps_timer *t = s_timer(ts, id);
    if (t) {
        t->armed = false;
    }
}

bool zps_timers_armed(const zps_timers *ts, int id)
{
    return id >= 0 && id < ts->n && ts->t[id].armed;
}

long zps_timers_next_ms(const zps_timers *ts, double now_ms, long max_ms)
{
    double wait = (double)max_ms;
    for (int i = 0; i < ts->n; i++) {
        const zps_timer *t = &ts->t[i];
        if (t->armed && t->due_ms - now_ms < wait) {
            wait = t->due_ms - now_ms;
        }
    }
    // Rounded up: a poll that wakes a fraction of a ms early finds nothing
    // due and would spin with a timeout of 0 until the deadline.
    return wait <= 0 ? 0 : (long)ceil(wait);
}

int zps_timers_run(zps_timers *ts, double now_ms)
{
    int fired = 0;
    for (int i = 0; i < ts->n; i++) {
        zps_timer *t = &ts->t[i];
        if (!t->armed || t->due_ms > now_ms) {
            continue;
        }
        // Re-armed (or disarmed) before the call, so that the callback may
        // arm its own timer again and have the last word.
        if (t->period_ms > 0) {
            t->due_ms += t->period_ms;
            t->due_ms = t->due_ms > now_ms ? t->due_ms : now_ms + t->period_ms;
        } else {
            t->armed = false;
        }
        t->fn(t->arg, now_ms);
        fired++;
    }
    return fired;
}
