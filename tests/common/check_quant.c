/* check_quant.c - the int8 and E3M0 codecs of pseudo-gradients (bounds of
 * the round trip, the byte layout, refusals of what a peer may send) and
 * the worker's error feedback (what was sent tracks the deltas). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_quant.h"
#include "common/zps_rng.h"
#include "tests/zps_check.h"

static const zps_quant_kind s_kinds[] = {ZPS_QUANT_INT8, ZPS_QUANT_E3M0};

// The encoding's size, asserted valid.
static size_t s_size(zps_quant_kind kind, size_t n, size_t block)
{
    size_t size = 0;
    ck_assert_int_eq(zps_quant_size(kind, n, block, &size), ZPS_OK);
    return size;
}

// The scale of block b as stored (fp32, little-endian).
static float s_scale(const uint8_t *buf, size_t b)
{
    uint32_t u = (uint32_t)buf[4 * b] | (uint32_t)buf[4 * b + 1] << 8 |
                 (uint32_t)buf[4 * b + 2] << 16 | (uint32_t)buf[4 * b + 3] << 24;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

// |x - y| over the bound of x's kind, for x in a block of scale s: <= 1 passes.
static double s_bound_ratio(zps_quant_kind kind, float x, float y, float s)
{
    double err = fabs((double)x - (double)y);
    double bound = kind == ZPS_QUANT_INT8 ? ZPS_QUANT_INT8_BOUND(x, s) : ZPS_QUANT_E3M0_BOUND(x, s);
    return bound > 0 ? err / bound : (err > 0 ? INFINITY : 0);
}

// n values whose blocks span magnitudes 1e-30 .. 1e30, signs mixed, some
// exact zeros.
static void s_fill(float *x, size_t n, size_t block, uint64_t seed)
{
    zps_rng r;
    zps_rng_seed(&r, seed, 0);
    for (size_t b = 0; b * block < n; b++) {
        double mag = pow(10.0, -30.0 + 60.0 * zps_rng_uniform(&r));
        for (size_t i = b * block; i < n && i < (b + 1) * block; i++) {
            x[i] = zps_rng_below(&r, 16) == 0 ? 0.0f : (float)(mag * zps_rng_normal(&r));
        }
    }
}

// ---------------------------------------------------------------- codecs

START_TEST(test_quant_sizes_and_names)
{
    ck_assert_uint_eq(s_size(ZPS_QUANT_INT8, 1000, 256), 4 * 4 + 1000);
    ck_assert_uint_eq(s_size(ZPS_QUANT_E3M0, 1000, 256), 4 * 4 + 500);
    ck_assert_uint_eq(s_size(ZPS_QUANT_E3M0, 7, 3), 4 * 3 + 4);
    ck_assert_uint_eq(s_size(ZPS_QUANT_INT8, 0, 256), 0);
    ck_assert_uint_eq(s_size(ZPS_QUANT_INT8, 5, ZPS_QUANT_MAX_BLOCK), 4 + 5);
    size_t size = 12345;
    ck_assert_int_eq(zps_quant_size(ZPS_QUANT_INT8, 10, 0, &size), ZPS_EINVAL);
    ck_assert_int_eq(zps_quant_size(ZPS_QUANT_INT8, 10, ZPS_QUANT_MAX_BLOCK + 1, &size),
                     ZPS_EINVAL);
    ck_assert_int_eq(zps_quant_size((zps_quant_kind)0, 10, 256, &size), ZPS_EINVAL);
    ck_assert_int_eq(zps_quant_size((zps_quant_kind)3, 10, 256, &size), ZPS_EINVAL);
    ck_assert_uint_eq(size, 12345);
    zps_quant_kind kind;
    ck_assert_int_eq(zps_quant_parse("e3m0", &kind), ZPS_OK);
    ck_assert_int_eq(kind, ZPS_QUANT_E3M0);
    ck_assert_int_eq(zps_quant_parse("int8", &kind), ZPS_OK);
    ck_assert_int_eq(kind, ZPS_QUANT_INT8);
    ck_assert_int_eq(zps_quant_parse("fp4", &kind), ZPS_EINVAL);
    ck_assert_str_eq(zps_quant_name(ZPS_QUANT_E3M0), "e3m0");
    ck_assert_str_eq(zps_quant_name((zps_quant_kind)7), "?");
}
END_TEST

// The bytes by hand: little-endian scales, then the codes; E3M0's even
// element in the low nibble.
START_TEST(test_quant_layout_by_hand)
{
    const float x[3] = {127.0f, -63.5f, 0.2f};
    uint8_t buf[4 + 3];
    ck_assert_int_eq(zps_quant_encode(ZPS_QUANT_INT8, 256, x, 3, buf, sizeof buf), ZPS_OK);
    const uint8_t int8[] = {0x00, 0x00, 0x80, 0x3f, 127, (uint8_t)-64, 0}; // scale 1.0f
    ck_assert_mem_eq(buf, int8, sizeof int8);                              // -63.5: away from 0
    const float y[3] = {4.0f, -2.0f, 0.125f};
    uint8_t b4[4 + 2];
    ck_assert_int_eq(zps_quant_encode(ZPS_QUANT_E3M0, 256, y, 3, b4, sizeof b4), ZPS_OK);
    // scale 4.0f; 4 = s: c 7; -2 = -s/2: sign + c 6; 1/8 = s/32: c 2; high nibble 0.
    const uint8_t e3m0[] = {0x00, 0x00, 0x80, 0x40, 0xe7, 0x02};
    ck_assert_mem_eq(b4, e3m0, sizeof e3m0);
    float back[3];
    ck_assert_int_eq(zps_quant_decode(ZPS_QUANT_E3M0, 256, b4, sizeof b4, back, 3), ZPS_OK);
    ck_assert_mem_eq(back, y, sizeof y); // powers of two of the scale are exact
}
END_TEST

// E3M0 rounds to the nearest magnitude, ties to the larger: at the
// midpoints exactly, and one float below them.
START_TEST(test_quant_e3m0_rounds_to_nearest)
{
    const float x[] = {
        1.0f,                         // the scale: c 7
        0.75f,                        // midpoint of s/2 and s: s
        nextafterf(0.75f, 0),         // s/2
        -0x1.8p-6f,                   // midpoint of s/64 and s/32: -s/32
        0x1p-7f,                      // midpoint of 0 and s/64: s/64
        nextafterf(0x1p-7f, 0),       // 0
        -nextafterf(0x1p-7f, 0),      // 0, and no sign
        0.3f,                         // nearer s/4 (0.25) than s/2
    };
    const float want[] = {1.0f, 1.0f, 0.5f, -0x1p-5f, 0x1p-6f, 0.0f, 0.0f, 0.25f};
    enum { N = sizeof x / sizeof x[0] };
    uint8_t buf[4 + N / 2];
    float y[N];
    ck_assert_int_eq(zps_quant_encode(ZPS_QUANT_E3M0, 256, x, N, buf, sizeof buf), ZPS_OK);
    ck_assert_int_eq(zps_quant_decode(ZPS_QUANT_E3M0, 256, buf, sizeof buf, y, N), ZPS_OK);
    for (int i = 0; i < N; i++) {
        ck_assert_msg(memcmp(&y[i], &want[i], sizeof y[i]) == 0, "element %d: %a, not %a", i,
                      (double)y[i], (double)want[i]);
    }
}
END_TEST

// Every element of every block, over blocks of magnitudes 1e-30 .. 1e30
// (and a short last block), comes back within its kind's bound: int8 within
// half its block's step s = max|x| / 127, E3M0 within max(|x| / 3, s / 128)
// with s = max|x|. The largest element of a block comes back (nearly) exact.
START_TEST(test_quant_round_trip_within_its_bound)
{
    zps_quant_kind kind = s_kinds[_i];
    enum { N = 64 * 256 + 100, BLOCK = 256 };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    size_t size = s_size(kind, N, BLOCK);
    uint8_t *buf = malloc(size);
    s_fill(x, N, BLOCK, 7);
    ck_assert_int_eq(zps_quant_encode(kind, BLOCK, x, N, buf, size), ZPS_OK);
    ck_assert_int_eq(zps_quant_decode(kind, BLOCK, buf, size, y, N), ZPS_OK);
    double worst = 0, worst_step = 0;
    for (size_t b = 0; b * BLOCK < N; b++) {
        float s = s_scale(buf, b);
        float max = 0;
        size_t argmax = b * BLOCK;
        for (size_t i = b * BLOCK; i < N && i < (b + 1) * BLOCK; i++) {
            double r = s_bound_ratio(kind, x[i], y[i], s);
            worst = r > worst ? r : worst;
            if (kind == ZPS_QUANT_INT8) {
                double step = fabs((double)x[i] - (double)y[i]) / s;
                worst_step = step > worst_step ? step : worst_step;
            }
            if (fabsf(x[i]) > max) {
                max = fabsf(x[i]);
                argmax = i;
            }
        }
        ck_assert_float_eq_tol(fabsf(y[argmax]), max, 2e-7 * max);
    }
    fprintf(stderr, "quant %s: round trip, worst error %.6f of its bound%s", zps_quant_name(kind),
            worst, kind == ZPS_QUANT_INT8 ? "" : "\n");
    if (kind == ZPS_QUANT_INT8) {
        fprintf(stderr, " (%.6f of the block's scale max|x| / 127)\n", worst_step);
    }
    ck_assert_double_le(worst, 1.0);
    free(x);
    free(y);
    free(buf);
}
END_TEST

// A zero block (alone, and among others) has scale 0, codes 0, and comes
// back as +0 exactly.
START_TEST(test_quant_zero_blocks)
{
    zps_quant_kind kind = s_kinds[_i];
    enum { N = 3 * 16 };
    float x[N] = {0}, y[N];
    for (int i = 16; i < 32; i++) {
        x[i] = (float)(i - 20); // only the middle block is not zero
    }
    x[0] = -0.0f;
    uint8_t buf[3 * 4 + N];
    size_t size = s_size(kind, N, 16);
    memset(buf, 0xab, sizeof buf);
    ck_assert_int_eq(zps_quant_encode(kind, 16, x, N, buf, size), ZPS_OK);
    ck_assert_float_eq(s_scale(buf, 0), 0);
    ck_assert_float_eq(s_scale(buf, 2), 0);
    ck_assert_int_eq(zps_quant_decode(kind, 16, buf, size, y, N), ZPS_OK);
    const float zero = 0.0f;
    for (int i = 0; i < N; i++) {
        if (i < 16 || i >= 32) {
            ck_assert_mem_eq(&y[i], &zero, sizeof zero);
        }
    }
    ck_assert_float_eq(y[20], 0); // a zero in a block that is not
}
END_TEST

// One huge value in a block of ordinary ones: the ordinary ones fall to 0
// (within the bound: the bound is the block's), the huge one comes back;
// ZPS_QUANT_MAX is the largest magnitude taken, twice it is refused.
START_TEST(test_quant_one_huge_value_in_a_block)
{
    zps_quant_kind kind = s_kinds[_i];
    enum { N = 256 };
    float x[N], y[N];
    for (int i = 0; i < N; i++) {
        x[i] = 1.0f + (float)i / N;
    }
    x[100] = -1e20f;
    size_t size = s_size(kind, N, N);
    uint8_t *buf = malloc(size);
    ck_assert_int_eq(zps_quant_encode(kind, N, x, N, buf, size), ZPS_OK);
    ck_assert_int_eq(zps_quant_decode(kind, N, buf, size, y, N), ZPS_OK);
    float s = s_scale(buf, 0);
    for (int i = 0; i < N; i++) {
        ck_assert_double_le(s_bound_ratio(kind, x[i], y[i], s), 1.0);
        if (i != 100) {
            ck_assert_float_eq(y[i], 0);
        }
    }
    ck_assert_float_eq_tol(y[100], -1e20f, 1e13f);
    x[100] = ZPS_QUANT_MAX;
    ck_assert_int_eq(zps_quant_encode(kind, N, x, N, buf, size), ZPS_OK);
    ck_assert_int_eq(zps_quant_decode(kind, N, buf, size, y, N), ZPS_OK);
    ck_assert(isfinite(y[100]));
    ck_assert_float_eq_tol(y[100], ZPS_QUANT_MAX, ZPS_QUANT_MAX * 1e-6f);
    x[100] = 2 * ZPS_QUANT_MAX;
    ck_assert_int_eq(zps_quant_encode(kind, N, x, N, buf, size), ZPS_EINVAL);
    free(buf);
}
END_TEST

// NaN and +-Inf are refused (ZPS_EINVAL), and the output is not touched:
// a worker whose delta is not finite has diverged and sends nothing.
START_TEST(test_quant_encode_refuses_nan_and_inf)
{
    zps_quant_kind kind = s_kinds[_i];
    const float bad[] = {NAN, INFINITY, -INFINITY};
    float x[40];
    uint8_t buf[4 * 3 + 40], before[sizeof buf];
    size_t size = s_size(kind, 40, 16);
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        for (int i = 0; i < 40; i++) {
            x[i] = (float)i;
        }
        x[37] = bad[k];
        memset(buf, 0x5a, sizeof buf);
        memcpy(before, buf, sizeof buf);
        ck_assert_int_eq(zps_quant_encode(kind, 16, x, 40, buf, size), ZPS_EINVAL);
        ck_assert_mem_eq(buf, before, sizeof buf);
    }
    // A wrong output length too.
    x[37] = 1;
    ck_assert_int_eq(zps_quant_encode(kind, 16, x, 40, buf, size - 1), ZPS_EINVAL);
    ck_assert_int_eq(zps_quant_encode(kind, 16, x, 40, buf, size + 1), ZPS_EINVAL);
    ck_assert_mem_eq(buf, before, sizeof buf);
    ck_assert_int_eq(zps_quant_encode(kind, 0, x, 40, buf, size), ZPS_EINVAL);
}
END_TEST

// Bytes from a peer: a buffer of another length, a scale that is
// negative, NaN, Inf or beyond the encoder's, a code the encoder never
// makes: ZPS_EPROTO, and the output keeps its values.
START_TEST(test_quant_decode_refuses_what_no_encoder_makes)
{
    zps_quant_kind kind = s_kinds[_i];
    enum { N = 41, BLOCK = 16 };
    float x[N], y[N], before[N];
    for (int i = 0; i < N; i++) {
        x[i] = sinf((float)i);
        y[i] = before[i] = -7.0f;
    }
    size_t size = s_size(kind, N, BLOCK);
    uint8_t good[4 * 3 + N], bad[sizeof good + 1];
    ck_assert_int_eq(zps_quant_encode(kind, BLOCK, x, N, good, size), ZPS_OK);
    // Lengths.
    ck_assert_int_eq(zps_quant_decode(kind, BLOCK, good, size - 1, y, N), ZPS_EPROTO);
    memcpy(bad, good, size);
    bad[size] = 0;
    ck_assert_int_eq(zps_quant_decode(kind, BLOCK, bad, size + 1, y, N), ZPS_EPROTO);
    ck_assert_int_eq(zps_quant_decode(kind, BLOCK, good, 0, y, N), ZPS_EPROTO);
    ck_assert_int_eq(zps_quant_decode(kind, BLOCK, good, size, y, N - 1), ZPS_EPROTO);
    ck_assert_int_eq(zps_quant_decode(kind, BLOCK / 2, good, size, y, N), ZPS_EPROTO);
    // Scales (block 1's).
    const uint32_t scales[] = {
        0xbf800000u,                                     // -1
        0x7fc00000u,                                     // NaN
        0x7f800000u,                                     // +Inf
        0x80000000u | 0x00000001u,                       // a negative subnormal
        0x80000000u,                                     // -0
        kind == ZPS_QUANT_INT8 ? 0x6e010205u : 0x71800001u, // just past the encoder's largest
    };
    for (size_t k = 0; k < sizeof scales / sizeof scales[0]; k++) {
        memcpy(bad, good, size);
        for (int j = 0; j < 4; j++) {
            bad[4 + j] = (uint8_t)(scales[k] >> (8 * j));
        }
        ck_assert_msg(zps_quant_decode(kind, BLOCK, bad, size, y, N) == ZPS_EPROTO,
                      "scale %#x accepted", scales[k]);
    }
    // Codes.
    memcpy(bad, good, size);
    if (kind == ZPS_QUANT_INT8) {
        bad[4 * 3 + 20] = 0x80; // -128
        ck_assert_int_eq(zps_quant_decode(kind, BLOCK, bad, size, y, N), ZPS_EPROTO);
    } else {
        bad[4 * 3 + 10] = (uint8_t)((bad[4 * 3 + 10] & 0xf0) | 0x08); // negative zero, low
        ck_assert_int_eq(zps_quant_decode(kind, BLOCK, bad, size, y, N), ZPS_EPROTO);
        memcpy(bad, good, size);
        bad[4 * 3 + 10] = (uint8_t)((bad[4 * 3 + 10] & 0x0f) | 0x80); // negative zero, high
        ck_assert_int_eq(zps_quant_decode(kind, BLOCK, bad, size, y, N), ZPS_EPROTO);
        memcpy(bad, good, size);
        bad[size - 1] |= 0x10; // the unpaired nibble of element 41
        ck_assert_int_eq(zps_quant_decode(kind, BLOCK, bad, size, y, N), ZPS_EPROTO);
    }
    ck_assert_mem_eq(y, before, sizeof y);
    ck_assert_int_eq(zps_quant_decode((zps_quant_kind)9, BLOCK, good, size, y, N), ZPS_EINVAL);
    ck_assert_int_eq(zps_quant_decode(kind, 0, good, size, y, N), ZPS_EINVAL);
    ck_assert_mem_eq(y, before, sizeof y);
    // The good buffer still decodes.
    ck_assert_int_eq(zps_quant_decode(kind, BLOCK, good, size, y, N), ZPS_OK);
}
END_TEST

// ---------------------------------------------------------------- error feedback

// Over ROUNDS rounds of random deltas (each element with its own scale and
// a direction that persists; in block 0 one element far larger than the
// rest), the sum of what was sent (decoded as a shard decodes it)
// differs from the sum of the deltas by the residual, and the residual
// stays within its bound: int8 max|delta| / 253 of the block, E3M0
// max|delta| / 2 (from |e| <= max|delta + e| / 254 resp. / 3). Without
// error feedback the small elements of block 0 are never sent at all.
START_TEST(test_quant_ef_sum_of_sent_tracks_sum_of_deltas)
{
    zps_quant_kind kind = s_kinds[_i];
    enum { N = 1000, BLOCK = 256, ROUNDS = 400 };
    const size_t blocks = (N + BLOCK - 1) / BLOCK;
    const double k = kind == ZPS_QUANT_INT8 ? 1.0 / 253 : 0.5;
    zps_quant_ef *ef = zps_quant_ef_new(kind, BLOCK, N);
    ck_assert_ptr_nonnull(ef);
    size_t size = s_size(kind, N, BLOCK);
    uint8_t *buf = malloc(size);
    float *delta = malloc(N * sizeof(float)), *sent = malloc(N * sizeof(float));
    double *sum_delta = calloc(N, sizeof(double)), *sum_sent = calloc(N, sizeof(double));
    double *sum_plain = calloc(N, sizeof(double)); // sent without error feedback
    double scale[N], dir[N], dmax[(N + BLOCK - 1) / BLOCK] = {0};
    zps_rng r;
    zps_rng_seed(&r, 19, 1);
    for (int i = 0; i < N; i++) {
        scale[i] = pow(10.0, -4.0 + 3.0 * zps_rng_uniform(&r));
        dir[i] = zps_rng_normal(&r);
    }
    // Block 0: element 0 in [1, 1.5) every round, the others a constant
    // that rounds to 0 against it (int8: below half a step s / 2 >= 1 /
    // 254; E3M0: below s / 128 >= 1 / 128), so that without feedback none
    // of it is ever sent.
    const float small = kind == ZPS_QUANT_INT8 ? 1e-3f : 5e-3f;
    double worst_e = 0, worst_track = 0;
    for (int t = 0; t < ROUNDS; t++) {
        for (int i = 0; i < N; i++) {
            if (i == 0) {
                delta[i] = (float)(1.0 + 0.5 * zps_rng_uniform(&r));
            } else if (i < BLOCK) {
                delta[i] = small;
            } else {
                delta[i] = (float)(scale[i] * (dir[i] + 0.5 * zps_rng_normal(&r)));
            }
            sum_delta[i] += delta[i];
        }
        for (size_t b = 0; b < blocks; b++) {
            for (size_t i = b * BLOCK; i < N && i < (b + 1) * BLOCK; i++) {
                dmax[b] = fmax(dmax[b], fabs((double)delta[i]));
            }
        }
        ck_assert_int_eq(zps_quant_ef_encode(ef, 0, delta, N, buf, size), ZPS_OK);
        ck_assert_int_eq(zps_quant_decode(kind, BLOCK, buf, size, sent, N), ZPS_OK);
        const float *e = zps_quant_ef_residual(ef);
        for (int i = 0; i < N; i++) {
            sum_sent[i] += sent[i];
            double bound = k * dmax[i / BLOCK] * (1 + 1e-5);
            // The identity, up to the float rounding of delta + e and of e.
            double track = fabs(sum_delta[i] - sum_sent[i] - e[i]);
            ck_assert_msg(track <= 1e-5 * dmax[i / BLOCK], "round %d element %d: %g", t, i,
                          track);
            ck_assert_msg(fabs(e[i]) <= bound, "round %d element %d: e %g > %g", t, i,
                          (double)e[i], bound);
            ck_assert_msg(fabs(sum_delta[i] - sum_sent[i]) <= bound + 1e-5 * dmax[i / BLOCK],
                          "round %d element %d", t, i);
            worst_e = fmax(worst_e, fabs(e[i]) / (k * dmax[i / BLOCK]));
            worst_track = fmax(worst_track, track / dmax[i / BLOCK]);
        }
        ck_assert_int_eq(zps_quant_encode(kind, BLOCK, delta, N, buf, size), ZPS_OK);
        ck_assert_int_eq(zps_quant_decode(kind, BLOCK, buf, size, sent, N), ZPS_OK);
        for (int i = 0; i < N; i++) {
            sum_plain[i] += sent[i];
        }
    }
    // Without feedback, block 0's small elements were lost: their whole sum.
    double lost = 0;
    for (int i = 1; i < BLOCK; i++) {
        ck_assert_double_eq(sum_plain[i], 0);
        lost = fmax(lost, fabs(sum_delta[i] - sum_plain[i]) / (k * dmax[0]));
    }
    fprintf(stderr,
            "quant %s: error feedback over %d rounds, worst |e| %.3g of its bound, "
            "identity off by %.2g of max|delta|; without feedback up to %.3g of the bound lost\n",
            zps_quant_name(kind), ROUNDS, worst_e, worst_track, lost);
    ck_assert_double_gt(lost, 1.0);
    zps_quant_ef_destroy(&ef);
    ck_assert_ptr_null(ef);
    zps_quant_ef_destroy(&ef); // idempotent
    free(buf);
    free(delta);
    free(sent);
    free(sum_delta);
    free(sum_sent);
    free(sum_plain);
}
END_TEST

// A delta that is not finite, or makes delta + e overflow the encoder's
// range, a range outside the model, a wrong output length: refused, and
// neither the residual nor the output changes.
START_TEST(test_quant_ef_refuses_and_changes_nothing)
{
    zps_quant_kind kind = s_kinds[_i];
    enum { N = 100, BLOCK = 32 };
    zps_quant_ef *ef = zps_quant_ef_new(kind, BLOCK, N);
    size_t size = s_size(kind, N, BLOCK);
    uint8_t buf[4 * 4 + N] = {0}, out_before[sizeof buf]; // E3M0 uses half
    float delta[N], e_before[N];
    for (int i = 0; i < N; i++) {
        delta[i] = cosf((float)i) * (i == 3 ? 100.0f : 1.0f);
    }
    ck_assert_int_eq(zps_quant_ef_encode(ef, 0, delta, N, buf, size), ZPS_OK);
    memcpy(e_before, zps_quant_ef_residual(ef), sizeof e_before);
    memcpy(out_before, buf, sizeof buf);
    float bad = delta[50];
    delta[50] = NAN;
    ck_assert_int_eq(zps_quant_ef_encode(ef, 0, delta, N, buf, size), ZPS_EINVAL);
    delta[50] = -INFINITY;
    ck_assert_int_eq(zps_quant_ef_encode(ef, 0, delta, N, buf, size), ZPS_EINVAL);
    delta[50] = bad;
    // delta + e past ZPS_QUANT_MAX, though delta is not: a huge round left
    // a huge residual (element 1 in a block of scale ZPS_QUANT_MAX).
    zps_quant_ef *big = zps_quant_ef_new(kind, BLOCK, N);
    float huge[N] = {0};
    huge[0] = ZPS_QUANT_MAX;
    huge[1] = 0.7f * ZPS_QUANT_MAX;
    ck_assert_int_eq(zps_quant_ef_encode(big, 0, huge, N, buf, size), ZPS_OK);
    float e1 = zps_quant_ef_residual(big)[1];
    ck_assert_float_gt(fabsf(e1), 0);
    huge[1] = copysignf(ZPS_QUANT_MAX, e1);
    ck_assert_int_eq(zps_quant_ef_encode(big, 0, huge, N, buf, size), ZPS_EINVAL);
    ck_assert_float_eq(zps_quant_ef_residual(big)[1], e1);
    zps_quant_ef_destroy(&big);
    memcpy(buf, out_before, sizeof buf);
    ck_assert_int_eq(zps_quant_ef_encode(ef, 0, delta, N, buf, size - 1), ZPS_EINVAL);
    ck_assert_int_eq(zps_quant_ef_encode(ef, 1, delta, N, buf, size), ZPS_ERANGE);
    ck_assert_int_eq(zps_quant_ef_encode(ef, N + 1, delta, 0, buf, 0), ZPS_ERANGE);
    ck_assert_int_eq(zps_quant_ef_encode(ef, SIZE_MAX, delta, 2, buf, size), ZPS_ERANGE);
    ck_assert_mem_eq(zps_quant_ef_residual(ef), e_before, sizeof e_before);
    ck_assert_mem_eq(buf, out_before, sizeof buf);
    zps_quant_ef_reset(ef);
    for (int i = 0; i < N; i++) {
        ck_assert_float_eq(zps_quant_ef_residual(ef)[i], 0);
    }
    ck_assert_ptr_null(zps_quant_ef_new(kind, 0, N));
    ck_assert_ptr_null(zps_quant_ef_new((zps_quant_kind)0, BLOCK, N));
    zps_quant_ef_destroy(&ef);
}
END_TEST

// Ranges (one push per bucket) keep their own residuals, and their blocks
// start at the range: encoding [0, 300) and [300, 700) of one object is
// what two objects of those sizes do.
START_TEST(test_quant_ef_ranges_are_independent)
{
    zps_quant_kind kind = s_kinds[_i];
    enum { N = 700, CUT = 300, BLOCK = 128 };
    zps_quant_ef *whole = zps_quant_ef_new(kind, BLOCK, N);
    zps_quant_ef *a = zps_quant_ef_new(kind, BLOCK, CUT);
    zps_quant_ef *b = zps_quant_ef_new(kind, BLOCK, N - CUT);
    float delta[N];
    uint8_t bw[2048], bx[2048];
    size_t sa = s_size(kind, CUT, BLOCK), sb = s_size(kind, N - CUT, BLOCK);
    zps_rng r;
    zps_rng_seed(&r, 3, 0);
    for (int t = 0; t < 10; t++) {
        for (int i = 0; i < N; i++) {
            delta[i] = (float)zps_rng_normal(&r);
        }
        ck_assert_int_eq(zps_quant_ef_encode(whole, 0, delta, CUT, bw, sa), ZPS_OK);
        ck_assert_int_eq(zps_quant_ef_encode(a, 0, delta, CUT, bx, sa), ZPS_OK);
        ck_assert_mem_eq(bw, bx, sa);
        ck_assert_int_eq(zps_quant_ef_encode(whole, CUT, delta + CUT, N - CUT, bw, sb), ZPS_OK);
        ck_assert_int_eq(zps_quant_ef_encode(b, 0, delta + CUT, N - CUT, bx, sb), ZPS_OK);
        ck_assert_mem_eq(bw, bx, sb);
    }
    ck_assert_mem_eq(zps_quant_ef_residual(whole), zps_quant_ef_residual(a), CUT * sizeof(float));
    ck_assert_mem_eq(zps_quant_ef_residual(whole) + CUT, zps_quant_ef_residual(b),
                     (N - CUT) * sizeof(float));
    zps_quant_ef_destroy(&whole);
    zps_quant_ef_destroy(&a);
    zps_quant_ef_destroy(&b);
}
END_TEST

Suite *zps_suite_quant(void)
{
    Suite *s = suite_create("quant");
    const int kinds = (int)(sizeof s_kinds / sizeof s_kinds[0]);
    TCase *codec = tcase_create("codec");
    tcase_add_test(codec, test_quant_sizes_and_names);
    tcase_add_test(codec, test_quant_layout_by_hand);
    tcase_add_test(codec, test_quant_e3m0_rounds_to_nearest);
    tcase_add_loop_test(codec, test_quant_round_trip_within_its_bound, 0, kinds);
    tcase_add_loop_test(codec, test_quant_zero_blocks, 0, kinds);
    tcase_add_loop_test(codec, test_quant_one_huge_value_in_a_block, 0, kinds);
    tcase_add_loop_test(codec, test_quant_encode_refuses_nan_and_inf, 0, kinds);
    tcase_add_loop_test(codec, test_quant_decode_refuses_what_no_encoder_makes, 0, kinds);
    suite_add_tcase(s, codec);
    TCase *ef = tcase_create("error_feedback");
    tcase_add_loop_test(ef, test_quant_ef_sum_of_sent_tracks_sum_of_deltas, 0, kinds);
    tcase_add_loop_test(ef, test_quant_ef_refuses_and_changes_nothing, 0, kinds);
    tcase_add_loop_test(ef, test_quant_ef_ranges_are_independent, 0, kinds);
    suite_add_tcase(s, ef);
    return s;
}
