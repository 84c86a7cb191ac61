/* zps_coord_state.c - the job state saved beside the checkpoints. */
#include "zps_coord_int.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/zps_ckpt.h"
#include "server/zps_token.h"

// ---------------------------------------------------------------------------
// Job state beside the checkpoints.

// A member's record is at most about 200 bytes (its host and device names
// bounded): room for ZPS_MAX_MEMBERS of them and then some.
#define ZPS_COORD_STATE_MAX (4u << 20)
#define ZPS_COORD_RESUME_GEN_GAP 1000u

static void s_state_name_for(char *buf, size_t len, uint64_t step)
{
    snprintf(buf, len, "coord-step-%llu.state", (unsigned long long)step);
}

// The job state at `step`, packed into *buf (the caller frees it).
static zps_err s_pack(const zps_coord *c, uint64_t step, uint8_t **buf, size_t *len)
{
    // On the heap: thousands of members would make a large stack frame.
    size_t n = c->n_members ? c->n_members : 1;
    Zps__Member *members = calloc(n, sizeof *members);
    Zps__Member **ptrs = calloc(n, sizeof(Zps__Member *));
    for (uint32_t i = 0; members && ptrs && i < c->n_members; i++) {
        const zps_coord_member *s = &c->members[i];
        zps_coord_member_to_wire(s, &members[i]);
        members[i].member_id = s->member_id;
        members[i].boot_id = (char *)s->boot_id;
        ptrs[i] = &members[i];
    }
    Zps__JobState st = ZPS__JOB_STATE__INIT;
    st.job_id = c->job_id;
    st.generation = c->gen;
    st.step = step;
    st.n_members = c->n_members;
    st.members = ptrs;
    st.first_started_unix_ms = c->job_started_unix_ms;
    st.starts = c->starts;
    *len = members && ptrs ? zps__job_state__get_packed_size(&st) : 0;
    *buf = members && ptrs ? malloc(*len ? *len : 1) : NULL;
    if (*buf) {
        zps__job_state__pack(&st, *buf);
    }
    free(members);
    free(ptrs);
    return *buf ? ZPS_OK : ZPS_ENOMEM;
}

zps_err zps_coord_save(const zps_coord *c, const char *dir, uint64_t step)
{
    uint8_t *buf;
    size_t len;
    if (s_pack(c, step, &buf, &len) != ZPS_OK) {
        return ZPS_ENOMEM;
    }
    char name[64];
    s_state_name_for(name, sizeof name, step);
    // The members' ids are credentials: the job state is the owner's only,
    // and so are the shards' tokens, which a restarted coordinator needs to
    // know its shards again (they never change, so one file serves every step).
    zps_err err = zps_ckpt_write_secret(dir, name, buf, len);
    free(buf);
    if (err == ZPS_OK && c->cfg.shards > 1) {
        uint64_t tokens[ZPS_MAX_SHARDS];
        for (uint32_t i = 0; i < c->cfg.shards; i++) {
            tokens[i] = c->shards[i].token;
        }
        err = zps_token_save_table(dir, tokens, c->cfg.shards);
    }
    if (err == ZPS_OK && step > 3 * c->cfg.checkpoint_every && c->cfg.checkpoint_every) {
        char old[600];
        s_state_name_for(name, sizeof name, step - 3 * c->cfg.checkpoint_every);
        snprintf(old, sizeof old, "%s/%s", dir, name);
        unlink(old); // as the shard keeps its newest three checkpoints
    }
    return err;
}

// The job state saved at `step` in dir, unpacked (the caller frees it).
static zps_err s_load(const char *dir, uint64_t step, Zps__JobState **out)
{
    char name[64];
    s_state_name_for(name, sizeof name, step);
    uint8_t *buf = malloc(ZPS_COORD_STATE_MAX);
    size_t len = 0;
    zps_err err = buf ? zps_ckpt_read_record(dir, name, buf, ZPS_COORD_STATE_MAX, &len)
                      : ZPS_ENOMEM;
    Zps__JobState *st = err == ZPS_OK ? zps__job_state__unpack(NULL, len, buf) : NULL;
    free(buf);
    if (!st || st->step != step || st->n_members > ZPS_MAX_MEMBERS) {
        if (err == ZPS_OK) {
            zps_log_error("ckpt %s/%s: not a job state of step %llu", dir, name,
                          (unsigned long long)step);
        }
        if (st) {
            zps__job_state__free_unpacked(st, NULL);
        }
        return err == ZPS_OK ? ZPS_EPROTO : err;
    }
    *out = st;
    return ZPS_OK;
}

// Member i as saved: live ones (all, with `all_live`) active from `step`,
// their routes unknown until they call back.
static void s_restore_member(zps_coord *c, uint32_t i, const Zps__Member *m, uint64_t step,
                             bool all_live)
{
    zps_coord_member *mem = &c->members[i];
    memset(mem, 0, sizeof *mem);
    mem->rank = i;
    mem->member_id = m->member_id;
    snprintf(mem->host, sizeof mem->host, "%s", m->host);
    snprintf(mem->device, sizeof mem->device, "%s", m->device);
    // --resume takes M from the command line: a share saved by a job of
    // another M (or none) is rounded to this one's micro-batches.
    mem->share = zps_plan_round_share(m->share, c->cfg.micro_batch);
    if (mem->share != m->share) {
        zps_log_info("rank %u: share %u rounded to %u: whole micro-batches of %u", i, m->share,
                     mem->share, c->cfg.micro_batch);
    }
    mem->pid = m->pid;
    zps_coord_take_boot_id(c, mem->boot_id, m->boot_id, "a saved job state");
    if (m->live || all_live) {
        zps_member_admit_active(&mem->life, step);
    } else {
        mem->life = (zps_member_life){.state = ZPS_MEMBER_GONE, .exit = ZPS_EXIT_EVICTED};
    }
    mem->has_job = true;
    mem->last_seen_ms = zps_coord_now(c);
    ZPS_ASSERT(zmq_msg_init(&mem->route) == 0); // unknown until its heartbeat
}

// The members as saved. A requeue stops every process at once: the
// workers' BYEs may reach shard 0 before its own SIGTERM, and the state it
// saves then has no live member, of whom no plan is made. Its members are
// taken as live instead: they plan the step until workers come, and those
// of before that do not call back are evicted, as in any resume.
static void s_restore_members(zps_coord *c, const Zps__JobState *st, uint64_t step)
{
    c->n_members = (uint32_t)st->n_members;
    bool none_live = true;
    for (uint32_t i = 0; i < c->n_members; i++) {
        none_live = none_live && !st->members[i]->live;
    }
    if (none_live && c->n_members > 0) {
        zps_log_info("the job state of step %llu has no live member (they left as the job "
                     "stopped): its %u members are planned until workers come",
                     (unsigned long long)step, c->n_members);
    }
    for (uint32_t i = 0; i < c->n_members; i++) {
        s_restore_member(c, i, st->members[i], step, none_live);
    }
}

zps_err zps_coord_resume(zps_coord *c, const char *dir, uint64_t step)
{
    Zps__JobState *st = NULL;
    zps_err err = s_load(dir, step, &st);
    if (err != ZPS_OK) {
        return err;
    }
    c->job_id = st->job_id;
    // This start's figures are its own (zps_coord_try_recover starts its
    // clock); what the job did before comes from the record: 0 in one
    // saved by an older zps, and then unknown.
    c->job_started_unix_ms = st->first_started_unix_ms;
    c->starts = st->starts ? st->starts + 1 : 0;
    // Plans made after this checkpoint and before the crash may still be
    // known to shards and workers under the next numbers: the plans of the
    // resumed run start well above them, so they supersede, never collide.
    c->gen = st->generation + ZPS_COORD_RESUME_GEN_GAP;
    s_restore_members(c, st, step);
    zps__job_state__free_unpacked(st, NULL);
    uint64_t tokens[ZPS_MAX_SHARDS] = {0};
    if (c->cfg.shards > 1 && zps_token_load_table(dir, tokens, c->cfg.shards) != ZPS_OK) {
        // Without them no shard can prove itself, and recovery waits.
        zps_log_error("%s/shard-tokens: missing or damaged: shards 1..%u cannot show they are "
                      "this job's, and the recovery waits for them", dir, c->cfg.shards - 1);
    }
    for (uint32_t i = 1; i < c->cfg.shards; i++) {
        c->shards[i].token = tokens[i];
    }
    zps_plan plan = {0};
    zps_err perr = zps_coord_make_plan(c, &plan);
    zps_plans_fini(&c->plans);
    if (perr == ZPS_OK) {
        perr = zps_plans_add(&c->plans, c->gen, step, &plan);
    }
    zps_plan_fini(&plan);
    for (uint32_t i = 0; i < c->cfg.shards; i++) {
        c->shard_done[i] = step;
        c->shards[i].registered = c->shards[i].ready = i == 0;
    }
    c->steps_done = step;
    c->started_step = step;
    c->released = step;
    c->state = ZPS_COORD_RECOVERING;
    c->recover_deadline_ms = zps_coord_now(c) + c->cfg.worker_timeout_ms;
    zps_log_info("job %016llx resumed at step %llu: %u members, plan %u; waiting for them",
                 (unsigned long long)c->job_id, (unsigned long long)step, c->n_members, c->gen);
    return perr;
}
