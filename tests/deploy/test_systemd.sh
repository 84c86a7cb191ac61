#!/usr/bin/env bash
# deploy/systemd: the unit files pass `systemd-analyze verify` with no
# warning (offline: systemd need not be running), their sandboxing scores
# at most 2.0 on `systemd-analyze security` (0 = locked down, 10 = exposed),
# they restart on failure, the server with --resume, their CurveZMQ
# secrets come as credentials and the allowlists are named, and every
# setting of the example /etc/zps/*.env files names a real flag of its daemon.
set -euo pipefail
# shellcheck source=tests/deploy/lib.sh
source "$(dirname "$0")/lib.sh"
command -v systemd-analyze >/dev/null ||
  skip "no systemd-analyze (HINT: deploy/install-deps.sh --test installs systemd)"
need_bins
src=$root/deploy/systemd
tmp=$(mktemp -d "${TMPDIR:-/tmp}/zps-test-systemd-XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# verify checks that ExecStart's program exists: point the copies at the
# binaries just built instead of /usr/local/bin, and name an instance.
for u in zps-server zps-worker; do
  sed "s#/usr/local/bin/#$bin/#" "$src/$u@.service" >"$tmp/$u@0.service"
done

# Everything verify prints is a finding (an unknown key is only a warning
# on stderr, with exit status 0).
verify() { (cd "$tmp" && systemd-analyze verify "$@" 2>&1) || echo "exit status $?"; }

echo "systemd-analyze verify"
expect_eq "zps-server@0.service and zps-worker@0.service: no findings" \
  "$(verify ./zps-server@0.service ./zps-worker@0.service)" ""
# The check itself: a misspelt key must be found.
sed 's/^ProtectSystem=/ProtectSytem=/' "$tmp/zps-server@0.service" >"$tmp/broken@0.service"
expect_match "a misspelt key is a finding" "$(verify ./broken@0.service)" "Unknown key 'ProtectSytem'"

echo "systemd-analyze security (offline)"
for u in zps-server@0 zps-worker@0; do
  out=$(cd "$tmp" && systemd-analyze security --offline=yes --threshold=20 "./$u.service" 2>&1) &&
    rc=0 || rc=$?
  level=$(grep -o 'Overall exposure level for .*' <<<"$out" || true)
  expect_eq "$u: ${level:-no level} (at most 2.0)" "$rc" 0
done

echo "restarts and hardening"
# expect_line UNIT LINE: the unit has that line.
expect_line() {
  if grep -qxF -- "$2" "$src/$1@.service"; then pass "$1: $2"; else fail "$1: no line '$2'"; fi
}
# shellcheck disable=SC2016 # systemd's ${STATE_DIRECTORY}, not the shell's
expect_line zps-server \
  'ExecStart=/usr/local/bin/zps-server --shard %i --checkpoint-dir ${STATE_DIRECTORY} --resume'
expect_line zps-server 'EnvironmentFile=-/etc/zps/server.env'
expect_line zps-server 'EnvironmentFile=/etc/zps/server-%i.env'
expect_line zps-worker 'EnvironmentFile=/etc/zps/worker.env'
expect_line zps-worker 'EnvironmentFile=-/etc/zps/worker-%i.env'
for k in Restart=on-failure DynamicUser=yes ProtectSystem=strict NoNewPrivileges=yes PrivateTmp=yes \
         CapabilityBoundingSet=; do
  expect_line zps-server "$k"
  expect_line zps-worker "$k"
done

echo "CurveZMQ keys"
# Secrets come as credentials (never in an environment file or on a command
# line); the lists of public keys are named in server.env; reload re-reads them.
expect_line zps-server 'LoadCredential=curve.key:/etc/zps/keys/server.key'
expect_line zps-worker 'LoadCredential=curve.key:/etc/zps/keys/worker.key'
expect_line zps-server 'Environment=ZPS_CURVE_SECRET=%d/curve.key'
expect_line zps-worker 'Environment=ZPS_CURVE_SECRET=%d/curve.key'
# shellcheck disable=SC2016 # systemd's $MAINPID
expect_line zps-server 'ExecReload=/bin/kill -HUP $MAINPID'
for k in ZPS_AUTHORIZED_KEYS=/etc/zps/keys/workers ZPS_SHARD_KEYS=/etc/zps/keys/shards \
         ZPS_OPERATOR_KEYS=/etc/zps/keys/operators ZPS_REQUIRE_CURVE=1; do
  if grep -qxF -- "$k" "$src/server.env"; then pass "server.env: $k"; else fail "server.env: no $k"; fi
done

echo "example environment files"
# ZPS_FLAG_NAME must be a flag --flag-name of the daemon. --log-json and
# --pid-file are the flags the daemons gain with their environment
# configuration (issue 8, item 1).
flags() { "$bin/$1" --help 2>&1 | grep -oE -- '--[a-z][a-z0-9-]+' | sort -u; printf '%s\n' --log-json --pid-file; }
server_flags=$(flags zps-server)
worker_flags=$(flags zps-worker)
for f in "$src"/server*.env "$src"/worker*.env; do
  known=$server_flags
  [[ $(basename "$f") == worker* ]] && known=$worker_flags
  bad=()
  while IFS='=' read -r name _; do
    flag=--$(tr 'A-Z_' 'a-z-' <<<"${name#ZPS_}")
    grep -qxF -- "$flag" <<<"$known" || bad+=("$name")
  done < <(grep -E '^[A-Z_]+=' "$f")
  expect_eq "$(basename "$f"): every ZPS_ setting is a flag" "${bad[*]:-}" ""
done
what="server.env and server-0.env set no ZPS_COORDINATOR (shard 0 refuses --coordinator)"
if grep -q '^ZPS_COORDINATOR=' "$src/server-0.env" "$src/server.env"; then fail "$what"; else pass "$what"; fi
finish
