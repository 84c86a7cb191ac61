/* zps_host.c - one push per host (lib/zps_host.h): the group of a plan,
 * the host's socket, and the timers that keep a silent member from
 * holding the others. A member's push and the leader's sums are in
 * zps_host_sum.c, the leader's socket in zps_host_serve.c. */
#include "lib/zps_host_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/zps_clock.h"
#include "common/zps_log.h"

// ---------------------------------------------------------------------------
// The state.

void zps_host_part_fini(zps_host_part *p)
{
    zps_wire_msg_fini(&p->m);
}

void zps_host_bucket_clear(zps_host_bucket *hb)
{
    for (int k = 0; k < hb->n; k++) {
        zps_host_part_fini(&hb->parts[k]);
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
                zps_host_bucket_clear(&h->buckets[i][b]);
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
    zps_host_code_fini(h);
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

bool zps_host_open(zps_client *c)
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
        (void)zps_host_open(c); // a failure is logged: this worker pushes for itself
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

double zps_host_give_up_ms(const zps_client *c)
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

void zps_host_give_up(zps_client *c, const char *why)
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
        zps_host_flush_all(c); // what the old group gave: pushed as it is
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
        zps_host_give_up(c, "my leader changed before its push came back");
    }
    h->asked_ms = 0; // a question of the old group is asked again
    s_open_if_needed(c);
    return ZPS_OK;
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
    zps_host_ack_header(c, c->conn.rank, h->sent - 1, ZPS_HOST_ASK, &a);
    a.member_id = c->conn.member_id;
    int never = 0;
    if (zmq_setsockopt(h->sock, ZMQ_SNDTIMEO, &never, sizeof never) != 0 ||
        zps_wire_send(h->sock, NULL, &a, NULL, 0, NULL) != ZPS_OK) {
        char why[96];
        snprintf(why, sizeof why, "my leader (rank %u) did not take my part for %.1f s and "
                 "cannot be asked", h->ranks[0], (now - h->sent_ms) / 1e3);
        zps_host_give_up(c, why);
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
            zps_host_mark_absent(c);
            zps_host_flush_all(c); // a member late or gone: what is in goes; it pushes its own
            h->first_ms = now;
        }
        return err;
    }
    if (zps_host_give_up_due(c, now)) {
        s_ask(c, now);
    }
    return ZPS_OK;
}
