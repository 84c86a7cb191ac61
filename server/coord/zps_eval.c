/* zps_eval.c - gathers an epoch's evaluation; each test record once. */
#include "zps_eval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_log.h"
#include "common/zps_mlog.h"

struct zps_eval {
    uint32_t n_test;     // records per epoch
    FILE *metrics;       // borrowed, or NULL
    uint64_t epoch;      // epoch being gathered, UINT64_MAX if none
    uint64_t correct;    // sum over members so far
    double loss_sum;
    uint64_t count;
    uint8_t *seen;       // owned: a bit per test record counted
    uint64_t last_done;  // the newest complete epoch, UINT64_MAX if none
    double accuracy;     // of last_done, -1 before
};

zps_eval *zps_eval_new(uint32_t n_test, FILE *metrics)
{
    zps_eval *e = calloc(1, sizeof *e);
    if (e && !(e->seen = calloc(n_test / 8 + 1, 1))) {
        free(e);
        e = NULL;
    }
    if (!e) {
        zps_log_error("evaluation: out of memory");
        return NULL;
    }
    e->n_test = n_test;
    e->metrics = metrics;
    e->epoch = e->last_done = UINT64_MAX;
    e->accuracy = -1;
    return e;
}

void zps_eval_destroy(zps_eval **ep)
{
    if (*ep) {
        free((*ep)->seen);
        free(*ep);
        *ep = NULL;
    }
}

static void s_complete(zps_eval *e)
{
    if (e->count == 0) { // a job without test records: an epoch ends, nothing was measured
        zps_log_info("epoch %llu: no test records to evaluate", (unsigned long long)e->epoch);
        e->last_done = e->epoch;
        e->epoch = UINT64_MAX;
        return;
    }
    double acc = (double)e->correct / (double)e->count;
    double loss = e->loss_sum / (double)e->count;
    e->accuracy = acc;
    zps_log_info("epoch %llu: test accuracy %.4f, test loss %.4f",
                 (unsigned long long)e->epoch, acc, loss);
    if (e->metrics) {
        fputc('{', e->metrics);
        zps_mlog_uint(e->metrics, true, ZPS_MLOG_EPOCH, e->epoch);
        zps_mlog_real(e->metrics, false, ZPS_MLOG_TEST_ACCURACY, acc, 6);
        zps_mlog_real(e->metrics, false, ZPS_MLOG_TEST_LOSS, loss, 6);
        fputs("}\n", e->metrics);
        fflush(e->metrics);
    }
    e->last_done = e->epoch;
    e->epoch = UINT64_MAX;
}

// Whether a test record of [lo, hi) was counted already; if not, marks
// them all.
static bool s_seen(zps_eval *e, uint32_t lo, uint32_t hi)
{
    for (uint32_t i = lo; i < hi; i++) {
        if (e->seen[i / 8] & (1u << (i % 8))) {
            return true;
        }
    }
    for (uint32_t i = lo; i < hi; i++) {
        e->seen[i / 8] |= (uint8_t)(1u << (i % 8));
    }
    return false;
}

// A new epoch's results begin: the one being gathered, if any, is given up.
static void s_begin(zps_eval *e, uint64_t epoch)
{
    if (e->epoch != UINT64_MAX) {
        zps_log_warn("epoch %llu: evaluation incomplete (%llu of %u records)",
                     (unsigned long long)e->epoch, (unsigned long long)e->count, e->n_test);
    }
    e->epoch = epoch;
    e->correct = e->count = 0;
    e->loss_sum = 0;
    memset(e->seen, 0, e->n_test / 8 + 1);
}

zps_err zps_eval_take(zps_eval *e, const Zps__Eval *ev)
{
    if (!ev || ev->count > e->n_test || ev->offset > e->n_test - ev->count ||
        ev->correct > ev->count || !isfinite(ev->loss_sum)) {
        zps_log_warn("dropped an EVAL without a valid body");
        return ZPS_EPROTO;
    }
    if (e->last_done != UINT64_MAX && ev->epoch <= e->last_done) {
        return ZPS_OK; // a second copy of records of an epoch already complete
    }
    if (e->epoch != ev->epoch) {
        s_begin(e, ev->epoch);
    }
    if (s_seen(e, (uint32_t)ev->offset, (uint32_t)(ev->offset + ev->count))) {
        zps_log_debug("epoch %llu: test records [%llu, %llu) came twice; the first copy counts",
                      (unsigned long long)ev->epoch, (unsigned long long)ev->offset,
                      (unsigned long long)(ev->offset + ev->count));
        return ZPS_OK;
    }
    e->correct += ev->correct;
    e->loss_sum += ev->loss_sum;
    e->count += ev->count;
    if (e->count >= e->n_test) {
        s_complete(e);
    }
    return ZPS_OK;
}

double zps_eval_accuracy(const zps_eval *e)
{
    return e->accuracy;
}
