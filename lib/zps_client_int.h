/* zps_client_int.h - what zps-worker, zps's own user of libzps, reads of a
 * client beyond include/zps.h. In the archive it links, not exported by
 * libzps.so (lib/libzps.map): a user's own training code brings its own
 * optimizer. */
#ifndef ZPS_CLIENT_INT_H
#define ZPS_CLIENT_INT_H

#include "common/zps_optim.h"
#include "include/zps.h"

// A diloco job's inner optimizer (zps-server's --optimizer, --lr, ...,
// its schedule over every inner step of the run) into *out. ZPS_EINVAL,
// unlogged, for a synchronous job (the shards' optimizer is the job's).
zps_err zps_client_inner_optim(const zps_client *c, zps_optim_cfg *out);

#endif
