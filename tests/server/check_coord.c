/* check_coord.c - the coordinator as an object, without processes.
 *
 * The gathering of an epoch's evaluation:
 * each test record counts once, whoever sends it first (a late slice's
 * owner or the helpers that computed its pieces), and bad bodies are
 * refused without changing anything. The metrics log shows the result.
 * Then its credentials and the requests it refuses: shard tokens with
 * ASSIGN, a rollback to a step in the future or to a checkpoint shard 0
 * does not have, a STEP_DONE ahead of what can be (over inproc sockets:
 * the coordinator answers on a ROUTER). Members coming and going within a
 * step: joins take effect together at the next step boundary, a joiner
 * never owns work of the step in progress unless nobody else can compute
 * it, an evicted member's pieces go to members active at that step. */
#include <stdio.h>
#include <string.h>
#include <zmq.h>
#include <time.h>

#include "common/zps_clock.h"
#include "server/zps_coord.h"
#include "server/zps_msgtab.h"
#include "tests/zps_check.h"

#define N_TEST 100u

typedef struct fixture {
    FILE *metrics;
    zps_coord *c;
} fixture;

static void s_setup(fixture *f)
{
    f->metrics = tmpfile();
    ck_assert_ptr_nonnull(f->metrics);
    zps_coord_cfg cfg = {.model = "mlp:4-3-2", .dataset = "synthetic:40", .seed = 1,
                         .global_batch = 8, .total_steps = 20, .steps_per_epoch = 5,
                         .n_test = N_TEST, .workers = 3, .worker_timeout_ms = 1000,
                         .n_params = 23, .shards = 1, .endpoint = "tcp://127.0.0.1:1",
                         .metrics = f->metrics};
    f->c = zps_coord_new(&cfg);
    ck_assert_ptr_nonnull(f->c);
}

static void s_teardown(fixture *f)
{
    zps_coord_destroy(&f->c);
    ck_assert_ptr_null(f->c);
    fclose(f->metrics);
}

// One worker's EVAL: `correct` of test records [offset, offset + count).
static zps_err s_eval(fixture *f, uint64_t epoch, uint32_t offset, uint32_t count,
                      uint32_t correct)
{
    Zps__Eval ev = ZPS__EVAL__INIT;
    ev.epoch = epoch;
    ev.offset = offset;
    ev.count = count;
    ev.correct = correct;
    ev.loss_sum = 0.5 * count;
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__EVAL);
    h.eval = &ev;
    zps_wire_msg m = {.hdr = &h};
    return zps_coord_on_eval(f->c, &m);
}

// The evaluation records of the metrics log, joined, e.g. "0:0.700000;".
static void s_evals(fixture *f, char *out, size_t len)
{
    fflush(f->metrics);
    rewind(f->metrics);
    out[0] = '\0';
    char line[256];
    while (fgets(line, sizeof line, f->metrics)) {
        unsigned long long epoch;
        double acc;
        if (sscanf(line, "{\"epoch\":%llu,\"test_accuracy\":%lf", &epoch, &acc) == 2) {
            size_t used = strlen(out);
            snprintf(out + used, len - used, "%llu:%.6f;", epoch, acc);
        }
    }
}

START_TEST(test_coord_eval_counts_each_test_record_once_whoever_sends_it_first)
{
    fixture f;
    s_setup(&f);
    char evals[256];
    // Epoch 0: the owner of [50, 100) was away at the epoch's end; two
    // helpers computed its pieces and evaluate its records. Its own copy,
    // come late, overlaps a piece already counted: dropped whole.
    ck_assert_int_eq(s_eval(&f, 0, 0, 50, 40), ZPS_OK);
    ck_assert_int_eq(s_eval(&f, 0, 50, 25, 20), ZPS_OK);
    ck_assert_int_eq(s_eval(&f, 0, 50, 50, 50), ZPS_OK);
    s_evals(&f, evals, sizeof evals);
    ck_assert_str_eq(evals, ""); // [75, 100) still missing
    ck_assert_int_eq(s_eval(&f, 0, 75, 25, 10), ZPS_OK);
    s_evals(&f, evals, sizeof evals);
    ck_assert_str_eq(evals, "0:0.700000;");
    // The other helper's copy of an epoch already complete changes nothing.
    ck_assert_int_eq(s_eval(&f, 0, 75, 25, 25), ZPS_OK);
    // Epoch 1: the owner's copy came first; the pieces are the copies.
    ck_assert_int_eq(s_eval(&f, 1, 50, 50, 45), ZPS_OK);
    ck_assert_int_eq(s_eval(&f, 1, 50, 25, 0), ZPS_OK);
    ck_assert_int_eq(s_eval(&f, 1, 0, 50, 35), ZPS_OK);
    s_evals(&f, evals, sizeof evals);
    ck_assert_str_eq(evals, "0:0.700000;1:0.800000;");
    s_teardown(&f);
}
END_TEST

START_TEST(test_coord_eval_refuses_records_past_the_test_set_and_changes_nothing)
{
    fixture f;
    s_setup(&f);
    ck_assert_int_eq(s_eval(&f, 0, 90, 20, 5), ZPS_EPROTO);
    ck_assert_int_eq(s_eval(&f, 0, 0, N_TEST + 1, 5), ZPS_EPROTO);
    ck_assert_int_eq(s_eval(&f, 0, 0, 10, 11), ZPS_EPROTO); // more right than evaluated
    // Records 90..99 were not marked by the refused message: they count now.
    ck_assert_int_eq(s_eval(&f, 0, 0, 90, 60), ZPS_OK);
    ck_assert_int_eq(s_eval(&f, 0, 90, 10, 3), ZPS_OK);
    char evals[256];
    s_evals(&f, evals, sizeof evals);
    ck_assert_str_eq(evals, "0:0.630000;");
    s_teardown(&f);
}
END_TEST

// ---------------------------------------------------------------------------
// Credentials and refused requests: a 2-shard job with one worker.

typedef struct job {
    void *ctx, *router, *shard1, *worker; // the coordinator's socket, and its peers
    zps_coord *c;
    zps_err restore_result;               // what shard 0 answers to a rollback
    int restores;                         // rollbacks it was asked for
    uint64_t token;                       // shard 1's, from its ASSIGN
} job;

static zps_err s_restore(void *arg, uint64_t step)
{
    (void)step;
    job *j = arg;
    j->restores++;
    return j->restore_result;
}

// Sends h from peer and hands what the coordinator's socket received to
// its handler for h's type; returns the handler's verdict.
static zps_err s_deliver(job *j, void *peer, Zps__Header *h)
{
    ck_assert_int_eq(zps_wire_send(peer, NULL, h, NULL, 0, NULL), ZPS_OK);
    zps_wire_msg m;
    ck_assert_int_eq(zps_wire_recv(j->router, true, &m), ZPS_OK);
    zps_err err = ZPS_OK;
    switch (h->type) {
    case ZPS__MSG_TYPE__REGISTER: err = zps_coord_on_register(j->c, j->router, &m); break;
    case ZPS__MSG_TYPE__HELLO: err = zps_coord_on_hello(j->c, j->router, &m); break;
    case ZPS__MSG_TYPE__READY: err = zps_coord_on_ready(j->c, j->router, &m); break;
    case ZPS__MSG_TYPE__STEP_DONE: err = zps_coord_on_step_done(j->c, &m); break;
    default: ck_abort_msg("no handler for type %d here", h->type);
    }
    zps_wire_msg_fini(&m);
    return err;
}

// The next message a peer got, of the type expected; NULL if none came.
static Zps__Header *s_next(void *peer, zps_wire_msg *m)
{
    zps_err err = zps_wire_recv(peer, false, m);
    return err == ZPS_OK ? m->hdr : NULL;
}

static zps_err s_register(job *j, uint64_t token)
{
    Zps__Register reg = ZPS__REGISTER__INIT;
    reg.index = 1;
    reg.shards = 2;
    reg.endpoint = "tcp://127.0.0.1:2";
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__REGISTER);
    h.shard = 1;
    h.shard_token = token;
    h.registration = &reg;
    return s_deliver(j, j->shard1, &h);
}

static zps_err s_ready(job *j, uint64_t step)
{
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__READY);
    h.job_id = zps_coord_job_id(j->c);
    h.shard = 1;
    h.shard_token = j->token;
    h.step = step;
    return s_deliver(j, j->shard1, &h);
}

// Up to training: shard 1 registered, assigned (its token kept) and
// ready; the worker admitted and sent its JOB.
static void s_job_setup(job *j)
{
    memset(j, 0, sizeof *j);
    j->ctx = zmq_ctx_new();
    j->router = zps_wire_socket(j->ctx, ZMQ_ROUTER, 1000);
    j->shard1 = zps_wire_socket(j->ctx, ZMQ_DEALER, 300);
    j->worker = zps_wire_socket(j->ctx, ZMQ_DEALER, 300);
    ck_assert_int_eq(zmq_bind(j->router, "inproc://coord"), 0);
    ck_assert_int_eq(zmq_connect(j->shard1, "inproc://coord"), 0);
    ck_assert_int_eq(zmq_connect(j->worker, "inproc://coord"), 0);
    zps_coord_cfg cfg = {.model = "mlp:4-3-2", .dataset = "synthetic:40", .seed = 1,
                         .global_batch = 8, .total_steps = 20, .steps_per_epoch = 5,
                         .n_test = N_TEST, .workers = 1, .worker_timeout_ms = 60000,
                         .n_params = 23, .shards = 2, .endpoint = "tcp://127.0.0.1:1",
                         .restore = s_restore, .restore_arg = j};
    j->c = zps_coord_new(&cfg);
    ck_assert_ptr_nonnull(j->c);
    ck_assert_int_eq(s_register(j, 0), ZPS_OK);
    ck_assert(!zps_coord_shard_assigned(j->c, 1)); // anyone may claim it yet
    Zps__Hello hello = ZPS__HELLO__INIT;
    hello.host = "test";
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__HELLO);
    h.hello = &hello;
    ck_assert_int_eq(s_deliver(j, j->worker, &h), ZPS_OK);
    zps_wire_msg m;
    Zps__Header *assign = s_next(j->shard1, &m);
    ck_assert_ptr_nonnull(assign);
    ck_assert_int_eq(assign->type, ZPS__MSG_TYPE__ASSIGN);
    j->token = assign->job->shard_token;
    zps_wire_msg_fini(&m);
    ck_assert_uint_ne(j->token, 0);
    ck_assert_int_eq(s_ready(j, 0), ZPS_OK);
    Zps__Header *jb = s_next(j->worker, &m);
    ck_assert_ptr_nonnull(jb);
    ck_assert_int_eq(jb->type, ZPS__MSG_TYPE__JOB);
    ck_assert(zps_coord_member_ok(j->c, 0, jb->job->member_id));
    ck_assert(!zps_coord_member_ok(j->c, 0, jb->job->member_id ^ 1));
    ck_assert(!zps_coord_member_ok(j->c, 1, jb->job->member_id));
    zps_wire_msg_fini(&m);
    ck_assert_uint_eq(zps_coord_at(j->c), ZPS_AT_TRAINING);
}

static void s_job_teardown(job *j)
{
    zps_coord_destroy(&j->c);
    zps_wire_close(&j->router);
    zps_wire_close(&j->shard1);
    zps_wire_close(&j->worker);
    zmq_ctx_term(j->ctx);
}

// Shard 1 "restarts": its REGISTER (with its token) makes the coordinator
// assign its range again and wait for its READY.
static void s_restart_shard1(job *j)
{
    ck_assert_int_eq(s_register(j, j->token), ZPS_OK);
    zps_wire_msg m;
    Zps__Header *assign = s_next(j->shard1, &m);
    ck_assert_ptr_nonnull(assign);
    ck_assert_int_eq(assign->type, ZPS__MSG_TYPE__ASSIGN);
    ck_assert_uint_eq(assign->job->shard_token, j->token); // the same one: it kept it
    zps_wire_msg_fini(&m);
}

START_TEST(test_coord_assign_gives_each_shard_a_token_only_its_holder_matches)
{
    job j;
    s_job_setup(&j);
    ck_assert(zps_coord_shard_assigned(j.c, 1));
    ck_assert(zps_coord_shard_token_ok(j.c, 1, j.token));
    ck_assert(!zps_coord_shard_token_ok(j.c, 1, j.token ^ 1));
    ck_assert(!zps_coord_shard_token_ok(j.c, 1, 0));
    ck_assert(!zps_coord_shard_token_ok(j.c, 0, j.token)); // shard 0 is this process
    ck_assert(!zps_coord_shard_token_ok(j.c, 2, j.token)); // past the job's shards
    ck_assert(!zps_coord_shard_token_ok(j.c, 1 + ZPS_MAX_SHARDS, j.token));
    s_job_teardown(&j);
}
END_TEST

START_TEST(test_coord_ready_for_a_step_in_the_future_is_refused_and_nothing_rolls_back)
{
    job j;
    s_job_setup(&j);
    s_restart_shard1(&j);
    ck_assert_int_eq(s_ready(&j, 101), ZPS_ESTALE);
    uint64_t step;
    ck_assert(!zps_coord_take_rollback(j.c, &step));
    ck_assert_int_eq(j.restores, 0);
    zps_wire_msg m;
    ck_assert_ptr_null(s_next(j.worker, &m)); // no ROLLBACK went out
    zps_wire_msg_fini(&m);
    s_job_teardown(&j);
}
END_TEST

START_TEST(test_coord_rollback_shard0_cannot_restore_is_refused_and_the_job_goes_on)
{
    job j;
    s_job_setup(&j);
    s_restart_shard1(&j);
    j.restore_result = ZPS_ENOENT; // no checkpoint of step 0 on shard 0
    ck_assert_int_eq(s_ready(&j, 0), ZPS_ENOENT);
    uint64_t step;
    ck_assert(!zps_coord_take_rollback(j.c, &step));
    ck_assert_int_eq(j.restores, 1);
    zps_wire_msg m;
    ck_assert_ptr_null(s_next(j.worker, &m));
    zps_wire_msg_fini(&m);
    ck_assert_uint_eq(zps_coord_at(j.c), ZPS_AT_TRAINING);
    // Once shard 0 can, the same request rolls everyone back.
    j.restore_result = ZPS_OK;
    ck_assert_int_eq(s_ready(&j, 0), ZPS_OK);
    ck_assert(zps_coord_take_rollback(j.c, &step));
    ck_assert_uint_eq(step, 0);
    Zps__Header *rb = s_next(j.worker, &m);
    ck_assert_ptr_nonnull(rb);
    ck_assert_int_eq(rb->type, ZPS__MSG_TYPE__ROLLBACK);
    zps_wire_msg_fini(&m);
    s_job_teardown(&j);
}
END_TEST

START_TEST(test_coord_step_done_ahead_of_what_can_be_is_refused)
{
    job j;
    s_job_setup(&j);
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__STEP_DONE);
    h.job_id = zps_coord_job_id(j.c);
    h.shard_token = j.token;
    h.shard = 1;
    h.step = 2; // shard 0 has done none: shard 1 can have done one at most
    ck_assert_int_eq(s_deliver(&j, j.shard1, &h), ZPS_ESTALE);
    h.step = 1;
    ck_assert_int_eq(s_deliver(&j, j.shard1, &h), ZPS_OK);
    h.shard = 7; // not a shard of the job
    ck_assert_int_eq(s_deliver(&j, j.shard1, &h), ZPS_ESTALE);
    s_job_teardown(&j);
}
END_TEST

// ---------------------------------------------------------------------------
// Members coming and going.

#define MB 8u
#define MAX_W 6
#define TIMEOUT_MS 150.0

typedef struct mjob {
    void *ctx;
    void *router;                // stands for shard 0's socket
    void *w[MAX_W];              // the workers' DEALERs
    uint64_t id[MAX_W];          // member ids from their JOBs
    uint32_t rank[MAX_W];
    zps_coord *c;
    uint32_t counted[ZPS_MAX_MEMBERS];
} mjob;

static void s_members_setup(mjob *j, uint32_t workers)
{
    static int n;
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://coord-%d", n++);
    memset(j, 0, sizeof *j);
    j->ctx = zmq_ctx_new();
    j->router = zps_wire_socket(j->ctx, ZMQ_ROUTER, 200);
    ck_assert_int_eq(zmq_bind(j->router, ep), 0);
    for (int i = 0; i < MAX_W; i++) {
        j->w[i] = zps_wire_socket(j->ctx, ZMQ_DEALER, 50);
        ck_assert_int_eq(zmq_connect(j->w[i], ep), 0);
    }
    zps_coord_cfg cfg = {.model = "mlp:4-3-2", .dataset = "synthetic:400", .seed = 1,
                         .global_batch = MB, .total_steps = 40, .steps_per_epoch = 50,
                         .n_test = 10, .workers = workers, .worker_timeout_ms = TIMEOUT_MS,
                         .n_params = 23, .shards = 1, .endpoint = "inproc://x"};
    j->c = zps_coord_new(&cfg);
    ck_assert_ptr_nonnull(j->c);
}

static void s_members_teardown(mjob *j)
{
    zps_coord_destroy(&j->c);
    for (int i = 0; i < MAX_W; i++) {
        zmq_close(j->w[i]);
    }
    zmq_close(j->router);
    zmq_ctx_term(j->ctx);
}

// The next message to worker i of `type` (others before it are skipped),
// or false within the socket's timeout. m: the caller finishes it.
static bool s_next_to(mjob *j, int i, Zps__MsgType type, zps_wire_msg *m)
{
    while (zps_wire_recv(j->w[i], false, m) == ZPS_OK) {
        if (m->hdr->type == type) {
            return true;
        }
        zps_wire_msg_fini(m);
    }
    return false;
}

// Worker i says HELLO; the coordinator handles it.
static void s_say_hello(mjob *j, int i)
{
    Zps__Hello hello = ZPS__HELLO__INIT;
    hello.host = "test";
    hello.device = "cpu";
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__HELLO);
    h.hello = &hello;
    ck_assert_int_eq(zps_wire_send(j->w[i], NULL, &h, NULL, 0, NULL), ZPS_OK);
    zps_wire_msg m;
    ck_assert_int_eq(zps_wire_recv(j->router, true, &m), ZPS_OK);
    ck_assert_int_eq(zps_coord_on_hello(j->c, j->router, &m), ZPS_OK);
    zps_wire_msg_fini(&m);
}

// Worker i's JOB: its id and rank; returns the step it starts at.
static uint64_t s_take_job_of(mjob *j, int i)
{
    zps_wire_msg m;
    ck_assert_msg(s_next_to(j, i, ZPS__MSG_TYPE__JOB, &m), "worker %d got no JOB", i);
    j->id[i] = m.hdr->job->member_id;
    j->rank[i] = m.hdr->job->rank;
    uint64_t start = m.hdr->job->start_step;
    zps_wire_msg_fini(&m);
    return start;
}

static bool s_has_job_yet(mjob *j, int i)
{
    zps_wire_msg m;
    bool got = s_next_to(j, i, ZPS__MSG_TYPE__JOB, &m);
    if (got) {
        zps_wire_msg_fini(&m);
    }
    return got;
}

// A heartbeat of worker i, on the coordinator's side.
static void s_beat_of(mjob *j, int i)
{
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__HEARTBEAT);
    h.member_id = j->id[i];
    h.rank = j->rank[i];
    zps_wire_msg m = {.hdr = &h};
    ck_assert_int_eq(zps_coord_on_heartbeat(j->c, j->router, &m), ZPS_OK);
}

// Time passes for the members that beat (mask of workers): the others fall
// silent past the timeout and are evicted by the tick.
static void s_silence_but(mjob *j, unsigned beating)
{
    double until = zps_clock_ms() + 2 * TIMEOUT_MS;
    while (zps_clock_ms() < until) {
        for (int i = 0; i < MAX_W; i++) {
            if (beating & (1u << i)) {
                s_beat_of(j, i);
            }
        }
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
        zps_coord_tick(j->c, j->router, zps_clock_ms());
    }
}

// Shard 0 completes `step` (and was the only shard).
static void s_step_done_on(mjob *j, uint64_t step)
{
    zps_coord_step_done(j->c, step, 0.5f, 1.0, j->counted);
}

// The extras of `step` in the PLANs worker i got: samples handed to it.
static uint32_t s_extras_to(mjob *j, int i, uint64_t step, uint32_t *gen)
{
    uint32_t samples = 0;
    zps_wire_msg m;
    while (s_next_to(j, i, ZPS__MSG_TYPE__PLAN, &m)) {
        for (size_t k = 0; k < m.hdr->plan->n_extras; k++) {
            const Zps__Extra *e = m.hdr->plan->extras[k];
            samples += e->step == step && e->rank == j->rank[i] ? e->count : 0;
        }
        *gen = m.hdr->plan->generation;
        zps_wire_msg_fini(&m);
    }
    return samples;
}

// Two workers train from step 0; steps 0..4 are done, 5 is in progress.
static void s_start_two(mjob *j)
{
    s_members_setup(j, 2);
    s_say_hello(j, 0);
    s_say_hello(j, 1);
    ck_assert_uint_eq(s_take_job_of(j, 0), 0);
    ck_assert_uint_eq(s_take_job_of(j, 1), 0);
    for (uint64_t t = 0; t < 5; t++) {
        zps_coord_release(j->c, j->router, t + 1);
        s_step_done_on(j, t);
    }
}

START_TEST(test_coord_two_joins_within_a_step_make_one_plan_at_the_boundary)
{
    mjob j;
    s_start_two(&j);
    s_say_hello(&j, 2);
    s_say_hello(&j, 3);
    // Nothing changes during step 5: no JOB for the joiners, no plan.
    ck_assert(!s_has_job_yet(&j, 2));
    ck_assert(!s_has_job_yet(&j, 3));
    uint32_t gen = 0;
    ck_assert_uint_eq(s_extras_to(&j, 0, 5, &gen), 0);
    ck_assert_uint_eq(gen, 0);
    // The boundary: one plan for both joins, from step 6.
    zps_coord_release(j.c, j.router, 6);
    ck_assert_uint_eq(s_take_job_of(&j, 2), 6);
    ck_assert_uint_eq(s_take_job_of(&j, 3), 6);
    (void)s_extras_to(&j, 0, 5, &gen);
    ck_assert_uint_eq(gen, 2);
    uint64_t effective;
    ck_assert_uint_eq(zps_coord_generation(j.c, &effective), 2);
    ck_assert_uint_eq(effective, 6);
    ck_assert_uint_eq(zps_coord_plan(j.c)->n, 4);
    // Another boundary without changes makes no plan.
    s_step_done_on(&j, 5);
    zps_coord_release(j.c, j.router, 7);
    ck_assert_uint_eq(zps_coord_generation(j.c, &effective), 2);
    s_members_teardown(&j);
}
END_TEST

START_TEST(test_coord_eviction_during_a_join_hands_the_piece_to_an_active_member)
{
    mjob j;
    s_start_two(&j);
    s_say_hello(&j, 2);       // joins during step 5, for step 6
    s_silence_but(&j, 1u);    // worker 1 falls silent: evicted during step 5
    uint32_t gen = 0;
    ck_assert_uint_eq(s_extras_to(&j, 0, 5, &gen), MB / 2); // its slice of 5 went to rank 0
    ck_assert(!s_has_job_yet(&j, 2));                          // not to the joiner
    zps_coord_release(j.c, j.router, 6);
    ck_assert_uint_eq(s_take_job_of(&j, 2), 6);
    const zps_plan *p = zps_coord_plan(j.c);
    ck_assert_uint_eq(p->n, 2);
    ck_assert_uint_eq(p->slices[0].rank, 0);
    ck_assert_uint_eq(p->slices[1].rank, 2);
    s_members_teardown(&j);
}
END_TEST

START_TEST(test_coord_join_during_eviction_wakes_the_joiner_only_when_nobody_else_can)
{
    mjob j;
    s_start_two(&j);
    s_silence_but(&j, 1u);    // worker 1 gone: its piece of step 5 to rank 0
    uint32_t gen = 0;
    ck_assert_uint_eq(s_extras_to(&j, 0, 5, &gen), MB / 2);
    s_say_hello(&j, 2);       // a joiner while the eviction's pieces are out
    ck_assert(!s_has_job_yet(&j, 2));
    s_silence_but(&j, 0u);    // worker 0 gone too: nobody active can compute step 5
    // The joiner is active from step 5 at once, with the whole step in its JOB.
    zps_wire_msg m;
    ck_assert(s_next_to(&j, 2, ZPS__MSG_TYPE__JOB, &m));
    ck_assert_uint_eq(m.hdr->job->start_step, 5);
    uint32_t samples = 0;
    for (size_t k = 0; k < m.hdr->job->n_extras; k++) {
        ck_assert_uint_eq(m.hdr->job->extras[k]->step, 5);
        samples += m.hdr->job->extras[k]->count;
    }
    ck_assert_uint_eq(samples, MB);
    // And a plan that names it exists already, for the shards to know it.
    ck_assert_uint_eq(zps_coord_plan(j.c)->n, 1);
    ck_assert_uint_eq(zps_coord_plan(j.c)->slices[0].member_id, m.hdr->job->member_id);
    zps_wire_msg_fini(&m);
    s_members_teardown(&j);
}
END_TEST

Suite *zps_suite_coord(void)
{
    Suite *s = suite_create("coord");
    TCase *tc = tcase_create("eval");
    tcase_add_test(tc, test_coord_eval_counts_each_test_record_once_whoever_sends_it_first);
    tcase_add_test(tc, test_coord_eval_refuses_records_past_the_test_set_and_changes_nothing);
    suite_add_tcase(s, tc);
    TCase *tk = tcase_create("credentials");
    tcase_add_test(tk, test_coord_assign_gives_each_shard_a_token_only_its_holder_matches);
    tcase_add_test(tk, test_coord_ready_for_a_step_in_the_future_is_refused_and_nothing_rolls_back);
    tcase_add_test(tk, test_coord_rollback_shard0_cannot_restore_is_refused_and_the_job_goes_on);
    tcase_add_test(tk, test_coord_step_done_ahead_of_what_can_be_is_refused);
    suite_add_tcase(s, tk);
    TCase *mc = tcase_create("members");
    tcase_add_test(mc, test_coord_two_joins_within_a_step_make_one_plan_at_the_boundary);
    tcase_add_test(mc, test_coord_eviction_during_a_join_hands_the_piece_to_an_active_member);
    tcase_add_test(mc, test_coord_join_during_eviction_wakes_the_joiner_only_when_nobody_else_can);
    suite_add_tcase(s, mc);
    return s;
}
