/* check_coord.c - the coordinator's gathering of an epoch's evaluation:
 * each test record counts once, whoever sends it first (a late slice's
 * owner or the helpers that computed its pieces), and bad bodies are
 * refused without changing anything. The metrics log shows the result. */
#include <stdio.h>
#include <string.h>

#include "server/zps_coord.h"
#include "tests/zps_check.h"

#define N_TEST 100u

typedef struct fixture {
    FILE *metrics;
    zps_coord *c;
} fixture;

static void s_setup(fixture *f)
{
    f->metrics = tmpfile();
    ck_assert_ptr_nonnull(f->metrics);
    zps_coord_cfg cfg = {.model = "mlp:4-3-2", .dataset = "synthetic:40", .seed = 1,
                         .global_batch = 8, .total_steps = 20, .steps_per_epoch = 5,
                         .n_test = N_TEST, .workers = 3, .worker_timeout_ms = 1000,
                         .n_params = 23, .shards = 1, .endpoint = "tcp://127.0.0.1:1",
                         .metrics = f->metrics};
    f->c = zps_coord_new(&cfg);
    ck_assert_ptr_nonnull(f->c);
}

static void s_teardown(fixture *f)
{
    zps_coord_destroy(&f->c);
    ck_assert_ptr_null(f->c);
    fclose(f->metrics);
}

// One worker's EVAL: `correct` of test records [offset, offset + count).
static zps_err s_eval(fixture *f, uint64_t epoch, uint32_t offset, uint32_t count,
                      uint32_t correct)
{
    Zps__Eval ev = ZPS__EVAL__INIT;
    ev.epoch = epoch;
    ev.offset = offset;
    ev.count = count;
    ev.correct = correct;
    ev.loss_sum = 0.5 * count;
    Zps__Header h;
    zps_wire_header_init(&h, ZPS__MSG_TYPE__EVAL);
    h.eval = &ev;
    zps_wire_msg m = {.hdr = &h};
    return zps_coord_on_eval(f->c, &m);
}

// The evaluation records of the metrics log, joined, e.g. "0:0.700000;".
static void s_evals(fixture *f, char *out, size_t len)
{
    fflush(f->metrics);
    rewind(f->metrics);
    out[0] = '\0';
    char line[256];
    while (fgets(line, sizeof line, f->metrics)) {
        unsigned long long epoch;
        double acc;
        if (sscanf(line, "{\"epoch\":%llu,\"test_accuracy\":%lf", &epoch, &acc) == 2) {
            size_t used = strlen(out);
            snprintf(out + used, len - used, "%llu:%.6f;", epoch, acc);
        }
    }
}

START_TEST(test_coord_eval_counts_each_test_record_once_whoever_sends_it_first)
{
    fixture f;
    s_setup(&f);
    char evals[256];
    // Epoch 0: the owner of [50, 100) was away at the epoch's end; two
    // helpers computed its pieces and evaluate its records. Its own copy,
    // come late, overlaps a piece already counted: dropped whole.
    ck_assert_int_eq(s_eval(&f, 0, 0, 50, 40), ZPS_OK);
    ck_assert_int_eq(s_eval(&f, 0, 50, 25, 20), ZPS_OK);
    ck_assert_int_eq(s_eval(&f, 0, 50, 50, 50), ZPS_OK);
    s_evals(&f, evals, sizeof evals);
    ck_assert_str_eq(evals, ""); // [75, 100) still missing
    ck_assert_int_eq(s_eval(&f, 0, 75, 25, 10), ZPS_OK);
    s_evals(&f, evals, sizeof evals);
    ck_assert_str_eq(evals, "0:0.700000;");
    // The other helper's copy of an epoch already complete changes nothing.
    ck_assert_int_eq(s_eval(&f, 0, 75, 25, 25), ZPS_OK);
    // Epoch 1: the owner's copy came first; the pieces are the copies.
    ck_assert_int_eq(s_eval(&f, 1, 50, 50, 45), ZPS_OK);
    ck_assert_int_eq(s_eval(&f, 1, 50, 25, 0), ZPS_OK);
    ck_assert_int_eq(s_eval(&f, 1, 0, 50, 35), ZPS_OK);
    s_evals(&f, evals, sizeof evals);
    ck_assert_str_eq(evals, "0:0.700000;1:0.800000;");
    s_teardown(&f);
}
END_TEST

START_TEST(test_coord_eval_refuses_records_past_the_test_set_and_changes_nothing)
{
    fixture f;
    s_setup(&f);
    ck_assert_int_eq(s_eval(&f, 0, 90, 20, 5), ZPS_EPROTO);
    ck_assert_int_eq(s_eval(&f, 0, 0, N_TEST + 1, 5), ZPS_EPROTO);
    ck_assert_int_eq(s_eval(&f, 0, 0, 10, 11), ZPS_EPROTO); // more right than evaluated
    // Records 90..99 were not marked by the refused message: they count now.
    ck_assert_int_eq(s_eval(&f, 0, 0, 90, 60), ZPS_OK);
    ck_assert_int_eq(s_eval(&f, 0, 90, 10, 3), ZPS_OK);
    char evals[256];
    s_evals(&f, evals, sizeof evals);
    ck_assert_str_eq(evals, "0:0.630000;");
    s_teardown(&f);
}
END_TEST

Suite *zps_suite_coord(void)
{
    Suite *s = suite_create("coord");
    TCase *tc = tcase_create("eval");
    tcase_add_test(tc, test_coord_eval_counts_each_test_record_once_whoever_sends_it_first);
    tcase_add_test(tc, test_coord_eval_refuses_records_past_the_test_set_and_changes_nothing);
    suite_add_tcase(s, tc);
    return s;
}
