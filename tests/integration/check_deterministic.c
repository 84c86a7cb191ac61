/* check_deterministic.c - --deterministic --micro-batch M with real
 * processes: each startup refusal exits 2 with its one line and starts
 * nothing; the default job trained by one worker and by two of uneven
 * shares ends with the same bytes, and status says the mode. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/zps_model.h"
#include "zps_http_get.h"
#include "zps_integration.h"
#include "zps_proc.h"

#define MODEL "mlp:784-512-512-10" // zps-server's default model
#define STEPS "30"
#define RUN_TIMEOUT_MS 180000

// ---------------------------------------------------------------------------
// Refusals.

typedef struct refusal {
    const char *args[8]; // besides --listen and --endpoint-file, NULL-terminated
    const char *line;    // what its one line says
} refusal;

static const refusal s_refusals[] = {
    {{"--deterministic", NULL}, "--deterministic and --micro-batch go together"},
    {{"--micro-batch", "8", NULL}, "--deterministic and --micro-batch go together"},
    {{"--deterministic", "--micro-batch", "7", "--global-batch", "64", NULL},
     "--global-batch 64 is not a whole number of --micro-batch 7"},
    {{"--deterministic", "--micro-batch", "8", "--global-batch", "64", "--workers", "9", NULL},
     "--workers 9 is more than the 8 micro-batches of 8"},
    {{"--deterministic", "--micro-batch", "8", "--mode", "diloco", NULL},
     "--deterministic takes no --mode diloco"},
    {{"--deterministic", "--micro-batch", "8", "--compress", "int8", NULL},
     "--deterministic takes no --compress"},
    {{"--deterministic", "--micro-batch", "8", "--wire-dtype", "bf16", NULL},
     "--deterministic takes no --wire-dtype other than fp32"},
};

START_TEST(test_deterministic_startup_refusals_exit_2_with_one_line)
{
    zps_procs ps;
    zps_procs_init(&ps, "det-refuse");
    for (size_t i = 0; i < sizeof s_refusals / sizeof s_refusals[0]; i++) {
        const refusal *r = &s_refusals[i];
        char log[32], ep_file[32];
        snprintf(log, sizeof log, "refusal-%zu.log", i);
        snprintf(ep_file, sizeof ep_file, "refusal-%zu.ep", i);
        const char *args[16] = {"--listen", "tcp://127.0.0.1:*", "--endpoint-file",
                                zps_procs_path(&ps, ep_file)};
        size_t n = 4;
        for (size_t k = 0; r->args[k]; k++) {
            args[n++] = r->args[k];
        }
        args[n] = NULL;
        pid_t s = zps_procs_start(&ps, "zps-server", log, args);
        ck_assert_int_eq(zps_procs_wait(&ps, s, 10000), 2);
        ck_assert_msg(zps_procs_log_has(&ps, log, r->line), "refusal %zu lacks '%s'", i, r->line);
        ck_assert_msg(zps_procs_log_count(&ps, log, "") == 1, "refusal %zu: not one line", i);
        // Nothing started: it never listened.
        ck_assert_msg(access(zps_procs_path(&ps, ep_file), F_OK) != 0,
                      "refusal %zu wrote an endpoint", i);
    }
    zps_procs_fini(&ps, false);
}
END_TEST

// ---------------------------------------------------------------------------
// Runs.

// While shard 0 at ep (HTTP on port) waits for its workers: zps-ctl status
// and /status say the mode and M.
static void s_check_status(zps_procs *ps, const char *ep, int port)
{
    const char *args[] = {"status", ep, NULL};
    pid_t ctl = zps_procs_start(ps, "zps-ctl", "status.out", args);
    ck_assert_int_eq(zps_procs_wait(ps, ctl, 10000), 0);
    ck_assert_msg(zps_procs_log_has(ps, "status.out",
                                    "global batch 64 (deterministic, micro-batches of 8)"),
                  "zps-ctl status does not say the mode");
    char *body = zps_http_get(port, "/status");
    ck_assert_ptr_nonnull(body);
    json_t *st = json_loads(body, 0, NULL);
    ck_assert_ptr_nonnull(st);
    ck_assert_str_eq(json_string_value(json_object_get(st, "mode")), "deterministic");
    ck_assert_int_eq(json_integer_value(json_object_get(st, "micro_batch")), 8);
    json_decref(st);
    free(body);
}

// Trains the default job, B = 64, M = 8, STEPS steps with one worker per
// share (NULL: no --share); each saves its parameters as <tag>-w<i>.bin.
static void s_run(zps_procs *ps, const char *tag, int workers, const char *const *shares)
{
    char n[8], log[64], http[32];
    int port = zps_free_port();
    snprintf(n, sizeof n, "%d", workers);
    snprintf(log, sizeof log, "%s-s0", tag);
    snprintf(http, sizeof http, "127.0.0.1:%d", port);
    const char *sargs[] = {"--workers", n, "--global-batch", "64", "--steps", STEPS,
                           "--seed", "3", "--deterministic", "--micro-batch", "8",
                           "--http", http, NULL};
    pid_t s;
    char ep[256];
    snprintf(ep, sizeof ep, "%s", zps_procs_start_server(ps, log, &s, sargs, 10000));
    if (workers > 1) {
        s_check_status(ps, ep, port);
    }
    pid_t w[2];
    for (int i = 0; i < workers; i++) {
        char out[64];
        snprintf(out, sizeof out, "%s-w%d.bin", tag, i);
        snprintf(log, sizeof log, "%s-w%d.log", tag, i);
        const char *wargs[] = {"--coordinator", ep, "--save-params", zps_procs_path(ps, out),
                               "--cache-dir", ZPS_TEST_CACHE, "--timeout-ms", "30000",
                               shares[i] ? "--share" : NULL, shares[i], NULL};
        w[i] = zps_procs_start(ps, "zps-worker", log, wargs);
    }
    for (int i = 0; i < workers; i++) {
        ck_assert_msg(zps_procs_wait(ps, w[i], RUN_TIMEOUT_MS) == 0, "%s: worker %d failed", tag,
                      i);
    }
    ck_assert_msg(zps_procs_wait(ps, s, 30000) == 0, "%s: the server failed", tag);
}

// The promise: one worker, or two of 24 + 40 samples (3 + 5 micro-batches),
// end with the same bytes (cmp), which moved from the initial ones.
START_TEST(test_deterministic_one_worker_and_two_uneven_end_byte_equal)
{
    zps_procs ps;
    zps_procs_init(&ps, "det-runs");
    zps_model_spec spec;
    ck_assert_int_eq(zps_model_parse(MODEL, &spec), ZPS_OK);
    const char *none[1] = {NULL}, *uneven[2] = {"24", "40"};
    s_run(&ps, "one", 1, none);
    s_run(&ps, "two", 2, uneven);
    char cmd[1024];
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "cmp '%s' '%s'", zps_procs_path(&ps, "one-w0.bin"),
                 i ? zps_procs_path(&ps, "two-w1.bin") : zps_procs_path(&ps, "two-w0.bin"));
        ck_assert_msg(zps_procs_sh(&ps, cmd, "cmp.log", 10000) == 0,
                      "one worker and rank %d of two differ", i);
    }
    float *p = zps_procs_load_params(&ps, "one-w0.bin", spec.n_params);
    float *init = malloc(spec.n_params * sizeof(float));
    zps_model_init_params(&spec, 3, init);
    // The runs trained: otherwise equality would prove nothing.
    ck_assert_double_gt(zps_max_abs_diff(p, init, spec.n_params), 1e-3);
    free(p);
    free(init);
    zps_procs_fini(&ps, false);
}
END_TEST

Suite *zps_suite_deterministic(void)
{
    Suite *s = suite_create("deterministic");
    TCase *tr = tcase_create("refusals");
    tcase_set_timeout(tr, 120);
    tcase_add_test(tr, test_deterministic_startup_refusals_exit_2_with_one_line);
    suite_add_tcase(s, tr);
    TCase *tc = tcase_create("runs");
    tcase_set_timeout(tc, 420);
    tcase_add_test(tc, test_deterministic_one_worker_and_two_uneven_end_byte_equal);
    suite_add_tcase(s, tc);
    return s;
}
