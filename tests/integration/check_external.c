/* check_external.c - a model declared by its workers (zps-server --model
 * external), trained by examples/tanh_mlp.c through the public header:
 * uneven workers end where one process training on the global batch ends,
 * the survivors of a killed worker stay there, and a worker declaring
 * another model or dataset is refused with the line that says why. Real
 * processes on loopback. Compared over 30 and 60 steps: training at these
 * rates is chaotic past about 100 (docs/failures.md). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zps_integration.h"
#include "zps_proc.h"

#define N_PARAMS 2372 // tanh_mlp's model: 64 x 32 + 64 + 4 x 64 + 4
#define WAIT_MS 120000

// The single-process reference of `steps` steps into single.bin (clip:
// its --clip-grad-norm, or NULL).
static void s_single_clip(zps_procs *ps, const char *steps, const char *clip)
{
    const char *args[] = {"--single", "--steps", steps, "--global-batch", "64", "--lr", "0.1",
                          "--momentum", "0.9", "--seed", "0", "--save",
                          zps_procs_path(ps, "single.bin"), clip ? "--clip-grad-norm" : NULL,
                          clip, NULL};
    pid_t pid = zps_procs_start(ps, "tanh_mlp", "single.log", args);
    ck_assert_int_eq(zps_procs_wait(ps, pid, WAIT_MS), 0);
}

static void s_single(zps_procs *ps, const char *steps)
{
    s_single_clip(ps, steps, NULL);
}

// An external job of `workers` workers and two shards; its endpoint.
static const char *s_job_clip(zps_procs *ps, const char *workers, const char *steps,
                              const char *dataset, const char *clip, pid_t *s0, pid_t *s1)
{
    static char endpoint[256];
    const char *args[] = {"--workers", workers, "--model", "external", "--steps", steps,
                          "--global-batch", "64", "--lr", "0.1", "--momentum", "0.9",
                          "--lr-schedule", "constant", "--shards", "2",
                          "--worker-timeout-ms", "1000", "--metrics-log",
                          zps_procs_path(ps, "metrics.jsonl"),
                          clip ? "--clip-grad-norm" : "--seed", clip ? clip : "0",
                          dataset ? "--dataset" : NULL, dataset, NULL};
    snprintf(endpoint, sizeof endpoint, "%s", zps_procs_start_server(ps, "s0", s0, args, 10000));
    const char *kargs[] = {"--shard", "1", "--shards", "2", "--coordinator", endpoint, NULL};
    zps_procs_start_server(ps, "s1", s1, kargs, 10000);
    return endpoint;
}

static const char *s_job(zps_procs *ps, const char *workers, const char *steps,
                         const char *dataset, pid_t *s0, pid_t *s1)
{
    return s_job_clip(ps, workers, steps, dataset, NULL, s0, s1);
}

// A tanh_mlp worker of the job at endpoint saving to w<i>.bin, logging to
// w<i>.log, with extra args (NULL-terminated, up to 4).
static pid_t s_worker(zps_procs *ps, const char *endpoint, int i, const char *const *extra)
{
    char out[32], log[32];
    snprintf(out, sizeof out, "w%d.bin", i);
    snprintf(log, sizeof log, "w%d.log", i);
    const char *args[12] = {"--coordinator", endpoint, "--save", zps_procs_path(ps, out)};
    int n = 4;
    for (int k = 0; extra && extra[k] && n < 11; k++) {
        args[n++] = extra[k];
    }
    args[n] = NULL;
    return zps_procs_start(ps, "tanh_mlp", log, args);
}

START_TEST(test_external_uneven_workers_end_as_one_process_on_the_global_batch)
{
    zps_procs ps;
    zps_procs_init(&ps, "external-even");
    s_single(&ps, "30");
    pid_t s0, s1;
    const char *ep = s_job(&ps, "2", "30", NULL, &s0, &s1);
    const char *a[] = {"--share", "16", NULL}, *b[] = {"--share", "48", NULL};
    pid_t w0 = s_worker(&ps, ep, 0, a), w1 = s_worker(&ps, ep, 1, b);
    ck_assert_int_eq(zps_procs_wait(&ps, w0, WAIT_MS), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, w1, WAIT_MS), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, s0, 30000), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, s1, 30000), 0);
    double d0 = zps_procs_params_diff(&ps, "single.bin", "w0.bin", N_PARAMS);
    double d01 = zps_procs_params_diff(&ps, "w0.bin", "w1.bin", N_PARAMS);
    fprintf(stderr, "external, shares 16 and 48 of 64, 30 steps: max |single - zps| = %.3g\n",
            d0);
    ck_assert_double_le(d0, 1e-5);
    ck_assert_double_eq(d01, 0); // every replica the same bits
    ck_assert(zps_procs_log_has(&ps, "s0.log", "model declared by"));
    zps_procs_fini(&ps, false);
}
END_TEST

START_TEST(test_external_survivors_of_a_killed_worker_stay_with_one_process)
{
    zps_procs ps;
    zps_procs_init(&ps, "external-kill");
    s_single(&ps, "60");
    pid_t s0, s1;
    const char *ep = s_job(&ps, "3", "60", NULL, &s0, &s1);
    const char *slow[] = {"--sleep-ms", "20", NULL};
    pid_t w[3];
    for (int i = 0; i < 3; i++) {
        w[i] = s_worker(&ps, ep, i, slow);
    }
    zps_procs_wait_log(&ps, "s0.log", "model declared by", 20000); // STATUS is "not yet" before
    // Mid-run: past the start, well before the end.
    uint64_t step = zps_procs_wait_step(ep, 15, WAIT_MS);
    ck_assert_int_eq(kill(w[2], SIGKILL), 0);
    (void)zps_procs_wait(&ps, w[2], 5000);
    ck_assert_int_eq(zps_procs_wait(&ps, w[0], WAIT_MS), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, w[1], WAIT_MS), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, s0, 30000), 0);
    double d = zps_procs_params_diff(&ps, "single.bin", "w0.bin", N_PARAMS);
    fprintf(stderr, "external, a third worker killed at step %llu of 60: max |single - zps| = "
                    "%.3g\n", (unsigned long long)step, d);
    ck_assert_double_le(d, 1e-4);
    ck_assert_double_eq(zps_procs_params_diff(&ps, "w0.bin", "w1.bin", N_PARAMS), 0);
    ck_assert(zps_procs_log_has(&ps, "s0.log", "evicted rank"));
    zps_procs_fini(&ps, false);
}
END_TEST

START_TEST(test_external_refuses_another_layout_and_another_dataset_size)
{
    zps_procs ps;
    zps_procs_init(&ps, "external-refuse");
    pid_t s0, s1;
    const char *ep = s_job(&ps, "2", "5", "size:8192", &s0, &s1);
    pid_t first = s_worker(&ps, ep, 0, NULL);
    zps_procs_wait_log(&ps, "s0.log", "admitted as rank 0", 20000);
    const char *narrow[] = {"--hidden", "32", NULL}, *small[] = {"--n-train", "4096", NULL};
    pid_t w1 = s_worker(&ps, ep, 1, narrow), w2 = s_worker(&ps, ep, 2, small);
    ck_assert_int_ne(zps_procs_wait(&ps, w1, 30000), 0);
    ck_assert_int_ne(zps_procs_wait(&ps, w2, 30000), 0);
    ck_assert(zps_procs_log_has(&ps, "w1.log", "tensor 0 differs: the job's is 'hidden.weight' "
                                               "[64, 32], declared 'hidden.weight' [32, 32]"));
    ck_assert(zps_procs_log_has(&ps, "w2.log", "declared a dataset of 4096 train"));
    pid_t w3 = s_worker(&ps, ep, 3, NULL); // the job goes on with a worker that fits
    ck_assert_int_eq(zps_procs_wait(&ps, first, WAIT_MS), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, w3, WAIT_MS), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, s0, 30000), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, s1, 30000), 0);
    zps_procs_fini(&ps, false);

    // --dataset size:N on the server: even the first worker must declare N.
    zps_procs_init(&ps, "external-size");
    ep = s_job(&ps, "1", "5", "size:4096", &s0, &s1);
    pid_t w = s_worker(&ps, ep, 0, NULL);
    ck_assert_int_ne(zps_procs_wait(&ps, w, 30000), 0);
    ck_assert(zps_procs_log_has(&ps, "w0.log", "the job's --dataset is size:4096"));
    zps_procs_fini(&ps, false);
}
END_TEST

// Workers declare clip_grad_norm_ with the model (zps_declare_clip_grad_norm):
// the server, without --clip-grad-norm, takes it and both shards clip by
// the global norm, ending where one process clipping alone ends; a server
// with another explicit value refuses the declaration in one line.
START_TEST(test_external_declared_clip_grad_norm_is_the_jobs)
{
    zps_procs ps;
    zps_procs_init(&ps, "external-clip");
    s_single_clip(&ps, "30", "0.05");
    pid_t s0, s1;
    const char *ep = s_job(&ps, "2", "30", NULL, &s0, &s1);
    const char *a[] = {"--share", "16", "--clip-grad-norm", "0.05", NULL};
    const char *b[] = {"--share", "48", "--clip-grad-norm", "0.05", NULL};
    pid_t w0 = s_worker(&ps, ep, 0, a), w1 = s_worker(&ps, ep, 1, b);
    ck_assert_int_eq(zps_procs_wait(&ps, w0, WAIT_MS), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, w1, WAIT_MS), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, s0, 30000), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, s1, 30000), 0);
    double d0 = zps_procs_params_diff(&ps, "single.bin", "w0.bin", N_PARAMS);
    fprintf(stderr, "external, clip_grad_norm 0.05 declared, 30 steps: max |single - zps| = "
            "%.3g\n", d0);
    ck_assert_double_le(d0, 1e-5);
    ck_assert_double_eq(zps_procs_params_diff(&ps, "w0.bin", "w1.bin", N_PARAMS), 0);
    ck_assert(zps_procs_log_has(&ps, "s0.log", "global norm of at most 0.05"));
    ck_assert(zps_procs_log_has(&ps, "metrics.jsonl", "\"grad_norm\":"));
    zps_procs_fini(&ps, false);

    zps_procs_init(&ps, "external-clip-refused");
    ep = s_job_clip(&ps, "1", "5", NULL, "0.1", &s0, &s1);
    const char *other[] = {"--clip-grad-norm", "0.05", NULL};
    pid_t w = s_worker(&ps, ep, 0, other);
    ck_assert_int_ne(zps_procs_wait(&ps, w, 30000), 0);
    ck_assert(zps_procs_log_has(&ps, "w0.log", "declared clip_grad_norm 0.05; this server's "
                                               "--clip-grad-norm is 0.1"));
    zps_procs_fini(&ps, false);
}
END_TEST

Suite *zps_suite_external(void)
{
    Suite *s = suite_create("external");
    TCase *tc = tcase_create("declared");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_external_uneven_workers_end_as_one_process_on_the_global_batch);
    tcase_add_test(tc, test_external_survivors_of_a_killed_worker_stay_with_one_process);
    tcase_add_test(tc, test_external_refuses_another_layout_and_another_dataset_size);
    suite_add_tcase(s, tc);
    TCase *clip = tcase_create("clip");
    tcase_set_timeout(clip, 120);
    tcase_add_test(clip, test_external_declared_clip_grad_norm_is_the_jobs);
    suite_add_tcase(s, clip);
    return s;
}
