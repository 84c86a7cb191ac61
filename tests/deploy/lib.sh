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
  if tr '\n' ' ' <<<"$2" | grep -Eq -- "$3"; then
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
