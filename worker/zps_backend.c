/* zps_backend.c - dispatch to the CPU MLP, the CUDA MLP, or the flat
 * benchmark model.
 *
 * The CUDA backend is a plugin (libzps_cuda.so) loaded with dlopen the
 * first time a caller asks for a cuda device: a CPU worker never maps
 * libcudart or libcublas (whose load-time initialisers alone cost seconds
 * under valgrind), and a machine without a driver runs CPU jobs with the
 * very same binary. ZPS_HAVE_CUDA, set by the Makefile when it builds the
 * plugin, says whether there is one to look for. */
#include "zps_backend.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef ZPS_HAVE_CUDA
#include <dlfcn.h>
#include <limits.h>
#include <unistd.h>
#endif

#include "common/zps_log.h"
#include "worker/zps_cpu.h"

struct zps_backend {
    zps_model_spec spec;        // copy
    zps_cpu *cpu;               // owned: the CPU MLP, or NULL
    zps_cuda *cuda;             // owned: the CUDA MLP, or NULL
    const zps_cuda_api *api;    // borrowed: the plugin's table when cuda is set
    float *flat_params;         // owned: flat model only
    float *flat_grads;          // owned: flat model only, filled once
    zps_backend_bucket_fn hook; // bucket hook, or NULL
    void *hook_arg;
};

// The MLPs report layers; buckets count layers from the last.
static void s_layer_done(void *arg, int layer)
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

bool zps_backend_parse_device(const char *device, int *gpu)
{
    if (strcmp(device, "cpu") == 0) {
        *gpu = -1;
        return true;
    }
    if (strcmp(device, "cuda") == 0) {
        *gpu = 0;
        return true;
    }
    if (strncmp(device, "cuda:", 5) != 0) {
        return false;
    }
    // Digits only: strtol would take "+1", " 1" and "0x1".
    const char *d = device + 5;
    long n = 0;
    size_t i = 0;
    for (; i < 5 && d[i]; i++) {
        if (!isdigit((unsigned char)d[i])) {
            return false;
        }
        n = n * 10 + (d[i] - '0');
    }
    if (i == 0 || d[i] || n > ZPS_BACKEND_MAX_GPU) {
        return false;
    }
    *gpu = (int)n;
    return true;
}

bool zps_backend_parse_gpu_math(const char *text, zps_gpu_math *out)
{
    static const struct {
        const char *name;
        zps_gpu_math math;
    } names[] = {{"fp32", ZPS_GPU_MATH_FP32}, {"tf32", ZPS_GPU_MATH_TF32},
                 {"bf16", ZPS_GPU_MATH_BF16}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(text, names[i].name) == 0) {
            *out = names[i].math;
            return true;
        }
    }
    return false;
}

#ifdef ZPS_HAVE_CUDA
// The loaded plugin and its table; loaded once, never unloaded (CUDA
// libraries do not survive being unloaded and loaded again well).
static void *s_cuda_handle;
static const zps_cuda_api *s_cuda_api;

static void s_cuda_log(bool error, const char *line)
{
    zps_log(error ? ZPS_LOG_ERROR : ZPS_LOG_INFO, "%s", line);
}

// Opens the plugin at path; its table, or NULL with dlerror's text in why.
static const zps_cuda_api *s_open_plugin(const char *path, char *why, size_t len)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(why, len, "%.300s", e ? e : path);
        return NULL;
    }
    zps_cuda_plugin_fn fn;
    // POSIX's way to get a function pointer out of dlsym.
    *(void **)&fn = dlsym(h, ZPS_CUDA_PLUGIN_SYMBOL);
    const zps_cuda_api *api = fn ? fn() : NULL;
    if (!api || api->version != ZPS_CUDA_API_VERSION) {
        snprintf(why, len, "%.300s: not a zps CUDA plugin of API version %d", path,
                 ZPS_CUDA_API_VERSION);
        dlclose(h);
        return NULL;
    }
    s_cuda_handle = h;
    return api;
}

// The plugin's table, loading it on first use from, in turn:
// $ZPS_CUDA_PLUGIN, the directory of the running binary (a deployed bin/),
// and the build directory it was built in (tests). NULL with the reason.
static const zps_cuda_api *s_cuda_plugin(char *why, size_t len)
{
    if (s_cuda_api) {
        return s_cuda_api;
    }
    char paths[3][PATH_MAX];
    int n = 0;
    const char *env = getenv("ZPS_CUDA_PLUGIN");
    if (env && *env) {
        snprintf(paths[n++], PATH_MAX, "%s", env);
    }
    char exe[PATH_MAX];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k > 0) {
        exe[k] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            snprintf(paths[n++], PATH_MAX, "%.*s/%s", PATH_MAX / 2, exe, ZPS_CUDA_PLUGIN_NAME);
        }
    }
    snprintf(paths[n++], PATH_MAX, "%s", ZPS_CUDA_PLUGIN_PATH);
    for (int i = 0; i < n && !s_cuda_api; i++) {
        s_cuda_api = s_open_plugin(paths[i], why, len);
    }
    if (s_cuda_api) {
        s_cuda_api->set_log(s_cuda_log);
    }
    return s_cuda_api;
}
#endif

int zps_backend_cuda_devices(char *why, size_t len)
{
#ifdef ZPS_HAVE_CUDA
    char e[512];
    const zps_cuda_api *api = s_cuda_plugin(e, sizeof e);
    if (!api) {
        snprintf(why, len, "cannot load the CUDA backend: %.400s", e);
        return 0;
    }
    return api->device_count(why, len);
#else
    snprintf(why, len,
             "this build has no CUDA backend (built with CUDA=0, or nvcc was not found); "
             "make CUDA=1 [CUDA_HOME=...] builds it");
    return 0;
#endif
}

bool zps_backend_supports(const char *device)
{
    int gpu;
    if (!zps_backend_parse_device(device, &gpu)) {
        zps_log_error("--device %s: expected cpu, cuda or cuda:N", device);
        return false;
    }
    if (gpu < 0) {
        return true; // the CPU path never touches CUDA
    }
    char why[512];
    int count = zps_backend_cuda_devices(why, sizeof why);
    if (count == 0) {
        zps_log_error("--device %s: %s", device, why);
        return false;
    }
    if (gpu >= count) {
        zps_log_error("--device %s: this machine has %d CUDA device%s (cuda:0..cuda:%d)", device,
                      count, count == 1 ? "" : "s", count - 1);
        return false;
    }
    return true;
}

// Sets up b's MLP on the device named by gpu (-1: the CPU).
static bool s_new_mlp(zps_backend *b, int gpu, zps_gpu_math math, uint32_t max_batch)
{
    if (gpu < 0) {
        b->cpu = zps_cpu_new(&b->spec, max_batch);
        if (b->cpu) {
            zps_cpu_set_grad_hook(b->cpu, s_layer_done, b);
        }
        return b->cpu != NULL;
    }
#ifdef ZPS_HAVE_CUDA
    char why[512];
    b->api = s_cuda_plugin(why, sizeof why); // loaded by zps_backend_supports
    b->cuda = b->api ? b->api->create(&b->spec, max_batch, gpu, math) : NULL;
    if (b->cuda) {
        b->api->set_grad_hook(b->cuda, s_layer_done, b);
    }
    return b->cuda != NULL;
#else
    (void)math;
    (void)max_batch;
    return false; // zps_backend_supports said why
#endif
}

zps_backend *zps_backend_new(const char *device, zps_gpu_math math, const zps_model_spec *spec,
                             uint32_t max_batch, uint64_t seed)
{
    int gpu;
    if (!zps_backend_supports(device) || !zps_backend_parse_device(device, &gpu)) {
        return NULL;
    }
    zps_backend *b = calloc(1, sizeof *b);
    if (!b) {
        zps_log_error("backend: out of memory");
        return NULL;
    }
    b->spec = *spec;
    if (spec->kind == ZPS_MODEL_MLP) {
        if (!s_new_mlp(b, gpu, math, max_batch)) {
            zps_backend_destroy(&b);
            return NULL;
        }
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
    if (b->cuda) {
        b->api->destroy(&b->cuda);
    }
    free(b->flat_params);
    free(b->flat_grads);
    free(b);
    *bp = NULL;
}

bool zps_backend_uses_data(const zps_backend *b)
{
    return b->cpu != NULL || b->cuda != NULL;
}

float *zps_backend_params(zps_backend *b)
{
    if (b->cuda) {
        return b->api->params(b->cuda);
    }
    return b->cpu ? zps_cpu_params(b->cpu) : b->flat_params;
}

const float *zps_backend_grads(const zps_backend *b)
{
    if (b->cuda) {
        return b->api->grads(b->cuda);
    }
    return b->cpu ? zps_cpu_grads(b->cpu) : b->flat_grads;
}

void zps_backend_set_bucket_hook(zps_backend *b, zps_backend_bucket_fn fn, void *arg)
{
    b->hook = fn;
    b->hook_arg = arg;
}

float zps_backend_loss(const zps_backend *b)
{
    if (b->cuda) {
        return b->api->loss(b->cuda);
    }
    return b->cpu ? zps_cpu_loss(b->cpu) : 0.0f;
}

zps_err zps_backend_train_step(zps_backend *b, const float *x, const uint32_t *labels, uint32_t n,
                               float *loss)
{
    if (b->cuda) {
        return b->api->train_step(b->cuda, x, labels, n, loss);
    }
    if (b->cpu) {
        return zps_cpu_train_step(b->cpu, x, labels, n, loss);
    }
    // A flat model's buckets are all final at once.
    *loss = 0.0f;
    int nb = zps_model_n_buckets(&b->spec), order[ZPS_MODEL_MAX_BUCKETS];
    zps_model_spread_order(nb, order);
    for (int i = 0; b->hook && i < nb; i++) {
        b->hook(b->hook_arg, order[i]);
    }
    return ZPS_OK;
}

zps_err zps_backend_evaluate(zps_backend *b, const float *x, const uint32_t *labels, uint32_t n,
                             uint32_t *correct, double *loss_sum)
{
    if (b->cuda) {
        return b->api->evaluate(b->cuda, x, labels, n, correct, loss_sum);
    }
    if (!b->cpu) {
        return ZPS_OK; // nothing to evaluate
    }
    return zps_cpu_evaluate(b->cpu, x, labels, n, correct, loss_sum);
}
