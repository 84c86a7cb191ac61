/* zps_coord_render.c - the STATUS reply, the documents of --http and the metrics-log line. */
#include "zps_coord_int.h"

#include <stdlib.h>

#include <jansson.h>

#include "common/zps_mlog.h"
#include "server/coord/zps_census.h"

static const char *s_state_name(zps_coord_phase s)
{
    static const char *names[] = {"waiting", "assigning", "training", "done", "recovering"};
    return names[s];
}

// The fields of a member that STATUS and the saved job state share.
void zps_coord_member_to_wire(const zps_coord_member *s, Zps__Member *out)
{
    zps__member__init(out);
    out->rank = s->rank;
    out->host = (char *)s->host;
    out->device = (char *)s->device;
    out->share = s->share;
    out->pid = s->pid;
    out->live = zps_member_live(&s->life);
}

// A STATUS member row: its share in the plan in force, its pushes and
// what the straggler detector makes of it.
static void s_status_member(const zps_coord *c, const zps_census *cs, uint32_t rank,
                            Zps__Member *out)
{
    const zps_coord_member *s = &c->members[rank];
    const zps_census_row *row = &cs->rows[rank];
    zps_coord_member_to_wire(s, out);
    out->share = row->share;
    out->pushes = s->pushes;
    out->compute_ms = s->compute_ms;
    out->silent = row->silent;
    if (row->has_view) {
        out->lag_ms = row->v.lag_ms;
        out->straggler = row->v.straggler;
        out->samples_per_s = row->v.samples_per_s;
        out->inner_steps = row->v.inner_steps;
        out->delta_norm = row->v.delta_norm;
        out->round_bytes = row->v.bytes;
    }
}

// The member summary of STATUS: counts by state, the slowest, what was
// left out.
static void s_status_census(const zps_census *cs, Zps__Status *st)
{
    st->members_total = cs->n;
    st->members_joining = cs->by_state[ZPS_MEMBER_JOINING];
    st->members_active = cs->by_state[ZPS_MEMBER_ACTIVE];
    st->members_leaving = cs->by_state[ZPS_MEMBER_LEAVING];
    st->members_gone = cs->by_state[ZPS_MEMBER_GONE];
    st->members_stragglers = cs->stragglers;
    st->members_silent = cs->silent;
    st->n_slowest = cs->n_slowest;
    st->slowest = (uint32_t *)cs->slowest;
}

// STATUS's member rows: a page asked for, or the picked ones (bounded
// either way: ZPS_STATUS_PAGE_MAX, ZPS_STATUS_PICKED_MAX). Returns the
// rows (caller frees; NULL with none or on failure).
static Zps__Member *s_status_members(const zps_coord *c, const zps_census *cs,
                                     const Zps__StatusPage *page, Zps__Status *st)
{
    uint32_t first = 0, count = cs->n_picked;
    if (page) {
        zps_census_page(cs, page->offset, page->limit, &first, &count);
        st->paged = true;
        st->page_offset = first;
    } else {
        st->flagged_omitted = cs->flagged_omitted;
    }
    Zps__Member *rows = count ? calloc(count, sizeof *rows + sizeof(Zps__Member *)) : NULL;
    if (!rows) {
        return NULL;
    }
    Zps__Member **ptrs = (Zps__Member **)(rows + count);
    for (uint32_t i = 0; i < count; i++) {
        s_status_member(c, cs, page ? first + i : cs->picked[i], &rows[i]);
        ptrs[i] = &rows[i];
    }
    st->n_members = count;
    st->members = ptrs;
    return rows;
}

// The gradient norm, the steps done on every shard, and this start's
// figures (a resumed job's are its own, not the job's).
static void s_status_progress(const zps_coord *c, uint64_t step, Zps__Status *st)
{
    st->clip_grad_norm = c->cfg.clip_grad_norm;
    st->micro_batch = c->cfg.micro_batch;
    st->has_grad_norm = c->has_grad_norm;
    st->grad_norm = c->grad_norm;
    st->grad_norm_step = c->grad_norm_step;
    zps_coord_run run;
    zps_coord_run_figures(c, &run);
    st->starts = run.starts;
    st->start_step = run.from_step;
    st->job_started_unix_ms = run.job_started_unix_ms;
    st->steps_done_all = run.training ? zps_coord_global_done(c) : step;
}

// The job's fields of STATUS.
static void s_status_job(const zps_coord *c, uint64_t step, uint64_t bad_messages,
                         Zps__Status *st)
{
    st->state = (char *)s_state_name(c->state);
    st->model = (char *)c->cfg.model;
    st->dataset = (char *)c->cfg.dataset;
    st->step = step;
    st->total_steps = c->cfg.total_steps;
    st->epoch = zps_coord_epoch(c, step);
    st->global_batch = c->cfg.global_batch;
    st->workers_expected = c->cfg.workers;
    st->last_loss = c->last_loss;
    st->last_step_ms = c->last_step_ms;
    st->bad_messages = bad_messages;
    st->test_accuracy = zps_eval_accuracy(c->eval);
    st->n_params = c->cfg.n_params;
    st->evictions = c->evictions;
    st->step_ms_median = zps_monitor_step_quantile(c->mon, 0.5);
    st->step_ms_p95 = zps_monitor_step_quantile(c->mon, 0.95);
    st->generation = c->gen;
    st->replans = c->replans;
    s_status_progress(c, step, st);
}

// A STATUS with a member id: where the asker stands.
// Found at its rank (every waiting member may ask each second: no scan),
// else by a scan for an id the rank does not go with.
static void s_status_asker(zps_coord *c, uint32_t rank, uint64_t member_id, Zps__Status *st)
{
    const zps_coord_member *asker = zps_coord_member_at(c, rank, member_id);
    if (!asker && member_id) {
        asker = zps_coord_member_by_id(c, member_id);
    }
    if (asker) {
        static const Zps__MemberState states[] = {
            [ZPS_MEMBER_JOINING] = ZPS__MEMBER_STATE__MEMBER_JOINING,
            [ZPS_MEMBER_ACTIVE] = ZPS__MEMBER_STATE__MEMBER_ACTIVE,
            [ZPS_MEMBER_LEAVING] = ZPS__MEMBER_STATE__MEMBER_GONE,
            [ZPS_MEMBER_GONE] = ZPS__MEMBER_STATE__MEMBER_GONE};
        st->asker = states[asker->life.state];
        st->asker_from = asker->life.from;
        st->asker_covered = asker->covered;
    }
}

// The reply is bounded at any number of members (zps_census.h): the
// summary, and the picked rows or the page asked for. A worker's STATUS
// (its member id, no page: where it stands, libzps's zps_ask.c) gets the
// job's fields and its own and no census: a stalled job's every worker
// asks once a second, and N censuses a second would be O(N^2).
void zps_coord_on_status(zps_coord *c, zps_outbox *out, zps_wire_msg *m, uint64_t step,
                         uint64_t bad_messages)
{
    Zps__Status st = ZPS__STATUS__INIT;
    s_status_job(c, step, bad_messages, &st);
    Zps__ShardInfo shards[ZPS_MAX_SHARDS];
    Zps__ShardInfo *shard_ptrs[ZPS_MAX_SHARDS];
    for (uint32_t i = 0; i < c->cfg.shards; i++) {
        zps__shard_info__init(&shards[i]);
        shards[i].index = i;
        shards[i].endpoint = c->shards[i].registered ? c->shards[i].endpoint : "";
        shards[i].lo = c->shards[i].lo;
        shards[i].hi = c->shards[i].hi;
        shard_ptrs[i] = &shards[i];
    }
    st.n_shards = c->cfg.shards;
    st.shards = shard_ptrs;
    s_status_asker(c, m->hdr->rank, m->hdr->member_id, &st);
    st.members_total = c->n_members;
    zps_census cs = {0};
    Zps__Member *rows = NULL;
    bool worker = m->hdr->member_id != 0 && !m->hdr->page;
    if (!worker && zps_census_take(c, &cs) == ZPS_OK) {
        s_status_census(&cs, &st);
        rows = s_status_members(c, &cs, m->hdr->page, &st);
    }
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__STATUS_REPLY);
    h.job_id = c->job_id;
    h.step = step;
    h.status = &st;
    (void)zps_outbox_add(out, &m->route, &h);
    free(rows);
    zps_census_fini(&cs);
}

// ---------------------------------------------------------------------------
// The documents of --http.

// A Prometheus label value: backslash, quote and newline escaped (hosts
// and devices come from the workers).
static void s_label(FILE *f, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\' || *v == '"') {
            fputc('\\', f);
            fputc(*v, f);
        } else if (*v == '\n') {
            fputs("\\n", f);
        } else {
            fputc(*v, f);
        }
    }
}

static void s_metric_head(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

// --clip-grad-norm's gauge: the newest step's norm (absent when clipping is off).
static void s_render_clip(const zps_coord *c, FILE *f)
{
    if (c->cfg.clip_grad_norm > 0) {
        s_metric_head(f, "zps_grad_norm", "gauge",
                      "Global gradient norm of the newest step, before clipping.");
        fprintf(f, "zps_grad_norm %.6g\n", c->has_grad_norm ? (double)c->grad_norm : 0.0);
    }
}

// The job's series: one line each.
static void s_render_job_metrics(const zps_coord *c, uint64_t step, uint64_t bad, FILE *f)
{
    s_metric_head(f, "zps_steps_completed_total", "counter", "Steps completed on shard 0.");
    fprintf(f, "zps_steps_completed_total %llu\n", (unsigned long long)step);
    s_metric_head(f, "zps_steps_planned", "gauge", "Steps of the run.");
    fprintf(f, "zps_steps_planned %llu\n", (unsigned long long)c->cfg.total_steps);
    s_metric_head(f, "zps_loss", "gauge", "Mean training loss of the last step.");
    fprintf(f, "zps_loss %.6f\n", c->last_loss);
    s_render_clip(c, f);
    s_metric_head(f, "zps_step_seconds_median", "gauge", "Median step time, last steps.");
    fprintf(f, "zps_step_seconds_median %.6f\n", zps_monitor_step_quantile(c->mon, 0.5) / 1e3);
    s_metric_head(f, "zps_step_seconds_p95", "gauge", "95th percentile step time, last steps.");
    fprintf(f, "zps_step_seconds_p95 %.6f\n", zps_monitor_step_quantile(c->mon, 0.95) / 1e3);
    s_metric_head(f, "zps_refused_messages_total", "counter", "Messages refused by shard 0.");
    fprintf(f, "zps_refused_messages_total %llu\n", (unsigned long long)bad);
    s_metric_head(f, "zps_evictions_total", "counter", "Workers evicted for silence.");
    fprintf(f, "zps_evictions_total %llu\n", (unsigned long long)c->evictions);
    s_metric_head(f, "zps_replans_total", "counter",
                  "Plan generations made after the first (one per step boundary at most).");
    fprintf(f, "zps_replans_total %llu\n", (unsigned long long)c->replans);
    s_metric_head(f, "zps_membership_changes_total", "counter",
                  "Joins, departures and adapted splits, gathered into those re-plans.");
    fprintf(f, "zps_membership_changes_total %llu\n", (unsigned long long)c->membership_changes);
    s_metric_head(f, "zps_test_accuracy", "gauge", "Last complete test-set evaluation.");
    fprintf(f, "zps_test_accuracy %.6f\n", zps_eval_accuracy(c->eval));
}

// The member counts: by state, stragglers, silent.
static void s_render_census_metrics(const zps_census *cs, FILE *f)
{
    s_metric_head(f, "zps_members", "gauge", "Members by state (joining, active, leaving, gone).");
    for (int s = ZPS_MEMBER_JOINING; s <= ZPS_MEMBER_GONE; s++) {
        fprintf(f, "zps_members{state=\"%s\"} %u\n", zps_member_state_name(s),
                cs->by_state[s]);
    }
    s_metric_head(f, "zps_stragglers", "gauge", "Live members flagged stragglers.");
    fprintf(f, "zps_stragglers %u\n", cs->stragglers);
    s_metric_head(f, "zps_silent_members", "gauge",
                  "Live members silent for half the worker timeout.");
    fprintf(f, "zps_silent_members %u\n", cs->silent);
}

// The per-worker series: one line a live member and a series, from the
// census (no lookup per line). A line is about 86 bytes with a host of 17
// characters: at 4096 members a scrape is about 1.8 MB (5 series), 2.8 MB
// with diloco's 3 more (docs/running.md; check_status.c measures it).
static void s_render_worker_metrics(const zps_coord *c, const zps_census *cs, FILE *f)
{
    static const char *names[8] = {"zps_worker_lag_seconds", "zps_worker_compute_seconds",
                                   "zps_worker_samples_per_second", "zps_worker_share",
                                   "zps_worker_straggler", "zps_worker_inner_steps",
                                   "zps_worker_delta_norm", "zps_worker_round_bytes"};
    static const char *help[8] = {"Lag behind the step's first arrival (shard 0's clock).",
                                  "Mean compute time of a step.", "Measured throughput.",
                                  "Samples of the global batch in the current plan.",
                                  "1 if flagged a straggler.",
                                  "Diloco: inner steps of its last complete round.",
                                  "Diloco: the norm of its last round's pseudo-gradient.",
                                  "Diloco: payload bytes it pushed in its last round."};
    int n_metrics = c->cfg.mode.diloco ? 8 : 5;
    for (int k = 0; k < n_metrics; k++) {
        s_metric_head(f, names[k], "gauge", help[k]);
        for (uint32_t i = 0; i < cs->n; i++) {
            const zps_coord_member *m = &c->members[i];
            const zps_census_row *row = &cs->rows[i];
            if (!row->live) {
                continue;
            }
            const zps_monitor_view *v = &row->v;
            double value[8] = {v->lag_ms / 1e3, v->compute_ms / 1e3, v->samples_per_s,
                               row->share, v->straggler, v->inner_steps,
                               v->delta_norm, (double)v->bytes};
            fprintf(f, "%s{rank=\"%u\",host=\"", names[k], m->rank);
            s_label(f, m->host);
            fputs("\",device=\"", f);
            s_label(f, m->device);
            fprintf(f, "\"} %.6f\n", value[k]);
        }
    }
}

// This start's figures (a resumed job's are its own, not the job's).
static json_t *s_render_start(const zps_coord *c)
{
    zps_coord_run r;
    zps_coord_run_figures(c, &r);
    return json_pack("{s:i, s:I, s:I, s:I, s:f, s:f, s:I}", "number", (int)r.starts,
                     "from_step", (json_int_t)r.from_step, "to_step", (json_int_t)r.to_step,
                     "steps", (json_int_t)r.steps, "seconds", r.secs, "ms_per_step",
                     r.ms_per_step, "job_started_unix_ms",
                     (json_int_t)r.job_started_unix_ms);
}

// A member's row of /status.
static json_t *s_render_row(const zps_coord *c, const zps_census *cs, uint32_t rank)
{
    const zps_coord_member *m = &c->members[rank];
    const zps_census_row *row = &cs->rows[rank];
    const zps_monitor_view *v = &row->v;
    return json_pack(
        "{s:i, s:s, s:s, s:i, s:b, s:b, s:b, s:i, s:f, s:f, s:f, s:I, s:i, s:f, s:I}", "rank",
        (int)m->rank, "host", m->host, "device", m->device, "pid", (int)m->pid, "live",
        row->live, "straggler", v->straggler, "silent", row->silent, "share", (int)row->share,
        "lag_ms", (double)v->lag_ms, "compute_ms", (double)v->compute_ms, "samples_per_s",
        v->samples_per_s, "pushes", (json_int_t)m->pushes, "inner_steps", (int)v->inner_steps,
        "delta_norm", (double)v->delta_norm, "round_bytes", (json_int_t)v->bytes);
}

// The member summary of /status: counts, the slowest, what was left out.
static void s_render_census(const zps_census *cs, json_t *st)
{
    json_t *slowest = json_array();
    for (uint32_t k = 0; k < cs->n_slowest; k++) {
        json_array_append_new(slowest, json_integer(cs->slowest[k]));
    }
    json_object_set_new(st, "members_total", json_integer(cs->n));
    json_object_set_new(st, "members_by_state",
                        json_pack("{s:i, s:i, s:i, s:i}", "joining",
                                  (int)cs->by_state[ZPS_MEMBER_JOINING], "active",
                                  (int)cs->by_state[ZPS_MEMBER_ACTIVE], "leaving",
                                  (int)cs->by_state[ZPS_MEMBER_LEAVING], "gone",
                                  (int)cs->by_state[ZPS_MEMBER_GONE]));
    json_object_set_new(st, "stragglers", json_integer(cs->stragglers));
    json_object_set_new(st, "silent", json_integer(cs->silent));
    json_object_set_new(st, "slowest", slowest);
    json_object_set_new(st, "flagged_omitted", json_integer(cs->flagged_omitted));
}

static json_t *s_render_status(const zps_coord *c, const zps_census *cs, json_t *rows,
                               uint64_t step, uint64_t bad)
{
    json_t *members = json_array();
    for (uint32_t i = 0; i < cs->n_picked; i++) {
        json_array_append(members, json_array_get(rows, cs->picked[i]));
    }
    char job[24];
    snprintf(job, sizeof job, "%016llx", (unsigned long long)c->job_id);
    json_t *st = json_pack(
        "{s:s, s:s, s:s, s:s, s:I, s:I, s:i, s:i, s:f, s:f, s:f, s:f, s:I, s:I, s:o, s:o}",
        "state", s_state_name(c->state), "model", c->cfg.model, "dataset", c->cfg.dataset,
        "job_id", job, "step", (json_int_t)step, "total_steps", (json_int_t)c->cfg.total_steps,
        "global_batch", (int)c->cfg.global_batch, "plan_generation", (int)c->gen, "loss",
        (double)c->last_loss, "step_ms_median", zps_monitor_step_quantile(c->mon, 0.5),
        "step_ms_p95", zps_monitor_step_quantile(c->mon, 0.95), "test_accuracy",
        zps_eval_accuracy(c->eval), "refused_messages", (json_int_t)bad, "evictions",
        (json_int_t)c->evictions, "members", members, "start", s_render_start(c));
    if (st) {
        s_render_census(cs, st);
    }
    if (st && c->cfg.clip_grad_norm > 0) {
        // --clip-grad-norm: the newest step's norm before clipping (null before the first).
        json_object_set_new(st, "clip_grad_norm", json_real(c->cfg.clip_grad_norm));
        json_object_set_new(st, "grad_norm",
                            c->has_grad_norm ? json_real(c->grad_norm) : json_null());
        json_object_set_new(st, "grad_norm_step", json_integer((json_int_t)c->grad_norm_step));
    }
    if (st && c->cfg.micro_batch > 0) {
        // --deterministic only: the document of other jobs stays as it was.
        json_object_set_new(st, "mode", json_string("deterministic"));
        json_object_set_new(st, "micro_batch", json_integer(c->cfg.micro_batch));
    }
    return st;
}

static zps_err s_render_metrics(const zps_coord *c, const zps_census *cs, uint64_t step,
                                uint64_t bad, char **metrics)
{
    size_t len;
    *metrics = NULL;
    FILE *f = open_memstream(metrics, &len);
    if (!f) {
        return ZPS_ENOMEM;
    }
    s_render_job_metrics(c, step, bad, f);
    s_render_census_metrics(cs, f);
    s_render_worker_metrics(c, cs, f);
    if (fclose(f) != 0) {
        free(*metrics);
        *metrics = NULL;
        return ZPS_ENOMEM;
    }
    return ZPS_OK;
}

void zps_coord_docs_fini(zps_coord_docs *d)
{
    free(d->metrics);
    json_decref(d->status);
    json_decref(d->rows);
    *d = (zps_coord_docs){0};
}

zps_err zps_coord_render_docs(const zps_coord *c, uint64_t step, uint64_t bad_messages,
                              zps_coord_docs *out)
{
    *out = (zps_coord_docs){0};
    zps_census cs;
    if (zps_census_take(c, &cs) != ZPS_OK) {
        return ZPS_ENOMEM;
    }
    zps_err err = s_render_metrics(c, &cs, step, bad_messages, &out->metrics);
    out->rows = err == ZPS_OK ? json_array() : NULL;
    for (uint32_t i = 0; out->rows && i < cs.n; i++) {
        if (json_array_append_new(out->rows, s_render_row(c, &cs, i)) != 0) {
            err = ZPS_ENOMEM;
            break;
        }
    }
    out->status = out->rows && err == ZPS_OK
                      ? s_render_status(c, &cs, out->rows, step, bad_messages)
                      : NULL;
    zps_census_fini(&cs);
    if (!out->status) {
        zps_coord_docs_fini(out);
        return ZPS_ENOMEM;
    }
    return ZPS_OK;
}

zps_err zps_coord_render(const zps_coord *c, uint64_t step, uint64_t bad_messages,
                         char **metrics, char **status_json)
{
    zps_coord_docs d;
    *metrics = NULL;
    *status_json = NULL;
    if (zps_coord_render_docs(c, step, bad_messages, &d) != ZPS_OK) {
        return ZPS_ENOMEM;
    }
    *status_json = json_dumps(d.status, JSON_COMPACT);
    if (!*status_json) {
        zps_coord_docs_fini(&d);
        return ZPS_ENOMEM;
    }
    *metrics = d.metrics;
    d.metrics = NULL;
    zps_coord_docs_fini(&d);
    return ZPS_OK;
}

// The metrics log's line of a step: its loss, the samples shard 0 counted
// by who sent them (bucket 0, whose counted slices tile the batch: each
// sample of the step once), the plan, and each worker's timings (the
// monitor's, which closes the step's records as it writes them).
void zps_coord_log_step(zps_coord *c, uint64_t step, float loss, double step_ms,
                        const uint32_t *counted)
{
    FILE *f = c->cfg.metrics;
    if (f) {
        uint64_t samples = 0;
        for (uint32_t r = 0; r < c->n_members; r++) {
            samples += counted[r];
        }
        const zps_plan_gen *g = zps_plans_at(&c->plans, step);
        fputc('{', f);
        zps_mlog_uint(f, true, ZPS_MLOG_STEP, step);
        zps_mlog_uint(f, false, ZPS_MLOG_EPOCH, zps_coord_epoch(c, step));
        zps_mlog_real(f, false, ZPS_MLOG_LOSS, loss, 6);
        zps_mlog_uint(f, false, ZPS_MLOG_SAMPLES, samples);
        zps_mlog_real(f, false, ZPS_MLOG_STEP_MS, step_ms, 3);
        zps_mlog_uint(f, false, ZPS_MLOG_PLAN, g ? g->gen : 0);
        zps_mlog_uint(f, false, ZPS_MLOG_REPLANS, c->replans);
        if (c->has_grad_norm && c->grad_norm_step == step) {
            zps_mlog_real(f, false, ZPS_MLOG_GRAD_NORM, c->grad_norm, 6);
        }
        zps_mlog_key_only(f, false, ZPS_MLOG_COUNTED);
        fputc('[', f);
        bool first = true;
        for (uint32_t r = 0; r < c->n_members; r++) {
            if (counted[r]) {
                fprintf(f, "%s[%u,%u]", first ? "" : ",", r, counted[r]);
                first = false;
            }
        }
        fputc(']', f);
        zps_mlog_key_only(f, false, ZPS_MLOG_WORKERS);
        fputc('[', f);
    }
    zps_monitor_step_done(c->mon, step, step_ms, f);
    if (f) {
        fprintf(f, "]}\n");
    }
}
