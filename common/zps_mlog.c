/* zps_mlog.c - the metrics log's keys and the writers of its members. */
#include "zps_mlog.h"

static const char *const s_names[ZPS_MLOG_N_KEYS] = {
    [ZPS_MLOG_STEP] = "step",
    [ZPS_MLOG_EPOCH] = "epoch",
    [ZPS_MLOG_LOSS] = "loss",
    [ZPS_MLOG_SAMPLES] = "samples",
    [ZPS_MLOG_STEP_MS] = "step_ms",
    [ZPS_MLOG_PLAN] = "plan",
    [ZPS_MLOG_REPLANS] = "replans",
    [ZPS_MLOG_GRAD_NORM] = "grad_norm",
    [ZPS_MLOG_COUNTED] = "counted",
    [ZPS_MLOG_WORKERS] = "workers",
    [ZPS_MLOG_RANK] = "rank",
    [ZPS_MLOG_LAG_MS] = "lag_ms",
    [ZPS_MLOG_COMPUTE_MS] = "compute_ms",
    [ZPS_MLOG_TEST_ACCURACY] = "test_accuracy",
    [ZPS_MLOG_TEST_LOSS] = "test_loss",
    [ZPS_MLOG_INNER_STEPS] = "inner_steps",
    [ZPS_MLOG_INNER_SAMPLES] = "inner_samples",
    [ZPS_MLOG_DELTA_NORM] = "delta_norm",
    [ZPS_MLOG_BYTES] = "bytes",
    [ZPS_MLOG_FRAGMENT] = "fragment",
};

const char *zps_mlog_name(zps_mlog_key k)
{
    return k < ZPS_MLOG_N_KEYS ? s_names[k] : "?";
}

void zps_mlog_key_only(FILE *f, bool first, zps_mlog_key k)
{
    fprintf(f, "%s\"%s\":", first ? "" : ",", zps_mlog_name(k));
}

void zps_mlog_uint(FILE *f, bool first, zps_mlog_key k, uint64_t v)
{
    zps_mlog_key_only(f, first, k);
    fprintf(f, "%llu", (unsigned long long)v);
}

void zps_mlog_real(FILE *f, bool first, zps_mlog_key k, double v, int decimals)
{
    zps_mlog_key_only(f, first, k);
    fprintf(f, "%.*f", decimals, v);
}
