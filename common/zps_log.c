/* zps_log.c - stderr logger: one line per call, written with one fprintf so
 * lines from concurrent processes sharing a terminal do not interleave. */
#include "zps_log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static char s_name[32] = "zps";
// Every libzps client of a process names it at JOB while others log (a
// member a thread in bench/swarm): a line copies the name under the lock,
// so it never carries half of one name and half of another.
static pthread_mutex_t s_name_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread char s_thread_name[sizeof s_name]; // "" : the process's
static zps_log_level s_level = ZPS_LOG_INFO;
static bool s_json;
static zps_log_hook s_hook;   // borrowed: the caller's sink, or NULL (stderr)
static void *s_hook_arg;      // borrowed: its argument

// The last ERROR line of this thread, for libzps's zps_errmsg.
static __thread char s_last_error[256];

const char *zps_log_last_error(void)
{
    return s_last_error;
}

void zps_log_clear_last_error(void)
{
    s_last_error[0] = '\0';
}

void zps_log_set_hook(zps_log_hook fn, void *arg)
{
    s_hook_arg = arg;
    s_hook = fn;
}

void zps_log_set_name(const char *name)
{
    pthread_mutex_lock(&s_name_lock);
    snprintf(s_name, sizeof s_name, "%s", name);
    pthread_mutex_unlock(&s_name_lock);
}

void zps_log_set_thread_name(const char *name)
{
    snprintf(s_thread_name, sizeof s_thread_name, "%s", name);
}

void zps_log_set_level(zps_log_level level)
{
    s_level = level;
}

void zps_log_set_json(bool on)
{
    s_json = on;
}

// msg as the inside of a JSON string: quotes, backslashes and control
// characters escaped (a message may quote a peer's text).
static void s_json_escape(const char *msg, char *out, size_t len)
{
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)msg; *p && o + 7 < len; p++) {
        if (*p == '"' || *p == '\\') {
            out[o++] = '\\';
            out[o++] = (char)*p;
        } else if (*p < 0x20) {
            o += (size_t)snprintf(out + o, len - o, "\\u%04x", *p);
        } else {
            out[o++] = (char)*p;
        }
    }
    out[o] = '\0';
}

bool zps_log_parse_level(const char *text, zps_log_level *out)
{
    static const char *names[] = {"debug", "info", "warn", "error"};
    for (int i = 0; i < 4; i++) {
        if (strcmp(text, names[i]) == 0) {
            *out = (zps_log_level)i;
            return true;
        }
    }
    return false;
}

void zps_log(zps_log_level level, const char *fmt, ...)
{
    if (level < s_level && level != ZPS_LOG_ERROR) {
        return;
    }
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (level == ZPS_LOG_ERROR) {
        size_t n = strnlen(msg, sizeof s_last_error - 1);
        memcpy(s_last_error, msg, n);
        s_last_error[n] = '\0';
        if (level < s_level) {
            return;
        }
    }
    if (s_hook) {
        s_hook(s_hook_arg, (int)level, msg);
        return;
    }
    char proc[sizeof s_name];
    if (s_thread_name[0]) {
        memcpy(proc, s_thread_name, sizeof proc);
    } else {
        pthread_mutex_lock(&s_name_lock);
        memcpy(proc, s_name, sizeof proc);
        pthread_mutex_unlock(&s_name_lock);
    }
    char ts[64];
    snprintf(ts, sizeof ts, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
             (long)(tv.tv_usec / 1000));
    if (s_json) {
        static const char *levels[] = {"debug", "info", "warn", "error"};
        char esc[6 * sizeof msg + 1], name[6 * sizeof s_name + 1];
        s_json_escape(msg, esc, sizeof esc);
        s_json_escape(proc, name, sizeof name);
        fprintf(stderr, "{\"ts\":\"%s\",\"level\":\"%s\",\"proc\":\"%s\",\"pid\":%ld,\"msg\":\"%s\"}\n",
                ts, levels[level], name, (long)getpid(), esc);
    } else {
        // A message may quote a peer's text (a host name, an error): a
        // control character must not start a line of its own that looks
        // like ours ("... test accuracy 1.0000").
        for (char *p = msg; *p; p++) {
            if ((unsigned char)*p < 0x20 || *p == 0x7f) {
                *p = '?';
            }
        }
        static const char *tags[] = {"DEBUG", "INFO", "WARN", "ERROR"};
        fprintf(stderr, "%s %-5s %s: %s\n", ts, tags[level], proc, msg);
    }
}

bool zps_log_limit_pass(zps_log_limit *l, double now_ms, uint64_t *left_out)
{
    if (now_ms - l->window_ms >= 1000.0 || now_ms < l->window_ms) {
        l->window_ms = now_ms;
        l->lines = 0;
    }
    if (l->lines >= ZPS_LOG_LIMIT_LINES) {
        l->suppressed++;
        return false;
    }
    l->lines++;
    *left_out = l->suppressed;
    l->suppressed = 0;
    return true;
}
