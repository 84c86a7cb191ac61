/* check_train.c - the promise: W workers with any split of the global batch
 * end with the parameters of one process training on the whole batch, and
 * every worker holds the same bits. Real server and worker processes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_model.h"
#include "zps_integration.h"
#include "zps_mlog_read.h"
#include "zps_proc.h"

#define STEPS "50"
#define MODEL "mlp:784-512-512-10"
#define RUN_TIMEOUT_MS 120000

typedef struct run {
    const char *tag;            // names the run's files
    const char *batch;          // global batch
    int workers;                // worker processes
    const char *shares[8];      // per worker: --share value, or NULL
    int shards;                 // server processes
    const char *dtype;          // --wire-dtype
    const char *steps;          // --steps (NULL: STEPS)
    const char *const *optim;   // optimizer flags for shard 0, NULL-terminated (NULL: SGD)
    const char *threads;        // every shard's --threads (NULL: 1)
} run;

// Trains STEPS steps of the run's job and returns the number of workers
// whose run succeeded; every server must succeed too.
static int s_train(zps_procs *ps, const run *r)
{
    char workers[8], shards[8], metrics[64], tag[64];
    snprintf(workers, sizeof workers, "%d", r->workers);
    snprintf(shards, sizeof shards, "%d", r->shards ? r->shards : 1);
    snprintf(metrics, sizeof metrics, "%s-metrics.jsonl", r->tag);
    snprintf(tag, sizeof tag, "%s-s0", r->tag);
    const char *sargs[32] = {"--workers", workers, "--global-batch", r->batch,
                             "--steps", r->steps ? r->steps : STEPS, "--model", MODEL,
                             "--seed", "3", "--shards", shards,
                             "--wire-dtype", r->dtype ? r->dtype : "fp32", "--metrics-log",
                             zps_procs_path(ps, metrics), "--threads",
                             r->threads ? r->threads : "1", NULL};
    size_t n_args = 0;
    while (sargs[n_args]) {
        n_args++;
    }
    for (size_t i = 0; r->optim && r->optim[i]; i++) {
        ck_assert_uint_lt(n_args + 1, sizeof sargs / sizeof sargs[0]);
        sargs[n_args++] = r->optim[i];
    }
    pid_t servers[4];
    char endpoint[256];
    snprintf(endpoint, sizeof endpoint, "%s",
             zps_procs_start_server(ps, tag, &servers[0], sargs, 10000));
    for (int k = 1; k < r->shards; k++) {
        char index[16];
        snprintf(index, sizeof index, "%d", k);
        snprintf(tag, sizeof tag, "%s-s%d", r->tag, k);
        const char *kargs[] = {"--shard", index, "--shards", shards, "--coordinator", endpoint,
                               "--threads", r->threads ? r->threads : "1", NULL};
        zps_procs_start_server(ps, tag, &servers[k], kargs, 10000);
    }
    pid_t pids[8];
    for (int i = 0; i < r->workers; i++) {
        char out[64], log[64];
        snprintf(out, sizeof out, "%s-w%d.bin", r->tag, i);
        snprintf(log, sizeof log, "%s-w%d.log", r->tag, i);
        const char *wargs[] = {"--coordinator", endpoint, "--save-params", zps_procs_path(ps, out),
                               "--cache-dir", ZPS_TEST_CACHE, "--timeout-ms", "30000",
                               r->shares[i] ? "--share" : NULL, r->shares[i], NULL};
        pids[i] = zps_procs_start(ps, "zps-worker", log, wargs);
    }
    int ok = 0;
    for (int i = 0; i < r->workers; i++) {
        ok += zps_procs_wait(ps, pids[i], RUN_TIMEOUT_MS) == 0;
    }
    for (int k = 0; k < (r->shards ? r->shards : 1); k++) {
        ck_assert_msg(zps_procs_wait(ps, servers[k], 30000) == 0, "shard %d of %s failed", k,
                      r->tag);
    }
    return ok;
}

// One process, batch 64, against two workers splitting it as given.
static void s_check_split(const char *a, const char *b)
{
    zps_procs ps;
    zps_procs_init(&ps, "train");
    zps_model_spec spec;
    ck_assert_int_eq(zps_model_parse(MODEL, &spec), ZPS_OK);
    run single = {.tag = "single", .batch = "64", .workers = 1};
    run split = {.tag = "split", .batch = "64", .workers = 2, .shares = {a, b}};
    ck_assert_int_eq(s_train(&ps, &single), 1);
    ck_assert_int_eq(s_train(&ps, &split), 2);

    float *ref = zps_procs_load_params(&ps, "single-w0.bin", spec.n_params);
    float *w0 = zps_procs_load_params(&ps, "split-w0.bin", spec.n_params);
    float *w1 = zps_procs_load_params(&ps, "split-w1.bin", spec.n_params);
    float *init = malloc(spec.n_params * sizeof(float));
    zps_model_init_params(&spec, 3, init);
    // The run trained: otherwise equality would prove nothing.
    ck_assert_double_gt(zps_max_abs_diff(ref, init, spec.n_params), 1e-2);
    double d = zps_max_abs_diff(ref, w0, spec.n_params);
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
    run three = {.tag = "three", .batch = "64", .workers = 3}; // 64 = 22 + 21 + 21
    ck_assert_int_eq(s_train(&ps, &three), 3);
    float *w0 = zps_procs_load_params(&ps, "three-w0.bin", spec.n_params);
    for (int i = 1; i < 3; i++) {
        char name[32];
        snprintf(name, sizeof name, "three-w%d.bin", i);
        float *wi = zps_procs_load_params(&ps, name, spec.n_params);
        ck_assert_msg(memcmp(w0, wi, spec.n_params * sizeof(float)) == 0,
                      "worker %d differs from worker 0", i);
        free(wi);
    }
    free(w0);
    // The metrics log has one record per step and the evaluation at the end.
    json_t *log = zps_procs_mlog(&ps, "three-metrics.jsonl");
    int steps = 0, evals = 0;
    size_t i;
    json_t *rec;
    json_array_foreach(log, i, rec)
    {
        uint64_t step;
        if (zps_mlog_step(rec, &step)) {
            ck_assert(json_is_number(json_object_get(rec, "loss")));
            ck_assert(json_is_number(json_object_get(rec, "step_ms")));
            ck_assert_double_eq(zps_mlog_num(rec, "samples"), 64);
            steps++;
        } else if (json_is_number(json_object_get(rec, "test_accuracy"))) {
            evals++;
        }
    }
    json_decref(log);
    ck_assert_int_eq(steps, 50);
    ck_assert_int_eq(evals, 1);
    zps_procs_fini(&ps, false);
}
END_TEST

// The per-element update is the same wherever it runs: 1, 2 and 3 shards
// (ranges cut inside layers) give the same bits. The runs train `steps`
// steps with the optimizer's flags `optim` (NULL: SGD's defaults).
static void s_check_shard_counts(const char *name, const char *steps, const char *const *optim)
{
    zps_procs ps;
    zps_procs_init(&ps, name);
    zps_model_spec spec;
    ck_assert_int_eq(zps_model_parse(MODEL, &spec), ZPS_OK);
    const char *tags[3] = {"s1", "s2", "s3"};
    float *p[3];
    for (int s = 0; s < 3; s++) {
        run r = {.tag = tags[s], .batch = "64", .workers = 2, .shards = s + 1, .steps = steps,
                 .optim = optim};
        ck_assert_int_eq(s_train(&ps, &r), 2);
        char file[32];
        snprintf(file, sizeof file, "%s-w1.bin", tags[s]);
        p[s] = zps_procs_load_params(&ps, file, spec.n_params);
    }
    ck_assert_msg(memcmp(p[0], p[1], spec.n_params * sizeof(float)) == 0, "1 and 2 shards differ");
    ck_assert_msg(memcmp(p[0], p[2], spec.n_params * sizeof(float)) == 0, "1 and 3 shards differ");
    // The runs trained: otherwise equality would prove nothing.
    float *init = malloc(spec.n_params * sizeof(float));
    zps_model_init_params(&spec, 3, init);
    double moved = zps_max_abs_diff(p[0], init, spec.n_params);
    fprintf(stderr, "%s: 1, 2 and 3 shards identical; max |final - initial| = %.3g\n", name,
            moved);
    ck_assert_double_gt(moved, 1e-3);
    free(init);
    for (int s = 0; s < 3; s++) {
        free(p[s]);
    }
    zps_procs_fini(&ps, false);
}

START_TEST(test_train_one_two_three_shards_give_identical_bits)
{
    s_check_shard_counts("shards", NULL, NULL);
}
END_TEST

// AdamW's update is per element as well: the moments and the step count
// live beside each shard's range, and shards 1 and 2 get the settings in
// ASSIGN (a shard that fell back to SGD would break the equality).
START_TEST(test_train_adamw_one_two_three_shards_give_identical_bits)
{
    static const char *const adamw[] = {"--optimizer", "adamw", "--lr", "0.001", "--betas",
                                        "0.9,0.999", "--eps", "1e-8", "--weight-decay", "0.01",
                                        NULL};
    s_check_shard_counts("adamw-shards", "30", adamw);
}
END_TEST

// zps-server --threads: each bucket's accumulate and update split over
// threads, element by element: the same bits as one thread, with AdamW on
// 2 shards (ranges cut inside layers, so threads' ranges start mid-layer).
START_TEST(test_train_shard_threads_give_the_bits_of_one_thread)
{
    static const char *const adamw[] = {"--optimizer", "adamw", "--lr", "0.001", NULL};
    zps_procs ps;
    zps_procs_init(&ps, "threads");
    zps_model_spec spec;
    ck_assert_int_eq(zps_model_parse(MODEL, &spec), ZPS_OK);
    const char *threads[2] = {"1", "3"};
    float *p[2];
    for (int t = 0; t < 2; t++) {
        char tag[16], file[32];
        snprintf(tag, sizeof tag, "t%s", threads[t]);
        run r = {.tag = tag, .batch = "64", .workers = 2, .shards = 2, .steps = "30",
                 .optim = adamw, .threads = threads[t]};
        ck_assert_int_eq(s_train(&ps, &r), 2);
        snprintf(file, sizeof file, "%s-w1.bin", tag);
        p[t] = zps_procs_load_params(&ps, file, spec.n_params);
    }
    ck_assert_msg(memcmp(p[0], p[1], spec.n_params * sizeof(float)) == 0,
                  "--threads 3 differs from --threads 1");
    float *init = malloc(spec.n_params * sizeof(float));
    zps_model_init_params(&spec, 3, init);
    ck_assert_double_gt(zps_max_abs_diff(p[0], init, spec.n_params), 1e-4); // it trained
    free(init);
    free(p[0]);
    free(p[1]);
    zps_procs_fini(&ps, false);
}
END_TEST

// bf16 on the wire halves the bytes and stays close to the fp32 run.
START_TEST(test_train_bf16_wire_stays_close_to_fp32)
{
    zps_procs ps;
    zps_procs_init(&ps, "bf16");
    zps_model_spec spec;
    ck_assert_int_eq(zps_model_parse(MODEL, &spec), ZPS_OK);
    run f32 = {.tag = "f32", .batch = "64", .workers = 2, .shards = 2};
    run b16 = {.tag = "b16", .batch = "64", .workers = 2, .shards = 2, .dtype = "bf16"};
    run f16 = {.tag = "f16", .batch = "64", .workers = 2, .shards = 1, .dtype = "fp16"};
    ck_assert_int_eq(s_train(&ps, &f32), 2);
    ck_assert_int_eq(s_train(&ps, &b16), 2);
    ck_assert_int_eq(s_train(&ps, &f16), 2);
    float *a = zps_procs_load_params(&ps, "f32-w0.bin", spec.n_params);
    float *b = zps_procs_load_params(&ps, "b16-w0.bin", spec.n_params);
    float *c = zps_procs_load_params(&ps, "b16-w1.bin", spec.n_params);
    float *h = zps_procs_load_params(&ps, "f16-w0.bin", spec.n_params);
    ck_assert_msg(memcmp(b, c, spec.n_params * sizeof(float)) == 0, "bf16 workers differ");
    double db = zps_max_abs_diff(a, b, spec.n_params), dh = zps_max_abs_diff(a, h, spec.n_params);
    fprintf(stderr, "after 50 steps: max |fp32 - bf16| = %.3g, max |fp32 - fp16| = %.3g\n", db,
            dh);
    ck_assert_double_gt(db, 0);  // the wire really carried 16 bits
    ck_assert_double_lt(db, 0.05);
    ck_assert_double_gt(dh, 0);
    ck_assert_double_lt(dh, 0.05);
    free(a);
    free(b);
    free(c);
    free(h);
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
    tcase_add_test(tc, test_train_one_two_three_shards_give_identical_bits);
    tcase_add_test(tc, test_train_adamw_one_two_three_shards_give_identical_bits);
    tcase_add_test(tc, test_train_bf16_wire_stays_close_to_fp32);
    tcase_add_test(tc, test_train_shard_threads_give_the_bits_of_one_thread);
    suite_add_tcase(s, tc);
    return s;
}
