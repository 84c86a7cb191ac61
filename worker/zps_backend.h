/* zps_backend.h - what the worker's loop computes with, whatever the device.
 *
 * A backend holds one copy of the model, its gradient and its activations.
 * The loop drops the server's parameters into zps_backend_params, runs a
 * step, and pushes each bucket of zps_backend_grads as soon as the bucket
 * hook says it is final. Backends: "cpu" (an MLP on OpenBLAS) and, for a
 * flat:P model, a gradient that costs nothing, so benchmarks measure zps. */
#ifndef ZPS_BACKEND_H
#define ZPS_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "common/zps_err.h"
#include "common/zps_model.h"

typedef struct zps_backend zps_backend;

// Called as soon as the gradient of bucket i (zps_model_bucket) is final,
// in bucket order, from inside zps_backend_train_step.
typedef void (*zps_backend_bucket_fn)(void *arg, int bucket);

// True if this build can compute on `device`; otherwise says why, once.
bool zps_backend_supports(const char *device);

// A backend for `device` ("cpu") and the model, for batches of up to
// max_batch samples. Caller owns the result; NULL on failure, logged.
zps_backend *zps_backend_new(const char *device, const zps_model_spec *spec, uint32_t max_batch,
                             uint64_t seed);
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
