/* zps_backend.h - what the worker's loop computes with, whatever the device.
 *
 * A backend holds one copy of the model, its gradient and its activations.
 * The loop drops the server's parameters into zps_backend_params, runs a
 * step, and pushes each bucket of zps_backend_grads as soon as the bucket
 * hook says it is final. Backends: "cpu" (an MLP on OpenBLAS), "cuda[:N]"
 * (the same MLP on cuBLAS, from a plugin loaded only when asked for, see
 * zps_cuda.h) and, for a flat:P model, a gradient that costs nothing, so
 * benchmarks measure zps. */
#ifndef ZPS_BACKEND_H
#define ZPS_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "common/zps_err.h"
#include "common/zps_model.h"
#include "worker/zps_cuda.h"

// Highest N of "cuda:N".
#define ZPS_BACKEND_MAX_GPU 1023

typedef struct zps_backend zps_backend;

// Called as soon as the gradient of bucket i (zps_model_bucket) is final,
// in bucket order, from inside zps_backend_train_step.
typedef void (*zps_backend_bucket_fn)(void *arg, int bucket);

// Parses "cpu" (*gpu = -1), "cuda" (*gpu = 0) or "cuda:N" (*gpu = N, N in
// 0..ZPS_BACKEND_MAX_GPU, decimal digits only). False, silently, otherwise.
bool zps_backend_parse_device(const char *device, int *gpu);

// Parses "fp32", "tf32" or "bf16". False, silently, otherwise.
bool zps_backend_parse_gpu_math(const char *text, zps_gpu_math *out);

// CUDA devices this process can use, without logging: 0 with the reason in
// why when this build has no CUDA backend, the plugin does not load, or
// there is no driver or device. Never touches CUDA in a build without it.
int zps_backend_cuda_devices(char *why, size_t len);

// True if this build and machine can compute on `device`; otherwise says
// why in one line, once. "cpu" never touches CUDA.
bool zps_backend_supports(const char *device);

// A backend for `device` ("cpu", "cuda[:N]") and the model, for batches of
// up to max_batch samples; math is what cuBLAS may use on a GPU (ignored on
// the CPU). Caller owns the result; NULL on failure, logged.
zps_backend *zps_backend_new(const char *device, zps_gpu_math math, const zps_model_spec *spec,
                             uint32_t max_batch, uint64_t seed);
void zps_backend_destroy(zps_backend **b);

// False for a flat model: there is no data to load or evaluate.
bool zps_backend_uses_data(const zps_backend *b);
float *zps_backend_params(zps_backend *b);
const float *zps_backend_grads(const zps_backend *b);
void zps_backend_set_bucket_hook(zps_backend *b, zps_backend_bucket_fn fn, void *arg);

// The mean loss of the running train step: valid from its first bucket hook.
float zps_backend_loss(const zps_backend *b);

zps_err zps_backend_train_step(zps_backend *b, const float *x, const uint32_t *labels, uint32_t n,
                               float *loss);
zps_err zps_backend_evaluate(zps_backend *b, const float *x, const uint32_t *labels, uint32_t n,
                             uint32_t *correct, double *loss_sum);

#endif
