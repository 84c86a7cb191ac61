/* check_opts.c - a small flag table read from the environment and the
 * command line (the command line winning), every kind of row, the one line
 * of each refusal, and the usage and docs table written from it. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/zps_log.h"
#include "common/zps_opts.h"
#include "tests/zps_check.h"

typedef struct s_cfg {
    const char *name;    // --name
    bool on;             // --on
    int n;               // --n, 1..10
    uint32_t u;          // --u
    uint64_t big;        // --big
    double ms;           // --ms, an integer into a double
    int buf;             // --buf, 0 or 4096..65536
    float f;             // --f
    double d;            // --d
    zps_log_level level; // --level
    int even;            // --even, a custom reader
} s_cfg;

static bool s_parse_even(const char *text, void *field)
{
    long long v;
    if (!zps_opts_read_int(text, 0, 100, &v) || v % 2) {
        return false;
    }
    *(int *)field = (int)v;
    return true;
}

static const zps_opts_row s_rows[] = {
    {.name = "name", .kind = ZPS_OPTS_STRING, .metavar = "NAME", .def = "anna",
     .help = "who", .offset = offsetof(s_cfg, name), .ctype = ZPS_OPTS_C_STR},
    {.name = "on", .kind = ZPS_OPTS_SWITCH, .help = "a switch | with a bar",
     .offset = offsetof(s_cfg, on), .ctype = ZPS_OPTS_C_BOOL},
    {.name = "n", .kind = ZPS_OPTS_INT, .metavar = "N", .def = "1", .help = "a count",
     .offset = offsetof(s_cfg, n), .ctype = ZPS_OPTS_C_INT, .lo = 1, .hi = 10},
    {.name = "u", .kind = ZPS_OPTS_INT, .metavar = "U", .help = "unsigned",
     .offset = offsetof(s_cfg, u), .ctype = ZPS_OPTS_C_U32, .lo = 0, .hi = UINT32_MAX},
    {.name = "big", .kind = ZPS_OPTS_INT, .metavar = "B", .help = "wide",
     .offset = offsetof(s_cfg, big), .ctype = ZPS_OPTS_C_U64, .lo = 0, .hi = INT64_MAX},
    {.name = "ms", .kind = ZPS_OPTS_INT, .metavar = "MS", .help = "a time",
     .offset = offsetof(s_cfg, ms), .ctype = ZPS_OPTS_C_DOUBLE, .lo = 10, .hi = 1000},
    {.name = "buf", .kind = ZPS_OPTS_INT, .metavar = "BYTES", .def = "0: off",
     .help = "a buffer", .offset = offsetof(s_cfg, buf), .ctype = ZPS_OPTS_C_INT,
     .lo = 4096, .hi = 65536, .or_zero = true},
    {.name = "f", .kind = ZPS_OPTS_REAL, .metavar = "X", .help = "a float",
     .offset = offsetof(s_cfg, f), .ctype = ZPS_OPTS_C_FLOAT, .real_lo = 0, .real_hi = 1},
    {.name = "d", .kind = ZPS_OPTS_REAL, .metavar = "X", .help = "a double",
     .offset = offsetof(s_cfg, d), .ctype = ZPS_OPTS_C_DOUBLE, .real_lo = -1, .real_hi = 1},
    {.name = "level", .kind = ZPS_OPTS_CUSTOM, .metavar = "LEVEL", .def = "info",
     .help = "log level", .offset = offsetof(s_cfg, level), .ctype = ZPS_OPTS_C_PARSER,
     .parse = zps_opts_log_level, .accepts = "debug, info, warn or error"},
    {.name = "even", .kind = ZPS_OPTS_CUSTOM, .metavar = "E", .help = "an even number",
     .offset = offsetof(s_cfg, even), .ctype = ZPS_OPTS_C_PARSER, .parse = s_parse_even,
     .accepts = "an even number in 0..100"},
};

#define S_ROWS (sizeof s_rows / sizeof s_rows[0])

static const zps_opts_prog s_prog = {
    .name = "prog",
    .synopsis = "usage: prog [options]\n",
    .epilogue = "That is all.\n",
    .opts = s_rows,
    .n_opts = S_ROWS,
};

static char *s_noenv[] = {NULL};

// What write (zps_opts_usage or zps_opts_markdown) writes for prog; caller frees.
static char *s_written(void (*write)(const zps_opts_prog *, FILE *), const zps_opts_prog *prog)
{
    char *out;
    size_t len;
    FILE *f = open_memstream(&out, &len);
    ck_assert_ptr_nonnull(f);
    write(prog, f);
    fclose(f);
    return out;
}

// Parses argv (NULL-terminated) with envp into *cfg (zeroed first).
static zps_err s_parse(char **envp, char **argv, s_cfg *cfg, bool *given, bool *exit_now)
{
    int argc = 0;
    while (argv[argc]) {
        argc++;
    }
    *cfg = (s_cfg){0};
    return zps_opts_parse(&s_prog, envp, argc, argv, cfg, given, exit_now);
}

// ---------------------------------------------------------------------------
// What goes to a file descriptor (stderr, stdout) while a test runs.

typedef struct s_capture {
    int fd;     // the descriptor captured
    int saved;  // its original
    FILE *file; // where it goes meanwhile
} s_capture;

static void s_capture_start(s_capture *c, int fd)
{
    fflush(NULL);
    c->fd = fd;
    c->file = tmpfile();
    ck_assert_ptr_nonnull(c->file);
    c->saved = dup(fd);
    ck_assert_int_ge(c->saved, 0);
    ck_assert_int_ge(dup2(fileno(c->file), fd), 0);
}

// What was written, as a string (static: one capture at a time).
static const char *s_capture_end(s_capture *c)
{
    static char text[8192];
    fflush(NULL);
    dup2(c->saved, c->fd);
    close(c->saved);
    rewind(c->file);
    size_t n = fread(text, 1, sizeof text - 1, c->file);
    text[n] = '\0';
    fclose(c->file);
    return text;
}

// What argv's parse writes to fd; its result in *err and *exit_now.
static const char *s_parse_output(char **envp, char **argv, int fd, zps_err *err,
                                  bool *exit_now)
{
    s_cfg cfg;
    s_capture c;
    s_capture_start(&c, fd);
    *err = s_parse(envp, argv, &cfg, NULL, exit_now);
    return s_capture_end(&c);
}

// The one line argv's parse prints, which must fail.
static const char *s_refusal(char **envp, char **argv)
{
    zps_err err;
    bool exit_now;
    const char *text = s_parse_output(envp, argv, STDERR_FILENO, &err, &exit_now);
    ck_assert_int_eq(err, ZPS_EINVAL);
    ck_assert_msg(!exit_now, "a refusal is not an exit 0");
    const char *nl = strchr(text, '\n');
    ck_assert_msg(nl && nl[1] == '\0', "not exactly one line: '%s'", text);
    return text;
}

// ---------------------------------------------------------------------------

START_TEST(test_opts_env_name_is_upper_case_with_underscores)
{
    char name[32];
    ck_assert(zps_opts_env_name("global-batch", name, sizeof name));
    ck_assert_str_eq(name, "ZPS_GLOBAL_BATCH");
    ck_assert(!zps_opts_env_name("a-very-long-flag-name-indeed-yes", name, 16));
}
END_TEST

START_TEST(test_opts_each_kind_reads_into_its_field)
{
    char *argv[] = {"prog", "--name", "bo", "--on", "--n", "7", "--u", "4000000000", "--big",
                    "9000000000000", "--ms=250", "--buf", "0", "--f", "0.25", "--d", "-0.5",
                    "--level", "warn", "--even", "42", NULL};
    s_cfg cfg;
    bool given[S_ROWS], exit_now;
    ck_assert_int_eq(s_parse(s_noenv, argv, &cfg, given, &exit_now), ZPS_OK);
    ck_assert(!exit_now);
    ck_assert_str_eq(cfg.name, "bo");
    ck_assert(cfg.on);
    ck_assert_int_eq(cfg.n, 7);
    ck_assert_uint_eq(cfg.u, 4000000000u);
    ck_assert_uint_eq(cfg.big, 9000000000000ull);
    ck_assert_double_eq(cfg.ms, 250);
    ck_assert_int_eq(cfg.buf, 0);
    ck_assert_float_eq(cfg.f, 0.25f);
    ck_assert_double_eq(cfg.d, -0.5);
    ck_assert_int_eq(cfg.level, ZPS_LOG_WARN);
    ck_assert_int_eq(cfg.even, 42);
    for (size_t i = 0; i < S_ROWS; i++) {
        ck_assert_msg(given[i], "--%s not marked given", s_rows[i].name);
    }
    ck_assert(zps_opts_given(&s_prog, given, "even"));
    ck_assert(!zps_opts_given(&s_prog, given, "no-such-row"));
}
END_TEST

START_TEST(test_opts_untouched_fields_keep_their_defaults)
{
    char *argv[] = {"prog", "--n", "3", NULL};
    int argc = 3;
    s_cfg cfg = {.name = "anna", .n = 1, .ms = 20};
    bool given[S_ROWS], exit_now;
    ck_assert_int_eq(zps_opts_parse(&s_prog, s_noenv, argc, argv, &cfg, given, &exit_now),
                     ZPS_OK);
    ck_assert_str_eq(cfg.name, "anna");
    ck_assert_int_eq(cfg.n, 3);
    ck_assert_double_eq(cfg.ms, 20);
    ck_assert(zps_opts_given(&s_prog, given, "n"));
    ck_assert(!zps_opts_given(&s_prog, given, "ms"));
}
END_TEST

START_TEST(test_opts_bad_value_is_one_line_with_flag_value_and_range)
{
    char *a1[] = {"prog", "--n", "abc", NULL};
    ck_assert_str_eq(s_refusal(s_noenv, a1), "prog: --n: 'abc' is not an integer in 1..10\n");
    char *a2[] = {"prog", "--n", "11", NULL};
    ck_assert_str_eq(s_refusal(s_noenv, a2), "prog: --n: '11' is not an integer in 1..10\n");
    char *a3[] = {"prog", "--buf", "100", NULL};
    ck_assert_str_eq(s_refusal(s_noenv, a3), "prog: --buf: '100' is not 0 or 4096..65536\n");
    char *a4[] = {"prog", "--f", "nan", NULL};
    ck_assert_str_eq(s_refusal(s_noenv, a4), "prog: --f: 'nan' is not a number in 0..1\n");
    char *a5[] = {"prog", "--even", "3", NULL};
    ck_assert_str_eq(s_refusal(s_noenv, a5),
                     "prog: --even: '3' is not an even number in 0..100\n");
    char *a6[] = {"prog", "--level", "loud", NULL};
    ck_assert_str_eq(s_refusal(s_noenv, a6),
                     "prog: --level: 'loud' is not debug, info, warn or error\n");
    char *a7[] = {"prog", "--u", "-1", NULL};
    ck_assert_str_eq(s_refusal(s_noenv, a7),
                     "prog: --u: '-1' is not an integer in 0..4294967295\n");
}
END_TEST

START_TEST(test_opts_unknown_missing_and_stray_are_one_line)
{
    char *a1[] = {"prog", "--nope", NULL};
    ck_assert_str_eq(s_refusal(s_noenv, a1), "prog: unknown flag '--nope' (--help lists them)\n");
    char *a2[] = {"prog", "--n", NULL};
    ck_assert_str_eq(s_refusal(s_noenv, a2), "prog: --n needs a value\n");
    char *a3[] = {"prog", "--on=1", NULL};
    ck_assert_str_eq(s_refusal(s_noenv, a3), "prog: '--on=1' takes no value\n");
    char *a4[] = {"prog", "--n", "2", "extra", NULL};
    ck_assert_str_eq(s_refusal(s_noenv, a4), "prog: unexpected argument 'extra'\n");
}
END_TEST

START_TEST(test_opts_command_line_wins_over_environment)
{
    char *envp[] = {"ZPS_N=3", "ZPS_NAME=env", "ZPS_ON=yes", "ZPS_UNKNOWN=3", "PATH=/bin",
                    "ZPS_HELP=1", NULL};
    char *argv[] = {"prog", "--n", "5", NULL};
    s_cfg cfg;
    bool given[S_ROWS], exit_now;
    ck_assert_int_eq(s_parse(envp, argv, &cfg, given, &exit_now), ZPS_OK);
    ck_assert(!exit_now);
    ck_assert_int_eq(cfg.n, 5);
    ck_assert_str_eq(cfg.name, "env");
    ck_assert(cfg.on);
    ck_assert(zps_opts_given(&s_prog, given, "name"));
    ck_assert(zps_opts_given(&s_prog, given, "on"));
    char *bare[] = {"prog", NULL};
    ck_assert_int_eq(s_parse(envp, bare, &cfg, given, &exit_now), ZPS_OK);
    ck_assert_int_eq(cfg.n, 3);
}
END_TEST

START_TEST(test_opts_env_switch_words)
{
    const char *offs[] = {"ZPS_ON=0", "ZPS_ON=false", "ZPS_ON=No", "ZPS_ON=", "ZPS_ON=off"};
    char *argv[] = {"prog", NULL};
    s_cfg cfg;
    bool given[S_ROWS], exit_now;
    for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++) {
        char *envp[] = {(char *)offs[i], NULL};
        ck_assert_int_eq(s_parse(envp, argv, &cfg, given, &exit_now), ZPS_OK);
        ck_assert_msg(!cfg.on && !given[1], "%s turned the switch on", offs[i]);
    }
    char *on[] = {"ZPS_ON=TRUE", NULL};
    ck_assert_int_eq(s_parse(on, argv, &cfg, given, &exit_now), ZPS_OK);
    ck_assert(cfg.on);
    char *bad[] = {"ZPS_ON=maybe", NULL};
    ck_assert_str_eq(s_refusal(bad, argv),
                     "prog: ZPS_ON: 'maybe' is not 1/true/yes/on or 0/false/no/off\n");
    // A bad value from the environment is named by its flag, as on the command line.
    char *badn[] = {"ZPS_N=many", NULL};
    ck_assert_str_eq(s_refusal(badn, argv), "prog: --n: 'many' is not an integer in 1..10\n");
}
END_TEST

static const char s_usage_want[] =
    "usage: prog [options]\n"
    "  --name NAME    who (default anna)\n"
    "  --on           a switch | with a bar\n"
    "  --n N          a count (default 1)\n"
    "  --u U          unsigned\n"
    "  --big B        wide\n"
    "  --ms MS        a time\n"
    "  --buf BYTES    a buffer (default 0: off)\n"
    "  --f X          a float\n"
    "  --d X          a double\n"
    "  --level LEVEL  log level (default info)\n"
    "  --even E       an even number\n"
    "Every flag may come from the environment instead: --some-flag X as\n"
    "ZPS_SOME_FLAG=X, a switch as ZPS_SOME_FLAG=1. The command line wins.\n"
    "That is all.\n";

START_TEST(test_opts_help_prints_the_usage_from_the_table)
{
    char *argv[] = {"prog", "--n", "2", "--help", "--n", "bad", NULL};
    zps_err err;
    bool exit_now;
    const char *text = s_parse_output(s_noenv, argv, STDOUT_FILENO, &err, &exit_now);
    ck_assert_int_eq(err, ZPS_OK);
    ck_assert(exit_now);
    ck_assert_str_eq(text, s_usage_want);
}
END_TEST

START_TEST(test_opts_usage_wraps_long_help)
{
    static const zps_opts_row rows[] = {
        {.name = "a-rather-long-flag-name", .kind = ZPS_OPTS_STRING, .metavar = "VALUE",
         .help = "one two three four five six seven eight nine ten eleven twelve thirteen "
                 "fourteen fifteen",
         .offset = 0, .ctype = ZPS_OPTS_C_STR},
        {.name = "x", .kind = ZPS_OPTS_SWITCH, .help = "short", .offset = 0,
         .ctype = ZPS_OPTS_C_BOOL},
    };
    zps_opts_prog prog = {.name = "p", .synopsis = "usage: p\n", .opts = rows, .n_opts = 2};
    char *out = s_written(zps_opts_usage, &prog);
    ck_assert_str_eq(out, "usage: p\n"
                          "  --a-rather-long-flag-name VALUE\n"
                          "       one two three four five six seven eight nine ten eleven twelve "
                          "thirteen\n"
                          "       fourteen fifteen\n"
                          "  --x  short\n"
                          "Every flag may come from the environment instead: --some-flag X as\n"
                          "ZPS_SOME_FLAG=X, a switch as ZPS_SOME_FLAG=1. The command line wins.\n");
    free(out);
}
END_TEST

START_TEST(test_opts_markdown_rows_from_the_table)
{
    char *out = s_written(zps_opts_markdown, &s_prog);
    ck_assert_str_eq(out, "| flag | default | meaning |\n"
                          "|---|---|---|\n"
                          "| `--name NAME` | anna | who |\n"
                          "| `--on` |  | a switch \\| with a bar |\n"
                          "| `--n N` | 1 | a count |\n"
                          "| `--u U` |  | unsigned |\n"
                          "| `--big B` |  | wide |\n"
                          "| `--ms MS` |  | a time |\n"
                          "| `--buf BYTES` | 0: off | a buffer |\n"
                          "| `--f X` |  | a float |\n"
                          "| `--d X` |  | a double |\n"
                          "| `--level LEVEL` | info | log level |\n"
                          "| `--even E` |  | an even number |\n");
    // The hidden flag prints the same to stdout and ends the program.
    char *argv[] = {"prog", "--flags-markdown", NULL};
    zps_err err;
    bool exit_now;
    const char *text = s_parse_output(s_noenv, argv, STDOUT_FILENO, &err, &exit_now);
    ck_assert_int_eq(err, ZPS_OK);
    ck_assert(exit_now);
    ck_assert_str_eq(text, out);
    free(out);
}
END_TEST

START_TEST(test_opts_parse_main_gives_the_exit_status)
{
    unsetenv("ZPS_N");
    s_cfg cfg = {0};
    char *ok[] = {"prog", "--n", "4", NULL};
    ck_assert_int_eq(zps_opts_parse_main(&s_prog, 3, ok, &cfg, NULL), -1);
    ck_assert_int_eq(cfg.n, 4);
    setenv("ZPS_N", "6", 1);
    char *bare[] = {"prog", NULL};
    ck_assert_int_eq(zps_opts_parse_main(&s_prog, 1, bare, &cfg, NULL), -1);
    ck_assert_int_eq(cfg.n, 6);
    s_capture c;
    s_capture_start(&c, STDERR_FILENO);
    char *bad[] = {"prog", "--n", "0", NULL};
    int bad_status = zps_opts_parse_main(&s_prog, 3, bad, &cfg, NULL);
    (void)s_capture_end(&c);
    ck_assert_int_eq(bad_status, 2);
    s_capture_start(&c, STDOUT_FILENO);
    char *help[] = {"prog", "--help", NULL};
    int help_status = zps_opts_parse_main(&s_prog, 2, help, &cfg, NULL);
    ck_assert_str_eq(s_capture_end(&c), s_usage_want);
    ck_assert_int_eq(help_status, 0);
}
END_TEST

START_TEST(test_opts_row_whose_type_cannot_hold_its_range_is_a_bug)
{
    static const zps_opts_row rows[] = {
        {.name = "n", .kind = ZPS_OPTS_INT, .metavar = "N", .help = "too wide", .offset = 0,
         .ctype = ZPS_OPTS_C_U32, .lo = 0, .hi = INT64_MAX},
    };
    zps_opts_prog prog = {.name = "p", .synopsis = "", .opts = rows, .n_opts = 1};
    char *argv[] = {"p", NULL};
    uint32_t v;
    bool exit_now;
    (void)zps_opts_parse(&prog, s_noenv, 1, argv, &v, NULL, &exit_now);
}
END_TEST

START_TEST(test_opts_number_readers_hold_their_ranges)
{
    long long i = 7;
    ck_assert(zps_opts_read_int("42", 1, 100, &i));
    ck_assert_int_eq(i, 42);
    ck_assert(!zps_opts_read_int("101", 1, 100, &i));
    ck_assert(!zps_opts_read_int("4x", 1, 100, &i));
    ck_assert(!zps_opts_read_int("", 1, 100, &i));
    ck_assert(!zps_opts_read_int("99999999999999999999", 1, 100, &i));
    ck_assert_int_eq(i, 42);
    double d = 0;
    ck_assert(zps_opts_read_real("0.5", 0, 1, &d));
    ck_assert_double_eq(d, 0.5);
    ck_assert(!zps_opts_read_real("nan", 0, 1, &d));
    ck_assert(!zps_opts_read_real("1.5", 0, 1, &d));
    ck_assert(!zps_opts_read_real("1e999", 0, 1e308, &d));
}
END_TEST

Suite *zps_suite_opts(void)
{
    Suite *s = suite_create("opts");
    TCase *tc = tcase_create("table");
    tcase_add_test(tc, test_opts_env_name_is_upper_case_with_underscores);
    tcase_add_test(tc, test_opts_each_kind_reads_into_its_field);
    tcase_add_test(tc, test_opts_untouched_fields_keep_their_defaults);
    tcase_add_test(tc, test_opts_bad_value_is_one_line_with_flag_value_and_range);
    tcase_add_test(tc, test_opts_unknown_missing_and_stray_are_one_line);
    tcase_add_test(tc, test_opts_command_line_wins_over_environment);
    tcase_add_test(tc, test_opts_env_switch_words);
    tcase_add_test(tc, test_opts_help_prints_the_usage_from_the_table);
    tcase_add_test(tc, test_opts_usage_wraps_long_help);
    tcase_add_test(tc, test_opts_markdown_rows_from_the_table);
    tcase_add_test(tc, test_opts_parse_main_gives_the_exit_status);
    tcase_add_test_raise_signal(tc, test_opts_row_whose_type_cannot_hold_its_range_is_a_bug,
                                SIGABRT);
    tcase_add_test(tc, test_opts_number_readers_hold_their_ranges);
    suite_add_tcase(s, tc);
    return s;
}
