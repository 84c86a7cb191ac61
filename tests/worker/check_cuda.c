/* check_cuda.c - tests of the CUDA backend (worker/zps_cuda.cu) through
 * zps_backend, the way the worker uses it.
 *
 * Without a GPU (or without a CUDA build) the device-string, math-name and
 * clean-failure tests run, and every GPU test prints
 * "SKIPPED: <test>: <reason>" to stderr and passes, so a CPU-only run shows
 * what it did not check. With a GPU: each layer's gradient against central
 * differences of a double-precision reference, the GPU against the CPU
 * backend on the same batch and parameters (relative difference <= 1e-4),
 * the tensor-core modes against fp32, and the edge cases of check_cpu.c. */
#include <check.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_model.h"
#include "common/zps_rng.h"
#include "tests/zps_check.h"
#include "worker/zps_backend.h"

#define SEED 20240611
#define REF_MAX_WIDTH 16   // widest layer the double reference handles
#define SMALL_MODEL "mlp:7-6-5-4"
#define WIDE_MODEL "mlp:784-512-512-10"

// ---------------------------------------------------------------- helpers

// True if a GPU can run the test; otherwise says, visibly, that it skipped.
static bool s_have_gpu(const char *test)
{
    char why[512] = "";
    if (zps_backend_cuda_devices(why, sizeof why) > 0) {
        return true;
    }
    fprintf(stderr, "SKIPPED: %s: %s\n", test, why);
    return false;
}

static zps_backend *s_new(const char *device, zps_gpu_math math, const char *text,
                          uint32_t max_batch, zps_model_spec *spec)
{
    ck_assert_int_eq(zps_model_parse(text, spec), ZPS_OK);
    zps_backend *b = zps_backend_new(device, math, spec, max_batch, SEED);
    ck_assert_msg(b != NULL, "no %s backend for %s", device, text);
    return b;
}

// He-normal weights and small random biases (the spec's zero biases would
// leave the bias path untested against a nonzero b).
static void s_init_params(const zps_model_spec *spec, float *params)
{
    zps_model_init_params(spec, SEED, params);
    zps_rng rng;
    zps_rng_seed(&rng, SEED, 100);
    for (int l = 0; l < spec->n_layers; l++) {
        for (uint32_t o = 0; o < spec->layers[l].out; o++) {
            params[spec->layers[l].b_off + o] = (float)(0.1 * zps_rng_normal(&rng));
        }
    }
}

static void s_random_batch(const zps_model_spec *spec, uint64_t seed, uint32_t n, float *x,
                           uint32_t *labels)
{
    zps_rng rng;
    zps_rng_seed(&rng, seed, 200);
    for (size_t i = 0; i < (size_t)n * zps_model_inputs(spec); i++) {
        x[i] = (float)zps_rng_normal(&rng);
    }
    for (uint32_t i = 0; i < n; i++) {
        labels[i] = (uint32_t)zps_rng_below(&rng, zps_model_classes(spec));
    }
}

// Mean loss of n samples through the model in double, naive loops.
static double s_ref_loss(const zps_model_spec *spec, const double *p, const float *x,
                         const uint32_t *labels, uint32_t n)
{
    double total = 0.0;
    for (uint32_t s = 0; s < n; s++) {
        double a[REF_MAX_WIDTH], z[REF_MAX_WIDTH] = {0};
        for (uint32_t i = 0; i < spec->layers[0].in; i++) {
            a[i] = x[(size_t)s * spec->layers[0].in + i];
        }
        for (int l = 0; l < spec->n_layers; l++) {
            const zps_layer_spec *ls = &spec->layers[l];
            ck_assert_uint_le(ls->in, REF_MAX_WIDTH);
            ck_assert_uint_le(ls->out, REF_MAX_WIDTH);
            for (uint32_t o = 0; o < ls->out; o++) {
                double v = p[ls->b_off + o];
                for (uint32_t i = 0; i < ls->in; i++) {
                    v += p[ls->w_off + (size_t)o * ls->in + i] * a[i];
                }
                z[o] = (l + 1 < spec->n_layers && v < 0.0) ? 0.0 : v;
            }
            memcpy(a, z, ls->out * sizeof *a);
        }
        double sum = exp(z[0]);
        for (uint32_t j = 1; j < zps_model_classes(spec); j++) {
            sum += exp(z[j]);
        }
        total += log(sum) - z[labels[s]];
    }
    return total / n;
}

// max |a - b| over [lo, hi) relative to max |b| there.
static double s_rel_diff(const float *a, const float *b, size_t lo, size_t hi)
{
    double d = 0.0, scale = 0.0;
    for (size_t i = lo; i < hi; i++) {
        double e = fabs((double)a[i] - b[i]);
        d = e > d || isnan(e) ? e : d;
        scale = fabs(b[i]) > scale ? fabs(b[i]) : scale;
    }
    return d / (scale > 0.0 ? scale : 1.0);
}

// ||a - b|| / ||b|| over [lo, hi): the measure for tensor-core math, where
// a ReLU that flips on a pre-activation within rounding of zero moves a
// whole column of dW, so the largest single difference says little.
static double s_rel_norm_diff(const float *a, const float *b, size_t lo, size_t hi)
{
    double d = 0.0, r = 0.0;
    for (size_t i = lo; i < hi; i++) {
        double e = (double)a[i] - b[i];
        d += e * e;
        r += (double)b[i] * b[i];
    }
    return isnan(d) ? d : sqrt(d) / (r > 0.0 ? sqrt(r) : 1.0);
}

// ---------------------------------------------------------------- everywhere

START_TEST(test_cuda_device_strings_parse)
{
    int gpu = 99;
    ck_assert(zps_backend_parse_device("cpu", &gpu));
    ck_assert_int_eq(gpu, -1);
    ck_assert(zps_backend_parse_device("cuda", &gpu));
    ck_assert_int_eq(gpu, 0);
    ck_assert(zps_backend_parse_device("cuda:3", &gpu));
    ck_assert_int_eq(gpu, 3);
    ck_assert(zps_backend_parse_device("cuda:1023", &gpu));
    ck_assert_int_eq(gpu, 1023);
    const char *bad[] = {"",        "gpu",     "cuda:",  "cuda:x", "cuda:-1", "cuda:+1",
                         "cuda: 1", "cuda:1x", "cuda0",  "CUDA",   "cuda:1024", "cuda:000001",
                         "cpu:0",   "cuda:0x1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        gpu = 99;
        ck_assert_msg(!zps_backend_parse_device(bad[i], &gpu), "'%s' parsed", bad[i]);
        ck_assert_int_eq(gpu, 99);
        ck_assert_msg(!zps_backend_supports(bad[i]), "'%s' supported", bad[i]);
    }
    ck_assert(zps_backend_supports("cpu"));
}
END_TEST

START_TEST(test_cuda_gpu_math_names_parse)
{
    zps_gpu_math m = ZPS_GPU_MATH_BF16;
    ck_assert(zps_backend_parse_gpu_math("fp32", &m));
    ck_assert_int_eq(m, ZPS_GPU_MATH_FP32);
    ck_assert(zps_backend_parse_gpu_math("tf32", &m));
    ck_assert_int_eq(m, ZPS_GPU_MATH_TF32);
    ck_assert(zps_backend_parse_gpu_math("bf16", &m));
    ck_assert_int_eq(m, ZPS_GPU_MATH_BF16);
    ck_assert(!zps_backend_parse_gpu_math("fp16", &m));
    ck_assert(!zps_backend_parse_gpu_math("", &m));
    ck_assert(!zps_backend_parse_gpu_math("TF32", &m));
    ck_assert_int_eq(m, ZPS_GPU_MATH_BF16);
}
END_TEST

// A device that is not there is refused with a reason and NULL, never a
// crash: no CUDA build, no driver, no GPU, or an index past the last GPU.
START_TEST(test_cuda_missing_device_fails_cleanly)
{
    char why[512] = "";
    int count = zps_backend_cuda_devices(why, sizeof why);
    ck_assert_int_ge(count, 0);
    if (count == 0) {
        ck_assert_msg(why[0] != '\0' && !strchr(why, '\n'), "reason '%s'", why);
        ck_assert(!zps_backend_supports("cuda"));
        ck_assert(!zps_backend_supports("cuda:0"));
    }
    zps_model_spec spec;
    ck_assert_int_eq(zps_model_parse(SMALL_MODEL, &spec), ZPS_OK);
    const char *missing = count == 0 ? "cuda:7" : "cuda:1023";
    ck_assert(!zps_backend_supports(missing));
    zps_backend *b = zps_backend_new(missing, ZPS_GPU_MATH_FP32, &spec, 8, SEED);
    ck_assert_ptr_null(b);
    zps_backend_destroy(&b); // safe on NULL
    // The CPU still works in the same process after a failed GPU probe.
    b = zps_backend_new("cpu", ZPS_GPU_MATH_FP32, &spec, 8, SEED);
    ck_assert_ptr_nonnull(b);
    zps_backend_destroy(&b);
}
END_TEST

// ---------------------------------------------------------------- GPU: gradients

START_TEST(test_cuda_grads_match_finite_differences)
{
    if (!s_have_gpu("test_cuda_grads_match_finite_differences")) {
        return;
    }
    enum { N = 5 };
    zps_model_spec spec;
    zps_backend *b = s_new("cuda", ZPS_GPU_MATH_FP32, SMALL_MODEL, 8, &spec);
    s_init_params(&spec, zps_backend_params(b));
    float x[N * 7];
    uint32_t labels[N];
    float loss;
    // A step on other data first: the checked step must overwrite grads.
    s_random_batch(&spec, SEED + 5, N, x, labels);
    ck_assert_int_eq(zps_backend_train_step(b, x, labels, N, &loss), ZPS_OK);
    s_random_batch(&spec, SEED, N, x, labels);
    ck_assert_int_eq(zps_backend_train_step(b, x, labels, N, &loss), ZPS_OK);
    double *p = malloc(spec.n_params * sizeof *p);
    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i < spec.n_params; i++) {
        p[i] = zps_backend_params(b)[i];
    }
    double ref = s_ref_loss(&spec, p, x, labels, N);
    ck_assert_double_eq_tol(loss, ref, 1e-5 * (1.0 + ref));

    // Central differences in double: truncation and rounding are far below
    // the tolerance, a wrong transpose or a missing 1/n far above it.
    const double h = 1e-5;
    const float *g = zps_backend_grads(b);
    for (int l = 0; l < spec.n_layers; l++) {
        const zps_layer_spec *ls = &spec.layers[l];
        double norm = 0.0;
        for (size_t i = ls->w_off; i < ls->b_off + ls->out; i++) {
            double keep = p[i];
            p[i] = keep + h;
            double up = s_ref_loss(&spec, p, x, labels, N);
            p[i] = keep - h;
            double down = s_ref_loss(&spec, p, x, labels, N);
            p[i] = keep;
            double fd = (up - down) / (2 * h);
            norm += fd * fd;
            ck_assert_msg(fabs(g[i] - fd) <= 1e-4 + 1e-3 * fabs(fd),
                          "layer %d %s[%zu]: gpu %g, finite difference %g", l,
                          i < ls->b_off ? "W" : "b", i < ls->b_off ? i - ls->w_off : i - ls->b_off,
                          g[i], fd);
        }
        ck_assert_msg(sqrt(norm) > 1e-2, "layer %d: gradient too small to test", l);
    }
    free(p);
    zps_backend_destroy(&b);
}
END_TEST

typedef struct s_hooks {
    zps_backend *b;    // borrowed
    int calls;         // hook calls so far
    int order[ZPS_MODEL_MAX_LAYERS]; // bucket of each call
    float first_loss;  // the loss as the first hook saw it
} s_hooks;

static void s_on_bucket(void *arg, int bucket)
{
    s_hooks *h = arg;
    if (h->calls == 0) {
        h->first_loss = zps_backend_loss(h->b);
    }
    if (h->calls < ZPS_MODEL_MAX_LAYERS) {
        h->order[h->calls] = bucket;
    }
    h->calls++;
}

// The GPU and the CPU on the same batch and parameters: loss, every
// layer's gradient and the evaluation agree; hooks come in bucket order
// with the loss already known. fp32 compares each layer's largest
// difference against its largest gradient; tensor-core math the norms
// (s_rel_norm_diff). grad_tol bounds the gradients, loss_tol the losses.
static void s_check_against_cpu(uint32_t n, zps_gpu_math math, double grad_tol, double loss_tol)
{
    zps_model_spec spec;
    zps_backend *cpu = s_new("cpu", ZPS_GPU_MATH_FP32, WIDE_MODEL, 128, &spec);
    zps_backend *gpu = s_new("cuda", math, WIDE_MODEL, 128, &spec);
    s_init_params(&spec, zps_backend_params(cpu));
    memcpy(zps_backend_params(gpu), zps_backend_params(cpu), spec.n_params * sizeof(float));
    size_t inputs = zps_model_inputs(&spec);
    float *x = malloc(300 * inputs * sizeof *x);
    uint32_t *labels = malloc(300 * sizeof *labels);
    ck_assert(x && labels);
    s_random_batch(&spec, SEED + n, 300, x, labels);

    s_hooks hooks = {.b = gpu};
    zps_backend_set_bucket_hook(gpu, s_on_bucket, &hooks);
    float lc, lg;
    ck_assert_int_eq(zps_backend_train_step(cpu, x, labels, n, &lc), ZPS_OK);
    ck_assert_int_eq(zps_backend_train_step(gpu, x, labels, n, &lg), ZPS_OK);
    ck_assert_int_eq(hooks.calls, spec.n_layers);
    for (int i = 0; i < spec.n_layers; i++) {
        ck_assert_int_eq(hooks.order[i], i);
    }
    ck_assert_float_eq(hooks.first_loss, lg);
    double dl = fabs((double)lc - lg) / fabs((double)lc);
    static const char *const names[] = {"fp32", "tf32", "bf16"};
    fprintf(stderr, "gpu vs cpu, n=%u, math %s: loss %.7g vs %.7g (rel %.2g)\n", n, names[math],
            lg, lc, dl);
    ck_assert_msg(dl <= loss_tol, "loss rel diff %g > %g", dl, loss_tol);
    const float *gg = zps_backend_grads(gpu), *gc = zps_backend_grads(cpu);
    bool by_norm = math != ZPS_GPU_MATH_FP32;
    for (int l = 0; l < spec.n_layers; l++) {
        const zps_layer_spec *ls = &spec.layers[l];
        size_t w0 = ls->w_off, b0 = ls->b_off, b1 = ls->b_off + ls->out;
        double dw = s_rel_diff(gg, gc, w0, b0), db = s_rel_diff(gg, gc, b0, b1);
        double nw = s_rel_norm_diff(gg, gc, w0, b0), nb = s_rel_norm_diff(gg, gc, b0, b1);
        fprintf(stderr, "  layer %d: dW max %.2g norm %.2g, db max %.2g norm %.2g\n", l, dw, nw,
                db, nb);
        double ew = by_norm ? nw : dw, eb = by_norm ? nb : db;
        ck_assert_msg(ew <= grad_tol && eb <= grad_tol, "layer %d: %s diff dW %g db %g > %g", l,
                      by_norm ? "norm" : "max", ew, eb, grad_tol);
    }

    // Evaluation in chunks of the max batch (300 = 128 + 128 + 44).
    uint32_t cc = 0, cg = 0;
    double sc = 0.0, sg = 0.0;
    ck_assert_int_eq(zps_backend_evaluate(cpu, x, labels, 300, &cc, &sc), ZPS_OK);
    ck_assert_int_eq(zps_backend_evaluate(gpu, x, labels, 300, &cg, &sg), ZPS_OK);
    ck_assert_msg(fabs(sc - sg) <= loss_tol * sc, "eval loss %g vs %g", sg, sc);
    // A near tie may flip one argmax between the two summation orders.
    ck_assert_msg(abs((int)cc - (int)cg) <= (math == ZPS_GPU_MATH_FP32 ? 1 : 6),
                  "correct %u vs %u", cg, cc);
    free(x);
    free(labels);
    zps_backend_destroy(&cpu);
    zps_backend_destroy(&gpu);
}

START_TEST(test_cuda_matches_cpu_on_same_batch)
{
    if (!s_have_gpu("test_cuda_matches_cpu_on_same_batch")) {
        return;
    }
    s_check_against_cpu(64, ZPS_GPU_MATH_FP32, 1e-4, 1e-4);
    s_check_against_cpu(37, ZPS_GPU_MATH_FP32, 1e-4, 1e-4); // not a multiple of anything
    s_check_against_cpu(128, ZPS_GPU_MATH_FP32, 1e-4, 1e-4);
}
END_TEST

// Tensor-core math rounds the GEMM inputs (tf32: 10-bit, bf16: 7-bit
// mantissa) and accumulates in fp32. bench/tc_emulate.c does the same in C
// over 12 random models and batches like these: the worst layer's norm
// difference was 0.035 (tf32) and 0.067 (bf16), a wrong transpose or scale
// gives about 1; the bounds are about three times the worst.
START_TEST(test_cuda_tensor_core_math_stays_close)
{
    if (!s_have_gpu("test_cuda_tensor_core_math_stays_close")) {
        return;
    }
    s_check_against_cpu(64, ZPS_GPU_MATH_TF32, 0.1, 1e-3);
    s_check_against_cpu(64, ZPS_GPU_MATH_BF16, 0.2, 1e-2);
}
END_TEST

// ---------------------------------------------------------------- GPU: edge cases

START_TEST(test_cuda_loss_is_stable_for_large_logits)
{
    if (!s_have_gpu("test_cuda_loss_is_stable_for_large_logits")) {
        return;
    }
    zps_model_spec spec;
    zps_backend *b = s_new("cuda:0", ZPS_GPU_MATH_FP32, "mlp:1-2", 1, &spec);
    const float params[] = {1000, 0, 0, 0};
    memcpy(zps_backend_params(b), params, sizeof params);
    const float x[] = {1};
    uint32_t label = 1;
    float loss;
    ck_assert_int_eq(zps_backend_train_step(b, x, &label, 1, &loss), ZPS_OK);
    ck_assert_double_eq_tol(loss, 1000.0, 1e-3);
    const float want[] = {1, -1, 1, -1};
    for (int i = 0; i < 4; i++) {
        float g = zps_backend_grads(b)[i];
        ck_assert_msg(isfinite(g) && fabs(g - want[i]) < 1e-6, "grad[%d] = %g", i, g);
    }
    label = 0;
    ck_assert_int_eq(zps_backend_train_step(b, x, &label, 1, &loss), ZPS_OK);
    ck_assert_double_eq_tol(loss, 0.0, 1e-6);
    zps_backend_destroy(&b);
}
END_TEST

START_TEST(test_cuda_nan_param_gives_nan_loss)
{
    if (!s_have_gpu("test_cuda_nan_param_gives_nan_loss")) {
        return;
    }
    zps_model_spec spec;
    zps_backend *b = s_new("cuda", ZPS_GPU_MATH_FP32, SMALL_MODEL, 4, &spec);
    s_init_params(&spec, zps_backend_params(b));
    float x[4 * 7];
    uint32_t labels[4];
    s_random_batch(&spec, SEED, 4, x, labels);
    float loss;
    ck_assert_int_eq(zps_backend_train_step(b, x, labels, 4, &loss), ZPS_OK);
    ck_assert(isfinite(loss));
    zps_backend_params(b)[spec.layers[0].w_off] = NAN;
    ck_assert_int_eq(zps_backend_train_step(b, x, labels, 4, &loss), ZPS_OK);
    ck_assert_msg(isnan(loss), "loss %g", loss);
    zps_backend_destroy(&b);
}
END_TEST

START_TEST(test_cuda_rejects_bad_arguments)
{
    if (!s_have_gpu("test_cuda_rejects_bad_arguments")) {
        return;
    }
    enum { MAX_BATCH = 4 };
    zps_model_spec spec;
    zps_backend *b = s_new("cuda", ZPS_GPU_MATH_FP32, SMALL_MODEL, MAX_BATCH, &spec);
    s_init_params(&spec, zps_backend_params(b));
    float x[(MAX_BATCH + 1) * 7];
    uint32_t labels[MAX_BATCH + 1];
    s_random_batch(&spec, SEED, MAX_BATCH + 1, x, labels);
    float loss;
    ck_assert_int_eq(zps_backend_train_step(b, x, labels, 0, &loss), ZPS_EINVAL);
    ck_assert_int_eq(zps_backend_train_step(b, x, labels, MAX_BATCH + 1, &loss), ZPS_EINVAL);
    ck_assert_int_eq(zps_backend_train_step(b, x, labels, MAX_BATCH, &loss), ZPS_OK);
    labels[2] = zps_model_classes(&spec);
    ck_assert_int_eq(zps_backend_train_step(b, x, labels, MAX_BATCH, &loss), ZPS_EINVAL);
    uint32_t correct = 3;
    double loss_sum = 2.0;
    ck_assert_int_eq(zps_backend_evaluate(b, x, labels, MAX_BATCH, &correct, &loss_sum),
                     ZPS_EINVAL);
    ck_assert_uint_eq(correct, 3);
    ck_assert_double_eq(loss_sum, 2.0);
    // The backend still works after refusing.
    labels[2] = 0;
    ck_assert_int_eq(zps_backend_train_step(b, x, labels, MAX_BATCH, &loss), ZPS_OK);
    ck_assert(isfinite(loss));
    zps_backend_destroy(&b);
    ck_assert_ptr_null(b);
}
END_TEST

Suite *zps_suite_cuda(void)
{
    Suite *s = suite_create("cuda");
    TCase *tc = tcase_create("anywhere");
    tcase_add_test(tc, test_cuda_device_strings_parse);
    tcase_add_test(tc, test_cuda_gpu_math_names_parse);
    tcase_add_test(tc, test_cuda_missing_device_fails_cleanly);
    suite_add_tcase(s, tc);
    tc = tcase_create("gpu");
    // The CPU reference of the wide model and the finite differences take
    // a few seconds; CUDA's start-up a few more.
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_cuda_grads_match_finite_differences);
    tcase_add_test(tc, test_cuda_matches_cpu_on_same_batch);
    tcase_add_test(tc, test_cuda_tensor_core_math_stays_close);
    tcase_add_test(tc, test_cuda_loss_is_stable_for_large_logits);
    tcase_add_test(tc, test_cuda_nan_param_gives_nan_loss);
    tcase_add_test(tc, test_cuda_rejects_bad_arguments);
    suite_add_tcase(s, tc);
    return s;
}
