/* zps_groups.c - checking, comparing and cutting a layout's parameter
 * groups and buffers. */
#include "zps_groups.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *s_kind_name(uint32_t kind)
{
    return zps_optim_name((zps_optim_kind)kind);
}

// One group as torch would accept it for its kind; why names the field.
static zps_err s_check_group(const Zps__Optim *g, size_t i, uint32_t kind, char *why,
                             size_t len)
{
    if (g->kind > ZPS_OPTIM_ADAMW || g->kind != kind) {
        snprintf(why, len, "group %zu: optimizer %s, group 0's is %s: one optimizer a job", i,
                 s_kind_name(g->kind), s_kind_name(kind));
        return ZPS_EINVAL;
    }
    const char *field = NULL;
    if (!(g->lr >= 0) || isinf(g->lr)) {
        field = "lr must be finite and >= 0";
    } else if (!(g->weight_decay >= 0) || isinf(g->weight_decay)) {
        field = "weight_decay must be finite and >= 0";
    } else if (kind == ZPS_OPTIM_SGD && (!(g->momentum >= 0) || isinf(g->momentum))) {
        field = "momentum must be finite and >= 0";
    } else if (kind == ZPS_OPTIM_SGD && g->nesterov && !(g->momentum > 0)) {
        field = "nesterov needs momentum > 0";
    } else if (kind != ZPS_OPTIM_SGD && !(g->beta1 >= 0 && g->beta1 < 1)) {
        field = "beta1 must be in [0, 1)";
    } else if (kind != ZPS_OPTIM_SGD && !(g->beta2 >= 0 && g->beta2 < 1)) {
        field = "beta2 must be in [0, 1)";
    } else if (kind != ZPS_OPTIM_SGD && (!((float)g->eps > 0) || isinf(g->eps))) {
        field = "eps must be > 0 and finite";
    }
    if (field) {
        snprintf(why, len, "group %zu (%s): %s", i, s_kind_name(kind), field);
        return ZPS_EINVAL;
    }
    return ZPS_OK;
}

zps_err zps_groups_check(const Zps__Layout *l, char *why, size_t len)
{
    if (l->n_groups > ZPS_GROUPS_MAX) {
        snprintf(why, len, "%zu parameter groups, at most %d", l->n_groups, ZPS_GROUPS_MAX);
        return ZPS_EINVAL;
    }
    for (size_t i = 0; i < l->n_groups; i++) {
        if (s_check_group(l->groups[i], i, l->groups[0]->kind, why, len) != ZPS_OK) {
            return ZPS_EINVAL;
        }
    }
    size_t n_groups = l->n_groups ? l->n_groups : 1;
    for (size_t i = 0; i < l->n_tensors; i++) {
        const Zps__Tensor *t = l->tensors[i];
        if (t->role > ZPS_ROLE_BROADCAST) {
            snprintf(why, len, "tensor %zu '%s': role %u, expected 0 (parameter), 1 (buffer "
                               "averaged) or 2 (buffer broadcast)", i, t->name, t->role);
            return ZPS_EINVAL;
        }
        if (t->group >= n_groups) {
            snprintf(why, len, "tensor %zu '%s' is in group %u; %zu groups are declared", i,
                     t->name, t->group, l->n_groups);
            return ZPS_EINVAL;
        }
    }
    return ZPS_OK;
}

bool zps_groups_declared(const Zps__Layout *l)
{
    if (!l) {
        return false;
    }
    for (size_t i = 0; i < l->n_tensors; i++) {
        if (l->tensors[i]->role != ZPS_ROLE_PARAM) {
            return true;
        }
    }
    return l->n_groups > 0;
}

zps_optim_cfg zps_groups_cfg(const Zps__Optim *g, const zps_optim_cfg *base)
{
    zps_optim_cfg c = *base;
    c.kind = (zps_optim_kind)g->kind;
    c.lr = g->lr;
    c.momentum = g->momentum;
    c.nesterov = g->nesterov;
    c.weight_decay = g->weight_decay;
    c.beta1 = g->beta1;
    c.beta2 = g->beta2;
    c.eps = g->eps;
    return c;
}

// The first field of a group that differs from the settings f, as
// "declares <field> <value>, this job's --<flag> is <value>"; false if none.
static bool s_differs(const Zps__Optim *g, const zps_optim_cfg *f, char *out, size_t len)
{
    bool sgd = f->kind == ZPS_OPTIM_SGD;
    if (g->kind != (uint32_t)f->kind) {
        snprintf(out, len, "declares optimizer %s, this job's --optimizer is %s",
                 s_kind_name(g->kind), zps_optim_name(f->kind));
    } else if (g->lr != f->lr) {
        snprintf(out, len, "declares lr %g, this job's --lr is %g", g->lr, f->lr);
    } else if (g->weight_decay != f->weight_decay) {
        snprintf(out, len, "declares weight_decay %g, this job's --weight-decay is %g",
                 g->weight_decay, f->weight_decay);
    } else if (sgd && g->momentum != f->momentum) {
        snprintf(out, len, "declares momentum %g, this job's --momentum is %g", g->momentum,
                 f->momentum);
    } else if (sgd && g->nesterov != f->nesterov) {
        snprintf(out, len, "declares nesterov %s, this job's --nesterov is %s",
                 g->nesterov ? "on" : "off", f->nesterov ? "on" : "off");
    } else if (!sgd && (g->beta1 != f->beta1 || g->beta2 != f->beta2)) {
        snprintf(out, len, "declares betas %g,%g, this job's --betas is %g,%g", g->beta1,
                 g->beta2, f->beta1, f->beta2);
    } else if (!sgd && g->eps != f->eps) {
        snprintf(out, len, "declares eps %g, this job's --eps is %g", g->eps, f->eps);
    } else {
        return false;
    }
    return true;
}

bool zps_groups_differ_flags(const Zps__Layout *l, const zps_optim_cfg *flags, char *why,
                             size_t len)
{
    char what[160];
    for (size_t i = 0; l && i < l->n_groups; i++) {
        if (s_differs(l->groups[i], flags, what, sizeof what)) {
            snprintf(why, len, "group %zu %s: start zps-server without optimizer flags to take "
                               "the workers' optimizer", i, what);
            return true;
        }
    }
    return false;
}

static bool s_same_group(const Zps__Optim *a, const Zps__Optim *b)
{
    return a->kind == b->kind && a->lr == b->lr && a->momentum == b->momentum &&
           a->nesterov == b->nesterov && a->weight_decay == b->weight_decay &&
           a->beta1 == b->beta1 && a->beta2 == b->beta2 && a->eps == b->eps;
}

bool zps_groups_differ(const Zps__Layout *ours, const Zps__Layout *theirs, char *why,
                       size_t len)
{
    if (ours->n_groups != theirs->n_groups) {
        snprintf(why, len, "declared %zu parameter groups; the job's has %zu", theirs->n_groups,
                 ours->n_groups);
        return true;
    }
    for (size_t i = 0; i < ours->n_groups; i++) {
        char what[160];
        zps_optim_cfg f = zps_groups_cfg(ours->groups[i], &(zps_optim_cfg){0});
        if (!s_same_group(ours->groups[i], theirs->groups[i]) &&
            s_differs(theirs->groups[i], &f, what, sizeof what)) {
            snprintf(why, len, "group %zu %s", i, what);
            return true;
        }
    }
    size_t n = ours->n_tensors < theirs->n_tensors ? ours->n_tensors : theirs->n_tensors;
    for (size_t i = 0; i < n; i++) {
        const Zps__Tensor *a = ours->tensors[i], *b = theirs->tensors[i];
        if (a->group != b->group || a->role != b->role) {
            snprintf(why, len, "tensor %zu '%s' declared with group %u role %u; the job's has "
                               "group %u role %u", i, a->name, b->group, b->role, a->group,
                     a->role);
            return true;
        }
    }
    return false;
}

static uint64_t s_numel(const Zps__Tensor *t)
{
    uint64_t n = 1;
    for (size_t d = 0; d < t->n_shape; d++) {
        n *= t->shape[d];
    }
    return n;
}

// Appends [lo, hi) of role and group, merged with the last one when alike.
static void s_add(zps_groups *g, uint64_t lo, uint64_t hi, uint32_t group, uint32_t role)
{
    if (role != ZPS_ROLE_PARAM) {
        group = 0;
    }
    zps_seg *last = g->n_segs ? &g->segs[g->n_segs - 1] : NULL;
    if (last && last->hi == lo && last->group == group && last->role == role) {
        last->hi = hi;
        return;
    }
    g->segs[g->n_segs++] = (zps_seg){.lo = lo, .hi = hi, .group = group, .role = role};
    g->broadcast = g->broadcast || role == ZPS_ROLE_BROADCAST;
}

zps_err zps_groups_build(zps_groups *g, const Zps__Layout *l, const zps_optim_cfg *base,
                         uint64_t lo, uint64_t hi)
{
    memset(g, 0, sizeof *g);
    if (!zps_groups_declared(l)) {
        return ZPS_OK;
    }
    g->n = (int)(l->n_groups ? l->n_groups : 1);
    g->cfg = calloc((size_t)g->n, sizeof *g->cfg);
    g->segs = calloc(l->n_tensors, sizeof *g->segs);
    if (!g->cfg || !g->segs) {
        zps_groups_fini(g);
        return ZPS_ENOMEM;
    }
    for (int i = 0; i < g->n; i++) {
        g->cfg[i] = l->n_groups ? zps_groups_cfg(l->groups[i], base) : *base;
    }
    uint64_t at = 0;
    for (size_t i = 0; i < l->n_tensors && at < hi; i++) {
        const Zps__Tensor *t = l->tensors[i];
        uint64_t end = at + s_numel(t);
        uint64_t a = at > lo ? at : lo, b = end < hi ? end : hi;
        if (a < b) {
            s_add(g, a - lo, b - lo, t->group, t->role);
        }
        at = end;
    }
    return ZPS_OK;
}

void zps_groups_fini(zps_groups *g)
{
    free(g->cfg);
    free(g->segs);
    memset(g, 0, sizeof *g);
}

zps_err zps_groups_check_table(uint32_t groups, uint64_t steps, const float *lr, size_t n_lr,
                               uint32_t want, char *why, size_t len)
{
    if (groups != want) {
        snprintf(why, len, "a learning-rate table of %u groups; the job has %u", groups, want);
        return ZPS_EINVAL;
    }
    if (steps == 0 || steps > ZPS_GROUPS_MAX_TABLE / groups || n_lr != steps * groups) {
        snprintf(why, len, "a learning-rate table of %llu steps of %u groups holds %zu rates; "
                           "1..%u in all", (unsigned long long)steps, groups, n_lr,
                 ZPS_GROUPS_MAX_TABLE);
        return ZPS_EINVAL;
    }
    for (size_t i = 0; i < n_lr; i++) {
        if (!(lr[i] >= 0) || isinf(lr[i])) {
            snprintf(why, len, "learning-rate table: step %llu group %llu is %g, not a finite "
                               "rate >= 0", (unsigned long long)(i / groups),
                     (unsigned long long)(i % groups), lr[i]);
            return ZPS_EINVAL;
        }
    }
    return ZPS_OK;
}
