#!/usr/bin/env bash
# Installs every Debian package Mneme needs to build, test and run. Idempotent:
# packages already present are not touched, and nothing is fetched when all
# are installed. Needs root (or sudo) only when something is missing.
#
# Then the npm packages of the tests (tools/node/package-lock.json, exact
# versions) go into ${MNEME_NODE_DIR:-$HOME/.cache/mneme/node} with `npm ci`,
# again only when that folder does not already hold that lock.
set -euo pipefail
cd "$(dirname "$0")/.."

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
  # The GPU bundle (tools/gpu/bundle.sh: tar -J).
  xz-utils
  # The Arm tests (tests/arm): the aarch64 cross compiler, qemu user-mode
  # emulation, and the arm64 builds of the libraries those tests link
  # (multiarch: dpkg gets the arm64 architecture added below).
  g++-aarch64-linux-gnu qemu-user
  libhwy-dev:arm64 libgtest-dev:arm64 libabsl-dev:arm64 libicu-dev:arm64
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done
# Node.js and npm (the OpenAI SDK test): Debian's, unless a working node and
# npm (of any packaging) are already on PATH.
if ! node --version >/dev/null 2>&1 || ! npm --version >/dev/null 2>&1; then
  missing+=(nodejs npm)
fi

if [ ${#missing[@]} -eq 0 ]; then
  echo "bootstrap: all ${#PACKAGES[@]} packages and node present"
else
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
  if [[ " ${missing[*]}" == *":arm64"* ]] &&
     ! dpkg --print-foreign-architectures | grep -qx arm64; then
    $SUDO dpkg --add-architecture arm64
  fi
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  node --version >/dev/null || { echo "bootstrap: node does not run" >&2; exit 1; }
  echo "bootstrap: done"
fi

# The tests' npm packages. The stamp is the hash of package.json and the lock
# (tests/integration/openai_sdk/openai_sdk_test.sh checks it too).
home="${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}"
node_dir="${MNEME_NODE_DIR:-${home:?}/.cache/mneme/node}"
lock_hash=$(cat tools/node/package.json tools/node/package-lock.json | sha256sum | cut -d' ' -f1)
if [ -d "$node_dir/node_modules" ] &&
   [ "$(cat "$node_dir/lock.sha256" 2>/dev/null)" = "$lock_hash" ]; then
  echo "bootstrap: npm packages present in $node_dir"
  exit 0
fi
echo "bootstrap: npm ci in $node_dir (node $(node --version))"
mkdir -p "$node_dir"
rm -f "$node_dir/lock.sha256"
cp tools/node/package.json tools/node/package-lock.json tools/node/.npmrc "$node_dir/"
(cd "$node_dir" && npm ci --ignore-scripts --no-audit --no-fund --no-update-notifier \
  --loglevel=error)
echo "$lock_hash" >"$node_dir/lock.sha256"
echo "bootstrap: npm packages installed"
