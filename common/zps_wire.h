/* zps_wire.h - multipart messages on ZeroMQ: a protobuf-c header frame and
 * raw tensor frames.
 *
 * Tensors travel as little-endian element arrays cut into frames of at most
 * ZPS_WIRE_FRAME_BYTES (large single messages make the receiver page-fault
 * on fresh memory). Sends are zero-copy when the caller passes a zps_wire_ref:
 * ZeroMQ then reads the caller's buffer from its I/O thread, and the caller
 * must zps_wire_ref_wait() before writing that buffer again.
 *
 * Nothing here trusts the peer: a message that does not decode is returned
 * as ZPS_EPROTO with its routing id, so the caller can answer it.
 *
 * A send is all or nothing: every part of a message is built before the
 * first is handed to ZeroMQ, so a failure (out of memory, too many frames)
 * leaves nothing on the socket for the next message to be glued to. */
#ifndef ZPS_WIRE_H
#define ZPS_WIRE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "proto/zps.pb-c.h"
#include "zps_err.h"

#define ZPS_WIRE_VERSION 1
#define ZPS_WIRE_FRAME_BYTES (4u << 20)
#define ZPS_WIRE_MAX_FRAMES 128
// Largest frame a peer may make us allocate (ZMQ_MAXMSGSIZE).
#define ZPS_WIRE_MAX_MSG_BYTES ((int64_t)ZPS_WIRE_FRAME_BYTES + (1 << 20))

// Longest "Peer-Address" and "User-Id" kept from a message's metadata.
#define ZPS_WIRE_META_LEN 64

typedef struct zps_wire_msg {
    zmq_msg_t route;                         // ROUTER: the sender's routing id
    bool has_route;                          // route is initialised
    char peer[ZPS_WIRE_META_LEN];            // the connection's "Peer-Address" ("" if none: inproc)
    char user_id[ZPS_WIRE_META_LEN];         // the "User-Id" ZAP gave it ("" without CURVE)
    Zps__Header *hdr;                        // owned: decoded header, NULL if it did not decode
    zmq_msg_t frames[ZPS_WIRE_MAX_FRAMES];   // owned: payload frames
    int n_frames;                            // payload frames received
    size_t payload_bytes;                    // their total length
} zps_wire_msg;

// Counts a buffer's zero-copy frames still held by ZeroMQ.
typedef struct zps_wire_ref {
    atomic_int inflight; // frames not yet released by ZeroMQ
} zps_wire_ref;

// A socket with the options every zps socket needs: a bounded linger,
// bounded inbound frames (ZMQ_MAXMSGSIZE), send and receive timeouts of
// timeout_ms. NULL on failure (logged).
void *zps_wire_socket(void *ctx, int type, int timeout_ms);

// The kernel's send buffer of a socket's TCP connections, in bytes; 0
// leaves the OS's autotuning (the default). A small one (--sndbuf) keeps
// the flows that share one host's link fair, which a parameter server
// needs: a shard's bucket is done only when every worker's flow brought
// it, so the slowest flow sets the pace. Connections made before the
// call keep their buffer. ZPS_EIO if ZeroMQ refuses (logged).
zps_err zps_wire_set_sndbuf(void *sock, int bytes);

// Complete messages ZeroMQ may take in from each peer before the caller
// reads them (0: no bound, zps_wire_socket's default). Past it ZeroMQ stops
// reading that peer's connection, and TCP holds the sender back. ZPS_EIO
// if ZeroMQ refuses (logged).
zps_err zps_wire_set_rcvhwm(void *sock, int messages);

void zps_wire_header_init(Zps__Header *h, Zps__MsgType type);

// Receives one whole multipart message (with its routing id first when
// router is true). ZPS_ETIMEDOUT if nothing came within the socket's receive
// timeout; ZPS_EPROTO if the header does not decode, has another protocol
// version or there are too many frames - m->has_route is then still valid.
// zps_wire_msg_fini(m) is needed after every call, whatever it returned.
zps_err zps_wire_recv(void *sock, bool router, zps_wire_msg *m);
void zps_wire_msg_fini(zps_wire_msg *m);
// Moves a received message to dst (to hold it for later); src is left
// empty, safe to zps_wire_msg_fini.
void zps_wire_msg_move(zps_wire_msg *dst, zps_wire_msg *src);

// A routing id kept to send to later: dst (not initialised) becomes a copy
// of src; close it with zps_wire_route_close. Both fail only on a bug.
void zps_wire_route_copy(zmq_msg_t *dst, zmq_msg_t *src);
void zps_wire_route_close(zmq_msg_t *r);
// Closes a socket and says so if ZeroMQ refuses (it only does for a
// pointer that is not a socket); *sock becomes NULL.
void zps_wire_close(void **sock);

// Sends a header and, if bytes > 0, a payload cut into frames. route is the
// peer's routing id on a ROUTER socket, NULL on a DEALER. With ref the
// payload is sent zero-copy (see above); without, it is copied. Whole or
// not at all: ZPS_ENOMEM or ZPS_EINVAL (a payload of more frames than a
// receiver takes) before anything is sent; ZPS_ETIMEDOUT if the first part
// could not go out within the send timeout; ZPS_EIO if the socket failed.
// Logged on failure.
zps_err zps_wire_send(void *sock, zmq_msg_t *route, const Zps__Header *h, const void *payload,
                      size_t bytes, zps_wire_ref *ref);

// Sends h and then frames[0, n_frames) (ZeroMQ messages of their own: a
// copy of a received frame shares its bytes), moved: each is left empty,
// sent or not, and the caller still closes them. ZPS_EINVAL for more than
// ZPS_WIRE_MAX_FRAMES.
zps_err zps_wire_send_frames(void *sock, zmq_msg_t *route, const Zps__Header *h,
                             zmq_msg_t *frames, int n_frames);

// Sends a header packed already (zps__header__pack), without payload, as
// zps_wire_send would send it: what an outbox (server/coord/zps_outbox.h) holds.
zps_err zps_wire_send_packed(void *sock, zmq_msg_t *route, const void *hdr, size_t len);

// The ERROR that answers a refused message: code and one line (why is
// borrowed by h), echoing its step.
void zps_wire_error_header(Zps__Header *h, uint64_t job_id, uint64_t step, zps_err code,
                           const char *why);
// Answers a refused message with ERROR (code and one line), echoing its step.
zps_err zps_wire_send_error(void *sock, zmq_msg_t *route, uint64_t job_id, uint64_t step,
                            zps_err code, const char *why);
// The ERROR answering a refused message, which it names (its type, step,
// shard, tensor range and slice echoed), so that its sender can tell which
// of its messages to send again.
zps_err zps_wire_send_refusal(void *sock, zmq_msg_t *route, uint64_t job_id,
                              const Zps__Header *refused, zps_err code, const char *why);

// Fault injection for tests (SQLite's FAULTSIM): the nth part (0 the
// first) of the next messages sent fails to be built (ZPS_WIRE_FAULT_BUILD,
// as if out of memory) or its first send is interrupted (ZPS_WIRE_FAULT_EINTR,
// as a signal does). -1 turns it off. Process-wide; never set in a daemon.
typedef enum zps_wire_fault { ZPS_WIRE_FAULT_BUILD, ZPS_WIRE_FAULT_EINTR } zps_wire_fault;
void zps_wire_inject_fault(zps_wire_fault kind, int nth);

// Checks that m carries a tensor of hdr->count elements of dtype (a
// zps_dtype) inside [lo, hi), whose frames hold whole elements and add up
// to exactly that many bytes. Writes the reason to why.
zps_err zps_wire_check_tensor(const zps_wire_msg *m, int dtype, uint64_t lo, uint64_t hi,
                              char *why, size_t why_len);

// Copies the payload of a checked tensor message to dst (payload_bytes).
void zps_wire_copy_payload(const zps_wire_msg *m, void *dst);

// Reads a tensor's payload frames as one array of elements of esize bytes
// (each frame holds whole elements), its frames where they lie.
typedef struct zps_wire_cursor {
    const zmq_msg_t *frames; // borrowed
    int n_frames;
    size_t esize;
    int f;                   // the frame of the last element asked for
    size_t at;               // the element frames[f] starts at
} zps_wire_cursor;

void zps_wire_cursor_init(zps_wire_cursor *c, const zmq_msg_t *frames, int n_frames,
                          size_t esize);
// Where element i lies; *len (at most, on entry) becomes the elements from
// i on that lie in the same frame, at least one (i must lie in a frame).
// Fastest when i only grows from call to call.
const uint8_t *zps_wire_cursor_at(zps_wire_cursor *c, size_t i, size_t *len);

// The message type's name for log lines ("PUSH"; "unknown" if none).
const char *zps_wire_type_name(int type);

// For a daemon's main(), before any thread starts: ZeroMQ allocates every
// received frame (up to ZPS_WIRE_FRAME_BYTES) in its I/O thread and the
// loop frees it. glibc serves frames over 128 KiB with mmap at first and
// gives the I/O thread's heap back to the kernel as soon as a step's
// frames are freed, so each frame of each step page-faults its memory
// again (about a page fault per 4 KiB received: a third of a shard's CPU
// time on a 2.7 MB step). Frames come from the heap, which keeps what
// it had, from here on. Process-wide, so libzps leaves it to the
// program (README: GLIBC_TUNABLES does the same for one's own process).
// A no-op without glibc.
void zps_wire_tune_malloc(void);

// Waits until ZeroMQ released every frame of ref, at most timeout_ms.
zps_err zps_wire_ref_wait(zps_wire_ref *ref, int timeout_ms);

#endif
