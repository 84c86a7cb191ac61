/* zps_token.c - shard tokens and secret ids: getrandom(2), and the small
 * 0600 records that keep tokens across restarts. */
#include "zps_token.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "common/zps_log.h"
#include "common/zps_ckpt.h"

#define S_TABLE_NAME "shard-tokens"
#define S_MAX_TABLE 64 // ZPS_MAX_SHARDS; the record is read into a buffer of this many

zps_err zps_token_new(uint64_t *out)
{
    uint64_t v = 0;
    // A token of 0 would mean "none": draw again (once in 2^64).
    while (v == 0) {
        uint8_t *p = (uint8_t *)&v;
        size_t got = 0;
        while (got < sizeof v) {
            // Blocks only until the kernel's pool is first initialised (early boot).
            ssize_t n = getrandom(p + got, sizeof v - got, 0);
            if (n < 0 && errno == EINTR) {
                continue;
            }
            if (n <= 0) {
                zps_log_error("getrandom: %s", n < 0 ? strerror(errno) : "no bytes");
                return ZPS_EIO;
            }
            got += (size_t)n;
        }
    }
    *out = v;
    return ZPS_OK;
}

bool zps_token_equal(uint64_t expected, uint64_t presented)
{
    // One XOR and one compare, whatever bits differ: no early exit that
    // would tell a guesser how many of its bits were right.
    volatile uint64_t diff = expected ^ presented;
    return expected != 0 && diff == 0;
}

static void s_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static uint64_t s_get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) {
        v |= (uint64_t)p[i] << (8 * i);
    }
    return v;
}

zps_err zps_token_save(const char *dir, uint32_t index, uint64_t token)
{
    char name[64];
    snprintf(name, sizeof name, "shard-%u.token", index);
    uint8_t buf[8];
    s_put64(buf, token);
    return zps_ckpt_write_secret(dir, name, buf, sizeof buf);
}

zps_err zps_token_load(const char *dir, uint32_t index, uint64_t *token)
{
    char name[64];
    snprintf(name, sizeof name, "shard-%u.token", index);
    uint8_t buf[8];
    size_t len = 0;
    zps_err err = zps_ckpt_read_record(dir, name, buf, sizeof buf, &len);
    if (err == ZPS_OK && len != sizeof buf) {
        zps_log_error("%s/%s: %zu bytes, not a token", dir, name, len);
        err = ZPS_EPROTO;
    }
    if (err == ZPS_OK) {
        *token = s_get64(buf);
    }
    return err;
}

zps_err zps_token_save_table(const char *dir, const uint64_t *tokens, uint32_t n)
{
    if (n > S_MAX_TABLE) {
        return ZPS_EINVAL;
    }
    uint8_t buf[8 * S_MAX_TABLE];
    for (size_t i = 0; i < n; i++) {
        s_put64(buf + 8 * i, tokens[i]);
    }
    return zps_ckpt_write_secret(dir, S_TABLE_NAME, buf, (size_t)8 * n);
}

zps_err zps_token_load_table(const char *dir, uint64_t *tokens, uint32_t n)
{
    uint8_t buf[8 * S_MAX_TABLE];
    size_t len = 0;
    zps_err err = zps_ckpt_read_record(dir, S_TABLE_NAME, buf, sizeof buf, &len);
    if (err == ZPS_OK && len != (size_t)8 * n) {
        zps_log_error("%s/%s: %zu bytes, not the tokens of %u shards", dir, S_TABLE_NAME, len, n);
        err = ZPS_EPROTO;
    }
    for (size_t i = 0; err == ZPS_OK && i < n; i++) {
        tokens[i] = s_get64(buf + 8 * i);
    }
    return err;
}
