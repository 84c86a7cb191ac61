/* main.c - zps-server's flags. The process itself is zps_server.c. */
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/zps_flags.h"
#include "common/zps_log.h"
#include "common/zps_plan.h"
#include "server/zps_server.h"

typedef zps_server_opts s_opts;

static void s_usage(FILE *f)
{
    fprintf(f,
            "usage: zps-server [options]                      (shard 0, the coordinator)\n"
            "       zps-server --shard I --shards N --coordinator ENDPOINT [--listen ...]\n"
            "  --shard I --shards N   this process serves shard I of N (default 0 of 1)\n"
            "  --coordinator ENDPOINT shards 1..N-1: where shard 0 listens\n"
            "  --listen ENDPOINT      bind here (default tcp://127.0.0.1:5555; port * picks one)\n"
            "  --endpoint-file FILE   write the bound endpoint here once listening\n"
            "  --workers N            workers to admit before step 0 (default 1)\n"
            "  --model SPEC           mlp:D0-D1-...-Dk (default mlp:784-512-512-10)\n"
            "  --dataset SPEC         fashion-mnist[:DIR] or synthetic:N (default fashion-mnist)\n"
            "  --global-batch B       samples per step over all workers (default 128)\n"
            "  --epochs E | --steps S run length (default 10 epochs)\n"
            "  --optimizer NAME       sgd (default), adam or adamw, as torch.optim's\n"
            "  --lr X                 peak learning rate (sgd 0.05; adam, adamw 0.001)\n"
            "  --momentum X           sgd: momentum (0.9); --nesterov: Nesterov's\n"
            "  --weight-decay X       sgd, adam: L2 added to the gradient (0); adamw:\n"
            "                         decoupled, p -= lr * X * p (0.01)\n"
            "  --betas B1,B2          adam, adamw: moment decay rates in [0, 1) (0.9,0.999)\n"
            "  --eps X                adam, adamw: added to the denominator, > 0 (1e-8)\n"
            "  --lr-schedule NAME     constant or cosine (default cosine, to 0 at the end)\n"
            "  --warmup-steps N       linear warm-up (default 0)\n"
            "  --seed N               init and data order (default 0)\n"
            "  --worker-timeout-ms MS evict a worker silent this long (default 10000)\n"
            "  --stall-warn-ms MS     while a step waits, say for whom this often (default 5000)\n"
            "  --sndbuf BYTES         TCP send buffer per connection (default: the OS's); see\n"
            "                         README, Running on a cluster\n"
            "  --adaptive-split       shares follow each worker's measured throughput\n"
            "  --speculate-after X    once half a step's slices are in, hand a missing one X\n"
            "                         median steps later (at once if none of it came) to the\n"
            "                         finished workers too, in pieces; the first copy counts\n"
            "  --http HOST:PORT       /healthz and /readyz (any shard); shard 0 also /metrics\n"
            "                         (Prometheus) and /status (JSON)\n"
            "  --checkpoint-every K   shards checkpoint every K steps (shard 0 sets it for all)\n"
            "  --checkpoint-dir DIR   where this shard keeps its checkpoints\n"
            "  --resume               restart from this shard's newest valid checkpoint\n"
            "  --curve-secret FILE    CurveZMQ: this server's secret key (zps-ctl keygen)\n"
            "  --authorized-keys DIR  CurveZMQ: the workers' public keys (*.pub); SIGHUP re-reads\n"
            "                         every list\n"
            "  --shard-keys DIR       CurveZMQ: the shards' public keys (this server's own key\n"
            "                         is one without being listed)\n"
            "  --operator-keys DIR    CurveZMQ: keys that may only ask for STATUS (zps-ctl)\n"
            "  --server-key FILE      shards > 0: the coordinator's public key (default: own)\n"
            "  --require-curve        refuse to start without CurveZMQ\n"
            "  --wire-dtype T         fp32, bf16 or fp16 for tensors on the wire (default fp32)\n"
            "  --metrics-log FILE     JSON lines: one per step, one per evaluation\n"
            "  --advertise ENDPOINT   shards > 0: where workers reach this shard (default: the\n"
            "                         bound endpoint; needed when --listen is 0.0.0.0)\n"
            "  --log-level LEVEL      debug, info, warn, error (default info)\n"
            "  --log-json             log lines as JSON objects\n"
            "  --pid-file FILE        write this process's pid there while it runs\n"
            "Every flag may come from the environment instead: --some-flag X as\n"
            "ZPS_SOME_FLAG=X, a switch as ZPS_SOME_FLAG=1. The command line wins.\n"
            "SIGTERM or SIGINT: the shard stops at once, writes a checkpoint of the last\n"
            "finished step if --checkpoint-dir is set, and exits 0.\n");
}

static bool s_parse_u64(const char *flag, const char *text, uint64_t *out)
{
    long long v;
    bool ok = zps_flags_int("zps-server", flag, text, 0, LLONG_MAX, &v);
    *out = ok ? (uint64_t)v : *out;
    return ok;
}

// Every real flag of the server (--lr, --momentum, --weight-decay,
// --speculate-after) is >= 0: a negative one is refused here, in one line.
static bool s_parse_float(const char *flag, const char *text, float *out)
{
    double v;
    bool ok = zps_flags_real("zps-server", flag, text, 0, FLT_MAX, &v);
    *out = ok ? (float)v : *out;
    return ok;
}

// --betas B1,B2: two numbers in [0, 1), as torch.optim.Adam accepts them.
static bool s_parse_betas(const char *text, zps_optim_cfg *optim)
{
    char *end;
    errno = 0;
    double b1 = strtod(text, &end);
    bool ok = errno == 0 && end != text && *end == ',';
    double b2 = ok ? strtod(end + 1, &end) : 0;
    ok = ok && errno == 0 && *end == '\0' && b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1;
    if (!ok) {
        fprintf(stderr, "zps-server: --betas: '%s' is not two numbers in [0, 1) separated by a "
                        "comma (e.g. 0.9,0.999)\n", text);
        return false;
    }
    optim->beta1 = b1;
    optim->beta2 = b2;
    return true;
}

// The optimizer's flags, as given on the command line or in the environment.
enum { G_LR, G_MOMENTUM, G_NESTEROV, G_WD, G_BETAS, G_EPS, G_OPTIM_FLAGS };

// The optimizer's flags against the optimizer: another one's are refused
// (torch's constructors refuse them too), and what was not given takes
// torch's defaults for Adam and AdamW (lr 1e-3; AdamW's weight decay 1e-2).
static bool s_check_optim_flags(s_opts *o, const bool *given)
{
    bool sgd = o->optim.kind == ZPS_OPTIM_SGD;
    if (sgd && (given[G_BETAS] || given[G_EPS])) {
        fprintf(stderr, "zps-server: --betas and --eps are Adam's and AdamW's; --optimizer sgd "
                        "takes --momentum and --nesterov\n");
        return false;
    }
    if (!sgd && (given[G_MOMENTUM] || given[G_NESTEROV])) {
        fprintf(stderr, "zps-server: --momentum and --nesterov are SGD's; --optimizer %s takes "
                        "--betas and --eps\n", o->optimizer);
        return false;
    }
    if (!sgd && !given[G_LR]) {
        o->optim.lr = 1e-3f;
    }
    if (o->optim.kind == ZPS_OPTIM_ADAMW && !given[G_WD]) {
        o->optim.weight_decay = 1e-2f;
    }
    return true;
}

static bool s_parse_opts(int argc, char **argv, s_opts *o)
{
    enum { O_LISTEN = 256, O_WORKERS, O_MODEL, O_DATASET, O_BATCH, O_EPOCHS, O_STEPS, O_OPTIM,
           O_LR, O_MOMENTUM, O_NESTEROV, O_WD, O_SCHED, O_WARMUP, O_SEED, O_METRICS, O_LOG,
           O_ENDPOINT_FILE, O_SHARD, O_SHARDS, O_COORD, O_DTYPE, O_WTIMEOUT, O_CKPT_EVERY, O_CKPT_DIR, O_RESUME, O_CURVE_SECRET, O_AUTH_KEYS,
           O_SERVER_KEY, O_REQUIRE_CURVE, O_SHARD_KEYS, O_OPERATOR_KEYS, O_STALL_WARN, O_SNDBUF,
           O_ADAPTIVE, O_SPECULATE, O_HTTP, O_ADVERTISE, O_LOG_JSON, O_PID_FILE, O_BETAS, O_EPS,
           O_HELP };
    static const struct option longopts[] = {
        {"listen", required_argument, 0, O_LISTEN},
        {"workers", required_argument, 0, O_WORKERS},
        {"model", required_argument, 0, O_MODEL},
        {"dataset", required_argument, 0, O_DATASET},
        {"global-batch", required_argument, 0, O_BATCH},
        {"epochs", required_argument, 0, O_EPOCHS},
        {"steps", required_argument, 0, O_STEPS},
        {"optimizer", required_argument, 0, O_OPTIM},
        {"lr", required_argument, 0, O_LR},
        {"momentum", required_argument, 0, O_MOMENTUM},
        {"nesterov", no_argument, 0, O_NESTEROV},
        {"weight-decay", required_argument, 0, O_WD},
        {"betas", required_argument, 0, O_BETAS},
        {"eps", required_argument, 0, O_EPS},
        {"lr-schedule", required_argument, 0, O_SCHED},
        {"warmup-steps", required_argument, 0, O_WARMUP},
        {"seed", required_argument, 0, O_SEED},
        {"metrics-log", required_argument, 0, O_METRICS},
        {"log-level", required_argument, 0, O_LOG},
        {"endpoint-file", required_argument, 0, O_ENDPOINT_FILE},
        {"shard", required_argument, 0, O_SHARD},
        {"shards", required_argument, 0, O_SHARDS},
        {"coordinator", required_argument, 0, O_COORD},
        {"wire-dtype", required_argument, 0, O_DTYPE},
        {"worker-timeout-ms", required_argument, 0, O_WTIMEOUT},
        {"checkpoint-every", required_argument, 0, O_CKPT_EVERY},
        {"checkpoint-dir", required_argument, 0, O_CKPT_DIR},
        {"resume", no_argument, 0, O_RESUME},
        {"curve-secret", required_argument, 0, O_CURVE_SECRET},
        {"authorized-keys", required_argument, 0, O_AUTH_KEYS},
        {"shard-keys", required_argument, 0, O_SHARD_KEYS},
        {"operator-keys", required_argument, 0, O_OPERATOR_KEYS},
        {"server-key", required_argument, 0, O_SERVER_KEY},
        {"require-curve", no_argument, 0, O_REQUIRE_CURVE},
        {"stall-warn-ms", required_argument, 0, O_STALL_WARN},
        {"sndbuf", required_argument, 0, O_SNDBUF},
        {"adaptive-split", no_argument, 0, O_ADAPTIVE},
        {"speculate-after", required_argument, 0, O_SPECULATE},
        {"http", required_argument, 0, O_HTTP},
        {"advertise", required_argument, 0, O_ADVERTISE},
        {"log-json", no_argument, 0, O_LOG_JSON},
        {"pid-file", required_argument, 0, O_PID_FILE},
        {"help", no_argument, 0, O_HELP},
        {0, 0, 0, 0},
    };
    char **args;
    if (zps_flags_from_env("zps-server", longopts, environ, argc, argv, &argc, &args) != ZPS_OK) {
        return false;
    }
    argv = args;
    *o = (s_opts){
        .listen = "tcp://127.0.0.1:5555",
        .workers = 1,
        .model = "mlp:784-512-512-10",
        .dataset = "fashion-mnist",
        .global_batch = 128,
        .epochs = 10,
        .optimizer = "sgd",
        .optim = {.lr = 0.05f, .momentum = 0.9f, .schedule = ZPS_LR_COSINE,
                  .beta1 = ZPS_OPTIM_BETA1, .beta2 = ZPS_OPTIM_BETA2, .eps = ZPS_OPTIM_EPS},
        .shards = 1,
        .wire_dtype = ZPS_DTYPE_F32,
        .worker_timeout_ms = 10000,
        .stall_warn_ms = 5000,
    };
    uint64_t v = 0;
    bool optim_given[G_OPTIM_FLAGS] = {false};
    int c;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        bool ok = true;
        switch (c) {
        case O_LISTEN: o->listen = optarg; break;
        case O_WORKERS:
            ok = s_parse_u64("--workers", optarg, &v) && v >= 1 && v <= ZPS_MAX_MEMBERS;
            o->workers = (uint32_t)v;
            if (!ok) {
                fprintf(stderr, "zps-server: --workers must be 1..%d\n", ZPS_MAX_MEMBERS);
            }
            break;
        case O_MODEL: o->model = optarg; break;
        case O_DATASET: o->dataset = optarg; break;
        case O_BATCH:
            ok = s_parse_u64("--global-batch", optarg, &v) && v >= 1 && v <= (1u << 24);
            o->global_batch = (uint32_t)v;
            break;
        case O_EPOCHS: ok = s_parse_u64("--epochs", optarg, &o->epochs); break;
        case O_STEPS: ok = s_parse_u64("--steps", optarg, &o->steps); break;
        case O_OPTIM:
            o->optimizer = optarg;
            ok = zps_optim_parse_kind(optarg, &o->optim.kind) == ZPS_OK;
            break;
        case O_LR:
            ok = s_parse_float("--lr", optarg, &o->optim.lr);
            optim_given[G_LR] = true;
            break;
        case O_MOMENTUM:
            ok = s_parse_float("--momentum", optarg, &o->optim.momentum);
            optim_given[G_MOMENTUM] = true;
            break;
        case O_NESTEROV:
            o->optim.nesterov = true;
            optim_given[G_NESTEROV] = true;
            break;
        case O_WD:
            ok = s_parse_float("--weight-decay", optarg, &o->optim.weight_decay);
            optim_given[G_WD] = true;
            break;
        case O_BETAS:
            ok = s_parse_betas(optarg, &o->optim);
            optim_given[G_BETAS] = true;
            break;
        case O_EPS: {
            double eps = 0;
            ok = zps_flags_real("zps-server", "--eps", optarg, -FLT_MAX, FLT_MAX, &eps);
            if (ok && !((float)eps > 0)) {
                fprintf(stderr, "zps-server: --eps: '%s' is not a positive float32 number\n",
                        optarg);
                ok = false;
            }
            o->optim.eps = eps;
            optim_given[G_EPS] = true;
            break;
        }
        case O_SCHED: ok = zps_optim_parse_schedule(optarg, &o->optim.schedule) == ZPS_OK; break;
        case O_WARMUP: ok = s_parse_u64("--warmup-steps", optarg, &o->optim.warmup_steps); break;
        case O_SEED: ok = s_parse_u64("--seed", optarg, &o->seed); break;
        case O_METRICS: o->metrics_log = optarg; break;
        case O_ENDPOINT_FILE: o->endpoint_file = optarg; break;
        case O_SHARD:
            ok = s_parse_u64("--shard", optarg, &v) && v < ZPS_MAX_SHARDS;
            o->shard = (uint32_t)v;
            break;
        case O_SHARDS:
            ok = s_parse_u64("--shards", optarg, &v) && v >= 1 && v <= ZPS_MAX_SHARDS;
            o->shards = (uint32_t)v;
            break;
        case O_COORD: o->coordinator = optarg; break;
        case O_DTYPE: ok = zps_dtype_parse(optarg, &o->wire_dtype) == ZPS_OK; break;
        case O_CKPT_EVERY: ok = s_parse_u64("--checkpoint-every", optarg, &o->checkpoint_every); break;
        case O_CKPT_DIR: o->checkpoint_dir = optarg; break;
        case O_RESUME: o->resume = true; break;
        case O_CURVE_SECRET: o->curve_secret = optarg; break;
        case O_AUTH_KEYS: o->authorized_keys = optarg; break;
        case O_SHARD_KEYS: o->shard_keys = optarg; break;
        case O_OPERATOR_KEYS: o->operator_keys = optarg; break;
        case O_SERVER_KEY: o->server_key = optarg; break;
        case O_REQUIRE_CURVE: o->require_curve = true; break;
        case O_ADAPTIVE: o->adaptive_split = true; break;
        case O_HTTP: o->http = optarg; break;
        case O_ADVERTISE: o->advertise = optarg; break;
        case O_LOG_JSON: zps_log_set_json(true); break;
        case O_PID_FILE: o->pid_file = optarg; break;
        case O_SPECULATE: {
            float f = 0;
            ok = s_parse_float("--speculate-after", optarg, &f) && f >= 0;
            o->speculate_after = f;
            break;
        }
        case O_STALL_WARN:
            ok = s_parse_u64("--stall-warn-ms", optarg, &v) && v >= 10;
            o->stall_warn_ms = (double)v;
            break;
        case O_SNDBUF:
            ok = s_parse_u64("--sndbuf", optarg, &v);
            if (ok && v != 0 && (v < 4096 || v > 1u << 30)) {
                fprintf(stderr, "zps-server: --sndbuf: '%s' is not 0 or 4096..%u bytes\n", optarg,
                        1u << 30);
                ok = false;
            }
            o->sndbuf = (int)v;
            break;
        case O_WTIMEOUT:
            ok = s_parse_u64("--worker-timeout-ms", optarg, &v) && v >= 100;
            o->worker_timeout_ms = (double)v;
            break;
        case O_LOG: {
            zps_log_level lvl;
            ok = zps_log_parse_level(optarg, &lvl);
            if (ok) {
                zps_log_set_level(lvl);
            } else {
                fprintf(stderr, "zps-server: --log-level: debug, info, warn or error\n");
            }
            break;
        }
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
    if (extra) {
        fprintf(stderr, "zps-server: unexpected argument '%s'\n", argv[optind]);
    }
    free(args);
    if (extra) {
        return false;
    }
    if (!s_check_optim_flags(o, optim_given)) {
        return false;
    }
    if (o->global_batch == 0) {
        fprintf(stderr, "zps-server: --global-batch must be 1..%u\n", 1u << 24);
        return false;
    }
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

int main(int argc, char **argv)
{
    s_opts o;
    if (!s_parse_opts(argc, argv, &o)) {
        return 2;
    }
    return zps_server_run(&o);
}
