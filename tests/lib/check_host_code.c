/* check_host_code.c - a host leader's side of --wire-code zstd
 * (lib/zps_host_code.c) on a client with no socket: what it keeps of the
 * shards' answers, the base its pushes name, answers XORed with the step
 * before decoded, and every answer it cannot decode dropped with its
 * copy forgotten, asked for again (by the wait) only once a step. */
#include <stdlib.h>
#include <string.h>

#include "common/zps_wirecode.h"
#include "lib/zps_client_int.h"
#include "lib/zps_host_int.h"
#include "tests/zps_check.h"

#define N 8 // parameters: one shard elsewhere, buckets [0, 4) and [4, 8)

// A client that leads a host group, the shard elsewhere as above.
static zps_client *s_leader(void)
{
    zps_client *c = calloc(1, sizeof *c);
    ck_assert_ptr_nonnull(c);
    c->dtype = ZPS_DTYPE_F32;
    c->model.n_params = N;
    c->conn.n_shards = 1;
    zps_conn_shard *sc = &c->conn.shards[0];
    strcpy(sc->endpoint, "tcp://shard-elsewhere");
    sc->lo = 0;
    sc->hi = N;
    sc->n_buckets = 2;
    sc->buckets[0] = (zps_bucket){.lo = 0, .hi = 4};
    sc->buckets[1] = (zps_bucket){.lo = 4, .hi = 8};
    c->host.codes = true;
    c->host.n = 2;
    c->host.me = 0;
    c->host.sock = c; // leads (zps_host_leads): never used as a socket here
    c->host.remote[0] = true;
    return c;
}

static void s_leader_free(zps_client *c)
{
    zps_host_code_fini(&c->host);
    free(c);
}

// Step `step`'s values of bucket b, as a shard would send them.
static void s_values(uint64_t step, int b, float *v)
{
    for (int i = 0; i < 4; i++) {
        v[i] = 0.25f * (float)(4 * b + i) - 0.001f * (float)step;
    }
}

// Shard 0's PARAMS of bucket b for `step`: uncoded, or XORed with the
// values of `base_step` (code_base base_step + 1).
static void s_params(zps_wire_msg *m, zps_zcode *z, int b, uint64_t step, bool coded,
                     uint64_t base_step)
{
    float v[4], base[4];
    memset(m, 0, sizeof *m);
    m->hdr = malloc(sizeof *m->hdr);
    zps_wire_header_init(m->hdr, ZPS__MSG_TYPE__PARAMS);
    m->hdr->step = step;
    m->hdr->offset = (uint64_t)b * 4;
    m->hdr->count = 4;
    m->hdr->dtype = ZPS__DTYPE__F32;
    s_values(step, b, v);
    ck_assert_int_eq(zmq_msg_init_size(&m->frames[0], sizeof v), 0);
    memcpy(zmq_msg_data(&m->frames[0]), v, sizeof v);
    m->n_frames = 1;
    m->payload_bytes = sizeof v;
    if (coded) {
        s_values(base_step, b, base);
        ck_assert_int_eq(zps_wirecode_encode(z, m, base), ZPS_OK);
        m->hdr->wire_code = ZPS_ZCODE_XOR;
        m->hdr->code_base = base_step + 1;
    }
}

static void s_msg_fini(zps_wire_msg *m)
{
    free(m->hdr); // not unpacked
    m->hdr = NULL;
    zps_wire_msg_fini(m);
}

// Takes shard 0's PARAMS of bucket b for step, the wait at `step`; what
// zps_host_code_take said.
static bool s_take(zps_client *c, zps_zcode *z, int b, uint64_t step, bool coded,
                   uint64_t base_step)
{
    zps_wire_msg m;
    s_params(&m, z, b, step, coded, base_step);
    bool took = zps_host_code_take(c, 0, &m, step);
    if (took) { // as if never coded: the step's values
        float v[4];
        s_values(step, b, v);
        ck_assert_uint_eq(m.hdr->wire_code, 0);
        ck_assert_int_eq(m.n_frames, 1);
        ck_assert_mem_eq(zmq_msg_data(&m.frames[0]), v, sizeof v);
    }
    s_msg_fini(&m);
    return took;
}

// The code_base a push of `step` to shard 0 says, its frame coded.
static uint64_t s_push_base(zps_client *c, uint64_t step)
{
    zps_wire_msg out = {.n_frames = 1};
    float g[4] = {1, 2, 3, 4};
    ck_assert_int_eq(zmq_msg_init_size(&out.frames[0], sizeof g), 0);
    memcpy(zmq_msg_data(&out.frames[0]), g, sizeof g);
    Zps__Header hd;
    zps_wire_header_init(&hd, ZPS__MSG_TYPE__PUSH);
    hd.step = step;
    zps_host_code_push(c, 0, &hd, &out);
    ck_assert_uint_eq(hd.wire_code, ZPS_ZCODE_PLANES);
    ck_assert_uint_ne(zmq_msg_size(&out.frames[0]), sizeof g); // coded
    zps_wire_msg_fini(&out);
    return hd.code_base;
}

START_TEST(test_host_code_keeps_what_came_and_decodes_the_next_step_against_it)
{
    zps_client *c = s_leader();
    zps_zcode *z = NULL;
    ck_assert_int_eq(zps_zcode_new(&z), ZPS_OK);
    ck_assert_uint_eq(s_push_base(c, 0), 0); // holds nothing yet
    ck_assert(s_take(c, z, 0, 1, false, 0));
    ck_assert(s_take(c, z, 1, 1, false, 0));
    ck_assert_uint_eq(s_push_base(c, 1), 2); // both buckets of step 1
    ck_assert(s_take(c, z, 0, 2, true, 1)); // XORed with step 1's: decoded
    ck_assert_uint_eq(s_push_base(c, 1), 2); // an answer between a step's pushes changes nothing
    ck_assert(s_take(c, z, 1, 2, true, 1));
    ck_assert_uint_eq(s_push_base(c, 2), 3);
    ck_assert_uint_eq(c->host.coded_in, 2);
    ck_assert(s_take(c, z, 0, 1, false, 0)); // a late answer of step 1: not kept over step 2
    ck_assert(s_take(c, z, 0, 3, true, 2));
    zps_zcode_destroy(&z);
    s_leader_free(c);
}
END_TEST

START_TEST(test_host_code_drops_what_it_cannot_decode_and_forgets_the_shard)
{
    zps_client *c = s_leader();
    zps_zcode *z = NULL;
    ck_assert_int_eq(zps_zcode_new(&z), ZPS_OK);
    ck_assert(s_take(c, z, 0, 1, false, 0));
    ck_assert(s_take(c, z, 1, 1, false, 0));
    ck_assert(!s_take(c, z, 0, 2, true, 0)); // XORed with step 0's: the copy holds step 1's
    ck_assert_uint_eq(c->host.code_steps[0][1], 0); // the whole shard forgotten
    ck_assert(!s_take(c, z, 1, 2, true, 1)); // so the next coded one cannot be decoded
    ck_assert_uint_eq(s_push_base(c, 2), 0);
    ck_assert(s_take(c, z, 0, 2, false, 0)); // uncoded, as the PULL answers: kept again
    ck_assert(s_take(c, z, 1, 2, false, 0));
    ck_assert_uint_eq(s_push_base(c, 3), 3);
    ck_assert(!s_take(c, z, 0, 3, true, UINT64_MAX)); // code_base 0 names no step
    ck_assert_uint_eq(c->host.coded_in, 0);
    zps_zcode_destroy(&z);
    s_leader_free(c);
}
END_TEST

// Not leading, it does not keep up its copy: forgotten at the first
// uncoded answer, and a rollback forgets it too.
START_TEST(test_host_code_forgets_its_copy_when_not_leading_or_rolled_back)
{
    zps_client *c = s_leader();
    zps_zcode *z = NULL;
    ck_assert_int_eq(zps_zcode_new(&z), ZPS_OK);
    ck_assert(s_take(c, z, 0, 1, false, 0));
    ck_assert(s_take(c, z, 1, 1, false, 0));
    zps_host_code_forget(c);
    ck_assert_uint_eq(c->host.code_steps[0][0], 0);
    ck_assert_uint_eq(c->host.code_steps[0][1], 0);
    ck_assert(s_take(c, z, 0, 1, false, 0));
    c->host.me = 1; // follows now
    ck_assert(s_take(c, z, 1, 1, false, 0));
    ck_assert_uint_eq(c->host.code_steps[0][0], 0);
    zps_zcode_destroy(&z);
    s_leader_free(c);
}
END_TEST

Suite *zps_suite_host_code(void)
{
    Suite *s = suite_create("host_code");
    TCase *tc = tcase_create("leader");
    tcase_add_test(tc, test_host_code_keeps_what_came_and_decodes_the_next_step_against_it);
    tcase_add_test(tc, test_host_code_drops_what_it_cannot_decode_and_forgets_the_shard);
    tcase_add_test(tc, test_host_code_forgets_its_copy_when_not_leading_or_rolled_back);
    suite_add_tcase(s, tc);
    return s;
}
