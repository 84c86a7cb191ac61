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
    Zps__Optim **groups;      // owned: the parameter groups (layout.groups points here)
    bool announces_table;     // HELLO says a learning-rate table comes with INIT
    Zps__Schedule table;      // the table INIT carries (n_lr 0: none); lr owned
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
// Parameter group `group` (0..n: n appends one, below n replaces it) of
// kind ZPS_OPTIM_*, with torch's hyperparameters. ZPS_EINVAL; ZPS_ENOMEM.
zps_err zps_decl_group(zps_decl *d, int group, const Zps__Optim *settings, char *why,
                       size_t len);
// A declared tensor's group, or role (zps_tensor_role) with group 0.
// ZPS_EINVAL when no tensor has that name.
zps_err zps_decl_tensor_is(zps_decl *d, const char *name, int group, int role, char *why,
                           size_t len);
// The learning-rate table, copied (checked as zps_groups_check_table does
// against the groups declared). ZPS_EINVAL; ZPS_ENOMEM.
zps_err zps_decl_table(zps_decl *d, uint32_t groups, uint64_t steps, const float *lr,
                       char *why, size_t len);
// Whether any tensor was declared.
bool zps_decl_any(const zps_decl *d);

#endif
