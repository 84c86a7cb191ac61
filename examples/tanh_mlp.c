/* tanh_mlp.c - a model zps-worker does not know, trained on zps through
 * the public header alone (include/zps.h) against zps-server --model
 * external: a tanh MLP, x -> tanh(W1 x + b1) -> W2 h + b2 -> softmax, on a
 * synthetic dataset of Gaussian clusters, its gradient by OpenBLAS.
 *
 *   tanh_mlp --coordinator tcp://HOST:PORT [--share N] [--save FILE]
 *   tanh_mlp --single --steps S --global-batch B --lr X --momentum M [--save FILE]
 *
 * --clip-grad-norm X: the worker declares torch's clip_grad_norm_ max_norm
 * with the model (the shards clip by the global norm); --single clips too.
 *
 * The second form trains alone on each step's whole global batch, in zps's
 * data order (zps_batch_indices), with the shards' SGD: what a zps run of
 * the same job computes, to round-off (docs/failures.md's note: compare within
 * about 30-80 steps; training at these rates is chaotic past about 100).
 *
 * What the caller keeps of zps's promise: the same piece gives the same
 * gradient on every worker (the compute is deterministic, the data is the
 * same everywhere: generated from a fixed seed), and rank 0's initial
 * values are the job's. libzps keeps the rest. */
#include <cblas.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zps.h>

#define N_IN 32      // features
#define N_CLASSES 4  // clusters
#define N_TEST 1024  // test records
#define DATA_SEED 7  // the dataset is the same on every worker

typedef struct opts {
    const char *coordinator; // worker mode, or NULL with --single
    int single;
    int hidden;              // hidden width: another width is another model
    uint32_t n_train;        // train records
    uint32_t share;          // fixed share of the global batch (0: split)
    uint64_t init_seed;      // initial values (rank 0's are the job's)
    const char *save;        // final parameters, raw fp32, or NULL
    int sleep_ms;            // per piece: a slower worker (tests)
    // --single: the job's settings, as zps-server was given them
    uint64_t steps, seed;
    uint32_t global_batch;
    float lr, momentum;
    float clip;              // clip_grad_norm_'s max_norm (0: none): declared, or applied alone
} opts;

typedef struct model {
    int h;            // hidden width
    size_t n;         // parameters: W1 (h x N_IN), b1 (h), W2 (N_CLASSES x h), b2
    size_t w1, b1, w2, b2; // offsets in the flat vector
    float *x, *a, *dz, *p; // scratch of one piece, sized for max_rows
    size_t max_rows;
} model;

typedef struct data {
    uint32_t n_train;
    float *x_train, *x_test; // rows of N_IN
    uint8_t *y_train, *y_test;
} data;

static volatile sig_atomic_t s_stop;
static zps_client *s_client;

static void s_on_signal(int sig)
{
    (void)sig;
    s_stop = 1;
    if (s_client) {
        zps_client_stop(s_client); // async-signal-safe
    }
}

// splitmix64: the example's own generator, the same on every machine.
static uint64_t s_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double s_uniform(uint64_t *state)
{
    return ((double)(s_next(state) >> 11) + 0.5) / 9007199254740992.0;
}

static double s_normal(uint64_t *state)
{
    double u = s_uniform(state), v = s_uniform(state);
    return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

// Clusters around N_CLASSES random centres: record i is of class i mod K.
static int s_data_init(data *d, uint32_t n_train)
{
    d->n_train = n_train;
    d->x_train = malloc((size_t)n_train * N_IN * sizeof(float));
    d->x_test = malloc((size_t)N_TEST * N_IN * sizeof(float));
    d->y_train = malloc(n_train);
    d->y_test = malloc(N_TEST);
    if (!d->x_train || !d->x_test || !d->y_train || !d->y_test) {
        return -1;
    }
    uint64_t st = DATA_SEED;
    float centre[N_CLASSES][N_IN];
    for (int k = 0; k < N_CLASSES; k++) {
        for (int j = 0; j < N_IN; j++) {
            centre[k][j] = (float)(0.6 * s_normal(&st));
        }
    }
    for (uint32_t i = 0; i < n_train + N_TEST; i++) {
        int k = (int)(i % N_CLASSES);
        float *row = i < n_train ? d->x_train + (size_t)i * N_IN
                                 : d->x_test + (size_t)(i - n_train) * N_IN;
        for (int j = 0; j < N_IN; j++) {
            row[j] = centre[k][j] + (float)s_normal(&st);
        }
        if (i < n_train) {
            d->y_train[i] = (uint8_t)k;
        } else {
            d->y_test[i - n_train] = (uint8_t)k;
        }
    }
    return 0;
}

static void s_data_fini(data *d)
{
    free(d->x_train);
    free(d->x_test);
    free(d->y_train);
    free(d->y_test);
}

static int s_model_init(model *m, int hidden, size_t max_rows)
{
    m->h = hidden;
    m->w1 = 0;
    m->b1 = m->w1 + (size_t)hidden * N_IN;
    m->w2 = m->b1 + (size_t)hidden;
    m->b2 = m->w2 + (size_t)N_CLASSES * hidden;
    m->n = m->b2 + N_CLASSES;
    m->max_rows = max_rows;
    m->x = malloc(max_rows * N_IN * sizeof(float));
    m->a = malloc(max_rows * (size_t)hidden * sizeof(float));
    m->dz = malloc(max_rows * (size_t)hidden * sizeof(float));
    m->p = malloc(max_rows * N_CLASSES * sizeof(float));
    return m->x && m->a && m->dz && m->p ? 0 : -1;
}

static void s_model_fini(model *m)
{
    free(m->x);
    free(m->a);
    free(m->dz);
    free(m->p);
}

// Glorot-uniform weights, zero biases, from the seed.
static void s_init_params(const model *m, uint64_t seed, float *p)
{
    uint64_t st = seed;
    memset(p, 0, m->n * sizeof(float));
    double a1 = sqrt(6.0 / (N_IN + m->h)), a2 = sqrt(6.0 / (m->h + N_CLASSES));
    for (size_t i = 0; i < (size_t)m->h * N_IN; i++) {
        p[m->w1 + i] = (float)(a1 * (2 * s_uniform(&st) - 1));
    }
    for (size_t i = 0; i < (size_t)N_CLASSES * m->h; i++) {
        p[m->w2 + i] = (float)(a2 * (2 * s_uniform(&st) - 1));
    }
}

// The forward pass over rows x (n x N_IN): m->a the hidden activations,
// m->p the class probabilities. Returns the summed cross-entropy of y.
static double s_forward(model *m, const float *p, size_t n, const uint8_t *y)
{
    int h = m->h;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, h, N_IN, 1.0f, m->x, N_IN,
                p + m->w1, N_IN, 0.0f, m->a, h);
    for (size_t r = 0; r < n; r++) {
        for (int j = 0; j < h; j++) {
            m->a[r * h + j] = tanhf(m->a[r * h + j] + p[m->b1 + j]);
        }
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, N_CLASSES, h, 1.0f, m->a, h,
                p + m->w2, h, 0.0f, m->p, N_CLASSES);
    double loss = 0;
    for (size_t r = 0; r < n; r++) {
        float *z = m->p + r * N_CLASSES, top = -INFINITY, sum = 0;
        for (int k = 0; k < N_CLASSES; k++) {
            z[k] += p[m->b2 + k];
            top = z[k] > top ? z[k] : top;
        }
        for (int k = 0; k < N_CLASSES; k++) {
            z[k] = expf(z[k] - top);
            sum += z[k];
        }
        for (int k = 0; k < N_CLASSES; k++) {
            z[k] /= sum;
        }
        loss -= log(z[y[r]] > 1e-30f ? z[y[r]] : 1e-30f);
    }
    return loss;
}

// Gathers the rows of idx into m->x, their labels into y.
static void s_gather(model *m, const data *d, const uint32_t *idx, size_t n, uint8_t *y)
{
    for (size_t r = 0; r < n; r++) {
        memcpy(m->x + r * N_IN, d->x_train + (size_t)idx[r] * N_IN, N_IN * sizeof(float));
        y[r] = d->y_train[idx[r]];
    }
}

// The mean gradient over the n rows in m->x (labels y) into g; returns
// the mean loss.
static float s_gradient(model *m, const float *p, size_t n, const uint8_t *y, float *g)
{
    int h = m->h;
    double loss = s_forward(m, p, n, y);
    float *dlogits = m->p; // (P - onehot) / n, in place
    for (size_t r = 0; r < n; r++) {
        dlogits[r * N_CLASSES + y[r]] -= 1.0f;
        for (int k = 0; k < N_CLASSES; k++) {
            dlogits[r * N_CLASSES + k] /= (float)n;
        }
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N_CLASSES, h, (int)n, 1.0f, dlogits,
                N_CLASSES, m->a, h, 0.0f, g + m->w2, h);
    for (int k = 0; k < N_CLASSES; k++) {
        float s = 0;
        for (size_t r = 0; r < n; r++) {
            s += dlogits[r * N_CLASSES + k];
        }
        g[m->b2 + k] = s;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, h, N_CLASSES, 1.0f, dlogits,
                N_CLASSES, p + m->w2, h, 0.0f, m->dz, h);
    for (size_t i = 0; i < n * (size_t)h; i++) {
        m->dz[i] *= 1.0f - m->a[i] * m->a[i];
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, h, N_IN, (int)n, 1.0f, m->dz, h, m->x,
                N_IN, 0.0f, g + m->w1, N_IN);
    for (int j = 0; j < h; j++) {
        float s = 0;
        for (size_t r = 0; r < n; r++) {
            s += m->dz[r * h + j];
        }
        g[m->b1 + j] = s;
    }
    return (float)(loss / (double)n);
}

// Test records [lo, hi): how many are classified right, their summed loss.
static uint32_t s_evaluate(model *m, const data *d, const float *p, uint32_t lo, uint32_t hi,
                           double *loss_sum)
{
    uint32_t correct = 0;
    *loss_sum = 0;
    for (uint32_t at = lo; at < hi; at += (uint32_t)m->max_rows) {
        size_t n = hi - at < m->max_rows ? hi - at : m->max_rows;
        memcpy(m->x, d->x_test + (size_t)at * N_IN, n * N_IN * sizeof(float));
        *loss_sum += s_forward(m, p, n, d->y_test + at);
        for (size_t r = 0; r < n; r++) {
            int best = 0;
            for (int k = 1; k < N_CLASSES; k++) {
                best = m->p[r * N_CLASSES + k] > m->p[r * N_CLASSES + best] ? k : best;
            }
            correct += best == d->y_test[at + r];
        }
    }
    return correct;
}

static int s_save(const char *path, const float *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, sizeof(float), n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "tanh_mlp: cannot write %s\n", path);
        return -1;
    }
    return 0;
}

// The reference: one process, each step's whole global batch, SGD with
// momentum (torch's, as the shards apply it) at a constant rate.
static int s_run_single(const opts *o, model *m, const data *d, float *p)
{
    size_t n = m->n;
    float *g = malloc(n * sizeof(float)), *buf = calloc(n, sizeof(float));
    uint32_t *idx = malloc(o->global_batch * sizeof(uint32_t));
    uint8_t *y = malloc(o->global_batch);
    if (!g || !buf || !idx || !y) {
        return 1;
    }
    float loss = 0;
    for (uint64_t t = 0; t < o->steps; t++) {
        if (zps_batch_indices(o->seed, d->n_train, o->global_batch, t, 0, o->global_batch,
                              idx) != ZPS_OK) {
            fprintf(stderr, "tanh_mlp: no global batch of %u in %u records\n", o->global_batch,
                    d->n_train);
            return 2;
        }
        s_gather(m, d, idx, o->global_batch, y);
        loss = s_gradient(m, p, o->global_batch, y, g);
        if (o->clip > 0) {
            // torch.nn.utils.clip_grad_norm_: the shards sum the squares
            // exactly; a double sum is that to round-off here.
            double sq = 0;
            for (size_t i = 0; i < n; i++) {
                sq += (double)g[i] * g[i];
            }
            float coef = o->clip / ((float)sqrt(sq) + 1e-6f);
            coef = coef > 1.0f ? 1.0f : coef;
            for (size_t i = 0; i < n; i++) {
                g[i] *= coef;
            }
        }
        for (size_t i = 0; i < n; i++) {
            float b = o->momentum * buf[i] + g[i];
            buf[i] = b;
            p[i] -= o->lr * b;
        }
    }
    double test_loss;
    uint32_t correct = s_evaluate(m, d, p, 0, N_TEST, &test_loss);
    printf("single: %llu steps, last loss %.4f, test accuracy %.4f\n",
           (unsigned long long)o->steps, loss, (double)correct / N_TEST);
    free(g);
    free(buf);
    free(idx);
    free(y);
    return 0;
}

static int s_declare(zps_client *c, const model *m, uint32_t n_train, float clip)
{
    int64_t w1[2] = {m->h, N_IN}, b1[1] = {m->h}, w2[2] = {N_CLASSES, m->h};
    int64_t b2[1] = {N_CLASSES};
    if (zps_declare_tensor(c, "hidden.weight", 2, w1) != ZPS_OK ||
        zps_declare_tensor(c, "hidden.bias", 1, b1) != ZPS_OK ||
        zps_declare_tensor(c, "out.weight", 2, w2) != ZPS_OK ||
        zps_declare_tensor(c, "out.bias", 1, b2) != ZPS_OK ||
        zps_declare_dataset(c, n_train, N_TEST) != ZPS_OK ||
        (clip > 0 && zps_declare_clip_grad_norm(c, clip) != ZPS_OK)) {
        fprintf(stderr, "tanh_mlp: %s\n", zps_errmsg(c));
        return -1;
    }
    return 0;
}

// One train item: its rows, the mean gradient, every bucket pushed.
static int s_train_item(zps_client *c, model *m, const data *d, const zps_work *w,
                        const float *p, float *g, uint8_t *y, int sleep_ms)
{
    if (zps_work_start(c, w) != ZPS_OK) {
        return 0; // done without this worker during a pause: skipped
    }
    s_gather(m, d, w->indices, w->count, y);
    float loss = s_gradient(m, p, w->count, y, g);
    if (sleep_ms > 0) {
        struct timespec ts = {sleep_ms / 1000, (sleep_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    int n_buckets = (int)zps_info_u64(c, ZPS_INFO_N_BUCKETS);
    for (int b = 0; b < n_buckets; b++) {
        if (zps_push_bucket(c, w, b, g, loss) != ZPS_OK) {
            break; // the first failure is zps_work_done's
        }
    }
    if (zps_work_done(c, w) != ZPS_OK) {
        fprintf(stderr, "tanh_mlp: push: %s\n", zps_errmsg(c));
    }
    return 0;
}

static int s_run_worker(const opts *o, model *m, const data *d, float *p)
{
    zps_client *c = zps_client_new(o->coordinator);
    if (!c) {
        fprintf(stderr, "tanh_mlp: cannot make a client of %s\n", o->coordinator);
        return 1;
    }
    s_client = c;
    int status = 1;
    float *g = malloc(m->n * sizeof(float));
    uint8_t *y = malloc(m->max_rows);
    if (!g || !y || s_declare(c, m, d->n_train, o->clip) != 0 ||
        zps_client_set_str(c, ZPS_OPT_DEVICE, "cpu (tanh_mlp)") != ZPS_OK ||
        zps_client_set_int(c, ZPS_OPT_SHARE, o->share) != ZPS_OK || zps_connect(c) != ZPS_OK ||
        zps_join(c) != ZPS_OK || zps_set_params(c, p, m->n) != ZPS_OK) {
        fprintf(stderr, "tanh_mlp: %s\n", zps_errmsg(c));
        goto out;
    }
    zps_work w;
    int r;
    while ((r = zps_next_work(c, &w)) != ZPS_NEXT_DONE) {
        if (r == ZPS_NEXT_WORK) {
            if (w.count > m->max_rows) {
                fprintf(stderr, "tanh_mlp: a piece of %u rows, more than %zu\n", w.count,
                        m->max_rows);
                goto out;
            }
            s_train_item(c, m, d, &w, p, g, y, o->sleep_ms);
        } else if (r == ZPS_NEXT_EVAL) {
            double loss_sum;
            uint32_t correct = s_evaluate(m, d, p, w.offset, w.offset + w.count, &loss_sum);
            (void)zps_eval_done(c, &w, correct, loss_sum);
        } else if (r != ZPS_NEXT_ROLLBACK && r != ZPS_NEXT_REJOINED) {
            fprintf(stderr, "tanh_mlp: the job ended for this worker: %s\n", zps_errmsg(c));
            status = r == ZPS_NEXT_OVER ? 0 : 1;
            goto out;
        }
    }
    double test_loss;
    uint32_t correct = s_evaluate(m, d, p, 0, N_TEST, &test_loss);
    printf("rank %llu: %llu steps, test accuracy %.4f\n",
           (unsigned long long)zps_info_u64(c, ZPS_INFO_RANK),
           (unsigned long long)zps_info_u64(c, ZPS_INFO_TOTAL_STEPS),
           (double)correct / N_TEST);
    status = o->save && s_save(o->save, p, m->n) != 0 ? 1 : 0;
    (void)zps_leave(c);
out:
    s_client = NULL;
    zps_client_destroy(&c);
    free(g);
    free(y);
    return status;
}

static void s_usage(void)
{
    fprintf(stderr,
            "usage: tanh_mlp --coordinator ENDPOINT [--share N] [options]\n"
            "       tanh_mlp --single [--steps S] [--global-batch B] [--lr X] [--momentum M]\n"
            "                [--seed N] [options]\n"
            "  --hidden H      hidden width (default 64): another width is another model\n"
            "  --n-train N     train records (default 8192)\n"
            "  --init-seed N   initial values (default 1; rank 0's are the job's)\n"
            "  --save FILE     write the final parameters, raw fp32\n"
            "  --sleep-ms N    sleep this long per piece (a slow worker)\n"
            "  --clip-grad-norm X  clip each step's gradient to a global norm of X\n");
}

static int s_parse(int argc, char **argv, opts *o)
{
    *o = (opts){.hidden = 64, .n_train = 8192, .init_seed = 1, .steps = 30,
                .global_batch = 64, .lr = 0.1f, .momentum = 0.9f};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--single") == 0) {
            o->single = 1;
            continue;
        }
        if (!v) {
            s_usage();
            return -1;
        }
        i++;
        if (strcmp(a, "--coordinator") == 0) {
            o->coordinator = v;
        } else if (strcmp(a, "--share") == 0) {
            o->share = (uint32_t)strtoul(v, NULL, 10);
        } else if (strcmp(a, "--hidden") == 0) {
            o->hidden = atoi(v);
        } else if (strcmp(a, "--n-train") == 0) {
            o->n_train = (uint32_t)strtoul(v, NULL, 10);
        } else if (strcmp(a, "--init-seed") == 0) {
            o->init_seed = strtoull(v, NULL, 10);
        } else if (strcmp(a, "--save") == 0) {
            o->save = v;
        } else if (strcmp(a, "--sleep-ms") == 0) {
            o->sleep_ms = atoi(v);
        } else if (strcmp(a, "--steps") == 0) {
            o->steps = strtoull(v, NULL, 10);
        } else if (strcmp(a, "--global-batch") == 0) {
            o->global_batch = (uint32_t)strtoul(v, NULL, 10);
        } else if (strcmp(a, "--lr") == 0) {
            o->lr = strtof(v, NULL);
        } else if (strcmp(a, "--momentum") == 0) {
            o->momentum = strtof(v, NULL);
        } else if (strcmp(a, "--clip-grad-norm") == 0) {
            o->clip = strtof(v, NULL);
        } else if (strcmp(a, "--seed") == 0) {
            o->seed = strtoull(v, NULL, 10);
        } else {
            s_usage();
            return -1;
        }
    }
    if (o->single == (o->coordinator != NULL) || o->hidden < 1 || o->hidden > 4096 ||
        o->n_train < 1 || o->global_batch < 1) {
        s_usage();
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    opts o;
    if (s_parse(argc, argv, &o) != 0) {
        return 2;
    }
    signal(SIGTERM, s_on_signal);
    signal(SIGINT, s_on_signal);
    data d = {0};
    model m = {0};
    // A piece is at most the global batch; a worker does not know B before
    // it joins, so it is sized for the whole train set.
    size_t max_rows = o.single ? o.global_batch : o.n_train;
    float *p = NULL;
    int status = 1;
    if (s_data_init(&d, o.n_train) != 0 || s_model_init(&m, o.hidden, max_rows) != 0 ||
        !(p = malloc(m.n * sizeof(float)))) {
        fprintf(stderr, "tanh_mlp: out of memory\n");
        goto out;
    }
    s_init_params(&m, o.init_seed, p);
    status = o.single ? s_run_single(&o, &m, &d, p) : s_run_worker(&o, &m, &d, p);
    if (status == 0 && o.single && o.save && s_save(o.save, p, m.n) != 0) {
        status = 1;
    }
out:
    free(p);
    s_model_fini(&m);
    s_data_fini(&d);
    return status;
}
