/* zps_cuda.cu - the CUDA backend (libzps_cuda.so): forward and backward of
 * the MLP of zps_model.h on one GPU, the same math as zps_cpu.c.
 *
 * GEMMs run on cuBLAS; bias+ReLU, the ReLU mask, the bias gradient and the
 * softmax cross-entropy head are kernels of this file. Parameters,
 * gradients and activations live on the device; the host sees two pinned
 * buffers, the flat parameters (written by the worker before a step) and
 * the flat gradients (pushed by the worker bucket by bucket).
 *
 * Two streams and events, no device-wide synchronisation:
 *   copy stream     params layer 0 .. L-1 up  -> param_up[l]
 *   compute stream  wait param_up[l], forward layer l; head; backward
 *                   layer l -> grad_done[l]
 *   copy stream     wait grad_done[l], dW|db of layer l down -> landed[l]
 * The host launches the whole step, then waits on landed[L-1], ..., landed[0]
 * in turn and calls the hook after each, so the worker pushes the last
 * layers while the first ones still compute, and forward of layer 0 starts
 * while the later layers' parameters are still on their way up.
 *
 * Row-major as in zps_cpu.c: x and activations are (n, features), W of a
 * layer is (out, in). cuBLAS is column-major, so every GEMM below computes
 * the transpose of the row-major product (a row-major (r, c) matrix is a
 * column-major (c, r) one with the same leading dimension). */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/zps_cuda.h"

#define ZPS_CUDA_THREADS 256   // threads per block of the elementwise kernels
#define ZPS_CUDA_HEAD_THREADS 128 // threads per row of the softmax head
#define ZPS_CUDA_MAX_BLOCKS 4096  // grid-stride loops cover the rest
// GEMMs of a train step: forward, dW and dX of every layer.
#define ZPS_CUDA_MAX_GEMMS (3 * ZPS_MODEL_MAX_LAYERS)

struct zps_cuda {
    zps_model_spec spec;                     // layout of params and grads
    uint32_t max_batch;                      // largest n a call runs at once
    int gpu;                                 // device index
    cublasComputeType_t compute;             // fp32, or fast tf32
    bool bf16;                               // GEMM operands rounded to bf16 first
    cublasHandle_t blas;                     // owned, on `compute` stream
    cudaStream_t cs;                         // owned: compute stream
    cudaStream_t xs;                         // owned: copy stream (params up, grads down)
    cudaEvent_t param_up[ZPS_MODEL_MAX_LAYERS];  // owned: layer l's params are on the device
    cudaEvent_t grad_done[ZPS_MODEL_MAX_LAYERS]; // owned: layer l's dW, db are computed
    cudaEvent_t landed[ZPS_MODEL_MAX_LAYERS];    // owned: ... and copied to h_grads
    cudaEvent_t head_done;                   // owned: the loss of the step is reduced
    cudaEvent_t step_done;                   // owned: compute no longer reads d_params
    float *h_params;                         // owned, pinned: n_params floats
    float *h_grads;                          // owned, pinned: n_params floats
    float *h_x;                              // owned, pinned: (max_batch, inputs) staging
    uint32_t *h_labels;                      // owned, pinned: max_batch staging
    double *h_loss;                          // owned, pinned: summed loss of the last head
    uint32_t *h_hits;                        // owned, pinned: correct predictions of it
    float *d_params;                         // owned, device: n_params
    __nv_bfloat16 *d_bf[2];                  // owned, device, bf16 only: a GEMM's A and B
    float *d_grads;                          // owned, device: n_params
    float *d_act[ZPS_MODEL_MAX_LAYERS];      // owned, device: layer l's output (n, out)
    float *d_delta[2];                       // owned, device: (n, widest) dZ / dX in turn
    float *d_x;                              // owned, device: (max_batch, inputs)
    uint32_t *d_labels;                      // owned, device: max_batch
    double *d_row_loss;                      // owned, device: per-sample loss
    uint32_t *d_row_hit;                     // owned, device: per-sample argmax == label
    double *d_loss;                          // owned, device: summed loss
    uint32_t *d_hits;                        // owned, device: summed hits
    cudaEvent_t gemm_t[ZPS_CUDA_MAX_GEMMS][2]; // owned: timing events around each GEMM
    int n_gemms;                             // GEMMs timed in the running step
    double gemm_flop;                        // their FLOPs
    double sum_gemm_ms, sum_gemm_flop;       // over the train steps after the first
    uint64_t steps;                          // train steps in those sums
    bool warm;                               // the first train step is done
    char name[256];                          // the device's name, for the summary
    zps_cuda_grad_ready_fn hook;             // borrowed: called as each layer's grads land
    void *hook_arg;                          // borrowed: hook's argument
    float loss;                              // mean loss of the running or last train step
};

// ---------------------------------------------------------------- errors

static zps_cuda_log_fn s_log_fn; // where error lines go; NULL: stderr

static void s_set_log(zps_cuda_log_fn fn)
{
    s_log_fn = fn;
}

static void s_vlog(bool error, const char *fmt, va_list ap)
{
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    if (s_log_fn) {
        s_log_fn(error, line);
    } else {
        fprintf(stderr, "%s\n", line);
    }
}

static void s_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void s_log(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    s_vlog(true, fmt, ap);
    va_end(ap);
}

static void s_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void s_info(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    s_vlog(false, fmt, ap);
    va_end(ap);
}

// True if a CUDA call succeeded; logs what failed otherwise. Every runtime
// call goes through here: an asynchronous error (a bad launch, a lost
// device) surfaces at the next call, which then names itself.
static bool s_ok(cudaError_t e, const char *what)
{
    if (e == cudaSuccess) {
        return true;
    }
    s_log("cuda: %s: %s", what, cudaGetErrorString(e));
    return false;
}

static bool s_blas_ok(cublasStatus_t s, const char *what)
{
    if (s == CUBLAS_STATUS_SUCCESS) {
        return true;
    }
    s_log("cublas: %s: %s", what, cublasGetStatusString(s));
    return false;
}

// A kernel launch reports a bad configuration only through the next query.
static bool s_launched(const char *kernel)
{
    return s_ok(cudaGetLastError(), kernel);
}

static unsigned s_blocks(size_t len)
{
    size_t b = (len + ZPS_CUDA_THREADS - 1) / ZPS_CUDA_THREADS;
    return (unsigned)(b < 1 ? 1 : b > ZPS_CUDA_MAX_BLOCKS ? ZPS_CUDA_MAX_BLOCKS : b);
}

// ---------------------------------------------------------------- kernels

// z (n, out) += b broadcast over the rows, then ReLU unless it is the last
// layer (logits): bias and activation in one pass over z after the GEMM.
// A NaN stays NaN (v < 0 is false), so a diverged model shows in the loss.
__global__ void bias_act_kernel(float *z, const float *b, size_t len, uint32_t out, bool relu)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < len;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = z[i] + b[i % out];
        z[i] = relu && v < 0.0f ? 0.0f : v;
    }
}

// y = x rounded to bf16 (to nearest even): a GEMM operand for --gpu-math
// bf16, whose GEMM then multiplies in bf16 and accumulates in fp32.
__global__ void to_bf16_kernel(const float *x, __nv_bfloat16 *y, size_t len)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < len;
         i += (size_t)gridDim.x * blockDim.x) {
        y[i] = __float2bfloat16_rn(x[i]);
    }
}

// Zeroes d where the ReLU output a was 0: no gradient flows through an
// inactive unit.
__global__ void relu_mask_kernel(float *d, const float *a, size_t len)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < len;
         i += (size_t)gridDim.x * blockDim.x) {
        d[i] = a[i] > 0.0f ? d[i] : 0.0f;
    }
}

// db (out) = column sums of dz (n, out): one thread per column, rows in
// order, so the sum is deterministic and reads are coalesced across threads.
__global__ void bias_grad_kernel(const float *dz, float *db, uint32_t n, uint32_t out)
{
    for (uint32_t j = blockIdx.x * blockDim.x + threadIdx.x; j < out;
         j += gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (uint32_t i = 0; i < n; i++) {
            s += dz[(size_t)i * out + j];
        }
        db[j] = s;
    }
}

// True if (v, j) beats (bv, bj) as the argmax: larger, or equal and a lower
// index, so a tie goes to the lowest index as on the CPU.
__device__ bool s_better(float v, uint32_t j, float bv, uint32_t bj)
{
    return v > bv || (v == bv && j < bj);
}

// The softmax cross-entropy head, one block per row of the logits z (n, c):
// the per-sample loss logsumexp(z) - z[label] (in double, as on the CPU),
// whether the argmax is the label, and, when dz is given, the gradient of
// the mean loss, dz = (softmax - onehot) * inv_n.
__global__ void xent_kernel(const float *z, const uint32_t *labels, uint32_t c, float inv_n,
                            float *dz, double *row_loss, uint32_t *row_hit)
{
    __shared__ float s_v[ZPS_CUDA_HEAD_THREADS];
    __shared__ uint32_t s_j[ZPS_CUDA_HEAD_THREADS];
    const float *zi = z + (size_t)blockIdx.x * c;
    uint32_t t = threadIdx.x;

    // argmax (and so the max) over the row
    float bv = -INFINITY;
    uint32_t bj = UINT32_MAX;
    for (uint32_t j = t; j < c; j += blockDim.x) {
        if (bj == UINT32_MAX || s_better(zi[j], j, bv, bj)) {
            bv = zi[j];
            bj = j;
        }
    }
    s_v[t] = bv;
    s_j[t] = bj;
    __syncthreads();
    for (uint32_t half = blockDim.x / 2; half > 0; half /= 2) {
        if (t < half && s_j[t + half] != UINT32_MAX &&
            (s_j[t] == UINT32_MAX || s_better(s_v[t + half], s_j[t + half], s_v[t], s_j[t]))) {
            s_v[t] = s_v[t + half];
            s_j[t] = s_j[t + half];
        }
        __syncthreads();
    }
    float max = s_v[0];
    uint32_t best = s_j[0];
    __syncthreads();

    // sum of exp(z - max): at least 1, and exp cannot overflow
    float sum = 0.0f;
    for (uint32_t j = t; j < c; j += blockDim.x) {
        sum += expf(zi[j] - max);
    }
    s_v[t] = sum;
    __syncthreads();
    for (uint32_t half = blockDim.x / 2; half > 0; half /= 2) {
        if (t < half) {
            s_v[t] += s_v[t + half];
        }
        __syncthreads();
    }
    sum = s_v[0];

    uint32_t label = labels[blockIdx.x];
    if (dz) {
        float *di = dz + (size_t)blockIdx.x * c;
        float scale = inv_n / sum;
        for (uint32_t j = t; j < c; j += blockDim.x) {
            di[j] = expf(zi[j] - max) * scale - (j == label ? inv_n : 0.0f);
        }
    }
    if (t == 0) {
        row_loss[blockIdx.x] = (double)max + log((double)sum) - (double)zi[label];
        row_hit[blockIdx.x] = best == label;
    }
}

// Sums the per-sample losses and hits of n rows in one block, in a fixed
// order, so the loss does not depend on scheduling.
__global__ void sum_rows_kernel(const double *row_loss, const uint32_t *row_hit, uint32_t n,
                                double *loss, uint32_t *hits)
{
    __shared__ double s_l[ZPS_CUDA_THREADS];
    __shared__ uint32_t s_h[ZPS_CUDA_THREADS];
    uint32_t t = threadIdx.x;
    double l = 0.0;
    uint32_t h = 0;
    for (uint32_t i = t; i < n; i += blockDim.x) {
        l += row_loss[i];
        h += row_hit[i];
    }
    s_l[t] = l;
    s_h[t] = h;
    __syncthreads();
    for (uint32_t half = blockDim.x / 2; half > 0; half /= 2) {
        if (t < half) {
            s_l[t] += s_l[t + half];
            s_h[t] += s_h[t + half];
        }
        __syncthreads();
    }
    if (t == 0) {
        *loss = s_l[0];
        *hits = s_h[0];
    }
}

// ---------------------------------------------------------------- device and memory

static int s_device_count(char *why, size_t len)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        // A failed query leaves a sticky-looking last error; clear it so a
        // later, unrelated check does not report it again.
        (void)cudaGetLastError();
        snprintf(why, len, "no usable CUDA device: %s (%s)%s", cudaGetErrorString(e),
                 cudaGetErrorName(e),
                 e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice
                     ? "; is an NVIDIA GPU with its driver installed?"
                     : "");
        return 0;
    }
    if (count == 0) {
        snprintf(why, len, "no CUDA device on this machine");
    }
    return count;
}

static bool s_host_alloc(void **p, size_t bytes, const char *what)
{
    return s_ok(cudaHostAlloc(p, bytes ? bytes : 1, cudaHostAllocDefault), what);
}

static bool s_dev_alloc(void **p, size_t bytes, const char *what)
{
    return s_ok(cudaMalloc(p, bytes ? bytes : 1), what);
}

// s_destroy's events, and the activations allocated per layer with them.
static void s_destroy_events(zps_cuda *m)
{
    for (int l = 0; l < ZPS_MODEL_MAX_LAYERS; l++) {
        cudaEvent_t *evs[3] = {&m->param_up[l], &m->grad_done[l], &m->landed[l]};
        for (int k = 0; k < 3; k++) {
            if (*evs[k]) {
                (void)s_ok(cudaEventDestroy(*evs[k]), "cudaEventDestroy");
            }
        }
        if (m->d_act[l]) {
            (void)s_ok(cudaFree(m->d_act[l]), "cudaFree");
        }
    }
    for (int k = 0; k < ZPS_CUDA_MAX_GEMMS; k++) {
        for (int e = 0; e < 2; e++) {
            if (m->gemm_t[k][e]) {
                (void)s_ok(cudaEventDestroy(m->gemm_t[k][e]), "cudaEventDestroy");
            }
        }
    }
    if (m->head_done) {
        (void)s_ok(cudaEventDestroy(m->head_done), "cudaEventDestroy");
    }
    if (m->step_done) {
        (void)s_ok(cudaEventDestroy(m->step_done), "cudaEventDestroy");
    }
}

// s_destroy's buffers, pinned on the host and on the device.
static void s_destroy_buffers(zps_cuda *m)
{
    void *host[] = {m->h_params, m->h_grads, m->h_x, m->h_labels, m->h_loss, m->h_hits};
    for (size_t k = 0; k < sizeof host / sizeof host[0]; k++) {
        if (host[k]) {
            (void)s_ok(cudaFreeHost(host[k]), "cudaFreeHost");
        }
    }
    void *dev[] = {m->d_params, m->d_grads,  m->d_delta[0], m->d_delta[1],
                   m->d_x,      m->d_labels, m->d_row_loss, m->d_row_hit,
                   m->d_loss,   m->d_hits,   m->d_bf[0],    m->d_bf[1]};
    for (size_t k = 0; k < sizeof dev / sizeof dev[0]; k++) {
        if (dev[k]) {
            (void)s_ok(cudaFree(dev[k]), "cudaFree");
        }
    }
}

static void s_destroy(zps_cuda **mp)
{
    zps_cuda *m = mp ? *mp : NULL;
    if (!m) {
        return;
    }
    if (m->steps > 0 && m->sum_gemm_ms > 0) {
        double ms = m->sum_gemm_ms / (double)m->steps;
        s_info("cuda:%d (%s): %llu train steps after the first: GEMMs %.3f ms/step, "
               "%.1f GFLOP/step, %.2f TFLOP/s",
               m->gpu, m->name, (unsigned long long)m->steps, ms,
               m->sum_gemm_flop / (double)m->steps / 1e9, m->sum_gemm_flop / m->sum_gemm_ms / 1e9);
    }
    // Errors while tearing down are logged by s_ok and otherwise ignored:
    // there is nothing left to do about them.
    (void)s_ok(cudaSetDevice(m->gpu), "cudaSetDevice");
    if (m->cs) {
        (void)s_ok(cudaStreamSynchronize(m->cs), "cudaStreamSynchronize");
    }
    if (m->xs) {
        (void)s_ok(cudaStreamSynchronize(m->xs), "cudaStreamSynchronize");
    }
    if (m->blas) {
        (void)s_blas_ok(cublasDestroy(m->blas), "cublasDestroy");
    }
    s_destroy_events(m);
    s_destroy_buffers(m);
    if (m->cs) {
        (void)s_ok(cudaStreamDestroy(m->cs), "cudaStreamDestroy");
    }
    if (m->xs) {
        (void)s_ok(cudaStreamDestroy(m->xs), "cudaStreamDestroy");
    }
    free(m);
    *mp = NULL;
}

// Streams, events and the cuBLAS handle of m.
static bool s_create_sync(zps_cuda *m)
{
    if (!s_ok(cudaStreamCreateWithFlags(&m->cs, cudaStreamNonBlocking), "compute stream") ||
        !s_ok(cudaStreamCreateWithFlags(&m->xs, cudaStreamNonBlocking), "copy stream")) {
        return false;
    }
    // Timing is off: these events only order work, and timing makes them
    // slower to record and wait on.
    for (int l = 0; l < m->spec.n_layers; l++) {
        if (!s_ok(cudaEventCreateWithFlags(&m->param_up[l], cudaEventDisableTiming), "event") ||
            !s_ok(cudaEventCreateWithFlags(&m->grad_done[l], cudaEventDisableTiming), "event") ||
            !s_ok(cudaEventCreateWithFlags(&m->landed[l], cudaEventDisableTiming), "event")) {
            return false;
        }
    }
    // These do time: the GEMMs' own time, for the TFLOP/s of the summary.
    for (int k = 0; k < 3 * m->spec.n_layers; k++) {
        if (!s_ok(cudaEventCreate(&m->gemm_t[k][0]), "event") ||
            !s_ok(cudaEventCreate(&m->gemm_t[k][1]), "event")) {
            return false;
        }
    }
    if (!s_ok(cudaEventCreateWithFlags(&m->head_done, cudaEventDisableTiming), "event") ||
        !s_ok(cudaEventCreateWithFlags(&m->step_done, cudaEventDisableTiming), "event") ||
        !s_blas_ok(cublasCreate(&m->blas), "cublasCreate") ||
        !s_blas_ok(cublasSetStream(m->blas, m->cs), "cublasSetStream")) {
        return false;
    }
    // Pointer mode host: alpha and beta below are host scalars.
    return s_blas_ok(cublasSetPointerMode(m->blas, CUBLAS_POINTER_MODE_HOST), "pointer mode");
}

// Every buffer of m. Sizes cannot overflow: widths are at most 2^20 and
// max_batch at most INT_MAX (cuBLAS takes int dimensions).
static bool s_create_memory(zps_cuda *m)
{
    size_t np = m->spec.n_params * sizeof(float);
    size_t nb = m->max_batch;
    size_t widest = 0;
    size_t inputs = zps_model_inputs(&m->spec);
    for (int l = 0; l < m->spec.n_layers; l++) {
        size_t out = m->spec.layers[l].out;
        widest = out > widest ? out : widest;
        if (!s_dev_alloc((void **)&m->d_act[l], nb * out * sizeof(float), "activations")) {
            return false;
        }
    }
    if (!s_host_alloc((void **)&m->h_params, np, "pinned parameters") ||
        !s_host_alloc((void **)&m->h_grads, np, "pinned gradients") ||
        !s_host_alloc((void **)&m->h_x, nb * inputs * sizeof(float), "pinned batch") ||
        !s_host_alloc((void **)&m->h_labels, nb * sizeof(uint32_t), "pinned labels") ||
        !s_host_alloc((void **)&m->h_loss, sizeof(double), "pinned loss") ||
        !s_host_alloc((void **)&m->h_hits, sizeof(uint32_t), "pinned hits") ||
        !s_dev_alloc((void **)&m->d_params, np, "parameters") ||
        !s_dev_alloc((void **)&m->d_grads, np, "gradients") ||
        !s_dev_alloc((void **)&m->d_delta[0], nb * widest * sizeof(float), "deltas") ||
        !s_dev_alloc((void **)&m->d_delta[1], nb * widest * sizeof(float), "deltas") ||
        !s_dev_alloc((void **)&m->d_x, nb * inputs * sizeof(float), "batch") ||
        !s_dev_alloc((void **)&m->d_labels, nb * sizeof(uint32_t), "labels") ||
        !s_dev_alloc((void **)&m->d_row_loss, nb * sizeof(double), "row losses") ||
        !s_dev_alloc((void **)&m->d_row_hit, nb * sizeof(uint32_t), "row hits") ||
        !s_dev_alloc((void **)&m->d_loss, sizeof(double), "loss") ||
        !s_dev_alloc((void **)&m->d_hits, sizeof(uint32_t), "hits")) {
        return false;
    }
    if (m->bf16) {
        // The largest operand: a layer's W, or a batch of activations,
        // inputs or deltas.
        size_t most = nb * (widest > inputs ? widest : inputs);
        for (int l = 0; l < m->spec.n_layers; l++) {
            size_t w = (size_t)m->spec.layers[l].in * m->spec.layers[l].out;
            most = w > most ? w : most;
        }
        if (!s_dev_alloc((void **)&m->d_bf[0], most * sizeof(__nv_bfloat16), "bf16 operands") ||
            !s_dev_alloc((void **)&m->d_bf[1], most * sizeof(__nv_bfloat16), "bf16 operands")) {
            return false;
        }
    }
    // Zeroed so params and grads read as 0, never as garbage, before the
    // first pull or step (as on the CPU).
    memset(m->h_params, 0, np);
    memset(m->h_grads, 0, np);
    // On the compute stream: a non-blocking stream does not order itself
    // after work on the legacy default stream.
    return s_ok(cudaMemsetAsync(m->d_grads, 0, np, m->cs), "cudaMemsetAsync");
}

static zps_cuda *s_create(const zps_model_spec *spec, uint32_t max_batch, int gpu,
                          zps_gpu_math math)
{
    if (spec->kind != ZPS_MODEL_MLP || spec->n_layers < 1 ||
        spec->n_layers > ZPS_MODEL_MAX_LAYERS) {
        s_log("cuda: model '%s' is not an MLP of 1..%d layers", spec->text, ZPS_MODEL_MAX_LAYERS);
        return NULL;
    }
    if (max_batch == 0 || max_batch > INT32_MAX) {
        s_log("cuda: max batch %u, expected 1..%d", max_batch, INT32_MAX);
        return NULL;
    }
    char why[256];
    int count = s_device_count(why, sizeof why);
    if (gpu < 0 || gpu >= count) {
        s_log("cuda:%d: %s", gpu, count ? "no such device" : why);
        return NULL;
    }
    zps_cuda *m = (zps_cuda *)calloc(1, sizeof *m);
    if (!m) {
        s_log("cuda: out of memory for the model");
        return NULL;
    }
    m->spec = *spec;
    m->max_batch = max_batch;
    m->gpu = gpu;
    m->n_gemms = -1; // timing only inside train steps
    // bf16: the operands are rounded to bf16 by a kernel of ours, then
    // multiplied in bf16 with fp32 accumulation. Asked for with fp32
    // operands (CUBLAS_COMPUTE_32F_FAST_16BF), cuBLAS 13 on an H200 ran its
    // tf32 kernels instead: bitwise the tf32 results, at tf32 speed.
    m->compute = math == ZPS_GPU_MATH_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    m->bf16 = math == ZPS_GPU_MATH_BF16;
    cudaDeviceProp prop;
    if (!s_ok(cudaSetDevice(gpu), "cudaSetDevice") ||
        !s_ok(cudaGetDeviceProperties(&prop, gpu), "cudaGetDeviceProperties") ||
        !s_create_sync(m) || !s_create_memory(m)) {
        s_log("cuda:%d: cannot set up model '%s' at batch %u", gpu, spec->text, max_batch);
        s_destroy(&m);
        return NULL;
    }
    snprintf(m->name, sizeof m->name, "%s", prop.name);
    return m;
}

static float *s_params(zps_cuda *m)
{
    return m->h_params;
}

static const float *s_grads(const zps_cuda *m)
{
    return m->h_grads;
}

static void s_set_grad_hook(zps_cuda *m, zps_cuda_grad_ready_fn fn, void *arg)
{
    m->hook = fn;
    m->hook_arg = arg;
}

static float s_loss(const zps_cuda *m)
{
    return m->loss;
}

// ---------------------------------------------------------------- layers

// C (M, N) = op(A) op(B), column-major, fp32 in and out, with the compute
// type chosen at creation (fp32 accumulation in every mode); for bf16, A
// and B are first rounded into the bf16 scratch buffers (every operand
// here is dense: lda x its columns elements). In a train step
// (n_gemms >= 0) each GEMM is bracketed by timing events, which leave the
// rounding out; evaluation (n_gemms < 0) is not timed.
static bool s_gemm(zps_cuda *m, cublasOperation_t ta, cublasOperation_t tb, int M, int N, int K,
                   const float *A, int lda, const float *B, int ldb, float *C, int ldc)
{
    const float one = 1.0f, zero = 0.0f;
    const void *a = A, *b = B;
    cudaDataType_t type = CUDA_R_32F;
    if (m->bf16) {
        size_t na = (size_t)lda * (ta == CUBLAS_OP_N ? K : M);
        size_t nb = (size_t)ldb * (tb == CUBLAS_OP_N ? N : K);
        to_bf16_kernel<<<s_blocks(na), ZPS_CUDA_THREADS, 0, m->cs>>>(A, m->d_bf[0], na);
        to_bf16_kernel<<<s_blocks(nb), ZPS_CUDA_THREADS, 0, m->cs>>>(B, m->d_bf[1], nb);
        if (!s_launched("to_bf16_kernel")) {
            return false;
        }
        a = m->d_bf[0];
        b = m->d_bf[1];
        type = CUDA_R_16BF;
    }
    int k = m->n_gemms;
    bool timed = k >= 0 && k < 3 * m->spec.n_layers;
    if (timed && !s_ok(cudaEventRecord(m->gemm_t[k][0], m->cs), "cudaEventRecord")) {
        return false;
    }
    if (!s_blas_ok(cublasGemmEx(m->blas, ta, tb, M, N, K, &one, a, type, lda, b, type, ldb,
                                &zero, C, CUDA_R_32F, ldc, m->compute, CUBLAS_GEMM_DEFAULT),
                   "cublasGemmEx")) {
        return false;
    }
    if (timed) {
        m->n_gemms++;
        m->gemm_flop += 2.0 * M * N * K;
        return s_ok(cudaEventRecord(m->gemm_t[k][1], m->cs), "cudaEventRecord");
    }
    return true;
}

// Adds the GEMMs of the step that just finished to the sums; its events
// have completed (the last gradient has landed), so this does not wait.
// The first train step is left out: cuBLAS loads and picks its kernels
// then, which took 100-140 ms on an H200, more than 15 steps of GEMMs.
static bool s_account_gemms(zps_cuda *m, int n_gemms)
{
    if (!m->warm) {
        m->warm = true;
        return true;
    }
    for (int k = 0; k < n_gemms; k++) {
        float ms = 0.0f;
        if (!s_ok(cudaEventElapsedTime(&ms, m->gemm_t[k][0], m->gemm_t[k][1]), "GEMM timing")) {
            return false;
        }
        m->sum_gemm_ms += ms;
    }
    m->sum_gemm_flop += m->gemm_flop;
    m->steps++;
    return true;
}

// Uploads the host parameters layer by layer on the copy stream; layer l's
// forward waits on param_up[l] only. The copy stream first waits until the
// last step stopped reading the device parameters.
static bool s_upload_params(zps_cuda *m)
{
    if (!s_ok(cudaStreamWaitEvent(m->xs, m->step_done, 0), "cudaStreamWaitEvent")) {
        return false;
    }
    for (int l = 0; l < m->spec.n_layers; l++) {
        const zps_layer_spec *ls = &m->spec.layers[l];
        size_t len = ls->b_off + ls->out - ls->w_off;
        if (!s_ok(cudaMemcpyAsync(m->d_params + ls->w_off, m->h_params + ls->w_off,
                                  len * sizeof(float), cudaMemcpyHostToDevice, m->xs),
                  "parameters up") ||
            !s_ok(cudaEventRecord(m->param_up[l], m->xs), "cudaEventRecord")) {
            return false;
        }
    }
    return true;
}

// Stages n samples in pinned memory and sends them up on the compute stream
// (the caller has made sure the last use of the staging buffers is over).
static bool s_upload_batch(zps_cuda *m, const float *x, const uint32_t *labels, uint32_t n)
{
    size_t xb = (size_t)n * zps_model_inputs(&m->spec) * sizeof(float);
    memcpy(m->h_x, x, xb);
    memcpy(m->h_labels, labels, n * sizeof(uint32_t));
    return s_ok(cudaMemcpyAsync(m->d_x, m->h_x, xb, cudaMemcpyHostToDevice, m->cs), "batch up") &&
           s_ok(cudaMemcpyAsync(m->d_labels, m->h_labels, n * sizeof(uint32_t),
                                cudaMemcpyHostToDevice, m->cs),
                "labels up");
}

// Runs every layer over the n rows of d_x; layer l's output is left in
// d_act[l], the last one as logits.
static bool s_forward(zps_cuda *m, int n)
{
    const float *in = m->d_x;
    int last = m->spec.n_layers - 1;
    for (int l = 0; l <= last; l++) {
        const zps_layer_spec *ls = &m->spec.layers[l];
        int n_in = (int)ls->in;
        int n_out = (int)ls->out;
        float *z = m->d_act[l];
        size_t len = (size_t)n * ls->out;
        // z (n, out) = in (n, in) W^T; column-major: z^T (out, n) = W (out, in) in^T,
        // where W is column-major (in, out) with ld in, hence op T.
        if (!s_ok(cudaStreamWaitEvent(m->cs, m->param_up[l], 0), "cudaStreamWaitEvent") ||
            !s_gemm(m, CUBLAS_OP_T, CUBLAS_OP_N, n_out, n, n_in, m->d_params + ls->w_off, n_in,
                    in, n_in, z, n_out)) {
            return false;
        }
        bias_act_kernel<<<s_blocks(len), ZPS_CUDA_THREADS, 0, m->cs>>>(
            z, m->d_params + ls->b_off, len, ls->out, l < last);
        if (!s_launched("bias_act_kernel")) {
            return false;
        }
        in = z;
    }
    return true;
}

// The head over the logits of n rows: per-row losses and hits, their sums
// in d_loss and d_hits, and dz in d_delta[0] when want_dz.
static bool s_head(zps_cuda *m, uint32_t n, bool want_dz)
{
    int last = m->spec.n_layers - 1;
    uint32_t c = m->spec.layers[last].out;
    xent_kernel<<<n, ZPS_CUDA_HEAD_THREADS, 0, m->cs>>>(
        m->d_act[last], m->d_labels, c, 1.0f / (float)n, want_dz ? m->d_delta[0] : NULL,
        m->d_row_loss, m->d_row_hit);
    if (!s_launched("xent_kernel")) {
        return false;
    }
    sum_rows_kernel<<<1, ZPS_CUDA_THREADS, 0, m->cs>>>(m->d_row_loss, m->d_row_hit, n, m->d_loss,
                                                       m->d_hits);
    return s_launched("sum_rows_kernel");
}

// Layer l's dW (out, in) = dz^T (out, n) in (n, in) and db = column sums of
// dz, then the copy of both to the host once they are computed.
static bool s_layer_grads(zps_cuda *m, int l, const float *in, const float *dz, int n)
{
    const zps_layer_spec *ls = &m->spec.layers[l];
    int n_in = (int)ls->in;
    int n_out = (int)ls->out;
    // Column-major: dW^T (in, out) = in^T (in, n) dz (n, out); dz is
    // column-major (out, n), hence op T.
    if (!s_gemm(m, CUBLAS_OP_N, CUBLAS_OP_T, n_in, n_out, n, in, n_in, dz, n_out,
                m->d_grads + ls->w_off, n_in)) {
        return false;
    }
    bias_grad_kernel<<<s_blocks(ls->out), ZPS_CUDA_THREADS, 0, m->cs>>>(
        dz, m->d_grads + ls->b_off, (uint32_t)n, ls->out);
    if (!s_launched("bias_grad_kernel")) {
        return false;
    }
    size_t len = ls->b_off + ls->out - ls->w_off;
    return s_ok(cudaEventRecord(m->grad_done[l], m->cs), "cudaEventRecord") &&
           s_ok(cudaStreamWaitEvent(m->xs, m->grad_done[l], 0), "cudaStreamWaitEvent") &&
           s_ok(cudaMemcpyAsync(m->h_grads + ls->w_off, m->d_grads + ls->w_off,
                                len * sizeof(float), cudaMemcpyDeviceToHost, m->xs),
                "gradients down") &&
           s_ok(cudaEventRecord(m->landed[l], m->xs), "cudaEventRecord");
}

// dx (n, in) = dz (n, out) W (out, in), then masked by layer l-1's ReLU.
static bool s_layer_dx(zps_cuda *m, int l, const float *dz, float *dx, int n)
{
    const zps_layer_spec *ls = &m->spec.layers[l];
    int n_in = (int)ls->in;
    int n_out = (int)ls->out;
    // Column-major: dx^T (in, n) = W^T (in, out) dz^T (out, n), W being
    // column-major (in, out) already.
    if (!s_gemm(m, CUBLAS_OP_N, CUBLAS_OP_N, n_in, n, n_out, m->d_params + ls->w_off, n_in, dz,
                n_out, dx, n_in)) {
        return false;
    }
    size_t len = (size_t)n * ls->in;
    relu_mask_kernel<<<s_blocks(len), ZPS_CUDA_THREADS, 0, m->cs>>>(dx, m->d_act[l - 1], len);
    return s_launched("relu_mask_kernel");
}

// Launches backward from the head's dz in d_delta[0], last layer first;
// each layer's gradients start down as soon as they are computed.
static bool s_backward(zps_cuda *m, int n)
{
    float *dz = m->d_delta[0];
    float *dx = m->d_delta[1];
    for (int l = m->spec.n_layers - 1; l >= 0; l--) {
        if (!s_layer_grads(m, l, l == 0 ? m->d_x : m->d_act[l - 1], dz, n)) {
            return false;
        }
        // Layer 0's dX would be the gradient of the data: nobody needs it.
        if (l > 0) {
            if (!s_layer_dx(m, l, dz, dx, n)) {
                return false;
            }
            float *t = dz;
            dz = dx;
            dx = t;
        }
    }
    return true;
}

// ---------------------------------------------------------------- steps

static bool s_labels_ok(const zps_cuda *m, const uint32_t *labels, uint32_t n)
{
    uint32_t classes = zps_model_classes(&m->spec);
    for (uint32_t i = 0; i < n; i++) {
        if (labels[i] >= classes) {
            s_log("cuda: sample %u has label %u, expected 0..%u", i, labels[i], classes - 1);
            return false;
        }
    }
    return true;
}

// Launches a whole step without waiting for any of it.
static bool s_launch_step(zps_cuda *m, const float *x, const uint32_t *labels, uint32_t n)
{
    m->n_gemms = 0;
    m->gemm_flop = 0.0;
    if (!s_upload_params(m) || !s_upload_batch(m, x, labels, n) || !s_forward(m, (int)n) ||
        !s_head(m, n, true)) {
        return false;
    }
    // The loss goes down on the copy stream ahead of the gradients, so it
    // has landed when the first gradient has.
    if (!s_ok(cudaEventRecord(m->head_done, m->cs), "cudaEventRecord") ||
        !s_ok(cudaStreamWaitEvent(m->xs, m->head_done, 0), "cudaStreamWaitEvent") ||
        !s_ok(cudaMemcpyAsync(m->h_loss, m->d_loss, sizeof(double), cudaMemcpyDeviceToHost,
                              m->xs),
              "loss down")) {
        return false;
    }
    return s_backward(m, (int)n) && s_ok(cudaEventRecord(m->step_done, m->cs), "cudaEventRecord");
}

static zps_err s_train_step(zps_cuda *m, const float *x, const uint32_t *labels, uint32_t n,
                            float *loss)
{
    if (n == 0 || n > m->max_batch) {
        s_log("cuda: train step of %u samples, expected 1..%u", n, m->max_batch);
        return ZPS_EINVAL;
    }
    if (!s_labels_ok(m, labels, n)) {
        return ZPS_EINVAL;
    }
    if (!s_ok(cudaSetDevice(m->gpu), "cudaSetDevice") || !s_launch_step(m, x, labels, n)) {
        // What was launched may still run: let it finish before anyone
        // touches the buffers again.
        (void)cudaStreamSynchronize(m->cs);
        (void)cudaStreamSynchronize(m->xs);
        return ZPS_EIO;
    }
    // Bucket order: the last layer's gradient lands first.
    for (int l = m->spec.n_layers - 1; l >= 0; l--) {
        if (!s_ok(cudaEventSynchronize(m->landed[l]), "gradients down")) {
            (void)cudaStreamSynchronize(m->cs);
            (void)cudaStreamSynchronize(m->xs);
            return ZPS_EIO;
        }
        if (l == m->spec.n_layers - 1) {
            m->loss = (float)(*m->h_loss / n); // before the first hook: it pushes the loss
        }
        if (m->hook) {
            m->hook(m->hook_arg, l);
        }
    }
    int timed = m->n_gemms;
    m->n_gemms = -1;
    if (!s_account_gemms(m, timed)) {
        return ZPS_EIO;
    }
    if (loss) {
        *loss = m->loss;
    }
    return ZPS_OK;
}

static zps_err s_evaluate(zps_cuda *m, const float *x, const uint32_t *labels, uint32_t n,
                          uint32_t *correct, double *loss_sum)
{
    // All labels first, so a bad one leaves the caller's totals untouched.
    if (!s_labels_ok(m, labels, n)) {
        return ZPS_EINVAL;
    }
    if (n == 0) {
        return ZPS_OK;
    }
    m->n_gemms = -1; // not timed
    if (!s_ok(cudaSetDevice(m->gpu), "cudaSetDevice") || !s_upload_params(m)) {
        return ZPS_EIO;
    }
    size_t inputs = zps_model_inputs(&m->spec);
    uint32_t hits = 0;
    double sum = 0.0;
    for (uint32_t done = 0; done < n;) {
        uint32_t k = n - done < m->max_batch ? n - done : m->max_batch;
        // Outside the step loop: waiting on the stream here is fine, and
        // the staging buffers are free again for the next chunk after it.
        if (!s_upload_batch(m, x + done * inputs, labels + done, k) || !s_forward(m, (int)k) ||
            !s_head(m, k, false) ||
            !s_ok(cudaMemcpyAsync(m->h_loss, m->d_loss, sizeof(double), cudaMemcpyDeviceToHost,
                                  m->cs),
                  "loss down") ||
            !s_ok(cudaMemcpyAsync(m->h_hits, m->d_hits, sizeof(uint32_t),
                                  cudaMemcpyDeviceToHost, m->cs),
                  "hits down") ||
            !s_ok(cudaStreamSynchronize(m->cs), "evaluate")) {
            (void)cudaStreamSynchronize(m->cs);
            (void)cudaStreamSynchronize(m->xs);
            return ZPS_EIO;
        }
        hits += *m->h_hits;
        sum += *m->h_loss;
        done += k;
    }
    if (!s_ok(cudaEventRecord(m->step_done, m->cs), "cudaEventRecord")) {
        return ZPS_EIO;
    }
    *correct += hits;
    *loss_sum += sum;
    return ZPS_OK;
}

// ---------------------------------------------------------------- the table

static const zps_cuda_api s_api = {
    ZPS_CUDA_API_VERSION, s_set_log,  s_device_count, s_create,   s_destroy, s_params,
    s_grads,              s_set_grad_hook, s_train_step, s_loss, s_evaluate,
};

extern "C" __attribute__((visibility("default"))) const zps_cuda_api *zps_cuda_plugin_api(void)
{
    return &s_api;
}
