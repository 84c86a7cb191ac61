#!/usr/bin/env bash
# bench/train.sh - ms/step and samples/s of the default job (MLP
# 784-512-512-10, Fashion-MNIST, global batch 128) on loopback, for a few
# layouts: 1 and 2 workers, 1 and 2 shards, fp32 and bf16 on the wire, with
# and without overlapping pushes with backward. Also the share of a step a
# worker spends pushing and waiting for parameters. Each configuration runs
# REPEATS times, interleaved, and the medians are reported.
#
#   bench/train.sh [STEPS] [REPEATS]      (default 1000 steps, 3 repeats)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-1000}
repeats=${2:-3}
run=$(mktemp -d "${TMPDIR:-/tmp}/zps-bench-XXXXXX")
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$run"; }
trap cleanup EXIT

# name | workers | shards | wire dtype | worker flags
configs=(
  "1 worker|1|1|fp32|"
  "2 workers|2|1|fp32|"
  "2 workers, no overlap|2|1|fp32|--no-overlap"
  "2 workers, bf16|2|1|bf16|"
  "2 workers, 2 shards|2|2|fp32|"
  "2 workers, 2 shards, bf16|2|2|bf16|"
)

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

wait_file() { for _ in $(seq 100); do [ -s "$1" ] && return 0; sleep 0.1; done; return 1; }

# One run: prints "ms_per_step wait_percent" (coordinator's step time, workers' mean wait share).
one_run() {
  local tag=$1 w=$2 s=$3 dtype=$4 wflags=$5
  rm -f "$run"/ep*
  timeout 600 bin/zps-server --shards "$s" --listen 'tcp://127.0.0.1:*' --endpoint-file "$run/ep0" \
    --workers "$w" --steps "$steps" --wire-dtype "$dtype" --metrics-log "$run/$tag.jsonl" \
    2>"$run/$tag-s0.log" &
  pids=($!)
  wait_file "$run/ep0"
  local ep; ep=$(cat "$run/ep0")
  for k in $(seq 1 $((s - 1))); do
    timeout 600 bin/zps-server --shard "$k" --shards "$s" --coordinator "$ep" \
      --listen 'tcp://127.0.0.1:*' --endpoint-file "$run/ep$k" 2>"$run/$tag-s$k.log" &
    pids+=($!)
    wait_file "$run/ep$k"
  done
  local flags=()
  read -r -a flags <<<"$wflags"
  for i in $(seq 0 $((w - 1))); do
    timeout 600 bin/zps-worker --coordinator "$ep" "${flags[@]}" 2>"$run/$tag-w$i.log" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  pids=()
  # Skip the first 50 steps (page faults, cache warm-up); median of the rest.
  local ms; ms=$(grep '"step_ms"' "$run/$tag.jsonl" | tail -n +51 |
    sed 's/.*"step_ms":\([0-9.]*\).*/\1/' | median)
  local wait; wait=$(cat "$run/$tag"-w*.log | sed -n 's/.*(\([0-9.]*\)% of the step).*/\1/p' |
    awk '{s+=$1} END {printf "%.1f", s/NR}')
  echo "$ms $wait"
}

echo "zps bench: default job, $steps steps, median of $repeats interleaved runs, on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
for r in $(seq "$repeats"); do
  for c in "${!configs[@]}"; do
    IFS='|' read -r _ w s dtype wflags <<<"${configs[$c]}"
    one_run "c$c-r$r" "$w" "$s" "$dtype" "$wflags" >>"$run/result-$c"
  done
done
printf '%-28s %10s %10s %16s %10s\n' layout ms/step samples/s "push+wait share" "vs 1 worker"
base=
for c in "${!configs[@]}"; do
  IFS='|' read -r name _ <<<"${configs[$c]}"
  ms=$(cut -d' ' -f1 "$run/result-$c" | median)
  wait=$(cut -d' ' -f2 "$run/result-$c" | median)
  base=${base:-$ms}
  printf '%-28s %10.3f %10.0f %15.1f%% %9.2fx\n' "$name" "$ms" \
    "$(awk -v m="$ms" 'BEGIN {print 128000 / m}')" "$wait" \
    "$(awk -v a="$base" -v b="$ms" 'BEGIN {print a / b}')"
done
