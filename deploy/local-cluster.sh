#!/usr/bin/env bash
# deploy/local-cluster.sh - S shards and W workers on this machine.
#
#   deploy/local-cluster.sh start [-s SHARDS] [-w WORKERS] [-d RUNDIR] [-- SERVER-FLAGS...]
#   deploy/local-cluster.sh status [-d RUNDIR]
#   deploy/local-cluster.sh stop [-d RUNDIR]
#
# The run directory (default run/local) holds logs/, pids/ and the
# coordinator's endpoint. SERVER-FLAGS go to shard 0, which holds the job
# (e.g. -- --model mlp:784-512-512-10 --epochs 2 --wire-dtype bf16);
# ZPS_WORKER_FLAGS adds flags to every worker. Processes are started in the
# background and stopped by pid, never by name.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${ZPS_BIN_DIR:-$here/bin}

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

cmd=${1:-}; [ -n "$cmd" ] || usage; shift
shards=1 workers=2 rundir=run/local
while [ $# -gt 0 ]; do
  case "$1" in
    -s) shards=$2; shift 2 ;;
    -w) workers=$2; shift 2 ;;
    -d) rundir=$2; shift 2 ;;
    --) shift; break ;;
    *) usage ;;
  esac
done

# Starts one daemon in its own session (it outlives this script); records its pid.
spawn() {
  local name=$1; shift
  setsid "$@" </dev/null >>"$rundir/logs/$name.log" 2>&1 &
  echo $! >"$rundir/pids/$name.pid"
}

wait_file() {
  for _ in $(seq 100); do [ -s "$1" ] && return 0; sleep 0.1; done
  echo "local-cluster: $1 did not appear within 10 s; see $rundir/logs" >&2
  return 1
}

alive() { kill -0 "$1" 2>/dev/null; }

start() {
  if compgen -G "$rundir/pids/*.pid" >/dev/null; then
    echo "local-cluster: $rundir already has pid files; stop it first" >&2
    exit 1
  fi
  mkdir -p "$rundir/logs" "$rundir/pids"
  rm -f "$rundir"/endpoint*
  spawn server-0 "$bin/zps-server" --shard 0 --shards "$shards" --workers "$workers" \
    --listen 'tcp://127.0.0.1:*' --endpoint-file "$rundir/endpoint" \
    --metrics-log "$rundir/metrics.jsonl" "$@"
  wait_file "$rundir/endpoint"
  local ep; ep=$(cat "$rundir/endpoint")
  for k in $(seq 1 $((shards - 1))); do
    spawn "server-$k" "$bin/zps-server" --shard "$k" --shards "$shards" --coordinator "$ep" \
      --listen 'tcp://127.0.0.1:*' --endpoint-file "$rundir/endpoint-$k"
    wait_file "$rundir/endpoint-$k"
  done
  local extra=()
  read -r -a extra <<<"${ZPS_WORKER_FLAGS:-}"
  for i in $(seq 0 $((workers - 1))); do
    spawn "worker-$i" "$bin/zps-worker" --coordinator "$ep" "${extra[@]}"
  done
  echo "local-cluster: $shards shard(s) and $workers worker(s) started; coordinator $ep"
  echo "local-cluster: logs in $rundir/logs; 'deploy/local-cluster.sh status -d $rundir'"
}

status() {
  local any=0 f name pid
  for f in "$rundir"/pids/*.pid; do
    [ -e "$f" ] || continue
    any=1 name=$(basename "$f" .pid) pid=$(cat "$f")
    if alive "$pid"; then echo "$name pid $pid running"; else echo "$name pid $pid exited"; fi
  done
  [ "$any" = 1 ] || { echo "local-cluster: nothing started in $rundir"; return 1; }
  if [ -s "$rundir/endpoint" ] && alive "$(cat "$rundir/pids/server-0.pid")"; then
    "$bin/zps-ctl" status "$(cat "$rundir/endpoint")" || true
  fi
}

stop() {
  local f pid left=()
  for f in "$rundir"/pids/*.pid; do
    [ -e "$f" ] || continue
    pid=$(cat "$f")
    if alive "$pid"; then kill -TERM "$pid" 2>/dev/null || true; left+=("$pid"); fi
  done
  for _ in $(seq 100); do
    local still=()
    for pid in "${left[@]}"; do alive "$pid" && still+=("$pid"); done
    left=("${still[@]}")
    [ ${#left[@]} -eq 0 ] && break
    sleep 0.1
  done
  for pid in "${left[@]}"; do
    echo "local-cluster: pid $pid ignored SIGTERM for 10 s; killing it" >&2
    kill -KILL "$pid" 2>/dev/null || true
  done
  rm -f "$rundir"/pids/*.pid
  echo "local-cluster: stopped"
}

case "$cmd" in
  start) start "$@" ;;
  status) status ;;
  stop) stop ;;
  *) usage ;;
esac
