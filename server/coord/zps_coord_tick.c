/* zps_coord_tick.c - the coordinator's clock and a step's end on shard 0:
 * at every tick the deadlines (silent members evicted, a recovery that goes
 * on without those who did not call back, the end's grace) and the waiting
 * and progress lines; at a step's end its record and the run's end. The top
 * of the coordinator's files: it calls the others, none calls it. */
#include "zps_coord_int.h"

#include "common/zps_clock.h"

void zps_coord_run_figures(const zps_coord *c, zps_coord_run *out)
{
    bool training = c->state == ZPS_COORD_TRAINING || c->state == ZPS_COORD_DONE;
    double until = c->state == ZPS_COORD_DONE ? c->done_ms : zps_coord_now(c);
    *out = (zps_coord_run){.training = training,
                           .from_step = c->started_step,
                           .to_step = training ? c->steps_done : c->started_step,
                           .steps = c->steps_run,
                           .secs = training ? (until - c->started_ms) / 1e3 : 0,
                           .starts = c->starts,
                           .job_started_unix_ms = c->job_started_unix_ms};
    out->ms_per_step = out->steps ? 1e3 * out->secs / (double)out->steps : 0.0;
}

// "the job first started 2026-12-02 16:21:38 UTC (1234.5 s ago, wall
// clock)", or why that is unknown.
static void s_job_start(const zps_coord_run *r, char *buf, size_t len)
{
    if (!r->job_started_unix_ms) {
        snprintf(buf, len, "when the job first started is unknown (the job state it resumed "
                           "from was saved by an older zps)");
        return;
    }
    char when[ZPS_CLOCK_UTC_LEN];
    zps_clock_utc(r->job_started_unix_ms, when);
    double ago = ((double)zps_clock_wall_ms() - (double)r->job_started_unix_ms) / 1e3;
    snprintf(buf, len, "the job first started %s (%.1f s ago, wall clock)", when, ago);
}

// The run's end: what this start trained, in its own time, and when the
// job first started (wall clock: it spans restarts).
static void s_log_summary(const zps_coord *c)
{
    zps_coord_run r;
    zps_coord_run_figures(c, &r);
    if (r.starts == 1 && r.from_step == 0 && r.steps == r.to_step) {
        // A job's one and only start: its figures are the job's.
        zps_log_info("trained %llu steps in %.1f s (%.2f ms/step)", (unsigned long long)r.steps,
                     r.secs, r.ms_per_step);
        return;
    }
    char start[96], job[160];
    if (r.starts) {
        snprintf(start, sizeof start, "start %u of the job", r.starts);
    } else {
        snprintf(start, sizeof start, "a resumed start of the job (its number unknown)");
    }
    s_job_start(&r, job, sizeof job);
    zps_log_info("trained %llu steps (steps %llu..%llu%s) in %.1f s (%.2f ms/step) in this "
                 "start, %s; %s",
                 (unsigned long long)r.steps, (unsigned long long)r.from_step,
                 (unsigned long long)r.to_step,
                 r.steps != r.to_step - r.from_step ? ", replays included" : "", r.secs,
                 r.ms_per_step, start, job);
}

// A step completed on shard 0: its record, and the run's end after the last.
void zps_coord_step_done(zps_coord *c, uint64_t step, float loss, double step_ms,
                         const uint32_t *counted)
{
    c->steps_done = step + 1;
    c->steps_run++;
    zps_coord_shard_done(c, 0, step + 1);
    c->last_loss = loss;
    c->last_step_ms = step_ms;
    c->sum_step_ms += step_ms;
    c->n_step_ms++;
    zps_coord_log_step(c, step, loss, step_ms, counted);
    if (c->steps_done >= c->cfg.total_steps) {
        c->state = ZPS_COORD_DONE;
        c->done_ms = zps_coord_now(c);
        s_log_summary(c);
        if (c->cfg.metrics) {
            fflush(c->cfg.metrics);
        }
    }
}

static void s_log_progress(zps_coord *c)
{
    double mean = c->n_step_ms ? c->sum_step_ms / (double)c->n_step_ms : 0;
    zps_log_info("step %llu/%llu epoch %llu: loss %.4f, %.2f ms/step", (unsigned long long)c->steps_done,
                 (unsigned long long)c->cfg.total_steps,
                 (unsigned long long)zps_coord_epoch(c, c->steps_done), c->last_loss, mean);
    if (c->cfg.metrics) {
        fflush(c->cfg.metrics);
    }
    c->sum_step_ms = 0;
    c->n_step_ms = 0;
}

// Evicts the members silent past --worker-timeout-ms, and notes when the
// next one could be: a member is only ever heard later than it was, so
// the earliest deadline found stands until then. Looking at every member
// at every tick (50 ms) cost the coordinator N members times the ticks of
// a step, per step: with 4096 members on 2 cores, whose steps take 0.7 s,
// 6 % of its CPU (bench/swarm --hosts). A member that gets its job later
// is heard as it gets it, so its deadline is later still; and
// ZPS_COORD_SILENT_SCAN_MS bounds the wait however a member came to count.
static void s_evict_silent(zps_coord *c, zps_outbox *out, double now_ms)
{
    double next = now_ms + ZPS_COORD_SILENT_SCAN_MS;
    for (uint32_t i = 0; i < c->n_members; i++) {
        zps_coord_member *mem = &c->members[i];
        // A joiner waits for its JOB, which comes at a step boundary,
        // without heartbeats: only a member with its job can fall silent.
        if (mem->life.state != ZPS_MEMBER_ACTIVE || !mem->has_job) {
            continue;
        }
        if (now_ms - mem->last_seen_ms > c->cfg.worker_timeout_ms) {
            zps_coord_evict(c, out, mem, now_ms);
        } else if (mem->last_seen_ms + c->cfg.worker_timeout_ms < next) {
            next = mem->last_seen_ms + c->cfg.worker_timeout_ms;
        }
    }
    c->next_silent_scan_ms = next;
}

// The deadlines, checked at every tick (not behind the log's pace):
// silent members are evicted, a recovery goes on without those that did
// not call back, a member that does not finish after the last step is
// given up, and a joiner admitted too late is told the job is over.
static void s_check_deadlines(zps_coord *c, zps_outbox *out, double now_ms)
{
    if (c->state >= ZPS_COORD_ASSIGNING && now_ms >= c->next_silent_scan_ms) {
        s_evict_silent(c, out, now_ms);
    }
    if (c->state == ZPS_COORD_RECOVERING && now_ms > c->recover_deadline_ms) {
        zps_coord_try_recover(c, out, true);
    }
    for (uint32_t i = 0; c->state == ZPS_COORD_DONE && i < c->n_members; i++) {
        zps_coord_member *mem = &c->members[i];
        if (mem->life.state == ZPS_MEMBER_JOINING) {
            // Admitted too late: the job ended before a boundary took it in.
            zps_outbox_add_error(out, &mem->route, c->job_id, c->steps_done, ZPS_ECLOSED,
                                 "the job is over");
            (void)zps_member_depart(&mem->life, ZPS_EXIT_LEFT);
        } else if (mem->life.state == ZPS_MEMBER_ACTIVE &&
                   now_ms - c->done_ms > ZPS_COORD_END_GRACE_MS) {
            zps_log_warn("rank %u (%s) did not finish within %.0f s of the last step; "
                         "giving up on it", i, mem->host, ZPS_COORD_END_GRACE_MS / 1e3);
            (void)zps_member_depart(&mem->life, ZPS_EXIT_EVICTED);
            zps_member_retire(&mem->life);
        }
    }
}

// What the coordinator waits for, said every few seconds.
static void s_log_waiting(zps_coord *c)
{
    switch (c->state) {
    case ZPS_COORD_RECOVERING:
        zps_log_info("restarted at step %llu: waiting for shards and workers to call back",
                     (unsigned long long)c->steps_done);
        break;
    case ZPS_COORD_WAITING:
        zps_log_info("waiting for %u more worker(s) to say HELLO and %u more shard(s) to "
                     "register (%u of %u workers, %u of %u shards)",
                     c->cfg.workers - c->n_members, c->cfg.shards - c->n_registered,
                     c->n_members, c->cfg.workers, c->n_registered, c->cfg.shards);
        break;
    case ZPS_COORD_ASSIGNING:
        for (uint32_t i = 1; i < c->cfg.shards; i++) {
            if (!c->shards[i].ready) {
                zps_log_info("waiting for shard %u at %s to confirm its range", i,
                             c->shards[i].endpoint);
            }
        }
        break;
    case ZPS_COORD_TRAINING:
        if (zps_coord_live_members(c) == 0) {
            zps_log_warn("step %llu cannot complete: no live worker; waiting for workers to "
                         "join (zps-worker --coordinator %s)",
                         (unsigned long long)zps_coord_global_done(c), c->cfg.endpoint);
        }
        s_log_progress(c);
        break;
    case ZPS_COORD_DONE:
        for (uint32_t i = 0; i < c->n_members; i++) {
            if (c->members[i].life.state == ZPS_MEMBER_ACTIVE) {
                zps_log_info("run complete; waiting for rank %u (%s) to report and finish", i,
                             c->members[i].host);
            }
        }
        break;
    }
}

void zps_coord_tick(zps_coord *c, zps_outbox *out, double now_ms)
{
    s_check_deadlines(c, out, now_ms);
    zps_coord_norm_tick(c, now_ms);
    if (now_ms >= c->next_log_ms) {
        s_log_waiting(c);
        c->next_log_ms = now_ms + (c->state == ZPS_COORD_TRAINING ? ZPS_COORD_PROGRESS_MS
                                                          : ZPS_COORD_WAIT_LOG_MS);
    }
}
