/* zps_monitor.c - per-rank rings of lag, compute and samples. */
#include "zps_monitor.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_log.h"
#include "common/zps_mlog.h"

// A rank holds a step back when the step waited for it (it arrived last,
// later than the next one by more than the floor) and it is slow against
// its peers: its time per sample over the recent steps at least SLOW_REL
// times the others' and beyond their noise (s_slow). Not against a share
// of the step: of two equal workers on shared cores one always arrives
// last, by a few ms. It is flagged when it held back most of the recent
// steps, and cleared when it held back few; a flag, once changed, stays
// for DWELL steps, so the log says at most one change per rank in that many.
#define ZPS_MONITOR_SLOW_REL 1.2
#define ZPS_MONITOR_NOISE_K 1.0
#define ZPS_MONITOR_LAG_FLOOR_MS 2.0
// Paces over the last PACE_STEPS, so that a pause of a few steps is not
// slowness. (On shared cores the scheduler also starves one of two equal
// workers for 20-70 steps, then the other: 0.36 against 0.23 ms a sample,
// steady; no window that still flags a 1.5x worker within 30 steps can
// tell that apart, see check_stragglers.c.)
#define ZPS_MONITOR_PACE_STEPS 30
#define ZPS_MONITOR_RECENT 20     // steps whose holding back counts ...
#define ZPS_MONITOR_FLAG_SHARE 0.6  // ... flagged when it held back this share of them
#define ZPS_MONITOR_FLAG_MIN 6      // and at least this many (the first steps) ...
#define ZPS_MONITOR_CLEAR_SHARE 0.15 // ... cleared at most this share (no flapping)
#define ZPS_MONITOR_DWELL 10

typedef struct s_sample {
    float lag_ms, compute_ms; // of one step
    uint32_t samples;
    uint32_t inner_steps;     // diloco: of the round (0: synchronous)
    float delta_norm;
    uint64_t bytes;
    int32_t fragment;         // diloco --fragments: the one pushed (-1: none)
    bool held;                // the step waited for this rank, a slow one
} s_sample;

typedef struct s_rank {
    uint64_t step;                       // step of the open record, UINT64_MAX if none
    double last_ms;                      // its last push's arrival
    float compute_ms;                    // summed over the step's slices
    uint32_t samples;
    uint32_t inner_steps;                // diloco: the round's figures
    float delta_norm;
    uint64_t bytes;
    int32_t fragment;
    s_sample ring[ZPS_MONITOR_WINDOW];   // closed steps, newest at (n - 1) % WINDOW
    uint64_t n;                          // records ever closed
    bool straggler;
    uint64_t changed_at;                 // n when the flag last changed
    uint64_t seen;                       // the last step it pushed for
} s_rank;

struct zps_monitor {
    s_rank ranks[ZPS_MAX_MEMBERS];
    uint32_t n_ranks;                    // 1 + the highest rank seen: the per-step walks stop
                                         // there, and the ranks past it were never touched
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
    for (; m->n_ranks <= rank; m->n_ranks++) {
        m->ranks[m->n_ranks].step = UINT64_MAX;
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
        r->inner_steps = 0;
        r->delta_norm = 0;
        r->bytes = 0;
        r->fragment = -1;
    }
    // Every bucket push of a slice carries the same slice: count it once,
    // by its compute time growing (a new slice) or staying (another bucket).
    if (compute_ms > r->compute_ms) {
        r->compute_ms = compute_ms;
        r->samples = samples;
    }
    r->last_ms = now_ms;
}

void zps_monitor_round(zps_monitor *m, uint64_t step, uint32_t rank, uint32_t inner_steps,
                       float delta_norm, uint64_t bytes, int fragment)
{
    if (rank < m->n_ranks && m->ranks[rank].step == step) {
        s_rank *r = &m->ranks[rank];
        r->inner_steps = inner_steps;
        r->delta_norm = delta_norm;
        r->bytes = bytes;
        r->fragment = fragment;
    }
}

// The samples a record trained: a diloco round's slice in every inner step.
static double s_trained(const s_sample *x)
{
    return (double)x->samples * (x->inner_steps ? x->inner_steps : 1);
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

static double s_median(double *v, size_t n)
{
    qsort(v, n, sizeof v[0], s_cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The rank's ms of compute per sample over its recent steps: the median
// (a pause of one step moves it little) and the median distance from it,
// its noise. False if unknown.
static bool s_pace(const s_rank *r, double *median, double *noise)
{
    uint64_t recent = r->n < ZPS_MONITOR_PACE_STEPS ? r->n : ZPS_MONITOR_PACE_STEPS;
    double v[ZPS_MONITOR_PACE_STEPS] = {0};
    size_t n = 0;
    for (uint64_t k = 0; k < recent; k++) {
        const s_sample *x = &r->ring[(r->n - 1 - k) % ZPS_MONITOR_WINDOW];
        if (x->samples > 0) {
            v[n++] = (double)x->compute_ms / s_trained(x);
        }
    }
    if (n == 0) {
        return false;
    }
    *median = s_median(v, n);
    for (size_t k = 0; k < n; k++) {
        v[k] = fabs(v[k] - *median);
    }
    *noise = s_median(v, n);
    return true;
}

// Whether rank `rank` is slow against the other ranks seen in the recent
// steps (false without any): SLOW_REL times their median pace, and further
// from it than NOISE_K times their scatter. A worker slowed 1.5x measured
// only 1.3x its peer's pace here (the peer, sharing 2 cores with it and the
// server, ran slower than alone, scattering by 15 %), so the margins are
// small; what they cannot tell apart is said at the equal-workers test.
static bool s_slow(const zps_monitor *m, uint32_t rank, uint64_t step)
{
    double own, own_noise, paces[ZPS_MAX_MEMBERS], noise = 0; // paces[0, n) are set
    if (!s_pace(&m->ranks[rank], &own, &own_noise)) {
        return false;
    }
    size_t n = 0;
    for (uint32_t i = 0; i < m->n_ranks; i++) {
        const s_rank *r = &m->ranks[i];
        double pace, scatter;
        if (i != rank && r->n > 0 && r->seen + ZPS_MONITOR_PACE_STEPS > step &&
            s_pace(r, &pace, &scatter)) {
            paces[n++] = pace;
            noise = fmax(noise, scatter);
        }
    }
    if (n == 0) {
        return false;
    }
    double peers = s_median(paces, n);
    return own >= ZPS_MONITOR_SLOW_REL * peers && own - peers > ZPS_MONITOR_NOISE_K * noise;
}

static void s_update_flag(s_rank *r, uint32_t rank)
{
    uint64_t recent = r->n < ZPS_MONITOR_RECENT ? r->n : ZPS_MONITOR_RECENT;
    int held = 0;
    for (uint64_t k = 0; k < recent; k++) {
        held += r->ring[(r->n - 1 - k) % ZPS_MONITOR_WINDOW].held;
    }
    bool flag = r->straggler ? held > ZPS_MONITOR_CLEAR_SHARE * (double)recent
                             : held >= ZPS_MONITOR_FLAG_MIN &&
                                   held >= ZPS_MONITOR_FLAG_SHARE * (double)recent;
    if (flag == r->straggler || (r->changed_at && r->n < r->changed_at + ZPS_MONITOR_DWELL)) {
        return;
    }
    zps_log_warn("rank %u %s a straggler: the step waited for it, %.1fx slower than its peers "
                 "per sample or more, in %d of the last %llu steps", rank,
                 flag ? "is" : "is no longer", ZPS_MONITOR_SLOW_REL, held,
                 (unsigned long long)recent);
    r->straggler = flag;
    r->changed_at = r->n;
}

// The rank the step waited for: the last to arrive, later than the next
// by more than the floor; ZPS_MAX_MEMBERS if none.
static uint32_t s_waited_for(const zps_monitor *m, uint64_t step)
{
    uint32_t last = ZPS_MAX_MEMBERS;
    double last_ms = -INFINITY, next_ms = -INFINITY;
    for (uint32_t i = 0; i < m->n_ranks; i++) {
        const s_rank *r = &m->ranks[i];
        if (r->step != step) {
            continue;
        }
        if (r->last_ms > last_ms) {
            next_ms = last_ms;
            last = i;
            last_ms = r->last_ms;
        } else if (r->last_ms > next_ms) {
            next_ms = r->last_ms;
        }
    }
    return last_ms - next_ms > ZPS_MONITOR_LAG_FLOOR_MS ? last : ZPS_MAX_MEMBERS;
}

void zps_monitor_step_done(zps_monitor *m, uint64_t step, double step_ms, FILE *json)
{
    m->step_ms[m->n_steps++ % ZPS_MONITOR_WINDOW] = step_ms;
    uint32_t waited = s_waited_for(m, step);
    for (uint32_t i = 0; i < m->n_ranks; i++) {
        s_rank *r = &m->ranks[i];
        if (r->step == step) {
            r->ring[r->n++ % ZPS_MONITOR_WINDOW] = (s_sample){
                .lag_ms = (float)(r->last_ms - m->first_ms), .compute_ms = r->compute_ms,
                .samples = r->samples, .inner_steps = r->inner_steps,
                .delta_norm = r->delta_norm, .bytes = r->bytes, .fragment = r->fragment};
            r->seen = step;
        }
    }
    bool first = true;
    for (uint32_t i = 0; i < m->n_ranks; i++) {
        s_rank *r = &m->ranks[i];
        if (r->step != step) {
            continue;
        }
        s_sample *s = &r->ring[(r->n - 1) % ZPS_MONITOR_WINDOW];
        s->held = i == waited && s_slow(m, i, step);
        r->step = UINT64_MAX;
        s_update_flag(r, i);
        if (json) {
            fputs(first ? "{" : ",{", json);
            zps_mlog_uint(json, true, ZPS_MLOG_RANK, i);
            zps_mlog_real(json, false, ZPS_MLOG_LAG_MS, s->lag_ms, 3);
            zps_mlog_real(json, false, ZPS_MLOG_COMPUTE_MS, s->compute_ms, 3);
            zps_mlog_uint(json, false, ZPS_MLOG_SAMPLES, s->samples);
            if (s->inner_steps) {
                zps_mlog_uint(json, false, ZPS_MLOG_INNER_STEPS, s->inner_steps);
                zps_mlog_uint(json, false, ZPS_MLOG_INNER_SAMPLES, (uint64_t)s_trained(s));
                zps_mlog_real(json, false, ZPS_MLOG_DELTA_NORM, s->delta_norm, 6);
                zps_mlog_uint(json, false, ZPS_MLOG_BYTES, s->bytes);
                if (s->fragment >= 0) {
                    zps_mlog_uint(json, false, ZPS_MLOG_FRAGMENT, (uint64_t)s->fragment);
                }
            }
            fputc('}', json);
            first = false;
        }
    }
}

bool zps_monitor_view_of(const zps_monitor *m, uint32_t rank, zps_monitor_view *out)
{
    if (rank >= m->n_ranks || m->ranks[rank].n == 0) {
        return false;
    }
    const s_rank *r = &m->ranks[rank];
    uint64_t n = r->n < ZPS_MONITOR_WINDOW ? r->n : ZPS_MONITOR_WINDOW;
    double compute = 0, samples = 0;
    for (uint64_t k = 0; k < n; k++) {
        compute += r->ring[k].compute_ms;
        samples += s_trained(&r->ring[k]);
    }
    *out = (zps_monitor_view){
        .lag_ms = r->ring[(r->n - 1) % ZPS_MONITOR_WINDOW].lag_ms,
        .compute_ms = (float)(compute / (double)n),
        .samples_per_s = compute > 0 ? samples / compute * 1e3 : 0,
        .straggler = r->straggler,
    };
    const s_sample *last = &r->ring[(r->n - 1) % ZPS_MONITOR_WINDOW];
    out->inner_steps = last->inner_steps;
    out->delta_norm = last->delta_norm;
    out->bytes = last->bytes;
    return true;
}
