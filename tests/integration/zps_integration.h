/* zps_integration.h - the integration suites: real zps processes on loopback. */
#ifndef ZPS_INTEGRATION_H
#define ZPS_INTEGRATION_H

#include <check.h>

Suite *zps_suite_train(void);
Suite *zps_suite_malformed(void);
Suite *zps_suite_cluster(void);
Suite *zps_suite_failures(void);
Suite *zps_suite_security(void);
Suite *zps_suite_hostile(void);
Suite *zps_suite_stragglers(void);
Suite *zps_suite_report(void);
Suite *zps_suite_http(void);
Suite *zps_suite_daemon(void);
Suite *zps_suite_netns(void);
Suite *zps_suite_gpu(void);
Suite *zps_suite_chaos(void);
Suite *zps_suite_external(void);
Suite *zps_suite_shm_jobs(void);
Suite *zps_suite_host(void);
Suite *zps_suite_diloco(void);
Suite *zps_suite_end(void);
Suite *zps_suite_clip(void);
Suite *zps_suite_deterministic(void);
Suite *zps_suite_deterministic_runs(void);
Suite *zps_suite_swarm(void);

// Where tests keep decompressed datasets between runs.
#define ZPS_TEST_CACHE "build/test-cache"

#endif
