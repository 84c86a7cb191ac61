/* check_coord_hosts.c - hosts on the coordinator: ranks grouped by host
 * (boot id) at the first start, each worker's host group in the JOB and
 * PLANs it is sent (leader first, with pids), none for a worker alone on
 * its host, of unknown host or with --host-aggregate off, groups cut at
 * ZPS_HOST_GROUP_MAX, the shards' boot ids in ShardInfo, and the
 * followers whose parts wait in a leader (speculation hands them with
 * it). No socket: messages go in by hand and come out of the outbox. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "server/coord/zps_coord.h"
#include "tests/zps_check.h"
#include "tests/zps_tmpdir.h"

#define N_W 70 // more than one group of ZPS_HOST_GROUP_MAX on one host

typedef struct hjob {
    zmq_msg_t route[N_W];
    Zps__Header *job[N_W];  // owned: the JOB each got (NULL: none yet)
    Zps__Header *plan[N_W]; // owned: the newest PLAN each got
    zps_outbox out;
    zps_coord *c;
} hjob;

static void s_setup(hjob *j, uint32_t workers, bool off)
{
    memset(j, 0, sizeof *j);
    for (int i = 0; i < N_W; i++) {
        char id[16];
        snprintf(id, sizeof id, "w%d", i);
        ck_assert_int_eq(zmq_msg_init_size(&j->route[i], strlen(id)), 0);
        memcpy(zmq_msg_data(&j->route[i]), id, strlen(id));
    }
    zps_outbox_init(&j->out);
    zps_coord_cfg cfg = {.model = "mlp:4-3-2", .dataset = "synthetic:400", .seed = 1,
                         .global_batch = 140, .total_steps = 40, .steps_per_epoch = 2,
                         .n_test = 10, .workers = workers, .worker_timeout_ms = 1e9,
                         .n_params = 23, .shards = 1, .endpoint = "inproc://x",
                         .no_host_aggregate = off};
    j->c = zps_coord_new(&cfg);
    ck_assert_ptr_nonnull(j->c);
}

static void s_teardown(hjob *j)
{
    zps_coord_destroy(&j->c);
    zps_outbox_fini(&j->out);
    for (int i = 0; i < N_W; i++) {
        zps__header__free_unpacked(j->job[i], NULL); // NULL is fine
        zps__header__free_unpacked(j->plan[i], NULL);
        zmq_msg_close(&j->route[i]);
    }
}

// Each message of the outbox to its worker: its JOB, its newest PLAN.
static void s_post(hjob *j)
{
    for (size_t k = 0; k < j->out.n; k++) {
        zmq_msg_t *r = &j->out.msgs[k].route;
        int i = 0;
        while (i < N_W && (zmq_msg_size(r) != zmq_msg_size(&j->route[i]) ||
                           memcmp(zmq_msg_data(r), zmq_msg_data(&j->route[i]), zmq_msg_size(r)))) {
            i++;
        }
        ck_assert_int_lt(i, N_W);
        Zps__Header *h = zps_outbox_header(&j->out, k);
        ck_assert_ptr_nonnull(h);
        Zps__Header **slot = h->type == ZPS__MSG_TYPE__JOB ? &j->job[i] : &j->plan[i];
        zps__header__free_unpacked(*slot, NULL);
        *slot = h;
    }
    zps_outbox_clear(&j->out);
}

// Worker i (pid 100 + i) says HELLO from host `boot` (NULL: says none).
static void s_hello(hjob *j, int i, const char *boot)
{
    Zps__Hello hello = ZPS__HELLO__INIT;
    hello.host = "test";
    hello.device = "cpu";
    hello.pid = 100 + (uint32_t)i;
    hello.boot_id = (char *)boot;
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__HELLO);
    h.hello = &hello;
    zps_wire_msg m = {.hdr = &h, .has_route = true};
    zps_wire_route_copy(&m.route, &j->route[i]);
    ck_assert_int_eq(zps_coord_on_hello(j->c, &j->out, &m), ZPS_OK);
    zps_wire_route_close(&m.route);
    s_post(j);
}

static uint32_t s_rank(const hjob *j, int i)
{
    ck_assert_ptr_nonnull(j->job[i]);
    return j->job[i]->job->rank;
}

// Whether group g is these ranks, in order, each with its worker's pid.
static void s_assert_group(const hjob *j, const Zps__HostGroup *g, const int *workers, size_t n)
{
    ck_assert_ptr_nonnull(g);
    ck_assert_uint_eq(g->n_members, n);
    for (size_t k = 0; k < n; k++) {
        ck_assert_uint_eq(g->members[k]->rank, s_rank(j, workers[k]));
        ck_assert_uint_eq(g->members[k]->pid, 100 + (uint32_t)workers[k]);
    }
}

// Joins from hosts A, B, A, B make ranks A0 A1 B2 B3: each JOB carries its
// host's group, leader (lowest rank) first; a joiner of host A later is in
// A's group of the next plan, as its PLAN and its JOB say.
START_TEST(test_coord_ranks_grouped_by_host_at_start_and_each_job_carries_its_group)
{
    setenv("ZPS_BOOT_ID", "host-S", 1); // shard 0's host
    hjob j;
    s_setup(&j, 4, false);
    unsetenv("ZPS_BOOT_ID");
    const char *boot[4] = {"host-A", "host-B", "host-A", "host-B"};
    for (int i = 0; i < 4; i++) {
        s_hello(&j, i, boot[i]);
    }
    ck_assert_uint_eq(s_rank(&j, 0), 0);
    ck_assert_uint_eq(s_rank(&j, 2), 1);
    ck_assert_uint_eq(s_rank(&j, 1), 2);
    ck_assert_uint_eq(s_rank(&j, 3), 3);
    const int a[] = {0, 2}, b[] = {1, 3};
    s_assert_group(&j, j.job[0]->job->host, a, 2);
    s_assert_group(&j, j.job[2]->job->host, a, 2);
    s_assert_group(&j, j.job[1]->job->host, b, 2);
    s_assert_group(&j, j.job[3]->job->host, b, 2);
    ck_assert_str_eq(j.job[0]->job->shards[0]->boot_id, "host-S");
    // Each leader's followers; a follower leads no one.
    uint32_t f[4];
    ck_assert_uint_eq(zps_coord_followers(j.c, 0, 0, f, 4), 1);
    ck_assert_uint_eq(f[0], 1);
    ck_assert_uint_eq(zps_coord_followers(j.c, 0, 2, f, 4), 1);
    ck_assert_uint_eq(f[0], 3);
    ck_assert_uint_eq(zps_coord_followers(j.c, 0, 1, f, 4), 0);
    ck_assert_uint_eq(zps_coord_followers(j.c, 0, 9, f, 4), 0);
    // Each JOB's slice is its rank's, which the regrouping renumbered.
    ck_assert_uint_eq(j.job[1]->job->plan[0]->rank, 2);
    s_hello(&j, 4, "host-A");
    zps_coord_release(j.c, &j.out, 1);
    s_post(&j);
    const int a3[] = {0, 2, 4};
    ck_assert_uint_eq(s_rank(&j, 4), 4);
    s_assert_group(&j, j.plan[0]->plan->host, a3, 3);
    s_assert_group(&j, j.job[4]->job->host, a3, 3);
    s_assert_group(&j, j.plan[1]->plan->host, b, 2);
    s_teardown(&j);
}
END_TEST

// A worker alone on its host, one that says no host, one whose boot id is
// not one (taken as unknown): no group, and their ranks keep join order.
START_TEST(test_coord_worker_alone_or_of_unknown_host_gets_no_group)
{
    hjob j;
    s_setup(&j, 4, false);
    s_hello(&j, 0, "host-A");
    s_hello(&j, 1, NULL);
    s_hello(&j, 2, "bad id!");
    s_hello(&j, 3, "host-B");
    for (int i = 0; i < 4; i++) {
        ck_assert_uint_eq(s_rank(&j, i), (uint32_t)i);
        ck_assert_ptr_null(j.job[i]->job->host);
    }
    s_teardown(&j);
}
END_TEST

// --host-aggregate off: workers of one host are told no group.
START_TEST(test_coord_host_aggregate_off_sends_no_group)
{
    hjob j;
    s_setup(&j, 2, true);
    s_hello(&j, 0, "host-A");
    s_hello(&j, 1, "host-A");
    ck_assert_ptr_null(j.job[0]->job->host);
    ck_assert_ptr_null(j.job[1]->job->host);
    uint32_t f[2];
    ck_assert_uint_eq(zps_coord_followers(j.c, 0, 0, f, 2), 0);
    s_teardown(&j);
}
END_TEST

// Workers on the host of every shard: nothing crosses a link, so no
// group; those of another host still get theirs.
START_TEST(test_coord_workers_on_the_shards_host_get_no_group)
{
    setenv("ZPS_BOOT_ID", "host-A", 1); // shard 0's host
    hjob j;
    s_setup(&j, 4, false);
    unsetenv("ZPS_BOOT_ID");
    const char *boot[4] = {"host-A", "host-A", "host-B", "host-B"};
    for (int i = 0; i < 4; i++) {
        s_hello(&j, i, boot[i]);
    }
    ck_assert_ptr_null(j.job[0]->job->host);
    ck_assert_ptr_null(j.job[1]->job->host);
    const int b[2] = {2, 3};
    s_assert_group(&j, j.job[2]->job->host, b, 2);
    s_assert_group(&j, j.job[3]->job->host, b, 2);
    uint32_t f[2];
    ck_assert_uint_eq(zps_coord_followers(j.c, 0, s_rank(&j, 0), f, 2), 0);
    ck_assert_uint_eq(zps_coord_followers(j.c, 0, s_rank(&j, 2), f, 2), 1);
    ck_assert_uint_eq(f[0], s_rank(&j, 3));
    s_teardown(&j);
}
END_TEST

// Worker i of job j calls back the coordinator r resumed from j's saved
// state: a heartbeat from its main socket, as the member j admitted.
static void s_call_back(hjob *r, const hjob *j, int i)
{
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__HEARTBEAT);
    h.member_id = j->job[i]->job->member_id;
    h.rank = j->job[i]->job->rank;
    h.flags = 1;
    zps_wire_msg m = {.hdr = &h, .has_route = true};
    zps_wire_route_copy(&m.route, &r->route[i]);
    ck_assert_int_eq(zps_coord_on_heartbeat(r->c, &r->out, &m), ZPS_OK);
    zps_wire_route_close(&m.route);
    s_post(r);
}

// A coordinator resumed from its saved job state (--resume) still knows
// each member's host: the ROLLBACK that starts them again carries the
// groups they had.
START_TEST(test_coord_resumed_members_keep_their_host_groups)
{
    char dir[64];
    zps_tmpdir_make(dir, sizeof dir, "check-coord-hosts");
    hjob j, r;
    s_setup(&j, 4, false);
    const char *boot[4] = {"host-A", "host-B", "host-A", "host-B"};
    for (int i = 0; i < 4; i++) {
        s_hello(&j, i, boot[i]);
    }
    ck_assert_int_eq(zps_coord_save(j.c, dir, 5), ZPS_OK);
    s_setup(&r, 4, false);
    ck_assert_int_eq(zps_coord_resume(r.c, dir, 5), ZPS_OK);
    for (int i = 0; i < 4; i++) {
        s_call_back(&r, &j, i);
    }
    uint64_t step;
    ck_assert(zps_coord_take_rollback(r.c, &step));
    ck_assert_uint_eq(step, 5);
    const int a[2] = {0, 2}, b[2] = {1, 3};
    for (int i = 0; i < 4; i++) {
        ck_assert_ptr_nonnull(r.plan[i]);
        ck_assert_int_eq(r.plan[i]->type, ZPS__MSG_TYPE__ROLLBACK);
        s_assert_group(&j, r.plan[i]->plan->host, i % 2 ? b : a, 2);
    }
    s_teardown(&r);
    s_teardown(&j);
    ck_assert_int_eq(zps_tmpdir_remove(dir), 0);
}
END_TEST

// 70 workers of one host: groups of consecutive ranks, 64 and then 6, each
// led by its lowest rank.
START_TEST(test_coord_host_of_more_than_the_group_max_is_cut_into_groups)
{
    hjob j;
    s_setup(&j, N_W, false);
    for (int i = 0; i < N_W; i++) {
        s_hello(&j, i, "host-A");
    }
    const Zps__HostGroup *first = j.job[0]->job->host, *last = j.job[N_W - 1]->job->host;
    ck_assert_uint_eq(first->n_members, ZPS_HOST_GROUP_MAX);
    ck_assert_uint_eq(first->members[0]->rank, 0);
    ck_assert_uint_eq(first->members[ZPS_HOST_GROUP_MAX - 1]->rank, ZPS_HOST_GROUP_MAX - 1);
    ck_assert_uint_eq(j.job[ZPS_HOST_GROUP_MAX - 1]->job->host->members[0]->rank, 0);
    ck_assert_uint_eq(last->n_members, N_W - ZPS_HOST_GROUP_MAX);
    ck_assert_uint_eq(last->members[0]->rank, ZPS_HOST_GROUP_MAX);
    s_teardown(&j);
}
END_TEST

Suite *zps_suite_coord_hosts(void)
{
    Suite *s = suite_create("coord_hosts");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_coord_ranks_grouped_by_host_at_start_and_each_job_carries_its_group);
    tcase_add_test(tc, test_coord_worker_alone_or_of_unknown_host_gets_no_group);
    tcase_add_test(tc, test_coord_host_aggregate_off_sends_no_group);
    tcase_add_test(tc, test_coord_workers_on_the_shards_host_get_no_group);
    tcase_add_test(tc, test_coord_resumed_members_keep_their_host_groups);
    tcase_add_test(tc, test_coord_host_of_more_than_the_group_max_is_cut_into_groups);
    suite_add_tcase(s, tc);
    return s;
}
