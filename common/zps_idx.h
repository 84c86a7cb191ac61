/* zps_idx.h - IDX files (the MNIST family), memory-mapped.
 *
 * A gzipped file is decompressed once into a cache directory (written to a
 * temporary name and renamed, so concurrent workers never see half a file)
 * and then mapped: a worker touches only the records of its slices. */
#ifndef ZPS_IDX_H
#define ZPS_IDX_H

#include <stddef.h>
#include <stdint.h>

#include "zps_err.h"

#define ZPS_IDX_MAX_DIMS 4

typedef struct zps_idx {
    const uint8_t *data;             // borrowed view of the map: record 0
    uint32_t n;                      // records (the first dimension)
    uint32_t record_size;            // bytes per record (product of the other dims)
    uint32_t dims[ZPS_IDX_MAX_DIMS]; // all dimensions, dims[0] == n
    int n_dims;                      // 1..ZPS_IDX_MAX_DIMS
    void *map;                       // owned: the whole mapped file
    size_t map_len;                  // bytes mapped
} zps_idx;

// Opens an unsigned-byte IDX file (plain or .gz). A .gz is decompressed
// into cache_dir (created if missing) unless a complete copy is there.
// On failure *out is zeroed and the reason logged.
zps_err zps_idx_open(const char *path, const char *cache_dir, zps_idx *out);
// Unmaps; safe on a zeroed or already closed zps_idx.
void zps_idx_close(zps_idx *idx);
// Reads only the header of path (plain or .gz) and returns the record count.
zps_err zps_idx_count(const char *path, uint32_t *n);

#endif
