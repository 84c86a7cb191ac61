/* zps_log.c - stderr logger: one line per call, written with one fprintf so
 * lines from concurrent processes sharing a terminal do not interleave. */
#include "zps_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

static char s_name[32] = "zps";
static zps_log_level s_level = ZPS_LOG_INFO;

void zps_log_set_name(const char *name)
{
    snprintf(s_name, sizeof s_name, "%s", name);
}

void zps_log_set_level(zps_log_level level)
{
    s_level = level;
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
    static const char *tags[] = {"DEBUG", "INFO", "WARN", "ERROR"};
    if (level < s_level) {
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
    fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s %s: %s\n", tm.tm_year + 1900,
            tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
            (long)(tv.tv_usec / 1000), tags[level], s_name, msg);
}
