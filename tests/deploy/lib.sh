# tests/deploy/lib.sh - sourced by the deploy tests: checks that count their
# failures, and the exit codes tests/deploy/run.sh reads (0 passed, 77
# skipped, anything else failed).
# shellcheck shell=bash
# shellcheck disable=SC2034 # for the tests that source this
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
failures=0

pass() { echo "  ok: $*"; }
fail() {
  echo "  FAILED: $*"
  failures=$((failures + 1))
}
# expect_eq WHAT GOT WANT
expect_eq() {
  if [ "$2" = "$3" ]; then
    pass "$1"
  else
    fail "$1"
    printf '    got:  %s\n    want: %s\n' "$2" "$3"
  fi
}
# expect_match WHAT TEXT ERE: TEXT's lines joined by spaces matches ERE.
expect_match() {
  # (No pipe into grep -q: under pipefail its early exit could fail the writer.)
  if grep -Eq -- "$3" <<<"${2//$'\n'/ }"; then
    pass "$1"
  else
    fail "$1"
    printf '    got:  %s\n    want: /%s/\n' "$2" "$3"
  fi
}
skip() {
  echo "SKIPPED: $*"
  exit 77
}
finish() {
  [ "$failures" -eq 0 ] || { echo "  $failures check(s) failed"; exit 1; }
  exit 0
}

# Installs tests/deploy/node's pinned packages (package-lock.json) when
# node_modules is missing or older than the lock; skips the test without
# node and npm. Sets $node_dir.
node_deps() {
  node_dir=$root/tests/deploy/node
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    skip "no node or npm (HINT: deploy/install-deps.sh --test)"
  fi
  if ! [ "$node_dir/node_modules/.zps-installed" -nt "$node_dir/package-lock.json" ]; then
    echo "  npm ci in tests/deploy/node"
    (cd "$node_dir" && npm ci --no-audit --no-fund --loglevel=error) ||
      { fail "npm ci in $node_dir"; finish; }
    touch "$node_dir/node_modules/.zps-installed"
  fi
}

# Fails the test unless the daemons are built (make test-deploy builds them
# first). Sets $bin.
need_bins() {
  bin=${ZPS_BIN_DIR:-$root/bin}
  local b
  for b in zps-server zps-worker zps-ctl; do
    [ -x "$bin/$b" ] || { fail "no $bin/$b (HINT: make all, or make test-deploy)"; finish; }
  done
}
