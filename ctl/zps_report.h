/* zps_report.h - zps-ctl report: SVG pictures drawn from the coordinator's
 * metrics log (zps-server --metrics-log), for a person to look at.
 *
 * Three files, each self-contained SVG about 960 px wide:
 *   lag_heatmap.svg  worker x step, coloured by lag_ms (one <g data-rank="R">
 *                    per worker row)
 *   step_time.svg    step_ms over steps, with its median and p95 as labelled
 *                    lines (data-stat="median"/"p95", data-value="%.3f")
 *   shares.svg       each worker's share of the global batch, stacked
 *
 * Quantiles are linear between the closest ranks (numpy's default):
 * q(p) = v[i] + (v[i+1] - v[i]) * f with i + f = p * (n - 1), v sorted. */
#ifndef ZPS_REPORT_H
#define ZPS_REPORT_H

#include <stddef.h>

// Reads the metrics log at metrics_path and writes the three pictures into
// out_dir (created if missing). The log is read whole before anything is
// written, and the files are written under temporary names and renamed at
// the end, so a failure leaves none of them half-written. Returns 0, or -1
// with a one-line reason in err.
int zps_report_write(const char *metrics_path, const char *out_dir, char *err, size_t errlen);

#endif
