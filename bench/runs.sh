#!/usr/bin/env bash
# bench/runs.sh - the shell helpers of the benches that run jobs of real
# processes and compare cases (bench/torch.sh, bench/gpt.sh), sourced by
# them: medians, ratios, bounded waits, and a failed case's logs. The
# sourcing script sets run (its scratch directory, where each case <tag>
# writes <tag>.* logs) and pids (the processes of the case running).
# shellcheck disable=SC2154 # run and pids: the sourcing script's

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
wait_file() { for _ in $(seq 100); do [ -s "$1" ] && return 0; sleep 0.1; done; return 1; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a / b}'; }

# A case failed, or printed nothing to parse: show its logs and stop.
fail() {
  echo "bench/${0##*/}: $1 failed; its logs:" >&2
  for f in "$run/$1".*; do echo "== ${f##*/}" >&2; tail -n 20 "$f" >&2; done
  exit 1
}
# Every process runs under timeout, so these waits are bounded; the first
# to fail fails the case at once (the exit kills the others), rather than
# leaving a server to wait out its timeout for workers that died.
wait_all() {
  local done_pid left=("${pids[@]}")
  while [ "${#left[@]}" -gt 0 ]; do
    wait -n -p done_pid "${left[@]}" || fail "$1"
    mapfile -t left < <(printf '%s\n' "${left[@]}" | grep -vx "$done_pid")
  done
  pids=()
}
# The largest number the sed pattern $2 (one group) finds in the files $3...
# of case $1, or fail it.
parse() {
  local tag=$1 pat=$2 v; shift 2
  v=$(cat "$@" | sed -n "s/$pat/\\1/p" | sort -g | tail -n 1)
  [ -n "$v" ] || fail "$tag"
  echo "$v"
}
