/* zps_cpu.h - the CPU backend: an MLP (Linear, ReLU, ..., Linear, softmax
 * cross-entropy) on OpenBLAS.
 *
 * Parameters and gradients are flat vectors laid out by zps_model_spec, so
 * the worker can push slices of the gradient and drop the server's new
 * parameters in place without knowing about layers. */
#ifndef ZPS_CPU_H
#define ZPS_CPU_H

#include <stdint.h>

#include "common/zps_err.h"
#include "common/zps_model.h"

typedef struct zps_cpu zps_cpu;

// Called during backward as soon as a layer's dW and db are final (last
// layer first), so the worker can push them while earlier layers still run.
typedef void (*zps_cpu_grad_ready_fn)(void *arg, int layer);

// A model for batches of up to max_batch samples. Caller owns the result
// (zps_cpu_destroy); NULL on failure, logged.
zps_cpu *zps_cpu_new(const zps_model_spec *spec, uint32_t max_batch);
void zps_cpu_destroy(zps_cpu **m);

// The flat parameter vector (spec->n_params floats), borrowed: the worker
// writes the server's parameters here before each step.
float *zps_cpu_params(zps_cpu *m);
// The flat gradient vector (spec->n_params floats), borrowed; valid after
// zps_cpu_train_step.
const float *zps_cpu_grads(const zps_cpu *m);

void zps_cpu_set_grad_hook(zps_cpu *m, zps_cpu_grad_ready_fn fn, void *arg);

// Forward and backward over n samples: x is (n, inputs) row-major, labels
// (n) in [0, classes). Writes the gradient of the mean loss over the n
// samples and the mean loss. ZPS_EINVAL if n is 0 or above max_batch, or a
// label is out of range.
zps_err zps_cpu_train_step(zps_cpu *m, const float *x, const uint32_t *labels, uint32_t n,
                           float *loss);

// The mean loss of the running train step: valid from its first grad hook.
float zps_cpu_loss(const zps_cpu *m);

// Forward only over n samples (any n: it runs in chunks of max_batch):
// adds the number of correct argmax predictions to *correct and the summed
// (not mean) loss to *loss_sum.
zps_err zps_cpu_evaluate(zps_cpu *m, const float *x, const uint32_t *labels, uint32_t n,
                         uint32_t *correct, double *loss_sum);

#endif
