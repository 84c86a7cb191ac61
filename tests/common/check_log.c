/* check_log.c - zps_log's lines: the name they carry, the process's or
 * the one a thread gave its own (a process with many libzps clients, one
 * a thread, names each line by its client). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/zps_log.h"
#include "tests/zps_check.h"

static void *s_named_thread(void *arg)
{
    zps_log_set_thread_name(arg);
    zps_log_info("from the named thread");
    zps_log_set_thread_name("");
    zps_log_info("from the thread named again by the process");
    return NULL;
}

// stderr goes to a temporary file (returned) until s_restore_stderr(*saved).
static FILE *s_capture_stderr(int *saved)
{
    FILE *f = tmpfile();
    ck_assert_ptr_nonnull(f);
    fflush(stderr);
    *saved = dup(STDERR_FILENO);
    ck_assert_int_ge(*saved, 0);
    ck_assert_int_ge(dup2(fileno(f), STDERR_FILENO), 0);
    return f;
}

static void s_restore_stderr(int saved)
{
    fflush(stderr);
    ck_assert_int_ge(dup2(saved, STDERR_FILENO), 0);
    close(saved);
}

// The line of stderr (written to f) holding text, into line.
static void s_line_with(FILE *f, const char *text, char *line, size_t len)
{
    rewind(f);
    while (fgets(line, (int)len, f)) {
        if (strstr(line, text)) {
            return;
        }
    }
    ck_abort_msg("no line with '%s'", text);
}

START_TEST(test_log_line_carries_its_threads_name_else_the_processs)
{
    int saved;
    FILE *f = s_capture_stderr(&saved);
    zps_log_set_name("worker[7]");
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, s_named_thread, "worker[3]"), 0);
    ck_assert_int_eq(pthread_join(t, NULL), 0);
    zps_log_info("from the main thread");
    s_restore_stderr(saved);
    char line[512];
    s_line_with(f, "from the named thread", line, sizeof line);
    ck_assert_ptr_nonnull(strstr(line, " worker[3]: "));
    s_line_with(f, "from the thread named again", line, sizeof line);
    ck_assert_ptr_nonnull(strstr(line, " worker[7]: "));
    s_line_with(f, "from the main thread", line, sizeof line);
    ck_assert_ptr_nonnull(strstr(line, " worker[7]: "));
    fclose(f);
    zps_log_set_name("zps"); // as it was, for the suites after it in one process
}
END_TEST

static const char *const s_names[] = {"worker[4095]", "w[7]"};
static atomic_bool s_logged; // the main thread wrote all its lines

// Renames the process over and over, between names of unlike lengths,
// until every line is written: a line read half-way through a rename
// would carry a name of neither.
static void *s_renaming_thread(void *arg)
{
    (void)arg;
    for (unsigned i = 0; !atomic_load(&s_logged); i++) {
        zps_log_set_name(s_names[i % 2]);
    }
    return NULL;
}

START_TEST(test_log_line_carries_a_whole_name_while_another_thread_renames_the_process)
{
    int saved;
    FILE *f = s_capture_stderr(&saved);
    zps_log_set_name(s_names[0]);
    atomic_store(&s_logged, false);
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, s_renaming_thread, NULL), 0);
    for (int i = 0; i < 20000; i++) {
        zps_log_info("renamed");
    }
    atomic_store(&s_logged, true);
    ck_assert_int_eq(pthread_join(t, NULL), 0);
    s_restore_stderr(saved);
    rewind(f);
    char line[512];
    int lines = 0;
    while (fgets(line, (int)sizeof line, f)) {
        if (!strstr(line, ": renamed")) {
            continue;
        }
        lines++;
        ck_assert_msg(strstr(line, " worker[4095]: renamed") || strstr(line, " w[7]: renamed"),
                      "a torn name: %s", line);
    }
    ck_assert_int_eq(lines, 20000);
    fclose(f);
    zps_log_set_name("zps");
}
END_TEST

Suite *zps_suite_log(void)
{
    Suite *s = suite_create("log");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_log_line_carries_its_threads_name_else_the_processs);
    tcase_add_test(tc, test_log_line_carries_a_whole_name_while_another_thread_renames_the_process);
    suite_add_tcase(s, tc);
    return s;
}
