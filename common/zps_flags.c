/* zps_flags.c - ZPS_<FLAG> environment variables as arguments, and the
 * numeric flag parsers of both daemons. */
#include "zps_flags.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

bool zps_flags_env_name(const char *flag, char *out, size_t len)
{
    int n = snprintf(out, len, "ZPS_%s", flag);
    if (n < 0 || (size_t)n >= len) {
        return false;
    }
    for (char *p = out + 4; *p; p++) {
        *p = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
    }
    return true;
}

// The value of variable `name` in envp, or NULL.
static const char *s_lookup(char **envp, const char *name)
{
    size_t n = strlen(name);
    for (char **e = envp; e && *e; e++) {
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=') {
            return *e + n + 1;
        }
    }
    return NULL;
}

// A switch's value: 1 on, 0 off, -1 neither.
static int s_switch(const char *v)
{
    static const char *on[] = {"1", "true", "yes", "on"};
    static const char *off[] = {"", "0", "false", "no", "off"};
    for (size_t i = 0; i < sizeof on / sizeof on[0]; i++) {
        if (strcasecmp(v, on[i]) == 0) {
            return 1;
        }
    }
    for (size_t i = 0; i < sizeof off / sizeof off[0]; i++) {
        if (strcasecmp(v, off[i]) == 0) {
            return 0;
        }
    }
    return -1;
}

zps_err zps_flags_from_env(const char *prog, const struct option *longopts, char **envp,
                           int argc, char **argv, int *out_argc, char ***out_argv)
{
    size_t n_opts = 0, names = 0;
    for (; longopts[n_opts].name; n_opts++) {
        names += strlen(longopts[n_opts].name) + 3; // "--", the name, its NUL
    }
    // At most two arguments per flag, the command line and the NULL; then
    // the "--name" strings, so that one free releases everything.
    size_t slots = 2 * n_opts + (size_t)argc + 1;
    char **v = malloc(slots * sizeof *v + names);
    if (!v) {
        return ZPS_ENOMEM;
    }
    char *pool = (char *)(v + slots);
    int n = 0;
    v[n++] = argv[0];
    for (size_t i = 0; i < n_opts; i++) {
        char name[128];
        const char *value;
        if (strcmp(longopts[i].name, "help") == 0 ||
            !zps_flags_env_name(longopts[i].name, name, sizeof name) ||
            !(value = s_lookup(envp, name))) {
            continue;
        }
        int on = longopts[i].has_arg == no_argument ? s_switch(value) : 1;
        if (on < 0) {
            fprintf(stderr, "%s: %s: '%s' is not 1/true/yes/on or 0/false/no/off\n", prog, name,
                    value);
            free(v);
            return ZPS_EINVAL;
        }
        if (!on) {
            continue;
        }
        size_t len = strlen(longopts[i].name) + 3;
        snprintf(pool, len, "--%s", longopts[i].name);
        v[n++] = pool;
        pool += len;
        if (longopts[i].has_arg != no_argument) {
            v[n++] = (char *)value;
        }
    }
    for (int i = 1; i < argc; i++) {
        v[n++] = argv[i];
    }
    v[n] = NULL;
    *out_argc = n;
    *out_argv = v;
    return ZPS_OK;
}

bool zps_flags_int(const char *prog, const char *flag, const char *text, long long lo,
                   long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > hi) {
        fprintf(stderr, "%s: %s: '%s' is not an integer in %lld..%lld\n", prog, flag, text, lo,
                hi);
        return false;
    }
    *out = v;
    return true;
}

bool zps_flags_real(const char *prog, const char *flag, const char *text, double lo, double hi,
                    double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "%s: %s: '%s' is not a number in %g..%g\n", prog, flag, text, lo, hi);
        return false;
    }
    *out = v;
    return true;
}
