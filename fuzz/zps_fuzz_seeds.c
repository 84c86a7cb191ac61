/* zps_fuzz_seeds.c - writes the seed corpus of the message-path fuzz target:
 * valid message sequences in the input format of zps_fuzz.h, one file per
 * scenario, so that fuzzing starts from inputs that train whole steps rather
 * than from bytes that never decode.
 *
 * Generated, not checked in: the seeds follow proto/zps.proto and the
 * shard's buckets as they are now. Usage: zps_fuzz_seeds DIR */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_plan.h"
#include "common/zps_wire.h"
#include "fuzz/zps_fuzz.h"

#define SEED_BYTES 65536

typedef struct seed {
    uint8_t buf[SEED_BYTES];
    size_t len;
    uint8_t config;           // the first byte
    zps_model_spec model;
    uint64_t lo, hi;          // the range served
    int n_buckets;
    zps_bucket buckets[ZPS_MODEL_MAX_BUCKETS];
    zps_plan plan;            // the first plan, as the target makes it
} seed;

static void s_put(seed *s, const void *p, size_t n)
{
    if (s->len + n > SEED_BYTES) {
        fprintf(stderr, "zps_fuzz_seeds: a seed outgrew %d bytes\n", SEED_BYTES);
        exit(EXIT_FAILURE);
    }
    memcpy(s->buf + s->len, p, n);
    s->len += n;
}

static void s_put_u8(seed *s, uint32_t v)
{
    uint8_t b = (uint8_t)v;
    s_put(s, &b, 1);
}

static void s_put_u16(seed *s, uint32_t v)
{
    s_put_u8(s, v & 0xffu);
    s_put_u8(s, v >> 8);
}

static void s_begin(seed *s, uint8_t config)
{
    memset(s, 0, sizeof *s);
    s->config = config;
    if (zps_model_parse(ZPS_FUZZ_MODEL, &s->model) != ZPS_OK) {
        exit(EXIT_FAILURE);
    }
    uint32_t index;
    zps_fuzz_range(config, &s->model, &index, &s->lo, &s->hi);
    s->n_buckets = zps_model_range_buckets(&s->model, s->lo, s->hi, s->buckets);
    static const uint32_t shares[2] = {0, 0};
    char why[128];
    if (zps_plan_split(zps_fuzz_global_batch(config), shares, 2, &s->plan, why, sizeof why) !=
        ZPS_OK) {
        fprintf(stderr, "zps_fuzz_seeds: %s\n", why);
        exit(EXIT_FAILURE);
    }
    s->plan.slices[0].member_id = ZPS_FUZZ_MEMBER0;
    s->plan.slices[1].member_id = ZPS_FUZZ_MEMBER1;
    s_put_u8(s, config);
}

// One message: the header, then the payload cut into `frames` frames (the
// last one takes the rest); with unaligned, the frames after the first
// are zero-copy at their own offset in the input.
static void s_msg(seed *s, const Zps__Header *h, const uint8_t *payload, size_t bytes,
                  int frames, bool unaligned)
{
    uint8_t head[4096];
    size_t hlen = zps__header__get_packed_size(h);
    if (hlen > sizeof head) {
        exit(EXIT_FAILURE);
    }
    zps__header__pack(h, head);
    s_put_u16(s, (uint32_t)hlen);
    s_put(s, head, hlen);
    frames = bytes == 0 ? 0 : frames;
    s_put_u8(s, (uint32_t)frames);
    size_t esize = zps_dtype_size((zps_dtype)h->dtype), off = 0;
    esize = esize ? esize : 1;
    for (int f = 0; f < frames; f++) {
        // Whole elements per frame, as zps_wire_check_tensor requires.
        size_t len = f == frames - 1 ? bytes - off : (bytes / esize / (size_t)frames) * esize;
        s_put_u16(s, (uint32_t)len | (unaligned && f > 0 ? ZPS_FUZZ_FRAME_UNALIGNED : 0));
        s_put(s, payload + off, len);
        off += len;
    }
}

typedef struct sender {
    uint32_t rank;
    uint64_t member_id;
    uint32_t offset, count; // its slice of the global batch
} sender;

static sender s_member(const seed *s, int i)
{
    const zps_plan_slice *sl = &s->plan.slices[i];
    return (sender){sl->rank, sl->member_id, sl->offset, sl->count};
}

// A PUSH of bucket b's gradient for a step, in the job's dtype.
static void s_push(seed *s, sender who, uint64_t step, uint32_t gen, int b, int frames,
                   bool unaligned)
{
    zps_dtype dtype = zps_fuzz_dtype(s->config);
    uint64_t count = s->buckets[b].hi - s->buckets[b].lo;
    float vals[ZPS_MODEL_MAX_BUCKETS * 16];
    uint8_t payload[sizeof vals];
    for (uint64_t i = 0; i < count; i++) {
        vals[i] = 0.01f * (float)(i + 1) * (float)(who.rank + 1) - 0.05f * (float)step;
    }
    zps_dtype_from_f32(dtype, vals, payload, count);
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__PUSH);
    h.job_id = 0x5eed;
    h.generation = gen;
    h.step = step;
    h.offset = s->buckets[b].lo;
    h.count = count;
    h.dtype = (Zps__DType)dtype;
    h.samples = who.count;
    h.batch_offset = who.offset;
    h.loss = 2.0f - 0.1f * (float)step;
    h.rank = who.rank;
    h.member_id = who.member_id;
    h.compute_ms = 1.5f;
    s_msg(s, &h, payload, count * zps_dtype_size(dtype), frames, unaligned);
}

static void s_pull(seed *s, sender who, uint64_t step)
{
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__PULL);
    h.job_id = 0x5eed;
    h.step = step;
    h.rank = who.rank;
    h.member_id = who.member_id;
    s_msg(s, &h, NULL, 0, 0, false);
}

// Every member of the first plan pushes every bucket of the step.
static void s_step(seed *s, uint64_t step, int frames, bool unaligned)
{
    for (int b = 0; b < s->n_buckets; b++) {
        for (int i = 0; i < 2; i++) {
            s_push(s, s_member(s, i), step, 1, b, frames, unaligned);
        }
    }
}

static void s_write(const seed *s, const char *dir, const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(s->buf, 1, s->len, f) != s->len || fclose(f) != 0) {
        perror(path);
        exit(EXIT_FAILURE);
    }
}

static uint8_t s_config(uint32_t dtype, uint32_t range, uint32_t global_batch)
{
    return (uint8_t)(dtype | range << 2 | (global_batch - 2) << 4);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: zps_fuzz_seeds DIR\n");
        return EXIT_FAILURE;
    }
    const char *dir = argv[1];
    static seed s;

    // Three whole steps on the whole model, then the parameters pulled.
    s_begin(&s, s_config(0, 0, 8));
    for (uint64_t step = 0; step < 3; step++) {
        s_step(&s, step, 1, false);
    }
    s_pull(&s, s_member(&s, 0), 3);
    s_pull(&s, s_member(&s, 1), 2);
    s_write(&s, dir, "steps-f32-whole");

    // bf16, the second half, payloads in two frames, the second unaligned.
    s_begin(&s, s_config(1, 2, 5));
    s_step(&s, 0, 2, true);
    s_step(&s, 1, 2, false);
    s_write(&s, dir, "steps-bf16-half-frames");

    // fp16, the middle third, odd batch; then a duplicate, a stale step, a
    // stranger and a wrong slice, all refused.
    s_begin(&s, s_config(2, 3, 17));
    s_step(&s, 0, 1, false);
    s_push(&s, s_member(&s, 0), 1, 1, 0, 1, false);
    s_push(&s, s_member(&s, 0), 1, 1, 0, 1, false);
    s_push(&s, s_member(&s, 1), 0, 1, 0, 1, false);
    s_push(&s, (sender){7, 0x77, 0, 3}, 1, 1, 0, 1, false);
    s_push(&s, (sender){1, ZPS_FUZZ_MEMBER1, 3, 9}, 1, 1, 0, 1, false);
    s_write(&s, dir, "refusals-f16-third");

    // A member leaves after step 0: its slice of step 1 is handed to the
    // other one, and a newcomer (plan generation 2, from step 2) pushes
    // before its plan reached the shard (held) and after.
    s_begin(&s, s_config(0, 1, 8));
    s_step(&s, 0, 1, false);
    sender a = s_member(&s, 0), gone = s_member(&s, 1);
    sender handed = {a.rank, a.member_id, gone.offset, gone.count};
    sender late = {2, 0x33, 4, 4};
    for (int b = 0; b < s.n_buckets; b++) {
        s_push(&s, a, 1, 1, b, 1, false);
        s_push(&s, handed, 1, 1, b, 1, false);
    }
    s_push(&s, gone, 1, 1, 0, 1, false); // its late copy: a duplicate
    s_push(&s, late, 2, 2, 0, 1, false); // held: generation 2 is not known yet
    {
        Zps__Slice s0 = ZPS__SLICE__INIT, s1 = ZPS__SLICE__INIT;
        s0.rank = 0;
        s0.offset = 0;
        s0.count = 4;
        s0.member_id = a.member_id;
        s1.rank = late.rank;
        s1.offset = 4;
        s1.count = 4;
        s1.member_id = late.member_id;
        Zps__Slice *slices[2] = {&s0, &s1};
        Zps__Plan plan = ZPS__PLAN__INIT;
        plan.generation = 2;
        plan.effective_step = 2;
        plan.n_slices = 2;
        plan.slices = slices;
        Zps__Header h;
        zps_wire_header_init(&h, ZPS__MSG_TYPE__PLAN);
        h.job_id = 0x5eed;
        h.plan = &plan;
        s_msg(&s, &h, NULL, 0, 0, false);
    }
    for (int b = 0; b < s.n_buckets; b++) {
        s_push(&s, (sender){0, a.member_id, 0, 4}, 2, 2, b, 1, false);
        if (b > 0) {
            s_push(&s, late, 2, 2, b, 1, false);
        }
    }
    s_pull(&s, late, 3);
    s_write(&s, dir, "handover-join-f32-half");

    // Pulls while a step is half done, and of steps gone or not reached.
    s_begin(&s, s_config(1, 0, 3));
    s_pull(&s, s_member(&s, 0), 0);
    s_push(&s, s_member(&s, 0), 0, 1, 0, 1, false);
    s_push(&s, s_member(&s, 1), 0, 1, 0, 1, false);
    s_pull(&s, s_member(&s, 1), 0);
    s_pull(&s, s_member(&s, 1), 1);
    s_push(&s, s_member(&s, 0), 0, 1, 1, 1, false);
    s_push(&s, s_member(&s, 1), 0, 1, 1, 1, false);
    s_pull(&s, s_member(&s, 0), 0);
    s_pull(&s, s_member(&s, 0), 5);
    s_write(&s, dir, "pulls-bf16-whole");

    // Coordinator messages that carry a plan or other bodies: checked as
    // any message is, and the plans decoded.
    s_begin(&s, s_config(0, 0, 6));
    {
        Zps__Slice s0 = ZPS__SLICE__INIT, s1 = ZPS__SLICE__INIT;
        s0.rank = 0;
        s0.count = 2;
        s0.member_id = 5;
        s1.rank = 3;
        s1.offset = 2;
        s1.count = 4;
        s1.member_id = 6;
        Zps__Slice *slices[2] = {&s0, &s1};
        Zps__Job job = ZPS__JOB__INIT;
        job.model = ZPS_FUZZ_MODEL;
        job.dataset = "synthetic:64";
        job.global_batch = 6;
        job.n_plan = 2;
        job.plan = slices;
        job.wire_dtype = ZPS__DTYPE__F32;
        job.generation = 3;
        job.plan_effective = 1;
        Zps__Header h;
        zps_wire_header_init(&h, ZPS__MSG_TYPE__ASSIGN);
        h.job = &job;
        s_msg(&s, &h, NULL, 0, 0, false);
        zps_wire_header_init(&h, ZPS__MSG_TYPE__JOB);
        h.job = &job;
        s_msg(&s, &h, NULL, 0, 0, false);
        Zps__Hello hello = ZPS__HELLO__INIT;
        hello.host = "fuzz";
        hello.device = "cpu";
        zps_wire_header_init(&h, ZPS__MSG_TYPE__HELLO);
        h.hello = &hello;
        s_msg(&s, &h, NULL, 0, 0, false);
        // A tensor on a message that is not a PUSH: checked, then ignored.
        float vals[4] = {1, 2, 3, 4};
        zps_wire_header_init(&h, ZPS__MSG_TYPE__EVAL);
        h.offset = 3;
        h.count = 4;
        h.dtype = ZPS__DTYPE__F32;
        s_msg(&s, &h, (const uint8_t *)vals, sizeof vals, 2, true);
    }
    s_write(&s, dir, "coordinator-messages");
    return EXIT_SUCCESS;
}
