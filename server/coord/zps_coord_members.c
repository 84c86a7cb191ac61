/* zps_coord_members.c - admission, heartbeats, departures and eviction. */
#include "zps_coord_int.h"

#include <string.h>

#include "common/zps_groups.h"
#include "common/zps_layout.h"
#include "server/zps_token.h"

// A member left or fell silent: its pieces of the steps in progress go to
// others at once, and the plan without it comes at the next boundary.
static void s_depart(zps_coord *c, zps_outbox *out, zps_coord_member *mem, zps_member_exit why)
{
    if (zps_member_depart(&mem->life, why) != ZPS_OK) {
        return;
    }
    if (c->state == ZPS_COORD_TRAINING && why != ZPS_EXIT_FINISHED) {
        if (c->cfg.mode.diloco) {
            // Its inner steps are lost with it: its slice is handed on to
            // be pushed with no weight (lib/zps_client.c), unless its
            // pseudo-gradient is in already.
            zps_log_warn("round %llu: rank %u (%s) left during its inner steps; unless its "
                         "pseudo-gradient had arrived, it is missing from the round, which "
                         "averages the others", (unsigned long long)zps_coord_global_done(c),
                         mem->rank, mem->host);
        }
        zps_coord_note_change(c);
        zps_coord_reassign(c, out);
        if (zps_coord_live_members(c) == 0) {
            zps_log_warn("step %llu cannot complete: no live worker; waiting for workers to join",
                         (unsigned long long)zps_coord_global_done(c));
        }
    }
}

void zps_coord_evict(zps_coord *c, zps_outbox *out, zps_coord_member *mem, double now_ms)
{
    c->evictions++;
    zps_log_warn("evicted rank %u (%s, pid %u, %s): silent for %.1f s [%llu evictions]",
                 mem->rank, mem->host, mem->pid, mem->device, (now_ms - mem->last_seen_ms) / 1e3,
                 (unsigned long long)c->evictions);
    s_depart(c, out, mem, ZPS_EXIT_EVICTED);
}

zps_coord_member *zps_coord_member_by_id(zps_coord *c, uint64_t member_id)
{
    for (uint32_t i = 0; i < c->n_members; i++) {
        if (c->members[i].member_id == member_id) {
            return &c->members[i];
        }
    }
    return NULL;
}

zps_coord_member *zps_coord_member_at(zps_coord *c, uint32_t rank, uint64_t member_id)
{
    return zps_coord_member_ok(c, rank, member_id) ? &c->members[rank] : NULL;
}

bool zps_coord_heard(zps_coord *c, uint32_t rank, uint64_t member_id)
{
    zps_coord_member *mem = zps_coord_member_at(c, rank, member_id);
    if (!mem || !zps_member_live(&mem->life)) {
        return false;
    }
    mem->last_seen_ms = zps_coord_now(c);
    return true;
}

// Heartbeats from a worker's main socket (flag 1) also say where its
// replies go: after a coordinator restart that is how routes come back.
// A member beats when nothing else was heard from it for an interval
// (zps_coord_heard): found by its rank, not by a scan.
zps_err zps_coord_on_heartbeat(zps_coord *c, zps_outbox *out, zps_wire_msg *m)
{
    if (!zps_coord_heard(c, m->hdr->rank, m->hdr->member_id)) {
        return ZPS_ENOENT;
    }
    zps_coord_member *mem = &c->members[m->hdr->rank];
    if ((m->hdr->flags & 1u) && !mem->route_known) {
        zps_wire_route_close(&mem->route);
        zps_wire_route_copy(&mem->route, &m->route);
        mem->route_known = true;
        zps_log_info("rank %u (%s) is back", mem->rank, mem->host);
        zps_coord_try_recover(c, out, false);
    }
    return ZPS_OK;
}

static bool s_same_route(zmq_msg_t *a, zmq_msg_t *b)
{
    return zmq_msg_size(a) == zmq_msg_size(b) &&
           memcmp(zmq_msg_data(a), zmq_msg_data(b), zmq_msg_size(a)) == 0;
}

// A torch worker in a job of the built-in MLP: its optimizer is the
// server's flags (a diloco worker's groups are its own inner optimizer's,
// which the shards do not run); buffers and a table are not the flags'.
static bool s_builtin_optim_differs(const zps_coord *c, const Zps__Hello *hello, char *why,
                                    size_t len)
{
    bool buffers = false;
    for (size_t i = 0; i < hello->layout->n_tensors; i++) {
        buffers = buffers || hello->layout->tensors[i]->role != ZPS_ROLE_PARAM;
    }
    if (buffers || hello->declares_schedule) {
        snprintf(why, len, "this job trains %s with the server's optimizer flags: declare no "
                           "buffers or learning-rate table", c->cfg.model);
        return true;
    }
    return !c->cfg.mode.diloco && zps_groups_differ_flags(hello->layout, &c->cfg.optim, why, len);
}

// Whether what a HELLO declares (a model, its dataset's sizes) is not the
// job's; why says how, naming the first tensor that differs.
static bool s_declared_differs(const zps_coord *c, const Zps__Hello *hello, char *why,
                               size_t len)
{
    if (!c->cfg.layout) {
        if (!hello->layout) {
            return false;
        }
        if (!c->cfg.spec || c->cfg.spec->kind != ZPS_MODEL_MLP) {
            snprintf(why, len, "this job trains %s: it takes no model declared by a worker",
                     c->cfg.model);
            return true;
        }
        // A worker of its own code (libzps) with the built-in MLP's layout.
        if (zps_layout_differs_mlp(c->cfg.spec, hello->layout, why, len)) {
            return true;
        }
        return s_builtin_optim_differs(c, hello, why, len);
    }
    if (!hello->layout) {
        snprintf(why, len, "this job's model is declared by its workers (--model external): "
                           "this worker declared none");
        return true;
    }
    if (c->cfg.layout && zps_layout_digest(hello->layout) != zps_layout_digest(c->cfg.layout) &&
        zps_layout_differs(c->cfg.layout, hello->layout, why, len)) {
        return true;
    }
    // Diloco: the groups are each worker's own inner optimizer's.
    if (c->cfg.layout && !c->cfg.mode.diloco &&
        zps_groups_differ(c->cfg.layout, hello->layout, why, len)) {
        return true; // the same tensors, another optimizer
    }
    float clip = hello->layout ? hello->layout->clip_grad_norm : 0.0f;
    if (clip != 0.0f && clip != c->cfg.clip_grad_norm) {
        // 0: declared none (the server's flag, or none, holds).
        snprintf(why, len, "declared clip_grad_norm %g; the job's is %g (0: none)", (double)clip,
                 (double)c->cfg.clip_grad_norm);
        return true;
    }
    if (hello->n_train != c->cfg.n_train || hello->n_test != c->cfg.n_test) {
        snprintf(why, len, "declared a dataset of %u train and %u test records; the job's has "
                           "%u and %u", hello->n_train, hello->n_test, c->cfg.n_train,
                 c->cfg.n_test);
        return true;
    }
    return false;
}

// Whether a new member's share fits beside the fixed shares of the
// members planned: within the global batch, leaving a sample (with
// --micro-batch a micro-batch) for each member that splits the rest, and
// adding up to it once the last member of the start is in. why says how
// it does not. A share here is already whole micro-batches.
static bool s_share_fits(const zps_coord *c, uint32_t share, bool joining, char *why, size_t len)
{
    uint32_t unit = c->cfg.micro_batch ? c->cfg.micro_batch : 1;
    uint64_t fixed = share / unit, total = c->cfg.global_batch / unit;
    uint32_t n_flex = share == 0;
    for (uint32_t i = 0; i < c->n_members; i++) {
        // Resumed: a member of before that has not called back is evicted
        // once the ones here make --workers, so it holds no share.
        bool planned = zps_member_planned(&c->members[i].life) &&
                       (c->state != ZPS_COORD_RECOVERING || c->members[i].route_known);
        fixed += planned ? c->members[i].share / unit : 0;
        n_flex += planned && c->members[i].share == 0;
    }
    bool last = !joining && c->n_members + 1 == c->cfg.workers;
    if (fixed > total || (last && n_flex == 0 && fixed != total) ||
        (n_flex > 0 && total - fixed < n_flex)) {
        snprintf(why, len, "share %u does not fit: fixed shares would be %llu of global batch %u",
                 share, (unsigned long long)fixed * unit, c->cfg.global_batch);
        return false;
    }
    return true;
}

// --deterministic: whether the job can take one more member: each needs a
// micro-batch, and every one computes with the kernels of the job's first
// member's device class (a CPU's and a GPU's sums differ in their bits).
static bool s_deterministic_refuses(const zps_coord *c, const Zps__Hello *hello, char *why,
                                    size_t len)
{
    uint32_t m = c->cfg.micro_batch;
    if (m == 0) {
        return false;
    }
    if (zps_coord_live_members(c) + 1 > c->cfg.global_batch / m) {
        snprintf(why, len, "the job's %u micro-batches of %u have a member each: no room for "
                           "another (--deterministic)", c->cfg.global_batch / m, m);
        return true;
    }
    const char *first = c->n_members ? c->members[0].device : NULL;
    const char *dev = hello->device ? hello->device : "";
    if (first && zps_coord_device_gpu(first) != zps_coord_device_gpu(dev)) {
        snprintf(why, len, "device %s is not of the job's class (%s, rank 0's): their kernels "
                           "differ, and --deterministic promises the same bits", dev[0] ? dev : "?",
                 zps_coord_device_gpu(first) ? "GPU" : "CPU");
        return true;
    }
    return false;
}

bool zps_coord_device_gpu(const char *device)
{
    return strstr(device, "cuda") || strstr(device, "gpu") || strstr(device, "GPU");
}

// The next rank, for the worker of this HELLO.
static zps_coord_member *s_admit(zps_coord *c, const Zps__Hello *hello, uint32_t share,
                                 uint64_t member_id, zmq_msg_t *route)
{
    zps_coord_member *mem = &c->members[c->n_members];
    memset(mem, 0, sizeof *mem);
    mem->rank = c->n_members;
    mem->member_id = member_id; // a credential: from the kernel, not from a seeded stream
    snprintf(mem->host, sizeof mem->host, "%s", hello->host ? hello->host : "?");
    snprintf(mem->device, sizeof mem->device, "%s", hello->device ? hello->device : "?");
    mem->share = share;
    mem->pid = hello->pid;
    zps_coord_take_boot_id(c, mem->boot_id, hello->boot_id, "a worker's HELLO");
    zps_member_admit(&mem->life);
    mem->route_known = true;
    mem->last_seen_ms = zps_coord_now(c);
    zps_wire_route_copy(&mem->route, route);
    c->n_members++;
    return mem;
}

// A worker admitted and waiting for its JOB says HELLO again now and then
// (it cannot tell a slow start or step from a coordinator that restarted):
// it is admitted once. Its JOB may be on the way already, crossing this
// HELLO (the connection is the same, so the JOB reaches it): nothing more
// to say. Whether m is such a HELLO, of a live member's connection.
static bool s_said_again(zps_coord *c, zps_wire_msg *m)
{
    for (uint32_t i = 0; i < c->n_members; i++) {
        zps_coord_member *mem = &c->members[i];
        if (zps_member_live(&mem->life) && s_same_route(&mem->route, &m->route)) {
            zps_log_debug("rank %u said HELLO again%s", mem->rank,
                          mem->has_job ? ", its JOB on the way" : "");
            return true;
        }
    }
    return false;
}

zps_err zps_coord_on_hello(zps_coord *c, zps_outbox *out, zps_wire_msg *m)
{
    const Zps__Hello *hello = m->hdr->hello;
    if (!hello) {
        zps_coord_refuse(c, out, m, ZPS_EPROTO, "HELLO without a hello body");
        return ZPS_EPROTO;
    }
    char why[320];
    if (s_declared_differs(c, hello, why, sizeof why)) {
        zps_coord_refuse(c, out, m, ZPS_EINVAL, why);
        return ZPS_EINVAL;
    }
    if (s_said_again(c, m)) {
        return ZPS_OK;
    }
    bool recovering = c->state == ZPS_COORD_RECOVERING;
    bool joining = c->state == ZPS_COORD_TRAINING || recovering;
    if ((c->state != ZPS_COORD_WAITING && !joining) || c->n_members == ZPS_MAX_MEMBERS ||
        (!joining && c->n_members == c->cfg.workers)) {
        zps_coord_refuse(c, out, m, ZPS_ESTATE, "the job admits no more workers now");
        return ZPS_ESTATE;
    }
    uint32_t share = zps_plan_round_share(hello->share, c->cfg.micro_batch);
    if (s_deterministic_refuses(c, hello, why, sizeof why) ||
        !s_share_fits(c, share, joining, why, sizeof why)) {
        zps_coord_refuse(c, out, m, ZPS_EINVAL, why);
        return ZPS_EINVAL;
    }
    uint64_t member_id;
    if (zps_token_new(&member_id) != ZPS_OK) {
        zps_coord_refuse(c, out, m, ZPS_EAGAIN,
                         "no member id could be drawn now; say HELLO again");
        return ZPS_EAGAIN;
    }
    zps_coord_member *mem = s_admit(c, hello, share, member_id, &m->route);
    if (share != hello->share) {
        zps_log_info("rank %u: share %u rounded to %u: whole micro-batches of %u", mem->rank,
                     hello->share, share, c->cfg.micro_batch);
    }
    if (!joining) {
        zps_log_info("worker %s pid %u (%s) admitted as rank %u (%u of %u)", mem->host, mem->pid,
                     mem->device, mem->rank, c->n_members, c->cfg.workers);
        return zps_coord_start(c, out);
    }
    if (recovering) {
        // Resumed: it is one of the job's --workers, as the members of
        // before that call back are; once they make --workers, all start
        // together at the restored step (zps_coord_try_recover).
        zps_log_info("worker %s pid %u (%s) admitted to the resumed job as rank %u",
                     mem->host, mem->pid, mem->device, mem->rank);
        zps_coord_try_recover(c, out, false);
        return ZPS_OK;
    }
    // A member joins at the next step boundary, in the plan made there;
    // it gets its JOB then. Only if nobody else can compute the step in
    // progress does it become active from that step at once.
    zps_log_info("worker %s pid %u (%s) joins as rank %u from the next step boundary",
                 mem->host, mem->pid, mem->device, mem->rank);
    zps_coord_note_change(c);
    zps_coord_reassign(c, out);
    return ZPS_OK;
}

zps_err zps_coord_on_bye(zps_coord *c, zps_outbox *out, const zps_wire_msg *m)
{
    uint32_t r = m->hdr->rank;
    if (r >= c->n_members || c->members[r].member_id != m->hdr->member_id) {
        zps_log_warn("dropped a BYE from an unknown member (rank %u)", r);
        return ZPS_ENOENT;
    }
    zps_coord_member *mem = &c->members[r];
    if (!zps_member_live(&mem->life)) {
        return ZPS_OK; // gone already (evicted, or a second BYE)
    }
    if (m->hdr->step < c->cfg.total_steps && c->state == ZPS_COORD_TRAINING) {
        // Stopped by its supervisor: like an eviction, without the wait.
        zps_log_warn("rank %u (%s, pid %u) left at step %llu; the others take its share",
                     r, mem->host, mem->pid, (unsigned long long)m->hdr->step);
        s_depart(c, out, mem, ZPS_EXIT_LEFT);
        return ZPS_OK;
    }
    zps_log_info("rank %u (%s) finished", r, mem->host);
    s_depart(c, out, mem, ZPS_EXIT_FINISHED);
    return ZPS_OK;
}
