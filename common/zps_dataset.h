/* zps_dataset.h - the datasets a job can name, and their records as floats.
 *
 *   fashion-mnist[:DIR]  the IDX files of Debian's dataset-fashion-mnist
 *                        (default DIR /usr/share/datasets/fashion-mnist)
 *   synthetic:N          N train records (and N/6, at least 1, test records)
 *                        generated from (seed, index): inputs uniform in
 *                        [0,1), label the argmax of a fixed random linear map
 *                        of the input, so it is learnable
 *
 * The coordinator only needs the record counts (zps_dataset_counts); workers
 * open the dataset and gather the records of their slices. */
#ifndef ZPS_DATASET_H
#define ZPS_DATASET_H

#include <stdint.h>

#include "zps_err.h"
#include "zps_idx.h"

typedef enum zps_split {
    ZPS_SPLIT_TRAIN = 0,
    ZPS_SPLIT_TEST = 1,
} zps_split;

typedef enum zps_dataset_kind {
    ZPS_DATASET_IDX = 0,       // fashion-mnist files
    ZPS_DATASET_SYNTHETIC = 1, // generated
} zps_dataset_kind;

typedef struct zps_dataset_spec {
    zps_dataset_kind kind;  // which of the two
    char dir[256];          // IDX: directory of the four files
    uint32_t n_synthetic;   // synthetic: train records
} zps_dataset_spec;

// Parses the dataset name of a job. Logs the reason on failure.
zps_err zps_dataset_parse(const char *text, zps_dataset_spec *out);
// Train and test record counts (IDX: read from the files' headers only).
zps_err zps_dataset_counts(const zps_dataset_spec *spec, uint32_t *n_train, uint32_t *n_test);

typedef struct zps_dataset zps_dataset;

// Opens a dataset for a model with `dim` inputs and `classes` outputs; an
// IDX dataset whose record size or label range does not match is refused.
// seed drives synthetic data. Caller owns the result; NULL on failure, logged.
zps_dataset *zps_dataset_open(const zps_dataset_spec *spec, const char *cache_dir, uint64_t seed,
                              uint32_t dim, uint32_t classes);
void zps_dataset_destroy(zps_dataset **d);

uint32_t zps_dataset_size(const zps_dataset *d, zps_split split);

// Writes records idx[0..n) of a split into x (n, dim) as floats in [0, 1]
// (IDX bytes / 255) and their labels. ZPS_ERANGE if an index is out of range.
zps_err zps_dataset_gather(const zps_dataset *d, zps_split split, const uint32_t *idx, uint32_t n,
                           float *x, uint32_t *labels);

#endif
