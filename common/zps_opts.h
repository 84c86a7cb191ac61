/* zps_opts.h - the daemons' flags, each described once, in a table.
 *
 * A daemon lists its flags as rows of zps_opts_row: the long name, how the value
 * is read (kind), where it goes in the daemon's options struct (an offset
 * and the field's C type), its accepted range, its default as text, its
 * metavar and its help. From that one table come the parsing of the
 * command line and of the environment (--some-flag X may also be given as
 * ZPS_SOME_FLAG=X, for launchers: systemd EnvironmentFile, a Kubernetes
 * ConfigMap, a Slurm script), the --help text, and docs/running.md's flag table
 * (the hidden --flags-markdown), so the three cannot drift apart. What
 * relates several flags stays with the daemon, after parsing. */
#ifndef ZPS_OPTS_H
#define ZPS_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "common/zps_err.h"

// How a flag's text becomes a value.
typedef enum zps_opts_kind {
    ZPS_OPTS_STRING, // the text itself, borrowed from argv or the environment
    ZPS_OPTS_INT,    // a decimal integer in lo..hi (or 0 with or_zero)
    ZPS_OPTS_REAL,   // a number in real_lo..real_hi
    ZPS_OPTS_SWITCH, // no value: the field becomes true
    ZPS_OPTS_CUSTOM, // parse() reads the text into the field
} zps_opts_kind;

// The C type of the field a flag's value goes to.
typedef enum zps_opts_ctype {
    ZPS_OPTS_C_STR,    // const char * (STRING)
    ZPS_OPTS_C_BOOL,   // bool (SWITCH)
    ZPS_OPTS_C_INT,    // int (INT)
    ZPS_OPTS_C_U32,    // uint32_t (INT)
    ZPS_OPTS_C_U64,    // uint64_t (INT)
    ZPS_OPTS_C_FLOAT,  // float (REAL)
    ZPS_OPTS_C_DOUBLE, // double (INT or REAL)
    ZPS_OPTS_C_PARSER, // whatever parse() writes (CUSTOM)
} zps_opts_ctype;

// A custom flag's reader: text into *field; false, printing nothing, if
// the text is not a value (zps_opts prints the line, with `accepts`).
typedef bool zps_opts_parse_fn(const char *text, void *field);

typedef struct zps_opts_row {
    const char *name;        // the long name, without "--"
    zps_opts_kind kind;      // how the text is read
    const char *metavar;     // the value's name in usage ("N", "FILE"); NULL for a switch
    const char *def;         // the default as shown (usage, docs); NULL: none to show
    const char *help;        // what it does, for usage and the docs
    size_t offset;           // offsetof(the options struct, the field)
    zps_opts_ctype ctype;    // the field's C type
    long long lo, hi;        // INT: the accepted range
    bool or_zero;            // INT: 0 (off) is accepted besides lo..hi
    double real_lo, real_hi; // REAL: the accepted range
    zps_opts_parse_fn *parse; // CUSTOM: the reader
    const char *accepts;     // CUSTOM: what the reader takes, for the error line
} zps_opts_row;

// A program: its name and its table, with the text around the flags.
typedef struct zps_opts_prog {
    const char *name;     // "zps-server": the first word of every error line
    const char *synopsis; // the usage lines before the flags
    const char *epilogue; // lines after the flags (signals); may be NULL
    const zps_opts_row *opts;  // the table, borrowed
    size_t n_opts;        // its rows
} zps_opts_prog;

// "ZPS_SOME_FLAG" for "some-flag", in out (size len). False if it does not fit.
bool zps_opts_env_name(const char *flag, char *out, size_t len);

// Reads the flags of prog into dst (the options struct, defaults already
// set): first each variable of envp named after a row (ZPS_SOME_FLAG, in
// table order), then the command line, so the command line wins. A
// switch's variable takes 1/true/yes/on or 0/false/no/off (or empty: off);
// variables that name no flag are ignored, so one environment can serve
// the server and the worker. given (n_opts entries, may be NULL) tells
// which rows got a value, from either. Values are borrowed from argv and
// envp. ZPS_OK with *exit_now after --help (the usage) or --flags-markdown
// (the docs' table) went to stdout; ZPS_EINVAL after one line on stderr
// for a bad value, an unknown flag, a missing value or a stray argument;
// ZPS_ENOMEM. A row that cannot work (a field type the kind cannot fill, a
// range the type cannot hold) is a bug: ZPS_ASSERT.
zps_err zps_opts_parse(const zps_opts_prog *prog, char **envp, int argc, char **argv, void *dst,
                       bool *given, bool *exit_now);

// zps_opts_parse for a daemon's main, with the process's environment:
// returns -1 to go on, or the exit status of a process that ends here (0
// after --help or --flags-markdown, 2 after a refusal, said in one line).
int zps_opts_parse_main(const zps_opts_prog *prog, int argc, char **argv, void *dst,
                        bool *given);

// Whether the row named `name` got a value (given as zps_opts_parse filled
// it). False for a name that is no row.
bool zps_opts_given(const zps_opts_prog *prog, const bool *given, const char *name);

// The usage text: synopsis, one entry a flag, the environment rule, epilogue.
void zps_opts_usage(const zps_opts_prog *prog, FILE *f);

// The flag table of docs/running.md: a header, then `| \`--flag ARG\` | default | help |`.
void zps_opts_markdown(const zps_opts_prog *prog, FILE *f);

// Quiet number readers, for custom flags built on them: the whole text is
// a number in [lo, hi]. False, with *out untouched, otherwise.
bool zps_opts_read_int(const char *text, long long lo, long long hi, long long *out);
bool zps_opts_read_real(const char *text, double lo, double hi, double *out);

// A CUSTOM reader both daemons use: --log-level into a zps_log_level,
// which it also sets as the log's level at once (so that what the rest of
// the parse logs is already filtered by it).
bool zps_opts_log_level(const char *text, void *field);

#endif
