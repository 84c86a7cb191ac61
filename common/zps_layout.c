/* zps_layout.c - checking, comparing and cutting a declared model. */
#include "zps_layout.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zps_groups.h"

#define S_FNV_OFFSET 0xcbf29ce484222325ull
#define S_FNV_PRIME 0x100000001b3ull

static uint64_t s_numel(const Zps__Tensor *t)
{
    uint64_t n = 1;
    for (size_t d = 0; d < t->n_shape; d++) {
        n *= t->shape[d];
    }
    return n;
}

static bool s_name_ok(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > ZPS_LAYOUT_MAX_NAME) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (name[i] <= ' ' || name[i] > '~') {
            return false;
        }
    }
    return true;
}

static int s_cmp_names(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

// Names unique: sorted copies of the pointers, neighbours compared.
static zps_err s_check_unique(const Zps__Layout *l, char *why, size_t len)
{
    const char **names = malloc(l->n_tensors * sizeof *names);
    if (!names) {
        snprintf(why, len, "no memory to check %zu tensor names", l->n_tensors);
        return ZPS_ENOMEM;
    }
    for (size_t i = 0; i < l->n_tensors; i++) {
        names[i] = l->tensors[i]->name;
    }
    qsort(names, l->n_tensors, sizeof *names, s_cmp_names);
    zps_err err = ZPS_OK;
    for (size_t i = 1; i < l->n_tensors && err == ZPS_OK; i++) {
        if (strcmp(names[i - 1], names[i]) == 0) {
            snprintf(why, len, "tensor name '%s' is declared twice", names[i]);
            err = ZPS_EINVAL;
        }
    }
    free(names);
    return err;
}

static zps_err s_check_tensor(const Zps__Tensor *t, size_t i, uint64_t *total, char *why,
                              size_t len)
{
    if (!t->name || !s_name_ok(t->name)) {
        snprintf(why, len, "tensor %zu: a name is 1..%d printable characters without spaces", i,
                 ZPS_LAYOUT_MAX_NAME);
        return ZPS_EINVAL;
    }
    if (t->n_shape > ZPS_LAYOUT_MAX_DIMS) {
        snprintf(why, len, "tensor %zu '%s': %zu dimensions, at most %d", i, t->name,
                 t->n_shape, ZPS_LAYOUT_MAX_DIMS);
        return ZPS_EINVAL;
    }
    uint64_t n = 1;
    for (size_t d = 0; d < t->n_shape; d++) {
        if (t->shape[d] == 0 || t->shape[d] > ZPS_MODEL_MAX_FLAT ||
            n * t->shape[d] > ZPS_MODEL_MAX_FLAT) {
            snprintf(why, len, "tensor %zu '%s': dimension %zu is %llu; each is at least 1 and "
                               "the model at most %u elements",
                     i, t->name, d, (unsigned long long)t->shape[d], ZPS_MODEL_MAX_FLAT);
            return ZPS_EINVAL;
        }
        n *= t->shape[d];
    }
    *total += n;
    if (*total > ZPS_MODEL_MAX_FLAT) {
        snprintf(why, len, "more than %u elements by tensor %zu '%s'", ZPS_MODEL_MAX_FLAT, i,
                 t->name);
        return ZPS_EINVAL;
    }
    return ZPS_OK;
}

zps_err zps_layout_check(const Zps__Layout *l, char *why, size_t len)
{
    if (!l || l->n_tensors == 0 || l->n_tensors > ZPS_LAYOUT_MAX_TENSORS) {
        snprintf(why, len, "a layout has 1..%d tensors, this one %zu", ZPS_LAYOUT_MAX_TENSORS,
                 l ? l->n_tensors : 0);
        return ZPS_EINVAL;
    }
    uint64_t total = 0;
    for (size_t i = 0; i < l->n_tensors; i++) {
        zps_err err = s_check_tensor(l->tensors[i], i, &total, why, len);
        if (err != ZPS_OK) {
            return err;
        }
    }
    zps_err err = s_check_unique(l, why, len);
    return err == ZPS_OK ? zps_groups_check(l, why, len) : err;
}

uint64_t zps_layout_n_params(const Zps__Layout *l)
{
    uint64_t n = 0;
    for (size_t i = 0; i < l->n_tensors; i++) {
        n += s_numel(l->tensors[i]);
    }
    return n;
}

static uint64_t s_fnv(uint64_t h, const void *data, size_t len)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) {
        h = (h ^ p[i]) * S_FNV_PRIME;
    }
    return h;
}

uint64_t zps_layout_digest(const Zps__Layout *l)
{
    uint64_t h = S_FNV_OFFSET;
    for (size_t i = 0; i < l->n_tensors; i++) {
        const Zps__Tensor *t = l->tensors[i];
        const char *name = t->name ? t->name : "";
        h = s_fnv(h, name, strlen(name) + 1); // the NUL ends the name
        uint64_t nd = t->n_shape;
        h = s_fnv(h, &nd, sizeof nd);
        for (size_t d = 0; d < t->n_shape; d++) {
            h = s_fnv(h, &t->shape[d], sizeof t->shape[d]);
        }
    }
    return h;
}

static void s_shape_text(const Zps__Tensor *t, char *out, size_t len)
{
    size_t at = (size_t)snprintf(out, len, "[");
    for (size_t d = 0; d < t->n_shape && at < len; d++) {
        at += (size_t)snprintf(out + at, len - at, "%s%llu", d ? ", " : "",
                               (unsigned long long)t->shape[d]);
    }
    if (at < len) {
        snprintf(out + at, len - at, "]");
    }
}

static bool s_same_tensor(const Zps__Tensor *a, const Zps__Tensor *b)
{
    if (strcmp(a->name ? a->name : "", b->name ? b->name : "") != 0 ||
        a->n_shape != b->n_shape) {
        return false;
    }
    for (size_t d = 0; d < a->n_shape; d++) {
        if (a->shape[d] != b->shape[d]) {
            return false;
        }
    }
    return true;
}

bool zps_layout_differs(const Zps__Layout *ours, const Zps__Layout *theirs, char *why,
                        size_t len)
{
    size_t n = ours->n_tensors < theirs->n_tensors ? ours->n_tensors : theirs->n_tensors;
    for (size_t i = 0; i < n; i++) {
        const Zps__Tensor *a = ours->tensors[i], *b = theirs->tensors[i];
        if (!s_same_tensor(a, b)) {
            char sa[96], sb[96];
            s_shape_text(a, sa, sizeof sa);
            s_shape_text(b, sb, sizeof sb);
            snprintf(why, len, "tensor %zu differs: the job's is '%s' %s, declared '%.*s' %s", i,
                     a->name, sa, ZPS_LAYOUT_MAX_NAME, b->name ? b->name : "", sb);
            return true;
        }
    }
    if (ours->n_tensors != theirs->n_tensors) {
        const Zps__Layout *more = ours->n_tensors > n ? ours : theirs;
        snprintf(why, len, "tensor %zu '%.*s' is %s: the job has %zu tensors, %zu declared", n,
                 ZPS_LAYOUT_MAX_NAME, more->tensors[n]->name ? more->tensors[n]->name : "",
                 more == ours ? "not declared" : "not the job's", ours->n_tensors,
                 theirs->n_tensors);
        return true;
    }
    return false;
}

bool zps_layout_differs_mlp(const zps_model_spec *m, const Zps__Layout *l, char *why,
                            size_t len)
{
    size_t want = 2 * (size_t)m->n_layers;
    for (size_t i = 0; i < want && i < l->n_tensors; i++) {
        const zps_layer_spec *ls = &m->layers[i / 2];
        const Zps__Tensor *t = l->tensors[i];
        bool weight = i % 2 == 0;
        if (t->n_shape != (weight ? 2u : 1u) || t->shape[0] != ls->out ||
            (weight && t->shape[1] != ls->in)) {
            char sb[96], sa[48];
            s_shape_text(t, sb, sizeof sb);
            if (weight) {
                snprintf(sa, sizeof sa, "[%u, %u]", ls->out, ls->in);
            } else {
                snprintf(sa, sizeof sa, "[%u]", ls->out);
            }
            snprintf(why, len, "tensor %zu differs: %s has layer %zu's %s %s there, declared "
                               "'%.*s' %s", i, m->text, i / 2, weight ? "weight" : "bias", sa,
                     ZPS_LAYOUT_MAX_NAME, t->name ? t->name : "", sb);
            return true;
        }
    }
    if (l->n_tensors != want) {
        snprintf(why, len, "%s is %zu tensors (weight and bias of %d layers), %zu declared",
                 m->text, want, m->n_layers, l->n_tensors);
        return true;
    }
    return false;
}

// Appends the bucket [lo, hi) (cuts run downwards: bucket i is
// [cuts[i+1], cuts[i])); false when there are too many.
static bool s_cut(zps_model_spec *m, uint64_t lo)
{
    if (m->n_cuts >= ZPS_MODEL_MAX_BUCKETS) {
        return false;
    }
    m->cuts[++m->n_cuts] = lo;
    return true;
}

// Cuts with buckets of about `size` elements; false when they are more
// than ZPS_MODEL_MAX_BUCKETS.
static bool s_cuts(const Zps__Layout *l, uint64_t size, zps_model_spec *m)
{
    m->n_cuts = 0;
    m->cuts[0] = m->n_params;
    uint64_t hi = m->n_params; // the open group is [start, hi)
    for (size_t k = l->n_tensors; k-- > 0;) {
        uint64_t n = s_numel(l->tensors[k]), start = hi - n;
        uint64_t open = m->cuts[m->n_cuts] - hi; // elements grouped so far
        if (n > size) {
            if (open > 0 && !s_cut(m, hi)) {
                return false;
            }
            uint64_t pieces = (n + size - 1) / size;
            for (uint64_t p = pieces; p-- > 0;) { // equal pieces, from its end
                if (!s_cut(m, start + n * p / pieces)) {
                    return false;
                }
            }
        } else if (open > 0 && open + n > size && !s_cut(m, hi)) {
            return false;
        }
        hi = start;
    }
    return m->cuts[m->n_cuts] == 0 || s_cut(m, 0);
}

void zps_layout_model(const Zps__Layout *l, zps_model_spec *out)
{
    memset(out, 0, sizeof *out);
    out->kind = ZPS_MODEL_EXTERNAL;
    out->n_params = zps_layout_n_params(l);
    snprintf(out->text, sizeof out->text, "external:%016llx",
             (unsigned long long)zps_layout_digest(l));
    uint64_t size = ZPS_MODEL_FLAT_BUCKET;
    while (!s_cuts(l, size, out)) {
        size *= 2;
    }
}
