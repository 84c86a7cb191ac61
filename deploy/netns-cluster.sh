#!/usr/bin/env bash
# deploy/netns-cluster.sh - an emulated cluster on one machine: hosts are
# network namespaces, each with its own address, joined by veth pairs to a
# bridge in a hub namespace, links optionally limited by tc tbf. Two
# layouts: every shard and worker on a host of its own (the default), or
# -H hosts with -g workers each, the shards on hosts of their own or, with
# -c, on the worker hosts. Needs root (ip netns, tc).
#
#   deploy/netns-cluster.sh [options] -- SERVER-FLAGS...
#     -s SHARDS      shards (default 1)
#     -w WORKERS     worker hosts, one worker each (default 2; not with -H)
#     -H HOSTS       co-located layout: worker hosts h0..h(HOSTS-1), -g workers each
#     -g G           workers per host with -H (default 1)
#     -c             with -H: shard I on host hI (needs SHARDS <= HOSTS), no
#                    shard hosts of their own
#     -r RATE        limit every host's link to RATE, both ways (e.g. 1gbit)
#     -l HOST=RATE   limit one host's link (e.g. w1=200mbit, h2=1gbit); repeatable
#     -o DIR         logs (one a process), metrics.jsonl and each worker's params
#                    (wK.bin; hIwJ.bin with -H) (default run/netns)
#     -t SECONDS     bound on the whole run (default 300)
#     -W FLAGS       extra flags for every worker (one string)
#     -f K=FLAGS     extra flags for worker K alone (0-based; with -H worker J of
#                    host I is I*G+J), e.g. -f 0=--slowdown 2; repeatable
#     -S FLAGS       extra flags for every shard (one string; SERVER-FLAGS go to
#                    shard 0 only, which passes the job on)
#     -x CMD         instead of zps, run CMD on every host (benchmarks); it sees
#                    ZPS_NETNS_RANK, ZPS_NETNS_SIZE, ZPS_NETNS_MASTER (host 0's
#                    address) and ZPS_NETNS_LOCAL_RANK (0). With -H: G copies on
#                    each of h0..h(HOSTS-1) (no shard hosts), copy J on host I of
#                    rank I*G+J, ZPS_NETNS_SIZE HOSTS*G, ZPS_NETNS_LOCAL_RANK J,
#                    ZPS_NETNS_LOCAL_SIZE G, the master h0
#     -u FILE        sample every host's link (bytes each way, every 2 ms) into
#                    FILE while the run lasts; bench/link_use.py show FILE RATE
#                    prints how busy each was
#
# Hosts are s0..s(S-1) at 10.77.0.10+I, w0..w(W-1) at 10.77.0.100+K and
# h0..h(H-1) at 10.77.1.10+I (a /16). Every process gets ZPS_BOOT_ID, one
# per emulated host (this run's tag and the host's name): the namespaces
# share the kernel's boot id, and processes of different hosts must not
# take each other for one host's. Logs: $out/HOST.log, with -H
# $out/hIwJ.log (worker or -x copy J of host I) and $out/hIsI.log (-c) or
# $out/sI.log (shard I). Nothing outside the namespaces this script makes
# is touched, and the namespaces and every process started are removed on
# exit, whatever happens (processes by pid). Exit status 0 if every
# process exited 0.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${ZPS_BIN_DIR:-$here/bin}

usage() { sed -n '2,45p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
die() { echo "netns-cluster: $*" >&2; exit 2; }

shards=1 workers=2 rate='' out=run/netns bound=300 wflags='' sflags='' exec_cmd='' uses=''
declare -A kflags=()
nhosts='' per_host=1 colocate=0 wset=0
limits=()
while [ $# -gt 0 ]; do
  case "$1" in
    -s) shards=$2; shift 2 ;;
    -w) workers=$2; wset=1; shift 2 ;;
    -H) nhosts=$2; shift 2 ;;
    -g) per_host=$2; shift 2 ;;
    -c) colocate=1; shift ;;
    -r) rate=$2; shift 2 ;;
    -l) limits+=("$2"); shift 2 ;;
    -o) out=$2; shift 2 ;;
    -t) bound=$2; shift 2 ;;
    -W) wflags=$2; shift 2 ;;
    -f) kflags[${2%%=*}]=${2#*=}; shift 2 ;;
    -S) sflags=$2; shift 2 ;;
    -x) exec_cmd=$2; shift 2 ;;
    -u) uses=$2; shift 2 ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
if [ -n "$nhosts" ]; then
  [ "$wset" -eq 0 ] || die "-w is for the default layout; with -H the workers are -H x -g"
  if [ "$nhosts" -lt 1 ] || [ "$nhosts" -gt 240 ]; then die "-H: 1..240 hosts"; fi
  [ "$per_host" -ge 1 ] || die "-g: at least 1 worker per host"
  [ "$colocate" -eq 0 ] || [ "$shards" -le "$nhosts" ] || die "-c: $shards shards on $nhosts hosts"
  workers=$((nhosts * per_host))
else
  if [ "$per_host" -ne 1 ] || [ "$colocate" -ne 0 ]; then die "-g and -c need -H"; fi
fi
[ "$(id -u)" -eq 0 ] || { echo "netns-cluster: needs root (ip netns, tc)" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)

# Unique names, so that runs side by side do not meet.
tag="zps$$"
hub="$tag-hub"
hosts=()
if [ -z "$nhosts" ] || { [ "$colocate" -eq 0 ] && [ -z "$exec_cmd" ]; }; then
  for i in $(seq 0 $((shards - 1))); do hosts+=("s$i"); done
fi
if [ -n "$nhosts" ]; then
  for i in $(seq 0 $((nhosts - 1))); do hosts+=("h$i"); done
else
  for k in $(seq 0 $((workers - 1))); do hosts+=("w$k"); done
fi
pids=()
sampler=''

cleanup() {
  local p
  if [ -n "$sampler" ]; then kill -TERM "$sampler" 2>/dev/null || true; wait "$sampler" || true; fi
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
    h*) echo "10.77.1.$((10 + ${1#h}))" ;;
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
    ip -n "$tag-$h" addr add "$(addr "$h")/16" dev eth0
    ip -n "$tag-$h" link set eth0 up
    ip -n "$tag-$h" link set lo up
    if [ -n "$rate" ]; then shape "$h" "$rate"; fi
  done
  local l
  for l in "${limits[@]}"; do shape "${l%%=*}" "${l#*=}"; done
}

# Runs a command on a host in the background, with the host's ZPS_BOOT_ID;
# logs to $out/NAME.log, whose first line says the boot id the process saw.
# Args: host, log name, command...
on() {
  local h=$1 name=$2; shift 2
  # shellcheck disable=SC2016 # expanded by the host's sh
  ip netns exec "$tag-$h" env ZPS_BOOT_ID="$tag-$h" \
    sh -c 'echo "netns-cluster: host $0, ZPS_BOOT_ID=$ZPS_BOOT_ID"; exec "$@"' "$h" "$@" \
    </dev/null >"$out/$name.log" 2>&1 &
  pids+=($!)
}

# Shard I's host: hI with -c, else sI.
shard_host() { if [ "$colocate" -eq 1 ]; then echo "h$1"; else echo "s$1"; fi; }
# Shard I's log: hIsI with -c, else sI.
shard_log() { if [ "$colocate" -eq 1 ]; then echo "h$1s$1"; else echo "s$1"; fi; }

run_zps() {
  local coord h0
  h0=$(shard_host 0)
  coord="tcp://$(addr "$h0"):5555"
  # shellcheck disable=SC2086 # sflags is a list of flags
  on "$h0" "$(shard_log 0)" "$bin/zps-server" --shard 0 --shards "$shards" --workers "$workers" \
    --listen "$coord" --metrics-log "$out/metrics.jsonl" $sflags "$@"
  local i j h
  for i in $(seq 1 $((shards - 1))); do
    h=$(shard_host "$i")
    # shellcheck disable=SC2086
    on "$h" "$(shard_log "$i")" "$bin/zps-server" --shard "$i" --shards "$shards" \
      --coordinator "$coord" --listen "tcp://$(addr "$h"):5555" $sflags
  done
  if [ -n "$nhosts" ]; then
    for i in $(seq 0 $((nhosts - 1))); do
      for j in $(seq 0 $((per_host - 1))); do
        # shellcheck disable=SC2086 # wflags and kflags are lists of flags
        on "h$i" "h${i}w$j" "$bin/zps-worker" --coordinator "$coord" \
          --save-params "$out/h${i}w$j.bin" $wflags ${kflags[$((i * per_host + j))]:-}
      done
    done
  else
    for k in $(seq 0 $((workers - 1))); do
      # shellcheck disable=SC2086 # wflags and kflags are lists of flags
      on "w$k" "w$k" "$bin/zps-worker" --coordinator "$coord" --save-params "$out/w$k.bin" \
        $wflags ${kflags[$k]:-}
    done
  fi
}

run_exec() {
  local n=0 h j
  if [ -n "$nhosts" ]; then
    for h in "${hosts[@]}"; do
      for j in $(seq 0 $((per_host - 1))); do
        on "$h" "${h}w$j" env ZPS_NETNS_RANK=$n ZPS_NETNS_SIZE="$workers" \
          ZPS_NETNS_MASTER="$(addr h0)" ZPS_NETNS_LOCAL_RANK="$j" \
          ZPS_NETNS_LOCAL_SIZE="$per_host" sh -c "$exec_cmd"
        n=$((n + 1))
      done
    done
    return
  fi
  for h in "${hosts[@]}"; do
    on "$h" "$h" env ZPS_NETNS_RANK=$n ZPS_NETNS_SIZE=${#hosts[@]} \
      ZPS_NETNS_MASTER="$(addr "${hosts[0]}")" ZPS_NETNS_LOCAL_RANK=0 ZPS_NETNS_LOCAL_SIZE=1 \
      sh -c "$exec_cmd"
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
if [ -n "$uses" ]; then
  ip netns exec "$hub" /usr/bin/python3 "$here/bench/link_use.py" sample "$uses" "${hosts[@]}" &
  sampler=$!
fi
if [ -n "$exec_cmd" ]; then run_exec; else run_zps "$@"; fi
if wait_all; then
  echo "netns-cluster: ${#hosts[@]} hosts done; logs in $out"
else
  echo "netns-cluster: a process failed; logs in $out" >&2
  exit 1
fi
