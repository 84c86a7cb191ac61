/* zps_decl.c - building a declared model, tensor by tensor. */
#include "zps_decl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_layout.h"

void zps_decl_init(zps_decl *d)
{
    memset(d, 0, sizeof *d);
    zps__layout__init(&d->layout);
}

void zps_decl_fini(zps_decl *d)
{
    for (size_t i = 0; i < d->layout.n_tensors; i++) {
        free(d->tensors[i]->name);
        free(d->tensors[i]->shape);
        free(d->tensors[i]);
    }
    free(d->tensors);
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
