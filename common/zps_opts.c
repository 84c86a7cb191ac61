/* zps_opts.c - a daemon's flag table read from the environment and the
 * command line, and written out as usage and as docs/running.md's table. */
#include "zps_opts.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "common/zps_log.h"

// getopt_long's value for every row; the row itself comes from longindex.
// Not a character, so that optopt tells our flags from unknown short ones.
#define S_ROW_VAL 256

// ---------------------------------------------------------------------------
// Values.

bool zps_opts_env_name(const char *flag, char *out, size_t len)
{
    int n = snprintf(out, len, "ZPS_%s", flag);
    if (n < 0 || (size_t)n >= len) {
        return false;
    }
    for (char *p = out + 4; *p; p++) {
        if (*p == '-') {
            *p = '_';
        } else {
            *p = (char)toupper((unsigned char)*p);
        }
    }
    return true;
}

bool zps_opts_read_int(const char *text, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > hi) {
        return false;
    }
    *out = v;
    return true;
}

bool zps_opts_read_real(const char *text, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    // The negated test also refuses NaN, which compares false both ways.
    if (errno || end == text || *end || !(v >= lo && v <= hi)) {
        return false;
    }
    *out = v;
    return true;
}

bool zps_opts_log_level(const char *text, void *field)
{
    zps_log_level *level = field;
    if (!zps_log_parse_level(text, level)) {
        return false;
    }
    zps_log_set_level(*level);
    return true;
}

// A switch's word: 1 on, 0 off, -1 neither.
static int s_switch_word(const char *v)
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

static void s_store_int(const zps_opts_row *row, void *field, long long v)
{
    switch (row->ctype) {
    case ZPS_OPTS_C_INT: *(int *)field = (int)v; break;
    case ZPS_OPTS_C_U32: *(uint32_t *)field = (uint32_t)v; break;
    case ZPS_OPTS_C_U64: *(uint64_t *)field = (uint64_t)v; break;
    default: *(double *)field = (double)v; break; // s_row_ok allows nothing else
    }
}

static bool s_int(const zps_opts_prog *prog, const zps_opts_row *row, const char *text, void *field)
{
    long long v;
    bool ok = zps_opts_read_int(text, row->or_zero ? 0 : row->lo, row->hi, &v) &&
              (v >= row->lo || (row->or_zero && v == 0));
    if (!ok) {
        fprintf(stderr, "%s: --%s: '%s' is not %s%lld..%lld\n", prog->name, row->name, text,
                row->or_zero ? "0 or " : "an integer in ", row->lo, row->hi);
        return false;
    }
    s_store_int(row, field, v);
    return true;
}

static bool s_real(const zps_opts_prog *prog, const zps_opts_row *row, const char *text, void *field)
{
    double v;
    if (!zps_opts_read_real(text, row->real_lo, row->real_hi, &v)) {
        fprintf(stderr, "%s: --%s: '%s' is not a number in %g..%g\n", prog->name, row->name, text,
                row->real_lo, row->real_hi);
        return false;
    }
    if (row->ctype == ZPS_OPTS_C_FLOAT) {
        *(float *)field = (float)v;
    } else {
        *(double *)field = v;
    }
    return true;
}

// One row's value into dst; false after one line on stderr.
static bool s_apply(const zps_opts_prog *prog, const zps_opts_row *row, const char *text, void *dst)
{
    void *field = (char *)dst + row->offset;
    switch (row->kind) {
    case ZPS_OPTS_STRING: *(const char **)field = text; return true;
    case ZPS_OPTS_SWITCH: *(bool *)field = true; return true;
    case ZPS_OPTS_INT: return s_int(prog, row, text, field);
    case ZPS_OPTS_REAL: return s_real(prog, row, text, field);
    case ZPS_OPTS_CUSTOM: break;
    }
    if (!row->parse(text, field)) {
        fprintf(stderr, "%s: --%s: '%s' is not %s\n", prog->name, row->name, text, row->accepts);
        return false;
    }
    return true;
}

// ---------------------------------------------------------------------------
// The table itself: a row that cannot work is the daemon's bug, caught
// (ZPS_ASSERT) at its first start rather than showing as a wrong value.

static bool s_ctype_fits(const zps_opts_row *row)
{
    switch (row->kind) {
    case ZPS_OPTS_STRING: return row->ctype == ZPS_OPTS_C_STR;
    case ZPS_OPTS_SWITCH: return row->ctype == ZPS_OPTS_C_BOOL;
    case ZPS_OPTS_REAL:
        return (row->ctype == ZPS_OPTS_C_FLOAT || row->ctype == ZPS_OPTS_C_DOUBLE) &&
               row->real_lo <= row->real_hi;
    case ZPS_OPTS_CUSTOM: return row->ctype == ZPS_OPTS_C_PARSER && row->parse && row->accepts;
    case ZPS_OPTS_INT: break;
    }
    if (row->lo > row->hi) {
        return false;
    }
    switch (row->ctype) {
    case ZPS_OPTS_C_INT: return row->lo >= INT_MIN && row->hi <= INT_MAX;
    case ZPS_OPTS_C_U32: return row->lo >= 0 && row->hi <= (long long)UINT32_MAX;
    case ZPS_OPTS_C_U64: return row->lo >= 0;
    case ZPS_OPTS_C_DOUBLE: return true;
    default: return false;
    }
}

// Each row: a name, help, a field of the kind's type, a metavar unless a switch.
static bool s_row_ok(const zps_opts_row *row)
{
    return row->name && row->help && s_ctype_fits(row) &&
           (row->kind == ZPS_OPTS_SWITCH) == (row->metavar == NULL);
}

// ---------------------------------------------------------------------------
// Parsing.

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

// The rows' variables of envp, in table order.
static bool s_parse_env(const zps_opts_prog *prog, char **envp, void *dst, bool *given)
{
    for (size_t i = 0; i < prog->n_opts; i++) {
        const zps_opts_row *row = &prog->opts[i];
        char name[128];
        const char *value;
        if (!zps_opts_env_name(row->name, name, sizeof name) || !(value = s_lookup(envp, name))) {
            continue;
        }
        if (row->kind == ZPS_OPTS_SWITCH) {
            int on = s_switch_word(value);
            if (on < 0) {
                fprintf(stderr, "%s: %s: '%s' is not 1/true/yes/on or 0/false/no/off\n",
                        prog->name, name, value);
                return false;
            }
            if (!on) {
                continue; // as if not set: a switch is off unless given
            }
        }
        if (!s_apply(prog, row, value, dst)) {
            return false;
        }
        given[i] = true;
    }
    return true;
}

// getopt_long's table for prog: its rows, then --help and --flags-markdown.
// Caller frees it.
static struct option *s_longopts(const zps_opts_prog *prog)
{
    struct option *lo = calloc(prog->n_opts + 3, sizeof *lo);
    if (!lo) {
        return NULL;
    }
    for (size_t i = 0; i < prog->n_opts; i++) {
        const zps_opts_row *row = &prog->opts[i];
        lo[i] = (struct option){row->name,
                                row->kind == ZPS_OPTS_SWITCH ? no_argument : required_argument,
                                NULL, S_ROW_VAL};
    }
    lo[prog->n_opts] = (struct option){"help", no_argument, NULL, S_ROW_VAL};
    lo[prog->n_opts + 1] = (struct option){"flags-markdown", no_argument, NULL, S_ROW_VAL};
    return lo;
}

// getopt_long's complaint (c is ':' or '?') as our one line.
static void s_bad_arg(const zps_opts_prog *prog, int c, const char *arg)
{
    if (c == ':') {
        fprintf(stderr, "%s: %s needs a value\n", prog->name, arg);
    } else if (optopt == S_ROW_VAL) {
        fprintf(stderr, "%s: '%s' takes no value\n", prog->name, arg);
    } else {
        fprintf(stderr, "%s: unknown flag '%s' (--help lists them)\n", prog->name, arg);
    }
}

static bool s_parse_argv(const zps_opts_prog *prog, const struct option *longopts, int argc,
                         char **argv, void *dst, bool *given, bool *exit_now)
{
    optind = 0; // glibc: start over, whatever an earlier parse left
    opterr = 0; // its messages are replaced by ours
    int c, idx = -1;
    while ((c = getopt_long(argc, argv, ":", longopts, &idx)) != -1) {
        if (c != S_ROW_VAL) {
            s_bad_arg(prog, c, argv[optind - 1]);
            return false;
        }
        size_t i = (size_t)idx;
        if (i >= prog->n_opts) {
            if (i == prog->n_opts) {
                zps_opts_usage(prog, stdout);
            } else {
                zps_opts_markdown(prog, stdout);
            }
            *exit_now = true;
            return true;
        }
        if (!s_apply(prog, &prog->opts[i], optarg, dst)) {
            return false;
        }
        given[i] = true;
    }
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", prog->name, argv[optind]);
        return false;
    }
    return true;
}

zps_err zps_opts_parse(const zps_opts_prog *prog, char **envp, int argc, char **argv, void *dst,
                       bool *given, bool *exit_now)
{
    *exit_now = false;
    for (size_t i = 0; i < prog->n_opts; i++) {
        ZPS_ASSERT(s_row_ok(&prog->opts[i]));
    }
    bool *seen = calloc(prog->n_opts + 1, sizeof *seen);
    struct option *longopts = s_longopts(prog);
    zps_err err = ZPS_ENOMEM;
    if (seen && longopts) {
        bool ok = s_parse_env(prog, envp, dst, seen) &&
                  s_parse_argv(prog, longopts, argc, argv, dst, seen, exit_now);
        err = ok ? ZPS_OK : ZPS_EINVAL;
    }
    if (err == ZPS_OK && given) {
        memcpy(given, seen, prog->n_opts * sizeof *given);
    }
    free(longopts);
    free(seen);
    return err;
}

int zps_opts_parse_main(const zps_opts_prog *prog, int argc, char **argv, void *dst,
                        bool *given)
{
    bool exit_now;
    if (zps_opts_parse(prog, environ, argc, argv, dst, given, &exit_now) != ZPS_OK) {
        return 2;
    }
    return exit_now ? 0 : -1;
}

bool zps_opts_given(const zps_opts_prog *prog, const bool *given, const char *name)
{
    for (size_t i = 0; i < prog->n_opts; i++) {
        if (strcmp(prog->opts[i].name, name) == 0) {
            return given[i];
        }
    }
    return false;
}

// ---------------------------------------------------------------------------
// Usage and the flag table of docs/running.md.

// Usage lines wrap at this column.
#define S_COLUMNS 79
// The widest flag column, so that a long flag does not push every help far right.
#define S_FLAG_COLUMN_MAX 26

// "--name METAVAR" (or "--name") into buf.
static void s_flag_text(const zps_opts_row *row, char *buf, size_t len)
{
    snprintf(buf, len, "--%s%s%s", row->name, row->metavar ? " " : "",
             row->metavar ? row->metavar : "");
}

// text as words filling the lines from column `col` (already reached) to
// S_COLUMNS, every further line indented to `indent`.
static void s_wrap(FILE *f, const char *text, size_t col, size_t indent)
{
    const char *p = text;
    bool first = true;
    while (*p) {
        while (*p == ' ') {
            p++;
        }
        size_t word = strcspn(p, " ");
        if (word == 0) {
            break;
        }
        if (!first && col + 1 + word > S_COLUMNS) {
            fprintf(f, "\n%*s", (int)indent, "");
            col = indent;
        } else if (!first) {
            fputc(' ', f);
            col++;
        }
        fprintf(f, "%.*s", (int)word, p);
        col += word;
        p += word;
        first = false;
    }
    fputc('\n', f);
}

void zps_opts_usage(const zps_opts_prog *prog, FILE *f)
{
    size_t width = 0;
    char flag[128];
    for (size_t i = 0; i < prog->n_opts; i++) {
        s_flag_text(&prog->opts[i], flag, sizeof flag);
        size_t n = strlen(flag) + 2;
        width = n > width && n <= S_FLAG_COLUMN_MAX ? n : width;
    }
    fputs(prog->synopsis, f);
    for (size_t i = 0; i < prog->n_opts; i++) {
        const zps_opts_row *row = &prog->opts[i];
        s_flag_text(row, flag, sizeof flag);
        char help[1024];
        snprintf(help, sizeof help, "%s%s%s%s", row->help, row->def ? " (default " : "",
                 row->def ? row->def : "", row->def ? ")" : "");
        // A flag wider than its column has its help start on the next line.
        if (strlen(flag) + 2 > width) {
            fprintf(f, "  %s\n%*s", flag, (int)(2 + width), "");
        } else {
            fprintf(f, "  %-*s", (int)width, flag);
        }
        s_wrap(f, help, 2 + width, 2 + width);
    }
    fputs("Every flag may come from the environment instead: --some-flag X as\n"
          "ZPS_SOME_FLAG=X, a switch as ZPS_SOME_FLAG=1. The command line wins.\n", f);
    if (prog->epilogue) {
        fputs(prog->epilogue, f);
    }
}

// A table cell: a | would end it, so it is escaped.
static void s_cell(FILE *f, const char *text)
{
    for (const char *p = text; *p; p++) {
        if (*p == '|') {
            fputc('\\', f);
        }
        fputc(*p, f);
    }
}

void zps_opts_markdown(const zps_opts_prog *prog, FILE *f)
{
    fputs("| flag | default | meaning |\n|---|---|---|\n", f);
    for (size_t i = 0; i < prog->n_opts; i++) {
        const zps_opts_row *row = &prog->opts[i];
        char flag[128];
        s_flag_text(row, flag, sizeof flag);
        fputs("| `", f);
        s_cell(f, flag);
        fputs("` | ", f);
        s_cell(f, row->def ? row->def : "");
        fputs(" | ", f);
        s_cell(f, row->help);
        fputs(" |\n", f);
    }
}
