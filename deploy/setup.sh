#!/usr/bin/env bash
# Installs the Debian 12 packages uopd builds and tests with (docs/ARCHITECTURE.md, Dependencies) that are missing.
# Idempotent: prints nothing and exits 0 when everything is present. Needs root or
# password-less sudo to install; otherwise it names the missing packages and fails.
# The CUDA toolkit is not a Debian package: when /usr/local/cuda is absent the CUDA
# backend is left out of the build and its tests skip.
#   --bench  also installs what only benchmarks and reference generators use (PyTorch,
#            torchvision and the ONNX Python package, for tests/bench/models/bench_models.py
#            and tests/conformance/models/make_*.py); CI and the test suite never need them.
set -euo pipefail

packages=(
  # toolchain
  build-essential cmake ninja-build ccache pkg-config clang libclang-rt-14-dev
  # RPC and serialization
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  # compiler backend
  llvm-19-dev
  # hashing, metrics, collectives, cluster cache
  libssl-dev openssl prometheus-cpp-dev libgloo-dev redis-server
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev libopenblas-dev
  # ONNX importer and its conformance data
  libonnx-dev libonnx-testdata
  # alerting rules and scrape config checks (promtool), the e2e scrape test; the YAML
  # checks of deploy/ (tests/deploy)
  prometheus python3-yaml
  # the Python client (client/python) and its tests: pip installs it offline into a venv
  python3-grpcio python3-protobuf python3-numpy python3-pytest python3-pip python3-venv
)
if [ "${1:-}" = "--bench" ]; then packages+=(python3-torch python3-torchvision python3-onnx); fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  sudo=(sudo -n)
else
  echo "deploy/setup.sh: missing Debian packages: ${missing[*]}" >&2
  echo "deploy/setup.sh: run as root (or with password-less sudo) to install them:" >&2
  echo "  apt-get install -y ${missing[*]}" >&2
  exit 1
fi

echo "deploy/setup.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
# The package lists may be stale or absent on a fresh machine: refresh them first.
if ! { "${sudo[@]}" apt-get update -q && "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  tail -n 30 "$log" >&2
  echo "deploy/setup.sh: apt-get failed installing: ${missing[*]} (log above)" >&2
  exit 1
fi
rm -f "$log"
# A redis-server package starts a system instance; the tests start their own on free ports.
if command -v systemctl >/dev/null 2>&1; then "${sudo[@]}" systemctl disable --now redis-server >/dev/null 2>&1 || true; fi
