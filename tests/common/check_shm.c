/* check_shm.c - common/zps_shm: segments made, mapped by a peer, refused
 * when they are not what they claim, and gone with their processes. */
#include <check.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
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

Suite *zps_suite_shm(void)
{
    Suite *s = suite_create("shm");
    TCase *tc = tcase_create("shm");
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, test_shm_boot_id);
    tcase_add_test(tc, test_shm_peer_sees_the_creators_bytes);
    tcase_add_test(tc, test_shm_refuses_what_is_not_a_segment);
    tcase_add_test(tc, test_shm_a_segment_cannot_shrink);
    tcase_add_test(tc, test_shm_span);
    tcase_add_test(tc, test_shm_creator_killed_leaves_nothing);
    suite_add_tcase(s, tc);
    return s;
}
