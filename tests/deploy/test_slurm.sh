#!/usr/bin/env bash
# deploy/slurm/zps-slurm.sh under a faked Slurm environment:
#   1. host lists: the fallback parser, and scontrol when there is one;
#   2. --dry-run for several layouts (GPU nodes, CPU nodes, several shards,
#      shards sharing a node with workers, checkpoints): the command each
#      task would exec, roles, addresses and devices;
#   3. a real run on loopback: a one-node allocation (localhost) of 4 tasks,
#      2 shards + 2 CPU workers, each task a background process; every
#      process must exit 0 within its bound.
set -euo pipefail
# shellcheck source=tests/deploy/lib.sh
source "$(dirname "$0")/lib.sh"
slurm=$root/deploy/slurm/zps-slurm.sh
tmp=$(mktemp -d "${TMPDIR:-/tmp}/zps-test-slurm-XXXXXX")
pids=()
# shellcheck disable=SC2317 # called by the trap
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

# A getent that resolves the fake nodes to documentation addresses
# (192.0.2.0/24, never contacted: dry runs only print them), and a node
# that resolves to loopback the way Debian's /etc/hosts does.
mkdir -p "$tmp/fakebin" "$tmp/scontrol"
cat >"$tmp/fakebin/getent" <<'EOF'
#!/bin/sh
case "$2" in
  gpu01) echo "192.0.2.1 STREAM gpu01" ;;
  cpu1) echo "192.0.2.11 STREAM cpu1" ;;
  cpu2) echo "192.0.2.12 STREAM cpu2" ;;
  n1) echo "192.0.2.21 STREAM n1" ;;
  loopy1) echo "127.0.1.1 STREAM loopy1" ;;
  *) exit 2 ;;
esac
EOF
printf '#!/bin/sh\necho "scontrol $*"\n' >"$tmp/scontrol/scontrol"
chmod +x "$tmp/fakebin/getent" "$tmp/scontrol/scontrol"
fakepath=$tmp/fakebin:/usr/bin:/bin

# task NODELIST TASKS-PER-NODE NODEID LOCALID [VAR=VALUE...] -- [ARGS...]:
# the dry-run line of one task, in a clean environment.
task() {
  local nodelist=$1 tpn=$2 node=$3 local_id=$4 vars=()
  shift 4
  while [ $# -gt 0 ] && [ "$1" != -- ]; do vars+=("$1"); shift; done
  [ $# -eq 0 ] || shift
  env -i PATH="$fakepath" ZPS_BIN_DIR=/opt/zps/bin SLURM_JOB_NODELIST="$nodelist" \
    SLURM_STEP_TASKS_PER_NODE="$tpn" SLURM_NODEID="$node" SLURM_LOCALID="$local_id" \
    SLURM_PROCID=0 SLURM_NTASKS=0 "${vars[@]}" bash "$slurm" --dry-run -- "$@" 2>/dev/null
}
S=/opt/zps/bin/zps-server
W=/opt/zps/bin/zps-worker

echo "host lists"
expect_eq "ranges, padding, single hosts" \
  "$(env -i PATH=/usr/bin:/bin bash "$slurm" hostnames 'node[01-03,07],gpu5' | tr '\n' ' ')" \
  "node01 node02 node03 node07 gpu5 "
expect_eq "two bracket groups and a suffix, in Slurm's order" \
  "$(env -i PATH=/usr/bin:/bin bash "$slurm" hostnames 'r[1-2]-n[09-10]-ib' | tr '\n' ' ')" \
  "r1-n09-ib r1-n10-ib r2-n09-ib r2-n10-ib "
expect_eq "scontrol show hostnames when there is one" \
  "$(env -i PATH="$tmp/scontrol:/usr/bin:/bin" bash "$slurm" hostnames 'a[1-2]')" \
  "scontrol show hostnames a[1-2]"

echo "dry run: 3 GPU nodes, 4 tasks and 4 GPUs each, 1 shard"
gpu=(SLURM_GPUS_ON_NODE=4 'CUDA_VISIBLE_DEVICES=0,1,2,3')
expect_eq "node 0, task 0: shard 0 on the node's address, waiting for 8 workers, the job's flags" \
  "$(task 'gpu[01-03]' '4(x3)' 0 0 "${gpu[@]}" -- --model mlp:784-64-10 --epochs 2)" \
  "exec $S --shard 0 --shards 1 --listen tcp://192.0.2.1:5555 --workers 8 --model mlp:784-64-10 --epochs 2"
expect_eq "node 0, task 1: idle" "$(task 'gpu[01-03]' '4(x3)' 0 1 "${gpu[@]}")" ""
expect_eq "node 1, task 0: worker on cuda:0" "$(task 'gpu[01-03]' '4(x3)' 1 0 "${gpu[@]}")" \
  "exec $W --coordinator tcp://gpu01:5555 --device cuda:0"
expect_eq "node 2, task 3: worker on cuda:3" "$(task 'gpu[01-03]' '4(x3)' 2 3 "${gpu[@]}")" \
  "exec $W --coordinator tcp://gpu01:5555 --device cuda:3"
expect_eq "one GPU bound per task (CUDA_VISIBLE_DEVICES=2): cuda:0" \
  "$(task 'gpu[01-03]' '4(x3)' 2 2 SLURM_GPUS_ON_NODE=1 CUDA_VISIBLE_DEVICES=2)" \
  "exec $W --coordinator tcp://gpu01:5555 --device cuda:0"
expect_eq "GPUs known only from SLURM_GPUS_ON_NODE" \
  "$(task 'gpu[01-03]' '4(x3)' 1 1 SLURM_GPUS_ON_NODE=4)" \
  "exec $W --coordinator tcp://gpu01:5555 --device cuda:1"
expect_eq "worker flags and port from the environment" \
  "$(task 'gpu[01-03]' '4(x3)' 1 0 ZPS_SLURM_PORT=6000 ZPS_SLURM_WORKER_FLAGS='--threads 4')" \
  "exec $W --coordinator tcp://gpu01:6000 --device cpu --threads 4"
expect_eq "ZPS_SLURM_PARAMS_DIR: each worker saves its final parameters, named by its task" \
  "$(task 'gpu[01-03]' '4(x3)' 1 0 SLURM_PROCID=5 ZPS_SLURM_PARAMS_DIR=/p)" \
  "exec $W --coordinator tcp://gpu01:5555 --device cpu --save-params /p/worker-5.bin"

echo "dry run: CPU nodes cpu[1-2],n1, 2 tasks each, 3 shards over 2 server nodes, HTTP"
cpu=(ZPS_SLURM_SHARDS=3 ZPS_SLURM_SERVER_NODES=2 ZPS_SLURM_HTTP_PORT=8080)
expect_eq "cpu1 task 0: shard 0, 2 workers" "$(task 'cpu[1-2],n1' '2(x3)' 0 0 "${cpu[@]}")" \
  "exec $S --shard 0 --shards 3 --listen tcp://192.0.2.11:5555 --workers 2 --http 0.0.0.0:8080"
expect_eq "cpu2 task 0: shard 1 on its own node's address" \
  "$(task 'cpu[1-2],n1' '2(x3)' 1 0 "${cpu[@]}")" \
  "exec $S --shard 1 --shards 3 --listen tcp://192.0.2.12:5556 --coordinator tcp://cpu1:5555 --http 0.0.0.0:8081"
expect_eq "cpu1 task 1: shard 2" "$(task 'cpu[1-2],n1' '2(x3)' 0 1 "${cpu[@]}")" \
  "exec $S --shard 2 --shards 3 --listen tcp://192.0.2.11:5557 --coordinator tcp://cpu1:5555 --http 0.0.0.0:8082"
expect_eq "cpu2 task 1: idle" "$(task 'cpu[1-2],n1' '2(x3)' 1 1 "${cpu[@]}")" ""
expect_eq "n1 task 1: CPU worker" "$(task 'cpu[1-2],n1' '2(x3)' 2 1 "${cpu[@]}")" \
  "exec $W --coordinator tcp://cpu1:5555 --device cpu"
expect_eq "ZPS_SLURM_IFACE binds an interface" \
  "$(task 'cpu[1-2],n1' '2(x3)' 1 0 "${cpu[@]}" ZPS_SLURM_IFACE=ib0)" \
  "exec $S --shard 1 --shards 3 --listen tcp://ib0:5556 --coordinator tcp://cpu1:5555 --http 0.0.0.0:8081"

echo "dry run: shards and workers sharing node 0 (ZPS_SLURM_SERVER_NODES=0), no tasks-per-node list"
share=(ZPS_SLURM_SHARDS=2 ZPS_SLURM_SERVER_NODES=0 SLURM_STEP_TASKS_PER_NODE= SLURM_NTASKS=7)
expect_eq "node 0 task 1: shard 1, 7 tasks spread 4+3" \
  "$(task 'cpu[1-2]' '' 0 1 "${share[@]}")" \
  "exec $S --shard 1 --shards 2 --listen tcp://192.0.2.11:5556 --coordinator tcp://cpu1:5555"
expect_eq "node 0 task 0: shard 0 waits for 2 + 3 workers" \
  "$(task 'cpu[1-2]' '' 0 0 "${share[@]}")" \
  "exec $S --shard 0 --shards 2 --listen tcp://192.0.2.11:5555 --workers 5"
expect_eq "node 0 task 2: its first worker, cuda:0 of the node's GPUs" \
  "$(task 'cpu[1-2]' '' 0 2 "${share[@]}" CUDA_VISIBLE_DEVICES=0,1)" \
  "exec $W --coordinator tcp://cpu1:5555 --device cuda:0"

echo "dry run: checkpoints"
mkdir -p "$tmp/ckpt/shard-0" "$tmp/ckpt/shard-1"
touch "$tmp/ckpt/shard-0/shard-0-step-10.ckpt"
ck=(ZPS_SLURM_SHARDS=2 ZPS_SLURM_CHECKPOINT_DIR="$tmp/ckpt")
expect_eq "shard 0 with a checkpoint resumes" "$(task n1 3 0 0 "${ck[@]}" -- --checkpoint-every 10)" \
  "exec $S --shard 0 --shards 2 --listen tcp://192.0.2.21:5555 --workers 1 --checkpoint-dir $tmp/ckpt/shard-0 --resume --checkpoint-every 10"
expect_eq "shard 1 without one starts fresh" "$(task n1 3 0 1 "${ck[@]}")" \
  "exec $S --shard 1 --shards 2 --listen tcp://192.0.2.21:5556 --coordinator tcp://n1:5555 --checkpoint-dir $tmp/ckpt/shard-1"

echo "dry run: CurveZMQ keys (ZPS_SLURM_KEYS)"
mkdir -p "$tmp/keys/workers" "$tmp/keys/operators"
K=$tmp/keys
expect_eq "shard 0: its secret, the three allowlists that exist, CURVE required" \
  "$(task n1 3 0 0 ZPS_SLURM_SHARDS=2 ZPS_SLURM_KEYS="$K")" \
  "exec $S --shard 0 --shards 2 --listen tcp://192.0.2.21:5555 --curve-secret $K/server.key --authorized-keys $K/workers --require-curve --operator-keys $K/operators --workers 1"
expect_eq "shard 1 pins the coordinator's key" \
  "$(task n1 3 0 1 ZPS_SLURM_SHARDS=2 ZPS_SLURM_KEYS="$K")" \
  "exec $S --shard 1 --shards 2 --listen tcp://192.0.2.21:5556 --curve-secret $K/server.key --authorized-keys $K/workers --require-curve --operator-keys $K/operators --server-key $K/server.pub --coordinator tcp://n1:5555"
expect_eq "a worker: the workers' key, the shards' public key" \
  "$(task n1 3 0 2 ZPS_SLURM_SHARDS=2 ZPS_SLURM_KEYS="$K")" \
  "exec $W --coordinator tcp://n1:5555 --device cpu --curve-secret $K/worker.key --server-key $K/server.pub"

echo "refusals"
expect_match "more shards on a node than tasks" \
  "$(env -i PATH="$fakepath" SLURM_JOB_NODELIST=n1 \
      SLURM_STEP_TASKS_PER_NODE=2 SLURM_NODEID=0 SLURM_LOCALID=0 SLURM_NTASKS=2 \
      ZPS_SLURM_SHARDS=3 bash "$slurm" --dry-run 2>&1 || echo "exit $?")" \
  'holds 3 shards but has 2 tasks.*exit 1'
expect_match "a node name that resolves to loopback on a multi-node step" \
  "$(env -i PATH="$fakepath" SLURM_JOB_NODELIST='loopy1,n1' SLURM_STEP_TASKS_PER_NODE='1(x2)' \
      SLURM_NODEID=0 SLURM_LOCALID=0 SLURM_NTASKS=2 bash "$slurm" --dry-run 2>&1 || echo "exit $?")" \
  'resolves to 127.0.1.1.*HINT: set ZPS_SLURM_IFACE.*exit 1'
expect_match "no Slurm environment" "$(env -i PATH=/usr/bin:/bin bash "$slurm" 2>&1 || echo "exit $?")" \
  'run this under srun.*exit 1'

echo "zps-torch.sbatch: dry run"
# torch JOB-NODELIST [VAR=VALUE...] -- [ARGS...]: its srun lines, in a clean environment.
torch() {
  local nodelist=$1 vars=()
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do vars+=("$1"); shift; done
  [ $# -eq 0 ] || shift
  env -i PATH=/usr/bin:/bin ZPS_ROOT="$root" ZPS_BIN_DIR=/opt/zps/bin ZPS_SLURM_DRY_RUN=1 \
    SLURM_JOB_NODELIST="$nodelist" "${vars[@]}" bash "$root/deploy/slurm/zps-torch.sbatch" "$@" \
    2>/dev/null
}
expect_eq "3 GPU nodes of 4: shard 0 on the first, zps-run of 4 workers on the others" \
  "$(torch 'gpu[01-03]' SLURM_GPUS_ON_NODE=4 -- --steps 900 -- python3 train.py --data /d)" \
  "srun --nodes=1 --ntasks=1 --nodelist=gpu01 --kill-on-bad-exit=1 $S --listen tcp://0.0.0.0:5555 --workers 8 --model external --steps 900
srun --nodes=2 --ntasks-per-node=1 --exclude=gpu01 --kill-on-bad-exit=1 python3 -m zps.run --coordinator tcp://gpu01:5555 --workers 4 -- python3 train.py --data /d"
expect_eq "one node: zps-run starts the server; a model given; an installed zps-run" \
  "$(torch n1 ZPS_SLURM_WORKERS_PER_NODE=2 ZPS_RUN=zps-run -- --model mlp:784-64-10 -- python3 t.py)" \
  "srun --nodes=1 --ntasks=1 zps-run --workers 2 --model mlp:784-64-10 -- python3 t.py"
expect_eq "ZPS_SLURM_IFACE, ZPS_SLURM_PORT" \
  "$(torch 'cpu[1-2]' ZPS_SLURM_IFACE=ib0 ZPS_SLURM_PORT=6000 -- -- python3 t.py | head -n 1)" \
  "srun --nodes=1 --ntasks=1 --nodelist=cpu1 --kill-on-bad-exit=1 $S --listen tcp://ib0:6000 --workers 1 --model external"
expect_match "no command after --" "$(torch n1 -- --steps 9 2>&1 || echo "exit $?")" 'exit 1'

echo "zps.sbatch: dry run"
# sbatch_run [VAR=VALUE...] -- [ARGS...]: its start line and srun line, in a clean environment.
sbatch_run() {
  local vars=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do vars+=("$1"); shift; done
  env -i PATH=/usr/bin:/bin ZPS_ROOT="$root" ZPS_SLURM_DRY_RUN=1 SLURM_JOB_ID=42 \
    SLURM_JOB_NODELIST='n[1-3]' ZPS_SLURM_CHECKPOINT_DIR="$tmp/sbatch-ckpt" "${vars[@]}" \
    bash "$root/deploy/slurm/zps.sbatch" "$@" 2>&1
}
expect_match "a first start: said so, then the step" "$(sbatch_run -- --epochs 2)" \
  "^zps.sbatch: job 42 on n\\[1-3\\], [0-9-]+ [0-9:]+ UTC: first start, no checkpoint in $tmp/sbatch-ckpt/shard-0: training from step 0 srun --kill-on-bad-exit=1 --label $root/deploy/slurm/zps-slurm.sh -- --epochs 2 \$"
mkdir -p "$tmp/sbatch-ckpt/shard-0"
: >"$tmp/sbatch-ckpt/shard-0/shard-0-step-20.ckpt"
expect_match "a requeue (SLURM_RESTART_COUNT=1) with checkpoints: a resume" \
  "$(sbatch_run SLURM_RESTART_COUNT=1 -- --epochs 2 | head -n 1)" \
  ": start 2 \\(requeued 1 time\\(s\\)\\), a resume from the checkpoints in $tmp/sbatch-ckpt/shard-0\$"
expect_match "the output file keeps every start" "$(grep '^#SBATCH' "$root/deploy/slurm/zps.sbatch")" \
  "#SBATCH --requeue #SBATCH --open-mode=append"

echo "real run: localhost, 4 tasks (2 shards, 2 CPU workers), 20 steps, CurveZMQ"
need_bins
# The keys as the script's comment lays them out.
rk=$tmp/run-keys
mkdir -p "$rk/workers"
if ! { "$bin/zps-ctl" keygen "$rk/server" && "$bin/zps-ctl" keygen "$rk/worker" &&
        cp "$rk/worker.pub" "$rk/workers/"; } >/dev/null; then
  fail "zps-ctl keygen"
fi
# A base port whose two ports are free (connecting to a closed port fails),
# below the kernel's ephemeral range (a port there may be the local end of
# a connection, and binding it fails though nothing listens).
port=
read -r eph_lo _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || eph_lo=32768
[ "$eph_lo" -gt 12000 ] || eph_lo=32768
for _ in $(seq 20); do
  p=$((10000 + RANDOM % (eph_lo - 10001)))
  if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null &&
     ! (exec 3<>"/dev/tcp/127.0.0.1/$((p + 1))") 2>/dev/null; then port=$p; break; fi
done
[ -n "$port" ] || { fail "no free port pair"; finish; }
for t in 0 1 2 3; do
  env -u CUDA_VISIBLE_DEVICES -u SLURM_GPUS_ON_NODE ZPS_BIN_DIR="$bin" \
    SLURM_JOB_NODELIST=localhost SLURM_STEP_TASKS_PER_NODE=4 SLURM_NODEID=0 SLURM_LOCALID=$t \
    SLURM_PROCID=$t SLURM_NTASKS=4 ZPS_SLURM_SHARDS=2 ZPS_SLURM_PORT="$port" \
    ZPS_SLURM_CHECKPOINT_DIR="$tmp/run-ckpt" ZPS_SLURM_WORKER_FLAGS="--cache-dir $tmp/cache" \
    ZPS_SLURM_KEYS="$rk" \
    timeout 60 bash "$slurm" -- --model mlp:784-64-10 --steps 20 --global-batch 64 \
    --dataset synthetic:2048 --checkpoint-every 10 --worker-timeout-ms 5000 \
    >"$tmp/task-$t.log" 2>&1 &
  pids+=($!)
done
names=("shard 0" "shard 1" "worker 0" "worker 1")
for t in 2 3 0 1; do
  rc=0
  wait "${pids[t]}" || rc=$?
  expect_eq "${names[t]} exits 0" "$rc" 0
  [ "$rc" = 0 ] || tail -n 5 "$tmp/task-$t.log" | sed 's/^/    /'
done
pids=()
expect_match "shard 0 says the workers finished" "$(cat "$tmp/task-0.log")" 'rank 1 .*finished'
expect_match "each shard wrote its checkpoint of step 20" \
  "$(ls "$tmp/run-ckpt/shard-0" "$tmp/run-ckpt/shard-1" 2>&1)" \
  'shard-0-step-20\.ckpt .*shard-1-step-20\.ckpt'
expect_match "shard 0 ran with CurveZMQ" "$(cat "$tmp/task-0.log")" 'CurveZMQ on'
expect_eq "shard 1 kept its token where --resume finds it, owner-only" \
  "$(stat -c %a "$tmp/run-ckpt/shard-1/shard-1.token" 2>&1)" 600
finish
