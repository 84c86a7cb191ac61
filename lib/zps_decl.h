/* zps_decl.h - the model a libzps caller declares (zps_declare_tensor) for
 * a job whose server runs --model external, and its dataset's sizes: what
 * the HELLO carries. The caller's calls build it; zps_layout checks it. */
#ifndef ZPS_DECL_H
#define ZPS_DECL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/zps_err.h"
#include "proto/zps.pb-c.h"

typedef struct zps_decl {
    Zps__Layout layout;   // its tensors point into the arrays below
    Zps__Tensor **tensors; // owned: each tensor, its name and shape owned
    size_t cap;
    uint32_t n_train, n_test; // the dataset's records
    bool has_dataset;         // zps_decl_dataset called
} zps_decl;

// An empty declaration; zps_decl_fini frees what the calls added.
void zps_decl_init(zps_decl *d);
void zps_decl_fini(zps_decl *d);
// Appends a tensor (name copied, ndim 0..ZPS_LAYOUT_MAX_DIMS, every
// dimension at least 1). ZPS_EINVAL with the reason in why; ZPS_ENOMEM.
zps_err zps_decl_tensor(zps_decl *d, const char *name, int ndim, const int64_t *shape,
                        char *why, size_t len);
// The dataset behind the job's permutation: n_train >= 1 train records.
zps_err zps_decl_dataset(zps_decl *d, uint32_t n_train, uint32_t n_test, char *why, size_t len);
// Whether any tensor was declared.
bool zps_decl_any(const zps_decl *d);

#endif
