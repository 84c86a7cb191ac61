/* main.c - zps-worker: trains its slice of every global batch.
 *
 * It needs one address, the coordinator's. The flags become a libzps client
 * (include/zps.h, worker/zps_client.c: joining, the wire, every wait) and
 * the training loop of the built-in models (worker/zps_train.c: data,
 * backend, fault injection); main only parses, sets up and maps the end
 * of the job to the exit status. Signals stop the client. */
#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "common/zps_clock.h"
#include "common/zps_curve.h"
#include "common/zps_dataset.h"
#include "common/zps_dtype.h"
#include "common/zps_flags.h"
#include "common/zps_log.h"
#include "common/zps_model.h"
#include "common/zps_pidfile.h"
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
    int sndbuf;               // TCP send buffer of the shard sockets (0: the OS's)
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
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        zps_log_error("--save-params %s: %s", tmp, strerror(errno));
        return ZPS_EIO;
    }
    size_t n;
    const float *params = zps_train_params(t, &n);
    bool ok = fwrite(params, sizeof(float), n, f) == n;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        zps_log_error("--save-params %s: %s", path, strerror(errno));
        unlink(tmp);
        return ZPS_EIO;
    }
    zps_log_info("saved %zu parameters to %s", n, path);
    return ZPS_OK;
}

// ---------------------------------------------------------------------------
// Flags and start-up.

static void s_usage(FILE *f)
{
    fprintf(f,
            "usage: zps-worker --coordinator ENDPOINT [options]\n"
            "  --coordinator ENDPOINT  shard 0, e.g. tcp://127.0.0.1:5555 (required)\n"
            "  --device cpu|cuda[:N]   compute backend (default cpu); cuda needs a CUDA build\n"
            "  --gpu-math fp32|tf32|bf16  what cuBLAS may use on a GPU (default fp32; tf32\n"
            "                          and bf16 use tensor cores, fp32 accumulate, see README)\n"
            "  --check-device          check that --device can compute here, then exit\n"
            "                          (0: it can; 2: it cannot, and why)\n"
            "  --share N               ask for N samples of each global batch (default: split)\n"
            "  --save-params FILE      write the final flat parameters (float32 LE)\n"
            "  --threads N             OpenBLAS threads (default 1)\n"
            "  --cache-dir DIR         decompressed datasets (default ~/.cache/zps)\n"
            "  --timeout-ms MS         leave the job when the coordinator stays silent this\n"
            "                          long (default 60000); while it answers, wait\n"
            "  --join-timeout-ms MS    bound on waiting for the job to start (default 600000)\n"
            "  --no-overlap            push after backward instead of during it (benchmarks)\n"
            "  --heartbeat-ms MS       heartbeat interval to the coordinator (default 1000)\n"
            "  --sndbuf BYTES          TCP send buffer per shard connection (default: the OS's)\n"
            "  --slowdown F            fault injection: compute takes F times longer\n"
            "  --stall-prob P --stall-ms M  fault injection: pause M ms with chance P a step\n"
            "  --stall-seed N          fault injection: which steps pause (default: from the pid)\n"
            "  --curve-secret FILE     CurveZMQ: this worker's secret key (zps-ctl keygen)\n"
            "  --server-key FILE       CurveZMQ: the servers' public key\n"
            "  --log-level LEVEL       debug, info, warn, error (default info)\n"
            "  --log-json              log lines as JSON objects\n"
            "  --pid-file FILE         write this process's pid there while it runs\n"
            "Every flag may come from the environment instead: --some-flag X as\n"
            "ZPS_SOME_FLAG=X, a switch as ZPS_SOME_FLAG=1. The command line wins.\n"
            "SIGTERM or SIGINT: the worker leaves the job (BYE) and exits 0.\n");
}

static bool s_parse_int(const char *flag, const char *text, long lo, long hi, long *out)
{
    long long v;
    bool ok = zps_flags_int("zps-worker", flag, text, lo, hi, &v);
    *out = ok ? (long)v : *out;
    return ok;
}

static bool s_parse_real(const char *flag, const char *text, double lo, double hi, double *out)
{
    return zps_flags_real("zps-worker", flag, text, lo, hi, out);
}

static bool s_parse_opts(int argc, char **argv, s_opts *o, char *cache_buf, size_t cache_len)
{
    enum { O_COORD = 256, O_DEVICE, O_SHARE, O_SAVE, O_THREADS, O_CACHE, O_TIMEOUT, O_JOIN,
           O_NO_OVERLAP, O_HEARTBEAT, O_CURVE_SECRET, O_SERVER_KEY, O_SLOWDOWN, O_STALL_PROB, O_STALL_SEED, O_SNDBUF,
           O_STALL_MS, O_LOG, O_LOG_JSON, O_PID_FILE, O_GPU_MATH, O_CHECK_DEVICE, O_HELP };
    static const struct option longopts[] = {
        {"coordinator", required_argument, 0, O_COORD},
        {"device", required_argument, 0, O_DEVICE},
        {"gpu-math", required_argument, 0, O_GPU_MATH},
        {"check-device", no_argument, 0, O_CHECK_DEVICE},
        {"share", required_argument, 0, O_SHARE},
        {"save-params", required_argument, 0, O_SAVE},
        {"threads", required_argument, 0, O_THREADS},
        {"cache-dir", required_argument, 0, O_CACHE},
        {"timeout-ms", required_argument, 0, O_TIMEOUT},
        {"join-timeout-ms", required_argument, 0, O_JOIN},
        {"no-overlap", no_argument, 0, O_NO_OVERLAP},
        {"heartbeat-ms", required_argument, 0, O_HEARTBEAT},
        {"curve-secret", required_argument, 0, O_CURVE_SECRET},
        {"server-key", required_argument, 0, O_SERVER_KEY},
        {"slowdown", required_argument, 0, O_SLOWDOWN},
        {"stall-prob", required_argument, 0, O_STALL_PROB},
        {"stall-ms", required_argument, 0, O_STALL_MS},
        {"stall-seed", required_argument, 0, O_STALL_SEED},
        {"sndbuf", required_argument, 0, O_SNDBUF},
        {"log-level", required_argument, 0, O_LOG},
        {"log-json", no_argument, 0, O_LOG_JSON},
        {"pid-file", required_argument, 0, O_PID_FILE},
        {"help", no_argument, 0, O_HELP},
        {0, 0, 0, 0},
    };
    char **args;
    if (zps_flags_from_env("zps-worker", longopts, environ, argc, argv, &argc, &args) != ZPS_OK) {
        return false;
    }
    argv = args;
    *o = (s_opts){.device = "cpu", .threads = 1, .timeout_ms = 60000, .join_timeout_ms = 600000,
                  .heartbeat_ms = 1000};
    long v = 0;
    int c;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        bool ok = true;
        switch (c) {
        case O_COORD: o->coordinator = optarg; break;
        case O_DEVICE: o->device = optarg; break;
        case O_GPU_MATH:
            ok = zps_backend_parse_gpu_math(optarg, &o->gpu_math);
            if (!ok) {
                fprintf(stderr, "zps-worker: --gpu-math: fp32, tf32 or bf16\n");
            }
            break;
        case O_CHECK_DEVICE: o->check_device = true; break;
        case O_SHARE: ok = s_parse_int("--share", optarg, 1, 1 << 24, &v); o->share = (uint32_t)v; break;
        case O_SAVE: o->save_params = optarg; break;
        case O_THREADS: ok = s_parse_int("--threads", optarg, 1, 256, &v); o->threads = (int)v; break;
        case O_CACHE: o->cache_dir = optarg; break;
        case O_TIMEOUT: ok = s_parse_int("--timeout-ms", optarg, 100, 86400000, &v); o->timeout_ms = (int)v; break;
        case O_JOIN: ok = s_parse_int("--join-timeout-ms", optarg, 100, 86400000, &v); o->join_timeout_ms = (int)v; break;
        case O_NO_OVERLAP: o->no_overlap = true; break;
        case O_CURVE_SECRET: o->curve_secret = optarg; break;
        case O_SERVER_KEY: o->server_key = optarg; break;
        case O_SLOWDOWN: ok = s_parse_real("--slowdown", optarg, 1.0, 1000.0, &o->slowdown); break;
        case O_STALL_PROB: ok = s_parse_real("--stall-prob", optarg, 0.0, 1.0, &o->stall_prob); break;
        case O_STALL_MS:
            ok = s_parse_int("--stall-ms", optarg, 0, 3600000, &v);
            o->stall_ms = (int)v;
            break;
        case O_STALL_SEED:
            ok = s_parse_int("--stall-seed", optarg, 0, LONG_MAX, &v);
            o->stall_seed = (uint64_t)v;
            o->stall_seed_set = true;
            break;
        case O_HEARTBEAT:
            ok = s_parse_int("--heartbeat-ms", optarg, 10, 3600000, &v);
            o->heartbeat_ms = (int)v;
            break;
        case O_SNDBUF:
            ok = s_parse_int("--sndbuf", optarg, 0, 1L << 30, &v);
            if (ok && v != 0 && v < 4096) {
                fprintf(stderr, "zps-worker: --sndbuf: '%s' is not 0 or 4096..%ld bytes\n", optarg,
                        1L << 30);
                ok = false;
            }
            o->sndbuf = (int)v;
            break;
        case O_LOG: {
            zps_log_level lvl;
            ok = zps_log_parse_level(optarg, &lvl);
            if (ok) {
                zps_log_set_level(lvl);
            } else {
                fprintf(stderr, "zps-worker: --log-level: debug, info, warn or error\n");
            }
            break;
        }
        case O_LOG_JSON: zps_log_set_json(true); break;
        case O_PID_FILE: o->pid_file = optarg; break;
        case O_HELP: s_usage(stdout); exit(0);
        default: ok = false; break;
        }
        if (!ok) {
            s_usage(stderr);
            free(args);
            return false;
        }
    }
    bool extra = optind < argc;
    if (extra || (!o->coordinator && !o->check_device)) {
        fprintf(stderr, extra ? "zps-worker: unexpected argument '%s'\n"
                              : "zps-worker: --coordinator is required%s\n",
                extra ? argv[optind] : "");
        s_usage(stderr);
        free(args);
        return false;
    }
    free(args);
    if (!o->cache_dir) {
        const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
        if (xdg && *xdg) {
            snprintf(cache_buf, cache_len, "%s/zps", xdg);
        } else {
            snprintf(cache_buf, cache_len, "%s/.cache/zps", home && *home ? home : "/tmp");
        }
        o->cache_dir = cache_buf;
    }
    return true;
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
        zps_client_set_int(c, ZPS_OPT_SNDBUF, o->sndbuf) != ZPS_OK) {
        fprintf(stderr, "zps-worker: %s\n", zps_errmsg(c));
        zps_client_destroy(&c);
    } else if (o->curve_secret && zps_client_set_curve(c, o->curve_secret, o->server_key) != ZPS_OK) {
        zps_client_destroy(&c); // the reason is logged
    }
    return c;
}

int main(int argc, char **argv)
{
    zps_log_set_name("worker");
    s_opts o;
    char cache_dir[4096]; // o points into it
    if (!s_parse_opts(argc, argv, &o, cache_dir, sizeof cache_dir)) {
        return 2;
    }
    if (!zps_backend_supports(o.device)) {
        return 2;
    }
    if (o.check_device) {
        zps_log_info("--device %s can compute here", o.device);
        return 0;
    }
    if (!o.curve_secret != !o.server_key) {
        fprintf(stderr, "zps-worker: --curve-secret and --server-key go together\n");
        return 2;
    }
    zps_client *c = s_client_new(&o);
    if (!c) {
        return 2;
    }
    if (o.pid_file && zps_pidfile_write(o.pid_file) != ZPS_OK) {
        zps_client_destroy(&c);
        return 2;
    }
    s_client = c;
    struct sigaction sa = {.sa_handler = s_on_signal};
    (void)sigaction(SIGTERM, &sa, NULL);
    (void)sigaction(SIGINT, &sa, NULL);
    openblas_set_num_threads(o.threads);
    if (zps_connect(c) != ZPS_OK) {
        s_client = NULL;
        zps_client_destroy(&c);
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
    if (err == ZPS_OK) {
        int r = zps_train_run(tr);
        over = r == ZPS_NEXT_OVER;
        err = r == ZPS_NEXT_DONE ? ZPS_OK : zps_errcode(c) != ZPS_OK ? zps_errcode(c) : ZPS_EIO;
    }
    if (err == ZPS_OK && o.save_params) {
        err = s_save_params(tr, o.save_params);
    }
    if (err == ZPS_OK) {
        (void)zps_leave(c);
        zps_log_info("done: %llu steps",
                     (unsigned long long)zps_info_u64(c, ZPS_INFO_TOTAL_STEPS));
    } else if (s_stop) {
        // Left on purpose: the coordinator hands this worker's share on at once.
        (void)zps_leave(c);
        zps_log_info("stopped by signal");
        err = ZPS_OK;
    } else if (over) {
        // Not a failure of this worker: a supervisor need not restart it.
        zps_log_info("the job ended without this worker: exiting without final parameters");
        err = ZPS_OK;
    }
    s_client = NULL;
    zps_client_destroy(&c); // first: ZeroMQ may hold the backend's gradient
    zps_train_destroy(&tr);
    if (o.pid_file) {
        zps_pidfile_remove(o.pid_file);
    }
    return err == ZPS_OK ? 0 : 1;
}
