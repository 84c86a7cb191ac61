#!/usr/bin/env bash
# deploy/netns-cluster.sh - an emulated cluster on one machine: every shard
# and worker on a host of its own (a network namespace with its own
# address), the hosts joined by veth pairs to a bridge in a hub namespace,
# links optionally limited by tc tbf. Needs root (ip netns, tc).
#
#   deploy/netns-cluster.sh [options] -- SERVER-FLAGS...
#     -s SHARDS      shard hosts (default 1)
#     -w WORKERS     worker hosts (default 2)
#     -r RATE        limit every host's link to RATE, both ways (e.g. 1gbit)
#     -l HOST=RATE   limit one host's link (e.g. w1=200mbit); repeatable
#     -o DIR         logs, metrics.jsonl and each worker's params wK.bin (default run/netns)
#     -t SECONDS     bound on the whole run (default 300)
#     -W FLAGS       extra flags for every worker (one string)
#     -S FLAGS       extra flags for every shard (one string; SERVER-FLAGS go to
#                    shard 0 only, which passes the job on)
#     -x CMD         instead of zps, run CMD on every host (benchmarks); it sees
#                    ZPS_NETNS_RANK, ZPS_NETNS_SIZE, ZPS_NETNS_MASTER (host 0's address)
#
# Hosts are s0..s(S-1) at 10.77.0.10+I and w0..w(W-1) at 10.77.0.100+K;
# nothing outside the namespaces this script makes is touched, and the
# namespaces and every process started are removed on exit, whatever
# happens (processes by pid). Exit status 0 if every process exited 0.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${ZPS_BIN_DIR:-$here/bin}

usage() { sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

shards=1 workers=2 rate='' out=run/netns bound=300 wflags='' sflags='' exec_cmd=''
limits=()
while [ $# -gt 0 ]; do
  case "$1" in
    -s) shards=$2; shift 2 ;;
    -w) workers=$2; shift 2 ;;
    -r) rate=$2; shift 2 ;;
    -l) limits+=("$2"); shift 2 ;;
    -o) out=$2; shift 2 ;;
    -t) bound=$2; shift 2 ;;
    -W) wflags=$2; shift 2 ;;
    -S) sflags=$2; shift 2 ;;
    -x) exec_cmd=$2; shift 2 ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "netns-cluster: needs root (ip netns, tc)" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)

# Unique names, so that runs side by side do not meet.
tag="zps$$"
hub="$tag-hub"
hosts=()
for i in $(seq 0 $((shards - 1))); do hosts+=("s$i"); done
for k in $(seq 0 $((workers - 1))); do hosts+=("w$k"); done
pids=()

cleanup() {
  local p
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  for h in "${hosts[@]}"; do ip netns del "$tag-$h" 2>/dev/null || true; done
  ip netns del "$hub" 2>/dev/null || true
}
trap cleanup EXIT

addr() { # host -> its address
  case "$1" in
    s*) echo "10.77.0.$((10 + ${1#s}))" ;;
    w*) echo "10.77.0.$((100 + ${1#w}))" ;;
  esac
}

# tbf on both ends of a host's link: its egress in its namespace, its
# ingress as the hub port's egress (tbf shapes only what leaves a device).
shape() {
  local h=$1 r=$2
  local args=(root tbf rate "$r" burst 256kb latency 400ms)
  ip -n "$tag-$h" link set eth0 txqueuelen 1000
  tc -n "$tag-$h" qdisc add dev eth0 "${args[@]}"
  tc -n "$hub" qdisc add dev "$h" "${args[@]}"
  echo "netns-cluster: $h's link limited to $r each way"
}

setup() {
  ip netns add "$hub"
  ip -n "$hub" link add br0 type bridge
  ip -n "$hub" link set br0 up
  ip -n "$hub" link set lo up
  for h in "${hosts[@]}"; do
    ip netns add "$tag-$h"
    ip -n "$hub" link add "$h" type veth peer name eth0 netns "$tag-$h"
    ip -n "$hub" link set "$h" master br0 up
    ip -n "$tag-$h" addr add "$(addr "$h")/24" dev eth0
    ip -n "$tag-$h" link set eth0 up
    ip -n "$tag-$h" link set lo up
    if [ -n "$rate" ]; then shape "$h" "$rate"; fi
  done
  local l
  for l in "${limits[@]}"; do shape "${l%%=*}" "${l#*=}"; done
}

# Runs a command on a host in the background; logs to $out/HOST.log.
on() {
  local h=$1; shift
  ip netns exec "$tag-$h" "$@" </dev/null >"$out/$h.log" 2>&1 &
  pids+=($!)
}

run_zps() {
  local coord
  coord="tcp://$(addr s0):5555"
  # shellcheck disable=SC2086 # sflags is a list of flags
  on s0 "$bin/zps-server" --shard 0 --shards "$shards" --workers "$workers" \
    --listen "$coord" --metrics-log "$out/metrics.jsonl" $sflags "$@"
  for i in $(seq 1 $((shards - 1))); do
    # shellcheck disable=SC2086
    on "s$i" "$bin/zps-server" --shard "$i" --shards "$shards" --coordinator "$coord" \
      --listen "tcp://$(addr "s$i"):5555" $sflags
  done
  for k in $(seq 0 $((workers - 1))); do
    # shellcheck disable=SC2086 # wflags is a list of flags
    on "w$k" "$bin/zps-worker" --coordinator "$coord" --save-params "$out/w$k.bin" $wflags
  done
}

run_exec() {
  local n=0
  for h in "${hosts[@]}"; do
    on "$h" env ZPS_NETNS_RANK=$n ZPS_NETNS_SIZE=${#hosts[@]} \
      ZPS_NETNS_MASTER="$(addr "${hosts[0]}")" sh -c "$exec_cmd"
    n=$((n + 1))
  done
}

# Waits for every process, within the bound; any failure fails the run.
wait_all() {
  local deadline=$((SECONDS + bound)) rc=0 p
  for p in "${pids[@]}"; do
    while kill -0 "$p" 2>/dev/null; do
      if [ $SECONDS -ge $deadline ]; then
        echo "netns-cluster: still running after ${bound} s; see $out/*.log" >&2
        return 1
      fi
      sleep 0.2
    done
    wait "$p" || rc=1
  done
  return $rc
}

setup
if [ -n "$exec_cmd" ]; then run_exec; else run_zps "$@"; fi
if wait_all; then
  echo "netns-cluster: ${#hosts[@]} hosts done; logs in $out"
else
  echo "netns-cluster: a process failed; logs in $out" >&2
  exit 1
fi
