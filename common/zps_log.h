/* zps_log.h - leveled, timestamped logging to stderr.
 *
 * Daemons run under supervisors that collect stderr, so that is the only
 * sink. The process name ("server[0]", "worker[1]") is set once at start;
 * a thread may name its own lines. */
#ifndef ZPS_LOG_H
#define ZPS_LOG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

typedef enum zps_log_level {
    ZPS_LOG_DEBUG = 0,
    ZPS_LOG_INFO,
    ZPS_LOG_WARN,
    ZPS_LOG_ERROR,
} zps_log_level;

void zps_log_set_name(const char *name);
// Names this thread's lines instead of the process's name: a process with
// many libzps clients, each on a thread of its own (bench/swarm's
// members), names each line by its client. "" goes back to the process's.
void zps_log_set_thread_name(const char *name);
// A sink instead of stderr (libzps's zps_set_log_hook): msg is the message
// alone, without time stamp or name; fn NULL restores stderr.
typedef void (*zps_log_hook)(void *arg, int level, const char *msg);
void zps_log_set_hook(zps_log_hook fn, void *arg);
// The last ERROR message this thread logged (even below the level), "" after
// zps_log_clear_last_error: the sentence libzps's zps_errmsg gives.
const char *zps_log_last_error(void);
void zps_log_clear_last_error(void);
void zps_log_set_level(zps_log_level level);
// --log-json: each line one JSON object {"ts","level","proc","pid","msg"},
// for collectors that parse fields instead of text.
void zps_log_set_json(bool on);
// Parses "debug|info|warn|error"; false on anything else.
bool zps_log_parse_level(const char *text, zps_log_level *out);

void zps_log(zps_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define zps_log_debug(...) zps_log(ZPS_LOG_DEBUG, __VA_ARGS__)
#define zps_log_info(...) zps_log(ZPS_LOG_INFO, __VA_ARGS__)
#define zps_log_warn(...) zps_log(ZPS_LOG_WARN, __VA_ARGS__)
#define zps_log_error(...) zps_log(ZPS_LOG_ERROR, __VA_ARGS__)

// A bound on lines a peer can cause (refusals): at most ZPS_LOG_LIMIT_LINES
// in any second; the rest are counted, and the next line let through says
// how many were left out. Zeroed memory is a fresh limiter.
#define ZPS_LOG_LIMIT_LINES 10

typedef struct zps_log_limit {
    double window_ms;    // start of the current second
    uint32_t lines;      // lines let through in it
    uint64_t suppressed; // lines left out since the last one let through
} zps_log_limit;

// Whether a line may be logged at now_ms; if so, *left_out is how many
// were left out before it (and the count starts again).
bool zps_log_limit_pass(zps_log_limit *l, double now_ms, uint64_t *left_out);

// Bugs only (broken invariants), never input from the network.
#define ZPS_ASSERT(x) \
    do { \
        if (!(x)) { \
            zps_log_error("assertion failed: %s (%s:%d)", #x, __FILE__, __LINE__); \
            abort(); \
        } \
    } while (0)

#endif
