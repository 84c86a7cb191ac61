#!/usr/bin/env bash
# tests/lib/install.sh - libzps as a user gets it: make install to a
# temporary prefix, then a program that knows only the installed header and
# zps.pc (tests/lib/zps_min.c) is built, shared and static, and joins a job
# and trains with the shared one. Run by make test (test-install).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${ZPS_BIN_DIR:-$PWD/bin}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/zps-install-XXXXXX")
srv=
cleanup() { [ -n "$srv" ] && kill "$srv" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "install: FAIL: $*" >&2; for f in "$tmp"/*.log; do sed 's/^/  /' "$f" >&2; done; exit 1; }

read -r -a test_cflags <<<"${ZPS_TEST_CFLAGS:-}"
read -r -a make_flags <<<"${ZPS_INSTALL_MAKEFLAGS:-}"
make --no-print-directory "${make_flags[@]}" install PREFIX="$tmp/prefix" >"$tmp/install.log" 2>&1 ||
  fail "make install"
for f in include/zps.h lib/libzps.a lib/libzps.so lib/libzps.so.1 lib/pkgconfig/zps.pc; do
  [ -e "$tmp/prefix/$f" ] || fail "make install put no $f"
done
# The version the Makefile builds (the soname stays 1 while the ABI only grows).
version=$(sed -n 's/^ZPS_SO_VERSION := //p' Makefile)
[ -n "$version" ] || fail "no ZPS_SO_VERSION in the Makefile"
[ "$(readlink "$tmp/prefix/lib/libzps.so.1")" = "libzps.so.$version" ] ||
  fail "libzps.so.1 is not a link to libzps.so.$version"

# Outside the source tree, with nothing but the prefix: no -I. here.
cp tests/lib/zps_min.c "$tmp/"
export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig"
read -r -a zps_flags <<<"$(pkg-config --cflags --libs zps)"
read -r -a zps_cflags <<<"$(pkg-config --cflags zps)"
read -r -a dep_libs <<<"$(pkg-config --libs libzmq libprotobuf-c zlib libzstd libxxhash)"
(cd "$tmp" && cc -std=c11 -Wall -Wextra -Werror "${test_cflags[@]}" -o zps_min zps_min.c \
  "${zps_flags[@]}") \
  >"$tmp/cc.log" 2>&1 || fail "cc with pkg-config --cflags --libs zps"
# libzps.a linked in, its dependencies (Requires.private) shared.
(cd "$tmp" && cc -std=c11 -Wall -Wextra -Werror "${test_cflags[@]}" -o zps_min_static zps_min.c \
  "${zps_cflags[@]}" \
  -L"$tmp/prefix/lib" -Wl,-Bstatic -lzps -Wl,-Bdynamic "${dep_libs[@]}" -lm -pthread) \
  >"$tmp/cc-static.log" 2>&1 || fail "cc against libzps.a"
# grep reads all of ldd's output (not -q): under pipefail, ldd killed by
# SIGPIPE after an early match would fail the pipeline now and then.
! ldd "$tmp/zps_min_static" | grep libzps >/dev/null || fail "zps_min_static loads libzps.so"
LD_LIBRARY_PATH="$tmp/prefix/lib" ldd "$tmp/zps_min" | grep "$tmp/prefix/lib/libzps.so.1" >/dev/null ||
  fail "zps_min does not load the installed libzps.so.1"

"$bin/zps-server" --listen 'tcp://127.0.0.1:*' --endpoint-file "$tmp/ep" --workers 1 \
  --model flat:100000 --dataset synthetic:2048 --steps 30 --lr 0.1 --momentum 0 \
  --lr-schedule constant 2>"$tmp/server.log" &
srv=$!
for _ in $(seq 100); do [ -s "$tmp/ep" ] && break; sleep 0.1; done
[ -s "$tmp/ep" ] || fail "the server wrote no endpoint"
LD_LIBRARY_PATH="$tmp/prefix/lib" timeout 120 "$tmp/zps_min" "$(cat "$tmp/ep")" \
  >"$tmp/zps_min.log" 2>"$tmp/zps_min-stderr.log" || fail "zps_min did not train"
wait "$srv" || { srv=; fail "the server failed"; }
srv=
grep -q '^done: ' "$tmp/zps_min.log" || fail "zps_min said nothing"
echo "install: ok: $(grep '^done: ' "$tmp/zps_min.log")"
