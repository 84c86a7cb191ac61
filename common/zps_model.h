/* zps_model.h - the model spec shared by server and workers.
 *
 * The server knows parameters only as one flat float vector; the spec says
 * how that vector is laid out (layer by layer, weights then bias, weights
 * row-major as (out, in) like PyTorch's nn.Linear) and what its initial
 * values are, so every process derives the same vector from the same seed. */
#ifndef ZPS_MODEL_H
#define ZPS_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zps_err.h"

#define ZPS_MODEL_MAX_LAYERS 16
#define ZPS_MODEL_MAX_WIDTH (1u << 20)
// flat:P models are cut into buckets of this many elements (256 KiB of
// fp32), or into ZPS_MODEL_MAX_BUCKETS equal ones when P is larger: small
// buckets let a shard send one back while the next ones still arrive, and
// a step's pipeline fills and drains in about two buckets' time on each
// link (bench/cluster, 16 M parameters on emulated 250 Mbit/s hosts: 1.15 x
// the link bound with 1 MiB buckets, 1.10 x with 256 KiB ones).
#define ZPS_MODEL_FLAT_BUCKET (1u << 16)
#define ZPS_MODEL_MAX_FLAT (64u << 20)
#define ZPS_MODEL_MAX_BUCKETS 256

typedef enum zps_model_kind {
    ZPS_MODEL_MLP = 0,      // mlp:D0-D1-...-Dk, trained on data
    ZPS_MODEL_FLAT = 1,     // flat:P, P parameters whose gradient costs nothing (benchmarks)
    ZPS_MODEL_EXTERNAL = 2, // declared by the workers (common/zps_layout.h), computed by them
} zps_model_kind;

typedef struct zps_layer_spec {
    uint32_t in;   // input features
    uint32_t out;  // output features
    size_t w_off;  // offset of W (out, in) in the flat vector
    size_t b_off;  // offset of b (out) in the flat vector
} zps_layer_spec;

typedef struct zps_model_spec {
    char text[128];                                // the spec as given, e.g. "mlp:784-512-512-10"
    zps_model_kind kind;                           // mlp or flat
    int n_layers;                                  // linear layers; ReLU between them (0: flat)
    zps_layer_spec layers[ZPS_MODEL_MAX_LAYERS];   // in forward order
    size_t n_params;                               // length of the flat vector
    int n_cuts;                                    // external: buckets
    uint64_t cuts[ZPS_MODEL_MAX_BUCKETS + 1];      // external: bucket i is [cuts[i+1], cuts[i])
} zps_model_spec;

// Parses "mlp:D0-D1-...-Dk" (k >= 1 layers) or "flat:P" (1 <= P <=
// ZPS_MODEL_MAX_FLAT). Logs the reason on failure. (An external model's
// spec comes from its layout: zps_layout_model.)
zps_err zps_model_parse(const char *text, zps_model_spec *out);

// Input features and classes of an MLP (0 for a flat model).
static inline uint32_t zps_model_inputs(const zps_model_spec *m)
{
    return m->n_layers ? m->layers[0].in : 0;
}

static inline uint32_t zps_model_classes(const zps_model_spec *m)
{
    return m->n_layers ? m->layers[m->n_layers - 1].out : 0;
}

// Writes the initial flat vector (n_params floats): He-normal weights,
// N(0, 2/in), and zero biases, drawn in flat order from the seed; zeros
// for a flat model, and for an external one until rank 0's values come.
void zps_model_init_params(const zps_model_spec *m, uint64_t seed, float *params);
// The same values for [lo, hi) only (out holds hi - lo floats), without
// the memory of the whole vector: a shard initialises its own range.
void zps_model_init_range(const zps_model_spec *m, uint64_t seed, uint64_t lo, uint64_t hi,
                          float *out);

// Buckets are the units of pushing and updating: a layer's weights and
// bias (a flat model: see ZPS_MODEL_FLAT_BUCKET), numbered in the
// order backward finishes them, last layer first. Workers push a bucket as
// soon as its gradient is final; shards update it as soon as every member
// pushed it.
int zps_model_n_buckets(const zps_model_spec *m);
// The range [*lo, *hi) of bucket i of the flat vector.
void zps_model_bucket(const zps_model_spec *m, int i, uint64_t *lo, uint64_t *hi);
// The order to push n (1..ZPS_MODEL_MAX_BUCKETS) buckets in when all are
// final at once (a flat model, --no-overlap), into order[0..n): indices
// bit-reversed, those past n skipped. Every prefix of it is spread evenly
// over the vector, so every shard's contiguous range gets its share of
// the pushes from the first on. In bucket order every worker's first
// quarter went to one shard, whose link took it while the others idled
// (docs/choices.md, "Pushes spread over the shards").
void zps_model_spread_order(int n, int *order);

typedef struct zps_bucket {
    uint64_t lo, hi; // a range of the flat vector
} zps_bucket;

// A set of bucket indices (0..ZPS_MODEL_MAX_BUCKETS-1): which buckets a
// step has pushed, received or sent. Zero-initialised means empty.
typedef struct zps_bucket_set {
    uint64_t bits[ZPS_MODEL_MAX_BUCKETS / 64];
} zps_bucket_set;

static inline void zps_bucket_set_add(zps_bucket_set *s, int b)
{
    s->bits[b / 64] |= 1ull << (b % 64);
}

static inline void zps_bucket_set_remove(zps_bucket_set *s, int b)
{
    s->bits[b / 64] &= ~(1ull << (b % 64));
}

static inline bool zps_bucket_set_has(const zps_bucket_set *s, int b)
{
    return (s->bits[b / 64] >> (b % 64)) & 1u;
}

// True if the set holds every bucket of 0..n-1.
static inline bool zps_bucket_set_full(const zps_bucket_set *s, int n)
{
    for (int b = 0; b < n; b++) {
        if (!zps_bucket_set_has(s, b)) {
            return false;
        }
    }
    return true;
}

// The buckets as a shard of [lo, hi) sees them: each cut to the range,
// empty ones left out, in bucket order. Returns how many (at most
// ZPS_MODEL_MAX_BUCKETS, which zps_model_parse guarantees).
int zps_model_range_buckets(const zps_model_spec *m, uint64_t lo, uint64_t hi, zps_bucket *out);

// The range of shard i of n: contiguous, balanced by bytes (every element
// has the same size), not aligned to layers.
void zps_model_shard_range(size_t n_params, uint32_t i, uint32_t n, uint64_t *lo, uint64_t *hi);

#endif
