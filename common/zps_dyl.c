/* zps_dyl.c - DyLU: inner steps in proportion to each worker's speed. */
#include "zps_dyl.h"

#include <math.h>
#include <stdbool.h>

static bool s_measured(double v)
{
    return v > 0 && isfinite(v);
}

zps_err zps_dyl_steps(uint32_t base_h, const double *speed, size_t n, uint32_t *steps)
{
    if (base_h < 1) {
        return ZPS_EINVAL;
    }
    double v_max = 0;
    for (size_t i = 0; i < n; i++) {
        if (s_measured(speed[i]) && speed[i] > v_max) {
            v_max = speed[i];
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (!s_measured(speed[i])) {
            steps[i] = base_h;
            continue;
        }
        // speed[i] <= v_max: h in (0, H]; floor(h + 0.5) rounds ties up.
        double h = floor((double)base_h * (speed[i] / v_max) + 0.5);
        steps[i] = h < 1 ? 1 : h > base_h ? base_h : (uint32_t)h;
    }
    return ZPS_OK;
}
