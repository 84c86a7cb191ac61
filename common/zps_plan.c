/* zps_plan.c - splitting the global batch among members. */
#include "zps_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void zps_plan_fini(zps_plan *p)
{
    free(p->slices);
    memset(p, 0, sizeof *p);
}

// Empties out and gives it room for n slices (zeroed).
static zps_err s_alloc(zps_plan *out, uint32_t n)
{
    zps_plan_fini(out);
    out->slices = n ? calloc(n, sizeof *out->slices) : NULL;
    return n && !out->slices ? ZPS_ENOMEM : ZPS_OK;
}

zps_err zps_plan_copy(zps_plan *dst, const zps_plan *src)
{
    if (dst == src) {
        return ZPS_OK;
    }
    if (s_alloc(dst, src->n) != ZPS_OK) {
        return ZPS_ENOMEM;
    }
    if (src->n) {
        memcpy(dst->slices, src->slices, src->n * sizeof *src->slices);
    }
    dst->n = src->n;
    dst->global_batch = src->global_batch;
    return ZPS_OK;
}

zps_err zps_plan_split(uint32_t global_batch, const uint32_t *shares, uint32_t n, zps_plan *out,
                       char *why, size_t why_len)
{
    zps_plan_fini(out);
    if (n == 0 || n > ZPS_MAX_MEMBERS) {
        snprintf(why, why_len, "%u members (1..%d)", n, ZPS_MAX_MEMBERS);
        return ZPS_EINVAL;
    }
    uint64_t fixed = 0;
    uint32_t n_flex = 0;
    for (uint32_t i = 0; i < n; i++) {
        fixed += shares[i];
        n_flex += shares[i] == 0;
    }
    if (fixed > global_batch) {
        snprintf(why, why_len, "fixed shares add up to %llu > global batch %u",
                 (unsigned long long)fixed, global_batch);
        return ZPS_EINVAL;
    }
    uint32_t rest = global_batch - (uint32_t)fixed;
    if (n_flex == 0 && rest != 0) {
        snprintf(why, why_len, "fixed shares add up to %llu, not the global batch %u",
                 (unsigned long long)fixed, global_batch);
        return ZPS_EINVAL;
    }
    if (n_flex > 0 && rest < n_flex) {
        snprintf(why, why_len, "%u samples left for %u members without a fixed share", rest,
                 n_flex);
        return ZPS_EINVAL;
    }
    if (s_alloc(out, n) != ZPS_OK) {
        snprintf(why, why_len, "no memory for a plan of %u members", n);
        return ZPS_ENOMEM;
    }
    uint32_t offset = 0, flex_seen = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t count = shares[i];
        if (count == 0) {
            count = rest / n_flex + (flex_seen < rest % n_flex ? 1 : 0);
            flex_seen++;
        }
        out->slices[i] = (zps_plan_slice){.rank = i, .offset = offset, .count = count};
        offset += count;
    }
    out->n = n;
    out->global_batch = global_batch;
    return ZPS_OK;
}

uint32_t zps_plan_round_share(uint32_t share, uint32_t micro)
{
    if (micro == 0 || share == 0) {
        return share;
    }
    // Twice the share over twice M: a half rounds up for an odd M too.
    uint64_t units = ((uint64_t)share * 2 + micro) / ((uint64_t)micro * 2);
    units = units ? units : 1;
    return units * micro > UINT32_MAX ? UINT32_MAX / micro * micro : (uint32_t)(units * micro);
}

zps_err zps_plan_split_micro(uint32_t global_batch, uint32_t micro, const uint32_t *shares,
                             uint32_t n, zps_plan *out, char *why, size_t why_len)
{
    if (micro == 0) {
        return zps_plan_split(global_batch, shares, n, out, why, why_len);
    }
    zps_plan_fini(out);
    if (global_batch % micro != 0) {
        snprintf(why, why_len, "global batch %u is not whole micro-batches of %u", global_batch,
                 micro);
        return ZPS_EINVAL;
    }
    if (n > global_batch / micro) {
        snprintf(why, why_len, "%u members for %u micro-batches of %u: each needs one", n,
                 global_batch / micro, micro);
        return ZPS_EINVAL;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (shares[i] % micro != 0) {
            snprintf(why, why_len, "share %u is not whole micro-batches of %u", shares[i], micro);
            return ZPS_EINVAL;
        }
    }
    uint32_t *units = calloc(n ? n : 1, sizeof *units);
    if (!units) {
        snprintf(why, why_len, "no memory for a plan of %u members", n);
        return ZPS_ENOMEM;
    }
    for (uint32_t i = 0; i < n; i++) {
        units[i] = shares[i] / micro;
    }
    // The split of the micro-batches, then scaled back to samples.
    char inner[192];
    zps_err err = zps_plan_split(global_batch / micro, units, n, out, inner, sizeof inner);
    free(units);
    if (err != ZPS_OK) {
        snprintf(why, why_len, "in micro-batches of %u: %s", micro, inner);
        return err;
    }
    for (uint32_t i = 0; i < n; i++) {
        out->slices[i].offset *= micro;
        out->slices[i].count *= micro;
    }
    out->global_batch = global_batch;
    return ZPS_OK;
}

uint32_t zps_plan_max_pieces(uint32_t count, uint32_t micro)
{
    return micro ? count / micro : count;
}

void zps_plan_piece(uint32_t offset, uint32_t count, uint32_t micro, uint32_t i, uint32_t k,
                    uint32_t *lo, uint32_t *hi)
{
    uint64_t unit = micro ? micro : 1;
    uint64_t units = count / unit;
    *lo = offset + (uint32_t)(units * i / k * unit);
    // The last piece ends where the range does (a range of whole units
    // always; a tail of fewer than M samples goes with it).
    *hi = i + 1 == k ? offset + count : offset + (uint32_t)(units * (i + 1) / k * unit);
}

const zps_plan_slice *zps_plan_find(const zps_plan *p, uint32_t rank)
{
    uint32_t lo = 0, hi = p->n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (p->slices[mid].rank < rank) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo < p->n && p->slices[lo].rank == rank ? &p->slices[lo] : NULL;
}

zps_err zps_plan_part_from_wire(Zps__Slice *const *slices, size_t n, uint32_t global_batch,
                                zps_plan *out)
{
    zps_plan_fini(out);
    if (n > ZPS_MAX_MEMBERS || s_alloc(out, (uint32_t)n) != ZPS_OK) {
        return n > ZPS_MAX_MEMBERS ? ZPS_EPROTO : ZPS_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        const Zps__Slice *s = slices[i];
        if (s->count == 0 || s->offset >= global_batch || s->count > global_batch - s->offset ||
            s->rank >= ZPS_MAX_MEMBERS || (i > 0 && s->rank <= slices[i - 1]->rank)) {
            zps_plan_fini(out);
            return ZPS_EPROTO;
        }
        out->slices[i] = (zps_plan_slice){
            .rank = s->rank, .member_id = s->member_id, .offset = s->offset, .count = s->count,
            .inner_steps = s->inner_steps};
    }
    out->n = (uint32_t)n;
    out->global_batch = global_batch;
    return ZPS_OK;
}

zps_err zps_plan_from_wire(Zps__Slice *const *slices, size_t n, uint32_t global_batch,
                           zps_plan *out)
{
    zps_plan_fini(out);
    if (n == 0 || n > ZPS_MAX_MEMBERS) {
        return ZPS_EPROTO;
    }
    if (s_alloc(out, (uint32_t)n) != ZPS_OK) {
        return ZPS_ENOMEM;
    }
    uint64_t offset = 0;
    for (size_t i = 0; i < n; i++) {
        const Zps__Slice *s = slices[i];
        if (s->offset != offset || s->count == 0 || s->rank >= ZPS_MAX_MEMBERS ||
            (i > 0 && s->rank <= slices[i - 1]->rank)) {
            zps_plan_fini(out);
            return ZPS_EPROTO;
        }
        out->slices[i] = (zps_plan_slice){
            .rank = s->rank, .member_id = s->member_id, .offset = s->offset, .count = s->count,
            .inner_steps = s->inner_steps};
        offset += s->count;
    }
    if (offset != global_batch) {
        zps_plan_fini(out);
        return ZPS_EPROTO;
    }
    out->n = (uint32_t)n;
    out->global_batch = global_batch;
    return ZPS_OK;
}
