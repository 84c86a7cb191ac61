#!/usr/bin/env bash
# bench/diloco.sh - the figures of the low-communication mode (issue 19):
# time and bytes on the wire to reach a test accuracy (0.85) on
# Fashion-MNIST over slow links, for synchronous zps, PyTorch DDP (gloo)
# and DiLoCo (zps-server --mode diloco) with H inner steps, fp32 and int8
# pseudo-gradients, whole or a fragment at a time (--fragments 4, Streaming
# DiLoCo); and, with one worker slowed 2x, fixed H against
# --inner-steps auto (seconds per outer round). Every host is a network
# namespace of deploy/netns-cluster.sh with every link limited by tc tbf
# (100 Mbit/s, both ways); the job is zps's default MLP 784-512-512-10,
# global batch 128, SGD lr 0.05 momentum 0.9, cosine over --steps. Needs
# root; DDP needs /usr/bin/python3 with torch; the plots need gnuplot.
#
#   sudo bench/diloco.sh [-o DIR] [--md FILE] [--only LIST] [options]
#
# Cases (--only, a comma list; default all): sync, ddp, h10, h50, h10-int8,
# h50-int8, h10-f4, h10-f4-int8 (--fragments 4), h10-f4-ov, h10-f4-ov-int8
# (and --overlap), slow-h10, slow-auto (auto:10), slow-h50, slow-auto50,
# slow-h10-f4-ov, slow-auto-f4-ov. The DiLoCo cases are skipped, and the
# table says so, while bin/zps-server has no --mode.
#
# A run stops at the first evaluation (zps: every epoch's end, the
# server's metrics log; DDP: bench/ddp_fmnist.py at the same steps) at or
# above the target (DiLoCo: and past --min-epochs), or after --max-epochs
# evaluations (the slowed runs: --slow-epochs), or at --bound seconds. Wall time counts from the launch of the hosts' processes; bytes
# on the wire are what every host sent, read from the rx_bytes of its
# link's far end (the hub's veth port, /sys/class/net/*/statistics) every
# 0.5 s: payload and TCP/IP/Ethernet headers, each byte once.
set -euo pipefail
cwd=$PWD # -o and --md are relative to where it was called from
cd "$(dirname "$0")/.."

usage() {
    cat <<'EOF'
usage: sudo bench/diloco.sh [options]
  -o DIR           plots (diloco-time.svg, diloco-bytes.svg, diloco-slow.svg), their data
                   (diloco-CASE.tsv) and the table (diloco.md) (default:
                   the run directory)
  --md FILE        the table as Markdown to FILE as well
  --only LIST      cases, in the order to run them, e.g. sync,h10 (default
                   sync,ddp,h10,h50,h10-int8,h50-int8,h10-f4,h10-f4-int8,
                   h10-f4-ov,h10-f4-ov-int8,slow-h10,slow-auto,slow-h50,
                   slow-auto50,slow-h10-f4-ov,slow-auto-f4-ov)
  -r RATE          every host's link, both ways (default 100mbit)
  -w W             workers, each on a host of its own with a shard beside it,
                   as a user would deploy them (default 4)
  --shard-host     zps's shards instead on one host of their own: every
                   worker's gradient crosses that host's one link
  --target A       the test accuracy to reach (default 0.85)
  --steps S        the schedule's length in global batches: cosine decays
                   over it; a multiple of every H (default 4500)
  --max-epochs E   stop a run after E evaluations whatever the accuracy
                   (default 5)
  --min-epochs E   DiLoCo runs go on to at least E evaluations, so that
                   int8 and fp32 meet at the same epochs (default 2)
  --slow-epochs E  the slowed-worker runs stop after E evaluations: their
                   figure is the seconds per round (default 1)
  --bound SECONDS  per run (default 1500)
  --repeats R      runs of every case; figures are the medians (default 1)
  --keep-logs      keep the run directory
  --report DIR     no runs: the table and plots again from DIR, a run
                   directory kept by --keep-logs (after a change to them)
  -h, --help       this text
EOF
}
die() {
    echo "bench/diloco.sh: $*" >&2
    exit 2
}

abs() { case $1 in /*) echo "$1" ;; *) echo "$cwd/$1" ;; esac; }
outdir='' md='' only=sync,ddp,h10,h50,h10-int8,h50-int8,h10-f4,h10-f4-int8,h10-f4-ov,h10-f4-ov-int8,slow-h10,slow-auto,slow-h50,slow-auto50,slow-h10-f4-ov,slow-auto-f4-ov
rate=100mbit workers=4 target=0.85 steps=4500 max_epochs=5 min_epochs=2 slow_epochs=1 bound=1500
repeats=1 keep_logs=0 report='' shard_host=0
while [ $# -gt 0 ]; do
    case $1 in
    -h | --help) usage; exit 0 ;;
    --keep-logs) keep_logs=1; shift ;;
    --shard-host) shard_host=1; shift ;;
    -o | --md | --report | --only | -r | -w | --target | --steps | --max-epochs | --min-epochs | --slow-epochs | --bound | --repeats)
        [ $# -ge 2 ] || die "$1 needs a value"
        case $1 in
        -o) outdir=$(abs "$2") ;;
        --md) md=$(abs "$2") ;;
        --report) report=$(abs "$2") ;;
        --only) only=$2 ;;
        -r) rate=$2 ;;
        -w) workers=$2 ;;
        --target) target=$2 ;;
        --steps) steps=$2 ;;
        --max-epochs) max_epochs=$2 ;;
        --min-epochs) min_epochs=$2 ;;
        --slow-epochs) slow_epochs=$2 ;;
        --bound) bound=$2 ;;
        --repeats) repeats=$2 ;;
        esac
        shift 2
        ;;
    *) die "unknown option $1 (--help lists them)" ;;
    esac
done
all_cases=(sync ddp h10 h50 h10-int8 h50-int8 h10-f4 h10-f4-int8 h10-f4-ov h10-f4-ov-int8
    slow-h10 slow-auto slow-h50 slow-auto50 slow-h10-f4-ov slow-auto-f4-ov)
IFS=, read -r -a cases <<<"$only"
for c in "${cases[@]}"; do
    [[ " ${all_cases[*]} " == *" $c "* ]] || die "--only: no case '$c' (${all_cases[*]})"
done
for v in "$workers" "$steps" "$max_epochs" "$min_epochs" "$slow_epochs" "$bound" "$repeats"; do
    [[ $v =~ ^[1-9][0-9]*$ ]] || die "'$v' is not a positive integer"
done
wants() { [[ ",$only," == *",$1,"* ]]; }
if [ -n "$report" ]; then
    [ -s "$report/header" ] || die "--report $report: not a run directory of bench/diloco.sh --keep-logs"
    run=$report keep_logs=1
else
    [ "$(id -u)" -eq 0 ] || die "needs root (deploy/netns-cluster.sh: ip netns, tc)"
    for f in bin/zps-server bin/zps-worker; do
        [ -x "$f" ] || die "$f is missing: run make"
    done
    { command -v ip && command -v tc; } >/dev/null || die "needs ip and tc (iproute2)"
    run=$(mktemp -d "${TMPDIR:-/tmp}/zps-bench-diloco-XXXXXX")
fi
[ -n "$outdir" ] || outdir=$run/out
mkdir -p "$outdir"
outdir=$(cd "$outdir" && pwd)
[ -z "$md" ] || : >"$md" || die "cannot write $md"

have_diloco=1
help=$(bin/zps-server --help 2>&1 || true) # not through grep -q: SIGPIPE, under pipefail
[[ $help == *"--mode sync"* ]] || have_diloco=0
have_torch=1
timeout 120 /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null || have_torch=0
have_gnuplot=1
command -v gnuplot >/dev/null || have_gnuplot=0

# ---------------------------------------------------------------- processes

nc_pid=''
# shellcheck disable=SC2317 # called by the traps
stop_cluster() {
    [ -n "$nc_pid" ] || return 0
    # netns-cluster.sh kills its processes by pid and removes its
    # namespaces on exit; a bounded wait, then KILL (its trap has run or
    # never will).
    kill -TERM "$nc_pid" 2>/dev/null || true
    local i
    for ((i = 0; i < 100; i++)); do
        kill -0 "$nc_pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$nc_pid" 2>/dev/null || true
    wait "$nc_pid" 2>/dev/null || true
    # What its trap would have removed, had it been killed before it ran.
    local ns
    for ns in $(ip netns list 2>/dev/null | awk -v t="zps$nc_pid-" 'index($1, t) == 1 {print $1}'); do
        ip netns del "$ns" 2>/dev/null || true
    done
    nc_pid=''
}
# shellcheck disable=SC2317
cleanup() {
    stop_cluster
    if [ "$keep_logs" = 1 ]; then
        echo "bench/diloco.sh: logs in $run" >&2
    elif [[ $outdir == "$run"/* ]]; then
        rm -rf "${run:?}"/[!o]*
        echo "bench/diloco.sh: figures and data in $outdir" >&2
    else
        rm -rf "$run"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

note() { echo "[$(date -u +%H:%M:%S)] $*"; }
median() { sort -g | awk '{a[NR] = $1} END {if (NR) print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
now() { date +%s.%N; }

# The bytes every host of the cluster sent so far: the rx_bytes of the
# hub's veth ports (each host's link, seen from the bridge).
hub_bytes() {
    ip netns exec "$1" sh -c 'cat /sys/class/net/[swh][0-9]*/statistics/rx_bytes' 2>/dev/null |
        awk '{s += $1} END {printf "%.0f\n", s}'
}

# evals FILE: "K accuracy" for the K-th evaluation line of FILE (zps's
# metrics log or bench/ddp_fmnist.py's output: the same keys), K from 1.
evals() {
    sed -n 's/.*"epoch": *\([0-9]*\).*"test_accuracy": *\([0-9.]*\).*/\1 \2/p' "$1" 2>/dev/null |
        awk '{print NR, $2}'
}

# epochs_trained FILE H: for each evaluation line of FILE, the epochs
# trained before it: global batches / (60000 / 128), from the step lines
# before it (H global batches each: a DiLoCo round's inner steps) or from
# its own "step" (bench/ddp_fmnist.py). Not the line's epoch: in diloco
# mode an epoch's end is evaluated at the next round's boundary, labelled
# with the epoch that round is in, and an epoch may go unevaluated.
epochs_trained() {
    awk -v h="$2" -v per=$((60000 / 128)) '
        /"test_accuracy"/ {
            if (match($0, /"step": *[0-9]+/)) {
                v = substr($0, RSTART, RLENGTH); sub(/.*: */, "", v); printf "%.2f\n", (v + 1) / per
            } else printf "%.2f\n", n * h / per
            next
        }
        /"step":/ { n++ }' "$1" 2>/dev/null
}
# set_epochs TAG H: $run/TAG.evals's third field from epochs_trained.
set_epochs() {
    local raw=$run/$1/metrics.jsonl
    [ -e "$raw" ] || raw=$run/$1/w0.log
    epochs_trained "$raw" "$2" >"$run/$1.epochs"
    awk 'NR == FNR {e[FNR] = $1; next} {if (FNR in e) $3 = e[FNR]; print}' \
        "$run/$1.epochs" "$run/$1.evals" >"$run/$1.evals.new"
    mv "$run/$1.evals.new" "$run/$1.evals"
}
# case_h CASE: the global batches of a step line (1; DiLoCo: H, the fastest
# worker's inner steps with auto; with 4 fragments H / 4 on average).
case_h() {
    case $1 in
    *-f4*) echo 2.5 ;;
    *50*) echo 50 ;;
    h* | slow-*) echo 10 ;;
    *) echo 1 ;;
    esac
}

# cluster TAG MIN-EPOCHS MAX-EPOCHS EVAL-FILE SERVER-HOST NETNS-CLUSTER-ARGS...:
# one run (SERVER-HOST: s0, or "" for none); polls its bytes and
# evaluations every 0.5 s into $run/TAG.evals ("seconds bytes epoch
# accuracy", epoch K as evals gives it) and $run/TAG.ticks ("seconds bytes"), and stops it at the
# first evaluation at or above the target past MIN-EPOCHS of them, after
# MAX-EPOCHS, or at --bound. Evaluations are read from EVAL-FILE, under
# $run/TAG (netns-cluster.sh's -o). Returns 1 if the run failed before
# reaching the target.
cluster() {
    local tag=$1 min=$2 max=$3 ev=$run/$1/$4 server_ns=$5
    shift 5
    local dir=$run/$tag hub t0 t b seen=0 n line reached=0 rc=0 up=0
    rm -rf "$dir"
    mkdir -p "$dir"
    : >"$run/$tag.evals"
    : >"$run/$tag.ticks"
    t0=$(now)
    nice -n 5 deploy/netns-cluster.sh -o "$dir" -t "$((bound + 30))" "$@" >"$run/$tag.log" 2>&1 &
    nc_pid=$!
    hub="zps$nc_pid-hub"
    while kill -0 "$nc_pid" 2>/dev/null; do
        sleep 0.5
        t=$(awk -v a="$(now)" -v b="$t0" 'BEGIN {printf "%.2f", a - b}')
        b=$(hub_bytes "$hub")
        [ -n "$b" ] || continue
        echo "$t $b" >>"$run/$tag.ticks"
        # The coordinator's host empty: the server has exited (done, or
        # failed: its workers would wait for it until their timeouts).
        if [ -n "$server_ns" ] && [ -n "$(ip netns pids "zps$nc_pid-$server_ns" 2>/dev/null)" ]; then
            up=1
        elif [ "$up" = 1 ]; then
            echo "bench/diloco.sh: $tag: the server has exited" >&2
            n=$(evals "$ev" | wc -l)
            [ "$n" -gt "$seen" ] || { rc=1; break; }
        fi
        n=$(evals "$ev" | wc -l)
        if [ "$n" -gt "$seen" ]; then
            evals "$ev" | tail -n +$((seen + 1)) | while read -r line; do
                echo "$t $b $line"
            done >>"$run/$tag.evals"
            seen=$n
            if awk -v a="$(tail -n 1 "$run/$tag.evals" | cut -d' ' -f4)" -v g="$target" 'BEGIN {exit !(a >= g)}'; then
                reached=1
            fi
            if { [ "$reached" = 1 ] && [ "$seen" -ge "$min" ]; } || [ "$seen" -ge "$max" ]; then
                break
            fi
        fi
        if awk -v t="$t" -v m="$bound" 'BEGIN {exit !(t > m)}'; then
            echo "bench/diloco.sh: $tag: still running after $bound s" >&2
            break
        fi
    done
    if kill -0 "$nc_pid" 2>/dev/null; then
        stop_cluster
    else
        wait "$nc_pid" || rc=1
        nc_pid=''
    fi
    # Whatever the state, the accuracy and bytes of a stopped run count.
    if [ "$reached" = 0 ] && [ "$rc" = 1 ]; then
        echo "bench/diloco.sh: $tag failed; the end of its logs:" >&2
        tail -n 5 "$run/$tag.log" "$dir"/*.log 2>/dev/null | sed 's/^/    /' >&2
        return 1
    fi
    return 0
}

# ---------------------------------------------------------------- cases

# Per case: zps's server flags (an empty string: DDP) and the slowdowns.
job=(--workers "$workers" --steps "$steps" --model mlp:784-512-512-10 --global-batch 128)
case_flags() {
    case $1 in
    sync | ddp) echo "" ;;
    h10) echo "--mode diloco --inner-steps 10 --compress none" ;;
    h50) echo "--mode diloco --inner-steps 50 --compress none" ;;
    h10-int8) echo "--mode diloco --inner-steps 10 --compress int8" ;;
    h50-int8) echo "--mode diloco --inner-steps 50 --compress int8" ;;
    h10-f4) echo "--mode diloco --inner-steps 10 --fragments 4 --compress none" ;;
    h10-f4-int8) echo "--mode diloco --inner-steps 10 --fragments 4 --compress int8" ;;
    h10-f4-ov) echo "--mode diloco --inner-steps 10 --fragments 4 --overlap --compress none" ;;
    h10-f4-ov-int8) echo "--mode diloco --inner-steps 10 --fragments 4 --overlap --compress int8" ;;
    slow-h10-f4-ov) echo "--mode diloco --inner-steps 10 --fragments 4 --overlap --compress none" ;;
    slow-auto-f4-ov) echo "--mode diloco --inner-steps auto --fragments 4 --overlap --compress none" ;;
    slow-h10) echo "--mode diloco --inner-steps 10 --compress none" ;;
    slow-auto) echo "--mode diloco --inner-steps auto --compress none" ;;
    slow-h50) echo "--mode diloco --inner-steps 50 --compress none" ;;
    slow-auto50) echo "--mode diloco --inner-steps auto:50 --compress none" ;;
    esac
}
case_name() {
    case $1 in
    sync) echo "synchronous zps" ;;
    ddp) echo "DDP (gloo)" ;;
    h10) echo "DiLoCo H=10, fp32" ;;
    h50) echo "DiLoCo H=50, fp32" ;;
    h10-int8) echo "DiLoCo H=10, int8" ;;
    h50-int8) echo "DiLoCo H=50, int8" ;;
    h10-f4) echo "DiLoCo H=10, 4 fragments, fp32" ;;
    h10-f4-int8) echo "DiLoCo H=10, 4 fragments, int8" ;;
    h10-f4-ov) echo "DiLoCo H=10, 4 fragments, overlap, fp32" ;;
    h10-f4-ov-int8) echo "DiLoCo H=10, 4 fragments, overlap, int8" ;;
    slow-h10-f4-ov) echo "DiLoCo H=10, 4 fragments, overlap, worker 0 slowed 2x" ;;
    slow-auto-f4-ov) echo "DiLoCo auto, 4 fragments, overlap, worker 0 slowed 2x" ;;
    slow-h10) echo "DiLoCo H=10, worker 0 slowed 2x" ;;
    slow-auto) echo "DiLoCo --inner-steps auto, worker 0 slowed 2x" ;;
    slow-h50) echo "DiLoCo H=50, worker 0 slowed 2x" ;;
    slow-auto50) echo "DiLoCo --inner-steps auto:50, worker 0 slowed 2x" ;;
    esac
}

# run_case CASE REP: one run; its files are $run/CASE-REP.*
run_case() {
    local c=$1 rep=$2 tag=$1-$2 flags slow=- min=1 max=$max_epochs here
    here=$PWD
    read -r -a flags <<<"$(case_flags "$c")"
    case $c in
    slow-*) slow=2 max=$slow_epochs ;;
    esac
    case $c in
    h* | slow-*) min=$min_epochs ;;
    esac
    if [ "$c" = ddp ]; then
        cluster "$tag" 1 "$max" w0.log '' -s 0 -w "$workers" -r "$rate" \
            -x "PYTHONPATH=$here/python exec bash $here/bench/diloco-host.sh ddp $here/bench/ddp_fmnist.py --init $run/init.bin --steps $steps --global-batch 128 --target $target"
    elif [ "$shard_host" = 1 ]; then
        cluster "$tag" "$min" "$max" metrics.jsonl s0 -s 1 -w "$workers" -r "$rate" \
            -x "exec bash $here/bench/diloco-host.sh zps $here/bin $run/$tag/metrics.jsonl $slow ${job[*]} ${flags[*]}"
    else
        # A shard on every worker's host (netns-cluster's own zps layout:
        # shard I on host hI, the coordinator on h0, its metrics log
        # $run/$tag/metrics.jsonl); worker 0 slowed as SLOWDOWNS says.
        local slowed=()
        if [ "$slow" != - ]; then slowed=(-f "0=--slowdown $slow"); fi
        cluster "$tag" "$min" "$max" metrics.jsonl h0 -s "$workers" -H "$workers" -g 1 -c \
            -r "$rate" "${slowed[@]}" -- "${job[@]:2}" "${flags[@]}"
    fi
}

# make_init: zps's initial parameters of the job into $run/init.bin (one
# step at lr 0 on loopback, --save-params), for DDP to start from them.
make_init() {
    local ep=$run/init.ep p
    timeout -k 5 120 bin/zps-server --listen 'tcp://127.0.0.1:*' --endpoint-file "$ep" \
        --workers 1 --steps 1 --lr 0 --momentum 0 --lr-schedule constant --model mlp:784-512-512-10 \
        --global-batch 128 >"$run/init-s.log" 2>&1 &
    p=$!
    for _ in $(seq 300); do [ -s "$ep" ] && break; sleep 0.1; done
    timeout -k 5 120 bin/zps-worker --coordinator "$(cat "$ep")" --save-params "$run/init.bin" \
        >"$run/init-w.log" 2>&1 || true
    wait "$p" || true
    [ -s "$run/init.bin" ]
}

# reach TAG: "seconds bytes epoch accuracy" of the first evaluation at or
# above the target; nothing if none.
reach() {
    awk -v g="$target" '$4 >= g {print; exit}' "$run/$1.evals"
}
# round_s TAG: the median seconds of an outer round (zps's step lines'
# step_ms) past the first 2.
round_s() {
    sed -n 's/.*"step_ms": *\([0-9.eE+-]*\).*/\1/p' "$run/$1/metrics.jsonl" 2>/dev/null |
        tail -n +3 | awk '{print $1 / 1000}' | median
}

# ---------------------------------------------------------------- the run

rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || rev="$rev+changes"
header="zps bench/diloco.sh: $(date -u +%Y-%m-%dT%H:%MZ), commit $rev, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg) at the start; $workers workers, $(if [ "$shard_host" = 1 ]; then echo "1 shard host"; else echo "a shard on each worker's host"; fi), every link $rate (tc tbf), target $target, cosine over $steps steps, median of $repeats run(s)"
command="bench/diloco.sh --only $only -r $rate -w $workers --target $target --steps $steps --repeats $repeats$(if [ "$shard_host" = 1 ]; then echo " --shard-host"; fi)"
if [ -n "$report" ]; then
    header=$(cat "$run/header")
    command=$(cat "$run/command")
else
    echo "$header" >"$run/header"
    echo "$command" >"$run/command"
fi
echo "$header"
start=$SECONDS
declare -A skip=()
for c in "${cases[@]}"; do
    if [ -n "$report" ]; then
        if [ -s "$run/$c-1.evals" ]; then
            for ((rep = 1; rep <= repeats; rep++)); do set_epochs "$c-$rep" "$(case_h "$c")"; done
        else
            skip[$c]="not in $run"
        fi
        continue
    fi
    case $c in
    ddp) [ "$have_torch" = 1 ] || skip[$c]="no torch for /usr/bin/python3 (apt-get install python3-torch)" ;;
    h* | slow-*) [ "$have_diloco" = 1 ] || skip[$c]="bin/zps-server has no --mode (DiLoCo is not built yet)" ;;
    esac
    if [ -n "${skip[$c]:-}" ]; then
        echo "SKIPPED: $c: ${skip[$c]}"
    fi
done
if [ -z "$report" ] && wants ddp && [ -z "${skip[ddp]:-}" ] && ! make_init; then
    skip[ddp]="could not write zps's initial parameters (see $run/init-*.log)"
    keep_logs=1
fi
for ((rep = 1; rep <= repeats; rep++)); do
    for c in "${cases[@]}"; do
        [ -z "$report" ] || break
        [ -z "${skip[$c]:-}" ] || continue
        note "$(case_name "$c"), run $rep of $repeats"
        if ! run_case "$c" "$rep"; then
            skip[$c]="FAILED (run $rep; logs kept in $run)"
            keep_logs=1
            continue
        fi
        set_epochs "$c-$rep" "$(case_h "$c")"
        r=$(reach "$c-$rep")
        note "   evaluations (s, bytes, epochs, accuracy): $(tr '\n' ';' <"$run/$c-$rep.evals")"
        note "   first at $target: ${r:-not reached}"
    done
done

# ---------------------------------------------------------------- figures

# fig CASE FIELD: the median over the repeats of FIELD (1 seconds, 2 bytes,
# 3 epochs) of the first evaluation at the target; nothing if a run missed it.
fig() {
    local rep v vs=()
    for ((rep = 1; rep <= repeats; rep++)); do
        v=$(reach "$1-$rep" 2>/dev/null | cut -d' ' -f"$2")
        [ -n "$v" ] || return 0
        vs+=("$v")
    done
    printf '%s\n' "${vs[@]}" | median
}
ran() { wants "$1" && [ -z "${skip[$1]:-}" ]; }
mb() { awk -v b="$1" 'BEGIN {printf "%.0f", b / 1e6}'; }
f2() { awk -v v="$1" 'BEGIN {printf "%.2f", v}'; }

: >"$run/rows"
row() { printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$run/rows"; }
sync_t='' sync_b=''
if ran sync; then
    sync_t=$(fig sync 1)
    sync_b=$(fig sync 2)
fi
for c in sync ddp h10 h50 h10-int8 h50-int8 h10-f4 h10-f4-int8 h10-f4-ov h10-f4-ov-int8; do
    wants "$c" || continue
    name=$(case_name "$c")
    if [ -n "${skip[$c]:-}" ]; then
        row "$name" "SKIPPED: ${skip[$c]}" "-" "-" "-" "-"
        continue
    fi
    t=$(fig "$c" 1)
    b=$(fig "$c" 2)
    e=$(fig "$c" 3)
    last=$(tail -n 1 "$run/$c-1.evals" | awk '{printf "%.4f (%d epochs)", $4, $3}')
    if [ -z "$t" ]; then
        row "$name" "not reached; last $last" "-" "-" "-" "-"
        continue
    fi
    what="$(f2 "$t") s, $(mb "$b") MB ($e epochs)"
    case $c in
    sync)
        row "$name" "$what" "-" "-" "reference" "-"
        ;;
    ddp)
        if [ -n "$sync_t" ]; then
            row "$name" "$what" "$(f2 "$(awk -v a="$sync_t" -v b="$t" 'BEGIN {print a / b}')") ×" \
                "$(awk -v a="$b" -v s="$sync_b" 'BEGIN {printf "%.3f", a / s}')" "-" "-"
        else
            row "$name" "$what" "-" "-" "-" "-"
        fi
        ;;
    h*)
        h=${c#h}
        h=${h%%-*}
        if [ -n "$sync_t" ]; then
            sp=$(awk -v a="$sync_t" -v b="$t" 'BEGIN {printf "%.2f", a / b}')
            br=$(awk -v a="$b" -v s="$sync_b" 'BEGIN {printf "%.4f", a / s}')
            ok=$(awk -v sp="$sp" -v br="$br" -v h="$h" 'BEGIN {print (sp >= 5 && br <= 1 / h) ? "met" : "not met"}')
            row "$name" "$what" "$sp ×" "$br (1/$h = $(awk -v h="$h" 'BEGIN {printf "%.4f", 1 / h}'))" \
                "≥ 5 × sooner, ≤ 1/$h of the bytes" "$ok"
        else
            row "$name" "$what" "-" "-" "≥ 5 × sooner, ≤ 1/$h of the bytes" "no sync run"
        fi
        ;;
    esac
done
# fname 10-f4-ov: "10, 4 fragments, overlap", for the rows.
fname() {
    local n=${1/-f4/, 4 fragments}
    echo "${n/-ov/, overlap}"
}
# Fragments: the payload bytes one worker pushes in one exchange (the
# metrics log's largest "bytes"), with 4 fragments against the whole model.
push_max() {
    sed -n 's/.*"bytes": *\([0-9]*\).*/\1/p' "$run/$1/metrics.jsonl" 2>/dev/null | sort -g | tail -n 1
}
for k in "" -int8; do
    if ! { ran "h10$k" && ran "h10-f4$k"; }; then continue; fi
    whole=$(push_max "h10$k-1") part=$(push_max "h10-f4$k-1")
    if [ -z "$whole" ] || [ -z "$part" ]; then continue; fi
    ratio=$(awk -v a="$part" -v b="$whole" 'BEGIN {printf "%.3f", a / b}')
    row "largest exchange: H=10${k/-/, }, 4 fragments against whole" \
        "$(awk -v a="$part" -v b="$whole" 'BEGIN {printf "%.2f MB against %.2f MB", a / 1e6, b / 1e6}') pushed by a worker at once" "-" "$ratio" \
        "≤ 0.3" "$(awk -v r="$ratio" 'BEGIN {print (r <= 0.3) ? "met" : "not met"}')"
done
# int8 against fp32: the accuracy at the last epoch both runs evaluated.
for h in 10 50 10-f4 10-f4-ov; do
    if ! { ran "h$h" && ran "h$h-int8"; }; then continue; fi
    d=$(awk 'NR == FNR {a[$3] = $4; next}
        ($3 in a) {e = $3; d = $4 - a[$3]; m = (d < 0 ? -d : d) > m ? (d < 0 ? -d : d) : m; k++}
        END {if (e != "") printf "%.4f %s %.4f %.4f %.4f %d\n", d, e, a[e], a[e] + d, m, k}' \
        "$run/h$h-1.evals" "$run/h$h-int8-1.evals")
    if [ -z "$d" ]; then
        row "DiLoCo H=$(fname "$h"), int8 against fp32" "no epoch evaluated by both" "-" "-" "within 0.005" "-"
        continue
    fi
    read -r diff ep fa ia dmax k <<<"$d"
    ok=$(awk -v d="$diff" 'BEGIN {print (d >= -0.005 && d <= 0.005) ? "met" : "not met"}')
    row "DiLoCo H=$(fname "$h"), int8 against fp32" "after $ep epochs: int8 $ia, fp32 $fa" "-" \
        "$diff (int8 - fp32); largest difference over the $k epochs both evaluated: $dmax" \
        "within 0.005 (0.5 points) at the last" "$ok"
done
# The slowed worker: seconds per outer round (with fragments, per step: a
# quarter round), auto against fixed H.
for h in 10 50 10-f4-ov; do
    fx=slow-h$h au=slow-auto${h#10}
    wants "$fx" || wants "$au" || continue
    if ! { ran "$fx" && ran "$au"; }; then
        row "worker 0 slowed 2x: auto against H=$(fname "$h")" "SKIPPED: ${skip[$fx]:-${skip[$au]:-not both asked for}}" "-" "-" "≥ 1.5 ×" "-"
        continue
    fi
    fs=() as=()
    for ((rep = 1; rep <= repeats; rep++)); do
        fs+=("$(round_s "$fx-$rep")")
        as+=("$(round_s "$au-$rep")")
    done
    fm=$(printf '%s\n' "${fs[@]}" | median)
    am=$(printf '%s\n' "${as[@]}" | median)
    per=round
    [[ $h != *-f4* ]] || per=step
    if [ -n "$fm" ] && [ -n "$am" ]; then
        sp=$(awk -v a="$fm" -v b="$am" 'BEGIN {printf "%.2f", a / b}')
        row "worker 0 slowed 2x: auto against H=$(fname "$h")" "auto $(awk -v v="$am" 'BEGIN {printf "%.3f", v}') s/$per, H=$(fname "$h") $(awk -v v="$fm" 'BEGIN {printf "%.3f", v}') s/$per" \
            "$sp × faster per $per" "-" "≥ 1.5 ×" "$(awk -v s="$sp" 'BEGIN {print (s >= 1.5) ? "met" : "not met"}')"
    else
        row "worker 0 slowed 2x: auto against H=$(fname "$h")" "FAILED: no step lines" "-" "-" "≥ 1.5 ×" "-"
    fi
    for c in "$fx" "$au"; do
        t=$(fig "$c" 1)
        b=$(fig "$c" 2)
        if [ -n "$t" ]; then
            row "$(case_name "$c")" "$(f2 "$t") s, $(mb "$b") MB ($(fig "$c" 3) epochs)" "-" "-" "-" "-"
        else
            row "$(case_name "$c")" "stopped at $(tail -n 1 "$run/$c-1.evals" | awk '{printf "%.4f after %s epochs (%.0f s, %.0f MB)", $4, $3, $1, $2 / 1e6}') (--slow-epochs $slow_epochs)" "-" "-" "-" "-"
        fi
    done
done

# Plot data: the first run of each case.
for c in "${cases[@]}"; do
    [ -s "$run/$c-1.evals" ] || continue
    { echo "# $(case_name "$c"): seconds bytes epoch test_accuracy"; cat "$run/$c-1.evals"; } >"$outdir/diloco-$c.tsv"
done
plots=''
if [ "$have_gnuplot" = 1 ] && ls "$outdir"/diloco-*.tsv >/dev/null 2>&1; then
    # diloco-time.svg, diloco-bytes.svg: every case but the slowed ones;
    # diloco-slow.svg: those, against time.
    for axis in time bytes slow; do
        set_=()
        for c in "${cases[@]}"; do
            [ -s "$outdir/diloco-$c.tsv" ] || continue
            case $axis:$c in
            slow:slow-* | time:[!s]* | bytes:[!s]* | time:sync | bytes:sync) set_+=("$c") ;;
            esac
        done
        [ ${#set_[@]} -gt 0 ] || continue
        {
            echo "set terminal svg size 720,440 dynamic font 'sans,12'"
            echo "set output '$outdir/diloco-$axis.svg'"
            echo "set key bottom right"
            echo "set grid"
            echo "set ylabel 'test accuracy'"
            echo "set yrange [0.7:0.92]"
            echo "set arrow from graph 0, first $target to graph 1, first $target nohead dashtype 2 lc rgb 'gray'"
            if [ "$axis" = bytes ]; then
                echo "set xlabel 'bytes on the wire (MB, log scale)'"
                echo "set logscale x"
                col="(\$2/1e6)" # gnuplot's column 2
            else
                echo "set xlabel 'wall time (s, log scale), $workers workers, every link $rate'"
                echo "set logscale x"
                col=1
            fi
            printf 'plot '
            sep=''
            for c in "${set_[@]}"; do
                printf "%s'%s' using %s:4 with linespoints title '%s'" "$sep" "$outdir/diloco-$c.tsv" "$col" "$(case_name "$c")"
                sep=', '
            done
            echo
        } >"$run/$axis.gp"
        if gnuplot "$run/$axis.gp"; then
            plots="$plots${plots:+, }$outdir/diloco-$axis.svg"
        else
            echo "bench/diloco.sh: gnuplot failed on $run/$axis.gp" >&2
        fi
    done
else
    echo "bench/diloco.sh: no plots (no gnuplot, or no run: apt-get install gnuplot-nox)" >&2
fi

{
    echo "$header"
    echo
    echo "| case | to $target: time, bytes | sync's time / this | bytes / sync's | target | met |"
    echo "|---|---|---|---|---|---|"
    awk -F'\t' '{ printf "|"; for (i = 1; i <= NF; i++) { gsub(/\|/, "\\|", $i); printf " %s |", $i } print "" }' "$run/rows"
    echo
    echo "Command: \`$command\`." \
        "Time from the launch of the processes; bytes: what every host sent (the hub's veth rx_bytes), headers included."
} >"$outdir/diloco.md"
echo
cat "$outdir/diloco.md"
[ -z "$md" ] || cp "$outdir/diloco.md" "$md"
[ -z "$plots" ] || echo "plots: $plots"
echo "$((SECONDS - start)) s"
