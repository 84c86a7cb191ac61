/* zps_member.c - the state machine of a member's life (see zps_member.h). */
#include "zps_member.h"

void zps_member_admit(zps_member_life *l)
{
    *l = (zps_member_life){.state = ZPS_MEMBER_JOINING};
}

void zps_member_admit_active(zps_member_life *l, uint64_t from)
{
    *l = (zps_member_life){.state = ZPS_MEMBER_ACTIVE, .from = from};
}

zps_err zps_member_activate(zps_member_life *l, uint64_t from)
{
    if (l->state == ZPS_MEMBER_JOINING || (l->state == ZPS_MEMBER_ACTIVE && from < l->from)) {
        l->state = ZPS_MEMBER_ACTIVE;
        l->from = from;
        return ZPS_OK;
    }
    return l->state == ZPS_MEMBER_ACTIVE ? ZPS_OK : ZPS_ESTATE;
}

zps_err zps_member_depart(zps_member_life *l, zps_member_exit why)
{
    switch (l->state) {
    case ZPS_MEMBER_JOINING:
        l->state = ZPS_MEMBER_GONE; // no plan named it: nothing to hand on
        break;
    case ZPS_MEMBER_ACTIVE:
        l->state = why == ZPS_EXIT_FINISHED ? ZPS_MEMBER_GONE : ZPS_MEMBER_LEAVING;
        break;
    default:
        return ZPS_ESTATE;
    }
    l->exit = why;
    return ZPS_OK;
}

void zps_member_retire(zps_member_life *l)
{
    if (l->state == ZPS_MEMBER_LEAVING) {
        l->state = ZPS_MEMBER_GONE;
    }
}

bool zps_member_may_compute(const zps_member_life *l, uint64_t step)
{
    return l->state == ZPS_MEMBER_ACTIVE && l->from <= step;
}

bool zps_member_planned(const zps_member_life *l)
{
    return l->state == ZPS_MEMBER_JOINING || l->state == ZPS_MEMBER_ACTIVE;
}

bool zps_member_live(const zps_member_life *l)
{
    return zps_member_planned(l);
}

const char *zps_member_state_name(zps_member_state s)
{
    static const char *names[] = {"joining", "active", "leaving", "gone"};
    return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "?";
}
