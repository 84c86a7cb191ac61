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
#   sudo bench/cluster.sh -H HOSTS [-g G] [-r RATE] [-p FLOATS] [-s S] [-n STEPS]
#     co-located: HOSTS hosts of G workers each (default 2), shard I on host I
#     (netns-cluster.sh -H -g -c; -s defaults to HOSTS); the issue's setup is
#     -H 4 -g 2 (-r 1gbit -p 16777216, 4 shards)
#
# zps runs three times: with its default flags (--sndbuf auto, each
# connection's buffer tuned from its round trips), with the OS's TCP send
# buffers (--sndbuf 0), and with --sndbuf BYTES on every shard and worker
# (small buffers keep the W flows into a shard's link and the S flows out
# of a worker's fair; docs/running.md, "Send buffers on shared links").
#
# With -H, zps runs three times: with its default flags (one push per
# host: a host's workers combine their gradients, one leader pushes for
# the host), with $ZPS_NO_AGG_FLAGS (default --host-aggregate off) added
# to the job's flags (shard 0's), skipped if zps-server --help does not
# mention host-aggregate, and with --wire-code zstd (the leaders' pushes
# and the answers to them coded losslessly), skipped if it does not
# mention wire-code; then gloo all_reduce over HOSTS x G ranks, G on each
# host sharing its link as the host's G workers do. Targets: zps / gloo
# <= 0.8, zps / zps without host aggregation <= 0.6.
#
# Lower bound for the parameter server: each worker's link carries its
# gradient out and the parameters in, 4P bytes each way at once, so a step
# takes at least 4P bytes / RATE; each shard's link carries the same (W
# slices of P/S in, W out). A ring all-reduce sends 2(W-1)/W x 4P bytes
# each way per host. Needs root, and python3-torch for the baseline
# (a benchmark-only dependency: apt-get install python3-torch).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${ZPS_BIN_DIR:-$here/bin}
rate=1gbit floats=16777216 workers=4 shards='' steps=12 sndbuf=32768 nhosts='' per_host=2
while [ $# -gt 0 ]; do
  case "$1" in
    -r) rate=$2; shift 2 ;;
    -p) floats=$2; shift 2 ;;
    -w) workers=$2; shift 2 ;;
    -s) shards=$2; shift 2 ;;
    -n) steps=$2; shift 2 ;;
    -b) sndbuf=$2; shift 2 ;;
    -H) nhosts=$2; shift 2 ;;
    -g) per_host=$2; shift 2 ;;
    *) sed -n '2,35p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
done
if [ -n "$nhosts" ]; then
  workers=$((nhosts * per_host))
  shards=${shards:-$nhosts}
  layout=(-H "$nhosts" -g "$per_host" -c)
else
  shards=${shards:-4}
  layout=(-w "$workers")
fi
out=$(mktemp -d "${TMPDIR:-/tmp}/zps-bench-cluster-XXXXXX")
bits_per_s() { # 1gbit, 200mbit, 500kbit -> bits per second
  awk -v r="$1" 'BEGIN { n = r + 0; u = tolower(r); sub(/^[0-9.]+/, "", u);
    m = u == "gbit" ? 1e9 : u == "mbit" ? 1e6 : u == "kbit" ? 1e3 : 1; print n * m }'
}
bps=$(bits_per_s "$rate")
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

# One zps run; prints the median step in seconds over the steps after the
# first two (connections warm). Args: tag, flags for every host, then
# flags for the job (shard 0's).
zps_run() {
  local tag=$1 flags=${2:-}
  shift 2
  "$here/deploy/netns-cluster.sh" -s "$shards" "${layout[@]}" -r "$rate" -o "$out/$tag" -t 600 \
    -S "$flags" -W "$flags" \
    -- --model "flat:$floats" --dataset synthetic:1024 --global-batch $((workers * 8)) \
    --steps "$steps" --lr-schedule constant "$@" >/dev/null
  awk -F'"step_ms":' '/"step":/ { split($2, a, /[,}]/); s = $0; sub(/.*"step":/, "", s);
    if (s + 0 >= 2) print a[1] / 1000 }' "$out/$tag/metrics.jsonl" | sort -g |
    awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}

# gloo all_reduce of the same floats over the worker hosts' links; prints
# the median seconds (rank 0's line goes to stderr), NA without torch.
gloo_run() {
  local log
  if ! /usr/bin/python3 -c "import torch.distributed" 2>/dev/null; then
    echo "SKIPPED: gloo baseline: python3-torch is not installed (apt-get install python3-torch)" >&2
    echo NA
    return
  fi
  if [ -n "$nhosts" ]; then log=h0w0.log; else log=w0.log; fi
  "$here/deploy/netns-cluster.sh" -s 0 "${layout[@]}" -r "$rate" -o "$out/gloo" -t 600 \
    -x "/usr/bin/python3 $here/bench/gloo_allreduce.py $floats $((steps - 2))" >/dev/null
  grep -v '^netns-cluster:' "$out/gloo/$log" >&2
  sed -n 's/.*median \([0-9.]*\) s.*/\1/p' "$out/gloo/$log"
}

if [ -n "$nhosts" ]; then
  no_agg_flags=${ZPS_NO_AGG_FLAGS---host-aggregate off}
  where="$nhosts hosts x $per_host workers, $shards shards on the worker hosts"
  echo "== zps: $where, flat:$floats fp32, every link $rate (default flags)"
  zps_s=$(zps_run zps '')
  zps_noagg=NA
  help=$("$bin/zps-server" --help 2>&1 || true)
  if [[ $help == *host-aggregate* ]]; then
    echo "== zps again without host aggregation ($no_agg_flags)"
    # shellcheck disable=SC2086 # no_agg_flags is a list of flags
    zps_noagg=$(zps_run zps-noagg '' $no_agg_flags)
  else
    echo "SKIPPED: zps without host aggregation: $bin/zps-server --help does not mention host-aggregate"
  fi
  zps_coded=NA
  if [[ $help == *wire-code* ]]; then
    echo "== zps again with --wire-code zstd"
    zps_coded=$(zps_run zps-coded '' --wire-code zstd)
  else
    echo "SKIPPED: zps with --wire-code zstd: $bin/zps-server --help does not mention wire-code"
  fi
  echo "== gloo: all_reduce of $floats floats over $workers ranks ($nhosts hosts x $per_host), every link $rate"
  gloo_s=$(gloo_run)
  echo
  echo "| | seconds per step | vs gloo |"
  echo "|---|---|---|"
  row() { # label, seconds
    local v=NA
    if [ "$2" != NA ] && [ "$gloo_s" != NA ]; then v=$(ratio "$2" "$gloo_s"); fi
    echo "| $1 | $2 | $v |"
  }
  row "zps, ${nhosts}x$per_host, $shards shards on the worker hosts" "$zps_s"
  row "zps without host aggregation ($no_agg_flags)" "$zps_noagg"
  row "zps --wire-code zstd (lossless: the same bits)" "$zps_coded"
  row "gloo all_reduce, ${nhosts}x$per_host ranks" "$gloo_s"
  # What each must move through a host's link, each way: with one push per
  # host its leader's pushes to the other hosts' shards and its shard's
  # answers to their leaders, 2 (H-1)/H x 4P; without, G times that; a
  # ring over ranks in host order (torchrun's) crosses a host's link once,
  # 2 (W-1)/W x 4P.
  bound() { awk -v k="$1" -v p="$floats" -v b="$bps" 'BEGIN { printf "%.4f", k * 4 * p * 8 / b }'; }
  b_agg=$(bound "$(awk -v h="$nhosts" 'BEGIN { print 2 * (h - 1) / h }')")
  b_plain=$(bound "$(awk -v h="$nhosts" -v g="$per_host" 'BEGIN { print 2 * g * (h - 1) / h }')")
  b_ring=$(bound "$(awk -v w="$workers" 'BEGIN { print 2 * (w - 1) / w }')")
  row "link bound, one push per host (2(H-1)/H x 4P / rate)" "$b_agg"
  row "link bound, a push per worker (2G(H-1)/H x 4P / rate)" "$b_plain"
  row "link bound, ring in host order (2(W-1)/W x 4P / rate)" "$b_ring"
  echo
  noagg_b=NA gloo_b=NA
  if [ "$zps_noagg" != NA ]; then noagg_b=$(ratio "$zps_noagg" "$b_plain"); fi
  if [ "$gloo_s" != NA ]; then gloo_b=$(ratio "$gloo_s" "$b_ring"); fi
  echo "zps / its bound = $(ratio "$zps_s" "$b_agg"); without host aggregation / its bound = $noagg_b; gloo / its bound = $gloo_b"
  echo
  if [ "$gloo_s" != NA ]; then
    echo "zps / gloo = $(ratio "$zps_s" "$gloo_s") (target <= 0.8)"
    if [ "$zps_coded" != NA ]; then
      echo "zps --wire-code zstd / gloo = $(ratio "$zps_coded" "$gloo_s")"
    fi
  else
    echo "zps / gloo = NA (no gloo run)"
  fi
  if [ "$zps_noagg" != NA ]; then
    echo "zps / zps without host aggregation = $(ratio "$zps_s" "$zps_noagg") (target <= 0.6)"
  else
    echo "zps / zps without host aggregation = NA (that run was skipped)"
  fi
  echo "logs: $out"
  exit 0
fi

echo "== zps: $workers workers, $shards shards, flat:$floats fp32, every link $rate (default flags: --sndbuf auto)"
zps_auto=$(zps_run zps '')
echo "== zps again with the OS's send buffers (--sndbuf 0)"
zps_os=$(zps_run zps-os "--sndbuf 0")
echo "== zps again with --sndbuf $sndbuf"
zps_s=$(zps_run zps-sndbuf "--sndbuf $sndbuf")

if /usr/bin/python3 -c "import torch.distributed" 2>/dev/null; then
  echo "== gloo: all_reduce of $floats floats over $workers hosts, every link $rate"
fi
gloo_s=$(gloo_run)

echo "zps with default flags / with --sndbuf $sndbuf: $(ratio "$zps_auto" "$zps_s")"
bound=$(awk -v p="$floats" -v b="$bps" 'BEGIN { printf "%.4f", 4 * p * 8 / b }')
ring=$(awk -v p="$floats" -v b="$bps" -v w="$workers" 'BEGIN { printf "%.4f", 2 * (w - 1) / w * 4 * p * 8 / b }')
echo
echo "| | seconds per step | vs link bound |"
echo "|---|---|---|"
echo "| link bound, parameter server (4P bytes / rate) | $bound | 1.00 |"
echo "| link bound, ring all-reduce (2(W-1)/W x 4P bytes / rate) | $ring | $(ratio "$ring" "$bound") |"
echo "| zps, W=$workers S=$shards, default flags (--sndbuf auto) | $zps_auto | $(ratio "$zps_auto" "$bound") |"
echo "| zps, W=$workers S=$shards, the OS's send buffers (--sndbuf 0) | $zps_os | $(ratio "$zps_os" "$bound") |"
echo "| zps, W=$workers S=$shards, --sndbuf $sndbuf | $zps_s | $(ratio "$zps_s" "$bound") |"
if [ "$gloo_s" != NA ]; then
  echo "| gloo all_reduce, W=$workers | $gloo_s | $(ratio "$gloo_s" "$bound") |"
  echo
  echo "with default flags: zps / gloo = $(ratio "$zps_auto" "$gloo_s") (target <= 0.8);" \
       "zps / bound = $(ratio "$zps_auto" "$bound") (target <= 1.15)"
fi
echo "logs: $out"
