/* zps_shard_fx.c - what the shard suites (check_shard, check_shard_outer,
 * check_shard_host, check_shard_io) build a shard and its pushes from,
 * kept once so that they mean the same job. */
#include "tests/server/shard/zps_shard_fx.h"

#include <check.h>
#include <string.h>
#include <zmq.h>

const uint32_t zps_shard_fx_offset[2] = {0, 10}, zps_shard_fx_count[2] = {10, 30};
const uint64_t zps_shard_fx_id[2] = {11, 22};

zps_model_spec zps_shard_fx_model(void)
{
    zps_model_spec m;
    ck_assert_int_eq(zps_model_parse("mlp:1-2-1", &m), ZPS_OK);
    return m;
}

void zps_shard_fx_add_plan(zps_shard *s)
{
    zps_plan_slice slices[2];
    // Slices borrowed, never freed: the shard keeps a copy of the plan.
    zps_plan plan = {.global_batch = ZPS_SHARD_FX_BATCH, .n = 2, .slices = slices};
    for (uint32_t r = 0; r < 2; r++) {
        plan.slices[r] = (zps_plan_slice){.rank = r, .member_id = zps_shard_fx_id[r],
                                          .offset = zps_shard_fx_offset[r],
                                          .count = zps_shard_fx_count[r]};
    }
    zps_shard_add_plan(s, 1, 0, &plan);
}

uint8_t *zps_shard_fx_msg(zps_wire_msg *m, const Zps__Header *h, size_t bytes)
{
    uint8_t buf[4096]; // a host leader's push carries up to 64 pieces (and a test more)
    ck_assert_uint_le(zps__header__get_packed_size(h), sizeof buf);
    size_t len = zps__header__pack(h, buf);
    memset(m, 0, sizeof *m);
    m->hdr = zps__header__unpack(NULL, len, buf);
    ck_assert_ptr_nonnull(m->hdr);
    zmq_msg_init_size(&m->frames[0], bytes);
    m->n_frames = 1;
    m->payload_bytes = bytes;
    return zmq_msg_data(&m->frames[0]);
}

void zps_shard_fx_push(zps_wire_msg *m, uint32_t rank, uint64_t id, uint32_t batch_offset,
                       uint32_t samples, const zps_shard_fx_piece *pieces, size_t n,
                       uint64_t off, uint64_t count, const float *vals)
{
    Zps__HostPiece hp[80];
    Zps__HostPiece *hpp[80];
    ck_assert_uint_le(n, 80);
    for (size_t i = 0; i < n; i++) {
        zps__host_piece__init(&hp[i]);
        hp[i].rank = pieces[i].rank;
        hp[i].batch_offset = pieces[i].offset;
        hp[i].samples = pieces[i].samples;
        hp[i].compute_ms = 5.0f;
        hp[i].loss = 2.0f;
        hpp[i] = &hp[i];
    }
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__PUSH);
    h.rank = rank;
    h.member_id = id;
    h.samples = samples;
    h.batch_offset = batch_offset;
    h.generation = 1;
    h.offset = off;
    h.count = count;
    h.dtype = ZPS__DTYPE__F32;
    h.loss = 2.0f;
    h.n_host_pieces = n;
    h.host_pieces = hpp;
    memcpy(zps_shard_fx_msg(m, &h, count * sizeof(float)), vals, count * sizeof(float));
}

void zps_shard_fx_params(zps_shard *s, uint64_t base, float *out)
{
    for (int b = 0; b < zps_shard_n_buckets(s); b++) {
        const void *data;
        uint64_t off, count;
        zps_wire_ref *ref;
        zps_shard_bucket_params(s, b, &data, &off, &count, &ref);
        memcpy(out + (off - base), data, count * sizeof(float));
    }
}
