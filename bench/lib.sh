#!/usr/bin/env bash
# bench/lib.sh - zps-worker through libzps against the worker of before it,
# side by side in one run: the default job (MLP 784-512-512-10,
# Fashion-MNIST, global batch 128, 1 shard) with 1 and 2 workers, each
# configuration REPEATS times, old and new interleaved, median ms/step of
# the coordinator's steps after the first 50 (as bench/train.sh measures).
#
#   bench/lib.sh OLD_WORKER [STEPS] [REPEATS]    (default 600 steps, 5 repeats)
#   WORKERS="2" bench/lib.sh ...                 (the worker counts, default "1 2")
#
# OLD_WORKER: a zps-worker built from before libzps, e.g.
#   git archive 7152074 | tar -x -C /tmp/old && make -C /tmp/old CUDA=0 bin/zps-worker
set -euo pipefail
cd "$(dirname "$0")/.."
old=${1:?usage: bench/lib.sh OLD_WORKER [STEPS] [REPEATS]}
steps=${2:-600}
repeats=${3:-5}
read -r -a counts <<<"${WORKERS:-1 2}"
run=$(mktemp -d "${TMPDIR:-/tmp}/zps-bench-lib-XXXXXX")
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$run"; }
trap cleanup EXIT

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
wait_file() { for _ in $(seq 100); do [ -s "$1" ] && return 0; sleep 0.1; done; return 1; }

# One run of worker binary $2 with $3 workers: prints the median ms/step.
one_run() {
  local tag=$1 worker=$2 w=$3
  rm -f "$run/ep0"
  timeout 600 bin/zps-server --listen 'tcp://127.0.0.1:*' --endpoint-file "$run/ep0" \
    --workers "$w" --steps "$steps" --metrics-log "$run/$tag.jsonl" 2>"$run/$tag-s0.log" &
  pids=($!)
  wait_file "$run/ep0"
  for i in $(seq 1 "$w"); do
    timeout 600 "$worker" --coordinator "$(cat "$run/ep0")" 2>"$run/$tag-w$i.log" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  pids=()
  grep '"step_ms"' "$run/$tag.jsonl" | tail -n +51 | sed 's/.*"step_ms":\([0-9.]*\).*/\1/' | median
}

echo "zps bench/lib.sh: default job, $steps steps, median of $repeats interleaved runs, on $(nproc) cores"
echo "old: $old; new: bin/zps-worker (libzps)"
for r in $(seq "$repeats"); do
  for w in "${counts[@]}"; do
    one_run "old-$w-$r" "$old" "$w" >>"$run/old-$w"
    one_run "new-$w-$r" bin/zps-worker "$w" >>"$run/new-$w"
  done
done
printf '%-10s %12s %12s %8s   %s\n' workers "old ms/step" "new ms/step" "new/old" "runs (old | new)"
for w in "${counts[@]}"; do
  o=$(median <"$run/old-$w")
  n=$(median <"$run/new-$w")
  printf '%-10s %12.3f %12.3f %8.3f   %s | %s\n' "$w" "$o" "$n" "$(awk -v o="$o" -v n="$n" 'BEGIN {print n / o}')" \
    "$(tr '\n' ' ' <"$run/old-$w")" "$(tr '\n' ' ' <"$run/new-$w")"
done
