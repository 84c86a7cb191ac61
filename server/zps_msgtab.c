/* zps_msgtab.c - the message table and its check. */
#include "zps_msgtab.h"

#include <stdio.h>
#include <string.h>

#include "common/zps_plan.h"
#include "common/zps_wire.h"

#define W ZPS_ROLE_WORKER
#define S ZPS_ROLE_SHARD
#define O ZPS_ROLE_OPERATOR
// Where the coordinator takes what a member sends: once members hold
// their ids (JOB is sent when training starts), and while a restarted
// coordinator waits for them to call back.
#define AT_MEMBERS (ZPS_AT_TRAINING | ZPS_AT_DONE | ZPS_AT_RECOVERING)

// Types only coordinators and shards send: no server takes them. The
// confused sender is told why, unless what it sent is an ERROR itself
// (two servers must not answer each other's errors forever).
static const zps_msgtab_rule s_nobody = {ZPS_FROM_NOBODY, 0, ZPS_CRED_NONE, 0, false, true};
static const zps_msgtab_rule s_nobody_error = {ZPS_FROM_NOBODY, 0, ZPS_CRED_NONE, 0, false, false};

// The table, by type (proto/zps.proto). Keep the table of docs/security.md
// in step with it.
static const zps_msgtab_rule s_rules[] = {
    // A worker asks to be admitted: refused while the ranges are being
    // assigned and after the last step; "not yet" while recovering.
    [ZPS__MSG_TYPE__HELLO] = {ZPS_FROM_ANYONE, W, ZPS_CRED_NONE,
                              ZPS_AT_WAITING | ZPS_AT_TRAINING | ZPS_AT_RECOVERING, false, true},
    [ZPS__MSG_TYPE__STATUS] = {ZPS_FROM_ANYONE, W | S | O, ZPS_CRED_NONE, ZPS_AT_COORDINATOR,
                               false, true},
    // Before the job starts any peer may say it is shard k (the last one
    // to say so gets the range); once assigned, only the holder of its
    // token, a restart with --resume included.
    [ZPS__MSG_TYPE__REGISTER] = {ZPS_FROM_SHARD, S, ZPS_CRED_TOKEN_IF_ASSIGNED,
                                 ZPS_AT_COORDINATOR, false, true},
    [ZPS__MSG_TYPE__READY] = {ZPS_FROM_SHARD, S, ZPS_CRED_SHARD_TOKEN,
                              ZPS_AT_ASSIGNING | ZPS_AT_TRAINING, true, false},
    [ZPS__MSG_TYPE__STEP_DONE] = {ZPS_FROM_SHARD, S, ZPS_CRED_SHARD_TOKEN, AT_MEMBERS, true,
                                  false},
    // --clip-grad-norm: a shard's sum of squares of a step, as STEP_DONE:
    // its token, or nothing changes.
    [ZPS__MSG_TYPE__NORM] = {ZPS_FROM_SHARD, S, ZPS_CRED_SHARD_TOKEN, AT_MEMBERS, true, false},
    [ZPS__MSG_TYPE__EVAL] = {ZPS_FROM_WORKER, W, ZPS_CRED_MEMBER, AT_MEMBERS, true, false},
    [ZPS__MSG_TYPE__BYE] = {ZPS_FROM_WORKER, W, ZPS_CRED_MEMBER, AT_MEMBERS, true, false},
    [ZPS__MSG_TYPE__HEARTBEAT] = {ZPS_FROM_WORKER, W, ZPS_CRED_MEMBER, AT_MEMBERS, true, false},
    // To any shard: the shard's plans say who its members are.
    [ZPS__MSG_TYPE__PUSH] = {ZPS_FROM_WORKER, W, ZPS_CRED_PLAN_MEMBER,
                             AT_MEMBERS | ZPS_AT_SERVING, true, true},
    [ZPS__MSG_TYPE__PULL] = {ZPS_FROM_WORKER, W, ZPS_CRED_PLAN_MEMBER,
                             AT_MEMBERS | ZPS_AT_SERVING, true, true},
    // Rank 0's initial values of a declared model (the handler checks the
    // rank): answered when refused, so that a shard not assigned yet is
    // sent them again.
    [ZPS__MSG_TYPE__INIT] = {ZPS_FROM_WORKER, W, ZPS_CRED_PLAN_MEMBER,
                             AT_MEMBERS | ZPS_AT_SERVING, true, true},
};

#undef W
#undef S
#undef O

const zps_msgtab_rule *zps_msgtab_rule_of(int type)
{
    if (type == ZPS__MSG_TYPE__ERROR) {
        return &s_nobody_error;
    }
    if (type < 0 || (size_t)type >= sizeof s_rules / sizeof s_rules[0] ||
        s_rules[type].from == ZPS_FROM_NOBODY) {
        return &s_nobody; // zero rows (JOB, PARAMS, ...) are nobody's too
    }
    return &s_rules[type];
}

const char *zps_msgtab_at_name(uint32_t at)
{
    switch (at) {
    case ZPS_AT_WAITING: return "waiting for workers and shards";
    case ZPS_AT_ASSIGNING: return "assigning the shards' ranges";
    case ZPS_AT_TRAINING: return "training";
    case ZPS_AT_DONE: return "done";
    case ZPS_AT_RECOVERING: return "recovering from a restart";
    case ZPS_AT_UNASSIGNED: return "not assigned a range yet";
    case ZPS_AT_SERVING: return "serving";
    default: return "?";
    }
}

uint8_t zps_msgtab_roles(bool curve, const char *user_id)
{
    if (!curve) {
        return ZPS_ROLES_ANY;
    }
    static const struct {
        const char *name;
        uint8_t role;
    } names[] = {{"worker", ZPS_ROLE_WORKER}, {"shard", ZPS_ROLE_SHARD},
                 {"operator", ZPS_ROLE_OPERATOR}};
    uint8_t roles = 0;
    const char *p = user_id ? user_id : "";
    while (*p) {
        size_t len = strcspn(p, ",");
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            if (len == strlen(names[i].name) && strncmp(p, names[i].name, len) == 0) {
                roles |= names[i].role;
            }
        }
        p += len + (p[len] == ',');
    }
    return roles;
}

static const char *s_roles_text(uint8_t roles)
{
    switch (roles) {
    case 0: return "no role";
    case ZPS_ROLE_WORKER: return "a worker key";
    case ZPS_ROLE_SHARD: return "a shard key";
    case ZPS_ROLE_OPERATOR: return "an operator key";
    default: return "this key";
    }
}

// The shard a message claims to come from: a REGISTER names it in its
// body (and its header must agree), the others in the header.
static zps_err s_claimed_shard(const Zps__Header *h, uint32_t *index, char *why, size_t len)
{
    *index = h->shard;
    if (h->type != ZPS__MSG_TYPE__REGISTER) {
        return ZPS_OK;
    }
    if (!h->registration || h->registration->index != h->shard) {
        snprintf(why, len, "REGISTER must name the same shard in its header and body");
        return ZPS_EPROTO;
    }
    return ZPS_OK;
}

static zps_err s_check_cred(const zps_msgtab_ctx *x, const zps_msgtab_rule *r,
                            const Zps__Header *h, char *why, size_t len)
{
    const char *type = zps_wire_type_name((int)h->type);
    uint32_t index;
    zps_err err;
    switch (r->cred) {
    case ZPS_CRED_NONE:
        return ZPS_OK;
    case ZPS_CRED_MEMBER:
    case ZPS_CRED_PLAN_MEMBER:
        if (h->rank >= ZPS_MAX_MEMBERS) {
            snprintf(why, len, "rank %u is past the last possible (%d)", h->rank,
                     ZPS_MAX_MEMBERS - 1);
            return ZPS_ERANGE;
        }
        if (r->cred == ZPS_CRED_MEMBER ? x->member_ok(x->arg, h->rank, h->member_id)
                                       : x->plan_member_ok(x->arg, h->rank, h->member_id)) {
            return ZPS_OK;
        }
        if (r->cred == ZPS_CRED_PLAN_MEMBER && h->type == ZPS__MSG_TYPE__PUSH &&
            h->generation > x->newest_generation(x->arg)) {
            return ZPS_OK; // a newcomer's push before its plan: held, checked again then
        }
        // The id the peer sent is not repeated: a guess need not be logged.
        snprintf(why, len, "%s from rank %u with a member id that is not %s", type, h->rank,
                 r->cred == ZPS_CRED_MEMBER ? "an admitted worker's" : "in a plan of this shard");
        return ZPS_ENOENT;
    case ZPS_CRED_SHARD_TOKEN:
    case ZPS_CRED_TOKEN_IF_ASSIGNED:
        if ((err = s_claimed_shard(h, &index, why, len)) != ZPS_OK) {
            return err;
        }
        if (index >= ZPS_MAX_SHARDS) {
            snprintf(why, len, "shard %u is past the last possible (%d)", index,
                     ZPS_MAX_SHARDS - 1);
            return ZPS_ERANGE;
        }
        if (r->cred == ZPS_CRED_TOKEN_IF_ASSIGNED && !x->shard_assigned(x->arg, index)) {
            return ZPS_OK; // anyone may claim a shard not assigned yet
        }
        if (x->shard_token_ok(x->arg, index, h->shard_token)) {
            return ZPS_OK;
        }
        if (h->shard_token) {
            snprintf(why, len, "%s from shard %u with a wrong shard token", type, index);
        } else {
            snprintf(why, len, "%s from shard %u without its shard token (a restarted shard "
                               "presents it with --resume, from its --checkpoint-dir)",
                     type, index);
        }
        return ZPS_EPERM;
    }
    return ZPS_OK;
}

zps_err zps_msgtab_check(const zps_msgtab_ctx *x, const Zps__Header *h, const char *user_id,
                         char *why, size_t why_len)
{
    const zps_msgtab_rule *r = zps_msgtab_rule_of((int)h->type);
    const char *type = zps_wire_type_name((int)h->type);
    why[0] = '\0';
    if (r->from == ZPS_FROM_NOBODY) {
        snprintf(why, why_len, "%s (type %d) is never sent to a server", type, (int)h->type);
        return ZPS_EPROTO;
    }
    uint8_t roles = zps_msgtab_roles(x->curve, user_id);
    if (!(roles & r->roles)) {
        snprintf(why, why_len, "%s (CURVE User-Id '%s') may not send %s", s_roles_text(roles),
                 user_id ? user_id : "", type);
        return ZPS_EPERM;
    }
    if (!(x->at & r->at)) {
        if (x->at == ZPS_AT_DONE && (r->roles & ZPS_ROLE_WORKER)) {
            // A worker that would join (or join again) after the last step:
            // for it the job is simply over, not refused (libzps ends with
            // ZPS_ECLOSED, zps-worker with exit 0).
            snprintf(why, why_len, "%s came after the last step", type);
            return ZPS_ECLOSED;
        }
        if (x->at == ZPS_AT_UNASSIGNED && (r->at & ZPS_AT_SERVING)) {
            // A shard restarted and not assigned yet: a worker's push or
            // pull is early, not wrong. "Not yet" has it sent again (the
            // coordinator's rollback says where the job goes on); refused
            // for good, it ended the worker (the seeded chaos schedule).
            snprintf(why, why_len, "%s: this shard is not assigned a range yet", type);
            return ZPS_EAGAIN;
        }
        if ((x->at & (ZPS_AT_UNASSIGNED | ZPS_AT_SERVING)) && !(r->at & ZPS_AT_SERVING)) {
            snprintf(why, why_len, "%s goes to the coordinator (shard 0), not to this shard",
                     type);
        } else {
            snprintf(why, why_len, "%s is not taken while %s", type,
                     zps_msgtab_at_name(x->at));
        }
        return ZPS_ESTATE;
    }
    if (r->job_id && h->job_id != x->job_id) {
        snprintf(why, why_len, "job id %016llx is not this job's",
                 (unsigned long long)h->job_id);
        return ZPS_EJOB;
    }
    return s_check_cred(x, r, h, why, why_len);
}

void zps_msgtab_claim(const Zps__Header *h, char *out, size_t len)
{
    const zps_msgtab_rule *r = zps_msgtab_rule_of((int)h->type);
    if (r->cred == ZPS_CRED_MEMBER || r->cred == ZPS_CRED_PLAN_MEMBER) {
        snprintf(out, len, "rank %u", h->rank);
    } else if (r->from == ZPS_FROM_SHARD) {
        snprintf(out, len, "shard %u",
                 h->type == ZPS__MSG_TYPE__REGISTER && h->registration ? h->registration->index
                                                                       : h->shard);
    } else {
        out[0] = '\0';
    }
}
