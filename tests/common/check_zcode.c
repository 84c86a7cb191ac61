/* check_zcode.c - the lossless code of the wire (common/zps_zcode.h): the
 * same bits back, with and without a base, smaller where the high planes
 * repeat, and every frame the encoder does not make refused; and a
 * message's frames coded and decoded (common/zps_wirecode.h). */
#include <stdlib.h>
#include <string.h>

#include "common/zps_rng.h"
#include "common/zps_wirecode.h"
#include "common/zps_zcode.h"
#include "tests/zps_check.h"

#define N 100000

// n values like a step's parameters: small, of a few binades.
static float *s_values(uint64_t seed, size_t n)
{
    float *v = malloc(n * sizeof *v);
    zps_rng r;
    zps_rng_seed(&r, seed, 0);
    for (size_t i = 0; i < n; i++) {
        v[i] = (float)((zps_rng_uniform(&r) - 0.5) * 0.2);
    }
    return v;
}

// base after one small step: v - 1e-4 * g, as SGD moves parameters.
static float *s_stepped(const float *base, uint64_t seed, size_t n)
{
    float *v = s_values(seed, n);
    for (size_t i = 0; i < n; i++) {
        v[i] = base[i] - 1e-4f * v[i];
    }
    return v;
}

static size_t s_round_trip(const float *src, const float *base, size_t n)
{
    zps_zcode *z = NULL;
    ck_assert_int_eq(zps_zcode_new(&z), ZPS_OK);
    void *frame = NULL;
    size_t len = 0, count = 0;
    ck_assert_int_eq(zps_zcode_encode(z, src, base, n, &frame, &len), ZPS_OK);
    char why[160];
    ck_assert_int_eq(zps_zcode_count(frame, len, &count, why, sizeof why), ZPS_OK);
    ck_assert_uint_eq(count, n);
    float *back = malloc(n * sizeof *back);
    ck_assert_int_eq(zps_zcode_decode(z, frame, len, base, back, n, why, sizeof why), ZPS_OK);
    ck_assert_mem_eq(back, src, n * sizeof *back);
    free(back);
    free(frame);
    zps_zcode_destroy(&z);
    ck_assert_ptr_null(z);
    return len;
}

START_TEST(test_zcode_gives_back_the_same_bits_with_and_without_a_base)
{
    float *base = s_values(1, N), *next = s_stepped(base, 2, N);
    next[7] = -0.0f; // signs, zeros, NaN and Inf come back as they went
    next[8] = __builtin_nanf("0x12345");
    next[9] = -__builtin_inff();
    size_t plain = s_round_trip(next, NULL, N);
    size_t xored = s_round_trip(next, base, N);
    ck_assert_uint_le(plain, ZPS_ZCODE_HEADER + 4 * N);
    // The step's change leaves the high planes nearly all zeros.
    ck_assert_uint_lt(xored, plain);
    ck_assert_uint_lt(xored, 3 * N);
    for (size_t n = 1; n < 5; n++) {
        (void)s_round_trip(next, base, n); // frames too short for zstd to shrink
    }
    free(base);
    free(next);
}
END_TEST

START_TEST(test_zcode_a_frame_of_zeros_shrinks_to_almost_nothing)
{
    float *zeros = calloc(N, sizeof *zeros);
    ck_assert_uint_lt(s_round_trip(zeros, NULL, N), 200);
    free(zeros);
}
END_TEST

START_TEST(test_zcode_refuses_counts_out_of_range)
{
    zps_zcode *z = NULL;
    ck_assert_int_eq(zps_zcode_new(&z), ZPS_OK);
    float v[1] = {1};
    void *frame = NULL;
    size_t len = 0;
    ck_assert_int_eq(zps_zcode_encode(z, v, NULL, 0, &frame, &len), ZPS_EINVAL);
    ck_assert_int_eq(zps_zcode_encode(z, v, NULL, ZPS_ZCODE_MAX + 1, &frame, &len), ZPS_EINVAL);
    ck_assert_ptr_null(frame);
    zps_zcode_destroy(&z);
}
END_TEST

// Decodes a changed frame and asserts it is refused with a reason.
static void s_refused(zps_zcode *z, const uint8_t *frame, size_t len, const float *base,
                      size_t n)
{
    float out[64];
    char why[160] = "";
    size_t count;
    zps_err err = zps_zcode_count(frame, len, &count, why, sizeof why);
    if (err == ZPS_OK) {
        err = zps_zcode_decode(z, frame, len, base, out, n, why, sizeof why);
    }
    ck_assert_int_eq(err, ZPS_EPROTO);
    ck_assert_str_ne(why, "");
}

START_TEST(test_zcode_refuses_every_frame_the_encoder_does_not_make)
{
    enum { M = 64 };
    float *base = s_values(3, M), *next = s_stepped(base, 4, M), other[M];
    zps_zcode *z = NULL;
    ck_assert_int_eq(zps_zcode_new(&z), ZPS_OK);
    uint8_t *frame = NULL;
    size_t len = 0;
    ck_assert_int_eq(zps_zcode_encode(z, next, base, M, (void **)&frame, &len), ZPS_OK);
    uint8_t *bad = malloc(len + 1);
    // Cut short, or one byte more.
    for (size_t cut = 0; cut < len; cut += 7) {
        s_refused(z, frame, cut, base, M);
    }
    memcpy(bad, frame, len);
    bad[len] = 0;
    s_refused(z, bad, len + 1, base, M);
    // Every single byte flipped: the header, a plane's length, its zstd
    // frame, a stored plane, the hash.
    for (size_t at = 0; at < len; at++) {
        memcpy(bad, frame, len);
        bad[at] ^= 0x40;
        s_refused(z, bad, len, base, M);
    }
    // Another count than the one due; no base, or another one.
    s_refused(z, frame, len, base, M - 1);
    s_refused(z, frame, len, NULL, M);
    memcpy(other, base, sizeof other);
    other[M - 1] = 1.0f;
    s_refused(z, frame, len, other, M);
    free(bad);
    free(frame);
    free(base);
    free(next);
    zps_zcode_destroy(&z);
}
END_TEST

// A message of n values (base's step taken by one SGD step) in frames of
// at most `per` values, as a receiver holds it.
static void s_msg(zps_wire_msg *m, const float *v, size_t n, size_t per)
{
    memset(m, 0, sizeof *m);
    m->hdr = malloc(sizeof *m->hdr);
    zps_wire_header_init(m->hdr, ZPS__MSG_TYPE__PARAMS);
    m->hdr->count = n;
    for (size_t at = 0; at < n; at += per) {
        size_t len = (n - at < per ? n - at : per) * sizeof(float);
        ck_assert_int_eq(zmq_msg_init_size(&m->frames[m->n_frames], len), 0);
        memcpy(zmq_msg_data(&m->frames[m->n_frames]), v + at, len);
        m->n_frames++;
        m->payload_bytes += len;
    }
}

static void s_msg_fini(zps_wire_msg *m)
{
    free(m->hdr); // not unpacked: zps_wire_msg_fini would free it as if it were
    m->hdr = NULL;
    zps_wire_msg_fini(m);
}

// The values of m's frames, in order, against v.
static void s_same_values(const zps_wire_msg *m, const float *v, size_t n)
{
    size_t at = 0;
    for (int f = 0; f < m->n_frames; f++) {
        size_t len = zmq_msg_size((zmq_msg_t *)&m->frames[f]);
        ck_assert_uint_le(at + len / sizeof(float), n);
        ck_assert_mem_eq(zmq_msg_data((zmq_msg_t *)&m->frames[f]), v + at, len);
        at += len / sizeof(float);
    }
    ck_assert_uint_eq(at, n);
    ck_assert_uint_eq(m->payload_bytes, n * sizeof(float));
}

START_TEST(test_wirecode_a_message_decodes_to_its_frames_and_values)
{
    float *base = s_values(5, N), *next = s_stepped(base, 6, N);
    zps_zcode *z = NULL;
    ck_assert_int_eq(zps_zcode_new(&z), ZPS_OK);
    zps_wire_msg m;
    s_msg(&m, next, N, N / 3); // 4 frames, the last shorter
    ck_assert_int_eq(zps_wirecode_encode(z, &m, base), ZPS_OK);
    ck_assert_int_eq(m.n_frames, 4);
    ck_assert_uint_lt(zmq_msg_size(&m.frames[0]), N / 3 * sizeof(float));
    m.hdr->wire_code = ZPS_ZCODE_XOR;
    m.hdr->code_base = 9;
    char why[200] = "";
    ck_assert_int_eq(zps_wirecode_decode(z, &m, base, N, why, sizeof why), ZPS_OK);
    s_same_values(&m, next, N);
    ck_assert_uint_eq(m.hdr->wire_code, 0);
    ck_assert_uint_eq(m.hdr->code_base, 9); // what the sender holds, for its answer
    s_msg_fini(&m);
    free(base);
    free(next);
    zps_zcode_destroy(&z);
}
END_TEST

// Decodes m coded as `code` with base, expecting a refusal with a reason
// and m's coded frames left as they were.
static void s_decode_refused(zps_zcode *z, zps_wire_msg *m, uint32_t code, const float *base,
                             uint64_t max)
{
    m->hdr->wire_code = code;
    size_t bytes = m->payload_bytes;
    char why[200] = "";
    ck_assert_int_eq(zps_wirecode_decode(z, m, base, max, why, sizeof why), ZPS_EPROTO);
    ck_assert_str_ne(why, "");
    ck_assert_uint_eq(m->payload_bytes, bytes);
    ck_assert_uint_eq(m->hdr->wire_code, code);
}

START_TEST(test_wirecode_refuses_what_the_header_does_not_allow)
{
    float *base = s_values(7, N), *next = s_stepped(base, 8, N);
    zps_zcode *z = NULL;
    ck_assert_int_eq(zps_zcode_new(&z), ZPS_OK);
    zps_wire_msg m;
    s_msg(&m, next, N, N / 2);
    ck_assert_int_eq(zps_wirecode_encode(z, &m, base), ZPS_OK);
    s_decode_refused(z, &m, 3, base, N);           // no such code
    s_decode_refused(z, &m, ZPS_ZCODE_XOR, NULL, N); // XORed, no base here
    s_decode_refused(z, &m, ZPS_ZCODE_PLANES, base, N); // XORed, decoded without
    s_decode_refused(z, &m, ZPS_ZCODE_XOR, base, N - 1); // more than the receiver's range
    m.hdr->count = N + 1;
    s_decode_refused(z, &m, ZPS_ZCODE_XOR, base, 2 * N); // fewer than the header's count
    m.hdr->count = N - 1;
    s_decode_refused(z, &m, ZPS_ZCODE_XOR, base, 2 * N); // more than the header's count
    s_msg_fini(&m);
    free(base);
    free(next);
    zps_zcode_destroy(&z);
}
END_TEST

Suite *zps_suite_zcode(void)
{
    Suite *s = suite_create("zcode");
    TCase *tc = tcase_create("code");
    tcase_add_test(tc, test_zcode_gives_back_the_same_bits_with_and_without_a_base);
    tcase_add_test(tc, test_zcode_a_frame_of_zeros_shrinks_to_almost_nothing);
    tcase_add_test(tc, test_zcode_refuses_counts_out_of_range);
    tcase_add_test(tc, test_zcode_refuses_every_frame_the_encoder_does_not_make);
    suite_add_tcase(s, tc);
    TCase *wire = tcase_create("wirecode");
    tcase_add_test(wire, test_wirecode_a_message_decodes_to_its_frames_and_values);
    tcase_add_test(wire, test_wirecode_refuses_what_the_header_does_not_allow);
    suite_add_tcase(s, wire);
    return s;
}
