/* zps_model.h - the model spec shared by server and workers.
 *
 * The server knows parameters only as one flat float vector; the spec says
 * how that vector is laid out (layer by layer, weights then bias, weights
 * row-major as (out, in) like PyTorch's nn.Linear) and what its initial
 * values are, so every process derives the same vector from the same seed. */
#ifndef ZPS_MODEL_H
#define ZPS_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "zps_err.h"

#define ZPS_MODEL_MAX_LAYERS 16
#define ZPS_MODEL_MAX_WIDTH (1u << 20)

typedef struct zps_layer_spec {
    uint32_t in;   // input features
    uint32_t out;  // output features
    size_t w_off;  // offset of W (out, in) in the flat vector
    size_t b_off;  // offset of b (out) in the flat vector
} zps_layer_spec;

typedef struct zps_model_spec {
    char text[128];                                // the spec as given, e.g. "mlp:784-512-512-10"
    int n_layers;                                  // linear layers; ReLU between them
    zps_layer_spec layers[ZPS_MODEL_MAX_LAYERS];   // in forward order
    size_t n_params;                               // length of the flat vector
} zps_model_spec;

// Parses "mlp:D0-D1-...-Dk" (k >= 1 layers). Logs the reason on failure.
zps_err zps_model_parse(const char *text, zps_model_spec *out);

static inline uint32_t zps_model_inputs(const zps_model_spec *m)
{
    return m->layers[0].in;
}

static inline uint32_t zps_model_classes(const zps_model_spec *m)
{
    return m->layers[m->n_layers - 1].out;
}

// Writes the initial flat vector (n_params floats): He-normal weights,
// N(0, 2/in), and zero biases, drawn in flat order from the seed.
void zps_model_init_params(const zps_model_spec *m, uint64_t seed, float *params);

#endif
