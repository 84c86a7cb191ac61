#!/usr/bin/env bash
# shellcheck disable=SC2317 # the functions the trap and wait_for call
# deploy/slurm/zps.sbatch under a real Slurm (make test-long; about 1 minute):
#   1. starts a one-node cluster from Debian's packages, everything in a
#      temporary directory: munged with its own key and socket, slurmctld
#      and slurmd as root with -f on a slurm.conf of their own (the node
#      declares 4 CPUs whatever the machine has: config_overrides);
#   2. submits zps.sbatch (1 node, 3 tasks: shard 0 and 2 CPU workers,
#      --deterministic --micro-batch 8, a checkpoint every 50 steps) and
#      lets it run to the end: the reference;
#   3. submits the same job again, requeues it (scontrol requeue) once its
#      checkpoint of step 150 exists (after its first evaluation), starts
#      it again at once (Slurm would wait ~2 min: StartTime=now), and waits
#      for it to finish; shard 0 must have resumed at step 150 or later;
#   4. the workers' final parameters (ZPS_SLURM_PARAMS_DIR) must be bitwise
#      equal to the reference's, and every test accuracy the requeued job
#      printed (log and metrics log, from either start) the reference's for
#      that epoch.
# Every wait is bounded; each daemon is stopped by its pid at the end. It
# skips (exit 77, "SKIPPED: why") when not root or without the packages.
set -euo pipefail
# shellcheck source=tests/deploy/lib.sh
source "$(dirname "$0")/lib.sh"

[ "$(id -u)" -eq 0 ] || skip "not root: munged, slurmctld and slurmd run as root here"
for c in munged slurmctld slurmd sbatch scontrol squeue srun; do
  command -v "$c" >/dev/null ||
    skip "no $c (HINT: apt-get install slurm-wlm munge, or deploy/install-deps.sh --long)"
done
need_bins

tmp=$(mktemp -d "${TMPDIR:-/tmp}/zps-test-slurm-rq-XXXXXX")
chmod 755 "$tmp"
daemons=() # "name pid", stopped last first
jobs_=()   # Slurm job ids, cancelled at the end
cleanup() {
  local j i name pid left
  # The jobs first (their tasks are slurmstepd's, not ours), while the
  # daemons run: cancelled, then gone from the queue within 15 s.
  if [ ${#jobs_[@]} -gt 0 ]; then
    for j in "${jobs_[@]}"; do timeout 10 scancel "$j" 2>/dev/null || true; done
    for _ in $(seq 75); do
      [ -n "$(timeout 5 squeue -h -j "$(IFS=,; echo "${jobs_[*]}")" 2>/dev/null)" ] || break
      sleep 0.2
    done
  fi
  for ((i = ${#daemons[@]} - 1; i >= 0; i--)); do
    read -r name pid <<<"${daemons[i]}"
    kill -TERM "$pid" 2>/dev/null || continue
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "  $name (pid $pid) ignored SIGTERM for 5 s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
  done
  # What outlived its daemon: a job's process (its command line names
  # $tmp) or a slurmstepd of this cluster (its environment does).
  left=$(pgrep -f -- "$tmp/" || true)
  for pid in $(pgrep -x slurmstepd || true); do
    if grep -qF -- "$tmp/" "/proc/$pid/environ" 2>/dev/null; then left+=" $pid"; fi
  done
  if [ -n "$left" ]; then
    echo "  processes left: $(tr '\n' ' ' <<<"$left") (SIGKILL)"
    # shellcheck disable=SC2086 # one pid a word
    kill -KILL $left 2>/dev/null || true
  fi
  if [ "${KEEP:-0}" = 1 ]; then echo "  kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'exit 143' TERM INT # (run.sh's timeout): the cleanup still runs

# wait_for SECONDS WHAT CMD...: polls CMD every 0.1 s; fails the test (and
# ends it) when it is still false after SECONDS.
wait_for() {
  local limit=$1 what=$2 end
  shift 2
  end=$(($(date +%s%N) + limit * 1000000000))
  until "$@"; do
    if [ "$(date +%s%N)" -gt "$end" ]; then
      fail "$what within $limit s"
      dump_logs
      finish
    fi
    sleep 0.1
  done
}
dump_logs() {
  local f
  for f in "$tmp"/*.log "$tmp"/*.out; do
    [ -e "$f" ] || continue
    echo "    --- $f (last 15 lines)"
    tail -n 15 "$f" | sed 's/^/    /'
  done
}
# free_ports N: N different TCP ports nothing listens on (connecting to a
# closed port fails), on one line. Below the kernel's ephemeral range: a
# port there may be the local end of some connection (thousands after the
# swarm suite, in TIME_WAIT), and slurmctld's bind then fails though
# nothing listens.
free_ports() {
  local p got=() eph_lo
  read -r eph_lo _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || eph_lo=32768
  [ "$eph_lo" -gt 12000 ] || eph_lo=32768
  for _ in $(seq 100); do
    [ ${#got[@]} -lt "$1" ] || break
    p=$((10000 + RANDOM % (eph_lo - 10000)))
    [[ " ${got[*]} " != *" $p "* ]] || continue
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then got+=("$p"); fi
  done
  echo "${got[*]}"
}
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

echo "a one-node Slurm in $tmp"
# munge: a key of our own, its socket, pid, log and seed in $tmp.
dd if=/dev/urandom of="$tmp/munge.key" bs=1024 count=1 status=none
chmod 600 "$tmp/munge.key"
# Each daemon in a session of its own: a signal to this test's process
# group (run.sh's timeout) leaves them to the cleanup, which stops the
# jobs first. (setsid execs: $! is the daemon.)
setsid munged -F --key-file="$tmp/munge.key" --socket="$tmp/munge.sock" --pid-file="$tmp/munged.pid" \
  --log-file="$tmp/munged.log" --seed-file="$tmp/munged.seed" >"$tmp/munged.out" 2>&1 &
daemons+=("munged $!")
wait_for 10 "munged listens on $tmp/munge.sock" test -S "$tmp/munge.sock"

node=$(hostname -s)
getent ahostsv4 "$node" >/dev/null || skip "this host's name $node does not resolve"
read -r ctld_port slurmd_port zps_port <<<"$(free_ports 3)"
[ -n "$zps_port" ] || { fail "no three free ports"; finish; }
mkdir -p "$tmp/ctld" "$tmp/spool"
: >"$tmp/plugstack.conf"
cat >"$tmp/slurm.conf" <<EOF
ClusterName=zpstest
SlurmctldHost=$node(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
AuthInfo=socket=$tmp/munge.sock
CredType=cred/munge
StateSaveLocation=$tmp/ctld
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdLogFile=$tmp/slurmd.log
PlugStackConfig=$tmp/plugstack.conf
ProctrackType=proctrack/pgid
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
KillWait=5
MinJobAge=600
MailProg=/bin/true
SlurmdParameters=config_overrides
NodeName=$node NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=zps Nodes=$node Default=YES MaxTime=10 State=UP
EOF
export SLURM_CONF=$tmp/slurm.conf
setsid slurmctld -D -c -f "$SLURM_CONF" >"$tmp/slurmctld.out" 2>&1 &
daemons+=("slurmctld $!")
wait_for 20 "slurmctld answers scontrol ping" bash -c 'scontrol ping 2>/dev/null | grep -q UP'
setsid slurmd -D -f "$SLURM_CONF" >"$tmp/slurmd.out" 2>&1 &
daemons+=("slurmd $!")
node_idle() { [[ $(sinfo -h -n "$node" -o %T 2>/dev/null) == idle* ]]; }
wait_for 20 "node $node idle" node_idle

# job_field JOBID FIELD: the field of scontrol show job (JobState, Restarts, ...).
job_field() {
  scontrol -o show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p"
}
job_in() { [[ " ${*:2} " == *" $(job_field "$1" JobState) "* ]]; }

# submit NAME: zps.sbatch with the job below, its files under $tmp/NAME*;
# prints the job id. 3 tasks: shard 0 and 2 workers on the one node.
steps=468 # 4 epochs of Fashion-MNIST at 512 a step (117 a step's epoch)
submit() {
  local name=$1
  ZPS_ROOT=$root ZPS_BIN_DIR=$bin ZPS_SLURM_SERVER_NODES=0 ZPS_SLURM_PORT=$zps_port \
    ZPS_SLURM_CHECKPOINT_DIR=$tmp/$name-ckpt ZPS_SLURM_PARAMS_DIR=$tmp/$name-params \
    ZPS_SLURM_WORKER_FLAGS="--cache-dir $tmp/cache --slowdown 15" \
    sbatch --parsable --nodes=1 --ntasks-per-node=3 --time=5 --chdir="$tmp" \
    --output="$tmp/$name.out" "$root/deploy/slurm/zps.sbatch" -- \
    --model mlp:784-128-10 --global-batch 512 --steps "$steps" --deterministic --micro-batch 8 \
    --checkpoint-every 50 --metrics-log "$tmp/$name-metrics.jsonl"
}

echo "the reference: zps.sbatch run to the end"
ref=$(submit ref) || { fail "sbatch"; finish; }
jobs_+=("$ref")
start=$(now)
wait_for 120 "reference job $ref completes" job_in "$ref" COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL
expect_eq "the reference job completed" "$(job_field "$ref" JobState) $(job_field "$ref" ExitCode)" \
  "COMPLETED 0:0"
echo "  reference: $(secs "$start" "$(now)") s from submission to the end"

echo "the requeued job: requeued past its checkpoint of step 150"
rq=$(submit rq) || { fail "sbatch"; finish; }
jobs_+=("$rq")
wait_for 120 "job $rq writes its checkpoint of step 150" \
  test -e "$tmp/rq-ckpt/shard-0/shard-0-step-150.ckpt"
t_requeue=$(now)
scontrol requeue "$rq"
wait_for 60 "job $rq back in the queue" job_in "$rq" PENDING
t_pending=$(now)
# The metrics log (appended to on a resume): a line per step, one per evaluation.
step_lines() { grep -c '^{"step"' "$tmp/rq-metrics.jsonl" || true; }
done_steps=$(step_lines)
echo "  requeued after $done_steps steps; pending $(secs "$t_requeue" "$t_pending") s later, $(job_field "$rq" Reason), begin $(job_field "$rq" StartTime)"
# Slurm holds a requeued job back for a while (its begin time): now.
scontrol update JobId="$rq" StartTime=now
wait_for 60 "job $rq runs again" job_in "$rq" RUNNING COMPLETING COMPLETED
t_running=$(now)
more_steps() { [ "$(step_lines)" -gt "$done_steps" ]; }
wait_for 60 "job $rq takes a step after its resume" more_steps
t_step=$(now)
wait_for 120 "requeued job $rq completes" job_in "$rq" COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL
expect_eq "the requeued job completed" "$(job_field "$rq" JobState) $(job_field "$rq" ExitCode)" \
  "COMPLETED 0:0"
expect_eq "Slurm counted one requeue" "$(job_field "$rq" Restarts)" 1
echo "  resume: requeue to pending $(secs "$t_requeue" "$t_pending") s, StartTime=now to running $(secs "$t_pending" "$t_running") s, to its first step $(secs "$t_running" "$t_step") s; requeue to first step $(secs "$t_requeue" "$t_step") s"

echo "checks"
out=$(cat "$tmp/rq.out")
expect_match "the output keeps both starts, the second said to be a resume" "$out" \
  ": first start, no checkpoint in .* start 2 \\(requeued 1 time\\(s\\)\\), a resume from the checkpoints in $tmp/rq-ckpt/shard-0"
# One resume, of the newest checkpoint: also the one written as the
# workers' BYEs came in (a state with no live member resumes too).
resumed=$(grep -o 'resumed at step [0-9]*' <<<"$out" | tail -1 | grep -o '[0-9]*$' || true)
if grep -q 'cannot be resumed' <<<"$out"; then
  fail "shard 0 passed over a checkpoint: $(grep -m1 'cannot be resumed' <<<"$out")"
fi
if [ -n "$resumed" ] && [ "$resumed" -ge 150 ] && [ "$resumed" -lt "$steps" ]; then
  pass "shard 0 resumed at step $resumed (its checkpoint of step 150 or the one it wrote on SIGTERM)"
else
  fail "shard 0 resumed at step '$resumed', not between 150 and $steps"
fi
for f in "$tmp"/ref-params/worker-*.bin; do
  w=$(basename "$f")
  if cmp -s "$f" "$tmp/rq-params/$w"; then
    pass "$w: the requeued job's final parameters bitwise equal the reference's ($(stat -c %s "$f") bytes)"
  else
    fail "$w: the requeued job's final parameters differ from the reference's"
  fi
done
expect_eq "two workers saved their parameters in each job" \
  "$(find "$tmp/ref-params" "$tmp/rq-params" -name 'worker-*.bin' | wc -l)" 4
# "epoch E: test accuracy A, test loss L" lines, by epoch.
acc() { grep -o 'epoch [0-9]*: test accuracy .*' "$1" | sort -u; }
echo "  test accuracy, reference | requeued (each line once):"
paste -d'|' <(acc "$tmp/ref.out") <(acc "$tmp/rq.out") | sed 's/^/    /'
expect_eq "every evaluation of the requeued job is the reference's" \
  "$(acc "$tmp/rq.out")" "$(acc "$tmp/ref.out")"
expect_eq "the reference evaluated each of its 4 epochs" "$(acc "$tmp/ref.out" | wc -l)" 4
# The same in the metrics logs, to 6 digits: {"epoch":E,"test_accuracy":A,"test_loss":L}.
evals() { grep '^{"epoch"' "$1" | sort -u; }
expect_eq "every evaluation in the requeued job's metrics log is the reference's" \
  "$(evals "$tmp/rq-metrics.jsonl")" "$(evals "$tmp/ref-metrics.jsonl")"
[ "$failures" -eq 0 ] || dump_logs
finish
