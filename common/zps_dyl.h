/* zps_dyl.h - DyLU, the inner step counts of --inner-steps auto.
 *
 * Workers of unlike speed each take a number of inner steps in proportion
 * to their speed (Dynamic Local Updates, Liu et al., "Asynchronous Local-SGD
 * Training for Language Modeling", 2024), so that an outer round costs about
 * the same wall time on every worker and the fast ones do not wait. The
 * fastest worker takes the base H, the one the user chose: a round lasts
 * what H steps last on the fastest worker, and no worker's inner optimizer
 * drifts further from theta_sync than H steps (with the one worker
 * slowed 2x, a round takes half the time of a fixed H; a mean of H instead
 * would let the fast ones run past H). Worker i takes
 *
 *     H_i = round(H * v_i / v_max), at least 1, at most H
 *
 * with v_i its measured inner steps per second; rounding to the nearest
 * (ties up) keeps each worker's round within half a step of the fastest
 * one's. The outer step weighs each delta by its samples (H_i times its
 * batch), so a slow worker's fewer steps also count less. */
#ifndef ZPS_DYL_H
#define ZPS_DYL_H

#include <stddef.h>
#include <stdint.h>

#include "zps_err.h"

// The inner steps of n workers into steps[0, n) from their speeds
// speed[0, n) (inner steps per second) and the base H (>= 1). A speed that
// is not a positive finite number means "not measured yet" (a worker that
// just joined): that worker takes H, and the others are scaled to the
// fastest measured one (all take H if none is measured). ZPS_EINVAL,
// unlogged and steps untouched, if H is 0.
zps_err zps_dyl_steps(uint32_t base_h, const double *speed, size_t n, uint32_t *steps);

#endif
