/* check_coord.c - the coordinator as an object, without processes.
 *
 * The gathering of an epoch's evaluation:
 * each test record counts once, whoever sends it first (a late slice's
 * owner or the helpers that computed its pieces), and bad bodies are
 * refused without changing anything. The metrics log shows the result.
 * Then its credentials and the requests it refuses: shard tokens with
 * ASSIGN, a rollback to a step in the future or to a checkpoint shard 0
 * does not have, a STEP_DONE ahead of what can be, the shards' parts of
 * the gradient norm (--clip-grad-norm). Members coming and
 * going within a step: joins take effect together at the next step
 * boundary, a joiner never owns work of the step in progress unless nobody
 * else can compute it, an evicted member's pieces go to members active at
 * that step. Admission, recovery after a restart and speculation. No
 * socket and no process: messages go in by hand, what the coordinator
 * would send is read from its outbox, and time is the test's clock. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "common/zps_ckpt.h"
#include "server/coord/zps_coord.h"
#include "server/zps_msgtab.h"
#include "tests/zps_check.h"
#include "tests/zps_tmpdir.h"

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
// Peers without sockets: each has a routing id, as shard 0's ROUTER would
// give it, and a mailbox that s_post fills from the coordinator's outbox.

#define BOX 64

typedef struct peer {
    zmq_msg_t route;
    Zps__Header *box[BOX]; // owned: what the coordinator sent it, oldest first
    int n;
} peer;

static double s_clock_now; // the test's clock, in ms

static double s_clock(void)
{
    return s_clock_now;
}

static void s_peer_init(peer *p, const char *id)
{
    memset(p, 0, sizeof *p);
    ck_assert_int_eq(zmq_msg_init_size(&p->route, strlen(id)), 0);
    memcpy(zmq_msg_data(&p->route), id, strlen(id));
}

static void s_peer_fini(peer *p)
{
    for (int i = 0; i < p->n; i++) {
        zps__header__free_unpacked(p->box[i], NULL);
    }
    zmq_msg_close(&p->route);
}

static bool s_is_route(zmq_msg_t *a, zmq_msg_t *b)
{
    return zmq_msg_size(a) == zmq_msg_size(b) &&
           memcmp(zmq_msg_data(a), zmq_msg_data(b), zmq_msg_size(a)) == 0;
}

// Hands each message of the outbox to the peer it is routed to (every
// message goes to one of peers[0..n)), and empties the outbox.
static void s_post(zps_outbox *out, peer *const *peers, int n)
{
    for (size_t i = 0; i < out->n; i++) {
        int k = 0;
        while (k < n && !s_is_route(&out->msgs[i].route, &peers[k]->route)) {
            k++;
        }
        ck_assert_msg(k < n, "a message to nobody of the test");
        ck_assert_int_lt(peers[k]->n, BOX);
        Zps__Header *h = zps_outbox_header(out, i);
        ck_assert_ptr_nonnull(h);
        peers[k]->box[peers[k]->n++] = h;
    }
    zps_outbox_clear(out);
}

// The oldest message of `type` in p's mailbox, taken out (older ones of
// other types are dropped); NULL if none. The caller frees it.
static Zps__Header *s_take(peer *p, Zps__MsgType type)
{
    while (p->n > 0) {
        Zps__Header *h = p->box[0];
        memmove(p->box, p->box + 1, (size_t)(p->n - 1) * sizeof p->box[0]);
        p->n--;
        if (h->type == type) {
            return h;
        }
        zps__header__free_unpacked(h, NULL);
    }
    return NULL;
}

static bool s_got(peer *p, Zps__MsgType type)
{
    Zps__Header *h = s_take(p, type);
    if (h) {
        zps__header__free_unpacked(h, NULL);
    }
    return h != NULL;
}

// A message as the loop hands it to a handler: h, from p.
static zps_wire_msg s_from(peer *p, Zps__Header *h)
{
    zps_wire_msg m = {.hdr = h, .has_route = true};
    zps_wire_route_copy(&m.route, &p->route);
    return m;
}

static void s_msg_done(zps_wire_msg *m)
{
    zps_wire_route_close(&m->route);
}

// ---------------------------------------------------------------------------
// Credentials and refused requests: a 2-shard job with one worker.

typedef struct job {
    peer shard1, worker;
    zps_outbox out;
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

// h from `from` to its handler; what the coordinator sent goes to the
// mailboxes. Returns the handler's verdict.
static zps_err s_deliver(job *j, peer *from, Zps__Header *h)
{
    zps_wire_msg m = s_from(from, h);
    zps_err err = ZPS_OK;
    switch (h->type) {
    case ZPS__MSG_TYPE__REGISTER: err = zps_coord_on_register(j->c, &j->out, &m); break;
    case ZPS__MSG_TYPE__HELLO: err = zps_coord_on_hello(j->c, &j->out, &m); break;
    case ZPS__MSG_TYPE__READY: err = zps_coord_on_ready(j->c, &j->out, &m); break;
    case ZPS__MSG_TYPE__STEP_DONE: err = zps_coord_on_step_done(j->c, &m); break;
    case ZPS__MSG_TYPE__NORM: err = zps_coord_on_norm(j->c, &j->out, &m); break;
    default: ck_abort_msg("no handler for type %d here", h->type);
    }
    s_msg_done(&m);
    s_post(&j->out, (peer *const[]){&j->shard1, &j->worker}, 2);
    return err;
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
    return s_deliver(j, &j->shard1, &h);
}

static zps_err s_ready(job *j, uint64_t step)
{
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__READY);
    h.job_id = zps_coord_job_id(j->c);
    h.shard = 1;
    h.shard_token = j->token;
    h.step = step;
    return s_deliver(j, &j->shard1, &h);
}

// Up to training: shard 1 registered, assigned (its token kept) and
// ready; the worker admitted and sent its JOB.
static void s_job_setup(job *j)
{
    memset(j, 0, sizeof *j);
    s_peer_init(&j->shard1, "shard1");
    s_peer_init(&j->worker, "worker");
    zps_outbox_init(&j->out);
    zps_coord_cfg cfg = {.model = "mlp:4-3-2", .dataset = "synthetic:40", .seed = 1,
                         .global_batch = 8, .total_steps = 20, .steps_per_epoch = 5,
                         .n_test = N_TEST, .workers = 1, .worker_timeout_ms = 60000,
                         .n_params = 23, .shards = 2, .endpoint = "tcp://127.0.0.1:1",
                         .restore = s_restore, .restore_arg = j, .clock_ms = s_clock,
                         .clip_grad_norm = 1.0f};
    j->c = zps_coord_new(&cfg);
    ck_assert_ptr_nonnull(j->c);
    ck_assert_int_eq(s_register(j, 0), ZPS_OK);
    ck_assert(!zps_coord_shard_assigned(j->c, 1)); // anyone may claim it yet
    Zps__Hello hello = ZPS__HELLO__INIT;
    hello.host = "test";
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__HELLO);
    h.hello = &hello;
    ck_assert_int_eq(s_deliver(j, &j->worker, &h), ZPS_OK);
    Zps__Header *assign = s_take(&j->shard1, ZPS__MSG_TYPE__ASSIGN);
    ck_assert_ptr_nonnull(assign);
    j->token = assign->job->shard_token;
    zps__header__free_unpacked(assign, NULL);
    ck_assert_uint_ne(j->token, 0);
    ck_assert_int_eq(s_ready(j, 0), ZPS_OK);
    Zps__Header *jb = s_take(&j->worker, ZPS__MSG_TYPE__JOB);
    ck_assert_ptr_nonnull(jb);
    ck_assert(zps_coord_member_ok(j->c, 0, jb->job->member_id));
    ck_assert(!zps_coord_member_ok(j->c, 0, jb->job->member_id ^ 1));
    ck_assert(!zps_coord_member_ok(j->c, 1, jb->job->member_id));
    zps__header__free_unpacked(jb, NULL);
    ck_assert_uint_eq(zps_coord_at(j->c), ZPS_AT_TRAINING);
}

static void s_job_teardown(job *j)
{
    zps_coord_destroy(&j->c);
    zps_outbox_fini(&j->out);
    s_peer_fini(&j->shard1);
    s_peer_fini(&j->worker);
}

// Shard 1 "restarts": its REGISTER (with its token) makes the coordinator
// assign its range again and wait for its READY.
static void s_restart_shard1(job *j)
{
    ck_assert_int_eq(s_register(j, j->token), ZPS_OK);
    Zps__Header *assign = s_take(&j->shard1, ZPS__MSG_TYPE__ASSIGN);
    ck_assert_ptr_nonnull(assign);
    ck_assert_uint_eq(assign->job->shard_token, j->token); // the same one: it kept it
    zps__header__free_unpacked(assign, NULL);
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
    ck_assert(!s_got(&j.worker, ZPS__MSG_TYPE__ROLLBACK)); // none went out
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
    ck_assert(!s_got(&j.worker, ZPS__MSG_TYPE__ROLLBACK));
    ck_assert_uint_eq(zps_coord_at(j.c), ZPS_AT_TRAINING);
    // Once shard 0 can, the same request rolls everyone back.
    j.restore_result = ZPS_OK;
    ck_assert_int_eq(s_ready(&j, 0), ZPS_OK);
    ck_assert(zps_coord_take_rollback(j.c, &step));
    ck_assert_uint_eq(step, 0);
    ck_assert(s_got(&j.worker, ZPS__MSG_TYPE__ROLLBACK));
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
    ck_assert_int_eq(s_deliver(&j, &j.shard1, &h), ZPS_ESTALE);
    h.step = 1;
    ck_assert_int_eq(s_deliver(&j, &j.shard1, &h), ZPS_OK);
    h.shard = 7; // not a shard of the job
    ck_assert_int_eq(s_deliver(&j, &j.shard1, &h), ZPS_ESTALE);
    s_job_teardown(&j);
}
END_TEST


// --clip-grad-norm: shard 1's NORM of a step (the sum of squares of its
// range) with shard 0's own part completes the norm, sent to shard 1 and
// taken once by shard 0; a second copy is answered with the norm again; a
// malformed one changes nothing; a rollback forgets the parts of the steps
// it replays.
static zps_err s_norm(job *j, uint64_t step, float value, size_t n_limbs)
{
    zps_sumsq part;
    zps_sumsq_init(&part);
    zps_sumsq_add(&part, &value, 1);
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__NORM);
    h.job_id = zps_coord_job_id(j->c);
    h.shard = 1;
    h.shard_token = j->token;
    h.step = step;
    h.n_norm_limbs = n_limbs;
    h.norm_limbs = part.limb;
    return s_deliver(j, &j->shard1, &h);
}

static void s_note_norm(job *j, uint64_t step, float value)
{
    zps_sumsq part;
    zps_sumsq_init(&part);
    zps_sumsq_add(&part, &value, 1);
    zps_coord_note_norm(j->c, &j->out, step, &part);
    s_post(&j->out, (peer *const[]){&j->shard1, &j->worker}, 2);
}

START_TEST(test_coord_norm_gathers_every_shards_part_once)
{
    job j;
    s_job_setup(&j);
    uint64_t step;
    float norm;
    s_note_norm(&j, 0, 3.0f);
    ck_assert(!zps_coord_take_norm(j.c, &step, &norm)); // shard 1's part is missing
    ck_assert_int_eq(s_norm(&j, 0, 4.0f, 3), ZPS_EPROTO); // not ZPS_SUMSQ_LIMBS limbs
    ck_assert(!zps_coord_take_norm(j.c, &step, &norm));
    ck_assert_int_eq(s_norm(&j, 0, 4.0f, ZPS_SUMSQ_LIMBS), ZPS_OK);
    ck_assert(zps_coord_take_norm(j.c, &step, &norm));
    ck_assert_uint_eq(step, 0);
    ck_assert_float_eq(norm, 5.0f);
    ck_assert(!zps_coord_take_norm(j.c, &step, &norm)); // once
    Zps__Header *got = s_take(&j.shard1, ZPS__MSG_TYPE__NORM);
    ck_assert_ptr_nonnull(got);
    ck_assert_uint_eq(got->step, 0);
    ck_assert_float_eq(got->grad_norm, 5.0f);
    zps__header__free_unpacked(got, NULL);
    // A second copy (sent again while shard 1 waited): the norm again.
    ck_assert_int_eq(s_norm(&j, 0, 4.0f, ZPS_SUMSQ_LIMBS), ZPS_OK);
    ck_assert(s_got(&j.shard1, ZPS__MSG_TYPE__NORM));
    ck_assert(!zps_coord_take_norm(j.c, &step, &norm));
    // Step 1: shard 1's part, then shard 1 restarts and everyone rolls
    // back to step 0: the part is of a step replayed, forgotten.
    ck_assert_int_eq(s_norm(&j, 1, 6.0f, ZPS_SUMSQ_LIMBS), ZPS_OK);
    s_restart_shard1(&j);
    ck_assert_int_eq(s_ready(&j, 0), ZPS_OK);
    ck_assert(zps_coord_take_rollback(j.c, &step));
    s_note_norm(&j, 1, 8.0f);
    ck_assert(!zps_coord_take_norm(j.c, &step, &norm));
    ck_assert(!s_got(&j.shard1, ZPS__MSG_TYPE__NORM));
    ck_assert_int_eq(s_norm(&j, 1, 6.0f, ZPS_SUMSQ_LIMBS), ZPS_OK);
    ck_assert(zps_coord_take_norm(j.c, &step, &norm));
    ck_assert_uint_eq(step, 1);
    ck_assert_float_eq(norm, 10.0f);
    s_job_teardown(&j);
}
END_TEST

// ---------------------------------------------------------------------------
// Members coming and going.

#define MB 8u
#define MAX_W 6
#define TIMEOUT_MS 150.0

typedef struct mjob {
    peer w[MAX_W];               // the workers
    uint64_t id[MAX_W];          // member ids from their JOBs
    uint32_t rank[MAX_W];
    zps_outbox out;
    zps_coord *c;
    uint32_t counted[ZPS_MAX_MEMBERS];
} mjob;

static void s_members_post(mjob *j)
{
    peer *to[MAX_W];
    for (int i = 0; i < MAX_W; i++) {
        to[i] = &j->w[i];
    }
    s_post(&j->out, to, MAX_W);
}

static void s_members_setup_cfg(mjob *j, zps_coord_cfg *cfg)
{
    memset(j, 0, sizeof *j);
    for (int i = 0; i < MAX_W; i++) {
        char id[16];
        snprintf(id, sizeof id, "w%d", i);
        s_peer_init(&j->w[i], id);
    }
    zps_outbox_init(&j->out);
    s_clock_now = 1000;
    cfg->clock_ms = s_clock;
    j->c = zps_coord_new(cfg);
    ck_assert_ptr_nonnull(j->c);
}

static zps_coord_cfg s_members_cfg(uint32_t workers)
{
    return (zps_coord_cfg){.model = "mlp:4-3-2", .dataset = "synthetic:400", .seed = 1,
                           .global_batch = MB, .total_steps = 40, .steps_per_epoch = 50,
                           .n_test = 10, .workers = workers, .worker_timeout_ms = TIMEOUT_MS,
                           .n_params = 23, .shards = 1, .endpoint = "inproc://x"};
}

static void s_members_setup(mjob *j, uint32_t workers)
{
    zps_coord_cfg cfg = s_members_cfg(workers);
    s_members_setup_cfg(j, &cfg);
}

static void s_members_teardown(mjob *j)
{
    zps_coord_destroy(&j->c);
    zps_outbox_fini(&j->out);
    for (int i = 0; i < MAX_W; i++) {
        s_peer_fini(&j->w[i]);
    }
}

// Worker i on `device` says HELLO (asking for `share`, 0: split the
// rest); returns the coordinator's verdict.
static zps_err s_hello_on(mjob *j, int i, uint32_t share, const char *device)
{
    Zps__Hello hello = ZPS__HELLO__INIT;
    hello.host = "test";
    hello.device = (char *)device;
    hello.share = share;
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__HELLO);
    h.hello = &hello;
    zps_wire_msg m = s_from(&j->w[i], &h);
    zps_err err = zps_coord_on_hello(j->c, &j->out, &m);
    s_msg_done(&m);
    s_members_post(j);
    return err;
}

static zps_err s_hello_share(mjob *j, int i, uint32_t share)
{
    return s_hello_on(j, i, share, "cpu");
}

static void s_say_hello(mjob *j, int i)
{
    ck_assert_int_eq(s_hello_share(j, i, 0), ZPS_OK);
}

// Worker i's JOB: its id and rank; returns the step it starts at.
static uint64_t s_take_job_of(mjob *j, int i)
{
    Zps__Header *h = s_take(&j->w[i], ZPS__MSG_TYPE__JOB);
    ck_assert_msg(h != NULL, "worker %d got no JOB", i);
    j->id[i] = h->job->member_id;
    j->rank[i] = h->job->rank;
    uint64_t start = h->job->start_step;
    zps__header__free_unpacked(h, NULL);
    return start;
}

static bool s_has_job_yet(mjob *j, int i)
{
    return s_got(&j->w[i], ZPS__MSG_TYPE__JOB);
}

// A heartbeat of worker i, on the coordinator's side.
static void s_beat_of(mjob *j, int i)
{
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__HEARTBEAT);
    h.member_id = j->id[i];
    h.rank = j->rank[i];
    zps_wire_msg m = s_from(&j->w[i], &h);
    ck_assert_int_eq(zps_coord_on_heartbeat(j->c, &j->out, &m), ZPS_OK);
    s_msg_done(&m);
    s_members_post(j);
}

static void s_tick(mjob *j)
{
    zps_coord_tick(j->c, &j->out, s_clock_now);
    s_members_post(j);
}

// Time passes for the members that beat (mask of workers): the others fall
// silent past the timeout and are evicted by the tick.
static void s_silence_but(mjob *j, unsigned beating)
{
    double until = s_clock_now + 2 * TIMEOUT_MS;
    while (s_clock_now < until) {
        for (int i = 0; i < MAX_W; i++) {
            if (beating & (1u << i)) {
                s_beat_of(j, i);
            }
        }
        s_clock_now += 10;
        s_tick(j);
    }
}

// Shard 0 completes `step` (and was the only shard).
static void s_step_done_on(mjob *j, uint64_t step)
{
    zps_coord_step_done(j->c, step, 0.5f, 1.0, j->counted);
}

// Shard 0 is about to send the parameters of `step`.
static void s_release(mjob *j, uint64_t step)
{
    zps_coord_release(j->c, &j->out, step);
    s_members_post(j);
}

// The extras of `step` in the PLANs worker i got: samples handed to it.
static uint32_t s_extras_to(mjob *j, int i, uint64_t step, uint32_t *gen)
{
    uint32_t samples = 0;
    Zps__Header *h;
    while ((h = s_take(&j->w[i], ZPS__MSG_TYPE__PLAN))) {
        for (size_t k = 0; k < h->plan->n_extras; k++) {
            const Zps__Extra *e = h->plan->extras[k];
            samples += e->step == step && e->rank == j->rank[i] ? e->count : 0;
        }
        *gen = h->plan->generation;
        zps__header__free_unpacked(h, NULL);
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
        s_release(j, t + 1);
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
    s_release(&j, 6);
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
    s_release(&j, 7);
    ck_assert_uint_eq(zps_coord_generation(j.c, &effective), 2);
    s_members_teardown(&j);
}
END_TEST

// A worker learns its own slice of a plan, not the others': a plan to
// each of N members would cost N squared at every re-plan.
START_TEST(test_coord_a_worker_is_sent_its_own_slice_only)
{
    mjob j;
    s_start_two(&j);
    s_say_hello(&j, 2);
    s_say_hello(&j, 3);
    s_release(&j, 6);
    Zps__Header *jb = s_take(&j.w[3], ZPS__MSG_TYPE__JOB);
    ck_assert_ptr_nonnull(jb);
    ck_assert_uint_eq(jb->job->n_plan, 1);
    ck_assert_uint_eq(jb->job->plan[0]->rank, jb->job->rank);
    ck_assert_uint_eq(jb->job->plan[0]->member_id, jb->job->member_id);
    ck_assert_uint_eq(jb->job->plan[0]->count, MB / 4);
    zps__header__free_unpacked(jb, NULL);
    Zps__Header *h = s_take(&j.w[0], ZPS__MSG_TYPE__PLAN);
    ck_assert_ptr_nonnull(h);
    ck_assert_uint_eq(h->plan->n_slices, 1);
    ck_assert_uint_eq(h->plan->members, 4);
    ck_assert_uint_eq(h->plan->slices[0]->rank, j.rank[0]);
    ck_assert_uint_eq(h->plan->slices[0]->member_id, j.id[0]);
    zps__header__free_unpacked(h, NULL);
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
    s_release(&j, 6);
    ck_assert_uint_eq(s_take_job_of(&j, 2), 6);
    const zps_plan *p = zps_coord_plan(j.c);
    ck_assert_uint_eq(p->n, 2);
    ck_assert_uint_eq(p->slices[0].rank, 0);
    ck_assert_uint_eq(p->slices[1].rank, 2);
    s_members_teardown(&j);
}
END_TEST

// A member heard only through its pushes (the server calls
// zps_coord_heard for each) never beats, and is not evicted; its peer,
// heard by nothing (a push with another member id is nobody's), is.
START_TEST(test_coord_a_member_heard_by_its_pushes_alone_is_not_evicted)
{
    mjob j;
    s_start_two(&j);
    double until = s_clock_now + 2 * TIMEOUT_MS;
    while (s_clock_now < until) {
        ck_assert(zps_coord_heard(j.c, j.rank[0], j.id[0]));
        ck_assert(!zps_coord_heard(j.c, j.rank[1], j.id[1] ^ 1u));
        s_clock_now += 10;
        s_tick(&j);
    }
    ck_assert(zps_coord_heard(j.c, j.rank[0], j.id[0]));  // still a live member
    ck_assert(!zps_coord_heard(j.c, j.rank[1], j.id[1])); // evicted: heard as nobody
    uint32_t gen = 0;
    ck_assert_uint_eq(s_extras_to(&j, 0, 5, &gen), MB / 2); // its slice of 5 went to rank 0
    s_members_teardown(&j);
}
END_TEST

// The tick looks for silent members only once one could be past its
// timeout (zps_coord_tick.c): a member that falls silent later than the
// last look foresaw is still evicted at the first tick past its own
// timeout, its slice handed on.
START_TEST(test_coord_a_member_is_evicted_at_the_first_tick_past_its_own_timeout)
{
    mjob j;
    s_start_two(&j);
    uint32_t gen = 0;
    ck_assert_uint_eq(s_extras_to(&j, 0, 5, &gen), 0);
    double last = 0, evicted = 0;
    for (int t = 0; t < 100 && evicted == 0; t++) { // ticks 10 ms apart
        s_beat_of(&j, 0);
        if (t < 20) { // worker 1 beats for 200 ms, then falls silent
            s_beat_of(&j, 1);
            last = s_clock_now;
        }
        s_clock_now += 10;
        s_tick(&j);
        if (s_extras_to(&j, 0, 5, &gen) == MB / 2) {
            evicted = s_clock_now;
        }
    }
    ck_assert_double_gt(evicted - last, TIMEOUT_MS);
    ck_assert_double_le(evicted - last, TIMEOUT_MS + 10);
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
    Zps__Header *jb = s_take(&j.w[2], ZPS__MSG_TYPE__JOB);
    ck_assert_ptr_nonnull(jb);
    ck_assert_uint_eq(jb->job->start_step, 5);
    uint32_t samples = 0;
    for (size_t k = 0; k < jb->job->n_extras; k++) {
        ck_assert_uint_eq(jb->job->extras[k]->step, 5);
        samples += jb->job->extras[k]->count;
    }
    ck_assert_uint_eq(samples, MB);
    // And a plan that names it exists already, for the shards to know it.
    ck_assert_uint_eq(zps_coord_plan(j.c)->n, 1);
    ck_assert_uint_eq(zps_coord_plan(j.c)->slices[0].member_id, jb->job->member_id);
    zps__header__free_unpacked(jb, NULL);
    s_members_teardown(&j);
}
END_TEST

START_TEST(test_coord_hello_whose_share_does_not_fit_is_refused_in_one_line_and_changes_nothing)
{
    mjob j;
    s_members_setup(&j, 2);
    ck_assert_int_eq(s_hello_share(&j, 0, 6), ZPS_OK);
    ck_assert_int_eq(s_hello_share(&j, 1, 4), ZPS_EINVAL); // 6 + 4 > B = 8
    Zps__Header *e = s_take(&j.w[1], ZPS__MSG_TYPE__ERROR);
    ck_assert_ptr_nonnull(e);
    ck_assert_int_eq(e->error_code, ZPS_EINVAL);
    ck_assert_ptr_nonnull(strstr(e->error, "share 4 does not fit"));
    zps__header__free_unpacked(e, NULL);
    ck_assert_ptr_null(zps_coord_plan(j.c)); // still waiting for a second worker
    ck_assert_uint_eq(zps_coord_at(j.c), ZPS_AT_WAITING);
    // The same worker asking for what is left is admitted, and the job starts.
    ck_assert_int_eq(s_hello_share(&j, 1, 2), ZPS_OK);
    ck_assert_uint_eq(s_take_job_of(&j, 0), 0);
    ck_assert_uint_eq(s_take_job_of(&j, 1), 0);
    const zps_plan *p = zps_coord_plan(j.c);
    ck_assert_uint_eq(p->n, 2);
    ck_assert_uint_eq(p->slices[0].count, 6);
    ck_assert_uint_eq(p->slices[1].count, 2);
    s_members_teardown(&j);
}
END_TEST

// A worker whose HELLO timer ran out just as its JOB left says HELLO again
// on the same connection: the job has started, yet this is no joiner (whose
// share would not fit), only the member of before; nothing changes.
START_TEST(test_coord_hello_again_crossing_its_job_is_the_same_member_and_changes_nothing)
{
    mjob j;
    s_members_setup(&j, 2);
    ck_assert_int_eq(s_hello_share(&j, 0, 6), ZPS_OK);
    ck_assert_int_eq(s_hello_share(&j, 1, 2), ZPS_OK); // the job starts: JOBs out
    ck_assert_int_eq(s_hello_share(&j, 1, 2), ZPS_OK); // crossed its JOB
    ck_assert_uint_eq(s_take_job_of(&j, 0), 0);
    ck_assert_uint_eq(s_take_job_of(&j, 1), 0);
    for (int k = 0; k < j.w[1].n; k++) { // after it: no refusal, no second JOB
        ck_assert_int_ne(j.w[1].box[k]->type, ZPS__MSG_TYPE__ERROR);
        ck_assert_int_ne(j.w[1].box[k]->type, ZPS__MSG_TYPE__JOB);
    }
    const zps_plan *p = zps_coord_plan(j.c);
    ck_assert_uint_eq(p->n, 2);
    ck_assert_uint_eq(p->slices[1].count, 2);
    s_members_teardown(&j);
}
END_TEST

// Worker i's BYE at `step` (stopped by its supervisor), on the
// coordinator's side.
static void s_bye_of(mjob *j, int i, uint64_t step)
{
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__BYE);
    h.rank = j->rank[i];
    h.member_id = j->id[i];
    h.step = step;
    zps_wire_msg m = s_from(&j->w[i], &h);
    ck_assert_int_eq(zps_coord_on_bye(j->c, &j->out, &m), ZPS_OK);
    s_msg_done(&m);
    s_members_post(j);
}

START_TEST(test_coord_bye_in_the_middle_hands_the_slice_on_and_replans_at_the_boundary)
{
    mjob j;
    s_start_two(&j);
    s_bye_of(&j, 1, 5);
    uint32_t gen = 0;
    ck_assert_uint_eq(s_extras_to(&j, 0, 5, &gen), MB / 2); // rank 1's half of step 5
    s_release(&j, 6);
    ck_assert_uint_eq(zps_coord_plan(j.c)->n, 1);
    ck_assert_uint_eq(zps_coord_plan(j.c)->slices[0].count, MB);
    // A second BYE from it changes nothing.
    s_bye_of(&j, 1, 5);
    ck_assert_uint_eq(j.out.n, 0);
    s_members_teardown(&j);
}
END_TEST

// ---------------------------------------------------------------------------
// Straggler policy: speculation and the adaptive split.

START_TEST(test_coord_speculation_hands_a_late_slice_in_pieces_to_the_helpers_only)
{
    mjob j;
    s_members_setup(&j, 3);
    for (int i = 0; i < 3; i++) {
        s_say_hello(&j, i);
    }
    for (int i = 0; i < 3; i++) {
        ck_assert_uint_eq(s_take_job_of(&j, i), 0);
    }
    const zps_plan_slice *late = zps_plan_find(zps_coord_plan(j.c), j.rank[0]);
    bool helper[ZPS_MAX_MEMBERS] = {false};
    helper[j.rank[1]] = helper[j.rank[2]] = true;
    ck_assert(zps_coord_speculate(j.c, &j.out, 0, late->offset, late->count, j.rank[0], helper));
    s_members_post(&j);
    uint32_t gen = 0, got1 = s_extras_to(&j, 1, 0, &gen), got2 = s_extras_to(&j, 2, 0, &gen);
    ck_assert_uint_gt(got1, 0);
    ck_assert_uint_gt(got2, 0);
    ck_assert_uint_eq(got1 + got2, late->count); // the pieces tile the late slice
    ck_assert_uint_eq(gen, 1);                    // the same plan: only extras are new
    ck_assert_uint_eq(s_extras_to(&j, 0, 0, &gen), 0);
    // Nobody to help: nothing is handed.
    bool none[ZPS_MAX_MEMBERS] = {false};
    ck_assert(!zps_coord_speculate(j.c, &j.out, 0, late->offset, late->count, j.rank[0], none));
    ck_assert_uint_eq(j.out.n, 0);
    s_members_teardown(&j);
}
END_TEST

START_TEST(test_coord_adaptive_split_gives_shares_by_throughput_at_the_next_boundary)
{
    mjob j;
    zps_coord_cfg cfg = s_members_cfg(2);
    cfg.adaptive_split = true;
    s_members_setup_cfg(&j, &cfg);
    s_say_hello(&j, 0);
    s_say_hello(&j, 1);
    (void)s_take_job_of(&j, 0);
    (void)s_take_job_of(&j, 1);
    // Rank 0 computes 3 x as fast as rank 1, for 20 steps.
    for (uint64_t t = 0; t < 20; t++) {
        s_release(&j, t);
        zps_coord_note_push(j.c, t, 0, MB / 2, 4.0f, s_clock_now + 4);
        zps_coord_note_push(j.c, t, 1, MB / 2, 12.0f, s_clock_now + 12);
        s_clock_now += 13;
        j.counted[0] = j.counted[1] = MB / 2;
        s_step_done_on(&j, t);
        zps_coord_adapt(j.c);
    }
    ck_assert_uint_eq(zps_coord_plan(j.c)->slices[0].count, MB / 2); // not before the boundary
    s_release(&j, 20);
    const zps_plan *p = zps_coord_plan(j.c);
    ck_assert_uint_eq(p->n, 2);
    ck_assert_uint_eq(p->slices[0].count, 6);
    ck_assert_uint_eq(p->slices[1].count, 2);
    uint64_t effective;
    ck_assert_uint_eq(zps_coord_generation(j.c, &effective), 2);
    ck_assert_uint_eq(effective, 20);
    s_members_teardown(&j);
}
END_TEST

// ---------------------------------------------------------------------------
// --deterministic --micro-batch 8 of a global batch of 64: eight micro-batches.

#define DET_B 64u
#define DET_M 8u

static void s_det_setup(mjob *j, uint32_t workers)
{
    zps_coord_cfg cfg = s_members_cfg(workers);
    cfg.global_batch = DET_B;
    cfg.micro_batch = DET_M;
    s_members_setup_cfg(j, &cfg);
}

// The refusal worker i got: its code, and that its line says `what`.
static void s_assert_refused(mjob *j, int i, const char *what)
{
    Zps__Header *e = s_take(&j->w[i], ZPS__MSG_TYPE__ERROR);
    ck_assert_ptr_nonnull(e);
    ck_assert_int_eq(e->error_code, ZPS_EINVAL);
    ck_assert_msg(strstr(e->error, what) && !strchr(e->error, '\n'), "refusal: %s", e->error);
    zps__header__free_unpacked(e, NULL);
}

// The even split, a fixed share rounded (27: 24), and a late slice handed
// on in pieces: all whole micro-batches; every JOB says M.
START_TEST(test_coord_deterministic_shares_and_pieces_are_whole_micro_batches)
{
    mjob j;
    s_det_setup(&j, 3);
    for (int i = 0; i < 3; i++) {
        s_say_hello(&j, i);
    }
    for (int i = 0; i < 3; i++) {
        Zps__Header *h = s_take(&j.w[i], ZPS__MSG_TYPE__JOB);
        ck_assert_ptr_nonnull(h);
        ck_assert_uint_eq(h->job->micro_batch, DET_M);
        j.rank[i] = h->job->rank;
        zps__header__free_unpacked(h, NULL);
    }
    const zps_plan *p = zps_coord_plan(j.c);
    ck_assert_uint_eq(p->n, 3);
    ck_assert_uint_eq(p->slices[0].count, 24);
    ck_assert_uint_eq(p->slices[1].count, 24);
    ck_assert_uint_eq(p->slices[2].count, 16);
    // Rank 0's 24 late, handed to ranks 1 and 2: 8 and 16, not 12 and 12.
    bool helper[ZPS_MAX_MEMBERS] = {false};
    helper[j.rank[1]] = helper[j.rank[2]] = true;
    ck_assert(zps_coord_speculate(j.c, &j.out, 0, 0, 24, j.rank[0], helper));
    s_members_post(&j);
    uint32_t gen = 0, got1 = s_extras_to(&j, 1, 0, &gen), got2 = s_extras_to(&j, 2, 0, &gen);
    ck_assert_uint_eq(got1 % DET_M, 0);
    ck_assert_uint_eq(got2 % DET_M, 0);
    ck_assert_uint_eq(got1 + got2, 24);
    ck_assert_uint_gt(got1 * got2, 0);
    s_members_teardown(&j);

    s_det_setup(&j, 2);
    ck_assert_int_eq(s_hello_share(&j, 0, 27), ZPS_OK); // rounded to 24
    ck_assert_int_eq(s_hello_share(&j, 1, 0), ZPS_OK);
    p = zps_coord_plan(j.c);
    ck_assert_ptr_nonnull(p);
    ck_assert_uint_eq(p->slices[0].count, 24);
    ck_assert_uint_eq(p->slices[1].count, 40);
    s_members_teardown(&j);
}
END_TEST

// --adaptive-split: rank 0 computes 5 x as fast as rank 1; by samples the
// shares would be 53 + 11, in micro-batches of 8 they are 48 + 16.
START_TEST(test_coord_deterministic_adaptive_shares_are_whole_micro_batches)
{
    mjob j;
    zps_coord_cfg cfg = s_members_cfg(2);
    cfg.global_batch = DET_B;
    cfg.micro_batch = DET_M;
    cfg.adaptive_split = true;
    s_members_setup_cfg(&j, &cfg);
    s_say_hello(&j, 0);
    s_say_hello(&j, 1);
    (void)s_take_job_of(&j, 0);
    (void)s_take_job_of(&j, 1);
    for (uint64_t t = 0; t < 20; t++) {
        s_release(&j, t);
        zps_coord_note_push(j.c, t, 0, DET_B / 2, 4.0f, s_clock_now + 4);
        zps_coord_note_push(j.c, t, 1, DET_B / 2, 20.0f, s_clock_now + 20);
        s_clock_now += 21;
        j.counted[0] = j.counted[1] = DET_B / 2;
        s_step_done_on(&j, t);
        zps_coord_adapt(j.c);
    }
    s_release(&j, 20);
    const zps_plan *p = zps_coord_plan(j.c);
    ck_assert_uint_eq(p->n, 2);
    ck_assert_uint_eq(p->slices[0].count, 48);
    ck_assert_uint_eq(p->slices[1].count, 16);
    s_members_teardown(&j);
}
END_TEST

// Eight members have a micro-batch each: a ninth is refused in one line,
// and the plan keeps eight.
START_TEST(test_coord_deterministic_member_beyond_b_over_m_is_refused)
{
    mjob j;
    zps_coord_cfg cfg = s_members_cfg(2);
    cfg.global_batch = 2 * DET_M; // two micro-batches
    cfg.micro_batch = DET_M;
    s_members_setup_cfg(&j, &cfg);
    s_say_hello(&j, 0);
    s_say_hello(&j, 1);
    (void)s_take_job_of(&j, 0);
    (void)s_take_job_of(&j, 1);
    ck_assert_int_eq(s_hello_share(&j, 2, 0), ZPS_EINVAL); // a joiner: no micro-batch left
    s_assert_refused(&j, 2, "2 micro-batches of 8");
    s_release(&j, 1);
    ck_assert_uint_eq(zps_coord_plan(j.c)->n, 2);
    s_members_teardown(&j);
}
END_TEST

// The job's first member computes on a CPU: a GPU worker is refused (its
// kernels differ), another CPU one admitted.
START_TEST(test_coord_deterministic_device_class_mismatch_is_refused)
{
    mjob j;
    s_det_setup(&j, 2);
    ck_assert_int_eq(s_hello_on(&j, 0, 0, "cpu"), ZPS_OK);
    ck_assert_int_eq(s_hello_on(&j, 1, 0, "cuda:0"), ZPS_EINVAL);
    s_assert_refused(&j, 1, "their kernels differ");
    ck_assert_ptr_null(zps_coord_plan(j.c));
    ck_assert_int_eq(s_hello_on(&j, 1, 0, "cpu"), ZPS_OK);
    ck_assert_ptr_nonnull(zps_coord_plan(j.c));
    s_members_teardown(&j);
    // Not deterministic: both classes are admitted.
    s_members_setup(&j, 2);
    ck_assert_int_eq(s_hello_on(&j, 0, 0, "cpu"), ZPS_OK);
    ck_assert_int_eq(s_hello_on(&j, 1, 0, "cuda:0"), ZPS_OK);
    s_members_teardown(&j);
}
END_TEST

// ---------------------------------------------------------------------------
// Recovery: a coordinator restarted from its saved job state.

// The job of s_start_two saved at step 5, and a new coordinator resumed
// from it: RECOVERING until both workers call back.
static void s_resumed_two(mjob *j, mjob *r, const char *dir)
{
    s_start_two(j);
    ck_assert_int_eq(zps_coord_save(j->c, dir, 5), ZPS_OK);
    zps_coord_cfg cfg = s_members_cfg(2);
    s_members_setup_cfg(r, &cfg);
    ck_assert_int_eq(zps_coord_resume(r->c, dir, 5), ZPS_OK);
    ck_assert_uint_eq(zps_coord_at(r->c), ZPS_AT_RECOVERING);
    ck_assert_uint_eq(zps_coord_job_id(r->c), zps_coord_job_id(j->c));
    for (int i = 0; i < 2; i++) {
        r->id[i] = j->id[i];
        r->rank[i] = j->rank[i];
    }
}

// Worker i's first heartbeat to the restarted coordinator, from its main
// socket: the coordinator learns its route again.
static void s_call_back(mjob *r, int i)
{
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__HEARTBEAT);
    h.member_id = r->id[i];
    h.rank = r->rank[i];
    h.flags = 1;
    zps_wire_msg m = s_from(&r->w[i], &h);
    ck_assert_int_eq(zps_coord_on_heartbeat(r->c, &r->out, &m), ZPS_OK);
    s_msg_done(&m);
    s_members_post(r);
}

START_TEST(test_coord_resumed_rolls_everyone_back_once_every_worker_called_back)
{
    char dir[64];
    zps_tmpdir_make(dir, sizeof dir, "check-coord");
    mjob j, r;
    s_resumed_two(&j, &r, dir);
    s_call_back(&r, 0);
    uint64_t step;
    ck_assert(!zps_coord_take_rollback(r.c, &step)); // rank 1 not yet back
    ck_assert(!s_got(&r.w[0], ZPS__MSG_TYPE__ROLLBACK));
    s_call_back(&r, 1);
    ck_assert(zps_coord_take_rollback(r.c, &step));
    ck_assert_uint_eq(step, 5);
    ck_assert_uint_eq(zps_coord_at(r.c), ZPS_AT_TRAINING);
    for (int i = 0; i < 2; i++) {
        Zps__Header *rb = s_take(&r.w[i], ZPS__MSG_TYPE__ROLLBACK);
        ck_assert_msg(rb != NULL, "worker %d got no ROLLBACK", i);
        ck_assert_uint_eq(rb->step, 5);
        ck_assert_uint_gt(rb->plan->generation, 1000); // above any plan made before the crash
        zps__header__free_unpacked(rb, NULL);
    }
    s_members_teardown(&r);
    s_members_teardown(&j);
    ck_assert_int_eq(zps_tmpdir_remove(dir), 0);
}
END_TEST

// A requeued job: its workers are new processes, and the members of
// before will not call back. The new ones are admitted while it recovers,
// and once they make --workers every one starts at the restored step
// together, in one plan of the job's shares, without waiting out the
// members of before (who are evicted, having no share).
// Two new workers (2 and 3) come to r, resumed at step 5: the first
// waits, the second makes --workers, and both start at step 5 together,
// in the job's even split of the two of them.
static void s_new_workers_start_at_5(mjob *r)
{
    ck_assert_int_eq(s_hello_share(r, 2, 0), ZPS_OK);
    ck_assert_uint_eq(zps_coord_at(r->c), ZPS_AT_RECOVERING); // one of two: it waits
    ck_assert(!s_has_job_yet(r, 2));
    ck_assert_int_eq(s_hello_share(r, 3, 0), ZPS_OK); // no clock moved: no timeout
    ck_assert_uint_eq(zps_coord_at(r->c), ZPS_AT_TRAINING);
    uint64_t step;
    ck_assert(zps_coord_take_rollback(r->c, &step));
    ck_assert_uint_eq(step, 5);
    ck_assert_uint_eq(s_take_job_of(r, 2), 5); // both from the restored step
    ck_assert_uint_eq(s_take_job_of(r, 3), 5);
    const zps_plan *p = zps_coord_plan(r->c);
    ck_assert_ptr_nonnull(p);
    ck_assert_uint_eq(p->n, 2); // the two of them, the job's even split
    ck_assert_uint_eq(p->slices[0].count, MB / 2);
    ck_assert_uint_eq(p->slices[1].count, MB / 2);
    for (uint32_t k = 0; k < p->n; k++) {
        ck_assert(p->slices[k].rank == r->rank[2] || p->slices[k].rank == r->rank[3]);
    }
}

START_TEST(test_coord_resumed_starts_new_workers_together_once_they_make_the_jobs_workers)
{
    char dir[64];
    zps_tmpdir_make(dir, sizeof dir, "check-coord");
    mjob j, r;
    s_resumed_two(&j, &r, dir);
    s_new_workers_start_at_5(&r);
    s_members_teardown(&r);
    s_members_teardown(&j);
    ck_assert_int_eq(zps_tmpdir_remove(dir), 0);
}
END_TEST

// A requeue stops every process at once: the workers' BYEs may reach
// shard 0 before its own SIGTERM, and the job state it saves then has no
// live member. That state resumes all the same (its members planned until
// workers come), and the new workers start at its step, in a plan of
// their own.
START_TEST(test_coord_resumed_from_a_state_every_member_had_left_starts_the_new_workers)
{
    char dir[64];
    zps_tmpdir_make(dir, sizeof dir, "check-coord");
    mjob j, r;
    s_start_two(&j);
    s_bye_of(&j, 0, 5);
    s_bye_of(&j, 1, 5);
    ck_assert_int_eq(zps_coord_save(j.c, dir, 5), ZPS_OK);
    zps_coord_cfg cfg = s_members_cfg(2);
    s_members_setup_cfg(&r, &cfg);
    ck_assert_int_eq(zps_coord_resume(r.c, dir, 5), ZPS_OK);
    ck_assert_uint_eq(zps_coord_at(r.c), ZPS_AT_RECOVERING);
    s_new_workers_start_at_5(&r);
    s_members_teardown(&r);
    s_members_teardown(&j);
    ck_assert_int_eq(zps_tmpdir_remove(dir), 0);
}
END_TEST

START_TEST(test_coord_resumed_evicts_a_worker_that_does_not_call_back_in_time)
{
    char dir[64];
    zps_tmpdir_make(dir, sizeof dir, "check-coord");
    mjob j, r;
    s_resumed_two(&j, &r, dir);
    s_call_back(&r, 0);
    for (int k = 0; k < 100 && zps_coord_at(r.c) == ZPS_AT_RECOVERING; k++) {
        s_clock_now += 10; // past worker_timeout_ms within the loop
        s_beat_of(&r, 0);
        s_tick(&r);
    }
    ck_assert_uint_eq(zps_coord_at(r.c), ZPS_AT_TRAINING);
    uint64_t step;
    ck_assert(zps_coord_take_rollback(r.c, &step));
    ck_assert_uint_eq(step, 5);
    const zps_plan *p = zps_coord_plan(r.c);
    ck_assert_uint_eq(p->n, 1); // the replay goes on with rank 0 alone
    ck_assert_uint_eq(p->slices[0].rank, r.rank[0]);
    ck_assert(s_got(&r.w[0], ZPS__MSG_TYPE__ROLLBACK));
    s_members_teardown(&r);
    s_members_teardown(&j);
    ck_assert_int_eq(zps_tmpdir_remove(dir), 0);
}
END_TEST

// A resumed job's summary is this start's: the steps it trained and the
// time since it rolled back, not the job's steps over the monotonic clock
// (the machine's uptime) as when started_ms stayed 0; the job's first
// start (wall clock) and the number of starts come from the saved state.
START_TEST(test_coord_resumed_run_figures_are_this_starts_and_the_jobs_start_is_kept)
{
    char dir[64];
    zps_tmpdir_make(dir, sizeof dir, "check-coord");
    mjob j, r;
    s_resumed_two(&j, &r, dir);
    zps_coord_run first, run;
    zps_coord_run_figures(j.c, &first);
    ck_assert(first.training);
    ck_assert_uint_eq(first.starts, 1);
    ck_assert_uint_eq(first.from_step, 0);
    ck_assert_uint_eq(first.to_step, 5);
    ck_assert_uint_eq(first.steps, 5);
    ck_assert_uint_gt(first.job_started_unix_ms, 0);
    zps_coord_run_figures(r.c, &run);
    ck_assert(!run.training); // recovering: nothing trained yet
    ck_assert_uint_eq(run.from_step, 5);
    ck_assert_uint_eq(run.steps, 0);
    // The machine has been up long; the workers call back 30 ms apart.
    s_clock_now = 5e6;
    s_call_back(&r, 0);
    s_clock_now += 30;
    s_call_back(&r, 1);
    uint64_t step;
    ck_assert(zps_coord_take_rollback(r.c, &step));
    double resumed_ms = s_clock_now;
    for (uint64_t t = 5; t < 40; t++) { // total_steps: 40
        s_release(&r, t + 1);
        s_clock_now += 20;
        s_step_done_on(&r, t);
    }
    ck_assert_uint_eq(zps_coord_at(r.c), ZPS_AT_DONE);
    s_clock_now += 1000; // the summary's figures stop at the last step
    zps_coord_run_figures(r.c, &run);
    ck_assert(run.training);
    ck_assert_uint_eq(run.from_step, 5);
    ck_assert_uint_eq(run.to_step, 40);
    ck_assert_uint_eq(run.steps, 35);
    ck_assert_double_eq_tol(run.secs, 35 * 20 / 1e3, 1e-9);
    ck_assert_double_eq_tol(1e3 * run.secs / (double)run.steps, 20.0, 1e-9);
    ck_assert_double_eq_tol(run.secs, (s_clock_now - 1000 - resumed_ms) / 1e3, 1e-9);
    ck_assert_uint_eq(run.starts, 2);
    ck_assert_uint_eq(run.job_started_unix_ms, first.job_started_unix_ms);
    // Saved again, the next start is the third, of the same job start.
    ck_assert_int_eq(zps_coord_save(r.c, dir, 40), ZPS_OK);
    mjob r2;
    zps_coord_cfg cfg = s_members_cfg(2);
    s_members_setup_cfg(&r2, &cfg);
    ck_assert_int_eq(zps_coord_resume(r2.c, dir, 40), ZPS_OK);
    zps_coord_run_figures(r2.c, &run);
    ck_assert_uint_eq(run.starts, 3);
    ck_assert_uint_eq(run.job_started_unix_ms, first.job_started_unix_ms);
    s_members_teardown(&r2);
    s_members_teardown(&r);
    s_members_teardown(&j);
    ck_assert_int_eq(zps_tmpdir_remove(dir), 0);
}
END_TEST

// The job state of step 5 in dir as an older zps saved it: without the
// job's first start and the number of starts.
static void s_strip_to_old_record(const char *dir)
{
    static uint8_t buf[1u << 16];
    size_t len = 0;
    ck_assert_int_eq(zps_ckpt_read_record(dir, "coord-step-5.state", buf, sizeof buf, &len),
                     ZPS_OK);
    Zps__JobState *st = zps__job_state__unpack(NULL, len, buf);
    ck_assert_ptr_nonnull(st);
    ck_assert_uint_gt(st->first_started_unix_ms, 0);
    st->first_started_unix_ms = 0;
    st->starts = 0;
    len = zps__job_state__pack(st, buf);
    zps__job_state__free_unpacked(st, NULL);
    ck_assert_int_eq(zps_ckpt_write_secret(dir, "coord-step-5.state", buf, len), ZPS_OK);
}

// A job state of an older zps is still read: the job resumes, and what it
// did not save (its first start, its starts) is unknown, never made up.
START_TEST(test_coord_resumed_from_an_older_job_state_says_what_it_does_not_know)
{
    char dir[64];
    zps_tmpdir_make(dir, sizeof dir, "check-coord");
    mjob j, r;
    s_start_two(&j);
    ck_assert_int_eq(zps_coord_save(j.c, dir, 5), ZPS_OK);
    s_strip_to_old_record(dir);
    zps_coord_cfg cfg = s_members_cfg(2);
    s_members_setup_cfg(&r, &cfg);
    ck_assert_int_eq(zps_coord_resume(r.c, dir, 5), ZPS_OK);
    for (int i = 0; i < 2; i++) {
        r.id[i] = j.id[i];
        r.rank[i] = j.rank[i];
        s_call_back(&r, i);
    }
    uint64_t step;
    ck_assert(zps_coord_take_rollback(r.c, &step));
    for (uint64_t t = 5; t < 40; t++) {
        s_release(&r, t + 1);
        s_clock_now += 10;
        s_step_done_on(&r, t);
    }
    zps_coord_run run;
    zps_coord_run_figures(r.c, &run);
    ck_assert_uint_eq(run.steps, 35);
    ck_assert_double_eq_tol(run.secs, 0.35, 1e-9);
    ck_assert_uint_eq(run.starts, 0);
    ck_assert_uint_eq(run.job_started_unix_ms, 0);
    s_members_teardown(&r);
    s_members_teardown(&j);
    ck_assert_int_eq(zps_tmpdir_remove(dir), 0);
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
    tcase_add_test(tk, test_coord_norm_gathers_every_shards_part_once);
    suite_add_tcase(s, tk);
    TCase *mc = tcase_create("members");
    tcase_add_test(mc, test_coord_two_joins_within_a_step_make_one_plan_at_the_boundary);
    tcase_add_test(mc, test_coord_a_worker_is_sent_its_own_slice_only);
    tcase_add_test(mc, test_coord_eviction_during_a_join_hands_the_piece_to_an_active_member);
    tcase_add_test(mc, test_coord_a_member_heard_by_its_pushes_alone_is_not_evicted);
    tcase_add_test(mc, test_coord_a_member_is_evicted_at_the_first_tick_past_its_own_timeout);
    tcase_add_test(mc, test_coord_join_during_eviction_wakes_the_joiner_only_when_nobody_else_can);
    tcase_add_test(mc, test_coord_hello_whose_share_does_not_fit_is_refused_in_one_line_and_changes_nothing);
    tcase_add_test(mc, test_coord_hello_again_crossing_its_job_is_the_same_member_and_changes_nothing);
    tcase_add_test(mc, test_coord_bye_in_the_middle_hands_the_slice_on_and_replans_at_the_boundary);
    suite_add_tcase(s, mc);
    TCase *pc = tcase_create("policy");
    tcase_add_test(pc, test_coord_speculation_hands_a_late_slice_in_pieces_to_the_helpers_only);
    tcase_add_test(pc, test_coord_adaptive_split_gives_shares_by_throughput_at_the_next_boundary);
    suite_add_tcase(s, pc);
    TCase *dc = tcase_create("deterministic");
    tcase_add_test(dc, test_coord_deterministic_shares_and_pieces_are_whole_micro_batches);
    tcase_add_test(dc, test_coord_deterministic_adaptive_shares_are_whole_micro_batches);
    tcase_add_test(dc, test_coord_deterministic_member_beyond_b_over_m_is_refused);
    tcase_add_test(dc, test_coord_deterministic_device_class_mismatch_is_refused);
    suite_add_tcase(s, dc);
    TCase *rc = tcase_create("recovery");
    tcase_add_test(rc, test_coord_resumed_rolls_everyone_back_once_every_worker_called_back);
    tcase_add_test(rc, test_coord_resumed_evicts_a_worker_that_does_not_call_back_in_time);
    tcase_add_test(rc, test_coord_resumed_starts_new_workers_together_once_they_make_the_jobs_workers);
    tcase_add_test(rc, test_coord_resumed_from_a_state_every_member_had_left_starts_the_new_workers);
    tcase_add_test(rc, test_coord_resumed_run_figures_are_this_starts_and_the_jobs_start_is_kept);
    tcase_add_test(rc, test_coord_resumed_from_an_older_job_state_says_what_it_does_not_know);
    suite_add_tcase(s, rc);
    return s;
}
