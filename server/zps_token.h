/* zps_token.h - secrets that prove who a peer is without CURVE: the shard
 * tokens the coordinator hands out with ASSIGN, and the random numbers
 * behind member ids and job ids.
 *
 * A token is 64 bits from getrandom(2), never 0 (0 means "none"). The
 * numbers behind ids must not be guessable from each other: zps_rng is a
 * splitmix64, whose every output gives away its state, so a job id read
 * from STATUS would give away the member ids drawn after it. Every secret
 * here comes from the kernel instead.
 *
 * On disk: a shard keeps its own token in its checkpoint directory
 * (shard-I.token) so that a restart with --resume can present it; the
 * coordinator keeps every shard's (shard-tokens) beside its job state, so
 * that a restarted coordinator knows its shards again. Both are written
 * atomically, mode 0600, with a CRC (common/zps_ckpt.h records). */
#ifndef ZPS_TOKEN_H
#define ZPS_TOKEN_H

#include <stdbool.h>
#include <stdint.h>

#include "common/zps_err.h"

// A new secret: 64 random bits from getrandom(2), never 0. ZPS_EIO if the
// kernel gives none (logged).
zps_err zps_token_new(uint64_t *out);

// Whether a presented token is the expected one: false for 0 (none). The
// comparison takes the same time for every wrong token.
bool zps_token_equal(uint64_t expected, uint64_t presented);

// A shard's own token: written to <dir>/shard-<index>.token, read back by
// a restart. load: ZPS_ENOENT if there is none, ZPS_EPROTO if the file is
// damaged (logged).
zps_err zps_token_save(const char *dir, uint32_t index, uint64_t token);
zps_err zps_token_load(const char *dir, uint32_t index, uint64_t *token);

// The coordinator's table of n tokens (index = shard; 0 where none) in
// <dir>/shard-tokens. load: ZPS_ENOENT if there is none, ZPS_EPROTO if it is
// damaged or holds another number of shards (logged).
zps_err zps_token_save_table(const char *dir, const uint64_t *tokens, uint32_t n);
zps_err zps_token_load_table(const char *dir, uint64_t *tokens, uint32_t n);

#endif
