#!/usr/bin/env bash
# Installs the Debian packages zps builds and runs with, and only those that
# are missing: a machine that has them all is left untouched (no apt-get).
# --python adds what the Python package (python/zps) needs, --test what
# only the tests use (make test, the Python package's tests included), --ci
# also what the checks of .ci/run need beyond make test, --bench what the
# benchmarks of bench/ use beyond the build (their PyTorch baselines, the
# emulated cluster, the plots), --long what make test-long needs: --test's
# and a Slurm to run the requeue test under, so that make demo stays lean. torch is made to run on OpenBLAS, not the reference BLAS.
set -euo pipefail

pkgs=(
  build-essential pkg-config
  libzmq3-dev                          # the wire: ROUTER/DEALER sockets
  libprotobuf-c-dev protobuf-c-compiler # message headers
  libopenblas-dev                      # the CPU backend's GEMMs
  zlib1g-dev                           # decompressing the IDX .gz files once
  libzstd-dev libxxhash-dev            # --wire-code zstd: the lossless code of the wire, its hash
  check                                # unit and integration tests (built by make)
  libjansson-dev                       # zps-ctl report reads the JSON-lines metrics log; /status
  libexpat1-dev                        # the report test parses the SVG pictures as XML
  dataset-fashion-mnist                # the demo's and tests' data
  libmicrohttpd-dev                    # zps-server --http: /metrics and /status
)
if [ "${1:-}" = --python ] || [ "${1:-}" = --test ] || [ "${1:-}" = --long ] || [ "${1:-}" = --ci ] ||
   [ "${1:-}" = --bench ]; then
  pkgs+=(
    python3-torch python3-numpy        # zps.torch: PyTorch models as zps workers
    python3-venv python3-pip           # pip install ./python, into a venv (tests/python/test_install.py)
    python3-setuptools python3-wheel   # its build backend, offline (--no-build-isolation)
  )
fi
if [ "${1:-}" = --test ] || [ "${1:-}" = --long ] || [ "${1:-}" = --ci ]; then
  pkgs+=(
    python3-pytest                     # tests/python: the Python package's tests
    python3-torchvision                # tests/python: ResNet-18 with BatchNorm, a model no one here wrote
    tcpdump                            # the security test captures loopback traffic
    prometheus                         # promtool checks /metrics (the server is never run)
    shellcheck                         # tests/deploy: the shell scripts of deploy/ and the tests
    systemd                            # tests/deploy: systemd-analyze verify/security on the units
    iproute2                           # the emulated multi-host test: ip netns, veth, tc tbf
  )
  # tests/deploy/node: the Kubernetes schema and Dockerfile checks run on
  # Node.js with packages from npm. A node from elsewhere (with its own
  # npm) is kept: Debian's npm would conflict with it.
  command -v node >/dev/null || pkgs+=(nodejs)
  command -v npm >/dev/null || pkgs+=(npm)
fi
if [ "${1:-}" = --long ]; then
  pkgs+=(
    slurm-wlm munge                    # tests/deploy/long_slurm_requeue.sh: zps.sbatch under a real
  )                                    # one-node Slurm, requeued (make test-long; the test only)
fi
if [ "${1:-}" = --bench ]; then
  pkgs+=(
    iproute2                           # bench/cluster.sh, bench/diloco.sh: ip netns, veth, tc tbf
    gnuplot-nox                        # bench/diloco.sh: its plots (SVG), accuracy against time and bytes
    zstd                               # bench/wire_lossless.py: what a lossless code would save
  )
fi
if [ "${1:-}" = --ci ]; then
  pkgs+=(
    clang libclang-rt-dev              # make fuzz: libFuzzer, clang's sanitizer runtimes
    clang-tidy cppcheck                # make lint
    valgrind                           # make valgrind
  )                                    # (make test SAN=1: gcc's runtimes come with gcc)
fi
missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
sudo=()
as_root() {
  if [ "$(id -u)" -ne 0 ] && [ ${#sudo[@]} -eq 0 ]; then
    command -v sudo >/dev/null || { echo "install-deps: not root and no sudo; run: $*" >&2; exit 1; }
    sudo=(sudo)
  fi
  "${sudo[@]}" "$@"
}

# torch links libblas.so.3, which Debian's alternatives point at OpenBLAS
# when it is installed (priority 100 over the reference BLAS's 10), unless
# an administrator set another: then torch's matrix products run several
# times slower. Checked: update-alternatives --query libblas.so.3-x86_64-linux-gnu.
openblas_for_torch() {
  local alt=libblas.so.3-x86_64-linux-gnu
  local want=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3
  [ -e "$want" ] || return 0
  if [ "$(update-alternatives --query "$alt" 2>/dev/null | sed -n 's/^Value: //p')" != "$want" ]; then
    echo "install-deps: pointing $alt at OpenBLAS (torch's BLAS)"
    as_root update-alternatives --set "$alt" "$want"
  fi
}

if [ ${#missing[@]} -ne 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get update -qq
  as_root apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
case "${1:-}" in --python | --test | --long | --ci | --bench) openblas_for_torch ;; esac
