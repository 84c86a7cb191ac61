/* check_unit.c - runs every unit suite (one per module) in one runner, so
 * the run ends with one Check summary line. */
#include <stdlib.h>

#include "tests/zps_check.h"

int main(void)
{
    // By folder, as tests/ mirrors the sources.
    Suite *(*suites[])(void) = {
        // common/
        zps_suite_model, zps_suite_optim, zps_suite_wire, zps_suite_idx, zps_suite_dataset,
        zps_suite_dtype, zps_suite_opts, zps_suite_plan, zps_suite_plans, zps_suite_layout,
        zps_suite_mlog, zps_suite_log,
        zps_suite_outer, zps_suite_quant, zps_suite_dyl, zps_suite_shm, zps_suite_sndbuf,
        zps_suite_err, zps_suite_atomic, zps_suite_timers, zps_suite_sumsq, zps_suite_tree,
        zps_suite_zcode,
        // server/, server/coord/, server/shard/
        zps_suite_msgtab, zps_suite_late,
        zps_suite_coord, zps_suite_coord_hosts, zps_suite_status, zps_suite_member, zps_suite_monitor, zps_suite_outbox,
        zps_suite_shard, zps_suite_pool, zps_suite_ckpt, zps_suite_shard_shm, zps_suite_shard_outer,
        zps_suite_shard_groups, zps_suite_nodes, zps_suite_cover, zps_suite_shard_deterministic,
        zps_suite_shard_host, zps_suite_shard_io,
        // lib/ (libzps)
        zps_suite_client, zps_suite_sampler, zps_suite_round, zps_suite_heartbeat,
        zps_suite_host_code,
        // worker/ (zps-worker)
        zps_suite_cpu, zps_suite_cuda,
    };
    SRunner *sr = srunner_create(suites[0]());
    for (size_t i = 1; i < sizeof suites / sizeof suites[0]; i++) {
        srunner_add_suite(sr, suites[i]());
    }
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
