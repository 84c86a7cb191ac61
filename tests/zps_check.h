/* zps_check.h - the unit suites of zps, one per module, run by check_unit.c. */
#ifndef ZPS_CHECK_H
#define ZPS_CHECK_H

#include <check.h>

// common/
Suite *zps_suite_model(void);
Suite *zps_suite_optim(void);
Suite *zps_suite_wire(void);
Suite *zps_suite_idx(void);
Suite *zps_suite_dataset(void);
Suite *zps_suite_dtype(void);
Suite *zps_suite_opts(void);
Suite *zps_suite_plans(void);
Suite *zps_suite_plan(void);
Suite *zps_suite_layout(void);
Suite *zps_suite_mlog(void);
Suite *zps_suite_log(void);
Suite *zps_suite_outer(void);
Suite *zps_suite_quant(void);
Suite *zps_suite_zcode(void);
Suite *zps_suite_host_code(void);
Suite *zps_suite_dyl(void);
Suite *zps_suite_shm(void);
Suite *zps_suite_sndbuf(void);
Suite *zps_suite_err(void);
Suite *zps_suite_atomic(void);
Suite *zps_suite_sumsq(void);
Suite *zps_suite_tree(void);

// server/
Suite *zps_suite_msgtab(void);
Suite *zps_suite_late(void);
Suite *zps_suite_timers(void);

// server/coord/
Suite *zps_suite_coord(void);
Suite *zps_suite_coord_hosts(void);
Suite *zps_suite_status(void);
Suite *zps_suite_member(void);
Suite *zps_suite_monitor(void);
Suite *zps_suite_outbox(void);

// server/shard/
Suite *zps_suite_shard(void);
Suite *zps_suite_pool(void);
Suite *zps_suite_ckpt(void);
Suite *zps_suite_shard_shm(void);
Suite *zps_suite_shard_outer(void);
Suite *zps_suite_shard_groups(void);
Suite *zps_suite_shard_host(void);
Suite *zps_suite_shard_io(void);
Suite *zps_suite_nodes(void);
Suite *zps_suite_cover(void);
Suite *zps_suite_shard_deterministic(void);

// lib/ (libzps)
Suite *zps_suite_client(void);
Suite *zps_suite_sampler(void);
Suite *zps_suite_round(void);
Suite *zps_suite_heartbeat(void);

// worker/ (zps-worker)
Suite *zps_suite_cpu(void);
Suite *zps_suite_cuda(void);

#endif
