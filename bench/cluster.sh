#!/usr/bin/env bash
# bench/cluster.sh - where a parameter server should win: separate hosts,
# each behind a link of the same rate. W workers and S shards each on a
# host of its own (deploy/netns-cluster.sh: network namespaces, tc tbf on
# every link, both ways), training flat:P (a model whose gradient costs
# nothing, so a step is the synchronization alone); then PyTorch's gloo
# all_reduce of the same P floats across W hosts with the same links.
#
#   sudo bench/cluster.sh [-r RATE] [-p FLOATS] [-w W] [-s S] [-n STEPS] [-b BYTES]
#     defaults: -r 1gbit -p 16777216 -w 4 -s 4 -n 12 -b 32768
#
# zps runs three times: with its default flags (--sndbuf auto, each
# connection's buffer tuned from its round trips), with the OS's TCP send
# buffers (--sndbuf 0), and with --sndbuf BYTES on every shard and worker
# (small buffers keep the W flows into a shard's link and the S flows out
# of a worker's fair; docs/running.md, "Send buffers on shared links").
#
# Lower bound for the parameter server: each worker's link carries its
# gradient out and the parameters in, 4P bytes each way at once, so a step
# takes at least 4P bytes / RATE; each shard's link carries the same (W
# slices of P/S in, W out). A ring all-reduce sends 2(W-1)/W x 4P bytes
# each way per host. Needs root, and python3-torch for the baseline
# (a benchmark-only dependency: apt-get install python3-torch).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
rate=1gbit floats=16777216 workers=4 shards=4 steps=12 sndbuf=32768
while [ $# -gt 0 ]; do
  case "$1" in
    -r) rate=$2; shift 2 ;;
    -p) floats=$2; shift 2 ;;
    -w) workers=$2; shift 2 ;;
    -s) shards=$2; shift 2 ;;
    -n) steps=$2; shift 2 ;;
    -b) sndbuf=$2; shift 2 ;;
    *) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
done
out=$(mktemp -d "${TMPDIR:-/tmp}/zps-bench-cluster-XXXXXX")
bits_per_s() { # 1gbit, 200mbit, 500kbit -> bits per second
  awk -v r="$1" 'BEGIN { n = r + 0; u = tolower(r); sub(/^[0-9.]+/, "", u);
    m = u == "gbit" ? 1e9 : u == "mbit" ? 1e6 : u == "kbit" ? 1e3 : 1; print n * m }'
}
bps=$(bits_per_s "$rate")

# One zps run; prints the median step in seconds over the steps after the
# first two (connections warm). Args: tag, then flags for every host.
zps_run() {
  local tag=$1 flags=${2:-}
  "$here/deploy/netns-cluster.sh" -s "$shards" -w "$workers" -r "$rate" -o "$out/$tag" -t 600 \
    -S "$flags" -W "$flags" \
    -- --model "flat:$floats" --dataset synthetic:1024 --global-batch $((workers * 8)) \
    --steps "$steps" --lr-schedule constant >/dev/null
  awk -F'"step_ms":' '/"step":/ { split($2, a, /[,}]/); s = $0; sub(/.*"step":/, "", s);
    if (s + 0 >= 2) print a[1] / 1000 }' "$out/$tag/metrics.jsonl" | sort -g |
    awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}
echo "== zps: $workers workers, $shards shards, flat:$floats fp32, every link $rate (default flags: --sndbuf auto)"
zps_auto=$(zps_run zps)
echo "== zps again with the OS's send buffers (--sndbuf 0)"
zps_os=$(zps_run zps-os "--sndbuf 0")
echo "== zps again with --sndbuf $sndbuf"
zps_s=$(zps_run zps-sndbuf "--sndbuf $sndbuf")

gloo_s=NA
if /usr/bin/python3 -c "import torch.distributed" 2>/dev/null; then
  echo "== gloo: all_reduce of $floats floats over $workers hosts, every link $rate"
  "$here/deploy/netns-cluster.sh" -s 0 -w "$workers" -r "$rate" -o "$out/gloo" -t 600 \
    -x "/usr/bin/python3 $here/bench/gloo_allreduce.py $floats $((steps - 2))" >/dev/null
  cat "$out/gloo/w0.log"
  gloo_s=$(sed -n 's/.*median \([0-9.]*\) s.*/\1/p' "$out/gloo/w0.log")
else
  echo "SKIPPED: gloo baseline: python3-torch is not installed (apt-get install python3-torch)"
fi

echo "zps with default flags / with --sndbuf $sndbuf: $(awk -v a="$zps_auto" -v b="$zps_s" 'BEGIN { printf "%.2f", a / b }')"
bound=$(awk -v p="$floats" -v b="$bps" 'BEGIN { printf "%.4f", 4 * p * 8 / b }')
ring=$(awk -v p="$floats" -v b="$bps" -v w="$workers" 'BEGIN { printf "%.4f", 2 * (w - 1) / w * 4 * p * 8 / b }')
echo
echo "| | seconds per step | vs link bound |"
echo "|---|---|---|"
echo "| link bound, parameter server (4P bytes / rate) | $bound | 1.00 |"
echo "| link bound, ring all-reduce (2(W-1)/W x 4P bytes / rate) | $ring | $(awk -v a="$ring" -v b="$bound" 'BEGIN { printf "%.2f", a / b }') |"
echo "| zps, W=$workers S=$shards, default flags (--sndbuf auto) | $zps_auto | $(awk -v a="$zps_auto" -v b="$bound" 'BEGIN { printf "%.2f", a / b }') |"
echo "| zps, W=$workers S=$shards, the OS's send buffers (--sndbuf 0) | $zps_os | $(awk -v a="$zps_os" -v b="$bound" 'BEGIN { printf "%.2f", a / b }') |"
echo "| zps, W=$workers S=$shards, --sndbuf $sndbuf | $zps_s | $(awk -v a="$zps_s" -v b="$bound" 'BEGIN { printf "%.2f", a / b }') |"
if [ "$gloo_s" != NA ]; then
  echo "| gloo all_reduce, W=$workers | $gloo_s | $(awk -v a="$gloo_s" -v b="$bound" 'BEGIN { printf "%.2f", a / b }') |"
  echo
  echo "with default flags: zps / gloo = $(awk -v a="$zps_auto" -v b="$gloo_s" 'BEGIN { printf "%.2f", a / b }') (target <= 0.8);" \
       "zps / bound = $(awk -v a="$zps_auto" -v b="$bound" 'BEGIN { printf "%.2f", a / b }') (target <= 1.15)"
fi
echo "logs: $out"
