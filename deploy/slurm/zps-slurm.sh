#!/usr/bin/env bash
# deploy/slurm/zps-slurm.sh - one task of a zps job step under Slurm.
#
#   srun deploy/slurm/zps-slurm.sh [--dry-run] [-- SERVER-FLAGS...]
#   deploy/slurm/zps-slurm.sh hostnames HOSTLIST
#
# Every task of the step runs this script. From the Slurm environment it
# decides whether it is shard I or a worker (and on which device), derives
# the addresses, and execs the daemon (so srun's signals reach it).
# SERVER-FLAGS go to shard 0, which holds the job (--model, --steps, ...).
#
# Layout, which every task computes alike from the step's node list and
# tasks per node:
#   shards   ZPS_SLURM_SHARDS of them (default 1). On a step of several
#            nodes the first ZPS_SLURM_SERVER_NODES nodes (default 1) hold
#            only shards: shard s is local task s/K of node s%K; their other
#            tasks are idle and exit 0. On one node, or with
#            ZPS_SLURM_SERVER_NODES=0, node 0's first tasks are the shards
#            and the tasks after them are workers.
#   workers  every other task. A task that sees GPUs (CUDA_VISIBLE_DEVICES,
#            else SLURM_GPUS_ON_NODE) is the node's j-th worker on cuda:j
#            (cuda:0 when one GPU is bound per task); cpu otherwise.
#   addresses  shard s listens on port ZPS_SLURM_PORT+s (default 5555) at
#            its node's IPv4 address (the node's name resolved with getent;
#            ZPS_SLURM_IFACE=ib0 binds that interface instead), since shards
#            register the address they bind; workers and shards 1.. reach the
#            coordinator at tcp://FIRST-NODE:ZPS_SLURM_PORT.
# More environment: ZPS_BIN_DIR (default: this checkout's bin/),
# ZPS_SLURM_WORKER_FLAGS (added to every worker), ZPS_SLURM_WORKERS (the
# worker count shard 0 waits for; default: the layout's),
# ZPS_SLURM_CHECKPOINT_DIR (shard s keeps checkpoints in DIR/shard-s and
# resumes from them when there are any), ZPS_SLURM_HTTP_PORT (shard s
# serves HTTP on that port + s), ZPS_SLURM_PARAMS_DIR (each worker writes
# the final parameters to DIR/worker-TASK.bin, TASK its SLURM_PROCID:
# --save-params), ZPS_SLURM_DRY_RUN=1 (same as --dry-run: print what this
# task would run, run nothing).
#
# CurveZMQ: ZPS_SLURM_KEYS=DIR, a directory every node sees (as the
# checkout), readable by the job's user only:
#   DIR/server.key, server.pub  the shards' key pair (zps-ctl keygen server)
#   DIR/worker.key              the workers' key (zps-ctl keygen worker)
#   DIR/workers/*.pub           who may be a worker (worker.pub at least)
#   DIR/shards/*.pub            shards with a key pair of their own (optional)
#   DIR/operators/*.pub         who may ask zps-ctl status/top (optional)
# Shards then listen with CURVE only (--require-curve), workers pin
# server.pub.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
bin=${ZPS_BIN_DIR:-$here/bin}

usage() { sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
die() { echo "zps-slurm: $*" >&2; exit 1; }

# ---------------------------------------------------------------- host lists
# Prints the top-level comma-separated items of a Slurm host list, one a
# line: the commas inside brackets stay ("a[1,3],b" gives "a[1,3]" and "b").
split_items() {
  local s=$1 cur='' depth=0 i c
  for ((i = 0; i < ${#s}; i++)); do
    c=${s:i:1}
    case "$c" in
      '[') depth=$((depth + 1)) ;;
      ']') depth=$((depth - 1)) ;;
    esac
    if [ "$c" = , ] && [ "$depth" -eq 0 ]; then
      printf '%s\n' "$cur"
      cur=''
    else
      cur+=$c
    fi
  done
  [ -z "$cur" ] || printf '%s\n' "$cur"
}

# Expands one item's first bracket group and recurses on the rest, keeping
# the zero padding of the range's lower bound (node[08-10] gives node08,
# node09, node10), in Slurm's order.
expand_item() {
  local item=$1 re='^([^[]*)\[([^]]*)\](.*)$' pre ranges post r lo hi n
  if ! [[ $item =~ $re ]]; then
    printf '%s\n' "$item"
    return
  fi
  pre=${BASH_REMATCH[1]} ranges=${BASH_REMATCH[2]} post=${BASH_REMATCH[3]}
  local IFS=,
  for r in $ranges; do
    if [[ $r =~ ^([0-9]+)-([0-9]+)$ ]]; then
      lo=${BASH_REMATCH[1]} hi=${BASH_REMATCH[2]}
      for ((n = 10#$lo; n <= 10#$hi; n++)); do
        expand_item "$pre$(printf '%0*d' "${#lo}" "$n")$post"
      done
    elif [[ $r =~ ^[0-9]+$ ]]; then
      expand_item "$pre$r$post"
    else
      die "cannot expand '$r' in host list item '$item'"
    fi
  done
}

# One host name a line. scontrol knows every syntax Slurm has; the small
# parser above covers lists like node[01-03,07],gpu5 where it is missing or
# fails (Debian's slurm-client on a machine with no slurm.conf).
hostnames() {
  local out
  if command -v scontrol >/dev/null 2>&1 && out=$(scontrol show hostnames "$1" 2>/dev/null); then
    printf '%s\n' "$out"
    return
  fi
  local item
  while IFS= read -r item; do expand_item "$item"; done < <(split_items "$1")
}

# Tasks per node, one number a line: SLURM_STEP_TASKS_PER_NODE looks like
# "4(x2),2" (4 on each of the first two nodes, then 2).
tasks_per_node() {
  local item IFS=,
  for item in $1; do
    if [[ $item =~ ^([0-9]+)\(x([0-9]+)\)$ ]]; then
      for ((n = 0; n < BASH_REMATCH[2]; n++)); do echo "${BASH_REMATCH[1]}"; done
    elif [[ $item =~ ^[0-9]+$ ]]; then
      echo "$item"
    else
      die "cannot read tasks per node '$1'"
    fi
  done
}

# The IPv4 address this node's name resolves to: what the other nodes reach.
node_addr() {
  local addr
  addr=$(getent ahostsv4 "$1" 2>/dev/null | awk 'NR == 1 { print $1 }') || true
  [ -n "$addr" ] || die "cannot resolve node '$1' (HINT: set ZPS_SLURM_IFACE to the interface to bind)"
  echo "$addr"
}

# ---------------------------------------------------------------- arguments
dry_run=${ZPS_SLURM_DRY_RUN:-0}
case "${1:-}" in
  hostnames) [ $# -eq 2 ] || usage; hostnames "$2"; exit 0 ;;
  -h|--help) usage ;;
esac
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1; shift ;;
    --) shift; break ;;
    *) usage ;;
  esac
done

# ---------------------------------------------------------------- the layout
nodelist=${SLURM_STEP_NODELIST:-${SLURM_JOB_NODELIST:-}}
[ -n "$nodelist" ] || die "no SLURM_STEP_NODELIST or SLURM_JOB_NODELIST: run this under srun"
mapfile -t nodes < <(hostnames "$nodelist")
nnodes=${#nodes[@]}
node_id=${SLURM_NODEID:?zps-slurm: no SLURM_NODEID: run this under srun}
local_id=${SLURM_LOCALID:?zps-slurm: no SLURM_LOCALID: run this under srun}
proc_id=${SLURM_PROCID:-?}
ntasks=${SLURM_STEP_NUM_TASKS:-${SLURM_NTASKS:?zps-slurm: no SLURM_NTASKS: run this under srun}}
tpn_spec=${SLURM_STEP_TASKS_PER_NODE:-${SLURM_TASKS_PER_NODE:-}}
if [ -n "$tpn_spec" ]; then
  mapfile -t tpn < <(tasks_per_node "$tpn_spec")
else
  # No list: the tasks spread evenly, the first nodes taking the remainder.
  tpn=()
  for ((n = 0; n < nnodes; n++)); do
    tpn+=($((ntasks / nnodes + (n < ntasks % nnodes ? 1 : 0))))
  done
fi
[ "${#tpn[@]}" -eq "$nnodes" ] ||
  die "tasks per node '$tpn_spec' names ${#tpn[@]} nodes, the node list $nnodes"
[ "$node_id" -lt "$nnodes" ] || die "SLURM_NODEID $node_id is not below $nnodes nodes"

shards=${ZPS_SLURM_SHARDS:-1}
server_nodes=${ZPS_SLURM_SERVER_NODES:-$((nnodes > 1 ? 1 : 0))}
[ "$server_nodes" -lt "$nnodes" ] || [ "$nnodes" -eq 1 ] ||
  die "ZPS_SLURM_SERVER_NODES=$server_nodes leaves no node for workers ($nnodes nodes)"
[ "$nnodes" -gt 1 ] || server_nodes=0
spread=$((server_nodes > 0 ? server_nodes : 1)) # nodes the shards spread over
port=${ZPS_SLURM_PORT:-5555}

# Shards on node n (n < spread): s = n, n + spread, ...
shards_on() { echo $(((shards - $1 + spread - 1) / spread)); }
for ((n = 0; n < spread; n++)); do
  [ "$(shards_on "$n")" -le "${tpn[n]}" ] ||
    die "node ${nodes[n]} holds $(shards_on "$n") shards but has ${tpn[n]} tasks"
done

# Workers: all tasks of the worker nodes, and on a shared node those after
# its shards. first_worker is the local id of a node's first worker.
first_worker() {
  if [ "$1" -ge "$spread" ]; then echo 0
  elif [ "$server_nodes" -eq 0 ]; then shards_on "$1"
  else echo "${tpn[$1]}"; fi
}
workers=0
for ((n = 0; n < nnodes; n++)); do workers=$((workers + tpn[n] - $(first_worker "$n"))); done
workers=${ZPS_SLURM_WORKERS:-$workers}
[ "$workers" -ge 1 ] || die "the layout leaves no task for a worker (HINT: more tasks or nodes)"

coordinator="tcp://${nodes[0]}:$port"
me="task $proc_id (node ${nodes[node_id]}, local $local_id)"

# Runs (or, dry, prints) the daemon.
launch() {
  echo "zps-slurm: $me: $1" >&2
  shift
  if [ "$dry_run" = 1 ]; then
    printf 'exec'
    printf ' %q' "$@"
    printf '\n'
    exit 0
  fi
  exec "$@"
}

# ---------------------------------------------------------------- shard
if [ "$node_id" -lt "$spread" ] && [ "$local_id" -lt "$(shards_on "$node_id")" ]; then
  s=$((local_id * spread + node_id))
  if [ -n "${ZPS_SLURM_IFACE:-}" ]; then
    host=$ZPS_SLURM_IFACE
  else
    host=$(node_addr "${nodes[node_id]}")
    # Debian maps a host's own name to 127.0.1.1: the others could not reach it.
    if [ "$nnodes" -gt 1 ] && [[ $host == 127.* ]]; then
      die "${nodes[node_id]} resolves to $host here (HINT: set ZPS_SLURM_IFACE, e.g. eth0 or ib0)"
    fi
  fi
  args=(--shard "$s" --shards "$shards" --listen "tcp://$host:$((port + s))")
  if [ -n "${ZPS_SLURM_KEYS:-}" ]; then
    keys=$ZPS_SLURM_KEYS
    args+=(--curve-secret "$keys/server.key" --authorized-keys "$keys/workers" --require-curve)
    if [ -d "$keys/shards" ]; then args+=(--shard-keys "$keys/shards"); fi
    if [ -d "$keys/operators" ]; then args+=(--operator-keys "$keys/operators"); fi
    if [ "$s" -gt 0 ]; then args+=(--server-key "$keys/server.pub"); fi
  fi
  if [ "$s" -gt 0 ]; then
    args+=(--coordinator "$coordinator")
  else
    args+=(--workers "$workers")
  fi
  if [ -n "${ZPS_SLURM_HTTP_PORT:-}" ]; then
    args+=(--http "0.0.0.0:$((ZPS_SLURM_HTTP_PORT + s))")
  fi
  if [ -n "${ZPS_SLURM_CHECKPOINT_DIR:-}" ]; then
    dir=$ZPS_SLURM_CHECKPOINT_DIR/shard-$s
    [ "$dry_run" = 1 ] || mkdir -p "$dir"
    args+=(--checkpoint-dir "$dir")
    # A requeued or resubmitted job goes on from its newest checkpoint.
    if compgen -G "$dir/*.ckpt" >/dev/null; then args+=(--resume); fi
  fi
  [ "$s" -gt 0 ] || args+=("$@")
  launch "shard $s of $shards, coordinator $coordinator, $workers workers" \
    "$bin/zps-server" "${args[@]}"
fi

# ---------------------------------------------------------------- worker
first=$(first_worker "$node_id")
if [ "$local_id" -lt "$first" ]; then
  echo "zps-slurm: $me: idle (a server node's task beyond its shards)" >&2
  exit 0
fi
j=$((local_id - first)) # this node's j-th worker
node_workers=$((tpn[node_id] - first))
gpus=()
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ] && [ "$CUDA_VISIBLE_DEVICES" != NoDevFiles ]; then
  IFS=, read -r -a gpus <<<"$CUDA_VISIBLE_DEVICES"
elif [ "${SLURM_GPUS_ON_NODE:-0}" -gt 0 ]; then
  for ((g = 0; g < SLURM_GPUS_ON_NODE; g++)); do gpus+=("$g"); done
fi
if [ ${#gpus[@]} -eq 0 ]; then
  device=cpu
elif [ ${#gpus[@]} -eq 1 ]; then
  device=cuda:0
else
  [ "$node_workers" -le ${#gpus[@]} ] ||
    echo "zps-slurm: $me: $node_workers workers share ${#gpus[@]} GPUs" >&2
  device=cuda:$((j % ${#gpus[@]}))
fi
extra=()
read -r -a extra <<<"${ZPS_SLURM_WORKER_FLAGS:-}"
if [ -n "${ZPS_SLURM_KEYS:-}" ]; then
  extra+=(--curve-secret "$ZPS_SLURM_KEYS/worker.key" --server-key "$ZPS_SLURM_KEYS/server.pub")
fi
if [ -n "${ZPS_SLURM_PARAMS_DIR:-}" ]; then
  [ "$dry_run" = 1 ] || mkdir -p "$ZPS_SLURM_PARAMS_DIR"
  extra+=(--save-params "$ZPS_SLURM_PARAMS_DIR/worker-$proc_id.bin")
fi
launch "worker $j of node ${nodes[node_id]} on $device, coordinator $coordinator" \
  "$bin/zps-worker" --coordinator "$coordinator" --device "$device" "${extra[@]}"
