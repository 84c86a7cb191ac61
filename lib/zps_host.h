/* zps_host.h - one push per host (docs/choices.md, "One push per host").
 *
 * The members of a plan on one host (the same boot id, common/zps_shm.h)
 * form a group whose lowest rank leads. For every shard on another host a
 * follower hands its own piece's pushes to the leader instead of sending
 * them across: the values in a shared-memory segment of its own (as a
 * same-host shard takes pushes), the header on a unix socket of the host;
 * as frames on that socket where the leader cannot map the segment, or in
 * a deterministic job (several nodes of one bucket a step). The leader
 * sums the pieces of a bucket that adjoin in the batch (weighted by
 * samples; in a deterministic job as sibling nodes of the tree, which is
 * what the shard would add) and pushes once for them, naming each
 * member's piece so the shard credits it; the shard answers the leader
 * with the parameters, which the leader passes on to its followers: one
 * push and one pull per host and shard. The leader says HOST_ACK to a
 * follower once it holds the follower's part of a step (or that it
 * could not map it: the follower sends it again as frames). A follower
 * whose part the leader did not take for a while asks it (HOST_ACK,
 * ZPS_HOST_ASK), and pushes its piece itself once the leader answers that
 * it left it (ZPS_HOST_LEFT): an ack sent but not yet read when a
 * follower gave up on its own had put one piece in two pushes, and the
 * shard refuses a sum partly counted whole. A leader that is gone is a
 * member failure like any other: a follower whose leader's connection
 * closed, or whose next plan names another leader, computes its piece
 * again and pushes it itself, as it does a push refused "not yet", and the
 * shards count the first copy of every sample. Once its part is taken, or
 * while its question is not answered, a follower waits as any worker
 * does: a step slow for others (thousands of members starting, a
 * straggler on another host) is not the leader's failure.
 *
 * The state lives in the client (lib/zps_client_int.h); its calls are
 * there, with the loop's other rooms. lib/zps_host.c holds the group, its
 * socket and the timers; zps_host_sum.c a member's push and the leader's
 * sums; zps_host_serve.c the leader's socket (lib/zps_host_int.h: what
 * they call of one another). */
#ifndef ZPS_HOST_H
#define ZPS_HOST_H

#include <stdbool.h>
#include <stdint.h>
#include <zmq.h>

#include "common/zps_plan.h"
#include "common/zps_shm.h"
#include "common/zps_wire.h"
#include "common/zps_zcode.h"
#include "lib/zps_conn.h"
#include "lib/zps_schedule.h"

#define ZPS_HOST_FLUSH_MIN_MS 2000.0   // a leader pushes what it has after this at least
#define ZPS_HOST_GIVE_UP_MIN_MS 6000.0 // a follower asks its leader after this at least
#define ZPS_HOST_RETRY_MAX_STEPS 64     // one that pushed for itself tries its leader again
                                       // at most this many steps on

// HOST_ACK's flags: the leader's answer (0: your part of the step is in my
// hands; LEFT: it is not, push it yourself), or a follower's question.
#define ZPS_HOST_ASK 1u  // follower -> leader: is my part of `step` in your hands?
#define ZPS_HOST_LEFT 2u // leader -> follower: no, and it will not be: push it yourself

// One member's push that the leader holds: a bucket's values for a part
// of the batch (the member's piece, or a node of it in a deterministic job).
typedef struct zps_host_part {
    uint32_t member;          // its index in the group
    uint32_t offset, samples; // the part of the batch
    uint32_t piece;           // samples of the member's whole piece
    float loss, compute_ms;   // of the piece, as the member says
    zps_wire_msg m;           // owned: the values, in frames of the wire dtype
    bool view;                // m's frame lies in the member's segment: read, never sent
} zps_host_part;

// A bucket of one shard, as the leader sums it for the step.
typedef struct zps_host_bucket {
    zps_host_part *parts; // owned: n of cap
    int n, cap;
    uint64_t seen;        // members with a part in
    uint64_t in, expected; // samples in, and the pieces of the members seen
    bool flushed;         // pushed: a part that comes later is pushed alone
} zps_host_bucket;

typedef struct zps_host {
    // The group of the newest plan (n < 2: none).
    uint32_t gen;                        // its generation
    int n;                               // members
    uint32_t ranks[ZPS_HOST_GROUP_MAX];  // rank order; ranks[0] leads
    int me;                              // this worker's index
    bool remote[ZPS_CONN_MAX_SHARDS];    // shard i is on another host: pushes go through the leader
    void *sock;                          // owned: the leader's ROUTER, or a follower's DEALER to it
    void *mon;                           // owned: a follower's: events of sock (the leader gone)
    uint32_t sock_leader;                // the leader rank sock is of
    bool bound;                          // sock is this leader's, bound at endpoint
    char endpoint[160];                  // its address (ipc://)
    bool off;                            // no socket here (logged): every worker pushes itself
    // The leader's: the step being summed, its buckets, who to pass parameters to.
    uint64_t step;
    bool active;                         // some part of `step` came in
    double first_ms;                     // when the first did
    zps_host_bucket *buckets[ZPS_CONN_MAX_SHARDS]; // owned: each shard's n_buckets
    zmq_msg_t route[ZPS_HOST_GROUP_MAX]; // each follower's routing id
    bool has_route[ZPS_HOST_GROUP_MAX];
    uint64_t acked[ZPS_HOST_GROUP_MAX];  // 1 + the step each follower was last told is in
    uint64_t left[ZPS_HOST_GROUP_MAX];   // 1 + a step whose parts are left to the follower
    uint64_t absent;                     // members not waited for: none of their parts came
                                         // before a step was pushed on the timer, and none since
    // A follower's: the piece it handed to the leader.
    uint64_t sent;                       // 1 + its step (0: none waiting)
    zps_piece sent_piece;
    double sent_ms;
    double give_up_ms;                   // asks the leader about it this long after sent_ms
                                         // (and after each question), if not taken
    bool taken;                          // the leader said HOST_ACK for it
    double asked_ms;                     // when the leader was last asked about it (0: never)
    bool reached;                        // a part went to this socket's leader
    uint64_t retry;                      // gave up on the leader (0: not): pushes itself until
                                         // the first part of step retry - 1 tries it again
    uint32_t backoff;                    // steps from a give-up on a leader reached to that
                                         // try: 1, 2, 4, ... ZPS_HOST_RETRY_MAX_STEPS; 1 again
                                         // once a part is taken (0 is 1)
    // A follower's parts through shared memory: element e of the model for
    // step s at ((s & 1) * n_params + e) * esize. The half of step s is
    // written again at s + 2, once the shards answered s + 1, which they do
    // only after the leader pushed (or gave up on) what it read of s.
    bool shm;                            // on: not ZPS_SHM_HOST=off, nor --shm off
    zps_shm_seg seg;                     // owned: created at the first part, kept while the worker runs
    uint64_t seg_step;                   // 1 + the step whose parts are in seg
    uint32_t seg_offset, seg_samples;    // their part of the batch: another of the step goes as frames
    bool seg_refused;                    // the leader could not map seg: frames until a new group
    // The leader's: each follower's segment, mapped at its first part of
    // the group and unmapped when the group changes, its parts pushed.
    zps_shm_map maps[ZPS_HOST_GROUP_MAX];
    // --wire-code zstd (lib/zps_host_code.c): a leader codes its pushes,
    // and keeps the parameters the shards elsewhere sent it as they came,
    // for their answers coded as the change from them.
    bool codes;                          // the job codes
    zps_zcode *code;                     // owned: made at the first push coded
    float *code_vals;                    // owned: n_params, of the shards elsewhere
    uint64_t *code_steps[ZPS_CONN_MAX_SHARDS]; // owned: per bucket, 1 + the step code_vals
                                         // holds of it (0: none)
    uint64_t code_step[ZPS_CONN_MAX_SHARDS]; // 1 + the step pushed to shard i, and the
    uint64_t code_base[ZPS_CONN_MAX_SHARDS]; // code_base its first push said: every push of
                                         // the step says the same (answers come meanwhile)
    uint64_t code_pulled[ZPS_CONN_MAX_SHARDS]; // 1 + the step asked for again uncoded
    uint64_t coded_out, coded_in;        // pushes coded; buckets decoded against code_vals
} zps_host;

// Frees what the state holds and closes its socket; zeroed memory is an
// empty state, and this is safe on it and twice.
void zps_host_fini(zps_host *h);

#endif
