/* main.c - zps-server's flags: their table (common/zps_opts.h reads it,
 * prints the usage and docs/running.md's table from it) and the checks that
 * relate several of them. The process itself is zps_server.c. */
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/zps_log.h"
#include "common/zps_opts.h"
#include "common/zps_plan.h"
#include "common/zps_quant.h"
#include "common/zps_sndbuf.h"
#include "common/zps_wire.h"
#include "server/shard/zps_pool.h"
#include "server/zps_server.h"

// What the flags set: the server's options, and the log's, which main
// applies itself.
typedef struct s_flags {
    zps_server_opts srv;     // what zps_server_run takes
    zps_log_level log_level; // --log-level (zps_opts_log_level applies it)
    bool log_json;           // --log-json
} s_flags;

// ---------------------------------------------------------------------------
// The readers of the flags that are not a plain number or string.

static bool s_parse_optimizer(const char *text, void *field)
{
    return zps_optim_parse_kind(text, (zps_optim_kind *)field) == ZPS_OK;
}

static bool s_parse_schedule(const char *text, void *field)
{
    return zps_optim_parse_schedule(text, (zps_lr_schedule *)field) == ZPS_OK;
}

static bool s_parse_dtype(const char *text, void *field)
{
    return zps_dtype_parse(text, (zps_dtype *)field) == ZPS_OK;
}

static bool s_parse_wire_code(const char *text, void *field)
{
    bool zstd = strcmp(text, "zstd") == 0;
    if (!zstd && strcmp(text, "off") != 0) {
        return false;
    }
    *(bool *)field = zstd;
    return true;
}

static bool s_parse_mode(const char *text, void *field)
{
    bool diloco = strcmp(text, "diloco") == 0;
    if (!diloco && strcmp(text, "sync") != 0) {
        return false;
    }
    *(bool *)field = diloco;
    return true;
}

// --inner-steps H, auto or auto:H into the mode.
static bool s_parse_inner_steps(const char *text, void *field)
{
    zps_outer_mode *mode = field;
    bool auto_steps = strncmp(text, "auto", 4) == 0;
    const char *number = auto_steps ? text + 4 : text;
    long long h = ZPS_OUTER_INNER_STEPS;
    if (auto_steps && *number == ':') {
        number++;
    } else if (auto_steps && *number != '\0') {
        return false;
    }
    if ((!auto_steps || *number) && !zps_opts_read_int(number, 1, ZPS_OUTER_MAX_INNER_STEPS, &h)) {
        return false;
    }
    mode->inner_steps = (uint32_t)h;
    mode->auto_steps = auto_steps;
    return true;
}

static bool s_parse_compress(const char *text, void *field)
{
    zps_quant_kind kind;
    if (strcmp(text, "none") == 0) {
        *(int *)field = 0;
        return true;
    }
    if (zps_quant_parse(text, &kind) != ZPS_OK) {
        return false;
    }
    *(int *)field = (int)kind;
    return true;
}

static bool s_parse_shm(const char *text, void *field)
{
    static const char *names[] = {"auto", "allow", "deny"};
    for (int i = 0; i < 3; i++) {
        if (strcmp(text, names[i]) == 0) {
            *(int *)field = i; // zps_server_shm's order
            return true;
        }
    }
    return false;
}

// --threads N|auto into the count, 0 for auto (zps_pool_auto_threads).
static bool s_parse_threads(const char *text, void *field)
{
    long long n;
    if (strcmp(text, "auto") == 0) {
        *(int *)field = 0; // zps_server_open resolves it
        return true;
    }
    if (!zps_opts_read_int(text, 1, ZPS_POOL_MAX, &n)) {
        return false;
    }
    *(int *)field = (int)n;
    return true;
}

// --host-aggregate on|off into its negation: zeroed options mean on.
static bool s_parse_host_aggregate(const char *text, void *field)
{
    bool on = strcmp(text, "on") == 0;
    if (!on && strcmp(text, "off") != 0) {
        return false;
    }
    *(bool *)field = !on;
    return true;
}

// --betas B1,B2 into the optimizer's cfg: two numbers in [0, 1), as
// torch.optim.Adam accepts them.
static bool s_parse_betas(const char *text, void *field)
{
    zps_optim_cfg *optim = field;
    char *end;
    errno = 0;
    double b1 = strtod(text, &end);
    bool ok = errno == 0 && end != text && *end == ',';
    double b2 = ok ? strtod(end + 1, &end) : 0;
    ok = ok && errno == 0 && *end == '\0' && b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1;
    if (ok) {
        optim->beta1 = b1;
        optim->beta2 = b2;
    }
    return ok;
}

// --eps: any float32-sized number that stays positive as a float32, since
// the shard adds it in float32.
static bool s_parse_eps(const char *text, void *field)
{
    double eps;
    if (!zps_opts_read_real(text, -FLT_MAX, FLT_MAX, &eps) || !((float)eps > 0)) {
        return false;
    }
    *(double *)field = eps;
    return true;
}

// ---------------------------------------------------------------------------
// The table. Every real flag of the server (--lr, --momentum,
// --weight-decay, --speculate-after) is >= 0.

static const zps_opts_row s_table[] = {
    {.name = "shard", .kind = ZPS_OPTS_INT, .metavar = "I", .def = "0",
     .help = "this process serves shard I of --shards",
     .offset = offsetof(s_flags, srv.shard), .ctype = ZPS_OPTS_C_U32,
     .lo = 0, .hi = ZPS_MAX_SHARDS - 1},
    {.name = "shards", .kind = ZPS_OPTS_INT, .metavar = "N", .def = "1",
     .help = "shard processes in the job",
     .offset = offsetof(s_flags, srv.shards), .ctype = ZPS_OPTS_C_U32,
     .lo = 1, .hi = ZPS_MAX_SHARDS},
    {.name = "coordinator", .kind = ZPS_OPTS_STRING, .metavar = "ENDPOINT",
     .help = "shards 1..N-1: where shard 0 listens (shard 0 refuses it)",
     .offset = offsetof(s_flags, srv.coordinator), .ctype = ZPS_OPTS_C_STR},
    {.name = "listen", .kind = ZPS_OPTS_STRING, .metavar = "ENDPOINT",
     .def = "tcp://127.0.0.1:5555",
     .help = "ZeroMQ endpoint to bind; tcp://HOST:* picks a free port",
     .offset = offsetof(s_flags, srv.listen), .ctype = ZPS_OPTS_C_STR},
    {.name = "endpoint-file", .kind = ZPS_OPTS_STRING, .metavar = "FILE",
     .help = "write the bound endpoint there once listening (for scripts)",
     .offset = offsetof(s_flags, srv.endpoint_file), .ctype = ZPS_OPTS_C_STR},
    {.name = "workers", .kind = ZPS_OPTS_INT, .metavar = "N", .def = "1",
     .help = "members to admit before step 0",
     .offset = offsetof(s_flags, srv.workers), .ctype = ZPS_OPTS_C_U32,
     .lo = 1, .hi = ZPS_MAX_MEMBERS},
    {.name = "model", .kind = ZPS_OPTS_STRING, .metavar = "SPEC", .def = "mlp:784-512-512-10",
     .help = "mlp:D0-D1-...-Dk: Linear layers with ReLU between them; flat:P: a benchmark "
             "model of P parameters whose gradient costs nothing; external: declared by the "
             "workers (libzps), rank 0's initial values (docs/library.md)",
     .offset = offsetof(s_flags, srv.model), .ctype = ZPS_OPTS_C_STR},
    {.name = "dataset", .kind = ZPS_OPTS_STRING, .metavar = "SPEC", .def = "fashion-mnist",
     .help = "fashion-mnist[:DIR] or synthetic:N; with --model external, size:N fixes the "
             "train records the workers must declare (else the first worker's count holds)",
     .offset = offsetof(s_flags, srv.dataset), .ctype = ZPS_OPTS_C_STR},
    {.name = "global-batch", .kind = ZPS_OPTS_INT, .metavar = "B", .def = "128",
     .help = "samples per step over all workers",
     .offset = offsetof(s_flags, srv.global_batch), .ctype = ZPS_OPTS_C_U32,
     .lo = 1, .hi = 1 << 24},
    {.name = "epochs", .kind = ZPS_OPTS_INT, .metavar = "E", .def = "10",
     .help = "run length in epochs, unless --steps is given",
     .offset = offsetof(s_flags, srv.epochs), .ctype = ZPS_OPTS_C_U64,
     .lo = 0, .hi = LLONG_MAX},
    {.name = "steps", .kind = ZPS_OPTS_INT, .metavar = "S",
     .help = "run length in steps; wins over --epochs",
     .offset = offsetof(s_flags, srv.steps), .ctype = ZPS_OPTS_C_U64,
     .lo = 0, .hi = LLONG_MAX},
    {.name = "optimizer", .kind = ZPS_OPTS_CUSTOM, .metavar = "sgd|adam|adamw", .def = "sgd",
     .help = "torch.optim.SGD, Adam or AdamW semantics (docs/optimizers.md)",
     .offset = offsetof(s_flags, srv.optim.kind), .ctype = ZPS_OPTS_C_PARSER,
     .parse = s_parse_optimizer, .accepts = "sgd, adam or adamw"},
    {.name = "lr", .kind = ZPS_OPTS_REAL, .metavar = "X", .def = "sgd 0.05; adam, adamw 0.001",
     .help = "peak learning rate",
     .offset = offsetof(s_flags, srv.optim.lr), .ctype = ZPS_OPTS_C_FLOAT,
     .real_lo = 0, .real_hi = FLT_MAX},
    {.name = "momentum", .kind = ZPS_OPTS_REAL, .metavar = "X", .def = "0.9",
     .help = "sgd only: momentum",
     .offset = offsetof(s_flags, srv.optim.momentum), .ctype = ZPS_OPTS_C_FLOAT,
     .real_lo = 0, .real_hi = FLT_MAX},
    {.name = "nesterov", .kind = ZPS_OPTS_SWITCH,
     .help = "sgd only: Nesterov momentum",
     .offset = offsetof(s_flags, srv.optim.nesterov), .ctype = ZPS_OPTS_C_BOOL},
    {.name = "weight-decay", .kind = ZPS_OPTS_REAL, .metavar = "X", .def = "0; adamw 0.01",
     .help = "sgd, adam: L2 added to the gradient; adamw: decoupled, p -= lr * X * p",
     .offset = offsetof(s_flags, srv.optim.weight_decay), .ctype = ZPS_OPTS_C_FLOAT,
     .real_lo = 0, .real_hi = FLT_MAX},
    {.name = "betas", .kind = ZPS_OPTS_CUSTOM, .metavar = "B1,B2", .def = "0.9,0.999",
     .help = "adam, adamw only: the moment decay rates, each in [0, 1)",
     .offset = offsetof(s_flags, srv.optim), .ctype = ZPS_OPTS_C_PARSER,
     .parse = s_parse_betas,
     .accepts = "two numbers in [0, 1) separated by a comma (e.g. 0.9,0.999)"},
    {.name = "eps", .kind = ZPS_OPTS_CUSTOM, .metavar = "X", .def = "1e-8",
     .help = "adam, adamw only: added to the denominator, > 0",
     .offset = offsetof(s_flags, srv.optim.eps), .ctype = ZPS_OPTS_C_PARSER,
     .parse = s_parse_eps, .accepts = "a positive float32 number"},
    {.name = "lr-schedule", .kind = ZPS_OPTS_CUSTOM, .metavar = "constant|cosine|linear|step",
     .def = "cosine", .help = "the learning rate per step; cosine and linear decay to 0 at the "
                              "end, step multiplies it by --lr-gamma every --lr-step-size steps",
     .offset = offsetof(s_flags, srv.optim.schedule), .ctype = ZPS_OPTS_C_PARSER,
     .parse = s_parse_schedule, .accepts = "constant, cosine, linear or step"},
    {.name = "lr-step-size", .kind = ZPS_OPTS_INT, .metavar = "N", .def = "1",
     .help = "--lr-schedule step: steps (after the warm-up) between decays, as torch's StepLR",
     .offset = offsetof(s_flags, srv.optim.step_size), .ctype = ZPS_OPTS_C_U64,
     .lo = 1, .hi = LLONG_MAX},
    {.name = "lr-gamma", .kind = ZPS_OPTS_REAL, .metavar = "G", .def = "0.1",
     .help = "--lr-schedule step: the factor of each decay",
     .offset = offsetof(s_flags, srv.optim.gamma), .ctype = ZPS_OPTS_C_DOUBLE,
     .real_lo = 0, .real_hi = FLT_MAX},
    {.name = "warmup-steps", .kind = ZPS_OPTS_INT, .metavar = "N", .def = "0",
     .help = "linear warm-up to the peak learning rate",
     .offset = offsetof(s_flags, srv.optim.warmup_steps), .ctype = ZPS_OPTS_C_U64,
     .lo = 0, .hi = LLONG_MAX},
    {.name = "clip-grad-norm", .kind = ZPS_OPTS_REAL, .metavar = "X", .def = "0: off",
     .help = "scale each step's averaged gradient so that its global 2-norm is at most X, as "
             "torch.nn.utils.clip_grad_norm_ (shard 0 sets it for all; docs/optimizers.md)",
     .offset = offsetof(s_flags, srv.clip_grad_norm), .ctype = ZPS_OPTS_C_FLOAT,
     .real_lo = 0, .real_hi = FLT_MAX},
    {.name = "mode", .kind = ZPS_OPTS_CUSTOM, .metavar = "sync|diloco", .def = "sync",
     .help = "diloco: workers train --inner-steps alone, shards take an outer Nesterov step on "
             "their pseudo-gradients; leaves the one-process promise (docs/diloco.md)",
     .offset = offsetof(s_flags, srv.mode.diloco), .ctype = ZPS_OPTS_C_PARSER,
     .parse = s_parse_mode, .accepts = "sync or diloco"},
    {.name = "inner-steps", .kind = ZPS_OPTS_CUSTOM, .metavar = "H|auto[:H]", .def = "10",
     .help = "diloco: global batches per round; auto: the fastest worker H, each other in "
             "proportion to its speed",
     .offset = offsetof(s_flags, srv.mode), .ctype = ZPS_OPTS_C_PARSER,
     .parse = s_parse_inner_steps, .accepts = "a number 1..1048576, auto or auto:H"},
    {.name = "outer-lr", .kind = ZPS_OPTS_REAL, .metavar = "X", .def = "0.7",
     .help = "diloco: the outer step's learning rate",
     .offset = offsetof(s_flags, srv.mode.outer.lr), .ctype = ZPS_OPTS_C_FLOAT,
     .real_lo = 0, .real_hi = FLT_MAX},
    {.name = "outer-momentum", .kind = ZPS_OPTS_REAL, .metavar = "X", .def = "0.9",
     .help = "diloco: the outer step's Nesterov momentum, in [0, 1) (0: plain SGD)",
     .offset = offsetof(s_flags, srv.mode.outer.momentum), .ctype = ZPS_OPTS_C_FLOAT,
     .real_lo = 0, .real_hi = 0.9999999f},
    {.name = "compress", .kind = ZPS_OPTS_CUSTOM, .metavar = "none|int8|e3m0", .def = "none",
     .help = "diloco: pseudo-gradients pushed in int8 or 4 bits, error feedback on the worker",
     .offset = offsetof(s_flags, srv.mode.compress), .ctype = ZPS_OPTS_C_PARSER,
     .parse = s_parse_compress, .accepts = "none, int8 or e3m0"},
    {.name = "fragments", .kind = ZPS_OPTS_INT, .metavar = "F", .def = "1",
     .help = "diloco: exchange the parameters a fragment at a time, fragment f at inner steps "
             "offset by f*H/F (Streaming DiLoCo); at most H",
     .offset = offsetof(s_flags, srv.mode.fragments), .ctype = ZPS_OPTS_C_U32,
     .lo = 1, .hi = ZPS_OUTER_MAX_FRAGMENTS},
    {.name = "overlap", .kind = ZPS_OPTS_SWITCH,
     .help = "diloco: workers train on while a fragment is exchanged and merge its new values "
             "one step later (a delay of at most ceil(H/F) inner steps)",
     .offset = offsetof(s_flags, srv.mode.overlap), .ctype = ZPS_OPTS_C_BOOL},
    {.name = "seed", .kind = ZPS_OPTS_INT, .metavar = "N", .def = "0",
     .help = "initialisation and data order",
     .offset = offsetof(s_flags, srv.seed), .ctype = ZPS_OPTS_C_U64,
     .lo = 0, .hi = LLONG_MAX},
    {.name = "wire-dtype", .kind = ZPS_OPTS_CUSTOM, .metavar = "fp32|bf16|fp16", .def = "fp32",
     .help = "gradients and parameters on the wire",
     .offset = offsetof(s_flags, srv.wire_dtype), .ctype = ZPS_OPTS_C_PARSER,
     .parse = s_parse_dtype, .accepts = "fp32, bf16 or fp16"},
    {.name = "wire-code", .kind = ZPS_OPTS_CUSTOM, .metavar = "off|zstd", .def = "off",
     .help = "zstd: a host's leader codes its pushes and the shards their answers to it "
             "losslessly (byte planes, answers XORed with the step before): fewer bytes, "
             "more CPU, the same bits",
     .offset = offsetof(s_flags, srv.wire_code), .ctype = ZPS_OPTS_C_PARSER,
     .parse = s_parse_wire_code, .accepts = "off or zstd"},
    {.name = "worker-timeout-ms", .kind = ZPS_OPTS_INT, .metavar = "MS", .def = "10000",
     .help = "evict a worker silent this long",
     .offset = offsetof(s_flags, srv.worker_timeout_ms), .ctype = ZPS_OPTS_C_DOUBLE,
     .lo = 100, .hi = LLONG_MAX},
    {.name = "stall-warn-ms", .kind = ZPS_OPTS_INT, .metavar = "MS", .def = "5000",
     .help = "while a step waits, say for whom this often (docs/stragglers.md)",
     .offset = offsetof(s_flags, srv.stall_warn_ms), .ctype = ZPS_OPTS_C_DOUBLE,
     .lo = 10, .hi = LLONG_MAX},
    {.name = "adaptive-split", .kind = ZPS_OPTS_SWITCH,
     .help = "shares follow each worker's measured throughput",
     .offset = offsetof(s_flags, srv.adaptive_split), .ctype = ZPS_OPTS_C_BOOL},
    {.name = "host-aggregate", .kind = ZPS_OPTS_CUSTOM, .metavar = "on|off", .def = "on",
     .help = "tell the workers of one host (boot id) their group: a leader sums their "
             "gradients and pushes once per bucket to each shard on another host",
     .offset = offsetof(s_flags, srv.no_host_aggregate), .ctype = ZPS_OPTS_C_PARSER,
     .parse = s_parse_host_aggregate, .accepts = "on or off"},
    {.name = "speculate-after", .kind = ZPS_OPTS_REAL, .metavar = "X", .def = "0: off",
     .help = "once half a step's slices are in, hand a missing one X median steps later (at "
             "once if none of it came) to the finished workers too, in pieces; the first copy "
             "counts",
     .offset = offsetof(s_flags, srv.speculate_after), .ctype = ZPS_OPTS_C_DOUBLE,
     .real_lo = 0, .real_hi = FLT_MAX},
    {.name = "deterministic", .kind = ZPS_OPTS_SWITCH,
     .help = "the same bits for any number of workers and split: needs --micro-batch "
             "(docs/deterministic.md)",
     .offset = offsetof(s_flags, srv.deterministic), .ctype = ZPS_OPTS_C_BOOL},
    {.name = "micro-batch", .kind = ZPS_OPTS_INT, .metavar = "M",
     .help = "--deterministic: the global batch is B/M micro-batches of M samples, summed in "
             "one canonical order; every share is whole micro-batches",
     .offset = offsetof(s_flags, srv.micro_batch), .ctype = ZPS_OPTS_C_U32,
     .lo = 1, .hi = 1 << 24},
    {.name = "http", .kind = ZPS_OPTS_STRING, .metavar = "HOST:PORT",
     .help = "/healthz and /readyz (any shard); shard 0 also /metrics (Prometheus) and /status "
             "(JSON)",
     .offset = offsetof(s_flags, srv.http), .ctype = ZPS_OPTS_C_STR},
    {.name = "checkpoint-every", .kind = ZPS_OPTS_INT, .metavar = "K", .def = "0: never",
     .help = "shards checkpoint every K steps (shard 0 sets it for all; docs/failures.md)",
     .offset = offsetof(s_flags, srv.checkpoint_every), .ctype = ZPS_OPTS_C_U64,
     .lo = 0, .hi = LLONG_MAX},
    {.name = "checkpoint-dir", .kind = ZPS_OPTS_STRING, .metavar = "DIR",
     .help = "where this shard keeps its checkpoints",
     .offset = offsetof(s_flags, srv.checkpoint_dir), .ctype = ZPS_OPTS_C_STR},
    {.name = "resume", .kind = ZPS_OPTS_SWITCH,
     .help = "restart from this shard's newest valid checkpoint",
     .offset = offsetof(s_flags, srv.resume), .ctype = ZPS_OPTS_C_BOOL},
    {.name = "curve-secret", .kind = ZPS_OPTS_STRING, .metavar = "FILE",
     .help = "CurveZMQ: this server's secret key (zps-ctl keygen; docs/security.md)",
     .offset = offsetof(s_flags, srv.curve_secret), .ctype = ZPS_OPTS_C_STR},
    {.name = "authorized-keys", .kind = ZPS_OPTS_STRING, .metavar = "DIR",
     .help = "CurveZMQ: the workers' public keys (*.pub); SIGHUP re-reads every list",
     .offset = offsetof(s_flags, srv.authorized_keys), .ctype = ZPS_OPTS_C_STR},
    {.name = "shard-keys", .kind = ZPS_OPTS_STRING, .metavar = "DIR",
     .help = "CurveZMQ: the shards' public keys (this server's own key is one without being "
             "listed)",
     .offset = offsetof(s_flags, srv.shard_keys), .ctype = ZPS_OPTS_C_STR},
    {.name = "operator-keys", .kind = ZPS_OPTS_STRING, .metavar = "DIR",
     .help = "CurveZMQ: keys that may only ask for STATUS (zps-ctl)",
     .offset = offsetof(s_flags, srv.operator_keys), .ctype = ZPS_OPTS_C_STR},
    {.name = "server-key", .kind = ZPS_OPTS_STRING, .metavar = "FILE", .def = "its own",
     .help = "shards > 0: the coordinator's public key",
     .offset = offsetof(s_flags, srv.server_key), .ctype = ZPS_OPTS_C_STR},
    {.name = "require-curve", .kind = ZPS_OPTS_SWITCH,
     .help = "refuse to start without CurveZMQ",
     .offset = offsetof(s_flags, srv.require_curve), .ctype = ZPS_OPTS_C_BOOL},
    {.name = "metrics-log", .kind = ZPS_OPTS_STRING, .metavar = "FILE",
     .help = "JSON lines: one per step, one per evaluation",
     .offset = offsetof(s_flags, srv.metrics_log), .ctype = ZPS_OPTS_C_STR},
    {.name = "advertise", .kind = ZPS_OPTS_STRING, .metavar = "ENDPOINT",
     .def = "the bound endpoint",
     .help = "shards > 0: where workers reach this shard (needed when --listen is 0.0.0.0)",
     .offset = offsetof(s_flags, srv.advertise), .ctype = ZPS_OPTS_C_STR},
    {.name = "sndbuf", .kind = ZPS_OPTS_CUSTOM, .metavar = "auto|BYTES", .def = "auto",
     .help = "TCP send buffer of each connection: auto (per connection, docs/running.md), "
             "0 (the OS's) or 4096..1073741824 bytes",
     .offset = offsetof(s_flags, srv.sndbuf), .ctype = ZPS_OPTS_C_PARSER,
     .parse = zps_sndbuf_parse, .accepts = "auto, 0 or 4096..1073741824"},
    {.name = "shm", .kind = ZPS_OPTS_CUSTOM, .metavar = "auto|allow|deny", .def = "auto",
     .help = "workers on this host push through shared memory (memfd, same user); auto: "
             "except under CURVE (docs/choices.md)",
     .offset = offsetof(s_flags, srv.shm), .ctype = ZPS_OPTS_C_PARSER,
     .parse = s_parse_shm, .accepts = "auto, allow or deny"},
    {.name = "threads", .kind = ZPS_OPTS_CUSTOM, .metavar = "N|auto", .def = "auto",
     .help = "threads that share each large bucket's accumulate and update; auto: the cores "
             "it may run on (fewer under a cgroup CPU quota), at most 4 (same bits for any N)",
     .offset = offsetof(s_flags, srv.threads), .ctype = ZPS_OPTS_C_PARSER,
     .parse = s_parse_threads, .accepts = "an integer in 1..64, or auto"},
    {.name = "log-level", .kind = ZPS_OPTS_CUSTOM, .metavar = "LEVEL", .def = "info",
     .help = "debug, info, warn or error",
     .offset = offsetof(s_flags, log_level), .ctype = ZPS_OPTS_C_PARSER,
     .parse = zps_opts_log_level, .accepts = "debug, info, warn or error"},
    {.name = "log-json", .kind = ZPS_OPTS_SWITCH,
     .help = "log lines as JSON objects",
     .offset = offsetof(s_flags, log_json), .ctype = ZPS_OPTS_C_BOOL},
    {.name = "pid-file", .kind = ZPS_OPTS_STRING, .metavar = "FILE",
     .help = "write this process's pid there while it runs",
     .offset = offsetof(s_flags, srv.pid_file), .ctype = ZPS_OPTS_C_STR},
};

static const zps_opts_prog s_prog = {
    .name = "zps-server",
    .synopsis = "usage: zps-server [options]                      (shard 0, the coordinator)\n"
                "       zps-server --shard I --shards N --coordinator ENDPOINT [--listen ...]\n",
    .epilogue = "SIGTERM or SIGINT: the shard stops at once, writes a checkpoint of the last\n"
                "finished step if --checkpoint-dir is set, and exits 0.\n",
    .opts = s_table,
    .n_opts = sizeof s_table / sizeof s_table[0],
};

// ---------------------------------------------------------------------------
// What relates several flags.

// The optimizer's flags against the optimizer: another one's are refused
// (torch's constructors refuse them too), and what was not given takes
// torch's defaults for Adam and AdamW (lr 1e-3; AdamW's weight decay 1e-2).
static bool s_check_optim_flags(zps_server_opts *o, const bool *given)
{
    static const char *const optim_flags[] = {"optimizer", "momentum", "nesterov",
                                              "weight-decay", "betas", "eps"};
    static const char *const schedule_flags[] = {"lr", "lr-schedule", "warmup-steps",
                                                 "lr-step-size", "lr-gamma"};
    for (size_t i = 0; i < sizeof schedule_flags / sizeof schedule_flags[0]; i++) {
        o->schedule_given = o->schedule_given || zps_opts_given(&s_prog, given, schedule_flags[i]);
    }
    o->optim_given = o->schedule_given;
    for (size_t i = 0; i < sizeof optim_flags / sizeof optim_flags[0]; i++) {
        o->optim_given = o->optim_given || zps_opts_given(&s_prog, given, optim_flags[i]);
    }
    o->optimizer = zps_optim_name(o->optim.kind);
    bool sgd = o->optim.kind == ZPS_OPTIM_SGD;
    if (sgd && (zps_opts_given(&s_prog, given, "betas") ||
                zps_opts_given(&s_prog, given, "eps"))) {
        fprintf(stderr, "zps-server: --betas and --eps are Adam's and AdamW's; --optimizer sgd "
                        "takes --momentum and --nesterov\n");
        return false;
    }
    if (!sgd && (zps_opts_given(&s_prog, given, "momentum") ||
                 zps_opts_given(&s_prog, given, "nesterov"))) {
        fprintf(stderr, "zps-server: --momentum and --nesterov are SGD's; --optimizer %s takes "
                        "--betas and --eps\n", o->optimizer);
        return false;
    }
    if (!sgd && !zps_opts_given(&s_prog, given, "lr")) {
        o->optim.lr = 1e-3f;
    }
    if (o->optim.kind == ZPS_OPTIM_ADAMW && !zps_opts_given(&s_prog, given, "weight-decay")) {
        o->optim.weight_decay = 1e-2f;
    }
    return true;
}

// CURVE's files, checkpoints, and a shard's place in the job.
static bool s_check_pairs(const zps_server_opts *o)
{
    if (!o->curve_secret != !o->authorized_keys) {
        fprintf(stderr, "zps-server: --curve-secret and --authorized-keys go together\n");
        return false;
    }
    if ((o->shard_keys || o->operator_keys) && !o->curve_secret) {
        fprintf(stderr, "zps-server: --shard-keys and --operator-keys need --curve-secret\n");
        return false;
    }
    if ((o->checkpoint_every || o->resume) && !o->checkpoint_dir) {
        fprintf(stderr, "zps-server: --checkpoint-every and --resume need --checkpoint-dir\n");
        return false;
    }
    if (o->shard >= o->shards) {
        fprintf(stderr, "zps-server: --shard %u needs --shards above it (1..%d shards)\n",
                o->shard, ZPS_MAX_SHARDS);
        return false;
    }
    if ((o->shard > 0) != (o->coordinator != NULL)) {
        fprintf(stderr, o->shard > 0 ? "zps-server: shard %u needs --coordinator ENDPOINT\n"
                                     : "zps-server: shard %u is the coordinator; drop "
                                       "--coordinator\n",
                o->shard);
        return false;
    }
    return true;
}

// --mode diloco's flags need it, and it refuses what would break it: the
// pieces of speculation and adaptive shares are a synchronous step's, and
// compression replaces a 16-bit wire.
static bool s_check_mode(const zps_server_opts *o, const bool *given)
{
    static const char *const own[] = {"inner-steps", "outer-lr", "outer-momentum", "compress",
                                        "fragments", "overlap"};
    for (size_t i = 0; !o->mode.diloco && i < sizeof own / sizeof own[0]; i++) {
        if (zps_opts_given(&s_prog, given, own[i])) {
            fprintf(stderr, "zps-server: --%s needs --mode diloco\n", own[i]);
            return false;
        }
    }
    if (o->mode.diloco && (o->speculate_after > 0 || o->adaptive_split ||
                           o->wire_dtype != ZPS_DTYPE_F32)) {
        fprintf(stderr, "zps-server: --mode diloco takes neither --speculate-after, "
                        "--adaptive-split nor --wire-dtype (--compress int8 instead)\n");
        return false;
    }
    if (o->wire_code && (o->mode.diloco || o->wire_dtype != ZPS_DTYPE_F32)) {
        fprintf(stderr, "zps-server: --wire-code zstd codes fp32 losslessly: it takes neither "
                        "--mode diloco nor --wire-dtype other than fp32\n");
        return false;
    }
    if (o->mode.diloco && o->clip_grad_norm > 0) {
        fprintf(stderr, "zps-server: --clip-grad-norm clips a synchronous step's gradient; "
                        "--mode diloco has none\n");
        return false;
    }
    return true;
}

// --deterministic and --micro-batch go together, and refuse what would
// change a run's bits with its split: a share that is no whole number of
// micro-batches, a worker without one, diloco's own steps, compression's
// per-worker error feedback and a 16-bit wire's rounding of partial sums.
static bool s_check_deterministic(const zps_server_opts *o)
{
    if (o->deterministic != (o->micro_batch > 0)) {
        fprintf(stderr, "zps-server: --deterministic and --micro-batch go together\n");
        return false;
    }
    if (!o->deterministic) {
        return true;
    }
    const char *what = o->mode.diloco                  ? "--mode diloco"
                       : o->mode.compress != 0         ? "--compress"
                       : o->wire_dtype != ZPS_DTYPE_F32 ? "--wire-dtype other than fp32"
                                                        : NULL;
    if (what) {
        fprintf(stderr, "zps-server: --deterministic takes no %s\n", what);
        return false;
    }
    if (o->shard > 0) {
        return true; // the job's sizes are shard 0's: it checks them, this one the ASSIGN
    }
    if (o->global_batch % o->micro_batch != 0) {
        fprintf(stderr, "zps-server: --global-batch %u is not a whole number of "
                        "--micro-batch %u\n", o->global_batch, o->micro_batch);
        return false;
    }
    if (o->workers > o->global_batch / o->micro_batch) {
        fprintf(stderr, "zps-server: --workers %u is more than the %u micro-batches of %u in "
                        "--global-batch %u: every worker needs one\n",
                o->workers, o->global_batch / o->micro_batch, o->micro_batch, o->global_batch);
        return false;
    }
    return true;
}

// The flags into *f. Returns -1 to run, or the exit status of a process
// that ends here: 0 after --help, 2 after a refusal (said in one line).
static int s_parse_flags(int argc, char **argv, s_flags *f)
{
    *f = (s_flags){
        .srv = {
            .listen = "tcp://127.0.0.1:5555",
            .sndbuf = ZPS_SNDBUF_AUTO,
            .workers = 1,
            .model = "mlp:784-512-512-10",
            .dataset = NULL, // fashion-mnist, or for an external model the workers'
            .global_batch = 128,
            .epochs = 10,
            .optimizer = "sgd",
            .optim = {.lr = 0.05f, .momentum = 0.9f, .schedule = ZPS_LR_COSINE,
                      .beta1 = ZPS_OPTIM_BETA1, .beta2 = ZPS_OPTIM_BETA2, .eps = ZPS_OPTIM_EPS,
                      .step_size = 1, .gamma = 0.1},
            .shards = 1,
            .wire_dtype = ZPS_DTYPE_F32,
            .worker_timeout_ms = 10000,
            .stall_warn_ms = 5000,
            .threads = 0, // auto
            .mode = {.inner_steps = ZPS_OUTER_INNER_STEPS,
                     .outer = {.lr = ZPS_OUTER_LR, .momentum = ZPS_OUTER_MOMENTUM}},
        },
        .log_level = ZPS_LOG_INFO,
    };
    bool given[sizeof s_table / sizeof s_table[0]] = {false};
    int status = zps_opts_parse_main(&s_prog, argc, argv, f, given);
    if (status >= 0) {
        return status;
    }
    if (f->log_json) {
        zps_log_set_json(true);
    }
    return s_check_optim_flags(&f->srv, given) && s_check_pairs(&f->srv) &&
                   s_check_deterministic(&f->srv) && s_check_mode(&f->srv, given)
               ? -1
               : 2;
}

int main(int argc, char **argv)
{
    s_flags f;
    int status = s_parse_flags(argc, argv, &f);
    if (status >= 0) {
        return status;
    }
    zps_wire_tune_malloc(); // before ZeroMQ's threads: every push's frames
    return zps_server_run(&f.srv);
}
