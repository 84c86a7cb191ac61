#!/usr/bin/env bash
# bench/diloco-host.sh - one host of bench/diloco.sh's emulated cluster, run
# on every host by deploy/netns-cluster.sh -x (which sets ZPS_NETNS_RANK and
# ZPS_NETNS_MASTER, host 0's address):
#
#   diloco-host.sh zps BIN METRICS SLOWDOWNS SERVER-FLAGS...
#       host 0: zps-server (shard 0, the coordinator) with SERVER-FLAGS and
#       --metrics-log METRICS; host K > 0: zps-worker, worker K-1, with
#       --slowdown F where SLOWDOWNS (a comma list by worker, "-" for none)
#       names one for it
#   diloco-host.sh ddp SCRIPT ARGS...
#       /usr/bin/python3 SCRIPT ARGS on every host (bench/ddp_fmnist.py)
#
# Each ends in exec, so that the pid netns-cluster.sh keeps (and kills) is
# the program's own.
set -euo pipefail
rank=${ZPS_NETNS_RANK:?run by deploy/netns-cluster.sh -x}
coord="tcp://${ZPS_NETNS_MASTER:?}:5555"
case ${1:-} in
zps)
    bin=$2 metrics=$3 slow=$4
    shift 4
    if [ "$rank" = 0 ]; then
        exec "$bin/zps-server" --listen "$coord" --metrics-log "$metrics" "$@"
    fi
    k=$((rank - 1)) f=''
    IFS=, read -r -a fs <<<"$slow"
    if [ "$k" -lt "${#fs[@]}" ] && [ "${fs[$k]}" != - ]; then f=${fs[$k]}; fi
    exec "$bin/zps-worker" --coordinator "$coord" ${f:+--slowdown "$f"}
    ;;
ddp)
    shift
    exec /usr/bin/python3 "$@"
    ;;
*)
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
