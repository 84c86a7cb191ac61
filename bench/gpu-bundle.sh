#!/usr/bin/env bash
# bench/gpu-bundle.sh - packs a CUDA=1 build made here for a GPU machine that
# cannot install Debian's packages (an offline machine, or one of another
# distribution): bin/, the test runners, every shared library they need that
# is neither glibc's, the C++ runtime's nor CUDA's, and the Fashion-MNIST
# files, into one archive.
#
#   bench/gpu-bundle.sh [ARCHIVE]     (default: .gpu/bundle.tar.xz)
#
# On the GPU machine, in a checkout of the same commit:
#
#   tar -xJf .gpu/bundle.tar.xz
#   PREBUILT=1 bash bench/gpu.sh
#
# gpu.sh then puts .gpu/lib on LD_LIBRARY_PATH and the data set in place,
# and skips its own build.
set -euo pipefail
cd "$(dirname "$0")/.."

archive=${1:-.gpu/bundle.tar.xz}
make -j"$(nproc)" CUDA=1 all build/tests/check_unit build/tests/check_integration
[ -f bin/libzps_cuda.so ] || { echo "gpu-bundle: no bin/libzps_cuda.so after make CUDA=1" >&2; exit 1; }

stage=$(mktemp -d "${TMPDIR:-/tmp}/zps-bundle-XXXXXX")
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/.gpu/lib" "$stage/.gpu/fashion-mnist" "$stage/bin" "$stage/build/tests"
cp bin/* "$stage/bin/"
cp build/tests/check_unit build/tests/check_integration "$stage/build/tests/"

# The libraries the binaries load, less those every Linux with a CUDA
# driver has and that must match it: glibc, the C++ runtime, CUDA's own.
ldd bin/* build/tests/check_unit build/tests/check_integration 2>/dev/null |
  awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libdl|libpthread|librt|libresolv|ld-linux[^/]*|libstdc\+\+|libgcc_s)\.so' |
  grep -v -E '/libcu(blas|blasLt|dart)\.so' |
  while read -r lib; do cp -L "$lib" "$stage/.gpu/lib/"; done

if [ -d /usr/share/datasets/fashion-mnist ]; then
  cp /usr/share/datasets/fashion-mnist/*.gz "$stage/.gpu/fashion-mnist/"
fi
git rev-parse HEAD >"$stage/.gpu/commit"

mkdir -p "$(dirname "$archive")"
tar -C "$stage" -cJf "$archive" .gpu bin build
echo "gpu-bundle: $archive ($(du -h "$archive" | cut -f1)), $(find "$stage/.gpu/lib" -type f | wc -l) libraries," \
  "built at $(cut -c1-12 "$stage/.gpu/commit")"
