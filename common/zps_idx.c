/* zps_idx.c - unsigned-byte IDX files, decompressed once and memory-mapped.
 *
 * A gzip file cannot be mapped, and decompressing 47 MB on every worker start
 * costs a second, so a .gz is inflated once into a cache file that all later
 * opens (and all workers of a host) map read-only. The cache file is written
 * under a unique temporary name, fsynced and renamed, so a reader sees either
 * no file or a complete one, whatever crashes or races happen meanwhile.
 *
 * Everything in a file is treated as untrusted: the header is checked against
 * the file length before a single record is touched. */
#include "zps_idx.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "zps_atomic.h"
#include "zps_log.h"

#define IDX_TYPE_UBYTE 0x08
#define IDX_HEADER_MAX (4 + 4 * ZPS_IDX_MAX_DIMS)
#define IDX_COPY_CHUNK (1u << 20)

// A parsed and validated header; the layout of the bytes that follow it.
typedef struct idx_header {
    uint32_t dims[ZPS_IDX_MAX_DIMS]; // all dimensions, dims[0] is the count
    int n_dims;                      // 1..ZPS_IDX_MAX_DIMS
    uint32_t record_size;            // product of dims[1..]
    size_t header_len;               // 4 + 4 * n_dims
    size_t total_len;                // header_len + n * record_size
} idx_header;

// ---------------------------------------------------------------- header

static uint32_t s_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

// Checks the magic word; n_dims is its low byte.
static zps_err s_parse_magic(const char *path, const uint8_t *b, int *n_dims)
{
    if (b[0] != 0 || b[1] != 0) {
        zps_log_error("idx %s: bad magic %02x%02x%02x%02x (not an IDX file)", path, b[0], b[1],
                      b[2], b[3]);
        return ZPS_EINVAL;
    }
    if (b[2] != IDX_TYPE_UBYTE) {
        zps_log_error("idx %s: element type 0x%02x, only unsigned byte (0x08) is supported", path,
                      b[2]);
        return ZPS_EINVAL;
    }
    if (b[3] < 1 || b[3] > ZPS_IDX_MAX_DIMS) {
        zps_log_error("idx %s: %u dimensions, expected 1..%d", path, b[3], ZPS_IDX_MAX_DIMS);
        return ZPS_EINVAL;
    }
    *n_dims = b[3];
    return ZPS_OK;
}

// Fills the sizes from the dims, refusing any product that does not fit:
// record_size must fit the uint32 of zps_idx, the whole file a size_t.
static zps_err s_header_sizes(const char *path, idx_header *h)
{
    uint64_t rs = 1;
    for (int i = 1; i < h->n_dims; i++) {
        if (h->dims[i] == 0) {
            zps_log_error("idx %s: dimension %d is 0", path, i);
            return ZPS_EINVAL;
        }
        rs *= h->dims[i];
        if (rs > UINT32_MAX) {
            zps_log_error("idx %s: record size overflows 32 bits", path);
            return ZPS_EINVAL;
        }
    }
    h->record_size = (uint32_t)rs;
    h->header_len = 4 + 4 * (size_t)h->n_dims;
    uint64_t data = (uint64_t)h->dims[0] * rs; // < 2^64: both factors < 2^32
    if (data > (uint64_t)SIZE_MAX - h->header_len) {
        zps_log_error("idx %s: data size overflows", path);
        return ZPS_EINVAL;
    }
    h->total_len = h->header_len + (size_t)data;
    return ZPS_OK;
}

// Parses a header from the first `len` bytes of a file.
static zps_err s_parse_header(const char *path, const uint8_t *b, size_t len, idx_header *h)
{
    memset(h, 0, sizeof *h);
    if (len < 4) {
        zps_log_error("idx %s: truncated header (%zu bytes)", path, len);
        return ZPS_EINVAL;
    }
    zps_err err = s_parse_magic(path, b, &h->n_dims);
    if (err != ZPS_OK) {
        return err;
    }
    if (len < 4 + 4 * (size_t)h->n_dims) {
        zps_log_error("idx %s: truncated header (%zu bytes, %d dimensions)", path, len,
                      h->n_dims);
        return ZPS_EINVAL;
    }
    for (int i = 0; i < h->n_dims; i++) {
        h->dims[i] = s_be32(b + 4 + 4 * (size_t)i);
    }
    return s_header_sizes(path, h);
}

// Reads the header through zlib, which passes a plain file through as is.
static zps_err s_read_header(const char *path, idx_header *h)
{
    errno = 0; // gzopen sets it only when the open itself failed
    gzFile gz = gzopen(path, "rb");
    if (gz == NULL) {
        int e = errno;
        zps_log_error("idx %s: %s", path, e ? strerror(e) : "cannot open");
        return e == ENOENT ? ZPS_ENOENT : ZPS_EIO;
    }
    uint8_t buf[IDX_HEADER_MAX];
    int got = gzread(gz, buf, sizeof buf);
    zps_err err = ZPS_OK;
    if (got < 0) {
        int zerr;
        zps_log_error("idx %s: read: %s", path, gzerror(gz, &zerr));
        err = ZPS_EIO;
        goto out_close;
    }
    err = s_parse_header(path, buf, (size_t)got, h);
out_close:
    gzclose(gz);
    return err;
}

// ---------------------------------------------------------------- mapping

// Maps a plain IDX file and checks that its length matches its header.
static zps_err s_map_plain(const char *path, zps_idx *out)
{
    zps_err err = ZPS_OK;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        zps_log_error("idx %s: %s", path, strerror(e));
        return e == ENOENT ? ZPS_ENOENT : ZPS_EIO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        zps_log_error("idx %s: stat: %s", path, strerror(errno));
        err = ZPS_EIO;
        goto out_close;
    }
    if (st.st_size < 4) {
        zps_log_error("idx %s: truncated header (%jd bytes)", path, (intmax_t)st.st_size);
        err = ZPS_EINVAL;
        goto out_close;
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        zps_log_error("idx %s: mmap: %s", path, strerror(errno));
        err = ZPS_EIO;
        goto out_close;
    }
    idx_header h;
    err = s_parse_header(path, map, (size_t)st.st_size, &h);
    if (err == ZPS_OK && h.total_len != (size_t)st.st_size) {
        zps_log_error("idx %s: %jd bytes, header promises %zu (truncated or corrupt)", path,
                      (intmax_t)st.st_size, h.total_len);
        err = ZPS_EINVAL;
    }
    if (err != ZPS_OK) {
        munmap(map, (size_t)st.st_size);
        goto out_close;
    }
    out->map = map;
    out->map_len = (size_t)st.st_size;
    out->data = (const uint8_t *)map + h.header_len;
    out->n = h.dims[0];
    out->record_size = h.record_size;
    out->n_dims = h.n_dims;
    memcpy(out->dims, h.dims, sizeof out->dims);
out_close:
    close(fd); // the mapping keeps the file alive
    return err;
}

// ---------------------------------------------------------------- cache

// mkdir -p: creates every missing component of dir.
static zps_err s_mkdir_p(const char *dir)
{
    char buf[PATH_MAX];
    if (dir[0] == '\0' || snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf) {
        zps_log_error("idx cache '%s': empty or too long", dir);
        return ZPS_EINVAL;
    }
    for (char *p = buf + 1;; p++) {
        bool last = *p == '\0';
        if (*p != '/' && !last) {
            continue;
        }
        *p = '\0';
        struct stat st;
        if (mkdir(buf, 0755) != 0 && (errno != EEXIST || stat(buf, &st) != 0 ||
                                       !S_ISDIR(st.st_mode))) {
            zps_log_error("idx cache %s: mkdir %s: %s", dir, buf,
                          errno == EEXIST ? "not a directory" : strerror(errno));
            return ZPS_EIO;
        }
        if (last) {
            return ZPS_OK;
        }
        *p = '/';
    }
}

// FNV-1a, to give each source its own cache name.
static uint64_t s_fnv(uint64_t h, const void *data, size_t len)
{
    const uint8_t *p = data;
    for (size_t i = 0; i < len; i++) {
        // clang-analyzer does not model bytes of an initialised int64_t
        // array read through a byte pointer (s_cache_path's meta).
        // NOLINTNEXTLINE(clang-analyzer-core.UndefinedBinaryOperatorResult)
        h = (h ^ p[i]) * 0x100000001B3ull;
    }
    return h;
}

// The cache name holds the base name (for people) and a hash of the source's
// absolute path, size and mtime: MNIST and Fashion-MNIST share base names,
// and a replaced source must not be served from a stale copy.
static zps_err s_cache_path(const char *path, const char *cache_dir, char *out, size_t out_len)
{
    char real[PATH_MAX];
    struct stat st;
    if (realpath(path, real) == NULL || stat(real, &st) != 0) {
        int e = errno;
        zps_log_error("idx %s: %s", path, strerror(e));
        return e == ENOENT ? ZPS_ENOENT : ZPS_EIO;
    }
    uint64_t h = s_fnv(0xCBF29CE484222325ull, real, strlen(real));
    int64_t meta[3] = {(int64_t)st.st_size, (int64_t)st.st_mtim.tv_sec,
                       (int64_t)st.st_mtim.tv_nsec};
    h = s_fnv(h, meta, sizeof meta);
    const char *base = strrchr(real, '/') + 1; // realpath is absolute
    size_t base_len = strlen(base);
    if (base_len > 3 && strcmp(base + base_len - 3, ".gz") == 0) {
        base_len -= 3;
    }
    if (snprintf(out, out_len, "%s/%.*s.%016" PRIx64, cache_dir, (int)base_len, base, h) >=
        (int)out_len) {
        zps_log_error("idx %s: cache path too long", path);
        return ZPS_EINVAL;
    }
    return ZPS_OK;
}

// Writes all of buf to fd, retrying short writes.
static zps_err s_write_all(int fd, const uint8_t *buf, size_t len, const char *tmp)
{
    while (len > 0) {
        ssize_t w = write(fd, buf, len);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w < 0) {
            zps_log_error("idx cache %s: write: %s", tmp, strerror(errno));
            return ZPS_EIO;
        }
        buf += w;
        len -= (size_t)w;
    }
    return ZPS_OK;
}

// Inflates exactly h->total_len bytes of src into fd; a stream that is
// shorter or longer than its header says is corrupt.
static zps_err s_inflate_to(const char *src, const idx_header *h, int fd, const char *tmp)
{
    zps_err err = ZPS_OK;
    uint8_t *buf = malloc(IDX_COPY_CHUNK);
    errno = 0;
    gzFile gz = gzopen(src, "rb");
    if (buf == NULL || gz == NULL) {
        zps_log_error("idx %s: %s", src,
                      buf == NULL ? "out of memory" : errno ? strerror(errno) : "cannot open");
        err = buf == NULL ? ZPS_ENOMEM : ZPS_EIO;
        goto out_free;
    }
    size_t done = 0;
    for (;;) {
        int got = gzread(gz, buf, IDX_COPY_CHUNK);
        if (got < 0) {
            int zerr;
            zps_log_error("idx %s: decompress: %s", src, gzerror(gz, &zerr));
            err = ZPS_EIO;
            goto out_free;
        }
        if (got == 0) {
            break;
        }
        if ((size_t)got > h->total_len - done) {
            zps_log_error("idx %s: more data than the header promises (%zu bytes)", src,
                          h->total_len);
            err = ZPS_EINVAL;
            goto out_free;
        }
        err = s_write_all(fd, buf, (size_t)got, tmp);
        if (err != ZPS_OK) {
            goto out_free;
        }
        done += (size_t)got;
    }
    if (done != h->total_len) {
        zps_log_error("idx %s: %zu bytes decompressed, header promises %zu (truncated)", src,
                      done, h->total_len);
        err = ZPS_EINVAL;
    }
out_free:
    if (gz != NULL) {
        gzclose(gz);
    }
    free(buf);
    return err;
}

// True if the cached copy exists and is exactly as long as the source's
// header says: it was renamed into place only once complete.
static bool s_cache_complete(const char *cached, const idx_header *h)
{
    struct stat st;
    return stat(cached, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size == h->total_len;
}

// Decompresses src into the cache file dst through a temporary of its own
// (zps_atomic names it by pid and serial), so concurrent workers never share
// one and a reader never sees a half-built cache.
static zps_err s_build_cache(const char *src, const idx_header *h, const char *dst)
{
    zps_atomic a;
    zps_err err = zps_atomic_begin(&a, dst, 0644);
    if (err != ZPS_OK) {
        zps_log_error("idx %s: cache %s not written", src, dst);
        return err;
    }
    fchmod(a.fd, 0644); // shared by the workers of a host, whatever the umask; best effort
    err = zps_atomic_commit(&a, s_inflate_to(src, h, a.fd, a.tmp));
    // A directory sync that failed after the rename loses at most the cache
    // at a power loss, so the complete copy in place (or another worker's)
    // serves.
    return err != ZPS_OK && s_cache_complete(dst, h) ? ZPS_OK : err;
}

// Opens a gzip IDX file through its cached decompressed copy.
static zps_err s_open_gz(const char *path, const char *cache_dir, zps_idx *out)
{
    if (cache_dir == NULL || cache_dir[0] == '\0') {
        zps_log_error("idx %s: compressed, and no cache directory to decompress it into", path);
        return ZPS_EINVAL;
    }
    idx_header h;
    char cached[PATH_MAX];
    zps_err err = s_read_header(path, &h);
    if (err == ZPS_OK) {
        err = s_mkdir_p(cache_dir);
    }
    if (err == ZPS_OK) {
        err = s_cache_path(path, cache_dir, cached, sizeof cached);
    }
    if (err == ZPS_OK && !s_cache_complete(cached, &h)) {
        zps_log_info("idx %s: decompressing into %s", path, cached);
        err = s_build_cache(path, &h, cached);
    }
    if (err == ZPS_OK) {
        err = s_map_plain(cached, out);
    }
    if (err == ZPS_OK && memcmp(out->dims, h.dims, sizeof h.dims) != 0) {
        zps_log_error("idx %s: cached copy %s has other dimensions; delete it", path, cached);
        zps_idx_close(out);
        err = ZPS_EINVAL;
    }
    return err;
}

// True if the file starts with the gzip magic; IDX files start with 0x00.
static zps_err s_is_gzip(const char *path, bool *gz)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        zps_log_error("idx %s: %s", path, strerror(e));
        return e == ENOENT ? ZPS_ENOENT : ZPS_EIO;
    }
    uint8_t b[2] = {0, 0};
    ssize_t got = read(fd, b, sizeof b);
    close(fd);
    *gz = got == 2 && b[0] == 0x1F && b[1] == 0x8B;
    return ZPS_OK;
}

// ---------------------------------------------------------------- API

zps_err zps_idx_open(const char *path, const char *cache_dir, zps_idx *out)
{
    memset(out, 0, sizeof *out);
    bool gz = false;
    zps_err err = s_is_gzip(path, &gz);
    if (err != ZPS_OK) {
        return err;
    }
    err = gz ? s_open_gz(path, cache_dir, out) : s_map_plain(path, out);
    if (err != ZPS_OK) {
        memset(out, 0, sizeof *out);
    }
    return err;
}

void zps_idx_close(zps_idx *idx)
{
    if (idx->map != NULL) {
        munmap(idx->map, idx->map_len);
    }
    memset(idx, 0, sizeof *idx);
}

zps_err zps_idx_count(const char *path, uint32_t *n)
{
    idx_header h;
    zps_err err = s_read_header(path, &h);
    *n = err == ZPS_OK ? h.dims[0] : 0;
    return err;
}
