#!/usr/bin/env bash
# Installs every Debian package Mneme needs to build, test and run. Idempotent:
# packages already present are not touched, and nothing is fetched when all
# are installed. Needs root (or sudo) only when something is missing.
set -euo pipefail

PACKAGES=(
  # Build.
  bazel-bootstrap bazel-rules-java pkg-config g++ clang lld libclang-rt-14-dev
  clang-format clang-tidy
  # RPC and serialization.
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  # Core libraries.
  libabsl-dev libgoogle-glog-dev librocksdb-dev liburing-dev libhwy-dev
  libopenblas-dev libgloo-dev libicu-dev libsystemd-dev libcpp-httplib-dev
  nlohmann-json3-dev
  # Tests and benchmarks.
  libgtest-dev libgmock-dev libbenchmark-dev openssl curl fio
  python3 python3-numpy python3-grpcio python3-grpc-tools
  python3-prometheus-client python3-yaml
  # Deploy checks (systemd-analyze verify).
  systemd
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "bootstrap: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
  else
    echo "bootstrap: missing packages (${missing[*]}) and not root; run as root" >&2
    exit 1
  fi
fi

echo "bootstrap: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "bootstrap: done"
