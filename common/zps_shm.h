/* zps_shm.h - shared-memory segments between a worker and a shard on one
 * host (docs/choices.md, "Same-host shared memory").
 *
 * A segment is an anonymous memfd ("memfd:zps-push"): no name ever exists
 * in /dev/shm or elsewhere, so nothing can be left behind. Its creator (the
 * worker) keeps the fd open and says on the wire which pid and fd it is;
 * the peer (the shard) opens /proc/<pid>/fd/<fd>, which the kernel allows
 * only to the same user, checks that it is such a segment, sealed against
 * shrinking (so a mapping never faults past the end of its file, whatever
 * the creator does later), maps it read-only and closes the fd. The memory
 * is gone once both processes unmapped it: the creator on exit, however it
 * exits, the peer when its pidfd says the creator is gone.
 *
 * Nothing here trusts the peer: every failure is a zps_err with a reason. */
#ifndef ZPS_SHM_H
#define ZPS_SHM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zps_err.h"

#define ZPS_SHM_NAME "zps-push"   // the memfd's name, as /proc/<pid>/maps shows it
#define ZPS_SHM_PARAMS_NAME "zps-params" // a shard's segment of parameters (below)
#define ZPS_SHM_BOOT_ID_LEN 40     // a boot id (36 characters) and its NUL

// A segment this process created: writable, its fd kept open for the peer.
typedef struct zps_shm_seg {
    void *base;  // owned: the mapping, NULL if none
    size_t size; // its bytes
    int fd;      // owned: the memfd, -1 if none
} zps_shm_seg;

// A peer's segment mapped here, read-only, with the peer's liveness.
typedef struct zps_shm_map {
    const void *base; // owned: the mapping, NULL if none
    size_t size;      // its bytes
    int32_t pid;      // the creator, as it named itself
    int32_t fd;       // its fd there
    int pidfd;        // owned: readable once the creator exited, -1 if none
} zps_shm_map;

// This host's boot id (/proc/sys/kernel/random/boot_id): two processes
// with the same one run on one kernel. ZPS_EIO if it cannot be read.
// ZPS_BOOT_ID, when set, is taken instead (hosts emulated on one kernel:
// network namespaces, tests); ZPS_EINVAL and "" if it is not 1 to 39 of
// [A-Za-z0-9._-].
zps_err zps_shm_boot_id(char out[ZPS_SHM_BOOT_ID_LEN]);
// Whether v is a boot id as zps takes one from a peer or ZPS_BOOT_ID: 1 to
// ZPS_SHM_BOOT_ID_LEN - 1 of [A-Za-z0-9._-] (a kernel's is 36 of them).
bool zps_shm_boot_id_ok(const char *v);

// Creates a segment of size bytes (> 0), zeroed, sealed against resizing.
// ZPS_EIO or ZPS_ENOMEM on failure, with the reason in why; *seg is then
// empty (safe to zps_shm_seg_fini).
zps_err zps_shm_seg_create(zps_shm_seg *seg, size_t size, char *why, size_t why_len);
// The same for a segment named name (ZPS_SHM_NAME or ZPS_SHM_PARAMS_NAME);
// read_only_to_peers adds F_SEAL_FUTURE_WRITE once this process mapped it
// writable, so no peer can ever map it writable or write to it.
zps_err zps_shm_seg_create_as(zps_shm_seg *seg, const char *name, size_t size,
                              bool read_only_to_peers, char *why, size_t why_len);
// Unmaps and closes; safe on zeroed memory and twice.
void zps_shm_seg_fini(zps_shm_seg *seg);

// Maps the segment of size bytes that process pid holds as fd. Refused,
// with the reason in why and *map empty: a pid or fd out of range, a
// process that is gone, /proc refusing (another user, no such fd), an fd
// that is not a zps segment, not sealed against shrinking, or smaller than
// size (ZPS_EPERM, ZPS_ENOENT, ZPS_EPROTO or ZPS_EIO).
zps_err zps_shm_map_open(zps_shm_map *map, int64_t pid, int64_t fd, uint64_t size, char *why,
                         size_t why_len);
// The same for a segment named name.
zps_err zps_shm_map_open_as(zps_shm_map *map, const char *name, int64_t pid, int64_t fd,
                            uint64_t size, char *why, size_t why_len);
// Whether the creator of a mapped segment still runs (never waits).
bool zps_shm_map_alive(const zps_shm_map *map);
// Unmaps and closes; safe on zeroed memory and twice.
void zps_shm_map_fini(zps_shm_map *map);
// Whether map is the mapping of that pid's fd of that size.
bool zps_shm_map_is(const zps_shm_map *map, int64_t pid, int64_t fd, uint64_t size);

// Whether [offset, offset + bytes) lies inside a mapping of size bytes
// (without overflowing, whatever the values).
bool zps_shm_span_ok(uint64_t size, uint64_t offset, uint64_t bytes);
// The same for a tensor of count elements of esize bytes (> 0) at offset,
// a count too large to have a byte length included.
bool zps_shm_tensor_ok(uint64_t size, uint64_t offset, uint64_t count, size_t esize);

// ---------------------------------------------------------------------------
// A shard's parameters for the workers of its host (docs/choices.md, "One
// pull per host"): ZPS_SHM_PARAMS_SLOTS slots of ZPS_SHM_SLOT_BYTES, one
// per bucket of its range, then the range's values in the wire dtype from
// byte ZPS_SHM_PARAMS_DATA on. Each slot is a seqlock over its bucket: seq
// is odd while the shard writes, and grows by 2 with every write, so a
// reader that saw the same even seq before and after its copy, and the
// step, offset and count it expected, copied one step's values whole.

#define ZPS_SHM_PARAMS_SLOTS 256 // as many as a range has buckets at most
#define ZPS_SHM_SLOT_BYTES 64    // one cache line each: a write stays off the neighbours
#define ZPS_SHM_PARAMS_DATA ((uint64_t)ZPS_SHM_PARAMS_SLOTS * ZPS_SHM_SLOT_BYTES)

// Where the seqlock of a slot lives: written only by the segment's creator.
typedef struct zps_shm_slot {
    uint64_t seq;    // odd: being written
    uint64_t step;   // the step the values are for
    uint64_t offset; // the bucket's first element, as on the wire
    uint64_t count;  // its elements
} zps_shm_slot;

// Writes bytes of src at byte data_at of seg (the creator's, writable) as
// slot's bucket [offset, offset + count) for step. The caller keeps slot
// below ZPS_SHM_PARAMS_SLOTS and the span inside the segment (its own).
void zps_shm_params_write(zps_shm_seg *seg, uint32_t slot, uint64_t step, uint64_t offset,
                          uint64_t count, uint64_t data_at, const void *src, size_t bytes);
// Copies bytes at data_at of a peer's parameters into dst, if slot holds
// bucket [offset, offset + count) of step, whole. Everything is checked:
// ZPS_ERANGE for a slot or span outside the mapping, ZPS_ESTALE for
// values of another step or bucket, or written while they were copied
// (dst then holds nothing of use); the reason in why.
zps_err zps_shm_params_read(const zps_shm_map *map, uint32_t slot, uint64_t step,
                            uint64_t offset, uint64_t count, uint64_t data_at, size_t bytes,
                            void *dst, char *why, size_t why_len);

// The values of slot in a peer's parameters, read in place: *src is where
// its bytes at data_at lie in the mapping, if the slot holds bucket
// [offset, offset + count) of step and is not being written; the checks
// and errors are zps_shm_params_read's. *seq goes to zps_shm_params_still
// once the caller read them: only then are they known to be whole.
zps_err zps_shm_params_peek(const zps_shm_map *map, uint32_t slot, uint64_t step,
                            uint64_t offset, uint64_t count, uint64_t data_at, size_t bytes,
                            const void **src, uint64_t *seq, char *why, size_t why_len);
// Whether slot was not written since zps_shm_params_peek gave seq: what was
// read from its *src since is one step's values, whole.
bool zps_shm_params_still(const zps_shm_map *map, uint32_t slot, uint64_t seq);

#endif
