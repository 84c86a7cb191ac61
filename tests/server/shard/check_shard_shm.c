/* check_shard_shm.c - server/shard/zps_shard_shm: a PUSH naming a segment is
 * read from it, and every lie in its header is refused with nothing
 * changed. The segments are this process's own (the shard and the worker
 * are one process here, as /proc allows). */
#include <check.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "server/shard/zps_shard_shm.h"
#include "tests/zps_check.h"

#define N_FLOATS 1024
#define SEG_BYTES (2 * N_FLOATS * sizeof(float))

static zps_shm_seg s_seg;
static zps_shard_shm s_t;
static char s_boot[ZPS_SHM_BOOT_ID_LEN];

static void s_setup(void)
{
    char why[200];
    ck_assert_int_eq(zps_shm_seg_create(&s_seg, SEG_BYTES, why, sizeof why), ZPS_OK);
    float *f = s_seg.base;
    for (int i = 0; i < 2 * N_FLOATS; i++) {
        f[i] = (float)i;
    }
    memset(&s_t, 0, sizeof s_t);
    zps_shard_shm_init(&s_t, true, false);
    ck_assert_int_eq(zps_shm_boot_id(s_boot), ZPS_OK);
}

static void s_teardown(void)
{
    zps_shard_shm_fini(&s_t);
    zps_shm_seg_fini(&s_seg);
}

// A PUSH of count floats at byte offset of the segment (the header is the
// caller's; m is not zps_wire_msg_fini'd, only its frames closed).
static void s_push(Zps__Header *h, zps_wire_msg *m, uint64_t offset, uint64_t count)
{
    zps_wire_header_init(h, ZPS__MSG_TYPE__PUSH);
    h->dtype = ZPS__DTYPE__F32;
    h->offset = 0;
    h->count = count;
    h->shm_size = SEG_BYTES;
    h->shm_offset = offset;
    h->shm_pid = (uint32_t)getpid();
    h->shm_fd = (uint32_t)s_seg.fd;
    h->shm_boot = s_boot;
    memset(m, 0, sizeof *m);
    m->hdr = h;
}

static void s_close(zps_wire_msg *m)
{
    for (int f = 0; f < m->n_frames; f++) {
        zmq_msg_close(&m->frames[f]);
    }
    m->n_frames = 0;
}

static zps_err s_view(zps_wire_msg *m, char *why)
{
    return zps_shard_shm_view(&s_t, 3, SEG_BYTES, ZPS_DTYPE_F32, m, why, 256);
}

START_TEST(test_shard_shm_push_reads_the_segment)
{
    Zps__Header h;
    zps_wire_msg m;
    char why[256] = "";
    s_push(&h, &m, N_FLOATS * sizeof(float) + 8, 10); // odd half, element 2 on
    ck_assert_int_eq(s_view(&m, why), ZPS_OK);
    ck_assert_int_eq(m.n_frames, 1);
    ck_assert_uint_eq(m.payload_bytes, 10 * sizeof(float));
    const float *v = zmq_msg_data(&m.frames[0]);
    ck_assert(v[0] == (float)(N_FLOATS + 2) && v[9] == (float)(N_FLOATS + 11));
    ck_assert_int_eq(zps_shard_shm_mapped(&s_t), 1);
    s_close(&m);
    // The same segment again: the mapping of before, no second one.
    s_push(&h, &m, 0, 2 * N_FLOATS);
    ck_assert_int_eq(s_view(&m, why), ZPS_OK);
    ck_assert_int_eq(zps_shard_shm_mapped(&s_t), 1);
    ck_assert_uint_eq(s_t.pushes, 2);
    s_close(&m);
    // Frames are left alone.
    s_push(&h, &m, 0, 1);
    h.shm_size = 0;
    ck_assert_int_eq(s_view(&m, why), ZPS_OK);
    ck_assert_int_eq(m.n_frames, 0);
}
END_TEST

// The lies of a header: each refused with a reason, nothing read, the
// mapping as it was.
START_TEST(test_shard_shm_refuses_spans_outside_the_segment)
{
    Zps__Header h;
    zps_wire_msg m;
    char why[256];
    s_push(&h, &m, 0, 1);
    ck_assert_int_eq(s_view(&m, why), ZPS_OK);
    s_close(&m);
    const void *base = s_t.maps[3].base;
    struct {
        uint64_t offset, count;
    } lies[] = {{SEG_BYTES, 1}, {SEG_BYTES - 4, 2}, {4, 2 * N_FLOATS}, {UINT64_MAX - 3, 1},
                {0, UINT64_MAX / 2}, {0, UINT64_MAX}, {SEG_BYTES + 4096, 0}};
    for (size_t i = 0; i < sizeof lies / sizeof lies[0]; i++) {
        s_push(&h, &m, lies[i].offset, lies[i].count);
        why[0] = '\0';
        ck_assert_int_eq(s_view(&m, why), ZPS_ERANGE);
        ck_assert(strstr(why, "outside the segment"));
        ck_assert_int_eq(m.n_frames, 0);
        ck_assert_ptr_eq(s_t.maps[3].base, base);
    }
    ck_assert_uint_eq(s_t.pushes, 1);
}
END_TEST

START_TEST(test_shard_shm_refuses_segments_it_cannot_take)
{
    Zps__Header h;
    zps_wire_msg m;
    char why[256];
    s_push(&h, &m, 0, 1);
    ck_assert_int_eq(s_view(&m, why), ZPS_OK);
    s_close(&m);
    const void *base = s_t.maps[3].base;
    // A buffer that is not mapped and cannot be: "not here", frames instead.
    s_push(&h, &m, 0, 1);
    h.shm_fd = 999;
    ck_assert_int_eq(s_view(&m, why), ZPS_EAGAIN);
    ck_assert(strstr(why, "shared memory refused"));
    ck_assert_ptr_eq(s_t.maps[3].base, base);
    // Another host.
    s_push(&h, &m, 0, 1);
    h.shm_boot = "00000000-0000-0000-0000-000000000000";
    ck_assert_int_eq(s_view(&m, why), ZPS_EAGAIN);
    ck_assert(strstr(why, "another host"));
    s_push(&h, &m, 0, 1);
    h.shm_boot = NULL;
    ck_assert_int_eq(s_view(&m, why), ZPS_EAGAIN);
    // A segment larger than the shard takes, frames beside it, another dtype.
    s_push(&h, &m, 0, 1);
    ck_assert_int_eq(zps_shard_shm_view(&s_t, 3, SEG_BYTES / 2, ZPS_DTYPE_F32, &m, why, 256),
                     ZPS_ERANGE);
    s_push(&h, &m, 0, 1);
    m.n_frames = 1; // as if a frame came: never looked at, never closed
    ck_assert_int_eq(s_view(&m, why), ZPS_EPROTO);
    m.n_frames = 0;
    s_push(&h, &m, 0, 1);
    h.dtype = ZPS__DTYPE__BF16;
    ck_assert_int_eq(s_view(&m, why), ZPS_EPROTO);
    ck_assert_ptr_eq(s_t.maps[3].base, base);
    ck_assert_int_eq(m.n_frames, 0);
    ck_assert_uint_eq(s_t.pushes, 1);
}
END_TEST

START_TEST(test_shard_shm_deny)
{
    zps_shard_shm_init(&s_t, false, true);
    Zps__Header h;
    zps_wire_msg m;
    char why[256];
    s_push(&h, &m, 0, 1);
    ck_assert_int_eq(s_view(&m, why), ZPS_EAGAIN);
    ck_assert(strstr(why, "CURVE"));
    ck_assert_int_eq(zps_shard_shm_mapped(&s_t), 0);
}
END_TEST

// A held push takes a copy: the worker may write the segment again.
START_TEST(test_shard_shm_own_copies)
{
    Zps__Header h;
    zps_wire_msg m;
    char why[256];
    s_push(&h, &m, 16, 4);
    ck_assert_int_eq(s_view(&m, why), ZPS_OK);
    ck_assert_int_eq(zps_shard_shm_own(&m), ZPS_OK);
    ck_assert_uint_eq(h.shm_size, 0);
    ((float *)s_seg.base)[4] = -1.0f;
    const float *v = zmq_msg_data(&m.frames[0]);
    ck_assert(v[0] == 4.0f && v[3] == 7.0f);
    ck_assert_int_eq(zps_shard_shm_own(&m), ZPS_OK); // frames now: nothing
    s_close(&m);
}
END_TEST

// Whether a push would replace its rank's mapping, which the io asks
// before the shard may read a kept view of the old one again: only a
// segment other than the one mapped for that rank does.
START_TEST(test_shard_shm_replaces_only_another_segment_of_a_mapped_rank)
{
    Zps__Header h;
    zps_wire_msg m;
    char why[256];
    s_push(&h, &m, 0, 4);
    ck_assert(!zps_shard_shm_replaces(&s_t, 3, &h)); // nothing mapped yet
    ck_assert_int_eq(s_view(&m, why), ZPS_OK);
    s_close(&m);
    ck_assert(!zps_shard_shm_replaces(&s_t, 3, &h)); // the same segment
    ck_assert(!zps_shard_shm_replaces(&s_t, 4, &h)); // another rank, unmapped
    zps_shm_seg other;
    ck_assert_int_eq(zps_shm_seg_create(&other, SEG_BYTES, why, sizeof why), ZPS_OK);
    h.shm_fd = (uint32_t)other.fd;
    ck_assert(zps_shard_shm_replaces(&s_t, 3, &h));
    h.shm_fd = (uint32_t)s_seg.fd;
    h.shm_size = SEG_BYTES - 4;
    ck_assert(zps_shard_shm_replaces(&s_t, 3, &h)); // named with another size
    h.shm_size = 0;
    ck_assert(!zps_shard_shm_replaces(&s_t, 3, &h)); // frames
    zps_shm_seg_fini(&other);
}
END_TEST

// A whole step's notice names the range only once every bucket of it is
// in the segment for that step; then it names them all at once.
START_TEST(test_shard_shm_names_a_whole_step_once_every_bucket_is_in)
{
    // Two buckets of 8 floats: [100, 108) and [108, 116).
    ck_assert(zps_shard_shm_params_offer(&s_t, true, false, 100, 116, sizeof(float)));
    float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__PARAMS);
    ck_assert(!zps_shard_shm_params_name_all(&s_t, 2, 4, 100, 116, &h)); // nothing written
    zps_shard_shm_params_put(&s_t, 0, 4, 108, 8, v); // bucket 0's values for step 4
    ck_assert(!zps_shard_shm_params_name_all(&s_t, 2, 4, 100, 116, &h)); // bucket 1 missing
    zps_shard_shm_params_put(&s_t, 1, 3, 100, 8, v);
    ck_assert(!zps_shard_shm_params_name_all(&s_t, 2, 4, 100, 116, &h)); // of an older step
    ck_assert_uint_eq(h.shm_size, 0);
    zps_shard_shm_params_put(&s_t, 1, 4, 100, 8, v);
    ck_assert(zps_shard_shm_params_name_all(&s_t, 2, 4, 100, 116, &h));
    ck_assert(h.shm_whole);
    ck_assert_uint_eq(h.offset, 100);
    ck_assert_uint_eq(h.count, 16);
    ck_assert_uint_eq(h.shm_offset, ZPS_SHM_PARAMS_DATA);
    ck_assert_uint_eq(h.shm_size, s_t.params.size);
    ck_assert_uint_eq(s_t.params_whole_sent, 1);
    ck_assert(!zps_shard_shm_params_name_all(&s_t, 2, 5, 100, 116, &h)); // not yet step 5's
}
END_TEST

// A worker SIGKILLed: the sweep unmaps its segment.
START_TEST(test_shard_shm_sweep_unmaps_the_dead)
{
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    pid_t child = fork();
    if (child == 0) {
        zps_shm_seg seg;
        char why[200];
        int fd = zps_shm_seg_create(&seg, SEG_BYTES, why, sizeof why) == ZPS_OK ? seg.fd : -1;
        (void)!write(p[1], &fd, sizeof fd);
        pause();
        _exit(0);
    }
    int fd;
    ck_assert_int_eq(read(p[0], &fd, sizeof fd), (ssize_t)sizeof fd);
    Zps__Header h;
    zps_wire_msg m;
    char why[256];
    s_push(&h, &m, 0, 1);
    h.shm_pid = (uint32_t)child;
    h.shm_fd = (uint32_t)fd;
    ck_assert_int_eq(s_view(&m, why), ZPS_OK);
    s_close(&m);
    s_push(&h, &m, 0, 1); // rank 5: this process's segment, alive throughout
    ck_assert_int_eq(zps_shard_shm_view(&s_t, 5, SEG_BYTES, ZPS_DTYPE_F32, &m, why, sizeof why),
                     ZPS_OK);
    s_close(&m);
    ck_assert(!zps_shard_shm_gone(&s_t));
    zps_shard_shm_sweep(&s_t);
    ck_assert_int_eq(zps_shard_shm_mapped(&s_t), 2);
    kill(child, SIGKILL);
    ck_assert_int_eq(waitpid(child, NULL, 0), child);
    ck_assert(zps_shard_shm_gone(&s_t)); // what the io settles the shard on first
    zps_shard_shm_sweep(&s_t);
    ck_assert_int_eq(zps_shard_shm_mapped(&s_t), 1);
    ck_assert(s_t.maps[3].base == NULL && s_t.maps[5].base != NULL); // the dead one's only
    ck_assert(!zps_shard_shm_gone(&s_t));
    close(p[0]);
    close(p[1]);
}
END_TEST

// The resident KiB of this process's mapping that starts at base
// (/proc/self/smaps), or -1: the pages the shard holds of a segment.
static long s_rss_kib(const void *base)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512], start[32];
    snprintf(start, sizeof start, "%lx-", (unsigned long)(uintptr_t)base);
    long kib = -1;
    bool in = false;
    while (f && fgets(line, sizeof line, f)) {
        if (strchr(line, '-') && strchr(line, ' ') && strchr(line, '-') < strchr(line, ' ')) {
            in = strncmp(line, start, strlen(start)) == 0; // a mapping's first line
        } else if (in && sscanf(line, "Rss: %ld kB", &kib) == 1) {
            break;
        }
    }
    if (f) {
        fclose(f);
    }
    return kib;
}

// A read push's pages leave the shard only where that is worth its TLB
// shootdown: from a segment over ZPS_SHARD_SHM_KEEP_BYTES, not from a
// small one (both read whole, then let go as the shard lets a push go).
START_TEST(test_shard_shm_drops_a_read_push_s_pages_from_a_large_segment_only)
{
    char why[256];
    zps_shm_seg big;
    size_t big_bytes = 4 * ZPS_SHARD_SHM_KEEP_BYTES;
    ck_assert_int_eq(zps_shm_seg_create(&big, big_bytes, why, sizeof why), ZPS_OK);
    memset(big.base, 1, big_bytes);
    ck_assert_uint_le(SEG_BYTES, ZPS_SHARD_SHM_KEEP_BYTES);
    const uint32_t rank_of[2] = {3, 4};
    const zps_shm_seg *seg_of[2] = {&s_seg, &big};
    for (int i = 0; i < 2; i++) {
        Zps__Header h;
        zps_wire_msg m;
        s_push(&h, &m, 0, seg_of[i]->size / sizeof(float));
        h.shm_size = seg_of[i]->size;
        h.shm_fd = (uint32_t)seg_of[i]->fd;
        ck_assert_int_eq(zps_shard_shm_view(&s_t, rank_of[i], seg_of[i]->size, ZPS_DTYPE_F32,
                                            &m, why, sizeof why),
                         ZPS_OK);
        const volatile uint8_t *v = zmq_msg_data(&m.frames[0]);
        unsigned sum = 0;
        for (size_t b = 0; b < seg_of[i]->size; b += 4096) {
            sum += v[b]; // every page read, as the shard's sum reads them
        }
        (void)sum;
        const void *base = s_t.maps[rank_of[i]].base;
        ck_assert_int_ge(s_rss_kib(base), (long)(seg_of[i]->size / 1024));
        s_close(&m); // the view's last reference: the push was read
        long left = s_rss_kib(base);
        if (i == 0) {
            ck_assert_int_ge(left, (long)(SEG_BYTES / 1024)); // small: kept
        } else {
            ck_assert_int_eq(left, 0); // large: dropped
        }
    }
    zps_shard_shm_fini(&s_t); // unmaps big's mapping before big goes
    zps_shm_seg_fini(&big);
}
END_TEST

Suite *zps_suite_shard_shm(void)
{
    Suite *s = suite_create("shard_shm");
    TCase *tc = tcase_create("shard_shm");
    tcase_add_checked_fixture(tc, s_setup, s_teardown);
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, test_shard_shm_push_reads_the_segment);
    tcase_add_test(tc, test_shard_shm_refuses_spans_outside_the_segment);
    tcase_add_test(tc, test_shard_shm_refuses_segments_it_cannot_take);
    tcase_add_test(tc, test_shard_shm_deny);
    tcase_add_test(tc, test_shard_shm_own_copies);
    tcase_add_test(tc, test_shard_shm_replaces_only_another_segment_of_a_mapped_rank);
    tcase_add_test(tc, test_shard_shm_names_a_whole_step_once_every_bucket_is_in);
    tcase_add_test(tc, test_shard_shm_sweep_unmaps_the_dead);
    tcase_add_test(tc, test_shard_shm_drops_a_read_push_s_pages_from_a_large_segment_only);
    suite_add_tcase(s, tc);
    return s;
}
