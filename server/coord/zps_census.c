/* zps_census.c - the members counted, ranked and picked for the status surfaces. */
#include "zps_census.h"

#include <stdlib.h>
#include <string.h>

#include "server/coord/zps_coord_int.h"

// The plan's shares by rank: one pass over its slices, not a search per member.
static void s_shares(const zps_coord *c, zps_census *cs)
{
    const zps_plan *plan = zps_coord_plan(c);
    for (uint32_t i = 0; plan && i < plan->n; i++) {
        if (plan->slices[i].rank < cs->n) {
            cs->rows[plan->slices[i].rank].share = plan->slices[i].count;
        }
    }
    for (uint32_t r = 0; r < cs->n; r++) {
        zps_census_row *row = &cs->rows[r];
        row->share = c->state == ZPS_COORD_WAITING ? c->members[r].share
                     : row->live                   ? row->share
                                                   : 0;
    }
}

// Keeps rank among the n slowest live members by lag (ties: the lower rank
// first): an insertion into a sorted array of ZPS_STATUS_SLOWEST.
static void s_rank_slow(zps_census *cs, uint32_t rank)
{
    float lag = cs->rows[rank].v.lag_ms;
    uint32_t at = cs->n_slowest;
    while (at > 0 && cs->rows[cs->slowest[at - 1]].v.lag_ms < lag) {
        at--;
    }
    if (at >= ZPS_STATUS_SLOWEST) {
        return;
    }
    uint32_t keep = cs->n_slowest < ZPS_STATUS_SLOWEST ? cs->n_slowest : ZPS_STATUS_SLOWEST - 1;
    memmove(&cs->slowest[at + 1], &cs->slowest[at], (keep - at) * sizeof cs->slowest[0]);
    cs->slowest[at] = rank;
    cs->n_slowest = keep + 1;
}

static void s_count(const zps_coord *c, zps_census *cs, uint32_t r)
{
    const zps_coord_member *m = &c->members[r];
    zps_census_row *row = &cs->rows[r];
    double silent_ms = c->cfg.worker_timeout_ms / 2;
    row->has_view = zps_monitor_view_of(c->mon, m->rank, &row->v);
    row->live = zps_member_live(&m->life);
    row->silent = row->live && silent_ms > 0 && zps_coord_now(c) - m->last_seen_ms > silent_ms;
    bool straggler = row->live && row->v.straggler;
    row->flagged = straggler || row->silent || m->life.state == ZPS_MEMBER_LEAVING;
    cs->by_state[m->life.state < 4 ? m->life.state : ZPS_MEMBER_GONE]++;
    cs->stragglers += straggler;
    cs->silent += row->silent;
    cs->flagged += row->flagged;
    if (row->live && row->has_view) {
        s_rank_slow(cs, r);
    }
}

// The rows listed without a page: all of a small job; else the slowest and
// the first ZPS_STATUS_FLAGGED_MAX flagged, in rank order, each once.
static void s_pick(zps_census *cs)
{
    for (uint32_t k = 0; k < cs->n_slowest; k++) {
        cs->rows[cs->slowest[k]].slow = true;
    }
    uint32_t flagged = 0;
    for (uint32_t r = 0; r < cs->n; r++) {
        const zps_census_row *row = &cs->rows[r];
        bool listed = cs->n <= ZPS_STATUS_ALL || row->slow ||
                      (row->flagged && flagged < ZPS_STATUS_FLAGGED_MAX);
        flagged += row->flagged && !row->slow && listed;
        if (listed) {
            cs->picked[cs->n_picked++] = r;
        } else if (row->flagged) {
            cs->flagged_omitted++;
        }
    }
}

zps_err zps_census_take(const zps_coord *c, zps_census *out)
{
    memset(out, 0, sizeof *out);
    out->n = c->n_members;
    out->rows = calloc(out->n ? out->n : 1, sizeof *out->rows);
    if (!out->rows) {
        return ZPS_ENOMEM;
    }
    for (uint32_t r = 0; r < out->n; r++) {
        s_count(c, out, r);
    }
    s_shares(c, out);
    s_pick(out);
    return ZPS_OK;
}

void zps_census_fini(zps_census *cs)
{
    free(cs->rows);
    cs->rows = NULL;
}

void zps_census_page(const zps_census *cs, uint32_t offset, uint32_t limit, uint32_t *first,
                     uint32_t *count)
{
    if (limit == 0 || limit > ZPS_STATUS_PAGE_MAX) {
        limit = ZPS_STATUS_PAGE_MAX;
    }
    *first = offset < cs->n ? offset : cs->n;
    *count = cs->n - *first < limit ? cs->n - *first : limit;
}
