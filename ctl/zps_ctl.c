/* zps_ctl.c - zps-ctl, the operator's tool.
 *
 *   zps-ctl status [ENDPOINT] [--all | --offset R --limit N] [curve options]
 *                               the coordinator's job, step and members (a job
 *                               of more than 32: the slowest and the flagged;
 *                               --all pages through every member)
 *   zps-ctl top [ENDPOINT] [--interval-ms N] [--iterations K] [status options]
 *                               the status table, refreshed live until Ctrl-C
 *   zps-ctl report --metrics FILE --out DIR
 *                               SVG pictures of a run from its metrics log
 *   zps-ctl keygen NAME         a CurveZMQ keypair: NAME.key (secret) and NAME.pub
 *
 * It speaks the same wire as workers (a DEALER, one STATUS request) and
 * waits a bounded time for each answer. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/zps_clock.h"
#include "common/zps_curve.h"
#include "common/zps_log.h"
#include "common/zps_wire.h"
#include "ctl/zps_report.h"

#define ZPS_CTL_DEFAULT_ENDPOINT "tcp://127.0.0.1:5555"
#define ZPS_CTL_TIMEOUT_MS 3000
#define ZPS_CTL_TOP_INTERVAL_MS 1000

// Set by SIGINT/SIGTERM while `top` runs: ends the loop, and a status
// request it cut short is not reported as an error.
static volatile sig_atomic_t s_stop;

static void s_usage(FILE *f)
{
    fprintf(f,
            "usage: zps-ctl status [ENDPOINT] [--all | --offset R --limit N]\n"
            "                      [--curve-secret FILE --server-key FILE]\n"
            "                                   (default %s); more than 32 members: the\n"
            "                                   summary, the slowest and the flagged; --all:\n"
            "                                   every member, a page at a time; --offset R\n"
            "                                   --limit N: ranks R.. (N up to 256)\n"
            "       zps-ctl top [ENDPOINT] [--interval-ms N] [--iterations K] [curve options]\n"
            "                                   the status refreshed every N ms (default %d)\n"
            "                                   until Ctrl-C, or K times (--all, --offset,\n"
            "                                   --limit as for status)\n"
            "       zps-ctl report --metrics FILE --out DIR\n"
            "                                   lag_heatmap.svg, step_time.svg, shares.svg\n"
            "                                   from zps-server --metrics-log FILE\n"
            "       zps-ctl keygen NAME         writes NAME.key (secret, 0600) and NAME.pub\n",
            ZPS_CTL_DEFAULT_ENDPOINT, ZPS_CTL_TOP_INTERVAL_MS);
}

// A diloco job's last complete round of each member: what it trained and
// what it sent.
static void s_print_rounds(const Zps__Member *const *rows, size_t n)
{
    bool any = false;
    for (size_t i = 0; i < n; i++) {
        any = any || rows[i]->inner_steps > 0;
    }
    if (!any) {
        return;
    }
    printf("%4s  %11s %13s %12s %12s\n", "rank", "inner_steps", "inner_samples", "delta_norm",
           "round_bytes");
    for (size_t i = 0; i < n; i++) {
        const Zps__Member *m = rows[i];
        printf("%4u  %11u %13llu %12.4g %12llu\n", m->rank, m->inner_steps,
               (unsigned long long)m->inner_steps * m->share, m->delta_norm,
               (unsigned long long)m->round_bytes);
    }
}

// This start of the coordinator, and the job's first (wall clock).
static void s_print_start(const Zps__Status *st)
{
    if (!st->starts && !st->start_step) {
        return; // not started yet (or a server older than these figures)
    }
    if (st->starts) {
        printf("start %u of the job, training from step %llu", st->starts,
               (unsigned long long)st->start_step);
    } else {
        printf("a resumed start of the job, training from step %llu",
               (unsigned long long)st->start_step);
    }
    if (st->job_started_unix_ms) {
        char when[ZPS_CLOCK_UTC_LEN];
        zps_clock_utc(st->job_started_unix_ms, when);
        printf("; the job first started %s", when);
    }
    printf("\n");
}

// Members the job has had (a server older than the census sends every one).
static uint32_t s_members_total(const Zps__Status *st)
{
    return st->members_total ? st->members_total : (uint32_t)st->n_members;
}

// A job with more members than rows shown: the counts by state, the
// slowest, and how to see the rest.
static void s_print_census(const Zps__Status *st, size_t shown)
{
    uint32_t total = s_members_total(st);
    if (shown >= total) {
        return;
    }
    printf("members by state: %u active, %u joining, %u leaving, %u gone; %u stragglers, "
           "%u silent\n",
           st->members_active, st->members_joining, st->members_leaving, st->members_gone,
           st->members_stragglers, st->members_silent);
    if (st->n_slowest > 0) {
        printf("slowest by lag (ranks):");
        for (size_t k = 0; k < st->n_slowest; k++) {
            printf(" %u", st->slowest[k]);
        }
        printf("\n");
    }
    if (st->paged) {
        printf("ranks %u..%u of %u shown (--all: every member)\n", st->page_offset,
               st->page_offset + (uint32_t)shown - (shown > 0), total);
    } else {
        printf("%zu of %u members shown: the slowest and the flagged", shown, total);
        if (st->flagged_omitted) {
            printf(" (%u more flagged left out)", st->flagged_omitted);
        }
        printf("; --all or --offset R --limit N for the rest\n");
    }
}

static void s_print_summary(const Zps__Header *h)
{
    const Zps__Status *st = h->status;
    printf("job %016llx: %s, model %s (%llu parameters), dataset %s\n",
           (unsigned long long)h->job_id, st->state, st->model, (unsigned long long)st->n_params,
           st->dataset);
    printf("step %llu/%llu (epoch %llu), global batch %u", (unsigned long long)st->step,
           (unsigned long long)st->total_steps, (unsigned long long)st->epoch, st->global_batch);
    if (st->micro_batch > 0) {
        printf(" (deterministic, micro-batches of %u)", st->micro_batch);
    }
    printf(", loss %.4f, last step %.2f ms", st->last_loss, st->last_step_ms);
    if (st->test_accuracy >= 0) {
        printf(", test accuracy %.4f", st->test_accuracy);
    }
    if (st->clip_grad_norm > 0 && st->has_grad_norm) {
        printf(", gradient norm %.4g (step %llu, clipped to %g)", st->grad_norm,
               (unsigned long long)st->grad_norm_step, st->clip_grad_norm);
    }
    printf("\nmembers %u of %u, refused messages %llu, evictions %llu, plan %u, "
           "step time median %.2f ms, p95 %.2f ms\n",
           s_members_total(st), st->workers_expected, (unsigned long long)st->bad_messages,
           (unsigned long long)st->evictions, st->generation, st->step_ms_median,
           st->step_ms_p95);
    s_print_start(st);
}

static void s_print_table(const Zps__Member *const *rows, size_t n)
{
    if (n > 0) {
        printf("%4s  %-20s %-8s %6s %8s %10s %8s %10s %8s  %s\n", "rank", "host", "device",
               "share", "pushes", "compute_ms", "lag_ms", "samples/s", "pid", "state");
    }
    for (size_t i = 0; i < n; i++) {
        const Zps__Member *m = rows[i];
        printf("%4u  %-20s %-8s %6u %8llu %10.2f %8.2f %10.0f %8u  %s\n", m->rank, m->host,
               m->device, m->share, (unsigned long long)m->pushes, m->compute_ms, m->lag_ms,
               m->samples_per_s, m->pid,
               !m->live      ? "gone"
               : m->straggler ? "STRAGGLER"
               : m->silent    ? "SILENT"
                              : "ok");
    }
    s_print_rounds(rows, n);
}

// Which members a status asks for: the default rows, a page, or all pages.
typedef struct s_ask {
    bool all;       // every member, a page at a time
    bool page;      // ranks offset.., limit of them
    uint32_t offset;
    uint32_t limit;
} s_ask;

#define ZPS_CTL_PAGE 256 // rows a page asks for (the server's most)

// One STATUS (with a page unless ask is the default) and its reply, which
// the caller frees; NULL after a message on stderr.
static Zps__Header *s_request(void *sock, const char *endpoint, const s_ask *ask,
                              uint32_t offset)
{
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__STATUS);
    Zps__StatusPage page = ZPS__STATUS_PAGE__INIT;
    page.offset = offset;
    page.limit = ask->all ? ZPS_CTL_PAGE : ask->limit;
    h.page = ask->all || ask->page ? &page : NULL;
    if (zps_wire_send(sock, NULL, &h, NULL, 0, NULL) != ZPS_OK) {
        fprintf(stderr, "zps-ctl: cannot send to %s\n", endpoint);
        return NULL;
    }
    zps_wire_msg m;
    Zps__Header *reply = NULL;
    zps_err err = zps_wire_recv(sock, false, &m);
    if (s_stop) {
        // Ctrl-C in `top`: the user asked to stop, nothing failed (nothing said)
    } else if (err == ZPS_ETIMEDOUT) {
        fprintf(stderr, "zps-ctl: no answer from %s within %d ms (is zps-server running?)\n",
                endpoint, ZPS_CTL_TIMEOUT_MS);
    } else if (err != ZPS_OK || m.hdr->type != ZPS__MSG_TYPE__STATUS_REPLY || !m.hdr->status) {
        fprintf(stderr, "zps-ctl: %s did not answer with a status (%s)\n", endpoint,
                err == ZPS_OK && m.hdr->error[0] ? m.hdr->error : zps_strerror(err));
    } else {
        reply = m.hdr;
        m.hdr = NULL; // kept: its rows are printed once every page is in
    }
    zps_wire_msg_fini(&m);
    return reply;
}

// The replies of a status: one, or with --all a page after another until
// every member is in (a server older than pages answers the first with
// all of them). Returns how many replies; 0 after a message on stderr.
static size_t s_gather(void *sock, const char *endpoint, const s_ask *ask, Zps__Header ***out)
{
    size_t n = 0, cap = 0, rows = 0;
    Zps__Header **got = NULL;
    for (;;) {
        Zps__Header *r = s_request(sock, endpoint, ask, ask->all ? (uint32_t)rows : ask->offset);
        Zps__Header **more = r && n == cap ? realloc(got, (cap = cap * 2 + 1) * sizeof(Zps__Header *))
                                           : got;
        if (!r || !more) {
            if (r) {
                zps__header__free_unpacked(r, NULL);
            }
            break;
        }
        got = more;
        got[n++] = r;
        rows += r->status->n_members;
        if (!ask->all || !r->status->paged || r->status->n_members == 0 ||
            rows >= r->status->members_total) {
            *out = got;
            return n;
        }
    }
    for (size_t i = 0; i < n; i++) {
        zps__header__free_unpacked(got[i], NULL);
    }
    free(got);
    *out = NULL;
    return 0;
}

// Prints the summary of the first reply and the rows of them all.
static int s_print_replies(Zps__Header *const *replies, size_t n)
{
    size_t rows = 0;
    for (size_t i = 0; i < n; i++) {
        rows += replies[i]->status->n_members;
    }
    const Zps__Member **all = malloc((rows ? rows : 1) * sizeof(Zps__Member *));
    if (!all) {
        fprintf(stderr, "zps-ctl: out of memory\n");
        return 1;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < replies[i]->status->n_members; j++) {
            all[k++] = replies[i]->status->members[j];
        }
    }
    s_print_summary(replies[0]);
    s_print_census(replies[0]->status, rows);
    s_print_table(all, rows);
    free((void *)all);
    return 0;
}

static int s_status(const char *endpoint, const zps_curve *curve, const s_ask *ask)
{
    int ret = 1;
    void *ctx = zmq_ctx_new();
    void *sock = ctx ? zps_wire_socket(ctx, ZMQ_DEALER, ZPS_CTL_TIMEOUT_MS) : NULL;
    if (!sock || zps_curve_client(curve, sock) != ZPS_OK || zmq_connect(sock, endpoint) != 0) {
        fprintf(stderr, "zps-ctl: cannot connect to %s: %s\n", endpoint, zmq_strerror(errno));
        goto out;
    }
    Zps__Header **replies = NULL;
    size_t n = s_gather(sock, endpoint, ask, &replies);
    if (n > 0) {
        ret = s_print_replies(replies, n);
    } else if (s_stop) {
        ret = 0; // Ctrl-C in `top`: the user asked to stop, nothing failed
    }
    for (size_t i = 0; i < n; i++) {
        zps__header__free_unpacked(replies[i], NULL);
    }
    free(replies);
out:
    if (sock) {
        int zero = 0;
        zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
        zmq_close(sock);
    }
    if (ctx) {
        zmq_ctx_term(ctx);
    }
    return ret;
}

static void s_on_signal(int sig)
{
    (void)sig;
    s_stop = 1;
}

// Sleeps ms, or less when a signal sets s_stop.
static void s_sleep_ms(long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (!s_stop && nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

// The status table every interval_ms, iterations times (0: until Ctrl-C).
// On a terminal each refresh replaces the last (like top); into a pipe or
// file the tables follow one another. Exits 1 when the last request got no
// status, so a script sees a dead coordinator.
static int s_top(const char *endpoint, const zps_curve *curve, const s_ask *ask,
                 long interval_ms, long iterations)
{
    struct sigaction sa = {.sa_handler = s_on_signal}; // no SA_RESTART: waits end at once
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    bool tty = isatty(STDOUT_FILENO);
    int ret = 0;
    for (long i = 0; !s_stop && (iterations == 0 || i < iterations); i++) {
        if (i > 0) {
            s_sleep_ms(interval_ms);
            if (s_stop) {
                break;
            }
        }
        time_t now = time(NULL);
        struct tm tm;
        char clock[16] = "";
        if (localtime_r(&now, &tm)) {
            (void)strftime(clock, sizeof clock, "%H:%M:%S", &tm); // 8 characters always fit
        }
        // Home and clear: the new table draws over the old in place.
        printf("%s%szps-ctl top: %s every %ld ms, %s (Ctrl-C quits)\n\n",
               tty ? "\033[H\033[2J" : "", i > 0 && !tty ? "\n" : "", endpoint, interval_ms,
               clock);
        fflush(stdout);
        ret = s_status(endpoint, curve, ask);
        fflush(stdout);
    }
    return s_stop ? 0 : ret;
}

// A whole number in [lo, hi] from an option's argument; -1 if it is not one.
static long s_parse_long(const char *s, long lo, long hi)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) {
        return -1;
    }
    return v;
}

static int s_report(int argc, char **argv)
{
    const char *metrics = NULL, *out = NULL;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--metrics") == 0 && i + 1 < argc) {
            metrics = argv[++i];
        } else if (strcmp(argv[i], "--out") == 0 && i + 1 < argc) {
            out = argv[++i];
        } else {
            s_usage(stderr);
            return 2;
        }
    }
    if (!metrics || !out) {
        s_usage(stderr);
        return 2;
    }
    char err[512];
    if (zps_report_write(metrics, out, err, sizeof err) != 0) {
        fprintf(stderr, "zps-ctl: report: %s\n", err);
        return 1;
    }
    printf("wrote %s/lag_heatmap.svg, %s/step_time.svg, %s/shares.svg\n", out, out, out);
    return 0;
}

// The options of status and top.
typedef struct s_args {
    const char *endpoint, *secret, *server;
    long interval_ms, iterations; // top
    s_ask ask;
} s_args;

// An option of status and top that takes a number (i: at it); 2 after a
// message if it is not one, -1 if argv[*i] is none of them, else 0.
static int s_parse_number(int argc, char **argv, int *i, bool top, s_args *a)
{
    static const struct {
        const char *name;
        bool top_only;
        long lo, hi;
    } opts[] = {{"--interval-ms", true, 10, 3600000},
                {"--iterations", true, 1, LONG_MAX},
                {"--offset", false, 0, UINT32_MAX},
                {"--limit", false, 1, ZPS_CTL_PAGE}};
    long *into[] = {&a->interval_ms, &a->iterations, NULL, NULL};
    for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++) {
        if (strcmp(argv[*i], opts[k].name) != 0 || (opts[k].top_only && !top) ||
            *i + 1 >= argc) {
            continue;
        }
        long v = s_parse_long(argv[++*i], opts[k].lo, opts[k].hi);
        if (v < 0) {
            fprintf(stderr, "zps-ctl: %s takes %ld to %ld\n", opts[k].name, opts[k].lo,
                    opts[k].hi);
            return 2;
        }
        if (into[k]) {
            *into[k] = v;
        } else {
            *(k == 2 ? &a->ask.offset : &a->ask.limit) = (uint32_t)v;
            a->ask.page = true;
        }
        return 0;
    }
    return -1;
}

// Returns 0, or the exit status after a usage message.
static int s_parse_args(int argc, char **argv, bool top, s_args *a)
{
    for (int i = 2; i < argc; i++) {
        int r = s_parse_number(argc, argv, &i, top, a);
        if (r >= 0) {
            if (r > 0) {
                return r;
            }
        } else if (strcmp(argv[i], "--all") == 0) {
            a->ask.all = true;
        } else if (strcmp(argv[i], "--curve-secret") == 0 && i + 1 < argc) {
            a->secret = argv[++i];
        } else if (strcmp(argv[i], "--server-key") == 0 && i + 1 < argc) {
            a->server = argv[++i];
        } else if (argv[i][0] != '-') {
            a->endpoint = argv[i];
        } else {
            s_usage(stderr);
            return 2;
        }
    }
    if (a->ask.all && a->ask.page) {
        fprintf(stderr, "zps-ctl: --all pages through every member: no --offset, --limit\n");
        return 2;
    }
    return 0;
}

int main(int argc, char **argv)
{
    zps_log_set_name("zps-ctl");
    zps_log_set_level(ZPS_LOG_WARN);
    if (argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        s_usage(stdout);
        return 0;
    }
    if (argc == 3 && strcmp(argv[1], "keygen") == 0) {
        if (zps_curve_keygen(argv[2]) != ZPS_OK) {
            return 1;
        }
        printf("wrote %s.key (secret) and %s.pub\n", argv[2], argv[2]);
        return 0;
    }
    if (argc >= 2 && strcmp(argv[1], "report") == 0) {
        return s_report(argc, argv);
    }
    bool top = argc >= 2 && strcmp(argv[1], "top") == 0;
    if (argc < 2 || (!top && strcmp(argv[1], "status") != 0)) {
        s_usage(stderr);
        return 2;
    }
    s_args a = {.endpoint = ZPS_CTL_DEFAULT_ENDPOINT, .interval_ms = ZPS_CTL_TOP_INTERVAL_MS};
    int bad = s_parse_args(argc, argv, top, &a);
    if (bad) {
        return bad;
    }
    const char *endpoint = a.endpoint, *secret = a.secret, *server = a.server;
    zps_curve curve = {0};
    if ((secret || server) && (!secret || !server || zps_curve_load(&curve, secret, server))) {
        fprintf(stderr, "zps-ctl: --curve-secret and --server-key go together\n");
        return 2;
    }
    return top ? s_top(endpoint, &curve, &a.ask, a.interval_ms, a.iterations)
               : s_status(endpoint, &curve, &a.ask);
}
