/* zps_err.c - text for zps_err codes (zps_strerror of include/zps.h). */
#include "zps_err.h"

static const char *const s_text[] = {
    [ZPS_OK] = "ok",
    [ZPS_EINVAL] = "invalid argument",
    [ZPS_EPROTO] = "malformed message",
    [ZPS_EVERSION] = "protocol version mismatch",
    [ZPS_EJOB] = "wrong job id",
    [ZPS_ERANGE] = "out of range",
    [ZPS_ESTALE] = "stale or future step",
    [ZPS_ENOENT] = "unknown member or name",
    [ZPS_EDUP] = "duplicate",
    [ZPS_ESTATE] = "not allowed in this state",
    [ZPS_ENOMEM] = "out of memory",
    [ZPS_EIO] = "i/o error",
    [ZPS_ETIMEDOUT] = "timed out",
    [ZPS_ECLOSED] = "closed",
    [ZPS_EAGAIN] = "not yet",
    [ZPS_EPERM] = "not permitted",
};

// A code added to the enum without its text here stops the build: the
// table's length is its last entry's code plus one.
_Static_assert(sizeof s_text / sizeof s_text[0] == ZPS_ECOUNT_,
               "every zps_err code needs its text in s_text");

const char *zps_strerror(zps_err err)
{
    // Codes come off the wire too: any int, not only the enum's.
    if ((unsigned)err >= ZPS_ECOUNT_ || s_text[err] == NULL) {
        return "unknown error";
    }
    return s_text[err];
}
