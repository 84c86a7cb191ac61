/* check_clip.c - --clip-grad-norm with real server and worker processes:
 * the shards learn the whole model's gradient norm before any updates, and
 * the norm is an exact sum, so 1, 2 and 3 shards end with the same bits;
 * the clip was active (an unclipped run ends elsewhere, every step's norm
 * in the metrics log is above the limit); /status shows the norm. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/zps_clock.h"
#include "common/zps_model.h"
#include "zps_http_get.h"
#include "zps_integration.h"
#include "zps_mlog_read.h"
#include "zps_proc.h"

#define MODEL "mlp:784-32-10"
#define STEPS "20"
#define CLIP "0.05" // far below the MLP's gradient norm at every step: always active
#define RUN_TIMEOUT_MS 60000

// Trains STEPS steps with 2 workers over `shards` shards (clip NULL: no
// clipping); the workers save their parameters as <tag>-w<i>.bin.
static void s_run(zps_procs *ps, const char *tag, int shards, const char *clip)
{
    char n_shards[16], metrics[64], log[64];
    snprintf(n_shards, sizeof n_shards, "%d", shards);
    snprintf(metrics, sizeof metrics, "%s-metrics.jsonl", tag);
    snprintf(log, sizeof log, "%s-s0", tag);
    const char *sargs[] = {"--workers", "2", "--global-batch", "64", "--steps", STEPS,
                           "--model", MODEL, "--seed", "5", "--shards", n_shards,
                           "--metrics-log", zps_procs_path(ps, metrics),
                           clip ? "--clip-grad-norm" : NULL, clip, NULL};
    pid_t servers[3];
    char ep[256];
    snprintf(ep, sizeof ep, "%s", zps_procs_start_server(ps, log, &servers[0], sargs, 10000));
    for (int k = 1; k < shards; k++) {
        char index[16];
        snprintf(index, sizeof index, "%d", k);
        snprintf(log, sizeof log, "%s-s%d", tag, k);
        const char *kargs[] = {"--shard", index, "--shards", n_shards, "--coordinator", ep,
                               NULL};
        zps_procs_start_server(ps, log, &servers[k], kargs, 10000);
    }
    pid_t w[2];
    for (int i = 0; i < 2; i++) {
        char out[64];
        snprintf(out, sizeof out, "%s-w%d.bin", tag, i);
        snprintf(log, sizeof log, "%s-w%d.log", tag, i);
        const char *wargs[] = {"--coordinator", ep, "--save-params", zps_procs_path(ps, out),
                               "--cache-dir", ZPS_TEST_CACHE, "--timeout-ms", "30000", NULL};
        w[i] = zps_procs_start(ps, "zps-worker", log, wargs);
    }
    for (int i = 0; i < 2; i++) {
        ck_assert_msg(zps_procs_wait(ps, w[i], RUN_TIMEOUT_MS) == 0, "%s: worker %d failed", tag,
                      i);
    }
    for (int k = 0; k < shards; k++) {
        ck_assert_msg(zps_procs_wait(ps, servers[k], 30000) == 0, "%s: shard %d failed", tag, k);
    }
}

// The metrics log's grad_norm of every step, as written (text: the bits
// the coordinator rounded to 6 decimals), into norms[STEPS].
static void s_norms(zps_procs *ps, const char *tag, double *norms, int n)
{
    char name[64];
    snprintf(name, sizeof name, "%s-metrics.jsonl", tag);
    json_t *log = zps_procs_mlog(ps, name);
    int steps = 0;
    size_t i;
    json_t *rec;
    json_array_foreach(log, i, rec)
    {
        uint64_t step;
        if (zps_mlog_step(rec, &step)) {
            ck_assert_uint_lt(step, (uint64_t)n);
            json_t *g = json_object_get(rec, "grad_norm");
            ck_assert_msg(json_is_number(g), "%s: step %llu has no grad_norm", tag,
                          (unsigned long long)step);
            norms[step] = json_number_value(g);
            steps++;
        }
    }
    json_decref(log);
    ck_assert_int_eq(steps, n);
}

START_TEST(test_clip_one_two_three_shards_give_identical_bits)
{
    zps_procs ps;
    zps_procs_init(&ps, "clip");
    zps_model_spec spec;
    ck_assert_int_eq(zps_model_parse(MODEL, &spec), ZPS_OK);
    const int n_steps = atoi(STEPS);
    const char *tags[3] = {"c1", "c2", "c3"};
    float *p[3];
    double norms[3][64];
    for (int s = 0; s < 3; s++) {
        s_run(&ps, tags[s], s + 1, CLIP);
        char file[32];
        snprintf(file, sizeof file, "%s-w1.bin", tags[s]);
        p[s] = zps_procs_load_params(&ps, file, spec.n_params);
        s_norms(&ps, tags[s], norms[s], n_steps);
    }
    s_run(&ps, "plain", 1, NULL);
    float *plain = zps_procs_load_params(&ps, "plain-w1.bin", spec.n_params);
    float *w0 = zps_procs_load_params(&ps, "c3-w0.bin", spec.n_params);
    ck_assert_msg(memcmp(p[0], p[1], spec.n_params * sizeof(float)) == 0, "1 and 2 shards differ");
    ck_assert_msg(memcmp(p[0], p[2], spec.n_params * sizeof(float)) == 0, "1 and 3 shards differ");
    ck_assert_msg(memcmp(p[2], w0, spec.n_params * sizeof(float)) == 0, "the workers differ");
    for (int t = 0; t < n_steps; t++) {
        ck_assert_double_eq(norms[0][t], norms[1][t]);
        ck_assert_double_eq(norms[0][t], norms[2][t]);
        ck_assert_msg(norms[0][t] > atof(CLIP), "step %d: norm %g, not above the clip", t,
                      norms[0][t]);
    }
    // Clipped and unclipped runs trained, and apart: the clip was active.
    float *init = malloc(spec.n_params * sizeof(float));
    zps_model_init_params(&spec, 5, init);
    double moved = zps_max_abs_diff(p[0], init, spec.n_params);
    double apart = zps_max_abs_diff(p[0], plain, spec.n_params);
    fprintf(stderr, "clip: 1, 2, 3 shards identical; |clipped - initial| %.3g, |clipped - "
            "unclipped| %.3g, step 0's norm %g\n", moved, apart, norms[0][0]);
    ck_assert_double_gt(moved, 0);
    ck_assert_double_gt(apart, 1e-4);
    // The unclipped run computes no norm.
    json_t *log = zps_procs_mlog(&ps, "plain-metrics.jsonl");
    size_t i;
    json_t *rec;
    json_array_foreach(log, i, rec)
    {
        ck_assert_ptr_null(json_object_get(rec, "grad_norm"));
    }
    json_decref(log);
    free(init);
    free(plain);
    free(w0);
    for (int s = 0; s < 3; s++) {
        free(p[s]);
    }
    zps_procs_fini(&ps, false);
}
END_TEST

// /status and /metrics of a clipped job carry the newest step's norm.
START_TEST(test_clip_status_and_metrics_show_the_gradient_norm)
{
    zps_procs ps;
    zps_procs_init(&ps, "clip-http");
    int port = zps_free_port();
    char http[64];
    snprintf(http, sizeof http, "127.0.0.1:%d", port);
    // Long enough to be running when /status is read; killed at the end.
    const char *args[] = {"--workers", "1", "--global-batch", "32", "--steps", "100000",
                          "--model", MODEL, "--clip-grad-norm", CLIP, "--http", http, NULL};
    pid_t server;
    char ep[256];
    snprintf(ep, sizeof ep, "%s", zps_procs_start_server(&ps, "server", &server, args, 10000));
    const char *wargs[] = {"--coordinator", ep, "--cache-dir", ZPS_TEST_CACHE, "--slowdown",
                           "4", NULL};
    (void)zps_procs_start(&ps, "zps-worker", "w.log", wargs);
    double norm = 0;
    bool gauge = false;
    double deadline = zps_clock_ms() + 10000;
    while ((norm <= 0 || !gauge) && zps_clock_ms() < deadline) {
        char *body = zps_http_get(port, "/status");
        json_error_t jerr;
        json_t *st = body && body[0] ? json_loads(body, 0, &jerr) : NULL;
        if (st && json_is_number(json_object_get(st, "grad_norm"))) {
            norm = json_number_value(json_object_get(st, "grad_norm"));
            ck_assert_double_eq_tol(json_number_value(json_object_get(st, "clip_grad_norm")),
                                    atof(CLIP), 1e-6);
        }
        json_decref(st);
        free(body);
        char *metrics = zps_http_get(port, "/metrics");
        gauge = gauge || (metrics && strstr(metrics, "\nzps_grad_norm ") &&
                          !strstr(metrics, "\nzps_grad_norm 0\n"));
        free(metrics);
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    ck_assert_msg(norm > 0, "/status never showed a positive grad_norm");
    ck_assert_msg(gauge, "/metrics never showed a zps_grad_norm gauge");
    // zps-ctl status's figures: the same norm, on the wire's STATUS_REPLY.
    zps_wire_msg m;
    zps_procs_status(ep, &m);
    const Zps__Status *st = m.hdr->status;
    ck_assert(st->has_grad_norm);
    ck_assert_float_gt(st->grad_norm, 0);
    ck_assert_float_eq_tol(st->clip_grad_norm, (float)atof(CLIP), 1e-6f);
    zps_wire_msg_fini(&m);
    zps_procs_fini(&ps, false); // killed mid-run: it was here for its /status
}
END_TEST

Suite *zps_suite_clip(void)
{
    Suite *s = suite_create("clip");
    TCase *tc = tcase_create("global norm");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_clip_one_two_three_shards_give_identical_bits);
    tcase_add_test(tc, test_clip_status_and_metrics_show_the_gradient_norm);
    suite_add_tcase(s, tc);
    return s;
}
