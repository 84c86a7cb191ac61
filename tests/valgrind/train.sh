#!/usr/bin/env bash
# make valgrind: one short, real training run (1 server + 2 CPU workers on
# loopback, Fashion-MNIST) with every process under valgrind memcheck. Fails
# on any invalid access, use of uninitialised memory or definite leak in any
# of them; a leak that is only "possibly lost" (ZeroMQ's and OpenBLAS's
# threads still hold their buffers when exit() runs) does not count.
#
# Usage: tests/valgrind/train.sh [STEPS] [GLOBAL_BATCH] [MODEL]
# The default model is a small MLP: memcheck runs OpenBLAS's vector kernels
# about 100 times slower than the CPU, and the default 784-512-512-10 would
# take minutes a step; every code path is the same for any width.
# Binaries come from $ZPS_BIN_DIR (default bin/); logs stay in a temporary
# directory, removed when the run passes unless ZPS_VALGRIND_KEEP is set.
# ZPS_VALGRIND_INNER_STEPS=H runs the job in --mode diloco with rounds of H
# inner steps (STEPS a multiple of H), pushed as ZPS_VALGRIND_COMPRESS
# (none, int8 or e3m0; default int8).
set -euo pipefail
cd "$(dirname "$0")/../.."

steps=${1:-30}
batch=${2:-64}
model=${3:-mlp:784-64-10}
bin=${ZPS_BIN_DIR:-bin}
supp=tests/valgrind/zps.supp
limit=900 # seconds any one process may take: a hang fails the run, bounded
run=$(mktemp -d "${TMPDIR:-/tmp}/zps-valgrind-XXXXXX")
inner=${ZPS_VALGRIND_INNER_STEPS:-0}
mode=()
rounds=$steps
if [ "$inner" -gt 0 ]; then
  mode=(--mode diloco --inner-steps "$inner" --compress "${ZPS_VALGRIND_COMPRESS:-int8}")
  rounds=$((steps / inner))
fi

command -v valgrind >/dev/null || {
  echo "valgrind: not installed (HINT: deploy/install-deps.sh --ci)" >&2
  exit 1
}

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --errors-for-leak-kinds=definite: only a block nothing points to is a
# bug of ours; --error-exitcode turns every reported error into exit 1.
vg=(valgrind --quiet --leak-check=full --errors-for-leak-kinds=definite
    --show-leak-kinds=definite --error-exitcode=1 --num-callers=30
    --suppressions="$supp")

start=$(date +%s)
echo "valgrind: 1 server + 2 workers, $model, $steps steps of $batch ${mode[*]}; logs in $run"
timeout "$limit" "${vg[@]}" --log-file="$run/server.vg" \
  "$bin/zps-server" --listen 'tcp://127.0.0.1:*' --endpoint-file "$run/endpoint" \
  --workers 2 --steps "$steps" --global-batch "$batch" --model "$model" --metrics-log "$run/metrics.jsonl" \
  "${mode[@]}" \
  >"$run/server.log" 2>&1 &
server=$!
pids+=("$server")

# The server starts slowly under valgrind; its endpoint file says it listens.
for _ in $(seq 600); do
  [ -s "$run/endpoint" ] && break
  kill -0 "$server" 2>/dev/null || break
  sleep 0.1
done
[ -s "$run/endpoint" ] || { echo "valgrind: the server did not start; see $run" >&2; exit 1; }
endpoint=$(cat "$run/endpoint")

# A fresh cache: the workers decompress Fashion-MNIST under memcheck too.
# --shm off: the shard's side of shared memory takes a pidfd of the worker
# (pidfd_open, syscall 434), which Debian 12's valgrind 3.19 does not know
# and warns of; memcheck runs the frames path, make test and SAN=1 the
# shared-memory one.
workers=()
for i in 0 1; do
  timeout "$limit" "${vg[@]}" --log-file="$run/worker-$i.vg" \
    "$bin/zps-worker" --coordinator "$endpoint" --cache-dir "$run/cache" --shm off \
    --save-params "$run/params-$i.bin" >"$run/worker-$i.log" 2>&1 &
  workers+=($!)
  pids+=($!)
done

status=0
for name in worker-0 worker-1 server; do
  case $name in
    worker-0) p=${workers[0]} ;;
    worker-1) p=${workers[1]} ;;
    server) p=$server ;;
  esac
  rc=0
  wait "$p" || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "valgrind: $name exited with $rc" >&2
    status=1
  fi
done
pids=()

# Memcheck's verdict per process; a log is empty with --quiet when clean.
for name in server worker-0 worker-1; do
  if [ -s "$run/$name.vg" ]; then
    echo "---- $name: valgrind reported (from $run/$name.vg)" >&2
    head -n 80 "$run/$name.vg" >&2
    status=1
  fi
done
records=$(grep -c '"step"' "$run/metrics.jsonl" 2>/dev/null || true)
if [ "${records:-0}" -ne "$rounds" ]; then
  echo "valgrind: the metrics log has ${records:-0} step records, expected $rounds" >&2
  status=1
fi
if ! cmp -s "$run/params-0.bin" "$run/params-1.bin"; then
  echo "valgrind: the two workers ended with different parameters" >&2
  status=1
fi

if [ "$status" -ne 0 ]; then
  echo "valgrind: FAILED after $(( $(date +%s) - start )) s; logs kept in $run" >&2
  exit 1
fi
[ -n "${ZPS_VALGRIND_KEEP:-}" ] || rm -rf "$run"
echo "valgrind: clean (3 processes, $steps steps) in $(( $(date +%s) - start )) s"
