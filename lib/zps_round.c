/* zps_round.c - theta_sync, the pseudo-gradient and its payloads. */
#include "zps_round.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_log.h"
#include "common/zps_outer.h"

zps_err zps_round_init(zps_round *r, size_t n, int compress, const uint64_t *lo,
                       const uint64_t *hi, const uint8_t *frag, int n_ranges)
{
    memset(r, 0, sizeof *r);
    r->n = n;
    r->compress = compress;
    r->n_ranges = n_ranges;
    size_t k = n_ranges > 0 ? (size_t)n_ranges : 1;
    // Zeroed: a piece pushed as missing before any round was trained here
    // sends these bytes, which the shard ignores.
    r->sync = malloc(n * sizeof(float));
    r->delta = calloc(n, sizeof(float));
    r->lo = malloc(k * sizeof *r->lo);
    r->hi = malloc(k * sizeof *r->hi);
    r->frag = calloc(k, sizeof *r->frag);
    r->at = malloc(k * sizeof *r->at);
    r->len = malloc(k * sizeof *r->len);
    if (!r->sync || !r->delta || !r->lo || !r->hi || !r->frag || !r->at || !r->len) {
        zps_log_error("diloco: cannot allocate the round's %zu floats", n);
        return ZPS_ENOMEM;
    }
    size_t total = 0;
    for (int i = 0; i < n_ranges; i++) {
        if (lo[i] >= hi[i] || hi[i] > n) {
            zps_log_error("diloco: range [%llu, %llu) is not in the %zu floats",
                          (unsigned long long)lo[i], (unsigned long long)hi[i], n);
            return ZPS_EINVAL;
        }
        r->lo[i] = lo[i];
        r->hi[i] = hi[i];
        r->frag[i] = frag ? frag[i] : 0;
        size_t size = (hi[i] - lo[i]) * sizeof(float);
        if (compress && zps_quant_size(compress, hi[i] - lo[i], ZPS_QUANT_BLOCK, &size) != ZPS_OK) {
            zps_log_error("diloco: compression %d is none this build knows", compress);
            return ZPS_EINVAL;
        }
        r->at[i] = compress ? total : lo[i] * sizeof(float);
        r->len[i] = size;
        total += size;
    }
    r->bytes = total;
    if (compress && (!(r->enc = calloc(total ? total : 1, 1)) ||
                     !(r->ef = zps_quant_ef_new(compress, ZPS_QUANT_BLOCK, n)))) {
        zps_log_error("diloco: cannot allocate the %zu bytes of compressed pushes", total);
        return ZPS_ENOMEM;
    }
    return ZPS_OK;
}

void zps_round_fini(zps_round *r)
{
    free(r->sync);
    free(r->delta);
    free(r->enc);
    free(r->lo);
    free(r->hi);
    free(r->frag);
    free(r->at);
    free(r->len);
    zps_quant_ef_destroy(&r->ef);
    memset(r, 0, sizeof *r);
}

bool zps_round_has(const zps_round *r, int k, int frag)
{
    return frag == ZPS_ROUND_ALL || r->frag[k] == frag;
}

void zps_round_begin(zps_round *r, const float *params, int frag)
{
    if (frag == ZPS_ROUND_ALL) {
        memcpy(r->sync, params, r->n * sizeof(float));
        return;
    }
    for (int k = 0; k < r->n_ranges; k++) {
        if (r->frag[k] == frag) {
            memcpy(r->sync + r->lo[k], params + r->lo[k], (r->hi[k] - r->lo[k]) * sizeof(float));
        }
    }
}

// The delta of [lo, hi); the sum of its squares.
static double s_delta(zps_round *r, const float *params, size_t lo, size_t hi)
{
    zps_outer_delta(r->sync + lo, params + lo, r->delta + lo, hi - lo);
    double sum = 0;
    for (size_t i = lo; i < hi; i++) {
        sum += (double)r->delta[i] * r->delta[i];
    }
    return sum;
}

zps_err zps_round_delta(zps_round *r, const float *params, int frag)
{
    double sum = 0;
    if (frag == ZPS_ROUND_ALL) {
        sum = s_delta(r, params, 0, r->n);
    }
    for (int k = 0; frag != ZPS_ROUND_ALL && k < r->n_ranges; k++) {
        if (r->frag[k] == frag) {
            sum += s_delta(r, params, r->lo[k], r->hi[k]);
        }
    }
    if (!isfinite(sum)) {
        zps_log_error("diloco: the pseudo-gradient is not finite (the inner steps diverged); "
                      "not sent");
        return ZPS_EINVAL;
    }
    r->norm = sqrt(sum);
    for (int k = 0; r->compress && k < r->n_ranges; k++) {
        if (!zps_round_has(r, k, frag)) {
            continue;
        }
        zps_err err = zps_quant_ef_encode(r->ef, r->lo[k], r->delta + r->lo[k],
                                          r->hi[k] - r->lo[k], r->enc + r->at[k], r->len[k]);
        if (err != ZPS_OK) {
            zps_log_error("diloco: range [%llu, %llu) of the pseudo-gradient does not encode",
                          (unsigned long long)r->lo[k], (unsigned long long)r->hi[k]);
            return err;
        }
    }
    return ZPS_OK;
}

uint64_t zps_round_bytes(const zps_round *r, int frag)
{
    if (frag == ZPS_ROUND_ALL) {
        return r->bytes;
    }
    uint64_t bytes = 0;
    for (int k = 0; k < r->n_ranges; k++) {
        bytes += r->frag[k] == frag ? r->len[k] : 0;
    }
    return bytes;
}

void zps_round_payload(const zps_round *r, int k, const void **data, size_t *len)
{
    *data = r->compress ? (const void *)(r->enc + r->at[k])
                        : (const void *)((const uint8_t *)r->delta + r->at[k]);
    *len = r->len[k];
}

void zps_round_reset_feedback(zps_round *r)
{
    if (r->ef) {
        zps_quant_ef_reset(r->ef);
    }
}
