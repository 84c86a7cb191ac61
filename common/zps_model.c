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

static zps_err s_parse_flat(const char *text, zps_model_spec *out)
{
    char *end;
    errno = 0;
    unsigned long long p = strtoull(text + 5, &end, 10);
    if (errno || end == text + 5 || *end || text[5] == '-' || p == 0 || p > ZPS_MODEL_MAX_FLAT) {
        zps_log_error("model '%s': expected flat:P with P in 1..%u", text, ZPS_MODEL_MAX_FLAT);
        return ZPS_EINVAL;
    }
    out->kind = ZPS_MODEL_FLAT;
    out->n_params = (size_t)p;
    return ZPS_OK;
}

zps_err zps_model_parse(const char *text, zps_model_spec *out)
{
    memset(out, 0, sizeof *out);
    if (strncmp(text, "flat:", 5) == 0 && strlen(text) < sizeof out->text) {
        snprintf(out->text, sizeof out->text, "%s", text);
        return s_parse_flat(text, out);
    }
    if (strncmp(text, "mlp:", 4) != 0 || strlen(text) >= sizeof out->text) {
        zps_log_error("model '%s': expected mlp:D0-D1-...-Dk or flat:P", text);
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
    zps_model_init_range(m, seed, 0, m->n_params, params);
}

void zps_model_init_range(const zps_model_spec *m, uint64_t seed, uint64_t lo, uint64_t hi,
                          float *out)
{
    memset(out, 0, (hi - lo) * sizeof(float));
    zps_rng rng;
    zps_rng_seed(&rng, seed, ZPS_RNG_STREAM_INIT);
    // The draws are sequential in flat order, so the values of [lo, hi)
    // depend on every draw before lo: draw them all, keep the range.
    for (int l = 0; l < m->n_layers; l++) {
        const zps_layer_spec *ls = &m->layers[l];
        if (ls->w_off >= hi) {
            break;
        }
        double std = sqrt(2.0 / ls->in);
        size_t nw = (size_t)ls->in * ls->out;
        for (size_t i = 0; i < nw; i++) {
            float v = (float)(std * zps_rng_normal(&rng));
            size_t at = ls->w_off + i;
            if (at >= lo && at < hi) {
                out[at - lo] = v;
            }
        }
    }
}

// Elements in each bucket of a flat model (the last may have fewer).
static uint64_t s_flat_bucket(const zps_model_spec *m)
{
    uint64_t even = (m->n_params + ZPS_MODEL_MAX_BUCKETS - 1) / ZPS_MODEL_MAX_BUCKETS;
    return even > ZPS_MODEL_FLAT_BUCKET ? even : ZPS_MODEL_FLAT_BUCKET;
}

int zps_model_n_buckets(const zps_model_spec *m)
{
    if (m->kind == ZPS_MODEL_EXTERNAL) {
        return m->n_cuts;
    }
    if (m->kind == ZPS_MODEL_FLAT) {
        return (int)((m->n_params + s_flat_bucket(m) - 1) / s_flat_bucket(m));
    }
    return m->n_layers;
}

void zps_model_bucket(const zps_model_spec *m, int i, uint64_t *lo, uint64_t *hi)
{
    if (m->kind == ZPS_MODEL_EXTERNAL) {
        *lo = m->cuts[i + 1];
        *hi = m->cuts[i];
        return;
    }
    if (m->kind == ZPS_MODEL_FLAT) {
        uint64_t size = s_flat_bucket(m);
        int n = zps_model_n_buckets(m);
        *lo = (uint64_t)(n - 1 - i) * size;
        *hi = *lo + size < m->n_params ? *lo + size : m->n_params;
        return;
    }
    const zps_layer_spec *ls = &m->layers[m->n_layers - 1 - i];
    *lo = ls->w_off;
    *hi = ls->b_off + ls->out;
}

void zps_model_spread_order(int n, int *order)
{
    int bits = 0;
    while ((1 << bits) < n) {
        bits++;
    }
    int k = 0;
    for (int x = 0; x < (1 << bits); x++) {
        int r = 0;
        for (int j = 0; j < bits; j++) {
            r |= ((x >> j) & 1) << (bits - 1 - j);
        }
        if (r < n) {
            order[k++] = r;
        }
    }
}

int zps_model_range_buckets(const zps_model_spec *m, uint64_t lo, uint64_t hi, zps_bucket *out)
{
    int n = 0;
    for (int i = 0; i < zps_model_n_buckets(m); i++) {
        uint64_t blo, bhi;
        zps_model_bucket(m, i, &blo, &bhi);
        blo = blo > lo ? blo : lo;
        bhi = bhi < hi ? bhi : hi;
        if (blo < bhi) {
            out[n++] = (zps_bucket){blo, bhi};
        }
    }
    return n;
}

void zps_model_shard_range(size_t n_params, uint32_t i, uint32_t n, uint64_t *lo, uint64_t *hi)
{
    *lo = (uint64_t)n_params * i / n;
    *hi = (uint64_t)n_params * (i + 1) / n;
}
