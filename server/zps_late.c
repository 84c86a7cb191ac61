/* zps_late.c - speculation and stall warnings (zps_late.h). */
#include "zps_late.h"

#include "common/zps_log.h"
#include "server/shard/zps_shard.h"

// Whether `in` of n members are at least as many as the rest: enough to
// hand the rest's slices to, one helper or more each.
static bool s_half_or_more(uint32_t in, uint32_t n)
{
    return in >= n - in;
}

// A late host leader that has pushed nothing holds its followers' parts
// for the shards on other hosts: they come when it pushes, however long
// ago the followers were done. Shard 0 sees a follower on its own host as
// in (it pushed to shard 0 directly) and would not hand its slice on, so
// the shards elsewhere waited for the leader all the same, then dropped
// its sum as partly counted (the leader's own piece in by the helpers'
// copies) and asked it for the followers' runs. Their slices go to the
// helpers with the leader's. (A follower of another host than shard 0's
// is late there too, and handed on as any rank.) Not for a leader under
// way: its sums go out with its buckets, the last ones first, and shard 0
// cannot tell which have.
static void s_hand_followers(zps_shard_io *io, zps_coord *coord, zps_outbox *out, uint64_t step,
                             uint32_t leader, const bool *helper)
{
    const zps_plan *plan = zps_shard_plan(io->shard);
    uint32_t ranks[ZPS_HOST_GROUP_MAX];
    uint32_t n = zps_coord_followers(coord, step, leader, ranks, ZPS_HOST_GROUP_MAX);
    for (uint32_t k = 0; k < n; k++) {
        const zps_plan_slice *sl = zps_plan_find(plan, ranks[k]);
        zps_shard_io_rank *r = sl ? zps_shard_io_rank_of(io, ranks[k]) : NULL;
        if (r && !r->late_now &&
            zps_coord_speculate(coord, out, step, sl->offset, sl->count, ranks[k], helper)) {
            r->late_now = true;
            zps_log_info("step %llu: rank %u's part for the shards elsewhere waits in its leader, "
                         "rank %u: its slice handed on too", (unsigned long long)step, ranks[k],
                         leader);
        }
    }
}

// Speculation: once at least as many members' slices are in as are not
// (as Spark waits for a quantile of its tasks), a slice still missing is
// also handed, in pieces, to the members that are done; the first copy of
// a sample counts. A slice of which nothing came yet is handed at once:
// its owner has not even pushed the buckets backward finishes first, so it
// has stopped, or is so slow that a step would not save it. One under way
// gets --speculate-after median steps more. Measured from the first
// arrival instead, that wait would end at every step: on shared cores the
// last slice lands a third of a step after the first, but within a sixth
// of a step of the one before it. With fewer helpers than late slices,
// one helper could get two.
void zps_late_speculate(zps_shard_io *io, zps_coord *coord, zps_outbox *out, double after, double now)
{
    double median = coord ? zps_coord_median_step_ms(coord) : 0;
    if (!coord || after <= 0 || !zps_shard_io_started(io) || median <= 0) {
        return;
    }
    const zps_plan *plan = zps_shard_plan(io->shard);
    if (!plan || io->quorum_ms == 0 || io->n_in == plan->n) {
        return;
    }
    bool finished[ZPS_MAX_MEMBERS] = {false};
    for (uint32_t i = 0; i < plan->n; i++) {
        finished[plan->slices[i].rank] = zps_shard_io_own_in(io, plan->slices[i].rank);
    }
    bool waited = now - io->quorum_ms >= after * median;
    uint64_t step = zps_shard_step(io->shard);
    for (uint32_t i = 0; i < plan->n; i++) {
        const zps_plan_slice *sl = &plan->slices[i];
        zps_shard_io_rank *r = zps_shard_io_rank_of(io, sl->rank);
        if (!finished[sl->rank] && !r->late_now && (waited || !r->pushed) &&
            zps_coord_speculate(coord, out, step, sl->offset, sl->count, sl->rank, finished)) {
            r->late_now = true;
            if (!r->pushed) {
                s_hand_followers(io, coord, out, step, sl->rank, finished);
            }
        }
    }
}

// At the start of a step: a rank that was late on the step before and sent
// nothing at all during it is presumed still late (a pause usually
// outlasts a step), so its slice is handed to the others at once, to
// compute beside their own; its own copy still counts if it comes first.
// Any push or pull, even for a step already over, says the rank is back:
// it then gets its slice alone again, or the others would go on covering
// it for as long as their copies beat its own.
void zps_late_speculate_ahead(zps_shard_io *io, zps_coord *coord, zps_outbox *out, double after,
                              uint64_t step, uint64_t total_steps)
{
    bool late[ZPS_MAX_MEMBERS] = {false}, any = false;
    for (uint32_t r = 0; r < io->n_ranks; r++) {
        late[r] = io->ranks[r].late_now && !io->ranks[r].heard;
        any = any || late[r];
        io->ranks[r].late_now = false;
    }
    const zps_plan *plan = io->shard ? zps_shard_plan(io->shard) : NULL;
    if (!any || !coord || after <= 0 || !plan || step >= total_steps) {
        return;
    }
    bool helper[ZPS_MAX_MEMBERS] = {false};
    uint32_t helpers = 0;
    for (uint32_t i = 0; i < plan->n; i++) {
        helper[plan->slices[i].rank] = !late[plan->slices[i].rank];
        helpers += helper[plan->slices[i].rank];
    }
    if (!s_half_or_more(helpers, plan->n)) {
        return; // too few to cover the rest
    }
    for (uint32_t i = 0; i < plan->n; i++) {
        const zps_plan_slice *sl = &plan->slices[i];
        zps_shard_io_rank *r = zps_shard_io_rank_of(io, sl->rank);
        if (late[sl->rank] && !r->late_now &&
            zps_coord_speculate(coord, out, step, sl->offset, sl->count, sl->rank, helper)) {
            r->late_now = true; // not handed again
            s_hand_followers(io, coord, out, step, sl->rank, helper);
        }
    }
}

void zps_late_warn_stall(const zps_shard_io *io, const zps_coord *coord, double step_start_ms,
                         double now)
{
    const zps_plan *plan = io->shard ? zps_shard_plan(io->shard) : NULL;
    if (!plan) {
        return;
    }
    uint32_t missing = 0;
    for (uint32_t i = 0; i < plan->n; i++) {
        const zps_plan_slice *sl = &plan->slices[i];
        missing += !zps_shard_slice_done(io->shard, sl->offset, sl->count);
    }
    uint64_t step = zps_shard_step(io->shard);
    double waited_s = (now - step_start_ms) / 1e3;
    uint32_t named = 0;
    for (uint32_t i = 0; i < plan->n && named < ZPS_LATE_WARN_RANKS; i++) {
        const zps_plan_slice *sl = &plan->slices[i];
        if (!zps_shard_slice_done(io->shard, sl->offset, sl->count)) {
            zps_log_warn("step %llu: waiting %.1f s for rank %u (%s, %s): %u of %u slices missing",
                         (unsigned long long)step, waited_s, sl->rank,
                         coord ? zps_coord_member_host(coord, sl->rank) : "?",
                         coord ? zps_coord_member_device(coord, sl->rank) : "?", missing, plan->n);
            named++;
        }
    }
    if (missing > named) {
        zps_log_warn("step %llu: waiting %.1f s for %u more ranks (zps-ctl status --all lists "
                     "every member)",
                     (unsigned long long)step, waited_s, missing - named);
    }
}
