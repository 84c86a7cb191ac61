/* zps_err.c - text for zps_err codes. */
#include "zps_err.h"

const char *zps_strerror(zps_err err)
{
    switch (err) {
    case ZPS_OK: return "ok";
    case ZPS_EINVAL: return "invalid argument";
    case ZPS_EPROTO: return "malformed message";
    case ZPS_EVERSION: return "protocol version mismatch";
    case ZPS_EJOB: return "wrong job id";
    case ZPS_ERANGE: return "out of range";
    case ZPS_ESTALE: return "stale or future step";
    case ZPS_ENOENT: return "unknown member or name";
    case ZPS_EDUP: return "duplicate";
    case ZPS_ESTATE: return "not allowed in this state";
    case ZPS_ENOMEM: return "out of memory";
    case ZPS_EIO: return "i/o error";
    case ZPS_ETIMEDOUT: return "timed out";
    case ZPS_ECLOSED: return "closed";
    case ZPS_EAGAIN: return "not yet";
    case ZPS_EPERM: return "not permitted";
    case ZPS_ECOUNT_: break;
    }
    return "unknown error";
}
