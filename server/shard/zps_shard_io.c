/* zps_shard_io.c - the shard's side of the wire (zps_shard_io.h): pushes
 * counted, held or refused; parameters sent to who pushed, and to the
 * PULLs waiting for them; rank 0's initial values of a declared model. */
#include "zps_shard_io.h"

#include <stdlib.h>
#include <string.h>

#include "common/zps_clock.h"
#include "common/zps_log.h"
#include "common/zps_plans.h"
#include "common/zps_wirecode.h"

static void s_refuse(zps_shard_io *io, zps_wire_msg *m, zps_err err, const char *why)
{
    io->hooks.refuse(io->hooks.arg, m, err, why);
}

zps_err zps_shard_io_init(zps_shard_io *io, void *sock, uint32_t index,
                          const zps_shard_io_hooks *hooks)
{
    memset(io, 0, sizeof *io);
    io->sock = sock;
    io->index = index;
    io->hooks = *hooks;
    io->coded_b = -1;
    io->held = calloc(ZPS_SHARD_IO_HELD, sizeof *io->held);
    return io->held ? ZPS_OK : ZPS_ENOMEM;
}

zps_shard_io_rank *zps_shard_io_rank_of(zps_shard_io *io, uint32_t r)
{
    io->n_ranks = r >= io->n_ranks ? r + 1 : io->n_ranks;
    return &io->ranks[r];
}

void zps_shard_io_fini(zps_shard_io *io)
{
    for (uint32_t i = 0; i < io->n_ranks; i++) {
        if (io->ranks[i].has_route) {
            zps_wire_route_close(&io->ranks[i].route);
            io->ranks[i].has_route = false;
        }
    }
    for (int i = 0; io->held && i < io->n_held; i++) {
        zps_wire_msg_fini(&io->held[i]);
    }
    free(io->held);
    io->held = NULL;
    io->n_held = 0;
    zps_shard_shm_fini(&io->shm);
    if (io->coded_sent) {
        zps_log_info("wire code: %llu answers coded, %.1f MiB for %.1f MiB of parameters (%.3f)",
                     (unsigned long long)io->coded_sent, io->coded_bytes / 1048576.0,
                     io->coded_of / 1048576.0, (double)io->coded_bytes / (double)io->coded_of);
    }
    zps_wire_msg_fini(&io->coded);
    io->coded_b = -1;
    zps_zcode_destroy(&io->code);
    for (int i = 0; i < ZPS_SHARD_IO_PULLERS; i++) {
        if (io->pullers[i].used) {
            zps_wire_route_close(&io->pullers[i].route);
            io->pullers[i].used = false;
        }
    }
}

void zps_shard_io_start(zps_shard_io *io, zps_shard *shard, zps_dtype dtype)
{
    io->shard = shard;
    io->dtype = dtype;
}

zps_err zps_shard_io_code(zps_shard_io *io)
{
    return io->code ? ZPS_OK : zps_zcode_new(&io->code);
}

bool zps_shard_io_started(const zps_shard_io *io)
{
    return io->shard != NULL;
}

// ---------------------------------------------------------------------------
// Parameters out.

// A PARAMS header for `step`, its tensor not named yet.
static void s_params_base(zps_shard_io *io, uint64_t step, Zps__Header *h)
{
    zps_wire_header_init(h, ZPS__MSG_TYPE__PARAMS);
    h->job_id = io->hooks.job_id(io->hooks.arg);
    h->step = step;
    h->shard = io->index;
    h->dtype = (Zps__DType)io->dtype;
}

// The PARAMS header of bucket b for `step`; *data and *ref say where the
// bucket's current wire values are.
static void s_params_header(zps_shard_io *io, int b, uint64_t step, Zps__Header *h,
                            const void **data, zps_wire_ref **ref)
{
    s_params_base(io, step, h);
    zps_shard_bucket_params(io->shard, b, data, &h->offset, &h->count, ref);
}

// Sends bucket b's parameters, labelled with the step they are for: as a
// name in the segment of parameters if shm and the segment holds them,
// else as frames.
static void s_send_bucket(zps_shard_io *io, zmq_msg_t *route, int b, uint64_t step,
                          bool zero_copy, bool shm)
{
    Zps__Header h;
    const void *data;
    zps_wire_ref *ref;
    s_params_header(io, b, step, &h, &data, &ref);
    size_t bytes = h.count * zps_dtype_size(io->dtype);
    if (shm && zps_shard_shm_params_name(&io->shm, b, step, &h)) {
        data = NULL;
        bytes = 0;
    }
    zps_err err = zps_wire_send(io->sock, route, &h, data, bytes, zero_copy ? ref : NULL);
    if (err != ZPS_OK) {
        zps_log_warn("could not send step %llu parameters: %s", (unsigned long long)step,
                     zps_strerror(err));
    }
}

// ---------------------------------------------------------------------------
// Coded answers (--wire-code zstd, common/zps_zcode.h).

// Bucket b's values of `step` (step - 1's already sent, as the update
// leaves them in the other array) coded as their XOR with step - 1's, in
// io->coded: kept for every rank of the step that holds step - 1's. False
// if they cannot be (the coder logs why; a bucket past the wire's frames
// is refused uncoded too, and said there).
static bool s_code_bucket(zps_shard_io *io, int b, uint64_t step)
{
    if (io->coded_b == b && io->coded_step == step) {
        return true;
    }
    zps_wire_msg_fini(&io->coded);
    io->coded_b = -1;
    Zps__Header h;
    const void *data;
    zps_wire_ref *ref;
    const float *prev;
    s_params_header(io, b, step, &h, &data, &ref);
    if (zps_shard_bucket_at(io->shard, b, step - 1, &prev) != ZPS_OK ||
        h.count * sizeof(float) > (uint64_t)ZPS_WIRE_MAX_FRAMES * ZPS_WIRE_FRAME_BYTES) {
        return false;
    }
    // Frames that read the values in place: the coder copies what it sends.
    const uint8_t *at = data;
    for (size_t left = h.count * sizeof(float), len; left > 0; left -= len, at += len) {
        len = left < ZPS_WIRE_FRAME_BYTES ? left : ZPS_WIRE_FRAME_BYTES;
        zmq_msg_t *f = &io->coded.frames[io->coded.n_frames++];
        ZPS_ASSERT(zmq_msg_init_data(f, (void *)at, len, NULL, NULL) == 0);
    }
    if (zps_wirecode_encode(io->code, &io->coded, prev) != ZPS_OK) {
        zps_wire_msg_fini(&io->coded);
        return false;
    }
    io->coded_b = b;
    io->coded_step = step;
    return true;
}

// Sends rank r bucket b of `step` XORed with step - 1's, which it holds
// (its push said so); false when that cannot be done, for the caller to
// send the bucket uncoded.
static bool s_send_coded(zps_shard_io *io, const zps_shard_io_rank *r, int b, uint64_t step)
{
    if (!io->code || io->dtype != ZPS_DTYPE_F32 || r->code_base != step ||
        !zps_shard_bucket_params_are(io->shard, b, step) || !s_code_bucket(io, b, step)) {
        return false;
    }
    Zps__Header h;
    const void *data;
    zps_wire_ref *ref;
    s_params_header(io, b, step, &h, &data, &ref);
    h.wire_code = ZPS_ZCODE_XOR;
    h.code_base = step; // XORed with step - 1's
    zmq_msg_t frames[ZPS_WIRE_MAX_FRAMES];
    for (int f = 0; f < io->coded.n_frames; f++) {
        ZPS_ASSERT(zmq_msg_init(&frames[f]) == 0);
        ZPS_ASSERT(zmq_msg_copy(&frames[f], &io->coded.frames[f]) == 0);
    }
    zps_err err = zps_wire_send_frames(io->sock, (zmq_msg_t *)&r->route, &h, frames,
                                       io->coded.n_frames);
    for (int f = 0; f < io->coded.n_frames; f++) {
        ZPS_ASSERT(zmq_msg_close(&frames[f]) == 0);
    }
    if (err != ZPS_OK) {
        zps_log_warn("could not send step %llu parameters: %s", (unsigned long long)step,
                     zps_strerror(err));
    } else {
        io->coded_sent++;
        io->coded_bytes += io->coded.payload_bytes;
        io->coded_of += h.count * sizeof(float);
    }
    return true;
}

// Sends rank r, which pushed this step, bucket b of `step`: coded if it
// can take them so, else as s_send_bucket does.
static void s_send_pushed(zps_shard_io *io, zps_shard_io_rank *r, int b, uint64_t step, bool shm)
{
    if (shm || !s_send_coded(io, r, b, step)) {
        s_send_bucket(io, &r->route, b, step, true, shm);
    }
}

// Replaces a coded push's frames by its values, and keeps what it says
// of the pusher's copy of the parameters; false (refused) if it cannot.
// A coded push says what it is: one reaches a shard whose job does not
// code only from a worker of the job before a restart without the flag,
// and is decoded all the same.
static bool s_decode_push(zps_shard_io *io, zps_wire_msg *m)
{
    // rank: s_check_member_msg. A held push comes back decoded, its
    // code_base kept.
    io->ranks[m->hdr->rank].code_base = io->code ? m->hdr->code_base : 0;
    if (m->hdr->wire_code == ZPS_ZCODE_NONE) {
        return true;
    }
    char why[200];
    uint64_t code_base = m->hdr->code_base;
    zps_err err = ZPS_EPROTO;
    if (m->hdr->wire_code != ZPS_ZCODE_PLANES) {
        snprintf(why, sizeof why, "a push coded with a base (wire code %u)", m->hdr->wire_code);
    } else if ((err = zps_shard_io_code(io)) != ZPS_OK) {
        snprintf(why, sizeof why, "no memory to decode a coded push");
    } else {
        err = zps_wirecode_decode(io->code, m, NULL,
                                  zps_shard_hi(io->shard) - zps_shard_lo(io->shard), why,
                                  sizeof why);
    }
    if (err != ZPS_OK) {
        s_refuse(io, m, err, why);
        return false;
    }
    io->ranks[m->hdr->rank].code_base = code_base;
    return true;
}

// Whether rank r takes the step's parameters in one notice (shm_whole):
// its first push of the step asked, and every bucket of the range is
// exchanged this step (a diloco fragment's idle ones are never written
// to the segment).
static bool s_whole(const zps_shard_io *io, uint32_t r)
{
    return io->ranks[r].shm_whole &&
           zps_shard_n_step_buckets(io->shard) == zps_shard_n_buckets(io->shard);
}

// Sends rank r the step's parameters, every bucket applied: one PARAMS
// naming the whole range in the segment; bucket by bucket if the segment
// does not hold them all.
static void s_send_whole(zps_shard_io *io, uint32_t r, uint64_t step)
{
    Zps__Header h;
    s_params_base(io, step, &h);
    int n = zps_shard_n_buckets(io->shard);
    if (!zps_shard_shm_params_name_all(&io->shm, n, step, zps_shard_lo(io->shard),
                                       zps_shard_hi(io->shard), &h)) {
        for (int b = 0; b < n; b++) {
            s_send_bucket(io, &io->ranks[r].route, b, step, true, true);
        }
        return;
    }
    zps_err err = zps_wire_send(io->sock, &io->ranks[r].route, &h, NULL, 0, NULL);
    if (err != ZPS_OK) {
        zps_log_warn("could not send step %llu parameters: %s", (unsigned long long)step,
                     zps_strerror(err));
    }
}

// Sends bucket b's fp32 values (as of a step) converted to the wire dtype:
// a copy, for values older than those the shard sends now.
static void s_send_values(zps_shard_io *io, zmq_msg_t *route, int b, uint64_t step,
                          const float *values)
{
    Zps__Header h;
    const void *data;
    zps_wire_ref *ref;
    s_params_header(io, b, step, &h, &data, &ref);
    size_t bytes = h.count * zps_dtype_size(io->dtype);
    void *buf = malloc(bytes ? bytes : 1);
    if (!buf) {
        zps_log_error("out of memory answering a PULL");
        return;
    }
    zps_dtype_from_f32(io->dtype, values, buf, h.count);
    (void)zps_wire_send(io->sock, route, &h, buf, bytes, NULL);
    free(buf);
}

// What the message table checked of a PULL or PUSH (job, state, rank and
// member id), checked once more where it is used: the handlers index by
// rank, and an index from the wire is refused when out of range, never
// folded into range.
static bool s_check_member_msg(zps_shard_io *io, zps_wire_msg *m)
{
    if (!io->shard) {
        s_refuse(io, m, ZPS_ESTATE, "the job has not started on this shard");
        return false;
    }
    if (m->hdr->rank >= ZPS_MAX_MEMBERS) {
        s_refuse(io, m, ZPS_ERANGE, "rank out of range");
        return false;
    }
    (void)zps_shard_io_rank_of(io, m->hdr->rank);
    return true;
}

// ---------------------------------------------------------------------------
// PULLs.

// Answers what a waiting PULL can have of `step` now; true when complete.
static bool s_serve_pull(zps_shard_io *io, zmq_msg_t *route, uint64_t step, zps_bucket_set *sent)
{
    int n = zps_shard_n_buckets(io->shard);
    for (int b = 0; b < n; b++) {
        const float *values;
        if (!zps_bucket_set_has(sent, b) &&
            zps_shard_bucket_at(io->shard, b, step, &values) == ZPS_OK) {
            if (zps_shard_bucket_params_are(io->shard, b, step)) {
                s_send_bucket(io, route, b, step, true, false);
            } else {
                s_send_values(io, route, b, step, values);
            }
            zps_bucket_set_add(sent, b);
        }
    }
    return zps_bucket_set_full(sent, n);
}

// Answers a PULL of `step` with what there is now and keeps it waiting for
// the rest.
static void s_queue_pull(zps_shard_io *io, zmq_msg_t *route, uint64_t step, bool catch_up)
{
    const float *values;
    if (catch_up && zps_shard_bucket_at(io->shard, 0, step, &values) == ZPS_ESTALE) {
        // That step is gone here: the asker is behind, and catches up at
        // the step in progress when it sees a later step's parameters.
        step = zps_shard_step(io->shard);
    }
    zps_bucket_set sent = {0};
    if (s_serve_pull(io, route, step, &sent)) {
        return;
    }
    for (int i = 0; i < ZPS_SHARD_IO_PULLERS; i++) {
        zps_shard_io_puller *p = &io->pullers[i];
        if (!p->used) {
            *p = (zps_shard_io_puller){.step = step, .sent = sent, .used = true};
            zps_wire_route_copy(&p->route, route);
            return;
        }
    }
    zps_log_warn("too many PULLs waiting; one for step %llu dropped", (unsigned long long)step);
}

// After a bucket update: waiting PULLs may now have more to take.
static void s_serve_pullers(zps_shard_io *io)
{
    for (int i = 0; i < ZPS_SHARD_IO_PULLERS; i++) {
        zps_shard_io_puller *p = &io->pullers[i];
        if (p->used && s_serve_pull(io, &p->route, p->step, &p->sent)) {
            zps_wire_route_close(&p->route);
            p->used = false;
        }
    }
}

void zps_shard_io_on_pull(zps_shard_io *io, zps_wire_msg *m)
{
    if (!s_check_member_msg(io, m)) {
        return;
    }
    io->ranks[m->hdr->rank].heard = true; // a member's, as the table checked
    // A step this shard has passed may come back: a rollback to it can be
    // on its way here while the worker asking already heard of it.
    s_queue_pull(io, &m->route, m->hdr->step, false);
}

// ---------------------------------------------------------------------------
// PUSHes.

static void s_hold(zps_shard_io *io, zps_wire_msg *m, const char *why)
{
    if (zps_shard_shm_own(m) != ZPS_OK) { // the segment moves on; a copy waits
        s_refuse(io, m, ZPS_ENOMEM, "out of memory holding a push");
        return;
    }
    if (io->n_held == ZPS_SHARD_IO_HELD) {
        s_refuse(io, m, ZPS_EAGAIN, "too many pushes on hold; send again");
        return;
    }
    zps_log_debug("holding a push: %s", why);
    zps_wire_msg_move(&io->held[io->n_held++], m);
}

// A host leader's sum dropped as partly counted (one of its pieces came
// its own way first: a follower that gave up on its leader, whose sum came
// after all) took the other pieces' samples with it, and the step would
// wait for them until --speculate-after or an eviction. The leader is told
// "not yet" for each run not counted, its slice naming the run: libzps
// computes a refused push's slice again and pushes it itself, each run
// once (a copy that comes second is dropped like any other). A sum of at
// most ZPS_HOST_GROUP_MAX pieces leaves as many runs unless copies of
// pieces of pieces (speculation's) cut it finer. A worker keeps at most
// ZPS_PLANS_HANDED_MAX slices to compute besides its own (common/
// zps_plans.h) and drops the rest, so the shard asks for that many and
// says how many more wait for --speculate-after or an eviction.
static void s_ask_for_uncounted(zps_shard_io *io, zps_wire_msg *m)
{
    zps_shard_run runs[ZPS_PLANS_HANDED_MAX];
    int all = zps_shard_uncounted(io->shard, m->hdr, runs, ZPS_PLANS_HANDED_MAX);
    int n = all < ZPS_PLANS_HANDED_MAX ? all : ZPS_PLANS_HANDED_MAX;
    if (n == 0) {
        return;
    }
    if (all > n) {
        zps_log_warn("shard %u: a partly counted host sum left %d runs not counted; asking for "
                     "%d, the other %d wait for --speculate-after or an eviction", io->index,
                     all, n, all - n);
    }
    Zps__Header *h = m->hdr;
    zps_log_warn("shard %u: step %llu: rank %u's host sum of [%u, +%u) in %zu pieces was partly "
                 "counted already for [%llu, +%llu): dropped; asking it for the %d run%s not "
                 "counted, the first [%u, +%u)", io->index, (unsigned long long)h->step, h->rank,
                 h->batch_offset, h->samples, h->n_host_pieces, (unsigned long long)h->offset,
                 (unsigned long long)h->count, n, n == 1 ? "" : "s", runs[0].offset,
                 runs[0].count);
    // The refusal names the run, not the sum, and no segment: a push
    // through shared memory refused "not yet" would turn its sender to
    // frames. The header is put back as it came.
    uint32_t offset = h->batch_offset, samples = h->samples;
    uint64_t shm_size = h->shm_size;
    h->shm_size = 0;
    for (int i = 0; i < n; i++) {
        h->batch_offset = runs[i].offset;
        h->samples = runs[i].count;
        s_refuse(io, m, ZPS_EAGAIN, "partly counted host sum: this run of it again, pushed "
                                    "alone");
    }
    h->batch_offset = offset;
    h->samples = samples;
    h->shm_size = shm_size;
}

// The sender of a push gets the step's new parameters: the buckets already
// updated now, the others as they are. Its push may have been a second copy
// (a slice handed to it and delivered by its first owner after all), yet it
// waits for the next step like everyone else.
static void s_add_recipient(zps_shard_io *io, zps_wire_msg *m)
{
    zps_shard_io_rank *r = &io->ranks[m->hdr->rank]; // in range: s_check_member_msg
    if (m->hdr->step > zps_shard_step(io->shard)) {
        return; // ahead of a restarted shard: the rollback tells it where to go
    }
    if (m->hdr->step < zps_shard_step(io->shard)) {
        // The step is complete here: answer as a PULL of the step after it, once.
        if (r->served != m->hdr->step + 1) {
            r->served = m->hdr->step + 1;
            s_queue_pull(io, &m->route, m->hdr->step + 1, true);
        }
        return;
    }
    if (r->has_route) {
        zps_wire_route_close(&r->route);
    }
    zps_wire_route_copy(&r->route, &m->route);
    r->has_route = true;
    if (r->pushed) {
        return;
    }
    r->pushed = true;
    uint64_t next = zps_shard_step(io->shard) + 1;
    if (s_whole(io, m->hdr->rank)) {
        if (zps_shard_step_done(io->shard)) {
            s_send_whole(io, m->hdr->rank, next);
        }
        return;
    }
    for (int b = 0; b < zps_shard_n_buckets(io->shard); b++) {
        if (zps_shard_applied(io->shard, b) && !zps_shard_bucket_idle(io->shard, b)) {
            s_send_pushed(io, r, b, next, r->shm_params);
        }
    }
}

// Whether `in` of n members are at least as many as the rest: enough to
// hand the rest's slices to, one helper or more each.
static bool s_half_or_more(uint32_t in, uint32_t n)
{
    return in >= n - in;
}

// Whether rank r's own slice is in: every bucket of it counted from r
// itself. A bucket that a helper's piece brought first does not count, so
// a late owner whose slice the others covered stays "not in"; what it is
// for (the quorum, and who may help) needs no more.
bool zps_shard_io_own_in(const zps_shard_io *io, uint32_t r)
{
    return io->ranks[r].own_in == (uint32_t)zps_shard_n_step_buckets(io->shard);
}

// Counts a counted push of [offset, +samples) from rank r toward its own
// slice, and notes when at least as many slices are in as are not (not
// all: the step is then over).
static void s_note_own_push(zps_shard_io *io, uint32_t r, uint32_t offset, uint32_t samples)
{
    const zps_plan *plan = zps_shard_plan(io->shard);
    const zps_plan_slice *own = plan ? zps_plan_find(plan, r) : NULL;
    if (!own || offset != own->offset || samples != own->count ||
        zps_shard_io_own_in(io, r)) {
        return; // a piece of someone else's slice
    }
    io->ranks[r].own_in++;
    if (!zps_shard_io_own_in(io, r)) {
        return;
    }
    io->n_in++;
    if (io->quorum_ms == 0 && io->n_in < plan->n && s_half_or_more(io->n_in, plan->n)) {
        io->quorum_ms = zps_clock_ms();
    }
}

// A counted push toward the own slices it carries: the pusher's, or, from
// a host's leader, each piece's member's, heard as if it had pushed it
// (the shard checked the pieces' ranks against the plan, so each is below
// ZPS_MAX_MEMBERS). The parameters still go to the pusher only.
static void s_note_counted(zps_shard_io *io, const Zps__Header *h)
{
    if (h->n_host_pieces == 0) {
        s_note_own_push(io, h->rank, h->batch_offset, h->samples); // rank: s_check_member_msg
    }
    for (size_t i = 0; i < h->n_host_pieces; i++) {
        const Zps__HostPiece *p = h->host_pieces[i];
        zps_shard_io_rank_of(io, p->rank)->heard = true;
        s_note_own_push(io, p->rank, p->batch_offset, p->samples);
    }
}

// A shard has its first plan before any worker has its JOB, so a push
// before it is one sent before a restart (of shard 0, or of this shard
// with --resume) that reached the new process. Its step is rolled back:
// dropped, as one lost with the old process or ahead of a restarted shard
// (s_add_recipient); the rollback tells its sender where to go. Refused,
// it would end the worker (ESTATE is final to it).
static bool s_before_plan(const zps_shard_io *io, const zps_wire_msg *m)
{
    if (io->shard) {
        return false;
    }
    zps_log_debug("rank %u's push of step %llu came before this restarted shard had a plan: "
                  "dropped, the rollback tells it where to go", m->hdr->rank,
                  (unsigned long long)m->hdr->step);
    return true;
}

zps_err zps_shard_io_on_push(zps_shard_io *io, zps_wire_msg *m, int *ready)
{
    *ready = -1;
    if (s_before_plan(io, m)) {
        return ZPS_ESTATE;
    }
    if (!s_check_member_msg(io, m)) {
        return ZPS_ESTATE;
    }
    if (!s_decode_push(io, m)) {
        return ZPS_EPROTO;
    }
    char why[256];
    if (zps_shard_shm_replaces(&io->shm, m->hdr->rank, m->hdr)) {
        zps_shard_settle(io->shard); // it may keep views of the mapping replaced
    }
    // Twice the range in fp32 bounds a worker's segment (one per step parity).
    uint64_t seg_max = 2 * (zps_shard_hi(io->shard) - zps_shard_lo(io->shard)) * sizeof(float);
    zps_err err = zps_shard_shm_view(&io->shm, m->hdr->rank, seg_max, io->dtype, m, why,
                                     sizeof why);
    if (err != ZPS_OK) {
        s_refuse(io, m, err, why); // nothing counted, nothing mapped anew
        return err;
    }
    // A push through shared memory: its pages are dropped once it is read
    // (by the shard, at once or with the bucket's next push), copied to be
    // held, or refused (docs/choices.md): when the view's last reference
    // goes.
    bool via_shm = m->hdr->shm_size > 0;
    err = zps_shard_push(io->shard, m, ready, why, sizeof why);
    if (err == ZPS_EAGAIN) {
        s_hold(io, m, why);
        return err;
    }
    if (err != ZPS_OK && err != ZPS_EDUP) {
        s_refuse(io, m, err, why);
        return err;
    }
    // Heard only now: a push held or refused says nothing of its rank.
    io->ranks[m->hdr->rank].heard = true;
    if (err == ZPS_EDUP) {
        zps_log_debug("dropped: %s", why); // the first copy counted; this one changes nothing
        s_ask_for_uncounted(io, m);
    }
    // Its parameters through the segment of parameters if it pushed
    // through shared memory (docs/choices.md, "One pull per host").
    io->ranks[m->hdr->rank].shm_params = zps_shard_shm_params_offer(
        &io->shm, via_shm, !m->hdr->params_shm, zps_shard_lo(io->shard),
        zps_shard_hi(io->shard), zps_dtype_size(io->dtype));
    zps_shard_io_rank *r = &io->ranks[m->hdr->rank];
    if (!r->pushed) {
        // The step's way, fixed at its first push: a later piece of it (a
        // slice handed on) may come as frames, and the buckets held back
        // for the one notice must still reach it.
        r->shm_whole = r->shm_params && m->hdr->params_whole;
    }
    s_add_recipient(io, m);
    if (err == ZPS_OK) {
        s_note_counted(io, m->hdr);
    }
    return err;
}

void zps_shard_io_apply(zps_shard_io *io, int b)
{
    zps_shard_apply(io->shard, b);
    if (io->coded_b == b) {
        io->coded_b = -1; // new values: coded again (a step done over may differ)
    }
    uint64_t next = zps_shard_step(io->shard) + 1;
    if (io->shm.params.base) { // written once for the host, before anyone is told of it
        Zps__Header h;
        const void *data;
        zps_wire_ref *ref;
        s_params_header(io, b, next, &h, &data, &ref);
        zps_shard_shm_params_put(&io->shm, b, next, h.offset, h.count, data);
    }
    bool done = zps_shard_step_done(io->shard);
    for (uint32_t i = 0; i < io->n_ranks; i++) {
        zps_shard_io_rank *r = &io->ranks[i];
        if (!r->pushed) {
            continue;
        }
        if (!s_whole(io, i)) {
            s_send_pushed(io, r, b, next, r->shm_params);
        } else if (done) { // one notice for the rest of the step (docs/choices.md)
            s_send_whole(io, i, next);
        } else if (!r->noticed) { // and the first bucket's own, as soon as it is in
            s_send_bucket(io, &r->route, b, next, true, true);
            r->noticed = true;
        }
    }
    s_serve_pullers(io);
}

// Rank 0's initial values of a declared model, a bucket at a time; with
// the last, the PULLs of step 0 waiting for them are answered.
void zps_shard_io_on_init(zps_shard_io *io, zps_wire_msg *m)
{
    if (!s_check_member_msg(io, m)) {
        return;
    }
    if (m->hdr->rank != 0) {
        s_refuse(io, m, ZPS_EPERM, "initial values come from rank 0");
        return;
    }
    char why[256];
    bool complete;
    zps_err err = zps_shard_take_init(io->shard, m, &complete, why, sizeof why);
    if (err == ZPS_EDUP) {
        zps_log_debug("INIT dropped: %s", why); // sent again after a refusal, or resumed
        return;
    }
    if (err != ZPS_OK) {
        s_refuse(io, m, err, why);
        return;
    }
    if (complete) {
        zps_log_info("shard %u: the initial values from rank 0 are in", io->index);
        s_serve_pullers(io);
    }
}

bool zps_shard_io_between_steps(const zps_shard_io *io)
{
    // (A bucket a diloco step does not exchange is applied with its first
    // update: it says nothing of the step.)
    for (int b = 0; io->shard && b < zps_shard_n_buckets(io->shard); b++) {
        if (zps_shard_applied(io->shard, b) && !zps_shard_bucket_idle(io->shard, b)) {
            return false;
        }
    }
    return true;
}

// ---------------------------------------------------------------------------
// Steps and plans.

void zps_shard_io_end_step(zps_shard_io *io)
{
    for (uint32_t i = 0; i < io->n_ranks; i++) {
        io->ranks[i].pushed = false;
        io->ranks[i].noticed = false;
        io->ranks[i].heard = false;
        io->ranks[i].own_in = 0;
    }
    io->n_in = 0;
    io->quorum_ms = 0;
    // The segments of workers gone go with them (the shard keeps no push
    // past its step's end: zps_shard_end_step dropped them).
    zps_shard_shm_sweep(&io->shm);
}

void zps_shard_io_forget_step(zps_shard_io *io)
{
    zps_shard_io_end_step(io);
    zps_shard_shm_params_forget(&io->shm); // restored values: written anew at each update
    for (uint32_t i = 0; i < io->n_ranks; i++) {
        io->ranks[i].served = 0;
    }
    // PULLs that arrived before the rollback (for its step) can be served now.
    for (int i = 0; i < ZPS_SHARD_IO_PULLERS; i++) {
        io->pullers[i].sent = (zps_bucket_set){0};
    }
    if (io->shard) {
        s_serve_pullers(io);
    }
    for (int i = 0; i < io->n_held; i++) {
        zps_wire_msg_fini(&io->held[i]);
    }
    io->n_held = 0;
}

void zps_shard_io_plan_added(zps_shard_io *io)
{
    // A plan without a worker: it may be gone. Mid-step, the shard may
    // keep a view of its segment.
    if (io->shard && zps_shard_shm_gone(&io->shm)) {
        zps_shard_settle(io->shard);
    }
    zps_shard_shm_sweep(&io->shm);
    io->replay_held = io->n_held > 0; // from the loop, not from inside a push's handling
}

void zps_shard_io_replay(zps_shard_io *io)
{
    if (!io->replay_held) {
        return;
    }
    io->replay_held = false;
    int n = io->n_held;
    zps_wire_msg *again = malloc((size_t)(n ? n : 1) * sizeof *again);
    if (!again) {
        return;
    }
    for (int i = 0; i < n; i++) {
        zps_wire_msg_move(&again[i], &io->held[i]);
        zps_wire_msg_fini(&io->held[i]);
    }
    io->n_held = 0;
    for (int i = 0; i < n; i++) {
        io->hooks.again(io->hooks.arg, &again[i]); // now its plan tells who its sender is
        zps_wire_msg_fini(&again[i]);
    }
    free(again);
}
