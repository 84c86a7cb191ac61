/* zps_model.c - model spec parsing and deterministic initialisation. */
#include "zps_model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zps_log.h"
#include "zps_rng.h"

#define ZPS_RNG_STREAM_INIT 1

zps_err zps_model_parse(const char *text, zps_model_spec *out)
{
    memset(out, 0, sizeof *out);
    if (strncmp(text, "mlp:", 4) != 0 || strlen(text) >= sizeof out->text) {
        zps_log_error("model '%s': expected mlp:D0-D1-...-Dk", text);
        return ZPS_EINVAL;
    }
    snprintf(out->text, sizeof out->text, "%s", text);
    uint32_t dims[ZPS_MODEL_MAX_LAYERS + 1];
    int n_dims = 0;
    const char *p = text + 4;
    for (;;) {
        char *end;
        errno = 0;
        unsigned long d = strtoul(p, &end, 10);
        if (end == p || errno || d == 0 || d > ZPS_MODEL_MAX_WIDTH || *p == '-' || *p == '+') {
            zps_log_error("model '%s': width %d is not an integer in 1..%u", text, n_dims,
                          ZPS_MODEL_MAX_WIDTH);
            return ZPS_EINVAL;
        }
        if (n_dims == ZPS_MODEL_MAX_LAYERS + 1) {
            zps_log_error("model '%s': more than %d layers", text, ZPS_MODEL_MAX_LAYERS);
            return ZPS_EINVAL;
        }
        dims[n_dims++] = (uint32_t)d;
        if (*end == '\0') {
            break;
        }
        if (*end != '-') {
            zps_log_error("model '%s': unexpected '%c'", text, *end);
            return ZPS_EINVAL;
        }
        p = end + 1;
    }
    if (n_dims < 2) {
        zps_log_error("model '%s': needs at least an input and an output width", text);
        return ZPS_EINVAL;
    }
    size_t off = 0;
    for (int l = 0; l + 1 < n_dims; l++) {
        zps_layer_spec *ls = &out->layers[l];
        ls->in = dims[l];
        ls->out = dims[l + 1];
        ls->w_off = off;
        off += (size_t)ls->in * ls->out;
        ls->b_off = off;
        off += ls->out;
    }
    out->n_layers = n_dims - 1;
    out->n_params = off;
    return ZPS_OK;
}

void zps_model_init_params(const zps_model_spec *m, uint64_t seed, float *params)
{
    zps_rng rng;
    zps_rng_seed(&rng, seed, ZPS_RNG_STREAM_INIT);
    for (int l = 0; l < m->n_layers; l++) {
        const zps_layer_spec *ls = &m->layers[l];
        double std = sqrt(2.0 / ls->in);
        size_t nw = (size_t)ls->in * ls->out;
        for (size_t i = 0; i < nw; i++) {
            params[ls->w_off + i] = (float)(std * zps_rng_normal(&rng));
        }
        memset(params + ls->b_off, 0, ls->out * sizeof(float));
    }
}
