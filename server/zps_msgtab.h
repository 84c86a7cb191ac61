/* zps_msgtab.h - the one table of who may send which message to a server,
 * with which credential, and when; and the check of a message against it.
 *
 * The server loop checks every decoded message here before any handler
 * runs (zps_server.c, s_dispatch), so a well-formed lie from a peer without
 * the credential reaches no handler and changes nothing. For every type:
 *
 *   - who sends it: anyone (HELLO, STATUS, REGISTER of a shard not yet
 *     assigned), an admitted worker, a registered shard, or nobody (what
 *     only the coordinator or shards send: JOB, PARAMS, ASSIGN, PLAN,
 *     ROLLBACK, STATUS_REPLY, ERROR, and unknown types);
 *   - which CURVE roles may send it, when CURVE is on: the ZAP handler
 *     gives each connection the roles of its key as its User-Id
 *     (server/zps_zap.h), a worker key cannot send what shards send, an
 *     operator key only STATUS;
 *   - the credential it carries: a worker's rank and member id (issued at
 *     admission, never shown by STATUS), or a shard's index and secret
 *     token (issued with its ASSIGN, server/zps_token.h);
 *   - the states in which the receiver takes it;
 *   - whether it carries this job's id, and whether its sender waits for
 *     an answer (a refusal then gets an ERROR; otherwise it is dropped).
 *
 * Socket-free: what the check must know of the receiver (is this an
 * admitted member, is this the shard's token) it asks through callbacks,
 * which the unit tests answer with fakes. */
#ifndef ZPS_MSGTAB_H
#define ZPS_MSGTAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/zps_err.h"
#include "proto/zps.pb-c.h"

// What a connection's CURVE key may act as (bits).
typedef enum zps_role {
    ZPS_ROLE_WORKER = 1u << 0,   // --authorized-keys
    ZPS_ROLE_SHARD = 1u << 1,    // --shard-keys, and the server's own key
    ZPS_ROLE_OPERATOR = 1u << 2, // --operator-keys: STATUS only
} zps_role;
#define ZPS_ROLES_ANY (ZPS_ROLE_WORKER | ZPS_ROLE_SHARD | ZPS_ROLE_OPERATOR)

// Who may send a type, whatever the transport.
typedef enum zps_sender {
    ZPS_FROM_NOBODY, // only coordinators and shards send it, never to a server
    ZPS_FROM_ANYONE, // no credential
    ZPS_FROM_WORKER, // an admitted worker
    ZPS_FROM_SHARD,  // a registered shard (anyone for a REGISTER before assignment)
} zps_sender;

// The credential a type carries.
typedef enum zps_cred {
    ZPS_CRED_NONE,
    ZPS_CRED_MEMBER,            // rank + member id of a worker the coordinator admitted
    ZPS_CRED_PLAN_MEMBER,       // rank + member id of a member of a plan this shard knows
    ZPS_CRED_SHARD_TOKEN,       // shard index + the token of its ASSIGN
    ZPS_CRED_TOKEN_IF_ASSIGNED, // REGISTER: the token, once that shard is assigned
} zps_cred;

// Where and when a message arrives: the coordinator's states (shard 0),
// or a shard 1..N-1 before and after its assignment. Bits, so that a rule
// names the states it allows.
typedef enum zps_at {
    ZPS_AT_WAITING = 1u << 0,    // shard 0: workers and shards still to come
    ZPS_AT_ASSIGNING = 1u << 1,  // shard 0: ranges sent, READY awaited
    ZPS_AT_TRAINING = 1u << 2,   // shard 0: steps running
    ZPS_AT_DONE = 1u << 3,       // shard 0: last step done, members finishing
    ZPS_AT_RECOVERING = 1u << 4, // shard 0: restarted, waiting for shards and workers
    ZPS_AT_UNASSIGNED = 1u << 5, // shard > 0: no range yet
    ZPS_AT_SERVING = 1u << 6,    // shard > 0: serving its range
} zps_at;
#define ZPS_AT_COORDINATOR \
    (ZPS_AT_WAITING | ZPS_AT_ASSIGNING | ZPS_AT_TRAINING | ZPS_AT_DONE | ZPS_AT_RECOVERING)
#define ZPS_AT_ALL (ZPS_AT_COORDINATOR | ZPS_AT_UNASSIGNED | ZPS_AT_SERVING)

// One row of the table.
typedef struct zps_msgtab_rule {
    zps_sender from;  // who sends it
    uint8_t roles;    // CURVE roles that may send it (zps_role bits)
    zps_cred cred;    // what it must carry
    uint32_t at;      // zps_at bits: where it is taken
    bool job_id;      // must carry this job's id
    bool reply;       // the sender waits: a refusal is answered with ERROR
} zps_msgtab_rule;

// The rule for a message type; an unknown type gets the rule of the types
// nobody sends. Never NULL.
const zps_msgtab_rule *zps_msgtab_rule_of(int type);

// The name of one zps_at bit ("training"), for log lines.
const char *zps_msgtab_at_name(uint32_t at);

// The receiver, as the check needs to know it. Callbacks a rule needs must
// be set; arg is passed to each.
typedef struct zps_msgtab_ctx {
    uint32_t at;     // one zps_at bit: the receiver's state now
    bool curve;      // CURVE on: a connection's roles come from its User-Id
    uint64_t job_id; // this job's id (what a shard > 0 knows once assigned)
    void *arg;
    // The coordinator admitted a worker with this rank and member id.
    bool (*member_ok)(void *arg, uint32_t rank, uint64_t member_id);
    // A plan this shard knows has this rank with this member id.
    bool (*plan_member_ok)(void *arg, uint32_t rank, uint64_t member_id);
    // The newest plan generation this shard knows: a PUSH of a newer one
    // is held until its plan comes, and checked again then.
    uint32_t (*newest_generation)(void *arg);
    // Shard `index` was assigned (has a token on record, or should have).
    bool (*shard_assigned)(void *arg, uint32_t index);
    // `token` is shard `index`'s.
    bool (*shard_token_ok)(void *arg, uint32_t index, uint64_t token);
} zps_msgtab_ctx;

// The roles of a connection: every role without CURVE (there, only
// credentials tell peers apart); with CURVE those the User-Id names
// ("worker", "shard,operator", ...), none for anything else.
uint8_t zps_msgtab_roles(bool curve, const char *user_id);

// Checks a decoded header, from a connection with the given User-Id ("" if
// none), against the table, in this order: a type somebody sends, the
// role, the state, the job id, the bounds of the rank or shard index, the
// credential. ZPS_OK, or the refusal's code with one line in why:
// ZPS_EPROTO (nobody sends that type; a REGISTER whose header and body
// name different shards), ZPS_EPERM (the role, or a missing or wrong shard
// token), ZPS_ESTATE, ZPS_EJOB, ZPS_ERANGE, ZPS_ENOENT (no such member).
zps_err zps_msgtab_check(const zps_msgtab_ctx *x, const Zps__Header *h, const char *user_id,
                         char *why, size_t why_len);

// Whom a message claims to come from, for a refusal's log line: "rank 3",
// "shard 1", or "" for types that name nobody.
void zps_msgtab_claim(const Zps__Header *h, char *out, size_t len);

#endif
