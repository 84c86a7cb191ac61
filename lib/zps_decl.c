/* zps_decl.c - building a declared model, tensor by tensor. */
#include "zps_decl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_groups.h"
#include "common/zps_layout.h"

void zps_decl_init(zps_decl *d)
{
    memset(d, 0, sizeof *d);
    zps__layout__init(&d->layout);
    zps__schedule__init(&d->table);
}

void zps_decl_fini(zps_decl *d)
{
    for (size_t i = 0; i < d->layout.n_tensors; i++) {
        free(d->tensors[i]->name);
        free(d->tensors[i]->shape);
        free(d->tensors[i]);
    }
    free(d->tensors);
    for (size_t i = 0; i < d->layout.n_groups; i++) {
        free(d->groups[i]);
    }
    free(d->groups);
    free(d->table.lr);
    zps_decl_init(d);
}

static Zps__Tensor *s_tensor(const char *name, int ndim, const int64_t *shape)
{
    Zps__Tensor *t = calloc(1, sizeof *t);
    if (!t) {
        return NULL;
    }
    zps__tensor__init(t);
    t->name = strdup(name);
    t->shape = calloc(ndim > 0 ? (size_t)ndim : 1, sizeof *t->shape);
    if (!t->name || !t->shape) {
        free(t->name);
        free(t->shape);
        free(t);
        return NULL;
    }
    for (int k = 0; k < ndim; k++) {
        t->shape[k] = (uint64_t)shape[k];
    }
    t->n_shape = (size_t)ndim;
    return t;
}

zps_err zps_decl_tensor(zps_decl *d, const char *name, int ndim, const int64_t *shape,
                        char *why, size_t len)
{
    if (!name || ndim < 0 || ndim > ZPS_LAYOUT_MAX_DIMS || (ndim > 0 && !shape)) {
        snprintf(why, len, "a tensor has a name and 0..%d dimensions", ZPS_LAYOUT_MAX_DIMS);
        return ZPS_EINVAL;
    }
    for (int k = 0; k < ndim; k++) {
        if (shape[k] < 1) {
            snprintf(why, len, "tensor '%s': dimension %d is %lld, at least 1", name, k,
                     (long long)shape[k]);
            return ZPS_EINVAL;
        }
    }
    if (d->layout.n_tensors == ZPS_LAYOUT_MAX_TENSORS) {
        snprintf(why, len, "more than %d tensors", ZPS_LAYOUT_MAX_TENSORS);
        return ZPS_EINVAL;
    }
    if (d->layout.n_tensors == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 16;
        Zps__Tensor **grown = realloc(d->tensors, cap * sizeof(Zps__Tensor *));
        if (!grown) {
            snprintf(why, len, "out of memory");
            return ZPS_ENOMEM;
        }
        d->tensors = grown;
        d->cap = cap;
    }
    Zps__Tensor *t = s_tensor(name, ndim, shape);
    if (!t) {
        snprintf(why, len, "out of memory");
        return ZPS_ENOMEM;
    }
    d->tensors[d->layout.n_tensors++] = t;
    d->layout.tensors = d->tensors;
    return ZPS_OK;
}

zps_err zps_decl_dataset(zps_decl *d, uint32_t n_train, uint32_t n_test, char *why, size_t len)
{
    if (n_train == 0) {
        snprintf(why, len, "a dataset has at least one train record");
        return ZPS_EINVAL;
    }
    d->n_train = n_train;
    d->n_test = n_test;
    d->has_dataset = true;
    return ZPS_OK;
}

bool zps_decl_any(const zps_decl *d)
{
    return d->layout.n_tensors > 0;
}

zps_err zps_decl_group(zps_decl *d, int group, const Zps__Optim *settings, char *why,
                       size_t len)
{
    size_t n = d->layout.n_groups;
    if (group < 0 || (size_t)group > n || group >= ZPS_GROUPS_MAX) {
        snprintf(why, len, "group %d: groups are numbered 0..%zu in order (at most %d)", group,
                 n, ZPS_GROUPS_MAX);
        return ZPS_EINVAL;
    }
    if ((size_t)group == n) {
        Zps__Optim **grown = realloc(d->groups, (n + 1) * sizeof(Zps__Optim *));
        Zps__Optim *g = calloc(1, sizeof *g);
        if (grown) {
            d->groups = grown;
            d->layout.groups = grown;
        }
        if (!grown || !g) {
            free(g);
            snprintf(why, len, "out of memory");
            return ZPS_ENOMEM;
        }
        d->groups[n] = g;
        d->layout.n_groups = n + 1;
    }
    *d->groups[group] = *settings;
    return ZPS_OK;
}

zps_err zps_decl_tensor_is(zps_decl *d, const char *name, int group, int role, char *why,
                           size_t len)
{
    if (group < 0 || group >= ZPS_GROUPS_MAX) {
        snprintf(why, len, "group %d: groups are numbered 0..%d", group, ZPS_GROUPS_MAX - 1);
        return ZPS_EINVAL;
    }
    for (size_t i = 0; name && i < d->layout.n_tensors; i++) {
        if (strcmp(d->tensors[i]->name, name) == 0 && d->tensors[i]->role != 0) {
            snprintf(why, len, "tensor '%s' is a buffer: it has no group", name);
            return ZPS_EINVAL;
        }
        if (strcmp(d->tensors[i]->name, name) == 0) {
            d->tensors[i]->group = (uint32_t)group;
            d->tensors[i]->role = (uint32_t)role;
            return ZPS_OK;
        }
    }
    snprintf(why, len, "no tensor '%s' is declared", name ? name : "(null)");
    return ZPS_EINVAL;
}

zps_err zps_decl_table(zps_decl *d, uint32_t groups, uint64_t steps, const float *lr,
                       char *why, size_t len)
{
    uint32_t want = d->layout.n_groups ? (uint32_t)d->layout.n_groups : 1;
    size_t n = groups && steps <= ZPS_GROUPS_MAX_TABLE / groups ? (size_t)steps * groups : 0;
    if (!lr || n == 0 ||
        zps_groups_check_table(groups, steps, lr, n, want, why, len) != ZPS_OK) {
        if (!lr || n == 0) {
            snprintf(why, len, "a learning-rate table of %u groups of %llu steps: 1..%u rates "
                               "of the %u groups declared", groups, (unsigned long long)steps,
                     ZPS_GROUPS_MAX_TABLE, want);
        }
        return ZPS_EINVAL;
    }
    float *copy = malloc(n * sizeof *copy);
    if (!copy) {
        snprintf(why, len, "out of memory");
        return ZPS_ENOMEM;
    }
    memcpy(copy, lr, n * sizeof *copy);
    free(d->table.lr);
    d->table.lr = copy;
    d->table.n_lr = n;
    d->table.groups = groups;
    d->table.steps = steps;
    return ZPS_OK;
}
