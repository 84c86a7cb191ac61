/* check_status.c - the status surfaces of a job of many members.
 *
 * A coordinator with hundreds of members (1000 where ZPS_MAX_MEMBERS
 * allows), each pushing with its own lag, a third of them silent: STATUS
 * without a page is bounded in size and holds the summary, the slowest
 * members by lag (slowest first) and the flagged ones up to the cap (the
 * rest counted); pages walk every member exactly once, in rank order; the
 * asker's fields still come with a member id; /metrics grows linearly (and
 * the test prints its bytes per member); /status?offset=&limit= over real
 * HTTP serves the same pages. No process: messages go in by hand, and time
 * is the test's clock. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <jansson.h>
#include <zmq.h>

#include "common/zps_clock.h"
#include "common/zps_log.h"
#include "server/coord/zps_census.h"
#include "server/coord/zps_coord.h"
#include "server/zps_http.h"
#include "server/zps_msgtab.h"
#include "tests/zps_check.h"

#define MANY (ZPS_MAX_MEMBERS < 1000u ? (uint32_t)ZPS_MAX_MEMBERS : 1000u)
#define TIMEOUT_MS 150.0
#define T_JOINED 1000.0 // when every member said HELLO
#define T_PUSH 1100.0   // when step 0's pushes begin
#define T_STATUS 1140.0 // when STATUS is asked: the silent ones 140 ms quiet

static double s_now;

static double s_clock(void)
{
    return s_now;
}

typedef struct many {
    zps_coord *c;
    zps_outbox out;
    uint32_t n;
    uint64_t *ids;      // member ids by rank, from their JOBs
    uint32_t *counted;
} many;

static bool s_silent(uint32_t rank)
{
    return rank % 3 == 1;
}

// The lag of a rank that pushes: distinct, in [0, 40) ms.
static double s_lag(const many *j, uint32_t rank)
{
    return (double)((rank * 37u) % j->n) * (40.0 / j->n);
}

static void s_route(zmq_msg_t *route, uint32_t i)
{
    char id[16];
    int len = snprintf(id, sizeof id, "m%u", i);
    ck_assert_int_eq(zmq_msg_init_size(route, (size_t)len), 0);
    memcpy(zmq_msg_data(route), id, (size_t)len);
}

// The JOBs queued so far: each member's id by its rank. Only in a small
// job: a JOB carries the plan, a slice a member, and reading every one of
// a thousand is a million slices.
static void s_take_jobs(many *j)
{
    for (size_t i = 0; j->n <= 2 * ZPS_STATUS_ALL && i < j->out.n; i++) {
        Zps__Header *h = zps_outbox_header(&j->out, i);
        ck_assert_ptr_nonnull(h);
        if (h->type == ZPS__MSG_TYPE__JOB && h->job->rank < j->n) {
            j->ids[h->job->rank] = h->job->member_id;
        }
        zps__header__free_unpacked(h, NULL);
    }
    zps_outbox_clear(&j->out);
}

static void s_hello(many *j, uint32_t i)
{
    char host[32];
    snprintf(host, sizeof host, "node-%04u.cluster", i);
    Zps__Hello hello = ZPS__HELLO__INIT;
    hello.host = host;
    hello.device = "cuda:0";
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__HELLO);
    h.hello = &hello;
    zps_wire_msg m = {.hdr = &h, .has_route = true};
    s_route(&m.route, i);
    ck_assert_int_eq(zps_coord_on_hello(j->c, &j->out, &m), ZPS_OK);
    zps_wire_route_close(&m.route);
    s_take_jobs(j);
}

// n members training; step 0 done with every rank but the silent ones
// pushing at T_PUSH + its lag; the clock at T_STATUS.
static void s_many_setup(many *j, uint32_t n)
{
    memset(j, 0, sizeof *j);
    j->n = n;
    j->ids = calloc(n, sizeof *j->ids);
    j->counted = calloc(ZPS_MAX_MEMBERS, sizeof *j->counted);
    ck_assert(j->ids && j->counted);
    zps_outbox_init(&j->out);
    zps_log_set_level(ZPS_LOG_WARN); // not a line a member: they are many
    s_now = T_JOINED;
    zps_coord_cfg cfg = {.model = "mlp:4-3-2", .dataset = "synthetic:40000", .seed = 1,
                         .global_batch = 4 * n, .total_steps = 40, .steps_per_epoch = 50,
                         .n_test = 10, .workers = n, .worker_timeout_ms = TIMEOUT_MS,
                         .n_params = 23, .shards = 1, .endpoint = "inproc://x",
                         .clock_ms = s_clock};
    j->c = zps_coord_new(&cfg);
    ck_assert_ptr_nonnull(j->c);
    for (uint32_t i = 0; i < n; i++) {
        s_hello(j, i);
    }
    ck_assert_uint_eq(zps_coord_at(j->c), ZPS_AT_TRAINING);
    for (uint32_t r = 0; r < n; r++) {
        if (!s_silent(r)) {
            zps_coord_note_push(j->c, 0, r, 4, 10.0f, T_PUSH + s_lag(j, r));
            j->counted[r] = 4;
        }
    }
    zps_coord_step_done(j->c, 0, 0.5f, 45.0, j->counted);
    s_now = T_STATUS;
}

static void s_many_teardown(many *j)
{
    zps_coord_destroy(&j->c);
    zps_outbox_fini(&j->out);
    free(j->ids);
    free(j->counted);
    zps_log_set_level(ZPS_LOG_INFO);
}

// STATUS (page NULL: none; member_id 0: none) and the reply (caller frees);
// *bytes its packed size.
static Zps__Header *s_status(many *j, const Zps__StatusPage *page, uint64_t member_id,
                             size_t *bytes)
{
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__STATUS);
    h.page = (Zps__StatusPage *)page;
    h.member_id = member_id;
    zps_wire_msg m = {.hdr = &h, .has_route = true};
    s_route(&m.route, 999999);
    zps_coord_on_status(j->c, &j->out, &m, 1, 0);
    zps_wire_route_close(&m.route);
    ck_assert_uint_eq(j->out.n, 1);
    Zps__Header *r = zps_outbox_header(&j->out, 0);
    ck_assert_ptr_nonnull(r);
    ck_assert_ptr_nonnull(r->status);
    if (bytes) {
        *bytes = zps__header__get_packed_size(r);
    }
    zps_outbox_clear(&j->out);
    return r;
}

// The ranks of the k slowest pushing members, slowest first.
static void s_expected_slowest(const many *j, uint32_t *want, uint32_t k)
{
    uint32_t got = 0;
    bool *taken = calloc(j->n, sizeof *taken);
    ck_assert_ptr_nonnull(taken);
    while (got < k) {
        uint32_t best = UINT32_MAX;
        for (uint32_t r = 0; r < j->n; r++) {
            if (!s_silent(r) && !taken[r] && (best == UINT32_MAX || s_lag(j, r) > s_lag(j, best))) {
                best = r;
            }
        }
        taken[best] = true;
        want[got++] = best;
    }
    free(taken);
}

START_TEST(test_status_of_many_members_is_bounded_and_names_the_slowest_and_the_flagged)
{
    many j;
    s_many_setup(&j, MANY);
    size_t bytes;
    Zps__Header *r = s_status(&j, NULL, 0, &bytes);
    const Zps__Status *st = r->status;
    uint32_t silent = 0;
    for (uint32_t i = 0; i < j.n; i++) {
        silent += s_silent(i);
    }
    ck_assert_uint_eq(st->members_total, j.n);
    ck_assert_uint_eq(st->members_active, j.n);
    ck_assert_uint_eq(st->members_joining + st->members_leaving + st->members_gone, 0);
    ck_assert_uint_eq(st->members_silent, silent);
    ck_assert(!st->paged);
    // Bounded: the 16 slowest and 64 flagged, a few hundred bytes each at most.
    ck_assert_uint_le(st->n_members, ZPS_STATUS_PICKED_MAX);
    ck_assert_uint_le(bytes, 4096 + ZPS_STATUS_PICKED_MAX * 256);
    uint32_t want[ZPS_STATUS_SLOWEST];
    s_expected_slowest(&j, want, ZPS_STATUS_SLOWEST);
    ck_assert_uint_eq(st->n_slowest, ZPS_STATUS_SLOWEST);
    uint32_t listed_silent = 0, found_slow = 0;
    for (size_t i = 0; i < st->n_members; i++) {
        const Zps__Member *m = st->members[i];
        ck_assert(i == 0 || m->rank > st->members[i - 1]->rank); // rank order, each once
        ck_assert_uint_eq(m->silent, s_silent(m->rank));
        listed_silent += m->silent;
        for (uint32_t k = 0; k < ZPS_STATUS_SLOWEST; k++) {
            found_slow += m->rank == want[k];
        }
        ck_assert_str_eq(m->device, "cuda:0");
    }
    for (uint32_t k = 0; k < ZPS_STATUS_SLOWEST; k++) {
        ck_assert_uint_eq(st->slowest[k], want[k]);
    }
    ck_assert_uint_eq(found_slow, ZPS_STATUS_SLOWEST);
    ck_assert_uint_eq(listed_silent, silent < ZPS_STATUS_FLAGGED_MAX ? silent
                                                                     : ZPS_STATUS_FLAGGED_MAX);
    ck_assert_uint_eq(st->flagged_omitted, silent - listed_silent);
    ck_assert_uint_eq(st->n_members, ZPS_STATUS_SLOWEST + listed_silent);
    zps__header__free_unpacked(r, NULL);
    s_many_teardown(&j);
}
END_TEST

// Pages of `limit` from rank 0 on: every member exactly once, in rank order.
static void s_walk(many *j, uint32_t limit)
{
    uint32_t next = 0, pages = 0;
    for (;;) {
        Zps__StatusPage page = ZPS__STATUS_PAGE__INIT;
        page.offset = next;
        page.limit = limit;
        size_t bytes;
        Zps__Header *r = s_status(j, &page, 0, &bytes);
        const Zps__Status *st = r->status;
        ck_assert(st->paged);
        ck_assert_uint_eq(st->page_offset, next < j->n ? next : j->n);
        uint32_t most = limit == 0 || limit > ZPS_STATUS_PAGE_MAX ? ZPS_STATUS_PAGE_MAX : limit;
        ck_assert_uint_le(st->n_members, most);
        ck_assert_uint_le(bytes, 4096 + (size_t)most * 256);
        ck_assert_uint_eq(st->n_slowest, ZPS_STATUS_SLOWEST); // the summary on every page
        size_t n = st->n_members;
        for (size_t i = 0; i < n; i++) {
            ck_assert_uint_eq(st->members[i]->rank, next + i);
        }
        zps__header__free_unpacked(r, NULL);
        next += (uint32_t)n;
        pages++;
        if (n == 0) {
            break;
        }
    }
    ck_assert_uint_eq(next, j->n);
    ck_assert_uint_eq(pages, (j->n + (limit ? limit : ZPS_STATUS_PAGE_MAX) - 1) /
                                     (limit ? limit : ZPS_STATUS_PAGE_MAX) +
                                 1);
}

START_TEST(test_status_pages_walk_every_member_exactly_once_in_rank_order)
{
    many j;
    s_many_setup(&j, MANY);
    s_walk(&j, 100);
    s_walk(&j, 0); // 0: the most a page holds
    s_walk(&j, 7);
    s_many_teardown(&j);
}
END_TEST

// A small job lists every member, as before the summary existed; a
// STATUS with a member id says where the asker stands (libzps reads it).
START_TEST(test_status_of_a_small_job_lists_every_member_and_answers_the_asker)
{
    many j;
    s_many_setup(&j, ZPS_STATUS_ALL);
    Zps__Header *r = s_status(&j, NULL, 0, NULL);
    ck_assert_uint_eq(r->status->n_members, ZPS_STATUS_ALL);
    ck_assert_uint_eq(r->status->flagged_omitted, 0);
    ck_assert_int_eq(r->status->asker, ZPS__MEMBER_STATE__MEMBER_UNKNOWN); // no id
    zps__header__free_unpacked(r, NULL);
    ck_assert_uint_ne(j.ids[5], 0);
    r = s_status(&j, NULL, j.ids[5], NULL);
    ck_assert_int_eq(r->status->asker, ZPS__MEMBER_STATE__MEMBER_ACTIVE);
    ck_assert_uint_eq(r->status->asker_from, 0);
    ck_assert_uint_eq(r->status->steps_done_all, 1);
    ck_assert_str_eq(r->status->state, "training");
    ck_assert_uint_eq(r->status->members_total, ZPS_STATUS_ALL);
    ck_assert_uint_eq(r->status->n_members, 0); // a worker's STATUS: no census, no rows
    zps__header__free_unpacked(r, NULL);
    s_many_teardown(&j);
}
END_TEST

// Bytes of the lines in text that start with prefix.
static size_t s_lines_bytes(const char *text, const char *prefix)
{
    size_t bytes = 0;
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p + 1) : strlen(p);
        bytes += strncmp(p, prefix, strlen(prefix)) == 0 ? len : 0;
        p += len;
    }
    return bytes;
}

START_TEST(test_status_metrics_grow_linearly_with_the_members)
{
    many j;
    s_many_setup(&j, MANY);
    zps_coord_docs d;
    double t0 = zps_clock_ms();
    for (int k = 0; k < 4; k++) {
        ck_assert_int_eq(zps_coord_render_docs(j.c, 1, 0, &d), ZPS_OK);
        zps_coord_docs_fini(&d);
    }
    double render_ms = (zps_clock_ms() - t0) / 4;
    ck_assert_int_eq(zps_coord_render_docs(j.c, 1, 0, &d), ZPS_OK);
    size_t total = strlen(d.metrics), per_worker = s_lines_bytes(d.metrics, "zps_worker_");
    printf("check_status: both documents of %u members rendered in %.2f ms (%.2f us a member, "
           "twice a second)\n",
           j.n, render_ms, render_ms * 1e3 / j.n);
    // Five series a live member, about a hundred bytes a line.
    double per_member = (double)per_worker / j.n;
    printf("check_status: /metrics of %u members: %zu bytes, %.1f a member (5 series); "
           "4096 members: %.2f MB\n",
           j.n, total, per_member, (per_member * 4096 + (double)(total - per_worker)) / 1e6);
    ck_assert_double_le(per_member, 5 * 120.0);
    ck_assert_uint_le(total - per_worker, 8192);
    // /status: the default document is bounded; every member has a row for pages.
    ck_assert_uint_eq(json_array_size(d.rows), j.n);
    ck_assert_uint_le(json_array_size(json_object_get(d.status, "members")),
                      ZPS_STATUS_PICKED_MAX);
    ck_assert_int_eq(json_integer_value(json_object_get(d.status, "members_total")), j.n);
    ck_assert_uint_eq(json_array_size(json_object_get(d.status, "slowest")), ZPS_STATUS_SLOWEST);
    zps_coord_docs_fini(&d);
    s_many_teardown(&j);
}
END_TEST

// A free loopback port (bound, read, closed).
static int s_free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    ck_assert_int_eq(bind(s, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(getsockname(s, (struct sockaddr *)&a, &len), 0);
    close(s);
    return ntohs(a.sin_port);
}

// GET path from 127.0.0.1:port: the body as JSON (caller decrefs; NULL if none).
static json_t *s_get_json(int port, const char *path)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(connect(s, (struct sockaddr *)&a, sizeof a), 0);
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: x\r\n\r\n", path);
    ck_assert_int_eq(write(s, req, (size_t)n), n);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    ssize_t got;
    while (buf && (got = read(s, buf + len, cap - len - 1)) > 0) {
        len += (size_t)got;
        if (len + 1 == cap) {
            buf = realloc(buf, cap *= 2);
        }
    }
    close(s);
    ck_assert_ptr_nonnull(buf);
    buf[len] = '\0';
    char *body = strstr(buf, "\r\n\r\n");
    json_t *doc = body && strstr(buf, " 200 ") ? json_loads(body + 4, 0, NULL) : NULL;
    free(buf);
    return doc;
}

START_TEST(test_status_http_pages_walk_every_member_once)
{
    many j;
    s_many_setup(&j, MANY);
    int port = s_free_port();
    char hostport[32];
    snprintf(hostport, sizeof hostport, "127.0.0.1:%d", port);
    zps_http *h = zps_http_start(hostport);
    ck_assert_ptr_nonnull(h);
    zps_coord_docs d;
    ck_assert_int_eq(zps_coord_render_docs(j.c, 1, 0, &d), ZPS_OK);
    zps_http_publish(h, d.metrics, d.status, d.rows, true);
    ck_assert(!zps_http_wants_documents(h)); // just rendered, nobody asked yet
    json_t *doc = s_get_json(port, "/status");
    ck_assert(zps_http_wants_documents(h)); // read: rendered every publish from now on
    ck_assert_ptr_nonnull(doc);
    ck_assert_uint_le(json_array_size(json_object_get(doc, "members")), ZPS_STATUS_PICKED_MAX);
    ck_assert_ptr_null(json_object_get(doc, "page"));
    json_decref(doc);
    uint32_t next = 0;
    for (;;) {
        char path[64];
        snprintf(path, sizeof path, "/status?offset=%u&limit=60", next);
        doc = s_get_json(port, path);
        ck_assert_ptr_nonnull(doc);
        json_t *members = json_object_get(doc, "members"), *m;
        size_t i;
        json_array_foreach(members, i, m)
        {
            ck_assert_int_eq(json_integer_value(json_object_get(m, "rank")), next + i);
        }
        size_t n = json_array_size(members);
        ck_assert_uint_le(n, 60);
        ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(doc, "page"),
                                                            "count")),
                         n);
        json_decref(doc);
        next += (uint32_t)n;
        if (n == 0) {
            break;
        }
    }
    ck_assert_uint_eq(next, j.n);
    ck_assert_ptr_null(s_get_json(port, "/status?offset=-1"));
    ck_assert_ptr_null(s_get_json(port, "/status?limit=x"));
    zps_http_stop(&h);
    s_many_teardown(&j);
}
END_TEST

Suite *zps_suite_status(void)
{
    Suite *s = suite_create("status");
    TCase *tc = tcase_create("many");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_status_of_many_members_is_bounded_and_names_the_slowest_and_the_flagged);
    tcase_add_test(tc, test_status_pages_walk_every_member_exactly_once_in_rank_order);
    tcase_add_test(tc, test_status_of_a_small_job_lists_every_member_and_answers_the_asker);
    tcase_add_test(tc, test_status_metrics_grow_linearly_with_the_members);
    tcase_add_test(tc, test_status_http_pages_walk_every_member_once);
    suite_add_tcase(s, tc);
    return s;
}
