/* zps_coord_int.h - what the coordinator's files share, and the one header
 * of the coordinator they include: it brings zps_coord.h (the coordinator
 * as the loop, the tests and the fuzzer see it) and the modules the
 * coordinator is made of (a member's life, the evaluation, the monitor,
 * the outbox). Nothing outside server/coord/ includes it.
 *
 * The coordinator is one object in several files, one per concern. Calls
 * go one way, up this list: a file calls only those before it.
 *
 *   zps_coord.c          the object, its clock, refusals, the message
 *                        table's questions, pushes and shards' steps noted
 *   zps_coord_hosts.c    boot ids, ranks grouped by host, workers' host groups
 *   zps_coord_plan.c     plans, handed-over slices, step boundaries
 *   zps_coord_policy.c   adaptive split, speculation
 *   zps_coord_norm.c     --clip-grad-norm: the shards' sums of squares, the norm
 *   zps_coord_recover.c  shards registering and restarting, rollback
 *   zps_coord_members.c  admission, heartbeats, departures, eviction
 *   zps_coord_render.c   STATUS, /metrics, /status, the metrics-log line
 *   zps_coord_state.c    the job state saved beside the checkpoints
 *   zps_coord_tick.c     the tick's deadlines and lines, a step's end
 *
 * None sends: each appends to the outbox it is given. */
#ifndef ZPS_COORD_INT_H
#define ZPS_COORD_INT_H

#include "server/coord/zps_coord.h"

#include "common/zps_log.h"
#include "common/zps_plans.h"
#include "common/zps_shm.h"
#include "common/zps_sumsq.h"
#include "server/coord/zps_eval.h"
#include "server/coord/zps_member.h"
#include "server/coord/zps_monitor.h"
#include "server/coord/zps_outbox.h"

#define ZPS_COORD_PROGRESS_MS 2000.0
#define ZPS_COORD_WAIT_LOG_MS 5000.0

// After the last step, how long members get to send results and goodbyes.
#define ZPS_COORD_END_GRACE_MS 60000.0

// The longest between two looks for silent members (zps_coord_tick.c).
#define ZPS_COORD_SILENT_SCAN_MS 1000.0

// WAITING for workers and shards, ASSIGNING ranges to the other shards
// (workers get the job once every shard serves), TRAINING, DONE.
// RECOVERING: restarted from a checkpoint, waiting for shards and workers
// to come back before everyone rolls back to it.
typedef enum zps_coord_phase {
    ZPS_COORD_WAITING,
    ZPS_COORD_ASSIGNING,
    ZPS_COORD_TRAINING,
    ZPS_COORD_DONE,
    ZPS_COORD_RECOVERING
} zps_coord_phase;

typedef struct zps_coord_member {
    uint32_t rank;        // position in the plan
    uint64_t member_id;   // secret-ish id its pushes carry
    char host[64];        // reported by the worker
    char device[32];      // reported by the worker
    uint32_t share;       // fixed share asked for, 0 for "split the rest"
    uint32_t pid;         // worker process id on its host
    zmq_msg_t route;      // routing id on shard 0's socket (for JOB)
    zps_member_life life; // joining, active from a step, leaving, gone (zps_member.h)
    uint64_t pushes;      // pushes seen on shard 0
    float compute_ms;     // last push's compute time
    bool has_job;         // was sent its JOB: plans go to it from now on
    bool route_known;     // route is valid (false after a coordinator restart until it calls)
    uint32_t adapted;     // share from the adaptive split (0: none)
    uint32_t inner_steps; // diloco --inner-steps auto: its own, by DyLU (0: the job's H)
    uint64_t covered;     // its slices of steps before this one were also handed to others
    double last_seen_ms;  // last message from it (heartbeats included)
    char boot_id[ZPS_SHM_BOOT_ID_LEN]; // its host, as its HELLO said ("": unknown)
} zps_coord_member;

// --clip-grad-norm: the shards' parts of a step's sum of squares, until
// every shard's is in. A slot per step in flight: a shard's partial of a
// step no other shard is at yet (a rollback crossing it) waits in its own.
#define ZPS_COORD_NORM_SLOTS 4

typedef struct zps_coord_norm_slot {
    bool used;                        // slot taken
    uint64_t step;                    // the step
    bool in[ZPS_MAX_SHARDS];          // shard's part arrived
    uint32_t n_in;                    // of them
    zps_sumsq part[ZPS_MAX_SHARDS];   // each shard's part (a second copy replaces the first)
    double since_ms;                  // when the first part came
} zps_coord_norm_slot;

typedef struct zps_coord_peer {
    bool registered;     // REGISTER received
    bool ready;          // READY received
    uint64_t token;      // the secret its ASSIGN carries and its messages must (0: none yet)
    char public_key[41]; // CURVE: the key it listens with, for workers ("" if the server's)
    char endpoint[256];  // where workers reach it
    zmq_msg_t route;     // routing id on shard 0's socket (for ASSIGN)
    uint64_t lo, hi;     // its range
    char boot_id[ZPS_SHM_BOOT_ID_LEN]; // its host, as its REGISTER said ("": unknown)
} zps_coord_peer;

// A plan's members of known host, for their host groups (zps_coord_hosts.c).
typedef struct zps_coord_host_ent {
    const char *boot; // borrowed: the member's boot id
    uint32_t rank;    // its rank
    uint32_t pos;     // its place in the plan
} zps_coord_host_ent;

// The host groups of one plan generation, made once for all its workers.
typedef struct zps_coord_hosts {
    uint32_t gen;                               // generation they are of (0: none)
    zps_coord_host_ent ent[ZPS_MAX_MEMBERS];    // by boot id, then rank
    uint32_t lo[ZPS_MAX_MEMBERS];               // by plan place: its group's first in ent
    uint8_t n[ZPS_MAX_MEMBERS];                 // by plan place: its group's size (0: none)
} zps_coord_hosts;

// A worker's HostGroup, filled in place before the message is packed.
typedef struct zps_coord_group_wire {
    Zps__HostGroup group;
    Zps__HostMember members[ZPS_HOST_GROUP_MAX];
    Zps__HostMember *ptrs[ZPS_HOST_GROUP_MAX];
} zps_coord_group_wire;

struct zps_coord {
    zps_coord_cfg cfg;                  // copy; strings borrowed
    uint64_t job_id;                    // random per run
    zps_coord_phase state;                      // waiting, training, done
    uint32_t n_members;                 // admitted
    zps_coord_member members[ZPS_MAX_MEMBERS];  // in rank order
    zps_coord_peer shards[ZPS_MAX_SHARDS]; // [0] is this process
    uint32_t n_registered;              // shards here, this one included
    uint32_t n_ready;                   // shards serving, this one included
    zps_plans plans;                    // generations still in use, the newest included,
                                        // and the slices of steps in progress handed over
    uint32_t gen;                       // the newest generation made (1: the first plan)
    bool pending;                       // members came or went: re-plan at the next boundary
    uint64_t membership_changes;        // joins, departures and adapted splits, counted
    uint64_t replans;                   // plan generations made after the first
    uint64_t replans_step;              // the step boundary of the newest re-plan
    uint64_t released;                  // the newest step whose parameters shard 0 began to send
    uint64_t shard_done[ZPS_MAX_SHARDS]; // steps each shard completed
    uint64_t evictions;                 // members evicted for silence
    double next_silent_scan_ms;         // no member can fall silent past its timeout before
                                        // this (0: look at the next tick)
    zps_monitor *mon;                   // owned: lag, stragglers, throughput
    double recover_deadline_ms;         // RECOVERING: when to go on without the missing
    bool rollback_pending;              // shard 0 must restore rollback_step
    uint64_t rollback_step;
    uint64_t steps_done;                // last step_done + 1
    float last_loss;
    double last_step_ms;
    zps_eval *eval;                     // owned: the epoch's evaluation being gathered
    double next_log_ms;                 // next progress or waiting line
    double done_ms;                     // when the last step completed
    double started_ms;                  // when this start began training: step 0 planned,
                                        // or the resumed job rolled back (monotonic)
    uint64_t started_step;              // the step it began training from
    uint64_t steps_run;                 // steps this start completed, replays included
    uint64_t job_started_unix_ms;       // wall clock of the job's first start (0: unknown)
    uint32_t starts;                    // this start's number (1: first; 0: unknown)
    double sum_step_ms;                 // for the mean in the progress line
    uint64_t n_step_ms;
    zps_log_limit refusals;             // bounds the lines refused messages cause
    zps_coord_norm_slot norms[ZPS_COORD_NORM_SLOTS]; // --clip-grad-norm: parts gathering
    bool has_grad_norm;                 // a step's norm was computed (grad_norm is valid)
    uint64_t grad_norm_step;            // the step of the newest norm
    float grad_norm;                    // its value, before clipping
    bool norm_for_shard0;               // shard 0 has not taken the newest norm yet
    double next_norm_log_ms;            // next "waiting for the gradient norm" line
    bool bad_boot_id_logged;            // a peer's bad boot id was said (once)
    zps_coord_hosts hosts;              // the host groups of the newest plan sent
};

// zps_coord.c
double zps_coord_now(const zps_coord *c);
// The epoch that `step`'s first global batch belongs to (diloco: a step is
// a round of H of them).
uint64_t zps_coord_epoch(const zps_coord *c, uint64_t step);
void zps_coord_refuse(zps_coord *c, zps_outbox *out, zps_wire_msg *m, zps_err err,
                      const char *why);

// zps_coord_hosts.c
// A peer's boot id into out if it is 1 to 39 of [A-Za-z0-9._-], else ""
// (unknown), said once; who names the peer for that line.
void zps_coord_take_boot_id(zps_coord *c, char out[ZPS_SHM_BOOT_ID_LEN], const char *v,
                            const char *who);
// At the first start, before the first plan: members of one host get
// consecutive ranks (rank = index after).
void zps_coord_group_ranks(zps_coord *c);
// mem's host group in generation g's plan, filled into w: the plan's
// members of its boot id in rank order, cut into groups of at most
// ZPS_HOST_GROUP_MAX; NULL if it is alone in its group, its host is
// unknown, or --host-aggregate is off.
Zps__HostGroup *zps_coord_host_group(zps_coord *c, const zps_plan_gen *g,
                                     const zps_coord_member *mem, zps_coord_group_wire *w);

// zps_coord_plan.c
void zps_coord_broadcast(zps_coord *c, zps_outbox *out, Zps__MsgType type, uint64_t step);
bool zps_coord_can_take(const zps_coord_member *mem, uint64_t step);
bool zps_coord_commit(zps_coord *c, uint64_t effective);
void zps_coord_extra_to_wire(const zps_plans_handed *e, Zps__Extra *w);
uint64_t zps_coord_global_done(const zps_coord *c);
uint32_t zps_coord_live_flexible(const zps_coord *c);
uint32_t zps_coord_live_members(const zps_coord *c);
zps_err zps_coord_make_plan(zps_coord *c, zps_plan *out);
const zps_plan_gen *zps_coord_newest(const zps_coord *c);
void zps_coord_note_change(zps_coord *c);
// The plan as wire slices into slices/ptrs, and how many: every slice (for
// a shard, only NULL; room for plan->n), or only's own (0 or 1).
size_t zps_coord_plan_to_wire(const zps_plan *plan, const zps_coord_member *only,
                              Zps__Slice *slices, Zps__Slice **ptrs);
void zps_coord_reassign(zps_coord *c, zps_outbox *out);
void zps_coord_send_job(zps_coord *c, zps_outbox *out, zmq_msg_t *route, Zps__MsgType type,
                        zps_coord_member *mem, uint64_t shard_token);
void zps_coord_send_new_jobs(zps_coord *c, zps_outbox *out);
zps_err zps_coord_start(zps_coord *c, zps_outbox *out);
void zps_coord_start_workers(zps_coord *c, zps_outbox *out);

// zps_coord_recover.c
void zps_coord_try_recover(zps_coord *c, zps_outbox *out, bool deadline_passed);

// zps_coord_norm.c
void zps_coord_norm_forget_from(zps_coord *c, uint64_t step);
void zps_coord_norm_tick(zps_coord *c, double now_ms);

// zps_coord_members.c
// Whether a HELLO's device names a GPU ("cuda", "cuda:1", "torch-cuda:0"),
// for --deterministic's one device class; anything else counts as a CPU.
bool zps_coord_device_gpu(const char *device);
void zps_coord_evict(zps_coord *c, zps_outbox *out, zps_coord_member *mem, double now_ms);
zps_coord_member *zps_coord_member_by_id(zps_coord *c, uint64_t member_id);
// The member of rank `rank` if its id is member_id (an index, no scan), or NULL.
zps_coord_member *zps_coord_member_at(zps_coord *c, uint32_t rank, uint64_t member_id);

// zps_coord_render.c
void zps_coord_member_to_wire(const zps_coord_member *s, Zps__Member *out);
void zps_coord_log_step(zps_coord *c, uint64_t step, float loss, double step_ms,
                        const uint32_t *counted);

#endif
