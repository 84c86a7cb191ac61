/* zps_plan.c - splitting the global batch among members. */
#include "zps_plan.h"

#include <stdio.h>
#include <string.h>

zps_err zps_plan_split(uint32_t global_batch, const uint32_t *shares, uint32_t n, zps_plan *out,
                       char *why, size_t why_len)
{
    memset(out, 0, sizeof *out);
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

const zps_plan_slice *zps_plan_find(const zps_plan *p, uint32_t rank)
{
    for (uint32_t i = 0; i < p->n; i++) {
        if (p->slices[i].rank == rank) {
            return &p->slices[i];
        }
    }
    return NULL;
}

zps_err zps_plan_from_wire(Zps__Slice *const *slices, size_t n, uint32_t global_batch,
                           zps_plan *out)
{
    memset(out, 0, sizeof *out);
    if (n == 0 || n > ZPS_MAX_MEMBERS) {
        return ZPS_EPROTO;
    }
    uint64_t offset = 0;
    for (size_t i = 0; i < n; i++) {
        const Zps__Slice *s = slices[i];
        if (s->offset != offset || s->count == 0 || (i > 0 && s->rank <= slices[i - 1]->rank)) {
            return ZPS_EPROTO;
        }
        out->slices[i] = (zps_plan_slice){
            .rank = s->rank, .member_id = s->member_id, .offset = s->offset, .count = s->count,
            .inner_steps = s->inner_steps};
        offset += s->count;
    }
    if (offset != global_batch) {
        return ZPS_EPROTO;
    }
    out->n = (uint32_t)n;
    out->global_batch = global_batch;
    return ZPS_OK;
}
