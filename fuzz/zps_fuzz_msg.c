/* zps_fuzz_msg.c - libFuzzer target over the daemon itself: a real zps
 * server (server/zps_server.h: zps_server_open, and zps_server_turn, which
 * reads with the loop's own s_read_one and dispatches through the message
 * table and the handlers) on inproc sockets of its own context, fed by
 * peers this target plays: two workers, shard 1 (or, when the server under
 * test is shard 1, its coordinator) and a stranger. The input format and
 * the job are in zps_fuzz.h.
 *
 * Besides the sanitizers' verdict, the target aborts when a promise of the
 * daemon breaks:
 *   - nothing any peer sends asks the loop to stop, and a coordinator never
 *     gives up its loop;
 *   - nothing the stranger sends (a HELLO that gets it admitted aside)
 *     changes the parameters, the step or the coordinator's status
 *     document (test accuracy, members, shards' state, evictions, plan
 *     generation): only its refusal count;
 *   - the stranger is never answered with a job, a range, parameters, a
 *     plan or a rollback unless it was admitted as a worker;
 *   - every ERROR carries a known code and a reason.
 *
 * Not covered: the worker's handling of replies (worker/main.c keeps it in
 * static functions beside main, which this target cannot link).
 *
 * Built with clang -fsanitize=fuzzer for make fuzz; zps_fuzz_replay.c runs
 * the same function over saved inputs in make test, with any compiler. */
#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_log.h"
#include "common/zps_model.h"
#include "common/zps_plan.h"
#include "common/zps_wire.h"
#include "fuzz/zps_fuzz.h"
#include "server/coord/zps_coord.h"
#include "server/shard/zps_shard.h"
#include "server/zps_msgtab.h"
#include "server/zps_server.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

// A broken promise is a finding: report it and abort, so that libFuzzer
// saves the input and the replay runner fails.
#define FUZZ_CHECK(cond, ...) s_check((cond), __LINE__, __VA_ARGS__)

__attribute__((format(printf, 3, 4))) static void s_check(bool ok, int line, const char *fmt,
                                                          ...)
{
    if (ok) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "zps_fuzz: %s:%d: promise broken: ", __FILE__, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

typedef struct s_reader {
    const uint8_t *p; // the input
    size_t len, pos;  // its length and the read position
} s_reader;

static size_t s_left(const s_reader *r)
{
    return r->len - r->pos;
}

static uint32_t s_u8(s_reader *r)
{
    return s_left(r) >= 1 ? r->p[r->pos++] : 0;
}

static uint32_t s_u16(s_reader *r)
{
    uint32_t lo = s_u8(r);
    return lo | s_u8(r) << 8;
}

#define S_PEERS 4

// One input's world: the server and its peers.
typedef struct s_world {
    zps_server_opts opts;
    char listen[64], coordinator[64];
    zps_server *srv;
    void *peer[S_PEERS];         // DEALERs to the server (the shard peer's is a ROUTER in SHARD1)
    zmq_msg_t coord_route;       // SHARD1: the server's routing id on the coordinator peer
    bool has_coord_route;
    zps_fuzz_stage stage;
    uint64_t job_id;             // what the placeholders stand for
    uint64_t member[2];
    uint64_t token;
    bool stranger_admitted;      // the stranger's HELLO got it a JOB: it is a member now
    bool gone;                   // a shard > 0 ended (its coordinator made it): stop feeding
} s_world;

static void s_send_raw(void *sock, zmq_msg_t *route, const void *hdr, size_t hlen,
                       zmq_msg_t *frames, int n)
{
    if (route) {
        zmq_msg_t r;
        zps_wire_route_copy(&r, route);
        FUZZ_CHECK(zmq_msg_send(&r, sock, ZMQ_SNDMORE) >= 0, "send route: %s",
                   zmq_strerror(zmq_errno()));
    }
    FUZZ_CHECK(zmq_send(sock, hdr, hlen, n > 0 ? ZMQ_SNDMORE : 0) >= 0, "send: %s",
               zmq_strerror(zmq_errno()));
    for (int i = 0; i < n; i++) {
        FUZZ_CHECK(zmq_msg_send(&frames[i], sock, i + 1 < n ? ZMQ_SNDMORE : 0) >= 0, "send: %s",
                   zmq_strerror(zmq_errno()));
    }
}

static void s_send(void *sock, zmq_msg_t *route, const Zps__Header *h)
{
    FUZZ_CHECK(zps_wire_send(sock, route, h, NULL, 0, NULL) == ZPS_OK, "a peer could not send");
}

// A reply as the peer sees it: every ERROR is explained; what the stranger
// gets is only what anyone may get. Learns what the placeholders stand for.
static void s_on_reply(s_world *w, int peer, const Zps__Header *h)
{
    if (h->type == ZPS__MSG_TYPE__ERROR) {
        FUZZ_CHECK(h->error_code > 0 && h->error_code < ZPS_ECOUNT_ && h->error && h->error[0],
                   "an ERROR with code %d and no reason", h->error_code);
        return;
    }
    if (h->type == ZPS__MSG_TYPE__JOB && h->job) {
        if (peer < 2) {
            w->member[peer] = h->job->member_id;
            w->job_id = h->job_id;
        } else if (peer == ZPS_FUZZ_STRANGER) {
            w->stranger_admitted = true; // anyone may join a job without CURVE
        }
    }
    if (h->type == ZPS__MSG_TYPE__ASSIGN && h->job && peer == ZPS_FUZZ_SHARD) {
        w->token = h->job->shard_token;
        w->job_id = h->job_id;
    }
    if (peer == ZPS_FUZZ_STRANGER && !w->stranger_admitted) {
        FUZZ_CHECK(h->type == ZPS__MSG_TYPE__STATUS_REPLY, "the stranger was answered %s",
                   zps_wire_type_name((int)h->type));
    }
}

// Lets the server read everything sent, then every peer read its answers.
static void s_turn(s_world *w)
{
    if (zps_server_turn(w->srv) < 0) {
        w->gone = true;
        FUZZ_CHECK(w->stage == ZPS_FUZZ_SHARD1, "the coordinator left its loop");
    }
    FUZZ_CHECK(!zps_server_stopping(w->srv), "a message asked the server to stop");
    for (int p = 0; p < S_PEERS; p++) {
        zmq_pollitem_t it = {.socket = w->peer[p], .events = ZMQ_POLLIN};
        bool router = w->stage == ZPS_FUZZ_SHARD1 && p == ZPS_FUZZ_SHARD;
        while (zmq_poll(&it, 1, 0) > 0) {
            zps_wire_msg m;
            zps_err err = zps_wire_recv(w->peer[p], router, &m);
            FUZZ_CHECK(err == ZPS_OK, "the server sent what its peer cannot read: %s",
                       zps_strerror(err));
            if (router && !w->has_coord_route) {
                zps_wire_route_copy(&w->coord_route, &m.route);
                w->has_coord_route = true;
            }
            s_on_reply(w, p, m.hdr);
            zps_wire_msg_fini(&m);
        }
    }
}

// What the stranger must not change: the parameters as served, the step,
// and the coordinator's status document without its refusal count and
// without this start's clock (its seconds and ms per step, which move
// with time alone).
typedef struct s_snapshot {
    uint8_t params[ZPS_MODEL_MAX_BUCKETS * 64];
    size_t n;
    uint64_t step;
    char status[8192];
} s_snapshot;

static void s_status_without_clock(const char *status, char *out, size_t len)
{
    json_t *doc = json_loads(status, 0, NULL);
    json_t *start = doc ? json_object_get(doc, "start") : NULL;
    if (json_is_object(start)) {
        json_object_del(start, "seconds");
        json_object_del(start, "ms_per_step");
    }
    char *text = doc ? json_dumps(doc, JSON_SORT_KEYS) : NULL;
    snprintf(out, len, "%s", text ? text : status);
    free(text);
    json_decref(doc);
}

static void s_snap(s_world *w, s_snapshot *s)
{
    memset(s, 0, sizeof *s);
    zps_shard *sh = zps_server_shard(w->srv);
    zps_coord *c = zps_server_coord(w->srv);
    for (int b = 0; sh && b < zps_shard_n_buckets(sh); b++) {
        const void *data;
        uint64_t offset, count;
        zps_wire_ref *ref;
        zps_shard_bucket_params(sh, b, &data, &offset, &count, &ref);
        size_t bytes = count * zps_dtype_size(w->opts.wire_dtype);
        FUZZ_CHECK(s->n + bytes <= sizeof s->params, "a bucket past the snapshot");
        memcpy(s->params + s->n, data, bytes);
        s->n += bytes;
    }
    s->step = sh ? zps_shard_step(sh) : 0;
    char *metrics = NULL, *status = NULL;
    if (c && zps_coord_render(c, s->step, 0, &metrics, &status) == ZPS_OK) {
        s_status_without_clock(status, s->status, sizeof s->status);
    }
    free(metrics);
    free(status);
}

static bool s_same(const s_snapshot *a, const s_snapshot *b)
{
    return a->n == b->n && memcmp(a->params, b->params, a->n) == 0 && a->step == b->step &&
           strcmp(a->status, b->status) == 0;
}

// Replaces the placeholders by what the sending peer holds. The job id is
// no secret (STATUS shows it): the stranger knows it too, and nothing else.
static void s_substitute(const s_world *w, int peer, Zps__Header *h)
{
    if (h->job_id == ZPS_FUZZ_JOB) {
        h->job_id = w->job_id;
    }
    if (peer == ZPS_FUZZ_STRANGER) {
        return;
    }
    if (peer < 2 && h->member_id == ZPS_FUZZ_MEMBER0) {
        h->member_id = w->member[0];
    } else if (peer < 2 && h->member_id == ZPS_FUZZ_MEMBER1) {
        h->member_id = w->member[1];
    }
    if (h->shard_token == ZPS_FUZZ_TOKEN) {
        h->shard_token = w->token;
    }
    // The coordinator peer's plans name the members by their real ids.
    Zps__Slice **lists[2] = {h->plan ? h->plan->slices : NULL, h->job ? h->job->plan : NULL};
    const size_t ns[2] = {h->plan ? h->plan->n_slices : 0, h->job ? h->job->n_plan : 0};
    for (int l = 0; l < 2; l++) {
        for (size_t i = 0; i < ns[l]; i++) {
            uint64_t *id = &lists[l][i]->member_id;
            *id = *id == ZPS_FUZZ_MEMBER0 ? w->member[0]
                  : *id == ZPS_FUZZ_MEMBER1 ? w->member[1] : *id;
        }
    }
    if (h->job && h->job->shard_token == ZPS_FUZZ_TOKEN) {
        h->job->shard_token = w->token;
    }
}

// Reads one message of the input and has its peer send it; the server
// then reads it. Frames past ZPS_WIRE_MAX_FRAMES + 8 are read and dropped
// here: the server refuses what is past its own limit already.
static void s_feed_one(s_world *w, s_reader *r)
{
    int peer = (int)(s_u8(r) & 3u);
    size_t hlen = s_u16(r);
    hlen = hlen < s_left(r) ? hlen : s_left(r);
    const uint8_t *hsrc = r->p + r->pos;
    r->pos += hlen;
    uint32_t n_frames = s_u8(r);
    zmq_msg_t frames[ZPS_WIRE_MAX_FRAMES + 8];
    int n = 0;
    for (uint32_t i = 0; i < n_frames; i++) {
        size_t len = s_u16(r) & ZPS_FUZZ_FRAME_LEN;
        len = len < s_left(r) ? len : s_left(r);
        if (n < (int)(sizeof frames / sizeof frames[0])) {
            FUZZ_CHECK(zmq_msg_init_size(&frames[n], len) == 0, "zmq_msg_init_size");
            memcpy(zmq_msg_data(&frames[n]), r->p + r->pos, len);
            n++;
        }
        r->pos += len;
    }
    // A header that decodes carries the peer's real credentials in place
    // of the placeholders; one that does not goes as it is.
    uint8_t packed[16384];
    const void *hdr = hsrc;
    size_t out_len = hlen;
    Zps__Header *h = zps__header__unpack(NULL, hlen, hsrc);
    if (h) {
        s_substitute(w, peer, h);
        size_t need = zps__header__get_packed_size(h);
        if (need <= sizeof packed) {
            out_len = zps__header__pack(h, packed);
            hdr = packed;
        }
    }
    // Before the job starts anyone may register as a shard, and then gets
    // its range: from there on the stranger is that shard, not a stranger.
    zps_coord *c = zps_server_coord(w->srv);
    if (peer == ZPS_FUZZ_STRANGER && h && h->type == ZPS__MSG_TYPE__REGISTER && c &&
        zps_coord_at(c) == ZPS_AT_WAITING) {
        w->stranger_admitted = true;
    }
    bool watched = peer == ZPS_FUZZ_STRANGER && !w->stranger_admitted &&
                   !(h && h->type == ZPS__MSG_TYPE__HELLO);
    if (h) {
        zps__header__free_unpacked(h, NULL);
    }
    s_snapshot before, after;
    if (watched) {
        s_snap(w, &before);
    }
    bool to_up = w->stage == ZPS_FUZZ_SHARD1 && peer == ZPS_FUZZ_SHARD;
    if (to_up && !w->has_coord_route) {
        for (int i = 0; i < n; i++) {
            zmq_msg_close(&frames[i]);
        }
        return; // the coordinator peer has not heard from the shard yet
    }
    s_send_raw(w->peer[peer], to_up ? &w->coord_route : NULL, hdr, out_len, frames, n);
    s_turn(w);
    if (watched) {
        s_snap(w, &after);
        FUZZ_CHECK(s_same(&before, &after), "a message from the stranger changed the job");
    }
}

// ---------------------------------------------------------------------------
// Setting the stage.

static void s_hello(s_world *w, int peer)
{
    Zps__Hello hello = ZPS__HELLO__INIT;
    hello.host = "fuzz";
    hello.device = "cpu";
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__HELLO);
    h.hello = &hello;
    s_send(w->peer[peer], NULL, &h);
}

static void s_register(s_world *w)
{
    Zps__Register reg = ZPS__REGISTER__INIT;
    reg.index = 1;
    reg.shards = 2;
    reg.endpoint = "inproc://zps-fuzz-shard1";
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__REGISTER);
    h.shard = 1;
    h.registration = &reg;
    s_send(w->peer[ZPS_FUZZ_SHARD], NULL, &h);
}

static void s_ready(s_world *w)
{
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__READY);
    h.job_id = w->job_id;
    h.shard = 1;
    h.shard_token = w->token;
    s_send(w->peer[ZPS_FUZZ_SHARD], NULL, &h);
}

// SHARD1: the ids this target gives out as the coordinator: not the
// placeholders, or the stranger would hold them.
#define S_REAL(placeholder) ((placeholder) ^ 0x5a5a5a5a00000000ull)

// SHARD1: the coordinator peer assigns the shard its range, the job of
// zps_fuzz.h.
static void s_assign(s_world *w, const zps_model_spec *model)
{
    zps_plan plan = {0};
    static const uint32_t shares[2] = {0, 0};
    char why[128];
    FUZZ_CHECK(zps_plan_split(w->opts.global_batch, shares, 2, &plan, why, sizeof why) == ZPS_OK,
               "%s", why);
    Zps__Slice slices[2], *sp[2];
    for (int i = 0; i < 2; i++) {
        zps__slice__init(&slices[i]);
        slices[i].rank = plan.slices[i].rank;
        slices[i].offset = plan.slices[i].offset;
        slices[i].count = plan.slices[i].count;
        slices[i].member_id = S_REAL(i ? ZPS_FUZZ_MEMBER1 : ZPS_FUZZ_MEMBER0);
        sp[i] = &slices[i];
    }
    zps_plan_fini(&plan);
    Zps__ShardInfo shards[2], *shp[2];
    for (uint32_t i = 0; i < 2; i++) {
        zps__shard_info__init(&shards[i]);
        shards[i].index = i;
        shards[i].endpoint = "inproc://x";
        zps_model_shard_range(model->n_params, i, 2, &shards[i].lo, &shards[i].hi);
        shp[i] = &shards[i];
    }
    Zps__Optim optim = ZPS__OPTIM__INIT;
    optim.lr = 0.1f;
    optim.momentum = 0.9f;
    Zps__Job job = ZPS__JOB__INIT;
    job.model = ZPS_FUZZ_MODEL;
    job.dataset = ZPS_FUZZ_DATASET;
    job.seed = ZPS_FUZZ_SEED;
    job.global_batch = w->opts.global_batch;
    job.total_steps = ZPS_FUZZ_STEPS;
    job.steps_per_epoch = 4;
    job.n_plan = 2;
    job.plan = sp;
    job.n_shards = 2;
    job.shards = shp;
    job.wire_dtype = (Zps__DType)w->opts.wire_dtype;
    job.wire_code = w->opts.wire_code ? 1 : 0;
    job.optim = &optim;
    job.generation = 1;
    job.shard_token = S_REAL(ZPS_FUZZ_TOKEN);
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__ASSIGN);
    h.job_id = S_REAL(ZPS_FUZZ_JOB);
    h.job = &job;
    s_send(w->peer[ZPS_FUZZ_SHARD], &w->coord_route, &h);
    w->job_id = S_REAL(ZPS_FUZZ_JOB);
    w->member[0] = S_REAL(ZPS_FUZZ_MEMBER0);
    w->member[1] = S_REAL(ZPS_FUZZ_MEMBER1);
    w->token = S_REAL(ZPS_FUZZ_TOKEN);
}

static bool s_open(s_world *w, uint8_t config, const zps_model_spec *model)
{
    static unsigned serial; // inproc names must not be reused while a closed one lingers
    serial++;
    memset(w, 0, sizeof *w);
    w->stage = zps_fuzz_stage_of(config);
    snprintf(w->listen, sizeof w->listen, "inproc://zps-fuzz-%u", serial);
    snprintf(w->coordinator, sizeof w->coordinator, "inproc://zps-fuzz-coord-%u", serial);
    bool shard1 = w->stage == ZPS_FUZZ_SHARD1;
    w->opts = (zps_server_opts){
        .shard = shard1 ? 1 : 0, .shards = 2, .listen = w->listen,
        .coordinator = shard1 ? w->coordinator : NULL, .workers = 2, .model = ZPS_FUZZ_MODEL,
        .dataset = ZPS_FUZZ_DATASET, .global_batch = zps_fuzz_global_batch(config),
        .steps = ZPS_FUZZ_STEPS, .optimizer = "sgd",
        .optim = {.lr = 0.1f, .momentum = 0.9f, .schedule = ZPS_LR_CONSTANT},
        .seed = ZPS_FUZZ_SEED, .wire_dtype = zps_fuzz_dtype(config),
        .wire_code = zps_fuzz_coded(config),
        .threads = 1, // not auto: a pool of threads an input costs more than the input
        // No clock in the verdicts: nobody is evicted, nothing is late.
        .worker_timeout_ms = 1e12, .stall_warn_ms = 1e12,
    };
    int status;
    if (!(w->srv = zps_server_open(&w->opts, &status))) {
        return false;
    }
    void *ctx = zps_server_ctx(w->srv);
    for (int p = 0; p < S_PEERS; p++) {
        bool coord = shard1 && p == ZPS_FUZZ_SHARD;
        w->peer[p] = zps_wire_socket(ctx, coord ? ZMQ_ROUTER : ZMQ_DEALER, 1000);
        FUZZ_CHECK(w->peer[p] != NULL, "peer socket");
        int rc = coord ? zmq_bind(w->peer[p], w->coordinator) : zmq_connect(w->peer[p], w->listen);
        FUZZ_CHECK(rc == 0, "peer %d: %s", p, zmq_strerror(zmq_errno()));
    }
    if (shard1) {
        s_turn(w); // the shard's REGISTER reaches its coordinator
        FUZZ_CHECK(w->has_coord_route, "no REGISTER from shard 1");
        s_assign(w, model);
        s_turn(w);
        return true;
    }
    if (w->stage >= ZPS_FUZZ_REGISTERED) {
        s_register(w);
        s_turn(w);
    }
    if (w->stage == ZPS_FUZZ_TRAINING) {
        s_hello(w, ZPS_FUZZ_WORKER0);
        s_turn(w);
        s_hello(w, ZPS_FUZZ_WORKER1);
        s_turn(w);
        FUZZ_CHECK(w->token != 0, "shard 1 got no ASSIGN");
        s_ready(w);
        s_turn(w);
        FUZZ_CHECK(w->member[0] && w->member[1], "the workers got no JOB");
    }
    return true;
}

static void s_close(s_world *w)
{
    int zero = 0;
    for (int p = 0; p < S_PEERS; p++) {
        if (w->peer[p]) {
            (void)zmq_setsockopt(w->peer[p], ZMQ_LINGER, &zero, sizeof zero);
            zps_wire_close(&w->peer[p]);
        }
    }
    if (w->has_coord_route) {
        zps_wire_route_close(&w->coord_route);
    }
    zps_server_close(&w->srv);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool quiet;
    if (!quiet) {
        zps_log_set_level((zps_log_level)(ZPS_LOG_ERROR + 1)); // refusals are the normal case here
        quiet = true;
    }
    if (size < 1) {
        return 0;
    }
    zps_model_spec model;
    if (zps_model_parse(ZPS_FUZZ_MODEL, &model) != ZPS_OK) {
        return 0;
    }
    s_world w;
    if (!s_open(&w, data[0], &model)) {
        s_close(&w);
        return 0;
    }
    s_reader r = {.p = data, .len = size, .pos = 1};
    while (s_left(&r) > 0 && !w.gone) {
        s_feed_one(&w, &r);
    }
    if (getenv("ZPS_FUZZ_DEBUG")) {
        fprintf(stderr, "stage %d: step %llu, refused %llu, gone %d\n", w.stage,
                (unsigned long long)zps_shard_step(zps_server_shard(w.srv)),
                (unsigned long long)zps_server_refused(w.srv), w.gone);
    }
    s_close(&w);
    return 0;
}
