/* zps_report.c - zps-ctl report: reads the coordinator's metrics log with
 * jansson, then draws three SVG pictures (lag heatmap, step time, shares of
 * the batch) for a person to look at.
 *
 * Only numbers from the log reach the SVG, each written with a fixed printf
 * format, so nothing in the log can inject markup. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "common/zps_atomic.h"
#include "common/zps_mlog.h"
#include "common/zps_plan.h"
#include "ctl/zps_report.h"

#define S_WIDTH 960        // px: readable at 800-1000 px without scaling
#define S_MAX_COLS 400     // more steps than this are binned (one column ~2 px)
#define S_HEAT_ROWS 256    // more workers than this share heatmap rows (the slowest shown)
#define S_LEFT 84          // px left of the plot: y tick labels and axis title
#define S_TOP 64           // px above the plot: title and subtitle
#define S_PLOT_H 300       // px: height of the line and area charts
#define S_FONT "DejaVu Sans, Helvetica, Arial, sans-serif"

// ---------------------------------------------------------------- the log

typedef struct s_worker {
    uint32_t rank;    // member rank, < ZPS_MAX_MEMBERS
    double lag_ms;    // behind the step's first arrival
    uint32_t samples; // its part of the global batch
} s_worker;

typedef struct s_step {
    uint64_t step;    // step number (repeats after a rollback)
    size_t seq;       // order in the log: the last record of a step wins
    double step_ms;   // the step's wall time on the coordinator
    uint32_t samples; // the global batch
    size_t w0;        // its first worker in s_log.workers
    size_t nw;        // its workers
} s_step;

typedef struct s_log {
    s_step *steps;                         // one per step, sorted, after s_log_finish
    size_t n_steps;                        // used
    size_t cap_steps;                      // allocated
    s_worker *workers;                     // all records' workers, in log order
    size_t n_workers;                      // used
    size_t cap_workers;                    // allocated
    size_t *mark;                          // rank -> 1 + seq of the last record naming it
    size_t n_ranks;                        // 1 + the highest rank in the log (mark's length)
    size_t cap_ranks;                      // mark's allocation
    int *row_of;                           // rank -> row of the pictures, -1: absent (n_ranks)
    uint32_t *rank_of_row;                 // row -> rank, rows in rank order (n_rows)
    uint32_t n_rows;                       // distinct ranks in the kept steps
    double test_accuracy;                  // the last evaluation's, -1 before any
    uint64_t test_epoch;                   // its epoch
} s_log;

static int s_fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

// A finite number (integer or real) under key; -1 if absent or not one.
static int s_get_number(json_t *o, const char *key, double *out)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v)) {
        return -1;
    }
    double d = json_number_value(v);
    if (!isfinite(d)) {
        return -1;
    }
    *out = d;
    return 0;
}

// An integer in [0, max] under key; -1 if absent or out of range.
static int s_get_uint(json_t *o, const char *key, uint64_t max, uint64_t *out)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) {
        return -1;
    }
    json_int_t i = json_integer_value(v);
    if (i < 0 || (uint64_t)i > max) {
        return -1;
    }
    *out = (uint64_t)i;
    return 0;
}

// Grows an array to hold one more element; false when out of memory.
static bool s_reserve(void **p, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap) {
        return true;
    }
    size_t ncap = *cap ? *cap * 2 : 256;
    void *np = realloc(*p, ncap * elem);
    if (!np) {
        return false;
    }
    *p = np;
    *cap = ncap;
    return true;
}

// Makes mark long enough for rank (new entries 0): the per-rank tables are
// sized by the ranks the log holds, not by ZPS_MAX_MEMBERS.
static bool s_reserve_ranks(s_log *lg, uint32_t rank)
{
    if (rank < lg->n_ranks) {
        return true;
    }
    if (rank >= lg->cap_ranks) {
        size_t ncap = lg->cap_ranks ? lg->cap_ranks : 64;
        while (ncap <= rank) {
            ncap *= 2;
        }
        size_t *np = realloc(lg->mark, ncap * sizeof *np);
        if (!np) {
            return false;
        }
        lg->mark = np;
        lg->cap_ranks = ncap;
    }
    memset(lg->mark + lg->n_ranks, 0, (rank + 1 - lg->n_ranks) * sizeof *lg->mark);
    lg->n_ranks = (size_t)rank + 1;
    return true;
}

// Adds one record to the log. Returns NULL, or why the record is refused
// (static text).
static const char *s_add_record(s_log *lg, json_t *root)
{
    if (!json_is_object(root)) {
        return "not a JSON object";
    }
    if (!json_object_get(root, zps_mlog_name(ZPS_MLOG_STEP))) {
        double acc;
        uint64_t epoch = 0;
        if (s_get_number(root, zps_mlog_name(ZPS_MLOG_TEST_ACCURACY), &acc) != 0 ||
            s_get_uint(root, zps_mlog_name(ZPS_MLOG_EPOCH), INT64_MAX, &epoch) != 0) {
            return "neither a step record nor an evaluation record";
        }
        lg->test_accuracy = acc;
        lg->test_epoch = epoch;
        return NULL;
    }
    s_step st = {.seq = lg->n_steps, .w0 = lg->n_workers};
    uint64_t u;
    if (s_get_uint(root, zps_mlog_name(ZPS_MLOG_STEP), INT64_MAX, &st.step) != 0) {
        return "\"step\" is not a non-negative integer";
    }
    if (s_get_number(root, zps_mlog_name(ZPS_MLOG_STEP_MS), &st.step_ms) != 0 || st.step_ms < 0) {
        return "\"step_ms\" is not a non-negative number";
    }
    if (s_get_uint(root, zps_mlog_name(ZPS_MLOG_SAMPLES), UINT32_MAX, &u) != 0 || u == 0) {
        return "\"samples\" is not a positive integer";
    }
    st.samples = (uint32_t)u;
    json_t *ws = json_object_get(root, zps_mlog_name(ZPS_MLOG_WORKERS));
    if (!json_is_array(ws)) {
        return "\"workers\" is not an array";
    }
    size_t i;
    json_t *w;
    json_array_foreach(ws, i, w) {
        s_worker sw;
        if (!json_is_object(w)) {
            return "a worker is not an object";
        }
        if (s_get_uint(w, zps_mlog_name(ZPS_MLOG_RANK), ZPS_MAX_MEMBERS - 1, &u) != 0) {
            return "a worker's \"rank\" is not an integer below ZPS_MAX_MEMBERS";
        }
        sw.rank = (uint32_t)u;
        if (s_get_number(w, zps_mlog_name(ZPS_MLOG_LAG_MS), &sw.lag_ms) != 0) {
            return "a worker's \"lag_ms\" is not a number";
        }
        if (s_get_uint(w, zps_mlog_name(ZPS_MLOG_SAMPLES), UINT32_MAX, &u) != 0) {
            return "a worker's \"samples\" is not a non-negative integer";
        }
        sw.samples = (uint32_t)u;
        if (!s_reserve_ranks(lg, sw.rank)) {
            return "out of memory";
        }
        if (lg->mark[sw.rank] == st.seq + 1) { // a mark a record: linear in its workers
            return "a rank appears twice in one step";
        }
        lg->mark[sw.rank] = st.seq + 1;
        if (!s_reserve((void **)&lg->workers, &lg->cap_workers, lg->n_workers, sizeof sw)) {
            return "out of memory";
        }
        lg->workers[lg->n_workers++] = sw;
    }
    st.nw = lg->n_workers - st.w0;
    if (!s_reserve((void **)&lg->steps, &lg->cap_steps, lg->n_steps, sizeof st)) {
        return "out of memory";
    }
    lg->steps[lg->n_steps++] = st;
    return NULL;
}

static int s_cmp_step(const void *a, const void *b)
{
    const s_step *x = a, *y = b;
    if (x->step != y->step) {
        return x->step < y->step ? -1 : 1;
    }
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

// Sorts the steps and keeps the last record of each (a rollback repeats
// steps, and the repeat is what the parameters went on with), then numbers
// the ranks that remain as rows.
static int s_log_finish(s_log *lg)
{
    if (lg->n_steps > 1) { // qsort's base must not be NULL, even for 0 elements
        qsort(lg->steps, lg->n_steps, sizeof *lg->steps, s_cmp_step);
    }
    size_t kept = 0;
    for (size_t i = 0; i < lg->n_steps; i++) {
        if (i + 1 < lg->n_steps && lg->steps[i + 1].step == lg->steps[i].step) {
            continue;
        }
        lg->steps[kept++] = lg->steps[i];
    }
    lg->n_steps = kept;
    lg->n_rows = 0;
    lg->row_of = malloc((lg->n_ranks ? lg->n_ranks : 1) * sizeof *lg->row_of);
    lg->rank_of_row = malloc((lg->n_ranks ? lg->n_ranks : 1) * sizeof *lg->rank_of_row);
    if (!lg->row_of || !lg->rank_of_row) {
        return -1;
    }
    for (size_t r = 0; r < lg->n_ranks; r++) {
        lg->row_of[r] = -1;
    }
    for (size_t i = 0; i < lg->n_steps; i++) {
        for (size_t k = 0; k < lg->steps[i].nw; k++) {
            lg->row_of[lg->workers[lg->steps[i].w0 + k].rank] = 0; // seen
        }
    }
    for (uint32_t r = 0; r < lg->n_ranks; r++) {
        if (lg->row_of[r] == 0) {
            lg->row_of[r] = (int)lg->n_rows;
            lg->rank_of_row[lg->n_rows++] = r;
        }
    }
    return 0;
}

static void s_log_fini(s_log *lg)
{
    free(lg->steps);
    free(lg->workers);
    free(lg->mark);
    free(lg->row_of);
    free(lg->rank_of_row);
}

// Reads the whole log; -1 with the file, line and reason in err.
static int s_log_read(s_log *lg, const char *path, char *err, size_t errlen)
{
    *lg = (s_log){.test_accuracy = -1};
    FILE *f = fopen(path, "r");
    if (!f) {
        return s_fail(err, errlen, "%s: %s", path, strerror(errno));
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    size_t lineno = 0;
    int ret = 0;
    while (ret == 0 && (len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if (strspn(line, " \t\r\n") == (size_t)len) {
            continue; // blank lines carry nothing
        }
        json_error_t jerr;
        json_t *root = json_loadb(line, (size_t)len, JSON_REJECT_DUPLICATES, &jerr);
        if (!root) {
            ret = s_fail(err, errlen, "%s:%zu: malformed JSON: %s", path, lineno, jerr.text);
            break;
        }
        const char *why = s_add_record(lg, root);
        json_decref(root);
        if (why) {
            ret = s_fail(err, errlen, "%s:%zu: %s", path, lineno, why);
        }
    }
    if (ret == 0 && ferror(f)) {
        ret = s_fail(err, errlen, "%s: read error", path);
    }
    free(line);
    (void)fclose(f); // read only: a failed close loses nothing
    if (ret == 0 && s_log_finish(lg) != 0) {
        ret = s_fail(err, errlen, "%s: out of memory", path);
    } else if (ret == 0) {
        if (lg->n_steps == 0) {
            ret = s_fail(err, errlen, "%s: no step records", path);
        }
    }
    if (ret != 0) {
        s_log_fini(lg);
    }
    return ret;
}

// ---------------------------------------------------------------- numbers

static int s_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

// The p-quantile of v[0..n) sorted ascending, linear between closest ranks.
static double s_quantile(const double *v, size_t n, double p)
{
    if (n == 0) {
        return 0;
    }
    double pos = p * (double)(n - 1);
    size_t i = (size_t)pos;
    if (i + 1 >= n) {
        return v[n - 1];
    }
    return v[i] + (v[i + 1] - v[i]) * (pos - (double)i);
}

// A 1-2-5 tick step giving about `want` ticks over a range.
static double s_tick_step(double range, int want)
{
    double raw = range / want;
    if (!(raw > 0)) {
        return 1;
    }
    double mag = pow(10, floor(log10(raw)));
    double r = raw / mag;
    return (r <= 1 ? 1 : r <= 2 ? 2 : r <= 5 ? 5 : 10) * mag;
}

// Decimals that show a tick step exactly.
static int s_decimals(double step)
{
    return step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
}

// Steps [first, first + span) in n columns of equal width.
typedef struct s_bins {
    uint64_t first; // the first step
    uint64_t span;  // last - first + 1
    size_t n;       // columns
} s_bins;

static s_bins s_bins_of(const s_log *lg)
{
    s_bins b = {.first = lg->steps[0].step};
    b.span = lg->steps[lg->n_steps - 1].step - b.first + 1;
    b.n = b.span > S_MAX_COLS ? S_MAX_COLS : (size_t)b.span;
    return b;
}

// The column of a step. Integer arithmetic: in floating point, step 29 of
// 400 in 400 columns can land in column 28 and leave column 29 empty.
static size_t s_bin_of(const s_bins *b, uint64_t step)
{
    uint64_t d = step - b->first;
    uint64_t k = d <= UINT64_MAX / b->n ? d * b->n / b->span
                                        : (uint64_t)((double)d / (double)b->span * (double)b->n);
    return k < b->n ? (size_t)k : b->n - 1;
}

// ---------------------------------------------------------------- drawing

// A plot area in px and the data ranges it maps.
typedef struct s_plot {
    double x0, x1; // px, left and right
    double y0, y1; // px, top and bottom
    double lo, hi; // x data range (steps)
    double ylo, yhi; // y data range
} s_plot;

static double s_px(const s_plot *p, double v)
{
    return p->x0 + (v - p->lo) / (p->hi - p->lo) * (p->x1 - p->x0);
}

static double s_py(const s_plot *p, double v)
{
    double t = (v - p->ylo) / (p->yhi - p->ylo);
    t = t < 0 ? 0 : t > 1 ? 1 : t;
    return p->y1 - t * (p->y1 - p->y0);
}

// The SVG prologue: size, white background, title and a grey subtitle.
static void s_svg_begin(FILE *f, int w, int h, const char *title, const char *subtitle)
{
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\" font-family=\"%s\" font-size=\"12\">\n"
            "<title>%s</title>\n"
            "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n"
            "<text x=\"%d\" y=\"26\" font-size=\"17\" font-weight=\"bold\" "
            "fill=\"#222222\">%s</text>\n"
            "<text x=\"%d\" y=\"46\" fill=\"#555555\">%s</text>\n",
            w, h, w, h, S_FONT, title, w, h, S_LEFT, title, S_LEFT, subtitle);
}

// The step axis under the plot: ticks at round step numbers, and its title.
static void s_x_axis(FILE *f, const s_plot *p)
{
    double step = s_tick_step(p->hi - p->lo, 8);
    step = step < 1 ? 1 : step;
    fprintf(f, "<g stroke=\"#444444\" fill=\"none\">\n");
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", p->x0, p->y1, p->x1,
            p->y1);
    // Ticks counted, not summed: a double stepped by addition drifts.
    double first = ceil(p->lo / step) * step;
    for (int k = 0; first + k * step <= p->hi + 1e-9; k++) {
        double x = s_px(p, first + k * step);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", x, p->y1, x,
                p->y1 + 5);
    }
    fprintf(f, "</g>\n<g text-anchor=\"middle\" fill=\"#333333\">\n");
    for (int k = 0; first + k * step <= p->hi + 1e-9; k++) {
        double t = first + k * step;
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%.0f</text>\n", s_px(p, t), p->y1 + 19, t);
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\">step</text>\n</g>\n",
            (p->x0 + p->x1) / 2, p->y1 + 40);
}

// The value axis left of the plot: grid lines at round values (in unit,
// scaled by mul, e.g. 100 for percent) and a rotated title.
static void s_y_axis(FILE *f, const s_plot *p, double step, double mul, const char *unit,
                     const char *title)
{
    int dec = s_decimals(step * mul);
    fprintf(f, "<g stroke=\"#e3e3e3\">\n");
    for (int k = 0; p->ylo + k * step <= p->yhi + step * 1e-6; k++) {
        double y = s_py(p, p->ylo + k * step);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", p->x0, y, p->x1,
                y);
    }
    fprintf(f, "</g>\n<g text-anchor=\"end\" fill=\"#333333\">\n");
    for (int k = 0; p->ylo + k * step <= p->yhi + step * 1e-6; k++) {
        double t = p->ylo + k * step;
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%.*f%s</text>\n", p->x0 - 7, s_py(p, t) + 4, dec,
                t * mul, unit);
    }
    fprintf(f,
            "</g>\n<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#444444\"/>\n"
            "<text transform=\"translate(%d,%.1f) rotate(-90)\" text-anchor=\"middle\" "
            "font-size=\"13\" fill=\"#333333\">%s</text>\n",
            p->x0, p->y0, p->x0, p->y1, 20, (p->y0 + p->y1) / 2, title);
}

// "1 step" or "the mean of 3 steps": what one column shows.
static void s_per_column(char *buf, size_t len, const s_bins *b, const char *how)
{
    double per = (double)b->span / (double)b->n;
    if (b->n == b->span) {
        snprintf(buf, len, "one column per step");
    } else {
        snprintf(buf, len, "each column the %s of %.*f steps", how, per == floor(per) ? 0 : 1,
                 per);
    }
}

// ---------------------------------------------------------------- lag heatmap

// Light yellow to dark red: stops of a sequential scale, interpolated.
static const unsigned char s_heat[][3] = {
    {255, 255, 204}, {255, 237, 160}, {254, 217, 118}, {254, 178, 76}, {253, 141, 60},
    {252, 78, 42},   {227, 26, 28},   {189, 0, 38},    {128, 0, 38},
};

static void s_heat_color(double t, char out[8])
{
    size_t n = sizeof s_heat / sizeof s_heat[0];
    double pos = (t < 0 ? 0 : t > 1 ? 1 : t) * (double)(n - 1);
    size_t i = (size_t)pos;
    i = i + 1 < n ? i : n - 2;
    double f = pos - (double)i;
    int c[3];
    for (int k = 0; k < 3; k++) {
        c[k] = (int)lround(s_heat[i][k] + (s_heat[i + 1][k] - s_heat[i][k]) * f);
    }
    snprintf(out, 8, "#%02x%02x%02x", c[0], c[1], c[2]);
}

// Many workers: each drawn row of the heatmap is a run of `group`
// neighbouring ranks, and a cell holds the slowest of their means (a
// straggler stays visible), so the picture has at most S_HEAT_ROWS rows at
// any size. In place: group g's cells go to row g, read no more after.
// Returns the rows drawn.
static size_t s_heat_group(double *sum, size_t *cnt, double *row_sum, size_t *row_cnt,
                           size_t rows, size_t cols, size_t group)
{
    if (group <= 1) {
        return rows;
    }
    size_t groups = (rows + group - 1) / group;
    for (size_t g = 0; g < groups; g++) {
        size_t r0 = g * group, r1 = r0 + group < rows ? r0 + group : rows;
        for (size_t c = 0; c < cols; c++) {
            double best = -1;
            for (size_t r = r0; r < r1; r++) {
                best = cnt[r * cols + c] ? fmax(best, sum[r * cols + c] / (double)cnt[r * cols + c])
                                         : best;
            }
            sum[g * cols + c] = best > 0 ? best : 0;
            cnt[g * cols + c] = best >= 0;
        }
        double row_best = -1;
        for (size_t r = r0; r < r1; r++) {
            row_best = row_cnt[r] ? fmax(row_best, row_sum[r] / (double)row_cnt[r]) : row_best;
        }
        row_sum[g] = row_best > 0 ? row_best : 0;
        row_cnt[g] = row_best >= 0;
    }
    return groups;
}

// The heatmap's row labels: rank on the left, the row's mean lag on the
// right, so the slow worker is named in numbers as well as in colour.
// Thin rows (many workers) get a label on every k-th row only.
static void s_heat_labels(FILE *f, const s_log *lg, const s_plot *p, double rh, size_t rows,
                          size_t group, const double *row_sum, const size_t *row_cnt)
{
    double fs = rh >= 14 ? 12 : 10;
    size_t every = rh >= 14 ? 1 : (size_t)ceil(14 / rh);
    fprintf(f, "<g fill=\"#333333\" font-size=\"%.0f\">\n", fs);
    for (size_t row = 0; row < rows; row += every) {
        double y = p->y0 + rh * ((double)row + 0.5) + fs * 0.35;
        size_t last = (row + 1) * group < lg->n_rows ? (row + 1) * group - 1 : lg->n_rows - 1;
        if (group > 1) {
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">ranks %u-%u</text>\n",
                    p->x0 - 8, y, lg->rank_of_row[row * group], lg->rank_of_row[last]);
        } else {
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">rank %u</text>\n",
                    p->x0 - 8, y, lg->rank_of_row[row]);
        }
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%s %.1f ms</text>\n", p->x1 + 8, y,
                group > 1 ? "slowest mean" : "mean",
                row_cnt[row] ? row_sum[row] / (double)row_cnt[row] : 0.0);
    }
    fprintf(f, "</g>\n");
}

static int s_draw_heatmap(FILE *f, const s_log *lg)
{
    s_bins b = s_bins_of(lg);
    size_t rows = lg->n_rows, cells = rows * b.n;
    double *sum = calloc(cells ? cells : 1, sizeof *sum);
    double *mean = calloc(cells ? cells : 1, sizeof *mean);
    size_t *cnt = calloc(cells ? cells : 1, sizeof *cnt);
    double *row_sum = calloc(rows ? rows : 1, sizeof *row_sum);
    size_t *row_cnt = calloc(rows ? rows : 1, sizeof *row_cnt);
    if (!sum || !mean || !cnt || !row_sum || !row_cnt) {
        free(sum), free(mean), free(cnt), free(row_sum), free(row_cnt);
        return -1;
    }
    for (size_t i = 0; i < lg->n_steps; i++) {
        const s_step *st = &lg->steps[i];
        size_t col = s_bin_of(&b, st->step);
        for (size_t k = 0; k < st->nw; k++) {
            const s_worker *w = &lg->workers[st->w0 + k];
            size_t row = (size_t)lg->row_of[w->rank];
            double lag = w->lag_ms > 0 ? w->lag_ms : 0;
            sum[row * b.n + col] += lag;
            cnt[row * b.n + col]++;
            row_sum[row] += lag;
            row_cnt[row]++;
        }
    }
    size_t group = rows > S_HEAT_ROWS ? (rows + S_HEAT_ROWS - 1) / S_HEAT_ROWS : 1;
    rows = s_heat_group(sum, cnt, row_sum, row_cnt, rows, b.n, group);
    cells = rows * b.n;
    // The colour scale ends at the largest cell, unless a few outliers would
    // wash out the rest: then at the 99th percentile, the rest clamped.
    size_t n_full = 0;
    bool missing = false;
    for (size_t c = 0; c < cells; c++) {
        if (cnt[c]) {
            mean[n_full++] = sum[c] / (double)cnt[c];
        } else {
            missing = true;
        }
    }
    qsort(mean, n_full, sizeof *mean, s_cmp_double);
    double vmax = n_full ? mean[n_full - 1] : 0, p99 = s_quantile(mean, n_full, 0.99);
    double top = vmax > 2 * p99 && p99 > 0 ? p99 : vmax;
    double cstep = s_tick_step(top > 0 ? top : 1, 8);
    int classes = (int)ceil(top / cstep - 1e-9);
    classes = classes < 1 ? 1 : classes;
    double scale_top = classes * cstep;
    bool clamped = vmax > scale_top;
    int dec = s_decimals(cstep);

    double rh = rows <= 6 ? 40 : rows <= 60 ? 240.0 / (double)rows : 4;
    s_plot p = {.x0 = S_LEFT, .x1 = S_WIDTH - 112, .y0 = S_TOP + 4, .lo = (double)b.first,
                .hi = (double)(b.first + b.span)};
    p.y1 = p.y0 + rh * (double)rows;
    int height = (int)ceil(p.y1) + 112;
    char sub[160], per[64];
    s_per_column(per, sizeof per, &b, "mean");
    snprintf(sub, sizeof sub, "%u workers%s, %zu steps; %s. Darker: later to arrive.",
             lg->n_rows, group > 1 ? " (a row: the slowest of its ranks)" : "", lg->n_steps, per);
    s_svg_begin(f, S_WIDTH, height, "Lag behind each step's first arrival", sub);

    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#eeeeee\"/>\n",
            p.x0, p.y0, p.x1 - p.x0, p.y1 - p.y0);
    double cw = (p.x1 - p.x0) / (double)b.n;
    for (size_t row = 0; row < rows; row++) {
        double y = p.y0 + rh * (double)row;
        fprintf(f, "<g data-rank=\"%u\" shape-rendering=\"crispEdges\">\n",
                lg->rank_of_row[row * group]);
        // Neighbouring columns of one colour class become one rectangle:
        // the file stays small and the picture is the same.
        size_t c = 0;
        while (c < b.n) {
            size_t i = row * b.n + c;
            if (!cnt[i]) {
                c++;
                continue;
            }
            int cls = (int)floor(sum[i] / (double)cnt[i] / cstep);
            cls = cls < 0 ? 0 : cls >= classes ? classes - 1 : cls;
            size_t end = c + 1;
            while (end < b.n && cnt[row * b.n + end]) {
                size_t j = row * b.n + end;
                int cj = (int)floor(sum[j] / (double)cnt[j] / cstep);
                cj = cj < 0 ? 0 : cj >= classes ? classes - 1 : cj;
                if (cj != cls) {
                    break;
                }
                end++;
            }
            char col[8];
            s_heat_color(classes == 1 ? 0 : (double)cls / (classes - 1), col);
            fprintf(f, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"/>\n",
                    p.x0 + cw * (double)c, y, cw * (double)(end - c), rh, col);
            c = end;
        }
        fprintf(f, "</g>\n");
    }
    s_heat_labels(f, lg, &p, rh, rows, group, row_sum, row_cnt);
    fprintf(f,
            "<text transform=\"translate(%d,%.1f) rotate(-90)\" text-anchor=\"middle\" "
            "font-size=\"13\" fill=\"#333333\">worker</text>\n",
            20, (p.y0 + p.y1) / 2);
    s_x_axis(f, &p);

    // The legend: one box per colour class, its bounds underneath.
    double ly = p.y1 + 60, lw = 34, lx = p.x0 + 150;
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" fill=\"#333333\">lag (ms)</text>\n",
            lx - 10, ly + 12);
    fprintf(f, "<g stroke=\"#999999\" stroke-width=\"0.5\">\n");
    for (int k = 0; k < classes; k++) {
        char col[8];
        s_heat_color(classes == 1 ? 0 : (double)k / (classes - 1), col);
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"16\" fill=\"%s\"/>\n",
                lx + lw * k, ly, lw, col);
    }
    fprintf(f, "</g>\n<g text-anchor=\"middle\" fill=\"#333333\" font-size=\"11\">\n");
    for (int k = 0; k <= classes; k++) {
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%s%.*f</text>\n", lx + lw * k, ly + 30,
                k == classes && clamped ? "\u2265" : "", dec, cstep * k);
    }
    fprintf(f, "</g>\n");
    if (missing) {
        double mx = lx + lw * classes + 40;
        fprintf(f,
                "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"16\" fill=\"#eeeeee\" "
                "stroke=\"#999999\" stroke-width=\"0.5\"/>\n"
                "<text x=\"%.1f\" y=\"%.1f\" fill=\"#333333\">no data</text>\n",
                mx, ly, lw, mx + lw + 6, ly + 12);
    }
    fprintf(f, "</svg>\n");
    free(sum), free(mean), free(cnt), free(row_sum), free(row_cnt);
    return 0;
}

// ---------------------------------------------------------------- step time

static int s_draw_step_time(FILE *f, const s_log *lg)
{
    size_t n = lg->n_steps;
    s_bins b = s_bins_of(lg);
    double *sorted = malloc(n * sizeof *sorted);
    double *col = malloc(n * sizeof *col);
    if (!sorted || !col) {
        free(sorted), free(col);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        sorted[i] = lg->steps[i].step_ms;
    }
    qsort(sorted, n, sizeof *sorted, s_cmp_double);
    double med = s_quantile(sorted, n, 0.5), p95 = s_quantile(sorted, n, 0.95);
    double p99 = s_quantile(sorted, n, 0.99), vmax = sorted[n - 1];
    // A few slow steps (the first one loads the data) would squash the
    // rest into a flat line: above twice the p95 they are drawn clipped.
    double top = vmax > 2 * p95 && vmax > 1.5 * p99 ? fmax(p99 * 1.1, p95 * 1.3) : vmax * 1.05;
    top = top > 0 ? top : 1;
    double ystep = s_tick_step(top, 6);
    top = ceil(top / ystep - 1e-9) * ystep;
    size_t clipped = 0;
    for (size_t i = 0; i < n; i++) {
        clipped += sorted[i] > top;
    }

    s_plot p = {.x0 = S_LEFT, .x1 = S_WIDTH - 150, .y0 = S_TOP + 10, .y1 = S_TOP + 10 + S_PLOT_H,
                .lo = (double)b.first, .hi = (double)(b.first + b.span), .ylo = 0, .yhi = top};
    // sub has room for every part at its longest (gcc -O1 checks the sum).
    char sub[256], per[64], acc[64] = "", clip[96] = "";
    s_per_column(per, sizeof per, &b, "median");
    if (lg->test_accuracy >= 0) {
        snprintf(acc, sizeof acc, "; test accuracy %.2f %% after epoch %llu",
                 lg->test_accuracy * 100, (unsigned long long)lg->test_epoch);
    }
    if (clipped) {
        snprintf(clip, sizeof clip, "; %zu above %.0f ms drawn at the top (max %.1f ms)", clipped,
                 top, vmax);
    }
    snprintf(sub, sizeof sub, "%zu steps, %s%s%s", n, b.n == b.span ? "one point per step" : per,
             clip, acc);
    s_svg_begin(f, S_WIDTH, (int)p.y1 + 60, "Step time", sub);
    s_y_axis(f, &p, ystep, 1, "", "step time (ms)");
    s_x_axis(f, &p);

    double cw = (p.x1 - p.x0) / (double)b.n;
    if (b.n == b.span) {
        fprintf(f, "<polyline fill=\"none\" stroke=\"#2171b5\" stroke-width=\"1.3\" "
                   "stroke-linejoin=\"round\" points=\"");
        for (size_t i = 0; i < n; i++) {
            fprintf(f, "%.1f,%.1f ", s_px(&p, (double)lg->steps[i].step + 0.5),
                    s_py(&p, lg->steps[i].step_ms));
        }
        fprintf(f, "\"/>\n");
        if (n <= 60) {
            // Few steps: a dot on each, so a single step is visible too.
            fprintf(f, "<g fill=\"#2171b5\">\n");
            for (size_t i = 0; i < n; i++) {
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\"/>\n",
                        s_px(&p, (double)lg->steps[i].step + 0.5), s_py(&p, lg->steps[i].step_ms));
            }
            fprintf(f, "</g>\n");
        }
    } else {
        // Each column: the band from its fastest to its slowest step, and a
        // line through its median.
        double *lo = malloc(b.n * sizeof *lo), *hi = malloc(b.n * sizeof *hi);
        double *mid = malloc(b.n * sizeof *mid);
        bool *has = calloc(b.n, sizeof *has);
        if (!lo || !hi || !mid || !has) {
            free(lo), free(hi), free(mid), free(has), free(sorted), free(col);
            return -1;
        }
        size_t i = 0;
        while (i < n) {
            size_t c = s_bin_of(&b, lg->steps[i].step), m = 0;
            for (; i < n && s_bin_of(&b, lg->steps[i].step) == c; i++) {
                col[m++] = lg->steps[i].step_ms;
            }
            qsort(col, m, sizeof *col, s_cmp_double);
            lo[c] = col[0], hi[c] = col[m - 1], mid[c] = s_quantile(col, m, 0.5), has[c] = true;
        }
        fprintf(f, "<polygon fill=\"#c6dbef\" stroke=\"none\" points=\"");
        for (size_t c = 0; c < b.n; c++) {
            if (has[c]) {
                fprintf(f, "%.1f,%.1f ", p.x0 + cw * ((double)c + 0.5), s_py(&p, hi[c]));
            }
        }
        for (size_t c = b.n; c-- > 0;) {
            if (has[c]) {
                fprintf(f, "%.1f,%.1f ", p.x0 + cw * ((double)c + 0.5), s_py(&p, lo[c]));
            }
        }
        fprintf(f, "\"/>\n<polyline fill=\"none\" stroke=\"#2171b5\" stroke-width=\"1.3\" "
                   "stroke-linejoin=\"round\" points=\"");
        for (size_t c = 0; c < b.n; c++) {
            if (has[c]) {
                fprintf(f, "%.1f,%.1f ", p.x0 + cw * ((double)c + 0.5), s_py(&p, mid[c]));
            }
        }
        fprintf(f, "\"/>\n");
        free(lo), free(hi), free(mid), free(has);
    }
    // Clipped steps: a small red mark on the top edge where each one is.
    if (clipped) {
        fprintf(f, "<g fill=\"#cb181d\">\n");
        for (size_t i = 0; i < n; i++) {
            if (lg->steps[i].step_ms > top) {
                double x = s_px(&p, (double)lg->steps[i].step + 0.5);
                fprintf(f, "<path d=\"M%.1f %.1fl-4 7h8z\"/>\n", x, p.y0 - 1);
            }
        }
        fprintf(f, "</g>\n");
    }
    // Median and p95 across the whole run, labelled in the right margin;
    // the p95 label moves up when the two would overlap.
    double ym = s_py(&p, med), yp = s_py(&p, p95);
    double lm = ym + 4, lp = fmin(yp + 4, lm - 15);
    fprintf(f,
            "<line data-stat=\"median\" data-value=\"%.3f\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" "
            "y2=\"%.1f\" stroke=\"#222222\" stroke-width=\"1.2\" stroke-dasharray=\"6 4\"/>\n"
            "<line data-stat=\"p95\" data-value=\"%.3f\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" "
            "y2=\"%.1f\" stroke=\"#d6604d\" stroke-width=\"1.2\" stroke-dasharray=\"6 4\"/>\n"
            "<text data-stat=\"median\" x=\"%.1f\" y=\"%.1f\" "
            "fill=\"#222222\">median %.2f ms</text>\n"
            "<text data-stat=\"p95\" x=\"%.1f\" y=\"%.1f\" fill=\"#b2412c\">p95 %.2f ms</text>\n",
            med, p.x0, ym, p.x1, ym, p95, p.x0, yp, p.x1, yp, p.x1 + 8, lm, med, p.x1 + 8, lp, p95);
    fprintf(f, "</svg>\n");
    free(sorted), free(col);
    return 0;
}

// ---------------------------------------------------------------- shares

// Ten distinct colours for ranks; more ranks repeat them.
static const char *const s_rank_colors[] = {
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
};
#define S_N_RANK_COLORS (sizeof s_rank_colors / sizeof s_rank_colors[0])

// One edge of a stacked band, step-shaped: a point where the value changes.
static void s_band_edge(FILE *f, const s_plot *p, const double *v, size_t n, bool reverse)
{
    double cw = (p->x1 - p->x0) / (double)n;
    for (size_t k = 0; k < n; k++) {
        size_t c = reverse ? n - 1 - k : k;
        double xa = p->x0 + cw * (double)c, xb = xa + cw;
        if (reverse) {
            double t = xa;
            xa = xb, xb = t;
        }
        bool first = k == 0, last = k + 1 == n;
        size_t next = reverse ? c - 1 : c + 1;
        if (first || v[c] != v[reverse ? c + 1 : c - 1]) {
            fprintf(f, "%.1f,%.1f ", xa, s_py(p, v[c]));
        }
        if (last || v[c] != v[next]) {
            fprintf(f, "%.1f,%.1f ", xb, s_py(p, v[c]));
        }
    }
}

static int s_draw_shares(FILE *f, const s_log *lg)
{
    s_bins b = s_bins_of(lg);
    size_t rows = lg->n_rows;
    double *cum = calloc((rows + 1) * b.n, sizeof *cum); // row r's top edge at [r + 1]
    size_t *steps_in = calloc(b.n, sizeof *steps_in);
    double *row_sum = calloc(rows ? rows : 1, sizeof *row_sum);
    if (!cum || !steps_in || !row_sum) {
        free(cum), free(steps_in), free(row_sum);
        return -1;
    }
    for (size_t i = 0; i < lg->n_steps; i++) {
        const s_step *st = &lg->steps[i];
        size_t c = s_bin_of(&b, st->step);
        steps_in[c]++;
        for (size_t k = 0; k < st->nw; k++) {
            const s_worker *w = &lg->workers[st->w0 + k];
            size_t row = (size_t)lg->row_of[w->rank];
            double share = (double)w->samples / (double)st->samples;
            cum[(row + 1) * b.n + c] += share;
            row_sum[row] += share;
        }
    }
    double ymax = 1;
    for (size_t c = 0; c < b.n; c++) {
        for (size_t r = 1; r <= rows; r++) {
            double *v = &cum[r * b.n + c];
            *v = (steps_in[c] ? *v / (double)steps_in[c] : 0) + cum[(r - 1) * b.n + c];
            ymax = fmax(ymax, *v);
        }
    }
    double ystep = ymax > 1 + 1e-9 ? s_tick_step(ymax, 5) : 0.2;
    s_plot p = {.x0 = S_LEFT, .x1 = S_WIDTH - 170, .y0 = S_TOP + 10, .y1 = S_TOP + 10 + S_PLOT_H,
                .lo = (double)b.first, .hi = (double)(b.first + b.span), .ylo = 0,
                .yhi = ceil(ymax / ystep - 1e-9) * ystep};
    char sub[160], per[64];
    s_per_column(per, sizeof per, &b, "mean");
    snprintf(sub, sizeof sub, "%zu workers, %zu steps, stacked by rank; %s", rows, lg->n_steps,
             per);
    s_svg_begin(f, S_WIDTH, (int)p.y1 + 60, "Share of the global batch per worker", sub);
    s_y_axis(f, &p, ystep, 100, " %", "share of the global batch");
    for (size_t r = 0; r < rows; r++) {
        fprintf(f,
                "<polygon data-rank=\"%u\" fill=\"%s\" fill-opacity=\"0.85\" stroke=\"#ffffff\" "
                "stroke-width=\"0.8\" points=\"",
                lg->rank_of_row[r], s_rank_colors[lg->rank_of_row[r] % S_N_RANK_COLORS]);
        s_band_edge(f, &p, &cum[(r + 1) * b.n], b.n, false);
        s_band_edge(f, &p, &cum[r * b.n], b.n, true);
        fprintf(f, "\"/>\n");
    }
    s_x_axis(f, &p);
    // The legend lists ranks top-down in the order the bands are stacked,
    // each with its mean share over the run.
    size_t fit = (size_t)((p.y1 - p.y0 - 14) / 20), shown = rows <= fit ? rows : fit - 1;
    fprintf(f,
            "<g fill=\"#333333\">\n"
            "<text x=\"%.1f\" y=\"%.1f\" fill=\"#555555\">mean share</text>\n",
            p.x1 + 14, p.y0 + 4);
    for (size_t k = 0; k < shown; k++) {
        size_t r = rows - 1 - k;
        double y = p.y0 + 14 + 20 * (double)k;
        fprintf(f,
                "<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"14\" fill=\"%s\"/>\n"
                "<text x=\"%.1f\" y=\"%.1f\">rank %u: %.1f %%</text>\n",
                p.x1 + 14, y, s_rank_colors[lg->rank_of_row[r] % S_N_RANK_COLORS], p.x1 + 34,
                y + 11, lg->rank_of_row[r], 100 * row_sum[r] / (double)lg->n_steps);
    }
    if (shown < rows) {
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">and %zu more</text>\n", p.x1 + 34,
                p.y0 + 14 + 20 * (double)shown + 11, rows - shown);
    }
    fprintf(f, "</g>\n</svg>\n");
    free(cum), free(steps_in), free(row_sum);
    return 0;
}

// ---------------------------------------------------------------- files

typedef int (*s_draw_fn)(FILE *f, const s_log *lg);

typedef struct s_picture {
    const char *name; // file name in the output directory
    s_draw_fn draw;   // writes the whole SVG
} s_picture;

static const s_picture s_pictures[] = {
    {"lag_heatmap.svg", s_draw_heatmap},
    {"step_time.svg", s_draw_step_time},
    {"shares.svg", s_draw_shares},
};
#define S_N_PICTURES (sizeof s_pictures / sizeof s_pictures[0])

// Draws one picture into memory (*svg, *len; the caller frees *svg).
static int s_draw(const s_picture *p, const s_log *lg, char **svg, size_t *len, char *err,
                  size_t errlen)
{
    FILE *f = open_memstream(svg, len);
    if (f == NULL) {
        return s_fail(err, errlen, "%s: %s", p->name, strerror(errno));
    }
    int drawn = p->draw(f, lg);
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad || drawn != 0) {
        return s_fail(err, errlen, "%s: out of memory", p->name);
    }
    return 0;
}

int zps_report_write(const char *metrics_path, const char *out_dir, char *err, size_t errlen)
{
    s_log lg;
    if (s_log_read(&lg, metrics_path, err, errlen) != 0) {
        return -1;
    }
    int ret = 0;
    if (mkdir(out_dir, 0777) != 0 && errno != EEXIST) {
        ret = s_fail(err, errlen, "%s: %s", out_dir, strerror(errno));
    }
    // All three are drawn whole before the first is replaced, so a reader
    // never sees a half-written picture, nor a new one beside a stale one
    // from a failed run; each is then replaced by zps_atomic.
    char *svg[S_N_PICTURES] = {0};
    size_t len[S_N_PICTURES] = {0};
    for (size_t i = 0; ret == 0 && i < S_N_PICTURES; i++) {
        ret = s_draw(&s_pictures[i], &lg, &svg[i], &len[i], err, errlen);
    }
    for (size_t i = 0; ret == 0 && i < S_N_PICTURES; i++) {
        char dst[4096];
        snprintf(dst, sizeof dst, "%s/%s", out_dir, s_pictures[i].name);
        if (zps_atomic_write(dst, svg[i], len[i], 0666) != ZPS_OK) {
            ret = s_fail(err, errlen, "%s: not written", dst);
        }
    }
    for (size_t i = 0; i < S_N_PICTURES; i++) {
        free(svg[i]);
    }
    s_log_fini(&lg);
    return ret;
}
