/* check_security.c - CurveZMQ: only the listed keys get in, each kind of
 * key does only its part (a worker key cannot be a shard, an operator key
 * can only ask for STATUS), SIGHUP re-reads the lists, and nothing of a
 * message can be read off the wire. Real processes on loopback. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/zps_clock.h"
#include "common/zps_curve.h"
#include "common/zps_wire.h"
#include "zps_integration.h"
#include "zps_proc.h"

static void s_keygen(zps_procs *ps, const char *name)
{
    char base[600];
    snprintf(base, sizeof base, "%s", zps_procs_path(ps, name));
    const char *args[] = {"keygen", base, NULL};
    pid_t p = zps_procs_start(ps, "zps-ctl", "keygen.log", args);
    ck_assert_int_eq(zps_procs_wait(ps, p, 10000), 0);
}

static bool s_file_has(zps_procs *ps, const char *name, const char *text, size_t len)
{
    FILE *f = fopen(zps_procs_path(ps, name), "rb");
    if (!f) {
        return false;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    bool found = false;
    for (size_t i = 0; !found && i + len <= got; i++) {
        found = memcmp(buf + i, text, len) == 0;
    }
    free(buf);
    return found;
}

// Server with CURVE (or not), `steps` steps, one worker per key in `keys`
// (NULL key: plain). Returns the server's endpoint (static).
static const char *s_server(zps_procs *ps, pid_t *pid, bool curve, const char *listen)
{
    static char ep[256];
    char secret[600], auth[600];
    snprintf(secret, sizeof secret, "%s", zps_procs_path(ps, "server.key"));
    snprintf(auth, sizeof auth, "%s", zps_procs_path(ps, "auth"));
    const char *args[] = {"--workers", "1", "--global-batch", "32", "--steps", "20",
                          "--listen", listen, curve ? "--curve-secret" : NULL, secret,
                          "--authorized-keys", auth, NULL};
    snprintf(ep, sizeof ep, "%s", zps_procs_start_server(ps, curve ? "server" : "plain", pid,
                                                         args, 10000));
    return ep;
}

static pid_t s_worker(zps_procs *ps, const char *ep, const char *key, const char *log)
{
    char secret[600], server[600];
    snprintf(secret, sizeof secret, "%s", zps_procs_path(ps, key ? key : "none"));
    snprintf(server, sizeof server, "%s", zps_procs_path(ps, "server.pub"));
    const char *args[] = {"--coordinator", ep, "--cache-dir", ZPS_TEST_CACHE,
                          "--join-timeout-ms", "3000", key ? "--curve-secret" : NULL, secret,
                          "--server-key", server, NULL};
    return zps_procs_start(ps, "zps-worker", log, args);
}

static void s_setup_keys(zps_procs *ps)
{
    s_keygen(ps, "server");
    s_keygen(ps, "good");
    s_keygen(ps, "bad");
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "mkdir -p %s/auth && cp %s/good.pub %s/server.pub %s/auth/", ps->dir,
             ps->dir, ps->dir, ps->dir);
    ck_assert_int_eq(zps_procs_sh(ps, cmd, "setup.log", 10000), 0);
}

START_TEST(test_security_unlisted_key_is_refused_listed_key_trains)
{
    zps_procs ps;
    zps_procs_init(&ps, "curve");
    s_setup_keys(&ps);
    pid_t server;
    char ep[256];
    snprintf(ep, sizeof ep, "%s", s_server(&ps, &server, true, "tcp://127.0.0.1:*"));
    // An unlisted key gets no job (its HELLO never reaches the server),
    // and neither does a worker without CURVE.
    pid_t bad = s_worker(&ps, ep, "bad.key", "bad.log");
    pid_t plain = s_worker(&ps, ep, NULL, "plain-worker.log");
    ck_assert_int_eq(zps_procs_wait(&ps, bad, 20000), 1);
    ck_assert_int_eq(zps_procs_wait(&ps, plain, 20000), 1);
    ck_assert(s_file_has(&ps, "bad.log", "waiting for the job to start", 28));
    ck_assert(s_file_has(&ps, "server.log", "its CURVE key is not authorized", 31));
    // zps-ctl with the unlisted key gets no status either.
    char bad_key[600], server_pub[600];
    snprintf(bad_key, sizeof bad_key, "%s", zps_procs_path(&ps, "bad.key"));
    snprintf(server_pub, sizeof server_pub, "%s", zps_procs_path(&ps, "server.pub"));
    const char *ctl[] = {"status", ep, "--curve-secret", bad_key, "--server-key", server_pub,
                         NULL};
    pid_t c = zps_procs_start(&ps, "zps-ctl", "ctl.log", ctl);
    ck_assert_int_eq(zps_procs_wait(&ps, c, 10000), 1);
    // The listed key trains the job to its end.
    pid_t good = s_worker(&ps, ep, "good.key", "good.log");
    ck_assert_int_eq(zps_procs_wait(&ps, good, 60000), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, server, 30000), 0);
    zps_procs_fini(&ps, false);
}
END_TEST

// A CURVE client in this process, with the key pair `key` (a NAME of
// s_keygen), as a peer that holds that key would be.
typedef struct client {
    void *ctx, *sock;
} client;

static client s_client(zps_procs *ps, const char *ep, const char *key)
{
    char secret[600], server[600];
    snprintf(secret, sizeof secret, "%s.key", zps_procs_path(ps, key));
    snprintf(server, sizeof server, "%s", zps_procs_path(ps, "server.pub"));
    zps_curve curve;
    ck_assert_int_eq(zps_curve_load(&curve, secret, server), ZPS_OK);
    client c = {.ctx = zmq_ctx_new()};
    c.sock = zps_wire_socket(c.ctx, ZMQ_DEALER, 3000);
    ck_assert_int_eq(zps_curve_client(&curve, c.sock), ZPS_OK);
    ck_assert_int_eq(zmq_connect(c.sock, ep), 0);
    return c;
}

static void s_client_close(client *c)
{
    int zero = 0;
    zmq_setsockopt(c->sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_close(c->sock);
    zmq_ctx_term(c->ctx);
}

// Sends a bare message of `type` and returns the answer's type, and its
// code if it is an ERROR (-1 without an answer within the socket's 3 s).
static int s_ask(client *c, Zps__MsgType type, int *code)
{
    Zps__Register reg = ZPS__REGISTER__INIT;
    reg.index = 1;
    reg.shards = 2;
    reg.endpoint = "tcp://127.0.0.1:9";
    Zps__Hello hello = ZPS__HELLO__INIT;
    hello.host = "test";
    Zps__Header h;
    zps_wire_header_init(&h, type);
    h.shard = 1;
    h.registration = &reg;
    h.hello = &hello;
    ck_assert_int_eq(zps_wire_send(c->sock, NULL, &h, NULL, 0, NULL), ZPS_OK);
    zps_wire_msg m;
    int got = -1;
    if (zps_wire_recv(c->sock, false, &m) == ZPS_OK) {
        got = (int)m.hdr->type;
        *code = m.hdr->error_code;
    }
    zps_wire_msg_fini(&m);
    return got;
}

static int s_ctl_status(zps_procs *ps, const char *ep, const char *key, const char *log)
{
    char secret[600], server_pub[600];
    snprintf(secret, sizeof secret, "%s.key", zps_procs_path(ps, key));
    snprintf(server_pub, sizeof server_pub, "%s", zps_procs_path(ps, "server.pub"));
    const char *ctl[] = {"status", ep, "--curve-secret", secret, "--server-key", server_pub,
                         NULL};
    pid_t c = zps_procs_start(ps, "zps-ctl", log, ctl);
    return zps_procs_wait(ps, c, 20000);
}

// A shard started with the key pair `key`, listening with the same key.
static pid_t s_shard1(zps_procs *ps, const char *ep, const char *key, const char *tag)
{
    char secret[600], server_pub[600], auth[600];
    snprintf(secret, sizeof secret, "%s.key", zps_procs_path(ps, key));
    snprintf(server_pub, sizeof server_pub, "%s", zps_procs_path(ps, "server.pub"));
    snprintf(auth, sizeof auth, "%s", zps_procs_path(ps, "workers"));
    const char *args[] = {"--shard", "1", "--shards", "2", "--coordinator", ep,
                          "--curve-secret", secret, "--server-key", server_pub,
                          "--authorized-keys", auth, NULL};
    pid_t pid;
    (void)zps_procs_start_server(ps, tag, &pid, args, 10000);
    return pid;
}

START_TEST(test_security_each_kind_of_key_does_only_its_part)
{
    zps_procs ps;
    zps_procs_init(&ps, "roles");
    const char *names[] = {"server", "worker", "shard", "operator"};
    for (int i = 0; i < 4; i++) {
        s_keygen(&ps, names[i]);
    }
    char cmd[1600];
    snprintf(cmd, sizeof cmd,
             "cd %s && mkdir -p workers shards operators && cp worker.pub workers/ && "
             "cp shard.pub shards/",
             ps.dir);
    ck_assert_int_eq(zps_procs_sh(&ps, cmd, "setup.log", 10000), 0);
    char secret[600], workers[600], shards[600], operators[600];
    snprintf(secret, sizeof secret, "%s", zps_procs_path(&ps, "server.key"));
    snprintf(workers, sizeof workers, "%s", zps_procs_path(&ps, "workers"));
    snprintf(shards, sizeof shards, "%s", zps_procs_path(&ps, "shards"));
    snprintf(operators, sizeof operators, "%s", zps_procs_path(&ps, "operators"));
    const char *args[] = {"--shards", "2", "--workers", "1", "--global-batch", "32",
                          "--steps", "20", "--curve-secret", secret, "--authorized-keys",
                          workers, "--shard-keys", shards, "--operator-keys", operators, NULL};
    pid_t server;
    char ep[256];
    snprintf(ep, sizeof ep, "%s", zps_procs_start_server(&ps, "server", &server, args, 10000));

    // A worker key cannot register as a shard: that shard is refused and
    // says why.
    pid_t impostor = s_shard1(&ps, ep, "worker", "impostor");
    ck_assert_int_eq(zps_procs_wait(&ps, impostor, 20000), 1);
    ck_assert(zps_procs_log_has(&ps, "impostor.log", "a worker key"));
    ck_assert(zps_procs_log_has(&ps, "impostor.log", "may not send REGISTER"));

    // The operator key is not listed yet: no answer at all. Listed, and the
    // lists re-read on SIGHUP, it gets STATUS, and only that.
    ck_assert_int_eq(s_ctl_status(&ps, ep, "operator", "ctl-unlisted.log"), 1);
    snprintf(cmd, sizeof cmd, "cp %s/operator.pub %s/", ps.dir, operators);
    ck_assert_int_eq(zps_procs_sh(&ps, cmd, "setup.log", 10000), 0);
    ck_assert_int_eq(kill(server, SIGHUP), 0);
    double deadline = zps_clock_ms() + 10000;
    while (!zps_procs_log_has(&ps, "server.log", "1 operator key(s)")) {
        ck_assert_msg(zps_clock_ms() < deadline, "SIGHUP did not re-read the operator keys");
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    ck_assert_int_eq(s_ctl_status(&ps, ep, "operator", "ctl-listed.log"), 0);
    client op = s_client(&ps, ep, "operator");
    int code = 0;
    ck_assert_int_eq(s_ask(&op, ZPS__MSG_TYPE__STATUS, &code), ZPS__MSG_TYPE__STATUS_REPLY);
    ck_assert_int_eq(s_ask(&op, ZPS__MSG_TYPE__HELLO, &code), ZPS__MSG_TYPE__ERROR);
    ck_assert_int_eq(code, ZPS_EPERM);
    ck_assert_int_eq(s_ask(&op, ZPS__MSG_TYPE__REGISTER, &code), ZPS__MSG_TYPE__ERROR);
    ck_assert_int_eq(code, ZPS_EPERM);
    ck_assert_int_eq(s_ask(&op, ZPS__MSG_TYPE__PULL, &code), ZPS__MSG_TYPE__ERROR);
    ck_assert_int_eq(code, ZPS_EPERM);
    s_client_close(&op);
    // Nor may a worker key register by hand.
    client wk = s_client(&ps, ep, "worker");
    ck_assert_int_eq(s_ask(&wk, ZPS__MSG_TYPE__REGISTER, &code), ZPS__MSG_TYPE__ERROR);
    ck_assert_int_eq(code, ZPS_EPERM);
    s_client_close(&wk);

    // The shard key serves shard 1, the worker key trains the job to its end.
    pid_t shard = s_shard1(&ps, ep, "shard", "shard1");
    pid_t w = s_worker(&ps, ep, "worker.key", "worker.log");
    ck_assert_int_eq(zps_procs_wait(&ps, w, 60000), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, shard, 30000), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, server, 30000), 0);
    zps_procs_fini(&ps, false);
}
END_TEST

// Captures the port with tcpdump while a job trains: the job's strings
// (model, dataset) must be on the wire of a plain run and absent from an
// encrypted one.
START_TEST(test_security_capture_of_encrypted_run_shows_no_plaintext)
{
    if (geteuid() != 0 || access("/usr/bin/tcpdump", X_OK) != 0) {
        fprintf(stderr, "SKIPPED: test_security_capture_of_encrypted_run_shows_no_plaintext "
                        "needs root and /usr/bin/tcpdump\n");
        return;
    }
    zps_procs ps;
    zps_procs_init(&ps, "capture");
    s_setup_keys(&ps);
    const char *names[2] = {"plain", "curve"};
    for (int run = 0; run < 2; run++) {
        int port = zps_free_port();
        char listen[64], cmd[1200], pcap[64];
        snprintf(listen, sizeof listen, "tcp://127.0.0.1:%d", port);
        snprintf(pcap, sizeof pcap, "%s.pcap", names[run]);
        snprintf(cmd, sizeof cmd, "-i lo -U -n -w %s tcp port %d", zps_procs_path(&ps, pcap), port);
        char *argv[16];
        int argc = 0;
        for (char *t = strtok(cmd, " "); t && argc < 15; t = strtok(NULL, " ")) {
            argv[argc++] = t;
        }
        argv[argc] = NULL;
        // zps_procs_start runs $ZPS_BIN_DIR/PROG: /usr/bin for tcpdump only,
        // then back to the binaries under test (make test SAN=1 sets it).
        const char *bins = getenv("ZPS_BIN_DIR");
        char *saved = bins ? strdup(bins) : NULL;
        setenv("ZPS_BIN_DIR", "/usr/bin", 1);
        char log[32];
        snprintf(log, sizeof log, "tcpdump-%s.log", names[run]);
        pid_t dump = zps_procs_start(&ps, "tcpdump", log, (const char *const *)argv);
        if (saved) {
            setenv("ZPS_BIN_DIR", saved, 1);
            free(saved);
        } else {
            unsetenv("ZPS_BIN_DIR");
        }
        struct timespec ts = {1, 0}; // tcpdump needs a moment to listen
        nanosleep(&ts, NULL);
        pid_t server;
        char ep[256];
        snprintf(ep, sizeof ep, "%s", s_server(&ps, &server, run == 1, listen));
        pid_t w = s_worker(&ps, ep, run == 1 ? "good.key" : NULL, "w.log");
        ck_assert_int_eq(zps_procs_wait(&ps, w, 60000), 0);
        ck_assert_int_eq(zps_procs_wait(&ps, server, 30000), 0);
        nanosleep(&ts, NULL);
        kill(dump, SIGINT);
        zps_procs_wait(&ps, dump, 10000);
        bool model = s_file_has(&ps, pcap, "mlp:784-512-512-10", 18);
        bool dataset = s_file_has(&ps, pcap, "fashion-mnist", 13);
        fprintf(stderr, "%s run: model string on the wire %s, dataset string %s\n", names[run],
                model ? "yes" : "no", dataset ? "yes" : "no");
        if (run == 0) {
            ck_assert_msg(model && dataset, "the capture missed the plain run's job");
        } else {
            ck_assert_msg(!model && !dataset, "the encrypted run shows plaintext");
        }
    }
    zps_procs_fini(&ps, false);
}
END_TEST

Suite *zps_suite_security(void)
{
    Suite *s = suite_create("security");
    TCase *tc = tcase_create("curve");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_security_unlisted_key_is_refused_listed_key_trains);
    tcase_add_test(tc, test_security_each_kind_of_key_does_only_its_part);
    tcase_add_test(tc, test_security_capture_of_encrypted_run_shows_no_plaintext);
    suite_add_tcase(s, tc);
    return s;
}
