/* check_cpu.c - tests of the CPU backend (worker/zps_cpu.c).
 *
 * Gradients are checked against central differences of a naive
 * double-precision reference of the same model, so a wrong transpose, a
 * missing 1/n or a misplaced ReLU mask shows up as a mismatch; small cases
 * are checked against losses and predictions worked out by hand. */
#include <check.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_model.h"
#include "common/zps_rng.h"
#include "tests/zps_check.h"
#include "worker/zps_cpu.h"

#define SEED 20240611
#define REF_MAX_WIDTH 16   // widest layer the double reference handles
#define SMALL_MODEL "mlp:7-6-5-4"

// ---------------------------------------------------------------- helpers

// A model of spec text for batches up to max_batch; spec is filled in.
static zps_cpu *s_new(const char *text, uint32_t max_batch, zps_model_spec *spec)
{
    ck_assert_int_eq(zps_model_parse(text, spec), ZPS_OK);
    zps_cpu *m = zps_cpu_new(spec, max_batch);
    ck_assert_ptr_nonnull(m);
    return m;
}

// He-normal weights from the seed, plus small random biases: the spec's zero
// biases would leave every bias gradient path untested against a nonzero b.
static void s_init_params(const zps_model_spec *spec, uint64_t seed, float *params)
{
    zps_model_init_params(spec, seed, params);
    zps_rng rng;
    zps_rng_seed(&rng, seed, 100);
    for (int l = 0; l < spec->n_layers; l++) {
        const zps_layer_spec *ls = &spec->layers[l];
        for (uint32_t o = 0; o < ls->out; o++) {
            params[ls->b_off + o] = (float)(0.1 * zps_rng_normal(&rng));
        }
    }
}

// n samples of N(0, 1) inputs with uniform labels.
static void s_random_batch(const zps_model_spec *spec, uint64_t seed, uint32_t n, float *x,
                           uint32_t *labels)
{
    zps_rng rng;
    zps_rng_seed(&rng, seed, 200);
    uint32_t inputs = zps_model_inputs(spec);
    for (size_t i = 0; i < (size_t)n * inputs; i++) {
        x[i] = (float)zps_rng_normal(&rng);
    }
    for (uint32_t i = 0; i < n; i++) {
        labels[i] = (uint32_t)zps_rng_below(&rng, zps_model_classes(spec));
    }
}

// One sample through the model in double, naive loops: the logits land in z.
static void s_ref_logits(const zps_model_spec *spec, const double *params, const float *x,
                         double *z)
{
    double a[REF_MAX_WIDTH];
    for (uint32_t i = 0; i < spec->layers[0].in; i++) {
        a[i] = x[i];
    }
    for (int l = 0; l < spec->n_layers; l++) {
        const zps_layer_spec *ls = &spec->layers[l];
        ck_assert_uint_le(ls->in, REF_MAX_WIDTH);
        ck_assert_uint_le(ls->out, REF_MAX_WIDTH);
        for (uint32_t o = 0; o < ls->out; o++) {
            double s = params[ls->b_off + o];
            for (uint32_t i = 0; i < ls->in; i++) {
                s += params[ls->w_off + (size_t)o * ls->in + i] * a[i];
            }
            z[o] = (l + 1 < spec->n_layers && s < 0.0) ? 0.0 : s;
        }
        memcpy(a, z, ls->out * sizeof *a);
    }
}

// -log softmax(z)[label], straight from the definition.
static double s_ref_xent(const double *z, uint32_t c, uint32_t label)
{
    double sum = 0.0;
    for (uint32_t j = 0; j < c; j++) {
        sum += exp(z[j]);
    }
    return log(sum) - z[label];
}

// Summed loss of n samples in double; adds argmax hits to *correct if given.
static double s_ref_loss_sum(const zps_model_spec *spec, const double *params, const float *x,
                             const uint32_t *labels, uint32_t n, uint32_t *correct)
{
    uint32_t inputs = zps_model_inputs(spec);
    uint32_t c = zps_model_classes(spec);
    double total = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        double z[REF_MAX_WIDTH];
        s_ref_logits(spec, params, x + (size_t)i * inputs, z);
        total += s_ref_xent(z, c, labels[i]);
        uint32_t best = 0;
        for (uint32_t j = 1; j < c; j++) {
            best = z[j] > z[best] ? j : best;
        }
        if (correct) {
            *correct += best == labels[i];
        }
    }
    return total;
}

static double *s_to_double(const float *v, size_t n)
{
    double *d = malloc(n * sizeof *d);
    ck_assert_ptr_nonnull(d);
    for (size_t i = 0; i < n; i++) {
        d[i] = v[i];
    }
    return d;
}

// ---------------------------------------------------------------- gradients

START_TEST(test_cpu_grads_match_finite_differences)
{
    enum { N = 5 };
    zps_model_spec spec;
    zps_cpu *m = s_new(SMALL_MODEL, 8, &spec);
    s_init_params(&spec, SEED, zps_cpu_params(m));
    float x[N * 7];
    uint32_t labels[N];
    float loss;
    // A step on other data first: the checked step must overwrite its
    // grads, not add to them.
    s_random_batch(&spec, SEED + 5, N, x, labels);
    ck_assert_int_eq(zps_cpu_train_step(m, x, labels, N, &loss), ZPS_OK);
    s_random_batch(&spec, SEED, N, x, labels);
    ck_assert_int_eq(zps_cpu_train_step(m, x, labels, N, &loss), ZPS_OK);
    double *p = s_to_double(zps_cpu_params(m), spec.n_params);
    double ref = s_ref_loss_sum(&spec, p, x, labels, N, NULL) / N;
    ck_assert_double_eq_tol(loss, ref, 1e-5 * (1.0 + ref));

    // Central differences of the double reference: truncation ~h^2 and
    // rounding ~1e-16/h are both far below the tolerance, while a wrong
    // transpose or a factor of n is far above it.
    const double h = 1e-5;
    const float *g = zps_cpu_grads(m);
    for (int l = 0; l < spec.n_layers; l++) {
        const zps_layer_spec *ls = &spec.layers[l];
        double norm = 0.0;
        for (size_t i = ls->w_off; i < ls->b_off + ls->out; i++) {
            double keep = p[i];
            p[i] = keep + h;
            double up = s_ref_loss_sum(&spec, p, x, labels, N, NULL) / N;
            p[i] = keep - h;
            double down = s_ref_loss_sum(&spec, p, x, labels, N, NULL) / N;
            p[i] = keep;
            double fd = (up - down) / (2 * h);
            norm += fd * fd;
            ck_assert_msg(fabs(g[i] - fd) <= 1e-4 + 1e-3 * fabs(fd),
                          "layer %d %s[%zu]: cpu %g, finite difference %g", l,
                          i < ls->b_off ? "W" : "b",
                          i < ls->b_off ? i - ls->w_off : i - ls->b_off, g[i], fd);
        }
        // A dead layer would pass the comparison with zeros on both sides.
        ck_assert_msg(sqrt(norm) > 1e-2, "layer %d: gradient too small to test (%g)", l,
                      sqrt(norm));
    }
    free(p);
    zps_cpu_destroy(&m);
}
END_TEST

// ---------------------------------------------------------------- loss

// mlp:2-3 with W = [[1,0],[0,1],[1,1]], b = [0, 0.5, -1], two samples:
// x = [1, 2] (label 2) gives z = [1, 2.5, 2]; x = [-1, 0.5] (label 0) gives
// z = [-1, 1, -1.5]. Loss = mean of logsumexp(z) - z[label]
// = (1.10413 + 2.19674) / 2 = 1.65043.
START_TEST(test_cpu_loss_matches_hand_computation)
{
    zps_model_spec spec;
    zps_cpu *m = s_new("mlp:2-3", 2, &spec);
    const float params[] = {1, 0, 0, 1, 1, 1, 0, 0.5f, -1};
    ck_assert_uint_eq(spec.n_params, sizeof params / sizeof params[0]);
    memcpy(zps_cpu_params(m), params, sizeof params);
    const float x[] = {1, 2, -1, 0.5f};
    const uint32_t labels[] = {2, 0};
    const double z[2][3] = {{1, 2.5, 2}, {-1, 1, -1.5}};

    float loss;
    ck_assert_int_eq(zps_cpu_train_step(m, x, labels, 2, &loss), ZPS_OK);
    double l0 = log(exp(1) + exp(2.5) + exp(2)) - 2;
    double l1 = log(exp(-1) + exp(1) + exp(-1.5)) + 1;
    ck_assert_double_eq_tol(loss, (l0 + l1) / 2, 1e-6);
    ck_assert_double_eq_tol(loss, 1.65043, 1e-5);

    // dZ = (softmax - onehot) / 2; db sums it over samples, dW = dZ^T x.
    const float *g = zps_cpu_grads(m);
    for (int j = 0; j < 3; j++) {
        double db = 0.0;
        double dw[2] = {0.0, 0.0};
        for (int i = 0; i < 2; i++) {
            double sum = exp(z[i][0]) + exp(z[i][1]) + exp(z[i][2]);
            double dz = (exp(z[i][j]) / sum - (labels[i] == (uint32_t)j)) / 2;
            db += dz;
            dw[0] += dz * x[2 * i];
            dw[1] += dz * x[2 * i + 1];
        }
        ck_assert_double_eq_tol(g[spec.layers[0].b_off + j], db, 1e-6);
        ck_assert_double_eq_tol(g[spec.layers[0].w_off + 2 * j], dw[0], 1e-6);
        ck_assert_double_eq_tol(g[spec.layers[0].w_off + 2 * j + 1], dw[1], 1e-6);
    }

    // Evaluation runs the same head: its summed loss is n times the mean.
    uint32_t correct = 0;
    double sum = 0.0;
    ck_assert_int_eq(zps_cpu_evaluate(m, x, labels, 2, &correct, &sum), ZPS_OK);
    ck_assert_double_eq_tol(sum, l0 + l1, 1e-6);
    ck_assert_uint_eq(correct, 0);   // argmaxes are 1 and 1
    zps_cpu_destroy(&m);
}
END_TEST

// Logits of 1000 and 0 overflow a naive exp; the stable form gives loss 1000
// for the wrong label, ~0 for the right one, and softmax [1, 0].
START_TEST(test_cpu_loss_is_stable_for_large_logits)
{
    zps_model_spec spec;
    zps_cpu *m = s_new("mlp:1-2", 1, &spec);
    const float params[] = {1000, 0, 0, 0};
    memcpy(zps_cpu_params(m), params, sizeof params);
    const float x[] = {1};
    uint32_t label = 1;
    float loss;
    ck_assert_int_eq(zps_cpu_train_step(m, x, &label, 1, &loss), ZPS_OK);
    ck_assert_double_eq_tol(loss, 1000.0, 1e-3);
    const float *g = zps_cpu_grads(m);
    const float want[] = {1, -1, 1, -1};   // dW = dz x, db = dz, dz = [1, -1]
    for (int i = 0; i < 4; i++) {
        ck_assert_msg(isfinite(g[i]) && fabs(g[i] - want[i]) < 1e-6, "grad[%d] = %g", i, g[i]);
    }
    label = 0;
    ck_assert_int_eq(zps_cpu_train_step(m, x, &label, 1, &loss), ZPS_OK);
    ck_assert_double_eq_tol(loss, 0.0, 1e-6);
    zps_cpu_destroy(&m);
}
END_TEST

// A NaN weight in the first layer must reach the loss, not vanish in a
// ReLU: the worker relies on the loss to notice a diverged model.
START_TEST(test_cpu_nan_param_gives_nan_loss)
{
    zps_model_spec spec;
    zps_cpu *m = s_new(SMALL_MODEL, 4, &spec);
    s_init_params(&spec, SEED, zps_cpu_params(m));
    float x[4 * 7];
    uint32_t labels[4];
    s_random_batch(&spec, SEED, 4, x, labels);
    float loss;
    ck_assert_int_eq(zps_cpu_train_step(m, x, labels, 4, &loss), ZPS_OK);
    ck_assert(isfinite(loss));
    zps_cpu_params(m)[spec.layers[0].w_off] = NAN;
    ck_assert_int_eq(zps_cpu_train_step(m, x, labels, 4, &loss), ZPS_OK);
    ck_assert_msg(isnan(loss), "loss %g", loss);
    zps_cpu_destroy(&m);
}
END_TEST

// ---------------------------------------------------------------- evaluate

// mlp:2-3 with W = [[1,0],[0,1],[0,0]], b = 0: z = [x0, x1, 0].
START_TEST(test_cpu_evaluate_counts_correct_predictions)
{
    zps_model_spec spec;
    zps_cpu *m = s_new("mlp:2-3", 8, &spec);
    const float params[] = {1, 0, 0, 1, 0, 0, 0, 0, 0};
    memcpy(zps_cpu_params(m), params, sizeof params);
    const float x[] = {
        2,  1,    // z = [2, 1, 0]: 0, label 0, right
        1,  3,    // z = [1, 3, 0]: 1, label 0, wrong
        -1, -2,   // z = [-1, -2, 0]: 2, label 2, right
        1,  1,    // z = [1, 1, 0]: a tie goes to the lowest index, 0, label 0, right
        0,  0,    // z = [0, 0, 0]: a three-way tie, 0 again, label 0, right
    };
    const uint32_t labels[] = {0, 0, 2, 0, 0};
    uint32_t correct = 7;   // evaluate adds to the caller's totals
    double loss_sum = 0.5;
    ck_assert_int_eq(zps_cpu_evaluate(m, x, labels, 5, &correct, &loss_sum), ZPS_OK);
    ck_assert_uint_eq(correct, 7 + 4);
    double want = 0.5;
    for (int i = 0; i < 5; i++) {
        double z[3] = {x[2 * i], x[2 * i + 1], 0};
        want += s_ref_xent(z, 3, labels[i]);
    }
    ck_assert_double_eq_tol(loss_sum, want, 1e-6);
    zps_cpu_destroy(&m);
}
END_TEST

START_TEST(test_cpu_evaluate_in_chunks_equals_sum_over_chunks)
{
    enum { N = 11, MAX_BATCH = 4 };
    zps_model_spec spec;
    zps_cpu *m = s_new(SMALL_MODEL, MAX_BATCH, &spec);
    s_init_params(&spec, SEED, zps_cpu_params(m));
    float x[N * 7];
    uint32_t labels[N];
    s_random_batch(&spec, SEED + 1, N, x, labels);

    uint32_t correct = 0;
    double loss_sum = 0.0;
    ck_assert_int_eq(zps_cpu_evaluate(m, x, labels, N, &correct, &loss_sum), ZPS_OK);

    uint32_t chunk_correct = 0;
    double chunk_loss = 0.0;
    for (uint32_t off = 0; off < N; off += MAX_BATCH) {
        uint32_t k = N - off < MAX_BATCH ? N - off : MAX_BATCH;
        uint32_t c = 0;
        double l = 0.0;
        ck_assert_int_eq(zps_cpu_evaluate(m, x + off * 7, labels + off, k, &c, &l), ZPS_OK);
        chunk_correct += c;
        chunk_loss += l;
    }
    ck_assert_uint_eq(correct, chunk_correct);
    ck_assert_double_eq_tol(loss_sum, chunk_loss, 1e-9 * loss_sum);

    // And both agree with the double reference over all N samples.
    double *p = s_to_double(zps_cpu_params(m), spec.n_params);
    uint32_t ref_correct = 0;
    double ref_loss = s_ref_loss_sum(&spec, p, x, labels, N, &ref_correct);
    ck_assert_uint_eq(correct, ref_correct);
    ck_assert_double_eq_tol(loss_sum, ref_loss, 1e-5 * ref_loss);
    free(p);
    zps_cpu_destroy(&m);
}
END_TEST

// ---------------------------------------------------------------- arguments

START_TEST(test_cpu_train_step_rejects_bad_arguments)
{
    enum { MAX_BATCH = 4 };
    zps_model_spec spec;
    zps_cpu *m = s_new(SMALL_MODEL, MAX_BATCH, &spec);
    s_init_params(&spec, SEED, zps_cpu_params(m));
    float x[(MAX_BATCH + 1) * 7];
    uint32_t labels[MAX_BATCH + 1];
    s_random_batch(&spec, SEED, MAX_BATCH + 1, x, labels);
    float loss = -1.0f;

    ck_assert_int_eq(zps_cpu_train_step(m, x, labels, 0, &loss), ZPS_EINVAL);
    ck_assert_int_eq(zps_cpu_train_step(m, x, labels, MAX_BATCH + 1, &loss), ZPS_EINVAL);
    ck_assert_int_eq(zps_cpu_train_step(m, x, labels, MAX_BATCH, &loss), ZPS_OK);
    labels[2] = zps_model_classes(&spec);
    ck_assert_int_eq(zps_cpu_train_step(m, x, labels, MAX_BATCH, &loss), ZPS_EINVAL);

    // evaluate checks labels too, before touching the caller's totals.
    uint32_t correct = 3;
    double loss_sum = 2.0;
    ck_assert_int_eq(zps_cpu_evaluate(m, x, labels, MAX_BATCH, &correct, &loss_sum), ZPS_EINVAL);
    ck_assert_uint_eq(correct, 3);
    ck_assert_double_eq(loss_sum, 2.0);

    ck_assert_ptr_null(zps_cpu_new(&spec, 0));
    zps_cpu_destroy(&m);
    ck_assert_ptr_null(m);
    zps_cpu_destroy(&m);   // safe on NULL
}
END_TEST

// ---------------------------------------------------------------- hook

typedef struct s_hook_log {
    zps_cpu *m;                      // borrowed: the model being stepped
    const zps_model_spec *spec;      // borrowed: its layout
    int calls;                       // hook calls so far
    int order[ZPS_MODEL_MAX_LAYERS]; // layer of each call
    float *seen;                     // owned: each layer's grads as the hook saw them
} s_hook_log;

// Records the layer and copies its grads as they are at the call.
static void s_record_hook(void *arg, int layer)
{
    s_hook_log *log = arg;
    if (log->calls < ZPS_MODEL_MAX_LAYERS) {
        log->order[log->calls] = layer;
    }
    log->calls++;
    const zps_layer_spec *ls = &log->spec->layers[layer];
    size_t len = ls->b_off + ls->out - ls->w_off;
    memcpy(log->seen + ls->w_off, zps_cpu_grads(log->m) + ls->w_off, len * sizeof(float));
}

START_TEST(test_cpu_grad_hook_runs_once_per_layer_last_first)
{
    enum { N = 6 };
    zps_model_spec spec;
    zps_cpu *m = s_new(SMALL_MODEL, N, &spec);
    s_init_params(&spec, SEED, zps_cpu_params(m));
    float x[N * 7];
    uint32_t labels[N];
    // A first step without the hook, on other data, leaves stale grads that
    // a hook called too early would see.
    s_random_batch(&spec, SEED + 2, N, x, labels);
    ck_assert_int_eq(zps_cpu_train_step(m, x, labels, N, NULL), ZPS_OK);

    s_hook_log log = {.m = m, .spec = &spec};
    log.seen = calloc(spec.n_params, sizeof(float));
    ck_assert_ptr_nonnull(log.seen);
    zps_cpu_set_grad_hook(m, s_record_hook, &log);
    s_random_batch(&spec, SEED + 3, N, x, labels);
    ck_assert_int_eq(zps_cpu_train_step(m, x, labels, N, NULL), ZPS_OK);
    ck_assert_int_eq(log.calls, spec.n_layers);
    for (int i = 0; i < spec.n_layers; i++) {
        ck_assert_int_eq(log.order[i], spec.n_layers - 1 - i);
    }
    // Each layer's grads were final when its hook ran.
    ck_assert_mem_eq(log.seen, zps_cpu_grads(m), spec.n_params * sizeof(float));

    zps_cpu_set_grad_hook(m, NULL, NULL);
    ck_assert_int_eq(zps_cpu_train_step(m, x, labels, N, NULL), ZPS_OK);
    ck_assert_int_eq(log.calls, spec.n_layers);
    free(log.seen);
    zps_cpu_destroy(&m);
}
END_TEST

// ---------------------------------------------------------------- training

START_TEST(test_cpu_sgd_reduces_loss)
{
    enum { N = 256, BATCH = 32, STEPS = 40 };
    zps_model_spec spec;
    zps_cpu *m = s_new("mlp:4-16-2", BATCH, &spec);
    float *p = zps_cpu_params(m);
    zps_model_init_params(&spec, SEED, p);
    // Linearly separable: the label is the side of a fixed hyperplane.
    static float x[N * 4];
    static uint32_t labels[N];
    s_random_batch(&spec, SEED + 4, N, x, labels);
    for (int i = 0; i < N; i++) {
        const float *xi = x + 4 * i;
        labels[i] = xi[0] + xi[1] - xi[2] + 0.5f * xi[3] > 0.0f;
    }

    uint32_t correct0 = 0;
    double loss0 = 0.0;
    ck_assert_int_eq(zps_cpu_evaluate(m, x, labels, N, &correct0, &loss0), ZPS_OK);
    for (int s = 0; s < STEPS; s++) {
        int off = s * BATCH % N;
        ck_assert_int_eq(zps_cpu_train_step(m, x + 4 * off, labels + off, BATCH, NULL), ZPS_OK);
        const float *g = zps_cpu_grads(m);
        for (size_t i = 0; i < spec.n_params; i++) {
            p[i] -= 0.5f * g[i];
        }
    }
    uint32_t correct = 0;
    double loss = 0.0;
    ck_assert_int_eq(zps_cpu_evaluate(m, x, labels, N, &correct, &loss), ZPS_OK);
    ck_assert_msg(loss < 0.5 * loss0, "mean loss %g -> %g", loss0 / N, loss / N);
    ck_assert_msg(correct >= 0.9 * N && correct > correct0, "correct %u -> %u of %d", correct0,
                  correct, N);
    zps_cpu_destroy(&m);
}
END_TEST

// ---------------------------------------------------------------- suite

Suite *zps_suite_cpu(void)
{
    // Test names come from the functions; a table keeps registration to one line each.
    const TTest *tests[] = {
        test_cpu_grads_match_finite_differences,
        test_cpu_loss_matches_hand_computation,
        test_cpu_loss_is_stable_for_large_logits,
        test_cpu_nan_param_gives_nan_loss,
        test_cpu_evaluate_counts_correct_predictions,
        test_cpu_evaluate_in_chunks_equals_sum_over_chunks,
        test_cpu_train_step_rejects_bad_arguments,
        test_cpu_grad_hook_runs_once_per_layer_last_first,
        test_cpu_sgd_reduces_loss,
    };
    Suite *s = suite_create("cpu");
    TCase *tc = tcase_create("cpu");
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        tcase_add_test(tc, tests[i]);
    }
    suite_add_tcase(s, tc);
    return s;
}
