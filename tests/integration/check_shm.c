/* check_shm.c - same-host shared memory (docs/choices.md): a job whose
 * pushes go through memfd segments ends with the bits of the same job
 * over TCP; a worker SIGKILLed mid-run leaves no segment mapped anywhere
 * and the job goes on; a member's forged header naming a span outside its
 * segment, or a segment not there, is refused and changes nothing. Real
 * processes, every wait bounded, killed by pid at the end. */
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/zps_clock.h"
#include "common/zps_model.h"
#include "common/zps_shm.h"
#include "common/zps_wire.h"
#include "zps_integration.h"
#include "zps_proc.h"

#define RUN_TIMEOUT_MS 120000

static void s_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

// ---------------------------------------------------------------------------
// Segments as /proc shows them.

// The inode of the first zps segment pid maps, or 0.
static unsigned long s_segment_inode(pid_t pid)
{
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
    FILE *f = fopen(path, "r");
    unsigned long inode = 0;
    while (f && !inode && fgets(line, sizeof line, f)) {
        unsigned long ino;
        if (strstr(line, "memfd:" ZPS_SHM_NAME) &&
            sscanf(line, "%*s %*s %*s %*s %lu", &ino) == 1) {
            inode = ino;
        }
    }
    if (f) {
        fclose(f);
    }
    return inode;
}

// Whether pid maps the segment of that inode.
static bool s_maps_inode(pid_t pid, unsigned long inode)
{
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
    FILE *f = fopen(path, "r");
    bool found = false;
    while (f && !found && fgets(line, sizeof line, f)) {
        unsigned long ino;
        found = strstr(line, "memfd:" ZPS_SHM_NAME) &&
                sscanf(line, "%*s %*s %*s %*s %lu", &ino) == 1 && ino == inode;
    }
    if (f) {
        fclose(f);
    }
    return found;
}

// Processes of this host (those /proc lets us read) that map the inode.
static int s_mappers(unsigned long inode)
{
    DIR *d = opendir("/proc");
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        n += *end == '\0' && pid > 0 && s_maps_inode((pid_t)pid, inode);
    }
    closedir(d);
    return n;
}

// Entries of /dev/shm whose name says zps (memfd segments never make one).
static int s_dev_shm_zps(void)
{
    DIR *d = opendir("/dev/shm");
    if (!d) {
        return 0;
    }
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        n += strstr(e->d_name, "zps") != NULL;
    }
    closedir(d);
    return n;
}

// ---------------------------------------------------------------------------
// (a) The same job through shared memory and over TCP: the same bits.

typedef struct run {
    const char *tag;   // names the run's files
    const char *model; // --model (NULL: the default MLP)
    const char *dtype; // --wire-dtype
    const char *shm;   // the workers' --shm
    const char *deny;  // the shards' --shm (NULL: their default)
} run;

// Two shards, two workers, 30 steps; every process must exit 0.
static void s_train(zps_procs *ps, const run *r)
{
    char tag[64];
    snprintf(tag, sizeof tag, "%s-s0", r->tag);
    const char *sargs[] = {"--workers", "2", "--global-batch", "64", "--steps", "30",
                           "--seed", "3", "--shards", "2", "--wire-dtype", r->dtype,
                           "--shm", r->deny ? r->deny : "auto",
                           r->model ? "--model" : NULL, r->model, NULL};
    pid_t servers[2];
    char endpoint[256];
    snprintf(endpoint, sizeof endpoint, "%s",
             zps_procs_start_server(ps, tag, &servers[0], sargs, 10000));
    snprintf(tag, sizeof tag, "%s-s1", r->tag);
    const char *kargs[] = {"--shard", "1", "--shards", "2", "--coordinator", endpoint,
                           "--shm", r->deny ? r->deny : "auto", NULL};
    zps_procs_start_server(ps, tag, &servers[1], kargs, 10000);
    pid_t pids[2];
    for (int i = 0; i < 2; i++) {
        char out[64], log[64];
        snprintf(out, sizeof out, "%s-w%d.bin", r->tag, i);
        snprintf(log, sizeof log, "%s-w%d.log", r->tag, i);
        const char *wargs[] = {"--coordinator", endpoint, "--save-params", zps_procs_path(ps, out),
                               "--cache-dir", ZPS_TEST_CACHE, "--timeout-ms", "30000",
                               "--shm", r->shm, NULL};
        pids[i] = zps_procs_start(ps, "zps-worker", log, wargs);
    }
    for (int i = 0; i < 2; i++) {
        ck_assert_msg(zps_procs_wait(ps, pids[i], RUN_TIMEOUT_MS) == 0, "worker %d of %s", i,
                      r->tag);
    }
    for (int k = 0; k < 2; k++) {
        ck_assert_msg(zps_procs_wait(ps, servers[k], 30000) == 0, "shard %d of %s", k, r->tag);
    }
}

// What a shard's log says at its end of the parameters it named in its
// segment: the notices, and those that named a whole step.
static void s_notices(zps_procs *ps, const char *log, unsigned long long *notices,
                      unsigned long long *whole)
{
    FILE *f = fopen(zps_procs_path(ps, log), "r");
    ck_assert_ptr_nonnull(f);
    char line[512];
    while (fgets(line, sizeof line, f)) {
        const char *at = strstr(line, ": ");
        at = at ? strstr(at, "shard ") : NULL;
        unsigned shard;
        if (at && strstr(at, "notices of parameters") &&
            sscanf(at, "shard %u: %llu notices of parameters in its segment, %llu of them", &shard,
                   notices, whole) == 3) {
            break;
        }
    }
    fclose(f);
}

static void s_check_same_bits(const char *model, const char *dtype)
{
    zps_procs ps;
    zps_procs_init(&ps, "shm-bits");
    zps_model_spec spec;
    ck_assert_int_eq(zps_model_parse(model ? model : "mlp:784-512-512-10", &spec), ZPS_OK);
    run shm = {.tag = "shm", .model = model, .dtype = dtype, .shm = "on"};
    run tcp = {.tag = "tcp", .model = model, .dtype = dtype, .shm = "off"};
    // One pull per host is the default (docs/choices.md): no
    // ZPS_SHM_PARAMS in the workers' environment, which they inherit.
    ck_assert_int_eq(unsetenv("ZPS_SHM_PARAMS"), 0);
    s_train(&ps, &shm);
    s_train(&ps, &tcp);
    // Both shards took both workers' pushes through shared memory in the
    // one run, none in the other.
    ck_assert_int_eq(zps_procs_log_count(&ps, "shm-s0.log", "pushes through shared memory"), 2);
    ck_assert_int_eq(zps_procs_log_count(&ps, "shm-s1.log", "pushes through shared memory"), 2);
    ck_assert_int_eq(zps_procs_log_count(&ps, "tcp-s0.log", "shared memory"), 0);
    ck_assert_int_eq(zps_procs_log_count(&ps, "tcp-s1.log", "shared memory"), 0);
    // And the parameters came back through each shard's one segment: both
    // workers mapped both shards' (one pull per host), none in the other.
    for (int k = 0; k < 2; k++) {
        char log[32];
        snprintf(log, sizeof log, "shm-s%d.log", k);
        ck_assert_int_eq(zps_procs_log_count(&ps, log, "parameters for the workers of this "
                                                       "host through shared memory"), 1);
        // A notice a step and worker named the rest of the step's buckets,
        // and at most one more its first bucket.
        unsigned long long notices = 0, whole = 0;
        s_notices(&ps, log, &notices, &whole);
        fprintf(stderr, "%s: %llu notices, %llu of a whole step\n", log, notices, whole);
        ck_assert_uint_ge(whole, 2 * 29);
        ck_assert_uint_le(notices, 2 * whole);
        snprintf(log, sizeof log, "shm-w%d.log", k);
        ck_assert_int_eq(zps_procs_log_count(&ps, log, "parameters through shared memory ("), 2);
        ck_assert_int_eq(zps_procs_log_count(&ps, log, "frames from now on"), 0);
        snprintf(log, sizeof log, "tcp-w%d.log", k);
        ck_assert_int_eq(zps_procs_log_count(&ps, log, "shared memory"), 0);
    }
    float *a0 = zps_procs_load_params(&ps, "shm-w0.bin", spec.n_params);
    float *a1 = zps_procs_load_params(&ps, "shm-w1.bin", spec.n_params);
    float *b0 = zps_procs_load_params(&ps, "tcp-w0.bin", spec.n_params);
    float *init = malloc(spec.n_params * sizeof(float));
    zps_model_init_params(&spec, 3, init);
    fprintf(stderr, "%s %s: %zu parameters moved up to %.3g, shm and tcp %.3g apart\n",
            model ? model : "mlp", dtype, spec.n_params,
            zps_max_abs_diff(a0, init, spec.n_params), zps_max_abs_diff(a0, b0, spec.n_params));
    ck_assert_msg(memcmp(a0, init, spec.n_params * sizeof(float)) != 0, "nothing trained");
    ck_assert_msg(memcmp(a0, a1, spec.n_params * sizeof(float)) == 0, "the workers differ");
    ck_assert_msg(memcmp(a0, b0, spec.n_params * sizeof(float)) == 0,
                  "shared memory and TCP end %.3g apart", zps_max_abs_diff(a0, b0, spec.n_params));
    free(a0);
    free(a1);
    free(b0);
    free(init);
    zps_procs_fini(&ps, false);
}

START_TEST(test_shm_mlp_equals_tcp_bitwise)
{
    s_check_same_bits(NULL, "fp32");
}
END_TEST

START_TEST(test_shm_flat_equals_tcp_bitwise)
{
    s_check_same_bits("flat:300000", "fp32");
}
END_TEST

START_TEST(test_shm_flat_bf16_equals_tcp_bitwise)
{
    s_check_same_bits("flat:300000", "bf16");
}
END_TEST

// The parameters two runs saved, in files a and b, are the same bits.
static void s_check_bits_equal(zps_procs *ps, const char *a_file, const char *b_file, size_t n)
{
    float *a = zps_procs_load_params(ps, a_file, n);
    float *b = zps_procs_load_params(ps, b_file, n);
    ck_assert_msg(memcmp(a, b, n * sizeof(float)) == 0, "%s and %s differ (max |diff| %.3g)",
                  a_file, b_file, zps_max_abs_diff(a, b, n));
    free(a);
    free(b);
}

// Shards that refuse (--shm deny): each worker's first push to each is
// refused once, computed again and sent as frames, and the run is the
// TCP run, bit for bit.
START_TEST(test_shm_refused_falls_back_to_frames_bitwise)
{
    zps_procs ps;
    zps_procs_init(&ps, "shm-deny");
    zps_model_spec spec;
    ck_assert_int_eq(zps_model_parse("flat:300000", &spec), ZPS_OK);
    run deny = {.tag = "deny", .model = "flat:300000", .dtype = "fp32", .shm = "on",
                .deny = "deny"};
    run tcp = {.tag = "tcp", .model = "flat:300000", .dtype = "fp32", .shm = "off"};
    s_train(&ps, &deny);
    s_train(&ps, &tcp);
    for (int i = 0; i < 2; i++) {
        char log[32];
        snprintf(log, sizeof log, "deny-w%d.log", i);
        ck_assert_int_eq(zps_procs_log_count(&ps, log, "pushing frames from now on"), 2);
    }
    ck_assert_int_eq(zps_procs_log_count(&ps, "deny-s0.log", "pushes through shared memory"), 0);
    ck_assert_int_eq(zps_procs_log_count(&ps, "deny-s1.log", "--shm deny on this shard"), 2);
    s_check_bits_equal(&ps, "deny-w0.bin", "tcp-w0.bin", spec.n_params);
    zps_procs_fini(&ps, false);
}
END_TEST

// ZPS_SHM_PARAMS=off in the workers' environment: pushes still through
// shared memory, parameters back as frames, and the same bits as TCP.
START_TEST(test_shm_params_off_takes_frames_bitwise)
{
    zps_procs ps;
    zps_procs_init(&ps, "shm-poff");
    zps_model_spec spec;
    ck_assert_int_eq(zps_model_parse("flat:300000", &spec), ZPS_OK);
    run poff = {.tag = "poff", .model = "flat:300000", .dtype = "fp32", .shm = "on"};
    run tcp = {.tag = "tcp", .model = "flat:300000", .dtype = "fp32", .shm = "off"};
    ck_assert_int_eq(setenv("ZPS_SHM_PARAMS", "off", 1), 0);
    s_train(&ps, &poff);
    ck_assert_int_eq(unsetenv("ZPS_SHM_PARAMS"), 0);
    s_train(&ps, &tcp);
    ck_assert_int_eq(zps_procs_log_count(&ps, "poff-s0.log", "pushes through shared memory"), 2);
    ck_assert_int_eq(zps_procs_log_count(&ps, "poff-s1.log", "pushes through shared memory"), 2);
    for (int i = 0; i < 2; i++) {
        char log[32];
        snprintf(log, sizeof log, "poff-w%d.log", i);
        ck_assert_int_eq(zps_procs_log_count(&ps, log, "parameters through shared memory"), 0);
    }
    s_check_bits_equal(&ps, "poff-w0.bin", "tcp-w0.bin", spec.n_params);
    zps_procs_fini(&ps, false);
}
END_TEST

// ---------------------------------------------------------------------------
// (b) A worker SIGKILLed mid-run: its segment is mapped nowhere once the
// shard noticed, and the job goes on as it does over TCP.

START_TEST(test_shm_killed_worker_leaves_no_segment)
{
    zps_procs ps;
    zps_procs_init(&ps, "shm-kill");
    int dev_shm = s_dev_shm_zps();
    const char *sargs[] = {"--workers", "3", "--model", "mlp:784-256-10", "--dataset",
                           "synthetic:7680", "--global-batch", "96", "--epochs", "3",
                           "--worker-timeout-ms", "1000", NULL};
    pid_t server;
    char ep[256];
    snprintf(ep, sizeof ep, "%s", zps_procs_start_server(&ps, "server", &server, sargs, 10000));
    pid_t w[3];
    for (int i = 0; i < 3; i++) {
        char log[32];
        snprintf(log, sizeof log, "w%d.log", i);
        const char *wargs[] = {"--coordinator", ep, "--cache-dir", ZPS_TEST_CACHE,
                               "--heartbeat-ms", "200", NULL};
        w[i] = zps_procs_start(&ps, "zps-worker", log, wargs);
    }
    // Worker 1 pushed through its segment, and the shard mapped it.
    unsigned long inode = 0;
    double until = zps_clock_ms() + 30000;
    while (!(inode && s_maps_inode(server, inode)) && zps_clock_ms() < until) {
        inode = s_segment_inode(w[1]);
        s_sleep_ms(20);
    }
    ck_assert_msg(inode && s_maps_inode(server, inode), "the shard never mapped worker 1's");
    zps_wire_msg m;
    zps_procs_status(ep, &m);
    uint64_t step = m.hdr->status->step;
    zps_wire_msg_fini(&m);
    ck_assert_int_eq(kill(w[1], SIGKILL), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, w[1], 5000), -1);
    // Unmapped by the shard, while the job runs on.
    until = zps_clock_ms() + 20000;
    while (s_maps_inode(server, inode) && zps_clock_ms() < until) {
        s_sleep_ms(50);
    }
    ck_assert_msg(!s_maps_inode(server, inode), "the shard still maps the dead worker's segment");
    ck_assert_msg(zps_proc_alive(server), "the server is gone");
    ck_assert_int_eq(s_mappers(inode), 0);
    ck_assert(zps_procs_log_has(&ps, "server.log", "is gone; its segment is unmapped"));
    ck_assert_int_eq(zps_procs_wait(&ps, w[0], RUN_TIMEOUT_MS), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, w[2], RUN_TIMEOUT_MS), 0);
    ck_assert_int_eq(zps_procs_wait(&ps, server, 30000), 0);
    fprintf(stderr, "killed at step %llu: segment unmapped, the job ended\n",
            (unsigned long long)step);
    ck_assert_int_eq(s_mappers(inode), 0);
    ck_assert_int_eq(s_dev_shm_zps(), dev_shm); // memfds never name a file
    zps_procs_fini(&ps, false);
}
END_TEST

// ---------------------------------------------------------------------------
// (c) A member lying in its shm header: refused, nothing counted.

#define FORGED_P 4096 // flat:FORGED_P, one shard

typedef struct member {
    void *ctx, *sock;
    uint64_t job_id, member_id;
    uint32_t rank, generation;
} member;

// HELLO until JOB: the test is the job's one worker.
static void s_join(member *me, const char *ep)
{
    me->ctx = zmq_ctx_new();
    me->sock = zps_wire_socket(me->ctx, ZMQ_DEALER, 3000);
    ck_assert_int_eq(zmq_connect(me->sock, ep), 0);
    Zps__Hello hello = ZPS__HELLO__INIT;
    hello.host = "test";
    hello.device = "cpu";
    hello.pid = (uint32_t)getpid();
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__HELLO);
    h.hello = &hello;
    ck_assert_int_eq(zps_wire_send(me->sock, NULL, &h, NULL, 0, NULL), ZPS_OK);
    for (int tries = 0; tries < 20; tries++) {
        zps_wire_msg m;
        zps_err err = zps_wire_recv(me->sock, false, &m);
        if (err == ZPS_OK && m.hdr->type == ZPS__MSG_TYPE__JOB && m.hdr->job) {
            me->job_id = m.hdr->job_id;
            me->member_id = m.hdr->job->member_id;
            me->rank = m.hdr->job->rank;
            me->generation = m.hdr->job->generation;
            zps_wire_msg_fini(&m);
            return;
        }
        zps_wire_msg_fini(&m);
    }
    ck_abort_msg("no JOB");
}

static void s_member_header(const member *me, Zps__Header *h, Zps__MsgType type)
{
    zps_wire_header_init(h, type);
    h->job_id = me->job_id;
    h->member_id = me->member_id;
    h->rank = me->rank;
    h->generation = me->generation;
}

// The parameters of `step` the shard sends (all FORGED_P of them, one
// bucket or more), into out; after `send`, if not NULL. Refusals fail.
static void s_params(member *me, uint64_t step, float *out)
{
    uint64_t got = 0;
    for (int tries = 0; got < FORGED_P && tries < 50; tries++) {
        zps_wire_msg m;
        zps_err err = zps_wire_recv(me->sock, false, &m);
        if (err == ZPS_OK && m.hdr->type == ZPS__MSG_TYPE__PARAMS && m.hdr->step == step &&
            m.hdr->offset + m.hdr->count <= FORGED_P && m.payload_bytes == m.hdr->count * 4) {
            zps_wire_copy_payload(&m, out + m.hdr->offset);
            got += m.hdr->count;
        }
        ck_assert_msg(err != ZPS_OK || m.hdr->type != ZPS__MSG_TYPE__ERROR, "refused: %s",
                      m.hdr->error ? m.hdr->error : "");
        zps_wire_msg_fini(&m);
    }
    ck_assert_uint_eq(got, FORGED_P);
}

// Sends a PUSH of the whole range naming seg at offset (and as fd, size
// given), expects an ERROR with code and text.
static void s_forge(member *me, const zps_shm_seg *seg, uint64_t offset, uint64_t size,
                    int fd, zps_err code, const char *text)
{
    Zps__Header h;
    s_member_header(me, &h, ZPS__MSG_TYPE__PUSH);
    h.dtype = ZPS__DTYPE__F32;
    h.offset = 0;
    h.count = FORGED_P;
    h.samples = 8;
    h.step = 0;
    h.shm_size = size;
    h.shm_offset = offset;
    h.shm_pid = (uint32_t)getpid();
    h.shm_fd = (uint32_t)fd;
    char boot[ZPS_SHM_BOOT_ID_LEN];
    ck_assert_int_eq(zps_shm_boot_id(boot), ZPS_OK);
    h.shm_boot = boot;
    (void)seg;
    ck_assert_int_eq(zps_wire_send(me->sock, NULL, &h, NULL, 0, NULL), ZPS_OK);
    zps_wire_msg m;
    ck_assert_int_eq(zps_wire_recv(me->sock, false, &m), ZPS_OK);
    ck_assert_int_eq(m.hdr->type, ZPS__MSG_TYPE__ERROR);
    ck_assert_int_eq(m.hdr->error_code, code);
    ck_assert_msg(m.hdr->error && strstr(m.hdr->error, text), "refused as: %s", m.hdr->error);
    ck_assert_uint_eq(m.hdr->shm_size, size); // the refusal says it was a push through memory
    zps_wire_msg_fini(&m);
}

START_TEST(test_shm_forged_header_is_refused_and_changes_nothing)
{
    zps_procs ps;
    zps_procs_init(&ps, "shm-forged");
    const char *sargs[] = {"--workers", "1", "--model", "flat:4096", "--global-batch", "8",
                           "--steps", "2", "--weight-decay", "0", NULL};
    pid_t server;
    char ep[256];
    snprintf(ep, sizeof ep, "%s", zps_procs_start_server(&ps, "server", &server, sargs, 10000));
    member me = {0};
    s_join(&me, ep);
    Zps__Header h;
    s_member_header(&me, &h, ZPS__MSG_TYPE__PULL);
    h.step = 0;
    ck_assert_int_eq(zps_wire_send(me.sock, NULL, &h, NULL, 0, NULL), ZPS_OK);
    float *p0 = calloc(FORGED_P, sizeof(float)), *p1 = calloc(FORGED_P, sizeof(float));
    s_params(&me, 0, p0);
    // A real segment full of NaNs: whatever of it were counted would show.
    zps_shm_seg seg;
    char why[200];
    size_t bytes = 2 * FORGED_P * sizeof(float);
    ck_assert_int_eq(zps_shm_seg_create(&seg, bytes, why, sizeof why), ZPS_OK);
    for (size_t i = 0; i < 2 * FORGED_P; i++) {
        ((float *)seg.base)[i] = NAN;
    }
    s_forge(&me, &seg, bytes - 4, bytes, seg.fd, ZPS_ERANGE, "outside the segment");
    s_forge(&me, &seg, FORGED_P * 4 + 4, bytes, seg.fd, ZPS_ERANGE, "outside the segment");
    s_forge(&me, &seg, UINT64_MAX - 8, bytes, seg.fd, ZPS_ERANGE, "outside the segment");
    s_forge(&me, &seg, 0, bytes, 999, ZPS_EAGAIN, "shared memory refused");
    s_forge(&me, &seg, 0, bytes, 0, ZPS_EAGAIN, "shared memory refused"); // stdin: no segment
    s_forge(&me, &seg, 0, 2 * bytes, seg.fd, ZPS_ERANGE, "takes at most");
    // The step's one genuine push, of zeros, by frames: the parameters of
    // step 1 are those of step 0, bit for bit, only if no lie was counted.
    s_member_header(&me, &h, ZPS__MSG_TYPE__PUSH);
    h.dtype = ZPS__DTYPE__F32;
    h.count = FORGED_P;
    h.samples = 8;
    float *zeros = calloc(FORGED_P, sizeof(float));
    ck_assert_int_eq(zps_wire_send(me.sock, NULL, &h, zeros, FORGED_P * 4, NULL), ZPS_OK);
    s_params(&me, 1, p1);
    ck_assert_msg(memcmp(p0, p1, FORGED_P * sizeof(float)) == 0, "a forged push changed them");
    ck_assert(zps_proc_alive(server));
    ck_assert(zps_procs_log_has(&ps, "server.log", "outside the segment"));
    zps_shm_seg_fini(&seg);
    free(zeros);
    free(p0);
    free(p1);
    zps_wire_close(&me.sock);
    zmq_ctx_term(me.ctx);
    zps_procs_fini(&ps, false);
}
END_TEST

Suite *zps_suite_shm_jobs(void)
{
    Suite *s = suite_create("shm");
    TCase *tc = tcase_create("shm");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_shm_mlp_equals_tcp_bitwise);
    tcase_add_test(tc, test_shm_flat_equals_tcp_bitwise);
    tcase_add_test(tc, test_shm_flat_bf16_equals_tcp_bitwise);
    tcase_add_test(tc, test_shm_refused_falls_back_to_frames_bitwise);
    tcase_add_test(tc, test_shm_params_off_takes_frames_bitwise);
    tcase_add_test(tc, test_shm_killed_worker_leaves_no_segment);
    tcase_add_test(tc, test_shm_forged_header_is_refused_and_changes_nothing);
    suite_add_tcase(s, tc);
    return s;
}
