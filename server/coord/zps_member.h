/* zps_member.h - the life of one member of a job, as the coordinator sees it.
 *
 * Work, not workers, is the unit (DESIGN.md): a piece of step S may only
 * go to a member that holds, or can pull, step S's parameters and will
 * compute step S. That is what "active from step S" means, and it is the
 * one question the coordinator asks before handing anything to anyone:
 *
 *   JOINING --(the plan of the next step boundary names it)--> ACTIVE from S
 *   JOINING --(nobody else can compute the stuck step S)-----> ACTIVE from S
 *   ACTIVE  --(BYE before the end, or silent too long)-------> LEAVING
 *   JOINING --(BYE or silent before any plan named it)-------> GONE
 *   LEAVING --(no plan of a step in progress names it)-------> GONE
 *   ACTIVE  --(BYE after the last step)----------------------> GONE
 *   ACTIVE from S --(rollback to R < S)----------------------> ACTIVE from R
 *
 * A member that joins while step S-1 is in progress is JOINING and never
 * owns work of step S-1: the others' pieces of that step go to members
 * active by then. Socket-free; the coordinator keeps the routes. */
#ifndef ZPS_MEMBER_H
#define ZPS_MEMBER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/zps_err.h"

typedef enum zps_member_state {
    ZPS_MEMBER_JOINING = 0, // admitted; in the plan of the next step boundary
    ZPS_MEMBER_ACTIVE,      // computes its slice of every step from `from` on
    ZPS_MEMBER_LEAVING,     // gone, but a plan of a step in progress still names it
    ZPS_MEMBER_GONE,        // in no plan still in use
} zps_member_state;

typedef enum zps_member_exit {
    ZPS_EXIT_NONE = 0,  // still here
    ZPS_EXIT_EVICTED,   // silent past the worker timeout
    ZPS_EXIT_LEFT,      // said BYE before the last step (stopped by its supervisor)
    ZPS_EXIT_FINISHED,  // said BYE after the last step
} zps_member_exit;

typedef struct zps_member_life {
    zps_member_state state; // where it is in its life
    uint64_t from;          // ACTIVE (and LEAVING): the first step it computes
    zps_member_exit exit;   // LEAVING and GONE: why
} zps_member_life;

// A member admitted now (JOINING), or one active from step 0 or from a
// resumed step (a restarted coordinator's members).
void zps_member_admit(zps_member_life *l);
void zps_member_admit_active(zps_member_life *l, uint64_t from);

// JOINING -> ACTIVE from `from`; ACTIVE from a later step -> ACTIVE from
// `from` (a rollback). ZPS_ESTATE for a member that is not here.
zps_err zps_member_activate(zps_member_life *l, uint64_t from);
// It left or fell silent: ACTIVE -> LEAVING (FINISHED: -> GONE), JOINING
// -> GONE. ZPS_ESTATE if it had gone already.
zps_err zps_member_depart(zps_member_life *l, zps_member_exit why);
// LEAVING -> GONE: no plan still in use names it.
void zps_member_retire(zps_member_life *l);

// May be handed work of `step`: active from that step or before.
bool zps_member_may_compute(const zps_member_life *l, uint64_t step);
// Goes into the next plan: joining or active.
bool zps_member_planned(const zps_member_life *l);
// For STATUS and the job state: joining or active.
bool zps_member_live(const zps_member_life *l);
const char *zps_member_state_name(zps_member_state s);

#endif
