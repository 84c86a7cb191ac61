/* zps_ckpt.h - shard checkpoint files: one shard's parameters, optimizer
 * state and step, written so that a crash at any moment leaves either the
 * previous set of checkpoints or the previous set plus one complete new file.
 *
 * A file is <dir>/shard-<I>-step-<T>.ckpt: a little-endian header (magic
 * "ZPSCKPT1", format version, the meta below), hi - lo fp32 parameters, the
 * optimizer's state, and a CRC-32 (zlib) of every byte before it. Two
 * versions, by optimizer:
 *   1  SGD: a 64-byte header, then hi - lo fp32 momentum values. Exactly
 *      the format of the builds before Adam, which keeps reading and
 *      writing SGD checkpoints as before.
 *   2  Adam, AdamW: an 80-byte header that adds the optimizer and its step
 *      count, then exp_avg and exp_avg_sq, hi - lo fp32 values each.
 * Everything read back is checked (size, magic, version, CRC, and the meta
 * against what the caller expects) because a restarted shard that silently
 * loaded another shard's, another job's or a torn file would break the
 * promise that a run ends where an uninterrupted one does. */
#ifndef ZPS_CKPT_H
#define ZPS_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "common/zps_err.h"
#include "common/zps_optim.h"

// What a checkpoint is of; stored in the header and compared on load.
typedef struct zps_ckpt_meta {
    uint32_t shard;      // which shard ...
    uint32_t shards;     // ... of how many
    uint64_t lo, hi;     // its range [lo, hi) of the flat vector
    uint64_t step;       // steps completed when written (ignored in a load's want)
    uint64_t job_seed;   // the job's seed
    uint64_t model_hash; // a hash of the model spec text, computed by the caller
    zps_optim_kind optim; // whose state follows the parameters (compared on load)
    uint64_t optim_step;  // updates the optimizer applied, Adam's t (ignored in a load's want)
} zps_ckpt_meta;

// Writes meta->shard's checkpoint of meta->step into dir (created, with its
// parents, if missing): params is hi - lo floats, state
// zps_optim_state_floats(meta->optim) times as many (SGD's momentum; Adam's
// exp_avg, then exp_avg_sq, in one array). The
// file appears under its final name only once complete and synced, and the
// directory is synced after the rename. Then deletes this shard's
// checkpoints of steps before meta->step beyond the newest `keep` (>= 1)
// counting this one; checkpoints of later steps (left by a run that was
// rolled back) are not touched, and a failed delete is only a warning.
// ZPS_EIO on any failure, logged, with no temporary file left behind.
zps_err zps_ckpt_write(const char *dir, const zps_ckpt_meta *meta, const float *params,
                       const float *state, int keep);

// Loads want->shard's checkpoint of exactly `step` into params and state
// (caller-allocated, sized as for zps_ckpt_write) and, unless optim_step is
// NULL, its optimizer step count into *optim_step (a version 1 file, SGD's,
// has none: zps applies one update per step, so it reads as `step`). The
// file must match want in shard, shards, lo, hi, job_seed, model_hash and
// optim (want->step and want->optim_step are ignored). ZPS_ENOENT if there
// is no such file; ZPS_EPROTO if it is invalid (truncated, checksum
// mismatch, another shard's or another optimizer's ...); ZPS_EIO if it
// cannot be read. Every failure is logged with the path and the reason. On
// failure params, state and *optim_step hold unspecified values.
zps_err zps_ckpt_load(const char *dir, const zps_ckpt_meta *want, uint64_t step, float *params,
                      float *state, uint64_t *optim_step);

// Loads the newest valid checkpoint of want->shard in dir, as zps_ckpt_load
// does, and sets *step to its step. Steps are tried newest first; each
// invalid or unreadable file is logged once, with its path and why, and the
// previous one is tried. ZPS_ENOENT if none is valid (or there is none).
zps_err zps_ckpt_load_newest(const char *dir, const zps_ckpt_meta *want, uint64_t *step,
                             float *params, float *state, uint64_t *optim_step);

// What shard's checkpoint of step in dir says it is, for a reader that
// does not know the job (libzps's zps_checkpoint_open): its header's meta,
// with the file's size checked against it, not its checksum; a load with
// *meta as want then checks the rest. ZPS_ENOENT if there is no such file,
// ZPS_EPROTO if its header or size is wrong, ZPS_EIO if it cannot be read;
// why (logged by nobody) says which.
zps_err zps_ckpt_peek(const char *dir, uint32_t shard, uint64_t step, zps_ckpt_meta *meta,
                      char *why, size_t why_len);

// Fills steps with the steps of shard's checkpoints in dir, ascending, going
// by the file names only (valid or not). If there are more than max, the
// newest max are given. Returns how many were stored: 0 if dir does not
// exist, -1 if it cannot be read (logged).
int zps_ckpt_steps(const char *dir, uint32_t shard, uint64_t *steps, int max);

// The record an external job's shard 0 keeps beside its checkpoints: the
// first worker's declaration, a packed Hello of its layout and dataset
// sizes (server/zps_declare.c writes it, zps_checkpoint_open reads it).
#define ZPS_CKPT_DECLARED "declared-model"
#define ZPS_CKPT_DECLARED_MAX (1u << 20)

// A small record beside the checkpoints (the coordinator's job state):
// <dir>/<name> holds data and a CRC-32, written atomically as checkpoints
// are. ZPS_EIO on failure, logged.
zps_err zps_ckpt_write_record(const char *dir, const char *name, const void *data, size_t len);
// The same for a record that holds secrets (shard tokens, member ids): the
// file is readable and writable by its owner only (0600) from the moment
// it exists, its temporary included.
zps_err zps_ckpt_write_secret(const char *dir, const char *name, const void *data, size_t len);
// Reads <dir>/<name> into buf (at most cap bytes) and checks its CRC.
// ZPS_ENOENT if absent, ZPS_EPROTO (logged) if truncated, too large or corrupt.
zps_err zps_ckpt_read_record(const char *dir, const char *name, void *buf, size_t cap,
                             size_t *len);

#endif
