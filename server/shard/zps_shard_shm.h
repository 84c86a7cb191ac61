/* zps_shard_shm.h - the shard's side of same-host shared memory
 * (common/zps_shm.h, docs/choices.md): a PUSH that names a worker's
 * segment instead of carrying frames is read from the mapping.
 *
 * One mapping per rank, opened at the first such push of its process and
 * kept while it runs; a push naming another process or segment replaces
 * it. Everything in the header is checked before a byte is read: the
 * operator's --shm, the host (boot id), the process and its fd, the
 * segment's size and seals, and the tensor's span inside it. A refusal
 * changes nothing: the mapping stays as it was, and the push is answered
 * "not yet" (the worker sends it again as frames) or, for a span outside
 * the segment, as malformed. */
#ifndef ZPS_SHARD_SHM_H
#define ZPS_SHARD_SHM_H

#include <stdbool.h>
#include <stdint.h>

#include "common/zps_dtype.h"
#include "common/zps_plan.h"
#include "common/zps_shm.h"
#include "common/zps_wire.h"

typedef struct zps_shard_shm {
    bool allow;                           // the operator's --shm (or its default)
    bool curve;                           // the job is under CURVE: said in the log line
    char boot[ZPS_SHM_BOOT_ID_LEN];       // this host's boot id ("": unknown, never shared)
    zps_shm_map maps[ZPS_MAX_MEMBERS];    // owned: per rank, its process's segment
    int32_t refused_pid[ZPS_MAX_MEMBERS]; // per rank: the process last refused (logged once)
    uint64_t pushes;                      // pushes read from shared memory
    // One pull per host: the range's parameters for the workers that push
    // through shared memory (common/zps_shm.h, ZPS_SHM_PARAMS_NAME).
    zps_shm_seg params;                   // owned: made at the first such push, or empty
    bool params_off;                      // it could not be made: frames for everyone
    uint64_t params_lo;                   // the first element of the range it holds
    size_t params_esize;                  // bytes of an element there (the wire dtype)
    uint64_t written[ZPS_SHM_PARAMS_SLOTS]; // per bucket: 1 + the step of its values there
    uint64_t params_sent;                 // PARAMS that named the segment
    uint64_t params_whole_sent;           // of them, for a whole step (shm_whole)
} zps_shard_shm;

// Ready, with the operator's choice; no mapping yet.
void zps_shard_shm_init(zps_shard_shm *t, bool allow, bool curve);
// Unmaps every segment. Safe on zeroed memory.
void zps_shard_shm_fini(zps_shard_shm *t);

// Whether a PUSH of rank with header h would replace rank's mapping (a
// segment of another process, or another one): what was read through the
// old one must be settled first (zps_shard_settle).
bool zps_shard_shm_replaces(const zps_shard_shm *t, uint32_t rank, const Zps__Header *h);
// For a PUSH of rank (< ZPS_MAX_MEMBERS) whose header names a segment
// (shm_size > 0): makes m's payload a view of its tensor in the mapping,
// valid while the mapping is, so the shard reads it as it reads frames.
// The view's pages are released (zps_shard_shm_release) when its last
// reference is closed: the shard may keep one (zps_kept.h).
// range_bytes bounds the segment (twice the shard's range in fp32). A push
// without shm_size is left alone (ZPS_OK). Refused with the reason in why
// and nothing changed: ZPS_EAGAIN (shared memory not possible: send frames)
// or ZPS_EPROTO / ZPS_ERANGE (a header that lies).
zps_err zps_shard_shm_view(zps_shard_shm *t, uint32_t rank, uint64_t range_bytes,
                           zps_dtype dtype, zps_wire_msg *m, char *why, size_t why_len);
// Turns a view into a copy of its own (the mapping may move on while a
// message is held): ZPS_ENOMEM if it cannot. Nothing for frames.
zps_err zps_shard_shm_own(zps_wire_msg *m);
// Ranks whose pushes' pages stay mapped here once read: faulting a page in
// again costs about half as much as reading it (4 ms for 32 MiB on the
// reference machine), paid only where more workers share the host.
#define ZPS_SHARD_SHM_KEEP 2
// Nor are the pages of a segment this small: dropping a push's pages costs
// a TLB shootdown (an interrupt to every core that ran a thread of this
// process; on a VM, an exit to the hypervisor), which for a push of a few
// pages costs more than the pages do. They are the worker's, shared: here
// they cost page-table entries and count in RSS, at most 64 KiB a member
// (ZeroMQ's buffers for a member's two connections took about 70 KiB in
// docs/measurements.md's swarm: 410 MiB at 4096 members).
#define ZPS_SHARD_SHM_KEEP_BYTES ((size_t)64 * 1024)

// Drops the pages of [offset, offset + bytes) of rank's mapping from this
// process (madvise MADV_DONTNEED: the segment keeps its bytes, the worker
// its copy), for ranks from ZPS_SHARD_SHM_KEEP on whose segment is larger
// than ZPS_SHARD_SHM_KEEP_BYTES: once a push is read or
// copied, its pages leave the shard's RSS, so a shard holds a bounded
// number of pushes' pages, not every worker's whole segment. Nothing for
// a span outside the mapping.
void zps_shard_shm_release(zps_shard_shm *t, uint32_t rank, uint64_t offset, uint64_t bytes);
// Whether the parameters for the sender of a push may go through the
// segment of parameters: the push came through shared memory (so the
// sender runs on this host, and the operator allows it) and the sender
// did not ask for frames. The segment of [lo, hi) in elements of esize
// bytes is made at the first such push; if it cannot be (logged once),
// frames.
bool zps_shard_shm_params_offer(zps_shard_shm *t, bool via_shm, bool frames_asked, uint64_t lo,
                                uint64_t hi, size_t esize);
// Bucket b's values [offset, offset + count) in the wire dtype, for
// step, into the segment (if there is one), under the bucket's seqlock.
void zps_shard_shm_params_put(zps_shard_shm *t, int b, uint64_t step, uint64_t offset,
                              uint64_t count, const void *data);
// Names bucket b of step in the segment in h (a PARAMS header with its
// offset and count), if the segment holds those values; false: frames.
bool zps_shard_shm_params_name(zps_shard_shm *t, int b, uint64_t step, Zps__Header *h);
// Names in h (a PARAMS header) the whole range [lo, hi), its n_buckets
// buckets all written for step, with shm_whole set: one notice for them
// all. False, with h untouched, unless every one is in the segment.
bool zps_shard_shm_params_name_all(zps_shard_shm *t, int n_buckets, uint64_t step, uint64_t lo,
                                   uint64_t hi, Zps__Header *h);
// The parameters changed without an update (a restore): nothing in the
// segment is named again before it is written again.
void zps_shard_shm_params_forget(zps_shard_shm *t);
// Whether the creator of a mapped segment is gone (the next sweep unmaps it).
bool zps_shard_shm_gone(const zps_shard_shm *t);
// Unmaps the segments of processes that are gone.
void zps_shard_shm_sweep(zps_shard_shm *t);
// Segments mapped now.
int zps_shard_shm_mapped(const zps_shard_shm *t);

#endif
