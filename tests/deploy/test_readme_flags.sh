#!/usr/bin/env bash
# The flag tables of docs/running.md (linked from the README) are the
# daemons' own (--flags-markdown, printed from the table their flags are
# parsed with): the block between <!-- flags:PROG --> and <!-- /flags:PROG -->
# must equal that output. With --write (make readme-flags) it puts the
# output there instead.
set -euo pipefail
# shellcheck source=tests/deploy/lib.sh
source "$(dirname "$0")/lib.sh"
need_bins
doc=$root/docs/running.md

# The lines strictly between PROG's markers in the page.
block() {
  awk -v opening="<!-- flags:$1 -->" -v closing="<!-- /flags:$1 -->" \
    '$0 == closing { inside = 0 } inside { print } $0 == opening { inside = 1 }' "$doc"
}

# The page with PROG's block replaced by the file $2.
splice() {
  awk -v opening="<!-- flags:$1 -->" -v closing="<!-- /flags:$1 -->" -v file="$2" '
    $0 == closing { while ((getline line < file) > 0) print line; inside = 0 }
    !inside { print }
    $0 == opening { inside = 1 }' "$doc"
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for prog in zps-server zps-worker; do
  if ! grep -qxF "<!-- flags:$prog -->" "$doc" || ! grep -qxF "<!-- /flags:$prog -->" "$doc"; then
    fail "docs/running.md has no <!-- flags:$prog --> ... <!-- /flags:$prog --> block"
    continue
  fi
  "$bin/$prog" --flags-markdown >"$tmp/$prog.md"
  if [ "${1:-}" = --write ]; then
    splice "$prog" "$tmp/$prog.md" >"$tmp/running.md" && cp "$tmp/running.md" "$doc"
    pass "$prog: docs/running.md block written"
  elif diff -u <(block "$prog") "$tmp/$prog.md" >"$tmp/diff"; then
    pass "$prog: docs/running.md block is $prog --flags-markdown"
  else
    fail "$prog: docs/running.md block differs from $prog --flags-markdown (HINT: make readme-flags)"
    cat "$tmp/diff"
  fi
done
finish
