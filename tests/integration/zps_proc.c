/* zps_proc.c - process helpers for the integration tests. Every wait is
 * bounded; every process started is killed by pid at the end. */
#include "zps_proc.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/zps_clock.h"

// A test that returns or calls exit() kills what it started on the way
// out; a failed ck_assert ends the test's process with _exit, and
// PR_SET_PDEATHSIG kills its children then.
static zps_procs *s_current;

// The runner's list of the scratch directories its tests made (one line
// each, appended by the forked tests): those left at the end are failed
// tests', whose logs zps_procs_end_run prints.
static char s_made_list[256];

// The last lines of every log a failed test leaves: the directory is
// gone with the machine when CI fails, and its output is all that stays.
#define ZPS_PROC_TAIL_LINES 12
static void s_print_tails(const char *dir)
{
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 4, ".log") != 0) {
            continue;
        }
        char path[1024], lines[ZPS_PROC_TAIL_LINES][256];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "r");
        int n = 0;
        while (f && fgets(lines[n % ZPS_PROC_TAIL_LINES], sizeof lines[0], f)) {
            n++;
        }
        if (f) {
            fclose(f);
        }
        fprintf(stderr, "---- %s, its last %d of %d lines:\n", e->d_name,
                n < ZPS_PROC_TAIL_LINES ? n : ZPS_PROC_TAIL_LINES, n);
        for (int i = n < ZPS_PROC_TAIL_LINES ? 0 : n - ZPS_PROC_TAIL_LINES; i < n; i++) {
            fputs(lines[i % ZPS_PROC_TAIL_LINES], stderr);
        }
    }
    if (d) {
        closedir(d);
    }
}

static void s_kill_current(void)
{
    if (s_current) {
        zps_procs_fini(s_current, true);
    }
}

void zps_procs_init(zps_procs *ps, const char *name)
{
    memset(ps, 0, sizeof *ps);
    if (!s_current) {
        atexit(s_kill_current);
    }
    s_current = ps;
    const char *tmp = getenv("TMPDIR");
    snprintf(ps->dir, sizeof ps->dir, "%s/zps-%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", name);
    ck_assert_ptr_nonnull(mkdtemp(ps->dir));
    FILE *made = s_made_list[0] ? fopen(s_made_list, "a") : NULL;
    if (made) {
        fprintf(made, "%s\n", ps->dir);
        fclose(made);
    }
}

void zps_procs_begin_run(void)
{
    snprintf(s_made_list, sizeof s_made_list, "/tmp/zps-integration-dirs-%d", (int)getpid());
    FILE *made = fopen(s_made_list, "w");
    if (made) {
        fclose(made);
    } else {
        s_made_list[0] = '\0'; // no report of the logs left: the tests run as ever
    }
}

void zps_procs_end_run(bool print_kept)
{
    FILE *made = s_made_list[0] ? fopen(s_made_list, "r") : NULL;
    char dir[300];
    while (made && fgets(dir, sizeof dir, made)) {
        dir[strcspn(dir, "\n")] = '\0';
        if (print_kept && access(dir, F_OK) == 0) {
            fprintf(stderr, "==== logs of a failed test, kept in %s\n", dir);
            s_print_tails(dir);
        }
    }
    if (made) {
        fclose(made);
        (void)unlink(s_made_list);
    }
}

void zps_procs_fini(zps_procs *ps, bool keep)
{
    if (s_current == ps) {
        s_current = NULL;
    }
    for (int i = 0; i < ZPS_PROC_MAX; i++) {
        if (ps->pids[i] > 0) {
            kill(ps->pids[i], SIGKILL);
            waitpid(ps->pids[i], NULL, 0);
            ps->pids[i] = 0;
        }
    }
    if (!keep) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", ps->dir);
        if (system(cmd) != 0) {
            fprintf(stderr, "could not remove %s\n", ps->dir);
        }
    } else {
        fprintf(stderr, "logs kept in %s\n", ps->dir);
    }
}

const char *zps_procs_path(const zps_procs *ps, const char *name)
{
    static char bufs[8][512];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", ps->dir, name);
    return b;
}

pid_t zps_procs_fork_logged(const zps_procs *ps, const char *log)
{
    const char *logpath = zps_procs_path(ps, log);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(logpath, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
    }
    return pid;
}

pid_t zps_procs_start(zps_procs *ps, const char *prog, const char *log, const char *const *args)
{
    const char *bin = getenv("ZPS_BIN_DIR");
    char path[512];
    snprintf(path, sizeof path, "%s/%s", bin && *bin ? bin : "bin", prog);
    const char *argv[64] = {path};
    int n = 1;
    for (; args[n - 1] && n < 63; n++) {
        argv[n] = args[n - 1];
    }
    argv[n] = NULL;
    int slot = 0;
    while (slot < ZPS_PROC_MAX && ps->pids[slot] > 0) {
        slot++;
    }
    ck_assert_int_lt(slot, ZPS_PROC_MAX);
    pid_t pid = zps_procs_fork_logged(ps, log);
    if (pid == 0) {
        execv(path, (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", path, strerror(errno));
        _exit(127);
    }
    ps->pids[slot] = pid;
    return pid;
}

// The first line of /proc/PID/task/TID/NAME into out ("?" if unreadable).
static void s_read_task(pid_t pid, const char *tid, const char *name, char *out, size_t len)
{
    char path[512];
    snprintf(path, sizeof path, "/proc/%d/task/%s/%s", (int)pid, tid, name);
    FILE *f = fopen(path, "r");
    if (!f || !fgets(out, (int)len, f)) {
        snprintf(out, len, "?");
    }
    out[strcspn(out, "\n")] = '\0';
    if (f) {
        fclose(f);
    }
}

// Where each thread of a process that outlived its wait is blocked: its
// name, kernel wait channel and system call (number, arguments, stack and
// instruction pointers), so that a hang seen once can be placed.
static void s_tell_where(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.') {
            continue;
        }
        char comm[64], wchan[64], sys[256];
        s_read_task(pid, e->d_name, "comm", comm, sizeof comm);
        s_read_task(pid, e->d_name, "wchan", wchan, sizeof wchan);
        s_read_task(pid, e->d_name, "syscall", sys, sizeof sys);
        fprintf(stderr, "  thread %s (%s): wchan %s, syscall %s\n", e->d_name, comm, wchan, sys);
    }
    if (d) {
        closedir(d);
    }
}

int zps_procs_wait(zps_procs *ps, pid_t pid, int timeout_ms)
{
    double deadline = zps_clock_ms() + timeout_ms;
    int status = 0;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) {
            break;
        }
        if (zps_clock_ms() > deadline) {
            fprintf(stderr, "pid %d still running after %d ms: killing it; its threads:\n",
                    (int)pid, timeout_ms);
            s_tell_where(pid);
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            status = -1;
            break;
        }
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    for (int i = 0; i < ZPS_PROC_MAX; i++) {
        if (ps->pids[i] == pid) {
            ps->pids[i] = 0;
        }
    }
    if (status == -1 || !WIFEXITED(status)) {
        return -1;
    }
    return WEXITSTATUS(status);
}

const char *zps_procs_start_server(zps_procs *ps, const char *tag, pid_t *pid,
                                   const char *const *args, int timeout_ms)
{
    static char endpoint[256];
    char name[128], log[128];
    snprintf(name, sizeof name, "%s.endpoint", tag);
    snprintf(log, sizeof log, "%s.log", tag);
    const char *file = zps_procs_path(ps, name);
    const char *full[48] = {"--listen", "tcp://127.0.0.1:*", "--endpoint-file", file};
    int n = 4;
    for (int i = 0; args[i] && n < 47; i++) {
        full[n++] = args[i];
    }
    full[n] = NULL;
    unlink(file); // a previous server's
    *pid = zps_procs_start(ps, "zps-server", log, full);
    double deadline = zps_clock_ms() + timeout_ms;
    while (zps_clock_ms() < deadline) {
        FILE *f = fopen(file, "r");
        if (f) {
            bool ok = fgets(endpoint, sizeof endpoint, f) != NULL;
            fclose(f);
            if (ok) {
                endpoint[strcspn(endpoint, "\n")] = '\0';
                return endpoint;
            }
        }
        int status;
        if (waitpid(*pid, &status, WNOHANG) == *pid) {
            ck_abort_msg("zps-server exited before listening; see %s/%s", ps->dir, log);
        }
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    ck_abort_msg("zps-server did not listen within %d ms", timeout_ms);
    return NULL;
}

size_t zps_read_floats(const char *path, float **out)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        return 0;
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    size_t n = len > 0 ? (size_t)len / sizeof(float) : 0;
    *out = malloc(n * sizeof(float) + 1);
    if (fread(*out, sizeof(float), n, f) != n) {
        n = 0;
    }
    fclose(f);
    return n;
}

float *zps_procs_load_params(const zps_procs *ps, const char *name, size_t n)
{
    float *p;
    size_t got = zps_read_floats(zps_procs_path(ps, name), &p);
    ck_assert_msg(got == n, "%s/%s holds %zu floats, the model has %zu", ps->dir, name, got, n);
    return p;
}

double zps_max_abs_diff(const float *a, const float *b, size_t n)
{
    double d = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        d = e > d || isnan(e) ? e : d;
    }
    return d;
}

double zps_procs_params_diff(const zps_procs *ps, const char *a, const char *b, size_t n)
{
    float *x = zps_procs_load_params(ps, a, n), *y = zps_procs_load_params(ps, b, n);
    double d = zps_max_abs_diff(x, y, n);
    free(x);
    free(y);
    return d;
}

void zps_procs_status(const char *endpoint, zps_wire_msg *m)
{
    void *ctx = zmq_ctx_new();
    void *sock = zps_wire_socket(ctx, ZMQ_DEALER, 5000);
    ck_assert_int_eq(zmq_connect(sock, endpoint), 0);
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__STATUS);
    ck_assert_int_eq(zps_wire_send(sock, NULL, &h, NULL, 0, NULL), ZPS_OK);
    ck_assert_int_eq(zps_wire_recv(sock, false, m), ZPS_OK);
    ck_assert_ptr_nonnull(m->hdr->status);
    int zero = 0;
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_close(sock);
    zmq_ctx_term(ctx);
}

int zps_procs_log_count(const zps_procs *ps, const char *log, const char *text)
{
    FILE *f = fopen(zps_procs_path(ps, log), "r");
    if (!f) {
        return -1;
    }
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        n += strstr(line, text) != NULL;
    }
    fclose(f);
    return n;
}

bool zps_procs_log_has(const zps_procs *ps, const char *log, const char *text)
{
    return zps_procs_log_count(ps, log, text) > 0;
}

void zps_procs_adopt(zps_procs *ps, pid_t pid)
{
    for (int i = 0; i < ZPS_PROC_MAX; i++) {
        if (ps->pids[i] <= 0) {
            ps->pids[i] = pid;
            return;
        }
    }
    ck_abort_msg("more than %d processes in one test", ZPS_PROC_MAX);
}

bool zps_proc_alive(pid_t pid)
{
    char path[64], stat[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) {
        return false;
    }
    bool ok = fgets(stat, sizeof stat, f) != NULL;
    fclose(f);
    const char *paren = ok ? strrchr(stat, ')') : NULL;
    return paren && paren[1] == ' ' && paren[2] != 'Z' && paren[2] != 'X';
}

int zps_procs_sh(zps_procs *ps, const char *cmdline, const char *log, int timeout_ms)
{
    pid_t pid = zps_procs_fork_logged(ps, log);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmdline, (char *)NULL);
        _exit(127);
    }
    zps_procs_adopt(ps, pid);
    return zps_procs_wait(ps, pid, timeout_ms);
}

int zps_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static void s_nap_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

void zps_procs_wait_log(const zps_procs *ps, const char *log, const char *text, int timeout_ms)
{
    double deadline = zps_clock_ms() + timeout_ms;
    while (!zps_procs_log_has(ps, log, text)) {
        ck_assert_msg(zps_clock_ms() < deadline, "no '%s' in %s/%s within %d ms", text, ps->dir,
                      log, timeout_ms);
        s_nap_ms(20);
    }
}

uint64_t zps_procs_wait_step(const char *endpoint, uint64_t step, int timeout_ms)
{
    double deadline = zps_clock_ms() + timeout_ms;
    for (;;) {
        zps_wire_msg m;
        zps_procs_status(endpoint, &m);
        uint64_t at = m.hdr->status->step;
        zps_wire_msg_fini(&m);
        if (at >= step) {
            return at;
        }
        ck_assert_msg(zps_clock_ms() < deadline, "step %llu not reached within %d ms",
                      (unsigned long long)step, timeout_ms);
        s_nap_ms(5);
    }
}
