#!/usr/bin/env bash
# bench/shm-memory.sh - a shard's memory against the number of same-host
# workers (issue 30, part 3): for each W, one server (coordinator and the
# one shard) with flat:P and W zps-worker processes on this host, default
# flags (so gradients come through shared memory); it prints the shard's
# peak RSS (VmHWM) and the highest PSS seen (/proc/PID/smaps_rollup,
# sampled every 0.2 s: shared pages divided among the processes mapping
# them), and the ratio of each to the first W's.
#
#   bench/shm-memory.sh                      W = 2 and 32, flat:1M, 40 steps
#   WORKERS="2 8 32" FLOATS=4M STEPS=60 bench/shm-memory.sh
#
# Every process is started under timeout and killed by pid on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
read -r -a counts <<<"${WORKERS:-2 32}"
floats=${FLOATS:-1M}
case $floats in # flat:P takes a plain count
*K) floats=$((${floats%K} << 10)) ;;
*M) floats=$((${floats%M} << 20)) ;;
esac
steps=${STEPS:-40}
server_bin=${ZPS_SERVER_BIN:-bin/zps-server}
worker_bin=${ZPS_WORKER_BIN:-bin/zps-worker}
run=$(mktemp -d "${TMPDIR:-/tmp}/zps-shm-memory-XXXXXX")
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$run"
}
trap cleanup EXIT

wait_file() { for _ in $(seq 300); do [ -s "$1" ] && return 0; sleep 0.1; done; return 1; }
kib() { awk -v k="$1" '$1 == k":" {print $2}' "$2" 2>/dev/null || true; }

# one W: prints "W peak_MiB pss_MiB"
one() {
    local w=$1 d="$run/w$1" p hwm=0 pss=0 v
    mkdir -p "$d"
    timeout 300 "$server_bin" --listen 'tcp://127.0.0.1:*' --endpoint-file "$d/ep0" \
        --workers "$w" --model "flat:$floats" --dataset synthetic:1024 \
        --global-batch $((w * 8)) --steps "$steps" --lr-schedule constant \
        2>"$d/server.log" &
    p=$!
    pids=("$p")
    wait_file "$d/ep0" || { echo "the server wrote no endpoint" >&2; return 1; }
    for i in $(seq 1 "$w"); do
        timeout 300 "$worker_bin" --coordinator "$(cat "$d/ep0")" 2>"$d/w$i.log" &
        pids+=($!)
    done
    local srv # the server itself, timeout's child
    srv=$(cat "/proc/$p/task/$p/children" 2>/dev/null || true)
    srv=${srv%% *}
    while kill -0 "$p" 2>/dev/null; do
        v=$(kib VmHWM "/proc/$srv/status")
        [ -z "$v" ] || [ "$v" -le "$hwm" ] || hwm=$v
        v=$(kib Pss "/proc/$srv/smaps_rollup")
        [ -z "$v" ] || [ "$v" -le "$pss" ] || pss=$v
        sleep 0.2
    done
    if ! wait "$p"; then
        echo "the server of W=$w failed: $(tail -n 2 "$d/server.log")" >&2
        return 1
    fi
    for q in "${pids[@]:1}"; do wait "$q" || { echo "a worker of W=$w failed" >&2; return 1; }; done
    pids=()
    # The server's own last word on its peak, if it says it; else the poll.
    v=$(grep -o 'peak RSS [0-9.]* MiB' "$d/server.log" | tail -n 1 | awk '{print $3}' || true)
    [ -n "$v" ] || v=$(awk -v k="$hwm" 'BEGIN {printf "%.1f", k / 1024}')
    echo "$w $v $(awk -v k="$pss" 'BEGIN {printf "%.1f", k / 1024}')"
}

echo "zps bench/shm-memory.sh: flat:$floats, $steps steps, 1 shard, default flags, $(nproc) cores"
printf '%-8s %14s %14s %10s %10s\n' workers "peak RSS MiB" "max PSS MiB" "RSS/first" "PSS/first"
first_rss=
first_pss=
for w in "${counts[@]}"; do
    read -r _ rss pss < <(one "$w")
    [ -n "$first_rss" ] || { first_rss=$rss; first_pss=$pss; }
    printf '%-8s %14s %14s %10.2f %10.2f\n' "$w" "$rss" "$pss" \
        "$(awk -v a="$rss" -v b="$first_rss" 'BEGIN {print a / b}')" \
        "$(awk -v a="$pss" -v b="$first_pss" 'BEGIN {print a / b}')"
done
