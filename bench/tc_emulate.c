/*
 * bench/tc_emulate.c - how far tensor-core GEMMs may move the gradients of
 * the default MLP (784-512-512-10, batch 64), without a GPU: every GEMM's
 * inputs are rounded to a mantissa of BITS bits (10: tf32, 7: bf16; round
 * to nearest even) and accumulated in fp32, against the same step in
 * double. Prints, per seed and layer, the largest |difference| over the
 * largest |gradient| ("max") and ||difference|| over ||gradient|| ("norm").
 * The cuda unit test's bounds for --gpu-math tf32|bf16 come from this.
 *
 *   cc -O2 -o build/tc_emulate bench/tc_emulate.c -lm
 *   build/tc_emulate BITS SEEDS      (BITS 23: plain fp32, for a check)
 *
 * Model and data as in tests/worker/check_cuda.c: He-normal weights, biases
 * N(0, 0.1), inputs N(0, 1), uniform labels; its own generator, so the
 * figures are statistics, not the test's exact numbers.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { LAYERS = 3, BATCH = 64 };
static const int dims[LAYERS + 1] = {784, 512, 512, 10};

typedef struct net {
    double *w[LAYERS], *b[LAYERS];   // parameters (fp32 values)
    double *z[LAYERS], *a[LAYERS + 1]; // pre-activations, activations (a[0] = x)
    double *dz[LAYERS], *dw[LAYERS], *db[LAYERS];
    int labels[BATCH];
} net;

typedef struct arith {
    int bits;     // mantissa bits of GEMM inputs; 52 = double
    int fp32_acc; // accumulate in fp32
} arith;

static uint64_t s_state;

static double s_uniform(void)
{
    s_state ^= s_state << 13;
    s_state ^= s_state >> 7;
    s_state ^= s_state << 17;
    return (double)(s_state >> 11) * (1.0 / 9007199254740992.0);
}

static double s_normal(void)
{
    double u = s_uniform() + 1e-300, v = s_uniform();
    return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

// x rounded to a float with `bits` mantissa bits, to nearest even.
static double s_round(const arith *ar, double x)
{
    if (ar->bits >= 52) {
        return x;
    }
    float f = (float)x;
    if (ar->bits >= 23 || !isfinite(f)) {
        return f;
    }
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    int drop = 23 - ar->bits;
    uint32_t lsb = (u >> drop) & 1u;
    u = (u + (1u << (drop - 1)) - 1u + lsb) & ~((1u << drop) - 1u);
    memcpy(&f, &u, sizeof f);
    return f;
}

static double s_add(const arith *ar, double acc, double p)
{
    return ar->fp32_acc ? (double)(float)(acc + p) : acc + p;
}

static void s_forward(net *n, const arith *ar)
{
    for (int l = 0; l < LAYERS; l++) {
        int in = dims[l], out = dims[l + 1];
        for (int k = 0; k < BATCH; k++) {
            for (int o = 0; o < out; o++) {
                double s = 0.0;
                for (int i = 0; i < in; i++) {
                    s = s_add(ar, s, s_round(ar, n->a[l][k * in + i]) * s_round(ar, n->w[l][o * in + i]));
                }
                s = s_add(ar, s, n->b[l][o]);
                n->z[l][k * out + o] = s;
                n->a[l + 1][k * out + o] = l < LAYERS - 1 && s < 0.0 ? 0.0 : s;
            }
        }
    }
}

// Softmax cross-entropy's gradient (mean over the batch), then backward.
static void s_backward(net *n, const arith *ar)
{
    int out = dims[LAYERS];
    for (int k = 0; k < BATCH; k++) {
        const double *z = &n->z[LAYERS - 1][k * out];
        double m = z[0], s = 0.0;
        for (int o = 1; o < out; o++) {
            m = z[o] > m ? z[o] : m;
        }
        for (int o = 0; o < out; o++) {
            s += exp(z[o] - m);
        }
        for (int o = 0; o < out; o++) {
            n->dz[LAYERS - 1][k * out + o] = (exp(z[o] - m) / s - (o == n->labels[k])) / BATCH;
        }
    }
    for (int l = LAYERS - 1; l >= 0; l--) {
        int in = dims[l], o_n = dims[l + 1];
        for (int o = 0; o < o_n; o++) {
            double sb = 0.0;
            for (int k = 0; k < BATCH; k++) {
                sb = s_add(ar, sb, n->dz[l][k * o_n + o]);
            }
            n->db[l][o] = sb;
            for (int i = 0; i < in; i++) {
                double t = 0.0;
                for (int k = 0; k < BATCH; k++) {
                    t = s_add(ar, t, s_round(ar, n->dz[l][k * o_n + o]) * s_round(ar, n->a[l][k * in + i]));
                }
                n->dw[l][o * in + i] = t;
            }
        }
        for (int k = 0; l > 0 && k < BATCH; k++) {
            for (int i = 0; i < in; i++) {
                double t = 0.0;
                for (int o = 0; o < o_n; o++) {
                    t = s_add(ar, t, s_round(ar, n->dz[l][k * o_n + o]) * s_round(ar, n->w[l][o * in + i]));
                }
                n->dz[l - 1][k * in + i] = n->z[l - 1][k * in + i] > 0.0 ? t : 0.0;
            }
        }
    }
}

static double *s_alloc(size_t count)
{
    double *p = calloc(count, sizeof *p);
    if (!p) {
        fprintf(stderr, "tc_emulate: out of memory\n");
        exit(1);
    }
    return p;
}

static void s_net_init(net *n)
{
    n->a[0] = s_alloc((size_t)BATCH * dims[0]);
    for (int l = 0; l < LAYERS; l++) {
        size_t nw = (size_t)dims[l] * dims[l + 1], na = (size_t)BATCH * dims[l + 1];
        n->w[l] = s_alloc(nw);
        n->dw[l] = s_alloc(nw);
        n->b[l] = s_alloc(dims[l + 1]);
        n->db[l] = s_alloc(dims[l + 1]);
        n->z[l] = s_alloc(na);
        n->a[l + 1] = s_alloc(na);
        n->dz[l] = s_alloc(na);
    }
}

static void s_draw(net *n, int seed)
{
    s_state = 0x9E3779B97F4A7C15ull * (uint64_t)(seed + 1);
    for (int l = 0; l < LAYERS; l++) {
        for (int i = 0; i < dims[l] * dims[l + 1]; i++) {
            n->w[l][i] = (float)(sqrt(2.0 / dims[l]) * s_normal());
        }
        for (int o = 0; o < dims[l + 1]; o++) {
            n->b[l][o] = (float)(0.1 * s_normal());
        }
    }
    for (int i = 0; i < BATCH * dims[0]; i++) {
        n->a[0][i] = (float)s_normal();
    }
    for (int k = 0; k < BATCH; k++) {
        n->labels[k] = (int)(s_uniform() * dims[LAYERS]);
    }
}

// max |a - b| / max |b| and ||a - b|| / ||b||.
static void s_compare(const double *a, const double *b, size_t count, double *max, double *norm)
{
    double d = 0.0, scale = 0.0, d2 = 0.0, r2 = 0.0;
    for (size_t i = 0; i < count; i++) {
        double e = fabs(a[i] - b[i]);
        d = e > d ? e : d;
        scale = fabs(b[i]) > scale ? fabs(b[i]) : scale;
        d2 += e * e;
        r2 += b[i] * b[i];
    }
    *max = d / (scale > 0.0 ? scale : 1.0);
    *norm = sqrt(d2) / (r2 > 0.0 ? sqrt(r2) : 1.0);
}

int main(int argc, char **argv)
{
    if (argc != 3 || atoi(argv[1]) < 2 || atoi(argv[1]) > 23 || atoi(argv[2]) < 1) {
        fprintf(stderr, "usage: tc_emulate BITS(2..23) SEEDS(>=1)\n");
        return 2;
    }
    const arith exact = {.bits = 52, .fp32_acc = 0};
    const arith tc = {.bits = atoi(argv[1]), .fp32_acc = 1};
    net n = {0}, ref = {0};
    s_net_init(&n);
    s_net_init(&ref);
    double worst = 0.0;
    for (int seed = 0; seed < atoi(argv[2]); seed++) {
        s_draw(&ref, seed);
        s_draw(&n, seed);
        s_forward(&ref, &exact);
        s_backward(&ref, &exact);
        s_forward(&n, &tc);
        s_backward(&n, &tc);
        for (int l = 0; l < LAYERS; l++) {
            double wm, wn, bm, bn;
            s_compare(n.dw[l], ref.dw[l], (size_t)dims[l] * dims[l + 1], &wm, &wn);
            s_compare(n.db[l], ref.db[l], dims[l + 1], &bm, &bn);
            printf("bits %d seed %d layer %d: dW max %.3g norm %.3g, db max %.3g norm %.3g\n",
                   tc.bits, seed, l, wm, wn, bm, bn);
            worst = fmax(worst, fmax(wn, bn));
        }
    }
    printf("worst norm difference: %.3g\n", worst);
    return 0;
}
