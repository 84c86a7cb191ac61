/* zps_flags.h - what the daemons share in reading their configuration.
 *
 * Launchers (systemd EnvironmentFile, a Kubernetes ConfigMap, a Slurm
 * script) configure processes through the environment more easily than
 * through argument lists, so every long flag --some-flag of zps-server and
 * zps-worker may also come from ZPS_SOME_FLAG. zps_flags_from_env turns
 * those variables into arguments placed before the command line's own, so
 * getopt sees the command line last and it wins. The numeric parsers print
 * one line naming the flag and the accepted range. */
#ifndef ZPS_FLAGS_H
#define ZPS_FLAGS_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/zps_err.h"

// "ZPS_SOME_FLAG" for "some-flag", in out (size len). False if it does not fit.
bool zps_flags_env_name(const char *flag, char *out, size_t len);

// A new argument vector: argv[0], then "--flag value" (or "--switch") for
// each variable of envp named after a flag of longopts, in longopts order,
// then argv[1..argc). Switches take 1/true/yes/on or 0/false/no/off (or
// empty: off). Variables that name no flag of this program are ignored, so
// one environment can serve the server and the worker. *out_argv is owned
// by the caller (free it; its strings are borrowed from argv and envp).
// ZPS_EINVAL, with one line on stderr, for a switch value that is neither.
zps_err zps_flags_from_env(const char *prog, const struct option *longopts, char **envp,
                           int argc, char **argv, int *out_argc, char ***out_argv);

// Integer and real flag values, in [lo, hi]; false after one line on stderr.
bool zps_flags_int(const char *prog, const char *flag, const char *text, long long lo,
                   long long hi, long long *out);
bool zps_flags_real(const char *prog, const char *flag, const char *text, double lo, double hi,
                    double *out);

#endif
