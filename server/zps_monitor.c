/* zps_monitor.c - per-rank rings of lag, compute and samples. */
#include "zps_monitor.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_log.h"

// A rank lagging more than this share of the median step, with a floor,
// in most of the last steps, is a straggler.
#define ZPS_MONITOR_LAG_REL 0.5
#define ZPS_MONITOR_LAG_FLOOR_MS 2.0
#define ZPS_MONITOR_RECENT 10
#define ZPS_MONITOR_FLAG_AT 7   // late steps of the recent ones to be flagged ...
#define ZPS_MONITOR_CLEAR_AT 2  // ... and at most this many to be cleared (no flapping)

typedef struct s_sample {
    float lag_ms, compute_ms; // of one step
    uint32_t samples;
} s_sample;

typedef struct s_rank {
    uint64_t step;                       // step of the open record, UINT64_MAX if none
    double last_ms;                      // its last push's arrival
    float compute_ms;                    // summed over the step's slices
    uint32_t samples;
    s_sample ring[ZPS_MONITOR_WINDOW];   // closed steps, newest at (n - 1) % WINDOW
    uint64_t n;                          // records ever closed
    bool straggler;
} s_rank;

struct zps_monitor {
    s_rank ranks[ZPS_MAX_MEMBERS];
    uint64_t step;                       // step whose first push is first_ms
    double first_ms;
    double step_ms[ZPS_MONITOR_WINDOW];  // ring of step times
    uint64_t n_steps;
};

zps_monitor *zps_monitor_new(void)
{
    zps_monitor *m = calloc(1, sizeof *m);
    if (m) {
        m->step = UINT64_MAX;
        for (int i = 0; i < ZPS_MAX_MEMBERS; i++) {
            m->ranks[i].step = UINT64_MAX;
        }
    }
    return m;
}

void zps_monitor_destroy(zps_monitor **m)
{
    free(*m);
    *m = NULL;
}

void zps_monitor_push(zps_monitor *m, uint64_t step, uint32_t rank, uint32_t samples,
                      float compute_ms, double now_ms)
{
    if (rank >= ZPS_MAX_MEMBERS) {
        return;
    }
    if (m->step != step) {
        m->step = step;
        m->first_ms = now_ms;
    }
    s_rank *r = &m->ranks[rank];
    if (r->step != step) {
        r->step = step;
        r->compute_ms = 0;
        r->samples = 0;
    }
    // Every bucket push of a slice carries the same slice: count it once,
    // by its compute time growing (a new slice) or staying (another bucket).
    if (compute_ms > r->compute_ms) {
        r->compute_ms = compute_ms;
        r->samples = samples;
    }
    r->last_ms = now_ms;
}

static int s_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double zps_monitor_step_quantile(const zps_monitor *m, double q)
{
    size_t n = m->n_steps < ZPS_MONITOR_WINDOW ? m->n_steps : ZPS_MONITOR_WINDOW;
    if (n == 0) {
        return 0;
    }
    double v[ZPS_MONITOR_WINDOW];
    memcpy(v, m->step_ms, n * sizeof(double));
    qsort(v, n, sizeof(double), s_cmp);
    return v[(size_t)fmin((double)(n - 1), floor(q * (double)n))];
}

static void s_update_flag(zps_monitor *m, s_rank *r, uint32_t rank)
{
    double limit = fmax(ZPS_MONITOR_LAG_REL * zps_monitor_step_quantile(m, 0.5),
                        ZPS_MONITOR_LAG_FLOOR_MS);
    uint64_t recent = r->n < ZPS_MONITOR_RECENT ? r->n : ZPS_MONITOR_RECENT;
    int late = 0;
    for (uint64_t k = 0; k < recent; k++) {
        late += r->ring[(r->n - 1 - k) % ZPS_MONITOR_WINDOW].lag_ms > limit;
    }
    bool flag = r->straggler ? late > ZPS_MONITOR_CLEAR_AT : late >= ZPS_MONITOR_FLAG_AT;
    if (flag != r->straggler) {
        zps_log_warn("rank %u %s a straggler: late by more than %.1f ms in %d of the last %llu "
                     "steps", rank, flag ? "is" : "is no longer", limit, late,
                     (unsigned long long)recent);
    }
    r->straggler = flag;
}

void zps_monitor_step_done(zps_monitor *m, uint64_t step, double step_ms, FILE *json)
{
    m->step_ms[m->n_steps++ % ZPS_MONITOR_WINDOW] = step_ms;
    bool first = true;
    for (uint32_t i = 0; i < ZPS_MAX_MEMBERS; i++) {
        s_rank *r = &m->ranks[i];
        if (r->step != step) {
            continue;
        }
        s_sample *s = &r->ring[r->n++ % ZPS_MONITOR_WINDOW];
        *s = (s_sample){.lag_ms = (float)(r->last_ms - m->first_ms),
                        .compute_ms = r->compute_ms, .samples = r->samples};
        r->step = UINT64_MAX;
        s_update_flag(m, r, i);
        if (json) {
            fprintf(json, "%s{\"rank\":%u,\"lag_ms\":%.3f,\"compute_ms\":%.3f,\"samples\":%u}",
                    first ? "" : ",", i, s->lag_ms, s->compute_ms, s->samples);
            first = false;
        }
    }
}

bool zps_monitor_view_of(const zps_monitor *m, uint32_t rank, zps_monitor_view *out)
{
    if (rank >= ZPS_MAX_MEMBERS || m->ranks[rank].n == 0) {
        return false;
    }
    const s_rank *r = &m->ranks[rank];
    uint64_t n = r->n < ZPS_MONITOR_WINDOW ? r->n : ZPS_MONITOR_WINDOW;
    double compute = 0, samples = 0;
    for (uint64_t k = 0; k < n; k++) {
        compute += r->ring[k].compute_ms;
        samples += r->ring[k].samples;
    }
    *out = (zps_monitor_view){
        .lag_ms = r->ring[(r->n - 1) % ZPS_MONITOR_WINDOW].lag_ms,
        .compute_ms = (float)(compute / (double)n),
        .samples_per_s = compute > 0 ? samples / compute * 1e3 : 0,
        .straggler = r->straggler,
    };
    return true;
}
