/* zps_shm.c - shared-memory segments between a worker and a shard on one
 * host (zps_shm.h). */
#include "zps_shm.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/pidfd.h>
#include <sys/stat.h>
#include <unistd.h>

bool zps_shm_boot_id_ok(const char *v)
{
    size_t len = v ? strlen(v) : 0;
    return len > 0 && len < ZPS_SHM_BOOT_ID_LEN &&
           strspn(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == len;
}

// ZPS_BOOT_ID, if set.
static zps_err s_boot_id_override(const char *v, char out[ZPS_SHM_BOOT_ID_LEN])
{
    if (!zps_shm_boot_id_ok(v)) {
        return ZPS_EINVAL;
    }
    memcpy(out, v, strlen(v) + 1);
    return ZPS_OK;
}

zps_err zps_shm_boot_id(char out[ZPS_SHM_BOOT_ID_LEN])
{
    out[0] = '\0';
    // Hosts emulated on one kernel (network namespaces, tests) each say
    // their own: the processes of one then meet as one host's and no other.
    const char *v = getenv("ZPS_BOOT_ID");
    if (v) {
        return s_boot_id_override(v, out);
    }
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (!f) {
        return ZPS_EIO;
    }
    bool ok = fgets(out, ZPS_SHM_BOOT_ID_LEN, f) != NULL;
    (void)fclose(f);
    out[strcspn(out, "\n")] = '\0';
    return ok && out[0] ? ZPS_OK : ZPS_EIO;
}

// ---------------------------------------------------------------------------
// The creator's side.

zps_err zps_shm_seg_create(zps_shm_seg *seg, size_t size, char *why, size_t why_len)
{
    return zps_shm_seg_create_as(seg, ZPS_SHM_NAME, size, false, why, why_len);
}

zps_err zps_shm_seg_create_as(zps_shm_seg *seg, const char *name, size_t size,
                              bool read_only_to_peers, char *why, size_t why_len)
{
    *seg = (zps_shm_seg){.fd = -1};
    if (size == 0) {
        snprintf(why, why_len, "an empty segment");
        return ZPS_EINVAL;
    }
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        snprintf(why, why_len, "memfd_create: %s", strerror(errno));
        return ZPS_EIO;
    }
    if (ftruncate(fd, (off_t)size) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
        snprintf(why, why_len, "sizing the segment to %zu bytes: %s", size, strerror(errno));
        close(fd);
        return ZPS_EIO;
    }
    void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        snprintf(why, why_len, "mapping %zu bytes: %s", size, strerror(errno));
        close(fd);
        return ZPS_ENOMEM;
    }
    // After the mapping: F_SEAL_FUTURE_WRITE leaves this writable mapping
    // be and refuses every later one, and every write(2).
    int last = (read_only_to_peers ? F_SEAL_FUTURE_WRITE : 0) | F_SEAL_SEAL;
    if (fcntl(fd, F_ADD_SEALS, last) != 0) {
        snprintf(why, why_len, "sealing the segment: %s", strerror(errno));
        (void)munmap(base, size);
        close(fd);
        return ZPS_EIO;
    }
    *seg = (zps_shm_seg){.base = base, .size = size, .fd = fd};
    return ZPS_OK;
}

void zps_shm_seg_fini(zps_shm_seg *seg)
{
    if (seg->base) { // an fd only with a mapping: zeroed memory holds no fd 0
        (void)munmap(seg->base, seg->size);
        close(seg->fd);
    }
    *seg = (zps_shm_seg){.fd = -1};
}

// ---------------------------------------------------------------------------
// The peer's side.

// Opens pid's fd read-only once /proc says it is a zps segment of that name.
static zps_err s_open_peer_fd(const char *name, int64_t pid, int64_t fd, int *out, char *why,
                              size_t why_len)
{
    char path[64];
    char target[128];
    char want[64];
    snprintf(path, sizeof path, "/proc/%lld/fd/%lld", (long long)pid, (long long)fd);
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n < 0) {
        snprintf(why, why_len, "%s: %s", path, strerror(errno));
        return errno == ENOENT ? ZPS_ENOENT : ZPS_EPERM;
    }
    target[n] = '\0';
    snprintf(want, sizeof want, "/memfd:%s ", name);
    if (strncmp(target, want, strlen(want)) != 0) {
        snprintf(why, why_len, "%s is not a zps segment", path);
        return ZPS_EPROTO;
    }
    *out = open(path, O_RDONLY | O_CLOEXEC);
    if (*out < 0) {
        snprintf(why, why_len, "%s: %s", path, strerror(errno));
        return ZPS_EPERM;
    }
    return ZPS_OK;
}

// Checks an opened segment: ours (same user), sealed against shrinking,
// at least size bytes.
static zps_err s_check_peer_fd(int fd, uint64_t size, char *why, size_t why_len)
{
    struct stat st;
    int seals = fcntl(fd, F_GET_SEALS);
    if (fstat(fd, &st) != 0 || seals < 0) {
        snprintf(why, why_len, "not a sealable segment: %s", strerror(errno));
        return ZPS_EPROTO;
    }
    if (st.st_uid != geteuid()) {
        snprintf(why, why_len, "the segment belongs to another user");
        return ZPS_EPERM;
    }
    if (!(seals & F_SEAL_SHRINK)) {
        snprintf(why, why_len, "the segment is not sealed against shrinking");
        return ZPS_EPROTO;
    }
    if (st.st_size < 0 || (uint64_t)st.st_size < size) {
        snprintf(why, why_len, "the segment has %lld bytes, not %llu", (long long)st.st_size,
                 (unsigned long long)size);
        return ZPS_EPROTO;
    }
    return ZPS_OK;
}

zps_err zps_shm_map_open(zps_shm_map *map, int64_t pid, int64_t fd, uint64_t size, char *why,
                         size_t why_len)
{
    return zps_shm_map_open_as(map, ZPS_SHM_NAME, pid, fd, size, why, why_len);
}

zps_err zps_shm_map_open_as(zps_shm_map *map, const char *name, int64_t pid, int64_t fd,
                            uint64_t size, char *why, size_t why_len)
{
    *map = (zps_shm_map){.pidfd = -1};
    if (pid <= 0 || pid > INT32_MAX || fd < 0 || fd > INT32_MAX || size == 0 ||
        size > (uint64_t)SIZE_MAX / 2) {
        snprintf(why, why_len, "pid %lld, fd %lld, %llu bytes: out of range", (long long)pid,
                 (long long)fd, (unsigned long long)size);
        return ZPS_ERANGE;
    }
    // The pidfd first: if pid dies and is reused before /proc is read, the
    // pidfd (of the first process) says so below.
    int pidfd = pidfd_open((pid_t)pid, 0);
    if (pidfd < 0) {
        snprintf(why, why_len, "pidfd_open(%lld): %s", (long long)pid, strerror(errno));
        return ZPS_ENOENT;
    }
    int sfd = -1;
    zps_err err = s_open_peer_fd(name, pid, fd, &sfd, why, why_len);
    if (err == ZPS_OK) {
        err = s_check_peer_fd(sfd, size, why, why_len);
    }
    const void *base = MAP_FAILED;
    if (err == ZPS_OK) {
        base = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, sfd, 0);
        if (base == MAP_FAILED) {
            snprintf(why, why_len, "mapping %llu bytes: %s", (unsigned long long)size,
                     strerror(errno));
            err = ZPS_EIO;
        }
    }
    if (sfd >= 0) {
        close(sfd); // the mapping keeps the memory
    }
    *map = (zps_shm_map){.base = err == ZPS_OK ? base : NULL, .size = (size_t)size,
                         .pid = (int32_t)pid, .fd = (int32_t)fd, .pidfd = pidfd};
    if (err == ZPS_OK && !zps_shm_map_alive(map)) {
        snprintf(why, why_len, "process %lld is gone", (long long)pid);
        err = ZPS_ENOENT;
    }
    if (err != ZPS_OK) {
        if (!map->base) {
            close(pidfd);
        }
        zps_shm_map_fini(map);
    }
    return err;
}

bool zps_shm_map_alive(const zps_shm_map *map)
{
    if (!map->base || map->pidfd < 0) {
        return false;
    }
    struct pollfd p = {.fd = map->pidfd, .events = POLLIN};
    return poll(&p, 1, 0) == 0; // readable (or failing): the process exited
}

void zps_shm_map_fini(zps_shm_map *map)
{
    if (map->base) { // a pidfd only with a mapping: zeroed memory holds no fd 0
        (void)munmap((void *)map->base, map->size);
        close(map->pidfd);
    }
    *map = (zps_shm_map){.pidfd = -1};
}

bool zps_shm_map_is(const zps_shm_map *map, int64_t pid, int64_t fd, uint64_t size)
{
    return map->base && map->pid == pid && map->fd == fd && map->size == size;
}

bool zps_shm_span_ok(uint64_t size, uint64_t offset, uint64_t bytes)
{
    return offset <= size && bytes <= size - offset;
}

bool zps_shm_tensor_ok(uint64_t size, uint64_t offset, uint64_t count, size_t esize)
{
    return count <= UINT64_MAX / esize && zps_shm_span_ok(size, offset, count * esize);
}

// ---------------------------------------------------------------------------
// Parameters under a seqlock per slot.

void zps_shm_params_write(zps_shm_seg *seg, uint32_t slot, uint64_t step, uint64_t offset,
                          uint64_t count, uint64_t data_at, const void *src, size_t bytes)
{
    zps_shm_slot *sl = (zps_shm_slot *)((char *)seg->base + (size_t)slot * ZPS_SHM_SLOT_BYTES);
    uint64_t seq = __atomic_load_n(&sl->seq, __ATOMIC_RELAXED);
    __atomic_store_n(&sl->seq, seq + 1 + (seq & 1), __ATOMIC_RELAXED); // odd
    // The odd seq is visible before any byte below changes.
    __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(&sl->step, step, __ATOMIC_RELAXED);
    __atomic_store_n(&sl->offset, offset, __ATOMIC_RELAXED);
    __atomic_store_n(&sl->count, count, __ATOMIC_RELAXED);
    memcpy((char *)seg->base + data_at, src, bytes);
    seq = __atomic_load_n(&sl->seq, __ATOMIC_RELAXED);
    __atomic_store_n(&sl->seq, seq + 1, __ATOMIC_RELEASE); // even: after every byte
}

zps_err zps_shm_params_peek(const zps_shm_map *map, uint32_t slot, uint64_t step,
                            uint64_t offset, uint64_t count, uint64_t data_at, size_t bytes,
                            const void **src, uint64_t *seq, char *why, size_t why_len)
{
    if (!map->base || slot >= ZPS_SHM_PARAMS_SLOTS || map->size < ZPS_SHM_PARAMS_DATA ||
        data_at < ZPS_SHM_PARAMS_DATA || !zps_shm_span_ok(map->size, data_at, bytes)) {
        snprintf(why, why_len, "slot %u, %zu bytes at %llu: outside the segment of %zu bytes",
                 slot, bytes, (unsigned long long)data_at, map->size);
        return ZPS_ERANGE;
    }
    const zps_shm_slot *sl =
        (const zps_shm_slot *)((const char *)map->base + (size_t)slot * ZPS_SHM_SLOT_BYTES);
    uint64_t s_seq = __atomic_load_n(&sl->seq, __ATOMIC_ACQUIRE);
    uint64_t s_step = __atomic_load_n(&sl->step, __ATOMIC_RELAXED);
    uint64_t s_offset = __atomic_load_n(&sl->offset, __ATOMIC_RELAXED);
    uint64_t s_count = __atomic_load_n(&sl->count, __ATOMIC_RELAXED);
    if ((s_seq & 1) || s_step != step || s_offset != offset || s_count != count) {
        snprintf(why, why_len, "the segment holds [%llu, +%llu) of step %llu%s, not [%llu, "
                 "+%llu) of step %llu", (unsigned long long)s_offset,
                 (unsigned long long)s_count, (unsigned long long)s_step,
                 s_seq & 1 ? " (being written)" : "", (unsigned long long)offset,
                 (unsigned long long)count, (unsigned long long)step);
        return ZPS_ESTALE;
    }
    *src = (const char *)map->base + data_at;
    *seq = s_seq;
    return ZPS_OK;
}

bool zps_shm_params_still(const zps_shm_map *map, uint32_t slot, uint64_t seq)
{
    const zps_shm_slot *sl =
        (const zps_shm_slot *)((const char *)map->base + (size_t)slot * ZPS_SHM_SLOT_BYTES);
    // Every byte the caller read is read before seq is read again.
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return __atomic_load_n(&sl->seq, __ATOMIC_RELAXED) == seq;
}

zps_err zps_shm_params_read(const zps_shm_map *map, uint32_t slot, uint64_t step,
                            uint64_t offset, uint64_t count, uint64_t data_at, size_t bytes,
                            void *dst, char *why, size_t why_len)
{
    const void *src;
    uint64_t seq;
    zps_err err = zps_shm_params_peek(map, slot, step, offset, count, data_at, bytes, &src, &seq,
                                      why, why_len);
    if (err != ZPS_OK) {
        return err;
    }
    memcpy(dst, src, bytes);
    if (!zps_shm_params_still(map, slot, seq)) {
        snprintf(why, why_len, "step %llu's values were written again while read",
                 (unsigned long long)step);
        return ZPS_ESTALE;
    }
    return ZPS_OK;
}
