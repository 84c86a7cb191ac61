#!/usr/bin/env bash
# tests/deploy/run.sh [--long] [NAME...] - the tests of deploy/ (make
# test-deploy): runs each tests/deploy/test_*.sh (with --long each
# long_*.sh instead: make test-deploy-long, part of make test-long), or
# those NAMEs, prints PASS, FAIL or SKIPPED for each, with the output of
# those that did not pass, and fails if any failed. A test exits 0
# (passed), 77 (skipped: it says why) or anything else (failed).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
passed=0 failed=0 skipped=0 names=()
prefix=test_
if [ "${1:-}" = --long ]; then prefix=long_; shift; fi
for t in "$here/$prefix"*.sh; do
  name=$(basename "$t" .sh)
  [ $# -eq 0 ] || [[ " $* " == *" ${name#"$prefix"} "* ]] || continue
  start=$SECONDS
  out=$(timeout 300 bash "$t" 2>&1)
  rc=$?
  took="$((SECONDS - start)) s"
  case $rc in
    0) passed=$((passed + 1)); echo "PASS    $name ($took)"; [ -z "${V:-}" ] || echo "$out" ;;
    77) skipped=$((skipped + 1)); echo "SKIPPED $name: $(grep -m1 '^SKIPPED: ' <<<"$out" | cut -c10-)" ;;
    *) failed=$((failed + 1)); names+=("$name"); echo "FAIL    $name (exit $rc, $took)"; echo "$out" ;;
  esac
done
echo "deploy: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ] || { echo "deploy: FAILED: ${names[*]}"; exit 1; }
