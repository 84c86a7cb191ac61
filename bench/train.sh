#!/usr/bin/env bash
# bench/train.sh - ms/step and samples/s of the default job (MLP
# 784-512-512-10, Fashion-MNIST, global batch 128) with 1 and 2 workers on
# loopback, and the share of a step each worker spends pushing and waiting
# for parameters. Each configuration runs REPEATS times; medians reported.
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

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

# One run: prints "ms_per_step wait_percent" (server's step time, workers' mean wait share).
one_run() {
  local w=$1 tag=$2
  rm -f "$run/endpoint"
  timeout 600 bin/zps-server --listen 'tcp://127.0.0.1:*' --endpoint-file "$run/endpoint" \
    --workers "$w" --steps "$steps" --metrics-log "$run/$tag.jsonl" 2>"$run/$tag-server.log" &
  local server=$!
  pids=("$server")
  for _ in $(seq 100); do [ -s "$run/endpoint" ] && break; sleep 0.1; done
  local ep; ep=$(cat "$run/endpoint")
  for i in $(seq 0 $((w - 1))); do
    timeout 600 bin/zps-worker --coordinator "$ep" 2>"$run/$tag-w$i.log" &
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

echo "zps bench: default job, $steps steps, median of $repeats runs, on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
printf '%-8s %12s %12s %22s\n' workers ms/step samples/s "push+wait share"
declare -A result
for w in 1 2; do
  : >"$run/ms" ; : >"$run/wait"
  for r in $(seq "$repeats"); do
    read -r ms wait < <(one_run "$w" "w$w-r$r")
    echo "$ms" >>"$run/ms"; echo "$wait" >>"$run/wait"
  done
  ms=$(median <"$run/ms"); wait=$(median <"$run/wait")
  result[$w]=$ms
  printf '%-8s %12.3f %12.0f %21.1f%%\n' "$w" "$ms" "$(awk -v m="$ms" 'BEGIN {print 128000 / m}')" "$wait"
done
printf 'speed-up of 2 workers over 1: %.2fx\n' "$(awk -v a="${result[1]}" -v b="${result[2]}" 'BEGIN {print a / b}')"
