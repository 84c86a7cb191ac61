/* zps_backend.c - dispatch to the CPU MLP, or the flat benchmark model. */
#include "zps_backend.h"

#include <stdlib.h>
#include <string.h>

#include "common/zps_log.h"
#include "worker/zps_cpu.h"

struct zps_backend {
    zps_model_spec spec;        // copy
    zps_cpu *cpu;               // owned: the MLP, or NULL for a flat model
    float *flat_params;         // owned: flat model only
    float *flat_grads;          // owned: flat model only, filled once
    zps_backend_bucket_fn hook; // bucket hook, or NULL
    void *hook_arg;
};

// zps_cpu reports layers; buckets count layers from the last.
static void s_cpu_layer_done(void *arg, int layer)
{
    zps_backend *b = arg;
    if (b->hook) {
        b->hook(b->hook_arg, b->spec.n_layers - 1 - layer);
    }
}

// A flat model's gradient depends only on the seed: it is written once,
// so a step costs nothing and a benchmark measures synchronisation alone.
static void s_fill_flat(float *g, size_t n, uint64_t seed)
{
    uint32_t x = (uint32_t)(seed * 2654435761u) | 1u;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        g[i] = (float)((int32_t)(x & 0xffff) - 0x8000) * 1e-8f;
    }
}

bool zps_backend_supports(const char *device)
{
    if (strcmp(device, "cpu") != 0) {
        zps_log_error("--device %s: this build has the cpu backend only", device);
        return false;
    }
    return true;
}

zps_backend *zps_backend_new(const char *device, const zps_model_spec *spec, uint32_t max_batch,
                             uint64_t seed)
{
    if (!zps_backend_supports(device)) {
        return NULL;
    }
    zps_backend *b = calloc(1, sizeof *b);
    if (!b) {
        zps_log_error("backend: out of memory");
        return NULL;
    }
    b->spec = *spec;
    if (spec->kind == ZPS_MODEL_MLP) {
        b->cpu = zps_cpu_new(spec, max_batch);
        if (!b->cpu) {
            zps_backend_destroy(&b);
            return NULL;
        }
        zps_cpu_set_grad_hook(b->cpu, s_cpu_layer_done, b);
        return b;
    }
    b->flat_params = calloc(spec->n_params, sizeof(float));
    b->flat_grads = malloc(spec->n_params * sizeof(float));
    if (!b->flat_params || !b->flat_grads) {
        zps_log_error("backend: cannot allocate %zu parameters", spec->n_params);
        zps_backend_destroy(&b);
        return NULL;
    }
    s_fill_flat(b->flat_grads, spec->n_params, seed);
    return b;
}

void zps_backend_destroy(zps_backend **bp)
{
    zps_backend *b = *bp;
    if (!b) {
        return;
    }
    zps_cpu_destroy(&b->cpu);
    free(b->flat_params);
    free(b->flat_grads);
    free(b);
    *bp = NULL;
}

bool zps_backend_uses_data(const zps_backend *b)
{
    return b->cpu != NULL;
}

float *zps_backend_params(zps_backend *b)
{
    return b->cpu ? zps_cpu_params(b->cpu) : b->flat_params;
}

const float *zps_backend_grads(const zps_backend *b)
{
    return b->cpu ? zps_cpu_grads(b->cpu) : b->flat_grads;
}

void zps_backend_set_bucket_hook(zps_backend *b, zps_backend_bucket_fn fn, void *arg)
{
    b->hook = fn;
    b->hook_arg = arg;
}

float zps_backend_loss(const zps_backend *b)
{
    return b->cpu ? zps_cpu_loss(b->cpu) : 0.0f;
}

zps_err zps_backend_train_step(zps_backend *b, const float *x, const uint32_t *labels, uint32_t n,
                               float *loss)
{
    if (b->cpu) {
        return zps_cpu_train_step(b->cpu, x, labels, n, loss);
    }
    *loss = 0.0f;
    for (int i = 0; b->hook && i < zps_model_n_buckets(&b->spec); i++) {
        b->hook(b->hook_arg, i);
    }
    return ZPS_OK;
}

zps_err zps_backend_evaluate(zps_backend *b, const float *x, const uint32_t *labels, uint32_t n,
                             uint32_t *correct, double *loss_sum)
{
    if (!b->cpu) {
        return ZPS_OK; // nothing to evaluate
    }
    return zps_cpu_evaluate(b->cpu, x, labels, n, correct, loss_sum);
}
