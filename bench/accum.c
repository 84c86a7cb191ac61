/* accum.c - what a deterministic shard's sum of micro-batch gradients
 * costs: the canonical fp32 tree against the default mode's double
 * accumulator and two order-independent integer accumulators (issue 29,
 * docs/choices.md).
 *
 * One bucket of P floats (669706 by default: the default model,
 * mlp:784-512-512-10) and 16 micro-batch gradients (leaves) of random
 * values whose magnitudes are log-uniform over 2^-27..2^7 (about 7e-9..128),
 * random signs, so that fp32 rounding depends on the order. A step, timed
 * with CLOCK_MONOTONIC, the median of REPS (31 by default) repetitions:
 *
 *   (a) tree   the leaves arrive one by one and are added pairwise up the
 *              canonical tree as server/shard/zps_nodes.c does (a node with
 *              no sibling in is copied and held; dst[i] = dst[i] + src[i]):
 *              8 copies and 15 adds per element; then root / 16.
 *   (b) double the default mode's s_accumulate: acc[i] = w * g[i] for the
 *              first push, acc[i] += w * g[i] after (double); then acc / W.
 *   (c1) int64 fixed point with one exponent for the bucket, set from the
 *              largest |g| of the step so that 16 values cannot overflow:
 *              q[i] += (int64)(g[i] * 2^k), truncated; then q * 2^-k to fp32.
 *              Order-independent, but not exact: bits below 2^-k are cut.
 *              (The scale is computed before the timed step: a real shard
 *              would have to be told it in advance.)
 *   (c2) exact a long accumulator per element: 9 int64 digits at weights
 *              2^(32j - 149), j = 0..8, covering fp32's whole range
 *              (2^-149..2^128, 277 bits) with carry-save headroom for 2^31
 *              adds; a float's 24-bit significand lands in two digits. The
 *              final carry pass and one correct rounding to fp32.
 *
 * Checks, PASS/FAIL: the tree's root is the same bits for the leaves pushed
 * one by one and for the split [0,5) + [5,16) pushed as canonical nodes in
 * reverse order; (c1) and (c2) are the same bits for two leaf orders; (c2)
 * equals the correctly rounded sum (a __float128 sum, exact for this data).
 * Also shown: how many elements a plain fp32 or the double accumulator
 * change between the two orders (why the issue exists).
 *
 *   accum [P [REPS]]
 *
 * One thread, like zps_nodes (the default mode's accumulate uses the
 * shard's pool of threads; here it runs on one). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LEAVES 16
#define LEVELS 5  // node sizes 1, 2, 4, 8, 16
#define DIGITS 9  // (c2): 32-bit digits from 2^-149
#define BUFS (LEVELS + 2)

typedef struct tree {
    size_t p;
    float *held[LEVELS][LEAVES];   // node (level, index)'s values, or NULL
    float *spare[BUFS];
    int n_spare, in_use, peak;     // buffers taken, and the most at once
} tree;

typedef struct bench {
    size_t p;
    float *leaf[LEAVES];
    int order[LEAVES];             // the order the leaves arrive in
    float *out;                    // a step's sum (before the mean)
    float *mean;
    tree t;
    double *acc;                   // (b)
    int64_t *q;                    // (c1)
    int k;                         // (c1): q = g * 2^k
    int64_t *d;                    // (c2): p x DIGITS
} bench;

static void *s_alloc(size_t bytes)
{
    void *x = malloc(bytes ? bytes : 1);
    if (!x) {
        fprintf(stderr, "accum: cannot allocate %zu bytes\n", bytes);
        exit(1);
    }
    return x;
}

static double s_pow2(int e) // 2^e, -1022 <= e <= 1023
{
    uint64_t bits = (uint64_t)(e + 1023) << 52;
    double x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

static uint64_t s_rand(uint64_t *st) // xorshift64*
{
    *st ^= *st >> 12;
    *st ^= *st << 25;
    *st ^= *st >> 27;
    return *st * 2685821657736338717ull;
}

// Random signs, exponents uniform in [-27, 6], significands uniform.
static void s_fill_leaves(bench *b)
{
    uint64_t st = 0x9e3779b97f4a7c15ull;
    for (int l = 0; l < LEAVES; l++) {
        for (size_t i = 0; i < b->p; i++) {
            uint64_t r = s_rand(&st);
            uint32_t e = (uint32_t)(127 - 27 + (r >> 32) % 34);
            uint32_t bits = (uint32_t)(r & 0x807fffffu) | e << 23;
            memcpy(&b->leaf[l][i], &bits, sizeof bits);
        }
    }
}

// ---------------------------------------------------------------- (a) tree

static tree s_tree_new(size_t p)
{
    tree t = {.p = p, .n_spare = BUFS};
    for (int j = 0; j < BUFS; j++) {
        t.spare[j] = s_alloc(p * sizeof(float));
    }
    return t;
}

static void s_tree_free(tree *t)
{
    for (int j = 0; j < t->n_spare; j++) {
        free(t->spare[j]);
    }
}

static float *s_take(tree *t)
{
    if (++t->in_use > t->peak) {
        t->peak = t->in_use;
    }
    return t->spare[--t->n_spare];
}

static void s_give(tree *t, float *x)
{
    t->in_use--;
    t->spare[t->n_spare++] = x;
}

static void s_add_f32(float *dst, const float *src, size_t n)
{
    for (size_t e = 0; e < n; e++) {
        dst[e] = dst[e] + src[e];
    }
}

// cur (a taken buffer, node (level, idx)) added into its held siblings up
// the tree, then held.
static void s_climb(tree *t, int level, int idx, float *cur)
{
    while (level < LEVELS - 1 && t->held[level][idx ^ 1]) {
        float *dst = t->held[level][idx ^ 1];
        t->held[level][idx ^ 1] = NULL;
        s_add_f32(dst, cur, t->p);
        s_give(t, cur);
        cur = dst;
        level++;
        idx >>= 1;
    }
    t->held[level][idx] = cur;
}

// A push of node (level, idx): into its held sibling, or copied and held.
static void s_tree_push(tree *t, int level, int idx, const float *src)
{
    if (level < LEVELS - 1 && t->held[level][idx ^ 1]) {
        float *dst = t->held[level][idx ^ 1];
        t->held[level][idx ^ 1] = NULL;
        s_add_f32(dst, src, t->p);
        s_climb(t, level + 1, idx >> 1, dst);
        return;
    }
    float *v = s_take(t);
    memcpy(v, src, t->p * sizeof *v);
    s_climb(t, level, idx, v);
}

// The root's values into out, its buffer given back.
static void s_tree_root(tree *t, float *out)
{
    float *root = t->held[LEVELS - 1][0];
    t->held[LEVELS - 1][0] = NULL;
    memcpy(out, root, t->p * sizeof *out);
    s_give(t, root);
}

static void s_mean(const bench *b, const float *sum)
{
    for (size_t i = 0; i < b->p; i++) {
        b->mean[i] = sum[i] / (float)LEAVES;
    }
}

static void m_tree(bench *b)
{
    for (int l = 0; l < LEAVES; l++) {
        s_tree_push(&b->t, 0, b->order[l], b->leaf[b->order[l]]);
    }
    s_tree_root(&b->t, b->out);
    s_mean(b, b->out);
}

// The root from the split [0,5) + [5,16): each worker adds its leaves up
// its own tree (w), which leaves its piece's canonical nodes held, (0,4)
// (4,1) and (5,1) (6,2) (8,8); the shard gets the second worker's nodes
// first, each worker's last node first.
static void s_tree_split(bench *b, tree *w, float *out)
{
    static const int cut[] = {LEAVES, 5, 0};
    for (int piece = 0; piece < 2; piece++) {
        for (int l = cut[piece + 1]; l < cut[piece]; l++) {
            s_tree_push(w, 0, l, b->leaf[l]);
        }
        for (int level = 0; level < LEVELS; level++) {
            for (int idx = LEAVES - 1; idx >= 0; idx--) {
                float *v = w->held[level][idx];
                if (v) {
                    s_tree_push(&b->t, level, idx, v);
                    w->held[level][idx] = NULL;
                    s_give(w, v);
                }
            }
        }
    }
    s_tree_root(&b->t, out);
}

// The most canonical nodes one piece [lo, hi) of the 16 leaves needs.
static int s_max_nodes(void)
{
    int most = 0;
    for (int lo = 0; lo < LEAVES; lo++) {
        for (int hi = lo + 1; hi <= LEAVES; hi++) {
            int n = 0;
            for (int at = lo; at < hi; n++) {
                int size = at ? (at & -at) : LEAVES;
                while (at + size > hi) {
                    size /= 2;
                }
                at += size;
            }
            most = n > most ? n : most;
        }
    }
    return most;
}

// ---------------------------------------------------------------- (b) double

static void m_double(bench *b)
{
    const double w = 8.0; // a push's weight: its samples (M = 8)
    for (int l = 0; l < LEAVES; l++) {
        const float *g = b->leaf[b->order[l]];
        if (l == 0) {
            for (size_t i = 0; i < b->p; i++) {
                b->acc[i] = w * (double)g[i];
            }
        } else {
            for (size_t i = 0; i < b->p; i++) {
                b->acc[i] += w * (double)g[i];
            }
        }
    }
    for (size_t i = 0; i < b->p; i++) {
        b->out[i] = (float)(b->acc[i] / w);
        b->mean[i] = (float)(b->acc[i] / (w * LEAVES));
    }
}

// ---------------------------------------------------------------- (c1) int64

// k such that 16 values below 2^(emax + 1) sum below 2^62 once scaled.
static int s_fixed_scale(const bench *b)
{
    uint32_t emax = 1;
    for (int l = 0; l < LEAVES; l++) {
        for (size_t i = 0; i < b->p; i++) {
            uint32_t bits;
            memcpy(&bits, &b->leaf[l][i], sizeof bits);
            uint32_t e = bits >> 23 & 0xff;
            emax = e > emax ? e : emax;
        }
    }
    return 62 - ((int)emax - 127 + 1 + 4);
}

static void m_fixed(bench *b)
{
    const double up = s_pow2(b->k), down = s_pow2(-b->k);
    for (int l = 0; l < LEAVES; l++) {
        const float *g = b->leaf[b->order[l]];
        if (l == 0) {
            for (size_t i = 0; i < b->p; i++) {
                b->q[i] = (int64_t)((double)g[i] * up);
            }
        } else {
            for (size_t i = 0; i < b->p; i++) {
                b->q[i] += (int64_t)((double)g[i] * up);
            }
        }
    }
    // int64 -> fp32 is one rounding; the scaling after it is exact.
    for (size_t i = 0; i < b->p; i++) {
        b->out[i] = (float)((double)(float)b->q[i] * down);
    }
    s_mean(b, b->out);
}

// ---------------------------------------------------------------- (c2) exact

// g[i] * 2^149, an integer below 2^277, added into element i's digits.
static void s_exact_add(int64_t *restrict d, const float *restrict g, size_t p)
{
    for (size_t i = 0; i < p; i++) {
        uint32_t bits;
        memcpy(&bits, &g[i], sizeof bits);
        uint32_t e = bits >> 23 & 0xff;
        uint64_t m = (bits & 0x7fffffu) | (e ? 1u << 23 : 0);
        uint32_t s = e ? e - 1 : 0; // Inf and NaN are not handled
        uint64_t v = m << (s & 31);
        int64_t neg = -(int64_t)(bits >> 31);
        int64_t lo = (int64_t)(v & 0xffffffffu), hi = (int64_t)(v >> 32);
        int64_t *dd = d + i * DIGITS + (s >> 5);
        dd[0] += (lo ^ neg) - neg;
        dd[1] += (hi ^ neg) - neg;
    }
}

// Carries: digits 0..7 into [0, 2^32), the top one signed.
static void s_exact_carry(int64_t *d)
{
    for (int j = 0; j < DIGITS - 1; j++) {
        int64_t c = d[j] >> 32; // arithmetic shift (GCC, Clang)
        d[j] -= c * 4294967296LL;
        d[j + 1] += c;
    }
}

static uint64_t s_digit(const int64_t *d, int j)
{
    return j >= 0 ? (uint64_t)d[j] : 0;
}

// One element's digits, correctly rounded to fp32 (to nearest, even).
static float s_exact_round(const int64_t *dig)
{
    int64_t d[DIGITS];
    memcpy(d, dig, sizeof d);
    s_exact_carry(d);
    int neg = d[DIGITS - 1] < 0;
    for (int j = 0; neg && j < DIGITS; j++) {
        d[j] = -d[j];
    }
    if (neg) {
        s_exact_carry(d);
    }
    int h = DIGITS - 1;
    while (h >= 0 && d[h] == 0) {
        h--;
    }
    if (h < 0) {
        return 0.0f;
    }
    // The top 64 bits, the top one set, and a sticky bit for the rest.
    int lz = __builtin_clzll(s_digit(d, h)) - 32;
    uint64_t m = ((s_digit(d, h) << 32 | s_digit(d, h - 1)) << lz) |
                 s_digit(d, h - 2) >> (32 - lz);
    uint64_t sticky = lz ? s_digit(d, h - 2) & ((1ull << (32 - lz)) - 1) : 0;
    for (int j = 0; j < h - 2; j++) {
        sticky |= (uint64_t)d[j];
    }
    m |= sticky != 0;
    // One rounding to 24 bits; the scaling is exact, and a value below
    // 2^-126 is a multiple of 2^-149 held exactly (m exact, no sticky).
    double x = (double)(float)m * s_pow2(32 * (h - 1) - lz - 149);
    return (float)(neg ? -x : x);
}

static void m_exact(bench *b)
{
    memset(b->d, 0, b->p * DIGITS * sizeof *b->d);
    for (int l = 0; l < LEAVES; l++) {
        s_exact_add(b->d, b->leaf[b->order[l]], b->p);
    }
    for (size_t i = 0; i < b->p; i++) {
        b->out[i] = s_exact_round(b->d + i * DIGITS);
    }
    s_mean(b, b->out);
}

// ---------------------------------------------------------------- checks

static void s_set_order(bench *b, int shuffled)
{
    for (int l = 0; l < LEAVES; l++) {
        b->order[l] = shuffled ? (7 * l + 3) % LEAVES : l;
    }
}

static int s_same_f32(const float *x, const float *y)
{
    uint32_t a, b;
    memcpy(&a, x, sizeof a);
    memcpy(&b, y, sizeof b);
    return a == b;
}

// Elements of a step's sum that differ between the leaves in order and
// shuffled; the in-order sum stays in first (if given).
static size_t s_diff_orders(bench *b, void (*method)(bench *), float *first)
{
    float *a = first ? first : s_alloc(b->p * sizeof *a);
    s_set_order(b, 0);
    method(b);
    memcpy(a, b->out, b->p * sizeof *a);
    s_set_order(b, 1);
    method(b);
    s_set_order(b, 0);
    size_t n = 0;
    for (size_t i = 0; i < b->p; i++) {
        n += !s_same_f32(&a[i], &b->out[i]);
    }
    if (!first) {
        free(a);
    }
    return n;
}

// Elements whose double sum (b) differs between the two orders (before
// the rounding to fp32, which hides most of them).
static size_t s_diff_double(bench *b)
{
    double *a = s_alloc(b->p * sizeof *a);
    s_set_order(b, 0);
    m_double(b);
    memcpy(a, b->acc, b->p * sizeof *a);
    s_set_order(b, 1);
    m_double(b);
    s_set_order(b, 0);
    size_t n = 0;
    for (size_t i = 0; i < b->p; i++) {
        uint64_t x, y;
        memcpy(&x, &a[i], sizeof x);
        memcpy(&y, &b->acc[i], sizeof y);
        n += x != y;
    }
    free(a);
    return n;
}

// Plain fp32 in leaf order, for the count of what order changes.
static void m_fp32(bench *b)
{
    for (size_t i = 0; i < b->p; i++) {
        float s = 0.0f;
        for (int l = 0; l < LEAVES; l++) {
            s += b->leaf[b->order[l]][i];
        }
        b->out[i] = s;
    }
}

// Elements of x that are not the correctly rounded sum of the leaves.
static size_t s_not_exact(const bench *b, const float *x)
{
    size_t n = 0;
    for (size_t i = 0; i < b->p; i++) {
        __float128 s = 0; // 113 bits: exact for sums of 2^-50..2^11
        for (int l = 0; l < LEAVES; l++) {
            s += b->leaf[l][i];
        }
        float r = (float)s;
        n += !s_same_f32(&r, &x[i]);
    }
    return n;
}

static const char *s_pass(int ok)
{
    return ok ? "PASS" : "FAIL";
}

// Prints the checks; 0 if all passed.
static int s_check(bench *b)
{
    float *x = s_alloc(b->p * sizeof *x), *y = s_alloc(b->p * sizeof *y);
    s_set_order(b, 0);
    m_tree(b);
    memcpy(x, b->out, b->p * sizeof *x);
    tree w = s_tree_new(b->p);
    s_tree_split(b, &w, y);
    s_tree_free(&w);
    int tree_ok = memcmp(x, y, b->p * sizeof *x) == 0;
    size_t fixed = s_diff_orders(b, m_fixed, NULL), fixed_inexact = s_not_exact(b, b->out);
    size_t exact = s_diff_orders(b, m_exact, y), exact_wrong = s_not_exact(b, y);
    size_t f32 = s_diff_orders(b, m_fp32, NULL), dbl = s_diff_orders(b, m_double, NULL);
    size_t dbl_acc = s_diff_double(b);
    printf("check: (a) tree, 16 leaves one by one vs split [0,5)+[5,16) as nodes: %s\n",
           s_pass(tree_ok));
    printf("check: (c1) int64, two leaf orders: %s (%zu of %zu differ); "
           "not the correctly rounded sum: %zu\n",
           s_pass(fixed == 0), fixed, b->p, fixed_inexact);
    printf("check: (c2) exact, two leaf orders: %s (%zu differ); correctly rounded: %s (%zu not)\n",
           s_pass(exact == 0), exact, s_pass(exact_wrong == 0), exact_wrong);
    printf("for reference, elements the two orders change: plain fp32 sum %zu, "
           "(b) double accumulator %zu in double, %zu once rounded to fp32 (of %zu)\n",
           f32, dbl_acc, dbl, b->p);
    free(x);
    free(y);
    return !(tree_ok && fixed == 0 && exact == 0 && exact_wrong == 0);
}

// ---------------------------------------------------------------- timing

static int s_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// The median ms of one step of method over reps repetitions.
static double s_time(bench *b, void (*method)(bench *), int reps)
{
    double *ms = s_alloc((size_t)reps * sizeof *ms);
    method(b); // warm: pages touched, buffers taken
    for (int r = 0; r < reps; r++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        method(b);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        ms[r] = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    }
    qsort(ms, (size_t)reps, sizeof *ms, s_cmp_double);
    double med = ms[reps / 2];
    free(ms);
    return med;
}

static void s_row(const bench *b, const char *name, double ms, int state, const char *wire,
                  const char *indep)
{
    printf("%-32s %8.2f %8.2f %6d  %-24s %s\n", name, ms,
           ms * 1e6 / ((double)b->p * LEAVES), state, wire, indep);
}

static void s_table(bench *b, int reps)
{
    s_set_order(b, 0);
    double ta = s_time(b, m_tree, reps), tb = s_time(b, m_double, reps);
    double tc1 = s_time(b, m_fixed, reps), tc2 = s_time(b, m_exact, reps);
    char wire[64];
    snprintf(wire, sizeof wire, "4 x 1..%d nodes", s_max_nodes());
    printf("\n%zu floats x %d leaves, median of %d steps\n", b->p, LEAVES, reps);
    printf("%-32s %8s %8s %6s  %-24s %s\n", "method", "ms/step", "ns/elem", "B/elem",
           "wire B/elem per worker", "order-independent");
    s_row(b, "(a) fp32 canonical tree", ta, 4 * b->t.peak, wire, "y (same tree)");
    s_row(b, "(b) double acc (default mode)", tb, 8, "4", "n");
    s_row(b, "(c1) int64, one exponent/bucket", tc1, 8, "8 (its int64 sum)", "y, not exact");
    s_row(b, "(c2) exact, 9 int64 digits", tc2, 8 * DIGITS, "72 (36 carried)", "y, exact");
    printf("ns/elem: per leaf element (ms / (P x %d)); B/elem: the shard's state per element "
           "(tree: the most node buffers held at once in this order)\n", LEAVES);
}

int main(int argc, char **argv)
{
    bench b = {.p = argc > 1 ? strtoul(argv[1], NULL, 10) : 669706};
    long reps = argc > 2 ? strtol(argv[2], NULL, 10) : 31;
    if (b.p == 0 || reps < 1 || reps > 100000) {
        fprintf(stderr, "usage: accum [P [REPS]]\n");
        return 2;
    }
    for (int l = 0; l < LEAVES; l++) {
        b.leaf[l] = s_alloc(b.p * sizeof(float));
    }
    b.t = s_tree_new(b.p);
    b.out = s_alloc(b.p * sizeof *b.out);
    b.mean = s_alloc(b.p * sizeof *b.mean);
    b.acc = s_alloc(b.p * sizeof *b.acc);
    b.q = s_alloc(b.p * sizeof *b.q);
    b.d = s_alloc(b.p * DIGITS * sizeof *b.d);
    s_fill_leaves(&b);
    b.k = s_fixed_scale(&b);
    int rc = s_check(&b);
    s_table(&b, (int)reps);
    return rc;
}
