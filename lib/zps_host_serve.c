/* zps_host_serve.c - one push per host (lib/zps_host.h): the leader's
 * socket, its followers' parts in (taken, acknowledged, or left to them)
 * and the shards' parameters out to them. */
#include "lib/zps_host_int.h"

#include <stdio.h>
#include <string.h>

#include "common/zps_clock.h"
#include "common/zps_log.h"
#include "common/zps_tree.h"

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

void zps_host_ack_header(const zps_client *c, uint32_t rank, uint64_t step, uint32_t flags,
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
    zps_host_ack_header(c, rank, step, flags, &a);
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
    zps_host_lead_step(c, hd->step);
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
    // A failure is logged; the follower's timer follows.
    (void)zps_host_add_part(c, shard, b, &part);
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
    zps_host_share_frames(&out, m);
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
        zps_host_give_up(c, "my leader's connection closed");
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
        zps_host_give_up(c, "my leader takes no pushes");
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
        zps_host_give_up(c, why);
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
