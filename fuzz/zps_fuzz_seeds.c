/* zps_fuzz_seeds.c - writes inputs of the message-path fuzz target in the
 * format of zps_fuzz.h: the seed corpus (valid message sequences that
 * train whole steps, so that fuzzing starts from what reaches deep
 * states rather than from bytes that never decode), and, with
 * --regressions, the lies of issue 14, one file each, as kept in
 * fuzz/regressions/.
 *
 * The seeds are generated, not checked in: they follow proto/zps.proto
 * and the shards' buckets as they are now.
 * Usage: zps_fuzz_seeds DIR | zps_fuzz_seeds --regressions DIR */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_model.h"
#include "common/zps_plan.h"
#include "common/zps_wire.h"
#include "common/zps_zcode.h"
#include "fuzz/zps_fuzz.h"

#define SEED_BYTES 65536

typedef struct seed {
    uint8_t buf[SEED_BYTES];
    size_t len;
    uint8_t config;           // the first byte
    zps_model_spec model;
    uint64_t lo, hi;          // the range of the server under test
    int n_buckets;
    zps_bucket buckets[ZPS_MODEL_MAX_BUCKETS];
    zps_plan plan;            // the first plan, as the coordinator makes it
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

static uint8_t s_config(uint32_t dtype, zps_fuzz_stage stage, uint32_t global_batch)
{
    return (uint8_t)(dtype | (uint32_t)stage << 2 | (global_batch - 2) << 4);
}

// s is static (zeroed) or was begun before: its last plan is freed.
static void s_begin(seed *s, uint8_t config)
{
    zps_plan_fini(&s->plan);
    memset(s, 0, sizeof *s);
    s->config = config;
    if (zps_model_parse(ZPS_FUZZ_MODEL, &s->model) != ZPS_OK) {
        exit(EXIT_FAILURE);
    }
    uint32_t index = zps_fuzz_stage_of(config) == ZPS_FUZZ_SHARD1 ? 1 : 0;
    zps_model_shard_range(s->model.n_params, index, 2, &s->lo, &s->hi);
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

// One message from `peer`: the header, then the payload cut into `frames`
// frames (the last one takes the rest).
static void s_msg(seed *s, zps_fuzz_peer peer, const Zps__Header *h, const void *payload,
                  size_t bytes, int frames)
{
    uint8_t head[4096];
    size_t hlen = zps__header__get_packed_size(h);
    if (hlen > sizeof head) {
        exit(EXIT_FAILURE);
    }
    zps__header__pack(h, head);
    s_put_u8(s, (uint32_t)peer);
    s_put_u16(s, (uint32_t)hlen);
    s_put(s, head, hlen);
    frames = bytes == 0 ? 0 : frames;
    s_put_u8(s, (uint32_t)frames);
    size_t esize = zps_dtype_size((zps_dtype)h->dtype), off = 0;
    esize = esize ? esize : 1;
    const uint8_t *p = payload;
    for (int f = 0; f < frames; f++) {
        // Whole elements per frame, as zps_wire_check_tensor requires.
        size_t len = f == frames - 1 ? bytes - off : (bytes / esize / (size_t)frames) * esize;
        s_put_u16(s, (uint32_t)len);
        s_put(s, p + off, len);
        off += len;
    }
}

// A header as a peer that holds its credentials writes it (placeholders).
static Zps__Header s_header(Zps__MsgType type, zps_fuzz_peer peer, uint64_t step)
{
    Zps__Header h;
    zps_wire_header_init(&h, type);
    h.job_id = ZPS_FUZZ_JOB;
    h.step = step;
    h.generation = 1;
    h.rank = peer == ZPS_FUZZ_WORKER1 ? 1 : 0;
    h.member_id = peer == ZPS_FUZZ_WORKER1 ? ZPS_FUZZ_MEMBER1 : ZPS_FUZZ_MEMBER0;
    h.shard = 1;
    h.shard_token = ZPS_FUZZ_TOKEN;
    return h;
}

// Worker `peer`'s PUSH of bucket b for a step, of its own slice (or the
// slice of `as`), in the job's dtype; NaN values if asked.
static void s_push(seed *s, zps_fuzz_peer peer, int as, uint64_t step, uint32_t gen, int b,
                   int frames, bool nan)
{
    zps_dtype dtype = zps_fuzz_dtype(s->config);
    uint64_t count = s->buckets[b].hi - s->buckets[b].lo;
    float vals[ZPS_MODEL_MAX_BUCKETS * 16];
    uint8_t payload[sizeof vals];
    for (uint64_t i = 0; i < count; i++) {
        vals[i] = nan ? NAN : 0.01f * (float)(i + 1) * (float)(peer + 1) - 0.05f * (float)step;
    }
    zps_dtype_from_f32(dtype, vals, payload, count);
    Zps__Header h = s_header(ZPS__MSG_TYPE__PUSH, peer, step);
    h.generation = gen;
    h.offset = s->buckets[b].lo;
    h.count = count;
    h.dtype = (Zps__DType)dtype;
    h.samples = s->plan.slices[as].count;
    h.batch_offset = s->plan.slices[as].offset;
    h.loss = 2.0f - 0.1f * (float)step;
    h.compute_ms = 1.5f;
    if (!zps_fuzz_coded(s->config)) {
        s_msg(s, peer, &h, payload, count * zps_dtype_size(dtype), frames);
        return;
    }
    // --wire-code zstd: one coded frame, as a host's leader sends it.
    zps_zcode *z = NULL;
    void *coded = NULL;
    size_t len = 0;
    if (zps_zcode_new(&z) != ZPS_OK ||
        zps_zcode_encode(z, vals, NULL, count, &coded, &len) != ZPS_OK) {
        fprintf(stderr, "zps_fuzz_seeds: could not code a push\n");
        exit(1);
    }
    h.wire_code = ZPS_ZCODE_PLANES;
    s_msg(s, peer, &h, coded, len, 1);
    free(coded);
    zps_zcode_destroy(&z);
}

static void s_pull(seed *s, zps_fuzz_peer peer, uint64_t step)
{
    Zps__Header h = s_header(ZPS__MSG_TYPE__PULL, peer, step);
    s_msg(s, peer, &h, NULL, 0, 0);
}

// Both workers push every bucket of the server's range for the step.
static void s_step(seed *s, uint64_t step, uint32_t gen, int frames)
{
    for (int b = 0; b < s->n_buckets; b++) {
        s_push(s, ZPS_FUZZ_WORKER0, 0, step, gen, b, frames, false);
        s_push(s, ZPS_FUZZ_WORKER1, 1, step, gen, b, frames, false);
    }
}

static void s_simple(seed *s, zps_fuzz_peer peer, Zps__MsgType type, uint64_t step)
{
    Zps__Header h = s_header(type, peer, step);
    s_msg(s, peer, &h, NULL, 0, 0);
}

static void s_eval(seed *s, zps_fuzz_peer peer, uint64_t epoch, uint32_t offset, uint32_t count,
                   uint32_t correct)
{
    Zps__Eval ev = ZPS__EVAL__INIT;
    ev.epoch = epoch;
    ev.offset = offset;
    ev.count = count;
    ev.correct = correct;
    ev.loss_sum = 0.5 * count;
    Zps__Header h = s_header(ZPS__MSG_TYPE__EVAL, peer, 0);
    h.eval = &ev;
    s_msg(s, peer, &h, NULL, 0, 0);
}

// A REGISTER of shard `index` at `endpoint`.
static void s_register(seed *s, zps_fuzz_peer peer, uint32_t index, const char *endpoint,
                       bool serving, uint64_t token)
{
    Zps__Register reg = ZPS__REGISTER__INIT;
    reg.index = index;
    reg.shards = 2;
    reg.endpoint = (char *)endpoint;
    reg.resume = true;
    reg.serving = serving;
    Zps__Header h = s_header(ZPS__MSG_TYPE__REGISTER, peer, 0);
    h.job_id = 0;
    h.shard = index;
    h.shard_token = token;
    h.registration = &reg;
    s_msg(s, peer, &h, NULL, 0, 0);
}

static void s_ready(seed *s, zps_fuzz_peer peer, uint64_t step, uint64_t token)
{
    Zps__Header h = s_header(ZPS__MSG_TYPE__READY, peer, step);
    h.shard_token = token;
    s_msg(s, peer, &h, NULL, 0, 0);
}

// The coordinator peer's PLAN of generation gen from `effective`, the
// first plan's members (SHARD1).
static void s_plan(seed *s, Zps__MsgType type, uint32_t gen, uint64_t effective)
{
    Zps__Slice sl[2], *sp[2];
    for (int i = 0; i < 2; i++) {
        zps__slice__init(&sl[i]);
        sl[i].rank = s->plan.slices[i].rank;
        sl[i].offset = s->plan.slices[i].offset;
        sl[i].count = s->plan.slices[i].count;
        sl[i].member_id = s->plan.slices[i].member_id;
        sp[i] = &sl[i];
    }
    Zps__Plan plan = ZPS__PLAN__INIT;
    plan.generation = gen;
    plan.effective_step = effective;
    plan.n_slices = 2;
    plan.slices = sp;
    Zps__Header h = s_header(type, ZPS_FUZZ_SHARD, effective);
    h.generation = gen;
    h.plan = &plan;
    s_msg(s, ZPS_FUZZ_SHARD, &h, NULL, 0, 0);
}

// What only coordinators and shards send, from the stranger.
static void s_nobody_types(seed *s)
{
    static const Zps__MsgType types[] = {ZPS__MSG_TYPE__JOB,     ZPS__MSG_TYPE__PARAMS,
                                         ZPS__MSG_TYPE__ASSIGN,  ZPS__MSG_TYPE__PLAN,
                                         ZPS__MSG_TYPE__ROLLBACK, ZPS__MSG_TYPE__STATUS_REPLY,
                                         ZPS__MSG_TYPE__ERROR,   ZPS__MSG_TYPE__MSG_NONE};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        s_simple(s, ZPS_FUZZ_STRANGER, types[i], 0);
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

// ---------------------------------------------------------------------------
// Seeds: what trains.

static void s_seeds(const char *dir)
{
    static seed s;
    uint8_t train8 = s_config(0, ZPS_FUZZ_TRAINING, 8);

    // Six steps on shard 0 (an epoch: 48 records of 8), shard 1 keeping
    // up, heartbeats and pulls, the epoch's evaluation, goodbyes.
    s_begin(&s, train8);
    for (uint64_t step = 0; step < 6; step++) {
        s_step(&s, step, 1, 1);
        s_simple(&s, ZPS_FUZZ_SHARD, ZPS__MSG_TYPE__STEP_DONE, step + 1);
        s_simple(&s, step % 2 ? ZPS_FUZZ_WORKER1 : ZPS_FUZZ_WORKER0, ZPS__MSG_TYPE__HEARTBEAT, 0);
    }
    s_pull(&s, ZPS_FUZZ_WORKER0, 6);
    s_eval(&s, ZPS_FUZZ_WORKER0, 0, 0, 4, 3);
    s_eval(&s, ZPS_FUZZ_WORKER1, 0, 4, 4, 2);
    s_simple(&s, ZPS_FUZZ_STRANGER, ZPS__MSG_TYPE__STATUS, 0);
    s_simple(&s, ZPS_FUZZ_WORKER1, ZPS__MSG_TYPE__BYE, 6);
    s_write(&s, dir, "coord-train-f32");

    // bf16, an odd batch, payloads in two frames.
    s_begin(&s, s_config(1, ZPS_FUZZ_TRAINING, 5));
    s_step(&s, 0, 1, 2);
    s_step(&s, 1, 1, 2);
    s_pull(&s, ZPS_FUZZ_WORKER1, 2);
    s_write(&s, dir, "coord-train-bf16-frames");

    // --wire-code zstd: pushes coded, then asked for the parameters.
    s_begin(&s, s_config(3, ZPS_FUZZ_TRAINING, 8));
    s_step(&s, 0, 1, 1);
    s_step(&s, 1, 1, 1);
    s_pull(&s, ZPS_FUZZ_WORKER0, 2);
    s_write(&s, dir, "coord-train-coded");

    // Lies, then the job going on: the stranger's, and shard 1's own
    // requests that cannot be carried out (rollbacks with no checkpoint).
    s_begin(&s, train8);
    s_step(&s, 0, 1, 1);
    s_eval(&s, ZPS_FUZZ_STRANGER, 0, 0, 8, 8);
    s_simple(&s, ZPS_FUZZ_STRANGER, ZPS__MSG_TYPE__BYE, 1);
    s_simple(&s, ZPS_FUZZ_STRANGER, ZPS__MSG_TYPE__HEARTBEAT, 0);
    s_register(&s, ZPS_FUZZ_STRANGER, 1, "tcp://127.0.0.1:9", false, 0);
    s_register(&s, ZPS_FUZZ_STRANGER, 1, "tcp://127.0.0.1:9", true, ZPS_FUZZ_TOKEN);
    s_ready(&s, ZPS_FUZZ_STRANGER, 1000, 0);
    s_simple(&s, ZPS_FUZZ_STRANGER, ZPS__MSG_TYPE__STEP_DONE, 1000);
    s_push(&s, ZPS_FUZZ_STRANGER, 0, 1, 1, 0, 1, true);
    s_pull(&s, ZPS_FUZZ_STRANGER, 1);
    s_nobody_types(&s);
    s_register(&s, ZPS_FUZZ_SHARD, 1, "inproc://zps-fuzz-shard1", false, ZPS_FUZZ_TOKEN);
    s_ready(&s, ZPS_FUZZ_SHARD, 1000, ZPS_FUZZ_TOKEN);
    s_ready(&s, ZPS_FUZZ_SHARD, 0, ZPS_FUZZ_TOKEN);
    s_step(&s, 1, 1, 1);
    s_write(&s, dir, "coord-lies-f32");

    // Before the job: anyone may say HELLO and register; then it starts.
    s_begin(&s, s_config(2, ZPS_FUZZ_WAITING, 6));
    s_simple(&s, ZPS_FUZZ_STRANGER, ZPS__MSG_TYPE__STATUS, 0);
    {
        Zps__Hello hello = ZPS__HELLO__INIT;
        hello.host = "fuzz";
        Zps__Header h = s_header(ZPS__MSG_TYPE__HELLO, ZPS_FUZZ_WORKER0, 0);
        h.hello = &hello;
        s_msg(&s, ZPS_FUZZ_WORKER0, &h, NULL, 0, 0);
        s_register(&s, ZPS_FUZZ_SHARD, 1, "inproc://zps-fuzz-shard1", false, 0);
        s_msg(&s, ZPS_FUZZ_WORKER1, &h, NULL, 0, 0);
        s_ready(&s, ZPS_FUZZ_SHARD, 0, ZPS_FUZZ_TOKEN);
    }
    s_step(&s, 0, 1, 1);
    s_write(&s, dir, "coord-waiting-f16");

    // Shard 1 under test: steps, a new plan, a newcomer's push held until
    // its plan comes, the stranger's pushes, and at last a rollback to a
    // checkpoint it does not have (the coordinator's word: the shard ends).
    s_begin(&s, s_config(0, ZPS_FUZZ_SHARD1, 8));
    s_step(&s, 0, 1, 1);
    s_push(&s, ZPS_FUZZ_STRANGER, 0, 1, 1, 0, 1, true);
    s_pull(&s, ZPS_FUZZ_WORKER1, 1);
    s_plan(&s, ZPS__MSG_TYPE__PLAN, 2, 1);
    s_step(&s, 1, 2, 1);
    s_push(&s, ZPS_FUZZ_WORKER0, 0, 2, 3, 0, 1, false); // held: plan 3 is not known yet
    s_push(&s, ZPS_FUZZ_STRANGER, 0, 2, 3, 0, 1, true); // held too, refused when checked again
    s_plan(&s, ZPS__MSG_TYPE__PLAN, 3, 2);
    s_push(&s, ZPS_FUZZ_WORKER1, 1, 2, 3, 0, 1, false);
    s_nobody_types(&s);
    s_plan(&s, ZPS__MSG_TYPE__ROLLBACK, 4, 0);
    s_write(&s, dir, "shard1-train-f32");
}

// ---------------------------------------------------------------------------
// Regressions: the lies that once changed or stopped a job (issue 14).

static void s_regressions(const char *dir)
{
    static seed s;
    uint8_t train8 = s_config(0, ZPS_FUZZ_TRAINING, 8);

    // A perfect score for epoch 0 from a peer that read STATUS.
    s_begin(&s, train8);
    s_eval(&s, ZPS_FUZZ_STRANGER, 0, 0, 8, 8);
    s_write(&s, dir, "forged-eval-accuracy-1");

    // Shard 1 "restarted" at the stranger's endpoint: once it got shard 1's range.
    s_begin(&s, train8);
    s_register(&s, ZPS_FUZZ_STRANGER, 1, "tcp://127.0.0.1:9", false, 0);
    s_write(&s, dir, "forged-register-shard1");

    // The same, then READY at step 0: once a rollback to a checkpoint that
    // does not exist, and the coordinator stopped.
    s_begin(&s, train8);
    s_step(&s, 0, 1, 1);
    s_register(&s, ZPS_FUZZ_STRANGER, 1, "tcp://127.0.0.1:9", false, 0);
    s_ready(&s, ZPS_FUZZ_STRANGER, 0, 0);
    s_write(&s, dir, "forged-register-ready-step0-stops-job");

    // Shard 1 itself (its token) back at a step the job never reached, or
    // at one shard 0 has no checkpoint of: refused, the job goes on.
    s_begin(&s, train8);
    s_step(&s, 0, 1, 1);
    s_register(&s, ZPS_FUZZ_SHARD, 1, "inproc://zps-fuzz-shard1", false, ZPS_FUZZ_TOKEN);
    s_ready(&s, ZPS_FUZZ_SHARD, 1000, ZPS_FUZZ_TOKEN);
    s_ready(&s, ZPS_FUZZ_SHARD, 0, ZPS_FUZZ_TOKEN);
    s_step(&s, 1, 1, 1);
    s_write(&s, dir, "ready-future-step-and-no-checkpoint");

    // A STEP_DONE of shard 1 far ahead of shard 0.
    s_begin(&s, train8);
    s_simple(&s, ZPS_FUZZ_STRANGER, ZPS__MSG_TYPE__STEP_DONE, 1000);
    s_simple(&s, ZPS_FUZZ_SHARD, ZPS__MSG_TYPE__STEP_DONE, 1000);
    s_write(&s, dir, "step-done-future");

    // Leaving or beating in a member's name.
    s_begin(&s, train8);
    s_simple(&s, ZPS_FUZZ_STRANGER, ZPS__MSG_TYPE__BYE, 1);
    {
        Zps__Header h = s_header(ZPS__MSG_TYPE__HEARTBEAT, ZPS_FUZZ_STRANGER, 0);
        h.flags = 1;
        h.member_id = 1;
        s_msg(&s, ZPS_FUZZ_STRANGER, &h, NULL, 0, 0);
    }
    s_write(&s, dir, "forged-bye-heartbeat");

    // A rank past the last, once folded onto rank 0 (% ZPS_MAX_MEMBERS).
    s_begin(&s, train8);
    {
        float vals[16] = {0};
        Zps__Header h = s_header(ZPS__MSG_TYPE__PUSH, ZPS_FUZZ_WORKER0, 0);
        h.rank = ZPS_MAX_MEMBERS;
        h.offset = s.buckets[0].lo;
        h.count = s.buckets[0].hi - s.buckets[0].lo;
        h.dtype = ZPS__DTYPE__F32;
        h.samples = 4;
        s_msg(&s, ZPS_FUZZ_WORKER0, &h, vals, h.count * 4, 1);
        s_msg(&s, ZPS_FUZZ_STRANGER, &h, vals, h.count * 4, 1);
    }
    s_step(&s, 0, 1, 1);
    s_write(&s, dir, "push-rank-past-the-last");

    // NaN pushes and pulls under guessed ids, and what only coordinators send.
    s_begin(&s, train8);
    s_push(&s, ZPS_FUZZ_STRANGER, 0, 0, 1, 0, 1, true);
    s_push(&s, ZPS_FUZZ_STRANGER, 1, 0, 2, 0, 1, true); // held, then nobody's plan comes
    s_pull(&s, ZPS_FUZZ_STRANGER, 0);
    s_nobody_types(&s);
    s_step(&s, 0, 1, 1);
    s_write(&s, dir, "stranger-nan-pushes-and-coordinator-types");
}

int main(int argc, char **argv)
{
    if (argc == 2) {
        s_seeds(argv[1]);
    } else if (argc == 3 && strcmp(argv[1], "--regressions") == 0) {
        s_regressions(argv[2]);
    } else {
        fprintf(stderr, "usage: zps_fuzz_seeds DIR | zps_fuzz_seeds --regressions DIR\n");
        return EXIT_FAILURE;
    }
    return EXIT_SUCCESS;
}
