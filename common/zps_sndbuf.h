/* zps_sndbuf.h - TCP send buffers that tune themselves (--sndbuf auto).
 *
 * Every worker talks to every shard, so a host's link carries several
 * flows at once, and a shard's bucket is done only when the slowest flow
 * into it has brought it. With the OS's autotuned buffers, flows that share
 * a link fill its queue and share it unevenly; a small buffer (32 KiB) keeps
 * each flow's share of the queue small and equal, so the flows take turns,
 * but it caps a lone flow at a buffer per round trip (12 x slower on
 * loopback). --sndbuf auto decides per connection, at run time:
 *
 *   - a peer on this host (loopback, ipc, or this host's own address):
 *     the OS's buffer, never touched;
 *   - a peer on another host: the OS's buffer until the connection shows a
 *     standing queue (smoothed RTT at least twice the minimum and 1 ms
 *     above it while it moves data); from then on a buffer of
 *
 *         buf * min_rtt / srtt + ZPS_SNDBUF_QUEUE_BYTES
 *
 *     every ZPS_SNDBUF_TICK_MS: what the path holds in flight at its
 *     base round trip, plus a fixed share of the bottleneck's queue
 *     (TCP Vegas' rule, applied to the buffer: flows that each keep the
 *     same bytes in a FIFO queue get the same share of its link). Without
 *     a queue the buffer doubles each tick, up to ZPS_SNDBUF_MAX_BYTES, so
 *     a lone flow on a fast link is not held back.
 *
 * ZeroMQ sets ZMQ_SNDBUF only when it makes a connection, so the tuning
 * works on the connections' own descriptors, which a socket monitor
 * reports (ZMQ_EVENT_CONNECTED, ZMQ_EVENT_ACCEPTED); a thread per watched
 * socket reads TCP_INFO and sets SO_SNDBUF. Linux only: elsewhere auto is
 * the OS's buffer. The choice: docs/running.md, "Send buffers on shared
 * links". */
#ifndef ZPS_SNDBUF_H
#define ZPS_SNDBUF_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "zps_err.h"

// --sndbuf auto, the default of both daemons and of ZPS_OPT_SNDBUF.
#define ZPS_SNDBUF_AUTO (-1)
// How often a watched connection is measured and its buffer set.
#define ZPS_SNDBUF_TICK_MS 50
// Each flow's share of a shared bottleneck's queue; also the smallest
// buffer auto sets (the --sndbuf 32768 of docs/measurements.md).
#define ZPS_SNDBUF_QUEUE_BYTES 32768
// The largest buffer auto sets (Linux's tcp_wmem maximum by default; the
// kernel also holds it to net.core.wmem_max).
#define ZPS_SNDBUF_MAX_BYTES (4 << 20)
// A standing queue: srtt at least this far above min_rtt (and twice it).
#define ZPS_SNDBUF_QUEUE_US 1000

// --sndbuf's reader (a zps_opts CUSTOM parser into an int): "auto" is
// ZPS_SNDBUF_AUTO, "0" the OS's buffer, 4096..1073741824 that many bytes.
bool zps_sndbuf_parse(const char *text, void *field);

// What one tick measured on a connection.
typedef struct zps_sndbuf_sample {
    uint32_t srtt_us;    // smoothed round trip (tcpi_rtt)
    uint32_t min_rtt_us; // the least round trip seen (tcpi_min_rtt); 0: unknown
    uint64_t acked;      // bytes the peer acknowledged since the last tick
} zps_sndbuf_sample;

// The buffer a connection should have after a tick: cur is the value auto
// set before (0: none yet, the OS's autotuning), os_bytes what the OS's
// autotuning holds now (used when auto first takes over). Returns 0 to
// leave the OS's buffer, else the bytes for SO_SNDBUF. A tick that moved
// less than ZPS_SNDBUF_QUEUE_BYTES, or without min_rtt, keeps cur.
int zps_sndbuf_next(int cur, int os_bytes, const zps_sndbuf_sample *s);

// Whether a connection from local to peer stays on this host: a loopback
// peer, a peer at the local address itself, or not IP at all (ipc).
bool zps_sndbuf_same_host(const struct sockaddr *local, const struct sockaddr *peer);

// Sets sock's send buffer from --sndbuf's value, before sock binds or
// connects: bytes > 0 as ZMQ_SNDBUF, 0 leaves the OS's, ZPS_SNDBUF_AUTO
// watches sock's TCP connections from a thread of its own (a ZeroMQ PAIR
// in ctx, so zmq_ctx_term ends it; closing sock ends it too). ZPS_EIO if
// ZeroMQ refuses or the thread cannot start (logged).
zps_err zps_sndbuf_apply(void *ctx, void *sock, int bytes);

#endif
