/* check_shm.c - common/zps_shm: segments made, mapped by a peer, refused
 * when they are not what they claim, and gone with their processes. */
#include <check.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/zps_clock.h"
#include "common/zps_shm.h"
#include "tests/zps_check.h"

// Whether this process maps a zps segment (as /proc/self/maps shows it).
static bool s_maps_segment(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char line[512];
    bool found = false;
    while (fgets(line, sizeof line, f)) {
        found = found || strstr(line, "memfd:" ZPS_SHM_NAME) != NULL;
    }
    fclose(f);
    return found;
}

START_TEST(test_shm_boot_id)
{
    char a[ZPS_SHM_BOOT_ID_LEN], b[ZPS_SHM_BOOT_ID_LEN];
    ck_assert_int_eq(zps_shm_boot_id(a), ZPS_OK);
    ck_assert_int_eq(zps_shm_boot_id(b), ZPS_OK);
    ck_assert_uint_eq(strlen(a), 36);
    ck_assert_str_eq(a, b);
}
END_TEST

START_TEST(test_shm_boot_id_override_names_an_emulated_host)
{
    char real[ZPS_SHM_BOOT_ID_LEN], id[ZPS_SHM_BOOT_ID_LEN];
    ck_assert_int_eq(zps_shm_boot_id(real), ZPS_OK);
    ck_assert_int_eq(setenv("ZPS_BOOT_ID", "host-b.2", 1), 0);
    ck_assert_int_eq(zps_shm_boot_id(id), ZPS_OK);
    ck_assert_str_eq(id, "host-b.2");
    ck_assert_int_eq(setenv("ZPS_BOOT_ID", "a/../b", 1), 0);
    ck_assert_int_eq(zps_shm_boot_id(id), ZPS_EINVAL);
    ck_assert_str_eq(id, "");
    ck_assert_int_eq(setenv("ZPS_BOOT_ID", "0123456789012345678901234567890123456789", 1), 0);
    ck_assert_int_eq(zps_shm_boot_id(id), ZPS_EINVAL);
    ck_assert_int_eq(unsetenv("ZPS_BOOT_ID"), 0);
    ck_assert_int_eq(zps_shm_boot_id(id), ZPS_OK);
    ck_assert_str_eq(id, real);
}
END_TEST

START_TEST(test_shm_peer_sees_the_creators_bytes)
{
    zps_shm_seg seg;
    char why[200];
    ck_assert_int_eq(zps_shm_seg_create(&seg, 1 << 20, why, sizeof why), ZPS_OK);
    ck_assert_int_eq(((unsigned char *)seg.base)[12345], 0); // zeroed
    zps_shm_map map;
    ck_assert_int_eq(zps_shm_map_open(&map, getpid(), seg.fd, 1 << 20, why, sizeof why), ZPS_OK);
    ck_assert(zps_shm_map_is(&map, getpid(), seg.fd, 1 << 20));
    ck_assert(!zps_shm_map_is(&map, getpid(), seg.fd, 1 << 19));
    ck_assert(zps_shm_map_alive(&map));
    memset(seg.base, 0xab, seg.size);
    ck_assert_int_eq(((const unsigned char *)map.base)[(1 << 20) - 1], 0xab);
    // A smaller mapping of a larger segment is fine; a larger one is not.
    zps_shm_map big;
    ck_assert_int_eq(zps_shm_map_open(&big, getpid(), seg.fd, 2 << 20, why, sizeof why),
                     ZPS_EPROTO);
    ck_assert_ptr_null(big.base);
    zps_shm_map_fini(&map);
    zps_shm_map_fini(&map); // twice: nothing
    ck_assert(!zps_shm_map_alive(&map));
    ck_assert(s_maps_segment(getpid()));
    zps_shm_seg_fini(&seg);
    zps_shm_seg_fini(&seg);
    ck_assert(!s_maps_segment(getpid())); // and no name anywhere to leave behind
}
END_TEST

START_TEST(test_shm_refuses_what_is_not_a_segment)
{
    char why[200];
    zps_shm_map map;
    // No such fd, a pipe, a regular file, an unsealed memfd of another name.
    ck_assert_int_eq(zps_shm_map_open(&map, getpid(), 999, 4096, why, sizeof why), ZPS_ENOENT);
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    ck_assert_int_eq(zps_shm_map_open(&map, getpid(), p[0], 4096, why, sizeof why), ZPS_EPROTO);
    ck_assert(strstr(why, "not a zps segment"));
    int other = memfd_create("other", MFD_CLOEXEC);
    ck_assert_int_eq(ftruncate(other, 4096), 0);
    ck_assert_int_eq(zps_shm_map_open(&map, getpid(), other, 4096, why, sizeof why),
                     ZPS_EPROTO);
    int unsealed = memfd_create(ZPS_SHM_NAME, MFD_CLOEXEC);
    ck_assert_int_eq(ftruncate(unsealed, 4096), 0);
    ck_assert_int_eq(zps_shm_map_open(&map, getpid(), unsealed, 4096, why, sizeof why),
                     ZPS_EPROTO);
    ck_assert(strstr(why, "sealed"));
    // Out of range on the wire: never looked up.
    ck_assert_int_eq(zps_shm_map_open(&map, -1, 3, 4096, why, sizeof why), ZPS_ERANGE);
    ck_assert_int_eq(zps_shm_map_open(&map, getpid(), -1, 4096, why, sizeof why), ZPS_ERANGE);
    ck_assert_int_eq(zps_shm_map_open(&map, getpid(), 3, 0, why, sizeof why), ZPS_ERANGE);
    ck_assert_int_eq(zps_shm_map_open(&map, 1 << 30, 3, 4096, why, sizeof why), ZPS_ENOENT);
    ck_assert_ptr_null(map.base);
    close(p[0]);
    close(p[1]);
    close(other);
    close(unsealed);
}
END_TEST

START_TEST(test_shm_a_segment_cannot_shrink)
{
    zps_shm_seg seg;
    char why[200];
    ck_assert_int_eq(zps_shm_seg_create(&seg, 8192, why, sizeof why), ZPS_OK);
    ck_assert_int_ne(ftruncate(seg.fd, 0), 0); // a peer's mapping never faults past its end
    ck_assert_int_eq(zps_shm_seg_create(&seg, 0, why, sizeof why), ZPS_EINVAL);
    zps_shm_seg_fini(&seg);
}
END_TEST

START_TEST(test_shm_span)
{
    ck_assert(zps_shm_span_ok(100, 0, 100));
    ck_assert(zps_shm_span_ok(100, 100, 0));
    ck_assert(!zps_shm_span_ok(100, 1, 100));
    ck_assert(!zps_shm_span_ok(100, 101, 0));
    ck_assert(!zps_shm_span_ok(100, UINT64_MAX, 2));
    ck_assert(!zps_shm_span_ok(100, 2, UINT64_MAX));
    // A tensor: whole elements inside, and a count whose byte length
    // overflows (2^62 + 1 floats: 4 bytes once wrapped) refused.
    ck_assert(zps_shm_tensor_ok(100, 20, 20, 4));
    ck_assert(!zps_shm_tensor_ok(100, 20, 21, 4));
    ck_assert(!zps_shm_tensor_ok(100, 0, (UINT64_MAX >> 2) + 2, 4));
}
END_TEST

// A creator SIGKILLed: its peer's pidfd says so, and once the peer unmaps
// no process maps the segment: the memory is gone.
START_TEST(test_shm_creator_killed_leaves_nothing)
{
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        zps_shm_seg seg;
        char why[200];
        int fd = zps_shm_seg_create(&seg, 1 << 16, why, sizeof why) == ZPS_OK ? seg.fd : -1;
        if (fd >= 0) {
            memset(seg.base, 7, seg.size);
        }
        (void)!write(p[1], &fd, sizeof fd);
        pause();
        _exit(0);
    }
    int fd = -1;
    ck_assert_int_eq(read(p[0], &fd, sizeof fd), (ssize_t)sizeof fd);
    ck_assert_int_ge(fd, 0);
    zps_shm_map map;
    char why[200];
    ck_assert_int_eq(zps_shm_map_open(&map, child, fd, 1 << 16, why, sizeof why), ZPS_OK);
    ck_assert_int_eq(((const unsigned char *)map.base)[100], 7);
    ck_assert(zps_shm_map_alive(&map));
    kill(child, SIGKILL);
    double until = zps_clock_ms() + 5000;
    while (zps_shm_map_alive(&map) && zps_clock_ms() < until) {
        usleep(1000);
    }
    ck_assert(!zps_shm_map_alive(&map)); // even before it is reaped
    ck_assert_int_eq(waitpid(child, NULL, 0), child);
    ck_assert(s_maps_segment(getpid()));
    zps_shm_map_fini(&map);
    ck_assert(!s_maps_segment(getpid()));
    // And it cannot be opened again: the process and its fds are gone.
    ck_assert_int_ne(zps_shm_map_open(&map, child, fd, 1 << 16, why, sizeof why), ZPS_OK);
    close(p[0]);
    close(p[1]);
}
END_TEST

// ---------------------------------------------------------------------------
// A shard's parameters under the per-bucket seqlock.

#define RACE_FLOATS (1u << 16) // one bucket of a flat model: 256 KiB
#define RACE_MS 1500.0

typedef struct race {
    zps_shm_seg seg;      // the writer's (the shard's)
    volatile int done;    // the writer finished
    uint64_t writes;      // steps written
} race;

// The shard: step after step, every element of the bucket set to the step.
static void *s_writer(void *arg)
{
    race *r = arg;
    float *buf = malloc(RACE_FLOATS * sizeof(float));
    double end = zps_clock_ms() + RACE_MS;
    for (uint64_t step = 1; zps_clock_ms() < end; step++) {
        for (uint32_t i = 0; i < RACE_FLOATS; i++) {
            buf[i] = (float)step;
        }
        zps_shm_params_write(&r->seg, 3, step, 1000, RACE_FLOATS, ZPS_SHM_PARAMS_DATA, buf,
                             RACE_FLOATS * sizeof(float));
        r->writes = step;
        // A pause about as long as a copy of the bucket: reads land both
        // inside a write and between two, so some must come back whole.
        struct timespec pause = {0, 30000};
        nanosleep(&pause, NULL);
    }
    free(buf);
    __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

// The library's read: zps_shm_params_peek when the PARAMS header comes,
// the copy once the step's parameters are all in (a pause here), then
// zps_shm_params_still.
static zps_err s_read_in_place(const zps_shm_map *map, uint64_t step, float *dst, char *why,
                               size_t why_len)
{
    const void *src;
    uint64_t seq;
    size_t bytes = RACE_FLOATS * sizeof(float);
    zps_err err = zps_shm_params_peek(map, 3, step, 1000, RACE_FLOATS, ZPS_SHM_PARAMS_DATA, bytes,
                                      &src, &seq, why, why_len);
    if (err != ZPS_OK) {
        return err;
    }
    struct timespec pause = {0, 10000};
    nanosleep(&pause, NULL);
    memcpy(dst, src, bytes);
    return zps_shm_params_still(map, 3, seq) ? ZPS_OK : ZPS_ESTALE;
}

// A worker reads while the shard writes the next step: whatever it gets
// back as ZPS_OK is one step's values whole, never two steps mixed.
START_TEST(test_shm_params_reader_never_sees_mixed_steps)
{
    race r = {0};
    char why[200];
    size_t size = ZPS_SHM_PARAMS_DATA + RACE_FLOATS * sizeof(float);
    ck_assert_int_eq(zps_shm_seg_create_as(&r.seg, ZPS_SHM_PARAMS_NAME, size, true, why,
                                           sizeof why), ZPS_OK);
    zps_shm_map map;
    ck_assert_int_eq(zps_shm_map_open_as(&map, ZPS_SHM_PARAMS_NAME, getpid(), r.seg.fd, size,
                                         why, sizeof why), ZPS_OK);
    float *dst = malloc(RACE_FLOATS * sizeof(float));
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, s_writer, &r), 0);
    uint64_t ok = 0, stale = 0, mixed = 0;
    const zps_shm_slot *slot =
        (const zps_shm_slot *)((const char *)map.base + 3 * ZPS_SHM_SLOT_BYTES);
    while (!__atomic_load_n(&r.done, __ATOMIC_ACQUIRE)) {
        uint64_t step = __atomic_load_n(&slot->step, __ATOMIC_RELAXED); // what a PARAMS names
        // Every other read as the library reads: named when the header
        // comes, copied from the segment later, then checked again.
        zps_err err = (ok + stale) % 2 ? s_read_in_place(&map, step, dst, why, sizeof why)
                                       : zps_shm_params_read(&map, 3, step, 1000, RACE_FLOATS,
                                                             ZPS_SHM_PARAMS_DATA,
                                                             RACE_FLOATS * sizeof(float), dst,
                                                             why, sizeof why);
        if (err == ZPS_ESTALE) {
            stale++;
            continue;
        }
        ck_assert_int_eq(err, ZPS_OK);
        ok++;
        for (uint32_t i = 0; i < RACE_FLOATS; i++) {
            if (dst[i] != (float)step) {
                mixed++;
                break;
            }
        }
    }
    ck_assert_int_eq(pthread_join(t, NULL), 0);
    fprintf(stderr, "seqlock: %llu steps written, %llu reads whole, %llu refused, %llu mixed\n",
            (unsigned long long)r.writes, (unsigned long long)ok, (unsigned long long)stale,
            (unsigned long long)mixed);
    ck_assert_uint_eq(mixed, 0);
    ck_assert_uint_gt(ok, 0);
    free(dst);
    zps_shm_map_fini(&map);
    zps_shm_seg_fini(&r.seg);
}
END_TEST

// What a reader checks: the step, the bucket, the slot and the span; and
// the segment is read-only to everyone but its creator.
START_TEST(test_shm_params_checks)
{
    zps_shm_seg seg;
    char why[200];
    size_t size = ZPS_SHM_PARAMS_DATA + 4096;
    ck_assert_int_eq(zps_shm_seg_create_as(&seg, ZPS_SHM_PARAMS_NAME, size, true, why,
                                           sizeof why), ZPS_OK);
    float v[8] = {1, 2, 3, 4, 5, 6, 7, 8}, out[8];
    uint64_t at = ZPS_SHM_PARAMS_DATA + 64;
    zps_shm_params_write(&seg, 0, 7, 16, 8, at, v, sizeof v);
    zps_shm_map map;
    // A push segment's name is not a parameter segment's, nor the reverse.
    ck_assert_int_eq(zps_shm_map_open(&map, getpid(), seg.fd, size, why, sizeof why), ZPS_EPROTO);
    ck_assert_int_eq(zps_shm_map_open_as(&map, ZPS_SHM_PARAMS_NAME, getpid(), seg.fd, size, why,
                                         sizeof why), ZPS_OK);
    ck_assert_int_eq(zps_shm_params_read(&map, 0, 7, 16, 8, at, sizeof out, out, why, sizeof why),
                     ZPS_OK);
    ck_assert_mem_eq(out, v, sizeof v);
    ck_assert_int_eq(zps_shm_params_read(&map, 0, 8, 16, 8, at, sizeof out, out, why, sizeof why),
                     ZPS_ESTALE); // another step
    ck_assert_int_eq(zps_shm_params_read(&map, 0, 7, 24, 8, at, sizeof out, out, why, sizeof why),
                     ZPS_ESTALE); // another bucket
    ck_assert_int_eq(zps_shm_params_read(&map, 1, 7, 16, 8, at, sizeof out, out, why, sizeof why),
                     ZPS_ESTALE); // a slot never written
    ck_assert_int_eq(zps_shm_params_read(&map, ZPS_SHM_PARAMS_SLOTS, 7, 16, 8, at, sizeof out,
                                         out, why, sizeof why), ZPS_ERANGE);
    ck_assert_int_eq(zps_shm_params_read(&map, 0, 7, 16, 8, 0, sizeof out, out, why, sizeof why),
                     ZPS_ERANGE); // over the slots
    ck_assert_int_eq(zps_shm_params_read(&map, 0, 7, 16, 8, size - 4, sizeof out, out, why,
                                         sizeof why), ZPS_ERANGE);
    ck_assert_int_eq(zps_shm_params_read(&map, 0, 7, 16, 8, UINT64_MAX - 4, sizeof out, out, why,
                                         sizeof why), ZPS_ERANGE);
    // Read in place: whole only while the slot is not written again.
    const void *src;
    uint64_t seq;
    ck_assert_int_eq(zps_shm_params_peek(&map, 0, 7, 16, 8, at, sizeof out, &src, &seq, why,
                                         sizeof why), ZPS_OK);
    ck_assert_mem_eq(src, v, sizeof v);
    ck_assert(zps_shm_params_still(&map, 0, seq));
    zps_shm_params_write(&seg, 0, 8, 16, 8, at, v, sizeof v);
    ck_assert(!zps_shm_params_still(&map, 0, seq));
    ck_assert_int_eq(zps_shm_params_peek(&map, 0, 7, 16, 8, at, sizeof out, &src, &seq, why,
                                         sizeof why), ZPS_ESTALE); // step 8's now
    ((zps_shm_slot *)seg.base)->seq++; // odd: the shard is writing
    ck_assert_int_eq(zps_shm_params_peek(&map, 0, 8, 16, 8, at, sizeof out, &src, &seq, why,
                                         sizeof why), ZPS_ESTALE);
    ck_assert_ptr_nonnull(strstr(why, "being written"));
    // F_SEAL_FUTURE_WRITE: no peer maps it writable or writes to it.
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", seg.fd);
    int fd = open(path, O_RDWR);
    ck_assert_int_ge(fd, 0);
    ck_assert_ptr_eq(mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), MAP_FAILED);
    ck_assert_int_lt(write(fd, v, sizeof v), 0);
    close(fd);
    zps_shm_map_fini(&map);
    zps_shm_seg_fini(&seg);
}
END_TEST

Suite *zps_suite_shm(void)
{
    Suite *s = suite_create("shm");
    TCase *tc = tcase_create("shm");
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, test_shm_boot_id);
    tcase_add_test(tc, test_shm_boot_id_override_names_an_emulated_host);
    tcase_add_test(tc, test_shm_peer_sees_the_creators_bytes);
    tcase_add_test(tc, test_shm_refuses_what_is_not_a_segment);
    tcase_add_test(tc, test_shm_a_segment_cannot_shrink);
    tcase_add_test(tc, test_shm_span);
    tcase_add_test(tc, test_shm_creator_killed_leaves_nothing);
    tcase_add_test(tc, test_shm_params_reader_never_sees_mixed_steps);
    tcase_add_test(tc, test_shm_params_checks);
    suite_add_tcase(s, tc);
    return s;
}
