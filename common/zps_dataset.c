/* zps_dataset.c - named datasets: Fashion-MNIST IDX files and synthetic data.
 *
 * Both kinds give any record on demand from its index alone: IDX records are
 * read from the map, synthetic ones regenerated from (seed, split, index).
 * Nothing depends on which records a worker asked for before, so a slice
 * handed from one worker to another yields the same samples.
 *
 * Synthetic labels are computed in exact integer arithmetic, so every host,
 * compiler and libm agrees on them, as the one promise of DESIGN.md needs. */
#include "zps_dataset.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zps_log.h"
#include "zps_rng.h"

#define DATASET_FASHION "fashion-mnist"
#define DATASET_SYNTHETIC "synthetic:"
#define DATASET_FASHION_DIR "/usr/share/datasets/fashion-mnist"

// Random streams: a tag in the high 16 bits keeps them apart from each other
// and from the model init stream (1) and the sampler's epochs.
#define STREAM_SYN_WEIGHTS (0x5E7Aull << 48)
#define STREAM_SYN_RECORD(split, i) \
    ((0x5E7Bull << 48) | ((uint64_t)(split) << 32) | (uint64_t)(i))

// Synthetic inputs are 24-bit fixed point, exact in a float; the input is
// centred before the linear map so that no class wins by its row sum alone.
#define SYN_INPUT_BITS 24
#define SYN_INPUT_HALF (1 << (SYN_INPUT_BITS - 1))
// |weight| <= 2^15 and |input| <= 2^23: dim <= 2^24 keeps the sum in int64.
#define SYN_MAX_DIM (1u << 24)

struct zps_dataset {
    zps_dataset_kind kind; // IDX or synthetic
    uint32_t dim;          // inputs per record
    uint32_t classes;      // labels are < classes
    uint64_t seed;         // synthetic: the job seed
    uint32_t n[2];         // records per split
    zps_idx images[2];     // IDX: owned maps, per split
    zps_idx labels[2];     // IDX: owned maps, per split
    int32_t *weights;      // synthetic, owned: (classes, dim) label map
};

static const char *const s_image_files[2] = {"train-images-idx3-ubyte", "t10k-images-idx3-ubyte"};
static const char *const s_label_files[2] = {"train-labels-idx1-ubyte", "t10k-labels-idx1-ubyte"};

// ---------------------------------------------------------------- parse

static zps_err s_parse_synthetic(const char *text, zps_dataset_spec *out)
{
    const char *p = text + strlen(DATASET_SYNTHETIC);
    char *end;
    errno = 0;
    unsigned long long n = strtoull(p, &end, 10);
    if (*p < '0' || *p > '9' || *end != '\0' || errno != 0 || n < 1 || n > UINT32_MAX) {
        zps_log_error("dataset '%s': expected synthetic:N with N in 1..%u", text, UINT32_MAX);
        return ZPS_EINVAL;
    }
    out->kind = ZPS_DATASET_SYNTHETIC;
    out->n_synthetic = (uint32_t)n;
    return ZPS_OK;
}

static zps_err s_parse_fashion(const char *text, zps_dataset_spec *out)
{
    const char *rest = text + strlen(DATASET_FASHION);
    const char *dir = DATASET_FASHION_DIR;
    if (*rest == ':') {
        dir = rest + 1;
    } else if (*rest != '\0') {
        zps_log_error("dataset '%s': expected fashion-mnist or fashion-mnist:DIR", text);
        return ZPS_EINVAL;
    }
    if (dir[0] == '\0' || strlen(dir) >= sizeof out->dir) {
        zps_log_error("dataset '%s': directory is empty or longer than %zu bytes", text,
                      sizeof out->dir - 1);
        return ZPS_EINVAL;
    }
    out->kind = ZPS_DATASET_IDX;
    snprintf(out->dir, sizeof out->dir, "%s", dir);
    return ZPS_OK;
}

zps_err zps_dataset_parse(const char *text, zps_dataset_spec *out)
{
    memset(out, 0, sizeof *out);
    if (strncmp(text, DATASET_SYNTHETIC, strlen(DATASET_SYNTHETIC)) == 0) {
        return s_parse_synthetic(text, out);
    }
    if (strncmp(text, DATASET_FASHION, strlen(DATASET_FASHION)) == 0) {
        return s_parse_fashion(text, out);
    }
    zps_log_error("dataset '%s': unknown; expected fashion-mnist[:DIR] or synthetic:N", text);
    return ZPS_EINVAL;
}

// ---------------------------------------------------------------- files

// Finds dir/base, or else dir/base.gz: a decompressed copy is mapped as is.
static zps_err s_idx_path(const char *dir, const char *base, char *out, size_t out_len)
{
    if (snprintf(out, out_len, "%s/%s", dir, base) >= (int)out_len) {
        zps_log_error("dataset %s/%s: path too long", dir, base);
        return ZPS_EINVAL;
    }
    if (access(out, R_OK) == 0) {
        return ZPS_OK;
    }
    if (snprintf(out, out_len, "%s/%s.gz", dir, base) >= (int)out_len) {
        zps_log_error("dataset %s/%s.gz: path too long", dir, base);
        return ZPS_EINVAL;
    }
    if (access(out, R_OK) == 0) {
        return ZPS_OK;
    }
    zps_log_error("dataset: neither %s/%s nor %s.gz is readable (HINT: apt-get install "
                  "dataset-fashion-mnist)",
                  dir, base, out);
    return ZPS_ENOENT;
}

// Record count of one file of dir, from its header.
static zps_err s_file_count(const char *dir, const char *base, uint32_t *n)
{
    char path[PATH_MAX];
    zps_err err = s_idx_path(dir, base, path, sizeof path);
    if (err != ZPS_OK) {
        return err;
    }
    return zps_idx_count(path, n);
}

// Record count of a split, refusing images and labels that disagree.
static zps_err s_split_count(const char *dir, int split, uint32_t *n)
{
    uint32_t n_images;
    uint32_t n_labels;
    zps_err err = s_file_count(dir, s_image_files[split], &n_images);
    if (err == ZPS_OK) {
        err = s_file_count(dir, s_label_files[split], &n_labels);
    }
    if (err == ZPS_OK && n_images != n_labels) {
        zps_log_error("dataset %s: %s has %u records but %s has %u", dir, s_image_files[split],
                      n_images, s_label_files[split], n_labels);
        err = ZPS_EINVAL;
    }
    *n = err == ZPS_OK ? n_images : 0;
    return err;
}

zps_err zps_dataset_counts(const zps_dataset_spec *spec, uint32_t *n_train, uint32_t *n_test)
{
    *n_train = 0;
    *n_test = 0;
    if (spec->kind == ZPS_DATASET_SYNTHETIC) {
        *n_train = spec->n_synthetic;
        *n_test = spec->n_synthetic / 6 > 0 ? spec->n_synthetic / 6 : 1;
        return spec->n_synthetic > 0 ? ZPS_OK : ZPS_EINVAL;
    }
    zps_err err = s_split_count(spec->dir, ZPS_SPLIT_TRAIN, n_train);
    if (err == ZPS_OK) {
        err = s_split_count(spec->dir, ZPS_SPLIT_TEST, n_test);
    }
    return err;
}

// ---------------------------------------------------------------- open

// Maps one file of the dataset's directory.
static zps_err s_open_file(const char *dir, const char *base, const char *cache_dir, zps_idx *out)
{
    char path[PATH_MAX];
    zps_err err = s_idx_path(dir, base, path, sizeof path);
    if (err != ZPS_OK) {
        return err;
    }
    return zps_idx_open(path, cache_dir, out);
}

// Refuses files that do not fit the model: a wrong record size would read
// past records, a label >= classes past the logits.
static zps_err s_check_split(const zps_dataset *d, const char *dir, int split)
{
    const zps_idx *im = &d->images[split];
    const zps_idx *lb = &d->labels[split];
    if (im->record_size != d->dim) {
        zps_log_error("dataset %s: %s records have %u bytes, the model takes %u inputs", dir,
                      s_image_files[split], im->record_size, d->dim);
        return ZPS_EINVAL;
    }
    if (lb->record_size != 1) {
        zps_log_error("dataset %s: %s records have %u bytes, expected one label byte", dir,
                      s_label_files[split], lb->record_size);
        return ZPS_EINVAL;
    }
    if (im->n != lb->n) {
        zps_log_error("dataset %s: %s has %u records but %s has %u", dir, s_image_files[split],
                      im->n, s_label_files[split], lb->n);
        return ZPS_EINVAL;
    }
    for (uint32_t i = 0; i < lb->n; i++) {
        if (lb->data[i] >= d->classes) {
            zps_log_error("dataset %s: %s record %u has label %u, the model has %u classes", dir,
                          s_label_files[split], i, lb->data[i], d->classes);
            return ZPS_EINVAL;
        }
    }
    return ZPS_OK;
}

static zps_err s_open_idx(zps_dataset *d, const char *dir, const char *cache_dir)
{
    for (int split = 0; split < 2; split++) {
        zps_err err = s_open_file(dir, s_image_files[split], cache_dir, &d->images[split]);
        if (err == ZPS_OK) {
            err = s_open_file(dir, s_label_files[split], cache_dir, &d->labels[split]);
        }
        if (err == ZPS_OK) {
            err = s_check_split(d, dir, split);
        }
        if (err != ZPS_OK) {
            return err;
        }
        d->n[split] = d->images[split].n;
    }
    return ZPS_OK;
}

// Draws the label map once: weights uniform in [-2^15, 2^15).
static zps_err s_open_synthetic(zps_dataset *d, const zps_dataset_spec *spec)
{
    if (spec->n_synthetic == 0 || d->dim > SYN_MAX_DIM) {
        zps_log_error("dataset synthetic:%u: needs N >= 1 and at most %u inputs (model has %u)",
                      spec->n_synthetic, SYN_MAX_DIM, d->dim);
        return ZPS_EINVAL;
    }
    size_t n_w = (size_t)d->classes * d->dim;
    d->weights = malloc(n_w * sizeof *d->weights);
    if (d->weights == NULL) {
        zps_log_error("dataset synthetic: no memory for a %u x %u label map", d->classes, d->dim);
        return ZPS_ENOMEM;
    }
    zps_rng rng;
    zps_rng_seed(&rng, d->seed, STREAM_SYN_WEIGHTS);
    for (size_t i = 0; i < n_w; i++) {
        d->weights[i] = (int32_t)(zps_rng_next(&rng) >> 48) - 32768;
    }
    uint32_t n_test = spec->n_synthetic / 6;
    d->n[ZPS_SPLIT_TRAIN] = spec->n_synthetic;
    d->n[ZPS_SPLIT_TEST] = n_test > 0 ? n_test : 1;
    return ZPS_OK;
}

zps_dataset *zps_dataset_open(const zps_dataset_spec *spec, const char *cache_dir, uint64_t seed,
                              uint32_t dim, uint32_t classes)
{
    if (dim == 0 || classes == 0) {
        zps_log_error("dataset: a model with %u inputs and %u classes cannot be fed", dim,
                      classes);
        return NULL;
    }
    zps_dataset *d = calloc(1, sizeof *d);
    if (d == NULL) {
        zps_log_error("dataset: out of memory");
        return NULL;
    }
    d->kind = spec->kind;
    d->dim = dim;
    d->classes = classes;
    d->seed = seed;
    zps_err err = spec->kind == ZPS_DATASET_SYNTHETIC ? s_open_synthetic(d, spec)
                                                      : s_open_idx(d, spec->dir, cache_dir);
    if (err != ZPS_OK) {
        zps_dataset_destroy(&d);
    }
    return d;
}

void zps_dataset_destroy(zps_dataset **d)
{
    if (*d == NULL) {
        return;
    }
    for (int split = 0; split < 2; split++) {
        zps_idx_close(&(*d)->images[split]);
        zps_idx_close(&(*d)->labels[split]);
    }
    free((*d)->weights);
    free(*d);
    *d = NULL;
}

uint32_t zps_dataset_size(const zps_dataset *d, zps_split split)
{
    return split == ZPS_SPLIT_TRAIN || split == ZPS_SPLIT_TEST ? d->n[split] : 0;
}

// ---------------------------------------------------------------- gather

static void s_gather_idx(const zps_dataset *d, zps_split split, uint32_t i, float *x,
                         uint32_t *label)
{
    const uint8_t *rec = d->images[split].data + (size_t)i * d->dim;
    for (uint32_t k = 0; k < d->dim; k++) {
        x[k] = (float)rec[k] / 255.0f;
    }
    *label = d->labels[split].data[i];
}

// Regenerates record i from its own stream; the label is the argmax of the
// label map applied to the centred input, in integers (first class on ties).
static void s_gather_synthetic(const zps_dataset *d, zps_split split, uint32_t i, float *x,
                               uint32_t *label)
{
    const float scale = 1.0f / (float)(1u << SYN_INPUT_BITS);
    zps_rng rng;
    zps_rng_seed(&rng, d->seed, STREAM_SYN_RECORD(split, i));
    for (uint32_t k = 0; k < d->dim; k++) {
        x[k] = (float)(zps_rng_next(&rng) >> (64 - SYN_INPUT_BITS)) * scale;
    }
    int64_t best = INT64_MIN;
    for (uint32_t c = 0; c < d->classes; c++) {
        const int32_t *w = d->weights + (size_t)c * d->dim;
        int64_t acc = 0;
        for (uint32_t k = 0; k < d->dim; k++) {
            int64_t u = (int64_t)(x[k] / scale) - SYN_INPUT_HALF; // exact: x is 24-bit
            acc += (int64_t)w[k] * u;
        }
        if (acc > best) {
            best = acc;
            *label = c;
        }
    }
}

zps_err zps_dataset_gather(const zps_dataset *d, zps_split split, const uint32_t *idx, uint32_t n,
                           float *x, uint32_t *labels)
{
    uint32_t size = zps_dataset_size(d, split);
    for (uint32_t r = 0; r < n; r++) {
        if (idx[r] >= size) {
            zps_log_error("dataset: record %u of split %d is out of range (%u records)", idx[r],
                          (int)split, size);
            return ZPS_ERANGE;
        }
    }
    for (uint32_t r = 0; r < n; r++) {
        float *row = x + (size_t)r * d->dim;
        if (d->kind == ZPS_DATASET_SYNTHETIC) {
            s_gather_synthetic(d, split, idx[r], row, &labels[r]);
        } else {
            s_gather_idx(d, split, idx[r], row, &labels[r]);
        }
    }
    return ZPS_OK;
}
