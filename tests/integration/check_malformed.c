/* check_malformed.c - a running server gets every kind of bad message: each
 * is answered with an ERROR (or dropped), logged once and counted, and the
 * training run on that server then ends with exactly the parameters of a
 * run that never saw them. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/zps_clock.h"
#include "common/zps_model.h"
#include "common/zps_plan.h"
#include "common/zps_rng.h"
#include "common/zps_wire.h"
#include "zps_integration.h"
#include "zps_proc.h"

#define MODEL "mlp:784-512-512-10"

typedef struct peer {
    void *ctx, *sock;
} peer;

static peer s_connect(const char *endpoint)
{
    peer p = {.ctx = zmq_ctx_new()};
    p.sock = zps_wire_socket(p.ctx, ZMQ_DEALER, 5000);
    ck_assert_int_eq(zmq_connect(p.sock, endpoint), 0);
    return p;
}

static void s_close(peer *p)
{
    int zero = 0;
    zmq_setsockopt(p->sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_close(p->sock);
    zmq_ctx_term(p->ctx);
}

// Expects an ERROR reply; code < 0 accepts any code.
static void s_expect_error(peer *p, int code, const char *what)
{
    zps_wire_msg m;
    zps_err err = zps_wire_recv(p->sock, false, &m);
    ck_assert_msg(err == ZPS_OK, "%s: no decodable reply (%s)", what, zps_strerror(err));
    ck_assert_msg(m.hdr->type == ZPS__MSG_TYPE__ERROR, "%s: reply is %s, not ERROR", what,
                  zps_wire_type_name(m.hdr->type));
    ck_assert_msg(code < 0 || m.hdr->error_code == code, "%s: error %d (%s), expected %d", what,
                  m.hdr->error_code, m.hdr->error, code);
    ck_assert_msg(m.hdr->error && m.hdr->error[0], "%s: the error says nothing", what);
    zps_wire_msg_fini(&m);
}

static void s_send_raw(peer *p, const void *data, size_t len, bool more)
{
    ck_assert_int_ge(zmq_send(p->sock, data, len, more ? ZMQ_SNDMORE : 0), 0);
}

static void s_send_header(peer *p, Zps__Header *h, const void *payload, size_t bytes)
{
    ck_assert_int_eq(zps_wire_send(p->sock, NULL, h, payload, bytes, NULL), ZPS_OK);
}

static Zps__Header s_status(peer *p, uint64_t *bad)
{
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__STATUS);
    s_send_header(p, &h, NULL, 0);
    zps_wire_msg m;
    ck_assert_int_eq(zps_wire_recv(p->sock, false, &m), ZPS_OK);
    ck_assert_int_eq(m.hdr->type, ZPS__MSG_TYPE__STATUS_REPLY);
    Zps__Header out;
    zps__header__init(&out);
    out.job_id = m.hdr->job_id;
    out.step = m.hdr->status->step;
    out.generation = m.hdr->status->generation;
    *bad = m.hdr->status->bad_messages;
    zps_wire_msg_fini(&m);
    return out;
}

// Messages refused before the job starts (no job id needed).
static int s_send_garbage(peer *p)
{
    int sent = 0;
    zps_rng rng;
    zps_rng_seed(&rng, 99, 0);
    uint8_t junk[256];
    for (int i = 0; i < 3; i++) {
        for (size_t j = 0; j < sizeof junk; j++) {
            junk[j] = (uint8_t)zps_rng_next(&rng);
        }
        junk[0] = 0xff; // an invalid tag: never decodes
        s_send_raw(p, junk, 37 + 50 * i, i == 2);
        if (i == 2) {
            s_send_raw(p, junk, 100, false);
        }
        s_expect_error(p, ZPS_EPROTO, "random bytes");
        sent++;
    }
    s_send_raw(p, "", 0, false);
    s_expect_error(p, -1, "an empty frame");
    sent++;

    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__PUSH);
    h.job_id = 0x0102030405060708ull;
    h.step = 123456789;
    uint8_t buf[128];
    size_t len = zps__header__pack(&h, buf);
    s_send_raw(p, buf, len - 4, false);
    s_expect_error(p, ZPS_EPROTO, "a truncated header");
    sent++;

    zps_wire_header_init(&h, (Zps__MsgType)99);
    s_send_header(p, &h, NULL, 0);
    s_expect_error(p, -1, "an unknown type");
    sent++;

    zps_wire_header_init(&h, ZPS__MSG_TYPE__PARAMS);
    s_send_header(p, &h, NULL, 0);
    s_expect_error(p, ZPS_EPROTO, "a type the server never takes");
    sent++;

    zps_wire_header_init(&h, ZPS__MSG_TYPE__STATUS);
    h.version = ZPS_WIRE_VERSION + 7;
    s_send_header(p, &h, NULL, 0);
    s_expect_error(p, ZPS_EVERSION, "another protocol version");
    sent++;
    return sent;
}

// A PUSH of `count` floats at `offset` with `bytes` of payload.
static uint32_t s_generation = 1; // the plan generation in force, from STATUS

static void s_push(peer *p, uint64_t job, uint64_t step, uint32_t rank, uint64_t offset,
                   uint64_t count, size_t bytes)
{
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__PUSH);
    h.job_id = job;
    h.step = step;
    h.rank = rank;
    h.member_id = 12345;
    h.offset = offset;
    h.count = count;
    h.dtype = ZPS__DTYPE__F32;
    h.samples = 64;
    h.generation = s_generation;
    float *payload = calloc(1, bytes + 4);
    for (size_t i = 0; i < bytes / 4; i++) {
        payload[i] = 1e6f; // would wreck the parameters if it were ever applied
    }
    s_send_header(p, &h, payload, bytes);
    free(payload);
}

// Messages refused by a running job (they carry its id). Who sends them
// is checked first (server/zps_msgtab.h): a stranger's push is refused for
// its member id whatever else is wrong with it, so the shape checks behind
// it are the unit tests' (check_shard.c) and the fuzzer's to reach.
static int s_send_bad_pushes(peer *p, uint64_t job, uint64_t step, size_t n_params)
{
    s_push(p, job, step, 0, 0, 10, 36);
    s_expect_error(p, ZPS_ENOENT, "a wrong payload length from a stranger");
    s_push(p, job, step, 0, n_params, 1, 4);
    s_expect_error(p, ZPS_ENOENT, "an offset past the parameters from a stranger");
    s_push(p, job, step - 1, 0, 0, n_params, n_params * 4);
    s_expect_error(p, ZPS_ENOENT, "a stale step from a stranger");
    s_push(p, job, step, 7, 0, n_params, n_params * 4);
    s_expect_error(p, ZPS_ENOENT, "an unknown worker");
    s_push(p, job, step, 0, 0, n_params, n_params * 4);
    s_expect_error(p, ZPS_ENOENT, "a worker's rank with a wrong member id");
    s_push(p, job, step, ZPS_MAX_MEMBERS, 0, n_params, n_params * 4);
    s_expect_error(p, ZPS_ERANGE, "a rank past the last possible (once folded onto rank 0)");
    s_push(p, job ^ 1, step, 0, 0, n_params, n_params * 4);
    s_expect_error(p, ZPS_EJOB, "another job's id");

    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__PULL);
    h.job_id = job;
    h.rank = 3;
    s_send_header(p, &h, NULL, 0);
    s_expect_error(p, ZPS_ENOENT, "a PULL from an unknown worker");

    zps_wire_header_init(&h, ZPS__MSG_TYPE__HELLO);
    s_send_header(p, &h, NULL, 0);
    s_expect_error(p, ZPS_EPROTO, "a HELLO without its body");

    // An EVAL that would make the run's accuracy 1.0: its sender waits for
    // no answer, and gets none; it is counted.
    Zps__Eval ev = ZPS__EVAL__INIT;
    ev.count = ev.correct = 10000;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__EVAL);
    h.job_id = job;
    h.eval = &ev;
    s_send_header(p, &h, NULL, 0);
    return 10;
}

static void s_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

// zps-ctl status, a real process, shows the frozen job as it is.
static void s_check_ctl_status(zps_procs *ps, const char *endpoint, uint64_t step, uint64_t bad)
{
    const char *args[] = {"status", endpoint, NULL};
    pid_t ctl = zps_procs_start(ps, "zps-ctl", "ctl.out", args);
    ck_assert_int_eq(zps_procs_wait(ps, ctl, 10000), 0);
    FILE *f = fopen(zps_procs_path(ps, "ctl.out"), "r");
    ck_assert_ptr_nonnull(f);
    char text[4096];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    char want[128];
    snprintf(want, sizeof want, "step %llu/60", (unsigned long long)step);
    ck_assert_msg(strstr(text, want), "zps-ctl status lacks '%s':\n%s", want, text);
    snprintf(want, sizeof want, "refused messages %llu", (unsigned long long)bad);
    ck_assert_msg(strstr(text, want), "zps-ctl status lacks '%s':\n%s", want, text);
    ck_assert_msg(strstr(text, "training") && strstr(text, "members 1 of 1"),
                  "zps-ctl status:\n%s", text);
}

static const char *const s_server_args[] = {"--workers", "1", "--global-batch", "64", "--steps",
                                            "60", "--model", MODEL, "--seed", "5", NULL};

static pid_t s_worker(zps_procs *ps, const char *endpoint, const char *out, const char *log)
{
    const char *args[] = {"--coordinator", endpoint, "--save-params", zps_procs_path(ps, out),
                          "--cache-dir", ZPS_TEST_CACHE, NULL};
    return zps_procs_start(ps, "zps-worker", log, args);
}

START_TEST(test_malformed_messages_are_refused_and_training_is_unchanged)
{
    zps_procs ps;
    zps_procs_init(&ps, "malformed");
    zps_model_spec spec;
    ck_assert_int_eq(zps_model_parse(MODEL, &spec), ZPS_OK);

    pid_t server;
    char endpoint[256];
    snprintf(endpoint, sizeof endpoint, "%s",
             zps_procs_start_server(&ps, "server", &server, s_server_args, 10000));
    peer p = s_connect(endpoint);
    int sent = s_send_garbage(&p);
    uint64_t bad;
    s_status(&p, &bad);
    ck_assert_uint_eq(bad, (uint64_t)sent);

    // Freeze the job mid-run (the worker stopped between steps) so the bad
    // pushes meet a known step.
    pid_t worker = s_worker(&ps, endpoint, "attacked.bin", "attacked.log");
    Zps__Header st;
    double deadline = zps_clock_ms() + 60000;
    do {
        s_sleep_ms(20);
        st = s_status(&p, &bad);
        ck_assert(zps_clock_ms() < deadline);
    } while (st.step < 5);
    ck_assert_int_eq(kill(worker, SIGSTOP), 0);
    s_sleep_ms(300);
    st = s_status(&p, &bad);
    s_generation = st.generation;
    sent += s_send_bad_pushes(&p, st.job_id, st.step, spec.n_params);
    Zps__Header after = s_status(&p, &bad);
    ck_assert_uint_eq(after.step, st.step);
    ck_assert_uint_eq(bad, (uint64_t)sent);
    s_check_ctl_status(&ps, endpoint, st.step, bad);
    ck_assert_int_eq(kill(worker, SIGCONT), 0);

    ck_assert_int_eq(zps_procs_wait(&ps, worker, 120000), 0);
    s_close(&p);
    ck_assert_int_eq(zps_procs_wait(&ps, server, 30000), 0);

    // The same job on a fresh server that saw no bad message.
    snprintf(endpoint, sizeof endpoint, "%s",
             zps_procs_start_server(&ps, "server", &server, s_server_args, 10000));
    worker = s_worker(&ps, endpoint, "clean.bin", "clean.log");
    ck_assert_int_eq(zps_procs_wait(&ps, worker, 120000), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, server, 30000), 0);

    float *a, *b;
    ck_assert_uint_eq(zps_read_floats(zps_procs_path(&ps, "attacked.bin"), &a), spec.n_params);
    ck_assert_uint_eq(zps_read_floats(zps_procs_path(&ps, "clean.bin"), &b), spec.n_params);
    ck_assert_msg(memcmp(a, b, spec.n_params * sizeof(float)) == 0,
                  "bad messages changed the trained parameters");
    free(a);
    free(b);
    zps_procs_fini(&ps, false);
}
END_TEST

Suite *zps_suite_malformed(void)
{
    Suite *s = suite_create("malformed");
    TCase *tc = tcase_create("server");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_malformed_messages_are_refused_and_training_is_unchanged);
    suite_add_tcase(s, tc);
    return s;
}
