#!/usr/bin/env bash
# The docs stay true: every ```sh block of README.md and docs/*.md that the
# line before marks <!-- runnable --> (an HTML comment, which GitHub does
# not show) is run, and every relative link between the pages must point
# at a file that exists and, for a page, at one of its headings.
#
# A block runs as a reader would run it: from the top of the tree, with
# bash -euo pipefail, $ZPS_BIN_DIR first on PATH. It runs in a process
# group of its own under a time bound, and that group is killed by its id
# afterwards, so a block that fails midway leaves no daemon behind; a block
# that ends with processes of its group still running fails, since a
# reader's shell would be left with them too.
set -uo pipefail
# shellcheck source=tests/deploy/lib.sh
source "$(dirname "$0")/lib.sh"
need_bins
# The blocks call bin/zps-server etc., as the docs show them.
[ -x "$root/bin/zps-server" ] || skip "the docs' commands run bin/ of the tree, which is not built (HINT: make)"

block_timeout_s=${ZPS_DOCS_BLOCK_TIMEOUT_S:-120}
pages=("$root/README.md" "$root"/docs/*.md)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# ---- links -------------------------------------------------------------
# GitHub's anchor of a heading: lowercased, punctuation other than - and _
# dropped, spaces turned into -, and -1, -2, ... after a repeated one.
# Links inside code (fences and `spans`) are not links.
check_links() {
  python3 - "$root" "${pages[@]}" <<'EOF'
import os, re, sys
root, pages = sys.argv[1], sys.argv[2:]

def prose(path):
    """The lines of PATH outside code fences, with their numbers."""
    fence = False
    for n, line in enumerate(open(path, encoding='utf-8'), 1):
        if line.startswith('```'):
            fence = not fence
            continue
        if not fence:
            yield n, line.rstrip('\n')

def anchors(path):
    seen, out = {}, set()
    for _, line in prose(path):
        m = re.match(r'#{1,6} +(.*?) *#* *$', line)
        if not m:
            continue
        slug = re.sub(r'[^\w\- ]', '', m.group(1).lower()).replace(' ', '-')
        k = seen.get(slug, 0)
        seen[slug] = k + 1
        out.add(slug if k == 0 else '%s-%d' % (slug, k))
    return out

bad = 0
cache = {}
for page in pages:
    rel = os.path.relpath(page, root)
    for n, line in prose(page):
        line = re.sub(r'`[^`]*`', '', line)
        for target in re.findall(r'\]\(([^)\s]+)\)', line):
            if re.match(r'[a-z]+:', target):
                continue  # http:, https:, mailto:
            path, _, anchor = target.partition('#')
            dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            where = '%s:%d: %s' % (rel, n, target)
            if not os.path.exists(dest):
                print('  FAILED: %s: no such file' % where)
                bad += 1
            elif anchor:
                if not dest.endswith('.md'):
                    print('  FAILED: %s: an anchor into a file that is not a page' % where)
                    bad += 1
                    continue
                if dest not in cache:
                    cache[dest] = anchors(dest)
                if anchor not in cache[dest]:
                    print('  FAILED: %s: %s has no heading with that anchor'
                          % (where, os.path.relpath(dest, root)))
                    bad += 1
print('  ok: links checked' if bad == 0 else '  %d bad link(s)' % bad)
sys.exit(1 if bad else 0)
EOF
}
if check_links; then
  :
else
  failures=$((failures + 1))
fi

# ---- runnable blocks ---------------------------------------------------
# Writes each marked block of page $1 to $tmp/block-K.sh and its place
# (page:line of the opening fence) to $tmp/block-K.where.
extract() {
  awk -v dir="$tmp" -v page="$2" -v k0="$3" '
    BEGIN { k = k0 }
    inside && /^```/ { inside = 0; close(file); next }
    inside { print > file; next }
    marked && /^```sh$/ {
      k++; inside = 1
      file = dir "/block-" k ".sh"
      printf "%s:%d\n", page, NR > (dir "/block-" k ".where"); close(dir "/block-" k ".where")
      printf "" > file
      marked = 0; next
    }
    marked { printf "%s:%d: <!-- runnable --> is not followed by a ```sh fence\n", page, NR > "/dev/stderr"; bad = 1 }
    { marked = ($0 == "<!-- runnable -->") }
    END {
      if (inside) { printf "%s: a runnable block is not closed\n", page > "/dev/stderr"; bad = 1 }
      exit bad
    }
  ' "$1" || { fail "$2: could not read its runnable blocks"; return 0; }
}
for page in "${pages[@]}"; do
  n=$(find "$tmp" -name 'block-*.sh' | wc -l)
  extract "$page" "${page#"$root"/}" "$n"
done

blocks=$(find "$tmp" -name 'block-*.sh' | wc -l)
[ "$blocks" -gt 0 ] || fail "no block is marked <!-- runnable -->"
for k in $(seq 1 "$blocks"); do
  where=$(cat "$tmp/block-$k.where")
  start=$SECONDS
  # setsid: the block leads a process group of its own, whose id is its
  # pid (a background subshell of a shell without job control is no group
  # leader, so setsid does not fork).
  (cd "$root" && PATH="$bin:$PATH" exec setsid timeout -k 5 "$block_timeout_s" \
    bash -euo pipefail "$tmp/block-$k.sh") </dev/null >"$tmp/block-$k.log" 2>&1 &
  pgid=$!
  wait "$pgid"
  rc=$?
  took=$((SECONDS - start))
  left=no
  if kill -0 -- "-$pgid" 2>/dev/null; then
    left=yes
    kill -TERM -- "-$pgid" 2>/dev/null
    sleep 1
    kill -KILL -- "-$pgid" 2>/dev/null
  fi
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    fail "$where: did not finish within $block_timeout_s s"
  elif [ "$rc" -ne 0 ]; then
    fail "$where: exit $rc after $took s"
  elif [ "$left" = yes ]; then
    fail "$where: ended with processes still running ($took s; they were killed)"
  else
    pass "$where ($took s)"
    continue
  fi
  tail -n 30 "$tmp/block-$k.log" | sed 's/^/    | /'
done
finish
