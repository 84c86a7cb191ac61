/* check_gpu.c - GPU workers as real processes: a worker asked for a GPU
 * it cannot have exits 2 with one line that says why (everywhere), and a
 * CPU worker and a GPU worker training one job end within 1e-4 of one
 * process training on the whole batch (where a GPU is present; otherwise
 * the test prints "SKIPPED: <test>: <reason>" and passes).
 *
 * ZPS_TEST_GPU_DEVICE=cpu stands the CPU in for the GPU in the mixed run:
 * it checks the test itself on a machine without a GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_model.h"
#include "zps_integration.h"
#include "zps_proc.h"

#define STEPS "50"
#define MODEL "mlp:784-512-512-10"
#define RUN_TIMEOUT_MS 180000

// Lines in a file, and whether any of them holds `needle`.
static int s_lines(const char *path, const char *needle, bool *found)
{
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "no log %s", path);
    char line[1024];
    int n = 0;
    *found = false;
    while (fgets(line, sizeof line, f)) {
        n++;
        *found = *found || strstr(line, needle) != NULL;
    }
    fclose(f);
    return n;
}

// Runs zps-worker with args; returns its exit status and checks it wrote
// exactly one line to stderr, naming `needle`.
static int s_refused(zps_procs *ps, const char *log, const char *needle, const char *const *args)
{
    pid_t pid = zps_procs_start(ps, "zps-worker", log, args);
    int rc = zps_procs_wait(ps, pid, 30000);
    bool found;
    int lines = s_lines(zps_procs_path(ps, log), needle, &found);
    ck_assert_msg(lines == 1 && found, "%s: %d lines, '%s' %s", log, lines, needle,
                  found ? "found" : "missing");
    return rc;
}

// True if this machine and build can run a GPU worker; otherwise prints
// why the test is skipped.
static bool s_have_gpu(zps_procs *ps, const char *test, const char *device)
{
    const char *args[] = {"--check-device", "--device", device, NULL};
    pid_t pid = zps_procs_start(ps, "zps-worker", "check-device.log", args);
    if (zps_procs_wait(ps, pid, 60000) == 0) {
        return true;
    }
    char why[512] = "no GPU";
    FILE *f = fopen(zps_procs_path(ps, "check-device.log"), "r");
    if (f) {
        char line[512];
        if (fgets(line, sizeof line, f)) {
            // The reason without the log line's timestamp and level.
            const char *r = strstr(line, "--device");
            snprintf(why, sizeof why, "%s", r ? r : line);
            why[strcspn(why, "\n")] = '\0';
        }
        fclose(f);
    }
    fprintf(stderr, "SKIPPED: %s: %s\n", test, why);
    return false;
}

START_TEST(test_gpu_worker_refuses_a_device_it_cannot_have)
{
    zps_procs ps;
    zps_procs_init(&ps, "gpu-refuse");
    // No server: the worker must give up before it tries to connect.
    const char *far[] = {"--coordinator", "tcp://127.0.0.1:1", "--device", "cuda:1023", NULL};
    ck_assert_int_eq(s_refused(&ps, "far.log", "cuda:1023", far), 2);
    const char *bad[] = {"--coordinator", "tcp://127.0.0.1:1", "--device", "cuda:x", NULL};
    ck_assert_int_eq(s_refused(&ps, "bad.log", "cuda:x", bad), 2);
    const char *check[] = {"--check-device", "--device", "cuda:1023", NULL};
    ck_assert_int_eq(s_refused(&ps, "check.log", "cuda:1023", check), 2);
    const char *cpu[] = {"--check-device", "--device", "cpu", NULL};
    pid_t pid = zps_procs_start(&ps, "zps-worker", "cpu.log", cpu);
    ck_assert_int_eq(zps_procs_wait(&ps, pid, 30000), 0);
    // --device cuda itself fails the same way where there is no GPU.
    const char *plain[] = {"--coordinator", "tcp://127.0.0.1:1", "--device", "cuda",
                           "--join-timeout-ms", "100", NULL};
    pid = zps_procs_start(&ps, "zps-worker", "plain.log", plain);
    int rc = zps_procs_wait(&ps, pid, 30000);
    bool found;
    int lines = s_lines(zps_procs_path(&ps, "plain.log"), "--device cuda", &found);
    if (rc == 2) {
        ck_assert_msg(lines == 1 && found, "plain.log: %d lines", lines);
    } else {
        fprintf(stderr, "gpu: --device cuda is usable here (exit %d without a server)\n", rc);
    }
    zps_procs_fini(&ps, false);
}
END_TEST

// Trains STEPS steps of batch 64 with one worker per entry of devices
// (shares: each one's, or NULL to split evenly), --deterministic
// --micro-batch 8 with det, saving <tag>-w<i>.bin; all must succeed.
static void s_train_job(zps_procs *ps, const char *tag, const char *const *devices, int n,
                        const char *const *shares, bool det)
{
    char workers[8], share[8], stag[64];
    snprintf(workers, sizeof workers, "%d", n);
    snprintf(share, sizeof share, "%d", 64 / n);
    snprintf(stag, sizeof stag, "%s-s0", tag);
    const char *sargs[] = {"--workers", workers, "--global-batch", "64", "--steps", STEPS,
                           "--model", MODEL, "--seed", "3", det ? "--deterministic" : NULL,
                           "--micro-batch", "8", NULL};
    pid_t server;
    char endpoint[256];
    snprintf(endpoint, sizeof endpoint, "%s", zps_procs_start_server(ps, stag, &server, sargs,
                                                                     10000));
    pid_t pids[4];
    for (int i = 0; i < n; i++) {
        char out[64], log[64];
        snprintf(out, sizeof out, "%s-w%d.bin", tag, i);
        snprintf(log, sizeof log, "%s-w%d.log", tag, i);
        const char *wargs[] = {"--coordinator", endpoint, "--save-params", zps_procs_path(ps, out),
                               "--cache-dir", ZPS_TEST_CACHE, "--timeout-ms", "60000",
                               "--device", devices[i], "--share", shares ? shares[i] : share,
                               NULL};
        pids[i] = zps_procs_start(ps, "zps-worker", log, wargs);
    }
    for (int i = 0; i < n; i++) {
        ck_assert_msg(zps_procs_wait(ps, pids[i], RUN_TIMEOUT_MS) == 0, "%s worker %d (%s) failed",
                      tag, i, devices[i]);
    }
    ck_assert_msg(zps_procs_wait(ps, server, 30000) == 0, "%s server failed", tag);
}

static void s_train(zps_procs *ps, const char *tag, const char *const *devices, int n)
{
    s_train_job(ps, tag, devices, n, NULL, false);
}

START_TEST(test_gpu_mixed_cpu_gpu_job_equals_single_process)
{
    zps_procs ps;
    zps_procs_init(&ps, "gpu-mixed");
    const char *gpu = getenv("ZPS_TEST_GPU_DEVICE");
    gpu = gpu && *gpu ? gpu : "cuda";
    if (!s_have_gpu(&ps, "test_gpu_mixed_cpu_gpu_job_equals_single_process", gpu)) {
        zps_procs_fini(&ps, false);
        return;
    }
    zps_model_spec spec;
    ck_assert_int_eq(zps_model_parse(MODEL, &spec), ZPS_OK);
    const char *single[] = {"cpu"};
    const char *mixed[] = {"cpu", gpu};
    const char *gpus[] = {gpu};
    s_train(&ps, "single", single, 1);
    s_train(&ps, "mixed", mixed, 2);
    s_train(&ps, "gpu", gpus, 1);
    float *ref = zps_procs_load_params(&ps, "single-w0.bin", spec.n_params);
    float *w0 = zps_procs_load_params(&ps, "mixed-w0.bin", spec.n_params);
    float *w1 = zps_procs_load_params(&ps, "mixed-w1.bin", spec.n_params);
    float *g = zps_procs_load_params(&ps, "gpu-w0.bin", spec.n_params);
    float *init = malloc(spec.n_params * sizeof(float));
    ck_assert_ptr_nonnull(init);
    zps_model_init_params(&spec, 3, init);
    ck_assert_double_gt(zps_max_abs_diff(ref, init, spec.n_params), 1e-2); // it trained
    double dm = zps_max_abs_diff(ref, w0, spec.n_params);
    double dg = zps_max_abs_diff(ref, g, spec.n_params);
    fprintf(stderr, "gpu: after %s steps, max |single cpu - cpu+gpu| = %.3g, "
                    "max |single cpu - single gpu| = %.3g\n", STEPS, dm, dg);
    ck_assert_msg(dm <= 1e-4, "cpu+gpu: max abs difference %.3g > 1e-4", dm);
    ck_assert_msg(dg <= 1e-4, "gpu alone: max abs difference %.3g > 1e-4", dg);
    ck_assert_msg(memcmp(w0, w1, spec.n_params * sizeof(float)) == 0,
                  "the CPU and the GPU worker hold different parameters");
    free(ref);
    free(w0);
    free(w1);
    free(g);
    free(init);
    zps_procs_fini(&ps, false);
}
END_TEST

// Deterministic mode on GPUs (issue 29): one GPU worker and two of 24 + 40
// end with the same bits (the same kernels on the same shapes, summed in
// the tree's order). ZPS_TEST_GPU_DEVICE=cpu checks the test on a CPU.
START_TEST(test_gpu_deterministic_two_gpu_workers_equal_one_bitwise)
{
    zps_procs ps;
    zps_procs_init(&ps, "gpu-det");
    const char *gpu = getenv("ZPS_TEST_GPU_DEVICE");
    gpu = gpu && *gpu ? gpu : "cuda";
    if (!s_have_gpu(&ps, "test_gpu_deterministic_two_gpu_workers_equal_one_bitwise", gpu)) {
        zps_procs_fini(&ps, false);
        return;
    }
    zps_model_spec spec;
    ck_assert_int_eq(zps_model_parse(MODEL, &spec), ZPS_OK);
    const char *one[] = {gpu}, *two[] = {gpu, gpu};
    const char *all[] = {"64"}, *uneven[] = {"24", "40"};
    s_train_job(&ps, "det-one", one, 1, all, true);
    s_train_job(&ps, "det-two", two, 2, uneven, true);
    float *ref = zps_procs_load_params(&ps, "det-one-w0.bin", spec.n_params);
    for (int i = 0; i < 2; i++) {
        char name[32];
        snprintf(name, sizeof name, "det-two-w%d.bin", i);
        float *p = zps_procs_load_params(&ps, name, spec.n_params);
        double d = zps_max_abs_diff(ref, p, spec.n_params);
        fprintf(stderr, "gpu deterministic: %s after %s steps: max |one - two| = %.3g\n", name,
                STEPS, d);
        ck_assert_msg(memcmp(ref, p, spec.n_params * sizeof(float)) == 0,
                      "%s differs from one %s worker's by up to %.3g", name, gpu, d);
        free(p);
    }
    free(ref);
    zps_procs_fini(&ps, false);
}
END_TEST

Suite *zps_suite_gpu(void)
{
    Suite *s = suite_create("gpu");
    TCase *tc = tcase_create("gpu");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_gpu_worker_refuses_a_device_it_cannot_have);
    tcase_add_test(tc, test_gpu_mixed_cpu_gpu_job_equals_single_process);
    tcase_add_test(tc, test_gpu_deterministic_two_gpu_workers_equal_one_bitwise);
    suite_add_tcase(s, tc);
    return s;
}
