/* check_integration.c - runs the integration suites (needs bin/ built). */
#include <stdio.h>
#include <stdlib.h>

#include "zps_integration.h"
#include "zps_proc.h"

int main(void)
{
    SRunner *sr = srunner_create(zps_suite_train());
    srunner_add_suite(sr, zps_suite_malformed());
    srunner_add_suite(sr, zps_suite_cluster());
    srunner_add_suite(sr, zps_suite_failures());
    srunner_add_suite(sr, zps_suite_security());
    srunner_add_suite(sr, zps_suite_hostile());
    srunner_add_suite(sr, zps_suite_stragglers());
    srunner_add_suite(sr, zps_suite_report());
    srunner_add_suite(sr, zps_suite_http());
    srunner_add_suite(sr, zps_suite_daemon());
    srunner_add_suite(sr, zps_suite_netns());
    srunner_add_suite(sr, zps_suite_gpu());
    srunner_add_suite(sr, zps_suite_chaos());
    srunner_add_suite(sr, zps_suite_external());
    srunner_add_suite(sr, zps_suite_shm_jobs());
    srunner_add_suite(sr, zps_suite_host());
    srunner_add_suite(sr, zps_suite_diloco());
    srunner_add_suite(sr, zps_suite_end());
    srunner_add_suite(sr, zps_suite_clip());
    srunner_add_suite(sr, zps_suite_deterministic());
    srunner_add_suite(sr, zps_suite_deterministic_runs());
    srunner_add_suite(sr, zps_suite_swarm());
    zps_procs_begin_run();
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    zps_procs_end_run(failed > 0); // CI keeps the output, not the directories
    // The failures again, below their logs, where a CI log's tail shows them.
    TestResult **results = failed > 0 ? srunner_failures(sr) : NULL;
    for (int i = 0; results && i < failed; i++) {
        fprintf(stderr, "FAILED %s:%d: %s: %s\n", tr_lfile(results[i]), tr_lno(results[i]),
                tr_tcname(results[i]), tr_msg(results[i]));
    }
    free(results);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
