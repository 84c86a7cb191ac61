#!/usr/bin/env bash
# deploy/k8s: every object of every manifest validates against the
# Kubernetes API's OpenAPI schema (kubernetes-models), and the objects
# refer to one another correctly (tests/deploy/node/validate-k8s.mjs),
# CurveZMQ's key files included.
# Then the check itself: broken copies of the manifests must fail it.
set -euo pipefail
# shellcheck source=tests/deploy/lib.sh
source "$(dirname "$0")/lib.sh"
node_deps
tmp=$(mktemp -d "${TMPDIR:-/tmp}/zps-test-k8s-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
validate() { node "$node_dir/validate-k8s.mjs" "$@"; }

echo "deploy/k8s/*.yaml"
if out=$(validate "$root"/deploy/k8s/*.yaml); then
  pass "$(tail -n 1 <<<"$out")"
else
  fail "deploy/k8s/*.yaml"
  grep -A2 FAILED <<<"$out" | sed 's/^/  /'
fi

echo "broken copies fail"
# broken NAME FILE SED-EXPRESSION ERE: the copy fails with a line matching ERE.
broken() {
  sed "$3" "$root/deploy/k8s/$2" >"$tmp/$1.yaml"
  cmp -s "$root/deploy/k8s/$2" "$tmp/$1.yaml" && { fail "$1: the edit changed nothing"; return; }
  local out rc=0 others=() f
  for f in "$root"/deploy/k8s/*.yaml; do [ "$(basename "$f")" = "$2" ] || others+=("$f"); done
  out=$(validate "$tmp/$1.yaml" "${others[@]}" 2>&1) || rc=$?
  if [ "$rc" -ne 0 ] && grep -Eq -- "$4" <<<"$out"; then
    pass "$1"
  else
    fail "$1 (exit $rc)"
    grep FAILED <<<"$out" | sed 's/^/  /'
  fi
}
broken "replicas not an integer (schema)" zps.yaml 's/^  replicas: 2$/  replicas: two/' \
  'StatefulSet zps-shard.*|replicas must be integer'
broken "a container without a name (schema)" workers-cpu.yaml 's/^        - name: zps-worker$/        - stdin: true/' \
  'containers/0 must have required property .?name'
broken "a bad restartPolicy (schema)" workers-cpu.yaml 's/restartPolicy: OnFailure/restartPolicy: Sometimes/' \
  'restartPolicy must be equal to one of the allowed values'
broken "a probe on a port the container lacks" zps.yaml 's/^              port: http$/              port: metrics/' \
  'livenessProbe port metrics is a container port'
broken "serviceName of no headless Service" zps.yaml 's/^  serviceName: zps-shards$/  serviceName: zps/' \
  'serviceName zps is a headless Service'
broken "a Service selecting no pods" zps.yaml 's/pod-name: zps-shard-0/pod-name: zps-shard-7/' \
  'Service zps-coordinator: its selector matches'
broken "envFrom a missing ConfigMap" zps.yaml 's/^                name: zps-job$/                name: zps-jobs/' \
  'envFrom ConfigMap zps-jobs exists'
broken "ZPS_WORKERS unlike the Jobs' completions" zps.yaml 's/ZPS_WORKERS: "2"/ZPS_WORKERS: "3"/' \
  'ZPS_WORKERS 3 = Job'
broken "YAML that does not parse" zps.yaml 's/^data:$/data: [/' 'YAML'
broken "a CURVE key directory not mounted" zps.yaml 's#mountPath: /etc/zps/keys/operators#mountPath: /etc/zps/ops#' \
  'ZPS_OPERATOR_KEYS /etc/zps/keys/operators is in a mounted volume'
broken "the torch workers' secret not mounted" workers-torch.yaml 's#mountPath: /etc/zps/secret#mountPath: /secret#' \
  'zps-workers-torch: ZPS_SERVER_KEY /etc/zps/secret/server.pub is in a mounted volume'
broken "the workers' secret not mounted" workers-cpu.yaml 's#mountPath: /etc/zps/secret#mountPath: /secret#' \
  'ZPS_CURVE_SECRET /etc/zps/secret/worker.key is in a mounted volume'
finish
