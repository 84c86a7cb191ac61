/* zps_eval.h - an epoch's test-set evaluation, gathered from the workers.
 *
 * Each worker evaluates the test records that match the samples it
 * computed at the epoch's last step, pieces of late slices included, so a
 * record can come twice (from a late slice's owner and from its helpers):
 * the first copy counts, as with gradients. An epoch is complete when
 * every test record was counted once; its result is logged and written to
 * the metrics log. Socket-free; the coordinator owns one. */
#ifndef ZPS_EVAL_H
#define ZPS_EVAL_H

#include <stdint.h>
#include <stdio.h>

#include "common/zps_err.h"
#include "common/zps_wire.h"

typedef struct zps_eval zps_eval;

// n_test records per epoch; metrics (borrowed, may be NULL) gets a line
// per complete epoch. NULL on failure (logged).
zps_eval *zps_eval_new(uint32_t n_test, FILE *metrics);
void zps_eval_destroy(zps_eval **e);

// Counts one worker's EVAL. ZPS_EPROTO (logged, nothing changed) for a
// body that is missing or names records past the test set, more right
// answers than records or a loss that is not finite.
zps_err zps_eval_take(zps_eval *e, const Zps__Eval *ev);

// The newest complete epoch's test accuracy, -1 before any.
double zps_eval_accuracy(const zps_eval *e);

#endif
