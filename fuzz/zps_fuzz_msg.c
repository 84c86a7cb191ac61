/* zps_fuzz_msg.c - libFuzzer target over a shard's whole message path,
 * without sockets: header decode, the checks of common/zps_wire.c, plans
 * from the wire, and the shard's state machine fed a sequence of messages.
 *
 * The input (format in zps_fuzz.h) is cut into messages, each built as
 * zps_wire_recv builds it (decoded header, payload frames as zmq_msg_t) and
 * handled as server/zps_server.c handles it: a PUSH goes to zps_shard_push,
 * a ready bucket is applied, a done step ended, a push of a plan not heard
 * of yet is held until a PLAN brings it; a PULL reads what
 * zps_shard_bucket_at serves. Besides the sanitizers' verdict the target
 * checks what the shard promises, and aborts when a promise breaks:
 *   - a refused push changes no parameter;
 *   - a bucket becomes ready at most once per step, and once applied its
 *     next-step parameters can be served;
 *   - a plan that zps_plan_from_wire accepts tiles its global batch with
 *     at most ZPS_MAX_MEMBERS slices in rank order.
 *
 * Built with clang -fsanitize=fuzzer for make fuzz; zps_fuzz_replay.c runs
 * the same function over saved inputs in make test, with any compiler. */
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_log.h"
#include "common/zps_plan.h"
#include "common/zps_wire.h"
#include "fuzz/zps_fuzz.h"
#include "server/zps_shard.h"

#define ZPS_FUZZ_HELD 8 // pushes on hold for a newer plan (the server keeps 32)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

// A broken promise is a finding: report it and abort, so that libFuzzer
// saves the input and the replay runner fails. A function behind the
// macro, so that each check is one call, not one more branch to read.
#define FUZZ_CHECK(cond, ...) s_check((cond), __LINE__, __VA_ARGS__)

__attribute__((format(printf, 3, 4))) static void s_check(bool ok, int line, const char *fmt,
                                                          ...)
{
    if (ok) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "zps_fuzz: %s:%d: promise broken: ", __FILE__, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

typedef struct s_reader {
    const uint8_t *p; // the input
    size_t len, pos;  // its length and the read position
} s_reader;

static size_t s_left(const s_reader *r)
{
    return r->len - r->pos;
}

static uint32_t s_u8(s_reader *r)
{
    return s_left(r) >= 1 ? r->p[r->pos++] : 0;
}

static uint32_t s_u16(s_reader *r)
{
    uint32_t lo = s_u8(r);
    return lo | s_u8(r) << 8;
}

// Everything one input runs against.
typedef struct s_state {
    zps_model_spec model;
    zps_shard *shard;
    zps_dtype dtype;
    uint32_t global_batch;
    uint8_t *copy;                   // owned: the input, for unaligned zero-copy frames
    zps_wire_msg *held;              // owned: ZPS_FUZZ_HELD pushes waiting for their plan
    int n_held;
    uint8_t before[ZPS_MODEL_MAX_BUCKETS * 64]; // the parameters as sent, before a push
} s_state;

// Reads one message as zps_wire_recv returns it; false when it would have
// been refused before any handler saw it (does not decode, other version,
// too many frames). m needs zps_wire_msg_fini either way.
static bool s_read_msg(s_state *st, s_reader *r, zps_wire_msg *m)
{
    memset(m, 0, sizeof *m);
    size_t hlen = s_u16(r);
    hlen = hlen < s_left(r) ? hlen : s_left(r);
    m->hdr = zps__header__unpack(NULL, hlen, r->p + r->pos);
    r->pos += hlen;
    uint32_t n_frames = s_u8(r);
    bool ok = m->hdr != NULL && m->hdr->version == ZPS_WIRE_VERSION;
    for (uint32_t i = 0; i < n_frames; i++) {
        uint32_t word = s_u16(r);
        size_t len = word & ZPS_FUZZ_FRAME_LEN;
        len = len < s_left(r) ? len : s_left(r);
        const uint8_t *src = r->p + r->pos;
        r->pos += len;
        if (m->n_frames == ZPS_WIRE_MAX_FRAMES) {
            ok = false; // zps_wire_recv drains the rest and refuses the message
            continue;
        }
        zmq_msg_t *f = &m->frames[m->n_frames];
        if (word & ZPS_FUZZ_FRAME_UNALIGNED) {
            // No free function: the copy outlives every message of the input.
            zmq_msg_init_data(f, st->copy + (src - r->p), len, NULL, NULL);
        } else {
            FUZZ_CHECK(zmq_msg_init_size(f, len) == 0, "zmq_msg_init_size(%zu)", len);
            memcpy(zmq_msg_data(f), src, len);
        }
        m->n_frames++;
        m->payload_bytes += len;
    }
    return ok;
}

// The bytes of every bucket's parameters as the shard would send them.
static size_t s_params(s_state *st, uint8_t *out)
{
    size_t n = 0, esize = zps_dtype_size(st->dtype);
    for (int b = 0; b < zps_shard_n_buckets(st->shard); b++) {
        const void *data;
        uint64_t offset, count;
        zps_wire_ref *ref;
        zps_shard_bucket_params(st->shard, b, &data, &offset, &count, &ref);
        FUZZ_CHECK(offset >= zps_shard_lo(st->shard) && count <= zps_shard_hi(st->shard) - offset,
                   "bucket %d [%llu, +%llu) outside the shard", b, (unsigned long long)offset,
                   (unsigned long long)count);
        memcpy(out + n, data, count * esize);
        n += count * esize;
    }
    return n;
}

static void s_on_push(s_state *st, zps_wire_msg *m);

// A new plan generation: as the server does, held pushes get another try.
static void s_replay_held(s_state *st)
{
    int n = st->n_held;
    zps_wire_msg again[ZPS_FUZZ_HELD];
    for (int i = 0; i < n; i++) {
        zps_wire_msg_move(&again[i], &st->held[i]);
    }
    st->n_held = 0;
    for (int i = 0; i < n; i++) {
        s_on_push(st, &again[i]);
        zps_wire_msg_fini(&again[i]);
    }
}

static void s_on_push(s_state *st, zps_wire_msg *m)
{
    char why[256] = "";
    int ready = -2;
    uint64_t step = zps_shard_step(st->shard);
    uint32_t offset = m->hdr->batch_offset, samples = m->hdr->samples;
    size_t n = s_params(st, st->before);
    zps_err err = zps_shard_push(st->shard, m, &ready, why, sizeof why);
    if (err == ZPS_EAGAIN && st->n_held < ZPS_FUZZ_HELD) {
        zps_wire_msg_move(&st->held[st->n_held++], m);
    }
    uint8_t after[sizeof st->before];
    FUZZ_CHECK(s_params(st, after) == n && memcmp(st->before, after, n) == 0,
               "a push (%s) changed parameters before any update", zps_strerror(err));
    FUZZ_CHECK(zps_shard_step(st->shard) == step, "a push moved the step");
    (void)zps_shard_slice_done(st->shard, offset, samples); // the server's stall check
    if (err != ZPS_OK) {
        FUZZ_CHECK(ready == -1 && why[0] != '\0', "refused (%s) with ready %d and no reason",
                   zps_strerror(err), ready);
        return;
    }
    FUZZ_CHECK(ready >= -1 && ready < zps_shard_n_buckets(st->shard), "ready bucket %d", ready);
    if (ready < 0) {
        return;
    }
    FUZZ_CHECK(!zps_shard_applied(st->shard, ready), "bucket %d ready twice in step %llu", ready,
               (unsigned long long)step);
    zps_shard_apply(st->shard, ready);
    const float *values;
    FUZZ_CHECK(zps_shard_bucket_at(st->shard, ready, step + 1, &values) == ZPS_OK,
               "bucket %d updated but step %llu's values not served", ready,
               (unsigned long long)(step + 1));
    if (zps_shard_step_done(st->shard)) {
        (void)zps_shard_end_step(st->shard);
        FUZZ_CHECK(zps_shard_step(st->shard) == step + 1, "end_step did not advance the step");
    }
}

// A PULL, as the server serves it: every bucket's values of the step asked
// for that the shard has, read in full.
static void s_on_pull(s_state *st, const zps_wire_msg *m)
{
    if (!zps_shard_is_member(st->shard, m->hdr->member_id)) {
        return;
    }
    volatile float sink = 0;
    for (int b = 0; b < zps_shard_n_buckets(st->shard); b++) {
        const float *values;
        const void *data;
        uint64_t offset, count;
        zps_wire_ref *ref;
        zps_shard_bucket_params(st->shard, b, &data, &offset, &count, &ref);
        if (zps_shard_bucket_at(st->shard, b, m->hdr->step, &values) == ZPS_OK) {
            for (uint64_t i = 0; i < count; i++) {
                sink += values[i];
            }
        }
    }
    (void)sink;
}

// Checks what zps_plan_from_wire promises of a plan it accepted.
static void s_check_plan(const zps_plan *p, uint32_t global_batch)
{
    FUZZ_CHECK(p->n >= 1 && p->n <= ZPS_MAX_MEMBERS, "plan of %u members", p->n);
    FUZZ_CHECK(p->global_batch == global_batch, "plan global batch %u, asked %u",
               p->global_batch, global_batch);
    uint64_t next = 0;
    for (uint32_t i = 0; i < p->n; i++) {
        const zps_plan_slice *sl = &p->slices[i];
        FUZZ_CHECK(sl->offset == next && sl->count > 0, "slice %u does not tile the batch", i);
        FUZZ_CHECK(i == 0 || sl->rank > p->slices[i - 1].rank, "ranks out of order at %u", i);
        next += sl->count;
    }
    FUZZ_CHECK(next == global_batch, "slices cover %llu of %u", (unsigned long long)next,
               global_batch);
}

static void s_on_plan(s_state *st, const Zps__Plan *p)
{
    zps_plan plan;
    if (zps_plan_from_wire(p->slices, p->n_slices, st->global_batch, &plan) != ZPS_OK) {
        return;
    }
    s_check_plan(&plan, st->global_batch);
    zps_shard_add_plan(st->shard, p->generation, p->effective_step, &plan);
    s_replay_held(st);
}

static void s_on_job(const Zps__Job *job)
{
    zps_plan plan;
    if (zps_plan_from_wire(job->plan, job->n_plan, job->global_batch, &plan) == ZPS_OK) {
        s_check_plan(&plan, job->global_batch);
    }
}

// Whatever its type, a message's tensor is checked against the whole model
// and, if it passes, copied out in full.
static void s_check_any(s_state *st, const zps_wire_msg *m)
{
    char why[256];
    (void)zps_wire_type_name((int)m->hdr->type);
    // zps_wire_check_tensor takes a valid dtype (the job's), never the
    // peer's word for it: the peer's goes in the header it checks.
    int dtype = zps_dtype_valid((int)m->hdr->dtype) ? (int)m->hdr->dtype : (int)st->dtype;
    if (zps_wire_check_tensor(m, dtype, 0, st->model.n_params, why, sizeof why) == ZPS_OK) {
        FUZZ_CHECK(m->payload_bytes <= st->model.n_params * 4, "a checked tensor of %zu bytes",
                   m->payload_bytes);
        uint8_t buf[ZPS_MODEL_MAX_BUCKETS * 64];
        zps_wire_copy_payload(m, buf);
    }
}

static void s_dispatch(s_state *st, zps_wire_msg *m)
{
    s_check_any(st, m);
    switch (m->hdr->type) {
    case ZPS__MSG_TYPE__PUSH:
        s_on_push(st, m);
        break;
    case ZPS__MSG_TYPE__PULL:
        s_on_pull(st, m);
        break;
    case ZPS__MSG_TYPE__PLAN:
        if (m->hdr->plan) {
            s_on_plan(st, m->hdr->plan);
        }
        break;
    case ZPS__MSG_TYPE__ASSIGN:
    case ZPS__MSG_TYPE__JOB:
        if (m->hdr->job) {
            s_on_job(m->hdr->job);
        }
        break;
    default:
        break;
    }
}

static bool s_setup(s_state *st, uint8_t config)
{
    if (zps_model_parse(ZPS_FUZZ_MODEL, &st->model) != ZPS_OK) {
        return false;
    }
    st->dtype = zps_fuzz_dtype(config);
    st->global_batch = zps_fuzz_global_batch(config);
    zps_shard_cfg cfg = {
        .model = &st->model, .seed = ZPS_FUZZ_SEED, .global_batch = st->global_batch,
        .dtype = st->dtype,
        .optim = {.lr = 0.1f, .momentum = 0.9f, .weight_decay = 1e-4f,
                  .schedule = ZPS_LR_COSINE, .warmup_steps = 2, .total_steps = 16},
    };
    zps_fuzz_range(config, &st->model, &cfg.index, &cfg.lo, &cfg.hi);
    FUZZ_CHECK(cfg.hi - cfg.lo <= (uint64_t)ZPS_MODEL_MAX_BUCKETS * 16, "range too long for the buffers");
    if (!(st->shard = zps_shard_new(&cfg))) {
        return false;
    }
    static const uint32_t shares[2] = {0, 0};
    zps_plan plan;
    char why[128];
    FUZZ_CHECK(zps_plan_split(st->global_batch, shares, 2, &plan, why, sizeof why) == ZPS_OK,
               "%s", why);
    plan.slices[0].member_id = ZPS_FUZZ_MEMBER0;
    plan.slices[1].member_id = ZPS_FUZZ_MEMBER1;
    zps_shard_add_plan(st->shard, 1, 0, &plan);
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool quiet;
    if (!quiet) {
        zps_log_set_level(ZPS_LOG_ERROR); // refusals are the normal case here
        quiet = true;
    }
    if (size < 1) {
        return 0;
    }
    s_state st;
    memset(&st, 0, sizeof st);
    st.copy = malloc(size);
    st.held = calloc(ZPS_FUZZ_HELD, sizeof *st.held);
    if (!st.copy || !st.held || !s_setup(&st, data[0])) {
        free(st.copy);
        free(st.held);
        return 0;
    }
    memcpy(st.copy, data, size);
    s_reader r = {.p = data, .len = size, .pos = 1};
    while (s_left(&r) > 0) {
        zps_wire_msg m;
        if (s_read_msg(&st, &r, &m)) {
            s_dispatch(&st, &m);
        }
        zps_wire_msg_fini(&m);
    }
    for (int i = 0; i < st.n_held; i++) {
        zps_wire_msg_fini(&st.held[i]);
    }
    zps_shard_destroy(&st.shard);
    free(st.held);
    free(st.copy);
    return 0;
}
