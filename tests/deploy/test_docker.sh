#!/usr/bin/env bash
# deploy/docker: both Dockerfiles pass dockerfile-utils' linter and zps's
# own checks (tests/deploy/node/lint-dockerfiles.mjs: multi-stage, pinned
# bases, COPY --from an earlier stage, a non-root USER, lean apt-get), a
# broken copy fails them, and the CPU image's runtime stage installs the
# Debian package of every shared library the binaries built here link
# (this machine is Debian 12, as the image). Images are not built: no
# Docker engine runs on the build machines.
set -euo pipefail
# shellcheck source=tests/deploy/lib.sh
source "$(dirname "$0")/lib.sh"
node_deps
tmp=$(mktemp -d "${TMPDIR:-/tmp}/zps-test-docker-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
lint() { node "$node_dir/lint-dockerfiles.mjs" "$@"; }
docker=$root/deploy/docker

echo "lint"
for f in Dockerfile Dockerfile.cuda; do
  if out=$(lint "$docker/$f"); then
    pass "$f: $(grep -c '  ok:' <<<"$out") checks"
  else
    fail "$f"
    grep -A2 FAILED <<<"$out" | sed 's/^/  /'
  fi
done
sed 's/--from=build/--from=builder/; s/^USER .*/USER root/; s/^RUN apt-get update/run apt-get update/' \
  "$docker/Dockerfile" >"$tmp/Dockerfile"
out=$(lint "$tmp/Dockerfile") && rc=0 || rc=$?
expect_match "a broken copy fails: lower-case RUN, COPY --from a missing stage, USER root" \
  "exit $rc $out" '^exit 1 .*uppercase.*COPY --from=builder names.*FAILED: Dockerfile: the last stage runs as USER root'

echo "runtime libraries"
need_bins
if ! command -v dpkg >/dev/null || ! command -v objdump >/dev/null; then
  echo "  skipped: no dpkg or objdump to map libraries to packages"
else
  # The runtime stage's apt-get install line(s): the last stage's packages.
  runtime=$(awk '/^FROM /{ text = "" } { text = text " " $0 } END { print text }' \
    "$docker/Dockerfile")
  for lib in $(for b in "$bin"/zps-server "$bin"/zps-worker "$bin"/zps-ctl; do
                 objdump -p "$b" | awk '/NEEDED/ { print $2 }'; done | sort -u); do
    path=$(ldconfig -p | awk -v l="$lib" '$1 == l && !n++ { print $NF }')
    pkg=$(dpkg -S "$(readlink -f "$path")" 2>/dev/null | head -n 1 | cut -d: -f1) || true
    [ -n "$pkg" ] || pkg=$(dpkg -S "$path" 2>/dev/null | head -n 1 | cut -d: -f1) || true
    case "$lib" in
      # make test SAN=1 checks its sanitized binaries, which the images never hold.
      libasan.so.*|libubsan.so.*|liblsan.so.*|libtsan.so.*)
        pass "$lib: a sanitizer runtime (make test SAN=1), not in the images"; continue ;;
    esac
    case "$pkg" in
      libc6) pass "$lib: libc6, in every Debian image" ;;
      '') fail "$lib: no Debian package owns $path" ;;
      *) expect_match "$lib: its package $pkg is installed by the runtime stage" "$runtime" " $pkg( |$)" ;;
    esac
  done
fi
if docker info >/dev/null 2>&1; then
  echo "  note: a Docker engine answers here, but make test builds no image (minutes each)"
else
  echo "  note: images not built: no Docker engine here (docker build needs one)"
fi
finish
