/* zps_job.c - the job a JOB message names, and the plans that split its
 * steps: what the worker keeps of them (the model, the data's seed and
 * batch, its rank and shards, the schedule of pieces), checked against a
 * declared model and against the job of before when joining again. */
#include "lib/zps_client_int.h"

#include <stdio.h>
#include <string.h>

#include "common/zps_layout.h"
#include "common/zps_log.h"
#include "common/zps_wire.h"

// A plan (and extras) from JOB or PLAN: into the schedule.
zps_err zps_job_take_plan(zps_client *c, Zps__Slice *const *slices, size_t n_slices,
                          uint32_t gen, uint64_t effective, Zps__Extra *const *extras,
                          size_t n_extras, const Zps__HostGroup *host)
{
    zps_plan plan = {0};
    if (zps_plan_part_from_wire(slices, n_slices, c->global_batch, &plan) != ZPS_OK) {
        zps_log_error("the coordinator sent an inconsistent plan (generation %u)", gen);
        return ZPS_EPROTO;
    }
    zps_schedule_add_plan(&c->schedule, gen, effective, &plan);
    zps_plan_fini(&plan);
    (void)zps_host_take_group(c, gen, host);
    for (size_t i = 0; i < n_extras; i++) {
        const Zps__Extra *e = extras[i];
        if (e->rank == c->conn.rank && e->count > 0 && e->count <= c->global_batch &&
            e->offset <= c->global_batch - e->count) {
            zps_schedule_add_extra(&c->schedule, e->step,
                                   (zps_piece){.offset = e->offset, .count = e->count,
                                               .gen = e->generation});
            zps_log_info("handed slice [%u, %u) of step %llu", e->offset, e->offset + e->count,
                         (unsigned long long)e->step);
        }
    }
    return ZPS_OK;
}

// The shards of JOB and how pushes go to them: deterministic, through a
// host's leader, diloco.
static zps_err s_take_shards_and_mode(zps_client *c, const Zps__Job *job)
{
    zps_micro_set_job(&c->micro, job->micro_batch, c->global_batch, c->model.n_params);
    zps_err err = zps_conn_take_shards(&c->conn, job, &c->model);
    if (err == ZPS_OK) {
        zps_host_take_shards(c, job);
        err = zps_diloco_take_mode(c, job);
    }
    return err;
}

zps_err zps_job_take(zps_client *c, const Zps__Header *h)
{
    const Zps__Job *job = h->job;
    zps_model_spec model;
    char why[256] = "";
    if (job && job->layout && zps_layout_check(job->layout, why, sizeof why) == ZPS_OK) {
        zps_layout_model(job->layout, &model); // declared by the workers
    }
    if (!job || why[0] || (!job->layout && zps_model_parse(job->model, &model) != ZPS_OK) ||
        !zps_dtype_valid((int)job->wire_dtype) || job->steps_per_epoch == 0 ||
        job->wire_code > ZPS_ZCODE_PLANES ||
        job->global_batch == 0) {
        zps_log_error("the coordinator sent a job without a usable model or wire dtype");
        return ZPS_EPROTO;
    }
    // A declaration joins a built-in job only as that MLP's flat layout.
    if (zps_decl_any(&c->decl) && !job->layout &&
        (model.kind != ZPS_MODEL_MLP ||
         zps_layout_differs_mlp(&model, &c->decl.layout, why, sizeof why))) {
        zps_log_error("the job's model %s is not the one declared%s%s", job->model,
                      why[0] ? ": " : "", why);
        return ZPS_EPROTO;
    }
    if (c->joined && (h->job_id != c->conn.job_id || (zps_dtype)job->wire_dtype != c->dtype ||
                      job->seed != c->seed || job->global_batch != c->global_batch)) {
        // Joining again: the model, data and buffers of before must fit.
        zps_log_error("joining again, the coordinator gave another job (%016llx)",
                      (unsigned long long)h->job_id);
        return ZPS_EPROTO;
    }
    c->model = model;
    c->dtype = (zps_dtype)job->wire_dtype;
    c->host.codes = job->wire_code != ZPS_ZCODE_NONE && c->dtype == ZPS_DTYPE_F32;
    c->conn.job_id = h->job_id;
    c->conn.rank = job->rank;
    c->conn.member_id = job->member_id;
    c->seed = job->seed;
    c->global_batch = job->global_batch;
    c->total_steps = job->total_steps;
    c->steps_per_epoch = job->steps_per_epoch;
    c->start_step = job->start_step;
    c->conn.worker_timeout_ms = job->worker_timeout_ms;
    c->send_init = job->send_init && job->layout;
    snprintf(c->model_name, sizeof c->model_name, "%s", job->model ? job->model : "");
    snprintf(c->dataset_name, sizeof c->dataset_name, "%s", job->dataset ? job->dataset : "");
    zps_schedule_init(&c->schedule, c->conn.rank); // joined again: a new schedule
    zps_err err = zps_job_take_plan(c, job->plan, job->n_plan, job->generation, job->plan_effective,
                                    job->extras, job->n_extras, job->host);
    if (err != ZPS_OK) {
        return err;
    }
    char name[32];
    snprintf(name, sizeof name, "worker[%u]", c->conn.rank);
    zps_log_set_name(name);
    zps_log_set_thread_name(name); // another client of the process may rename it
    zps_log_info("job %016llx: rank %u from step %llu, global batch %u, model %s, dataset %s",
                 (unsigned long long)c->conn.job_id, c->conn.rank, (unsigned long long)c->start_step,
                 c->global_batch, job->model, job->dataset);
    err = s_take_shards_and_mode(c, job);
    c->joined = c->joined || err == ZPS_OK;
    return err;
}
