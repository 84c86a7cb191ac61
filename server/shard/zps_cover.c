/* zps_cover.c - a bitmap of samples per bucket, walked a word at a time. */
#include "zps_cover.h"

#include <stdlib.h>
#include <string.h>

zps_err zps_cover_init(zps_cover *c, uint32_t batch, int n_buckets)
{
    memset(c, 0, sizeof *c);
    c->batch = batch;
    c->n_buckets = n_buckets > 0 ? n_buckets : 0;
    c->words = (batch + 63) / 64;
    size_t n = (size_t)c->words * (size_t)c->n_buckets;
    c->bits = calloc(n ? n : 1, sizeof *c->bits);
    return c->bits ? ZPS_OK : ZPS_ENOMEM;
}

void zps_cover_fini(zps_cover *c)
{
    free(c->bits);
    memset(c, 0, sizeof *c);
}

// The bits of word w that fall in [lo, hi).
static uint64_t s_mask(uint32_t w, uint32_t lo, uint32_t hi)
{
    uint32_t from = w * 64 > lo ? 0 : lo - w * 64;
    uint32_t to = (w + 1) * 64 < hi ? 64 : hi - w * 64;
    uint64_t upper = to == 64 ? ~0ULL : (1ULL << to) - 1;
    return upper & ~((1ULL << from) - 1);
}

// Bucket b's words, with [lo, hi) clamped to the batch (empty if b is not one).
static uint64_t *s_row(const zps_cover *c, int b, uint32_t *lo, uint32_t *hi)
{
    *hi = *hi < c->batch ? *hi : c->batch;
    if (b < 0 || b >= c->n_buckets || *lo >= *hi) {
        *lo = *hi = 0;
        return NULL;
    }
    return c->bits + (size_t)b * c->words;
}

bool zps_cover_any(const zps_cover *c, int b, uint32_t lo, uint32_t hi)
{
    const uint64_t *row = s_row(c, b, &lo, &hi);
    for (uint32_t w = lo / 64; row && w * 64 < hi; w++) {
        if (row[w] & s_mask(w, lo, hi)) {
            return true;
        }
    }
    return false;
}

uint32_t zps_cover_count(const zps_cover *c, int b, uint32_t lo, uint32_t hi)
{
    const uint64_t *row = s_row(c, b, &lo, &hi);
    uint32_t n = 0;
    for (uint32_t w = lo / 64; row && w * 64 < hi; w++) {
        n += (uint32_t)__builtin_popcountll(row[w] & s_mask(w, lo, hi));
    }
    return n;
}

void zps_cover_add(zps_cover *c, int b, uint32_t lo, uint32_t hi)
{
    uint64_t *row = s_row(c, b, &lo, &hi);
    for (uint32_t w = lo / 64; row && w * 64 < hi; w++) {
        row[w] |= s_mask(w, lo, hi);
    }
}

void zps_cover_clear(zps_cover *c)
{
    memset(c->bits, 0, (size_t)c->words * (size_t)c->n_buckets * sizeof *c->bits);
}
