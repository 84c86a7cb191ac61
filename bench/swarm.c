/* swarm.c - what the control plane costs per member: N members as real
 * libzps clients over real sockets, many to a process, against real
 * zps-server processes (issue 30, part 2; DESIGN.md "Scale").
 *
 * For each N of --members, shard 0 (the coordinator) and --shards - 1 more
 * shards start as bin/zps-server with --model flat:P (a model whose
 * gradient costs nothing, so a step is the control plane: plans, pushes,
 * replies, heartbeats, the straggler detector), --workers N, --global-batch
 * N * --samples and --steps W + S + 1. The members run in ceil(N /
 * --per-proc) forked processes, a thread each (a 1 MiB stack; the
 * library's own threads, ZeroMQ's I/O and reaper and the heartbeat, get 256
 * KiB through pthread_setattr_default_np). A member joins, then loops on
 * zps_next_work, pushing every bucket of a zero gradient.
 *
 * The measured window is steps [W, W + S): the member of rank 0 samples,
 * when its work of step W and of step W + S arrives,
 *   - each server's CPU time: the sum over its threads of
 *     /proc/<pid>/task/<tid>/schedstat's first field (ns on a CPU; the same
 *     time as utime + stime of /proc/<pid>/stat, which is in clock ticks,
 *     too coarse for a window of a few ms; that figure is printed too);
 *   - the TCP bytes both ways of every member's connections:
 *     tcpi_bytes_acked + tcpi_bytes_received of TCP_INFO, summed over the
 *     sockets of /proc/self/fd in every member process (the servers' other
 *     ends are the same bytes; shard-to-shard traffic is not in it). With
 *     the default --shm auto the gradients of a same-host member go through
 *     shared memory: only the headers and the parameters are TCP bytes.
 * The step time is the median gap between two steps' work arriving at
 * rank 0. Every member must reach ZPS_NEXT_DONE and every server exit 0.
 *
 *   swarm [--members 64,256,1024,4096] [--shards 1] [--warmup 10]
 *         [--steps 40] [--params 4096] [--samples 1] [--per-proc 512]
 *         [--timeout-s 600] [--worker-timeout-ms 60000] [--shm auto|off]
 *         [--hosts] [--heartbeat-ms 1000] [--keep] [--members-sched other]
 *
 * --hosts makes each member process a host of its own (a ZPS_BOOT_ID of
 * its own, unlike the servers'): its members form a host group (at most
 * 64, so --per-proc up to 64) whose leader sums their pushes and sends
 * each shard one push per bucket (docs/choices.md "One push per host"), as
 * a cluster of hosts with a few workers each does. Without it every
 * member is on the servers' host and pushes for itself. --heartbeat-ms is
 * the members' least heartbeat interval: a member heard once a step (its
 * push, its leader's ack) beats only when nothing was heard of it for
 * that long or, where steps are longer, for two usual steps (docs/
 * choices.md, "Pushes are heartbeats"); before that stretch the beats of
 * long steps were most of the coordinator's CPU at 4096.
 *
 * --members-sched idle runs the member processes under SCHED_IDLE: the
 * servers then take the cores whenever they have work, as on machines of
 * their own. With the default (every process alike) thousands of member
 * threads share the cores with the servers' few; on a 2-core VM whose
 * context switches are dear, 4096 members with --hosts starved the
 * coordinator (silent members evicted at step 0, the run failed).
 *
 * One table row per N (Markdown). A run that fails or passes its bound
 * prints what it knew (members joined, the step rank 0 reached) and keeps
 * its scratch directory (the servers' logs) under $TMPDIR; --keep keeps it
 * always. Servers are ZPS_BIN_DIR's (default bin/).
 *
 * File descriptors: a member holds about 10 (its context's epoll and
 * mailboxes, a DEALER and a TCP connection to the coordinator, the same
 * for the heartbeat and each other shard, a memfd per shard with shared
 * memory); the bench raises RLIMIT_NOFILE to the hard limit (as root, to
 * what N needs if that is more) and prints the measured need. Threads: 4 a
 * member (its own, ZeroMQ's two, the heartbeat) with --sndbuf 0 (auto's
 * watcher would add one a socket): 16384 at N = 4096, under
 * kernel.pid_max (32768 here). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "zps.h"

#define SW_MAX_N 16      // entries of --members
#define SW_MAX_SHARDS 16
#define SW_MAX_PROCS 256 // member processes of one N
#define SW_MAX_STEPS 100000
#define SW_FDS_PER_MEMBER 16 // the estimate RLIMIT_NOFILE is raised for
#define SW_MEMBER_STACK (1u << 20)
#define SW_LIB_STACK (256u << 10)

typedef struct sw_cfg {
    int members[SW_MAX_N], n_members;
    int shards, warmup, steps, params, samples, per_proc, timeout_s, worker_timeout_ms;
    int heartbeat_ms;           // the members' heartbeat interval (libzps's 1000 by default)
    int global_batch;           // 0: N * samples
    bool keep, shm;
    bool hosts;                 // --hosts: a member process is a host of its own
    bool sndbuf_auto;           // --sndbuf auto: a watcher thread a socket (default 0)
    bool idle;                  // --members-sched idle: member processes under SCHED_IDLE
    char bin[512];
} sw_cfg;

// What the member processes and the parent share (MAP_SHARED, before fork).
typedef struct sw_shared {
    atomic_int joined;                   // members admitted
    atomic_int done;                     // members that reached ZPS_NEXT_DONE
    atomic_int failed;                   // members that ended otherwise
    atomic_int stop;                     // the parent asks every member to leave
    atomic_int sampled;                  // windows sampled by rank 0: 0, 1 or 2
    atomic_int news;                     // grows with each store to stop or sampled
    atomic_int tcp_acks[2];              // member processes that added their bytes
    atomic_uint_fast64_t tcp_bytes[2];   // TCP bytes of every member connection
    atomic_uint_fast64_t rank0_step;     // the step rank 0 works on
    atomic_int fds_max;                  // the most fds a member process held
    atomic_flag why_set;                 // why has the first failure
    char why[256];                       // first failure's reason
    int n_servers;
    pid_t servers[SW_MAX_SHARDS];
    uint64_t cpu_ns[2][SW_MAX_SHARDS];   // the servers' CPU at the window's ends
    uint64_t cpu_ticks[2][SW_MAX_SHARDS];
    uint64_t step_ns[SW_MAX_STEPS];      // when rank 0 got step s's work
} sw_shared;

typedef struct sw_proc {
    const sw_cfg *cfg;
    sw_shared *sh;
    const char *endpoint;
    const float *grad;          // P zeros, shared read-only by the members
    int n;                      // members of this process
    zps_client **clients;       // owned; NULL until made
    atomic_int live;            // members still running
} sw_proc;

typedef struct sw_member {
    sw_proc *p;
    int slot;                   // its client in p->clients
    int id;                     // 0..N-1 over every process, for failures
    float *params;              // owned
} sw_member;

typedef struct sw_row {
    int n, steps;
    double coord_ms, coord_us, coord_stat_us, step_ms, bytes_member;
    double shard_us[SW_MAX_SHARDS];
    int fds;
} sw_row;

static uint64_t s_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void s_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

// The member processes' watchers sleep on sh->news (a futex in the shared
// page) instead of waking every millisecond to look: with 64 processes,
// 64,000 wake-ups a second for nothing on the cores that the members and
// the servers share.
static void s_news(atomic_int *news)
{
    atomic_fetch_add(news, 1);
    (void)syscall(SYS_futex, (int *)news, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

// Waits up to ms for news after seen (returns at once if they came).
static void s_await_news(atomic_int *news, int seen, int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    (void)syscall(SYS_futex, (int *)news, FUTEX_WAIT, seen, &ts, NULL, 0);
}

static void s_why(sw_shared *sh, const char *what, int index, const char *msg)
{
    if (!atomic_flag_test_and_set(&sh->why_set)) {
        snprintf(sh->why, sizeof sh->why, "member %d: %s: %s", index, what, msg);
    }
}

// ---------------------------------------------------------------- /proc

// A process's CPU time: ns summed over its threads' schedstat, and
// utime + stime of its stat in clock ticks.
static void s_cpu(pid_t pid, uint64_t *ns, uint64_t *ticks)
{
    char path[64], buf[1024];
    *ns = 0;
    *ticks = 0;
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    for (struct dirent *e = d ? readdir(d) : NULL; e; e = readdir(d)) {
        char p[320];
        snprintf(p, sizeof p, "/proc/%d/task/%s/schedstat", (int)pid, e->d_name);
        FILE *f = e->d_name[0] != '.' ? fopen(p, "r") : NULL;
        if (f && fgets(buf, sizeof buf, f)) {
            *ns += strtoull(buf, NULL, 10);
        }
        if (f) {
            (void)fclose(f);
        }
    }
    if (d) {
        (void)closedir(d);
    }
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    size_t len = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) {
        (void)fclose(f);
    }
    buf[len] = '\0';
    const char *s = strrchr(buf, ')'); // the name may hold spaces
    if (!s || !s[1] || !s[2]) {
        return;
    }
    char *at = (char *)s + 3; // past ") " and the state: field 4 on
    unsigned long long v[12] = {0}; // fields 4..15; utime and stime are 14 and 15
    for (int i = 0; i < 12; i++) {
        v[i] = strtoull(at, &at, 10); // tpgid may be -1: skipped all the same
    }
    *ticks = v[10] + v[11];
}

// TCP bytes both ways over this process's sockets, and how many fds it holds.
static uint64_t s_tcp_bytes(int *fds)
{
    uint64_t sum = 0;
    *fds = 0;
    DIR *d = opendir("/proc/self/fd");
    for (struct dirent *e = d ? readdir(d) : NULL; e; e = readdir(d)) {
        if (e->d_name[0] == '.') {
            continue;
        }
        int fd = (int)strtol(e->d_name, NULL, 10);
        struct tcp_info ti;
        socklen_t len = sizeof ti;
        (*fds)++;
        memset(&ti, 0, sizeof ti);
        if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0 &&
            len >= offsetof(struct tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received) {
            sum += ti.tcpi_bytes_acked + ti.tcpi_bytes_received;
        }
    }
    if (d) {
        (void)closedir(d);
    }
    return sum;
}

// ---------------------------------------------------------------- a member

// Rank 0, at the window's start (k 0) and end (k 1): the servers' CPU, then
// the others are asked for their bytes.
static void s_sample(sw_shared *sh, int k)
{
    for (int i = 0; i < sh->n_servers; i++) {
        s_cpu(sh->servers[i], &sh->cpu_ns[k][i], &sh->cpu_ticks[k][i]);
    }
    atomic_store(&sh->sampled, k + 1);
    s_news(&sh->news);
}

static void s_on_work(sw_member *m, zps_client *c, const zps_work *w)
{
    const sw_cfg *cfg = m->p->cfg;
    sw_shared *sh = m->p->sh;
    if (zps_info_u64(c, ZPS_INFO_RANK) == 0 && w->step < SW_MAX_STEPS) {
        if (sh->step_ns[w->step] == 0) {
            sh->step_ns[w->step] = s_now_ns();
        }
        atomic_store(&sh->rank0_step, w->step);
        if (w->step == (uint64_t)cfg->warmup && atomic_load(&sh->sampled) == 0) {
            s_sample(sh, 0);
        } else if (w->step == (uint64_t)cfg->warmup + (uint64_t)cfg->steps &&
                   atomic_load(&sh->sampled) == 1) {
            s_sample(sh, 1);
        }
    }
    if (zps_work_start(c, w) != ZPS_OK) {
        return;
    }
    int n_buckets = (int)zps_info_u64(c, ZPS_INFO_N_BUCKETS);
    for (int b = 0; b < n_buckets; b++) {
        if (zps_push_bucket(c, w, b, m->p->grad, 0.0f) != ZPS_OK) {
            break; // the first failure is zps_work_done's
        }
    }
    if (zps_work_done(c, w) != ZPS_OK) {
        s_why(sh, "push", m->id, zps_errmsg(c));
    }
}

// Joins and works until the job ends; true at ZPS_NEXT_DONE.
static bool s_member_run(sw_member *m, zps_client *c)
{
    sw_shared *sh = m->p->sh;
    if (zps_client_set_int(c, ZPS_OPT_HEARTBEAT_MS, m->p->cfg->heartbeat_ms) != ZPS_OK ||
        zps_client_set_int(c, ZPS_OPT_SNDBUF, m->p->cfg->sndbuf_auto ? -1 : 0) != ZPS_OK ||
        zps_client_set_int(c, ZPS_OPT_SHM, m->p->cfg->shm ? 1 : 0) != ZPS_OK ||
        zps_client_set_str(c, ZPS_OPT_DEVICE, "cpu (bench/swarm)") != ZPS_OK ||
        zps_connect(c) != ZPS_OK || zps_join(c) != ZPS_OK ||
        zps_set_params(c, m->params, (size_t)m->p->cfg->params) != ZPS_OK) {
        s_why(sh, "join", m->id, zps_errmsg(c));
        return false;
    }
    atomic_fetch_add(&sh->joined, 1);
    zps_work w;
    for (;;) {
        int r = zps_next_work(c, &w);
        if (r == ZPS_NEXT_WORK) {
            s_on_work(m, c, &w);
        } else if (r == ZPS_NEXT_EVAL) {
            (void)zps_eval_done(c, &w, 0, 0.0);
        } else if (r == ZPS_NEXT_DONE) {
            (void)zps_leave(c);
            return true;
        } else if (r != ZPS_NEXT_ROLLBACK && r != ZPS_NEXT_REJOINED) {
            s_why(sh, "next_work", m->id, zps_errmsg(c));
            return false;
        }
    }
}

static void *s_member_main(void *arg)
{
    sw_member *m = arg;
    zps_client *c = m->p->clients[m->slot];
    bool ok = c && s_member_run(m, c);
    atomic_fetch_add(ok ? &m->p->sh->done : &m->p->sh->failed, 1);
    atomic_fetch_sub(&m->p->live, 1); // destroyed by s_proc_main: s_watch may stop it
    return NULL;
}

// A member process's own thread while its members run: adds its TCP bytes
// when rank 0 has sampled the servers, and stops the members when asked.
static void s_watch(sw_proc *p)
{
    int answered = 0;
    bool stopped = false;
    while (atomic_load(&p->live) > 0) {
        int seen = atomic_load(&p->sh->news);
        int k = atomic_load(&p->sh->sampled);
        if (k > answered) {
            int fds;
            atomic_fetch_add(&p->sh->tcp_bytes[k - 1], s_tcp_bytes(&fds));
            atomic_fetch_add(&p->sh->tcp_acks[k - 1], 1);
            if (fds > atomic_load(&p->sh->fds_max)) {
                atomic_store(&p->sh->fds_max, fds);
            }
            answered = k;
        }
        if (!stopped && atomic_load(&p->sh->stop)) {
            for (int i = 0; i < p->n; i++) {
                if (p->clients[i]) {
                    zps_client_stop(p->clients[i]);
                }
            }
            stopped = true;
        }
        s_await_news(&p->sh->news, seen, 50); // live reaching 0 is seen within 50 ms
    }
    int k = atomic_load(&p->sh->sampled);
    for (int j = answered; j < k; j++) { // the window ended with the job's last steps
        int fds;
        atomic_fetch_add(&p->sh->tcp_bytes[j], s_tcp_bytes(&fds));
        atomic_fetch_add(&p->sh->tcp_acks[j], 1);
    }
}

static void *s_destroy_main(void *arg)
{
    zps_client_destroy((zps_client **)arg);
    return NULL;
}

static int s_proc_main(sw_proc *p, int first)
{
    pthread_attr_t lib;
    if (pthread_attr_init(&lib) == 0 && pthread_attr_setstacksize(&lib, SW_LIB_STACK) == 0) {
        (void)pthread_setattr_default_np(&lib); // ZeroMQ's threads and the heartbeat's
    }
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) != 0 || pthread_attr_setstacksize(&attr, SW_MEMBER_STACK) != 0) {
        return 1;
    }
    p->clients = calloc((size_t)p->n, sizeof(zps_client *));
    sw_member *ms = calloc((size_t)p->n, sizeof *ms);
    pthread_t *ts = calloc((size_t)p->n, sizeof *ts);
    if (!p->clients || !ms || !ts) {
        return 1;
    }
    int started = 0;
    for (int i = 0; i < p->n; i++) {
        ms[i] = (sw_member){.p = p, .slot = i, .id = first + i,
                            .params = calloc((size_t)p->cfg->params, sizeof(float))};
        p->clients[i] = zps_client_new(p->endpoint);
        atomic_fetch_add(&p->live, 1);
        if (!ms[i].params || pthread_create(&ts[i], &attr, s_member_main, &ms[i]) != 0) {
            atomic_fetch_sub(&p->live, 1);
            s_why(p->sh, "start", first + i, "no memory or thread");
            break;
        }
        started++;
    }
    s_watch(p);
    for (int i = 0; i < started; i++) {
        pthread_join(ts[i], NULL);
    }
    // Destroyed side by side: each may wait out its linger (2 s) on a BYE
    // to a server already gone, and one after the other that is 2 s times
    // the members of the process.
    int destroying = 0;
    for (int i = 0; i < p->n; i++) {
        if (pthread_create(&ts[destroying], &lib, s_destroy_main, &p->clients[i]) == 0) {
            destroying++;
        } else {
            zps_client_destroy(&p->clients[i]);
        }
    }
    for (int i = 0; i < destroying; i++) {
        pthread_join(ts[i], NULL);
    }
    for (int i = 0; i < p->n; i++) {
        free(ms[i].params);
    }
    bool ok = started == p->n && atomic_load(&p->sh->failed) == 0;
    free(ts);
    free(ms);
    free(p->clients);
    return ok ? 0 : 1;
}

// ---------------------------------------------------------------- the servers

// Forks bin/zps-server with args (NULL-ended), its output to dir/log; the
// child dies with the bench.
static pid_t s_spawn(const sw_cfg *cfg, const char *dir, const char *log, char **args)
{
    char path[600], logpath[600];
    snprintf(path, sizeof path, "%s/zps-server", cfg->bin);
    snprintf(logpath, sizeof logpath, "%s/%s", dir, log);
    pid_t pid = fork();
    if (pid != 0) {
        return pid;
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int fd = open(logpath, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
        (void)dup2(fd, 1);
        (void)dup2(fd, 2);
        (void)close(fd);
    }
    args[0] = path;
    execv(path, args);
    fprintf(stderr, "swarm: exec %s: %s\n", path, strerror(errno));
    _exit(127);
}

// The endpoint a server wrote to file, within 20 s; false if it exited or
// stayed silent.
static bool s_wait_endpoint(pid_t pid, const char *file, char *ep, size_t len)
{
    for (int waited = 0; waited < 20000; waited += 10) {
        FILE *f = fopen(file, "r");
        if (f) {
            bool ok = fgets(ep, (int)len, f) != NULL;
            (void)fclose(f);
            if (ok && strchr(ep, '\n')) {
                ep[strcspn(ep, "\n")] = '\0';
                return true;
            }
        }
        if (waitpid(pid, NULL, WNOHANG) == pid) {
            return false;
        }
        s_sleep_ms(10);
    }
    return false;
}

// Starts shard 0 for N members, then the other shards; *ep gets shard 0's
// endpoint. False when one did not listen.
static bool s_start_servers(const sw_cfg *cfg, int n, const char *dir, sw_shared *sh, char *ep,
                            size_t len)
{
    char workers[16], batch[16], data[32], steps[16], model[32], shards[16], wt[16], file[600];
    snprintf(workers, sizeof workers, "%d", n);
    int b = cfg->global_batch ? cfg->global_batch : n * cfg->samples;
    snprintf(batch, sizeof batch, "%d", b);
    snprintf(data, sizeof data, "synthetic:%d", b * 16);
    snprintf(steps, sizeof steps, "%d", cfg->warmup + cfg->steps + 3); // 3: the bytes' margin
    snprintf(model, sizeof model, "flat:%d", cfg->params);
    snprintf(shards, sizeof shards, "%d", cfg->shards);
    snprintf(wt, sizeof wt, "%d", cfg->worker_timeout_ms);
    snprintf(file, sizeof file, "%s/s0.endpoint", dir);
    char *a0[] = {NULL, "--listen", "tcp://127.0.0.1:*", "--endpoint-file", file,
                  "--workers", workers, "--shards", shards, "--model", model, "--dataset", data,
                  "--global-batch", batch, "--steps", steps, "--lr-schedule", "constant",
                  "--worker-timeout-ms", wt, "--sndbuf", cfg->sndbuf_auto ? "auto" : "0", NULL};
    sh->servers[0] = s_spawn(cfg, dir, "s0.log", a0);
    sh->n_servers = 1;
    if (sh->servers[0] < 0 || !s_wait_endpoint(sh->servers[0], file, ep, len)) {
        return false;
    }
    for (int k = 1; k < cfg->shards; k++) {
        char index[16], log[32], kep[256];
        snprintf(index, sizeof index, "%d", k);
        snprintf(log, sizeof log, "s%d.log", k);
        snprintf(file, sizeof file, "%s/s%d.endpoint", dir, k);
        char *ak[] = {NULL, "--shard", index, "--shards", shards, "--coordinator", ep,
                      "--listen", "tcp://127.0.0.1:*", "--endpoint-file", file,
                      "--sndbuf", cfg->sndbuf_auto ? "auto" : "0", NULL};
        sh->servers[k] = s_spawn(cfg, dir, log, ak);
        sh->n_servers = k + 1;
        if (sh->servers[k] < 0 || !s_wait_endpoint(sh->servers[k], file, kep, sizeof kep)) {
            return false;
        }
    }
    return true;
}

// Waits up to ms for pid; its exit status, or -1 (killed then, or a signal).
static int s_reap(pid_t pid, int ms)
{
    int status = 0;
    for (int waited = 0; waited <= ms; waited += 10) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) {
            return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        }
        if (r < 0) {
            return -1;
        }
        s_sleep_ms(10);
    }
    (void)kill(pid, SIGKILL);
    (void)waitpid(pid, NULL, 0);
    return -1;
}

// ---------------------------------------------------------------- one N

// Forks the member processes; returns how many, their pids in pids.
static int s_fork_members(const sw_cfg *cfg, int n, sw_shared *sh, const char *ep, pid_t *pids)
{
    int procs = (n + cfg->per_proc - 1) / cfg->per_proc;
    float *grad = calloc((size_t)cfg->params, sizeof(float));
    if (!grad) {
        return 0;
    }
    for (int i = 0; i < procs; i++) {
        int first = (int)((int64_t)n * i / procs), last = (int)((int64_t)n * (i + 1) / procs);
        pids[i] = fork();
        if (pids[i] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            struct sched_param sp = {0};
            if (cfg->idle && sched_setscheduler(0, SCHED_IDLE, &sp) != 0) {
                fprintf(stderr, "swarm: SCHED_IDLE: %s\n", strerror(errno));
                _exit(1);
            }
            if (cfg->hosts) {
                char boot_id[32]; // unlike the servers': their shards are on "another host"
                snprintf(boot_id, sizeof boot_id, "swarm-host-%d", i);
                (void)setenv("ZPS_BOOT_ID", boot_id, 1);
            }
            sw_proc p = {.cfg = cfg, .sh = sh, .endpoint = ep, .grad = grad, .n = last - first};
            _exit(s_proc_main(&p, first));
        }
        if (pids[i] < 0) {
            free(grad);
            return i;
        }
    }
    free(grad);
    return procs;
}

// True when a server exited while members still work (left alone for the
// reaping): a server ends with the job, so only after every member's DONE.
static bool s_server_gone(sw_shared *sh, int n, int left)
{
    if (atomic_load(&sh->done) + atomic_load(&sh->failed) == n) {
        return false;
    }
    for (int k = 0; k < sh->n_servers; k++) {
        siginfo_t si = {0};
        if (waitid(P_PID, (id_t)sh->servers[k], &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
            si.si_pid == sh->servers[k]) {
            fprintf(stderr, "swarm: server %d exited with %d members' processes left\n", k, left);
            return true;
        }
    }
    return false;
}

// Waits for every member process, bounded by the deadline; then asks the
// members to leave. True when all exited 0.
static bool s_wait_members(sw_shared *sh, int n, pid_t *pids, int procs, uint64_t deadline_ns)
{
    int left = procs, bad = 0;
    while (left > 0 && s_now_ns() < deadline_ns && !s_server_gone(sh, n, left)) {
        for (int i = 0; i < procs; i++) {
            int status;
            if (pids[i] > 0 && waitpid(pids[i], &status, WNOHANG) == pids[i]) {
                bad += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
                pids[i] = 0;
                left--;
            }
        }
        s_sleep_ms(20);
    }
    if (left > 0) {
        fprintf(stderr, "swarm: stopped: %d members joined, %d done, %d failed; rank 0 at step "
                        "%" PRIu64 "\n",
                atomic_load(&sh->joined), atomic_load(&sh->done), atomic_load(&sh->failed),
                (uint64_t)atomic_load(&sh->rank0_step));
        atomic_store(&sh->stop, 1);
        s_news(&sh->news);
    }
    for (int i = 0; i < procs; i++) {
        if (pids[i] > 0) {
            bad += s_reap(pids[i], 10000) != 0;
        }
    }
    return left == 0 && bad == 0;
}

static int s_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// The row of N from what rank 0 sampled.
static void s_row(const sw_cfg *cfg, const sw_shared *sh, int n, sw_row *row)
{
    int s = cfg->steps;
    double gaps[SW_MAX_STEPS / 8] = {0};
    int g = 0;
    for (int t = cfg->warmup; t < cfg->warmup + s && g < (int)(sizeof gaps / sizeof gaps[0]); t++) {
        gaps[g++] = (double)(sh->step_ns[t + 1] - sh->step_ns[t]) / 1e6;
    }
    qsort(gaps, (size_t)g, sizeof gaps[0], s_cmp_double);
    *row = (sw_row){.n = n, .steps = s, .fds = atomic_load(&sh->fds_max)};
    row->step_ms = g ? gaps[g / 2] : 0;
    double per = 1.0 / ((double)s * n);
    row->coord_ms = (double)(sh->cpu_ns[1][0] - sh->cpu_ns[0][0]) / 1e6 / s;
    row->coord_us = (double)(sh->cpu_ns[1][0] - sh->cpu_ns[0][0]) / 1e3 * per;
    row->coord_stat_us = (double)(sh->cpu_ticks[1][0] - sh->cpu_ticks[0][0]) * 1e6 /
                         (double)sysconf(_SC_CLK_TCK) * per;
    for (int k = 1; k < sh->n_servers; k++) {
        row->shard_us[k] = (double)(sh->cpu_ns[1][k] - sh->cpu_ns[0][k]) / 1e3 * per;
    }
    row->bytes_member = (double)(atomic_load(&sh->tcp_bytes[1]) - atomic_load(&sh->tcp_bytes[0])) *
                        per;
}

// nftw's callback: removes one entry of a scratch directory, depth first.
static int s_remove(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

// One N: servers, members, the row; false (and why on stderr) on failure.
static bool s_run_n(const sw_cfg *cfg, int n, sw_row *row)
{
    char dir[512], ep[256];
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/zps-swarm-%d-XXXXXX", tmp && *tmp ? tmp : "/tmp", n);
    sw_shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                         // cppcheck-suppress invalidFunctionArg ; fd -1 is MAP_ANONYMOUS's
                         -1, 0);
    if (sh == MAP_FAILED || !mkdtemp(dir)) {
        fprintf(stderr, "swarm: no shared memory or scratch directory: %s\n", strerror(errno));
        return false;
    }
    memset(sh, 0, sizeof *sh);
    atomic_flag_clear(&sh->why_set);
    int procs = 0;
    bool ok = s_start_servers(cfg, n, dir, sh, ep, sizeof ep);
    uint64_t deadline = s_now_ns() + (uint64_t)cfg->timeout_s * 1000000000ull;
    if (ok) {
        pid_t pids[SW_MAX_PROCS] = {0};
        procs = s_fork_members(cfg, n, sh, ep, pids);
        ok = s_wait_members(sh, n, pids, procs, deadline) && procs > 0;
    }
    for (int k = 0; k < sh->n_servers; k++) { // they end with the job
        ok = s_reap(sh->servers[k], ok ? 10000 : 0) == 0 && ok;
    }
    ok = ok && atomic_load(&sh->sampled) == 2 && atomic_load(&sh->done) == n;
    if (ok) {
        s_row(cfg, sh, n, row);
        if (atomic_load(&sh->tcp_acks[0]) != procs || atomic_load(&sh->tcp_acks[1]) != procs) {
            row->bytes_member = -1;
        }
    } else {
        fprintf(stderr, "swarm: N=%d failed: %d joined, %d done, %d failed%s%s; logs in %s\n", n,
                atomic_load(&sh->joined), atomic_load(&sh->done), atomic_load(&sh->failed),
                sh->why[0] ? "; first: " : "", sh->why, dir);
    }
    if (ok && !cfg->keep) {
        ok = nftw(dir, s_remove, 8, FTW_DEPTH | FTW_PHYS) == 0;
    } else if (ok) {
        fprintf(stderr, "swarm: N=%d: logs kept in %s\n", n, dir);
    }
    (void)munmap(sh, sizeof *sh);
    return ok;
}

// ---------------------------------------------------------------- main

static void s_print_head(const sw_cfg *cfg)
{
    printf("| members | steps | coordinator CPU ms/step | µs/member/step | (stat ticks) |");
    for (int k = 1; k < cfg->shards; k++) {
        printf(" shard %d µs/member/step |", k);
    }
    printf(" median step ms | TCP bytes/member/step | fds/process |\n|---|---|---|---|---|");
    for (int k = 1; k < cfg->shards; k++) {
        printf("---|");
    }
    printf("---|---|---|\n");
}

static void s_print_row(const sw_cfg *cfg, const sw_row *r)
{
    printf("| %d | %d | %.3f | %.2f | %.1f |", r->n, r->steps, r->coord_ms, r->coord_us,
           r->coord_stat_us);
    for (int k = 1; k < cfg->shards; k++) {
        printf(" %.2f |", r->shard_us[k]);
    }
    if (r->bytes_member >= 0) {
        printf(" %.3f | %.0f | %d |\n", r->step_ms, r->bytes_member, r->fds);
    } else {
        printf(" %.3f | - | %d |\n", r->step_ms, r->fds);
    }
    (void)fflush(stdout);
}

// RLIMIT_NOFILE to the hard limit, and above it to what need fds take
// where the process may (root); prints the limit when it is short.
static void s_raise_nofile(long need)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        return;
    }
    if (rl.rlim_max != RLIM_INFINITY && (long)rl.rlim_max < need) {
        struct rlimit up = {(rlim_t)need, (rlim_t)need};
        if (setrlimit(RLIMIT_NOFILE, &up) == 0) {
            return;
        }
    }
    rl.rlim_cur = rl.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_max != RLIM_INFINITY && (long)rl.rlim_max < need) {
        fprintf(stderr, "swarm: RLIMIT_NOFILE is %ld, N may need %ld (ulimit -Hn)\n",
                (long)rl.rlim_max, need);
    }
}

static int s_usage(void)
{
    fprintf(stderr, "usage: swarm [--members N,N,...] [--shards K] [--warmup W] [--steps S]\n"
                    "             [--params P] [--samples B | --global-batch B] [--per-proc M]\n"
                    "             [--timeout-s T] [--worker-timeout-ms MS] [--shm auto|off]\n"
                    "             [--sndbuf 0|auto] [--hosts] [--heartbeat-ms MS] [--keep]\n"
                    "             [--members-sched other|idle]\n");
    return 2;
}

static bool s_parse_members(sw_cfg *cfg, const char *list)
{
    cfg->n_members = 0;
    for (const char *s = list; *s;) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > (long)SW_MAX_PROCS * 64 || cfg->n_members == SW_MAX_N) {
            return false;
        }
        cfg->members[cfg->n_members++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') {
            return false;
        }
    }
    return cfg->n_members > 0;
}

// An integer flag in [lo, hi].
static bool s_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < lo || v > hi) {
        return false;
    }
    *out = (int)v;
    return true;
}

static bool s_parse(int argc, char **argv, sw_cfg *cfg)
{
    static const struct option opts[] = {
        {"members", 1, NULL, 'm'}, {"shards", 1, NULL, 'k'}, {"warmup", 1, NULL, 'w'},
        {"steps", 1, NULL, 's'}, {"params", 1, NULL, 'P'}, {"samples", 1, NULL, 'b'},
        {"per-proc", 1, NULL, 'p'}, {"timeout-s", 1, NULL, 't'},
        {"worker-timeout-ms", 1, NULL, 'e'}, {"global-batch", 1, NULL, 'B'}, {"shm", 1, NULL, 'h'}, {"keep", 0, NULL, 'K'},
        {"sndbuf", 1, NULL, 'S'}, {"hosts", 0, NULL, 'H'}, {"heartbeat-ms", 1, NULL, 'r'},
        {"members-sched", 1, NULL, 'I'}, {NULL, 0, NULL, 0}};
    int opt;
    bool ok = true;
    while (ok && (opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (opt) {
        case 'm': ok = s_parse_members(cfg, optarg); break;
        case 'k': ok = s_int(optarg, 1, SW_MAX_SHARDS, &cfg->shards); break;
        case 'w': ok = s_int(optarg, 1, 1000, &cfg->warmup); break;
        case 's': ok = s_int(optarg, 2, SW_MAX_STEPS / 8, &cfg->steps); break;
        case 'P': ok = s_int(optarg, 1, 1 << 28, &cfg->params); break;
        case 'b': ok = s_int(optarg, 1, 1024, &cfg->samples); break;
        case 'B': ok = s_int(optarg, 1, 1 << 24, &cfg->global_batch); break;
        case 'p': ok = s_int(optarg, 1, 4096, &cfg->per_proc); break;
        case 't': ok = s_int(optarg, 1, 86400, &cfg->timeout_s); break;
        case 'e': ok = s_int(optarg, 100, 3600000, &cfg->worker_timeout_ms); break;
        case 'h': ok = !strcmp(optarg, "auto") || !strcmp(optarg, "off");
                  cfg->shm = !strcmp(optarg, "auto"); break;
        case 'K': cfg->keep = true; break;
        case 'H': cfg->hosts = true; break;
        case 'r': ok = s_int(optarg, 10, 600000, &cfg->heartbeat_ms); break;
        case 'S': ok = !strcmp(optarg, "auto") || !strcmp(optarg, "0");
                  cfg->sndbuf_auto = !strcmp(optarg, "auto"); break;
        case 'I': ok = !strcmp(optarg, "idle") || !strcmp(optarg, "other");
                  cfg->idle = !strcmp(optarg, "idle"); break;
        default: ok = false;
        }
    }
    return ok && optind == argc;
}

int main(int argc, char **argv)
{
    sw_cfg cfg = {.members = {64, 256, 1024, 4096}, .n_members = 4, .shards = 1, .warmup = 10,
                  .steps = 40, .params = 4096, .samples = 1, .per_proc = 512,
                  .timeout_s = 600, .worker_timeout_ms = 60000, .heartbeat_ms = 1000,
                  .shm = true};
    if (!s_parse(argc, argv, &cfg)) {
        return s_usage();
    }
    const char *bin = getenv("ZPS_BIN_DIR");
    snprintf(cfg.bin, sizeof cfg.bin, "%s", bin && *bin ? bin : "bin");
    int most = 0;
    for (int i = 0; i < cfg.n_members; i++) {
        most = cfg.members[i] > most ? cfg.members[i] : most;
        if ((cfg.members[i] + cfg.per_proc - 1) / cfg.per_proc > SW_MAX_PROCS) {
            fprintf(stderr, "swarm: %d members need more than %d processes: raise --per-proc\n",
                    cfg.members[i], SW_MAX_PROCS);
            return 2;
        }
    }
    if (cfg.hosts && cfg.per_proc > 64) {
        fprintf(stderr, "swarm: --hosts takes --per-proc up to 64, a host group's most\n");
        return 2;
    }
    long per_proc = most < cfg.per_proc ? most : cfg.per_proc;
    long need = (long)SW_FDS_PER_MEMBER * (per_proc > most / 2 ? per_proc : most / 2) + 256;
    s_raise_nofile(need);
    (void)signal(SIGPIPE, SIG_IGN);
    zps_set_log_level(ZPS_LOG_LEVEL_WARN);
    printf("bench/swarm: flat:%d, %d shard(s), global batch %d a member, warm-up %d steps, "
           "%d measured, at most %d members a process%s, --shm %s\n",
           cfg.params, cfg.shards, cfg.samples, cfg.warmup, cfg.steps, cfg.per_proc,
           cfg.hosts ? " (a host each: one push per host)" : "", cfg.shm ? "auto" : "off");
    s_print_head(&cfg);
    int failed = 0;
    for (int i = 0; i < cfg.n_members; i++) {
        sw_row row;
        if (s_run_n(&cfg, cfg.members[i], &row)) {
            s_print_row(&cfg, &row);
        } else {
            printf("| %d | FAILED (stderr says why) |\n", cfg.members[i]);
            failed++;
        }
    }
    return failed ? 1 : 0;
}
