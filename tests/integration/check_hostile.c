/* check_hostile.c - a peer that speaks zps's protocol, reads the job id
 * from STATUS like any operator, but was never admitted, lies to a
 * running 2-shard, 2-worker job the whole time it trains: forged EVAL,
 * BYE, HEARTBEAT, READY, STEP_DONE and REGISTER (one claiming shard 1 at
 * an endpoint of its own, where it listens), PUSH and PULL under guessed
 * ranks and member ids with NaN payloads to both shards, the types only
 * coordinators and shards send, and HELLOs that cannot be admitted.
 *
 * The run must end as an unattacked run does: parameters bitwise equal,
 * the same test accuracies in the metrics log, every process exiting 0;
 * the refusals counted; nothing ever connecting to the peer's endpoint,
 * which STATUS never shows for shard 1; and none of the answers the peer
 * gets giving it a job, a range or parameters. The hostile peer is written
 * here with zps's own wire code (common/zps_wire.h) and protobuf. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/zps_clock.h"
#include "common/zps_model.h"
#include "common/zps_rng.h"
#include "common/zps_wire.h"
#include "zps_integration.h"
#include "zps_mlog_read.h"
#include "zps_proc.h"

#define MODEL "mlp:784-256-10"
#define DATASET "synthetic:7680" // 60 steps of 128 per epoch, 1280 test records
#define N_TEST 1280u

static void s_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

// The job: shard 0 (the coordinator), shard 1, two workers.
typedef struct job {
    pid_t pids[4];          // shard 0, shard 1, worker 0, worker 1
    char ep0[256], ep1[256]; // the shards' endpoints
} job;

static void s_start_job(zps_procs *ps, job *j, const char *tag)
{
    char metrics[64], w[2][64], wlog[2][64], s1log[64];
    snprintf(metrics, sizeof metrics, "%s-metrics.jsonl", tag);
    const char *args0[] = {"--shards", "2", "--workers", "2", "--model", MODEL, "--dataset",
                           DATASET, "--global-batch", "128", "--epochs", "3", "--seed", "3",
                           "--lr", "0.1", "--metrics-log", zps_procs_path(ps, metrics), NULL};
    char tag0[64];
    snprintf(tag0, sizeof tag0, "%s-shard0", tag);
    snprintf(j->ep0, sizeof j->ep0, "%s",
             zps_procs_start_server(ps, tag0, &j->pids[0], args0, 10000));
    const char *args1[] = {"--shard", "1", "--shards", "2", "--coordinator", j->ep0, NULL};
    snprintf(s1log, sizeof s1log, "%s-shard1", tag);
    snprintf(j->ep1, sizeof j->ep1, "%s",
             zps_procs_start_server(ps, s1log, &j->pids[1], args1, 10000));
    for (int i = 0; i < 2; i++) {
        snprintf(w[i], sizeof w[i], "%s-w%d.bin", tag, i);
        snprintf(wlog[i], sizeof wlog[i], "%s-w%d.log", tag, i);
        const char *wargs[] = {"--coordinator", j->ep0, "--save-params", zps_procs_path(ps, w[i]),
                               "--cache-dir", ZPS_TEST_CACHE, "--heartbeat-ms", "200", NULL};
        j->pids[2 + i] = zps_procs_start(ps, "zps-worker", wlog[i], wargs);
    }
}

static void s_wait_job(zps_procs *ps, job *j)
{
    for (int i = 3; i >= 0; i--) {
        ck_assert_msg(zps_procs_wait(ps, j->pids[i], 120000) == 0,
                      "process %d of the job did not exit 0 (logs in %s)", i, ps->dir);
    }
}

// The test-set results of a metrics log, in order ("0:0.812500;...").
static void s_accuracies(zps_procs *ps, const char *tag, char *out, size_t len)
{
    char name[64];
    snprintf(name, sizeof name, "%s-metrics.jsonl", tag);
    json_t *log = zps_procs_mlog(ps, name);
    out[0] = '\0';
    size_t i;
    json_t *rec;
    json_array_foreach(log, i, rec)
    {
        if (json_is_number(json_object_get(rec, "test_accuracy"))) {
            size_t used = strlen(out);
            snprintf(out + used, len - used, "%.0f:%.17g;", zps_mlog_num(rec, "epoch"),
                     zps_mlog_num(rec, "test_accuracy"));
        }
    }
    json_decref(log);
}

// ---------------------------------------------------------------------------
// The hostile peer.

typedef struct hostile {
    void *ctx;
    void *to0, *to1;          // DEALERs to shard 0 and shard 1
    void *trap;               // ROUTER at the endpoint it claims for shard 1
    void *monitor;            // PAIR: the trap's accepted connections
    char trap_ep[256];
    zps_rng rng;              // guesses
    uint64_t job_id;          // read from STATUS
    uint64_t step;
    uint32_t generation;
    uint64_t lo0, hi0, lo1, hi1; // the shards' ranges, from STATUS
    char shard1_ep[256];      // shard 1's endpoint as STATUS shows it
    bool training;            // STATUS said so
    uint64_t refused;         // shard 0's count, last STATUS
    int sent;                 // lies told
    int answers;              // replies read
    int bad_answers;          // replies that gave it something (JOB, ASSIGN, PARAMS ...)
    float *nan;               // owned: a payload of NaNs
} hostile;

#define H_PAYLOAD 4096 // elements of a forged push

static void s_hostile_open(hostile *h, const job *j)
{
    memset(h, 0, sizeof *h);
    h->ctx = zmq_ctx_new();
    h->to0 = zps_wire_socket(h->ctx, ZMQ_DEALER, 1000);
    h->to1 = zps_wire_socket(h->ctx, ZMQ_DEALER, 1000);
    h->trap = zps_wire_socket(h->ctx, ZMQ_ROUTER, 1000);
    ck_assert_int_eq(zmq_connect(h->to0, j->ep0), 0);
    ck_assert_int_eq(zmq_connect(h->to1, j->ep1), 0);
    ck_assert_int_eq(zmq_bind(h->trap, "tcp://127.0.0.1:*"), 0);
    size_t len = sizeof h->trap_ep;
    ck_assert_int_eq(zmq_getsockopt(h->trap, ZMQ_LAST_ENDPOINT, h->trap_ep, &len), 0);
    // Any connection to the trap is a worker or a shard sent there.
    ck_assert_int_eq(zmq_socket_monitor(h->trap, "inproc://trap-monitor",
                                        ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_CONNECTED),
                     0);
    h->monitor = zmq_socket(h->ctx, ZMQ_PAIR);
    ck_assert_int_eq(zmq_connect(h->monitor, "inproc://trap-monitor"), 0);
    zps_rng_seed(&h->rng, 1234, 0);
    h->nan = malloc(H_PAYLOAD * sizeof(float));
    for (int i = 0; i < H_PAYLOAD; i++) {
        h->nan[i] = NAN;
    }
}

// Events on the trap so far (each accepted connection is one).
static int s_trap_events(hostile *h)
{
    int n = 0;
    zmq_pollitem_t it = {.socket = h->monitor, .events = ZMQ_POLLIN};
    while (zmq_poll(&it, 1, 0) > 0) {
        zmq_msg_t part;
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, h->monitor, 0) >= 0 && !zmq_msg_more(&part)) {
            n++; // the second part of an event (its endpoint) ends it
        }
        zmq_msg_close(&part);
    }
    return n;
}

static void s_hostile_close(hostile *h)
{
    int zero = 0;
    void *socks[4] = {h->to0, h->to1, h->trap, h->monitor};
    for (int i = 0; i < 4; i++) {
        zmq_setsockopt(socks[i], ZMQ_LINGER, &zero, sizeof zero);
        zmq_close(socks[i]);
    }
    zmq_ctx_term(h->ctx);
    free(h->nan);
}

static void s_lie(hostile *h, void *sock, Zps__Header *m, const void *payload, size_t bytes)
{
    ck_assert_int_eq(zps_wire_send(sock, NULL, m, payload, bytes, NULL), ZPS_OK);
    h->sent++;
}

// What a peer that read STATUS may put where a credential goes.
static uint64_t s_guess(hostile *h)
{
    switch (zps_rng_below(&h->rng, 4)) {
    case 0: return 0;
    case 1: return 1;
    case 2: return h->job_id; // the one number STATUS gives away
    default: return zps_rng_next(&h->rng);
    }
}

// Reads every answer waiting; none may give the peer anything.
static void s_drain(hostile *h, void *sock)
{
    zps_wire_msg m;
    zmq_pollitem_t it = {.socket = sock, .events = ZMQ_POLLIN};
    while (zmq_poll(&it, 1, 0) > 0 && zps_wire_recv(sock, false, &m) == ZPS_OK) {
        h->answers++;
        Zps__MsgType t = m.hdr->type;
        if (t == ZPS__MSG_TYPE__STATUS_REPLY && m.hdr->status) {
            const Zps__Status *st = m.hdr->status;
            h->job_id = m.hdr->job_id;
            h->step = st->step;
            h->generation = st->generation;
            h->training = strcmp(st->state, "training") == 0;
            h->refused = st->bad_messages;
            if (st->n_shards == 2) {
                h->lo0 = st->shards[0]->lo;
                h->hi0 = st->shards[0]->hi;
                h->lo1 = st->shards[1]->lo;
                h->hi1 = st->shards[1]->hi;
                snprintf(h->shard1_ep, sizeof h->shard1_ep, "%s", st->shards[1]->endpoint);
            }
        } else if (t != ZPS__MSG_TYPE__ERROR) {
            h->bad_answers++;
            fprintf(stderr, "hostile peer was answered %s\n", zps_wire_type_name((int)t));
        }
        zps_wire_msg_fini(&m);
    }
}

static void s_ask_status(hostile *h)
{
    Zps__Header m;
    zps_wire_header_init(&m, ZPS__MSG_TYPE__STATUS);
    ck_assert_int_eq(zps_wire_send(h->to0, NULL, &m, NULL, 0, NULL), ZPS_OK);
    s_sleep_ms(1);
    s_drain(h, h->to0);
}

// A header of `type` with the job's id, as a peer that read STATUS writes it.
static Zps__Header s_forged(hostile *h, Zps__MsgType type)
{
    Zps__Header m;
    zps_wire_header_init(&m, type);
    m.job_id = h->job_id;
    m.step = h->step;
    m.generation = h->generation;
    m.rank = (uint32_t)zps_rng_below(&h->rng, 2);
    m.member_id = s_guess(h);
    m.shard = 1;
    m.shard_token = s_guess(h);
    return m;
}

static void s_lie_as_worker(hostile *h)
{
    // A perfect score for every epoch.
    Zps__Eval ev = ZPS__EVAL__INIT;
    ev.epoch = zps_rng_below(&h->rng, 3);
    ev.count = ev.correct = N_TEST;
    ev.loss_sum = 0;
    Zps__Header m = s_forged(h, ZPS__MSG_TYPE__EVAL);
    m.eval = &ev;
    s_lie(h, h->to0, &m, NULL, 0);
    // Leave in someone's name (a re-plan without it), or take its route.
    m = s_forged(h, ZPS__MSG_TYPE__BYE);
    m.step = 1;
    s_lie(h, h->to0, &m, NULL, 0);
    m = s_forged(h, ZPS__MSG_TYPE__HEARTBEAT);
    m.flags = 1;
    s_lie(h, h->to0, &m, NULL, 0);
    // NaN gradients and pulls, to both shards, some of a plan not heard of
    // yet (held, and refused when checked again), some past every rank.
    for (int s = 0; s < 2; s++) {
        uint64_t lo = s ? h->lo1 : h->lo0, hi = s ? h->hi1 : h->hi0;
        uint64_t count = hi - lo < H_PAYLOAD ? hi - lo : H_PAYLOAD;
        m = s_forged(h, ZPS__MSG_TYPE__PUSH);
        m.shard = (uint32_t)s;
        m.offset = lo;
        m.count = count;
        m.dtype = ZPS__DTYPE__F32;
        m.samples = 64;
        m.batch_offset = (uint32_t)zps_rng_below(&h->rng, 2) * 64;
        uint64_t r = zps_rng_below(&h->rng, 8);
        m.rank = r == 7 ? 256 : (uint32_t)(r % 2);
        m.generation = r == 6 ? h->generation + 1 : h->generation;
        if (count > 0) {
            s_lie(h, s ? h->to1 : h->to0, &m, h->nan, count * sizeof(float));
        }
        m = s_forged(h, ZPS__MSG_TYPE__PULL);
        m.shard = (uint32_t)s;
        s_lie(h, s ? h->to1 : h->to0, &m, NULL, 0);
    }
}

static void s_lie_as_shard(hostile *h)
{
    // Shard 1 restarted, at the peer's endpoint; announcing it is there;
    // a shard past the job's; header and body naming different shards.
    Zps__Register reg = ZPS__REGISTER__INIT;
    reg.index = 1;
    reg.shards = 2;
    reg.endpoint = h->trap_ep;
    reg.resume = zps_rng_below(&h->rng, 2);
    reg.serving = zps_rng_below(&h->rng, 2);
    Zps__Header m = s_forged(h, ZPS__MSG_TYPE__REGISTER);
    m.job_id = 0;
    m.registration = &reg;
    s_lie(h, h->to0, &m, NULL, 0);
    reg.index = zps_rng_below(&h->rng, 2) ? 65 : 1;
    m.shard = zps_rng_below(&h->rng, 2) ? 2 : reg.index;
    s_lie(h, h->to0, &m, NULL, 0);
    // Back at a step in the future, or at step 0 (no checkpoint): either
    // was once a rollback that stopped the job.
    m = s_forged(h, ZPS__MSG_TYPE__READY);
    m.step = zps_rng_below(&h->rng, 2) ? 0 : h->step + 1000;
    s_lie(h, h->to0, &m, NULL, 0);
    m = s_forged(h, ZPS__MSG_TYPE__STEP_DONE);
    m.step = h->step + 1 + zps_rng_below(&h->rng, 100);
    s_lie(h, h->to0, &m, NULL, 0);
}

// What only a coordinator or a shard sends: to both shards.
static void s_lie_as_coordinator(hostile *h)
{
    static const Zps__MsgType types[] = {
        ZPS__MSG_TYPE__JOB,  ZPS__MSG_TYPE__PARAMS,   ZPS__MSG_TYPE__ASSIGN,
        ZPS__MSG_TYPE__PLAN, ZPS__MSG_TYPE__ROLLBACK, ZPS__MSG_TYPE__STATUS_REPLY,
        ZPS__MSG_TYPE__ERROR};
    Zps__Slice sl = ZPS__SLICE__INIT;
    sl.count = 128;
    sl.member_id = 99;
    Zps__Slice *slices[1] = {&sl};
    Zps__Plan plan = ZPS__PLAN__INIT;
    plan.generation = h->generation + 5;
    plan.n_slices = 1;
    plan.slices = slices;
    Zps__Job jb = ZPS__JOB__INIT;
    jb.model = MODEL;
    jb.global_batch = 128;
    jb.n_plan = 1;
    jb.plan = slices;
    Zps__Header m = s_forged(h, types[zps_rng_below(&h->rng, 7)]);
    m.plan = &plan;
    m.job = &jb;
    m.step = 0;
    m.offset = h->lo0;
    m.count = h->hi0 - h->lo0 < H_PAYLOAD ? h->hi0 - h->lo0 : H_PAYLOAD;
    m.dtype = ZPS__DTYPE__F32;
    s_lie(h, zps_rng_below(&h->rng, 2) ? h->to1 : h->to0, &m, h->nan, m.count * sizeof(float));
}

// HELLOs that cannot be admitted: no body, a share larger than the batch.
static void s_lie_hello(hostile *h)
{
    Zps__Hello hello = ZPS__HELLO__INIT;
    hello.host = "hostile";
    hello.share = 1u << 20;
    Zps__Header m;
    zps_wire_header_init(&m, ZPS__MSG_TYPE__HELLO);
    m.hello = zps_rng_below(&h->rng, 2) ? &hello : NULL;
    s_lie(h, h->to0, &m, NULL, 0);
}

// Lies until both workers are done; checks what it sees as it goes.
static void s_attack(hostile *h, zps_procs *ps, const job *j)
{
    double deadline = zps_clock_ms() + 120000;
    while (!h->training) { // the job id, once the job runs
        ck_assert_msg(zps_clock_ms() < deadline, "the job did not start within 120 s");
        s_ask_status(h);
        s_sleep_ms(5);
    }
    char shard1[256];
    snprintf(shard1, sizeof shard1, "%s", h->shard1_ep);
    ck_assert_str_eq(shard1, j->ep1);
    int rounds = 0;
    while (zps_proc_alive(j->pids[2]) || zps_proc_alive(j->pids[3])) {
        ck_assert_msg(zps_clock_ms() < deadline, "the attacked job did not end within 120 s");
        s_lie_as_worker(h);
        s_lie_as_shard(h);
        s_lie_as_coordinator(h);
        s_lie_hello(h);
        s_drain(h, h->to1);
        if (rounds++ % 4 == 0) {
            s_ask_status(h); // as an operator would: all of it public
            ck_assert_str_eq(h->shard1_ep, shard1);
        }
        s_drain(h, h->to0);
        s_sleep_ms(2);
    }
    (void)ps;
    fprintf(stderr, "hostile peer: %d rounds, %d lies, %d answers; shard 0 refused %llu\n",
            rounds, h->sent, h->answers, (unsigned long long)h->refused);
    ck_assert_int_gt(rounds, 20);
}

START_TEST(test_hostile_peer_lying_throughout_a_run_changes_nothing)
{
    zps_procs ps;
    zps_procs_init(&ps, "hostile");
    zps_model_spec spec;
    ck_assert_int_eq(zps_model_parse(MODEL, &spec), ZPS_OK);

    job attacked;
    s_start_job(&ps, &attacked, "attacked");
    hostile h;
    s_hostile_open(&h, &attacked);
    s_attack(&h, &ps, &attacked);
    s_wait_job(&ps, &attacked);
    ck_assert_int_eq(s_trap_events(&h), 0);
    zps_wire_msg m;
    ck_assert_int_eq(zps_wire_recv(h.trap, true, &m), ZPS_ETIMEDOUT); // nothing ever came
    zps_wire_msg_fini(&m);
    ck_assert_int_eq(h.bad_answers, 0);
    ck_assert_uint_gt(h.refused, 0);
    s_hostile_close(&h);

    job clean;
    s_start_job(&ps, &clean, "clean");
    s_wait_job(&ps, &clean);

    for (int w = 0; w < 2; w++) {
        char a[64], b[64];
        snprintf(a, sizeof a, "attacked-w%d.bin", w);
        snprintf(b, sizeof b, "clean-w%d.bin", w);
        float *x = zps_procs_load_params(&ps, a, spec.n_params);
        float *y = zps_procs_load_params(&ps, b, spec.n_params);
        ck_assert_msg(memcmp(x, y, spec.n_params * sizeof(float)) == 0,
                      "worker %d: the lies changed the trained parameters (max diff %g)", w,
                      zps_max_abs_diff(x, y, spec.n_params));
        free(x);
        free(y);
    }
    char acc_attacked[256], acc_clean[256];
    s_accuracies(&ps, "attacked", acc_attacked, sizeof acc_attacked);
    s_accuracies(&ps, "clean", acc_clean, sizeof acc_clean);
    fprintf(stderr, "test accuracies: attacked %s clean %s\n", acc_attacked, acc_clean);
    ck_assert_str_eq(acc_attacked, acc_clean);
    ck_assert_int_eq((int)strlen(acc_clean) > 0, 1);
    ck_assert_ptr_null(strstr(acc_attacked, "1.000000"));
    // Every refusal logs where it came from, a bounded number a second.
    ck_assert(zps_procs_log_has(&ps, "attacked-shard0.log", "from 127.0.0.1"));
    ck_assert(zps_procs_log_has(&ps, "attacked-shard0.log", "refused EVAL (rank"));
    ck_assert(zps_procs_log_has(&ps, "attacked-shard1.log", "refused PUSH (rank"));
    int lines = zps_procs_log_count(&ps, "attacked-shard0.log", "refused");
    fprintf(stderr, "shard 0: %d refusal lines for %llu refusals\n", lines,
            (unsigned long long)h.refused);
    ck_assert_int_lt(lines, (int)h.refused);
    ck_assert(!zps_procs_log_has(&ps, "attacked-shard0.log", "stopped"));
    zps_procs_fini(&ps, false);
}
END_TEST

Suite *zps_suite_hostile(void)
{
    Suite *s = suite_create("hostile");
    TCase *tc = tcase_create("lies");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_hostile_peer_lying_throughout_a_run_changes_nothing);
    suite_add_tcase(s, tc);
    return s;
}
