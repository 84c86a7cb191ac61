/* zps_groups.h - a declared model's parameter groups and buffers (torch's
 * param_groups; docs/optimizers.md), as the shards apply them.
 *
 * A layout (Zps__Layout) may declare groups (each an Optim: the job's one
 * kind, and its own lr, momentum, nesterov, weight_decay, betas, eps) and
 * give each tensor a group and a role: a parameter of its group, or a
 * buffer (no optimizer) whose new value is the sample-weighted mean of the
 * pushed values (averaged) or the value pushed for the slice that holds
 * sample 0 (broadcast, as DDP broadcasts rank 0's buffers). A layout
 * without groups is every tensor a parameter of the job's flags. The
 * shards cut the layout to their range (zps_groups_build): an element's
 * update depends on its tensor alone, so the bits do not depend on the
 * number of shards. Socket-free. */
#ifndef ZPS_GROUPS_H
#define ZPS_GROUPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/zps.pb-c.h"
#include "zps_err.h"
#include "zps_optim.h"

#define ZPS_GROUPS_MAX 256 // parameter groups of a layout
// Floats of a learning-rate table (steps * groups): 4 MiB, so that the
// INIT header carrying it stays inside a frame (ZPS_WIRE_MAX_MSG_BYTES).
#define ZPS_GROUPS_MAX_TABLE (1u << 20)

// What a tensor is. The numbers travel in Tensor.role: never renumber.
typedef enum zps_tensor_role {
    ZPS_ROLE_PARAM = 0,     // a parameter of its group
    ZPS_ROLE_AVERAGE = 1,   // a buffer: the sample-weighted mean of the pushed values
    ZPS_ROLE_BROADCAST = 2, // a buffer: the value pushed for the slice holding sample 0
} zps_tensor_role;

// Elements [lo, hi) of a shard's range (0 is the range's first) of one
// role and group: a tensor cut to the range, or neighbours alike merged.
typedef struct zps_seg {
    uint64_t lo, hi;
    uint32_t group; // ZPS_ROLE_PARAM: an index of zps_groups.cfg
    uint32_t role;  // zps_tensor_role
} zps_seg;

typedef struct zps_groups {
    int n;            // groups (0: none declared, the job's cfg for every element)
    zps_optim_cfg *cfg; // owned: n settings, the job's schedule in each
    size_t n_segs;    // 0: no groups and no buffers, one update for the whole range
    zps_seg *segs;    // owned: in order, tiling the range
    bool broadcast;   // a broadcast buffer lies in the range
} zps_groups;

// Whether l's groups and roles are well-formed: at most ZPS_GROUPS_MAX
// groups of one kind, each valid as zps_optim_validate has it; every
// tensor's role 0..2 and group below the groups (0 without any).
// ZPS_EINVAL with one line in why naming the group or tensor and field.
zps_err zps_groups_check(const Zps__Layout *l, char *why, size_t len);

// Whether l declares groups or buffers (else the job's flags are all).
bool zps_groups_declared(const Zps__Layout *l);

// A group as settings: its kind, lr, momentum, nesterov, weight decay,
// betas, eps, with base's schedule (warm-up, steps, step size, gamma).
zps_optim_cfg zps_groups_cfg(const Zps__Optim *g, const zps_optim_cfg *base);

// False when every group of l has the settings of flags (the fields its
// kind uses); true with one line in why naming the first difference, for a
// server whose optimizer flags were given.
bool zps_groups_differ_flags(const Zps__Layout *l, const zps_optim_cfg *flags, char *why,
                             size_t len);

// False when two layouts (of the same tensors) declare the same groups and
// the same group and role for each tensor; true with why naming the first
// difference.
bool zps_groups_differ(const Zps__Layout *ours, const Zps__Layout *theirs, char *why,
                       size_t len);

// Range [lo, hi) of checked layout l (NULL: none) cut into segments, the
// groups' settings over base. ZPS_ENOMEM. zps_groups_fini frees; safe on
// a zeroed g.
zps_err zps_groups_build(zps_groups *g, const Zps__Layout *l, const zps_optim_cfg *base,
                         uint64_t lo, uint64_t hi);
void zps_groups_fini(zps_groups *g);

// Whether a learning-rate table of `groups` columns and `steps` rows
// (n_lr floats) fits a job of `want` groups (1 without any): sizes agree,
// every value finite and >= 0. ZPS_EINVAL with one line in why.
zps_err zps_groups_check_table(uint32_t groups, uint64_t steps, const float *lr, size_t n_lr,
                               uint32_t want, char *why, size_t len);

#endif
