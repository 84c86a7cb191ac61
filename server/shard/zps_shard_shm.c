/* zps_shard_shm.c - the shard's side of same-host shared memory
 * (zps_shard_shm.h). */
#include "server/shard/zps_shard_shm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/zps_log.h"
#include "common/zps_model.h"

_Static_assert(ZPS_SHM_PARAMS_SLOTS >= ZPS_MODEL_MAX_BUCKETS, "a slot for every bucket");

void zps_shard_shm_init(zps_shard_shm *t, bool allow, bool curve)
{
    zps_shard_shm_fini(t);
    memset(t, 0, sizeof *t);
    t->allow = allow;
    t->curve = curve;
    if (zps_shm_boot_id(t->boot) != ZPS_OK) {
        t->boot[0] = '\0'; // never equal to a worker's: every push by frames
        if (allow) {
            zps_log_warn("no boot id here (/proc/sys/kernel/random/boot_id): pushes come by "
                         "frames, never through shared memory");
        }
    }
}

void zps_shard_shm_fini(zps_shard_shm *t)
{
    for (int r = 0; r < ZPS_MAX_MEMBERS; r++) {
        zps_shm_map_fini(&t->maps[r]);
    }
    zps_shm_seg_fini(&t->params);
}

// A refusal that says only "not here": the worker sends frames instead.
// Logged once for each process of a rank.
static zps_err s_not_here(zps_shard_shm *t, uint32_t rank, const Zps__Header *h, char *why,
                          size_t why_len, const char *reason)
{
    snprintf(why, why_len, "shared memory refused: %s; send the tensor as frames", reason);
    if (t->refused_pid[rank] != (int32_t)h->shm_pid) {
        t->refused_pid[rank] = (int32_t)h->shm_pid;
        zps_log_info("rank %u (process %u): %s", rank, h->shm_pid, why);
    }
    return ZPS_EAGAIN;
}

// Makes maps[rank] the segment h names (kept if it is already): checked
// against the operator's choice, the host and the segment itself.
static zps_err s_mapping(zps_shard_shm *t, uint32_t rank, const Zps__Header *h,
                         uint64_t range_bytes, char *why, size_t why_len)
{
    if (h->shm_size > range_bytes) {
        snprintf(why, why_len, "a segment of %llu bytes; this shard takes at most %llu",
                 (unsigned long long)h->shm_size, (unsigned long long)range_bytes);
        return ZPS_ERANGE;
    }
    zps_shm_map *map = &t->maps[rank];
    bool same_host = t->boot[0] && h->shm_boot && strcmp(h->shm_boot, t->boot) == 0;
    if (same_host && zps_shm_map_is(map, h->shm_pid, h->shm_fd, h->shm_size)) {
        return ZPS_OK;
    }
    if (!t->allow) {
        return s_not_here(t, rank, h, why, why_len,
                          t->curve ? "a CURVE job, and --shm allow was not given"
                                   : "--shm deny on this shard");
    }
    if (!same_host) {
        return s_not_here(t, rank, h, why, why_len, "the worker is on another host (boot id)");
    }
    zps_shm_map fresh;
    char reason[200];
    if (zps_shm_map_open(&fresh, h->shm_pid, h->shm_fd, h->shm_size, reason, sizeof reason) !=
        ZPS_OK) {
        return s_not_here(t, rank, h, why, why_len, reason);
    }
    zps_shm_map_fini(map);
    *map = fresh;
    zps_log_info("rank %u pushes through shared memory (process %u, %.1f MiB)%s", rank,
                 h->shm_pid, (double)h->shm_size / (1 << 20),
                 t->curve ? "; a CURVE job, as --shm allow permits (not encrypted, same user)"
                          : "");
    return ZPS_OK;
}

bool zps_shard_shm_replaces(const zps_shard_shm *t, uint32_t rank, const Zps__Header *h)
{
    const zps_shm_map *map = rank < ZPS_MAX_MEMBERS ? &t->maps[rank] : NULL;
    return h->shm_size > 0 && map && map->base &&
           !zps_shm_map_is(map, h->shm_pid, h->shm_fd, h->shm_size);
}

// Whether a read push's pages leave this process: a rank from
// ZPS_SHARD_SHM_KEEP on whose segment is over ZPS_SHARD_SHM_KEEP_BYTES.
static bool s_drops_pages(const zps_shard_shm *t, uint32_t rank)
{
    if (rank < ZPS_SHARD_SHM_KEEP || rank >= ZPS_MAX_MEMBERS) {
        return false;
    }
    const zps_shm_map *map = &t->maps[rank];
    return map->base && map->size > ZPS_SHARD_SHM_KEEP_BYTES;
}

// What a view's free function needs to drop its pages.
typedef struct s_view {
    zps_shard_shm *t; // borrowed: outlives every view (the io owns both)
    uint32_t rank;
    uint64_t offset, bytes;
} s_view;

// ZeroMQ's free function of a view, run when its last reference is closed:
// the push was read (or copied, or refused), so its pages may go.
static void s_view_free(void *data, void *hint)
{
    (void)data;
    s_view *v = hint;
    zps_shard_shm_release(v->t, v->rank, v->offset, v->bytes);
    free(v);
}

zps_err zps_shard_shm_view(zps_shard_shm *t, uint32_t rank, uint64_t range_bytes,
                           zps_dtype dtype, zps_wire_msg *m, char *why, size_t why_len)
{
    const Zps__Header *h = m->hdr;
    if (h->shm_size == 0) {
        return ZPS_OK;
    }
    if (m->n_frames != 0 || (int)h->dtype != (int)dtype) {
        snprintf(why, why_len, "a push through shared memory with %s",
                 m->n_frames ? "payload frames" : "another dtype than the job's");
        return ZPS_EPROTO;
    }
    zps_err err = s_mapping(t, rank, h, range_bytes, why, why_len);
    if (err != ZPS_OK) {
        return err;
    }
    const zps_shm_map *map = &t->maps[rank];
    size_t esize = zps_dtype_size(dtype);
    if (!zps_shm_tensor_ok(map->size, h->shm_offset, h->count, esize)) {
        snprintf(why, why_len, "tensor of %llu elements at byte %llu: outside the segment of "
                 "%zu bytes", (unsigned long long)h->count, (unsigned long long)h->shm_offset,
                 map->size);
        return ZPS_ERANGE;
    }
    size_t bytes = (size_t)(h->count * esize);
    // A view: its free function drops its pages once whoever holds it last
    // (this push's handling, or the shard keeping it) is done with it. The
    // mapping outlives it: it is not replaced or swept before the shard
    // settled (zps_shard_io.c). With no memory for that, the pages stay
    // until a later push of the same span drops them. Pages that stay
    // anyway need no free function.
    char *data = (char *)map->base + h->shm_offset;
    s_view *v = s_drops_pages(t, rank) ? malloc(sizeof *v) : NULL;
    if (v) {
        *v = (s_view){.t = t, .rank = rank, .offset = h->shm_offset, .bytes = bytes};
    }
    // With a free function ZeroMQ allocates a reference count, which may
    // fail; without one it cannot.
    if (!v || zmq_msg_init_data(&m->frames[0], data, bytes, s_view_free, v) != 0) {
        free(v);
        (void)zmq_msg_init_data(&m->frames[0], data, bytes, NULL, NULL);
    }
    m->n_frames = 1;
    m->payload_bytes = bytes;
    t->pushes++;
    return ZPS_OK;
}

zps_err zps_shard_shm_own(zps_wire_msg *m)
{
    if (!m->hdr || m->hdr->shm_size == 0 || m->n_frames != 1) {
        return ZPS_OK;
    }
    zmq_msg_t copy;
    size_t bytes = zmq_msg_size(&m->frames[0]);
    if (zmq_msg_init_size(&copy, bytes) != 0) {
        return ZPS_ENOMEM;
    }
    memcpy(zmq_msg_data(&copy), zmq_msg_data(&m->frames[0]), bytes);
    (void)zmq_msg_close(&m->frames[0]);
    (void)zmq_msg_init(&m->frames[0]);
    (void)zmq_msg_move(&m->frames[0], &copy);
    (void)zmq_msg_close(&copy);
    m->hdr->shm_size = 0; // frames now: counted again as any push is
    return ZPS_OK;
}

void zps_shard_shm_release(zps_shard_shm *t, uint32_t rank, uint64_t offset, uint64_t bytes)
{
    if (!s_drops_pages(t, rank) || bytes == 0) {
        return;
    }
    const zps_shm_map *map = &t->maps[rank];
    if (!zps_shm_span_ok(map->size, offset, bytes)) {
        return;
    }
    // Whole pages around the span: a page it shares with a neighbour not
    // read yet is only unmapped here, its bytes stay in the segment, and
    // the next read faults it in again.
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t lo = offset / page * page;
    uint64_t hi = (offset + bytes + page - 1) / page * page;
    hi = hi < map->size ? hi : map->size;
    (void)madvise((char *)map->base + lo, (size_t)(hi - lo), MADV_DONTNEED); // advice only
}

bool zps_shard_shm_gone(const zps_shard_shm *t)
{
    for (uint32_t r = 0; r < ZPS_MAX_MEMBERS; r++) {
        if (t->maps[r].base && !zps_shm_map_alive(&t->maps[r])) {
            return true;
        }
    }
    return false;
}

void zps_shard_shm_sweep(zps_shard_shm *t)
{
    for (uint32_t r = 0; r < ZPS_MAX_MEMBERS; r++) {
        zps_shm_map *map = &t->maps[r];
        if (map->base && !zps_shm_map_alive(map)) {
            zps_log_info("rank %u: process %d is gone; its segment is unmapped", r,
                         (int)map->pid);
            zps_shm_map_fini(map);
        }
    }
}

int zps_shard_shm_mapped(const zps_shard_shm *t)
{
    int n = 0;
    for (int r = 0; r < ZPS_MAX_MEMBERS; r++) {
        n += t->maps[r].base != NULL;
    }
    return n;
}

// ---------------------------------------------------------------------------
// One pull per host.

bool zps_shard_shm_params_offer(zps_shard_shm *t, bool via_shm, bool frames_asked, uint64_t lo,
                                uint64_t hi, size_t esize)
{
    if (!via_shm || frames_asked || t->params_off) {
        return false;
    }
    size_t bytes = ZPS_SHM_PARAMS_DATA + (size_t)(hi - lo) * esize;
    if (t->params.base && t->params_lo == lo && t->params.size == bytes) {
        return true;
    }
    zps_shm_seg_fini(&t->params); // another range: a new segment, named anew
    memset(t->written, 0, sizeof t->written);
    char why[200];
    if (zps_shm_seg_create_as(&t->params, ZPS_SHM_PARAMS_NAME, bytes, true, why, sizeof why) !=
        ZPS_OK) {
        zps_log_warn("no segment of parameters for the workers of this host (%s): they get "
                     "frames", why);
        t->params_off = true;
        return false;
    }
    t->params_lo = lo;
    t->params_esize = esize;
    zps_log_info("parameters for the workers of this host through shared memory (%.1f MiB)",
                 (double)bytes / (1 << 20));
    return true;
}

// Where bucket [offset, offset + count) lies in the segment, or false if
// it does not fit (a range changed under it).
static bool s_params_at(const zps_shard_shm *t, int b, uint64_t offset, uint64_t count,
                        uint64_t *at)
{
    if (!t->params.base || b < 0 || b >= ZPS_SHM_PARAMS_SLOTS || offset < t->params_lo) {
        return false;
    }
    *at = ZPS_SHM_PARAMS_DATA + (offset - t->params_lo) * t->params_esize;
    return zps_shm_span_ok(t->params.size, *at, count * t->params_esize);
}

void zps_shard_shm_params_put(zps_shard_shm *t, int b, uint64_t step, uint64_t offset,
                              uint64_t count, const void *data)
{
    uint64_t at;
    if (!s_params_at(t, b, offset, count, &at)) {
        return;
    }
    zps_shm_params_write(&t->params, (uint32_t)b, step, offset, count, at, data,
                         (size_t)(count * t->params_esize));
    t->written[b] = step + 1;
}

bool zps_shard_shm_params_name(zps_shard_shm *t, int b, uint64_t step, Zps__Header *h)
{
    uint64_t at;
    if (!s_params_at(t, b, h->offset, h->count, &at) || t->written[b] != step + 1) {
        return false;
    }
    h->shm_size = t->params.size;
    h->shm_offset = at;
    h->shm_pid = (uint32_t)getpid();
    h->shm_fd = (uint32_t)t->params.fd;
    h->shm_boot = t->boot;
    t->params_sent++;
    return true;
}

bool zps_shard_shm_params_name_all(zps_shard_shm *t, int n_buckets, uint64_t step, uint64_t lo,
                                   uint64_t hi, Zps__Header *h)
{
    if (!t->params.base || lo != t->params_lo || n_buckets > ZPS_SHM_PARAMS_SLOTS ||
        !zps_shm_span_ok(t->params.size, ZPS_SHM_PARAMS_DATA, (hi - lo) * t->params_esize)) {
        return false;
    }
    for (int b = 0; b < n_buckets; b++) {
        if (t->written[b] != step + 1) {
            return false;
        }
    }
    h->offset = lo;
    h->count = hi - lo;
    h->shm_size = t->params.size;
    h->shm_offset = ZPS_SHM_PARAMS_DATA;
    h->shm_pid = (uint32_t)getpid();
    h->shm_fd = (uint32_t)t->params.fd;
    h->shm_boot = t->boot;
    h->shm_whole = true;
    t->params_sent++;
    t->params_whole_sent++;
    return true;
}

void zps_shard_shm_params_forget(zps_shard_shm *t)
{
    memset(t->written, 0, sizeof t->written);
}
