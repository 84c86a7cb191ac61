/* zps_host.c - one push per host (lib/zps_host.h): the group of a plan,
 * the host's socket, a follower's pushes to its leader, the leader's sums
 * and pushes, the parameters passed on, and the timers that keep a
 * silent member from holding the others. */
#include "lib/zps_client_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/zps_clock.h"
#include "common/zps_log.h"
#include "common/zps_tree.h"

// ---------------------------------------------------------------------------
// The state.

static void s_part_fini(zps_host_part *p)
{
    zps_wire_msg_fini(&p->m);
}

static void s_bucket_clear(zps_host_bucket *hb)
{
    for (int k = 0; k < hb->n; k++) {
        s_part_fini(&hb->parts[k]);
    }
    hb->n = 0;
    hb->seen = hb->in = hb->expected = 0;
    hb->flushed = false;
}

static void s_routes_fini(zps_host *h)
{
    for (int k = 0; k < ZPS_HOST_GROUP_MAX; k++) {
        if (h->has_route[k]) {
            zps_wire_route_close(&h->route[k]);
            h->has_route[k] = false;
        }
    }
}

// Closes the host's socket and its monitor.
static void s_close(zps_host *h)
{
    if (h->mon) {
        (void)zmq_socket_monitor(h->sock, NULL, 0); // fails only for a socket not monitored
        zps_wire_close(&h->mon);
    }
    if (h->sock) {
        zps_wire_close(&h->sock);
    }
    // ZeroMQ leaves a bound ipc socket's file behind: the leader removes
    // it (one of a leader killed stays in the user's directory).
    if (h->bound && strncmp(h->endpoint, "ipc://", 6) == 0) {
        (void)unlink(h->endpoint + 6); // already gone is as good
    }
    h->bound = false;
}

// Drops every part still held (none once the leader pushed what it
// held) and unmaps the followers' segments, in that order: a part read in
// place must not outlive its mapping.
static void s_unmap_all(zps_host *h)
{
    for (int i = 0; i < ZPS_CONN_MAX_SHARDS; i++) {
        for (int b = 0; h->buckets[i] && b < ZPS_MODEL_MAX_BUCKETS; b++) {
            if (h->buckets[i][b].n > 0) {
                s_bucket_clear(&h->buckets[i][b]);
            }
        }
    }
    for (int k = 0; k < ZPS_HOST_GROUP_MAX; k++) {
        zps_shm_map_fini(&h->maps[k]);
    }
}

void zps_host_fini(zps_host *h)
{
    s_unmap_all(h);
    for (int i = 0; i < ZPS_CONN_MAX_SHARDS; i++) {
        for (int b = 0; h->buckets[i] && b < ZPS_MODEL_MAX_BUCKETS; b++) {
            free(h->buckets[i][b].parts);
        }
        free(h->buckets[i]);
        h->buckets[i] = NULL;
    }
    s_routes_fini(h);
    s_close(h);
    zps_shm_seg_fini(&h->seg);
    h->n = 0;
}

bool zps_host_leads(const zps_client *c)
{
    return c->host.n >= 2 && c->host.me == 0 && c->host.sock;
}

static void s_open_if_needed(zps_client *c);

void zps_host_take_shards(zps_client *c, const Zps__Job *job)
{
    zps_host *h = &c->host;
    // Parts through shared memory unless turned off (docs/choices.md, "One
    // push per host"): ZPS_SHM_HOST=off compares the two.
    h->shm = c->conn.shm != ZPS_CONN_SHM_OFF && c->conn.boot[0] && !c->conn.host_frames;
    for (int i = 0; i < c->conn.n_shards; i++) {
        const char *boot = NULL;
        for (size_t k = 0; k < job->n_shards; k++) {
            if ((int)job->shards[k]->index == i) {
                boot = job->shards[k]->boot_id;
            }
        }
        // A shard that does not say where it is counts as elsewhere: the
        // leader's push is then one more hop, never a lost sample.
        h->remote[i] = !boot || !boot[0] || !c->conn.boot[0] || strcmp(boot, c->conn.boot) != 0;
        if (boot && boot[0] && h->remote[i]) {
            c->conn.shards[i].shm_off = true; // known to be elsewhere: no segment offered
        }
    }
    s_open_if_needed(c);
}

// ---------------------------------------------------------------------------
// The group and its socket.

// Whether dir is, or now is, a directory of this user's alone.
static bool s_private_dir(const char *dir)
{
    struct stat st;
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        return false;
    }
    return lstat(dir, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == getuid() &&
           (st.st_mode & 077) == 0;
}

// The directory of the host's sockets: this user's alone, so that only
// its processes reach a leader (a follower's push is taken on that).
// $XDG_RUNTIME_DIR/zps where that works, /tmp/zps-<uid> otherwise.
static bool s_sock_dir(char *dir, size_t len)
{
    // A unix socket's path holds 107 bytes: the name after the directory
    // takes about 24 of them.
    const char *run = getenv("XDG_RUNTIME_DIR");
    if (run && run[0] == '/' && strlen(run) <= 76) {
        snprintf(dir, len, "%s/zps", run);
        if (s_private_dir(dir)) {
            return true;
        }
    }
    snprintf(dir, len, "/tmp/zps-%u", (unsigned)getuid());
    return s_private_dir(dir);
}

// A follower's DEALER to its leader: queueing nothing while not connected
// (a leader not there fails the push at once, and the follower pushes for
// itself), and watched, so that a leader gone is seen when its
// connection closes rather than when a timer runs out.
static int s_connect(zps_client *c)
{
    zps_host *h = &c->host;
    int one = 1;
    char mon[64];
    snprintf(mon, sizeof mon, "inproc://zps-host-%p", (void *)h);
    if (zmq_setsockopt(h->sock, ZMQ_IMMEDIATE, &one, sizeof one) != 0 ||
        zmq_socket_monitor(h->sock, mon, ZMQ_EVENT_DISCONNECTED) != 0) {
        return -1;
    }
    h->mon = zmq_socket(c->conn.ctx, ZMQ_PAIR);
    if (!h->mon || zmq_connect(h->mon, mon) != 0) {
        return -1;
    }
    return zmq_connect(h->sock, h->endpoint);
}

// The socket of this group: bound by the leader, connected to it by a
// follower. False (logged once; the host's workers push themselves) if
// there is no private directory for it or ZeroMQ refuses.
static bool s_open(zps_client *c)
{
    zps_host *h = &c->host;
    uint32_t leader = h->ranks[0];
    if (h->sock && h->sock_leader == leader) {
        return true;
    }
    s_close(h);
    s_routes_fini(h);
    char dir[120];
    if (!s_sock_dir(dir, sizeof dir)) {
        zps_log_warn("no private directory for the host's socket (%s): pushing for myself",
                     dir);
        h->off = true;
        return false;
    }
    snprintf(h->endpoint, sizeof h->endpoint, "ipc://%s/h%016llx-%u", dir,
             (unsigned long long)c->conn.job_id, leader);
    bool lead = h->me == 0;
    h->sock = zps_wire_socket(c->conn.ctx, lead ? ZMQ_ROUTER : ZMQ_DEALER, ZPS_CONN_POLL_MS);
    if (!h->sock || (lead ? zmq_bind(h->sock, h->endpoint) : s_connect(c))) {
        zps_log_warn("host socket %s: %s; pushing for myself", h->endpoint, zmq_strerror(errno));
        s_close(h);
        h->off = true;
        return false;
    }
    h->sock_leader = leader;
    h->reached = false;
    h->bound = lead;
    if (lead) {
        zps_log_info("host group of %d (plan %u): leading at %s", h->n, h->gen, h->endpoint);
    } else {
        zps_log_info("host group of %d (plan %u): following rank %u at %s", h->n, h->gen, leader,
                     h->endpoint);
    }
    return true;
}

// Opens the group's socket now if any shard is elsewhere (the leader then
// listens before a follower's first push), none otherwise.
static void s_open_if_needed(zps_client *c)
{
    zps_host *h = &c->host;
    bool any = false;
    for (int i = 0; i < c->conn.n_shards; i++) {
        any = any || h->remote[i];
    }
    if (any && h->n >= 2 && !h->off && c->conn.ctx) {
        (void)s_open(c); // a failure is logged: this worker pushes for itself
    }
}

// The length of a step the host's timers count in: the usual step, and
// before any step was timed (step 0), how long the first parameters took
// to come. Step 0 is the slowest: every member's first pull, the group's
// connections made, on a host whose cores every member wants at once. At
// 4096 members on 2 cores a follower's part and its leader's answer took
// over 6 s between two threads of one process: leaders stopped waiting
// after 2 s, followers gave up after 6 and pushed for themselves for the
// rest of the run (the coordinator's CPU a member 34 µs a step, 8 without).
static double s_step_ms(const zps_client *c)
{
    return c->usual_step_ms > 0 ? c->usual_step_ms : c->first_wait_ms;
}

// How long a follower waits for its leader to take a step's part:
// max(ZPS_HOST_GIVE_UP_MIN_MS, 6 steps), fixed at the step's first part.
static double s_give_up_ms(const zps_client *c)
{
    double steps = 6 * s_step_ms(c);
    return steps > ZPS_HOST_GIVE_UP_MIN_MS ? steps : ZPS_HOST_GIVE_UP_MIN_MS;
}

// Until when a follower that gives up at `step` pushes for itself. A
// leader not reached yet is tried again at the next step, without waiting
// (zps_host_push). One reached and then given up on (its socket took no
// part, or it left one to the follower) is tried again 1, 2, 4, ... steps
// on, up to ZPS_HOST_RETRY_MAX_STEPS: a leader only slow for a while
// (thousands of members starting on a few cores: 63 of 4,032 followers
// gave up on theirs at step 0 in bench/swarm at 4096 members) takes the
// group's pushes again, and one whose socket stays full costs its
// followers a failed send at ever rarer steps until the plan changes.
static void s_push_direct(zps_host *h, uint64_t step)
{
    uint32_t backoff = h->backoff ? h->backoff : 1;
    h->retry = step + 1 + (h->reached ? backoff : 1);
    if (h->reached) {
        h->backoff = backoff < ZPS_HOST_RETRY_MAX_STEPS / 2 ? 2 * backoff
                                                             : ZPS_HOST_RETRY_MAX_STEPS;
    }
}

// A follower whose piece went to a leader it no longer has, or that went
// silent: the piece is computed again and pushed by this worker itself
// (the shards keep the first copy of a sample if the leader's came after
// all), and so is every piece until it tries the leader again.
static void s_give_up(zps_client *c, const char *why)
{
    zps_host *h = &c->host;
    s_push_direct(h, c->cur_step);
    if (h->sent != c->cur_step + 1) {
        h->sent = 0; // none, or of a step answered: nothing to push again
        return;
    }
    zps_log_warn("step %llu: %s; computing my piece [%u, +%u) again and pushing it myself",
                 (unsigned long long)(h->sent - 1), why, h->sent_piece.offset,
                 h->sent_piece.count);
    zps_schedule_add_extra(&c->schedule, h->sent - 1, h->sent_piece);
    zps_due_redo(c, zps_clock_ms());
    h->sent = 0;
}

static void s_flush_all(zps_client *c);

// Checks a plan's group: at most ZPS_HOST_GROUP_MAX members in strictly
// increasing rank order, this worker among them. Its index, or -1.
static int s_find_me(const zps_client *c, const Zps__HostGroup *g)
{
    int me = -1;
    if (!g || g->n_members < 2 || g->n_members > ZPS_HOST_GROUP_MAX) {
        return -1;
    }
    for (size_t k = 0; k < g->n_members; k++) {
        if (k > 0 && g->members[k]->rank <= g->members[k - 1]->rank) {
            return -1;
        }
        me = g->members[k]->rank == c->conn.rank ? (int)k : me;
    }
    return me;
}

// The old group's ranks and what its leader told them (take_group).
typedef struct s_answers {
    int n;
    bool led;
    uint32_t ranks[ZPS_HOST_GROUP_MAX];
    uint64_t acked[ZPS_HOST_GROUP_MAX], left[ZPS_HOST_GROUP_MAX];
} s_answers;

// What a leader told its followers (acked, left) stays theirs in the new
// group, by rank: a part it took before the plan changed is pushed with
// the old group's sums, and a follower asking about it must hear so.
static void s_keep_answers(zps_host *h, const s_answers *old)
{
    for (int k = 0; k < ZPS_HOST_GROUP_MAX; k++) {
        h->acked[k] = h->left[k] = 0;
        for (int j = 0; k < h->n && h->me == 0 && old->led && j < old->n; j++) {
            if (old->ranks[j] == h->ranks[k]) {
                h->acked[k] = old->acked[j];
                h->left[k] = old->left[j];
            }
        }
    }
}

zps_err zps_host_take_group(zps_client *c, uint32_t gen, const Zps__HostGroup *g)
{
    zps_host *h = &c->host;
    int me = s_find_me(c, g);
    int n = me >= 0 && g ? (int)g->n_members : 0;
    if (gen == h->gen && n == h->n && (n == 0 || h->me == me)) {
        return ZPS_OK; // the same plan told again (slices handed over): the same group
    }
    if (g && g->n_members > 0 && me < 0) {
        zps_log_warn("plan %u: a host group that does not hold this worker in rank order "
                     "(%zu members): pushing for myself", gen, g->n_members);
    }
    uint32_t leader = h->n >= 2 ? h->ranks[0] : UINT32_MAX;
    if (h->n >= 2 && h->me == 0) {
        s_flush_all(c); // what the old group gave: pushed as it is
    }
    s_unmap_all(h); // index k may be another member now
    s_answers old = {.n = h->n, .led = h->n >= 2 && h->me == 0};
    memcpy(old.ranks, h->ranks, sizeof old.ranks);
    memcpy(old.acked, h->acked, sizeof old.acked);
    memcpy(old.left, h->left, sizeof old.left);
    h->seg_refused = false;
    h->gen = gen;
    h->n = n;
    h->me = me < 0 ? 0 : me;
    h->absent = 0;
    h->retry = 0;
    h->backoff = 1;
    for (int k = 0; k < h->n; k++) {
        h->ranks[k] = g->members[k]->rank;
    }
    s_keep_answers(h, &old);
    if (h->sent && (h->n < 2 || h->ranks[0] != leader)) {
        s_give_up(c, "my leader changed before its push came back");
    }
    h->asked_ms = 0; // a question of the old group is asked again
    s_open_if_needed(c);
    return ZPS_OK;
}

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

// out's frames become src's, shared (ZeroMQ counts the references), not copied.
static void s_share_frames(zps_wire_msg *out, const zps_wire_msg *src)
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
        s_share_frames(&out, &parts[0].m);
    } else {
        err = s_mean(c->dtype, parts, n, bk->hi - bk->lo, &out);
    }
    Zps__Header hd;
    Zps__HostPiece pieces[ZPS_HOST_GROUP_MAX], *ptrs[ZPS_HOST_GROUP_MAX];
    s_run_header(c, i, b, parts, n, &hd, pieces, ptrs);
    if (err == ZPS_OK) {
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

// Pushes a deterministic job's node of parts [0, n): its fp32 values.
static zps_err s_push_node(zps_client *c, int i, int b, const zps_host_part *parts, int n,
                           const float *vals)
{
    Zps__Header hd;
    Zps__HostPiece pieces[ZPS_HOST_GROUP_MAX], *ptrs[ZPS_HOST_GROUP_MAX];
    s_run_header(c, i, b, parts, n, &hd, pieces, ptrs);
    return zps_conn_send(&c->conn, i, &hd, vals, hd.count * sizeof(float), NULL);
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
    s_bucket_clear(hb);
    hb->flushed = true;
    return err;
}

// Pushes every bucket of the step still held (a group that changed, a
// member that went silent, a new step).
static void s_flush_all(zps_client *c)
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

// The leader turns to `step`: what is left of the one before is pushed.
static void s_lead_step(zps_client *c, uint64_t step)
{
    zps_host *h = &c->host;
    if (h->active && h->step == step) {
        return;
    }
    s_flush_all(c);
    for (int i = 0; i < c->conn.n_shards; i++) {
        for (int b = 0; h->buckets[i] && b < c->conn.shards[i].n_buckets; b++) {
            s_bucket_clear(&h->buckets[i][b]);
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

// Before a step is pushed on the timer: the members none of whose parts
// came are not waited for from now on, until one of theirs comes. A
// follower that gave up on this leader pushes for itself for a while, so
// without this every step of that while waited the timer out, and the
// timer, 3 usual steps, grew with the steps it lengthened: at 1024
// members steps went 5, 9, 11, 13 ... 48 s.
static void s_mark_absent(zps_client *c)
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

// Takes part p (moved) for shard i's bucket b of the step being summed:
// pushed with the bucket once every member's piece is in, or at once if
// the bucket was pushed already. A part that overlaps one held is dropped.
static zps_err s_add_part(zps_client *c, int i, int b, zps_host_part *p)
{
    zps_host *h = &c->host;
    zps_host_bucket *hb = s_bucket(c, i, b);
    if (!hb) {
        s_part_fini(p);
        return ZPS_ENOMEM;
    }
    for (int k = 0; k < hb->n; k++) {
        const zps_host_part *q = &hb->parts[k];
        if (p->offset < q->offset + q->samples && q->offset < p->offset + p->samples) {
            zps_log_debug("host: part [%u, +%u) of bucket %d of shard %d came twice", p->offset,
                          p->samples, b, i);
            s_part_fini(p);
            return ZPS_OK;
        }
    }
    if (hb->n == hb->cap) {
        int cap = hb->cap ? 2 * hb->cap : 8;
        zps_host_part *more = realloc(hb->parts, (size_t)cap * sizeof *more);
        if (!more) {
            s_part_fini(p);
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
    s_lead_step(c, c->cur_step);
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
    return s_add_part(c, i, b, &part);
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
    s_give_up(c, "my leader takes no pushes");
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
                 !c->mode.diloco && s_own_piece(c) && s_open(c);
    if (group && h->me == 0) {
        zps_err err = zps_host_drain(c);
        return err == ZPS_OK ? s_add_own(c, i, p, lo, hi, grad, loss, compute_ms) : err;
    }
    // The step's first part fixes when this follower gives up on it; the
    // leader takes it only within half that time (HostPiece.take_by_ms).
    bool first = h->sent != c->cur_step + 1;
    double sent_ms = first ? zps_clock_ms() : h->sent_ms;
    double give_up = first ? s_give_up_ms(c) : h->give_up_ms;
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

// ---------------------------------------------------------------------------
// The leader's socket: followers' parts in, parameters out.

// The group index of a follower's rank, or -1.
static int s_member_of(const zps_host *h, uint32_t rank)
{
    for (int k = 1; k < h->n; k++) {
        if (h->ranks[k] == rank) {
            return k;
        }
    }
    return -1;
}

// Whether a follower's PUSH is one the leader sums: of this job, group and
// step (or the next), for a bucket of a shard elsewhere, its part inside
// its piece (a node of the tree in a deterministic job); the reason if not.
static bool s_part_ok(const zps_client *c, const Zps__Header *hd, int *b, char *why, size_t len)
{
    const zps_host *h = &c->host;
    const Zps__HostPiece *pc = hd->n_host_pieces == 1 ? hd->host_pieces[0] : NULL;
    zps_tree_node node;
    *b = -1;
    if (hd->type != ZPS__MSG_TYPE__PUSH || hd->job_id != c->conn.job_id || !pc ||
        pc->rank != hd->rank || s_member_of(h, hd->rank) < 0 || hd->generation != h->gen) {
        snprintf(why, len, "not a push of this group (rank %u, plan %u)", hd->rank,
                 hd->generation);
        return false;
    }
    if (hd->shard >= (uint32_t)c->conn.n_shards || !h->remote[hd->shard] ||
        (*b = zps_conn_bucket_of(&c->conn.shards[hd->shard], hd->offset,
                                 hd->offset + hd->count)) < 0 ||
        (int)hd->dtype != (int)c->dtype) {
        snprintf(why, len, "not a bucket of a shard on another host");
        return false;
    }
    if (pc->samples == 0 || pc->samples > c->global_batch ||
        pc->batch_offset > c->global_batch - pc->samples || hd->samples == 0 ||
        hd->batch_offset < pc->batch_offset ||
        hd->samples > pc->batch_offset + pc->samples - hd->batch_offset ||
        (c->micro.m && (hd->batch_offset % c->micro.m || hd->samples % c->micro.m ||
                        !zps_tree_node_of(c->micro.n, hd->batch_offset / c->micro.m,
                                          (hd->batch_offset + hd->samples) / c->micro.m,
                                          &node)))) {
        snprintf(why, len, "part [%u, +%u) is not inside its piece [%u, +%u)",
                 hd->batch_offset, hd->samples, pc->batch_offset, pc->samples);
        return false;
    }
    return true;
}

// The HOST_ACK of rank's part of `step` with flags: a leader's answer
// (flags 0 or ZPS_HOST_LEFT) or a follower's question (ZPS_HOST_ASK).
static void s_ack_header(const zps_client *c, uint32_t rank, uint64_t step, uint32_t flags,
                         Zps__Header *a)
{
    zps_wire_header_init(a, ZPS__MSG_TYPE__HOST_ACK);
    a->job_id = c->conn.job_id;
    a->rank = rank;
    a->step = step;
    a->generation = c->host.gen;
    a->flags = flags;
}

// Tells the follower at route about its part of `step`: in the leader's
// hands (flags 0), or left to it (ZPS_HOST_LEFT). Never waits: a follower
// gone loses nothing it needs.
static zps_err s_send_ack(zps_client *c, zmq_msg_t *route, uint32_t rank, uint64_t step,
                         uint32_t flags)
{
    Zps__Header a;
    s_ack_header(c, rank, step, flags, &a);
    return zps_wire_send_frames(c->host.sock, route, &a, NULL, 0);
}

// Tells follower k that its part of `step` is in, once a step: from then
// on the part is the leader's to push (or the leader's failure is seen as
// any member's). Never waits: a follower gone loses nothing it needs.
// acked[k] says whether it was told (the caller's to act on).
static void s_ack(zps_client *c, int k, uint64_t step)
{
    zps_host *h = &c->host;
    if (h->acked[k] != step + 1 && s_send_ack(c, &h->route[k], h->ranks[k], step, 0) == ZPS_OK) {
        h->acked[k] = step + 1;
    }
}

// Follower k asks whether its part of hd's step is in the leader's hands
// (its give-up came and no ack had): yes if it was told so (the ack may
// still be on its way: on 2 cores starved by 4096 members one took over 3
// s, the follower pushed the piece it was in too, and the shard refused
// the leader's sum as partly counted, the other pieces in it lost with
// it), otherwise left to it from now on, and told so. A member not in the
// group changes nothing: its group changes too.
static void s_answer(zps_client *c, zps_wire_msg *m)
{
    zps_host *h = &c->host;
    const Zps__Header *hd = m->hdr;
    int k = s_member_of(h, hd->rank);
    if (hd->job_id != c->conn.job_id || k < 0) {
        return;
    }
    uint32_t flags = 0;
    if (h->acked[k] != hd->step + 1) {
        zps_log_info("host: rank %u asks for its part of step %llu, not taken: left to it",
                     hd->rank, (unsigned long long)hd->step);
        h->left[k] = hd->step + 1;
        flags = ZPS_HOST_LEFT;
    }
    if (s_send_ack(c, &m->route, hd->rank, hd->step, flags) != ZPS_OK) {
        zps_log_debug("host: rank %u not answered: it asks again", hd->rank);
    }
}

// Tells the follower that sent m that its part in shared memory could not
// be read: the PUSH comes back as a HOST_ACK with the reason, and the
// follower sends the same values as frames (zps_host_take_ack).
static void s_refuse_view(zps_client *c, zps_wire_msg *m, zps_err err, const char *why)
{
    zps_host *h = &c->host;
    const Zps__Header *hd = m->hdr;
    Zps__Header a = *hd;
    a.type = ZPS__MSG_TYPE__HOST_ACK;
    a.error_code = err;
    a.error = (char *)why;
    zps_log_debug("host: rank %u's part not read in place (%s): it sends frames", hd->rank, why);
    if (zps_wire_send_frames(h->sock, &m->route, &a, NULL, 0) != ZPS_OK) {
        zps_log_debug("host: rank %u not told to send frames", hd->rank);
    }
}

// m's values as a frame that reads follower k's segment in place (mapped
// at its first such part of the group); the reason if not.
static zps_err s_view(zps_client *c, int k, zps_wire_msg *m, char *why, size_t why_len)
{
    zps_host *h = &c->host;
    const Zps__Header *hd = m->hdr;
    size_t esize = zps_dtype_size(c->dtype);
    uint64_t size = 2 * (uint64_t)c->model.n_params * esize;
    if (!h->shm) {
        snprintf(why, why_len, "shared memory for parts is off here (ZPS_SHM_HOST or --shm)");
        return ZPS_EPERM;
    }
    if (m->n_frames != 0 || !hd->shm_boot || strcmp(hd->shm_boot, c->conn.boot) != 0 ||
        hd->shm_size != size) {
        snprintf(why, why_len, "a segment of %llu bytes on host '%s'%s, not %llu on this one",
                 (unsigned long long)hd->shm_size, hd->shm_boot ? hd->shm_boot : "",
                 m->n_frames ? " with frames" : "", (unsigned long long)size);
        return ZPS_EPROTO;
    }
    zps_shm_map *map = &h->maps[k];
    zps_err err = ZPS_OK;
    if (!map->base) {
        err = zps_shm_map_open(map, hd->shm_pid, hd->shm_fd, hd->shm_size, why, why_len);
    } else if (!zps_shm_map_is(map, hd->shm_pid, hd->shm_fd, hd->shm_size)) {
        snprintf(why, why_len, "a second segment in one group");
        err = ZPS_EPROTO;
    }
    if (err != ZPS_OK) {
        return err;
    }
    if (!zps_shm_tensor_ok(map->size, hd->shm_offset, hd->count, esize)) {
        snprintf(why, why_len, "%llu elements at byte %llu: outside the segment",
                 (unsigned long long)hd->count, (unsigned long long)hd->shm_offset);
        return ZPS_ERANGE;
    }
    size_t bytes = (size_t)(hd->count * esize);
    // No free function: the mapping outlives the frame (s_unmap_all).
    ZPS_ASSERT(zmq_msg_init_data(&m->frames[0], (char *)map->base + hd->shm_offset, bytes, NULL,
                                 NULL) == 0);
    m->n_frames = 1;
    m->payload_bytes = bytes;
    return ZPS_OK;
}

// Whether follower k's part hd is its own to push, not the leader's to
// take: a first part taken past half the follower's give-up might be
// pushed by the follower itself too (it does when not answered by then),
// and a sum with it would be refused as partly counted, losing the other
// members' pieces with it. Left to the follower, unanswered, with the
// rest of its step. Once answered for the step, every part is taken: it
// no longer gives up.
static bool s_left_to_it(zps_host *h, const Zps__Header *hd, int k)
{
    if (h->left[k] == hd->step + 1) {
        return true;
    }
    double late = zps_clock_ms() - hd->host_pieces[0]->take_by_ms;
    if (h->acked[k] != hd->step + 1 && late >= 0) {
        zps_log_info("host: rank %u's part of step %llu came %.1f s past its time to be taken: "
                     "left to it", hd->rank, (unsigned long long)hd->step, late / 1e3);
        h->left[k] = hd->step + 1;
        return true;
    }
    return false;
}

// A follower's part, checked, taken (m moved) for the step it is of: an
// older step's is dropped (its bucket was pushed without it, and the
// follower, not answered, pushes it itself).
static void s_take_part(zps_client *c, zps_wire_msg *m)
{
    zps_host *h = &c->host;
    char why[160];
    int b;
    const Zps__Header *hd = m->hdr;
    if (!hd || !s_part_ok(c, hd, &b, why, sizeof why) ||
        (hd->shm_size == 0 && zps_wire_check_tensor(m, (int)c->dtype, hd->offset,
                                                    hd->offset + hd->count, why,
                                                    sizeof why) != ZPS_OK)) {
        zps_log_warn("host: a push to the leader refused: %s", hd ? why : "no header");
        return;
    }
    if (h->active && hd->step < h->step) {
        zps_log_debug("host: rank %u's part of step %llu came after it was pushed", hd->rank,
                      (unsigned long long)hd->step);
        return;
    }
    int k = s_member_of(h, hd->rank);
    if (s_left_to_it(h, hd, k)) {
        return;
    }
    zps_err err = hd->shm_size ? s_view(c, k, m, why, sizeof why) : ZPS_OK;
    if (err != ZPS_OK) {
        s_refuse_view(c, m, err, why);
        return;
    }
    if (h->has_route[k]) {
        zps_wire_route_close(&h->route[k]);
    }
    zps_wire_route_copy(&h->route[k], &m->route);
    h->has_route[k] = true;
    s_lead_step(c, hd->step);
    s_ack(c, k, hd->step);
    if (h->acked[k] != hd->step + 1) {
        // Not told it is in, the follower gives up on it and pushes it
        // itself; summed here too, its piece would come twice, and the
        // shard refuses the whole sum as partly counted: the pieces of
        // the members told theirs were in would be lost with it.
        zps_log_info("host: rank %u not told its part of step %llu is in: left to it",
                     hd->rank, (unsigned long long)hd->step);
        h->left[k] = hd->step + 1;
        return;
    }
    const Zps__HostPiece *pc = hd->host_pieces[0];
    zps_host_part part = {.member = (uint32_t)k, .offset = hd->batch_offset,
                          .samples = hd->samples, .piece = pc->samples, .loss = pc->loss,
                          .compute_ms = pc->compute_ms, .view = hd->shm_size > 0};
    int shard = (int)hd->shard;
    zps_wire_msg_move(&part.m, m);
    (void)s_add_part(c, shard, b, &part); // a failure is logged; the follower's timer follows
}

zps_err zps_host_drain(zps_client *c)
{
    zps_host *h = &c->host;
    zmq_pollitem_t item = {.socket = h->sock, .events = ZMQ_POLLIN};
    while (zps_host_leads(c) && zmq_poll(&item, 1, 0) > 0) {
        zps_wire_msg m;
        zps_err err = zps_wire_recv(h->sock, true, &m);
        if (err == ZPS_OK && m.hdr && m.hdr->type == ZPS__MSG_TYPE__HOST_ACK &&
            (m.hdr->flags & ZPS_HOST_ASK)) {
            s_answer(c, &m);
        } else if (err == ZPS_OK) {
            s_take_part(c, &m);
        }
        zps_wire_msg_fini(&m);
        if (err != ZPS_OK && err != ZPS_ETIMEDOUT && err != ZPS_EPROTO) {
            return err;
        }
    }
    return ZPS_OK;
}

// Sends m (header and frames, the frames shared, not copied) to the
// follower at route. Never waits: a follower gone loses nothing it needs.
static void s_forward(void *sock, zmq_msg_t *route, const zps_wire_msg *m)
{
    zps_wire_msg out = {.n_frames = 0};
    s_share_frames(&out, m);
    if (zps_wire_send_frames(sock, route, m->hdr, out.frames, out.n_frames) != ZPS_OK) {
        zps_log_debug("host: parameters not passed on");
    }
    zps_wire_msg_fini(&out);
}

void zps_host_relay(zps_client *c, int i, const zps_wire_msg *m)
{
    zps_host *h = &c->host;
    // Those after the step summed, or of it (the leader may have turned to
    // the next step while a follower still waits for them).
    if (!zps_host_leads(c) || !h->remote[i] || !h->active || !m->hdr ||
        m->hdr->type != ZPS__MSG_TYPE__PARAMS || m->hdr->shm_size > 0 ||
        (m->hdr->step != h->step + 1 && m->hdr->step != h->step)) {
        return;
    }
    for (int k = 1; k < h->n; k++) {
        if (h->has_route[k]) {
            s_forward(h->sock, &h->route[k], m);
        }
    }
}

void zps_host_on_event(zps_client *c)
{
    zps_host *h = &c->host;
    zmq_pollitem_t item = {.socket = h->mon, .events = ZMQ_POLLIN};
    bool gone = false;
    while (h->mon && zmq_poll(&item, 1, 0) > 0) {
        zmq_msg_t part;
        ZPS_ASSERT(zmq_msg_init(&part) == 0);
        while (zmq_msg_recv(&part, h->mon, ZMQ_DONTWAIT) >= 0 && zmq_msg_more(&part)) {
        }
        ZPS_ASSERT(zmq_msg_close(&part) == 0);
        gone = true;
    }
    if (gone) {
        s_give_up(c, "my leader's connection closed");
    }
}

// The leader could not read part hd (its PUSH, sent back) in place: the
// same values go again as frames, from the segment (this step's half is
// not written again before the step's parameters came), and every part
// after them until the next group. Nothing is lost; a part of another
// step, or not of the segment, changes nothing.
static void s_send_again(zps_client *c, const Zps__Header *hd)
{
    zps_host *h = &c->host;
    size_t esize = zps_dtype_size(c->dtype);
    if (h->sent != hd->step + 1 || h->seg_step != hd->step + 1 || hd->shm_size == 0 ||
        hd->shm_size != h->seg.size || hd->shm_pid != (uint32_t)getpid() ||
        hd->shm_fd != (uint32_t)h->seg.fd ||
        !zps_shm_tensor_ok(h->seg.size, hd->shm_offset, hd->count, esize)) {
        return;
    }
    if (!h->seg_refused) {
        zps_log_warn("host: my leader (rank %u) cannot read my segment (%s): frames to it until "
                     "the next plan", h->ranks[0], hd->error ? hd->error : "");
    }
    h->seg_refused = true;
    Zps__Header again = *hd, blank;
    zps_wire_header_init(&blank, ZPS__MSG_TYPE__PUSH);
    again.type = blank.type;
    again.error_code = blank.error_code;
    again.error = blank.error;
    again.shm_size = blank.shm_size;
    again.shm_offset = blank.shm_offset;
    again.shm_pid = blank.shm_pid;
    again.shm_fd = blank.shm_fd;
    again.shm_boot = blank.shm_boot;
    if (zps_wire_send(h->sock, NULL, &again, (const uint8_t *)h->seg.base + hd->shm_offset,
                      (size_t)(hd->count * esize), NULL) != ZPS_OK) {
        s_give_up(c, "my leader takes no pushes");
    }
}

bool zps_host_take_ack(zps_client *c, const zps_wire_msg *m)
{
    zps_host *h = &c->host;
    if (!m->hdr || m->hdr->type != ZPS__MSG_TYPE__HOST_ACK) {
        return false;
    }
    if (h->n >= 2 && h->me > 0 && m->hdr->error_code != 0 && m->hdr->job_id == c->conn.job_id &&
        m->hdr->rank == c->conn.rank && m->hdr->generation == h->gen) {
        s_send_again(c, m->hdr);
        return true;
    }
    bool left = (m->hdr->flags & ZPS_HOST_LEFT) != 0;
    if (h->n >= 2 && h->me > 0 && h->sent == m->hdr->step + 1 && !h->taken && left &&
        m->hdr->job_id == c->conn.job_id && m->hdr->rank == c->conn.rank) {
        char why[128];
        snprintf(why, sizeof why, "my leader (rank %u) did not take my part for %.1f s and "
                 "leaves it to me", h->ranks[0], (zps_clock_ms() - h->sent_ms) / 1e3);
        s_give_up(c, why);
        return true;
    }
    if (h->n >= 2 && h->me > 0 && h->sent == m->hdr->step + 1 && !left &&
        m->hdr->job_id == c->conn.job_id && m->hdr->rank == c->conn.rank &&
        m->hdr->generation == h->gen) {
        h->taken = true;
        h->backoff = 1;
        // The leader's push to shard 0 will name this member's piece, which
        // the coordinator there hears as a heartbeat from it.
        if (h->remote[0]) {
            zps_heartbeat_heard(c->conn.heartbeat);
        }
    }
    return true; // an ack of an older part or group changes nothing
}

bool zps_host_from_leader(const zps_client *c, const zps_wire_msg *m)
{
    const zps_host *h = &c->host;
    return h->n >= 2 && h->me > 0 && m->hdr && m->hdr->type == ZPS__MSG_TYPE__PARAMS &&
           m->hdr->shard < (uint32_t)c->conn.n_shards && h->remote[m->hdr->shard] &&
           m->hdr->shm_size == 0;
}

// ---------------------------------------------------------------------------
// Timers.

// Whether every shard elsewhere answered this wait.
static bool s_remote_in(const zps_client *c)
{
    for (int i = 0; i < c->conn.n_shards; i++) {
        const zps_conn_shard *sc = &c->conn.shards[i];
        if (c->host.remote[i] && !zps_bucket_set_full(&sc->received, sc->n_buckets)) {
            return false;
        }
    }
    return true;
}

bool zps_host_give_up_due(const zps_client *c, double now)
{
    const zps_host *h = &c->host;
    double since = h->asked_ms > 0 ? h->asked_ms : h->sent_ms;
    return !zps_host_leads(c) && h->sent && !h->taken && h->sent == c->wait_step &&
           c->phase == ZPS_PHASE_WAIT && now - since >= h->give_up_ms && !s_remote_in(c);
}

// A follower whose part its leader did not take within its give-up asks
// it whether it holds it (s_answer), and again at each give-up time while
// not answered (a question lost with a group that changed, a leader that
// hangs: the step waits for it as for its own piece). Only a leader that
// cannot be asked (no connection: gone) is given up on at once.
static void s_ask(zps_client *c, double now)
{
    zps_host *h = &c->host;
    Zps__Header a;
    s_ack_header(c, c->conn.rank, h->sent - 1, ZPS_HOST_ASK, &a);
    a.member_id = c->conn.member_id;
    int never = 0;
    if (zmq_setsockopt(h->sock, ZMQ_SNDTIMEO, &never, sizeof never) != 0 ||
        zps_wire_send(h->sock, NULL, &a, NULL, 0, NULL) != ZPS_OK) {
        char why[96];
        snprintf(why, sizeof why, "my leader (rank %u) did not take my part for %.1f s and "
                 "cannot be asked", h->ranks[0], (now - h->sent_ms) / 1e3);
        s_give_up(c, why);
        return;
    }
    if (h->asked_ms == 0) {
        zps_log_info("step %llu: my leader (rank %u) did not take my part for %.1f s: asking it "
                     "whether it holds it", (unsigned long long)(h->sent - 1), h->ranks[0],
                     (now - h->sent_ms) / 1e3);
    }
    h->asked_ms = now;
}

zps_err zps_host_due(zps_client *c, double now)
{
    zps_host *h = &c->host;
    double usual = s_step_ms(c);
    if (zps_host_leads(c)) {
        zps_err err = zps_host_drain(c);
        double flush = 3 * usual > ZPS_HOST_FLUSH_MIN_MS ? 3 * usual : ZPS_HOST_FLUSH_MIN_MS;
        if (err == ZPS_OK && h->active && now - h->first_ms >= flush) {
            s_mark_absent(c);
            s_flush_all(c); // a member late or gone: what is in goes; it pushes its own
            h->first_ms = now;
        }
        return err;
    }
    if (zps_host_give_up_due(c, now)) {
        s_ask(c, now);
    }
    return ZPS_OK;
}
