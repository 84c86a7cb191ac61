/* zps_err.h - the one error enum of zps.
 *
 * Every function that can fail returns a zps_err; the reason is logged once,
 * where it is best known, and callers only propagate the code. */
#ifndef ZPS_ERR_H
#define ZPS_ERR_H

typedef enum zps_err {
    ZPS_OK = 0,      // not an error
    ZPS_EINVAL,      // bad argument or configuration
    ZPS_EPROTO,      // malformed message from a peer
    ZPS_EVERSION,    // peer speaks another protocol version
    ZPS_EJOB,        // message belongs to another job
    ZPS_ERANGE,      // offset, count or index out of bounds
    ZPS_ESTALE,      // step or generation is not the current one
    ZPS_ENOENT,      // unknown member, file or name
    ZPS_EDUP,        // duplicate of something already counted
    ZPS_ESTATE,      // message not allowed in the current state
    ZPS_ENOMEM,      // allocation failed
    ZPS_EIO,         // file or socket I/O failed
    ZPS_ETIMEDOUT,   // a bounded wait ran out
    ZPS_ECLOSED,     // peer or job is gone
    ZPS_EAGAIN,      // not yet: hold the message and try again later
    ZPS_EPERM,       // the sender's role or credential does not allow this message
    ZPS_ECOUNT_      // number of codes, not an error
} zps_err;

// Short, stable text for an error code (borrowed, never NULL).
const char *zps_strerror(zps_err err);

#endif
