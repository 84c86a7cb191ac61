/* zps_round.c - theta_sync, the pseudo-gradient and its payloads. */
#include "zps_round.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_log.h"
#include "common/zps_outer.h"

zps_err zps_round_init(zps_round *r, size_t n, int compress, const uint64_t *lo,
                       const uint64_t *hi, int n_ranges)
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
    r->at = malloc(k * sizeof *r->at);
    r->len = malloc(k * sizeof *r->len);
    if (!r->sync || !r->delta || !r->lo || !r->hi || !r->at || !r->len) {
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
    free(r->at);
    free(r->len);
    zps_quant_ef_destroy(&r->ef);
    memset(r, 0, sizeof *r);
}

void zps_round_begin(zps_round *r, const float *params)
{
    memcpy(r->sync, params, r->n * sizeof(float));
}

zps_err zps_round_delta(zps_round *r, const float *params)
{
    zps_outer_delta(r->sync, params, r->delta, r->n);
    double sum = 0;
    for (size_t i = 0; i < r->n; i++) {
        sum += (double)r->delta[i] * r->delta[i];
    }
    if (!isfinite(sum)) {
        zps_log_error("diloco: the pseudo-gradient is not finite (the inner steps diverged); "
                      "not sent");
        return ZPS_EINVAL;
    }
    r->norm = sqrt(sum);
    for (int k = 0; r->compress && k < r->n_ranges; k++) {
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
