#!/usr/bin/env bash
# bench/gpu.sh - the GPU workers on a machine with an NVIDIA GPU, in under
# five minutes, with every result in one file:
#
#   1. the machine (nvidia-smi, nvcc) and a CUDA=1 build;
#   2. the GPU tests: the cuda unit suite (finite differences per layer, GPU
#      against CPU on the same batch, tensor-core modes) and the gpu
#      integration suite (a CPU and a GPU worker against one process);
#   3. the default job (MLP 784-512-512-10, Fashion-MNIST, batch 128,
#      10 epochs) on 2 cuda workers: accuracy, ms/step, network share;
#   4. a wide MLP, 8192-8192-8192-10 at batch 1024 on synthetic data, one
#      cuda worker, fp32, tf32, then bf16 GEMMs: ms/step, the GEMMs' TFLOP/s
#      against the card's peak, and the share of a step spent waiting on the
#      network (pushing gradients and waiting for parameters).
#
#   bench/gpu.sh [RESULTS_FILE]   (default: $OUT/gpu-results.txt if OUT is
#                                  set, else build/gpu-results.txt)
#
# Every stage runs under timeout and the whole script under a deadline
# (BUDGET_S, default 285 s); a stage that cannot fit is reported as skipped.
# A failed stage is reported and the script goes on; it exits non-zero if
# any stage failed.
#
# PREBUILT=1: no install and no build here; use bin/ and build/tests/ from
# bench/gpu-bundle.sh (a machine that cannot install Debian's packages),
# with its libraries (.gpu/lib) and data set (.gpu/fashion-mnist).
#
# Knobs, for a dry run of the script itself on a machine without a GPU
# (DEVICE=cpu WIDE_MODEL=mlp:512-512-512-10 WIDE_BATCH=128 EPOCHS=1):
# DEVICE (cuda), WIDE_MODEL, WIDE_BATCH (1024), WIDE_STEPS (15), EPOCHS (10).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

BUDGET_S=${BUDGET_S:-285}
DEVICE=${DEVICE:-cuda}
WIDE_MODEL=${WIDE_MODEL:-mlp:8192-8192-8192-10}
WIDE_BATCH=${WIDE_BATCH:-1024}
WIDE_STEPS=${WIDE_STEPS:-15}
EPOCHS=${EPOCHS:-10}
if [ $# -ge 1 ]; then
  results=$1
elif [ -n "${OUT:-}" ]; then
  results=$OUT/gpu-results.txt
else
  results=build/gpu-results.txt
fi
mkdir -p "$(dirname "$results")"
: >"$results"
run=$(mktemp -d "${TMPDIR:-/tmp}/zps-gpu-XXXXXX")
pids=()
failed=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
trap 'exit 130' INT TERM

say() { printf '%s\n' "$*" | tee -a "$results"; }
# Appends a file to the results, indented.
attach() { [ -f "$1" ] && sed 's/^/    /' "$1" >>"$results"; }
left() { echo $((BUDGET_S - SECONDS)); }
# Seconds a stage may take: its cap, or what is left of the budget.
allow() { local l; l=$(left); [ "$1" -lt "$l" ] && echo "$1" || echo "$l"; }
median() { sort -g | awk '{a[NR]=$1} END {if (NR) print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
wait_file() { for _ in $(seq 150); do [ -s "$1" ] && return 0; sleep 0.1; done; return 1; }

say "zps bench/gpu.sh: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), $(nproc) cores"
say "run directory: $run"

# ---------------------------------------------------------------- 1. machine and build
say ""
say "== machine"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=index,name,memory.total,driver_version,clocks.max.sm --format=csv \
    >"$run/smi.txt" 2>&1
  attach "$run/smi.txt"
  gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
else
  say "    no nvidia-smi"
  gpu_name=unknown
fi
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
nvcc=$(command -v nvcc || echo "$CUDA_HOME/bin/nvcc")
"$nvcc" --version 2>&1 | tail -n 2 | sed 's/^/    /' >>"$results"

# Peak dense TFLOP/s (fp32 | tf32 | bf16 tensor cores) from NVIDIA's data
# sheets, without sparsity; SXM parts unless named. Assumed, not measured.
peak_fp32=; peak_tf32=; peak_bf16=
case "$gpu_name" in
  *H200*NVL*|*H100*NVL*) peak_fp32=60;   peak_tf32=418;  peak_bf16=835 ;;
  *H200*|*H100*SXM*|*H100*HBM3*) peak_fp32=67; peak_tf32=495; peak_bf16=989 ;;  # GH200 too
  *H100*PCIe*)           peak_fp32=51;   peak_tf32=378;  peak_bf16=756 ;;
  *H100*)                peak_fp32=67;   peak_tf32=495;  peak_bf16=989 ;;
  *A100*)                peak_fp32=19.5; peak_tf32=156;  peak_bf16=312 ;;
  *L40S*)                peak_fp32=91.6; peak_tf32=183;  peak_bf16=362 ;;
  *L4*)                  peak_fp32=30.3; peak_tf32=60;   peak_bf16=121 ;;
  *A10*)                 peak_fp32=31.2; peak_tf32=62.5; peak_bf16=125 ;;
esac
say "    GPU: $gpu_name; assumed peak: fp32 ${peak_fp32:-?}, tf32 ${peak_tf32:-?}, bf16 ${peak_bf16:-?} TFLOP/s (dense, data sheet)"

say ""
if [ "${PREBUILT:-0}" = 1 ]; then
  say "== build: PREBUILT=1, carried from bench/gpu-bundle.sh (commit $(cut -c1-12 .gpu/commit 2>/dev/null))"
  for f in bin/zps-server bin/zps-worker bin/libzps_cuda.so build/tests/check_unit \
      build/tests/check_integration; do
    [ -f "$f" ] || { say "    missing $f: unpack the bundle first"; say "== gpu.sh: FAILED: build"; exit 1; }
  done
  export LD_LIBRARY_PATH=$PWD/.gpu/lib:$CUDA_HOME/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export ZPS_CUDA_PLUGIN=$PWD/bin/libzps_cuda.so
  if [ ! -d /usr/share/datasets/fashion-mnist ] && [ -d .gpu/fashion-mnist ]; then
    if ! { mkdir -p /usr/share/datasets && cp -r .gpu/fashion-mnist /usr/share/datasets/; } 2>/dev/null; then
      say "    could not place .gpu/fashion-mnist in /usr/share/datasets"
    fi
  fi
else
  say "== build (make CUDA=1)"
  # Missing Debian packages (and the Fashion-MNIST package) if the machine
  # can reach a mirror; a machine that cannot goes on with what it has.
  if ! timeout "$(allow 45)" bash deploy/install-deps.sh >"$run/deps.log" 2>&1; then
    say "    install-deps failed or timed out (offline?); going on with what is installed:"
    tail -n 3 "$run/deps.log" | sed 's/^/    /' >>"$results"
  fi
  t0=$SECONDS
  if timeout "$(allow 150)" make -j"$(nproc)" CUDA=1 all build/tests/check_unit \
      build/tests/check_integration >"$run/build.log" 2>&1; then
    say "    built in $((SECONDS - t0)) s: $(cd bin && echo *)"
  else
    say "    BUILD FAILED after $((SECONDS - t0)) s; the end of its log:"
    tail -n 25 "$run/build.log" | sed 's/^/    /' >>"$results"
    say "== gpu.sh: FAILED: build"
    exit 1
  fi
fi
if ! bin/zps-worker --check-device --device "$DEVICE" >"$run/check.log" 2>&1; then
  say "    zps-worker --check-device --device $DEVICE: no usable GPU:"
  attach "$run/check.log"
  say "== gpu.sh: FAILED: no GPU"
  exit 1
fi

# ---------------------------------------------------------------- 2. GPU tests
say ""
say "== GPU tests"
t=$(allow 100)
if CK_RUN_SUITE=cuda timeout "$t" build/tests/check_unit >"$run/unit.log" 2>&1; then
  say "    unit suite cuda: passed"
else
  say "    unit suite cuda: FAILED"
  failed+=("unit cuda")
fi
grep -E 'Checks|SKIPPED|gpu vs cpu|layer [0-9]|:[0-9]+:[EF]:' "$run/unit.log" | head -n 60 |
  sed 's/^/    /' >>"$results"
t=$(allow 120)
if [ "$t" -gt 20 ]; then
  if CK_RUN_SUITE=gpu ZPS_BIN_DIR=$PWD/bin timeout "$t" build/tests/check_integration \
      >"$run/integ.log" 2>&1; then
    say "    integration suite gpu: passed"
  else
    say "    integration suite gpu: FAILED"
    failed+=("integration gpu")
  fi
  grep -E 'Checks|SKIPPED|gpu:|:[0-9]+:[EF]:' "$run/integ.log" | head -n 20 |
    sed 's/^/    /' >>"$results"
else
  say "    integration suite gpu: SKIPPED (out of time)"
fi

# ---------------------------------------------------------------- jobs
# One job: a server and workers on loopback. Args: tag, seconds allowed,
# workers, then server flags, "--", worker flags. Leaves $run/<tag>.jsonl
# (metrics) and $run/<tag>-w<i>.log; returns non-zero if a process failed.
job() {
  local tag=$1 secs=$2 w=$3
  shift 3
  local sflags=() wflags=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do sflags+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  wflags=("$@")
  rm -f "$run/$tag.ep"
  timeout "$secs" bin/zps-server --listen 'tcp://127.0.0.1:*' --endpoint-file "$run/$tag.ep" \
    --workers "$w" --metrics-log "$run/$tag.jsonl" "${sflags[@]}" 2>"$run/$tag-s0.log" &
  pids=($!)
  wait_file "$run/$tag.ep" || { say "    $tag: the server did not start"; attach "$run/$tag-s0.log"; return 1; }
  local ep; ep=$(cat "$run/$tag.ep")
  for i in $(seq 0 $((w - 1))); do
    timeout "$secs" bin/zps-worker --coordinator "$ep" --timeout-ms 120000 "${wflags[@]}" \
      2>"$run/$tag-w$i.log" &
    pids+=($!)
  done
  local status=0
  for p in "${pids[@]}"; do wait "$p" || status=$?; done
  pids=()
  if [ "$status" -ne 0 ]; then
    say "    $tag: a process failed (exit $status; 124 is a timeout); the end of each log:"
    for f in "$run/$tag"-*.log; do say "    -- $(basename "$f")"; tail -n 4 "$f" | sed 's/^/    /' >>"$results"; done
  fi
  return "$status"
}

# Median step_ms of a job's metrics log after skipping the first `skip` steps.
step_ms() { grep '"step_ms"' "$run/$1.jsonl" | tail -n +"$(($2 + 1))" |
  sed 's/.*"step_ms":\([0-9.]*\).*/\1/' | median; }
# Mean share of the step the workers spent pushing and waiting (their timing line).
wait_share() { cat "$run/$1"-w*.log | sed -n 's/.*(\([0-9.]*\)% of the step).*/\1/p' |
  awk '{s+=$1} END {if (NR) printf "%.1f", s/NR; else print "?"}'; }
report_worker_lines() {
  grep -h -E 'timing:|GEMMs' "$run/$1"-w*.log | sed 's/^[^ ]* //; s/^/    /' >>"$results"
}

# ---------------------------------------------------------------- 3. default job
say ""
say "== default job on 2 $DEVICE workers (MLP 784-512-512-10, batch 128, $EPOCHS epochs)"
dataset=()
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
  say "    no Fashion-MNIST (/usr/share/datasets/fashion-mnist): synthetic:60000 of 784 features instead"
  dataset=(--dataset synthetic:60000)
fi
t=$(allow 120)
if [ "$t" -gt 20 ]; then
  t0=$SECONDS
  if job default "$t" 2 --epochs "$EPOCHS" "${dataset[@]}" -- --device "$DEVICE"; then
    acc=$(grep '"test_accuracy"' "$run/default.jsonl" | tail -n 1 |
      sed 's/.*"test_accuracy":\([0-9.]*\).*/\1/')
    steps=$(grep -c '"step_ms"' "$run/default.jsonl")
    say "    $steps steps in $((SECONDS - t0)) s: median $(step_ms default 50) ms/step," \
        "network share $(wait_share default)%, final test accuracy $acc"
    report_worker_lines default
  else
    failed+=("default job")
  fi
else
  say "    SKIPPED (out of time)"
fi

# ---------------------------------------------------------------- 4. wide MLP
# GEMM FLOPs of one step at batch n: forward 2*n*in*out per layer, dW the
# same, dX the same for every layer but the first: for 8192-8192-8192-10 at
# 1024, 0.688 TFLOP. The worker's plugin times each GEMM with CUDA events
# and logs ms/step and TFLOP/s when it exits.
wide() {
  local tag=$1 math=$2 peak=$3 steps=$4
  say ""
  say "== wide MLP ${WIDE_MODEL#mlp:}, batch $WIDE_BATCH, synthetic data, 1 $DEVICE worker, --gpu-math $math"
  local t; t=$(allow 110)
  if [ "$t" -lt 40 ]; then
    say "    SKIPPED (out of time)"
    return 0
  fi
  if job "$tag" "$t" 1 --model "$WIDE_MODEL" --dataset synthetic:$((16 * WIDE_BATCH)) \
      --global-batch "$WIDE_BATCH" --steps "$steps" --lr 0.01 -- --device "$DEVICE" \
      --gpu-math "$math"; then
    local tf; tf=$(sed -n 's/.*GEMMs.* \([0-9.]*\) TFLOP\/s.*/\1/p' "$run/$tag"-w0.log | tail -n 1)
    local share="?"
    [ -n "$peak" ] && [ -n "$tf" ] && share=$(awk -v a="$tf" -v p="$peak" 'BEGIN {printf "%.0f", 100 * a / p}')
    say "    $steps steps: median $(step_ms "$tag" 3) ms/step (first 3 skipped); GEMMs ${tf:-?} TFLOP/s" \
        "= ${share}% of the assumed ${peak:-?} TFLOP/s peak; network share $(wait_share "$tag")%"
    report_worker_lines "$tag"
  else
    failed+=("wide $math")
  fi
}
wide wide-fp32 fp32 "$peak_fp32" "$WIDE_STEPS"
wide wide-tf32 tf32 "$peak_tf32" "$WIDE_STEPS"
wide wide-bf16 bf16 "$peak_bf16" "$WIDE_STEPS"

say ""
if [ ${#failed[@]} -ne 0 ]; then
  say "== gpu.sh: FAILED: ${failed[*]} ($SECONDS s; logs in $run)"
  exit 1
fi
say "== gpu.sh: passed in $SECONDS s (logs in $run)"
