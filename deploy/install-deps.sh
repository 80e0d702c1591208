#!/usr/bin/env bash
# Installs what Tessera needs to build and test, from Debian's packages only.
# Idempotent: asks apt-get only for packages that are missing, and says what it did.
# Usage: deploy/install-deps.sh [--quiet]
set -euo pipefail

PACKAGES=(
  bazel-bootstrap bazel-platforms
  g++ clang
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev librocksdb-dev libxxhash-dev prometheus-cpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  pybind11-dev python3-dev python3-numpy python3-torch
  python3-matplotlib  # the chart of tests/bench/run.sh
  iproute2 fio procps openssl
)

quiet=0
[ "${1:-}" = "--quiet" ] && quiet=1
say() { [ "$quiet" = 1 ] || echo "install-deps: $*"; }

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  say "all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

say "installing ${#missing[@]} missing package(s): ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
say "installed: ${missing[*]}"
