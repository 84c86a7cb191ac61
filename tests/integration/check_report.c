/* check_report.c - zps-ctl report and top as real processes: the pictures
 * are well-formed SVG that an XML parser (expat) accepts and that say what
 * the metrics log says; bad input fails with one line and leaves nothing
 * behind; top against no server gives up within its bound. */
#include <dirent.h>
#include <expat.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "zps_integration.h"
#include "zps_proc.h"

#define STEPS 300         // the log's steps before the rollback
#define ROLLBACK_FROM 180 // steps ROLLBACK_FROM..ROLLBACK_TO are logged twice
#define ROLLBACK_TO 200
#define SLOW_RANK 2       // the lagging worker
#define RUN_TIMEOUT_MS 20000

// ---------------------------------------------------------------- the log

// Step time of a step in whole microseconds, so that the value the test
// keeps and the "%.3f" text zps-ctl parses are the same double.
static long s_step_us(unsigned step, unsigned *rng)
{
    *rng = *rng * 1103515245u + 12345u;
    return 10000 + (long)(*rng >> 16) % 8000 + (step % 50 == 7 ? 30000 : 0);
}

static void s_write_step(FILE *f, unsigned step, long us, unsigned *rng)
{
    fprintf(f, "{\"step\":%u,\"epoch\":%u,\"loss\":0.5,\"samples\":128,\"step_ms\":%ld.%03ld,"
               "\"workers\":[",
            step, step / 100, us / 1000, us % 1000);
    const unsigned samples[3] = {43, 43, 42};
    for (unsigned r = 0; r < 3; r++) {
        *rng = *rng * 1103515245u + 12345u;
        double lag = (double)((*rng >> 16) % 1000) / 1000.0 + (r == SLOW_RANK ? 20.0 : 0.0);
        fprintf(f, "%s{\"rank\":%u,\"lag_ms\":%.3f,\"compute_ms\":5.000,\"samples\":%u}",
                r ? "," : "", r, lag, samples[r]);
    }
    fprintf(f, "]}\n");
}

// Writes a metrics log like zps-server's: STEPS steps of 3 workers, rank
// SLOW_RANK lagging, an evaluation record per 100 steps, and a rollback
// that logs ROLLBACK_FROM..ROLLBACK_TO again. The first pass of those
// steps is 500 ms slow: had zps-ctl kept it instead of the repeat, the
// p95 would show it. ms_out receives the step time that counts per step.
static void s_write_log(const char *path, double *ms_out)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    unsigned rng = 7;
    for (unsigned s = 0; s < STEPS; s++) {
        long us = s_step_us(s, &rng);
        if (s >= ROLLBACK_FROM && s <= ROLLBACK_TO) {
            s_write_step(f, s, 500000, &rng);
        } else {
            s_write_step(f, s, us, &rng);
            ms_out[s] = (double)us / 1000.0;
        }
        if (s == ROLLBACK_TO) {
            for (unsigned r = ROLLBACK_FROM; r <= ROLLBACK_TO; r++) {
                long rus = s_step_us(r, &rng);
                s_write_step(f, r, rus, &rng);
                ms_out[r] = (double)rus / 1000.0;
            }
        }
        if (s % 100 == 99) {
            fprintf(f, "{\"epoch\":%u,\"test_accuracy\":0.853600,\"test_loss\":0.409362}\n",
                    s / 100);
        }
    }
    ck_assert_int_eq(fclose(f), 0);
}

static int s_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

// The quantile zps_report.h documents: linear between the closest ranks.
static double s_quantile(double *v, size_t n, double p)
{
    qsort(v, n, sizeof *v, s_cmp_double);
    double pos = p * (double)(n - 1);
    size_t i = (size_t)pos;
    if (i + 1 >= n) {
        return v[n - 1];
    }
    return v[i] + (v[i + 1] - v[i]) * (pos - (double)i);
}

// ---------------------------------------------------------------- the SVG

// What the test needs from one SVG, gathered by expat callbacks.
typedef struct svg_info {
    int depth;               // element nesting while parsing
    bool root_svg;           // the root element is <svg>
    bool root_sized;         // ... with width, height and viewBox
    int n_elements;          // all elements
    bool row_rank[8];        // <g data-rank=R> seen (heatmap rows)
    int n_rows;              // <g data-rank> elements
    int n_bands;             // <polygon data-rank> elements (shares)
    char stat_text[2][64];   // text of <text data-stat=median|p95>
    char stat_value[2][32];  // data-value of <line data-stat=median|p95>
    int capture;             // index+1 of the stat text being read, 0: none
} svg_info;

static const char *s_attr(const XML_Char **attrs, const char *name)
{
    for (int i = 0; attrs[i]; i += 2) {
        if (strcmp(attrs[i], name) == 0) {
            return attrs[i + 1];
        }
    }
    return NULL;
}

static void XMLCALL s_start(void *ud, const XML_Char *name, const XML_Char **attrs)
{
    svg_info *si = ud;
    if (si->depth == 0) {
        si->root_svg = strcmp(name, "svg") == 0;
        si->root_sized = s_attr(attrs, "width") && s_attr(attrs, "height") &&
                         s_attr(attrs, "viewBox");
    }
    si->depth++;
    si->n_elements++;
    const char *rank = s_attr(attrs, "data-rank");
    if (rank && strcmp(name, "g") == 0) {
        si->n_rows++;
        int r = atoi(rank);
        if (r >= 0 && r < 8) {
            si->row_rank[r] = true;
        }
    }
    if (rank && strcmp(name, "polygon") == 0) {
        si->n_bands++;
    }
    const char *stat = s_attr(attrs, "data-stat");
    int k = !stat ? -1 : strcmp(stat, "median") == 0 ? 0 : strcmp(stat, "p95") == 0 ? 1 : -1;
    if (k >= 0 && strcmp(name, "text") == 0) {
        si->capture = k + 1;
        si->stat_text[k][0] = '\0';
    }
    const char *value = s_attr(attrs, "data-value");
    if (k >= 0 && strcmp(name, "line") == 0 && value) {
        snprintf(si->stat_value[k], sizeof si->stat_value[k], "%s", value);
    }
}

static void XMLCALL s_end(void *ud, const XML_Char *name)
{
    (void)name;
    svg_info *si = ud;
    si->depth--;
    si->capture = 0;
}

static void XMLCALL s_chars(void *ud, const XML_Char *s, int len)
{
    svg_info *si = ud;
    if (si->capture) {
        char *t = si->stat_text[si->capture - 1];
        size_t have = strlen(t), room = sizeof si->stat_text[0] - 1 - have;
        size_t n = (size_t)len < room ? (size_t)len : room;
        memcpy(t + have, s, n);
        t[have + n] = '\0';
    }
}

// Parses one picture; fails the test unless it is well-formed XML whose
// root is a sized <svg>.
static void s_parse_svg(const char *path, svg_info *si)
{
    memset(si, 0, sizeof *si);
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "%s missing", path);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    ck_assert_uint_lt(n, sizeof buf);
    XML_Parser p = XML_ParserCreate("UTF-8");
    XML_SetUserData(p, si);
    XML_SetElementHandler(p, s_start, s_end);
    XML_SetCharacterDataHandler(p, s_chars);
    enum XML_Status st = XML_Parse(p, buf, (int)n, 1);
    ck_assert_msg(st == XML_STATUS_OK, "%s: line %lu: %s", path,
                  (unsigned long)XML_GetCurrentLineNumber(p),
                  XML_ErrorString(XML_GetErrorCode(p)));
    XML_ParserFree(p);
    ck_assert_msg(si->root_svg && si->root_sized, "%s: root is not a sized <svg>", path);
    ck_assert_int_gt(si->n_elements, 20);
}

// ---------------------------------------------------------------- helpers

// Runs zps-ctl report, its output to <scratch>/log; returns its exit status.
static int s_report(zps_procs *ps, const char *metrics, const char *out, const char *log)
{
    const char *args[] = {"report", "--metrics", metrics, "--out", out, NULL};
    pid_t p = zps_procs_start(ps, "zps-ctl", log, args);
    return zps_procs_wait(ps, p, RUN_TIMEOUT_MS);
}

// Lines in a file (its last line counted even without a newline).
static int s_count_lines(const char *path, char *first, size_t len)
{
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    int lines = 0, c, prev = '\n';
    size_t k = 0;
    while ((c = fgetc(f)) != EOF) {
        if (lines == 0 && c != '\n' && k + 1 < len) {
            first[k++] = (char)c;
        }
        lines += c == '\n';
        prev = c;
    }
    fclose(f);
    first[k] = '\0';
    return lines + (prev != '\n');
}

// Entries in a directory other than . and ..; -1 if it does not exist.
static int s_count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) {
        return -1;
    }
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    }
    closedir(d);
    return n;
}

// ---------------------------------------------------------------- tests

START_TEST(test_report_draws_well_formed_svgs_of_the_log)
{
    zps_procs ps;
    zps_procs_init(&ps, "report-svg");
    static double ms[STEPS];
    char metrics[600], out[600], path[700];
    snprintf(metrics, sizeof metrics, "%s", zps_procs_path(&ps, "metrics.jsonl"));
    snprintf(out, sizeof out, "%s", zps_procs_path(&ps, "report"));
    s_write_log(metrics, ms);
    ck_assert_int_eq(s_report(&ps, metrics, out, "report.log"), 0);

    svg_info si;
    snprintf(path, sizeof path, "%s/lag_heatmap.svg", out);
    s_parse_svg(path, &si);
    ck_assert_int_eq(si.n_rows, 3); // one row per worker
    ck_assert(si.row_rank[0] && si.row_rank[1] && si.row_rank[2]);

    snprintf(path, sizeof path, "%s/shares.svg", out);
    s_parse_svg(path, &si);
    ck_assert_int_eq(si.n_bands, 3);

    // The median and p95 labels are those of the data, the repeated
    // steps counted once, with their second (kept) step time.
    double med = s_quantile(ms, STEPS, 0.5), p95 = s_quantile(ms, STEPS, 0.95);
    ck_assert_double_lt(p95, 100); // the test's own data: the slow pass is not in ms
    char want[64];
    snprintf(path, sizeof path, "%s/step_time.svg", out);
    s_parse_svg(path, &si);
    snprintf(want, sizeof want, "median %.2f ms", med);
    ck_assert_str_eq(si.stat_text[0], want);
    snprintf(want, sizeof want, "p95 %.2f ms", p95);
    ck_assert_str_eq(si.stat_text[1], want);
    snprintf(want, sizeof want, "%.3f", med);
    ck_assert_str_eq(si.stat_value[0], want);
    snprintf(want, sizeof want, "%.3f", p95);
    ck_assert_str_eq(si.stat_value[1], want);

    // Nothing else in the directory: the temporary files were renamed.
    ck_assert_int_eq(s_count_entries(out), 3);
    zps_procs_fini(&ps, false);
}
END_TEST

START_TEST(test_report_missing_log_fails_with_one_line)
{
    zps_procs ps;
    zps_procs_init(&ps, "report-missing");
    char metrics[600], out[600], first[256];
    snprintf(metrics, sizeof metrics, "%s", zps_procs_path(&ps, "no-such.jsonl"));
    snprintf(out, sizeof out, "%s", zps_procs_path(&ps, "report"));
    int rc = s_report(&ps, metrics, out, "report.log");
    ck_assert_int_gt(rc, 0);
    ck_assert_int_eq(s_count_lines(zps_procs_path(&ps, "report.log"), first, sizeof first), 1);
    ck_assert_ptr_nonnull(strstr(first, "no-such.jsonl"));
    ck_assert_int_eq(s_count_entries(out), -1); // not even the directory
    zps_procs_fini(&ps, false);
}
END_TEST

START_TEST(test_report_malformed_line_fails_and_writes_nothing)
{
    zps_procs ps;
    zps_procs_init(&ps, "report-malformed");
    static double ms[STEPS];
    char metrics[600], out[600], first[256];
    snprintf(metrics, sizeof metrics, "%s", zps_procs_path(&ps, "metrics.jsonl"));
    snprintf(out, sizeof out, "%s", zps_procs_path(&ps, "report"));
    s_write_log(metrics, ms);
    // A record cut short, as by a crash mid-write, after all the good ones.
    FILE *f = fopen(metrics, "a");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "{\"step\":300,\"epoch\":3,\"loss\":0.5,\"samples\":128,\"step_ms\":1");
    fclose(f);
    ck_assert_int_eq(mkdir(out, 0755), 0);

    int rc = s_report(&ps, metrics, out, "cut.log");
    ck_assert_int_gt(rc, 0);
    ck_assert_int_eq(s_count_lines(zps_procs_path(&ps, "cut.log"), first, sizeof first), 1);
    ck_assert_msg(strstr(first, "malformed") != NULL, "error line: %s", first);
    ck_assert_int_eq(s_count_entries(out), 0);

    // A line that is JSON but not a record is refused just the same.
    f = fopen(metrics, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "{\"step\":0,\"samples\":128,\"step_ms\":\"fast\",\"workers\":[]}\n");
    fclose(f);
    rc = s_report(&ps, metrics, out, "string.log");
    ck_assert_int_gt(rc, 0);
    ck_assert_int_eq(s_count_lines(zps_procs_path(&ps, "string.log"), first, sizeof first), 1);
    ck_assert_msg(strstr(first, ":1:") != NULL, "error line: %s", first);
    ck_assert_int_eq(s_count_entries(out), 0);
    zps_procs_fini(&ps, false);
}
END_TEST

START_TEST(test_report_top_without_server_fails_within_bound)
{
    zps_procs ps;
    zps_procs_init(&ps, "report-top");
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", zps_free_port());
    const char *args[] = {"top", ep, "--iterations", "2", "--interval-ms", "100", NULL};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pid_t p = zps_procs_start(&ps, "zps-ctl", "top.log", args);
    // Two requests of at most 3 s each, and one interval between them.
    int rc = zps_procs_wait(&ps, p, 10000);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    ck_assert_int_gt(rc, 0);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    ck_assert_double_lt(secs, 8);
    zps_procs_fini(&ps, false);
}
END_TEST

Suite *zps_suite_report(void)
{
    Suite *s = suite_create("report");
    TCase *tc = tcase_create("report");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_report_draws_well_formed_svgs_of_the_log);
    tcase_add_test(tc, test_report_missing_log_fails_with_one_line);
    tcase_add_test(tc, test_report_malformed_line_fails_and_writes_nothing);
    tcase_add_test(tc, test_report_top_without_server_fails_within_bound);
    suite_add_tcase(s, tc);
    return s;
}
