/* zps_ckpt.c - shard checkpoint files (format in zps_ckpt.h): the one
 * writer and reader of the format, the server's and libzps's
 * (zps_checkpoint_open, lib/zps_checkpoint.c).
 *
 * Writes go through zps_atomic (a temporary file in the target directory,
 * fsynced, renamed over the final name, the directory fsynced), so after a crash
 * a name either is absent or names a complete file. The CRC still matters:
 * it catches what rename cannot (a disk or copy that tears or flips bytes),
 * and a reader that finds a bad newest file falls back to the previous one.
 *
 * A shard's range can be 25M floats, so nothing is buffered whole: the
 * caller's arrays are written and read in chunks and the CRC is updated per
 * chunk (zlib's crc32 takes a uInt length). */
#include "zps_ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "common/zps_atomic.h"
#include "common/zps_log.h"

// The float arrays go to disk as they lie in memory; the header is encoded
// explicitly, but the payload relies on the host order (as the wire does).
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "zps checkpoints store fp32 arrays little-endian: a little-endian host is required"
#endif

#define CKPT_MAGIC "ZPSCKPT1"
#define CKPT_MAGIC_LEN 8
#define CKPT_VERSION_SGD 1u   // SGD: the format of the builds before Adam
#define CKPT_VERSION_ADAM 2u  // Adam, AdamW: the optimizer and its step count added
#define CKPT_HEADER_LEN 64    // version 1; version 2 adds CKPT_HEADER_EXTRA
#define CKPT_HEADER_EXTRA 16
#define CKPT_HEADER_MAX (CKPT_HEADER_LEN + CKPT_HEADER_EXTRA)
#define CKPT_CRC_LEN 4
#define CKPT_CHUNK ((size_t)8 << 20) // bytes per write/read/crc32 call
#define CKPT_WHY_LEN 256

// ---------------------------------------------------------------- encoding

static void s_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static void s_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static uint32_t s_get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) {
        v = (v << 8) | p[i];
    }
    return v;
}

static uint64_t s_get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) {
        v = (v << 8) | p[i];
    }
    return v;
}

// Header layout: magic[8], version u32, shard u32, shards u32, optimizer
// u32 (version 1: reserved, zero), lo, hi, step, job_seed, model_hash (u64
// each): 64 bytes; version 2 goes on with optim_step u64 and a reserved u64
// (zero): 80 bytes. Returns the header's length.
static size_t s_encode_header(uint8_t *h, const zps_ckpt_meta *m)
{
    bool sgd = m->optim == ZPS_OPTIM_SGD;
    // The magic is 8 bytes of a fixed-width field, without its NUL.
    memcpy(h, CKPT_MAGIC, CKPT_MAGIC_LEN); // NOLINT(bugprone-not-null-terminated-result)
    s_put32(h + 8, sgd ? CKPT_VERSION_SGD : CKPT_VERSION_ADAM);
    s_put32(h + 12, m->shard);
    s_put32(h + 16, m->shards);
    s_put32(h + 20, sgd ? 0 : (uint32_t)m->optim);
    s_put64(h + 24, m->lo);
    s_put64(h + 32, m->hi);
    s_put64(h + 40, m->step);
    s_put64(h + 48, m->job_seed);
    s_put64(h + 56, m->model_hash);
    if (sgd) {
        return CKPT_HEADER_LEN;
    }
    s_put64(h + 64, m->optim_step);
    s_put64(h + 72, 0);
    return CKPT_HEADER_MAX;
}

// The first CKPT_HEADER_LEN bytes; a version 2 file's optimizer step count
// comes from s_decode_extra.
static void s_decode_header(const uint8_t *h, uint32_t *version, zps_ckpt_meta *m)
{
    *version = s_get32(h + 8);
    m->shard = s_get32(h + 12);
    m->shards = s_get32(h + 16);
    m->optim = *version == CKPT_VERSION_SGD ? ZPS_OPTIM_SGD : (zps_optim_kind)s_get32(h + 20);
    m->lo = s_get64(h + 24);
    m->hi = s_get64(h + 32);
    m->step = s_get64(h + 40);
    m->job_seed = s_get64(h + 48);
    m->model_hash = s_get64(h + 56);
    // SGD applies one update per step: its count is the step.
    m->optim_step = m->step;
}

static void s_decode_extra(const uint8_t *h, zps_ckpt_meta *m)
{
    m->optim_step = s_get64(h + 64);
}

static uint32_t s_crc(uint32_t crc, const uint8_t *p, size_t len)
{
    while (len > 0) {
        uInt n = len > CKPT_CHUNK ? (uInt)CKPT_CHUNK : (uInt)len;
        crc = (uint32_t)crc32(crc, p, n);
        p += n;
        len -= n;
    }
    return crc;
}

// ---------------------------------------------------------------- names

// <dir>/shard-<I>-step-<T>.ckpt; false (logged) if it does not fit.
static bool s_path(char *out, size_t out_len, const char *dir, uint32_t shard, uint64_t step)
{
    int n = snprintf(out, out_len, "%s/shard-%" PRIu32 "-step-%" PRIu64 ".ckpt", dir, shard, step);
    if (n < 0 || (size_t)n >= out_len) {
        zps_log_error("ckpt %s: path too long", dir);
        return false;
    }
    return true;
}

// Parses a canonical decimal (no sign, no leading zero) up to max; advances *p.
static bool s_parse_dec(const char **p, uint64_t max, uint64_t *out)
{
    const char *s = *p;
    if (*s < '0' || *s > '9' || (s[0] == '0' && s[1] >= '0' && s[1] <= '9')) {
        return false;
    }
    uint64_t v = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        uint64_t d = (uint64_t)(*s - '0');
        if (v > (max - d) / 10) {
            return false;
        }
        v = v * 10 + d;
    }
    *p = s;
    *out = v;
    return true;
}

// True if name is exactly a checkpoint name; only the canonical spelling
// counts, so one step never has two files, and temporaries never match.
static bool s_parse_name(const char *name, uint32_t *shard, uint64_t *step)
{
    uint64_t sh;
    if (strncmp(name, "shard-", 6) != 0) {
        return false;
    }
    name += 6;
    if (!s_parse_dec(&name, UINT32_MAX, &sh) || strncmp(name, "-step-", 6) != 0) {
        return false;
    }
    name += 6;
    if (!s_parse_dec(&name, UINT64_MAX, step) || strcmp(name, ".ckpt") != 0) {
        return false;
    }
    *shard = (uint32_t)sh;
    return true;
}

static int s_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

// The steps of shard's checkpoints in dir, ascending. Caller owns *out
// (NULL when *n is 0). A missing dir holds none.
static zps_err s_list(const char *dir, uint32_t shard, uint64_t **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (d == NULL) {
        if (errno == ENOENT) {
            return ZPS_OK;
        }
        zps_log_error("ckpt %s: opendir: %s", dir, strerror(errno));
        return ZPS_EIO;
    }
    zps_err err = ZPS_OK;
    uint64_t *steps = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        errno = 0;
        struct dirent *e = readdir(d);
        if (e == NULL) {
            if (errno != 0) {
                zps_log_error("ckpt %s: readdir: %s", dir, strerror(errno));
                err = ZPS_EIO;
            }
            break;
        }
        uint32_t sh;
        uint64_t step;
        if (!s_parse_name(e->d_name, &sh, &step) || sh != shard) {
            continue;
        }
        if (len == cap) {
            size_t ncap = cap ? 2 * cap : 16;
            uint64_t *grown = realloc(steps, ncap * sizeof *steps);
            if (grown == NULL) {
                zps_log_error("ckpt %s: out of memory listing checkpoints", dir);
                err = ZPS_ENOMEM;
                break;
            }
            steps = grown;
            cap = ncap;
        }
        steps[len++] = step;
    }
    closedir(d);
    if (err != ZPS_OK) {
        free(steps);
        return err;
    }
    if (len > 1) { // steps is NULL when there is none: qsort(NULL, ...) is undefined
        qsort(steps, len, sizeof *steps, s_cmp_u64);
    }
    *out = steps;
    *n = len;
    return ZPS_OK;
}

// ---------------------------------------------------------------- write

// mkdir -p, so a fresh --checkpoint-dir works without a setup step.
static zps_err s_mkdir_p(const char *dir)
{
    char buf[PATH_MAX];
    int len = snprintf(buf, sizeof buf, "%s", dir);
    if (len <= 0 || (size_t)len >= sizeof buf) {
        zps_log_error("ckpt '%s': empty or too long a directory name", dir);
        return ZPS_EIO;
    }
    // Each prefix ending before a '/' (and the whole path) is made in turn.
    for (char *p = buf + 1;; p++) {
        bool last = *p == '\0';
        if (*p != '/' && !last) {
            continue;
        }
        *p = '\0';
        struct stat st;
        if (mkdir(buf, 0755) != 0) {
            int e = errno;
            if (e != EEXIST) {
                zps_log_error("ckpt %s: mkdir %s: %s", dir, buf, strerror(e));
                return ZPS_EIO;
            }
            if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode)) {
                zps_log_error("ckpt %s: %s exists and is not a directory", dir, buf);
                return ZPS_EIO;
            }
        }
        if (last) {
            return ZPS_OK;
        }
        *p = '/';
    }
}

// Writes len bytes, retrying interrupted and short writes, and adds them to
// *crc unless crc is NULL.
static zps_err s_write_all(int fd, const void *buf, size_t len, uint32_t *crc, const char *path)
{
    const uint8_t *p = buf;
    while (len > 0) {
        size_t n = len > CKPT_CHUNK ? CKPT_CHUNK : len;
        if (crc != NULL) {
            *crc = s_crc(*crc, p, n);
        }
        size_t done = 0;
        while (done < n) {
            ssize_t w = write(fd, p + done, n - done);
            if (w < 0 && errno == EINTR) {
                continue;
            }
            if (w < 0) {
                zps_log_error("ckpt %s: write: %s", path, strerror(errno));
                return ZPS_EIO;
            }
            done += (size_t)w;
        }
        p += n;
        len -= n;
    }
    return ZPS_OK;
}

// Removes this shard's temporaries left by a writer that crashed mid-write
// (each as large as a checkpoint). Only one process writes a shard, and it
// is here, so none of them is in use.
static void s_remove_stale_temps(const char *dir, uint32_t shard)
{
    char prefix[32];
    snprintf(prefix, sizeof prefix, ".shard-%" PRIu32 "-step-", shard);
    size_t prefix_len = strlen(prefix);
    DIR *d = opendir(dir);
    if (d == NULL) {
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, prefix_len) != 0 ||
            strstr(e->d_name, ".ckpt.tmp.") == NULL) {
            continue;
        }
        if (unlinkat(dirfd(d), e->d_name, 0) == 0) {
            zps_log_info("ckpt %s/%s: removed a stale temporary", dir, e->d_name);
        } else if (errno != ENOENT) {
            zps_log_warn("ckpt %s/%s: removing a stale temporary: %s", dir, e->d_name,
                         strerror(errno));
        }
    }
    closedir(d);
}

// Deletes shard's checkpoints of steps before `step` beyond the newest keep
// (counting `step`). Later steps are left: they belong to a timeline that
// was rolled back and will be rewritten by the replay.
static void s_prune(const char *dir, uint32_t shard, uint64_t step, int keep)
{
    uint64_t *steps;
    size_t n;
    if (s_list(dir, shard, &steps, &n) != ZPS_OK) {
        zps_log_warn("ckpt %s: old checkpoints of shard %" PRIu32 " not pruned", dir, shard);
        return;
    }
    int kept = 0;
    for (size_t i = n; i-- > 0;) {
        if (steps[i] > step) {
            continue;
        }
        if (kept < keep) {
            kept++;
            continue;
        }
        char path[PATH_MAX];
        if (s_path(path, sizeof path, dir, shard, steps[i]) && unlink(path) != 0 &&
            errno != ENOENT) {
            zps_log_warn("ckpt %s: deleting an old checkpoint: %s", path, strerror(errno));
        }
    }
    free(steps);
}

// Ends a write begun in a (err: how it went so far): the CRC trailer, then
// zps_atomic_commit (fsync, rename over the checkpoint, directory synced; a
// failure removes the temporary).
static zps_err s_commit(zps_atomic *a, zps_err err, uint32_t crc)
{
    if (err == ZPS_OK) {
        uint8_t tail[CKPT_CRC_LEN];
        s_put32(tail, crc);
        err = s_write_all(a->fd, tail, sizeof tail, NULL, a->tmp);
    }
    return zps_atomic_commit(a, err);
}

zps_err zps_ckpt_write(const char *dir, const zps_ckpt_meta *meta, const float *params,
                       const float *state, int keep)
{
    ZPS_ASSERT(dir != NULL && meta != NULL && keep >= 1);
    ZPS_ASSERT(meta->shard < meta->shards && meta->lo <= meta->hi);
    ZPS_ASSERT(meta->optim == ZPS_OPTIM_SGD || meta->optim == ZPS_OPTIM_ADAM ||
               meta->optim == ZPS_OPTIM_ADAMW);
    uint64_t n = meta->hi - meta->lo;
    ZPS_ASSERT(n <= (SIZE_MAX - CKPT_HEADER_MAX - CKPT_CRC_LEN) / (3 * sizeof(float)));
    ZPS_ASSERT(n == 0 || (params != NULL && state != NULL));

    char path[PATH_MAX];
    if (s_mkdir_p(dir) != ZPS_OK || !s_path(path, sizeof path, dir, meta->shard, meta->step)) {
        return ZPS_EIO;
    }
    // zps_atomic's temporary is a dot name in the same directory
    // (".shard-S-step-N.ckpt.tmp.*"): the rename stays within one file
    // system, listings (s_parse_name) never mistake it for a checkpoint, and
    // s_remove_stale_temps knows it.
    s_remove_stale_temps(dir, meta->shard);
    zps_atomic a;
    if (zps_atomic_begin(&a, path, 0644) != ZPS_OK) {
        return ZPS_EIO;
    }
    (void)fchmod(a.fd, 0644); // operators read it whatever the umask; best effort

    uint8_t header[CKPT_HEADER_MAX];
    size_t header_len = s_encode_header(header, meta);
    uint32_t crc = (uint32_t)crc32(0L, Z_NULL, 0);
    size_t bytes = (size_t)n * sizeof(float);
    zps_err err = s_write_all(a.fd, header, header_len, &crc, a.tmp);
    if (err == ZPS_OK) {
        err = s_write_all(a.fd, params, bytes, &crc, a.tmp);
    }
    if (err == ZPS_OK) {
        err = s_write_all(a.fd, state, (size_t)zps_optim_state_floats(meta->optim) * bytes, &crc,
                          a.tmp);
    }
    err = s_commit(&a, err, crc);
    if (err != ZPS_OK) {
        return err;
    }
    zps_log_debug("ckpt %s: written (%" PRIu64 " floats)", path, n);
    s_prune(dir, meta->shard, meta->step, keep);
    return ZPS_OK;
}

// ---------------------------------------------------------------- load

// Reads up to len bytes, retrying interrupted and short reads; *got is how
// many before end of file. -1 with errno on an error.
static int s_read_full(int fd, void *buf, size_t len, size_t *got)
{
    uint8_t *p = buf;
    *got = 0;
    while (*got < len) {
        ssize_t r = read(fd, p + *got, len - *got);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0) {
            return -1;
        }
        if (r == 0) {
            break;
        }
        *got += (size_t)r;
    }
    return 0;
}

// Reads len bytes of payload into dst, chunk by chunk, adding them to *crc.
// With a scratch dst (advance false) every chunk lands at dst, so a file of
// an unexpected size can still be checksummed without the caller's arrays.
static zps_err s_read_payload(int fd, uint8_t *dst, bool advance, size_t len, uint32_t *crc,
                              char *why, size_t why_len)
{
    while (len > 0) {
        size_t n = len > CKPT_CHUNK ? CKPT_CHUNK : len;
        size_t got;
        if (s_read_full(fd, dst, n, &got) != 0) {
            snprintf(why, why_len, "read: %s", strerror(errno));
            return ZPS_EIO;
        }
        if (got < n) {
            snprintf(why, why_len, "truncated (shrank while being read)");
            return ZPS_EPROTO;
        }
        *crc = s_crc(*crc, dst, n);
        if (advance) {
            dst += n;
        }
        len -= n;
    }
    return ZPS_OK;
}

// Why the header's meta does not match what the caller expects, or "".
static void s_mismatch(const zps_ckpt_meta *got, const zps_ckpt_meta *want, uint64_t step,
                       char *why, size_t why_len)
{
    why[0] = '\0';
    if (got->shard != want->shard || got->shards != want->shards) {
        snprintf(why, why_len, "written for shard %" PRIu32 " of %" PRIu32
                               ", expected shard %" PRIu32 " of %" PRIu32,
                 got->shard, got->shards, want->shard, want->shards);
    } else if (got->lo != want->lo || got->hi != want->hi) {
        snprintf(why, why_len, "covers [%" PRIu64 ", %" PRIu64 "), expected [%" PRIu64
                               ", %" PRIu64 ")",
                 got->lo, got->hi, want->lo, want->hi);
    } else if (got->step != step) {
        snprintf(why, why_len, "holds step %" PRIu64 " though its name says %" PRIu64,
                 got->step, step);
    } else if (got->job_seed != want->job_seed) {
        snprintf(why, why_len, "written for job seed %" PRIu64 ", expected %" PRIu64,
                 got->job_seed, want->job_seed);
    } else if (got->model_hash != want->model_hash) {
        snprintf(why, why_len, "written for model hash %016" PRIx64 ", expected %016" PRIx64,
                 got->model_hash, want->model_hash);
    } else if (got->optim != want->optim) {
        snprintf(why, why_len, "holds the state of optimizer %s, this shard runs %s",
                 zps_optim_name(got->optim), zps_optim_name(want->optim));
    }
}

// Reads and checks the header of the file open at fd (a regular file):
// its magic, format version and, for Adam's format, its extra fields.
// *header_len: the bytes it takes, which the checksum covers.
static zps_err s_read_header(int fd, uint8_t *header, size_t *header_len, zps_ckpt_meta *meta,
                             char *why, size_t why_len)
{
    size_t got;
    if (s_read_full(fd, header, CKPT_HEADER_LEN, &got) != 0) {
        snprintf(why, why_len, "read: %s", strerror(errno));
        return ZPS_EIO;
    }
    if (got < CKPT_HEADER_LEN) {
        snprintf(why, why_len, "truncated (%zu bytes, shorter than the header)", got);
        return ZPS_EPROTO;
    }
    if (memcmp(header, CKPT_MAGIC, CKPT_MAGIC_LEN) != 0) {
        snprintf(why, why_len, "not a zps checkpoint (bad magic)");
        return ZPS_EPROTO;
    }
    uint32_t version;
    s_decode_header(header, &version, meta);
    *header_len = CKPT_HEADER_LEN;
    if (version != CKPT_VERSION_SGD && version != CKPT_VERSION_ADAM) {
        snprintf(why, why_len, "format version %" PRIu32 ", this build reads %u and %u", version,
                 CKPT_VERSION_SGD, CKPT_VERSION_ADAM);
        return ZPS_EPROTO;
    }
    if (version == CKPT_VERSION_SGD) {
        return ZPS_OK;
    }
    if (meta->optim != ZPS_OPTIM_ADAM && meta->optim != ZPS_OPTIM_ADAMW) {
        snprintf(why, why_len, "corrupt header (format version 2 with optimizer %u)",
                 (unsigned)meta->optim);
        return ZPS_EPROTO;
    }
    if (s_read_full(fd, header + CKPT_HEADER_LEN, CKPT_HEADER_EXTRA, &got) != 0) {
        snprintf(why, why_len, "read: %s", strerror(errno));
        return ZPS_EIO;
    }
    if (got < CKPT_HEADER_EXTRA) {
        snprintf(why, why_len, "truncated (%zu bytes, shorter than the header)",
                 CKPT_HEADER_LEN + got);
        return ZPS_EPROTO;
    }
    s_decode_extra(header, meta);
    *header_len = CKPT_HEADER_MAX;
    return ZPS_OK;
}

// Whether a file of `size` bytes holds exactly what its header says: the
// range's parameters and the optimizer's state (per floats an element).
static zps_err s_check_size(const zps_ckpt_meta *meta, uint64_t per, size_t header_len,
                            long long size, char *why, size_t why_len)
{
    const uint64_t max_n = (uint64_t)(INT64_MAX - CKPT_HEADER_MAX - CKPT_CRC_LEN) / (4 * per);
    if (meta->hi < meta->lo || meta->hi - meta->lo > max_n) {
        snprintf(why, why_len, "corrupt header (range [%" PRIu64 ", %" PRIu64 "))", meta->lo,
                 meta->hi);
        return ZPS_EPROTO;
    }
    uint64_t want_size = header_len + 4 * per * (meta->hi - meta->lo) + CKPT_CRC_LEN;
    if ((uint64_t)size < want_size) {
        snprintf(why, why_len, "truncated (%lld of %" PRIu64 " bytes)", size, want_size);
        return ZPS_EPROTO;
    }
    if ((uint64_t)size > want_size) {
        snprintf(why, why_len, "%lld bytes, expected %" PRIu64 " (trailing data)", size,
                 want_size);
        return ZPS_EPROTO;
    }
    return ZPS_OK;
}

// Reads the payload, into params and state when it is what `want` asks
// for, and through a scratch buffer otherwise (another range or another
// optimizer's state: still checksummed, to tell damage from a mismatch);
// *crc goes on over it.
static zps_err s_read_body(int fd, const zps_ckpt_meta *meta, const zps_ckpt_meta *want,
                           uint64_t per, float *params, float *state, uint32_t *crc, char *why,
                           size_t why_len)
{
    uint64_t n = meta->hi - meta->lo;
    size_t bytes = (size_t)n * sizeof(float);
    if (n == want->hi - want->lo && meta->optim == want->optim) {
        zps_err err = s_read_payload(fd, (uint8_t *)params, true, bytes, crc, why, why_len);
        return err != ZPS_OK ? err : s_read_payload(fd, (uint8_t *)state, true,
                                                    (size_t)(per - 1) * bytes, crc, why, why_len);
    }
    size_t total = (size_t)per * bytes;
    size_t scratch_len = total < CKPT_CHUNK ? total : CKPT_CHUNK;
    uint8_t *scratch = malloc(scratch_len ? scratch_len : 1);
    if (scratch == NULL) {
        snprintf(why, why_len, "out of memory");
        return ZPS_ENOMEM;
    }
    zps_err err = s_read_payload(fd, scratch, false, total, crc, why, why_len);
    free(scratch);
    return err;
}

// Reads the stored checksum and compares it with crc.
static zps_err s_check_tail(int fd, uint32_t crc, char *why, size_t why_len)
{
    uint8_t tail[CKPT_CRC_LEN];
    size_t got;
    if (s_read_full(fd, tail, sizeof tail, &got) != 0) {
        snprintf(why, why_len, "read: %s", strerror(errno));
        return ZPS_EIO;
    }
    if (got < sizeof tail) {
        snprintf(why, why_len, "truncated (shrank while being read)");
        return ZPS_EPROTO;
    }
    if (s_get32(tail) != crc) {
        snprintf(why, why_len, "checksum mismatch (stored %08" PRIx32 ", computed %08" PRIx32 ")",
                 s_get32(tail), crc);
        return ZPS_EPROTO;
    }
    return ZPS_OK;
}

// Checks the file open at fd and loads it (see s_load_file).
static zps_err s_load_fd(int fd, const zps_ckpt_meta *want, uint64_t step, float *params,
                         float *state, uint64_t *optim_step, char *why, size_t why_len)
{
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(why, why_len, "fstat: %s", strerror(errno));
        return ZPS_EIO;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(why, why_len, "not a regular file");
        return ZPS_EPROTO;
    }
    uint8_t header[CKPT_HEADER_MAX];
    size_t header_len = 0;
    zps_ckpt_meta meta = {0};
    zps_err err = s_read_header(fd, header, &header_len, &meta, why, why_len);
    if (err != ZPS_OK) {
        return err;
    }
    // Floats per element: the parameter and the optimizer's state.
    const uint64_t per = 1 + (uint64_t)zps_optim_state_floats(meta.optim);
    if ((err = s_check_size(&meta, per, header_len, (long long)st.st_size, why, why_len)) !=
        ZPS_OK) {
        return err;
    }
    uint32_t crc = s_crc((uint32_t)crc32(0L, Z_NULL, 0), header, header_len);
    if ((err = s_read_body(fd, &meta, want, per, params, state, &crc, why, why_len)) != ZPS_OK ||
        (err = s_check_tail(fd, crc, why, why_len)) != ZPS_OK) {
        return err;
    }
    s_mismatch(&meta, want, step, why, why_len);
    if (why[0] != '\0') {
        return ZPS_EPROTO;
    }
    if (optim_step != NULL) {
        *optim_step = meta.optim_step;
    }
    return ZPS_OK;
}

// Checks the file at path and loads it; on failure why says what is wrong
// and nothing is logged (the caller knows whether it is fatal or a fallback).
// The checksum is verified before the meta, so a damaged header is reported
// as damage rather than as another shard's file.
static zps_err s_load_file(const char *path, const zps_ckpt_meta *want, uint64_t step,
                           float *params, float *state, uint64_t *optim_step, char *why,
                           size_t why_len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        snprintf(why, why_len, "%s", strerror(e));
        return e == ENOENT ? ZPS_ENOENT : ZPS_EIO;
    }
    zps_err err = s_load_fd(fd, want, step, params, state, optim_step, why, why_len);
    close(fd);
    return err;
}

zps_err zps_ckpt_load(const char *dir, const zps_ckpt_meta *want, uint64_t step, float *params,
                      float *state, uint64_t *optim_step)
{
    ZPS_ASSERT(dir != NULL && want != NULL && want->lo <= want->hi);
    ZPS_ASSERT(want->hi == want->lo || (params != NULL && state != NULL));
    char path[PATH_MAX], why[CKPT_WHY_LEN];
    if (!s_path(path, sizeof path, dir, want->shard, step)) {
        return ZPS_EIO;
    }
    zps_err err = s_load_file(path, want, step, params, state, optim_step, why, sizeof why);
    if (err == ZPS_ENOENT) {
        zps_log_warn("ckpt %s: no such checkpoint", path);
    } else if (err != ZPS_OK) {
        zps_log_error("ckpt %s: %s", path, why);
    }
    return err;
}

zps_err zps_ckpt_load_newest(const char *dir, const zps_ckpt_meta *want, uint64_t *step,
                             float *params, float *state, uint64_t *optim_step)
{
    ZPS_ASSERT(dir != NULL && want != NULL && step != NULL && want->lo <= want->hi);
    ZPS_ASSERT(want->hi == want->lo || (params != NULL && state != NULL));
    uint64_t *steps;
    size_t n;
    zps_err err = s_list(dir, want->shard, &steps, &n);
    if (err != ZPS_OK) {
        return err;
    }
    err = ZPS_ENOENT;
    for (size_t i = n; i-- > 0;) {
        char path[PATH_MAX], why[CKPT_WHY_LEN];
        if (!s_path(path, sizeof path, dir, want->shard, steps[i])) {
            continue;
        }
        zps_err e = s_load_file(path, want, steps[i], params, state, optim_step, why,
                                sizeof why);
        if (e == ZPS_OK) {
            zps_log_info("ckpt %s: loaded step %" PRIu64, path, steps[i]);
            *step = steps[i];
            err = ZPS_OK;
            break;
        }
        if (e == ZPS_ENOMEM) {
            zps_log_error("ckpt %s: %s", path, why);
            err = e;
            break;
        }
        zps_log_warn("ckpt %s: %s; %s", path, why,
                     i > 0 ? "trying the previous checkpoint" : "no older checkpoint left");
    }
    if (err == ZPS_ENOENT) {
        zps_log_warn("ckpt %s: no valid checkpoint of shard %" PRIu32 " (%zu found)", dir,
                     want->shard, n);
    }
    free(steps);
    return err;
}

// The header of the file open at fd, its size checked against it.
static zps_err s_peek_fd(int fd, zps_ckpt_meta *meta, char *why, size_t why_len)
{
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(why, why_len, "not a readable regular file");
        return ZPS_EIO;
    }
    uint8_t header[CKPT_HEADER_MAX];
    size_t header_len = 0;
    zps_err err = s_read_header(fd, header, &header_len, meta, why, why_len);
    return err != ZPS_OK ? err
                         : s_check_size(meta, 1 + (uint64_t)zps_optim_state_floats(meta->optim),
                                        header_len, (long long)st.st_size, why, why_len);
}

zps_err zps_ckpt_peek(const char *dir, uint32_t shard, uint64_t step, zps_ckpt_meta *meta,
                      char *why, size_t why_len)
{
    ZPS_ASSERT(dir != NULL && meta != NULL && why != NULL);
    char path[PATH_MAX];
    if (!s_path(path, sizeof path, dir, shard, step)) {
        snprintf(why, why_len, "path too long");
        return ZPS_EIO;
    }
    char reason[CKPT_WHY_LEN] = "";
    zps_err err = ZPS_EIO;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        err = errno == ENOENT ? ZPS_ENOENT : ZPS_EIO;
        snprintf(reason, sizeof reason, "%s", strerror(errno));
    } else {
        err = s_peek_fd(fd, meta, reason, sizeof reason);
        close(fd);
    }
    snprintf(why, why_len, "%s: %s", path, reason);
    return err;
}

int zps_ckpt_steps(const char *dir, uint32_t shard, uint64_t *steps, int max)
{
    ZPS_ASSERT(dir != NULL && max >= 0 && (steps != NULL || max == 0));
    uint64_t *all;
    size_t n;
    if (s_list(dir, shard, &all, &n) != ZPS_OK) {
        return -1;
    }
    size_t take = n < (size_t)max ? n : (size_t)max;
    if (take > 0) {
        memcpy(steps, all + (n - take), take * sizeof *steps);
    }
    free(all);
    return (int)take;
}

// ---------------------------------------------------------------- records

static zps_err s_write_record(const char *dir, const char *name, const void *data, size_t len,
                              mode_t mode)
{
    char path[PATH_MAX];
    int n = snprintf(path, sizeof path, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= sizeof path) {
        zps_log_error("ckpt %s: path too long", dir);
        return ZPS_EIO;
    }
    zps_atomic a;
    if (s_mkdir_p(dir) != ZPS_OK || zps_atomic_begin(&a, path, mode) != ZPS_OK) {
        return ZPS_EIO;
    }
    zps_err err = ZPS_OK;
    // Exactly mode, whatever the umask: a record may be a secret (0600).
    if (fchmod(a.fd, mode) != 0) {
        zps_log_error("ckpt %s: chmod %o: %s", a.tmp, (unsigned)mode, strerror(errno));
        err = ZPS_EIO;
    }
    uint32_t crc = (uint32_t)crc32(0L, Z_NULL, 0);
    if (err == ZPS_OK) {
        err = s_write_all(a.fd, data, len, &crc, a.tmp);
    }
    return s_commit(&a, err, crc);
}

zps_err zps_ckpt_write_record(const char *dir, const char *name, const void *data, size_t len)
{
    return s_write_record(dir, name, data, len, 0644);
}

zps_err zps_ckpt_write_secret(const char *dir, const char *name, const void *data, size_t len)
{
    return s_write_record(dir, name, data, len, 0600);
}

zps_err zps_ckpt_read_record(const char *dir, const char *name, void *buf, size_t cap,
                             size_t *len)
{
    char path[PATH_MAX];
    int n = snprintf(path, sizeof path, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= sizeof path) {
        return ZPS_ENOENT;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return ZPS_ENOENT;
    }
    struct stat st;
    size_t got = 0;
    zps_err err = ZPS_OK;
    if (fstat(fd, &st) != 0 || st.st_size < CKPT_CRC_LEN ||
        (uint64_t)st.st_size - CKPT_CRC_LEN > cap) {
        zps_log_error("ckpt %s: truncated or too large (%lld bytes)", path, (long long)st.st_size);
        err = ZPS_EPROTO;
    } else if (s_read_full(fd, buf, (size_t)st.st_size - CKPT_CRC_LEN, &got) != 0 ||
               got != (size_t)st.st_size - CKPT_CRC_LEN) {
        zps_log_error("ckpt %s: truncated (shrank while being read)", path);
        err = ZPS_EPROTO;
    } else {
        uint8_t tail[CKPT_CRC_LEN];
        size_t t = 0;
        uint32_t crc = s_crc((uint32_t)crc32(0L, Z_NULL, 0), buf, got);
        if (s_read_full(fd, tail, sizeof tail, &t) != 0 || t != sizeof tail ||
            s_get32(tail) != crc) {
            zps_log_error("ckpt %s: checksum mismatch", path);
            err = ZPS_EPROTO;
        }
    }
    close(fd);
    *len = got;
    return err;
}
