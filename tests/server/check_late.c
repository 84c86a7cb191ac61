/* check_late.c - the stall warning (server/zps_late.h): it names the first
 * ranks a step waits for and counts the rest in one line, so a step that
 * waits for thousands of members logs a few lines a tick, not thousands. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/zps_log.h"
#include "server/shard/zps_shard.h"
#include "server/shard/zps_shard_io.h"
#include "server/zps_late.h"
#include "tests/server/shard/zps_shard_fx.h"
#include "tests/zps_check.h"

#define N_RANKS 40 // one sample each: the fixture's batch

typedef struct lines {
    int rank_lines; // "waiting ... for rank R"
    int rest_lines; // "waiting ... for K more ranks"
    unsigned rest;  // that K
} lines;

static void s_count(void *arg, int level, const char *msg)
{
    lines *l = arg;
    (void)level;
    unsigned k = 0;
    if (strstr(msg, " for rank ")) {
        l->rank_lines++;
    } else if (strstr(msg, "more ranks") && sscanf(strstr(msg, " for ") + 5, "%u", &k) == 1) {
        l->rest_lines++;
        l->rest = k;
    }
}

// A shard of the fixture's model whose plan gives each of n ranks one sample.
static zps_shard *s_shard_of_n(const zps_model_spec *model, uint32_t n)
{
    zps_shard_cfg cfg = {.index = 0, .lo = 0, .hi = model->n_params, .model = model, .seed = 4,
                         .global_batch = ZPS_SHARD_FX_BATCH, .dtype = ZPS_DTYPE_F32,
                         .optim = {.lr = 0.5f, .schedule = ZPS_LR_CONSTANT}};
    zps_shard *s = zps_shard_new(&cfg);
    ck_assert_ptr_nonnull(s);
    zps_plan_slice slices[N_RANKS];
    zps_plan plan = {.global_batch = ZPS_SHARD_FX_BATCH, .n = n, .slices = slices};
    for (uint32_t r = 0; r < n; r++) {
        uint32_t first = ZPS_SHARD_FX_BATCH * r / n, last = ZPS_SHARD_FX_BATCH * (r + 1) / n;
        slices[r] = (zps_plan_slice){.rank = r, .member_id = 100 + r, .offset = first,
                                     .count = last - first};
    }
    zps_shard_add_plan(s, 1, 0, &plan);
    return s;
}

static lines s_warn(uint32_t n)
{
    zps_model_spec model = zps_shard_fx_model();
    zps_shard *s = s_shard_of_n(&model, n);
    zps_shard_io io = {.shard = s};
    lines l = {0};
    zps_log_set_hook(s_count, &l);
    zps_late_warn_stall(&io, NULL, 0, 5000);
    zps_log_set_hook(NULL, NULL);
    zps_shard_destroy(&s);
    return l;
}

START_TEST(test_late_stall_warning_names_every_rank_when_few_are_missing)
{
    lines l = s_warn(ZPS_LATE_WARN_RANKS);
    ck_assert_int_eq(l.rank_lines, ZPS_LATE_WARN_RANKS);
    ck_assert_int_eq(l.rest_lines, 0);
}
END_TEST

START_TEST(test_late_stall_warning_names_a_few_ranks_and_counts_the_rest)
{
    lines l = s_warn(N_RANKS);
    ck_assert_int_eq(l.rank_lines, ZPS_LATE_WARN_RANKS);
    ck_assert_int_eq(l.rest_lines, 1);
    ck_assert_uint_eq(l.rest, N_RANKS - ZPS_LATE_WARN_RANKS);
}
END_TEST

Suite *zps_suite_late(void)
{
    Suite *s = suite_create("late");
    TCase *tc = tcase_create("stall");
    tcase_add_test(tc, test_late_stall_warning_names_every_rank_when_few_are_missing);
    tcase_add_test(tc, test_late_stall_warning_names_a_few_ranks_and_counts_the_rest);
    suite_add_tcase(s, tc);
    return s;
}
