/* main.c - zps-worker: trains its slice of every global batch.
 *
 * It needs one address, the coordinator's. The flags become a libzps client
 * (include/zps.h, lib/zps_client.c: joining, the wire, every wait) and
 * the training loop of the built-in models (worker/zps_train.c: data,
 * backend, fault injection); main only parses, sets up and maps the end
 * of the job to the exit status. Signals stop the client. */
#include <cblas.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <zmq.h>

#include "common/zps_atomic.h"
#include "common/zps_clock.h"
#include "common/zps_curve.h"
#include "common/zps_dataset.h"
#include "common/zps_dtype.h"
#include "common/zps_log.h"
#include "common/zps_model.h"
#include "common/zps_opts.h"
#include "common/zps_pidfile.h"
#include "common/zps_sndbuf.h"
#include "common/zps_wire.h"
#include "include/zps.h"
#include "worker/zps_backend.h"
#include "worker/zps_train.h"

typedef struct s_opts {
    const char *coordinator;  // endpoint of shard 0
    const char *device;       // "cpu", "cuda" or "cuda:N"
    zps_gpu_math gpu_math;    // what cuBLAS may use on a GPU
    bool check_device;        // only check that device can compute here
    uint32_t share;           // fixed share of the global batch, 0: split the rest
    const char *save_params;  // final flat vector, or NULL
    const char *cache_dir;    // decompressed datasets
    int threads;              // OpenBLAS threads
    int timeout_ms;           // bound on any reply of the running job
    int join_timeout_ms;      // bound on waiting for the job to start
    bool no_overlap;          // push after backward, not during (to measure the overlap)
    int heartbeat_ms;         // interval of the heartbeat to the coordinator
    const char *curve_secret; // CurveZMQ: this worker's secret key, or NULL
    const char *server_key;   // CurveZMQ: the servers' public key
    double slowdown;          // fault injection: compute takes this many times longer
    double stall_prob;        // fault injection: chance of a pause per step
    int stall_ms;             // fault injection: length of a pause
    uint64_t stall_seed;      // fault injection: draws which steps pause
    bool stall_seed_set;      // --stall-seed given (else the pid draws)
    const char *pid_file;     // for supervisors, or NULL
    int sndbuf;               // TCP send buffer of the shard sockets (0: the OS's, -1: auto)
    int shm;                  // ZPS_OPT_SHM: 0 off, 1 auto, 2 on
    zps_log_level log_level;  // --log-level (zps_opts_log_level applies it)
    bool log_json;            // --log-json
} s_opts;

// SIGTERM or SIGINT: every wait of the client returns within a poll
// interval, and the worker leaves the job instead of finishing it.
static volatile sig_atomic_t s_stop;
static zps_client *volatile s_client; // borrowed: told to stop

static void s_on_signal(int sig)
{
    (void)sig;
    s_stop = 1;
    zps_client *c = s_client;
    if (c) {
        zps_client_stop(c);
    }
}

static zps_err s_save_params(const zps_train *t, const char *path)
{
    size_t n;
    const float *params = zps_train_params(t, &n);
    // 0666 less the umask: the mode fopen gave it.
    if (zps_atomic_write(path, params, n * sizeof(float), 0666) != ZPS_OK) {
        zps_log_error("--save-params %s: not written", path);
        return ZPS_EIO;
    }
    zps_log_info("saved %zu parameters to %s", n, path);
    return ZPS_OK;
}

// ---------------------------------------------------------------------------
// Flags and start-up.

static bool s_parse_shm(const char *text, void *field)
{
    static const char *names[] = {"off", "auto", "on"}; // ZPS_OPT_SHM's values
    for (int i = 0; i < 3; i++) {
        if (strcmp(text, names[i]) == 0) {
            *(int *)field = i;
            return true;
        }
    }
    return false;
}

static bool s_parse_gpu_math(const char *text, void *field)
{
    return zps_backend_parse_gpu_math(text, (zps_gpu_math *)field);
}

static const zps_opts_row s_table[] = {
    {.name = "coordinator", .kind = ZPS_OPTS_STRING, .metavar = "ENDPOINT",
     .help = "shard 0, e.g. tcp://127.0.0.1:5555 (required: everything else comes from the "
             "server)",
     .offset = offsetof(s_opts, coordinator), .ctype = ZPS_OPTS_C_STR},
    {.name = "device", .kind = ZPS_OPTS_STRING, .metavar = "cpu|cuda[:N]", .def = "cpu",
     .help = "compute backend; cuda needs a CUDA build (docs/gpu.md)",
     .offset = offsetof(s_opts, device), .ctype = ZPS_OPTS_C_STR},
    {.name = "gpu-math", .kind = ZPS_OPTS_CUSTOM, .metavar = "fp32|tf32|bf16", .def = "fp32",
     .help = "what cuBLAS may use on a GPU; tf32 and bf16 use tensor cores, fp32 accumulate",
     .offset = offsetof(s_opts, gpu_math), .ctype = ZPS_OPTS_C_PARSER,
     .parse = s_parse_gpu_math, .accepts = "fp32, tf32 or bf16"},
    {.name = "check-device", .kind = ZPS_OPTS_SWITCH,
     .help = "check that --device can compute here, then exit (0: it can; 2: it cannot, and "
             "why)",
     .offset = offsetof(s_opts, check_device), .ctype = ZPS_OPTS_C_BOOL},
    {.name = "share", .kind = ZPS_OPTS_INT, .metavar = "N", .def = "split",
     .help = "ask for N samples of each global batch; members without one split the rest "
             "evenly, lower ranks taking the remainder",
     .offset = offsetof(s_opts, share), .ctype = ZPS_OPTS_C_U32, .lo = 1, .hi = 1 << 24},
    {.name = "save-params", .kind = ZPS_OPTS_STRING, .metavar = "FILE",
     .help = "write the final flat parameters (float32 LE)",
     .offset = offsetof(s_opts, save_params), .ctype = ZPS_OPTS_C_STR},
    {.name = "threads", .kind = ZPS_OPTS_INT, .metavar = "N", .def = "1",
     .help = "OpenBLAS threads",
     .offset = offsetof(s_opts, threads), .ctype = ZPS_OPTS_C_INT, .lo = 1, .hi = 256},
    {.name = "cache-dir", .kind = ZPS_OPTS_STRING, .metavar = "DIR", .def = "~/.cache/zps",
     .help = "decompressed datasets ($XDG_CACHE_HOME/zps where that is set)",
     .offset = offsetof(s_opts, cache_dir), .ctype = ZPS_OPTS_C_STR},
    {.name = "timeout-ms", .kind = ZPS_OPTS_INT, .metavar = "MS", .def = "60000",
     .help = "leave the job when the coordinator stays silent this long; while it answers, "
             "wait",
     .offset = offsetof(s_opts, timeout_ms), .ctype = ZPS_OPTS_C_INT,
     .lo = 100, .hi = 86400000},
    {.name = "join-timeout-ms", .kind = ZPS_OPTS_INT, .metavar = "MS", .def = "600000",
     .help = "bound on waiting for the job to start",
     .offset = offsetof(s_opts, join_timeout_ms), .ctype = ZPS_OPTS_C_INT,
     .lo = 100, .hi = 86400000},
    {.name = "no-overlap", .kind = ZPS_OPTS_SWITCH,
     .help = "push after backward instead of during it (benchmarks)",
     .offset = offsetof(s_opts, no_overlap), .ctype = ZPS_OPTS_C_BOOL},
    {.name = "heartbeat-ms", .kind = ZPS_OPTS_INT, .metavar = "MS", .def = "1000",
     .help = "least heartbeat interval to the coordinator: a beat goes out when nothing "
             "else (a push to shard 0) did for that long; where steps are longer than half "
             "of it, for two usual steps, at most a quarter of the server's "
             "--worker-timeout-ms",
     .offset = offsetof(s_opts, heartbeat_ms), .ctype = ZPS_OPTS_C_INT,
     .lo = 10, .hi = 3600000},
    {.name = "sndbuf", .kind = ZPS_OPTS_CUSTOM, .metavar = "auto|BYTES", .def = "auto",
     .help = "TCP send buffer of each shard connection: auto (per connection, "
             "docs/running.md), 0 (the OS's) or 4096..1073741824 bytes",
     .offset = offsetof(s_opts, sndbuf), .ctype = ZPS_OPTS_C_PARSER,
     .parse = zps_sndbuf_parse, .accepts = "auto, 0 or 4096..1073741824"},
    {.name = "shm", .kind = ZPS_OPTS_CUSTOM, .metavar = "auto|on|off", .def = "auto",
     .help = "gradients to shards on this host through shared memory; auto: those whose "
             "endpoint is this host's; on: any (a shard elsewhere refuses once)",
     .offset = offsetof(s_opts, shm), .ctype = ZPS_OPTS_C_PARSER,
     .parse = s_parse_shm, .accepts = "auto, on or off"},
    {.name = "slowdown", .kind = ZPS_OPTS_REAL, .metavar = "F",
     .help = "fault injection: compute takes F times longer",
     .offset = offsetof(s_opts, slowdown), .ctype = ZPS_OPTS_C_DOUBLE,
     .real_lo = 1, .real_hi = 1000},
    {.name = "stall-prob", .kind = ZPS_OPTS_REAL, .metavar = "P",
     .help = "fault injection: the chance of a pause of --stall-ms a step",
     .offset = offsetof(s_opts, stall_prob), .ctype = ZPS_OPTS_C_DOUBLE,
     .real_lo = 0, .real_hi = 1},
    {.name = "stall-ms", .kind = ZPS_OPTS_INT, .metavar = "M",
     .help = "fault injection: the length of a pause",
     .offset = offsetof(s_opts, stall_ms), .ctype = ZPS_OPTS_C_INT, .lo = 0, .hi = 3600000},
    {.name = "stall-seed", .kind = ZPS_OPTS_INT, .metavar = "N", .def = "from the pid",
     .help = "fault injection: which steps pause (docs/stragglers.md)",
     .offset = offsetof(s_opts, stall_seed), .ctype = ZPS_OPTS_C_U64,
     .lo = 0, .hi = LLONG_MAX},
    {.name = "curve-secret", .kind = ZPS_OPTS_STRING, .metavar = "FILE",
     .help = "CurveZMQ: this worker's secret key (zps-ctl keygen; docs/security.md)",
     .offset = offsetof(s_opts, curve_secret), .ctype = ZPS_OPTS_C_STR},
    {.name = "server-key", .kind = ZPS_OPTS_STRING, .metavar = "FILE",
     .help = "CurveZMQ: the servers' public key",
     .offset = offsetof(s_opts, server_key), .ctype = ZPS_OPTS_C_STR},
    {.name = "log-level", .kind = ZPS_OPTS_CUSTOM, .metavar = "LEVEL", .def = "info",
     .help = "debug, info, warn or error",
     .offset = offsetof(s_opts, log_level), .ctype = ZPS_OPTS_C_PARSER,
     .parse = zps_opts_log_level, .accepts = "debug, info, warn or error"},
    {.name = "log-json", .kind = ZPS_OPTS_SWITCH,
     .help = "log lines as JSON objects",
     .offset = offsetof(s_opts, log_json), .ctype = ZPS_OPTS_C_BOOL},
    {.name = "pid-file", .kind = ZPS_OPTS_STRING, .metavar = "FILE",
     .help = "write this process's pid there while it runs",
     .offset = offsetof(s_opts, pid_file), .ctype = ZPS_OPTS_C_STR},
};

static const zps_opts_prog s_prog = {
    .name = "zps-worker",
    .synopsis = "usage: zps-worker --coordinator ENDPOINT [options]\n",
    .epilogue = "SIGTERM or SIGINT: the worker leaves the job (BYE) and exits 0.\n",
    .opts = s_table,
    .n_opts = sizeof s_table / sizeof s_table[0],
};

// The flags into *o, its cache directory (when not given) in cache_buf.
// Returns -1 to run, or the exit status of a process that ends here: 0
// after --help, 2 after a refusal (said in one line).
static int s_parse_opts(int argc, char **argv, s_opts *o, char *cache_buf, size_t cache_len)
{
    *o = (s_opts){.device = "cpu", .threads = 1, .timeout_ms = 60000, .join_timeout_ms = 600000,
                  .heartbeat_ms = 1000, .shm = 1, .sndbuf = ZPS_SNDBUF_AUTO,
                  .log_level = ZPS_LOG_INFO};
    bool given[sizeof s_table / sizeof s_table[0]] = {false};
    int status = zps_opts_parse_main(&s_prog, argc, argv, o, given);
    if (status >= 0) {
        return status;
    }
    if (o->log_json) {
        zps_log_set_json(true);
    }
    o->stall_seed_set = zps_opts_given(&s_prog, given, "stall-seed");
    if (!o->coordinator && !o->check_device) {
        fprintf(stderr, "zps-worker: --coordinator is required\n");
        return 2;
    }
    if (!o->cache_dir) {
        const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
        if (xdg && *xdg) {
            snprintf(cache_buf, cache_len, "%s/zps", xdg);
        } else {
            snprintf(cache_buf, cache_len, "%s/.cache/zps", home && *home ? home : "/tmp");
        }
        o->cache_dir = cache_buf;
    }
    return -1;
}

// The client, with the flags' options; NULL (logged) on failure.
static zps_client *s_client_new(const s_opts *o)
{
    zps_client *c = zps_client_new(o->coordinator);
    if (!c) {
        zps_log_error("cannot connect to %s: %s", o->coordinator, zmq_strerror(errno));
        return NULL;
    }
    if (zps_client_set_str(c, ZPS_OPT_DEVICE, o->device) != ZPS_OK ||
        zps_client_set_int(c, ZPS_OPT_SHARE, o->share) != ZPS_OK ||
        zps_client_set_int(c, ZPS_OPT_TIMEOUT_MS, o->timeout_ms) != ZPS_OK ||
        zps_client_set_int(c, ZPS_OPT_JOIN_TIMEOUT_MS, o->join_timeout_ms) != ZPS_OK ||
        zps_client_set_int(c, ZPS_OPT_HEARTBEAT_MS, o->heartbeat_ms) != ZPS_OK ||
        zps_client_set_int(c, ZPS_OPT_SNDBUF, o->sndbuf) != ZPS_OK ||
        zps_client_set_int(c, ZPS_OPT_SHM, o->shm) != ZPS_OK) {
        fprintf(stderr, "zps-worker: %s\n", zps_errmsg(c));
        zps_client_destroy(&c);
    } else if (o->curve_secret && zps_client_set_curve(c, o->curve_secret, o->server_key) != ZPS_OK) {
        zps_client_destroy(&c); // the reason is logged
    }
    return c;
}

// OpenBLAS picks its kernels from its table of CPU models when it loads;
// a model it does not know (a VM's plain "Intel(R) Xeon(R) Processor")
// gets Prescott's SSE3 kernels, on the reference machine 3.8 x slower than
// its AVX-512 ones for the default job (17.4 against 4.6 ms of compute a
// step). It cannot change them once loaded, so say how (docs/running.md).
static void s_check_blas_core(void)
{
    const char *core = openblas_get_corename();
    const char *better = __builtin_cpu_supports("avx512f") ? "SkylakeX"
                         : __builtin_cpu_supports("avx2") ? "Haswell"
                                                          : NULL;
    if (better && core && strcasecmp(core, "prescott") == 0 && !getenv("OPENBLAS_CORETYPE")) {
        zps_log_warn("OpenBLAS took its Prescott kernels on a CPU with %s, a model its table "
                     "does not know: OPENBLAS_CORETYPE=%s makes the compute about 4x faster "
                     "(docs/running.md)", strcmp(better, "SkylakeX") == 0 ? "AVX-512" : "AVX2",
                     better);
    }
}

// The client of the options, its pid file written, the signals that stop
// it set, connected; NULL if any of that failed (said).
static zps_client *s_start(const s_opts *o)
{
    zps_client *c = s_client_new(o);
    if (!c) {
        return NULL;
    }
    if (o->pid_file && zps_pidfile_write(o->pid_file) != ZPS_OK) {
        zps_client_destroy(&c);
        return NULL;
    }
    s_client = c;
    struct sigaction sa = {.sa_handler = s_on_signal};
    (void)sigaction(SIGTERM, &sa, NULL);
    (void)sigaction(SIGINT, &sa, NULL);
    openblas_set_num_threads(o->threads);
    s_check_blas_core();
    if (zps_connect(c) != ZPS_OK) {
        s_client = NULL;
        zps_client_destroy(&c);
        return NULL;
    }
    return c;
}

// Leaves the job after the run ended with err: ZPS_OK also when stopped by
// signal or when the job ended without this worker (over).
static zps_err s_leave(zps_client *c, zps_err err, bool over)
{
    if (err == ZPS_OK) {
        (void)zps_leave(c);
        zps_log_info("done: %llu steps; %.3f MiB of gradients pushed on sockets",
                     (unsigned long long)zps_info_u64(c, ZPS_INFO_TOTAL_STEPS),
                     (double)zps_info_u64(c, ZPS_INFO_PUSHED_BYTES) / (1024.0 * 1024.0));
    } else if (s_stop) {
        // Left on purpose: the coordinator hands this worker's share on at once.
        (void)zps_leave(c);
        zps_log_info("stopped by signal");
        err = ZPS_OK;
    } else if (over) {
        // Not a failure of this worker: a supervisor need not restart it.
        // Its BYE spares the coordinator the wait for its last report.
        (void)zps_leave(c);
        zps_log_info("the job ended without this worker: exiting without final parameters");
        err = ZPS_OK;
    }
    return err;
}

int main(int argc, char **argv)
{
    zps_log_set_name("worker");
    s_opts o;
    char cache_dir[4096]; // o points into it
    int status = s_parse_opts(argc, argv, &o, cache_dir, sizeof cache_dir);
    if (status >= 0) {
        return status;
    }
    if (!zps_backend_supports(o.device)) {
        return 2;
    }
    zps_wire_tune_malloc(); // before ZeroMQ's threads: every step's parameters
    if (o.check_device) {
        zps_log_info("--device %s can compute here", o.device);
        return 0;
    }
    if (!o.curve_secret != !o.server_key) {
        fprintf(stderr, "zps-worker: --curve-secret and --server-key go together\n");
        return 2;
    }
    zps_client *c = s_start(&o);
    if (!c) {
        return 2;
    }
    zps_train_opts topts = {
        .device = o.device, .gpu_math = o.gpu_math, .cache_dir = o.cache_dir,
        .no_overlap = o.no_overlap, .slowdown = o.slowdown, .stall_prob = o.stall_prob,
        .stall_ms = o.stall_ms,
        .fault_seed = o.stall_seed_set ? o.stall_seed : (uint64_t)getpid(),
    };
    zps_train *tr = NULL;
    zps_err err = zps_join(c);
    bool over = err == ZPS_ECLOSED && !s_stop;
    if (err == ZPS_OK && !(tr = zps_train_new(c, &topts))) {
        err = ZPS_EINVAL;
    }
    if (err == ZPS_OK && zps_info_u64(c, ZPS_INFO_MICRO_BATCH) > 0 &&
        strncmp(o.device, "cuda", 4) != 0) {
        // Bits equal across workers need equal kernels: name this one's.
        zps_log_info("deterministic job, micro-batches of %llu: OpenBLAS %s kernels, %d "
                     "thread(s); every CPU worker must have the same (docs/deterministic.md)",
                     (unsigned long long)zps_info_u64(c, ZPS_INFO_MICRO_BATCH),
                     openblas_get_corename(), o.threads);
    }
    if (err == ZPS_OK) {
        int r = zps_train_run(tr);
        over = r == ZPS_NEXT_OVER;
        err = r == ZPS_NEXT_DONE ? ZPS_OK : zps_errcode(c) != ZPS_OK ? zps_errcode(c) : ZPS_EIO;
    }
    if (err == ZPS_OK && o.save_params) {
        err = s_save_params(tr, o.save_params);
    }
    err = s_leave(c, err, over);
    s_client = NULL;
    zps_client_destroy(&c); // first: ZeroMQ may hold the backend's gradient
    zps_train_destroy(&tr);
    if (o.pid_file) {
        zps_pidfile_remove(o.pid_file);
    }
    return err == ZPS_OK ? 0 : 1;
}
