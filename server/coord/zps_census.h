/* zps_census.h - the members counted, ranked and picked for STATUS,
 * /status and /metrics.
 *
 * One pass over the members (the monitor's window of 32 samples each, one
 * pass over the plan's slices for the shares), so every status surface is
 * linear in members with a small constant, and STATUS is bounded at any
 * size: a summary (counts by state, stragglers, silent), the
 * ZPS_STATUS_SLOWEST slowest live members by lag and up to
 * ZPS_STATUS_FLAGGED_MAX flagged ones (straggler, silent, leaving; the rest
 * counted), or, asked for, a page of at most ZPS_STATUS_PAGE_MAX rows in
 * rank order. A job of at most ZPS_STATUS_ALL members lists them all. */
#ifndef ZPS_CENSUS_H
#define ZPS_CENSUS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/zps_err.h"
#include "server/coord/zps_coord.h"
#include "server/coord/zps_monitor.h"

#define ZPS_STATUS_ALL 32          // a job this small lists every member
#define ZPS_STATUS_SLOWEST 16      // the slowest live members by lag, listed
#define ZPS_STATUS_FLAGGED_MAX 64  // flagged members listed at most; the rest counted
#define ZPS_STATUS_PAGE_MAX 256    // rows of a page at most
#define ZPS_STATUS_PICKED_MAX (ZPS_STATUS_SLOWEST + ZPS_STATUS_FLAGGED_MAX)

typedef struct zps_census_row {
    zps_monitor_view v; // the monitor's figures (zero when it has none)
    bool has_view;      // the monitor has seen a push of it
    bool live;          // not gone, not leaving
    bool silent;        // live, not heard from for half the worker timeout
    bool flagged;       // straggler, silent or leaving
    bool slow;          // among the slowest
    uint32_t share;     // samples in the plan in force (waiting: the share asked for)
} zps_census_row;

typedef struct zps_census {
    uint32_t n;                  // members: rows[rank], ranks 0..n-1
    zps_census_row *rows;        // owned
    uint32_t by_state[4];        // members by zps_member_state
    uint32_t stragglers;         // live and flagged stragglers
    uint32_t silent;             // live and silent
    uint32_t flagged;            // flagged members
    uint32_t slowest[ZPS_STATUS_SLOWEST]; // ranks, slowest first
    uint32_t n_slowest;
    uint32_t picked[ZPS_STATUS_PICKED_MAX]; // the rows listed without a page, rank order
    uint32_t n_picked;
    uint32_t flagged_omitted;    // flagged members not among picked
} zps_census;

// zps_census_take counts c's members into out (zps_census_fini frees it).
zps_err zps_census_take(const zps_coord *c, zps_census *out);
void zps_census_fini(zps_census *cs);
// zps_census_page clips a page (limit 0 or above ZPS_STATUS_PAGE_MAX:
// ZPS_STATUS_PAGE_MAX) to the members: its rows are first..first+count-1.
void zps_census_page(const zps_census *cs, uint32_t offset, uint32_t limit, uint32_t *first,
                     uint32_t *count);

#endif
