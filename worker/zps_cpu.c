/* zps_cpu.c - the CPU backend: forward and backward of the MLP of
 * zps_model.h on OpenBLAS, one thread per worker.
 *
 * Everything a step touches (parameters, gradients, activations, two delta
 * buffers) is carved from one allocation made by zps_cpu_new, so a step
 * allocates nothing and the worker can hand the flat parameter and gradient
 * views to the wire as they are. Shapes are row-major; n is the number of
 * samples of the step, W of a layer is (out, in) like nn.Linear. */
#include "worker/zps_cpu.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_log.h"

// Views start on 64-byte boundaries and span whole blocks of
// ZPS_CPU_BLOCK floats: flat loops can then run over whole blocks, and a
// loop of known length is one GCC vectorizes at -O2 (its cheap cost model
// refuses a loop that would need a scalar tail).
#define ZPS_CPU_ALIGN_BYTES 64
#define ZPS_CPU_BLOCK (ZPS_CPU_ALIGN_BYTES / sizeof(float))

struct zps_cpu {
    zps_model_spec spec;                 // layout of params and grads
    uint32_t max_batch;                  // largest n a call runs at once
    float *mem;                          // owned: the one allocation; all below are views
    float *params;                       // view: spec.n_params floats
    float *grads;                        // view: spec.n_params floats
    float *act[ZPS_MODEL_MAX_LAYERS];    // views: layer l's output (n, out); logits for the last
    float *delta[2];                     // views: (n, widest layer) dZ / dX, used in turn
    float *ones;                         // view: max_batch 1s, to sum dZ's rows with a GEMV
    zps_cpu_grad_ready_fn hook;          // borrowed: called as each layer's grads are final
    void *hook_arg;                      // borrowed: hook's argument
    float loss;                          // mean loss of the running or last train step
};

// ---------------------------------------------------------------- memory

static size_t s_round_up(size_t floats)
{
    return (floats + ZPS_CPU_BLOCK - 1) / ZPS_CPU_BLOCK * ZPS_CPU_BLOCK;
}

// Hands out the next view of len floats from *off; with base NULL it only
// counts, so one walk both sizes the allocation and carves it.
static float *s_view(float *base, size_t *off, size_t len)
{
    float *view = base ? base + *off : NULL;
    *off += s_round_up(len);
    return view;
}

// Lays out every buffer of m from base (or just counts); returns the total
// floats. No overflow: widths are at most 2^20 and max_batch at most
// INT_MAX, so each of the at most 21 views is below 2^51 floats.
static size_t s_layout(zps_cpu *m, float *base)
{
    size_t off = 0;
    size_t widest = 0;
    m->params = s_view(base, &off, m->spec.n_params);
    m->grads = s_view(base, &off, m->spec.n_params);
    for (int l = 0; l < m->spec.n_layers; l++) {
        size_t out = m->spec.layers[l].out;
        m->act[l] = s_view(base, &off, (size_t)m->max_batch * out);
        widest = out > widest ? out : widest;
    }
    // dX of layer l is as wide as layer l-1's output, so the widest output
    // bounds both dZ and dX (layer 0's input never gets a dX).
    m->delta[0] = s_view(base, &off, (size_t)m->max_batch * widest);
    m->delta[1] = s_view(base, &off, (size_t)m->max_batch * widest);
    m->ones = s_view(base, &off, m->max_batch);
    return off;
}

zps_cpu *zps_cpu_new(const zps_model_spec *spec, uint32_t max_batch)
{
    if (spec->n_layers < 1 || spec->n_layers > ZPS_MODEL_MAX_LAYERS) {
        zps_log_error("cpu: model '%s' has %d layers, expected 1..%d", spec->text,
                      spec->n_layers, ZPS_MODEL_MAX_LAYERS);
        return NULL;
    }
    // CBLAS takes dimensions as int.
    if (max_batch == 0 || max_batch > INT_MAX) {
        zps_log_error("cpu: max batch %u, expected 1..%d", max_batch, INT_MAX);
        return NULL;
    }
    zps_cpu *m = calloc(1, sizeof *m);
    if (!m) {
        zps_log_error("cpu: out of memory for the model");
        return NULL;
    }
    m->spec = *spec;
    m->max_batch = max_batch;
    size_t bytes = s_layout(m, NULL) * sizeof(float);
    m->mem = aligned_alloc(ZPS_CPU_ALIGN_BYTES, bytes);
    if (!m->mem) {
        zps_log_error("cpu: out of memory for %zu bytes of model '%s' at batch %u", bytes,
                      spec->text, max_batch);
        free(m);
        return NULL;
    }
    // Zeroed so params and grads read as 0, never as garbage, before the
    // first pull or step.
    memset(m->mem, 0, bytes);
    s_layout(m, m->mem);
    for (uint32_t i = 0; i < max_batch; i++) {
        m->ones[i] = 1.0f;
    }
    return m;
}

void zps_cpu_destroy(zps_cpu **m)
{
    if (!m || !*m) {
        return;
    }
    free((*m)->mem);
    free(*m);
    *m = NULL;
}

float *zps_cpu_params(zps_cpu *m)
{
    return m->params;
}

const float *zps_cpu_grads(const zps_cpu *m)
{
    return m->grads;
}

void zps_cpu_set_grad_hook(zps_cpu *m, zps_cpu_grad_ready_fn fn, void *arg)
{
    m->hook = fn;
    m->hook_arg = arg;
}

// ---------------------------------------------------------------- loops and the head

// Copies b (width) into each of the n rows of z, for the GEMM to add onto.
static void s_broadcast_rows(float *restrict z, const float *restrict b, size_t n, size_t width)
{
    for (size_t i = 0; i < n; i++) {
        memcpy(z + i * width, b, width * sizeof *b);
    }
}

// ReLU in place over the first len floats of the view z. It runs in whole
// blocks: the view is whole blocks long, and nobody reads what lies past len.
// A NaN stays NaN, so a diverged model shows in the loss.
static void s_relu(float *restrict z, size_t len)
{
    for (size_t i = 0; i < len; i += ZPS_CPU_BLOCK) {
        for (size_t k = 0; k < ZPS_CPU_BLOCK; k++) {
            float v = z[i + k];
            z[i + k] = v < 0.0f ? 0.0f : v;
        }
    }
}

// Zeroes d where the ReLU output a was 0 (no gradient flows through an
// inactive unit), over the first len floats of the views d and a, in whole
// blocks as s_relu does.
static void s_relu_mask(float *restrict d, const float *restrict a, size_t len)
{
    for (size_t i = 0; i < len; i += ZPS_CPU_BLOCK) {
        for (size_t k = 0; k < ZPS_CPU_BLOCK; k++) {
            float v = d[i + k];
            d[i + k] = a[i + k] > 0.0f ? v : 0.0f;
        }
    }
}

// Index of the largest value; the lowest index wins a tie, so predictions do
// not depend on anything but the logits.
static size_t s_argmax(const float *z, size_t c)
{
    size_t best = 0;
    for (size_t j = 1; j < c; j++) {
        if (z[j] > z[best]) {
            best = j;
        }
    }
    return best;
}

// Writes e[j] = exp(z[j] - max) and returns their sum: subtracting the max
// keeps exp from overflowing, and the sum is at least 1.
static float s_exp_shifted(const float *restrict z, float *restrict e, size_t c, float max)
{
    float sum = 0.0f;
    for (size_t j = 0; j < c; j++) {
        e[j] = expf(z[j] - max);
        sum += e[j];
    }
    return sum;
}

// -log softmax(z)[label] as logsumexp(z) - z[label], in double so a
// near-zero loss keeps its digits.
static double s_xent(const float *z, float max, float sum, uint32_t label)
{
    return (double)max + log((double)sum) - (double)z[label];
}

// The softmax cross-entropy head: turns the logits z (n, c) into
// dz = (softmax - onehot) / n, the gradient of the mean loss, and returns the
// summed per-sample loss.
static double s_softmax_xent(const float *restrict z, const uint32_t *labels, float *restrict dz,
                             size_t n, size_t c)
{
    double loss = 0.0;
    float inv_n = 1.0f / (float)n;
    for (size_t i = 0; i < n; i++) {
        const float *zi = z + i * c;
        float *di = dz + i * c;
        float max = zi[s_argmax(zi, c)];
        float sum = s_exp_shifted(zi, di, c, max);
        float scale = inv_n / sum;
        for (size_t j = 0; j < c; j++) {
            di[j] *= scale;
        }
        di[labels[i]] -= inv_n;
        loss += s_xent(zi, max, sum, labels[i]);
    }
    return loss;
}

// Adds the correct argmax predictions and the summed loss of the logits z
// (n, c); scratch holds c floats.
static void s_score(const float *z, const uint32_t *labels, size_t n, size_t c, float *scratch,
                    uint32_t *correct, double *loss_sum)
{
    for (size_t i = 0; i < n; i++) {
        const float *zi = z + i * c;
        size_t best = s_argmax(zi, c);
        float sum = s_exp_shifted(zi, scratch, c, zi[best]);
        *correct += best == labels[i];
        *loss_sum += s_xent(zi, zi[best], sum, labels[i]);
    }
}

// ---------------------------------------------------------------- layers

// Runs every layer over the n rows of x (n, inputs); layer l's output is
// left in act[l], the last one as logits.
static void s_forward(zps_cpu *m, const float *x, int n)
{
    const float *in = x;
    int last = m->spec.n_layers - 1;
    for (int l = 0; l <= last; l++) {
        const zps_layer_spec *ls = &m->spec.layers[l];
        int n_in = (int)ls->in;
        int n_out = (int)ls->out;
        float *z = m->act[l];
        // z (n, out) = b + in (n, in) W^T
        s_broadcast_rows(z, m->params + ls->b_off, (size_t)n, ls->out);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n_out, n_in, 1.0f, in, n_in,
                    m->params + ls->w_off, n_in, 1.0f, z, n_out);
        if (l < last) {
            s_relu(z, (size_t)n * ls->out);
        }
        in = z;
    }
}

// Writes layer l's dW and db from its dz (n, out) and its input (n, in).
static void s_layer_grads(zps_cpu *m, int l, const float *in, const float *dz, int n)
{
    const zps_layer_spec *ls = &m->spec.layers[l];
    int n_in = (int)ls->in;
    int n_out = (int)ls->out;
    // dW (out, in) = dz^T (out, n) in (n, in)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n_out, n_in, n, 1.0f, dz, n_out, in,
                n_in, 0.0f, m->grads + ls->w_off, n_in);
    // db (out) = dz^T (out, n) 1 (n): the column sums of dz
    cblas_sgemv(CblasRowMajor, CblasTrans, n, n_out, 1.0f, dz, n_out, m->ones, 1, 0.0f,
                m->grads + ls->b_off, 1);
}

// Back-propagates dz (n, out) of layer l > 0 to the dz of layer l-1 in dx
// (n, in): through W, then through layer l-1's ReLU.
static void s_layer_dx(zps_cpu *m, int l, const float *dz, float *dx, int n)
{
    const zps_layer_spec *ls = &m->spec.layers[l];
    int n_in = (int)ls->in;
    int n_out = (int)ls->out;
    // dx (n, in) = dz (n, out) W (out, in)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n_in, n_out, 1.0f, dz, n_out,
                m->params + ls->w_off, n_in, 0.0f, dx, n_in);
    s_relu_mask(dx, m->act[l - 1], (size_t)n * ls->in);
}

// Runs backward from the head's dz in delta[0], last layer first, calling
// the hook as each layer's grads are final so the worker can push them while
// earlier layers still run.
static void s_backward(zps_cpu *m, const float *x, int n)
{
    float *dz = m->delta[0];
    float *dx = m->delta[1];
    for (int l = m->spec.n_layers - 1; l >= 0; l--) {
        s_layer_grads(m, l, l == 0 ? x : m->act[l - 1], dz, n);
        if (m->hook) {
            m->hook(m->hook_arg, l);
        }
        // Layer 0's dX would be the gradient of the data: nobody needs it,
        // and it is the largest product.
        if (l > 0) {
            s_layer_dx(m, l, dz, dx, n);
            float *t = dz;
            dz = dx;
            dx = t;
        }
    }
}

// ---------------------------------------------------------------- steps

// True if every label names a class; logs the first that does not.
static bool s_labels_ok(const zps_cpu *m, const uint32_t *labels, uint32_t n)
{
    uint32_t classes = zps_model_classes(&m->spec);
    for (uint32_t i = 0; i < n; i++) {
        if (labels[i] >= classes) {
            zps_log_error("cpu: sample %u has label %u, expected 0..%u", i, labels[i],
                          classes - 1);
            return false;
        }
    }
    return true;
}

zps_err zps_cpu_train_step(zps_cpu *m, const float *x, const uint32_t *labels, uint32_t n,
                           float *loss)
{
    if (n == 0 || n > m->max_batch) {
        zps_log_error("cpu: train step of %u samples, expected 1..%u", n, m->max_batch);
        return ZPS_EINVAL;
    }
    if (!s_labels_ok(m, labels, n)) {
        return ZPS_EINVAL;
    }
    int last = m->spec.n_layers - 1;
    s_forward(m, x, (int)n);
    double sum = s_softmax_xent(m->act[last], labels, m->delta[0], n, m->spec.layers[last].out);
    m->loss = (float)(sum / n); // before backward: the grad hooks push it
    s_backward(m, x, (int)n);
    if (loss) {
        *loss = m->loss;
    }
    return ZPS_OK;
}

float zps_cpu_loss(const zps_cpu *m)
{
    return m->loss;
}

zps_err zps_cpu_evaluate(zps_cpu *m, const float *x, const uint32_t *labels, uint32_t n,
                         uint32_t *correct, double *loss_sum)
{
    // All labels first, so a bad one leaves the caller's totals untouched.
    if (!s_labels_ok(m, labels, n)) {
        return ZPS_EINVAL;
    }
    int last = m->spec.n_layers - 1;
    size_t inputs = zps_model_inputs(&m->spec);
    size_t classes = zps_model_classes(&m->spec);
    for (uint32_t done = 0; done < n;) {
        uint32_t k = n - done < m->max_batch ? n - done : m->max_batch;
        s_forward(m, x + (size_t)done * inputs, (int)k);
        // delta[0] is free outside train_step: the softmax scratch row.
        s_score(m->act[last], labels + done, k, classes, m->delta[0], correct, loss_sum);
        done += k;
    }
    return ZPS_OK;
}
