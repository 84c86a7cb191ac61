#!/usr/bin/env bash
# bench/deterministic.sh - what --deterministic costs (issue 29): the
# default job (MLP 784-512-512-10, Fashion-MNIST, global batch 128, 1
# shard) in the default mode and with --deterministic --micro-batch M, side
# by side in one run, interleaved: ms/step (the coordinator's median after
# the first 50 steps, as bench/train.sh measures) and the gradient bytes
# pushed a step (the workers' "done" lines, --shm off so that every byte
# goes on a socket). Splits: 1 worker, 2 even workers (one canonical node
# each: the default mode's bytes), 3 workers (shares of 6, 5 and 5
# micro-batches at M = 8: 7 nodes), and the worst split for 3 workers
# (M / B - 2M / M: at M = 8 the middle piece of 14 micro-batches is 6
# nodes, 8 in all).
#
#   bench/deterministic.sh [STEPS] [REPEATS] [M]   (default 600 steps, 3 repeats, M 8)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-600}
repeats=${2:-3}
m=${3:-8}
run=$(mktemp -d "${TMPDIR:-/tmp}/zps-bench-det-XXXXXX")
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$run"; }
trap cleanup EXIT

# name | workers | shares (empty: the coordinator's split)
splits=(
  "1 worker|1|"
  "2 even workers|2|"
  "3 workers|3|"
  "3 workers, M/B-2M/M|3|$m $((128 - 2 * m)) $m"
)

# shellcheck source=bench/runs.sh
source bench/runs.sh # median, wait_file, ratio

# One run: prints "ms_per_step bytes_per_step". $2: server flags of the
# mode; $3: the workers' shares, in rank order (started one after the other).
one_run() {
  local tag=$1 mode=$2 w=$3 shares=$4
  local sflags=()
  read -r -a sflags <<<"$mode"
  rm -f "$run/ep0"
  timeout 600 bin/zps-server --listen 'tcp://127.0.0.1:*' --endpoint-file "$run/ep0" \
    --workers "$w" --steps "$steps" --metrics-log "$run/$tag.jsonl" "${sflags[@]}" \
    2>"$run/$tag-s0.log" &
  pids=($!)
  wait_file "$run/ep0"
  local share=()
  read -r -a share <<<"$shares"
  for i in $(seq 0 $((w - 1))); do
    local wflags=(--shm off)
    if [ ${#share[@]} -gt 0 ]; then
      wflags+=(--share "${share[$i]}")
      sleep 0.3 # joins in rank order: the shares lie in the batch as listed
    fi
    timeout 600 bin/zps-worker --coordinator "$(cat "$run/ep0")" "${wflags[@]}" \
      2>"$run/$tag-w$i.log" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  pids=()
  local ms; ms=$(grep '"step_ms"' "$run/$tag.jsonl" | tail -n +51 |
    sed 's/.*"step_ms":\([0-9.]*\).*/\1/' | median)
  local mib; mib=$(cat "$run/$tag"-w*.log |
    sed -n 's/.*; \([0-9.]*\) MiB of gradients pushed on sockets.*/\1/p' | awk '{s+=$1} END {print s}')
  echo "$ms $(awk -v b="$mib" -v n="$steps" 'BEGIN {printf "%.0f", b * 1048576 / n}')"
}

split_fields() { # name, workers, shares of split $1, a line each
  local name w shares
  IFS='|' read -r name w shares <<<"${splits[$1]}"
  printf '%s\n%s\n%s\n' "$name" "$w" "$shares"
}

echo "zps bench/deterministic.sh: default job (global batch 128), M = $m, $steps steps, median of" \
  "$repeats interleaved runs, on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
for r in $(seq "$repeats"); do
  for c in "${!splits[@]}"; do
    mapfile -t f < <(split_fields "$c")
    one_run "d$c-r$r" "" "${f[1]}" "${f[2]}" >>"$run/default-$c"
    one_run "x$c-r$r" "--deterministic --micro-batch $m" "${f[1]}" "${f[2]}" >>"$run/det-$c"
  done
done
printf '%-22s %14s %14s %7s %16s %16s %7s\n' split "default ms/st" "determ. ms/st" ratio \
  "default B/step" "determ. B/step" ratio
for c in "${!splits[@]}"; do
  mapfile -t f < <(split_fields "$c")
  dm=$(cut -d' ' -f1 "$run/default-$c" | median)
  xm=$(cut -d' ' -f1 "$run/det-$c" | median)
  db=$(cut -d' ' -f2 "$run/default-$c" | median)
  xb=$(cut -d' ' -f2 "$run/det-$c" | median)
  printf '%-22s %14.3f %14.3f %7.3f %16.0f %16.0f %7.3f\n' "${f[0]}" "$dm" "$xm" \
    "$(ratio "$xm" "$dm")" "$db" "$xb" "$(ratio "$xb" "$db")"
done
