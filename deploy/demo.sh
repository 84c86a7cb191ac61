#!/usr/bin/env bash
# make demo: one server and two CPU workers on loopback train the default
# job (MLP 784-512-512-10 on Fashion-MNIST, 10 epochs), print progress and
# the final test accuracy, and stop every process they started.
set -euo pipefail
cd "$(dirname "$0")/.."

workers=${ZPS_DEMO_WORKERS:-2}
run=$(mktemp -d "${TMPDIR:-/tmp}/zps-demo-XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "zps demo: 1 server + $workers workers on loopback; logs in $run"
timeout 1800 bin/zps-server --listen 'tcp://127.0.0.1:*' --endpoint-file "$run/endpoint" \
  --workers "$workers" --metrics-log "$run/metrics.jsonl" "$@" &
server=$!
pids+=("$server")

for _ in $(seq 100); do [ -s "$run/endpoint" ] && break; sleep 0.1; done
[ -s "$run/endpoint" ] || { echo "zps demo: the server did not start" >&2; exit 1; }
endpoint=$(cat "$run/endpoint")

for i in $(seq 0 $((workers - 1))); do
  timeout 1800 bin/zps-worker --coordinator "$endpoint" --save-params "$run/params-$i.bin" \
    2>"$run/worker-$i.log" &
  pids+=($!)
done

status=0
for p in "${pids[@]}"; do wait "$p" || status=$?; done
pids=()
if [ "$status" -ne 0 ]; then
  echo "zps demo: a process failed (exit $status); see $run" >&2
  tail -n 5 "$run"/worker-*.log >&2
  exit 1
fi
acc=$(grep '"test_accuracy"' "$run/metrics.jsonl" | tail -n 1 | sed 's/.*"test_accuracy":\([0-9.]*\).*/\1/')
cmp -s "$run/params-0.bin" "$run/params-1.bin" && same="bitwise identical" || same="DIFFERENT"
echo "zps demo: final test accuracy $acc (workers' parameters: $same)"
