/* zps_err.h - zps's error codes, for the servers, tools and libzps alike.
 *
 * Every function that can fail returns a zps_err; the reason is logged once,
 * where it is best known, and callers only propagate the code. The enum and
 * zps_strerror are the public header's (include/zps.h), not a copy of them:
 * a code a server sends is one that libzps and its users can name. */
#ifndef ZPS_COMMON_ERR_H
#define ZPS_COMMON_ERR_H

#include "include/zps.h"

#endif
