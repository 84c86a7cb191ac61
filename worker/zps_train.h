/* zps_train.h - zps-worker's training loop: a client of libzps (include/zps.h).
 *
 * The built-in models (mlp:..., flat:P) on a backend (cpu, cuda[:N]) are
 * the "user code": this module asks the client for work items, loads each
 * piece's records, computes it, pushes each bucket as the backend finishes
 * it, evaluates at the epoch's end, and injects the faults tests ask for. */
#ifndef ZPS_TRAIN_H
#define ZPS_TRAIN_H

#include <stdbool.h>
#include <stdint.h>

#include "include/zps.h"
#include "worker/zps_cuda.h"

typedef struct zps_train_opts {
    const char *device;       // "cpu", "cuda" or "cuda:N"
    zps_gpu_math gpu_math;    // what cuBLAS may use on a GPU
    const char *cache_dir;    // decompressed datasets
    bool no_overlap;          // push after backward, not during (to measure the overlap)
    double slowdown;          // fault injection: compute takes this many times longer
    double stall_prob;        // fault injection: chance of a pause per step
    int stall_ms;             // fault injection: length of a pause
    uint64_t fault_seed;      // fault injection: draws which steps pause
} zps_train_opts;

typedef struct zps_train zps_train;

// The model, data and buffers of the job client c has joined (borrowed:
// it must outlive the loop's use, and be destroyed first, since ZeroMQ
// may hold the gradient). Caller owns the result; NULL on failure, logged.
zps_train *zps_train_new(zps_client *c, const zps_train_opts *opts);
// Runs the job to its end: ZPS_NEXT_DONE, ZPS_NEXT_OVER, ZPS_NEXT_STOPPED
// or ZPS_NEXT_ERROR (logged).
int zps_train_run(zps_train *t);
// The parameters (the final ones after ZPS_NEXT_DONE), n_params floats.
const float *zps_train_params(const zps_train *t, size_t *n_params);
void zps_train_destroy(zps_train **t);

#endif
