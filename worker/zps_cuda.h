/* zps_cuda.h - the CUDA backend: the MLP of zps_cpu.h (Linear, ReLU, ...,
 * Linear, softmax cross-entropy) with GEMMs on cuBLAS, parameters and
 * activations resident on the device.
 *
 * It is built as a plugin (libzps_cuda.so, from zps_cuda.cu) that
 * zps_backend.c loads with dlopen only when a worker asks for
 * --device cuda[:N]: a CPU worker never maps the CUDA libraries, needs no
 * driver and runs under valgrind as before. This header is plain C and
 * needs no CUDA header; the plugin exports one symbol,
 * zps_cuda_plugin_api, a table of the functions below. */
#ifndef ZPS_CUDA_H
#define ZPS_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/zps_err.h"
#include "common/zps_model.h"

#ifdef __cplusplus
extern "C" {
#endif

// Bumped whenever the table or a type below changes: a worker refuses a
// plugin of another version instead of calling through a wrong table.
#define ZPS_CUDA_API_VERSION 1
#define ZPS_CUDA_PLUGIN_NAME "libzps_cuda.so"
#define ZPS_CUDA_PLUGIN_SYMBOL "zps_cuda_plugin_api"

// What cuBLAS may use for the GEMMs. Accumulation and the master weights
// stay fp32 in every mode; tf32 and bf16 round the GEMM inputs so tensor
// cores can run them.
typedef enum zps_gpu_math {
    ZPS_GPU_MATH_FP32 = 0, // plain fp32 GEMMs (default): equal to the CPU within 1e-4
    ZPS_GPU_MATH_TF32 = 1, // inputs rounded to tf32 (10-bit mantissa)
    ZPS_GPU_MATH_BF16 = 2, // inputs rounded to bf16 (7-bit mantissa)
} zps_gpu_math;

typedef struct zps_cuda zps_cuda;

// Where the plugin's log lines go (one line each, no newline); error is
// false for information (the GEMM timing summary), true for failures.
typedef void (*zps_cuda_log_fn)(bool error, const char *line);

// Called during a train step as soon as a layer's dW and db have landed in
// the host gradient buffer (last layer first).
typedef void (*zps_cuda_grad_ready_fn)(void *arg, int layer);

typedef struct zps_cuda_api {
    int version; // ZPS_CUDA_API_VERSION of the plugin

    // Sets where error lines go (default stderr).
    void (*set_log)(zps_cuda_log_fn fn);

    // Number of CUDA devices this process can use; 0 with the reason in
    // why (cudaGetDeviceCount's error string) when there are none.
    int (*device_count)(char *why, size_t len);

    // A model on device gpu for batches of up to max_batch samples. Caller
    // owns the result (destroy, which logs the GEMMs' time per step and
    // TFLOP/s if it ran any); NULL on failure, logged.
    zps_cuda *(*create)(const zps_model_spec *spec, uint32_t max_batch, int gpu,
                        zps_gpu_math math);
    void (*destroy)(zps_cuda **m);

    // The flat parameter vector in pinned host memory, borrowed: the worker
    // writes the server's parameters here before each step; a step uploads
    // it layer by layer.
    float *(*params)(zps_cuda *m);
    // The flat gradient vector in pinned host memory, borrowed: a layer's
    // part is final when its hook runs.
    const float *(*grads)(const zps_cuda *m);
    void (*set_grad_hook)(zps_cuda *m, zps_cuda_grad_ready_fn fn, void *arg);

    // As zps_cpu_train_step: the gradient of the mean loss over n samples.
    zps_err (*train_step)(zps_cuda *m, const float *x, const uint32_t *labels, uint32_t n,
                          float *loss);
    // The mean loss of the running train step: valid from its first hook.
    float (*loss)(const zps_cuda *m);
    // As zps_cpu_evaluate: any n, in chunks of max_batch.
    zps_err (*evaluate)(zps_cuda *m, const float *x, const uint32_t *labels, uint32_t n,
                        uint32_t *correct, double *loss_sum);
} zps_cuda_api;

// The plugin's one exported symbol.
const zps_cuda_api *zps_cuda_plugin_api(void);
typedef const zps_cuda_api *(*zps_cuda_plugin_fn)(void);

#ifdef __cplusplus
}
#endif

#endif
