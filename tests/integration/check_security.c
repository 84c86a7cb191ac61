/* check_security.c - CurveZMQ: only the listed keys get in, and nothing of
 * a message can be read off the wire. Real processes on loopback. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
    tcase_add_test(tc, test_security_capture_of_encrypted_run_shows_no_plaintext);
    suite_add_tcase(s, tc);
    return s;
}
