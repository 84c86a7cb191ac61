#!/usr/bin/env bash
# bench/all.sh - every case of zps's performance table beside the peers it
# is compared with, all measured in the same run, with the ratios and the
# targets of issue 18, as one table (and as Markdown with --md FILE, for
# the README):
#
#   a  flat:669706, 1 worker, 1 shard: a zps step (push, update, pull)
#      against the raw ZeroMQ round trip of the same bytes (bench/comm,
#      build/bench/zmq_ceiling);
#   b  the default job (MLP 784-512-512-10, Fashion-MNIST, batch 128) on 2
#      and on 1 CPU workers against PyTorch DDP (gloo, 2 ranks) and one
#      PyTorch process on batch 128 (bench/torch_ddp.py; 1 thread each, as
#      a zps-worker; and the one process with 2 threads, the cores 2
#      workers use);
#   c  flat:16M, 2 workers, 2 shards against the bare C parameter server
#      (build/bench/bare_ps), gloo's all_reduce of the same tensor on 2
#      ranks (bench/gloo_allreduce.py) and the ZeroMQ ceiling;
#   d  a shard's peak RSS with 32 workers against 2 (flat:1048576);
#   e  the emulated 1 Gbit/s cluster (bench/cluster.sh): only with --cluster
#      (root, network namespaces, tc), off by default;
#   f  the GPU case (wide MLP, 4 shards, bf16 wire): "SKIPPED: no GPU"
#      without nvidia-smi.
#
#   bench/all.sh [--quick] [--cluster] [--md FILE] [--repeats R] [--only LIST]
#   make bench-all BENCH_ARGS="--quick --md /tmp/perf.md"
#
# The peers run interleaved with zps, repeat by repeat, so load drift hits
# both; each figure is the median over the repeats of each run's median
# step. Every process runs under timeout and is killed by pid on exit.
# Exit status 1 if a case failed (its row says FAILED), 0 otherwise: a
# target not met is a figure, not a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
    cat <<'EOF'
usage: bench/all.sh [options]
  --quick          fewer steps and one repeat (about 3 minutes on 2 cores;
                   the default run about 10)
  --repeats R      repeats of every case (default 3; --quick 1)
  --cluster        also run case e, the emulated cluster (bench/cluster.sh:
                   needs root, ip netns and tc; several minutes)
  --md FILE        write the table as Markdown to FILE as well
  --only LIST      run only these cases, e.g. a,c (default a,b,c,d,e,f)
  --keep-logs      keep the run directory (kept anyway when a case fails)
  -h, --help       this text
Environment: PYTHON (default /usr/bin/python3, the one with Debian's
python3-torch); BENCH_GPU_FORCE=1 runs case f without nvidia-smi, with
BENCH_GPU_DEVICE (default cuda), BENCH_GPU_MODEL (mlp:8192-8192-8192-10)
and BENCH_GPU_BATCH (1024): a dry run of case f on a CPU.
EOF
}

die() {
    echo "bench/all.sh: $*" >&2
    exit 2
}

quick=0 repeats='' cluster=0 md='' only=a,b,c,d,e,f keep_logs=0
while [ $# -gt 0 ]; do
    case $1 in
    --quick) quick=1; shift ;;
    --cluster) cluster=1; shift ;;
    --keep-logs) keep_logs=1; shift ;;
    -h | --help) usage; exit 0 ;;
    --repeats | --md | --only)
        [ $# -ge 2 ] || die "$1 needs a value"
        case $1 in
        --repeats) repeats=$2 ;;
        --md) md=$2 ;;
        --only) only=$2 ;;
        esac
        shift 2
        ;;
    *) die "unknown option $1 (--help lists them)" ;;
    esac
done
if [ "$quick" = 1 ]; then
    repeats=${repeats:-1}
    a_steps=40 b_steps=250 c_steps=8 d_steps=6 e_steps=6 f_steps=8
else
    repeats=${repeats:-3}
    a_steps=60 b_steps=450 c_steps=12 d_steps=8 e_steps=12 f_steps=15
fi
[[ $repeats =~ ^[1-9][0-9]*$ ]] || die "--repeats takes a positive integer, not '$repeats'"
[[ $only =~ ^[a-f](,[a-f])*$ ]] || die "--only takes a list of a..f, like a,c"
wants() { [[ ",$only," == *",$1,"* ]]; }
[ -z "$md" ] || : >"$md" || die "cannot write $md"

py=${PYTHON:-/usr/bin/python3} # a pyenv python3 earlier on PATH has no torch
export PYTHONPATH=$PWD/python
b_skip=50 # zps's steps left out of the default job's median, as bench/train.sh
model=mlp:784-512-512-10

# ---------------------------------------------------------------- processes

run=$(mktemp -d "${TMPDIR:-/tmp}/zps-bench-all-XXXXXX")
pids=()   # every timeout wrapper started, killed by pid on exit
failed=0
got=''     # the figure torch_run and gloo_run measured

kill_all() {
    local p
    for p in "${pids[@]}"; do
        kill "$p" 2>/dev/null || true
    done
    for p in "${pids[@]}"; do
        wait "$p" 2>/dev/null || true # bounded: timeout -k 5 kills what ignores SIGTERM
    done
    pids=()
}
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    kill_all
    if [ "$keep_logs" = 1 ] || [ "$failed" = 1 ]; then
        echo "bench/all.sh: logs in $run" >&2
    else
        rm -rf "$run"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# launch LOG SECONDS CMD...: CMD under timeout in the background, its output
# in LOG; its wrapper's pid joins pids.
launch() {
    local log=$1 secs=$2
    shift 2
    timeout -k 5 "$secs" "$@" >"$log" 2>&1 &
    pids+=("$!")
}

# Waits for everything launched; fails if anything exited non-zero.
wait_all() {
    local p ok=0
    for p in "${pids[@]}"; do
        wait "$p" || ok=1
    done
    pids=()
    return "$ok"
}

# wait_file FILE: until FILE is non-empty, at most 30 s, while the last
# process launched lives.
wait_file() {
    local i last=${pids[${#pids[@]} - 1]}
    for ((i = 0; i < 300; i++)); do
        [ -s "$1" ] && return 0
        kill -0 "$last" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

# A TCP port free now on loopback (gloo's rendezvous).
free_port() {
    timeout 30 "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

median() { sort -g | awk '{a[NR] = $1} END {if (NR) print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
fmt() { awk -v v="$1" -v d="${2:-2}" 'BEGIN {printf "%.*f", d, v}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
# pratio "A1 A2 ..." "B1 B2 ...": the median of the repeats' own ratios Ai/Bi
# (each pair measured minutes apart at most, so load drift cancels).
pratio() {
    local a b i
    read -r -a a <<<"$1"
    read -r -a b <<<"$2"
    for i in "${!a[@]}"; do
        awk -v x="${a[$i]}" -v y="${b[$i]}" 'BEGIN {print x / y}'
    done | median | awk '{printf "%.2f", $1}'
}
# met RATIO LIMIT: "met" if RATIO <= LIMIT.
met() { awk -v r="$1" -v l="$2" 'BEGIN {print (r <= l) ? "met" : "not met"}'; }
note() { echo "[$(date -u +%H:%M:%S)] $*"; }

# The table: one row per line of $run/rows, fields split by tabs.
row() { # case zps comparison ratio target met
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$run/rows"
}
# fail_case CASE WHAT LOG: a FAILED row, the end of the log on stderr.
fail_case() {
    failed=1
    row "$1" "FAILED: $2" "-" "-" "-" "-"
    echo "bench/all.sh: $1: $2 failed; the end of ${3##*/}:" >&2
    tail -n 8 "$3" | sed 's/^/    /' >&2
}

# figure CASE WHAT LOG VALUE: fails the case (and returns 1) if VALUE, a
# figure just parsed from a log, is empty.
figure() {
    [ -n "$4" ] && return 0
    fail_case "$1" "parsing $2" "$3"
    return 1
}

# ---------------------------------------------------------------- zps jobs

# zps_job TAG SECONDS W S STEPS SERVER-FLAGS... -- WORKER-FLAGS...: one run
# of the real daemons on loopback; the coordinator's metrics log in
# $run/TAG.jsonl, logs in $run/TAG-*.log.
zps_job() {
    local tag=$1 secs=$2 w=$3 s=$4 steps=$5 ep k i
    shift 5
    local sflags=() wflags=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do
        sflags+=("$1")
        shift
    done
    [ $# -eq 0 ] || shift
    wflags=("$@")
    rm -f "$run/$tag".ep*
    launch "$run/$tag-s0.log" "$secs" bin/zps-server --shard 0 --shards "$s" --workers "$w" \
        --steps "$steps" --listen 'tcp://127.0.0.1:*' --endpoint-file "$run/$tag.ep0" \
        --metrics-log "$run/$tag.jsonl" "${sflags[@]}"
    wait_file "$run/$tag.ep0" || { kill_all; return 1; }
    read -r ep <"$run/$tag.ep0"
    for ((k = 1; k < s; k++)); do
        launch "$run/$tag-s$k.log" "$secs" bin/zps-server --shard "$k" --shards "$s" \
            --coordinator "$ep" --listen 'tcp://127.0.0.1:*' --endpoint-file "$run/$tag.ep$k"
        wait_file "$run/$tag.ep$k" || { kill_all; return 1; }
    done
    for ((i = 0; i < w; i++)); do
        launch "$run/$tag-w$i.log" "$secs" bin/zps-worker --coordinator "$ep" "${wflags[@]}"
    done
    wait_all
}

# The median step_ms of TAG's metrics log past its first SKIP steps.
# Prints nothing if there is none (never fails: callers check).
zps_ms() {
    sed -n 's/.*"step_ms": *\([0-9.eE+-]*\).*/\1/p' "$run/$1.jsonl" 2>/dev/null |
        tail -n +$(($2 + 1)) | median
}

# run_comm TAG SECONDS ARGS...: bench/comm with ARGS, its CSV in $run/TAG.csv.
run_comm() {
    local tag=$1 secs=$2
    shift 2
    launch "$run/$tag.log" "$secs" bash bench/comm --csv "$run/$tag.csv" "$@"
    wait_all
}
# comm_field TAG W NAME [SHM]: the column named NAME (bench/comm's CSV
# header) of the row of W workers (and of the workers' --shm SHM); by name,
# so that a column bench/comm adds moves nothing here.
comm_field() {
    awk -F, -v w="$2" -v name="$3" -v shm="${4:-}" '
        NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
        $col["workers"] == w && (shm == "" || $col["shm"] == shm) { print $col[name]; exit }' \
        "$run/$1.csv"
}

# torch_run TAG SECONDS WORLD STEPS [THREADS]: bench/torch_ddp.py on the
# default job's MLP, THREADS (1) torch threads per process; sets got to rank
# 0's median ms/step. (Not in a $(...) subshell: what it launches must be in
# this shell's pids, for the EXIT trap.)
torch_run() {
    local tag=$1 secs=$2 world=$3 steps=$4 threads=${5:-1} r port=0
    [ "$world" = 1 ] || port=$(free_port)
    for ((r = 0; r < world; r++)); do
        launch "$run/$tag-r$r.log" "$secs" "$py" bench/torch_ddp.py --rank "$r" \
            --world-size "$world" --port "$port" --model "$model" --global-batch 128 \
            --lr 0.05 --momentum 0.9 --steps "$steps" --warmup 20 --threads "$threads"
    done
    wait_all || return 1
    got=$(sed -n 's/^median: \([0-9.]*\) ms\/step.*/\1/p' "$run/$tag-r0.log")
    [ -n "$got" ]
}

# gloo_run TAG SECONDS FLOATS REPEATS: gloo's all_reduce on 2 local ranks;
# sets got to the median ms (as torch_run, not in a subshell).
gloo_run() {
    local tag=$1 secs=$2 floats=$3 reps=$4 r port
    port=$(free_port)
    for r in 0 1; do
        launch "$run/$tag-r$r.log" "$secs" env ZPS_NETNS_RANK="$r" ZPS_NETNS_SIZE=2 \
            ZPS_NETNS_MASTER=127.0.0.1 ZPS_NETNS_PORT="$port" GLOO_SOCKET_IFNAME=lo \
            "$py" bench/gloo_allreduce.py "$floats" "$reps"
    done
    wait_all || return 1
    got=$(sed -n 's/.*median \([0-9.]*\) s.*/\1/p' "$run/$tag-r0.log" | awk 'NF {print $1 * 1000}')
    [ -n "$got" ]
}

# ---------------------------------------------------------------- cases

case_a() {
    local name="flat:669706, 1 worker, 1 shard" rep zs=() cs=()
    note "a: $name; zps and the ZeroMQ round trip, $repeats x $a_steps steps (bench/comm)"
    for ((rep = 1; rep <= repeats; rep++)); do
        if ! run_comm "a-$rep" 600 --floats 669706 --workers 1 --shards 1 --repeats 1 \
            --steps "$a_steps"; then
            fail_case a "bench/comm" "$run/a-$rep.log"
            return
        fi
        zs+=("$(comm_field "a-$rep" 1 zps_step_ms)")
        cs+=("$(comm_field "a-$rep" 1 ceiling_step_ms)")
        figure a "bench/comm's CSV" "$run/a-$rep.log" "${zs[-1]}" || return 0
        figure a "bench/comm's CSV" "$run/a-$rep.log" "${cs[-1]}" || return 0
    done
    local z c
    z=$(printf '%s\n' "${zs[@]}" | median)
    c=$(printf '%s\n' "${cs[@]}" | median)
    if ! { [ -n "$z" ] && [ -n "$c" ] && [ ${#zs[@]} = "$repeats" ]; }; then
        fail_case a "bench/comm's CSV" "$run/a-1.log"
        return
    fi
    local r; r=$(pratio "${zs[*]}" "${cs[*]}")
    row "a. $name" "$(fmt "$z") ms/step" "raw ZeroMQ round trip (zmq_ceiling): $(fmt "$c") ms" \
        "$r ×" "≤ 1.3 ×" "$(met "$r" 1.3)"
}

case_b() {
    local rep z2=() z1=() dd=() sg=() sg2=() comp=() wt=() v steps=$b_steps
    local tsteps=$((steps - b_skip))
    if [ "$have_torch" = 0 ]; then
        row "b. default job" "SKIPPED: no python3-torch for $py (its peers are PyTorch)" "-" "-" \
            "≤ 1.0 × one process, ≤ 0.7 × DDP" "-"
        return
    fi
    note "b: default job ($model, batch 128): zps 2 and 1 workers, DDP 2 ranks, one process (1 and 2 threads); $repeats x $steps steps"
    for ((rep = 1; rep <= repeats; rep++)); do
        if ! zps_job "b2-$rep" 600 2 1 "$steps" --lr-schedule constant; then
            fail_case b "zps, 2 workers" "$run/b2-$rep-s0.log"
            return
        fi
        z2+=("$(zps_ms "b2-$rep" "$b_skip")")
        figure b "zps's metrics log" "$run/b2-$rep-s0.log" "${z2[-1]}" || return 0
        if ! zps_job "b1-$rep" 600 1 1 "$steps" --lr-schedule constant; then
            fail_case b "zps, 1 worker" "$run/b1-$rep-s0.log"
            return
        fi
        z1+=("$(zps_ms "b1-$rep" "$b_skip")")
        figure b "zps's metrics log" "$run/b1-$rep-s0.log" "${z1[-1]}" || return 0
        # The worker's own split of its step: compute, push and wait.
        v=$(sed -n 's/.*timing: .* compute \([0-9.]*\), push and wait for parameters \([0-9.]*\) ms.*/\1 \2/p' \
            "$run/b1-$rep-w0.log" | tail -n 1)
        comp+=("${v% *}")
        wt+=("${v#* }")
        if ! torch_run "ddp-$rep" 600 2 "$tsteps"; then
            fail_case b "PyTorch DDP" "$run/ddp-$rep-r0.log"
            return
        fi
        dd+=("$got")
        if ! torch_run "single-$rep" 600 1 "$tsteps"; then
            fail_case b "one PyTorch process" "$run/single-$rep-r0.log"
            return
        fi
        sg+=("$got")
        # The two cores zps's two workers use, in one process; 100 steps at
        # most (OpenMP's threads spin: on a loaded machine a step can take
        # ten times as long).
        if ! torch_run "single2-$rep" 600 1 $((tsteps < 100 ? tsteps : 100)) 2; then
            fail_case b "one PyTorch process, 2 threads" "$run/single2-$rep-r0.log"
            return
        fi
        sg2+=("$got")
        note "   repeat $rep: zps 2 workers ${z2[-1]}, 1 worker ${z1[-1]}, DDP ${dd[-1]}, one process ${sg[-1]} (2 threads ${sg2[-1]}) ms/step"
    done
    local m2 m1 md ms ms2 mc mw
    m2=$(printf '%s\n' "${z2[@]}" | median)
    m1=$(printf '%s\n' "${z1[@]}" | median)
    md=$(printf '%s\n' "${dd[@]}" | median)
    ms=$(printf '%s\n' "${sg[@]}" | median)
    ms2=$(printf '%s\n' "${sg2[@]}" | median)
    mc=$(printf '%s\n' "${comp[@]}" | median)
    mw=$(printf '%s\n' "${wt[@]}" | median)
    if ! { [ -n "$m2" ] && [ -n "$m1" ] && [ -n "$md" ] && [ -n "$ms" ] && [ -n "$ms2" ]; }; then
        fail_case b "parsing a figure" "$run/b2-1-s0.log"
        return
    fi
    local name="default job"
    local r
    r=$(pratio "${z2[*]}" "${sg[*]}")
    row "b. $name, 2 CPU workers" "$(fmt "$m2") ms/step" "one PyTorch process on batch 128: $(fmt "$ms") ms" \
        "$r ×" "≤ 1.0 ×" "$(met "$r" 1.0)"
    r=$(pratio "${z2[*]}" "${sg2[*]}")
    row "b. $name, 2 CPU workers" "$(fmt "$m2") ms/step" "one PyTorch process on batch 128, 2 threads: $(fmt "$ms2") ms" \
        "$r ×" "-" "-"
    r=$(pratio "${z2[*]}" "${dd[*]}")
    row "b. $name, 2 CPU workers" "$(fmt "$m2") ms/step" "PyTorch DDP (gloo, 2 ranks): $(fmt "$md") ms" \
        "$r ×" "≤ 0.7 ×" "$(met "$r" 0.7)"
    r=$(pratio "${z1[*]}" "${sg[*]}")
    row "b. $name, 1 CPU worker" "$(fmt "$m1") ms/step (worker means: compute $(fmt "${mc:-0}" 1), push and wait $(fmt "${mw:-0}" 1))" \
        "one PyTorch process on batch 128: $(fmt "$ms") ms" "$r ×" "-" "-"
}

case_c() {
    local rep zs=() ss=() cs=() bs=() gs=() v P=16777216 steps=$c_steps
    note "c: flat:16M, 2 workers, 2 shards: zps over TCP and with shared memory (and the ZeroMQ ceiling), the bare PS, gloo all_reduce; $repeats x $steps steps"
    for ((rep = 1; rep <= repeats; rep++)); do
        if ! run_comm "c-$rep" 600 --floats "$P" --workers 2 --shards 2 --repeats 1 \
            --steps "$steps" --skip 2 --shm off,on; then
            fail_case c "bench/comm" "$run/c-$rep.log"
            return
        fi
        zs+=("$(comm_field "c-$rep" 2 zps_step_ms off)")
        ss+=("$(comm_field "c-$rep" 2 zps_step_ms on)")
        cs+=("$(comm_field "c-$rep" 2 ceiling_step_ms off)")
        figure c "bench/comm's CSV" "$run/c-$rep.log" "${zs[-1]}" || return 0
        figure c "bench/comm's CSV" "$run/c-$rep.log" "${ss[-1]}" || return 0
        figure c "bench/comm's CSV" "$run/c-$rep.log" "${cs[-1]}" || return 0
        launch "$run/bare-$rep.log" 300 build/bench/bare_ps --workers 2 --shards 2 --floats "$P" \
            --steps $((steps - 2)) --warmup 2
        if ! wait_all; then
            fail_case c "bare_ps" "$run/bare-$rep.log"
            return
        fi
        bs+=("$(sed -n 's/^bare_ps .* step_ms=\([0-9.]*\) .*/\1/p' "$run/bare-$rep.log")")
        figure c "bare_ps's line" "$run/bare-$rep.log" "${bs[-1]}" || return 0
        got=-
        if [ "$have_torch" = 1 ] && ! gloo_run "gloo-$rep" 300 "$P" $((steps - 2)); then
            fail_case c "gloo all_reduce" "$run/gloo-$rep-r0.log"
            return
        fi
        gs+=("$got")
        note "   repeat $rep: zps ${zs[-1]} (shared memory ${ss[-1]}), ceiling ${cs[-1]}, bare PS ${bs[-1]}, gloo ${gs[-1]} ms/step"
    done
    local z zm c b g r name="flat:16M, 2 workers, 2 shards"
    z=$(printf '%s\n' "${zs[@]}" | median)
    zm=$(printf '%s\n' "${ss[@]}" | median)
    c=$(printf '%s\n' "${cs[@]}" | median)
    b=$(printf '%s\n' "${bs[@]}" | median)
    g=$(printf '%s\n' "${gs[@]}" | grep -v '^-$' | median || true)
    if ! { [ -n "$z" ] && [ -n "$zm" ] && [ -n "$b" ] && [ -n "$c" ]; }; then
        fail_case c "parsing a figure" "$run/c-1.log"
        return
    fi
    r=$(pratio "${zs[*]}" "${bs[*]}")
    row "c. $name" "$(fmt "$z" 1) ms/step (TCP, --shm off)" "bare C parameter server (bare_ps, TCP): $(fmt "$b" 1) ms" \
        "$r ×" "≤ 0.75 ×" "$(met "$r" 0.75)"
    if [ -n "$g" ]; then
        r=$(pratio "${ss[*]}" "${gs[*]}")
        row "c. $name" "$(fmt "$zm" 1) ms/step (gradients through shared memory)" "gloo all_reduce, 2 ranks: $(fmt "$g" 1) ms" \
            "$r ×" "≤ 1.0 × (shared-memory path)" "$(met "$r" 1.0)"
    else
        row "c. $name" "$(fmt "$zm" 1) ms/step (gradients through shared memory)" "gloo: SKIPPED (no python3-torch for $py)" "-" \
            "≤ 1.0 × (shared-memory path)" "-"
    fi
    r=$(pratio "${zs[*]}" "${cs[*]}")
    row "c. $name" "$(fmt "$z" 1) ms/step (TCP, --shm off)" "raw ZeroMQ, same bytes, no arithmetic: $(fmt "$c" 1) ms" \
        "$r ×" "-" "-"
}

case_d() {
    note "d: a shard's peak RSS, flat:1048576, 1 shard, 2 and 32 workers, $d_steps steps (bench/comm)"
    if ! run_comm d 900 --floats 1048576 --workers 2,32 --shards 1 --repeats 1 \
        --steps "$d_steps" --skip 2 --shm off; then
        fail_case d "bench/comm" "$run/d.log"
        return
    fi
    local r2 r32 src r
    r2=$(comm_field d 2 shard_peak_rss_mib)
    r32=$(comm_field d 32 shard_peak_rss_mib)
    src=$(comm_field d 32 rss_source)
    if ! { [ -n "$r2" ] && [ -n "$r32" ]; }; then
        fail_case d "bench/comm's CSV" "$run/d.log"
        return
    fi
    r=$(ratio "$r32" "$r2")
    # --shm off: through shared memory a shard also maps each local
    # worker's segment (2 x its range), which its RSS counts though the
    # pages are the worker's (docs/measurements.md).
    row "d. shard peak RSS, flat:1M, 1 shard, TCP" "W=32: $(fmt "$r32" 1) MiB peak RSS$([ "$src" = poll ] && echo ' (polled)')" \
        "W=2: $(fmt "$r2" 1) MiB" "$r ×" "≤ 1.5 ×" "$(met "$r" 1.5)"
}

case_e() {
    local name="emulated cluster, 1 Gbit/s, W=4, S=4"
    if [ "$cluster" = 0 ]; then
        row "e. $name" "SKIPPED: off by default (needs root, ip netns, tc): bench/all.sh --cluster" \
            "-" "-" "≤ 0.8 × gloo, ≤ 1.15 × link bound" "-"
        return
    fi
    if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
        row "e. $name" "SKIPPED: --cluster needs root, ip and tc" "-" "-" \
            "≤ 0.8 × gloo, ≤ 1.15 × link bound" "-"
        return
    fi
    note "e: $name; $e_steps steps (bench/cluster.sh, several minutes)"
    # TMPDIR: its logs directory lies in this run's, kept or removed with it.
    launch "$run/e.log" 1500 env TMPDIR="$run" bash bench/cluster.sh -n "$e_steps"
    if ! wait_all; then
        fail_case e "bench/cluster.sh" "$run/e.log"
        return
    fi
    # Its Markdown table: "| what | seconds per step | vs link bound |".
    local z g b zs
    z=$(awk -F'|' '/zps, W=/ && /default flags/ {gsub(/ /, "", $3); print $3}' "$run/e.log")
    zs=$(awk -F'|' '/zps, W=/ && /, --sndbuf [1-9]/ {gsub(/ /, "", $3); print $3}' "$run/e.log")
    g=$(awk -F'|' '/gloo all_reduce, W=/ {gsub(/ /, "", $3); print $3}' "$run/e.log")
    b=$(awk -F'|' '/link bound, parameter server/ {gsub(/ /, "", $3); print $3}' "$run/e.log")
    if ! { [ -n "$z" ] && [ -n "$b" ]; }; then
        fail_case e "parsing bench/cluster.sh" "$run/e.log"
        return
    fi
    local r
    if [ -n "$g" ]; then
        r=$(ratio "$z" "$g")
        row "e. $name" "$(fmt "$z") s/step" "gloo all_reduce, 4 hosts: $(fmt "$g") s" "$r ×" "≤ 0.8 ×" "$(met "$r" 0.8)"
    else
        row "e. $name" "$(fmt "$z") s/step" "gloo: SKIPPED (no python3-torch)" "-" "≤ 0.8 ×" "-"
    fi
    r=$(ratio "$z" "$b")
    row "e. $name" "$(fmt "$z") s/step" "link bound (4P bytes / rate): $(fmt "$b") s; zps --sndbuf 32768: $(fmt "${zs:-0}") s" \
        "$r ×" "≤ 1.15 ×" "$(met "$r" 1.15)"
}

case_f() {
    local dev=${BENCH_GPU_DEVICE:-cuda} wide=${BENCH_GPU_MODEL:-mlp:8192-8192-8192-10}
    local batch=${BENCH_GPU_BATCH:-1024}
    local name="GPU wide MLP, 1 $dev worker"
    local target="≤ 0.3 s/step"
    if [ "${BENCH_GPU_FORCE:-0}" != 1 ]; then
        if ! command -v nvidia-smi >/dev/null; then
            row "f. $name" "SKIPPED: no GPU (no nvidia-smi)" "-" "-" "$target" "-"
            return
        fi
        if ! timeout 60 bin/zps-worker --check-device --device "$dev" >"$run/f-check.log" 2>&1; then
            row "f. $name" "SKIPPED: no usable GPU: $(tail -n 1 "$run/f-check.log")" "-" "-" "$target" "-"
            return
        fi
    fi
    note "f: $name: 4 shards bf16 wire against 1 shard fp32 wire, $f_steps steps each"
    local rep a=() b=() flags=(--model "$wide" --dataset "synthetic:$((16 * batch))" --global-batch "$batch"
        --lr 0.01 --lr-schedule constant)
    for ((rep = 1; rep <= repeats; rep++)); do
        if ! zps_job "f1-$rep" 600 1 1 "$f_steps" "${flags[@]}" -- --device "$dev"; then
            fail_case f "1 shard fp32" "$run/f1-$rep-w0.log"
            return
        fi
        a+=("$(zps_ms "f1-$rep" 3)")
        figure f "zps's metrics log" "$run/f1-$rep-s0.log" "${a[-1]}" || return 0
        if ! zps_job "f4-$rep" 600 1 4 "$f_steps" "${flags[@]}" --wire-dtype bf16 -- --device "$dev"; then
            fail_case f "4 shards bf16" "$run/f4-$rep-w0.log"
            return
        fi
        b+=("$(zps_ms "f4-$rep" 3)")
        figure f "zps's metrics log" "$run/f4-$rep-s0.log" "${b[-1]}" || return 0
    done
    local ma mb r
    ma=$(printf '%s\n' "${a[@]}" | median)
    mb=$(printf '%s\n' "${b[@]}" | median)
    r=$(pratio "${b[*]}" "${a[*]}")
    row "f. $name, 4 shards, bf16" "$(fmt "$(awk -v m="$mb" 'BEGIN {print m / 1000}')" 3) s/step" \
        "1 shard, fp32 wire: $(fmt "$(awk -v m="$ma" 'BEGIN {print m / 1000}')" 3) s" "$r ×" "$target" \
        "$(awk -v m="$mb" 'BEGIN {print (m <= 300) ? "met" : "not met"}')"
}

# ---------------------------------------------------------------- the run

for f in bin/zps-server bin/zps-worker bin/libzps.so.1 build/bench/zmq_ceiling build/bench/bare_ps; do
    [ -e "$f" ] || die "$f is missing: run make all build/bench/zmq_ceiling build/bench/bare_ps (or make bench-all)"
done
# PyTorch (b's peers, c's gloo) is Debian's python3-torch; without it those
# rows say SKIPPED and the rest is measured.
have_torch=1
if ! timeout 120 "$py" -c 'import torch.distributed' 2>/dev/null; then
    have_torch=0
    echo "bench/all.sh: no torch for $py: PyTorch's rows are skipped (apt-get install python3-torch)" >&2
fi

rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || rev="$rev+changes"
start=$SECONDS
header="zps bench/all.sh: $(date -u +%Y-%m-%dT%H:%MZ), commit $rev, $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), load $(cut -d' ' -f1-3 /proc/loadavg) at the start; $([ "$quick" = 1 ] && echo "--quick, ")median of $repeats repeat(s); loopback TCP; torch $(timeout 120 "$py" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo -); every worker and PyTorch process 1 compute thread unless its row says otherwise, zps-server its default --threads auto"
echo "$header"
: >"$run/rows"
if wants a; then case_a; fi
if wants b; then case_b; fi
if wants c; then case_c; fi
if wants d; then case_d; fi
if wants e; then case_e; fi
if wants f; then case_f; fi

# ---------------------------------------------------------------- the table

heads=$'case\tzps\tcomparison (same run)\tratio\ttarget\tmet'
echo
# Widths in characters: bytes less UTF-8 continuation bytes (≤, ×), in the C locale.
{ echo "$heads"; cat "$run/rows"; } | LC_ALL=C awk -F'\t' '
    function dw(s,  t) { t = s; gsub(/[\200-\277]/, "", t); return length(t) }
    function pad(s, n,  out) { out = s; while (dw(out) < n) out = out " "; return out }
    { for (i = 1; i <= NF; i++) { cell[NR, i] = $i; if (dw($i) > w[i]) w[i] = dw($i) } n = NR }
    END {
        for (r = 1; r <= n; r++) {
            line = ""
            for (i = 1; i <= 6; i++) line = line pad(cell[r, i], w[i] + 2)
            sub(/ +$/, "", line); print line
            if (r == 1) {
                line = ""
                for (i = 1; i <= 6; i++) { d = ""; while (length(d) < w[i]) d = d "-"; line = line d "  " }
                sub(/ +$/, "", line); print line
            }
        }
    }'
echo
echo "Each figure: the median over the repeats of a run's median step. ratio: zps / the comparison (time, or RSS in d), the median of the repeats' own ratios (each pair measured side by side); lower is better."
[ "$cluster" = 1 ] || echo "e (the emulated cluster) is off by default: it needs root; bench/all.sh --cluster runs it."
echo "$((SECONDS - start)) s"

if [ -n "$md" ]; then
    {
        echo "$header"
        echo
        echo "| case | zps | comparison (same run) | ratio | target | met |"
        echo "|---|---|---|---|---|---|"
        awk -F'\t' '{ printf "|"; for (i = 1; i <= NF; i++) { gsub(/\|/, "\\|", $i); printf " %s |", $i } print "" }' "$run/rows"
        echo
        echo "Command: \`bench/all.sh$([ "$quick" = 1 ] && echo " --quick")$([ "$cluster" = 1 ] && echo " --cluster") --repeats $repeats\`." \
            "Each figure: the median over the repeats of a run's median step. Ratio: zps / the comparison" \
            "(time, or RSS in d), the median of the repeats' own ratios; lower is better."
    } >"$md"
    echo "markdown: $md"
fi
exit "$failed"
