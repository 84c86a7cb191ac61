/* zps_host_sum.c - one push per host (lib/zps_host.h): a member's push of
 * its piece for a shard elsewhere, to its leader or for itself, and the
 * leader's sums of its group's parts, pushed once per bucket. */
#include "lib/zps_host_int.h"

#include <stdlib.h>
#include <string.h>

#include "common/zps_clock.h"
#include "common/zps_log.h"
#include "common/zps_tree.h"

// ---------------------------------------------------------------------------
// A follower's push.

// Whether the piece handed out is this worker's own of the plan (not one
// handed over, nor one computed again: a leader's own slice that a shard
// asked for again after dropping its sum must not join a new sum), and of
// the group's plan: only those go to the leader.
static bool s_own_piece(const zps_client *c)
{
    const zps_plan_gen *g = zps_plans_at(&c->schedule.plans, c->cur_step);
    const zps_plan_slice *sl = g ? zps_plan_find(&g->plan, c->conn.rank) : NULL;
    return sl && !c->cur_work.extra && g->gen == c->cur_work.gen && g->gen == c->host.gen &&
           sl->offset == c->cur_work.offset && sl->count == c->cur_work.count;
}

// Where element lo of part p of step goes in the follower's segment
// (created at the first part), or NULL: frames. A second part of one
// step (a deterministic job's nodes) would overwrite the first before the
// leader read it, and a leader that could not map the segment takes
// frames until the next group.
static uint8_t *s_seg_at(zps_client *c, uint64_t step, const zps_piece *p, uint64_t lo)
{
    zps_host *h = &c->host;
    size_t esize = zps_dtype_size(c->dtype), half = c->model.n_params * esize;
    if (!h->shm || h->seg_refused || c->micro.m ||
        (h->seg_step == step + 1 && (h->seg_offset != p->offset || h->seg_samples != p->count))) {
        return NULL;
    }
    if (h->seg.size != 2 * half) {
        char why[200];
        zps_shm_seg_fini(&h->seg);
        if (zps_shm_seg_create(&h->seg, 2 * half, why, sizeof why) != ZPS_OK) {
            zps_log_warn("host: no segment for my leader (%s): frames to it", why);
            h->shm = false;
            return NULL;
        }
        zps_log_info("host: parts to my leader through shared memory (%.1f MiB)",
                     (double)h->seg.size / (1 << 20));
    }
    h->seg_step = step + 1;
    h->seg_offset = p->offset;
    h->seg_samples = p->count;
    return (uint8_t *)h->seg.base + (step & 1) * half + lo * esize;
}

// Part p of the piece handed out, [lo, hi) of grad, to the leader for
// shard i: a PUSH as to the shard, naming the whole piece in host_pieces;
// the values in the segment, or in frames.
static zps_err s_send_to_leader(zps_client *c, int i, const zps_piece *p, uint64_t lo,
                                uint64_t hi, const float *grad, float loss, float compute_ms,
                                double take_by_ms, double wait_ms)
{
    int timeout = (int)wait_ms;
    if (zmq_setsockopt(c->host.sock, ZMQ_SNDTIMEO, &timeout, sizeof timeout) != 0) {
        return ZPS_EIO; // only for a socket that is not one
    }
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__PUSH);
    h.job_id = c->conn.job_id;
    h.rank = c->conn.rank;
    h.member_id = c->conn.member_id;
    h.step = c->cur_step;
    h.shard = (uint32_t)i;
    h.offset = lo;
    h.count = hi - lo;
    h.dtype = (Zps__DType)c->dtype;
    h.samples = p->count;
    h.batch_offset = p->offset;
    h.generation = p->gen;
    h.loss = loss;
    h.compute_ms = compute_ms;
    Zps__HostPiece piece = ZPS__HOST_PIECE__INIT, *pieces[1] = {&piece};
    piece.rank = c->conn.rank;
    piece.batch_offset = c->cur_work.offset;
    piece.samples = c->cur_work.count;
    piece.compute_ms = compute_ms;
    piece.loss = loss;
    piece.take_by_ms = take_by_ms;
    h.n_host_pieces = 1;
    h.host_pieces = pieces;
    size_t esize = zps_dtype_size(c->dtype);
    uint8_t *at = s_seg_at(c, c->cur_step, p, lo);
    if (at) {
        zps_dtype_from_f32(c->dtype, grad + lo, at, h.count); // a copy for fp32
        h.shm_size = c->host.seg.size;
        h.shm_offset = (uint64_t)(at - (uint8_t *)c->host.seg.base);
        h.shm_pid = (uint32_t)getpid();
        h.shm_fd = (uint32_t)c->host.seg.fd;
        h.shm_boot = c->conn.boot;
        return zps_wire_send(c->host.sock, NULL, &h, NULL, 0, NULL);
    }
    const void *payload = grad + lo;
    if (c->dtype != ZPS_DTYPE_F32) {
        payload = c->wire + lo * esize;
        zps_dtype_from_f32(c->dtype, grad + lo, c->wire + lo * esize, h.count);
    }
    return zps_wire_send(c->host.sock, NULL, &h, payload, h.count * esize, &c->grad_ref);
}

// ---------------------------------------------------------------------------
// The leader's sums.

// Shard i's bucket b as the leader sums it; NULL without memory (logged).
static zps_host_bucket *s_bucket(zps_client *c, int i, int b)
{
    zps_host *h = &c->host;
    if (!h->buckets[i]) {
        h->buckets[i] = calloc(ZPS_MODEL_MAX_BUCKETS, sizeof *h->buckets[i]);
        if (!h->buckets[i]) {
            zps_log_error("out of memory for the host's buckets");
            return NULL;
        }
    }
    return &h->buckets[i][b];
}

// Host pieces of parts[0..n): one per member's run of parts (a node's
// parts of one member adjoin), in batch order. Their number.
static size_t s_pieces(const zps_host *h, const zps_host_part *parts, int n,
                       Zps__HostPiece *pieces, Zps__HostPiece **ptrs)
{
    size_t k = 0;
    for (int j = 0; j < n; j++) {
        const zps_host_part *p = &parts[j];
        if (k > 0 && pieces[k - 1].rank == h->ranks[p->member]) {
            pieces[k - 1].samples += p->samples;
            continue;
        }
        Zps__HostPiece x = ZPS__HOST_PIECE__INIT;
        x.rank = h->ranks[p->member];
        x.batch_offset = p->offset;
        x.samples = p->samples;
        x.compute_ms = p->compute_ms;
        x.loss = p->loss;
        pieces[k] = x;
        ptrs[k] = &pieces[k];
        k++;
    }
    return k;
}

// The header of a push to shard i, bucket b, of parts [0, n), which
// adjoin in batch order: one push for them all, naming them (pieces and
// ptrs are the room for that).
static void s_run_header(zps_client *c, int i, int b, const zps_host_part *parts, int n,
                         Zps__Header *hd, Zps__HostPiece *pieces, Zps__HostPiece **ptrs)
{
    zps_host *h = &c->host;
    const zps_bucket *bk = &c->conn.shards[i].buckets[b];
    zps_wire_header_init(hd, ZPS__MSG_TYPE__PUSH);
    hd->step = h->step;
    hd->shard = (uint32_t)i;
    hd->offset = bk->lo;
    hd->count = bk->hi - bk->lo;
    hd->dtype = (Zps__DType)c->dtype;
    hd->batch_offset = parts[0].offset;
    hd->generation = h->gen;
    double loss = 0;
    for (int j = 0; j < n; j++) {
        hd->samples += parts[j].samples;
        loss += (double)parts[j].samples * parts[j].loss;
        hd->compute_ms = parts[j].compute_ms > hd->compute_ms ? parts[j].compute_ms
                                                               : hd->compute_ms;
    }
    hd->loss = (float)(loss / hd->samples);
    // The leader's own part alone is its own push, as without a group.
    if (n > 1 || parts[0].member != 0) {
        hd->n_host_pieces = s_pieces(h, parts, n, pieces, ptrs);
        hd->host_pieces = ptrs;
    }
}

// Where element e of a part's values is, and how many follow it in that
// frame (*left); NULL past the end.
static uint8_t *s_at(const zps_wire_msg *m, size_t esize, size_t e, size_t *left)
{
    for (int f = 0; f < m->n_frames; f++) {
        size_t len = zmq_msg_size((zmq_msg_t *)&m->frames[f]) / esize;
        if (e < len) {
            *left = len - e;
            return (uint8_t *)zmq_msg_data((zmq_msg_t *)&m->frames[f]) + e * esize;
        }
        e -= len;
    }
    *left = 0;
    return NULL;
}

#define S_CHUNK 1024 // elements summed at a time: the sums stay in cache

// Elements [e, e + len) of the mean of parts [0, n) into out (wire
// dtype), len at most S_CHUNK and inside one frame of every part.
static void s_mean_chunk(zps_dtype dtype, const zps_host_part *parts, int n, uint32_t total,
                         size_t e, size_t len, uint8_t *out)
{
    size_t esize = zps_dtype_size(dtype), left;
    double acc[S_CHUNK];
    float v[S_CHUNK];
    if (n < 1) {
        return;
    }
    for (int k = 0; k < n; k++) {
        zps_dtype_to_f32(dtype, s_at(&parts[k].m, esize, e, &left), v, len);
        double w = parts[k].samples;
        if (k == 0) {
            for (size_t x = 0; x < len; x++) {
                acc[x] = w * v[x];
            }
        } else {
            for (size_t x = 0; x < len; x++) {
                acc[x] += w * v[x];
            }
        }
    }
    // A power of two's reciprocal is exact: the same bits as dividing.
    if ((total & (total - 1)) == 0) {
        double inv = 1.0 / total;
        for (size_t x = 0; x < len; x++) {
            v[x] = (float)(acc[x] * inv);
        }
    } else {
        for (size_t x = 0; x < len; x++) {
            v[x] = (float)(acc[x] / total);
        }
    }
    zps_dtype_from_f32(dtype, v, out, len);
}

// The sample-weighted mean of parts [0, n) of a bucket of count elements
// as new frames (out->frames, owned): a sum in double of samples times
// values, as a shard sums pushes, divided once, in one pass.
static zps_err s_mean(zps_dtype dtype, const zps_host_part *parts, int n, size_t count,
                      zps_wire_msg *out)
{
    size_t esize = zps_dtype_size(dtype), per = ZPS_WIRE_FRAME_BYTES / esize;
    uint32_t total = 0;
    for (int k = 0; k < n; k++) {
        total += parts[k].samples;
    }
    for (size_t at = 0; at < count; at += per, out->n_frames++) {
        size_t len = count - at < per ? count - at : per;
        if (zmq_msg_init_size(&out->frames[out->n_frames], len * esize) != 0) {
            zps_log_error("out of memory summing the host's pushes (%zu bytes)", len * esize);
            return ZPS_ENOMEM;
        }
    }
    for (size_t e = 0, len; e < count; e += len) {
        size_t left;
        len = count - e < S_CHUNK ? count - e : S_CHUNK;
        for (int k = 0; k < n; k++) {
            (void)s_at(&parts[k].m, esize, e, &left);
            len = left < len ? left : len;
        }
        uint8_t *dst = s_at(out, esize, e, &left);
        len = len < left ? len : left;
        if (len == 0) {
            return ZPS_EPROTO; // a part shorter than its bucket: checked on arrival, never here
        }
        s_mean_chunk(dtype, parts, n, total, e, len, dst);
    }
    return ZPS_OK;
}

void zps_host_share_frames(zps_wire_msg *out, const zps_wire_msg *src)
{
    for (int f = 0; f < src->n_frames; f++, out->n_frames++) {
        ZPS_ASSERT(zmq_msg_init(&out->frames[f]) == 0);
        ZPS_ASSERT(zmq_msg_copy(&out->frames[f], (zmq_msg_t *)&src->frames[f]) == 0);
    }
}

// Pushes parts [0, n) of shard i's bucket b, which adjoin: their mean, or
// the one part's frames as they came (shared, not copied).
static zps_err s_push_run(zps_client *c, int i, int b, const zps_host_part *parts, int n)
{
    const zps_bucket *bk = &c->conn.shards[i].buckets[b];
    zps_wire_msg out = {.n_frames = 0};
    zps_err err = ZPS_OK;
    // A part read in place is copied: ZeroMQ may hold a frame after the
    // send returns, past its mapping. The mean of one part is its values,
    // bit for bit (samples times a float is exact in double).
    if (n == 1 && !parts[0].view) {
        zps_host_share_frames(&out, &parts[0].m);
    } else {
        err = s_mean(c->dtype, parts, n, bk->hi - bk->lo, &out);
    }
    Zps__Header hd;
    Zps__HostPiece pieces[ZPS_HOST_GROUP_MAX], *ptrs[ZPS_HOST_GROUP_MAX];
    s_run_header(c, i, b, parts, n, &hd, pieces, ptrs);
    if (err == ZPS_OK) {
        zps_host_code_push(c, i, &hd, &out);
        err = zps_conn_send_frames(&c->conn, i, &hd, out.frames, out.n_frames);
    }
    zps_wire_msg_fini(&out);
    return err;
}

static int s_by_offset(const void *a, const void *b)
{
    uint32_t x = ((const zps_host_part *)a)->offset, y = ((const zps_host_part *)b)->offset;
    return x < y ? -1 : x > y;
}

// A synchronous job's bucket: each run of parts that adjoin in the batch
// is one push of their weighted mean.
static zps_err s_flush_runs(zps_client *c, int i, int b, zps_host_bucket *hb)
{
    zps_err err = ZPS_OK;
    for (int r0 = 0, r1; err == ZPS_OK && r0 < hb->n; r0 = r1) {
        r1 = r0 + 1;
        while (r1 < hb->n && hb->parts[r1].offset == hb->parts[r1 - 1].offset +
                                                     hb->parts[r1 - 1].samples) {
            r1++;
        }
        err = s_push_run(c, i, b, hb->parts + r0, r1 - r0);
    }
    return err;
}

// Pushes a deterministic job's node of parts [0, n): its fp32 values,
// coded when the job codes (--wire-code; the code copies what it sends).
static zps_err s_push_node(zps_client *c, int i, int b, const zps_host_part *parts, int n,
                           const float *vals)
{
    Zps__Header hd;
    Zps__HostPiece pieces[ZPS_HOST_GROUP_MAX], *ptrs[ZPS_HOST_GROUP_MAX];
    s_run_header(c, i, b, parts, n, &hd, pieces, ptrs);
    size_t bytes = hd.count * sizeof(float);
    bool code = c->host.codes &&
                bytes <= (size_t)ZPS_WIRE_MAX_FRAMES * ZPS_WIRE_FRAME_BYTES; // else refused below
    zps_wire_msg out = {.n_frames = 0};
    for (size_t at = 0, len; code && at < bytes; at += len) {
        len = bytes - at < ZPS_WIRE_FRAME_BYTES ? bytes - at : ZPS_WIRE_FRAME_BYTES;
        ZPS_ASSERT(zmq_msg_init_data(&out.frames[out.n_frames++], (uint8_t *)vals + at, len,
                                     NULL, NULL) == 0);
    }
    if (out.n_frames > 0) {
        zps_host_code_push(c, i, &hd, &out);
    }
    zps_err err = hd.wire_code ? zps_conn_send_frames(&c->conn, i, &hd, out.frames, out.n_frames)
                               : zps_conn_send(&c->conn, i, &hd, vals, bytes, NULL);
    zps_wire_msg_fini(&out);
    return err;
}

// A deterministic job's node while the leader adds them: parts [p0, p1)
// of the bucket, its values (fp32: such a job's wire) in vals (owned).
typedef struct s_node_sum {
    int p0, p1;
    float *vals;
} s_node_sum;

static zps_tree_node s_node_of(const zps_client *c, const zps_host_bucket *hb,
                               const s_node_sum *x)
{
    uint32_t lo = hb->parts[x->p0].offset, hi = hb->parts[x->p1 - 1].offset +
                                                hb->parts[x->p1 - 1].samples;
    zps_tree_node node = {0};
    (void)zps_tree_node_of(c->micro.n, lo / c->micro.m, hi / c->micro.m, &node);
    return node;
}

// Adds sibling nodes of nodes[0, *n), left plus right in fp32 as the
// shard adds them, into their parent, until no two are siblings.
static void s_add_siblings(const zps_client *c, const zps_host_bucket *hb, s_node_sum *nodes,
                           int *n, size_t count)
{
    for (int j = 0; j + 1 < *n;) {
        zps_tree_node x = s_node_of(c, hb, &nodes[j]), y = s_node_of(c, hb, &nodes[j + 1]);
        zps_tree_node s = zps_tree_sibling(x);
        if (nodes[j].p1 != nodes[j + 1].p0 || x.lo > y.lo || s.lo != y.lo || s.size != y.size) {
            j++;
            continue;
        }
        for (size_t e = 0; e < count; e++) {
            nodes[j].vals[e] = nodes[j].vals[e] + nodes[j + 1].vals[e];
        }
        nodes[j].p1 = nodes[j + 1].p1;
        free(nodes[j + 1].vals);
        memmove(nodes + j + 1, nodes + j + 2, (size_t)(*n - j - 2) * sizeof *nodes);
        (*n)--;
        j = j > 0 ? j - 1 : 0; // the parent may have a sibling on its left
    }
}

// A deterministic job's bucket: each part a node of the tree; siblings
// added up; each node left is one push.
static zps_err s_flush_nodes(zps_client *c, int i, int b, zps_host_bucket *hb)
{
    size_t count = c->conn.shards[i].buckets[b].hi - c->conn.shards[i].buckets[b].lo;
    s_node_sum *nodes = calloc((size_t)hb->n, sizeof *nodes);
    int n = 0;
    zps_err err = nodes ? ZPS_OK : ZPS_ENOMEM;
    for (int j = 0; err == ZPS_OK && j < hb->n; j++, n++) {
        nodes[j] = (s_node_sum){.p0 = j, .p1 = j + 1, .vals = malloc(count * sizeof(float))};
        if (!nodes[j].vals) {
            err = ZPS_ENOMEM;
        } else {
            zps_wire_copy_payload(&hb->parts[j].m, nodes[j].vals);
        }
    }
    if (err == ZPS_OK) {
        s_add_siblings(c, hb, nodes, &n, count);
    }
    for (int j = 0; err == ZPS_OK && j < n; j++) {
        err = s_push_node(c, i, b, hb->parts + nodes[j].p0, nodes[j].p1 - nodes[j].p0,
                          nodes[j].vals);
    }
    for (int j = 0; j < n; j++) {
        free(nodes[j].vals);
    }
    free(nodes);
    if (err == ZPS_ENOMEM) {
        zps_log_error("out of memory adding the host's nodes of bucket %d", b);
    }
    return err;
}

// Pushes what shard i's bucket b holds, and marks it pushed.
static zps_err s_flush(zps_client *c, int i, int b)
{
    zps_host_bucket *hb = &c->host.buckets[i][b];
    if (hb->n == 0) {
        hb->flushed = true;
        return ZPS_OK;
    }
    qsort(hb->parts, (size_t)hb->n, sizeof *hb->parts, s_by_offset);
    zps_err err = c->micro.m ? s_flush_nodes(c, i, b, hb) : s_flush_runs(c, i, b, hb);
    zps_host_bucket_clear(hb);
    hb->flushed = true;
    return err;
}

void zps_host_flush_all(zps_client *c)
{
    zps_host *h = &c->host;
    for (int i = 0; h->active && i < c->conn.n_shards; i++) {
        for (int b = 0; h->buckets[i] && b < c->conn.shards[i].n_buckets; b++) {
            if (h->buckets[i][b].n > 0) {
                (void)s_flush(c, i, b); // a failure is logged; the members' own timers follow
            }
        }
    }
}

void zps_host_lead_step(zps_client *c, uint64_t step)
{
    zps_host *h = &c->host;
    if (h->active && h->step == step) {
        return;
    }
    zps_host_flush_all(c);
    for (int i = 0; i < c->conn.n_shards; i++) {
        for (int b = 0; h->buckets[i] && b < c->conn.shards[i].n_buckets; b++) {
            zps_host_bucket_clear(&h->buckets[i][b]);
        }
    }
    h->step = step;
    h->active = true;
    h->first_ms = zps_clock_ms();
}

// The bits of every member of the group (bit k: member k).
static uint64_t s_all_members(const zps_host *h)
{
    return h->n >= 64 ? UINT64_MAX : (1ull << h->n) - 1;
}

// Whether every member's piece is in for the bucket, the absent's aside.
static bool s_complete(const zps_host *h, const zps_host_bucket *hb)
{
    return (hb->seen | h->absent) == s_all_members(h) && hb->in == hb->expected;
}

void zps_host_mark_absent(zps_client *c)
{
    zps_host *h = &c->host;
    uint64_t seen = 0;
    for (int i = 0; i < c->conn.n_shards; i++) {
        for (int b = 0; h->buckets[i] && b < c->conn.shards[i].n_buckets; b++) {
            seen |= h->buckets[i][b].seen;
        }
    }
    uint64_t gone = s_all_members(h) & ~seen & ~h->absent;
    if (gone) {
        zps_log_warn("host: %d member(s) of the group sent nothing for step %llu within the "
                     "flush time: not waited for until they do", __builtin_popcountll(gone),
                     (unsigned long long)h->step);
    }
    h->absent |= gone;
}

zps_err zps_host_add_part(zps_client *c, int i, int b, zps_host_part *p)
{
    zps_host *h = &c->host;
    zps_host_bucket *hb = s_bucket(c, i, b);
    if (!hb) {
        zps_host_part_fini(p);
        return ZPS_ENOMEM;
    }
    for (int k = 0; k < hb->n; k++) {
        const zps_host_part *q = &hb->parts[k];
        if (p->offset < q->offset + q->samples && q->offset < p->offset + p->samples) {
            zps_log_debug("host: part [%u, +%u) of bucket %d of shard %d came twice", p->offset,
                          p->samples, b, i);
            zps_host_part_fini(p);
            return ZPS_OK;
        }
    }
    if (hb->n == hb->cap) {
        int cap = hb->cap ? 2 * hb->cap : 8;
        zps_host_part *more = realloc(hb->parts, (size_t)cap * sizeof *more);
        if (!more) {
            zps_host_part_fini(p);
            zps_log_error("out of memory holding the host's pushes");
            return ZPS_ENOMEM;
        }
        hb->parts = more;
        hb->cap = cap;
    }
    uint64_t bit = 1ull << p->member;
    h->absent &= ~bit; // back: waited for again
    hb->expected += (hb->seen & bit) ? 0 : p->piece;
    hb->seen |= bit;
    hb->in += p->samples;
    hb->parts[hb->n] = *p;
    zps_wire_msg_move(&hb->parts[hb->n].m, &p->m);
    hb->n++;
    return hb->flushed || s_complete(h, hb) ? s_flush(c, i, b) : ZPS_OK;
}

// Whether own part p completes bucket hb, the parts then adjoining in one
// run: it is then summed at once into frames of their own (or, in a
// deterministic job, into nodes' values), and the caller's gradient it
// lies in need not be copied.
static bool s_completes_one_run(const zps_host *h, const zps_host_bucket *hb,
                                const zps_host_part *p)
{
    uint64_t expected = hb->expected + ((hb->seen & 1u) ? 0 : p->piece);
    if (hb->flushed || (hb->seen | 1u | h->absent) != s_all_members(h) ||
        hb->in + p->samples != expected) {
        return false;
    }
    uint64_t lo = p->offset, hi = (uint64_t)p->offset + p->samples, sum = p->samples;
    for (int k = 0; k < hb->n; k++) {
        const zps_host_part *q = &hb->parts[k];
        lo = q->offset < lo ? q->offset : lo;
        hi = (uint64_t)q->offset + q->samples > hi ? (uint64_t)q->offset + q->samples : hi;
        sum += q->samples;
    }
    return hi - lo == sum; // disjoint parts (s_add_part drops overlaps) that leave no gap
}

// The leader's own part: its values copied (the caller's gradient moves on
// before the sum is pushed, when a member is late), or read in place when
// it completes the bucket.
static zps_err s_add_own(zps_client *c, int i, const zps_piece *p, uint64_t lo, uint64_t hi,
                         const float *grad, float loss, float compute_ms)
{
    int b = zps_conn_bucket_of(&c->conn.shards[i], lo, hi);
    size_t esize = zps_dtype_size(c->dtype), bytes = (hi - lo) * esize;
    zps_host_part part = {.member = 0, .offset = p->offset, .samples = p->count,
                          .piece = c->cur_work.count, .loss = loss, .compute_ms = compute_ms};
    if (b < 0) {
        zps_log_error("host: [%llu, %llu) is not a bucket of shard %d", (unsigned long long)lo,
                      (unsigned long long)hi, i);
        return ZPS_EINVAL;
    }
    zps_host_lead_step(c, c->cur_step);
    const zps_host_bucket *hb = s_bucket(c, i, b);
    part.m.n_frames = 1;
    part.m.payload_bytes = bytes;
    if (hb && c->dtype == ZPS_DTYPE_F32 && s_completes_one_run(&c->host, hb, &part)) {
        // Summed now, and nothing keeps the frame after: read in place.
        ZPS_ASSERT(zmq_msg_init_data(&part.m.frames[0], (void *)(grad + lo), bytes, NULL, NULL) ==
                   0);
    } else if (zmq_msg_init_size(&part.m.frames[0], bytes) != 0) {
        zps_log_error("out of memory copying a push for the host (%zu bytes)", bytes);
        return ZPS_ENOMEM;
    } else {
        zps_dtype_from_f32(c->dtype, grad + lo, zmq_msg_data(&part.m.frames[0]), hi - lo);
    }
    return zps_host_add_part(c, i, b, &part);
}

// A follower's part the leader's socket did not take within wait ms
// (again: a try after a give-up, which waits for nothing): pushed by the
// follower, which tries its leader again later (s_push_direct).
static void s_not_sent(zps_client *c, double wait, bool again)
{
    zps_host *h = &c->host;
    if (!again && !h->reached) {
        zps_log_info("host: my leader (rank %u) not reached within %.1f s: pushing for myself, "
                     "trying it again each step", h->ranks[0], wait / 1e3);
    }
    zps_host_give_up(c, "my leader takes no pushes");
    if (h->reached && !again) {
        zps_log_warn("host: my leader (rank %u) takes no pushes: pushing for myself, trying it "
                     "again at step %llu", h->ranks[0], (unsigned long long)(h->retry - 1));
    }
}

// Whether the leader's socket has a connection to write to within wait
// ms: a leader not there yet is an answer, not a failed send to log (the
// socket is ZMQ_IMMEDIATE: no connection, no pipe to write to).
static bool s_leader_connected(zps_client *c, double wait)
{
    zmq_pollitem_t item = {.socket = c->host.sock, .events = ZMQ_POLLOUT};
    return zmq_poll(&item, 1, (long)wait) > 0; // or interrupted: the follower pushes for itself
}

zps_err zps_host_push(zps_client *c, int i, const zps_piece *p, uint64_t lo, uint64_t hi,
                      const float *grad, float loss, float data_ms, float compute_ms)
{
    zps_host *h = &c->host;
    // A follower that pushes for itself tries its leader again at the
    // first part of step retry - 1 (s_push_direct), without waiting: one
    // whose connection was not up yet at its first part (on a host whose
    // members start all at once it comes up later: 3,207 of 4,032
    // followers at 4096 members on 2 cores had pushed for themselves until
    // the next plan, which a steady job never makes), or whose leader was
    // slow to take a part.
    bool again = h->retry && c->cur_step + 1 >= h->retry;
    bool group = h->n >= 2 && !h->off && (!h->retry || again) && h->remote[i] &&
                 !c->mode.diloco && s_own_piece(c) && zps_host_open(c);
    if (group && h->me == 0) {
        zps_err err = zps_host_drain(c);
        return err == ZPS_OK ? s_add_own(c, i, p, lo, hi, grad, loss, compute_ms) : err;
    }
    // The step's first part fixes when this follower gives up on it; the
    // leader takes it only within half that time (HostPiece.take_by_ms).
    bool first = h->sent != c->cur_step + 1;
    double sent_ms = first ? zps_clock_ms() : h->sent_ms;
    double give_up = first ? zps_host_give_up_ms(c) : h->give_up_ms;
    // The first part to a leader not reached yet waits a quarter of the
    // give-up for the connection (made with the plan: thousands of members
    // starting on a few cores took over a second to connect); once
    // reached, a send waits a poll's time and is not polled for first (a
    // system call more for every part).
    double wait = again ? 0 : h->reached ? ZPS_CONN_POLL_MS : give_up / 4;
    bool ready = group && ((h->reached && !again) || s_leader_connected(c, wait));
    if (ready && s_send_to_leader(c, i, p, lo, hi, grad, loss, compute_ms, sent_ms + give_up / 2,
                                  wait) == ZPS_OK) {
        if (again) {
            zps_log_info("host: my leader (rank %u) %s at step %llu: pushing through it",
                         h->ranks[0], h->reached ? "tried again" : "reached",
                         (unsigned long long)c->cur_step);
        }
        h->reached = true;
        h->retry = 0;
        if (first) {
            h->sent = c->cur_step + 1;
            h->sent_piece = c->cur_work;
            h->sent_ms = sent_ms;
            h->give_up_ms = give_up;
            h->taken = false;
            h->asked_ms = 0;
        }
        return ZPS_OK;
    }
    if (group) {
        s_not_sent(c, wait, again);
    }
    return zps_conn_push(&c->conn, i, c->cur_step, p, lo, hi, c->dtype, grad, c->wire, loss,
                         data_ms, compute_ms, &c->grad_ref);
}
