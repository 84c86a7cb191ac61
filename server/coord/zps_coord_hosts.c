/* zps_coord_hosts.c - hosts: the boot ids peers say, ranks grouped by host
 * at the first start, and each worker's host group in a plan (--host-aggregate;
 * docs/choices.md, "One push per host"). */
#include "zps_coord_int.h"

#include <stdlib.h>
#include <string.h>

void zps_coord_take_boot_id(zps_coord *c, char out[ZPS_SHM_BOOT_ID_LEN], const char *v,
                            const char *who)
{
    bool ok = !v || !v[0] || zps_shm_boot_id_ok(v); // none said: unknown, not bad
    snprintf(out, ZPS_SHM_BOOT_ID_LEN, "%s", ok && v ? v : "");
    if (!ok && !c->bad_boot_id_logged) {
        // Unknown is safe (no group, pushes to every shard): said once,
        // not for every peer of a misconfigured fleet.
        c->bad_boot_id_logged = true;
        zps_log_warn("%s sent a boot id that is not 1 to %d of [A-Za-z0-9._-]: its host is "
                     "taken as unknown (further ones not logged)", who, ZPS_SHM_BOOT_ID_LEN - 1);
    }
}

// A member's place in the regrouping: its host's first member (its own
// index when its host is unknown) and its own join index.
typedef struct s_key {
    const char *boot;
    uint32_t host;
    uint32_t index;
} s_key;

static int s_by_boot(const void *a, const void *b)
{
    const s_key *x = a, *y = b;
    int d = strcmp(x->boot, y->boot);
    return d ? d : (x->index > y->index) - (x->index < y->index);
}

static int s_by_host(const void *a, const void *b)
{
    const s_key *x = a, *y = b;
    if (x->host != y->host) {
        return (x->host > y->host) - (x->host < y->host);
    }
    return (x->index > y->index) - (x->index < y->index);
}

// Each member's host key: the join index of its host's first member.
static void s_host_keys(const zps_coord *c, s_key *keys)
{
    uint32_t n = c->n_members;
    for (uint32_t i = 0; i < n; i++) {
        keys[i] = (s_key){.boot = c->members[i].boot_id, .host = i, .index = i};
    }
    qsort(keys, n, sizeof *keys, s_by_boot);
    for (uint32_t i = 1; i < n; i++) {
        if (keys[i].boot[0] && strcmp(keys[i].boot, keys[i - 1].boot) == 0) {
            keys[i].host = keys[i - 1].host; // sorted by index within a boot id
        }
    }
    qsort(keys, n, sizeof *keys, s_by_host);
}

void zps_coord_group_ranks(zps_coord *c)
{
    // A host's leader can sum only adjacent slices into one push, and the
    // slices tile the batch in rank order: a host's members get consecutive
    // ranks. Hosts keep the order of their first member's join, members of
    // a host their join order, and members of unknown host their place.
    uint32_t n = c->n_members;
    s_key *keys = malloc((n ? n : 1) * sizeof *keys);
    zps_coord_member *was = malloc((n ? n : 1) * sizeof *was);
    if (!keys || !was) {
        zps_log_warn("no memory to group ranks by host: ranks stay in join order");
        free(keys);
        free(was);
        return;
    }
    s_host_keys(c, keys);
    bool moved = false;
    // Moved byte for byte: a route (zmq_msg_t) does not point at itself,
    // and each is in exactly one place after.
    memcpy(was, c->members, n * sizeof *was);
    for (uint32_t i = 0; i < n; i++) {
        moved = moved || keys[i].index != i;
        c->members[i] = was[keys[i].index];
        c->members[i].rank = i;
    }
    free(keys);
    free(was);
    if (moved) {
        zps_log_info("ranks regrouped by host: the workers of one host have consecutive ranks");
    }
}

static int s_by_boot_ent(const void *a, const void *b)
{
    const zps_coord_host_ent *x = a, *y = b;
    int d = strcmp(x->boot, y->boot);
    return d ? d : (x->rank > y->rank) - (x->rank < y->rank);
}

// One pass over the plan: its members of known host, by boot id then rank,
// cut into groups of at most ZPS_HOST_GROUP_MAX, and each plan position's
// group; linear in the plan but for the sort, once per generation.
static void s_hosts_of(zps_coord *c, const zps_plan_gen *g)
{
    zps_coord_hosts *h = &c->hosts;
    uint32_t n = 0;
    for (uint32_t i = 0; i < g->plan.n; i++) {
        const zps_coord_member *mem = &c->members[g->plan.slices[i].rank];
        h->n[i] = 0;
        if (mem->boot_id[0]) {
            h->ent[n++] = (zps_coord_host_ent){.boot = mem->boot_id, .rank = mem->rank, .pos = i};
        }
    }
    qsort(h->ent, n, sizeof h->ent[0], s_by_boot_ent);
    for (uint32_t lo = 0; lo < n;) {
        uint32_t hi = lo + 1;
        while (hi < n && hi - lo < ZPS_HOST_GROUP_MAX &&
               strcmp(h->ent[hi].boot, h->ent[lo].boot) == 0) {
            hi++;
        }
        for (uint32_t k = lo; k < hi; k++) {
            h->lo[h->ent[k].pos] = lo;
            h->n[h->ent[k].pos] = (uint8_t)(hi - lo);
        }
        lo = hi;
    }
    h->gen = g->gen;
}

// Whether some shard is on another host than boot (or does not say where
// it is): only then has a group anything to push for its host.
static bool s_shard_elsewhere(const zps_coord *c, const char *boot)
{
    for (uint32_t i = 0; i < c->cfg.shards; i++) {
        if (!c->shards[i].boot_id[0] || strcmp(c->shards[i].boot_id, boot) != 0) {
            return true;
        }
    }
    return false;
}

Zps__HostGroup *zps_coord_host_group(zps_coord *c, const zps_plan_gen *g,
                                     const zps_coord_member *mem, zps_coord_group_wire *w)
{
    const zps_plan_slice *sl = mem ? zps_plan_find(&g->plan, mem->rank) : NULL;
    if (c->cfg.no_host_aggregate || !sl || !mem->boot_id[0] ||
        !s_shard_elsewhere(c, mem->boot_id)) {
        return NULL;
    }
    if (c->hosts.gen != g->gen) {
        s_hosts_of(c, g); // once per generation, not once per worker
    }
    uint32_t pos = (uint32_t)(sl - g->plan.slices);
    uint32_t lo = c->hosts.lo[pos], n = c->hosts.n[pos];
    if (n < 2) {
        return NULL; // alone on its host: it pushes for itself
    }
    zps__host_group__init(&w->group);
    for (uint32_t k = 0; k < n; k++) {
        uint32_t r = c->hosts.ent[lo + k].rank;
        zps__host_member__init(&w->members[k]);
        w->members[k].rank = r;
        w->members[k].pid = c->members[r].pid;
        w->ptrs[k] = &w->members[k];
    }
    w->group.n_members = n;
    w->group.members = w->ptrs;
    return &w->group;
}

uint32_t zps_coord_followers(zps_coord *c, uint64_t step, uint32_t rank, uint32_t *out,
                             uint32_t max)
{
    const zps_plan_gen *g = zps_plans_at(&c->plans, step);
    if (!g || rank >= c->n_members) {
        return 0;
    }
    zps_coord_group_wire w;
    const Zps__HostGroup *group = zps_coord_host_group(c, g, &c->members[rank], &w);
    if (!group || group->members[0]->rank != rank) {
        return 0; // alone, or a follower: its own part is all that waits on it
    }
    uint32_t n = 0;
    for (size_t k = 1; k < group->n_members && n < max; k++) {
        out[n++] = group->members[k]->rank;
    }
    return n;
}
