/* check_train.c - the promise: W workers with any split of the global batch
 * end with the parameters of one process training on the whole batch, and
 * every worker holds the same bits. Real server and worker processes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_model.h"
#include "zps_integration.h"
#include "zps_proc.h"

#define STEPS "50"
#define MODEL "mlp:784-512-512-10"
#define RUN_TIMEOUT_MS 120000

// Trains STEPS steps of batch `batch` with one worker per entry of shares
// (0: no --share) and returns the number of workers whose run succeeded.
static int s_train(zps_procs *ps, const char *tag, const char *batch, int n,
                   const char *const *shares)
{
    char workers[8], metrics[64];
    snprintf(workers, sizeof workers, "%d", n);
    snprintf(metrics, sizeof metrics, "%s-metrics.jsonl", tag);
    const char *sargs[] = {"--workers", workers, "--global-batch", batch, "--steps", STEPS,
                           "--model", MODEL, "--seed", "3", "--metrics-log",
                           zps_procs_path(ps, metrics), NULL};
    pid_t server;
    const char *ep = zps_procs_start_server(ps, &server, sargs, 10000);
    char endpoint[256];
    snprintf(endpoint, sizeof endpoint, "%s", ep);
    pid_t pids[8];
    for (int i = 0; i < n; i++) {
        char out[64], log[64];
        snprintf(out, sizeof out, "%s-w%d.bin", tag, i);
        snprintf(log, sizeof log, "%s-w%d.log", tag, i);
        const char *wargs[] = {"--coordinator", endpoint, "--save-params", zps_procs_path(ps, out),
                               "--cache-dir", ZPS_TEST_CACHE, "--timeout-ms", "30000",
                               shares[i] ? "--share" : NULL, shares[i], NULL};
        pids[i] = zps_procs_start(ps, "zps-worker", log, wargs);
    }
    int ok = 0;
    for (int i = 0; i < n; i++) {
        ok += zps_procs_wait(ps, pids[i], RUN_TIMEOUT_MS) == 0;
    }
    ck_assert_int_eq(zps_procs_wait(ps, server, 30000), 0);
    return ok;
}

static float *s_load(zps_procs *ps, const char *name, size_t want)
{
    float *p;
    size_t n = zps_read_floats(zps_procs_path(ps, name), &p);
    ck_assert_msg(n == want, "%s holds %zu floats, the model has %zu", name, n, want);
    return p;
}

static double s_max_abs_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        m = d > m || isnan(d) ? d : m;
    }
    return m;
}

// One process, batch 64, against two workers splitting it as given.
static void s_check_split(const char *a, const char *b)
{
    zps_procs ps;
    zps_procs_init(&ps, "train");
    zps_model_spec spec;
    ck_assert_int_eq(zps_model_parse(MODEL, &spec), ZPS_OK);
    const char *one[] = {NULL};
    ck_assert_int_eq(s_train(&ps, "single", "64", 1, one), 1);
    const char *two[] = {a, b};
    ck_assert_int_eq(s_train(&ps, "split", "64", 2, two), 2);

    float *ref = s_load(&ps, "single-w0.bin", spec.n_params);
    float *w0 = s_load(&ps, "split-w0.bin", spec.n_params);
    float *w1 = s_load(&ps, "split-w1.bin", spec.n_params);
    float *init = malloc(spec.n_params * sizeof(float));
    zps_model_init_params(&spec, 3, init);
    // The run trained: otherwise equality would prove nothing.
    ck_assert_double_gt(s_max_abs_diff(ref, init, spec.n_params), 1e-2);
    double d = s_max_abs_diff(ref, w0, spec.n_params);
    fprintf(stderr, "split %s+%s: max |single - split| = %.3g\n", a, b, d);
    ck_assert_msg(d <= 1e-5, "max abs difference %.3g > 1e-5", d);
    ck_assert_msg(memcmp(w0, w1, spec.n_params * sizeof(float)) == 0,
                  "the two workers' parameters differ");
    free(ref);
    free(w0);
    free(w1);
    free(init);
    zps_procs_fini(&ps, false);
}

START_TEST(test_train_even_split_equals_single_process)
{
    s_check_split("32", "32");
}
END_TEST

START_TEST(test_train_uneven_split_equals_single_process)
{
    s_check_split("16", "48");
}
END_TEST

START_TEST(test_train_three_workers_hold_bitwise_identical_parameters)
{
    zps_procs ps;
    zps_procs_init(&ps, "align");
    zps_model_spec spec;
    ck_assert_int_eq(zps_model_parse(MODEL, &spec), ZPS_OK);
    const char *three[] = {NULL, NULL, NULL}; // 64 = 22 + 21 + 21
    ck_assert_int_eq(s_train(&ps, "three", "64", 3, three), 3);
    float *w0 = s_load(&ps, "three-w0.bin", spec.n_params);
    for (int i = 1; i < 3; i++) {
        char name[32];
        snprintf(name, sizeof name, "three-w%d.bin", i);
        float *wi = s_load(&ps, name, spec.n_params);
        ck_assert_msg(memcmp(w0, wi, spec.n_params * sizeof(float)) == 0,
                      "worker %d differs from worker 0", i);
        free(wi);
    }
    free(w0);
    // The metrics log has one record per step and the evaluation at the end.
    FILE *f = fopen(zps_procs_path(&ps, "three-metrics.jsonl"), "r");
    ck_assert_ptr_nonnull(f);
    char line[512];
    int steps = 0, evals = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "{\"step\":", 8) == 0) {
            ck_assert_ptr_nonnull(strstr(line, "\"loss\":"));
            ck_assert_ptr_nonnull(strstr(line, "\"samples\":64"));
            ck_assert_ptr_nonnull(strstr(line, "\"step_ms\":"));
            steps++;
        } else if (strstr(line, "\"test_accuracy\":")) {
            evals++;
        }
    }
    fclose(f);
    ck_assert_int_eq(steps, 50);
    ck_assert_int_eq(evals, 1);
    zps_procs_fini(&ps, false);
}
END_TEST

Suite *zps_suite_train(void)
{
    Suite *s = suite_create("train");
    TCase *tc = tcase_create("equivalence");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_train_even_split_equals_single_process);
    tcase_add_test(tc, test_train_uneven_split_equals_single_process);
    tcase_add_test(tc, test_train_three_workers_hold_bitwise_identical_parameters);
    suite_add_tcase(s, tc);
    return s;
}
